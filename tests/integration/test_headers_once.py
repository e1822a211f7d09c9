"""A request's headers are filtered once, where they come in, by the one table
(``v2proxy.core.headers``): on every REST route and every gRPC RPC at most one filtering, and
exactly one on those whose headers go on to a backend; a backend only adds its own framing. The
backend sees the client's end-to-end headers once each, and none of the hop-by-hop ones, on
every way a request is sent (relayed in the quick lane, transcoded in it, the general path, a
side operation, passed through).

Filtering is counted by wrapping, in every loaded v2proxy module, each name bound to one of the
edge filters (the REST /infer pass, the generic one, the gRPC metadata one)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from tests.integration.conftest import Factory, ProxyClient, settings
from tests.integration.test_access_once import (
    CLOSED,
    KEY,
    REST,
    SECRET,
    UNARY,
    Counting,
    _grpc,
    _infer_request,
    _pipeline,
    unary,
)
from tests.integration.test_quick_lane import lane_proxy, post, taken, warm
from tests.integration.test_rest_backend import url_of
from tests.integration.test_rest_errors import simple_json
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.core import headers as table
from v2proxy.frontends import rest_infer
from v2proxy.frontends.rest import RestFrontend

#: the REST requests whose headers go on to a backend (the others answer from the proxy)
FORWARDING = {
    ("POST", "/v2/models/simple/infer"),
    ("POST", "/v2/models/llm/generate"),
    ("POST", "/v2/models/llm/generate_stream"),
    ("GET", "/v2/models/stats"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/simple/load"),
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/models/simple/trace/setting"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/logging"),
    ("POST", "/infer"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v2/models/simple/extension"),
}
#: the RPCs whose metadata goes on to a backend
FORWARDING_RPCS = {
    "ModelInfer",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "TraceSetting",
    "LogSettings",
}
#: (infer_headers calls header_pass, which the quick lane calls itself: a nested call counts once)
EDGES = (table.forwarded, table.call_headers, rest_infer.infer_headers, rest_infer.header_pass)


class Filterings:
    """How many times the edge filters ran (each filtering counted once, the filter calling
    another included)."""

    def __init__(self) -> None:
        self.count = 0
        self.depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:
                self.count += 1
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return counted

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@pytest.fixture
def filterings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Filterings]:
    counter = Filterings()
    wrapped = {id(fn): counter.wrap(fn) for fn in EDGES}
    for name, module in list(sys.modules.items()):
        if not name.startswith("v2proxy") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in wrapped and any(value is fn for fn in EDGES):
                monkeypatch.setattr(module, attr, wrapped[id(value)])
    yield counter


async def test_each_rest_request_is_filtered_at_most_once(
    make_client: Factory, filterings: Filterings
) -> None:
    s = settings()
    frontend = RestFrontend(_pipeline(), s.max_input_size, s.max_body_size, access=CLOSED)
    client: ProxyClient = await make_client(frontend)
    for (_template, method), (path, body) in REST.items():
        data = None if body is None else json.dumps(body).encode()
        async with client.request(method, path, data=data, headers={KEY: SECRET}) as resp:
            await resp.read()
        want = 1 if (method, path) in FORWARDING else 0
        assert filterings.take() == want, (method, path)


async def test_each_rpc_is_filtered_at_most_once(filterings: Filterings) -> None:
    counting = Counting(CLOSED)
    async with _grpc(counting) as channel:
        for name, request in UNARY.items():
            await unary(channel, name, request, ((KEY, SECRET), ("x-trace", "t")))
            assert filterings.take() == (1 if name in FORWARDING_RPCS else 0), name
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(iter([_infer_request()] * 3), metadata=((KEY, SECRET),), timeout=10)
        answers = [a async for a in stream]
        assert [a.error_message for a in answers] == [""] * 3
        assert filterings.take() == 1  # once per stream, whatever it carries


#: what a client sends beside its own end-to-end headers: hop-by-hop and framing fields
HOP = {"Connection": "keep-alive", "Keep-Alive": "timeout=5", "TE": "trailers"}
_OUT = [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}]
#: the binary answer of a backend that takes binary tensors (OUTPUT0: 16 INT32 in the section)
_HEAD = json.dumps(
    {
        "model_name": "simple",
        "outputs": [{**_OUT[0], "parameters": {"binary_data_size": 64}}],
    }
).encode()


async def _recording_backend(make_client: Factory) -> tuple[str, list[CIMultiDictProxy[str]]]:
    """A model server that is not v2proxy (so that only the proxy's filtering is counted): it
    records each request's headers and answers /infer in the form it was asked in."""
    seen: list[CIMultiDictProxy[str]] = []

    async def infer(request: web.Request) -> web.Response:
        seen.append(request.headers)
        await request.read()
        if "Inference-Header-Content-Length" in request.headers:
            return web.Response(
                body=_HEAD + bytes(64),
                headers={
                    "Content-Type": "application/octet-stream",
                    "Inference-Header-Content-Length": str(len(_HEAD)),
                },
            )
        outputs = [{**_OUT[0], "data": [0] * 16}]
        return web.json_response({"model_name": "simple", "outputs": outputs})

    async def other(request: web.Request) -> web.Response:
        seen.append(request.headers)
        await request.read()
        return web.json_response({"model_stats": []})

    app = web.Application()
    app.router.add_post("/v2/models/simple/infer", infer)
    app.router.add_get("/v2/models/simple/stats", other)
    app.router.add_post("/v2/models/simple/extension", other)

    async def metadata(request: web.Request) -> web.Response:  # the proxy's own look-up
        return web.json_response({"name": "recorder", "version": "1", "extensions": []})

    app.router.add_get("/v2", metadata)
    return url_of(await make_client(app)), seen


def _once(headers: CIMultiDictProxy[str]) -> None:
    """The backend saw the client's end-to-end headers once each, and no hop-by-hop one."""
    assert headers.getall("x-trace") == ["t1"]
    assert headers.getall("x-request-id") == ["r1"]
    assert len(headers.getall("Content-Type", [])) <= 1
    assert len(headers.getall("Accept-Encoding", [])) <= 1
    for name in ("Keep-Alive", "TE", "Proxy-Authorization"):
        assert name not in headers, name


@pytest.mark.from_source
@pytest.mark.parametrize("encoding", ["auto", "binary"])
async def test_the_backend_sees_each_header_once_on_every_way(
    make_client: Factory, filterings: Filterings, encoding: str
) -> None:
    url, seen = await _recording_backend(make_client)
    proxy = await lane_proxy(make_client, url, backend_encoding=encoding)
    await warm(proxy)
    filterings.take()
    sent = {**HOP, "x-trace": "t1", "x-request-id": "r1", "Proxy-Authorization": "p"}
    before = taken(proxy)
    resp = await post(proxy, simple_json(), **{k.replace("-", "_"): v for k, v in sent.items()})
    assert resp.status == 200, await resp.text()
    assert taken(proxy) == before + 1  # the quick lane: relayed, or transcoded
    assert filterings.take() == 1
    _once(seen[-1])
    if encoding == "binary":  # transcoded: the backend's own framing, once
        assert seen[-1].getall("Content-Type") == ["application/octet-stream"]
    # the general path (compression asked), a side operation, a passed-through request
    for method, path, extra in (
        ("POST", "/v2/models/simple/infer", {"Accept-Encoding": "gzip"}),
        ("GET", "/v2/models/simple/stats", {}),
        ("POST", "/v2/models/simple/extension", {"Content-Type": "text/x-mine"}),
    ):
        n = len(seen)
        data = simple_json() if method == "POST" else None
        async with proxy.request(method, path, data=data, headers={**sent, **extra}) as resp:
            assert resp.status == 200, (path, await resp.text())
        assert filterings.take() == 1, path
        assert len(seen) == n + 1, path
        _once(seen[-1])
    # passed through: the client's Content-Type goes with its body, once
    assert seen[-1].getall("Content-Type") == ["text/x-mine"]


@pytest.mark.from_source
@pytest.mark.parametrize("way", ["lane", "general"])
async def test_an_infer_request_reads_its_id_and_wire_form_once(
    make_client: Factory,
    filterings: Filterings,
    monkeypatch: pytest.MonkeyPatch,
    way: str,
) -> None:
    """The request id and the Inference-Header-Content-Length of an /infer request are found by
    the pass that filters its headers, once, and never looked up again (the quick lane's pass
    is kept for the general path when the lane declines), whatever way it then goes: relayed
    in the lane, or through the general path (compression asked)."""
    from v2proxy.http.request import HttpRequest

    url, seen = await _recording_backend(make_client)
    proxy = await lane_proxy(make_client, url)
    await warm(proxy)
    filterings.take()
    looked_up: list[bytes] = []
    header = HttpRequest.header

    def counted(self: HttpRequest, name: bytes, *args: Any) -> Any:
        looked_up.append(name)
        return header(self, name, *args)

    monkeypatch.setattr(HttpRequest, "header", counted)
    extra = {"Accept-Encoding": "gzip"} if way == "general" else {}
    before = taken(proxy)
    async with proxy.post(
        "/v2/models/simple/infer",
        data=simple_json(),
        headers={"x-request-id": "r1", "x-trace": "t1", **extra},
        skip_auto_headers=["Accept-Encoding"],
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers.getall("x-request-id") == ["r1"]
    assert taken(proxy) == before + (1 if way == "lane" else 0)
    assert filterings.take() == 1
    assert b"x-request-id" not in looked_up
    assert b"inference-header-content-length" not in looked_up
    _once(seen[-1])


def test_one_value_for_http_and_grpc() -> None:
    """The edge's one value: bytes pairs for HTTP; as gRPC metadata, ready when they came as
    gRPC metadata (the same list, no conversion), made from an HTTP request's pairs otherwise,
    and a value gRPC cannot carry refused by name."""
    came = [("x-trace", "t1"), ("user-agent", "grpc-python"), ("te", "trailers"), ("k-bin", "x")]
    value = table.call_headers(came)
    assert value == [(b"x-trace", b"t1")]
    assert table.metadata(value) is value.grpc
    assert value.grpc == [("x-trace", "t1")]
    rest = table.forwarded([(b"x-trace", b"t1"), (b"connection", b"close")], table.WRITTEN)
    assert rest == [(b"x-trace", b"t1")]
    assert table.metadata(rest) == [("x-trace", "t1")]
    from v2proxy.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="'x-name'"):
        table.metadata(table.forwarded([(b"x-name", "é".encode())], table.WRITTEN))
