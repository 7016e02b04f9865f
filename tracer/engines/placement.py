"""The engine's timing as contiguous stages inside the proxy's upstream window.

The rule (docs/architecture.md, "Inside the engine"): the window runs from the end of
`upstream_connect` (the request can be written) to the arrival of the first content from
the upstream, W ns on our clock. The engine's interval is its own TTFT, E ns on its clock;
inside it lie the known parts (tokenize, queue, prefill, inference) and `engine_other`,
E minus their sum. Around it lie `upstream_request` (before the engine's arrival stamp) and
`upstream_response` (after its first token). Durations only ever come from one clock each,
so none can be negative, and no stage takes time from a neighbour:

- E < sum(parts) or E > W: the signal contradicts itself or our window (it is not this
  request's, or not its first token): `inconsistent`, and the record keeps the proxy's
  five stages.
- With an arrival stamp (a span's start, wall clock): its place on our clock is
  `to_perf(arrival)`. It must fall within [window start − skew, window end − E + skew];
  inside the tolerance it is clamped into the window (`wall_clock`); outside, the clocks
  disagree by more than the tolerance and the placement is refused (`clock_skew`, the
  proxy's five stages stay).
- Without one (llama.cpp timings, TGI headers), the interval ends where our first content
  arrived (`end_anchored`) and the rest of the window is `upstream_other`: both network
  legs and the engine's HTTP front, unsplit, since nothing tells them apart.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tracer.engines.timing import EngineTiming

# Rounding of seconds → ns in the engine's own arithmetic (float seconds subtracted there).
_ROUNDING_NS = 2_000
PLACEMENTS = ("wall_clock", "end_anchored", "clock_skew", "inconsistent", "no_window")


@dataclass(slots=True, frozen=True)
class Placement:
    """The stages after `upstream_connect` and their end boundaries (perf_counter ns), or
    none (`stages == ()`) with the reason in `kind`."""

    kind: str
    stages: tuple[str, ...] = ()
    ends_ns: tuple[int, ...] = ()
    skew_ns: int = 0     # how far the arrival stamp lay outside the window (wall_clock)


def place(timing: EngineTiming, *, window_start_ns: int | None, window_end_ns: int | None,
          to_perf_ns: Callable[[int], int], max_skew_ns: int) -> Placement:
    """
    >>> t = EngineTiming("vllm", arrival_epoch_ns=1_100, ttft_ns=500, queue_ns=100, prefill_ns=300)
    >>> p = place(t, window_start_ns=1_000, window_end_ns=2_000, to_perf_ns=lambda e: e,
    ...           max_skew_ns=0)
    >>> p.kind, list(zip(p.stages, p.ends_ns))
    ('wall_clock', [('upstream_request', 1100), ('queue', 1200), ('prefill', 1500), ('engine_other', 1600), ('upstream_response', 2000)])
    """
    if window_start_ns is None or window_end_ns is None or window_end_ns < window_start_ns:
        return Placement("no_window")
    parts = timing.parts()
    known_ns = sum(ns for _, ns in parts)
    engine_ns = timing.ttft_ns if timing.ttft_ns is not None else known_ns
    if known_ns > engine_ns + _ROUNDING_NS or not parts and timing.ttft_ns is None:
        return Placement("inconsistent")
    engine_ns = max(engine_ns, known_ns)
    window_ns = window_end_ns - window_start_ns
    if engine_ns > window_ns:
        return Placement("inconsistent")
    latest_ns = window_end_ns - engine_ns   # the latest start the engine's interval can have
    skew = 0
    if timing.arrival_epoch_ns is not None:
        arrival_ns = to_perf_ns(timing.arrival_epoch_ns)
        skew = max(window_start_ns - arrival_ns, arrival_ns - latest_ns, 0)
        if skew > max_skew_ns:
            return Placement("clock_skew", skew_ns=skew)
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
