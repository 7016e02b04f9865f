"""An engine stand-in that traces the way vLLM does, with the real OpenTelemetry SDK (issue
32's "no ttftscope component in the path"): one `llm_request` span of kind SERVER per
request, started at the request's arrival and ended after the stream, a child of the
incoming `traceparent`, with vLLM's latency attributes in seconds (tracer/engines/vllm.py
cites the source). It reports QUEUE_S and PREFILL_S and waits at least those and OTHER_S
before its first token, so the test knows what the engine part of the waterfall must hold.

    TTFT_COLLECTOR_URL=... .venv/bin/python -m uvicorn tests.integration.vllm_standin_app:app
"""
from __future__ import annotations

import asyncio
import json
import os
import time

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

QUEUE_S = 0.02
PREFILL_S = 0.04
# vLLM's TTFT also holds the front-end → engine-core hand-off: `engine_other`.
OTHER_S = 0.002
MODEL = "standin-model"

provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
if "TTFT_COLLECTOR_URL" in os.environ:   # imported by the test for its constants only
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=os.environ["TTFT_COLLECTOR_URL"] + "/v1/traces"),
        schedule_delay_millis=100))
tracer = provider.get_tracer("vllm.tracing")
app = FastAPI()


def _chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    return ("data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk",
                                   "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                                                "finish_reason": finish}]})
            + "\n\n").encode()


@app.post("/v1/chat/completions")
async def chat(request: Request):
    arrival_ns = time.time_ns()
    parent = TraceContextTextMapPropagator().extract(dict(request.headers))
    await request.body()

    async def stream():
        await asyncio.sleep(OTHER_S + QUEUE_S + PREFILL_S)
        # Measured, as vLLM measures it: on a busy machine the sleep overshoots, and the
        # overshoot is the engine's (`engine_other` on the waterfall).
        ttft_s = (time.time_ns() - arrival_ns) / 1e9
        for word in ("Paris", " is", " the", " capital."):
            yield _chunk(word)
        yield _chunk(None, "stop")
        yield b"data: [DONE]\n\n"
        span = tracer.start_span("llm_request", context=parent, kind=SpanKind.SERVER,
                                 start_time=arrival_ns, attributes={
                                     "gen_ai.request.model": MODEL,
                                     "gen_ai.latency.time_to_first_token": ttft_s,
                                     "gen_ai.latency.time_in_queue": QUEUE_S,
                                     "gen_ai.latency.time_in_model_prefill": PREFILL_S})
        span.end()

    return StreamingResponse(stream(), media_type="text/event-stream")


@app.get("/health")
async def health():
    return {"ok": True}
