/* msm_api: the protobuf edge. Decodes ClientFrame bodies into validated native calls and encodes
 * ServerFrames (with their 4-byte length header) from native structs. No protobuf struct leaves
 * this module; every unpacked message is freed here, exactly once.
 *
 * Validation checks every client value against a limit and names the field in the message, e.g.
 * "generate.top_p = 1.5: must be in (0, 1]".
 *
 * Text is resolved here too, with the model's tokenizer (immutable, so it may run on any thread,
 * concurrently with the scheduler's detokenizers): a prompt_text becomes prompt ids, a Tokenize
 * call its ids and a Detokenize call its text, so what leaves this module is all native. That
 * work is in two parts: msm_api_parse checks everything cheap on the loop thread (a prompt_text
 * that can never fit the context is refused before any encoding) and leaves the text work in the
 * call; msm_api_text does it, on a worker thread in the daemon. msm_api_decode is both in one. */
#ifndef MSM_API_H
#define MSM_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"
#include "msm_metrics.h"
#include "msm_sched.h"
#include "msm_tokenizer.h"

typedef enum msm_call_kind {
    MSM_CALL_GENERATE = 1,
    MSM_CALL_CANCEL,
    MSM_CALL_HEALTH,
    MSM_CALL_MODEL_INFO,
    MSM_CALL_METRICS,
    MSM_CALL_TOKENIZE,
    MSM_CALL_DETOKENIZE,
} msm_call_kind;

/* Largest text accepted in a prompt_text or a Tokenize call (it is encoded on the loop thread),
 * and the most ids in one Detokenize call. */
#define MSM_API_MAX_TEXT_BYTES (1u << 20)
#define MSM_API_MAX_DETOK_IDS (1u << 20)

/* The limits requests are validated against. */
typedef struct msm_api_limits {
    int vocab;
    int max_context;
    int max_tokens_default;
    int max_tokens_limit;
    int max_logprobs;
    int max_stop;             /* stop ids + stop strings */
    const msm_tokenizer *tok; /* NULL: text prompts, stop strings, Tokenize/Detokenize refused */
} msm_api_limits;

typedef struct msm_call {
    msm_call_kind kind;
    uint64_t request_id;
    msm_gen_request *gen;     /* MSM_CALL_GENERATE: owned by the caller after decode */
    int32_t *ids;             /* MSM_CALL_TOKENIZE: [n_ids] the encoded text (owned; msm_call_done) */
    size_t n_ids;
    char *text;               /* MSM_CALL_DETOKENIZE: [text_len] the decoded ids, NUL-terminated (owned) */
    size_t text_len;
    /* The text work msm_api_parse leaves for msm_api_text (text_pending). */
    bool text_pending;
    char *in_text;            /* [in_len] prompt_text or tokenize.text (owned) */
    size_t in_len;
    unsigned tok_flags;       /* MSM_TOK_* */
    int32_t *in_ids;          /* [n_in_ids] detokenize.ids, checked against the vocabulary (owned) */
    size_t n_in_ids;
    bool skip_special;
    bool max_tokens_default;  /* GENERATE: max_tokens unset: capped at what fits once the prompt is known */
} msm_call;

/* Frees ids, text and the pending text work (not gen, which the caller took). */
void msm_call_done(msm_call *c);

/* Decodes and validates one ClientFrame body. 0: *ret filled (conn_id of a request is left 0 for
 * the caller). On failure err says what to answer, and with which code (msm_code_from_errno):
 * -EBADMSG when the frame itself is malformed (answer, then close the connection), another
 * negative errno when only the request is refused (a string field holding a NUL byte is
 * -EINVAL). *reply_id is always written: the request id to answer (0 when the frame could not be
 * decoded). msm_api_parse leaves the text work (ret->text_pending) for msm_api_text;
 * msm_api_decode does both. */
int msm_api_parse(const uint8_t *buf, size_t len, const msm_api_limits *lim, msm_call *ret, uint64_t *reply_id,
                  msm_err *err);
int msm_api_decode(const uint8_t *buf, size_t len, const msm_api_limits *lim, msm_call *ret, uint64_t *reply_id,
                   msm_err *err);
/* The text work of a parsed call (no-op without any): a GENERATE's prompt_text encoded into
 * ret->gen (then checked against the context and the vocabulary), a TOKENIZE's text into ids, a
 * DETOKENIZE's ids into text. Thread-safe (lim is read only). On failure the caller answers
 * call->request_id with err and frees the call (msm_gen_request_free(gen), msm_call_done). */
int msm_api_text(msm_call *call, const msm_api_limits *lim, msm_err *err);

/* The fewest tokens a text of len bytes can encode to with lim->tok (non-NULL), known without
 * reading it: a prompt whose bound reaches the context is refused unread. */
size_t msm_api_min_tokens(const msm_api_limits *lim, size_t len);

/* Native ModelInfo. */
typedef struct msm_api_model_info {
    const char *architecture, *backend, *model, *version;
    int vocab, max_context, tp, tp_groups, hidden, layers, experts, experts_per_token;
    bool multi_stream, fuse_allreduce, cuda_graphs;
    const int *eos_ids;
    int n_eos;
    int kv_blocks, kv_block_tokens, max_seqs, max_step_tokens;
    const char *tokenizer;    /* tokenizer.json path; NULL: none */
    int tokenizer_vocab;
} msm_api_model_info;

/* Encoders: a malloc'd buffer holding the 4-byte header and the ServerFrame, or NULL (ENOMEM). */
uint8_t *msm_api_encode_event(const msm_sched_event *ev, size_t *ret_len);
/* An Error reply: the code derived from err (a negative errno), the message msg. */
uint8_t *msm_api_encode_error(uint64_t request_id, int err, const char *msg, size_t *ret_len);
uint8_t *msm_api_encode_health(uint64_t request_id, bool serving, const char *status, size_t *ret_len);
uint8_t *msm_api_encode_model_info(uint64_t request_id, const msm_api_model_info *mi, size_t *ret_len);
uint8_t *msm_api_encode_metrics(uint64_t request_id, const msm_metric_sample *s, int n, size_t *ret_len);
uint8_t *msm_api_encode_tokenize(uint64_t request_id, const int32_t *ids, size_t n, size_t *ret_len);
uint8_t *msm_api_encode_detokenize(uint64_t request_id, const char *text, size_t *ret_len);

#endif
