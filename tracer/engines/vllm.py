"""vLLM (v1): the `llm_request` span.

Read from vllm-project/vllm `vllm/v1/engine/output_processor.py` `OutputProcessor.do_tracing`
(commit d07822605346, 2026): span `llm_request`, kind SERVER, `start_time` = the request's
arrival (`RequestStateStats.arrival_time`, wall clock), parent = the trace context of the
incoming headers, i.e. the `traceparent` the proxy forwarded. Attributes, in seconds:

- `gen_ai.latency.time_to_first_token` = first_token_latency (arrival → first token);
- `gen_ai.latency.time_in_queue` = scheduled_ts − queued_ts;
- `gen_ai.latency.time_in_model_prefill` = first_token_ts − scheduled_ts;
- `gen_ai.usage.prompt_tokens`;
- `gen_ai.usage.cached_tokens` (`SpanAttributes.GEN_AI_USAGE_CACHED_TOKENS` in a stored
  version of `vllm/tracing/utils.py` whose commit the code index does not name; the commit
  above has no such attribute): read when present, kept only when it is a token count no
  larger than the prompt's (a count beyond the prompt is not a cache hit, and would corrupt
  the cached-token figures).

Matched on its attributes, never on its name: under
`OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` vLLM names the span
`"{gen_ai.operation.name} {gen_ai.request.model}"` (e.g. `chat facebook/opt-125m`) and adds
those two attributes, keeping the legacy ones (`latest_gen_ai_semconv_attributes` in
`vllm/tracing/utils.py`, tested by `tests/tracing/test_gen_ai_semconv.py` at 2b1064819ee7).

What vLLM's TTFT holds besides queue and prefill (the front-end → engine-core hand-off and
the output processing of the first token) is `engine_other`.

The request-lifecycle spans (vllm-project/vllm `tests/tracing/test_request_lifecycle_tracing.py`
at 8d1fa3c4c8cd, and vLLM's tracing design doc for PR #44402, whose phase 1 adds them):
`vllm.request.queue`, `vllm.request.prefill`, `vllm.request.decode` and, only when the request
enters `WAITING_FOR_REMOTE_KVS`, `vllm.request.wait_remote_kv`, each a child of the request
span, in the same trace, with wall-clock ends. They carry no `gen_ai.request.id` and no
attribute that names their phase (the design leaves the `vllm.kv_transfer.*` names to the
implementation PR), so a child is found by its parent, the request span matched on its
attributes, and its phase read from its name within the `vllm.request.` namespace; a span of
that name anywhere else is nobody's. The summary attributes already give queue and prefill;
read from the children are a prefill span's `preempted: true` (set when the request was
preempted during it, `trace_preempt`: the record's `preempted` event, which the diagnosis
reads) and the remote-KV wait. With prefill/decode disaggregation the wait is the decode
instance waiting for the prefill instance's KV cache, and it lies inside vLLM's queue time: the
scheduler moves a request that loads its KV asynchronously to `WAITING_FOR_REMOTE_KVS` and
records its SCHEDULED event only once the KV is in (`Scheduler.schedule`,
`vllm/v1/core/sched/scheduler.py` at b4622cf924bc). So kv_transfer = the wait, queue = queue
time less it, and kv_transfer comes before the decode instance's prefill (its first step on
the transferred cache). A wait longer than the queue contradicts that and is not read.
"""
from __future__ import annotations

from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, nanos_ns, seconds_ns, token_count

SPAN_NAME = "llm_request"
LIFECYCLE_PREFIX = "vllm.request."
WAIT_REMOTE_KV = LIFECYCLE_PREFIX + "wait_remote_kv"
PREFILL_SPAN = LIFECYCLE_PREFIX + "prefill"
PREEMPTED = "preempted"
TTFT = "gen_ai.latency.time_to_first_token"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
CACHED_TOKENS = "gen_ai.usage.cached_tokens"


def matches(span: SpanView) -> bool:
    a = span.attributes
    return TTFT in a and QUEUE in a and PREFILL in a


def is_lifecycle(span: SpanView) -> bool:
    """A lifecycle span `timing_of` reads under a request span: its name, wall-clock ends."""
    return span.name in (WAIT_REMOTE_KV, PREFILL_SPAN) \
        and span.end_epoch_ns >= span.start_epoch_ns > 0


def timing_of(span: SpanView, lifecycle: list[SpanView] = ()) -> EngineTiming:
    """`lifecycle`: the request span's lifecycle spans (`is_lifecycle`), first of each name.

    >>> s = SpanView("a" * 32, "b" * 16, "c" * 16, SPAN_NAME, 5, {TTFT: 0.3, QUEUE: 0.1, PREFILL: 0.15})
    >>> timing_of(s).queue_ns, timing_of(s).prefill_ns, timing_of(s).arrival_epoch_ns
    (100000000, 150000000, 5)
    >>> kv = SpanView("a" * 32, "k" * 16, "b" * 16, WAIT_REMOTE_KV, 10**6, {}, 61 * 10**6)
    >>> t = timing_of(s, [kv])
    >>> t.parts(), t.ttft_ns
    ((('queue', 40000000), ('kv_transfer', 60000000), ('prefill', 150000000)), 300000000)
    """
    a = span.attributes
    prompt, cached = token_count(a.get(PROMPT_TOKENS)), token_count(a.get(CACHED_TOKENS))
    if cached is not None and (prompt is None or cached > prompt):
        cached = None
    queue, kv_wait = seconds_ns(a.get(QUEUE)), _wait_ns(lifecycle)
    if kv_wait is not None and (queue is None or kv_wait > queue):
        kv_wait = None      # not inside the queue, as vLLM's scheduler puts it: not read
    elif kv_wait is not None:
        queue -= kv_wait
    return EngineTiming("vllm", arrival_epoch_ns=span.start_epoch_ns or None,
                        ttft_ns=seconds_ns(a.get(TTFT)), queue_ns=queue,
                        prefill_ns=seconds_ns(a.get(PREFILL)), kv_transfer_ns=kv_wait,
                        kv_transfer_before_prefill=kv_wait is not None,
                        num_prompt_tokens=prompt, num_cached_tokens=cached,
                        preempted=any(c.name == PREFILL_SPAN
                                      and c.attributes.get(PREEMPTED) is True
                                      for c in lifecycle))


def _wait_ns(lifecycle: list[SpanView]) -> int | None:
    for child in lifecycle:
        if child.name == WAIT_REMOTE_KV and is_lifecycle(child):
            return nanos_ns(child.end_epoch_ns - child.start_epoch_ns)
    return None
