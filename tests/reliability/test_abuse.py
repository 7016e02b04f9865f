"""Issue 13, reliability suite: junk traffic adds no metric series, disconnect storms leave
the engine idle, and a span collector that is down costs requests nothing. Real engine
server on loopback, bounded in count and time."""
from __future__ import annotations

import json
import random
import socket

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families

from instrumented_engine.server.app import ServerSettings
from reliability_support import wait_until
from tracer.web.observability import ObservabilitySettings

MESSAGES = [{"role": "user", "content": "Count to fifty, slowly."}]
# Junk beacons must reach the schema, not just the rate limiter.
NO_BEACON_LIMIT = ObservabilitySettings(probe_rate_per_s=1e6, probe_burst=1_000_000)
NUM_JUNK = 1000


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(ServerSettings(NO_BEACON_LIMIT))


def _series(base_url: str) -> set[tuple]:
    text = httpx.get(base_url + "/metrics", timeout=30).text
    return {(sample.name, tuple(sorted(sample.labels.items())))
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _junk_request(rng: random.Random, i: int, model: str) -> tuple[str, str, dict, bytes]:
    """(method, path, headers, body): each a different kind of garbage, with user strings
    everywhere a label could be tempted to pick one up."""
    word = "".join(rng.choice("abcxyz-_./ü€\x00") for _ in range(rng.randint(1, 24)))
    raw = word.replace("\x00", "").strip().encode() or b"w"   # obs-text is legal in a value
    headers = {"content-type": b"application/json", "traceparent": b"00-" + raw,
               "x-request-id": raw, "user-agent": raw, "authorization": b"Bearer " + raw}
    kind = i % 10
    path = "/v1/chat/completions" if i % 2 else "/v1/completions"
    payload: object
    if kind == 0:
        return "POST", path, headers, word.encode("utf-8", "surrogatepass")   # not JSON
    if kind == 1:
        payload = {"model": f"gpt-{word}", "messages": MESSAGES, "prompt": word}
    elif kind == 2:
        payload = {"model": model, "messages": word, "prompt": [word, 1, None]}
    elif kind == 3:
        payload = {"model": model, "messages": MESSAGES, "prompt": "x",
                   "temperature": rng.choice([-1, 1e308, "hot", None, [1]])}
    elif kind == 4:
        payload = {"model": model, "messages": [{"role": word, "content": word}], "prompt": 7}
    elif kind == 5:
        payload = {"model": model, "messages": MESSAGES, "prompt": "x",
                   "max_tokens": rng.choice([-5, 0, 10**30, 1.5, "many"])}
    elif kind == 6:
        payload = [word]
    elif kind == 7:
        return rng.choice(["GET", "PUT", "DELETE"]), path, headers, b""
    elif kind == 8:
        return "GET", f"/v1/{word.encode('utf-8', 'surrogatepass').hex()}", headers, b""
    else:
        payload = {"model": model, "messages": MESSAGES, "prompt": "x", "stream": word,
                   "n": rng.choice([2, 0, -1]), word: word}
    if isinstance(payload, dict):
        # a junk request that happens to be valid must not generate a whole context
        payload.setdefault("max_tokens", 2)
    return "POST", path, headers, json.dumps(payload).encode()


def _junk_beacon(rng: random.Random, i: int) -> bytes:
    word = "".join(rng.choice("abcxyz-_./ü€") for _ in range(rng.randint(1, 24)))
    trace_id = f"{rng.getrandbits(128):032x}"
    kind = i % 6
    if kind == 0:
        return word.encode()
    beacon = {"v": 1, "trace_id": trace_id, "outcome": "ok", "sdk": word, "model": word,
              "url_path": "/" + word, "status": 200,
              "t": {"start": 0, "headers": 5, "first_byte": 6, "first_token": 7, "end": 9}}
    if kind == 2:
        beacon["outcome"] = word
    elif kind == 3:
        beacon["t"] = {"start": 0, "first_token": rng.choice([-1, 1e300, "x"]), "end": 1}
    elif kind == 4:
        beacon["token"] = f"{rng.getrandbits(256):064x}"   # forged
    elif kind == 5:
        beacon[word] = {word: [word] * 3}
    return json.dumps(beacon).encode()


def test_junk_requests_and_beacons_add_no_series(srv):
    ok = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60,
                    json={"model": srv.model, "messages": MESSAGES, "max_tokens": 2})
    assert ok.status_code == 200
    srv.wait_idle()
    before = _series(srv.base_url)
    rng = random.Random(13)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=srv.base_url, timeout=60, trust_env=False) as client:
        for i in range(NUM_JUNK):
            method, path, headers, body = _junk_request(rng, i, srv.model)
            status = client.request(method, path, headers=headers, content=body).status_code
            statuses[status] = statuses.get(status, 0) + 1
        for i in range(NUM_JUNK):
            status = client.post("/v1/probe", content=_junk_beacon(rng, i),
                                 headers={"content-type": "text/plain"}).status_code
            statuses[status] = statuses.get(status, 0) + 1
    srv.wait_idle()
    after = _series(srv.base_url)
    assert after - before == set()
    assert not any(status >= 500 for status in statuses), statuses
    assert sum(statuses.values()) == 2 * NUM_JUNK


def _send(sock: socket.socket, body: dict) -> None:
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_a_disconnect_storm_leaves_the_engine_idle(srv, stream):
    """Eight clients ask for 400 tokens each and vanish: streaming ones after their first
    events, non-streaming ones once the engine is running their requests. Every request
    is aborted long before 400 tokens, and KV blocks and the running set go back to zero."""
    srv.wait_idle()
    records_before = len(srv.parts.obs.store.recent(10_000))
    host, port = srv.base_url.removeprefix("http://").split(":")
    body = {"model": srv.model, "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True,
            "stream": stream}
    socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
    try:
        for sock in socks:
            _send(sock, body)
        if stream:
            for sock in socks:
                received = b""
                while b"data: " not in received:
                    chunk = sock.recv(65536)
                    assert chunk
                    received += chunk
        else:
            assert wait_until(lambda: srv.parts.aengine.stats()[0] > 0, 30)
    finally:
        for sock in socks:
            sock.close()
    srv.wait_idle(60)
    assert srv.engine.block_manager.num_used_blocks == 0
    assert srv.parts.aengine.stats()[:2] == (0, 0)
    records = srv.parts.obs.store.recent(10_000)[: len(srv.parts.obs.store.recent(10_000))
                                                  - records_before]
    assert len(records) == 8
    assert all(r.finish_reason == "abort" for r in records), [r.finish_reason for r in records]
    assert all(r.num_output_tokens < 400 for r in records)


def test_a_span_collector_that_is_down_costs_requests_nothing(loaded_model):
    """OTLP export to a closed port: every request still succeeds, and the lost spans are
    counted in `otel_spans_dropped_total{reason="export_failed"}`."""
    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.server.app import create_app
    from prometheus_client import CollectorRegistry
    from reliability_support import serve
    from tracer.sinks.otlp_export import EncodingBatchSpanProcessor, FastOTLPSpanExporter

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    provider = TracerProvider()
    provider.add_span_processor(EncodingBatchSpanProcessor(
        FastOTLPSpanExporter(endpoint=f"http://127.0.0.1:{closed_port}/v1/traces", timeout=1),
        schedule_delay_millis=50))
    registry = CollectorRegistry()
    engine = LLMEngine(EngineConfig(num_kv_blocks=256), loaded=loaded_model)
    parts = create_app(engine, ServerSettings(), registry=registry, tracer_provider=provider)
    served = serve(parts.app)
    dropped = "otel_spans_dropped_total"
    try:
        before = registry.get_sample_value(dropped, {"reason": "export_failed"})
        assert before is not None, "no dropped-spans counter"
        with httpx.Client(base_url=served.base_url, timeout=60, trust_env=False) as client:
            for _ in range(6):
                response = client.post("/v1/chat/completions", json={
                    "model": engine.model_name, "messages": MESSAGES, "max_tokens": 3,
                    "stream": True})
                assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
        assert wait_until(lambda: parts.obs.tracer.is_idle(30), 30)
        assert len(parts.obs.store.recent(100)) == 6
        assert parts.obs.tracer.sink_failures == {}
        # chat span + one per stage, for each of the six requests
        assert wait_until(lambda: registry.get_sample_value(
            dropped, {"reason": "export_failed"}) - before >= 6 * 10, 60)
    finally:
        served.stop()
        provider.shutdown()
