"""Our OTLP encoder against the SDK's, byte for byte, over the whole attribute value range
(issue 13, item 2): ints past int64 on both sides and 2^63..2^64, every float (NaN, ±inf,
-0.0, subnormals), strings with lone surrogates and huge ones, bools, bytes, None, nested
and empty sequences and mappings, keys that are not strings.

The rule checked: for every span, `TraceRequestEncoder` writes exactly
`encode_spans(...).SerializeToString()`; the attributes the SDK's encoder drops (it logs
and skips a key whose value protobuf refuses) are the ones we drop, and each is counted in
`EXPORT_DROPS`.
"""
from __future__ import annotations

import logging

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from tracer.sinks.export_drops import EXPORT_DROPS
from tracer.sinks.otlp_encoding import EncodedSpan, TraceRequestEncoder

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
RESOURCE = Resource({"service.name": "differential"})
SCOPE = InstrumentationScope("differential.scope", "1.0")

edge_ints = st.sampled_from([0, 1, -1, 127, 128, INT64_MAX, INT64_MAX + 1, INT64_MIN,
                             INT64_MIN - 1, (1 << 64) - 1, 1 << 64, -(1 << 64), 10 ** 23,
                             -(10 ** 23), 10 ** 400])
ints = st.one_of(edge_ints, st.integers(), st.integers(INT64_MAX - 5, (1 << 64) + 5),
                 st.integers(INT64_MIN - 5, INT64_MIN + 5))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
                   st.sampled_from([0.0, -0.0, float("nan"), -float("nan"), float("inf"),
                                    -float("inf"), 5e-324, -5e-324, 1e23, 1.7976931348623157e308]))
surrogate_free = st.text(max_size=40)
with_surrogates = st.text(st.characters(codec=None, categories=["Cs", "Ll", "Nd"]), max_size=8)
huge = st.sampled_from([126, 127, 128, 16383, 16384, 1 << 20]).map(lambda n: "é" * n)
texts = st.one_of(surrogate_free, with_surrogates, huge,
                  st.sampled_from(["", "\ud800", "a\udcff", "\ud83d\ude00", "😀"]))
scalars = st.one_of(st.booleans(), ints, floats, texts, st.binary(max_size=20), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(surrogate_free, inner, max_size=3)),
    max_leaves=8)
keys = st.one_of(surrogate_free.filter(bool), with_surrogates.filter(bool),
                 st.integers(0, 9), st.binary(max_size=3),
                 st.sampled_from(["gen_ai.request.max_tokens", "\ud800k", "", 0, 1.5]))
attribute_maps = st.dictionaries(keys, values, max_size=6)


def span(attributes: dict, event_attributes: dict, link_attributes: dict,
         start_ns: int = 1_700_000_000_000_000_000) -> ReadableSpan:
    """A finished span built as `SpanBuilder` builds ours: plain dicts, no SDK cleaning."""
    ctx = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1))
    parent = SpanContext(0x1234, 0x9ABC, is_remote=True, trace_flags=TraceFlags(1))
    link = Link(SpanContext(0x4321, 0x8765, is_remote=True, trace_flags=TraceFlags(1)),
                link_attributes)
    return ReadableSpan(name="chat m", context=ctx, parent=parent, resource=RESOURCE,
                        attributes=attributes, events=(Event("ev", event_attributes, start_ns),),
                        links=(link,), kind=SpanKind.INTERNAL, instrumentation_scope=SCOPE,
                        start_time=start_ns, end_time=start_ns + 1_000)


def kept_count(request: ExportTraceServiceRequest) -> int:
    (rs,) = request.resource_spans
    (ss,) = rs.scope_spans
    (s,) = ss.spans
    return len(s.attributes) + sum(len(e.attributes) for e in s.events) + sum(
        len(link.attributes) for link in s.links)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(attributes=attribute_maps, event_attributes=attribute_maps,
       link_attributes=attribute_maps)
@example(attributes={"gen_ai.request.max_tokens": 10 ** 23, "ok": 1},
         event_attributes={}, link_attributes={})
@example(attributes={"a": 1 << 63, "b": (1 << 64) - 1, "c": -(1 << 63) - 1, "d": INT64_MIN},
         event_attributes={"nan": float("nan"), "inf": -float("inf"), "z": -0.0},
         link_attributes={"s": "\ud800", "t": "x" * 200_000, "e": (), "m": {}})
@example(attributes={"nested": [1, [2, {"k": 1 << 70}]], "kept": [1, [2, {"k": 3}]]},
         event_attributes={5: "int key", "\ud800": "surrogate key"}, link_attributes={})
def test_our_bytes_are_the_sdk_bytes_and_the_sdk_drops_are_ours_counted(
        attributes, event_attributes, link_attributes):
    spans = [span(attributes, event_attributes, link_attributes)]
    logging.disable(logging.ERROR)   # the SDK logs a traceback per attribute it drops
    try:
        sdk_bytes = encode_spans(spans).SerializeToString()
    finally:
        logging.disable(logging.NOTSET)
    given_count = len(attributes) + len(event_attributes) + len(link_attributes)
    sdk_dropped = given_count - kept_count(ExportTraceServiceRequest.FromString(sdk_bytes))

    before, _ = EXPORT_DROPS.snapshot()
    ours = TraceRequestEncoder().encode(spans)
    after, _ = EXPORT_DROPS.snapshot()
    assert ours == sdk_bytes
    assert after - before == sdk_dropped
    # Encoded one by one as spans end (the installed path): the same request.
    assert TraceRequestEncoder().encode([EncodedSpan.of(s) for s in spans]) == sdk_bytes


def test_a_value_outside_int64_costs_its_attribute_not_the_request():
    """The issue's reproduction: before, 1e23 made a varint over 10 bytes and the whole
    request failed to parse; 2^63..2^64 wrapped negative."""
    hostile = span({"gen_ai.request.max_tokens": 10 ** 23, "wraps": 1 << 63, "ok": 7}, {}, {})
    neighbour = span({"gen_ai.request.max_tokens": 64}, {}, {})
    before, _ = EXPORT_DROPS.snapshot()
    request = ExportTraceServiceRequest.FromString(
        TraceRequestEncoder().encode([hostile, neighbour]))
    after, _ = EXPORT_DROPS.snapshot()
    got = [{kv.key: kv.value.int_value for kv in s.attributes}
           for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert got == [{"ok": 7}, {"gen_ai.request.max_tokens": 64}]
    assert after - before == 2


def test_zero_times_are_left_out_as_the_sdk_leaves_them_out():
    spans = [span({}, {}, {}, start_ns=0)]
    assert TraceRequestEncoder().encode(spans) == encode_spans(spans).SerializeToString()
