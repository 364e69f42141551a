/* libFuzzer target: the daemon's frame decoder + request validation, the code every client byte
 * goes through. The first input byte picks the read size, so frames are split across reads the
 * way a socket splits them. An accepted request must satisfy every limit it was checked against. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "msm_api.h"
#include "msm_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const msm_api_limits lim = {.vocab = 512, .max_context = 512, .max_tokens_default = 256,
                                   .max_tokens_limit = 32768, .max_logprobs = 20, .max_stop = 16};

static void check(const msm_call *c) {
    if (c->request_id == 0)
        __builtin_trap();
    if (c->kind != MSM_CALL_GENERATE)
        return;
    const msm_gen_request *r = c->gen;
    if (r->n_prompt < 1 || r->n_prompt >= lim.max_context || r->max_tokens < 1 ||
        r->max_tokens > lim.max_tokens_limit || r->top_logprobs < 0 || r->top_logprobs > lim.max_logprobs ||
        !isfinite(r->sampling.temperature) || r->sampling.temperature < 0 || !(r->sampling.top_p > 0) ||
        r->sampling.top_p > 1 || r->sampling.top_k < 0 || r->sampling.top_k > lim.vocab ||
        r->n_stop_ids + r->n_stop_strings > lim.max_stop || r->n_stop_strings != 0)
        __builtin_trap();
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= lim.vocab)
            __builtin_trap();
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= lim.vocab)
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
            msm_status st;
            if (msm_api_decode(frame, flen, &lim, &call, &st) == 0) {
                check(&call);
                msm_gen_request_free(call.gen);
            } else if (st.fatal) {
                goto out;
            }
        }
        off += len;
    }
out:
    msm_frame_reader_done(&rd);
    return 0;
}
