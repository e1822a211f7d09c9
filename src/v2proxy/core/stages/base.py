"""What a stage of the pipeline is: the one interface every around-the-call stage implements.

A stage is an object the pipeline holds for its whole life (shared by every request, so it
keeps no state of one request); :class:`~v2proxy.core.stages.chain.Stages` runs the stages in
their fixed order around one backend call (:meth:`Stages.run`).

Contract of a :class:`Stage`:

- :attr:`Stage.input_keys` / :attr:`Stage.output_keys`: the tensor parameters that make the
  stage apply. A stage applies to a request exactly when one of its inputs carries one of
  ``input_keys`` or one of its requested outputs one of ``output_keys``; so whether *any* stage
  applies is one pass over the tensors, with no call into the stages and no allocation
  (:meth:`Stages.applies`, and the relay's ``nothing_to_do``, which asks it in the same pass as
  its wire-form checks). A stage applies through tensor parameters only: a body with no
  ``parameters`` anywhere needs no stage, which
  :func:`~v2proxy.codecs.relay_check.plain_json_request` relies on to relay a small JSON body
  without decoding it (a stage that applied otherwise would have to be asked there too).
- :meth:`Stage.applies` (cheap: no I/O, no await, nothing acquired): None when the stage has
  nothing to do for the request (never when one of its keys is there), else the request's own
  :class:`Applied` state. It may raise the request's error (a malformed parameter of its own),
  which then comes before any later stage's.

Contract of an :class:`Applied` (one request's state, used by one request only):

- :meth:`Applied.before`: what the backend is sent (the request, changed in place or a new
  one), called once before the backend call, after the earlier stages' ``before``; it may
  await (a cached question to the backend) and raise the request's error.
- :meth:`Applied.after`: called for every response of the backend call (each message of a
  stream), innermost stage first, after the response is finished (request id, model name,
  outputs not asked for dropped: :func:`~v2proxy.core.stages.chain.finish`).
- :meth:`Applied.release`: called exactly once when the request ends, whatever happened
  (success, an error of any stage or of the backend, a stream closed early), even when
  :meth:`before` was never reached or raised; it gives back what the state holds (the
  client's shared-memory regions) and raises nothing.

Request *mappings* (a request of another protocol turned into an inference and back: the
generate extension, MindIE's ``/infer``) are no stages: see the package's docstring.

Pure: no I/O library (checked by tools/check_layers.py).
"""

from __future__ import annotations

from typing import Protocol

from v2proxy.core.model import InferRequest, InferResponse


class Applied(Protocol):
    """A stage's state for one request it applies to (module docstring)."""

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
    """One stage of the pipeline, shared by every request (module docstring)."""

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
