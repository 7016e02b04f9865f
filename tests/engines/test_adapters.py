"""Each adapter reads its engine's names and units, and only those; the choice is by what
arrived."""
from __future__ import annotations

from tracer.engines import llamacpp, tgi
from tracer.engines.detect import engine_timings
from tracer.engines.spans import SpanView

T, P = "a" * 32, "b" * 16


def _span(attributes, name="llm_request", span_id="c" * 16, parent=P, start=5, end=0):
    return SpanView(T, span_id, parent, name, start, attributes, end)


def test_the_attributes_choose_the_adapter():
    vllm = _span({"gen_ai.latency.time_to_first_token": 0.3, "gen_ai.latency.time_in_queue": 0.1,
                  "gen_ai.latency.time_in_model_prefill": 0.15, "gen_ai.usage.prompt_tokens": 12})
    trt = _span({"gen_ai.latency.time_to_first_token": 0.3, "gen_ai.latency.time_in_queue": 0.1})
    sgl = _span({"gen_ai.latency.time_to_first_token": 0.3,
                 "gen_ai.latency.time_in_model_prefill": 0.2})
    other = _span({"http.route": "/v1/chat/completions"}, name="POST /v1/chat/completions")
    found = engine_timings([vllm, trt, sgl, other])
    assert [t.source for _, t in found] == ["vllm", "trtllm", "sglang"]
    v = found[0][1]
    assert (v.queue_ns, v.prefill_ns, v.ttft_ns, v.num_prompt_tokens, v.arrival_epoch_ns) == (
        100_000_000, 150_000_000, 300_000_000, 12, 5)
    assert found[2][1].prefill_ns is None   # queue-inclusive without its stage spans


def test_bad_values_are_absent_not_guessed():
    span = _span({"gen_ai.latency.time_to_first_token": "0.3", "gen_ai.latency.time_in_queue": -1.0,
                  "gen_ai.latency.time_in_model_prefill": float("inf")})
    (_, timing), = engine_timings([span])
    assert (timing.ttft_ns, timing.queue_ns, timing.prefill_ns) == (None, None, None)


def test_sglang_children_are_found_only_under_their_own_request_span():
    root = _span({"gen_ai.latency.time_to_first_token": 0.5,
                  "gen_ai.latency.time_in_model_prefill": 0.3})
    mine = SpanView(T, "d" * 16, "c" * 16, "prefill_waiting", 10, {}, 10 + 100_000_000)
    theirs = SpanView(T, "e" * 16, "f" * 16, "prefill_waiting", 10, {}, 10 + 900_000_000)
    (_, timing), = engine_timings([theirs, root, mine])
    assert (timing.queue_ns, timing.prefill_ns) == (100_000_000, 200_000_000)


def test_llamacpp_timings_and_tgi_headers():
    assert llamacpp.matches({"prompt_ms": 1.0}) and not llamacpp.matches({"predicted_n": 1})
    assert not llamacpp.matches(None)
    assert not tgi.matches([(b"x-total-time", b"1")])
    bad = tgi.timing_of([(b"x-total-time", b"-1"), (b"x-validation-time", b"1e9"),
                         (b"x-queue-time", b"3"), (b"x-inference-time", b"4")])
    assert (bad.ttft_ns, bad.tokenize_ns, bad.queue_ns) == (None, None, 3_000_000)
