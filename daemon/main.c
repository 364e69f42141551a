/* msmoed: the daemon's entry point. Reads the config, splits the node into TP groups, validates
 * the model without loading it, loads the tokenizer and then the model once per group (telling
 * systemd, group by group, while it does), starts one scheduler thread per group and the libuv
 * loop, signals READY=1 once every group is resident and the sockets listen, and on SIGTERM drains
 * and exits 0 (1 when an engine failed for good, so that systemd restarts it).
 *
 * main runs the phases below in order; each says what it sets up in the daemon_state and returns
 * 0 or the process's exit status (2: the configuration is wrong, 1: start-up failed).
 * `--check-config` runs the same validation as start-up (validate_model) and stops before loading.
 *
 * Signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread from the start; until the loop
 * takes them over (serve), a watcher thread waits for them: SIGTERM or SIGINT while the model
 * loads ends the process at once with status 0 (a load of many GB is not worth finishing only to
 * drain nothing: no client has connected yet), SIGHUP reopens the log. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "msm_api.h"
#include "msm_config.h"
#include "msm_engine.h"
#include "msm_fake_engine.h"
#include "msm_log.h"
#include "msm_notify.h"
#include "msm_sched.h"
#include "msm_server.h"

#ifndef MSM_SYSCONFDIR
#define MSM_SYSCONFDIR "/etc"
#endif
#ifndef MSM_VERSION
#define MSM_VERSION "0"
#endif

/* The command line. */
typedef struct args {
    const char *config_path;   /* NULL: the default file when it exists, else built-in defaults */
    const char **sets;         /* [n_sets] --set overrides, in order */
    int n_sets;
    bool check_only;
    bool dump_graph;
} args;

/* Everything main sets up, in the order it does. */
typedef struct daemon_state {
    msm_config cfg;
    const char *config_path;
    bool fake, cuda;
    char model_dir[PATH_MAX];  /* "" for the fake engine and dummy weights */
    const char *what;          /* the model as messages name it */
    msm_engine_opts eo;
    msm_group_plan plan;
    char tok_path[PATH_MAX + 32];
    msm_tokenizer *tok;        /* NULL: ids only */
    int n_groups;
    msm_engine **engines;      /* [n_groups] NULL entries with the fake engine */
    msm_fake_engine **fakes;   /* [n_groups] NULL entries with a real one */
    msm_sched_engine *se;      /* [n_groups] each group's engine as its scheduler sees it */
    msm_sched **scheds;        /* [n_groups] */
    msm_api_model_info info;
    uv_loop_t loop;
    bool have_loop;
    msm_server *srv;
    pthread_t sig_thread;      /* the signal watcher of start-up (see the top of the file) */
    bool have_sig_thread;
    atomic_bool sig_stop;
} daemon_state;

static void usage(FILE *f) {
    fprintf(f,
            "usage: msmoed [--config FILE] [--set SECTION.KEY=VALUE]... [--check-config] [--dump-graph]\n"
            "\n"
            "  --config FILE      INI configuration (default: %s/msmoed/msmoed.conf when it exists)\n"
            "  --set S.K=V        override one key (repeatable; applied after the file)\n"
            "  --check-config     validate the configuration (and that the model exists), then exit\n"
            "  --dump-graph       load the model, print rank 0's step graph schedule, exit\n"
            "  --version, --help\n",
            MSM_SYSCONFDIR);
}

/* Returns -1 to go on, or the exit status (--help, --version, a usage error). a->sets is
 * malloc'd when it goes on. */
static int parse_args(int argc, char **argv, args *a) {
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"set", required_argument, NULL, 's'},
        {"check-config", no_argument, NULL, 'k'}, {"dump-graph", no_argument, NULL, 'g'},
        {"version", no_argument, NULL, 'V'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    memset(a, 0, sizeof *a);
    a->sets = calloc((size_t)argc + 1, sizeof *a->sets);
    if (!a->sets) {
        fprintf(stderr, "msmoed: out of memory\n");
        return 1;
    }
    int opt, status = -1;
    while (status < 0 && (opt = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c': a->config_path = optarg; break;
        case 's': a->sets[a->n_sets++] = optarg; break;
        case 'k': a->check_only = true; break;
        case 'g': a->dump_graph = true; break;
        case 'V': printf("msmoed %s\n", MSM_VERSION); status = 0; break;
        case 'h': usage(stdout); status = 0; break;
        default: usage(stderr); status = 2; break;
        }
    }
    if (status < 0 && optind < argc) {
        fprintf(stderr, "msmoed: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        status = 2;
    }
    if (status >= 0)
        free(a->sets);
    return status;
}

/* Phase 1: the configuration: defaults < file < --set, checked. */
static int load_config(const args *a, daemon_state *d) {
    static char default_path[PATH_MAX];
    msm_err err = {{0}};
    msm_config_defaults(&d->cfg);
    snprintf(default_path, sizeof default_path, "%s/msmoed/msmoed.conf", MSM_SYSCONFDIR);
    d->config_path = a->config_path;
    if (!d->config_path && access(default_path, F_OK) == 0)
        d->config_path = default_path;
    int rc = d->config_path ? msm_config_load(&d->cfg, d->config_path, &err) : 0;
    for (int i = 0; rc == 0 && i < a->n_sets; i++)
        rc = msm_config_set(&d->cfg, a->sets[i], &err);
    if (rc == 0)
        rc = msm_config_check(&d->cfg, &err);
    if (rc < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* Test-only switches, from the environment (never set in production; the integration tests and
 * tests/gpu/check_faults.sh use them): MSMOED_TEST_FAULT=launch@N|hang@N|nan@N|stall@N injects a
 * fault from engine step N on (msm_engine_opts.test_fault; nan@N and stall@N are the fake
 * engine's only), and
 * MSMOED_TEST_V4_RANK=R gives rank R a different collective schedule. */
static void test_switches(msm_engine_opts *eo) {
    const char *f = getenv("MSMOED_TEST_FAULT"), *v4 = getenv("MSMOED_TEST_V4_RANK");
    const char *at = f ? strchr(f, '@') : NULL;
    if (at) {
        eo->test_fault = !strncmp(f, "launch@", 7) ? MSM_TEST_FAULT_LAUNCH
                         : !strncmp(f, "hang@", 5) ? MSM_TEST_FAULT_HANG
                                                   : MSM_TEST_FAULT_NONE;
        eo->test_fault_step = atoi(at + 1);
    }
    if (v4 && *v4)
        eo->test_diverge_rank = atoi(v4);
}

/* Phase 2: what to load and where: the model directory, the engine options and the TP groups
 * (engine.gpus cut in runs of engine.tp on CUDA, engine.replicas on the CPU). */
static int plan_groups(daemon_state *d) {
    msm_config *cfg = &d->cfg;
    msm_err err = {{0}};
    d->fake = strcmp(cfg->backend, "fake") == 0;
    if (!d->fake && !cfg->dummy_preset[0] && msm_config_model_dir(cfg, d->model_dir, sizeof d->model_dir, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    d->what = d->fake ? "fake engine" : cfg->dummy_preset[0] ? cfg->dummy_preset : d->model_dir;
    msm_config_engine_opts(cfg, &d->eo);
    test_switches(&d->eo);
    d->cuda = !d->fake && d->eo.backend == MSM_BACKEND_CUDA;
    int n_visible = d->cuda ? msm_engine_device_count() : -1;
    if (n_visible == -ENOTSUP) {
        fprintf(stderr, "msmoed: engine.backend = cuda, but this build has no CUDA backend (built with -Dcuda=disabled)\n");
        return 2;
    }
    if (msm_config_plan_groups(cfg, d->cuda, n_visible, &d->plan, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* Where the tokenizer comes from: engine.tokenizer (must load), else <model>/tokenizer.json (may be
 * missing: the daemon then serves ids only), else none. *ret_required says which. */
static bool tokenizer_path(const msm_config *cfg, const char *model_dir, char *ret, size_t cap, bool *ret_required) {
    *ret_required = false;
    if (!strcmp(cfg->tokenizer, "none"))
        return false;
    if (cfg->tokenizer[0]) {
        snprintf(ret, cap, "%s", cfg->tokenizer);
        *ret_required = true;
        return true;
    }
    if (!model_dir[0])
        return false;
    snprintf(ret, cap, "%s/tokenizer.json", model_dir);
    return true;
}

/* Phase 3 (and --check-config): what can be checked without loading the model, the same for a
 * start-up and for --check-config: the model's config.json (or the preset), every safetensors
 * header and every weight's shape for every rank, the graphs and the verifier, and
 * engine.max_context within the model's max_position_embeddings (msm_engine_validate). The fake
 * engine has no model. */
static int validate_model(daemon_state *d, msm_err *err) {
    if (d->fake)
        return 0;
    d->eo.model_dir = d->cfg.dummy_preset[0] ? NULL : d->model_dir;
    d->eo.first_device = d->plan.first_device[0];
    msm_model_config mc;
    int max_context, rc = msm_engine_validate(&d->eo, &mc, &max_context, err);
    if (rc < 0)
        return rc; /* the message names the file */
    if (d->cfg.max_context > mc.max_position)
        return msm_err_set(err, -EINVAL, "engine.max_context = %d exceeds the model's max_position_embeddings = %d "
                           "(%s)", d->cfg.max_context, mc.max_position, d->what);
    return 0;
}

/* --check-config: start-up's validation (the configuration, the model, the tokenizer, the
 * socket's directory), then a summary; nothing is loaded and nothing listens. */
static int check_config(daemon_state *d) {
    msm_err err = {{0}};
    if (validate_model(d, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    char tp[PATH_MAX + 32];
    bool required;
    if (tokenizer_path(&d->cfg, d->model_dir, tp, sizeof tp, &required) && (required || access(tp, F_OK) == 0)) {
        msm_tokenizer *t = NULL;
        if (msm_tokenizer_load(tp, &t, &err) < 0) {
            fprintf(stderr, "msmoed: cannot load the tokenizer: %s\n", err.msg);
            return 2;
        }
        msm_tokenizer_free(t);
    }
    /* A missing directory is only a warning here: systemd creates /run/msmoed (RuntimeDirectory=)
     * when it starts the unit, after an administrator's --check-config. */
    int rc = d->cfg.socket[0] ? msm_server_check_socket_dir(d->cfg.socket, &err) : 0;
    if (rc == -ENOENT)
        fprintf(stderr, "msmoed: warning: %s; start-up fails unless it is created first\n", err.msg);
    else if (rc < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    printf("msmoed: configuration OK (%s; model %s; %d TP group(s) of tp %d)\n",
           d->config_path ? d->config_path : "built-in defaults", d->what, d->plan.n_groups, d->cfg.tp);
    return 0;
}

/* Phase 4: the tokenizer, before the model: it is quick, and a broken file should not wait for
 * the model. None to load (a warning says what is off) leaves d->tok NULL; a broken one fails. */
static int load_tokenizer(daemon_state *d) {
    msm_err err = {{0}};
    bool required;
    if (!tokenizer_path(&d->cfg, d->model_dir, d->tok_path, sizeof d->tok_path, &required))
        return 0;
    if (!required && access(d->tok_path, F_OK) < 0) {
        msm_log_warn("no tokenizer: %s does not exist; text prompts, text in replies, stop strings and "
                     "Tokenize/Detokenize are off (token ids work; set engine.tokenizer to enable them)", d->tok_path);
        return 0;
    }
    int rc = msm_tokenizer_load(d->tok_path, &d->tok, &err);
    if (rc < 0) {
        /* The tokenizer's message names the file. */
        msm_err_wrap(&err, rc, "cannot load the tokenizer");
        msm_log_error("%s (engine.tokenizer = none serves ids only)", err.msg);
        msm_notify_status("failed: %s (engine.tokenizer = none serves ids only)", err.msg);
        return 1;
    }
    msm_log_info("tokenizer %s: %d ids", d->tok_path, msm_tokenizer_vocab_size(d->tok));
    return 0;
}

/* The engine's load progress as STATUS= (systemctl status shows "loading ...: 45%  12.3 of 27.0 GB"). */
static void notify_load_progress(void *ctx, const msm_load_progress *p) {
    char line[160];
    msm_load_progress_format(line, sizeof line, p, 0);
    msm_notify_loading_progress(ctx, line);
}

static void log_load_summary(int g, const msm_load_summary *s) {
    if (s->bytes_read)
        msm_log_info("group %d: weights %.2f GB read in %.2f s (%.2f GB/s, %d reader threads per rank, %.0f MB "
                     "staging); engine ready in %.2f s; peak RSS %.2f GB", g, (double)s->bytes_read / 1e9, s->load_s,
                     s->load_s > 0 ? (double)s->bytes_read / 1e9 / s->load_s : 0.0, s->threads,
                     (double)s->staging_bytes / 1e6, s->start_s, (double)s->peak_rss_bytes / 1e9);
    if (s->weight_bytes_fp8)
        msm_log_info("group %d: weights take %.2f GB on the devices, %.2f GB of them FP8-resident", g,
                     (double)s->weight_bytes / 1e9, (double)s->weight_bytes_fp8 / 1e9);
    else
        msm_log_info("group %d: weights take %.2f GB on the devices", g, (double)s->weight_bytes / 1e9);
}

/* Group g's engine: the fake one or the real one on its devices. */
static int load_group(daemon_state *d, int g, msm_err *err) {
    const msm_config *cfg = &d->cfg;
    if (d->fake) {
        /* test-only: MSMOED_FAKE_STEP_US (a delay per step), MSMOED_FAKE_LOAD_MS (a slow load),
         * MSMOED_TEST_FAULT (launch@N and hang@N: a fatal step failure; nan@N: non-finite logits;
         * stall@N: a step that never returns) */
        const char *delay = getenv("MSMOED_FAKE_STEP_US"), *load = getenv("MSMOED_FAKE_LOAD_MS");
        const char *fault = getenv("MSMOED_TEST_FAULT"), *at = fault ? strchr(fault, '@') : NULL;
        msm_fake_engine_opts fo = {.vocab = 512, .max_context = cfg->max_context ? cfg->max_context : 2048,
                                   .kv_blocks = cfg->kv_blocks, .eos_id = -1,
                                   .max_step_tokens = cfg->max_step_tokens, .max_seqs = cfg->max_seqs,
                                   .step_delay_us = delay ? atoi(delay) : 0,
                                   .fault_step = at ? atoi(at + 1) : 0,
                                   .fault_nonfinite = fault && !strncmp(fault, "nan@", 4),
                                   .fault_stall = fault && !strncmp(fault, "stall@", 6)};
        for (int ms = load ? atoi(load) : 0; ms > 0; ms -= 10)
            nanosleep(&(struct timespec){0, 10000000L}, NULL);
        int rc = msm_fake_engine_new(&fo, &d->fakes[g]);
        if (rc < 0)
            return msm_err_set(err, rc, "fake engine: %s", strerror(-rc));
        msm_fake_engine_vtable(d->fakes[g], &d->se[g]);
    } else {
        d->eo.model_dir = cfg->dummy_preset[0] ? NULL : d->model_dir;
        d->eo.first_device = d->plan.first_device[g];
        int rc = msm_engine_new(&d->eo, &d->engines[g], err);
        if (rc < 0)
            return rc;
        msm_sched_engine_from(&d->se[g], d->engines[g]);
        log_load_summary(g, msm_engine_load_summary(d->engines[g]));
    }
    d->se[g].tok = d->tok;
    return 0;
}

/* Phase 5: the model, once per group, one group after the other (each with its own STATUS=). */
static int load_groups(daemon_state *d, bool dump_graph) {
    msm_err err = {{0}};
    char status[1400];
    d->n_groups = dump_graph ? 1 : d->plan.n_groups;
    d->engines = calloc((size_t)d->n_groups, sizeof *d->engines);
    d->fakes = calloc((size_t)d->n_groups, sizeof *d->fakes);
    d->se = calloc((size_t)d->n_groups, sizeof *d->se);
    d->scheds = calloc((size_t)d->n_groups, sizeof *d->scheds);
    if (!d->engines || !d->fakes || !d->se || !d->scheds) {
        msm_log_error("out of memory");
        return 1;
    }
    msm_log_info("msmoed %s: loading %s in %d TP group(s) of tp %d", MSM_VERSION, d->what, d->n_groups, d->cfg.tp);
    for (int g = 0; g < d->n_groups; g++) {
        char where[64];
        int first = d->plan.first_device[g];
        if (d->cuda && d->cfg.tp > 1)
            snprintf(where, sizeof where, "GPUs %d-%d", first, first + d->cfg.tp - 1);
        else if (d->cuda)
            snprintf(where, sizeof where, "GPU %d", first);
        else
            snprintf(where, sizeof where, "%s", d->fake ? "fake" : "CPU");
        snprintf(status, sizeof status, "loading %.1200s: group %d/%d (%s)", d->what, g + 1, d->n_groups, where);
        msm_log_info("%s", status);
        msm_notify_status("%s", status);
        msm_notify_loading *loading = NULL;
        msm_notify_loading_start(status, 5, &loading);
        d->eo.load_progress = notify_load_progress; /* STATUS= with GB and percent */
        d->eo.load_progress_ctx = loading;
        int rc = load_group(d, g, &err);
        msm_notify_loading_stop(loading);
        if (rc < 0) {
            if (d->n_groups > 1)
                msm_log_error("group %d (%s): cannot load the model: %s", g, where, err.msg);
            else
                msm_log_error("cannot load the model: %s", err.msg);
            msm_notify_status("failed: group %d (%s): %s", g, where, err.msg);
            return 1;
        }
    }
    return 0;
}

/* Phase 6: what ModelInfo reports. Sizes are per group: a request lives in one group's KV pool
 * and batch. */
static void describe_model(daemon_state *d) {
    msm_api_model_info *info = &d->info;
    const msm_sched_engine *se = &d->se[0];
    memset(info, 0, sizeof *info);
    if (d->engines[0]) {
        const msm_model_config *mc = msm_engine_model(d->engines[0]);
        const msm_engine_opts *o0 = msm_engine_options(d->engines[0]);
        if (mc->n_mtp_layers > 0) /* GLM-4.5's speculative-decoding layers: present, never used */
            msm_log_info("the model has %d multi-token-prediction layer(s) (num_nextn_predict_layers); "
                         "they are not loaded or used", mc->n_mtp_layers);
        info->architecture = mc->arch_name;
        info->backend = msm_engine_backend_name(d->engines[0]);
        info->hidden = mc->hidden;
        info->layers = mc->n_layers;
        info->experts = mc->n_experts;
        info->experts_per_token = mc->top_k;
        info->tp = o0->tp;
        info->multi_stream = o0->multi_stream;
        info->fuse_allreduce = o0->fuse_allreduce;
        info->cuda_graphs = o0->cuda_graphs && o0->backend == MSM_BACKEND_CUDA;
    } else {
        info->architecture = "fake";
        info->backend = "fake";
        info->tp = 1;
    }
    info->model = d->what;
    info->version = MSM_VERSION;
    info->tp_groups = d->n_groups;
    info->vocab = se->vocab;
    info->max_context = se->max_context;
    info->eos_ids = se->eos_ids;
    info->n_eos = se->n_eos;
    info->kv_blocks = se->kv_total(se->ctx);
    info->kv_block_tokens = MSM_KV_BLOCK;
    info->max_seqs = d->cfg.max_seqs;
    info->max_step_tokens = d->cfg.max_step_tokens;
    info->tokenizer = d->tok ? d->tok_path : NULL;
    info->tokenizer_vocab = d->tok ? msm_tokenizer_vocab_size(d->tok) : 0;
    if (d->tok && msm_tokenizer_vocab_size(d->tok) > se->vocab)
        msm_log_warn("the tokenizer knows %d ids, the model %d: text that encodes to an id >= %d is refused",
                     msm_tokenizer_vocab_size(d->tok), se->vocab, se->vocab);
}

/* Descriptors the daemon needs besides its connections: the listeners, libuv's, the log, the
 * model's files, the GPU driver's (a few dozen per GPU). */
#define RESERVED_FDS 256

/* The soft descriptor limit raised to the hard one, and server.max_connections kept below it: a
 * daemon out of descriptors cannot even refuse a connection with a message (accept fails, and the
 * client is reset). */
static void raise_nofile(msm_config *cfg) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)cfg->max_connections + RESERVED_FDS > rl.rlim_cur) {
        int max = rl.rlim_cur > RESERVED_FDS + 1 ? (int)(rl.rlim_cur - RESERVED_FDS) : 1;
        msm_log_warn("server.max_connections = %d does not fit the descriptor limit (RLIMIT_NOFILE %llu, %d kept "
                     "for the daemon itself): accepting at most %d connections (raise LimitNOFILE=)",
                     cfg->max_connections, (unsigned long long)rl.rlim_cur, RESERVED_FDS, max);
        cfg->max_connections = max;
    }
}

/* ---- signals during start-up (see the top of the file) ---- */

static void start_up_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

static void *sig_main(void *arg) {
    daemon_state *d = arg;
    sigset_t set;
    start_up_signals(&set);
    while (!atomic_load(&d->sig_stop)) {
        struct timespec t = {0, 50000000L};
        int sig = sigtimedwait(&set, NULL, &t);
        if (sig == SIGHUP)
            msm_log_reopen();
        if (sig == SIGTERM || sig == SIGINT) {
            msm_log_info("received %s while loading: exiting", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            msm_notify_stopping("stopped while loading");
            msm_log_close();
            _exit(0); /* nothing to drain or save yet: no client has connected */
        }
    }
    return NULL;
}

/* Blocks the start-up signals in this thread and every thread it starts later, and starts the
 * watcher. */
static void signals_to_watcher(daemon_state *d) {
    sigset_t set;
    start_up_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    atomic_init(&d->sig_stop, false);
    d->have_sig_thread = pthread_create(&d->sig_thread, NULL, sig_main, d) == 0;
}

/* The loop's handlers are installed: stop the watcher and unblock the signals on this (the loop's)
 * thread; one that arrived meanwhile is delivered now, to the loop. */
static void signals_to_loop(daemon_state *d) {
    if (!d->have_sig_thread)
        return;
    atomic_store(&d->sig_stop, true);
    pthread_join(d->sig_thread, NULL);
    d->have_sig_thread = false;
    sigset_t set;
    start_up_signals(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* Phase 7: the server, one scheduler per group, signals, the scheduler threads, the sockets;
 * READY=1; then the loop runs until the shutdown has closed every handle. */
static int serve(daemon_state *d) {
    const msm_config *cfg = &d->cfg;
    msm_err err = {{0}};
    msm_api_limits limits = {
        .vocab = d->se[0].vocab, .max_context = d->se[0].max_context, .max_tokens_default = cfg->max_tokens_default,
        .max_tokens_limit = cfg->max_tokens_limit, .max_logprobs = cfg->max_logprobs, .max_stop = cfg->max_stop,
        .tok = d->tok};
    msm_sched_opts so = {.max_step_tokens = cfg->max_step_tokens, .max_seqs = cfg->max_seqs,
                         .max_queue = cfg->max_queue};
    uv_loop_init(&d->loop);
    d->have_loop = true;
    int rc = msm_server_new(&d->loop, cfg, &limits, &d->info, d->n_groups, &d->srv, &err);
    for (int g = 0; g < d->n_groups && rc == 0; g++) {
        rc = msm_sched_new(&so, &d->se[g], msm_server_emit, msm_server_group_ctx(d->srv, g), &d->scheds[g], &err);
        if (rc == 0)
            msm_server_set_sched(d->srv, g, d->scheds[g]);
    }
    if (rc == 0 && (rc = msm_server_install_signals(d->srv, &err)) == 0)
        signals_to_loop(d);
    for (int g = 0; g < d->n_groups && rc == 0; g++)
        if (msm_sched_start(d->scheds[g]) < 0)
            rc = msm_err_set(&err, -EAGAIN, "cannot start the scheduler thread of group %d", g);
    if (rc == 0)
        rc = msm_server_listen(d->srv, &err);
    if (rc < 0) {
        msm_log_error("%s", err.msg);
        msm_notify_status("failed: %s", err.msg);
        if (d->srv) {
            msm_server_close(d->srv); /* closes what was opened; the loop below then returns */
            uv_run(&d->loop, UV_RUN_DEFAULT);
        }
        return 1;
    }
    /* READY=1 only now: every group is loaded and the sockets listen. */
    char status[1400];
    snprintf(status, sizeof status, "serving %.1200s (%s, %d TP group(s) of tp %d, vocab %d, context %d)",
             d->info.model, d->info.backend, d->n_groups, d->info.tp, d->info.vocab, d->info.max_context);
    msm_log_info("ready: %s", status);
    msm_notify_ready(status);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    return msm_server_exit_status(d->srv);
}

static void close_handle(uv_handle_t *h, void *arg) {
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Frees whatever the phases set up (any prefix of them). */
static void teardown(daemon_state *d) {
    signals_to_loop(d);
    for (int g = 0; d->scheds && g < d->n_groups; g++)
        msm_sched_free(d->scheds[g]);
    msm_server_free(d->srv); /* first: its HTTP listeners close their library's handles on the loop */
    if (d->have_loop && uv_loop_close(&d->loop) == UV_EBUSY) {
        /* a handle left open (never expected: every path closes its own) must not keep the
         * process from exiting */
        msm_log_error("internal: libuv handles left open at exit; closing them");
        uv_walk(&d->loop, close_handle, NULL);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        uv_loop_close(&d->loop);
    }
    for (int g = 0; g < d->n_groups; g++) {
        msm_engine_free(d->engines ? d->engines[g] : NULL);
        msm_fake_engine_free(d->fakes ? d->fakes[g] : NULL);
    }
    free(d->engines);
    free(d->fakes);
    free(d->se);
    free(d->scheds);
    msm_tokenizer_free(d->tok);
}

int main(int argc, char **argv) {
    static daemon_state d;
    args a;
    int status = parse_args(argc, argv, &a);
    if (status >= 0)
        return status;
    /* blocked first, before anything starts a thread: planning the groups counts GPUs, which
     * starts the CUDA runtime's threads, and a thread without them blocked would take a SIGTERM
     * with its default action (seen on the H200: exit 143 during the load); one that arrives
     * before the watcher runs stays pending for it */
    sigset_t startup;
    start_up_signals(&startup);
    pthread_sigmask(SIG_BLOCK, &startup, NULL);
    status = load_config(&a, &d);
    free(a.sets);
    if (status == 0)
        status = plan_groups(&d);
    if (status != 0 || a.check_only)
        return status != 0 ? status : check_config(&d);

    int rc = msm_log_open(d.cfg.log_file, d.cfg.log_level);
    if (rc < 0)
        fprintf(stderr, "msmoed: cannot open log.file %s: %s; logging to stderr\n", d.cfg.log_file, strerror(-rc));
    signal(SIGPIPE, SIG_IGN);
    signals_to_watcher(&d);
    raise_nofile(&d.cfg);
    msm_err err = {{0}};
    if (!a.dump_graph && validate_model(&d, &err) < 0) {
        msm_log_error("%s", err.msg);
        msm_notify_status("failed: %s", err.msg);
        status = 2;
    }
    if (status == 0)
        status = load_tokenizer(&d);
    if (status == 0)
        status = load_groups(&d, a.dump_graph);
    if (status == 0 && a.dump_graph)
        status = d.engines[0] && msm_engine_dump_graph(d.engines[0], 0, stdout) < 0 ? 1 : 0;
    else if (status == 0) {
        describe_model(&d);
        status = serve(&d);
        if (d.srv && msm_server_stuck(d.srv)) {
            /* an engine step never returned: its threads cannot be joined nor its device freed */
            msm_log_error("exiting with status 1 without tearing down the stuck group");
            msm_log_close();
            _exit(1);
        }
    }
    teardown(&d);
    if (!a.dump_graph)
        msm_log_info("exiting with status %d", status);
    msm_log_close();
    return status;
}
