"""What `Tracer.begin` asks of a span exporter: start the request's span, and say its ids.

The tracer starts the span at `begin` so its ids and the sampling decision come from the
exporter (an OTel provider's id generator and sampler: tracer/sinks/spans.py), and stays
free of any exporter: this protocol is all it knows. The parent context travels in one form,
a `TraceParent`, from the HTTP edge (tracer/web/openai_http.py) through `begin` to here.
"""
from __future__ import annotations

from typing import Protocol

from tracer.record.traceparent import TraceParent


class ServerSpanHandle(Protocol):
    """A started request span. The tracer reads its own context (the ids the response's
    `Server-Timing` and the upstream's `traceparent` name) and hands the handle back to the
    exporter on the record (`RequestRecord.span_handle`)."""

    @property
    def traceparent(self) -> TraceParent:
        """The span's own context: its trace id, its span id, its sampled flag."""


class ServerSpanStarter(Protocol):
    """Starts a request's span; the same object is usually a `RecordSink` that ends it.

    The exporter names the span and sets the attributes every request span has (the OTel
    GenAI conventions live with it); `model` is already a label (a served name or `other`,
    tracer.record.labels.model_label), so no request string reaches a span name.

    >>> from tracer.record.traceparent import parse_traceparent
    >>> class Fixed:
    ...     def start_server_span(self, *, operation, model, parent, start_perf_ns, attributes):
    ...         own = TraceParent(parent.trace_id, "1" * 16, 1)
    ...         return type("Handle", (), {"traceparent": own})()
    >>> from tracer.core.request_tracer import Tracer
    >>> tracer = Tracer(model_names=("m",), span_builder=Fixed())
    >>> parent = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    >>> tracer.begin(request_id="r", model="m", operation="chat", traceparent=parent,
    ...              start_ns=0).traceparent
    '00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01'
    """

    def start_server_span(self, *, operation: str, model: str, parent: TraceParent | None,
                          start_perf_ns: int, attributes: dict) -> ServerSpanHandle:
        """Start the span of a request that arrived at `start_perf_ns` (perf_counter_ns),
        continuing `parent` (None: a new trace). May raise: the tracer then makes the ids
        itself and records the request without a span."""
