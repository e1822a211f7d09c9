"""CPU per request in front of Triton: the summary table of the a-triton, b-triton and c-triton
scenarios of ``run.py``.

For each scenario and concurrency it gives one row per system: nginx (the anchor), the two floors of
a Python proxy (``py-relay``: bytes relayed, no HTTP work; ``floor-relay``: the least an HTTP-aware
relay on uvloop + httptools does; ``floor-path``: that relay with every duty of v2proxy's small
relayed /infer, the least version of v2proxy's path) and v2proxy. Each row has the proxy's CPU per
request (utime + stime from ``/proc/<pid>/stat`` of the proxy's whole process group, nginx's master
and worker included, over the load run, divided by the requests completed), req/s, p50 and Triton's
own CPU per request behind it, every figure the median of the scenario's rounds (the systems take
turns in each round), and its ratios to nginx's medians. Beside the CPU ratio goes the range of the
ratios round by round (each system against nginx's run of the same round), which says how far one
round can be trusted on a noisy machine.

Rows are found with a ``find(scenario, system, concurrency)`` callable that returns run.py's
``Row`` (or None); nginx and the floors come from the scenario's anchor (b-triton: a-triton,
where the same JSON bytes are relayed in the same rounds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: scenario -> (anchor scenario holding nginx and the floors, the v2proxy system's label)
TRITON_ROWS = {
    "a-triton": ("a-triton", "v2proxy-json"),
    "b-triton": ("a-triton", "v2proxy-binary"),
    "c-triton": ("c-triton", "v2proxy-binary"),
}
#: the systems of the anchor scenario shown beside v2proxy, nginx first
ANCHORED = ("nginx", "py-relay", "floor-relay", "floor-path")
#: anchor scenario -> the systems of ANCHORED it does not run (floorpath.py serves JSON /infer
#: bodies only)
NOT_RUN = {"c-triton": ("floor-path",)}

HEADER = [
    "scenario",
    "conc",
    "system",
    "proxy µs/req",
    "CPU x nginx",
    "CPU x nginx per round",
    "req/s",
    "req/s x nginx",
    "p50 ms",
    "p50 x nginx",
    "Triton µs/req",
]

#: figure -> (how it is read from a Row's measurement, how its rounds are)
_FIGURES: dict[str, tuple[Callable[[Any], float | None], Callable[[Any], list[Any]]]] = {
    "proxy_us": (lambda m: m.cpu_us_per_req.get("proxy"), lambda m: m.round_proxy_us),
    "rps": (lambda m: m.rps, lambda m: m.round_rps),
    "p50_ms": (lambda m: m.p50_ms, lambda m: m.round_p50_ms),
}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def round_ratios(ours: list[float | None], nginx: list[float | None]) -> list[float]:
    """The ratio of each round's figure to nginx's in the same round (rounds where either is
    missing left out)."""
    return [a / b for a, b in zip(ours, nginx, strict=False) if a is not None and b]


def _measured(row: Any) -> Any:
    return row.measurement if row is not None and row.ok else None


def _entry(sc: str, c: int, system: str, row: Any, nginx: Any) -> dict[str, Any]:
    m, n = _measured(row), _measured(nginx)
    out: dict[str, Any] = {"scenario": sc, "concurrency": c, "system": system}
    out["rounds"] = len(m.round_rps) if m is not None else 0
    out["triton_us"] = m.cpu_us_per_req.get("backend") if m is not None else None
    for name, (value, rounds) in _FIGURES.items():
        mine = value(m) if m is not None else None
        out[name] = mine
        out[f"{name}_over_nginx"] = ratio(mine, value(n) if n is not None else None)
        both = m is not None and n is not None
        out[f"{name}_over_nginx_rounds"] = round_ratios(rounds(m), rounds(n)) if both else []
    return out


def summarize(
    find: Callable[[str, str, int], Any], scenarios: list[str], concurrencies: list[int]
) -> list[dict[str, Any]]:
    """One entry per (Triton scenario run, concurrency, system): the medians, their ratios to
    nginx's (None when a side was not measured) and the ratios round by round."""
    out = []
    for sc in scenarios:
        if sc not in TRITON_ROWS:
            continue
        anchor, label = TRITON_ROWS[sc]
        for c in concurrencies:
            nginx = find(anchor, "nginx", c)
            if anchor == sc:
                skipped = NOT_RUN.get(anchor, ())
                out += [
                    _entry(sc, c, s, find(anchor, s, c), nginx)
                    for s in ANCHORED
                    if s not in skipped
                ]
            out.append(_entry(sc, c, label, find(sc, label, c), nginx))
    return out


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def rows(summary: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for s in summary:
        anchor = s["system"] == "nginx"
        out.append(
            [
                s["scenario"],
                str(s["concurrency"]),
                s["system"],
                _num(s["proxy_us"], ".0f"),
                "" if anchor else _num(s["proxy_us_over_nginx"], ".2f"),
                "" if anchor else _span(s["proxy_us_over_nginx_rounds"]),
                _num(s["rps"], ".0f"),
                "" if anchor else _num(s["rps_over_nginx"], ".2f"),
                _num(s["p50_ms"], ".3f"),
                "" if anchor else _num(s["p50_ms_over_nginx"], ".2f"),
                _num(s["triton_us"], ".0f"),
            ]
        )
    return out
