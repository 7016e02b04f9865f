"""AsyncEngine: deltas stream as they become printable; abort frees KV blocks at once."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.errors import PromptTooLongError
from instrumented_engine.engine.sampling import SamplingParams

ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def aengine(loaded_model):
    engine = AsyncEngine(LLMEngine(EngineConfig(num_kv_blocks=128), loaded=loaded_model))
    yield engine
    engine.stop()


def test_generate_streams_the_same_text_as_the_sync_engine(aengine):
    sync = aengine.engine
    ids = sync.tokenize(sync.render_chat(ASK), add_bos=False)
    sampling = SamplingParams(temperature=0.0, max_tokens=12)

    async def stream() -> list[str]:
        return [delta async for delta in aengine.generate("a", messages=ASK, sampling=sampling)]

    deltas = asyncio.run(stream())
    aengine.stop()
    sync.add_request("s", ids, sampling)
    expected = []
    while sync.has_unfinished():
        expected += [out.text for out in sync.step()]
    assert len(deltas) > 1 and all(deltas)
    assert "".join(deltas) == "".join(expected)


def test_abort_mid_stream_frees_blocks_before_returning(aengine):
    async def run() -> tuple[int, int]:
        stream = await aengine.submit("long", messages=ASK, sampling=SamplingParams(
            temperature=0.0, max_tokens=500, ignore_eos=True))
        seen, outputs = 0, stream.__aiter__()
        async with contextlib.aclosing(outputs):  # closing early = the client went away
            async for out in outputs:
                seen += out.num_new_tokens
                if seen >= 3:
                    assert aengine.engine.block_manager.num_used_blocks > 0
                    break
        return seen, aengine.engine.block_manager.num_used_blocks

    seen, used_blocks = asyncio.run(run())
    assert seen >= 3 and used_blocks == 0
    assert not aengine.engine.has_unfinished()


def test_bad_input_raises_at_submit_before_any_output(aengine):
    async def run() -> None:
        await aengine.submit("x", prompt="hello " * 9000,
                             sampling=SamplingParams(max_tokens=4))

    with pytest.raises(PromptTooLongError):
        asyncio.run(run())
    assert aengine.engine.block_manager.num_used_blocks == 0
