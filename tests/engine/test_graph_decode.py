"""The decode step in fixed shapes (`instrumented_engine/engine/decode_graphs.py`): on the CPU
its forward runs eagerly, and its logits and KV writes must be the generic forward's, for any
number of sequences padded into a bucket; padding rows write only the scratch block; steps
outside the buckets fall back to the generic forward; capture happens on CUDA only."""
from __future__ import annotations

import random
import types

import pytest
import torch

from instrumented_engine.__main__ import _parser
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.decode_graphs import (
    GraphPlan,
    StaticDecode,
    batch_buckets,
    key_buckets,
    plan_for,
)
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner
from instrumented_engine.model.llama import LlamaForCausalLM, ModelConfig

BLOCK = 4
NUM_BLOCKS = 48
CONFIG = ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).eval()
    model.init_rope(torch.device("cpu"))
    return types.SimpleNamespace(config=CONFIG, model=model, device=torch.device("cpu"),
                                 dtype=torch.float32)


def plan(max_seqs: int = 8, max_context: int = 64) -> GraphPlan:
    # Small key buckets for the tiny model: 16, 24, 32 ... keys rather than 256 and up.
    return GraphPlan(batch_buckets(max_seqs), key_buckets(-(-max_context // BLOCK), 4), BLOCK)


def prompts_and_tables(lengths: list[int], seed: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of the given lengths and block tables drawn from shuffled blocks (with room for
    a few decoded tokens), so neighbouring sequences' blocks interleave in the cache."""
    rng = random.Random(seed)
    blocks = list(range(NUM_BLOCKS))
    rng.shuffle(blocks)
    prompts, tables = [], []
    for n in lengths:
        need = -(-(n + 4) // BLOCK)
        tables.append([blocks.pop() for _ in range(need)])
        prompts.append([rng.randrange(3, 100) for _ in range(n)])
    return prompts, tables


def prefilled(tiny, graph_plan, prompts, tables) -> ModelRunner:
    runner = ModelRunner(tiny, NUM_BLOCKS, BLOCK, graph_plan)
    runner.execute([ForwardItem(p, 0, t, True) for p, t in zip(prompts, tables)])
    return runner


@pytest.mark.parametrize("lengths", [[5], [3, 9], [1, 16, 7], [12, 2, 20, 4, 8, 17]],
                         ids=["1-seq", "2-seqs", "3-seqs-pad-to-4", "6-seqs-pad-to-8"])
def test_static_decode_logits_and_kv_equal_the_generic_forwards(tiny, lengths):
    prompts, tables = prompts_and_tables(lengths)
    generic = prefilled(tiny, None, prompts, tables)
    static = prefilled(tiny, plan(), prompts, tables)
    assert static.decode_graphs is not None and static.decode_graphs.report.mode == "eager"
    tokens = [p[-1] for p in prompts]
    for step in range(3):     # three steps: the buffers are refilled, stale rows stay masked
        items = [ForwardItem([tok], n + step, t, True)
                 for tok, n, t in zip(tokens, lengths, tables)]
        ran = []
        original = StaticDecode.forward
        StaticDecode.forward = lambda self: (ran.append(self.batch), original(self))[1]
        try:
            got = static.execute(items)
        finally:
            StaticDecode.forward = original
        want = generic.execute(items)
        bucket = next(b for b in batch_buckets(8) if b >= len(lengths))
        assert ran == [bucket]                            # the static path, padded to its bucket
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # The live blocks hold the same K/V; only the scratch block (the last) is extra.
        torch.testing.assert_close(static.kv_cache[:, :, :NUM_BLOCKS], generic.kv_cache,
                                   atol=1e-6, rtol=1e-5)
        tokens = want.argmax(-1).tolist()


def test_padding_rows_write_only_the_scratch_block(tiny):
    prompts, tables = prompts_and_tables([6, 11, 3])
    runner = prefilled(tiny, plan(), prompts, tables)
    before = runner.kv_cache.clone()
    items = [ForwardItem([7], n, t, True) for n, t in zip([6, 11, 3], tables)]
    runner.execute(items)                                  # 3 sequences in the bucket of 4
    changed = (runner.kv_cache != before).flatten(4).any(-1)   # [layers, k/v, blocks, bs]
    written = {(t[p // BLOCK], p % BLOCK) for t, p in zip(tables, [6, 11, 3])}
    touched = {(b, s) for b, s in changed.any(0).any(0).nonzero().tolist()}
    assert touched - {(NUM_BLOCKS, 0)} == written          # the live slots, and scratch slot 0
    assert (NUM_BLOCKS, 0) in touched                      # the padding row wrote there


def test_rows_without_logits_are_left_out(tiny):
    prompts, tables = prompts_and_tables([4, 9, 6])
    generic = prefilled(tiny, None, prompts, tables)
    static = prefilled(tiny, plan(), prompts, tables)
    items = [ForwardItem([5], n, t, want) for n, t, want in
             zip([4, 9, 6], tables, [True, False, True])]
    got, want = static.execute(items), generic.execute(items)
    assert got.shape == (2, CONFIG.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["more-seqs-than-the-largest-bucket", "context-past-the-buckets",
                                  "a-prefill-chunk-in-the-step"])
def test_steps_outside_the_buckets_run_the_generic_forward(tiny, case):
    small = GraphPlan((1, 2), (4,), BLOCK)                  # 2 sequences, 16 keys at most
    lengths = {"more-seqs-than-the-largest-bucket": [3, 5, 7],
               "context-past-the-buckets": [3, 20], "a-prefill-chunk-in-the-step": [3, 5]}[case]
    prompts, tables = prompts_and_tables(lengths)
    generic = prefilled(tiny, None, prompts, tables)
    static = prefilled(tiny, small, prompts, tables)
    items = [ForwardItem([9], n, t, True) for n, t in zip(lengths, tables)]
    if case == "a-prefill-chunk-in-the-step":
        items[1] = ForwardItem([9, 10], lengths[1], tables[1], True)
    calls = []
    original = StaticDecode.forward
    StaticDecode.forward = lambda self: (calls.append(self.batch), original(self))[1]
    try:
        got = static.execute(items)
    finally:
        StaticDecode.forward = original
    assert calls == []
    torch.testing.assert_close(got, generic.execute(items), atol=1e-5, rtol=1e-5)


def test_bucket_choice():
    grid = GraphPlan.make(max_num_seqs=64, max_context=8192, block_size=16)
    assert grid.batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert [k * 16 for k in grid.key_blocks] == [256, 384, 512, 768, 1024, 1536, 2048, 3072,
                                                 4096, 6144, 8192]
    assert grid.pick(1, 2049) == (1, 192)         # 3,072 keys for a 2,049-token context
    assert grid.pick(33, 100) == (64, 16)
    assert grid.pick(65, 100) is None and grid.pick(1, 8193) is None
    # A longer model is still captured only up to MAX_CAPTURED_CONTEXT.
    assert GraphPlan.make(4, 131072, 16).key_blocks[-1] * 16 == 8192
    assert batch_buckets(1) == (1,) and batch_buckets(48)[-2:] == (32, 48)


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "enforce-eager"])
def test_capture_reports_the_mode_of_the_device_it_runs_on(tiny, enforce_eager):
    # This host's device: on CUDA the buckets are captured (or off with --enforce-eager); on
    # the CPU nothing is captured, the runner reports its eager static path.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graph_plan, off = plan_for(device, enforce_eager, 4, 64, BLOCK)
    if device.type == "cpu":
        assert graph_plan is None and off.describe() == "cuda graphs: off (cpu: decode runs its CPU path)"
        runner = ModelRunner(tiny, NUM_BLOCKS, BLOCK, plan(4))   # the static path, asked for
        report = runner.capture_decode_graphs()
        assert (report.mode, report.graphs) == ("eager", 0) and runner.decode_graphs.graphs == {}
        assert runner.last_decode_device_ms() is None
    elif enforce_eager:
        assert graph_plan is None and off.detail == "--enforce-eager"
    else:
        model = LlamaForCausalLM(CONFIG).to(device).eval()
        model.init_rope(device)
        on_device = types.SimpleNamespace(config=CONFIG, model=model, device=device,
                                          dtype=torch.float32)
        runner = ModelRunner(on_device, NUM_BLOCKS, BLOCK, graph_plan)
        report = runner.capture_decode_graphs()
        assert report.mode == "captured" and report.graphs == len(graph_plan), report
    assert ModelRunner(tiny, NUM_BLOCKS, BLOCK).capture_decode_graphs() is None


def test_enforce_eager_is_a_flag_and_reaches_the_config():
    assert EngineConfig().enforce_eager is False
    assert _parser().parse_args(["serve"]).enforce_eager is False
    assert _parser().parse_args(["serve", "--enforce-eager"]).enforce_eager is True


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["default", "enforce-eager"])
def test_the_engine_on_this_host_says_how_it_decodes(loaded_model, enforce_eager):
    engine = LLMEngine(EngineConfig(num_kv_blocks=64, enforce_eager=enforce_eager),
                       loaded=loaded_model)
    engine.warm_up(prompt_tokens=16, decode_steps=2)
    line = engine.decode_graphs.describe()
    if loaded_model.device.type == "cpu":     # the CPU path, unchanged: no static buffers
        assert engine.runner.decode_graphs is None
        assert line == "cuda graphs: off (cpu: decode runs its CPU path)"
        assert engine.runner.kv_cache.shape[2] == 64
    elif enforce_eager:
        assert line == "cuda graphs: off (--enforce-eager)"
    else:
        assert line.startswith("cuda graphs: ") and "captured" in line


def test_the_static_forward_reads_no_data_on_the_host():
    # What a CUDA graph needs, checked where no GPU is: on the meta device no tensor has
    # data, so a shape or a branch that depended on the step's values (an .item(), a
    # nonzero, a max context read back) would raise. The buffers' shapes are the bucket's.
    with torch.device("meta"):
        model = LlamaForCausalLM(CONFIG).eval()
    model.init_rope(torch.device("meta"))
    kv = torch.zeros(CONFIG.num_layers, 2, NUM_BLOCKS + 1, BLOCK, CONFIG.num_kv_heads,
                     CONFIG.head_dim, device="meta")
    logits = torch.zeros(4, CONFIG.vocab_size, device="meta")
    step = StaticDecode(model, [(layer[0], layer[1]) for layer in kv], 4, 6, BLOCK, NUM_BLOCKS,
                        logits, torch.float32)
    with torch.inference_mode():
        step.forward()
    assert step.block_tables.shape == (4, 6) and step.logits.shape == (4, CONFIG.vocab_size)
