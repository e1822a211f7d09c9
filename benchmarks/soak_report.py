"""The soak's report: what its samples come to, the verdict, the Markdown tables.

- :func:`totals`: operations, errors and p50/p99 by kind, and the errors' texts.
- :func:`figures`: least-squares trends of RSS, anonymous RSS, fds and threads after the warm-up
  and over the last half of that window alone, the latency drift (median interval p50/p99 of the
  first and last quarters after the warm-up), the fd kinds that changed, the backend's figures.
- :func:`verdict`: what is wrong with one configuration (errors; anonymous RSS or fds grown by
  :data:`FLAT_PCT` % or more by all three measures: the line over the window, the line over its
  last half, the median of its last quarter on that of its first; for fds only when, at rest
  after the run, the proxy also holds more fds than before the load, its metrics files left out
  (:func:`held_at_rest`), since the samples catch connections in flight; a process lost or
  restarted; a start that failed). Empty: it held.
- :func:`report_md`: the tables of ``soak.md``.
- :func:`tracemalloc_compare`: what grew between the snapshots of ``soak.py --tracemalloc``.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from run import md_table
from soak_stats import Trend, percentiles, trend

FLAT_PCT = 1.0
KEYS = ("rss_kib", "rss_anon_kib", "fds", "threads")


def _as_dict(tr: Trend | None) -> dict[str, Any] | None:
    return None if tr is None else tr.as_dict()


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _drift(first: float | None, last: float | None) -> float | None:
    return None if not first or last is None else round((last - first) / first * 100, 1)


def totals(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Operations and errors by kind, and the errors' texts, from the samples' recorders
    (taken out of the samples)."""
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
    return {
        "ops": sum(len(v) for v in kinds.values()),
        "errors": sum(problems.values()),
        "by_kind": by_kind,
        "problems": [
            {"kind": k, "problem": p, "count": n} for (k, p), n in problems.most_common(20)
        ],
    }


def figures(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """The trends after the warm-up (and in its last half), the latency drift, the fd kinds
    that changed, the backend's figures: from the samples alone (``--report`` recomputes them
    from a saved run)."""
    after = [s for s in samples if s["t"] >= warmup_s]
    t = [s["t"] for s in after]
    trends = {key: _as_dict(trend(t, [s[key] for s in after])) for key in KEYS}
    # the second half of the window alone: a leak grows in both halves, a one-time step (a file
    # opened lazily, a cache filled once) after the warm-up shows in one half only
    late = [s for s in after if s["t"] >= (after[0]["t"] + after[-1]["t"]) / 2] if after else []
    late_trends = {
        key: _as_dict(trend([s["t"] for s in late], [s[key] for s in late])) for key in KEYS
    }
    q = max(1, len(after) // 4)
    head, tail = after[:q], after[-q:]
    # medians of the first and last quarters: robust to the +-1-2 fds that connections opening
    # and closing at the sampling instant add, which a least-squares line on ~75 fds can mistake
    # for a 1 % trend
    quarters = {}
    for key in KEYS:
        first_q = _median([s[key] for s in head])
        last_q = _median([s[key] for s in tail])
        quarters[key] = {"first": first_q, "last": last_q, "pct": _drift(first_q, last_q)}
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
    backend = None
    if after and "backend" in after[0]:
        backend = {
            "first": samples[0]["backend"],
            "after_warmup": after[0]["backend"],
            "end": samples[-1]["backend"],
            "trends": {k: _as_dict(trend(t, [s["backend"][k] for s in after])) for k in KEYS},
        }
    return {
        "warmup_s": warmup_s,
        "first": {k: samples[0][k] for k in KEYS},
        "after_warmup": {k: after[0][k] for k in KEYS} if after else None,
        "end": {k: samples[-1][k] for k in KEYS},
        "trends": trends,
        "trends_last_half": late_trends,
        "quarter_medians": quarters,
        "fd_kinds_changed_after_warmup": fd_change,
        "latency": latency,
        "process_sets": len({tuple(p[0] for p in s["procs"]) for s in samples}),
        "backend_figures": backend,
    }


def _grew(tr: dict[str, Any]) -> bool:
    return tr["pct_over_window"] is not None and tr["pct_over_window"] >= FLAT_PCT


def verdict(summary: dict[str, Any]) -> list[str]:
    """What is wrong with one configuration's run (empty: it held)."""
    wrong = []
    if summary.get("error"):
        wrong.append(summary["error"])
    if summary.get("errors"):
        wrong.append(f"{summary['errors']} errors")
    for key in ("rss_anon_kib", "fds"):
        tr = summary.get("trends", {}).get(key)
        late = summary.get("trends_last_half", {}).get(key)
        quarter = summary.get("quarter_medians", {}).get(key, {})
        if tr is None or late is None:
            wrong.append(f"{key}: too few samples after the warm-up")
        elif key == "fds" and summary.get("at_rest") and not held_at_rest(summary):
            continue  # a trend of in-flight connections: at rest, none more than before
        elif _grew(tr) and _grew(late) and (quarter.get("pct") or 0) >= FLAT_PCT:
            wrong.append(
                f"{key} grew {tr['pct_over_window']:.2f} % after the warm-up"
                f" ({late['pct_over_window']:.2f} % in its last half, median of the last"
                f" quarter {quarter['pct']:+.1f} % on the first)"
            )
    if summary.get("process_sets", 1) != 1:
        wrong.append("the proxy's processes changed (a worker restarted)")
    return wrong


def held_at_rest(summary: dict[str, Any]) -> int:
    """How many more fds the proxy holds at rest after the run than before the load, leaving
    out the Prometheus multiprocess files (``.../v2proxy-metrics-*/KIND_PID.db``) that each
    worker opens once, the first time it has a value of that kind to publish."""
    rest, first = summary["at_rest"]["fd_kinds"], summary["samples"][0]["fd_kinds"]
    return sum(
        max(0, n - first.get(k, 0))
        for k, n in rest.items()
        if not ("-metrics-" in k and k.endswith("_N.db"))
    )


def _at_rest(r: dict[str, Any]) -> str:
    """The proxy at rest after the run against the first sample (before any load)."""
    rest, first = r["at_rest"], r["samples"][0]
    kinds = sorted(set(rest["fd_kinds"]) | set(first["fd_kinds"]))
    changed = [
        f"{k} {first['fd_kinds'].get(k, 0)} → {rest['fd_kinds'].get(k, 0)}"
        for k in kinds
        if first["fd_kinds"].get(k, 0) != rest["fd_kinds"].get(k, 0)
    ]
    return (
        f"- workers={r['workers']}, at rest (the load stopped, its connections closed, 8 s"
        f" later): fds {first['fds']} before the load → {rest['fds']}"
        f" ({'; '.join(changed) or 'no kind changed'}), anon RSS"
        f" {_mib(rest['rss_anon_kib'])} MiB, threads {rest['threads']}"
    )


def _quarters(r: dict[str, Any], key: str) -> str:
    q = r.get("quarter_medians", {}).get(key)
    return "-" if not q else f"{q['first']:g} → {q['last']:g}"


def _mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def _three(r: dict[str, Any], key: str) -> str:
    first, after, end = r["first"][key], r["after_warmup"][key], r["end"][key]
    return f"{_mib(first)} / {_mib(after)} / {_mib(end)}"


def _pct(tr: dict[str, Any] | None) -> str:
    return "-" if not tr or tr["pct_over_window"] is None else f"{tr['pct_over_window']:+.2f} %"


def _slopes(r: dict[str, Any], key: str) -> str:
    """The slope after the warm-up, and that of its last half."""
    return f"{_pct(r['trends'][key])} ({_pct(r['trends_last_half'][key])})"


def _reconnect(args: argparse.Namespace) -> str:
    every = getattr(args, "reconnect_every", 0)
    return f"each on new connections every {every} operations" if every else "keep-alive"


def _code(info: dict[str, Any]) -> str:
    """Which code the proxy ran: a snapshot of the commit (PYTHONPATH), or the working tree."""
    commit = info["git_commit"][:10]
    if info.get("pythonpath"):
        return f"v2proxy as of commit {commit}"
    dirty = info.get("src_uncommitted_changes", 0)
    return f"commit {commit}" + (f" + {dirty} uncommitted files under src/" if dirty else "")


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
                _slopes(r, "rss_kib"),
                _three(r, "rss_anon_kib"),
                _slopes(r, "rss_anon_kib"),
                f"{r['first']['fds']} / {r['end']['fds']}"
                f" ({tr['fds']['min']:.0f}-{tr['fds']['max']:.0f};"
                f" {_quarters(r, 'fds')})",
                _slopes(r, "fds"),
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
        "RSS slope (last half)", "anon RSS MiB start / after warm-up / end",
        "anon RSS slope (last half)", "fds start / end (range; quarter medians)",
        "fd slope (last half)",
        "threads start / end",
        "p50 ms drift", "p99 ms drift", "verdict",
    )  # fmt: skip
    backend = {
        "builtin": "builtin",
        "rest": "http://REFERENCE` (a `v2proxy reference-server` over REST)",
        "grpc": "grpc://REFERENCE` (a `v2proxy reference-server` over gRPC)",
    }[args.backend].rstrip("`")
    notes = [
        f"- workers={r['workers']}: reference server RSS {_three(b, 'rss_kib')} MiB"
        f" (anon slope {_pct(b['trends']['rss_anon_kib'])}), fds"
        f" {b['first']['fds']} / {b['end']['fds']}"
        for r in results
        if (b := r.get("backend_figures"))
    ]
    return "\n".join(
        [
            f"Soak ({info['date']}, {_code(info)}): {info['nproc']} x"
            f" {info['cpu_model']}; `v2proxy serve --backend {backend}`, {args.clients} clients"
            f" ({_reconnect(args)}),"
            f" {args.rate:g} ops/s, samples every {args.interval:g} s, slopes after a warm-up of"
            f" {args.warmup:.0%} (least squares, change over the rest of the run).",
            "",
            md_table(header, rows),
            "",
            md_table(("workers", "kind", "ops", "errors", "p50 ms", "p99 ms"), kinds),
            "",
            *notes,
            *[_at_rest(r) for r in results if r.get("at_rest") and r.get("samples")],
        ]
    )


def tracemalloc_compare(folder: Path, top: int = 12) -> int:
    """Print, per process, the allocation sites whose size grew most from its second snapshot
    (the first one is taken before the load has warmed the process up) to its last."""
    import tracemalloc

    by_pid: dict[str, list[Path]] = {}
    for snap in sorted(folder.rglob("*.tracemalloc")):
        by_pid.setdefault(snap.stem.split("-")[0], []).append(snap)
    for pid, snaps in sorted(by_pid.items()):
        if len(snaps) < 3:
            continue
        first = tracemalloc.Snapshot.load(str(snaps[1]))
        last = tracemalloc.Snapshot.load(str(snaps[-1]))
        diff = last.compare_to(first, "lineno")
        total = sum(d.size_diff for d in diff)
        print(f"pid {pid}: {snaps[1].name} -> {snaps[-1].name}: {total / 1024:+.1f} KiB traced")
        for d in diff[:top]:
            print(f"  {d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks  {d.traceback}")
    return 0
