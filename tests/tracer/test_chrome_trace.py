"""`chrome_trace`: the timeline JSON as Chrome Trace Event JSON that Perfetto and
chrome://tracing read: the format's fields, slices that nest on each track, the input's numbers
in µs, and nothing a hostile timeline can break."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.chrome_trace import (
    ENGINE_PID, ENGINE_TID, FIRST_REQUEST_TID, REQUESTS_PID, chrome_trace)

# Every phase the Trace Event Format defines (duration, complete, instant, counter, async,
# flow, sample, object, metadata, memory dump, mark, context).
FORMAT_PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()")
METADATA = {"process_name": "name", "thread_name": "name",
            "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}
PHASES = ("preprocess", "queue", "prefill", "first_token", "decode")
TRACE_A, TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7a3ce929d0e0e4736"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate(trace: dict) -> list[dict]:
    """Assert that `trace` is well-formed Trace Event JSON as this module emits it; return its
    events."""
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] in ("ms", "ns") and isinstance(trace["otherData"], dict)
    assert json.loads(json.dumps(trace, allow_nan=False)) == trace
    events = trace["traceEvents"]
    names, pids_of_tid, slices = {}, {}, {}
    for event in events:
        assert event["ph"] in FORMAT_PHASES and isinstance(event["name"], str), event
        assert type(event["pid"]) is int and type(event["tid"]) is int, event
        assert _number(event["ts"]) and event["ts"] >= 0, event
        assert pids_of_tid.setdefault(event["tid"], event["pid"]) == event["pid"] \
            or event["ph"] == "M" and event["tid"] == 0, "a tid in two processes"
        assert event["tid"] not in (ENGINE_PID, REQUESTS_PID), "a tid equal to a pid"
        if event["ph"] == "M":
            key = METADATA[event["name"]]
            value = event["args"][key]
            assert isinstance(value, str) if key == "name" else type(value) is int, event
            names[(event["name"], event["pid"], event["tid"])] = value
        elif event["ph"] == "X":
            assert _number(event["dur"]) and event["dur"] >= 0, event
            assert isinstance(event["cat"], str) and isinstance(event["args"], dict)
            slices.setdefault((event["pid"], event["tid"]), []).append(event)
        elif event["ph"] == "C":
            assert event["args"] and all(_number(v) for v in event["args"].values()), event
    for pid, tid in slices:
        assert ("thread_name", pid, tid) in names and ("process_name", pid, 0) in names
    for track in slices.values():
        assert_nested(track)
    return events


def assert_nested(track: list[dict]) -> None:
    """Slices on one thread nest or follow each other, never overlap partly (in integer ns,
    as Perfetto stores them)."""
    spans = sorted(((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in track),
                   key=lambda s: (s[0], -s[1]))
    stack: list[tuple[int, int]] = []
    for start, end in spans:
        while stack and stack[-1][1] <= start:
            stack.pop()
        assert not stack or end <= stack[-1][1], f"{(start, end)} overlaps {stack[-1]}"
        stack.append((start, end))


def request(trace_id, start, phases_ms, *, tokens=714, cause="queueing", **extra) -> dict:
    """A request whose phases follow each other from `start` (ms), one per given duration."""
    phases, at = [], start
    for name, ms in zip(PHASES, phases_ms):
        phases.append({"phase": name, "start_ms": at, "end_ms": at + ms})
        at += ms
    return {"trace_id": trace_id, "request_id": f"req-{trace_id[:4]}", "model": "m",
            "start_ms": start, "end_ms": at, "ttft_ms": None, "num_prompt_tokens": tokens,
            "num_cached_tokens": 0, "cause": cause, "in_flight": False, "phases": phases,
            **extra}


def step(start, end, kind="prefill", prefill=512, decode=0, batch=()) -> dict:
    return {"start_ms": start, "end_ms": end, "kind": kind, "num_prefill_tokens": prefill,
            "num_decode_seqs": decode, "num_preempted": 0,
            "requests": [{"request_id": r, "trace_id": None, "num_tokens": 1, "phase": "decode"}
                         for r in batch]}


def timeline(requests=(), steps=(), step_log_size=4096) -> dict:
    return {"from_unix_ms": 1_700_000_000_000, "to_unix_ms": 1_700_000_004_000,
            "num_requests": len(requests), "num_more_requests": 0, "num_steps": len(steps),
            "num_more_steps": 0, "step_log_size": step_log_size,
            "requests": list(requests), "steps": list(steps)}


def of(events, ph, pid=None, tid=None) -> list[dict]:
    return [e for e in events if e["ph"] == ph and (pid is None or e["pid"] == pid)
            and (tid is None or e["tid"] == tid)]


def test_each_request_is_a_named_track_of_nested_phases_in_start_order():
    later = request(TRACE_B, 300.0, [1.0, 12.5, 40.0, 0.5, 200.0], tokens=31)
    first = request(TRACE_A, 100.0, [2.0, 0.0, 80.0], cause="long_prompt")
    trace = chrome_trace(timeline([later, first]))
    events = validate(trace)
    tracks = {e["tid"]: e["args"]["name"] for e in of(events, "M", REQUESTS_PID)
              if e["name"] == "thread_name"}
    assert tracks == {FIRST_REQUEST_TID: "req 4bf92f35… (714 tok)",
                      FIRST_REQUEST_TID + 1: "req 00f067aa… (31 tok)"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    assert order[FIRST_REQUEST_TID] < order[FIRST_REQUEST_TID + 1]

    whole, *phases = of(events, "X", REQUESTS_PID, FIRST_REQUEST_TID + 1)
    assert (whole["name"], whole["ts"], whole["dur"]) == ("request", 300_000, 254_000)
    assert [(p["name"], p["ts"], p["dur"]) for p in phases] == [
        ("preprocess", 300_000, 1000), ("queue", 301_000, 12_500), ("prefill", 313_500, 40_000),
        ("first_token", 353_500, 500), ("decode", 354_000, 200_000)]
    for before, after in zip(phases, phases[1:]):    # contiguous: one ends where the next starts
        assert before["ts"] + before["dur"] == after["ts"]
    assert phases[1]["args"] == {"trace_id": TRACE_B, "request_id": "req-00f0", "tokens": 31,
                                 "cause": "queueing", "phase_ms": 12.5}
    assert whole["args"]["trace_id"] == TRACE_B and whole["args"]["in_flight"] is False
    assert trace["otherData"] == {
        "source": "ttftscope /ui/api/timeline", "from_unix_ms": 1_700_000_000_000,
        "to_unix_ms": 1_700_000_004_000, "origin_unix_ms": 1_700_000_000_000,
        "num_requests": 2, "num_more_requests": 0, "num_steps": 0, "num_more_steps": 0,
        "num_dropped": 0}


def test_engine_steps_are_one_track_with_a_token_counter_that_drops_to_zero_when_idle():
    steps = [step(10, 30, batch=["a"]), step(30, 35.25, "mixed", 64, 3, ["a", "b"]),
             step(50, 52, "decode", 0, 2)]
    events = validate(chrome_trace(timeline(steps=steps)))
    names = {(e["name"], e["tid"]): e["args"]["name"] for e in of(events, "M", ENGINE_PID)
             if e["name"].endswith("_name")}
    assert names == {("process_name", 0): "engine", ("thread_name", ENGINE_TID): "engine steps"}
    slices = of(events, "X", ENGINE_PID, ENGINE_TID)
    assert [(s["name"], s["ts"], s["dur"]) for s in slices] == [
        ("prefill", 10_000, 20_000), ("mixed", 30_000, 5250), ("decode", 50_000, 2000)]
    assert slices[1]["args"] == {
        "num_prefill_tokens": 64, "num_decode_seqs": 3, "num_preempted": 0,
        "requests": [{"request_id": r, "trace_id": None, "num_tokens": 1, "phase": "decode"}
                     for r in ("a", "b")]}
    counter = [(c["ts"], c["args"]["prefill_tokens"], c["args"]["decode_seqs"])
               for c in of(events, "C")]
    # No zero between back-to-back steps; one at each idle gap and after the last step.
    assert counter == [(10_000, 512, 0), (30_000, 64, 3), (35_250, 0, 0), (50_000, 0, 2),
                       (52_000, 0, 0)]


def test_a_proxy_without_a_step_log_has_no_engine_process():
    events = validate(chrome_trace(timeline([request(TRACE_A, 0, [1, 2, 3])], step_log_size=None)))
    assert {e["pid"] for e in events} == {REQUESTS_PID}


def test_what_began_before_the_window_moves_the_origin_instead_of_going_negative():
    trace = chrome_trace(timeline([request(TRACE_A, -500.0, [100, 1000])], [step(-20, -10)]))
    events = validate(trace)
    assert trace["otherData"]["origin_unix_ms"] == 1_700_000_000_000 - 500
    assert of(events, "X", REQUESTS_PID)[0]["ts"] == 0
    assert of(events, "X", ENGINE_PID)[0]["ts"] == 480_000


def test_hostile_values_drop_their_slice_and_never_break_the_json():
    nasty = 'x"\n\u2028</script>' * 100
    hostile = [
        request(TRACE_A, 0, [1, 2]) | {"phases": [
            {"phase": "queue", "start_ms": float("nan"), "end_ms": 3},
            {"phase": {"not": "a name"}, "start_ms": 0, "end_ms": 1},
            {"phase": nasty, "start_ms": 5, "end_ms": 2},           # negative duration
            {"phase": "prefill", "start_ms": 1, "end_ms": 1e9},     # beyond the request
            "not a phase"]},
        request(TRACE_B, float("inf"), [1]),
        request(TRACE_B, 0, [1]) | {"end_ms": "soon"},
        {"start_ms": 0, "end_ms": 1, "trace_id": 7, "num_prompt_tokens": -3, "phases": None},
        "not a request", None,
    ]
    steps = [step(0, 10) | {"kind": ["x"], "num_prefill_tokens": float("nan"),
                            "requests": [{"request_id": 1}, 5]},
             step(5, 8), step(float("-inf"), 1), step(20, 1e13)]
    trace = chrome_trace(timeline(hostile, steps) | {"num_more_steps": "many"})
    events = validate(trace)
    first = of(events, "X", REQUESTS_PID, FIRST_REQUEST_TID)
    assert [(e["name"], e["ts"], e["dur"]) for e in first] == [
        ("request", 0, 3000), ("prefill", 1000, 2000), (nasty[:256], 3000, 0)]
    assert of(events, "M", REQUESTS_PID)[-2]["args"]["name"] == "req ?"
    engine = of(events, "X", ENGINE_PID)
    assert [(e["name"], e["ts"], e["dur"]) for e in engine] == [("step", 0, 10_000),
                                                               ("prefill", 10_000, 0)]
    assert engine[0]["args"]["requests"] == [
        {"request_id": None, "trace_id": None, "num_tokens": None, "phase": None}]
    assert trace["otherData"]["num_dropped"] == 9 and trace["otherData"]["num_more_steps"] is None
    assert validate(chrome_trace("not a timeline"))[0]["args"]["name"] == "requests"


def test_a_big_batch_is_named_in_part_and_counted():
    events = validate(chrome_trace(timeline(steps=[step(0, 1, batch=[str(i) for i in range(70)])])))
    args = of(events, "X", ENGINE_PID)[0]["args"]
    assert len(args["requests"]) == 64 and args["num_more_requests"] == 6


# Hypothesis: any timeline, sensible or not, converts to valid Trace Event JSON.
_junk = st.one_of(st.none(), st.booleans(), st.text(max_size=4),
                  st.floats(allow_nan=True, allow_infinity=True),
                  st.integers(-10**20, 10**20), st.lists(st.integers(), max_size=2))
_times = st.one_of(st.floats(-5_000, 70_000), st.floats(-5_000, 70_000), _junk)
_counts = st.one_of(st.integers(0, 10_000), _junk)
_phase = st.fixed_dictionaries({"phase": st.one_of(st.sampled_from(PHASES), _junk),
                                "start_ms": _times, "end_ms": _times})
_request = st.fixed_dictionaries({
    "trace_id": st.one_of(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32), _junk),
    "request_id": st.one_of(st.text(max_size=12), _junk), "start_ms": _times, "end_ms": _times,
    "num_prompt_tokens": _counts, "cause": st.one_of(st.sampled_from(["queueing"]), _junk),
    "in_flight": _junk, "phases": st.one_of(st.lists(st.one_of(_phase, _junk), max_size=6),
                                            _junk)})
_step = st.fixed_dictionaries({
    "start_ms": _times, "end_ms": _times,
    "kind": st.one_of(st.sampled_from(["prefill", "mixed", "decode"]), _junk),
    "num_prefill_tokens": _counts, "num_decode_seqs": _counts, "num_preempted": _counts,
    "requests": st.one_of(st.lists(st.fixed_dictionaries(
        {"request_id": _junk, "num_tokens": _counts}), max_size=3), _junk)})
_timeline = st.fixed_dictionaries({
    "from_unix_ms": st.one_of(st.integers(0, 2**41), _junk), "to_unix_ms": _junk,
    "step_log_size": st.one_of(st.none(), st.integers(0, 10)),
    "requests": st.one_of(st.lists(st.one_of(_request, _junk), max_size=8), _junk),
    "steps": st.one_of(st.lists(st.one_of(_step, _junk), max_size=8), _junk)})


@settings(max_examples=300, deadline=None)
@given(_timeline)
def test_any_timeline_gives_valid_trace_event_json(value):
    trace = chrome_trace(value)
    validate(trace)
    assert trace["otherData"]["num_dropped"] >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-1_000, 60_000),
                          st.lists(st.floats(0, 5_000), min_size=1, max_size=5)), max_size=6))
def test_sensible_timelines_keep_every_slice_and_its_duration(specs):
    requests = [request(f"{i:032x}", start, durations) for i, (start, durations) in
                enumerate(specs)]
    trace = chrome_trace(timeline(requests))
    events = validate(trace)
    assert trace["otherData"]["num_dropped"] == 0
    origin = min([0.0, *(start for start, _ in specs)])
    for request_json in requests:
        tid = FIRST_REQUEST_TID + sorted(requests, key=lambda r: r["start_ms"]).index(request_json)
        whole, *phases = of(events, "X", REQUESTS_PID, tid)
        assert whole["args"]["trace_id"] == request_json["trace_id"]
        assert abs(whole["ts"] - (request_json["start_ms"] - origin) * 1000) <= 0.001
        for got, want in zip(phases, request_json["phases"], strict=True):
            assert abs(got["dur"] - (want["end_ms"] - want["start_ms"]) * 1000) <= 0.002


def test_the_validator_rejects_what_perfetto_would_misdraw():
    good = chrome_trace(timeline([request(TRACE_A, 0, [1, 2])]))
    for breakage in ({"dur": -1}, {"ts": float("nan")}, {"ph": "Q"}, {"tid": "4"},
                     {"ts": 500, "dur": 2000}):     # overlaps the queue phase partly
        broken = json.loads(json.dumps(good))
        broken["traceEvents"][-2].update(breakage)
        with pytest.raises((AssertionError, ValueError)):
            validate(broken)
