"""The placement rule of tracer/engines/placement.py: contiguous, never negative, never time
taken from a neighbour, and refused (not bent) when the signal or the clocks disagree."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tracer.engines.placement import REJECTIONS, engine_attrs, place
from tracer.engines.timing import EngineTiming

MS = 1_000_000
ident = lambda epoch_ns: epoch_ns   # noqa: E731 - the engine shares our clock


def _place(timing, start=1_000 * MS, end=1_100 * MS, skew=0):
    return place(timing, window_start_ns=start, window_end_ns=end, to_perf_ns=ident,
                 max_skew_ns=skew)


@given(window=st.integers(0, 10**10), arrival=st.integers(-10**9, 2 * 10**10),
       parts=st.lists(st.one_of(st.none(), st.integers(0, 10**9)), min_size=4, max_size=4),
       extra=st.one_of(st.none(), st.integers(0, 10**9)), skew=st.integers(0, 10**7),
       anchored=st.booleans())
def test_placed_stages_tile_the_window_exactly(window, arrival, parts, extra, skew, anchored):
    known = [p for p in parts if p is not None]
    ttft = None if extra is None else sum(known) + extra
    timing = EngineTiming("vllm", arrival_epoch_ns=arrival if anchored else None, ttft_ns=ttft,
                          tokenize_ns=parts[0], queue_ns=parts[1], prefill_ns=parts[2],
                          inference_ns=parts[3])
    p = place(timing, window_start_ns=0, window_end_ns=window, to_perf_ns=ident,
              max_skew_ns=skew)
    if not p.stages:
        assert p.kind in ("inconsistent", "clock_skew")
        # Every refusal of a timing that said something names its reason; one that said
        # nothing is no signal, not an impossible one.
        if timing.parts() or ttft is not None:
            assert p.rejected in REJECTIONS and p.detail.startswith("vllm: ")
        else:
            assert p.rejected == ""
        return
    assert p.rejected == "" and p.detail == ""
    bounds = [0, *p.ends_ns]
    durations = [b - a for a, b in zip(bounds, bounds[1:])]
    assert all(d >= 0 for d in durations)
    assert p.ends_ns[-1] == window
    by_stage = dict(zip(p.stages, durations))
    for stage, ns in timing.parts():
        assert by_stage[stage] == ns       # the engine's numbers, exactly
    engine_ns = sum(known) if ttft is None else ttft
    if anchored:   # the arrival stamp, clamped into the window by at most the tolerance
        assert p.kind == "wall_clock"
        placed = by_stage["upstream_request"]
        assert placed == min(max(arrival, 0), window - engine_ns)
        assert abs(placed - arrival) <= skew
    else:
        assert p.kind == "end_anchored" and by_stage["upstream_other"] == window - engine_ns


def test_the_arrival_stamp_places_the_engine_interval():
    t = EngineTiming("vllm", arrival_epoch_ns=1_010 * MS, ttft_ns=50 * MS, queue_ns=10 * MS,
                     prefill_ns=30 * MS)
    p = _place(t)
    assert p.kind == "wall_clock"
    assert list(zip(p.stages, p.ends_ns)) == [
        ("upstream_request", 1_010 * MS), ("queue", 1_020 * MS), ("prefill", 1_050 * MS),
        ("engine_other", 1_060 * MS), ("upstream_response", 1_100 * MS)]


def test_an_arrival_outside_the_window_beyond_the_tolerance_is_refused():
    early = EngineTiming("vllm", arrival_epoch_ns=990 * MS, ttft_ns=50 * MS, queue_ns=1)
    assert _place(early).kind == "clock_skew" and _place(early).skew_ns == 10 * MS
    assert _place(early, skew=10 * MS).stages[0] == "upstream_request"
    assert _place(early, skew=10 * MS).ends_ns[0] == 1_000 * MS   # clamped to the window
    late = EngineTiming("vllm", arrival_epoch_ns=1_060 * MS, ttft_ns=50 * MS, queue_ns=1)
    assert _place(late).kind == "clock_skew"      # its first token would be after ours
    assert _place(early).rejected == "clock_skew"
    assert _place(early).detail == ("vllm: its arrival stamp lies 10 ms outside the interval "
                                    "observed before the first output (tolerance 0 ms)")


def test_a_signal_that_contradicts_itself_or_the_window_is_refused():
    too_long = EngineTiming("vllm", arrival_epoch_ns=1_000 * MS, ttft_ns=200 * MS, queue_ns=1)
    assert _place(too_long).kind == "inconsistent"
    assert (_place(too_long).rejected, _place(too_long).detail) == (
        "exceeds_window", "vllm: its TTFT of 200 ms exceeds the 100 ms observed before the "
                          "first output")
    parts_exceed = EngineTiming("vllm", ttft_ns=10 * MS, queue_ns=8 * MS, prefill_ns=8 * MS)
    assert _place(parts_exceed).kind == "inconsistent"
    assert (_place(parts_exceed).rejected, _place(parts_exceed).detail) == (
        "parts_exceed_ttft", "vllm: queue + prefill 16 ms exceed its own TTFT of 10 ms")
    # The record carries both: the closed label and the words.
    attrs = engine_attrs(parts_exceed, _place(parts_exceed))
    assert attrs["llm.engine.rejection"] == "parts_exceed_ttft"
    assert attrs["llm.engine.rejection_detail"].startswith("vllm: queue + prefill")
    assert "llm.engine.rejection" not in engine_attrs(too_long, _place(too_long, end=2_000 * MS))
    assert place(parts_exceed, window_start_ns=None, window_end_ns=5, to_perf_ns=ident,
                 max_skew_ns=0).kind == "no_window"


def test_without_an_arrival_stamp_the_interval_ends_at_our_first_content():
    t = EngineTiming("llamacpp", ttft_ns=40 * MS, prefill_ns=40 * MS)
    p = _place(t)
    assert p.kind == "end_anchored"
    assert list(zip(p.stages, p.ends_ns)) == [("upstream_other", 1_060 * MS),
                                               ("prefill", 1_100 * MS)]
