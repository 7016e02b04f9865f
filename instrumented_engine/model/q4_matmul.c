/* Weight-only 4-bit matmul for decode-sized steps (up to Q4_MAX_ROWS rows), built with the fused
   ops (cpu_fused.py) and wrapped by quant.py's Q4Weight.

   Why hand-written: on a CPU without AVX-512, torch's int4 kernel
   (`_weight_int4pack_mm_for_cpu`) unpacks every nibble to a float and spends 12.4 ms of one
   core on SmolLM2's 30 layers at one row, where streaming their 66 MB takes ~3
   (docs/reference.md, "Engine weight formats"). Here the activations are rounded to int16 per
   block of 32 (a scale each; act_quant.h says why int16), so one block's 32 products are two
   integer instructions (s16 x s16 pair products summed to s32) instead of eight float FMAs
   after eight conversions.

   Weights: the GGUF's own Q4_1 blocks, re-laid out: per output row n and block b of 32 inputs,
   16 bytes whose low nibbles are codes 0..15 and high nibbles codes 16..31, and fp32 `scale`
   and `offset`, w = (code - 8) * scale + offset (offset = the file's minimum + 8 * scale). So

       y[r, n] = sum_b scale[n, b] * xd[r, b] * sum_j (code[n, 32b + j] - 8) * xq[r, 32b + j]
               + offset[n, b] * xsum[r, b]

   with xq = round(x / xd), xd = max|x| / 32767 over the block, and xsum the block's exact sum
   (so the offset's term carries no rounding of x). Centring the codes matters: Q4_1's
   minimum is about -8 scales, so uncentred codes times rounded activations carried ~3x the
   weight's own magnitude of rounding error (with int8 activations: 2 % relative error on
   SmolLM2's layers uncentred, 0.6-0.75 % centred). The activations' rounding is act_quant.h.
   A row with a NaN or an infinity gives NaN outputs, as a float matmul would.
   tests/engine/test_q4_matmul.py checks the kernel against float64 over the whole bf16
   range. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "act_quant.h"
#include "bf16.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define Q4_BLOCK 32
#define Q4_MAX_ROWS 8

/* One output column for a compile-time number of rows R, so the accumulators stay in
   registers (a runtime row count spilled them: 2.6x slower at one row). */
static inline __attribute__((always_inline)) void q4_column(
        const int R, const uint8_t *wrow, const float *srow, const float *mrow, int64_t blocks,
        int64_t k, const int16_t *xq, const float *xd, const float *xsum, float *total) {
#if defined(__AVX2__)
    __m256 acc[Q4_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    const __m128i low_nibbles = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < blocks; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(wrow + b * 16));
        /* codes 0..15 and 16..31 of the block, centred to -8..7, widened to int16 */
        __m256i c0 = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_and_si128(raw, low_nibbles), eight));
        __m256i c1 = _mm256_cvtepi8_epi16(
            _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low_nibbles), eight));
        for (int r = 0; r < R; r++) {
            const int16_t *xb = xq + r * k + b * Q4_BLOCK;
            /* pair sums |c0 x0 + c1 x1| <= 2 * 8 * 32767: no int32 overflow */
            __m256i sums = _mm256_add_epi32(
                _mm256_madd_epi16(c0, _mm256_loadu_si256((const __m256i *)xb)),
                _mm256_madd_epi16(c1, _mm256_loadu_si256((const __m256i *)(xb + 16))));
            __m256 dot = _mm256_cvtepi32_ps(sums);
            acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(srow[b] * xd[r * blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        total[r] = hsum256_ps(acc[r]);
    }
#else
    for (int r = 0; r < R; r++) {
        total[r] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *bytes = wrow + b * 16;
            const int16_t *xb = xq + r * k + b * Q4_BLOCK;
            int32_t dot = 0;
            for (int j = 0; j < 16; j++) {
                dot += ((int32_t)(bytes[j] & 0x0f) - 8) * xb[j]
                     + ((int32_t)(bytes[j] >> 4) - 8) * xb[16 + j];
            }
            total[r] += (float)dot * (srow[b] * xd[r * blocks + b]);
        }
    }
#endif
    /* The offset's term, sum_b offset[b] * xsum[r, b]: a plain dot the compiler vectorizes. */
    for (int r = 0; r < R; r++) {
        const float *xs = xsum + r * blocks;
        float m = 0.0f;
        #pragma omp simd reduction(+:m)
        for (int64_t b = 0; b < blocks; b++) {
            m += mrow[b] * xs[b];
        }
        total[r] += m;
    }
}

/* out [rows, n] bf16 = x [rows, k] bf16 . W^T, W given as packed [n, k / 2], scale and offset
   [n, k / 32] fp32. The output columns are split over `threads` OpenMP threads. The scratch
   buffers are the caller's: xq [rows * k] int16, xd and xsum [rows * k / 32] fp32. */
void q4_matmul_bf16(const uint16_t *x, int64_t rows, int64_t k, const uint8_t *packed,
                    const float *scale, const float *minimum, int64_t n, int16_t *xq, float *xd,
                    float *xsum, int64_t threads, uint16_t *out) {
    int bad[Q4_MAX_ROWS];
    if (rows < 1 || rows > Q4_MAX_ROWS) {
        return;                                       /* the Python side checks rows */
    }
    const int64_t blocks = k / Q4_BLOCK;
    quantize_rows(x, rows, k, xq, xd, xsum, bad);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t col = 0; col < n; col++) {
        const uint8_t *wrow = packed + col * (k / 2);
        const float *srow = scale + col * blocks;
        const float *mrow = minimum + col * blocks;
        float total[Q4_MAX_ROWS];
        switch (rows) {
        case 1: q4_column(1, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 2: q4_column(2, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 3: q4_column(3, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 4: q4_column(4, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 5: q4_column(5, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 6: q4_column(6, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        case 7: q4_column(7, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        default: q4_column(8, wrow, srow, mrow, blocks, k, xq, xd, xsum, total); break;
        }
        for (int64_t r = 0; r < rows; r++) {
            out[r * n + col] = f32_to_bf16(bad[r] ? NAN : total[r]);
        }
    }
}
