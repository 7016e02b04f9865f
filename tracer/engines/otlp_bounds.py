"""What decoding one OTLP trace export may cost, checked before it is decoded.

The byte limits (as sent, inflated) do not bound a decoded export: 16 MiB of two-byte empty
key-values is 8 million protobuf messages, gigabytes once built. So the export's elements are
counted first, on the wire format itself (protobuf) or on the parsed JSON before it becomes a
message, and an export over any bound below is refused whole, before `ParseFromString` or
`ParseDict` builds anything (docs/reference.md, "OTLP receiver limits"):

- per export: spans, resource and scope groups, attributes (every key-value and array element:
  resource, scope, span, event, link, nested; and any other repeated field), events and links;
- per span: its attributes (its own, its events' and its links'), events and links;
- nesting: `MAX_DEPTH` messages deep (a JSON body: `MAX_DEPTH` containers deep); deeper is
  malformed, as upb's own recursion limit makes a deep protobuf;
- protobuf fields read by the count (what the count itself may cost) and, for JSON, the
  `{`, `[` and `,` bytes of the body (what `json.loads` may build), counted before parsing.

The defaults are the OpenTelemetry SDK's: a batch of 512 spans of at most 128 attributes,
128 events and 128 links is 65,536 attributes; a span may carry 8x the SDK's 128.
"""
from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

MAX_DEPTH = 32
_GROUPS, _SPANS, _ATTRIBUTES, _EVENTS, _LINKS = range(5)
_WHAT = ("resource or scope groups", "spans", "attributes", "events", "links")
_OUTCOME = ("too_many_spans", "too_many_spans", "too_many_attributes", "too_many_attributes",
            "too_many_attributes")


class MalformedOTLP(ValueError):
    """The body is not an OTLP trace export; the message says why (no user data in it)."""

    outcome = "malformed"   # the receiver's `llm_otlp_receiver_requests_total` label


class ExportTooBig(MalformedOTLP):
    """A well-formed export over one of the element bounds."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class ExportLimits:
    max_spans: int = 20_000
    max_groups: int = 4_096
    max_attributes: int = 65_536
    max_events: int = 32_768
    max_links: int = 32_768
    max_span_attributes: int = 1_024
    max_span_events: int = 1_024
    max_span_links: int = 1_024
    max_fields: int = 1_048_576
    max_json_values: int = 262_144

    def per_export(self) -> list[int]:
        return [self.max_groups, self.max_spans, self.max_attributes, self.max_events,
                self.max_links]

    def per_span(self) -> list[int]:
        big = 1 << 62   # no per-span bound on groups or spans
        return [big, big, self.max_span_attributes, self.max_span_events, self.max_span_links]


class _Tally:
    """Element counts of one export, per export and within the current span."""

    __slots__ = ("limits", "total", "total_max", "span", "span_max", "in_span")

    def __init__(self, limits: ExportLimits) -> None:
        self.limits = limits
        self.total, self.total_max = [0] * 5, limits.per_export()
        self.span, self.span_max = [0] * 5, limits.per_span()
        self.in_span = False

    def add(self, category: int) -> None:
        total = self.total
        total[category] += 1
        if total[category] > self.total_max[category]:
            raise ExportTooBig(f"at least {total[category]} {_WHAT[category]} in one export; "
                               f"at most {self.total_max[category]}", _OUTCOME[category])
        if self.in_span:
            span = self.span
            span[category] += 1
            if span[category] > self.span_max[category]:
                raise ExportTooBig(f"a span with at least {span[category]} "
                                   f"{_WHAT[category]}; at most {self.span_max[category]}",
                                   _OUTCOME[category])

    def enter_span(self) -> None:
        self.span = [0] * 5
        self.in_span = True


# --- the schema, as tables: message → {field: (child table | None, category | None)} -------

def _category(message: str, field) -> int | None:
    if message == "opentelemetry.proto.trace.v1.ScopeSpans" and field.name == "spans":
        return _SPANS
    if field.name in ("resource_spans", "scope_spans"):
        return _GROUPS
    if message == "opentelemetry.proto.trace.v1.Span" and field.name in ("events", "links"):
        return _EVENTS if field.name == "events" else _LINKS
    return _ATTRIBUTES if field.is_repeated else None


def _table(descriptor, memo: dict, json: bool) -> dict:
    name = descriptor.full_name
    if name in memo:
        return memo[name]
    table = memo[name] = {}
    for field in descriptor.fields:
        child = field.message_type
        child = _table(child, memo, json) if child is not None else None
        category = _category(name, field)
        if json:
            table[field.name] = table[field.json_name] = (child, category, field.is_repeated)
        else:
            table[field.number] = (child, category)
    return table


_WIRE_TABLES: dict = {}
_WIRE = _table(ExportTraceServiceRequest.DESCRIPTOR, _WIRE_TABLES, json=False)
_KEY_VALUE = _WIRE_TABLES["opentelemetry.proto.common.v1.KeyValue"]
_JSON = _table(ExportTraceServiceRequest.DESCRIPTOR, {}, json=True)


# --- protobuf: the wire format, read without building anything -----------------------------

def check_protobuf(data: bytes, limits: ExportLimits) -> None:
    """Raise `ExportTooBig` (or `MalformedOTLP`) when decoding `data` would pass `limits`.

    >>> from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
    >>> from opentelemetry.proto.common.v1.common_pb2 import KeyValue
    >>> span = Span(attributes=[KeyValue(key="k")] * 3)
    >>> body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
    ...     scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()
    >>> check_protobuf(body, ExportLimits())
    >>> check_protobuf(body, ExportLimits(max_span_attributes=2))
    Traceback (most recent call last):
    ...
    tracer.engines.otlp_bounds.ExportTooBig: a span with at least 3 attributes; at most 2
    """
    budget = [limits.max_fields]
    try:
        _scan(data, 0, len(data), _WIRE, 0, _Tally(limits), budget)
    except IndexError as exc:   # a varint or a fixed field running off the end
        raise MalformedOTLP("the body is not a protobuf ExportTraceServiceRequest") from exc


def _scan(data: bytes, pos: int, end: int, table: dict, depth: int, tally: _Tally,
          budget: list) -> None:
    fields = 0
    while pos < end:
        fields += 1
        if fields & 0xFFF == 0:   # a message of millions of fields is stopped inside it
            budget[0] -= fields
            fields = 0
            if budget[0] < 0:
                raise ExportTooBig(f"more than {tally.limits.max_fields} protobuf fields in "
                                   "one export", "too_many_attributes")
        tag = data[pos]
        pos += 1
        if tag & 0x80:
            tag, pos = _varint(data, pos - 1)
        wire = tag & 7
        if wire == 2:
            length = data[pos]
            pos += 1
            if length & 0x80:
                length, pos = _varint(data, pos - 1)
            if length > end - pos:
                raise MalformedOTLP("a length runs past its message")
            entry = table.get(tag >> 3)
            if entry is not None:
                child, category = entry
                if category is not None:
                    if category == _SPANS:
                        tally.add(category)
                        tally.enter_span()
                    else:
                        tally.add(category)
                if child is not None and not (
                        child is _KEY_VALUE and _scalar_kv(data, pos, pos + length)):
                    if depth >= MAX_DEPTH:
                        raise MalformedOTLP(f"messages nested deeper than {MAX_DEPTH}")
                    budget[0] -= fields
                    fields = 0
                    _scan(data, pos, pos + length, child, depth + 1, tally, budget)
                    if category == _SPANS:
                        tally.in_span = False
            pos += length
        elif wire == 0:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:   # groups (3, 4) are not in this schema; 6 and 7 are no wire type
            raise MalformedOTLP("the body is not a protobuf ExportTraceServiceRequest")
    if pos != end:
        raise MalformedOTLP("a field runs past its message")
    budget[0] -= fields
    if budget[0] < 0:
        raise ExportTooBig(f"more than {tally.limits.max_fields} protobuf fields in one "
                           "export", "too_many_attributes")


# One-byte tags of AnyValue's scalar fields: string, bytes (length-delimited); bool, int
# (varint); double (fixed64).
_LENGTH_TAGS, _VARINT_TAGS = (0x0A, 0x3A), (0x10, 0x18)


def _scalar_kv(data: bytes, pos: int, end: int) -> bool:
    """True for the common key-value, `key` then one scalar `value`, short enough that the
    lengths are one byte each: it holds nothing to count, and the scan need not enter it."""
    if end - pos < 4 or data[pos] != 0x0A or data[pos + 1] & 0x80:
        return False
    pos += 2 + data[pos + 1]
    if pos + 2 > end or data[pos] != 0x12 or data[pos + 1] & 0x80:
        return False
    if pos + 2 + data[pos + 1] != end:
        return False
    pos += 2
    if pos == end:   # an empty value
        return True
    tag = data[pos]
    if tag in _LENGTH_TAGS:
        return pos + 1 < end and not data[pos + 1] & 0x80 and pos + 2 + data[pos + 1] == end
    if tag in _VARINT_TAGS:
        pos += 1
        while pos < end and data[pos] & 0x80:
            pos += 1
        return pos + 1 == end
    return tag == 0x21 and pos + 9 == end


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise MalformedOTLP("a varint longer than 10 bytes")


# --- JSON: the body's bytes, then the parsed object before it becomes a message --------------

def check_json_bytes(data: bytes, limits: ExportLimits) -> None:
    """Refuse a body whose parse alone would build too much: every JSON value past the first
    follows a `,`, `[` or `{`; counted in the strings too, so this is an upper bound."""
    values = data.count(b"{") + data.count(b"[") + data.count(b",")
    if values > limits.max_json_values:
        raise ExportTooBig(f"more than {limits.max_json_values} JSON values in one export",
                           "too_many_attributes")


def check_json(obj: dict, limits: ExportLimits) -> None:
    """`check_protobuf` for a parsed OTLP/JSON body (unknown keys are ignored, as the
    receiver's `ParseDict` ignores them); a value of the wrong JSON type is left to `ParseDict`
    to refuse."""
    _walk(obj, _JSON, 0, _Tally(limits))


def _walk(obj: dict, table: dict, depth: int, tally: _Tally) -> None:
    if depth >= MAX_DEPTH:
        raise MalformedOTLP(f"objects nested deeper than {MAX_DEPTH}")
    for key, value in obj.items():
        entry = table.get(key)
        if entry is None:
            continue
        child, category, repeated = entry
        items = value if repeated and isinstance(value, list) else (value,)
        for item in items:
            if category is not None and repeated:
                tally.add(category)
                if category == _SPANS:
                    tally.enter_span()
            if child is not None and isinstance(item, dict):
                _walk(item, child, depth + 1, tally)
            if category == _SPANS:
                tally.in_span = False
