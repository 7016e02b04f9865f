"""What an engine says about one request's first token, whichever engine said it.

Every adapter (`tracer.engines.vllm`, `sglang`, `trtllm`, `tgi`, `tgi_span`, `llamacpp`,
`ollama`) turns its engine's own signal into one `EngineTiming`; each field is known (a
number) or absent (None), never guessed. Durations are integer ns, converted once here from
what the engine sent (seconds, ms, ns or a Rust `Duration`'s `Debug` string).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The closed `source` label of `llm_engine_timing_total`; "none": no signal arrived.
ENGINE_SOURCES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "tgi", "llamacpp", "ollama",
                                   "none")
# The closed `outcome` label. Of records: joined (it got the engine's timing), no_signal
# (nothing to wait for: no receiver, or the request produced no first token), timeout (it
# waited its time and was published without), conflict (two different spans claimed it: it
# was published with neither), late (its span came after it was published without one:
# the trace store's copy got the engine's timing, the metrics kept what they had seen). Of
# spans beyond the one a record joined: unmatched_span (no proxy record: another proxy's,
# one whose record left the store, or a forged one), duplicate_span (the joined span sent
# again: an exporter's retry), conflict_span (a different span for a request that already
# had one). tracer/proxy/engine_join.py.
ENGINE_OUTCOMES: tuple[str, ...] = ("joined", "no_signal", "timeout", "conflict", "late",
                                    "unmatched_span", "duplicate_span", "conflict_span")
# The largest duration taken from an engine: a day. Anything beyond is not a latency.
_MAX_NS = 86_400 * 10**9


@dataclass(slots=True, frozen=True)
class EngineTiming:
    """One request as its engine timed it.

    `arrival_epoch_ns` is the engine's wall-clock arrival stamp (an OTLP span's start), the
    only field that needs the engine's clock to agree with ours; `ttft_ns` is the engine's
    own arrival → first token. `parts` returns the known ones among tokenize, queue,
    model_load (Ollama's `load_duration`), prefill, kv_transfer (prefill/decode
    disaggregation: the KV cache on its way from the prefill worker to the decode worker) and
    inference, in pipeline order. SGLang's transfer follows the prefill worker's prefill;
    vLLM's decode instance waits for it before its own first step, its `prefill`
    (`kv_transfer_before_prefill`). `prefill_span_id`: with SGLang's disaggregation, the
    prefill worker's request span, whose stage spans gave queue, prefill and kv_transfer (the
    rest is the decode worker's, whose request span carries the client's TTFT); "" otherwise.

    >>> t = EngineTiming("vllm", queue_ns=5, prefill_ns=7, ttft_ns=20)
    >>> t.parts()
    (('queue', 5), ('prefill', 7))
    """

    source: str
    arrival_epoch_ns: int | None = None
    ttft_ns: int | None = None
    tokenize_ns: int | None = None
    queue_ns: int | None = None
    model_load_ns: int | None = None
    prefill_ns: int | None = None
    kv_transfer_ns: int | None = None
    inference_ns: int | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    prefill_span_id: str = ""
    kv_transfer_before_prefill: bool = False
    preempted: bool = False     # preempted before its first token (vLLM's lifecycle spans)

    def parts(self) -> tuple[tuple[str, int], ...]:
        prefill, kv = ("prefill", self.prefill_ns), ("kv_transfer", self.kv_transfer_ns)
        return tuple((stage, ns) for stage, ns in (
            ("tokenize", self.tokenize_ns), ("queue", self.queue_ns),
            ("model_load", self.model_load_ns),
            *((kv, prefill) if self.kv_transfer_before_prefill else (prefill, kv)),
            ("inference", self.inference_ns))
            if ns is not None)


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


def nanos_ns(value) -> int | None:
    """A duration in ns (Ollama's Go `time.Duration`, a JSON integer), within `seconds_ns`'s
    bounds; an int is kept exact (no float round trip), a finite float is rounded.

    >>> nanos_ns(1_500_000_001), nanos_ns(2.6), nanos_ns(-1), nanos_ns(10**30), nanos_ns("5")
    (1500000001, 3, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = round(value)
    return value if 0 <= value <= _MAX_NS else None


# Rust's `Debug` of `std::time::Duration` (TGI's span fields): an integer part, up to nine
# fraction digits, one of its four units; nothing else (no sign, exponent or space).
_DEBUG_DURATION = re.compile(r"([0-9]{1,20})(?:\.([0-9]{1,9}))?(ns|\u00b5s|ms|s)")
_UNIT_NS = {"ns": 1, "\u00b5s": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def debug_duration_ns(value) -> int | None:
    """A Rust `Duration` as `format!("{:?}")` writes it ("12.5ms", "1.000000001s", "830ns",
    "7.25\u00b5s") as exact integer ns, within `seconds_ns`'s bounds; None for anything else.
    Also taken wrapped in one pair of double quotes (a string recorded through `Debug`).

    >>> debug_duration_ns("12.5ms"), debug_duration_ns('"1.000000001s"'), debug_duration_ns("7.25\u00b5s")
    (12500000, 1000000001, 7250)
    >>> debug_duration_ns("-1ms"), debug_duration_ns("NaNms"), debug_duration_ns("2e3ms"), debug_duration_ns(12)
    (None, None, None, None)
    """
    if not isinstance(value, str) or len(value) > 40:
        return None
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    found = _DEBUG_DURATION.fullmatch(value)
    if found is None:
        return None
    whole, fraction, unit = found.groups()
    unit_ns = _UNIT_NS[unit]
    ns = int(whole) * unit_ns
    if fraction:
        ns += int(fraction) * unit_ns // 10 ** len(fraction)
    return nanos_ns(ns)


def token_count(value) -> int | None:
    """A token count: a non-negative int (JSON or OTLP int), else None.

    >>> token_count(12), token_count(-1), token_count(1.5), token_count(False)
    (12, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
