"""FastAPI wiring: routes, auth, CORS, errors in the OpenAI shape, and the tracing stack.

`create_app` takes every global it needs (registry, tracer provider, store, logger) so tests
build a fresh, isolated server each time.
"""
from __future__ import annotations

import hmac
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from instrumented_engine.async_engine import AsyncEngine
from instrumented_engine.engine import LLMEngine
from instrumented_engine.recorder import NoopRecorder
from instrumented_engine.server.protocol import ProtocolError
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.serving import OpenAIServing
from tracer.core import Tracer
from tracer.gpu import GpuCollector
from tracer.metrics import LLMMetrics
from tracer.otel import Clock, SpanBuilder, make_tracer_provider
from tracer.probe_ingest import make_probe_router
from tracer.store import TraceStore
from tracer.ui_api import make_ui_router, static_files_router

# Paths that need no API key: health checks, scrapes, and browser beacons (sendBeacon
# cannot set an Authorization header).
_OPEN_PATHS = ("/health", "/metrics", "/v1/probe", "/ui", "/demo", "/probe")
# The probe and the demo chat page live in the repository's frontend_probe/ folder.
_FRONTEND_DIR = Path(__file__).resolve().parents[2] / "frontend_probe"


@dataclass(slots=True, frozen=True)
class ServerSettings:
    """What the CLI flags configure."""

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    tracing: bool = True
    trace_store_capacity: int = 10_000
    probe_max_bytes: int = 16 * 1024     # one beacon is ~600 bytes
    probe_rate_per_s: float = 20.0       # beacons per second per client address
    probe_burst: int = 40
    ui: bool = True                      # /ui (waterfall), /demo (chat page), /probe/*.js


@dataclass(slots=True)
class ServerParts:
    """The live pieces, exposed for tests and the CLI."""

    app: FastAPI
    aengine: AsyncEngine
    tracer: Tracer
    metrics: LLMMetrics
    store: TraceStore
    registry: CollectorRegistry


def create_app(engine: LLMEngine, settings: ServerSettings = ServerSettings(), *,
               registry: CollectorRegistry | None = None, tracer_provider=None,
               logger=None) -> ServerParts:
    registry = registry if registry is not None else CollectorRegistry()
    model = engine.model_name
    metrics = LLMMetrics(registry, model_names=(model,))
    GpuCollector(registry=registry)
    store = TraceStore(settings.trace_store_capacity)
    clock = Clock()   # one perf→epoch anchor for spans and the UI's times
    recorder = TimelineRecorder()
    provider, spans = None, None
    if settings.tracing:
        provider = tracer_provider or make_tracer_provider("ttftscope-engine")
        spans = SpanBuilder(provider, clock)
    # Tracing off (the A/B baseline): the engine's recorder calls cost one no-op method call.
    engine.recorder = recorder if settings.tracing else NoopRecorder()
    tracer = Tracer(model_names=(model,), metrics=metrics, span_builder=spans, store=store,
                    logger=logger, enabled=settings.tracing)
    aengine = AsyncEngine(engine)
    serving = OpenAIServing(aengine, tracer, recorder, max_body_bytes=settings.max_body_bytes)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        aengine.start()
        try:
            yield
        finally:
            aengine.stop()

    app = FastAPI(title="ttftscope instrumented engine", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    _install_routes(app, serving, metrics, aengine)
    app.include_router(make_probe_router(
        store=store, metrics=metrics, span_builder=spans, cors_origins=settings.cors_origins,
        max_bytes=settings.probe_max_bytes, rate_per_s=settings.probe_rate_per_s,
        burst=settings.probe_burst))
    if settings.ui:
        app.include_router(make_ui_router(store=store, clock=clock))
        app.include_router(static_files_router({
            "/demo": _FRONTEND_DIR / "demo" / "index.html",
            "/demo/": _FRONTEND_DIR / "demo" / "index.html",
            "/demo/demo.js": _FRONTEND_DIR / "demo" / "demo.js",
            "/demo/demo.css": _FRONTEND_DIR / "demo" / "demo.css",
            "/probe/probe.js": _FRONTEND_DIR / "probe.js",
            "/probe/probe.global.js": _FRONTEND_DIR / "probe.global.js"}))
    _install_errors(app)
    _install_middleware(app, settings)
    if settings.tracing:
        # The HTTP span; its per-message ASGI send/receive spans would be one span per token.
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider,
                                           exclude_spans=["send", "receive"],
                                           excluded_urls="/metrics,/health,/v1/probe,/ui,/demo,/probe")
    return ServerParts(app, aengine, tracer, metrics, store, registry)


def _install_routes(app: FastAPI, serving: OpenAIServing, metrics: LLMMetrics,
                    aengine: AsyncEngine) -> None:
    model = serving.model_name

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serving.handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serving.handle(request, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                            "owned_by": "ttftscope",
                                            "max_model_len": aengine.engine.max_model_len}]}

    @app.get("/health")
    async def health():
        alive = aengine.is_alive
        return JSONResponse({"status": "ok" if alive else "engine_down"},
                            status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        metrics.set_engine_state(model, *aengine.stats())
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ProtocolError)
    async def protocol_error(_request: Request, exc: ProtocolError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        err = ProtocolError(exc.status_code, str(exc.detail),
                            type_="invalid_request_error" if exc.status_code < 500 else "server_error")
        return JSONResponse(err.body(), status_code=exc.status_code)


def _install_middleware(app: FastAPI, settings: ServerSettings) -> None:
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["authorization", "content-type", "traceparent",
                                          "tracestate"],
                           expose_headers=["Server-Timing", "X-Request-Id"])
    # Pure ASGI (not BaseHTTPMiddleware): streaming and disconnects pass through untouched.
    app.add_middleware(_Gate, api_key=settings.api_key, cors_origins=settings.cors_origins)


class _Gate:
    """Outermost of ours: starts the `receive` clock, checks the API key, and adds
    Timing-Allow-Origin for allowed origins (so the probe can read Resource Timing)."""

    def __init__(self, app, api_key: str | None, cors_origins: tuple[str, ...]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.cors_origins = {o.encode() for o in cors_origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})["t_receive_start_ns"] = time.perf_counter_ns()
        headers = dict(scope["headers"])
        if self._needs_key(scope) and not hmac.compare_digest(
                headers.get(b"authorization", b""), self.expected):
            err = ProtocolError(401, "Incorrect or missing API key: send "
                                "'Authorization: Bearer <key>'.", code="invalid_api_key")
            return await JSONResponse(err.body(), status_code=401)(scope, receive, send)
        origin = headers.get(b"origin")
        if origin not in self.cors_origins:
            return await self.app(scope, receive, send)

        async def send_with_timing(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"timing-allow-origin", origin)]
            await send(message)
        await self.app(scope, receive, send_with_timing)

    def _needs_key(self, scope) -> bool:
        return (self.expected is not None and scope["method"] != "OPTIONS"
                and not scope["path"].startswith(_OPEN_PATHS))
