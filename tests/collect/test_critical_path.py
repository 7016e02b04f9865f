"""The critical path through a span tree (tracer/record/critical_path.py): contiguous, exact,
the waited-for child chosen, bounded on hostile trees; and the closed segment vocabulary."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tracer.record.critical_path import MAX_DEPTH, PathSpan, chain_to, critical_path
from tracer.record.segment_names import OTHER, SegmentNames, segment_name


def _children(spans):
    out = {}
    for s in spans:
        out.setdefault(s.parent_id, []).append(s)
    return out


@st.composite
def trees(draw):
    """A root and up to 30 spans, each under an earlier one, intervals anywhere (children
    may overrun their parents: exporters' clocks and bugs do that)."""
    root = PathSpan("s0", "", "root", 0, draw(st.integers(1, 1000)))
    spans = [root]
    for i in range(1, draw(st.integers(0, 30))):
        parent = spans[draw(st.integers(0, len(spans) - 1))]
        start = draw(st.integers(-50, 1050))
        spans.append(PathSpan(f"s{i}", parent.span_id, f"n{i % 5}", start,
                              start + draw(st.integers(0, 400))))
    return spans, draw(st.integers(-100, 1200))


@settings(max_examples=300, deadline=None)
@given(trees())
def test_the_path_is_contiguous_exact_and_inside_its_spans(tree):
    spans, until = tree
    root = spans[0]
    pieces = critical_path(root, _children(spans), until)
    hi = min(max(until, root.start_ns), root.end_ns)
    assert sum(p.end_ns - p.start_ns for p in pieces) == hi - root.start_ns
    t = root.start_ns
    by_id = {s.span_id: s for s in spans}
    for p in pieces:
        assert p.start_ns == t and p.end_ns > p.start_ns
        # each piece lies inside its own span, and that span descends from the root
        assert p.span.start_ns <= p.start_ns and p.end_ns <= p.span.end_ns
        assert p.span.span_id == "s0" or chain_to(by_id, p.span.span_id, "s0") is not None
        t = p.end_ns
    assert t == hi


def test_the_last_finishing_child_is_the_one_waited_for():
    root = PathSpan("r", "", "POST /chat", 0, 100)
    kids = [PathSpan("a", "r", "auth", 0, 5), PathSpan("q", "r", "retrieve", 5, 40),
            PathSpan("m", "r", "moderation", 5, 30), PathSpan("c", "r", "POST", 41, 99)]
    pieces = critical_path(root, _children(kids), 41, skip="c")
    assert [(p.span.name, p.start_ns, p.end_ns) for p in pieces] == [
        ("auth", 0, 5), ("retrieve", 5, 40), ("POST /chat", 40, 41)]
    # a child still running at the instant is clipped to it, and is the one on the path
    pieces = critical_path(root, _children(kids), 20, skip="c")
    assert [(p.span.name, p.end_ns) for p in pieces][-1] == ("retrieve", 20)


def test_hostile_trees_are_bounded():
    # a 10,000-deep chain: the walk stops at MAX_DEPTH, the rest is the last span's own time
    spans = [PathSpan("0", "", "root", 0, 10_000)]
    spans += [PathSpan(str(i), str(i - 1), "deep", i, 10_000) for i in range(1, 10_000)]
    pieces = critical_path(spans[0], _children(spans), 10_000)
    assert len(pieces) <= MAX_DEPTH + 1 and pieces[-1].end_ns == 10_000
    # a cycle, and a chain that never reaches the root
    loop = {"a": PathSpan("a", "b", "x", 0, 1), "b": PathSpan("b", "a", "y", 0, 1)}
    assert chain_to(loop, "a", "r") is None
    assert chain_to({}, "a", "r") is None


def test_segment_labels_stay_closed_under_a_flood_of_names():
    names = SegmentNames(configured=("auth",), top_n=3)
    for trace in range(2000):
        for real in ("retrieve", "SELECT docs"):
            names.observe(real, 10_000_000)
        names.observe(segment_name(f"GET /user/{trace}"), 50_000_000)   # one-off, longer
    assert names.labels() == ("auth", "retrieve", "SELECT docs", OTHER)
    assert names.label("GET /user/7") == OTHER and names.label("auth") == "auth"
    assert segment_name("a\x00b\nc") == "abc"
