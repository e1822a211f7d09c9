"""The process's metrics and their export to Prometheus: :class:`Metrics` holds a cell store per
declared family (:mod:`v2proxy.ops.metrics`) and makes the injected ``CollectorRegistry`` report
them; :class:`NullMetrics` is ``--metrics off``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import prometheus_client
import prometheus_client.values
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from v2proxy.ops.metrics import FAMILIES, Family, ModelLabels, Store

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
FLUSH_INTERVAL_S = 1.0


class Metrics:
    """The process's metric cells, exported through the injected ``registry``."""

    enabled = True

    def __init__(
        self, registry: CollectorRegistry, backend: str, multiprocess_dir: str | None = None
    ) -> None:
        self.registry = registry
        self.backend = backend
        self.models = ModelLabels()
        self.stores = {f.name: Store(f) for f in FAMILIES}
        self._sink: _MultiprocessSink | None = None
        self._timer: asyncio.TimerHandle | None = None
        if multiprocess_dir is None:
            registry.register(_Collector(self.stores))
        else:
            self._sink = _MultiprocessSink(self.stores)
            MultiProcessCollector(registry, multiprocess_dir)  # type: ignore[no-untyped-call]

    def store(self, family: Family) -> Store:
        return self.stores[family.name]

    def flush(self) -> None:
        if self._sink is not None:
            self._sink.flush()

    def start(self) -> None:
        """Flush every FLUSH_INTERVAL_S on the running loop (multiprocess mode only), after
        opening the process's files (:meth:`_MultiprocessSink.open_files`)."""
        if self._sink is None:
            return
        self._sink.open_files()
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.flush()
            self._timer = loop.call_later(FLUSH_INTERVAL_S, tick)

        self._timer = loop.call_later(FLUSH_INTERVAL_S, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()

    def exposition(self) -> bytes:
        """The Prometheus text of the whole process (of every worker with ``--workers N``)."""
        self.flush()
        return generate_latest(self.registry)


class NullMetrics:
    """``--metrics off``: the same interface, nothing recorded, no ``/metrics``."""

    enabled = False
    backend = ""

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def exposition(self) -> bytes:  # pragma: no cover - /metrics answers 404 first
        return b""


AnyMetrics = Metrics | NullMetrics


class _Collector(Collector):
    """The cells as metric families, at scrape time (one process)."""

    def __init__(self, stores: dict[str, Store]) -> None:
        self.stores = stores

    def collect(self) -> Iterator[Metric]:
        for store in self.stores.values():
            fam = store.family
            metric: Metric
            if fam.kind == "counter":
                metric = CounterMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, c in store.children.items():
                    metric.add_metric(labels, c.value)
            elif fam.kind == "gauge":
                metric = GaugeMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, c in store.children.items():
                    metric.add_metric(labels, c.value)
            else:
                metric = HistogramMetricFamily(fam.name, fam.help, labels=fam.labels)
                for labels, h in store.children.items():
                    total, buckets = 0, []
                    for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
                        total += n
                        le = prometheus_client.utils.floatToGoString(bound)  # type: ignore[no-untyped-call]
                        buckets.append((le, total))
                    metric.add_metric(labels, buckets, h.sum)
            yield metric


class _MultiprocessSink:
    """Flushes the cells' growth into prometheus_client's multiprocess values (one file per
    worker in ``PROMETHEUS_MULTIPROC_DIR``)."""

    def __init__(self, stores: dict[str, Store]) -> None:
        self.stores = stores
        self.metrics: dict[str, Any] = {}
        for name, store in stores.items():
            fam = store.family
            if fam.kind == "counter":
                m: Any = prometheus_client.Counter(name, fam.help, fam.labels, registry=None)
            elif fam.kind == "gauge":
                m = prometheus_client.Gauge(
                    name,
                    fam.help,
                    fam.labels,
                    registry=None,
                    multiprocess_mode=fam.multiprocess_mode,  # type: ignore[arg-type]
                )
            else:
                m = prometheus_client.Histogram(
                    name, fam.help, fam.labels, registry=None, buckets=fam.buckets
                )
            self.metrics[name] = m

    def open_files(self) -> None:
        """A value for every cell that exists now (at 0, as the one-process export shows it):
        prometheus_client opens each of the process's files with the first value of its kind,
        and a gauge that is back to 0 at every flush (requests in flight) would otherwise open
        its file whenever a flush first catches it non-zero: late, at random."""
        for name, store in self.stores.items():
            metric = self.metrics[name]
            for labels in store.children:
                metric.labels(*labels)

    def flush(self) -> None:
        for name, store in self.stores.items():
            kind = store.family.kind
            metric = self.metrics[name]
            for labels, cell in store.children.items():
                if kind == "histogram":
                    if cell.flushed_sum == cell.sum and cell.flushed_counts == cell.counts:
                        continue
                    child = metric.labels(*labels)
                    # prometheus_client has no public "add n observations": its child keeps one
                    # value per bucket (not cumulative) and one for the sum.
                    for i, n in enumerate(cell.counts):
                        if n != cell.flushed_counts[i]:
                            child._buckets[i].inc(n - cell.flushed_counts[i])
                    child._sum.inc(cell.sum - cell.flushed_sum)
                    cell.flushed_counts = list(cell.counts)
                    cell.flushed_sum = cell.sum
                elif cell.value != cell.flushed:
                    if kind == "gauge":
                        metric.labels(*labels).set(cell.value)
                    else:
                        metric.labels(*labels).inc(cell.value - cell.flushed)
                    cell.flushed = cell.value


def enable_multiprocess(path: str) -> None:
    """Make prometheus_client keep its values in files under ``path`` (call before forking the
    workers; they inherit it)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    prometheus_client.values.ValueClass = prometheus_client.values.get_value_class()  # type: ignore[no-untyped-call]


def process_gone(pid: int, path: str) -> None:
    """Drop a dead worker's live gauges (its counters stay in the sums)."""
    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
