/* msm_tokenizer, decoding and the streaming detokenizer (see msm_tokenizer.h).
 *
 * Decoding concatenates the bytes load.c precomputed for every id (its piece run through the
 * decoder chain), strips the SentencePiece leading space and replaces invalid UTF-8 by U+FFFD
 * exactly as Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---------------------------------------------------------------------------------------------
 * UTF-8. */

/* Classifies the sequence at s[0..n): returns 1 and its length when it is a well-formed
 * character, 0 when it is a well-formed but truncated prefix (n bytes), -1 when invalid with
 * *ret_len the length of the maximal invalid subpart (Unicode 3.9, as from_utf8_lossy). */
int msm__tok_utf8_seq(const uint8_t *s, size_t n, size_t *ret_len) {
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) { *ret_len = 1; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else { *ret_len = 1; return -1; }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) { *ret_len = n; return 0; }
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) { *ret_len = i; return -1; }
    }
    *ret_len = need;
    return 1;
}

size_t msm__tok_utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Copies the well-formed characters of in[0..n) to out and each maximal invalid subpart as
 * U+FFFD. Unless final, a truncated trailing sequence is not consumed. out needs 3 * n bytes.
 * Returns the bytes written; *ret_used the bytes of in consumed. */
static size_t utf8_lossy(const uint8_t *in, size_t n, bool final, char *out, size_t *ret_used) {
    size_t i = 0, o = 0, l;
    while (i < n) {
        int r = msm__tok_utf8_seq(in + i, n - i, &l);
        if (r == 1) {
            memcpy(out + o, in + i, l);
            o += l;
        } else if (r == 0 && !final) {
            break;
        } else {
            o += msm__tok_utf8_put(out + o, 0xFFFD);
        }
        i += l;
    }
    *ret_used = i;
    return o;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding. */

static int check_id(const msm_tokenizer *t, int32_t id, msm_err *err) {
    if (id < 0 || id >= t->n_ids)
        return msm_err_set(err, -EINVAL, "decode: token id %d is outside the vocabulary [0, %d)", id, t->n_ids);
    return 0;
}

int msm_tokenizer_decode(const msm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **ret_text,
                         size_t *ret_len, msm_err *err) {
    struct bytes raw = {0};
    int r = 0, strip = t->strip_start;
    for (size_t i = 0; i < n && !r; i++) {
        if ((r = check_id(t, ids[i], err)) < 0) break;
        if (skip_special && t->special[ids[i]]) continue;
        const uint8_t *d = t->dec[ids[i]];
        size_t l = t->dec_len[ids[i]];
        while (strip > 0 && l > 0 && (char)d[0] == t->strip_char) d++, l--, strip--;
        if (l) strip = 0;
        if (msm__tok_bytes_put(&raw, d, l) < 0) r = msm_err_set(err, -ENOMEM, "decode: out of memory");
    }
    char *text = r ? NULL : malloc(3 * raw.n + 1);
    if (!r && !text) r = msm_err_set(err, -ENOMEM, "decode: out of memory");
    if (r < 0) {
        free(raw.p);
        return r;
    }
    size_t used, o = utf8_lossy((const uint8_t *)raw.p, raw.n, true, text, &used);
    free(raw.p);
    text[o] = 0;
    *ret_text = text;
    *ret_len = o;
    return 0;
}

void msm_detok_init(msm_detok *d, const msm_tokenizer *t, unsigned flags) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->flags = flags;
    d->strip_left = (flags & MSM_DETOK_CONTINUE) ? 0 : t->strip_start;
}

size_t msm_detok_max_out(const msm_tokenizer *t) { return 3 * (t->max_dec_len + 4); }

int msm_detok_push(msm_detok *d, int32_t id, char *out, size_t cap, size_t *ret_len, msm_err *err) {
    const msm_tokenizer *t = d->tok;
    int r = check_id(t, id, err);
    if (r < 0) return r;
    size_t l = t->dec_len[id];
    if ((d->flags & MSM_DETOK_SKIP_SPECIAL) && t->special[id]) l = 0;
    if (cap < 3 * (l + (size_t)d->n_pending))
        return msm_err_set(err, -ENOSPC, "detok: output capacity %zu is below the %zu bytes token %d may need", cap,
                           3 * (l + (size_t)d->n_pending), id);
    const uint8_t *s = t->dec[id];
    while (d->strip_left > 0 && l > 0 && (char)s[0] == t->strip_char) s++, l--, d->strip_left--;
    if (l) d->strip_left = 0;
    /* Join the held-back bytes and the new ones in a small buffer when needed. */
    uint8_t small[64], *buf = small;
    size_t n = (size_t)d->n_pending + l;
    if (n > sizeof small) {
        buf = malloc(n);
        if (!buf) return msm_err_set(err, -ENOMEM, "detok: out of memory");
    }
    memcpy(buf, d->pending, (size_t)d->n_pending);
    if (l) memcpy(buf + d->n_pending, s, l);
    size_t used, o = utf8_lossy(buf, n, false, out, &used);
    d->n_pending = (int)(n - used); /* at most 3: a truncated well-formed prefix */
    memcpy(d->pending, buf + used, (size_t)d->n_pending);
    if (buf != small) free(buf);
    *ret_len = o;
    return 0;
}

int msm_detok_flush(msm_detok *d, char *out, size_t cap, size_t *ret_len) {
    if (cap < 3 * (size_t)d->n_pending) return -ENOSPC;
    size_t used;
    *ret_len = utf8_lossy(d->pending, (size_t)d->n_pending, true, out, &used);
    d->n_pending = 0;
    return 0;
}
