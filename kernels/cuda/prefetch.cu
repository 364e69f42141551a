/* prefetch.cu: pulls weights (msm_cuda_l2_prefetch, the CUDA backend's PREFETCH node) and K/V cache
 * rows (msm_cuda_kv_prefetch, PREFETCH_KV) into L2 ahead of the kernels that read them (pass
 * prefetch_l2).
 *
 * Why: a decode step alternates phases that stream weights at the HBM limit (the GEMVs, the
 * experts) with phases bound by latency, where HBM idles: at batch 1 the attention phase of a
 * Qwen1.5-MoE layer (rope, attention, o_proj, norm, router: ~20 us) reads ~12 MB, about 15% of
 * what HBM could deliver meanwhile. Weights read later in the layer (o_proj, the shared expert)
 * are known before the step runs, so a kernel on the aux stream, launched once the qkv GEMV is
 * done, asks the TMA units to bring them to L2 while the chain runs on; their GEMVs then hit L2.
 *
 * Each thread of a grid of one-warp blocks issues cp.async.bulk.prefetch.L2 (sm_90) for chunks of
 * the spans, chunk c of all spans in order by thread c mod threads: a fire-and-forget hint,
 * nothing waits for the lines and no memory changes, so results cannot change. With `last` the
 * lines carry the L2::evict_last policy (createpolicy), so the weights streamed meanwhile (the
 * routed experts, with normal priority) evict them last. The kernel triggers its dependents at
 * once and waits for the kernel before it only at its end, so it completes after that kernel, as
 * every kernel of a stream's chain does (the aux stream's next kernel may read what came before).
 *
 * The K/V form: at a decode step of 8 tokens a Qwen1.5-MoE layer's attention reads 33.5 MB of cache
 * at ~2.6 TB/s (12.8 us a layer; bench/results/2026-12-04-h200-s13 run 5), while the kernels before
 * it (the residual norm, the qkv GEMV at ~2.9 TB/s, the RoPE) leave HBM room. The cache rows below
 * each token's position are known when the step starts (its block table), so one block a token,
 * launched as the layer begins, prefetches them: each of the token's 16-slot cache blocks is
 * contiguous, 16 * kvh * hd bf16, one bulk prefetch for K and one for V. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

#define PF_THREADS 32

struct pf_spans {
    const char *p[MSM_CUDA_PREFETCH_MAX_SPANS];
    size_t n[MSM_CUDA_PREFETCH_MAX_SPANS]; /* bytes, a multiple of 16 (p 16-byte aligned) */
    int count;
};

static __device__ __forceinline__ void pf_issue(const char *p, unsigned bytes, bool last, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    size_t g = __cvta_generic_to_global(p);
    if (last) asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(g), "r"(bytes), "l"(pol) : "memory");
    else msm_bulk_prefetch_l2(p, bytes);
#else
    msm_bulk_prefetch_l2(p, bytes);
#endif
}

static __global__ void __launch_bounds__(PF_THREADS) l2_prefetch_kernel(pf_spans s, unsigned chunk, bool last) {
    msm_pdl_trigger();
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
    const size_t nth = (size_t)gridDim.x * PF_THREADS;
    size_t c = (size_t)blockIdx.x * PF_THREADS + threadIdx.x, base = 0; /* base: span i's first chunk */
#pragma unroll /* constant span indices: the spans stay in the parameter space, no local copy */
    for (int i = 0; i < MSM_CUDA_PREFETCH_MAX_SPANS; i++) {
        if (i >= s.count) break;
        size_t nc = (s.n[i] + chunk - 1) / chunk;
        for (; c < base + nc; c += nth) {
            size_t off = (c - base) * chunk, left = s.n[i] - off;
            pf_issue(s.p[i] + off, (unsigned)(left < chunk ? left : chunk), last, pol);
        }
        base += nc;
    }
    msm_pdl_wait();
}

/* Token blockIdx.x's cache blocks holding positions 0 .. pos - 1, the first nb_max of them. The
 * step's inputs (seq, pos, the block tables) were written before its first kernel, so they are read
 * at once; blocks outside the cache (n_blocks of them) are skipped. */
static __global__ void __launch_bounds__(PF_THREADS)
    kv_prefetch_kernel(const char *kc, const char *vc, const int32_t *seq, const int32_t *pos, const int32_t *bt,
                       int max_blocks, int n_blocks, unsigned blk_bytes, int nb_max, bool last) {
    msm_pdl_trigger();
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
    int t = blockIdx.x, n = pos[t], s = seq[t];
    int nb = n > 0 ? min((n + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK, nb_max) : 0;
    for (int b = threadIdx.x; b < nb && s >= 0; b += PF_THREADS) {
        int blk = __ldg(bt + (size_t)s * max_blocks + b);
        if (blk < 0 || blk >= n_blocks) continue;
        size_t off = (size_t)blk * blk_bytes;
        pf_issue(kc + off, blk_bytes, last, pol);
        pf_issue(vc + off, blk_bytes, last, pol);
    }
    msm_pdl_wait();
}

extern "C" int msm_cuda_kv_prefetch(const uint16_t *kc, const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                    const int32_t *block_tables, int max_blocks, int n_blocks, int T, int kvh, int hd,
                                    msm_cuda_exec ex) {
    if (T < 0 || T > 65535 || kvh <= 0 || hd <= 0 || max_blocks <= 0 || n_blocks <= 0 || !kc || !vc || !seq || !pos ||
        !block_tables)
        return -EINVAL;
    size_t blk = (size_t)MSM_KV_BLOCK * kvh * hd * sizeof(uint16_t); /* a multiple of 16 bytes, aligned so */
    if (T == 0 || blk > (1u << 30) || ((uintptr_t)kc | (uintptr_t)vc) % 16) return T == 0 ? 0 : -EINVAL;
    size_t per = ex.tune->l2_prefetch_kv_bytes / ((size_t)T * 2 * blk); /* cache blocks a token */
    if (per == 0) return 0;
    int nb_max = per > (size_t)max_blocks ? max_blocks : (int)per;
    CUDA_TRY(msm_launch(kv_prefetch_kernel, dim3((unsigned)T), dim3(PF_THREADS), 0, ex, (const char *)kc,
                        (const char *)vc, seq, pos, block_tables, max_blocks, n_blocks, (unsigned)blk, nb_max,
                        ex.tune->l2_prefetch_last));
    return 0;
}

extern "C" int msm_cuda_l2_prefetch(const msm_cuda_span *sp, int n, msm_cuda_exec ex) {
    if (n < 0 || n > MSM_CUDA_PREFETCH_MAX_SPANS || (n > 0 && !sp)) return -EINVAL;
    const msm_cuda_tuning *t = ex.tune;
    unsigned chunk = (unsigned)(t->l2_prefetch_chunk_kb > 0 ? t->l2_prefetch_chunk_kb : 16) << 10;
    size_t budget = t->l2_prefetch_bytes;
    pf_spans s = {};
    for (int i = 0; i < n && budget >= 16; i++) {
        if (!sp[i].p || sp[i].bytes == 0) continue;
        /* the whole 16-byte units inside the span, in order, while the budget lasts */
        uintptr_t a = ((uintptr_t)sp[i].p + 15) & ~(uintptr_t)15, e = (uintptr_t)sp[i].p + sp[i].bytes;
        if (e < a + 16) continue;
        size_t len = (size_t)(e - a) & ~(size_t)15;
        if (len > budget) len = budget & ~(size_t)15;
        s.p[s.count] = (const char *)a;
        s.n[s.count++] = len;
        budget -= len;
    }
    if (s.count == 0) return 0;
    int blocks = t->l2_prefetch_blocks > 0 ? t->l2_prefetch_blocks : 1;
    CUDA_TRY(msm_launch(l2_prefetch_kernel, dim3((unsigned)blocks), dim3(PF_THREADS), 0, ex, s, chunk, t->l2_prefetch_last));
    return 0;
}
