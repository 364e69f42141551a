/* mega_probe.cu: how fast could a batch-1 decode step of Qwen1.5-MoE-A2.7B shapes (or Qwen3-30B-A3B's,
 * bf16 or FP8 bytes) stream its
 * weights if its kernels were one persistent kernel with grid barriers between dependent phases,
 * against the same phases launched as separate kernels (in a CUDA graph)?
 *
 * Standalone (no msmoed code): synthetic bf16 weights of the step's shapes, fp32 activations,
 * one warp per output row (16-byte streaming loads, U in flight per lane, fp32 dot, warp sum).
 * Per layer, the phases a fused batch-1 schedule needs (each phase's tasks read only what earlier
 * phases wrote):
 *   1 qkv [6144, 2048]            2 rope (no weights)          3 attention (KV 4 MiB, as rows)
 *   4 o_proj [2048, 2048]         5 router [60, 2048] + shared gate_up [11264, 2048]
 *   6 routed gate_up 4 x [2816, 2048] + shared down [2048, 5632]    7 routed down 4 x [2048, 1408]
 * then the lm_head [151936, 2048]. Variants: persistent (grid barrier between phases, optional L2
 * prefetch of each warp's first row of the next phase before it waits) and one kernel per phase in
 * a CUDA graph, without and with programmatic dependent launch (PDL), the latter with each warp's
 * first weight loads before or after its wait for the previous kernel, or before it except for the
 * routed experts' gate/up rows, which an engine learns only from the router's output (after the wait
 * and a read of the selection through L2: the floor a kernel-per-phase engine can reach). (A variant with every task in one phase, run once on 2026-12-01, was removed: its
 * row-to-task lookup walked all tasks for every row, so it timed that walk, not the streams.)
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o mega_probe bench/mega_probe.cu
 *   ./mega_probe            # prints ms per step (median of 50) and GB/s for each variant
 *   ./mega_probe 0 qwen3     # the same for Qwen3-30B-A3B's phases (48 layers); qwen3-fp8: its FP8
 *                            # checkpoint's bytes (each quantised row as half as many bf16 weights);
 *                            # qwen3-bN: an N-token step's bytes (qwen3-b8: 52 experts, 8 MiB of
 *                            # cache)
 *   ./mega_probe 0 qwen3-b8 engine  # the same bytes in msmoed's chain of nine kernels a layer
 *                            # (the norms, the grouping and the combine as weightless phases)
 * Results: bench/results/ (the session that ran it). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct task {
    const uint16_t *w;
    const float *x;
    float *y;
    int N, K;
    int routed; /* a routed expert's rows: which rows is known only from the router's output */
};

struct phase {
    int t0, nt;      /* tasks [t0, t0 + nt) */
    int rows;        /* rows over all its tasks */
    int uni;         /* every task's N when they are all the same (the experts), else 0 */
};

static __device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

static __device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

/* The lane's first U 16-byte loads of row w (the first step of row_dot). */
template <int U>
static __device__ __forceinline__ void row_first(const uint16_t *w, int K, int lane, uint4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int k = lane * 8 + u * 256;
        v[u] = k < K ? ld_stream16(w + k) : make_uint4(0, 0, 0, 0);
    }
}

/* dot(row w, x) over the warp; pre: the first step's loads already made (row_first). */
template <int U>
static __device__ __forceinline__ float row_dot(const uint16_t *w, const float *x, int K, int lane,
                                                const uint4 *pre = NULL) {
    float acc = 0.0f;
    for (int k0 = lane * 8; k0 < K; k0 += 256 * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = k0 + u * 256;
            v[u] = pre && k0 == lane * 8 ? pre[u] : k < K ? ld_stream16(w + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = k0 + u * 256;
            if (k >= K) break;
            const float4 *xp = (const float4 *)(x + k);
            float4 a = xp[0], b = xp[1];
            acc = fmaf(bf_lo(v[u].x), a.x, acc);
            acc = fmaf(bf_hi(v[u].x), a.y, acc);
            acc = fmaf(bf_lo(v[u].y), a.z, acc);
            acc = fmaf(bf_hi(v[u].y), a.w, acc);
            acc = fmaf(bf_lo(v[u].z), b.x, acc);
            acc = fmaf(bf_hi(v[u].z), b.y, acc);
            acc = fmaf(bf_lo(v[u].w), b.z, acc);
            acc = fmaf(bf_hi(v[u].w), b.w, acc);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

/* Row r of phase ph's concatenated tasks: its task, and in *rr its row there. */
static __device__ __forceinline__ const task *task_row(const task *tasks, const phase &ph, int r, int *rr) {
    if (ph.uni) { /* no walk over the tasks (52 experts a phase in qwen3-b8) */
        *rr = r % ph.uni;
        return &tasks[ph.t0 + r / ph.uni];
    }
    int t = ph.t0;
    while (r >= tasks[t].N) r -= tasks[t].N, t++;
    *rr = r;
    return &tasks[t];
}

/* The rows of phase p handled by global warp gw of nw: row r of the phase's concatenated tasks. */
template <int U>
static __device__ void phase_run(const task *tasks, const phase &ph, int gw, int nw, int lane) {
    for (int r = gw; r < ph.rows; r += nw) {
        int rr;
        const task &tk = *task_row(tasks, ph, r, &rr);
        float s = row_dot<U>(tk.w + (size_t)rr * tk.K, tk.x, tk.K, lane);
        if (lane == 0) tk.y[rr] = s;
    }
}

/* The same rows as phase_run, launched with programmatic dependent launch: the block lets the next
 * kernel launch at once (launch_dependents) and waits for the previous one (griddepcontrol.wait)
 * before it reads x. EARLY 1: the warp's first row's first U 16-byte weight loads are issued before
 * that wait (weights are never written during a step), so a block that became resident during the
 * previous kernel's tail streams while it waits. EARLY 2: as 1 but for a routed expert's rows
 * (task.routed), which an engine learns only from the router's output: after the wait, the warp
 * first reads its selection (*sel, written before the step: 0) through L2 and offsets its rows by
 * it, so its first weight loads wait for that round trip, as a grouped expert GEMV's wait for its
 * routing. */
template <int U, int EARLY>
static __global__ void phase_kernel_pdl(const task *tasks, const phase *phases, int p, const int *sel) {
    int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
    int gw = blockIdx.x * wpb + threadIdx.x / 32, nw = gridDim.x * wpb;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    phase ph = phases[p];
    uint4 v0[U];
    const task *tk0 = NULL;
    int rr0 = 0;
    if (EARLY && gw < ph.rows) {
        tk0 = task_row(tasks, ph, gw, &rr0);
        if (EARLY == 2 && tk0->routed) tk0 = NULL;
        else row_first<U>(tk0->w + (size_t)rr0 * tk0->K, tk0->K, lane, v0);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int r = gw, off = 0;
    if (EARLY && tk0) { /* the first row: its first step is in v0 */
        float acc = row_dot<U>(tk0->w + (size_t)rr0 * tk0->K, tk0->x, tk0->K, lane, v0);
        if (lane == 0) tk0->y[rr0] = acc;
        r += nw;
    } else if (EARLY == 2 && gw < ph.rows) {
        off = *(volatile const int *)sel; /* the routing read (0) */
    }
    for (; r < ph.rows; r += nw) {
        int rr;
        const task &tk = *task_row(tasks, ph, r, &rr);
        if (tk.routed) rr += off;
        float s = row_dot<U>(tk.w + (size_t)rr * tk.K, tk.x, tk.K, lane);
        if (lane == 0) tk.y[rr] = s;
    }
}

static __device__ void phase_prefetch(const task *tasks, const phase &ph, int gw, int nw, int lane, int rows) {
    for (int i = 0, r = gw; i < rows && r < ph.rows; i++, r += nw) {
        int rr;
        const task &tk = *task_row(tasks, ph, r, &rr);
        const char *p = (const char *)(tk.w + (size_t)rr * tk.K);
        for (int o = lane * 128; o < tk.K * 2; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    }
}

static __device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <int U>
static __global__ void persistent_kernel(const task *tasks, const phase *phases, int n_phases, unsigned *bar,
                                         int prefetch_rows) {
    int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
    int gw = blockIdx.x * wpb + threadIdx.x / 32, nw = gridDim.x * wpb;
    for (int p = 0; p < n_phases; p++) {
        phase ph = phases[p];
        phase_run<U>(tasks, ph, gw, nw, lane);
        if (p + 1 == n_phases) break;
        if (prefetch_rows) phase_prefetch(tasks, phases[p + 1], gw, nw, lane, prefetch_rows);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(bar, 1u);
            unsigned target = (unsigned)(p + 1) * gridDim.x;
            while (ld_acquire(bar) < target) {
            }
        }
        __syncthreads();
    }
    /* reset for the next launch: the last block out */
    if (threadIdx.x == 0) {
        unsigned done = atomicAdd(bar + 1, 1u);
        if (done == gridDim.x - 1) {
            bar[0] = 0;
            bar[1] = 0;
            __threadfence();
        }
    }
}

template <int U>
static __global__ void phase_kernel(const task *tasks, const phase *phases, int p) {
    int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
    int gw = blockIdx.x * wpb + threadIdx.x / 32, nw = gridDim.x * wpb;
    phase ph = phases[p];
    phase_run<U>(tasks, ph, gw, nw, lane);
}

static __global__ void fill_kernel(uint16_t *w, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        float f = ((float)(h & 0xffff) / 65535.0f - 0.5f) * 0.02f;
        w[i] = (uint16_t)(__float_as_uint(f) >> 16);
    }
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    /* argv[1]: layers (default: the model's); argv[2]: qwen15 (default), qwen3, qwen3-fp8 or qwen3-bN;
     * argv[3] "engine": Qwen3's layer as msmoed's decode chain of kernels at 2-8 tokens (below) */
    const char *model = argc > 2 ? argv[2] : "qwen15";
    bool engine = argc > 3 && strcmp(argv[3], "engine") == 0;
    bool q3 = strncmp(model, "qwen3", 5) == 0, fp8 = strcmp(model, "qwen3-fp8") == 0;
    int nb = strncmp(model, "qwen3-b", 7) == 0 ? atoi(model + 7) : 1; /* qwen3-bN: N tokens' bytes */
    if ((!q3 && strcmp(model, "qwen15") != 0) || nb < 1 || nb > 64 || (engine && !q3)) {
        fprintf(stderr, "usage: mega_probe [layers] [qwen15|qwen3|qwen3-fp8|qwen3-bN (N 1..64)] [engine (qwen3*)]\n");
        return 2;
    }
    int layers = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : q3 ? 48 : 24;
    const int H = 2048, QKV = 6144, SH = 5632, E_I = 1408, TOPK = 4, V = 151936;
    const int KV_ROWS = 16 * 512 * 2, HD = 128; /* attention as rows of 128 bf16 */
    /* Qwen3-30B-A3B: qkv [5120, 2048], o_proj [2048, 4096], router [128, 2048], 8 of 128 experts of
     * [1536, 2048] gate/up and [2048, 768] down, 4 kv heads of 128 (KV 1 MiB at 512). qwen3-fp8: the
     * same phases with the FP8 checkpoints' bytes, each quantised weight (qkv, o_proj, experts) as a
     * bf16 row of half its K (one byte a weight; the router, the cache and the lm_head stay bf16):
     * the bytes and rows of an FP8 step, without the decode's arithmetic (a floor for it). */
    /* qwen3-bN: the bytes of an N-token step (the experts msmoe-bench counts: E (1 - (1 - k/E)^N)
     * of 128 expected under uniform routing, rounded up: 16 / 30 / 52 / 83 at 2 / 4 / 8 / 16; N MiB
     * of cache), each weight still dotted with one token: a lower bound on that step's time (its
     * kernels do N dots a dense weight), the phase chain's floor for batch N. (Until 2026-12-06
     * qwen3-b8 was 53 experts: 26.87 GB, 7.378 ms on the H200.) */
    const int Q3_QKV = 5120, Q3_O = 4096, Q3_E = 128, Q3_I = 768,
              Q3_K = (int)ceil(128.0 * (1.0 - pow(1.0 - 8.0 / 128.0, (double)nb)) - 1e-9),
              Q3_KV_ROWS = 4 * 512 * 2 * nb;
    auto qk = [&](int K) { return fp8 ? K / 2 : K; };
    std::vector<std::pair<int, int>> shapes;    /* (N, K) of every task, in order */
    std::vector<std::vector<int>> phase_tasks;  /* task indices of each phase */
    std::vector<int> routed;                    /* task.routed of every task */
    auto add_phase = [&](std::vector<std::pair<int, int>> ts, int nrouted = 0) { /* the first nrouted routed */
        std::vector<int> ids;
        for (auto &s : ts) {
            ids.push_back((int)shapes.size());
            routed.push_back((int)ids.size() <= nrouted);
            shapes.push_back(s);
        }
        phase_tasks.push_back(ids);
    };
    auto add_qwen15_layer = [&] {
        add_phase({{QKV, H}});
        add_phase({});                  /* rope: a barrier only */
        add_phase({{KV_ROWS, HD}});     /* attention: 4 MiB */
        add_phase({{H, H}});
        add_phase({{60, H}, {2 * SH, H}});
        std::vector<std::pair<int, int>> p6;
        for (int k = 0; k < TOPK; k++) p6.push_back({2 * E_I, H});
        p6.push_back({H, SH});
        add_phase(p6, TOPK);
        std::vector<std::pair<int, int>> p7;
        for (int k = 0; k < TOPK; k++) p7.push_back({H, E_I});
        add_phase(p7);
    };
    /* engine: the phases of msmoed's Qwen3 layer at 2-8 tokens, each a data dependency of the next:
     * qkv (the q/k norm, RoPE and K/V write inside the attention, so no barrier for them), attention,
     * o_proj, the residual add + RMSNorm, the router, the grouping of the routed pairs, the routed
     * gate/up, the down, the combine + residual add + RMSNorm (the phases without weights as
     * barriers only) */
    auto add_qwen3_layer = [&] {
        add_phase({{Q3_QKV, qk(H)}});
        if (!engine) add_phase({});     /* q/k norm + rope: a barrier only */
        add_phase({{Q3_KV_ROWS, HD}});  /* attention: 1 MiB */
        add_phase({{H, qk(Q3_O)}});
        if (engine) add_phase({});      /* the residual add + RMSNorm */
        add_phase({{Q3_E, H}});         /* router */
        if (engine) add_phase({});      /* the grouping */
        std::vector<std::pair<int, int>> p6, p7;
        for (int k = 0; k < Q3_K; k++) p6.push_back({2 * Q3_I, qk(H)});
        add_phase(p6, Q3_K);
        for (int k = 0; k < Q3_K; k++) p7.push_back({H, qk(Q3_I)});
        add_phase(p7);
        if (engine) add_phase({});      /* the combine + residual add + RMSNorm */
    };
    for (int l = 0; l < layers; l++) q3 ? add_qwen3_layer() : add_qwen15_layer();
    add_phase({{V, H}});
    size_t welems = 0;
    for (auto &s : shapes) welems += (size_t)s.first * s.second;
    double gb = welems * 2.0 / 1e9;
    printf("# %s%s, %d layers + lm_head: %zu tasks, %zu phases, %.3f GB of weights\n", model,
           engine ? " (msmoed's chain)" : "", layers, shapes.size(), phase_tasks.size(), gb);

    uint16_t *wbuf;
    CK(cudaMalloc(&wbuf, welems * 2));
    fill_kernel<<<4096, 256>>>(wbuf, welems, 12345u);
    CK(cudaGetLastError());
    float *xbuf; /* every task reads x at offset 0 (16 KiB of ones) and writes its own y */
    size_t ymax = 0;
    for (auto &s : shapes) ymax += (size_t)s.first;
    CK(cudaMalloc(&xbuf, (8192 + ymax) * sizeof(float)));
    std::vector<float> ones(8192, 0.5f);
    CK(cudaMemcpy(xbuf, ones.data(), 8192 * 4, cudaMemcpyHostToDevice));

    std::vector<task> ht;
    size_t wo = 0, yo = 8192;
    for (size_t i = 0; i < shapes.size(); i++) {
        auto &s = shapes[i];
        ht.push_back(task{wbuf + wo, xbuf, xbuf + yo, s.first, s.second, routed[i]});
        wo += (size_t)s.first * s.second;
        yo += (size_t)s.first;
    }
    std::vector<phase> hp;
    for (auto &pt : phase_tasks) {
        phase p{pt.empty() ? 0 : pt[0], (int)pt.size(), 0, pt.empty() ? 0 : shapes[pt[0]].first};
        for (int i : pt) {
            p.rows += shapes[i].first;
            if (shapes[i].first != p.uni) p.uni = 0;
        }
        hp.push_back(p);
    }

    task *dt;
    phase *dp;
    unsigned *bar;
    CK(cudaMalloc(&dt, ht.size() * sizeof(task)));
    CK(cudaMalloc(&dp, hp.size() * sizeof(phase)));
    CK(cudaMalloc(&bar, 16));
    CK(cudaMemset(bar, 0, 16));
    const int *sel = (const int *)(bar + 2); /* the routed phases' selection read (0) */
    CK(cudaMemcpy(dt, ht.data(), ht.size() * sizeof(task), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dp, hp.data(), hp.size() * sizeof(phase), cudaMemcpyHostToDevice));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    auto time_graph = [&](cudaGraphExec_t ge) {
        for (int i = 0; i < 5; i++) CK(cudaGraphLaunch(ge, st));
        std::vector<float> ms;
        for (int i = 0; i < 50; i++) {
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            ms.push_back(m);
        }
        return median(ms);
    };
    auto capture = [&](auto issue) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        issue();
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        return ge;
    };
    auto report = [&](const char *name, double ms) {
        printf("%-52s %8.3f ms  %6.0f GB/s  %5.1f%% of 4.3 TB/s\n", name, ms, gb / ms * 1e3, gb / ms * 1e3 / 4300.0 * 100.0);
        fflush(stdout);
    };

    /* a kernel per phase (no PDL), in a CUDA graph */
    for (int wpb : {4, 8}) {
        int blocks = sms * (64 / wpb);
        cudaGraphExec_t ge = capture([&] {
            for (int p = 0; p < (int)hp.size(); p++) phase_kernel<4><<<blocks, wpb * 32, 0, st>>>(dt, dp, p);
        });
        char name[64];
        snprintf(name, sizeof name, "kernel per phase, %d warps x %d blocks", wpb, blocks);
        report(name, time_graph(ge));
        CK(cudaGraphExecDestroy(ge));
    }
    /* a kernel per phase with programmatic dependent launch, first loads before or after the wait
     * (early 2: before it but for the routed experts' rows, read after it and a routing read) */
    for (int early = 0; early < 3; early++)
        for (int wpb : {4, 8}) {
            int blocks = sms * (64 / wpb);
            cudaGraphExec_t ge = capture([&] {
                for (int p = 0; p < (int)hp.size(); p++) {
                    cudaLaunchConfig_t lc = {};
                    lc.gridDim = dim3(blocks), lc.blockDim = dim3(wpb * 32), lc.stream = st;
                    cudaLaunchAttribute at[1];
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    lc.attrs = at, lc.numAttrs = 1;
                    auto k = early == 2 ? phase_kernel_pdl<4, 2> : early ? phase_kernel_pdl<4, 1> : phase_kernel_pdl<4, 0>;
                    CK(cudaLaunchKernelEx(&lc, k, (const task *)dt, (const phase *)dp, p, sel));
                }
            });
            char name[96];
            snprintf(name, sizeof name, "kernel per phase + PDL%s, %d warps x %d blocks",
                     early == 2 ? ", early loads but routed" : early ? ", early loads" : "", wpb, blocks);
            report(name, time_graph(ge));
            CK(cudaGraphExecDestroy(ge));
        }
    /* persistent: one launch, grid barriers */
    struct cfg { int wpb, per_sm, pf, u; };
    for (cfg c : {cfg{16, 1, 0, 4}, cfg{32, 1, 0, 4}, cfg{16, 2, 0, 4}, cfg{16, 1, 1, 4}, cfg{16, 1, 2, 4},
                  cfg{32, 1, 1, 4}, cfg{16, 1, 0, 8}, cfg{16, 2, 1, 4}}) {
        int blocks = sms * c.per_sm;
        cudaGraphExec_t ge = capture([&] {
            if (c.u == 8)
                persistent_kernel<8><<<blocks, c.wpb * 32, 0, st>>>(dt, dp, (int)hp.size(), bar, c.pf);
            else
                persistent_kernel<4><<<blocks, c.wpb * 32, 0, st>>>(dt, dp, (int)hp.size(), bar, c.pf);
        });
        char name[80];
        snprintf(name, sizeof name, "persistent %d warps x %d blocks, U %d, prefetch %d", c.wpb, blocks, c.u, c.pf);
        report(name, time_graph(ge));
        CK(cudaGraphExecDestroy(ge));
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
