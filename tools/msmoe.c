/* msmoe: the msmoed client CLI.
 *
 *   msmoe [--socket PATH | --tcp HOST:PORT] generate (TEXT | --ids 1,2,3) [--max-tokens N]
 *         [--temperature T] [--top-k K] [--top-p P] [--seed S] [--logprobs N] [--ignore-eos]
 *         [--stop-ids 5,6] [--stop STR]... [--print-ids] [--no-echo] [--no-add-special] [--parse-special]
 *   msmoe tokenize TEXT [--no-add-special] [--parse-special]
 *   msmoe detokenize 1,2,3 [--skip-special]
 *   msmoe health | info | metrics
 *
 * generate streams the reply as it arrives: text (after the prompt, for a text prompt, unless
 * --no-echo) when the daemon has a tokenizer, else — or with --print-ids or --logprobs — the token
 * ids; then it prints the finish reason and usage to stderr. TEXT "-" reads standard input. Exit status: 0 ok; 1 the server answered with an error
 * (its message is printed); 2 usage; 3 cannot reach the daemon. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_client.h"
#include "msm_metrics.h"

#define DEFAULT_SOCKET "/run/msmoed/msmoed.sock"

static void usage(FILE *f) {
    fprintf(f,
            "usage: msmoe [--socket PATH | --tcp HOST:PORT] COMMAND [options]\n"
            "commands:\n"
            "  generate (TEXT | --ids 1,2,3) [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
            "           [--seed S] [--logprobs N] [--ignore-eos] [--stop-ids 5,6] [--stop STR]...\n"
            "           [--print-ids] [--no-echo] [--no-add-special] [--parse-special]\n"
            "           streams the text (the prompt first, unless --no-echo), or the ids with --print-ids\n"
            "  tokenize TEXT [--no-add-special] [--parse-special]   the ids the daemon's tokenizer gives\n"
            "  detokenize 1,2,3 [--skip-special]                    the text of token ids\n"
            "  (TEXT - reads standard input)\n"
            "  health   daemon health\n"
            "  info     model and engine information\n"
            "  metrics  counters and gauges (Prometheus text)\n"
            "default socket: $MSMOED_SOCKET or " DEFAULT_SOCKET "\n");
}

static int parse_ids(const char *s, int32_t **ret, int *ret_n) {
    int cap = 16, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    while (*s) {
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (end == s || errno || x < INT32_MIN || x > INT32_MAX) {
            free(v);
            return -EINVAL;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *p = realloc(v, (size_t)cap * sizeof *p);
            if (!p) {
                free(v);
                return -ENOMEM;
            }
            v = p;
        }
        v[n++] = (int32_t)x;
        s = end;
        if (*s == ',')
            s++;
        else if (*s) {
            free(v);
            return -EINVAL;
        }
    }
    *ret = v;
    *ret_n = n;
    return 0;
}

static int server_error(const Msmoe__V1__Status *st) {
    fprintf(stderr, "msmoe: %s: %s\n", msm_client_code_name(st && st->has_code ? st->code : 13),
            st && st->message ? st->message : "(no message)");
    return 1;
}

/* Waits for the reply to request 1, skipping nothing else (one request per CLI call). */
static int recv_reply(msm_client *c, Msmoe__V1__ServerFrame **ret) {
    msm_err err;
    int rc = msm_client_recv(c, ret, &err);
    if (rc < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        return 3;
    }
    return 0;
}

/* TEXT, or "-" for standard input (malloc'd into *ret_buf). */
static const char *text_arg(const char *arg, char **ret_buf) {
    *ret_buf = NULL;
    if (strcmp(arg, "-"))
        return arg;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + n, 1, cap - n - 1, stdin);
        n += k;
        if (k == 0)
            break;
        if (cap - n - 1 == 0) {
            char *p = realloc(b, cap * 2);
            if (!p) {
                free(b);
                b = NULL;
                break;
            }
            b = p;
            cap *= 2;
        }
    }
    if (!b)
        return NULL;
    b[n] = 0;
    *ret_buf = b;
    return b;
}

static int cmd_generate(msm_client *c, int argc, char **argv) {
    static const struct option opts[] = {
        {"ids", required_argument, NULL, 'i'},        {"max-tokens", required_argument, NULL, 'm'},
        {"temperature", required_argument, NULL, 't'}, {"top-k", required_argument, NULL, 'k'},
        {"top-p", required_argument, NULL, 'p'},      {"seed", required_argument, NULL, 's'},
        {"logprobs", required_argument, NULL, 'l'},   {"ignore-eos", no_argument, NULL, 'e'},
        {"stop-ids", required_argument, NULL, 'S'},   {"prompt", required_argument, NULL, 'P'},
        {"stop", required_argument, NULL, 'x'},       {"print-ids", no_argument, NULL, 'I'},
        {"no-echo", no_argument, NULL, 'n'},          {"no-add-special", no_argument, NULL, 'B'},
        {"parse-special", no_argument, NULL, 'y'},    {NULL, 0, NULL, 0}};
    msm_client_gen g;
    msm_client_gen_init(&g);
    int32_t *ids = NULL, *stop = NULL;
    int n_ids = 0, n_stop = 0, n_stop_str = 0, opt, rc = 2;
    const char **stop_str = calloc((size_t)argc + 1, sizeof *stop_str);
    bool print_ids = false, echo = true;
    char *stdin_text = NULL;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'i':
            free(ids);
            if (parse_ids(optarg, &ids, &n_ids) < 0) {
                fprintf(stderr, "msmoe: --ids: expected comma-separated integers\n");
                goto out;
            }
            break;
        case 'S':
            free(stop);
            if (parse_ids(optarg, &stop, &n_stop) < 0) {
                fprintf(stderr, "msmoe: --stop-ids: expected comma-separated integers\n");
                goto out;
            }
            break;
        case 'm': g.max_tokens = atoi(optarg); break;
        case 't': g.temperature = strtof(optarg, NULL); g.set_temperature = true; break;
        case 'k': g.top_k = atoi(optarg); break;
        case 'p': g.top_p = strtof(optarg, NULL); g.set_top_p = true; break;
        case 's': g.seed = strtoll(optarg, NULL, 10); break;
        case 'l': g.logprobs = atoi(optarg); break;
        case 'e': g.ignore_eos = true; break;
        case 'P': g.prompt_text = optarg; break;
        case 'x': if (stop_str) stop_str[n_stop_str++] = optarg; break;
        case 'I': print_ids = true; break;
        case 'n': echo = false; break;
        case 'B': g.no_add_special = true; break;
        case 'y': g.parse_special = true; break;
        default: usage(stderr); goto out;
        }
    }
    if (optind < argc) {
        if (g.prompt_text || optind + 1 < argc) {
            fprintf(stderr, "msmoe: generate takes one TEXT prompt (quote it)\n");
            goto out;
        }
        if (!(g.prompt_text = text_arg(argv[optind], &stdin_text))) {
            fprintf(stderr, "msmoe: cannot read the prompt from standard input\n");
            goto out;
        }
    }
    if (!g.prompt_text && !n_ids) {
        fprintf(stderr, "msmoe: generate needs a prompt: TEXT or --ids 1,2,3\n");
        usage(stderr);
        goto out;
    }
    /* Both TEXT and --ids go out as they are: the daemon names the conflict. */
    g.prompt = ids;
    g.n_prompt = n_ids;
    g.stop_ids = stop;
    g.n_stop_ids = n_stop;
    g.stop_strings = stop_str;
    g.n_stop_strings = n_stop_str;
    msm_err err;
    if (msm_client_send_generate(c, 1, &g, &err) < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        rc = 3;
        goto out;
    }
    /* Text when the daemon sends it (it has a tokenizer), unless ids or logprobs were asked for. */
    int n_out = 0, mode = 0; /* 0: undecided, 1: text, 2: ids */
    for (;;) {
        Msmoe__V1__ServerFrame *f;
        if ((rc = recv_reply(c, &f)) != 0)
            goto out;
        if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
            if (n_out)
                printf("\n");
            rc = server_error(f->error);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            goto out;
        }
        if (f->reply_case != MSMOE__V1__SERVER_FRAME__REPLY_CHUNK) {
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            continue;
        }
        const Msmoe__V1__GenerateChunk *ch = f->chunk;
        if (!mode) {
            mode = ch->text && !print_ids && g.logprobs == 0 ? 1 : 2;
            if (mode == 1 && echo && g.prompt_text && !n_ids)
                fputs(g.prompt_text, stdout);
        }
        if (mode == 1) {
            fputs(ch->text ? ch->text : "", stdout);
            n_out += (int)ch->n_token_ids;
        }
        for (size_t i = 0; mode == 2 && i < ch->n_token_ids; i++) {
            printf("%s%d", n_out ? "," : "", ch->token_ids[i]);
            if (i < ch->n_logprobs && ch->logprobs[i]->has_logprob) {
                const Msmoe__V1__TokenLogprob *lp = ch->logprobs[i];
                printf("(%.4f", (double)lp->logprob);
                for (size_t k = 0; k < lp->n_top; k++)
                    printf("%s%d:%.4f", k ? " " : " [", lp->top[k]->token_id, (double)lp->top[k]->logprob);
                printf("%s)", lp->n_top ? "]" : "");
            }
            n_out++;
        }
        fflush(stdout);
        if (ch->has_finish_reason && ch->finish_reason != MSMOE__V1__FINISH_REASON__FINISH_NONE) {
            printf("\n");
            fflush(stdout);
            unsigned pt = ch->usage ? ch->usage->prompt_tokens : 0, ct = ch->usage ? ch->usage->completion_tokens : 0;
            fprintf(stderr, "[finish: %s, prompt %u tokens, completion %u tokens]\n",
                    msm_client_finish_name(ch->finish_reason), pt, ct);
            rc = 0;
            if (ch->finish_reason == MSMOE__V1__FINISH_REASON__FINISH_ERROR)
                rc = server_error(ch->error);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            goto out;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
out:
    free(ids);
    free(stop);
    free(stop_str);
    free(stdin_text);
    return rc;
}

/* tokenize TEXT [--no-add-special] [--parse-special]; detokenize 1,2,3 [--skip-special]. */
static int cmd_text(msm_client *c, bool tokenize, int argc, char **argv) {
    static const struct option opts[] = {
        {"no-add-special", no_argument, NULL, 'B'}, {"parse-special", no_argument, NULL, 'y'},
        {"skip-special", no_argument, NULL, 'k'},   {NULL, 0, NULL, 0}};
    bool add_special = true, parse_special = false, skip_special = false;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'B': add_special = false; break;
        case 'y': parse_special = true; break;
        case 'k': skip_special = true; break;
        default: usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "msmoe: %s\n", tokenize ? "tokenize takes one TEXT argument (quote it; - reads stdin)"
                                                : "detokenize takes one argument: comma-separated ids");
        return 2;
    }
    msm_err err;
    char *buf = NULL;
    int32_t *ids = NULL;
    int n = 0, rc;
    if (tokenize) {
        const char *text = text_arg(argv[optind], &buf);
        if (!text) {
            fprintf(stderr, "msmoe: cannot read standard input\n");
            return 2;
        }
        rc = msm_client_send_tokenize(c, 1, text, add_special, parse_special, &err);
    } else {
        if (parse_ids(argv[optind], &ids, &n) < 0) {
            fprintf(stderr, "msmoe: detokenize: expected comma-separated integers\n");
            return 2;
        }
        rc = msm_client_send_detokenize(c, 1, ids, (size_t)n, skip_special, &err);
    }
    free(buf);
    free(ids);
    if (rc < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        return 3;
    }
    Msmoe__V1__ServerFrame *f;
    if ((rc = recv_reply(c, &f)) != 0)
        return rc;
    if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
        rc = server_error(f->error);
    } else if (tokenize && f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE) {
        for (size_t i = 0; i < f->tokenize->n_ids; i++)
            printf("%s%d", i ? "," : "", f->tokenize->ids[i]);
        printf("\n");
    } else if (!tokenize && f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_DETOKENIZE) {
        printf("%s\n", f->detokenize->text ? f->detokenize->text : "");
    } else {
        fprintf(stderr, "msmoe: unexpected reply\n");
        rc = 1;
    }
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    return rc;
}

static int cmd_simple(msm_client *c, Msmoe__V1__ClientFrame__CallCase call) {
    msm_err err;
    if (msm_client_send_simple(c, 1, call, &err) < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        return 3;
    }
    Msmoe__V1__ServerFrame *f;
    int rc = recv_reply(c, &f);
    if (rc)
        return rc;
    switch (f->reply_case) {
    case MSMOE__V1__SERVER_FRAME__REPLY_ERROR:
        rc = server_error(f->error);
        break;
    case MSMOE__V1__SERVER_FRAME__REPLY_HEALTH:
        printf("%s: %s\n", f->health->serving ? "serving" : "not serving", f->health->status ? f->health->status : "");
        rc = f->health->serving ? 0 : 1;
        break;
    case MSMOE__V1__SERVER_FRAME__REPLY_MODEL_INFO: {
        const Msmoe__V1__ModelInfoReply *m = f->model_info;
        printf("model:          %s\narchitecture:   %s\nbackend:        %s\nversion:        %s\n"
               "vocab:          %u\nmax context:    %u\nlayers:         %u\nhidden:         %u\n"
               "experts:        %u (top %u)\ntp:             %u x %u group(s)\n"
               "passes:         multi_stream %s, fuse_allreduce %s\ncuda graphs:    %s\n"
               "kv blocks:      %u x %u tokens\nmax seqs:       %u\nmax step tokens: %u\neos ids:       ",
               m->model, m->architecture, m->backend, m->version, m->vocab, m->max_context, m->layers, m->hidden,
               m->experts, m->experts_per_token, m->tp, m->tp_groups, m->multi_stream ? "on" : "off",
               m->fuse_allreduce ? "on" : "off", m->cuda_graphs ? "on" : "off", m->kv_blocks,
               m->kv_block_tokens, m->max_seqs, m->max_step_tokens);
        for (size_t i = 0; i < m->n_eos_ids; i++)
            printf("%s%d", i ? "," : " ", m->eos_ids[i]);
        printf("\n");
        if (m->has_tokenizer)
            printf("tokenizer:      %s (%u ids)\n", m->tokenizer ? m->tokenizer : "?", m->tokenizer_vocab);
        else
            printf("tokenizer:      none (token ids only)\n");
        break;
    }
    case MSMOE__V1__SERVER_FRAME__REPLY_METRICS: {
        const Msmoe__V1__MetricsReply *m = f->metrics;
        msm_metric_sample *s = calloc(m->n_metrics + 1, sizeof *s);
        if (!s) {
            rc = 1;
            break;
        }
        for (size_t i = 0; i < m->n_metrics; i++) {
            s[i].name = m->metrics[i]->name;
            snprintf(s[i].labels, sizeof s[i].labels, "%s", m->metrics[i]->labels ? m->metrics[i]->labels : "");
            s[i].value = m->metrics[i]->value;
            s[i].counter = m->metrics[i]->counter;
            s[i].help = m->metrics[i]->help;
        }
        size_t len = msm_metrics_render(s, (int)m->n_metrics, NULL, 0);
        char *buf = malloc(len + 1);
        if (buf) {
            msm_metrics_render(s, (int)m->n_metrics, buf, len + 1);
            fputs(buf, stdout);
        }
        free(buf);
        free(s);
        break;
    }
    default:
        fprintf(stderr, "msmoe: unexpected reply\n");
        rc = 1;
    }
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    return rc;
}

int main(int argc, char **argv) {
    const char *address = getenv("MSMOED_SOCKET");
    char tcp[300];
    int i = 1;
    if (!address || !*address)
        address = DEFAULT_SOCKET;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            address = argv[++i];
        } else if (!strcmp(argv[i], "--tcp") && i + 1 < argc) {
            snprintf(tcp, sizeof tcp, "tcp:%s", argv[++i]);
            address = tcp;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i];
    Msmoe__V1__ClientFrame__CallCase simple = MSMOE__V1__CLIENT_FRAME__CALL__NOT_SET;
    if (!strcmp(cmd, "health"))
        simple = MSMOE__V1__CLIENT_FRAME__CALL_HEALTH;
    else if (!strcmp(cmd, "info"))
        simple = MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO;
    else if (!strcmp(cmd, "metrics"))
        simple = MSMOE__V1__CLIENT_FRAME__CALL_METRICS;
    else if (strcmp(cmd, "generate") && strcmp(cmd, "tokenize") && strcmp(cmd, "detokenize")) {
        fprintf(stderr, "msmoe: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    msm_client *c;
    msm_err err;
    if (msm_client_connect(address, &c, &err) < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        return 3;
    }
    int rc = simple                        ? cmd_simple(c, simple)
             : !strcmp(cmd, "generate") ? cmd_generate(c, argc - i, argv + i)
                                        : cmd_text(c, !strcmp(cmd, "tokenize"), argc - i, argv + i);
    msm_client_free(c);
    return rc;
}
