"""A batch's grouped writes (tracer/sinks/observation_batch.py) against the same writes one
by one: bucket counts and exemplars exactly, sums to float rounding, counters alike; and the
metrics sink fed by the worker in batches against the same sink fed record by record."""
from __future__ import annotations

import math
import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from tracer.core.record_worker import MIN_SINK_BATCH, RecordWorker
from tracer.core.sink import batch_methods
from tracer.record.emits import GapSummary
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES
from tracer.record.verdict import Verdict
from tracer.sinks.gap_histogram import observe_with
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.observation_batch import ObservationBatch

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
amounts = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(BUCKETS), st.just(0.0), st.just(-0.0))
observations = st.lists(st.tuples(st.integers(0, 2), amounts, st.booleans(),
                                  st.integers(0, 3), st.floats(0, 2e9)), max_size=60)


def children():
    registry = CollectorRegistry()
    h = Histogram("h", "h", ("c",), registry=registry, buckets=BUCKETS)
    c = Counter("n", "n", ("c",), registry=registry)
    return [h.labels(str(i)) for i in range(3)], [c.labels(str(i)) for i in range(3)]


def state(histograms, counters):
    out = []
    for child in histograms:
        out.append(([b.get() for b in child._buckets], child._sum.get(),
                    [b.get_exemplar() for b in child._buckets]))
    return out, [c._value.get() for c in counters]


def same_sum(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(observations)
def test_a_batch_leaves_what_the_writes_one_by_one_leave(obs):
    one_h, one_c = children()
    batch_h, batch_c = children()
    batch = ObservationBatch()
    for i, amount, with_exemplar, count, now in obs:
        exemplar = {"trace_id": f"{i}{count}"} if with_exemplar else None
        observe_with(one_h[i], amount, exemplar, now)
        one_c[i]._value.inc(count)
        batch.observe(batch_h[i], amount, exemplar, now)
        batch.inc(batch_c[i]._value, count)
    assert state(*children()) == state(batch_h, batch_c)   # nothing written before `apply`
    batch.apply()
    (one, one_counts), (got, got_counts) = state(one_h, one_c), state(batch_h, batch_c)
    assert got_counts == one_counts
    for (buckets, total, exemplars), (buckets_b, total_b, exemplars_b) in zip(one, got):
        assert buckets_b == buckets
        assert exemplars_b == exemplars
        assert same_sum(total_b, total)
    batch.apply()                                          # it held nothing more
    assert state(batch_h, batch_c)[1] == got_counts


def record(i: int) -> RequestRecord:
    stages = tuple(StageSpan(s, k * 1_000_000, (k + 1) * 1_000_000)
                   for k, s in enumerate(SERVER_STAGES))
    verdict = Verdict("queueing" if i % 2 else "healthy", i * 1_000_000 if i % 2 else None,
                      {}, (), 9)
    return RequestRecord(
        request_id=f"r{i}", trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", model="m",
        operation="chat", start_ns=0, end_ns=(i + 20) * 10_000_000, stages=stages,
        ttft_ns=len(stages) * 1_000_000 + i * 1_000, itl=GapSummary.of((i * 1_000_000 + 1,
                                                                      30_000_000)),
        num_prompt_tokens=10 * i, num_cached_tokens=i, num_output_tokens=3, verdict=verdict,
        num_tool_calls=i % 3, num_draft_tokens=4 * (i % 2), num_draft_accepted=i % 2)


def exposition(metrics: LLMMetrics) -> list:
    """Every sample of ours: exemplar timestamps and `_created` left out (each path reads
    its own clock), and the process' own metrics."""
    out = []
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name.endswith("_created") or s.name.startswith("process_"):
                continue
            exemplar = None if s.exemplar is None else (s.exemplar.labels, s.exemplar.value)
            value = round(s.value, 9) if s.name.endswith("_sum") else s.value
            out.append((s.name, tuple(sorted(s.labels.items())), value, exemplar))
    return sorted(out, key=repr)


def test_the_worker_in_batches_leaves_the_metrics_publish_leaves():
    """Batches of MIN_SINK_BATCH or more go through `collect`/`flush_batch`: the exposition
    equals the same records published one by one; and a scrape after `flush` sees them."""
    one, batched = LLMMetrics(CollectorRegistry(), ("m",)), LLMMetrics(CollectorRegistry(), ("m",))
    assert batch_methods(batched)[1] is not None
    records = [record(i) for i in range(40)]
    for r in records:
        one.publish(r)
    gate = Gate()
    worker = RecordWorker([gate, batched], on_failure=lambda sink, exc: failures.append(exc))
    failures: list = []
    worker.submit(records[0])          # held at the gate: the rest queue up behind it
    assert gate.entered_wait(10)
    for r in records[1:]:
        worker.submit(r)
    gate.open()
    assert worker.flush(30) and failures == []
    assert exposition(batched) == exposition(one)
    assert worker.close(10)


class Gate:
    """Holds the worker on its first record until `open`, so the others form a batch."""

    def __init__(self) -> None:
        self._entered, self._open = threading.Event(), threading.Event()

    def publish(self, record) -> None:
        self._entered.set()
        assert self._open.wait(30)

    def entered_wait(self, timeout_s: float) -> bool:
        return self._entered.wait(timeout_s)

    def open(self) -> None:
        self._open.set()


def test_below_the_threshold_records_go_one_by_one():
    seen: list[str] = []

    class Both:
        def publish(self, record):
            seen.append("publish")

        def collect(self, record):
            seen.append("collect")

        def flush_batch(self):
            seen.append("flush")

    worker = RecordWorker([Both()], on_failure=lambda sink, exc: None)
    worker._publish_batch(list(range(MIN_SINK_BATCH - 1)))
    assert seen == ["publish"] * (MIN_SINK_BATCH - 1)
    seen.clear()
    worker._publish_batch(list(range(MIN_SINK_BATCH)))
    assert seen == ["collect"] * MIN_SINK_BATCH + ["flush"]


def test_a_raising_collect_costs_only_its_record():
    failures: list = []
    metrics = LLMMetrics(CollectorRegistry(), ("m",))
    bad = record(1)
    bad.stages = None   # not iterable: observe_request raises for this record alone
    worker = RecordWorker([metrics], on_failure=lambda sink, exc: failures.append(exc))
    worker._publish_batch([record(0), bad, record(2), record(3)])
    assert len(failures) == 1
    requests = [s for f in metrics.registry.collect() for s in f.samples
                if s.name == "llm_requests_total"]
    assert sum(s.value for s in requests) == 3


def test_two_threads_collecting_into_one_sink_keep_their_own_batches():
    """A batch is the thread's own: one thread's `flush_batch` writes only what that thread
    collected (not the other's half batch), and in the end nothing is lost when two workers
    share one metrics sink."""
    one, shared = LLMMetrics(CollectorRegistry(), ("m",)), LLMMetrics(CollectorRegistry(), ("m",))
    records = [record(i) for i in range(40)]
    for r in records:
        one.publish(r)
    collected, first_flushed, go_on = threading.Barrier(3), threading.Event(), threading.Event()

    def work(part: list, flush_first: bool) -> None:
        for r in part:
            shared.collect(r)
        collected.wait(10)
        if flush_first:
            shared.flush_batch()
            first_flushed.set()
        else:
            assert go_on.wait(10)
            shared.flush_batch()

    threads = [threading.Thread(target=work, args=(records[k::2], k == 0)) for k in (0, 1)]
    for t in threads:
        t.start()
    collected.wait(10)
    assert first_flushed.wait(10)
    assert requests_total(shared) == 20          # the first thread's records alone
    go_on.set()
    for t in threads:
        t.join(30)
    assert requests_total(shared) == 40
    # Every count and sum; a bucket's exemplar is whichever thread wrote it last.
    assert [s[:3] for s in exposition(shared)] == [s[:3] for s in exposition(one)]


def requests_total(metrics: LLMMetrics) -> float:
    return sum(s.value for f in metrics.registry.collect() for s in f.samples
               if s.name == "llm_requests_total")
