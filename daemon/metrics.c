/* msm_metrics: see msm_metrics.h. */
#include "msm_metrics.h"

#include "msm_code.h"

#include <stdio.h>
#include <stdlib.h>
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

int msm_metrics_capacity(int n_groups) {
    /* 25 daemon-wide series (15 of them rejected codes) + 17 scheduler series per group and total. */
    return 27 + 17 * (n_groups + 1);
}

/* One scheduler series: the total (labels as given), then each group's value with group="N". */
static int add_groups(msm_metric_sample *out, int n, int cap, const char *name, const char *labels,
                      const double *v, int n_groups, bool counter, const char *help) {
    double total = 0;
    for (int g = 0; g < n_groups; g++)
        total += v[g];
    n = add(out, n, cap, name, labels, total, counter, help);
    for (int g = 0; g < n_groups; g++) {
        char l[64]; /* the series' own labels are short (finish="cancelled"): 40 bytes always fit */
        snprintf(l, sizeof l, "%.40s%sgroup=\"%d\"", labels ? labels : "", labels ? "," : "", g);
        n = add(out, n, cap, name, l, v[g], counter, help);
    }
    return n;
}

/* Fills v[g] with one field of every group's snapshot. */
#define GROUP_VALUES(expr)                                                                         \
    do {                                                                                           \
        for (int g_ = 0; g_ < n_groups; g_++) {                                                    \
            const msm_sched_stats *s_ = &st[g_];                                                   \
            v[g_] = (double)(expr);                                                                \
        }                                                                                          \
    } while (0)

int msm_metrics_collect(const msm_metrics *m, const msm_sched_stats *st, int n_groups, msm_metric_sample *out,
                        int cap) {
    int n = 0;
    double *v = calloc(n_groups > 0 ? (size_t)n_groups : 1, sizeof *v);
    if (!v)
        return 0;
    n = add(out, n, cap, "msmoed_requests_total", NULL, (double)m->requests_total, true,
            "Generate requests received.");
    GROUP_VALUES(s_->running + s_->waiting);
    n = add_groups(out, n, cap, "msmoed_requests_active", NULL, v, n_groups, false,
                   "Generate requests admitted or waiting.");
    GROUP_VALUES(s_->running);
    n = add_groups(out, n, cap, "msmoed_requests_running", NULL, v, n_groups, false,
                   "Sequences holding KV blocks (admitted).");
    GROUP_VALUES(s_->waiting);
    n = add_groups(out, n, cap, "msmoed_queue_depth", NULL, v, n_groups, false, "Requests waiting for admission.");
    for (int f = 1; f < MSM_FINISH_COUNT_; f++) {
        char l[64];
        snprintf(l, sizeof l, "reason=\"%s\"", msm_finish_name((msm_finish)f));
        GROUP_VALUES(s_->finished[f]);
        n = add_groups(out, n, cap, "msmoed_requests_finished_total", l, v, n_groups, true,
                       "Generate requests finished, by finish reason.");
    }
    for (int c = 1; c < MSM_CODE_LIMIT; c++) {
        if (!m->requests_rejected[c])
            continue;
        char l[64];
        snprintf(l, sizeof l, "code=\"%s\"", msm_code_name((msm_code)c));
        n = add(out, n, cap, "msmoed_requests_rejected_total", l, (double)m->requests_rejected[c], true,
                "Requests refused before scheduling, by status code.");
    }
    GROUP_VALUES(s_->tokens_generated);
    n = add_groups(out, n, cap, "msmoed_tokens_generated_total", NULL, v, n_groups, true, "Tokens sampled.");
    GROUP_VALUES(s_->prompt_tokens);
    n = add_groups(out, n, cap, "msmoed_prompt_tokens_total", NULL, v, n_groups, true,
                   "Prompt tokens prefilled (recomputation after preemption included).");
    GROUP_VALUES(s_->kv_used);
    n = add_groups(out, n, cap, "msmoed_kv_blocks_used", NULL, v, n_groups, false, "KV cache blocks in use.");
    GROUP_VALUES(s_->kv_free);
    n = add_groups(out, n, cap, "msmoed_kv_blocks_free", NULL, v, n_groups, false, "KV cache blocks free.");
    GROUP_VALUES(s_->steps);
    n = add_groups(out, n, cap, "msmoed_steps_total", NULL, v, n_groups, true, "Engine steps run.");
    GROUP_VALUES(s_->preemptions);
    n = add_groups(out, n, cap, "msmoed_preemptions_total", NULL, v, n_groups, true,
                   "Sequences preempted (recompute) for lack of KV blocks.");
    GROUP_VALUES(s_->engine_errors);
    n = add_groups(out, n, cap, "msmoed_engine_errors_total", NULL, v, n_groups, true, "Engine steps that failed.");
    GROUP_VALUES(s_->nonfinite_logits);
    n = add_groups(out, n, cap, "msmoed_nonfinite_logits_total", NULL, v, n_groups, true,
                   "Generate requests failed because their logits were NaN or infinite.");
    GROUP_VALUES(!s_->engine_failed);
    n = add_groups(out, n, cap, "msmoed_groups_healthy", NULL, v, n_groups, false,
                   "TP groups whose last engine step succeeded (per group: 1 or 0).");
    free(v);
    n = add(out, n, cap, "msmoed_connections", NULL, m->connections, false, "Client connections open.");
    n = add(out, n, cap, "msmoed_connections_total", NULL, (double)m->connections_total, true,
            "Client connections accepted.");
    n = add(out, n, cap, "msmoed_connections_refused_total", NULL, (double)m->connections_refused, true,
            "Connections refused over server.max_connections (every listener).");
    n = add(out, n, cap, "msmoed_connections_timed_out_total", "reason=\"idle\"", (double)m->connections_idle_closed,
            true, "Connections closed by a timeout: idle (server.idle_timeout_s) or not taking their replies "
            "(server.write_timeout_s).");
    n = add(out, n, cap, "msmoed_connections_timed_out_total", "reason=\"stalled\"",
            (double)m->connections_stalled_closed, true,
            "Connections closed by a timeout: idle (server.idle_timeout_s) or not taking their replies "
            "(server.write_timeout_s).");
    n = add(out, n, cap, "msmoed_frames_malformed_total", NULL, (double)m->frames_malformed, true,
            "Malformed frames (the connection was closed).");
    n = add(out, n, cap, "msmoed_slow_readers_closed_total", NULL, (double)m->slow_readers_closed, true,
            "Connections closed because their unread replies exceeded server.max_queued_bytes.");
    n = add(out, n, cap, "msmoed_received_bytes_total", NULL, (double)m->bytes_in, true, "Bytes received.");
    n = add(out, n, cap, "msmoed_sent_bytes_total", NULL, (double)m->bytes_out, true, "Bytes sent.");
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
