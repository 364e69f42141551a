/* cuda_allreduce: the one-shot all-reduce (kernels/cuda/allreduce.cu) against NCCL's, per message
 * size, on every GPU of the machine (one thread per GPU, as the engine's ranks). A benchmark,
 * never a test: run it by hand on a machine with two GPUs or more and record the table in
 * bench/results/ (`bench/cuda_allreduce [OUT.md]`). Its numbers set the default of
 * MSM_CUDA_AR_ONESHOT_MAX_BYTES.
 *
 * Each size: the inputs are random per rank; one eager call of each kind, whose results must be
 * equal bit for bit on every rank and to NCCL's (at two ranks both sum a + b; from three on NCCL's
 * order may differ, so only the one-shot's rank-order sum is checked against the host); then 50
 * back-to-back calls captured in a CUDA graph per kind, replayed 3 times to warm up and timed over
 * 20 replays with events: the time a call costs inside a decode graph. */
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "msm_cuda_kernels.h"

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "cuda_allreduce: %s failed at %s:%d (%s)\n", #cond, __FILE__, __LINE__, \
                    cudaGetErrorString(cudaGetLastError()));                                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#define CALLS 50
#define REPLAYS 20
static const size_t sizes[] = {8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
                               1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20};
#define N_SIZES (sizeof sizes / sizeof *sizes)
#define MAX_BYTES (32u << 20)

typedef struct shared {
    int n;
    ncclUniqueId id;
    pthread_barrier_t bar;
    char *base[MSM_CUDA_AR_MAX_RANKS];
    uint32_t *sig[MSM_CUDA_AR_MAX_RANKS];
    float *host_in[MSM_CUDA_AR_MAX_RANKS]; /* this size's inputs, for the host check */
    double us_nccl[N_SIZES], us_one[N_SIZES];
    bool equal[N_SIZES];
} shared;

typedef struct rank_arg {
    shared *sh;
    int rank;
} rank_arg;

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Time of one call: CALLS calls captured, REPLAYS replays after 3 warm-ups. */
static double time_graph(cudaStream_t s, cudaGraphExec_t ge, pthread_barrier_t *bar) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(ge, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    pthread_barrier_wait(bar);
    CHECK(cudaEventRecord(a, s) == cudaSuccess);
    for (int i = 0; i < REPLAYS; i++) CHECK(cudaGraphLaunch(ge, s) == cudaSuccess);
    CHECK(cudaEventRecord(b, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms * 1e3 / (REPLAYS * CALLS);
}

static void *rank_main(void *argp) {
    rank_arg *ra = argp;
    shared *sh = ra->sh;
    int r = ra->rank, n = sh->n;
    CHECK(cudaSetDevice(r) == cudaSuccess);
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, n, sh->id, r) == ncclSuccess);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    msm_cuda_tuning tune;
    CHECK(msm_cuda_tuning_init(&tune, r) == 0);
    msm_cuda_exec ex = {.stream = s, .tune = &tune};
    char *buf; /* [input MAX_BYTES | one-shot out | nccl out] */
    uint32_t *fault;
    CHECK(cudaMalloc((void **)&buf, 3 * (size_t)MAX_BYTES) == cudaSuccess);
    CHECK(cudaMalloc((void **)&sh->sig[r], msm_cuda_ar_signal_bytes()) == cudaSuccess);
    CHECK(cudaMemset(sh->sig[r], 0, msm_cuda_ar_signal_bytes()) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&fault, 4, cudaHostAllocMapped) == cudaSuccess);
    *fault = 0;
    sh->base[r] = buf;
    pthread_barrier_wait(&sh->bar);
    for (int q = 0; q < n; q++)
        if (q != r) {
            cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
            CHECK(e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled);
            (void)cudaGetLastError();
        }
    msm_cuda_ar_peers p = {.rank = r, .size = n, .fault = fault, .timeout_ns = 10000000000ull};
    for (int q = 0; q < n; q++) p.base[q] = sh->base[q], p.sig[q] = sh->sig[q];
    float *host = malloc(MAX_BYTES), *one = malloc(MAX_BYTES), *ncl = malloc(MAX_BYTES);
    CHECK(host && one && ncl);
    sh->host_in[r] = host;
    float *out1 = (float *)(buf + MAX_BYTES), *out2 = (float *)(buf + 2 * (size_t)MAX_BYTES);
    for (size_t k = 0; k < N_SIZES; k++) {
        size_t bytes = sizes[k], cnt = bytes / 4;
        for (size_t i = 0; i < cnt; i++)
            host[i] = (float)(mix(((uint64_t)r << 40) + i + k * 7919) >> 40) * (1.0f / 16777216.0f) - 0.5f;
        CHECK(cudaMemcpy(buf, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
        pthread_barrier_wait(&sh->bar);
        CHECK(msm_cuda_allreduce_oneshot(out1, 0, cnt, &p, ex) == 0);
        CHECK(ncclAllReduce(buf, out2, cnt, ncclFloat, ncclSum, comm, s) == ncclSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess && *fault == 0);
        CHECK(cudaMemcpy(one, out1, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(cudaMemcpy(ncl, out2, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
        pthread_barrier_wait(&sh->bar); /* every rank's host inputs are written */
        bool eq = n > 2 || memcmp(one, ncl, bytes) == 0;
        for (size_t i = 0; i < cnt && eq; i++) {
            float sum = sh->host_in[0][i];
            for (int q = 1; q < n; q++) sum += sh->host_in[q][i];
            eq = memcmp(&sum, &one[i], 4) == 0;
        }
        pthread_barrier_wait(&sh->bar);
        cudaGraph_t g;
        cudaGraphExec_t ge1, ge2;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
        for (int c = 0; c < CALLS; c++) CHECK(msm_cuda_allreduce_oneshot(out1, 0, cnt, &p, ex) == 0);
        CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
        CHECK(cudaGraphInstantiate(&ge1, g, 0) == cudaSuccess);
        cudaGraphDestroy(g);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
        for (int c = 0; c < CALLS; c++) CHECK(ncclAllReduce(buf, out2, cnt, ncclFloat, ncclSum, comm, s) == ncclSuccess);
        CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
        CHECK(cudaGraphInstantiate(&ge2, g, 0) == cudaSuccess);
        cudaGraphDestroy(g);
        double t1 = time_graph(s, ge1, &sh->bar), t2 = time_graph(s, ge2, &sh->bar);
        CHECK(*fault == 0);
        if (r == 0) sh->us_one[k] = t1, sh->us_nccl[k] = t2;
        if (r == 0 || !eq) sh->equal[k] = eq;
        cudaGraphExecDestroy(ge1), cudaGraphExecDestroy(ge2);
        pthread_barrier_wait(&sh->bar);
    }
    free(host), free(one), free(ncl);
    ncclCommDestroy(comm);
    return NULL;
}

int main(int argc, char **argv) {
    shared sh = {0};
    CHECK(cudaGetDeviceCount(&sh.n) == cudaSuccess);
    if (sh.n < 2) {
        fprintf(stderr, "cuda_allreduce: needs two GPUs or more (found %d)\n", sh.n);
        return 2;
    }
    if (sh.n > MSM_CUDA_AR_MAX_RANKS) sh.n = MSM_CUDA_AR_MAX_RANKS;
    CHECK(ncclGetUniqueId(&sh.id) == ncclSuccess);
    pthread_barrier_init(&sh.bar, NULL, (unsigned)sh.n);
    pthread_t th[MSM_CUDA_AR_MAX_RANKS];
    rank_arg ra[MSM_CUDA_AR_MAX_RANKS];
    for (int r = 0; r < sh.n; r++) {
        ra[r] = (rank_arg){&sh, r};
        pthread_create(&th[r], NULL, rank_main, &ra[r]);
    }
    for (int r = 0; r < sh.n; r++) pthread_join(th[r], NULL);
    FILE *out = argc > 1 ? fopen(argv[1], "w") : NULL;
    char line[256];
    snprintf(line, sizeof line,
             "# all-reduce of float32 over %d GPUs: the time of one call inside a CUDA graph (%d calls a "
             "replay, mean over %d replays)\n\n| bytes | NCCL us | one-shot us | NCCL / one-shot | one-shot = rank-order sum%s |\n|---:|---:|---:|---:|:---|\n",
             sh.n, CALLS, REPLAYS, sh.n == 2 ? " = NCCL" : "");
    fputs(line, stdout);
    if (out) fputs(line, out);
    for (size_t k = 0; k < N_SIZES; k++) {
        snprintf(line, sizeof line, "| %zu | %.2f | %.2f | %.2fx | %s |\n", sizes[k], sh.us_nccl[k], sh.us_one[k],
                 sh.us_nccl[k] / sh.us_one[k], sh.equal[k] ? "yes" : "NO");
        fputs(line, stdout);
        if (out) fputs(line, out);
    }
    if (out) fclose(out);
    for (size_t k = 0; k < N_SIZES; k++)
        if (!sh.equal[k]) return 1;
    return 0;
}
