"""The OTLP receiver under exports built to cost (issue 39, breaks 1-3), on HTTP and gRPC:
deep bodies are malformed (400 / INVALID_ARGUMENT, counted), exports with hundreds of thousands
of tiny attributes are refused before they are built (counted `too_many_attributes`), and
sixteen of them at once neither grow the proxy past its memory budget nor hold the event
loop: a bystander's `/health` and a proxied stream are served throughout."""
from __future__ import annotations

import gzip
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from engine_support import stream_through

PROTOBUF = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}
JSON_GZIP = {"content-type": "application/json", "content-encoding": "gzip"}
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# One key-value: key "a", int value 1 (9 bytes on the wire).
_TINY_ATTRIBUTE = b"\x4a\x07\x0a\x01a\x12\x02\x18\x01"
MEMORY_BUDGET_BYTES = 200 << 20


def _ld(tag: int, payload: bytes) -> bytes:
    n, length = len(payload), b""
    while True:
        low, n = n & 0x7F, n >> 7
        length += bytes([low | (0x80 if n else 0)])
        if not n:
            return bytes([tag]) + length + payload


def hostile_protobuf(num_attributes: int = 1_700_000) -> bytes:
    """One span of 1.7 million tiny attributes: 15 MiB inflated, ~30 KB as sent."""
    span = _ld(0x0A, os.urandom(16)) + _ld(0x12, os.urandom(8)) + _TINY_ATTRIBUTE * num_attributes
    return _ld(0x0A, _ld(0x12, _ld(0x12, span)))


def hostile_json(num_attributes: int = 425_000) -> bytes:
    attribute = b'{"key":"a","value":{"intValue":"1"}},'
    return (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + os.urandom(16).hex().encode()
            + b'","spanId":"' + os.urandom(8).hex().encode() + b'","name":"x","attributes":['
            + attribute * (num_attributes - 1) + attribute[:-1] + b"]}]}]}]}")


def deep_json(depth: int = 100_000) -> bytes:
    return b'{"resourceSpans": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.fixture
def proxy(proxy_factory, fake_upstream):
    return proxy_factory(fake_upstream.base_url, otlp_grpc_listen="127.0.0.1:0")


def _grpc_code(port: int, body: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        try:
            call(body, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()


def _outcome(proxy, transport: str, outcome: str) -> float:
    return proxy.metric("llm_otlp_receiver_requests_total", transport=transport, outcome=outcome)


def test_a_deep_json_export_is_malformed_on_every_transport(proxy):
    answer = httpx.post(proxy.base_url + "/v1/traces", content=deep_json(),
                        headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 400, answer.content[:200]
    assert answer.headers["content-type"] == "application/json"
    assert json.loads(answer.content)["code"] == 3                        # INVALID_ARGUMENT
    gzipped = httpx.post(proxy.base_url + "/v1/traces", content=gzip.compress(deep_json()),
                         headers=JSON_GZIP, timeout=30)
    assert gzipped.status_code == 400
    assert _outcome(proxy, "http", "malformed") == 2
    # Protobuf nested past the bound: AnyValue{array_value{values{...}}} 200 deep.
    value = b"\x18\x01"
    for _ in range(200):
        value = _ld(0x2A, _ld(0x0A, value))
    deep = _ld(0x0A, _ld(0x12, _ld(0x12, _ld(0x4A, _ld(0x0A, b"k") + _ld(0x12, value)))))
    assert httpx.post(proxy.base_url + "/v1/traces", content=deep,
                      headers={"content-type": "application/x-protobuf"}).status_code == 400
    assert _grpc_code(proxy.parts.otlp_grpc.port, deep) == grpc.StatusCode.INVALID_ARGUMENT
    assert _outcome(proxy, "http", "malformed") == 3
    assert _outcome(proxy, "grpc", "malformed") == 1


def test_an_attribute_flood_is_refused_before_it_is_built(proxy):
    body = gzip.compress(hostile_protobuf())
    assert len(body) < 40_000
    answer = httpx.post(proxy.base_url + "/v1/traces", content=body, headers=PROTOBUF, timeout=30)
    assert answer.status_code == 400 and b"attributes" in answer.content
    as_json = httpx.post(proxy.base_url + "/v1/traces", content=gzip.compress(hostile_json()),
                         headers=JSON_GZIP, timeout=30)
    assert as_json.status_code == 400 and json.loads(as_json.content)["code"] == 3
    assert _outcome(proxy, "http", "too_many_attributes") == 2
    grpc_body = hostile_protobuf(1_000_000)   # under gRPC's 16 MiB message limit
    assert _grpc_code(proxy.parts.otlp_grpc.port, grpc_body) == grpc.StatusCode.INVALID_ARGUMENT
    assert _outcome(proxy, "grpc", "too_many_attributes") == 1
    assert _outcome(proxy, "http", "accepted") == _outcome(proxy, "grpc", "accepted") == 0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sixteen_hostile_exports_at_once_cost_a_bystander_nothing(proxy):
    bodies = ([(gzip.compress(hostile_protobuf()), PROTOBUF)] * 8
              + [(gzip.compress(hostile_json()), JSON_GZIP)] * 8)
    for _ in range(3):   # warm: the pool's threads, the first allocations
        assert httpx.get(proxy.base_url + "/health").status_code == 200
    idle_rss, peak = _rss_bytes(), [0]
    latencies: list[float] = []
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(0.005)

    def bystander() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                start = time.perf_counter()
                assert client.get(proxy.base_url + "/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                stop.wait(0.01)

    def attack(body_headers) -> int:
        body, headers = body_headers
        return httpx.post(proxy.base_url + "/v1/traces", content=body, headers=headers,
                          timeout=60).status_code

    threads = [threading.Thread(target=sample_rss), threading.Thread(target=bystander)]
    for thread in threads:
        thread.start()
    statuses: list[int] = []
    try:
        with ThreadPoolExecutor(16) as pool:
            for _ in range(3):
                statuses += list(pool.map(attack, bodies))
            streamed = stream_through(proxy.base_url)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert streamed.status_code == 200
    assert set(statuses) <= {400, 503} and statuses.count(400) >= 16, statuses
    grown = peak[0] - idle_rss
    worst = max(latencies)
    print(f"\n16 hostile exports x3 (8 protobuf 30 kB gzip, 8 JSON 45 kB gzip): "
          f"{statuses.count(400)} refused 400, {statuses.count(503)} 503; "
          f"RSS idle {idle_rss / 2**20:.0f} MiB, peak +{grown / 2**20:.0f} MiB; /health "
          f"{len(latencies)} probes, median {statistics.median(latencies) * 1e3:.1f} ms, "
          f"worst {worst * 1e3:.1f} ms")
    assert grown < MEMORY_BUDGET_BYTES
    # The bystander shares this process's GIL with the 16 attacking client threads, so its
    # tail is theirs as much as the proxy's (the 100 ms aim is measured with a bystander
    # process of its own: tests/reliability/test_otlp_receiver_fuzz.py). What a parse on the
    # event loop did, seconds frozen per export, still fails both bounds.
    assert statistics.median(latencies) < 0.1 and worst < 1.0
