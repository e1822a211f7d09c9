"""A fake :class:`v2proxy.core.ports.Backend` for tests of the core without sockets: it answers from
a small table given at construction and records every call it gets (the method's name and its
arguments, the request it was sent snapshotted at the time of the call).

Used by ``tests/unit/test_pipeline_table.py``; usable by any test that needs to see exactly what
the pipeline asked of its backend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from v2proxy.core.model import InferRequest, InferResponse, Tensor
from v2proxy.core.ports import Body, ForwardResponse, Headers, RelayFacts, StreamedBody


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


@dataclass(frozen=True)
class Sent:
    """What a request looked like when the backend was sent it (the pipeline may change the
    request object later)."""

    model: str
    id: str | None
    #: (name, datatype, shape, bytes, parameters) per input
    inputs: tuple[tuple[str, str, tuple[int, ...], bytes, dict[str, Any]], ...]
    #: (name, parameters) per requested output; None: the client listed none
    outputs: tuple[tuple[str, dict[str, Any]], ...] | None
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferRequest) -> Sent:
        return cls(
            request.model_name,
            request.id,
            tuple(
                (t.name, t.datatype.value, tuple(t.shape), bytes(t.data), dict(t.parameters))
                for t in request.inputs
            ),
            None
            if request.outputs is None
            else tuple((o.name, dict(o.parameters)) for o in request.outputs),
            dict(request.parameters),
        )


@dataclass(frozen=True)
class Call:
    """One call the backend got: the method's name and its arguments (an inference request as
    :class:`Sent`, a body as its bytes)."""

    name: str
    args: tuple[Any, ...] = ()
    #: the keyword arguments that were given (``relay_message``'s ``streamed``)
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Answers:
    """The table the fake answers from."""

    #: every output of the model, returned whatever was asked for (as some backends do: KServe
    #: over gRPC); model name and id left empty, for the pipeline to fill in
    outputs: list[Tensor] = field(default_factory=list)
    #: whether a body is taken unchanged, per wire form: {binary?: answer} (its relay facts)
    relay: Mapping[bool, bool] = field(default_factory=lambda: {False: True, True: True})
    #: whether every JSON body goes transcoded (``transcodes_json``: the pipeline does not
    #: offer it to ``relay_infer``), else ``relay_infer`` says
    declines_json: bool = False
    #: ``extensions`` of the server metadata
    extensions: tuple[str, ...] = ("binary_tensor_data",)
    #: responses of ``stream_infer`` to one request (more than one: a decoupled model)
    stream_responses: int = 1
    model_metadata: dict[str, Any] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    #: the pass-through answer of ``relay_infer`` and ``forward``
    forward_status: int = 200
    forward_headers: Headers = field(
        default_factory=lambda: [(b"content-type", b"application/json"), (b"x-fake", b"relayed")]
    )
    forward_body: bytes = b'{"model_name":"m","outputs":[],"relayed":true}'
    #: whether a gRPC message is taken unchanged (its relay facts)
    relay_message: bool = True
    #: the pass-through answer of ``relay_message`` (a serialized ModelInferResponse: by
    #: default, model "m" with no outputs)
    message_answer: bytes = b"\n\x01m"


class FakeBackend:
    """A :class:`~v2proxy.core.ports.Backend` answering from :class:`Answers`, recording each call
    in :attr:`calls` (and each pass-through answer it gave in :attr:`forwarded`)."""

    name = "fake"
    speaks_rest = False

    @property
    def transcodes_json(self) -> bool:
        return self.answers.declines_json

    def stream_call(self, decoupled: bool) -> str:
        return "fake backend's stream_infer"

    def __init__(self, answers: Answers | None = None) -> None:
        self.answers = answers or Answers()
        self.calls: list[Call] = []
        self.forwarded: list[ForwardResponse] = []

    # ------------------------------------------------------------------ what happened

    def names(self) -> list[str]:
        """The names of the methods called, in order."""
        return [c.name for c in self.calls]

    def counts(self) -> Counter[str]:
        return Counter(self.names())

    def called(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append(Call(name, args))

    def _response(self) -> InferResponse:
        # fresh tensors each time: the pipeline changes the responses it is given
        outputs = [
            Tensor(t.name, t.datatype, t.shape, bytes(t.data), dict(t.parameters))
            for t in self.answers.outputs
        ]
        return InferResponse(model_name="", outputs=outputs)

    def _forward(self) -> ForwardResponse:
        a = self.answers
        answer = ForwardResponse(
            a.forward_status,
            list(a.forward_headers),
            _nothing(),
            content=a.forward_body,
            length=len(a.forward_body),
        )
        self.forwarded.append(answer)
        return answer

    # ------------------------------------------------------------------ the port

    async def start(self) -> None:
        self._record("start")

    async def close(self) -> None:
        self._record("close")

    async def server_ready(self) -> bool:
        self._record("server_ready")
        return True

    async def server_metadata(self) -> dict[str, Any]:
        self._record("server_metadata")
        return {"name": "fake", "version": "1", "extensions": list(self.answers.extensions)}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        self._record("model_metadata", model, version)
        return dict(self.answers.model_metadata)

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        self._record("model_config", model, version)
        return dict(self.answers.model_config)

    async def model_ready(self, model: str, version: str) -> bool:
        self._record("model_ready", model, version)
        return True

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        self._record("infer", Sent.of(request), list(headers))
        return self._response()

    def stream_infer(self, request: InferRequest, headers: Headers) -> AsyncIterator[InferResponse]:
        self._record("stream_infer", Sent.of(request), list(headers))

        async def responses() -> AsyncIterator[InferResponse]:
            for _ in range(self.answers.stream_responses):
                yield self._response()

        return responses()

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        self._record("statistics", model, version, list(headers))
        return {"model_stats": []}

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        self._record("repository_index", ready, list(headers))
        return []

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        self._record("repository_load", model, load, dict(parameters), list(headers))

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        self._record("trace_settings", model, update, list(headers))
        return {}

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        self._record("log_settings", update, list(headers))
        return {}

    def relay_facts(self, model: str, version: str) -> RelayFacts:
        a = self.answers
        below = 0 if a.declines_json or not a.relay[False] else 1 << 62
        return RelayFacts(True, a.relay_message, below, False, a.relay[True], 1 << 62, False)

    async def learn_relay_facts(self, model: str, version: str, asked_for: str) -> RelayFacts:
        return self.relay_facts(model, version)

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        if isinstance(body, StreamedBody):
            data = b"".join([chunk async for chunk in body.chunks])
        else:
            data = bytes(body)
        self._record("relay_infer", model, version, data, ihcl, list(headers))
        return self._forward()

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        args = (model, version, bytes(message), list(headers))
        self.calls.append(Call("relay_message", args, {"streamed": streamed}))
        return self.answers.message_answer

    async def forward(
        self, method: str, target: str, headers: Headers, body: Any
    ) -> ForwardResponse:
        self._record("forward", method, target, list(headers), bytes(body))
        return self._forward()
