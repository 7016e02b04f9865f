"""Floating-point operations of one forward chunk, from the model's shape alone.

What is counted (one multiply-add = 2 FLOPs), for a chunk of `n` new tokens whose first
token sits at absolute position `s` (so the context after the chunk is `c = s + n`):

- **matmuls with weights**, every layer: q, k, v, o and the gate, up, down projections,
  `2 · P · n` where `P` is the number of those weights (no embedding, no lm_head);
- **attention**, every layer and query head: the scores `q·kᵀ` and the weighted sum `p·v`,
  `2 · head_dim` FLOPs each per (query, key) pair. Causal: the token at position `p` sees
  `p + 1` keys, so the chunk has `n·s + n(n+1)/2` pairs, i.e. `n · c̄` with `c̄ = s + (n+1)/2`
  the mean context a query sees. Total `4 · layers · heads · head_dim · n · c̄`. Masked-out
  pairs an implementation may still multiply are *not* counted: this is the useful work,
  as MFU counts it;
- **lm_head**, `2 · hidden · vocab` per row whose logits are needed (the last token of a
  chunk that ends its prompt, or a decode step), not per token.

Not counted: the embedding gather, RMSNorm, RoPE, SiLU·mul, softmax, residual adds and
biases, all O(n · hidden) and well under 1 % of the above for any real model.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class FlopCounter:
    """The per-token constants of one model, so a chunk's count is a few integer ops.

    Built from anything with the fields of `instrumented_engine.model.llama.ModelConfig`.
    SmolLM2-135M: 106,168,320 weights in the layers' matmuls, a 576 x 49,152 lm_head.

    >>> from instrumented_engine.model.llama import ModelConfig
    >>> smollm2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
    ...                       num_layers=30, num_heads=9, num_kv_heads=3)
    >>> counter = FlopCounter.of(smollm2)
    >>> counter.matmul_params
    106168320
    >>> counter.chunk(1, 0, 0)        # one token, no logits: 2 P + 4 · 30 · 9 · 64 · 1 key
    212405760
    >>> counter.chunk(128, 0, 1) == (2 * 106168320 * 128 + 4 * 30 * 9 * 64 * (128 * 129 // 2)
    ...                              + 2 * 576 * 49152)
    True
    """

    matmul_params: int        # P: q, k, v, o, gate, up, down weights over all layers
    attention_per_pair: int   # 4 · layers · heads · head_dim: FLOPs per (query, key) pair
    lm_head_per_row: int      # 2 · hidden · vocab

    @classmethod
    def of(cls, config) -> "FlopCounter":
        hidden, inter = config.hidden_size, config.intermediate_size
        q_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        per_layer = (hidden * q_width          # q_proj
                     + 2 * hidden * kv_width   # k_proj, v_proj
                     + q_width * hidden        # o_proj
                     + 3 * hidden * inter)     # gate_proj, up_proj, down_proj
        return cls(matmul_params=config.num_layers * per_layer,
                   attention_per_pair=4 * config.num_layers * q_width,
                   lm_head_per_row=2 * hidden * config.vocab_size)

    def chunk(self, num_tokens: int, start_pos: int, num_logits_rows: int) -> int:
        """FLOPs of `num_tokens` new tokens at positions start_pos.. and `num_logits_rows`
        lm_head rows (0 or 1 for one sequence's chunk)."""
        pairs = num_tokens * start_pos + num_tokens * (num_tokens + 1) // 2
        return (2 * self.matmul_params * num_tokens + self.attention_per_pair * pairs
                + self.lm_head_per_row * num_logits_rows)


def chunk_flops(config, num_tokens: int, start_pos: int, num_logits_rows: int = 1) -> int:
    """FLOPs of one prefill chunk (or a decode step: `num_tokens=1`) for a model config.

    >>> from instrumented_engine.model.llama import ModelConfig
    >>> tiny = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=1,
    ...                    num_heads=2, num_kv_heads=1)
    >>> chunk_flops(tiny, 2, 0, 0)    # P = 16 + 8 + 8 + 16 + 96 = 144: 2·144·2 + 16 · 3 pairs
    624
    """
    return FlopCounter.of(config).chunk(num_tokens, start_pos, num_logits_rows)
