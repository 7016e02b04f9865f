"""W3C traceparent parsing/formatting and the Server-Timing carrier."""
from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracer.record.traceparent import (TraceParent, format_traceparent, new_span_id, new_trace_id,
                                parse_server_timing, parse_traceparent, server_timing_value)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"


def test_parses_the_spec_example():
    tp = parse_traceparent(VALID)
    assert tp == TraceParent(TRACE_ID, SPAN_ID, 1)
    assert tp.sampled and str(tp) == VALID


def test_unsampled_flags_and_surrounding_whitespace():
    tp = parse_traceparent(f"  00-{TRACE_ID}-{SPAN_ID}-00\t")
    assert tp is not None and not tp.sampled
    assert parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-03").flags == 3


@pytest.mark.parametrize("header", [
    None, "", "garbage", 42,
    VALID[:-1],                                        # too short
    VALID + "-",                                       # version 00 has exactly 4 fields
    VALID + "0",
    f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",             # uppercase hex
    f"00-{TRACE_ID}-{SPAN_ID.upper()}-01",
    f"00-{'0' * 32}-{SPAN_ID}-01",                     # all-zero trace id
    f"00-{TRACE_ID}-{'0' * 16}-01",                    # all-zero parent id
    f"ff-{TRACE_ID}-{SPAN_ID}-01",                     # forbidden version
    f"0g-{TRACE_ID}-{SPAN_ID}-01",
    f"00_{TRACE_ID}-{SPAN_ID}-01",                     # wrong separators
    f"00-{TRACE_ID}_{SPAN_ID}-01",
    f"00-{TRACE_ID}-{SPAN_ID}_01",
    f"00-{TRACE_ID[:-1]}z-{SPAN_ID}-01",               # non-hex
    f"00-{TRACE_ID}-{SPAN_ID}-0x",
    f"01-{TRACE_ID}-{SPAN_ID}-01x",                    # future version: extra must follow '-'
])
def test_invalid_headers_are_rejected(header):
    assert parse_traceparent(header) is None


def test_future_version_with_extra_fields_is_read_as_version_00():
    tp = parse_traceparent(f"cc-{TRACE_ID}-{SPAN_ID}-01-what-the-future-brings")
    assert tp == TraceParent(TRACE_ID, SPAN_ID, 1)
    assert str(tp) == VALID


def test_new_ids_are_lowercase_hex_of_the_right_length_and_distinct():
    trace_ids = {new_trace_id() for _ in range(200)}
    span_ids = {new_span_id() for _ in range(200)}
    assert len(trace_ids) == 200 and len(span_ids) == 200
    assert all(len(t) == 32 and int(t, 16) and t == t.lower() for t in trace_ids)
    assert all(len(s) == 16 and int(s, 16) and s == s.lower() for s in span_ids)


class _ZeroFirst(random.Random):
    """Returns 0 once, then 1: ids must skip the invalid all-zero value."""

    def __init__(self):
        super().__init__(0)
        self.calls = 0

    def getrandbits(self, k):
        self.calls += 1
        return 0 if self.calls == 1 else 1


def test_ids_are_never_zero_and_the_rng_is_injectable():
    assert new_trace_id(_ZeroFirst()) == "0" * 31 + "1"
    assert new_span_id(_ZeroFirst()) == "0" * 15 + "1"
    assert new_trace_id(random.Random(7)) == new_trace_id(random.Random(7))


def test_format_round_trips_and_rejects_bad_ids():
    assert format_traceparent(TRACE_ID, SPAN_ID) == VALID
    assert format_traceparent(TRACE_ID, SPAN_ID, sampled=False).endswith("-00")
    for trace_id, span_id in [("0" * 32, SPAN_ID), (TRACE_ID, "0" * 16),
                              (TRACE_ID[:-1], SPAN_ID), (TRACE_ID, SPAN_ID.upper())]:
        with pytest.raises(ValueError):
            format_traceparent(trace_id, span_id)


@given(trace_bits=st.integers(1, 2**128 - 1), span_bits=st.integers(1, 2**64 - 1),
       sampled=st.booleans())
def test_property_format_then_parse_is_identity(trace_bits, span_bits, sampled):
    trace_id, span_id = f"{trace_bits:032x}", f"{span_bits:016x}"
    header = format_traceparent(trace_id, span_id, sampled)
    assert parse_traceparent(header) == TraceParent(trace_id, span_id, int(sampled))
    assert parse_server_timing(server_timing_value(header)) == header


def test_server_timing_value_is_an_unquoted_token():
    assert server_timing_value(VALID) == f"trace;desc={VALID}"


@pytest.mark.parametrize("header", [
    f"trace;desc={VALID}",
    f'trace;desc="{VALID}"',
    f'cache;desc="hit, warm";dur=2.5, trace;desc={VALID}, db;dur=53',
    f"db;dur=53,trace ; desc = {VALID}",
    f"TRACE;DESC={VALID}",
    f"trace;desc={VALID};desc=00-{'1' * 32}-{'2' * 16}-01",   # first desc wins
])
def test_parse_server_timing_finds_the_trace_metric(header):
    assert parse_server_timing(header) == VALID


@pytest.mark.parametrize("header", [
    None, "", "cache;dur=1", "trace", "trace;dur=3",
    f"trace;desc=00-{'0' * 32}-{SPAN_ID}-01",
    f'trace;desc="{VALID}',                         # unterminated quote
    f"tracex;desc={VALID}",
    f'"bad, trace;desc={VALID}',
])
def test_parse_server_timing_returns_none_without_a_valid_trace(header):
    assert parse_server_timing(header) is None
