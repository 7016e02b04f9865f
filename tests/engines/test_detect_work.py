"""Reading an export's engine spans costs work linear in its spans, whatever their ids
(issue 39, break 4): SGLang's request spans find their stage spans by walking the span
tree, and a hostile export can share ids, nest request spans or close cycles.

The work is counted, not timed: every line run in tracer/engines/ while `engine_timings`
reads the export (a trace function counts them and stops the run once past the bound, so
a quadratic walk fails in a second instead of running for minutes)."""
from __future__ import annotations

import os
import sys

import pytest

from tracer.engines import detect
from tracer.engines.detect import engine_timings
from tracer.engines.spans import SpanView

T = "a" * 32
_ENGINES = os.path.dirname(detect.__file__) + os.sep
_REQUEST = {"gen_ai.latency.time_to_first_token": 0.5, "gen_ai.latency.time_in_model_prefill": 0.3}
# Lines run per span of the export. Measured: about 33 for a well-formed export, 73 for an
# export of request spans alone (each one's adapter runs); the bound leaves room for
# refactoring, and a quadratic walk passes it within a few hundred roots.
_LINES_PER_SPAN = 150


class _OverBudget(Exception):
    pass


def _lines_run(spans: list[SpanView]):
    """(engine_timings(spans), the lines it ran in tracer/engines/)."""
    budget, count = _LINES_PER_SPAN * len(spans), 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise _OverBudget
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(_ENGINES) else None

    sys.settrace(calls)
    try:
        found = engine_timings(spans)
    except _OverBudget:
        pytest.fail(f"reading {len(spans)} spans ran over {budget} lines in tracer/engines/")
    finally:
        sys.settrace(None)
    return found, count


def _id(i: int) -> str:
    return f"{i:016x}"


def _request(span_id: str, parent: str = "") -> SpanView:
    return SpanView(T, span_id, parent, "req", 1, _REQUEST)


def _stage(span_id: str, parent: str, name: str = "prefill_waiting", ms: int = 100) -> SpanView:
    return SpanView(T, span_id, parent, name, 10, {}, 10 + ms * 1_000_000)


def test_the_issues_export_ten_thousand_roots_sharing_an_id_and_their_children():
    shared = _id(1)
    spans = [_request(shared) for _ in range(10_000)]
    spans += [_stage(_id(2 + i), shared, ms=100 + i) for i in range(10_000)]
    found, lines = _lines_run(spans)
    assert len(found) == 10_000
    # Every root reads the same tree, so the same stage: the first one under that id.
    assert {(t.queue_ns, t.prefill_ns) for _, t in found} == {(100_000_000, 200_000_000)}
    assert lines <= _LINES_PER_SPAN * len(spans)


@pytest.mark.parametrize("shape", ["chain", "cycle", "self-parent", "duplicate children"])
def test_hostile_trees_cost_linear_work(shape):
    n = 10_000
    if shape == "chain":          # each request span the child of the one before
        spans = [_request(_id(i + 1), _id(i) if i else "") for i in range(n)]
    elif shape == "cycle":        # request spans in one ring: every one is under every other
        spans = [_request(_id(i), _id((i + 1) % n)) for i in range(n)]
    elif shape == "self-parent":  # one id, its own parent, many times
        spans = [_request(_id(7), _id(7)) for _ in range(n)]
    else:                         # distinct roots, each under all the others' ids
        spans = [_request(_id(i)) for i in range(200)]
        spans += [_stage(_id(i), _id(j)) for i in range(200) for j in range(0, 200, 4)]
    found, lines = _lines_run(spans)
    assert found   # every request span is still read (some without their stages)
    assert lines <= _LINES_PER_SPAN * len(spans)


def test_a_well_formed_export_keeps_every_requests_stages():
    spans = []
    for r in range(2_000):
        root = _id(10 * r + 1)
        spans += [_request(root, parent=_id(10 * r)),
                  _stage(_id(10 * r + 2), root, "tokenize", ms=1),
                  _stage(_id(10 * r + 3), root, ms=1 + r % 50),
                  _stage(_id(10 * r + 4), root, "prefill_forward", ms=5)]
    found, lines = _lines_run(spans)
    assert [(t.tokenize_ns, t.queue_ns) for _, t in found] == [
        (1_000_000, (1 + r % 50) * 1_000_000) for r in range(2_000)]
    assert lines <= 50 * len(spans)
