"""What an engine says about one request's first token, whichever engine said it.

Every adapter (`tracer.engines.vllm`, `sglang`, `trtllm`, `tgi`, `llamacpp`) turns its
engine's own signal into one `EngineTiming`; each field is known (a number) or absent
(None), never guessed. Durations are integer ns, converted once here from what the engine
sent (seconds or ms).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# The closed `source` label of `llm_engine_timing_total`; "none": no signal arrived.
ENGINE_SOURCES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "tgi", "llamacpp", "none")
# The closed `outcome` label. Of records: joined (it got the engine's timing), no_signal
# (nothing to wait for: no receiver, or the request produced no first token), timeout (it
# waited its time and was published without), conflict (two different spans claimed it: it
# was published with neither). Of spans beyond the one a record joined: unmatched_span (no
# proxy record: another proxy's, a late one, or a forged one), duplicate_span (the joined
# span sent again: an exporter's retry), conflict_span (a different span for a request that
# already had one). tracer/proxy/engine_join.py.
ENGINE_OUTCOMES: tuple[str, ...] = ("joined", "no_signal", "timeout", "conflict",
                                    "unmatched_span", "duplicate_span", "conflict_span")
# The largest duration taken from an engine: a day. Anything beyond is not a latency.
_MAX_NS = 86_400 * 10**9


@dataclass(slots=True, frozen=True)
class EngineTiming:
    """One request as its engine timed it.

    `arrival_epoch_ns` is the engine's wall-clock arrival stamp (an OTLP span's start), the
    only field that needs the engine's clock to agree with ours; `ttft_ns` is the engine's
    own arrival → first token. `parts` returns the known ones among tokenize, queue,
    prefill and inference, in pipeline order.

    >>> t = EngineTiming("vllm", queue_ns=5, prefill_ns=7, ttft_ns=20)
    >>> t.parts()
    (('queue', 5), ('prefill', 7))
    """

    source: str
    arrival_epoch_ns: int | None = None
    ttft_ns: int | None = None
    tokenize_ns: int | None = None
    queue_ns: int | None = None
    prefill_ns: int | None = None
    inference_ns: int | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None

    def parts(self) -> tuple[tuple[str, int], ...]:
        return tuple((stage, ns) for stage, ns in (
            ("tokenize", self.tokenize_ns), ("queue", self.queue_ns),
            ("prefill", self.prefill_ns), ("inference", self.inference_ns)) if ns is not None)


def seconds_ns(value) -> int | None:
    """A duration in seconds (a span attribute) as ns; None unless a finite number in
    [0, one day].

    >>> seconds_ns(0.25), seconds_ns(-1.0), seconds_ns(float("nan")), seconds_ns("1"), seconds_ns(True)
    (250000000, None, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    ns = round(value * 1e9)
    return ns if ns <= _MAX_NS else None


def millis_ns(value) -> int | None:
    """A duration in ms (llama.cpp timings, TGI headers) as ns, with `seconds_ns`'s bounds.

    >>> millis_ns(12.5), millis_ns(None)
    (12500000, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return seconds_ns(value / 1e3)


def token_count(value) -> int | None:
    """A token count: a non-negative int (JSON or OTLP int), else None.

    >>> token_count(12), token_count(-1), token_count(1.5), token_count(False)
    (12, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
