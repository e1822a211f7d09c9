"""The pipeline's stages in their fixed order around one backend call: the one loop that unary
and streamed inference share (:meth:`Stages.run`), whether any stage applies
(:meth:`Stages.applies`), and what every answer gets (:func:`finish`).

Contract:

- :class:`Stages` holds the stages (:class:`~v2proxy.core.stages.base.Stage`) in the order the
  pipeline composed them (:class:`~v2proxy.core.pipeline.Pipeline`'s constructor: client shared
  memory, then classification). It holds no state of a request.
- :meth:`Stages.applies` says whether some stage applies to a request: one pass over its inputs
  and requested outputs looking for the stages' keys, no allocation, no call into a stage. A
  request whose tensors carry no parameters costs a truth test per tensor.
- :meth:`Stages.run` applies them around a backend call that yields responses (a stream; a
  unary call is a stream of one): per stage in order, ``applies`` and, when it applies, its
  ``before`` (so a stage's error comes before any later stage's, and a later stage sees the
  request as the earlier ones left it); the call with what they made of the request; for every
  response :func:`finish`, then each applied stage's ``after``, innermost (last applied) first;
  and every applied stage's ``release`` once when the run ends, whatever happened (an error,
  a consumer that stops early and closes the iterator).
- :func:`finish` is done to every response, whether a stage applies or not: the request id and
  model name filled in when the backend left them out, outputs the client did not ask for
  dropped (some backends, KServe over gRPC, return every output whatever was asked for). The
  pipeline calls it directly when no stage applies, so that such a request pays for no loop.

Pure: no I/O library (checked by tools/check_layers.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from v2proxy.core.model import InferRequest, InferResponse
from v2proxy.core.stages.base import Applied, Stage

#: the backend call a run wraps: the request the stages made, to its responses
Call = Callable[[InferRequest], AsyncIterator[InferResponse]]


def finish(request: InferRequest, response: InferResponse) -> InferResponse:
    """A backend's response as every client gets it (module docstring), changed in place."""
    if request.id and not response.id:
        response.id = request.id
    if not response.model_name:
        response.model_name = request.model_name
    if request.outputs is not None:
        wanted = {o.name for o in request.outputs}
        if any(t.name not in wanted for t in response.outputs):
            response.outputs = [t for t in response.outputs if t.name in wanted]
    return response


class Stages:
    """The pipeline's stages, in order (module docstring)."""

    __slots__ = ("input_keys", "output_keys", "stages")

    def __init__(self, stages: Iterable[Stage]) -> None:
        self.stages: tuple[Stage, ...] = tuple(stages)
        #: the input parameters that make some stage apply
        self.input_keys: frozenset[str] = frozenset().union(*(s.input_keys for s in self.stages))
        #: the requested outputs' parameters that make some stage apply
        self.output_keys: frozenset[str] = frozenset().union(*(s.output_keys for s in self.stages))

    def applies(self, request: InferRequest) -> bool:
        """Whether some stage applies to ``request`` (one pass, nothing allocated)."""
        keys = self.input_keys
        if keys:
            for t in request.inputs:
                params = t.parameters
                if params and not keys.isdisjoint(params):
                    return True
        keys = self.output_keys
        for o in request.outputs or ():
            params = o.parameters
            if params and not keys.isdisjoint(params):
                return True
        return False

    async def run(
        self, request: InferRequest, peer: str | None, call: Call
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``call`` to what the stages make of ``request``, through the
        stages (module docstring); ``peer`` as :meth:`Stage.applies` takes it."""
        applied: list[Applied] = []
        try:
            sent = request
            for stage in self.stages:
                state = stage.applies(sent, peer)
                if state is not None:
                    applied.append(state)
                    sent = await state.before(sent)
            async for answer in call(sent):
                response = finish(request, answer)
                for state in reversed(applied):
                    response = await state.after(response)
                yield response
        finally:
            _release(applied)


def _release(applied: list[Applied]) -> None:
    """Every state released, the last applied first; the first error (none is expected) raised
    once all are."""
    error: BaseException | None = None
    for state in reversed(applied):
        try:
            state.release()
        except BaseException as exc:  # the others are released all the same
            error = error or exc
    if error is not None:
        raise error
