/* msm_engine: a loaded model on one TP group, executing steps.
 *
 * An engine owns one rank thread per TP rank (one per GPU on CUDA; threads on the CPU with host
 * collectives), the weights of every rank, the KV cache storage and the block pool, and the
 * verified step graphs. A caller (the daemon's scheduler, msmoe-run, a test) owns sequences: it
 * allocates KV blocks from the engine's pool, and each step passes, per sequence, the tokens to
 * feed, their start position and the block table. msm_engine_step is called from one thread at a
 * time; it returns when every rank has finished the step. */
#ifndef MSM_ENGINE_H
#define MSM_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "msm_err.h"
#include "msm_kv.h"
#include "msm_model_config.h"
#include "msm_types.h"

typedef enum msm_backend_kind {
    MSM_BACKEND_CPU = 0,
    MSM_BACKEND_CUDA,
} msm_backend_kind;

/* Where a checkpoint load stands (msm_engine_opts.load_progress). */
typedef struct msm_load_progress {
    uint64_t done_bytes;   /* checkpoint bytes read so far, every rank together */
    uint64_t total_bytes;  /* bytes to read: every rank's, once each has planned (at once at TP 1) */
    double fraction;       /* 0..1, the mean of the ranks' fractions; exactly 1 once, at the end */
    double seconds;        /* since the first rank started reading */
} msm_load_progress;

/* Called from a loading thread, never two calls at once, at most every 0.1 s while the fraction
 * moves on (the first call and the final one at fraction 1 always come); must be quick. */
typedef void (*msm_load_progress_fn)(void *ctx, const msm_load_progress *p);

/* "[#########-----------]  45%  12.3 of 27.0 GB  5.1 GB/s" (no bar when bar_width is 0; two
 * decimals under 10 GB) into
 * buf; returns what snprintf returns. */
int msm_load_progress_format(char *buf, size_t cap, const msm_load_progress *p, int bar_width);

typedef struct msm_engine_opts {
    const char *model_dir;     /* HF checkpoint directory */
    const char *dummy_preset;  /* instead of model_dir: a config.json-style preset, random weights */
    uint64_t dummy_seed;       /* seed of the dummy weights */
    msm_backend_kind backend;
    int tp;                    /* tensor-parallel size: ranks in the group (default 1) */
    int first_device;          /* CUDA: the group's GPUs are first_device .. first_device+tp-1 */
    bool multi_stream;         /* pass multi_stream_moe (default on) */
    int multi_stream_max_tokens; /* steps of more tokens run a one-stream graph (0: no limit;
                                    default MSM_MULTI_STREAM_MAX_TOKENS) */
    bool fuse_allreduce;       /* pass fuse_moe_allreduce (default on) */
    bool elide_collectives;    /* pass elide_tp1_collectives (default on; no-op at tp > 1) */
    bool fuse_add_norm;        /* pass fuse_add_rmsnorm (default on) */
    bool fuse_moe_combine;     /* pass fuse_moe_combine (default on) */
    bool fuse_rope_kv;         /* pass fuse_rope_kv_write (default on) */
    bool fuse_allreduce_norm;  /* pass fuse_allreduce_add_rmsnorm (default on) */
    bool fuse_router;          /* pass fuse_router_topk (default on) */
    bool fuse_linear_norm;     /* pass fuse_linear_add_rmsnorm (default off: measured no faster on the H200) */
    bool router_first;         /* multi_stream_moe issues each layer's router before its shared
                                  expert's branch (see engine/passes/multi_stream.c; default on) */
    bool router_alone;         /* ... and forks the shared expert's branch only after the router
                                  (default off) */
    bool fork_before_norm;     /* pass fork_before_norm, with multi_stream: the shared expert's branch
                                  forked before the norm it reads, computing that norm itself
                                  (engine/passes/fork_norm.c; default off: measured slower, Qwen1.5-MoE
                                  1 / 2 tokens +0.05 / +0.11 ms alone, H200 2026-12-05 s18 run 2) */
    bool prefetch_l2;          /* pass prefetch_l2, with multi_stream: each layer's o_proj and shared
                                  expert pulled into L2 during its attention (default off: measured
                                  slower, bench/results/2026-12-07-h200-s35 run 2) */
    bool prefetch_l2_next;     /* ... and, in layers without a shared expert, the next layer's qkv
                                  during the router (implies prefetch_l2; default off) */
    bool prefetch_kv;          /* pass prefetch_l2's PREFETCH_KV, with multi_stream: in each layer with
                                  nothing else on the aux stream (no shared expert), its K/V cache rows
                                  pulled into L2 from the norm before its qkv projection (default on;
                                  the CUDA backend acts at decode steps of up to 2 tokens) */
    int kv_blocks;             /* KV blocks of MSM_KV_BLOCK tokens (default 1024) */
    int max_step_tokens;       /* tokens one step may carry (prefill chunk + decode rows; 512) */
    int max_seqs;              /* sequences one step may carry (default 64) */
    int max_context;           /* tokens per sequence (default: model max_position, <= 32768) */
    int deadline_ms;           /* every collective/event wait gives up after this (default 30000) */
    bool cuda_graphs;          /* capture decode steps per bucket (CUDA; default on) */
    bool kv_bf16;              /* CPU: KV cache rounded to bf16 like the CUDA one (default off) */
    bool fp8_as_bf16;          /* CPU: FP8 weights rounded to bf16 once dequantised, as the CUDA
                                  backend holds them; keep_f32 ones stay float32 (default off) */
    bool fp8_as_cuda;          /* CPU: only the FP8 weights the CUDA backend does not keep FP8 are
                                  rounded so (msm_backend_cpu_opts.fp8_as_cuda; default off) */
    int buckets[MSM_MAX_BUCKETS]; /* decode batch buckets, ascending; n_buckets 0 = defaults */
    int n_buckets;
    int load_threads;          /* checkpoint reader threads per rank (0: online CPUs / tp, 1..8) */
    size_t load_slot_bytes;    /* largest single read into staging (0: 8 MiB on CUDA, 1 MiB on CPU) */
    msm_load_progress_fn load_progress; /* NULL: no progress reports */
    void *load_progress_ctx;
    /* Test-only: skip the verifier and misplace the shared all-reduce on the aux stream as the
     * original buggy engine did, and delay the given rank's streams. Never set in production. */
    bool test_buggy_placement;
    bool test_skip_verify;
    int test_skew_rank;        /* rank whose main stream sleeps before each collective */
    int test_skew_us;
    /* Test-only: this rank (>= 0; default -1) builds its graph with fuse_allreduce flipped, so it
     * issues a different collective sequence; start-up must refuse it (verifier rule V4). */
    int test_diverge_rank;
    /* Test-only fault injection: from step test_fault_step on (1 = the first step after start-up),
     * rank 0's backend fails the step (MSM_TEST_FAULT_LAUNCH: a kernel launch that fails; on the
     * CPU an injected error) or makes it overrun engine deadline_ms (MSM_TEST_FAULT_HANG: a kernel
     * that spins past the deadline; on the CPU the aux stream sleeps past it). */
    int test_fault;
    int test_fault_step;
} msm_engine_opts;

/* Values of msm_engine_opts.test_fault. */
enum { MSM_TEST_FAULT_NONE = 0, MSM_TEST_FAULT_LAUNCH, MSM_TEST_FAULT_HANG };

void msm_engine_opts_default(msm_engine_opts *o);

typedef struct msm_engine msm_engine;

/* Loads config and weights, builds and verifies the graphs of every rank, checks the collective
 * sequence hash across ranks, and starts the rank threads. Errors name the file/tensor/limit. */
int msm_engine_new(const msm_engine_opts *o, msm_engine **ret, msm_err *err);

/* What msm_engine_new checks before it reads a weight byte, without loading anything (no device
 * is touched, no weight is read): the model's config.json (or the preset), the options against
 * it (max_context within the model's max_position_embeddings, tp dividing the heads and experts),
 * every safetensors header, each rank's graph built, passed and verified (V1-V3; V4 compares the
 * ranks' collective sequences at load, through their communicator), and every weight of every
 * rank present in the checkpoint with the expected shape, FP8 block scales included
 * (msm_weights_check, what the load itself checks first). *ret_cfg: the model's config;
 * *ret_max_context: the context msm_engine_new would serve. For `msmoed --check-config`, and
 * before a load. */
int msm_engine_validate(const msm_engine_opts *o, msm_model_config *ret_cfg, int *ret_max_context, msm_err *err);
/* Accepts NULL and half-built engines. Stops the rank threads. */
void msm_engine_free(msm_engine *e);

/* How the weights came in, for logs and benchmarks. */
typedef struct msm_load_summary {
    uint64_t bytes_read;     /* checkpoint bytes, every rank together (0 with dummy weights) */
    double load_s;           /* weight load of the slowest rank (plan, allocate, read, store) */
    double start_s;          /* msm_engine_new, from call to return (graphs captured) */
    int threads;             /* reader threads per rank */
    size_t staging_bytes;    /* host staging the readers held at most, every rank together */
    uint64_t peak_rss_bytes; /* the process's peak resident memory when msm_engine_new returned */
    uint64_t weight_bytes;   /* the backends' weight storage, every rank together ... */
    uint64_t weight_bytes_fp8; /* ... of which FP8-resident codes and scales (docs/adr/0006-fp8.md) */
} msm_load_summary;

const msm_load_summary *msm_engine_load_summary(const msm_engine *e);
const msm_model_config *msm_engine_model(const msm_engine *e);
const msm_engine_opts *msm_engine_options(const msm_engine *e);
const char *msm_engine_backend_name(const msm_engine *e);
/* The block pool shared by the ranks (each rank stores its own heads of every block). */
msm_kv_pool *msm_engine_kv(msm_engine *e);

/* What a step returns for one sequence. */
typedef enum msm_step_output {
    MSM_STEP_OUTPUT_NONE = 0,       /* nothing (a prompt chunk before the last): token -1 */
    MSM_STEP_OUTPUT_SAMPLE = 1,     /* a token sampled after the last fed token (+ its logits
                                       with want_logits) */
    MSM_STEP_OUTPUT_ALL_LOGITS = 2, /* as SAMPLE, and the logits of every fed token
                                       (dump/scoring) */
} msm_step_output;

/* One sequence's share of a step. */
typedef struct msm_step_seq {
    const int32_t *tokens;  /* [n_tokens] to feed: a prompt chunk, or the last sampled token */
    int n_tokens;
    int pos0;               /* position of tokens[0] (= tokens of this sequence already cached) */
    const int32_t *blocks;  /* block table: >= ceil((pos0 + n_tokens) / MSM_KV_BLOCK) ids */
    int n_blocks;
    msm_step_output output; /* what to return for this sequence */
    bool want_logits;       /* SAMPLE: return the sampled row's logits (for logprobs) */
    msm_sample_params sampling; /* counter = index of the generated token, for reproducibility */
} msm_step_seq;

typedef struct msm_step_out {
    int32_t *tokens;        /* [n_seqs], owned by the engine: sampled token, -1 for OUTPUT_NONE */
    const float *logits;    /* [n_rows, vocab] rows in seq order: every token of ALL_LOGITS seqs,
                               the last token of SAMPLE seqs with want_logits; else NULL */
    int n_rows;
} msm_step_out;

/* Runs one step over n_seqs sequences. Validates every id, position and block id against the
 * model and the pool first (-EINVAL with a message), then executes. The output arrays stay valid
 * until the next step. A sequence whose logits row was not finite gets MSM_SAMPLE_NONFINITE as
 * its token. When the execution itself fails (a kernel or NCCL error, a step past deadline_ms)
 * the engine cannot be trusted again: the step and every later one return -ENOTRECOVERABLE. */
int msm_engine_step(msm_engine *e, const msm_step_seq *seqs, int n_seqs, msm_step_out *ret,
                    msm_err *err);

/* GPUs the CUDA runtime sees (0 when none or the driver fails); -ENOTSUP in a build without the
 * CUDA backend. For planning TP groups before any engine exists. */
int msm_engine_device_count(void);

/* GPU `device`'s name (into name, name_len bytes) and its measured device-to-device copy rate in
 * GB/s, bytes read plus bytes written (the ceiling a memory-bound step is held against); needs
 * 2 GiB free on it. -ENOTSUP in a build without the CUDA backend. */
int msm_engine_device_copy_gbps(int device, char *name, size_t name_len, double *ret, msm_err *err);

/* Prints the schedule of rank `rank`'s step graph: one node a line (layer, stream, op, in -> out). */
int msm_engine_dump_graph(msm_engine *e, int rank, FILE *out);

#endif
