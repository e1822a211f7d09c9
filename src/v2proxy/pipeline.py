"""The one shared core every frontend calls (in the manner of MLServer's DataPlane).

It owns the port to the model server (:class:`Backend`, implemented in ``v2proxy.backends``),
resolves what a request needs before the backend sees it (raw-request shape deduction from model
metadata) and finishes the response (request id). Later stages (shared memory, classification,
metrics) plug in here, so that REST and gRPC frontends behave the same. Requests no stage
applies to are relayed unchanged (:meth:`Pipeline.relay`), large JSON bodies while they arrive
(:meth:`Pipeline.relay_json`: checked on the way, their end held back until they passed).

Pure with respect to I/O libraries: it awaits the backend but imports no asyncio, aiohttp or grpc.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from v2proxy.codecs.binary import check_json_size, decode_request
from v2proxy.codecs.json import dumps, loads
from v2proxy.codecs.json_stream import StreamCheck
from v2proxy.codecs.raw import decode_raw_request
from v2proxy.errors import (
    BackendError,
    BadGateway,
    CodecError,
    InvalidRequest,
    NotFound,
    ProxyError,
)
from v2proxy.model import Buffer, Datatype, InferRequest, InferResponse

METADATA_TTL_S = 30.0


async def _noop() -> None:
    return None


@dataclass(slots=True)
class ForwardResponse:
    """A passed-through HTTP answer: status, end-to-end headers and a body stream."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]
    release: Callable[[], Awaitable[None]] = field(default=_noop)
    #: the whole body when it was small enough to read at once (``body`` is then empty)
    content: bytes | None = None


@dataclass(slots=True)
class StreamedBody:
    """A request body that is still arriving: ``length`` bytes in ``chunks``."""

    length: int
    chunks: AsyncIterator[bytes]


Body = Buffer | StreamedBody


class Backend(Protocol):
    """What the pipeline and the frontends need from a model server. Every failure is raised as
    a ProxyError; foreign exceptions are mapped inside the backend that meets them."""

    name: str

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def server_ready(self) -> bool: ...
    async def server_metadata(self) -> dict[str, Any]: ...
    async def model_metadata(self, model: str, version: str) -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str) -> dict[str, Any]: ...
    async def model_ready(self, model: str, version: str) -> bool: ...
    async def infer(self, request: InferRequest, headers: dict[str, str]) -> InferResponse: ...
    def stream_infer(
        self, request: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[InferResponse]:
        """One or more responses (several for decoupled models)."""
        ...

    async def forward(
        self, method: str, path_qs: str, headers: list[tuple[str, str]], body: bytes | bytearray
    ) -> ForwardResponse: ...
    async def can_relay(self, binary: bool) -> bool:
        """Whether an /infer body of this form (binary-framed or JSON) can be sent unchanged."""
        ...

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: dict[str, str]
    ) -> ForwardResponse:
        """Send an /infer body unchanged (it may still be arriving); the answer comes back
        unchanged (errors raised)."""
        ...


class _NotRelayed(ProxyError):
    """Stops a streamed relay whose request turned out to need the stages (never answered)."""

    def __init__(self, request: InferRequest) -> None:
        super().__init__("the request is not relayed")
        self.request = request


#: A JSON body relayed while it arrives: its last bytes wait until the whole body is checked.
HOLD_BACK = 64 * 1024
#: buffers that kept such bodies are reused, this many at a time, up to this size (so that one
#: huge request does not pin its buffer for the life of the process)
BUFFERS_KEPT = 2
BUFFER_REUSE_LIMIT = 32 * 1024 * 1024

#: The extensions v2proxy provides to clients whatever the backend has.
PROXY_EXTENSIONS = ("binary_tensor_data",)

#: Tensor parameters that mean a stage of the proxy applies to the request.
_STAGE_PARAMS = ("shared_memory_region", "classification")


async def _kept(body: StreamedBody, view: memoryview) -> AsyncIterator[bytes]:
    """The chunks of ``body``, each copied into ``view`` (``body.length`` bytes) on the way;
    failing when they do not add up to exactly that length."""
    received = 0
    async for chunk in body.chunks:
        start, received = received, received + len(chunk)
        if received > body.length:
            raise InvalidRequest(
                f"incomplete request body: its length differs from Content-Length {body.length}"
            )
        view[start:received] = chunk
        yield chunk
    if received != body.length:
        raise InvalidRequest(
            f"incomplete request body: it ended after {received} of {body.length} bytes"
        )


class Pipeline:
    """Runs requests through the stages and the backend."""

    def __init__(self, backend: Backend, max_input_size: int) -> None:
        self.backend = backend
        self.max_input_size = max_input_size
        self._metadata: dict[tuple[str, str], tuple[float, dict[str, Any], int | None]] = {}
        self._buffers: list[bytearray] = []

    async def infer(self, request: InferRequest, headers: dict[str, str]) -> InferResponse:
        self._check(request)
        return self._finish(request, await self.backend.infer(request, headers))

    async def stream_infer(
        self, request: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[InferResponse]:
        """Every response of a (possibly decoupled) model to one request."""
        self._check(request)
        async for response in self.backend.stream_infer(request, headers):
            yield self._finish(request, response)

    @staticmethod
    def _check(request: InferRequest) -> None:
        # No shared-memory region can be registered with this version: every reference to one
        # names a region that does not exist (rather than being passed on to the backend).
        for t in request.inputs:
            region = t.parameters.get("shared_memory_region")
            if region is not None:
                raise NotFound(f"Unable to find shared memory region: '{region}'")
        for o in request.outputs or ():
            region = o.parameters.get("shared_memory_region")
            if region is not None:
                raise NotFound(f"Unable to find shared memory region: '{region}'")

    @staticmethod
    def _finish(request: InferRequest, response: InferResponse) -> InferResponse:
        if request.id and not response.id:
            response.id = request.id
        if not response.model_name:
            response.model_name = request.model_name
        if request.outputs is not None:
            # Some backends (KServe over gRPC) return every output whatever was asked for.
            wanted = {o.name for o in request.outputs}
            if any(t.name not in wanted for t in response.outputs):
                response.outputs = [t for t in response.outputs if t.name in wanted]
        return response

    async def side_request(self, method: str, path: str, body: Any = None) -> Any:
        """A side endpoint (statistics, repository, trace, logging) in its canonical v2 REST JSON
        form, whatever the backend speaks; non-200 answers are raised as errors."""
        payload = b"" if body is None else dumps(body)
        headers = [("Content-Type", "application/json")] if payload else []
        answer = await self.backend.forward(method, path, headers, payload)
        try:
            chunks = [chunk async for chunk in answer.body]
        finally:
            await answer.release()
        raw = b"".join(chunks)
        try:
            obj = loads(raw, what="backend answer") if raw.strip() else {}
        except CodecError as exc:
            if answer.status == 200:
                raise BadGateway(f"invalid answer from backend to {path}: {exc}") from None
            obj = {"error": raw.decode("utf-8", "replace")}
        if answer.status != 200:
            message = obj.get("error") if isinstance(obj, dict) else None
            raise BackendError(str(message or obj), answer.status)
        if path.startswith("/v2/repository/"):
            self.invalidate()
        return obj

    async def relay(
        self,
        request: InferRequest,
        body: bytes | bytearray | StreamedBody,
        ihcl: int | None,
        headers: dict[str, str],
    ) -> ForwardResponse | None:
        """Pass the client's /infer body through untouched (Envoy's pass-through) when no stage
        applies and the backend takes that wire form; None when the request must be re-encoded.
        The request was decoded (validated) already; the body is what is sent."""
        binary = ihcl is not None
        if not self._nothing_to_do(request, binary):
            return None
        if not await self.backend.can_relay(binary):
            return None
        return await self.backend.relay_infer(
            request.model_name, request.model_version, body, ihcl, headers
        )

    async def relay_json(
        self, model: str, version: str, body: StreamedBody, headers: dict[str, str]
    ) -> ForwardResponse | InferRequest:
        """A JSON /infer body that is still arriving, relayed while it arrives when nothing
        needs changing (as :meth:`relay` does for whole bodies); the decoded request when it
        must go through :meth:`infer` instead.

        Each chunk goes on to the backend as it comes and is checked after
        (:class:`StreamCheck`), but the body's last :data:`HOLD_BACK` bytes are sent only once
        the whole of it has passed. A malformed body is answered with the error that names the
        field at fault (CodecError, raised here) and the backend connection is dropped with the
        request incomplete, so the backend never has it whole; so is one that turns out to need
        a stage, which is then decoded in full and returned."""
        length = body.length
        check_json_size(length, self.max_input_size)  # known from the length: nothing is read
        # The body is kept (for the full decoder, when it must decide) in a buffer reused from
        # one request to the next: fresh memory for every big body costs more than the copy.
        kept = self._take_buffer(length)
        view = memoryview(kept)[:length]
        try:
            if not await self.backend.can_relay(False):
                async for _ in _kept(body, view):
                    pass
                return decode_request(view, None, model, version, self.max_input_size)
            return await self._relay_checked(model, version, body, view, headers)
        except _NotRelayed as stop:
            return stop.request
        finally:
            self._give_back(kept)

    async def _relay_checked(
        self,
        model: str,
        version: str,
        body: StreamedBody,
        view: memoryview,
        headers: dict[str, str],
    ) -> ForwardResponse:
        check = StreamCheck(model, version, self.max_input_size)
        hold_from = max(body.length - HOLD_BACK, 0)

        async def checked() -> AsyncIterator[bytes]:
            received = 0
            async for chunk in _kept(body, view):
                start, received = received, received + len(chunk)
                if received <= hold_from:
                    yield chunk  # to the backend first, checked after: the two overlap
                elif start < hold_from:
                    yield chunk[: hold_from - start]
                check.feed(chunk)
            request = check.finish()
            if request is None or not self._nothing_to_do(request, binary=False):
                # undecided, or the tensors' bytes are needed: the full decoder decides (and
                # names the field at fault)
                request = decode_request(view, None, model, version, self.max_input_size)
                if not self._nothing_to_do(request, binary=False):
                    raise _NotRelayed(request)
            yield bytes(view[hold_from:])

        return await self.backend.relay_infer(
            model, version, StreamedBody(body.length, checked()), None, headers
        )

    def _take_buffer(self, size: int) -> bytearray:
        for i, buf in enumerate(self._buffers):
            if len(buf) >= size:
                return self._buffers.pop(i)
        return bytearray(size)

    def _give_back(self, buf: bytearray) -> None:
        if len(buf) <= BUFFER_REUSE_LIMIT and len(self._buffers) < BUFFERS_KEPT:
            self._buffers.append(buf)

    @staticmethod
    def _nothing_to_do(request: InferRequest, binary: bool) -> bool:
        tensors = [*request.inputs, *(request.outputs or ())]
        if any(key in t.parameters for t in tensors for key in _STAGE_PARAMS):
            return False
        if binary:
            return True
        # A JSON body relays only if its answer may be JSON too, and holds no FP16/BF16 numbers
        # (which v2proxy accepts in JSON but binary backends such as Triton refuse).
        if request.parameters.get("binary_data_output") is True:
            return False
        if any(o.parameters.get("binary_data") is True for o in request.outputs or ()):
            return False
        return not any(t.datatype in (Datatype.FP16, Datatype.BF16) for t in request.inputs)

    async def decode_raw(self, body: Buffer, model: str, version: str) -> InferRequest:
        """The request a raw binary body (IHCL 0) stands for (reference §2)."""
        metadata, max_batch_size = await self._model_shape_info(model, version)
        return decode_raw_request(
            body, model, version, metadata, max_batch_size, self.max_input_size
        )

    async def server_metadata(self) -> dict[str, Any]:
        """The backend's metadata with the extensions v2proxy adds."""
        meta = dict(await self.backend.server_metadata())
        ext = meta.get("extensions")
        # Some servers (MindIE) send an object here; the spec says a list of strings.
        extensions = [e for e in ext if isinstance(e, str)] if isinstance(ext, list) else []
        for e in PROXY_EXTENSIONS:
            if e not in extensions:
                extensions.append(e)
        meta["extensions"] = extensions
        return meta

    def invalidate(self) -> None:
        """Forget cached model metadata (after repository load/unload)."""
        self._metadata.clear()

    async def _model_shape_info(
        self, model: str, version: str
    ) -> tuple[dict[str, Any], int | None]:
        key = (model, version)
        now = time.monotonic()
        hit = self._metadata.get(key)
        if hit is not None and now - hit[0] < METADATA_TTL_S:
            return hit[1], hit[2]
        metadata = await self.backend.model_metadata(model, version)
        max_batch_size: int | None = None
        try:
            config = await self.backend.model_config(model, version)
        except ProxyError:
            config = {}
        mbs = config.get("max_batch_size") if isinstance(config, dict) else None
        if isinstance(mbs, int) and not isinstance(mbs, bool):
            max_batch_size = mbs
        self._metadata[key] = (now, metadata, max_batch_size)
        return metadata, max_batch_size
