"""What one OTLP export may cost to decode is bounded before it is decoded (issue 39, breaks 1
and 2): a deep JSON body is malformed (never a RecursionError), and an export over a count of
attributes, events, links, spans or fields is refused before upb or `ParseDict` builds it."""
from __future__ import annotations

import json
import tracemalloc

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tracer.engines.otlp_bounds import ExportLimits, ExportTooBig, MalformedOTLP
from tracer.engines.spans import request_from_json, request_from_protobuf


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _one_span_export(span_body: bytes) -> bytes:
    """request{resource_spans{scope_spans{spans{span_body}}}}, written by hand: what no SDK
    would send."""
    return _field(0x0A, _field(0x12, _field(0x12, span_body)))


def _export(spans: list[Span]) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def test_deep_json_is_malformed_not_a_recursion_error():
    deep = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(MalformedOTLP) as caught:
        request_from_json(deep)
    assert caught.value.outcome == "malformed"
    # Deep but well-typed: nested array values, past Python's recursion limit in ParseDict.
    value = '{"arrayValue": {"values": [' * 2_000 + '{"intValue": "1"}' + "]}}" * 2_000
    body = ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x", "attributes": '
            '[{"key": "k", "value": %s}]}]}]}]}' % value)
    with pytest.raises(MalformedOTLP) as caught:
        request_from_json(body.encode())
    assert caught.value.outcome == "malformed"


def test_deep_protobuf_is_still_malformed():
    value = b"\x18\x01"                                  # AnyValue{int_value: 1}
    for _ in range(200):
        value = _field(0x2A, _field(0x0A, value))         # AnyValue{array_value{values}}
    body = _one_span_export(_field(0x4A, _field(0x0A, b"k") + _field(0x12, value)))
    with pytest.raises(MalformedOTLP) as caught:
        request_from_protobuf(body)
    assert caught.value.outcome == "malformed"


def test_hundreds_of_thousands_of_tiny_attributes_are_refused_before_they_are_built():
    body = _one_span_export(b"\x4a\x00" * 400_000)          # 400,000 empty key-values
    tracemalloc.start()
    try:
        with pytest.raises(ExportTooBig) as caught:
            request_from_protobuf(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.outcome == "too_many_attributes"
    assert peak < 1 << 20       # nothing was built: no message, no attribute


@pytest.mark.parametrize("tag,what,outcome", [
    (0x4A, "attributes", "too_many_attributes"), (0x5A, "events", "too_many_attributes"),
    (0x6A, "links", "too_many_attributes")])
def test_per_span_bounds(tag, what, outcome):
    limits = ExportLimits()
    per_span = {"attributes": limits.max_span_attributes, "events": limits.max_span_events,
                "links": limits.max_span_links}[what]
    assert request_from_protobuf(_one_span_export(bytes([tag, 0]) * per_span))
    with pytest.raises(ExportTooBig) as caught:
        request_from_protobuf(_one_span_export(bytes([tag, 0]) * (per_span + 1)))
    assert caught.value.outcome == outcome and f"{per_span + 1} {what}; at most {per_span}" in str(caught.value)


def test_per_export_bounds():
    limits = ExportLimits(max_attributes=100, max_span_attributes=60)
    spans = [Span(name="x", attributes=[KeyValue(key="k")] * 50) for _ in range(3)]
    with pytest.raises(ExportTooBig, match="101 attributes in one export; at most 100"):
        request_from_protobuf(_export(spans), limits)
    nested = KeyValue(key="k", value=AnyValue(array_value=ArrayValue(values=[AnyValue()] * 200)))
    with pytest.raises(ExportTooBig, match="at most 100"):   # array elements count
        request_from_protobuf(_export([Span(attributes=[nested])]),
                              ExportLimits(max_attributes=100))
    empty_spans = _field(0x0A, _field(0x12, b"\x12\x00" * 21))
    with pytest.raises(ExportTooBig) as caught:
        request_from_protobuf(empty_spans, ExportLimits(max_spans=20))
    assert caught.value.outcome == "too_many_spans"


def test_millions_of_unknown_fields_stop_at_the_field_budget():
    body = _one_span_export(b"\xf8\x07\x00" * 2_000_000)    # field 127, varint 0
    with pytest.raises(ExportTooBig, match="protobuf fields"):
        request_from_protobuf(body)


def test_json_bounds_match_protobuf_ones():
    attrs = [{"key": f"k{i}", "value": {"intValue": "1"}} for i in range(1_025)]
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x", "attributes": attrs}]}]}]}
    with pytest.raises(ExportTooBig, match="a span with at least 1025 attributes"):
        request_from_json(json.dumps(body).encode())
    flood = b'{"resourceSpans": [' + b"{}," * 300_000 + b"{}]}"
    with pytest.raises(ExportTooBig, match="JSON values"):
        request_from_json(flood)


def test_an_ordinary_export_passes_unchanged():
    spans = [Span(trace_id=bytes(16), span_id=(i + 1).to_bytes(8, "big"), name="llm_request",
                  attributes=[KeyValue(key=f"a{j}", value=AnyValue(double_value=j))
                              for j in range(20)]) for i in range(512)]
    body = _export(spans)
    assert request_from_protobuf(body).SerializeToString() == body
