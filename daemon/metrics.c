/* msm_metrics: see msm_metrics.h. */
#include "msm_metrics.h"

#include <stdio.h>
#include <string.h>

static int add(msm_metric_sample *out, int n, int cap, const char *name, const char *labels, double v,
               bool counter, const char *help) {
    if (n >= cap)
        return n;
    out[n].name = name;
    snprintf(out[n].labels, sizeof out[n].labels, "%s", labels ? labels : "");
    out[n].value = v;
    out[n].counter = counter;
    out[n].help = help;
    return n + 1;
}

int msm_metrics_collect(const msm_metrics *m, const msm_sched_stats *st, msm_metric_sample *out, int cap) {
    int n = 0;
    uint64_t finished = 0;
    for (int f = 1; f < MSM_FINISH_COUNT_; f++)
        finished += st->finished[f];
    n = add(out, n, cap, "msmoed_requests_total", NULL, (double)m->requests_total, true,
            "Generate requests received.");
    n = add(out, n, cap, "msmoed_requests_active", NULL, (double)(st->running + st->waiting), false,
            "Generate requests admitted or waiting.");
    n = add(out, n, cap, "msmoed_requests_running", NULL, st->running, false,
            "Sequences holding KV blocks (admitted).");
    n = add(out, n, cap, "msmoed_queue_depth", NULL, st->waiting, false,
            "Requests waiting for admission.");
    for (int f = 1; f < MSM_FINISH_COUNT_; f++) {
        char l[64];
        snprintf(l, sizeof l, "reason=\"%s\"", msm_finish_name((msm_finish)f));
        n = add(out, n, cap, "msmoed_requests_finished_total", l, (double)st->finished[f], true,
                "Generate requests finished, by finish reason.");
    }
    for (int c = 1; c < 16; c++) {
        if (!m->requests_rejected[c])
            continue;
        char l[64];
        snprintf(l, sizeof l, "code=\"%s\"", msm_code_name((msm_code)c));
        n = add(out, n, cap, "msmoed_requests_rejected_total", l, (double)m->requests_rejected[c], true,
                "Requests refused before scheduling, by status code.");
    }
    n = add(out, n, cap, "msmoed_tokens_generated_total", NULL, (double)st->tokens_generated, true,
            "Tokens sampled.");
    n = add(out, n, cap, "msmoed_prompt_tokens_total", NULL, (double)st->prompt_tokens, true,
            "Prompt tokens prefilled (recomputation after preemption included).");
    n = add(out, n, cap, "msmoed_kv_blocks_used", NULL, st->kv_used, false, "KV cache blocks in use.");
    n = add(out, n, cap, "msmoed_kv_blocks_free", NULL, st->kv_free, false, "KV cache blocks free.");
    n = add(out, n, cap, "msmoed_steps_total", NULL, (double)st->steps, true, "Engine steps run.");
    n = add(out, n, cap, "msmoed_preemptions_total", NULL, (double)st->preemptions, true,
            "Sequences preempted (recompute) for lack of KV blocks.");
    n = add(out, n, cap, "msmoed_engine_errors_total", NULL, (double)st->engine_errors, true,
            "Engine steps that failed.");
    n = add(out, n, cap, "msmoed_connections", NULL, m->connections, false, "Client connections open.");
    n = add(out, n, cap, "msmoed_connections_total", NULL, (double)m->connections_total, true,
            "Client connections accepted.");
    n = add(out, n, cap, "msmoed_connections_refused_total", NULL, (double)m->connections_refused, true,
            "Connections refused over server.max_connections.");
    n = add(out, n, cap, "msmoed_frames_malformed_total", NULL, (double)m->frames_malformed, true,
            "Malformed frames (the connection was closed).");
    n = add(out, n, cap, "msmoed_received_bytes_total", NULL, (double)m->bytes_in, true, "Bytes received.");
    n = add(out, n, cap, "msmoed_sent_bytes_total", NULL, (double)m->bytes_out, true, "Bytes sent.");
    (void)finished;
    return n;
}

size_t msm_metrics_render(const msm_metric_sample *s, int n, char *buf, size_t cap) {
    size_t len = 0;
#define PUT(...) do { int k_ = snprintf(buf ? buf + (len < cap ? len : cap) : NULL, \
                                        len < cap ? cap - len : 0, __VA_ARGS__); \
                      if (k_ > 0) len += (size_t)k_; } while (0)
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(s[i].name, s[i - 1].name) != 0) {
            if (s[i].help && s[i].help[0])
                PUT("# HELP %s %s\n", s[i].name, s[i].help);
            PUT("# TYPE %s %s\n", s[i].name, s[i].counter ? "counter" : "gauge");
        }
        if (s[i].labels[0])
            PUT("%s{%s} %.17g\n", s[i].name, s[i].labels, s[i].value);
        else
            PUT("%s %.17g\n", s[i].name, s[i].value);
    }
#undef PUT
    return len;
}
