"""A baseline series' median (tracer/record/baselines.py), kept by bisection, against
`statistics.median` of the same window after every observation."""
from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.record.baselines import MIN_SAMPLES, ModelBaseline

numbers = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, width=64),
                    st.sampled_from([0, 1, 1.0, -0.0, 5, 5.0]))   # ties, int/float equals


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 40), values=st.lists(numbers, max_size=120))
def test_the_median_is_the_windows_median_after_every_observation(window, values):
    baseline = ModelBaseline(window)
    kept: list = []
    for value in values:
        baseline.add("s", value)
        kept = (kept + [value])[-window:]
        got = baseline.median("s")
        if len(kept) < MIN_SAMPLES:
            assert got is None
            continue
        want = statistics.median(kept)
        assert got == want or (math.isinf(want) and got == want) or math.isclose(
            got, want, rel_tol=1e-12) or (math.isnan(want) and math.isnan(got))
        assert baseline.samples("s") == len(kept)


def test_nan_is_not_observed():
    baseline = ModelBaseline(16)
    for value in [1.0] * MIN_SAMPLES + [math.nan]:
        baseline.add("s", value)
    assert baseline.samples("s") == MIN_SAMPLES and baseline.median("s") == 1.0
