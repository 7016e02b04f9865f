"""FastAPI wiring: routes, auth, CORS, errors in the OpenAI shape, and the tracing stack.

`create_app` takes every global it needs (registry, tracer provider, store, logger) so tests
build a fresh, isolated server each time.
"""
from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from instrumented_engine.async_engine import AsyncEngine
from instrumented_engine.engine import LLMEngine
from instrumented_engine.recorder import NoopRecorder
from instrumented_engine.server.protocol import ProtocolError
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.serving import OpenAIServing
from tracer.app_wiring import (OPEN_PATHS, ObservabilitySettings, ReceiveClockGate, add_cors,
                               include_observability_routes, instrument_http_spans)
from tracer.core import Tracer
from tracer.gpu import GpuCollector
from tracer.metrics import LLMMetrics
from tracer.otel import Clock, SpanBuilder, make_tracer_provider
from tracer.store import TraceStore


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

    def observability(self) -> ObservabilitySettings:
        return ObservabilitySettings(self.cors_origins, self.probe_max_bytes,
                                     self.probe_rate_per_s, self.probe_burst, self.ui)


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
    include_observability_routes(app, store=store, metrics=metrics, span_builder=spans,
                                 clock=clock, settings=settings.observability())
    _install_errors(app)
    add_cors(app, settings.cors_origins)
    app.add_middleware(_ApiKeyGate, api_key=settings.api_key)
    app.add_middleware(ReceiveClockGate, cors_origins=settings.cors_origins)  # outermost
    if settings.tracing:
        instrument_http_spans(app, provider)
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


class _ApiKeyGate:
    """Pure ASGI: 401 in the OpenAI shape unless `Authorization: Bearer <key>` matches (the
    open paths — health, scrapes, beacons, UI — need no key)."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if (self.expected is not None and scope["type"] == "http"
                and scope["method"] != "OPTIONS" and not scope["path"].startswith(OPEN_PATHS)):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                err = ProtocolError(401, "Incorrect or missing API key: send "
                                    "'Authorization: Bearer <key>'.", code="invalid_api_key")
                return await JSONResponse(err.body(), status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)
