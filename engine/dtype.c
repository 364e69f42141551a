/* msm_dtype: sizes, names and conversions of element types. */
#include "msm_dtype.h"

#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

size_t msm_dtype_size(msm_dtype t) {
    switch (t) {
    case MSM_F32: return 4;
    case MSM_F16: return 2;
    case MSM_BF16: return 2;
    case MSM_I32: return 4;
    case MSM_F8_E4M3: return 1;
    default: return 0;
    }
}

const char *msm_dtype_name(msm_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "i32", "f8_e4m3"};
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
    case MSM_BF16: {
        size_t i = 0;
#if defined(__SSE2__)
        /* 8 at a time: a bf16 is the high half of its float, so interleaving zeros below each
         * one is the conversion (the weight loader runs this over whole checkpoints) */
        const __m128i z = _mm_setzero_si128();
        for (; i + 8 <= n; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i));
            _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm_unpacklo_epi16(z, v));
            _mm_storeu_si128((__m128i *)(void *)(dst + i + 4), _mm_unpackhi_epi16(z, v));
        }
#endif
        for (; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = msm_bf16_to_f32(h);
        }
        break;
    }
    case MSM_F16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = msm_f16_to_f32(h);
        }
        break;
    default: break;
    }
}

void msm_fp8_dequant_row(float *dst, const uint8_t *src, size_t n, const float *scale, size_t c0,
                         size_t block) {
    /* block by block: one scale per run of up to `block` columns (the first may be partial) */
    for (size_t j = 0; j < n;) {
        size_t b = (c0 + j) / block, end = (b + 1) * block - c0;
        if (end > n) end = n;
        float s = scale[b];
        for (; j < end; j++) {
            float f = msm_f8e4m3_to_f32(src[j]);
            dst[j] = isnan(f) ? f : f * s;
        }
    }
}
