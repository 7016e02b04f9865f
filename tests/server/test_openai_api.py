"""The OpenAI-compatible surface, driven by the real `openai` SDK and raw SSE."""
from __future__ import annotations

import json

import httpx
import torch
import openai

from tracer.web.observability import ObservabilitySettings
from instrumented_engine.server.app import ServerSettings

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0)


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_sdk_stream_equals_non_stream(live):
    c = client(live)
    whole = c.chat.completions.create(model=live.model, messages=MESSAGES, temperature=0,
                                      max_tokens=24)
    parts = [chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
        model=live.model, messages=MESSAGES, temperature=0, max_tokens=24, stream=True)
        if chunk.choices]
    assert "Paris" in whole.choices[0].message.content
    assert "".join(parts) == whole.choices[0].message.content
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 10


def test_completions_endpoint_streams_same_text(live):
    c = client(live)
    whole = c.completions.create(model=live.model, prompt="The capital of France is",
                                 temperature=0, max_tokens=8)
    streamed = "".join(chunk.choices[0].text for chunk in c.completions.create(
        model=live.model, prompt="The capital of France is", temperature=0, max_tokens=8,
        stream=True) if chunk.choices)
    assert streamed == whole.choices[0].text != ""


def test_first_event_carries_role_and_content_and_usage_is_last(live):
    body = {"model": live.model, "messages": MESSAGES, "temperature": 0, "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] != ""
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_models_health_and_response_headers(live):
    models = httpx.get(live.base_url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [live.model]
    # The test server runs the fp32 reference path: what the CPU offers is named all the same.
    runtime = models["data"][0]["engine"]
    assert runtime["device"] == "cpu" and runtime["dtype"] == "float32"
    assert runtime["weight_formats"] == ["dense"] and runtime["fused_cpu_ops"] is False
    assert runtime["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert httpx.get(live.base_url + "/health").json() == {"status": "ok"}
    head = httpx.head(live.base_url + "/health")   # RFC 9110 §9.3.2: as GET, no content
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["content-length"]) == len(b'{"status":"ok"}')
    r = httpx.post(live.base_url + "/v1/chat/completions",
                   json={"model": live.model, "messages": MESSAGES, "max_tokens": 2})
    assert r.headers["server-timing"].startswith("trace;desc=00-")
    assert r.headers["x-request-id"] == r.json()["id"]
    assert "access-control-allow-origin" not in r.headers  # CORS off by default


def test_cors_allow_list_exposes_trace_headers(server_factory):
    origin = "http://chat.example"
    srv = server_factory(ServerSettings(observability=ObservabilitySettings(cors_origins=(origin,))))
    pre = httpx.options(srv.base_url + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,traceparent"})
    assert pre.status_code == 200
    assert "traceparent" in pre.headers["access-control-allow-headers"].lower()
    r = httpx.post(srv.base_url + "/v1/chat/completions", headers={"Origin": origin},
                   json={"model": srv.model, "messages": MESSAGES, "max_tokens": 2})
    exposed = r.headers["access-control-expose-headers"].lower()
    assert "server-timing" in exposed and "x-request-id" in exposed
    assert r.headers["timing-allow-origin"] == origin
    evil = httpx.post(srv.base_url + "/v1/chat/completions", headers={"Origin": "http://evil"},
                      json={"model": srv.model, "messages": MESSAGES, "max_tokens": 2})
    assert "access-control-allow-origin" not in evil.headers
