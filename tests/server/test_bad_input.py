"""Bad input gets the OpenAI error shape and the right status, never a 500; a client that
vanishes mid-stream aborts its request; the server keeps serving after all of it."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from instrumented_engine.server.app import ServerSettings
from tracer.web.observability import ObservabilitySettings

URL = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "Hi"}]


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"model": "M", "messages": "hello"}).encode(), "messages"),
    (json.dumps({"model": "M"}).encode(), "messages"),
    (json.dumps({"model": "M", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "M", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
     "messages.0.role"),
    (json.dumps({"model": "M", "messages": OK_MESSAGES, "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"model": "M", "messages": OK_MESSAGES, "max_tokens": -5}).encode(),
     "max_tokens"),
    (json.dumps({"model": "M", "messages": OK_MESSAGES, "top_p": 7}).encode(), "top_p"),
    (json.dumps({"model": "M", "messages": OK_MESSAGES, "temperature": "hot"}).encode(),
     "temperature"),
    (json.dumps({"model": "M", "messages": OK_MESSAGES, "n": 3}).encode(), "n"),
])
def test_malformed_requests_are_400(live, body, param):
    body = body.replace(b'"M"', json.dumps(live.model).encode())
    r = httpx.post(live.base_url + URL, content=body,
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 400, param)


def test_prompt_over_context_names_both_numbers(live):
    limit = live.engine.max_model_len
    long = "hello " * (limit + 100)
    r = httpx.post(live.base_url + URL, json={"model": live.model, "max_tokens": 4,
                                              "messages": [{"role": "user", "content": long}]},
                   timeout=60)
    error = assert_openai_error(r, 400)
    assert str(limit) in error["message"] and error["code"] == "context_length_exceeded"
    absurd = httpx.post(live.base_url + URL, json={"model": live.model, "messages": OK_MESSAGES,
                                                   "max_tokens": 10**9})
    assert str(10**9) in assert_openai_error(absurd, 400)["message"]


def test_unknown_model_is_404(live):
    r = httpx.post(live.base_url + URL, json={"model": "gpt-9", "messages": OK_MESSAGES})
    assert assert_openai_error(r, 404, "model")["code"] == "model_not_found"


def test_body_over_limit_is_413(live):
    r = httpx.post(live.base_url + URL, content=b"x" * ((1 << 20) + 1),
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 413)


def test_api_key_required_when_set(server_factory):
    srv = server_factory(ServerSettings(ObservabilitySettings(api_key="s3cret")))
    body = {"model": srv.model, "messages": OK_MESSAGES, "max_tokens": 2}
    assert_openai_error(httpx.post(srv.base_url + URL, json=body), 401)
    assert_openai_error(httpx.post(srv.base_url + URL, json=body,
                                   headers={"Authorization": "Bearer nope"}), 401)
    ok = httpx.post(srv.base_url + URL, json=body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert httpx.get(srv.base_url + "/health").status_code == 200


def test_client_disconnect_aborts_and_frees_blocks(live):
    body = json.dumps({"model": live.model, "stream": True, "max_tokens": 400,
                       "ignore_eos": True, "messages": OK_MESSAGES}).encode()
    host, port = live.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data: ") < 3:  # a few tokens in, then vanish
            received += sock.recv(65536)
        request_id = received.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode()
    live.wait_idle()
    assert live.engine.block_manager.num_used_blocks == 0
    record = live.parts.obs.store.get_by_request_id(request_id)
    assert record is not None and record.finish_reason == "abort"
    assert 0 < record.num_output_tokens < 400
    span = [s for s in live.spans.get_finished_spans()
            if s.name.startswith("chat ") and f"{s.context.span_id:016x}" == record.span_id]
    assert span and not span[0].status.is_ok
    metrics = httpx.get(live.base_url + "/metrics").text
    assert 'finish_reason="abort"' in metrics


def test_still_serving_after_abuse(live):
    r = httpx.post(live.base_url + URL, json={"model": live.model, "messages": OK_MESSAGES,
                                              "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert live.engine.block_manager.num_used_blocks == 0
