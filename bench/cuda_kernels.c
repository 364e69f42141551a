/* cuda_kernels: timings of the CUDA kernels at Qwen1.5-MoE-A2.7B shapes on the GPU, as a markdown
 * table (bytes each kernel must move, GB/s, % of the device-copy ceiling measured in the same
 * run). A benchmark, never a test: run it by hand on a GPU machine and record the table in
 * bench/results/ (`bench/cuda_kernels [OUT.md]`; the table is printed and, with OUT.md, written).
 * Weights and caches rotate over a 1 GiB pool filled on the device, so each launch streams them
 * from HBM, not L2. Every kernel path is timed through its launcher with the rank tuning
 * (msm_cuda_tuning) set for that path, starting from the defaults with the CUDA backend's
 * MSM_CUDA_* switches applied (e.g. MSM_CUDA_MMV_SLOTS=4 times the MMVs under the old rule). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_fill.h"
#include "msm_cuda_backend.h"
#include "msm_cuda_kernels.h"
#include "msm_kernels.h"

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "cuda_kernels: %s failed at %s:%d (%s)\n", #cond, __FILE__, __LINE__, \
                    cudaGetErrorString(cudaGetLastError()));                                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CK(call) CHECK((call) == 0)

static uint64_t rng_state = 0x1234567;
static uint64_t rnd64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rndu(void) { return (float)(rnd64() >> 40) * (1.0f / 16777216.0f); }
static int rndi(int n) { return (int)(rnd64() % (uint64_t)n); }

static void *dev(size_t bytes) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess);
    return p;
}
static void *dev_up(const void *h, size_t bytes) {
    void *p = dev(bytes);
    CHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    return p;
}
/* A device buffer of n uniform floats in [-1, 1). */
static float *dev_f32(size_t n) {
    float *h = malloc(n * sizeof(float));
    CHECK(h);
    for (size_t i = 0; i < n; i++) h[i] = 2.0f * rndu() - 1.0f;
    float *d = dev_up(h, n * sizeof(float));
    free(h);
    return d;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* NSET routing sets of T tokens x k distinct experts (uniform over E <= 256), every weight wv,
 * on the device: *did / *dw [NSET][T][k]; returns the distinct experts summed over the sets. */
static double routing_sets(int32_t **did, float **dw, int NSET, int T, int k, int E, float wv) {
    int32_t *hid = malloc((size_t)NSET * T * k * 4);
    float *hw = malloc((size_t)NSET * T * k * 4);
    CHECK(hid && hw);
    double uniq_sum = 0;
    for (int q = 0; q < NSET; q++) {
        bool used[256] = {0};
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++) {
                int e;
                bool dup;
                do {
                    e = rndi(E);
                    dup = false;
                    for (int z = 0; z < j; z++) dup |= hid[((size_t)q * T + t) * k + z] == e;
                } while (dup);
                hid[((size_t)q * T + t) * k + j] = e;
                hw[((size_t)q * T + t) * k + j] = wv;
                if (!used[e]) used[e] = true, uniq_sum += 1;
            }
    }
    *did = dev_up(hid, (size_t)NSET * T * k * 4);
    *dw = dev_up(hw, (size_t)NSET * T * k * 4);
    free(hid), free(hw);
    return uniq_sum;
}

#define BENCH_REPS 15
#define BENCH_BATCH 20

/* Median ms of one msm_cuda_linear call (3 warm-up calls first); the weights rotate over the
 * pool, so each launch streams them from HBM, not L2. */
static double time_linear(float *y, const float *x, const uint16_t *pool, size_t pool_elems, int T, int N, int K,
                          msm_cuda_ctx *ctx, void *ws, size_t wsb, msm_cuda_exec ex, cudaEvent_t e0,
                          cudaEvent_t e1) {
    size_t welem = (size_t)N * K, nbuf = pool_elems / welem;
    if (nbuf < 1) nbuf = 1;
    double times[BENCH_REPS];
    for (int i = 0; i < 3; i++) CK(msm_cuda_linear(y, x, pool, NULL, T, N, K, ctx, ws, wsb, ex));
    int it = 0;
    for (int r = 0; r < BENCH_REPS; r++) {
        cudaEventRecord(e0, ex.stream);
        for (int b = 0; b < BENCH_BATCH; b++, it++)
            CK(msm_cuda_linear(y, x, pool + (it % nbuf) * welem, NULL, T, N, K, ctx, ws, wsb, ex));
        cudaEventRecord(e1, ex.stream);
        CHECK(cudaEventSynchronize(e1) == cudaSuccess);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        times[r] = ms / BENCH_BATCH;
    }
    return median(times, BENCH_REPS);
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "cuda_kernels: no GPU\n");
        return 2;
    }
    msm_cuda_tuning tune0;
    CK(msm_cuda_tuning_init(&tune0, 0));
    msm_cuda_tuning_from_env(&tune0); /* the backend's MSM_CUDA_* switches, to time kernel variants */
    static char buf[131072];
    int len = 0;
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamCreate(&st) == cudaSuccess);
    msm_cuda_exec ex = {.stream = st, .tune = &tune0};
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double times[BENCH_REPS];
    float ms;

    /* copy ceiling: 1 GiB device-to-device, bytes read + written */
    size_t cb = (size_t)1 << 30;
    void *c0 = dev(cb), *c1 = dev(cb);
    CK(msm_bench_fill_bf16(c0, cb / 2, 1, 1.0f, st));
    for (int i = 0; i < 3; i++) cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, st);
    for (int r = 0; r < BENCH_REPS; r++) {
        cudaEventRecord(e0, st);
        cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        times[r] = ms;
    }
    double copy_ms = median(times, BENCH_REPS), copy_gbs = 2.0 * cb / (copy_ms * 1e6);
    cudaFree(c1);
    len += snprintf(buf + len, sizeof buf - len,
                    "device: %s, %d SMs; copy ceiling (1 GiB D2D, read+write): %.0f GB/s\n\n"
                    "| kernel | shape | median ms | bytes moved | GB/s | %% of copy |\n"
                    "|---|---|---|---|---|---|\n",
                    prop.name, prop.multiProcessorCount, copy_gbs);

    /* GEMV linears at Qwen1.5-MoE-A2.7B shapes; weights rotate over the 1 GiB pool so each
     * launch streams them from HBM, not L2 */
    uint16_t *pool = c0;
    size_t pool_elems = cb / 2;
    float *x = dev_f32((size_t)256 * 5632), *y = dev((size_t)256 * 151936 * 4);
    static const int lin[][3] = {{1, 2048, 2048},  {1, 6144, 2048},  {1, 11264, 2048},
                                 {1, 60, 2048},    {1, 2048, 5632},  {1, 151936, 2048},
                                 {8, 2048, 2048},  {8, 11264, 2048}, {8, 151936, 2048}};
    for (size_t s = 0; s < sizeof lin / sizeof *lin; s++) {
        int T = lin[s][0], N = lin[s][1], K = lin[s][2];
        size_t welem = (size_t)N * K;
        double t = time_linear(y, x, pool, pool_elems, T, N, K, NULL, NULL, 0, ex, e0, e1);
        double bytes = (double)welem * 2 + (double)T * K * 4 + (double)T * N * 4;
        double gbs = bytes / (t * 1e6);
        len += snprintf(buf + len, sizeof buf - len,
                        "| linear GEMV | T=%d N=%d K=%d | %.4f | %.1f MB | %.0f | %.0f%% |\n", T, N,
                        K, t, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
    }

    /* moe_experts at T = 1..64, Qwen1.5-MoE: E=60, k=4, I=1408, H=2048; 64 routing sets */
    {
        int E = 60, k = 4, I = 1408, H = 2048, NSET = 64;
        size_t gun = (size_t)E * 2 * I * H, dnn = (size_t)E * H * I;
        uint16_t *gu = dev(gun * 2), *dn = dev(dnn * 2);
        CK(msm_bench_fill_bf16(gu, gun, 2, 0.02f, st));
        CK(msm_bench_fill_bf16(dn, dnn, 3, 0.02f, st));
        /* {T, path, kernel variants}: the defaults, then the variants of the grouped path */
        enum { PR = MSM_CUDA_MOE_PATH_PAIR, GG = MSM_CUDA_MOE_PATH_GROUPED_GEMV,
               WM = MSM_CUDA_MOE_PATH_WMMA, TL = MSM_CUDA_MOE_PATH_TILED, SIMT = MSM_CUDA_MOE_K_SIMT, MMA = MSM_CUDA_MOE_K_MMA,
               NP = MSM_CUDA_MOE_K_NO_PREFETCH, NT4 = MSM_CUDA_MOE_K_NT4 };
        static const int Ts[][3] = {{1, 0, 0},        {2, 0, 0},        {4, 0, 0},   {4, GG, 0},
                                    {8, 0, 0},        {8, PR, 0},       {16, 0, 0},  {16, 0, MMA},
                                    {32, 0, 0},       {32, 0, MMA},     {32, WM, 0}, {48, 0, 0},
                                    {48, 0, SIMT},    {64, 0, 0},       {64, 0, SIMT}, {64, 0, NP},
                                    {64, WM, 0},      {128, 0, 0},      {128, GG, 0},
                                    {256, 0, 0},      {256, GG, 0},     {128, GG, NT4},
                                    {256, GG, NT4},   {128, WM, 0},     {256, WM, 0},
                                    {512, 0, 0},      {512, WM, 0},     {16, TL, 0},
                                    {32, TL, 0},      {48, TL, 0},      {64, TL, 0}};
        static const char *pname[] = {"auto", "pair", "grouped_gemv", "wmma", "tiled"};
        static const char *kname[] = {"", " simt", " mma", "", " no_prefetch", "", "", "", " nt4"};
        for (size_t s = 0; s < sizeof Ts / sizeof *Ts; s++) {
            int T = Ts[s][0];
            msm_cuda_tuning tm = tune0;
            tm.moe_path = Ts[s][1];
            tm.moe_kernels = Ts[s][2];
            msm_cuda_exec exm = {.stream = st, .tune = &tm};
            int32_t *did;
            float *dw;
            double uniq_sum = routing_sets(&did, &dw, NSET, T, k, E, 0.25f);
            size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
            void *ws = dev(wsb);
            for (int i = 0; i < 3; i++)
                CK(msm_cuda_moe_experts(y, x, did, dw, gu, dn, T, H, I, k, E, ws, wsb, exm));
            int it = 0;
            for (int r = 0; r < BENCH_REPS; r++) {
                cudaEventRecord(e0, st);
                for (int b = 0; b < BENCH_BATCH; b++, it++) {
                    size_t o = (size_t)(it % NSET) * T * k;
                    CK(msm_cuda_moe_experts(y, x, did + o, dw + o, gu, dn, T, H, I, k, E, ws, wsb, exm));
                }
                cudaEventRecord(e1, st);
                CHECK(cudaEventSynchronize(e1) == cudaSuccess);
                cudaEventElapsedTime(&ms, e0, e1);
                times[r] = ms / BENCH_BATCH;
            }
            double t = median(times, BENCH_REPS);
            /* bytes the kernel must move: each distinct selected expert's weights once (the
             * GEMV path re-reads an expert shared by several tokens; L2 may absorb that) */
            double per_expert = 3.0 * I * H * 2, uniq = uniq_sum / NSET;
            double bytes = uniq * per_expert + (double)T * H * 8;
            double gbs = bytes / (t * 1e6);
            len += snprintf(buf + len, sizeof buf - len,
                            "| moe_experts %s%s | T=%d E=60 k=4 I=1408 H=2048 (%.1f distinct experts) | "
                            "%.4f | %.1f MB | %.0f | %.0f%% |\n",
                            pname[Ts[s][1]], kname[Ts[s][2]], T, uniq, t, bytes / 1e6, gbs,
                            100.0 * gbs / copy_gbs);
            cudaFree(did), cudaFree(dw), cudaFree(ws);
        }
        cudaFree(gu), cudaFree(dn);
    }

    /* dense linears of the model's shapes at decode batches: the default path against each path
     * forced (tiled GEMM, MMV, cuBLASLt with x rounded to bf16; cuBLASLt only past the GEMV's T) */
    {
        msm_cuda_ctx *ctx;
        CK(msm_cuda_ctx_new(&ctx));
        static const int lnk[][2] = {{6144, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}};
        static const int lts[] = {1, 4, 8, 16, 32, 64};
        static const char *lname[] = {"default", "tiled", "MMV", "cuBLASLt"};
        float *xl = dev_f32((size_t)64 * 5632);
        for (size_t ti = 0; ti < sizeof lts / sizeof *lts; ti++)
            for (int path = 0; path < 4; path++)
                for (size_t s = 0; s < sizeof lnk / sizeof *lnk; s++) {
                    int T = lts[ti], N = lnk[s][0], K = lnk[s][1];
                    if (path >= 3 && T <= MSM_CUDA_GEMV_MAX_T) continue;
                    msm_cuda_tuning tl = tune0;
                    if (path == 1) tl.linear_tiled_min_t = 1;
                    if (path >= 2) tl.linear_tiled_min_t = 1 << 30;
                    if (path == 2) tl.mmv_min_t = 1, tl.mmv_max_t = 64;
                    if (path >= 3) tl.mmv_max_t = 0;
                    msm_cuda_exec exl = {.stream = st, .tune = &tl};
                    size_t wsb = msm_cuda_linear_ws_bytes(T, N, K);
                    void *ws = dev(wsb ? wsb : 256);
                    size_t welem = (size_t)N * K;
                    double t = time_linear(y, xl, pool, pool_elems, T, N, K, ctx, ws, wsb, exl, e0, e1);
                    double bytes = (double)welem * 2 + (double)T * K * 4 + (double)T * N * 4;
                    double gbs = bytes / (t * 1e6);
                    len += snprintf(buf + len, sizeof buf - len,
                                    "| linear %s | T=%d N=%d K=%d | %.4f | %.1f MB | %.0f | %.0f%% |\n", lname[path],
                                    T, N, K, t, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
                    cudaFree(ws);
                }
        cudaFree(xl);
        msm_cuda_ctx_free(ctx);
    }
    /* FP8-resident weights (docs/adr/0006-fp8.md): the FP8 linear (FP8 GEMV up to
     * fp8_native_max_t, dequantised to bf16 past it: "FP8 deq") against the bf16 default on the
     * same shapes (Qwen3-30B-A3B's qkv, o_proj; Qwen1.5-MoE's qkv, o_proj), codes rotating over the
     * pool like the bf16 weights; then the routed experts at Qwen3-30B-A3B's shapes. Bytes: one per
     * code plus a float32 scale per row and 128 columns. */
    {
        msm_cuda_ctx *ctx;
        CK(msm_cuda_ctx_new(&ctx));
        static const int fnk[][2] = {{5120, 2048}, {2048, 4096}, {6144, 2048}, {2048, 2048}};
        static const int fts[] = {1, 4, 8, 16, 32, 64};
        size_t max_sc = (size_t)6144 * 32;
        float *hsc = malloc(max_sc * 4);
        for (size_t i = 0; i < max_sc; i++) hsc[i] = 1.0f / 448.0f / 32.0f;
        float *dsc = dev_up(hsc, max_sc * 4), *xl = dev_f32((size_t)64 * 5632);
        const uint8_t *qpool = (const uint8_t *)c0;
        for (size_t ti = 0; ti < sizeof fts / sizeof *fts; ti++)
            for (size_t s = 0; s < sizeof fnk / sizeof *fnk; s++)
                for (int v = 0; v < 4; v++) { /* FP8 (MMV8), FP8 dequantised, bf16, FP8 SIMT GEMV */
                    int T = fts[ti], N = fnk[s][0], K = fnk[s][1];
                    if (v == 1 && T < 16) continue;
                    msm_cuda_tuning tf = tune0;
                    if (v == 1) tf.fp8_native_max_t = 0;
                    if (v == 3) tf.fp8_linear = MSM_CUDA_FP8_LINEAR_SIMT;
                    msm_cuda_exec exf = {.stream = st, .tune = &tf};
                    size_t wsb = msm_cuda_linear_ws_bytes(T, N, K), dqb = msm_cuda_linear_fp8_deq_bytes(N, K);
                    void *ws = dev(wsb ? wsb : 256);
                    uint16_t *dq = dev(dqb);
                    size_t welem = (size_t)N * K, nbuf = cb / welem;
                    double t;
                    if (v == 2) {
                        t = time_linear(y, xl, pool, pool_elems, T, N, K, ctx, ws, wsb, exf, e0, e1);
                    } else {
                        for (int i = 0; i < 3; i++)
                            CK(msm_cuda_linear_fp8(y, xl, (msm_cuda_fp8w){qpool, dsc, 0}, NULL, T, N, K, ctx, ws, wsb,
                                                   dq, dqb, exf));
                        int it = 0;
                        for (int r = 0; r < BENCH_REPS; r++) {
                            cudaEventRecord(e0, st);
                            for (int b = 0; b < BENCH_BATCH; b++, it++) {
                                msm_cuda_fp8w w = {qpool + (it % nbuf) * welem, dsc, 0};
                                CK(msm_cuda_linear_fp8(y, xl, w, NULL, T, N, K, ctx, ws, wsb, dq, dqb, exf));
                            }
                            cudaEventRecord(e1, st);
                            CHECK(cudaEventSynchronize(e1) == cudaSuccess);
                            cudaEventElapsedTime(&ms, e0, e1);
                            times[r] = ms / BENCH_BATCH;
                        }
                        t = median(times, BENCH_REPS);
                    }
                    double wb = v == 2 ? (double)welem * 2 : (double)welem + (double)N * ((K + 127) / 128) * 4;
                    double bytes = wb + (double)T * K * 4 + (double)T * N * 4, gbs = bytes / (t * 1e6);
                    static const char *vn[] = {"FP8", "FP8 deq", "bf16", "FP8 simt"};
                    len += snprintf(buf + len, sizeof buf - len,
                                    "| linear %s | T=%d N=%d K=%d | %.4f | %.1f MB | %.0f | %.0f%% |\n", vn[v], T, N,
                                    K, t, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
                    cudaFree(ws), cudaFree(dq);
                }
        /* experts: Qwen3-30B-A3B (E 128, k 8, I 768, H 2048), 16 routing sets; FP8 (pair GEMVs to 4
         * tokens, grouped GEMVs to fp8_native_max_t, the FP8 tiled GEMMs past it), FP8 dequantised
         * (the FP8 tiled GEMMs off), bf16 default, and the FP8 tiled GEMMs at 16..64 tokens */
        int E = 128, k = 8, I = 768, H = 2048, NSET = 16;
        size_t gun = (size_t)E * 2 * I * H, dnn = (size_t)E * H * I;
        size_t gus = msm_cuda_fp8_scales(E, 2 * I, H, 0), dns = msm_cuda_fp8_scales(E, H, I, 0);
        uint16_t *gu = dev(gun * 2), *dn = dev(dnn * 2);
        CK(msm_bench_fill_bf16(gu, gun, 2, 0.02f, st));
        CK(msm_bench_fill_bf16(dn, dnn, 3, 0.02f, st));
        float *hs = malloc((gus > dns ? gus : dns) * 4);
        for (size_t i = 0; i < (gus > dns ? gus : dns); i++) hs[i] = 1.0f / 448.0f / 32.0f;
        float *gsc = dev_up(hs, gus * 4), *dnsc = dev_up(hs, dns * 4);
        msm_cuda_fp8w fgu = {(const uint8_t *)gu, gsc, 0}, fdn = {(const uint8_t *)dn, dnsc, 0};
        size_t dqb = msm_cuda_moe_fp8_deq_bytes(H, I, E);
        void *dq = dev(dqb);
        static const int mts[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
        for (size_t ti = 0; ti < sizeof mts / sizeof *mts; ti++)
            for (int v = 0; v < 6; v++) { /* FP8, FP8 dequantised, bf16, FP8 grouped MMA, FP8 grouped SIMT, FP8 tiled */
                int T = mts[ti];
                if ((v == 3 && T > 4) || (v == 4 && (T <= 4 || T > 64)) || (v == 5 && (T < 16 || T > 64))) continue;
                msm_cuda_tuning tm = tune0;
                if (v == 1) tm.fp8_native_max_t = 0, tm.fp8_moe_tiled = false;
                if (v == 5) tm.fp8_native_max_t = 0, tm.fp8_moe_tiled = true;
                if (v == 0) tm.fp8_moe_tiled = true; /* FP8: the native paths at every T */
                if (v == 3) tm.moe_path = MSM_CUDA_MOE_PATH_GROUPED_GEMV;
                if (v == 4) tm.moe_kernels = MSM_CUDA_MOE_K_SIMT;
                msm_cuda_exec exm = {.stream = st, .tune = &tm};
                int32_t *did;
                float *dw;
                double uniq_sum = routing_sets(&did, &dw, NSET, T, k, E, 0.125f);
                size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
                void *ws = dev(wsb);
                int it = 0;
                for (int r = -1; r < BENCH_REPS; r++) { /* r = -1: warm-up */
                    cudaEventRecord(e0, st);
                    for (int b = 0; b < BENCH_BATCH; b++, it++) {
                        size_t o = (size_t)(it % NSET) * T * k;
                        if (v == 2)
                            CK(msm_cuda_moe_experts(y, xl, did + o, dw + o, gu, dn, T, H, I, k, E, ws, wsb, exm));
                        else
                            CK(msm_cuda_moe_experts_fp8(y, xl, did + o, dw + o, fgu, fdn, T, H, I, k, E, ws, wsb, dq,
                                                        dqb, exm));
                    }
                    cudaEventRecord(e1, st);
                    CHECK(cudaEventSynchronize(e1) == cudaSuccess);
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (r >= 0) times[r] = ms / BENCH_BATCH;
                }
                double t = median(times, BENCH_REPS), uniq = uniq_sum / NSET;
                double per_expert = v == 2 ? 3.0 * I * H * 2 : 3.0 * I * H * (1.0 + 4.0 / 128);
                double bytes = uniq * per_expert + (double)T * H * 8, gbs = bytes / (t * 1e6);
                static const char *vn[] = {"FP8", "FP8 deq", "bf16", "FP8 grouped", "FP8 simt", "FP8 tiled"};
                len += snprintf(buf + len, sizeof buf - len,
                                "| moe_experts %s | T=%d E=128 k=8 I=768 H=2048 (%.1f distinct experts) | %.4f | %.1f MB "
                                "| %.0f | %.0f%% |\n", vn[v], T, uniq, t, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
                cudaFree(did), cudaFree(dw), cudaFree(ws);
            }
        cudaFree(gu), cudaFree(dn), cudaFree(gsc), cudaFree(dnsc), cudaFree(dq), cudaFree(dsc), cudaFree(xl);
        free(hs), free(hsc);
        msm_cuda_ctx_free(ctx);
    }
    /* attention decode at Qwen1.5-MoE shapes: nh = kvh = 16, hd 128, every sequence at position
     * 512; the caches rotate over the 1 GiB pool (as the linears' weights do) so they come from
     * HBM. "split" gives the workspace (flash-decoding with the in-kernel merge), "no ws" not. */
    {
        enum { ANH = 16, AHD = 128, ACTX = 513, ATM = 32 };
        int mb = (ACTX + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK;
        size_t kv = (size_t)ATM * mb * MSM_KV_BLOCK * ANH * AHD, nbuf = pool_elems / (2 * kv);
        int32_t *hbt = malloc((size_t)ATM * mb * 4), hseq[ATM], hpos[ATM];
        for (int i = 0; i < ATM * mb; i++) hbt[i] = i;
        for (int t = 0; t < ATM; t++) hseq[t] = t, hpos[t] = ACTX - 1;
        float *aq = dev_f32((size_t)ATM * ANH * AHD), *ao = dev((size_t)ATM * ANH * AHD * 4);
        int32_t *dbt = dev_up(hbt, (size_t)ATM * mb * 4), *dseq = dev_up(hseq, sizeof hseq),
                *dpos = dev_up(hpos, sizeof hpos);
        size_t wsb = msm_cuda_attention_ws_bytes(ATM, ANH, AHD);
        void *ws = dev(wsb);
        CHECK(cudaMemset(ws, 0, wsb) == cudaSuccess);
        float sc = 1.0f / sqrtf((float)AHD);
        static const int aT[] = {1, 8, 32};
        for (size_t s = 0; s < sizeof aT / sizeof *aT; s++)
            for (int split = 1; split >= 0; split--) {
                int T = aT[s];
                void *w = split ? ws : NULL;
                size_t wb = split ? wsb : 0;
                for (int i = 0; i < 3; i++)
                    CK(msm_cuda_attention_ex(ao, aq, ANH * AHD, pool, pool + kv, dseq, dpos, dbt, mb, T, ANH,
                                             ANH, AHD, sc, w, wb, ex));
                int it = 0;
                for (int r = 0; r < BENCH_REPS; r++) {
                    cudaEventRecord(e0, st);
                    for (int b = 0; b < BENCH_BATCH; b++, it++) {
                        uint16_t *kc = pool + (it % nbuf) * 2 * kv;
                        CK(msm_cuda_attention_ex(ao, aq, ANH * AHD, kc, kc + kv, dseq, dpos, dbt, mb, T, ANH,
                                                 ANH, AHD, sc, w, wb, ex));
                    }
                    cudaEventRecord(e1, st);
                    CHECK(cudaEventSynchronize(e1) == cudaSuccess);
                    cudaEventElapsedTime(&ms, e0, e1);
                    times[r] = ms / BENCH_BATCH;
                }
                double t = median(times, BENCH_REPS);
                double bytes = (double)T * ANH * ACTX * AHD * 2 * 2 + (double)T * ANH * AHD * 8;
                double gbs = bytes / (t * 1e6);
                len += snprintf(buf + len, sizeof buf - len,
                                "| attention %s | T=%d nh=kvh=%d hd=%d pos=%d | %.4f | %.1f MB | %.0f | %.0f%% |\n",
                                split ? "split" : "no ws", T, ANH, AHD, ACTX - 1, t, bytes / 1e6, gbs,
                                100.0 * gbs / copy_gbs);
            }
        cudaFree(dbt), cudaFree(dseq), cudaFree(dpos), cudaFree(aq), cudaFree(ao), cudaFree(ws);
        free(hbt);
    }
    CHECK(cudaGetLastError() == cudaSuccess);
    printf("%s", buf);
    fflush(stdout);
    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (!f) {
            perror(argv[1]);
            return 1;
        }
        fputs(buf, f);
        fclose(f);
    }
    cudaFree(c0), cudaFree(x), cudaFree(y);
    return 0;
}


