/* msm_client: see msm_client.h. */
#include "msm_client.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "msm_code.h"
#include "msm_frame.h"
#include "msm_sched.h"

struct msm_client {
    int fd;
    int timeout_ms;
    uint32_t max_frame;
};

int msm_client_connect(const char *address, msm_client **ret, msm_err *err) {
    int fd = -1;
    if (strncmp(address, "tcp:", 4) == 0) {
        char host[256];
        const char *hp = address + 4, *colon = strrchr(hp, ':');
        if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof host)
            return msm_err_set(err, -EINVAL, "%s: expected tcp:HOST:PORT", address);
        memcpy(host, hp, (size_t)(colon - hp));
        host[colon - hp] = 0;
        if (host[0] == '[' && host[strlen(host) - 1] == ']') {
            memmove(host, host + 1, strlen(host));
            host[strlen(host) - 1] = 0;
        }
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int rc = getaddrinfo(host, colon + 1, &hints, &res);
        if (rc)
            return msm_err_set(err, -EINVAL, "%s: %s", address, gai_strerror(rc));
        int e = ECONNREFUSED;
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0)
                continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
                break;
            e = errno;
            close(fd);
            fd = -1;
        }
        freeaddrinfo(res);
        if (fd < 0)
            return msm_err_set(err, -e, "cannot connect to %s: %s", address, strerror(e));
    } else {
        const char *path = strncmp(address, "unix:", 5) == 0 ? address + 5 : address;
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof sa.sun_path)
            return msm_err_set(err, -ENAMETOOLONG, "socket path too long: %s", path);
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return msm_err_set(err, -errno, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            int e = errno;
            close(fd);
            return msm_err_set(err, -e, "cannot connect to %s: %s", path, strerror(e));
        }
    }
    msm_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    c->fd = fd;
    c->max_frame = 64u << 20;
    *ret = c;
    return 0;
}

void msm_client_free(msm_client *c) {
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

int msm_client_fd(const msm_client *c) {
    return c->fd;
}

void msm_client_set_timeout_ms(msm_client *c, int ms) {
    c->timeout_ms = ms;
}

int msm_client_send_raw(msm_client *c, const void *buf, size_t len, msm_err *err) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = send(c->fd, p, len, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return msm_err_set(err, -errno, "send: %s", strerror(errno));
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

int msm_client_send(msm_client *c, const Msmoe__V1__ClientFrame *f, msm_err *err) {
    size_t n = msmoe__v1__client_frame__get_packed_size(f);
    uint8_t *buf = malloc(MSM_FRAME_HEADER + n);
    if (!buf)
        return msm_err_set(err, -ENOMEM, "out of memory");
    msm_frame_put_header(buf, (uint32_t)n);
    msmoe__v1__client_frame__pack(f, buf + MSM_FRAME_HEADER);
    int rc = msm_client_send_raw(c, buf, MSM_FRAME_HEADER + n, err);
    free(buf);
    return rc;
}

static int read_full(msm_client *c, uint8_t *p, size_t n, msm_err *err) {
    while (n > 0) {
        if (c->timeout_ms > 0) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            int rc = poll(&pfd, 1, c->timeout_ms);
            if (rc == 0)
                return msm_err_set(err, -ETIMEDOUT, "no reply from the daemon within %d ms", c->timeout_ms);
            if (rc < 0 && errno != EINTR)
                return msm_err_set(err, -errno, "poll: %s", strerror(errno));
            if (rc < 0)
                continue;
        }
        ssize_t k = recv(c->fd, p, n, 0);
        if (k == 0)
            return msm_err_set(err, -ECONNRESET, "the daemon closed the connection");
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return msm_err_set(err, -errno, "recv: %s", strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int msm_client_recv(msm_client *c, Msmoe__V1__ServerFrame **ret, msm_err *err) {
    uint8_t hdr[MSM_FRAME_HEADER];
    int rc = read_full(c, hdr, sizeof hdr, err);
    if (rc < 0)
        return rc;
    uint32_t n = msm_frame_get_header(hdr);
    if (n > c->max_frame)
        return msm_err_set(err, -EMSGSIZE, "reply frame of %u bytes exceeds %u", n, c->max_frame);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return msm_err_set(err, -ENOMEM, "out of memory");
    if ((rc = read_full(c, buf, n, err)) < 0) {
        free(buf);
        return rc;
    }
    Msmoe__V1__ServerFrame *f = msmoe__v1__server_frame__unpack(NULL, n, buf);
    free(buf);
    if (!f)
        return msm_err_set(err, -EBADMSG, "malformed reply frame (%u bytes)", n);
    *ret = f;
    return 0;
}

void msm_client_gen_init(msm_client_gen *g) {
    memset(g, 0, sizeof *g);
    g->max_tokens = -1;
    g->temperature = -1;
    g->top_k = -1;
    g->top_p = -1;
    g->seed = -1;
}

int msm_client_send_generate(msm_client *c, uint64_t request_id, const msm_client_gen *g, msm_err *err) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__GenerateRequest r = MSMOE__V1__GENERATE_REQUEST__INIT;
    Msmoe__V1__SamplingParams sp = MSMOE__V1__SAMPLING_PARAMS__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_GENERATE;
    f.generate = &r;
    r.n_prompt_ids = (size_t)g->n_prompt;
    r.prompt_ids = (int32_t *)g->prompt;
    r.prompt_text = (char *)g->prompt_text;
    if (g->max_tokens >= 0) {
        r.has_max_tokens = 1;
        r.max_tokens = (uint32_t)g->max_tokens;
    }
    if (g->logprobs > 0) {
        r.has_logprobs = 1;
        r.logprobs = (uint32_t)g->logprobs;
    }
    if (g->ignore_eos) {
        r.has_ignore_eos = 1;
        r.ignore_eos = 1;
    }
    r.n_stop_token_ids = (size_t)g->n_stop_ids;
    r.stop_token_ids = (int32_t *)g->stop_ids;
    r.n_stop_strings = (size_t)g->n_stop_strings;
    r.stop_strings = (char **)g->stop_strings;
    if (g->no_add_special) {
        r.has_add_special = 1;
        r.add_special = 0;
    }
    if (g->parse_special) {
        r.has_parse_special = 1;
        r.parse_special = 1;
    }
    bool any = false;
    if (g->set_temperature || g->temperature >= 0 || isnan(g->temperature)) {
        sp.has_temperature = 1;
        sp.temperature = g->temperature;
        any = true;
    }
    if (g->top_k >= 0) {
        sp.has_top_k = 1;
        sp.top_k = g->top_k;
        any = true;
    }
    if (g->set_top_p || g->top_p > 0) {
        sp.has_top_p = 1;
        sp.top_p = g->top_p;
        any = true;
    }
    if (g->seed >= 0) {
        sp.has_seed = 1;
        sp.seed = (uint64_t)g->seed;
        any = true;
    }
    if (any)
        r.sampling = &sp;
    return msm_client_send(c, &f, err);
}

int msm_client_send_tokenize(msm_client *c, uint64_t request_id, const char *text, bool add_special,
                             bool parse_special, msm_err *err) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__TokenizeRequest t = MSMOE__V1__TOKENIZE_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_TOKENIZE;
    f.tokenize = &t;
    t.text = (char *)text;
    t.has_add_special = 1;
    t.add_special = add_special;
    t.has_parse_special = 1;
    t.parse_special = parse_special;
    return msm_client_send(c, &f, err);
}

int msm_client_send_detokenize(msm_client *c, uint64_t request_id, const int32_t *ids, size_t n,
                               bool skip_special, msm_err *err) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__DetokenizeRequest d = MSMOE__V1__DETOKENIZE_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.call_case = MSMOE__V1__CLIENT_FRAME__CALL_DETOKENIZE;
    f.detokenize = &d;
    d.n_ids = n;
    d.ids = (int32_t *)ids;
    d.has_skip_special = 1;
    d.skip_special = skip_special;
    return msm_client_send(c, &f, err);
}

int msm_client_send_simple(msm_client *c, uint64_t request_id, Msmoe__V1__ClientFrame__CallCase call, msm_err *err) {
    Msmoe__V1__ClientFrame f = MSMOE__V1__CLIENT_FRAME__INIT;
    Msmoe__V1__CancelRequest cr = MSMOE__V1__CANCEL_REQUEST__INIT;
    Msmoe__V1__HealthRequest hr = MSMOE__V1__HEALTH_REQUEST__INIT;
    Msmoe__V1__ModelInfoRequest mr = MSMOE__V1__MODEL_INFO_REQUEST__INIT;
    Msmoe__V1__MetricsRequest xr = MSMOE__V1__METRICS_REQUEST__INIT;
    f.has_request_id = 1;
    f.request_id = request_id;
    f.call_case = call;
    switch (call) {
    case MSMOE__V1__CLIENT_FRAME__CALL_CANCEL: f.cancel = &cr; break;
    case MSMOE__V1__CLIENT_FRAME__CALL_HEALTH: f.health = &hr; break;
    case MSMOE__V1__CLIENT_FRAME__CALL_MODEL_INFO: f.model_info = &mr; break;
    case MSMOE__V1__CLIENT_FRAME__CALL_METRICS: f.metrics = &xr; break;
    default: return msm_err_set(err, -EINVAL, "not a simple call: %d", (int)call);
    }
    return msm_client_send(c, &f, err);
}

const char *msm_client_code_name(int code) {
    return msm_code_name((msm_code)code);
}

const char *msm_client_finish_name(int reason) {
    return msm_finish_name((msm_finish)reason);
}
