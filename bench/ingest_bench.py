"""Probe-beacon ingestion: throughput on one core, and the store's memory under 100k beacons.

    .venv/bin/python bench/ingest_bench.py [--num-beacons 20000] [--memory-beacons 100000]
                                           [--uvicorn-beacons 2000]

1. In-process: beacons go straight into the ASGI app (FastAPI + the `/v1/probe` router, a real
   TraceStore, LLMMetrics, client spans built and handed to a span processor that drops
   them), no network. Figures for joined (accepted), unmatched and rejected (422) beacons.
2. Through uvicorn on loopback, with an httpx keep-alive client in the same process (so the
   client's cost is in the figure too).
3. Memory: 100,000 server records and 100,000 joined beacons through a store of the default
   capacity (10,000): tracemalloc's view of the live heap stays flat once the ring is full.
The process is pinned to one CPU when the OS allows it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from tracer.sinks.metrics import LLMMetrics  # noqa: E402
from tracer.record.clock import Clock
from tracer.sinks.spans import SpanBuilder  # noqa: E402
from tracer.web.probe.endpoint import make_probe_router  # noqa: E402
from tracer.record.request_record import RequestRecord, StageSpan  # noqa: E402
from tracer.record.stages import SERVER_STAGES  # noqa: E402
from tracer.sinks.store import TraceStore  # noqa: E402

MODEL = "smollm2"
MS = 1_000_000


class _DropProcessor(SpanProcessor):
    """Receives every span (so they are fully built) and keeps none."""

    def on_end(self, span) -> None:
        pass


def make_app(store: TraceStore) -> FastAPI:
    provider = TracerProvider()
    provider.add_span_processor(_DropProcessor())
    app = FastAPI()
    app.include_router(make_probe_router(
        store=store, metrics=LLMMetrics(CollectorRegistry(), model_names=[MODEL]),
        span_builder=SpanBuilder(provider, Clock()), rate_per_s=1e12, burst=10**9))
    return app


def record(i: int) -> RequestRecord:
    start_ns, stages = i * 1_000 * MS, []
    t_ns = start_ns
    for stage in SERVER_STAGES:
        stages.append(StageSpan(stage, t_ns, t_ns + 2 * MS))
        t_ns += 2 * MS
    return RequestRecord(f"chatcmpl-{i}", f"{i + 1:032x}", f"{i + 1:016x}", MODEL, "chat",
                         start_ns, t_ns + 100 * MS, stages=tuple(stages), ttft_ns=t_ns - start_ns,
                         events=(("response_start", start_ns + 3 * MS, {}),))


def beacon(i: int, *, valid: bool = True) -> bytes:
    trace_id = f"{i + 1:032x}"
    return json.dumps({
        "v": 1, "trace_id": trace_id, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
        "url_path": "/v1/chat/completions", "status": 200, "outcome": "ok" if valid else "??",
        "t": {"start": 0, "headers": 23.0, "first_byte": 23.5, "first_token": 40.0,
              "first_paint": 48.0, "end": 900.0},
        "chunks": 64, "itl_ms": {"count": 63, "mean": 13.0, "p50": 12.5, "p95": 20.0, "max": 31.0},
        "resource": {"dns_ms": 0, "connect_ms": 0, "tls_ms": 0, "request_ms": 22.0,
                     "response_ms": 877.0},
        "probe_errors": 0, "sdk": "ttftscope-probe/0.1.0"}).encode()


async def post_asgi(app, body: bytes) -> int:
    """One POST /v1/probe straight through the ASGI callable; returns the status."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/probe",
             "raw_path": b"/v1/probe", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"text/plain;charset=UTF-8"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("198.51.100.4", 40000), "server": ("127.0.0.1", 8000)}
    status = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
    await app(scope, receive, send)
    return status[0]


async def in_process(num_beacons: int) -> dict:
    figures = {}
    for label, valid, joined in (("accepted", True, True), ("unmatched", True, False),
                                 ("rejected_schema", False, True)):
        store = TraceStore(capacity=num_beacons)
        if joined:
            for i in range(num_beacons):
                store.put(record(i))
        app = make_app(store)
        bodies = [beacon(i if joined else i + num_beacons, valid=valid) for i in range(num_beacons)]
        expected = 422 if not valid else 202
        t0 = time.perf_counter()
        for body in bodies:
            status = await post_asgi(app, body)
            assert status == expected, status
        elapsed_s = time.perf_counter() - t0
        if label == "accepted":
            assert all(r.client is not None for r in store.recent(num_beacons))
        figures[label] = num_beacons / elapsed_s
    return figures


def through_uvicorn(num_beacons: int) -> float:
    store = TraceStore(capacity=num_beacons)
    for i in range(num_beacons):
        store.put(record(i))
    config = uvicorn.Config(make_app(store), host="127.0.0.1", port=0, log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    bodies = [beacon(i) for i in range(num_beacons)]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        t0 = time.perf_counter()
        for body in bodies:
            r = client.post("/v1/probe", content=body, headers={"content-type": "text/plain"})
            assert r.status_code == 202, r.text
        elapsed_s = time.perf_counter() - t0
    server.should_exit = True
    thread.join(timeout=10)
    assert sum(r.client is not None for r in store.recent(num_beacons)) == num_beacons
    return num_beacons / elapsed_s


async def memory(num_beacons: int, capacity: int = 10_000) -> list[tuple[int, float, int]]:
    """(beacons sent, MiB traced, records held) at checkpoints: flat once the ring is full."""
    store = TraceStore(capacity=capacity)
    app = make_app(store)
    checkpoints = {capacity, num_beacons // 2, num_beacons}
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    out = []
    for i in range(num_beacons):
        store.put(record(i))
        assert await post_asgi(app, beacon(i)) == 202
        if i + 1 in checkpoints:
            out.append((i + 1, (tracemalloc.get_traced_memory()[0] - base) / 2**20, len(store)))
    tracemalloc.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-beacons", type=int, default=20_000)
    parser.add_argument("--uvicorn-beacons", type=int, default=2_000)
    parser.add_argument("--memory-beacons", type=int, default=100_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    print(f"probe ingestion, one core, {args.num_beacons} beacons in-process (ASGI, no network):")
    for label, rate in asyncio.run(in_process(args.num_beacons)).items():
        print(f"  {label:<16} {rate:>9,.0f} beacons/s")
    rate = through_uvicorn(args.uvicorn_beacons)
    print(f"through uvicorn on loopback (httpx client in the same process), "
          f"{args.uvicorn_beacons} beacons:\n  {'accepted':<16} {rate:>9,.0f} beacons/s")
    print(f"store memory, {args.memory_beacons} records + joined beacons, ring capacity 10,000:")
    for sent, mib, held in asyncio.run(memory(args.memory_beacons)):
        print(f"  after {sent:>7,} beacons: {mib:7.1f} MiB traced, {held:,} records held")


if __name__ == "__main__":
    main()
