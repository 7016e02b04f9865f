"""Attribution: contiguous spans, exact sums, missing stages → unattributed, clamped skew."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.attribution import attribute
from tracer.record.stages import PROXY_STAGES, SERVER_STAGES
from tracer.record.timeline import Timeline


def _timeline(start_ns: int, marks: dict[str, int], emits=()) -> Timeline:
    tl = Timeline(start_ns)
    for stage, t_ns in marks.items():
        tl.mark(stage, t_ns)
    for t_ns in emits:
        tl.emit(t_ns)
    return tl


def _all_marked(start_ns: int, durations_ns: list[int]) -> dict[str, int]:
    marks, t_ns = {}, start_ns
    for stage, d in zip(SERVER_STAGES, durations_ns):
        t_ns += d
        marks[stage] = t_ns
    return marks


def test_all_stages_marked_gives_contiguous_spans_and_zero_unattributed():
    durations_ns = [11, 0, 7, 3, 1_000, 250, 9, 4, 2]
    att = attribute(_timeline(5_000, _all_marked(5_000, durations_ns)))
    assert [s.stage for s in att.spans] == list(SERVER_STAGES)
    assert [s.duration_ns for s in att.spans] == durations_ns
    assert att.spans[0].start_ns == 5_000
    assert all(a.end_ns == b.start_ns for a, b in zip(att.spans, att.spans[1:]))
    assert att.unattributed_ns == 0 and att.clamped_ns == 0
    assert att.ttft_ns == sum(durations_ns) == att.covered_until_ns - 5_000


def test_missing_middle_stage_is_unattributed_not_given_to_a_neighbour():
    marks = _all_marked(0, [10, 20, 30, 40, 50, 60, 70, 80, 90])
    del marks["queue"]   # kv_lookup ends at 100, queue would end at 150, prefill at 210
    att = attribute(_timeline(0, marks))
    stages = [s.stage for s in att.spans]
    # prefill's start (queue's end) is unknown, so prefill gets no span either.
    assert "queue" not in stages and "prefill" not in stages
    assert att.unattributed_ns == 210 - 100
    assert att.ttft_ns == 450
    assert sum(s.duration_ns for s in att.spans) + att.unattributed_ns == att.ttft_ns
    kv = next(s for s in att.spans if s.stage == "kv_lookup")
    sample = next(s for s in att.spans if s.stage == "sample")
    assert (kv.start_ns, kv.end_ns) == (60, 100)
    assert (sample.start_ns, sample.end_ns) == (210, 280)


def test_missing_first_stage_leaves_time_since_start_unattributed():
    marks = _all_marked(1_000, [5] * 9)
    del marks["receive"]
    att = attribute(_timeline(1_000, marks))
    assert att.spans[0].stage == "tokenize"
    assert att.unattributed_ns == 10
    assert att.ttft_ns == 45


def test_last_stage_ends_at_first_emit_when_not_marked():
    marks = _all_marked(0, [1] * 9)
    del marks["send"]
    att = attribute(_timeline(0, marks, emits=(20, 25, 31)))
    assert att.spans[-1].stage == "send"
    assert (att.spans[-1].start_ns, att.spans[-1].end_ns) == (8, 20)
    assert att.ttft_ns == 20 and att.unattributed_ns == 0


def test_explicit_send_mark_wins_over_emits():
    marks = _all_marked(0, [1] * 9)
    att = attribute(_timeline(0, marks, emits=(50,)))
    assert att.ttft_ns == 9


def test_no_first_token_means_no_ttft_but_spans_up_to_the_last_boundary():
    marks = {"receive": 10, "template": 15, "tokenize": 30}   # aborted while queued
    att = attribute(_timeline(0, marks))
    assert att.ttft_ns is None
    assert [s.stage for s in att.spans] == ["receive", "template", "tokenize"]
    assert att.covered_until_ns == 30 and att.unattributed_ns == 0


def test_backward_boundary_is_clamped_to_zero_and_reported():
    marks = _all_marked(0, [10] * 9)
    marks["tokenize"] = 5      # before template's end at 20: clock misuse
    att = attribute(_timeline(0, marks))
    tok = next(s for s in att.spans if s.stage == "tokenize")
    assert (tok.start_ns, tok.end_ns) == (20, 20)
    assert tok.attrs["clamped_ns"] == 15
    assert att.clamped_ns == 15
    assert att.unattributed_ns == 0
    assert all(s.duration_ns >= 0 for s in att.spans)
    assert sum(s.duration_ns for s in att.spans) + att.unattributed_ns == att.ttft_ns == 90


def test_mark_before_request_start_is_clamped_to_start():
    att = attribute(_timeline(100, {"receive": 40, "send": 160}), stages=("receive", "send"))
    assert att.spans[0].duration_ns == 0 and att.clamped_ns == 60
    assert att.ttft_ns == 60 and att.spans[1].duration_ns == 60


def test_stage_attrs_land_on_their_span_only():
    tl = _timeline(0, _all_marked(0, [1] * 9))
    tl.stage_attr("kv_lookup", "num_hit_tokens", 64)
    tl.stage_attr("kv_lookup", "num_hit_blocks", 4)
    tl.stage_attr("detokenize", "num_tokens", 3)
    att = attribute(tl)
    by_stage = {s.stage: s.attrs for s in att.spans}
    assert by_stage["kv_lookup"] == {"num_hit_tokens": 64, "num_hit_blocks": 4}
    assert by_stage["detokenize"] == {"num_tokens": 3}
    assert by_stage["prefill"] == {}


def test_generic_over_the_proxy_stages():
    marks = {"receive": 3, "upstream_connect": 8, "upstream_ttfb": 40,
             "upstream_first_token": 90}
    att = attribute(_timeline(0, marks, emits=(95,)), stages=PROXY_STAGES)
    assert [s.stage for s in att.spans] == list(PROXY_STAGES)
    assert att.ttft_ns == 95 and att.unattributed_ns == 0


def test_accepts_a_snapshot_as_well_as_a_timeline():
    tl = _timeline(0, _all_marked(0, [2] * 9))
    assert attribute(tl.snapshot()) == attribute(tl)


_stage_marks = st.fixed_dictionaries(
    {}, optional={s: st.integers(-1_000, 10**9) for s in SERVER_STAGES})


@settings(max_examples=400, deadline=None)
@given(start_ns=st.integers(0, 10**6), marks=_stage_marks,
       emits=st.lists(st.integers(0, 10**9), max_size=3))
def test_property_spans_plus_unattributed_is_exactly_ttft(start_ns, marks, emits):
    att = attribute(_timeline(start_ns, marks, sorted(emits)))
    total_ns = sum(s.duration_ns for s in att.spans) + att.unattributed_ns
    assert total_ns == att.covered_until_ns - start_ns
    if att.ttft_ns is not None:
        assert total_ns == att.ttft_ns
    assert att.unattributed_ns >= 0 and att.clamped_ns >= 0
    assert all(s.duration_ns >= 0 for s in att.spans)
    order = [SERVER_STAGES.index(s.stage) for s in att.spans]
    assert order == sorted(order) and len(set(order)) == len(order)
    for a, b in zip(att.spans, att.spans[1:]):
        assert a.end_ns <= b.start_ns
        if SERVER_STAGES.index(b.stage) == SERVER_STAGES.index(a.stage) + 1:
            assert a.end_ns == b.start_ns   # adjacent stages share their boundary


@settings(max_examples=300, deadline=None)
@given(start_ns=st.integers(0, 10**6),
       durations_ns=st.lists(st.integers(0, 10**7), min_size=9, max_size=9),
       missing=st.sets(st.sampled_from(SERVER_STAGES[:-1])))
def test_property_monotone_marks_unattributed_is_exactly_the_missing_intervals(
        start_ns, durations_ns, missing):
    full = _all_marked(start_ns, durations_ns)
    marks = {s: t for s, t in full.items() if s not in missing}
    att = attribute(_timeline(start_ns, marks))
    # Reference: a marked stage whose predecessor is missing covers [last known, own end].
    expected_ns, prev_ns, prev_known = 0, start_ns, True
    for stage in SERVER_STAGES:
        if stage in missing:
            prev_known = False
            continue
        if not prev_known:
            expected_ns += full[stage] - prev_ns
        prev_ns, prev_known = full[stage], True
    assert att.unattributed_ns == expected_ns
    assert att.clamped_ns == 0
    assert att.ttft_ns == sum(durations_ns)
    with_span = {s.stage for s in att.spans}
    for i, stage in enumerate(SERVER_STAGES):
        before_known = i == 0 or SERVER_STAGES[i - 1] not in missing
        assert (stage in with_span) == (stage not in missing and before_known)
