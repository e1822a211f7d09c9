"""Run the fault-injection matrix once (tests/faults/fault_matrix.py: v2proxy in front of
``v2proxy reference-server`` through a fault-injecting relay, REST and gRPC backends, unary,
large and streamed requests) and print the table "scenario x outcome" (status, elapsed) in
Markdown, for the reliability page (docs/reliability.md).

    .venv/bin/python tools/fault_table.py [--loop uvloop|asyncio] [--only SCENARIO,...]

Each cell: the outcome's status and time, then the recovery request's (a good request right
after the fault is cleared; "after X s" when good requests failed that long first). The REST
and gRPC columns run at the same time (each has its own relay and proxy). Exit status 1 when
any case is not as expected.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.fault_matrix import (
    KINDS,
    SCENARIOS,
    TRANSPORTS,
    Result,
    environment_note,
    run_scenario,
    stack,
)


def cell(r: Result) -> str:
    o = r.outcome
    mark = "" if r.passed else " **UNEXPECTED**"
    then = r.recovery.status
    if r.recovered_after:
        then += f" after {r.recovered_after:.1f} s"
    return f"{o.status} {o.elapsed:.2f} s ({o.cls}); then {then}{mark}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--verbose", action="store_true", help="print each case's detail")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    scenarios = [s for s in SCENARIOS if not only or s.name in only]
    results: list[Result] = []
    started = time.monotonic()
    with stack(args.loop) as st:
        for sc in scenarios:
            for r in run_scenario(st, sc):
                results.append(r)
                if args.verbose:
                    print(f"{sc.name} {r.transport} {r.kind}: {r.outcome} | {r.recovery}")
    cols = [(t, k) for t in TRANSPORTS for k in KINDS]
    print(
        f"\nFault injection ({environment_note()}, event loop {args.loop}), "
        f"{time.monotonic() - started:.0f} s\n"
    )
    print("| scenario | " + " | ".join(f"{t} {k}" for t, k in cols) + " |")
    print("|---|" + "---|" * len(cols))
    by = {(r.scenario, r.transport, r.kind): r for r in results}
    for sc in scenarios:
        row = [cell(by[(sc.name, t, k)]) for t, k in cols]
        print(f"| {sc.name} ({sc.what}) | " + " | ".join(row) + " |")
    bad = [r for r in results if not r.passed]
    for r in bad:
        print(f"UNEXPECTED {r.scenario} {r.transport} {r.kind}: {r.outcome} | then {r.recovery}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
