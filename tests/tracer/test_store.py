"""TraceStore: lookups, newest-first listing, bounded eviction with index cleanup, threads."""
from __future__ import annotations

import threading

import pytest

from tracer.record.request_record import RequestRecord
from tracer.sinks.store import TraceStore


def _record(i: int, trace_id: str | None = None) -> RequestRecord:
    return RequestRecord(request_id=f"req-{i}", trace_id=trace_id or f"{i + 1:032x}",
                         span_id=f"{i + 1:016x}", model="m", operation="chat",
                         start_ns=i, end_ns=i + 10)


def test_put_and_lookup_by_both_ids():
    store = TraceStore(capacity=10)
    rec = _record(1)
    store.put(rec)
    assert store.get(rec.trace_id) is rec
    assert store.get_by_request_id("req-1") is rec
    assert store.get("f" * 32) is None and store.get_by_request_id("nope") is None
    assert len(store) == 1


def test_recent_is_newest_first_and_bounded_by_n():
    store = TraceStore(capacity=10)
    for i in range(5):
        store.put(_record(i))
    assert [r.request_id for r in store.recent(3)] == ["req-4", "req-3", "req-2"]
    assert len(store.recent(50)) == 5
    assert store.recent(0) == []


def test_eviction_drops_the_oldest_from_every_index():
    store = TraceStore(capacity=3)
    records = [_record(i) for i in range(7)]
    for rec in records:
        store.put(rec)
    assert len(store) == 3 and store.num_indexed_traces == 3
    for rec in records[:4]:
        assert store.get(rec.trace_id) is None
        assert store.get_by_request_id(rec.request_id) is None
    assert [r.request_id for r in store.recent(10)] == ["req-6", "req-5", "req-4"]


def test_many_puts_keep_memory_bounded():
    store = TraceStore(capacity=50)
    for i in range(5_000):
        store.put(_record(i))
    assert len(store) == 50 and store.num_indexed_traces == 50


def test_shared_trace_id_returns_the_newest_and_survives_older_eviction():
    store = TraceStore(capacity=2)
    shared = "a" * 32
    first, second = _record(1, shared), _record(2, shared)
    store.put(first)
    store.put(second)
    assert store.get(shared) is second
    store.put(_record(3))            # evicts `first`: the trace must stay indexed
    assert store.get(shared) is second
    store.put(_record(4))            # evicts `second`
    assert store.get(shared) is None and store.num_indexed_traces == 2


def test_re_put_of_a_request_id_replaces_it_and_its_trace_index():
    store = TraceStore(capacity=5)
    store.put(_record(1, "b" * 32))
    replacement = _record(1, "c" * 32)
    store.put(replacement)
    assert len(store) == 1
    assert store.get("b" * 32) is None
    assert store.get("c" * 32) is replacement


def test_attach_client_joins_known_traces_only():
    store = TraceStore(capacity=1)
    rec = _record(1)
    store.put(rec)
    beacon = {"ttft_ms": 123.0}
    assert store.attach_client(rec.trace_id, beacon) is rec
    assert store.get(rec.trace_id).client == beacon
    assert store.attach_client("d" * 32, beacon) is None
    store.put(_record(2))            # evicts rec
    assert store.attach_client(rec.trace_id, beacon) is None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        TraceStore(capacity=0)


def test_concurrent_puts_and_reads_stay_consistent():
    store = TraceStore(capacity=100)
    num_threads, per_thread = 4, 2_000
    barrier = threading.Barrier(num_threads + 1)
    errors: list[BaseException] = []

    def writer(k: int):
        barrier.wait()
        for i in range(per_thread):
            store.put(_record(k * per_thread + i))

    def reader():
        barrier.wait()
        try:
            for _ in range(2_000):
                for rec in store.recent(5):
                    store.get(rec.trace_id)
                    store.attach_client(rec.trace_id, {})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(num_threads)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store) == 100 and store.num_indexed_traces == 100
    for rec in store.recent(100):
        assert store.get(rec.trace_id) is rec
