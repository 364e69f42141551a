/* Helpers of the daemon integration tests (see daemon_helpers.h). */
#include "daemon_helpers.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <unistr.h>

#include "msm_frame.h"

const char *env_or(const char *k, const char *d) {
    const char *v = getenv(k);
    return v && *v ? v : d;
}

bool have_model(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", env_or("MSMOE_MODEL", "models/stories260k-moe"));
    return access(p, R_OK) == 0;
}

msm_client *connect_to(const daemon_proc *d) {
    msm_client *c = NULL;
    msm_err err;
    cr_assert_eq(msm_client_connect(d->sock, &c, &err), 0, "%s", err.msg);
    msm_client_set_timeout_ms(c, 20000);
    return c;
}

/* Starts msmoed with extra "--set" assignments (NULL-terminated) and the given extra environment
 * (NAME=VALUE or NULL); waits until it answers health. */
void start_daemon(daemon_proc *d, const char **sets, const char *env1, const char *env2, bool wait_ready) {
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
        if (env1 && !strncmp(env1, "NOFILE=", 7)) {
            struct rlimit rl = {(rlim_t)atoi(env1 + 7), (rlim_t)atoi(env1 + 7)};
            setrlimit(RLIMIT_NOFILE, &rl);
        } else if (env1) {
            putenv((char *)env1);
        }
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

int stop_daemon(daemon_proc *d) {
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

int wait_exit(daemon_proc *d, int timeout_ms) {
    int st = 0;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        pid_t r = waitpid(d->pid, &st, WNOHANG);
        if (r == d->pid) {
            d->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    }
    return -1;
}

int run_msmoed(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", env_or("MSMOED", "build/daemon/msmoed"), args);
    return sh(cmd, out, cap);
}

double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

Msmoe__V1__ServerFrame *recv_frame(msm_client *c) {
    Msmoe__V1__ServerFrame *f = NULL;
    msm_err err;
    int rc = msm_client_recv(c, &f, &err);
    cr_assert_eq(rc, 0, "recv: %s", err.msg);
    return f;
}

bool stream_add(stream *s, const Msmoe__V1__ServerFrame *f) {
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
        if (f->chunk->error && f->chunk->error->message)
            snprintf(s->msg, sizeof s->msg, "%s: %s", msm_client_code_name(f->chunk->error->code),
                     f->chunk->error->message);
        s->completion_tokens = f->chunk->usage ? (int)f->chunk->usage->completion_tokens : -1;
        return true;
    }
    return false;
}

Msmoe__V1__ServerFrame *recv_reply(msm_client *c, uint64_t rid) {
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->request_id, rid);
    return f;
}

void make_prompt(int p, int a, int b, int32_t *ids, int n, char *ids_arg, size_t cap) {
    ids_arg[0] = 0;
    for (int i = 0; i < n; i++) {
        ids[i] = (int32_t)(1 + (p * a + i * b) % 500);
        snprintf(ids_arg + strlen(ids_arg), cap - strlen(ids_arg), "%s%d", i ? "," : "", ids[i]);
    }
}

void stream_read(msm_client *c, stream *s) {
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        bool done = stream_add(s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            return;
    }
}

void streams_read(msm_client *c, uint64_t rid0, stream *s, int n) {
    memset(s, 0, (size_t)n * sizeof *s);
    for (int done = 0; done < n;) {
        Msmoe__V1__ServerFrame *f = recv_frame(c);
        int i = (int)(f->request_id - rid0);
        cr_assert(i >= 0 && i < n, "a frame for request %llu", (unsigned long long)f->request_id);
        done += stream_add(&s[i], f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
    }
}

void stream_start(msm_client *c, uint64_t rid, const msm_client_gen *g, stream *s) {
    msm_err err;
    memset(s, 0, sizeof *s);
    cr_assert_eq(msm_client_send_generate(c, rid, g, &err), 0, "%s", err.msg);
    Msmoe__V1__ServerFrame *f = recv_reply(c, rid);
    stream_add(s, f);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
}

void generate(msm_client *c, uint64_t rid, const msm_client_gen *g, stream *s) {
    msm_err err;
    memset(s, 0, sizeof *s);
    cr_assert_eq(msm_client_send_generate(c, rid, g, &err), 0, "%s", err.msg);
    for (;;) {
        Msmoe__V1__ServerFrame *f = recv_reply(c, rid);
        bool done = stream_add(s, f);
        msmoe__v1__server_frame__free_unpacked(f, NULL);
        if (done)
            return;
    }
}

int run_msmoe_run(const char *args, int32_t *out, int cap) {
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

double metric(msm_client *c, const char *name, const char *labels) {
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

void need_model(void) {
    if (!have_model())
        cr_skip_test("the embedded model is not present");
}
void expect_code(msm_client *c, uint64_t rid, int code, const char *what) {
    Msmoe__V1__ServerFrame *f = recv_frame(c);
    cr_assert_eq(f->reply_case, MSMOE__V1__SERVER_FRAME__REPLY_ERROR, "%s: not an error reply", what);
    cr_assert_eq(f->request_id, rid, "%s", what);
    cr_assert_eq((int)f->error->code, code, "%s: got %s (%s)", what, msm_client_code_name(f->error->code),
                 f->error->message);
    fprintf(stderr, "bad input %-34s -> %s: %s\n", what, msm_client_code_name(f->error->code), f->error->message);
    msmoe__v1__server_frame__free_unpacked(f, NULL);
}

void still_serving(const daemon_proc *d) {
    msm_client *c = connect_to(d);
    static const int32_t prompt[] = {5, 6, 7};
    msm_client_gen g;
    ids_gen_init(&g, prompt, 3, 4);
    stream s;
    generate(c, 1, &g, &s);
    cr_assert_gt(s.finish, 0, "a good request after bad input failed: %s", s.msg);
    msm_client_free(c);
}

/* A token-id Generate request: prompt p[0..n), max_tokens, everything else the defaults. */
void ids_gen_init(msm_client_gen *g, const int32_t *p, int n, int max_tokens) {
    msm_client_gen_init(g);
    g->prompt = p;
    g->n_prompt = n;
    g->max_tokens = max_tokens;
}

void start_slow_fake(daemon_proc *d, const char **extra) {
    const char *sets[16] = {"engine.backend=fake"};
    int n = 1;
    for (int i = 0; extra && extra[i]; i++)
        sets[n++] = extra[i];
    sets[n] = NULL;
    start_daemon(d, sets, "MSMOED_FAKE_STEP_US=5000", NULL, true);
}

double metric_settles(msm_client *c, const char *name, const char *labels, double want) {
    double v = metric(c, name, labels);
    for (int i = 0; i < 200 && v != want; i++) {
        usleep(5000);
        v = metric(c, name, labels);
    }
    return v;
}

void notify_open(notify_sock *n) {
    snprintf(n->dir, sizeof n->dir, "/tmp/msmoed-notify.XXXXXX");
    cr_assert_not_null(mkdtemp(n->dir));
    n->sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    snprintf(n->sa.sun_path, sizeof n->sa.sun_path, "%s/notify", n->dir);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(n->fd, (struct sockaddr *)&n->sa, sizeof n->sa), 0);
    snprintf(n->env, sizeof n->env, "NOTIFY_SOCKET=%s", n->sa.sun_path);
}

/* One message into buf (NUL-terminated), waiting up to 20 ms; false when none came. */
bool notify_recv(notify_sock *n, char *buf, size_t cap) {
    struct pollfd p = {.fd = n->fd, .events = POLLIN};
    if (poll(&p, 1, 20) <= 0)
        return false;
    ssize_t r = recv(n->fd, buf, cap - 1, 0);
    if (r <= 0)
        return false;
    buf[r] = 0;
    return true;
}

void notify_close(notify_sock *n) {
    close(n->fd);
    unlink(n->sa.sun_path);
    rmdir(n->dir);
}

int sh(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, cap - 1, p) : 0;
    out[n] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
