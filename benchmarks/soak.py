"""Soak: a fixed mixed load through v2proxy for a long time, and whether it stays flat.

``make soak`` (30 minutes) or ``make soak SOAK_MINUTES=5``; ``.venv/bin/python
benchmarks/soak.py --help``. For each configuration (``--workers 1``, then ``--workers 2``; each
gets its share of ``--minutes``) it starts ``v2proxy serve --backend builtin`` (``--backend
rest|grpc``: in front of a ``v2proxy reference-server``) on 127.0.0.1 and
drives :data:`soak_load.SCHEDULE` through it from ``--clients`` paced clients at ``--rate``
operations per second in all (JSON, binary and gRPC infer, gRPC ModelStreamInfer and REST
generate_stream of the decoupled ``llm``, expected errors, a shared-memory register -> infer ->
unregister cycle). Every ``--interval`` seconds it samples the proxy's process tree (master and
workers: summed VmRSS, open fds, threads) and the operations of the interval (count, p50, p99,
errors: any answer other than the exact expected one).

After a warm-up (``--warmup`` of each configuration, default 20 %) it fits a least-squares line
to RSS, anonymous RSS, fds and threads and reports its change over the rest of the run in % of
its start (and that of the last half of it alone). The target is flat: anonymous RSS
(``RssAnon``: the heap, where a leak shows; VmRSS also counts file-backed pages, which the kernel
drops and faults back in with the machine's page cache, so it is reported but not judged) and
fds grow < 1 %, or, when they grow more, the last half alone grows < 1 % (a one-time step after
the warm-up, such as a metrics file a worker opens the first time it has a gauge to publish, is
not a leak; a leak grows in both halves). The latency drift compares
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
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import soak_load
from procs import HOST, Server, free_ports
from run import machine_info
from soak_report import KEYS, figures, report_md, totals, tracemalloc_compare, verdict
from soak_stats import percentiles, proc_tree, sample_tree

HERE = Path(__file__).resolve().parent
AT_REST_S = 8.0  # after the load: longer than the proxy's --client-idle-timeout (5 s)
TRACE = HERE / "soak_trace"  # its sitecustomize.py takes the tracemalloc snapshots


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _interval(t: float, rec: soak_load.Recorder, root: int, backend: int | None) -> dict[str, Any]:
    """One sample: the tree's figures now and the operations since the last sample."""
    done = rec.take()
    tree = sample_tree(root)
    every = [s for lat in done.latencies.values() for s in lat]
    p50, p99 = percentiles(every)
    sample: dict[str, Any] = {}
    if backend is not None:
        b = sample_tree(backend)
        sample["backend"] = {k: getattr(b, k) for k in KEYS}
    return sample | {
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
    http_port: int,
    grpc_port: int,
    roots: tuple[int, int | None],
    seconds: float,
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rec, stop = soak_load.Recorder(), asyncio.Event()
    samples = [_interval(0.0, rec, *roots)]
    ops = soak_load.schedule_for(args.backend)
    load = asyncio.create_task(
        soak_load.run_clients(
            http_port, grpc_port, args.clients, args.rate, stop, rec, ops, args.reconnect_every
        )
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
            samples.append(_interval(time.monotonic() - start, rec, *roots))
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
    # at rest: the clients have closed their connections; after the proxy's idle timeout (5 s)
    # nothing of them may remain, so fds here are free of the in-flight jitter of the samples
    await asyncio.sleep(AT_REST_S)
    rest = sample_tree(roots[0])
    at_rest = {k: getattr(rest, k) for k in KEYS} | {
        "fd_kinds": dict(sorted(rest.fd_kinds.items()))
    }
    return samples, at_rest


def _reference(tmp: Path, workers: int) -> tuple[Server, str, str]:
    """The reference server behind the proxy, and its REST and gRPC URLs."""
    http_port, grpc_port = free_ports(2)
    cmd = [sys.executable, "-m", "v2proxy", "reference-server", "--host", HOST]
    cmd += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    server = Server(
        name=f"reference-w{workers}",
        cmd=cmd,
        log_path=tmp / f"reference-w{workers}.log",
        ready_urls=[f"http://{HOST}:{http_port}/v2/health/ready"],
        ready_ports=[grpc_port],
    )
    return server, f"http://{HOST}:{http_port}", f"grpc://{HOST}:{grpc_port}"


def run_config(workers: int, seconds: float, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"workers": workers, "seconds": seconds, "backend": args.backend}
    backend_url, ref = "builtin", None
    if args.backend != "builtin":
        ref, rest_url, grpc_url = _reference(tmp, workers)
        backend_url = rest_url if args.backend == "rest" else grpc_url
        ref.start()
        if not ref.wait_ready(60):
            ref.stop()
            result["error"] = ref.error
            return result
    try:
        return _run_proxy(workers, seconds, args, tmp, backend_url, ref, result)
    finally:
        if ref is not None:
            ref.stop()


def _run_proxy(
    workers: int,
    seconds: float,
    args: argparse.Namespace,
    tmp: Path,
    backend_url: str,
    ref: Server | None,
    result: dict[str, Any],
) -> dict[str, Any]:
    http_port, grpc_port = free_ports(2)
    cmd = [
        sys.executable, "-m", "v2proxy", "serve", "--backend", backend_url, "--host", HOST,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--workers", str(workers), "--event-loop", "uvloop", "--log-level", "warning",
        "--restricted-api", "none", *args.v2proxy_args.split(),
    ]  # fmt: skip
    env = None
    if args.tracemalloc:
        folder = args.tracemalloc / f"w{workers}"
        folder.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(p for p in (str(TRACE), os.environ.get("PYTHONPATH")) if p)
        env = os.environ | {"PYTHONPATH": path, "V2PROXY_SOAK_TRACEMALLOC": str(folder)}
    server = Server(
        name=f"v2proxy-w{workers}",
        cmd=cmd,
        log_path=tmp / f"v2proxy-w{workers}.log",
        ready_urls=[f"http://{HOST}:{http_port}/v2/health/ready"],
        ready_ports=[grpc_port],
        env=env,
    )
    result["command"] = cmd[2:]
    server.start()
    try:
        if not server.wait_ready(60):
            result["error"] = server.error
            return result
        assert server.proc is not None
        _wait_workers(server.proc.pid, workers)
        log(f"workers={workers}: {seconds / 60:.1f} min, proxy pid {server.proc.pid}")
        roots = (server.proc.pid, None if ref is None or ref.proc is None else ref.proc.pid)
        samples, result["at_rest"] = asyncio.run(_drive(http_port, grpc_port, roots, seconds, args))
        result.update(totals(samples))
        result.update(figures(samples, args.warmup * seconds))
        result["samples"] = samples
        if not server.alive():
            result["error"] = f"the proxy exited during the run: {server.log_tail()}"
        elif ref is not None and not ref.alive():
            result["error"] = f"the reference server exited during the run: {ref.log_tail()}"
    finally:
        server.stop()
        text = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
        result["log_tracebacks"] = text.count("Traceback")
        result["log_lines"] = len(text.splitlines())
    return result


def _wait_workers(root: int, workers: int, timeout: float = 30.0) -> None:
    """Until the supervisor has forked its workers (the first one to listen answers the ready
    probe), so that the first connections do not all go to it."""
    if workers < 2:
        return
    deadline = time.monotonic() + timeout
    while len(proc_tree(root)) < workers + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--minutes", type=float, default=30.0, help="whole run, shared by the configurations"
    )
    p.add_argument("--workers", default="1,2", help="configurations, one after the other (1,2)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (4)")
    p.add_argument("--rate", type=float, default=100.0, help="operations per second in all (100)")
    p.add_argument(
        "--reconnect-every",
        type=int,
        default=250,
        help="operations after which a client opens new connections (250; 0: never)",
    )
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples (10)")
    p.add_argument(
        "--warmup", type=float, default=0.2, help="fraction left out of the slopes (0.2)"
    )
    p.add_argument(
        "--backend",
        choices=("builtin", "rest", "grpc"),
        default="builtin",
        help="the proxy's backend: the builtin models in-process (default), or a v2proxy"
        " reference-server over REST or gRPC",
    )
    p.add_argument("--v2proxy-args", default="", help="extra `v2proxy serve` arguments")
    p.add_argument("--output", type=Path, default=HERE / "results" / "soak.json")
    p.add_argument(
        "--tracemalloc",
        type=Path,
        metavar="DIR",
        help="run the proxy under tracemalloc, a snapshot of each process every minute in"
        " DIR/wN (slower; for finding a leak, not for the figures)",
    )
    p.add_argument(
        "--tracemalloc-compare",
        type=Path,
        metavar="DIR",
        help="run nothing: the allocation sites that grew most between each process's second"
        " and last snapshots in DIR (and its subfolders)",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="run nothing: recompute the figures and verdicts of a saved soak.json from its"
        " samples, rewrite it and its .md",
    )
    return p.parse_args(argv)


def _report(path: Path) -> int:
    payload = json.loads(path.read_text())
    saved = payload["args"]
    args = argparse.Namespace(
        clients=int(saved["clients"]),
        rate=float(saved["rate"]),
        interval=float(saved["interval"]),
        warmup=float(saved["warmup"]),
        reconnect_every=int(saved.get("reconnect_every", 0)),
        backend=saved.get("backend", "builtin"),
    )
    for run in payload["runs"]:
        if run.get("samples"):
            run.update(figures(run["samples"], run["warmup_s"]))
    return _write(payload, path, args)


def _write(payload: dict[str, Any], path: Path, args: argparse.Namespace) -> int:
    results = payload["runs"]
    md = report_md(results, payload["machine"] | {"pythonpath": payload.get("pythonpath")}, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    path.with_suffix(".md").write_text(md)
    print(md)
    log(f"wrote {path} and {path.with_suffix('.md')}")
    return 1 if any(verdict(r) for r in results) else 0


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report:
        return _report(args.report)
    if args.tracemalloc_compare:
        return tracemalloc_compare(args.tracemalloc_compare)
    signal.signal(signal.SIGTERM, _on_signal)
    configs = [int(w) for w in args.workers.split(",")]
    seconds = args.minutes * 60 / len(configs)
    info = machine_info({})
    results = []
    with tempfile.TemporaryDirectory(prefix="v2proxy-soak-") as tmp:
        for workers in configs:
            results.append(run_config(workers, seconds, args, Path(tmp)))
            log(f"workers={workers}: {'; '.join(verdict(results[-1])) or 'flat, no errors'}")
    payload = {
        "machine": info,
        "args": {k: str(v) for k, v in vars(args).items()},
        # where the proxy's code came from when not the working tree (a snapshot of a commit)
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "runs": results,
    }
    return _write(payload, args.output, args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
