"""The standalone collector: browser beacons in, client metrics and spans out, no model and
no upstream (`python -m tracer collect --listen HOST:PORT`).

In production the process that receives a beacon is rarely the one that served its request:
there are replicas behind a load balancer, a web backend in between, or beacons are sent to a
separate host altogether. Each beacon then carries the answering server's signed in-band
timing (tracer/web/inband.py), and the collector needs nothing else: it checks the signature
with the shared `--beacon-key`, aligns the browser on that server's clock, and exports client
TTFT, network + gateway time, render delay, the buffering verdict (metrics on `/metrics`) and
the client spans over OTLP, in the server's trace and under its span, so Tempo joins them.

It serves `/v1/probe` (the same endpoint, limits, CORS allow-list and outcomes as the
engine's and the proxy's), `/metrics` and `/health`, and the same OTLP/HTTP trace receiver
as the proxy (`POST /v1/traces`, tracer/web/otlp_receiver.py) as a tee only: an engine can
export to the collector, and every span goes on unchanged to the collector's own OTLP
destination (no proxy records here to join them with). Its span export and its beacon
endpoint come from the builders `tracer.web.observability.build_observability` uses
(`build_spans`, `build_probe`); what only a server has (the Tracer, the stages, /ui, the
receive clock and the key gate of `tracer/web/front.py`) it leaves out: its trace store stays
empty, so every beacon is joined from its payload.
docs/reference.md, "The standalone collector".
"""
from __future__ import annotations

import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from tracer.record.clock import Clock
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.store import TraceStore
from tracer.web.cors import add_cors
from tracer.web.observability import (
    ObservabilitySettings,
    add_forwarded_client,
    build_probe,
    build_spans,
)
from tracer.web.openapi_common import install_document
from tracer.web.otlp_forward import OtlpForwarder
from tracer.web.otlp_receiver import TRACES_PATH, OtlpReceiver
from tracer.web.probe.endpoint import ProbeEndpoint, probe_router
from tracer.web.probe.token import BeaconSigner
from tracer.web.routes import serve_head


@dataclass(slots=True, frozen=True)
class CollectorSettings:
    """What `python -m tracer collect` configures: the shared observability settings (the
    beacon key, CORS, beacon limits, forwarded addresses) and the model label vocabulary.

    >>> CollectorSettings().observability.probe_rate_per_s
    20.0
    """

    observability: ObservabilitySettings = ObservabilitySettings()
    # The model labels the servers report (closed vocabulary; anything else is `other`).
    model_names: tuple[str, ...] = ()
    # Trace ids remembered so that a second beacon of a trace is not counted again.
    max_joined_traces: int = 100_000
    # The bearer token `POST /v1/traces` requires (the engines' own secret); None: none.
    otlp_receiver_token: str | None = field(default=None, repr=False)


@dataclass(slots=True, frozen=True)
class CollectorParts:
    """The live pieces, exposed for tests and the CLI.

    >>> parts = create_collector_app(CollectorSettings(ObservabilitySettings(beacon_key="k")))
    >>> sorted(parts.app.openapi()["paths"])
    ['/health', '/metrics', '/v1/probe']
    """

    app: FastAPI
    registry: CollectorRegistry
    metrics: LLMMetrics
    span_builder: SpanBuilder | None
    tracer_provider: object
    signer: BeaconSigner
    probe: ProbeEndpoint   # the /v1/probe endpoint: its `ingestor` and `limiter`
    otlp_receiver: OtlpReceiver


def create_collector_app(settings: CollectorSettings, *,
                         registry: CollectorRegistry | None = None,
                         tracer_provider=None, environ=os.environ) -> CollectorParts:
    """A fresh collector; the registry, the tracer provider and the environment (the OTLP
    destination the receiver forwards to) are injectable. ValueError with an API key: the
    collector has no key gate, and the receiver's token is `otlp_receiver_token`, never a
    key meant for clients (docs/receiver-threat-model.md, "Who may send spans")."""
    obs = settings.observability
    if obs.api_key:
        raise ValueError("the collector has no API key gate (/v1/probe, /metrics and /health "
                         "are open); its OTLP receiver's token is --otlp-receiver-token")
    registry = registry if registry is not None else CollectorRegistry()
    # No server stages: a collector observes client metrics only (the server families stay
    # at zero; each process is its own Prometheus job).
    metrics = LLMMetrics(registry, model_names=settings.model_names, stages=())
    provider, spans = build_spans(obs, registry, Clock(), service_name="ttftscope-collector",
                                  tracer_provider=tracer_provider)
    signer = BeaconSigner.from_setting(obs.beacon_key)
    probe = build_probe(obs, store=TraceStore(1), metrics=metrics, span_builder=spans,
                        signer=signer, max_remote_joins=settings.max_joined_traces)
    forwarder = OtlpForwarder.from_environ(environ, registry)
    # A tee: the spans are forwarded, not joined.
    receiver = OtlpReceiver(registry, on_timings=None, forwarder=forwarder,
                            token=settings.otlp_receiver_token)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        try:
            yield
        finally:
            if forwarder is not None:
                await forwarder.aclose()

    app = FastAPI(title="ttftscope collector", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    # A raw ASGI route (not in the OpenAPI document, like the proxy's receiver).
    app.router.routes.append(Route(TRACES_PATH, receiver, methods=["POST"]))
    app.include_router(probe_router(probe))

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    serve_head(app)
    install_document(app)
    add_cors(app, obs.cors_origins)
    add_forwarded_client(app, obs)
    return CollectorParts(app=app, registry=registry, metrics=metrics, span_builder=spans,
                          tracer_provider=provider, signer=signer, probe=probe,
                          otlp_receiver=receiver)

