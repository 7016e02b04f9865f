"""The proxy's /metrics: its own serving metrics over the proxy stages, plus the upstream's
families re-exported under the upstream's own names; a missing upstream endpoint is no error."""
from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from proxy_support import closed_port
from tracer.testing.fake_upstream import MODEL
from tracer.proxy.upstream_metrics import UpstreamMetricsCollector, render_families
from tracer.record.stages import OUTPUT_SEGMENTS, PROXY_STAGE_LABELS

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def scrape(proxy, accept: str | None) -> httpx.Response:
    response = httpx.get(proxy.base_url + "/metrics", headers={"accept": accept} if accept else {})
    assert response.status_code == 200
    return response


def test_upstream_families_are_re_exported_under_their_own_names(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    httpx.post(proxy.base_url + "/v1/chat/completions", json=STREAM).raise_for_status()
    proxy.wait_idle()
    om = scrape(proxy, OPENMETRICS)
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in om_families(om.text)}   # raises on invalid OpenMetrics
    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert {s.name for s in ttft.samples} == {"vllm:time_to_first_token_seconds_bucket",
                                              "vllm:time_to_first_token_seconds_count",
                                              "vllm:time_to_first_token_seconds_sum"}
    assert families["vllm:prompt_tokens"].samples[0].value == 42.0
    assert families["vllm:num_requests_running"].samples[0].labels == {
        "engine": "0", "model_name": MODEL}
    # Not an engine prefix: the upstream's (3.5 s) is not relayed; the proxy's own is exported.
    assert [s.value for s in families["process_cpu_seconds"].samples] != [3.5]
    # The proxy's own TTFT, measured at the proxy, with an exemplar; the stage labels are
    # the five, the engine's stages a joined record carries and the output segments.
    own_ttft = families["gen_ai_server_time_to_first_token_seconds"]
    counts = [s for s in own_ttft.samples if s.name.endswith("_count")
              and s.labels == {"gen_ai_request_model": MODEL, "gen_ai_operation_name": "chat"}]
    assert counts[0].value == 1
    assert any(s.exemplar is not None for s in own_ttft.samples)
    stages = {s.labels["stage"] for s in families["llm_request_stage_duration_seconds"].samples}
    assert stages == {*PROXY_STAGE_LABELS, *OUTPUT_SEGMENTS, "unattributed", "other"}
    assert families["llm_upstream_metrics_up"].samples[0].value == 1

    text = scrape(proxy, None).text
    classic = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:time_to_first_token_seconds", "vllm:prompt_tokens",
            "gen_ai_server_time_to_first_token_seconds"} <= classic
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("`promtool` is not installed: apt-get install -y prometheus")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    # promtool reserves ':' for recording rules, so vLLM's own names draw a lint remark;
    # they are relayed as vLLM spells them on purpose. Everything else must be clean.
    remarks = (lint.stdout + lint.stderr).splitlines()
    assert remarks and all(r.startswith("vllm:") and "should not contain ':'" in r
                           for r in remarks), remarks


def test_no_upstream_metrics_is_not_an_error(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url,
                          upstream_metrics_path=None)
    assert "vllm:" not in scrape(proxy, OPENMETRICS).text
    down = proxy_factory(f"http://127.0.0.1:{closed_port()}")
    body = scrape(down, OPENMETRICS).text
    assert "vllm:" not in body and body.endswith("# EOF\n")
    assert down.metric("llm_upstream_metrics_up") == 0


@pytest.mark.parametrize("handler", [
    lambda request: httpx.Response(200, text="vllm:broken{ 1 2 3\n"),
    lambda request: httpx.Response(503, text="starting"),
    lambda request: (_ for _ in ()).throw(httpx.ReadTimeout("slow", request=request)),
])
def test_a_broken_upstream_exposition_yields_nothing(handler):
    collector = UpstreamMetricsCollector("http://upstream/metrics",
                                         transport=httpx.MockTransport(handler))
    assert list(collector.collect()) == [] and collector.last_ok is False


def test_render_keeps_names_escapes_values_and_skips_what_openmetrics_cannot_hold():
    text = ("# TYPE vllm:old_style counter\nvllm:old_style 3\n"
            "# TYPE vllm:q gauge\nvllm:q{path=\"a\\\\b\\\"c\"} 1.5\n")
    families = list(text_string_to_metric_families(text))
    stray = Metric("vllm:x", "a counter whose sample is not its own", "counter")
    stray.add_sample("vllm:y_total", {}, 1.0)
    om = render_families([*families, stray], openmetrics=True).decode()
    assert "# TYPE vllm:old_style counter\nvllm:old_style_total 3.0\n" in om
    assert 'vllm:q{path="a\\\\b\\"c"} 1.5' in om
    assert "vllm:y_total" not in om
    assert {f.name for f in om_families(om + "# EOF\n")} == {"vllm:old_style", "vllm:q"}
    classic = render_families(families, openmetrics=False).decode()
    assert "# TYPE vllm:old_style_total counter\nvllm:old_style_total 3.0" in classic
