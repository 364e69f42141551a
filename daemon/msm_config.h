/* msm_config: msmoed's configuration: an INI file (libinih) plus --set overrides.
 *
 * Every key is listed in one table in config.c and documented, with its default, in
 * config/msmoed.conf. Unknown sections/keys and bad values are errors naming file:line (or
 * "--set" for overrides) and the accepted range. */
#ifndef MSM_CONFIG_H
#define MSM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"
#include "msm_types.h" /* MSM_MAX_BUCKETS, MSM_MULTI_STREAM_MAX_TOKENS */

struct msm_engine_opts; /* msm_engine.h */

typedef enum msm_log_level {
    MSM_LOG_ERROR = 0,
    MSM_LOG_WARN,
    MSM_LOG_INFO,
    MSM_LOG_DEBUG,
} msm_log_level;

/* Most GPUs engine.gpus may list, and most TP groups (engines) one daemon runs. */
#define MSM_MAX_GPUS 128
#define MSM_MAX_GROUPS 128

typedef struct msm_config {
    /* [server] */
    char socket[256];          /* Unix socket path; empty = none */
    int socket_mode;           /* permission bits of the socket (octal in the file) */
    int tcp_port;              /* 0 = no TCP listener */
    char tcp_host[64];
    bool tcp_allow_remote;     /* tcp_host may be a non-loopback address (the API has no authentication) */
    int max_frame_bytes;
    int max_connections;       /* over every listener (API socket, TCP, metrics port, [http]) */
    int max_requests_per_connection; /* Generate requests in flight on one connection */
    int max_queued_bytes;      /* replies queued for a connection that does not read; over: closed */
    int idle_timeout_s;        /* a connection with nothing in flight and no traffic is closed; 0 = never */
    int write_timeout_s;       /* a connection whose queued replies make no progress is closed; 0 = never */
    int metrics_port;          /* HTTP GET /metrics (Prometheus text); 0 = off */
    char metrics_host[64];
    /* [engine] */
    char model[1024];          /* empty = the embedded model (see msm_config_model_dir) */
    char dummy_preset[1024];   /* a shape preset with random weights instead of a model */
    char tokenizer[1024];      /* tokenizer.json; empty = <model>/tokenizer.json if present; "none" = off */
    char backend[16];          /* auto | cpu | cuda | fake (fake: test-only engine) */
    int tp;                    /* ranks per TP group */
    int gpus[MSM_MAX_GPUS];    /* CUDA: the node's GPUs, in order; consecutive runs of tp form groups */
    int n_gpus;                /* 0 = every visible GPU */
    char gpus_where[128];      /* "file:line" or "--set" that set engine.gpus (for errors); "" = default */
    int replicas;              /* CPU (and fake) backend: how many engines (TP groups) */
    bool multi_stream;
    int multi_stream_max_tokens; /* steps of more tokens run on one stream (0: no limit) */
    bool fuse_allreduce;
    int kv_blocks;
    int max_step_tokens;
    int max_seqs;
    int max_context;           /* 0 = the model's max_position */
    bool cuda_graphs;
    int buckets[MSM_MAX_BUCKETS];
    int n_buckets;             /* 0 = the engine's defaults */
    int deadline_ms;
    /* [scheduler] */
    int max_queue;
    int max_tokens_default;
    int max_tokens_limit;
    int max_logprobs;
    int max_stop;              /* stop token ids + stop strings per request */
    int drain_timeout_s;
    /* [log] */
    msm_log_level log_level;
    char log_file[1024];       /* empty = stderr (the journal under systemd) */
    /* [http]: the OpenAI-compatible HTTP API (msm_http.h) */
    bool http_enabled;         /* off unless configured (make run turns it on) */
    char http_host[64];        /* IPv4 or IPv6 address */
    int http_port;
    int http_max_body_bytes;   /* request body cap: over it, 413 */
    int http_max_header_bytes; /* request line + headers cap: over it, 431 */
    int http_read_timeout_ms;  /* a request (headers and body) must arrive within it; also the
                                  keep-alive idle timeout (slowloris) */
    int http_max_connections;
    char http_api_key_file[1024]; /* a file holding the bearer token; empty = no authentication */
    char http_model_name[256]; /* the model id of /v1/models; empty = the model directory's name */
} msm_config;

void msm_config_defaults(msm_config *c);

/* Parses an INI file into c (keys not in the file keep their values). -ENOENT when the file does
 * not exist; -EINVAL with "file:line: message" for any other problem. */
int msm_config_load(msm_config *c, const char *path, msm_err *err);

/* Parses INI text (for the tests and the fuzzer); `source` names it in messages. */
int msm_config_load_string(msm_config *c, const char *text, const char *source, msm_err *err);

/* Applies one "section.key=value" override. */
int msm_config_set(msm_config *c, const char *assignment, msm_err *err);

/* Checks relations between keys (e.g. max_tokens_default <= max_tokens_limit). */
int msm_config_check(const msm_config *c, msm_err *err);

/* Resolves the model directory: engine.model if set; otherwise the embedded model, looked up in
 * the source tree first when this binary runs from its build tree, then in the installed data
 * directory ($datadir/msmoed/models/stories260k-moe). Writes the path into ret (cap bytes). */
int msm_config_model_dir(const msm_config *c, char *ret, size_t cap, msm_err *err);

/* Fills engine options from the config (first_device = 0: the caller sets each group's). */
void msm_config_engine_opts(const msm_config *c, struct msm_engine_opts *o);

/* The node split into TP groups, one engine (own KV pool, own scheduler thread) each.
 *
 * CUDA: engine.gpus (or GPUs 0 .. n_visible-1 when it is empty) cut in runs of engine.tp; every
 * run must be consecutive ids (an engine's ranks sit on first_device .. first_device+tp-1).
 * n_visible < 0 means unknown (only the list itself is checked; msm_engine_device_count gives
 * it). engine.replicas must be 1.
 * CPU and fake backends: engine.replicas groups; engine.gpus is not used.
 * Errors name the key and, for engine.gpus, where it was set (file:line). */
typedef struct msm_group_plan {
    int n_groups;
    int first_device[MSM_MAX_GROUPS]; /* CUDA: the group's first GPU; 0 otherwise */
} msm_group_plan;

int msm_config_plan_groups(const msm_config *c, bool cuda, int n_visible, msm_group_plan *ret, msm_err *err);

/* "0-3,6" for a list of ids (for messages). */
void msm_config_format_gpus(const int *ids, int n, char *buf, size_t cap);

#endif
