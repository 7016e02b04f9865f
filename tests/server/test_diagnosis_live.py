"""Each TTFT cause induced for real on our engine, and the verdict `/ui` shows for it (issue 31,
item 6). The real model under uvicorn on loopback; every test starts its own server, so its
baselines hold only what the test sent (the first request, then `warm` short turns).

The scenarios that need a browser or a foreign engine (buffering behind nginx, a network
delay, llama-server behind the proxy) are in tests/integration/ and tests/proxy/.
"""
from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import httpx
import pytest

from tracer.record.causes import NO_CAUSE
from tracer.record.traceparent import parse_server_timing, parse_traceparent

URL = "/v1/chat/completions"
NUM_WARM = 10
# A system prompt of ~700 tokens: 30 numbered rules, each line shared by every request.
RULES = "\n".join(f"Rule {i}: the assistant must always be polite and answer in full "
                  f"sentences about topic {i}." for i in range(30))


def chat(live, content: str, *, system: str | None = None, max_tokens: int = 2) -> dict:
    """One streamed chat turn; its waterfall as /ui serves it (verdict included)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": content}]
    with httpx.Client(base_url=live.base_url, timeout=180) as client:
        r = client.post(URL, json={"model": live.model, "messages": messages, "stream": True,
                                   "max_tokens": max_tokens, "temperature": 0})
        assert r.status_code == 200, r.text
        trace_id = parse_traceparent(parse_server_timing(r.headers["server-timing"])).trace_id
        view = client.get(f"/ui/api/trace/{trace_id}").json()
    assert view["verdict"] is not None, view
    return view


def warm(live, n: int = NUM_WARM, prefix: str = "Say hi") -> list[dict]:
    return [chat(live, f"{prefix}, number {i}.") for i in range(n)]


def cause(view: dict) -> str:
    return view["verdict"]["cause"]


def test_first_request_after_start_is_cold_path(server_factory):
    live = server_factory()
    first = chat(live, "Hello!")
    assert cause(first) == "cold_path", first["verdict"]
    assert first["verdict"]["evidence"]["requests_since_start"] == 0
    assert "first request since start" in first["verdict"]["sentence"]
    # The second is judged against the first, no longer cold.
    assert cause(chat(live, "Hello again!")) != "cold_path"


def test_a_fresh_engines_second_request_is_not_judged_healthy(server_factory):
    """One request of history is not a normal: the second is `unjudged`, says how much
    history there is, and is counted apart from healthy; once the baselines hold 8
    requests the same kind of request is judged."""
    live = server_factory()
    chat(live, "Hello!")
    second = chat(live, "Hello again!")
    verdict = second["verdict"]
    assert cause(second) == "unjudged", verdict
    assert verdict["excess_ms"] is None
    # At most the one request there is (0 where a rule's series is per prompt length and
    # this length is new), of the 8 a series needs.
    history = verdict["evidence"]["baseline_samples"]
    assert history in (0, 1) and verdict["evidence"]["min_samples"] == 8, verdict
    assert f"{history} of 8 requests so far" in verdict["sentence"], verdict
    metrics = httpx.get(live.base_url + "/metrics", timeout=10).text
    counted = {c: _sample(metrics, "llm_ttft_cause_total", cause=c)
               for c in ("cold_path", "unjudged", "healthy")}
    assert counted == {"cold_path": 1.0, "unjudged": 1.0, "healthy": 0.0}, counted
    views = warm(live, NUM_WARM, prefix="Hello again")
    judged = views[-1]["verdict"]
    assert judged["cause"] != "unjudged", judged
    assert judged["evidence"]["baseline_samples"] is None \
        or judged["evidence"]["baseline_samples"] >= 8, judged


def _sample(exposition: str, name: str, **labels: str) -> float:
    """The value of one series of a text exposition; 0 when absent."""
    for line in exposition.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_burst_beyond_max_num_seqs_is_queueing(server_factory):
    live = server_factory(max_num_seqs=2)
    warm(live)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        views = list(pool.map(lambda i: chat(live, f"Burst {i}: tell me a story.",
                                             max_tokens=16), range(6)))
    queued = [v for v in views if cause(v) == "queueing"]
    # Two run at once; at least the last two of six waited for a slot behind them.
    assert len(queued) >= 2, [v["verdict"] for v in views]
    for view in queued:
        evidence = view["verdict"]["evidence"]
        assert evidence["queue_stage"] == "queue"
        assert evidence["queue_ms"] > evidence["normal_queue_ms"]
        # It arrived behind someone (a step in flight counts: its slot was not free yet).
        assert evidence["num_running_at_arrival"] + evidence["num_waiting_at_arrival"] >= 1
        assert view["verdict"]["excess_ms"] > 0
        assert "raise --max-num-seqs" in view["verdict"]["sentence"]
    # ... and at least one arrived behind a full batch's worth (two slots) of requests.
    assert max(v["verdict"]["evidence"]["num_running_at_arrival"]
               + v["verdict"]["evidence"]["num_waiting_at_arrival"] for v in queued) >= 2


def test_a_long_prompt_after_short_ones(server_factory):
    live = server_factory()
    warm(live)
    words = " ".join(f"item{i}" for i in range(700))     # ~2,800 tokens
    view = chat(live, f"Summarise this list: {words}")
    assert cause(view) == "long_prompt", view["verdict"]
    evidence = view["verdict"]["evidence"]
    assert evidence["uncached_tokens"] > 4 * evidence["usual_uncached_tokens"]
    assert view["num_prompt_tokens"] > 2000


def test_shared_system_prompt_changing_at_its_start_misses_at_its_end_hits(server_factory):
    live = server_factory()
    warm(live)
    # Changing only at its end: the shared rules start the prompt, the cache serves them.
    at_end = [chat(live, "What is rule 3?", system=f"{RULES}\nNow: 2026-12-03T05:0{i}:00Z")
              for i in range(3)]
    assert all(v["num_cached_tokens"] > 0.8 * v["num_prompt_tokens"] for v in at_end[1:])
    assert [cause(v) for v in at_end[1:]].count("prefix_cache_miss") == 0, \
        [v["verdict"] for v in at_end]
    # A timestamp on top: the same rules, and the cache can serve none of them.
    at_start = [chat(live, "What is rule 3?", system=f"Now: 2026-12-03T05:1{i}:00Z\n{RULES}")
                for i in range(3)]
    for view in at_start[1:]:
        assert cause(view) == "prefix_cache_miss", view["verdict"]
        evidence = view["verdict"]["evidence"]
        assert evidence["shared_fraction"] > 0.9
        assert evidence["cached_tokens"] < 0.1 * evidence["prompt_tokens"]
        assert "does not start the prompt" in view["verdict"]["sentence"]


def test_a_cjk_first_token_that_is_not_printable(server_factory):
    live = server_factory()
    warm(live)
    # Greedy: SmolLM2's first answer token to this prompt is half of a UTF-8 character.
    view = chat(live, "日本の首都はどこですか？", max_tokens=6)
    assert cause(view) == "first_printable_late", view["verdict"]
    assert view["verdict"]["evidence"]["tokens_before_text"] >= 2


def test_a_host_busy_during_prefill_is_slow_prefill(server_factory, tmp_path):
    live = server_factory(max_num_batched_tokens=512)
    words = [" ".join(f"w{j}x{i}" for j in range(80)) for i in range(NUM_WARM + 1)]
    for i in range(NUM_WARM):
        chat(live, f"Count these: {words[i]}")     # ~300 uncached tokens each
    # Two processes spinning on both cores while the next prompt of the same length runs;
    # stopped by the test (a timeout bounds them if it dies).
    hogs = [subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
            for _ in range(3)]
    try:
        view = chat(live, f"Count these: {words[NUM_WARM]}")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)
    assert cause(view) == "slow_prefill", view["verdict"]
    evidence = view["verdict"]["evidence"]
    assert evidence["prefill_ms_per_token"] >= 1.5 * evidence["normal_prefill_ms_per_token"]


@pytest.mark.parametrize("path", ["/ui/api/diagnosis?minutes=5", "/ui/api/diagnosis"])
def test_the_window_ranks_what_the_requests_said(server_factory, path):
    live = server_factory(max_num_seqs=1)
    warm(live, 4)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        views = list(pool.map(lambda i: chat(live, f"Burst {i}", max_tokens=12), range(3)))
    window = httpx.get(live.base_url + path + "&slo_ms=1" if "?" in path
                       else live.base_url + path + "?slo_ms=1", timeout=10).json()
    by_cause = {c["cause"]: c for c in window["causes"]}
    counted = {}
    for view in [*views]:
        counted[cause(view)] = counted.get(cause(view), 0) + 1
    assert window["num_requests"] == 4 + 3
    for name, n in counted.items():
        assert by_cause[name]["num_requests"] >= n
    # With a 1 ms SLO every request is over it: the top cause is the costliest.
    top = window["causes"][0]
    assert top["above_slo_s"] == max(c["above_slo_s"] for c in window["causes"]
                                     if c["cause"] not in NO_CAUSE)
    assert {s["trace_id"] for c in window["causes"] for s in c["slowest"]} <= {
        v["trace_id"] for v in views} | {r["trace_id"] for r in httpx.get(
            live.base_url + "/ui/api/requests", timeout=10).json()["requests"]}
