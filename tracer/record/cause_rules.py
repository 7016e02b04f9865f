"""The rules of the TTFT verdict, one per cause of `tracer.record.causes`: what each reads of
a record (`Signals`, tracer/record/diagnosis_signals.py), when it fires, and the excess over
normal it reports (a `Finding`, tracer/record/rule_outcome.py). `tracer.record.verdict`
runs them and picks the cause; docs/architecture.md, "Diagnosis", has the table.

A rule whose cause `needs_baseline` answers `Unjudged` when the record's signal could be
above normal (it is at least the floor) but the series it compares with is too short to
say: the verdict is then `unjudged` unless something that needs no history fired. A signal
under the floor needs no baseline to be judged fine: no normal could make it a cause.
"""
from __future__ import annotations

from tracer.record.baselines import ModelBaseline
from tracer.record.causes import (
    COLD_PATH,
    CULPRIT_EVIDENCE,
    CPU_PREPROCESSING,
    FIRST_PRINTABLE_LATE,
    LONG_PROMPT,
    PREEMPTED,
    PREFIX_CACHE_MISS,
    QUEUEING,
    SLOW_KV_TRANSFER,
    SLOW_PREFILL,
    THINKING,
)
from tracer.record.diagnosis_signals import PREPROCESS_STAGES, Context, Signals
from tracer.record.rule_outcome import Finding, Outcome, Unjudged

_MS = 1_000_000
# Long prompt: at least this many times the model's usual uncached prompt, and this long.
LONG_PROMPT_FACTOR = 4.0
LONG_PROMPT_MIN_TOKENS = 256
# Slow prefill: at least this many times the prefill normal for its length; a slow KV
# transfer likewise, against the transfer normal for its prompt's length.
SLOW_PREFILL_FACTOR = 1.5
SLOW_KV_TRANSFER_FACTOR = 1.5
# Prefix-cache miss: this share of the prompt's text was in one recent prompt, and the cache
# served at least `MISS_MIN_SHARE` of the prompt (and `MISS_MIN_TOKENS`) less than that.
MISS_MIN_SHARED = 0.5
MISS_MIN_SHARE = 0.25
MISS_MIN_TOKENS = 32
# Cold path: idle this long before the request (or the first request since start).
IDLE_COLD_S = 120.0
# Where a request waits for a batch slot: our engine's (or a joined engine's) queue, else,
# behind a proxy whose engine reports its prefill but no arrival (llama.cpp's `timings`),
# `upstream_other`, which then holds the wait for a slot (docs/architecture.md, "Diagnosis").
QUEUE_STAGES = ("queue", "upstream_other")
# Filled by the diagnosis once it has asked for the neighbours (tracer/core/diagnoser.py).
_NO_CULPRIT = dict.fromkeys(CULPRIT_EVIDENCE)


def _samples(b: ModelBaseline, name: str, normal) -> int | None:
    """The history a finding's excess was measured against: None when it read no median."""
    return None if normal is None else b.samples(name)


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / _MS, 1)


# -- the rules: one per cause, each (signals, baseline, context, floor) ->
#    Finding | Unjudged | None (None: it does not apply, or it judged the request fine) ------

def _preempted(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    if not s.num_preemptions or s.prefill_ns is None:
        return None
    expected = b.expected_prefill_ns(s.uncached_tokens) or 0.0
    excess = int(s.prefill_ns + s.stage_ns.get("queue", 0) - expected
                 - (b.median("queue") or 0.0))
    return Finding(PREEMPTED.name, max(excess, 0),
                   {"num_preemptions": s.num_preemptions, "prefill_ms": _ms(s.prefill_ns),
                    "baseline_samples": None})     # the event is the evidence


def _cold_path(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    evidence = {"requests_since_start": c.requests_since_start,
                "idle_s": None if c.idle_s is None else round(c.idle_s, 1),
                "baseline_samples": None}
    if c.requests_since_start == 0:
        return Finding(COLD_PATH.name, None, evidence)   # nothing is known of normal yet
    if c.idle_s is None or c.idle_s < IDLE_COLD_S:
        return None
    normal = b.median("ttft")
    if normal is None:      # idle that long is the evidence; how much it cost is not known
        return Finding(COLD_PATH.name, None, evidence)
    excess = s.ttft_ns - normal
    evidence["baseline_samples"] = b.samples("ttft")
    return Finding(COLD_PATH.name, int(excess), evidence) if excess >= floor_ns else None


def _queueing(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    stage = next((st for st in QUEUE_STAGES if st in s.stage_ns), None)
    if stage is None or (s.num_waiting == 0 and s.num_running == 0):
        # An engine that was empty at arrival had a free slot: a queue stage then is its step
        # loop starting late (a starved host CPU), which no batch-slot knob fixes.
        return None
    queue_ns = s.stage_ns[stage]
    if queue_ns < floor_ns:
        return None                     # under the floor whatever is normal
    normal = b.median(stage)
    if normal is None and not s.num_waiting:
        # With requests waiting at arrival the queue was behind them, which needs no
        # history. Without: a step in flight or a slot it had to wait for; only the usual
        # queue says which (the neighbours' blame may still name who held it).
        return Unjudged(QUEUEING.name, b.samples(stage))
    excess = queue_ns - (normal or 0.0)     # a queue's ideal is empty
    if excess < floor_ns:
        return None
    return Finding(QUEUEING.name, int(excess), {
        "queue_stage": stage, "queue_ms": _ms(queue_ns), "normal_queue_ms": _ms(normal),
        "num_waiting_at_arrival": s.num_waiting, "num_running_at_arrival": s.num_running,
        **_NO_CULPRIT, "baseline_samples": _samples(b, stage, normal)})


def _long_prompt(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    # Judged on what a working prefix cache would have left to prefill: tokens a recent
    # prompt shared and the cache missed are the miss's, not the length's.
    n = s.uncached_tokens - _missed_tokens(s, c)
    if s.prefill_ns is None or n < LONG_PROMPT_MIN_TOKENS or s.prefill_ns < floor_ns:
        return None
    usual = b.usual_uncached_tokens()
    if usual is None:
        return Unjudged(LONG_PROMPT.name, b.samples("uncached_tokens"))
    if n < LONG_PROMPT_FACTOR * max(usual, 1.0):
        return None
    # The part of the prefill beyond what the usual length would take, at this one's rate.
    excess = s.prefill_ns * (1.0 - usual / n)
    if excess < floor_ns:
        return None
    return Finding(LONG_PROMPT.name, int(excess), {
        "uncached_tokens": n, "usual_uncached_tokens": round(usual),
        "prefill_ms": _ms(s.prefill_ns), "baseline_samples": b.samples("uncached_tokens")})


def _missed_tokens(s: Signals, c: Context) -> int:
    """Prompt tokens a recent prompt shared that the prefix cache did not serve; 0 below
    the miss rule's thresholds."""
    overlap = c.overlap
    if overlap is None or overlap.shared_fraction < MISS_MIN_SHARED or s.uncached_tokens <= 0:
        return 0
    cacheable = int(overlap.shared_fraction * s.prompt_tokens)
    missed = min(cacheable - s.cached_tokens, s.uncached_tokens)
    return missed if missed >= max(MISS_MIN_TOKENS, MISS_MIN_SHARE * s.prompt_tokens) else 0


def _prefix_cache_miss(s: Signals, b: ModelBaseline, c: Context,
                       floor_ns: float) -> Outcome:
    missed = _missed_tokens(s, c)
    if not missed or s.prefill_ns is None:
        return None
    overlap = c.overlap
    cacheable = int(overlap.shared_fraction * s.prompt_tokens)
    excess = s.prefill_ns * missed / s.uncached_tokens
    if excess < floor_ns:
        return None
    return Finding(PREFIX_CACHE_MISS.name, int(excess), {
        "shared_fraction": round(overlap.shared_fraction, 2), "cached_tokens": s.cached_tokens,
        "prompt_tokens": s.prompt_tokens, "cacheable_tokens": cacheable,
        "shared_with_trace_id": overlap.trace_id,
        "baseline_samples": None})      # the shared text and the cached tokens: no history


def _slow_prefill(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    n = s.uncached_tokens
    if s.prefill_ns is None or n <= 0 or s.prefill_ns < floor_ns:
        return None
    expected = b.expected_prefill_ns(n)
    if expected is None:    # this length's normal is not known yet
        return Unjudged(SLOW_PREFILL.name, b.samples_per_token("prefill", n))
    if s.prefill_ns < SLOW_PREFILL_FACTOR * expected:
        return None
    excess = s.prefill_ns - expected
    if excess < floor_ns:
        return None
    return Finding(SLOW_PREFILL.name, int(excess), {
        "prefill_ms": _ms(s.prefill_ns), "expected_prefill_ms": _ms(expected),
        "prefill_ms_per_token": round(s.prefill_ns / _MS / n, 3),
        "normal_prefill_ms_per_token": round(expected / _MS / n, 3),
        "uncached_tokens": n, "max_batch_size": s.max_batch_size, **_NO_CULPRIT,
        "baseline_samples": b.samples_per_token("prefill", n)})


def _slow_kv_transfer(s: Signals, b: ModelBaseline, c: Context,
                      floor_ns: float) -> Outcome:
    # With prefill/decode disaggregation, the whole prompt's KV cache moves between workers:
    # judged per prompt token, like with like (docs/architecture.md, "Inside the engine").
    kv_ns = s.stage_ns.get("kv_transfer")
    if kv_ns is None or kv_ns < floor_ns or s.prompt_tokens <= 0:
        return None
    expected = b.expected_ns("kv_transfer", s.prompt_tokens)
    if expected is None:
        return Unjudged(SLOW_KV_TRANSFER.name,
                        b.samples_per_token("kv_transfer", s.prompt_tokens))
    if kv_ns < SLOW_KV_TRANSFER_FACTOR * expected:
        return None
    excess = kv_ns - expected
    if excess < floor_ns:
        return None
    return Finding(SLOW_KV_TRANSFER.name, int(excess), {
        "kv_transfer_ms": _ms(kv_ns), "expected_kv_transfer_ms": _ms(expected),
        "prompt_tokens": s.prompt_tokens,
        "baseline_samples": b.samples_per_token("kv_transfer", s.prompt_tokens)})


def _cpu_preprocessing(s: Signals, b: ModelBaseline, c: Context,
                       floor_ns: float) -> Outcome:
    if s.preprocess_ns is None or s.preprocess_ns < floor_ns:
        return None
    normal = b.median("preprocess")
    if normal is None:
        return Unjudged(CPU_PREPROCESSING.name, b.samples("preprocess"))
    excess = s.preprocess_ns - normal
    if excess < floor_ns:
        return None
    slowest = max((st for st in PREPROCESS_STAGES if st in s.stage_ns),
                  key=lambda st: s.stage_ns[st] - (b.median(st) or 0.0))
    return Finding(CPU_PREPROCESSING.name, int(excess), {
        "preprocess_ms": _ms(s.preprocess_ns), "normal_preprocess_ms": _ms(normal),
        "slowest_stage": slowest, "baseline_samples": b.samples("preprocess")})


def _first_printable_late(s: Signals, b: ModelBaseline, c: Context,
                          floor_ns: float) -> Outcome:
    detok_ns = s.stage_ns.get("detokenize")
    if s.tokens_before_text < 2 or detok_ns is None:
        return None
    # No floor: the evidence is the token count, not a noisy duration, and the excess is
    # exactly the extra decode steps (one step can be under the floor on a fast engine).
    normal = b.median("detokenize")
    excess = detok_ns - (normal or 0.0)
    if excess <= 0:
        return None
    return Finding(FIRST_PRINTABLE_LATE.name, int(excess), {
        "tokens_before_text": s.tokens_before_text, "detokenize_ms": _ms(detok_ns),
        "baseline_samples": _samples(b, "detokenize", normal)})


def _thinking(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Outcome:
    # The `reasoning` segment: the first thinking to the first text (tracer/record/
    # output_segments.py). A reasoning model always thinks: only a think longer than its
    # model's normal one explains TTFT above normal.
    think_ns = s.stage_ns.get("reasoning")
    if think_ns is None or think_ns < floor_ns:
        return None
    normal = b.median("reasoning")
    if normal is None:
        return Unjudged(THINKING.name, b.samples("reasoning"))
    excess = think_ns - normal
    if excess < floor_ns:
        return None
    return Finding(THINKING.name, int(excess), {
        "reasoning_ms": _ms(think_ns), "normal_reasoning_ms": _ms(normal),
        "reasoning_tokens": s.reasoning_tokens, "baseline_samples": b.samples("reasoning")})


# Every rule, run on every judged record (`tracer.record.verdict.judge`); the neighbours'
# rule, which needs the engine's step record, is `tracer.record.behind_neighbours`.
RULES = (_preempted, _cold_path, _queueing, _long_prompt, _prefix_cache_miss, _slow_prefill,
          _cpu_preprocessing, _first_printable_late, _thinking, _slow_kv_transfer)
