/* Unit tests of the listener code every listener shares (daemon/listen.c): the loopback rule of
 * server.tcp_host, and the connection guard set on a real libuv loop: the limit, the idle
 * timeout (not while busy), the write stall (also of a connection whose library writes, which
 * reports no writes), a connection whose handle is closing no longer counting, the bounded
 * flush at shutdown. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "msm_listen.h"

Test(listen, loopback_addresses) {
    cr_assert_eq(msm_listen_loopback("127.0.0.1"), 1);
    cr_assert_eq(msm_listen_loopback("127.255.0.9"), 1);
    cr_assert_eq(msm_listen_loopback("::1"), 1);
    cr_assert_eq(msm_listen_loopback("::ffff:127.0.0.1"), 1);
    cr_assert_eq(msm_listen_loopback("0.0.0.0"), 0);
    cr_assert_eq(msm_listen_loopback("10.1.2.3"), 0);
    cr_assert_eq(msm_listen_loopback("::"), 0);
    cr_assert_eq(msm_listen_loopback("localhost"), -EINVAL);
    cr_assert_eq(msm_listen_loopback(""), -EINVAL);
}

/* One guarded connection: a pipe over one end of a socketpair (the test holds the other). */
typedef struct tconn {
    uv_pipe_t pipe;
    msm_conn_guard guard;
    uv_write_t wr;
    int peer;
    int timed_out;            /* -1, or the reason */
    bool closed;
} tconn;

static void on_closed(uv_handle_t *h) {
    ((tconn *)h->data)->closed = true;
}

static void on_timeout(msm_conn_guard *g, msm_conn_timeout why) {
    tconn *c = g->owner;
    c->timed_out = (int)why;
    msm_conn_guard_remove(g);
    uv_close((uv_handle_t *)&c->pipe, on_closed);
}

static void tconn_open(uv_loop_t *loop, msm_conn_set *cs, tconn *c, int expect) {
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    memset(c, 0, sizeof *c);
    c->timed_out = -1;
    c->peer = sv[1];
    cr_assert_eq(uv_pipe_init(loop, &c->pipe, 0), 0);
    cr_assert_eq(uv_pipe_open(&c->pipe, sv[0]), 0);
    c->pipe.data = c;
    cr_assert_eq(msm_conn_guard_add(cs, &c->guard, (uv_stream_t *)&c->pipe, on_timeout, c), expect);
}

static void tconn_close(tconn *c) {
    if (!c->closed && !uv_is_closing((uv_handle_t *)&c->pipe)) {
        msm_conn_guard_remove(&c->guard);
        uv_close((uv_handle_t *)&c->pipe, on_closed);
    }
    close(c->peer);
}

/* Queues 1 MiB on c that its peer never reads (a socket buffer's worth and more). */
static void queue_unread(tconn *c) {
    static char junk[1 << 20];
    uv_buf_t buf = uv_buf_init(junk, sizeof junk);
    cr_assert_eq(uv_write(&c->wr, (uv_stream_t *)&c->pipe, &buf, 1, NULL), 0);
    cr_assert_gt(uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe), 0);
}

static void stop_loop(uv_timer_t *t) {
    uv_stop(t->loop);
}

/* A loop and a guard set on it (max connections, idle and write timeouts in seconds). */
static void set_open(uv_loop_t *loop, msm_conn_set *cs, int max, int idle_s, int write_s) {
    msm_err err;
    uv_loop_init(loop);
    cr_assert_eq(msm_conn_set_init(cs, loop, max, idle_s, write_s, &err), 0, "%s", err.msg);
}

/* Runs the loop until the shut-down set has closed everything, and closes it. */
static void set_done(uv_loop_t *loop, msm_conn_set *cs) {
    uv_run(loop, UV_RUN_DEFAULT);
    cr_assert_eq(cs->n, 0);
    cr_assert_eq(uv_loop_close(loop), 0, "a handle is left open");
}

Test(listen, guard_limit_idle_busy_and_stall, .timeout = 30) {
    uv_loop_t loop;
    msm_conn_set cs;
    set_open(&loop, &cs, 3, 1, 1);
    tconn a, b, c, d;
    tconn_open(&loop, &cs, &a, 0);
    tconn_open(&loop, &cs, &b, 0);
    tconn_open(&loop, &cs, &c, 0);
    tconn_open(&loop, &cs, &d, -EMFILE); /* the fourth is over the limit */
    cr_assert_eq(cs.refused, 1);
    tconn_close(&d);
    msm_conn_guard_set_busy(&b.guard, true);
    /* c: replies queued and never read */
    msm_conn_guard_write_start(&c.guard);
    queue_unread(&c);
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, stop_loop, 1600, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(a.timed_out, MSM_CONN_IDLE, "idle: %d", a.timed_out);
    cr_assert_eq(b.timed_out, -1, "a busy connection is not idle");
    cr_assert_eq(c.timed_out, MSM_CONN_STALLED, "stalled: %d", c.timed_out);
    cr_assert_eq(cs.timed_out[MSM_CONN_IDLE], 1);
    cr_assert_eq(cs.timed_out[MSM_CONN_STALLED], 1);
    /* shutdown: b is no longer busy, the set closes its timer once b is gone */
    msm_conn_set_shutdown(&cs, 500);
    tconn_close(&a);
    tconn_close(&b);
    tconn_close(&c);
    uv_close((uv_handle_t *)&t, NULL);
    set_done(&loop, &cs);
}

/* Runs loop for ms milliseconds. */
static void run_for(uv_loop_t *loop, uint64_t ms) {
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, stop_loop, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

/* An HTTP connection (H2O writes its socket): busy for good, no write reported. Its backlog is
 * dated from the sweep that first sees it, not from when it was accepted long before. */
Test(listen, a_backlog_nobody_reports_stalls_from_the_sweep_that_sees_it, .timeout = 30) {
    uv_loop_t loop;
    msm_conn_set cs;
    set_open(&loop, &cs, 3, 1, 1);
    tconn c;
    tconn_open(&loop, &cs, &c, 0);
    msm_conn_guard_set_busy(&c.guard, true);
    run_for(&loop, 1500); /* open, quiet, for longer than the write timeout */
    cr_assert_eq(c.timed_out, -1, "a busy connection is not idle");
    queue_unread(&c); /* no write_start */
    run_for(&loop, 500);
    cr_assert_eq(c.timed_out, -1, "closed before server.write_timeout_s had passed since its backlog began");
    run_for(&loop, 1000);
    cr_assert_eq(c.timed_out, MSM_CONN_STALLED, "stalled: %d", c.timed_out);
    msm_conn_set_shutdown(&cs, 500);
    tconn_close(&c);
    set_done(&loop, &cs);
}

/* A connection whose handle a library closes (H2O's) is removed in its close callback only; from
 * uv_close on (the descriptor is released) it no longer counts against the limit. */
Test(listen, a_closing_connection_does_not_count, .timeout = 30) {
    uv_loop_t loop;
    msm_conn_set cs;
    set_open(&loop, &cs, 2, 0, 0);
    tconn a, b, c;
    tconn_open(&loop, &cs, &a, 0);
    tconn_open(&loop, &cs, &b, 0);
    uv_close((uv_handle_t *)&a.pipe, on_closed); /* the library closes it; its guard is still on the list */
    tconn_open(&loop, &cs, &c, 0);
    cr_assert_eq(cs.n, 2);
    cr_assert_eq(cs.refused, 0);
    uv_run(&loop, UV_RUN_NOWAIT);
    msm_conn_guard_remove(&a.guard); /* the close callback's removal: harmless */
    cr_assert_eq(cs.n, 2);
    msm_conn_set_shutdown(&cs, 500);
    tconn_close(&a);
    tconn_close(&b);
    tconn_close(&c);
    set_done(&loop, &cs);
}
