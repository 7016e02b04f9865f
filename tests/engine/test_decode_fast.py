"""The decode step's flat loop (instrumented_engine/model/decode_fast.py) against the generic
forward it stands in for: the same logits bit for bit, for every plan this host runs (an
AVX-512 host runs its own plan and the AVX2 one), and only on decode-only steps."""
from __future__ import annotations

import pytest
import torch

from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner
from instrumented_engine.model.decode_fast import DecodeFastPath
from instrumented_engine.model.loader import load_model
from tests.engine.test_quant import RUNNABLE

BLOCK = 16
PROMPTS = [list(range(100 + i, 100 + i + n)) for i, n in enumerate((40, 7, 130, 16, 65))]


@pytest.fixture(scope="module", params=sorted(RUNNABLE))
def plan_model(request, gguf_path):
    loaded = load_model(gguf_path, device="cpu", capability=RUNNABLE[request.param])
    return request.param, loaded


def _tables(n: int) -> list[list[int]]:
    return [list(range(i * 10, (i + 1) * 10)) for i in range(n)]


class _Counting:
    """The flat loop, counting the steps it served."""

    def __init__(self, inner: DecodeFastPath) -> None:
        self.inner, self.steps = inner, 0

    def forward(self, *args):
        self.steps += 1
        return self.inner.forward(*args)


def _decode_logits(loaded, prompts: list[list[int]], fast: bool) -> torch.Tensor:
    """Prefill each prompt, then one decode step of all of them, with the flat loop on or off
    (on: it must serve exactly that step, the prefills being the generic forward's)."""
    model = loaded.model
    saved = model.decode_fast
    counting = _Counting(saved)
    model.decode_fast = counting if fast else None
    try:
        runner = ModelRunner(loaded, num_kv_blocks=10 * len(prompts), block_size=BLOCK)
        tables = _tables(len(prompts))
        for prompt, table in zip(prompts, tables):
            runner.execute([ForwardItem(prompt, 0, table, True)])
        logits = runner.execute([ForwardItem([7 + i], len(p), t, True)
                                 for i, (p, t) in enumerate(zip(prompts, tables))])
    finally:
        model.decode_fast = saved
    assert counting.steps == (1 if fast else 0)
    return logits


def test_built_where_every_layer_has_the_fused_ops(plan_model):
    path, loaded = plan_model
    fast = loaded.model.decode_fast
    # make test builds the fused library (gcc): every plan with fused ops gets the loop.
    assert (fast is not None) == loaded.cpu_plan.fused_ops, path
    if fast is not None:
        assert len(fast.layers) == loaded.config.num_layers


def test_the_q4_1_linears_are_called_raw_exactly_where_the_plan_gives_them_the_step(plan_model):
    # The raw call skips the wrapper's ~5 µs; a row count past the q4_1 tier (or a plan
    # without it) must take the linear's own kernels instead, or it would run q4_1 where
    # torch's int4 or oneDNN is the measured choice.
    path, loaded = plan_model
    fast = loaded.model.decode_fast
    if fast is None:
        return
    q4_rows = max((tier.max_rows for tier in loaded.cpu_plan.layers if tier.format == "q4_1"),
                  default=0)
    for rows in range(1, q4_rows + 3):
        entries = [entry for layer in fast._raw_q4_for(rows) for entry in layer]
        assert len(entries) == 4 * loaded.config.num_layers
        assert all((entry is not None) == (rows <= q4_rows) for entry in entries), (path, rows)


@pytest.mark.parametrize("num_seqs", [1, 2, 3, 5])
def test_a_decode_step_gives_the_generic_forwards_logits_exactly(plan_model, num_seqs):
    path, loaded = plan_model
    if loaded.model.decode_fast is None:
        assert path == "portable"          # nothing to compare: the generic forward runs
        return
    prompts = PROMPTS[:num_seqs]
    fast = _decode_logits(loaded, prompts, fast=True)
    generic = _decode_logits(loaded, prompts, fast=False)
    assert fast.shape == (num_seqs, loaded.config.vocab_size)
    assert torch.isfinite(fast).all()
    assert torch.equal(fast, generic), (fast - generic).abs().max()


def test_only_decode_only_steps_take_it(plan_model):
    _, loaded = plan_model
    runner = ModelRunner(loaded, num_kv_blocks=20, block_size=BLOCK)
    decode = runner._prepare([ForwardItem([5], 3, [0], True)]).meta
    mixed = runner._prepare([ForwardItem([5], 3, [0], True),
                             ForwardItem([1, 2, 3], 0, [1], True)]).meta
    prefill = runner._prepare([ForwardItem([1, 2, 3], 0, [1], True)]).meta
    assert DecodeFastPath.serves(decode)
    assert not DecodeFastPath.serves(mixed) and not DecodeFastPath.serves(prefill)


def test_a_cache_it_cannot_read_is_refused(plan_model):
    path, loaded = plan_model
    fast = loaded.model.decode_fast
    if fast is None:
        assert path == "portable"          # no loop to refuse anything
        return
    runner = ModelRunner(loaded, num_kv_blocks=4, block_size=BLOCK)
    batch = runner._prepare([ForwardItem([5], 3, [0], True)])
    fp32_caches = [(k.float(), v.float()) for k, v in runner.kv_caches]
    with pytest.raises(ValueError, match="k_cache"):
        fast.forward(batch.input_ids, batch.positions, batch.meta, fp32_caches)
