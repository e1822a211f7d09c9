"""The metric declarations: Prometheus naming, label bounds, and the Grafana dashboard uses only
declared metrics."""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from v2proxy.ops.metrics import (
    FAMILIES,
    REQUESTS,
    Histogram,
    ModelLabels,
    code_class,
)
from v2proxy.ops.metrics_export import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "v2proxy-dashboard.json"


def _exposed_names() -> set[str]:
    names = set()
    for f in FAMILIES:
        names.add(f.name)
        if f.kind == "histogram":
            names |= {f.name + s for s in ("_bucket", "_count", "_sum")}
    return names


def test_names_follow_prometheus_conventions() -> None:
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    for f in FAMILIES:
        assert re.fullmatch(r"v2proxy_[a-z0-9_]+", f.name), f.name
        assert (f.kind == "counter") == f.name.endswith("_total"), f.name
        if f.kind == "histogram":
            assert f.name.endswith("_seconds") and list(f.buckets) == sorted(f.buckets)
        assert "le" not in f.labels and f.help.endswith(".")


def test_dashboard_uses_only_declared_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v.get("query", "") for v in dash["templating"]["list"]]
    used = set(re.findall(r"\bv2proxy_[a-z0-9_]+", "\n".join(exprs)))
    assert used - _exposed_names() == set()
    # the panels: rates, errors, quantiles, backend latency, bytes, in flight, errors
    for name in (
        "v2proxy_requests_total",
        "v2proxy_request_duration_seconds_bucket",
        "v2proxy_backend_request_duration_seconds_bucket",
        "v2proxy_request_bytes_total",
        "v2proxy_response_bytes_total",
        "v2proxy_requests_in_flight",
        "v2proxy_backend_connection_errors_total",
    ):
        assert name in used, name


def test_model_labels_are_capped() -> None:
    labels = ModelLabels(limit=2)
    assert labels.label("", ok=False) == ""
    assert labels.label("a", ok=False) == "other"  # not answered yet
    assert labels.label("a", ok=True) == "a"
    assert labels.label("a", ok=False) == "a"
    assert labels.label("b", ok=True) == "b"
    assert labels.label("c", ok=True) == "other"  # the cap
    assert code_class(204) == "2xx" and code_class(499) == "4xx" and code_class(503) == "5xx"


@pytest.mark.parametrize("bounds", [(), (1.0,), (0.1, 1.0), tuple(0.001 * 2**k for k in range(15))])
def test_histogram_cell_counts_where_bisect_left_says(bounds: tuple[float, ...]) -> None:
    """Its search is written out (compiled, it stays in C): every bound, either side of it,
    the extremes and NaN land where ``bisect_left`` puts them."""
    values = [-math.inf, 0.0, math.inf, math.nan]
    for b in bounds:
        values += [b, math.nextafter(b, -math.inf), math.nextafter(b, math.inf)]
    for v in values:
        h = Histogram(bounds)
        h.observe(v)
        expected = [0] * (len(bounds) + 1)
        expected[bisect_left(bounds, v)] = 1
        assert h.counts == expected, (bounds, v)


def test_histogram_cell_buckets_and_exposition() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.counts == [2, 1, 1] and h.sum == 2.65
    m = Metrics(CollectorRegistry(), "builtin")
    m.store(REQUESTS).child("m", "infer", "rest", "builtin", "2xx").inc(3)
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    assert {f.name for f in FAMILIES} >= {
        fams[n].name + "_total" for n in fams if fams[n].type == "counter"
    }
    (sample,) = fams["v2proxy_requests"].samples
    assert sample.value == 3 and sample.labels["code_class"] == "2xx"
