/* msm_openai: OpenAI's HTTP API shapes <-> native requests and replies (no sockets here).
 *
 * Parsing turns a JSON body of POST /v1/completions or /v1/chat/completions into an
 * msm_oai_request: the prompts as token ids (text encoded with the model's tokenizer; chat messages
 * rendered with the model's chat template first), the sampling parameters, stop strings, logprobs,
 * echo and stream flags, every value checked against the same limits as the socket API
 * (msm_api_limits). A bad value gives an msm_oai_error: the HTTP status, the parameter it names
 * ("max_tokens", "messages[2].role") and a message, rendered as OpenAI's error object
 * {"error": {"message", "type", "param", "code"}}. Unknown fields are refused (400), as OpenAI does.
 *
 * Rendering builds the JSON of a finished completion, of one streamed chunk (a server-sent event
 * "data: {...}\n\n") and of the tokenizer routes, from msm_oai_choice accumulators that the HTTP
 * layer fills from scheduler events.
 *
 * Parsing and the tokenizer routes (msm_oai_parse_*, msm_oai_tokenize, msm_oai_detokenize) only
 * read the msm_oai_ctx and the tokenizer: msm_http runs them on libuv's thread pool, several at
 * once, to keep text work off the loop thread. */
#ifndef MSM_OPENAI_H
#define MSM_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_api.h"
#include "msm_chat_template.h"
#include "msm_sched.h"
#include "msm_strbuf.h"

/* Choices one request may ask for: prompts x n. */
#define MSM_OAI_MAX_CHOICES 128

typedef enum msm_oai_kind { MSM_OAI_COMPLETION, MSM_OAI_CHAT } msm_oai_kind;

/* What parsing needs to know about the daemon. */
typedef struct msm_oai_ctx {
    const msm_api_limits *lim;
    const char *model;                 /* the served model id */
    const msm_chat_template *chat;     /* NULL: chat completions answer 501 with chat_off */
    const char *chat_off;              /* why there is no chat template */
} msm_oai_ctx;

typedef struct msm_oai_error {
    int status;                        /* 400, 404, 413, 429, 501, 503, ... */
    char param[96];                    /* the field, "" when none */
    msm_err msg;
} msm_oai_error;

/* Sets e and returns -EINVAL (for `return msm_oai_fail(...)`). */
int msm_oai_fail(msm_oai_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct msm_oai_prompt {
    int32_t *ids;                      /* [n] (owned) */
    int n;
} msm_oai_prompt;

typedef struct msm_oai_request {
    msm_oai_kind kind;
    msm_oai_prompt *prompts;           /* [n_prompts] (owned) */
    int n_prompts;
    int n;                             /* choices per prompt */
    int max_tokens;                    /* >= 0 (0: echo + logprobs scoring only) */
    msm_sample_params sampling;
    bool has_seed;
    char **stop;                       /* [n_stop] (owned) */
    int n_stop;
    bool stream, include_usage, echo, ignore_eos;
    int logprobs;                      /* -1: none; else the top-n (completions: logprobs; chat:
                                          top_logprobs with logprobs: true) */
} msm_oai_request;

void msm_oai_request_done(msm_oai_request *r);

int msm_oai_parse_completion(const msm_oai_ctx *c, const char *body, size_t len, msm_oai_request *ret,
                             msm_oai_error *e);
int msm_oai_parse_chat(const msm_oai_ctx *c, const char *body, size_t len, msm_oai_request *ret,
                       msm_oai_error *e);

/* Choice k (prompt k / n, sample k % n) as a scheduler request; conn_id and request_id left for the
 * caller. NULL: out of memory. Sampled choices after the first get seed + k % n, so n samples of one
 * prompt differ yet each is reproducible. */
msm_gen_request *msm_oai_gen_request(const msm_oai_request *r, int k);

/* The error object; *ret_len bytes, malloc'ed (NULL: out of memory). */
char *msm_oai_error_json(const msm_oai_error *e, size_t *ret_len);

/* ---- replies ---- */

/* What one choice produced, filled from its events. */
typedef struct msm_oai_choice {
    const msm_oai_prompt *prompt;
    msm_strbuf text;                   /* generated text */
    msm_token_logprob *toks;           /* [n_toks] generated tokens (logprob fields valid when the
                                          request wanted logprobs) */
    int n_toks, cap_toks;
    msm_token_logprob *prompt_lp;      /* [prompt->n] entry p for prompt position p (1..n-1) */
    int n_prompt_lp;                   /* positions received */
    bool done;
    msm_finish finish;
    int prompt_tokens, completion_tokens;
    int error;                         /* with MSM_FINISH_ERROR */
    msm_err error_msg;
    /* streaming: how much went out */
    int sent_toks;
    size_t sent_text;
    bool sent_head;                    /* chat: the role delta; completions: the echoed prompt */
} msm_oai_choice;

/* Adds one event's content (prompt logprobs, a token with its text delta, the finish). -ENOMEM. */
int msm_oai_choice_add(msm_oai_choice *ch, const msm_sched_event *ev);
void msm_oai_choice_done(msm_oai_choice *ch);

/* The id and creation time shared by a response's chunks. */
typedef struct msm_oai_reply {
    const msm_oai_request *req;
    const char *model;
    const msm_tokenizer *tok;          /* token strings of logprobs (NULL: "") */
    char id[48];
    long long created;
} msm_oai_reply;

/* The whole non-streamed response. NULL: out of memory. */
char *msm_oai_render(const msm_oai_reply *rp, msm_oai_choice *chs, int n, size_t *ret_len);

/* Appends to out the SSE events of choice k since the last call ("data: {...}\n\n"), its finish
 * included once it is done. */
void msm_oai_stream_choice(const msm_oai_reply *rp, msm_oai_choice *ch, int k, msm_strbuf *out);
/* The final usage event (stream_options.include_usage) and "data: [DONE]". */
void msm_oai_stream_end(const msm_oai_reply *rp, const msm_oai_choice *chs, int n, msm_strbuf *out);
/* An error while streaming (a choice failed): an error event. */
void msm_oai_stream_error(const msm_oai_error *e, msm_strbuf *out);

/* ---- tokenizer routes (vLLM's shapes, what lm-eval's remote tokenizer calls) ---- */

/* POST /tokenize {"prompt": text, "add_special_tokens": true} -> {"count", "max_model_len",
 * "tokens"}. */
char *msm_oai_tokenize(const msm_oai_ctx *c, const char *body, size_t len, size_t *ret_len, msm_oai_error *e);
/* POST /detokenize {"tokens": [ids]} -> {"prompt": text}. */
char *msm_oai_detokenize(const msm_oai_ctx *c, const char *body, size_t len, size_t *ret_len, msm_oai_error *e);
/* GET /tokenizer_info -> bos/eos/pad tokens, model_max_length, vocab size, chat template name. */
char *msm_oai_tokenizer_info(const msm_oai_ctx *c, const msm_api_model_info *info, size_t *ret_len);
/* GET /v1/models. */
char *msm_oai_models(const msm_oai_ctx *c, const msm_api_model_info *info, long long created, size_t *ret_len);

#endif
