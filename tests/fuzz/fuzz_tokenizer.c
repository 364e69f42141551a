/* libFuzzer target: msm_tokenizer. The first input byte picks the mode:
 *   even: the rest is text for the GPT-2 tokenizer (tests/data/tokenizer/gpt2/tokenizer.json,
 *         loaded once; run from the repository root, or set MSM_FUZZ_TOKENIZER to a path):
 *         valid UTF-8 must encode, every id must be in range, decode must give the text back,
 *         and streaming decode the same bytes;
 *   odd:  the rest is a tokenizer.json to load (it must fail cleanly or load, then encode and
 *         decode a fixed text without crashing). The input is not NUL-terminated on purpose. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msm_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static msm_tokenizer *gpt2;

static void check_text(const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0, back_len = 0;
    char *back = NULL;
    if (msm_tokenizer_encode(gpt2, text, len, false, &ids, &n, NULL) < 0) return; /* invalid UTF-8 */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= msm_tokenizer_vocab_size(gpt2)) __builtin_trap();
    if (msm_tokenizer_decode(gpt2, ids, n, false, &back, &back_len, NULL) < 0) __builtin_trap();
    if (back_len != len || memcmp(back, text, len) != 0) __builtin_trap();
    msm_detok d;
    msm_detok_init(&d, gpt2, 0);
    size_t cap = msm_detok_max_out(gpt2), got = 0, l;
    char *chunk = malloc(cap);
    for (size_t i = 0; chunk && i < n; i++) {
        if (msm_detok_push(&d, ids[i], chunk, cap, &l, NULL) < 0) __builtin_trap();
        if (got + l > back_len || memcmp(back + got, chunk, l) != 0) __builtin_trap();
        got += l;
    }
    if (chunk && (msm_detok_flush(&d, chunk, cap, &l) < 0 || got + l != back_len)) __builtin_trap();
    free(chunk);
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] & 1) {
        msm_tokenizer *t = NULL;
        if (msm_tokenizer_load_buffer((const char *)data + 1, size - 1, "fuzz.json", &t, NULL) < 0) return 0;
        int32_t *ids = NULL;
        size_t n = 0, len;
        char *text = NULL;
        static const char sample[] = "Hello wörld <s> 🐉";
        if (msm_tokenizer_encode(t, sample, sizeof sample - 1, true, &ids, &n, NULL) == 0 &&
            msm_tokenizer_decode(t, ids, n, false, &text, &len, NULL) == 0)
            free(text);
        free(ids);
        msm_tokenizer_free(t);
        return 0;
    }
    if (!gpt2) {
        const char *path = getenv("MSM_FUZZ_TOKENIZER");
        if (msm_tokenizer_load(path ? path : "tests/data/tokenizer/gpt2/tokenizer.json", &gpt2, NULL) < 0)
            __builtin_trap();
    }
    check_text((const char *)data + 1, size - 1);
    return 0;
}
