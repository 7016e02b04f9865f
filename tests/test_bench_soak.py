"""bench/soak.py --target proxy at tiny sizes: samples, the verdict and what run_all parses."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_proxy_soak_reports_rss_growth_and_completed_streams():
    out = run_bench_script("soak.py", "--target", "proxy", "--streams", "2", "--minutes", "0.15",
                           "--warmup-minutes", "0.05", "--interval-s", "2", "--chunks", "300",
                           "--gap-ms", "1", timeout_s=120)
    summary = json.loads(out.splitlines()[-1])
    assert summary["target"] == "proxy" and summary["streams"] == 2
    assert summary["requests_ok"] >= 2 and summary["requests_failed"] == 0, out
    assert not summary["server_exited"]
    samples = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(samples) >= 4 and all(float(s[1]) > 0 for s in samples), out
    verdict = "met" if summary["growth_target_met"] else "missed"
    assert (f"RSS growth after warm-up: {summary['growth_after_warmup_pct']:+.2f} % "
            f"(target < 5 %: {verdict})") in out
    assert [r[0] for r in run_all.parse_soak(out)] == [
        "soak: RSS growth after warm-up (2 streams, 0.15 min)", "soak: requests ok / failed"]


def test_a_flag_of_the_other_mode_is_refused_and_the_failure_quotes_stderr():
    with pytest.raises(AssertionError) as refused:
        run_bench_script("soak.py", "--target", "proxy", "--max-tokens", "8", timeout_s=60)
    assert "bench/soak.py exited 2" in str(refused.value)
    assert "--max-tokens does not apply to --target proxy" in str(refused.value)
