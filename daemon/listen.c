/* msm_listen: binding a TCP listener (see msm_listen.h). */
#include "msm_listen.h"

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
