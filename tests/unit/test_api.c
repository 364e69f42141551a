/* Unit tests of the protobuf edge (daemon/api.c): every invalid field answered with its code and
 * a message naming it; valid frames converted to native requests; encoders round-trip. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msm_api.h"
#include "msmoe.pb-c.h"

static const msm_api_limits lim = {.vocab = 100, .max_context = 64, .max_tokens_default = 16,
                                   .max_tokens_limit = 1000, .max_logprobs = 5, .max_stop = 4};

typedef void (*mutate_fn)(Msmoe__V1__GenerateRequest *g, Msmoe__V1__SamplingParams *sp);

static int decode_gen(mutate_fn m, msm_call *call, msm_status *st) {
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
    int rc = msm_api_decode(buf, n, &lim, call, st);
    free(buf);
    return rc;
}

static void expect_invalid(mutate_fn m, const char *field) {
    msm_call call;
    msm_status st;
    cr_assert_eq(decode_gen(m, &call, &st), -EINVAL, "%s accepted", field);
    cr_assert_eq(st.code, MSM_CODE_INVALID_ARGUMENT, "%s: code %d", field, st.code);
    cr_assert(!st.fatal);
    cr_assert_eq(st.request_id, 42);
    cr_assert(strstr(st.msg, field), "message '%s' does not name %s", st.msg, field);
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
    expect_invalid(m_no_prompt, "prompt_ids is empty");
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
    expect_invalid(m_text, "prompt_text");
    expect_invalid(m_stop_str, "stop_strings");
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
    msm_status st;
    cr_assert_eq(decode_gen(m_full, &call, &st), 0, "%s", st.msg);
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
    msm_status st;
    cr_assert_eq(decode_gen(NULL, &call, &st), 0, "%s", st.msg);
    cr_assert_float_eq(call.gen->sampling.temperature, 1.0f, 0);
    cr_assert_float_eq(call.gen->sampling.top_p, 1.0f, 0);
    cr_assert_eq(call.gen->max_tokens, 16);
    msm_gen_request_free(call.gen);
}

Test(api, malformed_and_unknown) {
    msm_call call;
    msm_status st;
    uint8_t junk[] = {0xff, 0xff, 0xff, 0x07, 0x12};
    cr_assert_eq(msm_api_decode(junk, sizeof junk, &lim, &call, &st), -EBADMSG);
    cr_assert(st.fatal);
    cr_assert_eq(st.code, MSM_CODE_INVALID_ARGUMENT);
    /* request_id 5 + an unknown varint field 99. */
    uint8_t unk[] = {0x08, 0x05, 0x98, 0x06, 0x01};
    cr_assert_eq(msm_api_decode(unk, sizeof unk, &lim, &call, &st), -EINVAL);
    cr_assert(!st.fatal);
    cr_assert(strstr(st.msg, "unknown field number 99"), "%s", st.msg);
    cr_assert_eq(st.request_id, 5);
    /* No call. */
    uint8_t nocall[] = {0x08, 0x05};
    cr_assert_eq(msm_api_decode(nocall, sizeof nocall, &lim, &call, &st), -EINVAL);
    cr_assert(strstr(st.msg, "no call"), "%s", st.msg);
    /* No request id. */
    uint8_t noid[] = {0x22, 0x00};
    cr_assert_eq(msm_api_decode(noid, sizeof noid, &lim, &call, &st), -EINVAL);
    cr_assert(strstr(st.msg, "request_id"), "%s", st.msg);
    /* Empty frame. */
    cr_assert_eq(msm_api_decode(noid, 0, &lim, &call, &st), -EINVAL);
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
