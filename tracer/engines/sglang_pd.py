"""SGLang with prefill/decode disaggregation: two workers, two request spans, one request.

Read from sgl-project/sglang, no code taken (docs/architecture.md, "Inside the engine"):

- `python/sglang/srt/observability/req_time_stats.py` at 00ce49e05c17: `init_trace_ctx` gives
  each worker's request its own `TraceReqContext(rid, bootstrap_room, role=disagg_mode_str())`.
  `RequestStage` and its setters slice the prefill worker's request into `prefill_prepare`
  (scheduler receipt → bootstrap queue), `prefill_bootstrap` (→ wait queue: the handshake
  with the decode worker), `prefill_waiting` (→ forward), `prefill_forward` (→ prefill
  finished) and `prefill_transfer_kv_cache` (transfer queue entry → KV transfer finished),
  and the decode worker's into `decode_prepare`, `decode_bootstrap`, `decode_transferred`
  (transfer queue → wait queue: waiting for the KV to arrive), `decode_waiting`,
  `decode_forward` and `fake_output`; `trace_slice` makes each a span with wall-clock ends.
- `python/sglang/srt/observability/trace.py` at b8e5a7c39773 (the commit the code index
  stores): `trace_req_start` names the request span `f"{role} Req {rid[:8]}"` with attributes
  `rid`, `module` and, when the request has one, `bootstrap_room` (`str(hex(room))`), parented
  on the incoming `traceparent`; each process hangs a thread span under it and its slices
  under that (or under its open slice): they are the request span's descendants.
- `sgl-model-gateway/src/routers/http/pd_router.rs` at ca7a22045714:
  `execute_dual_dispatch_internal` sends one body (one `bootstrap_room`,
  `inject_bootstrap_into_value`) with the same headers, `traceparent` among them
  (`build_post_with_headers`), to both workers at once, and streams the decode worker's
  response to the client; the prefill worker's is read and dropped.

So the decode worker's request span carries the client's TTFT: its arrival to the first
token it streamed, which could not come before the KV cache arrived. Its prefill worker's
request span is the one in the same trace under the same parent with the same
`bootstrap_room` (two such spans: neither, never a guess). From the prefill worker's stage
spans, each a duration on its own clock: queue = `prefill_waiting`, prefill =
`prefill_forward`, kv_transfer = `prefill_transfer_kv_cache`; tokenize is the decode
worker's `tokenize`. The rest of the decode worker's TTFT stays `engine_other`: both
workers' preparation, the bootstrap handshake (it ends where `prefill_waiting` begins, before
the queue, so it is not counted into kv_transfer, which comes after the prefill), the decode
worker's wait once the KV arrived and its first output step. `decode_transferred` is not the
transfer: it spans the prefill worker's queue and forward too.

Without its prefill worker's stage spans in the export, a decode worker's span is read as a
unified one (SGLang's decode mode makes no `prefill_waiting`: tokenize, then engine_other),
with no kv_transfer; a prefill worker's span alone is no request span at all.
"""
from __future__ import annotations

from collections.abc import Iterable

from tracer.engines import sglang, vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, seconds_ns, token_count

BOOTSTRAP_ROOM = "bootstrap_room"
# A longer room is not one SGLang wrote (a 64-bit room in hex is at most 18 characters).
_MAX_ROOM_CHARS = 64
_AMBIGUOUS = object()


def _key(span: SpanView) -> tuple[str, str, str] | None:
    room = span.attributes.get(BOOTSTRAP_ROOM)
    if not isinstance(room, str) or not room or len(room) > _MAX_ROOM_CHARS:
        return None
    return span.trace_id, span.parent_span_id, room


class PrefillWorkers:
    """The prefill workers' request spans of one export, by (trace id, parent span id,
    `bootstrap_room`): built once per export, so pairing is linear in its spans.

    >>> a = {BOOTSTRAP_ROOM: "0x1f"}
    >>> p = SpanView("a" * 32, "p" * 16, "c" * 16, "prefill Req 3f2a9c1e", 1, a)
    >>> d = SpanView("a" * 32, "d" * 16, "c" * 16, "decode Req 3f2a9c1e", 1, a)
    >>> PrefillWorkers([p, d]).partner(d).span_id
    'pppppppppppppppp'
    >>> PrefillWorkers([p, d]).partner(p) is None
    True
    """

    def __init__(self, spans: Iterable[SpanView]) -> None:
        self._by_key: dict[tuple[str, str, str], object] = {}
        for span in spans:
            key = _key(span) if sglang.role_of(span) == sglang.PREFILL_ROLE else None
            if key is None:
                continue
            prior = self._by_key.get(key)
            if prior is None or isinstance(prior, SpanView) and prior.span_id == span.span_id:
                self._by_key[key] = span
            else:   # two prefill spans claim one room: which is the pair cannot be told
                self._by_key[key] = _AMBIGUOUS

    def partner(self, decode: SpanView) -> SpanView | None:
        """The decode worker's span's prefill worker span, or None."""
        if sglang.role_of(decode) != sglang.DECODE_ROLE:
            return None
        key = _key(decode)
        found = self._by_key.get(key) if key is not None else None
        return found if isinstance(found, SpanView) else None


def timing_of(decode: SpanView, decode_stages: list[SpanView], prefill: SpanView,
              prefill_stages: list[SpanView]) -> EngineTiming | None:
    """The disaggregated request's timing, or None when the prefill worker's stage spans
    say nothing (then its decode span is read alone, by `sglang.timing_of`).

    >>> d = SpanView("a" * 32, "d" * 16, "c" * 16, "decode Req 1", 1, {vllm.TTFT: 0.05})
    >>> p = SpanView("a" * 32, "p" * 16, "c" * 16, "prefill Req 2", 1, {})
    >>> ms = lambda name, start, end: SpanView("a" * 32, "e" * 16, "f" * 16, name,
    ...                                        start * 10**6, {}, end * 10**6)
    >>> t = timing_of(d, [], p, [ms("prefill_waiting", 4, 10), ms("prefill_forward", 10, 40),
    ...                          ms("prefill_transfer_kv_cache", 40, 48)])
    >>> t.parts(), t.ttft_ns, t.prefill_span_id
    ((('queue', 6000000), ('prefill', 30000000), ('kv_transfer', 8000000)), 50000000, 'pppppppppppppppp')
    >>> timing_of(d, [], p, []) is None
    True
    """
    queue = sglang.duration(prefill_stages, sglang.WAITING_SPAN)
    forward = sglang.duration(prefill_stages, sglang.FORWARD_SPAN)
    transfer = sglang.duration(prefill_stages, sglang.TRANSFER_SPAN)
    if queue is None and forward is None and transfer is None:
        return None
    a = decode.attributes
    return EngineTiming("sglang", arrival_epoch_ns=decode.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(vllm.TTFT)),
                        tokenize_ns=sglang.duration(decode_stages, sglang.TOKENIZE_SPAN),
                        queue_ns=queue, prefill_ns=forward, kv_transfer_ns=transfer,
                        num_prompt_tokens=token_count(a.get(vllm.PROMPT_TOKENS)),
                        prefill_span_id=prefill.span_id)
