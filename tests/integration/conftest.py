"""In-process fixtures: the REST frontend on v2proxy's own HTTP server (as ``v2proxy serve`` runs
it) on a real loopback port, in front of the builtin backend or of another in-process v2 server
reached over real loopback HTTP; fake backends are aiohttp applications."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from yarl import URL

from v2proxy.app import build_rest
from v2proxy.app_core import build_backend, build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.frontends.rest import RestFrontend
from v2proxy.http.request import HttpRequest, ServerLimits
from v2proxy.http.response import HttpResponse
from v2proxy.http.server import HttpServer
from v2proxy.ops.config import Settings, load_settings


class ProxyClient:
    """An aiohttp client session bound to a REST frontend served on a loopback port (the same
    calls as aiohttp's TestClient: ``get``, ``post``, ``request``, ``make_url``)."""

    def __init__(self, frontend: RestFrontend, limits: ServerLimits | None = None) -> None:
        self.frontend = frontend

        async def handler(request: HttpRequest, response: HttpResponse) -> None:
            # looked up per request, so that a test may wrap ``frontend.dispatch``
            await frontend.dispatch(request, response)

        # the quick lane, as ``v2proxy serve`` has it (app.build_http_server)
        self.server = HttpServer(handler, limits or ServerLimits(), quick=frontend.quick)
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await self.frontend.pipeline.backend.start()
        await self.server.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.server.close(1.0)
        await self.frontend.pipeline.backend.close()

    @property
    def port(self) -> int:
        return self.server.port

    def make_url(self, path: str) -> URL:
        return URL(f"http://127.0.0.1:{self.port}{path}")

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self.session is not None
        return self.session.request(method, self.make_url(path), **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)


Client = TestClient[Any, Any] | ProxyClient
Factory = Callable[..., Awaitable[Any]]


@pytest.fixture
async def make_client() -> AsyncIterator[Factory]:
    """make_client(frontend or aiohttp app, limits=ServerLimits(...)) -> a client on a real
    loopback port; all closed at the end."""
    clients: list[Client] = []

    async def factory(app: web.Application | RestFrontend, **options: Any) -> Any:
        if isinstance(app, RestFrontend):
            proxy = ProxyClient(app, options.get("limits"))
            await proxy.start()
            clients.append(proxy)
            return proxy
        c: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await c.start_server()
        clients.append(c)
        return c

    yield factory
    for c in reversed(clients):
        await c.close()


def settings(**overrides: Any) -> Settings:
    return load_settings(overrides, None, env={})


@pytest.fixture
async def builtin(make_client: Factory) -> ProxyClient:
    """v2proxy in front of the builtin models."""
    return await make_client(build_rest(s := settings(), build_pipeline(s, BuiltinBackend())))


@dataclass
class Seen:
    """A request as the recording reference server saw it."""

    method: str
    path: str
    headers: CIMultiDict[str]


@pytest.fixture
async def recorded(make_client: Factory) -> AsyncIterator[tuple[ProxyClient, list[Seen]]]:
    """A reference server (builtin models over REST) that records every request it gets."""
    seen: list[Seen] = []
    frontend = build_rest(
        s := settings(), build_pipeline(s, BuiltinBackend(server_name="reference"))
    )
    dispatch = frontend.dispatch

    async def record(request: HttpRequest, response: HttpResponse) -> None:
        headers = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers
        )
        seen.append(Seen(request.method, request.path, headers))
        await dispatch(request, response)

    frontend.dispatch = record  # type: ignore[method-assign]
    yield await make_client(frontend), seen


async def proxy_to(
    make_client: Factory, url: str, server_options: dict[str, Any] | None = None, **overrides: Any
) -> ProxyClient:
    s = settings(backend=url, **overrides)
    return await make_client(
        build_rest(s, build_pipeline(s, build_backend(s))), **(server_options or {})
    )


@contextlib.asynccontextmanager
async def stuck_grpc_backend(method: str, request: Any, response: Any) -> AsyncIterator[str]:
    """A gRPC model server on loopback whose ``method`` (e.g. "ModelInfer") answers only after
    10 s: a stuck backend. Yields its ``grpc://`` URL; ``request``/``response``: the message
    classes of that method."""

    async def stuck(_request: Any, _context: Any) -> Any:
        await asyncio.sleep(10)
        return response()

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        stuck,
        request_deserializer=request.FromString,
        response_serializer=response.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {method: handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def grpc_frontend(s: Settings, pipeline: Any) -> AsyncIterator[grpc.aio.Channel]:
    """v2proxy's gRPC frontend on a loopback port in this process, and a channel to it."""
    from v2proxy.app import build_grpc_server

    server = build_grpc_server(s, pipeline)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)
