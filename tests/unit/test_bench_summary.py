"""The summary of the ``-triton`` scenarios of ``make bench`` (``benchmarks/cpu_summary.py``)
from rows that are medians of alternating rounds (``loadgen.median_of``): every system's
medians, their ratios to nginx's, the ratios round by round, and the table's rows."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import cpu_summary  # noqa: E402
import loadgen  # noqa: E402
import run  # noqa: E402


@dataclass
class _Row:
    measurement: loadgen.Measurement | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.measurement is not None


def _rounds(*figures: tuple[float, ...]) -> _Row:
    """A row from rounds of (proxy µs/req, req/s, p50 ms, Triton µs/req)."""
    runs = [
        loadgen.Measurement(
            requests=1000,
            rps=rps,
            p50_ms=p50,
            cpu_us_per_req={"proxy": us, "backend": triton},
        )
        for us, rps, p50, triton in figures
    ]
    return _Row(loadgen.median_of(runs))


#: (scenario, system) -> rounds of (proxy µs/req, req/s, p50 ms, Triton µs/req) at c=16; the
#: second round is a slow spell that hits every system
ROUNDS = {
    ("a-triton", "nginx"): [(30, 3000, 5.0, 300), (60, 1500, 9.0, 400), (32, 3100, 5.2, 310)],
    ("a-triton", "py-relay"): [(33, 3000, 5.1, 300), (63, 1400, 9.9, 400), (31, 3000, 5.0, 300)],
    ("a-triton", "floor-relay"): [(36, 2900, 5.5, 300), (90, 1200, 12, 420), (35, 3000, 5.3, 305)],
    ("a-triton", "floor-path"): [(50, 2800, 5.6, 310), (99, 1100, 13, 420), (48, 2900, 5.4, 305)],
    ("a-triton", "v2proxy-json"): [(90, 2700, 6, 320), (150, 1000, 15, 450), (96, 2790, 6.5, 330)],
    ("b-triton", "v2proxy-binary"): [
        (120, 2400, 7, 330),
        (200, 900, 16, 460),
        (128, 2480, 7.8, 340),
    ],
}
ROWS: dict[tuple[str, str, int], Any] = {(*k, 16): _rounds(*r) for k, r in ROUNDS.items()}


def _find(scenario: str, system: str, conc: int) -> Any:
    return ROWS.get((scenario, system, conc))


def test_median_of_keeps_each_round_beside_the_medians() -> None:
    m = ROWS[("a-triton", "v2proxy-json", 16)].measurement
    assert (m.rps, m.p50_ms, m.cpu_us_per_req) == (2700, 6.5, {"backend": 330, "proxy": 96})
    assert m.round_rps == [2700, 1000, 2790]
    assert m.round_proxy_us == [90, 150, 96]
    assert m.round_p50_ms == [6.0, 15.0, 6.5]
    assert m.requests == 3000


def test_each_system_beside_nginx_with_the_ratios_of_the_medians_and_of_each_round() -> None:
    summary = cpu_summary.summarize(_find, ["a-triton", "b-triton", "d-triton"], [16])
    assert [(s["scenario"], s["system"]) for s in summary] == [
        ("a-triton", "nginx"),
        ("a-triton", "py-relay"),
        ("a-triton", "floor-relay"),
        ("a-triton", "floor-path"),
        ("a-triton", "v2proxy-json"),
        ("b-triton", "v2proxy-binary"),  # its nginx and floors are a-triton's, not repeated
    ]
    by = {s["system"]: s for s in summary}
    ours, floor = by["v2proxy-json"], by["floor-relay"]
    assert (ours["proxy_us"], ours["rounds"], ours["triton_us"]) == (96, 3, 330)
    # the ratio of the medians (96 / 32), not the median of the rounds' ratios (90 / 30)
    assert ours["proxy_us_over_nginx"] == pytest.approx(3.0)
    assert ours["proxy_us_over_nginx_rounds"] == pytest.approx([3.0, 2.5, 3.0])
    assert ours["rps_over_nginx"] == pytest.approx(2700 / 3000)
    assert ours["p50_ms_over_nginx"] == pytest.approx(6.5 / 5.2)
    assert floor["proxy_us_over_nginx"] == pytest.approx(36 / 32)
    assert floor["proxy_us_over_nginx_rounds"] == pytest.approx([36 / 30, 1.5, 35 / 32])
    assert floor["p50_ms_over_nginx"] == pytest.approx(5.5 / 5.2)
    assert by["floor-path"]["proxy_us_over_nginx"] == pytest.approx(50 / 32)
    assert by["v2proxy-binary"]["proxy_us_over_nginx"] == pytest.approx(128 / 32)
    assert by["nginx"]["proxy_us_over_nginx"] == 1.0


def test_a_side_not_measured_gives_no_ratio() -> None:
    rows = dict(ROWS)
    rows[("a-triton", "floor-relay", 16)] = _Row(None, "error: floor-relay did not start")
    del rows[("a-triton", "py-relay", 16)]
    summary = cpu_summary.summarize(lambda *k: rows.get(k), ["a-triton"], [16])
    by = {s["system"]: s for s in summary}
    for system in ("py-relay", "floor-relay"):
        assert by[system]["proxy_us"] is None
        assert by[system]["proxy_us_over_nginx"] is None
        assert by[system]["proxy_us_over_nginx_rounds"] == []
    assert by["v2proxy-json"]["proxy_us_over_nginx"] == pytest.approx(3.0)


def test_the_table_rows() -> None:
    summary = cpu_summary.summarize(_find, ["a-triton"], [16])
    summary[1]["proxy_us"] = summary[1]["proxy_us_over_nginx"] = None
    table = cpu_summary.rows(summary)
    assert all(len(r) == len(cpu_summary.HEADER) for r in table)
    assert table[0] == ["a-triton", "16", "nginx", "32", "", "", "3000", "", "5.200", "", "310"]
    assert table[1][3:5] == ["-", "-"]
    assert table[2] == [
        "a-triton", "16", "floor-relay", "36", "1.12", "1.09-1.50", "2900", "0.97", "5.500",
        "1.06", "305",
    ]  # fmt: skip
    assert table[3][2:5] == ["floor-path", "50", "1.56"]
    assert table[4][2:6] == ["v2proxy-json", "96", "3.00", "2.50-3.00"]


def test_a_triton_takes_at_least_three_rounds_even_when_quick() -> None:
    a_triton = next(s for s in run.SCENARIOS if s.id == "a-triton")
    assert run.QUICK.rounds < 3 <= a_triton.min_rounds
    systems = {label for label, _ in a_triton.systems}
    assert {"nginx", "floor-relay", "floor-path", "v2proxy-json"} <= systems


def test_c_triton_has_no_floor_path_row() -> None:
    """floorpath.py serves JSON bodies only: c-triton (binary) neither runs nor shows it."""
    c_triton = next(s for s in run.SCENARIOS if s.id == "c-triton")
    assert "floor-path" not in {label for label, _ in c_triton.systems}
    summary = cpu_summary.summarize(_find, ["c-triton"], [16])
    assert [s["system"] for s in summary] == ["nginx", "py-relay", "floor-relay", "v2proxy-binary"]
