/* Host collectives (see msm_comm.h): ranks are threads of one process.
 *
 * Call k of every rank meets in slot k % NSLOTS. A slot goes through three barriers under one
 * mutex: all ranks deposit (pointers, op, size); each rank computes its result from everyone's
 * inputs into a private buffer; after everyone has read, each writes its own output. Mismatched
 * ops or sizes in one slot fail all of its ranks with -EPROTO (NCCL would corrupt or hang). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_comm.h"
#include "msm_file.h"

#define NSLOTS 8

enum { OP_ALLREDUCE = 1, OP_ALLGATHER = 2 };

typedef struct slot {
    uint64_t call;          /* the call index this slot currently serves */
    int arrived, read, left;
    int op[64];
    size_t n[64];
    const void *in[64];
} slot;

typedef struct host_rank {
    msm_comm c;
    msm_comm_group *g;
    uint64_t next_call;
} host_rank;

struct msm_comm_group {
    int size, deadline_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int failed;             /* 0 or the negative errno that broke the group */
    slot slots[NSLOTS];
    host_rank *ranks;
};


/* Waits (mutex held) until pred is true, the group fails, or the deadline passes. */
#define WAIT_UNTIL(g, pred, dl, ret)                                                              \
    do {                                                                                          \
        while (!(pred) && !(g)->failed) {                                                         \
            if (pthread_cond_timedwait(&(g)->cv, &(g)->mu, &(dl)) == ETIMEDOUT && !(pred)) {       \
                (g)->failed = -ETIMEDOUT;                                                         \
                pthread_cond_broadcast(&(g)->cv);                                                 \
            }                                                                                     \
        }                                                                                         \
        (ret) = (pred) ? 0 : (g)->failed;                                                         \
    } while (0)

static int collective(host_rank *hr, int op, const void *in, void *out, size_t n, size_t row_bytes,
                      msm_err *err) {
    msm_comm_group *g = hr->g;
    int r = 0, size = g->size, rank = hr->c.rank;
    size_t bytes = op == OP_ALLREDUCE ? n * sizeof(float) : n * row_bytes * (size_t)size;
    /* per call, not per rank: a rank's main and aux threads may both be in a collective (that
     * is the misplacement the verifier forbids, but the test that reproduces it runs it) */
    void *tmp = malloc(bytes ? bytes : 1);
    if (!tmp) return msm_err_set(err, -ENOMEM, "out of memory in a host collective");
    struct timespec dl = msm_deadline_after_ms(g->deadline_ms);
    pthread_mutex_lock(&g->mu);
    uint64_t k = hr->next_call++;
    slot *s = &g->slots[k % NSLOTS];
    WAIT_UNTIL(g, s->call == k, dl, r);
    if (r == 0) {
        s->op[rank] = op;
        s->n[rank] = n;
        s->in[rank] = in;
        if (++s->arrived == size) pthread_cond_broadcast(&g->cv);
        WAIT_UNTIL(g, s->arrived == size, dl, r);
    }
    if (r == 0) {
        for (int q = 0; q < size; q++)
            if (s->op[q] != op || s->n[q] != n) {
                g->failed = -EPROTO;
                pthread_cond_broadcast(&g->cv);
                r = msm_err_set(err, -EPROTO,
                                "collective mismatch at call #%llu: rank %d issued %s of %zu, rank %d "
                                "issued %s of %zu (ranks must issue the same collectives in the "
                                "same order)", (unsigned long long)k, rank,
                                op == OP_ALLREDUCE ? "ALLREDUCE" : "ALLGATHER", n, q,
                                s->op[q] == OP_ALLREDUCE ? "ALLREDUCE" : "ALLGATHER", s->n[q]);
                break;
            }
    }
    pthread_mutex_unlock(&g->mu);
    if (r == 0) {
        if (op == OP_ALLREDUCE) {
            float *t = tmp;
            memcpy(t, s->in[0], n * sizeof(float));
            for (int q = 1; q < size; q++) {
                const float *x = s->in[q];
                for (size_t i = 0; i < n; i++) t[i] += x[i];
            }
        } else {
            char *t = tmp;
            size_t out_row = row_bytes * (size_t)size;
            for (int q = 0; q < size; q++)
                for (size_t i = 0; i < n; i++)
                    memcpy(t + i * out_row + (size_t)q * row_bytes,
                           (const char *)s->in[q] + i * row_bytes, row_bytes);
        }
    }
    pthread_mutex_lock(&g->mu);
    if (r == 0) {
        if (++s->read == size) pthread_cond_broadcast(&g->cv);
        WAIT_UNTIL(g, s->read == size, dl, r);
    }
    if (r == 0 && ++s->left == size) {
        s->arrived = s->read = s->left = 0;
        s->call += NSLOTS;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    if (r == 0) {
        memcpy(out, tmp, bytes);
    } else if (r == -ETIMEDOUT) {
        msm_err_set(err, r, "host collective call #%llu on rank %d timed out after %d ms (a rank "
                            "never issued its matching call)", (unsigned long long)k, rank,
                    g->deadline_ms);
    } else if (r != -EPROTO) {
        msm_err_set(err, r, "host collective group failed earlier; rank %d gives up", rank);
    }
    free(tmp);
    return r;
}

static int host_allreduce(msm_comm *c, const float *in, float *out, size_t n, msm_err *err) {
    return collective((host_rank *)c, OP_ALLREDUCE, in, out, n, 0, err);
}

static int host_allgather(msm_comm *c, const void *in, void *out, size_t rows, size_t row_bytes,
                          msm_err *err) {
    return collective((host_rank *)c, OP_ALLGATHER, in, out, rows, row_bytes, err);
}

static const msm_comm_vt host_vt = {host_allreduce, host_allgather};

int msm_comm_group_new(int size, int deadline_ms, msm_comm_group **ret) {
    if (size < 1 || size > 64) return -EINVAL;
    msm_comm_group *g = calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    g->ranks = calloc((size_t)size, sizeof *g->ranks);
    if (!g->ranks) {
        free(g);
        return -ENOMEM;
    }
    g->size = size;
    g->deadline_ms = deadline_ms;
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < NSLOTS; i++) g->slots[i].call = (uint64_t)i;
    for (int r = 0; r < size; r++) {
        g->ranks[r].c = (msm_comm){.vt = &host_vt, .rank = r, .size = size};
        g->ranks[r].g = g;
    }
    *ret = g;
    return 0;
}

void msm_comm_group_free(msm_comm_group *g) {
    if (!g) return;
    free(g->ranks);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

msm_comm *msm_comm_group_rank(msm_comm_group *g, int rank) {
    return rank >= 0 && rank < g->size ? &g->ranks[rank].c : NULL;
}
