"""The probe's headers pass the CORS preflight of every front (tracer/web/cors.py): a page on
another origin sends `traceparent` and the opt-in `X-TTFT-Timing` (issue 11)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tracer.web.cors import add_cors

ORIGIN = "https://chat.example"


def test_preflight_allows_the_probe_headers_for_an_allowed_origin_only():
    app = FastAPI()
    app.post("/v1/chat/completions")(lambda: {})
    add_cors(app, (ORIGIN,))
    with TestClient(app) as client:
        def preflight(origin):
            return client.options("/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,traceparent,x-ttft-timing"})
        ok = preflight(ORIGIN)
        assert ok.status_code == 200
        allowed = {h.strip() for h in ok.headers["access-control-allow-headers"].lower().split(",")}
        assert {"traceparent", "x-ttft-timing"} <= allowed
        assert preflight("https://evil.example").status_code == 400
