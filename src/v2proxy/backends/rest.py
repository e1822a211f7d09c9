"""The REST backend: a pooled aiohttp client speaking v2 JSON or binary to a model server.

- Encoding (``--backend-encoding``): ``json``, ``binary``, or ``auto``, which asks the backend's
  ``GET /v2`` for the ``binary_tensor_data`` extension on first use (and again after a failure).
- Every request carries a Content-Type (KServe 0.21 refuses requests without one); binary
  bodies are written buffer by buffer with a known Content-Length (no concatenation).
- aiohttp and OS errors are mapped here: refused connection -> 503, broken or invalid answer ->
  502, timeout -> 504. Backend error answers keep their status and message; a 404 on /infer is
  reported with Triton's ``Request for unknown model`` text, which clients match on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp.abc import AbstractStreamWriter

from v2proxy.backends.http1 import Http1Pool, HTTPProtocolError
from v2proxy.codecs import binary as binc
from v2proxy.codecs.json import dumps, loads
from v2proxy.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    CodecError,
    GatewayTimeout,
    NotFound,
    ProxyError,
)
from v2proxy.http_io import HOP_BY_HOP, ShortBody, end_to_end, read_exactly
from v2proxy.model import Buffer, InferRequest, InferResponse
from v2proxy.ports import Body, ForwardResponse, Headers, StreamedBody

log = logging.getLogger(__name__)

#: Request headers the REST backend sets itself or that describe the client's own framing.
_OWN_HEADERS = frozenset(
    {"content-type", "content-encoding", "accept-encoding", "inference-header-content-length"}
)


#: relayed answers up to this size are read whole and written in one piece
_READ_WHOLE = 256 * 1024


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


class BuffersPayload(aiohttp.payload.Payload):
    """A request body made of several buffers, written one by one (zero copy)."""

    def __init__(self, chunks: list[Buffer], content_type: str) -> None:
        super().__init__(chunks, content_type=content_type)
        self._chunks = chunks
        self._size = sum(memoryview(c).nbytes for c in chunks)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._chunks).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        for chunk in self._chunks:
            await writer.write(chunk)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        await self.write(writer)


def _request_headers(headers: Headers) -> dict[str, str]:
    """The client's end-to-end headers, less those this backend sets itself (framing and
    hop-by-hop ones included: gRPC clients such as h2load send content-length)."""
    out: dict[str, str] = {}
    for k, v in headers:
        name = k.decode("latin-1")
        if name not in _OWN_HEADERS and name not in HOP_BY_HOP:
            out[name] = v.decode("latin-1")
    return out


def _infer_headers(headers: Headers, ihcl: int | None) -> tuple[dict[str, str], str]:
    """Headers of an /infer request to the backend, and its Content-Type: always set (KServe
    refuses requests without one), uncompressed answers asked for (they are read here)."""
    out = _request_headers(headers)
    out["Accept-Encoding"] = "identity"
    if ihcl is None:
        content_type = "application/json"
    else:
        content_type = "application/octet-stream"
        out[binc.IHCL_HEADER] = str(ihcl)
    out["Content-Type"] = content_type
    return out, content_type


def _model_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{version}" if version else path


def _error_message(body: bytes, status: int) -> str:
    try:
        obj = loads(body, what="error")
    except CodecError:
        text = body.decode("utf-8", "replace").strip()
        return text[:1000] or f"backend answered HTTP {status}"
    if isinstance(obj, dict):
        for key in ("error", "detail", "message"):
            if key in obj:
                value = obj[key]
                return value if isinstance(value, str) else str(value)
    return str(obj)[:1000]


class RestBackend:
    """Talks to a v2 REST model server at ``base_url``."""

    name = "rest"

    def __init__(
        self,
        base_url: str,
        encoding: str = "auto",
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        connections: int = 100,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._encoding = encoding
        self._binary: bool | None = {"json": False, "binary": True}.get(encoding)
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        parts = urlsplit(self.base_url)
        self._path_prefix = parts.path.rstrip("/")
        self._total_timeout = timeout
        # Plain HTTP goes through the lean keep-alive client on the hot calls; https keeps
        # aiohttp (TLS).
        self._pool: Http1Pool | None = (
            Http1Pool(parts.hostname or "127.0.0.1", parts.port or 80, connections, connect_timeout)
            if parts.scheme == "http"
            else None
        )

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._connections, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            read_bufsize=2**20,
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise BackendUnavailable("the REST backend is not started")
        return self._session

    @contextmanager
    def _mapped(self, what: str) -> Iterator[None]:
        """Map aiohttp/OS failures of one backend call to the error tree."""
        try:
            yield
        except ProxyError:
            raise
        except TimeoutError:
            raise GatewayTimeout(
                f"backend at {self.base_url} did not answer {what} in time"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise BackendUnavailable(
                f"backend at {self.base_url} is unavailable for {what}: {exc.os_error or exc}"
            ) from None
        except ConnectionRefusedError as exc:
            raise BackendUnavailable(
                f"backend at {self.base_url} is unavailable for {what}: {exc}"
            ) from None
        except (
            aiohttp.ClientError,
            OSError,
            ShortBody,
            HTTPProtocolError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as exc:
            raise BadGateway(
                f"backend at {self.base_url} failed during {what}: {type(exc).__name__}: {exc}"
            ) from None

    async def _get_json(self, path: str, what: str) -> tuple[int, Any]:
        with self._mapped(what):
            async with self.session.get(self.base_url + path) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return resp.status, _error_message(body, resp.status)
        try:
            return 200, loads(body, what="backend response") if body.strip() else {}
        except CodecError as exc:
            raise BadGateway(f"invalid answer from backend to {what}: {exc}") from None

    async def _status(self, path: str, what: str) -> int:
        with self._mapped(what):
            async with self.session.get(self.base_url + path) as resp:
                await resp.read()
                return resp.status

    # ------------------------------------------------------------------ structured calls

    async def server_ready(self) -> bool:
        return await self._status("/v2/health/ready", "health/ready") == 200

    async def server_metadata(self) -> dict[str, Any]:
        status, obj = await self._get_json("/v2", "server metadata")
        if status != 200 or not isinstance(obj, dict):
            raise BackendError(str(obj), status if status != 200 else 502)
        return obj

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        status, obj = await self._get_json(_model_path(model, version), "model metadata")
        return self._model_answer(status, obj, model)

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        status, obj = await self._get_json(_model_path(model, version) + "/config", "model config")
        return self._model_answer(status, obj, model)

    async def model_ready(self, model: str, version: str) -> bool:
        status = await self._status(_model_path(model, version) + "/ready", "model ready")
        if status == 404:
            raise self._unknown(model, "")
        return status == 200

    def _model_answer(self, status: int, obj: Any, model: str) -> dict[str, Any]:
        if status == 404:
            raise self._unknown(model, str(obj))
        if status != 200 or not isinstance(obj, dict):
            raise BackendError(str(obj), status if status != 200 else 502)
        return obj

    @staticmethod
    def _unknown(model: str, detail: str) -> NotFound:
        msg = f"Request for unknown model: '{model}' is not found"
        if detail and not detail.startswith("Request for unknown model"):
            msg += f" (backend: {detail})"
        return NotFound(detail if detail.startswith("Request for unknown model") else msg)

    async def uses_binary(self) -> bool:
        """Whether requests go binary: fixed by configuration, or asked of the backend once."""
        if self._binary is None:
            meta = await self.server_metadata()
            ext = meta.get("extensions")
            self._binary = isinstance(ext, list) and "binary_tensor_data" in ext
            log.info("backend %s binary tensors: %s", self.base_url, self._binary)
        return self._binary

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        binary = await self.uses_binary()
        try:
            chunks, ihcl = binc.encode_request(request, binary=binary)
        except CodecError as exc:
            # A tensor the client sent binary cannot be written as JSON (e.g. non-UTF-8 BYTES).
            raise CodecError(
                f"cannot send the request to this backend, which takes JSON only: {exc}"
            ) from None
        out_headers, content_type = _infer_headers(headers, ihcl)
        path = _model_path(request.model_name, request.model_version) + "/infer"
        if self._pool is not None:
            with self._mapped("inference"):
                async with asyncio.timeout(self._total_timeout):
                    lean = await self._pool.post(self._path_prefix + path, out_headers, chunks)
                    body: bytes | bytearray = await lean.read()
                self._raise_for_status(lean.status, body, request.model_name)
                resp_ihcl = lean.headers.get("inference-header-content-length")
        else:
            with self._mapped("inference"):
                async with self.session.post(
                    self.base_url + path,
                    data=BuffersPayload(chunks, content_type),
                    headers=out_headers,
                ) as resp:
                    body = await self._read(resp)
                    self._raise_for_status(resp.status, body, request.model_name)
                    resp_ihcl = resp.headers.get(binc.IHCL_HEADER)
        try:
            return binc.decode_response(body, int(resp_ihcl) if resp_ihcl else None)
        except (CodecError, ValueError) as exc:
            raise BadGateway(f"invalid inference response from backend: {exc}") from None

    @staticmethod
    async def _read(resp: aiohttp.ClientResponse) -> bytes | bytearray:
        length = resp.content_length
        if length is None:
            return await resp.read()
        return await read_exactly(resp.content, length)

    def _raise_for_status(self, status: int, body: bytes | bytearray, model: str) -> None:
        if status == 200:
            return
        message = _error_message(bytes(body), status)
        if status == 404:
            raise self._unknown(model, message)
        raise BackendError(message, status)

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        """One response per request: v2 REST /infer has no decoupled answers."""
        yield await self.infer(request, headers)

    async def can_relay(self, binary: bool) -> bool:
        """Binary bodies go unchanged to backends that take binary tensors; JSON ones to any
        backend, unless ``--backend-encoding binary`` asked for binary tensors always."""
        if binary:
            return await self.uses_binary()
        return self._encoding != "binary"

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        """Send a client's /infer body unchanged (piped through when it is still arriving) and
        stream the answer back unchanged."""
        out_headers, content_type = _infer_headers(headers, ihcl)
        if self._pool is not None:
            return await self._relay_lean(
                self._path_prefix + _model_path(model, version) + "/infer", model, out_headers, body
            )
        if isinstance(body, StreamedBody):  # https goes through aiohttp: buffered
            body = b"".join([chunk async for chunk in body.chunks])
        url = self.base_url + _model_path(model, version) + "/infer"
        with self._mapped("inference"):
            resp = await self.session.post(
                url, data=BuffersPayload([body], content_type), headers=out_headers
            )
            if resp.status != 200:
                try:
                    error_body = await resp.read()
                finally:
                    resp.release()
                self._raise_for_status(resp.status, error_body, model)
        relayed = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.items()
            if k.lower() in ("content-type", binc.IHCL_HEADER.lower())
        ]
        length = resp.content_length
        if length is not None and length <= _READ_WHOLE:
            with self._mapped("inference"):
                try:
                    content = await resp.read()
                finally:
                    resp.release()
            return ForwardResponse(200, relayed, _no_chunks(), content=content)

        async def stream() -> AsyncIterator[bytes]:
            with self._mapped("inference"):
                async for chunk in resp.content.iter_any():
                    yield chunk

        async def release() -> None:
            resp.release()

        return ForwardResponse(200, relayed, stream(), release, length=length)

    async def _relay_lean(
        self, path: str, model: str, headers: dict[str, str], body: Body
    ) -> ForwardResponse:
        payload: StreamedBody | list[Buffer]
        if isinstance(body, StreamedBody):
            # The timeout bounds the backend's waits, not a client's slow upload (_then_arm).
            deadline = asyncio.timeout(None)
            payload = StreamedBody(body.length, self._then_arm(body, deadline))
        else:
            deadline = asyncio.timeout(self._total_timeout)
            payload = [body]
        with self._mapped("inference"):
            async with deadline:
                resp = await self._pool.post(path, headers, payload)  # type: ignore[union-attr]
                small = resp.content_length is not None and resp.content_length <= _READ_WHOLE
                if resp.status != 200 or small:
                    content = await resp.read()
        if resp.status != 200:
            self._raise_for_status(resp.status, content, model)
        relayed = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.items()
            if k in ("content-type", "inference-header-content-length")
        ]
        if small:
            return ForwardResponse(200, relayed, _no_chunks(), content=content)

        async def stream() -> AsyncIterator[bytes]:
            with self._mapped("inference"):
                async for chunk in resp.iter_chunks():
                    yield chunk

        async def release() -> None:
            resp.close()

        return ForwardResponse(200, relayed, stream(), release, length=resp.content_length)

    async def _then_arm(
        self, body: StreamedBody, deadline: asyncio.Timeout
    ) -> AsyncIterator[bytes]:
        """The chunks of ``body``, with ``deadline`` off while the next one is awaited from the
        client and set to --backend-timeout from each one on: waits on the backend (taking the
        body, then answering) are bounded, a client's slow upload is not counted."""
        loop = asyncio.get_running_loop()
        chunks = aiter(body.chunks)
        while True:
            deadline.reschedule(None)
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            deadline.reschedule(loop.time() + self._total_timeout)
            yield chunk
        deadline.reschedule(loop.time() + self._total_timeout)

    # ------------------------------------------------------------------ side operations

    async def _side(self, method: str, path: str, headers: Headers, body: Any = None) -> Any:
        """A side endpoint's JSON answer; non-200 answers raised with their status."""
        payload = None if body is None else dumps(body)
        out = _request_headers(headers)
        if payload is not None:
            out["Content-Type"] = "application/json"
        with self._mapped(f"{method} {path}"):
            async with self.session.request(
                method, self.base_url + path, data=payload, headers=out
            ) as resp:
                raw = await resp.read()
                status = resp.status
        if status != 200:
            message = _error_message(raw, status)
            if status == 404:
                raise NotFound(message)
            raise BackendError(message, status)
        try:
            return loads(raw, what="backend answer") if raw.strip() else {}
        except CodecError as exc:
            raise BadGateway(f"invalid answer from backend to {path}: {exc}") from None

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        path = _model_path(model, version) + "/stats" if model else "/v2/models/stats"
        obj = await self._side("GET", path, headers)
        if not isinstance(obj, dict):
            raise BadGateway(f"invalid answer from backend to {path}: not a JSON object")
        return obj

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        obj = await self._side("POST", "/v2/repository/index", headers, {"ready": ready})
        if not isinstance(obj, list):
            raise BadGateway("invalid answer from backend to the repository index: not a list")
        return obj

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        action = "load" if load else "unload"
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
        await self._side("POST", path, headers, {"parameters": parameters} if parameters else {})

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        path = _model_path(model, "") + "/trace/setting" if model else "/v2/trace/setting"
        method = "GET" if update is None else "POST"
        obj = await self._side(method, path, headers, update)
        return obj if isinstance(obj, dict) else {}

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        obj = await self._side("GET" if update is None else "POST", "/v2/logging", headers, update)
        return obj if isinstance(obj, dict) else {}

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        with self._mapped(f"{method} {target.split('?', 1)[0]}"):
            resp = await self.session.request(
                method,
                self.base_url + target,
                data=body if body else None,
                headers=_forward_headers(headers),
            )

        async def stream() -> AsyncIterator[bytes]:
            with self._mapped("streaming the answer"):
                async for chunk in resp.content.iter_any():
                    yield chunk

        async def release() -> None:
            resp.release()

        return ForwardResponse(
            resp.status,
            [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in end_to_end(list(resp.headers.items()))
            ],
            stream(),
            release,
            length=resp.content_length,
        )


def _forward_headers(headers: Headers) -> dict[str, str]:
    return {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in headers
        if k.decode("latin-1") not in HOP_BY_HOP
    }
