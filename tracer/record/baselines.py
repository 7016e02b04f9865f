"""What is normal for one model, kept in the process: rolling medians of recent requests.

A verdict (`tracer.record.verdict`) compares a request with these, never with a fixed
threshold alone: a 400 ms prefill is healthy for a 4,000-token prompt and a fault for a
40-token one (docs/architecture.md, "Diagnosis"). Each series is a window of the last
`window` values; its median is kept exact after every observation (a sorted copy of the
window, updated by bisection), so a verdict costs a few dict reads, and a verdict is a
function of the record and of the view it was given.

Bounded: per model, a fixed number of series of `window` floats each, and at most
`MAX_MODELS` models (the labels are a closed set already: a served name or `other`).
"""
from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections import deque

# Values per series: enough for a stable median, small enough that a change of regime
# becomes the new normal within a few minutes of traffic.
DEFAULT_WINDOW = 256
# A series says nothing until it holds this many values.
MIN_SAMPLES = 8
# Observations between refreshes of a series' cached median.
MAX_MODELS = 64


class _Series:
    """The last `window` values in arrival order (`values`: which one leaves next) and the
    same values sorted, kept so by bisection on every add: the median is the middle of the
    sorted copy, exact after every observation, for two bisections and a list insert and
    delete (~0.3 µs) instead of a sort of the window (~9 µs) every few observations.
    tests/tracer/test_baselines.py checks it against `statistics.median` of the window."""

    __slots__ = ("values", "_sorted")

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def add(self, value: float) -> None:
        if value != value:
            return   # NaN has no place in an order: it would break the sorted copy
        values, ordered = self.values, self._sorted
        if len(values) == values.maxlen:
            del ordered[bisect_left(ordered, values[0])]   # the value the deque drops
        values.append(value)
        insort(ordered, value)

    def median(self) -> float | None:
        ordered = self._sorted
        n = len(ordered)
        if n < MIN_SAMPLES:
            return None
        mid = n // 2
        return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class ModelBaseline:
    """The series of one model. `median(name)` is None until the series is warm."""

    __slots__ = ("_window", "_series", "num_requests", "last_end_ns")

    def __init__(self, window: int) -> None:
        self._window = window
        self._series: dict[str, _Series] = {}
        self.num_requests = 0         # requests with a first token seen since start
        self.last_end_ns: int | None = None   # the latest such request's end

    def add(self, name: str, value: float) -> None:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = _Series(self._window)
        series.add(value)

    def median(self, name: str) -> float | None:
        series = self._series.get(name)
        return None if series is None else series.median()

    def samples(self, name: str) -> int:
        """How many values the series holds (at most the window): the history a verdict
        that reads its median was judged against."""
        series = self._series.get(name)
        return 0 if series is None else len(series.values)

    def samples_per_token(self, stage: str, tokens: int) -> int:
        """`samples` of the per-token series `expected_ns(stage, tokens)` reads.

        >>> b = ModelBaseline(64)
        >>> for n in range(3): b.add_prefill(100, 10_000_000)
        >>> b.samples_per_token("prefill", 120), b.samples_per_token("prefill", 1000)
        (3, 0)
        """
        return self.samples(_per_token_series(stage, tokens)) if tokens > 0 else 0

    def add_prefill(self, uncached_tokens: int, prefill_ns: float) -> None:
        """One prefill, as ns per token in the series of its length's power of two."""
        self.add_per_token("prefill", uncached_tokens, prefill_ns)

    def expected_prefill_ns(self, uncached_tokens: int) -> float | None:
        """The prefill time normal for this many uncached tokens (`expected_ns`).

        >>> b = ModelBaseline(64)
        >>> for n in range(8): b.add_prefill(100, 10_000_000)
        >>> b.expected_prefill_ns(120), b.expected_prefill_ns(1000)
        (12000000.0, None)
        """
        return self.expected_ns("prefill", uncached_tokens)

    def add_per_token(self, stage: str, tokens: int, ns: float) -> None:
        """One `stage` over `tokens`, as ns per token in the series of its length's power
        of two (prefill over uncached tokens, a KV transfer over prompt tokens)."""
        self.add(_per_token_series(stage, tokens), ns / tokens)

    def expected_ns(self, stage: str, tokens: int) -> float | None:
        """The `stage` time normal for this many tokens: the median ns per token of recent
        ones of the same power-of-two length, times the tokens; None until that length has
        `MIN_SAMPLES` of them. Neither a prefill nor a transfer is linear in length (a short
        one is mostly fixed cost), so only like is compared with like."""
        if tokens <= 0:
            return None
        per_token = self.median(_per_token_series(stage, tokens))
        return None if per_token is None else per_token * tokens

    def usual_uncached_tokens(self) -> float | None:
        return self.median("uncached_tokens")


def _per_token_series(stage: str, tokens: int) -> str:
    # 64..127 tokens -> "prefill_ns_per_token/6": one series per power of two.
    return f"{stage}_ns_per_token/{tokens.bit_length() - 1}"


class Baselines:
    """Per-model baselines, thread-safe: the record worker observes and reads them, the
    beacon join reads and feeds the network series.

    >>> b = Baselines(window=16)
    >>> with b.lock:
    ...     for _ in range(8): b.of("m").add("queue", 2.0)
    ...     b.of("m").median("queue"), b.of("m").median("prefill")
    (2.0, None)
    """

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < MIN_SAMPLES:
            raise ValueError(f"window must be >= {MIN_SAMPLES}, got {window}")
        self.window = window
        self.lock = threading.Lock()
        self._models: dict[str, ModelBaseline] = {}

    def of(self, model: str) -> ModelBaseline:
        """The model's baseline (created on first use); call with `lock` held."""
        baseline = self._models.get(model)
        if baseline is None:
            if len(self._models) >= MAX_MODELS:
                # Model labels are closed, so this only guards a misuse: reuse one slot.
                model = next(iter(self._models))
                return self._models[model]
            baseline = self._models[model] = ModelBaseline(self.window)
        return baseline
