"""A decode step of the CPU model without its per-layer Python: the same kernels in the same
order as `LlamaForCausalLM.forward`, called from one flat loop.

Why: on SmolLM2 (30 layers, one decoding row) the module calls, the fused ops' per-call checks
and the attention dispatch cost ~2.2 ms of a 9 ms step, ~70 µs a layer, more than the fused C
ops themselves (docs/figures.md, "Where one stream stands"). Here the weights and the layer
shapes are checked once, when the path is built; a step's inputs and block tables once per
step; the KV caches once for the tensors a runner keeps. Each layer then runs its norm, rope
and attention as raw C calls, its linears that take the hand-written q4_1 kernel at this
step's row count as raw C calls too (the wrapper and its checks were ~5 µs of a ~9 µs call),
and its other linears through their `CpuKernels`. The result is the generic path's, bit for
bit (tests/engine/test_decode_fast.py).

It serves steps whose every sequence decodes one token, on the CPU, in bf16, when every layer
has the fused ops (norm, rope and the paged decode attention); anything else takes the generic
forward.
"""
from __future__ import annotations

import weakref

import torch

from instrumented_engine.model.attention import AttentionMetadata
from instrumented_engine.model.cpu_fused import FusedCpuOps, require_bf16
from instrumented_engine.model.quant import Q4Weight


class DecodeFastPath:
    """Built by `LlamaForCausalLM.prepare_cpu_kernels` where it fits; `forward` is the
    decode-only step."""

    def __init__(self, model, fused: FusedCpuOps) -> None:
        cfg = model.config
        self.model = model
        self.kernels = fused.raw_kernels()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim, self.hidden = cfg.head_dim, cfg.hidden_size
        self.intermediate = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.scale = cfg.head_dim ** -0.5
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.layers = []
        self._checked_caches: list[weakref.ref] = []   # _check_caches
        self._raw_q4: dict[int, list[tuple]] = {}       # _raw_q4_for
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                require_bf16(norm.weight, "norm weight")
                if norm.weight.shape != (self.hidden,) or norm.eps != self.eps:
                    raise ValueError("decode fast path: a norm that does not fit the model")
            self.layers.append((layer.input_layernorm.weight.data_ptr(),
                                layer.post_attention_layernorm.weight.data_ptr(),
                                attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))

    def _raw_q4_for(self, rows: int) -> list[tuple]:
        """Per layer, for qkv, o, gate_up and down: the raw q4_1 call's weight arguments
        (packed, scale, minimum, n, k, and the `Q4Weight` itself, which keeps those pointers'
        memory alive) where that linear takes q4_1 at `rows` rows and has no bias, else None.
        Worked out once per row count: the tiers do not change while this path lives
        (`prepare_cpu_kernels` builds a new one with new kernels)."""
        plan = self._raw_q4.get(rows)
        if plan is None:
            plan = []
            for _, _, *linears in self.layers:
                entries = []
                for linear in linears:
                    q4 = linear.kernels.low_bit_for(rows) if linear.bias is None else None
                    entries.append((q4.packed.data_ptr(), q4.scale.data_ptr(),
                                    q4.minimum.data_ptr(), q4.packed.shape[0],
                                    2 * q4.packed.shape[1], q4)
                                   if isinstance(q4, Q4Weight) else None)
                plan.append(entries)
            self._raw_q4[rows] = plan
        return plan

    @classmethod
    def build(cls, model, fused: FusedCpuOps | None) -> DecodeFastPath | None:
        """The path, or None where a layer lacks a fused op (another attention shape, no
        library) or the model is not bf16."""
        if fused is None or model.embed_tokens.weight.dtype != torch.bfloat16:
            return None
        for layer in model.layers:
            if (layer.self_attn.fused_decode is None or layer.self_attn.fused is None
                    or layer.mlp.fused is None or layer.input_layernorm.fused is None
                    or layer.post_attention_layernorm.fused is None):
                return None
        return cls(model, fused)

    @staticmethod
    def serves(meta: AttentionMetadata) -> bool:
        """A step of decodes only."""
        return meta.prefill is None and meta.decode is not None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """As `LlamaForCausalLM.forward` for a decode-only step: hidden states [D, H]."""
        model, k = self.model, self.kernels
        decode = meta.decode
        rows = input_ids.shape[0]
        x = model.embed_tokens(input_ids)                                   # [D, H]
        cos = model.rope_cos.index_select(0, positions).unsqueeze(1)        # [D, 1, hd]
        sin_signed = model.rope_sin_signed.index_select(0, positions).unsqueeze(1)
        self._check_step(x, cos, sin_signed, meta, kv_caches)
        nh, kvh, hd, hidden, eps = (self.num_heads, self.num_kv_heads, self.head_dim,
                                    self.hidden, self.eps)
        row_stride = (nh + 2 * kvh) * hd
        tables, lens = decode.block_tables, decode.context_lens
        threads = torch.get_num_threads()
        scores = torch.empty(threads * self.group * decode.max_context_len, dtype=torch.float32)
        cos_p, sin_p, slots_p = cos.data_ptr(), sin_signed.data_ptr(), meta.slot_mapping.data_ptr()
        q4 = k.q4_matmul
        dtype, inter = x.dtype, self.intermediate
        # The MLP's own rule, decided once for the step's row count; `activation` reads no
        # weight, so the first layer's serves every layer where the rule says torch's ops.
        mlp = self.model.layers[0].mlp
        fused_act = mlp.fuses_activation(rows)

        def linear(raw, module, x_in):
            """`module.kernels(x_in, bias)`, as a raw q4_1 call where `raw` has its weight."""
            if raw is None:
                return module.kernels(x_in, module.bias)
            packed, scale, minimum, n, width, _ = raw
            y = torch.empty(rows, n, dtype=dtype)
            if q4(x_in.data_ptr(), rows, width, packed, scale, minimum, n, threads, y.data_ptr()):
                raise MemoryError(f"q4_matmul: no memory for {rows} x {width} activations")
            return y

        delta = None
        for (w_in, w_post, qkv_proj, o_proj, gate_up, down), (k_cache, v_cache), raw in zip(
                self.layers, kv_caches, self._raw_q4_for(rows)):
            h = torch.empty_like(x)
            k.add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(), w_in,
                           h.data_ptr(), rows, hidden, eps)
            qkv = linear(raw[0], qkv_proj, h)                               # [D, (nh+2kvh)·hd]
            k.rope_store_kv(qkv.data_ptr(), rows, row_stride, nh, kvh, hd, cos_p, sin_p,
                            slots_p, k_cache.data_ptr(), v_cache.data_ptr())
            out = torch.empty(rows, nh * hd, dtype=x.dtype)
            k.decode_attention(qkv.data_ptr(), row_stride, k_cache.data_ptr(),
                               v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
                               lens.data_ptr(), rows, nh, kvh, hd, k_cache.shape[1], self.scale,
                               scores.data_ptr(), decode.max_context_len, threads,
                               out.data_ptr())
            o = linear(raw[1], o_proj, out)
            h = torch.empty_like(x)
            k.add_rms_norm(x.data_ptr(), o.data_ptr(), w_post, h.data_ptr(), rows, hidden, eps)
            gate_up_out = linear(raw[2], gate_up, h)                        # [D, 2I]
            if fused_act:
                act = torch.empty(rows, inter, dtype=dtype)
                k.silu_mul(gate_up_out.data_ptr(), rows, inter, act.data_ptr())
            else:
                act = mlp.activation(gate_up_out)
            delta = linear(raw[3], down, act)
        return x + delta

    def _check_step(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                    meta: AttentionMetadata, kv_caches) -> None:
        """What `FusedCpuOps` checks on every call of each op, once for the whole step."""
        decode = meta.decode
        rows = x.shape[0]
        for tensor, name in ((x, "x"), (cos, "cos"), (sin_signed, "sin_signed")):
            require_bf16(tensor, name)
        tables, lens, slots = decode.block_tables, decode.context_lens, meta.slot_mapping
        if (meta.num_decode_tokens != rows or tables.shape[0] != rows or lens.shape != (rows,)
                or slots.shape != (rows,) or cos.shape != (rows, 1, self.head_dim)
                or any(t.dtype != torch.int64 or not t.is_contiguous()
                       for t in (tables, lens, slots))):
            raise ValueError("decode fast path: the step's tensors do not fit together")
        self._check_caches(kv_caches)
        if decode.max_context_len > tables.shape[1] * kv_caches[0][0].shape[1]:
            raise ValueError("decode fast path: the block tables are too short")

    def _check_caches(self, kv_caches) -> None:
        """Every layer's caches bf16, contiguous, one shape [blocks, bs, kvh, hd]: checked once
        for the caches a runner keeps (the same tensors every step, ~50 µs a step to check
        again), and again for any other. Held weakly: a runner's caches go with it."""
        flat = [t for pair in kv_caches for t in pair]
        if len(flat) == len(self._checked_caches) and all(
                ref() is t for ref, t in zip(self._checked_caches, flat)):
            return
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"decode fast path: {len(kv_caches)} KV caches for "
                             f"{len(self.layers)} layers")
        shape = kv_caches[0][0].shape
        for k_cache, v_cache in kv_caches:
            require_bf16(k_cache, "k_cache")
            require_bf16(v_cache, "v_cache")
            if (k_cache.shape != shape or v_cache.shape != shape
                    or shape[2:] != (self.num_kv_heads, self.head_dim)):
                raise ValueError("decode fast path: a KV cache of another shape")
        self._checked_caches = [weakref.ref(t) for t in flat]
