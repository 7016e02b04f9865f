"""Which adapter reads a span: chosen by what arrived, never by configuration."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from tracer.engines import sglang, sglang_pd, tgi_span, trtllm, vllm
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming


def is_request_span(span: SpanView) -> bool:
    """Whether some engine's adapter reads `span` as a request span: the match alone, without
    the timing (which walks the stage spans under it).

    >>> is_request_span(SpanView("a" * 32, "b" * 16, "", "x", 1, {}))
    False
    """
    return (vllm.matches(span) or trtllm.matches(span) or sglang.matches(span)
            or tgi_span.matches(span))


def engine_timings(spans: Iterable[SpanView]) -> list[tuple[SpanView, EngineTiming]]:
    """The engine request spans of one export, each with its timing. A span whose
    attributes are no engine's is not one (the engines' other spans, anyone else's), nor is
    an SGLang prefill worker's: it is read as a part of its decode worker's
    (tracer/engines/sglang_pd.py).

    >>> s = SpanView("a" * 32, "b" * 16, "c" * 16, "llm_request", 1,
    ...              {vllm.TTFT: 0.3, vllm.QUEUE: 0.1, vllm.PREFILL: 0.1})
    >>> [(v.span_id, t.source) for v, t in engine_timings([s])]
    [('bbbbbbbbbbbbbbbb', 'vllm')]
    """
    spans = list(spans)
    found, stages, workers = [], {}, None
    for span in spans:
        if vllm.matches(span):
            found.append((span, vllm.timing_of(span, _under(stages, spans, vllm.is_lifecycle,
                                                            span))))
        elif trtllm.matches(span):
            found.append((span, trtllm.timing_of(span)))
        elif sglang.matches(span):
            under = _under(stages, spans, sglang.is_stage, span)
            timing = None
            if sglang.role_of(span) == sglang.DECODE_ROLE:
                # Disaggregated: its prefill worker's span, in this export (one index per
                # export, built at the first decode worker's span).
                if workers is None:
                    workers = sglang_pd.PrefillWorkers(spans)
                prefill = workers.partner(span)
                if prefill is not None:
                    timing = sglang_pd.timing_of(
                        span, under, prefill, _under(stages, spans, sglang.is_stage, prefill))
            found.append((span, timing or sglang.timing_of(span, under)))
        elif tgi_span.matches(span):
            under = _under(stages, spans, tgi_span.is_stage, span)
            found.append((span, tgi_span.timing_of(span, under)))
    return found


def _under(stages: dict, spans: list[SpanView], is_stage, root: SpanView) -> list[SpanView]:
    # One index and one walk budget per engine's stage test, built only when needed.
    walker = stages.get(is_stage)
    if walker is None:
        walker = stages[is_stage] = _StageSpans(spans, is_stage)
    return walker.under(root)


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
    """The stage spans under each request span (those `is_stage` accepts: SGLang's, TGI's,
    vLLM's lifecycle spans),
    for the adapter's `timing_of`: of each stage name the one that started first (ties: the
    first in walk order, depth first), so an adapter reads at most one span per name and
    TGI's first `send_generation` is its first token. The work is linear in the
    export whatever its ids: request spans sharing an id share one walk, and the walks
    together stop at `_WALK_PER_SPAN` spans per span (issue 39: 10,000 roots sharing one id
    over 10,000 children cost 10^8 steps when each root walked all of them)."""

    def __init__(self, spans: list[SpanView], is_stage: Callable[[SpanView], bool]) -> None:
        self._is_stage = is_stage
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
                    if self._is_stage(child):
                        prior = first.get(child.name)
                        if prior is None or child.start_epoch_ns < prior.start_epoch_ns:
                            first[child.name] = child
        return list(first.values())
