/* msm_openai: OpenAI request parsing and reply rendering (see msm_openai.h). Nothing here keeps
 * state between calls: parsing and the tokenizer routes run on libuv's thread pool, several at
 * once (the context and the tokenizer they read are immutable), rendering on the loop thread. */
#include "msm_openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <unistr.h>

#define MAX_STOP_STRING 256
#define MAX_N 16
#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

int msm_oai_fail(msm_oai_error *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->msg.msg, sizeof e->msg.msg, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

void msm_oai_request_done(msm_oai_request *r) {
    for (int i = 0; i < r->n_prompts; i++)
        free(r->prompts[i].ids);
    free(r->prompts);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* ---- JSON fields ---- */

static int parse_body(const char *body, size_t len, json_object **ret, msm_oai_error *e) {
    if (len == 0)
        return msm_oai_fail(e, 400, "", "the request body is empty: send a JSON object");
    json_tokener *tk = json_tokener_new_ex(64);
    if (!tk)
        return msm_oai_fail(e, 503, "", "out of memory");
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tk, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tk);
    size_t used = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    if (!o || je != json_tokener_success || used != len) {
        json_object_put(o);
        if (je == json_tokener_success)
            je = o ? json_tokener_error_parse_unexpected : json_tokener_continue;
        return msm_oai_fail(e, 400, "", "the request body is not valid JSON: %s at byte %zu",
                            je == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(je), used);
    }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return msm_oai_fail(e, 400, "", "the request body must be a JSON object");
    }
    *ret = o;
    return 0;
}

/* e's param becomes "prefix.param" (a nested field). */
static void prefix_param(msm_oai_error *e, const char *prefix) {
    char p[256];
    snprintf(p, sizeof p, "%s.%s", prefix, e->param);
    size_t L = strlen(p);
    if (L >= sizeof e->param)
        L = sizeof e->param - 1;
    memcpy(e->param, p, L);
    e->param[L] = 0;
}

/* Refuses a key not in the NULL-terminated list. */
static int check_keys(json_object *o, const char *const *known, msm_oai_error *e) {
    json_object_object_foreach(o, key, val) {
        (void)val;
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok)
            return msm_oai_fail(e, 400, key, "Unrecognized request argument supplied: %s", key);
    }
    return 0;
}

/* The value of key, or NULL when absent or JSON null. */
static json_object *field(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static int get_int(json_object *o, const char *key, long long lo, long long hi, long long *val, msm_oai_error *e) {
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_int))
        return msm_oai_fail(e, 400, key, "'%s' must be an integer", key);
    errno = 0;
    long long x = json_object_get_int64(v);
    if (errno || x < lo || x > hi)
        return msm_oai_fail(e, 400, key, "'%s' = %lld: must be in [%lld, %lld]", key, x, lo, hi);
    *val = x;
    return 1;
}

static int get_num(json_object *o, const char *key, double *val, msm_oai_error *e) {
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return msm_oai_fail(e, 400, key, "'%s' must be a number", key);
    *val = json_object_get_double(v);
    if (!isfinite(*val))
        return msm_oai_fail(e, 400, key, "'%s' must be finite", key);
    return 1;
}

static int get_bool(json_object *o, const char *key, bool *val, msm_oai_error *e) {
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return msm_oai_fail(e, 400, key, "'%s' must be a boolean", key);
    *val = json_object_get_boolean(v);
    return 1;
}

/* ---- the parameters both endpoints share ---- */

static int check_model(const msm_oai_ctx *c, json_object *o, msm_oai_error *e) {
    json_object *v = field(o, "model");
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_string))
        return msm_oai_fail(e, 400, "model", "'model' must be a string");
    if (strcmp(json_object_get_string(v), c->model) != 0)
        return msm_oai_fail(e, 404, "model", "The model '%s' does not exist: this server serves '%s'",
                            json_object_get_string(v), c->model);
    return 0;
}

/* The body parsed as a JSON object with only known keys and the served model (or none). On
 * failure *ret is NULL. */
static int open_request(const msm_oai_ctx *c, const char *body, size_t len, const char *const *known,
                        json_object **ret, msm_oai_error *e) {
    json_object *o = NULL;
    int rc = parse_body(body, len, &o, e);
    if (rc == 0)
        rc = check_keys(o, known, e);
    if (rc == 0)
        rc = check_model(c, o, e);
    if (rc < 0) {
        json_object_put(o);
        o = NULL;
    }
    *ret = o;
    return rc;
}

/* Options accepted only at their neutral value (the daemon does not implement them). */
static int check_unsupported(json_object *o, msm_oai_error *e) {
    static const char *const zero_ok[] = {"presence_penalty", "frequency_penalty", "repetition_penalty", NULL};
    for (int i = 0; zero_ok[i]; i++) {
        double x = 0;
        int rc = get_num(o, zero_ok[i], &x, e);
        if (rc < 0)
            return rc;
        if (rc > 0 && x != (strcmp(zero_ok[i], "repetition_penalty") ? 0.0 : 1.0))
            return msm_oai_fail(e, 400, zero_ok[i], "'%s' = %g is not supported (only its neutral value)",
                                zero_ok[i], x);
    }
    json_object *lb = field(o, "logit_bias");
    if (lb && !(json_object_is_type(lb, json_type_object) && json_object_object_length(lb) == 0))
        return msm_oai_fail(e, 400, "logit_bias", "'logit_bias' is not supported");
    json_object *user = field(o, "user");
    if (user && !json_object_is_type(user, json_type_string))
        return msm_oai_fail(e, 400, "user", "'user' must be a string");
    return 0;
}

static int parse_sampling(json_object *o, const msm_api_limits *lim, msm_oai_request *r, msm_oai_error *e) {
    double x = 0;
    long long k = 0;
    int rc;
    r->sampling = (msm_sample_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
    if ((rc = get_num(o, "temperature", &x, e)) < 0)
        return rc;
    if (rc && (x < 0 || x > 2))
        return msm_oai_fail(e, 400, "temperature", "'temperature' = %g: must be in [0, 2]", x);
    if (rc)
        r->sampling.temperature = (float)x;
    if ((rc = get_num(o, "top_p", &x, e)) < 0)
        return rc;
    if (rc && !(x > 0 && x <= 1))
        return msm_oai_fail(e, 400, "top_p", "'top_p' = %g: must be in (0, 1]", x);
    if (rc)
        r->sampling.top_p = (float)x;
    if ((rc = get_int(o, "top_k", -1, lim->vocab, &k, e)) < 0)
        return rc;
    if (rc)
        r->sampling.top_k = k < 0 ? 0 : (int32_t)k; /* -1 and 0: all (vLLM writes -1) */
    if ((rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &k, e)) < 0)
        return rc;
    if (rc) {
        r->sampling.seed = (uint64_t)k;
        r->has_seed = true;
    }
    return 0;
}

static int parse_stop(json_object *o, const msm_api_limits *lim, msm_oai_request *r, msm_oai_error *e) {
    json_object *v = field(o, "stop");
    if (!v)
        return 0;
    bool one = json_object_is_type(v, json_type_string);
    if (!one && !json_object_is_type(v, json_type_array))
        return msm_oai_fail(e, 400, "stop", "'stop' must be a string or a list of strings");
    int n = one ? 1 : (int)json_object_array_length(v);
    if (n > lim->max_stop)
        return msm_oai_fail(e, 400, "stop", "'stop' has %d strings: at most %d (scheduler.max_stop)", n,
                            lim->max_stop);
    if (n > 0 && !lim->tok)
        return msm_oai_fail(e, 400, "stop", "'stop' needs a tokenizer, and this daemon has none");
    r->stop = calloc((size_t)n + 1, sizeof *r->stop);
    if (!r->stop)
        return msm_oai_fail(e, 503, "", "out of memory");
    for (int i = 0; i < n; i++) {
        json_object *s = one ? v : json_object_array_get_idx(v, (size_t)i);
        char param[32];
        snprintf(param, sizeof param, one ? "stop" : "stop[%d]", i);
        if (!json_object_is_type(s, json_type_string))
            return msm_oai_fail(e, 400, param, "'%s' must be a string", param);
        size_t L = (size_t)json_object_get_string_len(s);
        if (L == 0 || L > MAX_STOP_STRING || memchr(json_object_get_string(s), 0, L))
            return msm_oai_fail(e, 400, param, "'%s' has %zu bytes: must be 1..%d, without NUL", param, L,
                                MAX_STOP_STRING);
        if (!(r->stop[i] = strdup(json_object_get_string(s))))
            return msm_oai_fail(e, 503, "", "out of memory");
        r->n_stop = i + 1;
    }
    return 0;
}

static int parse_n(json_object *o, msm_oai_request *r, msm_oai_error *e) {
    long long n = 1, best = 0;
    int rc;
    if ((rc = get_int(o, "n", 1, MAX_N, &n, e)) < 0)
        return rc;
    r->n = (int)n;
    if ((rc = get_int(o, "best_of", 1, 1 << 20, &best, e)) < 0)
        return rc;
    if (rc && best != n)
        return msm_oai_fail(e, 400, "best_of", "'best_of' = %lld is not supported: only best_of = n (%lld)", best,
                            n);
    return 0;
}

static int parse_stream(json_object *o, msm_oai_request *r, msm_oai_error *e) {
    int rc;
    if ((rc = get_bool(o, "stream", &r->stream, e)) < 0)
        return rc;
    json_object *so = field(o, "stream_options");
    if (!so)
        return 0;
    if (!r->stream)
        return msm_oai_fail(e, 400, "stream_options", "'stream_options' is only allowed with stream: true");
    if (!json_object_is_type(so, json_type_object))
        return msm_oai_fail(e, 400, "stream_options", "'stream_options' must be an object");
    static const char *const known[] = {"include_usage", "continuous_usage_stats", NULL};
    if ((rc = check_keys(so, known, e)) < 0) {
        prefix_param(e, "stream_options");
        return rc;
    }
    if ((rc = get_bool(so, "include_usage", &r->include_usage, e)) < 0)
        snprintf(e->param, sizeof e->param, "stream_options.include_usage");
    return rc < 0 ? rc : 0;
}

/* max_tokens (or chat's max_completion_tokens): dflt when absent; fits the context. */
static int parse_max_tokens(json_object *o, const char *key, const msm_api_limits *lim, int dflt,
                            msm_oai_request *r, msm_oai_error *e) {
    long long m = dflt;
    json_object *v = field(o, key);
    if (v && !json_object_is_type(v, json_type_int))
        return msm_oai_fail(e, 400, key, "'%s' must be an integer", key);
    if (v) {
        m = json_object_get_int64(v);
        if (m < 0 || m > lim->max_tokens_limit)
            return msm_oai_fail(e, 400, key, "'%s' = %lld: must be in [0, %d] (scheduler.max_tokens_limit)", key, m,
                                lim->max_tokens_limit);
    }
    r->max_tokens = (int)m;
    return 0;
}

/* ---- prompts ---- */

static int add_prompt(msm_oai_request *r, int32_t *ids, int n, msm_oai_error *e) {
    msm_oai_prompt *p = realloc(r->prompts, (size_t)(r->n_prompts + 1) * sizeof *p);
    if (!p) {
        free(ids);
        return msm_oai_fail(e, 503, "", "out of memory");
    }
    r->prompts = p;
    r->prompts[r->n_prompts++] = (msm_oai_prompt){ids, n};
    return 0;
}

static int check_prompt_len(const msm_api_limits *lim, const char *param, int n, msm_oai_error *e) {
    if (n < 1)
        return msm_oai_fail(e, 400, param, "'%s' is empty (and the tokenizer adds no BOS)", param);
    if (n >= lim->max_context)
        return msm_oai_fail(e, 400, param, "'%s' has %d tokens; this model's maximum context length is %d tokens "
                            "(prompt + generated)", param, n, lim->max_context);
    return 0;
}

/* Text -> ids with the model's tokenizer; flags as msm_tokenizer_encode_flags. */
static int encode(const msm_api_limits *lim, const char *param, const char *text, size_t len, unsigned flags,
                  msm_oai_request *r, msm_oai_error *e) {
    if (!lim->tok)
        return msm_oai_fail(e, 400, param, "text prompts need a tokenizer, and this daemon has none: send token ids");
    if (len > MSM_API_MAX_TEXT_BYTES)
        return msm_oai_fail(e, 400, param, "'%s' has %zu bytes: at most %u", param, len, MSM_API_MAX_TEXT_BYTES);
    if (memchr(text, 0, len))
        return msm_oai_fail(e, 400, param, "'%s' contains a NUL character", param);
    size_t at_least = msm_api_min_tokens(lim, len);
    if (at_least >= (size_t)lim->max_context) /* refused unread */
        return msm_oai_fail(e, 400, param, "'%s' has %zu bytes: it encodes to at least %zu tokens; this model's "
                            "maximum context length is %d tokens (prompt + generated)", param, len, at_least,
                            lim->max_context);
    int32_t *ids = NULL;
    size_t n = 0;
    msm_err terr = {{0}};
    int rc = msm_tokenizer_encode_flags(lim->tok, text, len, flags, &ids, &n, &terr);
    if (rc < 0)
        return msm_oai_fail(e, rc == -ENOMEM ? 503 : 400, param, "'%s': %s", param, terr.msg);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= lim->vocab) {
            free(ids);
            return msm_oai_fail(e, 400, param, "'%s' encodes to id %d, outside the model's vocabulary [0, %d)",
                                param, ids[i], lim->vocab);
        }
    if ((rc = check_prompt_len(lim, param, (int)(n < INT32_MAX ? n : INT32_MAX), e)) < 0) {
        free(ids);
        return rc;
    }
    return add_prompt(r, ids, (int)n, e);
}

static int ids_prompt(const msm_api_limits *lim, const char *param, json_object *a, msm_oai_request *r,
                      msm_oai_error *e) {
    int n = (int)json_object_array_length(a);
    int rc = check_prompt_len(lim, param, n, e);
    if (rc < 0)
        return rc;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids)
        return msm_oai_fail(e, 503, "", "out of memory");
    for (int i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(a, (size_t)i);
        long long v = json_object_is_type(x, json_type_int) ? json_object_get_int64(x) : -1;
        if (!json_object_is_type(x, json_type_int) || v < 0 || v >= lim->vocab) {
            free(ids);
            return msm_oai_fail(e, 400, param, "'%s[%d]' must be a token id in [0, %d)", param, i, lim->vocab);
        }
        ids[i] = (int32_t)v;
    }
    return add_prompt(r, ids, n, e);
}

/* prompt: a string, a list of ids, or a list of strings or of id lists (a batch). */
static int parse_prompt(const msm_api_limits *lim, json_object *o, msm_oai_request *r, msm_oai_error *e) {
    json_object *p = field(o, "prompt");
    if (!p)
        return msm_oai_fail(e, 400, "prompt", "'prompt' is required");
    if (json_object_is_type(p, json_type_string))
        return encode(lim, "prompt", json_object_get_string(p), (size_t)json_object_get_string_len(p),
                      MSM_TOK_ADD_SPECIAL, r, e);
    if (!json_object_is_type(p, json_type_array) || json_object_array_length(p) == 0)
        return msm_oai_fail(e, 400, "prompt", "'prompt' must be a string, a list of token ids, or a non-empty list "
                            "of strings or of token id lists");
    json_object *first = json_object_array_get_idx(p, 0);
    if (json_object_is_type(first, json_type_int))
        return ids_prompt(lim, "prompt", p, r, e);
    int n = (int)json_object_array_length(p);
    if (n > MSM_OAI_MAX_CHOICES)
        return msm_oai_fail(e, 400, "prompt", "'prompt' holds %d prompts: at most %d", n, MSM_OAI_MAX_CHOICES);
    for (int i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(p, (size_t)i);
        char param[32];
        snprintf(param, sizeof param, "prompt[%d]", i);
        int rc;
        if (json_object_is_type(x, json_type_string))
            rc = encode(lim, param, json_object_get_string(x), (size_t)json_object_get_string_len(x),
                        MSM_TOK_ADD_SPECIAL, r, e);
        else if (json_object_is_type(x, json_type_array))
            rc = ids_prompt(lim, param, x, r, e);
        else
            rc = msm_oai_fail(e, 400, param, "'%s' must be a string or a list of token ids", param);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* As on the socket API, generation stops at the context (finish_reason "length") when prompt +
 * max_tokens exceed it; a default max_tokens is cut to what fits. */
static int check_fits(const msm_api_limits *lim, msm_oai_request *r, bool clamp, msm_oai_error *e) {
    for (int i = 0; clamp && i < r->n_prompts; i++)
        if ((long long)r->prompts[i].n + r->max_tokens > lim->max_context)
            r->max_tokens = lim->max_context - r->prompts[i].n;
    if (r->n_prompts * r->n > MSM_OAI_MAX_CHOICES)
        return msm_oai_fail(e, 400, "n", "%d prompts x n = %d choices: at most %d", r->n_prompts, r->n,
                            MSM_OAI_MAX_CHOICES);
    return 0;
}

int msm_oai_parse_completion(const msm_oai_ctx *c, const char *body, size_t len, msm_oai_request *ret,
                             msm_oai_error *e) {
    static const char *const known[] = {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs", "echo",
        "stream", "stream_options", "n", "best_of", "user", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "logit_bias", "suffix", "ignore_eos", NULL};
    const msm_api_limits *lim = c->lim;
    json_object *o = NULL;
    msm_oai_request r = {.kind = MSM_OAI_COMPLETION, .logprobs = -1};
    long long lp = -1;
    int rc = open_request(c, body, len, known, &o, e);
    if (rc == 0)
        rc = check_unsupported(o, e);
    if (rc == 0 && field(o, "suffix") && !(json_object_is_type(field(o, "suffix"), json_type_string) &&
                                           json_object_get_string_len(field(o, "suffix")) == 0))
        rc = msm_oai_fail(e, 400, "suffix", "'suffix' is not supported");
    if (rc == 0)
        rc = parse_n(o, &r, e);
    if (rc == 0)
        rc = parse_max_tokens(o, "max_tokens", lim, 16, &r, e);
    if (rc == 0)
        rc = parse_sampling(o, lim, &r, e);
    if (rc == 0)
        rc = parse_stop(o, lim, &r, e);
    if (rc == 0 && (rc = get_int(o, "logprobs", 0, lim->max_logprobs, &lp, e)) > 0)
        r.logprobs = (int)lp;
    if (rc >= 0)
        rc = get_bool(o, "echo", &r.echo, e);
    if (rc >= 0)
        rc = get_bool(o, "ignore_eos", &r.ignore_eos, e);
    if (rc >= 0)
        rc = parse_stream(o, &r, e);
    if (rc >= 0 && r.max_tokens == 0 && !r.echo)
        rc = msm_oai_fail(e, 400, "max_tokens", "'max_tokens' = 0 needs echo: true (nothing would be generated)");
    if (rc >= 0)
        rc = parse_prompt(lim, o, &r, e);
    if (rc >= 0)
        rc = check_fits(lim, &r, !field(o, "max_tokens"), e);
    json_object_put(o);
    if (rc < 0) {
        msm_oai_request_done(&r);
        return rc;
    }
    *ret = r;
    return 0;
}

/* ---- chat ---- */

/* A message's content: a string, or a list of {"type": "text", "text"} parts joined by "\n" (as
 * vLLM joins them). *ret is borrowed (a string) or owned (*ret_owned). */
static int message_content(json_object *m, const char *param, char **ret, bool *ret_owned, msm_oai_error *e) {
    json_object *c = field(m, "content");
    char p[64];
    snprintf(p, sizeof p, "%s.content", param);
    *ret_owned = false;
    if (!c) {
        *ret = (char *)"";
        return 0;
    }
    if (json_object_is_type(c, json_type_string)) {
        if (memchr(json_object_get_string(c), 0, (size_t)json_object_get_string_len(c)))
            return msm_oai_fail(e, 400, p, "'%s' contains a NUL character", p);
        *ret = (char *)json_object_get_string(c);
        return 0;
    }
    if (!json_object_is_type(c, json_type_array))
        return msm_oai_fail(e, 400, p, "'%s' must be a string or a list of text parts", p);
    msm_strbuf b = {0};
    for (size_t i = 0; i < json_object_array_length(c); i++) {
        json_object *part = json_object_array_get_idx(c, i), *type = field(part, "type"), *text = field(part, "text");
        if (!type || strcmp(json_object_get_string(type), "text") || !text ||
            !json_object_is_type(text, json_type_string)) {
            msm_strbuf_done(&b);
            return msm_oai_fail(e, 400, p, "'%s[%zu]' must be {\"type\": \"text\", \"text\": string} (only text "
                                "parts are supported)", p, i);
        }
        if (i)
            msm_strbuf_puts(&b, "\n");
        msm_strbuf_puts(&b, json_object_get_string(text));
    }
    *ret = msm_strbuf_take(&b, NULL);
    if (!*ret)
        return msm_oai_fail(e, 503, "", "out of memory");
    *ret_owned = true;
    return 0;
}

/* chat_template_kwargs (vLLM's): the template variables msmoed's renderers read, enable_thinking
 * (a boolean); any other key cannot be honoured and is refused by name. */
static int parse_template_kwargs(json_object *o, msm_chat_opts *opts, msm_oai_error *e) {
    json_object *k = field(o, "chat_template_kwargs");
    if (!k)
        return 0;
    if (!json_object_is_type(k, json_type_object))
        return msm_oai_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    json_object_object_foreach(k, key, val) {
        if (strcmp(key, "enable_thinking") != 0)
            return msm_oai_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.%s' is not supported (known: "
                                "enable_thinking)", key);
        if (!val) /* null: undefined, as when absent */
            continue;
        if (!json_object_is_type(val, json_type_boolean))
            return msm_oai_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a "
                                "boolean");
        opts->enable_thinking = json_object_get_boolean(val);
    }
    return 0;
}

/* messages -> the chat template's text -> ids (special tokens in the text are the template's). */
static int parse_messages(const msm_oai_ctx *c, json_object *o, const msm_chat_opts *opts, msm_oai_request *r,
                          msm_oai_error *e) {
    json_object *ms = field(o, "messages");
    if (!ms || !json_object_is_type(ms, json_type_array) || json_object_array_length(ms) == 0)
        return msm_oai_fail(e, 400, "messages", "'messages' must be a non-empty list");
    int n = (int)json_object_array_length(ms);
    if (n > 4096)
        return msm_oai_fail(e, 400, "messages", "'messages' holds %d messages: at most 4096", n);
    msm_chat_message *m = calloc((size_t)n, sizeof *m);
    bool *owned = calloc((size_t)n, sizeof *owned);
    int rc = m && owned ? 0 : msm_oai_fail(e, 503, "", "out of memory");
    static const char *const known[] = {"role", "content", "name", NULL};
    for (int i = 0; rc == 0 && i < n; i++) {
        json_object *x = json_object_array_get_idx(ms, (size_t)i), *role;
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!json_object_is_type(x, json_type_object)) {
            rc = msm_oai_fail(e, 400, param, "'%s' must be an object", param);
            break;
        }
        if ((rc = check_keys(x, known, e)) < 0) {
            prefix_param(e, param);
            break;
        }
        role = field(x, "role");
        const char *rs = role && json_object_is_type(role, json_type_string) ? json_object_get_string(role) : "";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            rc = msm_oai_fail(e, 400, "", "'%s.role' must be \"system\", \"user\" or \"assistant\"", param);
            snprintf(e->param, sizeof e->param, "%s.role", param);
            break;
        }
        m[i].role = rs;
        char *content;
        if ((rc = message_content(x, param, &content, &owned[i], e)) == 0)
            m[i].content = content;
    }
    char *text = NULL;
    msm_err terr = {{0}};
    if (rc == 0 && (rc = msm_chat_template_render(c->chat, m, n, opts, &text, &terr)) < 0)
        rc = msm_oai_fail(e, rc == -ENOMEM ? 503 : 400, "messages", "the chat template refused the messages: %s",
                          terr.msg);
    if (rc == 0)
        rc = encode(c->lim, "messages", text, strlen(text), MSM_TOK_PARSE_SPECIAL, r, e);
    free(text);
    for (int i = 0; m && owned && i < n; i++)
        if (owned[i])
            free((char *)m[i].content);
    free(m);
    free(owned);
    return rc;
}

int msm_oai_parse_chat(const msm_oai_ctx *c, const char *body, size_t len, msm_oai_request *ret,
                       msm_oai_error *e) {
    static const char *const known[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
        "logprobs", "top_logprobs", "stream", "stream_options", "n", "user", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "response_format", "ignore_eos",
        "add_generation_prompt", "chat_template_kwargs", NULL};
    const msm_api_limits *lim = c->lim;
    json_object *o = NULL;
    msm_oai_request r = {.kind = MSM_OAI_CHAT, .logprobs = -1};
    bool want_lp = false;
    msm_chat_opts opts = {.add_generation_prompt = true, .enable_thinking = -1};
    long long top = 0;
    int rc = open_request(c, body, len, known, &o, e);
    if (rc == 0)
        rc = check_unsupported(o, e);
    if (rc == 0 && field(o, "response_format")) {
        json_object *t = field(field(o, "response_format"), "type");
        if (!t || strcmp(json_object_get_string(t), "text"))
            rc = msm_oai_fail(e, 400, "response_format", "'response_format' other than {\"type\": \"text\"} is not "
                              "supported");
    }
    if (rc == 0)
        rc = parse_n(o, &r, e);
    if (rc == 0)
        rc = parse_max_tokens(o, field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", lim,
                              lim->max_tokens_default, &r, e);
    if (rc == 0 && r.max_tokens == 0)
        rc = msm_oai_fail(e, 400, field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                          "must be >= 1");
    if (rc == 0)
        rc = parse_sampling(o, lim, &r, e);
    if (rc == 0)
        rc = parse_stop(o, lim, &r, e);
    if (rc == 0)
        rc = get_bool(o, "logprobs", &want_lp, e);
    if (rc >= 0)
        rc = get_int(o, "top_logprobs", 0, lim->max_logprobs, &top, e);
    if (rc > 0 && !want_lp)
        rc = msm_oai_fail(e, 400, "top_logprobs", "'top_logprobs' needs logprobs: true");
    if (rc >= 0 && want_lp)
        r.logprobs = (int)top;
    if (rc >= 0)
        rc = get_bool(o, "ignore_eos", &r.ignore_eos, e);
    if (rc >= 0)
        rc = get_bool(o, "add_generation_prompt", &opts.add_generation_prompt, e);
    if (rc >= 0)
        rc = parse_template_kwargs(o, &opts, e);
    if (rc >= 0)
        rc = parse_stream(o, &r, e);
    if (rc >= 0 && !c->chat)
        rc = msm_oai_fail(e, 501, "", "chat completions are off: %s", c->chat_off);
    if (rc >= 0)
        rc = parse_messages(c, o, &opts, &r, e);
    if (rc >= 0)
        rc = check_fits(lim, &r, !field(o, "max_tokens") && !field(o, "max_completion_tokens"), e);
    json_object_put(o);
    if (rc < 0) {
        msm_oai_request_done(&r);
        return rc;
    }
    *ret = r;
    return 0;
}

msm_gen_request *msm_oai_gen_request(const msm_oai_request *r, int k) {
    const msm_oai_prompt *p = &r->prompts[k / r->n];
    msm_gen_request *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->prompt = malloc((size_t)p->n * sizeof *g->prompt);
    g->stop_strings = r->n_stop ? calloc((size_t)r->n_stop, sizeof *g->stop_strings) : NULL;
    bool oom = !g->prompt || (r->n_stop && !g->stop_strings);
    for (int i = 0; !oom && i < r->n_stop; i++, g->n_stop_strings = i)
        oom = !(g->stop_strings[i] = strdup(r->stop[i]));
    if (oom) {
        msm_gen_request_free(g);
        return NULL;
    }
    memcpy(g->prompt, p->ids, (size_t)p->n * sizeof *g->prompt);
    g->n_prompt = p->n;
    g->sampling = r->sampling;
    g->sampling.seed += (uint64_t)(k % r->n);
    g->max_tokens = r->max_tokens;
    g->ignore_eos = r->ignore_eos;
    if (r->logprobs >= 0) {
        g->want_logprob = true;
        g->top_logprobs = r->logprobs;
    }
    if (r->kind == MSM_OAI_COMPLETION && r->echo) {
        g->want_prompt_logprobs = true;
        g->prompt_top_logprobs = r->logprobs > 0 ? r->logprobs : 0;
    }
    return g;
}

/* ---- errors ---- */

static char *to_text(json_object *o, size_t *ret_len) {
    size_t n = 0;
    const char *s = o ? json_object_to_json_string_length(o, JSON_FLAGS, &n) : NULL;
    char *out = s ? malloc(n + 1) : NULL;
    if (out) {
        memcpy(out, s, n + 1);
        *ret_len = n;
    }
    json_object_put(o);
    return out;
}

static json_object *error_object(const msm_oai_error *e) {
    json_object *o = json_object_new_object(), *err = json_object_new_object();
    const char *type = e->status == 401   ? "authentication_error"
                       : e->status == 404 ? "invalid_request_error"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status >= 500 ? "server_error"
                                          : "invalid_request_error";
    const char *code = e->status == 401 ? "invalid_api_key" : e->status == 404 && e->param[0] ? "model_not_found" : NULL;
    json_object_object_add(err, "message", json_object_new_string(e->msg.msg));
    json_object_object_add(err, "type", json_object_new_string(type));
    json_object_object_add(err, "param", e->param[0] ? json_object_new_string(e->param) : NULL);
    json_object_object_add(err, "code", code ? json_object_new_string(code) : NULL);
    json_object_object_add(o, "error", err);
    return o;
}

char *msm_oai_error_json(const msm_oai_error *e, size_t *ret_len) {
    return to_text(error_object(e), ret_len);
}

/* ---- choices ---- */

int msm_oai_choice_add(msm_oai_choice *ch, const msm_sched_event *ev) {
    if (ev->n_prompt_lp > 0 && ch->prompt) {
        if (!ch->prompt_lp && !(ch->prompt_lp = calloc((size_t)ch->prompt->n, sizeof *ch->prompt_lp)))
            return -ENOMEM;
        for (int i = 0; i < ev->n_prompt_lp; i++) {
            int p = ev->prompt_lp_first + i;
            if (p >= 1 && p < ch->prompt->n) {
                ch->prompt_lp[p] = ev->prompt_lp[i];
                ch->n_prompt_lp++;
            }
        }
    }
    if (ev->has_token) {
        if (ch->n_toks == ch->cap_toks) {
            int cap = ch->cap_toks ? ch->cap_toks * 2 : 16;
            msm_token_logprob *t = realloc(ch->toks, (size_t)cap * sizeof *t);
            if (!t)
                return -ENOMEM;
            ch->toks = t;
            ch->cap_toks = cap;
        }
        msm_token_logprob *t = &ch->toks[ch->n_toks++];
        memset(t, 0, sizeof *t);
        t->token = ev->token;
        if (ev->has_logprob) {
            t->logprob = ev->logprob;
            t->n_top = ev->n_top;
            memcpy(t->top_ids, ev->top_ids, sizeof t->top_ids);
            memcpy(t->top_logprobs, ev->top_logprobs, sizeof t->top_logprobs);
        }
    }
    if (ev->text_len)
        msm_strbuf_append(&ch->text, ev->text, ev->text_len);
    if (ev->finish != MSM_FINISH_NONE) {
        ch->done = true;
        ch->finish = ev->finish;
        ch->prompt_tokens = ev->prompt_tokens;
        ch->completion_tokens = ev->completion_tokens;
        if (ev->finish == MSM_FINISH_ERROR) {
            ch->error = ev->error;
            ch->error_msg = ev->error_msg;
        }
    }
    return msm_strbuf_failed(&ch->text) ? -ENOMEM : 0;
}

void msm_oai_choice_done(msm_oai_choice *ch) {
    msm_strbuf_done(&ch->text);
    free(ch->toks);
    free(ch->prompt_lp);
    memset(ch, 0, sizeof *ch);
}

/* ---- rendering ---- */

static json_object *num(float x) {
    char buf[32];
    if (!isfinite(x))
        x = x < 0 ? -9999.0f : 0.0f; /* JSON has no -inf (OpenAI clients use -9999 for it) */
    snprintf(buf, sizeof buf, "%.9g", (double)x);
    return json_object_new_double_s((double)x, buf);
}

static const char *finish_name(msm_finish f) {
    return f == MSM_FINISH_LENGTH ? "length" : "stop";
}

/* The text of token id as it reads after other text (a SentencePiece word keeps its space). */
static void token_text(const msm_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    buf[0] = 0;
    if (!tok)
        return;
    msm_detok d;
    size_t n = 0, m = 0;
    msm_detok_init(&d, tok, MSM_DETOK_CONTINUE);
    if (msm_detok_push(&d, id, buf, cap - 1, &n, NULL) < 0)
        n = 0;
    if (msm_detok_flush(&d, buf + n, cap - 1 - n, &m) < 0)
        m = 0;
    buf[n + m] = 0;
}

/* Texts of a run of tokens decoded in sequence: piece i is what token i adds. */
typedef struct pieces {
    msm_detok d;
    char buf[1024];
} pieces;

static const char *piece_next(pieces *p, int32_t id, size_t *ret_len) {
    size_t n = 0;
    if (!p->d.tok || msm_detok_push(&p->d, id, p->buf, sizeof p->buf - 1, &n, NULL) < 0)
        n = 0;
    p->buf[n] = 0;
    *ret_len = n;
    return p->buf;
}

/* Completion logprobs of tokens [from, to) of a run (prompt positions or generated tokens). */
typedef struct lp_arrays {
    json_object *tokens, *token_lps, *top, *offsets;
} lp_arrays;

static void lp_add(const msm_oai_reply *rp, lp_arrays *a, const msm_token_logprob *t, bool has, const char *piece,
                   size_t offset) {
    json_object_array_add(a->tokens, json_object_new_string(piece));
    json_object_array_add(a->token_lps, has ? num(t->logprob) : NULL);
    json_object_array_add(a->offsets, json_object_new_int64((int64_t)offset));
    if (!has) {
        json_object_array_add(a->top, NULL);
        return;
    }
    json_object *d = json_object_new_object();
    char buf[256];
    for (int i = 0; i < t->n_top; i++) {
        token_text(rp->tok, t->top_ids[i], buf, sizeof buf);
        if (!json_object_object_get_ex(d, buf, NULL))
            json_object_object_add(d, buf, num(t->top_logprobs[i]));
    }
    if (t->n_top == 0) { /* logprobs: 0 still names the chosen token */
        token_text(rp->tok, t->token, buf, sizeof buf);
        json_object_object_add(d, buf, num(t->logprob));
    }
    json_object_array_add(a->top, d);
}

static json_object *lp_object(lp_arrays *a) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "tokens", a->tokens);
    json_object_object_add(o, "token_logprobs", a->token_lps);
    json_object_object_add(o, "top_logprobs", a->top);
    json_object_object_add(o, "text_offset", a->offsets);
    return o;
}

static void lp_init(lp_arrays *a) {
    a->tokens = json_object_new_array();
    a->token_lps = json_object_new_array();
    a->top = json_object_new_array();
    a->offsets = json_object_new_array();
}

/* The echoed prompt of a completion choice: its text into *text, its logprobs into a (when given). */
static void echo_prompt(const msm_oai_reply *rp, const msm_oai_choice *ch, msm_strbuf *text, lp_arrays *a) {
    pieces p;
    msm_detok_init(&p.d, rp->tok, 0);
    if (!rp->tok)
        p.d.tok = NULL;
    for (int i = 0; i < ch->prompt->n; i++) {
        size_t n, off = text->len;
        const char *s = piece_next(&p, ch->prompt->ids[i], &n);
        msm_strbuf_append(text, s, n);
        if (a) {
            msm_token_logprob t = i > 0 && ch->prompt_lp ? ch->prompt_lp[i] : (msm_token_logprob){0};
            lp_add(rp, a, &t, i > 0, s, off);
        }
    }
}

/* Generated tokens [from, to) of a completion choice into a; offsets continue from base. */
static void completion_lps(const msm_oai_reply *rp, const msm_oai_choice *ch, int from, int to, size_t base,
                           pieces *p, lp_arrays *a) {
    size_t off = base;
    for (int i = from; i < to; i++) {
        size_t n;
        const char *s = piece_next(p, ch->toks[i].token, &n);
        lp_add(rp, a, &ch->toks[i], true, s, off);
        off += n;
    }
}

/* Chat logprobs entries of generated tokens [from, to). */
static json_object *chat_lps(const msm_oai_reply *rp, const msm_oai_choice *ch, int from, int to) {
    json_object *content = json_object_new_array();
    char buf[256];
    for (int i = from; i < to; i++) {
        const msm_token_logprob *t = &ch->toks[i];
        json_object *e = json_object_new_object(), *tops = json_object_new_array();
        for (int k = -1; k < t->n_top; k++) {
            int32_t id = k < 0 ? t->token : t->top_ids[k];
            token_text(rp->tok, id, buf, sizeof buf);
            json_object *x = k < 0 ? e : json_object_new_object(), *bytes = json_object_new_array();
            for (const unsigned char *c = (const unsigned char *)buf; *c; c++)
                json_object_array_add(bytes, json_object_new_int(*c));
            json_object_object_add(x, "token", json_object_new_string(buf));
            json_object_object_add(x, "logprob", num(k < 0 ? t->logprob : t->top_logprobs[k]));
            json_object_object_add(x, "bytes", bytes);
            if (k >= 0)
                json_object_array_add(tops, x);
        }
        json_object_object_add(e, "top_logprobs", tops);
        json_object_array_add(content, e);
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "content", content);
    return o;
}

static json_object *usage(const msm_oai_reply *rp, const msm_oai_choice *chs, int n) {
    long long prompt = 0, completion = 0;
    for (int k = 0; k < n; k++) {
        if (k % rp->req->n == 0)
            prompt += chs[k].prompt->n; /* each prompt once, however many samples */
        completion += chs[k].completion_tokens;
    }
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64(prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int64(completion));
    json_object_object_add(u, "total_tokens", json_object_new_int64(prompt + completion));
    return u;
}

static json_object *envelope(const msm_oai_reply *rp, const char *object) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(rp->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(rp->created));
    json_object_object_add(o, "model", json_object_new_string(rp->model));
    return o;
}

char *msm_oai_render(const msm_oai_reply *rp, msm_oai_choice *chs, int n, size_t *ret_len) {
    bool chat = rp->req->kind == MSM_OAI_CHAT, want_lp = rp->req->logprobs >= 0;
    json_object *o = envelope(rp, chat ? "chat.completion" : "text_completion"), *choices = json_object_new_array();
    for (int k = 0; k < n; k++) {
        msm_oai_choice *ch = &chs[k];
        json_object *c = json_object_new_object(), *lp = NULL;
        json_object_object_add(c, "index", json_object_new_int(k));
        if (chat) {
            json_object *m = json_object_new_object();
            json_object_object_add(m, "role", json_object_new_string("assistant"));
            json_object_object_add(m, "content", json_object_new_string_len(ch->text.data ? ch->text.data : "",
                                                                              (int)ch->text.len));
            json_object_object_add(c, "message", m);
            if (want_lp)
                lp = chat_lps(rp, ch, 0, ch->n_toks);
        } else {
            msm_strbuf text = {0};
            lp_arrays a;
            if (want_lp)
                lp_init(&a);
            if (rp->req->echo)
                echo_prompt(rp, ch, &text, want_lp ? &a : NULL);
            if (want_lp) {
                pieces p;
                msm_detok_init(&p.d, rp->tok, MSM_DETOK_CONTINUE);
                if (!rp->tok)
                    p.d.tok = NULL;
                completion_lps(rp, ch, 0, ch->n_toks, text.len, &p, &a);
                lp = lp_object(&a);
            }
            msm_strbuf_append(&text, ch->text.data ? ch->text.data : "", ch->text.len);
            json_object_object_add(c, "text", json_object_new_string_len(text.data ? text.data : "", (int)text.len));
            msm_strbuf_done(&text);
        }
        json_object_object_add(c, "logprobs", lp);
        json_object_object_add(c, "finish_reason", json_object_new_string(finish_name(ch->finish)));
        json_object_array_add(choices, c);
    }
    json_object_object_add(o, "choices", choices);
    json_object_object_add(o, "usage", usage(rp, chs, n));
    return to_text(o, ret_len);
}

static void sse(msm_strbuf *out, json_object *o) {
    size_t n = 0;
    const char *s = json_object_to_json_string_length(o, JSON_FLAGS, &n);
    msm_strbuf_puts(out, "data: ");
    msm_strbuf_append(out, s, n);
    msm_strbuf_puts(out, "\n\n");
    json_object_put(o);
}

void msm_oai_stream_choice(const msm_oai_reply *rp, msm_oai_choice *ch, int k, msm_strbuf *out) {
    bool chat = rp->req->kind == MSM_OAI_CHAT, want_lp = rp->req->logprobs >= 0;
    bool prompt_ready = !rp->req->echo || !want_lp || ch->n_prompt_lp >= ch->prompt->n - 1 || ch->done;
    bool head = !ch->sent_head && (chat || (rp->req->echo && prompt_ready));
    bool news = ch->n_toks > ch->sent_toks || ch->text.len > ch->sent_text;
    if (!head && !news && !ch->done)
        return;
    if (!prompt_ready)
        return;
    json_object *o = envelope(rp, chat ? "chat.completion.chunk" : "text_completion");
    json_object *choices = json_object_new_array(), *c = json_object_new_object(), *lp = NULL;
    const char *delta = ch->text.data ? ch->text.data + ch->sent_text : "";
    int delta_len = (int)(ch->text.len - ch->sent_text);
    json_object_object_add(c, "index", json_object_new_int(k));
    if (chat) {
        json_object *d = json_object_new_object();
        if (head)
            json_object_object_add(d, "role", json_object_new_string("assistant"));
        if (head || delta_len > 0)
            json_object_object_add(d, "content", json_object_new_string_len(delta, delta_len));
        json_object_object_add(c, "delta", d);
        if (want_lp && ch->n_toks > ch->sent_toks)
            lp = chat_lps(rp, ch, ch->sent_toks, ch->n_toks);
    } else {
        msm_strbuf text = {0};
        lp_arrays a;
        if (want_lp)
            lp_init(&a);
        if (head)
            echo_prompt(rp, ch, &text, want_lp ? &a : NULL);
        if (want_lp) {
            /* the pieces of the new tokens: decode the whole run, keep the new ones */
            pieces p;
            msm_detok_init(&p.d, rp->tok, MSM_DETOK_CONTINUE);
            if (!rp->tok)
                p.d.tok = NULL;
            size_t base = 0, n;
            for (int i = 0; i < ch->sent_toks; i++) {
                piece_next(&p, ch->toks[i].token, &n);
                base += n;
            }
            completion_lps(rp, ch, ch->sent_toks, ch->n_toks, base, &p, &a);
            lp = lp_object(&a);
        }
        msm_strbuf_append(&text, delta, (size_t)delta_len);
        json_object_object_add(c, "text", json_object_new_string_len(text.data ? text.data : "", (int)text.len));
        msm_strbuf_done(&text);
    }
    json_object_object_add(c, "logprobs", lp);
    json_object_object_add(c, "finish_reason", ch->done ? json_object_new_string(finish_name(ch->finish)) : NULL);
    json_object_array_add(choices, c);
    json_object_object_add(o, "choices", choices);
    sse(out, o);
    ch->sent_head = ch->sent_head || head;
    ch->sent_toks = ch->n_toks;
    ch->sent_text = ch->text.len;
}

void msm_oai_stream_end(const msm_oai_reply *rp, const msm_oai_choice *chs, int n, msm_strbuf *out) {
    if (rp->req->include_usage) {
        json_object *o = envelope(rp, rp->req->kind == MSM_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        json_object_object_add(o, "choices", json_object_new_array());
        json_object_object_add(o, "usage", usage(rp, chs, n));
        sse(out, o);
    }
    msm_strbuf_puts(out, "data: [DONE]\n\n");
}

void msm_oai_stream_error(const msm_oai_error *e, msm_strbuf *out) {
    sse(out, error_object(e));
}

/* ---- tokenizer routes ---- */

char *msm_oai_tokenize(const msm_oai_ctx *c, const char *body, size_t len, size_t *ret_len, msm_oai_error *e) {
    static const char *const known[] = {"model", "prompt", "add_special_tokens", NULL};
    json_object *o = NULL;
    bool add = true;
    int rc = open_request(c, body, len, known, &o, e);
    if (rc == 0)
        rc = get_bool(o, "add_special_tokens", &add, e);
    json_object *p = rc >= 0 ? field(o, "prompt") : NULL;
    if (rc >= 0 && (!p || !json_object_is_type(p, json_type_string)))
        rc = msm_oai_fail(e, 400, "prompt", "'prompt' must be a string");
    if (rc >= 0 && !c->lim->tok)
        rc = msm_oai_fail(e, 501, "", "this daemon has no tokenizer");
    size_t plen = rc >= 0 ? (size_t)json_object_get_string_len(p) : 0;
    if (rc >= 0 && plen > MSM_API_MAX_TEXT_BYTES)
        rc = msm_oai_fail(e, 400, "prompt", "'prompt' has %zu bytes: at most %u", plen, MSM_API_MAX_TEXT_BYTES);
    int32_t *ids = NULL;
    size_t n = 0;
    msm_err terr = {{0}};
    /* Special tokens written in the text are parsed, as Hugging Face (and vLLM's /tokenize) do. */
    if (rc >= 0 && (rc = msm_tokenizer_encode_flags(c->lim->tok, json_object_get_string(p), plen,
                                                    MSM_TOK_PARSE_SPECIAL | (add ? MSM_TOK_ADD_SPECIAL : 0), &ids, &n,
                                                    &terr)) < 0)
        rc = msm_oai_fail(e, 400, "prompt", "'prompt': %s", terr.msg);
    json_object_put(o);
    if (rc < 0)
        return NULL;
    json_object *r = json_object_new_object(), *a = json_object_new_array_ext((int)n);
    for (size_t i = 0; i < n; i++)
        json_object_array_add(a, json_object_new_int(ids[i]));
    free(ids);
    json_object_object_add(r, "count", json_object_new_int64((int64_t)n));
    json_object_object_add(r, "max_model_len", json_object_new_int(c->lim->max_context));
    json_object_object_add(r, "tokens", a);
    char *out = to_text(r, ret_len);
    if (!out)
        msm_oai_fail(e, 503, "", "out of memory");
    return out;
}

char *msm_oai_detokenize(const msm_oai_ctx *c, const char *body, size_t len, size_t *ret_len, msm_oai_error *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    json_object *o = NULL;
    int rc = open_request(c, body, len, known, &o, e);
    json_object *t = rc >= 0 ? field(o, "tokens") : NULL;
    if (rc >= 0 && (!t || !json_object_is_type(t, json_type_array)))
        rc = msm_oai_fail(e, 400, "tokens", "'tokens' must be a list of token ids");
    if (rc >= 0 && !c->lim->tok)
        rc = msm_oai_fail(e, 501, "", "this daemon has no tokenizer");
    size_t n = rc >= 0 ? json_object_array_length(t) : 0;
    if (rc >= 0 && n > MSM_API_MAX_DETOK_IDS)
        rc = msm_oai_fail(e, 400, "tokens", "'tokens' has %zu ids: at most %u", n, MSM_API_MAX_DETOK_IDS);
    int32_t *ids = rc >= 0 ? malloc((n ? n : 1) * sizeof *ids) : NULL;
    if (rc >= 0 && !ids)
        rc = msm_oai_fail(e, 503, "", "out of memory");
    int vocab = rc >= 0 ? msm_tokenizer_vocab_size(c->lim->tok) : 0;
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        json_object *x = json_object_array_get_idx(t, i);
        long long v = json_object_is_type(x, json_type_int) ? json_object_get_int64(x) : -1;
        if (v < 0 || v >= vocab)
            rc = msm_oai_fail(e, 400, "tokens", "'tokens[%zu]' must be a token id in [0, %d)", i, vocab);
        else
            ids[i] = (int32_t)v;
    }
    char *text = NULL;
    size_t tlen = 0;
    msm_err terr = {{0}};
    if (rc >= 0 && (rc = msm_tokenizer_decode(c->lim->tok, ids, n, false, &text, &tlen, &terr)) < 0)
        rc = msm_oai_fail(e, 400, "tokens", "%s", terr.msg);
    free(ids);
    json_object_put(o);
    if (rc < 0)
        return NULL;
    json_object *r = json_object_new_object();
    json_object_object_add(r, "prompt", json_object_new_string_len(text, (int)tlen));
    free(text);
    char *out = to_text(r, ret_len);
    if (!out)
        msm_oai_fail(e, 503, "", "out of memory");
    return out;
}

static json_object *piece_or_null(const msm_tokenizer *tok, int id) {
    const char *p = tok && id >= 0 ? msm_tokenizer_token_piece(tok, id) : NULL;
    return p ? json_object_new_string(p) : NULL;
}

char *msm_oai_tokenizer_info(const msm_oai_ctx *c, const msm_api_model_info *info, size_t *ret_len) {
    const msm_tokenizer *tok = c->lim->tok;
    json_object *o = json_object_new_object();
    int bos = tok ? msm_tokenizer_bos_id(tok) : -1;
    json_object_object_add(o, "tokenizer_class", json_object_new_string("PreTrainedTokenizerFast"));
    json_object_object_add(o, "bos_token", piece_or_null(tok, bos));
    json_object_object_add(o, "eos_token", piece_or_null(tok, info->n_eos > 0 ? info->eos_ids[0] : -1));
    json_object_object_add(o, "pad_token", NULL);
    json_object_object_add(o, "model_max_length", json_object_new_int(c->lim->max_context));
    json_object_object_add(o, "vocab_size", json_object_new_int(tok ? msm_tokenizer_vocab_size(tok) : info->vocab));
    json_object_object_add(o, "chat_template", c->chat ? json_object_new_string(msm_chat_template_name(c->chat)) : NULL);
    return to_text(o, ret_len);
}

char *msm_oai_models(const msm_oai_ctx *c, const msm_api_model_info *info, long long created, size_t *ret_len) {
    json_object *o = json_object_new_object(), *data = json_object_new_array(), *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(c->model));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(created));
    json_object_object_add(m, "owned_by", json_object_new_string("msmoed"));
    json_object_object_add(m, "max_model_len", json_object_new_int(c->lim->max_context));
    json_object_array_add(data, m);
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    return to_text(o, ret_len);
}
