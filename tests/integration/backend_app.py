"""A small product web backend between the browser and the engine (issue 11's topology).

It serves the page and the probe, and forwards `POST /api/v1/chat/completions` to the
engine with httpx, passing on the two headers the probe adds (`traceparent`, and the opt-in
`X-TTFT-Timing` for the in-band timing line) and streaming the body back unchanged: these
are the few lines docs/backends.md, "Behind your web backend" shows. `POST /api/chat` is
docs/backends.md's other backend, one that re-streams in a format of its own (`{"text": ...}` events)
and hands the engine's timing token on itself.

    TTFT_ENGINE_URL=http://127.0.0.1:8000 .venv/bin/python -m uvicorn \
        tests.integration.backend_app:app --host 127.0.0.1 --port 8080
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.background import BackgroundTask

REPO = Path(__file__).resolve().parents[2]
PAGES = Path(__file__).with_name("pages")
OPENAI_SDK = REPO / "frontend_probe" / "node_modules" / "openai"
ENGINE_URL = os.environ.get("TTFT_ENGINE_URL", "http://127.0.0.1:8000")
# What the engine needs from the browser's request, and what the browser needs back.
FORWARD_REQUEST = ("content-type", "authorization", "traceparent", "tracestate", "x-ttft-timing")
FORWARD_RESPONSE = ("content-type", "server-timing", "x-request-id")
JS = "text/javascript; charset=utf-8"

app = FastAPI()
engine = httpx.AsyncClient(base_url=ENGINE_URL, timeout=httpx.Timeout(120.0, connect=5.0))


@app.post("/api/v1/chat/completions")
async def chat(request: Request):
    headers = {k: v for k in FORWARD_REQUEST if (v := request.headers.get(k)) is not None}
    upstream = await engine.send(
        engine.build_request("POST", "/v1/chat/completions", content=await request.body(),
                             headers=headers), stream=True)
    out = {k: v for k in FORWARD_RESPONSE if (v := upstream.headers.get(k)) is not None}
    # No buffering by a proxy in front of us (nginx honours it); bytes go out as they come.
    out["X-Accel-Buffering"] = "no"
    out["Cache-Control"] = "no-cache"
    return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                             headers=out, background=BackgroundTask(upstream.aclose))


FORWARD = ("traceparent", "tracestate", "x-ttft-timing")


@app.post("/api/chat")
async def chat_rewritten(request: Request):
    headers = {k: v for k in FORWARD if (v := request.headers.get(k)) is not None}
    upstream = await engine.send(engine.build_request(
        "POST", "/v1/chat/completions", json={**await request.json(), "stream": True},
        headers=headers), stream=True)

    async def events():
        token = None
        async for line in upstream.aiter_lines():
            if line.startswith(": ttft-timing "):      # the engine's signed timing
                token = line.removeprefix(": ttft-timing ")
            elif line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if text := (choices[0].get("delta") or {}).get("content"):
                    yield f"data: {json.dumps({'text': text})}\n\n"   # your own events
        if token:
            yield f": ttft-timing {token}\n\n"         # before [DONE], as the engine does
        yield "data: [DONE]\n\n"

    out = {"X-Accel-Buffering": "no"}
    if st := upstream.headers.get("server-timing"):
        out["Server-Timing"] = st
    return StreamingResponse(events(), media_type="text/event-stream", headers=out,
                             background=BackgroundTask(upstream.aclose))


@app.get("/health")
async def health():
    return {"ok": True}


@app.get("/page/{name}")
async def page(name: str):
    return _file(PAGES, name)


@app.get("/probe/probe.global.js")
async def probe():
    return FileResponse(REPO / "frontend_probe" / "probe.global.min.js", media_type=JS)


@app.get("/vendor/openai/{path:path}")
async def openai_sdk(path: str):
    return _file(OPENAI_SDK, path)


def _file(root: Path, rel: str) -> FileResponse:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        raise HTTPException(404)
    media = JS if path.suffix in (".js", ".mjs") else "text/html; charset=utf-8"
    return FileResponse(path, media_type=media)
