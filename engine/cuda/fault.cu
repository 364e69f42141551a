/* fault.cu: test-only fault injection for the CUDA backend (msm_engine_opts.test_fault), so the
 * daemon's handling of a GPU fault can be shown on a real GPU (tests/gpu/check_faults.sh): a
 * kernel launch the runtime refuses, and a kernel that spins past the step's deadline. Never used
 * in production. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "msm_cuda.h"
#include "msm_cuda_backend.h"

/* Spins for ns nanoseconds of the GPU's global timer (0: returns at once). */
static __global__ void spin_kernel(uint64_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" int msm_cuda_test_fault(int hang, int spin_ms, msm_cuda_exec ex) {
    if (hang) {
        spin_kernel<<<1, 1, 0, ex.stream>>>((uint64_t)spin_ms * 1000000ull);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    /* 4096 threads a block: more than any GPU allows, so the launch itself fails */
    spin_kernel<<<1, 4096, 0, ex.stream>>>(0);
    CUDA_LAUNCH_CHECK();
    return 0;
}
