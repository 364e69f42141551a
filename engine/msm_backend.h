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

/* A reader thread's way into a backend's weights while a checkpoint loads (msm_weights.c): a few
 * staging slots of host memory (pinned on CUDA, with a stream of its own), filled by the reader
 * with pread and stored into the weights by chan_put. */
typedef struct msm_wchan msm_wchan;

/* A block of one weight, read into a staging slot: rows x cols elements of the checkpoint's dtype,
 * src_pitch bytes from row to row, stored from element dst_off of weight wi on, dst_pitch elements
 * from row to row (the weight is [n_expert, rows, cols] in the backend's own element type).
 *
 * An F8_E4M3 block (an FP8 block-scaled checkpoint, docs/adr/0006-fp8.md) comes with the block
 * scales of its checkpoint tensor: element (r, c) of the block is
 *   f8(src[r, c]) * scale[((scale_r0 + r) / scale_block) * scale_pitch + (scale_c0 + c) / scale_block]
 * where `scale` points at the scale_inv entry of the block holding the block's first element and
 * scale_r0 / scale_c0 (< scale_block) are that element's row and column within its 128 x 128 block:
 * a TP slice or a chunk may start mid-block, and blocks count from the checkpoint tensor's origin,
 * not the slice's. The scales are host memory owned by the loader, valid until the load returns. */
typedef struct msm_wblock {
    int wi;
    msm_dtype src_dtype;       /* F32, F16, BF16 or F8_E4M3 */
    const void *src;           /* inside the slot chan_slot returned last */
    size_t src_pitch;          /* bytes */
    size_t dst_off, dst_pitch; /* elements */
    size_t rows, cols;
    const float *scale;        /* F8_E4M3 only, else NULL */
    size_t scale_pitch;        /* floats from one block row of scales to the next */
    size_t scale_r0, scale_c0; /* the first element's offset within its block */
    int scale_block;           /* 128 */
} msm_wblock;

/* Where a weight's values come from, known once a checkpoint load is planned. alloc_weights gets
 * one per weight (NULL for dummy weights), so a backend may choose its storage by source. Today
 * both backends store every weight in their own type (float32 / bf16) whatever its source and
 * ignore this; a backend keeping FP8 weights resident (the next step, docs/adr/0006-fp8.md) stores
 * a weight whose dtype is F8_E4M3 and fp8_aligned as its bytes plus one scale per B x B block of its
 * own [n_expert, rows, cols], filled from the blocks' scales as chan_put hands them over. */
typedef struct msm_wsource {
    msm_dtype dtype;           /* the checkpoint dtype of every part; MSM_DTYPE_COUNT when they differ */
    int fp8_block;             /* F8_E4M3: the scale block B (128); else 0 */
    bool fp8_aligned;          /* F8_E4M3: every part starts on a block boundary of its tensor (row0,
                                  col0) and of the weight (dst_row), so each B x B block of the weight
                                  lies inside one block of one checkpoint tensor */
    int fp8_phase;             /* F8_E4M3: col0 % B, the same for every part (a weight's parts all
                                  start at its column 0), or -1 when they differ */
} msm_wsource;

typedef struct msm_backend_vt {
    const char *name;
    void (*free)(msm_backend *b);
    /* Storage for every weight of g, zeroed; called once, before any weight is filled. Weights
     * are in the backend's type (float32 on the CPU, bf16 on CUDA) except keep_f32 ones, which
     * every backend stores, fills (dummy_weight) and loads (chan_put) as float32. (A CPU backend
     * with fp8_as_bf16 stores its FP8 weights' values rounded to bf16, in float32.) src: where each
     * weight comes from ([g->n_weights], see msm_wsource), NULL for dummy weights. */
    int (*alloc_weights)(msm_backend *b, const msm_graph *g, const msm_wsource *src, msm_err *err);
    /* --dummy-weights: fills weight wi uniform in ±scale from (seed, element index), or with
     * ones for norms (msm_rng_uniform, the same numbers on every backend). */
    int (*dummy_weight)(msm_backend *b, int wi, const msm_weight *w, uint64_t seed, float scale,
                        msm_err *err);
    /* Loading a checkpoint, on any thread (several at once, one channel each): chan_open makes
     * n_slots slots of slot_bytes; chan_slot hands out the next one once the backend is done with
     * what it held; chan_put stores a block read into it (the CPU converts it to float32 in
     * place, FP8 dequantised with its block scales, then rounded to bf16 with fp8_as_bf16; CUDA
     * copies it in the checkpoint's dtype and converts f16/f32, and dequantises FP8, to bf16 on
     * the device, asynchronously); chan_close waits for every put and frees the channel (accepts
     * NULL; err may be NULL when an error is already being reported). */
    int (*chan_open)(msm_backend *b, size_t slot_bytes, int n_slots, msm_wchan **ret, msm_err *err);
    int (*chan_slot)(msm_wchan *c, void **ret, msm_err *err);
    int (*chan_put)(msm_wchan *c, const msm_wblock *blk, msm_err *err);
    int (*chan_close)(msm_wchan *c, msm_err *err);
    /* Allocates the arena, the KV cache (n_kv_blocks blocks) and scratch for graph g. */
    int (*prepare)(msm_backend *b, const msm_graph *g, int n_kv_blocks, msm_err *err);
    int (*write)(msm_backend *b, size_t off, const void *src, size_t n, msm_err *err);
    int (*read)(msm_backend *b, size_t off, void *dst, size_t n, msm_err *err);
    int (*begin)(msm_backend *b, msm_err *err); /* a new step starts */
    int (*run)(msm_backend *b, const msm_graph *g, int node, const msm_step_dims *d, msm_err *err);
    int (*record)(msm_backend *b, msm_stream s, int event, msm_err *err);
    int (*wait)(msm_backend *b, msm_stream s, int event, msm_err *err);
    int (*sync)(msm_backend *b, msm_err *err);
    /* Optional (NULL when unsupported): graph capture/replay. */
    int (*capture_begin)(msm_backend *b, msm_err *err);
    int (*capture_end)(msm_backend *b, int key, msm_err *err);
    /* Launches the graph captured for key (-ENOENT: none) without waiting: a read or sync ends
     * the step. */
    int (*replay)(msm_backend *b, int key, msm_err *err);
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
    /* bytes alloc_weights set aside for the weights, and of them the FP8-resident codes and scales
     * (docs/adr/0006-fp8.md); for the load summary */
    uint64_t weight_bytes, weight_bytes_fp8;
    /* test-only: sleep this long before every collective issued on `skew_stream` */
    int skew_us;
    msm_stream skew_stream;
};

/* What a CPU backend stores. Off (the default, and what NULL options mean), everything is float32:
 * the oracle. Each switch makes it store what the CUDA backend stores instead, so CPU results can
 * be compared with CUDA ones on equal terms, the kernels being the only difference. */
typedef struct msm_backend_cpu_opts {
    bool kv_bf16;     /* K/V rounded to bf16 as they are written (the CUDA backend's cache format) */
    bool fp8_as_bf16; /* FP8 weights: the float32 dequantised values rounded to bf16 with
                         msm_f32_to_bf16 (nearest even, NaN kept), as the CUDA loader stores them
                         (held as float32 values); keep_f32 weights stay float32, as on CUDA */
    bool fp8_as_cuda; /* the same rounding for the FP8 weights the CUDA backend does not keep FP8
                         (msm_weights_fp8_resident: routers, gates, unusual TP slices); the ones it
                         keeps stay float32, the value its FP8 kernels multiply by */
} msm_backend_cpu_opts;

int msm_backend_cpu_new(msm_comm *comm, int rank, int deadline_ms, const msm_backend_cpu_opts *o,
                        msm_backend **ret, msm_err *err);
/* Weight wi of a CPU backend, float32 [n_expert, rows, cols] (NULL when absent): for tests. */
const float *msm_backend_cpu_weight(const msm_backend *b, int wi);

static inline void msm_backend_free(msm_backend *b) {
    if (b) b->vt->free(b);
}

/* Executes graph g for one step: issues every node in order on its stream, then syncs. */
int msm_exec_step(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err);
/* Issues the nodes only (no begin, no sync): what a CUDA-graph capture records. */
int msm_exec_issue(msm_backend *b, const msm_graph *g, const msm_step_dims *d, msm_err *err);

#endif
