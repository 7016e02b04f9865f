"""One hostile request among normal ones, through the proxy, to a real OTLP/HTTP endpoint on
loopback (issue 13, item 2): every request's spans arrive, in requests that parse.

Before the fix the proxy copied `max_tokens: 100000000000000000000000` onto the span, the
encoder wrote a varint longer than 10 bytes, and the collector could parse nothing of the
batch: 0 of the neighbours' traces arrived. The export path here is the installed one
(`make_tracer_provider` with an endpoint: encoded as spans end, batched, POSTed).
"""
from __future__ import annotations

import http.server
import threading

import httpx
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from proxy_support import serve_app, wait_until
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.record.stages import PROXY_STAGES
from tracer.record.traceparent import parse_server_timing, parse_traceparent
from tracer.sinks.tracer_provider import make_tracer_provider
from tracer.testing.fake_upstream import MODEL

NORMAL = (b'{"model": "%s", "stream": true, "max_tokens": 8, "temperature": 0.5, '
          b'"messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode())
HOSTILE = [
    b'{"model": "%s", "stream": true, "max_tokens": 100000000000000000000000, '
    b'"temperature": NaN, "top_p": 1e400, "messages": []}' % MODEL.encode(),
    b'{"model": "%s", "stream": true, "max_tokens": 9223372036854775808, '
    b'"temperature": -Infinity, "top_p": -1e23, "messages": []}' % MODEL.encode(),
]


class _Collector(http.server.BaseHTTPRequestHandler):
    """Parses each POST as the OTel Collector would; 400 for one it cannot parse."""

    requests: list[ExportTraceServiceRequest] = []
    unparsable: list[bytes] = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["content-length"]))
        try:
            type(self).requests.append(ExportTraceServiceRequest.FromString(body))
            status = 200
        except DecodeError:
            type(self).unparsable.append(body)
            status = 400
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    _Collector.requests, _Collector.unparsable = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", _Collector
    server.shutdown()
    server.server_close()


def test_one_hostile_request_costs_no_other_request_its_spans(fake_upstream, collector):
    url, received = collector
    provider = make_tracer_provider("hostile-test", environ={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    parts = create_proxy_app(ProxySettings(fake_upstream.base_url, upstream_metrics_path=None),
                             model_names=(MODEL,), registry=CollectorRegistry(),
                             tracer_provider=provider)
    app = serve_app(parts.app)
    try:
        bodies = [NORMAL] * 3 + [HOSTILE[0]] + [NORMAL] * 3 + [HOSTILE[1]]
        trace_ids = []
        with httpx.Client(timeout=10) as client:
            for body in bodies:
                response = client.post(app.base_url + "/v1/chat/completions", content=body,
                                       headers={"content-type": "application/json"})
                assert response.status_code == 200
                trace_ids.append(parse_traceparent(
                    parse_server_timing(response.headers["server-timing"])).trace_id)
        assert wait_until(lambda: parts.obs.tracer.is_idle(10))
        # One batch (the schedule delay is a minute): all eight requests' spans together.
        assert provider.force_flush(10_000)
    finally:
        app.stop()
        provider.shutdown()

    assert received.unparsable == []
    spans = [s for r in received.requests for rs in r.resource_spans for ss in rs.scope_spans
             for s in ss.spans]
    by_trace: dict[str, list] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id.hex(), []).append(span)
    assert sorted(by_trace) == sorted(trace_ids)
    for trace_id, body in zip(trace_ids, bodies):
        names = sorted(s.name for s in by_trace[trace_id])
        # `POST`: the proxy's CLIENT span for its upstream call (the engine join's key).
        assert names == sorted([f"chat {MODEL}", "POST",
                                *(f"llm.{stage}" for stage in PROXY_STAGES)])
        (request_span,) = [s for s in by_trace[trace_id] if s.name == f"chat {MODEL}"]
        attrs = {kv.key: kv.value for kv in request_span.attributes}
        if body == NORMAL:
            assert attrs["gen_ai.request.max_tokens"].int_value == 8
            assert attrs["gen_ai.request.temperature"].double_value == 0.5
        else:   # nothing the span cannot carry was recorded
            assert not {"gen_ai.request.max_tokens", "gen_ai.request.temperature"} & set(attrs)
    # -1e23 is a finite float: recorded as such.
    (hostile_2,) = [s for s in by_trace[trace_ids[-1]] if s.name == f"chat {MODEL}"]
    assert {kv.key: kv.value.double_value for kv in hostile_2.attributes}[
        "gen_ai.request.top_p"] == -1e23
