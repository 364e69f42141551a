/* msm_file: small-file, JSON and time helpers shared by the engine's modules. */
#ifndef MSM_FILE_H
#define MSM_FILE_H

#include <stddef.h>
#include <time.h>

#include "msm_err.h"

/* Reads the regular file `path` whole (at most `max` bytes) into a NUL-terminated buffer the
 * caller frees. Errors name the path: cannot open, not a regular file, too large, read failed. */
int msm_read_file(const char *path, size_t max, char **ret_buf, size_t *ret_len, msm_err *err);

struct json_object;
/* Parses exactly one JSON value from json[0..len) (strict mode; only whitespace may follow).
 * Errors name `src` and the byte: "SRC: not valid JSON (unexpected end at byte 12)". */
int msm_json_parse(const char *json, size_t len, const char *src, struct json_object **ret,
                   msm_err *err);

/* CLOCK_MONOTONIC time `ms` milliseconds from now (for pthread_cond_timedwait deadlines). */
struct timespec msm_deadline_after_ms(int ms);

#endif
