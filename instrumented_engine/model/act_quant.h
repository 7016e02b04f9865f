/* The decode matmuls' activations rounded to int16 per block of 32 inputs (a scale each),
   shared by q4_matmul.c and q8_matmul.c: their integer dot products read these (and the
   AVX2 paths sum their accumulators with hsum256_ps).

   x [rows, k] bf16 -> xq [rows, k] int16, xd and xsum [rows, k / 32] (xd = the block's
   max|x| / 32767, xsum = its exact sum); bad[r] = 1 when row r holds a NaN or an infinity.
   int16, not llama.cpp's int8: with int8 activations the teacher-forced logits of SmolLM2
   moved by up to 1.8 against the fp32 reference, past the 1.5 every CPU path meets
   (tests/engine/test_quant.py); int16 rounding is ~256x finer than that, and finer than
   bf16. */
#ifndef TTFTSCOPE_ACT_QUANT_H
#define TTFTSCOPE_ACT_QUANT_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__)
#include <immintrin.h>

/* The sum of a register's 8 floats. */
static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

#define ACT_BLOCK 32
#define ACT_XMAX 32767.0f

/* One call's rounded activations in one allocation: xq [rows * k] int16, then xd, xsum and
   xerr [rows * k / 32] fp32 each (xerr: q4_matmul.c's 512-bit path). Made here rather than
   by the caller: three torch tensors a call cost ~3 µs of a ~4 µs one-row decode matmul
   (docs/reference.md, "Engine weight formats"). */
typedef struct {
    int16_t *xq;
    float *xd;
    float *xsum;
    float *xerr;
} act_scratch;

/* 0, or -1 when the memory cannot be had; free with free(s->xq). */
static int act_scratch_alloc(act_scratch *s, int64_t rows, int64_t k) {
    const size_t codes = (size_t)rows * (size_t)k * sizeof(int16_t);
    const size_t steps = (size_t)rows * (size_t)(k / ACT_BLOCK) * sizeof(float);
    char *base = malloc(codes + 3 * steps + 1);
    if (base == NULL) {
        return -1;
    }
    s->xq = (int16_t *)base;
    s->xd = (float *)(base + codes);
    s->xsum = (float *)(base + codes + steps);
    s->xerr = (float *)(base + codes + 2 * steps);
    return 0;
}

static void quantize_rows(const uint16_t *x, int64_t rows, int64_t k, int16_t *xq, float *xd,
                          float *xsum, int *bad) {
    const int64_t blocks = k / ACT_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        bad[r] = 0;
        for (int64_t b = 0; b < blocks; b++) {
            const uint16_t *src = x + r * k + b * ACT_BLOCK;
            float v[ACT_BLOCK], amax = 0.0f, sum = 0.0f;
            for (int j = 0; j < ACT_BLOCK; j++) {
                v[j] = bf16_to_f32(src[j]);
                float a = fabsf(v[j]);
                if (!(a <= 3.4028235e38f)) {
                    bad[r] = 1;                       /* NaN or inf */
                }
                amax = a > amax ? a : amax;
                sum += v[j];
            }
            float d = amax / ACT_XMAX;
            int16_t *dst = xq + r * k + b * ACT_BLOCK;
            /* An all-zero block has d = 0 and every code 0. So does a block whose step is below
               FLT_MIN (|x| < 1.2e-38 * 32767 = 3.9e-34), where 1 / d would overflow. */
            if (!(d >= 1.17549435e-38f) || !isfinite(d)) {
                memset(dst, 0, ACT_BLOCK * sizeof *dst);
                d = 0.0f;
            } else {
                float inv = 1.0f / d;
                for (int j = 0; j < ACT_BLOCK; j++) {
                    float q = nearbyintf(v[j] * inv);   /* |q| <= 32767 by the choice of d */
                    dst[j] = (int16_t)(q > ACT_XMAX ? ACT_XMAX : q < -ACT_XMAX ? -ACT_XMAX : q);
                }
            }
            xd[r * blocks + b] = d;
            xsum[r * blocks + b] = sum;
        }
    }
}

#endif
