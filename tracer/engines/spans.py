"""Received OTLP spans, reduced to what the adapters read.

`spans_of(request)` walks an `ExportTraceServiceRequest` (protobuf, opentelemetry-proto)
and yields one `SpanView` per span: ids as lowercase hex (as `traceparent` writes them),
the name, the start time and the attributes as plain Python values. OTLP/JSON bodies are
parsed into the same message first (`request_from_json`), with the spec's one deviation
from protobuf's JSON mapping handled: trace and span ids are hex strings, not base64
(OTLP specification, "JSON Protobuf Encoding").
"""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracer.engines.otlp_bounds import (
    ExportLimits,
    MalformedOTLP,
    check_json,
    check_json_bytes,
    check_protobuf,
)

_ID_KEYS = ("traceId", "spanId", "parentSpanId")
# Attribute values longer than this are cut: only numbers and short names are read.
_MAX_STRING_CHARS = 256
DEFAULT_LIMITS = ExportLimits()
__all__ = ["DEFAULT_LIMITS", "ExportLimits", "MalformedOTLP", "SpanView", "count_spans",
           "request_from_json", "request_from_protobuf", "spans_of"]


@dataclass(slots=True, frozen=True)
class SpanView:
    """One received span. `parent_span_id` is "" for a root span; `kind` is OTLP's
    `Span.SpanKind` number (2 server, 3 client; 0 when not sent) and `service` its
    resource's `service.name` (who says they sent it: tracer/collect/ reads both).

    >>> SpanView("0" * 31 + "1", "0" * 15 + "2", "", "llm_request", 0, {}).is_root
    True
    """

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_epoch_ns: int
    attributes: dict
    end_epoch_ns: int = 0
    kind: int = 0
    service: str = ""

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id


def request_from_protobuf(data: bytes, limits: ExportLimits = DEFAULT_LIMITS
                          ) -> ExportTraceServiceRequest:
    """The message, once its elements are counted within `limits` (`ExportTooBig` else)."""
    check_protobuf(data, limits)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except Exception as exc:   # DecodeError, or RuntimeWarning-style errors of upb
        raise MalformedOTLP("the body is not a protobuf ExportTraceServiceRequest") from exc
    return request


def request_from_json(data: bytes, limits: ExportLimits = DEFAULT_LIMITS
                      ) -> ExportTraceServiceRequest:
    """OTLP/JSON → the protobuf message (hex ids converted to the bytes protobuf expects),
    counted within `limits` before `ParseDict` builds it.

    >>> body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
    >>> body += b'0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}]}]}]}'
    >>> [s.span_id for s in spans_of(request_from_json(body))]
    ['b7ad6b7169203331']
    """
    check_json_bytes(data, limits)
    try:
        # The hook makes the parse call Python once an object, so a thread switch can
        # happen inside it: one long C call would hold the GIL, and the event loop, for all
        # of it.
        obj = json.loads(data, object_pairs_hook=_object)
    except RecursionError as exc:
        raise MalformedOTLP("the body is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedOTLP("the body is not valid JSON") from exc
    if not isinstance(obj, dict):
        raise MalformedOTLP("the body must be a JSON object")
    check_json(obj, limits)
    try:
        for resource in obj.get("resourceSpans") or ():
            for scope in resource.get("scopeSpans") or ():
                for span in scope.get("spans") or ():
                    _hex_ids_to_base64(span)
                    for link in span.get("links") or ():
                        _hex_ids_to_base64(link)
        request = ExportTraceServiceRequest()
        json_format.ParseDict(obj, request, ignore_unknown_fields=True)
    except (AttributeError, TypeError, ValueError, RecursionError,
            json_format.ParseError) as exc:
        raise MalformedOTLP("the body is not an OTLP/JSON ExportTraceServiceRequest") from exc
    return request


def _object(pairs: list) -> dict:
    return dict(pairs)


def _hex_ids_to_base64(obj: dict) -> None:
    for key in _ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(binascii.unhexlify(value)).decode("ascii")
            except (binascii.Error, ValueError) as exc:
                raise MalformedOTLP(f"{key} is not hex") from exc


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans
               for scope in resource.scope_spans)


def spans_of(request: ExportTraceServiceRequest) -> Iterator[SpanView]:
    for resource in request.resource_spans:
        service = _service_name(resource.resource.attributes)
        for scope in resource.scope_spans:
            for span in scope.spans:
                yield SpanView(span.trace_id.hex(), span.span_id.hex(),
                               span.parent_span_id.hex(), span.name[:_MAX_STRING_CHARS],
                               span.start_time_unix_nano, _attributes(span.attributes),
                               span.end_time_unix_nano, int(span.kind), service)


def _service_name(key_values) -> str:
    for kv in key_values:
        if kv.key == "service.name" and kv.value.WhichOneof("value") == "string_value":
            return kv.value.string_value[:_MAX_STRING_CHARS]
    return ""


def _attributes(key_values) -> dict:
    out = {}
    for kv in key_values:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "double_value":
            out[kv.key] = value.double_value
        elif kind == "int_value":
            out[kv.key] = value.int_value
        elif kind == "string_value":
            out[kv.key] = value.string_value[:_MAX_STRING_CHARS]
        elif kind == "bool_value":
            out[kv.key] = value.bool_value
    return out
