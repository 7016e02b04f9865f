"""llama.cpp's `llama-server` behind the proxy, driven by the clients users have: the real
OpenAI SDK and a real Chromium running the demo page with the probe.

llama-server streams a role-only delta (`content: null`) before the first content, reports its
`timings` in the last chunk and, without `--metrics`, answers 501 on `/metrics`
(docs/reference.md, "llama.cpp server"). So: the text through the proxy is the text direct,
the role-only delta is not a token, the stages end in `prefill` from `timings` then `send`,
the proxy's TTFT is at most the client's, and an upstream without a metrics page adds
nothing to ours. The binary and how it runs: `proxy_support.running_llama_server`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from proxy_support import running_llama_server, start_proxy
from tracer.proxy.cli import discover_model_names
from tracer.record.stages import CLIENT_STAGES

# make test runs the tests marked llama_server last, once llama-server is built (Makefile).
pytestmark = pytest.mark.llama_server

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REPO = Path(__file__).resolve().parents[2]
JOINED_STAGES = ["receive", "upstream_connect", "upstream_other", "prefill", "send"]


@pytest.fixture(scope="module")
def llama_server():
    with running_llama_server() as base_url:
        yield base_url


@pytest.fixture(scope="module")
def model(llama_server) -> str:
    (name,) = discover_model_names(llama_server, timeout_s=10)
    return name


@pytest.fixture(scope="module")
def proxy(llama_server, model):
    live = start_proxy(llama_server, (model,))
    yield live
    live.app.stop()


def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def stream_chat(base_url: str, model: str) -> tuple[list[str], str, float]:
    """(content pieces, finish reason, client TTFT in s); the clock starts before sending."""
    start_s, first_s, pieces, reason = time.perf_counter(), None, [], None
    for chunk in sdk(base_url).chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=12, temperature=0.0, stream=True):
        text = chunk.choices[0].delta.content if chunk.choices else None
        reason = (chunk.choices[0].finish_reason if chunk.choices else None) or reason
        if text:
            first_s = first_s or time.perf_counter()
            pieces.append(text)
    return pieces, reason, first_s - start_s


def test_streamed_text_is_identical_and_ttft_is_bracketed(llama_server, model, proxy):
    assert proxy.parts.obs.tracer.model_names == (model,)           # discovered from /v1/models
    direct, direct_reason, _ = stream_chat(llama_server, model)  # also warms the model up
    proxied, reason, client_ttft_s = stream_chat(proxy.base_url, model)
    assert "".join(proxied) == "".join(direct) and "".join(direct).strip()
    assert reason == direct_reason == "length"
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(5)
    assert (record.source, record.model, record.finish_reason) == ("proxy", model, reason)
    assert [s.stage for s in record.stages] == JOINED_STAGES
    assert record.unattributed_ns == 0
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert record.ttft_ns <= client_ttft_s * 1e9
    # The role-only delta llama-server sends first is not a token: one emit per content
    # chunk the SDK saw.
    assert record.itl.count + 1 == len(proxied) == record.num_output_tokens


def test_non_streamed_content_is_identical(llama_server, model, proxy):
    def ask(base_url: str) -> str:
        answer = sdk(base_url).chat.completions.create(model=model, messages=MESSAGES,
                                                       max_tokens=12, temperature=0.0)
        return answer.choices[0].message.content
    direct = ask(llama_server)
    assert ask(proxy.base_url) == direct and direct
    proxy.wait_idle()
    record = proxy.parts.obs.store.recent(1)[0]
    assert record.stages[0].stage == "receive" and record.stages[-1].stage == "send"
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
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
    assert record.stages[-1].stage == "send"
    in_hand_ns = record.stages[-1].start_ns
    assert record.client["client_ttft_ms"] >= (in_hand_ns - record.start_ns) / 1e6
    assert {*CLIENT_STAGES, *JOINED_STAGES} <= set(result["waterfallLabels"])
