"""The exchange envelope (v2proxy.frontends.exchange) on its own, with the real recorder over a
fresh Prometheus registry: what each outcome records (metrics, the WARNING line, the access
line), admission and its refusals, and what each kind of exception is recorded as."""

from __future__ import annotations

import asyncio
import logging
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
from v2proxy.frontends.exchange import GONE_STATUS, SHUTDOWN_STATUS, Envelope
from v2proxy.http.request import BodyTimeout, BodyTooLarge, ClientDisconnected
from v2proxy.ops.metrics_export import Metrics, NullMetrics
from v2proxy.ops.recorders import FrontendRecorder

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
    return metrics, Envelope(recorder, AdmissionGate(limit), describe, GONE)


def end(
    env: Envelope,
    t0: float,
    held: bool | None,
    op: str,
    status: int,
    error: str | None = None,
    cause: str | None = None,
    shown: int | str | None = None,
) -> None:
    """done() of a request of ``op`` on model "m": 7 bytes of JSON in, 11 binary out."""
    env.done(
        t0, held, op, "m", status, error, cause, "json", 7, "binary", 11, SOURCE,
        status if shown is None else shown,
    )  # fmt: skip


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
    t0 = env.open()
    assert in_flight(metrics) == 1
    with caplog.at_level(logging.INFO):
        end(env, t0, False, "infer", status, error, cause, shown)
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
        end(env, env.open(), False, "side", status, "not_found", "no such model")
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
    t0 = env.open()
    held = env.admit("infer")
    assert env.gate.in_use == 1
    with caplog.at_level(logging.INFO):
        end(env, t0, held, "infer", 503, "overloaded", "full", "RESOURCE_EXHAUSTED")
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
    opened: list[tuple[float, bool, str, ProxyError | None]] = []
    for op in ops:
        t0 = env.open()
        held = False  # as the frontends do: a refused exchange was still admitted (refused)
        try:
            held = env.admit(op)
        except Overloaded as exc:
            opened.append((t0, held, op, exc))
        else:
            opened.append((t0, held, op, None))
    assert [h if e is None else "refused" for _, h, _, e in opened] == expected
    assert env.gate.in_use == expected.count(True)
    assert in_flight(metrics) == len(ops)
    refusals = expected.count("refused")
    assert rejected(metrics) == 0  # counted once the refusal is answered
    for t0, held, op, exc in opened:
        if exc is None:
            end(env, t0, held, op, 200)
        else:
            status, error, cause = env.failure(exc)
            end(env, t0, held, op, status, error, cause)
    assert env.gate.in_use == 0 and in_flight(metrics) == 0
    assert rejected(metrics) == refusals
    assert sum(n for _, e, n in error_samples(metrics) if e == "overloaded") == refusals


def test_overloaded_of_an_exchange_never_admitted_is_no_rejection() -> None:
    """A stream's message is not admitted on its own (held None): its failure is no refusal."""
    metrics, env = build(1)
    status, error, cause = env.failure(Overloaded("out of descriptors"))
    end(env, env.open(), None, "stream_infer", status, error, cause, "RESOURCE_EXHAUSTED")
    assert rejected(metrics) == 0
    assert error_samples(metrics) == [("stream_infer", "overloaded", 1.0)]
    assert env.gate.in_use == 0


def test_overloaded_of_an_admitted_exchange_is_a_rejection() -> None:
    """Any Overloaded that answers an admitted request is counted (as before the envelope)."""
    metrics, env = build(0)
    t0 = env.open()
    held = env.admit("side")
    status, error, cause = env.failure(Overloaded("out of descriptors"))
    end(env, t0, held, "side", status, error, cause)
    assert rejected(metrics) == 1


def test_a_stream_holds_one_slot_and_a_refusal_is_counted() -> None:
    metrics, env = build(1)
    held = env.hold("stream_infer")
    assert held is True and env.gate.in_use == 1
    with pytest.raises(Overloaded):
        env.hold("stream_infer")
    assert rejected(metrics) == 1
    # its messages are exchanges of their own, never admitted
    end(env, env.open(), None, "stream_infer", 200)
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
