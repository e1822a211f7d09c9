"""Every Prometheus metric of v2proxy, declared here and nowhere else: the families, their closed
label value sets, and the hot-path cells that hold one label set's value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_MODEL_LABELS = 100

#: histogram buckets, in seconds
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
LATENCY_BUCKETS += (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TRANSCODE_BUCKETS = (2e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0)
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
REJECTED = Family(
    "v2proxy_requests_rejected_total",
    "counter",
    "Requests refused before any work was done, by reason: max_concurrency (more requests in"
    " progress than --max-concurrency allows; answered 503 / RESOURCE_EXHAUSTED).",
    ("frontend", "reason"),
)
# Only a GET, HEAD or OPTIONS whose reused connection ended before any answer byte; never a POST.
BACKEND_RETRIES = Family(
    "v2proxy_backend_retries_total",
    "counter",
    "Backend requests sent again on a new connection.",
    ("backend",),
)
# One label value per current address of the backend URL; an address that leaves takes its series.
BACKEND_ENDPOINT_CALLS = Family(
    "v2proxy_backend_endpoint_calls_total",
    "counter",
    "Backend calls per endpoint (address:port of the backend URL) by outcome: ok (answered),"
    " unreachable (refused, connect timeout, connection lost), timeout (no answer within"
    " --backend-timeout), malformed (not HTTP or gRPC, or over its size bound), 5xx.",
    ("backend_endpoint", "outcome"),
)
BACKEND_ENDPOINT_UP = Family(
    "v2proxy_backend_endpoint_up",
    "gauge",
    "1 while the backend endpoint is in rotation, 0 while it is out: unreachable, or 3"
    " failures in a row (timeout, malformed, 5xx); tried again after a back-off.",
    ("backend_endpoint",),
    multiprocess_mode="livemax",
)
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
SHM_TENSORS = Family(
    "v2proxy_shm_tensors_total",
    "counter",
    "Inference tensors read from (input) or written to (output) clients' shared-memory regions.",
    ("direction",),
)
SHM_STAGING = Family(
    "v2proxy_shm_staging_total",
    "counter",
    "Inference requests with an input over --backend-shm-threshold: staged in the backend's"
    " shared memory (hit), sent over the socket (miss), or sent again with their data after"
    " the backend refused staged tensors (fallback).",
    ("result",),
)
SHM_STAGED_BYTES = Family(
    "v2proxy_shm_staged_bytes_total",
    "counter",
    "Tensor bytes that went through the backend's shared memory instead of its socket"
    " (--backend-shm): inputs written to, outputs read from v2proxy's staging regions.",
    ("direction",),
)
# direction: frontend (MindIE clients, a v2 model behind) | backend (a MindIE server behind)
TTFT = Family(
    "v2proxy_mindie_time_to_first_token_seconds",
    "histogram",
    "MindIE streams: time from the request to its first generated token.",
    ("model", "direction"),
    TOKEN_BUCKETS,
)
TPOT = Family(
    "v2proxy_mindie_time_per_output_token_seconds",
    "histogram",
    "MindIE streams: time between generated tokens after the first.",
    ("model", "direction"),
    TOKEN_BUCKETS,
)
TOKENS = Family(
    "v2proxy_mindie_generated_tokens_total",
    "counter",
    "MindIE requests: tokens generated (as the backend reports them, else counted).",
    ("model", "direction"),
)

FAMILIES = (
    REQUESTS,
    ERRORS,
    DURATION,
    IN_FLIGHT,
    REJECTED,
    REQUEST_BYTES,
    RESPONSE_BYTES,
    TRANSCODE,
    BACKEND_DURATION,
    BACKEND_ERRORS,
    BACKEND_RETRIES,
    BACKEND_ENDPOINT_CALLS,
    BACKEND_ENDPOINT_UP,
    SHM_REGIONS,
    SHM_BYTES,
    SHM_TENSORS,
    SHM_STAGING,
    SHM_STAGED_BYTES,
    TTFT,
    TPOT,
    TOKENS,
)


WIRES = ("json", "binary", "raw", "grpc")
CODE_CLASSES = ("1xx", "1xx", "2xx", "3xx", "4xx", "5xx")


def code_class(status: int) -> str:
    return CODE_CLASSES[min(max(status // 100, 0), 5)]


_ERROR_KINDS = {
    "CodecError": "invalid_request",
    "InvalidRequest": "invalid_request",
    "PayloadTooLarge": "payload_too_large",
    "BodyTooLarge": "body_too_large",
    "ExpectationFailed": "expectation_failed",
    "Forbidden": "forbidden",
    "NotFound": "not_found",
    "MethodNotAllowed": "method_not_allowed",
    "Unsupported": "unsupported",
    "BackendError": "backend_error",
    "BadGateway": "bad_gateway",
    "BackendUnavailable": "backend_unavailable",
    "GatewayTimeout": "gateway_timeout",
    "Overloaded": "overloaded",
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
        """Counted in the first bucket whose bound is not below ``value`` (``bisect_left``,
        written out: compiled, the search stays in C)."""
        bounds = self.bounds
        lo = 0
        hi = len(bounds)
        while lo < hi:
            mid = (lo + hi) >> 1
            if bounds[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        self.counts[lo] += 1
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


class Store:
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
