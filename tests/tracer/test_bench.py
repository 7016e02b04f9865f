"""The load generator end to end, against a tiny OpenAI-compatible SSE server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tracer.bench.runner import BenchConfig, arrival_offsets_s, run_bench
from tracer.bench.prompts import PromptSpec, build_request_body, make_prompts

REPO_ROOT = Path(__file__).resolve().parents[2]
FIRST_TOKEN_DELAY_S = 0.02   # the fake "prefill": the role-only chunk comes before it
CHUNK_GAP_S = 0.002


def _sse(event: dict | str) -> str:
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n"


class FakeOpenAIServer:
    """Streams a role-only chunk, max_tokens content chunks, a finish chunk, usage, [DONE].

    `plan(n)` picks the behaviour of the n-th request to arrive: ok, http_500, cut (connection
    dropped mid-stream), no_done (clean end without [DONE]) or hang (no content, ever).
    With `num_barrier`, the first content waits until that many streams are open at once.
    """

    def __init__(self, plan=lambda n: "ok", num_barrier: int = 0) -> None:
        self.plan, self.num_barrier = plan, num_barrier
        self.bodies: list[dict] = []
        self.auth_headers: list[str | None] = []
        self.arrivals_s: list[float] = []
        self.in_flight = self.max_in_flight = 0
        self._barrier = asyncio.Event()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)
        self.app.post("/v1/completions")(self._completions)

    async def _chat(self, request: Request):
        return await self._handle(request, is_chat=True)

    async def _completions(self, request: Request):
        return await self._handle(request, is_chat=False)

    async def _handle(self, request: Request, is_chat: bool):
        body = await request.json()
        behaviour = self.plan(len(self.bodies))
        self.bodies.append(body)
        self.auth_headers.append(request.headers.get("authorization"))
        self.arrivals_s.append(time.perf_counter())
        if behaviour == "http_500":
            error = {"message": "planned failure", "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=500)
        return StreamingResponse(self._stream(body, is_chat, behaviour), media_type="text/event-stream")

    def _choice(self, is_chat: bool, text: str, role: str | None = None, finish: str | None = None):
        if is_chat:
            delta = {"content": text} | ({"role": role} if role else {})
            return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    async def _stream(self, body: dict, is_chat: bool, behaviour: str):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.num_barrier and self.in_flight >= self.num_barrier:
            self._barrier.set()
        try:
            yield _sse(self._choice(is_chat, "", role="assistant"))   # the TTFT trap
            if behaviour == "hang":
                await asyncio.Event().wait()
            if self.num_barrier:
                # Bounded: if the client never opens enough streams, max_in_flight shows it.
                await asyncio.wait_for(self._barrier.wait(), timeout=5)
            await asyncio.sleep(FIRST_TOKEN_DELAY_S)
            for i in range(body["max_tokens"]):
                if behaviour == "cut" and i == 2:
                    raise ConnectionAbortedError("planned cut")
                yield _sse(self._choice(is_chat, f" tok{i}"))
                await asyncio.sleep(CHUNK_GAP_S)
            yield _sse(self._choice(is_chat, "", finish="length"))
            prompt = json.dumps(body.get("messages") or body.get("prompt"))
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": body["max_tokens"]}
            yield _sse({"choices": [], "usage": usage})
            if behaviour != "no_done":
                yield _sse("[DONE]")
        finally:
            self.in_flight -= 1

    def __enter__(self) -> "FakeOpenAIServer":
        # Bound and listening before the thread starts: early connections wait in the backlog,
        # so no readiness polling is needed.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="critical", lifespan="off", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        self._sock = sock
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        assert not self._thread.is_alive(), "fake server did not stop"


def _config(server: FakeOpenAIServer, **overrides) -> BenchConfig:
    settings = dict(base_url=server.base_url, model="fake", num_requests=8, prompt_tokens=16,
                    output_tokens=4, timeout_s=10.0)
    return BenchConfig(**(settings | overrides))


def test_concurrency_4_counts_completions_and_failures_by_kind():
    faults = {5: "http_500", 9: "http_500", 7: "cut", 12: "no_done"}
    with FakeOpenAIServer(plan=lambda n: faults.get(n, "ok"), num_barrier=4) as server:
        result = asyncio.run(run_bench(_config(server, num_requests=16, concurrency=4)))
    summary = result.summary
    assert (summary["completed"], summary["failed"]) == (12, 4)
    assert summary["failed_by_kind"] == {"broken_stream": 2, "http_error": 2}
    assert server.max_in_flight == 4        # the barrier needs 4; the cap forbids a 5th
    assert sorted(r.index for r in result.results) == list(range(16))
    assert {r.status_code for r in result.results if r.error_kind == "http_error"} == {500}
    done = [r for r in result.results if r.ok]
    # The role-only chunk arrives before the fake prefill; TTFT must not start there.
    assert min(r.ttft_s for r in done) >= FIRST_TOKEN_DELAY_S - 0.002
    assert all(r.num_output_tokens == 4 and len(r.content_ns) == 4 for r in done)
    assert summary["total_output_tokens"] == 12 * 4
    assert summary["p50_ttft_ms"] <= summary["p99_ttft_ms"] <= summary["p99_e2e_ms"]
    assert summary["mean_itl_ms"] > 0 and summary["mean_tpot_ms"] > 0


def test_poisson_rate_paces_arrivals_and_completes_all():
    num_requests, rate = 10, 40.0
    offsets_s = arrival_offsets_s(num_requests, rate, seed=3)
    with FakeOpenAIServer() as server:
        result = asyncio.run(run_bench(_config(server, num_requests=num_requests, request_rate=rate,
                                               seed=3, endpoint="completions")))
    assert result.summary["completed"] == num_requests and result.summary["failed"] == 0
    # asyncio.sleep never wakes early, so the server cannot see the last arrival sooner.
    assert server.arrivals_s[-1] - server.arrivals_s[0] >= offsets_s[-1] - 0.02
    assert result.duration_s >= offsets_s[-1]
    assert all("prompt" in body and "messages" not in body for body in server.bodies)


def test_arrival_offsets_are_seeded_gamma_with_mean_interval_one_over_rate():
    offsets_s = arrival_offsets_s(4001, 20.0, burstiness=1.0, seed=1)
    assert offsets_s == arrival_offsets_s(4001, 20.0, burstiness=1.0, seed=1)
    assert offsets_s != arrival_offsets_s(4001, 20.0, burstiness=1.0, seed=2)
    assert offsets_s[0] == 0.0 and offsets_s == sorted(offsets_s)
    assert offsets_s[-1] / 4000 == pytest.approx(1 / 20.0, rel=0.06)
    assert arrival_offsets_s(3, None) == [0.0, 0.0, 0.0]


def test_shared_prefix_is_really_shared_and_warmup_is_excluded():
    with FakeOpenAIServer() as server:
        config = _config(server, num_requests=5, num_warmup=2, concurrency=2, prompt_tokens=40,
                         shared_prefix_ratio=0.5, api_key="k-123")
        result = asyncio.run(run_bench(config))
    assert len(server.bodies) == 7 and len(result.results) == 5
    systems = [b["messages"][0]["content"] for b in server.bodies]
    users = [b["messages"][1]["content"] for b in server.bodies]
    assert len(set(systems)) == 1 and len(systems[0].split()) == 20
    assert len(set(users)) == 7 and all(len(u.split()) == 20 for u in users)
    # Warm-up runs first and uses the indices after the measured ones.
    assert sorted(u.split()[0] for u in users[:2]) == ["#5", "#6"]
    assert sorted(r.index for r in result.results) == [0, 1, 2, 3, 4]
    assert set(server.auth_headers) == {"Bearer k-123"}
    body = server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 4 and body["temperature"] == 0 and body["ignore_eos"] is True


def test_prompts_are_deterministic_and_ratio_one_makes_them_identical():
    spec = PromptSpec(num_prompt_tokens=30, shared_prefix_ratio=1 / 3, seed=9)
    assert make_prompts(spec, 4) == make_prompts(spec, 4)
    assert make_prompts(spec, 2, first_index=2) == make_prompts(spec, 4)[2:]
    everything_shared = make_prompts(PromptSpec(30, 1.0, 9), 3)
    assert len({p.as_text() for p in everything_shared}) == 1
    text_body = build_request_body("completions", "m", make_prompts(spec, 1)[0], 8)
    assert len(text_body["prompt"].split()) == 30


def test_timeouts_and_connection_errors_fail_by_kind_and_the_run_ends():
    with FakeOpenAIServer(plan=lambda n: "hang") as server:
        started_s = time.perf_counter()
        result = asyncio.run(run_bench(_config(server, num_requests=2, concurrency=2, timeout_s=0.3)))
        assert time.perf_counter() - started_s < 5
    assert result.summary["failed_by_kind"] == {"timeout": 2}
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()   # nothing listens on this port now
    refused = asyncio.run(run_bench(BenchConfig(base_url=f"http://127.0.0.1:{port}", model="m",
                                                num_requests=2, timeout_s=5)))
    assert refused.summary["failed_by_kind"] == {"connect_error": 2}
    assert refused.summary["completed"] == 0


def test_config_rejects_bad_values():
    for bad in (dict(num_requests=0), dict(shared_prefix_ratio=1.5), dict(endpoint="embeddings"),
                dict(request_rate=0), dict(concurrency=0), dict(timeout_s=0)):
        with pytest.raises(ValueError):
            BenchConfig(**(dict(base_url="http://x", model="m") | bad))


def test_cli_runs_as_subprocess_and_writes_json(tmp_path):
    out_path = tmp_path / "nested" / "bench.json"
    with FakeOpenAIServer(plan=lambda n: "http_500" if n == 4 else "ok") as server:
        proc = subprocess.run(
            [sys.executable, "-m", "tracer", "bench", "--base-url", server.base_url + "/v1",
             "--model", "fake", "--concurrency", "2", "--num-requests", "6", "--warmup", "1",
             "--prompt-tokens", "12", "--output-tokens", "3", "--api-key", "secret",
             "--no-progress", "--output-json", str(out_path)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Serving Benchmark Result" in proc.stdout and "P95 TTFT (ms):" in proc.stdout
    report = json.loads(out_path.read_text())
    assert set(report) == {"config", "summary", "requests"}
    assert report["config"]["api_key"] == "***" and "secret" not in out_path.read_text()
    assert report["summary"]["completed"] == 5 and report["summary"]["failed_by_kind"] == {"http_error": 1}
    rows = report["requests"]
    assert len(rows) == 6 and {"ttft_ms", "tpot_ms", "e2e_ms", "itl_ms", "error_kind"} <= set(rows[0])
    assert sum(row["ok"] for row in rows) == 5
    assert all(len(row["itl_ms"]) == 2 for row in rows if row["ok"])
