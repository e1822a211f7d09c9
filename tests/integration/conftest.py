"""In-process fixtures: the REST frontend on an aiohttp test server, in front of the builtin
backend or of another in-process v2 server reached over real loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from v2proxy.app import build_app, build_backend
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.config import Settings, load_settings

Factory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def make_client() -> AsyncIterator[Factory]:
    """make_client(app) -> a TestClient on a real loopback port; all closed at the end."""
    clients: list[TestClient[Any, Any]] = []

    async def factory(app: web.Application) -> TestClient[Any, Any]:
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
async def builtin(make_client: Factory) -> TestClient[Any, Any]:
    """v2proxy in front of the builtin models."""
    return await make_client(build_app(settings(), BuiltinBackend()))


@pytest.fixture
async def recorded(make_client: Factory) -> AsyncIterator[tuple[TestClient[Any, Any], list[Any]]]:
    """A reference server (builtin models over REST) that records every request it gets."""
    seen: list[web.Request] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request)
        return await handler(request)

    app = build_app(settings(), BuiltinBackend(server_name="reference"))
    app.middlewares.append(record)
    yield await make_client(app), seen


async def proxy_to(make_client: Factory, url: str, **overrides: Any) -> TestClient[Any, Any]:
    s = settings(backend=url, **overrides)
    return await make_client(build_app(s, build_backend(s)))
