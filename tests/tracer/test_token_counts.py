"""Token counts are not trusted (issue 39, break 8): a count outside 0 … 10^7 per request,
whatever it came from (an engine span's `gen_ai.usage.*`, an upstream's `usage`, llama.cpp's
`timings`), is dropped from the metrics, kept on the record marked invalid, and counted; no
sink raises on it and no counter becomes +Inf."""
from __future__ import annotations

import logging
import math

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.core.request_tracer import Tracer
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.record.token_counts import MAX_TOKENS_PER_REQUEST, TOKEN_KINDS
from tracer.sinks.logs import RequestLogSink
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.store import TraceStore

MODEL = "smollm2"
HOSTILE = [2**63 - 1, 10**308, -5, MAX_TOKENS_PER_REQUEST + 1, 1e308, float("inf"),
           float("nan"), True, "12"]


def _tracer():
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry, model_names=[MODEL])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = SpanBuilder(provider, Clock())
    store = TraceStore(10)
    tracer = Tracer(model_names=[MODEL], sinks=[metrics, spans, RequestLogSink(logging.getLogger("test_token_counts")), store],
                    span_builder=spans)
    return tracer, registry, store, exporter


def _finish(tracer, **counts):
    active = tracer.begin(request_id="r", model=MODEL, operation="chat", traceparent=None,
                          start_ns=1_000)
    active.timeline.emit(2_000)
    return tracer.finish(active, end_ns=3_000, finish_reason="stop", **counts)


def _value(registry, name, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: repr(v)[:12])
def test_a_count_out_of_range_is_dropped_kept_marked_and_counted(bad):
    tracer, registry, store, exporter = _tracer()
    record = _finish(tracer, num_prompt_tokens=bad, num_cached_tokens=bad, num_output_tokens=bad)
    assert tracer.sink_failures == {}                  # no sink raised: the record is whole
    assert store.get(record.trace_id) is record and len(exporter.get_finished_spans()) == 1
    assert (record.num_prompt_tokens, record.num_cached_tokens, record.num_output_tokens) == (0, 0, 0)
    for kind in TOKEN_KINDS:
        assert record.attrs[f"llm.invalid_tokens.{kind}"] == str(bad)[:32]
        assert _value(registry, "llm_invalid_token_counts_total", kind=kind) == 1
    for family in ("llm_prompt_tokens_total", "llm_prompt_cached_tokens_total",
                   "llm_generation_tokens_total"):
        assert _value(registry, family, model=MODEL) == 0


def test_counts_in_range_pass_and_the_bound_is_inclusive():
    tracer, registry, _, _ = _tracer()
    record = _finish(tracer, num_prompt_tokens=MAX_TOKENS_PER_REQUEST, num_cached_tokens=0,
                     num_output_tokens=7)
    assert (record.num_prompt_tokens, record.num_output_tokens) == (MAX_TOKENS_PER_REQUEST, 7)
    assert not [k for k in record.attrs if k.startswith("llm.invalid_tokens")]
    assert _value(registry, "llm_prompt_tokens_total", model=MODEL) == MAX_TOKENS_PER_REQUEST
    assert sum(_value(registry, "llm_invalid_token_counts_total", kind=k)
               for k in TOKEN_KINDS) == 0


def test_many_huge_counts_never_make_a_counter_infinite():
    tracer, registry, _, _ = _tracer()
    for _ in range(3):
        _finish(tracer, num_prompt_tokens=10**308, num_output_tokens=10**308)
    assert math.isfinite(_value(registry, "llm_prompt_tokens_total", model=MODEL))
    assert _value(registry, "llm_invalid_token_counts_total", kind="output") == 3


def test_a_record_built_directly_is_checked_too():
    record = RequestRecord("r", "1" * 32, "2" * 16, MODEL, "chat", 0, 1, num_prompt_tokens=-1)
    assert record.num_prompt_tokens == 0 and record.attrs["llm.invalid_tokens.prompt"] == "-1"
    huge = RequestRecord("r", "1" * 32, "2" * 16, MODEL, "chat", 0, 1, num_output_tokens=10**5000)
    assert huge.attrs["llm.invalid_tokens.output"] == "int of 16610 bits"
