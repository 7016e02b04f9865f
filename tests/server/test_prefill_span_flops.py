"""A real request's prefill span carries its FLOPs, counted from SmolLM2's shape, and the
rates derived from them."""
from __future__ import annotations

import time

import httpx
import pytest

from instrumented_engine.model.flops import FlopCounter


def test_prefill_span_has_flops_and_rates(live):
    body = {"model": live.model, "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": "Count the FLOPs of this prompt."}]}
    with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        list(response.iter_lines())
    live.wait_idle()
    [record] = [r for r in live.parts.obs.store.recent(100)
                if r.num_prompt_tokens and r.finish_reason == "length"][-1:]
    spans: list = []
    deadline = time.monotonic() + 30   # spans may be built after the record is stored
    while not spans and time.monotonic() < deadline:
        spans = [s for s in live.spans.get_finished_spans()
                 if s.name == "llm.prefill" and f"{s.context.trace_id:032x}" == record.trace_id]
        time.sleep(0.01)   # polling a condition with a deadline
    [span] = spans
    attrs = span.attributes
    computed = record.num_prompt_tokens - record.num_cached_tokens
    counter = FlopCounter.of(live.engine.loaded.config)
    assert attrs["llm.prefill.flops"] == counter.chunk(computed, record.num_cached_tokens, 1)
    duration_s = (span.end_time - span.start_time) / 1e9
    assert attrs["llm.prefill.tokens_per_s"] == pytest.approx(computed / duration_s, rel=1e-6)
    assert attrs["llm.prefill.flop_per_s"] == pytest.approx(
        attrs["llm.prefill.flops"] / duration_s, rel=1e-6)
    assert attrs["llm.prefill.device_flop_per_s"] > 0
