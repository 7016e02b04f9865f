"""Engine request spans made with the real OpenTelemetry SDK the way each engine makes
them, for tests of the proxy's OTLP receiver and join. Each function mirrors its engine's
code (cited in tracer/engines/<engine>.py): span name, kind, start time = the request's
arrival, parent = the context extracted from the `traceparent` the engine received, the
same attribute names and units. The caller's tracer exports them (e.g. with the SDK's
`OTLPSpanExporter` pointed at the proxy).
"""
from __future__ import annotations

from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def _context(traceparent: str):
    return _PROPAGATOR.extract({"traceparent": traceparent})


def vllm_span(tracer, traceparent: str, *, arrival_ns: int, end_ns: int, ttft_s: float,
              queue_s: float, prefill_s: float, prompt_tokens: int = 5,
              completion_tokens: int = 6) -> None:
    """vllm/v1/engine/output_processor.py `do_tracing` (instrument_manual: start, end)."""
    attributes = {
        "gen_ai.latency.time_to_first_token": ttft_s,
        "gen_ai.latency.e2e": (end_ns - arrival_ns) / 1e9,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": 0.001,
        "gen_ai.latency.time_in_model_inference": prefill_s + 0.001,
        "gen_ai.request.id": "cmpl-test",
        "gen_ai.response.finish_reasons": '["stop"]',
    }
    span = tracer.start_span("llm_request", context=_context(traceparent), kind=SpanKind.SERVER,
                             attributes=attributes, start_time=arrival_ns)
    span.end(end_time=end_ns)


def trtllm_span(tracer, traceparent: str, *, arrival_ns: int, end_ns: int, ttft_s: float,
                queue_s: float, prompt_tokens: int = 5) -> None:
    """tensorrt_llm's request span: `SpanAttributes` of tensorrt_llm/llmapi/tracing.py."""
    attributes = {
        "gen_ai.latency.time_to_first_token": ttft_s,
        "gen_ai.latency.e2e": (end_ns - arrival_ns) / 1e9,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.latency.kv_cache_transfer_time": 0.0,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.usage.completion_tokens": 6,
        "gen_ai.response.finish_reasons": '["stop"]',
    }
    span = tracer.start_span("llm_request", context=_context(traceparent), kind=SpanKind.SERVER,
                             attributes=attributes, start_time=arrival_ns)
    span.end(end_time=end_ns)


def sglang_spans(tracer, traceparent: str, *, arrival_ns: int, end_ns: int, ttft_s: float,
                 tokenize_s: float, waiting_s: float, prefill_with_queue_s: float) -> None:
    """SGLang's request span (`convert_to_gen_ai_span_attrs`) and its stage slices
    (`trace_slice`: `tokenize` from creation, `prefill_waiting` after the dispatch)."""
    from opentelemetry import trace
    root = tracer.start_span("Req", context=_context(traceparent), kind=SpanKind.SERVER,
                             start_time=arrival_ns, attributes={
                                 "gen_ai.latency.time_to_first_token": ttft_s,
                                 "gen_ai.latency.e2e": (end_ns - arrival_ns) / 1e9,
                                 "gen_ai.latency.time_in_model_prefill": prefill_with_queue_s,
                                 "gen_ai.latency.time_in_model_decode": 0.001})
    inside = trace.set_span_in_context(root)
    tokenize_end = arrival_ns + round(tokenize_s * 1e9)
    tracer.start_span("tokenize", context=inside, start_time=arrival_ns).end(end_time=tokenize_end)
    waiting_start = arrival_ns + round((ttft_s - prefill_with_queue_s) * 1e9)
    tracer.start_span("prefill_waiting", context=inside, start_time=waiting_start).end(
        end_time=waiting_start + round(waiting_s * 1e9))
    root.end(end_time=end_ns)
