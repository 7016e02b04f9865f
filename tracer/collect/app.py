"""The standalone collector: where the whole trace is joined (`python -m tracer collect
--listen HOST:PORT`): browser beacons, the backend's and the engine's own OTLP spans, and
our engine's or proxy's signed in-band timing when they are in the path, assembled into one
record per trace, with no ttftscope component in the data path (docs/architecture.md, "The
whole path"; docs/reference.md, "The standalone collector").

It serves `/v1/probe` (the same endpoint, limits, CORS allow-list and outcomes as the
engine's and the proxy's), the same OTLP trace receivers as the proxy (`POST /v1/traces`,
tracer/web/otlp_receiver.py, and gRPC with `otlp_grpc_listen`, with their limits and
optional token), `/ui` with `/ui/api/trace/<id>` (tracer/web/ui_api.py), `/metrics` and
`/health`. Every received span is held in `PendingTraces` (tracer/collect/pending.py) with
its trace's beacon until the trace is complete or its wait is over, then published once by
`PathPublisher` (tracer/collect/publish.py): the whole path as a record in the /ui store,
`llm_path_segment_seconds`, and the client metrics and spans. Every span also goes on
unchanged to the collector's own OTLP destination (the tee).

A beacon carrying signed in-band timing (tracer/web/inband.py) is joined from it at once as
before (client metrics, client spans in the server's trace); its trace is still assembled
for /ui and the segment metrics. A beacon with only the `Server-Timing` token of a backend
helper (tracer/web/backend_timing.py, frontend_probe/server.js) is checked with the same
`--beacon-key` and waits for its spans. Its span export and beacon endpoint come from the
builders `tracer.web.observability.build_observability` uses (`build_spans`, `build_probe`).
"""
from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from tracer.collect.beacon_relay import join_relayed, read_export
from tracer.collect.ingest import CollectorIngestor
from tracer.collect.path_verdict import PathDiagnoser
from tracer.collect.pending import (
    DEFAULT_MAX_SPANS_PER_TRACE,
    DEFAULT_MAX_TRACES,
    DEFAULT_WAIT_S,
    PendingTraces,
)
from tracer.collect.publish import PathPublisher
from tracer.collect.whole_path import DEFAULT_MAX_SKEW_S, PATH_STAGES
from tracer.engines.spans import SpanView
from tracer.record.clock import Clock
from tracer.record.segment_names import DEFAULT_TOP_N, SegmentNames
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.path_metrics import BEACON_RELAY, PathMetrics
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.store import TraceStore
from tracer.store.metrics import StoreMetricsCollector
from tracer.store.open import open_store
from tracer.store.persistent import PersistentStore
from tracer.store.writer import Retention
from tracer.web.cors import add_cors
from tracer.web.forwarded import add_forwarded_client
from tracer.web.observability import ObservabilitySettings, build_probe, build_spans
from tracer.web.openapi_common import install_document
from tracer.web.otlp_forward import OtlpForwarder, otlp_headers
from tracer.web.otlp_grpc import OtlpGrpcReceiver
from tracer.web.otlp_receiver import TRACES_PATH, OtlpReceiver
from tracer.web.probe.endpoint import ProbeEndpoint, probe_router
from tracer.web.probe.token import BeaconSigner
from tracer.web.routes import serve_head
from tracer.web.ui_api import make_ui_router


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
    # Also serve OTLP/gRPC on this HOST:PORT (vLLM's and SGLang's default export).
    otlp_grpc_listen: str | None = None
    # How long a trace waits for its parts after the first arrived (tracer/collect/pending.py).
    join_wait_s: float = DEFAULT_WAIT_S
    max_pending_traces: int = DEFAULT_MAX_TRACES
    max_spans_per_trace: int = DEFAULT_MAX_SPANS_PER_TRACE
    # Backend span names always kept as `segment` labels, and how many more are learned.
    path_segments: tuple[str, ...] = ()
    path_top_n: int = DEFAULT_TOP_N
    # How far the engine's and the backend's clocks may disagree (tracer/engines/placement.py).
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    # Records kept for /ui.
    store_capacity: int = 10_000
    # The OTLP/HTTP endpoint of the balancer in front of N collectors: beacons go through it
    # to the collector owning their trace (tracer/collect/beacon_relay.py); None: joined here.
    beacon_relay_url: str | None = None


@dataclass(slots=True, frozen=True)
class CollectorParts:
    """The live pieces, exposed for tests and the CLI.

    >>> parts = create_collector_app(CollectorSettings(ObservabilitySettings(beacon_key="k")))
    >>> [p for p in sorted(parts.app.openapi()["paths"]) if not p.startswith("/ui")]
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
    pending: PendingTraces
    store: TraceStore | PersistentStore
    path_metrics: PathMetrics
    otlp_grpc: OtlpGrpcReceiver | None = None


def create_collector_app(settings: CollectorSettings, *,
                         registry: CollectorRegistry | None = None,
                         tracer_provider=None, environ=os.environ,
                         relay_transport=None) -> CollectorParts:
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
    clock = Clock()
    provider, spans = build_spans(obs, registry, clock, service_name="ttftscope-collector",
                                  tracer_provider=tracer_provider)
    signer = BeaconSigner.from_setting(obs.beacon_key)
    store = open_store(obs.store, clock=clock, data_dir=obs.data_dir,
                       ring_capacity=settings.store_capacity,
                       retention=Retention(obs.retention_max_age_s, obs.retention_max_bytes))
    if isinstance(store, PersistentStore):
        StoreMetricsCollector(registry, store.writer, store.sql.dialect.name,
                              read_failures=lambda: store.read_failures)
    path_metrics = PathMetrics(registry, metrics.models)
    publisher = PathPublisher(store=store, metrics=metrics, path_metrics=path_metrics,
                              names=SegmentNames(settings.path_segments, settings.path_top_n),
                              clock=clock, model_names=settings.model_names,
                              max_skew_ns=round(settings.max_skew_s * 1e9), span_builder=spans,
                              diagnoser=PathDiagnoser() if obs.diagnosis else None)
    pending = PendingTraces(publisher, path_metrics, wait_s=settings.join_wait_s,
                            max_traces=settings.max_pending_traces,
                            max_spans_per_trace=settings.max_spans_per_trace)
    # The in-band join needs no local record: its store stays empty.
    probe = build_probe(obs, store=TraceStore(1), metrics=metrics, span_builder=spans,
                        signer=signer, max_remote_joins=settings.max_joined_traces)
    relay = None if not settings.beacon_relay_url else OtlpForwarder(
        settings.beacon_relay_url, registry, headers=otlp_headers(environ),
        transport=relay_transport, metric=BEACON_RELAY,
        what="Beacons sent on to the collector owning their trace")
    probe.ingestor = CollectorIngestor(probe.ingestor, pending, relay)
    forwarder = OtlpForwarder.from_environ(environ, registry)

    def on_export(found: tuple[list[SpanView], list[bytes]]) -> None:
        spans, beacons = found
        pending.add_spans(spans)
        for body in beacons:
            join_relayed(probe, body)

    receiver = OtlpReceiver(registry, on_timings=on_export, forwarder=forwarder,
                            token=settings.otlp_receiver_token, read_export=read_export)
    grpc_receiver = (None if not settings.otlp_grpc_listen else
                     OtlpGrpcReceiver(receiver, settings.otlp_grpc_listen))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if grpc_receiver is not None:
            grpc_receiver.start(asyncio.get_running_loop())
        expiry = asyncio.create_task(_expire_forever(pending))
        try:
            yield
        finally:
            expiry.cancel()
            with suppress(asyncio.CancelledError):
                await expiry
            if grpc_receiver is not None:
                grpc_receiver.stop()
            for sender in (forwarder, relay):
                if sender is not None:
                    await sender.aclose()
            store.close()   # what is still queued reaches the database

    app = FastAPI(title="ttftscope collector", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    # A raw ASGI route (not in the OpenAPI document, like the proxy's receiver).
    app.router.routes.append(Route(TRACES_PATH, receiver, methods=["POST"]))
    app.include_router(probe_router(probe))
    app.include_router(make_ui_router(store=store, clock=clock, stages=PATH_STAGES))

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
                          otlp_receiver=receiver, pending=pending, store=store,
                          path_metrics=path_metrics, otlp_grpc=grpc_receiver)


# How often waiting traces are checked against their deadline: a trace leaves at most this
# late, and the check is a look at the oldest one.
_EXPIRY_PERIOD_S = 0.2


async def _expire_forever(pending: PendingTraces) -> None:
    while True:
        await asyncio.sleep(_EXPIRY_PERIOD_S)
        pending.expire()

