/* Integration tests: the real msmoed binary over a temporary Unix socket.
 *
 * Correctness tests run the embedded model (models/stories260k-moe) on the CPU engine and compare
 * with msmoe-run's offline output, ids and text (the model directory's tokenizer.json). Timing-sensitive tests (cancel and disconnect mid-stream,
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

#include <unistr.h>

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
    char text[16384];  /* concatenated GenerateChunk.text */
    size_t text_len;
    int n_text;        /* chunks with a text field */
    int bad_text;      /* chunks whose text is not whole UTF-8 characters */
    int completion_tokens;
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
    const char *t = f->chunk->text;
    if (t) {
        size_t L = strlen(t);
        s->n_text++;
        if (u8_check((const uint8_t *)t, L))
            s->bad_text++;
        if (s->text_len + L < sizeof s->text) {
            memcpy(s->text + s->text_len, t, L + 1);
            s->text_len += L;
        }
    }
    if (f->chunk->has_finish_reason && f->chunk->finish_reason != MSMOE__V1__FINISH_REASON__FINISH_NONE) {
        s->finish = (int)f->chunk->finish_reason;
        s->completion_tokens = f->chunk->usage ? (int)f->chunk->usage->completion_tokens : -1;
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
    /* Both prompts at once; cancel of an unknown id. */
    {
        msm_client_gen g;
        msm_client_gen_init(&g);
        g.prompt_text = "Once upon a time";
        g.prompt = prompt;
        g.n_prompt = 3;
        msm_client_send_generate(c, 80, &g, &err);
        expect_code(c, 80, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text and prompt_ids");
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

/* A token-id Generate request: prompt p[0..n), max_tokens, everything else the defaults. */
static void ids_gen_init(msm_client_gen *g, const int32_t *p, int n, int max_tokens) {
    msm_client_gen_init(g);
    g->prompt = p;
    g->n_prompt = n;
    g->max_tokens = max_tokens;
}

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
    ids_gen_init(&g, prompt, 40, 1000);
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
    ids_gen_init(&g, prompt, 40, 1000);
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

static double metric_settles(msm_client *c, const char *name, const char *labels, double want) {
    double v = metric(c, name, labels);
    for (int i = 0; i < 200 && v != want; i++) {
        usleep(5000);
        v = metric(c, name, labels);
    }
    return v;
}

/* A client that sends requests and never reads: once its unread replies pass
 * server.max_queued_bytes (beyond the kernel's socket buffer) the daemon closes it and cancels its
 * requests (KV blocks freed); everyone else is served as before. */
Test(daemon, client_that_stops_reading_is_closed_and_loses_nothing_for_others, .timeout = 60) {
    daemon_proc d;
    const char *sets[] = {"engine.backend=fake", "server.max_queued_bytes=4096", NULL};
    start_daemon(&d, sets, "MSMOED_FAKE_STEP_US=200", NULL, true);
    msm_client *slow = connect_to(&d), *other = connect_to(&d);
    msm_err err;
    static const int32_t prompt[8] = {7, 8, 9};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 8, 1000);
    for (int r = 1; r <= 32; r++) /* ~32k token frames, far more than a socket buffer holds */
        cr_assert_eq(msm_client_send_generate(slow, (uint64_t)r, &g, &err), 0, "%s", err.msg);
    double closed = 0;
    for (int i = 0; i < 2000 && closed < 1; i++) {
        usleep(5000);
        closed = metric(other, "msmoed_slow_readers_closed_total", NULL);
    }
    cr_assert_eq(closed, 1, "the connection that stopped reading was not closed");
    cr_assert_eq(metric_settles(other, "msmoed_kv_blocks_used", NULL, 0), 0, "its KV blocks were not freed");
    cr_assert_eq(metric_settles(other, "msmoed_requests_active", NULL, 0), 0);
    cr_assert_eq(metric(other, "msmoed_requests_finished_total", "reason=\"cancelled\""), 32);
    /* the other connection still gets whole answers */
    g.max_tokens = 20;
    stream s = {0};
    generate(other, 99, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s.msg);
    cr_assert_eq(s.n, 20);
    msm_client_free(slow);
    msm_client_free(other);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon, sigterm_drains_in_flight_requests, .timeout = 60) {
    daemon_proc d;
    start_slow_fake(&d, NULL);
    msm_client *c = connect_to(&d);
    msm_err err;
    static const int32_t prompt[] = {7, 8, 9};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 60);
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

/* A datagram socket standing in for systemd's NOTIFY_SOCKET; env is "NOTIFY_SOCKET=<path>". */
typedef struct notify_sock {
    char dir[32];
    struct sockaddr_un sa;
    int fd;
    char env[300];
} notify_sock;

static void notify_open(notify_sock *n) {
    snprintf(n->dir, sizeof n->dir, "/tmp/msmoed-notify.XXXXXX");
    cr_assert_not_null(mkdtemp(n->dir));
    n->sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    snprintf(n->sa.sun_path, sizeof n->sa.sun_path, "%s/notify", n->dir);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(n->fd, (struct sockaddr *)&n->sa, sizeof n->sa), 0);
    snprintf(n->env, sizeof n->env, "NOTIFY_SOCKET=%s", n->sa.sun_path);
}

/* One message into buf (NUL-terminated), waiting up to 20 ms; false when none came. */
static bool notify_recv(notify_sock *n, char *buf, size_t cap) {
    struct pollfd p = {.fd = n->fd, .events = POLLIN};
    if (poll(&p, 1, 20) <= 0)
        return false;
    ssize_t r = recv(n->fd, buf, cap - 1, 0);
    if (r <= 0)
        return false;
    buf[r] = 0;
    return true;
}

static void notify_close(notify_sock *n) {
    close(n->fd);
    unlink(n->sa.sun_path);
    rmdir(n->dir);
}

Test(daemon, notify_sequence, .timeout = 60) {
    notify_sock ns;
    notify_open(&ns);
    daemon_proc d;
    start_daemon(&d, NULL, ns.env, "WATCHDOG_USEC=200000", false);
    bool status_before_ready = false, ready = false, extend = false, watchdog = false, stopping = false;
    char all[8192] = "", buf[1024];
    for (int i = 0; i < 2000 && !(ready && watchdog); i++) {
        if (!notify_recv(&ns, buf, sizeof buf))
            continue;
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
    for (int i = 0; i < 500 && !stopping; i++)
        if (notify_recv(&ns, buf, sizeof buf))
            stopping |= strstr(buf, "STOPPING=1") != NULL;
    cr_assert(stopping, "STOPPING=1 after SIGTERM");
    cr_assert_eq(stop_daemon(&d), 0);
    notify_close(&ns);
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
    snprintf(cmd, sizeof cmd, "%s --socket %s generate --ids 1,2,3,4 --max-tokens 24 --temperature 0 --print-ids 2>/dev/null", cli, d.sock);
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
    snprintf(cmd, sizeof cmd, "%s --socket %s info", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "tokenizer:") && strstr(out, "tokenizer.json (512 ids)"), "%s", out);
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

/* ---- text: prompt_text, text deltas, stop strings, Tokenize / Detokenize ---- */

/* msmoe-run --prompt TEXT --text: the ids (first line) and the decoded text (the rest). */
static int run_msmoe_run_text(const char *prompt, int max_new, int32_t *ids, int cap, char *text, size_t text_cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt '%s' --max-new-tokens %d --greedy --text",
             env_or("MSMOE_RUN", "build/tools/msmoe-run"), env_or("MSMOE_MODEL", "models/stories260k-moe"), prompt,
             max_new);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    char *nl = strchr(out, '\n');
    cr_assert_not_null(nl, "%s: no ids line", cmd);
    *nl = 0;
    int k = 0;
    for (char *q = out; *q && k < cap;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q)
            break;
        ids[k++] = (int32_t)v;
        q = *end == ',' ? end + 1 : end;
    }
    size_t tl = strlen(nl + 1);
    cr_assert(tl > 0 && nl[tl] == '\n', "%s: no text line", cmd);
    nl[tl] = 0; /* msmoe-run ends the text with a newline */
    snprintf(text, text_cap, "%s", nl + 1);
    return k;
}

static void text_gen_init(msm_client_gen *g, const char *prompt, int max_tokens) {
    msm_client_gen_init(g);
    g->prompt_text = prompt;
    g->max_tokens = max_tokens;
    g->temperature = 0;
    g->set_temperature = true;
}

Test(daemon_text, text_generate_equals_msmoe_run, .timeout = 180) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert(f->model_info->has_tokenizer, "ModelInfo: no tokenizer");
    cr_assert(strstr(f->model_info->tokenizer, "tokenizer.json"), "%s", f->model_info->tokenizer);
    cr_assert_eq(f->model_info->tokenizer_vocab, 512);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Plain text; a prompt whose continuation starts a new word; an emoji (byte-fallback tokens)
     * and accented letters; all in flight at once on one connection. */
    static const char *prompts[] = {"Once upon a time", "Tom and Lily went to the park. They",
                                    "Lily saw a \xf0\x9f\x99\x82 in the sky and said", "The caf\xc3\xa9 was"};
    enum { N = 4, MAXT = 60 };
    static int32_t want[N][MAXT];
    static char want_text[N][16384];
    int n_want[N];
    for (int k = 0; k < N; k++) {
        n_want[k] = run_msmoe_run_text(prompts[k], MAXT, want[k], MAXT, want_text[k], sizeof want_text[k]);
        cr_assert_gt(n_want[k], 0);
        msm_client_gen g;
        text_gen_init(&g, prompts[k], MAXT);
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)(10 + k), &g, &err), 0, "%s", err.msg);
    }
    static stream s[N];
    memset(s, 0, sizeof s);
    for (int done = 0; done < N;) {
        f = recv_frame(c);
        int k = (int)f->request_id - 10;
        cr_assert(k >= 0 && k < N);
        done += stream_add(&s[k], f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    for (int k = 0; k < N; k++) {
        cr_assert_gt(s[k].finish, 0, "'%s': %s", prompts[k], s[k].msg);
        cr_assert_eq(s[k].n, n_want[k], "'%s': %d tokens, msmoe-run %d", prompts[k], s[k].n, n_want[k]);
        cr_assert_arr_eq(s[k].ids, want[k], (size_t)n_want[k] * sizeof(int32_t), "'%s': ids differ", prompts[k]);
        cr_assert_eq(s[k].n_text, s[k].n, "'%s': every chunk carries text", prompts[k]);
        cr_assert_eq(s[k].bad_text, 0, "'%s': a chunk split a UTF-8 character", prompts[k]);
        /* The stream continues the prompt, so it keeps the leading space of a first word that a
         * stand-alone decode (msmoe-run --text) strips; otherwise the texts are equal. */
        const char *got = s[k].text;
        if (got[0] == ' ' && want_text[k][0] != ' ')
            got++;
        cr_assert_str_eq(got, want_text[k], "'%s': streamed text differs from msmoe-run --text", prompts[k]);
        fprintf(stderr, "text: '%s' -> '%.60s...'\n", prompts[k], s[k].text);
    }
    cr_assert_str_eq(s[0].text, want_text[0]);
    cr_assert(!strncmp(s[0].text, ", there was a little girl named Lily.", 37), "%s", s[0].text);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_text, stop_string_ends_the_generation, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_client_gen g;
    stream full, cut;
    text_gen_init(&g, "Once upon a time", 80);
    generate(c, 1, &g, &full);
    cr_assert_eq(full.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH);
    const char *at = strstr(full.text, "Lily");
    cr_assert_not_null(at, "%s", full.text);
    static const char *const stops[] = {"Lily", "zebra"};
    g.stop_strings = stops;
    g.n_stop_strings = 2;
    generate(c, 2, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP, "finish %d: %s", cut.finish, cut.msg);
    cr_assert_eq(cut.text_len, (size_t)(at - full.text));
    cr_assert(!strncmp(cut.text, full.text, cut.text_len), "'%s' is not a prefix of '%s'", cut.text, full.text);
    cr_assert_lt(cut.n, 20, "generation stopped at the stop string (%d tokens)", cut.n);
    cr_assert_eq(cut.completion_tokens, cut.n);
    cr_assert_arr_eq(cut.ids, full.ids, (size_t)cut.n * sizeof(int32_t));
    fprintf(stderr, "stop 'Lily': '%s' (%d tokens, finish stop)\n", cut.text, cut.n);
    /* A stop string that spans tokens ("girl named"). */
    static const char *const stops2[] = {"girl named"};
    g.stop_strings = stops2;
    g.n_stop_strings = 1;
    generate(c, 3, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP);
    cr_assert_str_eq(cut.text, ", there was a little ");
    /* ids prompts get text too, and stop strings work on them. */
    static const int32_t once[] = {1, 403, 407, 261, 378};
    msm_client_gen_init(&g);
    g.prompt = once;
    g.n_prompt = 5;
    g.max_tokens = 80;
    g.temperature = 0;
    g.set_temperature = true;
    g.stop_strings = stops;
    g.n_stop_strings = 1;
    generate(c, 4, &g, &cut);
    cr_assert_eq(cut.finish, MSMOE__V1__FINISH_REASON__FINISH_STOP);
    cr_assert_eq(cut.text_len, (size_t)(at - full.text));
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

static Msmoe__V1__ServerFrame *call_tokenize(msm_client *c, uint64_t rid, const char *text, bool add_special) {
    msm_err err;
    cr_assert_eq(msm_client_send_tokenize(c, rid, text, add_special, false, &err), 0, "%s", err.msg);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->request_id, rid);
    return f;
}

static Msmoe__V1__ServerFrame *call_detokenize(msm_client *c, uint64_t rid, const int32_t *ids, size_t n, bool skip) {
    msm_err err;
    cr_assert_eq(msm_client_send_detokenize(c, rid, ids, n, skip, &err), 0, "%s", err.msg);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->request_id, rid);
    return f;
}

Test(daemon_text, tokenize_detokenize_round_trip_and_errors, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    static const char *texts[] = {"Once upon a time", "Lily saw a \xf0\x9f\x99\x82 and a caf\xc3\xa9.\nThe end.",
                                  "\xe4\xbd\xa0\xe5\xa5\xbd"};
    for (int k = 0; k < 3; k++) {
        /* The same ids as the tokenizer's command line (which adds no BOS). */
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | %s --tokenizer %s/tokenizer.json --encode", texts[k],
                 env_or("MSMOE_RUN", "build/tools/msmoe-run"), env_or("MSMOE_MODEL", "models/stories260k-moe"));
        cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", cmd);
        Msmoe__V1__ServerFrame *f = call_tokenize(c, (uint64_t)(20 + k), texts[k], false);
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
        char got[4096] = "";
        for (size_t i = 0; i < f->tokenize->n_ids; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", f->tokenize->ids[i]);
        strcat(got, "\n");
        cr_assert_str_eq(got, out, "'%s'", texts[k]);
        Msmoe__V1__ServerFrame *g = call_detokenize(c, (uint64_t)(30 + k), f->tokenize->ids, f->tokenize->n_ids, true);
        cr_assert_eq(g->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_DETOKENIZE);
        cr_assert_str_eq(g->detokenize->text, texts[k], "round trip");
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        msmoe__v1__server_frame__free_unpacked(g, NULL);
    }
    /* add_special adds <s> (id 1); skip_special leaves it out of the text. */
    Msmoe__V1__ServerFrame *f = call_tokenize(c, 40, "Once upon a time", true);
    static const int32_t once[] = {1, 403, 407, 261, 378};
    cr_assert_eq(f->tokenize->n_ids, 5);
    cr_assert_arr_eq(f->tokenize->ids, once, sizeof once);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_detokenize(c, 41, once, 5, false);
    cr_assert(strstr(f->detokenize->text, "<s>") && strstr(f->detokenize->text, "Once upon a time"), "%s",
              f->detokenize->text);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Errors: ids out of range, invalid UTF-8; the connection stays usable. */
    static const int32_t bad[] = {403, 512};
    f = call_detokenize(c, 42, bad, 2, false);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "detokenize.ids[1] = 512"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    static const int32_t neg[] = {-7};
    f = call_detokenize(c, 43, neg, 1, false);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_tokenize(c, 44, "caf\xc3", true);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "tokenize.text"), "%s", f->error->message);
    fprintf(stderr, "tokenize of invalid UTF-8 -> %s\n", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_detokenize(c, 45, NULL, 0, false);
    cr_assert_str_eq(f->detokenize->text, "");
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_text, text_prompt_errors, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    msm_client_gen g;
    /* Longer than the context (512 tokens). */
    static char longtext[8192];
    for (int i = 0; i < 600; i++)
        strcat(longtext, "cat ");
    text_gen_init(&g, longtext, 8);
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    expect_code(c, 1, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text longer than the context");
    /* Neither prompt; both prompts. */
    msm_client_gen_init(&g);
    cr_assert_eq(msm_client_send_generate(c, 2, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "prompt_ids") && strstr(f->error->message, "prompt_text"), "%s",
              f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    static const int32_t ids[] = {1, 2};
    text_gen_init(&g, "Once", 8);
    g.prompt = ids;
    g.n_prompt = 2;
    cr_assert_eq(msm_client_send_generate(c, 3, &g, &err), 0);
    f = recv_frame(c);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__INVALID_ARGUMENT);
    cr_assert(strstr(f->error->message, "prompt_ids or prompt_text, not both"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    /* Invalid UTF-8 in the prompt and in a stop string. */
    text_gen_init(&g, "Once \xff", 8);
    cr_assert_eq(msm_client_send_generate(c, 4, &g, &err), 0);
    expect_code(c, 4, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text with invalid UTF-8");
    static const char *const badstop[] = {"\xc3"};
    text_gen_init(&g, "Once", 8);
    g.stop_strings = badstop;
    g.n_stop_strings = 1;
    cr_assert_eq(msm_client_send_generate(c, 5, &g, &err), 0);
    expect_code(c, 5, MSMOE__V1__CODE__INVALID_ARGUMENT, "stop string with invalid UTF-8");
    /* "<s>" in the text stays text unless parse_special is asked for. */
    stream a, b;
    text_gen_init(&g, "<s>Once", 1);
    generate(c, 6, &g, &a);
    g.parse_special = true;
    generate(c, 7, &g, &b);
    cr_assert_gt(a.finish, 0);
    cr_assert_gt(b.finish, 0);
    msm_client_free(c);
    still_serving(&d);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* A model directory without tokenizer.json: a warning, ids only. A broken tokenizer.json: a clear
 * start-up error. */
Test(daemon_text, missing_and_broken_tokenizer, .timeout = 120) {
    need_model();
    char dir[] = "/tmp/msmoed-notok.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char model[1100], path[1200], cmd[4096];
    const char *src = env_or("MSMOE_MODEL", "models/stories260k-moe");
    if (src[0] == '/')
        snprintf(model, sizeof model, "%s", src);
    else {
        char cwd[512];
        cr_assert_not_null(getcwd(cwd, sizeof cwd));
        snprintf(model, sizeof model, "%s/%s", cwd, src);
    }
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char from[1200];
        snprintf(from, sizeof from, "%s/%s", model, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(symlink(from, path), 0);
    }
    static char set_model[1200];
    snprintf(set_model, sizeof set_model, "engine.model=%s", dir);
    const char *sets[] = {set_model, NULL};
    daemon_proc d;
    start_daemon(&d, sets, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert(f->model_info->has_has_tokenizer && !f->model_info->has_tokenizer);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_gen g;
    text_gen_init(&g, "Once upon a time", 4);
    cr_assert_eq(msm_client_send_generate(c, 2, &g, &err), 0);
    expect_code(c, 2, MSMOE__V1__CODE__FAILED_PRECONDITION, "prompt_text without a tokenizer");
    cr_assert_eq(msm_client_send_tokenize(c, 3, "Once", true, false, &err), 0);
    expect_code(c, 3, MSMOE__V1__CODE__FAILED_PRECONDITION, "tokenize without a tokenizer");
    stream s;
    static const int32_t once[] = {1, 403, 407, 261, 378};
    msm_client_gen_init(&g);
    g.prompt = once;
    g.n_prompt = 5;
    g.max_tokens = 8;
    generate(c, 4, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "ids still work");
    cr_assert_eq(s.n_text, 0, "no text without a tokenizer");
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);

    /* Broken: not JSON. The daemon exits 1 and says which file and why. */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *fp = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": [", fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "%s --set server.socket=%s/s.sock --set engine.model=%s 2>&1",
             env_or("MSMOED", "build/daemon/msmoed"), dir, dir);
    char out[8192];
    int rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, out);
    cr_assert(strstr(out, "cannot load the tokenizer") && strstr(out, path), "%s", out);
    fprintf(stderr, "broken tokenizer.json -> %s", out);
    /* engine.tokenizer = none: text off even with a tokenizer.json; a named missing file fails. */
    snprintf(cmd, sizeof cmd, "%s --set engine.model=%s --set engine.tokenizer=/nonexistent/tok.json --check-config 2>&1",
             env_or("MSMOED", "build/daemon/msmoed"), dir);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "/nonexistent/tok.json"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(daemon_text, cli_text_commands, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, NULL, NULL, true);
    const char *cli = env_or("MSMOE", "build/tools/msmoe");
    char cmd[2048], out[65536], want_text[16384];
    int32_t want[64];
    run_msmoe_run_text("Once upon a time", 40, want, 64, want_text, sizeof want_text);
    /* A positional text prompt: the prompt, then the streamed continuation. */
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 'Once upon a time' --max-tokens 40 --temperature 0 2>/dev/null",
             cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    char expect[16500];
    snprintf(expect, sizeof expect, "Once upon a time%s\n", want_text);
    cr_assert_str_eq(out, expect);
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 'Once upon a time' --max-tokens 40 --temperature 0 --no-echo "
             "--stop Lily 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert(!strncmp(out, ", there was a little girl named \n[finish: stop", 46), "%s", out);
    /* --ids: text too (no echo of ids); --print-ids: ids. */
    snprintf(cmd, sizeof cmd, "%s --socket %s generate --ids 1,403,407,261,378 --max-tokens 40 --temperature 0 2>/dev/null",
             cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    snprintf(expect, sizeof expect, "%s\n", want_text);
    cr_assert_str_eq(out, expect);
    snprintf(cmd, sizeof cmd, "%s --socket %s tokenize 'Once upon a time'", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "1,403,407,261,378\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s tokenize --no-add-special 'Once upon a time'", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "403,407,261,378\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s detokenize 1,403,407,261,378 --skip-special", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 0);
    cr_assert_str_eq(out, "Once upon a time\n");
    snprintf(cmd, sizeof cmd, "%s --socket %s detokenize 1,9999 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "INVALID_ARGUMENT") && strstr(out, "9999"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --socket %s generate 2>&1", cli, d.sock);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "no prompt: usage error");
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- several TP groups: engine.replicas on the CPU backend (and on the fake engine) ---- */

static Msmoe__V1__ServerFrame *call_simple(msm_client *c, uint64_t rid, Msmoe__V1__ClientFrame__CallCase call) {
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, rid, call, &err), 0, "%s", err.msg);
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->request_id, rid);
    return f;
}

/* Polls a metric until it equals want (the schedulers publish their stats after each step). */

Test(daemon_groups, two_cpu_replicas_serve_32_requests_equal_to_msmoe_run, .timeout = 240) {
    need_model();
    daemon_proc d;
    const char *sets[] = {"engine.backend=cpu", "engine.replicas=2", NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    msm_client *info = connect_to(&d);
    Msmoe__V1__ServerFrame *f = call_simple(info, 1, MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_MODEL_INFO);
    cr_assert_eq(f->model_info->tp_groups, 2, "ModelInfo.tp_groups");
    cr_assert_eq(f->model_info->tp, 1, "ModelInfo.tp");
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    f = call_simple(info, 2, MSMOE__V1__CLIENT_FRAME__CALL_HEALTH);
    cr_assert(f->health->serving, "%s", f->health->status);
    cr_assert_str_eq(f->health->status, "serving (2 groups)");
    msmoe__v1__server_frame__free_unpacked(f, NULL);

    /* 8 prompts, each greedy and seeded-sampled: 32 requests on 4 connections, all in flight. */
    enum { CONNS = 4, PER = 8, MAXT = 24 };
    int32_t prompts[PER][6], want[PER][MAXT];
    int n_want[PER];
    for (int p = 0; p < PER; p++) {
        char args[256], ids[128] = "";
        for (int i = 0; i < 6; i++) {
            prompts[p][i] = (int32_t)(1 + (p * 53 + i * 17) % 500);
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompts[p][i]);
        }
        if (p % 2)
            snprintf(args, sizeof args, "--prompt-ids %s --max-new-tokens %d --temperature 0.8 --seed %d --ignore-eos",
                     ids, MAXT, p);
        else
            snprintf(args, sizeof args, "--prompt-ids %s --max-new-tokens %d --greedy --ignore-eos", ids, MAXT);
        n_want[p] = run_msmoe_run(args, want[p], MAXT);
        cr_assert_eq(n_want[p], MAXT);
    }
    msm_client *c[CONNS];
    msm_err err;
    for (int k = 0; k < CONNS; k++)
        c[k] = connect_to(&d);
    for (int p = 0; p < PER; p++)
        for (int k = 0; k < CONNS; k++) {
            int q = (p + k) % PER;
            msm_client_gen g;
            msm_client_gen_init(&g);
            g.prompt = prompts[q];
            g.n_prompt = 6;
            g.max_tokens = MAXT;
            g.temperature = q % 2 ? 0.8f : 0;
            g.set_temperature = true;
            g.seed = q % 2 ? q : -1;
            g.ignore_eos = true;
            cr_assert_eq(msm_client_send_generate(c[k], (uint64_t)(100 + p), &g, &err), 0, "%s", err.msg);
        }
    static stream s[CONNS][PER];
    memset(s, 0, sizeof s);
    for (int k = 0; k < CONNS; k++) {
        for (int done = 0; done < PER;) {
            f = recv_frame(c[k]);
            int p = (int)f->request_id - 100;
            cr_assert(p >= 0 && p < PER);
            done += stream_add(&s[k][p], f);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
        }
        for (int p = 0; p < PER; p++) {
            int q = (p + k) % PER;
            cr_assert_eq(s[k][p].finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "conn %d req %d: %s", k, p, s[k][p].msg);
            cr_assert_eq(s[k][p].n, n_want[q]);
            cr_assert_arr_eq(s[k][p].ids, want[q], (size_t)n_want[q] * sizeof(int32_t),
                             "conn %d req %d differs from msmoe-run", k, p);
        }
    }
    /* Both groups served: the per-group series add up to the node's. */
    double g0 = metric(info, "msmoed_requests_finished_total", "reason=\"length\",group=\"0\"");
    double g1 = metric(info, "msmoed_requests_finished_total", "reason=\"length\",group=\"1\"");
    fprintf(stderr, "replicas=2: group 0 finished %.0f requests, group 1 %.0f\n", g0, g1);
    cr_assert_gt(g0, 0, "group 0 served no request");
    cr_assert_gt(g1, 0, "group 1 served no request");
    cr_assert_eq(g0 + g1, 32);
    cr_assert_eq(metric(info, "msmoed_requests_finished_total", "reason=\"length\""), 32);
    cr_assert_gt(metric(info, "msmoed_tokens_generated_total", "group=\"0\""), 0);
    cr_assert_gt(metric(info, "msmoed_tokens_generated_total", "group=\"1\""), 0);
    cr_assert_eq(metric(info, "msmoed_tokens_generated_total", ""), 32 * MAXT);
    cr_assert_eq(metric(info, "msmoed_requests_total", NULL), 32);
    cr_assert_eq(metric_settles(info, "msmoed_kv_blocks_used", NULL, 0), 0);
    cr_assert_eq(metric(info, "msmoed_groups_healthy", NULL), 2);
    for (int k = 0; k < CONNS; k++)
        msm_client_free(c[k]);
    msm_client_free(info);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* Cancel mid-stream on two CPU groups: 16 long generations in flight (they alternate between the
 * groups), the first 8 cancelled after their first token; the cancels reach the owning schedulers,
 * the other 8 still equal msmoe-run, and every block comes back. */
Test(daemon_groups, cancel_mid_stream_on_two_cpu_replicas, .timeout = 240) {
    need_model();
    daemon_proc d;
    const char *sets[] = {"engine.backend=cpu", "engine.replicas=2", NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    enum { N = 16, CANCEL = 8, MAXT = 400 };
    static int32_t want[N][MAXT];
    int32_t prompts[N][4];
    for (int r = 0; r < N; r++) {
        char args[256];
        for (int i = 0; i < 4; i++)
            prompts[r][i] = (int32_t)(1 + (r * 29 + i * 13) % 500);
        if (r >= CANCEL) {
            snprintf(args, sizeof args, "--prompt-ids %d,%d,%d,%d --max-new-tokens %d --greedy --ignore-eos", prompts[r][0],
                     prompts[r][1], prompts[r][2], prompts[r][3], MAXT);
            cr_assert_eq(run_msmoe_run(args, want[r], MAXT), MAXT);
        }
    }
    msm_client *c = connect_to(&d), *m = connect_to(&d);
    msm_err err;
    for (int r = 0; r < N; r++) {
        msm_client_gen g;
        msm_client_gen_init(&g);
        g.prompt = prompts[r];
        g.n_prompt = 4;
        g.max_tokens = MAXT;
        g.temperature = 0;
        g.set_temperature = true;
        g.ignore_eos = true;
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)(1 + r), &g, &err), 0, "%s", err.msg);
    }
    static stream s[N];
    memset(s, 0, sizeof s);
    bool cancelled[N] = {false};
    for (int done = 0; done < N;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        int r = (int)f->request_id - 1;
        cr_assert(r >= 0 && r < N);
        done += stream_add(&s[r], f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (r < CANCEL && !cancelled[r] && s[r].n > 0 && !s[r].finish) {
            cr_assert_eq(msm_client_send_simple(c, (uint64_t)(1 + r), MSMOE__V1__CLIENT_FRAME__CALL_CANCEL, &err), 0);
            cancelled[r] = true;
        }
    }
    for (int r = 0; r < N; r++) {
        if (r < CANCEL) {
            cr_assert_eq(s[r].finish, MSMOE__V1__FINISH_REASON__FINISH_CANCELLED, "request %d: finish %d (%s)", r,
                         s[r].finish, s[r].msg);
            cr_assert_lt(s[r].n, MAXT, "request %d was cancelled mid-stream", r);
        } else {
            cr_assert_eq(s[r].finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "request %d: %s", r, s[r].msg);
            cr_assert_arr_eq(s[r].ids, want[r], MAXT * sizeof(int32_t), "request %d differs from msmoe-run", r);
        }
    }
    double c0 = metric(m, "msmoed_requests_finished_total", "reason=\"cancelled\",group=\"0\"");
    double c1 = metric(m, "msmoed_requests_finished_total", "reason=\"cancelled\",group=\"1\"");
    fprintf(stderr, "replicas=2 cancel: group 0 cancelled %.0f, group 1 %.0f; tokens before the cancel:", c0, c1);
    for (int r = 0; r < CANCEL; r++)
        fprintf(stderr, " %d", s[r].n);
    fprintf(stderr, "\n");
    cr_assert_eq(c0 + c1, CANCEL);
    cr_assert_gt(c0, 0, "the cancels reached group 0");
    cr_assert_gt(c1, 0, "the cancels reached group 1");
    cr_assert_eq(metric_settles(m, "msmoed_kv_blocks_used", NULL, 0), 0, "every block is back");
    cr_assert_eq(metric(m, "msmoed_requests_active", NULL), 0);
    msm_client_free(c);
    msm_client_free(m);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* A disconnect cancels the connection's requests on every group that holds one (the fake engine's
 * per-step delay guarantees "mid-stream"). */
Test(daemon_groups, disconnect_frees_blocks_on_every_group, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"engine.replicas=2", NULL};
    start_slow_fake(&d, extra);
    msm_client *a = connect_to(&d), *b = connect_to(&d);
    msm_err err;
    static const int32_t prompt[40] = {4, 5, 6};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 40, 1000);
    for (int r = 1; r <= 4; r++)
        cr_assert_eq(msm_client_send_generate(a, (uint64_t)r, &g, &err), 0);
    /* Wait until every request has streamed something. */
    bool streaming[5] = {false};
    for (int seen = 0; seen < 4;) {
        Msmoe__V1__ServerFrame *f = recv_frame(a);
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_CHUNK);
        cr_assert(f->request_id >= 1 && f->request_id <= 4);
        if (!streaming[f->request_id]) {
            streaming[f->request_id] = true;
            seen++;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    cr_assert_gt(metric(b, "msmoed_kv_blocks_used", "group=\"0\""), 0);
    cr_assert_gt(metric(b, "msmoed_kv_blocks_used", "group=\"1\""), 0);
    cr_assert_eq(metric(b, "msmoed_requests_running", "group=\"0\""), 2, "two requests on each group");
    cr_assert_eq(metric(b, "msmoed_requests_running", "group=\"1\""), 2);
    msm_client_free(a);
    cr_assert_eq(metric_settles(b, "msmoed_kv_blocks_used", "group=\"0\"", 0), 0, "group 0's blocks freed");
    cr_assert_eq(metric_settles(b, "msmoed_kv_blocks_used", "group=\"1\"", 0), 0, "group 1's blocks freed");
    cr_assert_eq(metric(b, "msmoed_requests_finished_total", "reason=\"cancelled\",group=\"0\""), 2);
    cr_assert_eq(metric(b, "msmoed_requests_finished_total", "reason=\"cancelled\",group=\"1\""), 2);
    cr_assert_eq(metric(b, "msmoed_requests_active", NULL), 0);
    /* The loads went back to zero: the next two requests go to different groups again. */
    msm_client_gen_init(&g);
    g.prompt = prompt;
    g.n_prompt = 3;
    g.max_tokens = 3;
    stream s;
    generate(b, 10, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH);
    msm_client_free(b);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* STATUS= names each group while it loads; READY=1 comes after the last one. */
Test(daemon_groups, notify_reports_each_group_before_ready, .timeout = 60) {
    notify_sock ns;
    notify_open(&ns);
    daemon_proc d;
    const char *sets[] = {have_model() ? "engine.backend=cpu" : "engine.backend=fake", "engine.replicas=3", NULL};
    start_daemon(&d, sets, ns.env, NULL, false);
    int seen_group[3] = {0};
    bool ready = false;
    char all[8192] = "", buf[1024];
    for (int i = 0; i < 1000 && !ready; i++) {
        if (!notify_recv(&ns, buf, sizeof buf))
            continue;
        strncat(all, buf, sizeof all - strlen(all) - 2);
        strcat(all, "|");
        for (int g = 0; g < 3; g++) {
            char want[32];
            snprintf(want, sizeof want, "group %d/3", g + 1);
            if (strstr(buf, "STATUS=") && strstr(buf, want)) {
                cr_assert(g == 0 || seen_group[g - 1], "group %d reported before group %d: %s", g + 1, g, all);
                seen_group[g] = 1;
            }
        }
        if (strstr(buf, "READY=1")) {
            ready = true;
            cr_assert(strstr(buf, "3 TP group(s)"), "%s", buf);
        }
    }
    cr_assert(ready, "READY=1; got %s", all);
    for (int g = 0; g < 3; g++)
        cr_assert(seen_group[g], "STATUS= for group %d/3 before READY=1; got %s", g + 1, all);
    cr_assert_eq(stop_daemon(&d), 0);
    notify_close(&ns);
}

Test(daemon_groups, check_config_reports_groups_and_refuses_a_bad_split, .timeout = 60) {
    const char *bin = env_or("MSMOED", "build/daemon/msmoed");
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "%s --set engine.backend=fake --set engine.replicas=3 --check-config 2>&1", bin);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "3 TP group(s) of tp 1"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --set engine.backend=cpu --set engine.gpus=0-5 --set engine.tp=4 --check-config 2>&1", bin);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--set: engine.gpus = 0-5 lists 6 GPU(s), not a multiple of engine.tp = 4"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --set engine.gpus=0-3,3 --check-config 2>&1", bin);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "engine.gpus lists GPU 3 twice"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s --set engine.backend=cuda --set engine.replicas=2 --check-config 2>&1", bin);
    cr_assert_eq(sh(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "engine.replicas = 2 applies to the CPU backend"), "%s", out);
}
