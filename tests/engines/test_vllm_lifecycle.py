"""vLLM's request-lifecycle spans (tracer/engines/vllm.py): the decode instance's remote-KV
wait under prefill/decode disaggregation becomes `kv_transfer`, carved out of vLLM's queue
time, which holds it. The spans are shaped as vllm-project/vllm
tests/tracing/test_request_lifecycle_tracing.py at 8d1fa3c4c8cd makes them: children of the
request span, no `gen_ai.request.id`, wall-clock ends."""
from __future__ import annotations

import math

import pytest

from tracer.engines.detect import engine_timings
from tracer.engines.placement import place
from tracer.engines.spans import SpanView

MS = 1_000_000
T, REQ = "a" * 32, "b" * 16
ATTRS = {"gen_ai.latency.time_to_first_token": 0.30, "gen_ai.latency.time_in_queue": 0.10,
         "gen_ai.latency.time_in_model_prefill": 0.15, "gen_ai.usage.prompt_tokens": 64,
         "gen_ai.request.id": "chatcmpl-1"}
START = 1_000 * MS


def _request(attrs=ATTRS, span_id=REQ) -> SpanView:
    return SpanView(T, span_id, "c" * 16, "llm_request", START, dict(attrs), START + 400 * MS)


def _child(name, start_ms, end_ms, parent=REQ, span_id="d" * 16) -> SpanView:
    return SpanView(T, span_id, parent, name, START + round(start_ms * MS), {},
                    START + round(end_ms * MS))


def _timing(*spans):
    (_, timing), = [(s, t) for s, t in engine_timings(spans) if s.span_id == REQ]
    return timing


def test_the_remote_kv_wait_is_kv_transfer_before_the_decode_instances_prefill():
    timing = _timing(_request(), _child("vllm.request.queue", 0, 30, span_id="e" * 16),
                     _child("vllm.request.wait_remote_kv", 30, 90),
                     _child("vllm.request.prefill", 100, 250, span_id="f" * 16))
    assert timing.parts() == (("queue", 40 * MS), ("kv_transfer", 60 * MS),
                              ("prefill", 150 * MS))
    # The stages still sum to vLLM's TTFT with engine_other, placed in our window.
    placed = place(timing, window_start_ns=0, window_end_ns=500 * MS,
                   to_perf_ns=lambda e: e - START + 50 * MS, max_skew_ns=0)
    assert placed.kind == "wall_clock"
    assert placed.stages == ("upstream_request", "queue", "kv_transfer", "prefill",
                             "engine_other", "upstream_response")
    ends = dict(zip(placed.stages, placed.ends_ns))
    assert ends["engine_other"] - ends["upstream_request"] == 300 * MS


def test_without_a_wait_the_request_reads_as_before():
    timing = _timing(_request(), _child("vllm.request.queue", 0, 100),
                     _child("vllm.request.prefill", 100, 250, span_id="f" * 16))
    assert timing.parts() == (("queue", 100 * MS), ("prefill", 150 * MS))
    assert timing.kv_transfer_ns is None


@pytest.mark.parametrize("start_ms,end_ms", [
    (30, 131),          # longer than vLLM's whole queue time: not inside it
    (60, 20),           # ends before it starts
    (0, 10**14 / MS),   # over a day
])
def test_a_wait_that_contradicts_the_queue_is_not_read(start_ms, end_ms):
    timing = _timing(_request(), _child("vllm.request.wait_remote_kv", start_ms, end_ms))
    assert timing.parts() == (("queue", 100 * MS), ("prefill", 150 * MS))


@pytest.mark.parametrize("queue", [-1.0, math.nan, math.inf, "0.1", 10**12])
def test_no_usable_queue_time_leaves_the_wait_unread(queue):
    attrs = {**ATTRS, "gen_ai.latency.time_in_queue": queue}
    timing = _timing(_request(attrs), _child("vllm.request.wait_remote_kv", 30, 90))
    assert timing.queue_ns is None and timing.kv_transfer_ns is None
    assert timing.parts() == (("prefill", 150 * MS),)


def test_a_wait_under_another_span_is_nobodys():
    timing = _timing(_request(), _child("vllm.request.wait_remote_kv", 30, 90,
                                        parent="9" * 16))
    assert timing.kv_transfer_ns is None and timing.queue_ns == 100 * MS
    # and a lifecycle span alone is no request span
    assert engine_timings([_child("vllm.request.wait_remote_kv", 30, 90)]) == []


def test_the_first_of_two_waits_is_read():
    timing = _timing(_request(), _child("vllm.request.wait_remote_kv", 50, 60, span_id="1" * 16),
                     _child("vllm.request.wait_remote_kv", 10, 30, span_id="2" * 16))
    assert timing.kv_transfer_ns == 20 * MS and timing.queue_ns == 80 * MS


@pytest.mark.parametrize("flag,expected", [(True, True), (False, False), ("true", False),
                                           (1, False), (None, False)])
def test_a_prefill_span_marked_preempted_says_so(flag, expected):
    prefill = SpanView(T, "f" * 16, REQ, "vllm.request.prefill", START + 100 * MS,
                       {} if flag is None else {"preempted": flag}, START + 250 * MS)
    assert _timing(_request(), prefill).preempted is expected
    # Under another parent it is nobody's.
    stray = SpanView(T, "f" * 16, "9" * 16, "vllm.request.prefill", START + 100 * MS,
                     {"preempted": True}, START + 250 * MS)
    assert _timing(_request(), stray).preempted is False
