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
    found, children = [], None
    for span in spans:
        if vllm.matches(span):
            found.append((span, vllm.timing_of(span)))
        elif trtllm.matches(span):
            found.append((span, trtllm.timing_of(span)))
        elif sglang.matches(span):
            if children is None:
                children = _children_index(spans)
            found.append((span, sglang.timing_of(span, _descendants(span, children))))
    return found


def _children_index(spans: list[SpanView]) -> dict[tuple[str, str], list[SpanView]]:
    index: dict[tuple[str, str], list[SpanView]] = {}
    for span in spans:
        if span.parent_span_id:
            index.setdefault((span.trace_id, span.parent_span_id), []).append(span)
    return index


def _descendants(root: SpanView, children: dict) -> list[SpanView]:
    out, todo, seen = [], [root.span_id], {root.span_id}
    while todo and len(out) < 1024:   # a cycle or a huge tree costs a bounded walk
        for child in children.get((root.trace_id, todo.pop()), ()):
            if child.span_id not in seen:
                seen.add(child.span_id)
                out.append(child)
                todo.append(child.span_id)
    return out
