/* sample.cu: token sampling on the device, one 1024-thread block per row of logits.
 *
 * The function is msm_cpu_sample's (a row with a NaN or an infinity gets MSM_SAMPLE_NONFINITE): greedy (arg-max, lowest id on ties) when temperature <= 0;
 * otherwise probabilities at temperature, a keep-threshold from top-k (the k-th largest
 * probability, counted with multiplicity) and top-p (the probability level at which the mass of
 * the most likely tokens first reaches top_p), then the first token in id order whose cumulative
 * kept mass exceeds u * kept_mass, u from the shared counter-based RNG (ported bit for bit).
 *
 * The arg-max (greedy rows' answer, and every row's maximum and finiteness check) comes first from
 * a grid of SP_CHUNK-token chunks a row (argmax_part_kernel, given a workspace): one 1024-thread
 * block reading a 152k vocabulary alone took ~17 us, a step's tail at batch 1; the chunks' (value,
 * lowest id) pairs then reduce in the sampling block by the same rule, so the token is the same.
 *
 * How: the CPU finds both thresholds by repeated arg-max; here they are radix selections over the
 * bit patterns of the (non-negative) probabilities, 8 bits a pass, 4 passes: a histogram of counts
 * (top-k) or of counts and fixed-point mass (top-p, 2^-40 units, integer atomics so the sums do not
 * depend on thread timing) over the tokens matching the prefix chosen so far. Probabilities are
 * recomputed from the logits in each pass (identical bits every time), so no scratch is needed.
 * The final pick is an ordered block scan in chunks. Every reduction has a fixed order: the same
 * logits give the same token on every run and graph replay. Floating-point sums are ordered
 * differently from the CPU's sequential loops, so a seeded sample matches the CPU's except when u
 * falls within rounding of a cumulative boundary. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <limits.h>
#include <math.h>

#define S_THREADS 1024
#define S_WARPS (S_THREADS / 32)
#define S_ITEMS 8
#define FIX_ONE 1099511627776.0f /* 2^40 */
#define SP_CHUNK 8192 /* tokens a block of argmax_part_kernel */
#define SP_THREADS 256

typedef unsigned long long u64;


struct sample_smem {
    float f[S_WARPS];
    int i[S_WARPS];
    u64 hcnt[256], hmass[256];
    int digit;
    u64 gt;
    int found;
};

/* Block-wide sum in a fixed order; every thread gets the result. */
static __device__ float block_sum(float v, sample_smem &sm) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    v = msm_warp_sum(v);
    __syncthreads();
    if (lane == 0) sm.f[warp] = v;
    __syncthreads();
    float r = lane < S_WARPS ? sm.f[lane] : 0.0f;
    return msm_warp_sum(r);
}

/* Block-wide (max value, lowest index); every thread gets the result. */
static __device__ void block_argmax(float &bv, int &bi, sample_smem &sm) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MSM_FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(MSM_FULL_MASK, bi, o);
        if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    __syncthreads();
    if (lane == 0) sm.f[warp] = bv, sm.i[warp] = bi;
    __syncthreads();
    bv = sm.f[lane], bi = sm.i[lane]; /* S_WARPS == 32 */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MSM_FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(MSM_FULL_MASK, bi, o);
        if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
}

static __device__ __forceinline__ float prob_at(const float *l, int v, float mx, float temp,
                                                float sum) {
    return expf((l[v] - mx) / temp) / sum; /* as the CPU: exp first, then divide */
}

/* Warp 0: over the 256 bins in descending digit order, the first digit whose running total
 * (of h) reaches target; if none does, the lowest non-empty digit. Writes the digit and the total
 * of the bins above it to sm. */
static __device__ void select_digit(sample_smem &sm, const u64 *h, u64 target) {
    int lane = threadIdx.x & 31;
    u64 hv[8];
    u64 s = 0;
    bool nonempty = false;
#pragma unroll
    for (int q = 0; q < 8; q++) { /* lane owns descending positions 8*lane..8*lane+7 */
        int d = 255 - (lane * 8 + q);
        hv[q] = h[d];
        s += hv[q];
        nonempty |= sm.hcnt[d] != 0;
    }
    u64 incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 n = __shfl_up_sync(MSM_FULL_MASK, incl, o);
        if (lane >= o) incl += n;
    }
    u64 excl = incl - s, total = __shfl_sync(MSM_FULL_MASK, incl, 31);
    unsigned reach = __ballot_sync(MSM_FULL_MASK, incl >= target);
    if (reach) {
        int L = __ffs(reach) - 1;
        if (lane == L) {
            u64 run = excl;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                u64 before = run;
                run += hv[q];
                if (run >= target) {
                    sm.digit = 255 - (lane * 8 + q);
                    sm.gt = before;
                    break;
                }
            }
        }
    } else {
        unsigned ne = __ballot_sync(MSM_FULL_MASK, nonempty);
        int L = ne ? 31 - __clz(ne) : 31;
        if (lane == L) {
            int d = 255 - lane * 8;
            for (int q = 7; q >= 0; q--)
                if (sm.hcnt[255 - (lane * 8 + q)] != 0) {
                    d = 255 - (lane * 8 + q);
                    break;
                }
            sm.digit = d;
            sm.gt = total - h[d];
        }
    }
}

/* One radix pass: histogram (count, and mass when with_mass) of the tokens whose probability
 * bits match prefix under mask, by the 8 bits at shift. Warp-aggregated atomics: one per distinct
 * bin per warp and iteration. */
static __device__ void radix_hist(sample_smem &sm, const float *l, int V, float mx, float temp,
                                  float sum, unsigned prefix, unsigned mask, int shift,
                                  bool with_mass) {
    int lane = threadIdx.x & 31;
    for (int b = threadIdx.x; b < 256; b += S_THREADS) sm.hcnt[b] = 0, sm.hmass[b] = 0;
    __syncthreads();
    for (int base = 0; base < V; base += S_THREADS) {
        int v = base + threadIdx.x;
        bool active = false;
        int bin = 0;
        u64 q = 0;
        if (v < V) {
            float p = prob_at(l, v, mx, temp, sum);
            unsigned bits = __float_as_uint(p);
            if ((bits & mask) == prefix) {
                active = true;
                bin = (bits >> shift) & 255;
                q = (u64)(p * FIX_ONE);
            }
        }
        unsigned todo = __ballot_sync(MSM_FULL_MASK, active);
        while (todo) {
            int leader = __ffs(todo) - 1;
            int lb = __shfl_sync(MSM_FULL_MASK, bin, leader);
            bool mine = active && bin == lb;
            unsigned grp = __ballot_sync(MSM_FULL_MASK, mine);
            if (with_mass) {
                u64 ms = mine ? q : 0;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) ms += __shfl_xor_sync(MSM_FULL_MASK, ms, o);
                if (lane == leader) atomicAdd(&sm.hmass[lb], ms);
            }
            if (lane == leader) atomicAdd(&sm.hcnt[lb], (u64)__popc(grp));
            todo &= ~grp;
        }
    }
    __syncthreads();
}

/* parts[r * P + c] = (the largest logit of chunk c of row r as bits, its lowest id), or id -1
 * where the chunk holds a NaN or an infinity. Grid (P, R). */
static __global__ void __launch_bounds__(SP_THREADS)
    argmax_part_kernel(int2 *parts, const float *logits, size_t ld, int V, int P) {
    msm_pdl_trigger();
    msm_pdl_wait();
    __shared__ float sv[SP_THREADS / 32];
    __shared__ int si[SP_THREADS / 32];
    int c = blockIdx.x, r = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float *l = logits + (size_t)r * ld;
    int v0 = c * SP_CHUNK, v1 = min(V, v0 + SP_CHUNK);
    float bv = -INFINITY;
    int bi = INT_MAX, bad = 0;
#pragma unroll 8
    for (int v = v0 + (int)threadIdx.x; v < v1; v += SP_THREADS) {
        float x = l[v];
        bad |= !isfinite(x);
        if (bi == INT_MAX || x > bv) bv = x, bi = v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MSM_FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(MSM_FULL_MASK, bi, o);
        if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) parts[(size_t)r * P + c] = make_int2(0, -1);
        return;
    }
    if (threadIdx.x == 0) {
        for (int w = 1; w < SP_THREADS / 32; w++)
            if (si[w] != INT_MAX && (bi == INT_MAX || sv[w] > bv || (sv[w] == bv && si[w] < bi))) bv = sv[w], bi = si[w];
        parts[(size_t)r * P + c] = make_int2(__float_as_int(bv), bi);
    }
}

/* One block a row. With parts (argmax_part_kernel's P chunks a row), the row's maximum and
 * finiteness come from them instead of a scan of the row. */
static __global__ void __launch_bounds__(S_THREADS)
    sample_kernel(int32_t *out, const float *logits, size_t ld, const msm_sample_params *params, int V,
                  const int2 *parts, int P) {
    msm_pdl_trigger();
    msm_pdl_wait();
    __shared__ sample_smem sm;
    int r = blockIdx.x;
    const float *l = logits + (size_t)r * ld;
    const msm_sample_params sp = params[r];

    float bv = -INFINITY;
    int bi = INT_MAX, bad = 0;
    if (parts) {
        for (int c = threadIdx.x; c < P; c += S_THREADS) {
            int2 q = parts[(size_t)r * P + c];
            float x = __int_as_float(q.x);
            if (q.y < 0) bad = 1;
            else if (bi == INT_MAX || x > bv || (x == bv && q.y < bi)) bv = x, bi = q.y;
        }
    } else {
        for (int v = threadIdx.x; v < V; v += S_THREADS) {
            float x = l[v];
            bad |= !isfinite(x);
            if (bi == INT_MAX || x > bv) bv = x, bi = v;
        }
    }
    /* nothing can be drawn from NaN or infinite logits: say so (as msm_cpu_sample does) */
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) out[r] = MSM_SAMPLE_NONFINITE;
        return;
    }
    block_argmax(bv, bi, sm);
    int amax = bi == INT_MAX ? 0 : bi;
    if (!(sp.temperature > 0.0f)) {
        if (threadIdx.x == 0) out[r] = amax;
        return;
    }
    float mx = l[amax], temp = sp.temperature;
    float part = 0.0f;
    for (int v = threadIdx.x; v < V; v += S_THREADS) part += expf((l[v] - mx) / temp);
    float sum = block_sum(part, sm);

    float thr = 0.0f;
    if (sp.top_k > 0 && sp.top_k < V) {
        unsigned prefix = 0, mask = 0;
        u64 krem = (u64)sp.top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            radix_hist(sm, l, V, mx, temp, sum, prefix, mask, shift, false);
            if (threadIdx.x < 32) select_digit(sm, sm.hcnt, krem);
            __syncthreads();
            krem -= sm.gt;
            prefix |= (unsigned)sm.digit << shift;
            mask |= 255u << shift;
            __syncthreads();
        }
        thr = __uint_as_float(prefix);
    }
    if (sp.top_p > 0.0f && sp.top_p < 1.0f) {
        unsigned prefix = 0, mask = 0;
        u64 target = (u64)(sp.top_p * FIX_ONE), above = 0;
        if (target == 0) target = 1;
        for (int shift = 24; shift >= 0; shift -= 8) {
            radix_hist(sm, l, V, mx, temp, sum, prefix, mask, shift, true);
            if (threadIdx.x < 32) select_digit(sm, sm.hmass, target > above ? target - above : 1);
            __syncthreads();
            above += sm.gt;
            prefix |= (unsigned)sm.digit << shift;
            mask |= 255u << shift;
            __syncthreads();
        }
        float level = __uint_as_float(prefix);
        if (level > thr) thr = level;
    }

    part = 0.0f;
    for (int v = threadIdx.x; v < V; v += S_THREADS) {
        float p = prob_at(l, v, mx, temp, sum);
        part += p >= thr ? p : 0.0f;
    }
    float kept = block_sum(part, sm);
    float u = msm_rng_uniform_dev(sp.seed, sp.counter) * kept;

    /* First token (in id order) whose cumulative kept mass exceeds u: chunks of S_ITEMS
     * consecutive tokens a thread, a block exclusive scan of the thread sums, then the one
     * thread whose range crosses u walks it. */
    if (threadIdx.x == 0) sm.found = INT_MAX;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    float carry = 0.0f;
    for (int cb = 0; cb < V; cb += S_THREADS * S_ITEMS) {
        int base = cb + threadIdx.x * S_ITEMS;
        float pv[S_ITEMS], s = 0.0f;
#pragma unroll
        for (int i = 0; i < S_ITEMS; i++) {
            int v = base + i;
            float p = v < V ? prob_at(l, v, mx, temp, sum) : 0.0f;
            pv[i] = p >= thr && v < V ? p : -1.0f;
            s += pv[i] >= 0.0f ? pv[i] : 0.0f;
        }
        float incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float n = __shfl_up_sync(MSM_FULL_MASK, incl, o);
            if (lane >= o) incl += n;
        }
        __syncthreads();
        if (lane == 31) sm.f[warp] = incl;
        __syncthreads();
        float wt = sm.f[lane], wincl = wt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float n = __shfl_up_sync(MSM_FULL_MASK, wincl, o);
            if (lane >= o) wincl += n;
        }
        float wexcl = __shfl_sync(MSM_FULL_MASK, wincl - wt, warp);
        float chunk = __shfl_sync(MSM_FULL_MASK, wincl, 31);
        float excl = carry + wexcl + (incl - s);
        if (s > 0.0f && excl + s > u) {
            float c = excl;
            int cand = -1, last = -1;
#pragma unroll
            for (int i = 0; i < S_ITEMS; i++) {
                if (pv[i] < 0.0f || cand >= 0) continue;
                last = base + i;
                c += pv[i];
                if (u < c) cand = base + i;
            }
            atomicMin(&sm.found, cand >= 0 ? cand : last);
        }
        __syncthreads();
        if (sm.found != INT_MAX) break;
        carry += chunk;
    }
    if (threadIdx.x == 0) out[r] = sm.found != INT_MAX ? sm.found : amax;
}

static int n_parts(int V) { return (V + SP_CHUNK - 1) / SP_CHUNK; }

extern "C" size_t msm_cuda_sample_ws_bytes(int R, int V) {
    return R > 0 && V > 0 ? ((size_t)R * (size_t)n_parts(V) * sizeof(int2) + 255) & ~(size_t)255 : 0;
}

extern "C" int msm_cuda_sample(int32_t *out, const float *logits, size_t ld, const msm_sample_params *p, int R,
                               int V, void *ws, size_t ws_bytes, msm_cuda_exec ex) {
    if (R < 0 || V <= 0 || ld < (size_t)V || R > 65535) return -EINVAL;
    if (R == 0) return 0;
    int P = n_parts(V);
    int2 *parts = ws && ws_bytes >= msm_cuda_sample_ws_bytes(R, V) ? (int2 *)ws : NULL;
    if (parts) CUDA_TRY(msm_launch(argmax_part_kernel, dim3(P, R), dim3(SP_THREADS), 0, ex, parts, logits, ld, V, P));
    CUDA_TRY(msm_launch(sample_kernel, dim3(R), dim3(S_THREADS), 0, ex, out, logits, ld, p, V, (const int2 *)parts, P));
    return 0;
}
