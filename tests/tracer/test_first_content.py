"""One rule for "this SSE event is the first content", checked on the shared recorded streams.

tests/fixtures/sse/ (README.md there) holds the streams; frontend_probe/test/
first_content.test.mjs reads the same files for the browser probe.
"""
from __future__ import annotations

import doctest
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tracer.bench.stream import StreamTimeline
from tracer.proxy import sse as proxy_sse
from tracer.proxy.sse import SSEScanner
from tracer.record import first_content
from tracer.record.first_content import is_content_event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sse"
EXPECTED: dict[str, int | None] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)
_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class Event:
    data: str
    end: int          # byte offset just past the blank line that dispatched the event


def parse_sse(raw: bytes) -> list[Event]:
    """The events with a `data` field, as the SSE spec (EventSource) reads `raw`.

    Lines end at \\r\\n, \\r or \\n; a blank line dispatches the event; `:` lines are
    comments; a field's value loses one leading space; `data` lines are joined by \\n.
    """
    events, data, pos = [], [], 0
    for eol in _EOL.finditer(raw):
        line, pos = raw[pos:eol.start()].decode("utf-8"), eol.end()
        if not line:
            if data:
                events.append(Event("\n".join(data), pos))
            data = []
        elif not line.startswith(":"):
            field, colon, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if colon and value.startswith(" ") else value)
    return events   # an unterminated last event is dropped, like EventSource does


def recorded(name: str) -> tuple[bytes, list[bytes]]:
    """The fixture's bytes and its network chunks (one chunk when no *.chunks.json)."""
    raw = (FIXTURES / name).read_bytes()
    cuts_file = FIXTURES / name.replace(".sse", ".chunks.json")
    cuts = json.loads(cuts_file.read_text()) if cuts_file.exists() else []
    assert cuts == sorted(set(cuts)) and all(0 < c < len(raw) for c in cuts)
    bounds = [0, *cuts, len(raw)]
    return raw, [raw[a:b] for a, b in zip(bounds, bounds[1:])]


def content_flags(events: list[Event]) -> list[bool]:
    return [e.data != "[DONE]" and is_content_event(json.loads(e.data)) for e in events]


def first_true(flags: list[bool]) -> int | None:
    return flags.index(True) if True in flags else None


# --- the rule itself ----------------------------------------------------------------------

def test_doctests_run_and_pass():
    result = doctest.testmod(first_content)
    assert result.attempted >= 5 and result.failed == 0


@pytest.mark.parametrize("event, expected", [
    ({"choices": [{"delta": {"content": "x"}}]}, True),
    ({"choices": [{"text": "x"}]}, True),
    ({"choices": [{"message": {"role": "assistant", "content": "x"}}]}, True),
    ({"choices": [{"delta": {}}, {"delta": {"content": "x"}}]}, True),      # any choice
    ({"choices": ["junk", {"text": " "}]}, True),                           # whitespace is text
    ({"choices": [{"delta": {"role": "assistant"}}]}, False),
    ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
    ({"choices": [{"delta": {"content": None}, "finish_reason": "stop"}]}, False),
    ({"choices": [{"delta": {"reasoning_content": "thinking"}}]}, False),
    ({"choices": [{"delta": {"content": [{"type": "text", "text": "x"}]}}]}, False),
    ({"choices": [{"delta": "x", "message": ["x"], "text": 5}]}, False),
    ({"choices": [], "usage": {"completion_tokens": 1}}, False),
    ({"choices": {"0": {"text": "x"}}}, False),
    ({"error": {"message": "boom", "content": "partial"}}, False),
    ({"content": "x", "text": "x"}, False),
    ([{"choices": [{"text": "x"}]}], False),
    ("x", False), (None, False), (7, False),
])
def test_the_rule(event, expected):
    assert is_content_event(event) is expected


def test_module_is_standard_library_only():
    imports = re.findall(r"^\s*(?:from|import)\s+([\w.]+)",
                         Path(first_content.__file__).read_text(), re.M)
    assert imports and set(imports) <= {"__future__"}


# --- the fixtures -------------------------------------------------------------------------

def test_fixture_set_is_complete_and_consistent():
    on_disk = {p.name for p in FIXTURES.glob("*.sse")}
    assert on_disk == set(EXPECTED)
    for chunks_file in FIXTURES.glob("*.chunks.json"):
        assert chunks_file.name.replace(".chunks.json", ".sse") in on_disk
    raw = {name: (FIXTURES / name).read_bytes() for name in on_disk}
    assert all(r.endswith(b"data: [DONE]\n\n") or r.endswith(b"data: [DONE]\r\n\r\n")
               for r in raw.values())
    assert any(b"\r\n" in r for r in raw.values())
    assert any(re.search(rb"(^|\n):", r) for r in raw.values())
    assert None in EXPECTED.values()


def test_the_utf8_fixture_really_splits_characters():
    raw, chunks = recorded("utf8_split.sse")
    assert b"".join(chunks) == raw and len(chunks) >= 3
    split = 0
    for chunk in chunks:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            split += 1
    assert split >= 2


@pytest.mark.parametrize("name", NAMES)
def test_rule_finds_the_recorded_first_content(name):
    raw, _ = recorded(name)
    events = parse_sse(raw)
    assert events and events[-1].data == "[DONE]"
    assert first_true(content_flags(events)) == EXPECTED[name]


# --- the proxy's scanner ------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_proxy_scanner_agrees_with_the_rule(name):
    raw, chunks = recorded(name)
    events = parse_sse(raw)
    flags = content_flags(events)
    # The SSE spec dispatches an event at the end of its blank line, and a CR ends a line: in
    # a CRLF stream that is the last CR, one byte before the LF the recorded event ends with
    # (WHATWG HTML, "Interpreting an event stream"; tests/proxy/test_sse_whatwg.py).
    def dispatched_at(end: int) -> int:
        return end - 1 if raw[end - 2:end] == b"\r\n" else end
    content_ends = [dispatched_at(e.end) for e, is_content in zip(events, flags) if is_content]

    # In the recorded chunks: each chunk reports the content events it completes.
    scanner = SSEScanner()
    per_chunk = [scanner.feed(chunk) for chunk in chunks]
    chunk_ends = [sum(map(len, chunks[:i + 1])) for i in range(len(chunks))]
    expected_per_chunk = [
        sum(1 for end in content_ends if (chunk_ends[i - 1] if i else 0) < end <= chunk_ends[i])
        for i in range(len(chunks))]
    assert per_chunk == expected_per_chunk
    assert scanner.summary.num_content_events == sum(flags)
    assert scanner.summary.done and not scanner.pending

    # Byte by byte: the byte completing each content event is where the scanner counts it,
    # so the first-content index and every later one (the regex fast path) agree.
    scanner = SSEScanner()
    counted_at = [i + 1 for i in range(len(raw)) for _ in range(scanner.feed(raw[i:i + 1]))]
    assert counted_at == content_ends
    ends = [dispatched_at(e.end) for e in events]
    assert (ends.index(counted_at[0]) if counted_at else None) == EXPECTED[name]


@pytest.mark.parametrize("name", NAMES)
def test_fast_path_regexes_are_sound_on_every_event(name):
    """`_PLAIN_CONTENT` only matches content; a miss of `_CONTENT` is never content."""
    raw, _ = recorded(name)
    for event in parse_sse(raw):
        if event.data == "[DONE]":
            continue
        data, is_content = event.data.encode(), is_content_event(json.loads(event.data))
        if proxy_sse._PLAIN_CONTENT.match(data):
            assert is_content, event.data
        if not proxy_sse._CONTENT.search(data):
            assert not is_content, event.data


def test_lookalikes_fixture_needs_the_json_check():
    """The naive regex alone would count lookalikes; the scanner must not."""
    raw, _ = recorded("lookalikes_after_first.sse")
    events = [e for e in parse_sse(raw) if e.data != "[DONE]"]
    naive = sum(bool(proxy_sse._CONTENT.search(e.data.encode())) for e in events)
    scanner = SSEScanner()
    scanner.feed(raw)
    assert scanner.summary.num_content_events == sum(content_flags(events)) == 4 < naive
    assert scanner.summary.error["message"] == "overloaded"


def test_proxy_first_token_may_be_message_content_or_in_a_later_choice():
    def ev(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    scanner = SSEScanner()
    assert scanner.feed(ev({"choices": [{"delta": {"reasoning_content": "hm"}}]})) == 0
    assert scanner.feed(ev({"choices": [{"message": {"content": "Hi"}}]})) == 1
    scanner = SSEScanner()
    assert scanner.feed(ev({"choices": [{"delta": {}}, {"delta": {"content": "Hi"}}]})) == 1
    assert scanner.feed(ev({"choices": [{"delta": {}}, {"delta": {"content": "!"}}]})) == 1


def test_plain_chunks_after_the_first_token_are_not_parsed(monkeypatch):
    parsed: list[bytes] = []

    def loads(data):
        parsed.append(data)
        return json.loads(data)

    monkeypatch.setattr(proxy_sse, "json", SimpleNamespace(loads=loads))
    raw, _ = recorded("empty_then_content.sse")
    scanner = SSEScanner()
    assert scanner.feed(raw) == 2
    # role, empty, first content and the finish chunk are parsed; " there" is not.
    assert len(parsed) == 4 and not any(b'" there"' in p for p in parsed)


# --- the load generator ---------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("name", NAMES)
def test_bench_timeline_picks_the_same_events(name, endpoint):
    raw, _ = recorded(name)
    events = parse_sse(raw)
    flags = content_flags(events)
    # the bench stops reading at an in-band error event
    errors = [i for i, e in enumerate(events) if e.data != "[DONE]" and "error" in json.loads(e.data)]
    stop = errors[0] if errors else len(events)

    now = [-1]
    timeline = StreamTimeline(index=0, endpoint=endpoint, clock_ns=lambda: now[0])
    timeline.mark_sent()
    data_index = -1
    # what httpx's aiter_lines() hands the runner: lines split at \r\n, \r or \n
    for line in _EOL.split(raw):
        text = line.decode("utf-8")
        if text.startswith("data:"):
            data_index += 1
            now[0] = data_index
        timeline.feed_line(text)
    assert data_index == len(events) - 1        # one data line per event in these fixtures
    result = timeline.finish()
    assert list(result.content_ns) == [i for i, c in enumerate(flags[:stop]) if c]
    assert (result.content_ns[0] if result.content_ns else None) == EXPECTED[name]
