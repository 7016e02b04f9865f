"""Agents and reasoning models behind the proxy (docs/architecture.md, "First output, by
kind"): the recorded tool-call and thinking streams of tests/fixtures/sse/formats/ replayed
by the fake upstream, paused before the first text (before the first tool call when there is
no text). The stages end at the first output of any kind and sum to it exactly; the kinds
before the first text fill their segments up to it; each call's start and ready times are
on the record; the real openai SDK assembles the same call the proxy relayed."""
from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from tests.node_support import run_node
from tests.proxy.test_proxy_formats import (
    EXPECTED,
    HOLD_MS,
    MESSAGES,
    RESPONSES,
    only_record,
    post_raw,
    recording,
    replaying,  # noqa: F401 - a fixture
)
from tracer.record.stages import PROXY_STAGES
from tracer.record.timeline import MAX_TOOL_CALLS
from tracer.testing.fake_upstream import MODEL, FakeUpstream
from tracer.testing.recording import Recording

CHAT = {"model": MODEL, "max_tokens": 16, "stream": True,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]}
# path, fixture, body, the segments after the stages, the first output's kind
CASES = [
    ("/v1/chat/completions", "openai_tool_calls.sse", CHAT, [], "tool_call"),
    ("/v1/chat/completions", "openai_reasoning_tool_text.sse", CHAT,
     ["reasoning", "tool_call"], "reasoning"),
    ("/v1/chat/completions", "openai_function_call.sse", CHAT, [], "tool_call"),
    ("/v1/messages", "anthropic_tool_first.sse", MESSAGES, ["tool_call"], "tool_call"),
    ("/v1/responses", "openai_responses_function_call.sse", RESPONSES, [], "tool_call"),
]


def _call_order(record) -> list:
    return [(c.name, c.ready_ns is not None) for c in record.tool_calls]


@pytest.mark.parametrize("path,name,body,segments,kind", CASES)
def test_stages_end_at_the_first_output_and_segments_reach_the_first_text(
        proxy_factory, replaying, path, name, body, segments, kind):
    upstream = replaying(path, recording(name))
    proxy = proxy_factory(upstream.base_url)
    status, _, relayed = post_raw(proxy.base_url + path, body)
    want = EXPECTED[name]
    assert status == 200 and relayed == upstream.recordings[path].body
    record = only_record(proxy)
    assert [s.stage for s in record.stages] == [*PROXY_STAGES, *segments]
    assert record.first_output_kind == kind and record.unattributed_ns == 0
    stages_ns = sum(s.duration_ns for s in record.stages[:len(PROXY_STAGES)])
    assert record.first_output_ns == stages_ns            # the stages sum to the first output
    if want["first_content"] is None:                     # a tool-call-only answer
        assert record.ttft_ns is None
        first = next(s for s in record.stages if s.stage == "upstream_first_token")
        assert first.duration_ns >= HOLD_MS / 2 * 1e6     # the pause was before the call
    else:                                                 # stages + segments = first text
        assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
        # the pause is in the last segment (less the hand-over of the event before it)
        assert record.stages[-1].duration_ns >= HOLD_MS / 2 * 1e6
    assert _call_order(record) == [(n, ready is not None) for n, _, ready in want["tool_calls"]]
    assert record.num_tool_calls == len(want["tool_calls"])
    for call in record.tool_calls:
        assert record.first_output_ns <= call.start_ns
        assert call.ready_ns is None or call.start_ns <= call.ready_ns <= record.e2e_ns
    if name == "openai_tool_calls.sse":   # the first call is ready when the second starts
        first, second = record.tool_calls
        assert first.ready_ns == second.start_ns


def test_the_openai_sdk_assembles_the_relayed_tool_calls(proxy_factory, replaying):
    upstream = replaying("/v1/chat/completions", recording("openai_tool_calls.sse"))
    proxy = proxy_factory(upstream.base_url)
    client = OpenAI(base_url=proxy.base_url + "/v1", api_key="sk-test", max_retries=0)
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "get_time")]
    with client.chat.completions.stream(model=MODEL, tools=tools, messages=[
            {"role": "user", "content": "Weather and time in Paris?"}]) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "text": "x"}
    assert final.choices[0].finish_reason == "tool_calls"
    record = only_record(proxy)
    assert [c.name for c in record.tool_calls] == ["get_weather", "get_time"]
    assert record.first_output_kind == "tool_call" and record.ttft_ns is None
    assert record.finish_reason == "tool_calls"


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    event = {"object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _hostile_body() -> bytes:
    parts = [_chunk({"role": "assistant", "content": None})]
    for i in range(3000):                                  # thousands of calls
        parts.append(_chunk({"tool_calls": [{"index": i, "id": f"c{i}", "type": "function",
                                             "function": {"name": f"fn_{i}", "arguments": ""}}]}))
    parts.append(_chunk({"tool_calls": [{"index": 0, "function": {
        "arguments": "x" * 200_000}}]}))                   # huge arguments
    parts.append(_chunk({"tool_calls": [{"index": 3001, "function": {"name": {"n": 1}}}]}))
    parts.append(_chunk({"tool_calls": [{"index": 3002, "function": {
        "name": "deep", "arguments": "[" * 5000}}]}))      # deep JSON in a string
    parts.append(b"data: " + b"[" * 100_000 + b"\n\n")     # deep JSON: unparsable, skipped
    parts.append(_chunk({"content": "done"}, "stop"))
    return b"".join(parts) + b"data: [DONE]\n\n"


def test_hostile_tool_call_streams_lose_no_record_and_add_no_label(proxy_factory):
    body = _hostile_body()
    upstream = FakeUpstream(recordings={"/v1/chat/completions": Recording(body)}).start()
    try:
        proxy = proxy_factory(upstream.base_url)
        status, _, relayed = post_raw(proxy.base_url + "/v1/chat/completions", CHAT)
        assert status == 200 and relayed == body
        record = only_record(proxy)
        assert record.num_tool_calls == 3001               # the nameless one is no call
        assert len(record.tool_calls) == MAX_TOOL_CALLS
        assert record.tool_calls[0].name == "fn_0"
        assert record.first_output_kind == "tool_call" and record.ttft_ns is not None
        metrics = httpx.get(proxy.base_url + "/metrics", timeout=10).text
        assert "fn_0" not in metrics and "deep" not in metrics
        # a well-formed request after it is traced as usual
        assert post_raw(proxy.base_url + "/v1/chat/completions", CHAT)[0] == 200
    finally:
        upstream.stop()


def test_the_trace_api_shows_the_calls_by_name_and_never_their_arguments(proxy_factory,
                                                                        replaying):
    upstream = replaying("/v1/chat/completions", recording("openai_tool_calls.sse"))
    proxy = proxy_factory(upstream.base_url)
    assert post_raw(proxy.base_url + "/v1/chat/completions", CHAT)[0] == 200
    record = only_record(proxy)
    view = httpx.get(f"{proxy.base_url}/ui/api/trace/{record.trace_id}", timeout=10).json()
    assert view["first_output_kind"] == "tool_call" and view["server_ttft_ms"] is None
    assert view["first_output_ms"] == record.first_output_ns / 1e6
    assert [(c["name"], c["start_ms"], c["ready_ms"]) for c in view["tool_calls"]] == [
        (c.name, c.start_ns / 1e6, c.ready_ns / 1e6) for c in record.tool_calls]
    assert view["num_tool_calls"] == 2
    assert "Paris" not in json.dumps(view)          # the arguments never leave the stream


def test_reasoning_tokens_from_the_usage_reach_the_record(proxy_factory):
    usage = {"object": "chat.completion.chunk", "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 40,
                       "completion_tokens_details": {"reasoning_tokens": 33}}}
    body = (_chunk({"reasoning_content": "hm"}) + _chunk({"content": "Hi"}, "stop")
            + b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    upstream = FakeUpstream(recordings={"/v1/chat/completions": Recording(body)}).start()
    try:
        proxy = proxy_factory(upstream.base_url)
        assert post_raw(proxy.base_url + "/v1/chat/completions", CHAT)[0] == 200
        record = only_record(proxy)
        assert record.attrs["llm.usage.reasoning_tokens"] == 33
        assert record.first_output_kind == "reasoning"
        assert [s.stage for s in record.stages][-1] == "reasoning"
    finally:
        upstream.stop()


def test_the_openai_js_sdk_assembles_the_relayed_tool_calls(proxy_factory, replaying):
    """The real `openai` JS SDK (pinned in frontend_probe/package.json) through the proxy."""
    upstream = replaying("/v1/chat/completions", recording("openai_tool_calls.sse"))
    proxy = proxy_factory(upstream.base_url)
    script = (
        "const { default: OpenAI } = await import('openai');\n"
        "const client = new OpenAI({ baseURL: process.argv[1], apiKey: 'sk-test', maxRetries: 0 });\n"
        "const stream = client.chat.completions.stream({ model: process.argv[2], messages: "
        "[{ role: 'user', content: 'Weather and time in Paris?' }], tools: ['get_weather', "
        "'get_time'].map(name => ({ type: 'function', function: { name, parameters: "
        "{ type: 'object' } } })) });\n"
        "const done = await stream.finalChatCompletion();\n"
        "console.log(JSON.stringify(done.choices[0]));\n")
    choice = json.loads(run_node(script, proxy.base_url + "/v1", MODEL))
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "text": "x"}
    assert choice["finish_reason"] == "tool_calls"
    assert [c.name for c in only_record(proxy).tool_calls] == ["get_weather", "get_time"]
