/* msm_api: ClientFrame -> validated msm_call, native structs -> ServerFrame bytes (see msm_api.h). */
#include "msm_api.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "msm_code.h"
#include "msm_frame.h"
#include "msmoe.pb-c.h"

#define MAX_STOP_STRING 256

/* Unknown fields are refused: a client option this daemon does not understand must not be
 * silently ignored. */
static int check_unknown(const ProtobufCMessage *m, const char *what, msm_err *err) {
    if (m && m->n_unknown_fields > 0)
        return msm_err_set(err, -EINVAL, "unknown field number %u in %s", m->unknown_fields[0].tag, what);
    return 0;
}

static const char no_tokenizer[] =
    "needs a tokenizer, and this daemon has none (no tokenizer.json in the model directory)";

/* A tokenizer failure: out of memory, or else something wrong with the client's text or ids. */
static int tok_fail(int rc, const char *field, const msm_err *tok_err, msm_err *err) {
    return msm_err_set(err, rc == -ENOMEM ? -ENOMEM : -EINVAL, "%s: %s", field, tok_err->msg);
}

static bool valid_utf8(const char *s, size_t n) {
    return u8_check((const uint8_t *)s, n) == NULL;
}

/* A token covers at most msm_detok_max_out bytes of its text (3 times the longest piece, with room
 * for U+FFFD), and a normaliser shrinks the input at most 3 times (NFC of a decomposed Hangul
 * syllable), so a text of len bytes encodes to at least len / (2 * max_out) tokens. */
size_t msm_api_min_tokens(const msm_api_limits *lim, size_t len) {
    return len / (2 * msm_detok_max_out(lim->tok));
}

/* A prompt_text or Tokenize text, before any encoding: a tokenizer, and a length within the cap. */
static int check_text(const msm_api_limits *lim, const char *field, size_t len, msm_err *err) {
    if (!lim->tok)
        return msm_err_set(err, -ENOTSUP, "%s %s; send token ids", field, no_tokenizer);
    if (len > MSM_API_MAX_TEXT_BYTES)
        return msm_err_set(err, -EINVAL, "%s has %zu bytes: at most %u", field, len, MSM_API_MAX_TEXT_BYTES);
    return 0;
}

/* Takes a copy of the text for msm_api_text (the unpacked frame is freed before it runs). */
static int defer_text(msm_call *call, const char *text, bool add_special, bool parse_special, msm_err *err) {
    size_t len = strlen(text);
    call->in_text = malloc(len + 1);
    if (!call->in_text)
        return msm_err_set(err, -ENOMEM, "out of memory");
    memcpy(call->in_text, text, len + 1);
    call->in_len = len;
    call->tok_flags = (add_special ? MSM_TOK_ADD_SPECIAL : 0) | (parse_special ? MSM_TOK_PARSE_SPECIAL : 0);
    call->text_pending = true;
    return 0;
}

/* The deferred text -> ids. */
static int encode_text(const msm_api_limits *lim, const char *field, const msm_call *call, int32_t **ret_ids,
                       size_t *ret_n, msm_err *err) {
    msm_err tok_err = {{0}};
    int rc = msm_tokenizer_encode_flags(lim->tok, call->in_text, call->in_len, call->tok_flags, ret_ids, ret_n,
                                        &tok_err);
    if (rc < 0)
        return tok_fail(rc, field, &tok_err, err);
    return 0;
}

/* Strings cannot carry a NUL byte: protobuf-c unpacks a string field into a NUL-terminated copy,
 * so text after a NUL would silently vanish ("Once\0 upon a time" would be served as "Once").
 * The frame's wire bytes are walked field by field through the message descriptors (nested
 * messages too) and a string field holding a NUL is refused, named. Runs after a successful
 * unpack, so the wire is well formed; anything unexpected just ends the walk. */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret) {
    uint64_t v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *ret = v;
            return true;
        }
    }
    return false;
}

static int find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, const char *prefix,
                    int depth, msm_err *err) {
    const uint8_t *end = p + n;
    while (p < end && depth < 8) {
        uint64_t tag, v;
        if (!wire_varint(&p, end, &tag))
            return 0;
        unsigned wt = (unsigned)(tag & 7);
        if (wt == 0 && !wire_varint(&p, end, &v))
            return 0;
        if (wt == 1 || wt == 5) {
            size_t k = wt == 1 ? 8 : 4;
            if ((size_t)(end - p) < k)
                return 0;
            p += k;
        }
        if (wt != 2)
            continue;
        if (!wire_varint(&p, end, &v) || v > (uint64_t)(end - p))
            return 0;
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
        char path[128];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", f ? f->name : "");
        const uint8_t *nul = f && f->type == PROTOBUF_C_TYPE_STRING ? memchr(p, 0, (size_t)v) : NULL;
        if (nul)
            return msm_err_set(err, -EINVAL, "%s contains a NUL byte (at byte %zu of %llu): strings cannot carry NUL",
                               path, (size_t)(nul - p), (unsigned long long)v);
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int rc = find_nul(f->descriptor, p, (size_t)v, path, depth + 1, err);
            if (rc < 0)
                return rc;
        }
        p += v;
    }
    return 0;
}

/* ---- Generate: checks (cheap ones first), then the native request ---- */

/* The prompt: exactly one of ids and text, ids inside the vocabulary and the context. An empty
 * prompt_text is a text prompt (with a BOS it is llama2.c's unconditional generation). */
static int check_prompt(const Msmoe__V1__GenerateRequest *g, const msm_api_limits *lim, msm_err *err) {
    bool text = g->prompt_text != NULL;
    if (text && g->n_prompt_ids > 0)
        return msm_err_set(err, -EINVAL, "generate: set prompt_ids or prompt_text, not both");
    if (!text && g->n_prompt_ids == 0)
        return msm_err_set(err, -EINVAL,
                           "generate: the prompt is missing: set prompt_ids or prompt_text (prompt_ids is empty)");
    if (text && !lim->tok)
        return msm_err_set(err, -ENOTSUP, "generate.prompt_text %s; send generate.prompt_ids", no_tokenizer);
    if (text) {
        size_t len = strlen(g->prompt_text), at_least = msm_api_min_tokens(lim, len);
        if (at_least >= (size_t)lim->max_context)
            return msm_err_set(err, -EINVAL, "generate.prompt_text has %zu bytes: it encodes to at least %zu tokens, "
                               "and max context is %d tokens (prompt + generated)", len, at_least, lim->max_context);
        return check_text(lim, "generate.prompt_text", len, err);
    }
    if (g->n_prompt_ids >= (size_t)lim->max_context)
        return msm_err_set(err, -EINVAL,
                           "generate.prompt_ids has %zu tokens; max context is %d tokens (prompt + generated)",
                           g->n_prompt_ids, lim->max_context);
    for (size_t i = 0; i < g->n_prompt_ids; i++)
        if (g->prompt_ids[i] < 0 || g->prompt_ids[i] >= lim->vocab)
            return msm_err_set(err, -EINVAL, "generate.prompt_ids[%zu] = %d is outside the vocabulary [0, %d)", i,
                               g->prompt_ids[i], lim->vocab);
    return 0;
}

/* Sampling parameters; unset ones keep the defaults (temperature 1, all of top-k and top-p). */
static int convert_sampling(const Msmoe__V1__SamplingParams *s, const msm_api_limits *lim,
                            msm_sample_params *ret, msm_err *err) {
    msm_sample_params sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    if (s && s->has_temperature) {
        if (!isfinite(s->temperature) || s->temperature < 0)
            return msm_err_set(err, -EINVAL, "generate.sampling.temperature = %g: must be finite and >= 0",
                               (double)s->temperature);
        sp.temperature = s->temperature;
    }
    if (s && s->has_top_k) {
        if (s->top_k < 0 || s->top_k > lim->vocab)
            return msm_err_set(err, -EINVAL, "generate.sampling.top_k = %d: must be in [0, %d] (0 = all)", s->top_k,
                               lim->vocab);
        sp.top_k = s->top_k;
    }
    if (s && s->has_top_p) {
        if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
            return msm_err_set(err, -EINVAL, "generate.sampling.top_p = %g: must be in (0, 1]", (double)s->top_p);
        sp.top_p = s->top_p;
    }
    if (s && s->has_seed)
        sp.seed = s->seed;
    *ret = sp;
    return 0;
}

static int check_max_tokens(const Msmoe__V1__GenerateRequest *g, const msm_api_limits *lim, msm_err *err) {
    if (g->has_max_tokens && (g->max_tokens < 1 || g->max_tokens > (uint32_t)lim->max_tokens_limit))
        return msm_err_set(err, -EINVAL, "generate.max_tokens = %u: must be in [1, %d] (scheduler.max_tokens_limit)",
                           g->max_tokens, lim->max_tokens_limit);
    return 0;
}

/* Stop ids and strings, and logprobs, against their limits. */
static int check_stops(const Msmoe__V1__GenerateRequest *g, const msm_api_limits *lim, msm_err *err) {
    if (g->n_stop_token_ids + g->n_stop_strings > (size_t)lim->max_stop)
        return msm_err_set(err, -EINVAL, "generate: %zu stop token ids + %zu stop strings exceed scheduler.max_stop = %d",
                           g->n_stop_token_ids, g->n_stop_strings, lim->max_stop);
    for (size_t i = 0; i < g->n_stop_token_ids; i++)
        if (g->stop_token_ids[i] < 0 || g->stop_token_ids[i] >= lim->vocab)
            return msm_err_set(err, -EINVAL, "generate.stop_token_ids[%zu] = %d is outside the vocabulary [0, %d)", i,
                               g->stop_token_ids[i], lim->vocab);
    for (size_t i = 0; i < g->n_stop_strings; i++) {
        size_t L = strlen(g->stop_strings[i]);
        if (L == 0 || L > MAX_STOP_STRING)
            return msm_err_set(err, -EINVAL, "generate.stop_strings[%zu] has %zu bytes: must be 1..%d", i, L,
                               MAX_STOP_STRING);
        if (!valid_utf8(g->stop_strings[i], L))
            return msm_err_set(err, -EINVAL, "generate.stop_strings[%zu] is not valid UTF-8", i);
    }
    if (g->n_stop_strings > 0 && !lim->tok)
        return msm_err_set(err, -ENOTSUP, "generate.stop_strings %s", no_tokenizer);
    if (g->has_logprobs && g->logprobs > (uint32_t)lim->max_logprobs)
        return msm_err_set(err, -EINVAL, "generate.logprobs = %u: must be in [0, %d] (scheduler.max_logprobs)",
                           g->logprobs, lim->max_logprobs);
    return 0;
}

/* r's prompt_ids, copied. */
static int fill_prompt(const Msmoe__V1__GenerateRequest *g, msm_gen_request *r, msm_err *err) {
    r->n_prompt = (int)g->n_prompt_ids;
    r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt);
    if (!r->prompt)
        return msm_err_set(err, -ENOMEM, "out of memory");
    memcpy(r->prompt, g->prompt_ids, (size_t)r->n_prompt * sizeof *r->prompt);
    return 0;
}

/* The default max_tokens never asks for more than fits the context. */
static void default_max_tokens(const msm_api_limits *lim, msm_gen_request *r) {
    if (r->max_tokens > lim->max_context - r->n_prompt)
        r->max_tokens = lim->max_context - r->n_prompt;
}

/* A deferred prompt_text: encoded into r's prompt, then checked against the context and the
 * model's vocabulary. */
static int text_prompt(const msm_api_limits *lim, msm_call *call, msm_err *err) {
    msm_gen_request *r = call->gen;
    size_t n = 0;
    int rc = encode_text(lim, "generate.prompt_text", call, &r->prompt, &n, err);
    if (rc < 0)
        return rc;
    r->n_prompt = (int)(n < INT32_MAX ? n : INT32_MAX);
    if (n == 0)
        return msm_err_set(err, -EINVAL, "generate.prompt_text encodes to no tokens (the tokenizer adds no BOS); "
                           "give some text");
    if (n >= (size_t)lim->max_context)
        return msm_err_set(err, -EINVAL,
                           "generate.prompt_text encodes to %zu tokens; max context is %d tokens (prompt + generated)",
                           n, lim->max_context);
    for (size_t i = 0; i < n; i++)
        if (r->prompt[i] >= lim->vocab)
            return msm_err_set(err, -ENOTSUP, "generate.prompt_text: the tokenizer gave id %d, outside the model's "
                               "vocabulary [0, %d) (tokenizer.json does not match the model)", r->prompt[i], lim->vocab);
    if (call->max_tokens_default)
        default_max_tokens(lim, r);
    return 0;
}

/* r's stop rules, copied. */
static int fill_stops(const Msmoe__V1__GenerateRequest *g, msm_gen_request *r, msm_err *err) {
    r->n_stop_ids = (int)g->n_stop_token_ids;
    r->stop_ids = r->n_stop_ids ? malloc((size_t)r->n_stop_ids * sizeof *r->stop_ids) : NULL;
    r->n_stop_strings = (int)g->n_stop_strings;
    r->stop_strings = r->n_stop_strings ? calloc((size_t)r->n_stop_strings, sizeof *r->stop_strings) : NULL;
    bool oom = (r->n_stop_ids && !r->stop_ids) || (r->n_stop_strings && !r->stop_strings);
    for (int i = 0; !oom && i < r->n_stop_strings; i++)
        oom = !(r->stop_strings[i] = strdup(g->stop_strings[i]));
    if (oom)
        return msm_err_set(err, -ENOMEM, "out of memory");
    if (r->n_stop_ids)
        memcpy(r->stop_ids, g->stop_token_ids, (size_t)r->n_stop_ids * sizeof *r->stop_ids);
    return 0;
}

static int convert_generate(const Msmoe__V1__GenerateRequest *g, const msm_api_limits *lim, msm_call *call,
                            msm_err *err) {
    msm_sample_params sp;
    int rc;
    if ((rc = check_unknown(&g->base, "generate", err)) < 0 ||
        (g->sampling && (rc = check_unknown(&g->sampling->base, "generate.sampling", err)) < 0) ||
        (rc = check_prompt(g, lim, err)) < 0 || (rc = check_max_tokens(g, lim, err)) < 0 ||
        (rc = convert_sampling(g->sampling, lim, &sp, err)) < 0 || (rc = check_stops(g, lim, err)) < 0)
        return rc;
    msm_gen_request *r = calloc(1, sizeof *r);
    if (!r)
        return msm_err_set(err, -ENOMEM, "out of memory");
    call->gen = r;
    if (g->prompt_text)
        rc = defer_text(call, g->prompt_text, !g->has_add_special || g->add_special,
                        g->has_parse_special && g->parse_special, err);
    else
        rc = fill_prompt(g, r, err);
    if (rc < 0 || (rc = fill_stops(g, r, err)) < 0)
        return rc;
    r->sampling = sp;
    r->max_tokens = lim->max_tokens_default;
    call->max_tokens_default = !g->has_max_tokens;
    if (g->has_max_tokens)
        r->max_tokens = (int)g->max_tokens;
    else if (!g->prompt_text)
        default_max_tokens(lim, r);
    r->top_logprobs = g->has_logprobs ? (int)g->logprobs : 0;
    r->want_logprob = (g->has_return_logprob && g->return_logprob) || r->top_logprobs > 0;
    r->ignore_eos = g->has_ignore_eos && g->ignore_eos;
    return 0;
}

/* ---- Tokenize, Detokenize ---- */

static int convert_tokenize(const Msmoe__V1__TokenizeRequest *t, const msm_api_limits *lim, msm_call *call,
                            msm_err *err) {
    int rc = check_unknown(&t->base, "tokenize", err);
    if (rc < 0)
        return rc;
    if (!lim->tok)
        return msm_err_set(err, -ENOTSUP, "tokenize %s", no_tokenizer);
    const char *text = t->text ? t->text : "";
    if ((rc = check_text(lim, "tokenize.text", strlen(text), err)) < 0)
        return rc;
    return defer_text(call, text, !t->has_add_special || t->add_special, t->has_parse_special && t->parse_special,
                      err);
}

static int convert_detokenize(const Msmoe__V1__DetokenizeRequest *d, const msm_api_limits *lim, msm_call *call,
                              msm_err *err) {
    int rc = check_unknown(&d->base, "detokenize", err);
    if (rc < 0)
        return rc;
    if (!lim->tok)
        return msm_err_set(err, -ENOTSUP, "detokenize %s", no_tokenizer);
    if (d->n_ids > MSM_API_MAX_DETOK_IDS)
        return msm_err_set(err, -EINVAL, "detokenize.ids has %zu ids: at most %u", d->n_ids, MSM_API_MAX_DETOK_IDS);
    int vocab = msm_tokenizer_vocab_size(lim->tok);
    for (size_t i = 0; i < d->n_ids; i++)
        if (d->ids[i] < 0 || d->ids[i] >= vocab)
            return msm_err_set(err, -EINVAL, "detokenize.ids[%zu] = %d is outside the tokenizer's vocabulary [0, %d)",
                               i, d->ids[i], vocab);
    call->in_ids = malloc((d->n_ids ? d->n_ids : 1) * sizeof *call->in_ids);
    if (!call->in_ids)
        return msm_err_set(err, -ENOMEM, "out of memory");
    if (d->n_ids)
        memcpy(call->in_ids, d->ids, d->n_ids * sizeof *call->in_ids);
    call->n_in_ids = d->n_ids;
    call->skip_special = d->has_skip_special && d->skip_special;
    call->text_pending = true;
    return 0;
}

/* The deferred Detokenize: ids -> text, NUL characters dropped (the API's strings cannot carry
 * them). */
static int text_detokenize(const msm_api_limits *lim, msm_call *call, msm_err *err) {
    msm_err tok_err = {{0}};
    int rc = msm_tokenizer_decode(lim->tok, call->in_ids, call->n_in_ids, call->skip_special, &call->text,
                                  &call->text_len, &tok_err);
    if (rc < 0)
        return tok_fail(rc, "detokenize", &tok_err, err);
    size_t k = 0;
    for (size_t i = 0; i < call->text_len; i++)
        if (call->text[i])
            call->text[k++] = call->text[i];
    call->text[k] = 0;
    call->text_len = k;
    return 0;
}

int msm_api_text(msm_call *call, const msm_api_limits *lim, msm_err *err) {
    int rc = 0;
    if (!call->text_pending)
        return 0;
    if (call->kind == MSM_CALL_GENERATE)
        rc = text_prompt(lim, call, err);
    else if (call->kind == MSM_CALL_TOKENIZE)
        rc = encode_text(lim, "tokenize.text", call, &call->ids, &call->n_ids, err);
    else if (call->kind == MSM_CALL_DETOKENIZE)
        rc = text_detokenize(lim, call, err);
    free(call->in_text);
    free(call->in_ids);
    call->in_text = NULL;
    call->in_ids = NULL;
    call->text_pending = false;
    return rc;
}

void msm_call_done(msm_call *c) {
    if (!c)
        return;
    free(c->ids);
    free(c->text);
    free(c->in_text);
    free(c->in_ids);
    c->ids = NULL;
    c->text = NULL;
    c->in_text = NULL;
    c->in_ids = NULL;
    c->n_ids = c->text_len = 0;
    c->text_pending = false;
}

/* The call a decoded frame carries, converted into *call. */
static int convert_call(const Msmoe__V1__ClientFrame *f, const msm_api_limits *lim, msm_call *call, msm_err *err) {
    switch (f->call_case) {
    case MSMOE__V1__CLIENT_FRAME__CALL_GENERATE:
        call->kind = MSM_CALL_GENERATE;
        return convert_generate(f->generate, lim, call, err);
    case MSMOE__V1__CLIENT_FRAME__CALL_CANCEL:
        call->kind = MSM_CALL_CANCEL;
        return check_unknown(&f->cancel->base, "cancel", err);
    case MSMOE__V1__CLIENT_FRAME__CALL_HEALTH:
        call->kind = MSM_CALL_HEALTH;
        return check_unknown(&f->health->base, "health", err);
    case MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO:
        call->kind = MSM_CALL_MODEL_INFO;
        return check_unknown(&f->model_info->base, "model_info", err);
    case MSMOE__V1__CLIENT_FRAME__CALL_METRICS:
        call->kind = MSM_CALL_METRICS;
        return check_unknown(&f->metrics->base, "metrics", err);
    case MSMOE__V1__CLIENT_FRAME__CALL_TOKENIZE:
        call->kind = MSM_CALL_TOKENIZE;
        return convert_tokenize(f->tokenize, lim, call, err);
    case MSMOE__V1__CLIENT_FRAME__CALL_DETOKENIZE:
        call->kind = MSM_CALL_DETOKENIZE;
        return convert_detokenize(f->detokenize, lim, call, err);
    default:
        return msm_err_set(err, -EINVAL,
                           "frame carries no call (generate, cancel, health, model_info, metrics, tokenize, detokenize)");
    }
}

int msm_api_parse(const uint8_t *buf, size_t len, const msm_api_limits *lim, msm_call *ret, uint64_t *reply_id,
                  msm_err *err) {
    *reply_id = 0;
    Msmoe__V1__ClientFrame *f = msmoe__v1__client_frame__unpack(NULL, len, buf);
    if (!f)
        return msm_err_set(err, -EBADMSG, "malformed frame: %zu bytes are not a msmoe.v1.ClientFrame", len);
    msm_call call = {0};
    *reply_id = f->has_request_id ? f->request_id : 0;
    int rc = check_unknown(&f->base, "ClientFrame", err);
    if (rc == 0 && (!f->has_request_id || f->request_id == 0))
        rc = msm_err_set(err, -EINVAL, "request_id must be set and nonzero");
    if (rc == 0)
        rc = find_nul(&msmoe__v1__client_frame__descriptor, buf, len, "", 0, err);
    if (rc == 0) {
        call.request_id = f->request_id;
        rc = convert_call(f, lim, &call, err);
    }
    if (rc == 0) {
        if (call.gen)
            call.gen->request_id = f->request_id;
        *ret = call;
    } else {
        msm_gen_request_free(call.gen);
        msm_call_done(&call);
    }
    msmoe__v1__client_frame__free_unpacked(f, NULL);
    return rc;
}

int msm_api_decode(const uint8_t *buf, size_t len, const msm_api_limits *lim, msm_call *ret, uint64_t *reply_id,
                   msm_err *err) {
    int rc = msm_api_parse(buf, len, lim, ret, reply_id, err);
    if (rc == 0 && (rc = msm_api_text(ret, lim, err)) < 0) {
        msm_gen_request_free(ret->gen);
        ret->gen = NULL;
        msm_call_done(ret);
    }
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
    c.text = ev->text;
    if (ev->finish != MSM_FINISH_NONE) {
        c.has_finish_reason = 1;
        c.finish_reason = (Msmoe__V1__FinishReason)ev->finish;
        u.has_prompt_tokens = u.has_completion_tokens = 1;
        u.prompt_tokens = (uint32_t)ev->prompt_tokens;
        u.completion_tokens = (uint32_t)ev->completion_tokens;
        c.usage = &u;
        if (ev->finish == MSM_FINISH_ERROR) {
            err.has_code = 1;
            err.code = (Msmoe__V1__Code)msm_code_from_errno(ev->error);
            err.message = (char *)ev->error_msg.msg;
            c.error = &err;
        }
    }
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_error(uint64_t request_id, int err, const char *msg, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__Status st = MSMOE__V1__STATUS__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_ERROR;
    f.error = &st;
    st.has_code = 1;
    st.code = (Msmoe__V1__Code)msm_code_from_errno(err);
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
    r.has_has_tokenizer = 1;
    r.has_tokenizer = mi->tokenizer != NULL;
    if (mi->tokenizer) {
        r.tokenizer = (char *)mi->tokenizer;
        r.has_tokenizer_vocab = 1;
        r.tokenizer_vocab = (uint32_t)mi->tokenizer_vocab;
    }
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_tokenize(uint64_t request_id, const int32_t *ids, size_t n, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__TokenizeReply r = MSMOE__V1__TOKENIZE_REPLY__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE;
    f.tokenize = &r;
    r.n_ids = n;
    r.ids = (int32_t *)ids;
    return pack(&f, ret_len);
}

uint8_t *msm_api_encode_detokenize(uint64_t request_id, const char *text, size_t *ret_len) {
    Msmoe__V1__ServerFrame f = MSMOE__V1__SERVER_FRAME__INIT;
    Msmoe__V1__DetokenizeReply r = MSMOE__V1__DETOKENIZE_REPLY__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.reply_case = MSMOE__V1__SERVER_FRAME__REPLY_DETOKENIZE;
    f.detokenize = &r;
    r.text = (char *)(text ? text : "");
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
