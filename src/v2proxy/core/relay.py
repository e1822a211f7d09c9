"""The pass-through fast path of the pipeline (Envoy's pass-through): an /infer body that no
stage applies to goes to the backend as the client sent it, and the answer comes back unchanged.

Whether a body is relayed is decided once, by :func:`~v2proxy.core.decide.relays`, from the
body's wire form and size, whether the frontend rewrites the answer, and the backend's
:class:`~v2proxy.core.ports.RelayFacts`; the backend's ``relay_infer`` and ``relay_message`` then
only send. The request is always checked before it is relayed (decoded, or by
:func:`~v2proxy.core.decide.relays_as_sent`); a JSON body relayed while it arrives keeps its last
:data:`HOLD_BACK` bytes until the whole has passed the check, so a malformed body never reaches
the backend whole. Pure: it awaits the backend but imports no I/O library.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from v2proxy.codecs.binary import check_json_size, decode_request, decode_request_header
from v2proxy.codecs.grpc import encodes_unchanged, relayed_answer
from v2proxy.codecs.json_stream import StreamCheck
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS
from v2proxy.core.decide import BINARY, JSON, MESSAGE, relays
from v2proxy.core.errors import BadGateway, CodecError, InvalidRequest, ProxyError
from v2proxy.core.model import Datatype, InferRequest, InferResponse
from v2proxy.core.ports import Backend, ForwardResponse, Headers, StreamedBody
from v2proxy.core.stages.chain import Stages, finish

#: A JSON body relayed while it arrives: its last bytes wait until the whole body is checked.
HOLD_BACK = 64 * 1024
#: buffers of such bodies reused, this many, up to this size (a huge one is not kept for good)
BUFFERS_KEPT = 2
BUFFER_REUSE_LIMIT = 32 * 1024 * 1024


class _NotRelayed(ProxyError):
    """Stops a streamed relay whose request turned out to need the stages (never answered)."""

    def __init__(self, request: InferRequest) -> None:
        super().__init__("the request is not relayed")
        self.request = request


class _Keeper:
    """Keeps the bytes of a body as they arrive, in a reused buffer or one that grows with what
    arrived (never sized by the Content-Length a client announced)."""

    __slots__ = ("buf", "length", "received")

    def __init__(self, length: int, reused: bytearray | None) -> None:
        self.length = length
        self.buf = reused if reused is not None else bytearray()
        self.received = 0

    def keep(self, chunk: bytes) -> None:
        start, end = self.received, self.received + len(chunk)
        if end > self.length:
            raise InvalidRequest(
                f"incomplete request body: its length differs from Content-Length {self.length}"
            )
        if len(self.buf) >= end:
            self.buf[start:end] = chunk
        else:
            self.buf += chunk
        self.received = end

    def view(self) -> memoryview:
        if self.received != self.length:
            raise InvalidRequest(
                f"incomplete request body: it ended after {self.received} of {self.length} bytes"
            )
        return memoryview(self.buf)[: self.length]


async def _kept(body: StreamedBody, keeper: _Keeper) -> AsyncIterator[bytes]:
    """The chunks of ``body``, each kept on the way; failing unless they add up to its length."""
    async for chunk in body.chunks:
        keeper.keep(chunk)
        yield chunk
    keeper.view()


_HALF = (Datatype.FP16, Datatype.BF16)


def nothing_to_do(request: InferRequest, binary: bool, stages: Stages) -> bool:
    """Whether no stage applies and the answer may be relayed as the backend writes it.

    A JSON body relays only if its answer may be JSON too and it holds no FP16/BF16 numbers
    (which v2proxy accepts in JSON but binary backends such as Triton refuse)."""
    for t in request.inputs:
        params = t.parameters
        if params and not stages.input_keys.isdisjoint(params):
            return False
        if not binary and t.datatype in _HALF:
            return False
    for o in request.outputs or ():
        params = o.parameters
        if params and (
            not stages.output_keys.isdisjoint(params)
            or (not binary and params.get("binary_data") is True)
        ):
            return False
    return binary or request.parameters.get("binary_data_output") is not True


def message_as_is(request: InferRequest, stages: Stages) -> bool:
    """Whether a decoded gRPC message may go to the backend as it came: no stage applies and
    it carries nothing the full path would leave out."""
    return nothing_to_do(request, True, stages) and encodes_unchanged(request)


async def _prefix(chunks: AsyncIterator[bytes], n: int) -> tuple[bytearray, bytes]:
    """The first ``n`` bytes of a body, and what came with them past ``n``."""
    head = bytearray()
    async for chunk in chunks:
        need = n - len(head)
        if len(chunk) >= need:
            head += chunk[:need]
            return head, chunk[need:]
        head += chunk
    return head, b""  # shorter than announced: the HTTP layer reports the broken body


async def _then(first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in chunks:
        yield chunk


class Relay:
    """The pass-through fast path in front of one backend."""

    def __init__(
        self,
        backend: Backend,
        stages: Stages,
        max_input_size: int,
        max_tensors: int = DEFAULT_MAX_TENSORS,
    ) -> None:
        self.backend = backend
        self.stages = stages
        self.max_input_size = max_input_size
        self.max_tensors = max_tensors
        self._buffers: list[bytearray] = []

    async def relay(
        self,
        request: InferRequest,
        body: bytes | bytearray | StreamedBody,
        ihcl: int | None,
        headers: Headers,
        rewritten: bool = False,
    ) -> ForwardResponse | None:
        """Pass the client's /infer body through untouched when no stage applies and the
        backend takes that wire form; None when the request must be re-encoded."""
        if not nothing_to_do(request, ihcl is not None, self.stages):
            return None
        model, version = request.model_name, request.model_version
        size = body.length if isinstance(body, StreamedBody) else len(body)
        form = JSON if ihcl is None else BINARY
        if not await self.takes(model, version, form, size, rewritten=rewritten):
            return None
        return await self.backend.relay_infer(model, version, body, ihcl, headers)

    def decides(
        self, model: str, version: str, form: str, size: int, rewritten: bool = False
    ) -> bool | None:
        """:func:`relays` of the backend's facts as known now (None: learn them, :meth:`takes`)."""
        return relays(form, size, self.backend.relay_facts(model, version), rewritten=rewritten)

    async def takes(
        self,
        model: str,
        version: str,
        form: str,
        size: int,
        asked_for: str = "inference",
        rewritten: bool = False,
    ) -> bool:
        """:func:`relays` of the backend's facts, learnt first when one it needs is unknown."""
        decided = relays(form, size, self.backend.relay_facts(model, version), rewritten=rewritten)
        if decided is None:
            return await self.learns(model, version, form, size, asked_for, rewritten)
        return decided

    async def learns(
        self,
        model: str,
        version: str,
        form: str,
        size: int,
        asked_for: str = "inference",
        rewritten: bool = False,
    ) -> bool:
        """:func:`relays` once the facts it needs are learnt (after :meth:`decides` said None)."""
        facts = await self.backend.learn_relay_facts(model, version, asked_for)
        return bool(relays(form, size, facts, rewritten=rewritten, learnt=True))

    async def relay_message(
        self,
        request: InferRequest,
        message: bytes,
        headers: Headers,
        streamed: bool = False,
        rewritten: bool = False,
    ) -> bytes | InferResponse | None:
        """Pass a client's serialized ModelInferRequest through untouched when it needs nothing
        and the backend takes it; None when it must go through the stages. The answer comes
        back unchanged when it is what the full path would answer, else decoded and finished
        (KServe, say, answers every output whatever was asked)."""
        if not message_as_is(request, self.stages):
            return None
        model, version = request.model_name, request.model_version
        asked_for = "streaming inference" if streamed else "inference"
        if not await self.takes(model, version, MESSAGE, len(message), asked_for, rewritten):
            return None
        answer = await self.backend.relay_message(
            model, version, message, headers, streamed=streamed
        )
        try:
            decoded = relayed_answer(answer, request)
        except CodecError as exc:
            raise BadGateway(f"invalid inference response from backend: {exc}") from None
        return answer if decoded is None else finish(request, decoded)

    async def relay_framed(
        self,
        model: str,
        version: str,
        body: StreamedBody,
        ihcl: int,
        headers: Headers,
        rewritten: bool = False,
    ) -> tuple[ForwardResponse | None, bytearray]:
        """A binary-framed /infer body still arriving: its JSON header checked, then relayed
        while the rest arrives (the answer, nothing read), else read whole (None, body)."""
        chunks = aiter(body.chunks)
        header, extra = await _prefix(chunks, ihcl)
        probe = decode_request_header(
            header, body.length - ihcl, model, version, self.max_input_size, self.max_tensors
        )
        streamed = StreamedBody(body.length, _then(bytes(header) + extra, chunks))
        relayed = await self.relay(probe, streamed, ihcl, headers, rewritten)
        if relayed is not None:
            return relayed, bytearray()
        whole = header + extra
        async for chunk in chunks:
            whole += chunk
        return None, whole

    async def relay_json(
        self,
        model: str,
        version: str,
        body: StreamedBody,
        headers: Headers,
        rewritten: bool = False,
    ) -> ForwardResponse | InferRequest:
        """A JSON /infer body still arriving, relayed while it arrives when nothing needs
        changing; else the decoded request, for the stages.

        The last :data:`HOLD_BACK` bytes are sent only once the whole body passed its check; a
        body that fails it, or turns out to need a stage, leaves the backend's request
        incomplete."""
        length = body.length
        check_json_size(length, self.max_input_size)
        # kept for the full decoder; fresh memory for every big body costs more than the copy
        keeper = _Keeper(length, self._take_buffer(length))
        try:
            relayed = await self._relay_checked(model, version, body, keeper, headers, rewritten)
            if relayed is not None:
                return relayed
            async for _ in _kept(body, keeper):
                pass
            return decode_request(
                keeper.view(), None, model, version, self.max_input_size, self.max_tensors
            )
        except _NotRelayed as stop:
            return stop.request
        finally:
            self._give_back(keeper.buf)

    async def _relay_checked(
        self,
        model: str,
        version: str,
        body: StreamedBody,
        keeper: _Keeper,
        headers: Headers,
        rewritten: bool,
    ) -> ForwardResponse | None:
        if not await self.takes(model, version, JSON, body.length, rewritten=rewritten):
            return None
        check = StreamCheck(model, version, self.max_input_size, self.max_tensors)
        hold_from = max(body.length - HOLD_BACK, 0)

        async def checked() -> AsyncIterator[bytes]:
            received = 0
            async for chunk in _kept(body, keeper):
                start, received = received, received + len(chunk)
                if received <= hold_from:
                    yield chunk  # sent first, checked after: the two overlap
                elif start < hold_from:
                    yield chunk[: hold_from - start]
                check.feed(chunk)
            request = check.finish()
            if request is None or not nothing_to_do(request, False, self.stages):
                # undecided: the full decoder decides (and names the field at fault)
                view = keeper.view()
                request = decode_request(
                    view, None, model, version, self.max_input_size, self.max_tensors
                )
                if not nothing_to_do(request, False, self.stages):
                    raise _NotRelayed(request)
            yield bytes(keeper.view()[hold_from:])

        return await self.backend.relay_infer(
            model, version, StreamedBody(body.length, checked()), None, headers
        )

    def _take_buffer(self, size: int) -> bytearray | None:
        for i, buf in enumerate(self._buffers):
            if len(buf) >= size:
                return self._buffers.pop(i)
        return None

    def _give_back(self, buf: bytearray) -> None:
        if len(buf) <= BUFFER_REUSE_LIMIT and len(self._buffers) < BUFFERS_KEPT:
            self._buffers.append(buf)
