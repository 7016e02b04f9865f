"""Our paged forward pass against transformers' LlamaForCausalLM on the same GGUF weights."""
from __future__ import annotations

import random

import pytest
import torch

from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner

BLOCK_SIZE = 16
NUM_BLOCKS = 96
TOLERANCE = 1e-3
PROMPTS = {
    "en": "Explain in two sentences why the sky is blue.",
    "zh": "请用两句话解释为什么天空是蓝色的。",
}


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture()
def runner(loaded_model):
    runner = ModelRunner(loaded_model, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    # Loud garbage in every slot: reading a slot that was never written (a mask or slot
    # mapping off by one) then moves the logits far instead of by a rounding error.
    runner.kv_cache.normal_(0.0, 30.0, generator=torch.Generator().manual_seed(0))
    return runner


def chat_ids(loaded_model, text: str) -> list[int]:
    prompt = loaded_model.chat_template.render([{"role": "user", "content": text}])
    return loaded_model.tokenizer.encode(prompt)


def scattered_blocks(num_blocks: int, seed: int) -> list[int]:
    """Non-contiguous, out-of-order block ids, so a wrong slot mapping cannot pass by luck."""
    return random.Random(seed).sample(range(NUM_BLOCKS), num_blocks)


def disjoint_tables(num_tables: int, blocks_each: int) -> list[list[int]]:
    blocks = scattered_blocks(num_tables * blocks_each, seed=num_tables)
    return [blocks[i * blocks_each:(i + 1) * blocks_each] for i in range(num_tables)]


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]          # [len(ids), vocab]


def prefill_in_chunks(runner, ids, table, chunk_ends) -> torch.Tensor:
    """Feed ids in chunks ending at chunk_ends; logits [len(chunk_ends), vocab] at each end."""
    rows, start = [], 0
    for end in chunk_ends:
        rows.append(runner.execute([ForwardItem(ids[start:end], start, table, True)])[0])
        start = end
    return torch.stack(rows)


@pytest.mark.parametrize("lang", sorted(PROMPTS))
def test_chunked_prefill_logits_match_transformers(loaded_model, hf_model, runner, lang):
    ids = chat_ids(loaded_model, PROMPTS[lang])
    assert len(ids) > 2 * BLOCK_SIZE    # the chunks below straddle block boundaries
    chunk_ends = [BLOCK_SIZE + 3, 2 * BLOCK_SIZE + 1, len(ids)]
    table = scattered_blocks(-(-len(ids) // BLOCK_SIZE), seed=len(lang))

    ours = prefill_in_chunks(runner, ids, table, chunk_ends)
    reference = hf_logits(hf_model, ids)[[end - 1 for end in chunk_ends]]

    assert ours.shape == (3, loaded_model.config.vocab_size)
    assert (ours - reference).abs().max().item() <= TOLERANCE


def greedy_generate(runner, ids: list[int], num_tokens: int, eos_ids) -> list[int]:
    num_blocks = -(-(len(ids) + num_tokens) // BLOCK_SIZE)
    table = scattered_blocks(num_blocks, seed=7)
    half = len(ids) // 2
    prefill_in_chunks(runner, ids, table, [half])
    logits = runner.execute([ForwardItem(ids[half:], half, table, True)])
    out: list[int] = []
    while True:
        token = int(logits[0].argmax())
        out.append(token)
        if token in eos_ids or len(out) == num_tokens:
            return out
        logits = runner.execute([ForwardItem([token], len(ids) + len(out) - 1, table, True)])


def test_greedy_generation_matches_transformers(loaded_model, hf_model, runner):
    ids = chat_ids(loaded_model, "What is the capital of France?")
    ours = greedy_generate(runner, ids, 32, loaded_model.eos_token_ids)
    with torch.no_grad():
        generated = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                      eos_token_id=list(loaded_model.eos_token_ids))
    assert ours == generated[0, len(ids):].tolist()
    assert "Paris" in loaded_model.tokenizer.decode(ours)


def test_batch_computes_the_same_logits_as_each_sequence_alone(loaded_model, runner):
    texts = ["Hi!", "Name three primary colours.", "写一首关于大海的短诗，每行五个字，一共四行。"]
    prompts = [chat_ids(loaded_model, t) for t in texts]
    # Alone and together use different blocks, so neither can reuse the other's KV.
    alone_tables, tables = disjoint_tables(6, 8)[:3], disjoint_tables(6, 8)[3:]
    continuation = [11, 22, 33]

    def steps_alone(i):
        ids, table = prompts[i], alone_tables[i]
        first = runner.execute([ForwardItem(ids, 0, table, True)])[0]
        decoded = runner.execute([ForwardItem([continuation[i]], len(ids), table, True)])[0]
        return first, decoded

    alone = [steps_alone(i) for i in range(3)]

    # Step 1, mixed: 0 prefills whole, 1 prefills its first chunk (no logits), 2 prefills all.
    split = len(prompts[1]) // 2
    step1 = runner.execute([ForwardItem(prompts[0], 0, tables[0], True),
                            ForwardItem(prompts[1][:split], 0, tables[1], False),
                            ForwardItem(prompts[2], 0, tables[2], True)])
    # Step 2, mixed: 0 and 2 decode (different context lengths), 1 finishes its prefill.
    step2 = runner.execute([ForwardItem([continuation[0]], len(prompts[0]), tables[0], True),
                            ForwardItem(prompts[1][split:], split, tables[1], True),
                            ForwardItem([continuation[2]], len(prompts[2]), tables[2], True)])
    # Step 3: a pure decode batch.
    step3 = runner.execute([ForwardItem([continuation[1]], len(prompts[1]), tables[1], True)])

    assert step1.shape[0] == 2 and step2.shape[0] == 3
    pairs = [(step1[0], alone[0][0]), (step1[1], alone[2][0]), (step2[0], alone[0][1]),
             (step2[1], alone[1][0]), (step2[2], alone[2][1]), (step3[0], alone[1][1])]
    for batched, single in pairs:
        assert (batched - single).abs().max().item() <= TOLERANCE


def test_decode_batch_matches_single_decodes(loaded_model, runner):
    prompts = [chat_ids(loaded_model, t) for t in ("One.", "Count from one to twenty in words, please.")]
    tables = disjoint_tables(4, 4)      # two copies of each sequence, in different blocks
    for ids, table in zip(prompts + prompts, tables):
        runner.execute([ForwardItem(ids, 0, table, False)])
    items = [ForwardItem([42], len(ids), table, True) for ids, table in zip(prompts + prompts, tables)]
    together = runner.execute(items[:2])
    singles = torch.cat([runner.execute([item]) for item in items[2:]])
    assert (together - singles).abs().max().item() <= TOLERANCE
    assert (together[0] - together[1]).abs().max().item() > 1.0   # the rows are not one sequence


@pytest.mark.parametrize("item, message", [
    (ForwardItem(list(range(20)), 0, [0], True), "KV blocks needed"),
    (ForwardItem([5], 0, [NUM_BLOCKS], True), "out of range"),
    (ForwardItem([], 0, [0], True), "needs tokens"),
])
def test_bad_items_are_rejected_before_touching_the_cache(runner, item, message):
    before = runner.kv_cache.clone()
    with pytest.raises(ValueError, match=message):
        runner.execute([ForwardItem([1, 2], 0, [1], True), item])
    assert torch.equal(runner.kv_cache, before)


def test_empty_step_returns_no_rows(loaded_model, runner):
    assert runner.execute([]).shape == (0, loaded_model.config.vocab_size)
