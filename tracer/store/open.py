"""One store from the settings: the composition root's single way to get one."""
from __future__ import annotations

from pathlib import Path

from tracer.record.clock import Clock
from tracer.sinks.store import TraceStore
from tracer.store.persistent import PersistentStore
from tracer.store.sql import SqlStore
from tracer.store.url import parse_store_url
from tracer.store.writer import Retention, StoreWriter


def open_store(url: str | None, *, clock: Clock, data_dir: Path | str | None = None,
               ring_capacity: int = 10_000, retention: Retention = Retention(),
               flush_interval_s: float | None = None,
               retention_interval_s: float | None = None) -> TraceStore | PersistentStore:
    """`memory` → a `TraceStore`; an SQLite or PostgreSQL URL → a `PersistentStore`, its
    schema checked and migrated (`StoreError` when it cannot be used: a wrong DSN or
    password, a database that does not answer, a store newer than this code).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     store = open_store(None, clock=Clock(), data_dir=d)
    ...     print(type(store).__name__, store.sql.url.path.name); store.close()
    PersistentStore records.sqlite3
    True
    """
    parsed = parse_store_url(url, data_dir)
    if parsed.scheme == "memory":
        return TraceStore(ring_capacity, clock=clock)
    sql = SqlStore(parsed)
    sql.open()
    kwargs = {}
    if flush_interval_s is not None:
        kwargs["flush_interval_s"] = flush_interval_s
    if retention_interval_s is not None:
        kwargs["retention_interval_s"] = retention_interval_s
    writer = StoreWriter(sql, clock, retention=retention, **kwargs)
    writer.start()
    return PersistentStore(sql, writer, clock, ring_capacity=ring_capacity)


def describe_store(store) -> str:
    """Where `store` keeps records, for a front's start-up line (no password).

    >>> describe_store(TraceStore(500))
    'memory (the newest 500 requests; gone on restart)'
    """
    if isinstance(store, PersistentStore):
        retention = store.writer.retention
        size = ("" if retention.max_bytes is None
                else f", at most {retention.max_bytes / 2**20:g} MiB")
        return f"{store.sql.url.redacted} (kept {retention.max_age_s / 86400:g} days{size})"
    return f"memory (the newest {store.capacity} requests; gone on restart)"
