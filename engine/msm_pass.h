/* msm_pass: graph → graph rewrites and the verifier.
 *
 * Each pass is a pure function: it returns a new graph and leaves its input untouched, and it is
 * idempotent (applying it to its own output changes nothing). msm_passes_apply runs the enabled
 * passes in a fixed order, plans the arena, then verifies; a graph that fails verification is
 * never run or captured. */
#ifndef MSM_PASS_H
#define MSM_PASS_H

#include <stdbool.h>

#include "msm_graph.h"

/* Receives warnings of the passes (e.g. a skipped layer). */
typedef void (*msm_warn_fn)(void *ud, const char *msg);

typedef struct msm_pass_opts {
    bool fuse_allreduce;   /* fuse_moe_allreduce */
    bool multi_stream;     /* multi_stream_moe */
    bool elide_collectives;/* elide_tp1_collectives (no-op at tp > 1) */
    bool fuse_add_norm;    /* fuse_add_rmsnorm */
    bool fuse_moe_combine; /* fuse_moe_combine */
    bool fuse_rope_kv;     /* fuse_rope_kv_write */
    bool fuse_allreduce_norm; /* fuse_allreduce_add_rmsnorm */
    bool fuse_router;      /* fuse_router_topk */
    bool fuse_linear_norm; /* fuse_linear_add_rmsnorm */
    bool router_first;     /* multi_stream_moe: the router issued before the aux branch */
    bool router_alone;     /* multi_stream_moe: the aux branch forked after the router (waits for it) */
    bool fork_before_norm; /* fork_before_norm (with multi_stream) */
    bool prefetch_l2;      /* prefetch_l2 (with multi_stream only) */
    bool prefetch_l2_next; /* prefetch_l2: also the next layer's qkv at the router (no shared expert) */
    bool prefetch_kv;      /* prefetch_l2: each layer's K/V cache rows as the layer starts (PREFETCH_KV;
                              layers with nothing else on AUX) */
    msm_warn_fn warn;
    void *warn_ud;
    /* Test-only: reproduce the original bug (whole shared branch, all-reduce included, on aux)
     * and skip the verifier so it runs. */
    bool test_buggy_placement;
    bool test_skip_verify;
} msm_pass_opts;

/* The pair passes' skeleton: a clone of `in` in which every node i (in issue order, i + 1 <
 * in->n_nodes) for which fuse(in, i, &f) returns true is replaced by f, and node i + 1 dropped;
 * matching then resumes after the pair. fuse sees the input graph, never a half-rewritten one. */
typedef bool (*msm_pair_fn)(const msm_graph *g, int i, msm_node *ret);
int msm_pass_fuse_pairs(const msm_graph *in, msm_pair_fn fuse, const char *name, msm_graph **ret, msm_err *err);

/* ALLREDUCE(routed) + ALLREDUCE(shared) → ALLREDUCE(routed + gate * shared) per MoE layer
 * (ALLREDUCE(routed + shared) for an ungated shared expert, GLM-4.5's). */
int msm_pass_fuse_moe_allreduce(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                msm_err *err);

/* Moves each MoE layer's shared-expert branch to the AUX stream, issued before the routed work,
 * with fork/join events. A trailing collective stays on MAIN after the join; a collective in the
 * middle of the branch makes the pass skip the layer (with a warning naming it). */
int msm_pass_multi_stream_moe(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err);

/* At tp == 1: drops every ALLREDUCE / ALLGATHER (the identity) by letting the producer of its
 * input write its output. Unchanged graph at tp > 1. Runs after the role-based MoE passes. */
int msm_pass_elide_tp1_collectives(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                   msm_err *err);

/* ADD (residual) immediately followed, on the same stream, by the RMSNORM of its sum → one
 * ADD_RMSNORM node writing both the sum and the normed value. */
int msm_pass_fuse_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err);

/* Shared-expert gate (LINEAR N=1, SIGMOID, MUL) + combine ADD + the following ADD_RMSNORM → one
 * MOE_COMBINE_NORM node per MoE layer with a gated shared expert (where no collective sits
 * between the combine and the residual add: tp 1 after elide_tp1_collectives); at tp > 1, where
 * the combine feeds the ALLREDUCE, gate + SIGMOID + MUL + ADD → one MOE_COMBINE. Ungated shared
 * experts (GLM-4.5) have no MUL and are left alone. */
int msm_pass_fuse_moe_combine(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err);

/* ALLREDUCE(p) -> a immediately followed on MAIN by the ADD_RMSNORM(x, a) that is a's only
 * reader → one ALLREDUCE_ADD_RMSNORM(p, x) writing the ADD_RMSNORM's two values: the residual
 * add and the next norm ride in the collective (the CUDA backend's one-shot all-reduce does them
 * in its kernel). Only where p has no other reader (a backend may reduce it in place). At tp 1
 * after elide_tp1_collectives nothing is left to fuse. Idempotent. */
int msm_pass_fuse_allreduce_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                        msm_err *err);

/* The router LINEAR (N = E <= 256, no bias) and the ROUTER_TOPK right after it, its only reader
 * → one ROUTER_LINEAR_TOPK. Idempotent. */
int msm_pass_fuse_router_topk(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err);

/* A LINEAR and the ADD_RMSNORM of its output (the next node, its only reader) → one
 * LINEAR_ADD_RMSNORM, bitwise the pair. After elide_tp1_collectives and fuse_moe_combine. */
int msm_pass_fuse_linear_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err);

/* Per shared-expert fork: the fork's RECORD moved before the residual ADD_RMSNORM right before
 * it, and the AUX branch given its own copy of that norm (same inputs, fresh outputs) to read,
 * so the branch no longer waits for the main stream's norm. The same bits. After
 * elide_tp1_collectives, before fuse_linear_add_rmsnorm. Idempotent. */
int msm_pass_fork_before_norm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err);

/* ROPE + the ATTENTION reading its output → ROPE_KV_WRITE (rotates and writes the layer's K/V
 * cache) + an ATTENTION with kv_written (skips its own K/V write), per layer: the same cache, the
 * same bits, one CUDA launch less. */
int msm_pass_fuse_rope_kv_write(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                msm_err *err);

/* V1 every collective on MAIN; V2 every cross-stream read covered by a RECORD after the producer
 * and a WAIT before the reader; V3 every aux node joined into MAIN before the end; KV every
 * ATTENTION with kv_written reads a ROPE_KV_WRITE of its layer, and every ROPE_KV_WRITE feeds
 * such an ATTENTION (so each layer's cache is written once, before it is read); plus SSA and
 * event sanity. The message names the first offending node. */
int msm_graph_verify(const msm_graph *g, msm_err *err);

/* Clone → enabled passes → plan → verify. */
int msm_passes_apply(const msm_graph *plain, const msm_pass_opts *o, msm_graph **ret,
                     msm_err *err);

/* Per layer, a PREFETCH on AUX of the big non-routed weights read after its ATTENTION (o_proj, the
 * shared expert's, a dense MLP's), forked from MAIN right before that ATTENTION; with
 * prefetch_l2_next, in a layer with nothing else on AUX, another of the next layer's weights read
 * before its ATTENTION, forked right before the router; with prefetch_kv, in a layer with nothing
 * else on AUX, a PREFETCH_KV of the layer's K/V cache rows forked before the norm its qkv
 * projection reads; one join at the end of the graph. Changes no value; idempotent. */
int msm_pass_prefetch_l2(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err);

#endif
