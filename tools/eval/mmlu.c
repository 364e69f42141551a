/* MMLU data and scoring: the CSV reader for the question files, rows to questions, and the answer
 * letter from top-n logprobs. See msm_eval.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_eval.h"
#include "msm_tokenizer.h"

/* Growable arrays of the reader. */
typedef struct field_buf {
    char *p;
    size_t n, cap;
} field_buf;

static int fb_put(field_buf *f, char c) {
    if (f->n + 2 > f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        char *p = realloc(f->p, cap);
        if (!p)
            return -ENOMEM;
        f->p = p;
        f->cap = cap;
    }
    f->p[f->n++] = c;
    return 0;
}

typedef struct row_buf {
    char **f;
    int n, cap;
} row_buf;

static int rb_push(row_buf *r, field_buf *f) {
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 8;
        char **p = realloc(r->f, (size_t)cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        r->f = p;
        r->cap = cap;
    }
    char *s = malloc(f->n + 1);
    if (!s)
        return -ENOMEM;
    if (f->n)
        memcpy(s, f->p, f->n);
    s[f->n] = 0;
    r->f[r->n++] = s;
    f->n = 0;
    return 0;
}

static int csv_push_row(msm_eval_csv *csv, int *cap, row_buf *r) {
    if (csv->n_rows == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        int *nf = realloc(csv->n_fields, (size_t)nc * sizeof *nf);
        if (!nf)
            return -ENOMEM;
        csv->n_fields = nf;
        char ***fs = realloc(csv->fields, (size_t)nc * sizeof *fs);
        if (!fs)
            return -ENOMEM;
        csv->fields = fs;
        *cap = nc;
    }
    csv->n_fields[csv->n_rows] = r->n;
    csv->fields[csv->n_rows] = r->f;
    csv->n_rows++;
    *r = (row_buf){0};
    return 0;
}

void msm_eval_csv_done(msm_eval_csv *csv) {
    if (!csv)
        return;
    for (int i = 0; i < csv->n_rows; i++) {
        for (int k = 0; k < csv->n_fields[i]; k++)
            free(csv->fields[i][k]);
        free(csv->fields[i]);
    }
    free(csv->fields);
    free(csv->n_fields);
    *csv = (msm_eval_csv){0};
}

int msm_eval_csv_parse(const char *buf, size_t len, const char *source, msm_eval_csv *ret, msm_err *err) {
    msm_eval_csv csv = {0};
    int cap = 0, rc = 0, line = 1;
    field_buf f = {0};
    row_buf r = {0};
    size_t i = 0;
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0)
        i = 3;
    while (i < len) {
        if (r.n == 0 && (buf[i] == '\n' || (buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n'))) {
            i += buf[i] == '\r' ? 2 : 1; /* a blank line between records */
            line++;
            continue;
        }
        /* At the start of a field. */
        int field_line = line;
        if (buf[i] == '"') {
            i++;
            for (;;) {
                if (i >= len) {
                    rc = msm_err_set(err, -EINVAL, "%s:%d: quoted field never closed", source, field_line);
                    goto fail;
                }
                if (buf[i] == '"') {
                    if (i + 1 < len && buf[i + 1] == '"') {
                        if ((rc = fb_put(&f, '"')) < 0)
                            goto oom;
                        i += 2;
                        continue;
                    }
                    i++;
                    break;
                }
                if (buf[i] == '\n')
                    line++;
                if ((rc = fb_put(&f, buf[i++])) < 0)
                    goto oom;
            }
            if (i < len && buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n')
                i++;
            if (i < len && buf[i] != ',' && buf[i] != '\n') {
                rc = msm_err_set(err, -EINVAL, "%s:%d: text after the closing quote of a field", source, line);
                goto fail;
            }
        } else {
            while (i < len && buf[i] != ',' && buf[i] != '\n') {
                if (buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n') {
                    i++;
                    break;
                }
                if ((rc = fb_put(&f, buf[i++])) < 0)
                    goto oom;
            }
        }
        if ((rc = rb_push(&r, &f)) < 0)
            goto oom;
        /* Now at ",", "\n" or the end. */
        if (i < len && buf[i] == ',') {
            i++;
            if (i == len && (rc = rb_push(&r, &f)) < 0) /* "a,<EOF>": an empty last field */
                goto oom;
            continue;
        }
        if (i < len) { /* "\n" */
            i++;
            line++;
        }
        if ((rc = csv_push_row(&csv, &cap, &r)) < 0)
            goto oom;
    }
    if (r.n > 0 && (rc = csv_push_row(&csv, &cap, &r)) < 0)
        goto oom;
    free(f.p);
    *ret = csv;
    return 0;
oom:
    rc = msm_err_set(err, -ENOMEM, "%s: out of memory", source);
fail:
    for (int k = 0; k < r.n; k++)
        free(r.f[k]);
    free(r.f);
    free(f.p);
    msm_eval_csv_done(&csv);
    return rc;
}

int msm_eval_mcq_from_row(char **fields, int n_fields, const char *source, int row,
                          msm_eval_mcq *ret, msm_err *err) {
    if (n_fields != 6)
        return msm_err_set(err, -EINVAL, "%s: row %d has %d fields; expected 6 (question,A,B,C,D,answer)",
                           source, row + 1, n_fields);
    const char *a = fields[5];
    if (strlen(a) != 1 || a[0] < 'A' || a[0] > 'D')
        return msm_err_set(err, -EINVAL, "%s: row %d: answer \"%.16s\" is not one of A, B, C, D", source,
                           row + 1, a);
    msm_eval_mcq q = {.question = fields[0], .answer = a[0]};
    for (int k = 0; k < 4; k++)
        q.choices[k] = fields[1 + k];
    *ret = q;
    return 0;
}

int msm_eval_mmlu_pick(const Msmoe__V1__TokenLogprob *lp, const int32_t letter_ids[4], float ret_lp[4]) {
    float v[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (size_t t = 0; lp && t < lp->n_top; t++) {
        const Msmoe__V1__TopLogprob *e = lp->top[t];
        if (!e || !e->has_token_id || !e->has_logprob || isnan(e->logprob))
            continue;
        for (int k = 0; k < 4; k++)
            if (e->token_id == letter_ids[k] && e->logprob > v[k])
                v[k] = e->logprob;
    }
    int best = -ENOENT;
    for (int k = 0; k < 4; k++)
        if (v[k] > -INFINITY && (best < 0 || v[k] > v[best]))
            best = k;
    if (ret_lp)
        memcpy(ret_lp, v, sizeof v);
    return best;
}

int msm_eval_mmlu_letter_ids(const msm_tokenizer *tok, const char *source, int32_t ret[4], bool *ret_exact,
                             msm_err *err) {
    int32_t *base = NULL, v[4];
    size_t nb = 0;
    bool exact = true;
    const char *prefix = "Answer:";
    int rc = msm_tokenizer_encode_flags(tok, prefix, strlen(prefix), 0, &base, &nb, err);
    for (int k = 0; rc == 0 && k < 4; k++) {
        char s[16];
        snprintf(s, sizeof s, "%s %c", prefix, 'A' + k);
        int32_t *ids = NULL;
        size_t n = 0;
        if ((rc = msm_tokenizer_encode_flags(tok, s, strlen(s), 0, &ids, &n, err)) < 0)
            break;
        if (n <= nb || memcmp(ids, base, nb * sizeof *ids) != 0)
            rc = msm_err_set(err, -ENOTSUP,
                             "%s: \"Answer: %c\" does not start with the tokens of \"Answer:\" (%zu tokens, "
                             "%zu without the letter): MMLU cannot be scored by next-token logprobs",
                             source, 'A' + k, n, nb);
        else
            v[k] = ids[n - 1]; /* the token that carries the letter */
        exact = exact && n == nb + 1;
        free(ids);
    }
    for (int k = 0; rc == 0 && k < 4; k++)
        for (int j = 0; rc == 0 && j < k; j++)
            if (v[j] == v[k])
                rc = msm_err_set(err, -ENOTSUP, "%s: \" %c\" and \" %c\" are the same token", source,
                                 'A' + j, 'A' + k);
    free(base);
    if (rc == 0) {
        memcpy(ret, v, sizeof v);
        *ret_exact = exact;
    }
    return rc;
}
