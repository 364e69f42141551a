/* load.cu: the device side of the CUDA backend's weight loading (msm_weights.h). A block of
 * checkpoint elements that cannot go straight into its weight with one copy (an f32 or f16
 * source, or a column slice whose rows are apart) is copied raw into a device staging buffer and
 * this kernel converts it to bf16 and scatters its rows into the weight. The conversions are the
 * host's, bit for bit (msm_f16_to_f32, msm_f32_to_bf16, NaN included), so a weight loaded from
 * f32 or f16 equals what the old host path produced.
 *
 * FP8 block-scaled blocks (docs/adr/0006-fp8.md) are dequantised here too, for now to bf16 (the
 * GEMV and MoE kernels read bf16 weights): w = f8(q) * scale_inv of q's 128 x 128 block, one
 * float32 multiply rounded to nearest (as the CPU oracle's msm_fp8_dequant_row), then
 * msm_f32_to_bf16; the scales of the blocks a chunk covers come in a small device buffer. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>

#include "msm_cuda.h"
#include "msm_cuda_backend.h"
#include "msm_dtype.h"

/* msm_f32_to_bf16: round to nearest even; NaN stays NaN (quieted). */
static __device__ __forceinline__ uint16_t bf16_bits(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* msm_f16_to_f32, exactly: subnormals scaled by 2^-24 (exact in float), Inf/NaN payload kept. */
static __device__ __forceinline__ uint32_t f16_to_f32_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) return sign | __float_as_uint((float)man * 5.9604644775390625e-8f);
    if (exp == 31) return sign | 0x7f800000u | (man << 13);
    return sign | ((exp + 112) << 23) | (man << 13);
}

/* One element: src is aligned to its element size (chunks start at a slot's start and every
 * offset inside is a multiple of the element size). */
static __device__ __forceinline__ uint16_t load_elem(const unsigned char *p, int dtype) {
    if (dtype == MSM_BF16) return *(const uint16_t *)p;
    if (dtype == MSM_F16) return bf16_bits(f16_to_f32_bits(*(const uint16_t *)p));
    return bf16_bits(*(const uint32_t *)p);
}

/* The same element as float32, for keep_f32 weights (exact from every source dtype). */
static __device__ __forceinline__ float load_elem_f32(const unsigned char *p, int dtype) {
    if (dtype == MSM_BF16) return __uint_as_float((uint32_t)*(const uint16_t *)p << 16);
    if (dtype == MSM_F16) return __uint_as_float(f16_to_f32_bits(*(const uint16_t *)p));
    return *(const float *)p;
}

/* rows x cols elements; blockIdx.y strides over rows, x over columns. T: uint16_t (bf16) or float
 * destinations. */
template <typename T>
static __global__ void load_rows_kernel(T *dst, size_t dst_pitch, const unsigned char *src,
                                        size_t src_pitch, int dtype, size_t es, size_t rows, size_t cols) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const unsigned char *s = src + r * src_pitch;
        T *d = dst + r * dst_pitch;
        for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < cols; c += (size_t)gridDim.x * blockDim.x) {
            if constexpr (sizeof(T) == 4)
                d[c] = load_elem_f32(s + c * es, dtype);
            else
                d[c] = load_elem(s + c * es, dtype);
        }
    }
}

/* msm_f8e4m3_to_f32, exactly: NaN for S.1111.111, subnormals m x 2^-9, normals 2^(e-7) x 1.m. */
static __device__ __forceinline__ float f8e4m3_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q >> 7) << 31, exp = (q >> 3) & 0xfu, man = q & 7u;
    if (exp == 15 && man == 7) return __uint_as_float(sign | 0x7fc00000u);
    if (exp == 0) return __uint_as_float(sign | __float_as_uint((float)man * 0.001953125f));
    return __uint_as_float(sign | ((exp + 120) << 23) | (man << 20));
}

/* rows x cols FP8 elements (src_pitch bytes apart) dequantised into T (bf16 bits or float): the
 * scale of element (r, c) is scale[((r0 + r) / block) * scale_pitch + (c0 + c) / block]. An FP8
 * NaN stays the decoder's NaN (a multiply on the device would make it the canonical one, which
 * the host does not). */
template <typename T>
static __global__ void load_rows_fp8_kernel(T *dst, size_t dst_pitch, const uint8_t *src, size_t src_pitch,
                                            const float *scale, size_t scale_pitch, size_t r0, size_t c0,
                                            size_t block, size_t rows, size_t cols) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const uint8_t *s = src + r * src_pitch;
        const float *sr = scale + (r0 + r) / block * scale_pitch;
        T *d = dst + r * dst_pitch;
        for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < cols; c += (size_t)gridDim.x * blockDim.x) {
            uint8_t q = s[c];
            float f = f8e4m3_to_f32(q);
            float w = (q & 0x7f) == 0x7f ? f : __fmul_rn(f, sr[(c0 + c) / block]);
            if constexpr (sizeof(T) == 4)
                d[c] = w;
            else
                d[c] = bf16_bits(__float_as_uint(w));
        }
    }
}

template <typename T>
static int load_rows_fp8(T *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t rows, size_t cols,
                         const float *scale, size_t scale_pitch, size_t r0, size_t c0, int block, msm_cuda_exec ex) {
    if (rows == 0 || cols == 0) return 0;
    if (block <= 0 || !scale) return -EINVAL;
    unsigned gx = (unsigned)((cols + 255) / 256), gy = (unsigned)(rows < 65535 ? rows : 65535);
    if (gx > 1024) gx = 1024;
    if ((size_t)gx * gy > 65536) gy = 65536 / gx ? 65536 / gx : 1;
    CUDA_TRY(msm_launch(load_rows_fp8_kernel<T>, dim3(gx, gy), dim3(256), 0, ex, dst, dst_pitch,
                        (const uint8_t *)src, src_pitch, scale, scale_pitch, r0, c0, (size_t)block, rows, cols));
    return 0;
}

template <typename T>
static int load_rows(T *dst, size_t dst_pitch, const void *src, size_t src_pitch, int src_dtype,
                     size_t rows, size_t cols, msm_cuda_exec ex) {
    if (rows == 0 || cols == 0) return 0;
    if (src_dtype != MSM_BF16 && src_dtype != MSM_F16 && src_dtype != MSM_F32) return -EINVAL;
    size_t es = src_dtype == MSM_F32 ? 4 : 2;
    if (src_pitch == cols * es && dst_pitch == cols) { /* rows back to back on both sides: one long row */
        cols *= rows;
        rows = 1;
    }
    unsigned gx = (unsigned)((cols + 255) / 256), gy = (unsigned)(rows < 65535 ? rows : 65535);
    if (gx > 1024) gx = 1024;
    if ((size_t)gx * gy > 65536) gy = 65536 / gx ? 65536 / gx : 1;
    CUDA_TRY(msm_launch(load_rows_kernel<T>, dim3(gx, gy), dim3(256), 0, ex, dst, dst_pitch,
                        (const unsigned char *)src, src_pitch, src_dtype, es, rows, cols));
    return 0;
}

extern "C" int msm_cuda_load_rows(uint16_t *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                  int src_dtype, size_t rows, size_t cols, msm_cuda_exec ex) {
    return load_rows(dst, dst_pitch, src, src_pitch, src_dtype, rows, cols, ex);
}

extern "C" int msm_cuda_load_rows_f32(float *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                      int src_dtype, size_t rows, size_t cols, msm_cuda_exec ex) {
    return load_rows(dst, dst_pitch, src, src_pitch, src_dtype, rows, cols, ex);
}

extern "C" int msm_cuda_load_rows_fp8(void *dst, int dst_f32, size_t dst_pitch, const void *src, size_t src_pitch,
                                      size_t rows, size_t cols, const float *scale, size_t scale_pitch,
                                      size_t scale_r0, size_t scale_c0, int block, msm_cuda_exec ex) {
    if (dst_f32)
        return load_rows_fp8((float *)dst, dst_pitch, src, src_pitch, rows, cols, scale, scale_pitch, scale_r0,
                             scale_c0, block, ex);
    return load_rows_fp8((uint16_t *)dst, dst_pitch, src, src_pitch, rows, cols, scale, scale_pitch, scale_r0,
                         scale_c0, block, ex);
}

static __global__ void fp8_row_scales_kernel(float *dst, size_t dst_pitch, const float *src, size_t ncb, size_t rows,
                                             size_t r0, size_t block) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = rows * ncb;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ncb, j = i % ncb;
        dst[r * dst_pitch + j] = src[(r0 + r) / block * ncb + j];
    }
}

extern "C" int msm_cuda_load_fp8_row_scales(float *dst, size_t dst_pitch, const float *src, size_t ncb, size_t rows,
                                            size_t r0, int block, msm_cuda_exec ex) {
    if (rows == 0 || ncb == 0) return 0;
    if (block <= 0 || !src || !dst) return -EINVAL;
    size_t n = rows * ncb, blocks = (n + 255) / 256;
    CUDA_TRY(msm_launch(fp8_row_scales_kernel, dim3((unsigned)(blocks > 1024 ? 1024 : blocks)), dim3(256), 0, ex, dst,
                        dst_pitch, src, ncb, rows, r0, (size_t)block));
    return 0;
}

/* *flag = tag (the first to arrive) when rows x cols codes at q (pitch bytes apart) hold an e4m3
 * NaN code (S.1111.111). */
static __global__ void fp8_find_nan_kernel(const uint8_t *q, size_t pitch, size_t rows, size_t cols, uint32_t *flag,
                                           uint32_t tag) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = rows * cols;
    bool nan = false;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        nan |= (q[i / cols * pitch + i % cols] & 0x7f) == 0x7f;
    if (__syncthreads_or(nan) && threadIdx.x == 0) atomicCAS(flag, 0u, tag);
}

extern "C" int msm_cuda_fp8_find_nan(const uint8_t *q, size_t pitch, size_t rows, size_t cols, uint32_t *flag,
                                     uint32_t tag, msm_cuda_exec ex) {
    if (rows == 0 || cols == 0) return 0;
    size_t n = rows * cols, blocks = (n + 1023) / 1024;
    CUDA_TRY(msm_launch(fp8_find_nan_kernel, dim3((unsigned)(blocks > 512 ? 512 : blocks)), dim3(256), 0, ex, q, pitch,
                        rows, cols, flag, tag));
    return 0;
}
