/* Unit tests of the protobuf edge (daemon/api.c): every invalid field answered with its code and
 * a message naming it; valid frames converted to native requests; encoders round-trip; text
 * prompts, Tokenize and Detokenize with the embedded model's tokenizer (run from the repository
 * root, as meson does). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msm_api.h"
#include "msm_code.h"
#include "msmoe.pb-c.h"

static const msm_api_limits lim = {.vocab = 100, .max_context = 64, .max_tokens_default = 16,
                                   .max_tokens_limit = 1000, .max_logprobs = 5, .max_stop = 4};

/* What msm_api_decode answered: its return value (a negative errno on failure), the message and
 * the request id to answer. */
typedef struct answer {
    int rc;
    msm_err err;
    uint64_t request_id;
} answer;

typedef void (*mutate_fn)(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp);

static int decode_gen_lim(mutate_fn m, const msm_api_limits *l, msm_call *call, answer *st) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__GenerateRequest g = MSMOE__V1__GENERATE_REQUEST__INIT;
    Msmoe__V1__SamplingParams sp = MSMOE__V1__SAMPLING_PARAMS__INIT;
    static int32_t ids[80];
    for (int i = 0; i < 80; i++)
        ids[i] = i % 100;
    f.has_request_id = 1;
    f.request_id = 42;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_GENERATE;
    f.generate = &g;
    g.n_prompt_ids = 3;
    g.prompt_ids = ids;
    g.sampling = &sp;
    if (m)
        m(&g, &sp);
    size_t n = msmoe__v1__client_frame__get_packed_size(&f);
    uint8_t *buf = malloc(n + 1);
    msmoe__v1__client_frame__pack(&f, buf);
    int rc = st->rc = msm_api_decode(buf, n, l, call, &st->request_id, &st->err);
    free(buf);
    return rc;
}

static int decode_gen(mutate_fn m, msm_call *call, answer *st) {
    return decode_gen_lim(m, &lim, call, st);
}

static void expect_code_lim(mutate_fn m, const msm_api_limits *l, msm_code code, const char *field) {
    msm_call call;
    answer st;
    int rc = decode_gen_lim(m, l, &call, &st);
    cr_assert_lt(rc, 0, "%s accepted", field);
    cr_assert_neq(rc, -EBADMSG, "%s: the connection would close", field);
    cr_assert_eq(msm_code_from_errno(rc), code, "%s: code %d (%s)", field, msm_code_from_errno(rc), st.err.msg);
    cr_assert_eq(st.request_id, 42);
    cr_assert(strstr(st.err.msg, field), "message '%s' does not name %s", st.err.msg, field);
}

static void expect_invalid(mutate_fn m, const char *field) {
    expect_code_lim(m, &lim, MSM_CODE_INVALID_ARGUMENT, field);
}

static void m_no_prompt(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->n_prompt_ids = 0; }
static void m_big_id(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static int32_t ids[2] = {5, 100};
    g->prompt_ids = ids;
    g->n_prompt_ids = 2;
}
static void m_neg_id(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static int32_t ids[1] = {-1};
    g->prompt_ids = ids;
    g->n_prompt_ids = 1;
}
static void m_long_prompt(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->n_prompt_ids = 64; }
static void m_max0(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->has_max_tokens = 1; g->max_tokens = 0; }
static void m_max_huge(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->has_max_tokens = 1; g->max_tokens = 4000000000u; }
static void m_temp_neg(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_temperature = 1; sp->temperature = -0.5f; }
static void m_temp_nan(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_temperature = 1; sp->temperature = NAN; }
static void m_temp_inf(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_temperature = 1; sp->temperature = INFINITY; }
static void m_top_p_big(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_top_p = 1; sp->top_p = 1.5f; }
static void m_top_p_zero(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_top_p = 1; sp->top_p = 0; }
static void m_top_k_neg(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { sp->has_top_k = 1; sp->top_k = -3; }
static void m_logprobs(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->has_logprobs = 1; g->logprobs = 6; }
static void m_text(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->n_prompt_ids = 0; g->prompt_text = "hello"; }
static void m_stop_str(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static char *s[1] = {"\n\n"};
    g->stop_strings = s;
    g->n_stop_strings = 1;
}
static void m_stop_id(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static int32_t s[1] = {1000};
    g->stop_token_ids = s;
    g->n_stop_token_ids = 1;
}
static void m_many_stops(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static int32_t s[5] = {1, 2, 3, 4, 5};
    g->stop_token_ids = s;
    g->n_stop_token_ids = 5;
}

Test(api, invalid_fields_are_named) {
    expect_invalid(m_no_prompt, "set prompt_ids or prompt_text");
    expect_invalid(m_big_id, "prompt_ids[1] = 100");
    expect_invalid(m_neg_id, "prompt_ids[0] = -1");
    expect_invalid(m_long_prompt, "max context is 64");
    expect_invalid(m_max0, "max_tokens = 0");
    expect_invalid(m_max_huge, "max_tokens = 4000000000");
    expect_invalid(m_temp_neg, "temperature = -0.5");
    expect_invalid(m_temp_nan, "temperature = nan");
    expect_invalid(m_temp_inf, "temperature = inf");
    expect_invalid(m_top_p_big, "top_p = 1.5");
    expect_invalid(m_top_p_zero, "top_p = 0");
    expect_invalid(m_top_k_neg, "top_k = -3");
    expect_invalid(m_logprobs, "logprobs = 6");
    /* Text without a tokenizer: the daemon lacks something, the request is fine. */
    expect_code_lim(m_text, &lim, MSM_CODE_FAILED_PRECONDITION, "prompt_text needs a tokenizer");
    expect_code_lim(m_stop_str, &lim, MSM_CODE_FAILED_PRECONDITION, "stop_strings needs a tokenizer");
    expect_invalid(m_stop_id, "stop_token_ids[0] = 1000");
    expect_invalid(m_many_stops, "max_stop");
}

static void m_full(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static int32_t s[1] = {7};
    sp->has_temperature = 1;
    sp->temperature = 0.5f;
    sp->has_top_k = 1;
    sp->top_k = 10;
    sp->has_top_p = 1;
    sp->top_p = 0.9f;
    sp->has_seed = 1;
    sp->seed = 99;
    g->has_max_tokens = 1;
    g->max_tokens = 1000;
    g->has_logprobs = 1;
    g->logprobs = 5;
    g->has_ignore_eos = 1;
    g->ignore_eos = 1;
    g->stop_token_ids = s;
    g->n_stop_token_ids = 1;
}

Test(api, valid_generate_becomes_a_native_request) {
    msm_call call;
    answer st;
    cr_assert_eq(decode_gen(m_full, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.kind, MSM_CALL_GENERATE);
    msm_gen_request *r = call.gen;
    cr_assert_eq(r->request_id, 42);
    cr_assert_eq(r->n_prompt, 3);
    cr_assert_eq(r->prompt[2], 2);
    cr_assert_float_eq(r->sampling.temperature, 0.5f, 1e-6);
    cr_assert_eq(r->sampling.top_k, 10);
    cr_assert_eq(r->sampling.seed, 99);
    cr_assert_eq(r->max_tokens, 1000);
    cr_assert_eq(r->top_logprobs, 5);
    cr_assert(r->want_logprob && r->ignore_eos);
    cr_assert_eq(r->n_stop_ids, 1);
    msm_gen_request_free(r);
}

Test(api, defaults_when_unset) {
    msm_call call;
    answer st;
    cr_assert_eq(decode_gen(NULL, &call, &st), 0, "%s", st.err.msg);
    cr_assert_float_eq(call.gen->sampling.temperature, 1.0f, 0);
    cr_assert_float_eq(call.gen->sampling.top_p, 1.0f, 0);
    cr_assert_eq(call.gen->max_tokens, 16);
    msm_gen_request_free(call.gen);
}

Test(api, malformed_and_unknown) {
    msm_call call;
    answer st;
    uint8_t junk[] = {0xff, 0xff, 0xff, 0x07, 0x12};
    cr_assert_eq(msm_api_decode(junk, sizeof junk, &lim, &call, &st.request_id, &st.err), -EBADMSG,
                 "malformed: the connection closes");
    cr_assert_eq(msm_code_from_errno(-EBADMSG), MSM_CODE_INVALID_ARGUMENT);
    /* request_id 5 + an unknown varint field 99. */
    uint8_t unk[] = {0x08, 0x05, 0x98, 0x06, 0x01};
    cr_assert_eq(msm_api_decode(unk, sizeof unk, &lim, &call, &st.request_id, &st.err), -EINVAL);
    cr_assert(strstr(st.err.msg, "unknown field number 99"), "%s", st.err.msg);
    cr_assert_eq(st.request_id, 5);
    /* No call. */
    uint8_t nocall[] = {0x08, 0x05};
    cr_assert_eq(msm_api_decode(nocall, sizeof nocall, &lim, &call, &st.request_id, &st.err), -EINVAL);
    cr_assert(strstr(st.err.msg, "no call"), "%s", st.err.msg);
    /* No request id. */
    uint8_t noid[] = {0x22, 0x00};
    cr_assert_eq(msm_api_decode(noid, sizeof noid, &lim, &call, &st.request_id, &st.err), -EINVAL);
    cr_assert(strstr(st.err.msg, "request_id"), "%s", st.err.msg);
    /* Empty frame. */
    cr_assert_eq(msm_api_decode(noid, 0, &lim, &call, &st.request_id, &st.err), -EINVAL);
}

/* The one errno -> code table (msm_code.h): what each errno the daemon uses answers with. */
Test(api, errno_maps_to_the_documented_code) {
    static const struct {
        int err;
        msm_code code;
    } table[] = {
        {0, MSM_CODE_OK},
        {-EINVAL, MSM_CODE_INVALID_ARGUMENT},
        {-EBADMSG, MSM_CODE_INVALID_ARGUMENT},
        {-ENOTSUP, MSM_CODE_FAILED_PRECONDITION},
        {-ENOMEM, MSM_CODE_RESOURCE_EXHAUSTED},
        {-ENOSPC, MSM_CODE_RESOURCE_EXHAUSTED},
        {-EAGAIN, MSM_CODE_RESOURCE_EXHAUSTED},
        {-EMSGSIZE, MSM_CODE_RESOURCE_EXHAUSTED},
        {-EMFILE, MSM_CODE_RESOURCE_EXHAUSTED},
        {-ENOENT, MSM_CODE_NOT_FOUND},
        {-ESHUTDOWN, MSM_CODE_UNAVAILABLE},
        {-ETIMEDOUT, MSM_CODE_DEADLINE_EXCEEDED},
        {-ECANCELED, MSM_CODE_CANCELLED},
        {-ENOSYS, MSM_CODE_UNIMPLEMENTED},
        {-EIO, MSM_CODE_INTERNAL},
        {-EPROTO, MSM_CODE_INTERNAL},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        cr_expect_eq(msm_code_from_errno(table[i].err), table[i].code, "errno %d: %s, want %s", -table[i].err,
                     msm_code_name(msm_code_from_errno(table[i].err)), msm_code_name(table[i].code));
}

Test(api, event_encoding_round_trips) {
    msm_sched_event ev = {.request_id = 9, .has_token = true, .token = 33, .has_logprob = true, .logprob = -0.25f,
                          .n_top = 2, .top_ids = {33, 4}, .top_logprobs = {-0.25f, -2.0f},
                          .finish = MSM_FINISH_EOS, .prompt_tokens = 3, .completion_tokens = 7};
    size_t len;
    uint8_t *buf = msm_api_encode_event(&ev, &len);
    cr_assert_not_null(buf);
    uint32_t n = (uint32_t)buf[0] << 24 | buf[1] << 16 | buf[2] << 8 | buf[3];
    cr_assert_eq(n + 4, len);
    Msmoe__V1__ServerFrame *f = msmoe__v1__server_frame__unpack(NULL, n, buf + 4);
    cr_assert_not_null(f);
    cr_assert_eq(f->request_id, 9);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_CHUNK);
    cr_assert_eq(f->chunk->n_token_ids, 1);
    cr_assert_eq(f->chunk->token_ids[0], 33);
    cr_assert_eq(f->chunk->finish_reason, MSMOE__V1__FINISH_REASON__FINISH_EOS);
    cr_assert_eq(f->chunk->usage->completion_tokens, 7);
    cr_assert_eq(f->chunk->logprobs[0]->n_top, 2);
    cr_assert_eq(f->chunk->logprobs[0]->top[1]->token_id, 4);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
}

/* ---- text, with the embedded model's tokenizer ---- */

static msm_tokenizer *stories_tok(void) {
    static msm_tokenizer *t;
    msm_err err;
    if (!t)
        cr_assert_eq(msm_tokenizer_load("models/stories260k-moe/tokenizer.json", &t, &err), 0, "%s", err.msg);
    return t;
}

static msm_api_limits text_lim(void) {
    msm_api_limits l = lim;
    l.vocab = 512;
    l.tok = stories_tok();
    return l;
}

static void m_once(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    g->n_prompt_ids = 0;
    g->prompt_text = "Once upon a time";
}
static void m_once_no_bos(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    m_once(g, sp);
    g->has_add_special = 1;
    g->add_special = 0;
}
static void m_both(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) { g->prompt_text = "Once"; }
static void m_empty_text(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    g->n_prompt_ids = 0;
    g->prompt_text = "";
}
static void m_long_text(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static char t[64 * 6 + 1];
    for (int i = 0; i < 64; i++)
        memcpy(t + i * 6, "story ", 6);
    g->n_prompt_ids = 0;
    g->prompt_text = t;
}
static void m_huge_text(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static char *t;
    if (!t) {
        t = malloc(MSM_API_MAX_TEXT_BYTES + 2);
        memset(t, 'a', MSM_API_MAX_TEXT_BYTES + 1);
        t[MSM_API_MAX_TEXT_BYTES + 1] = 0;
    }
    g->n_prompt_ids = 0;
    g->prompt_text = t;
}
static void m_bad_utf8(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    g->n_prompt_ids = 0;
    g->prompt_text = "Once \xc3(";
}
static void m_bad_stop(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    static char *s[2] = {"ok", "\xf0\x9f"};
    g->stop_strings = s;
    g->n_stop_strings = 2;
}
static void m_special(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    g->n_prompt_ids = 0;
    g->prompt_text = "<s>Hi";
    g->has_add_special = 1;
    g->add_special = 0;
}
static void m_special_parsed(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp) {
    m_special(g, sp);
    g->has_parse_special = 1;
    g->parse_special = 1;
}

Test(api_text, prompt_text_is_encoded_with_bos) {
    msm_api_limits l = text_lim();
    msm_call call;
    answer st;
    cr_assert_eq(decode_gen_lim(m_once, &l, &call, &st), 0, "%s", st.err.msg);
    static const int32_t want[] = {1, 403, 407, 261, 378}; /* llama2.c's encoding, with BOS */
    cr_assert_eq(call.gen->n_prompt, 5);
    cr_assert_arr_eq(call.gen->prompt, want, sizeof want);
    cr_assert_eq(call.gen->max_tokens, 16);
    msm_gen_request_free(call.gen);
    cr_assert_eq(decode_gen_lim(m_once_no_bos, &l, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.gen->n_prompt, 4);
    cr_assert_arr_eq(call.gen->prompt, want + 1, 4 * sizeof(int32_t));
    msm_gen_request_free(call.gen);
    /* An empty text is BOS alone: llama2.c's unconditional generation. */
    cr_assert_eq(decode_gen_lim(m_empty_text, &l, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.gen->n_prompt, 1);
    cr_assert_eq(call.gen->prompt[0], 1);
    msm_gen_request_free(call.gen);
    /* Special tokens in the text are text unless the request asks. */
    cr_assert_eq(decode_gen_lim(m_special, &l, &call, &st), 0, "%s", st.err.msg);
    cr_assert_gt(call.gen->n_prompt, 2);
    for (int i = 0; i < call.gen->n_prompt; i++)
        cr_assert_neq(call.gen->prompt[i], 1, "<s> in untrusted text became the BOS token");
    msm_gen_request_free(call.gen);
    cr_assert_eq(decode_gen_lim(m_special_parsed, &l, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.gen->prompt[0], 1);
    msm_gen_request_free(call.gen);
}

Test(api_text, prompt_errors_are_named) {
    msm_api_limits l = text_lim();
    expect_code_lim(m_both, &l, MSM_CODE_INVALID_ARGUMENT, "set prompt_ids or prompt_text, not both");
    expect_code_lim(m_no_prompt, &l, MSM_CODE_INVALID_ARGUMENT, "set prompt_ids or prompt_text");
    expect_code_lim(m_long_text, &l, MSM_CODE_INVALID_ARGUMENT, "max context is 64");
    expect_code_lim(m_long_text, &l, MSM_CODE_INVALID_ARGUMENT, "generate.prompt_text encodes to");
    expect_code_lim(m_huge_text, &l, MSM_CODE_INVALID_ARGUMENT, "generate.prompt_text has 1048577 bytes");
    expect_code_lim(m_bad_utf8, &l, MSM_CODE_INVALID_ARGUMENT, "generate.prompt_text");
    expect_code_lim(m_bad_stop, &l, MSM_CODE_INVALID_ARGUMENT, "stop_strings[1] is not valid UTF-8");
    /* The model's vocabulary is smaller than the tokenizer's: refused, not passed on. */
    msm_api_limits small = l;
    small.vocab = 300;
    expect_code_lim(m_once, &small, MSM_CODE_FAILED_PRECONDITION, "outside the model's vocabulary");
    /* With a tokenizer, stop strings are accepted. */
    msm_call call;
    answer st;
    cr_assert_eq(decode_gen_lim(m_stop_str, &l, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.gen->n_stop_strings, 1);
    cr_assert_str_eq(call.gen->stop_strings[0], "\n\n");
    msm_gen_request_free(call.gen);
}

static int decode_frame(const Msmoe__V1__ClientFrame *f, const msm_api_limits *l, msm_call *call, answer *st) {
    size_t n = msmoe__v1__client_frame__get_packed_size(f);
    uint8_t *buf = malloc(n + 1);
    msmoe__v1__client_frame__pack(f, buf);
    int rc = st->rc = msm_api_decode(buf, n, l, call, &st->request_id, &st->err);
    free(buf);
    return rc;
}

static int tokenize(const msm_api_limits *l, const char *text, int add_special, msm_call *call, answer *st) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__TokenizeRequest t = MSMOE__V1__TOKENIZE_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = 7;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_TOKENIZE;
    f.tokenize = &t;
    t.text = (char *)text;
    if (add_special >= 0) {
        t.has_add_special = 1;
        t.add_special = add_special;
    }
    return decode_frame(&f, l, call, st);
}

static int detokenize(const msm_api_limits *l, const int32_t *ids, size_t n, bool skip, msm_call *call,
                      answer *st) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__DetokenizeRequest d = MSMOE__V1__DETOKENIZE_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = 8;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_DETOKENIZE;
    f.detokenize = &d;
    d.ids = (int32_t *)ids;
    d.n_ids = n;
    d.has_skip_special = 1;
    d.skip_special = skip;
    return decode_frame(&f, l, call, st);
}

Test(api_text, tokenize_and_detokenize_round_trip) {
    msm_api_limits l = text_lim();
    msm_call call;
    answer st;
    static const int32_t want[] = {1, 403, 407, 261, 378};
    cr_assert_eq(tokenize(&l, "Once upon a time", -1, &call, &st), 0, "%s", st.err.msg); /* default: BOS */
    cr_assert_eq(call.kind, MSM_CALL_TOKENIZE);
    cr_assert_eq(call.request_id, 7);
    cr_assert_eq(call.n_ids, 5);
    cr_assert_arr_eq(call.ids, want, sizeof want);
    msm_call_done(&call);
    cr_assert_eq(tokenize(&l, "Once upon a time", 0, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.n_ids, 4);
    msm_call_done(&call);
    /* An emoji is byte-fallback tokens; decoding them gives it back whole. */
    cr_assert_eq(tokenize(&l, "A smile \xf0\x9f\x99\x82!", 1, &call, &st), 0, "%s", st.err.msg);
    int32_t ids[32];
    size_t n = call.n_ids;
    cr_assert_leq(n, 32);
    memcpy(ids, call.ids, n * sizeof *ids);
    msm_call_done(&call);
    cr_assert_eq(detokenize(&l, ids, n, true, &call, &st), 0, "%s", st.err.msg);
    cr_assert_eq(call.kind, MSM_CALL_DETOKENIZE);
    cr_assert_str_eq(call.text, "A smile \xf0\x9f\x99\x82!");
    cr_assert_eq(call.text_len, strlen(call.text));
    msm_call_done(&call);
    cr_assert_eq(detokenize(&l, want, 5, false, &call, &st), 0, "%s", st.err.msg);
    cr_assert(strstr(call.text, "<s>"), "skip_special = false keeps <s>: '%s'", call.text);
    msm_call_done(&call);
    /* Half a character: U+FFFD, never invalid UTF-8. */
    static const int32_t half[] = {243, 162};
    cr_assert_eq(detokenize(&l, half, 2, true, &call, &st), 0, "%s", st.err.msg);
    cr_assert(strstr(call.text, "\xef\xbf\xbd"), "'%s'", call.text);
    msm_call_done(&call);
}

Test(api_text, tokenize_and_detokenize_errors) {
    msm_api_limits l = text_lim();
    msm_call call;
    answer st;
    static const int32_t bad[] = {1, 512};
    cr_assert_eq(detokenize(&l, bad, 2, false, &call, &st), -EINVAL);
    cr_assert_eq(msm_code_from_errno(st.rc), MSM_CODE_INVALID_ARGUMENT);
    cr_assert(strstr(st.err.msg, "detokenize.ids[1] = 512") && strstr(st.err.msg, "[0, 512)"), "%s", st.err.msg);
    static const int32_t neg[] = {-1};
    cr_assert_eq(detokenize(&l, neg, 1, false, &call, &st), -EINVAL);
    cr_assert(strstr(st.err.msg, "detokenize.ids[0] = -1"), "%s", st.err.msg);
    cr_assert_eq(tokenize(&l, "bad \xff utf-8", 1, &call, &st), -EINVAL);
    cr_assert_eq(msm_code_from_errno(st.rc), MSM_CODE_INVALID_ARGUMENT);
    cr_assert(strstr(st.err.msg, "tokenize.text"), "%s", st.err.msg);
    /* No tokenizer: both calls refused with FAILED_PRECONDITION. */
    cr_assert_eq(tokenize(&lim, "hi", 1, &call, &st), -ENOTSUP);
    cr_assert_eq(msm_code_from_errno(st.rc), MSM_CODE_FAILED_PRECONDITION);
    cr_assert(strstr(st.err.msg, "needs a tokenizer"), "%s", st.err.msg);
    cr_assert_eq(detokenize(&lim, bad, 1, false, &call, &st), -ENOTSUP);
    cr_assert_eq(msm_code_from_errno(st.rc), MSM_CODE_FAILED_PRECONDITION);
}

Test(api_text, text_replies_encode) {
    struct {
        msm_sched_event ev;
        char text[8];
    } e = {.ev = {.request_id = 3, .has_token = true, .token = 432}};
    e.ev.text = e.text;
    strcpy(e.text, ", th");
    e.ev.text_len = 4;
    size_t len;
    uint8_t *buf = msm_api_encode_event(&e.ev, &len);
    Msmoe__V1__ServerFrame *f = msmoe__v1__server_frame__unpack(NULL, len - 4, buf + 4);
    cr_assert_not_null(f);
    cr_assert_str_eq(f->chunk->text, ", th");
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
    /* No tokenizer: no text field at all. */
    msm_sched_event plain = {.request_id = 3, .has_token = true, .token = 432};
    buf = msm_api_encode_event(&plain, &len);
    f = msmoe__v1__server_frame__unpack(NULL, len - 4, buf + 4);
    cr_assert_null(f->chunk->text);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
    static const int32_t ids[] = {1, 2, 3};
    buf = msm_api_encode_tokenize(5, ids, 3, &len);
    f = msmoe__v1__server_frame__unpack(NULL, len - 4, buf + 4);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
    cr_assert_eq(f->tokenize->n_ids, 3);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
    buf = msm_api_encode_detokenize(6, "", &len);
    f = msmoe__v1__server_frame__unpack(NULL, len - 4, buf + 4);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_DETOKENIZE);
    cr_assert_str_eq(f->detokenize->text, "");
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
    msm_api_model_info mi = {.architecture = "x", .tokenizer = "/m/tokenizer.json", .tokenizer_vocab = 512};
    buf = msm_api_encode_model_info(1, &mi, &len);
    f = msmoe__v1__server_frame__unpack(NULL, len - 4, buf + 4);
    cr_assert(f->model_info->has_has_tokenizer && f->model_info->has_tokenizer);
    cr_assert_str_eq(f->model_info->tokenizer, "/m/tokenizer.json");
    cr_assert_eq(f->model_info->tokenizer_vocab, 512);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    free(buf);
}

/* A ClientFrame{request_id = 9, generate = {prompt_ids = [1,2], field = the len bytes of str}},
 * built by hand: protobuf-c packs strings with strlen, so it cannot write a NUL inside one. */
static size_t nul_frame(uint8_t *out, int field, const char *str, size_t len) {
    uint8_t *p = out;
    *p++ = 0x08, *p++ = 9;                           /* request_id = 9 */
    *p++ = 0x12, *p++ = (uint8_t)(len + 6);          /* generate */
    *p++ = 0x0a, *p++ = 2, *p++ = 1, *p++ = 2;       /* prompt_ids = [1, 2] (packed) */
    *p++ = (uint8_t)(field << 3 | 2), *p++ = (uint8_t)len;
    memcpy(p, str, len);
    return (size_t)(p + len - out);
}

/* Issue 16: protobuf-c unpacks a string up to its first NUL, so "Once\0 upon a time" would be
 * served as "Once": a NUL in any string field is refused, naming the field. */
Test(api_text, strings_with_a_nul_byte_are_refused) {
    msm_api_limits l = text_lim();
    uint8_t buf[128];
    msm_call call;
    msm_err err = {{0}};
    uint64_t rid;
    static const char text[] = "Once\0 upon a time", stop[] = "a\0b";
    size_t n = nul_frame(buf, 6, stop, sizeof stop - 1); /* stop_strings */
    cr_assert_eq(msm_api_decode(buf, n, &l, &call, &rid, &err), -EINVAL);
    cr_assert_eq(rid, 9);
    cr_assert(strstr(err.msg, "generate.stop_strings contains a NUL byte (at byte 1 of 3)"), "%s", err.msg);
    n = nul_frame(buf, 6, "ab", 2);
    cr_assert_eq(msm_api_decode(buf, n, &l, &call, &rid, &err), 0, "%s", err.msg);
    cr_assert_str_eq(call.gen->stop_strings[0], "ab");
    msm_gen_request_free(call.gen);
    msm_call_done(&call);
    /* prompt_text (with prompt_ids too: the NUL is found before the "not both" check) */
    n = nul_frame(buf, 2, text, sizeof text - 1);
    cr_assert_eq(msm_api_decode(buf, n, &l, &call, &rid, &err), -EINVAL);
    cr_assert(strstr(err.msg, "generate.prompt_text contains a NUL byte (at byte 4"), "%s", err.msg);
}

/* The daemon's split: msm_api_parse does the cheap checks and leaves the text for msm_api_text
 * (on a worker thread); a prompt that can never fit the context is refused unencoded. */
Test(api_text, parse_leaves_the_text_work_and_bounds_it) {
    msm_api_limits l = text_lim();
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__GenerateRequest g = MSMOE__V1__GENERATE_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = 11;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_GENERATE;
    f.generate = &g;
    g.prompt_text = "Once upon a time";
    size_t n = msmoe__v1__client_frame__get_packed_size(&f);
    uint8_t *buf = malloc(n);
    msmoe__v1__client_frame__pack(&f, buf);
    msm_call call;
    msm_err err = {{0}};
    uint64_t rid;
    cr_assert_eq(msm_api_parse(buf, n, &l, &call, &rid, &err), 0, "%s", err.msg);
    cr_assert(call.text_pending);
    cr_assert_eq(call.gen->n_prompt, 0, "encoded on the loop thread");
    cr_assert_eq(msm_api_text(&call, &l, &err), 0, "%s", err.msg);
    cr_assert(!call.text_pending);
    static const int32_t want[] = {1, 403, 407, 261, 378};
    cr_assert_eq(call.gen->n_prompt, 5);
    cr_assert_arr_eq(call.gen->prompt, want, sizeof want);
    cr_assert_eq(call.gen->max_tokens, l.max_tokens_default < l.max_context - 5 ? l.max_tokens_default
                                                                                : l.max_context - 5);
    msm_gen_request_free(call.gen);
    msm_call_done(&call);
    free(buf);
    /* ~1 MiB can never fit 64 tokens: refused before any encoding */
    size_t big = (1u << 20) - 100;
    char *text = malloc(big + 1);
    memset(text, 'a', big);
    text[big] = 0;
    g.prompt_text = text;
    n = msmoe__v1__client_frame__get_packed_size(&f);
    buf = malloc(n);
    msmoe__v1__client_frame__pack(&f, buf);
    cr_assert_eq(msm_api_parse(buf, n, &l, &call, &rid, &err), -EINVAL);
    cr_assert(strstr(err.msg, "encodes to at least") && strstr(err.msg, "max context is 64"), "%s", err.msg);
    free(buf);
    free(text);
}
