"""Fixtures for the proxy tests: the fake upstream, and proxies served on loopback with fresh
registries, span exporters and stores."""
from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from proxy_support import LiveProxy, serve_app
from tracer.proxy import ProxySettings, create_proxy_app
from tracer.proxy_fake_upstream import MODEL, FakeUpstream


@pytest.fixture
def fake_upstream():
    upstream = FakeUpstream(chunks=6, gap_ms=0).start()
    yield upstream
    upstream.stop()


@pytest.fixture
def proxy_factory():
    started: list[LiveProxy] = []

    def start(upstream_url: str, model_names: tuple[str, ...] = (MODEL,),
              **settings) -> LiveProxy:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        proxy_settings = ProxySettings(upstream_url)
        proxy_settings = dataclasses.replace(proxy_settings, **settings)
        parts = create_proxy_app(proxy_settings, model_names=model_names,
                                 registry=CollectorRegistry(), tracer_provider=provider)
        live = LiveProxy(serve_app(parts.app), parts, exporter)
        started.append(live)
        return live

    yield start
    for live in started:
        live.app.stop()
