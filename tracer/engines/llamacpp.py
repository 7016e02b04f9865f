"""llama.cpp `llama-server`: the `timings` object of the last stream chunk.

Read from ggml-org/llama.cpp `tools/server/server.cpp` (`result_timings::to_json`, b6000+):
`prompt_n` (tokens evaluated), `prompt_ms` (their evaluation: the prefill), `cache_n`
(prompt tokens reused from the slot's cache), `predicted_n`, `predicted_ms`; with a draft
model, `draft_n` and `draft_n_accepted` (`tools/server/server-task.cpp`,
`result_timings::to_json` @17f5f8a80d8a: written only when `draft_n > 0`). No arrival
stamp and no queue time: the prefill is placed against our first content and the rest of
the window is `upstream_other` (docs/architecture.md).
"""
from __future__ import annotations

from tracer.engines.timing import EngineTiming, millis_ns, token_count


def matches(timings: dict | None) -> bool:
    return isinstance(timings, dict) and "prompt_ms" in timings


def timing_of(timings: dict) -> EngineTiming:
    """
    >>> t = timing_of({"prompt_n": 10, "prompt_ms": 12.5, "cache_n": 90, "predicted_n": 4})
    >>> t.prefill_ns, t.num_prompt_tokens, t.num_cached_tokens
    (12500000, 100, 90)
    """
    prompt, cached = token_count(timings.get("prompt_n")), token_count(timings.get("cache_n"))
    prefill = millis_ns(timings.get("prompt_ms"))
    return EngineTiming("llamacpp", prefill_ns=prefill, ttft_ns=prefill,
                        num_prompt_tokens=None if prompt is None else prompt + (cached or 0),
                        num_cached_tokens=cached)


def draft_of(timings: dict | None) -> tuple[int, int]:
    """(drafted, accepted) tokens of speculative decoding; (0, 0) when not reported, or
    when the pair is not one (negative, not an int, more accepted than drafted).

    >>> draft_of({"draft_n": 604, "draft_n_accepted": 515}), draft_of({"draft_n": 2, "draft_n_accepted": 3})
    ((604, 515), (0, 0))
    >>> draft_of({"draft_n": -1, "draft_n_accepted": 0}), draft_of({"draft_n": 1.5}), draft_of(None)
    ((0, 0), (0, 0), (0, 0))
    """
    if not isinstance(timings, dict):
        return 0, 0
    drafted = token_count(timings.get("draft_n"))
    accepted = token_count(timings.get("draft_n_accepted"))
    if drafted is None or accepted is None or accepted > drafted:
        return 0, 0
    return drafted, accepted
