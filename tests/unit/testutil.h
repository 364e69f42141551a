/* Shared helpers of the unit tests: golden data (tests/data/<model>/golden.json + .npy), and the
 * embedded model's tokenizer for the text tests (scheduler, text streams). */
#ifndef MSM_TESTUTIL_H
#define MSM_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_engine.h"
#include "msm_tokenizer.h"

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

/* The embedded model's tokenizer (models/stories260k-moe/tokenizer.json, 512 ids), loaded once;
 * the tests run from the repository root. */
const msm_tokenizer *test_stories_tokenizer(void);

/* The ids of a generation whose streamed text is `text`, which starts with a space: the
 * normalizer prepends the SentencePiece space that a streamed continuation keeps. Returns n. */
int test_script_of(const char *text, int32_t *out, int cap);

/* One streaming decode of ids continuing a prompt (special tokens skipped, flushed at the end):
 * what the text deltas of a sequence generating them must add up to. */
void test_streamed_text(const int32_t *ids, int n, char *out, size_t cap);

#endif
