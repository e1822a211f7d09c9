"""The REST frontend (aiohttp): every v2 endpoint of reference §5.1.

Terminated here: health, server/model metadata, model ready and config, and ``/infer`` in all
its wire forms (JSON, binary tensors, raw binary, gzip/deflate both ways). Everything else
(statistics, repository, trace, logging, generate, generate_stream, unknown paths) is passed
through to the backend untouched and streamed back without buffering.

Routing is one table of (path pattern, {method: handler}); a known path with the wrong method is
405. Every ProxyError becomes ``{"error": message}`` with its status in exactly one place
(:meth:`RestFrontend.dispatch`); nothing a client sends yields a traceback or a 500.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from v2proxy.codecs import binary as binc
from v2proxy.codecs import compression
from v2proxy.codecs.json import dumps
from v2proxy.errors import (
    BodyTooLarge,
    ExpectationFailed,
    InvalidRequest,
    ProxyError,
    Unsupported,
)
from v2proxy.http_io import ShortBody, end_to_end, read_exactly
from v2proxy.model import Buffer, InferRequest
from v2proxy.pipeline import ForwardResponse, Pipeline, StreamedBody

log = logging.getLogger(__name__)

Handler = Callable[
    ["RestFrontend", web.BaseRequest, "re.Match[str]"], Awaitable[web.StreamResponse]
]

REQUEST_ID = "x-request-id"
#: Client headers that are not passed on to the backend with an inference request.
_INFER_DROP = frozenset(
    {"content-type", "content-encoding", "accept-encoding", "inference-header-content-length"}
)
#: Bodies up to this size are joined and sent in one write; larger ones are streamed buffer by
#: buffer so that tensor data is never copied into a new body.
_JOIN_LIMIT = 256 * 1024
#: bodies (JSON or binary-framed) from this size on are relayed while they arrive, when relayed
STREAM_RELAY_MIN = 4 * 1024 * 1024
_HEADER_READ = web.RequestKey("v2proxy_header_read", bytearray)


def _json_response(status: int, obj: Any) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


def error_response(exc: ProxyError) -> web.Response:
    """The one translator from the error tree to HTTP."""
    resp = _json_response(exc.http_status, {"error": exc.message})
    if isinstance(exc, Unsupported) and "compression" in exc.message:
        resp.headers["Accept-Encoding"] = "gzip, deflate"
    return resp


def _model(m: re.Match[str]) -> tuple[str, str]:
    return m.group("model"), m.group("version") or ""


async def _chunks(request: web.BaseRequest, length: int, start: int = 0) -> AsyncIterator[bytes]:
    """The request body from byte ``start`` on, as it arrives; failing when it does not end
    exactly at ``length`` (its Content-Length)."""
    remaining = length - start
    while remaining:
        chunk = await request.content.readany()
        if not chunk or len(chunk) > remaining:
            raise InvalidRequest(
                f"incomplete request body: its length differs from Content-Length {length}"
            )
        remaining -= len(chunk)
        yield chunk


class RestFrontend:
    """Serves the v2 REST API on top of a :class:`Pipeline`."""

    def __init__(self, pipeline: Pipeline, max_input_size: int, max_body_size: int) -> None:
        self.pipeline = pipeline
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size

    def server(self, **kwargs: Any) -> web.Server:
        """aiohttp's low-level server for this frontend (in a running loop). There is no router
        or middleware layer: :data:`ROUTES` is the router. Bodies are decompressed here, bounded
        by --max-input-size; pass-through keeps them as they are."""
        loop = asyncio.get_running_loop()
        limit = self.max_body_size

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=limit
            )

        return web.Server(
            self.dispatch,
            request_factory=make_request,
            auto_decompress=False,
            access_log=None,
            **kwargs,
        )

    async def dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            if "Expect" in request.headers:
                await self._expect(request)
            response = await self._route(request)
        except ProxyError as exc:
            response = error_response(exc)
        except web.HTTPException:
            raise
        except ConnectionResetError:
            # The client went away while its answer was written: nothing left to tell it.
            log.debug("client closed the connection during %s %s", request.method, request.path)
            raise
        except Exception as exc:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            response = _json_response(500, {"error": f"internal error: {type(exc).__name__}"})
        rid = request.headers.get(REQUEST_ID)
        if rid is not None and not response.prepared:
            response.headers[REQUEST_ID] = rid
        return response

    @staticmethod
    async def _expect(request: web.BaseRequest) -> None:
        """RFC 9110 §10.1.1: an HTTP/1.1 client that sent ``Expect: 100-continue`` waits for
        the interim answer before sending its body."""
        expect = request.headers["Expect"].strip().lower()
        if expect != "100-continue":
            raise ExpectationFailed(f"unsupported Expect header: {expect!r}")
        if request.version >= (1, 1) and request.writer is not None:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        for pattern, methods in ROUTES:
            m = pattern.fullmatch(path)
            if m is not None:
                handler = methods.get(request.method)
                if handler is None:
                    return _json_response(405, {"error": "Method Not Allowed"})
                return await handler(self, request, m)
        return await self.passthrough(request)

    async def read_body(self, request: web.BaseRequest) -> bytes | bytearray:
        """The whole request body, bounded by --max-body-size (one copy when its length is
        known)."""
        length = request.content_length
        header: bytearray | None = request.get(_HEADER_READ)
        if header is not None:  # a streamed relay was refused after reading the JSON header
            return header + await self._read_exactly(request, (length or 0) - len(header))
        if length is not None and length > self.max_body_size:
            raise BodyTooLarge(
                f"request body of {length} bytes exceeds the maximum body size of"
                f" {self.max_body_size} bytes (--max-body-size)"
            )
        if length is not None:
            return await self._read_exactly(request, length)
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(
                f"request body exceeds the maximum body size of {self.max_body_size} bytes"
                " (--max-body-size)"
            ) from None

    @staticmethod
    async def _read_exactly(request: web.BaseRequest, length: int) -> bytearray:
        try:
            return await read_exactly(request.content, length)
        except ShortBody as exc:
            raise InvalidRequest(f"incomplete request body: {exc}") from None

    # ------------------------------------------------------------------ terminated endpoints

    async def live(self, _request: web.BaseRequest, _m: re.Match[str]) -> web.StreamResponse:
        return web.Response(status=200)

    async def ready(self, _request: web.BaseRequest, _m: re.Match[str]) -> web.StreamResponse:
        ok = await self.pipeline.backend.server_ready()
        return web.Response(status=200 if ok else 400)

    async def server_metadata(self, _r: web.BaseRequest, _m: re.Match[str]) -> web.StreamResponse:
        return _json_response(200, await self.pipeline.server_metadata())

    async def model_metadata(self, _r: web.BaseRequest, m: re.Match[str]) -> web.StreamResponse:
        return _json_response(200, await self.pipeline.backend.model_metadata(*_model(m)))

    async def model_config(self, _r: web.BaseRequest, m: re.Match[str]) -> web.StreamResponse:
        return _json_response(200, await self.pipeline.backend.model_config(*_model(m)))

    async def model_ready(self, _r: web.BaseRequest, m: re.Match[str]) -> web.StreamResponse:
        if await self.pipeline.backend.model_ready(*_model(m)):
            return web.Response(status=200)
        return _json_response(400, {"error": "Model version not ready"})

    async def infer(self, request: web.BaseRequest, m: re.Match[str]) -> web.StreamResponse:
        model, version = _model(m)
        headers = request.headers
        encoding = compression.choose_encoding(headers.get("Accept-Encoding"))
        streamed = await self._stream_relay(request, model, version, encoding)
        if streamed is not None:
            return streamed
        forwarded = dict(end_to_end(list(headers.items()), _INFER_DROP))
        if self._streams(request, encoding) and binc.IHCL_HEADER not in headers:
            length = request.content_length or 0
            outcome = await self.pipeline.relay_json(
                model, version, StreamedBody(length, _chunks(request, length)), forwarded
            )
            if isinstance(outcome, ForwardResponse):
                return await self._write_forwarded(request, outcome)
            return await self._answer(request, outcome, forwarded, encoding)
        body: Buffer = await self.read_body(request)
        content_encoding = headers.get("Content-Encoding")
        body = compression.decompress(body, content_encoding, self.max_input_size)
        ihcl = binc.parse_ihcl(headers.get(binc.IHCL_HEADER), len(body))
        if ihcl == 0:
            infer_request = await self.pipeline.decode_raw(body, model, version)
        else:
            infer_request = binc.decode_request(body, ihcl, model, version, self.max_input_size)
            if encoding is None and isinstance(body, bytes | bytearray):
                relayed = await self.pipeline.relay(infer_request, body, ihcl, forwarded)
                if relayed is not None:
                    return await self._write_forwarded(request, relayed)
        return await self._answer(request, infer_request, forwarded, encoding)

    async def _answer(
        self,
        request: web.BaseRequest,
        infer_request: InferRequest,
        forwarded: dict[str, str],
        encoding: str | None,
    ) -> web.StreamResponse:
        """Run a decoded request through the pipeline and write the answer in the wire form
        the client asked for."""
        response = await self.pipeline.infer(infer_request, forwarded)
        chunks, json_length = binc.encode_response(response, binc.binary_output_rule(infer_request))
        out_headers = {"Content-Type": "application/json"}
        if json_length is not None:
            out_headers["Content-Type"] = "application/octet-stream"
            out_headers[binc.IHCL_HEADER] = str(json_length)
        if encoding is not None:
            chunks = [compression.compress(chunks, encoding)]
            out_headers["Content-Encoding"] = encoding
        return await self._send(request, out_headers, chunks)

    async def _stream_relay(
        self, request: web.BaseRequest, model: str, version: str, encoding: str | None
    ) -> web.StreamResponse | None:
        """A large binary-framed body is relayed while it arrives (as nginx streams): only its
        JSON header is read and checked first. None when this does not apply; the body is then
        still unread, unless the relay was refused after the header, in which case the header
        is kept in ``request[_HEADER_READ]`` for :meth:`read_body`."""
        length = request.content_length
        ihcl_value = request.headers.get(binc.IHCL_HEADER)
        if length is None or ihcl_value is None or not self._streams(request, encoding):
            return None
        ihcl = binc.parse_ihcl(ihcl_value, length)
        if not ihcl:
            return None
        try:
            header = bytearray(await request.content.readexactly(ihcl))
        except asyncio.IncompleteReadError as exc:
            raise InvalidRequest(
                f"incomplete request body: it ended after {len(exc.partial)} bytes"
            ) from None
        request[_HEADER_READ] = header
        probe = binc.decode_request_header(
            header, length - ihcl, model, version, self.max_input_size
        )

        async def chunks() -> AsyncIterator[bytes]:
            yield bytes(header)
            async for chunk in _chunks(request, length, ihcl):
                yield chunk

        forwarded = dict(end_to_end(list(request.headers.items()), _INFER_DROP))
        relayed = await self.pipeline.relay(probe, StreamedBody(length, chunks()), ihcl, forwarded)
        if relayed is None:
            return None
        return await self._write_forwarded(request, relayed)

    def _streams(self, request: web.BaseRequest, encoding: str | None) -> bool:
        """Whether an /infer body is large enough to be relayed while it arrives (when relayed
        at all) and comes in a form that allows it: a known length within the limit, no
        compression either way."""
        length = request.content_length
        return (
            length is not None
            and STREAM_RELAY_MIN <= length <= self.max_body_size
            and encoding is None
            and request.headers.get("Content-Encoding", "identity").strip().lower() == "identity"
        )

    async def _write_forwarded(
        self, request: web.BaseRequest, answer: ForwardResponse
    ) -> web.StreamResponse:
        """Write a backend's answer through unchanged: in one piece when it was read whole,
        else streamed as it comes (with its Content-Length when it has one)."""
        rid = request.headers.get(REQUEST_ID)
        if answer.content is not None:
            headers = {k: v for k, v in answer.headers if k.lower() != "content-length"}
            if rid is not None:
                headers.setdefault(REQUEST_ID, rid)
            return web.Response(status=answer.status, body=answer.content, headers=headers)
        try:
            out = web.StreamResponse(status=answer.status)
            for k, v in answer.headers:
                if k.lower() == "content-length":
                    out.content_length = int(v)
                else:
                    out.headers.add(k, v)
            if rid is not None and REQUEST_ID not in out.headers:
                out.headers[REQUEST_ID] = rid
            await out.prepare(request)
            try:
                async for chunk in answer.body:
                    await out.write(chunk)
            except ProxyError as exc:
                # The status line is sent already: cut the connection so that the client sees
                # a broken stream rather than a complete-looking short body.
                log.warning("answer to %s broke off: %s", request.path, exc.message)
                if request.transport is not None:
                    request.transport.close()
                return out
            await out.write_eof()
            return out
        finally:
            await answer.release()

    async def _send(
        self, request: web.BaseRequest, headers: dict[str, str], chunks: list[Buffer]
    ) -> web.StreamResponse:
        """A 200 answer: small bodies in one write, large ones buffer by buffer (no join)."""
        rid = request.headers.get(REQUEST_ID)
        if rid is not None:
            headers[REQUEST_ID] = rid
        if len(chunks) == 1 and isinstance(chunks[0], bytes):
            return web.Response(body=chunks[0], headers=headers)
        total = sum(memoryview(c).nbytes for c in chunks)
        if total <= _JOIN_LIMIT:
            return web.Response(body=b"".join(chunks), headers=headers)
        out = web.StreamResponse(headers=headers)
        out.content_length = total
        await out.prepare(request)
        for chunk in chunks:
            await out.write(chunk)
        await out.write_eof()
        return out

    # ------------------------------------------------------------------ pass-through

    async def passthrough(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await self.read_body(request)
        forwarded = await self.pipeline.backend.forward(
            request.method, request.raw_path, list(request.headers.items()), body
        )
        if request.path.startswith("/v2/repository/"):
            self.pipeline.invalidate()
        return await self._write_forwarded(request, forwarded)


_M = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"

ROUTES: list[tuple[re.Pattern[str], dict[str, Handler]]] = [
    (re.compile(_M + "/infer"), {"POST": RestFrontend.infer}),  # the hot one first
    (re.compile(r"/v2/health/live"), {"GET": RestFrontend.live}),
    (re.compile(r"/v2/health/ready"), {"GET": RestFrontend.ready}),
    (re.compile(r"/v2/?"), {"GET": RestFrontend.server_metadata}),
    (re.compile(_M + "/ready"), {"GET": RestFrontend.model_ready}),
    (re.compile(_M + "/config"), {"GET": RestFrontend.model_config}),
    (
        re.compile(r"/v2/models/(?!stats$)(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"),
        {"GET": RestFrontend.model_metadata},
    ),
]
