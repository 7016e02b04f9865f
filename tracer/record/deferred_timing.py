"""A finished record whose timing is worked out by its first reader, not by `Tracer.finish`.

Why: attributing a request's timeline (its nine stages, the output segments, the gaps, the
tool calls) was about a third of what the tracer cost the serving thread per request
(docs/figures.md, "The tracer's own cost"). `Tracer.finish` now takes the timeline's snapshot
(the request's moments, as they are at its end) and builds a `DeferredRecord` holding it; the
first read of any timing field works them all out from that snapshot, once. The first reader
is normally the tracer's worker thread (its first sinks read `ttft_ns`), so the serving thread
pays only for the snapshot. A reader that comes first (the beacon join, `/ui`, a test reading
the record `finish` returned) works it out itself and sees the same values: the attribution
reads only the snapshot, never the live timeline.

The fields are the `TIMING_FIELDS` below; everything else of the record is set at finish as
before. The work happens under one lock, so two threads reading at once never see half of it,
and a write to a timing field first works the others out (a later reader never overwrites it).
"""
from __future__ import annotations

import threading

from tracer.record.output_segments import attribute_outputs
from tracer.record.request_record import RequestRecord, ToolCall
from tracer.record.timeline import TimelineSnapshot

# What `fill_timing` sets: the fields a reader of a DeferredRecord waits for.
TIMING_FIELDS = ("stages", "unattributed_ns", "ttft_ns", "first_output_ns", "first_output_kind",
                 "tool_calls", "num_tool_calls", "itl", "events", "attrs")

# One lock for every record: each is worked out once, in a few µs, nearly always by one
# thread (the worker), so it is almost never contended, and a record carries no lock of its own.
_LOCK = threading.Lock()

_GET = {name: getattr(RequestRecord, name).__get__ for name in TIMING_FIELDS}
_SET = {name: getattr(RequestRecord, name).__set__ for name in TIMING_FIELDS}


def fill_timing(record: RequestRecord, snap: TimelineSnapshot, stages: tuple[str, ...],
                num_dropped_events: int = 0) -> None:
    """Set `record`'s timing fields from the timeline snapshot `snap`, attributed over
    `stages` (the tracer's stage order, or a proxy's joined one). The one place they are
    computed, whether at once or by a DeferredRecord's first reader."""
    set_ = _SET
    attribution, outputs = attribute_outputs(snap, stages)
    set_["stages"](record, attribution.spans + outputs.segments)
    set_["unattributed_ns"](record, attribution.unattributed_ns)
    set_["ttft_ns"](record, outputs.ttft_ns)
    set_["first_output_ns"](record, outputs.first_output_ns)
    set_["first_output_kind"](record, outputs.first_output_kind)
    if snap.num_tool_calls:
        start = snap.start_ns
        set_["tool_calls"](record, tuple(
            ToolCall(name, t - start, None if ready is None else ready - start)
            for name, t, ready in snap.tool_calls))
        set_["num_tool_calls"](record, snap.num_tool_calls)
    set_["itl"](record, snap.gaps)
    set_["events"](record, tuple(snap.events))
    attrs = _GET["attrs"](record)
    if num_dropped_events:
        attrs["llm.num_dropped_events"] = num_dropped_events
    if attribution.clamped_ns:
        attrs["llm.clamped_ns"] = attribution.clamped_ns


def _deferred_field(name: str) -> property:
    get, set_ = _GET[name], _SET[name]

    def read(self):
        if self._pending is not None:
            self.settle()
        return get(self)

    def write(self, value) -> None:
        if self._pending is not None:
            self.settle()
        set_(self, value)

    return property(read, write, doc=f"`{name}`, worked out on first read (module docstring)")


class SettledRecord(RequestRecord):
    """A `RequestRecord` with `DeferredRecord`'s slot and none of its properties: what a
    DeferredRecord becomes once its timing is worked out (`settle`), and what
    `deferred_record` builds through. Its fields are read and written straight from their
    slots: a sink reads a record's timing fields dozens of times, and through a property each
    read is a Python call. Equal to any record with the same fields."""

    __slots__ = ("_pending",)

    is_settled = True

    def settle(self) -> None:
        """Nothing left to work out."""

    def __eq__(self, other):
        if not isinstance(other, RequestRecord):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _COMPARED)

    __hash__ = None


class DeferredRecord(SettledRecord):
    """A `RequestRecord` whose `TIMING_FIELDS` are filled on first read; see the module
    docstring. Equal to a plain record with the same fields. `deferred_record` builds one
    for `Tracer.finish`; once worked out it is a `SettledRecord` (the same object).

    >>> from tracer.record.timeline import Timeline
    >>> timeline = Timeline(0)
    >>> for stage, t in (("receive", 10), ("template", 20), ("send", 30)):
    ...     timeline.mark(stage, t)
    >>> timeline.emit(30); timeline.end(40)
    >>> record = DeferredRecord("r", "1" * 32, "2" * 16, "m", "chat", 0, 40)
    >>> record.defer(timeline.snapshot(), ("receive", "template", "send"))
    >>> record.is_settled
    False
    >>> record.ttft_ns, [s.stage for s in record.stages], record.is_settled
    (30, ['receive', 'template', 'send'], True)
    >>> type(record).__name__
    'SettledRecord'
    """

    __slots__ = ()   # SettledRecord's: an object turns from one into the other

    def __init__(self, *args, **kwargs) -> None:
        self._pending = None
        RequestRecord.__init__(self, *args, **kwargs)

    def defer(self, snap: TimelineSnapshot, stages: tuple[str, ...],
              num_dropped_events: int = 0) -> None:
        """Work the timing out from `snap` on first read instead of now."""
        self._pending = (snap, stages, num_dropped_events)

    @property
    def is_settled(self) -> bool:
        return self._pending is None

    def settle(self) -> None:
        """Work the timing out now, if no reader has yet; then the record is a
        `SettledRecord`, its fields read without the properties."""
        with _LOCK:
            pending = self._pending
            if pending is not None:
                fill_timing(self, *pending)
                self._pending = None
            # The same slots: allowed, and nothing is copied. A reader already inside a
            # property finds the value in the slot either way.
            self.__class__ = SettledRecord


def deferred_record(snap: TimelineSnapshot, stages: tuple[str, ...], num_dropped_events: int,
                    fields: dict) -> DeferredRecord:
    """`DeferredRecord(**fields)` deferred to `snap` (`DeferredRecord.defer`), built without
    its properties: the same record, in a third of the time.

    >>> from tracer.record.timeline import Timeline
    >>> timeline = Timeline(0)
    >>> for stage, t in (("receive", 10), ("send", 30)):
    ...     timeline.mark(stage, t)
    >>> timeline.emit(30); timeline.end(40)
    >>> record = deferred_record(timeline.snapshot(), ("receive", "send"), 0, dict(
    ...     request_id="r", trace_id="1" * 32, span_id="2" * 16, model="m", operation="chat",
    ...     start_ns=0, end_ns=40))
    >>> type(record).__name__, record.is_settled, record.ttft_ns, record.is_settled
    ('DeferredRecord', False, 30, True)
    """
    record = SettledRecord(**fields)   # the dataclass init's plain slot writes
    record._pending = (snap, stages, num_dropped_events)
    record.__class__ = DeferredRecord   # the same slots: allowed, and nothing is copied
    return record


_COMPARED = tuple(name for name, f in RequestRecord.__dataclass_fields__.items() if f.compare)
for _name in TIMING_FIELDS:
    setattr(DeferredRecord, _name, _deferred_field(_name))
