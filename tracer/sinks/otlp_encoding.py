"""OTLP trace protobuf, written straight to bytes: the SDK encoder's output, 4-5x cheaper.

The SDK's `encode_spans` builds a protobuf object per span, attribute and value (about
20 us per span of ours); `BatchSpanProcessor` runs it on its own thread, and that Python
work is what the event loop waited on for the GIL (`bench/proxy_overhead.py`: p99 TTFT at
32 streams). This writes the same messages (field numbers from opentelemetry-proto's
`trace.proto`, `common.proto`, `resource.proto`; checked by parsing against the official
classes in tests/tracer/test_otlp_export.py) with no intermediate objects. Resource
and scope headers are encoded once per object and cached.

Attribute values are written by tracer/sinks/otlp_attributes.py, which drops (and counts in
`EXPORT_DROPS`, tracer/sinks/export_drops.py) what the SDK's encoder would refuse.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

# Re-exported: tracer/sinks/otlp_export.py and tracer/web/observability.py import the drop
# counts from here.
from tracer.sinks.otlp_attributes import _MAX_CACHED_KEYS, _attributes, _field, _varint

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
# Span.flags (trace.proto SpanFlags): the parent's is_remote is known (0x100) / true (0x200).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_MAX_CACHED_HEADERS = 64
# Span names repeat (`llm.<stage>`, `chat <model>`): their encoded Span.name fields are cached.
_NAMES: dict[str, bytes] = {}


def _trace_state(trace_state) -> str:
    return ",".join(f"{k}={v}" for k, v in trace_state.items()) if trace_state else ""


def encode_span(span: ReadableSpan) -> bytes:
    """One `Span` message (trace.proto), without its field tag."""
    ctx = span.context
    parent = span.parent
    return encode_span_fields(
        ctx.trace_id, ctx.span_id, ctx.trace_state,
        None if parent is None else parent.span_id, parent is not None and parent.is_remote,
        span.name, _KIND[span.kind], span.start_time, span.end_time, span.attributes,
        span.dropped_attributes, span.events, span.dropped_events, span.links,
        span.dropped_links, span.status)


def encode_span_fields(trace_id: int, span_id: int, trace_state, parent_span_id: int | None,
                       parent_is_remote: bool, name: str, kind_field: bytes,
                       start_time: int | None, end_time: int | None, attributes,
                       dropped_attributes: int = 0, events=(), dropped_events: int = 0,
                       links=(), dropped_links: int = 0, status=None) -> bytes:
    """`encode_span` from the span's parts, for a caller that has them without a
    `ReadableSpan` (tracer/sinks/spans.py builds a request's spans straight from its
    record): the same bytes. `kind_field` is `kind_field(span.kind)`."""
    global _last_trace_id
    cached = _last_trace_id   # one read: another thread may replace it meanwhile
    if trace_id != cached[0]:   # a request's spans come in a row: one conversion
        cached = _last_trace_id = (trace_id, b"\x0a\x10" + trace_id.to_bytes(16, "big"))
    out = [cached[1], b"\x12\x08", span_id.to_bytes(8, "big")]
    if trace_state:
        out.append(_field(b"\x1a", _trace_state(trace_state).encode("utf-8")))
    if parent_span_id is not None:
        out += (b"\x22\x08", parent_span_id.to_bytes(8, "big"))
    if name:
        out.append(name_field(name))
    out.append(kind_field)
    if start_time:   # proto3 leaves a zero scalar out, as the SDK's bytes do
        out += (b"\x39", _FIXED64(start_time))
    if end_time:
        out += (b"\x41", _FIXED64(end_time))
    if attributes:
        out.append(_attributes(b"\x4a", attributes))
        if dropped_attributes:
            out += (b"\x50", _varint(dropped_attributes))
    if events:
        for event in events:
            body = (b"\x09" + _FIXED64(event.timestamp) if event.timestamp else b"") + (
                _field(b"\x12", event.name.encode("utf-8")) if event.name else b"")
            body += _attributes(b"\x1a", event.attributes)
            if event.dropped_attributes:
                body += b"\x20" + _varint(event.dropped_attributes)
            out.append(_field(b"\x5a", body))
        if dropped_events:
            out += (b"\x60", _varint(dropped_events))
    if links:
        for link in links:
            lctx = link.context
            body = (b"\x0a\x10" + lctx.trace_id.to_bytes(16, "big") + b"\x12\x08"
                    + lctx.span_id.to_bytes(8, "big") + _attributes(b"\x22", link.attributes))
            if link.dropped_attributes:
                body += b"\x28" + _varint(link.dropped_attributes)
            out.append(_field(b"\x6a", body + (_FLAGS_REMOTE_35 if lctx.is_remote
                                                else _FLAGS_LOCAL_35)))
        if dropped_links:
            out += (b"\x70", _varint(dropped_links))
    if status is not None:   # present even when UNSET, as the SDK encodes it
        global _last_status
        cached_status = _last_status   # a request's spans share one Status object
        if status is not cached_status[0]:
            # Held by the cache, so the identity stays its own; a Status is immutable.
            cached_status = _last_status = (status, _status_field(status))
        out.append(cached_status[1])
    out.append(_FLAGS_REMOTE if parent_is_remote else _FLAGS_LOCAL)
    return b"".join(out)


class ChildSpanFrame:
    """`encode_span_fields` for the local children of one local parent span that carry no
    trace state, events, links or drop counts, share a kind and a status, and start and end
    after the epoch (a request's stage spans): what they share is encoded once, here, and
    each child is one join. The same bytes as `encode_span_fields`
    (tests/tracer/test_otlp_child_spans.py compares them).

    >>> from opentelemetry.trace.status import Status
    >>> frame = ChildSpanFrame(7, 3, kind_field(SpanKind.INTERNAL), Status())
    >>> frame.encode(5, name_field("llm.queue"), 10, 20, attribute_fields({"k": 1})) == (
    ...     encode_span_fields(7, 5, None, 3, False, "llm.queue", kind_field(SpanKind.INTERNAL),
    ...                        10, 20, {"k": 1}, status=Status()))
    True
    """

    __slots__ = ("_head", "_parent_kind", "_tail")

    def __init__(self, trace_id: int, parent_span_id: int, kind: bytes, status) -> None:
        self._head = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08"
        self._parent_kind = (b"\x22\x08" + parent_span_id.to_bytes(8, "big"), kind)
        self._tail = _status_field(status) + _FLAGS_LOCAL

    def encode(self, span_id: int, name: bytes, start_time: int, end_time: int,
               attributes: bytes) -> bytes:
        """One child; `name` from `name_field`, `attributes` from `attribute_fields`. Times
        must be > 0 (proto3 would leave a zero out: `encode_span_fields` does)."""
        parent, kind = self._parent_kind
        return b"".join((self._head, span_id.to_bytes(8, "big"), parent, name, kind,
                         b"\x39", _FIXED64(start_time), b"\x41", _FIXED64(end_time),
                         attributes, self._tail))


def attribute_fields(attributes) -> bytes:
    """A span's `attributes` fields (`Span.attributes`, field 9) for `ChildSpanFrame.encode`:
    what `encode_span_fields` writes for them. Two such byte strings joined are the fields
    of the two mappings merged, the second's keys after the first's (when no key repeats)."""
    return _attributes(b"\x4a", attributes)


def name_field(name: str) -> bytes:
    """A span's encoded `name` field (`Span.name`, field 5), for `ChildSpanFrame.encode`;
    cached (span names repeat: `llm.<stage>`, `chat <model>`). An empty name is proto3's
    default, left out, as `encode_span_fields` leaves it."""
    encoded = _NAMES.get(name)
    if encoded is None:
        if len(_NAMES) >= _MAX_CACHED_KEYS:
            _NAMES.clear()
        encoded = _NAMES[name] = _field(b"\x2a", name.encode("utf-8")) if name else b""
    return encoded


def _status_field(status) -> bytes:
    if status.description:
        return _field(b"\x7a", _field(b"\x12", status.description.encode("utf-8"))
                      + _STATUS_CODE[status.status_code])
    return _EMPTY_STATUS[status.status_code]


def kind_field(kind: SpanKind) -> bytes:
    """The encoded `Span.kind` field of `kind`, for `encode_span_fields`."""
    return _KIND[kind]


_last_trace_id: tuple[int | None, bytes] = (None, b"")
_last_status: tuple[object, bytes] = (None, b"")
_KIND = {kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind}
_STATUS_CODE = {code: (b"\x18" + _varint(code.value) if code.value else b"") for code in StatusCode}
_EMPTY_STATUS = {code: _field(b"\x7a", _STATUS_CODE[code]) for code in StatusCode}
# Span.flags (field 16, fixed32) and Link.flags (field 6, fixed32).
_FLAGS_LOCAL = b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE)
_FLAGS_LOCAL_35 = b"\x35" + _FIXED32(_HAS_IS_REMOTE)
_FLAGS_REMOTE_35 = b"\x35" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE)


@dataclass(slots=True, frozen=True)
class EncodedSpan:
    """A finished span already in OTLP bytes, with what a request groups it by."""

    resource: object
    instrumentation_scope: object
    data: bytes

    @classmethod
    def of(cls, span: ReadableSpan) -> EncodedSpan:
        return cls(span.resource, span.instrumentation_scope, encode_span(span))


_SET_RESOURCE, _SET_SCOPE, _SET_DATA = (EncodedSpan.resource.__set__,
                                        EncodedSpan.instrumentation_scope.__set__,
                                        EncodedSpan.data.__set__)


def encoded_span(resource, instrumentation_scope, data: bytes) -> EncodedSpan:
    """`EncodedSpan(resource, instrumentation_scope, data)` without the frozen dataclass'
    `__init__` (ten a request, on the tracer's worker).

    >>> encoded_span(None, None, b"x") == EncodedSpan(None, None, b"x")
    True
    """
    span = object.__new__(EncodedSpan)
    _SET_RESOURCE(span, resource)
    _SET_SCOPE(span, instrumentation_scope)
    _SET_DATA(span, data)
    return span


class TraceRequestEncoder:
    """`ExportTraceServiceRequest` bytes for a batch of finished spans, grouped by resource
    and instrumentation scope as the SDK groups them.

    >>> TraceRequestEncoder().encode([])
    b''
    """

    def __init__(self) -> None:
        self._resource_header: dict = {}   # id(Resource) -> (Resource, encoded `resource` field)
        self._scope_header: dict = {}      # InstrumentationScope | None -> encoded `scope` field

    def encode(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> bytes:
        # Grouped by identity: `Resource.__hash__` serialises the resource to JSON each time.
        groups: dict = {}
        for span in spans:
            resource = span.resource
            _, scopes = groups.setdefault(id(resource), (resource, {}))
            data = span.data if type(span) is EncodedSpan else encode_span(span)
            scopes.setdefault(span.instrumentation_scope or None, []).append(_field(b"\x12", data))
        out = []
        for resource, scopes in groups.values():
            body = [self._resource(resource)]
            for scope, encoded in scopes.items():
                scope_body = self._scope(scope) + b"".join(encoded)
                if scope is not None and scope.schema_url:
                    scope_body += _field(b"\x1a", scope.schema_url.encode("utf-8"))
                body.append(_field(b"\x12", scope_body))
            if resource.schema_url:
                body.append(_field(b"\x1a", resource.schema_url.encode("utf-8")))
            out.append(_field(b"\x0a", b"".join(body)))
        return b"".join(out)

    def _resource(self, resource) -> bytes:
        # Keyed by identity (cheap); the value keeps the resource alive, so its id stays its own.
        cached = self._resource_header.get(id(resource))
        if cached is None:
            cached = (resource, _field(b"\x0a", _attributes(b"\x0a", resource.attributes)))
            _remember(self._resource_header, id(resource), cached)
        return cached[1]

    def _scope(self, scope) -> bytes:
        header = self._scope_header.get(scope)
        if header is None:
            body = b""
            if scope is not None:
                body = ((_field(b"\x0a", scope.name.encode("utf-8")) if scope.name else b"")
                        + (_field(b"\x12", scope.version.encode("utf-8")) if scope.version else b"")
                        + _attributes(b"\x1a", scope.attributes))
            header = _field(b"\x0a", body)
            _remember(self._scope_header, scope, header)
        return header


def _remember(cache: dict, key, value: bytes) -> None:
    if len(cache) >= _MAX_CACHED_HEADERS:   # a process has a handful; never grow without bound
        cache.clear()
    cache[key] = value
