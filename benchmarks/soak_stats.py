"""What the soak measures of a process tree, and the figures it reduces its samples to.

- :func:`proc_tree` and :func:`sample_tree` read ``/proc`` only (no psutil): the process and
  its descendants (``/proc/PID/task/*/children``), each one's ``VmRSS``, ``RssAnon`` (its
  anonymous part: the heap, what a leak grows; file-backed pages come and go with the machine's
  page cache) and ``Threads`` from ``/proc/PID/status`` and its open file descriptors (entries
  of ``/proc/PID/fd``), summed over the tree, and what the fds point at (:func:`fd_kind`). A
  process that exits while it is read is skipped.
- :func:`trend` fits a least-squares line to ``(t, value)`` samples and states its change over
  the fitted window as a percentage of the fitted value at the window's start: the soak's
  "slope as % over the run". :func:`percentiles` gives p50/p99 of a list of latencies.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PROC = Path("/proc")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except OSError:
            continue
        found.extend(int(p) for p in text.split())
    return found


def proc_tree(root: int) -> list[int]:
    """``root`` and every live descendant, parents before children."""
    order, pending = [], [root]
    while pending:
        pid = pending.pop(0)
        if pid in order or not (PROC / str(pid)).exists():
            continue
        order.append(pid)
        pending.extend(_children(pid))
    return order


@dataclass
class ProcSample:
    """One process's figures at one instant."""

    pid: int
    rss_kib: int
    rss_anon_kib: int
    threads: int
    fds: int
    fd_kinds: Counter[str] = field(default_factory=Counter)


@dataclass
class TreeSample:
    """The figures of a whole tree at one instant (sums) and of each process."""

    rss_kib: int = 0
    rss_anon_kib: int = 0
    threads: int = 0
    fds: int = 0
    fd_kinds: Counter[str] = field(default_factory=Counter)
    procs: list[ProcSample] = field(default_factory=list)


_NUMBERED = re.compile(r"\d+")


def fd_kind(target: str) -> str:
    """What an fd points at, with the numbers that differ between instances replaced:
    ``socket``, ``pipe``, ``anon_inode:[eventpoll]``, ``/dev/shm/v2proxy_N``..."""
    if target.startswith(("socket:", "pipe:")):
        return target.split(":", 1)[0]
    return _NUMBERED.sub("N", target)


def read_proc(pid: int) -> ProcSample | None:
    """VmRSS and RssAnon (KiB), Threads and the open fds of one process; None when it is gone."""
    folder = PROC / str(pid) / "fd"
    try:
        status = (PROC / str(pid) / "status").read_text()
        fds = os.listdir(folder)
    except OSError:
        return None
    kinds: Counter[str] = Counter()
    for fd in fds:
        try:
            kinds[fd_kind(os.readlink(folder / fd))] += 1
        except OSError:
            continue
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = int(fields.get("VmRSS", "0 kB").split()[0])
    anon = int(fields.get("RssAnon", "0 kB").split()[0])
    threads = int(fields.get("Threads", "0").strip())
    return ProcSample(pid, rss, anon, threads, len(fds), kinds)


def sample_tree(root: int) -> TreeSample:
    out = TreeSample()
    for pid in proc_tree(root):
        s = read_proc(pid)
        if s is None:
            continue
        out.procs.append(s)
        out.rss_kib += s.rss_kib
        out.rss_anon_kib += s.rss_anon_kib
        out.threads += s.threads
        out.fds += s.fds
        out.fd_kinds.update(s.fd_kinds)
    return out


@dataclass
class Trend:
    """A least-squares line over a window of samples."""

    samples: int
    start: float  # fitted value at the window's first sample
    end: float  # fitted value at its last
    per_hour: float  # slope, units per hour
    pct: float | None  # (end - start) / start * 100: the change over the window
    minimum: float
    maximum: float

    def as_dict(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "fit_start": round(self.start, 2),
            "fit_end": round(self.end, 2),
            "per_hour": round(self.per_hour, 2),
            "pct_over_window": None if self.pct is None else round(self.pct, 3),
            "min": self.minimum,
            "max": self.maximum,
        }


def trend(t: list[float], values: list[float]) -> Trend | None:
    """The least-squares line of ``values`` over ``t`` (seconds); None with fewer than 3."""
    if len(t) < 3:
        return None
    x, y = np.asarray(t, dtype=np.float64), np.asarray(values, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    start, end = intercept + slope * x[0], intercept + slope * x[-1]
    pct = (end - start) / start * 100 if start else None
    return Trend(
        len(t),
        float(start),
        float(end),
        float(slope * 3600),
        None if pct is None else float(pct),
        float(y.min()),
        float(y.max()),
    )


def percentiles(latencies_s: list[float]) -> tuple[float | None, float | None]:
    """(p50, p99) in milliseconds, None when there is nothing to rank."""
    if not latencies_s:
        return None, None
    a = np.asarray(latencies_s, dtype=np.float64) * 1000
    p50, p99 = np.percentile(a, [50, 99])
    return round(float(p50), 3), round(float(p99), 3)
