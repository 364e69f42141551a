/* msm_log: see msm_log.h. */
#include "msm_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    pthread_mutex_t mu;
    FILE *f;                  /* NULL = stderr */
    char path[1024];
    msm_log_level level;
    int journal;              /* -1 unknown, 0/1 */
} L = {PTHREAD_MUTEX_INITIALIZER, NULL, "", MSM_LOG_INFO, -1};

int msm_log_open(const char *path, msm_log_level level) {
    pthread_mutex_lock(&L.mu);
    L.level = level;
    L.path[0] = 0;
    if (L.f)
        fclose(L.f);
    L.f = NULL;
    int rc = 0;
    if (path && *path) {
        snprintf(L.path, sizeof L.path, "%s", path);
        L.f = fopen(path, "a");
        if (!L.f)
            rc = -errno;
        else
            setvbuf(L.f, NULL, _IOLBF, 0);
    }
    pthread_mutex_unlock(&L.mu);
    return rc;
}

int msm_log_reopen(void) {
    pthread_mutex_lock(&L.mu);
    int rc = 0;
    if (L.path[0]) {
        FILE *f = fopen(L.path, "a");
        if (!f) {
            rc = -errno; /* keep the old stream */
        } else {
            setvbuf(f, NULL, _IOLBF, 0);
            if (L.f)
                fclose(L.f);
            L.f = f;
        }
    }
    pthread_mutex_unlock(&L.mu);
    return rc;
}

void msm_log_close(void) {
    pthread_mutex_lock(&L.mu);
    if (L.f)
        fclose(L.f);
    L.f = NULL;
    L.path[0] = 0;
    pthread_mutex_unlock(&L.mu);
}

void msm_log(msm_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    static const int prio[] = {3, 4, 6, 7}; /* syslog priorities */
    if (level > L.level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&L.mu);
    if (L.journal < 0)
        L.journal = getenv("JOURNAL_STREAM") != NULL;
    if (L.f) {
        struct timespec ts;
        struct tm tm;
        char when[32];
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        fprintf(L.f, "%s.%03ld msmoed %s: %s\n", when, ts.tv_nsec / 1000000, names[level], msg);
    } else if (L.journal) {
        fprintf(stderr, "<%d>%s\n", prio[level], msg);
    } else {
        fprintf(stderr, "msmoed %s: %s\n", names[level], msg);
    }
    pthread_mutex_unlock(&L.mu);
}
