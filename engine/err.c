/* msm_err: formatting of error messages (see msm_err.h). */
#include "msm_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int msm_err_set(msm_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int msm_err_wrap(msm_err *err, int code, const char *fmt, ...) {
    if (err) {
        char prefix[256], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        size_t pl = strnlen(prefix, sizeof err->msg - 3);
        memcpy(err->msg, prefix, pl);
        memcpy(err->msg + pl, ": ", 2);
        size_t rest = sizeof err->msg - pl - 3;
        size_t ol = strnlen(old, rest);
        memcpy(err->msg + pl + 2, old, ol);
        err->msg[pl + 2 + ol] = 0;
    }
    return code;
}
