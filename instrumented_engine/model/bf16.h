/* bf16 as its bits (the top half of an IEEE float), shared by cpu_fused.c and q4_matmul.c. */
#ifndef TTFTSCOPE_BF16_H
#define TTFTSCOPE_BF16_H

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

#endif
