/* bench_tokenizer: encode throughput of msm_tokenizer on about 1 MB of text.
 *
 * Usage: bench_tokenizer [tokenizer.json] [text-file]
 * Defaults: the GPT-2 tokenizer of tests/data/tokenizer and a text made deterministically from
 * /work/shared/data/gsm8k/test.jsonl: its questions, shuffled with a fixed-seed xorshift and
 * repeated until 1 MiB. Run from the repository root. Prints MB/s (median of 5 runs) and the
 * decode speed. A benchmark, not a test: it never fails on speed. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_tokenizer.h"

#define RUNS 5
#define TARGET_BYTES (1u << 20)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char *read_file(const char *path, size_t *ret_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[n] = 0, *ret_len = (size_t)n;
    return p;
}

/* The gsm8k questions, shuffled (fixed seed) and repeated to TARGET_BYTES. */
static char *gsm8k_text(const char *path, size_t *ret_len) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char **q = NULL, *line = NULL;
    size_t nq = 0, cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_object *o = json_tokener_parse(line), *v;
        if (o && json_object_object_get_ex(o, "question", &v)) {
            q = realloc(q, (nq + 1) * sizeof *q);
            q[nq++] = strdup(json_object_get_string(v));
        }
        json_object_put(o);
    }
    free(line);
    fclose(f);
    if (!nq) return NULL;
    char *text = malloc(TARGET_BYTES + 4096);
    size_t len = 0;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    while (len < TARGET_BYTES) {
        for (size_t i = nq - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t j = (size_t)(s % (i + 1));
            char *t = q[i];
            q[i] = q[j], q[j] = t;
        }
        for (size_t i = 0; i < nq && len < TARGET_BYTES; i++) {
            size_t l = strlen(q[i]);
            if (len + l + 2 > TARGET_BYTES + 4096) break;
            memcpy(text + len, q[i], l);
            len += l;
            text[len++] = '\n';
            text[len++] = '\n';
        }
    }
    for (size_t i = 0; i < nq; i++) free(q[i]);
    free(q);
    *ret_len = len;
    return text;
}

int main(int argc, char **argv) {
    const char *tok_path = argc > 1 ? argv[1] : "tests/data/tokenizer/gpt2/tokenizer.json";
    const char *text_path = argc > 2 ? argv[2] : NULL;
    msm_err err = {{0}};
    msm_tokenizer *t = NULL;
    double t0 = now();
    if (msm_tokenizer_load(tok_path, &t, &err) < 0) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;
    size_t len = 0;
    char *text = text_path ? read_file(text_path, &len) : gsm8k_text("/work/shared/data/gsm8k/test.jsonl", &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", text_path ? text_path : "the gsm8k questions");
        msm_tokenizer_free(t);
        return 1;
    }
    double enc[RUNS], dec[RUNS];
    size_t n = 0;
    for (int r = 0; r < RUNS; r++) {
        int32_t *ids = NULL;
        char *back = NULL;
        size_t blen;
        t0 = now();
        if (msm_tokenizer_encode(t, text, len, false, &ids, &n, &err) < 0) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        enc[r] = now() - t0;
        t0 = now();
        if (msm_tokenizer_decode(t, ids, n, false, &back, &blen, &err) < 0) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        dec[r] = now() - t0;
        if (blen != len || memcmp(back, text, len) != 0) fprintf(stderr, "bench_tokenizer: round trip differs\n");
        free(ids);
        free(back);
    }
    qsort(enc, RUNS, sizeof enc[0], cmp_double);
    qsort(dec, RUNS, sizeof dec[0], cmp_double);
    printf("tokenizer   %s (load %.3f s)\n", tok_path, load_s);
    printf("text        %s: %zu bytes -> %zu tokens (%.2f bytes/token)\n", text_path ? text_path : "gsm8k test questions",
           len, n, (double)len / (double)n);
    printf("encode      %.2f MB/s (median of %d; min %.3f s, max %.3f s)\n", (double)len / enc[RUNS / 2] / 1e6, RUNS,
           enc[0], enc[RUNS - 1]);
    printf("decode      %.2f MB/s (median of %d)\n", (double)len / dec[RUNS / 2] / 1e6, RUNS);
    free(text);
    msm_tokenizer_free(t);
    return 0;
}
