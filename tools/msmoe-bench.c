/* msmoe-bench: engine step benchmarks. It is a benchmark, never a test.
 *
 * decode: for each batch size, B sequences at context C (their KV blocks allocated; the cache
 * content does not change the work) take `steps` decode steps; the median wall time of
 * msm_engine_step (inputs up, replay or eager run, sampled tokens down) is reported with the bytes
 * the step must read (weights of the experts it selects — expected under uniform routing — plus
 * dense weights, lm_head and the KV cache) over that time.
 * prefill: for each length L, one sequence's prompt of L tokens from position 0 in one step
 * (output: the last token sampled), median of `steps`; reported as ms and prompt tokens/s.
 *
 *   msmoe-bench decode  --preset config/models/qwen1.5-moe-a2.7b.json [--backend cuda]
 *                       [--batches 1,8,32,128,256] [--context 512] [--steps 30]
 *   msmoe-bench prefill --preset ... [--lengths 128,512,1024,2048] [--steps 10]
 *   common: [--no-cuda-graphs] [--no-multi-stream] [--multi-stream-max-tokens N]
 *           [--no-fuse-allreduce] [--no-fuse-allreduce-norm] [--fuse-linear-norm] [--tp N]
 *           [--prefetch-l2] [--prefetch-l2-next] [--prefetch-kv | --no-prefetch-kv]
 *           [--router-first | --no-router-first] [--router-alone] [--fork-before-norm]
 *           [--buckets 1,2,4,...] (the decode graphs captured; default: the engine's)
 * Prints one table row per batch or length.
 *
 *   msmoe-bench load --model DIR [...]: checkpoint load time next to a plain read of the same
 *   files (msmoe-bench-load.c). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_engine.h"
#include "msmoe_bench.h"

double msm_bench_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Bytes one decode step of B sequences at context C must read (bf16 weights and KV). */
static double step_bytes(const msm_model_config *c, int B, int C, bool fp8) {
    /* bytes an element: the projections of an FP8-resident preset are one-byte codes plus a
     * float32 scale per row and 128 columns; everything else is bf16 */
    double H = c->hidden, hd = c->head_dim, w = 0, p = fp8 ? 1.0 + 4.0 / 128.0 : 2.0;
    double attn = H * hd * (c->n_heads + 2 * c->n_kv_heads) + hd * c->n_heads * H;
    double expert = 3.0 * H * c->moe_intermediate;
    double uniq = c->n_experts * (1.0 - pow(1.0 - (double)c->top_k / c->n_experts, B));
    for (int l = 0; l < c->n_layers; l++) {
        w += p * attn + 2 * 2 * H;
        if (c->sparse[l]) {
            w += p * uniq * expert + 2.0 * c->n_experts * H;
            if (c->shared_intermediate) w += p * 3.0 * H * c->shared_intermediate + (c->shared_gate ? 2 * H : 0);
        } else {
            w += p * 3.0 * H * c->intermediate;
        }
    }
    w += 2.0 * ((double)c->vocab * H + H + (double)B * H); /* lm_head, final norm, embedding rows */
    double kv = (double)B * C * c->n_layers * 2.0 * c->n_kv_heads * hd;
    return w + 2.0 * kv;
}

/* Decode steps of B sequences at `context` for each batch in bl: one table row each. Sequence s
 * keeps the same KV blocks in every batch (allocated once for the largest): its positions below
 * `context` are never written (the cache is zeroed when the engine starts) and the ones from
 * `context` on are written by the batch's own steps before they are read, so a batch's routing,
 * and with it its time, does not depend on the batches measured before it in the process (with
 * blocks released and reallocated, a later batch read other sequences' rows below `context`:
 * Qwen3-30B-A3B at 11 tokens 11.32 ms after 1-8 against 10.75 after 5 and 8, 2026-12-03). */
static int bench_decode(msm_engine *e, const msm_model_config *c, const int *bl, int nb, int maxb,
                        int context, int steps, double ceiling, bool fp8, msm_err *errp) {
    int per_seq = (context + steps + 16) / 16 + 1;
    printf("%6s %10s %10s %10s %10s %8s\n", "batch", "ms/step", "p90 ms", "tok/s", "GB/step", "%HBM");
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)maxb * per_seq), *tok = malloc(sizeof(int32_t) * maxb);
    msm_step_seq *sq = malloc(sizeof *sq * (size_t)maxb);
    double *ms = malloc(sizeof(double) * (size_t)steps);
    if (!blocks || !tok || !sq || !ms || msm_kv_pool_alloc(msm_engine_kv(e), maxb * per_seq, blocks) < 0) {
        fprintf(stderr, "msmoe-bench: out of memory or KV blocks\n");
        free(blocks), free(tok), free(sq), free(ms);
        return 1;
    }
    for (int i = 0; i < nb; i++) {
        int B = bl[i];
        for (int s = 0; s < B; s++) tok[s] = (int32_t)((s * 7919 + 13) % c->vocab);
        int rc = 0;
        for (int st = -3; st < steps && rc == 0; st++) { /* 3 warm-up steps */
            for (int s = 0; s < B; s++)
                sq[s] = (msm_step_seq){.tokens = &tok[s], .n_tokens = 1, .pos0 = context + (st < 0 ? 0 : st),
                                       .blocks = blocks + (size_t)s * per_seq, .n_blocks = per_seq,
                                       .output = MSM_STEP_OUTPUT_SAMPLE, .sampling = {.temperature = 0, .top_p = 1}};
            msm_step_out out;
            double a = msm_bench_now_ms();
            rc = msm_engine_step(e, sq, B, &out, errp);
            double dt = msm_bench_now_ms() - a;
            if (st >= 0) ms[st] = dt;
            for (int s = 0; s < B && rc == 0; s++) tok[s] = out.tokens[s];
        }
        if (rc) {
            fprintf(stderr, "msmoe-bench: batch %d: %s\n", B, errp->msg);
            msm_kv_pool_release(msm_engine_kv(e), blocks, maxb * per_seq);
            free(blocks), free(tok), free(sq), free(ms);
            return 1;
        }
        qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
        double med = ms[steps / 2], p90 = ms[(steps * 9) / 10], gb = step_bytes(c, B, context, fp8) / 1e9;
        if (ceiling > 0)
            printf("%6d %10.3f %10.3f %10.0f %10.3f %7.1f%%\n", B, med, p90, B / med * 1e3, gb,
                   gb / (med / 1e3) / ceiling * 100.0);
        else
            printf("%6d %10.3f %10.3f %10.0f %10.3f %8s\n", B, med, p90, B / med * 1e3, gb, "-");
        fflush(stdout);
    }
    msm_kv_pool_release(msm_engine_kv(e), blocks, maxb * per_seq);
    free(blocks);
    free(tok);
    free(sq);
    free(ms);
    return 0;
}

/* One prompt of L tokens from position 0 for each length in bl: one table row each. */
static int bench_prefill(msm_engine *e, const msm_model_config *c, const int *bl, int nb, int steps,
                         msm_err *err) {
    printf("%6s %10s %10s %12s\n", "tokens", "ms/step", "p90 ms", "prompt tok/s");
    int maxl = 1;
    for (int i = 0; i < nb; i++) maxl = bl[i] > maxl ? bl[i] : maxl;
    int nblk = (maxl + 15) / 16;
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nblk), *tok = malloc(sizeof(int32_t) * (size_t)maxl);
    double *ms = malloc(sizeof(double) * (size_t)steps);
    if (!blocks || !tok || !ms || msm_kv_pool_alloc(msm_engine_kv(e), nblk, blocks) < 0) {
        fprintf(stderr, "msmoe-bench: out of memory or KV blocks\n");
        free(blocks), free(tok), free(ms);
        return 1;
    }
    for (int t = 0; t < maxl; t++) tok[t] = (int32_t)((t * 7919 + 13) % c->vocab);
    int rc = 0;
    for (int i = 0; i < nb && rc == 0; i++) {
        int L = bl[i];
        for (int st = -2; st < steps && rc == 0; st++) { /* 2 warm-up steps */
            msm_step_seq sq = {.tokens = tok, .n_tokens = L, .pos0 = 0, .blocks = blocks,
                               .n_blocks = (L + 15) / 16, .output = MSM_STEP_OUTPUT_SAMPLE,
                               .sampling = {.temperature = 0, .top_p = 1}};
            msm_step_out out;
            double a = msm_bench_now_ms();
            rc = msm_engine_step(e, &sq, 1, &out, err);
            if (st >= 0) ms[st] = msm_bench_now_ms() - a;
        }
        if (rc) {
            fprintf(stderr, "msmoe-bench: prefill %d: %s\n", L, err->msg);
            break;
        }
        qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
        double med = ms[steps / 2], p90 = ms[(steps * 9) / 10];
        printf("%6d %10.3f %10.3f %12.0f\n", L, med, p90, L / med * 1e3);
        fflush(stdout);
    }
    msm_kv_pool_release(msm_engine_kv(e), blocks, nblk);
    free(blocks), free(tok), free(ms);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "load") == 0) return msm_bench_load(argc, argv);
    if (argc < 2 || (strcmp(argv[1], "decode") != 0 && strcmp(argv[1], "prefill") != 0)) {
        fprintf(stderr, "usage: msmoe-bench decode|prefill --preset FILE.json | --model DIR [options]\n"
                        "       msmoe-bench load --model DIR [--backend cpu|cuda] [--tp N] [--threads N] "
                        "[--repeat N] [--cold] [--no-cuda-graphs] [--slot-kb N]\n");
        return 2;
    }
    bool prefill = strcmp(argv[1], "prefill") == 0;
    msm_engine_opts o;
    msm_engine_opts_default(&o);
    static const char default_batches[] = "1,8,32,128,256";
    const char *batches = default_batches;
    int context = 512, steps = 30;
    double ceiling = 0.0; /* GB/s (--ceiling); CUDA: measured on the group's first GPU; 0: none */
    static const struct option lo[] = {
        {"preset", required_argument, 0, 'p'}, {"model", required_argument, 0, 'm'},
        {"backend", required_argument, 0, 'b'}, {"batches", required_argument, 0, 'B'},
        {"context", required_argument, 0, 'c'}, {"steps", required_argument, 0, 's'},
        {"no-cuda-graphs", no_argument, 0, 'G'}, {"no-multi-stream", no_argument, 0, 'M'},
        {"no-fuse-allreduce", no_argument, 0, 'F'}, {"tp", required_argument, 0, 't'},
        {"ceiling", required_argument, 0, 'C'}, {"lengths", required_argument, 0, 'L'},
        {"multi-stream-max-tokens", required_argument, 0, 'X'},
        {"no-fuse-allreduce-norm", no_argument, 0, 'N'}, {"fuse-linear-norm", no_argument, 0, 'R'},
        {"router-first", no_argument, 0, 'r'}, {"no-router-first", no_argument, 0, 'n'},
        {"router-alone", no_argument, 0, 'A'}, {"prefetch-l2", no_argument, 0, 'P'},
        {"prefetch-l2-next", no_argument, 0, 'Q'}, {"prefetch-kv", no_argument, 0, 'K'},
        {"fork-before-norm", no_argument, 0, 'f'}, {"no-prefetch-kv", no_argument, 0, 'k'},
        {"buckets", required_argument, 0, 'U'}, {0, 0, 0, 0}};
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'p': o.dummy_preset = optarg; break;
        case 'm': o.model_dir = optarg; break;
        case 'b': o.backend = strcmp(optarg, "cuda") == 0 ? MSM_BACKEND_CUDA : MSM_BACKEND_CPU; break;
        case 'B': batches = optarg; break;
        case 'c': context = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'G': o.cuda_graphs = false; break;
        case 'M': o.multi_stream = false; break;
        case 'F': o.fuse_allreduce = false; break;
        case 'N': o.fuse_allreduce_norm = false; break;
        case 'R': o.fuse_linear_norm = true; break;
        case 'r': o.router_first = true; break;
        case 'n': o.router_first = false; break;
        case 'A': o.router_alone = true; break;
        case 'P': o.prefetch_l2 = true; break;
        case 'Q': o.prefetch_l2_next = true; break;
        case 'K': o.prefetch_kv = true; break;
        case 'k': o.prefetch_kv = false; break;
        case 'f': o.fork_before_norm = true; break;
        case 't': o.tp = atoi(optarg); break;
        case 'C': ceiling = atof(optarg); break;
        case 'L': batches = optarg; break;
        case 'X': o.multi_stream_max_tokens = atoi(optarg); break;
        case 'U': /* the decode buckets captured as CUDA graphs (default: the engine's) */
            o.n_buckets = 0;
            for (char *s = optarg, *end; *s; s = *end ? end + 1 : end) {
                long v = strtol(s, &end, 10);
                if (end == s || (*end && *end != ',') || v < 1 || o.n_buckets == MSM_MAX_BUCKETS) {
                    fprintf(stderr, "msmoe-bench: --buckets %s: expected up to %d positive numbers, comma-separated\n",
                            optarg, MSM_MAX_BUCKETS);
                    return 2;
                }
                o.buckets[o.n_buckets++] = (int)v;
            }
            break;
        default: return 2;
        }
    }
    int bl[32], nb = 0, maxb = 1;
    for (char *s = (char *)batches; *s && nb < 32;) {
        bl[nb] = (int)strtol(s, &s, 10);
        if (bl[nb] > maxb) maxb = bl[nb];
        nb++;
        if (*s == ',') s++;
    }
    if (prefill) {
        if (batches == default_batches) nb = 4, bl[0] = 128, bl[1] = 512, bl[2] = 1024, bl[3] = 2048, maxb = 2048;
        if (steps == 30) steps = 10;
        o.max_seqs = 1;
        o.max_step_tokens = maxb;
        o.max_context = maxb + 16;
        o.kv_blocks = (maxb + 15) / 16 + 2;
        o.cuda_graphs = false; /* prefill steps run eagerly */
    } else {
        int per_seq = (context + steps + 16) / 16 + 1;
        o.max_seqs = maxb;
        o.max_step_tokens = maxb;
        o.max_context = context + steps + 16;
        o.kv_blocks = maxb * per_seq + 1;
    }
    msm_err err = {{0}};
    /* %HBM's ceiling: the device-to-device copy rate of the card the step runs on (bytes read plus
     * written), measured before the weights take its memory; an H200 gives ~4300 GB/s, an H100
     * ~3000, so one fixed number would misstate the other card */
    char gpu[128] = ""; /* the measured GPU's name: empty unless measured */
    if (!prefill && ceiling <= 0 && o.backend == MSM_BACKEND_CUDA &&
        msm_engine_device_copy_gbps(o.first_device, gpu, sizeof gpu, &ceiling, &err) < 0) {
        fprintf(stderr, "msmoe-bench: %s (no %%HBM; --ceiling GBPS gives one)\n", err.msg);
        ceiling = 0.0, gpu[0] = '\0', err = (msm_err){{0}};
    }
    msm_engine *e;
    double t0 = msm_bench_now_ms();
    if (msm_engine_new(&o, &e, &err) < 0) {
        fprintf(stderr, "msmoe-bench: %s\n", err.msg);
        return 1;
    }
    const msm_model_config *c = msm_engine_model(e);
    char ms_desc[48];
    if (o.multi_stream && o.multi_stream_max_tokens > 0)
        snprintf(ms_desc, sizeof ms_desc, "on up to %d tokens", o.multi_stream_max_tokens);
    else
        snprintf(ms_desc, sizeof ms_desc, "%s", o.multi_stream ? "on" : "off");
    char ctx_desc[32] = "";
    if (!prefill) snprintf(ctx_desc, sizeof ctx_desc, "context %d, ", context);
    printf("# %s %s, backend %s, tp %d, graphs %s, multi-stream %s, fuse-allreduce %s, fuse-allreduce-norm %s, "
           "fuse-linear-norm %s, router %s, fork-before-norm %s, prefetch-l2 %s, prefetch-kv %s, %s%d steps (median), "
           "start-up %.1f s\n",
           c->arch_name,
           prefill ? "prefill" : "decode",
           msm_engine_backend_name(e), o.tp, o.cuda_graphs && o.backend == MSM_BACKEND_CUDA ? "on" : "off", ms_desc,
           o.fuse_allreduce ? "on" : "off", o.fuse_allreduce_norm ? "on" : "off", o.fuse_linear_norm ? "on" : "off",
           o.router_alone ? "alone" : o.router_first ? "first" : "in order", o.fork_before_norm ? "on" : "off",
           o.prefetch_l2_next ? "on + next" : o.prefetch_l2 ? "on" : "off",
           o.prefetch_kv ? "on" : "off",
           ctx_desc, steps,
           (msm_bench_now_ms() - t0) / 1e3);
    /* docs/adr/0006-fp8.md: the CUDA backend keeps an FP8 preset's projections FP8 (dummy codes and
     * scales) unless MSM_CUDA_FP8_RESIDENT=0; the CPU backend holds float32 values of them */
    const char *res = getenv("MSM_CUDA_FP8_RESIDENT");
    bool fp8 = c->fp8_block && o.backend == MSM_BACKEND_CUDA && !(res && res[0] == '0');
    if (c->fp8_block)
        printf("# FP8 preset: %s; GB/step counts %s\n",
               fp8 ? "projections FP8-resident (codes + per-row block scales)" : "weights bf16 on the device",
               fp8 ? "1 + 4/128 bytes per projection weight" : "bf16 weights");
    const msm_load_summary *ls = msm_engine_load_summary(e);
    printf("# weights: %.3f GB on the devices%s", (double)ls->weight_bytes / 1e9, ls->weight_bytes_fp8 ? "" : "\n");
    if (ls->weight_bytes_fp8) printf(", %.2f GB of them FP8-resident\n", (double)ls->weight_bytes_fp8 / 1e9);
    if (!prefill && ceiling > 0)
        printf("# %%HBM: GB/step over the time against %.0f GB/s a GPU (%s%s)\n", ceiling,
               gpu[0] ? "device-to-device copy, bytes read + written, measured at start-up on " : "--ceiling",
               gpu);
    /* a TP group of tp GPUs reads the step's bytes (split between them) at tp GPUs' ceilings */
    if (!prefill && o.tp > 1 && ceiling > 0)
        printf("# %%HBM: GB/step over %d GPUs' ceilings (%d x %.0f GB/s)\n", o.tp, o.tp, ceiling);
    int rc = prefill ? bench_prefill(e, c, bl, nb, steps, &err)
                     : bench_decode(e, c, bl, nb, maxb, context, steps, ceiling * (o.tp > 1 ? o.tp : 1), fp8, &err);
    msm_engine_free(e);
    return rc;
}
