/* Tests of msm_dtype's conversions: float8_e4m3fn decoded exactly as torch decodes it, for all 256
 * codes (tests/data/fp8_e4m3fn.json, written by tests/golden/make_golden.py from torch's own
 * float8_e4m3fn -> float32), and FP8 rows dequantised with their 128-column block scales from any
 * starting column (a TP slice or a chunk may start mid-block). */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "msm_dtype.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(dtype, f8_e4m3_decodes_all_256_codes_as_torch_does) {
    json_object *root = json_object_from_file("tests/data/fp8_e4m3fn.json"), *bits;
    cr_assert_not_null(root);
    cr_assert(json_object_object_get_ex(root, "f32_bits", &bits));
    cr_assert_eq(json_object_array_length(bits), 256);
    int nan = 0;
    for (int q = 0; q < 256; q++) {
        uint32_t want = (uint32_t)json_object_get_int64(json_object_array_get_idx(bits, (size_t)q));
        float got = msm_f8e4m3_to_f32((uint8_t)q);
        if (isnan(f32_of(want))) { /* NaN payloads and signs are not part of the format */
            cr_expect(isnan(got), "code 0x%02x: torch NaN, got %g", q, (double)got);
            nan++;
            continue;
        }
        cr_expect_eq(bits_of(got), want, "code 0x%02x: got %a (0x%08x), torch %a (0x%08x)", q, (double)got,
                     bits_of(got), (double)f32_of(want), want);
    }
    cr_expect_eq(nan, 2, "e4m3fn has exactly two NaN codes (0x7f, 0xff), torch table has %d", nan);
    json_object_put(root);
}

Test(dtype, f8_e4m3_landmarks) {
    cr_expect_eq(msm_f8e4m3_to_f32(0x7e), 448.0f);             /* largest finite */
    cr_expect_eq(msm_f8e4m3_to_f32(0xfe), -448.0f);
    cr_expect_eq(msm_f8e4m3_to_f32(0x08), 0x1p-6f);            /* smallest normal */
    cr_expect_eq(msm_f8e4m3_to_f32(0x01), 0x1p-9f);            /* smallest subnormal */
    cr_expect_eq(msm_f8e4m3_to_f32(0x07), 7 * 0x1p-9f);        /* largest subnormal */
    cr_expect_eq(msm_f8e4m3_to_f32(0x38), 1.0f);
    cr_expect_eq(msm_f8e4m3_to_f32(0x78), 256.0f);             /* exponent 15 is finite in e4m3fn */
    cr_expect_eq(bits_of(msm_f8e4m3_to_f32(0x80)), 0x80000000u); /* -0 */
    cr_expect(isnan(msm_f8e4m3_to_f32(0x7f)) && isnan(msm_f8e4m3_to_f32(0xff)));
    cr_expect_eq(msm_dtype_size(MSM_F8_E4M3), 1);
}

/* A 3-block row (128 + 128 + 64 columns), dequantised from several starting columns and lengths:
 * every element uses the scale of its own global column's block. */
Test(dtype, fp8_row_dequantisation_uses_each_columns_block_from_any_start) {
    enum { K = 320 };
    uint8_t q[K];
    const float scale[3] = {0.5f, 3.0f, 0.0078125f};
    for (int i = 0; i < K; i++) q[i] = (uint8_t)((i * 37 + 11) & 0xff);
    const size_t starts[] = {0, 1, 96, 127, 128, 200, 255, 256, 319};
    for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
        size_t c0 = starts[s], n = K - c0;
        float out[K];
        msm_fp8_dequant_row(out, q + c0, n, scale, c0, 128);
        for (size_t j = 0; j < n; j++) {
            float f = msm_f8e4m3_to_f32(q[c0 + j]), want = f * scale[(c0 + j) / 128];
            if (isnan(f)) cr_expect(isnan(out[j]), "start %zu col %zu: NaN expected", c0, j);
            else cr_expect_eq(bits_of(out[j]), bits_of(want), "start %zu col %zu: %g, want %g", c0, j,
                              (double)out[j], (double)want);
        }
    }
}
