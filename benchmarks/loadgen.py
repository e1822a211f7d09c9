"""Running the load generators (wrk for HTTP/1.1, h2load for gRPC) and reading their results."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from procs import run_tool

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "post.lua"


@dataclass
class Measurement:
    """What one load run gives; ``error`` is set when the numbers must not be used."""

    requests: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    errors: int = 0
    error: str | None = None
    tool: str = ""
    #: CPU used during the run, percent of one core: loadgen, proxy, backend
    cpu_pct: dict[str, float] = field(default_factory=dict)
    #: the same CPU seconds per request completed, in microseconds (utime + stime from /proc)
    cpu_us_per_req: dict[str, float] = field(default_factory=dict)
    #: req/s of each round, when this is the median of several runs (:func:`median_of`)
    round_rps: list[float] = field(default_factory=list)
    #: the proxy's CPU µs per request of each round (None: that round gave none)
    round_proxy_us: list[float | None] = field(default_factory=list)
    #: the p50 of each round, in milliseconds
    round_p50_ms: list[float | None] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def median_of(runs: list[Measurement]) -> Measurement:
    """Several runs of the same load as one: each figure the median of the runs' (so that one
    run disturbed by the machine does not decide), counts added up."""

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def med_dict(dicts: list[dict[str, float]]) -> dict[str, float]:
        keys = sorted({k for d in dicts for k in d})
        return {k: round(statistics.median(d[k] for d in dicts if k in d), 1) for k in keys}

    return Measurement(
        requests=sum(m.requests for m in runs),
        seconds=sum(m.seconds for m in runs),
        rps=statistics.median(m.rps for m in runs),
        p50_ms=med([m.p50_ms for m in runs]),
        p99_ms=med([m.p99_ms for m in runs]),
        mean_ms=med([m.mean_ms for m in runs]),
        errors=sum(m.errors for m in runs),
        tool=runs[0].tool,
        cpu_pct=med_dict([m.cpu_pct for m in runs]),
        cpu_us_per_req=med_dict([m.cpu_us_per_req for m in runs]),
        round_rps=[round(m.rps, 1) for m in runs],
        round_proxy_us=[m.cpu_us_per_req.get("proxy") for m in runs],
        round_p50_ms=[m.p50_ms for m in runs],
    )


def _msecs(value: float) -> str:
    """A duration for h2load, in whole milliseconds."""
    return f"{max(1, round(value * 1000))}ms"


def _secs(value: float) -> str:
    """A duration for wrk, which takes whole seconds only."""
    return f"{max(1, math.ceil(value))}s"


def one_line(text: str, limit: int = 240) -> str:
    """A tool's complaint as one short line (its last lines matter most)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = limit // 3
    return flat[:head] + " ... " + flat[-(limit - head) :]


def wrk(
    wrk_path: str,
    port: int,
    url_path: str,
    body_file: Path,
    headers: dict[str, str],
    connections: int,
    duration: float,
    threads: int = 1,
    request_timeout: float = 60.0,
) -> Measurement:
    """One wrk run of ``duration`` seconds at ``connections`` open connections."""
    env = {
        **os.environ,
        "BENCH_BODY": str(body_file),
        "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
    }
    cmd = [
        wrk_path,
        f"-t{min(threads, connections)}",
        f"-c{connections}",
        f"-d{_secs(duration)}",
        f"--timeout={_secs(request_timeout)}",
        "--latency",
        "-s",
        str(LUA_SCRIPT),
        f"http://127.0.0.1:{port}{url_path}",
    ]
    rc, out, err = run_tool(cmd, timeout=duration + request_timeout + 30, env=env)
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if rc != 0 or line is None:
        return Measurement(error=f"wrk rc={rc}: {one_line(err or out)}", tool="wrk")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    seconds = data["duration_us"] / 1e6
    m = Measurement(
        requests=data["requests"],
        seconds=seconds,
        rps=data["requests"] / seconds if seconds else 0.0,
        tool="wrk",
    )
    if data["requests"]:
        m.p50_ms = data["p50_us"] / 1000
        m.p99_ms = data["p99_us"] / 1000
        m.mean_ms = data["mean_us"] / 1000
    bad = {
        k: data[f"err_{k}"]
        for k in ("connect", "read", "write", "status", "timeout")
        if data[f"err_{k}"]
    }
    m.errors = sum(bad.values())
    if bad:
        m.error = "wrk counted " + ", ".join(f"{v} {k} errors" for k, v in bad.items())
    elif not data["requests"]:
        m.error = "no request completed"
    return m


_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed,"
    r" (\d+) errored, (\d+) timeout"
)
_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")


def h2load(
    h2load_path: str,
    port: int,
    url_path: str,
    body_file: Path,
    headers: dict[str, str],
    clients: int,
    streams: int,
    duration: float,
    warmup: float,
    log_file: Path,
) -> Measurement:
    """One h2load run (h2c, prior knowledge): ``clients`` connections x ``streams`` concurrent
    streams each, POSTing the framed body; latencies come from its per-request log."""
    cmd = [
        h2load_path,
        "-t1",
        f"-c{clients}",
        f"-m{streams}",
        f"-D{_msecs(duration)}",
        f"--warm-up-time={_msecs(warmup)}",
        "-d",
        str(body_file),
        f"--log-file={log_file}",
    ]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(f"http://127.0.0.1:{port}{url_path}")
    log_file.unlink(missing_ok=True)
    rc, out, err = run_tool(cmd, timeout=duration + warmup + 60)
    fin, req, st = _FINISHED.search(out), _REQUESTS.search(out), _STATUS.search(out)
    if rc != 0 or fin is None or req is None or st is None:
        return Measurement(error=f"h2load rc={rc}: {one_line(err or out)}", tool="h2load")
    seconds = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    succeeded, failed, errored, timeouts = (int(req.group(i)) for i in (4, 5, 6, 7))
    non2xx = sum(int(st.group(i)) for i in (2, 3, 4))
    m = Measurement(requests=succeeded, seconds=seconds, rps=float(fin.group(3)), tool="h2load")
    lat = _log_latencies(log_file)
    if lat.size:
        m.p50_ms = float(np.percentile(lat, 50)) / 1000
        m.p99_ms = float(np.percentile(lat, 99)) / 1000
        m.mean_ms = float(lat.mean()) / 1000
    m.errors = failed + errored + timeouts + non2xx
    if m.errors:
        m.error = (
            f"h2load counted {failed} failed, {errored} errored, {timeouts} timed out,"
            f" {non2xx} non-2xx"
        )
    elif not succeeded:
        m.error = "no request completed"
    return m


def _log_latencies(path: Path) -> np.ndarray:
    """Microseconds per successful request from h2load's --log-file."""
    values = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split("\t")
                if len(parts) >= 3 and parts[1].strip() == "200":
                    values.append(float(parts[2]))
    except OSError:
        pass
    return np.asarray(values, dtype=np.float64)
