"""The OTLP receiver of a proxy process, fuzzed and flooded on loopback (issue 39, "Deliver"):
Hypothesis writes exports (well-formed, nested, mutated, truncated; protobuf and JSON;
identity and gzip) to `POST /v1/traces` and to gRPC `TraceService/Export`, while a bystander
polls `/health`. No answer may be a 5xx other than the pool's 503; the proxy process's RSS
and the bystander's latency are measured and printed (docs/reference.md, "OTLP receiver
limits"). The proxy is its own process, so its RSS and its event loop are its own."""
from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "proxy"))
from proxy_support import closed_port, wait_until  # noqa: E402
from test_proxy_otlp_flood import hostile_json, hostile_protobuf  # noqa: E402

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
HTTP_OK = {200, 400, 413, 415, 503}
GRPC_OK = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
           grpc.StatusCode.RESOURCE_EXHAUSTED}


class ProxyProcess:
    def __init__(self) -> None:
        self.up_port, self.port, self.grpc_port = closed_port(), closed_port(), closed_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        self.upstream = subprocess.Popen(
            [sys.executable, "-m", "tracer.testing.fake_upstream", "--port", str(self.up_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.proxy = subprocess.Popen(
            [sys.executable, "-m", "tracer", "proxy", "--upstream",
             f"http://127.0.0.1:{self.up_port}", "--listen", f"127.0.0.1:{self.port}",
             "--otlp-grpc-listen", f"127.0.0.1:{self.grpc_port}",
             "--served-model-name", "fake-model", "--upstream-metrics-path", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.base_url = f"http://127.0.0.1:{self.port}"
        assert wait_until(self._up, 60), self.proxy.stderr.read1(4000) if self.proxy.poll() else ""

    def _up(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proxy.pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> None:
        for process in (self.proxy, self.upstream):
            process.terminate()
            process.wait(30)


# The bystander, a process of its own: its latency is then the proxy's, not this process's
# pauses (Hypothesis generating inputs, the client's threads sending them, one GIL). It polls
# `/health` on one keep-alive connection every 20 ms until its stdin closes, then prints
# every latency in seconds.
BYSTANDER = r"""
import http.client, json, select, sys, time
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=30)
latencies = []
while not select.select([sys.stdin], [], [], 0.02)[0]:
    start = time.perf_counter()
    conn.request("GET", "/health")
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    latencies.append(time.perf_counter() - start)
print(json.dumps(latencies))
"""


class Watch:
    """A bystander polling `/health` and a sampler of the proxy's RSS, while a block runs."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy, self.stop = proxy, threading.Event()
        self.latencies: list[float] = []
        self.idle_rss = self.peak_rss = proxy.rss_bytes()
        self.sampler = threading.Thread(target=self._rss)

    def __enter__(self):
        host, port = self.proxy.base_url.removeprefix("http://").split(":")
        self.bystander = subprocess.Popen([sys.executable, "-c", BYSTANDER, host, port],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True)
        self.sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.sampler.join(30)
        out, _ = self.bystander.communicate(timeout=60)    # closing stdin ends its loop
        assert self.bystander.returncode == 0, out
        self.latencies = json.loads(out)

    def _rss(self) -> None:
        while not self.stop.is_set():
            self.peak_rss = max(self.peak_rss, self.proxy.rss_bytes())
            self.stop.wait(0.005)

    def summary(self) -> str:
        lat = sorted(self.latencies)
        return (f"RSS idle {self.idle_rss / 2**20:.0f} MiB, peak +"
                f"{(self.peak_rss - self.idle_rss) / 2**20:.0f} MiB; /health {len(lat)} probes, "
                f"median {statistics.median(lat) * 1e3:.1f} ms, p99 "
                f"{lat[int(len(lat) * 0.99)] * 1e3:.1f} ms, worst {lat[-1] * 1e3:.1f} ms")


@pytest.fixture(scope="module")
def proxy():
    process = ProxyProcess()
    yield process
    process.stop()


def test_sixteen_hostile_exports_at_once_against_a_proxy_process(proxy):
    bodies = ([(gzip.compress(hostile_protobuf()), "application/x-protobuf")] * 8
              + [(gzip.compress(hostile_json()), "application/json")] * 8)

    def attack(body_type) -> int:
        body, content_type = body_type
        return httpx.post(proxy.base_url + "/v1/traces", content=body, timeout=60, headers={
            "content-type": content_type, "content-encoding": "gzip"}).status_code

    with Watch(proxy) as watch, ThreadPoolExecutor(16) as pool:
        statuses = [s for _ in range(5) for s in pool.map(attack, bodies)]
    print(f"\nflood: 5 x 16 concurrent (8 protobuf {len(bodies[0][0]) // 1000} kB gzip, 8 JSON "
          f"{len(bodies[-1][0]) // 1000} kB gzip): {statuses.count(400)} x 400, "
          f"{statuses.count(503)} x 503; {watch.summary()}")
    assert set(statuses) <= {400, 503} and statuses.count(400) >= 16
    assert watch.peak_rss - watch.idle_rss < 200 << 20
    assert statistics.median(watch.latencies) < 0.1


# --- the fuzz -------------------------------------------------------------------------------

_keys = st.text(max_size=12)
_scalars = st.one_of(st.builds(AnyValue, string_value=st.text(max_size=20)),
                     st.builds(AnyValue, int_value=st.integers(-2**63, 2**63 - 1)),
                     st.builds(AnyValue, double_value=st.floats()),
                     st.builds(AnyValue, bool_value=st.booleans()))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(inner, max_size=4)),
    st.builds(lambda kvs: AnyValue(kvlist_value=KeyValueList(values=kvs)),
              st.lists(st.builds(KeyValue, key=_keys, value=inner), max_size=4))), max_leaves=20)
_attributes = st.lists(st.builds(KeyValue, key=st.sampled_from(
    ["gen_ai.usage.prompt_tokens", "gen_ai.latency.time_to_first_token",
     "gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill", "x"]) | _keys,
    value=_values), max_size=12)
_spans = st.builds(Span, trace_id=st.binary(min_size=16, max_size=16),
                   span_id=st.binary(min_size=8, max_size=8),
                   parent_span_id=st.binary(max_size=8), name=st.sampled_from(
                       ["llm_request", "x", ""]), start_time_unix_nano=st.integers(0, 2**64 - 1),
                   end_time_unix_nano=st.integers(0, 2**64 - 1), attributes=_attributes)
_exports = st.builds(lambda spans: ExportTraceServiceRequest(resource_spans=[ResourceSpans(
    scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString(), st.lists(_spans, max_size=6))


@st.composite
def _mutated(draw, base):
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(max_size=8))
        elif kind == "repeat" and data:
            data[at:at] = data[at:at + 16] * draw(st.integers(1, 2000))
    return bytes(data)


def _json_of(body: bytes) -> bytes:
    from google.protobuf.json_format import MessageToDict
    obj = MessageToDict(ExportTraceServiceRequest.FromString(body))
    for resource in obj.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:   # OTLP/JSON ids are hex
                        import base64
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(obj).encode()


_json_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(
    max_size=8), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["resourceSpans", "scopeSpans", "spans", "attributes", "value", "arrayValue", "values",
         "key", "intValue", "traceId", "spanId"]) | st.text(max_size=5), inner, max_size=4),
    max_leaves=30).map(lambda obj: json.dumps({"resourceSpans": obj}).encode())
_deep = st.integers(1, 5_000).map(lambda d: b'{"resourceSpans":' + b"[" * d + b"]" * d + b"}")
_bodies = st.one_of(
    st.tuples(_mutated(_exports), st.just("application/x-protobuf")),
    st.tuples(_exports.map(_json_of), st.just("application/json")),
    st.tuples(_mutated(_exports.map(_json_of)), st.just("application/json")),
    st.tuples(_json_junk | _deep, st.just("application/json")))
TALLY = {"http": 0, "grpc": 0, "5xx": 0, "503": 0}


@settings(max_examples=int(os.environ.get("OTLP_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=list(HealthCheck), database=None)
@given(body=_bodies, gzipped=st.booleans())
def _fuzz_http(proxy, body, gzipped) -> None:
    data, content_type = body
    headers = {"content-type": content_type}
    if gzipped:
        data, headers["content-encoding"] = gzip.compress(data, 1), "gzip"
    status = httpx.post(proxy.base_url + "/v1/traces", content=data, headers=headers,
                        timeout=30).status_code
    TALLY["http"] += 1
    TALLY["5xx"] += status >= 500
    TALLY["503"] += status == 503
    assert status in HTTP_OK, (status, data[:200])


@settings(max_examples=int(os.environ.get("OTLP_FUZZ_EXAMPLES", 300)) // 2, deadline=None,
          suppress_health_check=list(HealthCheck), database=None)
@given(data=_mutated(_exports))
def _fuzz_grpc(call, data) -> None:
    try:
        call(data, timeout=30)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code()
    TALLY["grpc"] += 1
    TALLY["5xx"] += code not in GRPC_OK
    assert code in GRPC_OK, (code, data[:200])


def test_fuzz_the_receiver_on_http_and_grpc(proxy):
    started = time.monotonic()
    with Watch(proxy) as watch:
        _fuzz_http(proxy)
        with grpc.insecure_channel(f"127.0.0.1:{proxy.grpc_port}") as channel:
            _fuzz_grpc(channel.unary_unary(METHOD, request_serializer=None,
                                           response_deserializer=None))
    assert proxy.proxy.poll() is None   # still alive
    assert httpx.get(proxy.base_url + "/health").status_code == 200
    print(f"\nfuzz: {TALLY['http']} HTTP + {TALLY['grpc']} gRPC inputs in "
          f"{time.monotonic() - started:.0f} s, {TALLY['5xx']} 5xx ({TALLY['503']} of them "
          f"503 overloaded); {watch.summary()}")
    assert TALLY["5xx"] == TALLY["503"]
