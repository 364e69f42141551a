/* Integration tests: the real msmoed binary over a temporary Unix socket.
 *
 * Correctness tests run the embedded model (models/stories260k-moe) on the CPU engine and compare
 * with msmoe-run's offline output. Timing-sensitive tests (cancel and disconnect mid-stream,
 * SIGTERM drain) use engine.backend = fake with a per-step delay, so "mid-stream" is guaranteed.
 * Paths come from the environment set by meson: MSMOED, MSMOE, MSMOE_RUN, MSMOE_MODEL. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "msm_client.h"
#include "msm_frame.h"

typedef struct daemon_proc {
    pid_t pid;
    char dir[256];
    char sock[300];
} daemon_proc;

static const char *env_or(const char *k, const char *d) {
    const char *v = getenv(k);
    return v && *v ? v : d;
}

static bool have_model(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", env_or("MSMOE_MODEL", "models/stories260k-moe"));
    return access(p, R_OK) == 0;
}

static msm_client *connect_to(const daemon_proc *d) {
    msm_client *c = NULL;
    msm_err err;
    cr_assert_eq(msm_client_connect(d->sock, &c, &err), 0, "%s", err.msg);
    msm_client_set_timeout_ms(c, 20000);
    return c;
}

/* Starts msmoed with extra "--set" assignments (NULL-terminated) and the given extra environment
 * (NAME=VALUE or NULL); waits until it answers health. */
static void start_daemon(daemon_proc *d, const char **sets, const char *env1, const char *env2, bool wait_ready) {
    snprintf(d->dir, sizeof d->dir, "/tmp/msmoed-it.XXXXXX");
    cr_assert_not_null(mkdtemp(d->dir));
    snprintf(d->sock, sizeof d->sock, "%s/s.sock", d->dir);
    char sockset[400];
    snprintf(sockset, sizeof sockset, "server.socket=%s", d->sock);
    const char *argv[64];
    int n = 0;
    argv[n++] = env_or("MSMOED", "build/daemon/msmoed");
    argv[n++] = "--set";
    argv[n++] = sockset;
    argv[n++] = "--set";
    argv[n++] = "log.level=warn";
    char modelset[1100];
    if (have_model()) {
        snprintf(modelset, sizeof modelset, "engine.model=%s", env_or("MSMOE_MODEL", "models/stories260k-moe"));
        argv[n++] = "--set";
        argv[n++] = modelset;
    }
    for (int i = 0; sets && sets[i]; i++) {
        argv[n++] = "--set";
        argv[n++] = sets[i];
    }
    argv[n] = NULL;
    d->pid = fork();
    cr_assert_geq(d->pid, 0);
    if (d->pid == 0) {
        /* A failed assertion ends the test process: take the daemon with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (env1)
            putenv((char *)env1);
        if (env2)
            putenv((char *)env2);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    if (!wait_ready)
        return;
    for (int i = 0; i < 600; i++) {
        msm_client *c;
        msm_err err;
        if (msm_client_connect(d->sock, &c, &err) == 0) {
            msm_client_free(c);
            return;
        }
        int st;
        cr_assert_eq(waitpid(d->pid, &st, WNOHANG), 0, "msmoed exited during start-up");
        usleep(20000);
    }
    cr_assert_fail("msmoed did not start listening within 12 s");
}

static int stop_daemon(daemon_proc *d) {
    int st = 0;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        for (int i = 0; i < 1500 && waitpid(d->pid, &st, WNOHANG) == 0; i++)
            usleep(20000);
        if (kill(d->pid, 0) == 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            cr_assert_fail("msmoed did not exit within 30 s of SIGTERM");
        }
        d->pid = 0;
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    if (system(cmd)) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static Msmoe__V1__ServerFrame *recv_frame(msm_client *c) {
    Msmoe__V1__ServerFrame *f = NULL;
    msm_err err;
    int rc = msm_client_recv(c, &f, &err);
    cr_assert_eq(rc, 0, "recv: %s", err.msg);
    return f;
}

/* Collects one stream: the token ids and the finish reason (or an error code as -code). */
typedef struct stream {
    int32_t ids[1024];
    int n;
    int finish;     /* FinishReason, or -1 - code for an Error frame */
    char msg[256];
} stream;

static bool stream_add(stream *s, const Msmoe__V1__ServerFrame *f) {
    if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
        s->finish = -1 - (int)f->error->code;
        snprintf(s->msg, sizeof s->msg, "%s", f->error->message ? f->error->message : "");
        return true;
    }
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_CHUNK);
    for (size_t i = 0; i < f->chunk->n_token_ids && s->n < 1024; i++)
        s->ids[s->n++] = f->chunk->token_ids[i];
    if (f->chunk->has_finish_reason && f->chunk->finish_reason != MSMOE__V1__FINISH_REASON__FINISH_NONE) {
        s->finish = (int)f->chunk->finish_reason;
        return true;
    }
    return false;
}

static void generate(msm_client *c, uint64_t rid, const msm_client_gen *g, stream *s) {
    msm_err err;
    memset(s, 0, sizeof *s);
    cr_assert_eq(msm_client_send_generate(c, rid, g, &err), 0, "%s", err.msg);
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        cr_assert_eq(f->request_id, rid);
        bool done = stream_add(s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            return;
    }
}

static int run_msmoe_run(const char *args, int32_t *out, int cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --model %s %s", env_or("MSMOE_RUN", "build/tools/msmoe-run"),
             env_or("MSMOE_MODEL", "models/stories260k-moe"), args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[16384] = "";
    if (!fgets(line, sizeof line, p))
        line[0] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    int n = 0;
    for (char *s = line; *s && n < cap;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        out[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static double metric(msm_client *c, const char *name, const char *labels) {
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, 999999, MSMOE__V1__CLIENT_FRAME__CALL_METRICS, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_METRICS);
    double v = NAN;
    for (size_t i = 0; i < f->metrics->n_metrics; i++)
        if (!strcmp(f->metrics->metrics[i]->name, name) &&
            !strcmp(f->metrics->metrics[i]->labels ? f->metrics->metrics[i]->labels : "", labels ? labels : ""))
            v = f->metrics->metrics[i]->value;
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    return v;
}

static void need_model(void) {
    if (!have_model())
        cr_skip_test("the embedded model is not present");
}

/* ---- correctness on the embedded model ---- */

Test(daemon, streamed_tokens_equal_msmoe_run, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {1, 2, 3, 4};
    struct { const char *args; float temp; int64_t seed; } cases[] = {
        {"--prompt-ids 1,2,3,4 --max-new-tokens 24 --greedy", 0, -1},
        {"--prompt-ids 1,2,3,4 --max-new-tokens 24 --temperature 1 --seed 7", 1, 7},
        {"--prompt-ids 1,2,3,4 --max-new-tokens 24 --temperature 0.7 --seed 3", 0.7f, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t want[64];
        int n = run_msmoe_run(cases[k].args, want, 64);
        cr_assert_gt(n, 0);
        msm_client_gen g;
        msm_client_gen_init(&g);
        g.prompt = prompt;
        g.n_prompt = 4;
        g.max_tokens = 24;
        g.temperature = cases[k].temp;
        g.set_temperature = true;
        g.seed = cases[k].seed;
        stream s;
        generate(c, k + 1, &g, &s);
        cr_assert_gt(s.finish, 0, "error: %s", s.msg);
        cr_assert_eq(s.n, n, "case %zu: %d tokens streamed, msmoe-run printed %d", k, s.n, n);
        cr_assert_arr_eq(s.ids, want, (size_t)n * sizeof(int32_t), "case %zu differs from msmoe-run", k);
    }
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon, sixty_four_requests_on_eight_connections, .timeout = 240) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    enum { CONNS = 8, PER = 8, MAXT = 16 };
    int32_t prompts[PER][6], want[PER][MAXT];
    int n_want[PER];
    for (int p = 0; p < PER; p++) {
        char args[256], ids[128] = "";
        for (int i = 0; i < 6; i++) {
            prompts[p][i] = (int32_t)(1 + (p * 37 + i * 11) % 500);
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompts[p][i]);
        }
        snprintf(args, sizeof args, "--prompt-ids %s --max-new-tokens %d --greedy", ids, MAXT);
        n_want[p] = run_msmoe_run(args, want[p], MAXT);
    }
    msm_client *c[CONNS];
    msm_err err;
    for (int k = 0; k < CONNS; k++) {
        c[k] = connect_to(&d);
        for (int p = 0; p < PER; p++) {
            msm_client_gen g;
            msm_client_gen_init(&g);
            g.prompt = prompts[(p + k) % PER];
            g.n_prompt = 6;
            g.max_tokens = MAXT;
            g.temperature = 0;
            g.set_temperature = true;
            cr_assert_eq(msm_client_send_generate(c[k], (uint64_t)(100 + p), &g, &err), 0, "%s", err.msg);
        }
    }
    static stream s[CONNS][PER];
    memset(s, 0, sizeof s);
    for (int k = 0; k < CONNS; k++) {
        int done = 0;
        while (done < PER) {
            Msmoe__V1__ServerFrame *f = recv_frame(c[k]);
            int p = (int)f->request_id - 100;
            cr_assert(p >= 0 && p < PER);
            done += stream_add(&s[k][p], f);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
        }
        for (int p = 0; p < PER; p++) {
            int q = (p + k) % PER;
            cr_assert_gt(s[k][p].finish, 0, "conn %d req %d: %s", k, p, s[k][p].msg);
            cr_assert_eq(s[k][p].n, n_want[q]);
            cr_assert_arr_eq(s[k][p].ids, want[q], (size_t)n_want[q] * sizeof(int32_t), "conn %d req %d", k, p);
        }
    }
    cr_assert_eq(metric(c[0], "msmoed_kv_blocks_used", NULL), 0);
    cr_assert_eq(metric(c[0], "msmoed_requests_total", NULL), 64);
    for (int k = 0; k < CONNS; k++)
        msm_client_free(c[k]);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- bad input ---- */

static void expect_code(msm_client *c, uint64_t rid, int code, const char *what) {
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR, "%s: not an error reply", what);
    cr_assert_eq(f->request_id, rid, "%s", what);
    cr_assert_eq((int)f->error->code, code, "%s: got %s (%s)", what, msm_client_code_name(f->error->code),
                 f->error->message);
    fprintf(stderr, "bad input %-34s -> %s: %s\n", what, msm_client_code_name(f->error->code), f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
}

static void expect_closed(msm_client *c, const char *what) {
    Msmoe__V1__ServerFrame *f = NULL;
    msm_err err;
    int rc = msm_client_recv(c, &f, &err);
    cr_assert_eq(rc, -ECONNRESET, "%s: the connection should be closed (rc %d)", what, rc);
}

static void still_serving(const daemon_proc *d) {
    msm_client *c = connect_to(d);
    static const int32_t prompt[] = {5, 6, 7};
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 3;
    g.max_tokens = 4;
    stream s;
    generate(c, 1, &g, &s);
    cr_assert_gt(s.finish, 0, "a good request after bad input failed: %s", s.msg);
    msm_client_free(c);
}

Test(daemon, bad_input_is_answered_and_the_daemon_keeps_serving, .timeout = 180) {
    daemon_proc d;
    const char *sets[] = {have_model() ? "engine.backend=auto" : "engine.backend=fake", NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    msm_err err;
    int vocab, ctx;
    {
        msm_client *c = connect_to(&d);
        cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, &err), 0);
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        vocab = (int)f->model_info->vocab;
        ctx = (int)f->model_info->max_context;
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        msm_client_free(c);
    }
    /* Random bytes: the first four are a length way over the cap (or garbage protobuf). */
    {
        msm_client *c = connect_to(&d);
        uint8_t junk[1000];
        srand(12345);
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)rand();
        msm_client_send_raw(c, junk, sizeof junk, &err);
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
        fprintf(stderr, "bad input %-34s -> %s: %s\n", "random bytes", msm_client_code_name(f->error->code),
                f->error->message);
        cr_assert(f->error->code == MSMOE__V1__CODE__RESOURCE_EXHAUSTED || f->error->code == MSMOE__V1__CODE__INVALID_ARGUMENT);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        expect_closed(c, "random bytes");
        msm_client_free(c);
        still_serving(&d);
    }
    /* Small random frames that are not protobuf. */
    {
        msm_client *c = connect_to(&d);
        uint8_t frame[4 + 6] = {0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        msm_client_send_raw(c, frame, sizeof frame, &err);
        expect_code(c, 0, MSMOE__V1__CODE__INVALID_ARGUMENT, "garbage protobuf body");
        expect_closed(c, "garbage protobuf body");
        msm_client_free(c);
    }
    /* Truncated frame: a header announcing 100 bytes, 10 bytes, then EOF. */
    {
        msm_client *c = connect_to(&d);
        uint8_t part[14] = {0, 0, 0, 100};
        msm_client_send_raw(c, part, sizeof part, &err);
        shutdown(msm_client_fd(c), SHUT_WR);
        expect_code(c, 0, MSMOE__V1__CODE__INVALID_ARGUMENT, "truncated frame");
        expect_closed(c, "truncated frame");
        msm_client_free(c);
    }
    /* Length over the cap (4 MiB default). */
    {
        msm_client *c = connect_to(&d);
        uint8_t hdr[4];
        msm_frame_put_header(hdr, (4u << 20) + 1);
        msm_client_send_raw(c, hdr, 4, &err);
        expect_code(c, 0, MSMOE__V1__CODE__RESOURCE_EXHAUSTED, "length over the cap");
        expect_closed(c, "length over the cap");
        msm_client_free(c);
        still_serving(&d);
    }
    /* Valid frame with an unknown field: refused, the connection stays usable. */
    msm_client *c = connect_to(&d);
    {
        uint8_t body[] = {0x08, 0x07, 0x22, 0x00, 0xf8, 0x07, 0x01}; /* id 7, health, field 127 */
        uint8_t frame[4 + sizeof body];
        msm_frame_put_header(frame, sizeof body);
        memcpy(frame + 4, body, sizeof body);
        msm_client_send_raw(c, frame, sizeof frame, &err);
        expect_code(c, 7, MSMOE__V1__CODE__INVALID_ARGUMENT, "unknown field");
    }
    /* Frame without a request id / without a call. */
    {
        uint8_t body[] = {0x22, 0x00};
        uint8_t frame[4 + sizeof body];
        msm_frame_put_header(frame, sizeof body);
        memcpy(frame + 4, body, sizeof body);
        msm_client_send_raw(c, frame, sizeof frame, &err);
        expect_code(c, 0, MSMOE__V1__CODE__INVALID_ARGUMENT, "missing request_id");
        uint8_t body2[] = {0x08, 0x09};
        msm_frame_put_header(frame, sizeof body2);
        memcpy(frame + 4, body2, sizeof body2);
        msm_client_send_raw(c, frame, 4 + sizeof body2, &err);
        expect_code(c, 9, MSMOE__V1__CODE__INVALID_ARGUMENT, "frame with no call");
    }
    static int32_t prompt[1024];
    for (int i = 0; i < 1024; i++)
        prompt[i] = i % 100;
    struct {
        const char *what;
        int n_prompt;
        int bad_id;
        int max_tokens;
        float temperature;
        bool set_temp;
        float top_p;
        int top_k;
        int logprobs;
        int code;
    } cases[] = {
        {"missing prompt", 0, -1, -1, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"token id == vocab", 3, 0, -1, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"token id negative", 3, -2, -1, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"max_tokens 0", 3, -1, 0, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"max_tokens huge", 3, -1, 2000000000, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"temperature negative", 3, -1, -1, -1.0f, true, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"temperature NaN", 3, -1, -1, NAN, true, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"temperature inf", 3, -1, -1, INFINITY, true, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"top_p > 1", 3, -1, -1, -1, false, 1.5f, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"top_k > vocab", 3, -1, -1, -1, false, -1, 1 << 30, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"logprobs 21", 3, -1, -1, -1, false, -1, -1, 21, MSMOE__V1__CODE__INVALID_ARGUMENT},
        {"prompt longer than the context", -2, -1, -1, -1, false, -1, -1, 0, MSMOE__V1__CODE__INVALID_ARGUMENT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t p[1024];
        int n = cases[k].n_prompt == -2 ? (ctx < 1024 ? ctx : 1024) : cases[k].n_prompt;
        memcpy(p, prompt, sizeof p);
        if (cases[k].bad_id == 0)
            p[1] = vocab;
        else if (cases[k].bad_id == -2)
            p[1] = -5;
        msm_client_gen g;
        msm_client_gen_init(&g);
        g.prompt = p;
        g.n_prompt = n;
        g.max_tokens = cases[k].max_tokens;
        g.temperature = cases[k].temperature;
        g.set_temperature = cases[k].set_temp;
        if (cases[k].top_p > 0) {
            g.top_p = cases[k].top_p;
            g.set_top_p = true;
        }
        g.top_k = cases[k].top_k;
        g.logprobs = cases[k].logprobs;
        cr_assert_eq(msm_client_send_generate(c, 50 + k, &g, &err), 0);
        expect_code(c, 50 + k, cases[k].code, cases[k].what);
    }
    /* Text prompt without a tokenizer; cancel of an unknown id; duplicate ids in flight. */
    {
        msm_client_gen g;
        msm_client_gen_init(&g);
        g.prompt_text = "Once upon a time";
        msm_client_send_generate(c, 80, &g, &err);
        expect_code(c, 80, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text (no tokenizer yet)");
        msm_client_send_simple(c, 81, MSMOE__V1__CLIENT_FRAME__CALL_CANCEL, &err);
        expect_code(c, 81, MSMOE__V1__CODE__NOT_FOUND, "cancel of an unknown request id");
    }
    msm_client_free(c);
    still_serving(&d);

    /* 1000 connections opened and dropped. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    static msm_client *many[1000];
    int opened = 0;
    for (int i = 0; i < 1000; i++) {
        if (msm_client_connect(d.sock, &many[i], &err) < 0)
            break;
        opened++;
        if (i % 3 == 0) /* some send half a frame before going away */
            msm_client_send_raw(many[i], "\0\0\0\x10xx", 6, &err);
    }
    cr_assert_geq(opened, 900, "only %d connections could be opened", opened);
    for (int i = 0; i < opened; i++)
        msm_client_free(many[i]);
    fprintf(stderr, "bad input %-34s -> all closed; daemon still serving\n", "1000 connections opened+dropped");
    still_serving(&d);
    c = connect_to(&d);
    for (int i = 0; i < 200 && metric(c, "msmoed_connections", NULL) > 1; i++)
        usleep(10000);
    cr_assert_eq(metric(c, "msmoed_connections", NULL), 1, "dropped connections are closed");
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- cancel, disconnect, drain (fake engine with a per-step delay) ---- */

static void start_slow_fake(daemon_proc *d, const char **extra) {
    const char *sets[16] = {"engine.backend=fake"};
    int n = 1;
    for (int i = 0; extra && extra[i]; i++)
        sets[n++] = extra[i];
    sets[n] = NULL;
    start_daemon(d, sets, "MSMOED_FAKE_STEP_US=5000", NULL, true);
}

Test(daemon, cancel_mid_stream_frees_blocks, .timeout = 60) {
    daemon_proc d;
    start_slow_fake(&d, NULL);
    msm_client *c = connect_to(&d);
    msm_err err;
    static const int32_t prompt[40] = {1, 2, 3};
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 40;
    g.max_tokens = 1000;
    cr_assert_eq(msm_client_send_generate(c, 5, &g, &err), 0);
    stream s = {0};
    for (int i = 0; i < 3; i++) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        cr_assert(!stream_add(&s, f));
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    cr_assert_eq(msm_client_send_simple(c, 5, MSMOE__V1__CLIENT_FRAME__CALL_CANCEL, &err), 0);
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        bool done = stream_add(&s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            break;
    }
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_CANCELLED);
    cr_assert_lt(s.n, 100, "cancelled promptly (%d tokens)", s.n);
    cr_assert_eq(metric(c, "msmoed_kv_blocks_used", NULL), 0);
    cr_assert_eq(metric(c, "msmoed_requests_finished_total", "reason=\"cancelled\""), 1);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon, disconnect_mid_stream_frees_blocks, .timeout = 60) {
    daemon_proc d;
    start_slow_fake(&d, NULL);
    msm_client *a = connect_to(&d), *b = connect_to(&d);
    msm_err err;
    static const int32_t prompt[40] = {4, 5, 6};
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 40;
    g.max_tokens = 1000;
    for (int r = 1; r <= 3; r++)
        cr_assert_eq(msm_client_send_generate(a, (uint64_t)r, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(a);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    cr_assert_gt(metric(b, "msmoed_kv_blocks_used", NULL), 0);
    msm_client_free(a);
    double used = 1;
    for (int i = 0; i < 200 && used > 0; i++) {
        usleep(5000);
        used = metric(b, "msmoed_kv_blocks_used", NULL);
    }
    cr_assert_eq(used, 0, "blocks freed after the disconnect");
    cr_assert_eq(metric(b, "msmoed_requests_finished_total", "reason=\"cancelled\""), 3);
    cr_assert_eq(metric(b, "msmoed_requests_active", NULL), 0);
    msm_client_free(b);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon, sigterm_drains_in_flight_requests, .timeout = 60) {
    daemon_proc d;
    start_slow_fake(&d, NULL);
    msm_client *c = connect_to(&d);
    msm_err err;
    static const int32_t prompt[] = {7, 8, 9};
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 3;
    g.max_tokens = 60;
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    stream s = {0};
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    stream_add(&s, f);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    kill(d.pid, SIGTERM);
    usleep(50000);
    /* No new connections while draining. */
    msm_client *late;
    cr_assert_neq(msm_client_connect(d.sock, &late, &err), 0, "the socket is closed while draining");
    for (;;) {
        f = recv_frame(c);
        bool done = stream_add(&s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            break;
    }
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "the in-flight request finished");
    cr_assert_eq(s.n, 60);
    int st;
    cr_assert_eq(waitpid(d.pid, &st, 0), d.pid);
    d.pid = 0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    msm_client_free(c);
    stop_daemon(&d);
}

Test(daemon, sigterm_cancels_after_the_drain_timeout, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"scheduler.drain_timeout_s=1", NULL};
    start_slow_fake(&d, extra);
    msm_client *c = connect_to(&d);
    msm_err err;
    static const int32_t prompt[] = {7, 8, 9};
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 3;
    g.max_tokens = 2000; /* 10 s at 5 ms a step */
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    stream s = {0};
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    stream_add(&s, f);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    kill(d.pid, SIGTERM);
    for (;;) {
        f = recv_frame(c);
        bool done = stream_add(&s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            break;
    }
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_CANCELLED);
    int st;
    cr_assert_eq(waitpid(d.pid, &st, 0), d.pid);
    d.pid = 0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    msm_client_free(c);
    stop_daemon(&d);
}

/* ---- systemd notify protocol ---- */

Test(daemon, notify_sequence, .timeout = 60) {
    char dir[] = "/tmp/msmoed-notify.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static char env[300];
    snprintf(env, sizeof env, "NOTIFY_SOCKET=%s", sa.sun_path);
    daemon_proc d;
    start_daemon(&d, NULL, env, "WATCHDOG_USEC=200000", false);
    bool status_before_ready = false, ready = false, extend = false, watchdog = false, stopping = false;
    char all[8192] = "";
    for (int i = 0; i < 2000 && !(ready && watchdog); i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0)
            continue;
        char buf[1024];
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n <= 0)
            continue;
        buf[n] = 0;
        strncat(all, buf, sizeof all - strlen(all) - 2);
        strcat(all, "|");
        if (strstr(buf, "READY=1")) {
            ready = true;
            /* READY=1 means the socket already listens. */
            msm_client *c = connect_to(&d);
            msm_client_free(c);
        } else if (strstr(buf, "STATUS=") && !ready) {
            status_before_ready = true;
        }
        if (strstr(buf, "EXTEND_TIMEOUT_USEC=") && !ready)
            extend = true;
        if (strstr(buf, "WATCHDOG=1") && ready)
            watchdog = true;
    }
    cr_assert(status_before_ready, "STATUS= while loading; got %s", all);
    cr_assert(extend, "EXTEND_TIMEOUT_USEC= while loading; got %s", all);
    cr_assert(ready, "READY=1; got %s", all);
    cr_assert(watchdog, "WATCHDOG=1 after READY=1; got %s", all);
    kill(d.pid, SIGTERM);
    for (int i = 0; i < 500 && !stopping; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0)
            continue;
        char buf[1024];
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n > 0) {
            buf[n] = 0;
            stopping |= strstr(buf, "STOPPING=1") != NULL;
        }
    }
    cr_assert(stopping, "STOPPING=1 after SIGTERM");
    cr_assert_eq(stop_daemon(&d), 0);
    close(fd);
    unlink(sa.sun_path);
    rmdir(dir);
}

/* ---- the CLI and the HTTP metrics port ---- */

static int sh(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, cap - 1, p) : 0;
    out[n] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(daemon, cli_and_http_metrics, .timeout = 60) {
    need_model();
    daemon_proc d;
    char port[64];
    int p = 20000 + (int)(getpid() % 20000);
    snprintf(port, sizeof port, "server.metrics_port=%d", p);
    const char *sets[] = {port, NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    char cmd[2048], out[65536];
    const char *cli = env_or("MSMOE", "build/tools/msmoe");
    snprintf(cmd, sizeof cmd, "%s --socket %s generate --ids 1,2,3,4 --max-tokens 24 --temperature 0 2>/dev/null", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    int32_t want[64];
    int n = run_msmoe_run("--prompt-ids 1,2,3,4 --max-new-tokens 24 --greedy", want, 64);
    char expect[1024] = "";
    for (int i = 0; i < n; i++)
        snprintf(expect + strlen(expect), sizeof expect - strlen(expect), "%s%d", i ? "," : "", want[i]);
    cr_assert(strncmp(out, expect, strlen(expect)) == 0, "msmoe printed '%s', msmoe-run '%s'", out, expect);
    snprintf(cmd, sizeof cmd, "%s --socket %s generate --ids 1,2 --top-p 1.5 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "INVALID_ARGUMENT") && strstr(out, "top_p"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --socket %s health", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s --socket %s info", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "Qwen2MoeForCausalLM"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --socket %s metrics", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "# TYPE msmoed_requests_total counter\nmsmoed_requests_total 1\n"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --socket %s/nonexistent health 2>&1", cli, d.dir);
    cr_assert_eq(sh(cmd, out, sizeof out), 3);
    /* GET /metrics over HTTP, with bash's /dev/tcp (no curl needed). */
    snprintf(cmd, sizeof cmd,
             "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d; printf \"GET /metrics HTTP/1.0\\r\\n\\r\\n\" >&3; cat <&3'", p);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "HTTP/1.0 200 OK"), "%s", out);
    cr_assert(strstr(out, "msmoed_tokens_generated_total"), "%s", out);
    cr_assert_eq(stop_daemon(&d), 0);
}
