"""Template rendering and tokenizing never block the event loop, and an oversized prompt is
refused by its size before any tokenizing (issue 13, item 7)."""
from __future__ import annotations

import threading
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

URL = "/v1/chat/completions"


class _GatedTokenizer:
    """The real tokenizer, except that encoding a long text waits for the test's go-ahead:
    while it waits, whichever thread runs the tokenizer is stuck, as with a huge prompt."""

    def __init__(self, inner, min_chars: int) -> None:
        self._inner = inner
        self._min_chars = min_chars
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, text, *args, **kwargs):
        self.calls += 1
        if len(text) >= self._min_chars:
            self.entered.set()
            assert self.release.wait(120), "the test never released the tokenizer"
        return self._inner.encode(text, *args, **kwargs)


def test_health_answers_while_big_prompts_tokenize(server_factory):
    srv = server_factory()
    gate = _GatedTokenizer(srv.engine.tokenizer, min_chars=50_000)
    srv.engine.tokenizer = gate
    limit_bytes = srv.engine.max_prompt_bytes
    big = "lorem ipsum " * ((limit_bytes // 2) // 12)  # under the byte limit, over the context
    body = {"model": srv.model, "max_tokens": 2, "messages": [{"role": "user", "content": big}]}
    pool = ThreadPoolExecutor(4)
    try:
        futures = [pool.submit(httpx.post, srv.base_url + URL, json=body, timeout=120)
                   for _ in range(4)]
        assert gate.entered.wait(60), "no big prompt reached the tokenizer"
        health = httpx.get(srv.base_url + "/health", timeout=20)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert not any(f.done() for f in futures), "the big requests did not wait for the gate"
    finally:
        gate.release.set()
        responses = [f.result() for f in futures]
        pool.shutdown()
    for r in responses:
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    srv.wait_idle()


def test_prompt_over_the_byte_limit_is_refused_before_tokenizing(server_factory):
    srv = server_factory()
    gate = _GatedTokenizer(srv.engine.tokenizer, min_chars=1)
    gate.release.set()
    srv.engine.tokenizer = gate
    limit_bytes = srv.engine.max_prompt_bytes
    over = "é" * (limit_bytes // 2 + 1)  # two UTF-8 bytes each: over in bytes, not in chars
    for path, body, param in [
            (URL, {"messages": [{"role": "user", "content": over}]}, "messages"),
            ("/v1/completions", {"prompt": over}, "prompt")]:
        payload = json.dumps({"model": srv.model, "max_tokens": 2, **body}, ensure_ascii=False)
        r = httpx.post(srv.base_url + path, content=payload.encode(), timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["code"] == "context_length_exceeded"
        assert str(limit_bytes) in error["message"]
    assert gate.calls == 0
    assert srv.parts.obs.tracer.drain(30) and srv.parts.obs.tracer.num_active == 0
    ok = httpx.post(srv.base_url + URL, timeout=60, json={
        "model": srv.model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert ok.status_code == 200 and gate.calls == 1
