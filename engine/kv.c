/* msm_kv: the KV block pool (see msm_kv.h): a free stack plus an in-use bitmap. */
#include "msm_kv.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

struct msm_kv_pool {
    int n;            /* blocks including the reserved block 0 */
    int n_free;
    int32_t *free_ids;
    bool *used;
};

int msm_kv_pool_new(int n_blocks, msm_kv_pool **ret) {
    if (n_blocks < 2) return -EINVAL;
    msm_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->free_ids = malloc(sizeof(int32_t) * (size_t)n_blocks);
    p->used = calloc((size_t)n_blocks, sizeof(bool));
    if (!p->free_ids || !p->used) {
        msm_kv_pool_free(p);
        return -ENOMEM;
    }
    p->n = n_blocks;
    p->used[0] = true; /* reserved for padding rows */
    for (int i = n_blocks - 1; i >= 1; i--) p->free_ids[p->n_free++] = i;
    *ret = p;
    return 0;
}

void msm_kv_pool_free(msm_kv_pool *p) {
    if (!p) return;
    free(p->free_ids);
    free(p->used);
    free(p);
}

int msm_kv_pool_total(const msm_kv_pool *p) { return p->n - 1; }
int msm_kv_pool_n_free(const msm_kv_pool *p) { return p->n_free; }

int msm_kv_pool_alloc(msm_kv_pool *p, int n, int32_t *ret_ids) {
    if (n < 0) return -EINVAL;
    if (n > p->n_free) return -ENOSPC;
    for (int i = 0; i < n; i++) {
        int32_t id = p->free_ids[--p->n_free];
        p->used[id] = true;
        ret_ids[i] = id;
    }
    return 0;
}

void msm_kv_pool_release(msm_kv_pool *p, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id <= 0 || id >= p->n || !p->used[id]) continue;
        p->used[id] = false;
        p->free_ids[p->n_free++] = id;
    }
}
