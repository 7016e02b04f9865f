"""Text Generation Inference: the timing headers of a non-streamed answer.

Read from huggingface/text-generation-inference `router/src/server.rs` (`generate`, 3.x):
`x-total-time`, `x-validation-time`, `x-queue-time`, `x-inference-time`,
`x-time-per-token` (integer ms) and `x-prompt-tokens`. Streams carry no headers of this
kind: their timing is in TGI's OTLP gRPC spans (`tracer/engines/tgi_span.py`). There is no
wall-clock arrival stamp:
the interval is placed against our first content (docs/architecture.md).
"""
from __future__ import annotations

from tracer.engines.timing import EngineTiming, millis_ns, token_count

_HEADERS = (b"x-total-time", b"x-validation-time", b"x-queue-time", b"x-inference-time")


def matches(headers: list[tuple[bytes, bytes]]) -> bool:
    names = {k.lower() for k, _ in headers}
    return all(h in names for h in _HEADERS)


def timing_of(headers: list[tuple[bytes, bytes]]) -> EngineTiming:
    """
    >>> h = [(b"x-total-time", b"30"), (b"x-validation-time", b"2"), (b"x-queue-time", b"8"),
    ...      (b"x-inference-time", b"20"), (b"x-prompt-tokens", b"12")]
    >>> t = timing_of(h); t.tokenize_ns, t.queue_ns, t.inference_ns, t.ttft_ns, t.num_prompt_tokens
    (2000000, 8000000, 20000000, 30000000, 12)
    """
    values = {k.lower(): v for k, v in headers}
    ms = {name: millis_ns(_int(values.get(name))) for name in _HEADERS}
    return EngineTiming("tgi", ttft_ns=ms[b"x-total-time"], tokenize_ns=ms[b"x-validation-time"],
                        queue_ns=ms[b"x-queue-time"], inference_ns=ms[b"x-inference-time"],
                        num_prompt_tokens=token_count(_int(values.get(b"x-prompt-tokens"))))


def _int(raw: bytes | None) -> int | None:
    if raw is None or not raw.strip().isdigit() or len(raw) > 12:
        return None
    return int(raw)
