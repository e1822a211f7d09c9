"""The fault-injection matrix: v2proxy (a process) in front of ``v2proxy reference-server`` (a
process) through :class:`~tests.faults.fault_relay.Relay`, one relay and one proxy per backend
transport (REST, gRPC: :mod:`tests.faults.fault_procs`); scenarios x transports x request kinds
(:mod:`tests.faults.fault_requests`), each run once, classified, then a good request (the
recovery).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.faults.fault_procs import Stack, stack
from tests.faults.fault_relay import Faults, Relay
from tests.faults.fault_requests import (
    KINDS,
    LARGE_BYTES,
    RECOVERY_S,
    TIMEOUTS,
    TRANSPORTS,
    Outcome,
)

__all__ = [
    "KINDS",
    "SCENARIOS",
    "TRANSPORTS",
    "Result",
    "Scenario",
    "Stack",
    "environment_note",
    "run_case",
    "run_scenario",
    "stack",
]


@dataclass
class Scenario:
    """A fault: ``faults(kind)`` set on the relay before the request (None: none), ``during``
    run on the relay meanwhile (in a thread, after ``during_after`` s), ``down`` the relay
    stopped for the request; ``expect`` the outcome classes allowed per kind."""

    name: str
    what: str
    faults: Callable[[str], Faults | None] = lambda kind: None
    during: Callable[[Relay], None] | None = None
    during_after: float = 0.2
    down: bool = False
    expect: dict[str, set[str]] = field(default_factory=dict)


#: bytes after which a fault cuts a request or an answer: inside the body of each kind
_REQUEST_CUT = {"unary": 60, "large": 4 << 20, "stream": 60}
_ANSWER_CUT = {"unary": 40, "large": 4 << 20, "stream": 200}
OK = {"ok"}
FAILS = {"error"}
STREAM_FAILS = {"error", "cut"}
#: what each kind may end in when the fault leaves every request whole, or fails every one
ALL_OK = dict.fromkeys(KINDS, OK)
ALL_FAIL = dict.fromkeys(KINDS, FAILS)
#: a fault in the answer after its head: a large answer or a stream may end cut
ANSWER_FAULT = {"unary": FAILS, "large": FAILS | {"cut"}, "stream": STREAM_FAILS}


def _restart(relay: Relay) -> None:
    relay.stop(reset=True)
    relay.start()


SCENARIOS = [
    Scenario("none", "no fault", expect=ALL_OK),
    Scenario(
        "latency-small",
        "0.1 s added each way",
        lambda kind: Faults(latency_up=0.1, latency_down=0.1),
        expect=ALL_OK,
    ),
    Scenario(
        "latency-over-timeout",
        "answer delayed by --backend-timeout + 1 s",
        lambda kind: Faults(latency_down=max(TIMEOUTS.values()) + 1.0),
        expect=ALL_FAIL,
    ),
    Scenario(
        "reset-mid-request",
        "RST after part of the request",
        lambda kind: Faults(reset_request_after=_REQUEST_CUT[kind]),
        expect=ALL_FAIL,
    ),
    Scenario(
        "reset-mid-answer",
        "RST after part of the answer",
        lambda kind: Faults(reset_answer_after=_ANSWER_CUT[kind]),
        expect=ANSWER_FAULT,
    ),
    Scenario(
        "truncated-answer",
        "clean close (FIN) after part of the answer",
        lambda kind: Faults(truncate_answer_after=_ANSWER_CUT[kind]),
        expect=ANSWER_FAULT,
    ),
    Scenario(
        "backend-stops-reading",
        "the relay stops reading the request",
        lambda kind: Faults(stall_request_after=_REQUEST_CUT[kind]),
        expect=ALL_FAIL,
    ),
    Scenario(
        "backend-stops-sending",
        "the relay stops passing the answer on, the connection open",
        lambda kind: Faults(stall_answer_after=_ANSWER_CUT[kind]),
        expect=ANSWER_FAULT,
    ),
    Scenario(
        "bandwidth-fast",
        "64 MiB/s each way",
        lambda kind: Faults(bandwidth=64 << 20),
        expect=ALL_OK,
    ),
    Scenario(
        "bandwidth-slow",
        "2 MiB/s each way (the large request needs 8 s)",
        lambda kind: Faults(bandwidth=2 << 20),
        # a small request may wait behind the large one on the throttled link of a busy
        # machine: a 504 within --backend-timeout is then as right as a 200
        expect={"unary": OK | FAILS, "large": FAILS, "stream": OK},
    ),
    Scenario(
        "slow-request",
        "requests taken at 2 MiB/s (the large one needs 8 s)",
        lambda kind: Faults(bandwidth_up=2 << 20),
        expect={"unary": OK, "large": FAILS, "stream": OK},
    ),
    Scenario(
        "slow-answer",
        "answers at 2 MiB/s (the large answer needs 8 s)",
        lambda kind: Faults(bandwidth_down=2 << 20),
        expect={"unary": OK, "large": FAILS | {"cut"}, "stream": OK},
    ),
    Scenario("backend-down", "nothing listens", down=True, expect=ALL_FAIL),
    Scenario(
        "backend-restart",
        "restarted (RST to all) while the answer is delayed",
        lambda kind: Faults(latency_down=1.0),
        during=_restart,
        expect={"unary": FAILS, "large": FAILS, "stream": STREAM_FAILS},
    ),
]


@dataclass
class Result:
    scenario: str
    transport: str
    kind: str
    outcome: Outcome
    recovery: Outcome
    expected: set[str]
    #: seconds from the fault's end to the first good request that succeeded (0: the first)
    recovered_after: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome.cls in self.expected and self.recovery.cls == "ok"


def run_case(st: Stack, sc: Scenario, transport: str, kind: str) -> Result:
    """Arm the scenario, send one request, disarm, send one good request (the recovery)."""
    relay = st.relays[transport]
    faults = sc.faults(kind)
    if faults is not None:
        relay.set(faults)
    if sc.down:
        relay.stop()
    timer = None
    if sc.during is not None:
        timer = threading.Timer(sc.during_after, sc.during, (relay,))
        timer.start()
    try:
        outcome = st.run(transport, kind)
    finally:
        if timer is not None:
            timer.join()
        relay.clear()
        if sc.down:
            relay.start()
    cleared = time.monotonic()
    while True:  # good requests until one succeeds, for at most RECOVERY_S
        began = time.monotonic()
        recovery = st.run(transport, kind)
        if recovery.cls == "ok" or began - cleared > RECOVERY_S:
            break
        time.sleep(0.05)
    after = began - cleared if began - cleared > 0.05 else 0.0
    return Result(sc.name, transport, kind, outcome, recovery, sc.expect[kind], after)


def run_scenario(
    st: Stack, sc: Scenario, cells: dict[str, tuple[str, ...]] | None = None
) -> list[Result]:
    """The scenario's cases, each transport's in its own thread (their relays and proxies are
    apart); ``cells``: the kinds to run per transport (default: all)."""
    results: dict[str, list[Result]] = {t: [] for t in TRANSPORTS}

    def column(transport: str) -> None:
        for kind in (cells or {}).get(transport, KINDS if cells is None else ()):
            results[transport].append(run_case(st, sc, transport, kind))

    threads = [threading.Thread(target=column, args=(t,)) for t in TRANSPORTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for t in TRANSPORTS for r in results[t]]


def environment_note() -> str:
    timeouts = ", ".join(f"{t} {s:g} s" for t, s in TIMEOUTS.items())
    return f"--backend-timeout: {timeouts}; large = {LARGE_BYTES >> 20} MiB FP32"
