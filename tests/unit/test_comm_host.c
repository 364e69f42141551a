/* Host collectives: sums and gathers across rank threads, NCCL-style matching by issue order,
 * mismatch and missing-rank failures with a clear error instead of a hang. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "msm_comm.h"

#define N 37

typedef struct job {
    msm_comm_group *g;
    int rank, mode, r;
    float a[N], b[N], out_a[N], out_b[N];
    msm_err err;
} job;

static void *worker(void *arg) {
    job *j = arg;
    msm_comm *c = msm_comm_group_rank(j->g, j->rank);
    if (j->mode == 0) { /* allreduce a */
        j->r = msm_comm_allreduce(c, j->a, j->out_a, N, &j->err);
    } else if (j->mode == 1) { /* rank 0: a then b; others: b then a (misordered on purpose) */
        if (j->rank == 0) {
            j->r = msm_comm_allreduce(c, j->a, j->out_a, N, &j->err);
            if (!j->r) j->r = msm_comm_allreduce(c, j->b, j->out_b, N, &j->err);
        } else {
            j->r = msm_comm_allreduce(c, j->b, j->out_b, N, &j->err);
            if (!j->r) j->r = msm_comm_allreduce(c, j->a, j->out_a, N, &j->err);
        }
    } else if (j->mode == 2) { /* sizes differ per rank */
        j->r = msm_comm_allreduce(c, j->a, j->out_a, N - (size_t)j->rank, &j->err);
    } else if (j->mode == 3) { /* rank 1 never calls */
        if (j->rank != 1) j->r = msm_comm_allreduce(c, j->a, j->out_a, N, &j->err);
    }
    return NULL;
}

static void run_jobs(int size, int mode, int deadline_ms, job *jobs) {
    msm_comm_group *g;
    cr_assert_eq(msm_comm_group_new(size, deadline_ms, &g), 0);
    pthread_t t[8];
    for (int r = 0; r < size; r++) {
        jobs[r].g = g;
        jobs[r].rank = r;
        jobs[r].mode = mode;
        for (int i = 0; i < N; i++) {
            jobs[r].a[i] = (float)(r + 1) * 1.0f + (float)i;
            jobs[r].b[i] = (float)(r + 1) * 100.0f;
        }
        pthread_create(&t[r], NULL, worker, &jobs[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
    msm_comm_group_free(g);
}

Test(comm_host, allreduce_sums_every_rank, .timeout = 20) {
    for (int size = 1; size <= 8; size *= 2) {
        job jobs[8];
        memset(jobs, 0, sizeof jobs);
        run_jobs(size, 0, 5000, jobs);
        for (int r = 0; r < size; r++) {
            cr_assert_eq(jobs[r].r, 0, "%s", jobs[r].err.msg);
            for (int i = 0; i < N; i++)
                cr_assert_float_eq(jobs[r].out_a[i], (float)(size * (size + 1) / 2) + (float)(size * i), 1e-3);
        }
    }
}

Test(comm_host, calls_pair_by_issue_order_like_nccl, .timeout = 20) {
    job jobs[2];
    memset(jobs, 0, sizeof jobs);
    run_jobs(2, 1, 5000, jobs);
    cr_assert_eq(jobs[0].r, 0);
    cr_assert_eq(jobs[1].r, 0);
    /* rank 0's first call (a) met rank 1's first call (b): a0 + b1 */
    cr_expect_float_eq(jobs[0].out_a[0], jobs[0].a[0] + jobs[1].b[0], 1e-3);
    cr_expect_float_eq(jobs[1].out_b[0], jobs[0].a[0] + jobs[1].b[0], 1e-3);
}

Test(comm_host, mismatched_sizes_fail_every_rank_with_a_message, .timeout = 20) {
    job jobs[2];
    memset(jobs, 0, sizeof jobs);
    run_jobs(2, 2, 5000, jobs);
    for (int r = 0; r < 2; r++) cr_expect_neq(jobs[r].r, 0);
    cr_expect(strstr(jobs[0].err.msg, "mismatch") || strstr(jobs[1].err.msg, "mismatch"));
}

Test(comm_host, a_missing_rank_times_out_instead_of_hanging, .timeout = 20) {
    job jobs[3];
    memset(jobs, 0, sizeof jobs);
    run_jobs(3, 3, 200, jobs);
    cr_expect_eq(jobs[0].r, -ETIMEDOUT);
    cr_expect_eq(jobs[2].r, -ETIMEDOUT);
    cr_expect(strstr(jobs[0].err.msg, "timed out"), "message: %s", jobs[0].err.msg);
}

Test(comm_host, allgather_places_each_rank_in_its_columns, .timeout = 20) {
    msm_comm_group *g;
    cr_assert_eq(msm_comm_group_new(1, 1000, &g), 0);
    float in[6] = {1, 2, 3, 4, 5, 6}, out[6];
    msm_err err;
    cr_assert_eq(msm_comm_allgather(msm_comm_group_rank(g, 0), in, out, 2, 3 * sizeof(float), &err), 0);
    cr_expect_eq(memcmp(in, out, sizeof in), 0);
    msm_comm_group_free(g);
}
