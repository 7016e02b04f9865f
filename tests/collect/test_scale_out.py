"""Two collectors behind a trace-id balancer (issue 32, item 4): the property the
OpenTelemetry Collector's `loadbalancing` exporter (`routing_key: traceID`,
dashboards/otel-collector-loadbalancing.yaml) gives, tested as itself. Exports are split by
a hash of the trace id; every beacon goes to either collector, which relays it through the
same balancer (`--beacon-relay-url`); every trace is complete, in exactly one collector."""
from __future__ import annotations

import json
import secrets

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from test_whole_path_join import App
from whole_path_support import backend_trace, beacon, export, now_base_ns

N = 2
TRACES = 20


class Balancer:
    """Routes each span of an export to the collector its trace id hashes to, as the
    loadbalancing exporter does (split per trace, one sub-export per collector)."""

    def __init__(self) -> None:
        self.collectors: list[App] = []
        self.queued: list[bytes] = []   # what the collectors relayed, routed from the test

    def owner(self, trace_id: bytes) -> App:
        return self.collectors[int.from_bytes(trace_id[:8], "big") % N]

    def route(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        parts: dict[int, ExportTraceServiceRequest] = {}
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    target = self.collectors.index(self.owner(span.trace_id))
                    out = parts.setdefault(target, ExportTraceServiceRequest())
                    out.resource_spans.append(ResourceSpans(
                        resource=rs.resource, scope_spans=[ScopeSpans(scope=ss.scope,
                                                                      spans=[span])]))
        for target, sub in parts.items():
            answer = self.collectors[target].client.post(
                "/v1/traces", content=sub.SerializeToString(),
                headers={"content-type": "application/x-protobuf"})
            assert answer.status_code == 200

    def handler(self, request: httpx.Request) -> httpx.Response:
        # Called on a collector's event loop: the export is routed afterwards, from the
        # test's thread (a collector's TestClient cannot be called from its own loop).
        self.queued.append(request.content)
        return httpx.Response(200)


def _to_protobuf(json_body: bytes) -> bytes:
    from tracer.engines.spans import request_from_json
    return request_from_json(json_body).SerializeToString()


def test_every_trace_is_complete_in_exactly_one_of_two_collectors():
    lb = Balancer()
    transport = httpx.MockTransport(lb.handler)
    lb.collectors = [App(beacon_relay_url="http://lb/v1/traces", relay_transport=transport)
                     for _ in range(N)]
    base = now_base_ns()
    ids = [secrets.token_hex(16) for _ in range(TRACES)]
    with lb.collectors[0].client, lb.collectors[1].client:
        for i, trace_id in enumerate(ids):
            spans = backend_trace(trace_id, base)
            lb.route(_to_protobuf(export(spans[-1:])))     # the engine's export
            lb.route(_to_protobuf(export(spans[:-1])))     # the backend's
            # the browser's beacon reaches either collector, whoever owns the trace
            assert lb.collectors[i % N].beacon(beacon(trace_id)) == 202
        for c in lb.collectors:
            relay = c.parts.probe.ingestor.relay
            assert c.client.portal.call(relay.flush)
        assert len(lb.queued) == TRACES
        for body in lb.queued:
            lb.route(body)
        found = {t: [c for c in lb.collectors if c.trace(t) is not None] for t in ids}
    assert all(len(where) == 1 for where in found.values()), found
    owners = {t: lb.owner(bytes.fromhex(t)) for t in ids}
    assert all(found[t][0] is owners[t] for t in ids)
    assert {id(o) for o in owners.values()} == {id(c) for c in lb.collectors}   # both used
    complete = sum(c.value("llm_collector_traces_total", outcome="complete")
                   for c in lb.collectors)
    relayed = sum(c.value("llm_probe_beacons_total", outcome="relayed") for c in lb.collectors)
    accepted = sum(c.value("llm_probe_beacons_total", outcome="accepted") for c in lb.collectors)
    assert complete == TRACES and relayed == TRACES and accepted == TRACES
    for c in lb.collectors:
        assert len(c.parts.pending) == 0


def test_a_relayed_beacon_proves_itself_again():
    """A beacon span sent straight to a collector's receiver is no proof: its token is
    checked there as on /v1/probe."""
    app = App()
    from tracer.collect.beacon_relay import beacon_export
    from tracer.web.probe.schema import parse_beacon
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    forged = beacon(trace_id)
    forged["token"] = "0" * 64
    body = beacon_export(parse_beacon(json.dumps(forged).encode()), trace_id)
    with app.client:
        assert app.client.post("/v1/traces", content=body, headers={
            "content-type": "application/x-protobuf"}).status_code == 200
    assert app.value("llm_probe_beacons_total", outcome="rejected_token") == 1
    assert len(app.parts.pending) == 0
