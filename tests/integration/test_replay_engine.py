"""Replay a Mooncake trace against the real engine with prefix caching on and off, then
compare: prefill must fall and kv_lookup rise with intervals that exclude zero, cached tokens
must appear only where hash_ids repeat, and the send lag is measured at the recorded rate
(issue 33; docs/reference.md, "Trace replay" and "Compare")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.replay_support import synthetic_trace, write_trace

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
# The bound on loopback; measured, not assumed (the test prints what it saw).
SEND_LAG_P99_MS = 5.0


def _replay(base_url: str, model: str, trace: Path, out: Path) -> dict:
    # A process of its own, as a user runs it: the in-process server's engine loop must not
    # share the replay client's interpreter (its GIL would be measured as send lag).
    run = subprocess.run(
        [sys.executable, "-m", "tracer", "bench", "--base-url", base_url, "--model", model,
         "--replay", str(trace), "--out", str(out), "--no-progress", "--timeout-s", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stdout)
    return json.loads(out.read_text())


def _compare(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracer", "compare", str(a), str(b), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def replays(server_factory, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("replay")
    trace = write_trace(folder / "trace.jsonl", synthetic_trace())
    out = {"trace": trace}
    for name, caching in (("off", False), ("on", True)):
        # One sequence at a time: a request's prefill stage then holds its own tokens, not
        # its batch-mates' (on a saturated engine every step fills the token budget, and
        # per-request prefill would measure the budget, not the cache).
        live = server_factory(enable_prefix_caching=caching, max_num_seqs=1)
        out[name] = _replay(live.base_url, live.model, trace, folder / f"{name}.json")
        out[f"{name}_path"] = folder / f"{name}.json"
    return out


def test_every_request_completes_with_its_exact_lengths_and_server_record(replays):
    lines = [json.loads(x) for x in replays["trace"].read_text().splitlines()]
    for name in ("off", "on"):
        doc = replays[name]
        assert doc["summary"]["failed"] == 0, doc["summary"]["failed_by_kind"]
        assert doc["metadata"]["num_joined"] == len(lines)
        for row in doc["requests"]:
            line = lines[row["line"] - 1]
            assert row["output_tokens"] == line["output_length"]
            assert row["server"]["num_prompt_tokens"] == line["input_length"]
            assert row["cause"] is not None
            assert {"prefill", "kv_lookup"} <= set(row["server"]["stages_ms"])


def test_cached_tokens_only_where_hash_ids_repeat(replays):
    for row in replays["off"]["requests"]:
        assert row["server"]["num_cached_tokens"] == 0
    hits = 0
    for row in replays["on"]["requests"]:
        cached = row["server"]["num_cached_tokens"]
        assert cached <= row["repeated_prefix_blocks"] * 16, row
        hits += cached > 0
    repeating = sum(r["repeated_prefix_blocks"] > 0 for r in replays["on"]["requests"])
    # A repeat finds the cache only if the request it repeats was computed before it
    # arrived (the lookup runs on arrival), so not every repeat is a hit.
    print(f"requests with cached tokens: {hits} of {repeating} whose hash_ids repeat")
    assert hits > 0


def test_send_lag_at_the_recorded_rate(replays):
    for name in ("off", "on"):
        lag = replays[name]["send_lag_ms"]
        print(f"caching {name}: send lag p50 {lag['p50']:.3f} p99 {lag['p99']:.3f} "
              f"max {lag['max']:.3f} ms")
        if lag["p99"] > SEND_LAG_P99_MS and os.getloadavg()[0] > 2 * (os.cpu_count() or 1):
            # Said, not loosened: on a machine this oversubscribed the client is not run
            # when its deadline comes, which no scheduler can fix.
            pytest.xfail(f"send lag p99 {lag['p99']:.1f} ms > {SEND_LAG_P99_MS} ms with load "
                         f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        assert lag["p99"] <= SEND_LAG_P99_MS, lag


def test_compare_shows_prefill_down_and_kv_lookup_up(replays):
    run = _compare(replays["off_path"], replays["on_path"], "--json", "--resamples", "1000")
    assert run.returncode == 0, run.stderr
    print(_compare(replays["off_path"], replays["on_path"], "--resamples", "1000").stdout)
    metrics = json.loads(run.stdout)["metrics"]
    # At the median: the tails of 40 requests on a loaded machine are one or two requests'
    # stalls (measured p95 intervals straddled 0), the body of the distribution is not.
    prefill, kv_lookup = metrics["prefill"]["p50"], metrics["kv_lookup"]["p50"]
    assert prefill["high"] < 0, prefill          # cached blocks are not computed again
    assert kv_lookup["low"] > 0, kv_lookup       # off, the lookup returns before hashing


def test_compare_exit_codes_gate_on_the_interval(replays, tmp_path):
    off, on = replays["off_path"], replays["on_path"]
    # Caching off after caching on: prefill is worse beyond 10 %, with the interval's word.
    assert _compare(on, off, "--fail-if-worse", "prefill@p50:10").returncode == 1
    assert _compare(off, on, "--fail-if-worse", "prefill:10").returncode == 0
    assert _compare(off, on, "--fail-if-worse", "nosuch:5").returncode == 2
    assert _compare(off, on, "--fail-if-worse", "prefill@p42:5").returncode == 2
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    assert _compare(off, junk).returncode == 2
