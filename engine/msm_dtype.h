/* msm_dtype: element types of tensors on disk, in graphs and on devices, and bf16/f16/fp8 helpers. */
#ifndef MSM_DTYPE_H
#define MSM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum msm_dtype {
    MSM_F32 = 0,
    MSM_F16,
    MSM_BF16,
    MSM_I32,
    MSM_F8_E4M3, /* float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
                    S.1111.111 (0x7f, 0xff) is NaN; checkpoint weights only, with block scales */
    MSM_DTYPE_COUNT
} msm_dtype;

/* Bytes per element. */
size_t msm_dtype_size(msm_dtype t);
/* Lower-case name ("f32", "bf16", ...). */
const char *msm_dtype_name(msm_dtype t);

static inline float msm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t msm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float msm_f16_to_f32(uint16_t h);

/* float8_e4m3fn -> float32, exact (every e4m3 value is a float32): normals 2^(e-7) x 1.m,
 * subnormals m x 2^-9, +-0, and NaN for the two all-ones codes (there are no infinities). */
static inline float msm_f8e4m3_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q >> 7) << 31, exp = (q >> 3) & 0xfu, man = q & 7u, u;
    float f;
    if (exp == 15 && man == 7) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) {
        f = (float)man * 0x1p-9f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((exp + 120) << 23) | (man << 20);
    }
    memcpy(&f, &u, 4);
    return f;
}

/* One row of an FP8 block-scaled weight (DeepSeek-V3's `weight_dequant`), from column c0 of its
 * checkpoint tensor on: dst[j] = f8(src[j]) * scale[(c0 + j) / block] for j < n, one float32
 * multiply (round to nearest even); an FP8 NaN stays that NaN whatever its scale. `scale` is the
 * row's block row of scale_inv (the block row holding the tensor's row). */
void msm_fp8_dequant_row(float *dst, const uint8_t *src, size_t n, const float *scale, size_t c0,
                         size_t block);

/* Converts n elements of type t (F32, F16 or BF16) at src to float32 at dst. */
void msm_convert_to_f32(float *dst, const void *src, msm_dtype t, size_t n);

#endif
