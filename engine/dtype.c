/* msm_dtype: sizes, names and conversions of element types. */
#include "msm_dtype.h"

#include <math.h>

size_t msm_dtype_size(msm_dtype t) {
    switch (t) {
    case MSM_F32: return 4;
    case MSM_F16: return 2;
    case MSM_BF16: return 2;
    case MSM_I32: return 4;
    default: return 0;
    }
}

const char *msm_dtype_name(msm_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "i32"};
    return (unsigned)t < MSM_DTYPE_COUNT ? names[t] : "?";
}

float msm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* subnormal or zero */
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

void msm_convert_to_f32(float *dst, const void *src, msm_dtype t, size_t n) {
    /* safetensors data need not be aligned: read elements through memcpy */
    const unsigned char *p = src;
    uint16_t h;
    switch (t) {
    case MSM_F32: memcpy(dst, src, n * 4); break;
    case MSM_BF16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = msm_bf16_to_f32(h);
        }
        break;
    case MSM_F16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = msm_f16_to_f32(h);
        }
        break;
    default: break;
    }
}
