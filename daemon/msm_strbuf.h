/* msm_strbuf: a growing byte buffer for building text replies (chat prompts, HTTP bodies, SSE
 * events). A failed allocation latches: later appends do nothing and msm_strbuf_failed says so,
 * so a builder checks once at the end. */
#ifndef MSM_STRBUF_H
#define MSM_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct msm_strbuf {
    char *data;               /* [len] NUL-terminated once anything was appended (owned) */
    size_t len, cap;
    bool oom;
} msm_strbuf;

void msm_strbuf_append(msm_strbuf *b, const char *s, size_t n);
void msm_strbuf_puts(msm_strbuf *b, const char *s);
void msm_strbuf_printf(msm_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline bool msm_strbuf_failed(const msm_strbuf *b) { return b->oom; }
/* Hands the text over (malloc'ed, NUL-terminated, "" when empty; NULL after a failed allocation)
 * and resets b. */
char *msm_strbuf_take(msm_strbuf *b, size_t *ret_len);
void msm_strbuf_done(msm_strbuf *b);

#endif
