/* msm_backend: what a rank needs from a device, as a small vtable (CPU and CUDA implement it).
 *
 * A backend holds one rank's weights, arena (every graph value at its planned offset), KV cache
 * and streams. `run` issues one node on the node's stream; `record`/`wait` are CUDA-event
 * semantics; `sync` ends a step. The CPU backend runs MAIN on the calling thread and AUX on a
 * worker thread of its own, with real events, so stream misuse misbehaves on a CPU too. */
#ifndef MSM_BACKEND_H
#define MSM_BACKEND_H

#include "msm_comm.h"
#include "msm_err.h"
#include "msm_graph.h"

typedef struct msm_step_dims {
    int T, R, S;
} msm_step_dims;

typedef struct msm_backend msm_backend;

typedef struct msm_backend_vt {
    const char *name;
    void (*free)(msm_backend *b);
    /* Stores weight wi of the graph from host float32 data [n_expert, rows, cols]. */
    int (*load_weight)(msm_backend *b, int wi, const msm_weight *w, const float *data, msm_err *err);
    /* Allocates the arena, the KV cache (n_kv_blocks blocks) and scratch for graph g. */
    int (*prepare)(msm_backend *b, const msm_graph *g, int n_kv_blocks, msm_err *err);
    int (*write)(msm_backend *b, size_t off, const void *src, size_t n, msm_err *err);
    int (*read)(msm_backend *b, size_t off, void *dst, size_t n, msm_err *err);
    int (*begin)(msm_backend *b, msm_err *err); /* a new step starts */
    int (*run)(msm_backend *b, const msm_graph *g, int node, const msm_step_dims *d, msm_err *err);
    int (*record)(msm_backend *b, msm_stream s, int event, msm_err *err);
    int (*wait)(msm_backend *b, msm_stream s, int event, msm_err *err);
    int (*sync)(msm_backend *b, msm_err *err);
    /* Optional (NULL when unsupported): weights generated on the device for --dummy-weights,
     * uniform in ±scale from (seed, index), or ones for norms; and graph capture/replay. */
    int (*dummy_weight)(msm_backend *b, int wi, const msm_weight *w, uint64_t seed, float scale,
                        msm_err *err);
    int (*capture_begin)(msm_backend *b, msm_err *err);
    int (*capture_end)(msm_backend *b, int key, msm_err *err);
    int (*replay)(msm_backend *b, int key, msm_err *err); /* -ENOENT: no graph for key */
    /* Test-only (msm_engine_opts.test_fault, MSM_TEST_FAULT_*): before a step, fail it now
     * (LAUNCH: a negative errno) or make it overrun the deadline (HANG: 0, the step's sync then
     * times out). NULL when unsupported. */
    int (*test_fault)(msm_backend *b, int kind, msm_err *err);
} msm_backend_vt;

struct msm_backend {
    const msm_backend_vt *vt;
    msm_comm *comm;
    int rank;
    int deadline_ms;
    /* test-only: sleep this long before every collective issued on `skew_stream` */
    int skew_us;
    msm_stream skew_stream;
};

/* kv_bf16: K/V are rounded to bf16 as they are written (the CUDA backend's cache format), so CPU
 * results can be compared with CUDA ones on equal terms; off, the cache is float32. */
int msm_backend_cpu_new(msm_comm *comm, int rank, int deadline_ms, bool kv_bf16, msm_backend **ret,
                        msm_err *err);

static inline void msm_backend_free(msm_backend *b) {
    if (b) b->vt->free(b);
}

/* Executes graph g for one step: issues every node in order on its stream, then syncs. */
int msm_exec_step(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err);
/* Issues the nodes only (no begin, no sync): what a CUDA-graph capture records. */
int msm_exec_issue(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err);

#endif
