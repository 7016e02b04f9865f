"""/metrics: OpenMetrics with trace-id exemplars, and no label value from a request."""
from __future__ import annotations

import secrets

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def scrape(live):
    r = httpx.get(live.base_url + "/metrics", headers={"Accept": OPENMETRICS})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    return list(text_string_to_metric_families(r.text))


def series(families) -> set[tuple]:
    return {(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples}


def test_exemplars_name_served_traces(live):
    body = {"model": live.model, "stream": True, "max_tokens": 3,
            "messages": [{"role": "user", "content": "Hi there"}]}
    with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body) as r:
        list(r.iter_lines())
    families = {f.name: f for f in scrape(live)}
    for name in ("gen_ai_server_time_to_first_token_seconds", "llm_request_stage_duration_seconds"):
        exemplars = [s.exemplar for s in families[name].samples if s.exemplar]
        assert exemplars, f"{name} has no exemplar"
        for ex in exemplars:
            assert live.parts.obs.store.get(ex.labels["trace_id"]) is not None


def test_request_fields_never_create_series(live):
    def one_round(tag: str) -> None:
        with httpx.Client(base_url=live.base_url, timeout=60) as c:
            for i in range(900):  # unknown models: rejected before the engine
                c.post("/v1/chat/completions", json={
                    "model": f"{tag}-model-{i}-{secrets.token_hex(4)}",
                    "messages": [{"role": "user", "content": "x"}], "user": f"u{i}"})
            for i in range(100):  # served model, hostile user/headers: generated for real
                c.post("/v1/chat/completions", headers={"X-Request-Id": f"evil-{i}",
                                                        "traceparent": f"garbage-{i}"},
                       json={"model": live.model, "max_tokens": 1, "user": f"{tag}-{i}",
                             "messages": [{"role": "user", "content": f"{tag} {i}"}]})
    one_round("warm")  # every enum value that can appear has appeared
    before = series(scrape(live))
    one_round("junk")
    after = series(scrape(live))
    assert after == before
    assert not any("junk" in str(labels) for _, labels in after)
