"""The composition root: what every ttftscope HTTP process (engine server, proxy) builds.

`build_observability` assembles registry → metrics → clock → span builder → trace store →
logs → `Tracer` → the beacon endpoint, with every global injectable, and
`Observability.include_routes` mounts what both fronts serve: `/v1/probe`, and with
`settings.ui` the `/ui` waterfall, `/demo` and `/probe/*.js`. The collector
(tracer/collect/app.py) builds its spans and its beacon endpoint with the same
`build_spans` and `build_probe`. One settings class (`ObservabilitySettings`) and one set
of CLI flags (`tracer.web.cli_options`) configure it in both processes, so the probe, the UI
and the dashboards work the same in front of our engine and in front of a foreign one.
docs/architecture.md draws the layers.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from tracer.core.diagnoser import Diagnoser
from tracer.core.export_fields import ExportFields
from tracer.core.neighbourhood import Neighbourhood
from tracer.core.request_tracer import Tracer
from tracer.record.clock import Clock
from tracer.record.errors import ERROR_TYPES
from tracer.record.stages import SERVER_STAGES
from tracer.sinks.logs import RequestLogSink
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.export_drops import EXPORT_DROPS
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.tracer_provider import make_tracer_provider
from tracer.sinks.store import TraceStore
from tracer.store.metrics import StoreMetricsCollector
from tracer.store.open import open_store
from tracer.store.persistent import PersistentStore
from tracer.store.writer import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES, Retention
from tracer.web.openai_http import header_value
from tracer.web.probe.endpoint import ProbeEndpoint, make_probe_endpoint, probe_router
from tracer.web.probe.ingest import MAX_REMOTE_JOINS
from tracer.web.probe.token import BeaconSigner
from tracer.web.ui_api import make_ui_router, static_files_router

RECEIVE_START_KEY = "t_receive_start_ns"
# How long a scrape waits for the tracer's worker to publish the requests finished before it.
# A backlog drains at thousands of records a second (bench/tracer_cost.py: the worker's CPU
# per request), so this only runs out when a sink is stuck; the scrape
# is then answered with what has been published rather than hang (Prometheus times out at
# 10 s by default).
SCRAPE_DRAIN_S = 2.0
# How long a server's shutdown waits for the worker's backlog.
SHUTDOWN_DRAIN_S = 10.0
# Package data: the UI, and the probe and demo page from frontend_probe/ (symlinked in the
# source tree, real files in a wheel), so a non-editable install serves them too.
STATIC_DIR = Path(__file__).resolve().parent / "static"


@dataclass(slots=True, frozen=True)
class ObservabilitySettings:
    """What an operator configures on either front (the same CLI flags on both).

    >>> ObservabilitySettings(cors_origins=("https://app.example",)).ui
    True
    """

    tracing: bool = True                 # off: ids and headers only (the A/B baseline)
    diagnosis: bool = True               # off: no TTFT verdicts (bench/tracer_cost.py's A/B)
    trace_store_capacity: int = 10_000   # finished requests kept in memory (the ring)
    # Where records are kept beyond the ring (tracer/store/url.py): "memory" (the ring
    # alone; a library's default), None (the CLIs' default: an SQLite file in `data_dir`),
    # sqlite:///PATH or postgresql://USER@HOST:PORT/DB.
    store: str | None = "memory"
    data_dir: str | None = None          # None: $XDG_DATA_HOME/ttftscope
    retention_max_age_s: float = DEFAULT_MAX_AGE_S
    retention_max_bytes: int | None = DEFAULT_MAX_BYTES
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20        # a completion request's body
    probe_max_bytes: int = 16 * 1024     # one beacon is ~600 bytes
    probe_rate_per_s: float = 20.0       # beacons per second per client address
    probe_burst: int = 40
    ui: bool = True                      # /ui (waterfall), /demo (chat page), /probe/*.js
    # `Authorization: Bearer` required on all but the open paths (tracer/web/auth.py)
    api_key: str | None = field(default=None, repr=False)
    # HMAC key of the beacon tokens (tracer/web/probe/token.py); None: random per process
    beacon_key: str | None = field(default=None, repr=False)
    # Peers whose X-Forwarded-For is believed (the rightmost untrusted hop is the client),
    # for the beacon rate limit and logs; uvicorn's default and syntax (IPs, CIDRs or "*").
    forwarded_allow_ips: tuple[str, ...] = ("127.0.0.1",)


@dataclass(slots=True, frozen=True)
class Observability:
    """The live pieces one process publishes through, built once, complete, by
    `build_observability`."""

    settings: ObservabilitySettings
    registry: CollectorRegistry
    metrics: LLMMetrics
    store: TraceStore | PersistentStore
    clock: Clock
    tracer: Tracer
    span_builder: SpanBuilder | None   # None with tracing off
    tracer_provider: object            # None with tracing off
    stages: tuple[str, ...]
    beacon_signer: BeaconSigner
    probe: ProbeEndpoint               # `/v1/probe`: its ingestor and per-client limiter
    diagnoser: Diagnoser | None        # every record's TTFT verdict; None with diagnosis off
    neighbourhood: Neighbourhood       # what a request overlapped; the engine attaches steps

    def close(self, timeout_s: float = SHUTDOWN_DRAIN_S) -> bool:
        """A server's shutdown (both fronts' lifespans): publish every finished record,
        stop the tracer's worker, then flush the span processors, so the last requests'
        spans leave before the process does. The provider itself is shut down by the
        OTel SDK's exit hook (`TracerProvider(shutdown_on_exit=True)`, its default): a
        lifespan may run again in the same process (tests), and an injected provider is
        its owner's. True when everything was published in time.

        >>> build_observability(ObservabilitySettings(), model_names=("m",)).close()
        True
        """
        drained = self.tracer.close(timeout_s)
        drained = self.store.close(timeout_s) and drained   # after the tracer's last records
        force_flush = getattr(self.tracer_provider, "force_flush", None)
        flushed = True if force_flush is None else force_flush(int(timeout_s * 1000))
        return drained and flushed is not False

    def include_routes(self, app, *, static_dir: Path = STATIC_DIR) -> None:
        """`/v1/probe`, and with `settings.ui` the `/ui` waterfall, `/demo` and `/probe/*.js`.

        >>> from fastapi import FastAPI
        >>> build_observability(ObservabilitySettings(), model_names=("m",)).include_routes(FastAPI())
        """
        app.include_router(probe_router(self.probe))
        if not self.settings.ui:
            return
        app.include_router(make_ui_router(store=self.store, clock=self.clock,
                                          stages=self.stages, static_dir=static_dir / "ui",
                                          neighbourhood=self.neighbourhood,
                                          drain=partial(self.tracer.drain, SCRAPE_DRAIN_S)))
        demo = static_dir / "demo"
        app.include_router(static_files_router({
            "/demo": demo / "index.html", "/demo/": demo / "index.html",
            "/demo/demo.js": demo / "demo.js", "/demo/demo.css": demo / "demo.css",
            # the minified builds (frontend_probe/build.mjs) under the plain names
            "/probe/probe.js": static_dir / "probe.min.js",
            "/probe/probe.global.js": static_dir / "probe.global.min.js",
            # the stream-format add-on (frontend_probe/formats.js), loaded after the probe
            "/probe/formats.js": static_dir / "formats.min.js",
            "/probe/formats.global.js": static_dir / "formats.global.min.js"}))


def build_observability(settings: ObservabilitySettings, *, model_names: Sequence[str],
                        stages: tuple[str, ...] = SERVER_STAGES, source: str = "engine",
                        error_types: tuple[str, ...] = ERROR_TYPES,
                        registry: CollectorRegistry | None = None, tracer_provider=None,
                        logger=None, service_name: str = "ttftscope",
                        span_kind=None) -> Observability:
    """registry → metrics → clock → span builder → store → logs → `Tracer` → beacon
    endpoint, one each.

    `model_names` are the served models: the only values a model label or span name may
    take (anything else is `other`). `tracer_provider` defaults to a fresh one exporting
    OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; `span_kind` is the kind of the
    request's own span (INTERNAL when an HTTP SERVER span from the FastAPI instrumentation
    encloses it, SERVER when it is the hop's only span).

    >>> obs = build_observability(ObservabilitySettings(), model_names=("m",), source="proxy")
    >>> [type(s).__name__ for s in obs.tracer.sinks]
    ['TraceStore', 'ExportFields', 'Diagnoser', 'LLMMetrics', 'SpanBuilder']
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     obs = build_observability(ObservabilitySettings(store=None, data_dir=d),
    ...                               model_names=("m",))
    ...     print([type(s).__name__ for s in obs.tracer.sinks][-2:], obs.close())
    ['SpanBuilder', 'StoreWriter'] True
    """
    registry = registry if registry is not None else CollectorRegistry()
    metrics = LLMMetrics(registry, model_names=tuple(model_names), stages=stages,
                         error_types=error_types)
    clock = Clock()   # one perf→epoch anchor for spans and the UI's times
    store = open_store(settings.store, clock=clock, data_dir=settings.data_dir,
                       ring_capacity=settings.trace_store_capacity,
                       retention=Retention(settings.retention_max_age_s,
                                           settings.retention_max_bytes))
    provider, spans = build_spans(settings, registry, clock, service_name=service_name,
                                  tracer_provider=tracer_provider, span_kind=span_kind)
    # Order matters only for readers racing the finish: the store first, so a beacon that
    # arrives as the response ends finds its record; the diagnosis before every exporter,
    # which read its verdict from the record (tracer/core/diagnoser.py).
    diagnoser = Diagnoser() if settings.diagnosis else None
    # The export's fields before the diagnosis, which drops the prompt they are hashed from.
    sinks: list = [store, ExportFields(clock), *([diagnoser] if diagnoser is not None else []),
                   metrics]
    if spans is not None:
        sinks.append(spans)
    if logger is not None:
        sinks.append(RequestLogSink(logger))
    if isinstance(store, PersistentStore):
        # The database's write, last: the verdict and the export's fields are in it.
        sinks.append(store.writer)
        StoreMetricsCollector(registry, store.writer, store.sql.dialect.name,
                              read_failures=lambda: store.read_failures)
    signer = BeaconSigner.from_setting(settings.beacon_key)
    # background: the store is published inside `finish` (it is `inline`), the metrics,
    # spans and log line from the tracer's worker thread, off the request's thread
    # (tracer/core/record_worker.py); the scrape drains it first (read your writes).
    tracer = Tracer(model_names=model_names, sinks=sinks, span_builder=spans, stages=stages,
                    source=source, enabled=settings.tracing, beacon_token=signer.token,
                    background=True)
    neighbourhood = Neighbourhood(store, tracer, local_store=getattr(store, "ring", store))
    if diagnoser is not None:
        diagnoser.neighbourhood = neighbourhood   # the tracer needs the diagnoser first
        if isinstance(store, PersistentStore):    # what is normal, from before a restart
            diagnoser.learn(history_of(store, model_names, diagnoser.baselines.window))
    metrics.bind_drain(partial(tracer.drain, SCRAPE_DRAIN_S))   # the tracer needs the metrics
    probe = build_probe(settings, store=store, metrics=metrics, span_builder=spans,
                        signer=signer, diagnoser=diagnoser)
    return Observability(settings=settings, registry=registry, metrics=metrics, store=store,
                         clock=clock, tracer=tracer, span_builder=spans, tracer_provider=provider,
                         stages=stages, beacon_signer=signer, probe=probe, diagnoser=diagnoser,
                         neighbourhood=neighbourhood)


def history_of(store: PersistentStore, model_names: Sequence[str], per_model: int) -> list:
    """The newest `per_model` stored records of each served model, oldest first."""
    records = [r for model in model_names
               for r in store.window(None, None, limit=per_model, model=model)]
    records.sort(key=lambda r: r.end_ns)
    return records


def build_spans(settings: ObservabilitySettings, registry: CollectorRegistry, clock: Clock, *,
                service_name: str, tracer_provider=None,
                span_kind=None) -> tuple[object, SpanBuilder | None]:
    """(tracer provider, span builder), and the export's drop counters on `registry`; with
    `settings.tracing` off, (None, None) and no counters. The provider is `tracer_provider`
    or a fresh one (OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).

    >>> build_spans(ObservabilitySettings(tracing=False), CollectorRegistry(), Clock(),
    ...             service_name="ttftscope")
    (None, None)
    """
    if not settings.tracing:
        return None, None
    provider = tracer_provider or make_tracer_provider(service_name)
    kwargs = {} if span_kind is None else {"kind": span_kind}
    registry.register(ExportDropsCollector())
    return provider, SpanBuilder(provider, clock, **kwargs)


def build_probe(settings: ObservabilitySettings, *, store: TraceStore, metrics: LLMMetrics,
                span_builder: SpanBuilder | None, signer: BeaconSigner,
                diagnoser: Diagnoser | None = None,
                max_remote_joins: int = MAX_REMOTE_JOINS) -> ProbeEndpoint:
    """The `/v1/probe` endpoint with the settings' beacon limits, the same on every front
    and the collector; `max_remote_joins` bounds the trace ids remembered for beacons joined
    from their signed payload.

    >>> settings = ObservabilitySettings(probe_burst=5)
    >>> build_probe(settings, store=TraceStore(), metrics=LLMMetrics(process_metrics=False),
    ...             span_builder=None, signer=BeaconSigner.from_setting("k")).limiter.burst
    5
    """
    return make_probe_endpoint(
        store=store, metrics=metrics, span_builder=span_builder, signer=signer,
        diagnoser=diagnoser, max_bytes=settings.probe_max_bytes,
        rate_per_s=settings.probe_rate_per_s,
        burst=settings.probe_burst, max_remote_joins=max_remote_joins)


class ExportDropsCollector:
    """`otel_spans_dropped_total{reason}` and `otel_span_attributes_dropped_total`, read at
    scrape time from the process's span export (`tracer.sinks.export_drops.EXPORT_DROPS`);
    every reason is a series from the start (docs/reference.md, "Metrics").

    >>> [m.name for m in ExportDropsCollector().collect()]
    ['otel_spans_dropped', 'otel_span_attributes_dropped']
    """

    def __init__(self, drops=EXPORT_DROPS) -> None:
        self.drops = drops

    def collect(self):
        attributes, spans = self.drops.snapshot()
        dropped = CounterMetricFamily("otel_spans_dropped", "Spans lost by the OTLP export, "
                                      "by reason", labels=("reason",))
        for reason, count in spans.items():
            dropped.add_metric((reason,), count)
        yield dropped
        yield CounterMetricFamily("otel_span_attributes_dropped", "Span attributes the OTLP "
                                  "encoder could not write (dropped, as the SDK drops them)",
                                  value=attributes)


class ReceiveClockGate:
    """Pure ASGI middleware, outermost of ours: starts the `receive` clock
    (`scope["state"][RECEIVE_START_KEY]`) and adds `Timing-Allow-Origin` for allowed origins
    (so the probe can read Resource Timing). Pure ASGI keeps streaming and disconnects
    untouched, unlike BaseHTTPMiddleware.

    >>> from fastapi import FastAPI
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
