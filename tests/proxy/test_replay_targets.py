"""bench --replay against the other targets (issue 33): the proxy in front of the real
engine (the proxy's record joined by trace id), llama-server alone (no Server-Timing, so
client numbers only, and unknown fields like vLLM's `min_tokens` ignored) and the proxy in
front of llama-server (its `timings` as the joined record's prefill)."""
from __future__ import annotations

import asyncio
import json

import pytest

from proxy_support import running_llama_server, start_proxy
from tracer.bench.replay import ReplayConfig, run_replay
from tracer.proxy.cli import discover_model_names

# make test runs the tests marked llama_server last, once llama-server is built (Makefile).
pytestmark = [pytest.mark.timeout(400), pytest.mark.llama_server]
# Six requests: three share two blocks, the rest are their own; one pair arrives at once.
TRACE = [{"timestamp": t, "input_length": n, "output_length": 3, "hash_ids": ids}
         for t, n, ids in ((0, 40, [0, 1, 2]), (50, 40, [0, 1, 3]), (50, 24, [4, 5]),
                           (120, 40, [0, 1, 6]), (150, 20, [7, 8]), (200, 30, [9, 10]))]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in TRACE))
    return str(path)


def _replay(trace: str, base_url: str, model: str, **options) -> dict:
    return asyncio.run(run_replay(ReplayConfig(trace_path=trace, base_url=base_url,
                                               model=model, timeout_s=120, **options)))


def test_through_the_proxy_in_front_of_the_engine(server_factory, trace):
    live = server_factory()
    proxy = start_proxy(live.base_url, (live.model,))
    try:
        result = _replay(trace, proxy.base_url, live.model)
    finally:
        proxy.app.stop()
    assert result["summary"]["failed"] == 0
    assert result["metadata"]["num_joined"] == len(TRACE)
    for row in result["requests"]:
        assert row["output_tokens"] == 3
        assert row["server"]["source"] == "proxy"
        assert "upstream_connect" in row["server"]["stages_ms"], row["server"]


@pytest.fixture(scope="module")
def llama_server():
    with running_llama_server() as base_url:
        yield base_url


@pytest.mark.parametrize("server", ["llama-server", "vllm"])
def test_llama_server_alone_gives_client_numbers_and_exact_lengths(llama_server, trace,
                                                                   server):
    model = discover_model_names(llama_server, timeout_s=10)[0]
    result = _replay(trace, llama_server, model, server=server)
    assert result["summary"]["failed"] == 0, result["summary"]["failed_by_kind"]
    assert result["metadata"]["num_joined"] == 0      # no Server-Timing: nothing to join
    assert all(r["output_tokens"] == 3 and r["server"] is None for r in result["requests"])


def test_proxy_in_front_of_llama_server_joins_its_prefill(llama_server, trace):
    names = discover_model_names(llama_server, timeout_s=10)
    proxy = start_proxy(llama_server, names)
    try:
        result = _replay(trace, proxy.base_url, names[0], server="llama-server")
    finally:
        proxy.app.stop()
    assert result["summary"]["failed"] == 0
    assert result["metadata"]["num_joined"] == len(TRACE)
    assert all("prefill" in r["server"]["stages_ms"] for r in result["requests"])
