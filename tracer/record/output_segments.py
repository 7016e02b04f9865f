"""Where a response's output began, of which kind, and the segments between its first output
and its first text (docs/architecture.md, "First output, by kind").

The stages end at the first output of any kind, so they sum to it exactly. When the first
text comes later (a reasoning model thinks first, an agent's turn opens with a tool call),
each kind that came before it fills a segment named after it, from its first output to the
next kind's: reasoning → text gives `reasoning`; reasoning → tool call → text gives
`reasoning` then `tool_call`. Stages plus segments then sum to the first text, the
user-facing TTFT. Without any text (a tool-call-only answer) the segments run to the last
kind's first output, and TTFT is None: there is no first text to wait for.

Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.attribution import attribute
from tracer.record.request_record import StageSpan
from tracer.record.stages import OUTPUT_KINDS

__all__ = ["Outputs", "attribute_outputs", "by_arrival", "output_fields", "split_outputs"]

TEXT = OUTPUT_KINDS[0]


def by_arrival(outputs: dict) -> list[tuple[object, bool, str]]:
    """The kinds' first outputs in the order they came: (time, is text, kind). In a tie (one
    read carried both) the text is taken as the later: a stream sends its thinking or its
    call before the text that follows it; and thinking before a call (a model thinks, then
    calls). Unknown kinds and missing times are left out.

    >>> [k for _, _, k in by_arrival({"text": 5, "reasoning": 5, "tool_call": None})]
    ['reasoning', 'text']
    """
    return sorted((t, k == TEXT, k) for k, t in outputs.items()
                  if k in OUTPUT_KINDS and t is not None)


@dataclass(slots=True, frozen=True)
class Outputs:
    """What `split_outputs` found: the first output (ns from the start, and its kind), the
    first text (TTFT), and the segments that follow the stages."""

    first_output_ns: int | None
    first_output_kind: str | None
    ttft_ns: int | None
    segments: tuple[StageSpan, ...] = ()


def split_outputs(start_ns: int, stages_end_ns: int | None,
                  outputs_ns: dict[str, int]) -> Outputs:
    """`stages_end_ns`: where the stages ended (the first output handed to the transport, by
    the attribution), or None when they never did; `outputs_ns`: the first output of each
    kind. A front that reports no kinds has text only.

    >>> split_outputs(0, 40, {})
    Outputs(first_output_ns=40, first_output_kind='text', ttft_ns=40, segments=())
    >>> o = split_outputs(0, 40, {"reasoning": 40, "tool_call": 90, "text": 120})
    >>> o.first_output_kind, o.ttft_ns, [(s.stage, s.start_ns, s.end_ns) for s in o.segments]
    ('reasoning', 120, [('reasoning', 40, 90), ('tool_call', 90, 120)])
    >>> o = split_outputs(0, 40, {"tool_call": 40})
    >>> o.first_output_kind, o.ttft_ns, o.segments
    ('tool_call', None, ())
    """
    if stages_end_ns is None:
        return Outputs(None, None, None)
    first_output_ns = stages_end_ns - start_ns
    if not outputs_ns:   # text only (most answers): nothing to order
        return Outputs(first_output_ns, TEXT, first_output_ns)
    kinds = by_arrival(outputs_ns)
    if not kinds or kinds[0][2] == TEXT:
        return Outputs(first_output_ns, TEXT, first_output_ns)
    segments: list[StageSpan] = []
    boundary_ns = stages_end_ns
    for (_, _, kind), (t_next, _, next_kind) in zip(kinds, kinds[1:]):
        end_ns = max(t_next, boundary_ns)     # a clock that ran back gives a zero-length one
        segments.append(StageSpan(kind, boundary_ns, end_ns))
        boundary_ns = end_ns
        if next_kind == TEXT:
            break
    text_ns = boundary_ns - start_ns if TEXT in outputs_ns else None
    return Outputs(first_output_ns, kinds[0][2], text_ns, tuple(segments))


def attribute_outputs(snap, stages: tuple[str, ...]):
    """(Attribution, Outputs) of a timeline snapshot: the one rule for a record's stages, its
    segments and its TTFT end, which the record (tracer/core/request_tracer.py) and the
    in-band timing line (tracer/web/inband.py) both take from here."""
    attribution = attribute(snap, stages)
    outputs = split_outputs(snap.start_ns, None if attribution.ttft_ns is None
                            else attribution.covered_until_ns, snap.outputs_ns)
    return attribution, outputs


def output_fields(record) -> dict:
    """A record's first output, tool calls, TPOT and draft acceptance (speculative decoding)
    as its log line and `/ui` show them, in ms from the request's start (a `RequestRecord`;
    names only, never arguments).

    >>> from tracer.record.request_record import RequestRecord, ToolCall
    >>> r = RequestRecord("r", "0" * 32, "0" * 16, "m", "chat", 0, 9, first_output_ns=2_000_000,
    ...                   first_output_kind="tool_call", num_tool_calls=1,
    ...                   tool_calls=(ToolCall("get_weather", 2_000_000, 3_500_000),))
    >>> output_fields(r)["tool_calls"]
    [{'name': 'get_weather', 'start_ms': 2.0, 'ready_ms': 3.5}]
    """
    return {
        "first_output_ms": _ms(record.first_output_ns),
        "first_output_kind": record.first_output_kind,
        "tool_calls": [{"name": c.name, "start_ms": _ms(c.start_ns), "ready_ms": _ms(c.ready_ns)}
                       for c in record.tool_calls],
        "num_tool_calls": record.num_tool_calls,
        "tpot_ms": _ms(record.tpot_ns),
        "num_draft_tokens": record.num_draft_tokens,
        "num_draft_accepted": record.num_draft_accepted,
    }


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6
