"""Issue 39, break 7: a span forged from what a client sees must not rewrite its request.

The client sees the proxy's own span context (`Server-Timing: trace;desc=...`), the beacon
token and the in-band line; the engine is sent a fresh span id as its parent, which only
the upstream sees, and only a span under that id joins (docs/receiver-threat-model.md). The
client's API key is not the receiver's token; a second span for one request is a conflict,
counted and said on the record."""
from __future__ import annotations

import os

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from engine_support import EngineSdk, stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.record.traceparent import parse_server_timing
from tracer.testing.engine_spans import vllm_span
from tracer.web.observability import ObservabilitySettings

PROTOBUF = {"content-type": "application/x-protobuf"}
DELAY = {"x-fake-first-token-delay-ms": "40"}
EXPECTING = JoinSettings(wait_s=30.0, spans_expected=True)
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _span(trace_id: str, parent: str, *, queue_s: float, span_id: bytes | None = None,
          start_ns: int = 1, end_ns: int = 2) -> Span:
    def number(key, value):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return Span(trace_id=bytes.fromhex(trace_id), span_id=span_id or os.urandom(8),
                parent_span_id=bytes.fromhex(parent), name="llm_request",
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start_ns,
                end_time_unix_nano=end_ns,
                attributes=[number("gen_ai.latency.time_to_first_token", queue_s * 2),
                            number("gen_ai.latency.time_in_queue", queue_s),
                            number("gen_ai.latency.time_in_model_prefill", queue_s / 2)])


def _export(spans: list[Span]) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def _post(proxy, spans: list[Span], token: str | None = None) -> int:
    headers = {**PROTOBUF, **({"authorization": f"Bearer {token}"} if token else {})}
    return httpx.post(proxy.base_url + "/v1/traces", content=_export(spans),
                      headers=headers).status_code


def _count(proxy, outcome: str) -> float:
    return proxy.metric("llm_engine_timing_total", source="vllm", outcome=outcome)


def test_the_upstream_parent_is_a_span_id_the_client_never_sees(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    response = stream_through(proxy.base_url, DELAY)
    client_view = parse_server_timing(response.headers["server-timing"])
    upstream_view = fake_upstream.state.requests[-1].headers["traceparent"]
    client_trace, client_span, client_flags = client_view.split("-")[1:]
    upstream_trace, upstream_span, upstream_flags = upstream_view.split("-")[1:]
    # One trace, the same sampling decision; a parent id of its own (W3C Trace Context:
    # parent-id is "the ID of this request as known by the caller").
    assert (upstream_trace, upstream_flags) == (client_trace, client_flags)
    assert upstream_span != client_span and upstream_span != "0" * 16
    everything_the_client_got = str(response.headers) + response.text
    assert upstream_span not in everything_the_client_got


def test_a_span_built_from_server_timing_rewrites_nothing(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    sdk = EngineSdk(proxy.base_url)
    try:
        response = stream_through(proxy.base_url, DELAY)
        trace_id, span_id = parse_server_timing(response.headers["server-timing"]).split("-")[1:3]
        assert wait_until(lambda: proxy.parts.join.num_pending == 1)
        # The attack: the ids in the response's Server-Timing, no token configured.
        assert _post(proxy, [_span(trace_id, span_id, queue_s=999.0)]) == 200
        assert wait_until(lambda: _count(proxy, "unmatched_span") == 1)
        assert proxy.parts.join.num_pending == 1         # still waiting for its own span
        assert proxy.parts.obs.store.get(trace_id) is None
        seen = fake_upstream.state.requests[-1]
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        vllm_span(sdk.tracer, seen.headers["traceparent"], arrival_ns=seen.arrival_epoch_ns,
                  end_ns=seen.first_content_epoch_ns, ttft_s=ttft_s, queue_s=ttft_s / 4,
                  prefill_s=ttft_s / 2)
        proxy.wait_idle()
        record = proxy.parts.obs.store.get(trace_id)
        assert record is not None and record.span_id == span_id
        assert record.attrs["llm.engine.outcome"] == "joined"
        assert record.stage_ns("queue") == round(ttft_s / 4 * 1e9)
        assert (_count(proxy, "joined"), _count(proxy, "unmatched_span")) == (1, 1)
    finally:
        sdk.shutdown()


def test_the_client_key_is_not_the_receiver_token(proxy_factory, fake_upstream):
    keyed = ObservabilitySettings(api_key="client-key")
    proxy = proxy_factory(fake_upstream.base_url, observability=keyed,
                          otlp_receiver_token="otlp-token", otlp_grpc_listen="127.0.0.1:0")
    assert _post(proxy, [], token="client-key") == 401
    assert _post(proxy, [], token="otlp-token") == 200
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.parts.otlp_grpc.port}")
    call = channel.unary_unary(METHOD, request_serializer=None,
                               response_deserializer=ExportTraceServiceResponse.FromString)
    with channel:
        try:
            call(_export([]), metadata=(("authorization", "Bearer client-key"),), timeout=10)
            raise AssertionError("the client key was accepted over gRPC")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
        call(_export([]), metadata=(("authorization", "Bearer otlp-token"),), timeout=10)


def test_a_client_key_without_a_receiver_token_closes_the_receiver(proxy_factory,
                                                                    fake_upstream):
    # Before, the client key was the token: a client could post spans. Now no key a client
    # holds opens it; the operator gives the engines a token of their own.
    proxy = proxy_factory(fake_upstream.base_url,
                          observability=ObservabilitySettings(api_key="client-key"))
    assert _post(proxy, [], token="client-key") == 401
    assert _post(proxy, []) == 401
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http",
                        outcome="unauthorized") == 2


def _parked_request(proxy, fake_upstream) -> tuple[str, str]:
    stream_through(proxy.base_url, DELAY)
    assert wait_until(lambda: proxy.parts.join.num_pending == 1)
    return tuple(fake_upstream.state.requests[-1].headers["traceparent"].split("-")[1:3])


def test_two_spans_for_one_request_are_a_conflict_the_record_names(proxy_factory,
                                                                   fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    trace_id, parent = _parked_request(proxy, fake_upstream)
    # Both carry the parent only the upstream saw: neither is preferred silently.
    assert _post(proxy, [_span(trace_id, parent, queue_s=0.01),
                         _span(trace_id, parent, queue_s=0.02)]) == 200
    proxy.wait_idle()
    assert wait_until(lambda: proxy.parts.obs.store.get(trace_id) is not None)
    record = proxy.parts.obs.store.get(trace_id)
    assert record.attrs["llm.engine.conflict"] is True
    assert record.attrs["llm.engine.outcome"] == "conflict"
    assert "queue" not in [s.stage for s in record.stages]   # no engine stages trusted
    assert _count(proxy, "conflict_span") == 1
    assert _count(proxy, "joined") == 0 and _count(proxy, "unmatched_span") == 0


def test_a_late_second_span_is_a_conflict_and_a_resent_one_a_duplicate(proxy_factory,
                                                                       fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    trace_id, parent = _parked_request(proxy, fake_upstream)
    first = _span(trace_id, parent, queue_s=0.01)
    assert _post(proxy, [first]) == 200
    proxy.wait_idle()
    assert wait_until(lambda: _count(proxy, "joined") == 1)
    assert proxy.parts.obs.store.get(trace_id).attrs["llm.engine.outcome"] == "joined"
    # The exporter sends the same span again (an OTLP retry): harmless, said as such.
    assert _post(proxy, [first]) == 200
    assert wait_until(lambda: _count(proxy, "duplicate_span") == 1)
    # Another span for the same request, after the record was published: a conflict, not
    # `unmatched` (that is for spans of no request of ours).
    assert _post(proxy, [_span(trace_id, parent, queue_s=0.5)]) == 200
    assert wait_until(lambda: _count(proxy, "conflict_span") == 1)
    assert _count(proxy, "unmatched_span") == 0


def test_an_upstream_echoing_traceparent_does_not_leak_the_secret(proxy_factory):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.headers["traceparent"])
            body = json.dumps({"id": "x", "object": "chat.completion", "model": "m",
                               "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                   "role": "assistant", "content": "hi"}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("traceparent", self.headers["traceparent"])   # the echo
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proxy = proxy_factory(f"http://127.0.0.1:{server.server_address[1]}", join=EXPECTING)
        response = httpx.post(proxy.base_url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
        secret = seen[-1].split("-")[2]
        assert "traceparent" not in response.headers
        assert secret not in str(response.headers)
    finally:
        server.shutdown()
        server.server_close()
