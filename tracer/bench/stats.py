"""Per-request results and the summary statistics of a load run, as vLLM `bench serve` reports them.

Pure Python on purpose: the tracer must not require numpy, yet its percentiles must agree with
numpy's default (`method="linear"`), which is what vLLM's benchmark uses.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The statistics every latency metric gets, in the order the table prints them.
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")

# Why a request failed. Failed requests are counted by kind and kept out of latency stats.
ERROR_KINDS: tuple[str, ...] = (
    "http_error",        # non-200 status
    "connect_error",     # could not connect
    "timeout",           # --timeout-s ran out (whole request, not per read)
    "broken_stream",     # connection cut or stream ended without `data: [DONE]`
    "stream_error",      # the server sent an `{"error": ...}` event mid-stream
    "invalid_response",  # a `data:` payload that is not JSON
    "empty_response",    # [DONE] without a single content chunk: no TTFT exists
    "transport_error",   # any other httpx transport failure
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with numpy's default linear interpolation.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    # numpy: virtual index = (n - 1) * q / 100, then lerp between its floor and ceil.
    virtual_index = (len(ordered) - 1) * (q / 100)
    below = math.floor(virtual_index)
    above = min(below + 1, len(ordered) - 1)
    return _lerp(ordered[below], ordered[above], virtual_index - below)


def _lerp(a: float, b: float, t: float) -> float:
    # Same two-sided form as numpy's _lerp, so results match it to the last bit or so.
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


@dataclass(slots=True, frozen=True)
class RequestResult:
    """What one benchmark request saw, on the client's perf_counter_ns timeline.

    `content_ns` holds the arrival time of every SSE event carrying non-empty text; role-only,
    finish-only and usage-only events are not tokens and are not in it.

    Example:
        r = RequestResult(index=0, sent_ns=0, content_ns=(5_000_000, 7_000_000),
                          done_ns=8_000_000, finished_ns=8_000_000, completion_tokens=2)
        r.ttft_s   # 0.005
        r.tpot_s   # 0.002 = (e2e - ttft) / (2 - 1)
    """

    index: int
    sent_ns: int
    finished_ns: int
    content_ns: tuple[int, ...] = ()
    done_ns: int | None = None          # `data: [DONE]` arrival
    prompt_tokens: int | None = None    # from the usage chunk
    completion_tokens: int | None = None
    error_kind: str | None = None
    error_message: str = ""
    status_code: int | None = None
    # The first output of any kind (text, reasoning, tool_call) and the tool calls started
    # (docs/architecture.md, "First output, by kind").
    first_output_ns: int | None = None
    first_output_kind: str | None = None
    num_tool_calls: int = 0

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def ttft_s(self) -> float | None:
        return (self.content_ns[0] - self.sent_ns) / 1e9 if self.content_ns else None

    @property
    def e2e_s(self) -> float | None:
        # Ends at the last content chunk: the usage chunk and [DONE] carry no text, so they
        # do not extend it (and TPOT then equals the server's (last - first) / (n - 1)).
        return (self.content_ns[-1] - self.sent_ns) / 1e9 if self.content_ns else None

    @property
    def itl_s(self) -> tuple[float, ...]:
        ts = self.content_ns
        return tuple((ts[i] - ts[i - 1]) / 1e9 for i in range(1, len(ts)))

    @property
    def num_output_tokens(self) -> int:
        # usage.completion_tokens is exact; the chunk count is a fallback (a chunk may hold
        # several tokens, or a half-character token may produce none).
        return self.completion_tokens if self.completion_tokens is not None else len(self.content_ns)

    @property
    def tpot_s(self) -> float | None:
        ttft_s, e2e_s, num_tokens = self.ttft_s, self.e2e_s, self.num_output_tokens
        if ttft_s is None or e2e_s is None or num_tokens < 2:
            return None
        return (e2e_s - ttft_s) / (num_tokens - 1)

    def to_row(self) -> dict:
        """A JSON-ready row; times in milliseconds."""
        return {
            "index": self.index, "ok": self.ok, "error_kind": self.error_kind,
            "error_message": self.error_message, "status_code": self.status_code,
            "ttft_ms": _ms(self.ttft_s), "tpot_ms": _ms(self.tpot_s), "e2e_ms": _ms(self.e2e_s),
            "first_output_ms": _ms(None if self.first_output_ns is None
                                   else (self.first_output_ns - self.sent_ns) / 1e9),
            "first_output_kind": self.first_output_kind, "num_tool_calls": self.num_tool_calls,
            "itl_ms": [_ms(v) for v in self.itl_s],
            "stream_end_ms": _ms(None if self.done_ns is None else (self.done_ns - self.sent_ns) / 1e9),
            "num_content_chunks": len(self.content_ns),
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.num_output_tokens,
        }


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else value_s * 1e3


def latency_stats(values_s: Sequence[float], metric: str) -> dict[str, float | None]:
    """mean, median and PERCENTILES of one metric, in ms, under vLLM-style flat keys."""
    keys = ["mean", "median"] + [f"p{q}" for q in PERCENTILES]
    if not values_s:
        return {f"{k}_{metric}_ms": None for k in keys}
    values_ms = [v * 1e3 for v in values_s]
    stats = {"mean": math.fsum(values_ms) / len(values_ms), "median": percentile(values_ms, 50)}
    stats.update({f"p{q}": percentile(values_ms, q) for q in PERCENTILES})
    return {f"{k}_{metric}_ms": stats[k] for k in keys}


def _run_span_s(results: Sequence[RequestResult]) -> float:
    if not results:
        return 0.0
    return (max(r.finished_ns for r in results) - min(r.sent_ns for r in results)) / 1e9


def summarize(results: Iterable[RequestResult], duration_s: float | None = None) -> dict:
    """The run's summary: counts, tokens, throughput and latency stats (ms) of completed requests.

    `duration_s` defaults to first send → last finish. Keys: completed, failed, failed_by_kind,
    duration_s, total_input_tokens, total_output_tokens, request_throughput_rps,
    output_throughput_tok_s, total_token_throughput_tok_s, and `{mean,median,p50,p90,p95,p99}_
    {ttft,tpot,itl,e2e}_ms` (None when no completed request has that metric).
    """
    results = list(results)
    done = [r for r in results if r.ok]
    if duration_s is None:
        duration_s = _run_span_s(results)
    num_input_tokens = sum(r.prompt_tokens or 0 for r in done)
    num_output_tokens = sum(r.num_output_tokens for r in done)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: None)
    summary: dict = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "failed_by_kind": dict(sorted(Counter(r.error_kind for r in results if not r.ok).items())),
        "duration_s": duration_s,
        "total_input_tokens": num_input_tokens,
        "total_output_tokens": num_output_tokens,
        "request_throughput_rps": per_s(len(done)),
        "output_throughput_tok_s": per_s(num_output_tokens),
        "total_token_throughput_tok_s": per_s(num_input_tokens + num_output_tokens),
    }
    samples = {
        "ttft": [r.ttft_s for r in done if r.ttft_s is not None],
        "tpot": [r.tpot_s for r in done if r.tpot_s is not None],
        "itl": [gap for r in done for gap in r.itl_s],   # pooled across requests, like vLLM
        "e2e": [r.e2e_s for r in done if r.e2e_s is not None],
    }
    for metric in LATENCY_METRICS:
        summary.update(latency_stats(samples[metric], metric))
    return summary
