/* http_bench: the HTTP API's overhead against the socket API, at N concurrent streams.
 *
 *   http_bench --socket PATH --http HOST:PORT [--streams 64] [--max-tokens 256] [--rounds 3]
 *
 * Each round starts N generations of the same greedy, ignore_eos request at once, first over the
 * socket API (one connection, N request ids in flight, msm_client.h), then over HTTP (N
 * connections, POST /v1/completions with stream: true, one server-sent event per token), and
 * reports per API: tokens/s over the round (all tokens / wall time from the first send to the last
 * token) and the time to first token (median and p90 over the streams). Everything runs on one
 * thread with poll(2); the daemon must be started with [http] on. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "msm_client.h"

#define MAX_STREAMS 1024

typedef struct stream {
    double t_first, t_done;
    int tokens;
    int fd;
    char buf[8192];
    size_t len;
    bool done;
} stream;

typedef struct result {
    double tok_s, ttft_med, ttft_p90, wall;
    long tokens;
} result;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static result summarize(stream *s, int n, double t0) {
    double ttft[MAX_STREAMS], last = t0;
    long tokens = 0;
    for (int i = 0; i < n; i++) {
        ttft[i] = s[i].t_first - t0;
        tokens += s[i].tokens;
        if (s[i].t_done > last)
            last = s[i].t_done;
    }
    qsort(ttft, (size_t)n, sizeof ttft[0], cmp_double);
    return (result){.tok_s = (double)tokens / (last - t0), .ttft_med = ttft[n / 2],
                    .ttft_p90 = ttft[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1], .wall = last - t0, .tokens = tokens};
}

static int run_socket(const char *path, int n, int max_tokens, result *ret) {
    msm_client *c = NULL;
    msm_err err = {{0}};
    char addr[300];
    snprintf(addr, sizeof addr, "unix:%s", path);
    if (msm_client_connect(addr, &c, &err) < 0) {
        fprintf(stderr, "http_bench: %s\n", err.msg);
        return -1;
    }
    stream *s = calloc((size_t)n, sizeof *s);
    msm_client_gen g;
    msm_client_gen_init(&g);
    g.prompt_text = "Once upon a time";
    g.max_tokens = max_tokens;
    g.temperature = 0;
    g.set_temperature = true;
    g.ignore_eos = true;
    double t0 = now();
    for (int i = 0; i < n; i++)
        if (msm_client_send_generate(c, (uint64_t)i + 1, &g, &err) < 0) {
            fprintf(stderr, "http_bench: %s\n", err.msg);
            return -1;
        }
    for (int left = n; left > 0;) {
        Msmoe__V1__ServerFrame *f = NULL;
        if (msm_client_recv(c, &f, &err) < 0) {
            fprintf(stderr, "http_bench: %s\n", err.msg);
            return -1;
        }
        int i = (int)f->request_id - 1;
        if (f->reply_case == MSMOE__V1__SERVER_FRAME__REPLY_CHUNK && i >= 0 && i < n) {
            double t = now();
            if (f->chunk->n_token_ids && !s[i].tokens)
                s[i].t_first = t;
            s[i].tokens += (int)f->chunk->n_token_ids;
            if (f->chunk->has_finish_reason) {
                s[i].t_done = t;
                left--;
            }
        } else {
            fprintf(stderr, "http_bench: unexpected reply to request %d\n", i + 1);
            return -1;
        }
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
    *ret = summarize(s, n, t0);
    free(s);
    msm_client_free(c);
    return 0;
}

static int connect_tcp(const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Counts the SSE events in the new bytes of s: one "data: {" per token, "data: [DONE]" at the end. */
static void scan(stream *s, double t) {
    char *p = s->buf;
    for (;;) {
        char *e = memmem(p, s->len - (size_t)(p - s->buf), "\n\n", 2);
        if (!e)
            break;
        char *d = memmem(p, (size_t)(e - p), "data: ", 6);
        if (d && d[6] == '{') {
            if (!s->tokens)
                s->t_first = t;
            s->tokens++;
        } else if (d && !strncmp(d + 6, "[DONE]", 6)) {
            s->done = true;
            s->t_done = t;
        }
        p = e + 2;
    }
    size_t used = (size_t)(p - s->buf);
    memmove(s->buf, p, s->len - used);
    s->len -= used;
}

static int run_http(const char *host, int port, int n, int max_tokens, result *ret) {
    stream *s = calloc((size_t)n, sizeof *s);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    char body[256], req[1024];
    int blen = snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": %d, \"temperature\": 0, "
                        "\"ignore_eos\": true, \"stream\": true}", max_tokens);
    int rlen = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n%s", host, blen, body);
    for (int i = 0; i < n; i++)
        if ((s[i].fd = connect_tcp(host, port)) < 0) {
            fprintf(stderr, "http_bench: cannot connect to %s:%d\n", host, port);
            return -1;
        }
    double t0 = now();
    for (int i = 0; i < n; i++)
        if (write(s[i].fd, req, (size_t)rlen) != rlen)
            return -1;
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; i++)
            pf[i] = (struct pollfd){.fd = s[i].done ? -1 : s[i].fd, .events = POLLIN};
        if (poll(pf, (nfds_t)n, 60000) <= 0)
            return -1;
        double t = now();
        for (int i = 0; i < n; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t k = read(s[i].fd, s[i].buf + s[i].len, sizeof s[i].buf - s[i].len);
            if (k <= 0) {
                fprintf(stderr, "http_bench: stream %d closed early\n", i);
                return -1;
            }
            s[i].len += (size_t)k;
            scan(&s[i], t);
            if (s[i].done)
                left--;
        }
    }
    for (int i = 0; i < n; i++)
        close(s[i].fd);
    *ret = summarize(s, n, t0);
    free(s);
    free(pf);
    return 0;
}

int main(int argc, char **argv) {
    const char *sock = NULL, *http = NULL;
    int n = 64, max_tokens = 256, rounds = 3;
    static const struct option opts[] = {{"socket", 1, 0, 's'}, {"http", 1, 0, 'h'}, {"streams", 1, 0, 'n'},
                                          {"max-tokens", 1, 0, 'm'}, {"rounds", 1, 0, 'r'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (o) {
        case 's': sock = optarg; break;
        case 'h': http = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 'm': max_tokens = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        default: return 2;
        }
    }
    char host[64];
    int port = 0;
    if (!sock || !http || sscanf(http, "%63[^:]:%d", host, &port) != 2 || n < 1 || n > MAX_STREAMS) {
        fprintf(stderr, "usage: http_bench --socket PATH --http HOST:PORT [--streams N] [--max-tokens N] "
                        "[--rounds N]\n");
        return 2;
    }
    printf("%d concurrent streams, %d tokens each (greedy, ignore_eos), prompt \"Once upon a time\"\n", n, max_tokens);
    printf("%-7s %5s %10s %10s %12s %12s\n", "api", "round", "tokens/s", "wall s", "TTFT med ms", "TTFT p90 ms");
    for (int r = 0; r < rounds; r++) {
        result a, b;
        if (run_socket(sock, n, max_tokens, &a) < 0 || run_http(host, port, n, max_tokens, &b) < 0)
            return 1;
        printf("%-7s %5d %10.0f %10.3f %12.2f %12.2f\n", "socket", r, a.tok_s, a.wall, a.ttft_med * 1e3,
               a.ttft_p90 * 1e3);
        printf("%-7s %5d %10.0f %10.3f %12.2f %12.2f\n", "http", r, b.tok_s, b.wall, b.ttft_med * 1e3,
               b.ttft_p90 * 1e3);
        fflush(stdout);
    }
    return 0;
}
