/* msm_cuda_backend: the CUDA implementation of msm_backend (streams, events, cuBLASLt, NCCL,
 * decode CUDA graphs). Only built with the CUDA toolkit. */
#ifndef MSM_CUDA_BACKEND_H
#define MSM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "msm_cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Applies the MSM_CUDA_* benchmark and bisection switches of the environment to a rank's tuning
 * (their list: backend_cuda.c); the backend calls it once per rank, bench/cuda_kernels too. */
void msm_cuda_tuning_from_env(msm_cuda_tuning *t);

/* --dummy-weights on the device (fill.cu): w[i] uniform in ±scale from (seed, i), or ones. */
int msm_cuda_fill_dummy(uint16_t *w, size_t n, uint64_t seed, float scale, int ones, msm_cuda_exec ex);
/* Test-only (fault.cu): hang = 0 launches a kernel with an impossible block size (the launch
 * fails: a negative errno); hang = 1 launches a kernel on ex's stream that spins for spin_ms. */
int msm_cuda_test_fault(int hang, int spin_ms, msm_cuda_exec ex);
/* An FP8-resident weight's dummy (fill.cu): q[i] the e4m3 code of the uniform value in ±448 from
 * (seed, i), saturating, round to nearest even; every one of its n_scales scales scale / 448. */
int msm_cuda_fill_dummy_fp8(uint8_t *q, float *sc, size_t n, size_t n_scales, uint64_t seed, float scale,
                            msm_cuda_exec ex);
/* The same values in float32 (keep_f32 weights; exactly the CPU backend's dummy values). */
int msm_cuda_fill_dummy_f32(float *w, size_t n, uint64_t seed, float scale, int ones, msm_cuda_exec ex);

/* Weight loading (load.cu): rows x cols elements of src_dtype (an msm_dtype: BF16, F16 or F32)
 * at src (device, src_pitch bytes from row to row, aligned to the element size) converted to
 * bf16 exactly as msm_f32_to_bf16(msm_*_to_f32(x)) on the host, into dst (dst_pitch elements
 * from row to row). */
int msm_cuda_load_rows(uint16_t *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                       int src_dtype, size_t rows, size_t cols, msm_cuda_exec ex);
/* The same into a float32 weight (keep_f32), exact from every source dtype. */
int msm_cuda_load_rows_f32(float *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                           int src_dtype, size_t rows, size_t cols, msm_cuda_exec ex);
/* rows x cols F8_E4M3 elements at src (device, src_pitch bytes from row to row) dequantised with
 * their block scales (device: element (r, c) uses scale[((scale_r0 + r) / block) * scale_pitch +
 * (scale_c0 + c) / block]) exactly as msm_fp8_dequant_row on the host, into dst: bf16 (rounded as
 * msm_f32_to_bf16) or, with dst_f32, float32; dst_pitch elements from row to row. */
int msm_cuda_load_rows_fp8(void *dst, int dst_f32, size_t dst_pitch, const void *src, size_t src_pitch,
                           size_t rows, size_t cols, const float *scale, size_t scale_pitch,
                           size_t scale_r0, size_t scale_c0, int block, msm_cuda_exec ex);
/* An FP8-resident weight's per-row scales of a chunk of `rows` rows whose first row is row r0 of
 * its block: dst[i * dst_pitch + j] = src[((r0 + i) / block) * ncb + j] for i < rows, j < ncb
 * (src: the chunk's nrb x ncb block scales, packed, on the device). */
int msm_cuda_load_fp8_row_scales(float *dst, size_t dst_pitch, const float *src, size_t ncb, size_t rows,
                                 size_t r0, int block, msm_cuda_exec ex);
/* *flag (device) = tag, unless already set, when the rows x cols FP8 codes at q (pitch bytes from
 * row to row) hold a NaN code: the FP8 kernels decode codes with integer operations that make
 * NaN codes finite (kernels/cuda/msm_cuda.h), so the backend refuses such a weight. */
int msm_cuda_fp8_find_nan(const uint8_t *q, size_t pitch, size_t rows, size_t cols, uint32_t *flag, uint32_t tag,
                          msm_cuda_exec ex);

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
#include "msm_backend.h"
/* Creates the backend of `rank` on `device` (the calling thread becomes that device's owner).
 * nccl_id: 128 bytes shared by the group (ncclUniqueId). */
int msm_backend_cuda_new(int device, int rank, int tp, const void *nccl_id, int deadline_ms,
                         msm_backend **ret, msm_err *err);
/* ncclGetUniqueId into id (128 bytes). */
int msm_cuda_nccl_unique_id(void *id, msm_err *err);
int msm_cuda_device_count(void);
/* GPU `device`'s name (into name, name_len bytes) and its device-to-device copy rate in GB/s,
 * bytes read plus bytes written, over copies of `bytes` (needs 2 x bytes free). */
int msm_cuda_copy_gbps(int device, size_t bytes, char *name, size_t name_len, double *ret, msm_err *err);
/* Weight wi of a CUDA backend on its device, bf16 [n_expert, rows, cols] (NULL when absent), and
 * its element count in ret_n: for tests. */
const uint16_t *msm_backend_cuda_weight(const msm_backend *b, int wi, size_t *ret_n);
/* Weight wi's e4m3 codes [n_expert, rows, cols], its scales (ret_scale) and column phase
 * (ret_phase; msm_cuda_fp8w) on the device when it is FP8-resident, else NULL: for tests. */
const uint8_t *msm_backend_cuda_weight_fp8(const msm_backend *b, int wi, const float **ret_scale, int *ret_phase);
#endif

#endif
