/* msm_dtype: element types of tensors on disk, in graphs and on devices, and bf16/f16 helpers. */
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

/* Converts n elements of type t at src to float32 at dst. */
void msm_convert_to_f32(float *dst, const void *src, msm_dtype t, size_t n);

#endif
