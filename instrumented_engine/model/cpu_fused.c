/* The fused bf16 kernels of the CPU decode step (cpu_fused.py builds and loads this file).

   Why hand-written: at one token a step, the work of these steps is a few hundred
   multiply-adds, and torch's eager ops spend their time in dispatch. `F.rms_norm` on one
   bf16 row of 576 is ~11 us (its CPU path is several ops), the residual add ~1 us, and rope
   plus the two KV-cache writes ~14 us over five ops. docs/reference.md, "Fused CPU ops", has
   the before/after; tests/engine/test_cpu_fused.py checks both kernels against the torch
   ops they replace.

   bf16 is handled as its bits (the top half of an IEEE float), math is fp32, and every
   result is rounded to nearest even once. The norm and rope kernels are single-threaded (a
   few hundred multiply-adds a token); decode attention, which reads every cached key, splits
   its work over OpenMP threads. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

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

/* gate_up [rows, 2 * width]: each row the gate, then the up projection (the fused gate_up
   matmul's output). out [rows, width] = bf16(bf16(silu(gate)) * up), rounded where torch's
   `F.silu(gate) * up` rounds: after the silu and after the product. One call in place of
   `chunk`, `silu` and `mul` (~6 us of dispatch a layer at one row). */
void silu_mul_bf16(const uint16_t *gate_up, int64_t rows, int64_t width, uint16_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + r * 2 * width, *up = gate + width;
        uint16_t *outr = out + r * width;
        #pragma omp simd
        for (int64_t i = 0; i < width; i++) {
            const float g = bf16_to_f32(gate[i]);
            const float silu = bf16_to_f32(f32_to_bf16(g / (1.0f + expf(-g))));
            outr[i] = f32_to_bf16(silu * bf16_to_f32(up[i]));
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

/* glibc's vector math library (libmvec) has expf for 16 lanes; declaring it SIMD-callable is
   what <math.h> itself does under -ffast-math, which this file avoids (it would drop NaN and
   inf handling everywhere). */
#pragma omp declare simd notinbranch
float expf(float);

/* Position `pos` of one kv head in a cache [blocks, block_size, num_kv_heads, head_dim],
   found through the sequence's block table, converted to fp32 into row[head_dim]. */
static inline void cached_row_f32(const uint16_t *cache, const int64_t *table, int64_t pos,
                                  int64_t block_size, int64_t slot_stride, int64_t head_offset,
                                  int64_t head_dim, float *row) {
    const uint16_t *src = cache + (table[pos / block_size] * block_size + pos % block_size)
                                  * slot_stride + head_offset;
    #pragma omp simd
    for (int64_t d = 0; d < head_dim; d++) row[d] = bf16_to_f32(src[d]);
}

/* Attention of one kv head's `group` queries (fp32, pre-scaled, [group, HD]) over `len` cached
   positions, through one block table; out [group, HD] in bf16. HD is a compile-time constant
   in the instances below (no loop epilogues: at one query per sequence, loop overhead is
   what a naive version spends its time on); scores holds group * len floats. */
#define DEFINE_HEAD_ATTENTION(NAME, HD)                                                        \
static void NAME(const float *qf, int64_t group, const uint16_t *k_cache,                      \
                 const uint16_t *v_cache, const int64_t *table, int64_t len,                   \
                 int64_t block_size, int64_t slot_stride, int64_t head_offset,                 \
                 float *scores, uint16_t *out) {                                               \
    const int64_t head_dim = (HD);                                                             \
    for (int64_t pos = 0; pos < len; pos++) {                                                  \
        float kf[HD];                                                                          \
        cached_row_f32(k_cache, table, pos, block_size, slot_stride, head_offset, HD, kf);     \
        for (int64_t j = 0; j < group; j++) {                                                  \
            const float *qj = qf + j * head_dim;                                               \
            float dot = 0.0f;                                                                  \
            _Pragma("omp simd reduction(+:dot)")                                               \
            for (int64_t d = 0; d < head_dim; d++) dot += qj[d] * kf[d];                       \
            scores[j * len + pos] = dot;                                                       \
        }                                                                                      \
    }                                                                                          \
    for (int64_t j = 0; j < group; j++) {                                                      \
        float *row = scores + j * len;                                                         \
        float top = -INFINITY;                                                                 \
        for (int64_t pos = 0; pos < len; pos++) top = row[pos] > top ? row[pos] : top;        \
        float total = 0.0f;                                                                    \
        _Pragma("omp simd reduction(+:total)")                                                 \
        for (int64_t pos = 0; pos < len; pos++) {                                              \
            row[pos] = expf(row[pos] - top);                                                   \
            total += row[pos];                                                                 \
        }                                                                                      \
        const float inv_total = 1.0f / total;                                                  \
        _Pragma("omp simd")                                                                    \
        for (int64_t pos = 0; pos < len; pos++) row[pos] *= inv_total;                         \
    }                                                                                          \
    float acc[8][HD];          /* group <= 8, checked by the caller */                         \
    for (int64_t j = 0; j < group; j++) {                                                      \
        _Pragma("omp simd")                                                                    \
        for (int64_t d = 0; d < head_dim; d++) acc[j][d] = 0.0f;                               \
    }                                                                                          \
    for (int64_t pos = 0; pos < len; pos++) {                                                  \
        float vf[HD];                                                                          \
        cached_row_f32(v_cache, table, pos, block_size, slot_stride, head_offset, HD, vf);     \
        for (int64_t j = 0; j < group; j++) {                                                  \
            const float p = scores[j * len + pos];                                             \
            _Pragma("omp simd")                                                                \
            for (int64_t d = 0; d < head_dim; d++) acc[j][d] += p * vf[d];                     \
        }                                                                                      \
    }                                                                                          \
    for (int64_t j = 0; j < group; j++) {                                                      \
        _Pragma("omp simd")                                                                    \
        for (int64_t d = 0; d < head_dim; d++) out[j * head_dim + d] = f32_to_bf16(acc[j][d]); \
    }                                                                                          \
}

DEFINE_HEAD_ATTENTION(head_attention_64, 64)
DEFINE_HEAD_ATTENTION(head_attention_128, 128)

/* One new query per sequence against its cached keys, read through its block table: no
   gather. q [seqs, num_heads, head_dim], sequence s's row starting at s * q_stride; k_cache /
   v_cache [blocks, block_size, num_kv_heads, head_dim]; block_tables [seqs, max_blocks];
   sequence s attends to its first context_lens[s] positions. The num_heads / num_kv_heads
   (at most 8) query heads that share a kv head are scored together, so GQA reads each key
   once. head_dim is 64 or 128. scores: caller's workspace of (num_heads / num_kv_heads) *
   max_len floats for each of `threads` threads, max_len = max(context_lens). out [seqs,
   num_heads, head_dim]. */
void paged_decode_attention_bf16(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache,
                                 const uint16_t *v_cache, const int64_t *block_tables,
                                 int64_t max_blocks, const int64_t *context_lens,
                                 int64_t seqs, int64_t num_heads, int64_t num_kv_heads,
                                 int64_t head_dim, int64_t block_size, float scale,
                                 float *scores, int64_t max_len, int64_t threads, uint16_t *out) {
    const int64_t group = num_heads / num_kv_heads;
    const int64_t slot_stride = num_kv_heads * head_dim;
    /* (sequence, kv head) pairs are independent: split them over torch's own OpenMP threads
       (the same libgomp, so no second pool competes for the cores). One sequence stays on
       this thread: waking the other for its few heads cost more than it saved (bench/
       cpu_ops.py: 28.7 µs on two threads, 23.5 on one, SmolLM2 at 272 keys). */
    #pragma omp parallel for schedule(static) num_threads(threads) if (seqs > 1)
    for (int64_t item = 0; item < seqs * num_kv_heads; item++) {
        const int64_t s = item / num_kv_heads, h = item % num_kv_heads;
        float qf[8 * 128];
        const uint16_t *qh = q + s * q_stride + h * group * head_dim;
        for (int64_t i = 0; i < group * head_dim; i++) qf[i] = bf16_to_f32(qh[i]) * scale;
        float *own_scores = scores + (int64_t)omp_get_thread_num() * group * max_len;
        uint16_t *oh = out + (s * num_heads + h * group) * head_dim;
        /* max_len sizes the workspace; the runner makes it max(context_lens), and the clamp
           only keeps a caller's mistake inside the buffer. */
        const int64_t len = context_lens[s] < max_len ? context_lens[s] : max_len;
        (head_dim == 64 ? head_attention_64 : head_attention_128)(
            qf, group, k_cache, v_cache, block_tables + s * max_blocks, len,
            block_size, slot_stride, h * head_dim, own_scores, oh);
    }
}
