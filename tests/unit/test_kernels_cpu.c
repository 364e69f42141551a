/* CPU reference kernels: the properties the rest of the engine relies on (sampling rules,
 * routing, attention against a naive softmax, RoPE rotation), and the qkv-row kernels (QK norm,
 * RoPE over rows, the K/V-cache write, RoPE + K/V write, row gather) against their definitions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msm_dtype.h"
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

/* A NaN or an infinity anywhere in a row: nothing can be drawn from it, greedy or sampled; the
 * sampler says so (MSM_SAMPLE_NONFINITE) instead of returning token 0. Other rows are unaffected. */
Test(kernels_cpu, a_row_with_nan_or_inf_samples_nonfinite) {
    float l[3][6] = {{0.1f, 3.0f, NAN, 3.0f, 2.0f, 0.0f},
                     {0.1f, 1.0f, 2.0f, 3.0f, INFINITY, 0.0f},
                     {0.1f, 1.0f, 2.0f, 5.0f, 2.0f, 0.0f}};
    float scratch[12];
    int32_t out[3];
    for (int t = 0; t < 2; t++) {
        msm_sample_params p[3] = {{.temperature = (float)t, .top_p = 1.0f, .seed = 1},
                                  {.temperature = (float)t, .top_p = 1.0f, .seed = 1},
                                  {.temperature = 0, .top_p = 1.0f}};
        msm_cpu_sample(out, &l[0][0], p, 3, 6, scratch);
        cr_expect_eq(out[0], MSM_SAMPLE_NONFINITE, "temperature %d", t);
        cr_expect_eq(out[1], MSM_SAMPLE_NONFINITE, "temperature %d", t);
        cr_expect_eq(out[2], 3);
    }
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
    msm_cpu_rope(y, &p0, 1, 2, 16, 16, 10000.0f);
    cr_expect_eq(memcmp(x, y, sizeof x), 0);
    msm_cpu_rope(y, &p7, 1, 2, 16, 16, 10000.0f);
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

/* ---- the qkv-row kernels the CPU backend runs for QK_NORM, ROPE, ROPE_KV_WRITE, ATTENTION's K/V
 * write and GATHER_ROWS, over a table of shapes {T, nh, kvh, hd} ---- */

static const int qkv_shapes[][4] = {{1, 4, 2, 8}, {5, 6, 2, 16}, {3, 2, 2, 32}, {17, 8, 1, 4}};
#define N_QKV_SHAPES (sizeof qkv_shapes / sizeof qkv_shapes[0])

static float *rand_floats(size_t n, uint64_t seed) {
    float *p = malloc(sizeof(float) * n);
    cr_assert(p);
    for (size_t i = 0; i < n; i++) p[i] = frand(&seed) * 3.0f;
    return p;
}

Test(kernels_cpu, qk_norm_normalises_q_and_k_heads_and_copies_v) {
    for (size_t s = 0; s < N_QKV_SHAPES; s++) {
        int T = qkv_shapes[s][0], nh = qkv_shapes[s][1], kvh = qkv_shapes[s][2], hd = qkv_shapes[s][3];
        int C = (nh + 2 * kvh) * hd;
        size_t n = (size_t)T * C;
        float *x = rand_floats(n, 3 + s), *wq = rand_floats((size_t)hd, 4), *wk = rand_floats((size_t)hd, 5);
        float *out = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n), *inplace = malloc(sizeof(float) * n);
        msm_cpu_qk_norm(out, x, wq, wk, T, C, nh, kvh, hd, 1e-6f);
        memcpy(inplace, x, sizeof(float) * n);
        msm_cpu_qk_norm(inplace, inplace, wq, wk, T, C, nh, kvh, hd, 1e-6f);
        for (int t = 0; t < T; t++) { /* per head: rmsnorm rows of hd */
            const float *xr = x + (size_t)t * C;
            float *rr = ref + (size_t)t * C;
            msm_cpu_rmsnorm(rr, xr, wq, nh, hd, 1e-6f);
            msm_cpu_rmsnorm(rr + (size_t)nh * hd, xr + (size_t)nh * hd, wk, kvh, hd, 1e-6f);
            memcpy(rr + (size_t)(nh + kvh) * hd, xr + (size_t)(nh + kvh) * hd, sizeof(float) * (size_t)kvh * hd);
        }
        cr_expect(memcmp(out, ref, sizeof(float) * n) == 0, "T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
        cr_expect(memcmp(inplace, ref, sizeof(float) * n) == 0, "in place: T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
        free(x), free(wq), free(wk), free(out), free(ref), free(inplace);
    }
}

Test(kernels_cpu, rope_copy_rotates_q_and_k_heads_and_copies_v) {
    for (size_t s = 0; s < N_QKV_SHAPES; s++) {
        int T = qkv_shapes[s][0], nh = qkv_shapes[s][1], kvh = qkv_shapes[s][2], hd = qkv_shapes[s][3];
        int C = (nh + 2 * kvh) * hd;
        size_t n = (size_t)T * C;
        float *x = rand_floats(n, 7 + s), *out = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
        for (int t = 0; t < T; t++) pos[t] = 3 * t + 1;
        msm_cpu_rope_copy(out, x, pos, T, C, nh + kvh, hd, hd, 1e6f);
        memcpy(ref, x, sizeof(float) * n);
        for (int t = 0; t < T; t++) msm_cpu_rope(ref + (size_t)t * C, pos + t, 1, nh + kvh, hd, hd, 1e6f);
        cr_expect(memcmp(out, ref, sizeof(float) * n) == 0, "T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
        /* the v heads are the input's, untouched */
        for (int t = 0; t < T; t++)
            cr_expect(memcmp(out + (size_t)t * C + (size_t)(nh + kvh) * hd, x + (size_t)t * C + (size_t)(nh + kvh) * hd,
                             sizeof(float) * (size_t)kvh * hd) == 0);
        msm_cpu_rope_copy(x, x, pos, T, C, nh + kvh, hd, hd, 1e6f); /* in place */
        cr_expect(memcmp(x, ref, sizeof(float) * n) == 0, "in place: T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
        free(x), free(out), free(ref), free(pos);
    }
}

/* kv_write_ld from strided qkv rows: float or bf16-rounded values at their slots, padding rows
 * (slot -1) and untouched slots left as they were. */
Test(kernels_cpu, kv_write_ld_stores_rows_at_slots_rounded_when_bf16) {
    for (size_t s = 0; s < N_QKV_SHAPES; s++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int T = qkv_shapes[s][0], nh = qkv_shapes[s][1], kvh = qkv_shapes[s][2], hd = qkv_shapes[s][3];
            int C = (nh + 2 * kvh) * hd, nslots = 2 * MSM_KV_BLOCK + T, row = kvh * hd;
            size_t cache = (size_t)nslots * row;
            float *qkv = rand_floats((size_t)T * C, 11 + s), *kc = malloc(sizeof(float) * cache),
                  *vc = malloc(sizeof(float) * cache);
            int32_t *slot = malloc(sizeof(int32_t) * (size_t)T);
            for (size_t i = 0; i < cache; i++) kc[i] = vc[i] = -7.0f;
            for (int t = 0; t < T; t++) slot[t] = t == T - 1 && T > 1 ? -1 : (t * 5 + 3) % nslots;
            msm_cpu_kv_write_ld(kc, vc, qkv + (size_t)nh * hd, qkv + (size_t)(nh + kvh) * hd, (size_t)C, slot, T,
                                kvh, hd, bf16);
            int written = 0;
            for (int t = 0; t < T; t++) {
                if (slot[t] < 0) continue;
                written++;
                for (int j = 0; j < row; j++) {
                    float k = qkv[(size_t)t * C + (size_t)nh * hd + j], v = qkv[(size_t)t * C + (size_t)(nh + kvh) * hd + j];
                    if (bf16) k = msm_bf16_to_f32(msm_f32_to_bf16(k)), v = msm_bf16_to_f32(msm_f32_to_bf16(v));
                    cr_assert(kc[(size_t)slot[t] * row + j] == k && vc[(size_t)slot[t] * row + j] == v,
                              "T=%d kvh=%d hd=%d bf16 %d: t %d j %d", T, kvh, hd, bf16, t, j);
                }
            }
            size_t untouched = 0;
            for (size_t i = 0; i < cache; i++) untouched += kc[i] == -7.0f && vc[i] == -7.0f;
            cr_expect_eq(untouched, cache - (size_t)written * row, "T=%d: a padding row or a stray write", T);
            free(qkv), free(kc), free(vc), free(slot);
        }
}

/* ROPE_KV_WRITE's kernel = rope_copy then kv_write_ld from its output, bitwise (rows and caches),
 * which is what makes the fuse_rope_kv_write pass exact on the CPU backend. */
Test(kernels_cpu, rope_kv_equals_rope_copy_then_kv_write_ld) {
    for (size_t s = 0; s < N_QKV_SHAPES; s++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int T = qkv_shapes[s][0], nh = qkv_shapes[s][1], kvh = qkv_shapes[s][2], hd = qkv_shapes[s][3];
            int C = (nh + 2 * kvh) * hd, nslots = 2 * MSM_KV_BLOCK + T;
            size_t n = (size_t)T * C, cache = (size_t)nslots * kvh * hd;
            float *x = rand_floats(n, 21 + s), *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
            float *k1 = calloc(cache, sizeof(float)), *v1 = calloc(cache, sizeof(float));
            float *k2 = calloc(cache, sizeof(float)), *v2 = calloc(cache, sizeof(float));
            int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *slot = malloc(sizeof(int32_t) * (size_t)T);
            for (int t = 0; t < T; t++) pos[t] = 100 + t, slot[t] = t == 0 && T > 1 ? -1 : (t * 3) % nslots;
            msm_cpu_rope_copy(o1, x, pos, T, C, nh + kvh, hd, hd, 1e4f);
            msm_cpu_kv_write_ld(k1, v1, o1 + (size_t)nh * hd, o1 + (size_t)(nh + kvh) * hd, (size_t)C, slot, T, kvh,
                                hd, bf16);
            msm_cpu_rope_kv(o2, x, pos, slot, k2, v2, T, nh, kvh, hd, hd, 1e4f, bf16);
            cr_expect(memcmp(o1, o2, sizeof(float) * n) == 0, "rows: T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
            cr_expect(memcmp(k1, k2, sizeof(float) * cache) == 0 && memcmp(v1, v2, sizeof(float) * cache) == 0,
                      "caches: T=%d nh=%d kvh=%d hd=%d bf16 %d", T, nh, kvh, hd, bf16);
            free(x), free(o1), free(o2), free(k1), free(v1), free(k2), free(v2), free(pos), free(slot);
        }
}

Test(kernels_cpu, gather_rows_copies_the_indexed_rows) {
    enum { T = 9, C = 13, R = 4 };
    uint64_t s = 17;
    float x[T * C], out[R * C];
    for (int i = 0; i < T * C; i++) x[i] = frand(&s);
    const int32_t rows[R] = {8, 0, 3, 3};
    msm_cpu_gather_rows(out, x, rows, R, C);
    for (int r = 0; r < R; r++)
        cr_expect(memcmp(out + r * C, x + rows[r] * C, sizeof(float) * C) == 0, "row %d", r);
}

/* ---- GLM-4.5: group-limited sigmoid router, partial RoPE ---- */

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* 8 experts in 4 groups of 2, 2 groups kept, top-2. Group scores (top-2 sums of sigmoid + bias):
 * g0 0.6 + 0.6, g1 0.95 + 0.1, g2 (sigmoid(1) + 0.3) + 0.5, g3 0.5 + 0.5: g2 and g0 are kept, so
 * expert 2 (choice score 0.95, the second highest) is never chosen; among the kept experts 4 leads,
 * then 0 and 1 tie at 0.6 and the lower id wins. The weights are the unbiased sigmoid scores,
 * renormalised, then scaled. */
Test(kernels_cpu, group_router_keeps_the_best_groups_and_weighs_by_unbiased_scores) {
    const float logits[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    const float bias[8] = {0.1f, 0.1f, 0.45f, -0.4f, 0.3f, 0.0f, 0.0f, 0.0f};
    int32_t ids[2];
    float w[2], scratch[2 * 8 + 4];
    msm_cpu_router_group_topk(ids, w, logits, bias, 1, 8, 2, 4, 2, true, 2.0f, scratch);
    cr_expect(ids[0] == 4 && ids[1] == 0, "ids %d %d", ids[0], ids[1]);
    float s4 = sigm(1.0f), den = s4 + 0.5f + 1e-20f;
    cr_expect_float_eq(w[0], s4 / den * 2.0f, 1e-6f);
    cr_expect_float_eq(w[1], 0.5f / den * 2.0f, 1e-6f);
    /* without renormalisation: the scaled scores; with every group kept expert 2 comes second */
    msm_cpu_router_group_topk(ids, w, logits, bias, 1, 8, 2, 4, 2, false, 2.0f, scratch);
    cr_expect(ids[0] == 4 && ids[1] == 0 && w[0] == s4 * 2.0f && w[1] == 1.0f);
    msm_cpu_router_group_topk(ids, w, logits, bias, 1, 8, 2, 4, 4, false, 1.0f, scratch);
    cr_expect(ids[0] == 4 && ids[1] == 2 && w[1] == 0.5f, "ids %d %d", ids[0], ids[1]);
    msm_cpu_router_group_topk(ids, w, logits, bias, 1, 8, 2, 1, 1, false, 1.0f, scratch);
    cr_expect(ids[0] == 4 && ids[1] == 2, "one group: plain top-k of score + bias");
}

/* Against an independent brute force over random tokens: every kept group ranks in the top
 * topk_group by its top-2 sum, ids are distinct, in kept groups, in descending choice order, and
 * no expert outside them beats the last chosen. */
Test(kernels_cpu, group_router_choices_are_the_best_of_the_best_groups) {
    static const int shapes[][4] = {{16, 4, 4, 2}, {64, 8, 8, 3}, {12, 3, 2, 1}, {32, 1, 6, 1}}; /* E, G, k, kept */
    uint64_t st = 99;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int E = shapes[c][0], G = shapes[c][1], k = shapes[c][2], TG = shapes[c][3], per = E / G, T = 9;
        float *l = malloc(sizeof(float) * (size_t)T * E), *bias = malloc(sizeof(float) * (size_t)E);
        float *w = malloc(sizeof(float) * (size_t)T * k), *scratch = malloc(sizeof(float) * (size_t)(2 * E + G));
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * k);
        for (int i = 0; i < T * E; i++) l[i] = 3.0f * frand(&st);
        for (int e = 0; e < E; e++) bias[e] = 0.5f * frand(&st);
        msm_cpu_router_group_topk(ids, w, l, bias, T, E, k, G, TG, true, 1.5f, scratch);
        for (int t = 0; t < T; t++) {
            const float *lt = l + (size_t)t * E;
            float gs[8], sum = 0, den = 0;
            for (int j = 0; j < k; j++) den += sigm(lt[ids[t * k + j]]);
            for (int g = 0; g < G; g++) {
                float a = -INFINITY, b = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    float v = sigm(lt[e]) + bias[e];
                    if (v > a) b = a, a = v;
                    else if (v > b) b = v;
                }
                gs[g] = a + b;
            }
            for (int j = 0; j < k; j++) {
                int e = ids[t * k + j], g = e / per, better = 0;
                for (int q = 0; q < G; q++) better += gs[q] > gs[g];
                cr_assert_lt(better, TG, "shape %zu token %d: expert %d of a dropped group", c, t, e);
                for (int q = 0; q < j; q++) cr_assert_neq(ids[t * k + q], e);
                if (j) cr_assert_geq(sigm(lt[ids[t * k + j - 1]]) + bias[ids[t * k + j - 1]], sigm(lt[e]) + bias[e]);
                sum += w[t * k + j];
                cr_assert_float_eq(w[t * k + j], sigm(lt[e]) / den * 1.5f, 1e-5f, "the unbiased score, renormalised, scaled");
            }
            cr_expect_float_eq(sum, 1.5f, 1e-5f, "renormalised to 1, then scaled");
            /* no expert of a kept group outside the choice beats the last chosen */
            float last = sigm(lt[ids[t * k + k - 1]]) + bias[ids[t * k + k - 1]];
            for (int e = 0; e < E; e++) {
                bool chosen = false, kept_group = false;
                for (int j = 0; j < k; j++) chosen |= ids[t * k + j] == e;
                for (int j = 0; j < k; j++) kept_group |= ids[t * k + j] / per == e / per;
                if (!chosen && kept_group) cr_assert_leq(sigm(lt[e]) + bias[e], last);
            }
        }
        free(l), free(bias), free(w), free(scratch), free(ids);
    }
}

/* rot < hd: the first rot dims of each head turn as a rot-dim head would (frequencies from rot),
 * the rest pass through; rope_kv still equals rope_copy then the K/V write. */
Test(kernels_cpu, partial_rope_rotates_the_leading_dims_and_passes_the_rest) {
    enum { T = 3, NH = 4, HD = 16, ROT = 8 };
    uint64_t s = 31;
    float x[T * NH * HD], y[T * NH * HD], sub[T * NH * ROT];
    int32_t pos[T] = {0, 5, 123};
    for (int i = 0; i < T * NH * HD; i++) x[i] = y[i] = frand(&s);
    for (int i = 0; i < T * NH; i++) memcpy(sub + i * ROT, x + i * HD, sizeof(float) * ROT);
    msm_cpu_rope(y, pos, T, NH, HD, ROT, 10000.0f);
    msm_cpu_rope(sub, pos, T, NH, ROT, ROT, 10000.0f);
    for (int i = 0; i < T * NH; i++) {
        cr_expect(memcmp(y + i * HD, sub + i * ROT, sizeof(float) * ROT) == 0, "head row %d: rotated dims", i);
        cr_expect(memcmp(y + i * HD + ROT, x + i * HD + ROT, sizeof(float) * (HD - ROT)) == 0, "head row %d: pass-through", i);
    }
    for (size_t c = 0; c < N_QKV_SHAPES; c++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int Tq = qkv_shapes[c][0], nh = qkv_shapes[c][1], kvh = qkv_shapes[c][2], hd = qkv_shapes[c][3];
            int rot = hd / 2 < 2 ? 2 : hd / 2, C = (nh + 2 * kvh) * hd, nslots = 2 * MSM_KV_BLOCK + Tq;
            size_t n = (size_t)Tq * C, cache = (size_t)nslots * kvh * hd;
            float *xq = rand_floats(n, 41 + c), *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
            float *k1 = calloc(cache, sizeof(float)), *v1 = calloc(cache, sizeof(float));
            float *k2 = calloc(cache, sizeof(float)), *v2 = calloc(cache, sizeof(float));
            int32_t *pq = malloc(sizeof(int32_t) * (size_t)Tq), *slot = malloc(sizeof(int32_t) * (size_t)Tq);
            for (int t = 0; t < Tq; t++) pq[t] = 7 * t + 2, slot[t] = (t * 5) % nslots;
            msm_cpu_rope_copy(o1, xq, pq, Tq, C, nh + kvh, hd, rot, 1e4f);
            msm_cpu_kv_write_ld(k1, v1, o1 + (size_t)nh * hd, o1 + (size_t)(nh + kvh) * hd, (size_t)C, slot, Tq, kvh,
                                hd, bf16);
            msm_cpu_rope_kv(o2, xq, pq, slot, k2, v2, Tq, nh, kvh, hd, rot, 1e4f, bf16);
            cr_expect(memcmp(o1, o2, sizeof(float) * n) == 0 && memcmp(k1, k2, sizeof(float) * cache) == 0 &&
                      memcmp(v1, v2, sizeof(float) * cache) == 0, "shape %zu bf16 %d", c, bf16);
            free(xq), free(o1), free(o2), free(k1), free(v1), free(k2), free(v2), free(pq), free(slot);
        }
}
