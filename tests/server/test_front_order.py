"""One front assembly (tracer/web/front.py): on every front the receive clock is the first
middleware to run, outside the OpenTelemetry HTTP instrumentation, so TTFT starts at the
same point on the engine and the proxy."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.web.observability import RECEIVE_START_KEY, ReceiveClockGate


def _chain(app) -> list[str]:
    """The pure-ASGI layers from the outside in, down to the FastAPI app."""
    names = []
    while app is not None and type(app).__name__ != "FastAPI":
        names.append(type(app).__name__)
        app = getattr(app, "app", None)
    return names


def test_the_engine_starts_the_receive_clock_outside_the_http_span(live):
    front = live.parts.app
    assert isinstance(front, ReceiveClockGate)
    assert _chain(front)[0] == "ReceiveClockGate"
    # The instrumentation's middleware lives inside FastAPI, so inside the gate.
    assert not any(m.cls is ReceiveClockGate for m in live.parts.fastapi.user_middleware)


@pytest.mark.parametrize("http_spans", [False, True])
def test_the_proxy_has_the_same_order(http_spans):
    settings = dataclasses.replace(ProxySettings("http://127.0.0.1:9"), http_spans=http_spans)
    parts = create_proxy_app(settings, model_names=("m",), registry=CollectorRegistry(),
                             tracer_provider=TracerProvider(), environ={})
    chain = _chain(parts.app)
    assert chain[0] == "ReceiveClockGate" and "ApiKeyGate" in chain
    assert ("HotPathDispatch" in chain) is (not http_spans)


def test_the_clock_is_read_before_anything_else_runs():
    seen = {}

    async def inner(scope, receive, send):
        seen["start"] = scope["state"].get(RECEIVE_START_KEY)

    gate = ReceiveClockGate(inner, clock_ns=lambda: 42)
    asyncio.run(gate({"type": "http", "headers": []}, None, None))
    assert seen["start"] == 42
