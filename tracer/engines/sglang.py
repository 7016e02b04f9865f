"""SGLang: the request's root span and its stage spans.

Read from sgl-project/sglang `python/sglang/srt/observability/req_time_stats.py`
(commit 602413bc230f, 2026): `APIServerReqTimeStats.convert_to_gen_ai_span_attrs` puts, in
seconds, `gen_ai.latency.time_to_first_token` (created → first token) and
`gen_ai.latency.time_in_model_prefill` = first token − the dispatch's end, which *includes*
the wait in the scheduler's queue; there is no `time_in_queue`. The stage spans
(`RequestStage`: `tokenize`, `prefill_waiting`, `prefill_forward`, `dispatch`, ...) are
descendants of the request span, with wall-clock start and end (`trace_slice`). So: queue =
the `prefill_waiting` span, prefill = the attribute minus it, tokenize = the `tokenize` span;
without the stage spans, the queue-inclusive prefill is `engine_other`, not `prefill`.
The request span continues the incoming `traceparent` (`external_trace_header`).
"""
from __future__ import annotations

from tracer.engines import vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, seconds_ns, token_count

TOKENIZE_SPAN = "tokenize"
WAITING_SPAN = "prefill_waiting"
_STAGES = frozenset((TOKENIZE_SPAN, WAITING_SPAN))


def matches(span: SpanView) -> bool:
    a = span.attributes
    return vllm.TTFT in a and vllm.PREFILL in a and vllm.QUEUE not in a


def timing_of(span: SpanView, descendants: list[SpanView]) -> EngineTiming:
    """
    >>> root = SpanView("a" * 32, "b" * 16, "c" * 16, "req", 1,
    ...                 {vllm.TTFT: 0.5, vllm.PREFILL: 0.3})
    >>> wait = SpanView("a" * 32, "d" * 16, "b" * 16, WAITING_SPAN, 2, {}, 100_000_002)
    >>> t = timing_of(root, [wait]); t.queue_ns, t.prefill_ns
    (100000000, 200000000)
    >>> timing_of(root, []).prefill_ns is None
    True
    """
    a = span.attributes
    waiting = _duration(descendants, WAITING_SPAN)
    with_queue = seconds_ns(a.get(vllm.PREFILL))
    prefill = None
    if waiting is not None and with_queue is not None and with_queue >= waiting:
        prefill = with_queue - waiting
    return EngineTiming("sglang", arrival_epoch_ns=span.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(vllm.TTFT)),
                        tokenize_ns=_duration(descendants, TOKENIZE_SPAN),
                        queue_ns=waiting if prefill is not None else None, prefill_ns=prefill,
                        num_prompt_tokens=token_count(a.get(vllm.PROMPT_TOKENS)))


def is_stage(span: SpanView) -> bool:
    """A stage span `timing_of` reads: one of its names, with a wall-clock duration."""
    return span.name in _STAGES and span.end_epoch_ns >= span.start_epoch_ns > 0


def _duration(spans: list[SpanView], name: str) -> int | None:
    for span in spans:
        if span.name == name and is_stage(span):
            return span.end_epoch_ns - span.start_epoch_ns
    return None
