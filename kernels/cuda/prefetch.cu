/* prefetch.cu: msm_cuda_prefetch_l2, the PREFETCH op's kernel: pulls byte ranges of weights into
 * L2 with bulk prefetches (sm_90's cp.async.bulk.prefetch.L2), so a kernel that reads them soon
 * after finds them there. A hint: nothing is read into registers or written, and a range past the
 * weight's end is never asked for (the backend clamps each range to its weight).
 *
 * How: the ranges are cut into chunks of PF_CHUNK bytes, one a thread; one warp a block and
 * enough blocks that each multiprocessor issues a few (one multiprocessor's bulk prefetches stream
 * at ~250 GB/s, bench/results/2026-12-01-h200-s6), so 24 MiB goes out in ~1500 instructions over
 * ~48 multiprocessors. Launched without programmatic dependence: it waits for nothing of the kernel
 * before it on its stream and its stream's next kernel waits for it. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

#define PF_CHUNK (16u << 10)

struct pf_ranges {
    const char *p[MSM_CUDA_PREFETCH_MAX];
    unsigned long long chunks[MSM_CUDA_PREFETCH_MAX]; /* chunks of each range (the last one partial) */
    unsigned long long bytes[MSM_CUDA_PREFETCH_MAX];
    int n;
};

static __global__ void __launch_bounds__(32) prefetch_l2_kernel(pf_ranges r) {
    unsigned long long c = (unsigned long long)blockIdx.x * 32 + threadIdx.x;
    for (int i = 0; i < r.n; i++) {
        if (c < r.chunks[i]) {
            unsigned long long off = c * PF_CHUNK, n = r.bytes[i] - off;
            unsigned sz = n < PF_CHUNK ? (unsigned)n : PF_CHUNK;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.p[i] + off), "r"(sz) : "memory");
#else
            for (unsigned o = 0; o < sz; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(r.p[i] + off + o));
#endif
            return;
        }
        c -= r.chunks[i];
    }
}

extern "C" int msm_cuda_prefetch_l2(const void *const *p, const size_t *bytes, int n, msm_cuda_exec ex) {
    if (n < 0 || n > MSM_CUDA_PREFETCH_MAX) return -EINVAL;
    pf_ranges r = {};
    unsigned long long total = 0;
    for (int i = 0; i < n; i++) {
        /* bulk prefetches take 16-byte aligned addresses and sizes: round the range inwards */
        uintptr_t a = ((uintptr_t)p[i] + 15) & ~(uintptr_t)15;
        size_t skip = a - (uintptr_t)p[i], b = bytes[i] > skip ? (bytes[i] - skip) & ~(size_t)15 : 0;
        if (!p[i] || b == 0) continue;
        r.p[r.n] = (const char *)a;
        r.bytes[r.n] = b;
        r.chunks[r.n] = (b + PF_CHUNK - 1) / PF_CHUNK;
        total += r.chunks[r.n];
        r.n++;
    }
    if (total == 0) return 0;
    prefetch_l2_kernel<<<(unsigned)((total + 31) / 32), 32, 0, ex.stream>>>(r);
    CUDA_LAUNCH_CHECK();
    return 0;
}
