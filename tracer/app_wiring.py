"""The observability wiring every ttftscope HTTP process shares (engine server and proxy).

One place decides which paths are open and untraced, how CORS exposes the trace headers,
where the `receive` clock starts, and which routers serve beacons, the waterfall UI and
the demo page, so the probe, the UI and the dashboards work the same in front of our
engine and in front of a foreign one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from tracer.openai_http import header_value
from tracer.probe_ingest import make_probe_router
from tracer.stages import SERVER_STAGES
from tracer.ui_api import make_ui_router, static_files_router

# Paths that need no API key and get no HTTP span: health checks, scrapes, browser beacons
# (sendBeacon cannot set an Authorization header), the UI and the demo page.
OPEN_PATHS = ("/health", "/metrics", "/v1/probe", "/ui", "/demo", "/probe")
RECEIVE_START_KEY = "t_receive_start_ns"
# The probe and the demo chat page live in the repository's frontend_probe/ folder.
FRONTEND_DIR = Path(__file__).resolve().parents[1] / "frontend_probe"


@dataclass(slots=True, frozen=True)
class ObservabilitySettings:
    """Probe ingestion limits, CORS allow-list and whether the UI and demo are served.

    >>> ObservabilitySettings(cors_origins=("https://app.example",)).ui
    True
    """

    cors_origins: tuple[str, ...] = ()
    probe_max_bytes: int = 16 * 1024     # one beacon is ~600 bytes
    probe_rate_per_s: float = 20.0       # beacons per second per client address
    probe_burst: int = 40
    ui: bool = True                      # /ui (waterfall), /demo (chat page), /probe/*.js


def include_observability_routes(app: FastAPI, *, store, metrics, span_builder, clock,
                                 settings: ObservabilitySettings,
                                 stages: tuple[str, ...] = SERVER_STAGES,
                                 frontend_dir: Path = FRONTEND_DIR) -> None:
    """`/v1/probe`, and with `settings.ui` the `/ui` waterfall, `/demo` and `/probe/*.js`.

    >>> from tracer.store import TraceStore
    >>> app = FastAPI()
    >>> include_observability_routes(app, store=TraceStore(), metrics=None, span_builder=None,
    ...                              clock=None, settings=ObservabilitySettings())
    """
    app.include_router(make_probe_router(
        store=store, metrics=metrics, span_builder=span_builder,
        cors_origins=settings.cors_origins, max_bytes=settings.probe_max_bytes,
        rate_per_s=settings.probe_rate_per_s, burst=settings.probe_burst))
    if not settings.ui:
        return
    app.include_router(make_ui_router(store=store, clock=clock, stages=stages))
    demo = frontend_dir / "demo"
    app.include_router(static_files_router({
        "/demo": demo / "index.html", "/demo/": demo / "index.html",
        "/demo/demo.js": demo / "demo.js", "/demo/demo.css": demo / "demo.css",
        "/probe/probe.js": frontend_dir / "probe.js",
        "/probe/probe.global.js": frontend_dir / "probe.global.js"}))


def add_cors(app: FastAPI, cors_origins: tuple[str, ...]) -> None:
    """Allow-listed origins may send `traceparent` and read `Server-Timing`/`X-Request-Id`."""
    if cors_origins:
        app.add_middleware(CORSMiddleware, **_cors_options(cors_origins))


def with_cors(asgi_app, cors_origins: tuple[str, ...]):
    """`add_cors` for a bare ASGI app (one that bypasses FastAPI's middleware stack)."""
    return CORSMiddleware(asgi_app, **_cors_options(cors_origins)) if cors_origins else asgi_app


def _cors_options(cors_origins: tuple[str, ...]) -> dict:
    return dict(allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["authorization", "content-type", "traceparent", "tracestate"],
                expose_headers=["Server-Timing", "X-Request-Id"])


def instrument_http_spans(app: FastAPI, tracer_provider) -> None:
    """The HTTP SERVER span of each request (not for the open paths); its per-message ASGI
    send/receive spans would be one span per token, so they are off."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    FastAPIInstrumentor.instrument_app(app, tracer_provider=tracer_provider,
                                       exclude_spans=["send", "receive"],
                                       excluded_urls=",".join(OPEN_PATHS))


class ReceiveClockGate:
    """Pure ASGI middleware, outermost of ours: starts the `receive` clock
    (`scope["state"][RECEIVE_START_KEY]`) and adds `Timing-Allow-Origin` for allowed origins
    (so the probe can read Resource Timing). Pure ASGI keeps streaming and disconnects
    untouched, unlike BaseHTTPMiddleware.

    >>> app = FastAPI(); app.add_middleware(ReceiveClockGate, cors_origins=())
    """

    def __init__(self, app, cors_origins: tuple[str, ...] = (), clock_ns=time.perf_counter_ns) -> None:
        self.app = app
        self.cors_origins = {o.encode() for o in cors_origins}
        self.clock_ns = clock_ns

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})[RECEIVE_START_KEY] = self.clock_ns()
        if not self.cors_origins:
            return await self.app(scope, receive, send)
        origin = header_value(scope, b"origin")
        if origin not in self.cors_origins:
            return await self.app(scope, receive, send)

        async def send_with_timing(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"timing-allow-origin", origin)]
            await send(message)
        await self.app(scope, receive, send_with_timing)
