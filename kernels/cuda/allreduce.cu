/* allreduce.cu: the one-shot all-reduce over peer memory (NVLink), for the small messages of a
 * tensor-parallel decode step, where NCCL's per-call latency dominates.
 *
 * Every rank's kernel reads the n floats at the same offset of every rank's buffer (the graph's
 * arena: all ranks run the same planned graph, so a value has the same offset everywhere), sums
 * them in rank order 0, 1, ..., size-1 and writes the sum to its own `out`. Rank order on every
 * rank: all ranks get the same bits, and the same bits run to run. Its CPU twin is the host
 * group's all-reduce (engine/comm_host.c), which sums in the same order.
 *
 * Two barriers per block, over per-block flags in each rank's signal area (device memory that
 * peers write over NVLink):
 *   start: every rank has reached this call (its input, written by earlier kernels on its main
 *          stream, is complete) — then the block reads its part of every rank's input;
 *   end:   every rank's block has finished reading — only then may later kernels of this rank
 *          overwrite its input's bytes (the planner reuses them).
 * A block's flag value is its call count (kept in the signal area, so CUDA graph replays count
 * on: nothing in the kernel's arguments changes between calls). Waits poll %globaltimer and give
 * up after timeout_ns: the kernel then sets the host-mapped fault word, raises the abort word in
 * every rank's signal area (every later call of every rank, and every wait in flight, then
 * returns at once with its fault word set) and returns without a result, so a stalled peer turns
 * into an error the host sees within one timeout, never a hang. The group is then broken and the
 * backends refuse further steps.
 *
 * Launched with programmatic dependent launch like the other kernels (msm_launch): every block
 * waits (msm_pdl_wait) for the previous kernel of its stream to complete before its first
 * barrier, since peers read what that kernel wrote; it lets the next kernel launch as soon as all
 * of its own blocks run, and that kernel waits for this one's end. Grids stay at most the SM
 * count, so all blocks of a call are resident together and no block waits on one that cannot be
 * scheduled.
 *
 * msm_cuda_allreduce_add_rmsnorm fuses the step's residual add and the next RMSNorm into the
 * same kernel (graph op ALLREDUCE_ADD_RMSNORM): a block takes whole rows, sums each element over
 * the ranks as above, adds the residual and norms the row exactly as add_rmsnorm does (same
 * threads, same order: msm_norm_threads), so it equals the one-shot all-reduce followed by
 * msm_cuda_add_rmsnorm bit for bit. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

/* signal area layout: uint32 start[MAXB][MAXR], end[MAXB][MAXR], count[MAXB], abort */
#define AR_MAXB MSM_CUDA_AR_MAX_BLOCKS
#define AR_MAXR MSM_CUDA_AR_MAX_RANKS
#define AR_THREADS 512

extern "C" size_t msm_cuda_ar_signal_bytes(void) {
    return sizeof(uint32_t) * (2 * AR_MAXB * AR_MAXR + AR_MAXB + 1);
}

static __device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

static __device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ uint64_t global_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define AR_COUNT (2 * AR_MAXB * AR_MAXR)          /* index of count[0] */
#define AR_ABORT (AR_COUNT + AR_MAXB)             /* index of the abort word */

/* The group is broken: this rank's fault word set (the host sees it after the step), and the
 * abort word of every rank's signal area, so every later call of every rank returns at once
 * instead of waiting out its own timeout (a graph of 48 all-reduces would otherwise take 48
 * timeouts to drain). */
static __device__ void ar_abort(const msm_cuda_ar_peers &p) {
    *(volatile uint32_t *)p.fault = 1;
    for (int r = 0; r < p.size; r++) st_release_sys(p.sig[r] + AR_ABORT, 1);
}

/* At a call's start: false (with the fault word set) once the group was aborted. Thread 0
 * reads the word and the block follows it, so the whole block returns or none does. */
static __device__ bool ar_alive(const msm_cuda_ar_peers &p) {
    __shared__ int alive;
    if (threadIdx.x == 0) {
        alive = ld_acquire_sys(p.sig[p.rank] + AR_ABORT) == 0;
        if (!alive) *(volatile uint32_t *)p.fault = 1;
    }
    __syncthreads();
    return alive != 0;
}

/* Barrier `which` (0 start, 1 end) of this block with the same block of every rank. Thread r
 * (r < size) posts `flag` into rank r's slot for this rank, then waits for rank r's post in this
 * rank's area. False when a peer did not post within the timeout, or the group was aborted
 * meanwhile (ar_abort: the fault word is set). */
static __device__ bool ar_barrier(const msm_cuda_ar_peers &p, int which, uint32_t flag) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = 1;
    __syncthreads(); /* this block's reads (end) are done before the post */
    if (threadIdx.x < (unsigned)p.size) {
        int r = threadIdx.x;
        size_t slot = ((size_t)which * AR_MAXB + blockIdx.x) * AR_MAXR;
        st_release_sys(p.sig[r] + slot + p.rank, flag);
        const uint32_t *mine = p.sig[p.rank] + slot + r, *abort = p.sig[p.rank] + AR_ABORT;
        uint64_t t0 = global_ns();
        while ((int32_t)(ld_acquire_sys(mine) - flag) < 0) {
            if (ld_acquire_sys(abort) != 0) {
                *(volatile uint32_t *)p.fault = 1;
                ok = 0;
                break;
            }
            if (global_ns() - t0 > p.timeout_ns) {
                ar_abort(p);
                ok = 0;
                break;
            }
        }
    }
    __syncthreads();
    return ok != 0;
}

/* A call's start, for a whole block: the previous kernel of the stream done (PDL), the group not
 * aborted, every rank arrived (the start barrier); *flag: this block's call count, for
 * ar_finish. False: return at once (the fault word is set). */
static __device__ bool ar_start(const msm_cuda_ar_peers &p, uint32_t *flag) {
    msm_pdl_trigger();
    msm_pdl_wait();
    if (!ar_alive(p)) return false;
    *flag = p.sig[p.rank][AR_COUNT + blockIdx.x] + 1;
    return ar_barrier(p, 0, *flag);
}

/* A call's end: every rank done reading (the end barrier), then this block's count moves on. */
static __device__ void ar_finish(const msm_cuda_ar_peers &p, uint32_t flag) {
    if (!ar_barrier(p, 1, flag)) return;
    if (threadIdx.x == 0) p.sig[p.rank][AR_COUNT + blockIdx.x] = flag;
}

/* src[r]: rank r's floats at off (ranks past size alias rank 0; never read). */
static __device__ __forceinline__ void ar_sources(const msm_cuda_ar_peers &p, size_t off,
                                                  const float *(&src)[AR_MAXR]) {
#pragma unroll
    for (int r = 0; r < AR_MAXR; r++) src[r] = (const float *)(p.base[r < p.size ? r : 0] + off);
}

/* out[i] = sum over r in rank order of base[r][off + i], i < n (floats). */
static __global__ void __launch_bounds__(AR_THREADS) ar_oneshot_kernel(float *out, size_t off, size_t n,
                                                                        msm_cuda_ar_peers p) {
    uint32_t flag;
    if (!ar_start(p, &flag)) return;
    const float *src[AR_MAXR];
    ar_sources(p, off, src);
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (((off | (size_t)out) & 15) == 0) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 s = ((const float4 *)src[0])[i];
            for (int r = 1; r < p.size; r++) {
                float4 v = ((const float4 *)src[r])[i];
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            ((float4 *)out)[i] = s;
        }
        i0 += n4 * 4;
    }
    for (size_t i = i0; i < n; i += stride) {
        float s = src[0][i];
        for (int r = 1; r < p.size; r++) s += src[r][i];
        out[i] = s;
    }
    ar_finish(p, flag);
}

static bool peers_ok(const msm_cuda_ar_peers *p) {
    return p && p->size >= 1 && p->size <= AR_MAXR && p->rank >= 0 && p->rank < p->size && p->fault;
}

/* Blocks of a call: `want`, at most the SM count (all resident together) and AR_MAXB. */
static int ar_grid(size_t want, msm_cuda_exec ex) {
    int sms = ex.tune->sms < AR_MAXB ? ex.tune->sms : AR_MAXB;
    return want < (size_t)sms ? (int)want : sms;
}

extern "C" int msm_cuda_allreduce_oneshot(float *out, size_t off, size_t n, const msm_cuda_ar_peers *p,
                                          msm_cuda_exec ex) {
    if (!peers_ok(p)) return -EINVAL;
    if (n == 0) return 0;
    size_t per = ((n + 3) / 4 + AR_THREADS - 1) / AR_THREADS; /* blocks if each thread took 4 floats */
    CUDA_TRY(msm_launch(ar_oneshot_kernel, dim3((unsigned)ar_grid(per, ex)), dim3(AR_THREADS), 0, ex, out, off, n, *p));
    return 0;
}

/* sum = x + (sum over ranks of the rows at off), out = rmsnorm(sum) * w; blocks take rows
 * blockIdx.x, blockIdx.x + gridDim.x, ... The row arithmetic is add_rmsnorm_kernel's
 * (elementwise.cu) with b the rank-order sum. */
template <int V>
static __global__ void ar_add_rmsnorm_kernel(float *sum, float *out, size_t off, const float *x, const uint16_t *w,
                                             int rows, int dim, float eps, msm_cuda_ar_peers p) {
    __shared__ float part[32];
    float wv[V];
    msm_norm_w_load<V>(w, dim, wv);
    uint32_t flag;
    if (!ar_start(p, &flag)) return;
    const float *src[AR_MAXR];
    ar_sources(p, off, src);
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        size_t ro = (size_t)row * dim;
        /* all V loads of one rank in flight together (a peer's load crosses NVLink, ~1 us): the
         * rank-order sum is unchanged */
        float v[V], b[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = threadIdx.x + j * blockDim.x;
            b[j] = i < dim ? src[0][ro + i] : 0.0f;
            v[j] = i < dim ? x[ro + i] : 0.0f;
        }
        for (int r = 1; r < p.size; r++) {
            float c[V];
#pragma unroll
            for (int j = 0; j < V; j++) {
                int i = threadIdx.x + j * blockDim.x;
                c[j] = i < dim ? src[r][ro + i] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < V; j++) b[j] += c[j];
        }
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = threadIdx.x + j * blockDim.x < dim ? v[j] + b[j] : 0.0f;
        msm_norm_row_store<V>(v, sum, out, ro, wv, dim, eps, part);
    }
    ar_finish(p, flag);
}

extern "C" int msm_cuda_allreduce_add_rmsnorm(float *sum, float *out, size_t off, const float *x, const uint16_t *w,
                                              int rows, int dim, float eps, const msm_cuda_ar_peers *p,
                                              msm_cuda_exec ex) {
    if (!peers_ok(p) || rows < 0 || dim <= 0 || dim > 32 * 1024) return -EINVAL;
    if (rows == 0) return 0;
    int threads = msm_norm_threads(dim);
    if (threads < p->size) return -EINVAL;
    dim3 grid((unsigned)ar_grid((size_t)rows, ex));
    switch (msm_norm_vals(dim, threads)) {
#define AR_NORM_CASE(V)                                                                            \
    case V:                                                                                        \
        CUDA_TRY(msm_launch(ar_add_rmsnorm_kernel<V>, grid, dim3((unsigned)threads), 0, ex, sum, out, off, x, w, rows, \
                            dim, eps, *p));                                                        \
        break;
        AR_NORM_CASE(1) AR_NORM_CASE(2) AR_NORM_CASE(4) AR_NORM_CASE(8) AR_NORM_CASE(16) AR_NORM_CASE(32)
#undef AR_NORM_CASE
    default: return -EINVAL;
    }
    return 0;
}
