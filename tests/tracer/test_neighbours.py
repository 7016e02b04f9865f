"""Neighbours of a request, one piece at a time (docs/architecture.md, "Neighbours"): phases
of a record and of a request in flight, blame by the step record and by fair share, the
culprit named in a verdict, and the bounds of a window. The live scenarios on the real
engine are in tests/server/test_neighbours_live.py."""
from __future__ import annotations

import gc
import random
import tracemalloc

from prometheus_client import CollectorRegistry

from instrumented_engine.engine.step_log import EngineStep, StepLog
from tests.tracer.test_verdict import WARM, record, warm_baseline
from tracer.core.diagnoser import Diagnoser
from tracer.core.neighbourhood import Neighbourhood
from tracer.core.request_tracer import Tracer
from tracer.record.baselines import Baselines
from tracer.record.clock import Clock
from tracer.record.neighbours import culprits, neighbours
from tracer.record.occupancy import Occupancy, of_record, of_snapshot
from tracer.record.stages import SERVER_STAGES, STEP_KINDS
from tracer.record.verdict import judge, name_culprits
from tracer.record.window_limits import MAX_WINDOW_REQUESTS
from tracer.sinks.engine_steps import EngineStepMetrics
from tracer.sinks.store import TraceStore
from tracer.web.ui_timeline import timeline_of

MS = 1_000_000


def occ(rid: str, start: int, end: int, phases, *, prompt: int = 10) -> Occupancy:
    return Occupancy(rid.ljust(32, "0"), rid, "m", start, end, None, tuple(phases), prompt, 0)


def test_a_records_phases_are_contiguous_and_fold_every_stage():
    rec = record({"queue": 300.0, "prefill": 120.0}, trace="7")
    o = of_record(rec)
    assert [p for p, _, _ in o.phases] == ["preprocess", "queue", "prefill", "first_token",
                                            "decode"]
    for (_, _, end), (_, start, _) in zip(o.phases, o.phases[1:]):
        assert end == start
    assert o.phases[0][1] == rec.start_ns and o.phases[-1][2] == rec.end_ns
    assert o.phase_ns_within(0, rec.end_ns)["queue"] == 300 * MS


def test_an_in_flight_request_is_in_its_next_stage_until_now():
    tracer = Tracer(model_names=("m",))
    active = tracer.begin(request_id="r1", model="m", operation="chat", traceparent=None,
                          start_ns=0)
    for stage, t in (("receive", 1), ("template", 2), ("tokenize", 3), ("kv_lookup", 4)):
        active.timeline.mark(stage, t * MS)
    active.timeline.stage_attr("tokenize", "num_prompt_tokens", 900)
    o = of_snapshot(active.timeline.snapshot(), SERVER_STAGES, request_id="r1",
                    trace_id=active.trace_id, model="m", now_ns=50 * MS)
    assert o.phases[-1] == ("queue", 4 * MS, 50 * MS) and o.in_flight
    assert o.num_prompt_tokens == 900 and o.end_ns == 50 * MS
    assert [a.request_id for a in tracer.in_flight()] == ["r1"]
    tracer.finish(active, end_ns=60 * MS, finish_reason="abort")
    assert tracer.in_flight() == []


def test_the_in_flight_registry_pins_no_request_that_never_finishes():
    tracer = Tracer(model_names=("m",))
    for i in range(100):
        tracer.begin(request_id=f"r{i}", model="m", operation="chat", traceparent=None,
                     start_ns=0)
    gc.collect()
    assert tracer.in_flight() == [] and not tracer._in_flight


def test_blame_by_steps_splits_each_step_by_tokens():
    short = occ("short", 10, 100, [("queue", 10, 60), ("prefill", 60, 80)])
    long = occ("long", 0, 200, [("prefill", 0, 60), ("decode", 60, 200)], prompt=4000)
    other = occ("other", 0, 300, [("decode", 0, 300)])
    steps = [EngineStep(0, 30, 511, 1, 0, ("other", "long"), (1, 511)),
             EngineStep(30, 60, 511, 1, 0, ("other", "long"), (1, 511)),
             EngineStep(60, 80, 37, 2, 0, ("other", "long", "short"), (1, 1, 37))]
    found = neighbours(short, [long, other], 10, 80, steps)
    assert [n.occupancy.request_id for n in found] == ["long", "other"]
    by = {n.occupancy.request_id: n for n in found}
    # 20/30 of the first step (inside the window), all of the second, 1/39 of the third.
    assert abs(by["long"].blame_ns - (20 * 511 / 512 + 30 * 511 / 512 + 20 / 39)) <= 1
    assert by["long"].num_shared_steps == 1 and by["other"].num_shared_steps == 1
    assert sum(n.blame_ns for n in found) <= 70
    assert by["long"].phase == "prefill"


def test_blame_without_steps_is_a_fair_share_of_those_holding_the_engine():
    target = occ("t", 0, 100, [("queue", 0, 80), ("prefill", 80, 100)])
    a = occ("a", 0, 50, [("prefill", 0, 50)])
    b = occ("b", 0, 100, [("decode", 0, 100)])
    queued = occ("q", 0, 100, [("queue", 0, 100)])
    found = {n.occupancy.request_id: n.blame_ns for n in neighbours(target, [a, b, queued],
                                                                    0, 80)}
    assert found == {"b": 25 + 30, "a": 25, "q": 0}


def test_property_blames_never_exceed_the_window():
    rng = random.Random(36)
    for _ in range(300):
        others = []
        for i in range(rng.randint(0, 8)):
            t, phases = rng.randint(0, 50), []
            for phase in ("queue", "prefill", "decode"):
                d = rng.randint(0, 40)
                phases.append((phase, t, t + d))
                t += d
            others.append(occ(f"n{i}", phases[0][1], t, phases))
        a, b = sorted(rng.sample(range(0, 150), 2))
        target = occ("t", a, b, [("queue", a, b)])
        found = neighbours(target, others, a, b)
        assert sum(n.blame_ns for n in found) <= (b - a) + len(found)
        assert all(0 <= n.blame_ns and 0 < n.overlap_ns <= b - a for n in found)
        assert [n.blame_ns for n in found] == sorted((n.blame_ns for n in found), reverse=True)


def test_culprits_are_the_fewest_covering_half_the_blame():
    target = occ("t", 0, 100, [("queue", 0, 100)])
    big = occ("big", 0, 100, [("prefill", 0, 100)], prompt=2400)
    small = occ("small", 60, 100, [("decode", 60, 100)])
    named = culprits(neighbours(target, [big, small], 0, 100), 100)
    assert [c["trace_id"][:3] for c in named] == ["big"]
    assert named[0]["prompt_tokens"] == 2400 and named[0]["phase"] == "prefill"
    assert culprits([], 100) == []


def test_a_queueing_verdict_names_its_culprit_and_the_long_prefill_knob():
    baseline = warm_baseline()
    rec = record({"queue": 600.0}, trace="9", prompt=37)
    verdict = judge(rec, baseline, WARM)
    assert verdict.cause == "queueing" and verdict.evidence["culprit_trace_id"] is None
    q0 = rec.stages[4].start_ns
    long = occ("long", q0 - MS, q0 + 700 * MS, [("prefill", q0 - MS, q0 + 700 * MS)],
               prompt=2400)
    found = neighbours(of_record(rec), [long], q0, q0 + 600 * MS)
    named = name_culprits(verdict, found, 600 * MS, 37)
    assert named.evidence["culprit_trace_id"] == long.trace_id
    assert named.evidence["culprit_share"] == 1.0 and named.evidence["num_neighbours"] == 1
    assert named.findings[0].evidence is named.evidence
    assert f"100% of it behind trace {long.trace_id[:8]}…'s 2400-token prefill" \
        in named.sentence()
    assert "--long-prefill-token-threshold" in named.action
    assert "raise --max-num-seqs" in verdict.action          # without the culprit


def test_the_diagnoser_names_a_finished_neighbour_from_the_store():
    store = TraceStore()
    tracer = Tracer(model_names=("m",))
    diagnoser = Diagnoser(Baselines(), neighbourhood=Neighbourhood(store, tracer))
    for i in range(32):
        rec = record(trace=str(i + 100), start_ns=i * 1000 * MS)
        store.put(rec)
        diagnoser.publish(rec)
    start = 40_000 * MS
    slow = record({"queue": 600.0}, trace="5", start_ns=start)
    hog = record({"prefill": 650.0}, trace="6", start_ns=start - 10 * MS, prompt=3000)
    store.put(hog)
    store.put(slow)
    diagnoser.publish(slow)
    assert slow.verdict.cause == "queueing"
    assert slow.verdict.evidence["culprit_trace_id"] == hog.trace_id


def test_a_window_of_10000_requests_is_bounded():
    store = TraceStore(capacity=10_000)
    for i in range(10_000):
        store.put(record(trace=str(i + 1), start_ns=i * MS))
    hood = Neighbourhood(store, Tracer(model_names=("m",)))
    tracemalloc.start()
    body = timeline_of(hood, Clock(), 0, 20_000 * MS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert body["num_requests"] == MAX_WINDOW_REQUESTS
    assert body["num_more_requests"] == 10_000 - MAX_WINDOW_REQUESTS
    assert body["requests"][-1]["trace_id"] == str(10_000).rjust(32, "0")   # newest kept
    assert peak < 64 * 2 ** 20, peak


def test_the_step_log_is_a_bounded_ring_and_its_kinds_are_the_labels():
    log = StepLog(3)
    for i in range(5):
        log.append(EngineStep(i * 10, i * 10 + 9, 0 if i % 2 else 5, 1, 0, ("a", "b"), (1, 5)))
    assert len(log) == 3 and log.num_steps == 5
    assert [s.start_ns for s in log.between(25, 35)] == [20, 30]
    assert {s.kind for s in log.between(0, 100)} <= set(STEP_KINDS)
    assert EngineStep(0, 1, 5, 0, 0, ("a",), (5,)).kind == "prefill"
    assert EngineStep(0, 1, 0, 2, 0, ("a", "b"), (1, 1)).kind == "decode"
    assert StepLog(0).between(0, 10) == []


def test_step_metrics_drop_an_unknown_kind():
    registry = CollectorRegistry()
    steps = EngineStepMetrics(registry, "m")
    steps.observe("mixed", 30 * MS, 513)
    steps.observe("bogus", 30 * MS, 1)
    labels = {"model": "m", "kind": "mixed"}
    assert registry.get_sample_value("llm_engine_step_seconds_count", labels) == 1
    assert registry.get_sample_value("llm_engine_step_tokens_sum", labels) == 513
    assert registry.get_sample_value("llm_engine_step_seconds_count",
                                     {"model": "m", "kind": "bogus"}) is None


def test_a_proxied_request_in_flight_before_its_first_token_is_queued_not_prefilling():
    from tracer.record.stages import PROXY_STAGE_LABELS
    tracer = Tracer(model_names=("m",), stages=PROXY_STAGE_LABELS, source="proxy")
    active = tracer.begin(request_id="p1", model="m", operation="chat", traceparent=None,
                          start_ns=0)
    for stage, t in (("receive", 1), ("upstream_connect", 2), ("upstream_ttfb", 400)):
        active.timeline.mark(stage, t * MS)
    o = of_snapshot(active.timeline.snapshot(), PROXY_STAGE_LABELS, request_id="p1",
                    trace_id=active.trace_id, model="m", now_ns=500 * MS)
    assert o.phases == (("preprocess", 0, 2 * MS), ("queue", 2 * MS, 500 * MS))
