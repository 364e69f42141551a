/* msm_metrics: the daemon's counters and gauges, as samples that render to Prometheus text (for
 * GET /metrics and `msmoe metrics`) or travel in a MetricsReply.
 *
 * The loop thread owns msm_metrics (connection and request counters it alone updates); the
 * scheduler's numbers come from msm_sched_stats snapshots, one per TP group, taken at collection
 * time. Every scheduler series appears once without a group label — the node's total: counters and
 * gauges are summed over the groups — followed by one series per group with a group="N" label
 * (so select {group=""} for the node, {group!=""} for the breakdown). */
#ifndef MSM_METRICS_H
#define MSM_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_code.h"
#include "msm_sched.h"

typedef struct msm_metrics {
    uint64_t connections_total;
    uint64_t connections_refused;     /* over server.max_connections (every listener) */
    uint64_t connections_idle_closed; /* idle past server.idle_timeout_s (every listener) */
    uint64_t connections_stalled_closed; /* replies not taken for server.write_timeout_s */
    int connections;                  /* open now */
    uint64_t requests_total;          /* generate requests received */
    uint64_t requests_rejected[MSM_CODE_LIMIT]; /* by msm_code: refused before reaching the scheduler */
    uint64_t frames_malformed;        /* frames that closed their connection */
    uint64_t slow_readers_closed;     /* connections closed over server.max_queued_bytes */
    uint64_t bytes_in, bytes_out;
} msm_metrics;

typedef struct msm_metric_sample {
    const char *name;
    char labels[64];
    double value;
    bool counter;
    const char *help;
} msm_metric_sample;

/* Samples msm_metrics_collect can produce for n_groups groups (the size of its out array). */
int msm_metrics_capacity(int n_groups);

/* st: [n_groups] snapshots. Fills up to cap samples; returns how many. */
int msm_metrics_collect(const msm_metrics *m, const msm_sched_stats *st, int n_groups, msm_metric_sample *out,
                        int cap);

/* Prometheus text exposition format (version 0.0.4). Returns the length (snprintf-style). */
size_t msm_metrics_render(const msm_metric_sample *s, int n, char *buf, size_t cap);

#endif
