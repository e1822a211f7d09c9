"""What the edges record: :class:`FrontendRecorder` per request of a frontend (REST, gRPC) and
:class:`BackendRecorder` per call of the metered backend, into the cells of
:class:`~v2proxy.ops.metrics_export.Metrics`.

The hot path of metrics: a recorder binds a label set's cells once, caches them by the label
values and then only adds to plain numbers; with ``--metrics off`` its cells are no-ops.
"""

from __future__ import annotations

from typing import Any, Final

from v2proxy.ops.metrics import (
    BACKEND_DURATION,
    BACKEND_ENDPOINT_CALLS,
    BACKEND_ENDPOINT_UP,
    BACKEND_ERRORS,
    DURATION,
    ERRORS,
    IN_FLIGHT,
    NULL,
    REJECTED,
    REQUEST_BYTES,
    REQUESTS,
    RESPONSE_BYTES,
    TOKENS,
    TPOT,
    TRANSCODE,
    TTFT,
    WIRES,
    Counter,
    Histogram,
    code_class,
)
from v2proxy.ops.metrics_export import AnyMetrics, Metrics
from v2proxy.ops.request_log import RequestLog


class _Cells:
    """The cells one outcome of a request adds to (its label set's, bound once)."""

    __slots__ = ("count", "duration", "error", "received", "sent")

    def __init__(
        self,
        count: Counter,
        duration: Histogram,
        error: Counter | None,
        received: Counter,
        sent: Counter,
    ) -> None:
        self.count = count
        self.duration = duration
        self.error = error
        self.received = received
        self.sent = sent


class FrontendRecorder:
    """What one frontend records per request: in-flight, decode/encode times, :meth:`done` once
    answered, and its log lines (``log``: :meth:`RequestLog.write
    <v2proxy.ops.request_log.RequestLog.write>`)."""

    def __init__(self, metrics: AnyMetrics, frontend: str, access_log: bool = False) -> None:
        self.frontend = frontend
        self.backend = metrics.backend
        self.access_log = access_log
        self.log = RequestLog(frontend, self.backend, access_log).write
        #: (op, model label, status, error, wire in, wire out) -> the cells of that outcome
        self._cells: dict[tuple[str, str, int, str | None, str, str], _Cells] = {}
        #: the last outcome of a known model, (op, model, status, error, wire in, wire out),
        #: and its cells: a request like the one before (the usual one) is compared, not hashed
        self._last: tuple[str, str, int, str | None, str, str] | None = None
        self._last_cells: _Cells | None = None
        if isinstance(metrics, Metrics):
            self.enabled = True
            self._metrics = metrics
            self._models = metrics.models
            self._known = metrics.models.known
            self.inflight: Any = metrics.store(IN_FLIGHT).child(frontend)
            self.rejected: Any = metrics.store(REJECTED).child(frontend, "max_concurrency")
            transcode = metrics.store(TRANSCODE)
            self.decode: dict[str, Any] = {w: transcode.child(frontend, "decode", w) for w in WIRES}
            self.encode: dict[str, Any] = {w: transcode.child(frontend, "encode", w) for w in WIRES}
        else:
            self.enabled = False
            self.inflight = NULL
            self.rejected = NULL
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
        outcome = (op, model, status, error, wire_in, wire_out)
        cells = self._last_cells
        if cells is None or outcome != self._last:
            label = self._known.get(model)
            known = label is not None
            if label is None:
                label = self._models.label(model, status < 400)
            key = (op, label, status, error, wire_in, wire_out)
            cells = self._cells.get(key)
            if cells is None:
                cells = self._cells[key] = self._bind(key)
            if known:  # (a known model's label is for good)
                self._last = outcome
                self._last_cells = cells
        cells.count.value += 1
        cells.duration.observe(duration)
        if cells.error is not None:
            cells.error.value += 1
        cells.received.value += n_in
        cells.sent.value += n_out

    def _bind(self, key: tuple[str, str, int, str | None, str, str]) -> _Cells:
        op, label, status, error, wire_in, wire_out = key
        m, fe, be = self._metrics, self.frontend, self.backend
        return _Cells(
            m.store(REQUESTS).child(label, op, fe, be, code_class(status)),
            m.store(DURATION).child(label, op, fe, be),
            None if error is None else m.store(ERRORS).child(label, op, fe, be, error),
            m.store(REQUEST_BYTES).child(label, fe, wire_in),
            m.store(RESPONSE_BYTES).child(label, fe, wire_out),
        )


#: connection-level failures of a backend call -> the ``error`` label of BACKEND_ERRORS
_CONNECTION_ERRORS: Final = {
    "BackendUnavailable": "unavailable",
    "GatewayTimeout": "timeout",
    "BadGateway": "bad_gateway",
}


class BackendRecorder:
    """What the metered backend records per call: its duration and connection errors."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._models = metrics.models
        self._known = metrics.models.known
        self.backend = metrics.backend
        self._durations: dict[tuple[str, str], Histogram] = {}
        #: the last call's (op, model) of a known model and its histogram (as FrontendRecorder)
        self._last: tuple[str, str] | None = None
        self._last_hist: Histogram | None = None

    def done(self, op: str, model: str, duration: float, exc: BaseException | None) -> None:
        call = (op, model)
        hist = self._last_hist
        if hist is None or call != self._last:
            label = self._known.get(model)
            known = label is not None
            if label is None:
                label = self._models.label(model, exc is None)
            hist = self._durations.get((op, label))
            if hist is None:
                hist = self._durations[(op, label)] = self._metrics.store(BACKEND_DURATION).child(
                    label, op, self.backend
                )
            if known:
                self._last = call
                self._last_hist = hist
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


class TokenRecorder:
    """What a MindIE adapter records per request (``direction``: frontend | backend): time to
    the first token, time per later token, tokens generated."""

    def __init__(self, metrics: AnyMetrics, direction: str) -> None:
        self.direction = direction
        self._metrics = metrics if isinstance(metrics, Metrics) else None
        self._cells: dict[str, tuple[Any, Any, Any]] = {}

    def _of(self, model: str) -> tuple[Any, Any, Any]:
        cells = self._cells.get(model)
        if cells is None:
            m = self._metrics
            if m is None:
                return NULL, NULL, NULL
            label, d = m.models.label(model, True), self.direction
            cells = self._cells[model] = (
                m.store(TTFT).child(label, d),
                m.store(TPOT).child(label, d),
                m.store(TOKENS).child(label, d),
            )
        return cells

    def first_token(self, model: str, seconds: float) -> None:
        self._of(model)[0].observe(seconds)

    def next_token(self, model: str, seconds: float) -> None:
        self._of(model)[1].observe(seconds)

    def generated(self, model: str, tokens: int) -> None:
        self._of(model)[2].inc(tokens)


class EndpointRecorder:
    """The backend endpoints' cells (:class:`~v2proxy.backends.endpoints.EndpointCells`). An
    endpoint that leaves takes its series with it, so the label stays bounded."""

    def __init__(self, metrics: Metrics) -> None:
        self._calls = metrics.store(BACKEND_ENDPOINT_CALLS)
        self._up = metrics.store(BACKEND_ENDPOINT_UP)

    def calls(self, endpoint: str, outcome: str) -> Counter:
        cell: Counter = self._calls.child(endpoint, outcome)
        return cell

    def up(self, endpoint: str, value: float) -> None:
        self._up.child(endpoint).value = value

    def forget(self, endpoint: str) -> None:
        for labels in [k for k in self._calls.children if k[0] == endpoint]:
            del self._calls.children[labels]
        self._up.children.pop((endpoint,), None)
