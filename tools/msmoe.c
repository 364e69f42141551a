/* msmoe: the msmoed client CLI.
 *
 *   msmoe [--socket PATH | --tcp HOST:PORT] generate --ids 1,2,3 [--max-tokens N] [--temperature T]
 *         [--top-k K] [--top-p P] [--seed S] [--logprobs N] [--ignore-eos] [--stop-ids 5,6]
 *   msmoe health | info | metrics
 *
 * generate streams the token ids as they arrive (text once the tokenizer is wired), then prints
 * the finish reason and usage to stderr. Exit status: 0 ok; 1 the server answered with an error
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
            "  generate --ids 1,2,3 [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
            "           [--seed S] [--logprobs N] [--ignore-eos] [--stop-ids 5,6]\n"
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

static int cmd_generate(msm_client *c, int argc, char **argv) {
    static const struct option opts[] = {
        {"ids", required_argument, NULL, 'i'},        {"max-tokens", required_argument, NULL, 'm'},
        {"temperature", required_argument, NULL, 't'}, {"top-k", required_argument, NULL, 'k'},
        {"top-p", required_argument, NULL, 'p'},      {"seed", required_argument, NULL, 's'},
        {"logprobs", required_argument, NULL, 'l'},   {"ignore-eos", no_argument, NULL, 'e'},
        {"stop-ids", required_argument, NULL, 'S'},   {"prompt", required_argument, NULL, 'P'},
        {NULL, 0, NULL, 0}};
    msm_client_gen g;
    msm_client_gen_init(&g);
    int32_t *ids = NULL, *stop = NULL;
    int n_ids = 0, n_stop = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'i':
            if (parse_ids(optarg, &ids, &n_ids) < 0) {
                fprintf(stderr, "msmoe: --ids: expected comma-separated integers\n");
                return 2;
            }
            break;
        case 'S':
            if (parse_ids(optarg, &stop, &n_stop) < 0) {
                fprintf(stderr, "msmoe: --stop-ids: expected comma-separated integers\n");
                return 2;
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
        default: usage(stderr); return 2;
        }
    }
    g.prompt = ids;
    g.n_prompt = n_ids;
    g.stop_ids = stop;
    g.n_stop_ids = n_stop;
    msm_err err;
    int rc = msm_client_send_generate(c, 1, &g, &err);
    free(ids);
    free(stop);
    if (rc < 0) {
        fprintf(stderr, "msmoe: %s\n", err.msg);
        return 3;
    }
    int n_out = 0;
    for (;;) {
        Msmoe__V1__ServerFrame *f;
        if ((rc = recv_reply(c, &f)) != 0)
            return rc;
        if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
            if (n_out)
                printf("\n");
            rc = server_error(f->error);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            return rc;
        }
        if (f->reply_case != MSMOE__V1__SERVER_FRAME__REPLY_CHUNK) {
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            continue;
        }
        const Msmoe__V1__GenerateChunk *ch = f->chunk;
        for (size_t i = 0; i < ch->n_token_ids; i++) {
            if (ch->text && ch->text[0])
                fputs(ch->text, stdout);
            else
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
            unsigned pt = ch->usage ? ch->usage->prompt_tokens : 0, ct = ch->usage ? ch->usage->completion_tokens : 0;
            fprintf(stderr, "[finish: %s, prompt %u tokens, completion %u tokens]\n",
                    msm_client_finish_name(ch->finish_reason), pt, ct);
            rc = 0;
            if (ch->finish_reason == MSMOE__V1__FINISH_REASON__FINISH_ERROR)
                rc = server_error(ch->error);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            return rc;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
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
    else if (strcmp(cmd, "generate")) {
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
    int rc = simple ? cmd_simple(c, simple) : cmd_generate(c, argc - i, argv + i);
    msm_client_free(c);
    return rc;
}
