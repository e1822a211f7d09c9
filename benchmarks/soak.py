"""Soak: a fixed mixed load through v2proxy for a long time, and whether it stays flat.

``make soak`` (30 minutes) or ``make soak SOAK_MINUTES=5``; ``.venv/bin/python
benchmarks/soak.py --help``. For each configuration (``--workers 1``, then ``--workers 2``; each
gets its share of ``--minutes``) it starts ``v2proxy serve --backend builtin`` on 127.0.0.1 and
drives :data:`soak_load.SCHEDULE` through it from ``--clients`` paced clients at ``--rate``
operations per second in all (JSON, binary and gRPC infer, gRPC ModelStreamInfer and REST
generate_stream of the decoupled ``llm``, expected errors, a shared-memory register -> infer ->
unregister cycle). Every ``--interval`` seconds it samples the proxy's process tree (master and
workers: summed VmRSS, open fds, threads) and the operations of the interval (count, p50, p99,
errors: any answer other than the exact expected one).

After a warm-up (``--warmup`` of each configuration, default 20 %) it fits a least-squares line
to RSS, anonymous RSS, fds and threads and reports its change over the rest of the run in % of
its start; the target is flat: anonymous RSS (``RssAnon``: the heap, where a leak shows; VmRSS
also counts file-backed pages, which the kernel drops and faults back in with the machine's
page cache, so it is reported but not judged) and fds grow < 1 %. The latency drift compares
the median interval p50 and p99 of the first and last quarters after the warm-up. Writes
``benchmarks/results/soak.json`` (every sample) and ``soak.md``; exits 1 when a configuration
has errors, is not flat, or its proxy died.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import soak_load
from procs import HOST, Server, free_ports
from run import machine_info, md_table
from soak_stats import percentiles, sample_tree, trend

HERE = Path(__file__).resolve().parent
FLAT_PCT = 1.0
KEYS = ("rss_kib", "rss_anon_kib", "fds", "threads")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _interval(t: float, rec: soak_load.Recorder, root: int) -> dict[str, Any]:
    """One sample: the tree's figures now and the operations since the last sample."""
    done = rec.take()
    tree = sample_tree(root)
    every = [s for lat in done.latencies.values() for s in lat]
    p50, p99 = percentiles(every)
    return {
        "t": round(t, 2),
        "rss_kib": tree.rss_kib,
        "rss_anon_kib": tree.rss_anon_kib,
        "fds": tree.fds,
        "threads": tree.threads,
        "fd_kinds": dict(sorted(tree.fd_kinds.items())),
        "procs": [[p.pid, p.rss_kib, p.rss_anon_kib, p.threads, p.fds] for p in tree.procs],
        "ops": len(every),
        "errors": len(done.problems),
        "p50_ms": p50,
        "p99_ms": p99,
        "_done": done,
    }


async def _drive(
    http_port: int, grpc_port: int, root: int, seconds: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rec, stop = soak_load.Recorder(), asyncio.Event()
    samples = [_interval(0.0, rec, root)]
    load = asyncio.create_task(
        soak_load.run_clients(http_port, grpc_port, args.clients, args.rate, stop, rec)
    )
    start = time.monotonic()
    try:
        n = 1
        while (due := n * args.interval) <= seconds + 1e-6:
            await asyncio.sleep(max(0.0, start + due - time.monotonic()))
            if load.done():
                break
            late = int((time.monotonic() - start - due) // args.interval)
            if late > 0:  # this process was stalled: ticks missed are skipped, not piled up
                n += late
            samples.append(_interval(time.monotonic() - start, rec, root))
            s = samples[-1]
            if n % max(1, round(60 / args.interval)) == 0:
                log(
                    f"  t={s['t']:.0f}s rss={s['rss_kib'] / 1024:.1f} MiB"
                    f" (anon {s['rss_anon_kib'] / 1024:.1f}) fds={s['fds']}"
                    f" threads={s['threads']} ops={s['ops']} errors={s['errors']}"
                    f" p50={s['p50_ms']} ms p99={s['p99_ms']} ms"
                )
            n += 1
    finally:
        stop.set()
        await load
    tail = rec.take()  # operations after the last sample: their errors count too
    samples[-1]["_tail"] = tail
    return samples


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _drift(first: float | None, last: float | None) -> float | None:
    return None if not first or last is None else round((last - first) / first * 100, 1)


def summarize(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Totals by kind, problems, the trends after the warm-up and the latency drift."""
    kinds: dict[str, list[float]] = {}
    problems: Counter[tuple[str, str]] = Counter()
    for s in samples:
        for rec in (s.pop("_done"), s.pop("_tail", None)):
            if rec is None:
                continue
            for kind, lat in rec.latencies.items():
                kinds.setdefault(kind, []).extend(lat)
            problems.update(rec.problems)
    errors_by_kind = Counter(kind for kind, _ in problems.elements())
    by_kind = {}
    for kind, lat in sorted(kinds.items()):
        p50, p99 = percentiles(lat)
        by_kind[kind] = {"ops": len(lat), "errors": errors_by_kind[kind], "p50_ms": p50}
        by_kind[kind]["p99_ms"] = p99
    after = [s for s in samples if s["t"] >= warmup_s]
    t = [s["t"] for s in after]
    trends = {}
    for key in ("rss_kib", "rss_anon_kib", "fds", "threads"):
        tr = trend(t, [s[key] for s in after])
        trends[key] = None if tr is None else tr.as_dict()
    q = max(1, len(after) // 4)
    head, tail = after[:q], after[-q:]
    latency = {}
    for key in ("p50_ms", "p99_ms"):
        first = _median([s[key] for s in head])
        last = _median([s[key] for s in tail])
        latency[key] = {
            "first_quarter": first,
            "last_quarter": last,
            "drift_pct": _drift(first, last),
        }
    fd_change = {}
    if after:
        start_kinds, end_kinds = after[0]["fd_kinds"], samples[-1]["fd_kinds"]
        for kind in sorted(set(start_kinds) | set(end_kinds)):
            a, b = start_kinds.get(kind, 0), end_kinds.get(kind, 0)
            if a != b:
                fd_change[kind] = [a, b]
    pid_sets = {tuple(p[0] for p in s["procs"]) for s in samples}
    return {
        "ops": sum(len(v) for v in kinds.values()),
        "errors": sum(problems.values()),
        "by_kind": by_kind,
        "problems": [
            {"kind": k, "problem": p, "count": n} for (k, p), n in problems.most_common(20)
        ],
        "warmup_s": warmup_s,
        "first": {k: samples[0][k] for k in KEYS},
        "after_warmup": {k: after[0][k] for k in KEYS} if after else None,
        "end": {k: samples[-1][k] for k in KEYS},
        "trends": trends,
        "fd_kinds_changed_after_warmup": fd_change,
        "latency": latency,
        "process_sets": len(pid_sets),
    }


def verdict(summary: dict[str, Any]) -> list[str]:
    """What is wrong with one configuration's run (empty: it held)."""
    wrong = []
    if summary.get("error"):
        wrong.append(summary["error"])
    if summary.get("errors"):
        wrong.append(f"{summary['errors']} errors")
    for key in ("rss_anon_kib", "fds"):
        tr = summary.get("trends", {}).get(key)
        if tr is None:
            wrong.append(f"{key}: too few samples after the warm-up")
        elif tr["pct_over_window"] is not None and tr["pct_over_window"] >= FLAT_PCT:
            wrong.append(f"{key} grew {tr['pct_over_window']:.2f} % after the warm-up")
    if summary.get("process_sets", 1) != 1:
        wrong.append("the proxy's processes changed (a worker restarted)")
    return wrong


def run_config(workers: int, seconds: float, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    http_port, grpc_port = free_ports(2)
    cmd = [
        sys.executable, "-m", "v2proxy", "serve", "--backend", "builtin", "--host", HOST,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--workers", str(workers), "--event-loop", "uvloop", "--log-level", "warning",
        "--restricted-api", "none", *args.v2proxy_args.split(),
    ]  # fmt: skip
    server = Server(
        name=f"v2proxy-w{workers}",
        cmd=cmd,
        log_path=tmp / f"v2proxy-w{workers}.log",
        ready_urls=[f"http://{HOST}:{http_port}/v2/health/ready"],
        ready_ports=[grpc_port],
    )
    result: dict[str, Any] = {"workers": workers, "seconds": seconds, "command": cmd[2:]}
    server.start()
    try:
        if not server.wait_ready(60):
            result["error"] = server.error
            return result
        assert server.proc is not None
        log(f"workers={workers}: {seconds / 60:.1f} min, proxy pid {server.proc.pid}")
        samples = asyncio.run(_drive(http_port, grpc_port, server.proc.pid, seconds, args))
        result.update(summarize(samples, args.warmup * seconds))
        result["samples"] = samples
        if not server.alive():
            result["error"] = f"the proxy exited during the run: {server.log_tail()}"
    finally:
        server.stop()
        text = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
        result["log_tracebacks"] = text.count("Traceback")
        result["log_lines"] = len(text.splitlines())
    return result


def _mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def _three(r: dict[str, Any], key: str) -> str:
    first, after, end = r["first"][key], r["after_warmup"][key], r["end"][key]
    return f"{_mib(first)} / {_mib(after)} / {_mib(end)}"


def _pct(tr: dict[str, Any] | None) -> str:
    return "-" if not tr or tr["pct_over_window"] is None else f"{tr['pct_over_window']:+.2f} %"


def report_md(results: list[dict[str, Any]], info: dict[str, Any], args: argparse.Namespace) -> str:
    rows, kinds = [], []
    for r in results:
        if "trends" not in r:
            rows.append([str(r["workers"]), f"error: {r.get('error')}"] + ["-"] * 12)
            continue
        tr, lat = r["trends"], r["latency"]
        rows.append(
            [
                str(r["workers"]),
                f"{r['seconds'] / 60:.1f}",
                str(r["ops"]),
                str(r["errors"]),
                _three(r, "rss_kib"),
                _pct(tr["rss_kib"]),
                _three(r, "rss_anon_kib"),
                _pct(tr["rss_anon_kib"]),
                f"{r['first']['fds']} / {r['end']['fds']}"
                f" ({tr['fds']['min']:.0f}-{tr['fds']['max']:.0f})",
                _pct(tr["fds"]),
                f"{r['first']['threads']} / {r['end']['threads']}",
                f"{lat['p50_ms']['first_quarter']} → {lat['p50_ms']['last_quarter']}",
                f"{lat['p99_ms']['first_quarter']} → {lat['p99_ms']['last_quarter']}",
                "; ".join(verdict(r)) or "flat, no errors",
            ]
        )
        for kind, k in r["by_kind"].items():
            kinds.append(
                [
                    str(r["workers"]),
                    kind,
                    str(k["ops"]),
                    str(k["errors"]),
                    str(k["p50_ms"]),
                    str(k["p99_ms"]),
                ]
            )
    header = (
        "workers", "min", "ops", "errors", "RSS MiB start / after warm-up / end",
        "RSS slope", "anon RSS MiB start / after warm-up / end", "anon RSS slope",
        "fds start / end (range)", "fd slope", "threads start / end",
        "p50 ms drift", "p99 ms drift", "verdict",
    )  # fmt: skip
    return "\n".join(
        [
            f"Soak ({info['date']}, commit {info['git_commit'][:10]}): {info['nproc']} x"
            f" {info['cpu_model']}; `v2proxy serve --backend builtin`, {args.clients} clients,"
            f" {args.rate:g} ops/s, samples every {args.interval:g} s, slopes after a warm-up of"
            f" {args.warmup:.0%} (least squares, change over the rest of the run).",
            "",
            md_table(header, rows),
            "",
            md_table(("workers", "kind", "ops", "errors", "p50 ms", "p99 ms"), kinds),
            "",
        ]
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--minutes", type=float, default=30.0, help="whole run, shared by the configurations"
    )
    p.add_argument("--workers", default="1,2", help="configurations, one after the other (1,2)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (4)")
    p.add_argument("--rate", type=float, default=100.0, help="operations per second in all (100)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples (10)")
    p.add_argument(
        "--warmup", type=float, default=0.2, help="fraction left out of the slopes (0.2)"
    )
    p.add_argument("--v2proxy-args", default="", help="extra `v2proxy serve` arguments")
    p.add_argument("--output", type=Path, default=HERE / "results" / "soak.json")
    return p.parse_args(argv)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    configs = [int(w) for w in args.workers.split(",")]
    seconds = args.minutes * 60 / len(configs)
    info = machine_info({})
    results = []
    with tempfile.TemporaryDirectory(prefix="v2proxy-soak-") as tmp:
        for workers in configs:
            results.append(run_config(workers, seconds, args, Path(tmp)))
            log(f"workers={workers}: {'; '.join(verdict(results[-1])) or 'flat, no errors'}")
    md = report_md(results, info, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": info,
        "args": {k: str(v) for k, v in vars(args).items()},
        # where the proxy's code came from when not the working tree (a snapshot of a commit)
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "runs": results,
    }
    args.output.write_text(json.dumps(payload, indent=1))
    args.output.with_suffix(".md").write_text(md)
    print(md)
    log(f"wrote {args.output} and {args.output.with_suffix('.md')}")
    return 1 if any(verdict(r) for r in results) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
