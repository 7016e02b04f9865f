"""Stage boundaries on any device (the device sync at the prefill's end), the prefill's FLOPs
handed to the recorder, the model-load time, and the warm-up, on the real SmolLM2."""
from __future__ import annotations

import functools

import pytest
import torch

import instrumented_engine.engine.llm_engine as llm_engine_module
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.device_sync import _no_sync, device_sync_for
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.recorder import NoopRecorder
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.warm_up import WARMUP_REQUEST_IDS
from instrumented_engine.model.flops import FlopCounter

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


class TickClock:
    """Every read is one tick later: the order of reads is the order of the instants."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        self.now_ns += 1
        return self.now_ns


class RecordingRecorder(NoopRecorder):
    """Keeps the calls the tests look at: (method, request id, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def prefill_chunk(self, request_id, start_ns, end_ns, num_tokens, batch_size,
                      num_batched_tokens, flops=0, step_flops=0):
        self.calls.append(("prefill_chunk", request_id, start_ns, end_ns, num_tokens, flops,
                           step_flops))

    def first_token_sampled(self, request_id, t_ns):
        self.calls.append(("first_token_sampled", request_id, t_ns))

    def scheduled(self, request_id, t_ns):
        self.calls.append(("scheduled", request_id, t_ns))

    def of(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


def question_ids(engine: LLMEngine, text: str = "What is the capital of France?") -> list[int]:
    return engine.tokenize(engine.render_chat([{"role": "user", "content": text}]),
                           add_bos=False)


def run_all(engine: LLMEngine, limit: int = 2_000) -> dict[str, str]:
    texts: dict[str, str] = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return texts
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
    raise AssertionError("engine did not finish")


def test_prefill_ends_after_the_device_sync_and_sampling_after_the_tokens_are_on_the_host(
        loaded_model):
    clock, recorder, syncs = TickClock(), RecordingRecorder(), []
    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model, recorder=recorder,
                       clock_ns=clock, device_sync=lambda: syncs.append(clock()))
    sample_window: list[tuple[int, int]] = []
    real_sample = engine.sampler.sample_isolated

    def timed_sample(*args):
        entered = clock()
        token_ids = real_sample(*args)     # returns host ints: the device work is over
        sample_window.append((entered, clock()))
        return token_ids
    engine.sampler.sample_isolated = timed_sample

    engine.add_request("r1", question_ids(engine), SamplingParams(temperature=0, max_tokens=1))
    run_all(engine)
    [(_, _, forward_start, prefill_end, *_)] = recorder.of("prefill_chunk")
    [(_, _, first_token)] = recorder.of("first_token_sampled")
    [sync] = syncs
    [(sample_start, sample_end)] = sample_window
    assert forward_start < sync < prefill_end <= sample_start < sample_end <= first_token


def test_every_step_syncs_once(loaded_model):
    syncs = []
    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model,
                       device_sync=lambda: syncs.append(1))
    engine.add_request("r1", question_ids(engine), GREEDY)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert len(syncs) == steps == GREEDY.max_tokens   # one prefill step, then the decodes


def test_the_sync_is_chosen_from_the_device(loaded_model):
    assert device_sync_for("cpu") is _no_sync
    cuda_sync = device_sync_for("cuda:0")   # built without a GPU: nothing runs until called
    assert isinstance(cuda_sync, functools.partial)
    assert cuda_sync.func is torch.cuda.synchronize and cuda_sync.args == (torch.device("cuda:0"),)
    engine = LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model)
    assert engine.device_sync is _no_sync   # the session's model is on the CPU


def test_chunked_prefill_flops_add_up_to_the_whole_prompts(loaded_model):
    """Causal attention pairs partition across chunks, and only the last chunk has logits: the
    chunks' FLOPs sum to the FLOPs of computing the prompt at once."""
    recorder = RecordingRecorder()
    engine = LLMEngine(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=16,
                                    enable_prefix_caching=False),
                       loaded=loaded_model, recorder=recorder)
    ids = question_ids(engine, "Summarize: " + " ".join(["the quick brown fox"] * 8))
    engine.add_request("long", ids, SamplingParams(temperature=0, max_tokens=1))
    run_all(engine)
    chunks = recorder.of("prefill_chunk")
    assert len(chunks) == -(-len(ids) // 16) > 2
    counter = FlopCounter.of(loaded_model.config)
    assert sum(c[5] for c in chunks) == counter.chunk(len(ids), 0, 1)
    assert [c[5] for c in chunks] == [c[6] for c in chunks]   # alone in each step


def test_step_flops_count_the_whole_batch(loaded_model):
    recorder = RecordingRecorder()
    engine = LLMEngine(EngineConfig(num_kv_blocks=64, enable_prefix_caching=False),
                       loaded=loaded_model, recorder=recorder)
    first = question_ids(engine)
    engine.add_request("a", first, GREEDY)
    engine.step()                                   # a's prefill; it decodes from now on
    second = question_ids(engine, "Name three colors.")
    engine.add_request("b", second, GREEDY)
    engine.step()                                   # a decodes 1 token while b prefills
    [(_, _, _, _, _, flops, step_flops)] = [c for c in recorder.of("prefill_chunk")
                                            if c[1] == "b"]
    counter = FlopCounter.of(loaded_model.config)
    assert flops == counter.chunk(len(second), 0, 1)
    assert step_flops == flops + counter.chunk(1, len(first), 1)


def test_the_engine_times_the_model_load(monkeypatch, loaded_model):
    clock = TickClock()

    def slow_load(*_args):
        clock.now_ns += 2_500_000_000   # the load "takes" 2.5 s on the fake clock
        return loaded_model
    monkeypatch.setattr(llm_engine_module, "load_model", slow_load)
    engine = LLMEngine(EngineConfig(num_kv_blocks=16), clock_ns=clock)
    assert engine.model_load_s == pytest.approx(2.5, abs=1e-8)
    given = LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model, model_load_s=1.25)
    assert given.model_load_s == 1.25
    assert LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model).model_load_s is None


def test_warm_up_runs_prefill_and_batched_decodes_and_records_nothing(loaded_model):
    recorder = RecordingRecorder()
    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model, recorder=recorder)
    batches: list[list[int]] = []
    real_execute = engine.runner.execute

    def logged_execute(items):
        batches.append(sorted(len(it.token_ids) for it in items))
        return real_execute(items)
    engine.runner.execute = logged_execute

    seconds = engine.warm_up(prompt_tokens=40, decode_steps=3)
    assert seconds > 0 and engine.warmup_s == seconds
    assert batches[0] == [20, 40]          # both prompts prefilled in one pass
    assert [1, 1] in batches               # a batched decode
    assert [1] in batches                  # and a decode alone
    assert recorder.calls == []            # nothing reached the recorder
    assert engine.recorder is recorder     # and it is back
    assert not engine.has_unfinished()
    assert engine.block_manager.num_used_blocks == 0


def test_warm_up_changes_no_later_output(loaded_model):
    config = EngineConfig(num_kv_blocks=64)
    cold = LLMEngine(config, loaded=loaded_model)
    cold.add_request("r", question_ids(cold), GREEDY)
    expected = run_all(cold)["r"]
    warm = LLMEngine(config, loaded=loaded_model)
    warm.warm_up()
    seq = warm.add_request("r", question_ids(warm), GREEDY)
    assert seq.num_cached_tokens == 0      # the warm-up's prompts share no prefix with a chat
    assert run_all(warm)["r"] == expected


def test_a_failed_warm_up_frees_everything_and_restores_the_recorder(loaded_model):
    recorder = RecordingRecorder()
    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model, recorder=recorder)

    def broken(_items):
        raise RuntimeError("device lost")
    engine.runner.execute = broken
    with pytest.raises(RuntimeError, match="device lost"):
        engine.warm_up()
    assert engine.warmup_s is None and engine.recorder is recorder
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    assert not any(rid in engine._requests for rid in WARMUP_REQUEST_IDS)


def test_warm_up_refuses_a_busy_engine(loaded_model):
    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model)
    engine.add_request("r", question_ids(engine), GREEDY)
    with pytest.raises(RuntimeError, match="idle"):
        engine.warm_up()


def test_async_engine_admits_nothing_until_its_warm_up_is_done(loaded_model):
    import asyncio
    import threading
    import time

    from instrumented_engine.engine.async_engine import AsyncEngine, EngineWarmingUpError

    engine = LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model)
    gate, entered, real_warm_up = threading.Event(), threading.Event(), engine.warm_up

    def gated_warm_up():
        entered.set()
        assert gate.wait(60)
        return real_warm_up()
    engine.warm_up = gated_warm_up
    aengine = AsyncEngine(engine, warm_up=True)

    async def scenario() -> str:
        aengine.start()
        try:
            assert await asyncio.to_thread(entered.wait, 30)
            assert aengine.warming_up
            with pytest.raises(EngineWarmingUpError):
                await aengine.submit("early", prompt="Hi", sampling=GREEDY)
            assert not engine.has_unfinished()
            gate.set()
            deadline = time.monotonic() + 60
            while aengine.warming_up and time.monotonic() < deadline:
                await asyncio.sleep(0.01)   # polling a condition with a deadline
            assert not aengine.warming_up and engine.warmup_s > 0
            return "".join([d async for d in aengine.generate("r", prompt="Hi", sampling=GREEDY)])
        finally:
            gate.set()
            aengine.stop()
    assert asyncio.run(scenario())
