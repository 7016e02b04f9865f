"""Client stages on the server's timeline: midpoint clock alignment, placement, OTel spans.

The browser's clock (`performance.now()`, ms since the probe's fetch call) and the server's
(`perf_counter_ns`) share no origin and may drift, so the client timestamps are placed on the
server axis NTP-style (DESIGN §1): the request's round trip [client start, client headers]
encloses the server's [receive start, response start], and assuming the uplink and downlink
take equally long, their midpoints coincide:

    θ = server_mid − client_mid            (server_ns = client_ms · 1e6 + θ)
    uncertainty = ((headers − start) − (response_start − receive_start)) / 2

The uncertainty is the NTP error bound: the true offset lies within θ ± uncertainty whatever
the split of the network time. A non-streamed response has no `response_start` event; its
headers leave with the body, so the server's anchor is the record's end.

Span tree (decided here): when the server continued the browser's trace, the browser's
traceparent names a span nobody exported (the parent of the HTTP server span). We emit it:
a CLIENT span `client` with exactly that span id, [fetch called, stream end], so the trace
becomes browser → HTTP server span → `chat {model}` → stages, one tree. Its children are the
four contiguous client stages. When the trace ids differ (the server started a new trace),
the `client` span is instead a child of the `chat {model}` span, so it still lands in the
server's trace.
"""
from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from tracer.otel import SCOPE
from tracer.probe_schema import Beacon, ClientTimes
from tracer.record import RequestRecord
from tracer.traceparent import parse_traceparent

# Client stage name → (start boundary, end boundary) in ClientTimes; contiguous, in order.
CLIENT_STAGE_BOUNDS = (
    ("client.request", "start", "headers"),
    ("client.first_byte", "headers", "first_byte"),
    ("client.first_token", "first_byte", "first_token"),
    ("client.first_paint", "first_token", "first_paint"),
)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


@dataclass(slots=True, frozen=True)
class ClockAlignment:
    """Maps browser ms to server perf_counter ns for one request.

    >>> a = ClockAlignment(offset_ns=990_000_000, uncertainty_ns=10_000_000, anchor="response_start")
    >>> a.to_server_ns(25.0)
    1015000000
    """

    offset_ns: int          # θ: server_ns − client_ns for the same instant
    uncertainty_ns: int     # half the round trip not spent inside the server (≥ 0)
    anchor: str             # "response_start" | "end": the server instant paired with t.headers

    def to_server_ns(self, client_ms: float) -> int:
        return round(client_ms * 1e6) + self.offset_ns

    def as_dict(self) -> dict:
        return {"skew_ms": self.offset_ns / 1e6, "uncertainty_ms": self.uncertainty_ns / 1e6,
                "anchor": self.anchor}


@dataclass(slots=True, frozen=True)
class ClientStage:
    """A client stage placed on the server's perf_counter axis."""

    stage: str
    start_ns: int
    end_ns: int


def response_start_ns(record: RequestRecord) -> tuple[int, str]:
    """The server instant the response headers left, and which anchor it is."""
    for name, t_ns, _attrs in record.events:
        if name == "response_start":
            return t_ns, "response_start"
    return record.end_ns, "end"


def align(record: RequestRecord, times: ClientTimes) -> ClockAlignment | None:
    """θ and its uncertainty, or None when the browser never saw the headers."""
    if times.headers is None:
        return None
    server_start_ns = record.start_ns
    server_resp_ns, anchor = response_start_ns(record)
    client_start_ns, client_headers_ns = round(times.start * 1e6), round(times.headers * 1e6)
    # Doubled midpoints keep the arithmetic in exact integers.
    offset_ns = ((server_start_ns + server_resp_ns) - (client_start_ns + client_headers_ns)) // 2
    network_ns = (client_headers_ns - client_start_ns) - (server_resp_ns - server_start_ns)
    # Negative: the browser saw a shorter round trip than the server spent, which only a late
    # server mark (its thread descheduled right after the write), timer coarsening or a
    # mis-paired anchor can cause; the midpoint is still the best estimate, and the
    # inconsistency itself bounds its error, so the uncertainty is |network| / 2 either way.
    return ClockAlignment(offset_ns, abs(network_ns) // 2, anchor)


def place_client_stages(times: ClientTimes, alignment: ClockAlignment) -> tuple[ClientStage, ...]:
    """The contiguous client stages on the server axis; a stage whose end the browser did not
    report is left out (the next one then starts at the last known boundary)."""
    stages, start_ms = [], times.start
    for stage, _start_field, end_field in CLIENT_STAGE_BOUNDS:
        end_ms = getattr(times, end_field)
        if end_ms is None:
            continue
        stages.append(ClientStage(stage, alignment.to_server_ns(start_ms),
                                  alignment.to_server_ns(end_ms)))
        start_ms = end_ms
    return tuple(stages)


class ClientSpanEmitter:
    """Emits a beacon's client spans into the `SpanBuilder`'s provider, same trace as the server.

    >>> from tracer.otel import Clock, SpanBuilder, make_tracer_provider
    >>> emitter = ClientSpanEmitter(SpanBuilder(make_tracer_provider(environ={}), Clock()))
    >>> # emitter.emit(record, beacon, alignment, stages) after a beacon is joined
    """

    def __init__(self, span_builder) -> None:
        # SpanBuilder keeps its sink private; these are the pieces `SpanBuilder.finish` uses.
        self._builder = span_builder
        self._processor = getattr(span_builder, "_processor", None)
        self._ids = span_builder._ids
        self._resource = span_builder._resource
        self._clock = span_builder._clock

    def emit(self, record: RequestRecord, beacon: Beacon, alignment: ClockAlignment,
             stages: tuple[ClientStage, ...]) -> None:
        if self._processor is None or not getattr(self._processor, "_span_processors", True):
            return
        trace_id = int(record.trace_id, 16)
        span_id, parent = self._client_identity(record, beacon, trace_id)
        sampler_parent = parent or _remote_parent(beacon.traceparent, record.trace_id)
        if not self._builder._should_sample(sampler_parent, trace_id, "client", {}):
            return
        ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)
        clock = _clock_attrs(alignment)
        for stage in stages:
            child = SpanContext(trace_id, self._ids.generate_span_id(), is_remote=False,
                                trace_flags=_SAMPLED)
            self._end(stage.stage, child, ctx, stage.start_ns, stage.end_ns,
                      {"llm.stage": stage.stage, **clock}, SpanKind.INTERNAL)
        end_ns = alignment.to_server_ns(max(beacon.t.end, beacon.t.first_paint or 0.0))
        attrs = {**clock, "llm.client.outcome": beacon.outcome, "llm.client.chunks": beacon.chunks,
                 "llm.request_id": record.request_id}
        if beacon.status is not None:
            attrs["http.response.status_code"] = beacon.status
        if beacon.url_path is not None:
            attrs["url.path"] = beacon.url_path
        failed = beacon.outcome != "ok"
        self._end("client", ctx, parent, alignment.to_server_ns(beacon.t.start), end_ns, attrs,
                  SpanKind.CLIENT, Status(StatusCode.ERROR, beacon.outcome) if failed else None)

    def _client_identity(self, record: RequestRecord, beacon: Beacon,
                         trace_id: int) -> tuple[int, SpanContext | None]:
        """(span id, parent): the browser's own span when the trace was continued, else a new
        span under the server span."""
        tp = parse_traceparent(beacon.traceparent)
        if tp is not None and tp.trace_id == record.trace_id:
            return int(tp.span_id, 16), None
        server = SpanContext(trace_id, int(record.span_id, 16), is_remote=False,
                             trace_flags=_SAMPLED)
        return self._ids.generate_span_id(), server

    def _end(self, name: str, ctx: SpanContext, parent: SpanContext | None, start_ns: int,
             end_ns: int, attrs: dict, kind: SpanKind, status: Status | None = None) -> None:
        to_epoch = self._clock.to_epoch_ns
        self._processor.on_end(ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self._resource, attributes=attrs,
            kind=kind, status=status or Status(StatusCode.UNSET), instrumentation_scope=SCOPE,
            start_time=to_epoch(start_ns), end_time=to_epoch(max(end_ns, start_ns))))


def _clock_attrs(alignment: ClockAlignment) -> dict:
    return {"llm.client.clock_skew_ms": alignment.offset_ns / 1e6,
            "llm.client.clock_uncertainty_ms": alignment.uncertainty_ns / 1e6,
            "llm.client.clock_anchor": alignment.anchor}


def _remote_parent(traceparent: str | None, trace_id_hex: str) -> SpanContext | None:
    """The browser's context as the server saw it, for the sampler's parent-based decision."""
    tp = parse_traceparent(traceparent)
    if tp is None or tp.trace_id != trace_id_hex:
        return None
    return SpanContext(int(tp.trace_id, 16), int(tp.span_id, 16), is_remote=True,
                       trace_flags=TraceFlags(tp.flags & 0x01))
