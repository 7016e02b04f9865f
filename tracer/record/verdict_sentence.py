"""The middle of a verdict's sentence, per cause, from its evidence (`_DETAIL`), and the
culprit it was spent behind when one is named (`_culprit_detail`); `Verdict.sentence`
(tracer/record/verdict.py) puts the cause's title before it and the change after it.

Apart from the verdict because it is the wording, one entry per cause of
`tracer.record.causes`: a new cause adds its sentence here, and nothing here decides a
verdict.
"""
from __future__ import annotations

from collections.abc import Mapping

from tracer.record.causes import (
    BACKEND,
    BUFFERING,
    COLD_PATH,
    CPU_PREPROCESSING,
    FIRST_PRINTABLE_LATE,
    LONG_PROMPT,
    NETWORK,
    PREEMPTED,
    PREFIX_CACHE_MISS,
    QUEUEING,
    SLOW_KV_TRANSFER,
    SLOW_PREFILL,
    THINKING,
)


def _culprit_detail(e: Mapping) -> str:
    """"; 72 % of it behind trace 4bf92f35…'s 2400-token prefill", when one is named."""
    if e.get("culprit_trace_id") is None:
        return ""
    share = e.get("culprit_share")
    share_text = "" if not isinstance(share, (int, float)) else f"{share:.0%} of it "
    many = e.get("num_neighbours")
    behind = f"; behind {_n(many)} request{'s' if many != 1 else ''}, " if many else "; "
    return (f"{behind}{share_text}behind trace {str(e['culprit_trace_id'])[:8]}…'s "
            f"{_n(e.get('culprit_prompt_tokens'))}-token {e.get('culprit_phase')}")


def _n(value) -> str:
    return "?" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


# The sentence's middle, per cause, from its evidence.
_DETAIL = {
    QUEUEING.name: lambda e: (
        f"waited {_n(e['queue_ms'])} ms in {e['queue_stage']} " + (
            "with no normal known yet" if e["normal_queue_ms"] is None
            else f"against a normal {_n(e['normal_queue_ms'])} ms") + (
            "" if e["num_waiting_at_arrival"] is None and e["num_running_at_arrival"] is None
            else f", with {_n(e['num_waiting_at_arrival'])} waiting and "
                 f"{_n(e['num_running_at_arrival'])} running at arrival")),
    LONG_PROMPT.name: lambda e: (
        f"{_n(e['uncached_tokens'])} uncached prompt tokens against a usual "
        f"{_n(e['usual_uncached_tokens'])}, prefilled in {_n(e['prefill_ms'])} ms"),
    PREFIX_CACHE_MISS.name: lambda e: (
        f"{e['shared_fraction']:.0%} of the prompt's text was in a recent prompt, yet only "
        f"{_n(e['cached_tokens'])} of {_n(e['prompt_tokens'])} tokens came from the prefix "
        f"cache (about {_n(e['cacheable_tokens'])} could have): the shared text does not "
        f"start the prompt, or the cache is off"),
    SLOW_PREFILL.name: lambda e: (
        f"prefill took {_n(e['prefill_ms'])} ms for {_n(e['uncached_tokens'])} tokens, "
        f"{_n(e['prefill_ms_per_token'])} ms a token " + (
            "with no normal known for this length yet" if e["normal_prefill_ms_per_token"]
            is None else f"against a normal {_n(e['normal_prefill_ms_per_token'])}") +
        f", in steps of up to {_n(e['max_batch_size'])} requests"),
    CPU_PREPROCESSING.name: lambda e: (
        f"receive to KV lookup took {_n(e['preprocess_ms'])} ms against a normal "
        f"{_n(e['normal_preprocess_ms'])} ms, most in {e['slowest_stage']}"),
    NETWORK.name: lambda e: (
        f"the browser waited {_n(e['client_ttft_ms'])} ms, the server {_n(e['server_ttft_ms'])}"
        f" ms: {_n(e['network_ms'])} ms between them, " + (
            "with no normal measured yet" if e["normal_network_ms"] is None
            else f"against a normal {_n(e['normal_network_ms'])} ms")),
    BUFFERING.name: lambda e: (
        f"{_n(e['held_back_ms'])} ms of the stream was held back and released at once "
        f"({_n(e['network_ms'])} ms between the server and the browser)"),
    FIRST_PRINTABLE_LATE.name: lambda e: (
        f"{_n(e['tokens_before_text'])} tokens were generated before the first printable "
        f"text, {_n(e['detokenize_ms'])} ms after the first token"),
    COLD_PATH.name: lambda e: (
        "the first request since start" if e["requests_since_start"] == 0 else
        f"the first request after {_n(e['idle_s'])} s idle"),
    THINKING.name: lambda e: (
        f"it thought for {_n(e['reasoning_ms'])} ms before its first text, against a normal "
        f"{_n(e['normal_reasoning_ms'])} ms" + (
            "" if e["reasoning_tokens"] is None else f" ({_n(e['reasoning_tokens'])} reasoning "
                                                     f"tokens)")),
    PREEMPTED.name: lambda e: (
        f"preempted {_n(e['num_preemptions'])} times before its first token, its prefill "
        f"({_n(e['prefill_ms'])} ms) recomputed"),
    BACKEND.name: lambda e: (
        f"{e['segment']!r} ({e['service'] or 'your service'}) took {_n(e['segment_ms'])} ms "
        f"on the critical path against a normal {_n(e['normal_segment_ms'])} ms"),
    SLOW_KV_TRANSFER.name: lambda e: (
        f"the KV cache of {_n(e['prompt_tokens'])} prompt tokens took "
        f"{_n(e['kv_transfer_ms'])} ms from the prefill worker to the decode worker, against "
        f"a normal {_n(e['expected_kv_transfer_ms'])} ms for that length"),
}
