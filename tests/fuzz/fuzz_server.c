/* libFuzzer target: the whole server (daemon/server.c and what it drives: framing, the API edge,
 * the text worker, the connection guard, the schedulers) on the fake engine, through real Unix
 * sockets, driven by sequences of client actions: connect, Generate (token ids or text, stop
 * strings, small request ids so they collide and are reused), Cancel, Tokenize / Detokenize /
 * Health / Metrics, raw bytes (partial and malformed frames), half-close, abrupt close, and steps
 * of the schedulers. Everything runs on this thread: the schedulers have no thread of their own
 * (msm_sched_iterate is called here, as msmoe-run does), so a run is reproducible apart from
 * libuv's thread pool, which encodes text.
 *
 * After the actions every client closes, the daemon drains and shuts down, and the invariants
 * are checked: every KV block back in each engine's pool, none released twice, every connection
 * gone, and every byte the daemon sent a well-formed ServerFrame (plus ASan's and LSan's checks).
 *
 * Input: byte 0 picks one or two TP groups; then actions, each an opcode byte and its operands
 * (read as needed; missing bytes are zeros). The embedded model's tokenizer is loaded once from
 * models/stories260k-moe/tokenizer.json (run from the repository root, as `make test-fuzz` does). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "msm_api.h"
#include "msm_config.h"
#include "msm_fake_engine.h"
#include "msm_frame.h"
#include "msm_log.h"
#include "msm_sched.h"
#include "msm_server.h"
#include "msmoe.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_CLIENTS 6
#define MAX_GROUPS 2

static msm_tokenizer *tok;
static bool loaded;

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static uint8_t next(input *in) {
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

typedef struct client {
    int fd;                   /* -1: none */
    bool write_closed;
    msm_frame_reader rd;      /* the daemon's replies, checked frame by frame */
} client;

typedef struct world {
    uv_loop_t loop;
    msm_config cfg;
    msm_server *srv;
    int n_groups;
    msm_fake_engine *fe[MAX_GROUPS];
    msm_sched *sched[MAX_GROUPS];
    client cl[MAX_CLIENTS];
    char sock[108];
} world;

/* Reads whatever the daemon sent c; every frame must be a ServerFrame. */
static void drain_client(client *c) {
    uint8_t buf[65536];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r <= 0)
            return;
        for (size_t off = 0; off < (size_t)r;) {
            size_t used;
            const uint8_t *frame;
            uint32_t len;
            msm_err err;
            int rc = msm_frame_reader_feed(&c->rd, buf + off, (size_t)r - off, &used, &frame, &len, &err);
            off += used;
            if (rc < 0)
                __builtin_trap(); /* the daemon sent an oversized or broken length */
            if (rc == 0)
                break;
            Msmoe__V1__ServerFrame *f = msmoe__v1__server_frame__unpack(NULL, len, frame);
            if (!f)
                __builtin_trap(); /* the daemon sent bytes that are not a ServerFrame */
            msmoe__v1__server_frame__free_unpacked(f, NULL);
        }
    }
}

/* Schedulers, the loop, the clients: n rounds (the loop never blocks). */
static void pump(world *w, int n) {
    for (int i = 0; i < n; i++) {
        for (int g = 0; g < w->n_groups; g++)
            msm_sched_iterate(w->sched[g]);
        uv_run(&w->loop, UV_RUN_NOWAIT);
        for (int k = 0; k < MAX_CLIENTS; k++)
            if (w->cl[k].fd >= 0)
                drain_client(&w->cl[k]);
    }
}

static void send_all(client *c, const void *buf, size_t len) {
    if (c->fd < 0 || c->write_closed)
        return;
    ssize_t r = send(c->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)r; /* a full socket buffer cuts the action short: fine */
}

static void send_frame(client *c, const Msmoe__V1__ClientFrame *f) {
    uint8_t buf[4096];
    size_t n = msmoe__v1__client_frame__get_packed_size(f);
    if (n + 4 > sizeof buf)
        return;
    msm_frame_put_header(buf, (uint32_t)n);
    msmoe__v1__client_frame__pack(f, buf + 4);
    send_all(c, buf, n + 4);
}

static const char *const texts[] = {"Once upon a time", "", "Lily saw a big \xf0\x9f\x99\x82 ball.", "<s>hi</s>",
                                    "bad \xff utf-8", "The cat sat on the mat and"};
static const char *const stops[] = {"Lily", ".", "\n\n", "a", "\xc3\xa9"};

static void act_generate(input *in, client *c) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__GenerateRequest g = MSMOE__V1__GENERATE_REQUEST__INIT;
    Msmoe__V1__SamplingParams sp = MSMOE__V1__SAMPLING_PARAMS__INIT;
    int32_t ids[40];
    char *st[2];
    uint8_t a = next(in), b = next(in), d = next(in);
    f.has_request_id = 1;
    f.request_id = a & 3; /* 0 (refused), 1..3: ids collide and are reused */
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_GENERATE;
    f.generate = &g;
    if (b & 1) {
        g.prompt_text = (char *)texts[(b >> 1) % (sizeof texts / sizeof *texts)];
    } else {
        g.n_prompt_ids = (size_t)((b >> 1) % 40);
        for (size_t i = 0; i < g.n_prompt_ids; i++)
            ids[i] = (int32_t)next(in) * 3 - 20; /* some outside the vocabulary */
        g.prompt_ids = ids;
    }
    g.has_max_tokens = 1;
    g.max_tokens = (uint32_t)(d % 24);
    if (d & 0x80) {
        g.n_stop_strings = 1 + (d >> 6 & 1);
        for (size_t i = 0; i < g.n_stop_strings; i++)
            st[i] = (char *)stops[(a >> (2 + i)) % (sizeof stops / sizeof *stops)];
        g.stop_strings = st;
    }
    if (a & 0x40) {
        sp.has_temperature = 1;
        sp.temperature = 0.8f;
        sp.has_seed = 1;
        sp.seed = a;
        g.sampling = &sp;
    }
    if (a & 0x80) {
        g.has_logprobs = 1;
        g.logprobs = b % 4;
    }
    send_frame(c, &f);
}

static void act_call(input *in, client *c) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__CancelRequest cancel = MSMOE__V1__CANCEL_REQUEST__INIT;
    Msmoe__V1__HealthRequest health = MSMOE__V1__HEALTH_REQUEST__INIT;
    Msmoe__V1__MetricsRequest metrics = MSMOE__V1__METRICS_REQUEST__INIT;
    Msmoe__V1__TokenizeRequest t = MSMOE__V1__TOKENIZE_REQUEST__INIT;
    Msmoe__V1__DetokenizeRequest dt = MSMOE__V1__DETOKENIZE_REQUEST__INIT;
    int32_t ids[8];
    uint8_t a = next(in);
    f.has_request_id = 1;
    f.request_id = (a >> 3) & 3;
    switch (a % 5) {
    case 0:
        f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_CANCEL;
        f.cancel = &cancel;
        break;
    case 1:
        f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_HEALTH;
        f.health = &health;
        break;
    case 2:
        f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_METRICS;
        f.metrics = &metrics;
        break;
    case 3:
        f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_TOKENIZE;
        f.tokenize = &t;
        t.text = (char *)texts[(a >> 5) % (sizeof texts / sizeof *texts)];
        break;
    default:
        f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_DETOKENIZE;
        f.detokenize = &dt;
        dt.n_ids = (size_t)(a >> 5);
        for (size_t i = 0; i < dt.n_ids; i++)
            ids[i] = (int32_t)next(in) * 2;
        dt.ids = ids;
        break;
    }
    send_frame(c, &f);
}

static void client_close(client *c) {
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    msm_frame_reader_done(&c->rd);
}

static void act_connect(world *w, client *c) {
    client_close(c);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, w->sock, strlen(w->sock) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->write_closed = false;
    msm_frame_reader_init(&c->rd, 1u << 24);
    if (c->fd >= 0 && connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        client_close(c);
    pump(w, 1);
}

static int world_new(world *w, int n_groups) {
    memset(w, 0, sizeof *w);
    for (int k = 0; k < MAX_CLIENTS; k++)
        w->cl[k].fd = -1;
    snprintf(w->sock, sizeof w->sock, "/tmp/msmoed-fuzz-%d.sock", (int)getpid());
    msm_config_defaults(&w->cfg);
    snprintf(w->cfg.socket, sizeof w->cfg.socket, "%s", w->sock);
    w->cfg.max_connections = 4;
    w->cfg.max_requests_per_connection = 4;
    w->cfg.max_queue = 6;
    w->cfg.max_seqs = 3;
    w->cfg.max_step_tokens = 48;
    w->cfg.kv_blocks = 12;
    w->cfg.max_queued_bytes = 8192;
    w->cfg.idle_timeout_s = 0; /* timeouts follow the wall clock: not fuzzed here */
    w->cfg.write_timeout_s = 0;
    w->n_groups = n_groups;
    msm_err err;
    msm_api_limits lim = {.vocab = 512, .max_context = 64, .max_tokens_default = 8, .max_tokens_limit = 32,
                          .max_logprobs = 4, .max_stop = 4, .tok = tok};
    msm_api_model_info info = {.architecture = "fake", .backend = "fake", .model = "fake", .version = "0",
                               .vocab = 512, .max_context = 64, .tp = 1, .tp_groups = n_groups};
    uv_loop_init(&w->loop);
    if (msm_server_new(&w->loop, &w->cfg, &lim, &info, n_groups, &w->srv, &err) < 0)
        return -1;
    for (int g = 0; g < n_groups; g++) {
        msm_fake_engine_opts fo = {.vocab = 512, .max_context = 64, .kv_blocks = w->cfg.kv_blocks, .eos_id = 7,
                                   .max_step_tokens = w->cfg.max_step_tokens, .max_seqs = w->cfg.max_seqs};
        msm_sched_engine se;
        msm_sched_opts so = {.max_step_tokens = fo.max_step_tokens, .max_seqs = fo.max_seqs, .max_queue = w->cfg.max_queue};
        if (msm_fake_engine_new(&fo, &w->fe[g]) < 0)
            return -1;
        msm_fake_engine_vtable(w->fe[g], &se);
        se.tok = tok;
        if (msm_sched_new(&so, &se, msm_server_emit, msm_server_group_ctx(w->srv, g), &w->sched[g], &err) < 0)
            return -1;
        msm_server_set_sched(w->srv, g, w->sched[g]);
    }
    return msm_server_listen(w->srv, &err);
}

static void world_free(world *w) {
    for (int k = 0; k < MAX_CLIENTS; k++)
        client_close(&w->cl[k]);
    if (w->srv) {
        /* every client has gone: what is in flight ends (cancelled) and the server closes */
        pump(w, 4);
        msm_server_close(w->srv);
        uv_run(&w->loop, UV_RUN_DEFAULT); /* until every handle is closed and every text job done */
    }
    for (int g = 0; g < w->n_groups; g++) {
        msm_sched_free(w->sched[g]);
        if (w->fe[g] && (w->fe[g]->n_free != w->cfg.kv_blocks - 1 || w->fe[g]->double_frees))
            __builtin_trap(); /* a KV block leaked or was released twice */
        msm_fake_engine_free(w->fe[g]);
    }
    msm_server_free(w->srv);
    if (uv_loop_close(&w->loop) != 0) {
        uv_print_all_handles(&w->loop, stderr);
        __builtin_trap(); /* a libuv handle left open */
    }
    char lock[128];
    snprintf(lock, sizeof lock, "%s.lock", w->sock);
    unlink(lock);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!loaded) {
        signal(SIGPIPE, SIG_IGN); /* as msmoed's main does: a write to a closed client is EPIPE */
        msm_log_open(NULL, MSM_LOG_ERROR);
        msm_tokenizer_load("models/stories260k-moe/tokenizer.json", &tok, NULL); /* kept for the process */
        loaded = true;
    }
    input in = {data, size};
    static world w;
    if (world_new(&w, 1 + (next(&in) & 1)) < 0) {
        world_free(&w);
        return 0;
    }
    for (int steps = 0; in.n && steps < 64; steps++) {
        uint8_t op = next(&in);
        client *c = &w.cl[(op >> 4) % MAX_CLIENTS];
        switch (op & 7) {
        case 0: act_connect(&w, c); break;
        case 1: act_generate(&in, c); break;
        case 2: act_call(&in, c); break;
        case 3: /* half-close: the daemon must still answer what is in flight */
            if (c->fd >= 0 && !c->write_closed) {
                shutdown(c->fd, SHUT_WR);
                c->write_closed = true;
            }
            break;
        case 4: client_close(c); break;
        case 5: { /* raw bytes: a partial, oversized or malformed frame */
            uint8_t raw[64];
            size_t n = next(&in) % sizeof raw;
            for (size_t i = 0; i < n; i++)
                raw[i] = next(&in);
            send_all(c, raw, n);
            break;
        }
        default: pump(&w, 1 + (op >> 4)); break;
        }
    }
    /* run to quiescence: the text jobs, the schedulers, the replies */
    pump(&w, 200);
    world_free(&w);
    return 0;
}
