"""The pipeline's stages in their fixed order around one backend call: the one loop that unary
and streamed inference share (:meth:`Stages.run`), whether any stage applies
(:meth:`Stages.applies`), and what every answer gets (:func:`finish`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from v2proxy.core.model import InferRequest, InferResponse
from v2proxy.core.stages.base import Applied, Stage

#: the backend call a run wraps: the request the stages made, to its responses
Call = Callable[[InferRequest], AsyncIterator[InferResponse]]


def finish(request: InferRequest, response: InferResponse) -> InferResponse:
    """A backend's response as every client gets it, changed in place."""
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
    """The pipeline's stages, in order."""

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
        stages; ``peer`` as :meth:`Stage.applies` takes it."""
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
