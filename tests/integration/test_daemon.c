/* Integration tests of msmoed (suite daemon): the real binary over a temporary Unix socket, on
 * the embedded model (models/stories260k-moe) on the CPU engine: streamed tokens equal msmoe-run's,
 * many requests on many connections, bad input answered with a code while the daemon keeps
 * serving, and the CLI and the HTTP metrics port. Helpers: daemon_helpers.h. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <unistr.h>

#include "daemon_helpers.h"
#include "msm_client.h"
#include "msm_frame.h"

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
        ids_gen_init(&g, prompt, 4, 24);
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
        char args[256], ids[128];
        make_prompt(p, 37, 11, prompts[p], 6, ids, sizeof ids);
        snprintf(args, sizeof args, "--prompt-ids %s --max-new-tokens %d --greedy", ids, MAXT);
        n_want[p] = run_msmoe_run(args, want[p], MAXT);
    }
    msm_client *c[CONNS];
    msm_err err;
    for (int k = 0; k < CONNS; k++) {
        c[k] = connect_to(&d);
        for (int p = 0; p < PER; p++) {
            msm_client_gen g;
            ids_gen_init(&g, prompts[(p + k) % PER], 6, MAXT);
            g.temperature = 0;
            g.set_temperature = true;
            cr_assert_eq(msm_client_send_generate(c[k], (uint64_t)(100 + p), &g, &err), 0, "%s", err.msg);
        }
    }
    static stream s[CONNS][PER];
    for (int k = 0; k < CONNS; k++) {
        streams_read(c[k], 100, s[k], PER);
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

static void expect_closed(msm_client *c, const char *what) {
    Msmoe__V1__ServerFrame *f = NULL;
    msm_err err;
    int rc = msm_client_recv(c, &f, &err);
    cr_assert_eq(rc, -ECONNRESET, "%s: the connection should be closed (rc %d)", what, rc);
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
        ids_gen_init(&g, p, n, cases[k].max_tokens);
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

/* ---- the CLI and the HTTP metrics port ---- */

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
    cr_assert(strstr(out, "HTTP/1.1 200 OK"), "%s", out); /* H2O answers HTTP/1.0 requests as 1.1 */
    cr_assert(strstr(out, "msmoed_tokens_generated_total"), "%s", out);
    cr_assert_eq(stop_daemon(&d), 0);
}
