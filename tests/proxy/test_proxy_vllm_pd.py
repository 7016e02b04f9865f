"""vLLM's request-lifecycle spans behind the proxy: its `llm_request` span and the lifecycle
spans under it, made by the OpenTelemetry SDK as vLLM makes them
(tracer/testing/engine_spans.py), exported in one batch by the SDK's `OTLPSpanExporter` to
the proxy's receiver while the fake upstream streams the answer. A disaggregated decode
instance's remote-KV wait is the record's `kv_transfer`, before its prefill, and the stages
still sum to TTFT; a prefill span marked preempted makes the verdict `preempted`
(docs/architecture.md, "Inside the engine")."""
from __future__ import annotations

import httpx

from engine_support import EngineSdk, stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.testing.engine_spans import vllm_lifecycle_request

DELAY = {"x-fake-first-token-delay-ms": "80"}
EXPECTING = JoinSettings(wait_s=30.0, spans_expected=True)


def _through_proxy(proxy_factory, fake_upstream, **spans):
    """One stream through the proxy, then its vLLM spans (`vllm_lifecycle_request`, times as
    fractions of the upstream's TTFT) in one export: (record, upstream view, TTFT s)."""
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    sdk = EngineSdk(proxy.base_url, service_name="vllm", batch=True)
    try:
        stream_through(proxy.base_url, DELAY)
        seen = fake_upstream.state.requests[-1]
        traceparent = seen.headers["traceparent"]
        assert wait_until(lambda: proxy.parts.join.num_pending == 1)
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        vllm_lifecycle_request(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                               end_ns=seen.first_content_epoch_ns + 1_000_000, ttft_s=ttft_s,
                               **{k: v * ttft_s if isinstance(v, float) else v
                                  for k, v in spans.items()})
        sdk.flush()
    finally:
        sdk.shutdown()
    trace_id = traceparent.split("-")[1]
    assert wait_until(lambda: proxy.parts.obs.store.get(trace_id) is not None)
    record = proxy.parts.obs.store.get(trace_id)
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert all(a.end_ns == b.start_ns for a, b in zip(record.stages, record.stages[1:]))
    return proxy, record, ttft_s


def test_the_remote_kv_wait_is_a_stage_of_its_own(proxy_factory, fake_upstream):
    proxy, record, ttft_s = _through_proxy(proxy_factory, fake_upstream, local_queue_s=0.1,
                                           kv_wait_s=0.5, prefill_s=0.2)
    assert [s.stage for s in record.stages] == [
        "receive", "upstream_connect", "upstream_request", "queue", "kv_transfer",
        "prefill", "engine_other", "upstream_response", "send"]
    local_s, kv_s, prefill_s = ttft_s * 0.1, ttft_s * 0.5, ttft_s * 0.2
    wait_ns = round((local_s + kv_s) * 1e9) - round(local_s * 1e9)   # the child's length
    assert record.stage_ns("kv_transfer") == wait_ns
    assert record.stage_ns("queue") == round((local_s + kv_s) * 1e9) - wait_ns
    assert record.stage_ns("prefill") == round(prefill_s * 1e9)
    assert record.attrs["llm.engine.kv_transfer_ns"] == wait_ns
    assert record.attrs["llm.engine.placement"] == "wall_clock"
    assert proxy.metric("llm_engine_timing_total", source="vllm", outcome="joined") == 1
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="kv_transfer") == 1


def test_a_preempted_prefill_is_the_verdict(proxy_factory, fake_upstream):
    proxy, record, _ = _through_proxy(proxy_factory, fake_upstream, local_queue_s=0.2,
                                      prefill_s=0.6, preempted=True)
    assert [s.stage for s in record.stages][3:5] == ["queue", "prefill"]
    (name, t_ns, attrs), = [e for e in record.events if e[0] == "preempted"]
    assert t_ns == record.stages[4].start_ns and attrs == {"source": "vllm"}
    # /ui's view waits for the record worker, which judges it.
    verdict = httpx.get(f"{proxy.base_url}/ui/api/trace/{record.trace_id}", timeout=30).json()[
        "verdict"]
    assert verdict["cause"] == "preempted", verdict
    assert verdict["evidence"]["num_preemptions"] == 1
