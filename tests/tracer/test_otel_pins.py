"""OTel is pinned exactly (issue 15, option A): the span-export fast path reads SDK internals,
so the installed SDK must be the pinned one, the fast path must be the one in use, and our
`max_request_size` check must mean what the SDK means (None = the SDK's 64 MiB default,
0 or below = no limit)."""
from __future__ import annotations

import http.server
import importlib.metadata as md
import pathlib
import re
import threading
import tomllib

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.sinks.otlp_encoding import EncodedSpan
from tracer.sinks.otlp_export import EncodingBatchSpanProcessor, FastOTLPSpanExporter
from tracer.sinks.tracer_provider import make_tracer_provider

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


def _otel_pins() -> dict[str, str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    # The base set, and the dev extra's instrumentations (the whole-path tests' backend).
    deps = project["dependencies"] + project["optional-dependencies"]["dev"]
    pins = {}
    for dep in deps:
        m = re.fullmatch(r"(opentelemetry-[a-z-]+)==([^;\s]+)", dep.strip())
        if m:
            pins[m[1]] = m[2]
    return pins


def test_every_installed_otel_package_is_the_pinned_one():
    pins = _otel_pins()
    for needed in ("opentelemetry-api", "opentelemetry-sdk",
                   "opentelemetry-exporter-otlp-proto-http",
                   "opentelemetry-instrumentation-fastapi"):
        assert needed in pins, f"{needed} is not pinned with == in pyproject.toml"
    installed = {d.metadata["Name"].lower().replace("_", "-"): d.version
                 for d in md.distributions()
                 if d.metadata["Name"].lower().replace("_", "-").startswith("opentelemetry-")}
    assert {n: installed.get(n) for n in pins} == pins
    # Any other opentelemetry-* package installed (a lockstep part added by a new SDK) must be
    # pinned too, or an upgrade could move it alone.
    assert sorted(set(installed) - set(pins)) == []


def test_the_production_provider_uses_the_fast_path():
    provider = make_tracer_provider(environ={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"})
    try:
        (processor,) = provider._active_span_processor._span_processors
        assert type(processor) is EncodingBatchSpanProcessor
        assert type(processor.span_exporter) is FastOTLPSpanExporter
        assert processor.fast_path and processor.span_exporter.fast_path
        # And it is the path taken: spans reach the exporter already encoded.
        seen = []
        processor.span_exporter.export = lambda batch: (seen.extend(batch),
                                                       SpanExportResult.SUCCESS)[1]
        processor.on_end(_spans(1)[0])
        assert processor.force_flush(10_000)
        assert seen and all(isinstance(s, EncodedSpan) for s in seen)
    finally:
        provider.shutdown()


def _spans(n: int):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("pins")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}", attributes={"pad": "x" * 200}):
            pass
    return exporter.get_finished_spans()


class _Sink(http.server.BaseHTTPRequestHandler):
    posts: list[int] = []

    def do_POST(self):  # noqa: N802
        type(self).posts.append(len(self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def sink_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("limit", [None, 0, -1, 10, 1 << 20],
                         ids=["unset", "zero", "negative", "tiny", "1MiB"])
def test_max_request_size_means_what_the_sdk_means(sink_url, limit):
    spans = _spans(3)
    outcomes = {}
    for cls in (OTLPSpanExporter, FastOTLPSpanExporter):
        _Sink.posts = []
        exporter = cls(endpoint=sink_url, max_request_size=limit, timeout=5)
        try:
            outcomes[cls.__name__] = (exporter.export(spans), len(_Sink.posts))
        finally:
            exporter.shutdown()
    # Same decision as the SDK: sent (one POST) unless a positive limit is exceeded.
    expected = ((SpanExportResult.FAILURE, 0) if limit == 10 else (SpanExportResult.SUCCESS, 1))
    assert outcomes == {"OTLPSpanExporter": expected, "FastOTLPSpanExporter": expected}


def test_unset_limit_is_the_sdks_default_not_unbounded():
    exporter = FastOTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    try:
        assert exporter._max_request_size == 64 * 1024 * 1024
    finally:
        exporter.shutdown()
