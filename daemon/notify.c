/* msm_notify: see msm_notify.h. */
#include "msm_notify.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>
#include <time.h>

void msm_notify_status(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sd_notifyf(0, "STATUS=%s", msg);
}

void msm_notify_ready(const char *status) {
    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void msm_notify_stopping(const char *status) {
    sd_notifyf(0, "STOPPING=1\nSTATUS=%s", status);
}

void msm_notify_watchdog(void) {
    sd_notify(0, "WATCHDOG=1");
}

void msm_notify_extend_timeout(uint64_t usec) {
    sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
}

uint64_t msm_notify_watchdog_usec(void) {
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0)
        return usec;
    return 0;
}

struct msm_notify_loading {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int period_s;
    char what[256];
    char progress[160];
};

static void *loading_main(void *arg) {
    msm_notify_loading *l = arg;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&l->mu);
    while (!l->done) {
        struct timespec now, until;
        clock_gettime(CLOCK_MONOTONIC, &now);
        /* Ask for three more periods each time: a single late wake-up must not kill the load. */
        sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu\nSTATUS=%s%s%s (%lds)",
                   (unsigned long long)l->period_s * 3000000ull, l->what, l->progress[0] ? ": " : "",
                   l->progress, (long)(now.tv_sec - t0.tv_sec));
        until = now;
        until.tv_sec += l->period_s;
        while (!l->done && pthread_cond_timedwait(&l->cv, &l->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int msm_notify_loading_start(const char *what, int period_s, msm_notify_loading **ret) {
    msm_notify_loading *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->period_s = period_s;
    snprintf(l->what, sizeof l->what, "%s", what);
    int rc = pthread_create(&l->thread, NULL, loading_main, l);
    if (rc) {
        free(l);
        return -rc;
    }
    *ret = l;
    return 0;
}

void msm_notify_loading_progress(msm_notify_loading *l, const char *progress) {
    if (!l) {
        sd_notifyf(0, "STATUS=%s", progress);
        return;
    }
    pthread_mutex_lock(&l->mu);
    snprintf(l->progress, sizeof l->progress, "%s", progress);
    sd_notifyf(0, "STATUS=%s: %s", l->what, l->progress);
    pthread_mutex_unlock(&l->mu);
}

void msm_notify_loading_stop(msm_notify_loading *l) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->done = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}
