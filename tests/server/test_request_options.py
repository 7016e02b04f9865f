"""Options that change the output and are not implemented get a 400 naming them, never a 200
with the option dropped (issue 22, item 6); their no-op values and fields that change
nothing are accepted. Through the real app on loopback."""
from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def _post(live, path: str, extra: dict) -> httpx.Response:
    body = {"model": live.model, "max_tokens": 1, "temperature": 0, **extra}
    body.update({"messages": MESSAGES} if path == CHAT else {"prompt": "Hi"})
    return httpx.post(live.base_url + path, json=body, timeout=60)


@pytest.mark.parametrize("path, extra, param", [
    (CHAT, {"logprobs": True}, "logprobs"),
    (CHAT, {"logprobs": True, "top_logprobs": 5}, "logprobs"),
    (CHAT, {"top_logprobs": 3}, "top_logprobs"),
    (COMPLETIONS, {"logprobs": 0}, "logprobs"),
    (COMPLETIONS, {"logprobs": 5}, "logprobs"),
    # "required" and a named function are served: tests/server/test_tool_calls.py.
    (CHAT, {"tools": [TOOL]}, "tools"),
    (CHAT, {"tools": [TOOL], "tool_choice": "auto"}, "tools"),
    (CHAT, {"functions": [TOOL["function"]]}, "functions"),
    (CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "object"}}}}, "response_format"),
    (COMPLETIONS, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"logit_bias": {"42": 100}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"42": -100}}, "logit_bias"),
    (CHAT, {"presence_penalty": 1.5}, "presence_penalty"),
    (CHAT, {"frequency_penalty": -0.5}, "frequency_penalty"),
    (COMPLETIONS, {"frequency_penalty": 2}, "frequency_penalty"),
    (CHAT, {"repetition_penalty": 1.2}, "repetition_penalty"),
    (CHAT, {"min_p": 0.1}, "min_p"),
    (CHAT, {"guided_json": {"type": "object"}}, "guided_json"),
    (CHAT, {"modalities": ["text", "audio"]}, "modalities"),
    (CHAT, {"reasoning_effort": "high"}, "reasoning_effort"),
    (CHAT, {"chat_template": "{{ messages }}"}, "chat_template"),
    (COMPLETIONS, {"echo": True}, "echo"),
    (COMPLETIONS, {"best_of": 3}, "best_of"),
    (COMPLETIONS, {"suffix": " the end"}, "suffix"),
    (COMPLETIONS, {"skip_special_tokens": False}, "skip_special_tokens"),
])
def test_unimplemented_option_is_400_naming_it(live, path, extra, param):
    r = _post(live, path, extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["code"] == "unsupported_parameter" and f"`{param}`" in error["message"]


def test_refused_stream_is_refused_before_any_event(live):
    r = _post(live, CHAT, {"stream": True, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["param"] == "response_format"


def test_refused_request_reaches_no_engine(live):
    before = live.parts.obs.tracer.num_active, len(live.parts.obs.store.recent(1000))
    assert _post(live, CHAT, {"logprobs": True}).status_code == 400
    assert (live.parts.obs.tracer.num_active, len(live.parts.obs.store.recent(1000))) == before


@pytest.mark.parametrize("path, extra", [
    (CHAT, {"logprobs": False, "top_logprobs": 0}),
    (CHAT, {"logprobs": None}),
    (CHAT, {"tools": [TOOL], "tool_choice": "none"}),
    (CHAT, {"tool_choice": "auto"}),
    (CHAT, {"tools": [], "parallel_tool_calls": False}),
    (CHAT, {"response_format": {"type": "text"}}),
    (COMPLETIONS, {"response_format": {"type": "text"}}),
    (CHAT, {"logit_bias": {}}),
    (CHAT, {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1}),
    (COMPLETIONS, {"presence_penalty": 0, "best_of": 1, "echo": False, "suffix": None}),
    (CHAT, {"modalities": ["text"], "user": "u-1", "metadata": {"k": "v"}, "store": False,
            "service_tier": "auto", "seed": 7}),
    (CHAT, {"stream_options": {"include_usage": False}, "stream": False}),
    (CHAT, {"some_future_field": {"x": 1}}),
])
def test_no_op_values_are_accepted(live, path, extra):
    r = _post(live, path, extra)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
