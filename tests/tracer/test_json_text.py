"""The tracer's JSON writer (tracer/sinks/json_text.py) against the standard library's, over
any document: read back, the values are json's, except NaN and the infinities, which are
null; and what orjson refuses is written by json. The log line and the stored record use it."""
from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.sinks.json_text import json_writer


class Kind(enum.IntEnum):
    A = 1


class Name(str, enum.Enum):
    B = "b"


@dataclasses.dataclass
class Point:
    x: int


_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),          # beyond 64 bits too
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
    st.binary(max_size=8), st.sampled_from([Kind.A, Name.B, Point(3),
                                             datetime.datetime(2026, 12, 6, 5, 0, 1)]))
_KEYS = st.one_of(st.text(max_size=8), st.integers(-5, 5))
_DOCS = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20)


def _canon(value, non_finite):
    """A document read back, comparable: NaN and the infinities as `non_finite` gives them."""
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite(value)
    if isinstance(value, list):
        return [_canon(v, non_finite) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v, non_finite) for k, v in value.items()}
    return value


@settings(max_examples=400, deadline=None)
@given(doc=_DOCS, compact=st.booleans())
def test_read_back_it_is_what_json_wrote(doc, compact):
    """orjson's text where orjson takes the document (NaN and the infinities then null),
    json's own text where it refuses it."""
    separators = (",", ":") if compact else None
    ours = json_writer(default=str, separators=separators)(doc)
    theirs = json.JSONEncoder(default=str, separators=separators).encode(doc)
    try:
        orjson.dumps(doc, default=str, option=orjson.OPT_PASSTHROUGH_DATACLASS
                     | orjson.OPT_PASSTHROUGH_DATETIME)
    except TypeError:
        assert ours == theirs
    else:
        assert _canon(json.loads(ours), repr) == _canon(json.loads(theirs), lambda v: None)


def test_what_orjson_refuses_is_json_text_and_a_refusal_is_still_one():
    write = json_writer(default=str, separators=(",", ":"))
    for doc in ({"s": "\udc80"}, {"n": 2**64}, {1: "a"}):
        assert write(doc) == json.dumps(doc, default=str, separators=(",", ":"))
    strict = json_writer()
    for doc in ({"b": b"x"}, {"p": Point(1)}):
        try:
            strict(doc)
        except TypeError:
            pass
        else:
            raise AssertionError(f"{doc} was written without a default")


def test_the_log_line_and_the_stored_document_are_what_they_were():
    """The two writers' callers: the request log line (structlog's JSON renderer) and the
    store's document read back equal json's."""
    import io

    from tracer.record.clock import Clock
    from tracer.record.request_record import RequestRecord
    from tracer.sinks.logs import configure_logging
    from tracer.store.codec import decode, encode

    buf = io.StringIO()
    configure_logging("json", buf).info("request_finished", ttft_ms=1.5, note="é\x00",
                                        stages={"queue": 0.25})
    line = json.loads(buf.getvalue())
    assert (line["ttft_ms"], line["note"], line["stages"]) == (1.5, "é\x00", {"queue": 0.25})
    clock = Clock(wall_ns=10**18, perf_ns=0)
    record = RequestRecord("r", "1" * 32, "2" * 16, "m", "chat", 5, 9, ttft_ns=3,
                           attrs={"lone": "\udc80x", "nul": "a\x00b", "wide": "日本"})
    back = decode(encode(record, clock), clock)
    assert back.attrs == record.attrs and back.ttft_ns == 3
