"""bench/vs_llamacpp.py without the 9-minute llama.cpp build: its statistics and verdicts on
hand-made results, the servers' command lines, and the whole client path (warm-up,
interleaved rounds, report, run_all's parser) against two fake upstreams on loopback, one
streaming 20x slower than the other."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
import vs_llamacpp as vs  # noqa: E402

from tracer.bench.stats import RequestResult  # noqa: E402
from tracer.testing.fake_upstream import FakeUpstream  # noqa: E402

MS = 1_000_000


def result(ttft_ms: int, gaps_ms: list[int], ok: bool = True, index: int = 0) -> RequestResult:
    content, t = [ttft_ms * MS], ttft_ms * MS
    for gap in gaps_ms:
        t += gap * MS
        content.append(t)
    return RequestResult(index=index, sent_ns=0, finished_ns=t, content_ns=tuple(content),
                         done_ns=t, completion_tokens=len(content),
                         error_kind=None if ok else "timeout")


def test_decode_rate_is_tokens_after_the_first_over_time_after_the_first():
    # 3 tokens in 30 ms after the first, and 1 token in 70 ms: 4 tokens / 0.1 s, not the
    # mean of the two rates (100 and ~14 tok/s).
    rows = [result(50, [10, 10, 10]), result(500, [70]), result(5, [1, 1], ok=False),
            result(7, [])]
    assert vs.decode_tok_s(rows) == pytest.approx(40.0)
    assert vs.decode_tok_s([result(7, [])]) is None


def test_ttft_percentiles_pool_completed_requests_only():
    rows = [result(ms, [1]) for ms in (10, 20, 30, 40)] + [result(1000, [1], ok=False)]
    assert vs.pooled_ttft_ms(rows, 50) == pytest.approx(25.0)
    assert vs.pooled_ttft_ms(rows, 95) == pytest.approx(38.5)     # numpy's linear rule
    assert vs.pooled_ttft_ms([result(9, [1], ok=False)], 50) is None


def test_targets_and_verdicts():
    faster, slower = vs.Target(">=", 1.5), vs.Target("<=", 0.7)
    assert faster.met(1.5) and not faster.met(1.49) and not faster.met(None)
    assert slower.met(0.7) and not slower.met(0.71)
    assert str(faster) == ">= 1.5x"

    def runs(tok_s: float, ttft_ms: int, gap_ms: int) -> dict[int, vs.Runs]:
        out = {level: vs.Runs() for level in vs.LEVELS}
        for level in vs.LEVELS:
            out[level].add({"output_throughput_tok_s": tok_s},
                           [result(ttft_ms, [gap_ms] * 3, index=i) for i in range(4)])
        return out

    rows = vs.comparison_rows({vs.OURS: runs(300.0, 100, 5), vs.LLAMA: runs(150.0, 200, 10)})
    by_name = {row[0]: row for row in rows}
    assert by_name["16 streams output tok/s"][1:] == ("300.0", "150.0", "2.00x", ">= 1.5x", "met")
    assert by_name["16 streams TTFT p95 ms"][3:] == ("0.50x", "<= 0.7x", "met")
    assert by_name["1 stream decode tok/s"][1:] == ("200.0", "100.0", "2.00x", ">= 0.7x", "met")
    assert by_name["16 streams TTFT p50 ms"][4:] == ("", "")        # context, no target
    rows = vs.comparison_rows({vs.OURS: runs(100.0, 300, 20), vs.LLAMA: runs(150.0, 200, 10)})
    assert [row[5] for row in rows if row[4]] == ["missed", "missed", "missed"]


def test_both_servers_get_the_same_model_and_threads():
    gguf, binary = pathlib.Path("/m/SmolLM2.gguf"), pathlib.Path("/x/llama-server")
    theirs = vs.llama_server_argv(binary, gguf, 9001, threads=2, slots=16, ctx_tokens=8192)
    ours = vs.ours_argv(gguf, 9002, threads=2)
    assert theirs[theirs.index("--model") + 1] == ours[ours.index("--model") + 1] == str(gguf)
    assert theirs[theirs.index("--threads") + 1] == theirs[theirs.index("--threads-batch") + 1] \
        == ours[ours.index("--num-threads") + 1] == "2"
    assert theirs[theirs.index("--parallel") + 1] == "16" and "--cont-batching" in theirs
    assert theirs[theirs.index("--host") + 1] == ours[ours.index("--host") + 1] == "127.0.0.1"


def test_the_client_path_against_two_fake_servers(capsys):
    fast = FakeUpstream(chunks=8, gap_ms=1).start()
    slow = FakeUpstream(chunks=8, gap_ms=20).start()
    try:
        rc = vs.main(["--ours-url", fast.base_url, "--llamacpp-url", slow.base_url,
                      "--rounds", "2", "--requests-16", "4", "--requests-1", "2",
                      "--output-tokens", "8", "--prompt-words", "16", "--timeout-s", "30"])
    finally:
        fast.stop()
        slow.stop()
    out = capsys.readouterr().out
    assert rc == 0, out
    rounds = [line.split()[1:5] for line in out.splitlines() if line.startswith("round ")]
    # Interleaved: each level on both engines in turn, the order flipped every round.
    assert rounds == [["0", "16", "streams", "ours"], ["0", "16", "streams", "llama.cpp"],
                      ["0", "1", "stream", "ours"], ["0", "1", "stream", "llama.cpp"],
                      ["1", "16", "streams", "llama.cpp"], ["1", "16", "streams", "ours"],
                      ["1", "1", "stream", "llama.cpp"], ["1", "1", "stream", "ours"]], out
    assert "output tokens per request: ours [8], llama.cpp [8] (same, as asked)" in out
    rows = {figure: (value, target) for figure, value, target in run_all.parse_vs_llamacpp(out)}
    assert len(rows) == 7, out
    # 8 events 1 ms apart against 20 ms apart: ours decodes and streams far faster.
    assert rows["1 stream decode tok/s"][1] == ">= 0.7x (met)"
    assert rows["16 streams output tok/s"][1] == ">= 1.5x (met)"
    assert rows["16 streams TTFT p95 ms"][1].startswith("<= 0.7x (")
    for upstream in (fast, slow):
        bodies = [json.loads(r.body) for r in upstream.state.requests
                  if r.path == "/v1/chat/completions"]
        assert len(bodies) == 3 + 2 * (4 + 2)          # warm-up, then 2 rounds of 4 + 2
        assert all(b["stream"] and b["temperature"] == 0.0 and b["max_tokens"] == 8
                   and b["ignore_eos"] is True for b in bodies)
    prompts = [sorted(json.dumps(json.loads(r.body)["messages"]) for r in u.state.requests
                      if r.path == "/v1/chat/completions") for u in (fast, slow)]
    assert prompts[0] == prompts[1]                    # the same prompts for both engines


def test_other_processes_cpu_is_what_the_servers_and_client_did_not_use():
    before = {vs.OURS: 1.0, vs.LLAMA: 2.0, "client": 3.0, "busy": 10.0}
    after = {vs.OURS: 2.0, vs.LLAMA: 2.0, "client": 3.5, "busy": 14.0}
    assert vs.CpuMeter.others_s(before, after) == pytest.approx(2.5)
    # Per-process and system counters tick at different moments: never below zero.
    assert vs.CpuMeter.others_s(before, {**after, "busy": 11.0}) == 0.0


def test_the_time_budget_stops_between_pairs_of_runs(capsys):
    fast, slow = FakeUpstream(chunks=4).start(), FakeUpstream(chunks=4).start()
    try:
        rc = vs.main(["--ours-url", fast.base_url, "--llamacpp-url", slow.base_url,
                      "--rounds", "3", "--max-seconds", "0", "--requests-16", "2",
                      "--requests-1", "1", "--output-tokens", "4", "--prompt-words", "8"])
    finally:
        fast.stop()
        slow.stop()
    out = capsys.readouterr().out
    assert rc == 0, out
    # The first round always runs, both levels on both engines; then the budget stops it.
    assert [line.split()[1] for line in out.splitlines() if line.startswith("round ")] == ["0"] * 4
    assert "stopped in round 1: the next runs would pass --max-seconds 0" in out
    assert "medians over 1 interleaved rounds" in out
