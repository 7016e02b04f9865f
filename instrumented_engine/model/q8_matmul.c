/* Weight-only int8 matmul for decode-sized steps (up to Q8_MAX_ROWS rows), built with the fused
   ops (cpu_fused.py) and wrapped by quant.py's Int8Weight: the LM head, which a GGUF keeps at
   8 bits ([49152, 576] for SmolLM2, 28 MB read every decode step).

   Why hand-written: torch's `_weight_int8pack_mm` converts every int8 code to a float before
   its FMA and took 3.0 ms of a one-row decode step on two AVX-512 threads (bench/step_profile.py:
   18 % of the step); this one is ~3x faster (bench/cpu_ops.py, docs/reference.md, "Engine
   weight formats").
   Here the activations are rounded to int16 per block of 32 (act_quant.h), so a block's 32
   products are one widening load and one s16 x s16 pair-product instruction (two with AVX2).

       y[r, n] = scale[n] * sum_b xd[r, b] * sum_j code[n, 32b + j] * xq[r, 32b + j]

   |code| <= 127 and |xq| <= 32767: a block's sum is below 2^27, exact in int32; the vector
   paths convert partial sums of two or four products (below 2^24) to float, exactly. A row
   with a NaN or an infinity gives NaN outputs, as a float matmul would.
   tests/engine/test_q8_matmul.py checks it against torch's kernel and float64 over the whole
   bf16 range. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "act_quant.h"
#include "bf16.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define Q8_MAX_ROWS 8

/* One output column for a compile-time number of rows R (accumulators in registers). */
static inline __attribute__((always_inline)) void q8_column(
        const int R, const int8_t *wrow, int64_t blocks, int64_t k, const int16_t *xq,
        const float *xd, float *total) {
#if defined(__AVX512BW__)
    __m512 acc[Q8_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; b++) {
        __m512i w = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256((const __m256i *)(wrow + b * ACT_BLOCK)));
        for (int r = 0; r < R; r++) {
            __m512i sums = _mm512_madd_epi16(
                w, _mm512_loadu_si512((const void *)(xq + r * k + b * ACT_BLOCK)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums),
                                     _mm512_set1_ps(xd[r * blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        total[r] = _mm512_reduce_add_ps(acc[r]);
    }
#elif defined(__AVX2__)
    __m256 acc[Q8_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *wb = wrow + b * ACT_BLOCK;
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 16)));
        for (int r = 0; r < R; r++) {
            const int16_t *xb = xq + r * k + b * ACT_BLOCK;
            __m256i sums = _mm256_add_epi32(
                _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xb)),
                _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xb + 16))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums),
                                     _mm256_set1_ps(xd[r * blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        total[r] = hsum256_ps(acc[r]);
    }
#else
    for (int r = 0; r < R; r++) {
        total[r] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            const int8_t *wb = wrow + b * ACT_BLOCK;
            const int16_t *xb = xq + r * k + b * ACT_BLOCK;
            int32_t dot = 0;
            for (int j = 0; j < ACT_BLOCK; j++) {
                dot += (int32_t)wb[j] * xb[j];
            }
            total[r] += (float)dot * xd[r * blocks + b];
        }
    }
#endif
}

/* out [rows, n] bf16 = x [rows, k] bf16 . W^T, W given as codes [n, k] int8 and scale [n]
   bf16 (w = code * scale). The output columns are split over `threads` OpenMP threads.
   0, or -1 when the activations' scratch could not be allocated (out is then unwritten). */
int q8_matmul_bf16(const uint16_t *x, int64_t rows, int64_t k, const int8_t *codes,
                   const uint16_t *scale, int64_t n, int64_t threads, uint16_t *out) {
    int bad[Q8_MAX_ROWS];
    act_scratch scratch;
    if (rows < 1 || rows > Q8_MAX_ROWS) {
        return -1;                                    /* the Python side checks rows */
    }
    if (act_scratch_alloc(&scratch, rows, k) != 0) {
        return -1;
    }
    const int64_t blocks = k / ACT_BLOCK;
    const int16_t *xq = scratch.xq;
    const float *xd = scratch.xd;
    quantize_rows(x, rows, k, scratch.xq, scratch.xd, scratch.xsum, bad);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t col = 0; col < n; col++) {
        const int8_t *wrow = codes + col * k;
        float total[Q8_MAX_ROWS];
        switch (rows) {
        case 1: q8_column(1, wrow, blocks, k, xq, xd, total); break;
        case 2: q8_column(2, wrow, blocks, k, xq, xd, total); break;
        case 3: q8_column(3, wrow, blocks, k, xq, xd, total); break;
        case 4: q8_column(4, wrow, blocks, k, xq, xd, total); break;
        case 5: q8_column(5, wrow, blocks, k, xq, xd, total); break;
        case 6: q8_column(6, wrow, blocks, k, xq, xd, total); break;
        case 7: q8_column(7, wrow, blocks, k, xq, xd, total); break;
        default: q8_column(8, wrow, blocks, k, xq, xd, total); break;
        }
        const float s = bf16_to_f32(scale[col]);
        for (int64_t r = 0; r < rows; r++) {
            out[r * n + col] = f32_to_bf16(bad[r] ? NAN : total[r] * s);
        }
    }
    free(scratch.xq);
    return 0;
}
