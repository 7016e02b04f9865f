"""TensorRT-LLM (`trtllm-serve`): its request span.

Attribute names from NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/tracing.py` `SpanAttributes`
(commit 0fb7f7586fda, 2026): `gen_ai.latency.time_to_first_token`, `gen_ai.latency.e2e`,
`gen_ai.latency.time_in_queue`, `gen_ai.latency.kv_cache_transfer_time` (seconds) and
`gen_ai.usage.prompt_tokens`; the span continues the incoming `traceparent`
(`extract_trace_context`) and starts at the request's arrival. There is no prefill
attribute: what the TTFT holds besides the queue (prefill among it) is `engine_other`.
"""
from __future__ import annotations

from tracer.engines import vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, seconds_ns, token_count

KV_TRANSFER = "gen_ai.latency.kv_cache_transfer_time"


def matches(span: SpanView) -> bool:
    a = span.attributes
    return vllm.TTFT in a and vllm.QUEUE in a and vllm.PREFILL not in a


def timing_of(span: SpanView) -> EngineTiming:
    """
    >>> s = SpanView("a" * 32, "b" * 16, "c" * 16, "llm_request", 7,
    ...              {vllm.TTFT: 0.2, vllm.QUEUE: 0.05, KV_TRANSFER: 0.0})
    >>> matches(s), timing_of(s).queue_ns, timing_of(s).prefill_ns
    (True, 50000000, None)
    """
    a = span.attributes
    return EngineTiming("trtllm", arrival_epoch_ns=span.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(vllm.TTFT)),
                        queue_ns=seconds_ns(a.get(vllm.QUEUE)),
                        num_prompt_tokens=token_count(a.get(vllm.PROMPT_TOKENS)))
