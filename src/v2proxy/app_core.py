"""Building the core from the settings (part of the composition root, :mod:`v2proxy.app`)."""

from __future__ import annotations

import logging
import os
import resource
from typing import Literal

from prometheus_client import CollectorRegistry

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.grpc import GrpcBackend
from v2proxy.backends.metered import metered
from v2proxy.backends.mindie import MindieBackend
from v2proxy.backends.rest import RestBackend
from v2proxy.backends.staging import Stager
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Backend
from v2proxy.ops.config import Settings
from v2proxy.ops.metrics import (
    BACKEND_RETRIES,
    SHM_BYTES,
    SHM_REGIONS,
    SHM_STAGED_BYTES,
    SHM_STAGING,
    SHM_TENSORS,
)
from v2proxy.ops.metrics_export import AnyMetrics, Metrics, NullMetrics
from v2proxy.ops.recorders import EndpointRecorder, TokenRecorder
from v2proxy.ops.tls import channel_credentials, client_context
from v2proxy.shm.cuda import CudaAdapter, default_adapter
from v2proxy.shm.registry import Registry
from v2proxy.shm.shared import SharedRegistry

log = logging.getLogger(__name__)


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (where allowed); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def region_limit(configured: int) -> int:
    """``--max-shm-regions``, kept to a quarter of the open-file limit (each region holds a
    descriptor; the rest are left to connections and the backend), with a warning when cut."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(1, soft // 4)
    if configured > room:
        log.warning(
            "max_shm_regions %d is more than a quarter of the open-file limit (%d): %d used",
            configured,
            soft,
            room,
        )
        return room
    return configured


def build_backend(
    settings: Settings,
    metrics: AnyMetrics | None = None,
    knowledge: BackendKnowledge | None = None,
) -> Backend:
    """The backend the settings name; ``knowledge``: what is known of it, shared with the
    pipeline (:func:`build_pipeline`) and bound here to the backend itself (its probes are the
    proxy's own, not timed as the clients' calls by a decorator)."""
    backend = _backend(settings, metrics, knowledge)
    if knowledge is not None and knowledge.source is None:
        knowledge.bind(backend)
    return backend


def compose_backend(
    settings: Settings, metrics: AnyMetrics, knowledge: BackendKnowledge | None = None
) -> Backend:
    """The backend the settings name wrapped in its decorators, as the pipeline calls it: timed
    for the metrics when they are on (:class:`~v2proxy.backends.metered.MeteredBackend`)."""
    return metered(build_backend(settings, metrics, knowledge), metrics)


def _backend(
    settings: Settings, metrics: AnyMetrics | None, knowledge: BackendKnowledge | None
) -> Backend:
    target = settings.backend
    if target.kind == "builtin":
        return BuiltinBackend(server_name=settings.server_name)
    if target.kind == "mindie":
        return MindieBackend(
            target.url,
            model=settings.mindie.model if settings.mindie is not None else "llm",
            timeout=settings.backend_timeout,
            connect_timeout=settings.backend_connect_timeout,
            connections=settings.backend_connections,
            tokens=TokenRecorder(metrics, "backend") if isinstance(metrics, Metrics) else None,
            ssl_context=client_context(settings.backend_tls) if target.tls else None,
            max_answer_size=settings.backend_max_answer_size,
            max_infer_answer=settings.max_body_size,
        )
    counts = staged = None
    if isinstance(metrics, Metrics):
        counts = {r: metrics.store(SHM_STAGING).child(r) for r in ("hit", "miss", "fallback")}
        staged = {d: metrics.store(SHM_STAGED_BYTES).child(d) for d in ("input", "output")}
    staging = Stager(
        settings.backend_shm,
        settings.backend_shm_threshold,
        counts=counts,
        staged_bytes=staged,
        knowledge=knowledge,
    )
    cells = EndpointRecorder(metrics) if isinstance(metrics, Metrics) else None
    netloc = target.url.split("://", 1)[-1].split("/", 1)[0]
    if "," in netloc and settings.backend_shm != "off":
        log.info(
            "the backend lists several servers: --backend-shm does not stage tensors (a region"
            " registered with one server is unknown to the next)"
        )
    if target.kind == "grpc":
        return GrpcBackend(
            target.url,
            timeout=settings.backend_timeout,
            max_message_size=settings.grpc_max_message_size,
            max_answer_size=settings.backend_max_answer_size,
            staging=staging,
            credentials=channel_credentials(settings.backend_tls) if target.tls else None,
            resolve_every=settings.backend_resolve_interval,
            cells=cells,
            knowledge=knowledge,
        )
    return RestBackend(
        target.url,
        encoding=settings.backend_encoding,
        timeout=settings.backend_timeout,
        connect_timeout=settings.backend_connect_timeout,
        connections=settings.backend_connections,
        staging=staging,
        ssl_context=client_context(settings.backend_tls) if target.tls else None,
        on_retry=(
            metrics.store(BACKEND_RETRIES).child("rest").inc
            if isinstance(metrics, Metrics)
            else None
        ),
        resolve_every=settings.backend_resolve_interval,
        cells=cells,
        knowledge=knowledge,
        max_answer_size=settings.backend_max_answer_size,
        max_infer_answer=settings.max_body_size,
    )


def build_pipeline(
    settings: Settings,
    backend: Backend,
    metrics: AnyMetrics | None = None,
    shm_folder: str | None = None,
    cuda_adapter: CudaAdapter | Literal["auto"] | None = "auto",
    knowledge: BackendKnowledge | None = None,
) -> Pipeline:
    """The one core every frontend goes through, with the clients' shared-memory regions: this
    process's own, or those recorded in ``shm_folder`` that every worker shares."""
    gauges = cuda_gauges = tensors = None
    if isinstance(metrics, Metrics):
        gauges, cuda_gauges = (
            (metrics.store(SHM_REGIONS).child(k), metrics.store(SHM_BYTES).child(k))
            for k in ("system", "cuda")
        )
        tensors = {d: metrics.store(SHM_TENSORS).child(d) for d in ("input", "output")}
    if cuda_adapter == "auto":
        cuda_adapter = default_adapter()
    limit = region_limit(settings.max_shm_regions)
    shm = (
        Registry(
            gauges=gauges,
            tensors=tensors,
            cuda_adapter=cuda_adapter,
            cuda_gauges=cuda_gauges,
            max_regions=limit,
        )
        if shm_folder is None
        else SharedRegistry(
            shm_folder,
            gauges=gauges,
            tensors=tensors,
            cuda_adapter=cuda_adapter,
            cuda_gauges=cuda_gauges,
            max_regions=limit,
        )
    )
    return Pipeline(
        backend,
        settings.max_input_size,
        settings.models,
        shm=shm,
        client_shm=settings.client_shm,
        max_tensors=settings.max_tensors,
        knowledge=knowledge,
    )


def build_metrics(settings: Settings) -> AnyMetrics:
    """The process's metrics on a registry of its own (``--metrics off``: a no-op recorder)."""
    if not settings.metrics:
        return NullMetrics()
    protocol = {"builtin": "builtin", "grpc": "grpc", "mindie": "mindie"}.get(
        settings.backend.kind, "rest"
    )
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR") if settings.workers > 1 else None
    return Metrics(CollectorRegistry(auto_describe=True), protocol, folder)
