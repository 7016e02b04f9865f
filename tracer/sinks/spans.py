"""OpenTelemetry spans for one finished request: a `chat {model}` span and one child per stage.

Spans are built *after* the request, from its `RequestRecord` (docs/reference.md, "Spans"). The
SDK's `start_span` + `end` path costs ~12–18 µs a span (docs/reference.md, "Costs"); ten a
request is too much, so `SpanBuilder.finish` constructs `ReadableSpan`s directly, with ids from the
provider's id generator and exact epoch times, and hands them to the provider's span
processors (`on_end`), which is all `_Span.end()` would do. Sampling is decided once, when
the server span starts, with the provider's sampler. When every processor of the provider is
ttftscope's encoding batch processor on its fast path (tracer/sinks/otlp_export.py: what
`make_tracer_provider` installs), not even the `ReadableSpan` is built: each span is encoded
to its OTLP bytes straight from the record (`encode_span_fields`, the same bytes as
encoding the `ReadableSpan`; tests/tracer/test_otlp_export.py compares them) and queued.

A trace should have one SERVER span per hop. Our span is INTERNAL unless told: nested in
another's SERVER span (the FastAPI instrumentation's, with `--http-spans`). The fronts pass
`kind=SpanKind.SERVER` when it is the hop's only one, their default
(`tracer.web.front.request_span_kind`).
"""
from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from tracer.record import traceparent as w3c
from tracer.record.clock import Clock
from tracer.record.errors import error_type_of
from tracer.record.request_record import RequestRecord
from tracer.record.traceparent import TraceParent
from tracer.sinks.otlp_encoding import encode_span_fields, encoded_span, kind_field
from tracer.sinks.server_span import ServerSpan, continued_parent, new_server_span, span_context
from tracer.sinks.stage_spans import UNSET as _UNSET
from tracer.sinks.stage_spans import encode_stage_spans
from tracer.sinks.span_attributes import (
    clean_attributes,
    genai_attributes,
    prefill_attributes,
    request_attributes,
    request_span_name,
)

SCOPE = InstrumentationScope("ttftscope.tracer", "0.1.0")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_FLAG_SAMPLED, _FLAG_NOT_SAMPLED = int(TraceFlags.SAMPLED), int(TraceFlags.DEFAULT)
_CLIENT = kind_field(SpanKind.CLIENT)
_UPSTREAM_ATTRIBUTES = {"http.request.method": "POST"}
# A proxy record's attribute: the parent span id its upstream was sent (the engine join's
# secret, tracer/proxy/engine_join.py), set once the record is published. It becomes the id
# of a CLIENT span for the upstream call, so the engine's spans hang under it in one tree.
UPSTREAM_SPAN_ID = "llm.upstream.span_id"


def _hand_over(processor):
    """What takes a request's encoded spans, all together: the processor's
    `on_end_encoded_many`, or its `on_end_encoded` once a span."""
    many = getattr(processor, "on_end_encoded_many", None)
    if many is not None:
        return many
    one = processor.on_end_encoded
    return lambda spans: [one(span) for span in spans]


class SpanBuilder:
    """Builds the request's spans cheaply from a finished `RequestRecord`.

    >>> from tracer.record.request_record import RequestRecord
    >>> from tracer.sinks.tracer_provider import make_tracer_provider
    >>> builder = SpanBuilder(make_tracer_provider(environ={}), Clock())
    >>> span = builder.start_server_span(operation="chat", model="smollm2", parent=None,
    ...                                  start_perf_ns=1_000, attributes={"stream": True})
    >>> span.name, len(str(span.traceparent))
    ('chat smollm2', 55)
    >>> record = RequestRecord("r1", span.trace_id, span.span_id, "smollm2", "chat", 1_000, 9_000)
    >>> builder.finish(span, record)   # emits the server span and one span per stage
    """

    name = "spans"   # in the tracer's sink failure counts

    def __init__(self, tracer_provider, clock: Clock, *, kind: SpanKind = SpanKind.INTERNAL) -> None:
        self._clock = clock
        self._kind = kind
        # A no-op API provider has none of these: ids are still made, nothing is emitted.
        self._processor = getattr(tracer_provider, "_active_span_processor", None)
        self._ids = getattr(tracer_provider, "id_generator", None) or RandomIdGenerator()
        self._sampler = getattr(tracer_provider, "sampler", None)
        self._resource = getattr(tracer_provider, "resource", None) or Resource.get_empty()
        self._kind_field = kind_field(kind)
        # (operation, model) -> (span name, the GenAI attributes it starts with): read-only.
        self._named: dict[tuple[str, str], tuple[str, dict]] = {}
        # `_direct_processors`' answer, for the processor tuple it was computed from.
        self._seen_processors: object = None
        self._direct: tuple | None = None

    def start_server_span(self, *, operation: str, model: str, parent: TraceParent | None,
                          start_perf_ns: int, attributes: dict) -> ServerSpan:
        """`tracer.core.span_builder.ServerSpanStarter`: the span `{operation} {model}`,
        under the active OTel span if any, else under `parent` (`continued_parent`)."""
        named = self._named.get((operation, model))
        if named is None:   # a closed set: operations x served models (and `other`)
            if len(self._named) >= 256:
                self._named.clear()
            named = self._named[operation, model] = (request_span_name(operation, model),
                                                     request_attributes(operation, model))
        name = named[0]
        # The GenAI attributes last: a caller's attribute never renames the model.
        attributes = {**attributes, **named[1]}
        continued = continued_parent(parent)
        if continued is None:
            trace_id, own_trace_id = self._ids.generate_trace_id(), None
        else:
            own_trace_id = continued.trace_id
            trace_id = int(own_trace_id, 16)
        sampled = self._should_sample(continued, trace_id, name, attributes)
        span_id = self._ids.generate_span_id()
        own = TraceParent(own_trace_id or f"{trace_id:032x}", f"{span_id:016x}",
                          _FLAG_SAMPLED if sampled else _FLAG_NOT_SAMPLED)
        return new_server_span(name, own, start_perf_ns, trace_id, span_id, continued, sampled,
                               attributes)

    def _should_sample(self, parent: TraceParent | None, trace_id: int, name: str,
                       attributes: dict, *, local_parent: bool = False) -> bool:
        """The provider's sampler's decision under `parent`: a remote span's context (the
        header's, or the active span's, as `ServerSpan.parent` has it) unless
        `local_parent` (one of this process's own spans)."""
        if self._processor is None:
            return False
        sampler = self._sampler
        if sampler is None or sampler is ALWAYS_ON:
            return True
        if sampler is DEFAULT_ON:
            # The SDK's default, ParentBased(ALWAYS_ON), answered without its call (a context,
            # a span wrapper and a SamplingResult per request): a parent's flag, else sampled.
            # (A TraceParent is valid by construction: `parse_traceparent`, `current_parent`.)
            return parent is None or parent.sampled
        parent_ctx = None
        if parent is not None:
            span_ctx = span_context(parent, remote=not local_parent)
            parent_ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(span_ctx),
                                                       otel_context.Context())
        result = self._sampler.should_sample(parent_ctx, trace_id, name, self._kind, attributes)
        return result.decision.is_sampled()

    def publish(self, record: RequestRecord) -> None:
        """The record's spans, when `start_server_span` began it (`record.span_handle`).
        The handle is dropped once they are out: a record lives on in the trace store's ring,
        and its handle's three objects would be there too, for the garbage collector to walk
        at every full collection."""
        handle = record.span_handle
        if isinstance(handle, ServerSpan):
            try:
                self.finish(handle, record)
            finally:
                record.span_handle = None

    def finish(self, server_span: ServerSpan, record: RequestRecord) -> None:
        """Emits the server span and one `llm.<stage>` child per recorded stage."""
        if not server_span.sampled or self._processor is None:
            return
        if not getattr(self._processor, "_span_processors", True):
            return  # no processor registered (no exporter, no store hook): skip the build
        direct = self._direct_processors()
        prefill_events, server_events = self._split_events(record)
        # Encoded spans are collected and handed over together, once a request.
        encoded = None if direct is None else []
        if encoded is not None:
            encode_stage_spans(record, server_span.trace_id_int, server_span.span_id_int,
                               prefill_events, self._clock.offset_ns, self._ids.generate_span_id,
                               self._resource, SCOPE, encoded.append)
        else:
            server = server_span.context   # the children's parent, made once a request
            for stage in record.stages:
                events = prefill_events if stage.stage == "prefill" else ()
                self._emit_stage(server, stage, record, events)
        upstream_span_id = record.attrs.get(UPSTREAM_SPAN_ID)
        if upstream_span_id:
            self._emit_upstream(server_span, record, upstream_span_id, encoded)
        self._emit_server(server_span, record, server_events, encoded)
        if encoded is not None:
            for hand_over in direct:
                hand_over(encoded)

    def _direct_processors(self) -> tuple | None:
        """When each of the provider's processors takes spans already encoded (the encoding
        batch processor on its fast path: `on_end_encoded`), what hands a request's spans to
        each (`_hand_over`); else None (a `ReadableSpan` per span, through `on_end`).
        Recomputed when the provider's processors change."""
        processors = getattr(self._processor, "_span_processors", None)
        if processors is not self._seen_processors:
            self._seen_processors = processors
            self._direct = (tuple(_hand_over(p) for p in processors) if processors and all(
                getattr(p, "fast_path", False) is True and hasattr(p, "on_end_encoded")
                for p in processors) else None)
        return self._direct

    def _emit_encoded(self, encoded: list, data: bytes) -> None:
        encoded.append(encoded_span(self._resource, SCOPE, data))

    def _emit_upstream(self, server_span: ServerSpan, record: RequestRecord,
                       span_id: str, encoded: list | None = None) -> None:
        """The proxy's call to its upstream: a CLIENT span `POST` (the HTTP client span
        name) whose id is the parent the upstream was sent, from the connect to the end."""
        start_ns = next((s.start_ns for s in record.stages if s.stage == "upstream_connect"),
                        record.start_ns)
        if encoded is not None:
            to_epoch = self._clock.to_epoch_ns
            self._emit_encoded(encoded, encode_span_fields(
                server_span.trace_id_int, int(span_id, 16), None, server_span.span_id_int,
                False, "POST", _CLIENT, to_epoch(start_ns), to_epoch(max(record.end_ns, start_ns)),
                _UPSTREAM_ATTRIBUTES, status=_UNSET))
            return
        ctx = SpanContext(server_span.trace_id_int, int(span_id, 16), is_remote=False,
                          trace_flags=_SAMPLED)
        self._end_span("POST", ctx, server_span.context, start_ns, record.end_ns,
                       dict(_UPSTREAM_ATTRIBUTES), SpanKind.CLIENT, _UNSET)

    def _split_events(self, record: RequestRecord) -> tuple[list[Event], list[Event]]:
        # Chunk events belong on the prefill span; anything else (preemption, …) on ours.
        prefill, other = [], []
        to_epoch = self._clock.to_epoch_ns
        has_prefill = any(s.stage == "prefill" for s in record.stages)
        for name, t_ns, attrs in record.events:
            event = Event(name, clean_attributes(attrs, ""), to_epoch(t_ns))
            (prefill if has_prefill and name.startswith("prefill") else other).append(event)
        return prefill, other

    def _emit_stage(self, server: SpanContext, stage, record: RequestRecord,
                    events: list[Event]) -> None:
        attrs = clean_attributes(stage.attrs, "llm.")
        attrs["llm.stage"] = stage.stage
        if stage.stage == "prefill":
            prefill_attributes(attrs, record, events, stage.duration_ns)
        to_epoch = self._clock.to_epoch_ns
        ctx = SpanContext(server.trace_id, self._ids.generate_span_id(),
                          is_remote=False, trace_flags=_SAMPLED)
        self._processor.on_end(ReadableSpan(
            name=f"llm.{stage.stage}", context=ctx, parent=server,
            resource=self._resource, attributes=attrs, events=tuple(events),
            kind=SpanKind.INTERNAL, status=_UNSET, instrumentation_scope=SCOPE,
            start_time=to_epoch(stage.start_ns), end_time=to_epoch(stage.end_ns),
        ))

    def _emit_server(self, server_span: ServerSpan, record: RequestRecord,
                     events: list[Event], encoded: list | None = None) -> None:
        attrs = clean_attributes(server_span.attributes, "")
        attrs.update(clean_attributes(record.attrs, ""))
        attrs.update(genai_attributes(record))
        status = _UNSET
        error_type = error_type_of(record)
        if error_type is not None:
            attrs["error.type"] = error_type
            status = Status(StatusCode.ERROR, error_type)
        start_ns = min(server_span.start_ns, record.start_ns)
        end_ns = max(record.end_ns, record.stages[-1].end_ns if record.stages else record.end_ns)
        to_epoch = self._clock.to_epoch_ns
        if encoded is not None:
            # A continued parent is remote (`ServerSpan.parent`).
            parent_span_id = server_span.parent_span_id_int
            self._emit_encoded(encoded, encode_span_fields(
                server_span.trace_id_int, server_span.span_id_int, None, parent_span_id,
                parent_span_id is not None, server_span.name, self._kind_field,
                to_epoch(start_ns), to_epoch(end_ns), attrs, 0, events, status=status))
            return
        self._processor.on_end(ReadableSpan(
            name=server_span.name, context=server_span.context, parent=server_span.parent,
            resource=self._resource, attributes=attrs, events=tuple(events),
            kind=self._kind, status=status, instrumentation_scope=SCOPE,
            start_time=to_epoch(start_ns), end_time=to_epoch(end_ns),
        ))


    @property
    def exporting(self) -> bool:
        """Whether a span emitted now reaches a processor (callers skip building otherwise)."""
        return self._processor is not None and bool(
            getattr(self._processor, "_span_processors", True))

    def emit_client_spans(self, *, trace_id: str, server_span_id: str,
                          client_traceparent: str | None, start_ns: int, end_ns: int,
                          stages: Sequence[tuple[str, int, int]], attributes: dict,
                          stage_attributes: dict, error: str | None = None,
                          epoch: bool = False) -> None:
        """A browser's view of one request, in the server's trace: a CLIENT span `client`
        over [start_ns, end_ns] and one child per (name, start, end), named as given
        (`client.request`, …).

        Times are perf_counter ns on this server's axis (the caller aligned the browser's
        clock), or with `epoch` Unix ns (a beacon joined from the in-band timing of another
        process: its receive start is on that server's wall clock). When the server continued the browser's trace, `client_traceparent` names a
        span nobody exported (the parent of the HTTP server span): the `client` span takes
        exactly that id, so the trace becomes one tree, browser → server → stages. Otherwise
        it becomes a child of the server span `server_span_id`, still in the server's trace.
        """
        if not self.exporting:
            return
        trace_int = int(trace_id, 16)
        browser = w3c.parse_traceparent(client_traceparent)
        continued = browser is not None and browser.trace_id == trace_id
        if continued:
            span_id, parent = int(browser.span_id, 16), None
            sampler_parent = TraceParent(trace_id, browser.span_id, browser.flags & 0x01)
        else:
            span_id = self._ids.generate_span_id()
            parent = SpanContext(trace_int, int(server_span_id, 16), is_remote=False,
                                 trace_flags=_SAMPLED)
            sampler_parent = TraceParent(trace_id, server_span_id, _FLAG_SAMPLED)
        if not self._should_sample(sampler_parent, trace_int, "client", {},
                                   local_parent=not continued):
            return
        ctx = SpanContext(trace_int, span_id, is_remote=False, trace_flags=_SAMPLED)
        for name, stage_start_ns, stage_end_ns in stages:
            child = SpanContext(trace_int, self._ids.generate_span_id(), is_remote=False,
                                trace_flags=_SAMPLED)
            self._end_span(name, child, ctx, stage_start_ns, stage_end_ns,
                           {"llm.stage": name, **stage_attributes}, SpanKind.INTERNAL, _UNSET,
                           epoch)
        status = _UNSET if error is None else Status(StatusCode.ERROR, error)
        self._end_span("client", ctx, parent, start_ns, end_ns, attributes, SpanKind.CLIENT,
                       status, epoch)

    def _end_span(self, name: str, ctx: SpanContext, parent: SpanContext | None,
                  start_ns: int, end_ns: int, attrs: dict, kind: SpanKind,
                  status: Status, epoch: bool = False) -> None:
        to_epoch = _same if epoch else self._clock.to_epoch_ns
        self._processor.on_end(ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self._resource, attributes=attrs,
            kind=kind, status=status, instrumentation_scope=SCOPE,
            start_time=to_epoch(start_ns), end_time=to_epoch(max(end_ns, start_ns))))


def _same(t_ns: int) -> int:
    return t_ns
