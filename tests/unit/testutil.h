/* Shared helpers of the engine tests: golden data (tests/data/<model>/golden.json + .npy). */
#ifndef MSM_TESTUTIL_H
#define MSM_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_engine.h"

#define GOLDEN_MAX_PROMPTS 8

typedef struct golden {
    int n;                                  /* prompts */
    int32_t *prompt[GOLDEN_MAX_PROMPTS];
    int prompt_len[GOLDEN_MAX_PROMPTS];
    int32_t *gen[GOLDEN_MAX_PROMPTS];
    int gen_len[GOLDEN_MAX_PROMPTS];
    float *logits[GOLDEN_MAX_PROMPTS];      /* [rows, cols] */
    int rows[GOLDEN_MAX_PROMPTS], cols[GOLDEN_MAX_PROMPTS];
} golden;

/* Loads tests/data/<model>/golden.json and its logits files; returns 0 or -errno. */
int golden_load(const char *model_dir, golden *g);
void golden_done(golden *g);

/* Reads a float32 C-order 2-D .npy file. */
int npy_load_f32(const char *path, float **ret, int *rows, int *cols);

/* Engine options for a model dir with the given tp and passes. */
msm_engine_opts test_engine_opts(const char *model_dir, int tp, bool fuse, bool multi_stream);

/* Makes a fresh directory /tmp/msm-<tag>-XXXXXX (its path into buf); returns 0 or -errno. */
int tmpdir_make(char *buf, size_t cap, const char *tag);
/* Removes dir and everything below it. */
void tmpdir_remove(const char *dir);

/* max |a - b| / max |b| over n elements. */
double rel_max_diff(const float *a, const float *b, size_t n);

#endif
