"""Issue 22 item 7: a signed in-band timing token (`server`) is good for its own beacon only:
not too old, not from the future, and not twice, even after the memory of joined traces has
moved on. Against the real `/v1/probe` router with an injected wall clock.
"""
from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.store import TraceStore
from tracer.web.inband import InbandTiming, encode_token
from tracer.web.probe.endpoint import make_probe_router
from tracer.web.probe.ingest import TOKEN_GRACE_NS, TOKEN_MAX_AHEAD_NS
from tracer.web.probe.token import BeaconSigner

MODEL = "m"
NOW_NS = 1_800_000_000_000_000_000
END_MS = 200.0
SIGNER = BeaconSigner(b"k" * 32)


class Probe:
    def __init__(self, max_remote_joins: int = 10_000) -> None:
        self.now_ns = NOW_NS
        self.registry = CollectorRegistry()
        app = FastAPI()
        app.include_router(make_probe_router(
            store=TraceStore(capacity=10), metrics=LLMMetrics(self.registry, model_names=[MODEL]),
            signer=SIGNER, rate_per_s=1e6, burst=1_000_000, max_remote_joins=max_remote_joins,
            wall_clock_ns=lambda: self.now_ns))
        self.client = TestClient(app)

    def post(self, token: str):
        body = {"v": 1, "trace_id": None, "outcome": "ok", "server": token,
                "t": {"start": 0, "first_token": 40.0, "end": END_MS}}
        return self.client.post("/v1/probe", content=json.dumps(body),
                                headers={"content-type": "text/plain"})

    def accepted(self) -> float:
        return self.registry.get_sample_value("llm_probe_beacons_total",
                                              {"outcome": "accepted"}) or 0.0


def token(recv_unix_ns: int, n: int = 1) -> str:
    timing = InbandTiming(f"{n:032x}", "cd" * 8, "proxy", MODEL, recv_unix_ns, 1.0, 30.0, (30.0,))
    return encode_token(timing, SIGNER)


def test_a_fresh_token_joins_once():
    probe = Probe()
    fresh = token(NOW_NS - 10**9)
    assert probe.post(fresh).status_code == 202
    assert probe.post(fresh).status_code == 202   # answered, but not joined again
    assert probe.accepted() == 1


def test_a_token_from_long_ago_is_refused():
    probe = Probe()
    for recv_ns in (1, NOW_NS - int(END_MS * 1e6) - TOKEN_GRACE_NS - 1):
        response = probe.post(token(recv_ns))
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "stale_server_timing"
    assert probe.accepted() == 0
    # the edge: exactly the stream plus the grace is still fresh
    assert probe.post(token(NOW_NS - int(END_MS * 1e6) - TOKEN_GRACE_NS)).status_code == 202
    assert probe.accepted() == 1


def test_a_token_from_the_future_is_refused_beyond_the_skew():
    probe = Probe()
    response = probe.post(token(NOW_NS + TOKEN_MAX_AHEAD_NS + 1))
    assert response.status_code == 403 and response.json()["error"]["code"] == "stale_server_timing"
    assert probe.post(token(NOW_NS + TOKEN_MAX_AHEAD_NS, n=2)).status_code == 202
    assert probe.accepted() == 1


def test_a_replay_is_refused_after_the_joined_set_moved_on():
    probe = Probe(max_remote_joins=2)
    first = token(NOW_NS - 5 * 10**9, n=1)
    assert probe.post(first).status_code == 202 and probe.accepted() == 1
    for n in (2, 3, 4):   # push the first trace out of the bounded memory
        assert probe.post(token(NOW_NS - (5 - n) * 10**9, n=n)).status_code == 202
    assert probe.accepted() == 4
    assert probe.post(first).status_code == 202
    assert probe.accepted() == 4   # not joined a second time
    assert probe.registry.get_sample_value("llm_probe_beacons_total",
                                           {"outcome": "unmatched"}) == 1.0
