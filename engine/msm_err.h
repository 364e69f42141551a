/* msm_err: the error channel of libmsmoe and of the daemon.
 *
 * Functions return 0 or a negative errno. When they can fail for a reason a user must read
 * (a file, a tensor, a limit), they also take an `msm_err *` and write one sentence into it
 * that names what was wrong and where. The daemon logs it once, or answers the client with it (the
 * gRPC-style code of the answer is derived from the errno: daemon/msm_code.h); tools print it. */
#ifndef MSM_ERR_H
#define MSM_ERR_H

#include <stddef.h>

typedef struct msm_err {
    char msg[512];
} msm_err;

/* Writes the formatted message into err (when err is not NULL) and returns code, which must be
 * a negative errno, so callers can write `return msm_err_set(err, -EINVAL, "...", ...);`. */
int msm_err_set(msm_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to the message already in err (for adding context on the way up). */
int msm_err_wrap(msm_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
