/* msmoe-run: offline generation (no daemon, no sockets). Loads a checkpoint (or dummy weights from
 * a shape preset), feeds a prompt, decodes through the daemon's scheduler run in-process
 * (msm_generate), prints the generated ids as one line of comma-separated integers; optionally
 * dumps the logits HF would return, prints the step graph, or times the engine. Also the
 * tokenizer's command line (--encode / --decode).
 *
 *   msmoe-run --model DIR --prompt-ids 1,2,3 --max-new-tokens N [--greedy]
 *             [--temperature T --top-k K --top-p P --seed S] [--ignore-eos]
 *             [--dump-logits FILE.npy] [--tp N] [--dump-graph] [--no-multi-stream]
 *             [--no-fuse-allreduce] [--no-fuse-allreduce-norm] [--fuse-linear-norm]
 *             [--prefetch-l2] [--prefetch-l2-next] [--prefetch-kv | --no-prefetch-kv] [--fork-before-norm]
 *             [--bench]
 *             [--backend cpu|cuda]
 *             [--kv-bf16] [--fp8-as-bf16 | --fp8-as-cuda] */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "msm_engine.h"
#include "msm_generate.h"
#include "msm_tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: msmoe-run --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--max-new-tokens N]\n"
            "                 [--greedy | --temperature T [--top-k K] [--top-p P] [--seed S]]\n"
            "                 [--ignore-eos] [--dump-logits FILE.npy] [--tp N] [--dump-graph]\n"
            "                 [--no-multi-stream] [--no-fuse-allreduce] [--no-fuse-allreduce-norm]\n"
            "                 [--fuse-linear-norm] [--prefetch-l2] [--prefetch-l2-next] [--no-prefetch-kv]\n"
            "                 [--fork-before-norm] [--bench] [--text]\n"
            "                 [--backend cpu|cuda] [--no-cuda-graphs] [--device N] [--kv-bf16]\n"
            "                 [--fp8-as-bf16 | --fp8-as-cuda]\n"
            "       msmoe-run --dummy-weights PRESET.json ...   (random weights of a config's shapes)\n"
            "       msmoe-run --tokenizer FILE (--encode | --decode)   (stdin → stdout)\n"
            "  --kv-bf16, --fp8-as-bf16: the CPU backend stores its KV cache, and its FP8 weights once\n"
            "  dequantised, rounded to bf16 as the CUDA backend stores them (for CUDA vs CPU checks);\n"
            "  --fp8-as-cuda: only the FP8 weights the CUDA backend does not keep FP8 (routers, gates)\n"
            "  --prefetch-l2: each layer's o_proj and shared expert pulled into the GPU's L2 during its\n"
            "  attention; --prefetch-l2-next: also the next layer's qkv during the router (no shared expert);\n"
            "  --no-prefetch-kv: no L2 prefetch of each layer's K/V cache rows (by default, in layers without a\n"
            "  shared expert, they are pulled into L2 from the norm before the qkv projection)\n"
            "  --fork-before-norm: the shared expert's branch forked before the norm it reads, which it\n"
            "  computes itself\n");
}

/* On a terminal: a progress bar on stderr while the weights load; ctx: a line is left open. */
static void load_bar(void *ctx, const msm_load_progress *p) {
    char line[160];
    msm_load_progress_format(line, sizeof line, p, 30);
    fprintf(stderr, "\r\033[Kloading %s%s", line, p->fraction >= 1.0 ? "\n" : "");
    *(bool *)ctx = p->fraction < 1.0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses "1,2,3" into ids; returns the count or -1 with a message. */
static int parse_ids(const char *s, int32_t **ret) {
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "msmoe-run: bad token id at '%.20s' (ids are non-negative integers "
                            "separated by commas)\n", p);
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *t = realloc(ids, sizeof(int32_t) * (size_t)cap);
            if (!t) {
                free(ids);
                return -1;
            }
            ids = t;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "msmoe-run: unexpected '%c' in the id list\n", *p);
            free(ids);
            return -1;
        }
    }
    *ret = ids;
    return n;
}

static int write_npy(const char *path, const float *data, int rows, int cols) {
    FILE *f = fopen(path, "wb");
    if (!f) return -errno;
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    unsigned short hlen = (unsigned short)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, sizeof(float), (size_t)rows * (size_t)cols, f);
    int r = ferror(f) ? -EIO : 0;
    if (fclose(f) != 0) r = -EIO;
    return r;
}

static char *read_all(FILE *f, size_t *ret_len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (n < cap) break;
        cap *= 2;
        char *t = realloc(buf, cap);
        if (!t) {
            free(buf);
            return NULL;
        }
        buf = t;
    }
    if (buf) *ret_len = n;
    return buf;
}

static int tokenizer_mode(const char *path, bool encode) {
    msm_err err = {{0}};
    msm_tokenizer *tok;
    if (msm_tokenizer_load(path, &tok, &err) < 0) {
        fprintf(stderr, "msmoe-run: %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *in = read_all(stdin, &len);
    int rc = 1;
    if (!in) goto out;
    if (encode) {
        int32_t *ids;
        size_t n;
        if (msm_tokenizer_encode(tok, in, len, false, &ids, &n, &err) < 0) {
            fprintf(stderr, "msmoe-run: %s\n", err.msg);
            goto out;
        }
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("\n");
        free(ids);
    } else {
        char *grown = realloc(in, len + 1);
        if (!grown) {
            fprintf(stderr, "msmoe-run: out of memory reading the ids\n");
            goto out;
        }
        in = grown;
        in[len] = 0;
        int32_t *ids;
        int n = parse_ids(in, &ids);
        if (n < 0) goto out;
        char *text;
        size_t tl;
        int r = msm_tokenizer_decode(tok, ids, (size_t)n, false, &text, &tl, &err);
        free(ids);
        if (r < 0) {
            fprintf(stderr, "msmoe-run: %s\n", err.msg);
            goto out;
        }
        fwrite(text, 1, tl, stdout);
        free(text);
    }
    rc = 0;
out:
    free(in);
    msm_tokenizer_free(tok);
    return rc;
}

/* The command line. */
typedef struct run_opts {
    msm_engine_opts engine;
    const char *prompt_ids, *prompt_text, *dump_logits, *tokenizer;
    int max_new;
    bool dump_graph, bench, ignore_eos, text_out;
    int encode;                 /* --encode 1, --decode 0, neither -1 */
    msm_sample_params sampling;
} run_opts;

enum { O_PROMPT_IDS = 256, O_MAX_NEW, O_GREEDY, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_DUMP_LOGITS,
       O_TP, O_DUMP_GRAPH, O_NO_MS, O_NO_FUSE, O_BENCH, O_DUMMY, O_IGNORE_EOS, O_TOKENIZER,
       O_ENCODE, O_DECODE, O_PROMPT, O_TEXT, O_KV, O_MAXTOK, O_BACKEND, O_NO_GRAPHS, O_DEVICE, O_KV_BF16,
       O_FP8_BF16, O_FP8_CUDA, O_NO_FUSE_AR_NORM, O_FUSE_LIN_NORM, O_PREFETCH_L2, O_PREFETCH_L2_NEXT, O_PREFETCH_KV,
       O_FORK_NORM, O_NO_PREFETCH_KV };

/* Applies the option c with argument arg to ro. 0, or the exit status of a bad value. */
static int set_option(run_opts *ro, int c, const char *arg) {
    msm_engine_opts *o = &ro->engine;
    msm_sample_params *sp = &ro->sampling;
    char *end;
    switch (c) {
    case 'm': o->model_dir = arg; break;
    case O_PROMPT_IDS: ro->prompt_ids = arg; break;
    case O_PROMPT: ro->prompt_text = arg; break;
    case O_MAX_NEW:
        ro->max_new = (int)strtol(arg, &end, 10);
        if (*end || ro->max_new < 1) {
            fprintf(stderr, "msmoe-run: --max-new-tokens must be a positive integer\n");
            return 2;
        }
        break;
    case O_GREEDY: sp->temperature = 0.0f; break;
    case O_TEMP: sp->temperature = strtof(arg, &end); if (*end || !(sp->temperature >= 0)) { fprintf(stderr, "msmoe-run: bad --temperature\n"); return 2; } break;
    case O_TOPK: sp->top_k = (int)strtol(arg, &end, 10); if (*end || sp->top_k < 0) { fprintf(stderr, "msmoe-run: bad --top-k\n"); return 2; } break;
    case O_TOPP: sp->top_p = strtof(arg, &end); if (*end || !(sp->top_p > 0 && sp->top_p <= 1)) { fprintf(stderr, "msmoe-run: --top-p must be in (0, 1]\n"); return 2; } break;
    case O_SEED: sp->seed = strtoull(arg, &end, 10); if (*end) { fprintf(stderr, "msmoe-run: bad --seed\n"); return 2; } break;
    case O_DUMP_LOGITS: ro->dump_logits = arg; break;
    case O_TP: o->tp = (int)strtol(arg, &end, 10); if (*end || o->tp < 1) { fprintf(stderr, "msmoe-run: bad --tp\n"); return 2; } break;
    case O_DUMP_GRAPH: ro->dump_graph = true; break;
    case O_NO_MS: o->multi_stream = false; break;
    case O_NO_FUSE: o->fuse_allreduce = false; break;
    case O_NO_FUSE_AR_NORM: o->fuse_allreduce_norm = false; break;
    case O_FUSE_LIN_NORM: o->fuse_linear_norm = true; break;
    case O_PREFETCH_L2: o->prefetch_l2 = true; break;
    case O_PREFETCH_L2_NEXT: o->prefetch_l2_next = true; break;
    case O_PREFETCH_KV: o->prefetch_kv = true; break;
    case O_NO_PREFETCH_KV: o->prefetch_kv = false; break;
    case O_FORK_NORM: o->fork_before_norm = true; break;
    case O_BENCH: ro->bench = true; break;
    case O_DUMMY: o->dummy_preset = arg; break;
    case O_IGNORE_EOS: ro->ignore_eos = true; break;
    case O_TOKENIZER: ro->tokenizer = arg; break;
    case O_ENCODE: ro->encode = 1; break;
    case O_DECODE: ro->encode = 0; break;
    case O_TEXT: ro->text_out = true; break;
    case O_KV: o->kv_blocks = (int)strtol(arg, &end, 10); break;
    case O_MAXTOK: o->max_step_tokens = (int)strtol(arg, &end, 10); break;
    case O_BACKEND:
        if (strcmp(arg, "cpu") == 0) o->backend = MSM_BACKEND_CPU;
        else if (strcmp(arg, "cuda") == 0) o->backend = MSM_BACKEND_CUDA;
        else {
            fprintf(stderr, "msmoe-run: --backend is cpu or cuda\n");
            return 2;
        }
        break;
    case O_NO_GRAPHS: o->cuda_graphs = false; break;
    case O_DEVICE: o->first_device = (int)strtol(arg, &end, 10); break;
    case O_KV_BF16: o->kv_bf16 = true; break;
    case O_FP8_BF16: o->fp8_as_bf16 = true; break;
    case O_FP8_CUDA: o->fp8_as_cuda = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
    return 0;
}

/* Returns -1 to go on, or the exit status (--help, a bad option). */
static int parse_args(int argc, char **argv, run_opts *ro) {
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"prompt-ids", required_argument, 0, O_PROMPT_IDS},
        {"max-new-tokens", required_argument, 0, O_MAX_NEW}, {"greedy", no_argument, 0, O_GREEDY},
        {"temperature", required_argument, 0, O_TEMP}, {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP}, {"seed", required_argument, 0, O_SEED},
        {"dump-logits", required_argument, 0, O_DUMP_LOGITS}, {"tp", required_argument, 0, O_TP},
        {"dump-graph", no_argument, 0, O_DUMP_GRAPH}, {"no-multi-stream", no_argument, 0, O_NO_MS},
        {"no-fuse-allreduce", no_argument, 0, O_NO_FUSE}, {"bench", no_argument, 0, O_BENCH},
        {"no-fuse-allreduce-norm", no_argument, 0, O_NO_FUSE_AR_NORM},
        {"fuse-linear-norm", no_argument, 0, O_FUSE_LIN_NORM}, {"prefetch-l2", no_argument, 0, O_PREFETCH_L2},
        {"prefetch-l2-next", no_argument, 0, O_PREFETCH_L2_NEXT}, {"prefetch-kv", no_argument, 0, O_PREFETCH_KV},
        {"fork-before-norm", no_argument, 0, O_FORK_NORM}, {"no-prefetch-kv", no_argument, 0, O_NO_PREFETCH_KV},
        {"dummy-weights", required_argument, 0, O_DUMMY}, {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"tokenizer", required_argument, 0, O_TOKENIZER}, {"encode", no_argument, 0, O_ENCODE},
        {"decode", no_argument, 0, O_DECODE}, {"prompt", required_argument, 0, O_PROMPT},
        {"text", no_argument, 0, O_TEXT}, {"kv-blocks", required_argument, 0, O_KV},
        {"max-step-tokens", required_argument, 0, O_MAXTOK}, {"backend", required_argument, 0, O_BACKEND},
        {"no-cuda-graphs", no_argument, 0, O_NO_GRAPHS}, {"device", required_argument, 0, O_DEVICE},
        {"kv-bf16", no_argument, 0, O_KV_BF16}, {"fp8-as-bf16", no_argument, 0, O_FP8_BF16},
        {"fp8-as-cuda", no_argument, 0, O_FP8_CUDA},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    memset(ro, 0, sizeof *ro);
    msm_engine_opts_default(&ro->engine);
    ro->max_new = 16;
    ro->encode = -1;
    ro->sampling = (msm_sample_params){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int c;
    while ((c = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
        int rc = set_option(ro, c, optarg);
        if (rc != 0 || c == 'h')
            return rc;
    }
    return -1;
}

/* The prompt: --prompt encoded with the model's (or --tokenizer's) tokenizer, or --prompt-ids.
 * The tokenizer is loaded for --prompt and --text. 0 or the exit status. */
static int load_prompt(const run_opts *ro, msm_tokenizer **ret_tok, int32_t **ret_prompt, int *ret_n) {
    msm_err err = {{0}};
    msm_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    int P = 0;
    if ((ro->prompt_text || ro->text_out) && ro->engine.model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", ro->tokenizer ? "" : ro->engine.model_dir);
        if (msm_tokenizer_load(ro->tokenizer ? ro->tokenizer : path, &tok, &err) < 0) {
            fprintf(stderr, "msmoe-run: %s\n", err.msg);
            return 1;
        }
    }
    if (ro->prompt_text) {
        size_t n;
        if (!tok || msm_tokenizer_encode(tok, ro->prompt_text, strlen(ro->prompt_text), true, &prompt, &n, &err) < 0) {
            fprintf(stderr, "msmoe-run: cannot encode the prompt: %s\n", tok ? err.msg : "no tokenizer");
            msm_tokenizer_free(tok);
            return 1;
        }
        P = (int)n;
    } else if (ro->prompt_ids) {
        P = parse_ids(ro->prompt_ids, &prompt);
        if (P < 0) {
            msm_tokenizer_free(tok);
            return 2;
        }
    }
    if (P <= 0 && !ro->dump_graph) {
        fprintf(stderr, "msmoe-run: the prompt is empty: give --prompt-ids 1,2,3 (at least one id)\n");
        free(prompt);
        msm_tokenizer_free(tok);
        return 2;
    }
    *ret_tok = tok;
    *ret_prompt = prompt;
    *ret_n = P;
    return 0;
}

/* Generates and prints: the ids on one line, the text (--text), the logits (--dump-logits), the
 * timings (--bench). 0 or the exit status. */
static int generate(const run_opts *ro, msm_engine *e, const msm_tokenizer *tok, const int32_t *prompt, int P,
                    double t_load) {
    const msm_model_config *cfg = msm_engine_model(e);
    msm_err err = {{0}};
    for (int i = 0; i < P; i++)
        if (prompt[i] >= cfg->vocab) {
            fprintf(stderr, "msmoe-run: prompt id %d (index %d) is outside the vocabulary (0..%d)\n",
                    prompt[i], i, cfg->vocab - 1);
            return 1;
        }
    msm_generate_opts go = {.max_new = ro->max_new, .sampling = ro->sampling, .ignore_eos = ro->ignore_eos,
                            .dump_logits = ro->dump_logits != NULL};
    msm_generation gen;
    if (msm_generate(e, prompt, P, &go, &gen, &err) < 0) {
        fprintf(stderr, "msmoe-run: %s\n", err.msg);
        return 1;
    }
    int n_gen = gen.n, rc = 0;
    for (int i = 0; i < n_gen; i++) printf(i ? ",%d" : "%d", gen.ids[i]);
    printf("\n");
    char *text;
    size_t tl;
    if (ro->text_out && tok && msm_tokenizer_decode(tok, gen.ids, (size_t)n_gen, true, &text, &tl, &err) == 0) {
        fwrite(text, 1, tl, stdout);
        printf("\n");
        free(text);
    }
    if (ro->dump_logits && write_npy(ro->dump_logits, gen.logits, gen.n_rows, cfg->vocab) < 0) {
        fprintf(stderr, "msmoe-run: cannot write %s\n", ro->dump_logits);
        rc = 1;
    } else if (ro->bench) {
        fprintf(stderr, "msmoe-run: backend %s tp %d: load %.3f s, prefill %d tokens %.4f s (%.1f tok/s), "
                        "decode %d tokens %.4f s (%.1f tok/s)\n", msm_engine_backend_name(e), ro->engine.tp,
                t_load, P, gen.prefill_s, P / gen.prefill_s, n_gen - 1, gen.decode_s,
                n_gen > 1 ? (n_gen - 1) / gen.decode_s : 0.0);
    }
    msm_generation_done(&gen);
    return rc;
}

int main(int argc, char **argv) {
    run_opts ro;
    int rc = parse_args(argc, argv, &ro);
    if (rc >= 0)
        return rc;
    if (ro.encode >= 0) {
        if (!ro.tokenizer) {
            fprintf(stderr, "msmoe-run: --encode/--decode need --tokenizer FILE\n");
            return 2;
        }
        return tokenizer_mode(ro.tokenizer, ro.encode == 1);
    }
    if (!ro.engine.model_dir && !ro.engine.dummy_preset) {
        fprintf(stderr, "msmoe-run: give --model DIR (a Hugging Face checkpoint directory)\n");
        usage(stderr);
        return 2;
    }
    msm_tokenizer *tok;
    int32_t *prompt;
    int P;
    if ((rc = load_prompt(&ro, &tok, &prompt, &P)) != 0)
        return rc;
    msm_err err = {{0}};
    double t0 = now_s();
    msm_engine *e;
    bool bar_open = false;
    if (isatty(STDERR_FILENO)) {
        ro.engine.load_progress = load_bar;
        ro.engine.load_progress_ctx = &bar_open;
    }
    if (msm_engine_new(&ro.engine, &e, &err) < 0) {
        fprintf(stderr, "%smsmoe-run: %s\n", bar_open ? "\n" : "", err.msg);
        free(prompt);
        msm_tokenizer_free(tok);
        return 1;
    }
    if (ro.dump_graph)
        rc = msm_engine_dump_graph(e, 0, stdout) < 0 ? 1 : 0;
    else
        rc = generate(&ro, e, tok, prompt, P, now_s() - t0);
    free(prompt);
    msm_engine_free(e);
    msm_tokenizer_free(tok);
    return rc;
}
