/* Integration tests of several TP groups in one msmoed (suite daemon_groups): engine.replicas on
 * the CPU backend and on the fake engine; requests spread and equal msmoe-run's, cancel and
 * disconnect reach every group, notify reports each group before READY=1, --check-config reports
 * the split. Helpers: daemon_helpers.h. */
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

/* ---- several TP groups: engine.replicas on the CPU backend (and on the fake engine) ---- */

static Msmoe__V1__ServerFrame *call_simple(msm_client *c, uint64_t rid, Msmoe__V1__ClientFrame__CallCase call) {
    msm_err err;
    cr_assert_eq(msm_client_send_simple(c, rid, call, &err), 0, "%s", err.msg);
    return recv_reply(c, rid);
}

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
        char args[256], ids[128];
        make_prompt(p, 53, 17, prompts[p], 6, ids, sizeof ids);
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
            ids_gen_init(&g, prompts[q], 6, MAXT);
            g.temperature = q % 2 ? 0.8f : 0;
            g.set_temperature = true;
            g.seed = q % 2 ? q : -1;
            g.ignore_eos = true;
            cr_assert_eq(msm_client_send_generate(c[k], (uint64_t)(100 + p), &g, &err), 0, "%s", err.msg);
        }
    static stream s[CONNS][PER];
    for (int k = 0; k < CONNS; k++) {
        streams_read(c[k], 100, s[k], PER);
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

/* Two replicas of TP=2 on the CPU (two groups of two rank threads on host collectives): 16
 * greedy requests on two connections equal msmoe-run --tp 2 token for token. (Also what the
 * ThreadSanitizer pass, `make test-tsan`, runs at TP=2 x 2 replicas.) */
Test(daemon_groups, tp2_times_two_replicas_equal_msmoe_run_tp2, .timeout = 240) {
    need_model();
    daemon_proc d;
    const char *sets[] = {"engine.backend=cpu", "engine.tp=2", "engine.replicas=2", NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    enum { CONNS = 2, PER = 8, MAXT = 16 };
    int32_t prompts[PER][5], want[PER][MAXT];
    int n_want[PER];
    for (int p = 0; p < PER; p++) {
        char args[256], ids[128];
        make_prompt(p, 29, 13, prompts[p], 5, ids, sizeof ids);
        snprintf(args, sizeof args, "--prompt-ids %s --max-new-tokens %d --greedy --ignore-eos --tp 2", ids, MAXT);
        n_want[p] = run_msmoe_run(args, want[p], MAXT);
        cr_assert_eq(n_want[p], MAXT);
    }
    msm_client *c[CONNS];
    msm_err err;
    for (int k = 0; k < CONNS; k++) {
        c[k] = connect_to(&d);
        for (int p = 0; p < PER; p++) {
            msm_client_gen g;
            ids_gen_init(&g, prompts[p], 5, MAXT);
            g.temperature = 0;
            g.set_temperature = true;
            g.ignore_eos = true;
            cr_assert_eq(msm_client_send_generate(c[k], (uint64_t)(10 + p), &g, &err), 0, "%s", err.msg);
        }
    }
    static stream s[CONNS][PER];
    for (int k = 0; k < CONNS; k++) {
        streams_read(c[k], 10, s[k], PER);
        for (int p = 0; p < PER; p++) {
            cr_assert_eq(s[k][p].finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "conn %d req %d: %s", k, p, s[k][p].msg);
            cr_assert_arr_eq(s[k][p].ids, want[p], (size_t)MAXT * sizeof(int32_t), "conn %d req %d", k, p);
        }
    }
    cr_assert_gt(metric(c[0], "msmoed_requests_finished_total", "reason=\"length\",group=\"0\""), 0);
    cr_assert_gt(metric(c[0], "msmoed_requests_finished_total", "reason=\"length\",group=\"1\""), 0);
    cr_assert_eq(metric_settles(c[0], "msmoed_kv_blocks_used", NULL, 0), 0);
    for (int k = 0; k < CONNS; k++)
        msm_client_free(c[k]);
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
        ids_gen_init(&g, prompts[r], 4, MAXT);
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
    ids_gen_init(&g, prompt, 3, 3);
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
