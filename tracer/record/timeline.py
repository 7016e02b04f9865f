"""One request's timestamps on the perf_counter_ns clock, written where the work happens.

Two threads write into a timeline: the asyncio thread (receive, template, tokenize, the
admission's kv_lookup, send, emits) and the engine's step thread (queue, prefill, sample,
detokenize). Each write is a single dict or list operation, which the GIL makes atomic, so
the hot path takes no lock; readers take `snapshot()` (C-level copies, also atomic) before
iterating.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tracer.record.emits import NO_GAPS, EmitLog, GapSummary


@dataclass(slots=True, frozen=True)
class TimelineSnapshot:
    """A consistent copy of a timeline, safe to iterate while writers keep writing."""

    start_ns: int
    end_ns: int | None
    marks_ns: dict[str, int]
    stage_attrs: dict[tuple[str, str], object]
    events: list[tuple[str, int, dict]]
    first_emits_ns: tuple[int, ...]     # the first MAX_SEND_TIMES emits (tracer/record/emits.py)
    num_emits: int
    gaps: GapSummary
    # The first output of each kind handed to the transport (OUTPUT_KINDS).
    outputs_ns: dict[str, int] = field(default_factory=dict)
    # Per tool call, in the order they started: [name, start_ns, ready_ns or None].
    tool_calls: tuple[tuple[str | None, int, int | None], ...] = ()
    num_tool_calls: int = 0             # every call started, the ones past MAX_TOOL_CALLS too


_new = object.__new__
_SNAPSHOT_SET = {name: getattr(TimelineSnapshot, name).__set__
                 for name in TimelineSnapshot.__slots__}
assert len(_SNAPSHOT_SET) == 11, "TimelineSnapshot.snapshot() sets every field"

# Point events kept per request (prefill chunks, preemptions, response start, ...).
MAX_EVENTS = 256
# Tool calls kept per request with their times: an agent turn makes a handful; a stream of
# thousands is counted, not kept. A name longer than MAX_TOOL_NAME_CHARS is cut.
MAX_TOOL_CALLS = 32
MAX_TOOL_NAME_CHARS = 64


class Timeline:
    """Boundaries, events and emits of one request (docs/architecture.md, "The nine server stages").

    `mark(stage, t_ns)` says that `stage` *ended* at `t_ns`; stage i spans
    [end of stage i-1, end of stage i], so stages are contiguous by construction and
    `tracer.record.attribution.attribute` turns the marks into spans afterwards.

    >>> tl = Timeline(start_ns=1_000)
    >>> tl.mark("receive", 1_200)
    >>> tl.stage_attr("kv_lookup", "num_hit_tokens", 64)
    >>> tl.event("prefill_chunk", 1_500, start_ns=1_300, num_tokens=128)
    >>> tl.emit(2_000); tl.emit(2_300); tl.end(2_400)
    >>> tl.snapshot().marks_ns
    {'receive': 1200}
    """

    __slots__ = ("start_ns", "end_ns", "_marks_ns", "_stage_attrs", "_events", "_emits",
                 "num_dropped_events", "_outputs_ns", "_tool_calls", "num_tool_calls")

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns: int | None = None
        self._marks_ns: dict[str, int] = {}
        # Flat (stage, key) keys keep stage_attr a single store: no nested setdefault race.
        self._stage_attrs: dict[tuple[str, str], object] = {}
        self._events: list[tuple[str, int, dict]] = []
        self._emits = EmitLog()
        self.num_dropped_events = 0
        self._outputs_ns: dict[str, int] = {}
        self._tool_calls: dict[object, list] = {}
        self.num_tool_calls = 0

    def mark(self, stage: str, t_ns: int) -> None:
        """`stage` ended at `t_ns`. A stage ends once: a repeated mark is ignored, so the
        engine re-reporting a boundary (e.g. `scheduled` after a preemption) cannot move it."""
        self._marks_ns.setdefault(stage, t_ns)

    def event(self, name: str, t_ns: int, /, **attrs: object) -> None:
        """A point event, e.g. `prefill_chunk` (start_ns, num_tokens, batch_size) or `preempted`.
        Past MAX_EVENTS they are counted, not kept: a request preempted on every step must
        not grow without bound. `name` and `t_ns` are positional only, so an attribute may
        have any name (an upstream's `timings` has keys we do not choose)."""
        if len(self._events) < MAX_EVENTS:
            self._events.append((name, t_ns, attrs))
        else:
            self.num_dropped_events += 1

    def stage_attr(self, stage: str, key: str, value: object) -> None:
        """An attribute for the stage's span, e.g. ("kv_lookup", "num_hit_tokens", 64)."""
        self._stage_attrs[(stage, key)] = value

    def emit(self, t_ns: int) -> None:
        """A content chunk was handed to the transport: the first is TTFT's end, later ones
        give inter-token latencies (kept as a bounded summary, tracer/record/emits.py)."""
        self._emits.add(t_ns)

    def output(self, kind: str, t_ns: int) -> None:
        """An output of `kind` (one of OUTPUT_KINDS) was handed to the transport; the first of
        each kind is kept. The last stage ends at the first output of any kind."""
        self._outputs_ns.setdefault(kind, t_ns)

    def tool_call(self, key: object, t_ns: int, name: object = None) -> None:
        """A tool call started (its first delta naming the function) at `t_ns`; `key` tells
        calls apart within the stream (the format's index or id). A key seen before is not a
        new call. Past MAX_TOOL_CALLS calls are counted only."""
        calls = self._tool_calls
        if key in calls:
            return
        self.num_tool_calls += 1
        if len(calls) < MAX_TOOL_CALLS:
            calls[key] = [name[:MAX_TOOL_NAME_CHARS] if isinstance(name, str) else None,
                          t_ns, None]

    def tool_call_ready(self, key: object, t_ns: int) -> None:
        """The call's arguments are complete at `t_ns`: when an agent can run the tool."""
        call = self._tool_calls.get(key)
        if call is not None and call[2] is None:
            call[2] = t_ns

    def end(self, t_ns: int) -> None:
        """The last byte was handed to the transport (or the request was aborted)."""
        self.end_ns = t_ns

    def mark_ns(self, stage: str) -> int | None:
        return self._marks_ns.get(stage)

    def snapshot(self) -> TimelineSnapshot:
        # dict.copy()/list.copy() run in C without releasing the GIL: each copy is atomic.
        # The emits come from one thread, which is also the one that reads them before the
        # end (the in-band line); after the end nothing writes them.
        # Built field by field through the slots, not the frozen dataclass' `__init__`
        # (eleven `object.__setattr__` calls): once per finished request, on its thread.
        emits = self._emits
        snap = _new(TimelineSnapshot)
        _SNAPSHOT_SET["start_ns"](snap, self.start_ns)
        _SNAPSHOT_SET["end_ns"](snap, self.end_ns)
        _SNAPSHOT_SET["marks_ns"](snap, self._marks_ns.copy())
        _SNAPSHOT_SET["stage_attrs"](snap, self._stage_attrs.copy())
        _SNAPSHOT_SET["events"](snap, self._events.copy())
        _SNAPSHOT_SET["first_emits_ns"](snap, tuple(emits.first_ns))
        _SNAPSHOT_SET["num_emits"](snap, emits.count)
        _SNAPSHOT_SET["gaps"](snap, emits.summary())
        _SNAPSHOT_SET["outputs_ns"](snap, self._outputs_ns.copy())
        _SNAPSHOT_SET["tool_calls"](snap, tuple(tuple(c) for c in list(self._tool_calls.values()))
                                    if self._tool_calls else ())
        _SNAPSHOT_SET["num_tool_calls"](snap, self.num_tool_calls)
        return snap


class NullTimeline:
    """Accepts every write and keeps nothing: the timeline of a disabled tracer.

    >>> tl = NullTimeline(0); tl.mark("receive", 5); tl.snapshot().marks_ns
    {}
    """

    __slots__ = ("start_ns", "end_ns")
    num_dropped_events = 0

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns: int | None = None

    def mark(self, stage: str, t_ns: int) -> None: pass
    def event(self, name: str, t_ns: int, /, **attrs: object) -> None: pass
    def stage_attr(self, stage: str, key: str, value: object) -> None: pass
    def emit(self, t_ns: int) -> None: pass
    def output(self, kind: str, t_ns: int) -> None: pass
    def tool_call(self, key: object, t_ns: int, name: object = None) -> None: pass
    def tool_call_ready(self, key: object, t_ns: int) -> None: pass

    def end(self, t_ns: int) -> None:
        self.end_ns = t_ns

    def mark_ns(self, stage: str) -> int | None:
        return None

    def snapshot(self) -> TimelineSnapshot:
        return TimelineSnapshot(self.start_ns, self.end_ns, {}, {}, [], (), 0, NO_GAPS, {})
