"""A stream whose reader stops reading is aborted once `max_pending_outputs` outputs wait:
the engine stops generating, frees its KV blocks, and the reader, if it comes back, reads
what was queued and then `SlowReaderError`."""
from __future__ import annotations

import asyncio

import pytest

from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.errors import SlowReaderError
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.sampling import SamplingParams

ASK = [{"role": "user", "content": "Tell me a story."}]
BOUND = 3
MAX_TOKENS = 200


async def _until(condition, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture
def aengine(loaded_model):
    engine = AsyncEngine(LLMEngine(EngineConfig(num_kv_blocks=128), loaded=loaded_model),
                         max_pending_outputs=BOUND)
    yield engine
    engine.stop()


def test_unread_stream_is_aborted_at_its_bound(aengine):
    free_blocks = aengine.engine.block_manager.num_free_blocks
    called = []

    async def run() -> list:
        stream = await aengine.submit("unread", messages=ASK, sampling=SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
        stream.on_slow_reader = lambda: called.append(aengine.engine.has_unfinished())
        await _until(lambda: stream.slow_reader)
        assert stream.num_pending == BOUND + 1   # the outputs, then the error
        got = []
        with pytest.raises(SlowReaderError):
            async for out in stream:
                got.append(out)
        return got

    got = asyncio.run(run())
    assert len(got) == BOUND and not any(out.finished for out in got)
    assert called == [False]   # already aborted in the engine when the owner is told
    assert aengine.num_slow_readers == 1 and not aengine.engine.has_unfinished()
    assert aengine.engine.block_manager.num_free_blocks == free_blocks


def test_a_reader_that_keeps_up_is_never_aborted(aengine):
    async def run() -> list:
        stream = await aengine.submit("read", messages=ASK, sampling=SamplingParams(
            temperature=0.0, max_tokens=4 * BOUND, ignore_eos=True))
        return [out async for out in stream]

    outs = asyncio.run(run())
    assert sum(out.num_new_tokens for out in outs) == 4 * BOUND and outs[-1].finished
    assert aengine.num_slow_readers == 0


def test_bound_must_be_positive(loaded_model):
    with pytest.raises(ValueError, match="max_pending_outputs"):
        AsyncEngine(LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model),
                    max_pending_outputs=0)
