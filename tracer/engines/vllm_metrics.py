"""vLLM's per-request metrics, in-band: the `metrics` object of a response.

Read from vllm-project/vllm PR #46768 (v0.25.0): `build_per_request_timing_metrics` in
`vllm/entrypoints/openai/engine/serving.py` and `PerRequestTimingMetrics` in
`vllm/entrypoints/openai/engine/protocol.py`, and its tests (the fork
Heliopause0916/1Cat-vLLM `tests/entrypoints/openai/test_per_request_metrics.py`
@f6378fe09a71 carries them as adapted from that PR; the upstream snapshot here predates it).
With `vllm serve --enable-per-request-metrics`, and the request's `include_metrics: true`,
a non-streamed answer carries a top-level `metrics`; a stream carries it only on the final
usage chunk, so only with `stream_options.include_usage`. Each field is a float in ms, or
absent/null when its timestamps are not known, from `RequestStateStats`:

- `queue_time_ms` = scheduled − queued: the queue;
- `time_to_first_token_ms` = first token − scheduled: measured from scheduling, so it is the
  prefill (and the first token's output processing), never the queue;
- `generation_time_ms` = last token − first token (decode); `mean_itl_ms`,
  `tokens_per_second`: not stages, not read here.

No arrival stamp: the queue and prefill are placed against our first content
(`end_anchored`, docs/architecture.md, "Inside the engine"), as llama.cpp's `timings` are.
vLLM's metrics say nothing of reasoning vs content tokens or of draft acceptance in this
version, so neither is read.
"""
from __future__ import annotations

from tracer.engines.timing import EngineTiming, millis_ns

QUEUE = "queue_time_ms"
PREFILL = "time_to_first_token_ms"


def matches(metrics: dict | None) -> bool:
    """A `metrics` object with a usable queue or prefill: one whose fields are all null or
    hostile is no signal (the record may still get the engine's span).

    >>> matches({"queue_time_ms": 1.0}), matches({}), matches({"queue_time_ms": "1"}), matches(None)
    (True, False, False, False)
    """
    return isinstance(metrics, dict) and (millis_ns(metrics.get(QUEUE)) is not None
                                          or millis_ns(metrics.get(PREFILL)) is not None)


def timing_of(metrics: dict) -> EngineTiming:
    """Each field through the bounded converter: negative, NaN, a string or over a day is
    unknown (None), never a stage.

    >>> t = timing_of({"queue_time_ms": 500.0, "time_to_first_token_ms": 12.5})
    >>> t.source, t.queue_ns, t.prefill_ns, t.ttft_ns
    ('vllm', 500000000, 12500000, 512500000)
    >>> t = timing_of({"queue_time_ms": -1, "time_to_first_token_ms": float("nan")})
    >>> t.queue_ns, t.prefill_ns, t.ttft_ns
    (None, None, None)
    """
    queue, prefill = millis_ns(metrics.get(QUEUE)), millis_ns(metrics.get(PREFILL))
    known = [ns for ns in (queue, prefill) if ns is not None]
    return EngineTiming("vllm", queue_ns=queue, prefill_ns=prefill,
                        ttft_ns=sum(known) if known else None)
