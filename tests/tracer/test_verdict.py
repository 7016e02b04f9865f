"""The TTFT verdict's rules, one record at a time (tracer/record/cause_rules.py, run by
tracer/record/verdict.py): each cause fires on its own signal, not on a neighbour's, is
judged against the baseline rather than the largest bar, and reports the excess it explains. The live scenarios that induce each cause
on the real engine are in tests/server/test_diagnosis_live.py."""
from __future__ import annotations

import random

import pytest

from tracer.core.diagnoser import Diagnoser
from tracer.record.baselines import MIN_SAMPLES, ModelBaseline
from tracer.record.causes import CAUSE_BY_NAME, CAUSE_NAMES, CAUSES, ENGINES, NO_CAUSE
from tracer.record.prompt_overlap import Overlap
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES
from tracer.record.diagnosis_signals import Context, observe
from tracer.record.verdict import Verdict, judge, judge_client

MS = 1_000_000
# A healthy short chat turn on a CPU engine: ~60 ms of TTFT, mostly prefill.
NORMAL = {"receive": 0.5, "template": 0.2, "tokenize": 0.3, "kv_lookup": 0.1, "queue": 0.5,
          "prefill": 50.0, "sample": 1.0, "detokenize": 0.1, "send": 0.3}


def record(stage_ms=None, *, prompt=40, cached=0, events=(), trace="1", model="m",
           kv_attrs=None, detok_tokens=1, start_ns=0, source="engine", attrs=None,
           stages=SERVER_STAGES) -> RequestRecord:
    durations = {**NORMAL, **(stage_ms or {})}
    spans, t = [], start_ns
    for stage in stages:
        end = t + int(durations[stage] * MS)
        stage_attrs = {}
        if stage == "kv_lookup":
            stage_attrs = dict(kv_attrs or {})
        if stage == "detokenize":
            stage_attrs = {"num_tokens": detok_tokens}
        spans.append(StageSpan(stage, t, end, stage_attrs))
        t = end
    return RequestRecord(f"r{trace}", trace.rjust(32, "0"), "1" * 16, model, "chat", start_ns,
                         t + 10 * MS, stages=tuple(spans), ttft_ns=t - start_ns,
                         num_prompt_tokens=prompt, num_cached_tokens=cached,
                         num_output_tokens=4, events=tuple(events), source=source,
                         attrs=dict(attrs or {}))


def thinking_record(reasoning_ms: float, reasoning_tokens: int | None = 700) -> RequestRecord:
    """A reasoning model's answer: the nine stages end at its first thinking, the `reasoning`
    segment runs to the first text (docs/architecture.md, "First output, by kind")."""
    attrs = {} if reasoning_tokens is None else {"llm.usage.reasoning_tokens": reasoning_tokens}
    return record({"reasoning": reasoning_ms}, stages=SERVER_STAGES + ("reasoning",),
                  attrs=attrs)


# A disaggregated request behind the proxy (SGLang's stages): the KV cache moves after the
# prefill worker's prefill (docs/architecture.md, "Inside the engine").
PD_STAGES = ("receive", "upstream_connect", "upstream_request", "queue", "prefill",
             "kv_transfer", "engine_other", "upstream_response", "send")
PD_NORMAL = {"upstream_connect": 0.3, "upstream_request": 1.0, "kv_transfer": 20.0,
             "engine_other": 3.0, "upstream_response": 0.5}


def pd_record(kv_ms: float = 20.0, *, prompt: int = 400, trace: str = "1") -> RequestRecord:
    return record({**PD_NORMAL, "kv_transfer": kv_ms}, prompt=prompt, trace=trace,
                  stages=PD_STAGES, source="proxy", attrs={"llm.engine.source": "sglang"})


def pd_baseline(n: int = 32, seed: int = 3) -> ModelBaseline:
    """`n` disaggregated requests of 400 prompt tokens, their KV moved in ~20 ms."""
    rng, baseline = random.Random(seed), ModelBaseline(256)
    for i in range(n):
        observe(baseline, pd_record(20.0 * (1 + rng.uniform(-0.1, 0.1)), trace=str(i)))
    return baseline


def warm_baseline(n=32, jitter=0.1, seed=7, prompt=40) -> ModelBaseline:
    """`n` healthy requests with ±jitter around NORMAL."""
    rng = random.Random(seed)
    baseline = ModelBaseline(256)
    for i in range(n):
        observe(baseline, record({s: v * (1 + rng.uniform(-jitter, jitter))
                                  for s, v in NORMAL.items()}, prompt=prompt, trace=str(i)))
    return baseline


WARM = Context(requests_since_start=32, idle_s=0.5)


def test_the_vocabulary_is_closed_and_complete():
    assert CAUSE_NAMES == tuple(c.name for c in CAUSES)
    assert len(set(CAUSE_NAMES)) == len(CAUSE_NAMES)
    assert {"queueing", "long_prompt", "prefix_cache_miss", "slow_prefill", "cpu_preprocessing",
            "network", "buffering", "first_printable_late", "cold_path", "preempted",
            "thinking", "slow_kv_transfer", "backend", "healthy", "unjudged"} == set(CAUSE_NAMES)
    for cause in CAUSES:
        # Every verdict names the history it was judged against.
        assert cause.evidence[-1] == "baseline_samples", cause.name
        if cause.name in NO_CAUSE:
            continue
        # Every cause names the knob on every engine, its signals and its evidence.
        assert set(cause.actions) == set(ENGINES), cause.name
        assert cause.signals and cause.evidence, cause.name


def test_a_normal_request_is_healthy_whatever_its_largest_bar():
    verdict = judge(record(), warm_baseline(), WARM)
    # Prefill is 85 % of this TTFT and still healthy: it is normal for 40 tokens.
    assert verdict.cause == "healthy" and verdict.excess_ns == 0 and verdict.findings == ()
    assert verdict.evidence == {"baseline_samples": 32}     # judged against 32 requests


def test_no_history_no_healthy():
    """The same normal request against a baseline of 3 requests: every rule that could
    find it slow needs 8, so it is not judged, and the sentence says how much there is."""
    young = warm_baseline(n=3)
    verdict = judge(record(), young, Context(requests_since_start=3, idle_s=0.5))
    assert verdict.cause == "unjudged" and verdict.excess_ns is None
    assert verdict.evidence["baseline_samples"] == 3 and verdict.evidence["min_samples"] == 8
    # The prefill is most of the TTFT: only the prefill's normal could clear it.
    assert verdict.evidence["unjudged_causes"] == "slow_prefill"
    assert "3 of 8 requests" in verdict.sentence() and "slow_prefill" in verdict.sentence()
    # One request more than MIN_SAMPLES - 1 and the same record is healthy.
    assert judge(record(), warm_baseline(n=MIN_SAMPLES), WARM).cause == "healthy"
    # A stage under the floor needs no history to be fine: a tiny TTFT's queue is not asked.
    assert "queueing" not in verdict.evidence["unjudged_causes"]
    # Every stage short, yet the model has no normal TTFT (no floor): still not judged.
    quick = judge(record({"prefill": 5.0}), young, Context(requests_since_start=3, idle_s=0.5))
    assert quick.cause == "unjudged" and quick.evidence["unjudged_causes"] == ""
    assert "3 of 8 requests so far (needed to know this model's normal TTFT)" in quick.sentence()


def test_a_new_prompt_length_is_not_judged_by_another_lengths_normal():
    baseline = warm_baseline()                       # 40-token prompts only
    verdict = judge(record({"prefill": 90.0}, prompt=70), baseline, WARM)
    assert verdict.cause == "unjudged"
    assert verdict.evidence == {"min_samples": 8, "unjudged_causes": "slow_prefill",
                                "baseline_samples": 0}


def test_queueing_reports_the_wait_and_the_load_at_arrival():
    rec = record({"queue": 400.0}, kv_attrs={"num_waiting": 3, "num_running": 4})
    verdict = judge(rec, warm_baseline(), WARM)
    assert verdict.cause == "queueing"
    assert verdict.excess_ns == pytest.approx(399.5 * MS, rel=0.01)
    assert verdict.evidence["num_waiting_at_arrival"] == 3
    assert verdict.evidence["num_running_at_arrival"] == 4
    assert "raise --max-num-seqs" in verdict.sentence()


def test_a_queue_in_an_empty_engine_is_not_waiting_for_a_slot():
    # Nothing waiting or running at arrival: the wait was the step loop starting late on a
    # starved host, and the first request since start stays a cold path.
    empty = {"num_waiting": 0, "num_running": 0}
    assert judge(record({"queue": 400.0}, kv_attrs=empty), warm_baseline(), WARM).cause \
        == "healthy"
    first = judge(record({"queue": 150.0}, kv_attrs=empty), ModelBaseline(256), Context())
    assert first.cause == "cold_path" and [f.cause for f in first.findings] == ["cold_path"]
    # Requests waiting at arrival: the queue was behind them, which needs no history.
    behind = judge(record({"queue": 150.0}, kv_attrs={"num_waiting": 2, "num_running": 1}),
                   ModelBaseline(256), Context())
    assert behind.cause == "queueing" and behind.findings[1].cause == "cold_path"
    assert behind.evidence["normal_queue_ms"] is None
    assert behind.evidence["baseline_samples"] is None
    assert "with no normal known yet, with 2 waiting and 1 running" in behind.sentence()
    # One running and none waiting: a step in flight or a full batch; only the usual queue
    # tells them apart, so without one the queue is not judged.
    busy = judge(record({"queue": 150.0}, kv_attrs={"num_waiting": 0, "num_running": 1}),
                 ModelBaseline(256), Context(requests_since_start=1, idle_s=0.1))
    assert busy.cause == "unjudged" and "queueing" in busy.evidence["unjudged_causes"]
    # With one, it is a slot to wait for.
    warm = judge(record({"queue": 150.0}, kv_attrs={"num_waiting": 0, "num_running": 1}),
                 warm_baseline(), WARM)
    assert warm.cause == "queueing" and warm.evidence["baseline_samples"] == 32


def test_a_queue_within_the_floor_is_not_a_cause():
    # 8 ms over a 0.5 ms normal: under MIN_EXCESS_MS, and under a quarter of a 54 ms TTFT.
    assert judge(record({"queue": 8.5}), warm_baseline(), WARM).cause == "healthy"


def test_long_prompt_is_judged_against_the_usual_length():
    baseline = warm_baseline()
    long = record({"prefill": 2000.0}, prompt=2000, cached=0)
    verdict = judge(long, baseline, WARM)
    assert verdict.cause == "long_prompt"
    assert verdict.evidence["usual_uncached_tokens"] == 40
    # The prefill beyond what 40 tokens take at this one's rate.
    assert verdict.excess_ns == pytest.approx(2000 * MS * (1 - 40 / 2000), rel=0.01)
    # The same prompt is no longer "long" once the model's traffic is that long.
    long_traffic = warm_baseline(prompt=2000)
    assert judge(long, long_traffic, WARM).cause != "long_prompt"


def test_prefix_cache_miss_needs_shared_text_and_few_cached_tokens():
    baseline = warm_baseline()
    shared = Context(overlap=Overlap(0.95, "f" * 32), requests_since_start=32, idle_s=0.5)
    # 1,000 tokens, 95 % of the text seen recently, nothing cached: a miss.
    miss = record({"prefill": 400.0}, prompt=1000, cached=0)
    verdict = judge(miss, baseline, shared)
    assert verdict.cause == "prefix_cache_miss"
    assert verdict.evidence["shared_with_trace_id"] == "f" * 32
    assert verdict.evidence["cacheable_tokens"] == 950
    assert verdict.excess_ns == pytest.approx(400 * MS * 950 / 1000, rel=0.01)
    # The same text served from the cache: no miss.
    hit = record({"prefill": 30.0}, prompt=1000, cached=944)
    assert "prefix_cache_miss" not in {f.cause for f in judge(hit, baseline, shared).findings}
    # Nothing shared: no miss, whatever the cached tokens.
    assert "prefix_cache_miss" not in {f.cause for f in judge(miss, baseline, WARM).findings}


def test_slow_prefill_against_the_same_length():
    baseline = warm_baseline()
    verdict = judge(record({"prefill": 160.0}), baseline, WARM)
    assert verdict.cause == "slow_prefill"
    assert verdict.evidence["uncached_tokens"] == 40
    assert verdict.excess_ns == pytest.approx(110 * MS, rel=0.1)
    # 1.3x normal is noise, not a cause (SLOW_PREFILL_FACTOR).
    assert judge(record({"prefill": 65.0}), baseline, WARM).cause == "healthy"


def test_cpu_preprocessing_names_the_slowest_stage():
    verdict = judge(record({"tokenize": 120.0}), warm_baseline(), WARM)
    assert verdict.cause == "cpu_preprocessing"
    assert verdict.evidence["slowest_stage"] == "tokenize"


def test_first_printable_late_counts_the_tokens_before_text():
    rec = record({"detokenize": 16.0}, detok_tokens=2)
    verdict = judge(rec, warm_baseline(), WARM)
    assert verdict.cause == "first_printable_late"
    assert verdict.evidence["tokens_before_text"] == 2
    # One token, the same duration: not this cause.
    assert judge(record({"detokenize": 16.0}), warm_baseline(),
                 WARM).cause != "first_printable_late"


def test_cold_path_first_request_and_after_idle():
    empty = ModelBaseline(256)
    first = judge(record(), empty, Context(requests_since_start=0))
    assert first.cause == "cold_path" and first.excess_ns is None
    assert "first request since start" in first.sentence()
    baseline = warm_baseline()
    slow_after_idle = record({"prefill": 300.0})
    verdict = judge(slow_after_idle, baseline, Context(requests_since_start=32, idle_s=600))
    assert "cold_path" in {f.cause for f in verdict.findings}
    # The same request with no idle time before it is not cold.
    assert "cold_path" not in {f.cause for f in judge(slow_after_idle, baseline, WARM).findings}


def test_preempted_before_the_first_token_only():
    before = record({"prefill": 150.0}, events=[("preempted", 30 * MS, {})])
    verdict = judge(before, warm_baseline(), WARM)
    assert "preempted" in {f.cause for f in verdict.findings}
    after = record(events=[("preempted", 10_000 * MS, {})])   # during decode: not TTFT's
    assert judge(after, warm_baseline(), WARM).cause == "healthy"


def test_the_cause_is_the_largest_excess_and_every_finding_is_kept():
    rec = record({"queue": 300.0, "tokenize": 120.0})
    verdict = judge(rec, warm_baseline(), WARM)
    assert verdict.cause == "queueing"
    assert [f.cause for f in verdict.findings] == ["queueing", "cpu_preprocessing"]


def test_deterministic_given_the_record_and_the_baseline():
    rec = record({"queue": 300.0, "prefill": 140.0})
    assert judge(rec, warm_baseline(), WARM) == judge(rec, warm_baseline(), WARM)


def test_a_proxy_record_waits_in_upstream_other_and_names_its_engine():
    stages = ("receive", "upstream_connect", "upstream_other", "prefill", "upstream_response",
              "send")
    durations = {"upstream_connect": 0.2, "upstream_other": 1.0, "upstream_response": 0.5}
    baseline = ModelBaseline(256)
    for i in range(MIN_SAMPLES * 2):
        observe(baseline, record(durations, stages=stages, source="proxy", trace=str(i)))
    slow = record({**durations, "upstream_other": 900.0}, stages=stages, source="proxy",
                  attrs={"llm.engine.source": "llamacpp"})
    verdict = judge(slow, baseline, WARM)
    assert verdict.cause == "queueing" and verdict.evidence["queue_stage"] == "upstream_other"
    assert verdict.engine == "llama.cpp" and verdict.action == "raise -np (parallel slots)"


def test_client_network_and_buffering_join_the_server_verdict():
    baseline = warm_baseline()
    server = judge(record(), baseline, WARM)
    ttft_ms = server.ttft_ns / MS
    far = judge_client(server, {"client_ttft_ms": ttft_ms + 900, "network_overhead_ms": 900.0,
                                "buffering": None}, baseline)
    assert far.cause == "network" and far.client_joined
    assert far.excess_ns == pytest.approx(900 * MS)
    near = judge_client(server, {"client_ttft_ms": ttft_ms + 5, "network_overhead_ms": 5.0},
                        baseline)
    assert near.cause == "healthy" and near.client_joined
    held = judge_client(server, {"client_ttft_ms": ttft_ms + 700, "network_overhead_ms": 700.0,
                                 "buffering": {"buffered": True, "held_back_ms": 650.0,
                                               "num_events": 12}}, baseline)
    assert held.cause == "buffering" and held.evidence["held_back_ms"] == 650.0


def test_every_cause_has_a_sentence_with_its_numbers_and_action():
    for name in CAUSE_NAMES:
        cause = CAUSE_BY_NAME[name]
        evidence = {key: 1 for key in cause.evidence}
        evidence.update({"queue_stage": "queue", "slowest_stage": "tokenize",
                         "shared_fraction": 0.9, "requests_since_start": 0, "idle_s": 1.0,
                         "unjudged_causes": "slow_prefill"})
        evidence["client_ttft_ms"] = 30.0
        verdict = Verdict(name, 5 * MS, evidence, (), 20 * MS, "vLLM")
        sentence = verdict.sentence()
        assert sentence.endswith(".") and "{" not in sentence and "?" not in sentence
        assert sentence[0].isupper()
        assert name == "healthy" or cause.title[1:] in sentence
        if name in ("network", "buffering"):   # what the browser waited, not the server
            assert "5 ms of the 30 ms client TTFT" in sentence
        elif name not in NO_CAUSE:
            assert cause.actions["vLLM"] in sentence and "5 ms of the 20 ms TTFT" in sentence


def test_the_diagnoser_learns_after_judging_and_keeps_no_prompt():
    diagnoser = Diagnoser(measure_cpu=True)
    system = "\n".join(f"Rule {i}: answer politely and in full sentences." for i in range(40))
    first = record({"prefill": 300.0}, prompt=600, trace="1")
    first.prompt_source = [{"role": "system", "content": "Now: 05:00:01\n" + system}]
    diagnoser.publish(first)
    assert first.verdict.cause == "cold_path" and first.prompt_source is None
    second = record({"prefill": 300.0}, prompt=600, cached=0, trace="2", start_ns=10**9)
    second.prompt_source = [{"role": "system", "content": "Now: 05:00:02\n" + system}]
    diagnoser.publish(second)
    assert second.verdict.cause == "prefix_cache_miss"
    assert second.verdict.evidence["shared_with_trace_id"] == first.trace_id
    assert diagnoser.num_records == 2 and diagnoser.us_per_record > 0


def test_each_finding_reports_exactly_its_causes_declared_evidence():
    baseline = warm_baseline()
    for i in range(MIN_SAMPLES):                # the model usually thinks ~500 ms
        observe(baseline, thinking_record(500.0 + i))
    shared = Context(overlap=Overlap(0.95, "f" * 32), requests_since_start=32, idle_s=600)
    records = [(record({"queue": 400.0, "tokenize": 120.0, "detokenize": 30.0,
                        "prefill": 4000.0}, prompt=4000, detok_tokens=3,
                       events=[("preempted", 30 * MS, {})]), WARM),
               (record({"prefill": 400.0}, prompt=1000), shared),
               (record({"prefill": 160.0}), Context(requests_since_start=32, idle_s=600)),
               (thinking_record(2000.0), WARM)]
    found = {}
    for rec, context in records:
        for finding in judge(rec, baseline, context).findings:
            found[finding.cause] = finding
    for finding in judge(pd_record(90.0), pd_baseline(), WARM).findings:
        found[finding.cause] = finding
    server = judge(record(), baseline, WARM)
    for client in ({"client_ttft_ms": 950.0, "network_overhead_ms": 900.0},
                   {"client_ttft_ms": 950.0, "network_overhead_ms": 900.0,
                    "buffering": {"buffered": True, "held_back_ms": 650.0, "num_events": 12}}):
        top = judge_client(server, client, baseline).findings[0]
        found[top.cause] = top
    # `backend` is the whole path's (tests/collect/test_path_verdict.py checks its evidence).
    assert set(found) == set(CAUSE_NAMES) - {"healthy", "unjudged", "backend"}
    for name, finding in found.items():
        assert set(finding.evidence) == set(CAUSE_BY_NAME[name].evidence), name


def test_a_kv_transfer_slow_for_its_length_is_the_cause():
    verdict = judge(pd_record(90.0), pd_baseline(), WARM)
    assert verdict.cause == "slow_kv_transfer"
    assert verdict.excess_ns == pytest.approx(70 * MS, rel=0.1)
    assert verdict.evidence["prompt_tokens"] == 400
    assert verdict.evidence["kv_transfer_ms"] == 90.0
    assert verdict.evidence["expected_kv_transfer_ms"] == pytest.approx(20.0, rel=0.1)
    sentence = verdict.sentence()
    assert "prefill worker to the decode worker" in sentence and "400 prompt tokens" in sentence
    assert "--disaggregation-transfer-backend" in sentence and "(SGLang)" in sentence


def test_a_kv_transfer_usual_for_its_length_is_not_a_cause():
    baseline = pd_baseline()
    # Twice the transfer for a prompt of the same power of two, 1.8x as long: normal.
    assert judge(pd_record(36.0, prompt=500), baseline, WARM).cause == "healthy"
    # A length never seen has no normal yet: no verdict either way.
    assert "slow_kv_transfer" not in {
        f.cause for f in judge(pd_record(900.0, prompt=4000), baseline, WARM).findings}
    # Nor before the series holds enough transfers.
    assert judge(pd_record(90.0), pd_baseline(n=4), WARM).cause != "slow_kv_transfer"


def test_a_request_without_a_first_token_gets_no_verdict_and_teaches_nothing():
    diagnoser = Diagnoser()
    failed = record(trace="1")
    failed.ttft_ns, failed.error_type = None, "internal_error"
    failed.prompt_source = [{"role": "user", "content": "a prompt line that is long enough"}]
    diagnoser.publish(failed)
    assert failed.verdict is None and failed.prompt_source is None
    # The next one is still the first the model has seen: nothing was learnt from the failure.
    first = record(trace="2")
    diagnoser.publish(first)
    assert first.verdict.cause == "cold_path"


def test_a_long_think_is_the_cause_and_a_usual_one_is_not():
    baseline = warm_baseline()
    # No usual think yet: a reasoning model always thinks, so a long one is not judged.
    assert judge(thinking_record(3000.0), baseline, WARM).cause == "unjudged"
    for i in range(32):                         # the model usually thinks ~500 ms
        observe(baseline, thinking_record(500.0 + i))
    long = judge(thinking_record(3000.0), baseline, WARM)
    assert long.cause == "thinking"
    assert long.evidence["reasoning_tokens"] == 700
    assert long.evidence["reasoning_ms"] == 3000.0
    assert 2400 * MS <= long.excess_ns <= 2600 * MS
    assert "3000 ms before its first text" in long.sentence().replace(",", "")
    assert "--reasoning-budget" in CAUSE_BY_NAME["thinking"].actions["llama.cpp"]
    assert judge(thinking_record(510.0, None), baseline, WARM).cause != "thinking"


class _Neighbourhood:
    """What `tracer.core.neighbourhood.Neighbourhood` answers, fixed: every window's
    neighbours are `found`; `step_log_size` None is a proxy (no step record)."""

    def __init__(self, found, step_log_size=8192):
        self.found, self.step_log_size, self.asked = found, step_log_size, []

    def neighbours_of(self, record, from_ns, to_ns, *, recent_only=False):
        # The diagnosis runs on the tracer's worker: this process's records only, never a
        # database read (tracer/core/neighbourhood.py).
        assert recent_only
        self.asked.append((from_ns, to_ns))
        return self.found


def _behind_long(blame_ms: float) -> list:
    from tracer.record.neighbours import Neighbour
    from tracer.record.occupancy import Occupancy
    long = Occupancy("a" * 32, "ra", "m", 0, 10**10, 10**10,
                     (("prefill", 0, 10**10),), 4000, 0)
    return [Neighbour(long, int(blame_ms * MS), int(blame_ms * MS), {"prefill": 1}, 3)]


def test_a_fresh_engines_short_request_behind_a_long_prefill_names_it():
    """No history at all: the short request's prefill was mostly the long one's steps. The
    verdict names it (the neighbours' blame is measured by the step record), with its share,
    and the long-prefill knob; the history it was judged against is none."""
    short = record({"prefill": 400.0}, prompt=37, kv_attrs={"num_waiting": 0, "num_running": 1})
    diagnoser = Diagnoser(neighbourhood=_Neighbourhood(_behind_long(370.0)))
    diagnoser.publish(short)
    verdict = short.verdict
    assert verdict.cause == "slow_prefill", verdict
    assert verdict.excess_ns == 370 * MS
    assert verdict.evidence["culprit_trace_id"] == "a" * 32
    assert verdict.evidence["culprit_share"] == pytest.approx(370 / 400, abs=0.01)
    assert verdict.evidence["baseline_samples"] is None
    assert verdict.evidence["normal_prefill_ms_per_token"] is None
    assert set(verdict.evidence) == set(CAUSE_BY_NAME["slow_prefill"].evidence)
    assert "cold_path" in {f.cause for f in verdict.findings}     # it was the first, too
    assert "--long-prefill-token-threshold" in verdict.action
    assert "no normal known for this length yet" in verdict.sentence()


def test_the_neighbours_judge_only_most_of_a_ttft_and_only_when_measured():
    short = lambda trace: record({"prefill": 400.0}, prompt=37, trace=trace,  # noqa: E731
                                 kv_attrs={"num_waiting": 0, "num_running": 1})
    # A third of the TTFT behind it: not most of it, so the second request is not judged.
    diagnoser = Diagnoser(neighbourhood=_Neighbourhood(_behind_long(150.0)))
    diagnoser.publish(short("1"))
    second = short("2")
    diagnoser.publish(second)
    assert second.verdict.cause == "unjudged", second.verdict
    # Behind a proxy the blame is a fair share, not a measurement: nothing is asked.
    proxy = _Neighbourhood(_behind_long(370.0), step_log_size=None)
    diagnoser = Diagnoser(neighbourhood=proxy)
    diagnoser.publish(short("1"))
    second = short("2")
    diagnoser.publish(second)
    assert second.verdict.cause == "unjudged" and proxy.asked == []
    # With a baseline for its length the prefill rule judges, and the neighbours are asked
    # only for its culprit: a normal prefill stays healthy whoever shared its steps.
    warm = Diagnoser(neighbourhood=_Neighbourhood(_behind_long(40.0)))
    for i in range(32):
        warm.publish(record(trace=str(i), start_ns=i * 10**9))
    warm.neighbourhood.asked.clear()
    normal = record(trace="99", start_ns=40 * 10**9)
    warm.publish(normal)
    assert normal.verdict.cause == "healthy" and warm.neighbourhood.asked == []


def test_the_ui_draws_the_same_outcomes_as_no_cause():
    """/ui keeps its own copy of the outcomes that name no cause (it draws `unjudged` grey,
    not green); it must be the vocabulary's."""
    import json
    import re
    from pathlib import Path
    ui = (Path(__file__).parents[2] / "tracer/web/static/ui/requests_table.js").read_text()
    found = re.search(r"^const NO_CAUSE = (\[.*?\]);$", ui, re.M)
    assert found and tuple(json.loads(found[1].replace("'", '"'))) == NO_CAUSE
