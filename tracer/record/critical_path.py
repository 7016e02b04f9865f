"""The critical path through a tree of spans, up to one instant (docs/architecture.md,
"The whole path").

A backend that runs retrieval, a database query and moderation before it calls the engine
exports a span for each, often concurrent. What delayed the engine call is not their sum: it
is the chain of work each next step waited for. Walking back from the instant of interest
(the engine call's start), the last child span to finish before it is what the parent
waited on; inside that child the same rule applies; before that child started, the parent's
other children, and so on. Time covered by no child is the parent's own (its self time).
The result is contiguous and sums exactly to the interval, whatever the overlap.

This is the rule of Jaeger's critical path ("last finishing child", jaegertracing/jaeger-ui
`packages/jaeger-ui/src/components/TracePage/CriticalPath/index.ts` at 20ab1e45c809, 2023):
read there, written here from its description, with one difference: it first trims children
to their parents (`sanitizeOverFlowingChildren`); here every child is clipped to the part of
its parent still to be explained (the cursor), so a child still running at the instant of
interest is the one on the path, and the walk needs no rewritten copy of the trace.

Pure and bounded: a span id is walked at most once, depth at most `MAX_DEPTH`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Deeper trees than this are cut: the rest of the interval is the span's own time.
MAX_DEPTH = 64


@dataclass(slots=True, frozen=True)
class PathSpan:
    """One span as the walk sees it: ids, name and its interval (ns, any one clock)."""

    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int


@dataclass(slots=True, frozen=True)
class PathPiece:
    """An interval of the path and the span whose (self) time it was."""

    span: PathSpan
    start_ns: int
    end_ns: int


def critical_path(span: PathSpan, children: Mapping[str, Sequence[PathSpan]], until_ns: int,
                  *, skip: str = "") -> list[PathPiece]:
    """The path through `span` from its start to `until_ns` (clipped to the span), in time
    order; `children` maps a span id to its children; the child `skip` (the next hop of the
    chain, which starts at `until_ns`) is not a candidate.

    >>> root = PathSpan("r", "", "POST /chat", 0, 100)
    >>> kids = {"r": [PathSpan("a", "r", "auth", 1, 5), PathSpan("m", "r", "moderation", 6, 30),
    ...               PathSpan("q", "r", "retrieve", 5, 40)],
    ...         "q": [PathSpan("s", "q", "SELECT docs", 10, 35)]}
    >>> [(p.span.name, p.start_ns, p.end_ns) for p in critical_path(root, kids, 41)]
    [('POST /chat', 0, 1), ('auth', 1, 5), ('retrieve', 5, 10), ('SELECT docs', 10, 35), ('retrieve', 35, 40), ('POST /chat', 40, 41)]
    """
    hi = min(max(until_ns, span.start_ns), span.end_ns if span.end_ns >= span.start_ns
             else until_ns)
    pieces: list[PathPiece] = []   # built backwards, from `hi`
    _walk(span, span.start_ns, hi, children, skip, pieces, set(), 0)
    pieces.reverse()
    return _merged(pieces)


def _walk(span: PathSpan, lo: int, hi: int, children: Mapping[str, Sequence[PathSpan]],
          skip: str, out: list[PathPiece], seen: set[str], depth: int) -> None:
    seen.add(span.span_id)
    kids = [] if depth >= MAX_DEPTH else [
        c for c in children.get(span.span_id, ())
        if c.span_id not in seen and c.span_id != skip and c.end_ns > c.start_ns]
    # Latest clipped end first; among equal ends the earlier start (the longer wait), then
    # the id, so the walk never depends on arrival order.
    kids.sort(key=lambda c: (min(c.end_ns, hi), -c.start_ns, c.span_id), reverse=True)
    cursor = hi
    for child in kids:
        if cursor <= lo:
            break
        if child.start_ns >= cursor or child.span_id in seen:
            continue
        end = min(child.end_ns, cursor)
        start = max(child.start_ns, lo)
        if end <= start:
            continue
        if end < cursor:
            out.append(PathPiece(span, end, cursor))
        _walk(child, start, end, children, "", out, seen, depth + 1)
        cursor = start
    if cursor > lo:
        out.append(PathPiece(span, lo, cursor))


def _merged(pieces: list[PathPiece]) -> list[PathPiece]:
    out: list[PathPiece] = []
    for piece in pieces:
        if piece.end_ns <= piece.start_ns:
            continue
        if out and out[-1].span.span_id == piece.span.span_id and out[-1].end_ns == piece.start_ns:
            out[-1] = PathPiece(piece.span, out[-1].start_ns, piece.end_ns)
        else:
            out.append(piece)
    return out


def chain_to(by_id: Mapping[str, PathSpan], span_id: str, root_id: str) -> list[PathSpan] | None:
    """The spans from `root_id` down to `span_id`'s parent (root first), or None when the
    parents do not lead there (a break, a cycle, or more than `MAX_DEPTH` hops).

    >>> by = {"r": PathSpan("r", "x", "root", 0, 9), "c": PathSpan("c", "r", "POST", 2, 8)}
    >>> [s.span_id for s in chain_to(by, "e", "r") or []]   # "e" is not in the map: its parent?
    []
    >>> by["e"] = PathSpan("e", "c", "llm_request", 3, 7)
    >>> [s.span_id for s in chain_to(by, "e", "r")]
    ['r', 'c']
    """
    span = by_id.get(span_id)
    if span is None:
        return None
    chain: list[PathSpan] = []
    seen = {span_id}
    parent_id = span.parent_id
    while len(chain) <= MAX_DEPTH:
        parent = by_id.get(parent_id)
        if parent is None or parent_id in seen:
            return None
        chain.append(parent)
        if parent_id == root_id:
            chain.reverse()
            return chain
        seen.add(parent_id)
        parent_id = parent.parent_id
    return None
