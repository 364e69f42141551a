/* msm_kernels: the CPU reference kernels, one prototype per graph op.
 *
 * These are the oracle: every CUDA kernel (kernels/cuda, msm_cuda_kernels.h) computes the same
 * function with the same argument order, plus its stream, and is tested against these over a
 * table of shapes. kernels/cpu/X.c holds the twins of kernels/cuda/X.cu (msm_cpu_<op> ~
 * msm_cuda_<op>); the CPU KV cache is float32, so the kernels that write it take a trailing bf16
 * flag where the CUDA ones always store bf16. All activations are float32, row-major; weights are
 * float32 here (the CPU backend converts bf16/f16 weights once at upload), bf16 on the GPU.
 *
 * Shapes use T = tokens in the step, H = hidden, nh/kvh = query/kv heads of this rank,
 * hd = head_dim, E = experts, k = experts per token, I = intermediate size of this rank.
 * None of these allocate, fail or synchronise. */
#ifndef MSM_KERNELS_H
#define MSM_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_types.h" /* MSM_KV_BLOCK, msm_sample_params: the one engine header kernels use */

/* ---- kernels/cpu/elementwise.c (twins in kernels/cuda/elementwise.cu) ----------------------- */

/* out[t,:] = table[ids[t],:]   out [T,H], table [V,H] */
void msm_cpu_embed(float *out, const float *table, const int32_t *ids, int T, int H);

/* out[r,:] = x[rows[r],:]   out [R,C], x [T,C] (GATHER_ROWS: the output rows of a step). */
void msm_cpu_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C);

/* Row-wise RMSNorm: out[r,:] = x[r,:] / sqrt(mean(x[r,:]^2) + eps) * w[:]  (x, out [rows,dim]).
 * Per-head q/k norm is the same call with rows = T*heads, dim = hd. out may equal x. */
void msm_cpu_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps);

/* QK_NORM: out = x [T, C] with each of the nh q heads RMS-normalised with wq [hd] and each of the
 * next kvh k heads with wk [hd] (per head, eps), the other columns copied. out may equal x. */
void msm_cpu_qk_norm(float *out, const float *x, const float *wq, const float *wk, int T, int C,
                     int nh, int kvh, int hd, float eps);

/* In-place rotate-half RoPE on x [T, nheads, hd] at positions pos[T], over the first rot dims of
 * each head (rot even, <= hd; rot = hd is full RoPE): with half = rot/2 and
 * inv_freq_i = 1 / theta^(2i/rot), dims i and i + half rotate by pos * inv_freq_i; dims
 * [rot, hd) pass through (HF's partial_rotary_factor: Glm4Moe's apply_rotary_pos_emb). */
void msm_cpu_rope(float *x, const int32_t *pos, int T, int nheads, int hd, int rot, float theta);

/* out = x [T, C] with its first nrot heads of hd (per row) rotated as msm_cpu_rope; the other
 * C - nrot*hd columns copied (ROPE over qkv rows: nrot = nh + kvh). out may equal x. */
void msm_cpu_rope_copy(float *out, const float *x, const int32_t *pos, int T, int C, int nrot,
                       int hd, int rot, float theta);

/* msm_cpu_rope_copy of qkv rows [T, (nh + 2*kvh)*hd] (q and k heads rotated, v copied) that also
 * writes the rotated k heads and the v heads to the caches at slot[t], exactly as
 * msm_cpu_kv_write_ld from out would (ROPE_KV_WRITE). bf16 as in msm_cpu_kv_write_ld. */
void msm_cpu_rope_kv(float *out, const float *x, const int32_t *pos, const int32_t *slot,
                     float *kc, float *vc, int T, int nh, int kvh, int hd, int rot, float theta,
                     bool bf16);

/* Writes k, v [T, kvh, hd] into the paged caches kc, vc [n_blocks, MSM_KV_BLOCK, kvh, hd] at
 * slot[t] = block * MSM_KV_BLOCK + offset. A negative slot skips the token (a padding row). */
void msm_cpu_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *slot,
                      int T, int kvh, int hd);

/* msm_cpu_kv_write with k, v rows ld floats apart (read in place from qkv rows). The CPU caches
 * are float32; bf16 rounds every value to bf16 (nearest even) as it is stored, which is what the
 * CUDA cache holds, so CPU and CUDA results can be compared on equal terms. */
void msm_cpu_kv_write_ld(float *kc, float *vc, const float *k, const float *v, size_t ld,
                         const int32_t *slot, int T, int kvh, int hd, bool bf16);

/* y[i] = a[i] + b[i]. y may alias a or b. */
void msm_cpu_add(float *y, const float *a, const float *b, size_t n);

/* Residual add fused with the RMSNorm of the sum: sum = a + b, out = rmsnorm(sum) * w
 * (a, b, sum, out [rows,dim]); the same arithmetic as msm_cpu_add then msm_cpu_rmsnorm. sum may
 * alias a or b. */
void msm_cpu_add_rmsnorm(float *sum, float *out, const float *a, const float *b, const float *w,
                         int rows, int dim, float eps);

/* The MoE layer's end in one op (shared-expert gate, combine, residual add, next RMSNorm):
 * per row, g = sigmoid(h . wg), sum = x + (routed + shared * g), out = rmsnorm(sum) * w; the same
 * arithmetic as linear (N=1), sigmoid, scale_rows, add, add_rmsnorm. All [rows,dim] except wg,
 * w [dim]; sum and out must not alias the inputs. */
void msm_cpu_moe_combine_rmsnorm(float *sum, float *out, const float *x, const float *routed,
                                 const float *shared, const float *h, const float *wg,
                                 const float *w, int rows, int dim, float eps);

/* The same without the residual add and norm (tp > 1, where the all-reduce comes between): per
 * row out = routed + shared * sigmoid(h . wg), the arithmetic of linear (N=1), sigmoid,
 * scale_rows, add. out must not alias the inputs. */
void msm_cpu_moe_combine(float *out, const float *routed, const float *shared, const float *h,
                         const float *wg, int rows, int dim);

/* y[t,:] = x[t,:] * s[t]   (x, y [T,D], s [T]). */
void msm_cpu_scale_rows(float *y, const float *x, const float *s, int T, int D);

/* y[i] = 1 / (1 + exp(-x[i])). */
void msm_cpu_sigmoid(float *y, const float *x, size_t n);

/* y[t,i] = silu(gu[t,i]) * gu[t,I+i]   (gu [T,2I]: gate half then up half; y [T,I]). */
void msm_cpu_swiglu(float *y, const float *gu, int T, int I);

/* ---- kernels/cpu/linear.c (twins in kernels/cuda/linear.cu) --------------------------------- */

/* y[T,N] = x[T,K] @ w[N,K]^T (+ bias[N] when not NULL). */
void msm_cpu_linear(float *y, const float *x, const float *w, const float *bias, int T, int N,
                    int K);

/* ---- kernels/cpu/attention.c (twins in kernels/cuda/attention.cu) --------------------------- */

/* Causal paged attention: token t (of sequence seq[t], at position pos[t]) attends to positions
 * 0..pos[t] of its sequence, read through block_tables[seq[t] * max_blocks + p / MSM_KV_BLOCK].
 * q, out [T, nh, hd]; GQA: query head h reads kv head h / (nh / kvh). Softmax in fp32. */
void msm_cpu_attention(float *out, const float *q, const float *kc, const float *vc,
                       const int32_t *seq, const int32_t *pos, const int32_t *block_tables,
                       int max_blocks, int T, int nh, int kvh, int hd, float scale);

/* ---- kernels/cpu/router.c (twins in kernels/cuda/router.cu) --------------------------------- */

/* Router: softmax over logits[t,:E] in fp32, top-k (highest first, lowest id on ties),
 * renormalised to sum 1 when norm. ids, w [T,k]. */
void msm_cpu_router_topk(int32_t *ids, float *w, const float *logits, int T, int E, int k,
                         bool norm);

/* Group-limited sigmoid router (HF Glm4MoeTopkRouter, DeepSeek-V3 style), all fp32, per token t:
 *   s[e] = 1 / (1 + exp(-logits[t,e])),  c[e] = s[e] + bias[e]   (bias: e_score_correction_bias)
 *   the E experts form n_group groups of E / n_group (>= 2) consecutive ids; a group's score is
 *   the sum of its two highest c; the topk_group highest groups are kept;
 *   ids[t,:] = the k experts of highest c among the kept groups (highest first, lowest id on
 *   ties; experts of the other groups are never chosen: -inf in HF);
 *   w[t,j] = s[ids[t,j]] (the unbiased score), / (sum_j w[t,j] + 1e-20) when norm, then * scale.
 * k <= topk_group * E / n_group. ids, w [T,k]; bias [E]. scratch: at least 2*E + n_group floats. */
void msm_cpu_router_group_topk(int32_t *ids, float *w, const float *logits, const float *bias,
                               int T, int E, int k, int n_group, int topk_group, bool norm,
                               float scale, float *scratch);

/* ---- kernels/cpu/moe.c (twins in kernels/cuda/moe.cu) --------------------------------------- */

/* Routed experts of this rank: y[t,:] = sum_j w[t,j] * down_e(swiglu(gate_up_e x[t,:])),
 * e = ids[t,j]. gate_up [E, 2I, H] (gate rows then up rows), down [E, H, I], x, y [T,H].
 * scratch: at least 3*I floats. */
void msm_cpu_moe_experts(float *y, const float *x, const int32_t *ids, const float *w,
                         const float *gate_up, const float *down, int T, int H, int I, int k,
                         float *scratch);

/* ---- kernels/cpu/sample.c (twins in kernels/cuda/sample.cu) --------------------------------- */

/* Samples one token per row of logits [R,V] with params p[R] into out[R]; a row holding a NaN or
 * an infinity gets MSM_SAMPLE_NONFINITE. scratch: at least 2*V floats. */
void msm_cpu_sample(int32_t *out, const float *logits, const msm_sample_params *p, int R, int V,
                    float *scratch);

/* The counter-based RNG the samplers share: a uniform float in [0,1) from (seed, counter). */
float msm_rng_uniform(uint64_t seed, uint64_t counter);

#endif
