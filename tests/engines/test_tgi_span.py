"""TGI's router request span over OTLP: made with the real SDK as TGI's router makes it
(tracer/testing/engine_spans.py `tgi_spans`), encoded to OTLP and read back, so the adapter
sees what the receiver sees (tracer/engines/tgi_span.py cites the source)."""
from __future__ import annotations

import pytest

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.engines.detect import engine_timings
from tracer.engines.placement import place
from tracer.engines.spans import spans_of
from tracer.testing.engine_spans import tgi_spans

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ARRIVAL = 1_700_000_000_000_000_000
MS = 1_000_000


def _timings(*, validation_ns=2 * MS, queue_ns=5 * MS, first_token_ns=ARRIVAL + 40 * MS,
             end_ns=ARRIVAL + 900 * MS, fields=None, keep=lambda span: True):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tgi_spans(provider.get_tracer("tgi"), PARENT, arrival_ns=ARRIVAL, end_ns=end_ns,
              validation_ns=validation_ns, queue_ns=queue_ns, first_token_ns=first_token_ns,
              fields=fields)
    sent = [s for s in memory.get_finished_spans() if keep(s)]
    return engine_timings(spans_of(encode_spans(sent)))


def test_a_streamed_request_gives_tokenize_queue_prefill_and_its_first_token():
    (span, t), = _timings()
    assert span.name == "chat_completions" and span.parent_span_id == "b7ad6b7169203331"
    assert (t.source, t.arrival_epoch_ns, t.ttft_ns) == ("tgi", ARRIVAL, 40 * MS)
    assert (t.tokenize_ns, t.queue_ns, t.prefill_ns, t.inference_ns) == (
        2 * MS, 5 * MS, 33 * MS, None)
    # The decode's `infer` and the last token's `send_generation` are not the first.
    assert t.parts() == (("tokenize", 2 * MS), ("queue", 5 * MS), ("prefill", 33 * MS))


def test_matched_by_its_fields_whatever_the_handler_name():
    for name in ("generate_stream", "completions", "some_future_handler"):
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tgi_spans(provider.get_tracer("tgi"), PARENT, arrival_ns=ARRIVAL,
                  end_ns=ARRIVAL + 90 * MS, validation_ns=MS, queue_ns=MS,
                  first_token_ns=ARRIVAL + 10 * MS, name=name)
        (span, t), = engine_timings(spans_of(encode_spans(memory.get_finished_spans())))
        assert (span.name, t.ttft_ns) == (name, 10 * MS)
    # The name alone is nothing: a span without the fields is no engine's.
    assert _timings(fields={"queue_time": None}) == []


def test_without_its_first_token_span_it_times_the_whole_answer_and_a_stream_is_refused():
    (_, t), = _timings(keep=lambda s: s.name not in ("send_generation",))
    assert (t.ttft_ns, t.inference_ns, t.prefill_ns) == (900 * MS, 893 * MS, None)
    # The stream's first content came 50 ms after the arrival: the whole answer is no TTFT.
    placement = place(t, window_start_ns=0, window_end_ns=50 * MS, max_skew_ns=5 * MS,
                      to_perf_ns=lambda epoch: epoch - ARRIVAL)
    assert placement.kind == "inconsistent" and placement.stages == ()


@pytest.mark.parametrize("bad", [
    "-3ms", "NaNms", "infms", "1e3ms", "3 ms", "3", "3MS", "3.ms", "1.0000000001s",
    "99999999999999999999s", "86400.000000001s", "", "Some(3)", "3ms\n",
])
def test_hostile_durations_are_unknown_never_guessed(bad):
    (_, t), = _timings(fields={"validation_time": bad, "queue_time": bad, "total_time": bad})
    assert (t.tokenize_ns, t.queue_ns) == (None, None)
    assert t.ttft_ns == 40 * MS and t.prefill_ns == 33 * MS   # from the span stamps
    assert sum(ns for _, ns in t.parts()) <= t.ttft_ns
    (_, whole), = _timings(fields={"total_time": bad, "inference_time": bad},
                           keep=lambda s: s.name != "send_generation")
    assert (whole.ttft_ns, whole.inference_ns) == (None, None)


def test_a_day_is_the_largest_duration_and_a_number_is_not_a_field():
    (_, t), = _timings(fields={"validation_time": "86400s", "queue_time": "86400.000000001s"})
    assert (t.tokenize_ns, t.queue_ns) == (86_400 * 10**9, None)
    assert _timings(fields={"queue_time": 5.0}) == []     # not TGI's string: not its span


def test_hostile_stamps_give_no_first_token():
    # A first token before the request began is not this request's: the span's own
    # whole-answer timing stands (total_time), with no prefill; a day after it is no latency.
    (_, early), = _timings(first_token_ns=ARRIVAL - MS, end_ns=ARRIVAL + 90 * MS)
    assert (early.ttft_ns, early.inference_ns, early.prefill_ns) == (90 * MS, 83 * MS, None)
    (_, late), = _timings(first_token_ns=ARRIVAL + 86_401 * 10**9,
                          end_ns=ARRIVAL + 86_402 * 10**9)
    assert late.ttft_ns is None and late.prefill_ns is None
