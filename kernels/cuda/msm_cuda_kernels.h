/* msm_cuda_kernels: the CUDA twins of the CPU reference kernels (msm_kernels.h).
 *
 * Each msm_cuda_<op> computes the function of msm_cpu_<op> with the same argument order, then any
 * context/workspace arguments, then `ex` (the stream and the rank's tuning, msm_cuda_exec). They
 * are host-side launchers: they check shapes, enqueue on ex.stream, check the launch, and return
 * 0 or a negative errno. None of them
 * allocates, synchronises or copies to the host, so every one can be captured in a CUDA graph.
 * T = 0 (or n = 0) is a valid empty call.
 *
 * Data types on the device:
 *   - activations (x, y, q, logits, ...) are float32, as on the CPU backend;
 *   - weights are bf16 (passed as uint16_t bit patterns), uploaded once: embedding table, norm
 *     weights, linear weights and biases, router and expert weights;
 *   - the paged KV cache is bf16 ([n_blocks, MSM_KV_BLOCK, kvh, hd] per layer for K and for V):
 *     it halves the decode step's KV traffic; kv_write rounds to nearest even, attention computes
 *     in fp32 from the bf16 values;
 *   - indices (ids, pos, seq, slots, block tables) are int32, sampling params msm_sample_params.
 * All pointers are device pointers unless stated.
 *
 * Accuracy against the CPU oracle fed the same (bf16-valued) weights: fp32 math everywhere except
 * cuBLASLt linears (T > MSM_CUDA_GEMV_MAX_T), which round x to bf16 up to 64 tokens (relative error
 * ~3e-3) and split it into bf16 hi + lo from 65 on (~2^-16), the KV cache (bf16), the MoE tensor-core
 * GEMVs (x and the SwiGLU activations split into bf16 hi + lo, ~2^-16), and the WMMA MoE path
 * (T > MSM_CUDA_MOE_GROUPED_GEMV_MAX_T), which rounds x and the SwiGLU activations to bf16.
 * Results are deterministic: the same inputs give the same bits on every run and replay. */
#ifndef MSM_CUDA_KERNELS_H
#define MSM_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "msm_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Linears with at most this many tokens use the GEMV kernel (weights read once for all tokens,
 * fp32 math); larger ones use cuBLASLt. */
#define MSM_CUDA_GEMV_MAX_T 8
/* Linears with at most this many outputs (routers) take the GEMV at any T. */
#define MSM_CUDA_GEMV_SMALL_N 256
/* MoE with at most this many tokens uses the per-(token, slot) fp32 GEMV kernels; larger T
 * groups the (token, slot) pairs by expert on the device, then runs grouped fp32 SIMT GEMVs (each
 * selected expert's weights streamed once) below MSM_CUDA_MOE_TILED_MIN_T tokens, tiled
 * tensor-core GEMMs (weights streamed once through shared memory, x and the activations split
 * into bf16 hi + lo: near-fp32) up to MSM_CUDA_MOE_TILED_MAX_T, and beyond that (prefill chunks)
 * grouped WMMA GEMMs (x and the activations rounded to bf16). The grouped tensor-core GEMVs
 * (x split in their inner loop) remain as a forced variant up to
 * MSM_CUDA_MOE_GROUPED_GEMV_MAX_T. Thresholds measured on the H200 at the Qwen1.5-MoE shapes
 * (bench/results/2026-11-30-h200): tiled against SIMT 203 vs 176 us at T = 16, 261 vs 257 at
 * T = 32, 271 vs 320 (tensor-core GEMVs) at T = 48; step at batch 64 14.59 -> 10.39 ms. From 32 since
 * 2026-12-01 (step at batch 32, tiled vs grouped GEMVs: Qwen1.5-MoE 8.72 vs 9.35 ms, Qwen3-30B-A3B
 * 17.06 vs 18.00; at 16 the GEMVs win, 6.70 vs 6.87 and 12.90 vs 13.38;
 * bench/results/2026-12-01-h200-s6 run 4). From 12 since 2026-12-02 (fourth session), once the tiled
 * kernels took 16-token passes with a deeper pipeline (msm_cuda_tuning.moe_tiled_bm): step at batch
 * 12 / 16 / 24, tiled vs grouped GEMVs, Qwen1.5-MoE 5.91 / 6.43-6.46 / 7.56 vs 6.36 / 6.59-6.63 /
 * 8.08-8.12 ms, Qwen3-30B-A3B 11.78 / 12.59-12.63 / 14.73-14.74 vs 12.34 / 12.72-12.78 / 15.41-15.46;
 * at 9-11 the GEMVs still win by 0.03-0.28 ms, at 8 by 0.3-1.0 (bench/results/2026-12-02-h200-s4
 * run 3). */
#define MSM_CUDA_MOE_GEMV_MAX_T 4
#define MSM_CUDA_MOE_GROUPED_GEMV_MAX_T 64
#define MSM_CUDA_MOE_SCAN_MAX_P 512 /* pairs (T * k) the grouped GEMVs' own scan takes at most */
#define MSM_CUDA_MOE_TILED_MIN_T 12
#define MSM_CUDA_MOE_TILED_MAX_T 512
enum { MSM_CUDA_MOE_PATH_AUTO = 0, MSM_CUDA_MOE_PATH_PAIR = 1, MSM_CUDA_MOE_PATH_GROUPED_GEMV = 2,
       MSM_CUDA_MOE_PATH_WMMA = 3, MSM_CUDA_MOE_PATH_TILED = 4 };
/* MoE kernel variants (msm_cuda_tuning.moe_kernels): on the grouped GEMV path, SIMT = always the
 * fp32 SIMT grouped GEMVs, MMA = always the tensor-core ones (by default the tensor-core GEMVs
 * from 48 tokens on); NO_PREFETCH = the tensor-core down GEMV does not pull its first rows into
 * L2 before its PDL wait; NT4 = the tensor-core GEMVs take 32 tokens a pass (16 by default). */
enum { MSM_CUDA_MOE_K_SIMT = 1, MSM_CUDA_MOE_K_MMA = 2, MSM_CUDA_MOE_K_NO_PREFETCH = 4,
       MSM_CUDA_MOE_K_NT4 = 8,
       /* the pair path's down GEMV (bf16 and FP8) with a token's k expert rows over k warps
        * (moe_pair.cu), by default at 8 slots: DOWN_SPLIT forces it at every k, DOWN_WARP keeps
        * one warp a row at every k */
       MSM_CUDA_MOE_K_DOWN_SPLIT = 16, MSM_CUDA_MOE_K_DOWN_WARP = 32 };
/* msm_cuda_tuning.moe_gg_persist: the grouped SIMT GEMVs on a persistent grid (moe_grouped.cu) */
enum { MSM_CUDA_MOE_PERSIST_GATEUP = 1, MSM_CUDA_MOE_PERSIST_DOWN = 2 };
/* msm_cuda_tuning.moe_gu_u2: AUTO takes the 2-load gate/up where its grid is one wave at 12 blocks an
 * SM but not at the 4-load kernel's occupancy, and no kernel of the layer runs beside it on the aux
 * stream (msm_cuda_exec.aux_beside) */
enum { MSM_CUDA_MOE_GU_U2_OFF = 0, MSM_CUDA_MOE_GU_U2_ON = 1, MSM_CUDA_MOE_GU_U2_AUTO = 2 };
/* msm_cuda_tuning.moe_pair_early: AUTO (default) takes the early down except at one token with a
 * kernel of the layer beside it on the aux stream (a shared expert: measured slower there, tuning.cu) */
enum { MSM_CUDA_MOE_PAIR_EARLY_OFF = 0, MSM_CUDA_MOE_PAIR_EARLY_ON = 1, MSM_CUDA_MOE_PAIR_EARLY_AUTO = 2 };
/* Linears with mmv_min_t <= T <= mmv_max_t (and K % 32 == 0, w and x 16-byte aligned) run the
 * tensor-core GEMV ("MMV"): each weight read once, x split into bf16 hi + lo (near-fp32
 * products, fp32 accumulation), K slices summed in a fixed order (deterministic), no workspace.
 * It takes precedence over the GEMV and cuBLASLt paths in that range; max 0 turns it off.
 * Default range measured on the H200 (bench/results/2026-11-29-h200-perf.md, round 3): at T=8
 * the step went 7.20 -> 6.08 ms; with max 32, batch 32 went 11.29 -> 11.84 ms (slower than
 * cuBLASLt there), hence max 8. From 3 tokens instead of 5 since bench/results/2026-12-03-h200-s7
 * run 1 (ms a step, default 5 vs 3, two rounds): Qwen1.5-MoE batch 3 / 4 3.75 / 3.70-3.77 ->
 * 3.38-3.39 / 3.38-3.40, Qwen3-30B-A3B 6.35 / 6.43 -> 6.09-6.11 / 6.16; from 2 loses at 2 on Qwen3
 * (4.08 -> 4.33). */
#define MSM_CUDA_MMV_MIN_T 3
#define MSM_CUDA_MMV_MAX_T 8
/* Linears with linear_tiled_min_t <= T <= MSM_CUDA_LINEAR_TILED_MAX_T (N > MSM_CUDA_GEMV_SMALL_N,
 * K % 64 == 0, w and x 16-byte aligned) run the split-K tiled tensor-core GEMM (linear_tiled.cu:
 * weights streamed once through a shared-memory pipeline, x split into bf16 hi + lo, near-fp32,
 * deterministic); it takes precedence over the MMV, GEMV and cuBLASLt paths in that range. */
#define MSM_CUDA_LINEAR_TILED_MIN_T 9
#define MSM_CUDA_LINEAR_TILED_MAX_T 64
/* cuBLASLt splits x into bf16 hi + lo (two matmuls, near-fp32) from this many tokens on (prefill
 * chunks); below it (decode batches, where a second pass would double the weight traffic) x is
 * rounded to bf16 (~3e-3 relative error per linear). */
#define MSM_CUDA_LT_SPLIT_MIN_T 65

/* Per-rank tuning: which kernel variant each launcher picks, and what it needs to know of the
 * GPU. Filled once per rank by msm_cuda_tuning_init (the defaults above and the device's
 * properties); the backend then applies its configuration and environment overrides. Launchers
 * only read it, so ranks on several GPUs never share mutable state. */
/* msm_cuda_tuning.att_mma */
enum { MSM_CUDA_ATT_MMA_OFF = 0, MSM_CUDA_ATT_MMA_AUTO = 1, MSM_CUDA_ATT_MMA_ON = 2 };

typedef struct msm_cuda_tuning {
    int device, sms;          /* the rank's GPU and its multiprocessor count */
    bool pdl;                 /* programmatic dependent launch (msm_launch) */
    int gemv_max_t;           /* linears with T <= this take the GEMV (>= MSM_CUDA_GEMV_MAX_T, <= 64) */
    int mmv_min_t, mmv_max_t; /* the MMV range (see above; max <= 64, 0 = off) */
    int linear_tiled_min_t;   /* the tiled linear from this T on (> MSM_CUDA_LINEAR_TILED_MAX_T: off) */
    int lt_split_min_t;       /* cuBLASLt hi + lo split from this T on */
    bool gemv_prefetch;       /* the GEMV pulls its weight rows towards L2 before its PDL wait (off:
                                 measured 2.31 -> 2.11 ms at batch 1 without it, H200, 2026-12-01) */
    bool gemv_early;          /* the dense GEMVs and MMVs issue their first weight loads into
                                 registers before their PDL wait (MSM_CUDA_GEMV_EARLY) */
    bool fp8_gemv_u8;         /* the FP8 SIMT GEMV at one token (2 rows a warp): 8 loads a lane a row in
                                 flight instead of 4, a 4096-code row at once; the same bits
                                 (MSM_CUDA_FP8_GEMV_U8=0: 4) */
    bool norm_linear;         /* an ADD_RMSNORM and the LINEAR reading its norm at decode sizes in one
                                 launch (msm_cuda_norm_linear; MSM_CUDA_NORM_LINEAR) */
    bool linear_rope;         /* a LINEAR of one or two tokens and the ROPE_KV_WRITE reading it in one
                                 kernel (msm_cuda_linear_rope_kv; MSM_CUDA_LINEAR_ROPE) */
    bool qk_rope;             /* a QK_NORM and the ROPE_KV_WRITE reading it in one kernel
                                 (msm_cuda_qk_norm_rope_kv; MSM_CUDA_QK_ROPE) */
    int fp8_moe_tiled_min_t;  /* FP8 experts take the tiled GEMMs (fp8_moe_tiled) from this T on,
                                 below it the FP8 GEMVs (MSM_CUDA_FP8_MOE_TILED_MIN_T) */
    int moe_path;             /* MSM_CUDA_MOE_PATH_*; AUTO picks by T */
    int moe_tiled_min_t;      /* AUTO takes the tiled GEMMs from this T (default: past the grouped GEMVs) */
    int moe_kernels;          /* MSM_CUDA_MOE_K_* flags */
    int moe_down_hb;          /* the pair path's split down GEMV: rows a warp, 2 or 4 (the same bits);
                                 0 (default): 4 for bf16 rows, 2 for FP8 (moe_pair.cu; MSM_CUDA_MOE_DOWN_HB) */
    int moe_pair_early;       /* MSM_CUDA_MOE_PAIR_EARLY_*: the pair path's split down GEMV reads the
                                 expert ids and issues its first weight loads before its PDL wait, its
                                 gate/up GEMV then triggering after its own wait (so the ids are
                                 complete when the down launches); the same sums
                                 (MSM_CUDA_MOE_PAIR_EARLY=0|1|2) */
    int moe_fused_combine;    /* where the routed experts' path ends with the combine kernel (5 tokens and
                                 more), the node reading their sum next (1: an ADD_RMSNORM, or a shared
                                 expert's MOE_COMBINE_NORM; 2, the default: only an ADD_RMSNORM, up to 64
                                 tokens, moe.cu) computes it itself from the per-pair rows:
                                 one kernel and a [T, H] round trip less a layer, the same bits
                                 (msm_cuda_moe_add_rmsnorm, msm_cuda_moe_combine_rmsnorm_routed). With
                                 one block a token (before moe_combine_cluster) measured slower
                                 (H200, 2026-12-05 twentieth session, s19 run 2,
                                 ms a step vs the combine kernel, three rounds: Qwen3-30B-A3B at 8 / 32 /
                                 128 / 256 tokens +0.22 / +0.43 / +0.44 / +0.21, its FP8 preset at 8 / 32
                                 +0.41 / +0.40, Qwen1.5-MoE +0.06 / 0.00 / +0.01 / -0.10)
                                 (MSM_CUDA_MOE_FUSED_COMBINE=0|1|2) */
    bool moe_combine_cluster; /* the combine inside an ADD_RMSNORM (moe_fused_combine) as a thread-block
                                 cluster a token, a block a slice of the row (its sum of squares
                                 gathered over distributed shared memory in the one-block kernel's
                                 order: the same bits), where the row takes 2-8 slices; else one block a
                                 token (MSM_CUDA_MOE_COMBINE_CLUSTER) */
    bool moe_combine_early;   /* the combine kernel and the combines inside a norm read each token's
                                 routing (ids, weights, the grouping's inverse) before their PDL wait,
                                 after the grouped GEMVs and tiled GEMMs, whose gate/up triggers only
                                 after its own wait (moe.cu, MOE_EARLY_ROWS; MSM_CUDA_MOE_COMBINE_EARLY).
                                 Default on (H100, bench/results/2026-12-06-h200-s27 run 2, ms a step
                                 at 5 / 8 / 16 / 32 tokens, off minus on, three rounds): Qwen3-30B-A3B
                                 0.00 / 0.00 / +0.09 / +0.10, its FP8 preset +0.06 / +0.06 / +0.05 /
                                 +0.10, Qwen1.5-MoE +0.03 / +0.03 / +0.02 / +0.03 */
    int moe_gu_u2;            /* MSM_CUDA_MOE_GU_U2_*: the pair path's bf16 gate/up GEMV with 2 loads a
                                 lane a row in flight (not 4) at 12 blocks an SM, the same bits
                                 (moe_pair.cu; MSM_CUDA_MOE_GU_U2) */
    int moe_gu_per_sm;        /* resident blocks an SM of that GEMV at 4 loads (occupancy, queried once) */
    /* resident blocks per SM of the persistent / wave-sized kernels (occupancy, queried once) */
    int moe_gateup_mma_per_sm, moe_down_mma_per_sm;   /* 16 tokens a pass */
    int moe_gateup_mma4_per_sm, moe_down_mma4_per_sm; /* 32 tokens a pass (MSM_CUDA_MOE_K_NT4) */
    int moe_gateup_mma8_per_sm, moe_down_mma8_per_sm; /* FP8 weights (docs/adr/0006-fp8.md) */
    int att_per_sm[4][2][4];  /* attention_kernel<L = 4, 8, 16, 32 chunks><vec 0/1><1..4 heads a block> */
    size_t ar_oneshot_max_bytes; /* all-reduces up to this size take the one-shot kernel where the
                                    group has peer access (MSM_CUDA_AR_ONESHOT_MAX_BYTES); 0: NCCL always */
    bool fp8_resident;        /* FP8 checkpoint weights stay FP8 on the device (else dequantised to
                                 bf16 at load, as before) */
    int fp8_native_max_t;     /* FP8-resident linears and experts with T <= this run the FP8 GEMVs;
                                 larger T dequantise to bf16 for the bf16 paths (MSM_CUDA_FP8_NATIVE_MAX_T) */
    int fp8_linear;           /* MSM_CUDA_FP8_LINEAR_*: the FP8 linear kernel up to fp8_native_max_t */
    int fp8_linear_max_t;     /* FP8-resident dense linears of more tokens than this (or than
                                 fp8_native_max_t) dequantise to bf16 for the bf16 paths. Prefill
                                 chunks: fp8_native_max_t (MSM_CUDA_FP8_LINEAR_MAX_T); pure decode
                                 steps: MSM_CUDA_FP8_LINEAR_DECODE_MAX_T (see there) */
    int fp8_linear_tiled_min_t; /* FP8-resident dense linears of this many tokens up to 64 (and up to
                                 fp8_native_max_t) take the tiled GEMM on the codes
                                 (linear_tiled_fp8.cu; float32 weights, x near-fp32) before the
                                 MMV8 and the dequantising path; > 64: off
                                 (MSM_CUDA_FP8_LINEAR_TILED_MIN_T) */
    int fp8_gemv_rows;        /* rows a warp of the FP8 SIMT GEMV: 1, 2 or 4; 0 (default): 2 at one
                                 token a chunk, else 4. The same bits (MSM_CUDA_FP8_GEMV_ROWS) */
    int fp8_gemv_split_min_k; /* ... for rows of this many codes or more (MSM_CUDA_FP8_GEMV_SPLIT_MIN_K) */
    bool fp8_gemv_hw;         /* the SIMT FP8 GEMVs (plain, split, norm-in) decode with the hardware's
                                 e4m3 -> half conversion instead of integer operations: the same
                                 products unless one leaves float32's normal range (see
                                 fp8_moe_hw); MSM_CUDA_FP8_GEMV_HW */
    int fp8_gemv_split;       /* the FP8 SIMT GEMV at one token split over K, a block's 4 warps on the
                                 same rows (linear.cu gemv_fp8_split_kernel): 1 row a block (3: with 2
                                 loads a lane in flight) or 2 (2, the default, for rows past
                                 fp8_gemv_split_min_k codes: tuning.cu); 0: unsplit. Another
                                 float32 order of the same products; the norm-in GEMV (norm_linear)
                                 is split the same way (MSM_CUDA_FP8_GEMV_SPLIT) */
    int fp8_mma_min_t;        /* ... MMA: the tensor-core MMV8 from this T on, the SIMT GEMV below
                                 (MSM_CUDA_FP8_MMA_MIN_T) */
    bool fp8_moe_tiled;       /* FP8-resident experts past fp8_native_max_t, up to
                                 MSM_CUDA_MOE_TILED_MAX_T tokens: the tiled GEMMs on the codes
                                 (moe_tiled.cu); off: dequantised to bf16 for the bf16 paths, as
                                 before (MSM_CUDA_FP8_MOE_TILED=0). On by default: 2.2x faster at
                                 batch 128 (H200, 2026-12-01) */
    int mmv_slots;            /* the MMV's and MMV8's K slices fill at most this many blocks an SM in
                                 one wave (MSM_CUDA_MMV_SLOTS; 0: the kernel's occupancy, below) */
    int mmv_per_sm;           /* resident blocks of the MMV (mmv_kernel<1, 8, 8>) on one SM */
    int mmv_warps;            /* the MMV's warps a block, 4 (default: twice the blocks for narrow
                                 weights) or 8 (MSM_CUDA_MMV_WARPS); the same bits either way */
    int mmv4_per_sm;          /* ... resident blocks at 4 warps */
    int mmv_cluster_fit[2][4][3]; /* clusters of the MMV the GPU holds at once, by warps (4, 8), token tiles
                                     (1-4) and cluster size (2, 4, 8) (GPU facts) */
    int mmv_u8_max_blocks;    /* MMV grids (one token tile) of at most this many blocks keep 8 K chunks
                                 of weight loads a warp in flight instead of 4 (MSM_CUDA_MMV_U8_MAX_BLOCKS;
                                 0: never; default 2 an SM) */
    bool mmv_l2_rest;         /* the MMVs whose K slice takes more than one round of weight loads
                                 prefetch the later rounds' rows into L2 before the PDL wait (one bulk
                                 prefetch a row; MSM_CUDA_MMV_L2_REST=0|1; off by default) */
    bool mmv_fit_clusters;    /* the MMV's K slices also keep its clusters within one wave
                                 (mmv_cluster_fit; MSM_CUDA_MMV_FIT_CLUSTERS=0: by blocks alone). On:
                                 Qwen1.5-MoE 3-8 tokens -0.03..0.05 ms (H200, 2026-12-03 eighth session,
                                 bench/results/2026-12-03-h200-s8 run 3). The FP8 MMV8 keeps its rule
                                 by blocks: the same check there (its clusters at a typical shared
                                 memory) took GLM-4.5-Air FP8 at 4 tokens from 15.19 to 15.87 ms (run 5) */
    bool linear_norm_fused;   /* LINEAR_ADD_RMSNORM: the GEMV's last block does the add + norm
                                 (msm_cuda_linear_add_rmsnorm; MSM_CUDA_LINEAR_NORM=1); off: the two
                                 kernels. Off by default: checked bitwise on the H200 but no faster
                                 (Qwen3-30B-A3B batch 1 3.715 vs 3.695 ms, batch 4 7.78 vs 7.56,
                                 Qwen1.5-MoE batch 1 2.142 vs 2.115; 2026-12-01): the last block's
                                 serial norm stays on the critical path, only the launch goes */
    int mmv8_per_sm[4];       /* ... of the MMV8 at 1, 2, 4, 8 token tiles */
    int mmv_bslice;           /* the MMV of one token tile with its K slices as warps of a block
                                 (mmv_kernel's WS, no cluster) where its grid of N / 16 blocks is one
                                 wave: 0 off, 1 by that rule (MSM_CUDA_MMV_BSLICE=0|1), 4 / 8 / 16
                                 forced slices (tests). Bitwise a cluster of as many slices, not the
                                 clusters' own choice of slices: a numerics choice like mmv_slots */
    int mmvb_per_sm[3][2];    /* resident blocks of the block-sliced MMV at 16, 8, 4 slices and 4, 8
                                 chunks in flight (GPU facts; 8 only at 16 slices) */
    int mmv_nj;               /* the block-sliced MMV's n8 tiles a warp: 2 (16 rows) or 4 (32 rows at 2
                                 chunks in flight, each x fragment feeding twice the MMAs, wherever a
                                 slice count fits), or 0 (default): 32 rows where that keeps as many
                                 warps as the 16-row pick, and on the aux stream up to 8 tokens
                                 (linear.cu); the same bits at the same K slices (MSM_CUDA_MMV_NJ) */
    int mmvb4_per_sm[3];      /* resident blocks of that 32-row form at 16, 8, 4 slices */
    int mmv_stream_min_n;     /* linears of 2-8 tokens with at least this many rows (the lm_head's
                                 vocabulary; K <= 2048) stream on mmv_stream_kernel (linear.cu: one
                                 block an SM over 16-row tiles, its weights brought in by bulk
                                 copies), bitwise the block-sliced MMV at 16 slices; 0: off
                                 (MSM_CUDA_MMV_STREAM_MIN_N; default 32768: tuning.cu) */
    int mmv_stream_bs_min_n;  /* the block-sliced MMV's picks of 8 or 16 K slices (3-8 tokens, K <= 2048,
                                 not on the aux stream) of at least this many rows stream on
                                 mmv_stream_kernel of as many slices: the same bits
                                 (MSM_CUDA_MMV_STREAM_BS_MIN_N; 0: off; default 4096) */
    int mmv_stream_st;        /* ... its stages of shared memory, 2 (150 KiB at K = 2048) or 3 (216 KiB);
                                 0 (default): 2 where a block has at most 3 tiles, else 3
                                 (MSM_CUDA_MMV_STREAM_ST=0|2|3) */
    int mmv_stream_min_t;     /* ... from this many tokens (MSM_CUDA_MMV_STREAM_MIN_T; 2..8) */
    bool mmv_stream_ok;       /* its shared memory granted (GPU fact) */
    int att_max_split;        /* attention context splits per (token, head), 1..16 (MSM_CUDA_ATT_MAX_SPLIT) */
    int att_mma_split_gqa_max;/* ... and at most this many where the split tensor-core kernel takes 4-8
                                 query heads a kv head (0: att_max_split alone; MHA keeps that;
                                 MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX; the measured default in tuning.cu) */
    int att_group;            /* attention blocks take up to this many query heads of a kv head, 1..4
                                 (MSM_CUDA_ATT_GROUP; 1: one head a block) ... */
    int att_group_min;        /* ... once T * nh reaches this (0: the block slots of one wave) */
    int att_mma;              /* MSM_CUDA_ATT_MMA_*: the tensor-core GQA attention (attention_mma.cu)
                                 never, by the rule below, or wherever it applies (MSM_CUDA_ATT_MMA) */
    bool att_mma_split;       /* ... its context split over a thread-block cluster, merged through
                                 distributed shared memory, where 4 or more query heads share a kv
                                 head (hd 64 or 128) and a power-of-two split of 2-16 (up to
                                 att_max_split) keeps the call in one wave of the GPU's blocks and
                                 clusters: taken before either kernel above (decode of 4-16 tokens on
                                 Qwen3-MoE; not the SIMT kernel's bits, held to the CPU like the
                                 unsplit one), where a kv head's query heads fill one block (8 or
                                 fewer: past that each head group reads the cache again), at
                                 att_mma_split_min_t..max_t tokens, and MHA at
                                 1..att_mma_split_mha_max_t (MSM_CUDA_ATT_MMA_SPLIT) */
    int att_mma_split_min_t;  /* ... from this many tokens (MSM_CUDA_ATT_MMA_SPLIT_MIN_T) */
    int att_mma_split_max_t;  /* ... up to this many (MSM_CUDA_ATT_MMA_SPLIT_MAX_T; 0: no bound) */
    int att_mma_split_mha_max_t; /* ... and for MHA (one query head a kv head) at 1..this many tokens
                                 (MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T; 0: never) */
    int att_mma_split_per_sm[2]; /* ... its blocks an SM at hd 64, 128 (GPU fact) */
    int att_mma_split_fit[2][17]; /* ... its clusters of ns blocks the GPU holds at once (GPU fact) */
    int router_chunk_per_sm;  /* routers over many tokens take token chunks while the chunks' grid
                                 has this many blocks an SM (MSM_CUDA_ROUTER_CHUNK_PER_SM; 0: 2) */
    int router_cluster_max_t; /* the fused router (ROUTER_LINEAR_TOPK) of up to this many tokens, where
                                 one block a logit (T * E <= 1024), as one thread-block cluster a token
                                 whose rank 0 ranks the logits from distributed shared memory instead of
                                 a counter and the last block reloading them from L2 (router.cu; the
                                 same bits; MSM_CUDA_ROUTER_CLUSTER=N, 0: never). Default 1 (H200,
                                 2026-12-03 eighth session, bench/results/2026-12-03-h200-s8 run 1, ms a
                                 step at 1 / 2 / 4 / 8 tokens, three rounds, cluster vs counter:
                                 Qwen3-30B-A3B 2.78 vs 2.87-2.88, 4.02-4.04 vs 4.03-4.04, 6.07-6.08 vs
                                 6.10-6.12, 9.13-9.15 vs 9.18-9.22; its FP8 2.65-2.67 vs 2.73-2.76,
                                 8 tokens 8.49-8.51 vs 8.40-8.43; Qwen1.5-MoE 1.73-1.74 either way, 2 /
                                 4 tokens 2.58-2.59 / 3.40-3.41 vs 2.56-2.58 / 3.35-3.38: a cluster
                                 of 15-16 blocks waits for room in one GPC where the shared expert's
                                 or many tokens' blocks fill the SMs) */
    bool router_group;        /* the fused router's last block groups the pairs by expert for the routed
                                 experts after it (msm_cuda_router_groups; MSM_CUDA_ROUTER_GROUP=0|1)
                                 instead of the grouping kernel. Default off: measured slower at most
                                 batches (tuning.cu) */
    int router_cluster_max;   /* the largest cluster it launches (16 where the device allows, else 8; GPU fact) */
    int norm_router_cluster_max; /* ... and the one its norm-fused form launches (msm_cuda_norm_router_linear_topk
                                    at router_cluster_max_t tokens; GPU fact) */
    int router_tcluster_max_t; /* the fused router of 2 up to this many tokens, one block a logit (T * E <=
                                 1024), as clusters of router_tcluster_tb tokens: a block's weight rows
                                 read once for the cluster's tokens, before the PDL wait, each token ranked
                                 by its own block of the cluster (router.cu router_tcluster_kernel; the
                                 same bits; MSM_CUDA_ROUTER_TCLUSTER=N, 0: never). Where
                                 router_cluster_max_t also takes the call, that form runs; where the
                                 router groups for the experts (router_group), only if one cluster
                                 holds every token (its block 0 groups them after the ranking); never
                                 where the node's layer has kernels beside it on the aux stream
                                 (msm_cuda_exec.aux_beside). Default 8, 2 tokens a cluster (tuning.cu) */
    int router_tcluster_tb;   /* ... tokens a cluster: 2, 4 or 8 (fewer where the cluster has fewer
                                 blocks, or 16 rows a block: 4; MSM_CUDA_ROUTER_TCLUSTER_TB) */
    int router_tcluster_max;  /* the largest cluster the batched form (router_tcluster_max_t) launches (GPU fact) */
    bool router_st_async;     /* the cluster routers' logits into the ranking blocks by st.async, each
                                 ranking block waiting on its own mbarrier for its E logits' bytes,
                                 instead of distributed stores and a cluster barrier (whose release
                                 after remote stores is a GPU-scope fence, in every block); the same
                                 bits (MSM_CUDA_ROUTER_ST_ASYNC=0|1; default on, measured faster:
                                 tuning.cu) */
    int att_mma_min_blocks;   /* AUTO takes it once its (token, kv head) blocks reach this (0: sms / 4
                                 with 4 or more query heads a kv head, else 4 * sms) */
    bool att_cluster;         /* the SIMT attention's context splits of a (token, head) are one
                                 thread-block cluster merged through distributed shared memory (else
                                 the last block merges through the workspace; the same bits), where
                                 a call's clusters leave a few of those the GPU holds free
                                 (attention.cu, att_cluster_spare; MSM_CUDA_ATT_CLUSTER) */
    int att_cluster_spare;    /* the cluster forms of the split attentions (SIMT and tensor-core) are taken
                                 only while this many of the clusters the GPU holds stay free for the
                                 kernels beside them (MSM_CUDA_ATT_CLUSTER_SPARE; default
                                 MSM_ATT_CLUSTER_SPARE, 8: at 0 Qwen3-30B-A3B at 1 / 2 tokens the same,
                                 Qwen1.5-MoE +0.02 ms at 1, H100, bench/results/2026-12-06-h200-s25 run 7) */
    int att_cluster_fit[4][2][17]; /* clusters of ns split blocks the GPU holds at once, per sub-group
                                      width (as att_per_sm) and vec, ns 2..16 (0: none) */
    bool att_early;           /* decode steps (msm_cuda_exec.decode): the SIMT attention loads its first
                                 K/V rows before its PDL wait (MSM_CUDA_ATT_EARLY) */
    bool att_rope;            /* decode steps: a ROPE_KV_WRITE and the ATTENTION reading it in one
                                 kernel (msm_cuda_attention_rope; MSM_CUDA_ATT_ROPE=1). Off by
                                 default: measured slower (H200, 2026-12-01, ms a step, fused vs two
                                 kernels: Qwen1.5-MoE batch 1 2.08 vs 2.02, 8 5.14 vs 5.04;
                                 Qwen3-30B-A3B 1 3.58 vs 3.53): the small RoPE kernel is where the
                                 attention's blocks become resident and load their first K/V rows,
                                 and without it they wait for the qkv GEMV's blocks to leave */
    int att_qk_rope;          /* decode steps where the split tensor-core attention takes the call
                                 (msm_cuda_attention_mma_splits): a QK_NORM, its ROPE_KV_WRITE and
                                 the ATTENTION in one kernel (msm_cuda_attention_qk_rope; the same
                                 bits): 0 never, 1 where the qkv projection before is not
                                 FP8-resident (the CUDA backend), 2 (default) always
                                 (MSM_CUDA_ATT_QK_ROPE) */
    bool small_early;         /* decode steps: the RoPE kernels (rope_kv, qk_norm_rope_kv) read the
                                 positions and cache slots, compute their cosines and sines and load
                                 the q/k norm weights before their PDL wait, so only the row loads and
                                 the arithmetic on them follow the kernel before (MSM_CUDA_SMALL_EARLY) */
    bool fp8_moe_hw;          /* the FP8 pair-path expert kernels decode codes with the hardware's e4m3x2 ->
                                 half2 conversion and multiply x and the scales unscaled (msm_rows_dot_fp8's
                                 HW), ~1.5 instead of ~3 instructions a code plus no x scaling; bitwise the
                                 integer decode's results unless a product leaves float32's normal range
                                 (|x| below ~2^-97: the integer path scales x by 2^100). These kernels are
                                 issue-bound at one token (ncu, bench/results/2026-12-02-h200). On by
                                 default: H200, 2026-12-02 third session, ms a step at 1 / 2 / 4 tokens,
                                 Qwen3-30B-A3B FP8 2.93 / 4.16 / 6.09 -> 2.84 / 3.93-3.96 / 5.69-5.75,
                                 GLM-4.5-Air FP8 7.37 / 10.40 / 15.85-15.97 -> 7.04-7.08 / 10.01-10.05 /
                                 15.27-15.32 (MSM_CUDA_FP8_MOE_HW=0: the integer decode) */
    int fp8_moe_lean;         /* MSM_CUDA_FP8_MOE_LEAN: the FP8 pair-path gate/up and split down GEMVs on
                                 msm_rows_dot_fp8_lean (one load a lane a row in flight, the codes four at a
                                 time), the same bits in registers that make the grids of one token one wave
                                 where the general form spills: the gate/up at 40 registers (12 blocks an SM,
                                 Qwen3-30B-A3B's 1536 blocks in one wave; 79 and two waves now), the down at 4
                                 rows a warp at 64 without spills (512 blocks, one wave; 2 rows and 63
                                 registers, two waves, now). 1: that; 2: the gate/up also loads its next
                                 step's codes before this step's arithmetic (default: measured faster, the
                                 numbers in tuning.cu); 0: the general dot */
    bool gemv_u16;            /* the bf16 GEMV at one token takes a row of 2048 < K <= 4096 (Qwen3-30B-A3B's
                                 o_proj) in one step of 16 loads a lane, all before its PDL wait; the same
                                 bits. On by default: H200, 2026-12-02 third session, Qwen3-30B-A3B batch 1
                                 2.92-3.01 vs 3.02-3.05 ms (four pairs), its o_proj 7.8 -> 4.6 us a layer in
                                 the timeline (MSM_CUDA_GEMV_U16=0: four steps of 4) */
    bool gemv_u8;             /* ... and a row of 1024 < K <= 2048 (Qwen1.5-MoE's qkv, o_proj, shared gate/up)
                                 in one step of 8. Off: no faster (H200, 2026-12-02 third session, Qwen1.5-MoE
                                 batch 1 1.917 / 1.939 / 1.882 vs 1.914 / 1.924 / 1.897 ms, batch 2 the same;
                                 two steps of 4 already overlap) (MSM_CUDA_GEMV_U8=1) */
    bool norm_router;         /* an ADD_RMSNORM and the ROUTER_LINEAR_TOPK reading its norm (Qwen3-MoE,
                                 Mixtral: no shared expert forked between them) run as one kernel, every
                                 block norming its token's row (msm_cuda_norm_router_linear_topk): one
                                 kernel boundary less. Off by default: checked bitwise on the H200 but
                                 slower (2026-12-02 third session, ms a step at 1 / 2 / 4 / 8 tokens, on vs
                                 off: Qwen3-30B-A3B 3.19-3.20 / 4.45-4.47 / 6.76-6.78 / 9.81-9.83 vs
                                 3.06-3.08 / 4.22 / 6.53 / 9.34-9.38, FP8 2.95-3.00 vs 2.84-2.85): each
                                 block's own norm (a 2048 row from L2, two block sums) costs more than the
                                 boundary it saves (timeline: 11 us a layer against the norm's 2.5 + the
                                 router's 6) (MSM_CUDA_NORM_ROUTER=1). Where the cluster router
                                 takes the call (router_cluster_max_t: one token) the fused form is
                                 now one cluster a token too, every block norming the row
                                 (norm_router_cluster_kernel; measured slower too: H200, 2026-12-05
                                 twentieth session, s18 run 3, Qwen3-30B-A3B 1 / 2 tokens 2.956-2.968
                                 / 4.170-4.177 vs 2.660 / 3.963-3.967, FP8 1 token 2.755-2.759 vs
                                 2.406-2.411) */
    int norm_router_max_t;    /* ... up to this many tokens (MSM_CUDA_NORM_ROUTER_MAX_T) */
    int moe_tiled_bm;         /* tokens a pass of the tiled expert GEMMs: 16 (5 pipeline stages; FP8 8), 32 (4;
                                 FP8 6) or 64 (3; FP8 4); 0 (default): by the mean tokens an expert (moe_tiled.cu). The
                                 same sums (MSM_CUDA_MOE_TILED_BM). The auto rule, measured on the H200
                                 (2026-12-02 fourth session, ms a step against 64 at 32 / 64 / 128 / 256
                                 tokens): Qwen1.5-MoE 8.54 / 9.93 / 12.02 / 16.48 -> 8.08 / 9.48 / 11.60 /
                                 15.88-15.93, Qwen3-30B-A3B 16.53 / 18.61 / 20.37 / 24.68 -> 15.52-15.60 /
                                 17.81-17.91 / 19.61-19.72 / 23.50-23.56 */
    int fp8_tiled_ks;         /* 64-wide K steps a pipeline stage of the FP8 expert GEMMs at 16 or 32 tokens
                                 a pass (tiled.h tf_gemm): 1 (default), or 2, each stage reading 128
                                 contiguous bytes of a code row instead of 64 and half the barriers for
                                 the same codes (MSM_CUDA_FP8_TILED_KS; the same sums; not yet measured) */
    int rows_pipe;            /* MSM_CUDA_PIPE_* kernels whose bf16 rows take msm_rows_dot's software
                                 pipelining where a row is more than one step of loads (K > 256 * U): the
                                 next step's loads go out before this step's arithmetic, so a warp's loads
                                 stay in flight (the SASS of gemv_kernel showed none across steps), for
                                 more registers; the same sums (MSM_CUDA_ROWS_PIPE=mask) */
    int moe_aux_serial_max_t; /* up to this many tokens the routed experts' first kernel launches once
                                 the router is done instead of as its programmatic dependent, where a
                                 shared expert runs beside them on the aux stream: its waiting blocks
                                 then do not hold the SMs the shared expert's kernels, launched at the
                                 norm's end, need (timeline of Qwen1.5-MoE batch 1, bench/results/
                                 2026-12-02-h200-s2: the shared gate/up started 15 us after its norm,
                                 behind them). Measured (ms a step): Qwen1.5-MoE batch 1 / 2 / 8 2.02-2.04
                                 / 2.78-2.83 / 4.90-4.93 -> 1.97 / 2.75-2.77 / 4.86-4.89; past 8 it loses
                                 (GLM-4.5-Air FP8 batch 128 57.8 -> 63.2, Qwen1.5 batch 32 8.51 -> 8.58).
                                 0: never (MSM_CUDA_MOE_AUX_SERIAL_MAX_T) */
    int gemv_minb;            /* MSM_CUDA_MINB_* kernels compiled for 12 blocks an SM (40 registers): the
                                 qkv + RoPE kernel at one token (Qwen1.5-MoE's 1536 blocks then fit
                                 one wave), the one-token bf16 GEMV (one row a warp, 4 loads a lane);
                                 the same bits (MSM_CUDA_GEMV_MINB=mask) */
    bool att_bt_cache;        /* the SIMT attention copies its block's block-table entries into shared
                                 memory first, and the tensor-core one loads each warp's next entry an
                                 iteration ahead, so K/V loads wait for no table load (the same bits;
                                 MSM_CUDA_ATT_BT_CACHE=0: a table load before each tile's loads) */
    int moe_group_scan_max_t; /* the grouped SIMT expert GEMVs (bf16) of up to this many tokens (and at
                                 most MSM_CUDA_MOE_SCAN_MAX_P pairs) find their expert's pairs
                                 themselves (each block scans the ids) instead of after the one-block
                                 grouping kernel, which then leaves the step; rows stay in pair order
                                 (the same bits; MSM_CUDA_MOE_GROUP_SCAN_MAX_T; default 0, never:
                                 measured slower on Qwen3-30B-A3B, tuning.cu) */
    int moe_gg_gateup_nt;     /* grouped SIMT GEMVs: tokens a pass of the gate/up (2 or 4) and the */
    int moe_gg_down_nt;       /* down (2, default, or 4), 16-byte K chunks of a row in flight a lane in the */
    int moe_gg_down_u;        /* down (2 or 3; bf16 rows), the same sums in the same order whatever
                                 the choice (MSM_CUDA_MOE_GG_GATEUP_NT, _DOWN_NT, _DOWN_U) */
    int moe_gg_gateup_u;      /* ... and in the gate/up (2, 3 or 4; bf16 rows, the same sums;
                                 MSM_CUDA_MOE_GG_GATEUP_U) */
    int moe_gg_persist;       /* MSM_CUDA_MOE_PERSIST_* mask: those grouped SIMT GEMVs (bf16 rows with
                                 16-byte loads, compact grid) on the blocks the GPU holds at once, each
                                 looping over (selected expert, row chunk) items (the same bits;
                                 MSM_CUDA_MOE_GG_PERSIST=0..3; default 0: slower on the H100, tuning.cu) */
    bool moe_gg_early;        /* ... the grouped down loads its first weights before its PDL wait (the
                                 gate/up before it triggers only after its own wait, so the routing
                                 it reads is complete; MSM_CUDA_MOE_GG_EARLY) */
    bool linear_swiglu;       /* a bf16 LINEAR whose output only its SWIGLU reads, at one or two
                                 tokens: one kernel (msm_cuda_linear_swiglu, bitwise the two;
                                 MSM_CUDA_LINEAR_SWIGLU) */
    bool linear_rope_mmv;     /* ... the qkv LINEAR + ROPE_KV_WRITE pairing at 3-16 tokens too, on the
                                 block-sliced MMV with its rows regrouped by head halves (full rotary;
                                 bitwise the two kernels; MSM_CUDA_LINEAR_ROPE_MMV; on: measured faster at
                                 8 tokens, the numbers in tuning.cu) */
    int linear_swiglu_rows;   /* ... its gate and up rows a warp, 1, 2 (default) or 4 (fewer blocks;
                                 the same bits; MSM_CUDA_LINEAR_SWIGLU_ROWS) */
    bool norm_linear_swiglu;  /* an ADD_RMSNORM, the bf16 gate/up LINEAR on its norm and its SWIGLU, at
                                 one or two tokens: one kernel (msm_cuda_norm_linear_swiglu, bitwise the
                                 three; a shared expert forked before its norm, pass fork_before_norm,
                                 or a dense MLP). Off by default: measured no faster (H200, 2026-12-05
                                 twentieth session, s18 run 2, Qwen1.5-MoE with fork_before_norm, ms
                                 a step at 1 / 2 / 8 tokens, three rounds: 1.695-1.697 / 2.257-2.259
                                 / 4.187-4.201 vs the default's 1.669-1.696 / 2.210-2.244 /
                                 4.193-4.225; at 4 rows a warp 1.723-1.730 / 2.276-2.285)
                                 (MSM_CUDA_NORM_LINEAR_SWIGLU) */
    bool norm_qk_rope;        /* an ADD_RMSNORM, the qkv LINEAR on its norm, its QK_NORM and the
                                 ROPE_KV_WRITE, at one or two tokens: one kernel, a head's blocks one
                                 cluster (msm_cuda_norm_linear_qk_rope, bitwise the norm-in GEMV then
                                 msm_cuda_qk_norm_rope_kv; Qwen3-MoE). Off by default: measured slower
                                 (H200, 2026-12-05 twentieth session, s19 run 2, Qwen3-30B-A3B at 1 / 2
                                 tokens, three rounds: 2.809-2.816 / 4.174-4.181 vs 2.645-2.675 /
                                 3.981-4.000) (MSM_CUDA_NORM_QK_ROPE) */
    int norm_swiglu_rows;     /* ... its gate and up rows a warp, 2 (default: 8 outputs a block of 8
                                 warps, 80 registers, three blocks an SM) or 4 (16 outputs, half the
                                 blocks, ~105 registers, two an SM); the same bits
                                 (MSM_CUDA_NORM_SWIGLU_ROWS) */
    int aux_gemv_rows;        /* the one- and two-token bf16 GEMV's rows a warp on the aux stream (the
                                 shared expert's down), 1 or 2 (default): half the blocks, more SMs
                                 for the routed experts beside it; the same bits
                                 (MSM_CUDA_AUX_GEMV_ROWS) */
    bool moe_gg_compact;      /* ... after the grouping, a grid row per selected expert (the grouping
                                 kernel's table, min(E, T * k) rows) instead of one per expert, most of
                                 whose blocks found nothing to do at 5-11 tokens; the same sums
                                 (MSM_CUDA_MOE_GG_COMPACT) */
    int stream_prio;          /* launch priority of the aux stream's kernels (the shared expert's),
                                 above the main stream's (the block scheduler dispatches a waiting block
                                 of a higher-priority grid first): MSM_CUDA_PRIO_OFF, _AUX (every step)
                                 or _AUTO (default: decode steps of MSM_CUDA_AUX_PRIO_MIN_T..MAX_T
                                 tokens). (The main stream's above the aux's at every decode step was
                                 slower: bench/results/2026-12-04-h200-s13 run 3) */
    int l2_prefetch_max_t;    /* PREFETCH nodes (pass prefetch_l2) pull their weights into L2 at steps
                                 of up to this many tokens, none past it (bandwidth-bound phases
                                 throughout); 0: never (MSM_CUDA_L2_PREFETCH_MAX_T; default 16) */
    size_t l2_prefetch_bytes; /* ... at most this many bytes a node, its weights in order
                                 (MSM_CUDA_L2_PREFETCH_MB; default 24 MiB, about half the H200's L2) */
    int l2_prefetch_kv_max_t; /* PREFETCH_KV nodes (pass prefetch_l2 with prefetch_kv, on by default)
                                 pull their K/V cache rows into L2 at decode steps of up to this many
                                 tokens, none past it; 0: never (MSM_CUDA_L2_PREFETCH_KV_MAX_T; tuning.cu) */
    size_t l2_prefetch_kv_bytes; /* ... at most this many bytes of K/V cache a node
                                 (MSM_CUDA_L2_PREFETCH_KV_MB; default 24 MiB) */
    bool l2_prefetch_last;    /* ... with the L2::evict_last policy, so the weights streamed meanwhile
                                 evict them last (MSM_CUDA_L2_PREFETCH_LAST=1; default off) */
    int l2_prefetch_blocks;   /* ... the one-warp blocks issuing the prefetches (MSM_CUDA_L2_PREFETCH_BLOCKS;
                                 default 32) */
    int l2_prefetch_chunk_kb; /* ... KiB a prefetch instruction (MSM_CUDA_L2_PREFETCH_CHUNK_KB; default 16) */
    int l2_persist_mb;        /* MiB of L2 set aside for persisting (evict_last) lines at start-up
                                 (cudaLimitPersistingL2CacheSize; MSM_CUDA_L2_PERSIST_MB; default 0:
                                 the device's setting is left alone) */
} msm_cuda_tuning;

/* msm_cuda_tuning.stream_prio */
enum { MSM_CUDA_PRIO_OFF = 0, MSM_CUDA_PRIO_AUX = 1, MSM_CUDA_PRIO_AUTO = 2 };
/* MSM_CUDA_PRIO_AUTO's decode steps: with the shared expert's SIMT GEMVs (3-4 tokens) above the
 * routed experts' grouped GEMVs, its down GEMV runs beside the routed gate/up instead of delaying
 * the routed down (timeline of Qwen1.5-MoE batch 4: span 3881 -> 3685 us). H200, bench/results/
 * 2026-12-03-h200-s6 run 2, ms a step, two rounds: Qwen1.5-MoE batch 3 / 4 3.871-3.876 /
 * 3.873-3.891 -> 3.705-3.714 / 3.722, but 1 1.78 -> 1.82, 12 5.68 -> 5.79, 32-256 +0.1 with it;
 * GLM-4.5-Air FP8 4 / 8 unchanged (16 / 32 -0.4 / -0.6 with it: MSM_CUDA_STREAM_PRIO=aux). The
 * launch priority of the kernels only; the sums are the same. Up to 11 tokens since the thirteenth
 * session's lighter shared expert and compact grouped grid (bench/results/2026-12-04-h200-s13 run
 * 8, two rounds, priority at every step against 3-4: Qwen1.5-MoE 5 / 8 tokens the same,
 * 3.936-3.938 / 4.285-4.293 vs 3.933-3.935 / 4.283-4.284, 11 tokens 5.541-5.573 vs 5.657-5.665;
 * 12 tokens and up take the tiled experts, where it measured slower above). */
#define MSM_CUDA_AUX_PRIO_MIN_T 3
#define MSM_CUDA_AUX_PRIO_MAX_T 11

/* msm_cuda_tuning.rows_pipe: the GEMV at 2 tokens (o_proj, the shared expert, dense MLPs), the GEMV
 * reading its RMSNorm (qkv), the pair-path experts' gate/up and their down at up to 4 slots */
enum { MSM_CUDA_PIPE_GEMV = 1, MSM_CUDA_PIPE_NORM_IN = 2, MSM_CUDA_PIPE_MOE_GU = 4, MSM_CUDA_PIPE_MOE_DOWN = 8 };
/* msm_cuda_tuning.gemv_minb: kernels compiled for 12 blocks an SM */
enum { MSM_CUDA_MINB_QKV = 1, MSM_CUDA_MINB_GEMV = 2 };

/* Defaults for `device` (which must be current), with its multiprocessor count and the
 * occupancy of the kernels that size their grids by it. 0 or a negative errno. */
int msm_cuda_tuning_init(msm_cuda_tuning *t, int device);

/* Where and how a launcher enqueues: the stream and the rank's tuning (never NULL). Passed by
 * value as every launcher's last argument. decode: every sequence of the step has one token
 * (T == S), so the KV cache rows below each token's position were written by earlier steps and
 * the step's inputs (positions, sequences, block tables) before its first kernel; a kernel may
 * then read them before its PDL wait (attention does). False is always correct. */
typedef struct msm_cuda_exec {
    cudaStream_t stream;
    const msm_cuda_tuning *tune;
    bool decode;
    bool no_pdl;    /* launch without programmatic serialisation (after the previous kernel is done),
                       whatever tune->pdl says (msm_cuda_tuning.moe_aux_serial_max_t) */
    bool w_written; /* the weight was written earlier in this step (a dequantised copy): the
                       kernels load it only after their PDL wait (gemv_early, mmv_early) */
    int priority;   /* launch priority (cudaLaunchAttributePriority; 0: the stream's) */
    bool aux_beside; /* kernels of the node's layer run on the aux stream beside it (the shared
                        expert beside the routed experts or the router): the SMs are shared */
    bool on_aux;     /* the node runs on the aux stream (the shared expert's kernels), beside the
                        main stream's: the block-sliced MMV leaves it SMs (mmv_bslice_pick) */
} msm_cuda_exec;

/* Per-rank CUDA context: the cuBLASLt handle and a cache of matmul plans (layouts + the
 * heuristic's algorithm) per shape. Owned by one rank thread, bound to the device current at
 * msm_cuda_ctx_new. Not thread-safe; launches on several streams from that thread are fine. */
typedef struct msm_cuda_ctx msm_cuda_ctx;

int msm_cuda_ctx_new(msm_cuda_ctx **ret_ctx);
void msm_cuda_ctx_free(msm_cuda_ctx *ctx);

/* Builds and caches the cuBLASLt plan for a linear shape now (host work only), so that the first
 * launch inside a graph capture does no heuristic query. Optional: launches build plans lazily. */
int msm_cuda_linear_prepare(msm_cuda_ctx *ctx, int T, int N, int K);

/* out[t,:] = table[ids[t],:]   out [T,H] f32, table [V,H] bf16. */
int msm_cuda_embed(float *out, const uint16_t *table, const int32_t *ids, int T, int H,
                   msm_cuda_exec ex);

/* out[r,:] = x[r,:] / sqrt(mean(x[r,:]^2) + eps) * w[:]   x, out [rows,dim] f32, w [dim] bf16.
 * out may equal x. */
int msm_cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int rows, int dim, float eps,
                     msm_cuda_exec ex);

/* Workspace bytes msm_cuda_linear needs for T tokens of K inputs (0 for the GEMV path). */
size_t msm_cuda_linear_ws_bytes(int T, int N, int K);

/* y[T,N] = x[T,K] @ w[N,K]^T (+ bias[N] when not NULL); w, bias bf16. T <= MSM_CUDA_GEMV_MAX_T
 * runs the GEMV kernel (ctx and ws may be NULL); larger T runs cuBLASLt (bf16 x bf16, fp32
 * accumulate and output) with x rounded to bf16 in ws, which must hold
 * msm_cuda_linear_ws_bytes(T, N, K) bytes. */
int msm_cuda_linear(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N,
                    int K, msm_cuda_ctx *ctx, void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* LINEAR + ROPE_KV_WRITE of the qkv rows in one launch: out [T, (nh + 2 kvh) hd] and the k / v
 * cache entries at slot[t], bitwise msm_cuda_linear (w [(nh + 2 kvh) hd, K] bf16, bias or NULL)
 * then msm_cuda_rope_kv, where msm_cuda_linear_rope_kv_fits (tuning linear_rope; one or two tokens
 * on the GEMV path); else -ENOTSUP. */
bool msm_cuda_linear_rope_kv_fits(int T, int N, int K, int nh, int kvh, int hd, int rot, const void *w,
                                  const void *x, const msm_cuda_tuning *tn);
int msm_cuda_linear_rope_kv(float *out, const float *x, const uint16_t *w, const uint16_t *bias, const int32_t *pos,
                            const int32_t *slot, uint16_t *kc, uint16_t *vc, int T, int K, int nh, int kvh, int hd,
                            int rot, float theta, msm_cuda_exec ex);

/* act [T, I] = silu(gate) * up of gu = x [T, K] . W^T (W [2I, K] bf16: gate rows, then up rows)
 * in one launch, bitwise msm_cuda_linear into gu then msm_cuda_swiglu, where
 * msm_cuda_linear_swiglu_fits (tuning linear_swiglu; one or two tokens on the GEMV path with one
 * row a warp); else -ENOTSUP. */
bool msm_cuda_linear_swiglu_fits(int T, int I, int K, const void *w, const void *x, const msm_cuda_tuning *tn);
int msm_cuda_linear_swiglu(float *act, const float *x, const uint16_t *w, int T, int I, int K, msm_cuda_exec ex);

/* In-place rotate-half RoPE on x [T, nheads, hd] f32 at positions pos[T], over the first rot
 * dims of each head (rot even, <= hd; rot = hd: full RoPE), as msm_cpu_rope. */
int msm_cuda_rope(float *x, const int32_t *pos, int T, int nheads, int hd, int rot, float theta,
                  msm_cuda_exec ex);

/* out = x [T, C] with its first nrot heads of hd (per row) rotated as msm_cuda_rope; the other
 * C - nrot*hd columns copied. One launch. */
int msm_cuda_rope_copy(float *out, const float *x, const int32_t *pos, int T, int C, int nrot,
                       int hd, int rot, float theta, msm_cuda_exec ex);

/* msm_cuda_rope_copy of qkv rows [T, (nh + 2*kvh)*hd] (q and k heads rotated, v copied) that also
 * writes the k heads and the v heads to the bf16 caches at slot[t] (as msm_cuda_kv_write_ld
 * from out would), one launch. */
int msm_cuda_rope_kv(float *out, const float *x, const int32_t *pos, const int32_t *slot,
                     uint16_t *kc, uint16_t *vc, int T, int nh, int kvh, int hd, int rot,
                     float theta, msm_cuda_exec ex);

/* QK_NORM: out = x [T, C] with each of the nh q heads RMS-normalised with wq [hd] and each of the
 * next kvh k heads with wk [hd] (per head, eps), the other columns copied; C % hd == 0,
 * hd <= 256; out may equal x. One launch for all tokens. */
int msm_cuda_qk_norm(float *out, const float *x, const uint16_t *wq, const uint16_t *wk, int T,
                     int C, int nh, int kvh, int hd, float eps, msm_cuda_exec ex);

/* msm_cuda_qk_norm of qkv rows [T, (nh + 2*kvh)*hd] followed by msm_cuda_rope_kv of its output,
 * in one launch (one warp a (token, head): the head normed, rotated and cached in registers), bit
 * for bit the two: out and both caches. Takes what msm_cuda_qk_norm_rope_kv_fits says (rot / 2 a
 * multiple of 32: every half of a pair in the same lane; hd <= 256; T <= 65535); else -ENOTSUP
 * (the caller runs the two). out may equal x. */
bool msm_cuda_qk_norm_rope_kv_fits(int T, int hd, int rot);
int msm_cuda_qk_norm_rope_kv(float *out, const float *x, const uint16_t *wq, const uint16_t *wk, const int32_t *pos,
                             const int32_t *slot, uint16_t *kc, uint16_t *vc, int T, int nh, int kvh, int hd,
                             int rot, float theta, float eps, msm_cuda_exec ex);

/* msm_cuda_kv_write with k, v rows ld floats apart (e.g. read in place from qkv rows). */
int msm_cuda_kv_write_ld(uint16_t *kc, uint16_t *vc, const float *k, const float *v, size_t ld,
                         const int32_t *slot, int T, int kvh, int hd, msm_cuda_exec ex);

/* Writes k, v [T, kvh, hd] f32, rounded to bf16, into the paged caches kc, vc
 * [n_blocks, MSM_KV_BLOCK, kvh, hd] bf16 at slot[t] = block * MSM_KV_BLOCK + offset. A negative
 * slot skips the token. */
int msm_cuda_kv_write(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                      const int32_t *slot, int T, int kvh, int hd, msm_cuda_exec ex);

/* Causal paged attention, decode and prefill alike: token t (of sequence seq[t], at position
 * pos[t]) attends to positions 0..pos[t] of its sequence through
 * block_tables[seq[t] * max_blocks + p / MSM_KV_BLOCK]. q, out [T, nh, hd] f32; kc, vc bf16;
 * GQA: query head h reads kv head h / (nh / kvh). hd <= 256, nh % kvh == 0. Softmax in fp32. */
int msm_cuda_attention(float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                       const int32_t *seq, const int32_t *pos, const int32_t *block_tables,
                       int max_blocks, int T, int nh, int kvh, int hd, float scale,
                       msm_cuda_exec ex);

/* The context splits (2..16, a power of two) over one thread-block cluster with which
 * msm_cuda_attention_ex runs T tokens of these heads on the tensor-core kernel (tuning
 * att_mma_split: 4-8 query heads a kv head at att_mma_split_min_t..max_t tokens or MHA at
 * 1..att_mma_split_mha_max_t, hd 64 or 128,
 * q / kc / vc aligned as that kernel needs, the blocks and the clusters within one wave of the
 * GPU); 0: it does not take the call. */
int msm_cuda_attention_mma_splits(int T, int nh, int kvh, int hd, const void *q, size_t q_ld, const void *kc,
                                  const void *vc, msm_cuda_exec ex);

/* msm_cuda_attention with q rows q_ld floats apart (q read in place from qkv rows) and, when ws
 * holds msm_cuda_attention_ws_bytes(T, nh, hd) bytes, the context split over several blocks per
 * (head, token) when T * nh blocks would leave SMs idle (flash-decoding), merged in a fixed order
 * (deterministic) inside the same launch. ws must be zeroed once before its first use: it starts
 * with arrival counters that every call leaves zero again, so the same ws serves later calls and
 * graph replays (one stream at a time; nothing else may write it in between). A smaller ws, or
 * T * nh over 4096, splits less or not at all. ws NULL: one block per (head, token), as msm_cuda_attention. */
size_t msm_cuda_attention_ws_bytes(int T, int nh, int hd);
int msm_cuda_attention_ex(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                          const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                          const int32_t *block_tables, int max_blocks, int T, int nh, int kvh,
                          int hd, float scale, void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* ROPE_KV_WRITE then ATTENTION (kv_written) on its output: qkv [T, (nh + 2*kvh)*hd] unrotated;
 * the result out [T, nh*hd] and the cache as msm_cuda_rope_kv(qkv_rot, qkv, ...) followed by
 * msm_cuda_attention_ex(out, qkv_rot, (nh + 2*kvh)*hd, ...) leave them, bitwise. At decode
 * (ex.decode; tuning att_rope; rot % 16 == 0, hd % 8 == 0, 16-byte aligned caches, and the SIMT
 * kernel taking the call) one launch: attention rotates q and the token's k itself and writes the
 * token's k and v to the cache, leaving qkv_rot unwritten (the caller knows nothing else reads
 * it); otherwise exactly those two calls. (A padding row, slot < 0, then attends with its own k
 * and v instead of whatever the cache holds at its position; its output is unused either way.) */
int msm_cuda_attention_rope(float *out, float *qkv_rot, const float *qkv, uint16_t *kc, uint16_t *vc,
                            const int32_t *seq, const int32_t *pos, const int32_t *slot,
                            const int32_t *block_tables, int max_blocks, int T, int nh, int kvh, int hd,
                            int rot, float theta, float scale, void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* QK_NORM (wq, wk: the q / k head norms' weights, bf16 [hd]; eps), then ROPE_KV_WRITE, then
 * ATTENTION (kv_written) on its output, in one launch of the split tensor-core attention at decode:
 * qkv [T, (nh + 2*kvh)*hd] raw; out [T, nh*hd] and the caches as msm_cuda_qk_norm_rope_kv(qkv_rot,
 * qkv, ...) followed by msm_cuda_attention_ex(out, qkv_rot, (nh + 2*kvh)*hd, ...) leave them,
 * bitwise (qkv_rot is never written: the caller knows nothing else reads it). Only where
 * msm_cuda_attention_qk_rope_fits (ex.decode, tunings att_early and att_qk_rope, rot a multiple of
 * 64 up to hd, and msm_cuda_attention_mma_splits taking the call); -ENOTSUP otherwise, -EINVAL
 * for a missing pointer. */
bool msm_cuda_attention_qk_rope_fits(int T, int nh, int kvh, int hd, int rot, const void *qkv, const void *kc,
                                     const void *vc, msm_cuda_exec ex);
int msm_cuda_attention_qk_rope(float *out, const float *qkv, const uint16_t *wq, const uint16_t *wk, float eps,
                               uint16_t *kc, uint16_t *vc, const int32_t *seq, const int32_t *pos, const int32_t *slot,
                               const int32_t *block_tables, int max_blocks, int T, int nh, int kvh, int hd, int rot,
                               float theta, float scale, msm_cuda_exec ex);

/* y[i] = a[i] + b[i]; y may alias a or b. */
int msm_cuda_add(float *y, const float *a, const float *b, size_t n, msm_cuda_exec ex);

/* msm_cpu_moe_combine on the GPU: wg bf16; one block per row, the gate dot summed as in
 * msm_cuda_moe_combine_rmsnorm. */
int msm_cuda_moe_combine(float *out, const float *routed, const float *shared, const float *h,
                         const uint16_t *wg, int rows, int dim, msm_cuda_exec ex);
/* msm_cpu_moe_combine_rmsnorm on the GPU: wg, w bf16; one block per row (the gate dot and the
 * sum of squares reduced in a fixed order; fused multiply-adds, so not bitwise the op chain). */
int msm_cuda_moe_combine_rmsnorm(float *sum, float *out, const float *x, const float *routed,
                                 const float *shared, const float *h, const uint16_t *wg,
                                 const uint16_t *w, int rows, int dim, float eps, msm_cuda_exec ex);

/* sum = a + b, out = rmsnorm(sum) * w, rows of dim; bitwise the result of msm_cuda_add then
 * msm_cuda_rmsnorm, in one launch. sum may alias a or b. */
int msm_cuda_add_rmsnorm(float *sum, float *out, const float *a, const float *b, const uint16_t *w,
                         int rows, int dim, float eps, msm_cuda_exec ex);

/* LINEAR_ADD_RMSNORM: sum = r + (x . W^T + b), out = rmsnorm(sum) * nw, bitwise msm_cuda_linear
 * into sum then msm_cuda_add_rmsnorm(sum, out, r, sum, nw): with tuning linear_norm_fused, T <= 4
 * and the GEMV's shapes, one kernel whose last block does the add + norm (ctr: a zeroed counter of
 * this stream, left zero); else those two calls (ctx, ws as msm_cuda_linear's). x, W, r as the
 * linear's and the norm's; sum may not alias x or r. */
int msm_cuda_linear_add_rmsnorm(float *sum, float *out, const float *x, const uint16_t *w, const uint16_t *bias,
                                const float *r, const uint16_t *nw, int T, int N, int K, float eps, unsigned *ctr,
                                msm_cuda_ctx *ctx, void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* y[t,:] = x[t,:] * s[t]   (x, y [T,D], s [T]). y may equal x. */
int msm_cuda_scale_rows(float *y, const float *x, const float *s, int T, int D,
                        msm_cuda_exec ex);

/* y[i] = 1 / (1 + exp(-x[i])). */
int msm_cuda_sigmoid(float *y, const float *x, size_t n, msm_cuda_exec ex);

/* y[t,i] = silu(gu[t,i]) * gu[t,I+i]   (gu [T,2I], y [T,I]). */
int msm_cuda_swiglu(float *y, const float *gu, int T, int I, msm_cuda_exec ex);

/* Router: softmax over logits[t,:E] in fp32, top-k (highest first, lowest id on ties),
 * renormalised to sum 1 when norm. ids, w [T,k] stay on the device. E <= 256, k <= 8. */
int msm_cuda_router_topk(int32_t *ids, float *w, const float *logits, int T, int E, int k,
                         bool norm, msm_cuda_exec ex);

/* Group-limited sigmoid router, msm_cpu_router_group_topk on the device: bias [E] float32 (the
 * one weight kept in fp32: bf16 would move the selection), all math fp32, the same ids (lowest id
 * on ties) and weights up to expf's last bits (2 ulp). E <= 256, k <= 8, n_group <= 32 dividing E with
 * E / n_group >= 2, topk_group <= n_group, k <= topk_group * E / n_group. No workspace. */
int msm_cuda_router_group_topk(int32_t *ids, float *w, const float *logits, const float *bias,
                               int T, int E, int k, int n_group, int topk_group, bool norm,
                               float scale, msm_cuda_exec ex);

/* Workspace bytes msm_cuda_moe_experts needs: the f32 SwiGLU activations [T*k, I] on the GEMV
 * path; grouping tables, bf16 activations and per-pair outputs [T*k, H] f32 on the grouped path. */
size_t msm_cuda_moe_experts_ws_bytes(int T, int H, int I, int k, int E);

/* Routed experts: y[t,:] = sum_j w[t,j] * down_e(swiglu(gate_up_e x[t,:])), e = ids[t,j].
 * gate_up [E, 2I, H] bf16 (gate rows then up rows), down [E, H, I] bf16, x, y [T,H] f32,
 * ids, w [T,k] on the device, k <= 8, E <= 256. Reads only the selected experts' weights. ws: at least
 * msm_cuda_moe_experts_ws_bytes(T, H, I, k, E) bytes, 256-byte aligned. */
int msm_cuda_moe_experts(float *y, const float *x, const int32_t *ids, const float *w,
                         const uint16_t *gate_up, const uint16_t *down, int T, int H, int I, int k,
                         int E, void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* out[r,:] = x[rows[r],:]   x [*, C], out [R, C] f32, rows [R] on the device (GATHER_ROWS: the
 * rows of a step that produce logits). */
int msm_cuda_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C,
                         msm_cuda_exec ex);

/* Samples one token per row of logits [R,V] (rows ld >= V floats apart) with params p[R] (on the
 * device) into out[R]: greedy (argmax, lowest id on ties) when temperature <= 0, else
 * temperature, top-k, top-p and the counter-based RNG exactly as msm_cpu_sample. R <= 65535.
 * ws: msm_cuda_sample_ws_bytes(R, V) bytes, 256-byte aligned, for the arg-max over chunks of a
 * row in parallel; NULL (or fewer bytes) scans each row in its one block instead (slower at a
 * large vocabulary: the same tokens). */
size_t msm_cuda_sample_ws_bytes(int R, int V);
int msm_cuda_sample(int32_t *out, const float *logits, size_t ld, const msm_sample_params *p, int R, int V,
                    void *ws, size_t ws_bytes, msm_cuda_exec ex);

/* The router GEMV and msm_cuda_router_topk in one launch (graph op ROUTER_LINEAR_TOPK): wr [E,K]
 * bf16, x [T,K]; ids/w as msm_cuda_router_topk, bitwise msm_cuda_linear (N = E, no bias) then
 * msm_cuda_router_topk. ws: msm_cuda_router_ws_bytes(T, E) bytes, 16-byte aligned, zeroed once
 * before the first call (its counters return to zero after every call), one per stream. Above
 * MSM_CUDA_ROUTER_FUSED_MAX_T tokens: the two launches.
 * grp (NULL: none): the routed experts that read these ids next (grp->ids == ids, the same T, k,
 * E), where msm_cuda_router_groups(grp): then the router's last block (or the batched cluster
 * form's block 0) also groups the pairs by expert into grp->ws (the grouping kernel's work,
 * msm__moe_group_block), and the experts run with grp->grouped set, nothing touching grp->ws
 * between. Elsewhere grp gives -EINVAL. */
#define MSM_CUDA_ROUTER_FUSED_MAX_T 64
typedef struct msm_cuda_moe_args msm_cuda_moe_args; /* the routed experts' call, below */
size_t msm_cuda_router_ws_bytes(int T, int E);
int msm_cuda_router_linear_topk(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E,
                                int K, int k, bool norm, const msm_cuda_moe_args *grp, void *ws, size_t ws_bytes,
                                msm_cuda_exec ex);

/* Whether the fused router groups for the experts m (tuning router_group, m's T up to
 * MSM_CUDA_ROUTER_FUSED_MAX_T, msm_cuda_moe_groups(m)). The router then takes its counter form (its
 * last block is the one that knows every token is ranked), or the batched cluster form where one
 * cluster holds every token (its block 0 groups after a cluster barrier); never one cluster a token.
 * A pure function. */
bool msm_cuda_router_groups(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn);
/* Whether msm_cuda_router_linear_topk of T tokens takes the batched cluster form (tuning
 * router_tcluster_max_t) with 16-byte aligned x and weights, no grouping and ex.aux_beside as
 * given: for the tests. */
bool msm_cuda_router_batched(int T, int E, int K, bool aux_beside, const msm_cuda_tuning *tn);

/* ADD_RMSNORM (sum = a + b, out = rmsnorm(sum) * nw, [T,K]) and the ROUTER_LINEAR_TOPK reading out in
 * one launch: every block norms its token's row itself (one cluster a token where the cluster router
 * takes the call, router_cluster_max_t; else the counter form); bitwise msm_cuda_add_rmsnorm then
 * msm_cuda_router_linear_topk (ids, weights, sum, out). Where msm_cuda_norm_router_fits (tuning
 * norm_router, up to norm_router_max_t tokens, K % 8 == 0, 1024 <= K <= 4096); else -EINVAL. ws as
 * msm_cuda_router_linear_topk's. */
bool msm_cuda_norm_router_fits(int T, int E, int K, const msm_cuda_tuning *tn);
int msm_cuda_norm_router_linear_topk(int32_t *ids, float *w, float *sum, float *out, const float *a, const float *b,
                                     const uint16_t *nw, float eps, const uint16_t *wr, int T, int E, int K, int k,
                                     bool norm, const msm_cuda_moe_args *grp, void *ws, size_t ws_bytes,
                                     msm_cuda_exec ex);

/* A span of device memory for msm_cuda_l2_prefetch. */
#define MSM_CUDA_PREFETCH_MAX_SPANS 6 /* a PREFETCH node's 3 weights, FP8 codes and scales each */
typedef struct msm_cuda_span {
    const void *p;
    size_t bytes;
} msm_cuda_span;

/* Graph op PREFETCH: asks the TMA units to bring sp[0..n) into L2, in order, at most
 * ex.tune->l2_prefetch_bytes in all (the whole 16-byte units of each span; the rest left out), in
 * chunks of l2_prefetch_chunk_kb KiB issued by l2_prefetch_blocks one-warp blocks (with the
 * evict_last policy when l2_prefetch_last). A hint: nothing waits for the lines, no memory
 * changes. 0 or a negative errno (-EINVAL: n outside 0..MSM_CUDA_PREFETCH_MAX_SPANS). */
int msm_cuda_l2_prefetch(const msm_cuda_span *sp, int n, msm_cuda_exec ex);

/* Graph op PREFETCH_KV: asks the TMA units to bring each token's K and V cache rows of positions
 * 0 .. pos[t] - 1 into L2: its cache blocks (block_tables[seq[t] * max_blocks + b], each MSM_KV_BLOCK
 * slots of kvh * hd bf16, contiguous) from the first, at most ex.tune->l2_prefetch_kv_bytes in all
 * (split evenly over the T tokens), skipping entries outside the n_blocks of the caches (with the
 * evict_last policy when l2_prefetch_last). A hint: no memory changes. 0 or a negative errno. */
int msm_cuda_kv_prefetch(const uint16_t *kc, const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                         const int32_t *block_tables, int max_blocks, int n_blocks, int T, int kvh, int hd,
                         msm_cuda_exec ex);

/* ---- FP8 block-scaled weights resident on the device (docs/adr/0006-fp8.md) ----
 * A weight [n_expert, rows, cols] kept as its float8_e4m3fn codes (one byte each, the same
 * layout) plus float32 scales [n_expert, rows, ceil((cols + phase) / 128)]: one per row and
 * 128-column block of the checkpoint tensor the row came from, so rows of several tensors (q, k
 * and v; gate and up) and TP slices that start inside a block all keep their own scales
 * (3% more bytes than the codes). Element (e, r, c) is
 * f32(q) * scale[e][r][(c + phase) / 128], where phase is the column of the checkpoint tensor the
 * weight's column 0 came from, modulo 128 (a row-parallel TP slice's offset; 0 otherwise).
 * The FP8 GEMVs (T <= msm_cuda_tuning.fp8_native_max_t; the column count and phase multiples of
 * 16) multiply x by that float32 value (no bf16 rounding: the CPU oracle's float32 weights, summed
 * as in msm_rows_dot_fp8), and so do the FP8 tiled MoE GEMMs that take the routed experts from
 * fp8_moe_tiled_min_t (5) tokens up to MSM_CUDA_MOE_TILED_MAX_T (H, I and both phases multiples of 64; tuning
 * fp8_moe_tiled). Other large-T calls (dense linears, experts past the tiled range or of other
 * phases) dequantise into a bf16 scratch buffer (msm_cuda_fp8_dequant: exactly the weight a
 * bf16-resident load would hold) and run the bf16 paths. */
#define MSM_CUDA_FP8_BLOCK 128
/* The FP8 linear kernels: by default the SIMT GEMV up to fp8_mma_min_t - 1 tokens and the
 * tensor-core MMV8 (linear_fp8.cu; SIMT where it does not fit) from there; or for comparison the
 * SIMT GEMV at every T with the integer decode or the hardware cvt (MSM_CUDA_FP8_LINEAR=
 * mma|simt|simt_hw). Default threshold measured on the H200 at Qwen3-30B-A3B's shapes
 * (bench/results/2026-12-01-h200-fp8): T = 1, 5120 x 2048: SIMT 7.5 us, MMV8 13.1; T = 8: SIMT
 * 22.5, MMV8 14.2 (bf16 11.1). With the MMV8 grid in one wave (mmv_slots), the Qwen3-30B-A3B
 * FP8 step (bench/results/2026-12-01-h200-perf): batch 3 7.86 -> 7.46 ms and 4 7.86 -> 7.44 with the
 * MMV8 from 2 tokens on, batch 2 5.20 vs 5.26 and batch 1 4.00 vs 4.15 (from 1) with the SIMT GEMV. */
#define MSM_CUDA_FP8_MMA_MIN_T 3
enum { MSM_CUDA_FP8_LINEAR_MMA = 0, MSM_CUDA_FP8_LINEAR_SIMT = 1, MSM_CUDA_FP8_LINEAR_SIMT_HW = 2 };
/* Default of msm_cuda_tuning.fp8_native_max_t. */
#define MSM_CUDA_FP8_NATIVE_MAX_T 64
/* msm_cuda_tuning.fp8_linear_max_t of pure decode steps: their FP8 dense linears past 8 tokens
 * dequantise to bf16 for cuBLASLt, as the bf16 decode rounds x to bf16 for it (2 + 2 bytes a weight
 * of extra traffic, against an MMV8 bound by its instructions past 8 tokens: 35 us a layer for each
 * of Qwen3-30B-A3B's qkv and o_proj at batch 32, 1 byte a weight). H200, 2026-12-02 fifth session
 * (bench/results/2026-12-02-h200-s5), ms a step, dequantised past 8 vs the MMV8 up to 64 (run 2):
 * Qwen3-30B-A3B FP8 batch 24 / 32 / 64 13.36-13.39 / 14.30 / 16.56-16.58 vs 14.32-14.33 / 15.91 /
 * 20.92-20.94, GLM-4.5-Air FP8 batch 16 / 32 / 64 31.13 / 37.68 / 45.91 vs 35.57 / 51.27 / 79.82;
 * past 8 vs past 16 (run 3): GLM-4.5-Air 12 / 16 29.77 / 31.30 vs 34.18-34.26 / 36.06-36.16, but
 * Qwen3-30B-A3B 12 / 16 11.09 / 11.86 vs 10.89-10.96 / 11.64-11.69 (its MMV8 keeps up to 16 tokens).
 * The weights then meet x as bf16-rounded values (the bf16 preset's numerics) instead of float32
 * ones (MSM_CUDA_FP8_LINEAR_DECODE_MAX_T). */
#define MSM_CUDA_FP8_LINEAR_DECODE_MAX_T 8
/* Default of msm_cuda_tuning.fp8_linear_tiled_min_t: from 5 tokens instead of the MMV8 (H200,
 * bench/results/2026-12-03-h200-s6 run 1, ms a step, two rounds: GLM-4.5-Air FP8 batch 5 / 8
 * 19.24-19.29 / 21.43-21.50 -> 18.35-18.37 / 20.61-20.62; Qwen3-30B-A3B FP8 5 / 6 / 8 unchanged) */
#define MSM_CUDA_FP8_LINEAR_TILED_MIN_T 5
typedef struct msm_cuda_fp8w {
    const uint8_t *q;    /* codes [n_expert, rows, cols] */
    const float *scale;  /* [n_expert, rows, ceil((cols + phase) / 128)] */
    int phase;           /* 0..127 */
} msm_cuda_fp8w;
#ifdef __CUDACC__
#define MSM_CUDA_HD __host__ __device__
#else
#define MSM_CUDA_HD
#endif
/* Scales of an FP8 weight [n_expert, rows, cols] of column phase `phase`. */
static inline MSM_CUDA_HD size_t msm_cuda_fp8_scales(int n_expert, int rows, int cols, int phase) {
    return (size_t)n_expert * (size_t)rows * (size_t)((cols + phase + 127) / 128);
}

/* used[e] = whether ids[0..n) names expert e (E <= 256): for msm_cuda_fp8_dequant. */
int msm_cuda_fp8_mark(int32_t *used, const int32_t *ids, int n, int E, msm_cuda_exec ex);
/* dst [n_expert, rows, cols] bf16 = the FP8 weight w dequantised and rounded; with `used`
 * (device, [n_expert]) only the experts marked there (the others' rows are left as they are). */
int msm_cuda_fp8_dequant(uint16_t *dst, msm_cuda_fp8w w, int n_expert, int rows, int cols,
                         const int32_t *used, msm_cuda_exec ex);

/* msm_cuda_linear with an FP8-resident weight w [N, K]: the FP8 GEMV up to fp8_native_max_t
 * tokens (K and w.phase % 16 == 0, w.q and x 16-byte aligned); otherwise w dequantised into deq
 * (msm_cuda_linear_fp8_deq_bytes(N, K) bytes, 256-byte aligned) and msm_cuda_linear on it (ws as
 * there). */
size_t msm_cuda_linear_fp8_deq_bytes(int N, int K);
int msm_cuda_linear_fp8(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N,
                        int K, msm_cuda_ctx *ctx, void *ws, size_t ws_bytes, uint16_t *deq,
                        size_t deq_bytes, msm_cuda_exec ex);

/* ADD_RMSNORM and the LINEAR reading its norm in one launch, at decode sizes: sum = a + b and
 * out = rmsnorm(sum) * nw (T rows of K; msm_cuda_add_rmsnorm's bits), y [T, N] = out . w^T (+ bias):
 * the bits of msm_cuda_linear (w bf16; w8.q NULL) or msm_cuda_linear_fp8 (w8 FP8-resident; w NULL)
 * on that out. Every GEMV block norms the rows itself into shared memory after its first weight
 * loads (the norm kernel and its launch leave the step); block 0 writes sum and out. Only where
 * msm_cuda_norm_linear_fits (tuning norm_linear; bf16 at 1..2 tokens and FP8 at 1, where those
 * launchers take the GEMV and the fused kernel measured faster; K of 257..2048, FP8 from 512);
 * else -EINVAL. sum and out must not overlap a or b, nor y any of them. */
bool msm_cuda_norm_linear_fits(int T, int N, int K, bool fp8, int ph, const msm_cuda_tuning *tn);
int msm_cuda_norm_linear(float *y, float *sum, float *out, const float *a, const float *b, const uint16_t *nw,
                         float eps, const uint16_t *w, msm_cuda_fp8w w8, const uint16_t *bias, int T, int N, int K,
                         msm_cuda_exec ex);

/* ADD_RMSNORM, the gate/up LINEAR on its norm and the SWIGLU on that in one launch: sum = a + b,
 * out = rmsnorm(sum) * nw (T rows of K, block 0 writes both), act [T, I] = silu(gate) * up of
 * out . w^T (w [2I, K] bf16, gate rows then up rows, no bias), bitwise msm_cuda_add_rmsnorm,
 * msm_cuda_linear and msm_cuda_swiglu; the gate/up product is never written. Only where
 * msm_cuda_norm_linear_swiglu_fits (tuning norm_linear_swiglu, with norm_linear's shapes and
 * tokens for N = 2I, 16-byte aligned w); else -EINVAL. sum and out must not overlap a or b, nor act
 * any of them. */
bool msm_cuda_norm_linear_swiglu_fits(int T, int I, int K, const void *w, const msm_cuda_tuning *tn);
int msm_cuda_norm_linear_swiglu(float *act, float *sum, float *out, const float *a, const float *b, const uint16_t *nw,
                                float eps, const uint16_t *w, int T, int I, int K, msm_cuda_exec ex);

/* The q/k norm and RoPE of msm_cuda_norm_linear_qk_rope: msm_cuda_qk_norm_rope_kv's arguments past
 * its rows (the q and k head norm weights, bf16 [hd], and their eps; the positions and slots of the
 * T tokens; the layer's caches, rows of kvh * hd; nh q, kvh k and kvh v heads of hd; the rotary
 * width and base). */
typedef struct msm_cuda_qk_rope {
    const uint16_t *wq, *wk;
    float eps;
    const int32_t *pos, *slot;
    uint16_t *kc, *vc;
    int nh, kvh, hd, rot;
    float theta;
} msm_cuda_qk_rope;

/* ADD_RMSNORM, the qkv LINEAR on its norm, QK_NORM and ROPE_KV_WRITE in one launch: sum = a + b,
 * out = rmsnorm(sum) * nw (T rows of K, block 0 writes both), the qkv rows (w [(nh + 2 kvh) hd, K]
 * bf16, or FP8-resident w8 with w NULL; bias or NULL) of out, their q and k heads normed with
 * q.wq / q.wk and rotated, written to y [T, (nh + 2 kvh) hd] and the k and v heads to the caches at
 * q.slot (none where negative): bitwise msm_cuda_norm_linear then msm_cuda_qk_norm_rope_kv; the
 * unnormed qkv rows are never written. Only where msm_cuda_norm_linear_qk_rope_fits (tuning
 * norm_qk_rope; one or two tokens bf16, one FP8, where msm_cuda_norm_linear takes the norm-in GEMV;
 * hd 64 or 128, rot 64 or 128); else -EINVAL. sum and out must not overlap a or
 * b, nor y any of them. */
bool msm_cuda_norm_linear_qk_rope_fits(int T, int K, int nh, int kvh, int hd, int rot, bool fp8, int ph,
                                       const msm_cuda_tuning *tn);
int msm_cuda_norm_linear_qk_rope(float *y, float *sum, float *out, const float *a, const float *b, const uint16_t *nw,
                                 float eps, const uint16_t *w, msm_cuda_fp8w w8, const uint16_t *bias,
                                 msm_cuda_qk_rope q, int T, int K, msm_cuda_exec ex);

/* msm_cuda_moe_experts with FP8-resident expert weights gate_up [E, 2I, H] and down [E, H, I].
 * From fp8_moe_tiled_min_t tokens up to MSM_CUDA_MOE_TILED_MAX_T (moe_path AUTO; TILED at any T)
 * the FP8 tiled GEMMs on the codes, where H, I and both phases are multiples of 64, the codes 16-byte aligned
 * and fp8_moe_tiled is on (deq is then not touched and may be NULL); below that and up to
 * fp8_native_max_t tokens (H, I and the phases % 16 == 0, aligned) the FP8 pair GEMVs
 * (T <= MSM_CUDA_MOE_GEMV_MAX_T) or grouped GEMVs (tensor-core, or SIMT); otherwise the selected
 * experts are dequantised into deq (msm_cuda_moe_fp8_deq_bytes(H, I, E) bytes, 256-byte aligned)
 * and msm_cuda_moe_experts runs on them. ws as there. */
size_t msm_cuda_moe_fp8_deq_bytes(int H, int I, int E);
int msm_cuda_moe_experts_fp8(float *y, const float *x, const int32_t *ids, const float *w,
                             msm_cuda_fp8w gate_up, msm_cuda_fp8w down, int T, int H, int I, int k,
                             int E, void *ws, size_t ws_bytes, void *deq, size_t deq_bytes,
                             msm_cuda_exec ex);

/* One call of the routed experts (msm_cuda_moe_experts: gate_up and down bf16; or
 * msm_cuda_moe_experts_fp8: gate_up and down NULL, gu and dn FP8-resident, deq its scratch) as one
 * argument, for the combine left to the norm after them (tuning moe_fused_combine). */
struct msm_cuda_moe_args {
    const float *x;
    const int32_t *ids;
    const float *w;
    const uint16_t *gate_up, *down;
    msm_cuda_fp8w gu, dn;
    int T, H, I, k, E;
    void *ws, *deq;
    size_t ws_bytes, deq_bytes;
    bool grouped; /* ws already holds the grouping of ids: the router that wrote them left it there
                     (msm_cuda_router_linear_topk's grp), so no grouping kernel runs. Only where
                     msm_cuda_moe_groups (else the calls taking m answer -EINVAL) */
};

/* Whether m's path groups the (token, slot) pairs by expert in one kernel before its GEMVs or
 * GEMMs (the grouped GEMVs that do not scan, the tiled and WMMA GEMMs, the FP8 grouped GEMVs and
 * tiled GEMMs; not the pair GEMVs nor the dequantising FP8 path): the grouping a router may do
 * instead (msm_cuda_router_groups). A pure function of its arguments. */
bool msm_cuda_moe_groups(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn);

/* msm_cuda_moe_experts or msm_cuda_moe_experts_fp8 (m->gu.q set) with m's arguments into y [T, H],
 * skipping the grouping where m->grouped. */
int msm_cuda_moe_experts_args(float *y, const msm_cuda_moe_args *m, msm_cuda_exec ex);

/* Whether the pair path (1-4 tokens, k experts a token, FP8 or bf16 down) takes the early split
 * down under t (moe_pair_early: ON, or AUTO but at one token with a kernel beside it on the aux
 * stream; only where the split down kernel is taken). A pure function of its arguments. */
bool msm_cuda_moe_pair_early(const msm_cuda_tuning *t, int T, int k, bool fp8, bool aux_beside);

/* Whether m's path ends with the combine kernel and the tuning leaves it to the next norm
 * (moe_fused_combine): then msm_cuda_moe_experts_deferred runs everything but the combine (the sum
 * is never written), and msm_cuda_moe_add_rmsnorm or msm_cuda_moe_combine_rmsnorm_routed, with the
 * same m (its workspace untouched between), computes it inside the norm: sum = a + routed, out =
 * rmsnorm(sum) * nw (rows of H), bitwise the experts then msm_cuda_add_rmsnorm; or the shared
 * expert's combine (msm_cuda_moe_combine_rmsnorm's arguments past routed) on it, bitwise the
 * experts then msm_cuda_moe_combine_rmsnorm. Where m does not defer, -EINVAL. */
bool msm_cuda_moe_defers(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn);
int msm_cuda_moe_experts_deferred(const msm_cuda_moe_args *m, msm_cuda_exec ex);
int msm_cuda_moe_add_rmsnorm(float *sum, float *out, const float *a, const uint16_t *nw, float eps,
                             const msm_cuda_moe_args *m, msm_cuda_exec ex);
int msm_cuda_moe_combine_rmsnorm_routed(float *sum, float *out, const float *x, const float *shared, const float *h,
                                        const uint16_t *wg, const uint16_t *nw, float eps, const msm_cuda_moe_args *m,
                                        msm_cuda_exec ex);

/* ---- one-shot all-reduce over peer memory (allreduce.cu) ----
 * For the collectives of a TP group whose ranks' GPUs reach each other's memory (NVLink peer
 * access, enabled by the backend). Not a twin of a CPU kernel: its oracle is the host group's
 * all-reduce (msm_comm), and NCCL's all-reduce on the same data. */
#define MSM_CUDA_AR_MAX_RANKS 8
#define MSM_CUDA_AR_MAX_BLOCKS 256
/* Default of msm_cuda_tuning.ar_oneshot_max_bytes: the one-shot all-reduce beat NCCL's at every
 * size measured, 8 KiB to 32 MiB, on two H200s over NVLink (5.6 vs 6.4 us at 8 KiB, 12.9 vs 27.3
 * us at 2 MiB, 109 vs 139 us at 32 MiB; bench/cuda_allreduce.c, bench/results/2026-11-30-h200-tp2).
 * Past the largest size measured, NCCL. */
#define MSM_CUDA_AR_ONESHOT_MAX_BYTES (32u << 20)
/* A rank's view of its group, passed by value into every call (so a captured graph keeps it). */
typedef struct msm_cuda_ar_peers {
    int rank, size;
    const char *base[MSM_CUDA_AR_MAX_RANKS]; /* each rank's buffer (the arena), same layout everywhere */
    uint32_t *sig[MSM_CUDA_AR_MAX_RANKS];    /* each rank's signal area (msm_cuda_ar_signal_bytes, zeroed) */
    uint32_t *fault;                          /* host-mapped word this rank's kernels set on a timeout */
    unsigned long long timeout_ns;            /* how long a block waits for a peer */
} msm_cuda_ar_peers;

/* Bytes of one rank's signal area. */
size_t msm_cuda_ar_signal_bytes(void);

/* out[i] = sum over ranks r = 0..size-1 (in that order) of ((float *)(base[r] + off))[i], i < n.
 * Every rank of the group must make the same sequence of calls (same n). out must not overlap
 * this rank's input. A peer that does not arrive within timeout_ns sets *fault and leaves out
 * undefined. */
int msm_cuda_allreduce_oneshot(float *out, size_t off, size_t n, const msm_cuda_ar_peers *p,
                               msm_cuda_exec ex);

/* sum = x + (the one-shot all-reduce of the [rows, dim] floats at off), out = rmsnorm(sum) * w:
 * bit for bit msm_cuda_allreduce_oneshot then msm_cuda_add_rmsnorm(sum, out, x, that, w, ...).
 * sum and out must not overlap this rank's input (x may equal sum). */
int msm_cuda_allreduce_add_rmsnorm(float *sum, float *out, size_t off, const float *x, const uint16_t *w,
                                   int rows, int dim, float eps, const msm_cuda_ar_peers *p,
                                   msm_cuda_exec ex);

#ifdef __cplusplus
}
#endif

#endif
