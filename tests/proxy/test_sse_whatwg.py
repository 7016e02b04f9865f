"""The proxy's SSE reader (`tracer/proxy/sse.py`, shared by every stream format through
`FormatScanner`) against an independent reference parser written from the spec: WHATWG HTML
Living Standard, "Server-sent events", section 9.2.6 "Interpreting an event stream"
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
Over random streams (every field, comments, CR / LF / CRLF line ends, byte order marks,
invalid UTF-8) cut into random reads, both must dispatch the same events with the same
data. The scanner's one documented departure, skipping an event over its byte bound, is out
of reach of these small streams."""
from __future__ import annotations

import os
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.proxy.formats import FormatScanner
from tracer.proxy.sse import SSEScanner, _data_of

BOM = "\ufeff"
EXAMPLES = int(os.environ.get("SSE_DIFF_EXAMPLES", 400))


def whatwg_events(stream: bytes) -> list[tuple[str, str]]:
    """(event type, data) of each event a conforming EventSource dispatches for `stream`."""
    # "Streams must be decoded using the UTF-8 decode algorithm": invalid bytes become
    # U+FFFD, and "one leading U+FEFF BYTE ORDER MARK character must be ignored".
    text = stream.decode("utf-8", "replace")
    if text.startswith(BOM):
        text = text[1:]
    # "Lines must be separated by either a U+000D CARRIAGE RETURN U+000A LINE FEED (CRLF)
    # character pair, a single U+000A LINE FEED (LF) character, or a single U+000D CARRIAGE
    # RETURN (CR) character." What follows the last line end is an incomplete line.
    lines = re.split("\r\n|\r|\n", text)[:-1]
    events, data, event_type = [], "", ""
    for line in lines:
        if line == "":   # "If the line is empty (a blank line): Dispatch the event"
            if data:     # "If the data buffer is an empty string, ... return."
                events.append((event_type or "message", data[:-1] if data.endswith("\n")
                               else data))
            data = event_type = ""
            continue
        if line.startswith(":"):   # "If the line starts with a U+003A COLON character"
            continue
        if ":" in line:   # the field name before the first colon, the value after it
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value   # one leading space
        else:             # "using the whole line as the field name, and the empty string"
            field, value = line, ""
        if field == "event":
            event_type = value
        elif field == "data":
            data += value + "\n"
        # `id` and `retry` change no event's data; any other field is ignored.
    # "Once the end of the file is reached, any pending data must be discarded."
    return events


class _Recorder(SSEScanner):
    """The scanner, recording the data of each event it reads."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def _event(self, event: bytes) -> int:
        data = _data_of(event)
        if data is not None:
            self.seen.append(data.decode("utf-8", "replace"))
        return super()._event(event)


_VALUES = st.one_of(
    st.sampled_from([b"", b" ", b"  x", b"{}", b"[DONE]", b'{"choices":[]}', b": x", b":",
                     b"\xef\xbb\xbf", b"\xff\xfe", b"\xe2\x82", b"\xf0\x9f\x98\x80", b"\x00"]),
    st.text(max_size=8).map(lambda s: s.replace("\r", "").replace("\n", "").encode()),
    st.binary(max_size=6).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")))
_NAMES = st.sampled_from([b"data", b"data", b"data", b"event", b"id", b"retry", b"Data",
                          b"data ", b"x", b""])
_LINES = st.one_of(
    st.tuples(_NAMES, st.sampled_from([b":", b": ", b""]), _VALUES).map(b"".join),
    st.just(b""), st.just(b""), _VALUES.map(lambda v: b":" + v))
_ENDS = st.sampled_from([b"\n", b"\r", b"\r\n"])


@st.composite
def streams(draw) -> bytes:
    lines = draw(st.lists(st.tuples(_LINES, _ENDS), max_size=24))
    stream = b"".join(line + end for line, end in lines)
    if draw(st.booleans()):   # an unterminated last line, discarded by both
        stream += draw(_VALUES)
    return draw(st.sampled_from([b"", b"", b"\xef\xbb\xbf", b"\xef\xbb\xbf" * 2])) + stream


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=EXAMPLES, deadline=None)
@given(stream=streams(), data=st.data())
def test_the_scanner_dispatches_what_the_spec_dispatches(stream, data):
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    scanner = _Recorder()
    for piece in _cut(stream, cuts):
        scanner.feed(piece)
    assert scanner.seen == [d for _, d in whatwg_events(stream)]


@settings(max_examples=EXAMPLES // 4, deadline=None)
@given(ends=st.lists(_ENDS, min_size=2, max_size=2), bom=st.booleans(), data=st.data())
def test_every_format_reads_an_anthropic_stream_with_any_line_ends(ends, bom, data):
    # A content event, an `event:` line before each, each event's line ends as the upstream
    # chose (one kind per event: a CR line end then a LF blank line would be one CRLF).
    lines = [b"event: content_block_delta",
             b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}',
             b"", b"event: message_stop", b'data: {"type":"message_stop"}', b""]
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(l + e for l, e in zip(lines, ends[:1] * 3 + ends[1:] * 3))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=4))
    scanner = FormatScanner("anthropic")
    counted = sum(scanner.feed(piece) for piece in _cut(stream, cuts))
    assert counted == 1 and scanner.summary.done


def test_the_reference_follows_the_specs_own_examples():
    # The spec's examples in 9.2.6: "data" alone and "data:" are one empty-data event each;
    # the second "data" line of a pair is joined with a LF; a test without a blank line
    # after it is never dispatched.
    assert whatwg_events(b"data\n\ndata\ndata\n\ndata:") == [("message", ""), ("message", "\n")]
    assert whatwg_events(b"data:test\n\ndata: test\n\n") == [("message", "test")] * 2
    assert whatwg_events(b"event: add\r\ndata: 73857293\r\n\r\n: c\rdata: x\r\r") == [
        ("add", "73857293"), ("message", "x")]
