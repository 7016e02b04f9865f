"""tracer compare: the percentile bootstrap against known cases, and the CLI's exit codes on
small replay results written here (the real-engine pair is tests/integration/
test_replay_engine.py)."""
from __future__ import annotations

import json
import math
import random
import statistics

import numpy as np
import pytest

from tracer.__main__ import main
from tracer.compare.bootstrap import bootstrap_change, percentile, quantile_statistic


def test_percentile_matches_numpy_linear():
    rng = random.Random(1)
    values = [rng.expovariate(1.0) for _ in range(37)]
    for q in (0, 1, 50, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_constant_samples_give_an_exact_interval():
    change = bootstrap_change([5.0] * 30, [7.5] * 40, {"p50": quantile_statistic(50)},
                              resamples=200)["p50"]
    assert (change.a, change.b, change.low, change.high) == (5.0, 7.5, 2.5, 2.5)
    assert change.excludes_zero() and change.percent == 50.0


def test_interval_of_a_mean_difference_matches_the_normal_theory():
    # Known case: for means of two normal samples the 95 % interval is close to
    # delta ± 1.96 × sqrt(s_a²/n_a + s_b²/n_b); the percentile bootstrap must agree.
    rng = random.Random(3)
    a = [rng.gauss(10.0, 2.0) for _ in range(400)]
    b = [rng.gauss(10.5, 2.0) for _ in range(400)]
    change = bootstrap_change(a, b, {"mean": statistics.fmean}, resamples=4000, seed=5)["mean"]
    half = 1.96 * math.sqrt(statistics.variance(a) / 400 + statistics.variance(b) / 400)
    delta = statistics.fmean(b) - statistics.fmean(a)
    assert change.low == pytest.approx(delta - half, abs=0.1 * half)
    assert change.high == pytest.approx(delta + half, abs=0.1 * half)


def test_seeded_and_configurable():
    rng = random.Random(4)
    a, b = [rng.random() for _ in range(30)], [rng.random() for _ in range(30)]
    stats = {"p50": quantile_statistic(50)}
    assert bootstrap_change(a, b, stats, seed=1) == bootstrap_change(a, b, stats, seed=1)
    assert bootstrap_change(a, b, stats, seed=1) != bootstrap_change(a, b, stats, seed=2)
    with pytest.raises(ValueError):
        bootstrap_change(a, b, stats, resamples=0)


def _result(path, prefill_ms: float, ttft_ms: float, cause: str, n: int = 40, sha="x"):
    rng = random.Random(path.name)
    rows = [{"ok": True, "ttft_ms": ttft_ms + rng.random(), "tpot_ms": 10 + rng.random(),
             "cause": cause, "server": {"stages_ms": {"prefill": prefill_ms + rng.random(),
                                                      "queue": 1 + rng.random()}}}
            for _ in range(n)]
    path.write_text(json.dumps({"kind": "ttftscope.replay", "metadata": {"trace_sha256": sha},
                                "requests": rows}))
    return str(path)


def test_cli_prints_changes_and_causes(tmp_path, capsys):
    a = _result(tmp_path / "a.json", 100, 150, "healthy")
    b = _result(tmp_path / "b.json", 50, 100, "prefill_long")
    assert main(["compare", a, b, "--resamples", "300"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "queue" in out and "prefill_long" in out
    assert main(["compare", a, b, "--json", "--resamples", "300"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metrics"]["prefill"]["p50"]["high"] < 0
    assert doc["causes"] == {"healthy": {"a": 40, "b": 0}, "prefill_long": {"a": 0, "b": 40}}


@pytest.mark.parametrize(("gate", "code"), [
    ("ttft@p95:10", 1),     # B − A ≈ +50 ms on 100: worse beyond 10 %
    ("ttft:60", 0),         # ... but not beyond 60 %
    ("prefill:0", 1), ("tpot@p50:50", 0),
    ("nosuch:5", 2), ("ttft@p90:5", 2), ("ttft", 2),
])
def test_fail_if_worse_exit_codes(tmp_path, gate, code):
    a = _result(tmp_path / "a.json", 50, 100, "healthy")
    b = _result(tmp_path / "b.json", 100, 150, "healthy")
    assert main(["compare", a, b, "--resamples", "300", "--fail-if-worse", gate]) == code


def test_bad_input_is_exit_2(tmp_path):
    a = _result(tmp_path / "a.json", 50, 100, "healthy")
    other = _result(tmp_path / "other.json", 50, 100, "healthy", sha="y")
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    assert main(["compare", a, str(junk)]) == 2
    assert main(["compare", a, str(tmp_path / "missing.json")]) == 2
    assert main(["compare", a, other]) == 2      # a different trace is not before/after


def test_paired_draws_keep_a_per_request_shift_exact():
    # Known case: every request of B is its A counterpart + 3 ms. Paired, each resample's
    # percentile moves by exactly 3, so the interval is [3, 3] however mixed the requests are.
    rng = random.Random(8)
    a = [rng.choice((1.0, 50.0, 400.0)) * rng.uniform(0.5, 2) for _ in range(60)]
    b = [x + 3.0 for x in a]
    stats = {f"p{q}": quantile_statistic(q) for q in (50, 95, 99)}
    for change in bootstrap_change(a, b, stats, resamples=300, paired=True).values():
        assert change.low == pytest.approx(3.0) and change.high == pytest.approx(3.0)
    unpaired = bootstrap_change(a, b, stats, resamples=300)["p50"]
    assert unpaired.high - unpaired.low > 10     # the mix's spread, which pairing removes
    with pytest.raises(ValueError):
        bootstrap_change(a, b[:-1], stats, paired=True)
