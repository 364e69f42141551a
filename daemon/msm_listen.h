/* msm_listen: what every listener of msmoed shares: binding a TCP listener (the API's TCP socket
 * and the HTTP listeners, msm_http), and the connection guard, one connection limit and one set
 * of timeouts over the connections of every listener.
 *
 * The guard. A listener's module embeds an msm_conn_guard in each connection and tells the
 * guard set (one per daemon, owned by msm_server) what happens to it:
 *
 *   after uv_accept        msm_conn_guard_add: counts it against server.max_connections;
 *                          -EMFILE when that is exceeded (refuse it: a short error, then close)
 *   bytes received         msm_conn_guard_read
 *   before each uv_write   msm_conn_guard_write_start
 *   in each write callback msm_conn_guard_wrote
 *   work in flight or not  msm_conn_guard_set_busy (a connection with work in flight is not idle)
 *   when it closes         msm_conn_guard_remove, right before uv_close (which releases the
 *                          descriptor at once: the limit must count it free from then on; a
 *                          connection whose handle is closing stops counting anyway, for owners
 *                          that can remove it only in the close callback)
 *
 * and the set calls the connection's timeout callback (on the loop thread) when it is idle
 * (nothing in flight, nothing received or written for server.idle_timeout_s) or stalled (replies
 * queued and none of them taken by the peer for server.write_timeout_s: no write completed and
 * the backlog did not shrink); the callback closes
 * it abruptly (uv_close; what the peer would not take is dropped). At shutdown
 * msm_conn_set_shutdown bounds the last flush of every connection the same way, with a shorter
 * limit, and closes the set's timer once the last connection is gone. Everything here runs on
 * the loop thread.
 *
 * A connection whose socket a library reads and writes (H2O's, in msm_http) reports no reads or
 * writes: its owner adds it, marks it busy for good (its idle time is the library's own timeout)
 * and removes it in its close callback (from the library's uv_close on, the set counts it free).
 * The set still watches its write backlog (uv_stream_get_write_queue_size: a backlog not there at
 * the last sweep started after it), so a peer that takes nothing is caught as stalled; the
 * callback then makes the library close it (a shutdown(2) of the socket fails the pending
 * write). */
#ifndef MSM_LISTEN_H
#define MSM_LISTEN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "msm_err.h"

/* Initialises t on loop (t->data = data) and makes it listen on host:port (an IPv4 or IPv6
 * address) with cb; `what` names the listener in errors and in the log line ("tcp", "metrics
 * http"). *opened turns true once t is a libuv handle, which the caller must then close, even when
 * a later step (bind, listen) fails. */
int msm_listen_tcp(uv_loop_t *loop, uv_tcp_t *t, void *data, const char *host, int port, const char *what,
                   uv_connection_cb cb, bool *opened, msm_err *err);

/* 1 when host is a loopback address (127.0.0.0/8, ::1, an IPv4-mapped 127.x address), 0 for
 * another IPv4 or IPv6 address, -EINVAL when it is not an address. */
int msm_listen_loopback(const char *host);

typedef struct msm_conn_guard msm_conn_guard;

/* Why the set closes a connection. */
typedef enum msm_conn_timeout {
    MSM_CONN_IDLE = 0,        /* nothing in flight, nothing received or written */
    MSM_CONN_STALLED,         /* replies queued, none taken by the peer */
    MSM_CONN_TIMEOUT_COUNT_,
} msm_conn_timeout;

/* Called on the loop thread; must close the connection (uv_close, or make its library close it). */
typedef void (*msm_conn_timeout_fn)(msm_conn_guard *g, msm_conn_timeout why);

struct msm_conn_guard {
    struct msm_conn_set *set;   /* NULL: not added */
    uv_stream_t *stream;
    msm_conn_timeout_fn on_timeout;
    void *owner;                /* the connection (the callback's to use) */
    uint64_t last_ms;           /* last byte received or written */
    uint64_t write_since_ms;    /* start of the current write backlog, or its last progress */
    size_t last_queued;         /* the backlog at the last sweep */
    bool busy;
    bool timed_out;             /* the callback ran (it is not called twice) */
    struct msm_conn_guard *prev, *next;
};

typedef struct msm_conn_set {
    uv_loop_t *loop;
    uv_timer_t sweep;
    uint64_t last_sweep_ms;
    bool have_sweep, shutting_down;
    int n, max;
    uint64_t idle_ms, write_ms;   /* 0: never */
    msm_conn_guard *head;
    uint64_t refused;             /* connections over max */
    uint64_t timed_out[MSM_CONN_TIMEOUT_COUNT_];
} msm_conn_set;

/* idle_timeout_s, write_timeout_s: 0 turns that timeout off. */
int msm_conn_set_init(msm_conn_set *cs, uv_loop_t *loop, int max_connections, int idle_timeout_s,
                      int write_timeout_s, msm_err *err);
/* Shutdown: every connection left gets at most flush_ms to take its last replies (idle ones are
 * closed by their owners), and the timer closes once the set is empty. Call after the owners have
 * started closing their connections (flushing). */
void msm_conn_set_shutdown(msm_conn_set *cs, int flush_ms);

/* Adds g (the connection behind stream, accepted). 0, or -EMFILE when that makes more than
 * max_connections, not counting connections whose handle is closing (g is added all the same:
 * remove it in the close callback). */
int msm_conn_guard_add(msm_conn_set *cs, msm_conn_guard *g, uv_stream_t *stream, msm_conn_timeout_fn fn,
                       void *owner);
/* Right before uv_close of the connection (and again in its close callback: harmless). Accepts a
 * guard never added or removed already. */
void msm_conn_guard_remove(msm_conn_guard *g);
void msm_conn_guard_read(msm_conn_guard *g);
void msm_conn_guard_write_start(msm_conn_guard *g);
void msm_conn_guard_wrote(msm_conn_guard *g);
void msm_conn_guard_set_busy(msm_conn_guard *g, bool busy);

#endif
