"""Two engine replicas on loopback sharing a beacon key: a beacon sent to the replica that did
NOT serve its request is joined from the signed in-band timing alone (issue 11, item 4)."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from instrumented_engine.server.app import ServerSettings
from tracer.record.traceparent import parse_server_timing, parse_server_timing_desc
from tracer.web.inband import InbandTimer, decode_token, encode_token
from tracer.web.observability import ObservabilitySettings
from tracer.web.probe.token import BeaconSigner

KEY = "replicas-shared-key"
LINE = re.compile(rb": ttft-timing ([A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43})\n\n")


@pytest.fixture(scope="module")
def replicas(server_factory):
    settings = ServerSettings(ObservabilitySettings(beacon_key=KEY))
    return server_factory(settings), server_factory(settings)


def served_stream(srv) -> tuple[str, str, str]:
    """(trace id, Server-Timing beacon token, in-band token) of one timed request."""
    body = {"model": srv.model, "temperature": 0, "max_tokens": 12, "stream": True,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-TTFT-Timing": "1"}) as r:
        raw = b"".join(r.iter_raw())
        server_timing = r.headers["server-timing"]
    trace_id = parse_server_timing(server_timing).split("-")[1]
    return (trace_id, parse_server_timing_desc(server_timing, "beacon"),
            LINE.search(raw).group(1).decode())


def beacon_for(timing, **extra) -> dict:
    """What the probe would send: the browser saw everything 7 ms after the server sent it."""
    send = list(timing.send_ms)
    return {"v": 1, "trace_id": timing.trace_id, "outcome": "ok", "chunks": len(send),
            "chunk_ms": [s + 7.0 for s in send],
            "t": {"start": 0, "headers": timing.resp_ms + 6.0, "first_byte": send[0] + 7.0,
                  "first_token": send[0] + 7.0, "first_paint": send[0] + 20.0,
                  "end": send[-1] + 9.0}, **extra}


def post(srv, beacon: dict) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/probe", content=json.dumps(beacon),
                      headers={"content-type": "text/plain"}, timeout=10)


def sample(srv, name: str, **labels) -> float:
    text = httpx.get(srv.base_url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name} {labels} not exported")


def test_beacon_to_the_other_replica_yields_client_ttft_and_network_overhead(replicas):
    served, other = replicas
    trace_id, beacon_token, server_token = served_stream(served)
    timing = decode_token(server_token, BeaconSigner(KEY.encode()))
    assert timing.trace_id == trace_id
    served.wait_idle()
    assert other.parts.obs.store.get(trace_id) is None   # the other replica never saw it
    model = served.model
    ttft_count = "llm_client_time_to_first_token_seconds_count"

    # The Server-Timing token alone proves the beacon, but the other replica has nothing
    # to join it to.
    r = post(other, beacon_for(timing, token=beacon_token))
    assert r.status_code == 202
    assert sample(other, ttft_count, model=model) == 0
    assert sample(other, "llm_probe_beacons_total", outcome="unmatched") == 1

    # With the in-band timing it is joined from the signed payload.
    r = post(other, beacon_for(timing, server=server_token))
    assert r.status_code == 202, r.text
    assert sample(other, "llm_probe_beacons_total", outcome="accepted") == 1
    assert sample(other, ttft_count, model=model) == 1
    first_token_ms = timing.send_ms[0] + 7.0
    assert sample(other, "llm_client_time_to_first_token_seconds_sum", model=model) == \
        pytest.approx(first_token_ms / 1e3)
    assert sample(other, "llm_client_network_overhead_seconds_sum", model=model) == \
        pytest.approx((first_token_ms - timing.ttft_ms) / 1e3)
    # Sent and received alike: judged (when there were 3+ events), and not buffered.
    judged = sample(other, "llm_client_stream_held_back_seconds_count", model=model)
    assert judged == (1 if len(timing.send_ms) >= 3 else 0)
    assert sample(other, "llm_client_stream_buffered_total", model=model) == 0
    # The serving replica saw no beacon at all.
    assert sample(served, ttft_count, model=model) == 0

    # The client spans land in the serving replica's trace, under its span.
    client = [s for s in other.spans.get_finished_spans() if s.name == "client"
              and f"{s.context.trace_id:032x}" == trace_id]
    assert len(client) == 1 and f"{client[0].parent.span_id:016x}" == timing.span_id
    assert client[0].attributes["llm.client.join"] == "inband"

    # A second beacon for the joined trace changes nothing (no poisoning).
    again = beacon_for(timing, server=server_token)
    again["t"]["first_token"] += 500.0
    again["t"]["first_paint"] += 500.0
    again["t"]["end"] += 500.0
    assert post(other, again).status_code == 202
    assert sample(other, ttft_count, model=model) == 1
    assert sample(other, "llm_probe_beacons_total", outcome="unmatched") == 2


def test_forged_or_foreign_in_band_timing_is_refused(replicas):
    served, other = replicas
    trace_id, _token, server_token = served_stream(served)
    timing = decode_token(server_token, None)
    before = sample(other, "llm_probe_beacons_total", outcome="rejected_signature")
    # Signed with another key: forged.
    forged = encode_token(timing, BeaconSigner(b"not-the-key"))
    r = post(other, beacon_for(timing, server=forged))
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_server_timing"
    # A genuine token, but claimed for another trace id.
    r = post(other, beacon_for(timing, server=server_token, trace_id="1" * 32))
    assert r.status_code == 403
    assert sample(other, "llm_probe_beacons_total", outcome="rejected_signature") == before + 2
    assert InbandTimer.of(other.parts.obs).signer is other.parts.obs.beacon_signer
