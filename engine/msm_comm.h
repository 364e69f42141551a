/* msm_comm: collectives of one TP group, behind a small interface.
 *
 * `host`: one process, one thread per rank, shared memory. Like NCCL, ranks match calls by
 * issue order per communicator: the k-th call of every rank forms one collective, whatever
 * buffers each rank passed. So a misplaced collective pairs the wrong buffers here exactly as it
 * does on GPUs. Every wait has a deadline: a hang becomes -ETIMEDOUT, and a failed group stays
 * failed (like ncclCommAbort). The NCCL implementation lives with the CUDA backend. */
#ifndef MSM_COMM_H
#define MSM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"

typedef struct msm_comm msm_comm;            /* one rank's handle */
typedef struct msm_comm_group msm_comm_group; /* the shared state of a host group */

typedef struct msm_comm_vt {
    /* out[i] = sum over ranks of in[i], i < n (float32). in may equal out. */
    int (*allreduce)(msm_comm *c, const float *in, float *out, size_t n, msm_err *err);
    /* out [rows, cols * tp]: rank r's in [rows, cols] lands in columns [r*cols, (r+1)*cols). */
    int (*allgather)(msm_comm *c, const void *in, void *out, size_t rows, size_t row_bytes,
                     msm_err *err);
} msm_comm_vt;

struct msm_comm {
    const msm_comm_vt *vt;
    int rank, size;
};

/* Host group of `size` ranks; waits give up after deadline_ms. */
int msm_comm_group_new(int size, int deadline_ms, msm_comm_group **ret);
void msm_comm_group_free(msm_comm_group *g);
msm_comm *msm_comm_group_rank(msm_comm_group *g, int rank);

static inline int msm_comm_allreduce(msm_comm *c, const float *in, float *out, size_t n,
                                     msm_err *err) {
    return c->vt->allreduce(c, in, out, n, err);
}
static inline int msm_comm_allgather(msm_comm *c, const void *in, void *out, size_t rows,
                                     size_t row_bytes, msm_err *err) {
    return c->vt->allgather(c, in, out, rows, row_bytes, err);
}

#endif
