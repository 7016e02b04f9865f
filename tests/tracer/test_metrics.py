"""Metrics: names, labels, buckets, exemplars, closed cardinality, exposition, promtool."""
from __future__ import annotations

import random
import shutil
import string
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tracer.sinks.metrics import (ITL_BUCKETS_S, REQUEST_DURATION_BUCKETS_S, STAGE_BUCKETS_S,
                            TPOT_BUCKETS_S, TTFT_BUCKETS_S, LLMMetrics, exemplar_for)
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
    "llm_client_network_overhead_seconds": ("histogram", {"model"}),
    "llm_client_render_delay_seconds": ("histogram", {"model"}),
    "llm_probe_beacons": ("counter", {"outcome"}),
}


def make_record(*, model="smollm2", operation="chat", itl_ns=(20_000_000, 90_000_000, 30_000_000),
                finish_reason="stop", error_type=None, trace_id=TRACE_ID, stage_names=SERVER_STAGES):
    stages = tuple(StageSpan(s, 1_000 + i * 1_000_000, 1_000 + (i + 1) * 1_000_000)
                   for i, s in enumerate(stage_names))
    return RequestRecord(
        request_id="r", trace_id=trace_id, span_id=SPAN_ID, model=model, operation=operation,
        start_ns=1_000, end_ns=1_000 + 500_000_000, stages=stages, unattributed_ns=2_000_000,
        ttft_ns=len(stage_names) * 1_000_000 + 2_000_000, itl_ns=itl_ns, num_prompt_tokens=40,
        num_cached_tokens=16, num_output_tokens=len(itl_ns) + 1, finish_reason=finish_reason,
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
                              1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
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
                          ("llm_inter_token_latency_seconds", ITL_BUCKETS_S)):
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
