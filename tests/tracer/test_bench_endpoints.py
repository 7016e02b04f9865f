"""`tracer bench --endpoint messages | responses`: the load generator on Anthropic Messages and
the Responses API, against a small server on 127.0.0.1 replaying the recorded streams of
tests/fixtures/sse/formats/ (the ones the probe and the Python rules are checked on)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from tracer.bench.endpoints import ENDPOINTS
from tracer.bench.prompts import PromptSpec, build_request_body, make_prompts
from tracer.bench.runner import BenchConfig, run_bench
from tracer.bench.stream import StreamTimeline
from tracer.record.content_stream import ContentStream
from tracer.record.first_content import CONTENT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "formats"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
GAP_S = 0.03     # between two recorded reads: the first content comes reads × GAP_S after send
# endpoint → (fixture, prompt tokens, completion tokens in its usage)
CASES = {"messages": ("anthropic.sse", 9, 12), "responses": ("openai_responses.sse", 9, 4)}


def reads(name: str) -> list[bytes]:
    raw = (FIXTURES / name).read_bytes()
    cuts_file = FIXTURES / (name.rsplit(".", 1)[0] + ".chunks.json")
    bounds = [0, *(json.loads(cuts_file.read_text()) if cuts_file.exists() else []), len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:])]


def first_content_read(name: str) -> int:
    """Index of the read that completes the fixture's first content event (the Python rule)."""
    stream = ContentStream(EXPECTED[name]["content_type"])
    return next(i for i, chunk in enumerate(reads(name)) if CONTENT in stream.feed(chunk))


class ReplayServer:
    """/v1/messages and /v1/responses answer with a recorded stream, GAP_S between its reads;
    `tail` replaces the stream's last event (to test a failed or cut stream)."""

    def __init__(self, tail: bytes | None = None) -> None:
        self.seen: list[tuple[str, dict, dict]] = []
        self.tail = tail
        self.app = FastAPI()
        for endpoint, (fixture, _, _) in CASES.items():
            self.app.post(ENDPOINTS[endpoint].path)(self._handler(fixture))

    def _handler(self, fixture: str):
        async def handle(request: Request):
            self.seen.append((request.url.path, dict(request.headers), await request.json()))
            chunks = reads(fixture)
            if self.tail is not None:
                body = b"".join(chunks)
                chunks = [body[:body.rstrip(b"\n").rfind(b"\n\n") + 2], self.tail]

            async def stream():
                for i, chunk in enumerate(chunks):
                    if i:
                        await asyncio.sleep(GAP_S)   # pacing the replay, not synchronisation
                    yield chunk
            return StreamingResponse(stream(), media_type=EXPECTED[fixture]["content_type"])
        return handle

    def __enter__(self) -> "ReplayServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="critical",
                                                     lifespan="off", timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        self._sock = sock
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        assert not self._thread.is_alive(), "replay server did not stop"


def _run(server: ReplayServer, endpoint: str, **overrides):
    config = BenchConfig(**({"base_url": server.base_url, "model": "m", "endpoint": endpoint,
                             "num_requests": 3, "concurrency": 3, "prompt_tokens": 16,
                             "shared_prefix_ratio": 0.5, "output_tokens": 8, "api_key": "k",
                             "timeout_s": 10.0} | overrides))
    return asyncio.run(run_bench(config))


@pytest.mark.parametrize("endpoint", sorted(CASES))
def test_bench_measures_the_first_text_not_the_first_event(endpoint):
    fixture, prompt_tokens, completion_tokens = CASES[endpoint]
    with ReplayServer() as server:
        result = _run(server, endpoint)
    assert result.summary["failed"] == 0 and result.summary["completed"] == 3, result.summary
    k = first_content_read(fixture)
    assert k >= 1            # the first content is not in the first read: start events come first
    for r in result.results:
        assert len(r.content_ns) == EXPECTED[fixture]["content_events"]
        ttft_s = (r.content_ns[0] - r.sent_ns) / 1e9
        assert ttft_s >= k * GAP_S * 0.9, ttft_s     # not the message_start / response.created
        assert (r.prompt_tokens, r.completion_tokens) == (prompt_tokens, completion_tokens)
        assert r.done_ns is not None and r.done_ns >= r.content_ns[-1]
    path, headers, body = server.seen[0]
    assert path == ENDPOINTS[endpoint].path and body["stream"] is True
    if endpoint == "messages":
        assert headers["anthropic-version"] == "2023-06-01" and headers["x-api-key"] == "k"
        assert body["max_tokens"] == 8 and body["system"] and body["messages"][0]["role"] == "user"
    else:
        assert "anthropic-version" not in headers
        assert body["max_output_tokens"] == 8 and body["instructions"] and body["input"]


@pytest.mark.parametrize("endpoint, tail, kind", [
    ("responses", b'event: response.failed\ndata: {"type":"response.failed","response":'
                  b'{"status":"failed","error":{"code":"server_error","message":"boom"}}}\n\n',
     "stream_error"),
    ("messages", b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                 b'"message":"Overloaded"}}\n\n', "stream_error"),
    ("messages", b"", "broken_stream"),          # no message_stop: the stream was cut
    ("responses", b"", "broken_stream"),         # no response.completed
])
def test_failed_or_cut_streams_fail_by_kind(endpoint, tail, kind):
    with ReplayServer(tail=tail) as server:
        result = _run(server, endpoint, num_requests=1, concurrency=1)
    assert result.summary["failed_by_kind"] == {kind: 1}, result.summary


def test_request_bodies_per_endpoint():
    [prompt] = make_prompts(PromptSpec(8, 0.5, 0), 1)
    chat = build_request_body("chat", "m", prompt, 4)
    messages = build_request_body("messages", "m", prompt, 4)
    responses = build_request_body("responses", "m", prompt, 4)
    assert messages["system"] == chat["messages"][0]["content"] == responses["instructions"]
    assert messages["messages"] == [chat["messages"][1]]
    assert responses["input"] == chat["messages"][1]["content"]
    assert "ignore_eos" not in messages and "ignore_eos" not in responses
    [whole] = make_prompts(PromptSpec(8, 0.0, 0), 1)
    assert "system" not in build_request_body("messages", "m", whole, 4)
    with pytest.raises(ValueError, match="messages"):
        build_request_body("embeddings", "m", prompt, 4)
    with pytest.raises(ValueError, match="endpoint must be one of"):
        StreamTimeline(0, "embeddings")


# endpoint of each recorded stream with tool calls or thinking (the fixtures' events in order;
# anthropic_tool_first.sse carries an error event, which fails a bench request)
FIRST_OUTPUT_CASES = [("chat", "openai_tool_calls.sse"), ("chat", "openai_reasoning_tool_text.sse"),
                      ("chat", "openai_function_call.sse"), ("chat", "openai_reasoning.sse"),
                      ("messages", "anthropic.sse"),
                      ("responses", "openai_responses_function_call.sse"),
                      ("responses", "openai_responses.sse")]


@pytest.mark.parametrize("endpoint,name", FIRST_OUTPUT_CASES)
def test_the_first_output_by_kind_and_a_tool_call_only_answer_is_an_answer(endpoint, name):
    """Each `data:` payload arrives 1 ms after the one before (a fake clock): the first output
    is the first event of any kind, text or not, and the first text stays TTFT."""
    want = EXPECTED[name]
    clock = iter(range(0, 10**9, 1_000_000))
    timeline = StreamTimeline(0, endpoint, clock_ns=lambda: next(clock))
    timeline.mark_sent()                                   # t = 0
    payloads = [line[len("data:"):].strip()
                for line in (FIXTURES / name).read_text().replace("\r\n", "\n").split("\n")
                if line.startswith("data:")]
    for payload in payloads:                               # event i arrives at (i + 1) ms
        timeline.feed_data(payload)
    result = timeline.finish()
    assert result.ok, result.error_message
    firsts = {k: want[f"first_{k}"] for k in ("content", "reasoning", "tool_call")
              if want[f"first_{k}"] is not None}
    first = min(firsts, key=firsts.get)
    assert result.first_output_kind == {"content": "text"}.get(first, first)
    assert result.first_output_ns == (firsts[first] + 1) * 1_000_000
    assert result.ttft_s == (None if want["first_content"] is None
                             else (want["first_content"] + 1) / 1000)
    assert result.num_tool_calls == len(want["tool_calls"])
    assert result.to_row()["first_output_kind"] == result.first_output_kind
