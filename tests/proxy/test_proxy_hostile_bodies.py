"""Issue 22 item 5: hostile request bodies on the proxy's completion paths are a 400 in the
OpenAI shape (or, when the body is JSON the proxy can read, the upstream's answer), never a
500, and leave no request behind. The bodies are the engine's (tests/server/
test_hardening_errors.py, "HOSTILE_BODIES") plus generated ones: nesting of any depth and
kind at any place, huge integers, non-finite numbers, lone surrogates, bytes that are not
UTF-8, truncations. Bounded: a fixed number of examples per path, one proxy for all.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer.testing.fake_upstream import MODEL

PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
EXAMPLES_PER_PATH = 40
BASE = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


def _nest(depth: int, kind: str) -> bytes:
    opener, closer = (b"[", b"]") if kind == "array" else (b'{"a":', b"}")
    return opener * depth + b"0" + closer * depth


@st.composite
def hostile_body(draw) -> bytes:
    head = json.dumps(BASE).encode()[:-1]   # the object, still open
    kind = draw(st.sampled_from(("deep", "huge_int", "non_finite", "surrogate", "not_utf8",
                                 "truncated", "not_object")))
    if kind == "deep":
        nested = _nest(draw(st.integers(900, 100_000)), draw(st.sampled_from(("array", "object"))))
        return nested if draw(st.booleans()) else head + b', "x": ' + nested + b"}"
    if kind == "huge_int":
        return head + b', "seed": ' + b"9" * draw(st.integers(4301, 20_000)) + b"}"
    if kind == "non_finite":
        return head + b', "temperature": ' + draw(st.sampled_from((b"NaN", b"Infinity",
                                                                   b"-Infinity", b"1e400"))) + b"}"
    if kind == "surrogate":
        return head + b', "prompt": "\\ud800\\udfff\\udc00x"}'
    if kind == "not_utf8":
        return head + b', "prompt": "' + draw(st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80"))) + b'"}'
    if kind == "truncated":
        whole = json.dumps(BASE).encode()
        return whole[:draw(st.integers(0, len(whole) - 1))]
    return draw(st.sampled_from((b"[]", b"1", b'"s"', b"null", b"[" * 5000)))


@pytest.fixture(scope="module")
def proxy():
    from proxy_support import start_proxy
    from tracer.testing.fake_upstream import FakeUpstream
    upstream = FakeUpstream(chunks=2, gap_ms=0).start()
    live = start_proxy(upstream.base_url, (MODEL,))
    yield live
    live.app.stop()
    upstream.stop()


def _check(response: httpx.Response) -> None:
    assert response.status_code in (200, 400), (response.status_code, response.text[:300])
    if response.status_code == 400:
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")


@pytest.mark.parametrize("path", PATHS)
def test_the_engines_deep_body_is_a_400_invalid_json(proxy, path):
    body = json.dumps(BASE).encode().replace(
        b'"max_tokens": 2', b'"x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "max_tokens": 2')
    response = httpx.post(proxy.base_url + path, content=body, timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:300]
    _check(response)
    proxy.wait_idle()


@pytest.mark.parametrize("path", PATHS)
def test_hostile_bodies_never_break_the_proxy(proxy, path):
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        @settings(max_examples=EXAMPLES_PER_PATH, deadline=None, database=None,
                  derandomize=True, suppress_health_check=list(HealthCheck))
        @given(body=hostile_body())
        def run(body: bytes) -> None:
            _check(client.post(path, content=body, headers={"content-type": "application/json"}))
        run()
    proxy.wait_idle()
    assert proxy.parts.obs.tracer.sink_failures == {}
