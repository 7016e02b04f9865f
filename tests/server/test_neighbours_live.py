"""What a slow request waited behind, on the real engine (issue 36, items 1-3 and 7): the step
record, each trace's neighbours, the culprit its verdict names, and the timeline's window.

Requests are sent on events, not timers: the short request leaves once the engine has run a
step of the long one's prefill (the step record's count moves), so it always arrives behind it.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx

from tests.server.test_diagnosis_live import chat, warm
from tracer.record.behind_neighbours import MIN_BLAME_SHARE

LONG_WORDS = " ".join(f"item{i}" for i in range(700))     # ~2,800 tokens


def wait_for_steps(live, after: int, timeout_s: float = 60.0) -> None:
    """Until the engine has recorded more than `after` steps: the event polled on the
    engine's own counter, within a bounded wait."""
    deadline = time.monotonic() + timeout_s
    while live.engine.steps.num_steps <= after and time.monotonic() < deadline:
        threading.Event().wait(0.002)
    assert live.engine.steps.num_steps > after, "the engine ran no step"


def long_then_short(live, *, short: str = "Hi there!") -> tuple[dict, dict]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        before = live.engine.steps.num_steps
        long_future = pool.submit(chat, live, f"Summarise this list: {LONG_WORDS}", max_tokens=24)
        wait_for_steps(live, before)                 # its prefill has started
        short_view = chat(live, short, max_tokens=2)
        long_view = long_future.result()
    return long_view, short_view


def test_a_short_request_behind_a_long_prefill_names_it(server_factory):
    # The long-prefill cap off: the short request waits behind the whole prefill.
    live = server_factory(max_num_seqs=2, long_prefill_token_threshold=0)
    warm(live)
    long_view, short_view = long_then_short(live)
    long_trace = long_view["trace_id"]
    assert long_view["num_prompt_tokens"] > 2000

    neighbours = short_view["neighbours"]
    assert neighbours["items"][0]["trace_id"] == long_trace, neighbours
    first = neighbours["items"][0]
    assert first["blame_ms"] > 0.5 * short_view["server_ttft_ms"], (first, short_view)
    assert first["num_prompt_tokens"] == long_view["num_prompt_tokens"]
    assert first["phases_ms"].get("prefill", 0) > 0
    assert first["num_shared_steps"] >= 1         # the short one's prefill beside its decode

    verdict = short_view["verdict"]
    assert verdict["cause"] in ("queueing", "slow_prefill"), verdict
    assert verdict["evidence"]["culprit_trace_id"] == long_trace
    assert verdict["evidence"]["culprit_prompt_tokens"] == long_view["num_prompt_tokens"]
    assert long_trace[:8] in verdict["sentence"]
    if verdict["evidence"]["culprit_phase"] == "prefill":
        assert "--long-prefill-token-threshold" in verdict["action"], verdict

    # The step record shows the steps they shared, named by both trace ids.
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        timeline = client.get("/ui/api/timeline",
                              params={"trace_id": short_view["trace_id"], "pad_ms": "0"}).json()
    assert timeline["step_log_size"] == live.engine.config.step_log_size
    shared = [s for s in timeline["steps"]
              if {r["trace_id"] for r in s["requests"]} >= {long_trace, short_view["trace_id"]}]
    assert shared, timeline["steps"][:5]
    assert {s["kind"] for s in timeline["steps"]} <= {"prefill", "mixed", "decode"}
    for step in timeline["steps"]:
        assert step["num_prefill_tokens"] == sum(r["num_tokens"] for r in step["requests"]
                                                 if r["phase"] == "prefill")
        assert step["num_decode_seqs"] == sum(r["phase"] == "decode" for r in step["requests"])
    rows = {r["trace_id"]: r for r in timeline["requests"]}
    assert {long_trace, short_view["trace_id"]} <= set(rows)
    phases = [p["phase"] for p in rows[short_view["trace_id"]]["phases"]]
    assert phases[:2] == ["preprocess", "queue"] and "decode" in phases


def test_on_a_fresh_engine_the_short_requests_verdict_names_the_long_one(server_factory):
    """No history at all (not even a warm-up turn): the short request's verdict cannot lean
    on a baseline, yet most of its TTFT went to the long prompt's prefill steps, which the
    step record measures. The verdict names the long request, with its share, and says it
    was judged against no history."""
    live = server_factory(max_num_seqs=2)
    long_view, short_view = long_then_short(live)
    verdict = short_view["verdict"]
    assert verdict["cause"] in ("queueing", "slow_prefill"), verdict
    evidence = verdict["evidence"]
    assert evidence["culprit_trace_id"] == long_view["trace_id"], verdict
    assert evidence["culprit_phase"] == "prefill" and evidence["culprit_share"] >= 0.5
    assert evidence["baseline_samples"] is None
    # "Most of its TTFT" is the rule's bar over the queue and the prefill together; each stage's finding carries its own part, and the
    # verdict names the larger. How it splits depends on when the short one was scheduled:
    # CI at dc83972 saw 751 ms of prefill and the rest queued, of a 1514 ms TTFT.
    behind = [f["excess_ms"] for f in verdict["findings"]
              if f["cause"] in ("queueing", "slow_prefill")]
    assert verdict["excess_ms"] == max(behind), verdict
    assert sum(behind) >= MIN_BLAME_SHARE * short_view["server_ttft_ms"], verdict
    assert long_view["trace_id"][:8] in verdict["sentence"]
    assert "--long-prefill-token-threshold" in verdict["action"], verdict


def test_a_request_alone_has_no_neighbours_and_names_no_culprit(server_factory):
    live = server_factory()
    warm(live, 3)
    view = chat(live, "Alone at last.")
    assert view["neighbours"] == {"window": "ttft", "items": [], "num_more": 0}
    assert view["verdict"]["evidence"].get("culprit_trace_id") is None


def test_a_burst_names_the_requests_ahead(server_factory):
    live = server_factory(max_num_seqs=2)
    warm(live)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        views = list(pool.map(lambda i: chat(live, f"Burst {i}: tell me a story.",
                                             max_tokens=16), range(10)))
    by_trace = {v["trace_id"]: v for v in views}
    late = sorted(views, key=lambda v: v["time_unix_ms"])[-4:]
    for view in late:
        items = view["neighbours"]["items"]
        assert items, view["trace_id"]
        named = {n["trace_id"] for n in items if n["blame_ms"] > 0}
        # Whoever held the engine while it waited arrived before it finished waiting.
        assert named and named <= set(by_trace), named
        if view["verdict"]["cause"] == "queueing":
            culprit = view["verdict"]["evidence"]["culprit_trace_id"]
            assert culprit in named


def test_timeline_window_by_times_and_bad_windows(server_factory):
    live = server_factory()
    view = chat(live, "One request.")
    start = view["time_unix_ms"]
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        body = client.get("/ui/api/timeline", params={"from_unix_ms": str(start - 1000),
                                                       "to_unix_ms": str(start + 60_000)}).json()
        assert view["trace_id"] in {r["trace_id"] for r in body["requests"]}
        assert body["num_steps"] >= 1
        for params, status in (({"from_unix_ms": "5", "to_unix_ms": "4"}, 400),
                               ({"from_unix_ms": "1", "to_unix_ms": str(10 ** 12)}, 400),
                               ({"from_unix_ms": "x1", "to_unix_ms": "2"}, 400),
                               ({"trace_id": "f" * 32}, 404),
                               ({"trace_id": view["trace_id"], "pad_ms": "-1"}, 400),
                               ({}, 400)):
            r = client.get("/ui/api/timeline", params=params)
            assert r.status_code == status, (params, r.text)
            assert r.json()["error"]["message"]


def test_the_window_as_a_perfetto_file(server_factory):
    live = server_factory()
    view = chat(live, "A request for Perfetto.")
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        r = client.get("/ui/api/perfetto", params={"trace_id": view["trace_id"]})
        timeline = client.get("/ui/api/timeline", params={"trace_id": view["trace_id"]}).json()
        assert client.get("/ui/api/perfetto", params={"pad_ms": "x"}).status_code == 400
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    events = r.json()["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert len(steps) == timeline["num_steps"] >= 1
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(view["trace_id"][:8] in n for n in names), names
