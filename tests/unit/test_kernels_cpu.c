/* CPU reference kernels: the properties the rest of the engine relies on (sampling rules,
 * routing, attention against a naive softmax, RoPE rotation). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "msm_kernels.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

Test(kernels_cpu, greedy_picks_the_lowest_id_among_ties) {
    float l[6] = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f, 0.0f};
    msm_sample_params p = {.temperature = 0.0f, .top_p = 1.0f};
    int32_t out;
    float scratch[12];
    msm_cpu_sample(&out, l, &p, 1, 6, scratch);
    cr_expect_eq(out, 1);
}

Test(kernels_cpu, top_k_1_and_tiny_top_p_equal_greedy) {
    uint64_t s = 7;
    float l[64], scratch[128];
    for (int i = 0; i < 64; i++) l[i] = frand(&s) * 4;
    int32_t greedy, k1, p0;
    msm_sample_params g = {.temperature = 0, .top_p = 1}, a = {.temperature = 1, .top_k = 1, .top_p = 1, .seed = 3},
                      b = {.temperature = 1, .top_p = 1e-6f, .seed = 3};
    msm_cpu_sample(&greedy, l, &g, 1, 64, scratch);
    for (uint64_t c = 0; c < 20; c++) {
        a.counter = b.counter = c;
        msm_cpu_sample(&k1, l, &a, 1, 64, scratch);
        msm_cpu_sample(&p0, l, &b, 1, 64, scratch);
        cr_expect_eq(k1, greedy);
        cr_expect_eq(p0, greedy);
    }
}

Test(kernels_cpu, seeded_sampling_is_reproducible_and_follows_the_distribution) {
    float l[4] = {0.0f, logf(2.0f), logf(3.0f), logf(4.0f)}, scratch[8]; /* p = .1 .2 .3 .4 */
    int hist[4] = {0};
    msm_sample_params p = {.temperature = 1, .top_p = 1, .seed = 42};
    for (uint64_t c = 0; c < 20000; c++) {
        int32_t a, b;
        p.counter = c;
        msm_cpu_sample(&a, l, &p, 1, 4, scratch);
        msm_cpu_sample(&b, l, &p, 1, 4, scratch);
        cr_assert_eq(a, b, "same seed and counter must give the same token");
        hist[a]++;
    }
    for (int i = 0; i < 4; i++) cr_expect_float_eq(hist[i] / 20000.0, (i + 1) / 10.0, 0.015, "token %d", i);
}

Test(kernels_cpu, top_k_never_samples_outside_the_k_best) {
    float l[8] = {5, 1, 4, 0, 3, 2, -1, -2}, scratch[16];
    msm_sample_params p = {.temperature = 5, .top_k = 3, .top_p = 1, .seed = 1};
    for (uint64_t c = 0; c < 2000; c++) {
        int32_t t;
        p.counter = c;
        msm_cpu_sample(&t, l, &p, 1, 8, scratch);
        cr_assert(t == 0 || t == 2 || t == 4, "sampled %d", t);
    }
}

Test(kernels_cpu, router_topk_renormalises_when_asked) {
    float logits[5] = {0.5f, 2.0f, -1.0f, 1.0f, 0.0f};
    int32_t ids[2];
    float w[2];
    msm_cpu_router_topk(ids, w, logits, 1, 5, 2, true);
    cr_expect_eq(ids[0], 1);
    cr_expect_eq(ids[1], 3);
    cr_expect_float_eq(w[0] + w[1], 1.0f, 1e-6);
    cr_expect_float_eq(w[0] / w[1], expf(1.0f), 1e-4);
    msm_cpu_router_topk(ids, w, logits, 1, 5, 2, false);
    cr_expect_lt(w[0] + w[1], 1.0f);
}

Test(kernels_cpu, paged_attention_matches_naive_softmax) {
    enum { NH = 4, KVH = 2, HD = 8, T = 20 };
    uint64_t s = 11;
    float q[T * NH * HD], k[T * KVH * HD], v[T * KVH * HD], out[T * NH * HD];
    for (int i = 0; i < T * NH * HD; i++) q[i] = frand(&s);
    for (int i = 0; i < T * KVH * HD; i++) k[i] = frand(&s), v[i] = frand(&s);
    static float kc[4 * MSM_KV_BLOCK * KVH * HD], vc[4 * MSM_KV_BLOCK * KVH * HD];
    int32_t bt[2] = {3, 1}, seq[T], pos[T], slot[T];
    for (int t = 0; t < T; t++) {
        seq[t] = 0;
        pos[t] = t;
        slot[t] = bt[t / MSM_KV_BLOCK] * MSM_KV_BLOCK + t % MSM_KV_BLOCK;
    }
    msm_cpu_kv_write(kc, vc, k, v, slot, T, KVH, HD);
    msm_cpu_attention(out, q, kc, vc, seq, pos, bt, 2, T, NH, KVH, HD, 0.35f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            double sc[T], mx = -1e30, den = 0;
            int kh = h / (NH / KVH);
            for (int p = 0; p <= t; p++) {
                double d = 0;
                for (int i = 0; i < HD; i++) d += q[(t * NH + h) * HD + i] * k[(p * KVH + kh) * HD + i];
                sc[p] = d * 0.35;
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= t; p++) den += exp(sc[p] - mx);
            for (int i = 0; i < HD; i++) {
                double o = 0;
                for (int p = 0; p <= t; p++) o += exp(sc[p] - mx) / den * v[(p * KVH + kh) * HD + i];
                cr_assert_float_eq(out[(t * NH + h) * HD + i], o, 1e-5, "t %d h %d i %d", t, h, i);
            }
        }
}

Test(kernels_cpu, rope_at_position_zero_is_identity_and_preserves_norm) {
    float x[2 * 16], y[2 * 16];
    uint64_t s = 5;
    for (int i = 0; i < 32; i++) x[i] = y[i] = frand(&s);
    int32_t p0 = 0, p7 = 7;
    msm_cpu_rope(y, &p0, 1, 2, 16, 10000.0f);
    cr_expect_eq(memcmp(x, y, sizeof x), 0);
    msm_cpu_rope(y, &p7, 1, 2, 16, 10000.0f);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 32; i++) n0 += x[i] * x[i], n1 += y[i] * y[i];
    cr_expect_float_eq(n0, n1, 1e-4);
}

Test(kernels_cpu, moe_combine_rmsnorm_equals_the_op_chain) {
    enum { R = 3, D = 37 };
    float x[R * D], rt[R * D], sh[R * D], h[R * D], wg[D], w[D];
    float s1[R * D], o1[R * D], s2[R * D], o2[R * D], gl[R], gs[R], sc[R * D], moe[R * D];
    for (int i = 0; i < R * D; i++)
        x[i] = sinf((float)i), rt[i] = cosf((float)i * 0.7f), sh[i] = sinf((float)i * 1.3f), h[i] = cosf((float)i * 0.2f);
    for (int i = 0; i < D; i++) w[i] = 0.5f + (float)i / D, wg[i] = 0.1f * sinf((float)i);
    msm_cpu_moe_combine_rmsnorm(s1, o1, x, rt, sh, h, wg, w, R, D, 1e-6f);
    msm_cpu_linear(gl, h, wg, NULL, R, 1, D);
    msm_cpu_sigmoid(gs, gl, R);
    msm_cpu_scale_rows(sc, sh, gs, R, D);
    msm_cpu_add(moe, rt, sc, R * D);
    msm_cpu_add_rmsnorm(s2, o2, x, moe, w, R, D, 1e-6f);
    cr_expect(memcmp(s1, s2, sizeof s1) == 0 && memcmp(o1, o2, sizeof o1) == 0);
}

Test(kernels_cpu, add_rmsnorm_equals_add_then_rmsnorm) {
    enum { R = 3, D = 37 };
    float a[R * D], b[R * D], w[D], s1[R * D], o1[R * D], s2[R * D], o2[R * D];
    for (int i = 0; i < R * D; i++) a[i] = sinf((float)i), b[i] = cosf((float)i * 0.7f);
    for (int i = 0; i < D; i++) w[i] = 0.5f + (float)i / D;
    msm_cpu_add_rmsnorm(s1, o1, a, b, w, R, D, 1e-6f);
    msm_cpu_add(s2, a, b, R * D);
    msm_cpu_rmsnorm(o2, s2, w, R, D, 1e-6f);
    cr_expect(memcmp(s1, s2, sizeof s1) == 0 && memcmp(o1, o2, sizeof o1) == 0);
}
