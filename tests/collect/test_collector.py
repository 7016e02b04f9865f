"""The standalone collector (`python -m tracer collect`): beacons joined from the signed
in-band timing alone, client metrics on /metrics, client spans in the server's trace, the
same refusals as the servers' /v1/probe, forwarded client addresses from trusted proxies
only, and bounded memory."""
from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.web.inband import InbandTiming, encode_token
from tracer.web.observability import ObservabilitySettings
from tracer.web.probe.token import BeaconSigner

KEY = "collector-test-key"
SIGNER = BeaconSigner(KEY.encode())
MODEL = "smollm2"
# A request received a second before this module loaded: a stale in-band token is refused
# (tracer/web/probe/ingest.py, `stale_token_error`).
RECV_UNIX_NS = time.time_ns() - 1_000_000_000
SEND_MS = (20.0, 60.0, 100.0, 140.0, 180.0)


def timing(trace_id: str = "4bf92f3577b34da6a3ce929d0e0e4736", **kw) -> InbandTiming:
    fields = dict(trace_id=trace_id, span_id="00f067aa0ba902b7", source="engine",
                  model=MODEL, recv_unix_ns=RECV_UNIX_NS, resp_ms=2.0, ttft_ms=SEND_MS[0],
                  send_ms=SEND_MS, stages_ms={"receive": 0.5})
    fields.update(kw)
    return InbandTiming(**fields)


def beacon(t: InbandTiming, *, chunk_ms=None, signer=SIGNER, **extra) -> dict:
    """The browser saw the headers 10 ms after fetch and each chunk 30 ms after its send."""
    chunk_ms = [s + 30.0 for s in t.send_ms] if chunk_ms is None else chunk_ms
    return {"v": 1, "trace_id": t.trace_id, "outcome": "ok", "chunks": len(chunk_ms),
            "chunk_ms": chunk_ms, "server": encode_token(t, signer),
            "t": {"start": 0, "headers": 10.0, "first_byte": chunk_ms[0],
                  "first_token": chunk_ms[0], "first_paint": chunk_ms[0] + 16.0,
                  "end": chunk_ms[-1] + 5.0}, **extra}


class Collector:
    def __init__(self, *, peer: str = "203.0.113.9", max_joined: int = 1000, **obs) -> None:
        self.registry, self.spans = CollectorRegistry(), InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        settings = CollectorSettings(ObservabilitySettings(beacon_key=KEY, **obs),
                                     model_names=(MODEL,), max_joined_traces=max_joined)
        self.parts = create_collector_app(settings, registry=self.registry,
                                          tracer_provider=provider)
        self.client = TestClient(self.parts.app, client=(peer, 5000))

    def post(self, body: dict, headers: dict | None = None):
        return self.client.post("/v1/probe", content=json.dumps(body),
                                headers={"content-type": "text/plain", **(headers or {})})

    def value(self, name: str, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def outcome(self, outcome: str) -> float:
        return self.value("llm_probe_beacons_total", outcome=outcome)


def test_a_signed_beacon_gives_client_metrics_and_spans_in_the_servers_trace():
    c = Collector()
    t = timing()
    r = c.post(beacon(t, traceparent=f"00-{t.trace_id}-b7ad6b7169203331-01"))
    assert r.status_code == 202 and c.outcome("accepted") == 1
    assert c.value("llm_client_time_to_first_token_seconds_sum", model=MODEL) == \
        pytest.approx(0.050)
    assert c.value("llm_client_network_overhead_seconds_sum", model=MODEL) == \
        pytest.approx(0.030)           # client 50 ms − server 20 ms
    assert c.value("llm_client_render_delay_seconds_sum", model=MODEL) == pytest.approx(0.016)
    assert c.value("llm_client_stream_held_back_seconds_count", model=MODEL) == 1
    assert c.value("llm_client_stream_buffered_total", model=MODEL) == 0
    client = [s for s in c.spans.get_finished_spans() if s.name == "client"]
    assert len(client) == 1
    span = client[0]
    assert f"{span.context.trace_id:032x}" == t.trace_id
    # The server continued the browser's trace: the client span takes the browser's id.
    assert f"{span.context.span_id:016x}" == "b7ad6b7169203331"
    # Aligned on the server's wall clock: the midpoints of [0, 10] and [0, 2] meet, so
    # fetch() was 4 ms before the server's receive start.
    assert span.start_time == RECV_UNIX_NS - 4_000_000
    assert span.attributes["llm.client.buffered"] is False
    stages = {s.name: s for s in c.spans.get_finished_spans() if s.name.startswith("client.")}
    assert stages["client.first_token"].end_time == RECV_UNIX_NS - 4_000_000 + 50_000_000


def test_without_the_browsers_traceparent_the_client_span_is_a_child_of_the_server_span():
    c = Collector()
    t = timing()
    assert c.post(beacon(t)).status_code == 202
    (span,) = [s for s in c.spans.get_finished_spans() if s.name == "client"]
    assert f"{span.parent.span_id:016x}" == t.span_id


def test_a_held_back_stream_is_counted_and_flagged():
    c = Collector()
    t = timing()
    assert c.post(beacon(t, chunk_ms=[400.0, 400.1, 400.2, 400.2, 400.3])).status_code == 202
    assert c.value("llm_client_stream_buffered_total", model=MODEL) == 1
    assert c.value("llm_client_stream_held_back_seconds_sum", model=MODEL) == \
        pytest.approx((160.0 - 0.3) / 1e3)
    (span,) = [s for s in c.spans.get_finished_spans() if s.name == "client"]
    assert span.attributes["llm.client.buffered"] is True
    assert span.attributes["llm.client.held_back_ms"] == pytest.approx(159.7)


def test_forged_missing_and_foreign_server_timing_are_refused():
    c = Collector()
    t = timing()
    forged = c.post(beacon(t, signer=BeaconSigner(b"someone-else")))
    assert forged.status_code == 403
    assert forged.json()["error"]["code"] == "invalid_server_timing"
    other_trace = c.post(beacon(t, trace_id="1" * 32))
    assert other_trace.status_code == 403
    assert c.outcome("rejected_signature") == 2
    # No in-band timing: a trace id alone is not proof (the Server-Timing token is
    # required, as on the servers); with it, the beacon waits for its trace's spans.
    no_server = beacon(t)
    del no_server["server"]
    assert c.post(no_server).status_code == 403 and c.outcome("rejected_token") == 1
    no_server["token"] = SIGNER.token(t.trace_id)
    assert c.post(no_server).status_code == 202 and c.outcome("accepted") == 1
    assert len(c.parts.pending) == 1
    assert c.post(no_server).status_code == 202 and c.outcome("unmatched") == 1
    bad_shape = c.post({**beacon(t), "server": "not a token"})
    assert bad_shape.status_code == 422 and c.outcome("rejected_schema") == 1
    assert c.value("llm_client_time_to_first_token_seconds_count", model=MODEL) == 0


def test_a_second_beacon_for_a_joined_trace_does_not_overwrite_the_first():
    c = Collector()
    t = timing()
    assert c.post(beacon(t)).status_code == 202
    late = beacon(t, chunk_ms=[s + 900.0 for s in SEND_MS])
    assert c.post(late).status_code == 202
    assert c.outcome("accepted") == 1 and c.outcome("unmatched") == 1
    assert c.value("llm_client_time_to_first_token_seconds_count", model=MODEL) == 1
    assert c.value("llm_client_time_to_first_token_seconds_sum", model=MODEL) == \
        pytest.approx(0.050)


def test_remembered_traces_are_bounded():
    c = Collector(peer="127.0.0.1", max_joined=100)   # behind a trusted proxy: many users
    for i in range(150):   # requests received 1 µs apart, oldest first
        t = timing(trace_id=f"{i + 1:032x}", recv_unix_ns=RECV_UNIX_NS + i * 1000)
        assert c.post(beacon(t), headers={"x-forwarded-for": f"10.0.{i // 200}.{i % 200}"}
                      ).status_code == 202
    assert c.outcome("accepted") == 150
    assert c.parts.probe.ingestor.num_remote_joins == 100
    # The newest are still refused a second time; the forgotten oldest too, by their age.
    for i in (149, 0):
        assert c.post(beacon(timing(trace_id=f"{i + 1:032x}", recv_unix_ns=RECV_UNIX_NS + i * 1000)),
                      headers={"x-forwarded-for": "10.9.9.9"}).status_code == 202
    assert c.outcome("unmatched") == 2 and c.outcome("accepted") == 150


def test_rate_limit_keys_on_the_forwarded_client_only_behind_a_trusted_proxy():
    behind = Collector(peer="127.0.0.1", probe_rate_per_s=0.001, probe_burst=1)
    t = timing()
    first = behind.post(beacon(t), headers={"x-forwarded-for": "198.51.100.1"})
    assert first.status_code == 202
    # Same user again: limited. Another user behind the same proxy: not.
    assert behind.post(beacon(timing("2" * 32)),
                       headers={"x-forwarded-for": "198.51.100.1"}).status_code == 429
    assert behind.post(beacon(timing("3" * 32)),
                       headers={"x-forwarded-for": "198.51.100.2"}).status_code == 202
    # The rightmost untrusted hop counts: a forged left part does not buy a fresh bucket.
    assert behind.post(beacon(timing("4" * 32)),
                       headers={"x-forwarded-for": "6.6.6.6, 198.51.100.2"}).status_code == 429
    # An untrusted peer's X-Forwarded-For is ignored: it is limited by its own address.
    direct = Collector(peer="203.0.113.9", probe_rate_per_s=0.001, probe_burst=1)
    assert direct.post(beacon(t), headers={"x-forwarded-for": "198.51.100.3"}).status_code == 202
    assert direct.post(beacon(timing("5" * 32)),
                       headers={"x-forwarded-for": "198.51.100.4"}).status_code == 429
    # No trusted proxies at all: even loopback's header is ignored.
    none = Collector(peer="127.0.0.1", probe_rate_per_s=0.001, probe_burst=1,
                     forwarded_allow_ips=())
    assert none.post(beacon(t), headers={"x-forwarded-for": "198.51.100.5"}).status_code == 202
    assert none.post(beacon(timing("6" * 32)),
                     headers={"x-forwarded-for": "198.51.100.6"}).status_code == 429


def test_health_metrics_and_cors_allow_list():
    c = Collector(cors_origins=("https://chat.example",))
    assert c.client.get("/health").json() == {"status": "ok"}
    body = c.client.get("/metrics").text
    assert "llm_client_time_to_first_token_seconds_bucket" in body
    assert "llm_client_stream_buffered_total" in body
    allowed = c.client.options("/v1/probe", headers={
        "origin": "https://chat.example", "access-control-request-method": "POST",
        "access-control-request-headers": "content-type"})
    assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
    refused = c.client.options("/v1/probe", headers={
        "origin": "https://evil.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in refused.headers
