"""Runs the fuzz targets (tests/fuzz/targets/fuzz_<name>.py) under atheris, one after the other
(``make fuzz``; never part of ``make test``, which replays the committed corpus).

Each target starts from its committed corpus (tests/fuzz/corpus/<name>, read only) and keeps
what it finds in a working corpus (.cache/fuzz/corpus/<name>); crash reproducers go to
.cache/fuzz/crashes/<name>. A target runs until ``--seconds`` or ``--runs`` executions, with
libFuzzer's per-input timeout (a hang is a crash) and memory and input-size bounds. The table
printed at the end (and written as JSON to .cache/fuzz/results.json) gives per target the
executions, executions per second, corpus size and crashes; the exit status is 1 when any
target crashed or failed to run.

``--merge``: afterwards, minimise each target's committed corpus together with its working
corpus (libFuzzer's ``-merge=1`` on edge coverage alone: the smallest set of inputs that keeps
every edge) back into tests/fuzz/corpus/<name>. ``--merge-only``: that, without fuzzing.

Usage: python tests/fuzz/run_fuzz.py [--seconds S] [--runs N] [--merge | --merge-only] [target ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TARGETS = HERE / "targets"
CORPUS = HERE / "corpus"
WORK = ROOT / ".cache" / "fuzz"
#: libFuzzer's bounds: seconds per input (a hang), memory, input size
FLAGS = ["-timeout=10", "-rss_limit_mb=3072", "-print_final_stats=1"]
MAX_LEN = 16384


def names() -> list[str]:
    return sorted(p.stem.removeprefix("fuzz_") for p in TARGETS.glob("fuzz_*.py"))


def _stat(text: str, key: str) -> int:
    m = re.search(rf"stat::{key}:\s+(\d+)", text)
    return int(m.group(1)) if m else 0


def run(name: str, seconds: int, runs: int | None, max_len: int) -> dict[str, object]:
    corpus = WORK / "corpus" / name
    crashes = WORK / "crashes" / name
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    before = set(crashes.iterdir())
    cmd = [
        sys.executable,
        str(TARGETS / f"fuzz_{name}.py"),
        *FLAGS,
        f"-max_len={max_len}",
        f"-max_total_time={seconds}",
        f"-artifact_prefix={crashes}/",
        str(corpus),
        str(CORPUS / name),
    ]
    if runs:
        cmd.insert(2, f"-runs={runs}")
    log = WORK / f"{name}.log"
    started = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    executions = _stat(text, "number_of_executed_units")
    found = sorted(str(p) for p in set(crashes.iterdir()) - before)
    return {
        "target": name,
        "executions": executions,
        "seconds": round(elapsed, 1),
        "exec_per_s": round(executions / elapsed) if elapsed else 0,
        "corpus": len(list(corpus.iterdir())),
        "crashes": found,
        "rc": rc,
        "log": str(log),
    }


def merge(name: str) -> None:
    """Minimise the committed and working corpora into the committed one."""
    fresh = WORK / "merged" / name
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    (WORK / "corpus" / name).mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(TARGETS / f"fuzz_{name}.py"),
        "-merge=1",
        "-use_counters=0",  # edges only, not their hit counts: a corpus of hundreds, not thousands
        *FLAGS,
        f"-max_len={MAX_LEN}",
        str(fresh),
        str(CORPUS / name),
        str(WORK / "corpus" / name),
    ]
    with (WORK / f"{name}.merge.log").open("w") as out:
        subprocess.check_call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if not any(fresh.iterdir()):
        raise RuntimeError(f"merging the corpus of {name} kept nothing; see {name}.merge.log")
    target = CORPUS / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(fresh, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=None)
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "120")))
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--max-len", type=int, default=MAX_LEN, help="largest input, bytes")
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("--merge-only", action="store_true")
    args = parser.parse_args()
    chosen = args.targets or names()
    unknown = set(chosen) - set(names())
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {names()}")
    if args.merge_only:
        for name in chosen:
            merge(name)
            print(f"{name:12} corpus {len(list((CORPUS / name).iterdir())):>5}", flush=True)
        return 0
    results = []
    for name in chosen:
        result = run(name, args.seconds, args.runs, args.max_len)
        results.append(result)
        print(
            f"{name:12} {result['executions']:>10} runs  {result['exec_per_s']:>6}/s"
            f"  corpus {result['corpus']:>5}  crashes {len(result['crashes'])}  rc {result['rc']}",
            flush=True,
        )
        if args.merge and result["rc"] == 0:
            merge(name)
    (WORK / "results.json").write_text(json.dumps(results, indent=2))
    bad = [r for r in results if r["crashes"] or r["rc"] != 0]
    for r in bad:
        print(f"{r['target']}: rc {r['rc']}, crashes {r['crashes']}; see {r['log']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
