"""Turn a timeline's stage boundaries into contiguous stage spans, never inventing time.

Rules (boundary model; docs/architecture.md, "Attribution"):

* A stage gets a span only when both of its boundaries are known: its own end mark and the
  end of the stage before it (the request start for the first stage). The span runs
  [previous boundary, own end].
* A stage without a mark gets no span. Its time cannot be split from its neighbours', so the
  whole interval between the two known boundaries around it is `unattributed`; the next
  stage, whose start is then unknown, gets no span either. Time is never given to a
  neighbour.
* The last stage's end is its mark, or else the first emit (a content chunk handed to the
  transport is, by definition, the end of the last stage).
* Clock misuse: a boundary earlier than the one before it is clamped up to it (running
  max), giving a zero-length span. The backward amount is reported in `clamped_ns` (and on
  the span's attrs), never as negative unattributed time: histograms cannot hold negative
  durations, and an overlap is a bug to surface, not a duration.

Invariant: sum(span durations) + unattributed_ns == ttft_ns, exactly, whenever ttft_ns is
not None. Without a first token (abort, error), the same identity holds up to the last
known boundary instead of the TTFT end.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.request_record import StageSpan, stage_span
from tracer.record.stages import SERVER_STAGES
from tracer.record.timeline import Timeline, TimelineSnapshot


@dataclass(slots=True, frozen=True)
class Attribution:
    """Stage spans of one request, in pipeline order, plus what no stage covers.

    >>> tl = Timeline(0)
    >>> for i, s in enumerate(("a", "b", "c")): tl.mark(s, 10 * (i + 1))
    >>> att = attribute(tl, stages=("a", "b", "c"))
    >>> [(s.stage, s.duration_ns) for s in att.spans], att.unattributed_ns, att.ttft_ns
    ([('a', 10), ('b', 10), ('c', 10)], 0, 30)
    """

    spans: tuple[StageSpan, ...]
    unattributed_ns: int
    ttft_ns: int | None       # last stage's end - start; None when it never ended
    covered_until_ns: int     # the last known boundary (the TTFT end when ttft_ns is set)
    clamped_ns: int = 0       # total backward skew clamped away; 0 for a sane clock


def attribute(timeline: Timeline | TimelineSnapshot,
              stages: tuple[str, ...] = SERVER_STAGES) -> Attribution:
    snap = timeline.snapshot() if isinstance(timeline, Timeline) else timeline
    ends_ns = _stage_ends(snap, stages)
    attrs_by_stage = _group_attrs(snap.stage_attrs) if snap.stage_attrs else {}
    spans: list[StageSpan] = []
    boundary_ns = snap.start_ns           # running max of known boundaries
    boundary_known = True                 # is the previous stage's end known?
    unattributed_ns = clamped_ns = 0
    for stage, end_ns in zip(stages, ends_ns):
        if end_ns is None:
            boundary_known = False
            continue
        skew_ns = 0
        if end_ns < boundary_ns:
            skew_ns, end_ns = boundary_ns - end_ns, boundary_ns
        if boundary_known:
            attrs = attrs_by_stage.get(stage, {})
            if skew_ns:
                attrs = {**attrs, "clamped_ns": skew_ns}
            spans.append(stage_span(stage, boundary_ns, end_ns, attrs))
        else:
            unattributed_ns += end_ns - boundary_ns
        clamped_ns += skew_ns
        boundary_ns, boundary_known = end_ns, True
    ttft_ns = boundary_ns - snap.start_ns if ends_ns and ends_ns[-1] is not None else None
    return Attribution(tuple(spans), unattributed_ns, ttft_ns, boundary_ns, clamped_ns)


def _stage_ends(snap: TimelineSnapshot, stages: tuple[str, ...]) -> list[int | None]:
    ends_ns = [snap.marks_ns.get(stage) for stage in stages]
    if ends_ns and ends_ns[-1] is None and snap.first_emits_ns:
        ends_ns[-1] = snap.first_emits_ns[0]
    return ends_ns


def _group_attrs(flat: dict[tuple[str, str], object]) -> dict[str, dict]:
    grouped: dict[str, dict] = {}
    for (stage, key), value in flat.items():
        grouped.setdefault(stage, {})[key] = value
    return grouped
