"""A finished record's timing, worked out by its first reader (tracer/record/deferred_timing.py):
the same values as filling it at finish, never on the serving thread when the worker reads
first, once under concurrent readers, and a write to a timing field never lost."""
from __future__ import annotations

import dataclasses
import threading

import pytest

import tracer.record.deferred_timing as deferred_timing
from tracer.core.request_tracer import Tracer
from tracer.record.deferred_timing import TIMING_FIELDS, DeferredRecord, fill_timing
from tracer.record.request_record import RequestRecord
from tracer.record.stages import SERVER_STAGES
from tracer.testing.sinks import CapturingSink

MODEL = "m"


def finished(tracer: Tracer, i: int = 0, *, tool_call: bool = False, num_tokens: int = 3):
    """A request through every stage with `num_tokens` emits, finished; its record."""
    start = 1_000_000 * (i + 1)
    active = tracer.begin(request_id=f"r{i}", model=MODEL, operation="chat", traceparent=None,
                          start_ns=start, attrs={"gen_ai.request.max_tokens": 8})
    t = start
    for stage in SERVER_STAGES:
        t += 1_000
        active.timeline.mark(stage, t)
    active.timeline.event("prefill_chunk", t - 3_000, num_tokens=5)
    if tool_call:
        active.timeline.tool_call(0, t - 500, "get_weather")
        active.timeline.tool_call_ready(0, t - 200)
    for k in range(num_tokens):
        active.timeline.emit(t + k * 2_000)
    return tracer.finish(active, end_ns=t + num_tokens * 2_000, finish_reason="stop",
                         num_prompt_tokens=9, num_output_tokens=num_tokens)


def filled_at_once(record: DeferredRecord) -> RequestRecord:
    """The plain record `finish` used to build: every field copied, the timing filled now."""
    snap, stages, num_dropped = record._pending
    plain = RequestRecord(**{f.name: (dict(RequestRecord.attrs.__get__(record))
                                      if f.name == "attrs" else
                                      getattr(RequestRecord, f.name).__get__(record))
                             for f in dataclasses.fields(RequestRecord)})
    fill_timing(plain, snap, stages, num_dropped)
    return plain


@pytest.mark.parametrize("tool_call", [False, True])
def test_the_first_read_gives_what_filling_at_finish_gave(tool_call):
    tracer = Tracer(model_names=(MODEL,), sinks=[CapturingSink()])
    record = finished(tracer, tool_call=tool_call)
    assert isinstance(record, DeferredRecord) and not record.is_settled
    expected = filled_at_once(record)
    for name in TIMING_FIELDS:
        assert getattr(record, name) == getattr(expected, name), name
    # Worked out, it reads its fields from its slots (no property left in the way).
    assert record.is_settled and type(record) is deferred_timing.SettledRecord
    assert [s.stage for s in record.stages] == list(SERVER_STAGES)
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages) + record.unattributed_ns
    assert record == expected and expected == record       # both ways, across the two types
    assert (record.num_tool_calls, len(record.tool_calls)) == ((1, 1) if tool_call else (0, 0))


def test_the_worker_works_it_out_not_the_finishing_thread(monkeypatch):
    """Behind a worker (what build_observability builds), `finish` returns before any
    attribution: the worker's first sink that reads the timing runs it, on its thread."""
    threads: list[int] = []
    real = deferred_timing.attribute_outputs

    def spy(snap, stages):
        threads.append(threading.get_ident())
        return real(snap, stages)

    monkeypatch.setattr(deferred_timing, "attribute_outputs", spy)
    seen = CapturingSink()
    reader = type("TimingReader", (), {"publish": lambda self, r: seen.publish(r.ttft_ns)})()
    tracer = Tracer(model_names=(MODEL,), sinks=[reader], background=True)
    try:
        records = [finished(tracer, i) for i in range(20)]
        assert tracer.drain(30)
    finally:
        tracer.close(30)
    assert len(threads) == 20 and threading.get_ident() not in threads
    assert seen.records == [r.ttft_ns for r in records] and all(r.is_settled for r in records)


def test_concurrent_first_readers_see_one_and_the_same_timing(monkeypatch):
    """Eight threads read one record's timing at once: the attribution runs once and every
    thread sees the whole of it."""
    calls = []
    real = deferred_timing.fill_timing

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(deferred_timing, "fill_timing", counting)
    tracer = Tracer(model_names=(MODEL,), sinks=[CapturingSink()])
    for attempt in range(20):
        record = finished(tracer, attempt)
        expected = filled_at_once(record)
        calls.clear()
        start = threading.Barrier(8)
        seen = []

        def read():
            start.wait()
            seen.append((record.ttft_ns, record.stages, dict(record.attrs), record.itl))

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(calls) == 1
        assert seen == [(expected.ttft_ns, expected.stages, expected.attrs, expected.itl)] * 8


def test_a_write_to_a_timing_field_is_kept():
    """A write before any read works the timing out first, so the first read never replaces
    the written value with the worked-out one."""
    tracer = Tracer(model_names=(MODEL,), sinks=[CapturingSink()])
    record = finished(tracer)
    record.ttft_ns = 123
    record.attrs["x"] = 1
    assert record.ttft_ns == 123 and record.attrs["x"] == 1
    assert [s.stage for s in record.stages] == list(SERVER_STAGES)


def test_a_copy_or_a_change_of_a_deferred_record_is_complete():
    tracer = Tracer(model_names=(MODEL,), sinks=[CapturingSink()])
    record = finished(tracer)
    expected = filled_at_once(record)
    changed = dataclasses.replace(record, finish_reason="length")
    assert changed.stages == expected.stages and changed.finish_reason == "length"
    assert dataclasses.asdict(finished(tracer, 1))["ttft_ns"] == expected.ttft_ns


def test_a_disabled_tracer_leaves_the_timing_empty():
    tracer = Tracer(model_names=(MODEL,), sinks=[CapturingSink()], enabled=False)
    record = finished(tracer)
    assert record.is_settled and record.stages == () and record.ttft_ns is None


def test_built_without_its_properties_it_is_the_same_record():
    """`deferred_record` (what `finish` builds, through the plain layout) and a DeferredRecord
    built field by field then deferred: every field equal, the timing settled alike, and the
    fields set at build (the counts checked by `__post_init__`) kept."""
    from tracer.record.deferred_timing import deferred_record
    from tracer.record.timeline import Timeline
    timeline = Timeline(0)
    for k, stage in enumerate(SERVER_STAGES):
        timeline.mark(stage, 1_000 * (k + 1))
    timeline.emit(12_000)
    timeline.end(13_000)
    fields = dict(request_id="r", trace_id="1" * 32, span_id="2" * 16, model=MODEL,
                  operation="chat", start_ns=0, end_ns=13_000, num_prompt_tokens=-4,
                  num_output_tokens=1, attrs={"k": 1})
    fast = deferred_record(timeline.snapshot(), SERVER_STAGES, 2, dict(fields))
    slow = DeferredRecord(**{**fields, "attrs": {"k": 1}})
    slow.defer(timeline.snapshot(), SERVER_STAGES, 2)
    assert type(fast) is DeferredRecord and not fast.is_settled
    assert fast.num_prompt_tokens == 0 and "llm.invalid_tokens.prompt" in fast.attrs
    assert fast == slow and fast.is_settled and slow.is_settled
    assert fast.attrs["llm.num_dropped_events"] == 2 and fast.ttft_ns is not None
