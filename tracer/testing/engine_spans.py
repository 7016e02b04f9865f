"""Engine request spans made with the real OpenTelemetry SDK the way each engine makes
them, for tests of the proxy's OTLP receiver and join. Each function mirrors its engine's
code (cited in tracer/engines/<engine>.py): span name, kind, start time = the request's
arrival, parent = the context extracted from the `traceparent` the engine received, the
same attribute names and units. The caller's tracer exports them (e.g. with the SDK's
`OTLPSpanExporter` pointed at the proxy).
"""
from __future__ import annotations

from opentelemetry.trace import SpanKind, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def _context(traceparent: str):
    return _PROPAGATOR.extract({"traceparent": traceparent})


def vllm_span(tracer, traceparent: str, *, arrival_ns: int, end_ns: int, ttft_s: float,
              queue_s: float, prefill_s: float, prompt_tokens: int = 5,
              completion_tokens: int = 6):
    """vllm/v1/engine/output_processor.py `do_tracing` (instrument_manual: start, end).
    Returns the span's context, for children made under it."""
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
    return set_span_in_context(span)


def vllm_lifecycle_request(tracer, traceparent: str, *, arrival_ns: int, end_ns: int,
                           ttft_s: float, local_queue_s: float, prefill_s: float,
                           kv_wait_s: float | None = None, preempted: bool = False,
                           prompt_tokens: int = 5) -> None:
    """A vLLM request with its request-lifecycle spans (vllm-project/vllm
    tests/tracing/test_request_lifecycle_tracing.py at 8d1fa3c4c8cd): the `llm_request` span,
    and under it `vllm.request.queue` until the scheduler first takes it,
    `vllm.request.wait_remote_kv` while a disaggregated decode instance's KV cache arrives
    (`kv_wait_s`), `vllm.request.prefill` from its SCHEDULED event to the first token
    (`preempted: true` when it was preempted in it). vLLM's `time_in_queue` (queued →
    SCHEDULED) holds the wait (tracer/engines/vllm.py)."""
    queue_s = local_queue_s + (kv_wait_s or 0.0)
    t_wait = arrival_ns + round(local_queue_s * 1e9)
    t_scheduled = arrival_ns + round(queue_s * 1e9)
    children = [("vllm.request.queue", arrival_ns, t_wait, {})]
    if kv_wait_s is not None:
        children.append(("vllm.request.wait_remote_kv", t_wait, t_scheduled,
                         {"vllm.kv_transfer.backend": "NixlConnector",
                          "vllm.kv_transfer.num_tokens": prompt_tokens - 1}))
    children.append(("vllm.request.prefill", t_scheduled, t_scheduled + round(prefill_s * 1e9),
                     {"preempted": True} if preempted else {}))
    under = vllm_span(tracer, traceparent, arrival_ns=arrival_ns, end_ns=end_ns, ttft_s=ttft_s,
                      queue_s=queue_s, prefill_s=prefill_s, prompt_tokens=prompt_tokens)
    for name, start, stop, attrs in children:
        tracer.start_span(name, context=under, attributes=attrs,
                          start_time=start).end(end_time=stop)


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


def rust_duration_debug(ns: int) -> str:
    """`format!("{:?}", Duration::from_nanos(ns))`: the largest unit of s, ms, µs, ns that
    is at most the value, the fraction's trailing zeros dropped (Rust's `Debug` of
    `std::time::Duration`).

    >>> rust_duration_debug(1_500_000), rust_duration_debug(2_000_000_000), rust_duration_debug(830)
    ('1.5ms', '2s', '830ns')
    """
    for unit, unit_ns, digits in (("s", 10**9, 9), ("ms", 10**6, 6), ("\u00b5s", 10**3, 3)):
        if ns >= unit_ns:
            whole, rest = divmod(ns, unit_ns)
            fraction = f"{rest:0{digits}d}".rstrip("0")
            return f"{whole}.{fraction}{unit}" if fraction else f"{whole}{unit}"
    return f"{ns}ns"


def tgi_spans(tracer, traceparent: str, *, arrival_ns: int, end_ns: int, validation_ns: int,
              queue_ns: int, first_token_ns: int, fields: dict | None = None,
              name: str = "chat_completions") -> None:
    """TGI's router spans for one streamed request (tracer/engines/tgi_span.py cites them):
    the handler's span (`#[instrument(fields(total_time, validation_time, ...))]`, parented
    on the `traceparent`, its fields recorded at the last token as `Debug` of `Duration`),
    under it `async_stream` → `generate_stream` → `schedule` → `queued` (until batched) and
    `infer` (the batch) → one `send_generation` per token. `fields` replaces recorded values
    (hostile tests); every span of one request, as TGI's batch exporter sends them."""
    from opentelemetry import trace
    batched_ns = arrival_ns + validation_ns + queue_ns
    recorded = {
        "total_time": rust_duration_debug(end_ns - arrival_ns),
        "validation_time": rust_duration_debug(validation_ns),
        "queue_time": rust_duration_debug(queue_ns),
        "inference_time": rust_duration_debug(end_ns - batched_ns),
        "time_per_token": rust_duration_debug((end_ns - batched_ns) // 2),
        "seed": "None",
        "parameters": "GenerateParameters { best_of: None, temperature: None, ... }",
    }
    recorded.update(fields or {})
    root = tracer.start_span(name, context=_context(traceparent), start_time=arrival_ns,
                             attributes={k: v for k, v in recorded.items() if v is not None})

    def child(parent, child_name: str, start_ns: int, stop_ns: int):
        span = tracer.start_span(child_name, context=trace.set_span_in_context(parent),
                                 start_time=start_ns)
        span.end(end_time=stop_ns)
        return span

    queued_ns = arrival_ns + validation_ns
    stream = tracer.start_span("async_stream", context=trace.set_span_in_context(root),
                               start_time=arrival_ns)
    infer = tracer.start_span("generate_stream", context=trace.set_span_in_context(stream),
                              start_time=arrival_ns)
    schedule = child(infer, "schedule", queued_ns, queued_ns)
    child(schedule, "queued", queued_ns, batched_ns)
    prefill = child(schedule, "infer", batched_ns, first_token_ns)
    child(prefill, "send_generation", first_token_ns, first_token_ns)
    decode = child(schedule, "infer", first_token_ns, end_ns)
    child(decode, "send_generation", end_ns, end_ns)
    infer.end(end_time=end_ns)
    stream.end(end_time=end_ns)
    root.end(end_time=end_ns)
