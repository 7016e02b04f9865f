"""The proxy in front of the fake upstream: bytes unchanged and unbuffered, trace context in
and out, the five stages timed, the engine's observability surface, bad input."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from proxy_support import wait_until
from tracer.web.observability import ObservabilitySettings
from tracer.testing.fake_upstream import MODEL
from tracer.record.stages import PROXY_STAGE_LABELS, PROXY_STAGES
from tracer.record.traceparent import parse_server_timing, parse_traceparent
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.testing.transport import RecordingTransport, serve_request

CLIENT_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CHAT = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def raw_stream(url: str, body: dict, headers: dict | None = None) -> tuple[httpx.Headers, bytes]:
    with httpx.stream("POST", url, json=body, headers=headers or {}) as response:
        assert response.status_code == 200
        return response.headers, b"".join(response.iter_raw())


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": MODEL, "stream": True, "prompt": "hi"}),
    ("/v1/chat/completions", {**CHAT, "stream": False}),
])
def test_bytes_are_relayed_unchanged_and_every_stage_is_timed(proxy_factory, fake_upstream,
                                                              path, body):
    proxy = proxy_factory(fake_upstream.base_url)
    _, direct = raw_stream(fake_upstream.base_url + path, body)
    headers, relayed = raw_stream(proxy.base_url + path, body)
    assert relayed == direct
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(5)
    assert record.source == "proxy" and record.model == MODEL
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert record.unattributed_ns == 0
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert record.finish_reason == "stop" and record.error_type is None
    assert headers["x-request-id"] == record.request_id
    assert parse_server_timing(headers["server-timing"]).endswith(f"{record.span_id}-01")
    if body["stream"]:
        assert record.num_output_tokens == fake_upstream.chunks   # content events, not role
        assert record.itl.count == fake_upstream.chunks - 1
        assert "content-length" not in headers
    else:
        assert record.num_output_tokens == fake_upstream.chunks   # from the upstream usage
        assert record.num_prompt_tokens == 5


def test_sse_is_not_buffered(proxy_factory, fake_upstream):
    """Chunks reach the client as the upstream sends them, not when the stream ends."""
    proxy = proxy_factory(fake_upstream.base_url)
    gap_ms, num_chunks = 150, 4
    arrivals = []
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=CHAT,
                      headers={"x-fake-gap-ms": str(gap_ms), "x-fake-chunks": str(num_chunks)}
                      ) as response:
        for line in response.iter_lines():
            if '"content":"tok' in line:
                arrivals.append(time.perf_counter())
    gaps_ms = [(b - a) * 1e3 for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) == num_chunks
    assert min(gaps_ms) > gap_ms * 0.6, gaps_ms
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(1)
    assert record.itl.min_ns > gap_ms * 0.6 * 1e6


@pytest.mark.parametrize("http_spans", [False, True])
def test_trace_is_continued_and_the_proxy_span_goes_upstream(proxy_factory, fake_upstream,
                                                             http_spans):
    proxy = proxy_factory(fake_upstream.base_url, http_spans=http_spans)
    raw_stream(proxy.base_url + "/v1/chat/completions", CHAT,
               {"traceparent": CLIENT_PARENT, "tracestate": "vendor=1"})
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(1)
    (seen,) = fake_upstream.state.requests
    forwarded = parse_traceparent(seen.headers["traceparent"])
    assert forwarded.trace_id == CLIENT_PARENT[3:35] == record.trace_id
    # The upstream's parent is our CLIENT span for the call, whose id the client never saw
    # (the engine join's secret, issue 39), and which nests under our `chat` span.
    assert forwarded.span_id == record.attrs["llm.upstream.span_id"] != record.span_id
    assert forwarded.flags == parse_traceparent(CLIENT_PARENT).flags
    assert seen.headers["tracestate"] == "vendor=1"
    assert seen.headers["accept-encoding"] == "identity"
    assert seen.headers["x-forwarded-for"] == "127.0.0.1"
    spans = {s.name: s for s in proxy.spans.get_finished_spans()}
    chat_span = spans[f"chat {MODEL}"]
    # One SERVER span for the hop: FastAPI's HTTP span when enabled, else ours.
    server_span = spans["POST /v1/chat/completions"] if http_spans else chat_span
    assert server_span.kind is SpanKind.SERVER
    assert f"{server_span.parent.span_id:016x}" == CLIENT_PARENT[36:52]
    if http_spans:
        assert chat_span.parent.span_id == server_span.context.span_id
        assert chat_span.kind is SpanKind.INTERNAL
    for stage in PROXY_STAGES:
        assert spans[f"llm.{stage}"].parent.span_id == chat_span.context.span_id
    call = spans["POST"]
    assert (call.kind, f"{call.context.span_id:016x}") == (SpanKind.CLIENT, forwarded.span_id)
    assert call.parent.span_id == chat_span.context.span_id
    assert call.start_time <= spans["llm.upstream_connect"].end_time <= call.end_time
    assert chat_span.attributes["llm.source"] == "proxy"
    assert chat_span.attributes["llm.upstream.request_id"] == "fake-upstream-1"
    assert "response_start" in [name for name, _, _ in record.events]


def test_an_unserved_model_is_labelled_other(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    raw_stream(proxy.base_url + "/v1/chat/completions", {**CHAT, "model": "x" * 300})
    proxy.wait_idle()
    assert proxy.parts.obs.store.recent(1)[0].model == "other"
    assert {s.name for s in proxy.spans.get_finished_spans()} >= {"chat other"}
    assert proxy.metric("llm_requests_total", model="other", finish_reason="stop") == 1


def test_bad_json_and_oversized_bodies_are_answered_by_the_proxy(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url,
                          observability=ObservabilitySettings(max_body_bytes=1000))
    url = proxy.base_url + "/v1/chat/completions"
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    big = httpx.post(url, json={**CHAT, "pad": "x" * 2000})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert fake_upstream.state.requests == []


def test_other_paths_pass_through(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    models = httpx.get(proxy.base_url + "/v1/models?limit=1")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    (seen,) = fake_upstream.state.requests
    assert seen.path == "/v1/models"
    assert len(proxy.parts.obs.store) == 0       # passthrough is relayed, not recorded


def test_cors_exposes_the_trace_headers_and_allows_traceparent(proxy_factory, fake_upstream):
    origin = "http://app.example"
    proxy = proxy_factory(fake_upstream.base_url, observability=_observability(origin))
    preflight = httpx.options(proxy.base_url + "/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "traceparent,content-type"})
    assert preflight.status_code == 200
    assert "traceparent" in preflight.headers["access-control-allow-headers"].lower()
    headers, _ = raw_stream(proxy.base_url + "/v1/chat/completions", CHAT, {"origin": origin})
    exposed = headers["access-control-expose-headers"].lower()
    assert "server-timing" in exposed and "x-request-id" in exposed
    assert headers["timing-allow-origin"] == origin


def _observability(origin: str):
    return ObservabilitySettings(cors_origins=(origin,))


def test_a_probe_beacon_for_a_proxied_trace_is_joined(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    raw_stream(proxy.base_url + "/v1/chat/completions", CHAT, {"traceparent": CLIENT_PARENT})
    proxy.wait_idle()
    record = proxy.parts.obs.store.recent(1)[0]
    client_ttft_ms = record.ttft_ns / 1e6 + 3.0
    beacon = {"v": 1, "trace_id": record.trace_id, "traceparent": CLIENT_PARENT,
              "token": proxy.parts.obs.beacon_signer.token(record.trace_id),
              "outcome": "ok", "status": 200, "chunks": fake_upstream.chunks,
              "t": {"start": 0, "headers": 1.0, "first_byte": 1.2,
                    "first_token": client_ttft_ms, "first_paint": client_ttft_ms + 5,
                    "end": client_ttft_ms + 10}}
    response = httpx.post(proxy.base_url + "/v1/probe", content=json.dumps(beacon),
                          headers={"content-type": "text/plain"})
    assert response.status_code == 202
    assert wait_until(lambda: proxy.parts.obs.store.get(record.trace_id).client is not None)
    assert proxy.metric("llm_probe_beacons_total", outcome="accepted") == 1
    assert proxy.metric("llm_client_time_to_first_token_seconds_count", model=MODEL) == 1
    view = httpx.get(f"{proxy.base_url}/ui/api/trace/{record.trace_id}").json()
    assert [s["stage"] for s in view["stages"]] == list(PROXY_STAGES)
    assert view["source"] == "proxy" and view["client"]["client_ttft_ms"] == client_ttft_ms


def test_the_ui_attributes_ttft_to_the_proxy_stages(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    raw_stream(proxy.base_url + "/v1/chat/completions", CHAT)
    proxy.wait_idle()
    attribution = httpx.get(proxy.base_url + "/ui/api/attribution").json()
    # Every stage a proxy record can carry, the engine's included (zero here: no signal).
    assert [s["stage"] for s in attribution["stages"]] == [*PROXY_STAGE_LABELS, "unattributed"]
    assert attribution["num_requests"] == 1
    # One request: each median is its own stage, and the stages add up to its TTFT.
    assert sum(s["median_ms"] for s in attribution["stages"]) == pytest.approx(
        attribution["median_ttft_ms"], rel=1e-9)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_the_head_leaves_with_the_first_events_and_the_last_with_the_end():
    """As nginx's writev: an upstream read that holds the response head and the first events
    is one write to the client, and the last read ([DONE] and the end of the body) leaves
    with the end of the client's chunked body (tracer/web/write_batch.py). The proxy runs
    behind the HTTP protocol the CLI runs, writing into a recording transport."""
    role = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
    first = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    finish = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
    done = b"data: [DONE]\n\n"
    client = RecordingTransport()

    async def main() -> list[bytes]:
        async def upstream(reader, writer) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            # One write each: the proxy's reads follow them, as it relays each before the next.
            for part in (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n" + _chunk(role + first),
                         _chunk(finish), _chunk(done) + b"0\r\n\r\n"):
                client.wrote.clear()
                writer.write(part)
                await asyncio.wait_for(client.wrote.wait(), 10)
            writer.close()

        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        parts = create_proxy_app(ProxySettings(f"http://127.0.0.1:{port}"), model_names=(MODEL,),
                                 registry=CollectorRegistry(), tracer_provider=TracerProvider())
        body = json.dumps(CHAT).encode()
        request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: "
                   b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        try:
            return await serve_request(parts.app, request, client)
        finally:
            await parts.upstream.aclose()
            parts.obs.close()
            server.close()

    calls = asyncio.run(main())
    assert len(calls) == 3, calls
    head, _, body = calls[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in head
    assert body == _chunk(role + first)
    assert calls[1] == _chunk(finish)
    assert calls[2] == _chunk(done) + b"0\r\n\r\n"
