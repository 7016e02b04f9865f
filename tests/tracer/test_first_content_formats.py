"""One content rule per stream format, checked on the shared recorded streams of each format.

tests/fixtures/sse/formats/ (README.md there) holds the streams; frontend_probe/test/
formats.test.mjs reads the same files for the browser probe, and the last tests here run the
probe's own rules (node) on the same events to check the two languages agree.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.node_support import run_node
from tracer.record import first_content
from tracer.record.content_stream import ContentStream
from tracer.record.first_content import (CONTENT, FORMATS, NEITHER, REASONING, RULES, TOOL_CALL,
                                         classify,
                                         is_content_event)
from tracer.web.probe import beacon

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "sse" / "formats"
EXPECTED: dict[str, dict] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)


def recorded(name: str) -> tuple[bytes, list[bytes]]:
    raw = (FIXTURES / name).read_bytes()
    cuts_file = FIXTURES / (name.rsplit(".", 1)[0] + ".chunks.json")
    cuts = json.loads(cuts_file.read_text()) if cuts_file.exists() else []
    assert cuts == sorted(set(cuts)) and all(0 < c < len(raw) for c in cuts)
    bounds = [0, *cuts, len(raw)]
    return raw, [raw[a:b] for a, b in zip(bounds, bounds[1:])]


def stream_for(name: str) -> ContentStream:
    want = EXPECTED[name]
    return ContentStream(want["content_type"], want.get("headers"))


def per_chunk(name: str, chunks: list[bytes]) -> tuple[ContentStream, list[list[int]]]:
    stream = stream_for(name)
    kinds = [stream.feed(c) for c in chunks]
    kinds[-1] += stream.close()
    return stream, kinds


def first_chunk(kinds: list[list[int]], kind: int) -> int | None:
    return next((i for i, ks in enumerate(kinds) if kind in ks), None)


# --- the fixtures -----------------------------------------------------------------------

def test_fixture_set_is_complete_and_covers_every_format():
    on_disk = {p.name for p in FIXTURES.iterdir() if p.suffix in (".sse", ".ndjson", ".txt")}
    assert on_disk == set(EXPECTED)
    for chunks_file in FIXTURES.glob("*.chunks.json"):
        stem = chunks_file.name.removesuffix(".chunks.json")
        assert any(n.rsplit(".", 1)[0] == stem for n in on_disk), chunks_file.name
    assert {e["format"] for e in EXPECTED.values()} == set(FORMATS) - {"custom"}
    # the hard cases are there: split characters, events split across reads, no content
    split_utf8 = split_event = 0
    for name in NAMES:
        raw, chunks = recorded(name)
        for chunk in chunks:
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError:
                split_utf8 += 1
        ends = [sum(map(len, chunks[:i + 1])) for i in range(len(chunks) - 1)]
        split_event += sum(not raw[:end].endswith((b"\n\n", b"\r\n\r\n", b"\n")) for end in ends)
    assert split_utf8 >= 4 and split_event >= 6
    assert any(e["first_content"] is None for e in EXPECTED.values())


@pytest.mark.parametrize("name", NAMES)
def test_the_recorded_chunks_give_the_expected_first_content(name):
    """Each event counts in the read that completes it: the chunk index the probe's beacon
    reports (frontend_probe/test/formats.test.mjs checks the same index)."""
    want = EXPECTED[name]
    _, chunks = recorded(name)
    stream, kinds = per_chunk(name, chunks)
    assert stream.format == want["format"]
    assert sum(ks.count(CONTENT) for ks in kinds) == want["content_events"]
    assert stream.errors == 0
    assert stream.server_token == want.get("server")
    # the event index of the first content and first reasoning
    flat = [k for ks in kinds for k in ks]
    if name.endswith(".txt"):   # a plain-text stream: one "event" per read that decoded text
        flat = [CONTENT if CONTENT in ks else NEITHER for ks in kinds]
    assert (flat.index(CONTENT) if CONTENT in flat else None) == want["first_content"]
    assert (flat.index(REASONING) if REASONING in flat else None) == want["first_reasoning"]


@pytest.mark.parametrize("name", [n for n in NAMES if not n.endswith(".txt")])
def test_byte_by_byte_reads_find_the_same_events(name):
    raw, chunks = recorded(name)
    _, whole = per_chunk(name, chunks)
    stream, kinds = per_chunk(name, [raw[i:i + 1] for i in range(len(raw))])
    assert [k for ks in kinds for k in ks] == [k for ks in whole for k in ks]
    assert stream.format == EXPECTED[name]["format"]


def test_text_stream_first_token_is_the_first_non_empty_decoded_text():
    raw, chunks = recorded("ai_sdk_text.txt")
    assert chunks[0] == "é".encode()[:1]             # decodes to nothing yet
    _, kinds = per_chunk("ai_sdk_text.txt", chunks)
    assert kinds[0] == [] and kinds[1] == [CONTENT]
    stream = ContentStream("text/plain")
    assert [stream.feed(raw[i:i + 1]) for i in range(3)] == [[], [CONTENT], [CONTENT]]


def test_a_forced_format_ignores_other_shapes():
    anthropic = b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}\n\n'
    assert ContentStream("text/event-stream", fmt="openai").feed(anthropic) == [NEITHER]
    assert ContentStream("text/event-stream").feed(anthropic) == [CONTENT]
    assert ContentStream("application/json", fmt="text").feed(b"{}") == [CONTENT]
    for bad in ("claude", "custom"):
        with pytest.raises(ValueError, match="format must be one of"):
            ContentStream("text/event-stream", fmt=bad)


def test_an_over_long_line_is_dropped_not_kept():
    stream = ContentStream("application/x-ndjson", max_line_bytes=64)
    assert stream.feed(b'{"response":"' + b"x" * 100) == []
    assert stream.errors == 1 and not stream._buf
    assert stream.feed(b'"}\n{"response":"ok","done":false}\n') == [NEITHER, CONTENT]


def test_timing_comment_in_any_sse_stream_and_data_part_in_the_ui_stream():
    token = "eyJ2IjoxfQ." + "B" * 43
    stream = ContentStream("text/event-stream")
    stream.feed(f": ttft-timing {token}\n\n: ttft-timing x.y\n\n".encode())
    assert stream.server_token == token
    ui = ContentStream("text/event-stream", {"X-Vercel-AI-UI-Message-Stream": "v1"})
    assert ui.format == "ai-sdk-ui"
    part = json.dumps({"type": "data-ttft-timing", "data": "not a token"})
    assert ui.feed(f"data: {part}\n\n".encode()) == [NEITHER] and ui.server_token is None


# --- the rules ----------------------------------------------------------------------------

EDGE_CASES = [
    ({"choices": [{"delta": {"reasoning_content": "hm"}}]}, ("openai", REASONING)),
    ({"choices": [{"delta": {"reasoning_content": 5, "reasoning": "hm"}}]}, ("openai", REASONING)),
    ({"choices": [{"delta": {"reasoning_content": "hm"}}, {"delta": {"content": "x"}}]},
     ("openai", CONTENT)),
    ({"candidates": [{"content": {"parts": [{"text": "x", "thought": True}]}}]}, ("gemini", REASONING)),
    ({"candidates": [{"content": {"parts": [{"text": "x", "thought": "yes"}]}}]}, ("gemini", CONTENT)),
    ({"candidates": [{"content": {"parts": {"text": "x"}}}]}, ("gemini", NEITHER)),
    ({"done": False, "message": {"content": "", "thinking": "hm"}}, ("ollama", REASONING)),
    ({"done": False, "message": {}, "response": "x"}, ("ollama", NEITHER)),
    ({"done": "no", "response": "x"}, (None, None)),
    ({"type": "response.refusal.delta", "delta": "no"}, ("openai-responses", NEITHER)),
    ({"type": "response.output_text.done", "text": "x"}, ("openai-responses", NEITHER)),
    ({"type": "content_block_start", "content_block": {"type": "text", "text": "x"}},
     ("anthropic", NEITHER)),
    ({"type": "pingx"}, (None, None)),
    ({"type": "ping"}, ("anthropic", NEITHER)),
    ({"type": "error", "error": {"type": "overloaded_error"}}, (None, None)),
    ({"type": "text-delta", "delta": 5}, ("ai-sdk-ui", NEITHER)),
    ({"type": "message-metadata", "messageMetadata": {"text": "x"}}, ("ai-sdk-ui", NEITHER)),
    ({"type": ["response.x"]}, (None, None)),
    ({"type": -1}, (None, None)),
    ("text-delta", (None, None)), (None, (None, None)), ([{"choices": []}], (None, None)),
]


@pytest.mark.parametrize("event, expected", EDGE_CASES)
def test_rules_on_edge_cases(event, expected):
    assert classify(event) == expected


def test_the_closed_set_is_the_schema_s_and_the_openai_rule_is_unchanged():
    assert FORMATS == beacon.FORMATS
    assert list(RULES)[0] == "openai" and FORMATS[-2:] == ("text", "custom")
    for event in ({"choices": [{"delta": {"content": "x"}}]}, {"choices": [{"text": ""}]},
                  {"choices": [{"message": {"content": "x"}}]}, {"choices": []}, None):
        assert (RULES["openai"](event) == CONTENT) is is_content_event(event)
    assert first_content.is_timing_token("a" * 2000 + "." + "b" * 43)
    assert not first_content.is_timing_token("a" * 2001 + "." + "b" * 43)


# --- the probe's rules agree ----------------------------------------------------------------

def _probe_kinds(events: list) -> list:
    """[format, kind] of each event by the probe's JS rules (probe.js + formats.js)."""
    script = (
        "const { RULES } = await import('./probe.js'); await import('./formats.js');\n"
        "let s = ''; for await (const c of process.stdin) s += c;\n"
        "const out = JSON.parse(s).map(j => { let k, f;"
        " for (f in RULES) if ((k = RULES[f](j)) != null) break;"
        " return k == null ? [null, null] : [f, typeof k == 'string' ? k : Number(k)]; });\n"
        "console.log(JSON.stringify(out));\n")
    return [tuple(x) for x in json.loads(run_node(script, stdin=json.dumps(events)))]


def test_the_probe_and_python_rules_agree_on_every_fixture_event_and_edge_case():
    events = [event for event, _ in EDGE_CASES + TOOL_EDGE_CASES]
    for name in NAMES:
        if name.endswith(".txt"):
            continue
        raw, _ = recorded(name)
        text = raw.decode().replace("\r\n", "\n")
        lines = text.split("\n") if name.endswith(".ndjson") else [
            line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
        events += [json.loads(line) for line in lines if line.strip() and line != "[DONE]"]
    assert len(events) > 100
    python = [classify(e) for e in events]
    assert _probe_kinds(events) == [(f, None if k is None else int(k) if not isinstance(k, str)
                                     else k) for f, k in python]


# --- tool calls ---------------------------------------------------------------------------

def _tool_calls(stream: ContentStream) -> list[list]:
    calls: dict = {}
    for index, action, key, name in stream.take_tool_moments():
        if action == "start":
            assert key not in calls
            calls[key] = [name, index, None]
        else:
            assert calls[key][2] is None and index >= calls[key][1]
            calls[key][2] = index
    return list(calls.values())


@pytest.mark.parametrize("name", [n for n in NAMES if not n.endswith(".txt")])
def test_the_recorded_chunks_give_the_expected_tool_calls(name):
    """Each call's start (the event naming its function, which the rules call TOOL_CALL) and
    the event that made its arguments complete, byte by byte as in one read."""
    raw, chunks = recorded(name)
    want = EXPECTED[name]
    for reads in (chunks, [raw[i:i + 1] for i in range(len(raw))]):
        stream, kinds = per_chunk(name, reads)
        flat = [k for ks in kinds for k in ks]
        assert (flat.index(TOOL_CALL) if TOOL_CALL in flat else None) == want["first_tool_call"]
        assert _tool_calls(stream) == want["tool_calls"]


TOOL_EDGE_CASES = [
    ({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]},
     ("openai", TOOL_CALL)),
    ({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
     ("openai", NEITHER)),
    ({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": 7}}]}}]},
     ("openai", NEITHER)),
    ({"choices": [{"delta": {"tool_calls": {"function": {"name": "f"}}}}]}, ("openai", NEITHER)),
    ({"choices": [{"delta": {"content": "x", "tool_calls": [{"function": {"name": "f"}}]}}]},
     ("openai", CONTENT)),
    ({"choices": [{"delta": {"reasoning_content": "hm", "function_call": {"name": "f"}}}]},
     ("openai", TOOL_CALL)),
    ({"choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "f"}}]}}]},
     ("openai", TOOL_CALL)),
    ({"type": "response.output_item.added", "item": {"type": "function_call", "name": ""}},
     ("openai-responses", NEITHER)),
    ({"type": "content_block_start", "content_block": {"type": "tool_use", "name": ["f"]}},
     ("anthropic", NEITHER)),
    ({"type": "tool-input-start", "toolCallId": "c", "toolName": "f"}, ("ai-sdk-ui", TOOL_CALL)),
    ({"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "{"}, ("ai-sdk-ui", NEITHER)),
    ({"done": False, "message": {"content": "", "tool_calls": [{"function": {"name": "f"}}]}},
     ("ollama", TOOL_CALL)),
    ({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": {}}}]}}]},
     ("gemini", TOOL_CALL)),
]


@pytest.mark.parametrize("event, expected", TOOL_EDGE_CASES)
def test_tool_call_rules_on_edge_cases(event, expected):
    assert classify(event) == expected


def test_hostile_tool_calls_cost_bounded_memory_and_keep_the_first_ones():
    from tracer.record.tool_calls import MAX_TRACKED, ToolCallTracker
    tracker = ToolCallTracker()
    starts = 0
    for i in range(3 * MAX_TRACKED):      # thousands of calls, one delta each, never finished
        delta = {"tool_calls": [{"index": i, "function": {"name": "f" * 10_000}}]}
        starts += sum(a == "start" for a, _, _ in tracker.feed("openai", {"choices": [
            {"index": 0, "delta": delta}]}))
    assert starts == 3 * MAX_TRACKED
    assert len(tracker._seen) == MAX_TRACKED and len(tracker.open_keys()) <= 1
    # keys that are not ints or short strings are no keys; a name that is not a string is none
    weird = {"type": "tool-input-start", "toolCallId": {"a": 1}, "toolName": "f"}
    assert ToolCallTracker().feed("ai-sdk-ui", weird) == []
    assert ToolCallTracker().feed("ai-sdk-ui", {**weird, "toolCallId": "c" * 129}) == []
    deep = {"choices": [{"index": [[[]]], "delta": {"tool_calls": [{"index": True,
                                                                    "function": {"name": "f"}}]}}]}
    assert ToolCallTracker().feed("openai", deep) == []
