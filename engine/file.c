/* msm_file: whole-file reads with size limits, and monotonic deadlines (see msm_file.h). */
#include "msm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int msm_read_file(const char *path, size_t max, char **ret_buf, size_t *ret_len, msm_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return msm_err_set(err, -e, "%.200s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    int rc = 0;
    char *buf = NULL;
    size_t got = 0;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        rc = msm_err_set(err, -EINVAL, "%.200s: not a readable regular file", path);
    } else if ((uint64_t)sb.st_size > max) {
        rc = msm_err_set(err, -EFBIG, "%.200s: %lld bytes, more than the limit of %zu", path,
                         (long long)sb.st_size, max);
    } else if (!(buf = malloc((size_t)sb.st_size + 1))) {
        rc = msm_err_set(err, -ENOMEM, "%.200s: out of memory", path);
    } else {
        while (got < (size_t)sb.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                rc = msm_err_set(err, -EIO, "%.200s: read failed: %s", path,
                                 r ? strerror(errno) : "short read");
                break;
            }
            got += (size_t)r;
        }
    }
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    *ret_buf = buf;
    *ret_len = got;
    return 0;
}

int msm_json_parse(const char *json, size_t len, const char *src, struct json_object **ret,
                   msm_err *err) {
    if (len > (size_t)INT32_MAX) return msm_err_set(err, -EFBIG, "%.200s: too large for JSON", src);
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return msm_err_set(err, -ENOMEM, "%.200s: out of memory", src);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    while (root && end < len && json[end] && strchr(" \t\r\n", json[end])) end++;
    if (!root || end != len) {
        json_object_put(root);
        return msm_err_set(err, -EINVAL, "%.200s: not valid JSON (%s at byte %zu)", src,
                           root ? "trailing data"
                           : jerr == json_tokener_continue ? "unexpected end"
                                                           : json_tokener_error_desc(jerr),
                           end);
    }
    *ret = root;
    return 0;
}

struct timespec msm_deadline_after_ms(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
