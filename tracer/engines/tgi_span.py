"""Text Generation Inference: the router's request span over OTLP (streamed answers too).

Read from huggingface/text-generation-inference at commit db931fcf42da (2026-01-08):

- `router/src/server.rs`: `generate`, `generate_stream`, `completions` and `chat_completions`
  are `#[instrument(skip_all, fields(total_time, validation_time, queue_time,
  inference_time, time_per_token, seed, ...))]`; the span is the function's (its name is the
  function's name), parented on the incoming `traceparent` (`span.set_parent(context)`,
  the context from `trace_context_middleware` in `router/src/logging.rs`). When the last
  token is produced (`InferStreamResponse::End` in `generate_stream_internal`, or the whole
  answer in `generate_internal`) it records, each as `format!("{:?}", duration)` (Rust's
  `Debug` of `std::time::Duration`: "12.5ms", "1.2s", a string attribute):
  `validation_time` = queued − handler start, `queue_time` = batched − queued,
  `inference_time` = now − batched (prefill *and* decode), `total_time` = the whole answer,
  `time_per_token` and `seed` ("Some(3)"). No prompt token count is recorded on the span.
- `backends/v3/src/queue.rs` `next_batch`: when the request joins a batch, an `infer` span
  is opened under the request's entry span (a descendant of the request span, through
  `async_stream`, `generate_stream` and `schedule`); `backends/v3/src/backend.rs`
  `filter_send_generations` opens a `send_generation` span under it for each token it hands
  to the response stream, the first one being the first token.
- `router/src/logging.rs` `init_logging`: `--otlp-endpoint` installs a batch exporter over
  OTLP gRPC (tonic), `service.name` from `--otlp-service-name`, always sampled.

So the span is matched by those duration fields (never by its name: four handlers carry
them): tokenize = `validation_time` (validation and tokenization), queue = `queue_time`.
The first token is not on the span: with the first `send_generation` descendant in the same
export, the engine's TTFT is its start − the request span's start, and prefill its start −
the first `infer` span's start (one clock each: the engine host's span stamps). Without it
the span times only the whole answer (ttft = `total_time`, inference = `inference_time`),
which fits a non-streamed answer and is refused as `inconsistent` for a stream
(docs/architecture.md, "Inside the engine"). Spans close when they end, so a stream longer
than the exporter's batch delay may send its first `send_generation` in an earlier export.
"""
from __future__ import annotations

from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming, debug_duration_ns, nanos_ns

TOTAL = "total_time"
VALIDATION = "validation_time"
QUEUE = "queue_time"
INFERENCE = "inference_time"
BATCH_SPAN = "infer"
TOKEN_SPAN = "send_generation"
_STAGES = frozenset((BATCH_SPAN, TOKEN_SPAN))


def matches(span: SpanView) -> bool:
    a = span.attributes   # one expression: it runs for every span of every export
    return (isinstance(a.get(TOTAL), str) and isinstance(a.get(VALIDATION), str)
            and isinstance(a.get(QUEUE), str) and isinstance(a.get(INFERENCE), str))


def is_stage(span: SpanView) -> bool:
    """A descendant `timing_of` reads: one of its names, with a wall-clock start."""
    return span.name in _STAGES and span.start_epoch_ns > 0


def timing_of(span: SpanView, descendants: list[SpanView]) -> EngineTiming:
    """
    >>> root = SpanView("a" * 32, "b" * 16, "c" * 16, "generate_stream", 1_000_000_000,
    ...                 {TOTAL: "2.5s", VALIDATION: "1.5ms", QUEUE: "3ms", INFERENCE: "2.4s"})
    >>> infer = SpanView("a" * 32, "d" * 16, "e" * 16, BATCH_SPAN, 1_005_000_000, {})
    >>> token = SpanView("a" * 32, "f" * 16, "d" * 16, TOKEN_SPAN, 1_045_000_000, {})
    >>> t = timing_of(root, [infer, token]); t.ttft_ns, t.tokenize_ns, t.queue_ns, t.prefill_ns
    (45000000, 1500000, 3000000, 40000000)
    >>> t = timing_of(root, []); t.ttft_ns, t.inference_ns, t.prefill_ns
    (2500000000, 2400000000, None)
    """
    a = span.attributes
    start = span.start_epoch_ns
    tokenize, queue = debug_duration_ns(a.get(VALIDATION)), debug_duration_ns(a.get(QUEUE))
    first_token = _earliest(descendants, TOKEN_SPAN, start)
    if start > 0 and first_token is not None:
        batched = _earliest(descendants, BATCH_SPAN, start)
        prefill = nanos_ns(first_token - batched) if batched is not None else None
        return EngineTiming("tgi", arrival_epoch_ns=start, ttft_ns=nanos_ns(first_token - start),
                            tokenize_ns=tokenize, queue_ns=queue, prefill_ns=prefill)
    return EngineTiming("tgi", arrival_epoch_ns=start or None,
                        ttft_ns=debug_duration_ns(a.get(TOTAL)), tokenize_ns=tokenize,
                        queue_ns=queue, inference_ns=debug_duration_ns(a.get(INFERENCE)))


def _earliest(spans: list[SpanView], name: str, not_before_ns: int) -> int | None:
    # The earliest of `name` (tracer/engines/detect.py passes one per name, the earliest).
    # A stamp before the request span's own start is not this request's (or not one clock).
    starts = [s.start_epoch_ns for s in spans
              if s.name == name and is_stage(s) and s.start_epoch_ns >= not_before_ns]
    return min(starts, default=None)
