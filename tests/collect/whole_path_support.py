"""Builders for the collector's whole-path tests: a backend's and an engine's spans as one
OTLP/JSON export per service, and the beacon the probe sends with a backend's token."""
from __future__ import annotations

import json
import time

from tracer.web.probe.token import BeaconSigner

KEY = "whole-path-key"
SIGNER = BeaconSigner(KEY.encode())
BROWSER_SPAN = "b" * 16
MS = 1_000_000
SERVER, CLIENT, INTERNAL = 2, 3, 1
VLLM = {"gen_ai.latency.time_to_first_token": 0.062, "gen_ai.latency.time_in_queue": 0.02,
        "gen_ai.latency.time_in_model_prefill": 0.04, "gen_ai.request.model": "m"}


def span(trace_id, span_id, parent, name, start_ms, end_ms, *, base_ns, kind=INTERNAL,
         service="api", attrs=None) -> dict:
    return {"trace_id": trace_id, "span_id": span_id, "parent": parent, "name": name,
            "start": base_ns + round(start_ms * MS), "end": base_ns + round(end_ms * MS),
            "kind": kind, "service": service, "attrs": attrs or {}}


def backend_trace(trace_id: str, base_ns: int) -> list[dict]:
    """POST /chat [0, 300]: auth [1, 5]; retrieve [5, 40] ⊃ SELECT docs [10, 35];
    moderation [6, 30] beside it; the engine call POST [41, 290] → llm_request from 43."""
    s = lambda *a, **k: span(trace_id, *a, base_ns=base_ns, **k)
    return [s("1" * 16, BROWSER_SPAN, "POST /chat", 0, 300, kind=SERVER),
            s("2" * 16, "1" * 16, "auth", 1, 5),
            s("3" * 16, "1" * 16, "retrieve", 5, 40),
            s("4" * 16, "3" * 16, "SELECT docs", 10, 35),
            s("5" * 16, "1" * 16, "moderation", 6, 30),
            s("6" * 16, "1" * 16, "POST /chat http send", 41, 41.01,
              attrs={"asgi.event.type": "http.response.start"}),
            s("7" * 16, "1" * 16, "POST", 41, 290, kind=CLIENT),
            s("8" * 16, "7" * 16, "llm_request", 43, 280, kind=SERVER, service="vllm",
              attrs=VLLM)]


def export(spans: list[dict]) -> bytes:
    """OTLP/JSON, one resourceSpans per service (ids in hex, as the spec's JSON says)."""
    by_service: dict[str, list] = {}
    for s in spans:
        attrs = [{"key": k, "value": ({"doubleValue": v} if isinstance(v, float) else
                                      {"stringValue": v})} for k, v in s["attrs"].items()]
        by_service.setdefault(s["service"], []).append({
            "traceId": s["trace_id"], "spanId": s["span_id"], "parentSpanId": s["parent"],
            "name": s["name"], "kind": s["kind"], "startTimeUnixNano": str(s["start"]),
            "endTimeUnixNano": str(s["end"]), "attributes": attrs})
    return json.dumps({"resourceSpans": [
        {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": svc}}]},
         "scopeSpans": [{"spans": spans}]} for svc, spans in by_service.items()]}).encode()


def beacon(trace_id: str, *, first_token=70.0 + 250.0, headers=43.0, end=330.0, **extra) -> dict:
    """The browser: fetch at 0, headers at `headers`, first token at `first_token` ms; it
    returns the backend's Server-Timing token."""
    return {"v": 1, "trace_id": trace_id, "outcome": "ok", "chunks": 3,
            "traceparent": f"00-{trace_id}-{BROWSER_SPAN}-01", "token": SIGNER.token(trace_id),
            "t": {"start": 0, "headers": headers, "first_byte": first_token - 1,
                  "first_token": first_token, "end": end}, **extra}


def now_base_ns() -> int:
    return time.time_ns() - 2_000 * MS
