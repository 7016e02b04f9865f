"""History from the store: `compare` between two stored windows, through a live server."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi import FastAPI

from store_support import finish_request, serving
from tracer.web.observability import ObservabilitySettings, build_observability

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path):
    """A store-backed front's /ui on loopback: before a "deploy" every TTFT is 20 ms, after
    it 60 ms; yields (base URL, the deploy's unix ms)."""
    obs = build_observability(ObservabilitySettings(store=f"sqlite:///{tmp_path / 'h.db'}"),
                              model_names=("m",))
    base_ns = time.perf_counter_ns() - 10 * 10**9   # ten seconds of history
    for i in range(40):
        finish_request(obs, i, ttft_ms=20.0, start_ns=base_ns + i * 50_000_000)
    deploy_ns = base_ns + 4 * 10**9
    deploy_ms = obs.clock.to_epoch_ns(deploy_ns) // 1_000_000
    for i in range(40, 80):
        finish_request(obs, i, ttft_ms=60.0, start_ns=deploy_ns + (i - 40) * 50_000_000)
    obs.tracer.drain(10)
    assert obs.store.writer.flush()
    app = FastAPI()
    obs.include_routes(app)
    with serving(app) as url:
        yield url, deploy_ms
    obs.close()


def _compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracer", "compare", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_compare_takes_two_stored_windows(served):
    url, deploy_ms = served
    run = _compare("--url", url, "--before", f"1h..{deploy_ms}", "--after", f"{deploy_ms}..",
                   "--json", "--resamples", "200", "--fail-if-worse", "ttft@p50:10")
    assert run.returncode == 1, run.stderr        # TTFT tripled: the gate fails
    result = json.loads(run.stdout)
    p50 = result["metrics"]["ttft"]["p50"]
    assert p50["a"] == pytest.approx(20.0, abs=0.5) and p50["b"] == pytest.approx(60.0, abs=0.5)
    assert p50["excludes_zero"] and result["num_paired"]["ttft"] == [40, 40]
    assert "prefill" in result["metrics"]          # each stage, from the stored records
    assert "FAIL ttft p50" in run.stderr


def test_compare_windows_are_checked(served):
    url, deploy_ms = served
    for args, message in (
            (["--url", url], "--before"),
            (["--url", url, "--before", "nonsense"], "SINCE..UNTIL"),
            (["--url", url, "--before", f"{deploy_ms}..{deploy_ms - 5}"], "after its start"),
            (["a.json", "b.json", "--url", url, "--before", "1h.."], "not both")):
        run = _compare(*args)
        assert run.returncode == 2 and message in run.stderr, (args, run.stderr)
