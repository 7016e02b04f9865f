"""vLLM (v1): the `llm_request` span.

Read from vllm-project/vllm `vllm/v1/engine/output_processor.py` `OutputProcessor.do_tracing`
(commit d07822605346, 2026): span `llm_request`, kind SERVER, `start_time` = the request's
arrival (`RequestStateStats.arrival_time`, wall clock), parent = the trace context of the
incoming headers, i.e. the `traceparent` the proxy forwarded. Attributes, in seconds:

- `gen_ai.latency.time_to_first_token` = first_token_latency (arrival → first token);
- `gen_ai.latency.time_in_queue` = scheduled_ts − queued_ts;
- `gen_ai.latency.time_in_model_prefill` = first_token_ts − scheduled_ts;
- `gen_ai.usage.prompt_tokens`; no cached-token attribute (only `usage.prompt_tokens_details`
  with `--enable-prompt-tokens-details`, which the proxy reads from the stream itself).

What vLLM's TTFT holds besides queue and prefill (the front-end → engine-core hand-off and
the output processing of the first token) is `engine_other`.
"""
from __future__ import annotations

from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, seconds_ns, token_count

SPAN_NAME = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"


def matches(span: SpanView) -> bool:
    a = span.attributes
    return TTFT in a and QUEUE in a and PREFILL in a


def timing_of(span: SpanView) -> EngineTiming:
    """
    >>> s = SpanView("a" * 32, "b" * 16, "c" * 16, SPAN_NAME, 5, {TTFT: 0.3, QUEUE: 0.1, PREFILL: 0.15})
    >>> timing_of(s).queue_ns, timing_of(s).prefill_ns, timing_of(s).arrival_epoch_ns
    (100000000, 150000000, 5)
    """
    a = span.attributes
    return EngineTiming("vllm", arrival_epoch_ns=span.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(TTFT)), queue_ns=seconds_ns(a.get(QUEUE)),
                        prefill_ns=seconds_ns(a.get(PREFILL)),
                        num_prompt_tokens=token_count(a.get(PROMPT_TOKENS)))
