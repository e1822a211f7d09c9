"""The REST frontend: every v2 endpoint of reference §5.1, on v2proxy's own HTTP/1.1 server
(:mod:`v2proxy.http.server`, llhttp under an ``asyncio.Protocol``).

Each endpoint is decoded here into a call of the one :class:`Pipeline` (health, metadata,
config, statistics, repository, trace and log settings, ``/infer`` in all its wire forms: JSON,
binary tensors, raw binary, gzip/deflate both ways — the /infer path is in
:mod:`v2proxy.frontends.rest_infer`). Any other path (``generate``, ``generate_stream``,
unknown ones) is passed through to the backend untouched and streamed back.

Routing is one table of (path pattern, {method: handler}); a known path with the wrong method is
405. Every ProxyError becomes ``{"error": message}`` with its status in exactly one place
(:func:`error_answer`); nothing a client sends yields a traceback or a 500. Headers reach the
backend as the bytes the client sent; ``x-request-id`` is echoed on every answer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from v2proxy.codecs import side
from v2proxy.codecs.json import dumps
from v2proxy.errors import BodyTooLarge, InvalidRequest, ProxyError, Unsupported
from v2proxy.frontends import rest_infer
from v2proxy.frontends.rest_infer import headers_of
from v2proxy.http import request as http
from v2proxy.http.request import HttpRequest, HttpResponse
from v2proxy.model import Buffer
from v2proxy.pipeline import Pipeline
from v2proxy.ports import ForwardResponse

log = logging.getLogger(__name__)

Handler = Callable[["RestFrontend", HttpRequest, "re.Match[str]"], Awaitable["Answer"]]
#: a complete answer: status, headers, body
Answer = tuple[int, list[tuple[bytes, bytes]], Buffer | list[Buffer]] | ForwardResponse

REQUEST_ID = b"x-request-id"
JSON = [(b"content-type", b"application/json")]


def json_answer(status: int, obj: Any) -> Answer:
    return status, list(JSON), dumps(obj)


def error_answer(exc: ProxyError) -> Answer:
    """The one translator from the error tree to HTTP."""
    status, headers, body = json_answer(exc.http_status, {"error": exc.message})  # type: ignore[misc]
    if isinstance(exc, Unsupported) and "compression" in exc.message:
        headers.append((b"accept-encoding", b"gzip, deflate"))
    return status, headers, body


def _model(m: re.Match[str]) -> tuple[str, str]:
    return m.group("model") or "", m.group("version") or ""


class RestFrontend:
    """Serves the v2 REST API on top of a :class:`Pipeline`."""

    def __init__(self, pipeline: Pipeline, max_input_size: int, max_body_size: int) -> None:
        self.pipeline = pipeline
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size

    async def dispatch(self, request: HttpRequest, response: HttpResponse) -> None:
        """The HTTP server's handler: route, answer, translate errors."""
        try:
            answer = await self._route(request)
        except ProxyError as exc:
            answer = error_answer(exc)
        rid = request.header(REQUEST_ID)
        if isinstance(answer, ForwardResponse):
            await rest_infer.write_forwarded(request, response, answer, rid)
            return
        status, headers, body = answer
        if rid is not None:
            headers.append((REQUEST_ID, rid))
        await response.send(status, headers, body)

    async def _route(self, request: HttpRequest) -> Answer:
        path = request.path
        for pattern, methods in ROUTES:
            m = pattern.fullmatch(path)
            if m is not None:
                handler = methods.get(request.method)
                if handler is None:
                    return json_answer(405, {"error": "Method Not Allowed"})
                return await handler(self, request, m)
        return await self.passthrough(request)

    async def read_body(self, request: HttpRequest) -> bytearray:
        """The whole request body, bounded by --max-body-size."""
        try:
            return await request.read(self.max_body_size)
        except http.BodyTooLarge:
            raise BodyTooLarge(
                f"request body exceeds the maximum body size of {self.max_body_size} bytes"
                " (--max-body-size)"
            ) from None

    # ------------------------------------------------------------------ health and metadata

    async def live(self, r: HttpRequest, _m: re.Match[str]) -> Answer:
        await self.pipeline.server_live(headers_of(r))
        return 200, [], b""

    async def ready(self, r: HttpRequest, _m: re.Match[str]) -> Answer:
        ok = await self.pipeline.server_ready(headers_of(r))
        return 200 if ok else 400, [], b""

    async def server_metadata(self, r: HttpRequest, _m: re.Match[str]) -> Answer:
        return json_answer(200, await self.pipeline.server_metadata(headers_of(r)))

    async def model_metadata(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        return json_answer(200, await self.pipeline.model_metadata(*_model(m), headers_of(r)))

    async def model_config(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        return json_answer(200, await self.pipeline.model_config(*_model(m), headers_of(r)))

    async def model_ready(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        if await self.pipeline.model_ready(*_model(m), headers_of(r)):
            return 200, [], b""
        return json_answer(400, {"error": "Model version not ready"})

    # ------------------------------------------------------------------ inference

    async def infer(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        return await rest_infer.infer(self, r, *_model(m))

    # ------------------------------------------------------------------ side operations

    async def statistics(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        return json_answer(200, await self.pipeline.statistics(*_model(m), headers_of(r)))

    async def repository_index(self, r: HttpRequest, _m: re.Match[str]) -> Answer:
        ready = side.index_ready(await self.read_body(r))
        return json_answer(200, await self.pipeline.repository_index(ready, headers_of(r)))

    async def repository_load(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        params = side.load_parameters(await self.read_body(r))
        load = m.group("action") == "load"
        await self.pipeline.repository_load(m.group("model"), load, params, headers_of(r))
        return 200, [], b""

    async def _update(self, r: HttpRequest, what: str) -> dict[str, Any] | None:
        if r.method != "POST":
            return None
        return side.settings_update(await self.read_body(r), what)

    async def trace_settings(self, r: HttpRequest, m: re.Match[str]) -> Answer:
        update = await self._update(r, "trace settings")
        model = m.group("model") or ""
        return json_answer(200, await self.pipeline.trace_settings(model, update, headers_of(r)))

    async def log_settings(self, r: HttpRequest, _m: re.Match[str]) -> Answer:
        update = await self._update(r, "log settings")
        return json_answer(200, await self.pipeline.log_settings(update, headers_of(r)))

    # ------------------------------------------------------------------ pass-through

    async def passthrough(self, request: HttpRequest) -> Answer:
        target = request.target.decode("latin-1")
        if not target.startswith("/"):  # the HTTP layer refuses these already: never a host
            raise InvalidRequest("the request target must be a path starting with '/'")
        body = await self.read_body(request)
        return await self.pipeline.passthrough(request.method, target, headers_of(request), body)


_M = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"
_BOTH = ("GET", "POST")

ROUTES: list[tuple[re.Pattern[str], dict[str, Handler]]] = [
    (re.compile(_M + "/infer"), {"POST": RestFrontend.infer}),  # the hot one first
    (re.compile(r"/v2/health/live"), {"GET": RestFrontend.live}),
    (re.compile(r"/v2/health/ready"), {"GET": RestFrontend.ready}),
    (re.compile(r"/v2/?"), {"GET": RestFrontend.server_metadata}),
    (re.compile(_M + "/ready"), {"GET": RestFrontend.model_ready}),
    (re.compile(_M + "/config"), {"GET": RestFrontend.model_config}),
    (re.compile(r"/v2/models/stats(?P<model>)(?P<version>)"), {"GET": RestFrontend.statistics}),
    (re.compile(_M + "/stats"), {"GET": RestFrontend.statistics}),
    (re.compile(r"/v2/repository/index"), {"POST": RestFrontend.repository_index}),
    (
        re.compile(r"/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)"),
        {"POST": RestFrontend.repository_load},
    ),
    (
        re.compile(r"/v2/(?:models/(?P<model>[^/]+)/)?trace/setting"),
        dict.fromkeys(_BOTH, RestFrontend.trace_settings),
    ),
    (re.compile(r"/v2/logging"), dict.fromkeys(_BOTH, RestFrontend.log_settings)),
    (
        re.compile(r"/v2/models/(?!stats$)(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"),
        {"GET": RestFrontend.model_metadata},
    ),
]
