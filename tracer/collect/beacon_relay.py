"""Beacons sent on to the collector that owns their trace (docs/architecture.md, "The whole
path"; docs/deployment.md, "Scale-out: many collectors").

With N collectors behind the OpenTelemetry Collector's `loadbalancing` exporter
(`routing_key: traceID`), a trace's spans all reach one collector, but the browser's
beacon goes to whichever collector its URL names: no balancer can hash a beacon's body onto
that exporter's ring. So with `--beacon-relay-url` (the balancer's OTLP/HTTP endpoint), a
collector turns each beacon that passed its checks into one span of the beacon's trace,
`ttftscope.beacon`, carrying the beacon's JSON, and exports it there: the balancer routes it
by trace id like every other span, and the owning collector takes the beacon out of the
export, checks it again (token or signed in-band timing, as `/v1/probe` does: the span is
no proof) and joins it. The first collector counts the beacon `relayed`; the owner counts
its real outcome.
"""
from __future__ import annotations

import secrets
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tracer.engines.spans import SpanView, spans_of
from tracer.web.probe.beacon import Beacon
from tracer.web.probe.beacon_error import BeaconError
from tracer.web.probe.schema import parse_beacon

BEACON_SPAN = "ttftscope.beacon"
BODY_ATTRIBUTE = "ttftscope.beacon.body"
# The probe endpoint's own bound on a beacon (tracer/web/probe/endpoint.py); a longer body
# in a relayed span is no beacon.
MAX_BODY_BYTES = 16 * 1024
# Beacons taken from one export at most: the receiver's span bound holds anyway.
MAX_PER_EXPORT = 1000


def beacon_export(beacon: Beacon, trace_id: str) -> bytes:
    """One OTLP/protobuf export holding the beacon as a span of its trace.

    >>> import json
    >>> b = parse_beacon(json.dumps({"v": 1, "trace_id": "ab" * 16, "outcome": "ok",
    ...                              "t": {"start": 0, "end": 5}}).encode())
    >>> request = ExportTraceServiceRequest.FromString(beacon_export(b, "ab" * 16))
    >>> spans, bodies = read_export(request)
    >>> spans, parse_beacon(bodies[0]) == b
    ([], True)
    """
    now = time.time_ns()
    span = Span(trace_id=bytes.fromhex(trace_id), span_id=secrets.token_bytes(8),
                name=BEACON_SPAN, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=now,
                end_time_unix_nano=now, attributes=[KeyValue(key=BODY_ATTRIBUTE, value=AnyValue(
                    string_value=beacon.model_dump_json(exclude_none=True)))])
    resource = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(
        string_value="ttftscope-collector"))])
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()


def read_export(request: ExportTraceServiceRequest) -> tuple[list[SpanView], list[bytes]]:
    """The collector's `read_export` (on the decode pool): the export's spans, and the
    bodies of the beacons relayed in it (their spans are not the trace's)."""
    bodies: list[bytes] = []
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                if span.name == BEACON_SPAN and len(bodies) < MAX_PER_EXPORT:
                    body = _body(span)
                    if body is not None:
                        bodies.append(body)
    spans = [s for s in spans_of(request) if s.name != BEACON_SPAN]
    return spans, bodies


def _body(span) -> bytes | None:
    for kv in span.attributes:
        if kv.key == BODY_ATTRIBUTE and kv.value.WhichOneof("value") == "string_value":
            body = kv.value.string_value.encode("utf-8")
            return body if len(body) <= MAX_BODY_BYTES else None
    return None


def join_relayed(endpoint, body: bytes) -> None:
    """A relayed beacon, checked and joined here as if it had come to `/v1/probe`
    (`endpoint` is its `ProbeEndpoint`), counted with its outcome."""
    try:
        beacon = parse_beacon(body)
    except BeaconError:
        endpoint.count("rejected_schema")
        return
    server, refusal = endpoint.authenticate(beacon)
    if refusal is None:
        endpoint.count(endpoint.ingestor.ingest(beacon, server, relayed=True))
