"""Percentile bootstrap intervals for a change between two samples, standard library only.

The tracer does not depend on numpy (pyproject: numpy is a test and extras dependency only),
so this resamples with `random.Random`, seeded, and takes percentiles with numpy's default
linear interpolation (the rule `tracer/bench/stats.py` follows, repeated here because compare
and bench are independent applications; .importlinter, "tracer layers").

Method (Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 13, the percentile
interval): draw each sample again with replacement, n of n; compute the statistic of B's draw
minus A's; the interval is that difference's (1 − c)/2 and (1 + c)/2 percentiles over all
resamples. Paired (two replays of one trace: value i of A and of B are the same request), one
draw of request indices serves both, so every resample holds the same mix of short and long
requests on each side and the mix's own spread stays out of the interval; unpaired, each
sample is drawn on its own.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Change", "bootstrap_change", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), numpy's default (linear) method.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    return _sorted_percentile(ordered, q)


def _sorted_percentile(ordered: Sequence[float], q: float) -> float:
    virtual = (len(ordered) - 1) * (q / 100)
    below = math.floor(virtual)
    above = min(below + 1, len(ordered) - 1)
    t = virtual - below
    return ordered[below] + (ordered[above] - ordered[below]) * t


@dataclass(slots=True, frozen=True)
class Change:
    """B − A of one statistic, with its bootstrap interval at `confidence`."""

    a: float
    b: float
    low: float
    high: float
    confidence: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def percent(self) -> float | None:
        return None if self.a == 0 else 100 * self.delta / self.a

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap_change(a: Sequence[float], b: Sequence[float],
                     statistics: dict[str, Callable[[Sequence[float]], float]], *,
                     resamples: int = 2000, confidence: float = 0.95,
                     seed: int = 0, paired: bool = False) -> dict[str, Change]:
    """Each named statistic's change B − A, with one set of resamples shared by all of them
    (each statistic is given its draw sorted, so percentiles need no sort of their own).
    `paired`: a[i] and b[i] belong together (same length), and are drawn together."""
    if not a or not b:
        raise ValueError("both samples need at least one value")
    if paired and len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError("resamples must be >= 1 and confidence in (0, 1)")
    rng = random.Random(f"{seed}:bootstrap")
    sorted_a, sorted_b = sorted(a), sorted(b)
    deltas: dict[str, list[float]] = {name: [] for name in statistics}
    indices = range(len(a))
    for _ in range(resamples):
        if paired:
            drawn = rng.choices(indices, k=len(a))
            draw_a, draw_b = sorted(a[i] for i in drawn), sorted(b[i] for i in drawn)
        else:
            draw_a = sorted(rng.choices(sorted_a, k=len(sorted_a)))
            draw_b = sorted(rng.choices(sorted_b, k=len(sorted_b)))
        for name, statistic in statistics.items():
            deltas[name].append(statistic(draw_b) - statistic(draw_a))
    tail = 100 * (1 - confidence) / 2
    out = {}
    for name, statistic in statistics.items():
        ordered = sorted(deltas[name])
        out[name] = Change(statistic(sorted_a), statistic(sorted_b),
                           _sorted_percentile(ordered, tail),
                           _sorted_percentile(ordered, 100 - tail), confidence)
    return out


def quantile_statistic(q: float) -> Callable[[Sequence[float]], float]:
    """The q-th percentile of an already sorted sample."""
    return lambda ordered: _sorted_percentile(ordered, q)
