/* msm_textstream: streaming detokenization and stop strings of one sequence (see msm_textstream.h). */
#include "msm_textstream.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void msm_textstream_init(msm_textstream *ts, const msm_tokenizer *tok, char *const *stops, int n_stops) {
    memset(ts, 0, sizeof *ts);
    msm_detok_init(&ts->detok, tok, MSM_DETOK_SKIP_SPECIAL | MSM_DETOK_CONTINUE);
    ts->stops = stops;
    ts->n_stops = n_stops;
}

void msm_textstream_done(msm_textstream *ts) {
    free(ts->text);
    ts->text = NULL;
    ts->len = ts->cap = ts->sent = 0;
}

static int reserve(msm_textstream *ts, size_t more) {
    if (ts->cap - ts->len > more)
        return 0;
    size_t cap = ts->cap ? ts->cap : 256;
    while (cap - ts->len <= more)
        cap *= 2;
    char *p = realloc(ts->text, cap);
    if (!p)
        return -ENOMEM;
    ts->text = p;
    ts->cap = cap;
    return 0;
}

/* Appends what the detokenizer emits for token t (or its flush, t < 0), NUL characters dropped. */
static int append(msm_textstream *ts, int32_t t) {
    size_t max = msm_detok_max_out(ts->detok.tok), n = 0;
    if (reserve(ts, max) < 0)
        return -ENOMEM;
    char *out = ts->text + ts->len;
    int rc = t >= 0 ? msm_detok_push(&ts->detok, t, out, max, &n, NULL) : msm_detok_flush(&ts->detok, out, max, &n);
    if (rc < 0)
        n = 0; /* an id the tokenizer does not know */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i])
            out[k++] = out[i];
    ts->len += k;
    ts->text[ts->len] = 0;
    return 0;
}

/* Looks for a stop string that ends in the text after byte `from` (the text before it was checked
 * already); cuts the text at the start of the first one to end (see msm_textstream.h). */
static bool stop_match(msm_textstream *ts, size_t from) {
    size_t best_end = SIZE_MAX, best_start = 0;
    for (int i = 0; i < ts->n_stops; i++) {
        const char *st = ts->stops[i];
        size_t L = strlen(st);
        if (L == 0 || L > ts->len)
            continue;
        for (size_t end = from + 1 > L ? from + 1 : L; end <= ts->len && end <= best_end; end++)
            if (memcmp(ts->text + end - L, st, L) == 0) {
                if (end < best_end || end - L < best_start) {
                    best_end = end;
                    best_start = end - L;
                }
                break;
            }
    }
    if (best_end == SIZE_MAX)
        return false;
    ts->len = best_start;
    ts->text[ts->len] = 0;
    ts->cut = true;
    return true;
}

int msm_textstream_push(msm_textstream *ts, int32_t t) {
    size_t old = ts->len;
    if (append(ts, t) < 0)
        return -ENOMEM;
    return ts->n_stops > 0 && stop_match(ts, old) ? 1 : 0;
}

int msm_textstream_finish(msm_textstream *ts) {
    return ts->cut ? 0 : append(ts, -1);
}

/* Bytes at the end of the unsent text that could be the start of a stop string. (A held suffix
 * starts at a character boundary: stop strings are UTF-8.) */
static size_t holdback(const msm_textstream *ts) {
    size_t unsent = ts->len - ts->sent, hold = 0;
    for (int i = 0; i < ts->n_stops; i++) {
        const char *st = ts->stops[i];
        size_t L = strlen(st);
        if (L == 0)
            continue;
        for (size_t k = (L - 1 < unsent ? L - 1 : unsent); k > hold; k--)
            if (memcmp(ts->text + ts->len - k, st, k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

const char *msm_textstream_ready(const msm_textstream *ts, bool final, size_t *ret_len) {
    size_t upto = final ? ts->len : ts->len - holdback(ts);
    *ret_len = upto > ts->sent ? upto - ts->sent : 0;
    return ts->text ? ts->text + ts->sent : "";
}

void msm_textstream_sent(msm_textstream *ts, size_t n) {
    ts->sent += n;
}
