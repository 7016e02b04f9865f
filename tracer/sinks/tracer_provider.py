"""The OpenTelemetry tracer provider ttftscope builds: OTLP/HTTP export in batches, only when
the OTel exporter variables name an endpoint."""
from __future__ import annotations

import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider


def make_tracer_provider(service_name: str = "ttftscope", environ=os.environ) -> TracerProvider:
    """A fresh provider; exports OTLP/HTTP in batches only when an endpoint is configured.

    Never sets the global provider: the caller decides (tests use their own).
    `OTEL_SERVICE_NAME` in `environ` overrides `service_name`.
    """
    name = environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    endpoint = otlp_traces_endpoint(environ)
    if endpoint is not None:
        # Imported here: the exporter pulls in protobuf + requests, unneeded without an endpoint.
        from tracer.sinks.otlp_export import EncodingBatchSpanProcessor, FastOTLPSpanExporter
        # Batches 4x the SDK's default: each POST costs the export thread ~1 ms of Python
        # (GIL the event loop waits for), whatever its size. OTEL_BSP_* still override.
        provider.add_span_processor(EncodingBatchSpanProcessor(
            FastOTLPSpanExporter(endpoint=endpoint),
            max_queue_size=int(environ.get("OTEL_BSP_MAX_QUEUE_SIZE", 8192)),
            max_export_batch_size=int(environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 2048))))
    return provider


def otlp_traces_endpoint(environ=os.environ) -> str | None:
    """The OTLP/HTTP traces URL per the OTel exporter spec, or None when nothing is set."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces  # the signal-specific URL is used as is
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None
