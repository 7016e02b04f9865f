/* Weight-only 4-bit matmul for decode-sized steps (up to Q4_MAX_ROWS rows), built with the fused
   ops (cpu_fused.py) and wrapped by quant.py's Q4Weight.

   Why hand-written: torch's int4 kernel (`_weight_int4pack_mm_for_cpu`) unpacks every nibble
   to a float. On a CPU without AVX-512 it spends 12.4 ms of one core on SmolLM2's 30 layers at
   one row, where streaming their 66 MB takes ~3; with AVX-512 this kernel's one-row decode
   step is 0.87x torch's (docs/reference.md, "Engine weight formats"). Here the activations are
   rounded to int16 per block of 32 (a scale each; act_quant.h says why int16), so a block's
   32 products are integer pair products summed to s32 (one instruction per 32 with AVX-512
   VNNI, two with AVX2) instead of eight float FMAs after eight conversions.

   Weights: the GGUF's own Q4_1 blocks, re-laid out: per output row n and block b of 32 inputs,
   16 bytes whose low nibbles are codes 0..15 and high nibbles codes 16..31, and the file's
   fp16 `scale` and `minimum` (20 bytes a block, as the file has them), w = (code - 8) * scale
   + offset with offset = minimum + 8 * scale. So

       y[r, n] = sum_b scale[n, b] * xd[r, b] * sum_j (code[n, 32b + j] - 8) * xq[r, 32b + j]
               + offset[n, b] * xsum[r, b]

   with xq = round(x / xd), xd = max|x| / 32767 over the block, and xsum the block's exact sum
   (so the offset's term carries no rounding of x). Centring the codes matters: Q4_1's
   minimum is about -8 scales, so uncentred codes times rounded activations carried ~3x the
   weight's own magnitude of rounding error (with int8 activations: 2 % relative error on
   SmolLM2's layers uncentred, 0.6-0.75 % centred). The 512-bit path multiplies uncentred
   codes and puts the centring back exactly through each block's rounding error (pair_blocks).
   The activations' rounding is act_quant.h. A row with a NaN or an infinity gives NaN
   outputs, as a float matmul would. tests/engine/test_q4_matmul.py checks every path the
   host runs against float64 over the whole bf16 range. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "act_quant.h"
#include "bf16.h"
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define Q4_BLOCK 32
#define Q4_MAX_ROWS 8

/* IEEE half precision, as the GGUF stores a Q4_1 block's scale and minimum, to fp32 (exact). */
static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {                                  /* zero and subnormals: m * 2^-24 */
        float f = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
    } else if (exponent == 31) {                          /* inf and NaN */
        bits = 0x7f800000u | (mantissa << 13);
    } else {
        bits = ((exponent + 112u) << 23) | (mantissa << 13);
    }
    bits |= sign;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#if defined(__F16C__)
#define Q4_HALF(h) _cvtsh_ss(h)                           /* one instruction, the same value */
#else
#define Q4_HALF(h) f16_to_f32(h)
#endif

/* The offset's term of one column, sum_b (minimum[b] + 8 * scale[b]) * xsum[r, b]. 8 * scale
   is exact, so the fused multiply-add rounds once, as quant.Q4Weight.offset does. */
static inline __attribute__((always_inline)) void q4_offsets(
        const int R, const uint16_t *srow, const uint16_t *mrow, int64_t blocks,
        const float *xsum, float *total) {
    int64_t b0 = 0;
    float m[Q4_MAX_ROWS] = {0.0f};
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc[Q4_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    for (; b0 + 8 <= blocks; b0 += 8) {
        const __m256 offset = _mm256_fmadd_ps(
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(srow + b0))), _mm256_set1_ps(8.0f),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mrow + b0))));
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_fmadd_ps(offset, _mm256_loadu_ps(xsum + r * blocks + b0), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        m[r] = hsum256_ps(acc[r]);
    }
#endif
    for (int r = 0; r < R; r++) {
        const float *xs = xsum + r * blocks;
        for (int64_t b = b0; b < blocks; b++) {
            m[r] += (8.0f * Q4_HALF(srow[b]) + Q4_HALF(mrow[b])) * xs[b];
        }
        total[r] += m[r];
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#if defined(__AVX512VNNI__)
#define Q4_DPWSSD(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define Q4_DPWSSD(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif
#define Q4_PAIRED 1

/* xq's blocks in pairs, as the 512-bit column reads them: in each pair (b, b + 1) the second
   half of b's codes trades places with the first half of b + 1's, so one 32-byte load of the
   two blocks' weights, split into low and high nibbles, meets [b 0..15, b+1 0..15] and
   [b 16..31, b+1 16..31]. An odd last block stays as it is.
   And each block's rounding error, xerr[r, b] = xsum[r, b] - xd[r, b] * sum_j xq[r, 32b + j]:
   the column multiplies the codes uncentred (0..15, two instructions a pair fewer), and
   sum_j (code - 8) * xq = sum_j code * xq - 8 * sum_j xq puts the centring back in the
   offset's term, where 8 * scale * (xsum - xd * sum xq) needs only the rounding error. */
static void pair_blocks(int16_t *xq, const float *xd, const float *xsum, float *xerr,
                        int64_t rows, int64_t k) {
    const int64_t blocks = k / Q4_BLOCK, pairs = blocks / 2;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < blocks; b++) {
            const int16_t *xb = xq + r * k + b * Q4_BLOCK;
            int32_t sum = 0;
            for (int j = 0; j < Q4_BLOCK; j++) {
                sum += xb[j];
            }
            xerr[r * blocks + b] = xsum[r * blocks + b] - xd[r * blocks + b] * (float)sum;
        }
        for (int64_t p = 0; p < pairs; p++) {
            int16_t *xb = xq + r * k + p * 2 * Q4_BLOCK, tmp[16];
            memcpy(tmp, xb + 16, sizeof tmp);
            memcpy(xb + 16, xb + 32, sizeof tmp);
            memcpy(xb + 32, tmp, sizeof tmp);
        }
    }
}

/* One output column for a compile-time number of rows R (accumulators in registers), two
   blocks (64 weights) a step: int32 lanes 0-7 hold block b's pair sums and 8-15 block b + 1's,
   so one permute spreads the two blocks' scales (weight scale x activation step) over them. */
static inline __attribute__((always_inline)) void q4_column(
        const int R, const uint8_t *wrow, const uint16_t *srow, const uint16_t *mrow,
        int64_t blocks,
        int64_t k, const int16_t *xq, const float *xd, const float *xsum, const float *xerr,
        float *total) {
    __m512 acc[Q4_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
    }
    const __m512i low_nibbles = _mm512_set1_epi16(0x0f);
    const __m512i two = _mm512_set1_epi32(2);
    const __m512i first_pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const int64_t pairs = blocks / 2;
    for (int64_t c = 0; c < pairs; c += 8) {            /* 8 pairs: 16 blocks' scales */
        const int64_t in_chunk = pairs - c < 8 ? pairs - c : 8;
        const __mmask16 lanes = (__mmask16)((1u << (2 * in_chunk)) - 1u);
        const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, srow + 2 * c));
        __m512 steps[Q4_MAX_ROWS];
        for (int r = 0; r < R; r++) {
            steps[r] = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, xd + r * blocks + 2 * c));
        }
        __m512i which = first_pair;
        for (int64_t p = 0; p < in_chunk; p++) {
            const int64_t b = 2 * (c + p);
            const __m512i v = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256((const __m256i *)(wrow + b * 16)));
            /* codes 0..15: [b 0..15, b+1 0..15] and [b 16..31, b+1 16..31] */
            const __m512i lo = _mm512_and_si512(v, low_nibbles);
            const __m512i hi = _mm512_srli_epi16(v, 4);
            for (int r = 0; r < R; r++) {
                const int16_t *xb = xq + r * k + b * Q4_BLOCK;
                /* an int32 lane sums 4 products, |.| <= 4 * 15 * 32767: no overflow, and exact
                   in fp32 (below 2^24) */
                __m512i sums = Q4_DPWSSD(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xb));
                sums = Q4_DPWSSD(sums, hi, _mm512_loadu_si512(xb + 32));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums),
                                         _mm512_permutexvar_ps(which, steps[r]), acc[r]);
            }
            which = _mm512_add_epi32(which, two);
        }
    }
    for (int r = 0; r < R; r++) {
        total[r] = _mm512_reduce_add_ps(acc[r]);
    }
    if (blocks % 2) {                                   /* the odd last block, unpaired */
        const int64_t b = blocks - 1;
        const __m128i raw = _mm_loadu_si128((const __m128i *)(wrow + b * 16));
        const __m256i c0 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0f)));
        const __m256i c1 = _mm256_cvtepu8_epi16(
            _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
        for (int r = 0; r < R; r++) {
            const int16_t *xb = xq + r * k + b * Q4_BLOCK;
            __m256i sums = _mm256_add_epi32(
                _mm256_madd_epi16(c0, _mm256_loadu_si256((const __m256i *)xb)),
                _mm256_madd_epi16(c1, _mm256_loadu_si256((const __m256i *)(xb + 16))));
            total[r] += hsum256_ps(_mm256_cvtepi32_ps(sums))
                        * (Q4_HALF(srow[b]) * xd[r * blocks + b]);
        }
    }
    /* The offset's term with the centring put back:
       sum_b minimum[b] * xsum[r, b] + 8 * scale[b] * xerr[r, b]. */
    __m512 off[Q4_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        off[r] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; b += 16) {
        const __mmask16 lanes = blocks - b >= 16 ? (__mmask16)0xffff
                                                 : (__mmask16)((1u << (blocks - b)) - 1u);
        const __m512 scale8 = _mm512_mul_ps(
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, srow + b)), _mm512_set1_ps(8.0f));
        const __m512 minimum = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, mrow + b));
        for (int r = 0; r < R; r++) {
            off[r] = _mm512_fmadd_ps(minimum, _mm512_maskz_loadu_ps(lanes, xsum + r * blocks + b),
                                     off[r]);
            off[r] = _mm512_fmadd_ps(scale8, _mm512_maskz_loadu_ps(lanes, xerr + r * blocks + b),
                                     off[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        total[r] += _mm512_reduce_add_ps(off[r]);
    }
}
#else
#define Q4_PAIRED 0

/* One output column for a compile-time number of rows R, so the accumulators stay in
   registers (a runtime row count spilled them: 2.6x slower at one row). */
static inline __attribute__((always_inline)) void q4_column(
        const int R, const uint8_t *wrow, const uint16_t *srow, const uint16_t *mrow,
        int64_t blocks,
        int64_t k, const int16_t *xq, const float *xd, const float *xsum, float *total) {
#if defined(__AVX2__)
    __m256 acc[Q4_MAX_ROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    const __m128i low_nibbles = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < blocks; b++) {
        const float scale = Q4_HALF(srow[b]);
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
            acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(scale * xd[r * blocks + b]), acc[r]);
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
            total[r] += (float)dot * (Q4_HALF(srow[b]) * xd[r * blocks + b]);
        }
    }
#endif
    q4_offsets(R, srow, mrow, blocks, xsum, total);
}
#endif

/* out [rows, n] bf16 = x [rows, k] bf16 . W^T, W given as packed [n, k / 2], scale and
   minimum [n, k / 32] fp16. The output columns are split over `threads` OpenMP threads.
   0, or -1 when the activations' scratch could not be allocated (out is then unwritten). */
int q4_matmul_bf16(const uint16_t *x, int64_t rows, int64_t k, const uint8_t *packed,
                   const uint16_t *scale, const uint16_t *minimum, int64_t n, int64_t threads,
                   uint16_t *out) {
    int bad[Q4_MAX_ROWS];
    act_scratch scratch;
    if (rows < 1 || rows > Q4_MAX_ROWS) {
        return -1;                                    /* the Python side checks rows */
    }
    if (act_scratch_alloc(&scratch, rows, k) != 0) {
        return -1;
    }
    const int64_t blocks = k / Q4_BLOCK;
    int16_t *xq = scratch.xq;
    const float *xd = scratch.xd, *xsum = scratch.xsum;
    quantize_rows(x, rows, k, xq, scratch.xd, scratch.xsum, bad);
#if Q4_PAIRED
    pair_blocks(xq, scratch.xd, scratch.xsum, scratch.xerr, rows, k);
    const float *xerr = scratch.xerr;
#define Q4_COLUMN(R) q4_column(R, wrow, srow, mrow, blocks, k, xq, xd, xsum, xerr, total)
#else
#define Q4_COLUMN(R) q4_column(R, wrow, srow, mrow, blocks, k, xq, xd, xsum, total)
#endif
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t col = 0; col < n; col++) {
        const uint8_t *wrow = packed + col * (k / 2);
        const uint16_t *srow = scale + col * blocks;
        const uint16_t *mrow = minimum + col * blocks;
        float total[Q4_MAX_ROWS];
        switch (rows) {
        case 1: Q4_COLUMN(1); break;
        case 2: Q4_COLUMN(2); break;
        case 3: Q4_COLUMN(3); break;
        case 4: Q4_COLUMN(4); break;
        case 5: Q4_COLUMN(5); break;
        case 6: Q4_COLUMN(6); break;
        case 7: Q4_COLUMN(7); break;
        default: Q4_COLUMN(8); break;
        }
        for (int64_t r = 0; r < rows; r++) {
            out[r * n + col] = f32_to_bf16(bad[r] ? NAN : total[r]);
        }
    }
    free(xq);
    return 0;
}
