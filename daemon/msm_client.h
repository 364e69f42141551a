/* msm_client: a small blocking client of the msmoed API, for the `msmoe` CLI, msmoe-eval and the
 * integration tests. One connection; frames go out with msm_client_send_* and come back, in any
 * order across request ids, from msm_client_recv. The caller frees received frames with
 * msmoe__v1__server_frame__free_unpacked(f, NULL). Not thread-safe (one connection per thread). */
#ifndef MSM_CLIENT_H
#define MSM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"
#include "msmoe.pb-c.h"

typedef struct msm_client msm_client;

/* "unix:PATH", "PATH" (absolute or relative, a Unix socket), or "tcp:HOST:PORT". */
int msm_client_connect(const char *address, msm_client **ret, msm_err *err);
void msm_client_free(msm_client *c);
int msm_client_fd(const msm_client *c);
/* Receive timeout (0 = none). */
void msm_client_set_timeout_ms(msm_client *c, int ms);

int msm_client_send(msm_client *c, const Msmoe__V1__ClientFrame *f, msm_err *err);
/* Sends raw bytes (tests of malformed input). */
int msm_client_send_raw(msm_client *c, const void *buf, size_t len, msm_err *err);
/* Blocks for the next ServerFrame. -ECONNRESET at EOF, -ETIMEDOUT after the receive timeout. */
int msm_client_recv(msm_client *c, Msmoe__V1__ServerFrame **ret, msm_err *err);

/* Generation parameters; negative / NaN-free defaults mean "not set". */
typedef struct msm_client_gen {
    const int32_t *prompt;
    int n_prompt;
    const char *prompt_text;    /* NULL: none */
    int max_tokens;             /* < 0: server default */
    float temperature;          /* < 0 and not NaN: unset; set_temperature forces */
    bool set_temperature;
    int top_k;                  /* < 0: unset */
    float top_p;                /* <= 0: unset; set_top_p forces */
    bool set_top_p;
    int64_t seed;               /* < 0: unset */
    int logprobs;               /* 0: none */
    bool ignore_eos;
    const int32_t *stop_ids;
    int n_stop_ids;
    const char *const *stop_strings;  /* [n_stop_strings] */
    int n_stop_strings;
    bool no_add_special;        /* prompt_text: no BOS */
    bool parse_special;         /* prompt_text: "<s>" in the text is the special token */
} msm_client_gen;

void msm_client_gen_init(msm_client_gen *g);
int msm_client_send_generate(msm_client *c, uint64_t request_id, const msm_client_gen *g, msm_err *err);
/* Tokenize (text -> ids) and Detokenize (ids -> text). */
int msm_client_send_tokenize(msm_client *c, uint64_t request_id, const char *text, bool add_special,
                             bool parse_special, msm_err *err);
int msm_client_send_detokenize(msm_client *c, uint64_t request_id, const int32_t *ids, size_t n,
                               bool skip_special, msm_err *err);
/* Cancel, health, model_info, metrics: a frame with just the call. */
int msm_client_send_simple(msm_client *c, uint64_t request_id, Msmoe__V1__ClientFrame__CallCase call, msm_err *err);

const char *msm_client_code_name(int code);
const char *msm_client_finish_name(int reason);

#endif
