"""The in-process trace store: the last N finished requests, by trace id and request id."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord


class TraceStore:
    """A bounded, thread-safe ring buffer of `RequestRecord`s.

    Records are kept in arrival order; past `capacity` the oldest is evicted from every
    index, so memory stays bounded whatever the traffic. Two requests may share a trace id
    (a client reusing its traceparent): `get(trace_id)` then returns the newest.

    >>> from tracer.record.request_record import RequestRecord
    >>> store = TraceStore(capacity=2)
    >>> for i in range(3):
    ...     store.put(RequestRecord(f"r{i}", f"{i + 1:032x}", f"{i + 1:016x}", "m", "chat", 0, 1))
    >>> len(store), store.get_by_request_id("r0"), [r.request_id for r in store.recent(5)]
    (2, None, ['r2', 'r1'])
    """

    name = "store"   # in the tracer's sink failure counts
    # Published inside `Tracer.finish`, not by the background worker (tracer.core.sink):
    # a beacon that arrives as the stream ends must find its record (the probe join), and
    # so must `/ui` right after a request. A put is a lock and a few dict writes, ~0.5 µs
    # (measured on 20k records at capacity, evicting): no dearer than the hand-off to the
    # worker (~0.3 µs), and it spares every store reader a drain.
    inline = True

    def __init__(self, capacity: int = 10_000, *, clock: Clock | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.clock = Clock() if clock is None else clock   # records' perf ns -> unix ns
        self._lock = threading.Lock()
        self._by_request_id: OrderedDict[str, RequestRecord] = OrderedDict()
        self._request_id_by_trace_id: dict[str, str] = {}   # newest request of each trace

    def publish(self, record: RequestRecord) -> None:
        self.put(record)

    def put(self, record: RequestRecord) -> None:
        with self._lock:
            old = self._by_request_id.pop(record.request_id, None)
            if old is not None:
                self._unindex_trace(old)
            self._by_request_id[record.request_id] = record
            self._request_id_by_trace_id[record.trace_id] = record.request_id
            while len(self._by_request_id) > self.capacity:
                _, evicted = self._by_request_id.popitem(last=False)
                self._unindex_trace(evicted)

    def _unindex_trace(self, record: RequestRecord) -> None:
        # Only the newest request of a trace is indexed; an older one leaving changes nothing.
        if self._request_id_by_trace_id.get(record.trace_id) == record.request_id:
            del self._request_id_by_trace_id[record.trace_id]

    def get(self, trace_id: str) -> RequestRecord | None:
        with self._lock:
            request_id = self._request_id_by_trace_id.get(trace_id)
            return None if request_id is None else self._by_request_id.get(request_id)

    # This process's copy: the same as `get` here; a database-backed store answers it
    # without a database read, for the event loop's lookups (the beacon join).
    get_local = get

    def get_by_request_id(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            return self._by_request_id.get(request_id)

    def recent(self, n: int) -> list[RequestRecord]:
        """Up to `n` records, newest first."""
        if n <= 0:
            return []
        with self._lock:
            newest_first = reversed(self._by_request_id.values())
            return [record for record, _ in zip(newest_first, range(n))]

    def window(self, from_unix_ns: int | None, to_unix_ns: int | None, *, limit: int,
               order: str = "recent", model: str | None = None,
               clock: Clock | None = None) -> list[RequestRecord]:
        """Up to `limit` records of requests that started in [from, to) (unix ns; None:
        unbounded), the latest start first, or with `order="slowest"` the largest TTFT first
        (those with a first token only). The same contract as the database's
        (tracer/store/sql.py, `window`).

        >>> store = TraceStore(clock=Clock(wall_ns=0, perf_ns=0))
        >>> for i, ttft in enumerate((5, 9, 7)):
        ...     store.put(RequestRecord(f"r{i}", f"{i + 1:032x}", "1" * 16, "m", "chat",
        ...                             i * 10, i * 10 + 5, ttft_ns=ttft))
        >>> [r.request_id for r in store.window(0, 25, limit=5, order="slowest")]
        ['r1', 'r2', 'r0']
        >>> [r.request_id for r in store.window(10, None, limit=1)]
        ['r2']
        """
        if limit <= 0:
            return []
        offset = (self.clock if clock is None else clock).to_epoch_ns(0)
        lo = -2**63 if from_unix_ns is None else from_unix_ns - offset
        hi = 2**63 if to_unix_ns is None else to_unix_ns - offset
        with self._lock:
            records = list(self._by_request_id.values())
        picked = (r for r in reversed(records) if lo <= r.start_ns < hi
                  and (model is None or r.model == model))
        if order == "slowest":
            return sorted((r for r in picked if r.ttft_ns is not None),
                          key=lambda r: -r.ttft_ns)[:limit]
        return sorted(picked, key=lambda r: -r.start_ns)[:limit]

    def persist(self, record: RequestRecord) -> None:
        """A stored record changed after it was put: nothing to do in memory (the ring
        holds the object itself); a database-backed store writes it again."""

    def close(self, timeout_s: float = 0.0) -> bool:
        return True

    def overlapping(self, from_ns: int, to_ns: int) -> list[RequestRecord]:
        """The records whose [start, end] overlaps [from_ns, to_ns], oldest finish first.
        Records are kept in finish order, so the scan walks back from the newest and stops
        at the first that ended before `from_ns`: a window's cost is its own size, not the
        store's (a request that finished a few µs out of order at the edge can be missed)."""
        out = []
        with self._lock:
            for record in reversed(self._by_request_id.values()):
                if record.end_ns < from_ns:
                    break
                if record.start_ns <= to_ns:
                    out.append(record)
        out.reverse()
        return out

    def replace(self, request_id: str,
                change: Callable[[RequestRecord], RequestRecord]) -> RequestRecord | None:
        """Put `change(record)` in the place of the stored record of `request_id` (same
        position: the finish order `overlapping` relies on stays). The record itself is not
        touched, since the other sinks may still be reading it: only the store's copy
        changes (an engine span that came late, tracer/proxy/late_join.py). None when the
        request is not stored (evicted, or never)."""
        with self._lock:
            old = self._by_request_id.get(request_id)
            if old is None:
                return None
            new = change(old)
            self._by_request_id[request_id] = new
            return new

    def attach_client(self, trace_id: str, client: dict) -> RequestRecord | None:
        """Join a probe beacon to its server record; None when the trace is unknown
        (never stored, or already evicted)."""
        with self._lock:
            request_id = self._request_id_by_trace_id.get(trace_id)
            record = None if request_id is None else self._by_request_id.get(request_id)
            if record is not None:
                record.client = client
            return record

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_request_id)

    @property
    def num_indexed_traces(self) -> int:
        """Size of the trace-id index (bounded by `capacity`; exposed for tests)."""
        with self._lock:
            return len(self._request_id_by_trace_id)
