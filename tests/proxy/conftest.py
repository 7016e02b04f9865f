"""Fixtures for the proxy tests: the fake upstream, and proxies served on loopback with fresh
registries, span exporters and stores."""
from __future__ import annotations

import pytest

from proxy_support import LiveProxy, start_proxy
from tracer.testing.fake_upstream import MODEL, FakeUpstream


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
        live = start_proxy(upstream_url, model_names, **settings)
        started.append(live)
        return live

    yield start
    for live in started:
        live.app.stop()
