"""Benchmark metric definitions: percentiles vs numpy, and TTFT/ITL/TPOT/E2E on fake timelines."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.bench.stats import RequestResult, latency_stats, percentile, summarize
from tracer.bench.stream import StreamStatus, StreamTimeline

MS = 1_000_000  # ns


class FakeClock:
    """A clock the test moves by hand: `clock.now_ns = ...` before each fed line."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def chat_event(content: str | None = None, role: str | None = None, finish: str | None = None) -> str:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def usage_event(prompt_tokens: int, completion_tokens: int) -> str:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return "data: " + json.dumps({"choices": [], "usage": usage})


def play(events: list[tuple[int, str]], endpoint: str = "chat", sent_ms: int = 0):
    """Feed (arrival_ms, line) pairs to a timeline on a fake clock; finish at the last time."""
    clock = FakeClock()
    clock.now_ns = sent_ms * MS
    timeline = StreamTimeline(index=0, endpoint=endpoint, clock_ns=clock)
    timeline.mark_sent()
    for at_ms, line in events:
        clock.now_ns = at_ms * MS
        timeline.feed_line(line)
    return timeline.finish()


# --- percentiles ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       q=st.floats(0, 100))
def test_percentile_equals_numpy_linear(values, q):
    expected = float(np.percentile(np.array(values), q, method="linear"))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_percentile_on_random_latencies_matches_numpy_for_reported_quantiles():
    rng = random.Random(7)
    for size in (1, 2, 3, 10, 101, 1000):
        values = [rng.lognormvariate(3, 1) for _ in range(size)]
        for q in (0, 50, 90, 95, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_rejects_empty_input_and_out_of_range_q():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_use_ms_and_flat_vllm_keys():
    stats = latency_stats([0.010, 0.020, 0.030, 0.040], "ttft")
    assert stats["mean_ttft_ms"] == pytest.approx(25.0)
    assert stats["median_ttft_ms"] == pytest.approx(25.0)
    assert stats["p99_ttft_ms"] == pytest.approx(float(np.percentile([10, 20, 30, 40], 99)))
    assert latency_stats([], "itl") == {k: None for k in latency_stats([1.0], "itl")}


# --- per-request metrics on event timelines -------------------------------------------------

def test_role_only_empty_first_chunk_does_not_start_ttft():
    result = play([
        (1, chat_event(role="assistant", content="")),   # the vLLM #15106 trap
        (40, chat_event(content="Hello")),
        (50, chat_event(content=" world")),
        (55, "data: [DONE]"),
    ])
    assert result.ok
    assert result.ttft_s == pytest.approx(0.040)
    assert result.content_ns == (40 * MS, 50 * MS)


def test_usage_and_done_do_not_extend_e2e_and_tpot_uses_usage_tokens():
    result = play([
        (10, chat_event(role="assistant", content="a")),
        (20, chat_event(content="b")),
        (40, chat_event(content="c")),
        (41, chat_event(finish="length")),              # finish-only: not a token
        (90, usage_event(prompt_tokens=7, completion_tokens=5)),
        (95, "data: [DONE]"),
    ], sent_ms=2)
    assert result.ttft_s == pytest.approx(0.008)
    assert result.e2e_s == pytest.approx(0.038)          # ends at the last content, not 90 or 95
    assert result.itl_s == pytest.approx((0.010, 0.020))
    assert result.prompt_tokens == 7 and result.num_output_tokens == 5
    # TPOT = (E2E - TTFT) / (completion_tokens - 1): 3 chunks carried 5 tokens.
    assert result.tpot_s == pytest.approx((0.038 - 0.008) / 4)
    assert result.to_row()["stream_end_ms"] == pytest.approx(93.0)


def test_tpot_falls_back_to_chunk_count_without_usage_and_needs_two_tokens():
    result = play([(5, chat_event(content="x")), (11, chat_event(content="y")),
                   (23, chat_event(content="z")), (24, "data: [DONE]")])
    assert result.completion_tokens is None and result.num_output_tokens == 3
    assert result.tpot_s == pytest.approx((0.023 - 0.005) / 2)
    single = play([(5, chat_event(content="x")), (6, "data: [DONE]")])
    assert single.ok and single.tpot_s is None and single.itl_s == ()


def test_completions_endpoint_reads_text_and_ignores_comments_and_blank_lines():
    text_event = lambda text: "data: " + json.dumps({"choices": [{"index": 0, "text": text}]})
    result = play([(3, ": keep-alive"), (4, ""), (6, text_event("")), (9, text_event("Hi")),
                   (12, "data:" + text_event("!")[5:]), (13, "data: [DONE]")], endpoint="completions")
    assert result.ok and result.ttft_s == pytest.approx(0.009)
    assert result.itl_s == pytest.approx((0.003,))


@pytest.mark.parametrize("events, kind", [
    ([(5, chat_event(content="x"))], "broken_stream"),                       # no [DONE]
    ([(5, chat_event(role="assistant", content="")), (6, "data: [DONE]")], "empty_response"),
    ([(5, chat_event(content="x")), (6, 'data: {"error": {"message": "boom"}}')], "stream_error"),
    ([(5, "data: {not json")], "invalid_response"),
])
def test_bad_streams_fail_with_their_kind(events, kind):
    result = play(events)
    assert not result.ok and result.error_kind == kind


def test_first_failure_wins_and_events_after_close_are_ignored():
    clock = FakeClock()
    timeline = StreamTimeline(0, "chat", clock)
    timeline.mark_sent()
    timeline.fail("http_error", "server said no", 500)
    timeline.feed_line(chat_event(content="late"))
    result = timeline.finish()
    assert timeline.status is StreamStatus.FAILED
    assert (result.error_kind, result.status_code, result.content_ns) == ("http_error", 500, ())


# --- summary -------------------------------------------------------------------------------

def _ok(index: int, sent_ms: int, content_ms: tuple[int, ...], tokens: int) -> RequestResult:
    return RequestResult(index=index, sent_ns=sent_ms * MS, finished_ns=(content_ms[-1] + 1) * MS,
                         content_ns=tuple(t * MS for t in content_ms), done_ns=(content_ms[-1] + 1) * MS,
                         prompt_tokens=10, completion_tokens=tokens)


def test_summary_excludes_failures_pools_itl_and_computes_throughput():
    failed_fast = RequestResult(index=2, sent_ns=0, finished_ns=1 * MS, error_kind="http_error",
                                status_code=500, content_ns=(MS // 2,))
    failed_slow = RequestResult(index=3, sent_ns=0, finished_ns=9000 * MS, error_kind="timeout")
    results = [_ok(0, 0, (100, 110, 130), 3), _ok(1, 50, (350, 360), 2), failed_fast, failed_slow]
    summary = summarize(results, duration_s=2.0)
    assert (summary["completed"], summary["failed"]) == (2, 2)
    assert summary["failed_by_kind"] == {"http_error": 1, "timeout": 1}
    assert summary["total_input_tokens"] == 20 and summary["total_output_tokens"] == 5
    assert summary["request_throughput_rps"] == pytest.approx(1.0)
    assert summary["output_throughput_tok_s"] == pytest.approx(2.5)
    assert summary["total_token_throughput_tok_s"] == pytest.approx(12.5)
    assert summary["mean_ttft_ms"] == pytest.approx((100 + 300) / 2)   # the failed 0.5 ms is out
    assert summary["p50_itl_ms"] == pytest.approx(float(np.percentile([10, 20, 10], 50)))
    assert summary["mean_tpot_ms"] == pytest.approx((15 + 10) / 2)
    assert summary["p99_e2e_ms"] == pytest.approx(float(np.percentile([130, 310], 99)))


def test_summary_default_duration_spans_first_send_to_last_finish_and_handles_no_success():
    only_failed = [RequestResult(index=0, sent_ns=1 * MS, finished_ns=501 * MS, error_kind="timeout")]
    summary = summarize(only_failed)
    assert summary["duration_s"] == pytest.approx(0.5)
    assert summary["completed"] == 0 and summary["request_throughput_rps"] == 0.0
    assert summary["mean_ttft_ms"] is None and summary["p95_e2e_ms"] is None
    json.dumps(summary, allow_nan=False)   # None, not NaN, for missing stats
