"""The store a front reads and writes when records are kept in a database: the in-process
ring (`TraceStore`) for what just finished, and an SQL store behind it for everything else.

Writes: `publish` (the tracer's inline sink) puts the record in the ring only, in
`Tracer.finish`, so a beacon or /ui right after the response finds it; the database gets
it from `writer` (`StoreWriter`), a deferred sink after the diagnosis, so the verdict is
in the first write. A record that changes afterwards (a beacon joined, a late engine span)
is written again through `persist`. `put` does both at once (the collector, whose records
are complete when it stores them).

Reads merge the two: the ring's copy of a record wins (it is the newest), the database
adds what the ring no longer holds, what an earlier run wrote and what other replicas
wrote. A database that cannot be read leaves the ring's answer, logged once per interval.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.sinks.store import TraceStore
from tracer.store.codec import decode
from tracer.store.sql import SqlStore
from tracer.store.writer import LOG_INTERVAL_S, StoreWriter

log = logging.getLogger("ttftscope.store")

# Records loaded from the database for a join (a beacon or a late span for a request the
# ring no longer holds), kept so the join's lookup and its change meet one object.
_LOADED_CAPACITY = 1024
# The most rows one read takes from the database (a window's own limit is usually smaller).
MAX_READ_ROWS = 100_000


class PersistentStore:
    """`TraceStore`'s interface over a ring and a database; see the module docstring."""

    name = "store"
    inline = True

    def __init__(self, sql: SqlStore, writer: StoreWriter, clock: Clock, *,
                 ring_capacity: int = 10_000) -> None:
        self.sql = sql
        self.writer = writer
        self.clock = clock
        self.ring = TraceStore(ring_capacity)
        self.capacity = ring_capacity
        self._loaded: OrderedDict[str, RequestRecord] = OrderedDict()
        writer.current = self._current
        writer.load = self._load_for_change
        self._last_read_error_log = 0.0
        self.read_failures = 0

    # -- writes ---------------------------------------------------------------------------

    def publish(self, record: RequestRecord) -> None:
        self.ring.put(record)

    def put(self, record: RequestRecord) -> None:
        self.ring.put(record)
        self.writer.submit(record)

    def persist(self, record: RequestRecord) -> None:
        """`record` changed after its first write: write it again."""
        self.writer.submit(record)

    def replace(self, request_id: str,
                change: Callable[[RequestRecord], RequestRecord]) -> RequestRecord | None:
        """As `TraceStore.replace`, then written again. A late engine span is joined on the
        event loop, which a slow or absent database must not hold: a record this process no
        longer holds is changed on the writer's thread instead (read, changed, written), and
        the answer is None, as for a record the ring has let go."""
        new = self.ring.replace(request_id, change)
        if new is None:
            old = self._loaded.get(request_id)
            if old is None:
                self.writer.submit_change(request_id, change)
                return None
            new = change(old)
            self._remember(new)
        self.writer.submit(new)
        return new

    def attach_client(self, trace_id: str, client: dict) -> RequestRecord | None:
        record = self.ring.attach_client(trace_id, client)
        if record is None:
            record = next((r for r in self._loaded.values() if r.trace_id == trace_id), None)
            if record is not None:
                record.client = client
        return record     # the caller persists it once it has judged the beacon

    def close(self, timeout_s: float = 10.0) -> bool:
        return self.writer.close(timeout_s)

    # -- reads ----------------------------------------------------------------------------

    def get_local(self, trace_id: str) -> RequestRecord | None:
        """This process's copy (the ring, or a record loaded earlier), never a database
        read: the beacon join runs on the event loop, and a beacon comes as its response
        ends, while the ring holds the record."""
        record = self.ring.get(trace_id)
        if record is None:
            record = next((r for r in self._loaded.values() if r.trace_id == trace_id), None)
        return record

    def get(self, trace_id: str) -> RequestRecord | None:
        """The newest record of `trace_id`, this process's or the database's (a read: call
        it off the event loop)."""
        record = self.get_local(trace_id)
        if record is None:
            record = self._load(lambda: self.sql.by_trace(trace_id))
            if record is not None:
                self._remember(record)
        return record

    def get_by_request_id(self, request_id: str) -> RequestRecord | None:
        record = self.ring.get_by_request_id(request_id)
        if record is None:
            record = self._loaded.get(request_id)
        if record is None:
            record = self._load(lambda: self.sql.by_request(request_id))
        return record

    def recent(self, n: int) -> list[RequestRecord]:
        return self.window(None, None, limit=n)

    def window(self, from_unix_ns: int | None, to_unix_ns: int | None, *, limit: int,
               order: str = "recent", model: str | None = None) -> list[RequestRecord]:
        """Requests that started in [from, to) (unbounded where None): the latest start
        first, or `slowest` TTFT first. The ring's and the database's, each request once."""
        if limit <= 0:
            return []
        lo = 0 if from_unix_ns is None else from_unix_ns
        hi = 2**62 if to_unix_ns is None else to_unix_ns
        mine = self.ring.window(lo, hi, limit=limit, order=order, model=model,
                                clock=self.clock)
        docs = self._read(lambda: self.sql.window(lo, hi, limit=min(limit, MAX_READ_ROWS),
                                                  order=order, model=model))
        return _merge(mine, self._decode_all(docs), limit, order)

    def overlapping(self, from_ns: int, to_ns: int) -> list[RequestRecord]:
        """As `TraceStore.overlapping` (perf ns, oldest finish first), over both."""
        mine = self.ring.overlapping(from_ns, to_ns)
        docs = self._read(lambda: self.sql.overlapping(
            self.clock.to_epoch_ns(from_ns), self.clock.to_epoch_ns(to_ns),
            limit=MAX_READ_ROWS))
        seen = {r.request_id for r in mine}
        out = mine + [r for r in self._decode_all(docs) if r.request_id not in seen]
        out.sort(key=lambda r: r.end_ns)
        return out

    def __len__(self) -> int:
        try:
            return self.sql.count()
        except Exception:
            return len(self.ring)

    # -- helpers --------------------------------------------------------------------------

    def _load_for_change(self, request_id: str) -> RequestRecord | None:
        doc = self.sql.by_request(request_id)    # a failure is the writer's to retry
        return None if doc is None else decode(doc, self.clock)

    def _current(self, record: RequestRecord) -> RequestRecord:
        return self.ring.get_by_request_id(record.request_id) or record

    def _load(self, fetch: Callable[[], str | None]) -> RequestRecord | None:
        doc = self._read(fetch)
        return None if not doc else self._decode(doc)

    def _decode(self, doc: str) -> RequestRecord | None:
        try:
            return decode(doc, self.clock)
        except Exception as exc:    # a row this version cannot read is skipped, not fatal
            self._read_failed(exc)
            return None

    def _decode_all(self, docs) -> list[RequestRecord]:
        return [r for doc in docs or () if (r := self._decode(doc)) is not None]

    def _read(self, fetch):
        try:
            return fetch()
        except Exception as exc:
            self._read_failed(exc)
            return None

    def _read_failed(self, exc: BaseException) -> None:
        self.read_failures += 1
        now = time.monotonic()
        if now - self._last_read_error_log >= LOG_INTERVAL_S:
            self._last_read_error_log = now
            log.warning("store %s: a read failed, answering from this process's recent "
                        "records only (%d failures so far): %s", self.sql.url.redacted,
                        self.read_failures, exc)

    def _remember(self, record: RequestRecord) -> None:
        self._loaded[record.request_id] = record
        while len(self._loaded) > _LOADED_CAPACITY:
            self._loaded.popitem(last=False)


def _merge(mine: list[RequestRecord], stored: list[RequestRecord], limit: int,
           order: str) -> list[RequestRecord]:
    seen = {r.request_id for r in mine}
    out = mine + [r for r in stored if r.request_id not in seen]
    if order == "slowest":
        out.sort(key=lambda r: -(r.ttft_ns or 0))
    else:
        out.sort(key=lambda r: -r.start_ns)
    return out[:limit]
