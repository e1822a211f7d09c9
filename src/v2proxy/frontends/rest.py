"""The REST frontend: every v2 REST endpoint (docs/protocol.md, endpoints), on v2proxy's own
HTTP/1.1 server (:mod:`v2proxy.http.server`).

Each endpoint becomes a call of the one :class:`Pipeline`, routed by the table of
:mod:`v2proxy.frontends.routes`; a known path with the wrong method is 405, and any other path
is passed through to the backend untouched. Every request but ``GET /metrics`` (always the
proxy's own) goes through the exchange envelope (:mod:`v2proxy.frontends.exchange`): admission,
then the access policy of its row's API group, checked once, then the record. Every ProxyError
becomes one error answer in its API's shape; nothing a client sends yields a 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from v2proxy.codecs import compression, side
from v2proxy.codecs.openai import LIMITS, RequestLimits
from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import (
    InvalidRequest,
    MethodNotAllowed,
    ProxyError,
)
from v2proxy.core.headers import WRITTEN
from v2proxy.core.model import Buffer
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse, no_release
from v2proxy.core.restricted import OPEN, AccessPolicy, passthrough_group
from v2proxy.frontends import openapi, rest_record, routes
from v2proxy.frontends.exchange import Envelope, Exchange
from v2proxy.frontends.mindie import MindieFrontend
from v2proxy.frontends.mindie import error_answer as mindie_error_answer
from v2proxy.frontends.openai import OpenAIFrontend
from v2proxy.frontends.openai import error_answer as openai_error_answer
from v2proxy.frontends.rest_answer import (
    JSON,
    Answer,
    Handler,
    error_answer,
    forwarded_headers,
    json_answer,
    write_forwarded,
)
from v2proxy.frontends.rest_generate import GenerateEndpoint
from v2proxy.frontends.rest_infer import InferEndpoint, infer_headers
from v2proxy.frontends.rest_quick import QuickLane
from v2proxy.frontends.rest_request import BodyReader, headers_of
from v2proxy.frontends.rest_shm import SharedMemoryEndpoints
from v2proxy.http.request import HttpRequest, unless_gone
from v2proxy.http.response import HttpResponse
from v2proxy.ops.config_sections import MindieSettings, OpenAIModel, OpenAISettings
from v2proxy.ops.metrics_export import CONTENT_TYPE, AnyMetrics, NullMetrics
from v2proxy.ops.recorders import FrontendRecorder

log = logging.getLogger(__name__)

REQUEST_ID = rest_record.REQUEST_ID
_METRICS_TYPE = CONTENT_TYPE.encode()


def _model(m: re.Match[str]) -> tuple[str, str]:
    return m.group("model") or "", m.group("version") or ""


class RestFrontend:
    """Serves the v2 REST API on top of a :class:`Pipeline`; records every request but
    ``/metrics`` scrapes."""

    def __init__(
        self,
        pipeline: Pipeline,
        max_input_size: int,
        max_body_size: int,
        metrics: AnyMetrics | None = None,
        access_log: bool = False,
        mindie: MindieSettings | None = None,
        gate: AdmissionGate | None = None,
        openai: OpenAISettings | None = None,
        openai_limits: RequestLimits = LIMITS,
        access: AccessPolicy = OPEN,
    ) -> None:
        self.pipeline = pipeline
        self.access = access
        #: --max-concurrency, shared with the gRPC frontend
        self.gate = gate or AdmissionGate()
        self.max_input_size = max_input_size
        self.max_body_size = max_body_size
        self.metrics: AnyMetrics = metrics or NullMetrics()
        self.recorder = FrontendRecorder(self.metrics, "rest", access_log)
        self.envelope = self._envelope(self.recorder)
        #: the same for the OpenAI routes, recorded under frontend="openai"
        self.openai_envelope = self._envelope(FrontendRecorder(self.metrics, "openai", access_log))
        self.body = BodyReader(max_body_size, max_input_size)
        self.read_body = self.body.read
        self.mindie = MindieFrontend(pipeline, mindie, self.metrics)
        self.openai = OpenAIFrontend(
            pipeline,
            openai or default_openai(mindie),
            max_input_size,
            self.metrics,
            limits=openai_limits,
        )
        infer = self.infer_endpoint = InferEndpoint(
            pipeline, self.recorder, self.body, max_input_size
        )
        generate = GenerateEndpoint(pipeline, self.body)
        shm = SharedMemoryEndpoints(pipeline, self.body)
        #: the handler names of the route table, bound to the endpoints that serve them
        self.handlers: dict[str, Handler] = {
            "infer": infer.infer,
            "generate": generate.generate,
            "generate_stream": generate.generate_stream,
            "live": self.live,
            "ready": self.ready,
            "server_metadata": self.server_metadata,
            "model_ready": self.model_ready,
            "model_config": self.model_config,
            "model_metadata": self.model_metadata,
            "statistics": self.statistics,
            "repository_index": self.repository_index,
            "repository_load": self.repository_load,
            "trace_settings": self.trace_settings,
            "log_settings": self.log_settings,
            "shm_status": shm.status,
            "shm_register": shm.register,
            "shm_unregister": shm.unregister,
            "mindie_infer": self.mindie_infer,
            "openai_models": self.openai_models,
            "openai_model": self.openai_model,
            "openai_completions": self.openai_completions,
            "openai_chat": self.openai_chat,
            "openapi_document": self.openapi_document,
        }
        handlers = self.handlers
        #: (the row's fullmatch, {method: handler}, row), in the table's order
        self.routing = [
            (row.pattern.fullmatch, {m: handlers[name] for m, name in row.methods.items()}, row)
            for row in routes.ROUTES
        ]
        self.method_not_allowed: Handler = self.not_allowed
        self.passed_through: Handler = self.passthrough
        self._passthrough_found: _Found = (
            _AnyMethod(self.passed_through),
            None,
            routes.PASSTHROUGH,
        )
        #: path -> its route: a client mostly asks for the same few paths
        self._found: dict[str, _Found] = {}
        #: the small relayed /infer, taken straight from the HTTP server's callbacks
        self.quick = QuickLane(self)

    def _envelope(self, recorder: FrontendRecorder) -> Envelope:
        """An exchange envelope of this frontend."""
        return Envelope(
            recorder,
            self.gate,
            rest_record.describe,
            rest_record.GONE,
            classify=rest_record.transport_failure,
            keeps=rest_record.cut_short,
        )

    async def dispatch(self, request: HttpRequest, response: HttpResponse) -> None:
        """The HTTP server's handler: route, answer, translate errors, all inside the request's
        exchange envelope."""
        if request.path == "/metrics":
            await self.scrape(request, response)
            return
        found = self._found.get(request.path)
        if found is None:
            found = self._route(request.path)
        methods, m, route = found
        handler = methods.get(request.method, self.method_not_allowed)
        env = self.envelope if route.frontend == "rest" else self.openai_envelope
        op = route.operation
        with env.open(op, request) as x:
            if route.names_model:
                x.model = m.group("model") or ""
            if op == "infer":
                # the quick lane's one pass over the headers, kept when it declined
                seen = request.state or infer_headers(request)
                rid, x.wire_in = seen[4], rest_record.wire_in(seen[2])
            else:
                rid = request.header(REQUEST_ID)
            try:
                try:
                    x.admit()
                    group = route.check_first
                    if group is not None and handler is not self.method_not_allowed:
                        # before the handler reads a body: a 403, not a body's 400
                        access = self.access
                        if access.restricts(group):
                            access.check(group, request.headers)
                    answer = await handler(request, m, x)
                except ProxyError as exc:
                    answer = _ERROR_ANSWERS[route.errors](exc)
                    x.fail(exc)
                if isinstance(answer, ForwardResponse):
                    x.status = status = answer.status
                    if op == "infer" and status == 200:
                        x.wire_out = rest_record.wire_out(answer.headers)
                    content = answer.content
                    if content is not None and answer.release is no_release:  # read whole
                        await response.send(status, forwarded_headers(answer, rid), content)
                        x.n_out = len(content)
                    else:
                        x.n_out = await write_forwarded(request, response, answer, rid)
                else:
                    x.status, headers, body = answer
                    if op == "infer" and x.status == 200:
                        x.wire_out = rest_record.wire_out(headers)
                    x.n_out = rest_record.size(body)
                    if rid is not None:
                        headers.append((REQUEST_ID, rid))
                    await response.send(x.status, headers, body)
            finally:
                x.n_in = (
                    self.body.taken(request) if request.chunked else request.content_length or 0
                )
                if not x.cause and x.status >= 400:
                    # an error answer of no ProxyError: a 405, not ready, the backend's
                    x.error = rest_record.answer_error(op, x.status)

    def check_access(self, group: str | None, request: HttpRequest) -> None:
        """The access check of a request whose row defers it to its handler, or that no row
        matches (passed through)."""
        access = self.access
        if group is not None and access.restricts(group):
            access.check(group, request.headers)

    def find(self, request: HttpRequest) -> tuple[Handler, Any, routes.Route]:
        """The handler of a request, its path match (None: passed through) and its route."""
        methods, m, route = self._found.get(request.path) or self._route(request.path)
        return methods.get(request.method, self.method_not_allowed), m, route

    def _route(self, path: str) -> _Found:
        """The route of ``path``; a matched path is remembered, within bounds whatever clients
        ask."""
        for fullmatch, methods, route in self.routing:
            m = fullmatch(path)
            if m is not None:
                found = (methods, m, route)
                if len(self._found) < ROUTES_KEPT and len(path) <= ROUTE_KEPT_MAX:
                    self._found[path] = found
                return found
        return self._passthrough_found

    async def scrape(self, request: HttpRequest, response: HttpResponse) -> None:
        """``GET /metrics``: the proxy's own metrics, never the backend's (404 when off)."""
        answer: tuple[int, list[tuple[bytes, bytes]], Buffer | list[Buffer]]
        if not self.metrics.enabled:
            answer = json_answer(404, {"error": "Not Found"})  # type: ignore[assignment]
        elif request.method not in ("GET", "HEAD"):
            answer = json_answer(405, {"error": "Method Not Allowed"})  # type: ignore[assignment]
            answer[1].append((b"allow", routes.METRICS.allow))
        else:
            answer = 200, [(b"content-type", _METRICS_TYPE)], self.metrics.exposition()
        status, headers, body = answer
        rid = request.header(REQUEST_ID)
        if rid is not None:
            headers.append((REQUEST_ID, rid))
        await response.send(status, headers, body)

    async def live(self, _r: HttpRequest, _m: re.Match[str], _x: Exchange) -> Answer:
        await self.pipeline.server_live()
        return 200, [], b""

    async def ready(self, _r: HttpRequest, _m: re.Match[str], _x: Exchange) -> Answer:
        ok = await self.pipeline.server_ready()
        return 200 if ok else 400, [], b""

    async def server_metadata(self, _r: HttpRequest, _m: re.Match[str], _x: Exchange) -> Answer:
        return json_answer(200, await self.pipeline.server_metadata())

    async def model_metadata(self, _r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        return json_answer(200, await self.pipeline.model_metadata(*_model(m)))

    async def model_config(self, _r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        return json_answer(200, await self.pipeline.model_config(*_model(m)))

    async def model_ready(self, _r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        if await self.pipeline.model_ready(*_model(m)):
            return 200, [], b""
        return json_answer(400, {"error": "Model version not ready"})

    async def statistics(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        return json_answer(200, await self.pipeline.statistics(*_model(m), headers_of(r, WRITTEN)))

    async def repository_index(self, r: HttpRequest, _m: re.Match[str], _x: Exchange) -> Answer:
        ready = side.index_ready(await self.read_body(r))
        return json_answer(200, await self.pipeline.repository_index(ready, headers_of(r, WRITTEN)))

    async def repository_load(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        params = side.load_parameters(await self.read_body(r))
        load = m.group("action") == "load"
        await self.pipeline.repository_load(m.group("model"), load, params, headers_of(r, WRITTEN))
        return 200, [], b""

    async def _update(self, r: HttpRequest, what: str) -> dict[str, Any] | None:
        if r.method != "POST":
            return None
        return side.settings_update(await self.read_body(r), what)

    async def trace_settings(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        update = await self._update(r, "trace settings")
        model = m.group("model") or ""
        return json_answer(
            200, await self.pipeline.trace_settings(model, update, headers_of(r, WRITTEN))
        )

    async def log_settings(self, r: HttpRequest, _m: re.Match[str], _x: Exchange) -> Answer:
        update = await self._update(r, "log settings")
        return json_answer(200, await self.pipeline.log_settings(update, headers_of(r, WRITTEN)))

    async def passthrough(self, request: HttpRequest, _m: Any, _x: Exchange) -> Answer:
        target = request.target.decode("latin-1")
        if not target.startswith("/"):  # the HTTP layer refuses these already: never a host
            raise InvalidRequest("the request target must be a path starting with '/'")
        body = await self.read_body(request)
        self.check_access(passthrough_group(target), request)
        return await self.pipeline.passthrough(request.method, target, headers_of(request), body)

    async def mindie_infer(self, r: HttpRequest, _m: Any, x: Exchange) -> Answer:
        """MindIE's native ``POST /infer``: access checked after the body is validated, as
        MindIE does."""
        body = await self.body.read_input(r)
        x.model = self.mindie.settings.model

        def admit() -> None:
            self.check_access(routes.MINDIE.group, r)

        # a whole generation may pass without a write: the client leaving cancels it
        return await unless_gone(r, self.mindie.infer(body, headers_of(r, WRITTEN), admit))

    async def openai_models(self, _r: HttpRequest, _m: Any, _x: Exchange) -> Answer:
        """``GET /v1/models``: the proxy's own list."""
        return self.openai.list_models()

    async def openai_model(self, r: HttpRequest, m: re.Match[str], x: Exchange) -> Answer:
        """``GET /v1/models/{id}`` (the id percent-decoded: clients encode its ``/``)."""
        model_id = unquote(m.group("id"))
        answer = self.openai.get_model(model_id)
        x.model = model_id
        return answer

    async def openai_completions(self, r: HttpRequest, _m: Any, x: Exchange) -> Answer:
        """``POST /v1/completions``."""
        return await self._openai_generate(r, False, x)

    async def openai_chat(self, r: HttpRequest, _m: Any, x: Exchange) -> Answer:
        """``POST /v1/chat/completions``."""
        return await self._openai_generate(r, True, x)

    async def _openai_generate(self, r: HttpRequest, chat: bool, x: Exchange) -> Answer:
        prepared = self.openai.prepare(chat, await self._openai_body(r))
        x.model = prepared[1].model
        # a whole generation may pass without a write: the client leaving cancels it
        return await unless_gone(r, self.openai.generate(prepared, headers_of(r, WRITTEN)))

    async def _openai_body(self, r: HttpRequest) -> Buffer:
        """An OpenAI body, whole and decoded, within ``--max-input-size``."""
        body = await self.body.read_input(r)
        encoding = r.header(b"content-encoding")
        if encoding is None:
            return body
        return compression.decompress(body, encoding.decode("latin-1"), self.max_input_size)

    async def openapi_document(self, _r: HttpRequest, _m: Any, _x: Exchange) -> Answer:
        """``GET /openapi.json``: the document of this API."""
        return 200, list(JSON), openapi.document_json()

    async def not_allowed(self, _r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        """405 with ``Allow`` naming the route's methods, in the shape of the route's API."""
        if _ERRORS[m.re] == "openai":
            status, headers, body = openai_error_answer(MethodNotAllowed("Method Not Allowed"))
            return status, [*headers, (b"allow", _ALLOW[m.re])], body
        status, fields, text = json_answer(405, {"error": "Method Not Allowed"})  # type: ignore[misc]
        return status, [*fields, (b"allow", _ALLOW[m.re])], text


def default_openai(mindie: MindieSettings | None) -> OpenAISettings:
    """The OpenAI routes without an ``openai:`` section: the one model MindIE's ``/infer``
    serves, under its own name."""
    m = mindie or MindieSettings("llm")
    seed = m.seed_input if m.profile == "trtllm" else "seed"
    return OpenAISettings((OpenAIModel(m.model, m.model, m.profile, seed),))


#: the most paths a frontend remembers routes of, and the longest (others are matched afresh)
ROUTES_KEPT = 1024
ROUTE_KEPT_MAX = 512


class _AnyMethod(dict[str, Handler]):
    """The handlers of a path no row matches: the pass-through, whatever the method."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    def __missing__(self, method: str) -> Handler:
        return self.handler

    def get(self, method: str, default: Any = None) -> Handler:
        return self.handler


#: a path's route: its handlers by method, its match (None: passed through), its row
_Found = tuple[dict[str, Handler], Any, routes.Route]

_ALLOW = {row.pattern: row.allow for row in routes.ROUTES}
_ERRORS = {row.pattern: row.errors for row in routes.ROUTES}
_ERROR_ANSWERS: dict[str, Callable[[ProxyError], Answer]] = {
    "v2": error_answer,
    "mindie": mindie_error_answer,
    "openai": openai_error_answer,
}
