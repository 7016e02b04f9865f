"""Issue 34, item 4: speculative decoding on a REAL llama.cpp `llama-server` behind the proxy.

The server runs with a draft model (`-md`, the same SmolLM2 GGUF, so the draft and the
target agree on almost every token) and `--spec-type draft-simple`; its last chunk's
`timings` then carry `draft_n` and `draft_n_accepted` (tools/server/server-task.cpp,
`result_timings::to_json`, cited in tracer/engines/llamacpp.py). They must reach the record,
the counters and the `/ui` view, equal to what the server said.
"""
from __future__ import annotations

import httpx
import pytest

from proxy_support import running_llama_server, smollm2_gguf, start_proxy, stream_timings
from tracer.proxy.cli import discover_model_names

# make test runs the tests marked llama_server last, once llama-server is built (Makefile).
pytestmark = pytest.mark.llama_server


@pytest.fixture(scope="module")
def drafting_llama_server():
    gguf = str(smollm2_gguf())
    with running_llama_server("-md", gguf, "--spec-type", "draft-simple",
                              "--threads-draft", "1") as base_url:
        yield base_url


def test_draft_acceptance_is_on_the_record(drafting_llama_server):
    names = discover_model_names(drafting_llama_server, timeout_s=10)
    proxy = start_proxy(drafting_llama_server, names)
    try:
        body = {"model": names[0], "stream": True, "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": "Count from 1 to 20."}]}
        timings, trace_id = stream_timings(proxy.base_url, body)
        assert timings["draft_n"] > 0, timings      # the server drafted
        proxy.wait_idle(timeout_s=30)
        record = proxy.parts.obs.store.get(trace_id)
        assert (record.num_draft_tokens, record.num_draft_accepted) == (
            timings["draft_n"], timings["draft_n_accepted"])
        assert record.draft_acceptance == timings["draft_n_accepted"] / timings["draft_n"]
        assert record.tpot_ns is not None
        assert proxy.metric("llm_draft_tokens_total", model=names[0]) == timings["draft_n"]
        assert proxy.metric("llm_draft_accepted_tokens_total",
                            model=names[0]) == timings["draft_n_accepted"]
        # What /ui's facts panel reads, beside TPOT.
        view = httpx.get(f"{proxy.base_url}/ui/api/trace/{trace_id}", timeout=10).json()
        assert (view["num_draft_tokens"], view["num_draft_accepted"]) == (
            timings["draft_n"], timings["draft_n_accepted"])
        assert view["tpot_ms"] == record.tpot_ns / 1e6
    finally:
        proxy.app.stop()
