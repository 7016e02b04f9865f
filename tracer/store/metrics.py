"""The record store's health as metrics: what was written, what was not and why, how much
is waiting, how large the store is and how old its oldest record.

Read at scrape time from the store's writer (tracer/store/writer.py), so this module knows
nothing of SQL; a memory store has no writer and exports none of these.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tracer.store.writer import DROP_REASONS, StoreWriter


class StoreMetricsCollector:
    """`ttftscope_store_*` families of one store.

    >>> from prometheus_client import generate_latest
    >>> from tracer.record.clock import Clock
    >>> from tracer.store.sql import SqlStore
    >>> from tracer.store.url import parse_store_url
    >>> writer = StoreWriter(SqlStore(parse_store_url("sqlite:///tmp/unused.db")), Clock())
    >>> registry = CollectorRegistry(); _ = StoreMetricsCollector(registry, writer, "sqlite")
    >>> 'ttftscope_store_records_dropped_total{backend="sqlite",reason="queue_full"} 0.0' in (
    ...     generate_latest(registry).decode())
    True
    """

    def __init__(self, registry: CollectorRegistry | None, writer: StoreWriter,
                 backend: str, read_failures=lambda: 0) -> None:
        self._writer = writer
        self._backend = backend            # sqlite | postgresql: a closed set
        self._read_failures = read_failures
        if registry is not None:
            registry.register(self)

    def describe(self) -> list:
        return []

    def collect(self):
        stats, b = self._writer.stats, [self._backend]
        written = CounterMetricFamily("ttftscope_store_records_written",
                                      "Records written to the store (a rewrite counts again)",
                                      labels=["backend"])
        written.add_metric(b, stats.written)
        yield written
        dropped = CounterMetricFamily(
            "ttftscope_store_records_dropped",
            "Records the store could not take: its queue was full (the database slow, down "
            "or full for longer than the queue holds), or the record could not be encoded",
            labels=["backend", "reason"])
        for reason in DROP_REASONS:
            dropped.add_metric([self._backend, reason], stats.dropped[reason])
        yield dropped
        failures = CounterMetricFamily("ttftscope_store_write_failures",
                                       "Batch writes that failed (and were retried)",
                                       labels=["backend"])
        failures.add_metric(b, stats.failed_writes)
        yield failures
        reads = CounterMetricFamily("ttftscope_store_read_failures",
                                    "Reads answered from this process's memory alone because "
                                    "the store could not be read", labels=["backend"])
        reads.add_metric(b, self._read_failures())
        yield reads
        for name, doc, value in (
                ("ttftscope_store_pending_records", "Records waiting to be written",
                 self._writer.pending),
                ("ttftscope_store_up", "1 when the last write and retention pass succeeded",
                 int(stats.up)),
                ("ttftscope_store_size_bytes", "Space the stored records take (SQLite: pages "
                 "in use; PostgreSQL: the table with indexes), at the last retention pass",
                 stats.size_bytes),
                ("ttftscope_store_oldest_record_age_seconds",
                 "Age of the oldest stored record, at the last retention pass",
                 None if stats.oldest_end_unix_ns is None
                 else max(0.0, time.time() - stats.oldest_end_unix_ns / 1e9))):
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=["backend"])
                family.add_metric(b, float(value))
                yield family
