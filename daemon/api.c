/* msm_api: ClientFrame -> validated msm_call, native structs -> ServerFrame bytes (see msm_api.h). */
#include "msm_api.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_frame.h"
#include "msmoe.pb-c.h"

#define MAX_STOP_STRING 256

static int fail(msm_status *st, msm_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(msm_status *st, msm_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->code = code;
    return -EINVAL;
}

/* Unknown fields are refused: a client option this daemon does not understand must not be
 * silently ignored. */
static int check_unknown(const ProtobufCMessage *m, const char *what, msm_status *st) {
    if (m && m->n_unknown_fields > 0)
        return fail(st, MSM_CODE_INVALID_ARGUMENT, "unknown field number %u in %s",
                    m->unknown_fields[0].tag, what);
    return 0;
}

static int convert_generate(const Msmoe__V1__GenerateRequest *g, const msm_api_limits *lim,
                            msm_gen_request **ret, msm_status *st) {
    if (check_unknown(&g->base, "generate", st) < 0)
        return -EINVAL;
    if (g->sampling && check_unknown(&g->sampling->base, "generate.sampling", st) < 0)
        return -EINVAL;
    if (g->prompt_text && g->prompt_text[0] && !lim->have_tokenizer)
        return fail(st, MSM_CODE_INVALID_ARGUMENT,
                    "generate.prompt_text: text prompts need a tokenizer, which this daemon does not "
                    "have yet; send generate.prompt_ids");
    if (g->prompt_text && g->prompt_text[0] && g->n_prompt_ids > 0)
        return fail(st, MSM_CODE_INVALID_ARGUMENT, "generate: set prompt_ids or prompt_text, not both");
    if (g->n_prompt_ids == 0)
        return fail(st, MSM_CODE_INVALID_ARGUMENT, "generate.prompt_ids is empty");
    if (g->n_prompt_ids >= (size_t)lim->max_context)
        return fail(st, MSM_CODE_INVALID_ARGUMENT,
                    "generate.prompt_ids has %zu tokens; max context is %d tokens (prompt + generated)",
                    g->n_prompt_ids, lim->max_context);
    for (size_t i = 0; i < g->n_prompt_ids; i++)
        if (g->prompt_ids[i] < 0 || g->prompt_ids[i] >= lim->vocab)
            return fail(st, MSM_CODE_INVALID_ARGUMENT,
                        "generate.prompt_ids[%zu] = %d is outside the vocabulary [0, %d)", i,
                        g->prompt_ids[i], lim->vocab);
    int max_tokens = lim->max_tokens_default;
    if (g->has_max_tokens) {
        if (g->max_tokens < 1 || g->max_tokens > (uint32_t)lim->max_tokens_limit)
            return fail(st, MSM_CODE_INVALID_ARGUMENT,
                        "generate.max_tokens = %u: must be in [1, %d] (scheduler.max_tokens_limit)",
                        g->max_tokens, lim->max_tokens_limit);
        max_tokens = (int)g->max_tokens;
    } else if (max_tokens > lim->max_context - (int)g->n_prompt_ids) {
        max_tokens = lim->max_context - (int)g->n_prompt_ids; /* the default never asks for more than fits */
    }
    msm_sample_params sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    if (g->sampling) {
        const Msmoe__V1__SamplingParams *s = g->sampling;
        if (s->has_temperature) {
            if (!isfinite(s->temperature) || s->temperature < 0)
                return fail(st, MSM_CODE_INVALID_ARGUMENT,
                            "generate.sampling.temperature = %g: must be finite and >= 0", (double)s->temperature);
            sp.temperature = s->temperature;
        }
        if (s->has_top_k) {
            if (s->top_k < 0 || s->top_k > lim->vocab)
                return fail(st, MSM_CODE_INVALID_ARGUMENT,
                            "generate.sampling.top_k = %d: must be in [0, %d] (0 = all)", s->top_k, lim->vocab);
            sp.top_k = s->top_k;
        }
        if (s->has_top_p) {
            if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
                return fail(st, MSM_CODE_INVALID_ARGUMENT,
                            "generate.sampling.top_p = %g: must be in (0, 1]", (double)s->top_p);
            sp.top_p = s->top_p;
        }
        if (s->has_seed)
            sp.seed = s->seed;
    }
    if (g->n_stop_token_ids + g->n_stop_strings > (size_t)lim->max_stop)
        return fail(st, MSM_CODE_INVALID_ARGUMENT,
                    "generate: %zu stop token ids + %zu stop strings exceed scheduler.max_stop = %d",
                    g->n_stop_token_ids, g->n_stop_strings, lim->max_stop);
    for (size_t i = 0; i < g->n_stop_token_ids; i++)
        if (g->stop_token_ids[i] < 0 || g->stop_token_ids[i] >= lim->vocab)
            return fail(st, MSM_CODE_INVALID_ARGUMENT,
                        "generate.stop_token_ids[%zu] = %d is outside the vocabulary [0, %d)", i,
                        g->stop_token_ids[i], lim->vocab);
    for (size_t i = 0; i < g->n_stop_strings; i++) {
        size_t L = strlen(g->stop_strings[i]);
        if (L == 0 || L > MAX_STOP_STRING)
            return fail(st, MSM_CODE_INVALID_ARGUMENT,
                        "generate.stop_strings[%zu] has %zu bytes: must be 1..%d", i, L, MAX_STOP_STRING);
    }
    if (g->n_stop_strings > 0 && !lim->have_tokenizer)
        return fail(st, MSM_CODE_INVALID_ARGUMENT,
                    "generate.stop_strings need a tokenizer, which this daemon does not have yet");
    if (g->has_logprobs && g->logprobs > (uint32_t)lim->max_logprobs)
        return fail(st, MSM_CODE_INVALID_ARGUMENT,
                    "generate.logprobs = %u: must be in [0, %d] (scheduler.max_logprobs)", g->logprobs,
                    lim->max_logprobs);

    msm_gen_request *r = calloc(1, sizeof *r);
    if (!r)
        return fail(st, MSM_CODE_RESOURCE_EXHAUSTED, "out of memory");
    r->n_prompt = (int)g->n_prompt_ids;
    r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt);
    r->n_stop_ids = (int)g->n_stop_token_ids;
    r->stop_ids = r->n_stop_ids ? malloc((size_t)r->n_stop_ids * sizeof *r->stop_ids) : NULL;
    r->n_stop_strings = (int)g->n_stop_strings;
    r->stop_strings = r->n_stop_strings ? calloc((size_t)r->n_stop_strings, sizeof *r->stop_strings) : NULL;
    bool oom = !r->prompt || (r->n_stop_ids && !r->stop_ids) || (r->n_stop_strings && !r->stop_strings);
    for (int i = 0; !oom && i < r->n_stop_strings; i++)
        oom = !(r->stop_strings[i] = strdup(g->stop_strings[i]));
    if (oom) {
        msm_gen_request_free(r);
        return fail(st, MSM_CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(r->prompt, g->prompt_ids, (size_t)r->n_prompt * sizeof *r->prompt);
    if (r->n_stop_ids)
        memcpy(r->stop_ids, g->stop_token_ids, (size_t)r->n_stop_ids * sizeof *r->stop_ids);
    r->sampling = sp;
    r->max_tokens = max_tokens;
    r->top_logprobs = g->has_logprobs ? (int)g->logprobs : 0;
    r->want_logprob = (g->has_return_logprob && g->return_logprob) || r->top_logprobs > 0;
    r->ignore_eos = g->has_ignore_eos && g->ignore_eos;
    *ret = r;
    return 0;
}

int msm_api_decode(const uint8_t *buf, size_t len, const msm_api_limits *lim, msm_call *ret, msm_status *st) {
    memset(st, 0, sizeof *st);
    Msmoe__V1__ClientFrame *f = msmoe__v1__client_frame__unpack(NULL, len, buf);
    if (!f) {
        st->fatal = true;
        fail(st, MSM_CODE_INVALID_ARGUMENT, "malformed frame: %zu bytes are not a msmoe.v1.ClientFrame", len);
        return -EBADMSG;
    }
    int rc = -EINVAL;
    msm_call call = {0};
    st->request_id = f->has_request_id ? f->request_id : 0;
    if (check_unknown(&f->base, "ClientFrame", st) < 0)
        goto out;
    if (!f->has_request_id || f->request_id == 0) {
        fail(st, MSM_CODE_INVALID_ARGUMENT, "request_id must be set and nonzero");
        goto out;
    }
    call.request_id = f->request_id;
    switch (f->call_case) {
    case MSMOE__V1__CLIENT_FRAME__CALL_GENERATE:
        call.kind = MSM_CALL_GENERATE;
        if (convert_generate(f->generate, lim, &call.gen, st) < 0)
            goto out;
        call.gen->request_id = f->request_id;
        break;
    case MSMOE__V1__CLIENT_FRAME__CALL_CANCEL:
        call.kind = MSM_CALL_CANCEL;
        if (check_unknown(&f->cancel->base, "cancel", st) < 0)
            goto out;
        break;
    case MSMOE__V1__CLIENT_FRAME__CALL_HEALTH:
        call.kind = MSM_CALL_HEALTH;
        if (check_unknown(&f->health->base, "health", st) < 0)
            goto out;
        break;
    case MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO:
        call.kind = MSM_CALL_MODEL_INFO;
        if (check_unknown(&f->model_info->base, "model_info", st) < 0)
            goto out;
        break;
    case MSMOE__V1__CLIENT_FRAME__CALL_METRICS:
        call.kind = MSM_CALL_METRICS;
        if (check_unknown(&f->metrics->base, "metrics", st) < 0)
            goto out;
        break;
    default:
        fail(st, MSM_CODE_INVALID_ARGUMENT, "frame carries no call (generate, cancel, health, model_info, metrics)");
        goto out;
    }
    *ret = call;
    rc = 0;
out:
    msmoe__v1__client_frame__free_unpacked(f, NULL);
    return rc;
}

/* ---- encoders ---- */

static uint8_t *pack(const Msmoe__V1__ServerFrame *f, size_t *ret_len) {
    size_t n = msmoe__v1__server_frame__get_packed_size(f);
    uint8_t *buf = malloc(MSM_FRAME_HEADER + n);
    if (!buf)
        return NULL;
    msm_frame_put_header(buf, (uint32_t)n);
    msmoe__v1__server_frame__pack(f, buf + MSM_FRAME_HEADER);
    *ret_len = MSM_FRAME_HEADER + n;
    return buf;
}

uint8_t *msm_api_encode_event(const msm_sched_event *ev, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__GenerateChunk c = MSMOE__V1__GENERATE_CHUNK__INIT;
    Msmoe__V1__Usage u = MSMOE__V1__USAGE__INIT;
    Msmoe__V1__Status err = MSMOE__V1__STATUS__INIT;
    Msmoe__V1__TokenLogprob tl = MSMOE__V1__TOKEN_LOGPROB__INIT;
    Msmoe__V1__TokenLogprob *tlp = &tl;
    Msmoe__V1__TopLogprob top[MSM_MAX_TOP_LOGPROBS];
    Msmoe__V1__TopLogprob *topp[MSM_MAX_TOP_LOGPROBS];
    int32_t tok = ev->token;

    f.has_request_id = 1;
    f.request_id = ev->request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_CHUNK;
    f.chunk = &c;
    if (ev->has_token) {
        c.n_token_ids = 1;
        c.token_ids = &tok;
        if (ev->has_logprob) {
            tl.has_token_id = tl.has_logprob = 1;
            tl.token_id = ev->token;
            tl.logprob = ev->logprob;
            for (int i = 0; i < ev->n_top && i < MSM_MAX_TOP_LOGPROBS; i++) {
                msmoe__v1__top_logprob__init(&top[i]);
                top[i].has_token_id = top[i].has_logprob = 1;
                top[i].token_id = ev->top_ids[i];
                top[i].logprob = ev->top_logprobs[i];
                topp[i] = &top[i];
            }
            tl.n_top = (size_t)ev->n_top;
            tl.top = topp;
            c.n_logprobs = 1;
            c.logprobs = &tlp;
        }
    }
    if (ev->finish != MSM_FINISH_NONE) {
        c.has_finish_reason = 1;
        c.finish_reason = (Msmoe__V1__FinishReason)ev->finish;
        u.has_prompt_tokens = u.has_completion_tokens = 1;
        u.prompt_tokens = (uint32_t)ev->prompt_tokens;
        u.completion_tokens = (uint32_t)ev->completion_tokens;
        c.usage = &u;
        if (ev->finish == MSM_FINISH_ERROR) {
            err.has_code = 1;
            err.code = (Msmoe__V1__Code)ev->error_code;
            err.message = (char *)ev->error_msg;
            c.error = &err;
        }
    }
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_error(uint64_t request_id, msm_code code, const char *msg, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__Status st = MSMOE__V1__STATUS__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_ERROR;
    f.error = &st;
    st.has_code = 1;
    st.code = (Msmoe__V1__Code)code;
    st.message = (char *)msg;
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_health(uint64_t request_id, bool serving, const char *status, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__HealthReply h = MSMOE__V1__HEALTH_REPLY__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_HEALTH;
    f.health = &h;
    h.has_serving = 1;
    h.serving = serving;
    h.status = (char *)status;
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_model_info(uint64_t request_id, const msm_api_model_info *mi, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__ModelInfoReply r = MSMOE__V1__MODEL_INFO_REPLY__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_MODEL_INFO;
    f.model_info = &r;
    r.architecture = (char *)mi->architecture;
    r.backend = (char *)mi->backend;
    r.model = (char *)mi->model;
    r.version = (char *)mi->version;
#define U(field, v) (r.has_##field = 1, r.field = (uint32_t)(v))
    U(vocab, mi->vocab);
    U(max_context, mi->max_context);
    U(tp, mi->tp);
    U(tp_groups, mi->tp_groups);
    U(hidden, mi->hidden);
    U(layers, mi->layers);
    U(experts, mi->experts);
    U(experts_per_token, mi->experts_per_token);
    U(kv_blocks, mi->kv_blocks);
    U(kv_block_tokens, mi->kv_block_tokens);
    U(max_seqs, mi->max_seqs);
    U(max_step_tokens, mi->max_step_tokens);
#undef U
    r.has_multi_stream = r.has_fuse_allreduce = r.has_cuda_graphs = 1;
    r.multi_stream = mi->multi_stream;
    r.fuse_allreduce = mi->fuse_allreduce;
    r.cuda_graphs = mi->cuda_graphs;
    r.n_eos_ids = (size_t)mi->n_eos;
    r.eos_ids = (int32_t *)mi->eos_ids;
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_metrics(uint64_t request_id, const msm_metric_sample *s, int n, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__MetricsReply r = MSMOE__V1__METRICS_REPLY__INIT;
    Msmoe__V1__Metric *m = calloc((size_t)n + 1, sizeof *m);
    Msmoe__V1__Metric **mp = calloc((size_t)n + 1, sizeof *mp);
    uint8_t *out = NULL;
    if (!m || !mp)
        goto done;
    for (int i = 0; i < n; i++) {
        msmoe__v1__metric__init(&m[i]);
        m[i].name = (char *)s[i].name;
        m[i].labels = (char *)s[i].labels;
        m[i].help = (char *)s[i].help;
        m[i].has_value = m[i].has_counter = 1;
        m[i].value = s[i].value;
        m[i].counter = s[i].counter;
        mp[i] = &m[i];
    }
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_METRICS;
    f.metrics = &r;
    r.n_metrics = (size_t)n;
    r.metrics = mp;
    out = pack(&f, ret_len);
done:
    free(m);
    free(mp);
    return out;
}
