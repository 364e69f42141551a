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

/* --dummy-weights on the device (fill.cu): w[i] uniform in ±scale from (seed, i), or ones. */
int msm_cuda_fill_dummy(uint16_t *w, size_t n, uint64_t seed, float scale, int ones, msm_cuda_exec ex);
/* Test-only (fault.cu): hang = 0 launches a kernel with an impossible block size (the launch
 * fails: a negative errno); hang = 1 launches a kernel on ex's stream that spins for spin_ms. */
int msm_cuda_test_fault(int hang, int spin_ms, msm_cuda_exec ex);

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
#endif

#endif
