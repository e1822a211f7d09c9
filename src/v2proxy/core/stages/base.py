"""What a stage of the pipeline is: the one interface every around-the-call stage implements.

A :class:`Stage` is shared by every request and applies to one only through the tensor parameters
in its ``input_keys``/``output_keys``; :meth:`Stage.applies` (no I/O) returns the request's
:class:`Applied` state or None. Of that state, ``before`` runs once before the backend call,
``after`` on every response (innermost stage first) and ``release`` exactly once, whatever
happened, raising nothing."""

from __future__ import annotations

from typing import Protocol

from v2proxy.core.model import InferRequest, InferResponse


class Applied(Protocol):
    """A stage's state for one request it applies to."""

    async def before(self, request: InferRequest) -> InferRequest:
        """The request the backend is sent."""
        ...

    async def after(self, response: InferResponse) -> InferResponse:
        """One response of the backend call, as the client gets it."""
        ...

    def release(self) -> None:
        """Give back what this request holds (called once, whatever happened)."""
        ...


class Stage(Protocol):
    """One stage of the pipeline, shared by every request."""

    @property
    def input_keys(self) -> frozenset[str]:
        """Input parameters that make this stage apply."""
        ...

    @property
    def output_keys(self) -> frozenset[str]:
        """Requested outputs' parameters that make this stage apply."""
        ...

    def applies(self, request: InferRequest, peer: str | None) -> Applied | None:
        """This request's state, or None when the stage has nothing to do for it; ``peer``:
        the client's IP address (None: a unix socket; ``""``: unknown), which a stage may have
        to check (``--client-shm``)."""
        ...
