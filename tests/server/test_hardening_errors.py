"""Every failure is answered in the OpenAI error shape with the right status, and releases
the request's tracing state, engine sequence and KV blocks (issue 13, item 8); the server
publishes its OpenAPI description (item 10)."""
from __future__ import annotations

import json

import httpx
import jsonschema_rs
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

URL = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "Hi"}]


def _chat(srv, **fields) -> bytes:
    return json.dumps({"model": srv.model, "max_tokens": 2, "messages": OK_MESSAGES,
                       **fields}).encode()


def _assert_released(srv) -> None:
    srv.wait_idle()
    assert srv.parts.obs.tracer.num_active == 0
    assert srv.engine.block_manager.num_used_blocks == 0
    assert not srv.engine.has_unfinished()


def _assert_openai_error(r: httpx.Response, status: int, type_: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == type_
    return error


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory()


HOSTILE_BODIES = {
    "integer_over_4300_digits": lambda srv: _chat(srv).replace(
        b'"max_tokens": 2', b'"max_tokens": ' + b"9" * 5000),
    "deeply_nested_json": lambda srv: _chat(srv).replace(
        b'"max_tokens": 2', b'"x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "max_tokens": 2'),
    "lone_surrogate_in_content": lambda srv: _chat(srv, messages=[
        {"role": "user", "content": "a\ud800b"}]),
    "lone_surrogate_in_prompt": lambda srv: json.dumps({
        "model": srv.model, "max_tokens": 2, "prompt": "\udfff"}).encode(),
    "seed_over_int64": lambda srv: _chat(srv, seed=2**64, temperature=1),
    "seed_under_int64": lambda srv: _chat(srv, seed=-(2**70), temperature=1),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_hostile_input_is_a_400_in_the_openai_shape(srv, name):
    body = HOSTILE_BODIES[name](srv)
    path = "/v1/completions" if b'"prompt"' in body else URL
    r = httpx.post(srv.base_url + path, content=body, timeout=60,
                   headers={"content-type": "application/json"})
    _assert_openai_error(r, 400, "invalid_request_error")
    _assert_released(srv)


def test_in_range_seed_still_serves(srv):
    r = httpx.post(srv.base_url + URL, content=_chat(srv, seed=2**63 - 1, temperature=1),
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    _assert_released(srv)


def test_internal_failure_is_a_500_in_the_openai_shape_and_releases_state(server_factory):
    srv = server_factory()

    def broken_add_request(*_args, **_kwargs):
        raise RuntimeError("simulated engine bug")
    srv.engine.add_request = broken_add_request
    r = httpx.post(srv.base_url + URL, content=_chat(srv), timeout=60,
                   headers={"content-type": "application/json"})
    error = _assert_openai_error(r, 500, "server_error")
    assert "simulated engine bug" not in error["message"]  # internals are logged, not sent
    _assert_released(srv)
    metrics = httpx.get(srv.base_url + "/metrics").text
    internal = [line for line in metrics.splitlines()
                if line.startswith("gen_ai_server_request_duration_seconds_count")
                and 'error_type="internal"' in line]
    assert internal and float(internal[0].rsplit(" ", 1)[1]) == 1.0


def test_openapi_describes_the_real_request_bodies(srv):
    r = httpx.get(srv.base_url + "/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert spec["openapi"].startswith("3.1.")
    # The OpenAPI 3.1 meta-schema that schemathesis itself checks documents against.
    jsonschema_rs.Draft202012Validator(OPENAPI_31).validate(spec)
    for path, model in ((URL, "ChatCompletionRequest"), ("/v1/completions", "CompletionRequest")):
        body = spec["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    assert {"temperature", "top_p", "max_tokens", "seed", "stream"} <= set(chat["properties"])
    assert "/docs" not in spec["paths"] and httpx.get(srv.base_url + "/docs").status_code == 404
