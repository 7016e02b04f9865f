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

The worker's role is in the request span's name only: `TraceReqContext.trace_req_start`
(`python/sglang/srt/observability/trace.py` at b8e5a7c39773) names it
`f"{role} Req {rid[:8]}"`, the role "" for a unified server and `prefill` or `decode` under
prefill/decode disaggregation (`disagg_mode_str`), and sets no role attribute. A prefill
worker's request span is not the client's request: tracer/engines/sglang_pd.py reads it as a
part of its decode worker's.
"""
from __future__ import annotations

from tracer.engines import vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, nanos_ns, seconds_ns, token_count

TOKENIZE_SPAN = "tokenize"
WAITING_SPAN = "prefill_waiting"
# The prefill worker's forward and KV transfer (`RequestStage.PREFILL_FORWARD`,
# `PREFILL_TRANSFER_KV_CACHE`), read only under disaggregation (tracer/engines/sglang_pd.py).
FORWARD_SPAN = "prefill_forward"
TRANSFER_SPAN = "prefill_transfer_kv_cache"
_STAGES = frozenset((TOKENIZE_SPAN, WAITING_SPAN, FORWARD_SPAN, TRANSFER_SPAN))
PREFILL_ROLE, DECODE_ROLE = "prefill", "decode"
_ROLES = (PREFILL_ROLE, DECODE_ROLE)
_NAME_INFIX = " Req "


def role_of(span: SpanView) -> str:
    """`prefill` or `decode` from the request span's name; "" for a unified server's (its
    name starts with a space) and any other name.

    >>> [role_of(SpanView("a" * 32, "b" * 16, "", n, 1, {}))
    ...  for n in ("prefill Req 3f2a9c1e", "decode Req 3f2a9c1e", " Req 3f2a9c1e", "prefill")]
    ['prefill', 'decode', '', '']
    """
    head, infix, _ = span.name.partition(_NAME_INFIX)
    return head if infix and head in _ROLES else ""


def matches(span: SpanView) -> bool:
    a = span.attributes
    return (vllm.TTFT in a and vllm.PREFILL in a and vllm.QUEUE not in a
            and role_of(span) != PREFILL_ROLE)


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
    waiting = duration(descendants, WAITING_SPAN)
    with_queue = seconds_ns(a.get(vllm.PREFILL))
    prefill = None
    if waiting is not None and with_queue is not None and with_queue >= waiting:
        prefill = with_queue - waiting
    return EngineTiming("sglang", arrival_epoch_ns=span.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(vllm.TTFT)),
                        tokenize_ns=duration(descendants, TOKENIZE_SPAN),
                        queue_ns=waiting if prefill is not None else None, prefill_ns=prefill,
                        num_prompt_tokens=token_count(a.get(vllm.PROMPT_TOKENS)))


def is_stage(span: SpanView) -> bool:
    """A stage span `timing_of` reads: one of its names, with a wall-clock duration."""
    return span.name in _STAGES and span.end_epoch_ns >= span.start_epoch_ns > 0


def duration(spans: list[SpanView], name: str) -> int | None:
    """The stage span `name`'s duration, within `nanos_ns`'s bounds (a day at most)."""
    for span in spans:
        if span.name == name and is_stage(span):
            return nanos_ns(span.end_epoch_ns - span.start_epoch_ns)
    return None
