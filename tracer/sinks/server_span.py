"""The request's server span while the request runs, and the parent it continues.

`SpanBuilder.start_server_span` (tracer/sinks/spans.py) makes one per request at `begin`:
its ids are fixed then (the response's `traceparent` and `Server-Timing` carry them), and the
span is emitted from the finished record. Its parent is the active OTel span when there is
one (the FastAPI instrumentation's HTTP span), else the request's `traceparent` header.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from opentelemetry import trace as trace_api
from opentelemetry.trace import SpanContext, TraceFlags

from tracer.record.traceparent import TraceParent


def current_parent() -> TraceParent | None:
    """The context of the active OTel span (e.g. the FastAPI instrumentation's HTTP span),
    or None when no span is active."""
    ctx = trace_api.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return TraceParent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}",
                       int(ctx.trace_flags) & TraceFlags.SAMPLED)


def continued_parent(parent: TraceParent | None) -> TraceParent | None:
    """The parent a request's span (or a forwarded request) continues: the active OTel span
    when there is one, else `parent` (the request's `traceparent` header). The
    instrumentation's HTTP span already continued that header, so when it exists it is the
    nearer ancestor: nesting under it keeps one tree instead of two sibling spans."""
    return current_parent() or parent


def span_context(tp: TraceParent, *, remote: bool) -> SpanContext:
    """The OTel context of `tp`: `remote` when another process started it.

    >>> span_context(TraceParent("1" * 32, "2" * 16, 1), remote=True).is_remote
    True
    """
    return SpanContext(int(tp.trace_id, 16), int(tp.span_id, 16), is_remote=remote,
                       trace_flags=TraceFlags(tp.flags))


@dataclass(slots=True, frozen=True)
class ServerSpan:
    """The request's span while it runs: ids are fixed at start, the span is emitted at finish.

    It holds its ids as integers and its parent as the `TraceParent` it continued: the
    OpenTelemetry `SpanContext`s (`context`, `parent`) are made only where a `ReadableSpan`
    is built (the SDK's path, tracer/sinks/spans.py), never on the serving thread, where
    each cost ~1 µs a request; the encoded path (the default) writes the integers."""

    name: str
    traceparent: TraceParent  # its own context (tracer.core.span_builder.ServerSpanHandle)
    start_ns: int            # perf_counter_ns
    trace_id_int: int
    span_id_int: int
    parent_traceparent: TraceParent | None   # the continued parent (`continued_parent`)
    sampled: bool
    attributes: dict = field(default_factory=dict)

    @property
    def trace_id(self) -> str:
        """32 lowercase hex."""
        return self.traceparent.trace_id

    @property
    def span_id(self) -> str:
        """16 lowercase hex."""
        return self.traceparent.span_id

    @property
    def context(self) -> SpanContext:
        """Its own OTel context (made on each call)."""
        return span_context(self.traceparent, remote=False)

    @property
    def parent(self) -> SpanContext | None:
        """The OTel context of the span it continues, remote (made on each call)."""
        parent = self.parent_traceparent
        return None if parent is None else span_context(parent, remote=True)

    @property
    def parent_span_id_int(self) -> int | None:
        parent = self.parent_traceparent
        return None if parent is None else int(parent.span_id, 16)


_new = object.__new__
_SERVER_SPAN_SETTERS = tuple(getattr(ServerSpan, f).__set__ for f in (
    "name", "traceparent", "start_ns", "trace_id_int", "span_id_int", "parent_traceparent",
    "sampled", "attributes"))
assert len(_SERVER_SPAN_SETTERS) == len(dataclasses.fields(ServerSpan)), "set every field"


def new_server_span(name: str, traceparent: TraceParent, start_ns: int, trace_id_int: int,
                    span_id_int: int, parent_traceparent: TraceParent | None, sampled: bool,
                    attributes: dict) -> ServerSpan:
    """`ServerSpan(...)` without the frozen dataclass' eight `object.__setattr__` calls: it
    is built on the serving thread for every request. The same object.

    >>> own = TraceParent(f"{1:032x}", f"{2:016x}", 1)
    >>> span = new_server_span("chat m", own, 5, 1, 2, None, True, {})
    >>> span == ServerSpan("chat m", own, 5, 1, 2, None, True, {})
    True
    >>> span.context == SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1))
    True
    """
    span = _new(ServerSpan)
    for set_field, value in zip(_SERVER_SPAN_SETTERS, (name, traceparent, start_ns,
                                                      trace_id_int, span_id_int,
                                                      parent_traceparent, sampled, attributes)):
        set_field(span, value)
    return span
