/* Two fused bf16 kernels for the CPU decode step (cpu_fused.py builds and loads this file).

   Why hand-written: at one token a step, the work of these steps is a few hundred
   multiply-adds, and torch's eager ops spend their time in dispatch. `F.rms_norm` on one
   bf16 row of 576 is ~11 us (its CPU path is several ops), the residual add ~1 us, and rope
   plus the two KV-cache writes ~14 us over five ops. docs/reference.md, "Fused CPU ops", has
   the before/after; tests/engine/test_cpu_fused.py checks both kernels against the torch
   ops they replace.

   bf16 is handled as its bits (the top half of an IEEE float), math is fp32, and every
   result is rounded to nearest even once. Single-threaded on purpose: linking a second
   OpenMP runtime next to torch's would fight it for the cores (docs/reference.md, "Engine
   weight formats"); `#pragma omp simd` only asks for vector code (-fopenmp-simd). */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((bits >> 16) | 0x0040u);          /* NaN stays a (quiet) NaN */
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);                  /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

/* x [rows, dim] is the residual stream. With `delta` (may be NULL) it first becomes
   bf16(x + delta), in place, as torch's `x = x + delta` would give. Then
   out = bf16(x / sqrt(mean(x^2) + eps) * weight). */
void add_rms_norm_bf16(uint16_t *x, const uint16_t *delta, const uint16_t *weight,
                       uint16_t *out, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *xr = x + r * dim;
        uint16_t *outr = out + r * dim;
        if (delta != NULL) {
            const uint16_t *dr = delta + r * dim;
            #pragma omp simd
            for (int64_t i = 0; i < dim; i++) {
                xr[i] = f32_to_bf16(bf16_to_f32(xr[i]) + bf16_to_f32(dr[i]));
            }
        }
        float sum_sq = 0.0f;
        #pragma omp simd reduction(+:sum_sq)
        for (int64_t i = 0; i < dim; i++) {
            float v = bf16_to_f32(xr[i]);
            sum_sq += v * v;
        }
        float inv_rms = 1.0f / sqrtf(sum_sq / (float)dim + eps);
        #pragma omp simd
        for (int64_t i = 0; i < dim; i++) {
            outr[i] = f32_to_bf16(bf16_to_f32(xr[i]) * inv_rms * bf16_to_f32(weight[i]));
        }
    }
}

/* qkv [tokens, row_stride]: each row holds q (num_q_heads heads), k and v (num_kv_heads
   each) of head_dim. Rotates q and k in place by their rows of cos / sin_signed
   ([tokens, head_dim], the half-split rope with rotate_half's sign folded into sin: out =
   x * cos + swap_halves(x) * sin_signed), then copies the rotated k and v of token t to
   slot slots[t] of k_cache / v_cache ([num_slots, num_kv_heads, head_dim]). */
void rope_store_kv_bf16(uint16_t *qkv, int64_t tokens, int64_t row_stride,
                        int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                        const uint16_t *cos, const uint16_t *sin_signed,
                        const int64_t *slots, uint16_t *k_cache, uint16_t *v_cache) {
    const int64_t half = head_dim / 2;
    const int64_t kv_size = num_kv_heads * head_dim;
    for (int64_t t = 0; t < tokens; t++) {
        uint16_t *row = qkv + t * row_stride;
        const uint16_t *c = cos + t * head_dim;
        const uint16_t *s = sin_signed + t * head_dim;
        for (int64_t h = 0; h < num_q_heads + num_kv_heads; h++) {
            uint16_t *x = row + h * head_dim;
            #pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float x1 = bf16_to_f32(x[i]), x2 = bf16_to_f32(x[i + half]);
                x[i] = f32_to_bf16(x1 * bf16_to_f32(c[i]) + x2 * bf16_to_f32(s[i]));
                x[i + half] = f32_to_bf16(x2 * bf16_to_f32(c[i + half]) + x1 * bf16_to_f32(s[i + half]));
            }
        }
        const uint16_t *k = row + num_q_heads * head_dim;
        memcpy(k_cache + slots[t] * kv_size, k, (size_t)kv_size * sizeof *k);
        memcpy(v_cache + slots[t] * kv_size, k + kv_size, (size_t)kv_size * sizeof *k);
    }
}
