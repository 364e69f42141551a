/* msmoed: the daemon's entry point. Reads the config, splits the node into TP groups, loads the
 * tokenizer and then the model once per group (telling systemd, group by group, while it does),
 * starts one scheduler thread per group and the libuv loop, signals READY=1 once every group is
 * resident and the sockets listen, and on SIGTERM drains and exits 0. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

/* 0 with *ret NULL when there is no tokenizer to load (a warning says what is off), 0 with *ret
 * set, or -errno with err naming the file (a broken tokenizer.json is a start-up error). */
static int load_tokenizer(const msm_config *cfg, const char *model_dir, char *path, size_t cap,
                          msm_tokenizer **ret, msm_err *err) {
    bool required;
    *ret = NULL;
    if (!tokenizer_path(cfg, model_dir, path, cap, &required)) {
        path[0] = 0;
        return 0;
    }
    if (!required && access(path, F_OK) < 0) {
        msm_log_warn("no tokenizer: %s does not exist; text prompts, text in replies, stop strings and "
                     "Tokenize/Detokenize are off (token ids work; set engine.tokenizer to enable them)", path);
        path[0] = 0;
        return 0;
    }
    int rc = msm_tokenizer_load(path, ret, err);
    if (rc < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        /* The tokenizer's message names the file. */
        return msm_err_set(err, rc, "cannot load the tokenizer: %s (engine.tokenizer = none serves ids only)",
                           why);
    }
    return 0;
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
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
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"set", required_argument, NULL, 's'},
        {"check-config", no_argument, NULL, 'k'}, {"dump-graph", no_argument, NULL, 'g'},
        {"version", no_argument, NULL, 'V'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *config_path = NULL;
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0, opt;
    bool check_only = false, dump_graph = false;
    while ((opt = getopt_long(argc, argv, "c:s:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case 's': sets[n_sets++] = optarg; break;
        case 'k': check_only = true; break;
        case 'g': dump_graph = true; break;
        case 'V': printf("msmoed %s\n", MSM_VERSION); free(sets); return 0;
        case 'h': usage(stdout); free(sets); return 0;
        default: usage(stderr); free(sets); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "msmoed: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        free(sets);
        return 2;
    }

    /* Configuration: defaults < file < --set. */
    static msm_config cfg;
    msm_err err = {{0}};
    msm_config_defaults(&cfg);
    char default_path[PATH_MAX];
    snprintf(default_path, sizeof default_path, "%s/msmoed/msmoed.conf", MSM_SYSCONFDIR);
    if (!config_path && access(default_path, F_OK) == 0)
        config_path = default_path;
    if (config_path && msm_config_load(&cfg, config_path, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        free(sets);
        return 2;
    }
    for (int i = 0; i < n_sets; i++)
        if (msm_config_set(&cfg, sets[i], &err) < 0) {
            fprintf(stderr, "msmoed: %s\n", err.msg);
            free(sets);
            return 2;
        }
    free(sets);
    if (msm_config_check(&cfg, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    bool fake = strcmp(cfg.backend, "fake") == 0;
    char model_dir[PATH_MAX] = "";
    if (!fake && !cfg.dummy_preset[0] && msm_config_model_dir(&cfg, model_dir, sizeof model_dir, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    /* The TP groups: engine.gpus cut in runs of engine.tp on CUDA, engine.replicas on the CPU. */
    msm_engine_opts eo;
    msm_config_engine_opts(&cfg, &eo);
    bool cuda = !fake && eo.backend == MSM_BACKEND_CUDA;
    static msm_group_plan plan;
    int n_visible = cuda ? msm_config_visible_gpus() : -1;
    if (n_visible == -ENOTSUP) {
        fprintf(stderr, "msmoed: engine.backend = cuda, but this build has no CUDA backend (built with -Dcuda=disabled)\n");
        return 2;
    }
    if (msm_config_plan_groups(&cfg, cuda, n_visible, &plan, &err) < 0) {
        fprintf(stderr, "msmoed: %s\n", err.msg);
        return 2;
    }
    if (check_only) {
        if (model_dir[0]) {
            char p[PATH_MAX + 16];
            snprintf(p, sizeof p, "%s/config.json", model_dir);
            if (access(p, R_OK) < 0) {
                fprintf(stderr, "msmoed: model %s: cannot read %s: %s\n", model_dir, p, strerror(errno));
                return 2;
            }
        }
        char tp[PATH_MAX + 32];
        bool required;
        if (tokenizer_path(&cfg, model_dir, tp, sizeof tp, &required) && (required || access(tp, F_OK) == 0)) {
            msm_tokenizer *t = NULL;
            if (msm_tokenizer_load(tp, &t, &err) < 0) {
                fprintf(stderr, "msmoed: cannot load the tokenizer: %s\n", err.msg);
                return 2;
            }
            msm_tokenizer_free(t);
        }
        printf("msmoed: configuration OK (%s; model %s; %d TP group(s) of tp %d)\n",
               config_path ? config_path : "built-in defaults",
               fake ? "fake" : cfg.dummy_preset[0] ? cfg.dummy_preset : model_dir, plan.n_groups, cfg.tp);
        return 0;
    }

    int rc = msm_log_open(cfg.log_file, cfg.log_level);
    if (rc < 0)
        fprintf(stderr, "msmoed: cannot open log.file %s: %s; logging to stderr\n", cfg.log_file, strerror(-rc));
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();

    /* The tokenizer first: it is quick, and a broken file should not wait for the model. */
    static char tok_path[PATH_MAX + 32];
    msm_tokenizer *tok = NULL;
    if ((rc = load_tokenizer(&cfg, model_dir, tok_path, sizeof tok_path, &tok, &err)) < 0) {
        msm_log_error("%s", err.msg);
        msm_notify_status("failed: %s", err.msg);
        msm_log_close();
        return 1;
    }
    if (tok)
        msm_log_info("tokenizer %s: %d ids", tok_path, msm_tokenizer_vocab_size(tok));

    /* Load the model once per group, one group after the other (each with its own STATUS=). */
    int n_groups = dump_graph ? 1 : plan.n_groups;
    msm_engine **engines = calloc((size_t)n_groups, sizeof *engines);
    msm_fake_engine **fks = calloc((size_t)n_groups, sizeof *fks);
    msm_sched_engine *se = calloc((size_t)n_groups, sizeof *se);
    msm_sched **scheds = calloc((size_t)n_groups, sizeof *scheds);
    msm_api_model_info info = {0};
    uv_loop_t loop;
    bool have_loop = false;
    msm_server *srv = NULL;
    int exit_code = 0;
    const char *what = fake ? "fake engine" : cfg.dummy_preset[0] ? cfg.dummy_preset : model_dir;
    char status[1400];
    if (!engines || !fks || !se || !scheds) {
        msm_log_error("out of memory");
        exit_code = 1;
        goto out;
    }
    msm_log_info("msmoed %s: loading %s in %d TP group(s) of tp %d", MSM_VERSION, what, n_groups, cfg.tp);
    for (int g = 0; g < n_groups; g++) {
        char where[64];
        if (cuda && cfg.tp > 1)
            snprintf(where, sizeof where, "GPUs %d-%d", plan.first_device[g], plan.first_device[g] + cfg.tp - 1);
        else if (cuda)
            snprintf(where, sizeof where, "GPU %d", plan.first_device[g]);
        else
            snprintf(where, sizeof where, "%s", fake ? "fake" : "CPU");
        snprintf(status, sizeof status, "loading %.1200s: group %d/%d (%s)", what, g + 1, n_groups, where);
        msm_log_info("%s", status);
        msm_notify_status("%s", status);
        msm_notify_loading *loading = NULL;
        msm_notify_loading_start(status, 5, &loading);
        eo.load_progress = notify_load_progress;
        eo.load_progress_ctx = loading;
        if (fake) {
            const char *delay = getenv("MSMOED_FAKE_STEP_US");
            msm_fake_engine_opts fo = {.vocab = 512, .max_context = cfg.max_context ? cfg.max_context : 2048,
                                       .kv_blocks = cfg.kv_blocks, .eos_id = -1,
                                       .max_step_tokens = cfg.max_step_tokens, .max_seqs = cfg.max_seqs,
                                       .step_delay_us = delay ? atoi(delay) : 0};
            rc = msm_fake_engine_new(&fo, &fks[g]);
            if (rc < 0)
                msm_err_set(&err, rc, "fake engine: %s", strerror(-rc));
            else
                msm_fake_engine_vtable(fks[g], &se[g]);
        } else {
            eo.model_dir = cfg.dummy_preset[0] ? NULL : model_dir;
            eo.first_device = plan.first_device[g];
            rc = msm_engine_new(&eo, &engines[g], &err);
            if (rc == 0)
                msm_sched_engine_from(&se[g], engines[g]);
            if (rc == 0)
                log_load_summary(g, msm_engine_load_summary(engines[g]));
        }
        msm_notify_loading_stop(loading);
        if (rc < 0) {
            if (n_groups > 1)
                msm_log_error("group %d (%s): cannot load the model: %s", g, where, err.msg);
            else
                msm_log_error("cannot load the model: %s", err.msg);
            msm_notify_status("failed: group %d (%s): %s", g, where, err.msg);
            exit_code = 1;
            goto out;
        }
        se[g].tok = tok;
    }
    if (dump_graph) {
        rc = engines[0] ? msm_engine_dump_graph(engines[0], 0, stdout) : 0;
        exit_code = rc < 0 ? 1 : 0;
        goto out;
    }
    if (tok && msm_tokenizer_vocab_size(tok) > se[0].vocab)
        msm_log_warn("the tokenizer knows %d ids, the model %d: text that encodes to an id >= %d is refused",
                     msm_tokenizer_vocab_size(tok), se[0].vocab, se[0].vocab);

    if (engines[0]) {
        const msm_model_config *mc = msm_engine_model(engines[0]);
        const msm_engine_opts *o0 = msm_engine_options(engines[0]);
        info.architecture = mc->arch_name;
        info.backend = msm_engine_backend_name(engines[0]);
        info.hidden = mc->hidden;
        info.layers = mc->n_layers;
        info.experts = mc->n_experts;
        info.experts_per_token = mc->top_k;
        info.tp = o0->tp;
        info.multi_stream = o0->multi_stream;
        info.fuse_allreduce = o0->fuse_allreduce;
        info.cuda_graphs = o0->cuda_graphs && o0->backend == MSM_BACKEND_CUDA;
    } else {
        info.architecture = "fake";
        info.backend = "fake";
        info.tp = 1;
    }
    /* Sizes are per group: a request lives in one group's KV pool and batch. */
    info.model = what;
    info.version = MSM_VERSION;
    info.tp_groups = n_groups;
    info.vocab = se[0].vocab;
    info.max_context = se[0].max_context;
    info.eos_ids = se[0].eos_ids;
    info.n_eos = se[0].n_eos;
    info.kv_blocks = se[0].kv_total(se[0].ctx);
    info.kv_block_tokens = 16;
    info.max_seqs = cfg.max_seqs;
    info.max_step_tokens = cfg.max_step_tokens;
    info.tokenizer = tok ? tok_path : NULL;
    info.tokenizer_vocab = tok ? msm_tokenizer_vocab_size(tok) : 0;

    msm_api_limits limits = {
        .vocab = se[0].vocab, .max_context = se[0].max_context, .max_tokens_default = cfg.max_tokens_default,
        .max_tokens_limit = cfg.max_tokens_limit, .max_logprobs = cfg.max_logprobs, .max_stop = cfg.max_stop,
        .tok = tok};

    uv_loop_init(&loop);
    have_loop = true;
    msm_sched_opts so = {.max_step_tokens = cfg.max_step_tokens, .max_seqs = cfg.max_seqs,
                         .max_queue = cfg.max_queue};
    if ((rc = msm_server_new(&loop, &cfg, &limits, &info, n_groups, &srv, &err)) < 0) {
        msm_log_error("%s", err.msg);
        exit_code = 1;
        goto out;
    }
    for (int g = 0; g < n_groups; g++) {
        if ((rc = msm_sched_new(&so, &se[g], msm_server_emit, msm_server_group_ctx(srv, g), &scheds[g], &err)) < 0) {
            msm_log_error("%s", err.msg);
            exit_code = 1;
            goto out;
        }
        msm_server_set_sched(srv, g, scheds[g]);
    }
    rc = msm_server_install_signals(srv, &err);
    for (int g = 0; g < n_groups && rc == 0; g++)
        if (msm_sched_start(scheds[g]) < 0)
            rc = msm_err_set(&err, -EAGAIN, "cannot start the scheduler thread of group %d", g);
    if (rc == 0)
        rc = msm_server_listen(srv, &err);
    if (rc < 0) {
        msm_log_error("%s", err.msg);
        msm_notify_status("failed: %s", err.msg);
        exit_code = 1;
        msm_server_shutdown(srv); /* closes what was opened; uv_run below returns */
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out;
    }
    /* READY=1 only now: every group is loaded and the sockets listen. */
    snprintf(status, sizeof status, "serving %.1200s (%s, %d TP group(s) of tp %d, vocab %d, context %d)", info.model,
             info.backend, n_groups, info.tp, info.vocab, info.max_context);
    msm_log_info("ready: %s", status);
    msm_notify_ready(status);
    uv_run(&loop, UV_RUN_DEFAULT);
out:
    for (int g = 0; scheds && g < n_groups; g++)
        msm_sched_free(scheds[g]);
    if (have_loop && uv_loop_close(&loop) == UV_EBUSY) {
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
    msm_server_free(srv);
    for (int g = 0; g < n_groups; g++) {
        msm_engine_free(engines ? engines[g] : NULL);
        msm_fake_engine_free(fks ? fks[g] : NULL);
    }
    free(engines);
    free(fks);
    free(se);
    free(scheds);
    msm_tokenizer_free(tok);
    if (!dump_graph)
        msm_log_info("exiting with status %d", exit_code);
    msm_log_close();
    return exit_code;
}
