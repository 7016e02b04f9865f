"""A real foreign engine behind the proxy: the llama.cpp server of `llama-cpp-python[server]`
(a subprocess on loopback) serving the default SmolLM2 GGUF, driven by the real OpenAI SDK.

llama-cpp-python streams a role-only delta before the first content and reports neither
llama.cpp's `timings` nor a `/metrics` page (docs/reference.md, "llama.cpp server"), so the TTFT
bounds checked here are: upstream headers (the proxy's `upstream_ttfb` mark) ≤ the first
content chunk at the upstream hop ≤ the proxy's TTFT ≤ the client's TTFT.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from proxy_support import closed_port, smollm2_gguf, start_proxy, wait_until
from tracer.proxy.cli import discover_model_names
from tracer.record.stages import CLIENT_STAGES, PROXY_STAGES

ALIAS = "smollm2"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama_server():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail("llama-cpp-python is missing: CMAKE_ARGS=-DGGML_NATIVE=OFF "
                    "pip install 'llama-cpp-python[server]'")
    port = closed_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()),
         "--model_alias", ALIAS, "--chat_format", "chatml", "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--seed", "0", "--verbose", "False",
         # One thread: llama.cpp's threads spin at barriers, and on two shared cores a
         # second one makes each token seconds slow instead of milliseconds.
         "--n_threads", "1", "--n_threads_batch", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        up = wait_until(lambda: process.poll() is not None or _answers(base_url), timeout_s=60)
        assert up and process.poll() is None, process.stderr.read().decode()[-2000:]
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/v1/models", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def proxy(llama_server):
    live = start_proxy(llama_server, discover_model_names(llama_server, timeout_s=10))
    yield live
    live.app.stop()


def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def stream_chat(base_url: str) -> tuple[list[str], str, float]:
    """(content pieces, finish reason, client TTFT in s); the clock starts before sending."""
    start_s, first_s, pieces, reason = time.perf_counter(), None, [], None
    for chunk in sdk(base_url).chat.completions.create(
            model=ALIAS, messages=MESSAGES, max_tokens=12, temperature=0.0, stream=True):
        text = chunk.choices[0].delta.content if chunk.choices else None
        reason = (chunk.choices[0].finish_reason if chunk.choices else None) or reason
        if text:
            first_s = first_s or time.perf_counter()
            pieces.append(text)
    return pieces, reason, first_s - start_s


def test_streamed_text_is_identical_and_ttft_is_bracketed(llama_server, proxy):
    assert proxy.parts.obs.tracer.model_names == (ALIAS,)           # discovered from /v1/models
    direct, direct_reason, _ = stream_chat(llama_server)         # also warms the model up
    proxied, reason, client_ttft_s = stream_chat(proxy.base_url)
    assert "".join(proxied) == "".join(direct) and "Paris" in "".join(direct)
    assert reason == direct_reason
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(5)
    assert (record.source, record.model, record.finish_reason) == ("proxy", ALIAS, reason)
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert record.unattributed_ns == 0
    ends_ns = {s.stage: s.end_ns - record.start_ns for s in record.stages}
    assert ends_ns["upstream_ttfb"] <= ends_ns["upstream_first_token"] <= record.ttft_ns
    assert record.ttft_ns <= client_ttft_s * 1e9
    # The role-only delta llama-cpp-python sends first is not a token: one emit per content
    # chunk the SDK saw, and the usage the upstream does not send is counted from them.
    assert record.itl.count + 1 == len(proxied) == record.num_output_tokens


def test_non_streamed_content_is_identical(llama_server, proxy):
    def ask(base_url: str) -> str:
        answer = sdk(base_url).chat.completions.create(model=ALIAS, messages=MESSAGES,
                                                       max_tokens=12, temperature=0.0)
        return answer.choices[0].message.content
    direct = ask(llama_server)
    assert ask(proxy.base_url) == direct and direct
    proxy.wait_idle()
    record = proxy.parts.obs.store.recent(1)[0]
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert record.num_prompt_tokens > 0 and record.attrs["stream"] is False


def test_an_engine_without_metrics_page_adds_nothing(proxy):
    body = httpx.get(proxy.base_url + "/metrics").text
    assert "llm_upstream_metrics_up 0.0" in body and "llamacpp:" not in body


def test_the_probe_in_chromium_through_the_proxy(proxy):
    """The demo page, served by the proxy, chats through it; the browser's beacon is joined
    to the proxied trace and the /ui waterfall draws the proxy stages and the client's."""
    node, driver = shutil.which("node"), REPO / "tests" / "integration" / "browser_driver.mjs"
    if node is None or not (REPO / "frontend_probe" / "node_modules" / "playwright-core").is_dir():
        pytest.fail("the browser stack is missing: apt-get install -y chromium nodejs npm; "
                    "cd frontend_probe && npm install")
    out_dir = REPO / ".test-output" / "proxy_browser"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    opts = {"baseUrl": proxy.base_url, "outDir": str(out_dir), "maxTokens": 6,
            "prompt": "What is the capital of France?", "timeoutMs": 90_000}
    run = subprocess.run([node, str(driver), json.dumps(opts)], capture_output=True, text=True,
                         timeout=150, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["pageErrors"] == [] and result["clientJoined"], result
    record = proxy.parts.obs.store.get(result["traceId"])
    assert record.source == "proxy" and record.client["outcome"] == "ok"
    # Causality: the browser cannot see the first token before the proxy had it in hand. (The
    # proxy's `send` mark is read when its coroutine resumes after the ASGI send returned; on
    # a loaded 2-core machine that resumption can trail the browser's receipt by a few ms.)
    in_hand_ns = next(s.end_ns for s in record.stages if s.stage == "upstream_first_token")
    assert record.client["client_ttft_ms"] >= (in_hand_ns - record.start_ns) / 1e6
    assert {*CLIENT_STAGES, *PROXY_STAGES} <= set(result["waterfallLabels"])
