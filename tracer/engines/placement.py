"""The engine's timing as contiguous stages inside the proxy's upstream window.

The rule (docs/architecture.md, "Inside the engine"): the window runs from the end of
`upstream_connect` (the request can be written) to the arrival of the first content from
the upstream, W ns on our clock. The engine's interval is its own TTFT, E ns on its clock;
inside it lie the known parts (tokenize, queue, model_load, prefill, kv_transfer,
inference) and `engine_other`, E minus their sum. Around it lie `upstream_request` (before
the engine's arrival stamp) and `upstream_response` (after its first token). Durations only
ever come from one clock each (with prefill/decode disaggregation, each worker's from its
own), so none can be negative, and no stage takes time from a neighbour:

- E < sum(parts) or E > W: the signal contradicts itself or our window (it is not this
  request's, or not its first token): `inconsistent`, and the record keeps the proxy's
  five stages. Such a timing is never placed, and never dropped silently either: the
  placement names the reason (`REJECTIONS`) and says it in words with the numbers, which
  the record carries and `/ui` shows beside the waterfall.
- With an arrival stamp (a span's start, wall clock): its place on our clock is
  `to_perf(arrival)`. It must fall within [window start − skew, window end − E + skew];
  inside the tolerance it is clamped into the window (`wall_clock`); outside, the clocks
  disagree by more than the tolerance and the placement is refused (`clock_skew`, the
  proxy's five stages stay, and the reason is reported as above).
- Without one (llama.cpp timings, TGI headers), the interval ends where our first content
  arrived (`end_anchored`) and the rest of the window is `upstream_other`: both network
  legs and the engine's HTTP front, unsplit, since nothing tells them apart.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tracer.engines.timing import EngineTiming
from tracer.record.request_record import StageSpan

# Rounding of seconds → ns in the engine's own arithmetic (float seconds subtracted there).
_ROUNDING_NS = 2_000
PLACEMENTS = ("wall_clock", "end_anchored", "clock_skew", "inconsistent", "no_window")
# Why a timing that arrived cannot be placed: the closed `reason` label of
# `llm_engine_timing_rejected_total` (tracer/sinks/engine_timing.py). exceeds_window: the
# engine's interval is longer than the one observed from the request's write to its first
# output; parts_exceed_ttft: its parts sum to more than its own TTFT; clock_skew: its
# arrival stamp lies outside the observed interval by more than the clocks' tolerance. Never
# placed, never silent: the record carries the reason in words (`Placement.detail`).
REJECTIONS = ("exceeds_window", "parts_exceed_ttft", "clock_skew")
# A part's name in the reason's words.
_PART_WORDS = {"model_load": "load", "kv_transfer": "KV transfer"}
# The record attributes that carry a rejection (/ui shows the detail beside the waterfall).
REJECTION_ATTR = "llm.engine.rejection"
REJECTION_DETAIL_ATTR = "llm.engine.rejection_detail"


@dataclass(slots=True, frozen=True)
class Placement:
    """The stages after `upstream_connect` and their end boundaries (perf_counter ns), or
    none (`stages == ()`) with the reason in `kind`."""

    kind: str
    stages: tuple[str, ...] = ()
    ends_ns: tuple[int, ...] = ()
    skew_ns: int = 0     # how far the arrival stamp lay outside the window (wall_clock)
    rejected: str = ""   # one of REJECTIONS when the timing cannot fit; "" otherwise
    detail: str = ""     # that reason in words, with the numbers (no user text)


def place(timing: EngineTiming, *, window_start_ns: int | None, window_end_ns: int | None,
          to_perf_ns: Callable[[int], int], max_skew_ns: int) -> Placement:
    """
    >>> t = EngineTiming("vllm", arrival_epoch_ns=1_100, ttft_ns=500, queue_ns=100, prefill_ns=300)
    >>> p = place(t, window_start_ns=1_000, window_end_ns=2_000, to_perf_ns=lambda e: e,
    ...           max_skew_ns=0)
    >>> p.kind, list(zip(p.stages, p.ends_ns))
    ('wall_clock', [('upstream_request', 1100), ('queue', 1200), ('prefill', 1500), ('engine_other', 1600), ('upstream_response', 2000)])
    >>> o = EngineTiming("ollama", model_load_ns=200_000_000, prefill_ns=150_000_000,
    ...                  ttft_ns=350_000_000)
    >>> p = place(o, window_start_ns=0, window_end_ns=100_000_000, to_perf_ns=lambda e: e,
    ...           max_skew_ns=0)
    >>> p.kind, p.stages, p.rejected, p.detail
    ('inconsistent', (), 'exceeds_window', 'ollama: load + prefill 350 ms exceed the 100 ms observed before the first output')
    """
    if window_start_ns is None or window_end_ns is None or window_end_ns < window_start_ns:
        return Placement("no_window")
    parts = timing.parts()
    known_ns = sum(ns for _, ns in parts)
    engine_ns = timing.ttft_ns if timing.ttft_ns is not None else known_ns
    if not parts and timing.ttft_ns is None:
        return Placement("inconsistent")        # nothing to place: not an impossible timing
    if known_ns > engine_ns + _ROUNDING_NS:
        return Placement("inconsistent", rejected="parts_exceed_ttft", detail=(
            f"{timing.source}: {_parts_words(parts)} {_ms(known_ns)} ms exceed its own TTFT "
            f"of {_ms(engine_ns)} ms"))
    engine_ns = max(engine_ns, known_ns)
    window_ns = window_end_ns - window_start_ns
    if engine_ns > window_ns:
        what = (f"{_parts_words(parts)} {_ms(known_ns)} ms exceed" if engine_ns == known_ns
                else f"its TTFT of {_ms(engine_ns)} ms exceeds")
        return Placement("inconsistent", rejected="exceeds_window", detail=(
            f"{timing.source}: {what} the {_ms(window_ns)} ms observed before the first "
            f"output"))
    latest_ns = window_end_ns - engine_ns   # the latest start the engine's interval can have
    skew = 0
    if timing.arrival_epoch_ns is not None:
        arrival_ns = to_perf_ns(timing.arrival_epoch_ns)
        skew = max(window_start_ns - arrival_ns, arrival_ns - latest_ns, 0)
        if skew > max_skew_ns:
            return Placement("clock_skew", skew_ns=skew, rejected="clock_skew", detail=(
                f"{timing.source}: its arrival stamp lies {_ms(skew)} ms outside the "
                f"interval observed before the first output (tolerance {_ms(max_skew_ns)} ms)"))
        start_ns, first, kind = min(max(arrival_ns, window_start_ns), latest_ns), \
            "upstream_request", "wall_clock"
    else:
        start_ns, first, kind = latest_ns, "upstream_other", "end_anchored"
    stages, ends = [first], [start_ns]
    t = start_ns
    for stage, ns in parts:
        t += ns
        stages.append(stage)
        ends.append(t)
    if engine_ns > known_ns:
        stages.append("engine_other")
        ends.append(start_ns + engine_ns)
    if kind == "wall_clock":
        stages.append("upstream_response")
        ends.append(window_end_ns)
    return Placement(kind, tuple(stages), tuple(ends), skew)


def _parts_words(parts: tuple[tuple[str, int], ...]) -> str:
    """"load + prefill": the parts a reason names, in pipeline order."""
    return " + ".join(_PART_WORDS.get(stage, stage) for stage, _ in parts) or "its parts"


def _ms(ns: int) -> str:
    """ms to a tenth, without a trailing ".0": "350", "12.3", "3600010"."""
    return f"{ns / 1e6:.1f}".removesuffix(".0")


def placed_spans(spans: tuple[StageSpan, ...], placement: Placement) -> tuple[StageSpan, ...] | None:
    """A published proxy record's stage spans with its upstream window split as `placement`
    says (a span that came late, tracer/proxy/late_join.py): `upstream_ttfb` and
    `upstream_first_token` give way to the placed stages, everything else is kept as it
    was, so the stage sum (the TTFT) does not change. None when there is nothing to place
    or the record's window is not the one placed (a mark was missing: no span to replace).

    >>> spans = (StageSpan("receive", 0, 10), StageSpan("upstream_connect", 10, 20),
    ...          StageSpan("upstream_ttfb", 20, 30), StageSpan("upstream_first_token", 30, 100),
    ...          StageSpan("send", 100, 101))
    >>> p = Placement("end_anchored", ("upstream_other", "prefill"), (60, 100))
    >>> [(s.stage, s.start_ns, s.end_ns) for s in placed_spans(spans, p)][1:4]
    [('upstream_connect', 10, 20), ('upstream_other', 20, 60), ('prefill', 60, 100)]
    """
    by_stage = {s.stage: s for s in spans}
    connect, ttfb = by_stage.get("upstream_connect"), by_stage.get("upstream_ttfb")
    first = by_stage.get("upstream_first_token")
    if (not placement.stages or connect is None or ttfb is None or first is None
            or ttfb.start_ns != connect.end_ns or placement.ends_ns[-1] != first.end_ns):
        return None
    out, start_ns = [], connect.end_ns
    for span in spans:
        if span.stage == "upstream_first_token":
            for stage, end_ns in zip(placement.stages, placement.ends_ns):
                out.append(StageSpan(stage, start_ns, end_ns))
                start_ns = end_ns
        elif span.stage != "upstream_ttfb":
            out.append(span)
    return tuple(out)


def engine_attrs(timing: EngineTiming, placement: Placement, outcome: str = "joined") -> dict:
    """The record attributes of a joined timing (docs/reference.md, "Engine timing behind
    the proxy"); a timing that cannot fit adds its reason (`REJECTION_ATTR`, a label of
    REJECTIONS) and that reason in words (`REJECTION_DETAIL_ATTR`)."""
    attrs = {"llm.engine.source": timing.source, "llm.engine.outcome": outcome,
             "llm.engine.placement": placement.kind}
    if placement.rejected:
        attrs[REJECTION_ATTR] = placement.rejected
        attrs[REJECTION_DETAIL_ATTR] = placement.detail
    for name, ns in (("ttft", timing.ttft_ns), ("tokenize", timing.tokenize_ns),
                     ("queue", timing.queue_ns), ("model_load", timing.model_load_ns),
                     ("prefill", timing.prefill_ns), ("kv_transfer", timing.kv_transfer_ns),
                     ("inference", timing.inference_ns)):
        if ns is not None:
            attrs[f"llm.engine.{name}_ns"] = ns
    if placement.kind == "clock_skew":
        attrs["llm.engine.clock_skew_ns"] = placement.skew_ns
    return attrs

