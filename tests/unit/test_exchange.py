"""The exchange envelope (v2proxy.frontends.exchange) on its own, with the real recorder over a
fresh Prometheus registry: what each outcome records (metrics, the WARNING line, the access
line), admission and its refusals, what each kind of exception is recorded as (the HTTP layer's
by the REST frontend's classifier), and the context-manager form of an exchange."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import (
    BackendUnavailable,
    CodecError,
    GatewayTimeout,
    NotFound,
    Overloaded,
    ProxyError,
)
from v2proxy.frontends import rest_record
from v2proxy.frontends.exchange import GONE_STATUS, SHUTDOWN_STATUS, Envelope, Exchange
from v2proxy.frontends.rest_quick import _Exchange
from v2proxy.http.request import BodyTimeout, BodyTooLarge, ClientDisconnected
from v2proxy.ops.metrics_export import Metrics, NullMetrics
from v2proxy.ops.recorders import BackendRecorder, FrontendRecorder

GONE = "the client went away"
FE = {"frontend": "rest", "backend": "builtin"}
#: what describe() names every request of these tests from
SOURCE = ("r1", "POST", "/p")


def describe(source: Any) -> tuple[str | None, str, str]:
    rid, method, path = source
    return rid, method, path


def build(limit: int = 0, access_log: bool = False) -> tuple[Metrics, Envelope]:
    metrics = Metrics(CollectorRegistry(), "builtin")
    recorder = FrontendRecorder(metrics, "rest", access_log)
    return metrics, Envelope(
        recorder,
        AdmissionGate(limit),
        describe,
        GONE,
        classify=rest_record.transport_failure,
        keeps=rest_record.cut_short,
    )


def end(
    x: Exchange,
    status: int,
    error: str | None = None,
    cause: str | None = None,
    shown: int | str | None = None,
) -> None:
    """Ends ``x``, a request on model "m" answered with ``status``: 7 bytes of JSON in, 11
    binary out."""
    x.model, x.status, x.error, x.cause, x.shown = "m", status, error, cause, shown
    x.wire_in, x.n_in, x.wire_out, x.n_out = "json", 7, "binary", 11
    x.end()


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def error_samples(metrics: Metrics) -> list[tuple[str, str, float]]:
    """(operation, error, count) of every v2proxy_request_errors_total sample."""
    return [
        (s.labels["operation"], s.labels["error"], s.value)
        for fam in metrics.registry.collect()
        for s in fam.samples
        if s.name == "v2proxy_request_errors_total"
    ]


def rejected(metrics: Metrics) -> float:
    return sample(
        metrics, "v2proxy_requests_rejected_total", frontend="rest", reason="max_concurrency"
    )


def in_flight(metrics: Metrics) -> float:
    return sample(metrics, "v2proxy_requests_in_flight", frontend="rest")


# ---------------------------------------------------------------------- outcomes

#: (status, error given, cause, shown) -> (code class, error label recorded or None, the
#: WARNING line's cause or None when no line is written)
OUTCOMES = [
    ((200, None, "", 200), ("2xx", None, None)),
    # an error kind given with a success is no error
    ((200, "internal", "", 200), ("2xx", None, None)),
    ((204, None, None, "OK"), ("2xx", None, None)),
    ((404, "not_found", "no such model", 404), ("4xx", "not_found", "no such model")),
    ((400, "invalid_request", "bad x", "INVALID_ARGUMENT"), ("4xx", "invalid_request", "bad x")),
    ((405, "method_not_allowed", "", 405), ("4xx", "method_not_allowed", "status 405")),
    ((499, "client_disconnected", GONE, "CANCELLED"), ("4xx", "client_disconnected", GONE)),
    ((503, "backend_unavailable", "down", 503), ("5xx", "backend_unavailable", "down")),
    ((500, "internal", "internal error: E", 500), ("5xx", "internal", "internal error: E")),
]  # fmt: skip


@pytest.mark.parametrize(("outcome", "expected"), OUTCOMES)
def test_done_records_the_outcome(
    outcome: tuple[int, str | None, str | None, int | str],
    expected: tuple[str, str | None, str | None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, error, cause, shown = outcome
    code_class, label, line_cause = expected
    metrics, env = build()
    x = env.open("infer", SOURCE)
    x.admit()
    assert in_flight(metrics) == 1
    with caplog.at_level(logging.INFO):
        end(x, status, error, cause, shown)
    assert in_flight(metrics) == 0
    # a model name becomes a label once it answered successfully
    model = "m" if status < 400 else "other"
    labels = {"model": model, "operation": "infer", **FE}
    assert sample(metrics, "v2proxy_requests_total", code_class=code_class, **labels) == 1
    assert sample(metrics, "v2proxy_request_duration_seconds_count", **labels) == 1
    assert error_samples(metrics) == ([] if label is None else [("infer", label, 1.0)])
    bytes_in = sample(
        metrics, "v2proxy_request_bytes_total", model=model, frontend="rest", wire="json"
    )
    bytes_out = sample(
        metrics, "v2proxy_response_bytes_total", model=model, frontend="rest", wire="binary"
    )
    assert (bytes_in, bytes_out) == (7, 11)
    warnings = [r for r in caplog.records if r.name == "v2proxy.requests"]
    if line_cause is None:
        assert warnings == []
    else:
        (line,) = warnings
        fields = line.request  # type: ignore[attr-defined]
        assert line.levelno == logging.WARNING and line.getMessage() == "request failed"
        assert fields["cause"] == line_cause
        assert (fields["request_id"], fields["method"], fields["path"]) == SOURCE
        assert (fields["status"], fields["bytes_in"], fields["bytes_out"]) == (shown, 7, 11)
        assert (fields["frontend"], fields["backend"], fields["model"]) == ("rest", "builtin", "m")
    assert [r for r in caplog.records if r.name == "v2proxy.access"] == []
    assert rejected(metrics) == 0


@pytest.mark.parametrize("status", [200, 404])
def test_access_line_for_every_exchange_with_access_log(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    _, env = build(access_log=True)
    with caplog.at_level(logging.INFO):
        end(env.open("side", SOURCE), status, "not_found", "no such model")
    (line,) = [r for r in caplog.records if r.name == "v2proxy.access"]
    fields = line.request  # type: ignore[attr-defined]
    assert (fields["request_id"], fields["status"], fields["duration_s"] >= 0) == (
        "r1",
        status,
        True,
    )
    assert "cause" not in fields
    assert len([r for r in caplog.records if r.name == "v2proxy.requests"]) == (status >= 400)


def test_metrics_off_records_nothing_but_still_logs(caplog: pytest.LogCaptureFixture) -> None:
    env = Envelope(FrontendRecorder(NullMetrics(), "grpc"), AdmissionGate(1), describe, GONE)
    x = env.open("infer", SOURCE)
    x.admit()
    assert env.gate.in_use == 1
    with caplog.at_level(logging.INFO):
        end(x, 503, "overloaded", "full", "RESOURCE_EXHAUSTED")
    assert env.gate.in_use == 0
    (line,) = [r for r in caplog.records if r.name == "v2proxy.requests"]
    assert line.request["status"] == "RESOURCE_EXHAUSTED"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- admission

#: (limit, operations admitted in order) -> what each exchange became: True took a slot, False
#: needed none, "refused"
ADMISSIONS = [
    ((1, ["infer", "infer"]), [True, "refused"]),
    ((2, ["infer", "health", "metadata", "side", "mindie"]), [True, False, False, True, "refused"]),
    ((0, ["infer", "infer", "infer"]), [False, False, False]),
]  # fmt: skip


@pytest.mark.parametrize(("given", "expected"), ADMISSIONS)
def test_admission_takes_slots_until_done_and_counts_refusals(
    given: tuple[int, list[str]], expected: list[object]
) -> None:
    limit, ops = given
    metrics, env = build(limit)
    opened: list[tuple[Exchange, ProxyError | None]] = []
    for op in ops:
        x = env.open(op, SOURCE)
        try:
            x.admit()
        except Overloaded as exc:
            assert x.held is False  # a refused exchange was still admitted (refused)
            opened.append((x, exc))
        else:
            opened.append((x, None))
    assert [x.held if e is None else "refused" for x, e in opened] == expected
    assert env.gate.in_use == expected.count(True)
    assert in_flight(metrics) == len(ops)
    refusals = expected.count("refused")
    assert rejected(metrics) == 0  # counted once the refusal is answered
    for x, exc in opened:
        if exc is None:
            end(x, 200)
        else:
            x.fail(exc)
            x.end()
    assert env.gate.in_use == 0 and in_flight(metrics) == 0
    assert rejected(metrics) == refusals
    assert sum(n for _, e, n in error_samples(metrics) if e == "overloaded") == refusals


def test_overloaded_of_an_exchange_never_admitted_is_no_rejection() -> None:
    """A stream's message is not admitted on its own (held None): its failure is no refusal."""
    metrics, env = build(1)
    x = env.open("stream_infer", SOURCE)
    x.fail(Overloaded("out of descriptors"))
    x.end()
    assert x.held is None and rejected(metrics) == 0
    assert error_samples(metrics) == [("stream_infer", "overloaded", 1.0)]
    assert env.gate.in_use == 0


def test_overloaded_of_an_admitted_exchange_is_a_rejection() -> None:
    """Any Overloaded that answers an admitted request is counted (as before the envelope)."""
    metrics, env = build(0)
    x = env.open("side", SOURCE)
    x.admit()
    x.fail(Overloaded("out of descriptors"))
    x.end()
    assert rejected(metrics) == 1


def test_a_stream_holds_one_slot_and_a_refusal_is_counted() -> None:
    metrics, env = build(1)
    held = env.hold("stream_infer")
    assert held is True and env.gate.in_use == 1
    with pytest.raises(Overloaded):
        env.hold("stream_infer")
    assert rejected(metrics) == 1
    # its messages are exchanges of their own, never admitted
    end(env.open("stream_infer", SOURCE), 200)
    assert env.gate.in_use == 1
    env.release(held)
    assert env.gate.in_use == 0
    env.release(env.hold("health"))  # exempt: no slot taken, none given back
    assert env.gate.in_use == 0
    assert rejected(metrics) == 1


# ---------------------------------------------------------------------- exception kinds

#: what a request that ended by raising is recorded as
KINDS: list[tuple[BaseException, tuple[int, str, str]]] = [
    (NotFound("no model 'x'"), (404, "not_found", "no model 'x'")),
    (CodecError("bad json"), (400, "invalid_request", "bad json")),
    (BackendUnavailable("refused"), (503, "backend_unavailable", "refused")),
    (GatewayTimeout("late"), (504, "gateway_timeout", "late")),
    (Overloaded("full"), (503, "overloaded", "full")),
    (ProxyError("boom"), (500, "internal", "boom")),
    (ClientDisconnected("client went away"), (GONE_STATUS, "client_disconnected", GONE)),
    (asyncio.CancelledError(), (GONE_STATUS, "client_disconnected", GONE)),
    (BodyTooLarge("too big"), (413, "invalid_request", "too big")),
    (BodyTimeout("too slow"), (408, "invalid_request", "too slow")),
    (KeyError("k"), (500, "internal", "internal error: KeyError")),
    (RuntimeError("r"), (500, "internal", "internal error: RuntimeError")),
]


@pytest.mark.parametrize(("exc", "expected"), KINDS, ids=lambda v: type(v).__name__)
def test_failure_of_each_exception_kind(exc: BaseException, expected: tuple[int, str, str]) -> None:
    _, env = build()
    assert env.failure(exc) == expected


def test_a_cancellation_at_shutdown_is_the_shutdowns() -> None:
    """Once the gate is closing (past --drain-timeout) a cancelled request was cut by the
    shutdown, not by its client; a client's going away stays the client's."""
    _, env = build()
    env.gate.closing = True
    assert env.failure(asyncio.CancelledError()) == (
        SHUTDOWN_STATUS,
        "shutdown",
        "v2proxy shut down before the answer was complete (--drain-timeout passed)",
    )
    gone = ClientDisconnected("client went away")
    assert env.failure(gone) == (GONE_STATUS, "client_disconnected", GONE)


def test_the_envelope_alone_knows_no_transport() -> None:
    """Without a classifier the HTTP layer's errors are internal ones: classifying them is the
    REST frontend's (:func:`v2proxy.frontends.rest_record.transport_failure`)."""
    env = Envelope(FrontendRecorder(NullMetrics(), "rest"), AdmissionGate(), describe, GONE)
    gone = ClientDisconnected("client went away")
    assert env.failure(gone) == (500, "internal", "internal error: ClientDisconnected")
    assert env.failure(asyncio.CancelledError()) == (GONE_STATUS, "client_disconnected", GONE)


# ---------------------------------------------------------------------- the exchange's forms


def test_an_exception_leaving_the_block_fails_and_ends_the_exchange() -> None:
    metrics, env = build(1)
    with pytest.raises(KeyError), env.open("infer", SOURCE) as x:
        x.admit()
        assert env.gate.in_use == 1 and in_flight(metrics) == 1
        raise KeyError("k")
    assert (x.status, x.error, x.cause) == (500, "internal", "internal error: KeyError")
    assert env.gate.in_use == 0 and in_flight(metrics) == 0
    assert error_samples(metrics) == [("infer", "internal", 1.0)]


def test_a_block_left_without_a_word_is_an_internal_error() -> None:
    """An exchange ended without a status said is a 500 (the frontend says 200 when it
    answered)."""
    metrics, env = build()
    with env.open("infer", SOURCE):
        pass
    assert error_samples(metrics) == [("infer", "internal", 1.0)]


#: (the failure recorded first or None, what interrupts its answer) -> what is recorded
INTERRUPTED = [
    ((NotFound("no model"), ClientDisconnected("gone")), (404, "not_found")),
    ((NotFound("no model"), asyncio.CancelledError()), (GONE_STATUS, "client_disconnected")),
    ((None, ClientDisconnected("gone")), (GONE_STATUS, "client_disconnected")),
]


@pytest.mark.parametrize(("given", "expected"), INTERRUPTED)
def test_an_error_answer_cut_short_by_the_client_stays_that_error(
    given: tuple[ProxyError | None, BaseException], expected: tuple[int, str]
) -> None:
    _, env = build()
    first, then = given
    with pytest.raises(type(then)), env.open("infer", SOURCE) as x:
        if first is not None:
            x.fail(first)
        raise then
    assert (x.status, x.error) == expected


def test_a_cancellation_in_the_block_at_shutdown_is_the_shutdowns() -> None:
    metrics, env = build()
    env.gate.closing = True
    with pytest.raises(asyncio.CancelledError), env.open("infer", SOURCE) as x:
        raise asyncio.CancelledError
    assert (x.status, x.error) == (SHUTDOWN_STATUS, "shutdown")
    assert error_samples(metrics) == [("infer", "shutdown", 1.0)]


def test_undo_gives_the_exchange_up_unrecorded() -> None:
    metrics, env = build(1)
    x = env.open("infer", SOURCE)
    x.admit()
    x.undo()
    assert env.gate.in_use == 0 and in_flight(metrics) == 0
    assert error_samples(metrics) == []
    assert sample(metrics, "v2proxy_request_duration_seconds_count", model="other",
                  operation="infer", **FE) == 0  # fmt: skip


@pytest.mark.from_source
def test_the_quick_lanes_exchange_starts_as_every_exchange() -> None:
    # the lane builds its exchange in one constructor (Exchange.__init__ written out with its
    # own fields): a field Exchange gains must start the same there
    env = Envelope(FrontendRecorder(NullMetrics(), "rest"), AdmissionGate(), describe, GONE)
    source = object()
    plain = Exchange(env, "infer", source)
    lane = _Exchange(SimpleNamespace(envelope=env), source, None, None, "", 0, None)  # type: ignore[arg-type]
    assert env.inflight.value == 2
    for name in Exchange.__slots__:
        if name in ("t0", "shown"):
            continue
        assert getattr(lane, name) == getattr(plain, name), name
    assert not hasattr(plain, "shown") and not hasattr(lane, "shown")


#: (model, status, error, wire out) of requests one after the other: the same outcome in a row,
#: another outcome of the same model, a model not yet known ("other" until it answered), one
#: failing before it is known and after
SEQUENCE = [
    ("m", 200, None, "json"),
    ("m", 200, None, "json"),
    ("m", 200, None, "binary"),
    ("m", 200, None, "json"),
    ("m", 503, "backend_unavailable", "json"),
    ("m", 503, "backend_unavailable", "json"),
    ("m", 404, "not_found", "json"),
    ("m", 503, "not_found", "json"),  # (another status, the same error)
    ("n", 404, "not_found", "json"),
    ("n", 200, None, "json"),
    ("n", 404, "not_found", "json"),
    ("m", 200, None, "json"),
]


def test_each_outcome_is_recorded_under_its_own_labels_however_they_follow() -> None:
    """The recorders remember the last outcome's cells: a request like the one before adds to
    them, any other to its own label set's (counted here independently)."""
    metrics = Metrics(CollectorRegistry(), "builtin")
    recorder = FrontendRecorder(metrics, "rest")
    backend = BackendRecorder(metrics)
    seen: set[str] = set()
    want: dict[tuple[str, str, str], int] = {}
    calls: dict[str, int] = {}
    for model, status, error, wire_out in SEQUENCE:
        if status < 400:
            seen.add(model)
        label = model if model in seen else "other"
        key = (label, f"{status // 100}xx", wire_out)
        want[key] = want.get(key, 0) + 1
        calls[label] = calls.get(label, 0) + 1
        recorder.done(0.001, "infer", model, status, error, "json", 5, wire_out, 9)
        backend.done("relay_infer", model, 0.001, None if status < 400 else BackendUnavailable("x"))
    for (label, code, wire_out), count in want.items():
        labels = {"model": label, "operation": "infer", **FE}
        got = sample(metrics, "v2proxy_requests_total", code_class=code, **labels)
        assert got == sum(c for (m, k, _), c in want.items() if (m, k) == (label, code))
        sent = sample(
            metrics, "v2proxy_response_bytes_total", model=label, frontend="rest", wire=wire_out
        )
        assert sent == 9 * sum(c for (m, _, w), c in want.items() if (m, w) == (label, wire_out))
        assert count > 0
    for label, count in calls.items():
        got = sample(
            metrics,
            "v2proxy_backend_request_duration_seconds_count",
            model=label,
            operation="relay_infer",
            backend="builtin",
        )
        assert got == count, label
