/* prefetch.cu: pulls weights into L2 ahead of the kernels that read them (msm_cuda_l2_prefetch,
 * the CUDA backend's PREFETCH node; pass prefetch_l2).
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
 * every kernel of a stream's chain does (the aux stream's next kernel may read what came before). */
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
    else asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(g), "r"(bytes) : "memory");
#else
    for (unsigned o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
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
