/* elementwise.cu: the small kernels of a step: embedding gather, RMSNorm, RoPE, KV-cache write,
 * residual add, row scaling, sigmoid and SwiGLU. They are memory-bound and simple: one pass over
 * their data, the same float formulas as the CPU oracle (kernels/cpu/kernels.c), no fast-math
 * intrinsics, so they agree with it to float32 rounding. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

/* A 1-D grid over n items: enough blocks to fill the GPU several times, grid-stride beyond. */
static unsigned grid_for(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b > 65536) b = 65536;
    return b ? (unsigned)b : 1u;
}

/* ---- embed: one block per token, bf16 row -> f32 row ---- */
__global__ void embed_kernel(float *out, const uint16_t *table, const int32_t *ids, int H) {
    int t = blockIdx.x;
    const uint16_t *row = table + (size_t)ids[t] * H;
    float *o = out + (size_t)t * H;
    for (int h = threadIdx.x; h < H; h += blockDim.x) o[h] = msm_bf(row[h]);
}

extern "C" int msm_cuda_embed(float *out, const uint16_t *table, const int32_t *ids, int T, int H,
                              cudaStream_t stream) {
    if (T < 0 || H <= 0) return -EINVAL;
    if (T == 0) return 0;
    embed_kernel<<<T, 256, 0, stream>>>(out, table, ids, H);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- rmsnorm: one block per row; the sum of squares is reduced in a fixed order ---- */
__global__ void rmsnorm_kernel(float *out, const float *x, const uint16_t *w, int dim, float eps) {
    __shared__ float part[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = msm_warp_sum(ss);
    int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) part[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < nwarps; i++) tot += part[i];
    float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = msm_bf(w[i]) * (xr[i] * inv);
}

extern "C" int msm_cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int rows, int dim,
                                float eps, cudaStream_t stream) {
    if (rows < 0 || dim <= 0) return -EINVAL;
    if (rows == 0) return 0;
    int threads = dim >= 1024 ? 256 : dim > 128 ? 128 : 64;
    rmsnorm_kernel<<<rows, threads, 0, stream>>>(out, x, w, dim, eps);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- add + rmsnorm: the residual sum and its norm in one pass (same order as the two kernels) */
__global__ void add_rmsnorm_kernel(float *sum, float *out, const float *a, const float *b,
                                   const uint16_t *w, int dim, float eps) {
    __shared__ float part[32];
    size_t off = (size_t)blockIdx.x * dim;
    float *sr = sum + off, *yr = out + off;
    const float *ar = a + off, *br = b + off;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = ar[i] + br[i];
        sr[i] = v;
        ss += v * v;
    }
    ss = msm_warp_sum(ss);
    int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) part[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < nwarps; i++) tot += part[i];
    float inv = 1.0f / sqrtf(tot / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = msm_bf(w[i]) * (sr[i] * inv);
}

extern "C" int msm_cuda_add_rmsnorm(float *sum, float *out, const float *a, const float *b,
                                    const uint16_t *w, int rows, int dim, float eps,
                                    cudaStream_t stream) {
    if (rows < 0 || dim <= 0) return -EINVAL;
    if (rows == 0) return 0;
    int threads = dim >= 1024 ? 256 : dim > 128 ? 128 : 64;
    add_rmsnorm_kernel<<<rows, threads, 0, stream>>>(sum, out, a, b, w, dim, eps);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- MoE combine + residual add + rmsnorm: one block per row; block sums in a fixed order ---- */
static __device__ float block_sum(float v, float *part) {
    v = msm_warp_sum(v);
    int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    __syncthreads(); /* part may still be read from a previous call */
    if ((threadIdx.x & 31) == 0) part[warp] = v;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < nwarps; i++) tot += part[i];
    return tot;
}

__global__ void moe_combine_rmsnorm_kernel(float *sum, float *out, const float *x, const float *routed,
                                           const float *shared, const float *h, const uint16_t *wg,
                                           const uint16_t *w, int dim, float eps) {
    __shared__ float part[32];
    size_t off = (size_t)blockIdx.x * dim;
    float g = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) g = fmaf(h[off + i], msm_bf(wg[i]), g);
    g = block_sum(g, part);
    float s = 1.0f / (1.0f + expf(-g));
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = x[off + i] + (routed[off + i] + shared[off + i] * s);
        sum[off + i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, part);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[off + i] = msm_bf(w[i]) * (sum[off + i] * inv);
}

extern "C" int msm_cuda_moe_combine_rmsnorm(float *sum, float *out, const float *x, const float *routed,
                                            const float *shared, const float *h, const uint16_t *wg,
                                            const uint16_t *w, int rows, int dim, float eps,
                                            cudaStream_t stream) {
    if (rows < 0 || dim <= 0) return -EINVAL;
    if (rows == 0) return 0;
    int threads = dim >= 2048 ? 512 : dim >= 1024 ? 256 : dim > 128 ? 128 : 64;
    moe_combine_rmsnorm_kernel<<<rows, threads, 0, stream>>>(sum, out, x, routed, shared, h, wg, w, dim, eps);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- rope: one thread per (token, frequency), rotating that pair in every head ---- */
__global__ void rope_kernel(float *x, const int32_t *pos, int T, int nheads, int hd, float theta) {
    int half = hd / 2;
    size_t n = (size_t)T * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / half), i = (int)(idx % half);
        /* as the CPU (and HF): inv_freq = 1 / theta^(2i/hd) in float32 */
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        float ang = (float)pos[t] * inv_freq;
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < nheads; h++) {
            float *v = x + ((size_t)t * nheads + h) * hd;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

extern "C" int msm_cuda_rope(float *x, const int32_t *pos, int T, int nheads, int hd, float theta,
                             cudaStream_t stream) {
    if (T < 0 || nheads <= 0 || hd <= 0 || hd % 2) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * (hd / 2);
    rope_kernel<<<grid_for(n, 128), 128, 0, stream>>>(x, pos, T, nheads, hd, theta);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- rope_copy: out = x with the first nrot heads of every row rotated (one launch instead of a
 * copy + an in-place rope); the rotation is the same formula as rope_kernel ---- */
__global__ void rope_copy_kernel(float *out, const float *x, const int32_t *pos, int T, int C,
                                 int nrot, int hd, float theta) {
    int half = hd / 2, rest = C - nrot * hd;
    size_t n1 = (size_t)T * half, n = n1 + (size_t)T * rest;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx < n1) {
            int t = (int)(idx / half), i = (int)(idx % half);
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
            float ang = (float)pos[t] * inv_freq;
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < nrot; h++) {
                size_t o = (size_t)t * C + (size_t)h * hd;
                float a = x[o + i], b = x[o + i + half];
                out[o + i] = a * c - b * s;
                out[o + i + half] = b * c + a * s;
            }
        } else {
            size_t j = idx - n1;
            int t = (int)(j / rest), c = (int)(j % rest);
            size_t o = (size_t)t * C + (size_t)nrot * hd + c;
            out[o] = x[o];
        }
    }
}

extern "C" int msm_cuda_rope_copy(float *out, const float *x, const int32_t *pos, int T, int C,
                                  int nrot, int hd, float theta, cudaStream_t stream) {
    if (T < 0 || nrot <= 0 || hd <= 0 || hd % 2 || C < nrot * hd) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * (hd / 2) + (size_t)T * (C - nrot * hd);
    rope_copy_kernel<<<grid_for(n, 128), 128, 0, stream>>>(out, x, pos, T, C, nrot, hd, theta);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- kv_write from rows with a stride (k, v read in place from the qkv rows) ---- */
__global__ void kv_write_ld_kernel(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                   size_t ld, const int32_t *slot, int T, int row) {
    size_t n = (size_t)T * row;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / row), j = (int)(idx % row);
        int s = slot[t];
        if (s < 0) continue;
        kc[(size_t)s * row + j] = msm_f2bf(k[(size_t)t * ld + j]);
        vc[(size_t)s * row + j] = msm_f2bf(v[(size_t)t * ld + j]);
    }
}

extern "C" int msm_cuda_kv_write_ld(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                    size_t ld, const int32_t *slot, int T, int kvh, int hd,
                                    cudaStream_t stream) {
    if (T < 0 || kvh <= 0 || hd <= 0 || ld < (size_t)kvh * hd) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * kvh * hd;
    kv_write_ld_kernel<<<grid_for(n, 256), 256, 0, stream>>>(kc, vc, k, v, ld, slot, T, kvh * hd);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- kv_write: one thread per element, f32 -> bf16 (round to nearest even) ---- */
__global__ void kv_write_kernel(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                const int32_t *slot, int T, int row) {
    size_t n = (size_t)T * row;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / row), j = (int)(idx % row);
        int s = slot[t];
        if (s < 0) continue;
        kc[(size_t)s * row + j] = msm_f2bf(k[idx]);
        vc[(size_t)s * row + j] = msm_f2bf(v[idx]);
    }
}

extern "C" int msm_cuda_kv_write(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                 const int32_t *slot, int T, int kvh, int hd,
                                 cudaStream_t stream) {
    if (T < 0 || kvh <= 0 || hd <= 0) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * kvh * hd;
    kv_write_kernel<<<grid_for(n, 256), 256, 0, stream>>>(kc, vc, k, v, slot, T, kvh * hd);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- add / scale_rows / sigmoid / swiglu ---- */
__global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

__global__ void add4_kernel(float4 *y, const float4 *a, const float4 *b, size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 p = a[i], q = b[i];
        y[i] = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
    }
}

extern "C" int msm_cuda_add(float *y, const float *a, const float *b, size_t n,
                            cudaStream_t stream) {
    if (n == 0) return 0;
    if (((uintptr_t)y | (uintptr_t)a | (uintptr_t)b) % 16 == 0 && n % 4 == 0) {
        add4_kernel<<<grid_for(n / 4, 256), 256, 0, stream>>>((float4 *)y, (const float4 *)a,
                                                              (const float4 *)b, n / 4);
    } else {
        add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, a, b, n);
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void scale_rows_kernel(float *y, const float *x, const float *s, int T, int D) {
    size_t n = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] * s[i / D];
}

extern "C" int msm_cuda_scale_rows(float *y, const float *x, const float *s, int T, int D,
                                   cudaStream_t stream) {
    if (T < 0 || D <= 0) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * D;
    scale_rows_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, x, s, T, D);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void sigmoid_kernel(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = 1.0f / (1.0f + expf(-x[i]));
}

extern "C" int msm_cuda_sigmoid(float *y, const float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return 0;
    sigmoid_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void swiglu_kernel(float *y, const float *gu, int T, int I) {
    size_t n = (size_t)T * I;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / I, i = idx % I;
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        y[idx] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" int msm_cuda_swiglu(float *y, const float *gu, int T, int I, cudaStream_t stream) {
    if (T < 0 || I <= 0) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * I;
    swiglu_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, gu, T, I);
    CUDA_LAUNCH_CHECK();
    return 0;
}
