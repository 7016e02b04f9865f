"""The buffering verdict in the in-process join (a local record, no in-band timing): the
record's own emits are the send times, the beacon's `chunk_ms` the arrivals."""
from __future__ import annotations

import json

import pytest

from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.record.emits import GapSummary
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.store import TraceStore
from tracer.web.probe.endpoint import make_probe_router

MODEL, MS = "m", 1_000_000


def harness():
    registry, store, exporter = CollectorRegistry(), TraceStore(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = FastAPI()
    app.include_router(make_probe_router(store=store, metrics=LLMMetrics(registry, [MODEL]),
                                         span_builder=SpanBuilder(provider, Clock())))
    return TestClient(app), store, registry, exporter


def record(trace_id: str) -> RequestRecord:
    # TTFT 40 ms, then a content event every 30 ms: sends at 40, 70, 100, 130, 160 ms.
    return RequestRecord("r-" + trace_id[:4], trace_id, "1" * 16, MODEL, "chat", 0, 500 * MS,
                         ttft_ns=40 * MS, itl=GapSummary.of((30 * MS,) * 4),
                         events=(("response_start", 2 * MS, {}),))


def post(client, trace_id: str, chunk_ms: list[float]):
    body = {"v": 1, "trace_id": trace_id, "outcome": "ok", "chunks": len(chunk_ms),
            "chunk_ms": chunk_ms, "t": {"start": 0, "headers": 8.0, "first_byte": chunk_ms[0],
                                        "first_token": chunk_ms[0], "end": chunk_ms[-1] + 1}}
    return client.post("/v1/probe", content=json.dumps(body),
                       headers={"content-type": "text/plain"})


def test_local_join_flags_a_burst_and_not_a_stream():
    client, store, registry, exporter = harness()
    streamed, burst = "a" * 32, "b" * 32
    store.put(record(streamed))
    store.put(record(burst))
    assert post(client, streamed, [46.0, 77.0, 105.0, 137.0, 166.0]).status_code == 202
    assert post(client, burst, [170.0, 170.2, 170.3, 170.3, 170.4]).status_code == 202
    value = lambda name: registry.get_sample_value(name, {"model": MODEL})  # noqa: E731
    assert value("llm_client_stream_buffered_total") == 1
    assert value("llm_client_stream_held_back_seconds_count") == 2
    verdict = store.get(burst).client["buffering"]
    assert verdict["buffered"] is True and verdict["num_events"] == 5
    assert verdict["held_back_ms"] == pytest.approx(120.0 - 0.4)
    assert store.get(streamed).client["buffering"]["buffered"] is False
    spans = {f"{s.context.trace_id:032x}": s for s in exporter.get_finished_spans()
             if s.name == "client"}
    assert spans[burst].attributes["llm.client.buffered"] is True
    assert spans[streamed].attributes["llm.client.buffered"] is False
