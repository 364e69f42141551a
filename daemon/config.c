/* msm_config: the key table, the INI reader (libinih) and --set overrides (see msm_config.h). */
#include "msm_config.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "msm_listen.h"

#ifndef MSM_SOURCE_ROOT
#define MSM_SOURCE_ROOT ""
#endif
#ifndef MSM_BUILD_ROOT
#define MSM_BUILD_ROOT ""
#endif
#ifndef MSM_DATADIR
#define MSM_DATADIR "/usr/local/share"
#endif
#define MSM_EMBEDDED_MODEL "stories260k-moe"

typedef enum key_type { K_STR, K_INT, K_BOOL, K_MODE, K_BUCKETS, K_BACKEND, K_LEVEL, K_GPUS } key_type;

typedef struct key_def {
    const char *section, *name;
    key_type type;
    size_t off, size;
    long min, max;
} key_def;

#define STR(sec, k, field) {sec, k, K_STR, offsetof(msm_config, field), sizeof(((msm_config *)0)->field), 0, 0}
#define INT(sec, k, field, lo, hi) {sec, k, K_INT, offsetof(msm_config, field), sizeof(int), lo, hi}
#define BOOL(sec, k, field) {sec, k, K_BOOL, offsetof(msm_config, field), sizeof(bool), 0, 1}

static const key_def keys[] = {
    STR("server", "socket", socket),
    {"server", "socket_mode", K_MODE, offsetof(msm_config, socket_mode), sizeof(int), 0, 0777},
    INT("server", "tcp", tcp_port, 0, 65535),
    STR("server", "tcp_host", tcp_host),
    BOOL("server", "tcp_allow_remote", tcp_allow_remote),
    INT("server", "max_frame_bytes", max_frame_bytes, 64, 1 << 30),
    INT("server", "max_connections", max_connections, 1, 1000000),
    INT("server", "max_requests_per_connection", max_requests_per_connection, 1, 1000000),
    INT("server", "max_queued_bytes", max_queued_bytes, 4096, 1 << 30),
    INT("server", "idle_timeout_s", idle_timeout_s, 0, 86400),
    INT("server", "write_timeout_s", write_timeout_s, 0, 86400),
    INT("server", "metrics_port", metrics_port, 0, 65535),
    STR("server", "metrics_host", metrics_host),
    STR("engine", "model", model),
    STR("engine", "dummy_preset", dummy_preset),
    STR("engine", "tokenizer", tokenizer),
    {"engine", "backend", K_BACKEND, offsetof(msm_config, backend), sizeof(((msm_config *)0)->backend), 0, 0},
    INT("engine", "tp", tp, 1, 64),
    {"engine", "gpus", K_GPUS, offsetof(msm_config, gpus), 0, 0, 1023},
    INT("engine", "replicas", replicas, 1, MSM_MAX_GROUPS),
    BOOL("engine", "multi_stream", multi_stream),
    INT("engine", "multi_stream_max_tokens", multi_stream_max_tokens, 0, 1 << 20),
    BOOL("engine", "fuse_allreduce", fuse_allreduce),
    INT("engine", "kv_blocks", kv_blocks, 2, 1 << 24),
    INT("engine", "max_step_tokens", max_step_tokens, 1, 1 << 20),
    INT("engine", "max_seqs", max_seqs, 1, 4096),
    INT("engine", "max_context", max_context, 0, 1 << 24),
    BOOL("engine", "cuda_graphs", cuda_graphs),
    {"engine", "buckets", K_BUCKETS, offsetof(msm_config, buckets), 0, 1, 4096},
    INT("engine", "deadline_ms", deadline_ms, 100, 3600000),
    INT("scheduler", "max_queue", max_queue, 1, 1000000),
    INT("scheduler", "max_tokens_default", max_tokens_default, 1, 1 << 24),
    INT("scheduler", "max_tokens_limit", max_tokens_limit, 1, 1 << 24),
    INT("scheduler", "max_logprobs", max_logprobs, 0, 20),
    INT("scheduler", "max_stop", max_stop, 0, 1024),
    INT("scheduler", "drain_timeout_s", drain_timeout_s, 0, 86400),
    {"log", "level", K_LEVEL, offsetof(msm_config, log_level), sizeof(msm_log_level), 0, 0},
    STR("log", "file", log_file),
    BOOL("http", "enabled", http_enabled),
    STR("http", "host", http_host),
    INT("http", "port", http_port, 1, 65535),
    INT("http", "max_body_bytes", http_max_body_bytes, 1024, 1 << 30),
    INT("http", "max_header_bytes", http_max_header_bytes, 1024, 256 * 1024),
    INT("http", "read_timeout_ms", http_read_timeout_ms, 100, 3600000),
    INT("http", "max_connections", http_max_connections, 1, 1000000),
    STR("http", "api_key_file", http_api_key_file),
    STR("http", "model_name", http_model_name),
};

void msm_config_defaults(msm_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->socket, sizeof c->socket, "/run/msmoed/msmoed.sock");
    c->socket_mode = 0660;
    snprintf(c->tcp_host, sizeof c->tcp_host, "127.0.0.1");
    c->max_frame_bytes = 4 << 20;
    c->max_connections = 1024;
    c->max_requests_per_connection = 256;
    c->max_queued_bytes = 16 << 20;
    c->idle_timeout_s = 300;
    c->write_timeout_s = 30;
    snprintf(c->metrics_host, sizeof c->metrics_host, "127.0.0.1");
    snprintf(c->backend, sizeof c->backend, "auto");
    c->tp = 1;
    c->replicas = 1;
    c->multi_stream = true;
    c->multi_stream_max_tokens = MSM_MULTI_STREAM_MAX_TOKENS;
    c->fuse_allreduce = true;
    c->kv_blocks = 1024;
    c->max_step_tokens = 512;
    c->max_seqs = 64;
    c->cuda_graphs = true;
    c->deadline_ms = 30000;
    c->max_queue = 1024;
    c->max_tokens_default = 256;
    c->max_tokens_limit = 32768;
    c->max_logprobs = 20;
    c->max_stop = 16;
    c->drain_timeout_s = 30;
    c->log_level = MSM_LOG_INFO;
    snprintf(c->http_host, sizeof c->http_host, "127.0.0.1");
    c->http_port = 8000;
    c->http_max_body_bytes = 8 << 20;
    c->http_max_header_bytes = 16 << 10;
    c->http_read_timeout_ms = 10000;
    c->http_max_connections = 256;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

static int parse_long(const char *v, int base, long *ret) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, base);
    if (errno || end == v || *trim(end))
        return -EINVAL;
    *ret = x;
    return 0;
}

void msm_config_format_gpus(const int *ids, int n, char *buf, size_t cap) {
    size_t len = 0;
    if (cap)
        buf[0] = 0;
    for (int i = 0; i < n && len < cap;) {
        int j = i;
        while (j + 1 < n && ids[j + 1] == ids[j] + 1)
            j++;
        int k = j > i ? snprintf(buf + len, cap - len, "%s%d-%d", i ? "," : "", ids[i], ids[j])
                      : snprintf(buf + len, cap - len, "%s%d", i ? "," : "", ids[i]);
        if (k < 0)
            break;
        len += (size_t)k;
        i = j + 1;
    }
}

/* engine.gpus: a comma-separated list of GPU ids and ranges ("0-7", "0-3,8-11", "4,5"), kept in the
 * order written (consecutive runs of tp form the groups). Empty = every visible GPU. */
static int set_gpus(msm_config *c, const char *where, char *v, msm_err *err) {
    int ids[MSM_MAX_GPUS], n = 0;
    if (!*v) {
        c->n_gpus = 0;
        c->gpus_where[0] = 0;
        return 0;
    }
    for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        char *dash = strchr(tok, '-');
        long lo, hi;
        if (dash)
            *dash = 0;
        if (parse_long(tok, 10, &lo) < 0 || (dash && parse_long(dash + 1, 10, &hi) < 0)) {
            if (dash)
                *dash = '-';
            return msm_err_set(err, -EINVAL, "%s: engine.gpus: '%s' is not a GPU id or a range like 0-7", where, tok);
        }
        if (!dash)
            hi = lo;
        if (lo < 0 || hi > 1023 || lo > hi)
            return msm_err_set(err, -EINVAL, "%s: engine.gpus: '%ld-%ld' is not an ascending range of ids in [0, 1023]",
                               where, lo, hi);
        for (long g = lo; g <= hi; g++) {
            for (int i = 0; i < n; i++)
                if (ids[i] == g)
                    return msm_err_set(err, -EINVAL, "%s: engine.gpus lists GPU %ld twice", where, g);
            if (n == MSM_MAX_GPUS)
                return msm_err_set(err, -EINVAL, "%s: engine.gpus lists more than %d GPUs", where, MSM_MAX_GPUS);
            ids[n++] = (int)g;
        }
    }
    if (n == 0)
        return msm_err_set(err, -EINVAL, "%s: engine.gpus lists no GPU (leave it empty for every visible GPU)",
                           where);
    memcpy(c->gpus, ids, (size_t)n * sizeof ids[0]);
    c->n_gpus = n;
    snprintf(c->gpus_where, sizeof c->gpus_where, "%s", where);
    return 0;
}

/* Sets one key. `where` is "file:line" or "--set"; errors are "where: message". */
static int set_key(msm_config *c, const char *where, const char *section, const char *name,
                   const char *value, msm_err *err) {
    const key_def *k = NULL;
    bool section_known = false;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strcmp(keys[i].section, section) == 0) {
            section_known = true;
            if (strcmp(keys[i].name, name) == 0)
                k = &keys[i];
        }
    }
    if (!section_known)
        return msm_err_set(err, -EINVAL, "%s: unknown section [%s] (known: server, engine, scheduler, log, http)",
                           where, section);
    if (!k && !strcmp(section, "engine") && !strcmp(name, "first_device"))
        return msm_err_set(err, -EINVAL, "%s: engine.first_device was replaced by engine.gpus (e.g. first_device = 2 "
                           "with tp = 2 is now gpus = 2-3)", where);
    if (!k)
        return msm_err_set(err, -EINVAL, "%s: unknown key '%s' in section [%s]", where, name, section);
    char *p = (char *)c + k->off;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", value);
    char *v = trim(buf);
    long x;
    switch (k->type) {
    case K_STR:
        if (strlen(v) >= k->size)
            return msm_err_set(err, -EINVAL, "%s: %s.%s is longer than %zu bytes", where, section, name,
                               k->size - 1);
        memcpy(p, v, strlen(v) + 1);
        return 0;
    case K_INT:
        if (parse_long(v, 10, &x) < 0)
            return msm_err_set(err, -EINVAL, "%s: %s.%s = '%s' is not an integer", where, section, name, v);
        if (x < k->min || x > k->max)
            return msm_err_set(err, -EINVAL, "%s: %s.%s = %ld is out of range [%ld, %ld]", where, section,
                               name, x, k->min, k->max);
        *(int *)p = (int)x;
        return 0;
    case K_MODE:
        if (parse_long(v, 8, &x) < 0 || x < 0 || x > 0777)
            return msm_err_set(err, -EINVAL, "%s: %s.%s = '%s' is not an octal mode in 0000..0777", where,
                               section, name, v);
        *(int *)p = (int)x;
        return 0;
    case K_BOOL:
        if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on") || !strcmp(v, "1"))
            *(bool *)p = true;
        else if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off") || !strcmp(v, "0"))
            *(bool *)p = false;
        else
            return msm_err_set(err, -EINVAL, "%s: %s.%s = '%s' is not a boolean (true/false)", where,
                               section, name, v);
        return 0;
    case K_BACKEND:
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "fake"))
            return msm_err_set(err, -EINVAL, "%s: %s.%s = '%s' must be auto, cpu or cuda", where, section,
                               name, v);
        snprintf(p, k->size, "%s", v);
        return 0;
    case K_LEVEL: {
        static const char *levels[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (!strcasecmp(v, levels[i])) {
                *(msm_log_level *)p = (msm_log_level)i;
                return 0;
            }
        return msm_err_set(err, -EINVAL, "%s: %s.%s = '%s' must be error, warn, info or debug", where,
                           section, name, v);
    }
    case K_BUCKETS: {
        int n = 0, prev = 0;
        if (!*v) {
            c->n_buckets = 0;
            return 0;
        }
        for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            tok = trim(tok);
            if (n == MSM_MAX_BUCKETS)
                return msm_err_set(err, -EINVAL, "%s: %s.%s has more than %d buckets", where, section, name,
                                   MSM_MAX_BUCKETS);
            if (parse_long(tok, 10, &x) < 0 || x < k->min || x > k->max)
                return msm_err_set(err, -EINVAL, "%s: %s.%s: '%s' is not an integer in [%ld, %ld]", where,
                                   section, name, tok, k->min, k->max);
            if (x <= prev)
                return msm_err_set(err, -EINVAL, "%s: %s.%s must be strictly ascending (%ld after %d)", where,
                                   section, name, x, prev);
            c->buckets[n++] = prev = (int)x;
        }
        c->n_buckets = n;
        return 0;
    }
    case K_GPUS:
        return set_gpus(c, where, v, err);
    }
    return msm_err_set(err, -EINVAL, "%s: internal: bad key type", where);
}

/* inih gives its handler no line number (Debian builds it without INI_HANDLER_LINENO), so the
 * reader callback counts the lines it hands out. inih reads a line into a fixed buffer (`num`
 * bytes) and would split a longer one, parsing the rest as a line of its own (text past ~200
 * characters of a comment would become a key): the reader refuses such a line instead, naming it. */
typedef struct parse_ctx {
    msm_config *c;
    const char *source;
    FILE *f;                  /* file source, or ... */
    const char *text;         /* ... string source */
    size_t text_off;
    int line;
    int err_line;
    int rc;
    msm_err *err;
} parse_ctx;

/* The next byte of the source without consuming it, or EOF. */
static int peek(parse_ctx *p) {
    if (!p->f)
        return p->text[p->text_off] ? (unsigned char)p->text[p->text_off] : EOF;
    int ch = getc(p->f);
    if (ch != EOF)
        ungetc(ch, p->f);
    return ch;
}

static char *reader(char *str, int num, void *stream) {
    parse_ctx *p = stream;
    if (p->rc < 0)
        return NULL;
    if (p->f) {
        if (!fgets(str, num, p->f))
            return NULL;
    } else {
        if (!p->text[p->text_off])
            return NULL;
        int k = 0;
        while (k < num - 1 && p->text[p->text_off]) {
            char ch = p->text[p->text_off++];
            str[k++] = ch;
            if (ch == '\n')
                break;
        }
        str[k] = 0;
    }
    p->line++;
    size_t n = strlen(str);
    if (n && str[n - 1] == '\n')
        return str;
    /* No newline: the end of the source, a line of exactly num - 1 bytes, or a longer one. */
    int next = peek(p);
    if (next == '\n') {
        if (p->f)
            getc(p->f);
        else
            p->text_off++;
    } else if (next != EOF) {
        p->rc = msm_err_set(p->err, -EINVAL, "%s:%d: line longer than %d characters (comments too): shorten it",
                            p->source, p->line, num - 2);
        p->err_line = p->line;
        return NULL;
    }
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    parse_ctx *p = user;
    if (p->rc < 0)
        return 0;
    char where[1100];
    snprintf(where, sizeof where, "%s:%d", p->source, p->line);
    if (!name) /* a section header alone (inih >= 51 with INI_CALL_HANDLER_ON_NEW_SECTION) */
        return 1;
    int rc = set_key(p->c, where, section, name, value ? value : "", p->err);
    if (rc < 0) {
        p->rc = rc;
        p->err_line = p->line;
        return 0;
    }
    return 1;
}

static int parse(parse_ctx *p) {
    int line = ini_parse_stream(reader, p, handler, p);
    if (line < 0)
        return msm_err_set(p->err, -EIO, "%s: cannot read the file", p->source);
    if (line > 0 && (p->rc == 0 || line < p->err_line))
        return msm_err_set(p->err, -EINVAL, "%s:%d: syntax error (expected [section] or key = value)",
                           p->source, line);
    return p->rc;
}

int msm_config_load(msm_config *c, const char *path, msm_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return msm_err_set(err, -errno, "%s: cannot open: %s", path, strerror(errno));
    parse_ctx p = {.c = c, .source = path, .f = f, .err = err};
    int rc = parse(&p);
    fclose(f);
    return rc;
}

int msm_config_load_string(msm_config *c, const char *text, const char *source, msm_err *err) {
    parse_ctx p = {.c = c, .source = source, .text = text, .err = err};
    return parse(&p);
}

int msm_config_set(msm_config *c, const char *assignment, msm_err *err) {
    char buf[1200];
    snprintf(buf, sizeof buf, "%s", assignment);
    char *eq = strchr(buf, '=');
    char *dot = strchr(buf, '.');
    if (!eq || !dot || dot > eq)
        return msm_err_set(err, -EINVAL, "--set %s: expected section.key=value", assignment);
    *eq = 0;
    *dot = 0;
    return set_key(c, "--set", trim(buf), trim(dot + 1), eq + 1, err);
}

static int check_gpu_groups(const msm_config *c, const int *ids, int n, const char *where, msm_err *err);

int msm_config_check(const msm_config *c, msm_err *err) {
    if (c->max_tokens_default > c->max_tokens_limit)
        return msm_err_set(err, -EINVAL, "scheduler.max_tokens_default = %d exceeds scheduler.max_tokens_limit = %d",
                           c->max_tokens_default, c->max_tokens_limit);
    if (!c->socket[0] && !c->tcp_port)
        return msm_err_set(err, -EINVAL, "no listener: server.socket is empty and server.tcp is 0");
    if (c->max_step_tokens < c->max_seqs)
        return msm_err_set(err, -EINVAL, "engine.max_step_tokens = %d is below engine.max_seqs = %d "
                           "(every running sequence needs one token per decode step)",
                           c->max_step_tokens, c->max_seqs);
    if (c->socket[0] && c->socket[0] != '/')
        return msm_err_set(err, -EINVAL, "server.socket = '%s' must be an absolute path", c->socket);
    size_t sun_path = sizeof ((struct sockaddr_un *)0)->sun_path;
    if (strlen(c->socket) >= sun_path)
        return msm_err_set(err, -ENAMETOOLONG, "server.socket is %zu bytes long: a Unix socket path has at most %zu "
                           "(the kernel's sun_path limit); use a shorter path", strlen(c->socket), sun_path - 1);
    int loopback = msm_listen_loopback(c->tcp_host);
    if (c->tcp_port && loopback < 0)
        return msm_err_set(err, -EINVAL, "server.tcp_host = '%s' is not an IPv4 or IPv6 address (127.0.0.1 or ::1 "
                           "for this machine only)", c->tcp_host);
    if (c->tcp_port && !loopback && !c->tcp_allow_remote)
        return msm_err_set(err, -EINVAL, "server.tcp_host = %s is not a loopback address: the TCP API has no "
                           "authentication, so anyone who can reach %s:%d could use the model; set "
                           "server.tcp_allow_remote = true to serve it anyway (behind a firewall)",
                           c->tcp_host, c->tcp_host, c->tcp_port);
    if (c->max_context == 1)
        return msm_err_set(err, -EINVAL, "engine.max_context = 1: a sequence needs at least 2 tokens (a prompt token "
                           "and a generated one); 0 takes the model's max_position_embeddings");
    int rc = check_gpu_groups(c, c->gpus, c->n_gpus, c->gpus_where, err);
    if (rc < 0)
        return rc;
    if (c->replicas > 1 && !strcmp(c->backend, "cuda"))
        return msm_err_set(err, -EINVAL, "engine.replicas = %d applies to the CPU backend; with engine.backend = cuda "
                           "the groups are engine.gpus cut in runs of engine.tp", c->replicas);
    return 0;
}

/* The GPU list cut in runs of tp: tp must divide its length and each run must be consecutive ids. */
static int check_gpu_groups(const msm_config *c, const int *ids, int n, const char *where, msm_err *err) {
    char list[512], pre[768];
    if (n == 0)
        return 0;
    msm_config_format_gpus(ids, n, list, sizeof list);
    if (where[0])
        snprintf(pre, sizeof pre, "%s: engine.gpus = %s", where, list);
    else
        snprintf(pre, sizeof pre, "engine.gpus (empty: every visible GPU, %s)", list);
    if (n % c->tp)
        return msm_err_set(err, -EINVAL, "%s lists %d GPU(s), not a multiple of engine.tp = %d", pre, n, c->tp);
    for (int g = 0; g < n / c->tp; g++)
        for (int r = 1; r < c->tp; r++)
            if (ids[g * c->tp + r] != ids[g * c->tp] + r) {
                char grp[256];
                msm_config_format_gpus(ids + g * c->tp, c->tp, grp, sizeof grp);
                return msm_err_set(err, -EINVAL, "%s: TP group %d would be GPUs %s, which are not consecutive ids "
                                   "(each run of engine.tp = %d GPUs in the list is one group)", pre, g, grp, c->tp);
            }
    return 0;
}

int msm_config_plan_groups(const msm_config *c, bool cuda, int n_visible, msm_group_plan *ret, msm_err *err) {
    msm_group_plan p = {0};
    if (!cuda) {
        p.n_groups = c->replicas;
        *ret = p;
        return 0;
    }
    if (c->replicas > 1)
        return msm_err_set(err, -EINVAL, "engine.replicas = %d applies to the CPU backend; on CUDA the groups are "
                           "engine.gpus cut in runs of engine.tp", c->replicas);
    int all[MSM_MAX_GPUS], n = c->n_gpus;
    const int *ids = c->gpus;
    if (n == 0) {
        if (n_visible < 1)
            return msm_err_set(err, -ENODEV, "engine.gpus is empty (every visible GPU) and no GPU is visible");
        n = n_visible < MSM_MAX_GPUS ? n_visible : MSM_MAX_GPUS;
        for (int i = 0; i < n; i++)
            all[i] = i;
        ids = all;
    }
    int rc = check_gpu_groups(c, ids, n, c->n_gpus ? c->gpus_where : "", err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < n && n_visible >= 0; i++)
        if (ids[i] >= n_visible)
            return msm_err_set(err, -ENODEV, "%s%sengine.gpus lists GPU %d, but %d GPU(s) are visible (ids 0..%d)",
                               c->gpus_where, c->gpus_where[0] ? ": " : "", ids[i], n_visible, n_visible - 1);
    p.n_groups = n / c->tp;
    for (int g = 0; g < p.n_groups; g++)
        p.first_device[g] = ids[g * c->tp];
    *ret = p;
    return 0;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int msm_config_model_dir(const msm_config *c, char *ret, size_t cap, msm_err *err) {
    if (c->model[0]) {
        snprintf(ret, cap, "%s", c->model);
        return 0;
    }
    char source[PATH_MAX], installed[PATH_MAX];
    snprintf(source, sizeof source, "%s/models/%s", MSM_SOURCE_ROOT, MSM_EMBEDDED_MODEL);
    snprintf(installed, sizeof installed, "%s/msmoed/models/%s", MSM_DATADIR, MSM_EMBEDDED_MODEL);
    /* A binary in its build tree serves the source tree's model, so a fresh checkout works
     * without installing; an installed binary serves the installed copy. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    bool in_build = false;
    if (n > 0 && strlen(MSM_BUILD_ROOT) > 0) {
        exe[n] = 0;
        in_build = strncmp(exe, MSM_BUILD_ROOT, strlen(MSM_BUILD_ROOT)) == 0;
    }
    const char *order[2] = {in_build ? source : installed, in_build ? installed : source};
    for (int i = 0; i < 2; i++)
        if (is_dir(order[i])) {
            snprintf(ret, cap, "%s", order[i]);
            return 0;
        }
    return msm_err_set(err, -ENOENT, "engine.model is not set and the embedded model is in neither %s nor %s",
                       order[0], order[1]);
}
