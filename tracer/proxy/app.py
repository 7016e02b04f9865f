"""The sidecar proxy: the TTFT waterfall in front of vLLM, SGLang, llama.cpp or any
OpenAI-compatible server.

    python -m tracer proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8100

It relays `/v1/chat/completions`, `/v1/completions`, `/v1/messages` (Anthropic Messages),
`/v1/responses` (the Responses API) (SSE unbuffered, bytes unchanged) and Ollama's
`/api/chat` and `/api/generate` (NDJSON, likewise) and passes every other
path through; it continues the client's W3C trace and forwards its own
span context upstream, so an engine that traces lands in the same trace; it times the five
stages it can see (`tracer.record.stages.PROXY_STAGES`) and publishes them exactly like the engine
server: the same metrics (TTFT here is measured at the proxy), spans, logs, trace store,
`/v1/probe`, `/ui` and `/metrics`, plus the upstream's own metric families re-exported.
It also receives the engine's own OTLP spans (`POST /v1/traces`, and gRPC with
`otlp_grpc_listen`), forwards them unchanged to its own OTLP destination, and joins them
with its records (tracer/proxy/engine_join.py; docs/architecture.md, "Inside the engine").
"""
from __future__ import annotations

import asyncio
import os
import secrets
import ssl
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Gauge
from starlette.routing import Mount, Route

from tracer.proxy.engine_join import EngineJoin, JoinSettings
from tracer.proxy.formats import FORMAT_OF_PATH, OPERATION_OF_PATH
from tracer.proxy.headers import UpstreamAuthorization
from tracer.proxy.openapi import install_proxy_openapi
from tracer.proxy.passthrough import Passthrough
from tracer.proxy.serving import ProxyServing
from tracer.proxy.upstream import Upstream, UpstreamLimits
from tracer.proxy.upstream_metrics import (
    DEFAULT_PREFIXES,
    UpstreamMetricsCollector,
    combine_exposition,
    render_families,
)
from tracer.record.errors import PROXY_ERROR_TYPES
from tracer.record.stages import PROXY_STAGE_LABELS, PROXY_STAGES
from tracer.sinks.engine_timing import EngineTimingMetrics
from tracer.sinks.metrics import LLMMetrics
from tracer.web.front import assemble_front, request_span_kind
from tracer.web.inband import InbandTimer
from tracer.web.loop_lag import start_loop_lag
from tracer.web.observability import Observability, ObservabilitySettings, build_observability
from tracer.web.otlp_forward import OtlpForwarder
from tracer.web.otlp_grpc import DEFAULT_READ_TIMEOUT_S, OtlpGrpcReceiver
from tracer.web.otlp_receiver import TRACES_PATH, OtlpReceiver


@dataclass(slots=True, frozen=True)
class ProxySettings:
    """What the CLI flags configure: the upstream, and the observability settings both
    fronts share.

    >>> ProxySettings("http://127.0.0.1:8000").upstream_metrics_url
    'http://127.0.0.1:8000/metrics'
    """

    upstream_url: str
    limits: UpstreamLimits = UpstreamLimits()
    # PEM CA bundle that verifies an https:// upstream (e.g. a self-signed or private CA),
    # used instead of the system's; verification itself is never turned off.
    upstream_ca_file: str | None = None
    # The upstream's own API key, sent as `Authorization: Bearer` on every forwarded request
    # (tracer/proxy/headers.py, `UpstreamAuthorization`); None: see there.
    upstream_api_key: str | None = field(default=None, repr=False)
    observability: ObservabilitySettings = ObservabilitySettings()
    # Off: our `chat {model}` span is the hop's SERVER span. On (`--http-spans`): FastAPI's
    # HTTP span is, and ours nests in it, at ~0.3 ms more CPU per request and a wrapper
    # around every relayed chunk.
    http_spans: bool = False
    upstream_metrics_path: str | None = "/metrics"
    upstream_metrics_timeout_s: float = 0.5
    upstream_metrics_prefixes: tuple[str, ...] = field(default=DEFAULT_PREFIXES)
    # The OTLP trace receiver (`POST /v1/traces`) engines export their spans to, and the
    # join that waits for them (docs/architecture.md, "Inside the engine").
    otlp_receiver: bool = True
    # Bearer token the receiver requires, a secret of the engines' own, never the clients'
    # API key (`otlp_receiver_token`); None: none, unless an API key is set (then closed).
    otlp_receiver_token: str | None = field(default=None, repr=False)
    otlp_receiver_max_bytes: int = 4 << 20
    # HOST:PORT of the OTLP/gRPC receiver (TGI's only export; vLLM's and SGLang's default);
    # None: HTTP only.
    otlp_grpc_listen: str | None = None
    # How long a gRPC Export call may take to send its request message.
    otlp_grpc_read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    join: JoinSettings = field(default_factory=JoinSettings)

    @property
    def upstream_metrics_url(self) -> str | None:
        if not self.upstream_metrics_path:
            return None
        return self.upstream_url.rstrip("/") + self.upstream_metrics_path


@dataclass(slots=True)
class ProxyParts:
    """The live pieces, exposed for tests and the CLI.

    >>> parts = create_proxy_app(ProxySettings("http://127.0.0.1:8000"))
    >>> parts.obs.tracer.source, parts.obs.tracer.stages[-1]
    ('proxy', 'send')
    """

    app: object   # the ASGI app to serve: FastAPI behind the hot-path dispatch
    obs: Observability
    upstream: Upstream
    upstream_metrics: UpstreamMetricsCollector | None
    join: EngineJoin | None = None
    otlp_receiver: OtlpReceiver | None = None
    otlp_grpc: OtlpGrpcReceiver | None = None


def upstream_tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context for an https:// upstream: the system's CAs, or only `ca_file`'s.
    Certificates and host names are always verified.

    >>> upstream_tls_context(None).verify_mode == ssl.CERT_REQUIRED
    True
    """
    return ssl.create_default_context(cafile=ca_file)


def otlp_receiver_token(token: str | None, api_key: str | None) -> str | None:
    """The bearer token `POST /v1/traces` and gRPC `Export` require; ValueError when it is
    the clients' API key. Every client holds that key, so it proves nothing about a span:
    with `api_key` and no `token`, the receiver is closed (a random token nobody holds,
    every export 401 / UNAUTHENTICATED, counted `unauthorized`) rather than open to the
    clients the key was set against. docs/receiver-threat-model.md, "Who may send spans".

    >>> otlp_receiver_token("t", "k"), otlp_receiver_token(None, None)
    ('t', None)
    >>> len(otlp_receiver_token(None, "k")) > 30
    True
    """
    if token and api_key and secrets.compare_digest(token.encode(), api_key.encode()):
        raise ValueError("--otlp-receiver-token must not be the --api-key: every client "
                         "holds that key, so it would let clients post spans")
    if token:
        return token
    return secrets.token_urlsafe(32) if api_key else None


def create_proxy_app(settings: ProxySettings, *, model_names: tuple[str, ...] = (),
                     registry: CollectorRegistry | None = None, tracer_provider=None,
                     logger=None, upstream: Upstream | None = None,
                     environ=os.environ) -> ProxyParts:
    """A fresh proxy app; every global (registry, provider, logger), the upstream pool and
    the environment (the OTLP destination the receiver forwards to) injectable.

    `model_names` are the upstream's served models: the only values the model label and
    the span name may take (anything else is `other`).
    """
    obs_settings = settings.observability
    # The stage labels cover the engine's stages too (a joined record carries them); a record
    # without its engine's signal is attributed over the proxy's five.
    obs = build_observability(
        obs_settings, model_names=model_names, stages=PROXY_STAGE_LABELS, source="proxy",
        error_types=PROXY_ERROR_TYPES, registry=registry, tracer_provider=tracer_provider,
        logger=logger, service_name="ttftscope-proxy",
        span_kind=request_span_kind(settings.http_spans))
    obs.tracer.stages = PROXY_STAGES
    join = receiver = forwarder = grpc_receiver = None
    if obs_settings.tracing:
        join = EngineJoin(obs.tracer, EngineTimingMetrics(obs.registry), settings.join,
                          receiving=settings.otlp_receiver, store=obs.store)
    if settings.otlp_receiver:
        forwarder = OtlpForwarder.from_environ(environ, obs.registry)
        receiver = OtlpReceiver(
            obs.registry, on_timings=join.on_timings if join is not None else None,
            forwarder=forwarder,
            token=otlp_receiver_token(settings.otlp_receiver_token, obs_settings.api_key),
            max_body_bytes=settings.otlp_receiver_max_bytes)
        if settings.otlp_grpc_listen:
            grpc_receiver = OtlpGrpcReceiver(receiver, settings.otlp_grpc_listen,
                                             read_timeout_s=settings.otlp_grpc_read_timeout_s)
    https = settings.upstream_url.lower().startswith("https:")
    tls = upstream_tls_context(settings.upstream_ca_file) if https else None
    upstream = upstream or Upstream(settings.upstream_url, settings.limits, ssl_context=tls)
    collector = None
    if settings.upstream_metrics_url:
        collector = UpstreamMetricsCollector(settings.upstream_metrics_url,
                                             timeout_s=settings.upstream_metrics_timeout_s,
                                             prefixes=settings.upstream_metrics_prefixes,
                                             verify=tls or True)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        loop_lag = start_loop_lag(obs.metrics)
        if grpc_receiver is not None:
            grpc_receiver.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            loop_lag.cancel()
            if grpc_receiver is not None:
                grpc_receiver.stop()
            if join is not None:
                join.close()   # parked records are published (as timeouts) before the drain
            if forwarder is not None:
                await forwarder.aclose()
            await upstream.aclose()
            if collector is not None:
                collector.close()
            obs.close()   # the last records' metrics, spans and log lines, then the export

    # /openapi.json is the proxy's own (tracer/proxy/openapi.py); the /docs pages are not served.
    app = FastAPI(title="ttftscope proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    _install_own_routes(app, obs.metrics, collector, obs.registry, settings)
    obs.include_routes(app)
    serving = ProxyServing(upstream, obs.tracer, max_body_bytes=obs_settings.max_body_bytes,
                           inband=InbandTimer.of(obs), join=join)
    endpoints = {"/v1/chat/completions": CompletionEndpoint(serving, "chat"),
                 "/v1/completions": CompletionEndpoint(serving, "text_completion"),
                 **{path: CompletionEndpoint(serving, OPERATION_OF_PATH.get(path, "chat"), fmt)
                    for path, fmt in FORMAT_OF_PATH.items()}}
    _install_proxy_routes(app, endpoints, serving, obs_settings.api_key)
    install_proxy_openapi(app, {"/v1/chat/completions": "Chat completion, relayed and traced",
                                "/v1/completions": "Text completion, relayed and traced",
                                "/v1/messages": "Anthropic Messages, relayed and traced",
                                "/v1/responses": "Responses API, relayed and traced",
                                "/api/chat": "Ollama chat (NDJSON), relayed and traced",
                                "/api/generate": "Ollama generate (NDJSON), relayed and traced"})
    front = assemble_front(
        app, obs_settings, tracer_provider=obs.tracer_provider, http_spans=settings.http_spans,
        hot_paths=endpoints,
        # Inside the gate: the key is checked on the client's header before it is dropped.
        inside_key=lambda inner: UpstreamAuthorization(
            inner, proxy_api_key=obs_settings.api_key, upstream_api_key=settings.upstream_api_key),
        # Outside the API key gate: the receiver checks its own bearer token.
        outside_key={TRACES_PATH: receiver} if receiver is not None else None)
    return ProxyParts(front, obs, upstream, collector, join, receiver, grpc_receiver)



def _install_own_routes(app: FastAPI, metrics: LLMMetrics,
                        collector: UpstreamMetricsCollector | None,
                        registry: CollectorRegistry, settings: ProxySettings) -> None:
    upstream_up = Gauge("llm_upstream_metrics_up", "1 when the last scrape of the upstream's "
                        "/metrics succeeded (0: absent, slow or unparsable)", registry=registry)

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok", "upstream": settings.upstream_url})

    @app.get("/metrics")
    def metrics_endpoint(request: Request):
        # A plain `def`: runs in the threadpool, so the upstream fetch (bounded by its short
        # timeout) never blocks the event loop that relays streams.
        families = list(collector.collect()) if collector is not None else []
        upstream_up.set(1 if collector is not None and collector.last_ok else 0)
        own, content_type = metrics.exposition(request.headers.get("accept"))
        openmetrics = content_type.startswith("application/openmetrics-text")
        upstream = render_families(families, openmetrics=openmetrics)
        return Response(combine_exposition(own, upstream, openmetrics=openmetrics),
                        media_type=content_type)


def _install_proxy_routes(app: FastAPI, endpoints: dict, serving: ProxyServing,
                          api_key: str | None) -> None:
    """The relayed paths, as raw ASGI endpoints: no Request, Response or dependency
    machinery per request or per chunk."""
    # First: matched before the observability routes.
    app.router.routes[:0] = [Route(path, endpoint, methods=["POST"])
                             for path, endpoint in endpoints.items()]
    # Last: everything the proxy does not serve itself goes to the upstream (/v1/models, …).
    # Never for our own paths or a preflight, and always behind the key (passthrough.py).
    app.router.routes.append(Mount("", app=Passthrough(app.router.routes, serving.passthrough,
                                                       api_key)))


class CompletionEndpoint:
    """The ASGI app of one completions path (Starlette calls an endpoint that is not a
    plain function as an ASGI app); `fmt`: its answer's stream format, None for OpenAI's.

    >>> CompletionEndpoint(serving=None, operation="chat", fmt="anthropic").fmt
    'anthropic'
    """

    def __init__(self, serving: ProxyServing, operation: str, fmt: str | None = None) -> None:
        self.serving = serving
        self.operation = operation
        self.fmt = fmt

    async def __call__(self, scope, receive, send) -> None:
        await self.serving.completion(scope, receive, send, operation=self.operation,
                                      fmt=self.fmt)
