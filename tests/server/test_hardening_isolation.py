"""One hostile request never fails its neighbours (issue 13, item 1): sampling parameters that
float32 cannot represent are bounded at the door, and a failure while sampling one sequence
fails that sequence alone, in the OpenAI error shape."""
from __future__ import annotations

import threading
import time

import httpx

from instrumented_engine.engine.sampler import Sampler

URL = "/v1/chat/completions"
ASK = [{"role": "user", "content": "Name three colours."}]


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        threading.Event().wait(0.01)


def _bystanders(srv, n: int, max_tokens: int) -> tuple[list[threading.Thread], list]:
    results: list = [None] * n

    def one(i: int) -> None:
        body = {"model": srv.model, "messages": ASK, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        results[i] = httpx.post(srv.base_url + URL, json=body, timeout=120)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    # All of them in the engine before the hostile one arrives: they share its batches.
    _wait_until(lambda: srv.parts.aengine.stats()[0] >= n)
    return threads, results


def _assert_completed(results, max_tokens: int) -> None:
    for r in results:
        assert r is not None and r.status_code == 200, r and r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == max_tokens


def test_unrepresentable_temperature_and_top_p_do_not_fail_bystanders(server_factory):
    srv = server_factory()
    greedy = httpx.post(srv.base_url + URL, timeout=60, json={
        "model": srv.model, "messages": ASK, "max_tokens": 4, "temperature": 0})
    threads, results = _bystanders(srv, 3, max_tokens=40)
    hostile = [httpx.post(srv.base_url + URL, timeout=60, json={
        "model": srv.model, "messages": ASK, "max_tokens": 4, **params})
        for params in ({"temperature": 1e-300}, {"top_p": 1e-310}, {"temperature": 5e-324})]
    for t in threads:
        t.join(120)
    _assert_completed(results, 40)
    for r in hostile:
        assert r.status_code == 200, r.text
    # A top_p below every token's mass keeps the most likely token: greedy decoding.
    assert (hostile[1].json()["choices"][0]["message"]["content"]
            == greedy.json()["choices"][0]["message"]["content"])
    srv.wait_idle()
    assert srv.engine.block_manager.num_used_blocks == 0
    assert srv.parts.aengine.step_errors == 0


class _PoisoningSampler(Sampler):
    """Turns the logits of requests marked with top_k=7 into NaN, as a numerical fault in the
    forward pass would; the sampler must fail those rows alone."""

    def sample_isolated(self, logits, params, generators, grammars=None):
        marked = [i for i, p in enumerate(params) if p.top_k == 7]
        if marked:
            logits = logits.clone()
            logits[marked] = float("nan")
        return super().sample_isolated(logits, params, generators, grammars)


def test_sampling_failure_fails_only_its_own_request(server_factory):
    srv = server_factory()
    srv.engine.sampler = _PoisoningSampler()
    threads, results = _bystanders(srv, 3, max_tokens=30)
    marked = {"model": srv.model, "messages": ASK, "max_tokens": 4, "top_k": 7, "temperature": 1}
    failed = httpx.post(srv.base_url + URL, json=marked, timeout=60)
    with httpx.stream("POST", srv.base_url + URL, json={**marked, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    for t in threads:
        t.join(120)
    _assert_completed(results, 30)
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    assert '"error"' in events[-1] and "[DONE]" not in events[-1]
    srv.wait_idle()
    assert srv.engine.block_manager.num_used_blocks == 0
    metrics = httpx.get(srv.base_url + "/metrics").text
    internal = [line for line in metrics.splitlines()
                if line.startswith("gen_ai_server_request_duration_seconds_count")
                and 'error_type="internal"' in line]
    assert internal and float(internal[0].split()[-1]) == 2.0


def test_forward_pass_failure_fails_only_the_sequence_that_breaks_it(server_factory):
    srv = server_factory()
    hostile_text = "Xylophonist quokka"
    bystander_ids = set(srv.engine.tokenize(srv.engine.render_chat(ASK), add_bos=False))
    poison = set(srv.engine.tokenizer.encode(hostile_text, add_bos=False)) - bystander_ids
    assert poison
    real_execute = srv.engine.runner.execute

    def execute(items):  # a kernel fault on this input, wherever it is batched
        if any(poison.intersection(item.token_ids) for item in items):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_execute(items)
    srv.engine.runner.execute = execute
    threads, results = _bystanders(srv, 3, max_tokens=30)
    failed = httpx.post(srv.base_url + URL, timeout=60, json={
        "model": srv.model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": hostile_text}]})
    for t in threads:
        t.join(120)
    _assert_completed(results, 30)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert srv.parts.aengine.step_errors >= 1
    srv.wait_idle()
    assert srv.engine.block_manager.num_used_blocks == 0
    after = httpx.post(srv.base_url + URL, timeout=60, json={
        "model": srv.model, "messages": ASK, "max_tokens": 2, "temperature": 0})
    assert after.status_code == 200
