"""A server's app, once its test is done with it, can be collected with its engine: nothing
global keeps the engine's KV cache alive (tests/conftest.py, `release_fastapi_caches`).
The suite builds dozens of servers in one process; without this it ran out of memory."""
from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.server.app import create_app
from tests.conftest import release_fastapi_caches


def test_a_finished_app_and_its_engine_are_collected(loaded_model):
    engine = LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model)
    parts = create_app(engine, registry=CollectorRegistry())
    gone = weakref.ref(engine)
    parts.obs.close()
    del engine, parts
    release_fastapi_caches()
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
