/* test_cuda_kernels: every CUDA kernel (kernels/cuda) against its CPU oracle (kernels/cpu) over a
 * table of shapes: odd sizes, T = 1 and T > 64, GQA and MHA. Inputs are random (never zeros),
 * outputs are poisoned with NaN before each run, and results are compared by
 * ||out - ref|| / ||ref|| with the per-op tolerance (fp32 math ~1e-5; bf16-rounded activations
 * ~1e-2, as device/METHOD.md gives). Weights are random bf16 on both sides (the CPU gets their
 * exact f32 values), so only the arithmetic differs.
 *
 * Every test checks for a GPU in its own body (Criterion runs each test in a child process; the
 * runner process never touches CUDA) and skips with "no GPU" where there is none.
 *
 * Each test runs with the default tuning of GPU 0 (msm_cuda_tuning_init); tests of one kernel
 * path pass their own copy with that path forced. The timings are a benchmark of their own:
 * bench/cuda_kernels.c. */
#include <criterion/criterion.h>

#ifdef MSM_HAVE_CUDA
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "msm_cuda_backend.h"
#include "msm_cuda_kernels.h"
#include "msm_dtype.h"
#include "msm_kernels.h"

/* ---- helpers ---- */

/* GPU 0's default tuning, filled by need_gpu (each test runs in its own process). */
static msm_cuda_tuning tune0;

static void need_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) cr_skip_test("no GPU");
    cr_assert_eq(msm_cuda_tuning_init(&tune0, 0), 0, "msm_cuda_tuning_init");
}

/* The MSM_CUDA_* switches (msm_cuda_tuning_from_env): each sets its field, out-of-range values are
 * clamped, unknown words leave the default, unset variables leave a field alone. Host code only:
 * runs without a GPU. */
Test(cuda_kernels, tuning_env_applies_the_switches) {
    static const char *vars[] = {"MSM_CUDA_PDL", "MSM_CUDA_GEMV_PREFETCH", "MSM_CUDA_MMV_MAX_T",
                                 "MSM_CUDA_MMV_SLOTS", "MSM_CUDA_MMV_WARPS", "MSM_CUDA_ATT_MAX_SPLIT",
                                 "MSM_CUDA_ATT_GROUP", "MSM_CUDA_ATT_GROUP_MIN", "MSM_CUDA_LINEAR_NORM",
                                 "MSM_CUDA_FP8_LINEAR", "MSM_CUDA_MOE_PATH", "MSM_CUDA_MOE_KERNELS", "MSM_CUDA_AR",
                                 "MSM_CUDA_FP8_MMA_MIN_T", "MSM_CUDA_ATT_MMA", "MSM_CUDA_ATT_MMA_MIN_BLOCKS",
                                 "MSM_CUDA_ROUTER_CHUNK_PER_SM", "MSM_CUDA_ATT_CLUSTER", "MSM_CUDA_ATT_EARLY",
                                 "MSM_CUDA_ATT_ROPE", "MSM_CUDA_ATT_QK_ROPE", "MSM_CUDA_FP8_MOE_TILED", "MSM_CUDA_GEMV_EARLY", "MSM_CUDA_QK_ROPE",
                                 "MSM_CUDA_FP8_MOE_TILED_MIN_T", "MSM_CUDA_FP8_GEMV_ROWS", "MSM_CUDA_FP8_GEMV_U8", "MSM_CUDA_NORM_LINEAR",
                                 "MSM_CUDA_FP8_MOE_HW", "MSM_CUDA_ROWS_PIPE", "MSM_CUDA_NORM_ROUTER",
                                 "MSM_CUDA_NORM_ROUTER_MAX_T", "MSM_CUDA_GEMV_U16", "MSM_CUDA_MOE_TILED_BM", "MSM_CUDA_FP8_TILED_KS",
                                 "MSM_CUDA_FP8_LINEAR_MAX_T", "MSM_CUDA_FP8_LINEAR_TILED_MIN_T",
                                 "MSM_CUDA_STREAM_PRIO", "MSM_CUDA_LINEAR_ROPE", "MSM_CUDA_ROUTER_CLUSTER",
                                 "MSM_CUDA_MMV_FIT_CLUSTERS", "MSM_CUDA_MMV_U8_MAX_BLOCKS",
                                 "MSM_CUDA_MOE_GROUP_SCAN_MAX_T", "MSM_CUDA_MOE_GG_GATEUP_NT", "MSM_CUDA_MOE_GG_DOWN_NT",
                                 "MSM_CUDA_MOE_GG_DOWN_U", "MSM_CUDA_MOE_GG_EARLY", "MSM_CUDA_ATT_BT_CACHE",
                                 "MSM_CUDA_GEMV_MINB", "MSM_CUDA_MMV_BSLICE", "MSM_CUDA_MOE_DOWN_HB", "MSM_CUDA_MMV_NJ",
                                 "MSM_CUDA_MOE_GU_U2", "MSM_CUDA_MOE_GG_COMPACT", "MSM_CUDA_MOE_GG_GATEUP_U",
                                 "MSM_CUDA_MOE_GG_PERSIST", "MSM_CUDA_LINEAR_SWIGLU",
                                 "MSM_CUDA_LINEAR_SWIGLU_ROWS", "MSM_CUDA_AUX_GEMV_ROWS", "MSM_CUDA_LINEAR_ROPE_MMV",
                                 "MSM_CUDA_L2_PREFETCH_MAX_T", "MSM_CUDA_L2_PREFETCH_MB", "MSM_CUDA_L2_PREFETCH_LAST",
                                 "MSM_CUDA_L2_PREFETCH_BLOCKS", "MSM_CUDA_L2_PREFETCH_CHUNK_KB", "MSM_CUDA_L2_PERSIST_MB",
                                 "MSM_CUDA_L2_PREFETCH_KV_MB", "MSM_CUDA_L2_PREFETCH_KV_MAX_T", "MSM_CUDA_FP8_MOE_LEAN",
                                 "MSM_CUDA_FP8_GEMV_SPLIT", "MSM_CUDA_FP8_GEMV_HW", "MSM_CUDA_MMV_STREAM_MIN_N",
                                 "MSM_CUDA_MMV_STREAM_MIN_T", "MSM_CUDA_NORM_LINEAR_SWIGLU", "MSM_CUDA_NORM_SWIGLU_ROWS",
                                 "MSM_CUDA_MOE_PAIR_EARLY", "MSM_CUDA_NORM_QK_ROPE", "MSM_CUDA_ATT_MMA_SPLIT",
                                 "MSM_CUDA_MOE_FUSED_COMBINE", "MSM_CUDA_MOE_COMBINE_CLUSTER", "MSM_CUDA_ATT_MMA_SPLIT_MIN_T",
                                 "MSM_CUDA_ATT_MMA_SPLIT_MAX_T", "MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T",
                                 "MSM_CUDA_ATT_CLUSTER_SPARE", "MSM_CUDA_ROUTER_GROUP",
                                 "MSM_CUDA_MOE_COMBINE_EARLY", "MSM_CUDA_ROUTER_TCLUSTER",
                                 "MSM_CUDA_ROUTER_TCLUSTER_TB", "MSM_CUDA_MMV_L2_REST", "MSM_CUDA_MMV_STREAM_ST",
                                 "MSM_CUDA_MMV_STREAM_BS_MIN_N", "MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX",
                                 "MSM_CUDA_ROUTER_ST_ASYNC"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    msm_cuda_tuning t, z;
    memset(&t, 0, sizeof t);
    t.pdl = true, t.mmv_max_t = 8, t.mmv_warps = 8, t.att_max_split = 16, t.att_group = 4, t.ar_oneshot_max_bytes = 4096;
    t.att_cluster = t.att_early = t.att_rope = true, t.att_qk_rope = 1;
    t.fp8_moe_tiled = t.gemv_early = t.qk_rope = t.fp8_gemv_u8 = t.norm_linear = t.linear_rope = true;
    t.router_cluster_max_t = 1, t.router_group = t.moe_combine_early = true, t.mmv_fit_clusters = true, t.mmv_bslice = 1, t.moe_down_hb = 2, t.mmv_nj = 2;
    z = t;
    msm_cuda_tuning_from_env(&t);
    cr_expect(memcmp(&t, &z, sizeof t) == 0, "no switch set: nothing changes");
    setenv("MSM_CUDA_PDL", "0", 1), setenv("MSM_CUDA_GEMV_PREFETCH", "1", 1), setenv("MSM_CUDA_MMV_MAX_T", "99", 1);
    setenv("MSM_CUDA_MMV_SLOTS", "3", 1), setenv("MSM_CUDA_MMV_WARPS", "4", 1), setenv("MSM_CUDA_ATT_MAX_SPLIT", "40", 1);
    setenv("MSM_CUDA_ATT_GROUP", "0", 1), setenv("MSM_CUDA_ATT_GROUP_MIN", "-5", 1);
    setenv("MSM_CUDA_LINEAR_NORM", "1", 1), setenv("MSM_CUDA_FP8_LINEAR", "simt_hw", 1);
    setenv("MSM_CUDA_MOE_PATH", "tiled", 1), setenv("MSM_CUDA_MOE_KERNELS", "mma,down_split", 1);
    setenv("MSM_CUDA_AR", "nccl", 1), setenv("MSM_CUDA_FP8_MMA_MIN_T", "0", 1);
    setenv("MSM_CUDA_ATT_MMA", "5", 1), setenv("MSM_CUDA_ATT_MMA_MIN_BLOCKS", "-3", 1);
    setenv("MSM_CUDA_ROUTER_CHUNK_PER_SM", "1", 1), setenv("MSM_CUDA_FP8_MOE_TILED", "0", 1);
    setenv("MSM_CUDA_ATT_CLUSTER", "0", 1), setenv("MSM_CUDA_ATT_EARLY", "0", 1), setenv("MSM_CUDA_ATT_ROPE", "0", 1);
    setenv("MSM_CUDA_ATT_QK_ROPE", "7", 1);
    setenv("MSM_CUDA_GEMV_EARLY", "0", 1), setenv("MSM_CUDA_QK_ROPE", "0", 1), setenv("MSM_CUDA_FP8_MOE_TILED_MIN_T", "-2", 1);
    setenv("MSM_CUDA_FP8_GEMV_U8", "0", 1), setenv("MSM_CUDA_NORM_LINEAR", "0", 1);
    setenv("MSM_CUDA_FP8_MOE_HW", "0", 1), setenv("MSM_CUDA_ROWS_PIPE", "21", 1);
    setenv("MSM_CUDA_NORM_ROUTER", "0", 1), setenv("MSM_CUDA_NORM_ROUTER_MAX_T", "-1", 1);
    setenv("MSM_CUDA_GEMV_U16", "0", 1), setenv("MSM_CUDA_MOE_TILED_BM", "32", 1), setenv("MSM_CUDA_FP8_TILED_KS", "2", 1);
    setenv("MSM_CUDA_FP8_LINEAR_MAX_T", "-4", 1), setenv("MSM_CUDA_FP8_LINEAR_TILED_MIN_T", "0", 1);
    setenv("MSM_CUDA_STREAM_PRIO", "aux", 1), setenv("MSM_CUDA_LINEAR_ROPE", "0", 1);
    setenv("MSM_CUDA_ROUTER_CLUSTER", "-3", 1), setenv("MSM_CUDA_MMV_FIT_CLUSTERS", "0", 1);
    setenv("MSM_CUDA_ROUTER_GROUP", "0", 1), setenv("MSM_CUDA_MOE_COMBINE_EARLY", "0", 1);
    setenv("MSM_CUDA_ROUTER_TCLUSTER", "99", 1), setenv("MSM_CUDA_ROUTER_TCLUSTER_TB", "3", 1);
    setenv("MSM_CUDA_ROUTER_ST_ASYNC", "1", 1);
    setenv("MSM_CUDA_MMV_L2_REST", "1", 1), setenv("MSM_CUDA_MMV_STREAM_ST", "1", 1);
    setenv("MSM_CUDA_MMV_STREAM_BS_MIN_N", "-3", 1), setenv("MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX", "40", 1);
    setenv("MSM_CUDA_MMV_U8_MAX_BLOCKS", "-7", 1);
    setenv("MSM_CUDA_MOE_GROUP_SCAN_MAX_T", "-1", 1), setenv("MSM_CUDA_MOE_GG_GATEUP_NT", "2", 1);
    setenv("MSM_CUDA_MOE_GG_DOWN_NT", "3", 1), setenv("MSM_CUDA_MOE_GG_DOWN_U", "3", 1);
    setenv("MSM_CUDA_MOE_GG_GATEUP_U", "5", 1), setenv("MSM_CUDA_MOE_GG_PERSIST", "-3", 1);
    setenv("MSM_CUDA_MOE_GG_EARLY", "0", 1), setenv("MSM_CUDA_ATT_BT_CACHE", "0", 1);
    setenv("MSM_CUDA_MOE_GG_COMPACT", "0", 1), setenv("MSM_CUDA_LINEAR_SWIGLU", "0", 1);
    setenv("MSM_CUDA_LINEAR_SWIGLU_ROWS", "2", 1), setenv("MSM_CUDA_AUX_GEMV_ROWS", "2", 1);
    setenv("MSM_CUDA_LINEAR_ROPE_MMV", "1", 1);
    setenv("MSM_CUDA_L2_PREFETCH_MAX_T", "-3", 1), setenv("MSM_CUDA_L2_PREFETCH_MB", "5000", 1);
    setenv("MSM_CUDA_L2_PREFETCH_LAST", "1", 1), setenv("MSM_CUDA_L2_PREFETCH_BLOCKS", "0", 1);
    setenv("MSM_CUDA_L2_PREFETCH_CHUNK_KB", "2000", 1), setenv("MSM_CUDA_L2_PERSIST_MB", "-1", 1);
    setenv("MSM_CUDA_L2_PREFETCH_KV_MB", "-2", 1), setenv("MSM_CUDA_FP8_MOE_LEAN", "7", 1);
    setenv("MSM_CUDA_L2_PREFETCH_KV_MAX_T", "-1", 1);
    setenv("MSM_CUDA_FP8_GEMV_SPLIT", "9", 1), setenv("MSM_CUDA_FP8_GEMV_HW", "1", 1);
    setenv("MSM_CUDA_GEMV_MINB", "7", 1), setenv("MSM_CUDA_MMV_BSLICE", "0", 1);
    setenv("MSM_CUDA_MOE_DOWN_HB", "4", 1), setenv("MSM_CUDA_MOE_GU_U2", "1", 1), setenv("MSM_CUDA_MMV_NJ", "4", 1);
    setenv("MSM_CUDA_MMV_STREAM_MIN_N", "-5", 1), setenv("MSM_CUDA_MMV_STREAM_MIN_T", "12", 1);
    setenv("MSM_CUDA_NORM_LINEAR_SWIGLU", "1", 1), setenv("MSM_CUDA_NORM_SWIGLU_ROWS", "3", 1);
    setenv("MSM_CUDA_MOE_PAIR_EARLY", "1", 1), setenv("MSM_CUDA_NORM_QK_ROPE", "1", 1);
    setenv("MSM_CUDA_ATT_MMA_SPLIT", "1", 1), setenv("MSM_CUDA_MOE_FUSED_COMBINE", "1", 1);
    setenv("MSM_CUDA_MOE_COMBINE_CLUSTER", "0", 1);
    setenv("MSM_CUDA_ATT_MMA_SPLIT_MIN_T", "-2", 1), setenv("MSM_CUDA_ATT_MMA_SPLIT_MAX_T", "-3", 1);
    setenv("MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T", "-1", 1), setenv("MSM_CUDA_ATT_CLUSTER_SPARE", "-4", 1);
    t.att_bt_cache = true;
    t.att_cluster_spare = 8;
    t.moe_gg_early = t.moe_gg_compact = t.linear_swiglu = true, t.moe_group_scan_max_t = 64, t.moe_gg_down_nt = 2;
    t.norm_router = t.gemv_u16 = true;
    t.fp8_moe_hw = true;
    msm_cuda_tuning_from_env(&t);
    cr_expect(!t.fp8_moe_hw, "MSM_CUDA_FP8_MOE_HW=0: the integer decode");
    cr_expect_eq(t.fp8_moe_lean, 2, "MSM_CUDA_FP8_MOE_LEAN clamped to 2");
    cr_expect_eq(t.fp8_gemv_split, 3, "MSM_CUDA_FP8_GEMV_SPLIT clamped to 3");
    cr_expect(t.fp8_gemv_hw, "MSM_CUDA_FP8_GEMV_HW=1: the hardware decode");
    cr_expect_eq(t.rows_pipe, 21 & 15, "MSM_CUDA_ROWS_PIPE: the mask's known kernels");
    cr_expect(!t.norm_router, "MSM_CUDA_NORM_ROUTER=0: the norm and the router two kernels");
    cr_expect_eq(t.norm_router_max_t, 0, "clamped to 0");
    cr_expect(!t.gemv_u16, "MSM_CUDA_GEMV_U16=0: four steps of 4 loads");
    cr_expect_eq(t.moe_tiled_bm, 32);
    cr_expect_eq(t.fp8_tiled_ks, 2);
    cr_expect_eq(t.fp8_linear_max_t, 0, "clamped to 0");
    cr_expect_eq(t.fp8_linear_tiled_min_t, 1, "clamped to 1");
    cr_expect_eq(t.stream_prio, MSM_CUDA_PRIO_AUX);
    cr_expect(!t.linear_rope, "MSM_CUDA_LINEAR_ROPE=0: the linear and the RoPE two kernels");
    cr_expect_eq(t.router_cluster_max_t, 0, "clamped to 0: the counter and the last block");
    cr_expect_eq(t.router_tcluster_max_t, 64, "clamped to 64");
    cr_expect_eq(t.router_tcluster_tb, 2, "3: 2 tokens a cluster");
    cr_expect(t.router_st_async, "the routers' logits by st.async");
    cr_expect(t.mmv_l2_rest, "MSM_CUDA_MMV_L2_REST=1: the later rounds prefetched into L2");
    cr_expect_eq(t.mmv_stream_st, 0, "1: the automatic stages");
    cr_expect_eq(t.mmv_stream_bs_min_n, 0, "clamped to 0: the block-sliced MMV not streamed");
    cr_expect_eq(t.att_mma_split_gqa_max, 16, "clamped to 16");
    cr_expect(!t.mmv_fit_clusters, "MSM_CUDA_MMV_FIT_CLUSTERS=0: K slices by blocks alone");
    cr_expect_eq(t.mmv_u8_max_blocks, 0, "clamped to 0: 4 chunks in flight");
    cr_expect_eq(t.moe_group_scan_max_t, 0, "clamped to 0: the grouping kernel always");
    cr_expect_eq(t.moe_gg_gateup_nt, 2);
    cr_expect_eq(t.moe_gg_down_nt, 4, "not 2: 4 tokens a pass");
    cr_expect_eq(t.moe_gg_down_u, 3);
    cr_expect_eq(t.moe_gg_gateup_u, 2, "5 is no choice: 2 chunks in flight");
    cr_expect_eq(t.moe_gg_persist, 0, "negative: no grouped GEMV persistent");
    cr_expect(!t.moe_gg_early, "MSM_CUDA_MOE_GG_EARLY=0: the down waits first");
    cr_expect(!t.moe_gg_compact, "MSM_CUDA_MOE_GG_COMPACT=0: a grid row per expert");
    cr_expect(!t.linear_swiglu, "MSM_CUDA_LINEAR_SWIGLU=0: the gate/up linear and the SwiGLU two kernels");
    cr_expect_eq(t.linear_swiglu_rows, 2);
    cr_expect_eq(t.aux_gemv_rows, 2);
    cr_expect(t.linear_rope_mmv, "MSM_CUDA_LINEAR_ROPE_MMV=1: the qkv MMV rotates too");
    cr_expect_eq(t.l2_prefetch_max_t, 0, "clamped to 0: never");
    cr_expect_eq(t.l2_prefetch_bytes, (size_t)4096 << 20, "clamped to 4 GiB");
    cr_expect(t.l2_prefetch_last, "MSM_CUDA_L2_PREFETCH_LAST=1: evict_last");
    cr_expect_eq(t.l2_prefetch_blocks, 1, "clamped to 1");
    cr_expect_eq(t.l2_prefetch_chunk_kb, 1024, "clamped to 1 MiB");
    cr_expect_eq(t.l2_persist_mb, 0, "clamped to 0: the device's setting left alone");
    cr_expect_eq(t.l2_prefetch_kv_bytes, 0u, "clamped to 0: no K/V prefetch");
    cr_expect_eq(t.l2_prefetch_kv_max_t, 0, "clamped to 0: never");
    cr_expect(!t.att_bt_cache, "MSM_CUDA_ATT_BT_CACHE=0: a table load before each tile");
    cr_expect_eq(t.gemv_minb, 3, "MSM_CUDA_GEMV_MINB: the mask's known kernels");
    cr_expect_eq(t.mmv_bslice, 0, "MSM_CUDA_MMV_BSLICE=0: K slices in clusters");
    cr_expect_eq(t.moe_down_hb, 4, "MSM_CUDA_MOE_DOWN_HB=4: four down rows a warp");
    cr_expect_eq(t.mmv_nj, 4, "MSM_CUDA_MMV_NJ=4: 32 rows a warp");
    cr_expect_eq(t.mmv_stream_min_n, 0, "clamped to 0: no streamed MMV");
    cr_expect_eq(t.mmv_stream_min_t, 8, "clamped to 8");
    cr_expect(t.norm_linear_swiglu, "MSM_CUDA_NORM_LINEAR_SWIGLU=1: the norm, the gate/up and the SwiGLU one kernel");
    cr_expect_eq(t.norm_swiglu_rows, 2, "MSM_CUDA_NORM_SWIGLU_ROWS=3: not a form, 2 rows a warp");
    cr_expect_eq(t.moe_pair_early, MSM_CUDA_MOE_PAIR_EARLY_ON,
                 "MSM_CUDA_MOE_PAIR_EARLY=1: the split down's weights before its wait");
    cr_expect(t.norm_qk_rope, "MSM_CUDA_NORM_QK_ROPE=1: the norm, the qkv GEMV and the q/k norm + RoPE one kernel");
    cr_expect(t.att_mma_split, "MSM_CUDA_ATT_MMA_SPLIT=1: the tensor-core attention split over a cluster");
    cr_expect_eq(t.att_mma_split_min_t, 1, "clamped to 1");
    cr_expect_eq(t.att_mma_split_max_t, 0, "clamped to 0: no bound");
    cr_expect_eq(t.att_mma_split_mha_max_t, 0, "clamped to 0: MHA never");
    cr_expect_eq(t.att_cluster_spare, 0, "MSM_CUDA_ATT_CLUSTER_SPARE clamped to 0: no cluster kept spare");
    cr_expect_eq(t.moe_fused_combine, 1, "MSM_CUDA_MOE_FUSED_COMBINE=1: the experts' combine inside any next norm");
    cr_expect(!t.moe_combine_cluster, "MSM_CUDA_MOE_COMBINE_CLUSTER=0: one block a token");
    cr_expect_eq(t.moe_gu_u2, MSM_CUDA_MOE_GU_U2_ON, "MSM_CUDA_MOE_GU_U2=1: the gate/up at 2 loads a row");
    cr_expect(!t.fp8_gemv_u8, "MSM_CUDA_FP8_GEMV_U8=0: 4 loads a lane a row");
    cr_expect(!t.norm_linear, "MSM_CUDA_NORM_LINEAR=0: the norm and the linear two kernels");
    cr_expect(!t.router_group, "MSM_CUDA_ROUTER_GROUP=0: the grouping kernel after the router");
    cr_expect(!t.moe_combine_early, "MSM_CUDA_MOE_COMBINE_EARLY=0: the combines read the routing after their wait");
    cr_expect_eq(t.fp8_moe_tiled_min_t, 1, "clamped to 1");
    setenv("MSM_CUDA_FP8_GEMV_ROWS", "3", 1);
    msm_cuda_tuning_from_env(&t);
    cr_expect_eq(t.fp8_gemv_rows, 0, "not 1, 2 or 4: the default rule");
    setenv("MSM_CUDA_FP8_GEMV_ROWS", "2", 1);
    msm_cuda_tuning_from_env(&t);
    cr_expect_eq(t.fp8_gemv_rows, 2);
    cr_expect(!t.att_cluster && !t.att_early && !t.att_rope && !t.gemv_early && !t.qk_rope);
    cr_expect_eq(t.att_qk_rope, 2, "MSM_CUDA_ATT_QK_ROPE clamped to 2 (always)");
    cr_expect(!t.pdl && t.gemv_prefetch);
    cr_expect_eq(t.mmv_max_t, 64, "clamped to 64");
    cr_expect_eq(t.mmv_slots, 3);
    cr_expect_eq(t.mmv_warps, 4);
    cr_expect_eq(t.att_max_split, 16, "clamped to 16");
    cr_expect_eq(t.att_group, 1, "clamped to 1");
    cr_expect_eq(t.att_group_min, 0, "clamped to 0");
    cr_expect(t.linear_norm_fused);
    cr_expect_eq(t.fp8_linear, MSM_CUDA_FP8_LINEAR_SIMT_HW);
    cr_expect_eq(t.moe_path, MSM_CUDA_MOE_PATH_TILED);
    cr_expect_eq(t.moe_kernels, MSM_CUDA_MOE_K_MMA | MSM_CUDA_MOE_K_DOWN_SPLIT);
    cr_expect_eq(t.ar_oneshot_max_bytes, 0u, "MSM_CUDA_AR=nccl: no one-shot all-reduce");
    cr_expect_eq(t.fp8_mma_min_t, 1, "clamped to 1");
    cr_expect_eq(t.att_mma, MSM_CUDA_ATT_MMA_ON, "2 and up: wherever it fits");
    cr_expect_eq(t.att_mma_min_blocks, 0, "clamped to 0");
    cr_expect_eq(t.router_chunk_per_sm, 1);
    cr_expect(!t.fp8_moe_tiled, "MSM_CUDA_FP8_MOE_TILED=0: FP8 experts past the GEMVs dequantised");
    setenv("MSM_CUDA_MMV_WARPS", "6", 1), setenv("MSM_CUDA_MOE_PATH", "bogus", 1), setenv("MSM_CUDA_ATT_MMA", "0", 1);
    setenv("MSM_CUDA_FP8_MOE_TILED", "1", 1), setenv("MSM_CUDA_MOE_TILED_BM", "48", 1);
    setenv("MSM_CUDA_FP8_TILED_KS", "3", 1);
    msm_cuda_tuning_from_env(&t);
    cr_expect_eq(t.moe_tiled_bm, 0, "not 16, 32 or 64: by the tokens an expert");
    cr_expect_eq(t.fp8_tiled_ks, 1, "not 2: one K step a stage");
    cr_expect(t.fp8_moe_tiled);
    cr_expect_eq(t.att_mma, MSM_CUDA_ATT_MMA_OFF);
    cr_expect_eq(t.mmv_warps, 8, "only 4 or 8 warps");
    cr_expect_eq(t.moe_path, MSM_CUDA_MOE_PATH_AUTO, "an unknown path: automatic");
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* The default stream with the default tuning, or with `t`. */
#define EX ((msm_cuda_exec){.stream = 0, .tune = &tune0})
#define EX_T(t) ((msm_cuda_exec){.stream = 0, .tune = (t)})

static uint64_t rng_state = 0x1234567;
static uint64_t rnd64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rndu(void) { return (float)(rnd64() >> 40) * (1.0f / 16777216.0f); }
/* Roughly normal, never exactly zero. */
static float rndn(void) {
    float s = rndu() + rndu() + rndu() + rndu() - 2.0f;
    return s == 0.0f ? 1e-3f : s * 1.7f;
}
static int rndi(int n) { return (int)(rnd64() % (uint64_t)n); }

static float *host_f32(size_t n, float scale) {
    float *p = malloc(n * sizeof(float) + 1);
    cr_assert(p);
    for (size_t i = 0; i < n; i++) p[i] = rndn() * scale;
    return p;
}

/* Random bf16 weights; ret_f32 gets their exact float values for the CPU. */
static uint16_t *host_bf16(size_t n, float scale, float **ret_f32) {
    uint16_t *b = malloc(n * 2 + 2);
    float *f = malloc(n * sizeof(float) + 1);
    cr_assert(b && f);
    for (size_t i = 0; i < n; i++) {
        b[i] = msm_f32_to_bf16(rndn() * scale);
        f[i] = msm_bf16_to_f32(b[i]);
    }
    *ret_f32 = f;
    return b;
}

static void *dev(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    cr_assert_eq(e, cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return p;
}
static void *dev_up(const void *h, size_t bytes) {
    void *p = dev(bytes);
    cr_assert_eq(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}
static void *dev_poison(size_t bytes) {
    void *p = dev(bytes);
    cr_assert_eq(cudaMemset(p, 0xff, bytes), cudaSuccess); /* NaN as f32, -1 as i32 */
    return p;
}
static void down(void *h, const void *d, size_t bytes) {
    cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    cr_assert_eq(e, cudaSuccess, "cudaMemcpy: %s", cudaGetErrorString(e));
}

/* ||out - ref|| / ||ref||, NaN when any output is not finite. */
static double rel_err(const float *out, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return NAN;
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define CHECK_ERR(out, ref, n, tol, ...)                                                   \
    do {                                                                                   \
        double e_ = rel_err(out, ref, n);                                                  \
        cr_assert(e_ <= (tol), "rel err %.3g > %.1g: " __VA_ARGS__, e_, (double)(tol));    \
    } while (0)

#define CK(call) cr_assert_eq((call), 0, "%s failed", #call)

/* ---- L2 prefetch ---- */

/* msm_cuda_l2_prefetch is a hint that changes no byte: spans at odd offsets and of odd sizes (only
 * their whole 16-byte units are prefetched: a misaligned bulk prefetch would fault), empty and NULL
 * ones, beyond the budget, every chunk size and grid, with and without evict_last; and in a chain of
 * PDL launches it completes after the kernel before it, so the kernel after it reads finished data.
 * Bad arguments are refused. */
Test(cuda_kernels, l2_prefetch_changes_nothing_and_keeps_the_chain_order, .timeout = 60) {
    need_gpu();
    size_t n = (size_t)6 << 20;
    uint8_t *h = malloc(n), *back = malloc(n);
    cr_assert(h && back);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)rnd64();
    uint8_t *d = dev_up(h, n);
    msm_cuda_span sp[MSM_CUDA_PREFETCH_MAX_SPANS] = {
        {d + 3, 1 << 20}, {d + (2 << 20), 7}, {d + (3 << 20) + 16, (1 << 20) + 5},
        {NULL, 100}, {d, 0}, {d + (5 << 20), (1 << 20) - 1}};
    static const size_t budgets[] = {(size_t)24 << 20, 1 << 20, 100, 0};
    static const int chunks[] = {1, 16, 1024}, grids[] = {1, 32, 257};
    for (int last = 0; last < 2; last++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++)
                for (int gr = 0; gr < 3; gr++) {
                    msm_cuda_tuning t = tune0;
                    t.l2_prefetch_last = last, t.l2_prefetch_bytes = budgets[b];
                    t.l2_prefetch_chunk_kb = chunks[c], t.l2_prefetch_blocks = grids[gr];
                    CK(msm_cuda_l2_prefetch(sp, MSM_CUDA_PREFETCH_MAX_SPANS, EX_T(&t)));
                }
    cudaError_t e = cudaDeviceSynchronize();
    cr_assert_eq(e, cudaSuccess, "%s", cudaGetErrorString(e));
    down(back, d, n);
    cr_expect(memcmp(h, back, n) == 0, "a prefetch changed memory");
    /* y = a + b, the prefetch, z = y + b, all PDL launches on one stream: z must be a + 2b */
    size_t m = (size_t)16 << 20;
    float *a = host_f32(m, 1.0f), *bb = host_f32(m, 1.0f), *z = malloc(m * sizeof(float));
    cr_assert(z);
    float *da = dev_up(a, m * 4), *db = dev_up(bb, m * 4), *dy = dev_poison(m * 4), *dz = dev_poison(m * 4);
    msm_cuda_span one = {da, m * 4};
    CK(msm_cuda_add(dy, da, db, m, EX));
    CK(msm_cuda_l2_prefetch(&one, 1, EX));
    CK(msm_cuda_add(dz, dy, db, m, EX));
    down(z, dz, m * 4);
    size_t bad = 0;
    for (size_t i = 0; i < m; i++) bad += z[i] != (a[i] + bb[i]) + bb[i];
    cr_expect_eq(bad, 0, "%zu sums read before the add before the prefetch had finished", bad);
    cr_expect_eq(msm_cuda_l2_prefetch(sp, MSM_CUDA_PREFETCH_MAX_SPANS + 1, EX), -EINVAL);
    cr_expect_eq(msm_cuda_l2_prefetch(NULL, 1, EX), -EINVAL);
    cr_expect_eq(msm_cuda_l2_prefetch(NULL, 0, EX), 0, "nothing to prefetch");
    cudaFree(d), cudaFree(da), cudaFree(db), cudaFree(dy), cudaFree(dz);
    free(h), free(back), free(a), free(bb), free(z);
}

/* msm_cuda_kv_prefetch changes no byte of the caches: tokens at positions 0 (nothing below), inside a
 * block and past several, a sequence whose table holds -1 and entries past the cache (skipped), every
 * budget down to none, with and without evict_last; bad arguments refused. */
Test(cuda_kernels, kv_prefetch_changes_nothing, .timeout = 60) {
    need_gpu();
    enum { T = 4 };
    const int kvh = 4, hd = 128, n_blocks = 40, max_blocks = 8;
    size_t blk = (size_t)MSM_KV_BLOCK * kvh * hd, n = (size_t)n_blocks * blk;
    uint16_t *h = malloc(n * 2), *back = malloc(n * 2);
    cr_assert(h && back);
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)rnd64();
    uint16_t *kc = dev_up(h, n * 2), *vc = dev_up(h, n * 2);
    int32_t seq[T] = {0, 1, 2, 3}, pos[T] = {0, 17, 127, 100};
    int32_t bt[4 * 8] = {3, 4, 5, 6, 7, 8, 9, 10, /* seq 0 */ 11, 12, -1, -1, -1, -1, -1, -1,
                         13, 14, 15, 16, 17, 18, 19, 39, /* seq 2: 8 blocks, the last the cache's */
                         20, -1, 999, 21, 22, -7, 23, 24}; /* seq 3: holes and an entry past the cache */
    int32_t *dseq = dev_up(seq, sizeof seq), *dpos = dev_up(pos, sizeof pos), *dbt = dev_up(bt, sizeof bt);
    static const size_t budgets[] = {(size_t)24 << 20, 200000, 1, 0};
    for (int last = 0; last < 2; last++)
        for (int b = 0; b < 4; b++) {
            msm_cuda_tuning t = tune0;
            t.l2_prefetch_last = last, t.l2_prefetch_kv_bytes = budgets[b];
            CK(msm_cuda_kv_prefetch(kc, vc, dseq, dpos, dbt, max_blocks, n_blocks, T, kvh, hd, EX_T(&t)));
        }
    cudaError_t e = cudaDeviceSynchronize();
    cr_assert_eq(e, cudaSuccess, "%s", cudaGetErrorString(e));
    down(back, kc, n * 2);
    cr_expect(memcmp(h, back, n * 2) == 0, "a prefetch changed the K cache");
    down(back, vc, n * 2);
    cr_expect(memcmp(h, back, n * 2) == 0, "a prefetch changed the V cache");
    cr_expect_eq(msm_cuda_kv_prefetch(kc, vc, dseq, dpos, dbt, 0, n_blocks, T, kvh, hd, EX), -EINVAL);
    cr_expect_eq(msm_cuda_kv_prefetch(NULL, vc, dseq, dpos, dbt, max_blocks, n_blocks, T, kvh, hd, EX), -EINVAL);
    cr_expect_eq(msm_cuda_kv_prefetch(kc, vc, dseq, dpos, dbt, max_blocks, n_blocks, -1, kvh, hd, EX), -EINVAL);
    cr_expect_eq(msm_cuda_kv_prefetch(kc, vc, dseq, dpos, dbt, max_blocks, n_blocks, 0, kvh, hd, EX), 0);
    cudaFree(kc), cudaFree(vc), cudaFree(dseq), cudaFree(dpos), cudaFree(dbt);
    free(h), free(back);
}

/* ---- embed ---- */

Test(cuda_kernels, embed_gathers_bf16_rows, .timeout = 60) {
    need_gpu();
    static const int shapes[][3] = {{1, 64, 50}, {7, 129, 33}, {70, 2048, 1000}}; /* T, H, V */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], H = shapes[s][1], V = shapes[s][2];
        float *tf;
        uint16_t *tb = host_bf16((size_t)V * H, 1.0f, &tf);
        int32_t *ids = malloc(T * sizeof(int32_t));
        for (int t = 0; t < T; t++) ids[t] = rndi(V);
        float *ref = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4);
        msm_cpu_embed(ref, tf, ids, T, H);
        uint16_t *dt = dev_up(tb, (size_t)V * H * 2);
        int32_t *di = dev_up(ids, T * 4);
        float *dout = dev_poison((size_t)T * H * 4);
        CK(msm_cuda_embed(dout, dt, di, T, H, EX));
        down(out, dout, (size_t)T * H * 4);
        CHECK_ERR(out, ref, (size_t)T * H, 0.0, "T=%d H=%d", T, H);
        cudaFree(dt), cudaFree(di), cudaFree(dout);
        free(tb), free(tf), free(ids), free(ref), free(out);
    }
}

/* ---- rmsnorm ---- */

Test(cuda_kernels, rmsnorm_matches_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][3] = {{1, 64, 0}, {5, 129, 0}, {70, 2048, 0}, {300, 128, 1}, {3, 4096, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], dim = shapes[s][1], inplace = shapes[s][2];
        size_t n = (size_t)rows * dim;
        float *x = host_f32(n, 2.0f), *wf, *ref = malloc(n * 4), *out = malloc(n * 4);
        uint16_t *wb = host_bf16(dim, 1.0f, &wf);
        msm_cpu_rmsnorm(ref, x, wf, rows, dim, 1e-6f);
        float *dx = dev_up(x, n * 4), *dout = inplace ? dx : dev_poison(n * 4);
        uint16_t *dw = dev_up(wb, dim * 2);
        CK(msm_cuda_rmsnorm(dout, dx, dw, rows, dim, 1e-6f, EX));
        down(out, dout, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "rows=%d dim=%d inplace=%d", rows, dim, inplace);
        cudaFree(dx), cudaFree(dw);
        if (!inplace) cudaFree(dout);
        free(x), free(wf), free(wb), free(ref), free(out);
    }
}

Test(cuda_kernels, add_rmsnorm_matches_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][2] = {{1, 64}, {5, 129}, {70, 2048}, {32, 2048}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], dim = shapes[s][1];
        size_t n = (size_t)rows * dim;
        float *a = host_f32(n, 2.0f), *b = host_f32(n, 1.0f), *wf;
        float *rs = malloc(n * 4), *ro = malloc(n * 4), *hs = malloc(n * 4), *ho = malloc(n * 4);
        uint16_t *wb = host_bf16(dim, 1.0f, &wf);
        msm_cpu_add_rmsnorm(rs, ro, a, b, wf, rows, dim, 1e-6f);
        float *da = dev_up(a, n * 4), *db = dev_up(b, n * 4), *ds = dev_poison(n * 4), *dout = dev_poison(n * 4);
        uint16_t *dw = dev_up(wb, dim * 2);
        CK(msm_cuda_add_rmsnorm(ds, dout, da, db, dw, rows, dim, 1e-6f, EX));
        down(hs, ds, n * 4);
        down(ho, dout, n * 4);
        CHECK_ERR(hs, rs, n, 0, "sum rows=%d dim=%d", rows, dim);
        CHECK_ERR(ho, ro, n, 1e-5, "norm rows=%d dim=%d", rows, dim);
        /* bitwise the two-kernel sequence */
        float *d2 = dev_poison(n * 4), *h2 = malloc(n * 4);
        CK(msm_cuda_add(ds, da, db, n, EX));
        CK(msm_cuda_rmsnorm(d2, ds, dw, rows, dim, 1e-6f, EX));
        down(h2, d2, n * 4);
        cr_expect(memcmp(h2, ho, n * 4) == 0, "add_rmsnorm differs from add + rmsnorm (rows=%d dim=%d)", rows, dim);
        cudaFree(da), cudaFree(db), cudaFree(ds), cudaFree(dout), cudaFree(dw), cudaFree(d2);
        free(a), free(b), free(wf), free(wb), free(rs), free(ro), free(hs), free(ho), free(h2);
    }
}

Test(cuda_kernels, moe_combine_and_combine_rmsnorm_match_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][2] = {{1, 2048}, {5, 129}, {70, 2048}, {32, 2048}, {3, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int rows = shapes[s][0], dim = shapes[s][1];
        size_t n = (size_t)rows * dim;
        float *x = host_f32(n, 2.0f), *rt = host_f32(n, 1.0f), *sh = host_f32(n, 1.0f), *h = host_f32(n, 1.0f);
        float *wf, *wgf;
        uint16_t *wb = host_bf16(dim, 1.0f, &wf), *wgb = host_bf16(dim, 1.0f / sqrtf((float)dim), &wgf);
        float *rs = malloc(n * 4), *ro = malloc(n * 4), *hs = malloc(n * 4), *ho = malloc(n * 4);
        msm_cpu_moe_combine_rmsnorm(rs, ro, x, rt, sh, h, wgf, wf, rows, dim, 1e-6f);
        float *dx = dev_up(x, n * 4), *drt = dev_up(rt, n * 4), *dsh = dev_up(sh, n * 4), *dh = dev_up(h, n * 4);
        float *ds = dev_poison(n * 4), *dout = dev_poison(n * 4);
        uint16_t *dw = dev_up(wb, dim * 2), *dwg = dev_up(wgb, dim * 2);
        CK(msm_cuda_moe_combine_rmsnorm(ds, dout, dx, drt, dsh, dh, dwg, dw, rows, dim, 1e-6f, EX));
        down(hs, ds, n * 4);
        down(ho, dout, n * 4);
        CHECK_ERR(hs, rs, n, 1e-5, "sum rows=%d dim=%d", rows, dim);
        CHECK_ERR(ho, ro, n, 1e-5, "norm rows=%d dim=%d", rows, dim);
        /* the combine alone (tp > 1) */
        msm_cpu_moe_combine(rs, rt, sh, h, wgf, rows, dim);
        CK(msm_cuda_moe_combine(ds, drt, dsh, dh, dwg, rows, dim, EX));
        down(hs, ds, n * 4);
        CHECK_ERR(hs, rs, n, 1e-5, "combine rows=%d dim=%d", rows, dim);
        cudaFree(dx), cudaFree(drt), cudaFree(dsh), cudaFree(dh), cudaFree(ds), cudaFree(dout), cudaFree(dw), cudaFree(dwg);
        free(x), free(rt), free(sh), free(h), free(wf), free(wb), free(wgf), free(wgb);
        free(rs), free(ro), free(hs), free(ho);
    }
}

Test(cuda_kernels, rope_copy_matches_copy_then_rope, .timeout = 60) {
    need_gpu();
    static const int shapes[][4] = {{1, 16, 16, 128}, {7, 6, 2, 64}, {70, 4, 4, 32}}; /* T, nh, kvh, hd */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3];
        int C = (nh + 2 * kvh) * hd;
        size_t n = (size_t)T * C;
        float *x = host_f32(n, 1.0f), *ref = malloc(n * 4), *out = malloc(n * 4);
        int32_t *pos = malloc(T * 4);
        for (int t = 0; t < T; t++) pos[t] = rndi(4000);
        memcpy(ref, x, n * 4);
        for (int t = 0; t < T; t++) msm_cpu_rope(ref + (size_t)t * C, pos + t, 1, nh + kvh, hd, hd, 1e6f);
        float *dx = dev_up(x, n * 4), *dout = dev_poison(n * 4);
        int32_t *dpos = dev_up(pos, T * 4);
        CK(msm_cuda_rope_copy(dout, dx, dpos, T, C, nh + kvh, hd, hd, 1e6f, EX));
        down(out, dout, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "rope_copy T=%d nh=%d kvh=%d hd=%d", T, nh, kvh, hd);
        cudaFree(dx), cudaFree(dout), cudaFree(dpos);
        free(x), free(ref), free(out), free(pos);
    }
}

/* ---- linear ---- */

static void linear_case(msm_cuda_ctx *ctx, msm_cuda_exec ex, int T, int N, int K, bool bias,
                        double tol) {
    float *x = host_f32((size_t)T * K, 1.0f), *wf, *bf = NULL;
    uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *bb = NULL;
    if (bias) bb = host_bf16(N, 0.5f, &bf);
    float *ref = malloc((size_t)T * N * 4), *out = malloc((size_t)T * N * 4);
    msm_cpu_linear(ref, x, wf, bf, T, N, K);
    float *dx = dev_up(x, (size_t)T * K * 4), *dy = dev_poison((size_t)T * N * 4);
    uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *db = bias ? dev_up(bb, N * 2) : NULL;
    size_t wsb = msm_cuda_linear_ws_bytes(T, N, K);
    void *ws = wsb ? dev(wsb) : NULL;
    CK(msm_cuda_linear(dy, dx, dw, db, T, N, K, ctx, ws, wsb, ex));
    down(out, dy, (size_t)T * N * 4);
    CHECK_ERR(out, ref, (size_t)T * N, tol, "linear T=%d N=%d K=%d bias=%d", T, N, K, bias);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(db), cudaFree(ws);
    free(x), free(wf), free(wb), free(bf), free(bb), free(ref), free(out);
}

/* The same linear call twice on the same inputs must give the same bits. */
static void linear_deterministic(msm_cuda_ctx *ctx, msm_cuda_exec ex, int T, int N, int K, const char *what) {
    float *x = host_f32((size_t)T * K, 1.0f), *wf;
    uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf);
    float *dx = dev_up(x, (size_t)T * K * 4), *d1 = dev_poison((size_t)T * N * 4), *d2 = dev_poison((size_t)T * N * 4);
    uint16_t *dw = dev_up(wb, (size_t)N * K * 2);
    float *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
    CK(msm_cuda_linear(d1, dx, dw, NULL, T, N, K, ctx, NULL, 0, ex));
    CK(msm_cuda_linear(d2, dx, dw, NULL, T, N, K, ctx, NULL, 0, ex));
    down(o1, d1, (size_t)T * N * 4);
    down(o2, d2, (size_t)T * N * 4);
    cr_assert(memcmp(o1, o2, (size_t)T * N * 4) == 0, "%s linear is not deterministic (T=%d N=%d K=%d)", what, T, N, K);
    cudaFree(dx), cudaFree(d1), cudaFree(d2), cudaFree(dw);
    free(x), free(wf), free(wb), free(o1), free(o2);
}

/* One linear under two tunings (ea, eb) on the same inputs (weights, x, a bias where `bias`) gives
 * the same bits; what and the shape name a difference. */
static void linear_same_bits(msm_cuda_ctx *ctx, msm_cuda_exec ea, msm_cuda_exec eb, int T, int N, int K, bool bias,
                             const char *what) {
    float *x = host_f32((size_t)T * K, 1.0f), *wf, *bf = NULL;
    uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *bb = NULL;
    if (bias) bb = host_bf16(N, 0.5f, &bf);
    float *dx = dev_up(x, (size_t)T * K * 4), *d1 = dev_poison((size_t)T * N * 4), *d2 = dev_poison((size_t)T * N * 4);
    uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *db = bb ? dev_up(bb, (size_t)N * 2) : NULL;
    float *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
    CK(msm_cuda_linear(d1, dx, dw, db, T, N, K, ctx, NULL, 0, ea));
    CK(msm_cuda_linear(d2, dx, dw, db, T, N, K, ctx, NULL, 0, eb));
    down(o1, d1, (size_t)T * N * 4), down(o2, d2, (size_t)T * N * 4);
    cr_expect(memcmp(o1, o2, (size_t)T * N * 4) == 0, "%s: T=%d N=%d K=%d", what, T, N, K);
    cudaFree(dx), cudaFree(d1), cudaFree(d2), cudaFree(dw), cudaFree(db);
    free(x), free(wf), free(wb), free(bf), free(bb), free(o1), free(o2);
}

Test(cuda_kernels, linear_gemv_small_T_matches_cpu, .timeout = 60) {
    need_gpu();
    /* T, N, K, bias: K % 8 != 0 takes the scalar path */
    static const int shapes[][4] = {{1, 64, 128, 0}, {1, 1000, 2048, 1}, {2, 129, 200, 0},
                                    {3, 33, 1032, 1}, {5, 257, 130, 1}, {8, 2048, 2048, 0},
                                    {7, 1, 8, 1},     {4, 500, 99, 0}};
    msm_cuda_tuning t = tune0;
    t.mmv_max_t = 0; /* the GEMV kernel itself, not the MMV path */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        linear_case(NULL, EX_T(&t), shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 1e-5);
}

/* Routers over many tokens (N <= 256): token chunks of 8, 4 or 2 (router_chunk_per_sm 1, 2, the
 * default) give the bits of one warp per (row, token) (a per_sm no grid reaches: NT = 1), and
 * match the CPU; Qwen3-30B-A3B's 128 experts at 128 / 256 tokens, Qwen1.5-MoE's 60, odd shapes. */
Test(cuda_kernels, linear_router_token_chunks_same_bits, .timeout = 60) {
    need_gpu();
    static const int shapes[][3] = {{256, 128, 2048}, {128, 128, 2048}, {512, 60, 2048}, {200, 96, 72}, {37, 8, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *x = host_f32((size_t)T * K, 1.0f), *wf, *ref = malloc((size_t)T * N * 4);
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf);
        msm_cpu_linear(ref, x, wf, NULL, T, N, K);
        float *dx = dev_up(x, (size_t)T * K * 4), *dy = dev_poison((size_t)T * N * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2);
        float *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
        msm_cuda_tuning t = tune0;
        t.router_chunk_per_sm = 1 << 20; /* no chunk reaches it: one warp per (row, token) */
        CK(msm_cuda_linear(dy, dx, dw, NULL, T, N, K, NULL, NULL, 0, EX_T(&t)));
        down(o1, dy, (size_t)T * N * 4);
        CHECK_ERR(o1, ref, (size_t)T * N, 2e-5, "router T=%d N=%d K=%d", T, N, K);
        for (int per = 0; per <= 1; per++) {
            t.router_chunk_per_sm = per;
            cr_assert_eq(cudaMemset(dy, 0xff, (size_t)T * N * 4), cudaSuccess);
            CK(msm_cuda_linear(dy, dx, dw, NULL, T, N, K, NULL, NULL, 0, EX_T(&t)));
            down(o2, dy, (size_t)T * N * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * N * 4) == 0, "router token chunks differ: T=%d N=%d K=%d per_sm %d",
                      T, N, K, per);
        }
        cudaFree(dx), cudaFree(dy), cudaFree(dw);
        free(x), free(wf), free(wb), free(ref), free(o1), free(o2);
    }
}

/* LINEAR_ADD_RMSNORM: the one-kernel path (the GEMV's last block adds and norms) is bitwise the
 * GEMV then add_rmsnorm at every T it takes (1..4), each norm layout it takes (128 and 256 norm
 * threads, up to 16 values a thread), bias or none; twice on one counter (it must be back at
 * zero); and beyond its range (T = 6, N = 4096, a K the GEMV reads unvectorised, N <= 256: the
 * routers' GEMV) the two kernels themselves. */
Test(cuda_kernels, linear_add_rmsnorm_equals_linear_then_add_rmsnorm, .timeout = 60) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    static const int shapes[][4] = {{1, 2048, 2048, 0}, {1, 4096, 1408, 1}, {2, 300, 512, 0}, {3, 1000, 768, 1},
                                    {4, 2048, 5632, 0}, {1, 257, 64, 1},   {2, 512, 256, 0}, {6, 2048, 512, 1},
                                    {2, 300, 100, 0}};
    msm_cuda_tuning t = tune0;
    t.linear_norm_fused = true;
    unsigned *ctr = dev(256);
    cr_assert_eq(cudaMemset(ctr, 0, 256), cudaSuccess);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        size_t n = (size_t)T * N;
        float *wf, *bf, *nf, *x = host_f32((size_t)T * K, 1.0f), *r = host_f32(n, 2.0f);
        uint16_t *wb = host_bf16((size_t)N * K, 0.05f, &wf), *bb = host_bf16(N, 0.5f, &bf), *nb = host_bf16(N, 1.0f, &nf);
        float *dx = dev_up(x, (size_t)T * K * 4), *dr = dev_up(r, n * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *db = shapes[s][3] ? dev_up(bb, N * 2) : NULL, *dn = dev_up(nb, N * 2);
        float *s1 = dev_poison(n * 4), *o1 = dev_poison(n * 4), *s2 = dev_poison(n * 4), *o2 = dev_poison(n * 4);
        size_t wsb = msm_cuda_linear_ws_bytes(T, N, K);
        void *ws = dev(wsb ? wsb : 256);
        float *h1 = malloc(n * 4), *h2 = malloc(n * 4);
        /* reference: the GEMV into s2, then s2 = r + s2 and the norm */
        CK(msm_cuda_linear(s2, dx, dw, db, T, N, K, ctx, ws, wsb, EX_T(&t)));
        CK(msm_cuda_add_rmsnorm(s2, o2, dr, s2, dn, T, N, 1e-6f, EX_T(&t)));
        for (int rep = 0; rep < 2; rep++) {
            cr_assert_eq(cudaMemset(s1, 0xff, n * 4), cudaSuccess);
            CK(msm_cuda_linear_add_rmsnorm(s1, o1, dx, dw, db, dr, dn, T, N, K, 1e-6f, ctr, ctx, ws, wsb, EX_T(&t)));
            down(h1, s1, n * 4), down(h2, s2, n * 4);
            cr_expect(memcmp(h1, h2, n * 4) == 0, "sum: T=%d N=%d K=%d call %d", T, N, K, rep);
            down(h1, o1, n * 4), down(h2, o2, n * 4);
            cr_expect(memcmp(h1, h2, n * 4) == 0, "norm: T=%d N=%d K=%d call %d", T, N, K, rep);
        }
        unsigned c = 1;
        down(&c, ctr, sizeof c);
        cr_expect_eq(c, 0u, "the counter is left at zero (T=%d N=%d)", T, N);
        /* the sum against the CPU: r + (x . W^T + b) */
        float *ry = malloc(n * 4), *rs = malloc(n * 4), *ro = malloc(n * 4);
        msm_cpu_linear(ry, x, wf, shapes[s][3] ? bf : NULL, T, N, K);
        msm_cpu_add_rmsnorm(rs, ro, r, ry, nf, T, N, 1e-6f);
        down(h1, s1, n * 4);
        CHECK_ERR(h1, rs, n, 1e-5, "sum vs cpu T=%d N=%d K=%d", T, N, K);
        cudaFree(dx), cudaFree(dr), cudaFree(dw), cudaFree(db), cudaFree(dn), cudaFree(s1), cudaFree(o1);
        cudaFree(s2), cudaFree(o2), cudaFree(ws);
        free(x), free(r), free(wf), free(wb), free(bf), free(bb), free(nf), free(nb), free(h1), free(h2);
        free(ry), free(rs), free(ro);
    }
    cudaFree(ctr);
    msm_cuda_ctx_free(ctx);
}

/* The tensor-core MMV path (bf16 hi+lo split of x): every T tile count (1..4), partial tiles,
 * rows not a multiple of the block's 128, K slices 1..8 (cluster reduction), bias; and the
 * default range's shapes at the model's sizes. Then bitwise determinism over repeated calls, and the
 * same bits with 4 or 8 warps a block and with 4 or 8 K chunks of loads in flight (mmv_u8_max_blocks). */
Test(cuda_kernels, linear_mmv_matches_cpu, .timeout = 120) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    msm_cuda_tuning t = tune0;
    t.mmv_min_t = 1, t.mmv_max_t = 64;
    t.linear_tiled_min_t = 1 << 30; /* the MMV kernel itself, not the tiled path */
    t.mmv_stream_bs_min_n = 0;     /* ... not its streamed form (linear_mmv_stream) */
    static const int shapes[][4] = {{1, 64, 128, 0},     {2, 129, 256, 1},    {5, 257, 1024, 1},
                                    {8, 2048, 2048, 0},   {9, 60, 2048, 0},    {16, 1000, 64, 1},
                                    {17, 300, 2048, 1},   {32, 2048, 2048, 0}, {32, 6144, 2048, 1},
                                    {32, 2048, 5632, 0},  {33, 11264, 2048, 0}, {48, 130, 96, 1},
                                    {64, 2048, 2048, 1},  {63, 777, 4096, 0},  {12, 151936, 256, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        linear_case(ctx, EX_T(&t), shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 2e-5);
    /* the default rule's smallest sizes (tune0: the MMV from MSM_CUDA_MMV_MIN_T tokens) */
    linear_case(ctx, EX, MSM_CUDA_MMV_MIN_T, 6144, 2048, 1, 2e-5);
    linear_case(ctx, EX, 4, 2048, 5632, 0, 2e-5);
    /* Qwen1.5-MoE's qkv at 8 tokens: 96 clusters, of 4 where those of 8 do not all fit (mmv_fit_clusters) */
    linear_case(ctx, EX, 8, 6144, 2048, 1, 2e-5);
    /* determinism: the same call twice gives the same bits */
    linear_deterministic(ctx, EX_T(&t), 32, 2048, 2048, "mmv");
    /* 4 warps a block (MSM_CUDA_MMV_WARPS=4): the same bits as 8 given the same K slices (N a
     * multiple of 128, so 4 warps make exactly twice the row blocks: twice the slots for the same S),
     * the one with 8 chunks in flight where its slices have 8 (the other 4) */
    static const int w4[][3] = {{8, 2048, 2048}, {5, 384, 5632}, {16, 1024, 64}, {40, 768, 4096}};
    for (size_t s = 0; s < sizeof w4 / sizeof *w4; s++) {
        int T = w4[s][0], N = w4[s][1], K = w4[s][2];
        float *x = host_f32((size_t)T * K, 1.0f), *wf;
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf);
        float *dx = dev_up(x, (size_t)T * K * 4), *d1 = dev_poison((size_t)T * N * 4), *d2 = dev_poison((size_t)T * N * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2);
        float *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
        for (int slots = 1; slots <= 8; slots *= 2) {
            msm_cuda_tuning a = t, b = t;
            a.mmv_slots = slots, b.mmv_slots = 2 * slots;
            a.mmv_warps = 8, b.mmv_warps = 4;
            a.mmv_fit_clusters = b.mmv_fit_clusters = false; /* the same S by slots alone */
            a.mmv_u8_max_blocks = 0, b.mmv_u8_max_blocks = 1 << 20; /* 4 and 8 chunks in flight */
            a.mmv_l2_rest = slots >= 4, b.mmv_l2_rest = slots < 4; /* later rounds via L2 or not */
            a.mmv_bslice = b.mmv_bslice = 0; /* the clusters' slices */
            CK(msm_cuda_linear(d1, dx, dw, NULL, T, N, K, ctx, NULL, 0, EX_T(&a)));
            CK(msm_cuda_linear(d2, dx, dw, NULL, T, N, K, ctx, NULL, 0, EX_T(&b)));
            down(o1, d1, (size_t)T * N * 4), down(o2, d2, (size_t)T * N * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * N * 4) == 0, "mmv 4 vs 8 warps: T=%d N=%d K=%d slots %d", T, N, K,
                      slots);
        }
        cudaFree(dx), cudaFree(d1), cudaFree(d2), cudaFree(dw);
        free(x), free(wf), free(wb), free(o1), free(o2);
    }
    msm_cuda_ctx_free(ctx);
}

/* The block-sliced MMV (one token tile, its K slices the warps of a block, mmv_bslice): 4, 8 and
 * 16 slices forced, partial tiles, rows not a multiple of 16, slices past K's chunks, bias, against
 * the CPU; the rule's picks at the models' shapes (qkv, o_proj, the shared expert, Qwen3's); the
 * same bits as the cluster MMV of as many slices (S set by K's chunks: 16 chunks make 4 slices,
 * 32 make 8), with 16 and 32 rows a warp (mmv_nj); and determinism. All of it at 16 and 32 rows. */
Test(cuda_kernels, linear_mmv_block_slices, .timeout = 120) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    msm_cuda_tuning t = tune0;
    t.mmv_min_t = 1, t.mmv_max_t = 64;
    t.linear_tiled_min_t = 1 << 30;
    t.mmv_stream_bs_min_n = 0; /* the block-sliced kernel itself (its streamed form: linear_mmv_stream) */
    static const int forced[][4] = {{1, 64, 128, 0},  {3, 2048, 2048, 1}, {5, 257, 1024, 1}, {8, 6144, 2048, 0},
                                    {9, 60, 2048, 1}, {16, 1000, 512, 0}, {7, 2048, 5632, 1}, {2, 33, 416, 0}};
    static const int rule[][3] = {{8, 6144, 2048}, {8, 2048, 2048}, {8, 11264, 2048}, {8, 2048, 5632},
                                  {5, 5120, 2048}, {4, 2048, 4096}, {3, 1536, 2048}, {6, 151936, 256}};
    for (int nj = 2; nj <= 4; nj += 2) { /* 16 and 32 rows a warp (mmv_nj) */
        t.mmv_nj = nj;
        for (int ws = 4; ws <= 16; ws *= 2) {
            t.mmv_bslice = ws;
            for (size_t s = 0; s < sizeof forced / sizeof *forced; s++)
                linear_case(ctx, EX_T(&t), forced[s][0], forced[s][1], forced[s][2], forced[s][3], 2e-5);
        }
        t.mmv_bslice = 1;
        for (size_t s = 0; s < sizeof rule / sizeof *rule; s++)
            linear_case(ctx, EX_T(&t), rule[s][0], rule[s][1], rule[s][2], 1, 2e-5);
        linear_deterministic(ctx, EX_T(&t), 8, 2048, 2048, nj == 4 ? "mmv block slices, 32 rows" : "mmv block slices");
    }
    t.mmv_nj = 2;
    static const int same[][3] = {{8, 256, 512}, {8, 320, 1024}, {3, 2048, 512}, {16, 96, 1024}, {8, 320, 2048}};
    for (size_t s = 0; s < sizeof same / sizeof *same; s++) {
        int T = same[s][0], N = same[s][1], K = same[s][2], S = K / 32 >= 32 ? 8 : 4;
        float *x = host_f32((size_t)T * K, 1.0f), *wf;
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf);
        float *dx = dev_up(x, (size_t)T * K * 4), *d1 = dev_poison((size_t)T * N * 4), *d2 = dev_poison((size_t)T * N * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2);
        float *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
        msm_cuda_tuning a = t, b = t;
        a.mmv_bslice = S, b.mmv_bslice = 0;
        a.mmv_l2_rest = true; /* the block's later rounds prefetched into L2: the same bits */
        b.mmv_warps = 4, b.mmv_slots = 32, b.mmv_fit_clusters = false, b.mmv_u8_max_blocks = 0;
        CK(msm_cuda_linear(d1, dx, dw, NULL, T, N, K, ctx, NULL, 0, EX_T(&a)));
        CK(msm_cuda_linear(d2, dx, dw, NULL, T, N, K, ctx, NULL, 0, EX_T(&b)));
        down(o1, d1, (size_t)T * N * 4), down(o2, d2, (size_t)T * N * 4);
        cr_expect(memcmp(o1, o2, (size_t)T * N * 4) == 0, "block vs cluster slices (%d): T=%d N=%d K=%d", S, T, N, K);
        /* 32 rows a warp at 2 chunks in flight (mmv_nj 4): the same slices, the same bits */
        a.mmv_nj = 4;
        cr_assert_eq(cudaMemset(d2, 0xff, (size_t)T * N * 4), cudaSuccess);
        CK(msm_cuda_linear(d2, dx, dw, NULL, T, N, K, ctx, NULL, 0, EX_T(&a)));
        down(o2, d2, (size_t)T * N * 4);
        cr_expect(memcmp(o1, o2, (size_t)T * N * 4) == 0, "32 vs 16 rows a warp (%d): T=%d N=%d K=%d", S, T, N, K);
        cudaFree(dx), cudaFree(d1), cudaFree(d2), cudaFree(dw);
        free(x), free(wf), free(wb), free(o1), free(o2);
    }
    msm_cuda_ctx_free(ctx);
}

/* The streamed MMV (mmv_stream_kernel, tuning mmv_stream_min_n): against the CPU at 2-8 tokens,
 * with bias, rows not a multiple of 16, many tiles a block (N / 16 past the SMs), slices past K's
 * chunks (K of 13 chunks over 16 warps) and K = 2048 (4 chunks a slice), each shape at 3 and 2
 * stages (mmv_stream_st; 1, 2 and many tiles a stage); bitwise the block-sliced
 * MMV at 16 slices (where K has the 16 chunks it needs); deterministic; and past its limits (K past
 * 2048, 9 tokens, 1 token) the other paths take the call. */
Test(cuda_kernels, linear_mmv_stream, .timeout = 120) {
    need_gpu();
    cr_assert(tune0.mmv_stream_ok, "the streamed MMV's shared memory granted");
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    msm_cuda_tuning t = tune0, b = tune0;
    t.mmv_stream_min_n = 1, t.mmv_stream_min_t = 2;
    t.linear_tiled_min_t = b.linear_tiled_min_t = 1 << 30;
    /* the block-sliced MMV forced to 16 slices of 16 rows at every T */
    b.mmv_stream_min_n = 0, b.mmv_min_t = 1, b.mmv_max_t = 64, b.mmv_bslice = 16, b.mmv_nj = 2;
    static const int shapes[][4] = {{8, 20000, 2048, 0}, {2, 4099, 2048, 1}, {5, 3000, 1024, 0}, {3, 777, 416, 1},
                                    {8, 16, 64, 0},      {7, 2101, 2048, 1}, {4, 5000, 32, 0},   {6, 70000, 512, 0}};
    for (size_t s = 0; s < 2 * sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s / 2][0], N = shapes[s / 2][1], K = shapes[s / 2][2];
        t.mmv_stream_st = s % 2 ? 2 : 3;
        linear_case(ctx, EX_T(&t), T, N, K, shapes[s / 2][3], 2e-5);
        if (K / 32 < 16) continue; /* the forced block slices need 16 chunks */
        linear_same_bits(ctx, EX_T(&t), EX_T(&b), T, N, K, shapes[s / 2][3],
                         t.mmv_stream_st == 2 ? "streamed (2 stages) vs block-sliced MMV"
                                              : "streamed (3 stages) vs block-sliced MMV");
    }
    linear_deterministic(ctx, EX_T(&t), 8, 151936, 2048, "streamed mmv, 2 stages");
    t.mmv_stream_st = 3;
    linear_deterministic(ctx, EX_T(&t), 8, 151936, 2048, "streamed mmv");
    /* the block-sliced MMV's picks of 8 and 16 slices streamed (mmv_stream_bs_min_n): bitwise the
     * block-sliced kernel of as many slices, 3-8 tokens, bias, rows not a multiple of 16, 2 and 3
     * stages; and the default rule's pick at Qwen3's qkv (5120 x 2048, 8 tokens) against the CPU */
    static const int bs[][5] = {{8, 5120, 2048, 1, 8}, {3, 4099, 2048, 0, 8}, {5, 700, 1024, 1, 16},
                                {8, 2000, 512, 0, 16},  {6, 333, 256, 1, 8}};
    for (size_t s = 0; s < 2 * sizeof bs / sizeof *bs; s++) {
        int T = bs[s / 2][0], N = bs[s / 2][1], K = bs[s / 2][2], ws = bs[s / 2][4];
        msm_cuda_tuning a = tune0, c = tune0;
        a.mmv_min_t = c.mmv_min_t = 1, a.mmv_max_t = c.mmv_max_t = 64;
        a.linear_tiled_min_t = c.linear_tiled_min_t = 1 << 30;
        a.mmv_bslice = c.mmv_bslice = ws, a.mmv_nj = c.mmv_nj = 2;
        a.mmv_stream_min_n = c.mmv_stream_min_n = 0;
        a.mmv_stream_bs_min_n = 1, c.mmv_stream_bs_min_n = 0;
        a.mmv_stream_st = s % 2 ? 2 : 3;
        char what[64];
        snprintf(what, sizeof what, "streamed vs block-sliced, %d slices, %d stages", ws, a.mmv_stream_st);
        linear_same_bits(ctx, EX_T(&a), EX_T(&c), T, N, K, bs[s / 2][3], what);
    }
    linear_case(ctx, EX, 8, 5120, 2048, 0, 2e-5);
    /* past its limits: K of 4096 and 2080, 9 tokens (the tiled GEMM), one token (the other paths,
     * against the CPU) */
    msm_cuda_tuning l = tune0;
    l.mmv_stream_min_n = 1, l.mmv_stream_min_t = 2;
    linear_case(ctx, EX_T(&l), 4, 3000, 4096, 0, 2e-5);
    linear_case(ctx, EX_T(&l), 8, 5000, 2080, 1, 2e-5);
    linear_case(ctx, EX_T(&l), 9, 3000, 2048, 0, 2e-5);
    linear_case(ctx, EX_T(&l), 1, 3000, 2048, 1, 2e-5);
    msm_cuda_ctx_free(ctx);
}

/* The split-K tiled GEMM (bf16 hi+lo split of x): every token-tile count 1..8, partial tiles,
 * rows not a multiple of the block's 128, one K step (K = 64) to 88 (K = 5632), K slices 1..8
 * (cluster reduction), bias; the model's shapes at the default range (9..64 tokens, tune0); and
 * a K the tiles cannot take (falls back). Then bitwise determinism over repeated calls. */
Test(cuda_kernels, linear_tiled_matches_cpu, .timeout = 120) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    msm_cuda_tuning t = tune0;
    t.linear_tiled_min_t = 1;
    static const int shapes[][4] = {{1, 300, 64, 1},      {1, 2048, 2048, 0},  {3, 257, 1408, 1},
                                    {8, 2048, 5632, 0},   {9, 777, 128, 1},    {15, 6144, 2048, 0},
                                    {17, 300, 2048, 1},   {24, 11264, 2048, 0}, {32, 2048, 2048, 1},
                                    {33, 2048, 5632, 0},  {40, 129, 1408, 1},  {57, 4096, 640, 0},
                                    {63, 1000, 4096, 1},  {64, 2048, 2048, 0}, {64, 151936, 128, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        linear_case(ctx, EX_T(&t), shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 2e-5);
    /* the default range (tune0): 9..64 tokens take the tiled path at 2e-5, K % 64 != 0 does not */
    linear_case(ctx, EX_T(&tune0), 32, 6144, 2048, 1, 2e-5);
    linear_case(ctx, EX_T(&tune0), 9, 2048, 5632, 0, 2e-5);
    linear_case(ctx, EX_T(&tune0), 16, 512, 96, 0, 1e-2); /* cuBLASLt, x rounded to bf16 */
    linear_deterministic(ctx, EX_T(&t), 40, 2048, 5632, "tiled");
    msm_cuda_ctx_free(ctx);
}

Test(cuda_kernels, linear_cublaslt_large_T_matches_cpu, .timeout = 60) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    /* T, N, K, bias, tol: up to 64 tokens x is rounded to bf16 (one matmul, ~3e-3); from 65 on
     * it is split into bf16 hi + lo (two matmuls, near the fp32 product); N <= 256 (routers)
     * takes the fp32 GEMV at any T */
    static const struct { int T, N, K, bias; double tol; } shapes[] = {
        {9, 512, 512, 0, 1e-2},     {64, 1000, 2048, 1, 1e-2},  {70, 1000, 2048, 1, 5e-5},
        {65, 2048, 2048, 0, 5e-5},  {300, 6144, 2048, 1, 5e-5}, {130, 129, 264, 1, 2e-5},
        {300, 96, 64, 0, 2e-5},     {512, 60, 2048, 0, 2e-5},   {9, 256, 512, 0, 2e-5},
        {32, 60, 2048, 0, 2e-5},    {33, 1, 2048, 1, 2e-5}};
    msm_cuda_tuning t = tune0;
    t.mmv_max_t = 0; /* cuBLASLt itself, not the MMV or the tiled path */
    t.linear_tiled_min_t = 1 << 30;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        /* twice: the second call reuses the cached plan */
        linear_case(ctx, EX_T(&t), shapes[s].T, shapes[s].N, shapes[s].K, shapes[s].bias, shapes[s].tol);
        linear_case(ctx, EX_T(&t), shapes[s].T, shapes[s].N, shapes[s].K, shapes[s].bias, shapes[s].tol);
    }
    msm_cuda_ctx_free(ctx);
}

/* ---- rope ---- */

Test(cuda_kernels, rope_matches_cpu, .timeout = 60) {
    need_gpu();
    static const struct { int T, nh, hd; float theta; } shapes[] = {
        {1, 4, 64, 10000.0f}, {70, 3, 128, 1000000.0f}, {5, 16, 32, 10000.0f}, {130, 2, 6, 500.0f}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s].T, nh = shapes[s].nh, hd = shapes[s].hd;
        size_t n = (size_t)T * nh * hd;
        float *x = host_f32(n, 1.0f), *ref = malloc(n * 4), *out = malloc(n * 4);
        int32_t *pos = malloc(T * 4);
        for (int t = 0; t < T; t++) pos[t] = rndi(4096);
        memcpy(ref, x, n * 4);
        msm_cpu_rope(ref, pos, T, nh, hd, hd, shapes[s].theta);
        float *dx = dev_up(x, n * 4);
        int32_t *dp = dev_up(pos, T * 4);
        CK(msm_cuda_rope(dx, dp, T, nh, hd, hd, shapes[s].theta, EX));
        down(out, dx, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "rope T=%d nh=%d hd=%d", T, nh, hd);
        cudaFree(dx), cudaFree(dp);
        free(x), free(ref), free(out), free(pos);
    }
}

/* ---- kv_write ---- */

Test(cuda_kernels, kv_write_rounds_into_paged_bf16_slots, .timeout = 60) {
    need_gpu();
    static const int shapes[][4] = {{1, 4, 64, 3}, {70, 2, 128, 8}, {5, 3, 96, 2}}; /* T,kvh,hd,blocks */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], kvh = shapes[s][1], hd = shapes[s][2], nb = shapes[s][3];
        int nslots = nb * MSM_KV_BLOCK;
        size_t row = (size_t)kvh * hd, cache = (size_t)nslots * row;
        float *k = host_f32(T * row, 1.0f), *v = host_f32(T * row, 1.0f);
        int32_t *slot = malloc(T * 4), *perm = malloc(nslots * 4);
        for (int i = 0; i < nslots; i++) perm[i] = i;
        for (int i = nslots - 1; i > 0; i--) {
            int j = rndi(i + 1), tmp = perm[i];
            perm[i] = perm[j], perm[j] = tmp;
        }
        for (int t = 0; t < T; t++) slot[t] = perm[t];
        float *kc = calloc(cache, 4), *vc = calloc(cache, 4);
        msm_cpu_kv_write(kc, vc, k, v, slot, T, kvh, hd);
        uint16_t *dkc = dev_poison(cache * 2), *dvc = dev_poison(cache * 2);
        float *dk = dev_up(k, T * row * 4), *dv = dev_up(v, T * row * 4);
        int32_t *ds = dev_up(slot, T * 4);
        CK(msm_cuda_kv_write(dkc, dvc, dk, dv, ds, T, kvh, hd, EX));
        uint16_t *hk = malloc(cache * 2), *hv = malloc(cache * 2);
        down(hk, dkc, cache * 2), down(hv, dvc, cache * 2);
        bool *written = calloc(nslots, 1);
        for (int t = 0; t < T; t++) written[slot[t]] = true;
        for (int sl = 0; sl < nslots; sl++)
            for (size_t j = 0; j < row; j++) {
                size_t i = (size_t)sl * row + j;
                uint16_t ek = written[sl] ? msm_f32_to_bf16(kc[i]) : 0xffff;
                uint16_t ev = written[sl] ? msm_f32_to_bf16(vc[i]) : 0xffff;
                cr_assert(hk[i] == ek && hv[i] == ev, "slot %d elem %zu: %04x/%04x want %04x/%04x",
                          sl, j, hk[i], hv[i], ek, ev);
            }
        cudaFree(dkc), cudaFree(dvc), cudaFree(dk), cudaFree(dv), cudaFree(ds);
        free(k), free(v), free(slot), free(perm), free(kc), free(vc), free(hk), free(hv), free(written);
    }
}

/* ---- attention ---- */

typedef struct attn_shape {
    int n_seq, tokens_per_seq; /* each sequence contributes its last tokens_per_seq positions */
    int nh, kvh, hd;
    int ctx; /* 0: random lengths up to 192; else every sequence ctx - 15..ctx positions long */
    const char *what;
} attn_shape;

static void attention_case(msm_cuda_exec ex, const attn_shape *sh) {
    int max_blocks = sh->ctx ? (sh->ctx + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK : 12;
    int nb = sh->n_seq * max_blocks + 1;
    size_t row = (size_t)sh->kvh * sh->hd, cache = (size_t)nb * MSM_KV_BLOCK * row;
    /* the cache as bf16 values (what kv_write stores), and as f32 for the CPU */
    float *kcf, *vcf;
    uint16_t *kcb = host_bf16(cache, 1.0f, &kcf), *vcb = host_bf16(cache, 1.0f, &vcf);
    /* block tables: a random permutation of the blocks, so pages are scattered */
    int32_t *perm = malloc(nb * 4), *bt = malloc((size_t)sh->n_seq * max_blocks * 4);
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = rndi(i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    for (int i = 0; i < sh->n_seq * max_blocks; i++) bt[i] = perm[i];
    int T = sh->n_seq * sh->tokens_per_seq;
    int32_t *seq = malloc(T * 4), *pos = malloc(T * 4);
    for (int s = 0, t = 0; s < sh->n_seq; s++) {
        int len = sh->ctx ? sh->ctx - rndi(MSM_KV_BLOCK)
                          : sh->tokens_per_seq + rndi(max_blocks * MSM_KV_BLOCK - sh->tokens_per_seq);
        for (int j = 0; j < sh->tokens_per_seq; j++, t++)
            seq[t] = s, pos[t] = len - sh->tokens_per_seq + j; /* causal: prefill or decode */
    }
    size_t qn = (size_t)T * sh->nh * sh->hd;
    float *q = host_f32(qn, 1.0f), *ref = malloc(qn * 4), *out = malloc(qn * 4);
    float scale = 1.0f / sqrtf((float)sh->hd);
    msm_cpu_attention(ref, q, kcf, vcf, seq, pos, bt, max_blocks, T, sh->nh, sh->kvh, sh->hd, scale);
    uint16_t *dk = dev_up(kcb, cache * 2), *dv = dev_up(vcb, cache * 2);
    int32_t *dseq = dev_up(seq, T * 4), *dpos = dev_up(pos, T * 4);
    int32_t *dbt = dev_up(bt, (size_t)sh->n_seq * max_blocks * 4);
    float *dq = dev_up(q, qn * 4), *dout = dev_poison(qn * 4);
    CK(msm_cuda_attention(dout, dq, dk, dv, dseq, dpos, dbt, max_blocks, T, sh->nh, sh->kvh,
                          sh->hd, scale, ex));
    down(out, dout, qn * 4);
    /* the tensor-core path rounds q and p to bf16 hi + lo pairs (~16 mantissa bits each) */
    double tol = ex.tune->att_mma == MSM_CUDA_ATT_MMA_ON || ex.tune->att_mma_split ? 1e-4 : 2e-5;
    CHECK_ERR(out, ref, qn, tol, "attention %s (heads a block <= %d from %d pairs, mma %d)", sh->what,
              ex.tune->att_group, ex.tune->att_group_min, ex.tune->att_mma);
    /* q read in place from wider rows (as from qkv), context split over blocks (flash-decoding);
     * run twice on the same workspace: the split blocks' arrival counters must be back at zero
     * after each call, and the result bitwise the same */
    {
        size_t ld = (size_t)sh->nh * sh->hd + 24, wsb = msm_cuda_attention_ws_bytes(T, sh->nh, sh->hd);
        float *qw = calloc((size_t)T * ld, 4), *out2 = malloc(qn * 4);
        for (int t = 0; t < T; t++) memcpy(qw + (size_t)t * ld, q + (size_t)t * sh->nh * sh->hd, 4 * (size_t)sh->nh * sh->hd);
        float *dqw = dev_up(qw, (size_t)T * ld * 4), *dout2 = dev_poison(qn * 4);
        void *ws = dev(wsb);
        cr_assert_eq(cudaMemset(ws, 0, wsb ? wsb : 1), cudaSuccess); /* zeroed once, as the backend does */
        CK(msm_cuda_attention_ex(dout2, dqw, ld, dk, dv, dseq, dpos, dbt, max_blocks, T, sh->nh, sh->kvh,
                                 sh->hd, scale, ws, wsb, ex));
        down(out, dout2, qn * 4);
        CHECK_ERR(out, ref, qn, tol, "attention_ex (strided q, split) %s (heads a block <= %d from %d pairs, mma %d)",
                  sh->what, ex.tune->att_group, ex.tune->att_group_min, ex.tune->att_mma);
        cr_assert_eq(cudaMemset(dout2, 0xff, qn * 4), cudaSuccess);
        CK(msm_cuda_attention_ex(dout2, dqw, ld, dk, dv, dseq, dpos, dbt, max_blocks, T, sh->nh, sh->kvh,
                                 sh->hd, scale, ws, wsb, ex));
        down(out2, dout2, qn * 4);
        cr_assert(memcmp(out, out2, qn * 4) == 0, "attention_ex second split run differs: %s", sh->what);
        /* the splits merged by the last block or in a cluster, (decode: one token a sequence)
         * the first K/V rows loaded before the PDL wait or after, and the block-table entries
         * copied into shared memory or loaded with each tile: the same bits */
        for (int v = 0; v < 8; v++) {
            msm_cuda_tuning tv = *ex.tune;
            tv.att_cluster = v & 1;
            tv.att_early = v >> 1 & 1;
            tv.att_bt_cache = !(v >> 2);
            msm_cuda_exec ev = {.stream = ex.stream, .tune = &tv, .decode = sh->tokens_per_seq == 1};
            cr_assert_eq(cudaMemset(dout2, 0xff, qn * 4), cudaSuccess);
            CK(msm_cuda_attention_ex(dout2, dqw, ld, dk, dv, dseq, dpos, dbt, max_blocks, T, sh->nh, sh->kvh,
                                     sh->hd, scale, ws, wsb, ev));
            down(out2, dout2, qn * 4);
            cr_assert(memcmp(out, out2, qn * 4) == 0, "attention_ex (cluster %d, early %d, table copy %d, decode %d) differs: %s",
                      tv.att_cluster, tv.att_early, tv.att_bt_cache, ev.decode, sh->what);
        }
        cudaFree(dqw), cudaFree(dout2), cudaFree(ws);
        free(qw), free(out2);
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dseq), cudaFree(dpos), cudaFree(dbt), cudaFree(dq), cudaFree(dout);
    free(kcb), free(vcb), free(kcf), free(vcf), free(perm), free(bt), free(seq), free(pos);
    free(q), free(ref), free(out);
}

Test(cuda_kernels, attention_decode_and_prefill_match_cpu, .timeout = 180) {
    need_gpu();
    static const attn_shape shapes[] = {
        {1, 1, 4, 4, 64, 0, "decode T=1 MHA hd64"},
        {8, 1, 8, 2, 128, 0, "decode batch 8 GQA 4:1 hd128"},
        {1, 70, 6, 2, 128, 0, "prefill T=70 GQA 3:1"},
        {2, 65, 4, 4, 96, 0, "prefill 2 seqs T=130 MHA hd96"},
        {3, 5, 16, 1, 256, 0, "chunked prefill MQA hd256"},
        {5, 1, 3, 3, 40, 0, "decode odd heads hd40"},
        {2, 3, 4, 2, 36, 0, "hd36 (not a multiple of 8: scalar loads)"},
        {1, 1, 16, 16, 128, 700, "decode T=1 ctx 700 (many splits)"},
        {32, 1, 16, 16, 128, 513, "decode batch 32 MHA hd128 ctx ~512 (Qwen1.5-MoE)"},
        {8, 1, 32, 4, 128, 513, "decode batch 8 GQA 8:1 hd128 ctx ~512 (Qwen3-30B-A3B)"},
        {2, 1, 12, 1, 128, 700, "decode GQA 12:1 ctx 700 (many splits)"},
        {1, 1, 6, 2, 128, 300, "decode GQA 3:1 ctx 300"},
        {2, 9, 8, 2, 256, 0, "prefill GQA 4:1 hd256"},
        {3, 4, 12, 2, 64, 0, "prefill GQA 6:1 hd64"},
        {64, 1, 32, 4, 128, 513, "decode batch 64 GQA 8:1 hd128 ctx ~512 (Qwen3-30B-A3B)"},
        {40, 1, 96, 8, 128, 300, "decode batch 40 GQA 12:1 hd128 (GLM-4.5-Air: 8 + 4 heads a block)"},
        {3, 1, 16, 1, 32, 40, "decode MQA 16:1 hd32 (two blocks a kv head)"},
        {2, 20, 8, 4, 16, 0, "prefill GQA 2:1 hd16 (the golden models' shape)"},
        {2, 1, 4, 4, 64, 1500, "decode ctx 1500 (unsplit: past the block-table cache's 1024 positions)"},
    };
    /* the SIMT kernel: the default (GQA blocks take 4 query heads of a kv head once the pairs
     * fill a wave), then grouping at every size, then one head a block; then the tensor-core
     * kernel wherever it fits (head dims 16..128; the others stay SIMT); then the SIMT kernel
     * loading each tile's block-table entries itself (no shared-memory copy), and unsplit (a
     * block's range past the copy's 64 entries); then the tensor-core kernel's cluster split
     * where it takes the call (4+ query heads a kv head, hd 64 / 128, up to 16 splits and at most
     * 4: more blocks past the context) */
    for (int gb = 0; gb < 8; gb++) {
        msm_cuda_tuning t = tune0;
        t.att_group = gb == 2 ? 1 : 4;
        t.att_group_min = gb == 1 ? 1 : 0;
        t.att_mma = gb == 3 ? MSM_CUDA_ATT_MMA_ON : MSM_CUDA_ATT_MMA_OFF;
        t.att_bt_cache = gb != 4;
        if (gb == 5) t.att_max_split = 1;
        t.att_mma_split = gb >= 6;
        t.att_mma_split_min_t = 1, t.att_mma_split_max_t = 0;
        t.att_mma_split_mha_max_t = gb == 6 ? 1000 : 0; /* 6: MHA at every size too */
        if (gb == 7) t.att_max_split = 4;
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) attention_case(EX_T(&t), &shapes[s]);
    }
}

/* The split's tokens and heads rule on the host (GPU facts of an H200-like device set by hand):
 * Qwen3-30B-A3B's 32 query heads over 4 kv heads at att_mma_split_min_t..max_t tokens only; 8
 * query heads a kv head taken, 12 (two head groups) not; MHA at 1..att_mma_split_mha_max_t tokens
 * (Qwen1.5-MoE's 16 heads at one token: 16 splits), 2 query heads a kv head never. */
Test(cuda_kernels, attention_mma_split_tokens_and_heads_rule) {
    msm_cuda_tuning t;
    memset(&t, 0, sizeof t);
    t.att_mma_split = true, t.att_mma_split_min_t = 4, t.att_mma_split_max_t = 16, t.att_max_split = 16;
    t.att_mma_split_mha_max_t = 1;
    t.sms = 132, t.att_mma_split_per_sm[1] = 3;
    for (int ns = 2; ns <= 16; ns++) t.att_mma_split_fit[1][ns] = 1000;
    msm_cuda_exec ex = {.stream = 0, .tune = &t, .decode = true};
    const void *al = (const void *)(uintptr_t)256;
    cr_expect_eq(msm_cuda_attention_mma_splits(3, 32, 4, 128, al, 32 * 128, al, al, ex), 0, "under the minimum");
    cr_expect_eq(msm_cuda_attention_mma_splits(4, 32, 4, 128, al, 32 * 128, al, al, ex), 16, "4 tokens: 16 splits");
    cr_expect_eq(msm_cuda_attention_mma_splits(16, 32, 4, 128, al, 32 * 128, al, al, ex), 4, "16 tokens: 4 splits");
    cr_expect_eq(msm_cuda_attention_mma_splits(17, 32, 4, 128, al, 32 * 128, al, al, ex), 0, "over the maximum");
    t.att_mma_split_gqa_max = 8; /* a GQA cap: 4 tokens 8 splits, MHA's one token still 16 */
    cr_expect_eq(msm_cuda_attention_mma_splits(4, 32, 4, 128, al, 32 * 128, al, al, ex), 8, "4 tokens, capped: 8");
    cr_expect_eq(msm_cuda_attention_mma_splits(16, 32, 4, 128, al, 32 * 128, al, al, ex), 4, "16 tokens, capped: 4");
    cr_expect_eq(msm_cuda_attention_mma_splits(1, 16, 16, 128, al, 16 * 128, al, al, ex), 16, "MHA: no GQA cap");
    t.att_mma_split_gqa_max = 0;
    cr_expect_gt(msm_cuda_attention_mma_splits(8, 64, 8, 128, al, 64 * 128, al, al, ex), 0, "8 query heads a kv head");
    cr_expect_eq(msm_cuda_attention_mma_splits(8, 96, 8, 128, al, 96 * 128, al, al, ex), 0, "12 query heads a kv head");
    cr_expect_eq(msm_cuda_attention_mma_splits(8, 16, 16, 128, al, 16 * 128, al, al, ex), 0, "MHA at 8 tokens");
    cr_expect_eq(msm_cuda_attention_mma_splits(2, 16, 16, 128, al, 16 * 128, al, al, ex), 0, "MHA at 2 tokens");
    cr_expect_eq(msm_cuda_attention_mma_splits(1, 16, 16, 128, al, 16 * 128, al, al, ex), 16, "MHA at one token");
    cr_expect_eq(msm_cuda_attention_mma_splits(1, 16, 8, 128, al, 16 * 128, al, al, ex), 0, "2 query heads a kv head");
    t.att_mma_split_mha_max_t = 0;
    cr_expect_eq(msm_cuda_attention_mma_splits(1, 16, 16, 128, al, 16 * 128, al, al, ex), 0, "MHA switched off");
    t.att_mma_split_max_t = 0;
    cr_expect_gt(msm_cuda_attention_mma_splits(17, 32, 4, 128, al, 32 * 128, al, al, ex), 0, "no maximum");
}

/* The tensor-core attention's cluster split (tuning att_mma_split) takes the calls its rule gives
 * (Qwen3-30B-A3B's 32 query heads over 4 kv heads at 1, 2, 8 and 16 tokens: 8, 8, 8, 4 splits on
 * the H100 / H200 with att_mma_split_min_t 1 and the GQA cap of 8; below that minimum, MHA past att_mma_split_mha_max_t
 * tokens, more query heads a kv head than one block takes (GLM-4.5's 12) and head dims it has no
 * kernel for: never) and at decode reads each token's
 * own K/V row only after its PDL wait: here the kernel just before writes those rows (kv_write)
 * over poisoned ones (NaN), and the result must match the CPU on the written cache. Twice: the
 * same bits. */
Test(cuda_kernels, attention_mma_split_taken_by_its_rule_and_reads_the_new_rows_after_its_wait, .timeout = 60) {
    need_gpu();
    msm_cuda_tuning t = tune0;
    t.att_mma_split = true, t.att_mma_split_min_t = 1, t.att_mma_split_max_t = 0, t.att_mma = MSM_CUDA_ATT_MMA_OFF;
    t.att_early = true;
    msm_cuda_exec ex = {.stream = 0, .tune = &t, .decode = true};
    enum { NH = 32, KVH = 4, HD = 128, CTX = 513, T = 8 };
    /* the rule, on aligned pointers (only their alignment is read): one wave of blocks and of clusters */
    const void *al = (const void *)(uintptr_t)256;
    static const int toks[] = {1, 2, 8, 16}, least[] = {8, 8, 4, 2};
    for (int i = 0; i < 4; i++) {
        int ns = msm_cuda_attention_mma_splits(toks[i], NH, KVH, HD, al, NH * HD, al, al, ex);
        cr_expect(ns >= least[i] && ns <= 16 && !(ns & (ns - 1)), "%d tokens: %d splits", toks[i], ns);
        cr_expect_leq((long)toks[i] * KVH * ns, (long)t.sms * t.att_mma_split_per_sm[1], "%d tokens: one wave", toks[i]);
    }
    cr_expect_eq(msm_cuda_attention_mma_splits(2, 16, 16, HD, al, 16 * HD, al, al, ex), 0, "MHA at 2 tokens");
    cr_expect_gt(msm_cuda_attention_mma_splits(1, 16, 16, HD, al, 16 * HD, al, al, ex), 0, "MHA at one token");
    cr_expect_eq(msm_cuda_attention_mma_splits(1, 96, 8, HD, al, 96 * HD, al, al, ex), 0, "12 query heads a kv head");
    cr_expect_gt(msm_cuda_attention_mma_splits(1, 64, 8, HD, al, 64 * HD, al, al, ex), 0, "8 query heads a kv head");
    t.att_mma_split_min_t = 4;
    cr_expect_eq(msm_cuda_attention_mma_splits(3, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "under the minimum");
    cr_expect_gt(msm_cuda_attention_mma_splits(4, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "at the minimum");
    t.att_mma_split_max_t = 16;
    cr_expect_gt(msm_cuda_attention_mma_splits(16, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "at the maximum");
    cr_expect_eq(msm_cuda_attention_mma_splits(17, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "over the maximum");
    t.att_mma_split_min_t = 1, t.att_mma_split_max_t = 0;
    cr_expect_eq(msm_cuda_attention_mma_splits(1, NH, KVH, 96, al, NH * 96, al, al, ex), 0, "hd 96");
    cr_expect_eq(msm_cuda_attention_mma_splits(1024, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "a full wave unsplit");
    t.att_mma_split = false;
    cr_expect_eq(msm_cuda_attention_mma_splits(1, NH, KVH, HD, al, NH * HD, al, al, ex), 0, "switched off");
    t.att_mma_split = true;

    int max_blocks = (CTX + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK, nb = T * max_blocks;
    size_t row = (size_t)KVH * HD, cache = (size_t)nb * MSM_KV_BLOCK * row, qn = (size_t)T * NH * HD;
    float *kcf, *vcf;
    uint16_t *kcb = host_bf16(cache, 1.0f, &kcf), *vcb = host_bf16(cache, 1.0f, &vcf);
    int32_t *bt = malloc((size_t)nb * 4), seq[T], pos[T], slot[T];
    for (int i = 0; i < nb; i++) bt[i] = nb - 1 - i;
    float *kn = host_f32((size_t)T * row, 1.0f), *vn = host_f32((size_t)T * row, 1.0f);
    for (int s2 = 0; s2 < T; s2++) {
        seq[s2] = s2, pos[s2] = CTX - 1 - rndi(MSM_KV_BLOCK) - (s2 == 0 ? 0 : 16 * rndi(8));
        int p = pos[s2], bi = bt[s2 * max_blocks + p / MSM_KV_BLOCK];
        slot[s2] = bi * MSM_KV_BLOCK + p % MSM_KV_BLOCK;
        /* the new rows: bf16 in the CPU's cache, NaN in the device's until kv_write */
        for (size_t j = 0; j < row; j++) {
            size_t i = (size_t)slot[s2] * row + j;
            kcf[i] = msm_bf16_to_f32(msm_f32_to_bf16(kn[(size_t)s2 * row + j]));
            vcf[i] = msm_bf16_to_f32(msm_f32_to_bf16(vn[(size_t)s2 * row + j]));
            kcb[i] = vcb[i] = 0xffff;
        }
    }
    float *q = host_f32(qn, 1.0f), *ref = malloc(qn * 4), *out = malloc(qn * 4), *out2 = malloc(qn * 4);
    float scale = 1.0f / sqrtf((float)HD);
    msm_cpu_attention(ref, q, kcf, vcf, seq, pos, bt, max_blocks, T, NH, KVH, HD, scale);
    int32_t *dseq = dev_up(seq, sizeof seq), *dpos = dev_up(pos, sizeof pos), *dslot = dev_up(slot, sizeof slot);
    int32_t *dbt = dev_up(bt, (size_t)nb * 4);
    float *dq = dev_up(q, qn * 4), *dout = dev_poison(qn * 4), *dkn = dev_up(kn, (size_t)T * row * 4),
          *dvn = dev_up(vn, (size_t)T * row * 4);
    uint16_t *dk = dev(cache * 2), *dv = dev(cache * 2);
    for (int run = 0; run < 2; run++) {
        CK(cudaMemcpy(dk, kcb, cache * 2, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1);
        CK(cudaMemcpy(dv, vcb, cache * 2, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1);
        CK(msm_cuda_kv_write(dk, dv, dkn, dvn, dslot, T, KVH, HD, ex));
        CK(msm_cuda_attention(dout, dq, dk, dv, dseq, dpos, dbt, max_blocks, T, NH, KVH, HD, scale, ex));
        down(run ? out2 : out, dout, qn * 4);
    }
    CHECK_ERR(out, ref, qn, 1e-4, "split tensor-core attention with the new rows written just before");
    cr_expect(memcmp(out, out2, qn * 4) == 0, "second run differs");
    cudaFree(dseq), cudaFree(dpos), cudaFree(dslot), cudaFree(dbt), cudaFree(dq), cudaFree(dout), cudaFree(dkn);
    cudaFree(dvn), cudaFree(dk), cudaFree(dv);
    free(kcb), free(vcb), free(kcf), free(vcf), free(bt), free(kn), free(vn), free(q), free(ref), free(out), free(out2);
}

/* Which merge the split attention takes: the cluster form never touches the workspace, the
 * last-block merge writes its partials there. Clusters of the portable sizes (up to 8) fit an
 * sm_90 GPU; one token of 4 heads over a 700-position context splits 16 ways, and takes the
 * cluster form exactly when its 4 clusters of 16 leave att_cluster_spare (8) of those the GPU holds
 * free (att_cluster_fit); with att_cluster off it never does. */
Test(cuda_kernels, attention_clusters_taken_where_they_fit, .timeout = 60) {
    need_gpu();
    for (int ns = 2; ns <= 8; ns++)
        cr_expect(tune0.att_cluster_fit[2][1][ns] > 0, "no clusters of %d held (width 16, vec)", ns);
    enum { NH = 4, HD = 128, CTX = 700 };
    int max_blocks = (CTX + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK;
    size_t cache = (size_t)max_blocks * MSM_KV_BLOCK * NH * HD;
    float *unused;
    uint16_t *kcb = host_bf16(cache, 1.0f, &unused);
    free(unused);
    uint16_t *vcb = host_bf16(cache, 1.0f, &unused);
    free(unused);
    int32_t *bt = malloc(max_blocks * 4), seq = 0, pos = CTX - 1;
    for (int i = 0; i < max_blocks; i++) bt[i] = max_blocks - 1 - i;
    float *q = host_f32(NH * HD, 1.0f);
    uint16_t *dk = dev_up(kcb, cache * 2), *dv = dev_up(vcb, cache * 2);
    int32_t *dseq = dev_up(&seq, 4), *dpos = dev_up(&pos, 4), *dbt = dev_up(bt, max_blocks * 4);
    float *dq = dev_up(q, NH * HD * 4), *dout = dev_poison(NH * HD * 4);
    size_t wsb = msm_cuda_attention_ws_bytes(1, NH, HD);
    void *ws = dev(wsb);
    unsigned char *hws = malloc(wsb);
    bool fits = NH + tune0.att_cluster_spare <= tune0.att_cluster_fit[2][1][16];
    for (int cl = 0; cl < 2; cl++) {
        msm_cuda_tuning t = tune0;
        t.att_cluster = cl;
        t.att_mma_split_mha_max_t = 0; /* the SIMT kernel's merges, not the tensor-core split's */
        cr_assert_eq(cudaMemset(ws, 0, wsb), cudaSuccess);
        CK(msm_cuda_attention_ex(dout, dq, NH * HD, dk, dv, dseq, dpos, dbt, max_blocks, 1, NH, NH, HD,
                                 1.0f / sqrtf((float)HD), ws, wsb, EX_T(&t)));
        down(hws, ws, wsb);
        bool untouched = true;
        for (size_t i = 0; i < wsb && untouched; i++) untouched = hws[i] == 0;
        cr_expect_eq(untouched, cl && fits, "att_cluster %d, %d clusters of 16 held: workspace %s", cl,
                     tune0.att_cluster_fit[2][1][16], untouched ? "untouched" : "written");
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dseq), cudaFree(dpos), cudaFree(dbt), cudaFree(dq), cudaFree(dout), cudaFree(ws);
    free(kcb), free(vcb), free(bt), free(q), free(hws);
}

/* ---- add / scale_rows / sigmoid / swiglu ---- */

Test(cuda_kernels, elementwise_ops_match_cpu, .timeout = 60) {
    need_gpu();
    static const size_t ns[] = {1, 1001, 70 * 2048 + 3, 64 * 1024};
    for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
        size_t n = ns[s];
        float *a = host_f32(n, 3.0f), *b = host_f32(n, 3.0f), *ref = malloc(n * 4), *out = malloc(n * 4);
        float *da = dev_up(a, n * 4), *db = dev_up(b, n * 4), *dy = dev_poison(n * 4);
        msm_cpu_add(ref, a, b, n);
        CK(msm_cuda_add(dy, da, db, n, EX));
        down(out, dy, n * 4);
        CHECK_ERR(out, ref, n, 1e-6, "add n=%zu", n);
        CK(msm_cuda_add(da, da, db, n, EX)); /* aliasing */
        down(out, da, n * 4);
        CHECK_ERR(out, ref, n, 1e-6, "add in place n=%zu", n);
        msm_cpu_sigmoid(ref, b, n);
        cudaMemset(dy, 0xff, n * 4);
        CK(msm_cuda_sigmoid(dy, db, n, EX));
        down(out, dy, n * 4);
        CHECK_ERR(out, ref, n, 1e-6, "sigmoid n=%zu", n);
        cudaFree(da), cudaFree(db), cudaFree(dy);
        free(a), free(b), free(ref), free(out);
    }
    static const int rs[][2] = {{1, 2048}, {7, 129}, {130, 1408}};
    for (size_t s = 0; s < sizeof rs / sizeof *rs; s++) {
        int T = rs[s][0], D = rs[s][1];
        size_t n = (size_t)T * D;
        float *x = host_f32(n, 1.0f), *sc = host_f32(T, 1.0f), *gu = host_f32(2 * n, 2.0f);
        float *ref = malloc(n * 4), *out = malloc(n * 4);
        float *dx = dev_up(x, n * 4), *ds = dev_up(sc, T * 4), *dgu = dev_up(gu, 2 * n * 4);
        float *dy = dev_poison(n * 4);
        msm_cpu_scale_rows(ref, x, sc, T, D);
        CK(msm_cuda_scale_rows(dy, dx, ds, T, D, EX));
        down(out, dy, n * 4);
        CHECK_ERR(out, ref, n, 1e-6, "scale_rows T=%d D=%d", T, D);
        msm_cpu_swiglu(ref, gu, T, D);
        cudaMemset(dy, 0xff, n * 4);
        CK(msm_cuda_swiglu(dy, dgu, T, D, EX));
        down(out, dy, n * 4);
        CHECK_ERR(out, ref, n, 1e-6, "swiglu T=%d I=%d", T, D);
        cudaFree(dx), cudaFree(ds), cudaFree(dgu), cudaFree(dy);
        free(x), free(sc), free(gu), free(ref), free(out);
    }
}

/* ---- router ---- */

Test(cuda_kernels, router_topk_matches_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][4] = {{1, 60, 4, 0}, {70, 60, 4, 0}, {130, 128, 8, 1},
                                    {5, 256, 8, 1}, {3, 7, 7, 1},  {33, 200, 1, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
        bool norm = shapes[s][3];
        float *l = host_f32((size_t)T * E, 2.0f);
        if (T > 1) l[E + 3] = l[E + 5] = 9.0f; /* an exact tie: lowest id first */
        int32_t *ids = malloc(T * k * 4), *gids = malloc(T * k * 4);
        float *w = malloc(T * k * 4), *gw = malloc(T * k * 4);
        msm_cpu_router_topk(ids, w, l, T, E, k, norm);
        float *dl = dev_up(l, (size_t)T * E * 4), *dw = dev_poison(T * k * 4);
        int32_t *di = dev_poison(T * k * 4);
        CK(msm_cuda_router_topk(di, dw, dl, T, E, k, norm, EX));
        down(gids, di, T * k * 4), down(gw, dw, T * k * 4);
        for (int i = 0; i < T * k; i++) {
            const float *lt = l + (size_t)(i / k) * E;
            cr_assert(gids[i] >= 0 && gids[i] < E, "id out of range");
            cr_assert(gids[i] == ids[i] || fabsf(lt[gids[i]] - lt[ids[i]]) < 1e-6f,
                      "T=%d E=%d k=%d: slot %d id %d, cpu %d", T, E, k, i, gids[i], ids[i]);
        }
        CHECK_ERR(gw, w, (size_t)T * k, 1e-5, "router weights T=%d E=%d k=%d", T, E, k);
        cudaFree(dl), cudaFree(dw), cudaFree(di);
        free(l), free(ids), free(gids), free(w), free(gw);
    }
}

/* Group-limited sigmoid router (GLM-4.5, DeepSeek-V3 shapes and odd ones): ids equal the CPU's
 * (or tie with them in choice score), weights within fp32 rounding; an exact tie of two experts
 * goes to the lower id on both. */
/* The router GEMV + top-k in one launch (its last block ranks the logits in parallel, or with
 * router_cluster one cluster a token whose rank 0 ranks them from distributed shared memory, or
 * with router_tcluster one cluster for 2, 4 or 8 tokens, each ranked by its own block of it)
 * equals msm_cuda_linear then msm_cuda_router_topk (k rounds of warp arg-max) bit for bit (ids,
 * weights), over repeated calls (the counters return to zero), T past the fused range (the pair
 * inside the launcher), K not a multiple of 8, clusters of 8 to 16 blocks of 1 to 16 logits (their
 * logits into the ranking blocks by distributed stores and a barrier, or by st.async), an
 * exact tie at the top of token 0 (two equal rows aligned with its x: lowest id first) and a NaN
 * logit (the fused kernels fall back to the rounds). x is written by the kernel launched just
 * before (programmatic dependent launch): the cluster form's early weight loads must not read it. */
Test(cuda_kernels, router_linear_topk_equals_linear_then_topk, .timeout = 60) {
    need_gpu();
    static const int shapes[][6] = {{1, 60, 2048, 4, 1, 0}, {8, 60, 2048, 4, 0, 0}, {64, 128, 512, 8, 1, 0},
                                    {70, 60, 256, 4, 0, 0}, {3, 7, 100, 7, 1, 0},   {1, 256, 4096, 8, 1, 0},
                                    {1, 128, 2048, 8, 1, 1}, {4, 60, 2048, 4, 0, 1}, {2, 8, 1024, 2, 1, 0},
                                    {1, 17, 2048, 4, 0, 0},  {1, 128, 768, 8, 1, 0}, {8, 128, 2048, 8, 1, 0},
                                    {5, 128, 2048, 8, 1, 1}, {17, 60, 2048, 4, 1, 0}, {4, 256, 1024, 8, 1, 0},
                                    {6, 16, 2048, 6, 0, 0}};
    cudaStream_t st;
    cr_assert_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], E = shapes[s][1], K = shapes[s][2], k = shapes[s][3];
        bool norm = shapes[s][4];
        float *wf, *x = host_f32((size_t)T * K, 1.0f);
        uint16_t *wb = host_bf16((size_t)E * K, 0.05f, &wf);
        if (E > 5)
            for (int j = 0; j < K; j++) /* rows 3 and 5: token 0's top two, tied */
                wb[(size_t)3 * K + j] = wb[(size_t)5 * K + j] = x[j] >= 0.0f ? 0x3d4c : 0xbd4c; /* +-0.05 */
        if (shapes[s][5]) wb[(size_t)(E - 1) * K] = 0x7fc0; /* NaN: the last expert's logit */
        float *dx0 = dev_up(x, (size_t)T * K * 4), *dx = dev((size_t)T * K * 4), *dz = dev((size_t)T * K * 4);
        float *dl = dev_poison((size_t)T * E * 4);
        cr_assert_eq(cudaMemset(dz, 0, (size_t)T * K * 4), cudaSuccess);
        uint16_t *dwr = dev_up(wb, (size_t)E * K * 2);
        size_t wsb = msm_cuda_router_ws_bytes(T, E);
        void *ws = dev(wsb);
        cr_assert_eq(cudaMemset(ws, 0, wsb), cudaSuccess);
        int32_t *i1 = dev_poison(T * k * 4), *i2 = dev_poison(T * k * 4);
        float *w1 = dev_poison(T * k * 4), *w2 = dev_poison(T * k * 4);
        CK(msm_cuda_linear(dl, dx0, dwr, NULL, T, E, K, NULL, NULL, 0, EX));
        CK(msm_cuda_router_topk(i1, w1, dl, T, E, k, norm, EX));
        int32_t *h1 = malloc(T * k * 4), *h2 = malloc(T * k * 4);
        float *g1 = malloc(T * k * 4), *g2 = malloc(T * k * 4);
        down(h1, i1, T * k * 4), down(g1, w1, T * k * 4);
        /* the counter form, the cluster form with and without early loads; the batched cluster form
         * at 2, 4 and 8 tokens a cluster, with and without; the cluster forms again with their logits
         * by st.async (router_st_async) */
        for (int call = 0; call < 24; call++) {
            int rep = call % 12; /* calls 12-23: the cluster forms' logits by st.async */
            msm_cuda_tuning t = tune0;
            t.router_st_async = call >= 12;
            t.router_cluster_max_t = rep < 6 && rep % 3 != 0 ? 64 : 0;
            t.gemv_early = rep < 6 ? rep % 3 != 2 : rep % 2 == 0;
            t.router_tcluster_max_t = rep < 6 ? 0 : 64;
            t.router_tcluster_tb = 2 << (rep - 6) / 2;
            bool batched = rep >= 6 && T >= 2 && T * E <= 1024 && K % 8 == 0;
            cr_assert_eq(msm_cuda_router_batched(T, E, K, false, &t), batched, "T=%d E=%d K=%d call %d: batched form",
                         T, E, K, call);
            cr_assert(!msm_cuda_router_batched(T, E, K, true, &t), "T=%d E=%d K=%d: not beside the aux stream", T, E,
                      K);
            msm_cuda_exec ex = {.stream = st, .tune = &t};
            CK(cudaMemsetAsync(i2, 0xff, T * k * 4, st));
            CK(cudaMemsetAsync(dx, 0xff, (size_t)T * K * 4, st)); /* NaN until the add below */
            CK(msm_cuda_add(dx, dx0, dz, (size_t)T * K, ex));
            CK(msm_cuda_router_linear_topk(i2, w2, dx, dwr, T, E, K, k, norm, NULL, ws, wsb, ex));
            CK(cudaStreamSynchronize(st));
            down(h2, i2, T * k * 4), down(g2, w2, T * k * 4);
            cr_assert(memcmp(h1, h2, T * k * 4) == 0, "T=%d E=%d K=%d call %d: ids differ", T, E, K, call);
            cr_assert(memcmp(g1, g2, T * k * 4) == 0, "T=%d E=%d K=%d call %d: weights differ", T, E, K, call);
        }
        cr_expect_eq(msm_cuda_router_linear_topk(i2, w2, dx, dwr, T, E, K, k, norm, NULL, ws, wsb - 4, EX), -EINVAL);
        cudaFree(dx0), cudaFree(dx), cudaFree(dz), cudaFree(dl), cudaFree(dwr), cudaFree(ws);
        cudaFree(i1), cudaFree(i2), cudaFree(w1), cudaFree(w2);
        free(x), free(wf), free(wb), free(h1), free(h2), free(g1), free(g2);
    }
    cudaStreamDestroy(st);
}

/* ADD_RMSNORM + the fused router in one launch (msm_cuda_norm_router_linear_topk) gives the two
 * kernels' bits: ids, weights, the residual sum and the norm, one block a logit (T * E <= 1024) and
 * one warp a logit (past it), one cluster a token (router_cluster_max_t: one token by default, up to
 * 8 in a variant, with its logits by st.async in another, none in a third), its norm layouts
 * (K = 1024, 2048 and 4096: 256 norm threads of 4, 8 and 16 values), E = 60 / 128 / 256 / 8 / 64,
 * T = 1..8,
 * the router weights requested before the PDL wait or after it, the inputs written by the kernel
 * just before on buffers poisoned just before that (a read ahead of the wait would show), repeated
 * calls (its counters return to zero); and what it does not take refused. */
Test(cuda_kernels, norm_router_equals_add_rmsnorm_then_router, .timeout = 120) {
    need_gpu();
    static const int shapes[][3] = {{128, 2048, 8}, {60, 2048, 4}, {8, 4096, 2}, {256, 4096, 8}, {64, 1024, 6}};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int E = shapes[s][0], K = shapes[s][1], k = shapes[s][2], Tm = 8;
        float *xa = host_f32((size_t)Tm * K, 1.0f), *xb = host_f32((size_t)Tm * K, 1.0f), *wf, *nf;
        uint16_t *wb = host_bf16((size_t)E * K, 0.05f, &wf), *nb = host_bf16(K, 1.0f, &nf);
        float *d0 = dev_up(xa, (size_t)Tm * K * 4), *d1 = dev_up(xb, (size_t)Tm * K * 4);
        float *da = dev((size_t)Tm * K * 4), *db = dev((size_t)Tm * K * 4), *dz = dev((size_t)Tm * K * 4);
        cr_assert_eq(cudaMemset(dz, 0, (size_t)Tm * K * 4), cudaSuccess);
        float *dsum = dev((size_t)Tm * K * 4), *dout = dev((size_t)Tm * K * 4), *dw = dev((size_t)Tm * k * 4);
        int32_t *di = dev((size_t)Tm * k * 4);
        uint16_t *dwr = dev_up(wb, (size_t)E * K * 2), *dn = dev_up(nb, (size_t)K * 2);
        size_t wsb = msm_cuda_router_ws_bytes(Tm, E);
        void *ws = dev(wsb);
        cr_assert_eq(cudaMemset(ws, 0, wsb), cudaSuccess);
        size_t nk = (size_t)Tm * k, nx = (size_t)Tm * K;
        int32_t *ri = malloc(nk * 4), *gi = malloc(nk * 4);
        float *rw = malloc(nk * 4), *gw = malloc(nk * 4), *rs = malloc(nx * 4), *gs = malloc(nx * 4);
        float *ro = malloc(nx * 4), *go = malloc(nx * 4);
        for (int T = 1; T <= Tm; T++)
            /* the two kernels; one, early router loads; one, after the wait; again; clusters at no token; at
             * up to 8; at up to 8 with the logits by st.async */
            for (int v = 0; v < 7; v++) {
                msm_cuda_tuning t = tune0;
                t.norm_router = true, t.norm_router_max_t = 8;
                t.gemv_early = v != 2;
                if (v == 4) t.router_cluster_max_t = 0;
                if (v >= 5) t.router_cluster_max_t = 8;
                t.router_st_async = v == 6;
                msm_cuda_exec ex = {.stream = st, .tune = &t};
                cr_assert(msm_cuda_norm_router_fits(T, E, K, &t), "fits T=%d E=%d K=%d", T, E, K);
                CK(cudaMemsetAsync(da, 0xff, nx * 4, st));
                CK(cudaMemsetAsync(db, 0xff, nx * 4, st));
                CK(cudaMemsetAsync(dsum, 0xff, nx * 4, st));
                CK(cudaMemsetAsync(dout, 0xff, nx * 4, st));
                CK(cudaMemsetAsync(di, 0xff, nk * 4, st));
                CK(cudaMemsetAsync(dw, 0xff, nk * 4, st));
                CK(msm_cuda_add(da, d0, d1, (size_t)T * K, ex));
                CK(msm_cuda_add(db, d1, dz, (size_t)T * K, ex));
                if (v == 0) {
                    CK(msm_cuda_add_rmsnorm(dsum, dout, da, db, dn, T, K, 1e-6f, ex));
                    CK(msm_cuda_router_linear_topk(di, dw, dout, dwr, T, E, K, k, true, NULL, ws, wsb, ex));
                } else {
                    CK(msm_cuda_norm_router_linear_topk(di, dw, dsum, dout, da, db, dn, 1e-6f, dwr, T, E, K, k, true,
                                                        NULL, ws, wsb, ex));
                }
                CK(cudaStreamSynchronize(st));
                bool r = v == 0;
                down(r ? ri : gi, di, (size_t)T * k * 4), down(r ? rw : gw, dw, (size_t)T * k * 4);
                down(r ? rs : gs, dsum, (size_t)T * K * 4), down(r ? ro : go, dout, (size_t)T * K * 4);
                if (r) continue;
                cr_expect(memcmp(ri, gi, (size_t)T * k * 4) == 0, "ids differ: T=%d E=%d K=%d v=%d", T, E, K, v);
                cr_expect(memcmp(rw, gw, (size_t)T * k * 4) == 0, "weights differ: T=%d E=%d K=%d v=%d", T, E, K, v);
                cr_expect(memcmp(rs, gs, (size_t)T * K * 4) == 0, "sum differs: T=%d E=%d K=%d v=%d", T, E, K, v);
                cr_expect(memcmp(ro, go, (size_t)T * K * 4) == 0, "norm differs: T=%d E=%d K=%d v=%d", T, E, K, v);
            }
        msm_cuda_tuning t = tune0;
        t.norm_router = true, t.norm_router_max_t = 8;
        cr_expect(!msm_cuda_norm_router_fits(9, E, K, &t), "past norm_router_max_t");
        cr_expect(!msm_cuda_norm_router_fits(1, E, K + 4, &t), "K %% 8 != 0");
        t.norm_router = false;
        cr_expect(!msm_cuda_norm_router_fits(1, E, K, &t), "switched off");
        cr_expect_eq(msm_cuda_norm_router_linear_topk(di, dw, dsum, dout, da, db, dn, 1e-6f, dwr, 1, E, K, k, true, NULL,
                                                      ws, wsb, (msm_cuda_exec){.stream = st, .tune = &t}),
                     -EINVAL);
        cudaFree(d0), cudaFree(d1), cudaFree(da), cudaFree(db), cudaFree(dz), cudaFree(dsum), cudaFree(dout);
        cudaFree(dw), cudaFree(di), cudaFree(dwr), cudaFree(dn), cudaFree(ws);
        free(xa), free(xb), free(wf), free(nf), free(wb), free(nb), free(ri), free(gi), free(rw), free(gw);
        free(rs), free(gs), free(ro), free(go);
    }
    msm_cuda_tuning on = tune0;
    on.norm_router = true, on.norm_router_max_t = 8;
    cr_expect(!msm_cuda_norm_router_fits(1, 8, 8192, &on), "K = 8192: no layout (32 values a norm thread)");
    cr_expect(!msm_cuda_norm_router_fits(1, 8, 768, &on), "K < 1024: threads without a first round of loads");
    cudaStreamDestroy(st);
}

Test(cuda_kernels, router_group_topk_matches_cpu, .timeout = 60) {
    need_gpu();
    static const struct { int T, E, k, G, TG, norm; float scale; } shapes[] = {
        {1, 128, 8, 1, 1, 1, 1.0f},   /* GLM-4.5-Air */
        {70, 160, 8, 1, 1, 1, 2.5f},  /* GLM-4.5 */
        {33, 256, 8, 8, 4, 1, 2.5f},  /* DeepSeek-V3 */
        {5, 16, 4, 4, 2, 1, 2.5f},    /* tests/data/glm4moe */
        {130, 64, 6, 32, 5, 0, 1.0f}, /* 32 groups of 2 */
        {9, 30, 3, 5, 2, 1, 1.5f},    /* odd sizes */
        {4, 12, 2, 3, 1, 0, 1.0f},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s].T, E = shapes[s].E, k = shapes[s].k, G = shapes[s].G, TG = shapes[s].TG;
        bool norm = shapes[s].norm;
        float *l = host_f32((size_t)T * E, 1.5f), *bias = host_f32(E, 0.2f);
        if (T > 1) l[E + 3] = l[E + 5] = 4.0f, bias[5] = bias[3]; /* an exact tie: lowest id first */
        int32_t *ids = malloc(T * k * 4), *gids = malloc(T * k * 4);
        float *w = malloc(T * k * 4), *gw = malloc(T * k * 4), *scratch = malloc((2 * E + G) * 4);
        msm_cpu_router_group_topk(ids, w, l, bias, T, E, k, G, TG, norm, shapes[s].scale, scratch);
        float *dl = dev_up(l, (size_t)T * E * 4), *db = dev_up(bias, E * 4), *dw = dev_poison(T * k * 4);
        int32_t *di = dev_poison(T * k * 4);
        CK(msm_cuda_router_group_topk(di, dw, dl, db, T, E, k, G, TG, norm, shapes[s].scale, EX));
        down(gids, di, T * k * 4), down(gw, dw, T * k * 4);
        for (int i = 0; i < T * k; i++) {
            const float *lt = l + (size_t)(i / k) * E;
            cr_assert(gids[i] >= 0 && gids[i] < E, "id out of range");
            float cg = 1.0f / (1.0f + expf(-lt[gids[i]])) + bias[gids[i]];
            float cc = 1.0f / (1.0f + expf(-lt[ids[i]])) + bias[ids[i]];
            cr_assert(gids[i] == ids[i] || fabsf(cg - cc) < 1e-6f, "T=%d E=%d k=%d groups %d/%d: slot %d id %d, cpu %d",
                      T, E, k, TG, G, i, gids[i], ids[i]);
        }
        for (int j = 0; T > 1 && j < k; j++) /* the tied pair, where chosen: in the CPU's order */
            if (ids[k + j] == 3 || ids[k + j] == 5)
                cr_assert_eq(gids[k + j], ids[k + j], "E=%d: the exact tie of experts 3 and 5 is not broken by id", E);
        CHECK_ERR(gw, w, (size_t)T * k, 1e-5, "group router weights T=%d E=%d k=%d", T, E, k);
        cudaFree(dl), cudaFree(db), cudaFree(dw), cudaFree(di);
        free(l), free(bias), free(ids), free(gids), free(w), free(gw), free(scratch);
    }
    /* refused shapes: more than 32 groups, groups of one expert, k beyond the kept groups */
    int32_t *di = dev_poison(64);
    float *dw = dev_poison(64), *dl = dev_poison(4096), *db = dev_poison(1024);
    cr_expect_eq(msm_cuda_router_group_topk(di, dw, dl, db, 1, 128, 4, 64, 8, true, 1.0f, EX), -EINVAL);
    cr_expect_eq(msm_cuda_router_group_topk(di, dw, dl, db, 1, 16, 4, 16, 8, true, 1.0f, EX), -EINVAL);
    cr_expect_eq(msm_cuda_router_group_topk(di, dw, dl, db, 1, 16, 8, 4, 1, true, 1.0f, EX), -EINVAL);
    cudaFree(di), cudaFree(dw), cudaFree(dl), cudaFree(db);
}

/* ---- moe_experts ---- */

/* A case of a weight set: T tokens, the path and kernel variants forced for it (-1: left as
 * they are). */
typedef struct moe_run {
    int T, path, kflags;
} moe_run;

/* Routing for T tokens: k distinct experts each, skewed so some experts get many tokens, and
 * weights in [0.1, 1.1). */
static void random_routing(int32_t *ids, float *w, int T, int k, int E) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do {
                e = rndu() < 0.3f ? rndi(k + 1 < E ? k + 1 : E) : rndi(E);
                dup = false;
                for (int q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
            w[t * k + j] = 0.1f + rndu();
        }
}

/* A random bf16 expert weight set [E, 2I, H] + [E, H, I] on the host (bf16 and float32 copies) and
 * on the device, with the CPU oracle's scratch. */
typedef struct moe_wset {
    float *guf, *dnf, *scratch;
    uint16_t *gub, *dnb, *dgu, *ddn;
} moe_wset;

static moe_wset moe_wset_new(int H, int I, int E) {
    moe_wset m;
    m.gub = host_bf16((size_t)E * 2 * I * H, 1.0f / sqrtf((float)H), &m.guf);
    m.dnb = host_bf16((size_t)E * H * I, 1.0f / sqrtf((float)I), &m.dnf);
    m.dgu = dev_up(m.gub, (size_t)E * 2 * I * H * 2), m.ddn = dev_up(m.dnb, (size_t)E * H * I * 2);
    m.scratch = malloc((size_t)3 * I * 4);
    return m;
}

static void moe_wset_free(moe_wset *m) {
    cudaFree(m->dgu), cudaFree(m->ddn);
    free(m->guf), free(m->gub), free(m->dnf), free(m->dnb), free(m->scratch);
}

/* One weight set (H, I, k, E), then each run: the CUDA result against the CPU's, and a second
 * run's bits against the first's. Routing: distinct experts per token, skewed so some experts
 * get many tokens. */
static void moe_cases(const moe_run *runs, int n, int H, int I, int k, int E, double tol) {
    moe_wset m = moe_wset_new(H, I, E);
    for (int c = 0; c < n; c++) {
        int T = runs[c].T;
        msm_cuda_tuning t = tune0;
        if (runs[c].path >= 0) t.moe_path = runs[c].path;
        if (runs[c].kflags >= 0) t.moe_kernels = runs[c].kflags;
        float *x = host_f32((size_t)T * H, 1.0f);
        int32_t *ids = malloc((size_t)T * k * 4);
        float *w = malloc((size_t)T * k * 4);
        random_routing(ids, w, T, k, E);
        float *ref = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4);
        float *out2 = malloc((size_t)T * H * 4);
        msm_cpu_moe_experts(ref, x, ids, w, m.guf, m.dnf, T, H, I, k, m.scratch);
        float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4);
        int32_t *di = dev_up(ids, (size_t)T * k * 4);
        float *dy = dev_poison((size_t)T * H * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
        void *ws = dev_poison(wsb);
        CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
        down(out, dy, (size_t)T * H * 4);
        CHECK_ERR(out, ref, (size_t)T * H, tol, "moe T=%d H=%d I=%d k=%d E=%d path=%d kernels=%d", T,
                  H, I, k, E, runs[c].path, runs[c].kflags);
        cudaMemset(dy, 0xff, (size_t)T * H * 4);
        CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
        down(out2, dy, (size_t)T * H * 4);
        cr_assert(memcmp(out, out2, (size_t)T * H * 4) == 0,
                  "moe not deterministic T=%d H=%d path=%d kernels=%d", T, H, runs[c].path, runs[c].kflags);
        cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(dy), cudaFree(ws);
        free(x), free(ids), free(w), free(ref), free(out), free(out2);
    }
    moe_wset_free(&m);
}

/* One T on `path` (AUTO: chosen by T) with the default kernels. */
static void moe_case_on(int path, int T, int H, int I, int k, int E, double tol) {
    moe_run r = {T, path, -1};
    moe_cases(&r, 1, H, I, k, E, tol);
}

static void moe_case(int T, int H, int I, int k, int E, double tol) {
    moe_case_on(MSM_CUDA_MOE_PATH_AUTO, T, H, I, k, E, tol);
}

Test(cuda_kernels, moe_experts_gemv_small_T_matches_cpu, .timeout = 60) {
    need_gpu();
    moe_case(1, 2048, 1408, 4, 16, 2e-5);  /* Qwen1.5-MoE expert shapes, decode */
    moe_case(3, 256, 96, 4, 8, 2e-5);
    moe_case(8, 200, 72, 2, 5, 2e-5);
    moe_case(5, 130, 33, 3, 7, 2e-5);      /* odd sizes: scalar loads */
    moe_case(9, 130, 40, 2, 6, 2e-5);      /* odd sizes, grouped: scalar loads */
}

Test(cuda_kernels, moe_experts_grouped_gemv_matches_cpu, .timeout = 120) {
    need_gpu();
    /* the default path for 4 < T <= 64, and forced at other T (GEMV tolerance) */
    moe_case(16, 2048, 1408, 4, 60, 2e-5); /* Qwen1.5-MoE shapes (the tiled GEMMs by default) */
    moe_case(32, 2048, 1408, 4, 60, 2e-5);
    moe_case(11, 2048, 1408, 4, 60, 2e-5); /* the last size the grouped GEMVs take by default */
    moe_case(64, 256, 128, 4, 16, 2e-5);   /* skewed: some experts get > 8 tokens (several passes) */
    moe_case(9, 130, 40, 2, 6, 2e-5);      /* odd sizes: scalar loads */
    enum { GG = MSM_CUDA_MOE_PATH_GROUPED_GEMV };
    moe_case_on(GG, 1, 2048, 1408, 4, 16, 2e-5);
    moe_case_on(GG, 16, 2048, 1408, 4, 60, 2e-5);
    moe_case_on(GG, 31, 2048, 1408, 4, 60, 2e-5);
    moe_case_on(GG, 8, 200, 72, 2, 5, 2e-5);
    moe_case_on(GG, 100, 256, 128, 4, 16, 2e-5);
    moe_case_on(GG, 5, 130, 33, 3, 7, 2e-5);
    moe_case_on(MSM_CUDA_MOE_PATH_PAIR, 32, 256, 128, 4, 16, 2e-5);
}

Test(cuda_kernels, moe_experts_grouped_large_T_matches_cpu, .timeout = 60) {
    need_gpu();
    moe_case(9, 256, 128, 4, 16, 2e-2);
    moe_case(70, 256, 128, 4, 16, 2e-2);
    moe_case(130, 512, 96, 8, 32, 2e-2);
    moe_case(200, 1024, 352, 4, 60, 2e-2);
}

Test(cuda_kernels, moe_experts_variants_match_cpu, .timeout = 240) {
    need_gpu();
    enum { A = MSM_CUDA_MOE_PATH_AUTO, PR = MSM_CUDA_MOE_PATH_PAIR, GG = MSM_CUDA_MOE_PATH_GROUPED_GEMV,
           TL = MSM_CUDA_MOE_PATH_TILED };
    enum { SIMT = MSM_CUDA_MOE_K_SIMT, MMA = MSM_CUDA_MOE_K_MMA, NP = MSM_CUDA_MOE_K_NO_PREFETCH,
           NT4 = MSM_CUDA_MOE_K_NT4 };
    /* Qwen1.5-MoE shapes: every default (pair at T <= 4, grouped SIMT GEMVs below 12 tokens, tiled
     * GEMMs from 12, 16 tokens a pass at first) and each variant (the grouped tensor-core GEMVs
     * forced from 48 tokens) */
    static const moe_run qwen[] = {{1, A, 0},     {4, A, 0},    {5, A, 0},    {8, A, 0},
                                   {16, A, 0},    {32, A, 0},   {48, A, 0},   {64, A, 0},   {48, GG, 0},  {64, GG, 0},
                                   {64, GG, NP},  {64, GG, SIMT}, {32, A, MMA}, {8, GG, MMA},
                                   {1, GG, MMA},  {1, GG, 0},   {8, PR, 0},   {32, PR, 0},
                                   {64, GG, NT4}, {256, GG, 0}, {256, GG, NT4}, {130, GG, NT4},
                                   {65, A, 0},    {128, A, 0},  {256, A, 0},  {1, TL, 0},
                                   {5, TL, 0},    {33, TL, 0},  {512, A, 0}};
    moe_cases(qwen, sizeof qwen / sizeof *qwen, 2048, 1408, 4, 60, 2e-5);
    /* odd sizes for the tensor-core GEMVs: H % 32 == 8 (a partial K chunk in gate/up),
     * H % 16 == 8 (down rows past H), I % 32 == 24 (a partial K chunk in down) */
    static const moe_run odd[] = {{1, GG, MMA}, {5, GG, MMA}, {50, A, 0}, {24, A, 0}, {3, GG, 0}};
    moe_cases(odd, sizeof odd / sizeof *odd, 200, 88, 4, 12, 2e-5);
    /* I % 8 != 0: tensor-core gate/up (columns past I), SIMT down; k = 8 */
    static const moe_run odd2[] = {{2, A, 0}, {30, A, 0}, {20, GG, MMA}, {3, PR, 0}};
    moe_cases(odd2, sizeof odd2 / sizeof *odd2, 264, 100, 8, 24, 2e-5);
    /* k = 1 */
    static const moe_run k1[] = {{1, A, 0}, {7, A, 0}, {40, A, 0}, {40, PR, 0}, {60, A, 0}};
    moe_cases(k1, sizeof k1 / sizeof *k1, 512, 256, 1, 8, 2e-5);
    /* many tokens an expert: several 16-token passes (grouped GEMVs), several 64-token passes
     * (tiled GEMMs: 200 x 2 pairs over 3 experts) */
    static const moe_run skew[] = {{64, A, 0},  {64, GG, SIMT}, {48, GG, NP}, {12, GG, MMA},
                                   {12, A, 0},  {64, GG, NT4},  {40, GG, MMA | NT4},
                                   {100, A, 0}, {200, TL, 0},  {37, TL, 0}};
    moe_cases(skew, sizeof skew / sizeof *skew, 256, 128, 2, 3, 2e-5);
}

/* The grouped SIMT expert GEMVs give the same bits whether they find their pairs themselves (no
 * grouping kernel: rows in pair order) or after the grouping kernel, with 2 or 4 tokens a pass in
 * either kernel, 2 to 4 K chunks in flight, the down's first weight loads before or after its PDL
 * wait (launched right behind the gate/up, which writes its input), a grid row per selected expert
 * or per expert, and on persistent grids (either kernel or both; not with a row per expert, where
 * the block-an-item grid runs); each against the CPU. Qwen1.5-MoE shapes at
 * 5-32 tokens, odd sizes (scalar loads), k = 8 (a partial down block: H % 16 == 8), I % 8 == 4 (a
 * partial gate/up block), and many tokens an expert (several passes); past
 * MSM_CUDA_MOE_SCAN_MAX_P pairs the grouping kernel runs anyway. */
typedef struct gg_variant {
    int scan_max_t, gu_nt, dn_nt, dn_u;
    bool early, compact;
    int gu_u;   /* the gate/up's chunks in flight */
    int persist; /* MSM_CUDA_MOE_PERSIST_* */
} gg_variant;

static void gg_cases(const int *Ts, int nT, int H, int I, int k, int E) {
    static const gg_variant vs[] = {
        {64, 4, 4, 2, true, true, 2, 0}, {0, 4, 4, 2, true, true, 2, 0}, {64, 4, 4, 2, false, true, 2, 0},
        {64, 2, 2, 2, true, true, 2, 0}, {64, 4, 4, 3, true, true, 2, 0}, {64, 2, 2, 3, false, true, 2, 0},
        {0, 2, 2, 3, true, true, 2, 0}, {0, 4, 2, 3, false, true, 2, 0}, {64, 4, 2, 2, true, true, 2, 0},
        {0, 4, 2, 2, true, false, 2, 0}, {0, 4, 4, 3, false, false, 2, 0}, {0, 4, 2, 2, true, true, 3, 0},
        {0, 4, 2, 2, true, true, 4, 0}, {64, 2, 2, 2, true, true, 4, 0}, {0, 4, 2, 2, true, true, 2, 3},
        {0, 4, 2, 2, false, true, 2, 3}, {0, 2, 4, 3, true, true, 3, 1}, {0, 4, 2, 2, true, true, 4, 2},
        {0, 4, 2, 2, true, false, 2, 3}};
    moe_wset m = moe_wset_new(H, I, E);
    for (int c = 0; c < nT; c++) {
        int T = Ts[c];
        float *x = host_f32((size_t)T * H, 1.0f);
        int32_t *ids = malloc((size_t)T * k * 4);
        float *w = malloc((size_t)T * k * 4);
        random_routing(ids, w, T, k, E);
        float *ref = malloc((size_t)T * H * 4), *first = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4);
        msm_cpu_moe_experts(ref, x, ids, w, m.guf, m.dnf, T, H, I, k, m.scratch);
        float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4);
        int32_t *di = dev_up(ids, (size_t)T * k * 4);
        float *dy = dev_poison((size_t)T * H * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
        void *ws = dev_poison(wsb);
        for (size_t v = 0; v < sizeof vs / sizeof *vs; v++) {
            msm_cuda_tuning t = tune0;
            t.moe_path = MSM_CUDA_MOE_PATH_GROUPED_GEMV, t.moe_kernels = MSM_CUDA_MOE_K_SIMT;
            t.moe_group_scan_max_t = vs[v].scan_max_t, t.moe_gg_early = vs[v].early, t.moe_gg_compact = vs[v].compact;
            t.moe_gg_gateup_nt = vs[v].gu_nt, t.moe_gg_down_nt = vs[v].dn_nt, t.moe_gg_down_u = vs[v].dn_u;
            t.moe_gg_gateup_u = vs[v].gu_u, t.moe_gg_persist = vs[v].persist;
            cudaMemset(dy, 0xff, (size_t)T * H * 4);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(v ? out : first, dy, (size_t)T * H * 4);
            if (!v)
                CHECK_ERR(first, ref, (size_t)T * H, 2e-5, "grouped SIMT T=%d H=%d I=%d k=%d E=%d", T, H, I, k, E);
            else
                cr_expect(memcmp(first, out, (size_t)T * H * 4) == 0,
                          "grouped SIMT T=%d H=%d I=%d k=%d: variant %zu (scan %d, nt %d/%d, u %d, early %d, "
                          "compact %d, gate/up u %d, persist %d) not the default's bits",
                          T, H, I, k, v, vs[v].scan_max_t, vs[v].gu_nt, vs[v].dn_nt, vs[v].dn_u, (int)vs[v].early,
                          (int)vs[v].compact, vs[v].gu_u, vs[v].persist);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(dy), cudaFree(ws);
        free(x), free(ids), free(w), free(ref), free(first), free(out);
    }
    moe_wset_free(&m);
}

Test(cuda_kernels, moe_grouped_simt_variants_same_bits, .timeout = 240) {
    need_gpu();
    static const int qwen[] = {5, 8, 11, 32};
    gg_cases(qwen, 4, 2048, 1408, 4, 60);
    static const int odd[] = {9, 3};
    gg_cases(odd, 2, 130, 40, 2, 6);    /* scalar loads */
    static const int k8[] = {30, 64, 70}; /* 240 / 512 pairs scanned, 560 grouped */
    gg_cases(k8, 3, 264, 104, 8, 24);
    static const int skew[] = {12, 64};   /* 24 / 128 pairs over 3 experts: several passes */
    gg_cases(skew, 2, 256, 128, 2, 3);
    static const int i4[] = {7, 20};      /* I % 8 == 4: a last gate/up block of 4 columns */
    gg_cases(i4, 2, 264, 100, 4, 12);
}

/* The bf16 tiled expert GEMMs with 16 or 32 tokens a pass (deeper pipelines) and the auto rule give
 * the 64-token kernels' bits: each output is the same sequence of MMAs whatever pass holds its token.
 * Qwen1.5-MoE shapes at 33-256 tokens, and 200 x 2 pairs over 3 experts (many passes of each size). */
Test(cuda_kernels, moe_tiled_pass_sizes_are_bitwise_equal, .timeout = 120) {
    need_gpu();
    static const int shapes[][5] = {{2048, 1408, 4, 60, 33}, {2048, 1408, 4, 60, 64}, {2048, 1408, 4, 60, 128},
                                    {2048, 1408, 4, 60, 256}, {256, 128, 2, 3, 200}, {256, 128, 2, 3, 37}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3], T = shapes[s][4];
        moe_wset m = moe_wset_new(H, I, E);
        float *x = host_f32((size_t)T * H, 1.0f), *w = malloc((size_t)T * k * 4);
        int32_t *ids = malloc((size_t)T * k * 4);
        random_routing(ids, w, T, k, E);
        float *ref = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4), *base = malloc((size_t)T * H * 4);
        msm_cpu_moe_experts(ref, x, ids, w, m.guf, m.dnf, T, H, I, k, m.scratch);
        float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4), *dy = dev_poison((size_t)T * H * 4);
        int32_t *di = dev_up(ids, (size_t)T * k * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
        void *ws = dev_poison(wsb);
        static const int bms[] = {64, 32, 16, 0};
        for (int b = 0; b < 4; b++) {
            msm_cuda_tuning t = tune0;
            t.moe_path = MSM_CUDA_MOE_PATH_TILED;
            t.moe_tiled_bm = bms[b];
            cudaMemset(dy, 0xff, (size_t)T * H * 4);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(b ? out : base, dy, (size_t)T * H * 4);
            if (b == 0)
                CHECK_ERR(base, ref, (size_t)T * H, 2e-5, "tiled T=%d H=%d I=%d k=%d E=%d", T, H, I, k, E);
            else
                cr_assert(memcmp(out, base, (size_t)T * H * 4) == 0, "tiled T=%d H=%d E=%d: %d tokens a pass differ from 64",
                          T, H, E, bms[b]);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(dy), cudaFree(ws);
        free(x), free(w), free(ids), free(ref), free(out), free(base);
        moe_wset_free(&m);
    }
}

/* The pair path's bf16 down GEMV with a token's experts over warps (MSM_CUDA_MOE_K_DOWN_SPLIT; the
 * default from k = 4), at 2 and 4 rows a warp (msm_cuda_tuning.moe_down_hb), is bitwise the
 * one-warp-a-row kernel (MSM_CUDA_MOE_K_DOWN_WARP), and the gate/up at 2 loads a row
 * (moe_gu_u2) the 4-load one: Qwen3-30B-A3B and Qwen1.5-MoE expert shapes, k = 1, 4, 8, I
 * not a multiple of 8 (scalar loads), H odd (a block's second row past H), T = 1..4; and against
 * the CPU. (Its FP8 form: runs "DS" of moe_experts_fp8_match_cpu.) Also the pair path without the
 * software pipelining of its bf16 rows (msm_cuda_tuning.rows_pipe off: gate/up rows of H > 1024 and
 * down rows of I > 512 at k <= 4 are several steps of loads) gives the same bits. */
Test(cuda_kernels, moe_down_split_equals_the_pair_kernel, .timeout = 120) {
    need_gpu();
    static const int shapes[][4] = {{2048, 768, 8, 16}, {2048, 1408, 4, 12}, {512, 256, 1, 8},
                                    {264, 100, 8, 24},  {201, 88, 4, 12}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3];
        moe_wset m = moe_wset_new(H, I, E);
        for (int T = 1; T <= 4; T++) {
            float *x = host_f32((size_t)T * H, 1.0f), *w = malloc((size_t)T * k * 4);
            int32_t *ids = malloc((size_t)T * k * 4);
            random_routing(ids, w, T, k, E);
            if (T == 3) ids[1] = -1; /* an invalid slot: skipped by both */
            float *ref = malloc((size_t)T * H * 4), *o1 = malloc((size_t)T * H * 4), *o2 = malloc((size_t)T * H * 4);
            float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4), *dy = dev_poison((size_t)T * H * 4);
            int32_t *di = dev_up(ids, (size_t)T * k * 4);
            size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
            void *ws = dev_poison(wsb);
            msm_cuda_tuning t = tune0;
            t.moe_path = MSM_CUDA_MOE_PATH_PAIR;
            t.moe_kernels = MSM_CUDA_MOE_K_DOWN_WARP;
            t.moe_gu_u2 = MSM_CUDA_MOE_GU_U2_OFF, t.moe_down_hb = 2;
            t.rows_pipe = MSM_CUDA_PIPE_MOE_GU | MSM_CUDA_PIPE_MOE_DOWN; /* off by default: tested here */
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(o1, dy, (size_t)T * H * 4);
            t.moe_kernels = MSM_CUDA_MOE_K_DOWN_SPLIT;
            cr_assert_eq(cudaMemset(dy, 0xff, (size_t)T * H * 4), cudaSuccess);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(o2, dy, (size_t)T * H * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * H * 4) == 0, "down split differs: T=%d H=%d I=%d k=%d", T, H, I, k);
            /* four rows a warp (msm_cuda_tuning.moe_down_hb): the same bits */
            t.moe_down_hb = 4;
            cr_assert_eq(cudaMemset(dy, 0xff, (size_t)T * H * 4), cudaSuccess);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(o2, dy, (size_t)T * H * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * H * 4) == 0, "down split, 4 rows a warp, differs: T=%d H=%d I=%d k=%d",
                      T, H, I, k);
            t.moe_down_hb = 0; /* the default: 4 rows for bf16 */
            /* one step of loads at a time (msm_cuda_tuning.rows_pipe off): the same bits */
            t.moe_kernels = MSM_CUDA_MOE_K_DOWN_WARP;
            t.rows_pipe = 0;
            cr_assert_eq(cudaMemset(dy, 0xff, (size_t)T * H * 4), cudaSuccess);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(o2, dy, (size_t)T * H * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * H * 4) == 0, "pipelined rows differ: T=%d H=%d I=%d k=%d", T, H, I, k);
            /* the gate/up at 2 loads a lane a row, 12 blocks an SM (msm_cuda_tuning.moe_gu_u2): the same bits */
            t.moe_gu_u2 = MSM_CUDA_MOE_GU_U2_ON;
            cr_assert_eq(cudaMemset(dy, 0xff, (size_t)T * H * 4), cudaSuccess);
            CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, EX_T(&t)));
            down(o2, dy, (size_t)T * H * 4);
            cr_expect(memcmp(o1, o2, (size_t)T * H * 4) == 0, "gate/up U 2 differs: T=%d H=%d I=%d k=%d", T, H, I, k);
            t.moe_gu_u2 = MSM_CUDA_MOE_GU_U2_OFF;
            if (T != 3) {
                msm_cpu_moe_experts(ref, x, ids, w, m.guf, m.dnf, T, H, I, k, m.scratch);
                CHECK_ERR(o2, ref, (size_t)T * H, 2e-5, "down split vs cpu T=%d H=%d I=%d k=%d", T, H, I, k);
            }
            cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(di), cudaFree(ws);
            free(x), free(w), free(ids), free(ref), free(o1), free(o2);
        }
        moe_wset_free(&m);
    }
}

/* ---- FP8-resident weights (docs/adr/0006-fp8.md) ---- */

/* A random FP8 weight [E, rows, cols] of column phase ph on the host and the device: codes (NaN
 * codes only with nan), per-row scales ~ 1 / (448 sqrt(cols)), its float32 value f32(q) * scale
 * (the CPU oracle's weight) and that rounded to bf16 (what the dequantising path multiplies by). */
typedef struct fp8_weight {
    uint8_t *q;
    float *sc, *f, *fb;
    size_t n, ns;
    msm_cuda_fp8w d;
} fp8_weight;

static fp8_weight fp8_make(int E, int rows, int cols, int ph, bool nan) {
    fp8_weight w = {0};
    w.n = (size_t)E * rows * cols;
    w.ns = msm_cuda_fp8_scales(E, rows, cols, ph);
    size_t ncs = (size_t)(cols + ph + 127) / 128;
    w.q = malloc(w.n + 1), w.sc = malloc(w.ns * 4 + 4), w.f = malloc(w.n * 4 + 4), w.fb = malloc(w.n * 4 + 4);
    cr_assert(w.q && w.sc && w.f && w.fb);
    for (size_t i = 0; i < w.ns; i++) w.sc[i] = (0.5f + rndu()) / (448.0f * sqrtf((float)cols)) * 8.0f;
    for (size_t i = 0; i < w.n; i++) {
        uint8_t q = (uint8_t)(rnd64() & 0xff);
        if (!nan && (q & 0x7f) == 0x7f) q ^= 1; /* no NaN codes */
        w.q[i] = q;
        size_t r = i / (size_t)cols, c = i % (size_t)cols;
        w.f[i] = msm_f8e4m3_to_f32(q) * w.sc[r * ncs + (c + (size_t)ph) / 128];
        w.fb[i] = msm_bf16_to_f32(msm_f32_to_bf16(w.f[i]));
    }
    w.d = (msm_cuda_fp8w){.q = dev_up(w.q, w.n), .scale = dev_up(w.sc, w.ns * 4), .phase = ph};
    return w;
}

static void fp8_free(fp8_weight *w) {
    cudaFree((void *)w->d.q), cudaFree((void *)w->d.scale);
    free(w->q), free(w->sc), free(w->f), free(w->fb);
}

/* A shape's routed-expert weights, bf16 (m) or FP8-resident (gu, dn), for the tests that run the
 * router before the experts. */
typedef struct moe_weights {
    bool fp8;
    moe_wset m;
    fp8_weight gu, dn;
} moe_weights;

static moe_weights moe_weights_new(int H, int I, int E, bool fp8) {
    moe_weights w = {.fp8 = fp8};
    if (fp8)
        w.gu = fp8_make(E, 2 * I, H, 0, false), w.dn = fp8_make(E, H, I, 0, false);
    else
        w.m = moe_wset_new(H, I, E);
    return w;
}

static void moe_weights_free(moe_weights *w) {
    if (w->fp8)
        fp8_free(&w->gu), fp8_free(&w->dn);
    else
        moe_wset_free(&w->m);
}

/* One FP8 linear against the CPU linear on the float32 weights (FP8 GEMV) or on them rounded to
 * bf16 (the dequantising path, bf16 = true). */
static void linear_fp8_case(msm_cuda_ctx *ctx, msm_cuda_exec ex, int T, int N, int K, int ph, bool bias, bool bf16,
                            double tol) {
    fp8_weight w = fp8_make(1, N, K, ph, false);
    float *x = host_f32((size_t)T * K, 1.0f), *bf = NULL;
    uint16_t *bb = bias ? host_bf16(N, 0.5f, &bf) : NULL;
    float *ref = malloc((size_t)T * N * 4), *out = malloc((size_t)T * N * 4);
    msm_cpu_linear(ref, x, bf16 ? w.fb : w.f, bf, T, N, K);
    float *dx = dev_up(x, (size_t)T * K * 4), *dy = dev_poison((size_t)T * N * 4);
    uint16_t *db = bias ? dev_up(bb, N * 2) : NULL;
    size_t wsb = msm_cuda_linear_ws_bytes(T, N, K), dqb = msm_cuda_linear_fp8_deq_bytes(N, K);
    void *ws = wsb ? dev(wsb) : NULL;
    uint16_t *dq = dev_poison(dqb);
    CK(msm_cuda_linear_fp8(dy, dx, w.d, db, T, N, K, ctx, ws, wsb, dq, dqb, ex));
    down(out, dy, (size_t)T * N * 4);
    CHECK_ERR(out, ref, (size_t)T * N, tol, "fp8 linear T=%d N=%d K=%d phase=%d bias=%d", T, N, K, ph, bias);
    /* the same call again: the same bits */
    float *out2 = malloc((size_t)T * N * 4);
    cudaMemset(dy, 0xff, (size_t)T * N * 4);
    CK(msm_cuda_linear_fp8(dy, dx, w.d, db, T, N, K, ctx, ws, wsb, dq, dqb, ex));
    down(out2, dy, (size_t)T * N * 4);
    cr_assert(memcmp(out, out2, (size_t)T * N * 4) == 0, "fp8 linear not deterministic T=%d N=%d K=%d", T, N, K);
    cudaFree(dx), cudaFree(dy), cudaFree(db), cudaFree(ws), cudaFree(dq);
    fp8_free(&w);
    free(x), free(bf), free(bb), free(ref), free(out), free(out2);
}

/* The FP8 linears on the float32 weights (fp32 tolerance): the tensor-core MMV8 and the SIMT GEMV
 * at every token-chunk size, phases 0, 16, 64 and 112 (scale columns straddling the weight's
 * 128-column groups), N <= 256, bias; then past fp8_native_max_t the dequantised weight on the
 * bf16 paths. */
Test(cuda_kernels, linear_fp8_matches_cpu, .timeout = 120) {
    need_gpu();
    msm_cuda_ctx *ctx = NULL;
    CK(msm_cuda_ctx_new(&ctx));
    static const int shapes[][5] = {{1, 2048, 2048, 0, 0}, {1, 300, 192, 64, 1},  {2, 129, 256, 16, 0},
                                    {3, 1000, 1408, 0, 1}, {5, 257, 768, 112, 0}, {8, 2048, 2048, 0, 1},
                                    {9, 60, 2048, 0, 0},   {16, 4096, 512, 64, 1}, {33, 777, 1024, 0, 0},
                                    {64, 2048, 2048, 0, 0}, {1, 151936, 256, 0, 0}, {1, 1000, 8192, 64, 1}};
    /* the default (the tensor-core MMV8 where K and the phase are multiples of 64, else the SIMT
     * GEMV with the hardware decode; 8192 codes at one token: two rounds of its loads), then the
     * SIMT GEMV forced, with the integer decode and with the hardware one */
    for (int kern = 0; kern < 4; kern++) {
        msm_cuda_tuning tk = tune0;
        tk.fp8_linear = kern < 3 ? kern : MSM_CUDA_FP8_LINEAR_MMA;
        tk.fp8_gemv_hw = kern == 0; /* the SIMT GEMV: the default (hardware) decode, then the integer one */
        tk.fp8_linear_tiled_min_t = 65; /* these kernels past 8 tokens too (the tiled GEMM: below) */
        if (kern == 3) tk.fp8_mma_min_t = 1; /* the MMV8 at every T */
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            linear_fp8_case(ctx, EX_T(&tk), shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                            false, 2e-5);
    }
    /* MMV8 at every token-tile count and K-slice count, partial row blocks, a long K (K slices
     * forced up by the shared memory) */
    static const int mma[][4] = {{1, 128, 64, 0},   {7, 129, 192, 64}, {8, 1000, 4096, 0}, {12, 300, 2048, 0},
                                 {17, 2048, 768, 0}, {31, 100, 1408, 64}, {40, 513, 2048, 0}, {64, 2048, 8192, 0}};
    msm_cuda_tuning tm = tune0;
    tm.fp8_mma_min_t = 1;
    tm.fp8_linear_tiled_min_t = 65; /* the MMV8 past 8 tokens too */
    for (size_t s = 0; s < sizeof mma / sizeof *mma; s++) {
        tm.mmv_slots = 1 + (int)(s % 3); /* other K-slice counts for the same shapes */
        linear_fp8_case(ctx, EX_T(&tm), mma[s][0], mma[s][1], mma[s][2], mma[s][3], s % 2, false, 2e-5);
    }
    /* past the FP8 GEMVs: dequantised to bf16, the tiled linear (near-fp32) at 9..64 tokens,
     * cuBLASLt's hi + lo from 65, a K the FP8 GEMV cannot take (K % 16 != 0) at any T */
    msm_cuda_tuning t = tune0;
    t.fp8_native_max_t = 4;
    linear_fp8_case(ctx, EX_T(&t), 32, 2048, 2048, 0, 1, true, 2e-5);
    linear_fp8_case(ctx, EX_T(&t), 100, 1000, 1024, 64, 0, true, 5e-5);
    linear_fp8_case(ctx, EX, 100, 1000, 1024, 0, 1, true, 5e-5);
    linear_fp8_case(ctx, EX, 2, 300, 200, 0, 0, true, 2e-5);
    /* the tiled GEMM on the codes (linear_tiled_fp8.cu, float32 weights) from fp8_linear_tiled_min_t
     * to 64 tokens: passes of 16 / 32 / 64 tokens with partial token tiles, K slices of unequal
     * length (832 = 13 steps over 2 slices), 1..8 slices, a partial row block, phase 64, bias; and
     * forced from 5 tokens */
    static const int tl[][5] = {{9, 5120, 2048, 0, 1},  {12, 2048, 4096, 64, 0}, {16, 300, 832, 0, 1},
                                {17, 2048, 2048, 0, 0}, {31, 777, 1024, 64, 1},  {33, 4096, 1408, 0, 0},
                                {64, 2048, 4096, 0, 1}, {40, 129, 256, 0, 0}};
    for (size_t s = 0; s < sizeof tl / sizeof *tl; s++)
        linear_fp8_case(ctx, EX, tl[s][0], tl[s][1], tl[s][2], tl[s][3], tl[s][4], false, 2e-5);
    msm_cuda_tuning tt = tune0;
    tt.fp8_linear_tiled_min_t = 1;
    linear_fp8_case(ctx, EX_T(&tt), 5, 1000, 2048, 0, 1, false, 2e-5);
    /* decode steps' rule (fp8_linear_max_t 8) with the tiled GEMM off: the MMV8 (float32 weights) up
     * to 8 tokens, the weight dequantised past them; with it on, the tiled GEMM first */
    msm_cuda_tuning td = tune0;
    td.fp8_linear_max_t = MSM_CUDA_FP8_LINEAR_DECODE_MAX_T;
    td.fp8_linear_tiled_min_t = 65;
    linear_fp8_case(ctx, EX_T(&td), 8, 5120, 2048, 0, 1, false, 2e-5);
    linear_fp8_case(ctx, EX_T(&td), 9, 2048, 4096, 64, 0, true, 2e-5);
    linear_fp8_case(ctx, EX_T(&td), 32, 5120, 2048, 0, 0, true, 2e-5);
    td.fp8_linear_tiled_min_t = MSM_CUDA_FP8_LINEAR_TILED_MIN_T;
    linear_fp8_case(ctx, EX_T(&td), 32, 5120, 2048, 0, 0, false, 2e-5);
    linear_fp8_case(ctx, EX_T(&td), 5, 5120, 2048, 0, 1, false, 2e-5); /* the default's first T */
    linear_fp8_case(ctx, EX_T(&td), 8, 4096, 1408, 64, 0, false, 2e-5);
    /* the SIMT GEMV at 1, 2 and 4 rows a warp and by the default rule (fp8_gemv_rows 0: 2 at one
     * token, else 4): the same bits */
    static const int rs[][3] = {{1, 2048, 4096}, {2, 5120, 2048}, {3, 300, 1408}, {8, 129, 256}};
    static const int rows[4] = {1, 2, 4, 0};
    for (size_t s = 0; s < sizeof rs / sizeof *rs; s++) {
        int T = rs[s][0], N = rs[s][1], K = rs[s][2];
        fp8_weight w = fp8_make(1, N, K, 0, false);
        float *x = host_f32((size_t)T * K, 1.0f), *o[4];
        float *dx = dev_up(x, (size_t)T * K * 4), *dy = dev((size_t)T * N * 4);
        for (int i = 0; i < 4; i++) {
            msm_cuda_tuning tr = tune0;
            tr.fp8_linear = MSM_CUDA_FP8_LINEAR_SIMT;
            tr.fp8_gemv_rows = rows[i];
            o[i] = malloc((size_t)T * N * 4);
            CK(msm_cuda_linear_fp8(dy, dx, w.d, NULL, T, N, K, ctx, NULL, 0, NULL, 0, EX_T(&tr)));
            down(o[i], dy, (size_t)T * N * 4);
        }
        for (int i = 0; i < 3; i++)
            cr_expect(memcmp(o[i], o[3], (size_t)T * N * 4) == 0, "fp8 GEMV at %d rows a warp vs the default: T=%d N=%d K=%d",
                      rows[i], T, N, K);
        cudaFree(dx), cudaFree(dy);
        fp8_free(&w);
        for (int i = 0; i < 4; i++) free(o[i]);
        free(x);
    }
    /* the dequantised copy on the GEMV and the MMV: written by the kernel just before, so loaded
     * only after the PDL wait (msm_cuda_exec.w_written), early loads on or not */
    t.fp8_native_max_t = 0;
    for (int e = 0; e < 2; e++) {
        t.gemv_early = e;
        linear_fp8_case(ctx, EX_T(&t), 1, 2048, 2048, 0, 1, true, 2e-5);
        linear_fp8_case(ctx, EX_T(&t), 6, 6144, 2048, 0, 0, true, 2e-5);
    }
    msm_cuda_ctx_free(ctx);
}

/* First weight loads before the PDL wait (gemv_early): the dense GEMV (1..4 tokens) and MMV (5..8),
 * bf16 and FP8, give the bits of the kernels that wait first, and read the x that the kernel just
 * before them writes (an RMSNorm into a buffer poisoned just before it on the same stream, so an x
 * read ahead of the wait would show); on the CPU's product as well. The bf16 GEMV without its rows'
 * software pipelining (msm_cuda_tuning.rows_pipe off; K = 2048 and 5632 are several steps of loads)
 * gives the same bits too. */
Test(cuda_kernels, linear_early_weight_loads_same_bits, .timeout = 120) {
    need_gpu();
    static const int shapes[][2] = {{2048, 2048}, {6144, 2048}, {2048, 5632}, {300, 1408}, {37984, 256}, {2048, 4096}};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int N = shapes[s][0], K = shapes[s][1], Tm = 8;
        float *x = host_f32((size_t)Tm * K, 1.0f), *wf, *nf, *xn = malloc((size_t)Tm * K * 4);
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *nb = host_bf16(K, 1.0f, &nf);
        msm_cpu_rmsnorm(xn, x, nf, Tm, K, 1e-6f);
        fp8_weight w8 = fp8_make(1, N, K, 0, false);
        float *dx = dev_up(x, (size_t)Tm * K * 4), *dxn = dev((size_t)Tm * K * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *dn = dev_up(nb, (size_t)K * 2);
        float *dy = dev((size_t)Tm * N * 4), *o[7], *ref = malloc((size_t)Tm * N * 4);
        for (int e = 0; e < 7; e++) o[e] = malloc((size_t)Tm * N * 4);
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int T = 1; T <= Tm; T++) {
                msm_cpu_linear(ref, xn, fp8 ? w8.f : wf, NULL, T, N, K);
                /* after the wait; early; early with FP8's 8 loads a lane a row; early, one step of
                 * loads at a time (no software pipelining of bf16 rows, msm_cuda_tuning.rows_pipe);
                 * early, a 4096-wide bf16 row in one step at one token (gemv_u16); early, a 2048-
                 * or 1408-wide one in one step (gemv_u8); early, compiled for 12 blocks an SM
                 * (gemv_minb) */
                for (int e = 0; e < 7; e++) {
                    msm_cuda_tuning t = tune0;
                    t.gemv_early = e > 0;
                    t.fp8_gemv_u8 = e == 2;
                    if (e == 3) t.rows_pipe = 0;
                    t.gemv_u16 = e == 4;
                    t.gemv_u8 = e == 5;
                    t.gemv_minb = e == 6 ? MSM_CUDA_MINB_GEMV : 0;
                    t.fp8_linear = MSM_CUDA_FP8_LINEAR_SIMT; /* the GEMV at every T (the MMV8 waits first) */
                    msm_cuda_exec ex = {.stream = st, .tune = &t};
                    CK(cudaMemsetAsync(dxn, 0xff, (size_t)Tm * K * 4, st));
                    CK(msm_cuda_rmsnorm(dxn, dx, dn, T, K, 1e-6f, ex));
                    if (fp8)
                        CK(msm_cuda_linear_fp8(dy, dxn, w8.d, NULL, T, N, K, NULL, NULL, 0, NULL, 0, ex));
                    else
                        CK(msm_cuda_linear(dy, dxn, dw, NULL, T, N, K, NULL, NULL, 0, ex));
                    CK(cudaStreamSynchronize(st));
                    down(o[e], dy, (size_t)T * N * 4);
                }
                cr_expect(memcmp(o[0], o[1], (size_t)T * N * 4) == 0, "early loads change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                cr_expect(memcmp(o[0], o[2], (size_t)T * N * 4) == 0, "FP8's 8 loads a lane change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                cr_expect(memcmp(o[0], o[3], (size_t)T * N * 4) == 0, "pipelined rows change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                cr_expect(memcmp(o[0], o[4], (size_t)T * N * 4) == 0, "16 loads a lane change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                cr_expect(memcmp(o[0], o[6], (size_t)T * N * 4) == 0, "12 blocks an SM change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                cr_expect(memcmp(o[0], o[5], (size_t)T * N * 4) == 0, "8 loads a lane change the bits: %s T=%d N=%d K=%d",
                          fp8 ? "fp8" : "bf16", T, N, K);
                CHECK_ERR(o[1], ref, (size_t)T * N, 2e-5, "early loads %s T=%d N=%d K=%d", fp8 ? "fp8" : "bf16", T, N, K);
            }
        cudaFree(dx), cudaFree(dxn), cudaFree(dw), cudaFree(dn), cudaFree(dy);
        fp8_free(&w8);
        free(x), free(wf), free(nf), free(xn), free(wb), free(nb), free(ref), free(o[0]), free(o[1]), free(o[2]);
        free(o[3]), free(o[4]), free(o[5]), free(o[6]);
    }
    cudaStreamDestroy(st);
}

/* The one-token FP8 GEMV split over K (msm_cuda_tuning.fp8_gemv_split: 1 or 2 rows a block, 1 or
 * 2 loads a lane in flight; the integer or the hardware decode): within float32 rounding of the CPU's product (another order of
 * the same products), the same bits with its weights requested before the PDL wait or after it, on
 * an x that the kernel just before writes into a buffer poisoned just before that, and the same
 * bits again on a second call. Shapes: one step a warp or less (K 192 and 256, phases 64 and 16:
 * some warps have no step), partial last rounds (1408, 2048 + 16), long rows (12288), odd N, bias. */
Test(cuda_kernels, linear_fp8_split_matches_cpu, .timeout = 120) {
    need_gpu();
    static const int shapes[][4] = {{2048, 4096, 0, 1}, {5120, 2048, 64, 0}, {777, 1408, 0, 1},
                                    {300, 192, 64, 0},  {129, 256, 16, 1},   {4096, 12288, 0, 0},
                                    {1000, 2064, 112, 1}};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int N = shapes[s][0], K = shapes[s][1], ph = shapes[s][2];
        float *x = host_f32(K, 1.0f), *nf, *xn = malloc((size_t)K * 4), *bf = NULL;
        uint16_t *nb = host_bf16(K, 1.0f, &nf), *bb = shapes[s][3] ? host_bf16(N, 0.5f, &bf) : NULL;
        msm_cpu_rmsnorm(xn, x, nf, 1, K, 1e-6f);
        fp8_weight w8 = fp8_make(1, N, K, ph, false);
        float *ref = malloc((size_t)N * 4), *o[3];
        msm_cpu_linear(ref, xn, w8.f, bf, 1, N, K);
        float *dx = dev_up(x, (size_t)K * 4), *dxn = dev((size_t)K * 4), *dy = dev((size_t)N * 4);
        uint16_t *dn = dev_up(nb, (size_t)K * 2), *db = bb ? dev_up(bb, (size_t)N * 2) : NULL;
        for (int i = 0; i < 3; i++) o[i] = malloc((size_t)N * 4);
        for (int rows = 1; rows <= 3; rows++) /* the three forms (tuning fp8_gemv_split) */
            for (int hw = 0; hw < 2; hw++) {
                for (int e = 0; e < 3; e++) { /* early loads, after the wait, early again */
                    msm_cuda_tuning t = tune0;
                    t.fp8_gemv_split = rows, t.fp8_gemv_split_min_k = 0; /* at any K */
                    t.fp8_gemv_hw = hw; /* the default kernel choice (MMA from 3 tokens), SIMT at one */
                    t.gemv_early = e != 1;
                    msm_cuda_exec ex = {.stream = st, .tune = &t};
                    CK(cudaMemsetAsync(dxn, 0xff, (size_t)K * 4, st));
                    CK(cudaMemsetAsync(dy, 0xff, (size_t)N * 4, st));
                    CK(msm_cuda_rmsnorm(dxn, dx, dn, 1, K, 1e-6f, ex));
                    CK(msm_cuda_linear_fp8(dy, dxn, w8.d, db, 1, N, K, NULL, NULL, 0, NULL, 0, ex));
                    CK(cudaStreamSynchronize(st));
                    down(o[e], dy, (size_t)N * 4);
                }
                CHECK_ERR(o[0], ref, (size_t)N, 2e-5, "split fp8 GEMV form=%d hw=%d N=%d K=%d phase=%d", rows, hw, N,
                          K, ph);
                cr_expect(memcmp(o[0], o[1], (size_t)N * 4) == 0, "early loads change the bits: form=%d hw=%d N=%d K=%d",
                          rows, hw, N, K);
                cr_expect(memcmp(o[0], o[2], (size_t)N * 4) == 0, "not deterministic: form=%d hw=%d N=%d K=%d", rows,
                          hw, N, K);
            }
        cudaFree(dx), cudaFree(dxn), cudaFree(dy), cudaFree(dn), cudaFree(db);
        fp8_free(&w8);
        for (int i = 0; i < 3; i++) free(o[i]);
        free(x), free(nf), free(xn), free(bf), free(nb), free(bb), free(ref);
    }
    cudaStreamDestroy(st);
}

/* ADD_RMSNORM + the LINEAR on its norm in one launch (msm_cuda_norm_linear) gives the two kernels'
 * bits: the residual sum, the norm and y, bf16 at 1..2 tokens and FP8 (SIMT GEMV) at 1, K = 2048
 * (8 values a norm thread) and 768 / 1024 (4), odd N (a block's last rows past N), a bias, FP8 phases
 * 0 and 64; the inputs written by the kernel just before it on buffers poisoned just before that (a
 * read ahead of its PDL wait would show), its weights requested before the wait or after it, its bf16
 * rows software-pipelined or not (msm_cuda_tuning.rows_pipe); and shapes it does not take refused
 * with -EINVAL. */
Test(cuda_kernels, norm_linear_equals_add_rmsnorm_then_linear, .timeout = 120) {
    need_gpu();
    static const int shapes[][4] = {{5120, 2048, 0, 0}, {2048, 2048, 0, 1}, {1027, 768, 64, 1}, {300, 1024, 0, 0}};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int N = shapes[s][0], K = shapes[s][1], ph = shapes[s][2], Tm = 2;
        float *xa = host_f32((size_t)Tm * K, 1.0f), *xb = host_f32((size_t)Tm * K, 1.0f), *wf, *nf, *bf = NULL;
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *nb = host_bf16(K, 1.0f, &nf);
        uint16_t *bb = shapes[s][3] ? host_bf16(N, 0.5f, &bf) : NULL;
        fp8_weight w8 = fp8_make(1, N, K, ph, false);
        float *d0 = dev_up(xa, (size_t)Tm * K * 4), *d1 = dev_up(xb, (size_t)Tm * K * 4);
        float *da = dev((size_t)Tm * K * 4), *db = dev((size_t)Tm * K * 4), *dz = dev((size_t)Tm * K * 4);
        cr_assert_eq(cudaMemset(dz, 0, (size_t)Tm * K * 4), cudaSuccess);
        float *dsum = dev((size_t)Tm * K * 4), *dout = dev((size_t)Tm * K * 4), *dy = dev((size_t)Tm * N * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *dn = dev_up(nb, (size_t)K * 2);
        uint16_t *dbias = bb ? dev_up(bb, (size_t)N * 2) : NULL;
        float *r[3], *g[3];
        for (int i = 0; i < 3; i++) r[i] = malloc((size_t)Tm * (N > K ? N : K) * 4), g[i] = malloc((size_t)Tm * (N > K ? N : K) * 4);
        /* bf16; FP8, the integer decode; FP8, the hardware one; FP8 split over K (tuning fp8_gemv_split:
         * the fused node against the split GEMV) at 1 row a block and the integer decode, at 2 and the
         * hardware one */
        for (int kind = 0; kind < 5; kind++)
            for (int T = 1; T <= (kind ? 1 : 2); T++)
                /* the two kernels; one, early loads; one, loads after the wait; one, early, without the
                 * software pipelining of bf16 rows (msm_cuda_tuning.rows_pipe) */
                for (int v = 0; v < 4; v++) {
                    int fp8 = kind > 0;
                    msm_cuda_tuning t = tune0;
                    t.fp8_linear = kind == 2 ? MSM_CUDA_FP8_LINEAR_SIMT_HW : MSM_CUDA_FP8_LINEAR_SIMT;
                    t.fp8_gemv_hw = kind == 4;
                    t.fp8_gemv_split = kind >= 3 ? kind - 2 : 0, t.fp8_gemv_split_min_k = 0; /* at any K */
                    t.gemv_early = v != 2;
                    if (v == 3) t.rows_pipe = 0;
                    msm_cuda_exec ex = {.stream = st, .tune = &t};
                    cr_assert(msm_cuda_norm_linear_fits(T, N, K, fp8, ph, &t), "fits %s T=%d N=%d K=%d",
                              fp8 ? "fp8" : "bf16", T, N, K);
                    /* the inputs, written by the kernels just before (a = x0 + x1, b = x1 + 0) on poisoned buffers */
                    CK(cudaMemsetAsync(da, 0xff, (size_t)Tm * K * 4, st));
                    CK(cudaMemsetAsync(db, 0xff, (size_t)Tm * K * 4, st));
                    CK(cudaMemsetAsync(dsum, 0xff, (size_t)Tm * K * 4, st));
                    CK(cudaMemsetAsync(dout, 0xff, (size_t)Tm * K * 4, st));
                    CK(cudaMemsetAsync(dy, 0xff, (size_t)Tm * N * 4, st));
                    CK(msm_cuda_add(da, d0, d1, (size_t)T * K, ex));
                    CK(msm_cuda_add(db, d1, dz, (size_t)T * K, ex));
                    if (v == 0) {
                        CK(msm_cuda_add_rmsnorm(dsum, dout, da, db, dn, T, K, 1e-6f, ex));
                        if (fp8)
                            CK(msm_cuda_linear_fp8(dy, dout, w8.d, dbias, T, N, K, NULL, NULL, 0, NULL, 0, ex));
                        else
                            CK(msm_cuda_linear(dy, dout, dw, dbias, T, N, K, NULL, NULL, 0, ex));
                    } else {
                        CK(msm_cuda_norm_linear(dy, dsum, dout, da, db, dn, 1e-6f, fp8 ? NULL : dw,
                                                fp8 ? w8.d : (msm_cuda_fp8w){0}, dbias, T, N, K, ex));
                    }
                    CK(cudaStreamSynchronize(st));
                    float **o = v == 0 ? r : g;
                    down(o[0], dsum, (size_t)T * K * 4), down(o[1], dout, (size_t)T * K * 4);
                    down(o[2], dy, (size_t)T * N * 4);
                    if (v == 0) continue;
                    cr_expect(memcmp(r[0], g[0], (size_t)T * K * 4) == 0, "sum differs: %s T=%d N=%d K=%d v=%d",
                              kind >= 3 ? "fp8 split" : kind == 2 ? "fp8 hw" : fp8 ? "fp8" : "bf16", T, N, K, v);
                    cr_expect(memcmp(r[1], g[1], (size_t)T * K * 4) == 0, "norm differs: %s T=%d N=%d K=%d v=%d",
                              kind >= 3 ? "fp8 split" : kind == 2 ? "fp8 hw" : fp8 ? "fp8" : "bf16", T, N, K, v);
                    cr_expect(memcmp(r[2], g[2], (size_t)T * N * 4) == 0, "y differs: %s T=%d N=%d K=%d v=%d",
                              kind >= 3 ? "fp8 split" : kind == 2 ? "fp8 hw" : fp8 ? "fp8" : "bf16", T, N, K, v);
                }
        /* not taken: past the GEMV's tokens, a K it has no layout for, a router-sized N */
        msm_cuda_tuning t = tune0;
        cr_expect(!msm_cuda_norm_linear_fits(3, N, K, false, 0, &t), "bf16 past 2 tokens (measured slower)");
        cr_expect(!msm_cuda_norm_linear_fits(2, N, K, true, 0, &t), "FP8 past 1 token (measured slower)");
        cr_expect(!msm_cuda_norm_linear_fits(1, N, 4096, false, 0, &t));
        cr_expect(!msm_cuda_norm_linear_fits(1, 256, K, false, 0, &t));
        cr_expect_eq(msm_cuda_norm_linear(dy, dsum, dout, da, db, dn, 1e-6f, dw, (msm_cuda_fp8w){0}, NULL, 3, N, K,
                                          (msm_cuda_exec){.stream = st, .tune = &t}),
                     -EINVAL);
        t.norm_linear = false;
        cr_expect(!msm_cuda_norm_linear_fits(1, N, K, false, 0, &t), "switched off");
        cudaFree(d0), cudaFree(d1), cudaFree(da), cudaFree(db), cudaFree(dz), cudaFree(dsum), cudaFree(dout), cudaFree(dy);
        cudaFree(dw), cudaFree(dn), cudaFree(dbias);
        fp8_free(&w8);
        for (int i = 0; i < 3; i++) free(r[i]), free(g[i]);
        free(xa), free(xb), free(wf), free(nf), free(bf), free(wb), free(nb), free(bb);
    }
    cudaStreamDestroy(st);
}

/* The dequantisation is bit for bit the host's msm_f32_to_bf16(f32(q) * scale), NaN codes (bf16
 * NaN of their sign, as load.cu stores them) included; with `used`, only the marked experts. */
Test(cuda_kernels, fp8_dequant_equals_the_host_rounding, .timeout = 60) {
    need_gpu();
    static const int shapes[][4] = {{1, 300, 1024, 0}, {3, 130, 192, 64}, {2, 64, 100, 0}, {4, 256, 136, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int E = shapes[s][0], R = shapes[s][1], C = shapes[s][2], ph = shapes[s][3];
        fp8_weight w = fp8_make(E, R, C, ph, true);
        uint16_t *d = dev_poison(w.n * 2), *got = malloc(w.n * 2);
        int32_t used[4] = {1, 0, 1, 0}, *du = dev_up(used, sizeof used);
        CK(msm_cuda_fp8_dequant(d, w.d, E, R, C, E > 1 ? du : NULL, EX));
        down(got, d, w.n * 2);
        size_t per = (size_t)R * C, bad = w.n;
        for (size_t i = 0; i < w.n && bad == w.n; i++) {
            uint16_t want = (w.q[i] & 0x7f) == 0x7f ? (w.q[i] & 0x80 ? 0xffc0 : 0x7fc0) : msm_f32_to_bf16(w.f[i]);
            if (E > 1 && !used[i / per]) want = 0xffff; /* untouched: the poison */
            if (got[i] != want) bad = i;
        }
        cr_expect_eq(bad, w.n, "fp8 dequant E=%d R=%d C=%d phase=%d: element %zu 0x%04x (code 0x%02x)", E, R, C, ph,
                     bad, bad < w.n ? got[bad] : 0, bad < w.n ? w.q[bad] : 0);
        cudaFree(d), cudaFree(du);
        free(got);
        fp8_free(&w);
    }
    /* marking: experts named by ids, invalid ids ignored */
    int32_t ids[6] = {3, 0, 3, -1, 7, 99}, *di = dev_up(ids, sizeof ids), *du = dev_poison(8 * 4), u[8];
    CK(msm_cuda_fp8_mark(du, di, 6, 8, EX));
    down(u, du, sizeof u);
    for (int e = 0; e < 8; e++) cr_expect_eq(u[e], e == 0 || e == 3 || e == 7, "expert %d", e);
    cudaFree(di), cudaFree(du);
}

/* FP8 experts against the CPU on the float32 weights (FP8 pair and grouped GEMVs; past
 * fp8_native_max_t the FP8 tiled GEMMs) or on them rounded to bf16 (the selected experts
 * dequantised, the bf16 paths: past the tiled range, phases not multiples of 64, the tiled switch
 * off). The reference also checks which kind of path ran: the bf16 rounding alone moves these
 * outputs by ~3e-3, a hundred times the 2e-5 tolerance. gu_ph / dn_ph: the column phases of
 * gate/up and down; tiled8: msm_cuda_tuning.fp8_moe_tiled. */
static void moe_fp8_cases(const moe_run *runs, int n, int H, int I, int k, int E, int gu_ph, int dn_ph, int native_max,
                          bool tiled8) {
    fp8_weight gu = fp8_make(E, 2 * I, H, gu_ph, false), dn = fp8_make(E, H, I, dn_ph, false);
    float *scratch = malloc((size_t)3 * I * 4);
    size_t dqb = msm_cuda_moe_fp8_deq_bytes(H, I, E);
    void *dq = dev_poison(dqb);
    for (int c = 0; c < n; c++) {
        int T = runs[c].T;
        msm_cuda_tuning t = tune0;
        if (runs[c].path >= 0) t.moe_path = runs[c].path;
        if (runs[c].kflags >= 0) t.moe_kernels = runs[c].kflags;
        if (native_max >= 0) t.fp8_native_max_t = native_max;
        t.fp8_moe_tiled = tiled8;
        bool native = T <= t.fp8_native_max_t && t.moe_path != MSM_CUDA_MOE_PATH_TILED &&
                      t.moe_path != MSM_CUDA_MOE_PATH_WMMA;
        bool tiled = !native && tiled8 && (t.moe_path == MSM_CUDA_MOE_PATH_AUTO || t.moe_path == MSM_CUDA_MOE_PATH_TILED) &&
                     T <= MSM_CUDA_MOE_TILED_MAX_T && H % 64 == 0 && I % 64 == 0 && gu_ph % 64 == 0 && dn_ph % 64 == 0;
        bool wmma = !native && !tiled &&
                    (t.moe_path == MSM_CUDA_MOE_PATH_WMMA || (t.moe_path == 0 && T > MSM_CUDA_MOE_TILED_MAX_T));
        native |= tiled; /* both multiply by the float32 weights */
        float *x = host_f32((size_t)T * H, 1.0f);
        int32_t *ids = malloc((size_t)T * k * 4);
        float *w = malloc((size_t)T * k * 4);
        random_routing(ids, w, T, k, E);
        float *ref = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4), *out2 = malloc((size_t)T * H * 4);
        msm_cpu_moe_experts(ref, x, ids, w, native ? gu.f : gu.fb, native ? dn.f : dn.fb, T, H, I, k, scratch);
        float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4), *dy = dev_poison((size_t)T * H * 4);
        int32_t *di = dev_up(ids, (size_t)T * k * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
        void *ws = dev_poison(wsb);
        CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, gu.d, dn.d, T, H, I, k, E, ws, wsb, dq, dqb, EX_T(&t)));
        down(out, dy, (size_t)T * H * 4);
        CHECK_ERR(out, ref, (size_t)T * H, wmma ? 2e-2 : 2e-5,
                  "fp8 moe T=%d H=%d I=%d k=%d E=%d phases %d/%d path=%d tiled8=%d: expected %s", T, H, I, k, E, gu_ph,
                  dn_ph, runs[c].path, tiled8, tiled ? "FP8 tiled" : native ? "FP8 GEMVs" : "dequantised");
        cudaMemset(dy, 0xff, (size_t)T * H * 4);
        CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, gu.d, dn.d, T, H, I, k, E, ws, wsb, dq, dqb, EX_T(&t)));
        down(out2, dy, (size_t)T * H * 4);
        cr_assert(memcmp(out, out2, (size_t)T * H * 4) == 0, "fp8 moe not deterministic T=%d path=%d", T, runs[c].path);
        cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(dy), cudaFree(ws);
        free(x), free(ids), free(w), free(ref), free(out), free(out2);
    }
    cudaFree(dq);
    fp8_free(&gu), fp8_free(&dn);
    free(scratch);
}

Test(cuda_kernels, moe_experts_fp8_match_cpu, .timeout = 240) {
    need_gpu();
    enum { A = MSM_CUDA_MOE_PATH_AUTO, PR = MSM_CUDA_MOE_PATH_PAIR, GG = MSM_CUDA_MOE_PATH_GROUPED_GEMV,
           TL = MSM_CUDA_MOE_PATH_TILED, WM = MSM_CUDA_MOE_PATH_WMMA };
    /* Qwen3-30B-A3B expert shapes: pair (T <= 4), grouped tensor-core GEMVs (5..64; SIMT forced
     * too), then the FP8 tiled GEMMs to 512 tokens (forced tiled: at any T), dequantised and WMMA
     * beyond (moe_experts_fp8_tiled_match_cpu has the tiled cases) */
    enum { SIMT = MSM_CUDA_MOE_K_SIMT, DS = MSM_CUDA_MOE_K_DOWN_SPLIT, DW = MSM_CUDA_MOE_K_DOWN_WARP };
    static const moe_run q3[] = {{1, A, -1},  {4, A, -1},     {5, A, -1},      {16, A, -1},  {64, A, -1},
                                 {65, A, -1}, {200, A, -1},   {8, PR, -1},     {2, GG, -1},  {8, TL, -1},
                                 {600, A, -1}, {16, A, SIMT}, {1, GG, SIMT},   {40, GG, -1}, {1, A, DS},
                                 {4, A, DS},  {6, PR, DS},    {1, A, DW},      {4, A, DW}};
    moe_fp8_cases(q3, sizeof q3 / sizeof *q3, 2048, 768, 8, 128, 0, 0, -1, true);
    /* a row-parallel TP slice of down starting inside a block (phase 64: GLM-4.5-Air's experts at
     * TP 2, I = 704), k = 4; and odd expert counts */
    static const moe_run tp[] = {{1, A, -1}, {3, A, -1}, {12, A, -1}, {40, A, -1}, {100, A, -1}, {30, WM, -1},
                                 {12, A, SIMT}, {1, GG, -1}, {2, A, DS}};
    moe_fp8_cases(tp, sizeof tp / sizeof *tp, 512, 704, 4, 12, 0, 64, -1, true);
    /* everything dequantised (fp8_native_max_t = 0, the FP8 tiled GEMMs off) */
    static const moe_run dq[] = {{1, A, -1}, {5, A, -1}, {40, A, -1}};
    moe_fp8_cases(dq, sizeof dq / sizeof *dq, 256, 128, 2, 6, 0, 0, 0, false);
}

/* The FP8 tiled GEMMs (moe_tiled.cu: codes decoded in shared memory, per-step scales) against the
 * CPU on the float32 weights at the FP8 GEMVs' tolerance (2e-5), deterministic; and where they must
 * not run, the dequantising path (bf16-rounded reference): phase 16, the switch off. */
/* The forms of the FP8 pair-path experts give the same bits: the hardware's e4m3 -> half decode
 * (msm_cuda_tuning.fp8_moe_hw) the integer decode's outputs on these data (|x| ~ 1: no product
 * leaves float32's normal range either way), and the lean dot (msm_cuda_tuning.fp8_moe_lean 1 and
 * 2: the gate/up, and the split down at 4 rows a warp) the general one's, with either decode and
 * one and several down rows a warp (down split / one warp a row); all match the CPU on the float32
 * weights. Shapes: Qwen3-30B-A3B's experts, GLM-4.5-Air's with a TP-2 down phase of 64, a row
 * shorter than a warp's step (96, 256: lanes idle) and one of 1.5 steps (768). */
Test(cuda_kernels, moe_experts_fp8_pair_forms_bitwise, .timeout = 180) {
    need_gpu();
    /* H, I, k, E, gate/up phase, down phase */
    static const int shapes[][6] = {{2048, 768, 8, 128, 0, 0}, {4096, 1408, 8, 128, 0, 64}, {512, 256, 4, 16, 16, 32},
                                    {256, 96, 2, 8, 0, 0}, {768, 256, 2, 6, 0, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3];
        fp8_weight gu = fp8_make(E, 2 * I, H, shapes[s][4], false), dn = fp8_make(E, H, I, shapes[s][5], false);
        float *scratch = malloc((size_t)3 * I * 4);
        for (int T = 1; T <= 4; T++) {
            for (int kf = 0; kf < 3; kf++) { /* down split (2 rows a warp), one warp a row, split 4 rows */
                float *x = host_f32((size_t)T * H, 1.0f), *w = malloc((size_t)T * k * 4);
                int32_t *ids = malloc((size_t)T * k * 4);
                random_routing(ids, w, T, k, E);
                float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4);
                int32_t *di = dev_up(ids, (size_t)T * k * 4);
                size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E), ny = (size_t)T * H;
                void *ws = dev_poison(wsb);
                float *o[2], *ol = malloc(ny * 4), *ref = malloc(ny * 4);
                for (int hw = 0; hw < 2; hw++)
                    for (int lean = 0; lean <= 2; lean++) {
                        msm_cuda_tuning t = tune0;
                        t.moe_path = MSM_CUDA_MOE_PATH_PAIR;
                        t.moe_kernels = kf == 1 ? MSM_CUDA_MOE_K_DOWN_WARP : MSM_CUDA_MOE_K_DOWN_SPLIT;
                        t.moe_down_hb = kf == 2 ? 4 : 2;
                        t.fp8_moe_hw = hw;
                        t.fp8_moe_lean = lean;
                        float *dy = dev_poison(ny * 4);
                        CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, gu.d, dn.d, T, H, I, k, E, ws, wsb, NULL, 0,
                                                    EX_T(&t)));
                        if (!lean) o[hw] = malloc(ny * 4);
                        down(lean ? ol : o[hw], dy, ny * 4);
                        cudaFree(dy);
                        if (lean)
                            cr_assert(memcmp(o[hw], ol, ny * 4) == 0,
                                      "lean %d differs: H=%d I=%d k=%d T=%d hw=%d down %s", lean, H, I, k, T, hw,
                                      kf == 1 ? "warp" : kf ? "split 4" : "split");
                    }
                cr_assert(memcmp(o[0], o[1], ny * 4) == 0, "hw decode differs: H=%d I=%d k=%d T=%d down %s", H, I, k,
                          T, kf == 1 ? "warp" : kf ? "split 4" : "split");
                msm_cpu_moe_experts(ref, x, ids, w, gu.f, dn.f, T, H, I, k, scratch);
                CHECK_ERR(o[1], ref, ny, 2e-5, "hw decode vs cpu: H=%d I=%d k=%d T=%d", H, I, k, T);
                cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(ws);
                free(x), free(w), free(ids), free(o[0]), free(o[1]), free(ol), free(ref);
            }
        }
        fp8_free(&gu), fp8_free(&dn);
        free(scratch);
    }
}

/* The routed experts' combine left to the norm after them (tuning moe_fused_combine:
 * msm_cuda_moe_experts_deferred, then msm_cuda_moe_add_rmsnorm or
 * msm_cuda_moe_combine_rmsnorm_routed on the same workspace) gives the bits of the experts' own
 * combine followed by msm_cuda_add_rmsnorm or msm_cuda_moe_combine_rmsnorm: the residual sum and the
 * norm. Qwen3-30B-A3B's and Qwen1.5-MoE's expert shapes and a small odd one (H 264: 2 values a norm
 * thread), bf16 on the grouped GEMVs (scanning their pairs or after the grouping kernel) and the
 * tiled GEMMs, FP8 on the grouped GEMVs and the tiled GEMMs; an invalid expert id in the routing
 * (a pair with no row). Not deferred: the pair path (1-4 tokens) and the switch off. */
Test(cuda_kernels, moe_fused_combine_equals_combine_then_norm, .timeout = 180) {
    need_gpu();
    static const int shapes[][5] = {{2048, 768, 8, 128, 0}, {2048, 1408, 4, 60, 0}, {264, 100, 4, 24, 0},
                                    {2048, 768, 8, 128, 1}}; /* H, I, k, E, FP8 */
    static const int toks[] = {5, 8, 16, 40};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int H = shapes[si][0], I = shapes[si][1], k = shapes[si][2], E = shapes[si][3], Tm = 40;
        bool fp8 = shapes[si][4];
        moe_wset m = moe_wset_new(H, I, E);
        fp8_weight g8 = fp8_make(E, 2 * I, H, 0, false), d8 = fp8_make(E, H, I, 0, false);
        size_t nr = (size_t)Tm * H;
        float *x = host_f32(nr, 1.0f), *ra = host_f32(nr, 1.0f), *sh = host_f32(nr, 1.0f), *nf, *gf;
        uint16_t *nb = host_bf16(H, 1.0f, &nf), *gb = host_bf16(H, 0.2f, &gf);
        float *dx = dev_up(x, nr * 4), *da = dev_up(ra, nr * 4), *dsh = dev_up(sh, nr * 4), *dy = dev(nr * 4);
        uint16_t *dn = dev_up(nb, (size_t)H * 2), *dg = dev_up(gb, (size_t)H * 2);
        float *s1 = dev(nr * 4), *o1 = dev(nr * 4), *s2 = dev(nr * 4), *o2 = dev(nr * 4);
        float *h[4], *r[4];
        for (int q = 0; q < 4; q++) h[q] = malloc(nr * 4), r[q] = malloc(nr * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(Tm, H, I, k, E), deqb = msm_cuda_moe_fp8_deq_bytes(H, I, E);
        void *ws = dev(wsb), *deq = dev(deqb);
        for (size_t ti = 0; ti < sizeof toks / sizeof *toks; ti++)
            for (int v = 0; v < 3; v++) { /* bf16: default, no scan, tiled; FP8: default (tiled), grouped GEMVs */
                int T = toks[ti];
                if (fp8 && v == 2) continue;
                msm_cuda_tuning t = tune0;
                t.moe_fused_combine = true;
                if (!fp8 && v == 1) t.moe_group_scan_max_t = 0;
                if (!fp8 && v == 2) t.moe_path = MSM_CUDA_MOE_PATH_TILED;
                if (fp8 && v == 1) t.fp8_moe_tiled = false;
                msm_cuda_exec ex = {.stream = 0, .tune = &t};
                int32_t *ids = malloc((size_t)T * k * 4);
                float *w = malloc((size_t)T * k * 4);
                random_routing(ids, w, T, k, E);
                ids[k] = -1; /* token 1's first slot: no expert */
                int32_t *di = dev_up(ids, (size_t)T * k * 4);
                float *dw = dev_up(w, (size_t)T * k * 4);
                msm_cuda_moe_args ma = {.x = dx, .ids = di, .w = dw, .gate_up = fp8 ? NULL : m.dgu,
                                        .down = fp8 ? NULL : m.ddn, .gu = fp8 ? g8.d : (msm_cuda_fp8w){0},
                                        .dn = fp8 ? d8.d : (msm_cuda_fp8w){0}, .T = T, .H = H, .I = I, .k = k, .E = E,
                                        .ws = ws, .deq = deq, .ws_bytes = wsb, .deq_bytes = deqb};
                cr_assert(msm_cuda_moe_defers(&ma, &t), "defers: T=%d H=%d fp8=%d v=%d", T, H, fp8, v);
                /* the experts' combine, then the two norms */
                if (fp8)
                    CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, g8.d, d8.d, T, H, I, k, E, ws, wsb, deq, deqb, ex));
                else
                    CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, ex));
                CK(msm_cuda_add_rmsnorm(s1, o1, da, dy, dn, T, H, 1e-6f, ex));
                CK(msm_cuda_moe_combine_rmsnorm(s2, o2, da, dy, dsh, dx, dg, dn, T, H, 1e-6f, ex));
                down(r[0], s1, (size_t)T * H * 4), down(r[1], o1, (size_t)T * H * 4);
                down(r[2], s2, (size_t)T * H * 4), down(r[3], o2, (size_t)T * H * 4);
                /* deferred, on poisoned outputs */
                CK(cudaMemset(dy, 0xff, nr * 4) == cudaSuccess ? 0 : -1);
                for (int q = 0; q < 4; q++) CK(cudaMemset(q == 0 ? s1 : q == 1 ? o1 : q == 2 ? s2 : o2, 0xff, nr * 4) == cudaSuccess ? 0 : -1);
                CK(msm_cuda_moe_experts_deferred(&ma, ex));
                CK(msm_cuda_moe_add_rmsnorm(s1, o1, da, dn, 1e-6f, &ma, ex));
                CK(msm_cuda_moe_combine_rmsnorm_routed(s2, o2, da, dsh, dx, dg, dn, 1e-6f, &ma, ex));
                down(h[0], s1, (size_t)T * H * 4), down(h[1], o1, (size_t)T * H * 4);
                down(h[2], s2, (size_t)T * H * 4), down(h[3], o2, (size_t)T * H * 4);
                static const char *what[] = {"add: sum", "add: norm", "shared: sum", "shared: norm"};
                for (int q = 0; q < 4; q++)
                    cr_expect(memcmp(r[q], h[q], (size_t)T * H * 4) == 0, "%s differs: T=%d H=%d fp8=%d v=%d", what[q],
                              T, H, fp8, v);
                /* the add + norm reader as one block a token too (the default above: a cluster a token
                 * where the row takes 2-8 slices, both shapes here) */
                t.moe_combine_cluster = false;
                CK(cudaMemset(s1, 0xff, nr * 4) == cudaSuccess ? 0 : -1);
                CK(cudaMemset(o1, 0xff, nr * 4) == cudaSuccess ? 0 : -1);
                CK(msm_cuda_moe_add_rmsnorm(s1, o1, da, dn, 1e-6f, &ma, ex));
                down(h[0], s1, (size_t)T * H * 4), down(h[1], o1, (size_t)T * H * 4);
                for (int q = 0; q < 2; q++)
                    cr_expect(memcmp(r[q], h[q], (size_t)T * H * 4) == 0, "%s differs, one block a token: T=%d H=%d "
                              "fp8=%d v=%d", what[q], T, H, fp8, v);
                free(ids), free(w);
                cudaFree(di), cudaFree(dw);
            }
        /* not deferred: the pair path, the switch off */
        msm_cuda_tuning t = tune0;
        t.moe_fused_combine = true;
        msm_cuda_moe_args ma = {.x = dx, .ids = NULL, .w = NULL, .gate_up = fp8 ? NULL : m.dgu, .down = fp8 ? NULL : m.ddn,
                                .gu = fp8 ? g8.d : (msm_cuda_fp8w){0}, .dn = fp8 ? d8.d : (msm_cuda_fp8w){0},
                                .T = 4, .H = H, .I = I, .k = k, .E = E, .ws = ws, .deq = deq, .ws_bytes = wsb,
                                .deq_bytes = deqb};
        cr_expect(!msm_cuda_moe_defers(&ma, &t), "4 tokens: the pair path writes the sum itself");
        cr_expect_eq(msm_cuda_moe_experts_deferred(&ma, (msm_cuda_exec){.stream = 0, .tune = &t}), -EINVAL);
        ma.T = 100;
        t.moe_fused_combine = 2;
        cr_expect(!msm_cuda_moe_defers(&ma, &t), "the default (2) keeps the combine kernel past 64 tokens");
        t.moe_fused_combine = 1;
        cr_expect(msm_cuda_moe_defers(&ma, &t) || fp8, "1 defers at any size (bf16 grouped / tiled)");
        ma.T = 8;
        t.moe_fused_combine = false;
        cr_expect(!msm_cuda_moe_defers(&ma, &t), "switched off");
        cr_expect_eq(msm_cuda_moe_add_rmsnorm(s1, o1, da, dn, 1e-6f, &ma, (msm_cuda_exec){.stream = 0, .tune = &t}),
                     -EINVAL);
        cudaFree(dx), cudaFree(da), cudaFree(dsh), cudaFree(dy), cudaFree(dn), cudaFree(dg), cudaFree(s1), cudaFree(o1);
        cudaFree(s2), cudaFree(o2), cudaFree(ws), cudaFree(deq);
        for (int q = 0; q < 4; q++) free(h[q]), free(r[q]);
        free(x), free(ra), free(sh), free(nf), free(gf), free(nb), free(gb);
        fp8_free(&g8), fp8_free(&d8);
        moe_wset_free(&m);
    }
}

/* The early down's rule (tuning moe_pair_early), on the host: AUTO takes it but at one token with a
 * shared expert beside on the aux stream (measured slower there); ON always, OFF never; and only
 * where the split down kernel runs (bf16 from 4 slots a token, FP8 from 8, or forced). */
Test(cuda_kernels, moe_pair_early_taken_by_its_rule) {
    msm_cuda_tuning t;
    memset(&t, 0, sizeof t);
    t.moe_pair_early = MSM_CUDA_MOE_PAIR_EARLY_AUTO;
    cr_expect(!msm_cuda_moe_pair_early(&t, 1, 4, false, true), "AUTO: not at one token beside the aux stream");
    cr_expect(msm_cuda_moe_pair_early(&t, 1, 4, false, false), "AUTO: one token alone");
    cr_expect(msm_cuda_moe_pair_early(&t, 2, 4, false, true), "AUTO: two tokens beside the aux stream");
    cr_expect(msm_cuda_moe_pair_early(&t, 1, 8, true, false), "AUTO: FP8 at 8 slots");
    cr_expect(!msm_cuda_moe_pair_early(&t, 1, 4, true, false), "FP8 at 4 slots: no split down");
    cr_expect(!msm_cuda_moe_pair_early(&t, 1, 2, false, false), "bf16 at 2 slots: no split down");
    t.moe_kernels = MSM_CUDA_MOE_K_DOWN_SPLIT;
    cr_expect(msm_cuda_moe_pair_early(&t, 1, 2, false, false), "the split down forced");
    t.moe_kernels = 0;
    t.moe_pair_early = MSM_CUDA_MOE_PAIR_EARLY_ON;
    cr_expect(msm_cuda_moe_pair_early(&t, 1, 4, false, true), "ON: beside the aux stream too");
    t.moe_pair_early = MSM_CUDA_MOE_PAIR_EARLY_OFF;
    cr_expect(!msm_cuda_moe_pair_early(&t, 2, 8, false, false), "OFF");
}

/* The pair path's split down reading the expert ids and loading its first weights before its PDL wait
 * (msm_cuda_tuning.moe_pair_early: the gate/up then triggers after its own wait) gives the same bits:
 * the routing written by the router kernel just before the experts on the same stream, with PDL, on
 * buffers poisoned just before it (ids read ahead of the routing would show as other experts or an
 * out-of-range one); bf16 (Qwen3-30B-A3B's and Qwen1.5-MoE's expert shapes, k 8 and 4, and an odd
 * H with k 8), FP8 with either decode and the lean dots (Qwen3-30B-A3B's shapes), T = 1..4, also
 * with the gate/up not a programmatic dependent (msm_cuda_exec.no_pdl, as beside a shared expert). */
Test(cuda_kernels, moe_pair_early_down_equals_late, .timeout = 180) {
    need_gpu();
    static const int shapes[][5] = {{2048, 768, 8, 128, 0}, {2048, 1408, 4, 60, 0}, {264, 100, 8, 24, 0},
                                    {2048, 768, 8, 128, 1}}; /* H, I, k, E, FP8 */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3];
        bool fp8 = shapes[s][4];
        moe_weights mw = moe_weights_new(H, I, E, fp8);
        const moe_wset m = mw.m;
        const fp8_weight gu = mw.gu, dn = mw.dn;
        float *rf;
        uint16_t *rb = host_bf16((size_t)E * H, 0.05f, &rf), *drw = dev_up(rb, (size_t)E * H * 2);
        for (int T = 1; T <= 4; T++) {
            float *x = host_f32((size_t)T * H, 1.0f);
            float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev((size_t)T * k * 4);
            int32_t *di = dev((size_t)T * k * 4);
            size_t rwsb = msm_cuda_router_ws_bytes(T, E), wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
            void *rws = dev(rwsb), *ws = dev_poison(wsb);
            CK(cudaMemset(rws, 0, rwsb));
            size_t ny = (size_t)T * H;
            float *ref = malloc(ny * 4), *got = malloc(ny * 4), *dy = dev(ny * 4);
            /* late (reference); early; early at the other decode / the general dot; early without PDL into the gate/up */
            for (int v = 0; v < 4; v++) {
                msm_cuda_tuning t = tune0;
                t.moe_path = MSM_CUDA_MOE_PATH_PAIR;
                t.moe_pair_early = v > 0 ? MSM_CUDA_MOE_PAIR_EARLY_ON : MSM_CUDA_MOE_PAIR_EARLY_OFF;
                if (fp8 && v == 2) t.fp8_moe_hw = !t.fp8_moe_hw, t.fp8_moe_lean = 0;
                msm_cuda_exec ex = {.stream = st, .tune = &t};
                CK(cudaMemsetAsync(di, 0x7f, (size_t)T * k * 4, st)); /* out of range: a stale id would show */
                CK(cudaMemsetAsync(dw, 0xff, (size_t)T * k * 4, st));
                CK(cudaMemsetAsync(dy, 0xff, ny * 4, st));
                CK(msm_cuda_router_linear_topk(di, dw, dx, drw, T, E, H, k, true, NULL, rws, rwsb, ex));
                msm_cuda_exec ee = ex;
                ee.no_pdl = v == 3;
                if (fp8)
                    CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, gu.d, dn.d, T, H, I, k, E, ws, wsb, NULL, 0, ee));
                else
                    CK(msm_cuda_moe_experts(dy, dx, di, dw, m.dgu, m.ddn, T, H, I, k, E, ws, wsb, ee));
                CK(cudaStreamSynchronize(st));
                down(v ? got : ref, dy, ny * 4);
                if (v)
                    cr_expect(memcmp(ref, got, ny * 4) == 0, "early down differs: H=%d I=%d k=%d E=%d %s T=%d v=%d", H,
                              I, k, E, fp8 ? "fp8" : "bf16", T, v);
            }
            cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(rws), cudaFree(ws), cudaFree(dy);
            free(x), free(ref), free(got);
        }
        cudaFree(drw), free(rb), free(rf);
        moe_weights_free(&mw);
    }
    cudaStreamDestroy(st);
}

/* The fused router's last block grouping the pairs for the routed experts after it
 * (msm_cuda_router_linear_topk's grp, msm_cuda_moe_args.grouped: no grouping kernel) gives the same
 * bits: the experts' output, and the grouping's counts, offsets and expert table in their
 * workspace, against the router then the experts with the grouping kernel; the router alone, and
 * with the add + norm inside it (msm_cuda_norm_router_linear_topk, up to its 8 tokens), and the
 * batched cluster router's block 0 where one cluster holds every token (router_tcluster). The same
 * for the combines reading the routing before their PDL wait (tuning moe_combine_early, on in every
 * run but the reference, also after the grouping kernel): the combine kernel, and the combine inside
 * the add + norm after the experts (msm_cuda_moe_experts_deferred, msm_cuda_moe_add_rmsnorm) on its
 * outputs. bf16 at
 * Qwen3-30B-A3B's and Qwen1.5-MoE's expert shapes and an odd one (the grouped GEMVs from 5 tokens,
 * the tiled GEMMs from 12), FP8 at Qwen3-30B-A3B's (grouped GEMVs, tiled GEMMs); every call twice on a
 * workspace poisoned before each (the grouping's counter returns to zero, a stale grouping would
 * show); and grp refused where the router does not group for it. */
Test(cuda_kernels, router_group_equals_group_kernel, .timeout = 240) {
    need_gpu();
    static const int shapes[][5] = {{2048, 768, 8, 128, 0}, {2048, 1408, 4, 60, 0}, {264, 96, 8, 24, 0},
                                    {2048, 768, 8, 128, 1}}; /* H, I, k, E, FP8 */
    static const int Ts[] = {5, 8, 12, 16, 33, 64};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3];
        bool fp8 = shapes[s][4];
        moe_weights mw = moe_weights_new(H, I, E, fp8);
        const moe_wset m = mw.m;
        const fp8_weight gu = mw.gu, dn = mw.dn;
        float *rf, *nf;
        uint16_t *rb = host_bf16((size_t)E * H, 0.05f, &rf), *drw = dev_up(rb, (size_t)E * H * 2);
        uint16_t *nb = host_bf16(H, 1.0f, &nf), *dn_w = dev_up(nb, (size_t)H * 2);
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            int T = Ts[ti];
            float *xa = host_f32((size_t)T * H, 1.0f), *xb = host_f32((size_t)T * H, 1.0f);
            float *da = dev_up(xa, (size_t)T * H * 4), *db = dev_up(xb, (size_t)T * H * 4);
            float *dx = dev((size_t)T * H * 4), *dsum = dev((size_t)T * H * 4), *dw = dev((size_t)T * k * 4);
            int32_t *di = dev((size_t)T * k * 4);
            size_t rwsb = msm_cuda_router_ws_bytes(T, E), wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
            /* the workspace's head: expert_off and tile_off [E + 1], the expert table (msm__moe_ws_layout) */
            size_t head = 2 * (((size_t)(E + 1) * 4 + 255) / 256 * 256) + ((size_t)E * 16 + 4 + 255) / 256 * 256;
            void *rws = dev(rwsb), *ws = dev(wsb);
            CK(cudaMemset(rws, 0, rwsb));
            size_t ny = (size_t)T * H;
            float *ref = malloc(ny * 4), *got = malloc(ny * 4), *dy = dev(ny * 4);
            float *rs = malloc(ny * 8), *gs = malloc(ny * 8), *ds = dev(ny * 8); /* the add + norm's sum, norm */
            unsigned char *rh = malloc(head), *gh = malloc(head);
            msm_cuda_moe_args ma = {.x = dx, .ids = di, .w = dw, .gate_up = fp8 ? NULL : m.dgu,
                                    .down = fp8 ? NULL : m.ddn, .gu = fp8 ? gu.d : (msm_cuda_fp8w){0},
                                    .dn = fp8 ? dn.d : (msm_cuda_fp8w){0}, .T = T, .H = H, .I = I, .k = k, .E = E,
                                    .ws = ws, .ws_bytes = wsb};
            /* the grouping kernel (reference); the router's, twice; the norm router's (T <= 8), twice;
             * the grouping kernel with the combines' early routing; the batched cluster router's (one
             * cluster for every token where T * E <= 1024, else the counter form's), early weights and not */
            for (int v = 0; v < 8; v++) {
                msm_cuda_tuning t = tune0;
                t.norm_router = true, t.norm_router_max_t = 8, t.moe_combine_early = v > 0, t.router_group = true;
                if (v >= 6) t.router_tcluster_max_t = 64, t.router_tcluster_tb = 8, t.gemv_early = v == 6;
                msm_cuda_exec ex = {.stream = st, .tune = &t};
                bool grp = v > 0 && v != 5, nr = v == 3 || v == 4;
                if (nr && !msm_cuda_norm_router_fits(T, E, H, &t)) continue;
                cr_assert(msm_cuda_moe_groups(&ma, &t), "the path groups: T=%d H=%d", T, H);
                cr_assert(msm_cuda_router_groups(&ma, &t), "the router groups: T=%d H=%d", T, H);
                /* the experts with their combine kernel, then with the combine in the add + norm */
                for (int d = 0; d < 2; d++) {
                    CK(cudaMemsetAsync(di, 0x7f, (size_t)T * k * 4, st)); /* out of range: a stale id would show */
                    CK(cudaMemsetAsync(dw, 0xff, (size_t)T * k * 4, st));
                    if (d == 0) CK(cudaMemsetAsync(dy, 0xff, ny * 4, st));
                    if (d == 1) CK(cudaMemsetAsync(ds, 0xff, ny * 8, st));
                    CK(cudaMemsetAsync(ws, 0xff, wsb, st));
                    if (nr) {
                        CK(msm_cuda_norm_router_linear_topk(di, dw, dsum, dx, da, db, dn_w, 1e-6f, drw, T, E, H, k,
                                                            true, &ma, rws, rwsb, ex));
                    } else {
                        CK(msm_cuda_add_rmsnorm(dsum, dx, da, db, dn_w, T, H, 1e-6f, ex));
                        CK(msm_cuda_router_linear_topk(di, dw, dx, drw, T, E, H, k, true, grp ? &ma : NULL, rws, rwsb,
                                                       ex));
                    }
                    ma.grouped = grp;
                    if (d == 0) {
                        CK(msm_cuda_moe_experts_args(dy, &ma, ex));
                    } else {
                        cr_assert(msm_cuda_moe_defers(&ma, &t), "defers: T=%d H=%d", T, H);
                        CK(msm_cuda_moe_experts_deferred(&ma, ex));
                        CK(msm_cuda_moe_add_rmsnorm(ds, ds + ny, db, dn_w, 1e-6f, &ma, ex));
                    }
                    ma.grouped = false;
                }
                CK(cudaStreamSynchronize(st));
                down(v ? got : ref, dy, ny * 4);
                down(v ? gs : rs, ds, ny * 8);
                down(v ? gh : rh, ws, head);
                if (!v) continue;
                cr_expect(memcmp(ref, got, ny * 4) == 0, "experts differ: H=%d I=%d k=%d E=%d %s T=%d v=%d", H, I, k,
                          E, fp8 ? "fp8" : "bf16", T, v);
                cr_expect(memcmp(rs, gs, ny * 8) == 0, "add + norm differs: H=%d I=%d k=%d E=%d %s T=%d v=%d", H, I,
                          k, E, fp8 ? "fp8" : "bf16", T, v);
                cr_expect(memcmp(rh, gh, head) == 0, "grouping differs: H=%d I=%d k=%d E=%d %s T=%d v=%d", H, I, k, E,
                          fp8 ? "fp8" : "bf16", T, v);
            }
            /* refused: other experts' ids, another T, switched off */
            msm_cuda_tuning t = tune0;
            t.router_group = true;
            msm_cuda_exec ex = {.stream = st, .tune = &t};
            msm_cuda_moe_args bad = ma;
            bad.ids = (const int32_t *)dw;
            cr_expect_eq(msm_cuda_router_linear_topk(di, dw, dx, drw, T, E, H, k, true, &bad, rws, rwsb, ex), -EINVAL);
            bad = ma, bad.T = T - 1;
            cr_expect_eq(msm_cuda_router_linear_topk(di, dw, dx, drw, T, E, H, k, true, &bad, rws, rwsb, ex), -EINVAL);
            t.router_group = false;
            cr_expect(!msm_cuda_router_groups(&ma, &t), "switched off");
            cr_expect_eq(msm_cuda_router_linear_topk(di, dw, dx, drw, T, E, H, k, true, &ma, rws, rwsb, ex), -EINVAL);
            ma.grouped = true;
            t = tune0, t.moe_path = MSM_CUDA_MOE_PATH_PAIR;
            cr_expect(!msm_cuda_moe_groups(&ma, &t), "the pair GEMVs do not group");
            cr_expect_eq(msm_cuda_moe_experts_args(dy, &ma, ex), -EINVAL);
            CK(cudaStreamSynchronize(st));
            cudaFree(da), cudaFree(db), cudaFree(dx), cudaFree(dsum), cudaFree(dw), cudaFree(di), cudaFree(rws);
            cudaFree(ws), cudaFree(dy), cudaFree(ds);
            free(xa), free(xb), free(ref), free(got), free(rs), free(gs), free(rh), free(gh);
        }
        cudaFree(drw), cudaFree(dn_w), free(rb), free(rf), free(nb), free(nf);
        moe_weights_free(&mw);
    }
    cudaStreamDestroy(st);
}

Test(cuda_kernels, moe_experts_fp8_tiled_match_cpu, .timeout = 360) {
    need_gpu();
    enum { A = MSM_CUDA_MOE_PATH_AUTO, TL = MSM_CUDA_MOE_PATH_TILED, GG = MSM_CUDA_MOE_PATH_GROUPED_GEMV };
    /* Qwen3-30B-A3B expert shapes (H 2048, I 768, k 8, E 128; phase 0): the first T past the FP8
     * GEMVs, the batch buckets 128 and 256, the last tiled T (random_routing sends ~30% of the
     * pairs to 9 experts: ~150 tokens each at T = 512, so several 64-token passes and a partial
     * last one); forced tiled at T = 3 (one token tile) and 100; grouped GEMVs forced past 64
     * (dequantised: the tiled path takes AUTO and TILED only) */
    static const moe_run q3[] = {{65, A, -1}, {128, A, -1}, {256, A, -1}, {512, A, -1},
                                 {3, TL, -1}, {100, TL, -1}, {100, GG, -1}};
    moe_fp8_cases(q3, sizeof q3 / sizeof *q3, 2048, 768, 8, 128, 0, 0, -1, true);
    /* the TP slice of moe_experts_fp8_match_cpu (H 512, I 704 = 11 K steps of the down GEMM; at
     * phase 64 the first step has a scale block to itself, then every two steps share one), then
     * phase 64 on gate/up too; phase 16 on down: dequantised */
    static const moe_run tp[] = {{65, A, -1}, {100, A, -1}, {300, A, -1}, {40, TL, -1}};
    moe_fp8_cases(tp, sizeof tp / sizeof *tp, 512, 704, 4, 12, 0, 64, -1, true);
    moe_fp8_cases(tp, sizeof tp / sizeof *tp, 512, 704, 4, 12, 64, 64, -1, true);
    moe_fp8_cases(tp, sizeof tp / sizeof *tp, 512, 704, 4, 12, 0, 16, -1, true);
    /* H % 128 == 64 (the down GEMM's last row block half past H, clamped and never stored), I = 192
     * (3 column blocks, 3 K steps), gate/up phase 64 */
    static const moe_run odd[] = {{70, A, -1}, {200, A, -1}};
    moe_fp8_cases(odd, sizeof odd / sizeof *odd, 320, 192, 4, 10, 64, 0, -1, true);
    /* three experts: ~130 tokens each at T = 200, k = 2 (passes of 64, 64 and a partial one) */
    static const moe_run skew[] = {{200, A, -1}, {37, TL, -1}, {65, A, -1}};
    moe_fp8_cases(skew, sizeof skew / sizeof *skew, 256, 128, 2, 3, 0, 0, -1, true);
    /* fp8_native_max_t = 0: tiled from one token on */
    static const moe_run low[] = {{1, A, -1}, {5, A, -1}, {40, A, -1}};
    moe_fp8_cases(low, sizeof low / sizeof *low, 256, 128, 2, 6, 0, 0, 0, true);
    /* the switch off (MSM_CUDA_FP8_MOE_TILED=0): dequantised, the bf16 tiled GEMMs */
    static const moe_run off[] = {{65, A, -1}, {256, A, -1}, {8, TL, -1}};
    moe_fp8_cases(off, sizeof off / sizeof *off, 2048, 768, 8, 128, 0, 0, -1, false);
}

/* The FP8 tiled GEMMs with 16 or 32 tokens a pass (8 or 6 pipeline stages) and the auto rule give
 * the 64-token kernels' bits (each output the same sequence of MMAs and scaled step sums whatever
 * pass holds its token), and so do they with two K steps a pipeline stage (tuning fp8_tiled_ks =
 * 2: 4 or 3 stages of two sub-tiles; the 64-token pass keeps one step a stage); the 64-token ones
 * match the CPU on the float32 weights. Qwen3-30B-A3B expert shapes at 12-256 tokens, a TP slice
 * with down at phase 64 (11 K steps: fewer than 8 stages, and an odd count, so a last stage of one
 * step), and 200 x 2 pairs over 3 experts with gate/up at phase 64 (the two steps of a stage under
 * different scales; many passes of each size). */
Test(cuda_kernels, moe_fp8_tiled_pass_sizes_are_bitwise_equal, .timeout = 180) {
    need_gpu();
    /* H, I, k, E, T, gate/up phase, down phase */
    static const int shapes[][7] = {{2048, 768, 8, 128, 12, 0, 0},  {2048, 768, 8, 128, 33, 0, 0},
                                    {2048, 768, 8, 128, 128, 0, 0}, {2048, 768, 8, 128, 256, 0, 0},
                                    {512, 704, 4, 12, 100, 0, 64},  {256, 128, 2, 3, 200, 64, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int H = shapes[s][0], I = shapes[s][1], k = shapes[s][2], E = shapes[s][3], T = shapes[s][4];
        fp8_weight gu = fp8_make(E, 2 * I, H, shapes[s][5], false), dn = fp8_make(E, H, I, shapes[s][6], false);
        float *x = host_f32((size_t)T * H, 1.0f), *w = malloc((size_t)T * k * 4);
        int32_t *ids = malloc((size_t)T * k * 4);
        random_routing(ids, w, T, k, E);
        float *ref = malloc((size_t)T * H * 4), *out = malloc((size_t)T * H * 4), *base = malloc((size_t)T * H * 4);
        float *scratch = malloc((size_t)3 * I * 4);
        msm_cpu_moe_experts(ref, x, ids, w, gu.f, dn.f, T, H, I, k, scratch);
        float *dx = dev_up(x, (size_t)T * H * 4), *dw = dev_up(w, (size_t)T * k * 4), *dy = dev_poison((size_t)T * H * 4);
        int32_t *di = dev_up(ids, (size_t)T * k * 4);
        size_t wsb = msm_cuda_moe_experts_ws_bytes(T, H, I, k, E);
        void *ws = dev_poison(wsb);
        /* tokens a pass (0: by the tokens an expert), K steps a pipeline stage (tuning fp8_tiled_ks:
         * 2 at 16 / 32 tokens a pass; 64 keeps 1) */
        static const int arms[][2] = {{64, 1}, {32, 1}, {16, 1}, {0, 1}, {32, 2}, {16, 2}, {0, 2}, {64, 2}};
        for (int b = 0; b < (int)(sizeof arms / sizeof *arms); b++) {
            msm_cuda_tuning t = tune0;
            t.moe_path = MSM_CUDA_MOE_PATH_TILED;
            t.moe_tiled_bm = arms[b][0];
            t.fp8_tiled_ks = arms[b][1];
            cudaMemset(dy, 0xff, (size_t)T * H * 4);
            CK(msm_cuda_moe_experts_fp8(dy, dx, di, dw, gu.d, dn.d, T, H, I, k, E, ws, wsb, NULL, 0, EX_T(&t)));
            down(b ? out : base, dy, (size_t)T * H * 4);
            if (b == 0)
                CHECK_ERR(base, ref, (size_t)T * H, 2e-5, "fp8 tiled T=%d H=%d I=%d k=%d E=%d", T, H, I, k, E);
            else
                cr_assert(memcmp(out, base, (size_t)T * H * 4) == 0,
                          "fp8 tiled T=%d H=%d E=%d: %d tokens a pass, %d K steps a stage differ from 64, 1", T, H,
                          E, arms[b][0], arms[b][1]);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(di), cudaFree(dy), cudaFree(ws);
        free(x), free(w), free(ids), free(ref), free(out), free(base), free(scratch);
        fp8_free(&gu), fp8_free(&dn);
    }
}

/* ---- sample ---- */

/* For a row where GPU and CPU differ: the CPU's distance of u*kept from the nearest cumulative
 * boundary, relative to kept (rounding-level margins excuse a different pick). */
static double cpu_margin(const float *l, const msm_sample_params *sp, int V) {
    float *prob = malloc(V * 4), *tmp = malloc(V * 4);
    int am = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[am]) am = v;
    float sum = 0;
    for (int v = 0; v < V; v++) sum += (prob[v] = expf((l[v] - l[am]) / sp->temperature));
    for (int v = 0; v < V; v++) prob[v] /= sum;
    float thr = 0;
    double margin = 1.0;
    if (sp->top_k > 0 && sp->top_k < V) {
        memcpy(tmp, prob, V * 4);
        for (int j = 0; j < sp->top_k; j++) {
            int b = 0;
            for (int v = 1; v < V; v++)
                if (tmp[v] > tmp[b]) b = v;
            thr = tmp[b];
            tmp[b] = -1;
        }
    }
    if (sp->top_p > 0 && sp->top_p < 1) {
        memcpy(tmp, prob, V * 4);
        float mass = 0, level = 1;
        while (mass < sp->top_p) {
            int b = 0;
            for (int v = 1; v < V; v++)
                if (tmp[v] > tmp[b]) b = v;
            if (tmp[b] < 0) break;
            level = tmp[b];
            mass += tmp[b];
            tmp[b] = -1;
            double m = fabs((double)mass - sp->top_p);
            if (m < margin) margin = m;
        }
        if (level > thr) thr = level;
    }
    float kept = 0;
    for (int v = 0; v < V; v++) kept += prob[v] >= thr ? prob[v] : 0;
    double u = (double)msm_rng_uniform(sp->seed, sp->counter) * kept, c = 0;
    for (int v = 0; v < V; v++) {
        if (prob[v] < thr) continue;
        c += prob[v];
        double m = fabs(c - u) / kept;
        if (m < margin) margin = m;
    }
    free(prob), free(tmp);
    return margin;
}

Test(cuda_kernels, sample_greedy_and_seeded_match_cpu, .timeout = 60) {
    need_gpu();
    static const int vs[] = {7, 1000, 32000, 151936};
    for (size_t s = 0; s < sizeof vs / sizeof *vs; s++) {
        int V = vs[s], R = V > 100000 ? 24 : 64;
        float *l = host_f32((size_t)R * V, 3.0f);
        msm_sample_params *p = calloc(R, sizeof *p);
        for (int r = 0; r < R; r++) {
            static const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
            static const int tks[] = {0, 1, 5, 50};
            static const float tps[] = {1.0f, 0.9f, 0.5f, 0.95f};
            p[r].temperature = temps[r % 4];
            p[r].top_k = tks[(r / 4) % 4];
            p[r].top_p = tps[(r / 16) % 4];
            p[r].seed = rnd64();
            p[r].counter = (uint64_t)rndi(1000);
        }
        if (V > 7) { /* a tied maximum in a greedy row: the lowest id wins */
            l[5] = l[9] = 50.0f;
        }
        if (V > 9000) { /* ... across the arg-max's chunks too (rows 4 and 8 are greedy) */
            l[4 * (size_t)V + 8200] = l[4 * (size_t)V + 100] = 60.0f;
            l[8 * (size_t)V + V - 1] = l[8 * (size_t)V + 8191] = 60.0f;
        }
        int32_t *ref = malloc(R * 4), *out = malloc(R * 4), *out1 = malloc(R * 4);
        float *scratch = malloc((size_t)2 * V * 4);
        msm_cpu_sample(ref, l, p, R, V, scratch);
        /* rows ld = V + 3 floats apart on the device (a padded logits row), the pads huge: never read */
        size_t ld = (size_t)V + 3;
        float *lp = malloc((size_t)R * ld * 4);
        for (int r = 0; r < R; r++) {
            memcpy(lp + r * ld, l + (size_t)r * V, (size_t)V * 4);
            for (size_t k = (size_t)V; k < ld; k++) lp[r * ld + k] = 1e30f;
        }
        float *dl = dev_up(lp, (size_t)R * ld * 4);
        msm_sample_params *dp = dev_up(p, R * sizeof *p);
        int32_t *dout = dev_poison(R * 4);
        size_t wsb = msm_cuda_sample_ws_bytes(R, V);
        void *dws = dev_poison(wsb);
        /* the one-block scan of each row (no workspace), then the chunked arg-max: the same tokens */
        CK(msm_cuda_sample(dout, dl, ld, dp, R, V, NULL, 0, EX));
        down(out1, dout, R * 4);
        CK(msm_cuda_sample(dout, dl, ld, dp, R, V, dws, wsb, EX));
        down(out, dout, R * 4);
        cr_assert_eq(memcmp(out, out1, (size_t)R * 4), 0, "V=%d: the chunked arg-max changed a token", V);
        int excused = 0;
        for (int r = 0; r < R; r++) {
            cr_assert(out[r] >= 0 && out[r] < V, "V=%d row %d: token %d", V, r, out[r]);
            if (out[r] == ref[r]) continue;
            cr_assert(p[r].temperature > 0, "V=%d greedy row %d: %d, cpu %d", V, r, out[r], ref[r]);
            double m = cpu_margin(l + (size_t)r * V, &p[r], V);
            cr_assert(m < 1e-4, "V=%d row %d (T=%g k=%d p=%g): %d, cpu %d, margin %g", V, r,
                      p[r].temperature, p[r].top_k, p[r].top_p, out[r], ref[r], m);
            excused++;
        }
        cr_assert(excused <= R / 8, "V=%d: %d rows differ at rounding margins", V, excused);
        cudaFree(dl), cudaFree(dp), cudaFree(dout), cudaFree(dws);
        free(l), free(lp), free(p), free(ref), free(out), free(out1), free(scratch);
    }
}

/* A NaN or an infinity in a row: MSM_SAMPLE_NONFINITE, as the CPU twin says, for greedy and
 * sampled rows; the finite rows beside them are sampled as usual. */
Test(cuda_kernels, sample_flags_nonfinite_rows_like_cpu, .timeout = 60) {
    need_gpu();
    enum { R = 8, V = 5000 };
    float *l = host_f32((size_t)R * V, 3.0f);
    msm_sample_params p[R];
    for (int r = 0; r < R; r++)
        p[r] = (msm_sample_params){.temperature = r % 2 ? 0.8f : 0.0f, .top_p = 1.0f, .seed = (uint64_t)r};
    l[0 * V + 17] = NAN;
    l[1 * V + 4999] = NAN;
    l[2 * V + 0] = INFINITY;
    l[3 * V + 2500] = -INFINITY;
    int32_t ref[R], out[R];
    float *scratch = malloc((size_t)2 * V * 4);
    msm_cpu_sample(ref, l, p, R, V, scratch);
    float *dl = dev_up(l, (size_t)R * V * 4);
    msm_sample_params *dp = dev_up(p, sizeof p);
    int32_t *dout = dev_poison(R * 4);
    size_t wsb = msm_cuda_sample_ws_bytes(R, V);
    void *dws = dev_poison(wsb);
    for (int chunked = 0; chunked < 2; chunked++) { /* the row scan, then the chunked arg-max */
        CK(msm_cuda_sample(dout, dl, V, dp, R, V, chunked ? dws : NULL, chunked ? wsb : 0, EX));
        down(out, dout, R * 4);
        for (int r = 0; r < 4; r++) {
            cr_assert_eq(ref[r], MSM_SAMPLE_NONFINITE, "cpu row %d", r);
            cr_assert_eq(out[r], MSM_SAMPLE_NONFINITE, "row %d (chunked %d): %d", r, chunked, out[r]);
        }
        for (int r = 4; r < R; r++)
            cr_assert(out[r] >= 0 && out[r] < V, "row %d (chunked %d): %d", r, chunked, out[r]);
    }
    cudaFree(dl), cudaFree(dp), cudaFree(dout), cudaFree(dws);
    free(l), free(scratch);
}

/* ---- timing (benchmark; runs only with MSM_CUDA_BENCH set) ---- */

/* QK_NORM in one launch: per-head RMSNorm of the q and k heads, v copied; in place too. */
Test(cuda_kernels, qk_norm_matches_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][5] = {{1, 32, 4, 128, 0}, {37, 8, 8, 64, 1}, {5, 6, 2, 256, 0},
                                    {3, 4, 1, 80, 1},   {70, 16, 4, 128, 0}}; /* T, nh, kvh, hd, inplace */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3], inplace = shapes[s][4];
        int C = (nh + 2 * kvh) * hd;
        size_t n = (size_t)T * C;
        float *x = host_f32(n, 2.0f), *ref = malloc(n * 4), *out = malloc(n * 4), *wqf, *wkf;
        uint16_t *wq = host_bf16(hd, 1.0f, &wqf), *wk = host_bf16(hd, 1.0f, &wkf);
        memcpy(ref, x, n * 4);
        for (int t = 0; t < T; t++) {
            float *row = ref + (size_t)t * C;
            msm_cpu_rmsnorm(row, row, wqf, nh, hd, 1e-6f);
            msm_cpu_rmsnorm(row + (size_t)nh * hd, row + (size_t)nh * hd, wkf, kvh, hd, 1e-6f);
        }
        float *dx = dev_up(x, n * 4), *dout = inplace ? dx : dev_poison(n * 4);
        uint16_t *dwq = dev_up(wq, hd * 2), *dwk = dev_up(wk, hd * 2);
        CK(msm_cuda_qk_norm(dout, dx, dwq, dwk, T, C, nh, kvh, hd, 1e-6f, EX));
        down(out, dout, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "qk_norm T=%d nh=%d kvh=%d hd=%d inplace=%d", T, nh, kvh, hd, inplace);
        for (int t = 0; t < T; t++) /* the v heads are copied exactly */
            cr_assert(memcmp(out + (size_t)t * C + (size_t)(nh + kvh) * hd, x + (size_t)t * C + (size_t)(nh + kvh) * hd,
                             (size_t)kvh * hd * 4) == 0, "v heads of token %d changed", t);
        cudaFree(dx), cudaFree(dwq), cudaFree(dwk);
        if (!inplace) cudaFree(dout);
        free(x), free(ref), free(out), free(wqf), free(wkf), free(wq), free(wk);
    }
}

/* rope_kv (ROPE that also fills the cache) = rope_copy then kv_write_ld from its output, bitwise:
 * the rotated rows and both caches, with a padding row (slot -1) left unwritten. */
Test(cuda_kernels, rope_kv_equals_rope_copy_then_kv_write, .timeout = 60) {
    need_gpu();
    static const int shapes[][4] = {{1, 16, 16, 128}, {7, 6, 2, 64}, {40, 4, 4, 32}, {3, 8, 1, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3];
        int C = (nh + 2 * kvh) * hd, nslots = 4 * MSM_KV_BLOCK;
        size_t n = (size_t)T * C, cache = (size_t)nslots * kvh * hd;
        float *x = host_f32(n, 1.0f);
        int32_t *pos = malloc(T * 4), *slot = malloc(T * 4);
        for (int t = 0; t < T; t++) pos[t] = rndi(4000), slot[t] = t == T - 1 && T > 1 ? -1 : (t * 7) % nslots;
        float *dx = dev_up(x, n * 4), *o1 = dev_poison(n * 4), *o2 = dev_poison(n * 4);
        int32_t *dpos = dev_up(pos, T * 4), *dslot = dev_up(slot, T * 4);
        uint16_t *k1 = dev_poison(cache * 2), *v1 = dev_poison(cache * 2), *k2 = dev_poison(cache * 2),
                 *v2 = dev_poison(cache * 2);
        CK(msm_cuda_rope_copy(o1, dx, dpos, T, C, nh + kvh, hd, hd, 1e6f, EX));
        CK(msm_cuda_kv_write_ld(k1, v1, o1 + (size_t)nh * hd, o1 + (size_t)(nh + kvh) * hd, (size_t)C, dslot, T, kvh, hd, EX));
        CK(msm_cuda_rope_kv(o2, dx, dpos, dslot, k2, v2, T, nh, kvh, hd, hd, 1e6f, EX));
        float *h1 = malloc(n * 4), *h2 = malloc(n * 4);
        uint16_t *c1 = malloc(cache * 2), *c2 = malloc(cache * 2);
        down(h1, o1, n * 4), down(h2, o2, n * 4);
        cr_assert(memcmp(h1, h2, n * 4) == 0, "rotated rows differ (T=%d nh=%d kvh=%d hd=%d)", T, nh, kvh, hd);
        down(c1, k1, cache * 2), down(c2, k2, cache * 2);
        cr_assert(memcmp(c1, c2, cache * 2) == 0, "K caches differ (T=%d nh=%d kvh=%d hd=%d)", T, nh, kvh, hd);
        down(c1, v1, cache * 2), down(c2, v2, cache * 2);
        cr_assert(memcmp(c1, c2, cache * 2) == 0, "V caches differ (T=%d nh=%d kvh=%d hd=%d)", T, nh, kvh, hd);
        cudaFree(dx), cudaFree(o1), cudaFree(o2), cudaFree(dpos), cudaFree(dslot);
        cudaFree(k1), cudaFree(v1), cudaFree(k2), cudaFree(v2);
        free(x), free(pos), free(slot), free(h1), free(h2), free(c1), free(c2);
    }
}

/* QK_NORM + ROPE_KV_WRITE in one kernel (msm_cuda_qk_norm_rope_kv) = qk_norm then rope_kv on its
 * output, bitwise: the rows and both caches, with a padding row (slot -1) left unwritten, full and
 * partial rotary (rot 64..256), in place; a rotary width or head size it does not take is refused
 * with -ENOTSUP (the backend then runs the two kernels). Both kernels also at decode (positions,
 * slots, weights, cosines and sines before the PDL wait: msm_cuda_tuning.small_early), the same
 * bits. */
Test(cuda_kernels, qk_norm_rope_kv_equals_qk_norm_then_rope_kv, .timeout = 60) {
    need_gpu();
    /* T, nh, kvh, hd, rot, inplace */
    static const int shapes[][6] = {{1, 32, 4, 128, 128, 0}, {8, 32, 4, 128, 128, 1}, {7, 12, 2, 128, 64, 0},
                                    {40, 4, 4, 64, 64, 0},   {3, 8, 1, 256, 256, 1},  {5, 6, 2, 256, 192, 0},
                                    {130, 16, 4, 128, 128, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3], rot = shapes[s][4];
        /* slots (7t) % nslots all distinct: a shared slot would make the cache's winner a race */
        int inplace = shapes[s][5], C = (nh + 2 * kvh) * hd, nslots = (7 * T / MSM_KV_BLOCK + 1) * MSM_KV_BLOCK;
        size_t n = (size_t)T * C, cache = (size_t)nslots * kvh * hd;
        float *x = host_f32(n, 2.0f), *wqf, *wkf;
        uint16_t *wq = host_bf16(hd, 1.0f, &wqf), *wk = host_bf16(hd, 1.0f, &wkf);
        int32_t *pos = malloc(T * 4), *slot = malloc(T * 4);
        for (int t = 0; t < T; t++) pos[t] = rndi(4000), slot[t] = t == T - 1 && T > 1 ? -1 : (t * 7) % nslots;
        float *dx = dev_up(x, n * 4), *o1 = dev_poison(n * 4), *o2 = inplace ? dev_up(x, n * 4) : dev_poison(n * 4);
        float *dn = dev_poison(n * 4);
        int32_t *dpos = dev_up(pos, T * 4), *dslot = dev_up(slot, T * 4);
        uint16_t *dwq = dev_up(wq, hd * 2), *dwk = dev_up(wk, hd * 2);
        uint16_t *k1 = dev_poison(cache * 2), *v1 = dev_poison(cache * 2), *k2 = dev_poison(cache * 2),
                 *v2 = dev_poison(cache * 2);
        CK(msm_cuda_qk_norm(dn, dx, dwq, dwk, T, C, nh, kvh, hd, 1e-6f, EX));
        CK(msm_cuda_rope_kv(o1, dn, dpos, dslot, k1, v1, T, nh, kvh, hd, rot, 1e6f, EX));
        float *h1 = malloc(n * 4), *h2 = malloc(n * 4);
        uint16_t *c1 = malloc(cache * 2), *c2 = malloc(cache * 2);
        down(h1, o1, n * 4);
        for (int dec = 0; dec < 3; dec++) { /* the fused kernel, then at decode; then rope_kv at decode */
            msm_cuda_exec ed = {.stream = 0, .tune = &tune0, .decode = dec > 0};
            if (inplace && dec < 2) cr_assert_eq(cudaMemcpy(o2, dx, n * 4, cudaMemcpyDeviceToDevice), cudaSuccess);
            cr_assert_eq(cudaMemset(k2, 0xff, cache * 2), cudaSuccess); /* as dev_poison left k1, v1 */
            cr_assert_eq(cudaMemset(v2, 0xff, cache * 2), cudaSuccess);
            if (dec < 2)
                CK(msm_cuda_qk_norm_rope_kv(o2, inplace ? o2 : dx, dwq, dwk, dpos, dslot, k2, v2, T, nh, kvh, hd, rot,
                                            1e6f, 1e-6f, ed));
            else
                CK(msm_cuda_rope_kv(o2, dn, dpos, dslot, k2, v2, T, nh, kvh, hd, rot, 1e6f, ed));
            down(h2, o2, n * 4);
            cr_assert(memcmp(h1, h2, n * 4) == 0, "rows differ (T=%d nh=%d kvh=%d hd=%d rot=%d, variant %d)", T, nh, kvh,
                      hd, rot, dec);
            down(c1, k1, cache * 2), down(c2, k2, cache * 2);
            cr_assert(memcmp(c1, c2, cache * 2) == 0, "K caches differ (T=%d nh=%d kvh=%d hd=%d rot=%d, variant %d)", T,
                      nh, kvh, hd, rot, dec);
            down(c1, v1, cache * 2), down(c2, v2, cache * 2);
            cr_assert(memcmp(c1, c2, cache * 2) == 0, "V caches differ (T=%d nh=%d kvh=%d hd=%d rot=%d, variant %d)", T,
                      nh, kvh, hd, rot, dec);
        }
        cudaFree(dx), cudaFree(o1), cudaFree(o2), cudaFree(dn), cudaFree(dpos), cudaFree(dslot), cudaFree(dwq),
            cudaFree(dwk);
        cudaFree(k1), cudaFree(v1), cudaFree(k2), cudaFree(v2);
        free(x), free(wqf), free(wkf), free(wq), free(wk), free(pos), free(slot), free(h1), free(h2), free(c1), free(c2);
    }
    /* what it does not take */
    int32_t *dp = dev(64), *dsl = dev(64);
    float *db = dev(1 << 20);
    uint16_t *dc = dev(1 << 20);
    cr_expect_eq(msm_cuda_qk_norm_rope_kv(db, db, dc, dc, dp, dsl, dc, dc, 1, 4, 2, 128, 96, 1e6f, 1e-6f, EX), -ENOTSUP);
    cr_expect_eq(msm_cuda_qk_norm_rope_kv(db, db, dc, dc, dp, dsl, dc, dc, 1, 4, 2, 320, 320, 1e6f, 1e-6f, EX), -ENOTSUP);
    cr_expect_eq(msm_cuda_qk_norm_rope_kv(db, db, dc, dc, dp, dsl, dc, dc, 1, 4, 2, 128, 130, 1e6f, 1e-6f, EX), -EINVAL);
    cudaFree(dp), cudaFree(dsl), cudaFree(db), cudaFree(dc);
}

/* A qkv LINEAR + ROPE_KV_WRITE comparison (the two tests below): x [T, K], the weight [N, K] and
 * bias, positions and slots (slot0 + step * t, -1 for token 1: a padding row), the fused and the
 * two-kernel outputs with their caches, and host copies to compare. */
typedef struct lrk_case {
    int T, N, K, nh, kvh, hd, rot;
    size_t n, cache;
    float *x, *wf, *bf, *dx, *y, *o1, *o2, *h1, *h2;
    uint16_t *w, *b, *dw, *db, *k1, *v1, *k2, *v2, *c1, *c2;
    int32_t *dpos, *dslot;
} lrk_case;

static lrk_case lrk_case_new(int T, int nh, int kvh, int hd, int rot, int K, int bias, int slot0, int step) {
    lrk_case c = {.T = T, .N = (nh + 2 * kvh) * hd, .K = K, .nh = nh, .kvh = kvh, .hd = hd, .rot = rot};
    c.n = (size_t)T * c.N, c.cache = (size_t)2 * MSM_KV_BLOCK * kvh * hd;
    c.x = host_f32((size_t)T * K, 1.0f);
    c.w = host_bf16((size_t)c.N * K, 0.05f, &c.wf);
    c.b = bias ? host_bf16(c.N, 0.5f, &c.bf) : NULL;
    int32_t pos[16], slot[16];
    cr_assert(T <= 16);
    for (int t = 0; t < T; t++) pos[t] = rndi(4000), slot[t] = t == 1 ? -1 : slot0 + step * t;
    c.dx = dev_up(c.x, (size_t)T * K * 4), c.y = dev_poison(c.n * 4), c.o1 = dev_poison(c.n * 4);
    c.o2 = dev_poison(c.n * 4);
    c.dw = dev_up(c.w, (size_t)c.N * K * 2), c.db = c.b ? dev_up(c.b, c.N * 2) : NULL;
    c.dpos = dev_up(pos, T * 4), c.dslot = dev_up(slot, T * 4);
    c.k1 = dev_poison(c.cache * 2), c.v1 = dev_poison(c.cache * 2), c.k2 = dev_poison(c.cache * 2);
    c.v2 = dev_poison(c.cache * 2);
    c.h1 = malloc(c.n * 4), c.h2 = malloc(c.n * 4), c.c1 = malloc(c.cache * 2), c.c2 = malloc(c.cache * 2);
    return c;
}

static void lrk_case_free(lrk_case *c) {
    cudaFree(c->dx), cudaFree(c->y), cudaFree(c->o1), cudaFree(c->o2), cudaFree(c->dw), cudaFree(c->db);
    cudaFree(c->dpos), cudaFree(c->dslot), cudaFree(c->k1), cudaFree(c->v1), cudaFree(c->k2), cudaFree(c->v2);
    free(c->x), free(c->wf), free(c->w), free(c->bf), free(c->b), free(c->h1), free(c->h2), free(c->c1), free(c->c2);
}

/* msm_cuda_linear_rope_kv under ex against msm_cuda_linear then msm_cuda_rope_kv: the rows and both
 * whole caches bitwise (shape si, variant var in the messages). */
static void lrk_check(lrk_case *c, msm_cuda_exec ex, size_t si, int var) {
    int T = c->T, N = c->N, K = c->K, nh = c->nh, kvh = c->kvh, hd = c->hd, rot = c->rot;
    size_t n = c->n, cache = c->cache;
    cr_assert(msm_cuda_linear_rope_kv_fits(T, N, K, nh, kvh, hd, rot, c->dw, c->dx, ex.tune), "shape %zu", si);
    cr_assert_eq(cudaMemset(c->k1, 0xff, cache * 2), cudaSuccess);
    cr_assert_eq(cudaMemset(c->v1, 0xff, cache * 2), cudaSuccess);
    cr_assert_eq(cudaMemset(c->k2, 0xff, cache * 2), cudaSuccess);
    cr_assert_eq(cudaMemset(c->v2, 0xff, cache * 2), cudaSuccess);
    CK(msm_cuda_linear(c->y, c->dx, c->dw, c->db, T, N, K, NULL, NULL, 0, ex));
    CK(msm_cuda_rope_kv(c->o1, c->y, c->dpos, c->dslot, c->k1, c->v1, T, nh, kvh, hd, rot, 1e6f, ex));
    CK(msm_cuda_linear_rope_kv(c->o2, c->dx, c->dw, c->db, c->dpos, c->dslot, c->k2, c->v2, T, K, nh, kvh, hd, rot,
                               1e6f, ex));
    down(c->h1, c->o1, n * 4), down(c->h2, c->o2, n * 4);
    cr_assert(memcmp(c->h1, c->h2, n * 4) == 0, "rows differ (shape %zu, variant %d)", si, var);
    down(c->c1, c->k1, cache * 2), down(c->c2, c->k2, cache * 2);
    cr_assert(memcmp(c->c1, c->c2, cache * 2) == 0, "K caches differ (shape %zu, variant %d)", si, var);
    down(c->c1, c->v1, cache * 2), down(c->c2, c->v2, cache * 2);
    cr_assert(memcmp(c->c1, c->c2, cache * 2) == 0, "V caches differ (shape %zu, variant %d)", si, var);
}

/* The qkv LINEAR + ROPE_KV_WRITE in one kernel on the MMV (3-8 tokens; msm_cuda_linear_rope_kv on the
 * block-sliced MMV with its rows regrouped by head halves, tuning linear_rope_mmv) equals
 * msm_cuda_linear then msm_cuda_rope_kv bitwise: the rotated rows and both whole caches, with and
 * without a bias, a padding row (slot -1), 16 and 32 rows a warp (mmv_nj 2 / 4) and the MMV's own
 * choice; and it is not taken with the switch off or partial rotary. */
Test(cuda_kernels, linear_rope_kv_mmv_equals_linear_then_rope_kv, .timeout = 60) {
    need_gpu();
    /* T, nh, kvh, hd, K, bias */
    static const int shapes[][6] = {{3, 16, 16, 128, 2048, 1}, {8, 16, 16, 128, 2048, 1}, {5, 32, 4, 128, 4096, 0},
                                    {6, 8, 2, 64, 1024, 1},    {4, 12, 2, 128, 1024, 0}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        lrk_case c = lrk_case_new(shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][3],
                                  shapes[si][4], shapes[si][5], 3, 2);
        for (int var = 0; var < 3; var++) { /* the MMV's own rule; 16 rows a warp; 32 */
            msm_cuda_tuning tn = tune0;
            tn.linear_rope = tn.linear_rope_mmv = true;
            tn.mmv_nj = var == 0 ? tune0.mmv_nj : var == 1 ? 2 : 4;
            lrk_check(&c, (msm_cuda_exec){.stream = 0, .tune = &tn, .decode = true}, si, var);
        }
        msm_cuda_tuning off = tune0;
        off.linear_rope = true, off.linear_rope_mmv = false;
        cr_expect(!msm_cuda_linear_rope_kv_fits(c.T, c.N, c.K, c.nh, c.kvh, c.hd, c.rot, c.dw, c.dx, &off),
                  "switch off");
        off.linear_rope_mmv = true;
        cr_expect(!msm_cuda_linear_rope_kv_fits(c.T, c.N, c.K, c.nh, c.kvh, c.hd, c.rot / 2, c.dw, c.dx, &off),
                  "partial rotary");
        lrk_case_free(&c);
    }
}

/* The gate/up LINEAR + SWIGLU in one kernel (msm_cuda_linear_swiglu, one or two tokens) equals
 * msm_cuda_linear then msm_cuda_swiglu bitwise: Qwen1.5-MoE's shared expert (I 5632, K 2048), an
 * odd I (the last block's second output absent), K 4096 and 1024, with the GEMV's wider loads at one
 * token (gemv_u8 / gemv_u16), the pipelined rows at two and rows_pipe off, 2 and 4 rows a warp; and what it
 * does not take
 * (three tokens, the MMV at two, the switch off, a misaligned x). */
Test(cuda_kernels, linear_swiglu_equals_linear_then_swiglu, .timeout = 60) {
    need_gpu();
    static const int shapes[][3] = {{1, 5632, 2048}, {2, 5632, 2048}, {1, 1409, 4096},
                                    {2, 1409, 1024}, {1, 768, 1024},  {2, 131, 544}}; /* T, I, K */
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int T = shapes[si][0], I = shapes[si][1], K = shapes[si][2], N = 2 * I;
        size_t na = (size_t)T * I, ng = (size_t)T * N;
        float *x = host_f32((size_t)T * K + 4, 1.0f), *wf;
        uint16_t *w = host_bf16((size_t)N * K, 0.05f, &wf);
        float *dx = dev_up(x, ((size_t)T * K + 4) * 4), *gu = dev_poison(ng * 4), *a1 = dev_poison(na * 4),
              *a2 = dev_poison(na * 4);
        uint16_t *dw = dev_up(w, (size_t)N * K * 2);
        float *h1 = malloc(na * 4), *h2 = malloc(na * 4);
        for (int var = 0; var < 5; var++) { /* plain; gemv_u8 + gemv_u16; rows_pipe off; 2, 4 rows a warp */
            msm_cuda_tuning tn = tune0;
            tn.linear_swiglu = true;
            tn.gemv_u8 = tn.gemv_u16 = var == 1;
            if (var == 2) tn.rows_pipe = 0;
            tn.linear_swiglu_rows = var == 3 ? 2 : var == 4 ? 4 : 1;
            msm_cuda_exec ex = {.stream = 0, .tune = &tn, .decode = var == 1};
            cr_assert(msm_cuda_linear_swiglu_fits(T, I, K, dw, dx, &tn), "shape %zu", si);
            cr_assert_eq(cudaMemset(a2, 0xff, na * 4), cudaSuccess);
            CK(msm_cuda_linear(gu, dx, dw, NULL, T, N, K, NULL, NULL, 0, ex));
            CK(msm_cuda_swiglu(a1, gu, T, I, ex));
            CK(msm_cuda_linear_swiglu(a2, dx, dw, T, I, K, ex));
            down(h1, a1, na * 4), down(h2, a2, na * 4);
            cr_assert(memcmp(h1, h2, na * 4) == 0, "activations differ (shape %zu, variant %d)", si, var);
            /* the plain GEMV at 2 rows a warp on the aux stream (tuning aux_gemv_rows): the same bits */
            msm_cuda_tuning ta = tn;
            ta.aux_gemv_rows = 2;
            msm_cuda_exec ea = ex;
            ea.tune = &ta, ea.on_aux = true;
            CK(msm_cuda_linear(a2, dx, dw, NULL, T, I, K, NULL, NULL, 0, ea));
            CK(msm_cuda_linear(a1, dx, dw, NULL, T, I, K, NULL, NULL, 0, ex));
            down(h1, a1, na * 4), down(h2, a2, na * 4);
            cr_assert(memcmp(h1, h2, na * 4) == 0, "aux GEMV at 2 rows differs (shape %zu, variant %d)", si, var);
        }
        /* not taken: the switch off; three tokens; at two tokens the MMV; x not 16-byte aligned */
        msm_cuda_tuning off = tune0;
        off.linear_swiglu = false;
        cr_expect(!msm_cuda_linear_swiglu_fits(T, I, K, dw, dx, &off));
        msm_cuda_exec eo = {.stream = 0, .tune = &off};
        cr_expect_eq(msm_cuda_linear_swiglu(a2, dx, dw, T, I, K, eo), -ENOTSUP);
        msm_cuda_tuning on = tune0;
        on.linear_swiglu = true;
        if (T == 2) {
            msm_cuda_tuning mmv = on;
            mmv.mmv_min_t = 2;
            cr_expect(!msm_cuda_linear_swiglu_fits(T, I, K, dw, dx, &mmv));
        }
        cr_expect(!msm_cuda_linear_swiglu_fits(3, I, K, dw, dx, &on));
        cr_expect(!msm_cuda_linear_swiglu_fits(T, I, K, dw, dx + 1, &on));
        cudaFree(dx), cudaFree(gu), cudaFree(a1), cudaFree(a2), cudaFree(dw);
        free(x), free(wf), free(w), free(h1), free(h2);
    }
}

/* ADD_RMSNORM + the gate/up LINEAR on its norm + SWIGLU in one launch (msm_cuda_norm_linear_swiglu)
 * gives the three kernels' bits: the residual sum, the norm and the activations, at one and two
 * tokens; Qwen1.5-MoE's shared expert (I 5632, K 2048: 8 values a norm thread), an odd I (a block's
 * last outputs past I), K 1024 and 768 (4 values); 2 and 4 rows a warp, loads before the PDL wait
 * or after it, software-pipelined rows or not; the inputs written by the kernel just before it on
 * poisoned buffers (a read ahead of its PDL wait would show); and what it does not take (the switch
 * off, three tokens, a K without a norm layout, a misaligned weight) refused with -EINVAL. */
Test(cuda_kernels, norm_linear_swiglu_equals_add_rmsnorm_linear_swiglu, .timeout = 120) {
    need_gpu();
    static const int shapes[][2] = {{5632, 2048}, {1409, 2048}, {768, 1024}, {131, 768}}; /* I, K */
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int I = shapes[si][0], K = shapes[si][1], N = 2 * I, Tm = 2;
        size_t nk = (size_t)Tm * K, na = (size_t)Tm * I;
        float *xa = host_f32(nk, 1.0f), *xb = host_f32(nk, 1.0f), *wf, *nf;
        uint16_t *w = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *nb = host_bf16(K, 1.0f, &nf);
        float *d0 = dev_up(xa, nk * 4), *d1 = dev_up(xb, nk * 4), *da = dev(nk * 4), *db = dev(nk * 4), *dz = dev(nk * 4);
        CK(cudaMemset(dz, 0, nk * 4));
        float *dsum = dev(nk * 4), *dout = dev(nk * 4), *gu = dev((size_t)Tm * N * 4), *dact = dev(na * 4);
        uint16_t *dw = dev_up(w, (size_t)N * K * 2), *dn = dev_up(nb, (size_t)K * 2);
        float *r[3], *g[3];
        for (int i = 0; i < 3; i++) r[i] = malloc(nk > na ? nk * 4 : na * 4), g[i] = malloc(nk > na ? nk * 4 : na * 4);
        for (int T = 1; T <= 2; T++)
            /* the three kernels; one at 2 rows a warp, early loads; at 4; loads after the wait; without
             * the software pipelining (msm_cuda_tuning.rows_pipe) */
            for (int v = 0; v < 5; v++) {
                msm_cuda_tuning t = tune0;
                t.norm_linear_swiglu = t.norm_linear = true;
                t.norm_swiglu_rows = v == 2 ? 4 : 2;
                t.gemv_early = v != 3;
                if (v == 4) t.rows_pipe = 0;
                msm_cuda_exec ex = {.stream = st, .tune = &t};
                cr_assert(msm_cuda_norm_linear_swiglu_fits(T, I, K, dw, &t), "fits T=%d I=%d K=%d", T, I, K);
                CK(cudaMemsetAsync(da, 0xff, nk * 4, st));
                CK(cudaMemsetAsync(db, 0xff, nk * 4, st));
                CK(cudaMemsetAsync(dsum, 0xff, nk * 4, st));
                CK(cudaMemsetAsync(dout, 0xff, nk * 4, st));
                CK(cudaMemsetAsync(dact, 0xff, na * 4, st));
                CK(msm_cuda_add(da, d0, d1, (size_t)T * K, ex));
                CK(msm_cuda_add(db, d1, dz, (size_t)T * K, ex));
                if (v == 0) {
                    CK(msm_cuda_add_rmsnorm(dsum, dout, da, db, dn, T, K, 1e-6f, ex));
                    CK(msm_cuda_linear(gu, dout, dw, NULL, T, N, K, NULL, NULL, 0, ex));
                    CK(msm_cuda_swiglu(dact, gu, T, I, ex));
                } else {
                    CK(msm_cuda_norm_linear_swiglu(dact, dsum, dout, da, db, dn, 1e-6f, dw, T, I, K, ex));
                }
                CK(cudaStreamSynchronize(st));
                float **o = v == 0 ? r : g;
                down(o[0], dsum, (size_t)T * K * 4), down(o[1], dout, (size_t)T * K * 4);
                down(o[2], dact, (size_t)T * I * 4);
                if (v == 0) continue;
                cr_expect(memcmp(r[0], g[0], (size_t)T * K * 4) == 0, "sum differs: T=%d I=%d K=%d v=%d", T, I, K, v);
                cr_expect(memcmp(r[1], g[1], (size_t)T * K * 4) == 0, "norm differs: T=%d I=%d K=%d v=%d", T, I, K, v);
                cr_expect(memcmp(r[2], g[2], (size_t)T * I * 4) == 0, "act differs: T=%d I=%d K=%d v=%d", T, I, K, v);
            }
        msm_cuda_tuning t = tune0;
        t.norm_linear = true;
        msm_cuda_exec ex = {.stream = st, .tune = &t};
        cr_expect(!msm_cuda_norm_linear_swiglu_fits(1, I, K, dw, &t), "switched off");
        cr_expect_eq(msm_cuda_norm_linear_swiglu(dact, dsum, dout, da, db, dn, 1e-6f, dw, 1, I, K, ex), -EINVAL);
        t.norm_linear_swiglu = true;
        cr_expect(!msm_cuda_norm_linear_swiglu_fits(3, I, K, dw, &t), "past 2 tokens");
        cr_expect(!msm_cuda_norm_linear_swiglu_fits(1, I, 4096, dw, &t), "K 4096: no norm layout");
        cr_expect(!msm_cuda_norm_linear_swiglu_fits(1, I, K, dw + 1, &t), "misaligned weight");
        cr_expect_eq(msm_cuda_norm_linear_swiglu(dact, dsum, dout, da, db, dn, 1e-6f, dw, 3, I, K, ex), -EINVAL);
        cudaFree(d0), cudaFree(d1), cudaFree(da), cudaFree(db), cudaFree(dz), cudaFree(dsum), cudaFree(dout);
        cudaFree(gu), cudaFree(dact), cudaFree(dw), cudaFree(dn);
        for (int i = 0; i < 3; i++) free(r[i]), free(g[i]);
        free(xa), free(xb), free(wf), free(nf), free(w), free(nb);
    }
    cudaStreamDestroy(st);
}

/* ADD_RMSNORM + the qkv LINEAR on its norm + QK_NORM + ROPE_KV_WRITE in one launch, a head's blocks
 * one cluster (msm_cuda_norm_linear_qk_rope), gives the bits of the norm-in GEMV
 * (msm_cuda_norm_linear) followed by msm_cuda_qk_norm_rope_kv: the residual sum, the norm, the
 * rotated rows and both whole caches; Qwen3-30B-A3B's shapes (hd 128 on clusters of 8, full
 * rotary), a GLM-style partial rotary with a qkv bias, hd 64 (clusters of 4, 4 values a norm
 * thread); bf16 at one and two tokens (the second a padding row, slot -1: not cached), FP8 at one
 * with either decode; weights requested before the PDL wait or after it, the rotary before the
 * loads (decode) or after the GEMV, bf16 rows software-pipelined or not; the inputs written by the
 * kernels just before on poisoned buffers; and what it does not take refused with -EINVAL. */
Test(cuda_kernels, norm_linear_qk_rope_equals_norm_linear_then_qk_norm_rope_kv, .timeout = 180) {
    need_gpu();
    static const int shapes[][6] = {{2048, 32, 4, 128, 128, 0}, {2048, 16, 2, 128, 64, 1}, {1024, 8, 2, 64, 64, 0}};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int K = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3], rot = shapes[s][4], Tm = 2;
        int N = (nh + 2 * kvh) * hd, nslots = 4 * MSM_KV_BLOCK;
        size_t nk = (size_t)Tm * K, ny = (size_t)Tm * N, cache = (size_t)nslots * kvh * hd;
        float *xa = host_f32(nk, 1.0f), *xb = host_f32(nk, 1.0f), *wf, *nf, *bf = NULL, *wqf, *wkf;
        uint16_t *wb = host_bf16((size_t)N * K, 1.0f / sqrtf((float)K), &wf), *nb = host_bf16(K, 1.0f, &nf);
        uint16_t *bb = shapes[s][5] ? host_bf16(N, 0.5f, &bf) : NULL;
        uint16_t *wq = host_bf16(hd, 1.0f, &wqf), *wk = host_bf16(hd, 1.0f, &wkf);
        fp8_weight w8 = fp8_make(1, N, K, 0, false);
        int32_t pos[2] = {rndi(4000), rndi(4000)}, slot[2] = {rndi(nslots), -1};
        float *d0 = dev_up(xa, nk * 4), *d1 = dev_up(xb, nk * 4), *da = dev(nk * 4), *db = dev(nk * 4), *dz = dev(nk * 4);
        CK(cudaMemset(dz, 0, nk * 4));
        float *dsum = dev(nk * 4), *dout = dev(nk * 4), *dqkv = dev(ny * 4), *dy = dev(ny * 4);
        uint16_t *dw = dev_up(wb, (size_t)N * K * 2), *dn = dev_up(nb, (size_t)K * 2);
        uint16_t *dbias = bb ? dev_up(bb, (size_t)N * 2) : NULL, *dwq = dev_up(wq, hd * 2), *dwk = dev_up(wk, hd * 2);
        int32_t *dpos = dev_up(pos, sizeof pos), *dslot = dev_up(slot, sizeof slot);
        uint16_t *kc = dev(cache * 2), *vc = dev(cache * 2);
        float *r[3], *g[3];
        uint16_t *rk = malloc(cache * 2), *rv = malloc(cache * 2), *gk = malloc(cache * 2), *gv = malloc(cache * 2);
        for (int i = 0; i < 3; i++) r[i] = malloc(ny > nk ? ny * 4 : nk * 4), g[i] = malloc(ny > nk ? ny * 4 : nk * 4);
        msm_cuda_qk_rope q = {dwq, dwk, 1e-6f, dpos, dslot, kc, vc, nh, kvh, hd, rot, 1e6f};
        /* bf16; FP8, the integer decode; FP8, the hardware one */
        for (int kind = 0; kind < 3; kind++)
            for (int T = 1; T <= (kind ? 1 : 2); T++)
                /* the two kernels; one at decode (early loads and rotary); early loads, the rotary after
                 * the GEMV; loads after the wait; decode without the software pipelining */
                for (int v = 0; v < 5; v++) {
                    bool fp8 = kind > 0;
                    msm_cuda_tuning t = tune0;
                    t.norm_linear = t.qk_rope = true;
                    t.norm_qk_rope = v > 0;
                    t.fp8_linear = kind == 2 ? MSM_CUDA_FP8_LINEAR_SIMT_HW : MSM_CUDA_FP8_LINEAR_SIMT;
                    t.fp8_gemv_hw = kind == 2, t.fp8_gemv_split = 0;
                    t.gemv_early = v != 3, t.small_early = true;
                    if (v == 4) t.rows_pipe = 0;
                    msm_cuda_exec ex = {.stream = st, .tune = &t, .decode = v != 2};
                    if (v > 0)
                        cr_assert(msm_cuda_norm_linear_qk_rope_fits(T, K, nh, kvh, hd, rot, fp8, 0, &t),
                                  "fits %s T=%d K=%d hd=%d rot=%d", fp8 ? "fp8" : "bf16", T, K, hd, rot);
                    CK(cudaMemsetAsync(da, 0xff, nk * 4, st));
                    CK(cudaMemsetAsync(db, 0xff, nk * 4, st));
                    CK(cudaMemsetAsync(dsum, 0xff, nk * 4, st));
                    CK(cudaMemsetAsync(dout, 0xff, nk * 4, st));
                    CK(cudaMemsetAsync(dy, 0xff, ny * 4, st));
                    CK(cudaMemsetAsync(kc, 0xff, cache * 2, st));
                    CK(cudaMemsetAsync(vc, 0xff, cache * 2, st));
                    CK(msm_cuda_add(da, d0, d1, (size_t)T * K, ex));
                    CK(msm_cuda_add(db, d1, dz, (size_t)T * K, ex));
                    const uint16_t *lw = fp8 ? NULL : dw;
                    msm_cuda_fp8w lw8 = fp8 ? w8.d : (msm_cuda_fp8w){0};
                    if (v == 0) {
                        CK(msm_cuda_norm_linear(dqkv, dsum, dout, da, db, dn, 1e-6f, lw, lw8, dbias, T, N, K, ex));
                        CK(msm_cuda_qk_norm_rope_kv(dy, dqkv, dwq, dwk, dpos, dslot, kc, vc, T, nh, kvh, hd, rot, 1e6f,
                                                    1e-6f, ex));
                    } else {
                        CK(msm_cuda_norm_linear_qk_rope(dy, dsum, dout, da, db, dn, 1e-6f, lw, lw8, dbias, q, T, K, ex));
                    }
                    CK(cudaStreamSynchronize(st));
                    float **o = v == 0 ? r : g;
                    down(o[0], dsum, (size_t)T * K * 4), down(o[1], dout, (size_t)T * K * 4);
                    down(o[2], dy, (size_t)T * N * 4);
                    down(v == 0 ? rk : gk, kc, cache * 2), down(v == 0 ? rv : gv, vc, cache * 2);
                    if (v == 0) continue;
                    const char *what = kind == 2 ? "fp8 hw" : fp8 ? "fp8" : "bf16";
                    cr_expect(memcmp(r[0], g[0], (size_t)T * K * 4) == 0, "sum differs: %s T=%d hd=%d v=%d", what, T, hd, v);
                    cr_expect(memcmp(r[1], g[1], (size_t)T * K * 4) == 0, "norm differs: %s T=%d hd=%d v=%d", what, T, hd, v);
                    cr_expect(memcmp(r[2], g[2], (size_t)T * N * 4) == 0, "rows differ: %s T=%d hd=%d v=%d", what, T, hd, v);
                    cr_expect(memcmp(rk, gk, cache * 2) == 0, "K cache differs: %s T=%d hd=%d v=%d", what, T, hd, v);
                    cr_expect(memcmp(rv, gv, cache * 2) == 0, "V cache differs: %s T=%d hd=%d v=%d", what, T, hd, v);
                }
        /* not taken: switched off, past 2 tokens (FP8: 1), a head size or rotary it has no cluster or
         * pairing for, the FP8 split GEMV */
        msm_cuda_tuning t = tune0;
        t.norm_linear = t.qk_rope = true;
        msm_cuda_exec ex = {.stream = st, .tune = &t};
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(1, K, nh, kvh, hd, rot, false, 0, &t), "switched off");
        cr_expect_eq(msm_cuda_norm_linear_qk_rope(dy, dsum, dout, da, db, dn, 1e-6f, dw, (msm_cuda_fp8w){0}, dbias, q, 1,
                                                  K, ex),
                     -EINVAL);
        t.norm_qk_rope = true;
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(3, K, nh, kvh, hd, rot, false, 0, &t), "past 2 tokens");
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(2, K, nh, kvh, hd, rot, true, 0, &t), "FP8 past 1 token");
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(1, K, nh, kvh, 256, 256, false, 0, &t), "hd 256");
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(1, K, nh, kvh, 96, 64, false, 0, &t), "hd 96: 6 blocks a head");
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(1, K, nh, kvh, 128, 96, false, 0, &t), "rot 96");
        t.fp8_gemv_split = 1, t.fp8_gemv_split_min_k = 0;
        cr_expect(!msm_cuda_norm_linear_qk_rope_fits(1, K, nh, kvh, hd, rot, true, 0, &t), "the FP8 split GEMV");
        cr_expect_eq(msm_cuda_norm_linear_qk_rope(dy, dsum, dout, da, db, dn, 1e-6f, dw, (msm_cuda_fp8w){0}, dbias, q, 3,
                                                  K, ex),
                     -EINVAL);
        cudaFree(d0), cudaFree(d1), cudaFree(da), cudaFree(db), cudaFree(dz), cudaFree(dsum), cudaFree(dout);
        cudaFree(dqkv), cudaFree(dy), cudaFree(dw), cudaFree(dn), cudaFree(dbias), cudaFree(dwq), cudaFree(dwk);
        cudaFree(dpos), cudaFree(dslot), cudaFree(kc), cudaFree(vc);
        fp8_free(&w8);
        for (int i = 0; i < 3; i++) free(r[i]), free(g[i]);
        free(rk), free(rv), free(gk), free(gv);
        free(xa), free(xb), free(wf), free(nf), free(bf), free(wb), free(nb), free(bb), free(wq), free(wk), free(wqf),
            free(wkf);
    }
    cudaStreamDestroy(st);
}

/* The qkv LINEAR + ROPE_KV_WRITE in one kernel (msm_cuda_linear_rope_kv, one or two tokens) equals
 * msm_cuda_linear then msm_cuda_rope_kv bitwise: the rotated rows and both whole caches, with and
 * without a bias, full and partial RotaryEmbedding, a padding row (slot -1: not written), the GEMV's
 * wider loads at one token (gemv_u8 / gemv_u16) and the pipelined rows at two; and what it does not
 * take (three tokens without the MMV form, the MMV at two, the switch off, a row count that is not the
 * qkv's). */
Test(cuda_kernels, linear_rope_kv_equals_linear_then_rope_kv, .timeout = 60) {
    need_gpu();
    /* T, nh, kvh, hd, rot, K, bias */
    static const int shapes[][7] = {{1, 16, 16, 128, 128, 2048, 1}, {2, 16, 16, 128, 128, 2048, 1},
                                    {1, 32, 4, 128, 128, 4096, 0},  {2, 12, 2, 128, 64, 1024, 1},
                                    {1, 6, 2, 64, 32, 512, 0},      {2, 4, 4, 128, 48, 2048, 0}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        lrk_case c = lrk_case_new(shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4],
                                  shapes[si][5], shapes[si][6], 5, 9);
        int T = c.T, N = c.N, K = c.K, nh = c.nh, kvh = c.kvh, hd = c.hd, rot = c.rot;
        for (int var = 0; var < 4; var++) { /* plain; gemv_u8 + gemv_u16 at decode; rows_pipe off; 12 blocks an SM */
            msm_cuda_tuning tn = tune0;
            tn.gemv_u8 = tn.gemv_u16 = var == 1;
            if (var == 2) tn.rows_pipe = 0;
            tn.gemv_minb = var == 3 ? MSM_CUDA_MINB_QKV : 0;
            lrk_check(&c, (msm_cuda_exec){.stream = 0, .tune = &tn, .decode = var == 1}, si, var);
        }
        /* not taken: the switch off; at two tokens the MMV */
        msm_cuda_tuning off = tune0;
        off.linear_rope = false;
        cr_expect(!msm_cuda_linear_rope_kv_fits(T, N, K, nh, kvh, hd, rot, c.dw, c.dx, &off));
        msm_cuda_exec eo = {.stream = 0, .tune = &off};
        cr_expect_eq(msm_cuda_linear_rope_kv(c.o2, c.dx, c.dw, c.db, c.dpos, c.dslot, c.k2, c.v2, T, K, nh, kvh, hd,
                                             rot, 1e6f, eo),
                     -ENOTSUP);
        if (T == 2) {
            msm_cuda_tuning mmv = tune0;
            mmv.mmv_min_t = 2;
            cr_expect(!msm_cuda_linear_rope_kv_fits(T, N, K, nh, kvh, hd, rot, c.dw, c.dx, &mmv));
        }
        /* three tokens: only on the block-sliced MMV (linear_rope_mmv, on by default) */
        msm_cuda_tuning nommv = tune0;
        nommv.linear_rope_mmv = false;
        cr_expect(!msm_cuda_linear_rope_kv_fits(3, N, K, nh, kvh, hd, rot, c.dw, c.dx, &nommv));
        cr_expect(!msm_cuda_linear_rope_kv_fits(T, N + hd, K, nh, kvh, hd, rot, c.dw, c.dx, &tune0));
        lrk_case_free(&c);
    }
}

/* A decode step's caches and tables for the fused-attention tests: S sequences of one token each at
 * positions ctx - 1 .. ctx - 16 (random), their cache blocks scattered and distinct (nb - 1 of them,
 * block nb - 1 spare), random bf16 K / V caches, and the last token a padding row (slot -1) when
 * there are more than two. */
typedef struct att_dec_case {
    int max_blocks, nb;
    size_t cache; /* elements of each cache */
    uint16_t *kcb, *vcb;
    int32_t *bt, *seq, *pos, *slot;
} att_dec_case;

static att_dec_case att_dec_case_new(int S, int kvh, int hd, int ctx) {
    att_dec_case c = {.max_blocks = (ctx + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK};
    c.nb = S * c.max_blocks + 1;
    c.cache = (size_t)c.nb * MSM_KV_BLOCK * kvh * hd;
    float *unused;
    c.kcb = host_bf16(c.cache, 1.0f, &unused);
    free(unused);
    c.vcb = host_bf16(c.cache, 1.0f, &unused);
    free(unused);
    c.bt = malloc((size_t)S * c.max_blocks * 4), c.seq = malloc(S * 4), c.pos = malloc(S * 4), c.slot = malloc(S * 4);
    for (int i = 0; i < S * c.max_blocks; i++) c.bt[i] = (i * 7 + 3) % (c.nb - 1); /* scattered, distinct */
    for (int t = 0; t < S; t++) {
        int len = ctx - rndi(ctx < MSM_KV_BLOCK ? ctx : MSM_KV_BLOCK);
        c.seq[t] = t, c.pos[t] = len - 1;
        c.slot[t] = t == S - 1 && S > 2 ? -1
                                        : c.bt[t * c.max_blocks + c.pos[t] / MSM_KV_BLOCK] * MSM_KV_BLOCK +
                                              c.pos[t] % MSM_KV_BLOCK;
    }
    return c;
}

static void att_dec_case_free(att_dec_case *c) {
    free(c->kcb), free(c->vcb), free(c->bt), free(c->seq), free(c->pos), free(c->slot);
}

/* Decode attention with RoPE in the same kernel (msm_cuda_attention_rope, tuning att_rope, decode:
 * one token a sequence) equals ROPE_KV_WRITE's kernel then the attention on its output, bitwise:
 * the outputs and both whole caches (old positions untouched, the token's row written once per kv
 * head), with cluster and last-block merges, one and several splits, a padding row (slot -1: not
 * written), partial RoPE, and shapes that fall back to the two kernels (rot % 16 != 0, prefill). */
Test(cuda_kernels, attention_rope_equals_rope_kv_then_attention, .timeout = 120) {
    need_gpu();
    /* n_seq, nh, kvh, hd, rot, ctx */
    static const int shapes[][6] = {{1, 16, 16, 128, 128, 513}, {1, 32, 4, 128, 128, 513}, {8, 16, 16, 128, 128, 513},
                                    {8, 32, 4, 128, 128, 300},  {3, 12, 2, 128, 64, 700},  {5, 6, 2, 64, 32, 40},
                                    {2, 8, 8, 128, 128, 1},     {4, 4, 2, 64, 64, 17},     {2, 4, 4, 40, 40, 90},
                                    {32, 16, 16, 128, 128, 200}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int S = shapes[si][0], nh = shapes[si][1], kvh = shapes[si][2], hd = shapes[si][3], rot = shapes[si][4];
        int ctx = shapes[si][5], T = S, C = (nh + 2 * kvh) * hd;
        att_dec_case dc = att_dec_case_new(S, kvh, hd, ctx);
        int max_blocks = dc.max_blocks;
        size_t cache = dc.cache, qn = (size_t)T * nh * hd;
        uint16_t *kcb = dc.kcb, *vcb = dc.vcb;
        int32_t *bt = dc.bt, *seq = dc.seq, *pos = dc.pos, *slot = dc.slot;
        float *qkv = host_f32((size_t)T * C, 1.0f);
        float *dqkv = dev_up(qkv, (size_t)T * C * 4);
        int32_t *dseq = dev_up(seq, T * 4), *dpos = dev_up(pos, T * 4), *dslot = dev_up(slot, T * 4);
        int32_t *dbt = dev_up(bt, (size_t)S * max_blocks * 4);
        size_t wsb = msm_cuda_attention_ws_bytes(T, nh, hd);
        void *ws = dev(wsb);
        cr_assert_eq(cudaMemset(ws, 0, wsb ? wsb : 1), cudaSuccess);
        float *ref = malloc(qn * 4), *out = malloc(qn * 4);
        uint16_t *kref = malloc(cache * 2), *vref = malloc(cache * 2), *kout = malloc(cache * 2), *vout = malloc(cache * 2);
        for (int v = 0; v < 4; v++) { /* 0: the two kernels; then fused with cluster / last-block merges; prefill */
            msm_cuda_tuning tv = tune0;
            tv.att_mma_split_mha_max_t = 0; /* MHA at one token on the SIMT kernel, which fuses the RoPE */
            tv.att_rope = v != 0;
            tv.att_cluster = v != 2;
            msm_cuda_exec ev = {.stream = 0, .tune = &tv, .decode = v != 3};
            uint16_t *dk = dev_up(kcb, cache * 2), *dv = dev_up(vcb, cache * 2);
            float *drot = dev_poison((size_t)T * C * 4), *dout = dev_poison(qn * 4);
            CK(msm_cuda_attention_rope(dout, drot, dqkv, dk, dv, dseq, dpos, dslot, dbt, max_blocks, T, nh, kvh, hd, rot,
                                       1e6f, 1.0f / sqrtf((float)hd), ws, wsb, ev));
            down(v ? out : ref, dout, qn * 4);
            down(v ? kout : kref, dk, cache * 2), down(v ? vout : vref, dv, cache * 2);
            if (v) {
                /* a padding row (slot -1, its output unused) attends with its own k and v in the
                 * fused kernel, with whatever the cache holds at its position in the two kernels */
                size_t live = (size_t)(slot[T - 1] < 0 ? T - 1 : T) * nh * hd;
                cr_assert(memcmp(out, ref, live * 4) == 0, "outputs differ (variant %d, S=%d nh=%d kvh=%d hd=%d rot=%d ctx=%d)",
                          v, S, nh, kvh, hd, rot, ctx);
                cr_assert(memcmp(kout, kref, cache * 2) == 0, "K caches differ (variant %d, S=%d nh=%d kvh=%d hd=%d rot=%d)",
                          v, S, nh, kvh, hd, rot);
                cr_assert(memcmp(vout, vref, cache * 2) == 0, "V caches differ (variant %d, S=%d nh=%d kvh=%d hd=%d rot=%d)",
                          v, S, nh, kvh, hd, rot);
            }
            cudaFree(dk), cudaFree(dv), cudaFree(drot), cudaFree(dout);
        }
        cr_expect_eq(msm_cuda_attention_rope(NULL, NULL, dqkv, NULL, NULL, dseq, dpos, dslot, dbt, max_blocks, T, nh, kvh,
                                             hd, rot, 1e6f, 1.0f, ws, wsb, EX), -EINVAL, "no caches");
        cudaFree(dqkv), cudaFree(dseq), cudaFree(dpos), cudaFree(dslot), cudaFree(dbt), cudaFree(ws);
        att_dec_case_free(&dc), free(qkv);
        free(ref), free(out), free(kref), free(vref), free(kout), free(vout);
    }
}

/* The q/k head norm, RoPE and cache write inside the split tensor-core attention at decode
 * (msm_cuda_attention_qk_rope, tuning att_qk_rope) equal qk_norm_rope_kv's kernel then the split
 * attention on its rows, bitwise: the outputs and both whole caches, at 1-16 tokens (2-16 splits:
 * the token's own row a warp's first tile or a later one), GQA at hd 128 and 64, partial RoPE, MHA
 * at one token, a one-position context and a padding row (slot -1: not written, read from the cache
 * by both). */
Test(cuda_kernels, attention_qk_rope_equals_qk_norm_rope_kv_then_attention, .timeout = 120) {
    need_gpu();
    /* n_seq, nh, kvh, hd, rot, ctx */
    static const int shapes[][6] = {{1, 32, 4, 128, 128, 513}, {2, 32, 4, 128, 128, 513}, {8, 32, 4, 128, 128, 300},
                                    {16, 32, 4, 128, 128, 513}, {3, 16, 4, 64, 64, 40},   {4, 8, 2, 128, 64, 700},
                                    {1, 16, 16, 128, 128, 90},  {5, 32, 4, 128, 128, 1},  {6, 32, 8, 128, 128, 2000}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int S = shapes[si][0], nh = shapes[si][1], kvh = shapes[si][2], hd = shapes[si][3], rot = shapes[si][4];
        int ctx = shapes[si][5], T = S, C = (nh + 2 * kvh) * hd;
        att_dec_case dc = att_dec_case_new(S, kvh, hd, ctx);
        int max_blocks = dc.max_blocks;
        size_t cache = dc.cache, qn = (size_t)T * nh * hd;
        uint16_t *kcb = dc.kcb, *vcb = dc.vcb;
        int32_t *bt = dc.bt, *seq = dc.seq, *pos = dc.pos, *slot = dc.slot;
        float *unused;
        uint16_t *wq = host_bf16((size_t)hd, 1.0f, &unused);
        free(unused);
        uint16_t *wk = host_bf16((size_t)hd, 1.0f, &unused);
        free(unused);
        float *qkv = host_f32((size_t)T * C, 1.0f);
        float *dqkv = dev_up(qkv, (size_t)T * C * 4);
        uint16_t *dwq = dev_up(wq, (size_t)hd * 2), *dwk = dev_up(wk, (size_t)hd * 2);
        int32_t *dseq = dev_up(seq, T * 4), *dpos = dev_up(pos, T * 4), *dslot = dev_up(slot, T * 4);
        int32_t *dbt = dev_up(bt, (size_t)S * max_blocks * 4);
        size_t wsb = msm_cuda_attention_ws_bytes(T, nh, hd);
        void *ws = dev(wsb);
        cr_assert_eq(cudaMemset(ws, 0, wsb ? wsb : 1), cudaSuccess);
        float *ref = malloc(qn * 4), *out = malloc(qn * 4);
        uint16_t *kref = malloc(cache * 2), *vref = malloc(cache * 2), *kout = malloc(cache * 2), *vout = malloc(cache * 2);
        const float eps = 1e-6f, theta = 1e6f, scale = 1.0f / sqrtf((float)hd);
        for (int v = 0; v < 2; v++) { /* 0: the two kernels; 1: fused */
            msm_cuda_tuning tv = tune0;
            tv.att_mma_split = true, tv.att_mma_split_min_t = 1, tv.att_mma_split_max_t = 16;
            tv.att_mma_split_mha_max_t = 1, tv.att_early = true, tv.att_qk_rope = 1;
            msm_cuda_exec ev = {.stream = 0, .tune = &tv, .decode = true};
            uint16_t *dk = dev_up(kcb, cache * 2), *dv = dev_up(vcb, cache * 2);
            float *drot = dev_poison((size_t)T * C * 4), *dout = dev_poison(qn * 4);
            cr_assert(msm_cuda_attention_qk_rope_fits(T, nh, kvh, hd, rot, dqkv, dk, dv, ev),
                      "the split kernel takes S=%d nh=%d kvh=%d hd=%d rot=%d", S, nh, kvh, hd, rot);
            if (v == 0) {
                CK(msm_cuda_qk_norm_rope_kv(drot, dqkv, dwq, dwk, dpos, dslot, dk, dv, T, nh, kvh, hd, rot, theta, eps,
                                            ev));
                CK(msm_cuda_attention_ex(dout, drot, (size_t)C, dk, dv, dseq, dpos, dbt, max_blocks, T, nh, kvh, hd,
                                         scale, ws, wsb, ev));
            } else {
                CK(msm_cuda_attention_qk_rope(dout, dqkv, dwq, dwk, eps, dk, dv, dseq, dpos, dslot, dbt, max_blocks, T,
                                              nh, kvh, hd, rot, theta, scale, ev));
            }
            down(v ? out : ref, dout, qn * 4);
            down(v ? kout : kref, dk, cache * 2), down(v ? vout : vref, dv, cache * 2);
            if (v) {
                cr_assert(memcmp(out, ref, qn * 4) == 0, "outputs differ (S=%d nh=%d kvh=%d hd=%d rot=%d ctx=%d)", S, nh,
                          kvh, hd, rot, ctx);
                cr_assert(memcmp(kout, kref, cache * 2) == 0, "K caches differ (S=%d nh=%d kvh=%d hd=%d rot=%d)", S, nh,
                          kvh, hd, rot);
                cr_assert(memcmp(vout, vref, cache * 2) == 0, "V caches differ (S=%d nh=%d kvh=%d hd=%d rot=%d)", S, nh,
                          kvh, hd, rot);
            }
            /* not taken: prefill, the switch off, a rotary width the kernel does not pair */
            msm_cuda_exec ep = ev;
            ep.decode = false;
            cr_expect(!msm_cuda_attention_qk_rope_fits(T, nh, kvh, hd, rot, dqkv, dk, dv, ep));
            cr_expect_eq(msm_cuda_attention_qk_rope(dout, dqkv, dwq, dwk, eps, dk, dv, dseq, dpos, dslot, dbt,
                                                    max_blocks, T, nh, kvh, hd, rot, theta, scale, ep),
                         -ENOTSUP);
            tv.att_qk_rope = 0;
            cr_expect(!msm_cuda_attention_qk_rope_fits(T, nh, kvh, hd, rot, dqkv, dk, dv, ev));
            tv.att_qk_rope = 1;
            cr_expect(!msm_cuda_attention_qk_rope_fits(T, nh, kvh, hd, 32, dqkv, dk, dv, ev));
            cr_expect_eq(msm_cuda_attention_qk_rope(dout, dqkv, NULL, dwk, eps, dk, dv, dseq, dpos, dslot, dbt,
                                                    max_blocks, T, nh, kvh, hd, rot, theta, scale, ev),
                         -EINVAL, "no q norm");
            cudaFree(dk), cudaFree(dv), cudaFree(drot), cudaFree(dout);
        }
        cudaFree(dqkv), cudaFree(dwq), cudaFree(dwk), cudaFree(dseq), cudaFree(dpos), cudaFree(dslot), cudaFree(dbt);
        cudaFree(ws);
        att_dec_case_free(&dc), free(wq), free(wk), free(qkv);
        free(ref), free(out), free(kref), free(vref), free(kout), free(vout);
    }
}

/* Partial RoPE (GLM-4.5's partial_rotary_factor): the first rot dims of each head rotate with
 * frequencies from rot, the rest pass through, in the in-place, copying and cache-writing kernels;
 * rope_kv still equals rope_copy then kv_write_ld bitwise (the pass-through dims of the k heads
 * reach the cache too). */
Test(cuda_kernels, partial_rope_matches_cpu, .timeout = 60) {
    need_gpu();
    static const int shapes[][5] = {{1, 96, 8, 128, 64}, {7, 6, 2, 64, 32}, {70, 4, 4, 32, 8}, {3, 8, 1, 16, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int T = shapes[s][0], nh = shapes[s][1], kvh = shapes[s][2], hd = shapes[s][3], rot = shapes[s][4];
        /* distinct slots for every token (t * 7 mod nslots, nslots > T): two tokens writing one
         * slot would race, and the two cache writers below need not race the same way */
        int C = (nh + 2 * kvh) * hd, nslots = 8 * MSM_KV_BLOCK;
        size_t n = (size_t)T * C, cache = (size_t)nslots * kvh * hd;
        float *x = host_f32(n, 1.0f), *ref = malloc(n * 4), *out = malloc(n * 4);
        int32_t *pos = malloc(T * 4), *slot = malloc(T * 4);
        for (int t = 0; t < T; t++) pos[t] = rndi(4000), slot[t] = t == T - 1 && T > 1 ? -1 : (t * 7) % nslots;
        float *dx = dev_up(x, n * 4), *o1 = dev_poison(n * 4), *o2 = dev_poison(n * 4);
        int32_t *dpos = dev_up(pos, T * 4), *dslot = dev_up(slot, T * 4);
        /* in place over whole rows of heads */
        msm_cpu_rope(memcpy(ref, x, n * 4), pos, T, C / hd, hd, rot, 1e6f);
        CK(msm_cuda_rope(dx, dpos, T, C / hd, hd, rot, 1e6f, EX));
        down(out, dx, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "rope T=%d heads=%d hd=%d rot=%d", T, C / hd, hd, rot);
        cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice);
        /* over qkv rows: q and k heads rotated, v copied */
        msm_cpu_rope_copy(ref, x, pos, T, C, nh + kvh, hd, rot, 1e6f);
        CK(msm_cuda_rope_copy(o1, dx, dpos, T, C, nh + kvh, hd, rot, 1e6f, EX));
        down(out, o1, n * 4);
        CHECK_ERR(out, ref, n, 1e-5, "rope_copy T=%d nh=%d kvh=%d hd=%d rot=%d", T, nh, kvh, hd, rot);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh + kvh; h++)
                cr_assert(memcmp(out + (size_t)t * C + (size_t)h * hd + rot, x + (size_t)t * C + (size_t)h * hd + rot,
                                 (size_t)(hd - rot) * 4) == 0, "pass-through dims of head %d changed", h);
        uint16_t *k1 = dev_poison(cache * 2), *v1 = dev_poison(cache * 2), *k2 = dev_poison(cache * 2),
                 *v2 = dev_poison(cache * 2);
        CK(msm_cuda_kv_write_ld(k1, v1, o1 + (size_t)nh * hd, o1 + (size_t)(nh + kvh) * hd, (size_t)C, dslot, T, kvh, hd, EX));
        CK(msm_cuda_rope_kv(o2, dx, dpos, dslot, k2, v2, T, nh, kvh, hd, rot, 1e6f, EX));
        float *h1 = malloc(n * 4), *h2 = malloc(n * 4);
        uint16_t *c1 = malloc(cache * 2), *c2 = malloc(cache * 2);
        down(h1, o1, n * 4), down(h2, o2, n * 4);
        cr_assert(memcmp(h1, h2, n * 4) == 0, "rotated rows differ (T=%d hd=%d rot=%d)", T, hd, rot);
        down(c1, k1, cache * 2), down(c2, k2, cache * 2);
        cr_assert(memcmp(c1, c2, cache * 2) == 0, "K caches differ (T=%d hd=%d rot=%d)", T, hd, rot);
        down(c1, v1, cache * 2), down(c2, v2, cache * 2);
        cr_assert(memcmp(c1, c2, cache * 2) == 0, "V caches differ (T=%d hd=%d rot=%d)", T, hd, rot);
        cr_expect_eq(msm_cuda_rope(dx, dpos, T, nh, hd, rot + 1, 1e6f, EX), -EINVAL, "odd rot");
        cr_expect_eq(msm_cuda_rope_copy(o1, dx, dpos, T, C, nh, hd, hd + 2, 1e6f, EX), -EINVAL, "rot > hd");
        cudaFree(dx), cudaFree(o1), cudaFree(o2), cudaFree(dpos), cudaFree(dslot);
        cudaFree(k1), cudaFree(v1), cudaFree(k2), cudaFree(v2);
        free(x), free(ref), free(out), free(pos), free(slot), free(h1), free(h2), free(c1), free(c2);
    }
}

/* ---- one-shot all-reduce ---- */

/* Three "ranks" on GPU 0, each a buffer, a signal area and a stream of its own; their kernels
 * run concurrently and meet at the barriers as ranks on three GPUs would. The sum equals the host's
 * in rank order bit for bit, on every rank, over calls of several sizes and offsets (the flags count
 * on between calls); a rank whose peers never come sets the fault word and returns. */
Test(cuda_kernels, allreduce_oneshot_sums_in_rank_order, .timeout = 60) {
    need_gpu();
    enum { R = 3 };
    const size_t cap = 1 << 20; /* floats per rank buffer: input at some offset, output after */
    msm_cuda_ar_peers p[R];
    cudaStream_t st[R];
    char *buf[R];
    uint32_t *sig[R], *fault[R];
    for (int r = 0; r < R; r++) {
        buf[r] = dev(2 * cap * sizeof(float));
        sig[r] = dev(msm_cuda_ar_signal_bytes());
        cr_assert_eq(cudaMemset(sig[r], 0, msm_cuda_ar_signal_bytes()), cudaSuccess);
        cr_assert_eq(cudaHostAlloc((void **)&fault[r], 4, cudaHostAllocMapped), cudaSuccess);
        *fault[r] = 0;
        cr_assert_eq(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking), cudaSuccess);
    }
    for (int r = 0; r < R; r++) {
        p[r] = (msm_cuda_ar_peers){.rank = r, .size = R, .fault = fault[r], .timeout_ns = 5000000000ull};
        for (int q = 0; q < R; q++) p[r].base[q] = buf[q], p[r].sig[q] = sig[q];
    }
    static const size_t cases[][2] = {{2048, 0}, {5, 3}, {1 << 19, 64}, {2048, 0}, {777777, 1001}, {1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = cases[c][0], off = cases[c][1] * sizeof(float);
        float *in[R], *ref = malloc(n * 4), *out = malloc(n * 4);
        for (int r = 0; r < R; r++) {
            in[r] = host_f32(n, r + 1.0f);
            cr_assert_eq(cudaMemcpy(buf[r] + off, in[r], n * 4, cudaMemcpyHostToDevice), cudaSuccess);
            cr_assert_eq(cudaMemset(buf[r] + cap * 4, 0xff, n * 4), cudaSuccess);
        }
        for (size_t i = 0; i < n; i++) {
            float s = in[0][i];
            for (int r = 1; r < R; r++) s += in[r][i];
            ref[i] = s;
        }
        for (int r = 0; r < R; r++) {
            msm_cuda_exec ex = {.stream = st[r], .tune = &tune0};
            CK(msm_cuda_allreduce_oneshot((float *)(buf[r] + cap * 4), off, n, &p[r], ex));
        }
        cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
        for (int r = 0; r < R; r++) {
            cr_assert_eq(*fault[r], 0u, "case %zu: rank %d timed out", c, r);
            down(out, buf[r] + cap * 4, n * 4);
            cr_assert(memcmp(out, ref, n * 4) == 0, "case %zu (n=%zu off=%zu): rank %d differs from the rank-order sum",
                      c, n, off, r);
        }
        for (int r = 0; r < R; r++) free(in[r]);
        free(ref), free(out);
    }
    /* fused with the residual add + norm: bit for bit the one-shot sum then add_rmsnorm (checked on
     * rank 0; rows past the grid loop, dims of several values-per-thread classes) */
    static const int fused[][2] = {{1, 2048}, {5, 2048}, {300, 64}, {3, 5000}, {2, 4096}};
    for (size_t c = 0; c < sizeof fused / sizeof *fused; c++) {
        int rows = fused[c][0], dim = fused[c][1];
        size_t n = (size_t)rows * dim, off = 4096;
        float *w32, *x = host_f32(n, 1.0f), *a = malloc(n * 4), *b = malloc(n * 4);
        uint16_t *w = host_bf16((size_t)dim, 1.0f, &w32);
        float *dx = dev_up(x, n * 4), *s1 = dev_poison(n * 4), *o1 = dev_poison(n * 4), *s2 = dev_poison(n * 4),
              *o2 = dev_poison(n * 4);
        uint16_t *dw = dev_up(w, (size_t)dim * 2);
        for (int r = 0; r < R; r++) {
            float *in = host_f32(n, r + 1.0f);
            cr_assert_eq(cudaMemcpy(buf[r] + off, in, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
            free(in);
        }
        for (int r = 0; r < R; r++) {
            msm_cuda_exec ex = {.stream = st[r], .tune = &tune0};
            CK(msm_cuda_allreduce_add_rmsnorm(r ? (float *)(buf[r] + cap * 4) : s1, r ? (float *)(buf[r] + cap * 4) : o1,
                                              off, dx, dw, rows, dim, 1e-6f, &p[r], ex));
        }
        cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
        for (int r = 0; r < R; r++) /* the unfused pair on rank 0 */
            CK(msm_cuda_allreduce_oneshot((float *)(buf[r] + cap * 4), off, n, &p[r],
                                          (msm_cuda_exec){.stream = st[r], .tune = &tune0}));
        cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
        CK(msm_cuda_add_rmsnorm(s2, o2, dx, (float *)(buf[0] + cap * 4), dw, rows, dim, 1e-6f, EX));
        cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
        for (int r = 0; r < R; r++) cr_assert_eq(*fault[r], 0u, "fused %zu: rank %d timed out", c, r);
        down(a, s1, n * 4), down(b, s2, n * 4);
        cr_assert(memcmp(a, b, n * 4) == 0, "fused rows=%d dim=%d: the residual sum differs from the pair", rows, dim);
        down(a, o1, n * 4), down(b, o2, n * 4);
        cr_assert(memcmp(a, b, n * 4) == 0, "fused rows=%d dim=%d: the norm differs from the pair", rows, dim);
        cudaFree(dx), cudaFree(s1), cudaFree(o1), cudaFree(s2), cudaFree(o2), cudaFree(dw);
        free(x), free(a), free(b), free(w), free(w32);
    }
    /* rank 0 alone: its peers never come */
    p[0].timeout_ns = 20000000ull;
    msm_cuda_exec ex = {.stream = st[0], .tune = &tune0};
    CK(msm_cuda_allreduce_oneshot((float *)(buf[0] + cap * 4), 0, 4096, &p[0], ex));
    cr_assert_eq(cudaStreamSynchronize(st[0]), cudaSuccess);
    cr_expect_eq(*fault[0], 1u, "a lone rank did not report its timeout");
    /* its timeout aborted the group: a later call of another rank returns at once (well before
     * its own 5 s timeout) with its fault word set */
    cudaEvent_t e0, e1;
    cr_assert_eq(cudaEventCreate(&e0), cudaSuccess);
    cr_assert_eq(cudaEventCreate(&e1), cudaSuccess);
    msm_cuda_exec ex1 = {.stream = st[1], .tune = &tune0};
    cr_assert_eq(cudaEventRecord(e0, st[1]), cudaSuccess);
    CK(msm_cuda_allreduce_add_rmsnorm((float *)(buf[1] + cap * 4), (float *)(buf[1] + cap * 4), 0, (const float *)buf[1],
                                      (const uint16_t *)buf[1], 2, 64, 1e-6f, &p[1], ex1));
    CK(msm_cuda_allreduce_oneshot((float *)(buf[1] + cap * 4), 0, 4096, &p[1], ex1));
    cr_assert_eq(cudaEventRecord(e1, st[1]), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(st[1]), cudaSuccess);
    float ms = 0;
    cr_assert_eq(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    cr_expect_eq(*fault[1], 1u, "rank 1 did not see the group's abort");
    cr_expect_lt(ms, 100.0f, "rank 1's calls after the abort took %.1f ms", (double)ms);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    p[0].size = 0;
    cr_expect_eq(msm_cuda_allreduce_oneshot((float *)buf[0], 0, 4, &p[0], ex), -EINVAL);
    for (int r = 0; r < R; r++) {
        cudaFree(buf[r]), cudaFree(sig[r]), cudaFreeHost(fault[r]);
        cudaStreamDestroy(st[r]);
    }
}

#else /* no CUDA toolkit in this build */

Test(cuda_kernels, skipped_without_cuda) { cr_skip_test("built without CUDA"); }

#endif
