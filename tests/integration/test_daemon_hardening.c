/* Integration tests of msmoed's hardening (suite daemon_hardening, issue 16): the real daemon and
 * real sockets, attacked the way a hostile or careless client, operator or device would. The four
 * bugs (a client that stops reading holding the shutdown, a start-up error hanging, a stale
 * Cancel killing a new request that reuses its id, a second daemon taking a live socket over),
 * then the defences: connection limits and timeouts on every listener, per-connection limits and
 * fairness, configuration checks, strings with NUL bytes, half-closed connections, tokenization
 * off the loop thread, non-finite logits, fatal engine faults, signals during the load, the V4
 * refusal. Most use engine.backend = fake (fast, with MSMOED_FAKE_* and MSMOED_TEST_* switches);
 * those that need the real engine use the embedded model. Helpers: daemon_helpers.h. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon_helpers.h"
#include "msm_client.h"
#include "msm_frame.h"

#define TOKENIZER "engine.tokenizer=models/stories260k-moe/tokenizer.json"

/* A fake engine with the embedded tokenizer (text on the fake engine) and extra assignments. */
static void start_fake(daemon_proc *d, const char *step_us, const char **extra, const char *env2) {
    const char *sets[24] = {"engine.backend=fake", TOKENIZER};
    int n = 2;
    for (int i = 0; extra && extra[i]; i++)
        sets[n++] = extra[i];
    sets[n] = NULL;
    char env[64];
    snprintf(env, sizeof env, "MSMOED_FAKE_STEP_US=%s", step_us);
    start_daemon(d, sets, strdup(env), env2, true);
}

/* Reads frames of request rid on c into s until its stream ends (frames of other requests are
 * skipped). */
static void read_stream(msm_client *c, uint64_t rid, stream *s) {
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        bool done = f->request_id == rid && stream_add(s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            return;
    }
}

/* Whether the daemon closed c (a receive ends with -ECONNRESET within timeout_ms). */
static bool closed_by_daemon(msm_client *c, int timeout_ms) {
    msm_client_set_timeout_ms(c, timeout_ms);
    for (;;) {
        Msmoe__V1__ServerFrame *f = NULL;
        msm_err err;
        int rc = msm_client_recv(c, &f, &err);
        if (rc == -ECONNRESET)
            return true;
        if (rc < 0)
            return false;
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
}

/* A raw frame: ClientFrame{request_id = rid, field `call` = a message holding one string field
 * `field` of len bytes}, built by hand so the string may hold a NUL (protobuf-c packs strings with
 * strlen). */
static size_t raw_string_frame(uint8_t *out, uint64_t rid, int call, int field, const char *str, size_t len) {
    uint8_t *p = out + 4;
    *p++ = 0x08; /* field 1, varint */
    *p++ = (uint8_t)rid;
    *p++ = (uint8_t)(call << 3 | 2);
    *p++ = (uint8_t)(len + 2);
    *p++ = (uint8_t)(field << 3 | 2);
    *p++ = (uint8_t)len;
    memcpy(p, str, len);
    p += len;
    msm_frame_put_header(out, (uint32_t)(p - out - 4));
    return (size_t)(p - out);
}

/* A client with a small receive buffer that sends `requests` Generates of max_tokens each and
 * never reads: its replies pile up in the daemon. */
static msm_client *a_client_that_does_not_read(const daemon_proc *d, int requests, int max_tokens) {
    msm_client *c = connect_to(d);
    int small = 4096;
    setsockopt(msm_client_fd(c), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    static const int32_t prompt[] = {3, 4, 5};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, max_tokens);
    msm_err err;
    for (int r = 1; r <= requests; r++)
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)r, &g, &err), 0, "%s", err.msg);
    return c;
}

/* ---- bug 1: a client that stops reading must not hold the shutdown ---- */

Test(daemon_hardening, a_client_that_stops_reading_does_not_hold_the_shutdown, .timeout = 90) {
    daemon_proc d;
    start_fake(&d, "0", NULL, NULL);
    /* ~32,000 token frames (~800 KB): far past the socket buffers, far below max_queued_bytes */
    msm_client *slow = a_client_that_does_not_read(&d, 32, 1000), *other = connect_to(&d);
    double active = 1;
    for (int i = 0; i < 1000 && active != 0; i++) {
        usleep(10000);
        active = metric(other, "msmoed_requests_active", NULL);
    }
    cr_assert_eq(active, 0, "the requests did not finish");
    cr_assert_eq(metric(other, "msmoed_slow_readers_closed_total", NULL), 0, "closed over max_queued_bytes");
    msm_client_free(other);
    double t0 = now_ms();
    kill(d.pid, SIGTERM);
    int st = wait_exit(&d, 15000);
    double took = now_ms() - t0;
    cr_assert_eq(st, 0, "msmoed did not exit 0 within 15 s of SIGTERM while a client held unread replies "
                        "(status %d)", st);
    fprintf(stderr, "shutdown with a client not reading: %.0f ms\n", took);
    cr_assert_lt(took, 8000);
    msm_client_free(slow);
    stop_daemon(&d);
}

/* ---- bug 2: a start-up error exits non-zero at once, and --check-config refuses it ---- */

Test(daemon_hardening, a_start_up_error_exits_promptly_and_check_config_refuses_it, .timeout = 60) {
    char out[4096];
    daemon_proc d;
    const char *sets[] = {"engine.max_context=1", NULL};
    start_daemon(&d, sets, NULL, NULL, false);
    int st = wait_exit(&d, 10000);
    cr_assert(st > 0, "msmoed with engine.max_context = 1 did not exit non-zero within 10 s (status %d)", st);
    stop_daemon(&d);
    cr_assert_eq(run_msmoed("--set engine.max_context=1 --check-config", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "engine.max_context = 1"), "%s", out);
    cr_assert_null(strstr(out, "incomplete engine vtable"), "%s", out);
    if (!have_model())
        return;
    /* a model whose max_position_embeddings is 1 */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "d=$(mktemp -d /tmp/msmoed-m1.XXXXXX) && cp -r %s/. $d && sed -i "
             "'s/\"max_position_embeddings\": *[0-9]*/\"max_position_embeddings\": 1/' $d/config.json && echo $d",
             env_or("MSMOE_MODEL", "models/stories260k-moe"));
    char dir[256];
    cr_assert_eq(sh(cmd, dir, sizeof dir), 0);
    dir[strcspn(dir, "\n")] = 0;
    char model[300], args[600];
    snprintf(model, sizeof model, "engine.model=%s", dir);
    const char *sets2[] = {model, NULL};
    start_daemon(&d, sets2, NULL, NULL, false);
    st = wait_exit(&d, 10000);
    cr_assert(st > 0, "msmoed on a model with max_position_embeddings 1 did not exit non-zero (status %d)", st);
    stop_daemon(&d);
    snprintf(args, sizeof args, "--set %s --set server.socket=/tmp/x.sock --check-config", model);
    cr_assert_eq(run_msmoed(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "max_position_embeddings = 1"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd, out, sizeof out);
}

/* ---- bug 3: a Cancel crossing its request's end must not cancel a new request reusing the id ---- */

typedef struct reuse_job {
    const daemon_proc *d;
    int rounds;
    int wrong;       /* new requests that ended CANCELLED or short */
    int crossed;     /* cancels that arrived after the end (answered NOT_FOUND) */
} reuse_job;

static void *reuse_main(void *arg) {
    reuse_job *j = arg;
    msm_client *c = connect_to(j->d);
    static const int32_t prompt[] = {9, 8, 7};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 2);
    msm_err err;
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    for (int r = 0; r < j->rounds; r++) {
        /* request 1 is under way: its first token, then a Cancel that races its second (last) */
        stream s = {0};
        bool done = false, cancelled = false;
        while (!done) {
            Msmoe__V1__ServerFrame *f = recv_frame(c);
            if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR &&
                f->error->code == MSMOE__V1__CODE__NOT_FOUND) {
                j->crossed++; /* the answer to an earlier round's stale Cancel */
                msmoe__v1__server_frame__free_unpacked(f, NULL);
                continue;
            }
            done = stream_add(&s, f);
            msmoe__v1__server_frame__free_unpacked(f, NULL);
            if (!done && !cancelled) {
                cr_assert_eq(msm_client_send_simple(c, 1, MSMOE__V1__CLIENT_FRAME__CALL_CANCEL, &err), 0);
                cancelled = true;
            }
        }
        /* a round whose request was not cancelled must have run whole; a request that ended
         * CANCELLED without a token is the new one, killed by the previous round's Cancel */
        if (s.finish == MSMOE__V1__FINISH_REASON__FINISH_CANCELLED && s.n == 0)
            j->wrong++;
        /* the same id again, at once */
        cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    }
    msm_client_free(c);
    return NULL;
}

Test(daemon_hardening, a_stale_cancel_does_not_cancel_a_new_request_reusing_its_id, .timeout = 180) {
    daemon_proc d;
    start_fake(&d, "300", NULL, NULL);
    enum { CONNS = 16, ROUNDS = 500 };
    reuse_job jobs[CONNS];
    pthread_t t[CONNS];
    for (int i = 0; i < CONNS; i++) {
        jobs[i] = (reuse_job){.d = &d, .rounds = ROUNDS};
        pthread_create(&t[i], NULL, reuse_main, &jobs[i]);
    }
    int wrong = 0, crossed = 0;
    for (int i = 0; i < CONNS; i++) {
        pthread_join(t[i], NULL);
        wrong += jobs[i].wrong;
        crossed += jobs[i].crossed;
    }
    fprintf(stderr, "reused ids: %d rounds, %d cancels crossed their request's end, %d new requests cancelled\n",
            CONNS * ROUNDS, crossed, wrong);
    cr_assert_eq(wrong, 0, "%d new requests reusing an id were cancelled by the Cancel of the old one", wrong);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- bug 4: a second daemon must not take over a live socket; a stale one is replaced ---- */

Test(daemon_hardening, a_second_daemon_does_not_take_over_a_live_socket, .timeout = 60) {
    daemon_proc a, b;
    const char *fake[] = {"engine.backend=fake", NULL};
    start_daemon(&a, fake, NULL, NULL, true);
    char same[400];
    snprintf(same, sizeof same, "server.socket=%s", a.sock);
    const char *sets[] = {"engine.backend=fake", same, NULL};
    start_daemon(&b, sets, NULL, NULL, false);
    int st = wait_exit(&b, 10000);
    cr_assert_eq(st, 1, "the second daemon on a live socket should exit 1 (status %d)", st);
    stop_daemon(&b);
    still_serving(&a);
    cr_assert_eq(stop_daemon(&a), 0);

    /* a crash leaves a stale socket file: the next daemon replaces it */
    daemon_proc c, e;
    start_daemon(&c, fake, NULL, NULL, true);
    kill(c.pid, SIGKILL);
    waitpid(c.pid, NULL, 0);
    c.pid = 0;
    struct stat sb;
    cr_assert_eq(lstat(c.sock, &sb), 0, "the crash left no socket file");
    snprintf(same, sizeof same, "server.socket=%s", c.sock);
    start_daemon(&e, sets, NULL, NULL, false);
    msm_client *cl = NULL;
    msm_err err;
    for (int i = 0; i < 500 && msm_client_connect(c.sock, &cl, &err) < 0; i++)
        usleep(20000);
    cr_assert_not_null(cl, "the daemon after a crash does not serve the old socket path");
    msm_client_free(cl);
    strcpy(e.sock, c.sock);
    still_serving(&e);
    cr_assert_eq(stop_daemon(&e), 0);
    stop_daemon(&c);
}

/* ---- connections: limits and timeouts on every listener ---- */

/* A TCP connection to 127.0.0.1:port (blocking, 5 s receive timeout). */
static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect to port %d: %s", port, strerror(errno));
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads what the peer sends until it closes: the bytes read (>= 0), -1 on a timeout. */
static ssize_t read_to_close(int fd, char *buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            break;
        if (r < 0)
            return -1;
        n += (size_t)r;
        if (n == cap - 1)
            break;
    }
    buf[n] = 0;
    return (ssize_t)n;
}

/* The metrics port runs on H2O (msm_http): its connections count in the guard set, and their idle
 * time is H2O's request timeout (http.read_timeout_ms). */
Test(daemon_hardening, metrics_connections_count_against_max_connections_and_time_out, .timeout = 60) {
    daemon_proc d;
    int port = free_port();
    char mp[64];
    snprintf(mp, sizeof mp, "server.metrics_port=%d", port);
    const char *extra[] = {mp, "server.max_connections=3", "http.read_timeout_ms=1000", NULL};
    start_fake(&d, "0", extra, NULL);
    usleep(200000); /* start_daemon's probe connection is gone */
    /* three idle metrics connections fill the limit ... */
    int fd[3];
    for (int i = 0; i < 3; i++)
        fd[i] = tcp_connect(port);
    usleep(100000);
    msm_client *c = connect_to(&d);
    expect_code(c, 0, MSMOE__V1__CODE__RESOURCE_EXHAUSTED, "API connection over max_connections");
    msm_client_free(c);
    /* ... until the read timeout closes them */
    char buf[256];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(read_to_close(fd[i], buf, sizeof buf), 0, "metrics connection %d not closed when idle", i);
        close(fd[i]);
    }
    still_serving(&d);
    /* a request with a NUL byte is answered at once (it used to hide the end of the headers) */
    int h = tcp_connect(port);
    static const char req[] = "GET /metrics\0x HTTP/1.0\r\n\r\n";
    cr_assert_eq(send(h, req, sizeof req - 1, 0), (ssize_t)(sizeof req - 1));
    static char resp[65536];
    double t0 = now_ms();
    ssize_t n = read_to_close(h, resp, sizeof resp);
    cr_assert_gt(n, 0, "no answer to a request with a NUL byte");
    cr_assert_lt(now_ms() - t0, 900, "answered only by the read timeout");
    cr_assert(strstr(resp, "HTTP/1.1 400"), "%s", resp);
    close(h);
    msm_client *m = connect_to(&d);
    cr_assert_geq(metric(m, "msmoed_connections_refused_total", NULL), 1);
    msm_client_free(m);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_hardening, idle_connections_time_out_and_busy_ones_do_not, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"server.idle_timeout_s=1", NULL};
    start_fake(&d, "5000", extra, NULL);
    msm_client *idle = connect_to(&d), *busy = connect_to(&d);
    static const int32_t prompt[] = {1, 2};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 2, 500); /* ~2.5 s of tokens */
    stream s;
    stream_start(busy, 7, &g, &s);
    cr_assert(closed_by_daemon(idle, 4000), "an idle connection was not closed after server.idle_timeout_s");
    read_stream(busy, 7, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s.msg);
    cr_assert_eq(s.n, 500);
    msm_client_free(idle);
    msm_client_free(busy);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_hardening, a_client_not_taking_its_replies_is_closed_after_the_write_timeout, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"server.write_timeout_s=1", NULL};
    start_fake(&d, "0", extra, NULL);
    /* to the end of the context: 2,045 tokens each */
    msm_client *slow = a_client_that_does_not_read(&d, 8, 30000), *other = connect_to(&d);
    double closed = 0;
    for (int i = 0; i < 1000 && closed < 1; i++) {
        usleep(10000);
        closed = metric(other, "msmoed_connections_timed_out_total", "reason=\"stalled\"");
    }
    cr_assert_eq(closed, 1, "a connection that took no reply for server.write_timeout_s was not closed");
    cr_assert_eq(metric_settles(other, "msmoed_kv_blocks_used", NULL, 0), 0, "its requests hold KV blocks");
    cr_assert_eq(metric(other, "msmoed_slow_readers_closed_total", NULL), 0, "closed by max_queued_bytes instead");
    msm_client_free(slow);
    msm_client_free(other);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* Reads frames until the first Error reply, which it returns (the caller frees it); the request's
 * other frames (chunks of the streams under way) are skipped. */
static Msmoe__V1__ServerFrame *first_refusal(msm_client *c) {
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR)
            return f;
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
}

/* ---- per-connection limits and fairness ---- */

Test(daemon_hardening, one_connection_has_a_request_limit, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"server.max_requests_per_connection=4", NULL};
    start_fake(&d, "5000", extra, NULL);
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {1, 2};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 2, 50);
    msm_err err;
    for (int r = 1; r <= 5; r++)
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)r, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = first_refusal(c);
    cr_assert_eq(f->request_id, 5);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__RESOURCE_EXHAUSTED);
    cr_assert(strstr(f->error->message, "4 requests in flight on this connection") &&
              strstr(f->error->message, "server.max_requests_per_connection = 4"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_hardening, one_connection_cannot_starve_another, .timeout = 60) {
    daemon_proc d;
    /* one sequence at a time, 5 ms a step: every request waits its turn in the queue */
    const char *extra[] = {"engine.max_seqs=1", NULL};
    start_fake(&d, "5000", extra, NULL);
    msm_client *hog = connect_to(&d), *polite = connect_to(&d);
    static const int32_t prompt[] = {1, 2, 3};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 4);
    msm_err err;
    enum { HOG = 60 };
    for (int r = 1; r <= HOG; r++)
        cr_assert_eq(msm_client_send_generate(hog, (uint64_t)r, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_frame(hog); /* the hog's queue is in the scheduler */
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    stream s;
    generate(polite, 1, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s.msg);
    double before = metric(polite, "msmoed_requests_finished_total", "reason=\"length\"");
    fprintf(stderr, "fairness: the other connection's request finished after %.0f of the hog's %d\n", before - 1, HOG);
    cr_assert_leq(before, 4, "the request of a second connection waited behind %.0f of the first's", before - 1);
    static stream rest[HOG];
    streams_read(hog, 1, rest, HOG);
    msm_client_free(hog);
    msm_client_free(polite);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_hardening, queue_full_names_the_count_and_the_limit, .timeout = 60) {
    daemon_proc d;
    const char *extra[] = {"engine.max_seqs=1", "scheduler.max_queue=2", NULL};
    start_fake(&d, "20000", extra, NULL);
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {1, 2, 3};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 50);
    msm_err err;
    for (int r = 1; r <= 5; r++)
        cr_assert_eq(msm_client_send_generate(c, (uint64_t)r, &g, &err), 0);
    Msmoe__V1__ServerFrame *f = first_refusal(c);
    cr_assert_eq(f->error->code, MSMOE__V1__CODE__RESOURCE_EXHAUSTED);
    cr_assert(strstr(f->error->message, "queue is full: 2 requests waiting (scheduler.max_queue = 2)"), "%s",
              f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- configuration ---- */

Test(daemon_hardening, a_line_longer_than_the_reader_is_refused_with_its_number, .timeout = 30) {
    char path[] = "/tmp/msmoed-long.XXXXXX", out[4096], args[256];
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "[server]\nsocket = /tmp/msmoed-long.sock\n# ");
    for (int i = 0; i < 300; i++)
        fputc('x', f);
    fprintf(f, "socket_mode = 0777\n[engine]\nbackend = fake\n");
    fclose(f);
    snprintf(args, sizeof args, "--config %s --check-config", path);
    int st = run_msmoed(args, out, sizeof out);
    unlink(path);
    cr_assert_eq(st, 2, "a 300-character comment was accepted: %s", out);
    char want[64];
    snprintf(want, sizeof want, "%s:3: line longer than", path);
    cr_assert(strstr(out, want), "%s", out);
}

Test(daemon_hardening, a_remote_tcp_host_needs_tcp_allow_remote, .timeout = 60) {
    char out[8192], args[512];
    int port = free_port();
    snprintf(args, sizeof args, "--set engine.backend=fake --set server.socket= --set server.tcp=%d "
             "--set server.tcp_host=0.0.0.0 --check-config", port);
    cr_assert_eq(run_msmoed(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "not a loopback address") && strstr(out, "tcp_allow_remote"), "%s", out);
    snprintf(args, sizeof args, "--set engine.backend=fake --set server.socket= --set server.tcp=%d "
             "--set server.tcp_host=localhost --check-config", port);
    cr_assert_eq(run_msmoed(args, out, sizeof out), 2, "%s", out);
    /* allowed: it serves, with a warning that the TCP API has no authentication */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout -s TERM 2 %s --set engine.backend=fake --set server.socket= --set server.tcp=%d "
             "--set server.tcp_host=0.0.0.0 --set server.tcp_allow_remote=true 2>&1",
             env_or("MSMOED", "build/daemon/msmoed"), port);
    sh(cmd, out, sizeof out);
    cr_assert(strstr(out, "no authentication") && strstr(out, "ready"), "%s", out);
}

Test(daemon_hardening, socket_path_errors_name_the_limit_and_the_missing_directory, .timeout = 60) {
    char out[4096], args[1024], longp[300];
    memset(longp, 'a', sizeof longp);
    memcpy(longp, "/tmp/", 5);
    longp[150] = 0;
    snprintf(args, sizeof args, "--set engine.backend=fake --set server.socket=%s --check-config", longp);
    cr_assert_eq(run_msmoed(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "at most 107"), "%s", out);
    daemon_proc d;
    const char *sets[] = {"engine.backend=fake", "server.socket=/tmp/msmoed-no-such-dir/s.sock", NULL};
    start_daemon(&d, sets, NULL, NULL, false);
    cr_assert_eq(wait_exit(&d, 10000), 1);
    stop_daemon(&d);
    cr_assert_eq(run_msmoed("--set engine.backend=fake --set server.socket=/tmp/msmoed-no-such-dir/s.sock", out,
                            sizeof out), 1);
    cr_assert(strstr(out, "/tmp/msmoed-no-such-dir does not exist") && !strstr(out, "permission denied"), "%s", out);
}

/* The embedded model copied to a temporary directory, where the shell command `edit` (run in it)
 * corrupts it; --check-config on it must fail with a message containing `want`. */
static void check_config_refuses(const char *what, const char *edit, const char *want) {
    char cmd[2048], dir[256], out[8192];
    snprintf(cmd, sizeof cmd, "d=$(mktemp -d /tmp/msmoed-bad.XXXXXX) && cp -r %s/. $d && cd $d && %s && echo $d",
             env_or("MSMOE_MODEL", "models/stories260k-moe"), edit);
    cr_assert_eq(sh(cmd, dir, sizeof dir), 0, "%s: %s", what, cmd);
    dir[strcspn(dir, "\n")] = 0;
    snprintf(cmd, sizeof cmd, "--set engine.model=%s --set server.socket=/tmp/x.sock --check-config", dir);
    int st = run_msmoed(cmd, out, sizeof out);
    fprintf(stderr, "check-config, %s -> %d: %s", what, st, out);
    cr_expect_eq(st, 2, "%s: --check-config said OK", what);
    cr_expect(strstr(out, want), "%s: %s", what, out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd, out, sizeof out);
}

Test(daemon_hardening, check_config_validates_the_model_like_start_up, .timeout = 120) {
    need_model();
    check_config_refuses("config.json not JSON", "echo '{' > config.json", "config.json");
    check_config_refuses("config.json without hidden_size", "sed -i '/hidden_size/d' config.json", "hidden_size");
    check_config_refuses("safetensors truncated", "truncate -s 100000 model.safetensors", "model.safetensors");
    check_config_refuses("safetensors header cut", "truncate -s 20 model.safetensors", "model.safetensors");
    check_config_refuses("a tensor renamed", "sed -i '1s/model.norm.weight/model.norm.weighx/' model.safetensors",
                         "model.norm.weight");
    check_config_refuses("a tensor of the wrong shape (hidden 64 -> 32 in config.json)",
                         "sed -i 's/\"hidden_size\": 64/\"hidden_size\": 32/' config.json", "shape");
    check_config_refuses("tokenizer.json broken", "echo '{\"model\":' > tokenizer.json", "tokenizer");
}

/* ---- text: NUL bytes, half-closed connections, tokenization off the loop thread ---- */

Test(daemon_hardening, strings_with_a_nul_byte_are_refused, .timeout = 60) {
    daemon_proc d;
    start_fake(&d, "0", NULL, NULL);
    msm_client *c = connect_to(&d);
    uint8_t frame[128];
    msm_err err;
    static const char text[] = "Once\0 upon a time";
    size_t n = raw_string_frame(frame, 3, 2, 2, text, sizeof text - 1); /* generate.prompt_text */
    cr_assert_eq(msm_client_send_raw(c, frame, n, &err), 0);
    expect_code(c, 3, MSMOE__V1__CODE__INVALID_ARGUMENT, "prompt_text with a NUL byte");
    static const char stop[] = "up\0on";
    n = raw_string_frame(frame, 4, 2, 6, stop, sizeof stop - 1); /* generate.stop_strings (no prompt) */
    cr_assert_eq(msm_client_send_raw(c, frame, n, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_reply(c, 4);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert(strstr(f->error->message, "generate.stop_strings contains a NUL byte"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    n = raw_string_frame(frame, 5, 7, 1, text, sizeof text - 1); /* tokenize.text */
    cr_assert_eq(msm_client_send_raw(c, frame, n, &err), 0);
    expect_code(c, 5, MSMOE__V1__CODE__INVALID_ARGUMENT, "tokenize.text with a NUL byte");
    /* the same text without the NUL is served */
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt_text = "Once upon a time";
    g.max_tokens = 4;
    stream s;
    generate(c, 6, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s.msg);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

Test(daemon_hardening, a_half_closed_connection_still_gets_its_replies, .timeout = 60) {
    daemon_proc d;
    start_fake(&d, "2000", NULL, NULL);
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {5, 6, 7};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 40);
    msm_err err;
    cr_assert_eq(msm_client_send_generate(c, 1, &g, &err), 0);
    msm_client_gen_init(&g);
    g.prompt_text = "Once upon a time";
    g.max_tokens = 10;
    cr_assert_eq(msm_client_send_generate(c, 2, &g, &err), 0);
    cr_assert_eq(msm_client_send_tokenize(c, 3, "Once upon a time", true, false, &err), 0);
    shutdown(msm_client_fd(c), SHUT_WR);
    static stream s[2];
    memset(s, 0, sizeof s);
    int done = 0, tokenized = 0;
    while (done < 2 || !tokenized) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        if (f->request_id == 3) {
            cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
            tokenized = 1;
        } else {
            done += stream_add(&s[f->request_id - 1], f);
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    cr_assert_eq(s[0].finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s[0].msg);
    cr_assert_eq(s[0].n, 40);
    cr_assert_eq(s[1].finish, MSMOE__V1__FINISH_REASON__FINISH_LENGTH, "%s", s[1].msg);
    cr_assert_eq(s[1].n, 10);
    cr_assert(closed_by_daemon(c, 5000), "the daemon did not close the half-closed connection after its replies");
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* About 1 MiB of text the embedded tokenizer encodes slowly (many short words). */
static char *big_text(size_t len) {
    static const char words[] = "Once upon a time there was a little girl named Lily who saw a big red ball. ";
    char *t = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        t[i] = words[i % (sizeof words - 1)];
    t[len] = 0;
    return t;
}

Test(daemon_hardening, tokenization_does_not_stall_other_clients, .timeout = 120) {
    daemon_proc d;
    start_fake(&d, "0", NULL, NULL);
    msm_client *a = connect_to(&d), *b = connect_to(&d);
    char *text = big_text((1u << 20) - 64);
    msm_err err;
    double t0 = now_ms();
    cr_assert_eq(msm_client_send_tokenize(a, 1, text, true, false, &err), 0);
    Msmoe__V1__ServerFrame *f = recv_reply(a, 1);
    double one = now_ms() - t0;
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    enum { PIPELINED = 16 };
    for (int r = 0; r < PIPELINED; r++)
        cr_assert_eq(msm_client_send_tokenize(a, (uint64_t)(10 + r), text, true, false, &err), 0);
    /* meanwhile another client's calls answered on the loop thread come back at once */
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        double h0 = now_ms();
        cr_assert_eq(msm_client_send_simple(b, 100 + (uint64_t)i, MSMOE__V1__CLIENT_FRAME__CALL_HEALTH, &err), 0);
        f = recv_reply(b, 100 + (uint64_t)i);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (now_ms() - h0 > worst)
            worst = now_ms() - h0;
        usleep(20000);
    }
    for (int r = 0; r < PIPELINED; r++) {
        f = recv_frame(a);
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_TOKENIZE);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    fprintf(stderr, "tokenizing 1 MiB: %.0f ms; another client's Health with %d MiB pipelined: worst %.1f ms\n", one,
            PIPELINED, worst);
    cr_assert_lt(worst, one / 2 > 50 ? one / 2 : 50, "Health waited %.0f ms behind tokenization (%.0f ms a MiB)",
                 worst, one);
    /* a prompt_text that can never fit the context is refused before it is encoded */
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt_text = text;
    t0 = now_ms();
    cr_assert_eq(msm_client_send_generate(a, 99, &g, &err), 0);
    f = recv_reply(a, 99);
    double refused = now_ms() - t0;
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR);
    cr_assert(strstr(f->error->message, "encodes to at least"), "%s", f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
    fprintf(stderr, "a 1 MiB prompt_text refused in %.1f ms\n", refused);
    free(text);
    msm_client_free(a);
    msm_client_free(b);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* ---- non-finite logits ---- */

Test(daemon_hardening, nan_logits_fail_the_request_with_internal, .timeout = 60) {
    daemon_proc d;
    start_fake(&d, "0", NULL, "MSMOED_TEST_FAULT=nan@3");
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {5, 6, 7};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 20);
    stream s;
    generate(c, 1, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_ERROR, "finish %d", s.finish);
    cr_assert_eq(s.n, 2, "tokens before the NaN: %d", s.n);
    cr_assert(strstr(s.msg, "not finite"), "%s", s.msg);
    cr_assert_eq(metric(c, "msmoed_nonfinite_logits_total", NULL), 1);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
}

/* The embedded model with its final norm's weights at 3e38: the logits overflow to infinities. */
Test(daemon_hardening, an_overflowing_model_fails_requests_instead_of_serving_garbage, .timeout = 120) {
    need_model();
    char cmd[1024], dir[256], out[256];
    snprintf(cmd, sizeof cmd, "d=$(mktemp -d /tmp/msmoed-inf.XXXXXX) && cp -r %s/. $d && echo $d",
             env_or("MSMOE_MODEL", "models/stories260k-moe"));
    cr_assert_eq(sh(cmd, dir, sizeof dir), 0);
    dir[strcspn(dir, "\n")] = 0;
    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    uint64_t hlen;
    cr_assert_eq(fread(&hlen, 8, 1, f), 1);
    char *hdr = calloc(1, hlen + 1);
    cr_assert_eq(fread(hdr, 1, hlen, f), hlen);
    char *t = strstr(hdr, "\"model.norm.weight\"");
    cr_assert_not_null(t);
    long a, b;
    cr_assert_eq(sscanf(strstr(t, "data_offsets") + 14, "[%ld,%ld]", &a, &b), 2);
    cr_assert(strstr(t, "\"F32\"") && strstr(t, "\"F32\"") < strstr(t, "}"), "the embedded model is not F32");
    fseek(f, (long)(8 + hlen) + a, SEEK_SET);
    for (long i = a; i < b; i += 4) {
        float big = 3e38f;
        fwrite(&big, 4, 1, f);
    }
    fclose(f);
    free(hdr);
    daemon_proc d;
    char model[300];
    snprintf(model, sizeof model, "engine.model=%s", dir);
    const char *sets[] = {model, NULL};
    start_daemon(&d, sets, NULL, NULL, true);
    msm_client *c = connect_to(&d);
    static const int32_t prompt[] = {1, 403, 407};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 8);
    stream s;
    generate(c, 1, &g, &s);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_ERROR, "served %d tokens from infinite logits (finish %d)",
                 s.n, s.finish);
    cr_assert_eq(s.n, 0);
    cr_assert(strstr(s.msg, "not finite"), "%s", s.msg);
    cr_assert_eq(metric(c, "msmoed_nonfinite_logits_total", NULL), 1);
    msm_client_free(c);
    cr_assert_eq(stop_daemon(&d), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd, out, sizeof out);
}

/* ---- engine faults: in-flight requests end with INTERNAL, health stops serving, exit 1 ---- */

/* A daemon whose engine fails for good at step 3 (env: the fault switch): the in-flight request
 * ends with an error coded INTERNAL, Health is no longer serving, and msmoed exits 1. */
static void fault_ends_the_daemon(daemon_proc *d) {
    msm_client *c = connect_to(d), *h = connect_to(d);
    static const int32_t prompt[] = {5, 6, 7};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 50);
    stream s;
    generate(c, 1, &g, &s);
    fprintf(stderr, "engine fault: %d tokens, then: %s\n", s.n, s.msg);
    cr_assert_eq(s.finish, MSMOE__V1__FINISH_REASON__FINISH_ERROR, "finish %d: %s", s.finish, s.msg);
    cr_assert_lt(s.n, 50);
    msm_err err;
    Msmoe__V1__ServerFrame *f = NULL;
    if (msm_client_send_simple(h, 2, MSMOE__V1__CLIENT_FRAME__CALL_HEALTH, &err) == 0 &&
        msm_client_recv(h, &f, &err) == 0) {
        cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_HEALTH);
        cr_assert(!f->health->serving, "health says serving after the fault: %s", f->health->status);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    } /* else: already closed, which is not serving either */
    int st = wait_exit(d, 15000);
    cr_assert_eq(st, 1, "msmoed should exit 1 after an engine fault (status %d)", st);
    msm_client_free(c);
    msm_client_free(h);
    stop_daemon(d);
}

Test(daemon_hardening, a_fatal_engine_fault_ends_requests_and_the_daemon, .timeout = 60) {
    daemon_proc d;
    start_fake(&d, "1000", NULL, "MSMOED_TEST_FAULT=launch@3");
    fault_ends_the_daemon(&d);
}

/* An engine step that never returns (a device or a collective stuck where no deadline reaches, as
 * an NCCL teardown can be): at 2 x engine.deadline_ms + 5 s the step watchdog ends the group's
 * requests with INTERNAL, health stops serving, and msmoed exits 1 without joining the stuck
 * threads. */
Test(daemon_hardening, an_engine_step_that_never_returns_ends_requests_and_the_daemon, .timeout = 60) {
    daemon_proc d;
    const char *sets[] = {"engine.deadline_ms=100", NULL};
    start_fake(&d, "1000", sets, "MSMOED_TEST_FAULT=stall@3");
    fault_ends_the_daemon(&d);
}

Test(daemon_hardening, a_cpu_step_past_its_deadline_ends_requests_and_the_daemon, .timeout = 120) {
    need_model();
    daemon_proc d;
    const char *sets[] = {"engine.deadline_ms=200", NULL};
    start_daemon(&d, sets, "MSMOED_TEST_FAULT=hang@3", NULL, true);
    fault_ends_the_daemon(&d);
}

Test(daemon_hardening, a_cpu_launch_failure_ends_requests_and_the_daemon, .timeout = 120) {
    need_model();
    daemon_proc d;
    start_daemon(&d, NULL, "MSMOED_TEST_FAULT=launch@3", NULL, true);
    fault_ends_the_daemon(&d);
}

/* ---- signals during the load; the V4 refusal ---- */

Test(daemon_hardening, sigterm_during_the_load_exits_promptly_with_status_0, .timeout = 60) {
    notify_sock ns;
    notify_open(&ns);
    daemon_proc d;
    const char *sets[] = {"engine.backend=fake", NULL};
    start_daemon(&d, sets, ns.env, "MSMOED_FAKE_LOAD_MS=30000", false);
    char buf[1024];
    bool loading = false;
    for (int i = 0; i < 500 && !loading; i++)
        loading = notify_recv(&ns, buf, sizeof buf) && strstr(buf, "STATUS=loading");
    cr_assert(loading, "no STATUS=loading");
    double t0 = now_ms();
    kill(d.pid, SIGTERM);
    int st = wait_exit(&d, 5000);
    cr_assert_eq(st, 0, "status %d after SIGTERM during the load", st);
    fprintf(stderr, "SIGTERM during the load: exited in %.0f ms\n", now_ms() - t0);
    cr_assert_lt(now_ms() - t0, 2000);
    stop_daemon(&d);
    notify_close(&ns);
}

Test(daemon_hardening, a_rank_with_a_different_collective_schedule_is_refused_at_start_up, .timeout = 120) {
    need_model();
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "MSMOED_TEST_V4_RANK=1 timeout -s KILL 60 %s --set engine.model=%s --set engine.tp=2 "
             "--set server.socket=/tmp/msmoed-v4-%d.sock 2>&1", env_or("MSMOED", "build/daemon/msmoed"),
             env_or("MSMOE_MODEL", "models/stories260k-moe"), (int)getpid());
    int st = sh(cmd, out, sizeof out);
    cr_assert_eq(st, 1, "status %d: %s", st, out);
    cr_assert(strstr(out, "graph verify V4") && strstr(out, "refusing to serve"), "%s", out);
}

/* Out of descriptors, accept fails and libuv resets the client without a word: server.max_connections
 * is kept below RLIMIT_NOFILE (with a warning), so every client over the limit is told why. */
Test(daemon_hardening, max_connections_stays_below_the_descriptor_limit, .timeout = 60) {
    daemon_proc d;
    const char *sets[] = {"engine.backend=fake", NULL};
    start_daemon(&d, sets, "NOFILE=320", NULL, true); /* max_connections 1024 -> 64 */
    usleep(200000);
    enum { N = 330 };
    static msm_client *c[N];
    int refused = 0, served = 0;
    msm_err err;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(msm_client_connect(d.sock, &c[i], &err), 0, "connect %d: %s", i, err.msg);
        msm_client_set_timeout_ms(c[i], 5000);
    }
    for (int i = 0; i < N; i++) {
        Msmoe__V1__ServerFrame *f = NULL;
        /* a refused connection has its error waiting (the send may then fail: it is closed) */
        msm_client_send_simple(c[i], 1, MSMOE__V1__CLIENT_FRAME__CALL_HEALTH, &err);
        if (msm_client_recv(c[i], &f, &err) < 0)
            cr_assert_fail("connection %d was dropped without a reply: %s", i, err.msg);
        if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_ERROR) {
            cr_assert_eq(f->error->code, MSMOE__V1__CODE__RESOURCE_EXHAUSTED);
            refused++;
        } else {
            served++;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    fprintf(stderr, "RLIMIT_NOFILE 320: %d connections served, %d refused with a reply\n", served, refused);
    cr_assert_eq(served, 64);
    for (int i = 0; i < N; i++)
        msm_client_free(c[i]);
    cr_assert_eq(stop_daemon(&d), 0);
}
