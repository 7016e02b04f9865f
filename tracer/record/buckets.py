"""Histogram bucket ladders of the serving metrics (tracer/sinks/metrics.py), in seconds.

Vocabulary rather than exporter code: every threshold the recording rules, alerts and
dashboards compare TTFT against is an edge here (tests/tracer/test_metrics.py checks it).
"""
from __future__ import annotations

# OTel GenAI semconv recommended buckets (docs/reference.md, "OTel GenAI semantic conventions").
# TTFT adds every threshold a rule compares against, so a quantile or share near a threshold
# is read at a bucket edge instead of interpolated across 1-2.5 s or 2.5-5 s: 1 s and 2 s
# (`llm:ttft_over_{1,2}s:ratio_rate5m`, the default server alert), 3 s (the client alert;
# the client TTFT histogram shares these buckets); and 20 and 40 s for CPU serving.
# tests/tracer/test_metrics.py checks dashboards/thresholds.py against this list.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0,
                  2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                              20.48, 40.96, 81.92)
# Stages span 50 µs (a tokenizer call) to a minute (a long queue): a 1–2.5–5 ladder.
STAGE_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A GPU decode step is a few ms, finer than the semconv TPOT buckets start.
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075) + TPOT_BUCKETS_S + (5.0, 10.0)
NETWORK_OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0)
# One 60 Hz frame is 16.7 ms: the render delay is usually one or two frames.
RENDER_DELAY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.017, 0.033, 0.05, 0.1, 0.25, 0.5, 1.0)
# The largest gap of a stream: a preemption or a stalled step can hold a stream for seconds.
MAX_GAP_BUCKETS_S = ITL_BUCKETS_S + (30.0,)
# An idle loop wakes within ~0.1-1 ms of its deadline; a blocked one (a synchronous tokenizer
# call, a GIL-holding thread) by tens of ms or more, which every request's TTFT pays.
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0)
# Send spread the browser did not see as arrival spread (tracer/web/probe/buffering.py):
# ~0 for a stream that was not held back; a buffering proxy holds tens of ms to the whole
# answer (seconds).
HELD_BACK_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# An engine step: a GPU decode is a few ms, a CPU prefill chunk of 512 tokens about a second.
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                  5.12)
# Tokens in one step (prefill tokens + decode sequences), powers of two up to a big budget,
# like vLLM's `vllm:iteration_tokens_total` (docs/reference.md, "Metrics").
STEP_TOKEN_BUCKETS = tuple(float(1 << i) for i in range(14))
