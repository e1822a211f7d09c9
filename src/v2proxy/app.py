"""The composition root: the only place where the parts are wired together.

Builds the backend named by the settings, the pipeline and the frontends, runs them on uvloop
(or plain asyncio) and shuts down gracefully on SIGTERM/SIGINT: stop accepting, let requests in
flight finish, close the backend's connections.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.rest import RestBackend
from v2proxy.config import Settings
from v2proxy.frontends.rest import RestFrontend
from v2proxy.pipeline import Backend, Pipeline

log = logging.getLogger("v2proxy")

SHUTDOWN_GRACE_S = 30.0


def build_backend(settings: Settings) -> Backend:
    target = settings.backend
    if target.kind == "builtin":
        return BuiltinBackend(server_name=settings.server_name)
    return RestBackend(
        target.url,
        encoding=settings.backend_encoding,
        timeout=settings.backend_timeout,
        connect_timeout=settings.backend_connect_timeout,
        connections=settings.backend_connections,
    )


def build_app(settings: Settings, backend: Backend) -> web.Application:
    """The aiohttp application serving the v2 REST API in front of ``backend``."""
    pipeline = Pipeline(backend, settings.max_input_size)
    frontend = RestFrontend(pipeline, settings.max_input_size, settings.max_body_size)
    app = frontend.app()

    async def lifecycle(_app: web.Application):  # type: ignore[no-untyped-def]
        await backend.start()
        yield
        await backend.close()

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve(settings: Settings, on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    backend = build_backend(settings)
    app = build_app(settings, backend)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.http_port, backlog=2048)
    await site.start()
    port = settings.http_port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        port = server.sockets[0].getsockname()[1]
    log.info(
        "v2proxy listening on http://%s:%d (backend: %s)",
        settings.host,
        port,
        settings.backend.url or settings.backend.kind,
    )
    if on_ready is not None:
        on_ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("v2proxy shutting down")
        await runner.cleanup()


def run(settings: Settings) -> None:
    """Run ``serve`` on the configured event loop."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.event_loop == "uvloop":
        import uvloop

        uvloop.run(serve(settings))
    else:
        asyncio.run(serve(settings))
