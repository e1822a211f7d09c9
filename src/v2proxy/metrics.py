"""Every Prometheus metric of v2proxy, declared here and nowhere else (DESIGN.md rule 5), and the
recorders the frontends and the metered backend write them through.

Names follow Prometheus conventions (prefix ``v2proxy_``, base units, ``_total`` counters,
``_seconds`` and ``_bytes``); every label has a small, closed set of values:

- ``model``: a model name once it has answered successfully (at most :data:`MAX_MODEL_LABELS`
  per process), ``""`` for server-level operations, ``"other"`` for everything else (unknown
  models named by clients never become labels);
- ``operation``: infer, stream_infer, health, metadata, side, passthrough (frontends), the
  :class:`~v2proxy.ports.Backend` method name (backend);
- ``frontend``: rest | grpc; ``backend``: builtin | rest | grpc; ``code_class``: 2xx | 4xx |
  5xx (gRPC errors by their HTTP equivalent); ``wire``: json | binary | raw | grpc.

The hot path never touches prometheus_client: a request adds to plain cells (:class:`Counter`,
:class:`Gauge`, :class:`Histogram`, a bisect per observation, no locks: everything runs on the
one event loop), bound once per label set and cached. A collector registered in the injected
``CollectorRegistry`` turns them into metric families at scrape time. With ``--workers N`` the
cells are flushed every :data:`FLUSH_INTERVAL_S` (and before each scrape) into
prometheus_client's multiprocess values (``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor
before forking), and the scrape reads every worker's files through ``MultiProcessCollector``:
``/metrics`` reports the sum over all workers, other workers' values up to one interval late.
"""

from __future__ import annotations

import asyncio
import logging
import os
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import prometheus_client
import prometheus_client.values
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
MAX_MODEL_LABELS = 100
FLUSH_INTERVAL_S = 1.0

#: request/answer latency (seconds): 0.5 ms .. 60 s
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
LATENCY_BUCKETS += (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: decode/encode time (seconds): 20 µs .. 1 s
TRANSCODE_BUCKETS = (2e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0)
#: LLM token latency (seconds)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_FE = ("model", "operation", "frontend", "backend")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: its name as exposed, type, help, labels (and histogram buckets)."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    multiprocess_mode: str = "livesum"  # gauges only, with --workers N


REQUESTS = Family("v2proxy_requests_total", "counter", "Requests answered.", (*_FE, "code_class"))
ERRORS = Family(
    "v2proxy_request_errors_total",
    "counter",
    "Requests answered with an error, by cause (the error class).",
    (*_FE, "error"),
)
DURATION = Family(
    "v2proxy_request_duration_seconds",
    "histogram",
    "End-to-end time from a request's arrival to the end of its answer.",
    _FE,
    LATENCY_BUCKETS,
)
IN_FLIGHT = Family(
    "v2proxy_requests_in_flight", "gauge", "Requests being served now.", ("frontend",)
)
REQUEST_BYTES = Family(
    "v2proxy_request_bytes_total",
    "counter",
    "Request body bytes received (gRPC: message bytes), by wire form.",
    ("model", "frontend", "wire"),
)
RESPONSE_BYTES = Family(
    "v2proxy_response_bytes_total",
    "counter",
    "Response body bytes sent (gRPC: message bytes), by wire form.",
    ("model", "frontend", "wire"),
)
TRANSCODE = Family(
    "v2proxy_transcode_duration_seconds",
    "histogram",
    "Time to decode an inference request from its wire form into the internal model"
    " (direction=decode) or to encode the answer (direction=encode); gRPC: proto message <->"
    " internal model.",
    ("frontend", "direction", "wire"),
    TRANSCODE_BUCKETS,
)
BACKEND_DURATION = Family(
    "v2proxy_backend_request_duration_seconds",
    "histogram",
    "Time spent in a backend call (streams: to their last response; pass-through: to the"
    " answer's head), failed calls included.",
    ("model", "operation", "backend"),
    LATENCY_BUCKETS,
)
BACKEND_ERRORS = Family(
    "v2proxy_backend_connection_errors_total",
    "counter",
    "Backend calls that failed to reach the backend: unavailable (refused, not ready),"
    " timeout, bad_gateway (broken or non-v2 answer).",
    ("operation", "backend", "error"),
)
# Filled once the HTTP client reports the idle-connection retries it makes (http/client.py).
BACKEND_RETRIES = Family(
    "v2proxy_backend_retries_total",
    "counter",
    "Backend requests sent again on a new connection.",
    ("backend",),
)
# Filled by the shared-memory extension (issue "shared memory").
SHM_REGIONS = Family(
    "v2proxy_shm_registered_regions",
    "gauge",
    "Shared-memory regions registered by clients.",
    ("kind",),  # system | cuda
)
SHM_BYTES = Family(
    "v2proxy_shm_registered_bytes",
    "gauge",
    "Bytes of the shared-memory regions registered by clients.",
    ("kind",),
)
# Filled by the MindIE adapter (issue "MindIE").
TTFT = Family(
    "v2proxy_mindie_time_to_first_token_seconds",
    "histogram",
    "MindIE /infer: time from the request to its first generated token.",
    ("model",),
    TOKEN_BUCKETS,
)
TPOT = Family(
    "v2proxy_mindie_time_per_output_token_seconds",
    "histogram",
    "MindIE /infer: time between generated tokens after the first.",
    ("model",),
    TOKEN_BUCKETS,
)

FAMILIES = (
    REQUESTS,
    ERRORS,
    DURATION,
    IN_FLIGHT,
    REQUEST_BYTES,
    RESPONSE_BYTES,
    TRANSCODE,
    BACKEND_DURATION,
    BACKEND_ERRORS,
    BACKEND_RETRIES,
    SHM_REGIONS,
    SHM_BYTES,
    TTFT,
    TPOT,
)

WIRES = ("json", "binary", "raw", "grpc")
CODE_CLASSES = ("1xx", "1xx", "2xx", "3xx", "4xx", "5xx")


def code_class(status: int) -> str:
    return CODE_CLASSES[min(max(status // 100, 0), 5)]


# ---------------------------------------------------------------------- cells


class Counter:
    """A counter (or a gauge) cell: one label set's value."""

    __slots__ = ("flushed", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.flushed = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


Gauge = Counter


class Histogram:
    """A histogram cell: per-bucket counts (not cumulative; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "flushed_counts", "flushed_sum", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.flushed_counts = [0] * (len(bounds) + 1)
        self.flushed_sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Null:
    """A cell that records nothing (``--metrics off``)."""

    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        return None

    def dec(self, amount: float = 1.0) -> None:
        return None

    def observe(self, value: float) -> None:
        return None


NULL = _Null()
Cell = Counter | Histogram


class _Store:
    """The cells of one family, by label values."""

    __slots__ = ("children", "family")

    def __init__(self, family: Family) -> None:
        self.family = family
        self.children: dict[tuple[str, ...], Any] = {}

    def child(self, *labels: str) -> Any:
        cell = self.children.get(labels)
        if cell is None:
            fam = self.family
            cell = Histogram(fam.buckets) if fam.kind == "histogram" else Counter()
            self.children[labels] = cell
        return cell


class _Collector(Collector):
    """The cells as metric families, at scrape time (one process)."""

    def __init__(self, stores: dict[str, _Store]) -> None:
        self.stores = stores

    def collect(self) -> Iterator[Metric]:
        for store in self.stores.values():
            fam = store.family
            metric: Metric
            if fam.kind == "counter":
                metric = CounterMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, c in store.children.items():
                    metric.add_metric(labels, c.value)
            elif fam.kind == "gauge":
                metric = GaugeMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, c in store.children.items():
                    metric.add_metric(labels, c.value)
            else:
                metric = HistogramMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, h in store.children.items():
                    total, buckets = 0, []
                    for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
                        total += n
                        le = prometheus_client.utils.floatToGoString(bound)  # type: ignore[no-untyped-call]
                        buckets.append((le, total))
                    metric.add_metric(labels, buckets, h.sum)
            yield metric


class _MultiprocessSink:
    """Flushes the cells' growth into prometheus_client's multiprocess values (one file per
    worker in ``PROMETHEUS_MULTIPROC_DIR``)."""

    def __init__(self, stores: dict[str, _Store]) -> None:
        self.stores = stores
        self.metrics: dict[str, Any] = {}
        for name, store in stores.items():
            fam = store.family
            if fam.kind == "counter":
                m: Any = prometheus_client.Counter(name, fam.help, fam.labels, registry=None)
            elif fam.kind == "gauge":
                m = prometheus_client.Gauge(
                    name,
                    fam.help,
                    fam.labels,
                    registry=None,
                    multiprocess_mode=fam.multiprocess_mode,  # type: ignore[arg-type]
                )
            else:
                m = prometheus_client.Histogram(
                    name, fam.help, fam.labels, registry=None, buckets=fam.buckets
                )
            self.metrics[name] = m

    def flush(self) -> None:
        for name, store in self.stores.items():
            kind = store.family.kind
            metric = self.metrics[name]
            for labels, cell in store.children.items():
                if kind == "histogram":
                    if cell.flushed_sum == cell.sum and cell.flushed_counts == cell.counts:
                        continue
                    child = metric.labels(*labels)
                    # prometheus_client has no public "add n observations": its child keeps one
                    # value per bucket (not cumulative) and one for the sum.
                    for i, n in enumerate(cell.counts):
                        if n != cell.flushed_counts[i]:
                            child._buckets[i].inc(n - cell.flushed_counts[i])
                    child._sum.inc(cell.sum - cell.flushed_sum)
                    cell.flushed_counts = list(cell.counts)
                    cell.flushed_sum = cell.sum
                elif cell.value != cell.flushed:
                    if kind == "gauge":
                        metric.labels(*labels).set(cell.value)
                    else:
                        metric.labels(*labels).inc(cell.value - cell.flushed)
                    cell.flushed = cell.value


def enable_multiprocess(path: str) -> None:
    """Make prometheus_client keep its values in files under ``path`` (call before forking the
    workers; they inherit it)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    prometheus_client.values.ValueClass = prometheus_client.values.get_value_class()  # type: ignore[no-untyped-call]


def process_gone(pid: int, path: str) -> None:
    """Drop a dead worker's live gauges (its counters stay in the sums)."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------------- the recorder


class ModelLabels:
    """Bounds the ``model`` label: a name becomes a label once it answered successfully."""

    __slots__ = ("known", "limit")

    def __init__(self, limit: int = MAX_MODEL_LABELS) -> None:
        self.known: dict[str, str] = {"": ""}
        self.limit = limit

    def label(self, model: str, ok: bool) -> str:
        label = self.known.get(model)
        if label is not None:
            return label
        if ok and len(self.known) <= self.limit:
            self.known[model] = model
            return model
        return "other"


class Metrics:
    """The process's metric cells, exported through the injected ``registry``.

    ``multiprocess_dir``: the workers' shared folder (``--workers N``); the registry then holds
    a ``MultiProcessCollector`` over it and the cells are flushed there.
    """

    enabled = True

    def __init__(
        self, registry: CollectorRegistry, backend: str, multiprocess_dir: str | None = None
    ) -> None:
        self.registry = registry
        self.backend = backend
        self.models = ModelLabels()
        self.stores = {f.name: _Store(f) for f in FAMILIES}
        self._sink: _MultiprocessSink | None = None
        self._timer: asyncio.TimerHandle | None = None
        if multiprocess_dir is None:
            registry.register(_Collector(self.stores))
        else:
            self._sink = _MultiprocessSink(self.stores)
            MultiProcessCollector(registry, multiprocess_dir)  # type: ignore[no-untyped-call]

    def store(self, family: Family) -> _Store:
        return self.stores[family.name]

    def flush(self) -> None:
        if self._sink is not None:
            self._sink.flush()

    def start(self) -> None:
        """Flush every FLUSH_INTERVAL_S on the running loop (multiprocess mode only)."""
        if self._sink is None:
            return
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.flush()
            self._timer = loop.call_later(FLUSH_INTERVAL_S, tick)

        self._timer = loop.call_later(FLUSH_INTERVAL_S, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()

    def exposition(self) -> bytes:
        """The Prometheus text of the whole process (of every worker with ``--workers N``)."""
        self.flush()
        return generate_latest(self.registry)


class NullMetrics:
    """``--metrics off``: the same interface, nothing recorded, no ``/metrics``."""

    enabled = False
    backend = ""

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def exposition(self) -> bytes:  # pragma: no cover - /metrics answers 404 first
        return b""


AnyMetrics = Metrics | NullMetrics


# ---------------------------------------------------------------------- what the edges record


class _Call:
    __slots__ = ("count", "duration", "error")

    def __init__(self, count: Counter, duration: Histogram, error: Counter | None) -> None:
        self.count = count
        self.duration = duration
        self.error = error


class FrontendRecorder:
    """What one frontend records per request: in-flight, decode/encode times (``decode[wire]``,
    ``encode[wire]``) and, once answered, :meth:`done`; plus the request's log lines: one
    WARNING per failed request (logger ``v2proxy.requests``) and, with ``--access-log``, one
    INFO line per request (``v2proxy.access``). Fields travel as the record's ``request``
    attribute (the formatters of app.py print them)."""

    def __init__(self, metrics: AnyMetrics, frontend: str, access_log: bool = False) -> None:
        self.frontend = frontend
        self.backend = metrics.backend
        self.access_log = access_log
        self._calls: dict[tuple[str, str, int, str | None], _Call] = {}
        self._bytes: dict[tuple[str, str, str], tuple[Counter, Counter]] = {}
        if isinstance(metrics, Metrics):
            self.enabled = True
            self._metrics = metrics
            self._models = metrics.models
            self.inflight: Any = metrics.store(IN_FLIGHT).child(frontend)
            transcode = metrics.store(TRANSCODE)
            self.decode: dict[str, Any] = {w: transcode.child(frontend, "decode", w) for w in WIRES}
            self.encode: dict[str, Any] = {w: transcode.child(frontend, "encode", w) for w in WIRES}
        else:
            self.enabled = False
            self.inflight = NULL
            self.decode = dict.fromkeys(WIRES, NULL)
            self.encode = dict.fromkeys(WIRES, NULL)

    def done(
        self,
        duration: float,
        op: str,
        model: str,
        status: int,
        error: str | None,
        wire_in: str,
        n_in: int,
        wire_out: str,
        n_out: int,
    ) -> None:
        """A request answered with ``status`` (``error``: its cause's kind when it failed)."""
        if not self.enabled:
            return
        label = self._models.label(model, status < 400)
        call = self._calls.get((op, label, status, error))
        if call is None:
            call = self._bind_call(op, label, status, error)
        call.count.value += 1
        call.duration.observe(duration)
        if call.error is not None:
            call.error.value += 1
        pair = self._bytes.get((label, wire_in, wire_out))
        if pair is None:
            pair = self._bytes[(label, wire_in, wire_out)] = (
                self._metrics.store(REQUEST_BYTES).child(label, self.frontend, wire_in),
                self._metrics.store(RESPONSE_BYTES).child(label, self.frontend, wire_out),
            )
        pair[0].value += n_in
        pair[1].value += n_out

    def _bind_call(self, op: str, label: str, status: int, error: str | None) -> _Call:
        m, fe, be = self._metrics, self.frontend, self.backend
        call = _Call(
            m.store(REQUESTS).child(label, op, fe, be, code_class(status)),
            m.store(DURATION).child(label, op, fe, be),
            None if error is None else m.store(ERRORS).child(label, op, fe, be, error),
        )
        self._calls[(op, label, status, error)] = call
        return call

    def log(
        self,
        failed: bool,
        request_id: str | None,
        model: str,
        method: str,
        path: str,
        status: int | str,
        duration: float,
        n_in: int,
        n_out: int,
        cause: str | None,
    ) -> None:
        """The request's log lines (call only when ``failed`` or ``self.access_log``)."""
        fields: dict[str, Any] = {
            "request_id": request_id or "-",
            "model": model,
            "frontend": self.frontend,
            "backend": self.backend,
            "method": method,
            "path": path,
            "status": status,
            "duration_s": round(duration, 6),
            "bytes_in": n_in,
            "bytes_out": n_out,
        }
        if failed:
            fields["cause"] = cause or f"status {status}"
            REQUEST_LOG.warning("request failed", extra={"request": fields})
        if self.access_log:
            fields.pop("cause", None)
            ACCESS_LOG.info("request", extra={"request": fields})


REQUEST_LOG = logging.getLogger("v2proxy.requests")
ACCESS_LOG = logging.getLogger("v2proxy.access")

#: error class name -> the ``error`` label (first match along the class's MRO)
_ERROR_KINDS = {
    "CodecError": "invalid_request",
    "InvalidRequest": "invalid_request",
    "PayloadTooLarge": "payload_too_large",
    "BodyTooLarge": "body_too_large",
    "ExpectationFailed": "expectation_failed",
    "Forbidden": "forbidden",
    "NotFound": "not_found",
    "Unsupported": "unsupported",
    "BackendError": "backend_error",
    "BadGateway": "bad_gateway",
    "BackendUnavailable": "backend_unavailable",
    "GatewayTimeout": "gateway_timeout",
}
_kind_cache: dict[type, str] = {}


def error_kind(exc: BaseException) -> str:
    """The ``error`` label of an exception (a closed set; anything unknown is ``internal``)."""
    cls = type(exc)
    kind = _kind_cache.get(cls)
    if kind is None:
        kind = next(
            (_ERROR_KINDS[c.__name__] for c in cls.__mro__ if c.__name__ in _ERROR_KINDS),
            "internal",
        )
        _kind_cache[cls] = kind
    return kind


#: connection-level failures of a backend call -> the ``error`` label of BACKEND_ERRORS
_CONNECTION_ERRORS = {
    "BackendUnavailable": "unavailable",
    "GatewayTimeout": "timeout",
    "BadGateway": "bad_gateway",
}


class BackendRecorder:
    """What the metered backend records per call: its duration and connection errors."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._models = metrics.models
        self.backend = metrics.backend
        self._durations: dict[tuple[str, str], Histogram] = {}

    def done(self, op: str, model: str, duration: float, exc: BaseException | None) -> None:
        label = self._models.label(model, exc is None)
        hist = self._durations.get((op, label))
        if hist is None:
            hist = self._durations[(op, label)] = self._metrics.store(BACKEND_DURATION).child(
                label, op, self.backend
            )
        hist.observe(duration)
        if exc is not None:
            kind = _CONNECTION_ERRORS.get(type(exc).__name__)
            if kind is None:
                kind = next(
                    (
                        _CONNECTION_ERRORS[c.__name__]
                        for c in type(exc).__mro__
                        if c.__name__ in _CONNECTION_ERRORS
                    ),
                    None,
                )
            if kind is not None:
                self._metrics.store(BACKEND_ERRORS).child(op, self.backend, kind).inc()
