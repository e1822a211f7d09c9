"""The one shared core every frontend calls (in the manner of MLServer's DataPlane).

It owns the port to the model server (:class:`Backend`, implemented in ``v2proxy.backends``),
resolves what a request needs before the backend sees it (raw-request shape deduction from model
metadata) and finishes the response (request id). Later stages (shared memory, classification,
metrics) plug in here, so that REST and gRPC frontends behave the same.

Pure with respect to I/O libraries: it awaits the backend but imports no asyncio, aiohttp or grpc.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from v2proxy.codecs.json import dumps, loads
from v2proxy.codecs.raw import decode_raw_request
from v2proxy.errors import BackendError, BadGateway, CodecError, NotFound, ProxyError
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


#: The extensions v2proxy provides to clients whatever the backend has.
PROXY_EXTENSIONS = ("binary_tensor_data",)

#: Tensor parameters that mean a stage of the proxy applies to the request.
_STAGE_PARAMS = ("shared_memory_region", "classification")


class Pipeline:
    """Runs requests through the stages and the backend."""

    def __init__(self, backend: Backend, max_input_size: int) -> None:
        self.backend = backend
        self.max_input_size = max_input_size
        self._metadata: dict[tuple[str, str], tuple[float, dict[str, Any], int | None]] = {}

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
