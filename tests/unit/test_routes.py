"""The REST frontend's route table (``v2proxy.frontends.routes``), table-driven: for each method
and path, the handler that serves it, its ``operation`` label, its API group and whether that
group's check is deferred to the handler; the 405s and their ``Allow``; what is passed through;
that every group is one of ``v2proxy.core.restricted``'s and is the one the request is checked
for, exactly once (before the body is read, but for MindIE's ``/infer``); and that no spelling
of a restricted route passes through as another group.

Requests go through :meth:`v2proxy.frontends.rest.RestFrontend.find` (the router) or through
``RestFrontend.dispatch`` with fake request and response objects, in front of the builtin backend:
no sockets.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Headers
from v2proxy.core.restricted import GROUPS, OPEN, passthrough_group
from v2proxy.frontends import routes
from v2proxy.frontends.rest import RestFrontend
from v2proxy.frontends.routes import METRICS, PASSTHROUGH, ROUTES, compile_template
from v2proxy.ops.metrics_export import Metrics

_M = "/v2/models/simple"
_V = "/v2/models/simple/versions/1"
_INF, _SIDE, _META, _HEALTH = "inference", "side", "metadata", "health"
#: a frontend whose route table the router tests match against (no request is served)
_FE = RestFrontend(Pipeline(BuiltinBackend(), 1 << 20), 1 << 20, 1 << 20)


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    handler: str
    operation: str
    group: str | None
    #: checked by the handler (MindIE's /infer: after the body is validated), not on admission
    deferred: bool = False


#: every route, in each of its spellings: what serves it
CASES = [
    Case("POST", f"{_M}/infer", "infer", "infer", _INF),
    Case("POST", f"{_V}/infer", "infer", "infer", _INF),
    Case("POST", f"{_M}/generate", "generate", "generate", _INF),
    Case("POST", f"{_V}/generate", "generate", "generate", _INF),
    Case("POST", f"{_M}/generate_stream", "generate_stream", "generate", _INF),
    Case("POST", f"{_V}/generate_stream", "generate_stream", "generate", _INF),
    Case("GET", "/v2/health/live", "live", _HEALTH, "health"),
    Case("GET", "/v2/health/ready", "ready", _HEALTH, "health"),
    Case("GET", "/v2", "server_metadata", _META, "metadata"),
    Case("GET", "/v2/", "server_metadata", _META, "metadata"),
    Case("GET", f"{_M}/ready", "model_ready", _HEALTH, "health"),
    Case("GET", f"{_V}/ready", "model_ready", _HEALTH, "health"),
    Case("GET", f"{_M}/config", "model_config", _META, "model-config"),
    Case("GET", f"{_V}/config", "model_config", _META, "model-config"),
    Case("GET", "/v2/models/stats", "statistics", _SIDE, "statistics"),
    Case("GET", f"{_M}/stats", "statistics", _SIDE, "statistics"),
    Case("GET", f"{_V}/stats", "statistics", _SIDE, "statistics"),
    Case("POST", "/v2/repository/index", "repository_index", _SIDE, "model-repository"),
    Case("POST", "/v2/repository/models/simple/load", "repository_load", _SIDE, "model-repository"),
    Case(
        "POST",
        "/v2/repository/models/simple/unload",
        "repository_load",
        _SIDE,
        "model-repository",
    ),
    Case("GET", "/v2/trace/setting", "trace_settings", _SIDE, "trace"),
    Case("POST", "/v2/trace/setting", "trace_settings", _SIDE, "trace"),
    Case("GET", f"{_M}/trace/setting", "trace_settings", _SIDE, "trace"),
    Case("POST", f"{_M}/trace/setting", "trace_settings", _SIDE, "trace"),
    Case("GET", "/v2/logging", "log_settings", _SIDE, "logging"),
    Case("POST", "/v2/logging", "log_settings", _SIDE, "logging"),
    Case("GET", _M, "model_metadata", _META, "metadata"),
    Case("GET", _V, "model_metadata", _META, "metadata"),
    Case("GET", "/v2/models/stats/versions/1", "model_metadata", _META, "metadata"),
    *(
        Case(
            method,
            f"/v2/{kind}sharedmemory{region}/{what}",
            f"shm_{what}",
            _SIDE,
            "shared-memory",
        )
        for kind in ("system", "cuda")
        for region in ("", "/region/r0")
        for method, what in (("GET", "status"), ("POST", "register"), ("POST", "unregister"))
    ),
    Case("POST", "/infer", "mindie_infer", "mindie", _INF, deferred=True),
    Case("GET", "/v1/models", "openai_models", _META, "metadata"),
    Case("GET", "/v1/models/org/model-7b", "openai_model", _META, "metadata"),
    Case("POST", "/v1/completions", "openai_completions", "openai", _INF),
    Case("POST", "/v1/chat/completions", "openai_chat", "openai", _INF),
    Case("GET", "/openapi.json", "openapi_document", _META, None),
]

#: a known path with another method: 405, and what ``Allow`` says
NOT_ALLOWED = [
    ("GET", f"{_M}/infer", "POST"),
    ("PUT", f"{_V}/generate", "POST"),
    ("HEAD", "/v2/health/live", "GET"),
    ("POST", "/v2", "GET"),
    ("POST", "/v2/models/stats", "GET"),
    ("DELETE", "/v2/trace/setting", "GET, POST"),
    ("PUT", "/v2/logging", "GET, POST"),
    ("GET", "/v2/repository/models/simple/load", "POST"),
    ("POST", "/v2/cudasharedmemory/status", "GET"),
    ("GET", "/infer", "POST"),
    ("GET", "/v1/completions", "POST"),
    ("POST", "/v1/models", "GET"),
    ("POST", "/openapi.json", "GET"),
    ("POST", _M, "GET"),
]

#: paths no row matches, whatever the method: passed through to the backend
PASSED_THROUGH = [
    ("POST", f"{_M}/infer/"),
    ("POST", "/v2/models/simple/versions/x/infer"),
    ("POST", "/v2/models//infer"),
    ("GET", "/V2/health/live"),
    ("GET", "/v2//"),
    ("POST", "/v2/repository/models/simple/reload"),
    ("GET", "/v2/othersharedmemory/status"),
    ("GET", "/v2/systemsharedmemory/region/a/b/status"),
    ("POST", "/v2/models/simple/extension"),
    ("GET", "/openapi.yaml"),
    ("GET", "/"),
    ("PUT", "/anything/else"),
]


@dataclass
class _Request:
    method: str
    path: str


def _id(case: Case) -> str:
    return f"{case.method} {case.path}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_route(case: Case) -> None:
    handler, match, route = _FE.find(_Request(case.method, case.path))  # type: ignore[arg-type]
    assert match is not None
    assert handler is _FE.handlers[case.handler]
    assert route.operation == case.operation
    assert route.group == case.group
    assert route.deferred is case.deferred
    # the group the frontend checks as it admits the request (before the handler runs)
    assert route.check_first == (None if case.deferred else case.group)


def test_every_row_is_exercised_and_every_handler_bound() -> None:
    served = {_FE.find(_Request(c.method, c.path))[2] for c in CASES}  # type: ignore[arg-type]
    assert served == set(ROUTES)
    names = {name for row in ROUTES for name in row.methods.values()}
    assert names == set(_FE.handlers)


def test_the_hot_route_is_first() -> None:
    assert ROUTES[0].pattern.fullmatch(f"{_M}/infer")
    assert ROUTES[0].methods == {"POST": "infer"}


def test_every_group_is_a_known_one() -> None:
    for row in ROUTES:
        if row.group is None:  # the proxy's own document: never restricted
            assert row.template == "/openapi.json"
            assert row.check_first is None
            continue
        assert row.group in GROUPS, f"{row.template}: unknown group {row.group!r}"
    # and every group has a REST route
    assert {row.group for row in ROUTES} - {None} == GROUPS


@pytest.mark.parametrize(("method", "path"), PASSED_THROUGH)
def test_passed_through(method: str, path: str) -> None:
    handler, match, route = _FE.find(_Request(method, path))  # type: ignore[arg-type]
    assert handler is _FE.passed_through
    assert match is None
    assert route is PASSTHROUGH
    assert route.operation == "passthrough"
    assert route.check_first is None


@pytest.mark.parametrize(
    ("template", "pattern"),
    [
        ("/v2/health/live", "/v2/health/live"),
        ("/openapi.json", r"/openapi\.json"),
        ("/v2[/]", "/v2(?:/)?"),
        (
            "/v2/models/{model}[/versions/{version}]/infer",
            "/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?/infer",
        ),
        ("/v2/{kind}sharedmemory", "/v2/(?P<kind>system|cuda)sharedmemory"),
    ],
)
def test_templates(template: str, pattern: str) -> None:
    assert compile_template(template).pattern == pattern


@pytest.mark.parametrize("template", ["/v2/{nope}", "/v2[/x", "/v2]/x[", "/v2/{model", "/v2}"])
def test_malformed_templates(template: str) -> None:
    with pytest.raises(ValueError, match=r"template|parameter"):
        compile_template(template)


# --------------------------------------------------------------- through RestFrontend.dispatch


class RecordingAccess:
    """An AccessPolicy that restricts every group, allows every request and records the groups
    it was asked to check, in order."""

    def __init__(self) -> None:
        self.groups: list[str] = []

    def restricts(self, group: str) -> bool:
        return True

    def check(self, group: str, headers: Headers) -> None:
        self.groups.append(group)


class FakeRequest:
    """What the frontend reads of an HTTP request: a whole body, already arrived, from a unix
    socket (``client`` None)."""

    def __init__(
        self, method: str, path: str, body: bytes, access: RecordingAccess | None = None
    ) -> None:
        self.method = method
        self.path = path
        self.target = path.encode()
        self.query = b""
        self.headers = [(b"content-type", b"application/json")]
        self.content_length = len(body)
        self.chunked = False
        self.keep_alive = True
        self.client = None
        self.state = None  # (what a handler made of it: HttpRequest.state)
        self._body = body
        self._gone: asyncio.Future[None] | None = None
        self._access = access
        #: the groups checked when the body was first read (None: never read)
        self.checked_before_read: list[str] | None = None

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)

    def _reading(self) -> None:
        if self.checked_before_read is None and self._access is not None:
            self.checked_before_read = list(self._access.groups)

    def whole(self, limit: int) -> bytes | None:
        self._reading()
        return self._body if len(self._body) <= limit else None

    async def read(self, limit: int | None = None) -> bytearray:
        self._reading()
        return bytearray(self._body)

    async def chunks(self) -> Any:
        self._reading()
        yield self._body

    def gone(self) -> asyncio.Future[None]:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        return self._gone


class FakeResponse:
    """Keeps what the frontend writes."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()

    async def send(self, status: int, headers: list[tuple[bytes, bytes]], body: Any) -> None:
        self.status, self.headers = status, list(headers)
        for part in body if isinstance(body, list) else [body]:
            self.body += part

    async def start(self, status: int, headers: list[tuple[bytes, bytes]], length: Any) -> None:
        self.status, self.headers = status, list(headers)

    async def write(self, chunk: bytes) -> None:
        self.body += chunk

    async def end(self) -> None:
        return None

    def abort(self) -> None:
        return None


_BODIES = {
    "/infer": b'{"inputs": "hello", "parameters": {"max_new_tokens": 2}}',
}


async def _dispatch(
    method: str, path: str, access: RecordingAccess | None = None, metrics: bool = False
) -> tuple[FakeRequest, FakeResponse]:
    pipeline = Pipeline(BuiltinBackend(), 1 << 20)
    exported = Metrics(CollectorRegistry(), "builtin") if metrics else None
    frontend = RestFrontend(pipeline, 1 << 20, 1 << 20, exported, access=access or OPEN)
    body = _BODIES.get(path, b"{}" if method == "POST" else b"")
    request, response = FakeRequest(method, path, body, access), FakeResponse()
    await frontend.dispatch(request, response)  # type: ignore[arg-type]
    return request, response


@pytest.mark.parametrize("case", CASES, ids=_id)
async def test_the_request_is_checked_for_the_routes_group(case: Case) -> None:
    access = RecordingAccess()
    request, _ = await _dispatch(case.method, case.path, access)
    if case.group is None:
        assert access.groups == []
        return
    # once, for the row's group
    assert access.groups == [case.group]
    if case.deferred:
        # MindIE's order: the body is read (and validated) first, then the group is checked
        assert request.checked_before_read == []
    else:
        # checked by the frontend as it admits the request, before any body is read
        assert request.checked_before_read in (None, [case.group])


@pytest.mark.parametrize(("method", "path"), PASSED_THROUGH)
async def test_passed_through_request_is_checked_for_its_paths_group(
    method: str, path: str
) -> None:
    access = RecordingAccess()
    _, response = await _dispatch(method, path, access)
    assert access.groups == [passthrough_group(path)]
    assert response.status == 404  # the builtin backend passes nothing through


@pytest.mark.parametrize(("method", "path", "allow"), NOT_ALLOWED)
async def test_not_allowed(method: str, path: str, allow: str) -> None:
    access = RecordingAccess()
    _, response = await _dispatch(method, path, access)
    assert response.status == 405
    assert (b"allow", allow.encode()) in response.headers
    if path.startswith("/v1/"):  # the OpenAI routes answer in OpenAI's shape
        assert json.loads(response.body) == {
            "error": {
                "message": "Method Not Allowed",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    else:
        assert json.loads(response.body) == {"error": "Method Not Allowed"}
    assert access.groups == []  # no group is checked for a method the route lacks


@pytest.mark.parametrize(
    ("method", "status", "allow"),
    [("GET", 200, None), ("HEAD", 200, None), ("POST", 405, "GET, HEAD")],
)
async def test_metrics_is_answered_before_the_table(
    method: str, status: int, allow: str | None
) -> None:
    assert not any(row.pattern.fullmatch(METRICS.template) for row in ROUTES)
    access = RecordingAccess()
    _, response = await _dispatch(method, METRICS.template, access, metrics=True)
    assert response.status == status
    assert access.groups == []
    if allow is None:
        assert dict(response.headers)[b"content-type"].startswith(b"text/plain")
    else:
        assert (b"allow", allow.encode()) in response.headers


#: the groups the words of a passed-through path tell apart (``passthrough_group``): a spelling
#: of a route of one of them that no row matches must fall in the route's own group
_FENCED = GROUPS - {"health", "metadata", "inference"}


def _spellings(path: str) -> list[str]:
    head, _, last = path.rpartition("/")
    return [
        path + "/",
        path.replace("/v2/", "/v2//", 1),
        path.upper(),
        f"{head}/%{ord(last[0]):02X}{last[1:]}",
        f"{head}/%{ord(last[0]):02x}{last[1:]}?x=1",
    ]


@pytest.mark.parametrize("case", [c for c in CASES if c.group in _FENCED], ids=_id)
def test_no_spelling_of_a_restricted_route_passes_as_another_group(case: Case) -> None:
    for path in _spellings(case.path):
        if _FE.find(_Request(case.method, path.split("?")[0]))[1] is None:  # type: ignore[arg-type]
            assert passthrough_group(path) == case.group, path


def test_routes_module_is_the_table() -> None:
    # the REST frontend binds the table, in its order, and nothing else
    assert [row for _, _, row in _FE.routing] == list(routes.ROUTES)


def test_each_row_names_the_shape_of_its_errors() -> None:
    shapes = {row.template: row.errors for row in ROUTES}
    assert shapes["/infer"] == "mindie"
    assert {shapes[t] for t in shapes if t.startswith("/v1/")} == {"openai"}
    assert {shapes[t] for t in shapes if not t.startswith(("/v1/", "/infer"))} == {"v2"}
    assert {row.frontend for row in ROUTES if row.errors == "openai"} == {"openai"}
