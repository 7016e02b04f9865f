"""The proxy in front of an engine that speaks Anthropic Messages (`/v1/messages`) or the
Responses API (`/v1/responses`): the recorded streams of tests/fixtures/sse/formats/ replayed
by the fake upstream, with a pause (the engine's prefill) right before the first text event
(the first tool call in an answer without text), so a first-content mark at
`message_start`, `ping`, a thinking or reasoning-summary event would read a TTFT shorter
than the pause. Tool calls and thinking: tests/proxy/test_proxy_tool_calls.py."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tracer.proxy.formats import FormatScanner
from tracer.record.content_stream import ContentStream
from tracer.record.stages import PROXY_STAGES
from tracer.testing.fake_upstream import MODEL, FakeUpstream
from tracer.testing.recording import Recording
from tracer.web.inband import decode_token

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "formats"
EXPECTED: dict[str, dict] = json.loads((FIXTURES / "expected.json").read_text())
HOLD_MS = 120.0
MESSAGES = {"model": MODEL, "max_tokens": 16, "stream": True,
            "messages": [{"role": "user", "content": "The capital of France?"}]}
RESPONSES = {"model": MODEL, "max_output_tokens": 16, "stream": True,
             "input": "The capital of France?"}
# path, fixture, request body, the fixture's (prompt, output) token counts from its usage
CASES = [("/v1/messages", "anthropic.sse", MESSAGES, (9, 12)),
         ("/v1/responses", "openai_responses.sse", RESPONSES, (9, 4))]


def event_starts(body: bytes) -> list[int]:
    """Byte offsets where each event with `data` starts (the fixtures' event index)."""
    starts, at = [], 0
    for block in body.split(b"\n\n"):
        if any(line.startswith(b"data:") for line in block.split(b"\n")):
            starts.append(at)
        at += len(block) + 2
    return starts


def recording(name: str, body: bytes | None = None, *, hold: bool = True) -> Recording:
    """The fixture (or `body`, a variant of it) in its recorded reads, paused before the
    first content event."""
    want = EXPECTED[name]
    raw = (FIXTURES / name).read_bytes() if body is None else body
    cuts_file = FIXTURES / (name.rsplit(".", 1)[0] + ".chunks.json")
    cuts = json.loads(cuts_file.read_text()) if body is None and cuts_file.exists() else []
    first = want["first_content"] if want["first_content"] is not None else want["first_tool_call"]
    hold_at = event_starts(raw)[first] if hold else None
    return Recording(raw, want["content_type"].encode(), tuple(cuts), hold_at,
                     HOLD_MS if hold else 0.0)


@pytest.fixture
def replaying():
    started: list[FakeUpstream] = []

    def start(path: str, rec: Recording) -> FakeUpstream:
        upstream = FakeUpstream(recordings={path: rec}).start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        upstream.stop()


def post_raw(url: str, body: dict) -> tuple[int, httpx.Headers, bytes]:
    with httpx.stream("POST", url, json=body, timeout=10) as response:
        return response.status_code, response.headers, b"".join(response.iter_raw())


def only_record(proxy):
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(5)
    return record


@pytest.mark.parametrize("path,name,body,tokens", CASES)
def test_first_content_is_the_first_text_delta_and_bytes_are_unchanged(
        proxy_factory, replaying, path, name, body, tokens):
    upstream = replaying(path, recording(name))
    proxy = proxy_factory(upstream.base_url)
    status, headers, relayed = post_raw(proxy.base_url + path, body)
    assert status == 200 and relayed == (FIXTURES / name).read_bytes()
    record = only_record(proxy)
    assert headers["x-request-id"] == record.request_id
    # Both streams think first: the stages end at the first thinking, and the `reasoning`
    # segment runs from it to the first text, so together they sum to TTFT.
    assert [s.stage for s in record.stages] == [*PROXY_STAGES, "reasoning"]
    assert record.unattributed_ns == 0
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert record.first_output_kind == "reasoning"
    assert record.first_output_ns == sum(s.duration_ns for s in record.stages[:-1])
    # Everything before the first text delta (start, ping, thinking / reasoning summary) came
    # before the pause; the first token is after it, and the pause is the thinking's.
    assert record.ttft_ns >= HOLD_MS * 1e6
    assert record.stages[-1].duration_ns >= HOLD_MS / 2 * 1e6   # less the previous hand-over
    assert record.finish_reason == "stop" and record.error_type is None
    assert (record.num_prompt_tokens, record.num_output_tokens) == tokens
    assert record.itl.count == EXPECTED[name]["content_events"] - 1
    assert upstream.state.requests[0].path == path


def test_the_openai_sdk_streams_a_response_through_the_proxy(proxy_factory, replaying):
    upstream = replaying("/v1/responses", recording("openai_responses.sse"))
    proxy = proxy_factory(upstream.base_url)
    client = OpenAI(base_url=proxy.base_url + "/v1", api_key="sk-test", max_retries=0)
    with client.responses.create(model=MODEL, input="The capital of France?",
                                 max_output_tokens=16, stream=True) as stream:
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Paris it is." and events[-1].type == "response.completed"
    record = only_record(proxy)
    assert record.ttft_ns >= HOLD_MS * 1e6 and record.finish_reason == "stop"
    assert record.num_output_tokens == 4
    assert json.loads(upstream.state.requests[0].body)["max_output_tokens"] == 16


def test_an_anthropic_client_reads_the_messages_stream_through_the_proxy(proxy_factory,
                                                                         replaying):
    # The anthropic SDK is not a dependency: its wire protocol over httpx, headers included.
    upstream = replaying("/v1/messages", recording("anthropic.sse"))
    proxy = proxy_factory(upstream.base_url)
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
    texts, types = [], []
    with httpx.stream("POST", proxy.base_url + "/v1/messages", json=MESSAGES, headers=headers,
                      timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                types.append(event["type"])
                if event.get("delta", {}).get("type") == "text_delta":
                    texts.append(event["delta"]["text"])
    assert "".join(texts) == "Paris — élan 🙂." and types[-1] == "message_stop"
    seen = upstream.state.requests[0].headers
    assert seen["x-api-key"] == "sk-ant-test" and seen["anthropic-version"] == "2023-06-01"
    record = only_record(proxy)
    assert record.ttft_ns >= HOLD_MS * 1e6 and record.finish_reason == "stop"


def _anthropic_with(stop_reason: str) -> bytes:
    raw = (FIXTURES / "anthropic.sse").read_bytes()
    assert raw.count(b'"stop_reason":"end_turn"') == 1
    return raw.replace(b'"stop_reason":"end_turn"', f'"stop_reason":"{stop_reason}"'.encode())


def _responses_incomplete(reason: str) -> bytes:
    raw = (FIXTURES / "openai_responses.sse").read_bytes()
    head, _, _ = raw.partition(b"event: response.completed\n")
    final = {"type": "response.incomplete", "sequence_number": 10, "response": {
        "id": "resp_1", "object": "response", "status": "incomplete", "model": "gpt-x",
        "output": [], "incomplete_details": {"reason": reason},
        "usage": {"input_tokens": 9, "output_tokens": 16, "total_tokens": 25}}}
    return head + b"event: response.incomplete\ndata: " + json.dumps(final).encode() + b"\n\n"


@pytest.mark.parametrize("path,name,body,want", [
    ("/v1/messages", "anthropic.sse", _anthropic_with("max_tokens"), "length"),
    ("/v1/messages", "anthropic.sse", _anthropic_with("stop_sequence"), "stop"),
    ("/v1/messages", "anthropic.sse", _anthropic_with("tool_use"), "tool_calls"),
    ("/v1/responses", "openai_responses.sse", _responses_incomplete("max_output_tokens"),
     "length"),
])
def test_finish_reasons_map_to_the_chat_paths(proxy_factory, replaying, path, name, body, want):
    upstream = replaying(path, recording(name, body))
    proxy = proxy_factory(upstream.base_url)
    status, _, relayed = post_raw(proxy.base_url + path,
                                  MESSAGES if path == "/v1/messages" else RESPONSES)
    assert status == 200 and relayed == body
    record = only_record(proxy)
    assert record.finish_reason == want and record.error_type is None
    assert record.ttft_ns >= HOLD_MS * 1e6


# A first token, then the upstream fails mid-stream (Anthropic's `overloaded_error`).
ANTHROPIC_ERROR = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":'
    b'"message","role":"assistant","content":[],"usage":{"input_tokens":9,"output_tokens":1}}}'
    b'\n\nevent: ping\ndata: {"type":"ping"}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Par"}}\n\n'
    b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
    b'"message":"Overloaded"}}\n\n')
RESPONSES_FAILED = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
    b'"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,'
    b'"delta":"Par"}\n\n'
    b'event: response.failed\ndata: {"type":"response.failed","sequence_number":2,"response":'
    b'{"id":"resp_1","object":"response","status":"failed","output":[],'
    b'"error":{"code":"server_error","message":"boom"}}}\n\n')


@pytest.mark.parametrize("path,body,request_body", [
    ("/v1/messages", ANTHROPIC_ERROR, MESSAGES),
    ("/v1/responses", RESPONSES_FAILED, RESPONSES),
])
def test_an_error_event_ends_as_the_chat_paths_in_band_error(proxy_factory, replaying, path,
                                                             body, request_body):
    upstream = replaying(path, Recording(body, b"text/event-stream"))
    proxy = proxy_factory(upstream.base_url)
    status, _, relayed = post_raw(proxy.base_url + path, request_body)
    assert status == 200 and relayed == body
    record = only_record(proxy)
    assert (record.finish_reason, record.error_type) == ("error", "upstream")
    assert record.ttft_ns is not None and record.itl.count == 0   # one token, then the error
    assert proxy.metric("llm_requests_total", model=MODEL, finish_reason="error") == 1


@pytest.mark.parametrize("path,answer,request_body,tokens", [
    ("/v1/messages", {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                      "content": [{"type": "text", "text": "Paris."}], "stop_reason": "max_tokens",
                      "usage": {"input_tokens": 7, "cache_read_input_tokens": 2,
                                "output_tokens": 3}},
     {**MESSAGES, "stream": False}, (9, 2, 3)),
    ("/v1/responses", {"id": "resp_1", "object": "response", "status": "completed",
                       "model": MODEL, "output": [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "Paris."}]}],
                       "usage": {"input_tokens": 9, "output_tokens": 3,
                                 "input_tokens_details": {"cached_tokens": 4}}},
     {**RESPONSES, "stream": False}, (9, 4, 3)),
])
def test_a_whole_answer_is_read_by_its_format(proxy_factory, replaying, path, answer,
                                              request_body, tokens):
    body = json.dumps(answer).encode()
    upstream = replaying(path, Recording(body, b"application/json"))
    proxy = proxy_factory(upstream.base_url)
    status, _, relayed = post_raw(proxy.base_url + path, request_body)
    assert status == 200 and relayed == body
    record = only_record(proxy)
    assert record.ttft_ns is not None and [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert (record.num_prompt_tokens, record.num_cached_tokens, record.num_output_tokens) == tokens
    assert record.finish_reason == ("length" if path == "/v1/messages" else "stop")


@pytest.mark.parametrize("name", [n for n, want in EXPECTED.items()
                                  if want["format"] in ("anthropic", "openai-responses")])
def test_the_scanner_finds_the_fixtures_first_content_event(name):
    want = EXPECTED[name]
    raw = (FIXTURES / name).read_bytes()
    starts = event_starts(raw)
    scanner = FormatScanner(want["format"])
    counts = [scanner.feed(raw[a:b]) for a, b in zip(starts, [*starts[1:], len(raw)])]
    first = next((i for i, n in enumerate(counts) if n), None)
    assert first == want["first_content"]
    assert sum(counts) == want["content_events"]



@pytest.mark.parametrize("path,name,body,tokens", CASES)
def test_the_in_band_timing_line_ends_a_stream_without_done(proxy_factory, replaying, path,
                                                            name, body, tokens):
    # These formats have no `data: [DONE]`: the line comes after the end event, and its TTFT
    # is the first text delta's.
    upstream = replaying(path, recording(name))
    proxy = proxy_factory(upstream.base_url)
    with httpx.stream("POST", proxy.base_url + path, json=body, timeout=10,
                      headers={"X-TTFT-Timing": "1"}) as response:
        relayed = b"".join(response.iter_raw())
    raw = (FIXTURES / name).read_bytes()
    assert relayed.startswith(raw)
    reader = ContentStream(EXPECTED[name]["content_type"])
    reader.feed(relayed[len(raw):])
    assert relayed[len(raw):].startswith(b": ttft-timing ") and reader.server_token
    record = only_record(proxy)
    timing = decode_token(reader.server_token, proxy.parts.obs.beacon_signer)
    assert timing.span_id == record.span_id
    assert abs(timing.ttft_ms - record.ttft_ns / 1e6) < 0.002
    assert timing.ttft_ms >= HOLD_MS
