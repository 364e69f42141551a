/* msm_listen: TCP listeners and the connection guard of every listener (see msm_listen.h).
 *
 * The guard set keeps its connections on a list and sweeps it with one timer (a few times per
 * timeout, at most once a second) rather than a timer per connection: thousands of idle
 * connections cost one timer and one pass. The timer is unreferenced, so it never keeps the loop
 * alive by itself. */
#include "msm_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "msm_log.h"

int msm_listen_tcp(uv_loop_t *loop, uv_tcp_t *t, void *data, const char *host, int port, const char *what,
                   uv_connection_cb cb, bool *opened, msm_err *err) {
    struct sockaddr_storage addr;
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
    if (rc < 0)
        rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
    if (rc < 0)
        return msm_err_set(err, rc, "%s host '%s' is not an IPv4 or IPv6 address", what, host);
    if ((rc = uv_tcp_init(loop, t)) < 0)
        return msm_err_set(err, rc, "uv_tcp_init: %s", uv_strerror(rc));
    t->data = data;
    *opened = true;
    if ((rc = uv_tcp_bind(t, (const struct sockaddr *)&addr, 0)) < 0 || (rc = uv_listen((uv_stream_t *)t, 512, cb)) < 0)
        return msm_err_set(err, rc, "cannot listen on %s %s:%d: %s", what, host, port, uv_strerror(rc));
    msm_log_info("listening on %s %s:%d", what, host, port);
    return 0;
}

int msm_listen_loopback(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) != 1)
        return -EINVAL;
    if (IN6_IS_ADDR_LOOPBACK(&a6))
        return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

/* ---- the guard set ---- */

static void sweep_closed(uv_handle_t *h) {
    (void)h;
}

static void close_sweep(msm_conn_set *cs) {
    if (cs->have_sweep && !uv_is_closing((uv_handle_t *)&cs->sweep))
        uv_close((uv_handle_t *)&cs->sweep, sweep_closed);
}

/* Why g should be closed now, or -1. A backlog that shrank since the last sweep is progress too
 * (a large reply taken slowly, piece by piece, completes no write for a while). A backlog that was
 * not there at the last sweep started after it: for an owner that reports its writes this changes
 * nothing (msm_conn_guard_write_start has dated it already); for one whose library writes (H2O)
 * it is the only date there is. */
static int overdue(const msm_conn_set *cs, msm_conn_guard *g, uint64_t now) {
    size_t queued = uv_stream_get_write_queue_size(g->stream);
    if (queued < g->last_queued)
        g->write_since_ms = now;
    else if (g->last_queued == 0 && queued > 0 && g->write_since_ms < cs->last_sweep_ms)
        g->write_since_ms = cs->last_sweep_ms;
    g->last_queued = queued;
    if (queued > 0)
        return cs->write_ms && now - g->write_since_ms >= cs->write_ms ? MSM_CONN_STALLED : -1;
    if (cs->shutting_down)
        return -1; /* flushed: its owner closes it */
    return !g->busy && cs->idle_ms && now - g->last_ms >= cs->idle_ms ? MSM_CONN_IDLE : -1;
}

/* A connection whose handle is closing has released its descriptor (uv_close closes it at once):
 * it no longer counts, even when its owner removes it only in the close callback (H2O's). */
static bool released(msm_conn_guard *g) {
    if (!uv_is_closing((uv_handle_t *)g->stream))
        return false;
    msm_conn_guard_remove(g);
    return true;
}

static void on_sweep(uv_timer_t *t) {
    msm_conn_set *cs = t->data;
    uint64_t now = uv_now(cs->loop);
    for (msm_conn_guard *g = cs->head, *next; g; g = next) {
        next = g->next; /* the callback may not free g (that waits for the close callback) */
        if (released(g))
            continue;
        int why = g->timed_out ? -1 : overdue(cs, g, now);
        if (why < 0)
            continue;
        g->timed_out = true;
        cs->timed_out[why]++;
        g->on_timeout(g, (msm_conn_timeout)why);
    }
    cs->last_sweep_ms = now;
}

/* The sweep period: a quarter of the shortest timeout, between 50 ms and 1 s. */
static uint64_t sweep_period(const msm_conn_set *cs) {
    uint64_t p = 1000;
    if (cs->idle_ms && cs->idle_ms / 4 < p)
        p = cs->idle_ms / 4;
    if (cs->write_ms && cs->write_ms / 4 < p)
        p = cs->write_ms / 4;
    return p < 50 ? 50 : p;
}

static void restart_sweep(msm_conn_set *cs) {
    if (cs->have_sweep && !uv_is_closing((uv_handle_t *)&cs->sweep))
        uv_timer_start(&cs->sweep, on_sweep, sweep_period(cs), sweep_period(cs));
}

int msm_conn_set_init(msm_conn_set *cs, uv_loop_t *loop, int max_connections, int idle_timeout_s,
                      int write_timeout_s, msm_err *err) {
    memset(cs, 0, sizeof *cs);
    cs->loop = loop;
    cs->last_sweep_ms = uv_now(loop);
    cs->max = max_connections;
    cs->idle_ms = (uint64_t)idle_timeout_s * 1000;
    cs->write_ms = (uint64_t)write_timeout_s * 1000;
    int rc = uv_timer_init(loop, &cs->sweep);
    if (rc < 0)
        return msm_err_set(err, rc, "uv_timer_init: %s", uv_strerror(rc));
    cs->have_sweep = true;
    cs->sweep.data = cs;
    uv_unref((uv_handle_t *)&cs->sweep);
    restart_sweep(cs);
    return 0;
}

void msm_conn_set_shutdown(msm_conn_set *cs, int flush_ms) {
    cs->shutting_down = true;
    if (!cs->write_ms || cs->write_ms > (uint64_t)flush_ms)
        cs->write_ms = (uint64_t)flush_ms;
    /* a backlog that has waited longer already gets flush_ms from now */
    uint64_t now = uv_now(cs->loop);
    for (msm_conn_guard *g = cs->head; g; g = g->next)
        if (now - g->write_since_ms > cs->write_ms)
            g->write_since_ms = now - cs->write_ms / 2;
    restart_sweep(cs);
    if (cs->n == 0)
        close_sweep(cs);
}

int msm_conn_guard_add(msm_conn_set *cs, msm_conn_guard *g, uv_stream_t *stream, msm_conn_timeout_fn fn,
                       void *owner) {
    uint64_t now = uv_now(cs->loop);
    *g = (msm_conn_guard){.set = cs, .stream = stream, .on_timeout = fn, .owner = owner, .last_ms = now,
                          .write_since_ms = now, .next = cs->head};
    if (cs->head)
        cs->head->prev = g;
    cs->head = g;
    cs->n++;
    for (msm_conn_guard *o = g->next, *next; o && cs->n > cs->max; o = next) {
        next = o->next;
        released(o);
    }
    if (cs->n <= cs->max)
        return 0;
    cs->refused++;
    return -EMFILE;
}

void msm_conn_guard_remove(msm_conn_guard *g) {
    msm_conn_set *cs = g->set;
    if (!cs)
        return;
    if (g->prev)
        g->prev->next = g->next;
    else
        cs->head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    g->set = NULL;
    cs->n--;
    if (cs->shutting_down && cs->n == 0)
        close_sweep(cs);
}

void msm_conn_guard_read(msm_conn_guard *g) {
    if (g->set)
        g->last_ms = uv_now(g->set->loop);
}

void msm_conn_guard_write_start(msm_conn_guard *g) {
    if (g->set && uv_stream_get_write_queue_size(g->stream) == 0)
        g->write_since_ms = uv_now(g->set->loop);
}

void msm_conn_guard_wrote(msm_conn_guard *g) {
    if (g->set)
        g->last_ms = g->write_since_ms = uv_now(g->set->loop);
}

void msm_conn_guard_set_busy(msm_conn_guard *g, bool busy) {
    if (!g->set)
        return;
    if (g->busy && !busy)
        g->last_ms = uv_now(g->set->loop); /* idle from now on */
    g->busy = busy;
}
