/* errors.cu: CUDA and cuBLAS(Lt) status codes mapped to negative errno values, and the one log
 * line CUDA_TRY / CUBLAS_TRY write when a call fails (see msm_cuda.h). */
#include "msm_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" int msm_cuda_errno(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return 0;
    case cudaErrorMemoryAllocation: return -ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle: return -EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice: return -ENODEV;
    case cudaErrorNotSupported:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorStreamCaptureUnsupported: return -ENOTSUP;
    default: return -EIO;
    }
}

extern "C" int msm_cublas_errno(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return 0;
    case CUBLAS_STATUS_ALLOC_FAILED: return -ENOMEM;
    case CUBLAS_STATUS_INVALID_VALUE: return -EINVAL;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: return -ENOTSUP;
    default: return -EIO;
    }
}

static int current_device(void) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    return dev;
}

extern "C" int msm__cuda_fail(const char *expr, const char *file, int line, cudaError_t err) {
    fprintf(stderr, "msmoed: cuda: %s failed at %s:%d on device %d: %s (%s)\n", expr, file, line,
            current_device(), cudaGetErrorString(err), cudaGetErrorName(err));
    return msm_cuda_errno(err);
}

extern "C" int msm__cublas_fail(const char *expr, const char *file, int line, cublasStatus_t st) {
    fprintf(stderr, "msmoed: cublas: %s failed at %s:%d on device %d: %s\n", expr, file, line,
            current_device(), cublasLtGetStatusString(st));
    return msm_cublas_errno(st);
}
