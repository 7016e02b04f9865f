"""FLOPs from the model shape (instrumented_engine/model/flops.py), against a hand count for
SmolLM2-135M and the real model's parameter count."""
from __future__ import annotations

from instrumented_engine.model.flops import FlopCounter, chunk_flops
from instrumented_engine.model.llama import ModelConfig

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                      num_heads=9, num_kv_heads=3)


def test_hand_count_for_smollm2():
    # Per layer: q 576x576, k and v 576x192 (3 kv heads x 64), o 576x576, gate/up/down 576x1536.
    per_layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536
    assert per_layer == 3_538_944
    matmul_params = 30 * per_layer                          # 106,168,320
    # 512 new tokens after 256 cached: 512·256 + 512·513/2 = 262,400 (query, key) pairs.
    pairs = 512 * 256 + 512 * 513 // 2
    attention = 30 * 9 * (2 * 64 + 2 * 64) * pairs          # q·kᵀ and p·v per head and layer
    lm_head = 2 * 576 * 49152
    expected = 2 * matmul_params * 512 + attention + lm_head
    assert expected == 126_910_070_784   # 108.7 G matmuls + 18.1 G attention + 0.06 G lm_head
    assert chunk_flops(SMOLLM2, 512, 256, 1) == expected
    assert chunk_flops(SMOLLM2, 512, 256, 0) == expected - lm_head


def test_the_counted_weights_are_the_real_models_less_embeddings_and_norms(loaded_model):
    config = loaded_model.config
    counter = FlopCounter.of(config)
    weights = sum(p.numel() for name, p in loaded_model.model.named_parameters()
                  if p.dim() == 2 and "embed" not in name and "lm_head" not in name)
    assert counter.matmul_params == weights


def test_chunks_add_up_to_the_prompt_at_once():
    """Causal pairs partition across chunks: any split of a prompt counts the same FLOPs."""
    whole = chunk_flops(SMOLLM2, 1000, 0, 1)
    for sizes in ([1000], [1, 999], [512, 488], [100] * 10, [7, 300, 693]):
        start, total = 0, 0
        for i, n in enumerate(sizes):
            total += chunk_flops(SMOLLM2, n, start, int(i == len(sizes) - 1))
            start += n
        assert total == whole, sizes
