"""Our spans speak the ecosystem's names too: `gen_ai.request.stream`, and vLLM's
`gen_ai.latency.*` keys on the engine's request span (never on a proxy's)."""
from __future__ import annotations

from tracer.engines.detect import engine_timings
from tracer.engines.spans import SpanView
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.sinks.span_attributes import genai_attributes

MS = 1_000_000


def _record(source: str) -> RequestRecord:
    stages = (StageSpan("receive", 0, 1 * MS), StageSpan("queue", 1 * MS, 4 * MS),
              StageSpan("prefill", 4 * MS, 10 * MS), StageSpan("send", 10 * MS, 11 * MS))
    return RequestRecord("r", "a" * 32, "b" * 16, "m", "chat", 0, 50 * MS, stages=stages,
                         ttft_ns=11 * MS, source=source, attrs={"stream": True})


def test_the_engine_span_carries_vllm_latency_keys_that_our_adapter_reads_back():
    attrs = genai_attributes(_record("engine"))
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.latency.time_in_queue"] == 0.003
    assert attrs["gen_ai.latency.time_in_model_prefill"] == 0.006
    assert attrs["gen_ai.latency.time_to_first_token"] == 0.011
    # What a query over vLLM's spans reads, our adapter reads the same from ours.
    (_, timing), = engine_timings([SpanView("a" * 32, "c" * 16, "d" * 16, "chat m", 1, attrs)])
    assert (timing.source, timing.queue_ns, timing.prefill_ns) == ("vllm", 3 * MS, 6 * MS)


def test_a_proxy_span_does_not_pass_for_an_engine():
    attrs = genai_attributes(_record("proxy"))
    assert not any(k.startswith("gen_ai.latency.") for k in attrs)
    assert engine_timings([SpanView("a" * 32, "c" * 16, "d" * 16, "chat m", 1, attrs)]) == []
