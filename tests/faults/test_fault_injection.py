"""Fault injection between v2proxy and its backend (tests/faults/fault_matrix.py): v2proxy
processes in front of ``v2proxy reference-server`` through a fault-injecting relay, over a REST
and a gRPC backend, for unary, large (16 MiB) and streamed requests.

Each case: the fault is set, one request goes through the proxy, the fault is cleared, one good
request follows. The request must end as its scenario allows (a gateway error within
--backend-timeout plus a margin, or, for an answer whose 200 head went out, a cut the client
sees; never a hang, never a 200 with a wrong body: every 200 is checked element by element), and
the good request after it must succeed (recovery). The REST and gRPC cases of a scenario run at
the same time (each transport has its own relay and proxy).

``tools/fault_table.py`` runs every cell and prints the table. Here the cells over gRPC that
only wait out --backend-timeout on a path another cell already takes are left out
(:data:`GRPC_SKIPPED`: the gRPC timeout is 4 s, as a 16 MiB request alone takes 1-3 s over
grpcio on a loaded machine), as is the scenario without a fault (the stack's warm-up runs it).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from tests.faults.fault_matrix import (
    KINDS,
    SCENARIOS,
    Result,
    Scenario,
    Stack,
    run_case,
    run_scenario,
    stack,
)
from tests.faults.fault_relay import Faults
from v2proxy.backends.grpc import RECONNECT_BACKOFF_MS

#: (scenario, kind) cells over gRPC left out here (tools/fault_table.py runs them): each waits
#: out the gRPC --backend-timeout on a path another gRPC cell already takes
GRPC_SKIPPED = {
    ("latency-over-timeout", "large"),
    ("latency-over-timeout", "stream"),
    ("backend-stops-reading", "unary"),
    ("backend-stops-reading", "stream"),
    ("backend-stops-sending", "unary"),
    ("backend-stops-sending", "large"),
    ("bandwidth-slow", "large"),
    ("slow-request", "large"),
    ("slow-answer", "large"),
}
#: (scenario, transport, kind) run by their own regression tests below
OWN = {
    ("slow-request", "rest", "large"),
    ("slow-answer", "rest", "large"),
    ("backend-stops-reading", "grpc", "large"),
}


def _cells(sc: Scenario) -> dict[str, tuple[str, ...]]:
    return {
        "rest": tuple(k for k in KINDS if (sc.name, "rest", k) not in OWN),
        "grpc": tuple(
            k for k in KINDS if (sc.name, k) not in GRPC_SKIPPED and (sc.name, "grpc", k) not in OWN
        ),
    }


def _report(results: list[Result]) -> str:
    return "\n".join(
        f"{r.transport} {r.kind}: {r.outcome} (allowed {sorted(r.expected)}); then {r.recovery}"
        for r in results
        if not r.passed
    )


@pytest.fixture(scope="module")
def faults_stack() -> Iterator[Stack]:
    with stack("uvloop") as st:
        yield st


@pytest.mark.parametrize(
    "scenario", [s for s in SCENARIOS if s.name != "none"], ids=lambda s: str(s.name)
)
def test_fault(faults_stack: Stack, scenario: Scenario) -> None:
    results = run_scenario(faults_stack, scenario, _cells(scenario))
    assert results
    assert all(r.passed for r in results), f"{scenario.what}:\n{_report(results)}"


@pytest.mark.parametrize("name", ["slow-request", "slow-answer"])
def test_rest_backend_slow_large_body_bounded_by_backend_timeout(
    faults_stack: Stack, name: str
) -> None:
    """Regression: a REST backend taking a large relayed /infer request, or sending its answer,
    at 2 MiB/s (16 MiB: 8 s) held the request well past --backend-timeout (1.5 s): the deadline
    was armed again for each piece of the body (a 504 after 5.6 s) and lifted for the answer's
    body once its head was in (a 200 after 7.9 s; over gRPC both are a 504 at the timeout). Now
    the backend's waits, added up, are bounded: a 504, or the answer cut once its head went out."""
    sc = next(s for s in SCENARIOS if s.name == name)
    r = run_case(faults_stack, sc, "rest", "large")
    assert r.passed, _report([r])
    assert r.outcome.cls in ({"error"} if name == "slow-request" else {"error", "cut"})


def test_grpc_backend_that_stops_reading_mid_request_is_a_504(faults_stack: Stack) -> None:
    """Regression: a gRPC backend that stopped reading a 16 MiB request after 4 MiB left the
    proxy's call waiting forever (grpcio's deadline does not end a call blocked on sending; the
    client saw no answer at all). Now the call is cancelled just after --backend-timeout: 504."""
    sc = next(s for s in SCENARIOS if s.name == "backend-stops-reading")
    r = run_case(faults_stack, sc, "grpc", "large")
    assert r.passed, _report([r])
    assert r.outcome.status == "504", r.outcome


def test_grpc_backend_reconnects_within_a_second(faults_stack: Stack) -> None:
    """Regression: while a gRPC backend failed every connection, the proxy's channel tried
    again 1, 1.6, 2.6, ... s apart (gRPC's backoff, up to 2 minutes), so it went on answering
    503 that long after the backend was back. Now the attempts stay at most about a second
    apart, and a good request succeeds within that of the backend's return."""
    relay = faults_stack.relays["grpc"]
    assert faults_stack.run("grpc", "unary").cls == "ok"
    relay.set(Faults(refuse=True))
    relay.stop(reset=True)  # the channel's connection goes; every new one is reset
    relay.start()
    start = time.monotonic()
    first = len(relay.attempts)
    try:
        while time.monotonic() - start < 5.0:
            out = faults_stack.run("grpc", "unary")
            assert out.cls == "error" and out.status == "503", out
            time.sleep(0.1)
    finally:
        relay.clear()
    end = time.monotonic()
    attempts = relay.attempts[first:]
    assert attempts, "the proxy never tried to connect again"
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(attempts)]
    longest = max([*gaps, end - attempts[-1]])
    limit = RECONNECT_BACKOFF_MS[1] / 1000 * 1.2 + 0.3  # gRPC's jitter (20 %) and a margin
    assert longest <= limit, f"attempts {gaps} s apart, then none for {end - attempts[-1]:.2f} s"
    while (out := faults_stack.run("grpc", "unary")).cls != "ok":
        assert time.monotonic() - end < limit, f"not recovered: {out}"
        time.sleep(0.05)
