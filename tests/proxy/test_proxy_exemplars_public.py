"""Issue 22 item 7: `/metrics` is open and its exemplars name recent trace ids, as in any
Prometheus setup (docs/reference.md, "Access, beacon tokens and connection limits"). That
is safe because a trace id alone cannot post a beacon: the beacon needs its response's
token, which only the browser that read the response has."""
from __future__ import annotations

import json
import re

import httpx

from tracer.record.traceparent import parse_server_timing_desc
from tracer.testing.fake_upstream import MODEL
from tracer.web.observability import ObservabilitySettings

KEY = "proxy-key-3"


def test_a_trace_id_read_from_the_exemplars_cannot_post_its_beacon(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url,
                          observability=ObservabilitySettings(api_key=KEY))
    answer = httpx.post(proxy.base_url + "/v1/chat/completions", timeout=10,
                        headers={"authorization": f"Bearer {KEY}"},
                        json={"model": MODEL, "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200
    proxy.wait_idle()
    assert proxy.parts.obs.tracer.drain(30)
    scrape = httpx.get(proxy.base_url + "/metrics", timeout=10,
                       headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert scrape.status_code == 200   # no key needed
    trace_ids = set(re.findall(r'trace_id="([0-9a-f]{32})"', scrape.text))
    assert len(trace_ids) == 1
    [trace_id] = trace_ids

    def post(**fields):
        body = {"v": 1, "trace_id": trace_id, "outcome": "ok",
                "t": {"start": 0, "first_token": 1.0, "end": 2.0}, **fields}
        return httpx.post(proxy.base_url + "/v1/probe", content=json.dumps(body), timeout=10,
                          headers={"content-type": "text/plain"})

    for fields, code in (({}, "missing_beacon_token"),
                         ({"token": "0" * 64}, "invalid_beacon_token")):
        refused = post(**fields)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == code
    assert proxy.parts.obs.store.get(trace_id).client is None
    real = parse_server_timing_desc(answer.headers["server-timing"], "beacon")
    assert post(token=real).status_code == 202
    assert proxy.parts.obs.store.get(trace_id).client is not None
