"""A product backend that traces itself with the real OpenTelemetry instrumentations and no
ttftscope component in its path (issue 32): FastAPI (the ASGI server span and its send
spans), httpx (the client span of its engine call) and the DB-API instrumentation on sqlite3
(its query), plus manual spans. It exports to the collector over OTLP/HTTP and signs the
probe's Server-Timing with tracer/web/backend_timing.py. Every finished span is also written
as JSON to TTFT_SPAN_DUMP, so the test knows each span's own duration.

Before the engine call it authenticates (`auth`), then runs, concurrently, a retrieval (a
real sqlite query and a `rerank` under `retrieve`) and a shorter moderation check
(`moderation`): the retrieval is the one the engine call waited for.

    TTFT_ENGINE_URL=... TTFT_COLLECTOR_URL=... TTFT_BEACON_KEY=... TTFT_SPAN_DUMP=... \\
        .venv/bin/python -m uvicorn tests.integration.traced_backend_app:app
"""
from __future__ import annotations

import asyncio
import os
import sqlite3

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.dbapi import trace_integration
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from starlette.background import BackgroundTask

from tests.integration.backend_app import page, probe
from tracer.web.backend_timing import ServerTimingMiddleware

ENGINE_URL = os.environ.get("TTFT_ENGINE_URL", "http://127.0.0.1:8000")
# The moderation check is shorter than the retrieval: it is not on the critical path.
MODERATION_S = 0.015

provider = TracerProvider(resource=Resource.create({"service.name": "chat-backend"}))
# Batched, as in production: a span's export never holds the request that ended it.
provider.add_span_processor(BatchSpanProcessor(
    OTLPSpanExporter(endpoint=os.environ["TTFT_COLLECTOR_URL"] + "/v1/traces"),
    schedule_delay_millis=100))
_dump = open(os.environ["TTFT_SPAN_DUMP"], "a", buffering=1)
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
    out=_dump, formatter=lambda span: span.to_json(indent=None) + "\n")))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("chat-backend")
HTTPXClientInstrumentor().instrument(tracer_provider=provider)
trace_integration(sqlite3, "connect", "sqlite", tracer_provider=provider)

db = sqlite3.connect(":memory:", check_same_thread=False)
db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT)")
db.executemany("INSERT INTO docs (body) VALUES (?)", [(f"doc {i} " * 8,) for i in range(20000)])
db.commit()

app = FastAPI()
app.add_middleware(ServerTimingMiddleware, beacon_key=os.environ["TTFT_BEACON_KEY"])
FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
engine = httpx.AsyncClient(base_url=ENGINE_URL, timeout=httpx.Timeout(60.0, connect=5.0))


def _query() -> int:
    cursor = db.cursor()
    cursor.execute("SELECT count(*) FROM docs WHERE body LIKE ?", ("%doc 1999%",))
    return cursor.fetchone()[0]


async def retrieve() -> int:
    with tracer.start_as_current_span("retrieve"):
        # A real query (a full scan with a LIKE) off the loop, then a rerank: together
        # longer than the moderation check running beside them.
        found = await asyncio.to_thread(_query)
        with tracer.start_as_current_span("rerank"):
            await asyncio.sleep(0.03)
        return found


async def moderation() -> None:
    with tracer.start_as_current_span("moderation"):
        await asyncio.sleep(MODERATION_S)


@app.post("/api/v1/chat/completions")
async def chat(request: Request):
    body = await request.body()
    with tracer.start_as_current_span("auth"):
        await asyncio.sleep(0.005)
    await asyncio.gather(retrieve(), moderation())
    upstream = await engine.send(engine.build_request(
        "POST", "/v1/chat/completions", content=body,
        headers={"content-type": "application/json"}), stream=True)
    return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"},
                             background=BackgroundTask(upstream.aclose))


@app.get("/health")
async def health():
    return {"ok": True}


# The page and the probe, served as the untraced backend serves them.
app.add_api_route("/page/{name}", page, methods=["GET"])
app.add_api_route("/probe/probe.global.js", probe, methods=["GET"])
