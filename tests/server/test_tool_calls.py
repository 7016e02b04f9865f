"""Tool calls from our engine (issue 37, item 6): tool_choice "required" and a named function,
streamed and not, through the real `openai` SDK, constrained to each tool's JSON schema; "auto"
and malformed tools are 400s; the record's first output is the tool call, with its times."""
from __future__ import annotations

import json

import httpx
import jsonschema_rs
import pytest
from openai import OpenAI

from tests.node_support import run_node

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 24}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0)


def _valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema_rs.validate(SCHEMAS[name], json.loads(arguments))


def _stream_with_sdk(client, live, tool_choice):
    with client.chat.completions.stream(
            model=live.model, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
            temperature=0, max_tokens=60) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def test_required_streamed_through_the_openai_sdk(client, live):
    completion = _stream_with_sdk(client, live, "required")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        _valid(call.function.name, call.function.arguments)


def test_named_streamed_through_the_openai_sdk(client, live):
    completion = _stream_with_sdk(client, live, NAMED)
    choice = completion.choices[0]
    # OpenAI answers a forced named call with "stop" (tool_choice.py, ToolPlan.finish_reason).
    assert choice.finish_reason == "stop"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _valid("get_weather", call.function.arguments)


def test_not_streamed(live):
    for tool_choice, reason in (("required", "tool_calls"), (NAMED, "stop")):
        body = {"model": live.model, "messages": MESSAGES, "tools": TOOLS,
                "tool_choice": tool_choice, "temperature": 0, "max_tokens": 60}
        r = httpx.post(live.base_url + CHAT, json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == reason
        message = choice["message"]
        assert message["content"] is None and message["tool_calls"]
        for call in message["tool_calls"]:
            assert call["id"].startswith("call_") and call["type"] == "function"
            _valid(call["function"]["name"], call["function"]["arguments"])


def test_streamed_deltas_as_vllm_sends_them(live):
    """The first delta names the call with empty arguments; then only argument fragments."""
    body = {"model": live.model, "messages": MESSAGES, "tools": TOOLS, "stream": True,
            "tool_choice": "required", "temperature": 0, "max_tokens": 60}
    with httpx.stream("POST", live.base_url + CHAT, json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    first = deltas[0]
    assert first["role"] == "assistant" and first["content"] is None
    [call] = first["tool_calls"]
    assert call["index"] == 0 and call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ""}
    fragments = [d["tool_calls"][0] for d in deltas[1:] if "tool_calls" in d]
    assert fragments and all(set(f) == {"index", "function"} for f in fragments)
    _valid("get_weather", "".join(f["function"]["arguments"] for f in fragments if f["index"] == 0))
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_record_starts_at_the_tool_call(live):
    body = {"model": live.model, "messages": MESSAGES, "tools": TOOLS, "stream": True,
            "tool_choice": "required", "temperature": 0, "max_tokens": 60}
    trace_id = "7c" * 16
    with httpx.stream("POST", live.base_url + CHAT, json=body, timeout=60,
                      headers={"traceparent": f"00-{trace_id}-{'cd' * 8}-01"}) as r:
        list(r.iter_lines())
    live.wait_idle()
    record = live.parts.obs.store.get(trace_id)
    assert record.first_output_kind == "tool_call" and record.ttft_ns is None
    assert record.unattributed_ns == 0
    assert sum(s.duration_ns for s in record.stages) == record.first_output_ns
    [call] = record.tool_calls
    assert call.name == "get_weather" and call.start_ns == record.first_output_ns
    assert call.ready_ns is not None and call.ready_ns > call.start_ns
    # Inter-token latency is about text: a tool-call-only answer has no gaps.
    assert record.num_output_tokens > 0 and record.itl.count == 0


@pytest.mark.parametrize("extra, param", [
    ({"tools": TOOLS}, "tools"),                                   # "auto" by default
    ({"tools": TOOLS, "tool_choice": "auto"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}], "tool_choice": "required"}, "tools"),
    ({"tools": ["get_weather"], "tool_choice": "required"}, "tools"),
    # Schemas only the grammar library can judge: refused when the engine compiles them.
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/missing"}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"functions": [TOOLS[0]["function"]], "function_call": {"name": "get_weather"}},
     "function_call"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_refused_with_a_400_naming_the_field(live, extra, param, stream):
    body = {"model": live.model, "messages": MESSAGES, "max_tokens": 4, "stream": stream,
            **extra}
    r = httpx.post(live.base_url + CHAT, json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_required_streamed_through_the_openai_js_sdk(live):
    """The real `openai` JS SDK (pinned in frontend_probe/package.json) assembles our engine's
    streamed tool-call deltas into calls that satisfy their schemas."""
    script = (
        "const { default: OpenAI } = await import('openai');\n"
        "const [baseURL, model, tools] = process.argv.slice(1);\n"
        "const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });\n"
        "const stream = client.chat.completions.stream({ model, tools: JSON.parse(tools), "
        "tool_choice: 'required', temperature: 0, max_tokens: 60, messages: "
        "[{ role: 'user', content: 'What is the weather in Paris?' }] });\n"
        "const done = await stream.finalChatCompletion();\n"
        "console.log(JSON.stringify(done.choices[0]));\n")
    choice = json.loads(run_node(script, live.base_url + "/v1", live.model, json.dumps(TOOLS)))
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]
    for call in choice["message"]["tool_calls"]:
        assert call["id"].startswith("call_") and call["type"] == "function"
        _valid(call["function"]["name"], call["function"]["arguments"])
