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
    msm_warn_fn warn;
    void *warn_ud;
    /* Test-only: reproduce the original bug (whole shared branch, all-reduce included, on aux)
     * and skip the verifier so it runs. */
    bool test_buggy_placement;
    bool test_skip_verify;
} msm_pass_opts;

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
 * MOE_COMBINE_NORM node per MoE layer with a gated shared expert (only where no collective sits
 * between the combine and the residual add: tp 1 after elide_tp1_collectives). Ungated shared
 * experts (GLM-4.5) have no MUL and are left alone. */
int msm_pass_fuse_moe_combine(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err);

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

#endif
