/* msm_graph: the step graph IR.
 *
 * One decode or prefill step of one TP rank is a graph: an ordered list of nodes (the issue
 * order) over values. A value has a dtype and a 2-D shape [rows, cols] whose rows are symbolic
 * (the step's token count T, its output-row count R, or fixed); the planner gives every value a
 * fixed byte offset in one arena, sized for the largest step, so captured CUDA graphs see stable
 * addresses. A node has an op, inputs, outputs, weights, attributes, a layer, a role (which
 * branch of the layer it belongs to, used by the passes) and a stream (MAIN or AUX).
 * Cross-stream order is explicit: EVENT_RECORD on the producer's stream, EVENT_WAIT on the
 * consumer's, exactly like CUDA events. Passes (msm_pass.h) rewrite graphs; the verifier proves
 * the collective invariant before anything runs. */
#ifndef MSM_GRAPH_H
#define MSM_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "msm_dtype.h"
#include "msm_err.h"
#include "msm_model_config.h"

typedef enum msm_stream { MSM_STREAM_MAIN = 0, MSM_STREAM_AUX = 1, MSM_N_STREAMS } msm_stream;

/* The ops. Attributes: the msm_attr member named after the op (see msm_attr). */
#define MSM_OPS(X)                                                                                 \
    X(EMBED)        /* in: tokens            w: table [V,H]             out: [T,H] */            \
    X(RMSNORM)      /* in: x [rows,C]        w: [C]                     out: same shape */       \
    X(QK_NORM)      /* in: qkv               w: q_norm [hd], k_norm [hd] out: qkv */             \
    X(LINEAR)       /* in: x [rows,K]        w: W [N,K] (+ bias [N])    out: [rows,N] */         \
    X(ROPE)         /* in: qkv, pos          (q and k heads' first rot dims rotated) out: qkv */ \
    X(ATTENTION)    /* in: qkv, seq, pos, slot, block_tables            out: [T, nh*hd]          \
                       writes the layer's KV cache from qkv first, unless attr kv_written */    \
    X(ADD)          /* in: a, b                                         out: a + b */            \
    X(MUL)          /* in: x [rows,C], s [rows,1]                       out: x * s per row */    \
    X(SIGMOID)      /* in: x                                            out: sigmoid(x) */       \
    X(SWIGLU)       /* in: gu [rows, 2I]                                out: [rows, I] */        \
    X(ROUTER_TOPK)  /* in: logits [T,E]                                 out: ids [T,k] i32, w [T,k] */ \
    X(ROUTER_GROUP_TOPK) /* in: logits [T,E]     w: bias [E] f32            out: ids [T,k] i32, w [T,k] \
                       sigmoid scores, group-limited top-k by score + bias (GLM-4.5) */      \
    X(MOE_EXPERTS)  /* in: x, ids, w         w: gate_up [E,2I,H], down [E,H,I] out: [T,H] */      \
    X(GATHER_ROWS)  /* in: x [T,C], rows [R] i32                        out: [R,C] */            \
    X(ALLREDUCE)    /* in: partial [rows,C]                             out: sum over ranks */   \
    X(ALLGATHER)    /* in: [rows,C]                                     out: [rows, C*tp] */      \
    X(SAMPLE)       /* in: logits [R,Vpad], params [R]                  out: tokens [R] i32 */   \
    X(EVENT_RECORD) /* event: records this stream's progress */                                  \
    X(EVENT_WAIT)   /* event: this stream waits for the last record of the event */            \
    X(ADD_RMSNORM)  /* in: a, b [rows,C]     w: [C]     out: a + b, rmsnorm(a + b) (pass-made) */ \
    X(MOE_COMBINE_NORM) /* in: x, routed, shared, h [rows,C]  w: gate [1,C], norm [C]           \
                       out: s = x + (routed + sigmoid(h . gate) * shared), rmsnorm(s) (pass-made) */ \
    X(ROPE_KV_WRITE) /* in: qkv, pos, slot   out: qkv (q and k heads rotated); also writes the    \
                        rotated k heads and the v heads to the layer's KV cache (pass-made) */ \
    X(ALLREDUCE_ADD_RMSNORM) /* in: partial, x [rows,C]  w: [C]  out: s = x + sum over ranks of  \
                        partial, rmsnorm(s) (pass-made; a collective: on MAIN, in V4's sequence) */ \
    X(MOE_COMBINE)  /* in: routed, shared, h [rows,C]  w: gate [1,C]                            \
                       out: routed + sigmoid(h . gate) * shared (pass-made, tp > 1) */          \
    X(ROUTER_LINEAR_TOPK) /* in: x [T,K]   w: router [E,K]   out: ids [T,k] i32, w [T,k]         \
                       the router LINEAR and ROUTER_TOPK in one node (pass-made) */                \
    X(LINEAR_ADD_RMSNORM) /* in: x [rows,K], r [rows,N]  w: W [N,K], bias [N] or -1, norm [N]      \
                       out: s = r + (x . W^T + b), rmsnorm(s): a LINEAR and the ADD_RMSNORM of   \
                       its output in one node (pass-made) */                                   \
    X(PREFETCH)     /* w: up to 3 weights, no values: a hint that pulls the weights, in w order, \
                       into the GPU's L2 ahead of the nodes that read them (pass prefetch_l2, on \
                       the aux stream); changes no value, a backend may ignore it */              \
    X(PREFETCH_KV)  /* in: seq, pos, block_tables (step inputs), no outputs; attr: its layer's     \
                       ATTENTION's: a hint that pulls the layer's K/V cache rows below each      \
                       token's position into L2 (pass prefetch_l2 with prefetch_kv, on the aux   \
                       stream); changes no value, a backend may ignore it */

typedef enum msm_op {
#define MSM_OP_ENUM(n) MSM_OP_##n,
    MSM_OPS(MSM_OP_ENUM)
#undef MSM_OP_ENUM
    MSM_OP_COUNT
} msm_op;

/* Which part of a layer a node belongs to; the MoE passes find branches by role. */
typedef enum msm_role {
    MSM_ROLE_NONE = 0,
    MSM_ROLE_ATTN,        /* attention block */
    MSM_ROLE_MLP,         /* dense MLP block */
    MSM_ROLE_ROUTED,      /* router + routed experts (+ their all-reduce) */
    MSM_ROLE_SHARED,      /* the shared-expert branch (+ its gate, its all-reduce) */
    MSM_ROLE_MOE_COMBINE, /* routed + shared */
    MSM_ROLE_HEAD,        /* final norm, lm_head, sampling */
} msm_role;

/* Symbolic row counts of values. */
typedef enum msm_rows {
    MSM_ROWS_T = 0,  /* tokens in the step */
    MSM_ROWS_R,      /* output rows (logits) in the step */
    MSM_ROWS_S,      /* sequences in the step */
    MSM_ROWS_FIXED,  /* `fixed_rows` */
} msm_rows;

typedef struct msm_value {
    char name[40];
    msm_dtype dtype;
    msm_rows rows;
    int fixed_rows;   /* rows when rows == MSM_ROWS_FIXED */
    int cols;         /* elements per row (bytes per row for opaque structs: dtype I32 x cols) */
    bool io;          /* a step input/output: pinned for the whole step, never reused */
    size_t offset;    /* byte offset in the rank's arena (planner) */
} msm_value;

/* Named op attributes: a node keeps them in n->attr.<member>, the member named after its op (ops
 * with the same layout share one: see msm_attr); ops without attributes leave attr zero. Every
 * field is 4 bytes (an int or a float), so no struct has padding; nodes start zeroed and the bytes
 * a member does not use stay zero, which lets msm_graph_equal compare attributes as bytes. Heads
 * (nh, kvh) and sizes (N, I) are this rank's shares; hd is head_dim. */
typedef struct msm_attr_embed { int H; } msm_attr_embed;
typedef struct msm_attr_rmsnorm { int dim; float eps; } msm_attr_rmsnorm;
typedef struct msm_attr_qk_norm { int nh, kvh, hd; float eps; } msm_attr_qk_norm;
typedef struct msm_attr_linear { int N, K; } msm_attr_linear;   /* outputs, inputs */
typedef struct msm_attr_rope {
    int nh, kvh, hd;
    float theta;
    int rot; /* rotated dims at the start of each head (rotate-half within them): hd, or fewer
                with partial_rotary_factor (GLM-4.5); the others pass through */
} msm_attr_rope;
typedef struct msm_attr_attention {
    int nh, kvh, hd;
    int kv_written; /* 1: the ROPE_KV_WRITE producing its qkv input wrote this layer's K/V (pass
                       fuse_rope_kv_write); 0: it writes K/V from its qkv input itself */
    float scale;    /* softmax scale, 1/sqrt(hd) */
} msm_attr_attention;
typedef struct msm_attr_swiglu { int I; } msm_attr_swiglu;      /* gu has 2I columns */
typedef struct msm_attr_router_topk { int E, k, norm; } msm_attr_router_topk; /* norm: renormalise */
typedef struct msm_attr_router_group {
    int E, k;
    int n_group, topk_group; /* experts in n_group groups of E / n_group; top-k within the
                                topk_group groups of the highest top-2 sums of score + bias */
    int norm;                /* renormalise the k weights to sum 1 (+ 1e-20) */
    float scale;             /* routed_scaling_factor, applied after the renormalisation */
} msm_attr_router_group;
typedef struct msm_attr_moe_experts { int H, I, k, E; } msm_attr_moe_experts;
typedef struct msm_attr_linear_norm { int N, K; float eps; } msm_attr_linear_norm; /* norm dim N */
typedef struct msm_attr_sample { int V, V_pad; } msm_attr_sample; /* vocabulary, logits row length */

typedef union msm_attr {
    msm_attr_embed embed;
    msm_attr_rmsnorm rmsnorm;         /* RMSNORM, ADD_RMSNORM, MOE_COMBINE_NORM, ALLREDUCE_ADD_RMSNORM */
    msm_attr_qk_norm qk_norm;
    msm_attr_linear linear;
    msm_attr_rope rope;               /* ROPE, ROPE_KV_WRITE */
    msm_attr_attention attention;     /* ATTENTION, PREFETCH_KV */
    msm_attr_swiglu swiglu;
    msm_attr_router_topk router_topk; /* ROUTER_TOPK, ROUTER_LINEAR_TOPK */
    msm_attr_router_group router_group; /* ROUTER_GROUP_TOPK */
    msm_attr_moe_experts moe_experts;
    msm_attr_linear_norm linear_norm; /* LINEAR_ADD_RMSNORM */
    msm_attr_sample sample;
} msm_attr;

#define MSM_NODE_MAX_IN 6
#define MSM_NODE_MAX_W 3

typedef struct msm_node {
    msm_op op;
    msm_stream stream;
    msm_role role;
    int layer;                 /* -1 outside the layers */
    int n_in, n_out;
    int in[MSM_NODE_MAX_IN];   /* value ids */
    int out[2];
    int w[MSM_NODE_MAX_W];     /* weight ids, -1 when unused */
    int event;                 /* EVENT_RECORD / EVENT_WAIT */
    msm_attr attr;             /* the op's attributes, by name */
} msm_node;

/* One part of a weight: a block copied from a checkpoint tensor (rows x cols sub-matrix) into
 * the weight at expert index `expert`, starting at row dst_row. */
typedef struct msm_wpart {
    char src[128];             /* checkpoint tensor name */
    int64_t src_rows, src_cols;/* the checkpoint tensor's full shape (cols 1 for vectors) */
    int src_ndim;
    int expert, dst_row;
    int64_t row0, n_rows, col0, n_cols;
} msm_wpart;

/* A weight of this rank: [n_expert, rows, cols] (n_expert 1 for plain matrices/vectors). */
typedef struct msm_weight {
    char name[96];
    int n_expert, rows, cols;
    bool is_norm;              /* RMSNorm weight (dummy init: ones) */
    bool keep_f32;             /* backends keep it float32 (GLM's e_score_correction_bias: a bf16
                                  copy would move expert selection), not bf16 */
    msm_wpart *parts;
    int n_parts;
} msm_weight;

typedef struct msm_graph {
    int rank, tp;
    msm_value *vals;
    int n_vals, cap_vals;
    msm_node *nodes;
    int n_nodes, cap_nodes;
    msm_weight *weights;       /* shared (not copied) by graphs derived through passes */
    int n_weights, cap_weights;
    int fp8_block;             /* the checkpoint's FP8 scale block (msm_model_config.fp8_block):
                                  F8_E4M3 parts are loaded with their block scales; 0: the config
                                  declares no FP8 quantization and an F8_E4M3 tensor is refused */
    bool owns_weights;
    int n_events;
    /* step inputs and outputs (value ids) */
    int v_tokens, v_pos, v_seq, v_slot, v_btab, v_out_rows, v_sparams, v_logits, v_sampled;
    /* sizes the planner uses */
    int max_T, max_R, max_S, max_blocks;
    int vocab, vocab_pad;      /* logits: [R, vocab_pad]; the first `vocab` columns are real */
    size_t arena_bytes;
    int n_layers;
} msm_graph;

const char *msm_op_name(msm_op op);
const char *msm_stream_name(msm_stream s);
bool msm_op_is_collective(msm_op op);
/* PREFETCH or PREFETCH_KV: an L2 hint that changes no value (pass prefetch_l2). */
bool msm_op_is_prefetch(msm_op op);
/* How many node inputs read value v (a node reading it twice counts twice). */
int msm_graph_readers(const msm_graph *g, int v);
/* The node writing value v among nodes [0, end), or -1. */
int msm_graph_producer(const msm_graph *g, int v, int end);
/* Removes the nodes i with drop[i] (drop: n_nodes entries), keeping the others in order. */
void msm_graph_drop_nodes(msm_graph *g, const bool *drop);
/* For a MOE_EXPERTS node i: the index of the next node past event nodes (either stream) and L2 hints
 * (PREFETCH, PREFETCH_KV) when that node is on i's stream and reads the experts' sum as a norm does
 * (an ADD_RMSNORM, as either input; a MOE_COMBINE_NORM, as its routed sum), else -1. A backend may
 * leave the experts' combine to it (msm_graph_plan keeps the experts' values live through it). */
int msm_graph_moe_sum_reader(const msm_graph *g, int i);
/* Its inverse: for node j, the MOE_EXPERTS node i whose msm_graph_moe_sum_reader is j (walking back
 * over the same event nodes and L2 hints), else -1. A backend that leaves an experts' combine to its
 * reader finds it here, so the two sides cannot disagree. */
int msm_graph_moe_sum_source(const msm_graph *g, int j);

msm_graph *msm_graph_new(int rank, int tp);
void msm_graph_free(msm_graph *g);
/* Deep copy of nodes and values; the weight table is shared (owned by the original). */
msm_graph *msm_graph_clone(const msm_graph *g);

int msm_graph_value(msm_graph *g, const char *name, msm_dtype dt, msm_rows rows, int cols);
int msm_graph_add(msm_graph *g, const msm_node *n);          /* returns the node index or -ENOMEM */
int msm_graph_insert(msm_graph *g, int at, const msm_node *n);
/* Structural equality (ops, streams, values, events, attributes) for idempotence tests. */
bool msm_graph_equal(const msm_graph *a, const msm_graph *b);

/* Value extent: rows for a step of T tokens, R output rows, S sequences. */
size_t msm_value_rows(const msm_value *v, int T, int R, int S);
size_t msm_value_bytes_max(const msm_graph *g, const msm_value *v);

/* Liveness-based arena planning; values read or written on the AUX stream stay live until the
 * join that ends their aux region, so no two streams ever share bytes concurrently. */
int msm_graph_plan(msm_graph *g, msm_err *err);

/* Prints one node a line: "L<layer> <stream> <OP> <inputs> -> <outputs> [<attributes>]". */
void msm_graph_dump(const msm_graph *g, FILE *out);

/* Builds the plain TP graph of rank `rank` of `tp` (every row-parallel linear followed by its
 * own ALLREDUCE). Refuses a tp that does not divide heads or intermediate sizes. */
typedef struct msm_build_opts {
    int max_T, max_S, max_blocks;
} msm_build_opts;
int msm_graph_build(const msm_model_config *c, int rank, int tp, const msm_build_opts *o,
                    msm_graph **ret, msm_err *err);

/* Hash of the collective sequence (op, dtype, cols, rows) in issue order (the verifier keeps every
 * collective on the main stream). */
uint64_t msm_graph_collective_hash(const msm_graph *g);

#endif
