"""FastAPI wiring: routes, auth, CORS, errors in the OpenAI shape, and the tracing stack.

`create_app` takes every global it needs (registry, tracer provider, logger) so tests build
a fresh, isolated server each time; the observability pieces come from the one composition
root, `tracer.web.observability.build_observability`, shared with the proxy.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.request_stream import MAX_PENDING_OUTPUTS
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.recorder import NoopRecorder
from instrumented_engine.server.openapi import install_openapi
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.serving import OpenAIServing
from tracer.sinks.engine_steps import EngineStepMetrics
from tracer.sinks.gpu import GpuCollector
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.model_startup import ModelStartupCollector
from tracer.web.front import assemble_front, request_span_kind
from tracer.web.inband import InbandTimer
from tracer.web.loop_lag import start_loop_lag
from tracer.web.observability import Observability, ObservabilitySettings, build_observability
from tracer.web.openai_http import CLIENT_CLOSED_REQUEST, OpenAIError


@dataclass(slots=True, frozen=True)
class ServerSettings:
    """What the CLI flags configure: the observability settings both fronts share (the API
    key among them: `observability.api_key`), and whether the engine warms up before
    /health says ready (the CLI does; off here so test servers start at once), and how many
    outputs a stream may hold unread before it is aborted as a slow reader."""

    observability: ObservabilitySettings = ObservabilitySettings()
    warm_up: bool = False
    max_pending_outputs: int = MAX_PENDING_OUTPUTS
    # Off: our `chat {model}` span is the request's SERVER span, as in the proxy and as
    # vLLM's `llm_request`. On (`--http-spans`): the FastAPI instrumentation's HTTP span is,
    # ours nests in it; it cost the engine ~0.2 ms of event-loop CPU and ~3 % of its
    # one-token requests/s (docs/figures.md, "The engine's HTTP span").
    http_spans: bool = False


@dataclass(slots=True)
class ServerParts:
    """The live pieces, exposed for tests and the CLI."""

    app: object          # the ASGI app to serve: FastAPI inside the shared middleware
    aengine: AsyncEngine
    obs: Observability
    fastapi: FastAPI     # the routes (tests read its OpenAPI document and middleware)


def create_app(engine: LLMEngine, settings: ServerSettings = ServerSettings(), *,
               registry: CollectorRegistry | None = None, tracer_provider=None,
               logger=None) -> ServerParts:
    model = engine.model_name
    obs_settings = settings.observability
    obs = build_observability(obs_settings, model_names=(model,), source="engine",
                              registry=registry, tracer_provider=tracer_provider,
                              logger=logger, service_name="ttftscope-engine",
                              span_kind=request_span_kind(settings.http_spans))
    GpuCollector(registry=obs.registry)
    ModelStartupCollector(obs.registry, model, lambda: (engine.model_load_s, engine.warmup_s))
    # The step record, read through the engine (its warm-up swaps in an empty one).
    obs.neighbourhood.attach_steps(lambda a, b: engine.steps.between(a, b),
                                   engine.config.step_log_size)
    recorder = TimelineRecorder(on_step=EngineStepMetrics(obs.registry, model).observe)
    # Tracing off (the A/B baseline): the engine's recorder calls cost one no-op method call.
    engine.recorder = recorder if obs_settings.tracing else NoopRecorder()
    aengine = AsyncEngine(engine, warm_up=settings.warm_up,
                          max_pending_outputs=settings.max_pending_outputs)
    serving = OpenAIServing(aengine, obs.tracer, recorder,
                            max_body_bytes=obs_settings.max_body_bytes,
                            inband=InbandTimer.of(obs))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        aengine.start()
        loop_lag = start_loop_lag(obs.metrics)
        try:
            yield
        finally:
            loop_lag.cancel()
            aengine.stop()
            obs.close()   # the last records' metrics, spans and log lines, then the export

    # /openapi.json is published (clients and fuzzers read it); the /docs pages are not.
    app = FastAPI(title="ttftscope instrumented engine", lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    _install_routes(app, serving, obs.metrics, aengine)
    install_openapi(app)
    obs.include_routes(app)
    _install_errors(app)
    front = assemble_front(app, obs_settings, tracer_provider=obs.tracer_provider,
                           http_spans=settings.http_spans)
    return ServerParts(front, aengine, obs, app)


def _install_routes(app: FastAPI, serving: OpenAIServing, metrics: LLMMetrics,
                    aengine: AsyncEngine) -> None:
    model = serving.model_name
    # The formats chosen for this machine (instrumented_engine/model/cpu_formats.py), so a
    # figure measured against this server can be tied to its path; /ui shows them.
    runtime = aengine.engine.loaded.describe()

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
                                            "max_model_len": aengine.engine.max_model_len,
                                            "engine": runtime}]}

    @app.get("/health")
    async def health():
        # Ready = the step loop runs and the warm-up is over (docs/reference.md, "Engine
        # readiness"); a load balancer sends nothing before.
        if aengine.warming_up:
            return JSONResponse({"status": "warming_up"}, status_code=503,
                                headers={"Retry-After": "1"})
        alive = aengine.is_alive
        return JSONResponse({"status": "ok" if alive else "engine_down"},
                            status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        metrics.set_engine_state(model, *aengine.stats())
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_request: Request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        # Its headers too: a 405 carries the `Allow` RFC 9110 §15.5.6 requires.
        return OpenAIError(exc.status_code, str(exc.detail), type_=type_).response(exc.headers)

    # The client left while sending its body: nobody reads the answer, and it is no error of
    # ours to log.
    @app.exception_handler(ClientDisconnect)
    async def client_gone(_request: Request, _exc: ClientDisconnect):
        return OpenAIError(CLIENT_CLOSED_REQUEST, "The client closed the request.",
                           code="client_closed_request").response()

    # Anything else is our bug: the OpenAI shape, no internals (Starlette logs the traceback).
    @app.exception_handler(Exception)
    async def internal_error(_request: Request, _exc: Exception):
        return OpenAIError(500, "Internal server error.", code="internal_error",
                           type_="server_error").response()
