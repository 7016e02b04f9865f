"""POST /v1/probe on a small app: a real TraceStore, LLMMetrics on a fresh registry, spans in
memory. Joined beacons land on the server axis with the midpoint-alignment math; hostile ones
are refused, counted, and change nothing."""
from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.sinks.metrics import LLMMetrics
from tracer.record.clock import Clock
from tracer.sinks.spans import SpanBuilder
from tracer.web.cors import add_cors
from tracer.web.probe.endpoint import make_probe_router
from tracer.web.probe.rate_limit import TokenBucketLimiter
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES
from tracer.sinks.store import TraceStore

MODEL = "smollm2"
START_NS = 5_000_000_000
MS = 1_000_000
# Server stage durations (ms): TTFT = 53 ms. Headers left 3 ms after receive start.
STAGE_MS = dict(zip(SERVER_STAGES, (2, 1, 1, 1, 5, 40, 1, 1, 1)))
RESPONSE_START_MS = 3
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
BROWSER_SPAN_ID = "00f067aa0ba902b7"


@dataclass
class Harness:
    client: TestClient
    store: TraceStore
    registry: CollectorRegistry
    spans: InMemorySpanExporter
    clock: Clock
    now: list

    def sample(self, name: str, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def beacons(self, outcome: str) -> float:
        return self.sample("llm_probe_beacons_total", outcome=outcome)


def make_harness(*, rate_per_s: float = 1000.0, burst: int = 10_000, max_bytes: int = 16 * 1024,
                 client_addr: tuple[str, int] = ("203.0.113.7", 5000),
                 cors_origins: tuple[str, ...] = ()) -> Harness:
    registry, store, exporter = CollectorRegistry(), TraceStore(capacity=100), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = Clock(wall_ns=1_700_000_000_000_000_000, perf_ns=1_000_000_000)
    now = [0.0]
    app = FastAPI()
    app.include_router(make_probe_router(
        store=store, metrics=LLMMetrics(registry, model_names=[MODEL]),
        span_builder=SpanBuilder(provider, clock),
        max_bytes=max_bytes, rate_per_s=rate_per_s, burst=burst, clock=lambda: now[0]))
    add_cors(app, cors_origins)   # the app's one CORS policy, as both fronts install it
    return Harness(TestClient(app, client=client_addr), store, registry, exporter, clock, now)


def server_record(trace_id: str = TRACE_ID, request_id: str = "chatcmpl-1",
                  streamed: bool = True) -> RequestRecord:
    stages, t_ns = [], START_NS
    for stage, ms in STAGE_MS.items():
        stages.append(StageSpan(stage, t_ns, t_ns + ms * MS))
        t_ns += ms * MS
    events = (("response_start", START_NS + RESPONSE_START_MS * MS, {}),) if streamed else ()
    return RequestRecord(request_id, trace_id, "a1b2c3d4e5f60718", MODEL, "chat", START_NS,
                         START_NS + 500 * MS, stages=tuple(stages), ttft_ns=t_ns - START_NS,
                         num_prompt_tokens=12, num_output_tokens=8, events=events)


def beacon(trace_id: str | None = TRACE_ID, **overrides) -> dict:
    body = {"v": 1, "trace_id": trace_id,
            "traceparent": f"00-{trace_id or TRACE_ID}-{BROWSER_SPAN_ID}-01",
            "url_path": "/v1/chat/completions", "status": 200, "outcome": "ok",
            "t": {"start": 0, "headers": 23.0, "first_byte": 23.5, "first_token": 70.0,
                  "first_paint": 80.0, "end": 200.0},
            "chunks": 8, "itl_ms": {"count": 7, "mean": 18.0, "p50": 17.0, "p95": 25.0, "max": 30.0},
            "resource": None, "probe_errors": 0, "sdk": "ttftscope-probe/0.1.0"}
    body.update(overrides)
    return body


def post(h: Harness, body, content_type: str = "application/json", headers: dict | None = None):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return h.client.post("/v1/probe", content=data,
                         headers={"content-type": content_type, **(headers or {})})


def test_joined_beacon_is_placed_by_midpoint_alignment():
    h = make_harness()
    h.store.put(server_record())
    r = post(h, beacon())
    assert r.status_code == 202 and r.content == b""
    client = h.store.get(TRACE_ID).client
    # θ = server mid (0 + 3)/2 − client mid (0 + 23)/2 = −10 ms; NTP bound (23 − 3)/2 = 10 ms.
    assert client["clock"] == {"skew_ms": (START_NS - 10 * MS) / 1e6, "uncertainty_ms": 10.0,
                               "anchor": "response_start"}
    placed = {s["stage"]: (s["start_ns"] - START_NS, s["end_ns"] - START_NS) for s in client["stages"]}
    assert placed == {"client.request": (-10 * MS, 13 * MS),
                      "client.first_byte": (13 * MS, 13_500_000),
                      "client.first_token": (13_500_000, 60 * MS),
                      "client.first_paint": (60 * MS, 70 * MS)}
    assert client["client_ttft_ms"] == 70.0
    assert client["network_overhead_ms"] == pytest.approx(70.0 - 53.0)
    assert client["render_delay_ms"] == pytest.approx(10.0)
    assert h.sample("llm_client_time_to_first_token_seconds_sum", model=MODEL) == pytest.approx(0.070)
    assert h.sample("llm_client_network_overhead_seconds_sum", model=MODEL) == pytest.approx(0.017)
    assert h.sample("llm_client_render_delay_seconds_sum", model=MODEL) == pytest.approx(0.010)
    assert h.beacons("accepted") == 1


def test_client_spans_join_the_server_trace_as_the_browser_span():
    h = make_harness()
    h.store.put(server_record())
    assert post(h, beacon()).status_code == 202
    spans = {s.name: s for s in h.spans.get_finished_spans()}
    assert set(spans) == {"client", "client.request", "client.first_byte", "client.first_token",
                          "client.first_paint"}
    root = spans["client"]
    # The browser's traceparent named this span as the server's parent: now it exists.
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert f"{root.context.span_id:016x}" == BROWSER_SPAN_ID and root.parent is None
    for name in ("client.request", "client.first_byte", "client.first_token", "client.first_paint"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].attributes["llm.client.clock_uncertainty_ms"] == 10.0
    request = spans["client.request"]
    assert request.start_time == h.clock.to_epoch_ns(START_NS - 10 * MS)
    assert request.end_time == h.clock.to_epoch_ns(START_NS + 13 * MS)
    assert root.start_time == request.start_time
    assert root.end_time == h.clock.to_epoch_ns(START_NS - 10 * MS + 200 * MS)
    assert root.attributes["llm.client.clock_skew_ms"] == (START_NS - 10 * MS) / 1e6
    assert root.attributes["http.response.status_code"] == 200


def test_new_server_trace_puts_client_span_under_server_span():
    h = make_harness()
    h.store.put(server_record())
    other = "ab" * 16   # the browser sent another trace; the server's id came via Server-Timing
    assert post(h, beacon(traceparent=f"00-{other}-{BROWSER_SPAN_ID}-01")).status_code == 202
    root = next(s for s in h.spans.get_finished_spans() if s.name == "client")
    assert f"{root.parent.span_id:016x}" == "a1b2c3d4e5f60718"
    assert f"{root.context.span_id:016x}" != BROWSER_SPAN_ID


def test_non_streamed_response_aligns_on_the_record_end():
    h = make_harness()
    h.store.put(server_record(streamed=False))
    body = beacon(t={"start": 0, "headers": 540.0, "first_byte": 541.0, "first_token": 542.0,
                     "first_paint": 550.0, "end": 542.0})
    assert post(h, body).status_code == 202
    clock = h.store.get(TRACE_ID).client["clock"]
    # Server [0, 500] ms, client [0, 540] ms: θ = 250 − 270 = −20 ms, bound (540 − 500)/2.
    assert clock == {"skew_ms": (START_NS - 20 * MS) / 1e6, "uncertainty_ms": 20.0, "anchor": "end"}


def test_unknown_trace_and_null_trace_are_unmatched_and_not_stored():
    h = make_harness()
    h.store.put(server_record())
    assert post(h, beacon("cd" * 16)).status_code == 202
    assert post(h, beacon(None)).status_code == 202
    assert h.beacons("unmatched") == 2 and h.beacons("accepted") == 0
    assert h.store.get(TRACE_ID).client is None and h.store.get("cd" * 16) is None
    assert h.spans.get_finished_spans() == ()


def test_text_plain_beacon_is_accepted_and_other_types_refused():
    h = make_harness()
    h.store.put(server_record())
    assert post(h, beacon(), "text/plain;charset=UTF-8").status_code == 202
    r = post(h, beacon(), "application/x-www-form-urlencoded")
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert h.beacons("accepted") == 1 and h.beacons("rejected_schema") == 1


MALFORMED = [
    (b"{not json", 400), (b"\xff\xfe{}", 400), (b"", 400),
    (b"[1, 2]", 422), (b'"a string"', 422),
    (json.dumps(beacon(v=2)).encode(), 422),
    (json.dumps(beacon(TRACE_ID.upper())).encode(), 422),
    (json.dumps(beacon("0" * 32)).encode(), 422),
    (json.dumps(beacon(TRACE_ID[:-1])).encode(), 422),
    (json.dumps(beacon(outcome="exploded")).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": -1, "end": 5})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": 50, "first_byte": 10, "end": 60})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": "23", "end": 60})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": True, "end": 60})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": 1e12, "end": 1e12})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "headers": 5})).encode(), 422),
    (json.dumps(beacon(t={"start": 0, "first_paint": 5, "end": 9})).encode(), 422),
    (json.dumps(beacon()).replace('"first_token": 70.0', '"first_token": NaN').encode(), 422),
    (json.dumps(beacon()).replace('"first_token": 70.0', '"first_token": 1e999').encode(), 422),
    # Issue 13 item 8: an integer beyond float (OverflowError) and one past Python's
    # 4,300-digit limit for int parsing (ValueError) were 500s with a plain-text body.
    (json.dumps(beacon()).replace('"first_token": 70.0', f'"first_token": {10**400}').encode(),
     422),
    (json.dumps(beacon()).replace('"first_token": 70.0', '"first_token": ' + "9" * 5000).encode(),
     400),
    (json.dumps(beacon(status=9000)).encode(), 422),
    (json.dumps(beacon(chunks=-1)).encode(), 422),
    (json.dumps(beacon(sdk="x" * 300)).encode(), 422),
    (json.dumps(beacon(itl_ms={"count": 1, "mean": 1, "p50": 1, "p95": 1})).encode(), 422),
    (json.dumps(beacon(resource={"dns_ms": "fast"})).encode(), 422),
    # chunk_ms: at most 32 arrival times, no more than `chunks`, finite, >= 0, not decreasing.
    (json.dumps(beacon(chunks=40, chunk_ms=[70.0 + i for i in range(33)])).encode(), 422),
    (json.dumps(beacon(chunks=2, chunk_ms=[70.0, 71.0, 72.0])).encode(), 422),
    (json.dumps(beacon(chunk_ms=[70.0, -1.0])).encode(), 422),
    (json.dumps(beacon(chunk_ms=[70.0, 60.0])).encode(), 422),
    (json.dumps(beacon(chunk_ms=[70.0, "71"])).encode(), 422),
    (json.dumps(beacon(chunk_ms={"0": 70.0})).encode(), 422),
    (json.dumps(beacon(chunk_ms=[70.0, 71.0])).replace("71.0", "NaN").encode(), 422),
    (json.dumps(beacon(chunk_ms=[70.0, 71.0])).replace("71.0", "Infinity").encode(), 422),
    (json.dumps(beacon(input_ms=-5)).encode(), 422),
    (json.dumps(beacon(input_ms="5")).encode(), 422),
]


@pytest.mark.parametrize("body,status", MALFORMED)
def test_malformed_beacons_are_refused_in_the_openai_error_shape(body, status):
    h = make_harness()
    h.store.put(server_record())
    r = post(h, body)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert h.beacons("rejected_schema") == 1 and h.beacons("accepted") == 0
    assert h.store.get(TRACE_ID).client is None


def test_oversized_beacons_are_413_declared_or_streamed():
    h = make_harness(max_bytes=1024)
    h.store.put(server_record())
    padded = json.dumps(beacon()) + " " * 1024
    assert post(h, padded).status_code == 413   # Content-Length says too big
    chunks = (padded[i:i + 100].encode() for i in range(0, len(padded), 100))
    r = h.client.post("/v1/probe", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert h.beacons("rejected_size") == 2
    exactly = json.dumps(beacon()).encode()
    assert post(h, exactly + b" " * (1024 - len(exactly))).status_code == 202  # at the limit


def test_flood_is_rate_limited_per_client_with_an_injected_clock():
    h = make_harness(rate_per_s=2.0, burst=3)
    statuses = [post(h, beacon("cd" * 16)).status_code for _ in range(5)]
    assert statuses == [202, 202, 202, 429, 429]
    r = post(h, beacon("cd" * 16))
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    h.now[0] += 0.5   # one token at 2/s
    assert [post(h, beacon("cd" * 16)).status_code for _ in range(2)] == [202, 429]
    assert h.beacons("rate_limited") == 4 and h.beacons("unmatched") == 4


def test_limiter_memory_is_bounded_and_buckets_are_per_key():
    now = [0.0]
    limiter = TokenBucketLimiter(rate_per_s=1.0, burst=1, max_keys=100, clock=lambda: now[0])
    assert limiter.acquire("a") == 0.0 and limiter.acquire("a") > 0.0
    assert limiter.acquire("b") == 0.0   # another client has its own bucket
    for i in range(10_000):
        limiter.acquire(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100


def _series(registry: CollectorRegistry) -> set:
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in registry.collect() for s in family.samples}


def _hostile(rng: random.Random, i: int) -> bytes:
    junk = "".join(rng.choices(string.printable, k=rng.randrange(1, 4000)))
    body = beacon(f"{rng.getrandbits(128):032x}", model=junk[:200], url_path=junk[:300],
                  sdk=junk[:60], **{junk[:50]: junk, "labels": {"model": junk}})
    if i % 5 == 0:
        body["outcome"] = junk[:20]
    if i % 7 == 0:
        body["t"] = {"start": 0, "headers": rng.uniform(-1e9, 1e9), "end": 1}
    raw = json.dumps(body).encode()
    return raw + b" " * (20_000 if i % 11 == 0 else 0)


def test_hostile_beacons_add_no_series_and_change_no_accepted_record():
    h = make_harness()
    h.store.put(server_record())
    assert post(h, beacon()).status_code == 202
    joined = json.dumps(h.store.get(TRACE_ID).client, sort_keys=True)
    series = _series(h.registry)
    rng = random.Random(7)
    statuses = [post(h, _hostile(rng, i)).status_code for i in range(1000)]
    # A replay for the joined trace, with other numbers: the first beacon stays.
    replay = beacon(t={"start": 0, "headers": 1.0, "first_token": 2.0, "end": 3.0})
    statuses.append(post(h, replay).status_code)
    assert _series(h.registry) == series
    assert set(statuses) == {202, 413, 422}
    outcomes = {o: h.beacons(o) for o in ("accepted", "rejected_schema", "rejected_size", "unmatched")}
    assert outcomes["accepted"] == 1 and sum(outcomes.values()) == 1002
    assert outcomes["rejected_size"] == statuses.count(413)
    assert json.dumps(h.store.get(TRACE_ID).client, sort_keys=True) == joined
    assert h.sample("llm_client_time_to_first_token_seconds_count", model=MODEL) == 1
    assert len(h.store) == 1


def test_rejections_do_not_touch_an_accepted_beacon():
    h = make_harness(rate_per_s=1.0, burst=2, max_bytes=2048)
    h.store.put(server_record())
    assert post(h, beacon()).status_code == 202
    joined = json.dumps(h.store.get(TRACE_ID).client, sort_keys=True)
    assert post(h, b"{").status_code == 400
    assert post(h, beacon()).status_code == 429
    h.now[0] += 10
    assert post(h, json.dumps(beacon(chunks=1)) + " " * 4096).status_code == 413
    assert json.dumps(h.store.get(TRACE_ID).client, sort_keys=True) == joined


def test_cors_allow_list():
    h = make_harness(cors_origins=("https://chat.example",))
    h.store.put(server_record())
    ok = post(h, beacon(), headers={"origin": "https://chat.example"})
    assert ok.headers["access-control-allow-origin"] == "https://chat.example"
    assert ok.headers["access-control-allow-credentials"] == "true"
    other = post(h, beacon("cd" * 16), headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    pre = h.client.options("/v1/probe", headers={
        "origin": "https://chat.example", "access-control-request-method": "POST",
        "access-control-request-headers": "content-type"})
    assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]
    assert pre.headers["access-control-allow-credentials"] == "true"
    denied = h.client.options("/v1/probe", headers={"origin": "https://evil.example",
                                                   "access-control-request-method": "POST"})
    assert denied.status_code == 400 and "access-control-allow-origin" not in denied.headers


def test_client_stages_and_client_itl_from_a_beacon():
    """input (markInput → fetch), the Resource Timing phases, the rest of fetch → headers as
    `request`, then the stream's milestones; the chunk arrivals give the client ITL."""
    h = make_harness()
    h.store.put(server_record())
    body = beacon(input_ms=120.0, chunk_ms=[70.0, 85.0, 86.0, 126.0],
                  resource={"dns_ms": 2.0, "connect_ms": 9.0, "tls_ms": 5.0,
                            "request_ms": 12.0, "response_ms": 170.0})
    assert post(h, body).status_code == 202
    stage = {name: h.sample("llm_client_stage_duration_seconds_sum", model=MODEL, stage=name)
             for name in ("input", "dns", "tcp", "tls", "request", "first_byte", "first_token",
                          "first_paint")}
    # t: headers 23, first_byte 23.5, first_token 70, first_paint 80; 23 − 2 − 4 − 5 = 12.
    assert stage == pytest.approx({"input": 0.120, "dns": 0.002, "tcp": 0.004, "tls": 0.005,
                                   "request": 0.012, "first_byte": 0.0005,
                                   "first_token": 0.0465, "first_paint": 0.010})
    # The stack adds up to Enter → first token.
    assert sum(v for k, v in stage.items() if k != "first_paint") == pytest.approx(0.120 + 0.070)
    assert h.sample("llm_client_itl_seconds_count", model=MODEL) == 3
    assert h.sample("llm_client_itl_seconds_sum", model=MODEL) == pytest.approx(0.056)
    assert h.sample("llm_client_itl_seconds_bucket", model=MODEL, le="0.025") == 2
    client = h.store.get(TRACE_ID).client
    assert client["input_ms"] == 120.0 and client["chunk_ms"] == [70.0, 85.0, 86.0, 126.0]


def test_a_beacon_without_the_new_fields_observes_what_it_can():
    """An older probe: no input_ms, no chunk_ms, no Resource Timing; `request` is then the
    whole fetch → headers stage and nothing else is invented."""
    h = make_harness()
    h.store.put(server_record())
    assert post(h, beacon()).status_code == 202
    counts = {name: h.sample("llm_client_stage_duration_seconds_count", model=MODEL, stage=name)
              for name in ("input", "dns", "tcp", "tls", "request", "first_byte")}
    assert counts == {"input": 0, "dns": 0, "tcp": 0, "tls": 0, "request": 1, "first_byte": 1}
    assert h.sample("llm_client_stage_duration_seconds_sum", model=MODEL,
                    stage="request") == pytest.approx(0.023)
    assert h.sample("llm_client_itl_seconds_count", model=MODEL) == 0


def test_thirty_two_chunk_times_are_accepted():
    h = make_harness()
    h.store.put(server_record())
    body = beacon(chunks=100, chunk_ms=[70.0 + i for i in range(32)])
    assert post(h, body).status_code == 202
    assert h.sample("llm_client_itl_seconds_count", model=MODEL) == 31
