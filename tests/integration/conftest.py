"""In-process fixtures: the REST frontend on an aiohttp test server, in front of the builtin
backend or of another in-process v2 server reached over real loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer

from v2proxy.app import build_backend, build_rest
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.config import Settings, load_settings
from v2proxy.frontends.rest import RestFrontend

Factory = Callable[..., Awaitable[TestClient[Any, Any]]]


class FrontendServer(BaseTestServer):
    """The REST frontend on the same low-level aiohttp server as ``v2proxy serve`` runs, with
    its backend started and closed around it."""

    def __init__(
        self, frontend: RestFrontend, server_options: dict[str, Any], **kwargs: Any
    ) -> None:
        self.frontend = frontend
        self.server_options = server_options
        super().__init__(**kwargs)

    async def _make_runner(self, **kwargs: Any) -> web.ServerRunner:
        await self.frontend.pipeline.backend.start()
        return web.ServerRunner(self.frontend.server(**self.server_options))

    async def close(self) -> None:
        await super().close()
        await self.frontend.pipeline.backend.close()


@pytest.fixture
async def make_client() -> AsyncIterator[Factory]:
    """make_client(frontend or aiohttp app, **options of aiohttp's low-level server) -> a
    TestClient on a real loopback port; all closed at the end."""
    clients: list[TestClient[Any, Any]] = []

    async def factory(app: web.Application | RestFrontend, **options: Any) -> TestClient[Any, Any]:
        server: BaseTestServer = (
            FrontendServer(app, options, host="127.0.0.1")
            if isinstance(app, RestFrontend)
            else TestServer(app, host="127.0.0.1")
        )
        c: TestClient[Any, Any] = TestClient(server)
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
    return await make_client(build_rest(settings(), BuiltinBackend()))


@pytest.fixture
async def recorded(make_client: Factory) -> AsyncIterator[tuple[TestClient[Any, Any], list[Any]]]:
    """A reference server (builtin models over REST) that records every request it gets."""
    seen: list[web.BaseRequest] = []
    frontend = build_rest(settings(), BuiltinBackend(server_name="reference"))
    dispatch = frontend.dispatch

    async def record(request: web.BaseRequest) -> web.StreamResponse:
        seen.append(request)
        return await dispatch(request)

    frontend.dispatch = record  # type: ignore[method-assign]
    yield await make_client(frontend), seen


async def proxy_to(
    make_client: Factory, url: str, server_options: dict[str, Any] | None = None, **overrides: Any
) -> TestClient[Any, Any]:
    s = settings(backend=url, **overrides)
    return await make_client(build_rest(s, build_backend(s)), **(server_options or {}))
