"""The composition root: the only place where the parts are wired together."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable

import grpc

from v2proxy.app_core import build_metrics, build_pipeline, compose_backend, raise_fd_limit
from v2proxy.codecs.openai import RequestLimits
from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import ProxyError
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Backend
from v2proxy.frontends.grpc import GrpcFrontend
from v2proxy.frontends.mindie import MindieFrontend
from v2proxy.frontends.openai import OpenAIFrontend
from v2proxy.frontends.rest import RestFrontend
from v2proxy.http.server import HttpServer, ServerLimits
from v2proxy.ops import memory
from v2proxy.ops.config import Settings
from v2proxy.ops.listen_check import ListenError, cannot_listen, check_ports
from v2proxy.ops.metrics_export import (
    AnyMetrics,
    enable_multiprocess,
    process_gone,
)
from v2proxy.ops.request_log import setup_logging
from v2proxy.ops.tls import (
    TlsFileError,
    server_context,
    server_credentials,
)
from v2proxy.shm.registry import Registry
from v2proxy.shm.shared import SharedRegistry

log = logging.getLogger("v2proxy")


def build_rest(
    settings: Settings,
    pipeline: Pipeline,
    metrics: AnyMetrics | None = None,
    gate: AdmissionGate | None = None,
) -> RestFrontend:
    """The REST frontend on ``pipeline``; ``gate``: the process's admission gate (default: one
    of its own)."""
    if metrics is None:
        metrics = build_metrics(settings)
    return RestFrontend(
        pipeline,
        settings.max_input_size,
        settings.max_body_size,
        metrics,
        settings.access_log,
        mindie=settings.mindie,
        gate=gate or AdmissionGate(settings.max_concurrency),
        openai=settings.openai,
        openai_limits=RequestLimits(
            settings.max_chat_messages, settings.max_stops, settings.max_stop_length
        ),
        access=settings.restricted,
    )


def build_http_server(settings: Settings, frontend: RestFrontend) -> HttpServer:
    """The HTTP/1.1 server for the REST frontend (not yet listening)."""
    limits = ServerLimits(
        header_timeout=settings.client_header_timeout,
        keepalive_timeout=settings.client_idle_timeout,
        body_timeout=settings.client_body_timeout,
        write_timeout=settings.client_body_timeout,
        max_body_size=settings.max_body_size,
    )
    tls = server_context(settings.tls) if settings.tls is not None else None
    return HttpServer(frontend.dispatch, limits, ssl_context=tls, quick=frontend.quick)


def build_grpc_server(
    settings: Settings,
    pipeline: Pipeline,
    reuse_port: bool = False,
    metrics: AnyMetrics | None = None,
    gate: AdmissionGate | None = None,
) -> grpc.aio.Server:
    """The grpc.aio server for the v2 gRPC API (not yet bound to a port)."""
    size = settings.grpc_max_message_size
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            # gRPC's default SO_REUSEPORT would let a second server silently share the port
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
    )
    gate = gate or AdmissionGate(settings.max_concurrency)
    frontend = GrpcFrontend(
        pipeline,
        metrics,
        settings.access_log,
        gate,
        stream_in_flight=settings.max_stream_in_flight,
        health_watches=settings.max_health_watches,
        access=settings.restricted,
    )
    server.add_generic_rpc_handlers(frontend.handlers())
    return server


class StartError(Exception):
    """A listener could not be started (port in use, bad address)."""


async def serve(
    settings: Settings,
    on_ready: Callable[[int, int], None] | None = None,
    reuse_port: bool = False,
    shm_folder: str | None = None,
    env_names: bool = True,
) -> None:
    """Serve REST and gRPC until SIGTERM or SIGINT; requests in flight are let finish."""
    metrics = build_metrics(settings)
    knowledge = BackendKnowledge()  # shared, so one invalidation reaches every part
    backend = compose_backend(settings, metrics, knowledge)
    await backend.start()
    pipeline = build_pipeline(settings, backend, metrics, shm_folder, knowledge=knowledge)
    gate = AdmissionGate(settings.max_concurrency)  # REST and gRPC together
    rest = build_rest(settings, pipeline, metrics, gate)
    http_server = build_http_server(settings, rest)
    grpc_server = build_grpc_server(settings, pipeline, reuse_port, metrics, gate)
    try:
        http_port = await _listen_http(settings, http_server, reuse_port, env_names)
        grpc_port = _listen_grpc(settings, grpc_server, env_names)
        await grpc_server.start()
    except (OSError, RuntimeError, StartError) as exc:
        await http_server.close(0)
        await backend.close()
        if isinstance(exc, StartError):
            raise
        raise StartError(f"cannot start listening: {exc}") from None
    log.info(
        "v2proxy listening on %s://%s:%d and %s %s:%d (backend: %s)",
        "http" if settings.tls is None else "https",
        settings.host,
        http_port,
        "grpc" if settings.tls is None else "grpc over TLS",
        settings.host,
        grpc_port,
        settings.backend.display,
    )
    if on_ready is not None:
        on_ready(http_port, grpc_port)
    metrics.start()
    probe = asyncio.create_task(_probe_backend(backend, settings, rest.mindie, rest.openai))
    sweeper = asyncio.create_task(_sweep_shm(pipeline))
    releaser = _release_memory(settings, gate)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info(
            "v2proxy draining: not ready, letting requests in flight finish (up to %.0f s)",
            settings.drain_timeout,
        )
        pipeline.draining = True
        gate.closing = True
        await asyncio.gather(
            grpc_server.stop(settings.drain_timeout), http_server.close(settings.drain_timeout)
        )
        probe.cancel()
        sweeper.cancel()
        if releaser is not None:
            releaser.cancel()
        await backend.close()
        if isinstance(pipeline.shm, Registry | SharedRegistry):
            pipeline.shm.close()
        metrics.stop()
        log.info("v2proxy stopped")


async def _listen_http(
    settings: Settings, server: HttpServer, reuse_port: bool, env_names: bool
) -> int:
    """Start the HTTP listener; a failure is a StartError."""
    try:
        return await server.start(
            settings.host, settings.http_port, reuse_port=reuse_port, backlog=2048
        )
    except OSError as exc:
        line = cannot_listen(
            "HTTP", settings.host, settings.http_port, "--http-port", exc, env_names
        )
        raise StartError(line) from None


def _listen_grpc(settings: Settings, server: grpc.aio.Server, env_names: bool) -> int:
    """Bind the gRPC port; a failure is a StartError (grpcio gives no cause: check_ports found
    it before)."""
    address = f"[{settings.host}]" if ":" in settings.host else settings.host
    target = f"{address}:{settings.grpc_port}"
    try:
        if settings.tls is None:
            port = server.add_insecure_port(target)
        else:
            port = server.add_secure_port(target, server_credentials(settings.tls))
    except RuntimeError:  # grpcio >= 1.5x raises where older ones returned 0
        port = 0
    if port == 0:
        line = cannot_listen(
            "gRPC", settings.host, settings.grpc_port, "--grpc-port", None, env_names
        )
        raise StartError(line)
    return port


def _release_memory(settings: Settings, gate: AdmissionGate) -> asyncio.Task[None] | None:
    """``--reuse-large-buffers``: malloc keeps large blocks; the task returned gives the memory
    back when the process is idle."""
    if not settings.reuse_large_buffers:
        return None
    releaser = memory.reuse_large_buffers(lambda: gate.arrived)
    if releaser is None:
        return None

    async def tick() -> None:
        while True:
            await asyncio.sleep(memory.RELEASE_EVERY_S)
            releaser.tick()

    return asyncio.create_task(tick())


async def _sweep_shm(pipeline: Pipeline) -> None:
    """Every second, unmap the shared regions other workers unregistered (``--workers N``)."""
    shm = pipeline.shm
    if not isinstance(shm, SharedRegistry):
        return
    while True:
        await asyncio.sleep(1.0)
        shm.sweep()


async def _probe_backend(
    backend: Backend,
    settings: Settings,
    mindie: MindieFrontend | None = None,
    openai: OpenAIFrontend | None = None,
) -> None:
    """Warn once at start-up when the backend cannot be reached (serving goes on); else look up
    the models of the ``mindie:`` and ``openai:`` sections."""
    try:
        async with asyncio.timeout(settings.backend_connect_timeout + 1):
            await backend.server_ready()
    except ProxyError as exc:
        cause = exc.message
    except TimeoutError:
        cause = "no answer to the readiness check"
    else:
        if mindie is not None and settings.mindie is not None:
            await mindie.check()
        if openai is not None and settings.openai is not None:
            await openai.check()
        return
    fields = {"backend": settings.backend.display, "cause": cause}
    log.warning("backend unreachable at start-up", extra={"request": fields})


def _run_one(
    settings: Settings, reuse_port: bool, shm_folder: str | None = None, env_names: bool = True
) -> None:
    main = serve(settings, reuse_port=reuse_port, shm_folder=shm_folder, env_names=env_names)
    try:
        if settings.event_loop == "uvloop":
            import uvloop

            uvloop.run(main)
        else:
            asyncio.run(main)
    except (StartError, TlsFileError) as exc:  # TLS: a file changed since the start-up check
        log.error("%s", exc)
        raise SystemExit(1) from None


def run(settings: Settings, env_names: bool = True) -> None:
    """Run ``serve`` on the configured event loop, in ``settings.workers`` processes."""
    setup_logging(settings.log_format, settings.log_level, settings.access_log)
    raise_fd_limit()
    ports = (
        ("HTTP", "--http-port", settings.http_port),
        ("gRPC", "--grpc-port", settings.grpc_port),
    )
    try:
        check_ports(settings.host, ports, env_names)
    except ListenError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None
    if settings.workers == 1:
        _run_one(settings, reuse_port=False, env_names=env_names)
    else:
        _supervise(settings, env_names)


def _supervise(settings: Settings, env_names: bool = True) -> None:
    """Fork the workers (before any event loop or gRPC object exists, as gRPC requires), respawn
    any that dies, and stop them all on SIGTERM/SIGINT."""
    folder = tempfile.mkdtemp(prefix="v2proxy-metrics-")
    shm_folder = tempfile.mkdtemp(prefix="v2proxy-shm-")
    enable_multiprocess(folder)
    try:
        _supervise_workers(settings, folder, shm_folder, env_names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(shm_folder, ignore_errors=True)


def _supervise_workers(settings: Settings, folder: str, shm_folder: str, env_names: bool) -> None:
    """Exits with status 1 (after stopping the others) when a worker could not start."""
    ctx = multiprocessing.get_context("fork")
    stopping = failed = False

    def start(i: int) -> multiprocessing.process.BaseProcess:
        proc = ctx.Process(
            target=_run_one,
            args=(settings, True, shm_folder, env_names),
            name=f"v2proxy-worker-{i}",
        )
        proc.start()
        return proc

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    workers = [start(i) for i in range(settings.workers)]
    log.info("v2proxy supervising %d workers", len(workers))
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(workers):
            if not proc.is_alive() and not stopping:
                if proc.exitcode == 1:  # could not listen: respawning would not help
                    log.error("a worker could not start: stopping the others")
                    stopping = failed = True
                    break
                log.warning("worker %s exited with %s; starting a new one", proc.pid, proc.exitcode)
                if proc.pid is not None:
                    process_gone(proc.pid, folder)
                workers[i] = start(i)
    for proc in workers:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + settings.drain_timeout + 5
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
    if failed:
        raise SystemExit(1)
