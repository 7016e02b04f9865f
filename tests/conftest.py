"""Fixtures shared by every test folder: the real default model (loaded once per session)
and live servers on loopback, built fresh with injected registry, spans and store."""
from __future__ import annotations

import asyncio
import gc
import os
import pathlib
import tempfile
import threading
from dataclasses import dataclass

import pytest
import torch
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.server.app import ServerParts, ServerSettings, create_app
from tracer.testing.spans import DrainingSpanExporter
from tracer.web.quiet_server import QuietServer


# The commands keep records in an SQLite file under $XDG_DATA_HOME/ttftscope by default: a
# test's servers (in-process or subprocesses, which inherit this) never write the machine
# user's, nor another test's (`_own_data_dir`).
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="ttftscope-tests-data-")
os.environ.pop("TTFTSCOPE_STORE", None)
os.environ.pop("TTFTSCOPE_DATA_DIR", None)


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


# FastAPI classifies every endpoint once (coroutine or not) in module-level lru_caches of
# 4,096 entries (fastapi/dependencies/models.py, 0.165). The endpoints are closures over their
# app's engine, so every app a test built, and its engine's KV cache (~380 MB at 512 float32
# blocks), lived to the end of the session: the suite's process reached 21 GB and was killed.
_FASTAPI_CALLABLE_CACHES = ("_is_gen_callable_cached", "_is_async_gen_callable_cached",
                            "_is_coroutine_callable_cached")


def release_fastapi_caches() -> None:
    """Forget FastAPI's classification of endpoints, so finished apps can be collected."""
    from fastapi.dependencies import models
    for name in _FASTAPI_CALLABLE_CACHES:
        cache = getattr(models, name, None)
        if cache is not None:
            cache.cache_clear()
    gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _release_apps_when_the_module_ends():
    # Autouse, so set up before the module's servers and torn down after them.
    yield
    release_fastapi_caches()


@pytest.fixture(scope="session")
def gguf_path() -> pathlib.Path:
    from instrumented_engine.model.loader import default_model_path
    return default_model_path()


@pytest.fixture(scope="session")
def loaded_model(gguf_path):
    from instrumented_engine.model.loader import load_model

    # Two cores: tests and the model share them; more threads only add contention.
    torch.set_num_threads(2)
    return load_model(gguf_path, device="cpu", dtype="float32")


@dataclass
class LiveServer:
    base_url: str
    parts: ServerParts
    spans: InMemorySpanExporter
    engine: LLMEngine

    @property
    def model(self) -> str:
        return self.engine.model_name

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Block until no request is in the engine or the tracer (aborts land asynchronously)."""
        done = threading.Event()

        def check() -> None:
            while not done.is_set():
                if (self.parts.aengine.stats()[:2] == (0, 0) and not self.engine.has_unfinished()
                        and self.parts.obs.tracer.is_idle(timeout_s)):
                    done.set()
                    return
                done.wait(0.01)
        worker = threading.Thread(target=check, daemon=True)
        worker.start()
        assert done.wait(timeout_s), "engine still busy"


def _serve(app, ready: threading.Event, holder: dict) -> None:
    # proxy_headers off, as the CLI runs it: --forwarded-allow-ips alone decides.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            proxy_headers=False)
    server = QuietServer(config)
    holder["server"] = server

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        if server.started:
            holder["port"] = server.servers[0].sockets[0].getsockname()[1]
        ready.set()
        await task
    asyncio.run(run())


@pytest.fixture(scope="module")
def server_factory(loaded_model):
    started = []

    def start(settings: ServerSettings = ServerSettings(), **engine_overrides) -> LiveServer:
        engine = LLMEngine(EngineConfig(**{"num_kv_blocks": 512, **engine_overrides}),
                           loaded=loaded_model)
        exporter = DrainingSpanExporter()   # reads wait for the tracer's worker thread
        # No exit hook: atexit would hold the provider, its exporter, the tracer it drains and
        # so the engine until the session ends; the teardown below shuts it down.
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        parts = create_app(engine, settings, registry=CollectorRegistry(),
                           tracer_provider=provider)
        exporter.bind(parts.obs.tracer)
        ready, holder = threading.Event(), {}
        thread = threading.Thread(target=_serve, args=(parts.app, ready, holder), daemon=True)
        thread.start()
        assert ready.wait(60) and "port" in holder, "server did not start"
        started.append((holder["server"], thread, provider))
        return LiveServer(f"http://127.0.0.1:{holder['port']}", parts, exporter, engine)

    yield start
    for server, thread, provider in started:
        server.should_exit = True
        thread.join(timeout=30)
        provider.shutdown()


@pytest.fixture(scope="module")
def live(server_factory) -> LiveServer:
    return server_factory()


# Served by uvicorn in processes of their own (tests/integration/test_whole_path_*.py), never
# imported here: importing the traced backend instruments httpx and sqlite3 and sets the
# global tracer provider, for every test in this process.
collect_ignore = ["integration/traced_backend_app.py"]
