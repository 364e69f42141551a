/* libFuzzer target: the daemon's frame decoder + request validation, the code every client byte
 * goes through. The first input byte picks the read size, so frames are split across reads the
 * way a socket splits them. An accepted request must satisfy every limit it was checked against.
 * The embedded model's tokenizer (models/stories260k-moe/tokenizer.json from the repository root,
 * or MSM_FUZZ_FRAME_TOKENIZER) is loaded once so text prompts, stop strings and Tokenize /
 * Detokenize are fuzzed too; without it those are refused, which is checked instead. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <string.h>
#include <unistr.h>

#include "msm_api.h"
#include "msm_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static msm_api_limits lim = {.vocab = 512, .max_context = 512, .max_tokens_default = 256,
                             .max_tokens_limit = 32768, .max_logprobs = 20, .max_stop = 16};
static int loaded;

static void load_tokenizer(void) {
    const char *p = getenv("MSM_FUZZ_FRAME_TOKENIZER");
    msm_tokenizer *t = NULL;
    if (msm_tokenizer_load(p && *p ? p : "models/stories260k-moe/tokenizer.json", &t, NULL) == 0)
        lim.tok = t; /* kept for the process's life */
    loaded = 1;
}

static void check(const msm_call *c) {
    if (c->request_id == 0)
        __builtin_trap();
    if ((c->kind == MSM_CALL_TOKENIZE || c->kind == MSM_CALL_DETOKENIZE) && !lim.tok)
        __builtin_trap();
    if (c->kind == MSM_CALL_TOKENIZE)
        for (size_t i = 0; i < c->n_ids; i++)
            if (c->ids[i] < 0 || c->ids[i] >= msm_tokenizer_vocab_size(lim.tok))
                __builtin_trap();
    if (c->kind == MSM_CALL_DETOKENIZE &&
        (!c->text || strlen(c->text) != c->text_len || u8_check((const uint8_t *)c->text, c->text_len)))
        __builtin_trap();
    if (c->kind != MSM_CALL_GENERATE)
        return;
    const msm_gen_request *r = c->gen;
    if (r->n_prompt < 1 || r->n_prompt >= lim.max_context || r->max_tokens < 1 ||
        r->max_tokens > lim.max_tokens_limit || r->top_logprobs < 0 || r->top_logprobs > lim.max_logprobs ||
        !isfinite(r->sampling.temperature) || r->sampling.temperature < 0 || !(r->sampling.top_p > 0) ||
        r->sampling.top_p > 1 || r->sampling.top_k < 0 || r->sampling.top_k > lim.vocab ||
        r->n_stop_ids + r->n_stop_strings > lim.max_stop || (r->n_stop_strings != 0 && !lim.tok))
        __builtin_trap();
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i][0] || u8_check((const uint8_t *)r->stop_strings[i], strlen(r->stop_strings[i])))
            __builtin_trap();
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= lim.vocab)
            __builtin_trap();
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= lim.vocab)
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!loaded)
        load_tokenizer();
    if (size < 1)
        return 0;
    size_t step = (size_t)data[0] + 1;
    data++;
    size--;
    msm_frame_reader rd;
    msm_frame_reader_init(&rd, 1 << 16);
    for (size_t off = 0; off < size;) {
        size_t len = size - off < step ? size - off : step, pos = 0;
        while (pos < len) {
            size_t used;
            const uint8_t *frame;
            uint32_t flen;
            msm_err err;
            int rc = msm_frame_reader_feed(&rd, data + off + pos, len - pos, &used, &frame, &flen, &err);
            pos += used;
            if (rc < 0)
                goto out;
            if (rc == 0)
                break;
            msm_call call;
            uint64_t rid;
            int drc = msm_api_decode(frame, flen, &lim, &call, &rid, &err);
            if (drc == 0) {
                check(&call);
                msm_gen_request_free(call.gen);
                msm_call_done(&call);
            } else if (drc == -EBADMSG) {
                goto out;
            }
        }
        off += len;
    }
out:
    msm_frame_reader_done(&rd);
    return 0;
}
