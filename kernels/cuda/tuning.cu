/* tuning.cu: msm_cuda_tuning_init, the per-rank defaults of every launcher's choices (kernel
 * paths, thresholds, programmatic dependent launch) and the GPU facts they size grids by
 * (multiprocessors, the occupancy of the persistent and wave-sized kernels). The backend calls it
 * once per rank, on that rank's device, then applies its configuration; nothing here is global. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <string.h>

extern "C" int msm_cuda_tuning_init(msm_cuda_tuning *t, int device) {
    memset(t, 0, sizeof *t);
    t->device = device;
    t->pdl = true;
    t->gemv_prefetch = false; /* measured slower at batch 1 (bench/results/2026-12-01-h200) */
    t->gemv_early = true;
    t->qk_rope = true;
    t->linear_rope = true;
    t->norm_linear = true;
    t->fp8_gemv_rows = 0; /* 2 at one token, else 4 (linear.cu) */
    t->fp8_gemv_u8 = true;
    /* the one-token FP8 GEMVs' hardware decode (H200, 2026-12-05 sixteenth session,
     * bench/results/2026-12-05-h200-s16 run 2, ms a step, as MSM_CUDA_FP8_LINEAR=simt_hw, the same
     * kernels at 1-2 tokens): Qwen3-30B-A3B FP8 1 / 2 tokens 2.399-2.405 / 3.499-3.506 vs
     * 2.402-2.414 / 3.580-3.598 (three rounds), GLM-4.5-Air FP8 6.313-6.326 / 9.093-9.118 vs
     * 6.629-6.637 / 9.436-9.441 (two) */
    t->fp8_gemv_hw = true;
    /* split over K, 2 rows a block, for rows longer than the unsplit GEMV's one round of loads
     * (4096 codes: GLM-4.5-Air's o_proj, 12288). Measured at every K in s16 run 2: GLM-4.5-Air FP8
     * batch 1 6.121-6.129 vs 6.313-6.326, but Qwen3-30B-A3B FP8 (rows of 2048 and 4096 codes)
     * 2.428-2.431 vs 2.399-2.405, the 1-row forms slower on both (+0.13..+0.9). The rule (H200,
     * 2026-12-05 seventeenth session, bench/results/2026-12-05-h200-s17 run 1, two rounds):
     * GLM-4.5-Air FP8 1 / 2 tokens 6.159-6.183 / 9.131-9.153 vs 6.320-6.365 / 9.114-9.163 (split at
     * every K 6.135-6.184), Qwen3-30B-A3B FP8 2.423-2.435 / 3.506-3.515 vs 2.430-2.447 /
     * 3.513-3.524 (nothing split there) */
    t->fp8_gemv_split = 2;
    t->fp8_gemv_split_min_k = 4097;
    t->gemv_max_t = MSM_CUDA_GEMV_MAX_T;
    t->mmv_min_t = MSM_CUDA_MMV_MIN_T;
    t->mmv_max_t = MSM_CUDA_MMV_MAX_T;
    /* 4 warps: Qwen1.5-MoE batch 8 4.94-4.97 -> 4.86-4.87 ms, Qwen3-30B-A3B batch 5-8 unchanged
     * (H200, 2026-12-01) */
    t->mmv_warps = 4;
    /* the K slices as a block's warps where one wave (H200, 2026-12-04 twelfth session,
     * bench/results/2026-12-04-h200-s12 run 2, ms a step at 3 / 5 / 8 tokens, two rounds, against
     * the clusters): Qwen1.5-MoE 3.302-3.303 / 4.196-4.201 / 4.530-4.541 vs 3.322-3.329 /
     * 4.301-4.312 / 4.605-4.611, Qwen3-30B-A3B 5.698-5.709 / 8.016-8.024 / 8.893-8.894 vs
     * 5.971-5.990 / 8.292-8.300 / 9.146; 16 unchanged. A different K split than the clusters'
     * rule: a different order of the fp32 sums (against the CPU 2e-5, the kernel tests) */
    t->mmv_bslice = 1;
    /* 32 rows a warp (4) by the 16-row rule (H200, 2026-12-04, bench/results/2026-12-04-h200-s12 run
     * 8, ms a step at 3 / 5 / 8 tokens): Qwen1.5-MoE 3.079-3.084 / 4.109-4.115 / 4.410-4.417 vs
     * 3.205-3.208 / 4.209-4.213 / 4.549-4.550, Qwen3-30B-A3B 5.919-5.936 / 8.258-8.274 /
     * 9.104-9.130 vs 5.684-5.692 / 8.028-8.040 / 8.914-8.917 (its o_proj at 64 blocks). Only where
     * the 32-row grid covered every SM (-s13 run 1, three rounds): Qwen1.5-MoE 3.175-3.183 /
     * 4.175-4.182 / 4.485-4.487 vs 3.197-3.198 / 4.185-4.193 / 4.530-4.549, Qwen3 still +0.1 (its
     * qkv at half the warps). Now 0, auto (linear.cu): 32 rows where the warps stay (-s13 run 2: no
     * change beyond noise) and on the aux stream, the shared expert's MMVs (-s13 run 3, three rounds,
     * 3 / 4 / 5 / 8 tokens): Qwen1.5-MoE 3.041-3.056 / 3.056-3.075 / 3.911-3.922 / 4.256-4.275 vs
     * 16 rows 3.185-3.188 / 3.209-3.217 / 4.079-4.084 / 4.426-4.430 and 32 everywhere 3.072-3.082 /
     * 3.088-3.092 / 3.959-3.964 / 4.280-4.288; Qwen3 (no shared expert) as at 16 rows */
    t->mmv_nj = 0;
    /* the streamed MMV for linears of 32768 rows or more at 2-8 tokens (the lm_head; linear.cu
     * mmv_stream_kernel). Its first form (cp.async ring) measured (H200, 2026-12-05 seventeenth
     * session, bench/results/2026-12-05-h200-s17 run 2, three rounds, ms a step): Qwen1.5-MoE 2 / 3
     * / 4 / 8 tokens 2.239-2.242 / 3.027-3.037 / 3.040-3.050 / 4.206-4.216 vs 2.257-2.279 /
     * 3.054-3.083 / 3.065-3.095 / 4.238-4.266, Qwen3-30B-A3B 2 / 4 / 8 -0.020 / -0.015 / -0.039,
     * its FP8 preset 2 / 8 -0.030 / -0.033; the lm_head at 8 tokens 201.6 -> 159.7 us (Nsight
     * Compute, DRAM 65% -> 82% busy). The bulk-copy form here (run 3, three rounds against it off):
     * Qwen1.5-MoE 2 / 3 / 4 / 8 tokens -0.031 / -0.027 / -0.042 / -0.031 (8: 4.182-4.190 vs
     * 4.218-4.233), Qwen3-30B-A3B 2 / 4 / 8 -0.032 / -0.018 / -0.052, its FP8 preset -0.044 at 2 and
     * 8; the lm_head at 8 tokens 150.9 us (DRAM 87% busy) */
    t->mmv_stream_min_n = 32768;
    t->mmv_stream_min_t = 2;
    /* The block-sliced MMV's picks of 8 or 16 slices (3-8 tokens) stream from 4096 rows, the same
     * bits. Measured with the 16-slice kernel on Qwen3-30B-A3B's qkv (5120 x 2048; twenty-ninth
     * session, H100, bench/results/2026-12-06-h200-s29 run 3, three rounds): at 2 stages 2 / 4 / 8
     * tokens -0.011 / -0.057 / -0.075 ms (its share of the 8-token step 9.1 -> 6.1 us a layer:
     * every weight tile copied before the PDL wait), at 3 stages +0.004 / +0.171 / +0.135 (216 KiB
     * of shared memory: the SMs keep the 228 KiB carveout's small L1 through the o_proj and the
     * experts after it; run 1). The kept form, 8 warps for the qkv's 8 slices at 2 stages (run 4,
     * three rounds, against 0): 2 / 3 / 4 / 8 tokens 0.000 / -0.043 / -0.028 / -0.056 (the 16-slice
     * one another 0.02-0.035 faster, but other bits). Stages 0: auto (linear.cu mmvs_run: 2 where a
     * block has at most 3 tiles, 3 for a longer stream such as the lm_head) */
    t->mmv_stream_bs_min_n = 4096;
    t->mmv_stream_st = 0;
    t->mmv_fit_clusters = true;
    t->linear_tiled_min_t = MSM_CUDA_LINEAR_TILED_MIN_T;
    t->lt_split_min_t = MSM_CUDA_LT_SPLIT_MIN_T;
    t->moe_path = MSM_CUDA_MOE_PATH_AUTO;
    t->moe_tiled_min_t = MSM_CUDA_MOE_TILED_MIN_T;
    t->ar_oneshot_max_bytes = MSM_CUDA_AR_ONESHOT_MAX_BYTES;
    t->fp8_resident = true;
    t->fp8_native_max_t = MSM_CUDA_FP8_NATIVE_MAX_T;
    t->fp8_linear_max_t = MSM_CUDA_FP8_NATIVE_MAX_T; /* decode steps: MSM_CUDA_FP8_LINEAR_DECODE_MAX_T */
    t->fp8_linear_tiled_min_t = MSM_CUDA_FP8_LINEAR_TILED_MIN_T;
    t->fp8_mma_min_t = MSM_CUDA_FP8_MMA_MIN_T;
    /* against dequantising the experts to bf16 each step (H200, 2026-12-01 sixth session, ms a step at batch
     * 128 / 256): Qwen3-30B-A3B FP8 45.7 / 51.0 -> 20.5 / 26.4, GLM-4.5-Air FP8 125.8 / 147.7 ->
     * 57.8 / 85.7 (bench/results/2026-12-01-h200-s6); MSM_CUDA_FP8_MOE_TILED=0 dequantises */
    t->fp8_moe_tiled = true;
    /* from 5 tokens (was 8) since the tiled GEMMs' deeper pipelines: ms a step at 5 / 6 / 7, tiled vs
     * the grouped FP8 GEMVs (H200, 2026-12-02 fifth session, bench/results/2026-12-02-h200-s5 run 4):
     * Qwen3-30B-A3B FP8 7.31-7.33 / 7.78-7.85 / 8.48-8.52 vs 7.79-7.83 / 8.68-8.71 / 9.36-9.39,
     * GLM-4.5-Air FP8 18.33-18.42 / 19.58-19.62 / 20.90-20.98 vs 20.66-20.72 / 22.67-22.80 /
     * 24.66-24.85; at 2-4 the GEMVs win (run 1: 3.91 / 5.58 / 5.64-5.71 vs 4.66-4.68 / 6.51-6.54 /
     * 6.53-6.55) */
    t->fp8_moe_tiled_min_t = 5;
    t->fp8_tiled_ks = 1; /* 2: not yet measured (bench/results/2026-12-08-h200-s41) */
    t->att_max_split = 16;
    /* the split tensor-core GQA attention at most 8 ways (H100, 2026-12-07 thirty-fourth session,
     * bench/results/2026-12-07-h200-s34 run 13, after its second look, ms a step, three rounds, caps
     * against the rule's 16 / 16 / 8 / 4 splits at 2 / 4 / 8 / 16 tokens): 8 Qwen3-30B-A3B -0.045 /
     * +0.002 / +0.011 / +0.007, its FP8 preset -0.019 at 4 and -0.011 at 8; 4 -0.005..+0.005 /
     * -0.042 / -0.011 / -0.016 but FP8 +0.041 / +0.003 at 4 / 8; 2 +0.04..+0.16 everywhere. MHA (one
     * token of Qwen1.5-MoE) keeps 16 */
    t->att_mma_split_gqa_max = 8;
    t->att_group = 4;
    t->att_mma = MSM_CUDA_ATT_MMA_AUTO;
    /* the tensor-core attention split over a cluster from 4 tokens where a kv head's query heads fill
     * one block (H200, 2026-12-05 twentieth session, bench/results/2026-12-05-h200-s19 run 2, ms a
     * step, three rounds, against the SIMT kernel): Qwen3-30B-A3B (8 query heads a kv head) at
     * 1 / 2 / 4 / 8 / 16 tokens 2.724-2.751 / 4.015-4.046 / 5.680-5.707 / 8.243-8.268 /
     * 12.306-12.340 vs 2.645-2.675 / 3.981-4.000 / 5.714-5.720 / 8.620-8.642 / 12.456-12.505,
     * its FP8 preset at 1 / 8 2.477-2.502 / 8.108-8.151 vs 2.403-2.412 / 8.588-8.628; GLM-4.5-Air
     * FP8 (12 a kv head: two head groups, each reading the cache) at 1 / 8 6.125-6.160 /
     * 20.763-20.810 vs 6.176-6.181 / 20.647-20.670 */
    t->att_mma_split = true;
    /* ... from 2 tokens since its cluster merge became cheap (the cluster size a template constant,
     * weights once per (head, split)): Qwen3-30B-A3B at 2 tokens 4.581-4.598 ms against
     * 4.610-4.634 from 4 (four rounds, H100, 2026-12-06 twenty-sixth session,
     * bench/results/2026-12-06-h200-s26 run 3; the H200's rounds in run 5). (Run 3's 3-token
     * arms are not comparable: one ran eagerly, the other replayed the 4-token graph.) */
    t->att_mma_split_min_t = 2;
    /* ... up to 16 tokens: at 32 (two splits) slower, s20 run 1 (two rounds): Qwen3-30B-A3B
     * 15.771-15.785 vs 15.652-15.657 unsplit; 8 / 16 there 8.219-8.237 / 12.246-12.292 vs
     * 8.613-8.619 / 12.446-12.451 */
    t->att_mma_split_max_t = 16;
    /* ... and for MHA at one token: Qwen1.5-MoE's 16 heads, ms a step, three rounds, against the
     * SIMT kernel split 16 ways over a cluster (H100, 2026-12-05 twenty-first session,
     * bench/results/2026-12-05-h200-s21 runs 1-3): 1 token 2.043-2.065 vs 2.076-2.101,
     * 2.067-2.070 vs 2.111-2.112, 2.060-2.062 vs 2.108-2.114; at 2 tokens +0.012..+0.017, at 4
     * +0.013..+0.025, at 8 +0.077. A lean SIMT kernel for this case (one pass of loads a warp,
     * partials pushed into rank 0) gave -0.035..-0.039 at 1 token and +0.018 at 2 (runs 2-3) and
     * was dropped (commit 22c7e7c has it). */
    t->att_mma_split_mha_max_t = 1;
    t->att_cluster = true;
    t->att_cluster_spare = MSM_ATT_CLUSTER_SPARE;
    t->att_early = true;
    t->att_bt_cache = true;
    /* the qkv + RoPE kernel at 12 blocks an SM: Qwen1.5-MoE's 1536 blocks in one wave, the kernel
     * alone 15.5 -> 13.3 us in Nsight Compute, batch 1 1.714-1.725 -> 1.710-1.711 ms (three rounds);
     * the one-token GEMV too slowed it (1.754-1.760: the shared expert's gate/up then holds more of
     * the SMs the router and the routed experts need) and did nothing measurable on Qwen3-30B-A3B
     * (H200, 2026-12-03 tenth session, bench/results/2026-12-03-h200-s10 runs 4-5) */
    t->gemv_minb = MSM_CUDA_MINB_QKV;
    t->att_rope = false; /* measured slower: msm_cuda_kernels.h */
    /* the q/k norm inside the split attention (H100, 2026-12-06 twenty-sixth session,
     * bench/results/2026-12-06-h200-s26 runs 4 and 5, ms a step, the kernel before it off minus on,
     * seven rounds): Qwen3-30B-A3B +0.01 / 0.00 / +0.01 / +0.01 / +0.09 at 1 / 2 / 4 / 8 / 16 tokens,
     * its FP8 preset +0.01 / -0.02 / -0.01 / -0.03 / +0.02: the attention's blocks take the SMs the
     * qkv projection leaves, and after the FP8 one the small kernel between was where they landed.
     * After the thirty-fourth session's second look at the split attention (each warp's q / k / v
     * rows at once, no local memory), also after the FP8 projection (H100, 2026-12-07,
     * bench/results/2026-12-07-h200-s34 run 12, 2 against 1, three rounds): Qwen3-30B-A3B FP8 -0.039 /
     * -0.047 / -0.111 / -0.040 ms at 2 / 4 / 8 / 16 tokens, the same bits: 2 */
    t->att_qk_rope = 2;
    t->small_early = true;
    t->moe_aux_serial_max_t = 8;
    /* the grouped SIMT expert GEMVs (bf16, 5-11 tokens). H200, 2026-12-03 ninth session
     * (bench/results/2026-12-03-h200-s9 runs 2-3, ms a step at 5 / 8 / 11 tokens, two rounds): the
     * down at 2 tokens a pass, Qwen1.5-MoE 4.16-4.17 / 4.52-4.54 / 5.69-5.71 vs 4.19-4.20 /
     * 4.59 / 5.74-5.76, Qwen3-30B-A3B 8.37-8.39 / 9.20-9.24 / 11.00-11.05 vs 8.58-8.60 / 9.54-9.56 /
     * 11.40; the gate/up at 2 far slower (Qwen1.5 8 tokens 4.82-4.86), the down's 3 chunks in
     * flight slower (4.64); the down's early weight loads -0.01..0.09. With both (run 3) against
     * the kernels before: Qwen1.5 4.29-4.32 / 4.63 / 5.71-5.73 vs 4.33 / 4.71 / 5.78-5.83,
     * Qwen3 8.31 / 9.17-9.19 / 10.75-10.77 vs 8.53 / 9.47 / 11.04-11.11. Scanning for the pairs
     * instead of the grouping kernel: Qwen1.5 within noise (4.30-4.31 / 4.63-4.64 / 5.83-5.87),
     * Qwen3 +0.3 (8.63-8.66 / 9.48-9.49 / 11.09-11.16; 12288 gate/up blocks each scanning), so
     * off (MSM_CUDA_MOE_GROUP_SCAN_MAX_T=N takes it up to N tokens) */
    t->moe_group_scan_max_t = 0;
    /* the pair path at one token in one wave (H200, 2026-12-04 twelfth session,
     * bench/results/2026-12-04-h200-s12 run 2, ms a step, three rounds): the bf16 down at 4 rows a
     * warp, Qwen3-30B-A3B batch 1 / 2 2.759-2.779 / 4.029-4.057 -> 2.683-2.689 / 4.009-4.018, 3-4
     * the same or -0.01; Qwen1.5-MoE's (k 4) split at 4 rows against one warp a row 1.724-1.736 /
     * 2.575-2.590 / 3.316-3.334 -> 1.701-1.707 / 2.566-2.576 / 3.207-3.234 at 1 / 2 / 4 (at 2 rows:
     * 1.84 at 1); FP8 at 4 rows spills, slower (Qwen3 FP8 2.63 -> 2.71): 2. With the gate/up at 2
     * loads too, Qwen3 batch 1 2.638-2.648, 2 3.991-4.001; at 3-4 slower (+0.05), and Qwen1.5-MoE
     * slower at 1-4 (+0.02-0.04: its shared expert runs beside): AUTO */
    t->moe_down_hb = 0;
    t->moe_gu_u2 = MSM_CUDA_MOE_GU_U2_AUTO;
    t->moe_gg_gateup_nt = 4;
    t->moe_gg_down_nt = 2;
    t->moe_gg_down_u = 2;
    /* the gate/up's K chunks in flight (H100, 2026-12-06 thirtieth session,
     * bench/results/2026-12-06-h200-s30 run 1, ms a step, on minus 2, three rounds): 3 / 4 chunks,
     * Qwen3-30B-A3B 5 / 8 / 16 / 32 tokens +0.017 / +0.015 / -0.002 / +0.014 and +0.042 / +0.030 /
     * 0.000 / -0.002, Qwen1.5-MoE 8 / 16 / 32 +0.007 / -0.019 / -0.011 and +0.049 / -0.012 / -0.008
     * (the H100's gate/up already at 96% of its copy rate; the H200's at 94%, not yet measured) */
    t->moe_gg_gateup_u = 2;
    /* (The grouped SIMT GEMVs' rows by bulk copies into shared memory, in two forms, were removed
     * after measuring slower: one persistent block an SM over a ring of 64 KiB tiles 1.5x (H100,
     * 2026-12-06 thirty-first session, bench/results/2026-12-06-h200-s31 run 2: Qwen3-30B-A3B 8
     * tokens 10.22 -> 15.26 ms), a block's rows at once +1.11 / +1.23 ms at 5 / 8 tokens with both
     * kernels, the down alone +0.05 / +0.31 (H100, 2026-12-07 thirty-second session,
     * bench/results/2026-12-07-h200-s32 run 2, three rounds): a block waits for its whole share
     * before its first FMA.) The grouped SIMT GEMVs on persistent grids (items handed out
     * round-robin, the next item's routing read ahead): off (H100, the same run): gate/up +0.36 /
     * +0.39, down +0.00 / +0.02, both +0.34 / +0.38 */
    t->moe_gg_persist = 0;
    /* (The grouping kernel pulling the head of every gate/up row of the first selected experts into
     * L2 from 16 blocks beside its grouping block was removed after measuring slower (H100,
     * 2026-12-07 thirty-third session, bench/results/2026-12-07-h200-s33 runs 2-3, the same bits):
     * Qwen3-30B-A3B 5 / 8 tokens +0.066 / +0.055 ms with 1 KiB heads of 6 experts, +0.078 / +0.248
     * with their whole rows; Qwen1.5-MoE 8 tokens +0.064 / +0.583. The gate/up's share of the step
     * fell 1.5 us a layer, but the grouping kernel's rose 2.6 (0.6 with one 128-byte line a row):
     * about the prefetched bytes' time at the copy rate (9.4 / 1.2 MB), as if a kernel completes
     * only once its prefetched lines arrive, so a prefetch inside the chain delays the chain about as
     * much as it saves. Only one off the chain (a node on the aux stream after the router) could gain,
     * by at most the ~1 us a layer between the router's end and the gate/up's first loads. Nor do
     * the grouped GEMVs gain from their own rows requested towards L2 ahead of their loads (one bulk
     * prefetch a row from lanes 0 .. R - 1 at an item's start, past the first step: more bytes in
     * flight without registers, for the H200's 94%; removed after measuring slower, H100, 2026-12-07
     * thirty-fourth session, bench/results/2026-12-07-h200-s34 runs 1 and 3, the same bits): Qwen3 8
     * tokens +0.51 / +0.22 / +0.79 ms with whole rows for the gate/up / the down / both (the gate/up
     * 106 -> 123 us a layer), +0.08 / +0.18 with 512 / 1024 bytes a gate/up row; Qwen1.5-MoE 8 tokens
     * +0.35 / +0.23 / +0.53 and +0.08 / +0.19: the cost grows with the bytes prefetched.) */
    t->moe_gg_early = true;
    /* a grid row per selected expert (H200, 2026-12-04, bench/results/2026-12-04-h200-s13 run 2, ms a
     * step at 5 / 8 / 11 tokens, three rounds, against a row per expert): Qwen1.5-MoE 4.038-4.054 /
     * 4.405-4.422 / 5.679-5.722 vs 4.094-4.107 / 4.466-4.473 / 5.709-5.744, Qwen3-30B-A3B
     * 7.747-7.756 / 8.695-8.709 / 10.472-10.535 vs 7.910-7.950 / 8.839-8.856 / 10.555-10.644 */
    t->moe_gg_compact = true;
    /* the gate/up GEMV with the SwiGLU in its epilogue, at 2 rows a warp (H200, 2026-12-04,
     * bench/results/2026-12-04-h200-s13 runs 2-3, Qwen1.5-MoE's shared expert, ms a step at 1 / 2
     * tokens, three rounds): two kernels 1.712-1.725 / 2.555-2.573, one at 1 row a warp
     * 1.686-1.706 / 2.420-2.499, at 2 rows 1.681-1.687 / 2.295-2.299 (half the blocks: more room
     * for the router and the routed experts beside it); at 4 rows 1.744-1.758 / 2.361-2.379 (run 4).
     * The shared expert's down GEMV at 2 rows a warp too (run 4, three rounds): 1.677-1.682 /
     * 2.263-2.267 against 1.673-1.695 / 2.280-2.299. Launching the routed experts as the router's
     * programmatic dependent again, now that the shared expert holds fewer SMs, still slower
     * (1.798-1.800 / 2.426-2.432, 3-8 tokens +0.06-0.11: moe_aux_serial_max_t stays 8) */
    t->linear_swiglu = true;
    /* the qkv MMV + RoPE + K/V write in one kernel at 3-8 tokens (H200, 2026-12-05 sixteenth
     * session, bench/results/2026-12-05-h200-s15 run 1, ms a step, three rounds, vs two kernels):
     * Qwen1.5-MoE 3 / 4 / 8 tokens 3.057-3.076 / 3.065-3.094 / 4.235-4.259 vs 3.068-3.075 /
     * 3.088-3.107 / 4.287-4.301; Qwen3-30B-A3B 5.682-5.719 / 5.704-5.743 / 8.674-8.742 vs
     * 5.680-5.684 / 5.704-5.721 / 8.681-8.705 (the same); bitwise in run 3 */
    t->linear_rope_mmv = true;
    t->linear_swiglu_rows = 2;
    t->norm_linear_swiglu = false; /* measured no faster: msm_cuda_kernels.h */
    t->norm_swiglu_rows = 2;
    t->norm_qk_rope = false; /* measured slower: msm_cuda_kernels.h */
    /* the pair path's split down reads the ids and its first weights before its PDL wait (H200,
     * 2026-12-05 twentieth session, bench/results/2026-12-05-h200-s18 runs 2-3, ms a step against
     * after the wait): Qwen3-30B-A3B at 1 / 2 tokens 2.603-2.620 / 3.883-3.886 vs 2.660 /
     * 3.963-3.967 (two rounds), its FP8 preset at 1 2.355-2.359 vs 2.406-2.411; Qwen1.5-MoE at
     * 1 / 2 / 8 (three rounds) 1.694-1.699 / 2.190-2.192 / 4.187-4.209 vs 1.669-1.696 / 2.210-2.244
     * / 4.193-4.225. Again in s20 run 1 (two rounds, on vs off): Qwen3 1 / 2 / 4 2.544-2.553 /
     * 3.854-3.868 / 5.596-5.608 vs 2.599-2.601 / 3.944-3.946 / 5.652-5.653, FP8 1 / 4
     * 2.344-2.350 / 4.999 vs 2.397-2.399 / 5.031-5.038; Qwen1.5-MoE at 1 (its shared expert
     * beside) 1.691-1.714 vs 1.670-1.681, at 2 2.190-2.211 vs 2.210-2.227: AUTO, not at one token
     * beside the aux stream */
    t->moe_pair_early = MSM_CUDA_MOE_PAIR_EARLY_AUTO;
    /* into an ADD_RMSNORM only, as a cluster a token, up to 64 tokens (moe.cu, MOE_COMBINE_NORM_MAX_T;
     * into any reader, one block a token: slower, msm_cuda_kernels.h) */
    t->moe_fused_combine = 2;
    t->moe_combine_cluster = true;
    t->moe_combine_early = true;
    t->aux_gemv_rows = 2;
    /* the L2 prefetch of the PREFETCH nodes (pass off by default): measured slower or the same
     * (H200, 2026-12-05 sixteenth session, bench/results/2026-12-05-h200-s15 run 1 and its README);
     * these settings are the ones measured */
    t->l2_prefetch_max_t = 16;
    t->l2_prefetch_bytes = (size_t)24 << 20;
    /* the K/V cache rows of each layer into L2 from the norm before its qkv (pass prefetch_l2 with
     * prefetch_kv, in layers with nothing else on the aux stream; H100, 2026-12-07 thirty-fifth
     * session, bench/results/2026-12-07-h200-s35 run 2, ms a step, on minus off, three rounds):
     * Qwen3-30B-A3B -0.056 / -0.049 at 1 / 2 tokens, +0.037 at 4; +0.117 / +0.287 at 8 / 16, where
     * its fork then split the experts' combine from the norm after them (msm_graph_moe_sum_reader and
     * msm_graph_moe_sum_source pass over it since): the attention 2.5 us a layer faster at 8, the
     * combine + norm 4.2 us slower. With the combine kept, up to 16 tokens against this cap of 2:
     * +0.006 / +0.002 / +0.027 ms at 4 / 8 / 16 tokens, no gain (H100, 2026-12-07 thirty-seventh
     * session, bench/results/2026-12-07-h200-s37 run 1) */
    t->l2_prefetch_kv_max_t = 2;
    t->l2_prefetch_kv_bytes = (size_t)24 << 20;
    t->l2_prefetch_last = false;
    t->l2_prefetch_blocks = 32;
    t->l2_prefetch_chunk_kb = 16;
    t->l2_persist_mb = 0;
    t->stream_prio = MSM_CUDA_PRIO_AUTO;
    t->fp8_moe_hw = true; /* measured faster: msm_cuda_kernels.h */
    /* the FP8 pair-path experts on the lean dot, the gate/up loading the next step's codes early
     * (H200, 2026-12-05 sixteenth session, bench/results/2026-12-05-h200-s15 run 2, ms a step at
     * 1 / 2 / 4 tokens, vs the general dot): Qwen3-30B-A3B FP8 (three rounds) 2.389-2.393 /
     * 3.573-3.580 / 5.141-5.145 with =2, 2.411-2.413 / 3.581-3.586 / 5.138-5.156 with =1, vs
     * 2.626-2.646 / 3.798-3.815 / 5.482-5.509; GLM-4.5-Air FP8 (two) 6.633-6.634 / 9.437-9.444 /
     * 14.225-14.235 (=2), 6.623-6.631 / 9.584-9.585 / 14.334-14.349 (=1) vs 6.900-6.904 /
     * 9.897-9.916 / 15.140-15.166; bitwise in runs 2-3 */
    t->fp8_moe_lean = 2;
    /* the norm-in GEMV and the GEMV at 2 tokens; the experts' kernels lost occupancy for nothing
     * (H200, 2026-12-02 third session, ms a step at 1 / 2 / 4 tokens, all four on vs off:
     * Qwen1.5-MoE 2.00 / 2.78 / 4.12 vs 1.87 / 2.71 / 3.94, Qwen3-30B-A3B 3.04 / 4.22 / 6.65 vs
     * 3.10 / 4.37 / 6.51). The norm-in GEMV alone vs none: Qwen3 b1 3.19-3.20 vs 3.22-3.23, b2
     * 4.45-4.47 vs 4.61-4.62 (timeline: its qkv 7.6 -> 6.7 us a layer); with the GEMV at 1-2 tokens
     * too: b2 4.38-4.39, b1 the same (the o_proj unchanged in the timeline) but Qwen1.5-MoE b1
     * +0.03 (1.90-1.92 vs 1.87-1.89, twice), so the GEMV only at 2 tokens */
    t->rows_pipe = MSM_CUDA_PIPE_NORM_IN | MSM_CUDA_PIPE_GEMV;
    t->norm_router = false; /* measured slower: msm_cuda_kernels.h */
    t->gemv_u16 = true;     /* measured faster: msm_cuda_kernels.h */
    t->norm_router_max_t = 8;
    t->router_cluster_max_t = 1; /* measured: msm_cuda_kernels.h */
    /* the grouping in the router's last block: its tail grew ~2 us a layer at 8 tokens, more than the
     * grouping kernel's share (H100, bench/results/2026-12-06-h200-s27 run 2, ms a step at 5 / 8 / 16
     * / 32 tokens, on minus off, three rounds): Qwen3-30B-A3B +0.01 / +0.03 / -0.06 / +0.04, its FP8
     * preset +0.06 / +0.05 / -0.03 / +0.08, Qwen1.5-MoE -0.05 / -0.06 / +0.17 / +0.07 */
    t->router_group = false;
    /* the batched cluster router at 2-8 tokens, 2 tokens a cluster (H100, bench/results/2026-12-06-h200-s28
     * runs 2 and 3, three rounds each, on minus off, ms a step): Qwen3-30B-A3B 2 / 4 / 5 / 8 tokens
     * -0.04 / -0.01 / -0.01 / +0.01 and -0.05 / -0.03 / -0.03 / -0.00, its FP8 preset 2 / 4 / 8
     * -0.04 / -0.06 / -0.09 and -0.04 / -0.04 / -0.08 (the router's share at 8 tokens 6.9 -> 6.4 us
     * a layer). 8 tokens a cluster: +0.05 / +0.06 at 8 (one cluster's 16 blocks carry the step's
     * 8 x 128 dots); Qwen1.5-MoE, its shared expert beside the router, +0.01..+0.03 at 4-8: not
     * taken there (msm_cuda_exec.aux_beside) */
    t->router_tcluster_max_t = 8;
    t->router_tcluster_tb = 2;
    /* the cluster routers' logits by st.async into the ranking blocks' mbarriers instead of remote
     * stores and a cluster barrier (H100, 2026-12-07 thirty-sixth session, bench/results/2026-12-07-h200-s36
     * run 1, on minus off, three rounds, the same bits): Qwen3-30B-A3B 1 / 2 / 8 tokens -0.021 / -0.025
     * / -0.011 ms, its FP8 preset 1 / 8 -0.032 / -0.024, Qwen1.5-MoE 1 / 8 -0.011 / 0.000 (its 8-token
     * router, beside the shared expert, is the counter form) */
    t->router_st_async = true;
    t->moe_tiled_bm = 0; /* by the tokens an expert: measured faster, msm_cuda_kernels.h */
    CUDA_TRY(cudaDeviceGetAttribute(&t->sms, cudaDevAttrMultiProcessorCount, device));
    if (t->sms < 1) return -ENODEV;
    t->mmv_u8_max_blocks = 2 * t->sms;
    msm__moe_tuning(t);
    msm__moe_pair_tuning(t);
    int r = msm__moe_tiled_prepare();
    if (r) return r;
    r = msm__linear_tiled_prepare();
    if (r) return r;
    r = msm__linear_fp8_mma_prepare();
    if (r) return r;
    r = msm__linear_tiled_fp8_prepare();
    if (r) return r;
    r = msm__attention_mma_prepare();
    if (r) return r;
    msm__attention_mma_tuning(t);
    msm__attention_tuning(t);
    msm__linear_tuning(t);
    msm__router_tuning(t);
    return 0;
}
