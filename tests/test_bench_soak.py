"""bench/soak.py --target proxy at tiny sizes: the costs, every bound reported full before the
measured phase, the samples, the summary and what run_all parses."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402

PROXY_BOUNDS = ("trace store", "engine join (parked records)",
                "diagnosis: recent prompt pieces", "diagnosis: baselines")


def test_proxy_soak_fills_every_bound_then_measures_rss():
    out = run_bench_script("soak.py", "--target", "proxy", "--streams", "2", "--minutes", "0.15",
                           "--warmup-minutes", "1.5", "--interval-s", "2", "--chunks", "40",
                           "--gap-ms", "0.2", "--trace-store-capacity", "50",
                           "--join-max-pending", "50", timeout_s=240)
    lines = out.splitlines()
    summary = json.loads(lines[-1])
    assert summary["target"] == "proxy" and summary["streams"] == 2
    assert summary["requests_ok"] >= 2 and summary["requests_failed"] == 0, out
    assert not summary["server_exited"]
    # Costs first, one row per structure, before the server took a request.
    costs = [line for line in lines if line.startswith("cost at bound: ")]
    assert [c.split(":", 1)[1].split()[0] for c in costs] == ["trace", "diagnosis", "engine"], out
    # The last warm-up report, read from the server, says every bound is full, and only then
    # does the measured phase start.
    done = lines.index("warm-up done: every bound full; measuring 0.15 min")
    last_report = [line.strip() for line in lines[:done] if line.startswith("  ")][-4:]
    assert [line.split(": bound")[0] for line in last_report] == [f"FULL  {n}" for n in PROXY_BOUNDS]
    assert summary["bounds_full"] == dict.fromkeys(PROXY_BOUNDS, True)
    samples = [line.split() for line in lines[done:] if line.strip()[:1].isdigit()]
    assert len(samples) >= 4 and all(float(s[1]) > 0 for s in samples), out
    assert (f"measured phase start {summary['rss_after_warmup_mib']} MiB, end "
            f"{summary['rss_end_mib']} MiB, max {summary['rss_max_mib']} MiB; slope "
            f"{summary['slope_mib_per_10min']:+.2f} MiB per 10 min") in out
    assert summary["rss_max_mib"] >= max(summary["rss_after_warmup_mib"], summary["rss_end_mib"])
    assert [r[0] for r in run_all.parse_soak(out)] == [
        "soak: RSS growth after warm-up (2 streams, 0.15 min)",
        "soak: RSS slope after warm-up (2 streams, 0.15 min)", "soak: requests ok / failed"]


def test_a_flag_of_the_other_mode_is_refused_and_the_failure_quotes_stderr():
    with pytest.raises(AssertionError) as refused:
        run_bench_script("soak.py", "--target", "proxy", "--max-tokens", "8", timeout_s=60)
    assert "bench/soak.py exited 2" in str(refused.value)
    assert "--max-tokens does not apply to --target proxy" in str(refused.value)
    with pytest.raises(AssertionError) as refused:
        run_bench_script("soak.py", "--target", "engine", "--join-max-pending", "8", timeout_s=60)
    assert "--join-max-pending does not apply to --target engine" in str(refused.value)
