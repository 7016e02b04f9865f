"""Metrics: names, labels, buckets, exemplars, closed cardinality, exposition, promtool."""
from __future__ import annotations

import importlib.util
import random
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tracer.record.emits import GapSummary
from tracer.record.buckets import (ITL_BUCKETS_S, LOOP_LAG_BUCKETS_S, MAX_GAP_BUCKETS_S,
                                   REQUEST_DURATION_BUCKETS_S, STAGE_BUCKETS_S, TPOT_BUCKETS_S,
                                   TTFT_BUCKETS_S)
from tracer.sinks.client_metrics import CLIENT_STAGE_LABELS
from tracer.sinks.metrics import LLMMetrics, exemplar_for
from tracer.record.labels import cache_outcome, model_label, prompt_len_bucket
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import ALL_STAGE_LABELS, SERVER_STAGES

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"
# The contract, written out from docs/reference.md, "Metrics" (name -> (type, label names)).
EXPECTED = {
    "gen_ai_server_time_to_first_token_seconds": ("histogram", {"gen_ai_request_model", "gen_ai_operation_name"}),
    "gen_ai_server_time_per_output_token_seconds": ("histogram", {"gen_ai_request_model", "gen_ai_operation_name"}),
    "gen_ai_server_request_duration_seconds": ("histogram", {"gen_ai_request_model", "gen_ai_operation_name", "error_type"}),
    "llm_request_stage_duration_seconds": ("histogram", {"stage"}),
    "llm_inter_token_latency_seconds": ("histogram", {"model"}),
    "llm_prompt_tokens": ("counter", {"model"}),
    "llm_prompt_cached_tokens": ("counter", {"model"}),
    "llm_generation_tokens": ("counter", {"model"}),
    "llm_requests": ("counter", {"model", "finish_reason"}),
    "llm_requests_running": ("gauge", {"model"}),
    "llm_requests_waiting": ("gauge", {"model"}),
    "llm_kv_cache_usage_ratio": ("gauge", {"model"}),
    "llm_client_time_to_first_token_seconds": ("histogram", {"model"}),
    # The first output of any kind, and tool calls (tracer/sinks/output_metrics.py).
    "llm_time_to_first_output_seconds": ("histogram", {"model", "kind"}),
    "llm_tool_calls": ("counter", {"model"}),
    # Speculative decoding, as the engine reported it (tracer/sinks/draft_metrics.py).
    "llm_draft_tokens": ("counter", {"model"}),
    "llm_draft_accepted_tokens": ("counter", {"model"}),
    # The GenAI semconv client streaming metrics, from the same beacons.
    "gen_ai_client_operation_time_to_first_chunk_seconds": ("histogram", {"gen_ai_request_model"}),
    "gen_ai_client_operation_time_per_output_chunk_seconds": ("histogram", {"gen_ai_request_model"}),
    "llm_client_network_overhead_seconds": ("histogram", {"model"}),
    "llm_client_render_delay_seconds": ("histogram", {"model"}),
    "llm_probe_beacons": ("counter", {"outcome"}),
    "llm_invalid_token_counts": ("counter", {"kind"}),
    "llm_stream_max_gap_seconds": ("histogram", {"model"}),
    "llm_ttft_by_cache_seconds": ("histogram", {"model", "cache"}),
    "llm_ttft_by_prompt_len_seconds": ("histogram", {"model", "prompt_len"}),
    "llm_client_itl_seconds": ("histogram", {"model"}),
    "llm_client_stream_buffered": ("counter", {"model"}),
    "llm_client_stream_held_back_seconds": ("histogram", {"model"}),
    "llm_client_stage_duration_seconds": ("histogram", {"model", "stage"}),
    "llm_event_loop_lag_seconds": ("histogram", set()),
    # The TTFT verdicts (tracer/record/verdict.py), by the closed cause vocabulary.
    "llm_ttft_cause": ("counter", {"model", "cause"}),
    "llm_ttft_excess_seconds": ("counter", {"model", "cause"}),
    # prometheus_client's ProcessCollector (Linux /proc): CPU starvation is visible.
    "process_cpu_seconds": ("counter", set()),
    "process_virtual_memory_bytes": ("gauge", set()),
    "process_resident_memory_bytes": ("gauge", set()),
    "process_start_time_seconds": ("gauge", set()),
    "process_open_fds": ("gauge", set()),
    "process_max_fds": ("gauge", set()),
}
REPO = Path(__file__).resolve().parents[2]


def make_record(*, model="smollm2", operation="chat", itl_ns=(20_000_000, 90_000_000, 30_000_000),
                finish_reason="stop", error_type=None, trace_id=TRACE_ID, stage_names=SERVER_STAGES,
                num_prompt_tokens=40, num_cached_tokens=16):
    stages = tuple(StageSpan(s, 1_000 + i * 1_000_000, 1_000 + (i + 1) * 1_000_000)
                   for i, s in enumerate(stage_names))
    return RequestRecord(
        request_id="r", trace_id=trace_id, span_id=SPAN_ID, model=model, operation=operation,
        start_ns=1_000, end_ns=1_000 + 500_000_000, stages=stages, unattributed_ns=2_000_000,
        ttft_ns=len(stage_names) * 1_000_000 + 2_000_000, itl=GapSummary.of(itl_ns),
        num_prompt_tokens=num_prompt_tokens, num_cached_tokens=num_cached_tokens,
        num_output_tokens=len(itl_ns) + 1, finish_reason=finish_reason,
        error_type=error_type)


def families(metrics: LLMMetrics) -> dict:
    body, content_type = metrics.exposition(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def sample(fams, family, suffix, **labels):
    matches = [s for s in fams[family].samples if s.name == family + suffix
               and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (family, suffix, labels, matches)
    return matches[0]


def test_exactly_the_design_metrics_with_their_labels():
    fams = families(LLMMetrics(model_names=["smollm2"]))
    assert {name: f.type for name, f in fams.items()} == {k: v[0] for k, v in EXPECTED.items()}
    for name, (_, label_names) in EXPECTED.items():
        seen = {k for s in fams[name].samples for k in s.labels if k not in ("le", "quantile")}
        assert seen == label_names, name


def test_buckets_are_exactly_as_specified():
    assert TTFT_BUCKETS_S == (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                              1.0, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0)
    assert TPOT_BUCKETS_S == (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
    assert REQUEST_DURATION_BUCKETS_S == tuple(0.01 * 2 ** i for i in range(14))
    assert STAGE_BUCKETS_S[0] == 50e-6 and STAGE_BUCKETS_S[-1] == 60.0
    assert all(a < b for a, b in zip(STAGE_BUCKETS_S, STAGE_BUCKETS_S[1:]))
    assert all(a < b for a, b in zip(ITL_BUCKETS_S, ITL_BUCKETS_S[1:]))
    fams = families(LLMMetrics(model_names=["smollm2"]))
    for name, buckets in (("gen_ai_server_time_to_first_token_seconds", TTFT_BUCKETS_S),
                          ("gen_ai_server_time_per_output_token_seconds", TPOT_BUCKETS_S),
                          ("gen_ai_server_request_duration_seconds", REQUEST_DURATION_BUCKETS_S),
                          ("llm_request_stage_duration_seconds", STAGE_BUCKETS_S),
                          ("llm_inter_token_latency_seconds", ITL_BUCKETS_S),
                          ("llm_stream_max_gap_seconds", MAX_GAP_BUCKETS_S),
                          ("llm_ttft_by_cache_seconds", TTFT_BUCKETS_S),
                          ("llm_ttft_by_prompt_len_seconds", TTFT_BUCKETS_S),
                          ("llm_client_time_to_first_token_seconds", TTFT_BUCKETS_S),
                          ("llm_client_itl_seconds", ITL_BUCKETS_S),
                          ("gen_ai_client_operation_time_to_first_chunk_seconds",
                           REQUEST_DURATION_BUCKETS_S),
                          ("gen_ai_client_operation_time_per_output_chunk_seconds",
                           REQUEST_DURATION_BUCKETS_S),
                          ("llm_client_stage_duration_seconds", STAGE_BUCKETS_S),
                          ("llm_event_loop_lag_seconds", LOOP_LAG_BUCKETS_S)):
        first = fams[name].samples[0].labels
        key = {k: v for k, v in first.items() if k != "le"}
        les = [float(s.labels["le"]) for s in fams[name].samples if s.name == name + "_bucket"
               and {k: v for k, v in s.labels.items() if k != "le"} == key]
        assert les == list(buckets) + [float("inf")], name


def test_observe_request_records_every_number_with_trace_exemplars():
    metrics = LLMMetrics(model_names=["smollm2"])
    record = make_record()
    metrics.observe_request(record)
    fams = families(metrics)
    genai = {"gen_ai_request_model": "smollm2", "gen_ai_operation_name": "chat"}
    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert sample(fams, ttft, "_count", **genai).value == 1
    assert sample(fams, ttft, "_sum", **genai).value == pytest.approx(record.ttft_ns / 1e9)
    hit = [s for s in fams[ttft].samples if s.exemplar is not None]
    assert len(hit) == 1 and hit[0].exemplar.labels == {"trace_id": TRACE_ID, "span_id": SPAN_ID}
    assert hit[0].exemplar.value == pytest.approx(record.ttft_ns / 1e9)
    tpot = "gen_ai_server_time_per_output_token_seconds"
    assert sample(fams, tpot, "_sum", **genai).value == pytest.approx(record.tpot_ns / 1e9)
    dur = sample(fams, "gen_ai_server_request_duration_seconds", "_sum", error_type="", **genai)
    assert dur.value == pytest.approx(0.5)
    stage = "llm_request_stage_duration_seconds"
    for name in ALL_STAGE_LABELS:
        expected = 0.002 if name == "unattributed" else 0.001
        assert sample(fams, stage, "_sum", stage=name).value == pytest.approx(expected), name
    assert {s.exemplar.labels["trace_id"] for s in fams[stage].samples if s.exemplar} == {TRACE_ID}
    assert sample(fams, "llm_prompt_tokens", "_total", model="smollm2").value == 40
    assert sample(fams, "llm_prompt_cached_tokens", "_total", model="smollm2").value == 16
    assert sample(fams, "llm_generation_tokens", "_total", model="smollm2").value == 4
    assert sample(fams, "llm_requests", "_total", model="smollm2", finish_reason="stop").value == 1


def test_itl_observes_each_gap_and_puts_the_exemplar_on_the_worst():
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_request(make_record(itl_ns=(20_000_000, 90_000_000, 30_000_000, 90_000_000)))
    fams = families(metrics)
    itl = "llm_inter_token_latency_seconds"
    assert sample(fams, itl, "_count", model="smollm2").value == 4
    assert sample(fams, itl, "_sum", model="smollm2").value == pytest.approx(0.23)
    (with_exemplar,) = [s for s in fams[itl].samples if s.exemplar is not None]
    assert with_exemplar.labels["le"] == "0.1" and with_exemplar.exemplar.value == pytest.approx(0.09)
    assert with_exemplar.exemplar.labels["trace_id"] == TRACE_ID


@pytest.mark.parametrize(("finish_reason", "error_type", "label"), [
    ("abort", None, "abort"), ("error", "timeout", "timeout"), ("error", "KeyError", "other"),
])
def test_error_type_label_is_a_closed_enum(finish_reason, error_type, label):
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_request(make_record(finish_reason=finish_reason, error_type=error_type))
    fams = families(metrics)
    s = sample(fams, "gen_ai_server_request_duration_seconds", "_count", error_type=label,
               gen_ai_request_model="smollm2", gen_ai_operation_name="chat")
    assert s.value == 1
    assert "KeyError" not in metrics.exposition(None)[0].decode()


def series_count(metrics: LLMMetrics) -> int:
    body = metrics.exposition(None)[0].decode()
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def test_junk_from_requests_never_adds_a_series():
    metrics = LLMMetrics(model_names=["smollm2", "llama"])
    before = series_count(metrics)
    rng = random.Random(7)
    junk = lambda: "".join(rng.choices(string.printable, k=rng.randint(1, 40)))  # noqa: E731
    for _ in range(1_000):
        metrics.observe_request(make_record(
            model=junk(), operation=junk(), finish_reason=junk(), error_type=junk(),
            trace_id=junk(), stage_names=(junk(), "prefill")))
        metrics.set_engine_state(junk(), 1, 2, 0.5)
        metrics.observe_client(junk(), 0.1, 0.05, 0.01, junk())
        metrics.count_beacon(junk())
    assert series_count(metrics) == before
    fams = families(metrics)
    assert sample(fams, "llm_requests", "_total", model="other", finish_reason="other").value == 1_000
    assert sample(fams, "llm_probe_beacons", "_total", outcome="other").value == 1_000
    assert sample(fams, "llm_request_stage_duration_seconds", "_count", stage="other").value == 1_000
    assert sample(fams, "llm_requests", "_total", model="smollm2", finish_reason="stop").value == 0


def test_model_fold_is_the_label_rule():
    # The metrics sink folds a model with its own dict lookup (the hot path); it must agree
    # with tracer.record.labels.model_label, which names the model everywhere else.
    served = ["smollm2", "llama"]
    metrics = LLMMetrics(model_names=served)
    names = ("smollm2", "llama", "other", "Smollm2", "smollm2 ", "", "evil<script>")
    for i, name in enumerate(names):
        metrics.observe_request(make_record(model=name, num_prompt_tokens=10 ** i))
    expected: dict[str, int] = {}
    for i, name in enumerate(names):
        label = model_label(name, served)
        expected[label] = expected.get(label, 0) + 10 ** i
    fams = families(metrics)
    for label, tokens in expected.items():
        assert sample(fams, "llm_prompt_tokens", "_total", model=label).value == tokens
    assert sorted(expected) == ["llama", "other", "smollm2"]


def test_engine_state_client_and_beacons():
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.set_engine_state("smollm2", num_running=3, num_waiting=5, kv_usage_ratio=0.75)
    metrics.observe_client("smollm2", 0.4, -0.02, 0.016, TRACE_ID)
    metrics.observe_client("smollm2", None, None, None, None)
    metrics.count_beacon("accepted")
    metrics.count_beacon("rate_limited")
    fams = families(metrics)
    assert sample(fams, "llm_requests_running", "", model="smollm2").value == 3
    assert sample(fams, "llm_requests_waiting", "", model="smollm2").value == 5
    assert sample(fams, "llm_kv_cache_usage_ratio", "", model="smollm2").value == 0.75
    client = "llm_client_time_to_first_token_seconds"
    assert sample(fams, client, "_count", model="smollm2").value == 1
    assert [s.exemplar.labels for s in fams[client].samples if s.exemplar] == [{"trace_id": TRACE_ID}]
    overhead = "llm_client_network_overhead_seconds"
    assert sample(fams, overhead, "_sum", model="smollm2").value == 0   # negative clamped
    assert sample(fams, overhead, "_count", model="smollm2").value == 1
    assert sample(fams, "llm_probe_beacons", "_total", outcome="accepted").value == 1
    assert sample(fams, "llm_probe_beacons", "_total", outcome="unmatched").value == 0


def test_exemplar_respects_the_128_char_limit():
    assert exemplar_for(TRACE_ID, SPAN_ID) == {"trace_id": TRACE_ID, "span_id": SPAN_ID}
    long_trace = "a" * 110
    assert exemplar_for(long_trace, SPAN_ID) == {"trace_id": long_trace}
    assert exemplar_for("a" * 121, None) is None and exemplar_for("", SPAN_ID) is None


def test_exposition_negotiates_the_format():
    metrics = LLMMetrics(CollectorRegistry(), model_names=["smollm2"])
    metrics.observe_request(make_record())
    for accept in (None, "", "text/plain;version=0.0.4", "*/*"):
        body, content_type = metrics.exposition(accept)
        assert content_type.startswith("text/plain") and b"# EOF" not in body
        assert TRACE_ID.encode() not in body    # exemplars are OpenMetrics-only
    body, content_type = metrics.exposition(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n") and TRACE_ID.encode() in body


def test_promtool_check_metrics_is_clean():
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus (Debian package)"
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_request(make_record())
    metrics.observe_client("smollm2", 0.4, 0.1, 0.016, TRACE_ID)
    body, _ = metrics.exposition(None)
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                            timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        (result.stdout, result.stderr)


# --- issue 14: thresholds as bucket edges, TTFT splits, stream gaps, client stages, process --

SEMCONV_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                          2.5, 5.0, 7.5, 10.0)


def _thresholds():
    spec = importlib.util.spec_from_file_location("dashboards_thresholds",
                                                  REPO / "dashboards" / "thresholds.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # a slots dataclass looks its module up while built
    spec.loader.exec_module(module)
    return module.DEFAULT_THRESHOLDS


def test_every_ttft_threshold_is_a_bucket_edge_and_semconv_buckets_are_kept():
    """A quantile or share at a threshold is read at a bucket edge, never interpolated."""
    thresholds = _thresholds()
    # The alerts (server and client TTFT share these buckets) and the 1 s / 2 s share rules.
    for threshold_s in (thresholds.ttft_p95_s, thresholds.client_ttft_p95_s, 1.0, 2.0):
        assert threshold_s in TTFT_BUCKETS_S, threshold_s
    recording = (REPO / "dashboards/prometheus/rules/recording.yml").read_text()
    for le in ('le="1.0"', 'le="2.0"'):   # how prometheus_client writes those edges
        assert le in recording
        assert float(le[4:-1]) in TTFT_BUCKETS_S
    assert set(SEMCONV_TTFT_BUCKETS_S) <= set(TTFT_BUCKETS_S)
    assert list(TTFT_BUCKETS_S) == sorted(set(TTFT_BUCKETS_S))
    body = LLMMetrics(model_names=["smollm2"]).exposition(None)[0].decode()
    assert 'gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_operation_name="chat",' \
           'gen_ai_request_model="smollm2",le="2.0"}' in body


@pytest.mark.parametrize(("prompt", "cached", "outcome"), [
    (40, 0, "miss"), (5000, 0, "miss"),
    (40, 32, "hit"),        # all but the block holding the last token: the best an engine can do
    (500, 436, "hit"),      # 64 left to prefill (more than 10 % of 500)
    (500, 435, "partial"),  # 65 left: over 64 and over 10 %
    (2000, 1800, "hit"),    # 10 % left
    (2000, 1799, "partial"),
    (2000, 16, "partial"),
    (30, 30, "hit"),        # an upstream that reports the whole prompt as cached
])
def test_cache_outcome_rule(prompt, cached, outcome):
    assert cache_outcome(prompt, cached) == outcome


def test_prompt_len_buckets_are_a_closed_ladder():
    assert [prompt_len_bucket(n) for n in (1, 255, 256, 1023, 1024, 4095, 4096, 16383, 16384,
                                           10**7)] == \
        ["lt256", "lt256", "lt1k", "lt1k", "lt4k", "lt4k", "lt16k", "lt16k", "ge16k", "ge16k"]


def test_ttft_is_split_by_cache_outcome_and_prompt_length_with_exemplars():
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_request(make_record(num_prompt_tokens=40, num_cached_tokens=0))      # miss, lt256
    metrics.observe_request(make_record(num_prompt_tokens=3000, num_cached_tokens=2990))  # hit, lt4k
    metrics.observe_request(make_record(num_prompt_tokens=3000, num_cached_tokens=1000))  # partial, lt4k
    metrics.observe_request(make_record(num_prompt_tokens=0, num_cached_tokens=0))        # unknown
    fams = families(metrics)
    ttft_s = make_record().ttft_ns / 1e9
    by_cache, by_len = "llm_ttft_by_cache_seconds", "llm_ttft_by_prompt_len_seconds"
    counts = {c: sample(fams, by_cache, "_count", model="smollm2", cache=c).value
              for c in ("hit", "partial", "miss")}
    assert counts == {"hit": 1, "partial": 1, "miss": 1}
    assert sample(fams, by_cache, "_sum", model="smollm2", cache="hit").value == pytest.approx(ttft_s)
    lens = {b: sample(fams, by_len, "_count", model="smollm2", prompt_len=b).value
            for b in ("lt256", "lt1k", "lt4k", "lt16k", "ge16k")}
    assert lens == {"lt256": 1, "lt1k": 0, "lt4k": 2, "lt16k": 0, "ge16k": 0}
    # The request with no prompt count is in the semconv TTFT, and in neither split.
    assert sample(fams, "gen_ai_server_time_to_first_token_seconds", "_count",
                  gen_ai_request_model="smollm2", gen_ai_operation_name="chat").value == 4
    for name in (by_cache, by_len):
        assert {s.exemplar.labels["trace_id"] for s in fams[name].samples if s.exemplar} == {TRACE_ID}
    # The semconv histogram keeps exactly its standard labels.
    ttft_labels = {k for s in fams["gen_ai_server_time_to_first_token_seconds"].samples for k in s.labels}
    assert ttft_labels == {"gen_ai_request_model", "gen_ai_operation_name", "le"}


def test_a_request_without_a_token_is_in_no_ttft_split():
    metrics = LLMMetrics(model_names=["smollm2"])
    record = make_record()
    record.ttft_ns = None
    metrics.observe_request(record)
    fams = families(metrics)
    assert sum(s.value for s in fams["llm_ttft_by_cache_seconds"].samples
               if s.name.endswith("_count")) == 0


def test_stream_max_gap_is_one_observation_per_request_with_an_exemplar():
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_request(make_record(itl_ns=(20_000_000, 1_500_000_000, 30_000_000)))
    metrics.observe_request(make_record(itl_ns=(40_000_000,)))
    metrics.observe_request(make_record(itl_ns=()))   # one chunk: no gap, no observation
    fams = families(metrics)
    gap = "llm_stream_max_gap_seconds"
    assert sample(fams, gap, "_count", model="smollm2").value == 2
    assert sample(fams, gap, "_sum", model="smollm2").value == pytest.approx(1.54)
    assert sample(fams, gap, "_bucket", model="smollm2", le="1.0").value == 1
    assert sample(fams, gap, "_bucket", model="smollm2", le="2.5").value == 2
    assert {s.exemplar.labels["trace_id"] for s in fams[gap].samples if s.exemplar} == {TRACE_ID}


def test_client_stages_and_client_itl():
    metrics = LLMMetrics(model_names=["smollm2"])
    stages = {"input": 0.12, "dns": 0.0, "tcp": 0.004, "tls": 0.006, "request": 0.3,
              "first_byte": 0.001, "first_token": 0.05, "first_paint": -0.001,
              "junk-stage": 9.0}
    metrics.observe_client("smollm2", 0.4, 0.1, 0.016, TRACE_ID, stages_s=stages,
                           itl_s=[0.02, 0.09, 0.03])
    metrics.observe_client("smollm2", None, None, None, None, stages_s=None, itl_s=())
    fams = families(metrics)
    stage = "llm_client_stage_duration_seconds"
    for name in CLIENT_STAGE_LABELS:
        assert sample(fams, stage, "_count", model="smollm2", stage=name).value == 1, name
        assert sample(fams, stage, "_sum", model="smollm2", stage=name).value == \
            pytest.approx(max(stages[name], 0.0)), name
    assert {s.labels["stage"] for s in fams[stage].samples} == set(CLIENT_STAGE_LABELS)
    assert [s.exemplar.labels for s in fams[stage].samples if s.exemplar][0] == {"trace_id": TRACE_ID}
    itl = "llm_client_itl_seconds"
    assert sample(fams, itl, "_count", model="smollm2").value == 3
    assert sample(fams, itl, "_sum", model="smollm2").value == pytest.approx(0.14)
    (worst,) = [s for s in fams[itl].samples if s.exemplar is not None]
    assert worst.exemplar.value == pytest.approx(0.09) and worst.labels["le"] == "0.1"
    first = "gen_ai_client_operation_time_to_first_chunk_seconds"
    assert sample(fams, first, "_count", gen_ai_request_model="smollm2").value == 1
    assert sample(fams, first, "_sum", gen_ai_request_model="smollm2").value == pytest.approx(0.4)
    per = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert sample(fams, per, "_count", gen_ai_request_model="smollm2").value == 3
    assert sample(fams, per, "_sum", gen_ai_request_model="smollm2").value == pytest.approx(0.14)


def test_event_loop_lag_and_process_metrics():
    metrics = LLMMetrics(model_names=["smollm2"])
    metrics.observe_loop_lag(0.003)
    metrics.observe_loop_lag(-0.001)   # a clock that woke early is no lag
    fams = families(metrics)
    lag = "llm_event_loop_lag_seconds"
    assert sample(fams, lag, "_count").value == 2
    assert sample(fams, lag, "_sum").value == pytest.approx(0.003)
    assert sample(fams, lag, "_bucket", le="0.0025").value == 1
    assert sample(fams, "process_cpu_seconds", "_total").value > 0
    assert sample(fams, "process_start_time_seconds", "").value > 1e9
    assert "process_cpu_seconds" not in families(LLMMetrics(model_names=["m"], process_metrics=False))


def _series_by_family(metrics: LLMMetrics) -> dict[str, int]:
    """Stored series per family, as Prometheus scrapes the classic text format: every sample
    line (`_bucket` per edge, `_sum`, `_count`, `_created`)."""
    from prometheus_client.parser import text_string_to_metric_families as text_families
    body = metrics.exposition(None)[0].decode()
    counts: dict[str, int] = {}
    for family in text_families(body):
        base = family.name.removesuffix("_created")
        counts[base] = counts.get(base, 0) + len(family.samples)
    return counts


# Per family, for one served model (so two model values: it and `other`), each label set
# being (buckets + `+Inf`) + `_sum` + `_count` + `_created` series: the numbers
# docs/reference.md's Metrics table quotes. A change here is a cardinality change.
NEW_SERIES_ONE_MODEL = {
    "llm_stream_max_gap_seconds": 2 * (len(MAX_GAP_BUCKETS_S) + 1 + 3),
    "llm_ttft_by_cache_seconds": 2 * 3 * (len(TTFT_BUCKETS_S) + 1 + 3),
    "llm_ttft_by_prompt_len_seconds": 2 * 5 * (len(TTFT_BUCKETS_S) + 1 + 3),
    "llm_client_itl_seconds": 2 * (len(ITL_BUCKETS_S) + 1 + 3),
    "llm_client_stage_duration_seconds": 2 * 8 * (len(STAGE_BUCKETS_S) + 1 + 3),
    "llm_event_loop_lag_seconds": len(LOOP_LAG_BUCKETS_S) + 1 + 3,
    "gen_ai_server_time_to_first_token_seconds": 2 * 3 * (len(TTFT_BUCKETS_S) + 1 + 3),
}


def test_series_count_for_one_model():
    counts = _series_by_family(LLMMetrics(model_names=["smollm2"]))
    # (buckets + +Inf) + _sum + _count + _created, per label set.
    assert {k: counts[k] for k in NEW_SERIES_ONE_MODEL} == NEW_SERIES_ONE_MODEL
    assert counts["process_cpu_seconds"] == 1
    print("series per family, one model:", counts, "total:", sum(counts.values()))


def test_every_answer_observes_its_first_output_and_only_text_observes_ttft():
    from tracer.record.request_record import ToolCall
    metrics = LLMMetrics(model_names=["smollm2"])
    thinking = make_record(stage_names=SERVER_STAGES + ("reasoning",))
    thinking.first_output_ns, thinking.first_output_kind = 9_000_000, "reasoning"
    calling = make_record()
    calling.ttft_ns, calling.first_output_ns, calling.first_output_kind = None, 9_000_000, "tool_call"
    calling.tool_calls, calling.num_tool_calls = (ToolCall("get_weather", 9_000_000, None),), 40
    for record in (thinking, calling):
        metrics.observe_request(record)
    fams = families(metrics)
    first = "llm_time_to_first_output_seconds"
    for kind, count in (("reasoning", 1), ("tool_call", 1), ("text", 0)):
        assert sample(fams, first, "_count", model="smollm2", kind=kind).value == count
    assert sample(fams, first, "_sum", model="smollm2", kind="tool_call").value == pytest.approx(0.009)
    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert sample(fams, ttft, "_count", gen_ai_request_model="smollm2",
                  gen_ai_operation_name="chat").value == 1    # the tool-call answer has no text
    assert sample(fams, "llm_tool_calls", "_total", model="smollm2").value == 40
    assert sample(fams, "llm_request_stage_duration_seconds", "_count", stage="reasoning").value == 1
    assert "get_weather" not in metrics.exposition(OPENMETRICS)[0].decode()


def test_draft_counts_are_counted_and_an_impossible_pair_is_not():
    metrics = LLMMetrics(model_names=["smollm2"])
    drafted = make_record()
    drafted.num_draft_tokens, drafted.num_draft_accepted = 604, 515
    metrics.observe_request(drafted)
    # More accepted than drafted is not a pair: the record drops both, nothing is counted.
    impossible = RequestRecord("r2", TRACE_ID, SPAN_ID, "smollm2", "chat", 0, 1,
                               num_draft_tokens=2, num_draft_accepted=3)
    assert (impossible.num_draft_tokens, impossible.num_draft_accepted) == (0, 0)
    metrics.observe_request(impossible)
    metrics.observe_request(make_record())                 # no draft model: nothing
    fams = families(metrics)
    assert sample(fams, "llm_draft_tokens", "_total", model="smollm2").value == 604
    assert sample(fams, "llm_draft_accepted_tokens", "_total", model="smollm2").value == 515


@pytest.mark.parametrize("amount", [0.0, -1.0, 1e-9, 0.005, 0.01, 0.0100001, 7.5, 1e9,
                                    float("inf"), float("nan")])
def test_observe_with_writes_what_observe_writes(amount):
    """`observe_with` (the per-record path) against `Histogram.observe`: the same bucket, the
    same sum, the same exemplar (its timestamp is the one given), bucket edges included."""
    from prometheus_client import Histogram

    from tracer.sinks.gap_histogram import observe_with

    exemplar = exemplar_for(TRACE_ID, SPAN_ID)
    fast, slow = (Histogram("h", "h", ("m",), registry=CollectorRegistry(),
                            buckets=TTFT_BUCKETS_S).labels("x") for _ in range(2))
    observe_with(fast, amount, exemplar, 1234.5)
    slow.observe(amount, exemplar)
    assert [b.get() for b in fast._buckets] == [b.get() for b in slow._buckets]
    assert repr(fast._sum.get()) == repr(slow._sum.get())
    for f, s in zip(fast._buckets, slow._buckets):
        fe, se = f.get_exemplar(), s.get_exemplar()
        assert (fe is None) == (se is None)
        if fe is not None:
            assert (fe.labels, repr(fe.value), fe.timestamp) == (se.labels, repr(se.value), 1234.5)
