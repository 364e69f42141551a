/* msmoe-eval: GSM8K and MMLU accuracy over the msmoed API, and A/B comparison of two runs.
 *
 *   msmoe-eval gsm8k [options]   8-shot chain of thought (lm-evaluation-harness gsm8k-cot), greedy;
 *                                answer = first number after the last "The answer is", else the
 *                                last number; exact match on the reference's "#### N".
 *   msmoe-eval mmlu [options]    5-shot from the dev split per subject (Hendrycks et al. format);
 *                                one generated token with top-n logprobs; the answer is the letter
 *                                whose " A"/" B"/" C"/" D" token has the highest logprob.
 *   msmoe-eval compare A.json B.json [--min-agreement X] [--max-items N]
 *
 * Requests go out with many in flight (--concurrency) over one or a few connections
 * (--connections), matched back by request id. The report (--output) holds the daemon's
 * ModelInfo, the settings, the summary and one record per item.
 *
 * MMLU needs the token ids of " A".." D": they are encoded here with the model's tokenizer.json
 * (the directory ModelInfo.model names, or --tokenizer FILE), as the difference between the ids of
 * "Answer: X" and of "Answer:", so the ids are those the model sees after the prompt's "Answer:".
 *
 * Exit status: 0 done (whatever the accuracy); 1 the run failed (every request refused, the
 * connection lost) or, for compare, agreement below --min-agreement; 2 usage or a bad file;
 * 3 cannot reach the daemon. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "msm_client.h"
#include "msm_eval.h"
#include "msm_tokenizer.h"

#define DEFAULT_SOCKET "/run/msmoed/msmoed.sock"
#define MODEL_INFO_ID UINT64_C(0x4000000000000000)
#define MAX_CONNECTIONS 64

#ifndef MSM_SOURCE_ROOT
#define MSM_SOURCE_ROOT ""
#endif
#ifndef MSM_DATADIR
#define MSM_DATADIR "/usr/local/share"
#endif

/* GSM8K generation stops where lm-evaluation-harness's gsm8k-cot stops: at the next "Q:" (the
 * model starting another exemplar) or an end-of-turn marker. */
static const char *const gsm8k_stops[] = {"Q:", "</s>", "<|im_end|>"};

typedef struct opts {
    const char *address;
    const char *data_dir;
    const char *output;
    const char *subjects;
    const char *tokenizer;
    int limit;          /* < 0: all */
    int shots;          /* < 0: the task's default */
    int concurrency;
    int connections;
    int max_tokens;
    int logprobs;
    int timeout_s;
    bool quiet;
    bool prompt_ids;    /* tokenize here and send prompt_ids (daemons without text support) */
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: msmoe-eval gsm8k|mmlu [options]\n"
            "       msmoe-eval compare A.json B.json [--min-agreement X] [--max-items N]\n"
            "options of gsm8k and mmlu:\n"
            "  --socket PATH       daemon Unix socket (default $MSMOED_SOCKET or " DEFAULT_SOCKET ")\n"
            "  --tcp HOST:PORT     daemon TCP address instead\n"
            "  --limit N           evaluate the first N items only (MMLU: in subject order)\n"
            "  --subjects A,B      MMLU subjects (default: all 57)\n"
            "  --shots K           few-shot exemplars (default: gsm8k 8, mmlu 5)\n"
            "  --concurrency N     requests in flight (default 16)\n"
            "  --connections N     connections to spread them over (default 1)\n"
            "  --max-tokens N      gsm8k: generated tokens per item (default 256)\n"
            "  --logprobs N        mmlu: top-n logprobs to request (default 20)\n"
            "  --tokenizer FILE    mmlu: tokenizer.json for the letter ids (default: ModelInfo.model/tokenizer.json)\n"
            "  --data DIR          data directory (default $MSMOE_EVAL_DATA, the source tree's data/eval,\n"
            "                      or " MSM_DATADIR "/msmoed/eval)\n"
            "  --output FILE       write the JSON report there\n"
            "  --timeout S         seconds to wait for a reply before giving up (default 600)\n"
            "  --quiet             no progress output\n"
            "  --prompt-ids        tokenize prompts here (with the tokenizer above) and send token ids, for a\n"
            "                      daemon without text support; outputs are decoded here and GSM8K's stop\n"
            "                      strings applied afterwards (generation runs to --max-tokens)\n"
            "compare: accuracy of each report, agreement (same extracted answer), differing items with\n"
            "  both outputs and the first differing token; exit 1 when agreement < --min-agreement (0..1).\n");
}

/* snprintf for paths; the data directory's length is checked once (find_data_dir), so paths
 * under it fit. */
__attribute__((format(printf, 3, 4))) static void pathf(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- Data ---- */

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static const char *find_data_dir(const char *given, char *buf, size_t cap) {
    if (given)
        return given;
    const char *env = getenv("MSMOE_EVAL_DATA");
    if (env && *env)
        return env;
    if (MSM_SOURCE_ROOT[0]) {
        snprintf(buf, cap, "%s/data/eval", MSM_SOURCE_ROOT);
        if (is_dir(buf))
            return buf;
    }
    snprintf(buf, cap, "%s/msmoed/eval", MSM_DATADIR);
    return buf;
}

static int read_file(const char *path, char **ret, size_t *ret_len, msm_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return msm_err_set(err, -errno, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return msm_err_set(err, -ENOMEM, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        cap *= 2;
        char *p = realloc(buf, cap);
        if (!p)
            free(buf);
        buf = p;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return msm_err_set(err, -EIO, "%s: read error", path);
    }
    buf[n] = 0;
    *ret = buf;
    *ret_len = n;
    return 0;
}

/* Reads a JSON Lines file into an array of objects (blank lines skipped). */
static int read_jsonl(const char *path, json_object **ret, msm_err *err) {
    char *buf;
    size_t len;
    int rc = read_file(path, &buf, &len, err);
    if (rc < 0)
        return rc;
    json_object *arr = json_object_new_array();
    int line = 0;
    for (char *p = buf, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        line++;
        nl = strchr(p, '\n');
        if (nl)
            *nl = 0;
        if (strspn(p, " \t\r") == strlen(p))
            continue;
        enum json_tokener_error je;
        json_object *o = json_tokener_parse_verbose(p, &je);
        if (!o || !json_object_is_type(o, json_type_object)) {
            json_object_put(o);
            json_object_put(arr);
            free(buf);
            return msm_err_set(err, -EINVAL, "%s:%d: not a JSON object (%s)", path, line,
                               o ? "another JSON value" : json_tokener_error_desc(je));
        }
        json_object_array_add(arr, o);
    }
    free(buf);
    *ret = arr;
    return 0;
}

static const char *jstr(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v) : NULL;
}

/* Grows the item array by one zeroed item. */
static msm_eval_item *new_item(msm_eval_item **items, int *n, int *cap) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        msm_eval_item *p = realloc(*items, (size_t)nc * sizeof *p);
        if (!p)
            return NULL;
        *items = p;
        *cap = nc;
    }
    msm_eval_item *it = &(*items)[(*n)++];
    memset(it, 0, sizeof *it);
    return it;
}

static int load_gsm8k(const char *dir, const opts *o, msm_eval_item **ret, int *ret_n, msm_err *err) {
    char path[4096];
    json_object *shots = NULL, *test = NULL;
    pathf(path, sizeof path, "%s/gsm8k/fewshot.jsonl", dir);
    int rc = read_jsonl(path, &shots, err);
    if (rc < 0)
        return rc;
    int k = o->shots < 0 ? 8 : o->shots;
    if ((size_t)k > json_object_array_length(shots)) {
        rc = msm_err_set(err, -EINVAL, "--shots %d: %s has only %zu exemplars", k, path,
                         json_object_array_length(shots));
        goto out;
    }
    const char *sq[64], *sa[64];
    for (int i = 0; i < k; i++) {
        json_object *s = json_object_array_get_idx(shots, (size_t)i);
        sq[i] = jstr(s, "question");
        sa[i] = jstr(s, "target");
        if (!sq[i] || !sa[i]) {
            rc = msm_err_set(err, -EINVAL, "%s:%d: needs \"question\" and \"target\" strings", path, i + 1);
            goto out;
        }
    }
    pathf(path, sizeof path, "%s/gsm8k/test.jsonl", dir);
    if ((rc = read_jsonl(path, &test, err)) < 0)
        goto out;
    int n_test = (int)json_object_array_length(test);
    int n = o->limit >= 0 && o->limit < n_test ? o->limit : n_test, n_items = 0, cap = 0;
    msm_eval_item *items = NULL;
    for (int i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(test, (size_t)i);
        const char *q = jstr(t, "question"), *a = jstr(t, "answer");
        msm_eval_item *it = new_item(&items, &n_items, &cap);
        if (!it) {
            rc = msm_err_set(err, -ENOMEM, "out of memory");
            break;
        }
        if (!q || !a) {
            rc = msm_err_set(err, -EINVAL, "%s:%d: needs \"question\" and \"answer\" strings", path, i + 1);
            break;
        }
        if (msm_eval_gsm8k_reference(a, it->reference, sizeof it->reference) < 0) {
            rc = msm_err_set(err, -EINVAL, "%s:%d: the answer has no \"#### N\" number", path, i + 1);
            break;
        }
        snprintf(it->id, sizeof it->id, "gsm8k/test/%d", i);
        if ((rc = msm_eval_gsm8k_prompt(sq, sa, k, q, &it->prompt)) < 0) {
            msm_err_set(err, rc, "out of memory");
            break;
        }
    }
    if (rc < 0) {
        for (int i = 0; i < n_items; i++)
            msm_eval_item_done(&items[i]);
        free(items);
    } else {
        *ret = items;
        *ret_n = n_items;
    }
out:
    json_object_put(shots);
    json_object_put(test);
    return rc;
}

static int load_csv(const char *path, msm_eval_csv *ret, msm_err *err) {
    char *buf;
    size_t len;
    int rc = read_file(path, &buf, &len, err);
    if (rc < 0)
        return rc;
    rc = msm_eval_csv_parse(buf, len, path, ret, err);
    free(buf);
    return rc;
}

/* Whether name is in the comma-separated list (NULL: every name is). */
static bool in_list(const char *list, const char *name) {
    if (!list)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && strncmp(p, name, n) == 0)
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

static int load_mmlu(const char *dir, const opts *o, msm_eval_item **ret, int *ret_n, msm_err *err) {
    char path[4096];
    pathf(path, sizeof path, "%s/mmlu/subjects.tsv", dir);
    char *tsv;
    size_t len;
    int rc = read_file(path, &tsv, &len, err);
    if (rc < 0)
        return rc;
    /* Every name in --subjects must exist. */
    if (o->subjects) {
        char *copy = strdup(o->subjects);
        for (char *save = NULL, *s = strtok_r(copy, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
            char pat[256];
            snprintf(pat, sizeof pat, "\n%s\t", s);
            if (!strstr(tsv, pat)) {
                rc = msm_err_set(err, -EINVAL, "--subjects: no subject \"%s\" in %s", s, path);
                break;
            }
        }
        free(copy);
        if (rc < 0) {
            free(tsv);
            return rc;
        }
    }
    int k = o->shots < 0 ? 5 : o->shots, n_items = 0, cap = 0;
    msm_eval_item *items = NULL;
    char *save = NULL;
    bool first = true;
    for (char *line = strtok_r(tsv, "\n", &save); line && rc == 0; line = strtok_r(NULL, "\n", &save)) {
        if (first) { /* header: subject, test, dev */
            first = false;
            continue;
        }
        char *tab = strchr(line, '\t');
        if (tab)
            *tab = 0;
        if (!*line || !in_list(o->subjects, line))
            continue;
        if (o->limit >= 0 && n_items >= o->limit)
            break;
        const char *subject = line;
        msm_eval_csv dev = {0}, test = {0};
        pathf(path, sizeof path, "%s/mmlu/dev/%s_dev.csv", dir, subject);
        if ((rc = load_csv(path, &dev, err)) < 0)
            break;
        msm_eval_mcq shots[16];
        if (k > dev.n_rows || k > 16)
            rc = msm_err_set(err, -EINVAL, "--shots %d: %s has %d rows", k, path, dev.n_rows);
        for (int i = 0; rc == 0 && i < k; i++)
            rc = msm_eval_mcq_from_row(dev.fields[i], dev.n_fields[i], path, i, &shots[i], err);
        pathf(path, sizeof path, "%s/mmlu/test/%s_test.csv", dir, subject);
        if (rc == 0)
            rc = load_csv(path, &test, err);
        for (int i = 0; rc == 0 && i < test.n_rows; i++) {
            if (o->limit >= 0 && n_items >= o->limit)
                break;
            msm_eval_mcq q;
            if ((rc = msm_eval_mcq_from_row(test.fields[i], test.n_fields[i], path, i, &q, err)) < 0)
                break;
            msm_eval_item *it = new_item(&items, &n_items, &cap);
            if (!it || msm_eval_mmlu_prompt(subject, shots, k, &q, &it->prompt) < 0) {
                rc = msm_err_set(err, -ENOMEM, "out of memory");
                break;
            }
            snprintf(it->id, sizeof it->id, "mmlu/%s/%d", subject, i);
            snprintf(it->subject, sizeof it->subject, "%s", subject);
            it->reference[0] = q.answer;
            it->reference[1] = 0;
        }
        msm_eval_csv_done(&dev);
        msm_eval_csv_done(&test);
    }
    free(tsv);
    if (rc == 0 && n_items == 0)
        rc = msm_err_set(err, -EINVAL, "no MMLU items selected");
    if (rc < 0) {
        for (int i = 0; i < n_items; i++)
            msm_eval_item_done(&items[i]);
        free(items);
        return rc;
    }
    *ret = items;
    *ret_n = n_items;
    return 0;
}

/* ---- Talking to the daemon ---- */

typedef struct run {
    const opts *o;
    bool mmlu;
    msm_eval_item *items;
    int n;
    msm_tokenizer *tok;    /* MMLU letters and --prompt-ids; NULL otherwise */
    int32_t letters[4];    /* MMLU: the ids scored for A..D (msm_eval_mmlu_letter_ids, eval/mmlu.c) */
    bool letters_exact;
    msm_client *conn[MAX_CONNECTIONS];
    int n_conn;
    int *owner;            /* [n] connection an item went out on, -1 before */
    int next, inflight, done, correct, errors;
    char first_error[600];
    int distinct_errors_shown;
    /* Progress. */
    bool tty;
    double t0, last_print;
    int printed_done;
} run;

static int send_item(run *r, int i, msm_err *err) {
    msm_eval_item *it = &r->items[i];
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__GenerateRequest g = MSMOE__V1__GENERATE_REQUEST__INIT;
    Msmoe__V1__SamplingParams sp = MSMOE__V1__SAMPLING_PARAMS__INIT;
    f.has_request_id = 1;
    f.request_id = (uint64_t)i + 1;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_GENERATE;
    f.generate = &g;
    int32_t *ids = NULL;
    if (r->o->prompt_ids) {
        size_t n = 0;
        int rc = msm_tokenizer_encode_flags(r->tok, it->prompt, strlen(it->prompt), MSM_TOK_ADD_SPECIAL, &ids, &n, err);
        if (rc < 0)
            return rc;
        g.n_prompt_ids = n;
        g.prompt_ids = ids;
    } else {
        g.prompt_text = it->prompt;
    }
    sp.has_temperature = 1; /* greedy */
    sp.temperature = 0;
    g.sampling = &sp;
    g.has_max_tokens = 1;
    if (r->mmlu) {
        g.max_tokens = 1;
        g.has_logprobs = 1;
        g.logprobs = (uint32_t)r->o->logprobs;
    } else {
        g.max_tokens = (uint32_t)r->o->max_tokens;
        if (!r->o->prompt_ids) {
            g.n_stop_strings = sizeof gsm8k_stops / sizeof *gsm8k_stops;
            g.stop_strings = (char **)gsm8k_stops;
        }
    }
    int c = i % r->n_conn;
    r->owner[i] = c;
    int rc = msm_client_send(r->conn[c], &f, err);
    free(ids);
    return rc;
}

static void fmt_dur(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0)
        snprintf(buf, cap, "?");
    else if (s < 60)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, cap, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

static void progress(run *r, bool final) {
    if (r->o->quiet)
        return;
    double t = now_s(), el = t - r->t0;
    double rate = el > 0 ? r->done / el : 0;
    double eta = rate > 0 ? (r->n - r->done) / rate : NAN;
    char e1[32], e2[32];
    fmt_dur(el, e1, sizeof e1);
    fmt_dur(eta, e2, sizeof e2);
    double acc = r->done ? (double)r->correct / r->done : 0;
    if (r->tty) {
        if (!final && t - r->last_print < 0.1)
            return;
        int w = 30, fill = r->n ? (int)((long)w * r->done / r->n) : w;
        char bar[64];
        for (int k = 0; k < w; k++)
            bar[k] = k < fill ? '#' : '.';
        bar[w] = 0;
        fprintf(stderr, "\r[%s] %d/%d %5.1f%% %.2f it/s elapsed %s ETA %s acc %.3f%s", bar, r->done,
                r->n, r->n ? 100.0 * r->done / r->n : 100.0, rate, e1, final ? "0s" : e2, acc,
                final ? "\n" : "   ");
    } else {
        int step = r->n / 10 > 0 ? r->n / 10 : 1;
        if (!final && r->done % step != 0 && t - r->last_print < 10)
            return;
        if (final && r->done == r->printed_done)
            return;
        r->printed_done = r->done;
        fprintf(stderr, "msmoe-eval: %d/%d items, %.2f it/s, elapsed %s, ETA %s, accuracy so far %.3f\n",
                r->done, r->n, rate, e1, final ? "0s" : e2, acc);
    }
    r->last_print = t;
}

/* With --prompt-ids: ends the ids where the daemon's stop strings would have, and decodes them. */
static int decode_here(run *r, msm_eval_item *it, msm_err *err) {
    int keep = it->n_ids, rc;
    if (!r->mmlu && (rc = msm_eval_ids_until_stop(r->tok, it->ids, it->n_ids, gsm8k_stops,
                                                  (int)(sizeof gsm8k_stops / sizeof *gsm8k_stops), &keep, err)) < 0)
        return rc;
    it->n_ids = keep;
    char *text = NULL;
    size_t len = 0;
    if ((rc = msm_tokenizer_decode(r->tok, it->ids, (size_t)it->n_ids, true, &text, &len, err)) < 0)
        return rc;
    it->output_len = 0;
    rc = msm_eval_item_add_text(it, text, len);
    free(text);
    return rc < 0 ? msm_err_set(err, rc, "out of memory") : 0;
}

static void judge(run *r, msm_eval_item *it) {
    if (!it->error && !r->mmlu) {
        if (it->output)
            it->output_len = msm_eval_cut_at_stop(it->output, it->output_len, gsm8k_stops,
                                                  (int)(sizeof gsm8k_stops / sizeof *gsm8k_stops));
        it->has_answer = msm_eval_gsm8k_extract(it->output ? it->output : "", it->answer, sizeof it->answer) == 0;
        it->correct = it->has_answer && strcmp(it->answer, it->reference) == 0;
    }
    if (!it->error && r->mmlu)
        it->correct = it->has_answer && strcmp(it->answer, it->reference) == 0;
    r->correct += it->correct;
}

static void item_error(run *r, msm_eval_item *it, const Msmoe__V1__Status *st) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s: %s", msm_client_code_name(st && st->has_code ? st->code : 13),
             st && st->message ? st->message : "(no message)");
    free(it->error);
    it->error = strdup(msg);
    r->errors++;
    if (!r->first_error[0] || (strcmp(r->first_error, msg) != 0 && r->distinct_errors_shown < 3)) {
        if (r->tty && !r->o->quiet)
            fputc('\n', stderr);
        fprintf(stderr, "msmoe-eval: %s: the daemon refused it: %s\n", it->id, msg);
        r->distinct_errors_shown++;
        if (!r->first_error[0])
            memcpy(r->first_error, msg, sizeof r->first_error);
    }
}

/* Takes one frame into its item. */
static int on_frame(run *r, int conn, Msmoe__V1__ServerFrame *f, msm_err *err) {
    uint64_t id = f->request_id;
    if (id == 0 && f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR)
        return msm_err_set(err, -EPROTO, "the daemon rejected the connection: %s",
                           f->error && f->error->message ? f->error->message : "(no message)");
    if (id < 1 || id > (uint64_t)r->n || r->owner[id - 1] != conn || r->items[id - 1].done)
        return 0; /* not ours (or a late frame of a finished request): ignore */
    msm_eval_item *it = &r->items[id - 1];
    bool finished = false;
    if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
        item_error(r, it, f->error);
        it->finish_reason = MSMOE__V1__FINISH_REASON__FINISH_ERROR;
        finished = true;
    } else if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_CHUNK) {
        const Msmoe__V1__GenerateChunk *c = f->chunk;
        if (msm_eval_item_add_ids(it, c->token_ids, c->n_token_ids) < 0 ||
            (c->text && msm_eval_item_add_text(it, c->text, strlen(c->text)) < 0))
            return msm_err_set(err, -ENOMEM, "out of memory");
        if (r->mmlu && !it->has_letter_lp && c->n_logprobs > 0) {
            it->has_letter_lp = true;
            int k = msm_eval_mmlu_pick(c->logprobs[0], r->letters, it->letter_lp);
            if (k >= 0) {
                it->answer[0] = (char)('A' + k);
                it->answer[1] = 0;
                it->has_answer = true;
            }
        }
        if (c->has_finish_reason && c->finish_reason != MSMOE__V1__FINISH_REASON__FINISH_NONE) {
            it->finish_reason = c->finish_reason;
            if (c->usage) {
                it->prompt_tokens = c->usage->prompt_tokens;
                it->completion_tokens = c->usage->completion_tokens;
            }
            if (c->finish_reason == MSMOE__V1__FINISH_REASON__FINISH_ERROR ||
                c->finish_reason == MSMOE__V1__FINISH_REASON__FINISH_CANCELLED) {
                Msmoe__V1__Status cancelled = MSMOE__V1__STATUS__INIT;
                cancelled.has_code = 1;
                cancelled.code = MSMOE__V1__CODE__CANCELLED;
                cancelled.message = "the request was cancelled (daemon shutting down?)";
                item_error(r, it, c->error ? c->error : &cancelled);
            }
            finished = true;
        }
    } else {
        return 0;
    }
    if (finished) {
        if (r->mmlu && !it->error && !it->has_letter_lp) {
            Msmoe__V1__Status st = MSMOE__V1__STATUS__INIT;
            st.message = "the reply carried no logprobs";
            item_error(r, it, &st);
        }
        int rc;
        if (r->o->prompt_ids && !it->error && (rc = decode_here(r, it, err)) < 0)
            return msm_err_wrap(err, rc, "%s: decoding the output", it->id);
        it->done = true;
        judge(r, it);
        r->done++;
        r->inflight--;
        progress(r, false);
    }
    return 0;
}

static int run_all(run *r, msm_err *err) {
    int rc;
    struct pollfd pfd[MAX_CONNECTIONS];
    while (r->done < r->n) {
        while (r->inflight < r->o->concurrency && r->next < r->n) {
            if ((rc = send_item(r, r->next, err)) < 0)
                return msm_err_wrap(err, rc, "sending %s", r->items[r->next].id);
            r->next++;
            r->inflight++;
        }
        for (int c = 0; c < r->n_conn; c++)
            pfd[c] = (struct pollfd){.fd = msm_client_fd(r->conn[c]), .events = POLLIN};
        int k = poll(pfd, (nfds_t)r->n_conn, r->o->timeout_s * 1000);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return msm_err_set(err, -errno, "poll: %s", strerror(errno));
        if (k == 0)
            return msm_err_set(err, -ETIMEDOUT, "no reply from the daemon in %d s (%d requests in flight)",
                               r->o->timeout_s, r->inflight);
        for (int c = 0; c < r->n_conn; c++) {
            if (!(pfd[c].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            Msmoe__V1__ServerFrame *f = NULL;
            if ((rc = msm_client_recv(r->conn[c], &f, err)) < 0)
                return msm_err_wrap(err, rc, "lost the connection to the daemon");
            rc = on_frame(r, c, f, err);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static int model_info(msm_client *c, int timeout_s, Msmoe__V1__ServerFrame **ret, msm_err *err) {
    int rc = msm_client_send_simple(c, MODEL_INFO_ID, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, err);
    if (rc < 0)
        return rc;
    msm_client_set_timeout_ms(c, timeout_s * 1000);
    for (;;) {
        Msmoe__V1__ServerFrame *f = NULL;
        if ((rc = msm_client_recv(c, &f, err)) < 0)
            return msm_err_wrap(err, rc, "asking the daemon for ModelInfo");
        if (f->request_id == MODEL_INFO_ID || f->request_id == 0) {
            if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_MODEL_INFO && f->model_info) {
                *ret = f;
                return 0;
            }
            rc = msm_err_set(err, -EPROTO, "ModelInfo: the daemon answered %s",
                             f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR && f->error && f->error->message
                                 ? f->error->message : "with something else");
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            return rc;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
}

/* Writes the report as JSON that reads well: the header fields indented, one line per item. */
static int write_report(const char *path, json_object *rep, msm_err *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return msm_err_set(err, -errno, "%s: %s", tmp, strerror(errno));
    const int pretty = JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE;
    const int plain = JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE;
    json_object *items = NULL;
    fputs("{", f);
    bool first = true;
    json_object_object_foreach(rep, key, val) {
        if (!strcmp(key, "items")) {
            items = val;
            continue;
        }
        json_object *k = json_object_new_string(key);
        fprintf(f, "%s\n  %s: %s", first ? "" : ",", json_object_to_json_string_ext(k, plain),
                val ? json_object_to_json_string_ext(val, pretty) : "null");
        json_object_put(k);
        first = false;
    }
    fprintf(f, "%s\n  \"items\": [", first ? "" : ",");
    size_t n = items ? json_object_array_length(items) : 0;
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s\n    %s", i ? "," : "", json_object_to_json_string_ext(json_object_array_get_idx(items, i), plain));
    fputs("\n  ]\n}\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return msm_err_set(err, -EIO, "%s: write error", tmp);
    }
    if (rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        return msm_err_set(err, -e, "%s: %s", path, strerror(e));
    }
    return 0;
}

static void print_summary(const char *task, json_object *rep) {
    json_object *s, *v;
    json_object_object_get_ex(rep, "summary", &s);
    int n = json_object_object_get_ex(s, "n", &v) ? json_object_get_int(v) : 0;
    int c = json_object_object_get_ex(s, "correct", &v) ? json_object_get_int(v) : 0;
    int e = json_object_object_get_ex(s, "errors", &v) ? json_object_get_int(v) : 0;
    double el = json_object_object_get_ex(s, "elapsed_s", &v) ? json_object_get_double(v) : 0;
    printf("%s: accuracy %.4f (%d/%d)", task, n ? (double)c / n : 0.0, c, n);
    if (json_object_object_get_ex(s, "macro_accuracy", &v))
        printf(", macro %.4f", json_object_get_double(v));
    printf(", %d errors, %.1f s\n", e, el);
    json_object *subj;
    if (json_object_object_get_ex(s, "subjects", &subj) && json_object_object_length(subj) > 1) {
        json_object_object_foreach(subj, name, o) {
            json_object *a, *cn, *nn;
            json_object_object_get_ex(o, "accuracy", &a);
            json_object_object_get_ex(o, "correct", &cn);
            json_object_object_get_ex(o, "n", &nn);
            printf("  %-40s %.4f (%d/%d)\n", name, json_object_get_double(a), json_object_get_int(cn),
                   json_object_get_int(nn));
        }
    }
}

static int eval_main(const char *task, const opts *o) {
    msm_err err = {{0}};
    char dbuf[4096];
    const char *dir = find_data_dir(o->data_dir, dbuf, sizeof dbuf);
    bool mmlu = strcmp(task, "mmlu") == 0;
    msm_eval_item *items = NULL;
    int n = 0, status = 0;
    run r = {.o = o, .mmlu = mmlu};
    Msmoe__V1__ServerFrame *mi = NULL;
    json_object *rep = NULL;

    if (strlen(dir) > 3500) {
        fprintf(stderr, "msmoe-eval: --data: the path is too long\n");
        return 2;
    }
    int rc = mmlu ? load_mmlu(dir, o, &items, &n, &err) : load_gsm8k(dir, o, &items, &n, &err);
    if (rc < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        return 2;
    }
    r.items = items;
    r.n = n;
    r.owner = malloc(((size_t)n + 1) * sizeof *r.owner);
    if (!r.owner) {
        fprintf(stderr, "msmoe-eval: out of memory\n");
        status = 1;
        goto out;
    }
    for (int i = 0; i < n; i++)
        r.owner[i] = -1;
    for (int c = 0; c < o->connections; c++) {
        if ((rc = msm_client_connect(o->address, &r.conn[c], &err)) < 0) {
            fprintf(stderr, "msmoe-eval: %s (is msmoed running? --socket PATH or --tcp HOST:PORT)\n", err.msg);
            status = 3;
            goto out;
        }
        r.n_conn++;
    }
    if ((rc = model_info(r.conn[0], o->timeout_s, &mi, &err)) < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        status = 3;
        goto out;
    }
    if (mmlu || o->prompt_ids) {
        char tpath[4200];
        if (o->tokenizer)
            snprintf(tpath, sizeof tpath, "%s", o->tokenizer);
        else if (mi->model_info->model && is_dir(mi->model_info->model))
            snprintf(tpath, sizeof tpath, "%s/tokenizer.json", mi->model_info->model);
        else
            snprintf(tpath, sizeof tpath, "%s", mi->model_info->model ? mi->model_info->model : "(none)");
        if ((rc = msm_tokenizer_load(tpath, &r.tok, &err)) < 0) {
            fprintf(stderr, "msmoe-eval: %s (%s needs the model's tokenizer: --tokenizer FILE)\n", err.msg,
                    mmlu ? "scoring MMLU letters" : "--prompt-ids");
            status = 2;
            goto out;
        }
    }
    if (mmlu) {
        if ((rc = msm_eval_mmlu_letter_ids(r.tok, o->tokenizer ? o->tokenizer : "the model's tokenizer",
                                           r.letters, &r.letters_exact, &err)) < 0) {
            fprintf(stderr, "msmoe-eval: %s\n", err.msg);
            status = 2;
            goto out;
        }
        if (!r.letters_exact)
            fprintf(stderr, "msmoe-eval: warning: in %s \" A\"..\" D\" are not single tokens after \"Answer:\"; "
                            "scoring the tokens that carry the letters (%d %d %d %d), an approximation\n",
                    o->tokenizer ? o->tokenizer : "the model's tokenizer", r.letters[0], r.letters[1], r.letters[2],
                    r.letters[3]);
    }
    if (!o->quiet)
        fprintf(stderr, "msmoe-eval: %s: %d items, up to %d in flight over %d connection%s, data from %s\n",
                task, n, o->concurrency, o->connections, o->connections == 1 ? "" : "s", dir);
    r.tty = isatty(2);
    r.t0 = r.last_print = now_s();
    rc = run_all(&r, &err);
    progress(&r, true);
    if (rc < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        status = 1;
        goto out;
    }
    json_object *settings = json_object_new_object();
    json_object_object_add(settings, "address", json_object_new_string(o->address));
    json_object_object_add(settings, "data", json_object_new_string(dir));
    json_object_object_add(settings, "shots", json_object_new_int(o->shots < 0 ? (mmlu ? 5 : 8) : o->shots));
    json_object_object_add(settings, "limit", o->limit >= 0 ? json_object_new_int(o->limit) : NULL);
    json_object_object_add(settings, "subjects", o->subjects ? json_object_new_string(o->subjects) : NULL);
    json_object_object_add(settings, "concurrency", json_object_new_int(o->concurrency));
    json_object_object_add(settings, "connections", json_object_new_int(o->connections));
    json_object_object_add(settings, "temperature", json_object_new_double(0));
    json_object_object_add(settings, "prompt_ids", json_object_new_boolean(o->prompt_ids));
    if (mmlu) {
        json_object_object_add(settings, "logprobs", json_object_new_int(o->logprobs));
        json_object *l = json_object_new_array();
        for (int k = 0; k < 4; k++)
            json_object_array_add(l, json_object_new_int(r.letters[k]));
        json_object_object_add(settings, "letter_ids", l);
        json_object_object_add(settings, "letter_ids_exact", json_object_new_boolean(r.letters_exact));
    } else {
        json_object_object_add(settings, "max_tokens", json_object_new_int(o->max_tokens));
        json_object *s = json_object_new_array();
        for (size_t k = 0; k < sizeof gsm8k_stops / sizeof *gsm8k_stops; k++)
            json_object_array_add(s, json_object_new_string(gsm8k_stops[k]));
        json_object_object_add(settings, "stop_strings", s);
    }
    rep = msm_eval_report_new(task, items, n, msm_eval_proto_to_json(&mi->model_info->base), settings,
                              now_s() - r.t0);
    if (o->output && (rc = write_report(o->output, rep, &err)) < 0) {
        fprintf(stderr, "msmoe-eval: cannot write the report: %s\n", err.msg);
        status = 1;
        goto out;
    }
    print_summary(task, rep);
    if (r.errors == n) {
        fprintf(stderr, "msmoe-eval: every request failed; the first error: %s\n", r.first_error);
        status = 1;
    } else if (r.errors) {
        fprintf(stderr, "msmoe-eval: %d of %d requests failed (counted as wrong); the first error: %s\n",
                r.errors, n, r.first_error);
    }
out:
    json_object_put(rep);
    if (mi)
        msmoe__v1__server_frame__free_unpacked(mi, NULL);
    for (int c = 0; c < r.n_conn; c++)
        msm_client_free(r.conn[c]);
    msm_tokenizer_free(r.tok);
    free(r.owner);
    for (int i = 0; i < n; i++)
        msm_eval_item_done(&items[i]);
    free(items);
    return status;
}

/* ---- compare ---- */

static int load_report(const char *path, json_object **ret) {
    msm_err err;
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, &err) < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        return -EINVAL;
    }
    enum json_tokener_error je = json_tokener_success;
    json_object *r = json_tokener_parse_verbose(buf, &je);
    free(buf);
    if (!r) {
        fprintf(stderr, "msmoe-eval: %s: not valid JSON (%s)\n", path,
                je == json_tokener_continue ? "the file ends early" : json_tokener_error_desc(je));
        return -EINVAL;
    }
    if (msm_eval_report_check(r, path, &err) < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        json_object_put(r);
        return -EINVAL;
    }
    *ret = r;
    return 0;
}

static int compare_main(int argc, char **argv) {
    double min_agree = -1;
    int max_items = 20;
    const char *files[2];
    int nf = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--min-agreement") || !strcmp(a, "--max-items")) && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            errno = 0;
            if (!strcmp(a, "--min-agreement")) {
                min_agree = strtod(v, &end);
                if (end == v || *end || !(min_agree >= 0 && min_agree <= 1)) {
                    fprintf(stderr, "msmoe-eval: --min-agreement %s: must be a fraction in [0, 1]\n", v);
                    return 2;
                }
            } else {
                long x = strtol(v, &end, 10);
                if (end == v || *end || errno || x < -1 || x > 1000000) {
                    fprintf(stderr, "msmoe-eval: --max-items %s: must be -1 (all) or a count\n", v);
                    return 2;
                }
                max_items = (int)x;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "msmoe-eval: compare: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else if (nf < 2) {
            files[nf++] = a;
        } else {
            fprintf(stderr, "msmoe-eval: compare takes two reports\n");
            return 2;
        }
    }
    if (nf != 2) {
        fprintf(stderr, "msmoe-eval: compare takes two reports: compare A.json B.json\n");
        return 2;
    }
    json_object *a = NULL, *b = NULL;
    if (load_report(files[0], &a) < 0 || load_report(files[1], &b) < 0) {
        json_object_put(a);
        return 2;
    }
    msm_err err;
    msm_eval_compare_result res;
    int status = 0;
    if (msm_eval_compare(a, b, files[0], files[1], stdout, max_items, &res, &err) < 0) {
        fprintf(stderr, "msmoe-eval: %s\n", err.msg);
        status = 2;
    } else if (res.n_common == 0) {
        fprintf(stderr, "msmoe-eval: the reports have no item in common\n");
        status = 1;
    } else if (min_agree >= 0 && res.agreement < min_agree) {
        fprintf(stderr, "msmoe-eval: agreement %.4f is below --min-agreement %.4f\n", res.agreement, min_agree);
        status = 1;
    }
    json_object_put(a);
    json_object_put(b);
    return status;
}

/* ---- main ---- */

static bool parse_int(const char *name, const char *v, int lo, int hi, int *ret) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "msmoe-eval: %s %s: must be an integer in [%d, %d]\n", name, v, lo, hi);
        return false;
    }
    *ret = (int)x;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *task = argv[1];
    if (!strcmp(task, "compare"))
        return compare_main(argc - 2, argv + 2);
    if (strcmp(task, "gsm8k") && strcmp(task, "mmlu")) {
        fprintf(stderr, "msmoe-eval: unknown command \"%s\"\n", task);
        usage(stderr);
        return 2;
    }
    const char *env = getenv("MSMOED_SOCKET");
    opts o = {.address = env && *env ? env : DEFAULT_SOCKET, .limit = -1, .shots = -1, .concurrency = 16,
              .connections = 1, .max_tokens = 256, .logprobs = 20, .timeout_s = 600};
    static char tcp[300];
    enum { O_SOCKET = 1, O_TCP, O_LIMIT, O_SUBJECTS, O_SHOTS, O_CONC, O_CONN, O_MAXTOK, O_LOGPROBS,
           O_TOKENIZER, O_DATA, O_OUTPUT, O_TIMEOUT, O_QUIET, O_HELP, O_PROMPT_IDS };
    static const struct option lo[] = {
        {"socket", required_argument, 0, O_SOCKET},       {"tcp", required_argument, 0, O_TCP},
        {"limit", required_argument, 0, O_LIMIT},         {"subjects", required_argument, 0, O_SUBJECTS},
        {"shots", required_argument, 0, O_SHOTS},         {"concurrency", required_argument, 0, O_CONC},
        {"connections", required_argument, 0, O_CONN},    {"max-tokens", required_argument, 0, O_MAXTOK},
        {"logprobs", required_argument, 0, O_LOGPROBS},   {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"data", required_argument, 0, O_DATA},           {"output", required_argument, 0, O_OUTPUT},
        {"timeout", required_argument, 0, O_TIMEOUT},     {"quiet", no_argument, 0, O_QUIET},
        {"help", no_argument, 0, O_HELP},                 {"prompt-ids", no_argument, 0, O_PROMPT_IDS},
        {0, 0, 0, 0}};
    optind = 2;
    int c;
    bool ok = true;
    while (ok && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_SOCKET: o.address = optarg; break;
        case O_TCP:
            snprintf(tcp, sizeof tcp, "tcp:%s", optarg);
            o.address = tcp;
            break;
        case O_LIMIT: ok = parse_int("--limit", optarg, 0, 1 << 30, &o.limit); break;
        case O_SUBJECTS: o.subjects = optarg; break;
        case O_SHOTS: ok = parse_int("--shots", optarg, 0, 16, &o.shots); break;
        case O_CONC: ok = parse_int("--concurrency", optarg, 1, 4096, &o.concurrency); break;
        case O_CONN: ok = parse_int("--connections", optarg, 1, MAX_CONNECTIONS, &o.connections); break;
        case O_MAXTOK: ok = parse_int("--max-tokens", optarg, 1, 1 << 20, &o.max_tokens); break;
        case O_LOGPROBS: ok = parse_int("--logprobs", optarg, 1, 1000, &o.logprobs); break;
        case O_TOKENIZER: o.tokenizer = optarg; break;
        case O_DATA: o.data_dir = optarg; break;
        case O_OUTPUT: o.output = optarg; break;
        case O_TIMEOUT: ok = parse_int("--timeout", optarg, 1, 86400, &o.timeout_s); break;
        case O_QUIET: o.quiet = true; break;
        case O_PROMPT_IDS: o.prompt_ids = true; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!ok)
        return 2;
    if (optind < argc) {
        fprintf(stderr, "msmoe-eval: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (o.subjects && strcmp(task, "mmlu") != 0) {
        fprintf(stderr, "msmoe-eval: --subjects is for mmlu\n");
        return 2;
    }
    return eval_main(task, &o);
}
