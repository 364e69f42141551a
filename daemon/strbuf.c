/* msm_strbuf: a growing byte buffer (see msm_strbuf.h). */
#include "msm_strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(msm_strbuf *b, size_t more) {
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void msm_strbuf_append(msm_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void msm_strbuf_puts(msm_strbuf *b, const char *s) {
    msm_strbuf_append(b, s, strlen(s));
}

void msm_strbuf_printf(msm_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *msm_strbuf_take(msm_strbuf *b, size_t *ret_len) {
    char *p = NULL;
    if (!b->oom)
        p = b->data ? b->data : strdup("");
    else
        free(b->data);
    if (ret_len)
        *ret_len = p ? b->len : 0;
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
    return p;
}

void msm_strbuf_done(msm_strbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}
