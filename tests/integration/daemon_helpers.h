/* Helpers of the daemon integration tests (tests/integration/test_daemon*.c): start and stop the
 * real msmoed on a temporary Unix socket, talk to it with the client library, collect streams,
 * read metrics, run msmoe-run and the CLI, and stand in for systemd's notify socket. Failures end
 * the test (Criterion assertions). Paths come from the environment meson sets: MSMOED, MSMOE,
 * MSMOE_RUN, MSMOE_MODEL (defaults: the build tree, run from the repository root). */
#ifndef MSM_DAEMON_HELPERS_H
#define MSM_DAEMON_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "msm_client.h"

typedef struct daemon_proc {
    pid_t pid;
    char dir[256];
    char sock[300];
} daemon_proc;

/* Collects one stream: the token ids and the finish reason (or an error code as -code). */
typedef struct stream {
    int32_t ids[1024];
    int n;
    int finish;     /* FinishReason, or -1 - code for an Error frame */
    char msg[256];
    char text[16384];  /* concatenated GenerateChunk.text */
    size_t text_len;
    int n_text;        /* chunks with a text field */
    int bad_text;      /* chunks whose text is not whole UTF-8 characters */
    int completion_tokens;
} stream;

/* A datagram socket standing in for systemd's NOTIFY_SOCKET; env is "NOTIFY_SOCKET=<path>". */
typedef struct notify_sock {
    char dir[32];
    struct sockaddr_un sa;
    int fd;
    char env[300];
} notify_sock;

/* The environment variable k, or d when it is unset or empty. */
const char *env_or(const char *k, const char *d);

/* Whether the embedded model (MSMOE_MODEL) is present; need_model skips the test when not. */
bool have_model(void);
void need_model(void);

/* Starts msmoed with extra "--set" assignments (NULL-terminated) and the given extra environment
 * (NAME=VALUE or NULL; env1 "NOFILE=N" instead sets the daemon's RLIMIT_NOFILE, soft and hard, to
 * N); with wait_ready, waits until it accepts connections. The daemon dies with
 * the test process. */
void start_daemon(daemon_proc *d, const char **sets, const char *env1, const char *env2, bool wait_ready);
/* start_daemon on the fake engine with a 5 ms step (so "mid-stream" is guaranteed), plus extra
 * assignments (NULL-terminated, may be NULL). */
void start_slow_fake(daemon_proc *d, const char **extra);
/* SIGTERM, then waits up to 30 s (SIGKILL and a failure after that); removes its directory.
 * Returns the exit status (128 + signal when killed). */
int stop_daemon(daemon_proc *d);
/* Waits up to timeout_ms for d to exit by itself: its exit status (128 + signal when killed), or
 * -1 when it is still running (d->pid is then kept). */
int wait_exit(daemon_proc *d, int timeout_ms);
/* Runs msmoed to its end with the given arguments (a shell word list): its stdout and stderr into
 * out (NUL-terminated), returns its exit status. */
int run_msmoed(const char *args, char *out, size_t cap);
/* Milliseconds of a monotonic clock. */
double now_ms(void);
/* A TCP port that was free a moment ago (bound to 127.0.0.1:0, then closed). */
int free_port(void);

/* A client connection to d with a 20 s receive timeout. */
msm_client *connect_to(const daemon_proc *d);
/* The next ServerFrame (free it with msmoe__v1__server_frame__free_unpacked). */
Msmoe__V1__ServerFrame *recv_frame(msm_client *c);

/* Adds a frame of one Generate's stream to s; true when the stream ended (a finish or an error). */
bool stream_add(stream *s, const Msmoe__V1__ServerFrame *f);
/* The next frame, which must answer request rid. */
Msmoe__V1__ServerFrame *recv_reply(msm_client *c, uint64_t rid);

/* Prompt p of a test's prompt set: n ids 1 + (p * a + i * b) % 500 into ids, and the same as
 * "1,2,3" into ids_arg (for msmoe-run --prompt-ids). */
void make_prompt(int p, int a, int b, int32_t *ids, int n, char *ids_arg, size_t cap);

/* Reads frames into s until its stream ends (one request in flight on c). */
void stream_read(msm_client *c, stream *s);
/* Reads frames until the n streams of requests rid0 .. rid0 + n - 1 on c have all ended, in
 * whatever order they interleave; s[i] (zeroed first) collects request rid0 + i's. */
void streams_read(msm_client *c, uint64_t rid0, stream *s, int n);
/* Sends a Generate and reads its first frame into s (zeroed first): the stream is under way. */
void stream_start(msm_client *c, uint64_t rid, const msm_client_gen *g, stream *s);
/* Sends a Generate and collects its whole stream into s (checking every frame's request id). */
void generate(msm_client *c, uint64_t rid, const msm_client_gen *g, stream *s);
/* A token-id Generate request: prompt p[0..n), max_tokens, everything else the defaults. */
void ids_gen_init(msm_client_gen *g, const int32_t *p, int n, int max_tokens);

/* The next frame is an Error for rid with the given code (what names the case in messages). */
void expect_code(msm_client *c, uint64_t rid, int code, const char *what);
/* A good request on a new connection still completes. */
void still_serving(const daemon_proc *d);

/* The value of the metric series name{labels} (labels "" or NULL: the unlabelled one), NaN when
 * absent; metric_settles polls (up to 1 s) until it equals want (the schedulers publish their
 * stats after each step) and returns the last value. */
double metric(msm_client *c, const char *name, const char *labels);
double metric_settles(msm_client *c, const char *name, const char *labels, double want);

/* msmoe-run --model MSMOE_MODEL args: the ids of its first output line (at most cap). */
int run_msmoe_run(const char *args, int32_t *out, int cap);
/* Runs a shell command: its stdout into out (NUL-terminated), returns its exit status. */
int sh(const char *cmd, char *out, size_t cap);

/* The notify socket: open (a fresh temporary path), one message into buf (NUL-terminated) waiting
 * up to 20 ms (false when none came), close (and remove). */
void notify_open(notify_sock *n);
bool notify_recv(notify_sock *n, char *buf, size_t cap);
void notify_close(notify_sock *n);

#endif
