"""The prefill span's throughput attributes: FLOPs and tokens over the stage's duration, and
the device's rate over its forward passes (docs/reference.md, "Spans")."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.sinks.spans import SpanBuilder

T0_NS = 50_000_000
MS = 1_000_000


@pytest.fixture()
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield SpanBuilder(provider, Clock(wall_ns=1_700_000_000_000_000_000, perf_ns=T0_NS)), exporter
    provider.shutdown()


def prefill_attributes(builder, exporter, prefill_attrs: dict, *, duration_ns: int = 40 * MS,
                       chunk_tokens=(96, 32)) -> dict:
    server = builder.start_server_span(operation="chat", model="m", parent=None,
                                       start_perf_ns=T0_NS, attributes={})
    queue = StageSpan("queue", T0_NS, T0_NS + MS)
    prefill = StageSpan("prefill", queue.end_ns, queue.end_ns + duration_ns, prefill_attrs)
    events = tuple(("prefill_chunk", queue.end_ns + (i + 1) * MS, {"num_tokens": n})
                   for i, n in enumerate(chunk_tokens))
    record = RequestRecord("r", server.trace_id, server.span_id, "m", "chat", T0_NS,
                           prefill.end_ns + MS, stages=(queue, prefill), events=events)
    builder.finish(server, record)
    [span] = [s for s in exporter.get_finished_spans() if s.name == "llm.prefill"]
    return dict(span.attributes)


def test_rates_over_the_stage_and_over_the_forward_passes(exported):
    attrs = prefill_attributes(*exported, {
        "llm.prefill.flops": 6_000_000_000, "llm.prefill.step_flops": 9_000_000_000,
        "llm.prefill.forward_ns": 30 * MS})
    assert attrs["llm.prefill.flops"] == 6_000_000_000
    assert attrs["llm.prefill.flop_per_s"] == pytest.approx(6e9 / 0.040)     # 150 GFLOP/s
    assert attrs["llm.prefill.tokens_per_s"] == pytest.approx(128 / 0.040)   # 3,200 tok/s
    assert attrs["llm.prefill.device_flop_per_s"] == pytest.approx(9e9 / 0.030)


def test_without_flops_only_the_token_rate(exported):
    """A record whose engine did not count FLOPs (the proxy, a foreign recorder)."""
    attrs = prefill_attributes(*exported, {})
    assert attrs["llm.prefill.tokens_per_s"] == pytest.approx(128 / 0.040)
    assert not {"llm.prefill.flop_per_s", "llm.prefill.device_flop_per_s"} & attrs.keys()


def test_a_zero_length_prefill_has_no_rate(exported):
    """A clamped (zero-length) stage: no division by zero, no infinite rate."""
    attrs = prefill_attributes(*exported, {"llm.prefill.flops": 10}, duration_ns=0)
    assert attrs["llm.prefill.flops"] == 10
    assert not {"llm.prefill.flop_per_s", "llm.prefill.tokens_per_s"} & attrs.keys()
