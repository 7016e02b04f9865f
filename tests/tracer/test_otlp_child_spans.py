"""`ChildSpanFrame` (tracer/sinks/otlp_encoding.py), the stage spans' encoder, against
`encode_span_fields` (itself checked against the SDK's encoder in test_otlp_export.py): the
same bytes for any ids, names, times and attributes it takes."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from tracer.sinks.otlp_encoding import (ChildSpanFrame, attribute_fields, encode_span_fields,
                                        kind_field, name_field)

ids64 = st.integers(1, 2**64 - 1)
values = st.one_of(st.text(max_size=300), st.integers(-2**63, 2**63 - 1), st.booleans(),
                   st.floats(allow_nan=False), st.lists(st.integers(0, 9), max_size=3).map(tuple))
attributes = st.dictionaries(st.text(min_size=1, max_size=40), values, max_size=6)
statuses = st.sampled_from([Status(), Status(StatusCode.OK),
                            Status(StatusCode.ERROR, "upstream ✗")])


@settings(max_examples=300, deadline=None)
@given(trace_id=st.integers(1, 2**128 - 1), parent=ids64, span_id=ids64,
       name=st.text(min_size=1, max_size=80), start=st.integers(1, 2**64 - 1),
       duration=st.integers(0, 2**40), first=attributes, second=attributes, status=statuses,
       kind=st.sampled_from(list(SpanKind)))
def test_a_child_in_the_frame_is_the_span_encode_span_fields_writes(
        trace_id, parent, span_id, name, start, duration, first, second, status, kind):
    end = min(start + duration, 2**64 - 1)
    second = {k: v for k, v in second.items() if k not in first}   # merged: no key twice
    frame = ChildSpanFrame(trace_id, parent, kind_field(kind), status)
    got = frame.encode(span_id, name_field(name), start, end,
                       attribute_fields(first) + attribute_fields(second))
    assert got == encode_span_fields(trace_id, span_id, None, parent, False, name,
                                     kind_field(kind), start, end, {**first, **second},
                                     status=status)
