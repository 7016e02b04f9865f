"""Which adapter reads a span: chosen by what arrived, never by configuration."""
from __future__ import annotations

from collections.abc import Iterable

from tracer.engines import sglang, trtllm, vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming


def engine_timings(spans: Iterable[SpanView]) -> list[tuple[SpanView, EngineTiming]]:
    """The engine request spans of one export, each with its timing. A span whose
    attributes are no engine's is not one (the engines' other spans, anyone else's).

    >>> s = SpanView("a" * 32, "b" * 16, "c" * 16, "llm_request", 1,
    ...              {vllm.TTFT: 0.3, vllm.QUEUE: 0.1, vllm.PREFILL: 0.1})
    >>> [(v.span_id, t.source) for v, t in engine_timings([s])]
    [('bbbbbbbbbbbbbbbb', 'vllm')]
    """
    spans = list(spans)
    found, stages = [], None
    for span in spans:
        if vllm.matches(span):
            found.append((span, vllm.timing_of(span)))
        elif trtllm.matches(span):
            found.append((span, trtllm.timing_of(span)))
        elif sglang.matches(span):
            if stages is None:
                stages = _StageSpans(spans)
            found.append((span, sglang.timing_of(span, stages.under(span))))
    return found


def _children_index(spans: list[SpanView]) -> dict[tuple[str, str], list[SpanView]]:
    index: dict[tuple[str, str], list[SpanView]] = {}
    for span in spans:
        if span.parent_span_id:
            index.setdefault((span.trace_id, span.parent_span_id), []).append(span)
    return index


# A request's stage spans are a handful: a walk that has looked at this many spans is in a
# broken or hostile tree, and stops.
_MAX_WALK = 1024
# All walks of one export together look at most at this many spans per span of the export
# (plus one walk). A well-formed export's request trees are disjoint: it looks at each span
# at most once, so only a hostile one (nested request spans, cycles) ever reaches the bound.
_WALK_PER_SPAN = 2


class _StageSpans:
    """The stage spans under each SGLang request span, for `sglang.timing_of`: the first of
    each stage name, in walk order (depth first). The work is linear in the
    export whatever its ids: request spans sharing an id share one walk, and the walks
    together stop at `_WALK_PER_SPAN` spans per span (issue 39: 10,000 roots sharing one id
    over 10,000 children cost 10^8 steps when each root walked all of them)."""

    def __init__(self, spans: list[SpanView]) -> None:
        self._children = _children_index(spans)
        self._budget = _WALK_PER_SPAN * len(spans) + _MAX_WALK
        self._walked: dict[tuple[str, str], list[SpanView]] = {}
        self.looked_at = 0   # spans looked at, all walks together

    def under(self, root: SpanView) -> list[SpanView]:
        key = (root.trace_id, root.span_id)
        found = self._walked.get(key)
        if found is None:
            found = self._walked[key] = self._walk(*key)
        return found

    def _walk(self, trace_id: str, root_id: str) -> list[SpanView]:
        first: dict[str, SpanView] = {}
        todo, seen = [root_id], {root_id}
        stop = min(self.looked_at + _MAX_WALK, self._budget)
        while todo:
            for child in self._children.get((trace_id, todo.pop()), ()):
                if self.looked_at >= stop:
                    return list(first.values())
                self.looked_at += 1
                if child.span_id not in seen:   # a cycle or a shared id is walked once
                    seen.add(child.span_id)
                    todo.append(child.span_id)
                    if sglang.is_stage(child):
                        first.setdefault(child.name, child)
        return list(first.values())
