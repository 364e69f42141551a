/* msm_kv: the paged KV cache's block pool (host-side bookkeeping).
 *
 * Blocks hold MSM_KV_BLOCK tokens. The pool only hands out block ids; each rank's backend owns
 * the storage ([n_blocks, MSM_KV_BLOCK, kv_heads_of_rank, head_dim] per layer for K and for V).
 * Block 0 is reserved (padding rows of captured decode graphs write there), so n usable = n - 1.
 * Not thread-safe: the scheduler thread owns it. */
#ifndef MSM_KV_H
#define MSM_KV_H

#include <stdint.h>

typedef struct msm_kv_pool msm_kv_pool;

int msm_kv_pool_new(int n_blocks, msm_kv_pool **ret);
void msm_kv_pool_free(msm_kv_pool *p);
int msm_kv_pool_total(const msm_kv_pool *p);     /* usable blocks (excludes the reserved one) */
int msm_kv_pool_n_free(const msm_kv_pool *p);
/* Takes n blocks into ret_ids; -ENOSPC (nothing taken) when fewer are free. */
int msm_kv_pool_alloc(msm_kv_pool *p, int n, int32_t *ret_ids);
/* Returns blocks; ids out of range or already free are ignored and counted (double free bug). */
void msm_kv_pool_release(msm_kv_pool *p, const int32_t *ids, int n);
/* Blocks needed for n tokens. */
static inline int msm_kv_blocks_for(int n_tokens) { return (n_tokens + 15) / 16; }

#endif
