/* tuning.cu: msm_cuda_tuning_init, the per-rank defaults of every launcher's choices (kernel
 * paths, thresholds, programmatic dependent launch) and the GPU facts they size grids by
 * (multiprocessors, the occupancy of the persistent and wave-sized kernels). The backend calls it
 * once per rank, on that rank's device, then applies its configuration; nothing here is global. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

extern "C" int msm_cuda_tuning_init(msm_cuda_tuning *t, int device) {
    memset(t, 0, sizeof *t);
    t->device = device;
    t->pdl = true;
    t->gemv_prefetch = false; /* measured slower at batch 1 (bench/results/2026-12-01-h200) */
    t->gemv_max_t = MSM_CUDA_GEMV_MAX_T;
    t->mmv_min_t = MSM_CUDA_MMV_MIN_T;
    t->mmv_max_t = MSM_CUDA_MMV_MAX_T;
    t->mmv_warps = 8;
    t->linear_tiled_min_t = MSM_CUDA_LINEAR_TILED_MIN_T;
    t->lt_split_min_t = MSM_CUDA_LT_SPLIT_MIN_T;
    t->moe_path = MSM_CUDA_MOE_PATH_AUTO;
    t->moe_tiled_min_t = MSM_CUDA_MOE_TILED_MIN_T;
    t->ar_oneshot_max_bytes = MSM_CUDA_AR_ONESHOT_MAX_BYTES;
    t->fp8_resident = true;
    t->fp8_native_max_t = MSM_CUDA_FP8_NATIVE_MAX_T;
    t->fp8_mma_min_t = MSM_CUDA_FP8_MMA_MIN_T;
    t->att_max_split = 16;
    t->att_group = 4;
    CUDA_TRY(cudaDeviceGetAttribute(&t->sms, cudaDevAttrMultiProcessorCount, device));
    if (t->sms < 1) return -ENODEV;
    msm__moe_tuning(t);
    int r = msm__moe_tiled_prepare();
    if (r) return r;
    r = msm__linear_tiled_prepare();
    if (r) return r;
    r = msm__linear_fp8_mma_prepare();
    if (r) return r;
    msm__attention_tuning(t);
    msm__linear_tuning(t);
    return 0;
}

/* ---- tuning from the environment ----
 * Benchmark and bisection switches (unset: the defaults of msm_cuda_tuning_init), read by the
 * CUDA backend once per rank when it is created and by bench/cuda_kernels:
 *   MSM_CUDA_PDL=0                      programmatic dependent launch off
 *   MSM_CUDA_GEMV_PREFETCH=1            the GEMV pulls its weight rows towards L2 before its PDL wait
 *   MSM_CUDA_GEMV_MAX_T=N               raise the GEMV / cuBLASLt threshold (never lowered)
 *   MSM_CUDA_MMV_MIN_T / _MAX_T=N       the tensor-core GEMV range (max 0: off)
 *   MSM_CUDA_LINEAR_TILED_MIN_T=N       the tiled linear from N tokens on (> 64: off)
 *   MSM_CUDA_LT_SPLIT_MIN_T=N           cuBLASLt hi + lo split from N tokens on (prefill)
 *   MSM_CUDA_LT_SPLIT_DECODE=1          ... and for pure decode steps too (the backend's tuning_for_decode)
 *   MSM_CUDA_MOE_PATH=pair|grouped_gemv|tiled|wmma   force a MoE path
 *   MSM_CUDA_MOE_TILED_MIN_T=N          the tiled MoE GEMMs from N tokens on
 *   MSM_CUDA_AR=nccl                    every all-reduce through NCCL (no one-shot kernel)
 *   MSM_CUDA_AR_ONESHOT_MAX_BYTES=N     the one-shot all-reduce up to N bytes (0: off)
 *   MSM_CUDA_MOE_KERNELS=simt,mma,no_prefetch,nt4,down_split  MoE kernel variants
 *   MSM_CUDA_FP8_RESIDENT=0             FP8 checkpoint weights dequantised to bf16 at load
 *   MSM_CUDA_FP8_NATIVE_MAX_T=N         FP8-resident weights take the FP8 GEMVs up to N tokens
 *   MSM_CUDA_FP8_LINEAR=mma|simt|simt_hw the FP8 linear kernel (tensor cores; SIMT GEMV, integer or hardware decode)
 *   MSM_CUDA_FP8_MMA_MIN_T=N            ... mma: the SIMT GEMV below N tokens
 *   MSM_CUDA_MMV_SLOTS=N                the MMV and MMV8 grids fill at most N blocks an SM (K slices)
 *   MSM_CUDA_MMV_WARPS=4                the MMV with 4 warps (64 rows) a block instead of 8
 *   MSM_CUDA_ATT_MAX_SPLIT=N            attention splits a token's context at most N ways (1..16)
 *   MSM_CUDA_LINEAR_NORM=1              LINEAR_ADD_RMSNORM in one kernel (the GEMV's last block norms)
 *   MSM_CUDA_ATT_GROUP=N                attention blocks take up to N query heads of a kv head (1..4) ...
 *   MSM_CUDA_ATT_GROUP_MIN=N            ... from N (token, query head) pairs on (0: one wave's blocks)
 * (the backend's own MSM_CUDA_SKIP_OPS: engine/cuda/backend_cuda.c) */

static bool env_int(const char *name, int *ret) {
    const char *s = getenv(name);
    if (!s || !*s) return false;
    *ret = atoi(s);
    return true;
}

extern "C" void msm_cuda_tuning_env(msm_cuda_tuning *t) {
    int v;
    const char *s;
    if ((s = getenv("MSM_CUDA_PDL")) && s[0] == '0') t->pdl = false;
    if ((s = getenv("MSM_CUDA_GEMV_PREFETCH"))) t->gemv_prefetch = s[0] == '1';
    if (env_int("MSM_CUDA_GEMV_MAX_T", &v) && v > t->gemv_max_t) t->gemv_max_t = v > 64 ? 64 : v;
    if (env_int("MSM_CUDA_MMV_MIN_T", &v)) t->mmv_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_MMV_MAX_T", &v)) t->mmv_max_t = v < 0 ? 0 : v > 64 ? 64 : v;
    if (env_int("MSM_CUDA_LINEAR_TILED_MIN_T", &v)) t->linear_tiled_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_LT_SPLIT_MIN_T", &v)) t->lt_split_min_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MOE_TILED_MIN_T", &v)) t->moe_tiled_min_t = v < 1 ? 1 : v;
    if ((s = getenv("MSM_CUDA_FP8_RESIDENT"))) t->fp8_resident = s[0] != '0';
    if (env_int("MSM_CUDA_FP8_NATIVE_MAX_T", &v)) t->fp8_native_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_FP8_MMA_MIN_T", &v)) t->fp8_mma_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_MMV_SLOTS", &v)) t->mmv_slots = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_MMV_WARPS", &v)) t->mmv_warps = v == 4 ? 4 : 8;
    if (env_int("MSM_CUDA_ATT_MAX_SPLIT", &v)) t->att_max_split = v < 1 ? 1 : v > 16 ? 16 : v;
    if ((s = getenv("MSM_CUDA_LINEAR_NORM"))) t->linear_norm_fused = s[0] == '1';
    if (env_int("MSM_CUDA_ATT_GROUP", &v)) t->att_group = v < 1 ? 1 : v > 4 ? 4 : v;
    if (env_int("MSM_CUDA_ATT_GROUP_MIN", &v)) t->att_group_min = v < 0 ? 0 : v;
    if ((s = getenv("MSM_CUDA_FP8_LINEAR")))
        t->fp8_linear = !strcmp(s, "simt") ? MSM_CUDA_FP8_LINEAR_SIMT
                        : !strcmp(s, "simt_hw") ? MSM_CUDA_FP8_LINEAR_SIMT_HW : MSM_CUDA_FP8_LINEAR_MMA;
    if (env_int("MSM_CUDA_AR_ONESHOT_MAX_BYTES", &v)) t->ar_oneshot_max_bytes = v < 0 ? 0 : (size_t)v;
    if ((s = getenv("MSM_CUDA_AR")) && !strcmp(s, "nccl")) t->ar_oneshot_max_bytes = 0;
    if ((s = getenv("MSM_CUDA_MOE_PATH")))
        t->moe_path = !strcmp(s, "pair")           ? MSM_CUDA_MOE_PATH_PAIR
                      : !strcmp(s, "grouped_gemv") ? MSM_CUDA_MOE_PATH_GROUPED_GEMV
                      : !strcmp(s, "wmma")         ? MSM_CUDA_MOE_PATH_WMMA
                      : !strcmp(s, "tiled")        ? MSM_CUDA_MOE_PATH_TILED
                                                   : MSM_CUDA_MOE_PATH_AUTO;
    if ((s = getenv("MSM_CUDA_MOE_KERNELS"))) {
        t->moe_kernels = 0;
        if (strstr(s, "simt")) t->moe_kernels |= MSM_CUDA_MOE_K_SIMT;
        if (strstr(s, "mma")) t->moe_kernels |= MSM_CUDA_MOE_K_MMA;
        if (strstr(s, "no_prefetch")) t->moe_kernels |= MSM_CUDA_MOE_K_NO_PREFETCH;
        if (strstr(s, "nt4")) t->moe_kernels |= MSM_CUDA_MOE_K_NT4;
        if (strstr(s, "down_split")) t->moe_kernels |= MSM_CUDA_MOE_K_DOWN_SPLIT;
    }
}
