"""CPU per request in front of Triton: the summary table of the a-triton, b-triton and c-triton
scenarios of ``run.py``.

For each scenario and concurrency it puts side by side the proxy CPU per request (utime + stime
from ``/proc/<pid>/stat`` of the proxy's whole process group, nginx's master and worker
included, over the load run, divided by the requests completed) of nginx, ``py-relay`` and
v2proxy, the ratios v2proxy / nginx of CPU, req/s and p50, and Triton's own CPU per request
(behind nginx and behind v2proxy) for context. Rows are found with a ``find(scenario, system,
concurrency)`` callable that returns run.py's ``Row`` (or None); nginx and py-relay come from the
scenario's anchor (b-triton: a-triton, where the same JSON bytes are relayed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: scenario -> (anchor scenario holding nginx and py-relay, the v2proxy system's label)
TRITON_ROWS = {
    "a-triton": ("a-triton", "v2proxy-json"),
    "b-triton": ("a-triton", "v2proxy-binary"),
    "c-triton": ("c-triton", "v2proxy-binary"),
}

HEADER = [
    "scenario",
    "conc",
    "nginx µs/req",
    "py-relay µs/req",
    "v2proxy µs/req",
    "CPU v2proxy/nginx",
    "CPU py-relay/nginx",
    "req/s v2proxy/nginx",
    "p50 v2proxy/nginx",
    "Triton µs/req (nginx/v2proxy)",
]


def _cpu(row: Any, who: str) -> float | None:
    if row is None or not row.ok or row.measurement is None:
        return None
    value: float | None = row.measurement.cpu_us_per_req.get(who)
    return value


def _field(row: Any, name: str) -> float | None:
    if row is None or not row.ok or row.measurement is None:
        return None
    value: float | None = getattr(row.measurement, name)
    return value


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(
    find: Callable[[str, str, int], Any], scenarios: list[str], concurrencies: list[int]
) -> list[dict[str, Any]]:
    """One entry per (Triton scenario run, concurrency), with µs/req and ratios (None when a
    side was not measured)."""
    out = []
    for sc in scenarios:
        if sc not in TRITON_ROWS:
            continue
        anchor, label = TRITON_ROWS[sc]
        for c in concurrencies:
            nginx, relay, ours = (
                find(anchor, "nginx", c),
                find(anchor, "py-relay", c),
                find(sc, label, c),
            )
            n_cpu, r_cpu, v_cpu = _cpu(nginx, "proxy"), _cpu(relay, "proxy"), _cpu(ours, "proxy")
            out.append(
                {
                    "scenario": sc,
                    "system": label,
                    "concurrency": c,
                    "nginx_us": n_cpu,
                    "py_relay_us": r_cpu,
                    "v2proxy_us": v_cpu,
                    "cpu_v2proxy_over_nginx": _ratio(v_cpu, n_cpu),
                    "cpu_py_relay_over_nginx": _ratio(r_cpu, n_cpu),
                    "rps_v2proxy_over_nginx": _ratio(_field(ours, "rps"), _field(nginx, "rps")),
                    "p50_v2proxy_over_nginx": _ratio(
                        _field(ours, "p50_ms"), _field(nginx, "p50_ms")
                    ),
                    "triton_us_behind_nginx": _cpu(nginx, "backend"),
                    "triton_us_behind_v2proxy": _cpu(ours, "backend"),
                }
            )
    return out


def rows(summary: list[dict[str, Any]]) -> list[list[str]]:
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    return [
        [
            f"{s['scenario']} ({s['system']})",
            str(s["concurrency"]),
            us(s["nginx_us"]),
            us(s["py_relay_us"]),
            us(s["v2proxy_us"]),
            x(s["cpu_v2proxy_over_nginx"]),
            x(s["cpu_py_relay_over_nginx"]),
            x(s["rps_v2proxy_over_nginx"]),
            x(s["p50_v2proxy_over_nginx"]),
            f"{us(s['triton_us_behind_nginx'])}/{us(s['triton_us_behind_v2proxy'])}",
        ]
        for s in summary
    ]
