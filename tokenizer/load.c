/* msm_tokenizer, loading: tokenizer.json (json-c) into the tables encode.c and decode.c read, and
 * the queries on them (see msm_tokenizer.h).
 *
 * Vocabulary (string -> id) and merges ((left id, right id) -> rank, new id) are open-addressing
 * hash tables. The decoder chain runs once per id at load: every id's decoded bytes are
 * precomputed for decode.c. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_file.h"
#include "tokenizer_internal.h"

/* ---------------------------------------------------------------------------------------------
 * Byte buffers. */

static int bytes_reserve(struct bytes *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int msm__tok_bytes_put(struct bytes *b, const void *s, size_t n) {
    if (bytes_reserve(b, n) < 0) return -ENOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others map to
 * U+0100 onward in byte order. */
uint32_t msm__tok_byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

/* ---------------------------------------------------------------------------------------------
 * Hash tables. */

uint64_t msm__tok_hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

int32_t msm__tok_vocab_find(const msm_tokenizer *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    uint32_t i = (uint32_t)msm__tok_hash_bytes(s, n) & t->vmap_mask;
    for (;;) {
        int32_t id = t->vmap[i];
        if (id < 0) return -1;
        if (t->piece_len[id] == n && memcmp(t->piece[id], s, n) == 0) return id;
        i = (i + 1) & t->vmap_mask;
    }
}

static void vocab_insert(msm_tokenizer *t, int32_t id) {
    uint32_t i = (uint32_t)msm__tok_hash_bytes(t->piece[id], t->piece_len[id]) & t->vmap_mask;
    while (t->vmap[i] >= 0) i = (i + 1) & t->vmap_mask;
    t->vmap[i] = id;
}

static uint32_t hash_pair(uint64_t k) { return (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32); }

/* Looks up the merge of (a, b); returns its rank (and *ret_new) or UINT32_MAX. */
uint32_t msm__tok_merge_find(const msm_tokenizer *t, int32_t a, int32_t b, int32_t *ret_new) {
    if (!t->merges) return UINT32_MAX;
    uint64_t k = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    uint32_t i = hash_pair(k) & t->mmask;
    for (;;) {
        const struct merge_entry *m = &t->merges[i];
        if (m->key == 0) return UINT32_MAX;
        if (m->key == k) {
            *ret_new = m->new_id;
            return m->rank;
        }
        i = (i + 1) & t->mmask;
    }
}

/* Inserts a merge; a pair listed twice keeps its first (lowest) rank, as Hugging Face does. */
static void merge_insert(msm_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t k = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    uint32_t i = hash_pair(k) & t->mmask;
    while (t->merges[i].key != 0) {
        if (t->merges[i].key == k) return;
        i = (i + 1) & t->mmask;
    }
    t->merges[i] = (struct merge_entry){k, rank, new_id};
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* ---------------------------------------------------------------------------------------------
 * Patterns. */

static void pattern_done(struct pattern *p) {
    pcre2_code_free(p->re);
    free(p->lit);
    p->re = NULL;
    p->lit = NULL;
}

static int pattern_regex(struct pattern *p, const char *src, size_t len, const char *source,
                         msm_err *err) {
    int ec;
    PCRE2_SIZE eo;
    p->re = pcre2_compile((PCRE2_SPTR)src, len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return msm_err_set(err, -EINVAL, "%s: pre_tokenizer regex /%.*s/ does not compile at offset %zu: %s",
                           source, (int)(len > 80 ? 80 : len), src, (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
    return 0;
}

static int pattern_literal(struct pattern *p, const char *s, size_t len) {
    p->lit = malloc(len + 1);
    if (!p->lit) return -ENOMEM;
    memcpy(p->lit, s, len);
    p->lit[len] = 0;
    p->lit_len = len;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Loading. */

void msm_tokenizer_free(msm_tokenizer *t) {
    if (!t) return;
    if (t->piece)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->piece[i]);
    if (t->dec)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->dec[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->special);
    free(t->dec);
    free(t->dec_len);
    free(t->vmap);
    free(t->merges);
    for (int i = 0; i < t->n_norm; i++) {
        pattern_done(&t->norm[i].pat);
        free(t->norm[i].s);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) pattern_done(&t->pre[i].pat);
    free(t->pre);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t);
}

static json_object *jget(json_object *o, const char *key) {
    json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object)) return NULL;
    if (!json_object_object_get_ex(o, key, &v)) return NULL;
    if (json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

static const char *jstr(json_object *o, const char *key) {
    json_object *v = jget(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static bool jbool(json_object *o, const char *key, bool def) {
    json_object *v = jget(o, key);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : def;
}

/* Sets the piece of an id (the vocabulary, then the added tokens). */
static int set_piece(msm_tokenizer *t, int32_t id, const char *s, size_t len, const char *source,
                     msm_err *err) {
    if (t->piece[id]) {
        if (t->piece_len[id] == len && memcmp(t->piece[id], s, len) == 0) return 0;
        return msm_err_set(err, -EINVAL, "%s: id %d is given to both \"%s\" and \"%.*s\"", source, id,
                           t->piece[id], (int)len, s);
    }
    t->piece[id] = malloc(len + 1);
    if (!t->piece[id]) return -ENOMEM;
    memcpy(t->piece[id], s, len);
    t->piece[id][len] = 0;
    t->piece_len[id] = (uint32_t)len;
    return 0;
}

/* Parses a pattern object {"String": s} or {"Regex": r}. */
static int load_pattern(json_object *o, struct pattern *p, const char *what, const char *source,
                        msm_err *err) {
    json_object *v;
    if ((v = jget(o, "Regex")) && json_object_is_type(v, json_type_string))
        return pattern_regex(p, json_object_get_string(v), (size_t)json_object_get_string_len(v), source,
                             err);
    if ((v = jget(o, "String")) && json_object_is_type(v, json_type_string))
        return pattern_literal(p, json_object_get_string(v), (size_t)json_object_get_string_len(v));
    return msm_err_set(err, -EINVAL, "%s: %s: pattern must be {\"String\": ...} or {\"Regex\": ...}", source,
                       what);
}

static int load_normalizer(msm_tokenizer *t, json_object *o, const char *source, msm_err *err) {
    if (!o) return 0;
    const char *type = jstr(o, "type");
    if (!type) return msm_err_set(err, -EINVAL, "%s: normalizer has no \"type\"", source);
    if (strcmp(type, "Sequence") == 0) {
        json_object *a = jget(o, "normalizers");
        if (!a || !json_object_is_type(a, json_type_array))
            return msm_err_set(err, -EINVAL, "%s: normalizer Sequence has no \"normalizers\" array", source);
        for (size_t i = 0; i < json_object_array_length(a); i++) {
            int r = load_normalizer(t, json_object_array_get_idx(a, i), source, err);
            if (r < 0) return r;
        }
        return 0;
    }
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    int form = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(type, forms[i]) == 0) form = i;
    bool lower = strcmp(type, "Lowercase") == 0;
    if (form < 0 && !lower && strcmp(type, "Prepend") != 0 && strcmp(type, "Replace") != 0)
        return msm_err_set(err, -ENOTSUP,
                           "%s: normalizer \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, "
                           "Replace, Sequence)",
                           source, type);
    if (t->n_norm == TOK_MAX_STEPS)
        return msm_err_set(err, -EINVAL, "%s: more than %d normalizer steps", source, TOK_MAX_STEPS);
    struct norm_step *s = &t->norm[t->n_norm++];
    if (form >= 0 || lower) {
        s->type = lower ? NORM_LOWERCASE : NORM_UNICODE;
        if (!lower) s->nf = form == 0 ? UNINORM_NFC : form == 1 ? UNINORM_NFD : form == 2 ? UNINORM_NFKC : UNINORM_NFKD;
        return 0;
    }
    json_object *v = jget(o, strcmp(type, "Prepend") == 0 ? "prepend" : "content");
    if (!v || !json_object_is_type(v, json_type_string))
        return msm_err_set(err, -EINVAL, "%s: normalizer %s has no string \"%s\"", source, type,
                           strcmp(type, "Prepend") == 0 ? "prepend" : "content");
    s->s_len = (size_t)json_object_get_string_len(v);
    s->s = malloc(s->s_len + 1);
    if (!s->s) return -ENOMEM;
    memcpy(s->s, json_object_get_string(v), s->s_len + 1);
    if (strcmp(type, "Prepend") == 0) {
        s->type = NORM_PREPEND;
        return 0;
    }
    s->type = NORM_REPLACE;
    return load_pattern(jget(o, "pattern"), &s->pat, "normalizer Replace", source, err);
}

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre_tokenizer(msm_tokenizer *t, json_object *o, const char *source, msm_err *err) {
    if (!o) return 0;
    const char *type = jstr(o, "type");
    if (!type) return msm_err_set(err, -EINVAL, "%s: pre_tokenizer has no \"type\"", source);
    if (strcmp(type, "Sequence") == 0) {
        json_object *a = jget(o, "pretokenizers");
        if (!a || !json_object_is_type(a, json_type_array))
            return msm_err_set(err, -EINVAL, "%s: pre_tokenizer Sequence has no \"pretokenizers\" array", source);
        for (size_t i = 0; i < json_object_array_length(a); i++) {
            int r = load_pre_tokenizer(t, json_object_array_get_idx(a, i), source, err);
            if (r < 0) return r;
        }
        return 0;
    }
    if (t->n_pre == TOK_MAX_STEPS)
        return msm_err_set(err, -EINVAL, "%s: more than %d pre_tokenizer steps", source, TOK_MAX_STEPS);
    struct pre_step *s = &t->pre[t->n_pre];
    if (strcmp(type, "ByteLevel") == 0) {
        s->type = PRE_BYTELEVEL;
        s->add_prefix_space = jbool(o, "add_prefix_space", true);
        t->byte_level = true;
        t->n_pre++;
        if (jbool(o, "use_regex", true)) return pattern_regex(&s->pat, GPT2_REGEX, sizeof GPT2_REGEX - 1, source, err);
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        const char *b = jstr(o, "behavior");
        s->type = PRE_SPLIT;
        s->behavior = -1;
        for (int i = 0; b && i < 5; i++)
            if (strcmp(b, names[i]) == 0) s->behavior = i;
        if (s->behavior < 0)
            return msm_err_set(err, -EINVAL, "%s: pre_tokenizer Split has unknown behavior \"%s\"", source,
                               b ? b : "(none)");
        s->invert = jbool(o, "invert", false);
        t->n_pre++;
        return load_pattern(jget(o, "pattern"), &s->pat, "pre_tokenizer Split", source, err);
    }
    if (strcmp(type, "Metaspace") == 0) {
        const char *rep = jstr(o, "replacement");
        const char *scheme = jstr(o, "prepend_scheme");
        s->type = PRE_METASPACE;
        s->split = jbool(o, "split", true);
        s->prepend = jbool(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        if (scheme) {
            if (strcmp(scheme, "first") == 0) s->prepend = PREPEND_FIRST;
            else if (strcmp(scheme, "never") == 0) s->prepend = PREPEND_NEVER;
            else if (strcmp(scheme, "always") == 0) s->prepend = PREPEND_ALWAYS;
            else return msm_err_set(err, -EINVAL, "%s: Metaspace has unknown prepend_scheme \"%s\"", source, scheme);
        }
        t->n_pre++;
        return pattern_literal(&s->pat, rep ? rep : "\xe2\x96\x81", rep ? strlen(rep) : 3);
    }
    return msm_err_set(err, -ENOTSUP,
                       "%s: pre_tokenizer \"%s\" is not supported (ByteLevel, Split, Metaspace, Sequence)",
                       source, type);
}

/* The decoder chain, applied at load to every piece (see the file comment). */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_METASPACE, DEC_STRIP };
struct dec_step {
    int type;
    const char *from, *to; /* DEC_REPLACE, DEC_METASPACE (from = replacement) */
    int start, stop;       /* DEC_STRIP per token */
    char c;
};

static int load_decoder(msm_tokenizer *t, json_object *o, struct dec_step *steps, int *n, bool *fused,
                        const char *source, msm_err *err) {
    if (!o) return 0;
    const char *type = jstr(o, "type");
    if (!type) return msm_err_set(err, -EINVAL, "%s: decoder has no \"type\"", source);
    if (strcmp(type, "Sequence") == 0) {
        json_object *a = jget(o, "decoders");
        if (!a || !json_object_is_type(a, json_type_array))
            return msm_err_set(err, -EINVAL, "%s: decoder Sequence has no \"decoders\" array", source);
        for (size_t i = 0; i < json_object_array_length(a); i++) {
            int r = load_decoder(t, json_object_array_get_idx(a, i), steps, n, fused, source, err);
            if (r < 0) return r;
        }
        return 0;
    }
    if (strcmp(type, "Fuse") == 0) {
        *fused = true;
        return 0;
    }
    if (*n == TOK_MAX_STEPS) return msm_err_set(err, -EINVAL, "%s: more than %d decoder steps", source, TOK_MAX_STEPS);
    struct dec_step *s = &steps[*n];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->type = DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s->type = DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Replace") == 0) {
        s->type = DEC_REPLACE;
        s->from = jstr(jget(o, "pattern"), "String");
        s->to = jstr(o, "content");
        if (!s->from || !s->to || !*s->from)
            return msm_err_set(err, -ENOTSUP, "%s: decoder Replace needs a non-empty String pattern and a content",
                               source);
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *scheme = jstr(o, "prepend_scheme");
        s->type = DEC_METASPACE;
        s->from = jstr(o, "replacement");
        if (!s->from || !*s->from) s->from = "\xe2\x96\x81";
        /* Hugging Face drops the replacement from the first token unless the scheme is
         * "never"; modelled as stripping one leading space of the output. */
        if (scheme ? strcmp(scheme, "never") != 0 : jbool(o, "add_prefix_space", true)) {
            t->strip_start += 1;
            t->strip_char = ' ';
        }
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(o, "content");
        json_object *a = jget(o, "start"), *b = jget(o, "stop");
        if (!c || strlen(c) != 1)
            return msm_err_set(err, -ENOTSUP, "%s: decoder Strip needs a one-byte content", source);
        int start = a ? json_object_get_int(a) : 0, stop = b ? json_object_get_int(b) : 0;
        if (start < 0 || stop < 0 || start > 64 || stop > 64)
            return msm_err_set(err, -EINVAL, "%s: decoder Strip start/stop out of range", source);
        if (*fused) { /* after Fuse there is one token: the whole output */
            if (stop) return msm_err_set(err, -ENOTSUP, "%s: decoder Strip with stop after Fuse", source);
            t->strip_start += start;
            t->strip_char = c[0];
            return 0;
        }
        s->type = DEC_STRIP;
        s->c = c[0];
        s->start = start;
        s->stop = stop;
    } else {
        return msm_err_set(err, -ENOTSUP,
                           "%s: decoder \"%s\" is not supported (ByteLevel, Metaspace, Replace, ByteFallback, "
                           "Fuse, Strip)",
                           source, type);
    }
    (*n)++;
    return 0;
}

/* Replaces every from by to in b (literal). */
static int replace_all(struct bytes *b, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to);
    struct bytes o = {0};
    size_t i = 0;
    while (i < b->n) {
        const char *m = memmem(b->p + i, b->n - i, from, fl);
        size_t end = m ? (size_t)(m - b->p) : b->n;
        if (msm__tok_bytes_put(&o, b->p + i, end - i) < 0) goto fail;
        if (!m) break;
        if (msm__tok_bytes_put(&o, to, tl) < 0) goto fail;
        i = end + fl;
    }
    free(b->p);
    *b = o;
    return 0;
fail:
    free(o.p);
    return -ENOMEM;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1. */
static int byte_piece(const char *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* Runs the per-token decoder steps on every piece. */
static int build_decoded(msm_tokenizer *t, const struct dec_step *steps, int n_steps) {
    int16_t cp_byte[324]; /* byte-level: code point -> byte */
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[msm__tok_byte_to_cp(b)] = (int16_t)b;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->piece[id]) continue;
        struct bytes b = {0};
        if (msm__tok_bytes_put(&b, t->piece[id], t->piece_len[id]) < 0) return -ENOMEM;
        for (int k = 0; k < n_steps; k++) {
            const struct dec_step *s = &steps[k];
            int r = 0;
            if (s->type == DEC_BYTELEVEL) {
                /* Map every character back to its byte; a piece with a character outside the
                 * map is kept as it is (Hugging Face does the same). */
                size_t o = 0, i = 0, l;
                bool ok = true;
                char *out = malloc(b.n + 1);
                if (!out) r = -ENOMEM;
                while (!r && i < b.n) {
                    const uint8_t *u = (const uint8_t *)b.p + i;
                    uint32_t cp;
                    if (msm__tok_utf8_seq(u, b.n - i, &l) != 1) { ok = false; break; }
                    if (l == 1) cp = u[0];
                    else if (l == 2) cp = ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu);
                    else cp = 0x110000;
                    if (cp >= 324 || cp_byte[cp] < 0) { ok = false; break; }
                    out[o++] = (char)cp_byte[cp];
                    i += l;
                }
                if (!r && ok) {
                    memcpy(b.p, out, o);
                    b.n = o;
                }
                free(out);
            } else if (s->type == DEC_REPLACE) {
                r = replace_all(&b, s->from, s->to);
            } else if (s->type == DEC_METASPACE) {
                r = replace_all(&b, s->from, " ");
            } else if (s->type == DEC_BYTEFALLBACK) {
                int v = byte_piece(b.p, b.n);
                if (v >= 0) {
                    b.p[0] = (char)v;
                    b.n = 1;
                }
            } else if (s->type == DEC_STRIP) {
                size_t a = 0, e = b.n;
                for (int j = 0; j < s->start && a < e && b.p[a] == s->c; j++) a++;
                for (int j = 0; j < s->stop && e > a && b.p[e - 1] == s->c; j++) e--;
                memmove(b.p, b.p + a, e - a);
                b.n = e - a;
            }
            if (r < 0) {
                free(b.p);
                return r;
            }
        }
        t->dec[id] = (uint8_t *)b.p;
        t->dec_len[id] = (uint32_t)b.n;
        if (b.n > t->max_dec_len) t->max_dec_len = b.n;
    }
    return 0;
}

/* TemplateProcessing's "single": the special tokens before and after $A. */
static int load_post_processor(msm_tokenizer *t, json_object *o, const char *source, msm_err *err) {
    if (!o) return 0;
    const char *type = jstr(o, "type");
    if (!type) return msm_err_set(err, -EINVAL, "%s: post_processor has no \"type\"", source);
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0) {
        json_object *a = jget(o, "processors");
        if (a && !json_object_is_type(a, json_type_array))
            return msm_err_set(err, -EINVAL, "%s: post_processor Sequence \"processors\" is not an array", source);
        for (size_t i = 0; a && i < json_object_array_length(a); i++) {
            int r = load_post_processor(t, json_object_array_get_idx(a, i), source, err);
            if (r < 0) return r;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return msm_err_set(err, -ENOTSUP, "%s: post_processor \"%s\" is not supported", source, type);
    json_object *single = jget(o, "single"), *specials = jget(o, "special_tokens");
    if (!single || !json_object_is_type(single, json_type_array))
        return msm_err_set(err, -EINVAL, "%s: TemplateProcessing has no \"single\" array", source);
    bool after = false;
    t->n_post_prefix = t->n_post_suffix = 0;
    for (size_t i = 0; i < json_object_array_length(single); i++) {
        json_object *e = json_object_array_get_idx(single, i);
        if (jget(e, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = jstr(jget(e, "SpecialToken"), "id");
        json_object *ids = jget(jget(specials, name ? name : ""), "ids");
        if (!name || !ids || !json_object_is_type(ids, json_type_array))
            return msm_err_set(err, -EINVAL, "%s: TemplateProcessing item %zu names no known special token", source,
                               i);
        for (size_t k = 0; k < json_object_array_length(ids); k++) {
            int64_t id = json_object_get_int64(json_object_array_get_idx(ids, k));
            if (id < 0 || id >= t->n_ids)
                return msm_err_set(err, -EINVAL, "%s: TemplateProcessing token \"%s\" has id %lld outside [0, %d)",
                                   source, name, (long long)id, t->n_ids);
            int *n = after ? &t->n_post_suffix : &t->n_post_prefix;
            if (*n == 8) return msm_err_set(err, -EINVAL, "%s: TemplateProcessing adds too many tokens", source);
            (after ? t->post_suffix : t->post_prefix)[(*n)++] = (int32_t)id;
        }
    }
    return 0;
}

static int load_model(msm_tokenizer *t, json_object *root, const char *source, msm_err *err) {
    json_object *model = jget(root, "model");
    if (!model) return msm_err_set(err, -EINVAL, "%s: no \"model\" object", source);
    const char *type = jstr(model, "type");
    json_object *vocab = jget(model, "vocab"), *merges = jget(model, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return msm_err_set(err, -ENOTSUP, "%s: model type \"%s\" is not supported (only BPE)", source, type);
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return msm_err_set(err, -EINVAL, "%s: model has no \"vocab\" object", source);
    if (!merges) merges = json_object_new_array(); /* owned by nobody: freed below */
    else json_object_get(merges);
    int r = 0;
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow)) {
        r = msm_err_set(err, -ENOTSUP, "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported", source);
        goto out;
    }
    if (!json_object_is_type(merges, json_type_array)) {
        r = msm_err_set(err, -EINVAL, "%s: model \"merges\" is not an array", source);
        goto out;
    }
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);

    /* Ids: the largest of the vocabulary and the added tokens. */
    int64_t max_id = -1;
    json_object_object_foreach(vocab, k0, v0) {
        (void)k0;
        int64_t id = json_object_get_int64(v0);
        if (!json_object_is_type(v0, json_type_int) || id < 0 || id >= TOK_MAX_IDS) {
            r = msm_err_set(err, -EINVAL, "%s: vocab entry \"%s\" has an invalid id", source, k0);
            goto out;
        }
        if (id > max_id) max_id = id;
    }
    json_object *added = jget(root, "added_tokens");
    if (added && !json_object_is_type(added, json_type_array)) {
        r = msm_err_set(err, -EINVAL, "%s: \"added_tokens\" is not an array", source);
        goto out;
    }
    for (size_t i = 0; added && i < json_object_array_length(added); i++) {
        json_object *id = jget(json_object_array_get_idx(added, i), "id");
        int64_t v = id ? json_object_get_int64(id) : -1;
        if (!id || v < 0 || v >= TOK_MAX_IDS) {
            r = msm_err_set(err, -EINVAL, "%s: added_tokens[%zu] has no valid id", source, i);
            goto out;
        }
        if (v > max_id) max_id = v;
    }
    t->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)t->n_ids;
    t->piece = calloc(n ? n : 1, sizeof *t->piece);
    t->piece_len = calloc(n ? n : 1, sizeof *t->piece_len);
    t->special = calloc(n ? n : 1, 1);
    t->dec = calloc(n ? n : 1, sizeof *t->dec);
    t->dec_len = calloc(n ? n : 1, sizeof *t->dec_len);
    t->vmap_mask = pow2_at_least(2 * (size_t)json_object_object_length(vocab)) - 1;
    t->vmap = malloc(((size_t)t->vmap_mask + 1) * sizeof *t->vmap);
    if (!t->piece || !t->piece_len || !t->special || !t->dec || !t->dec_len || !t->vmap) {
        r = -ENOMEM;
        goto out;
    }
    memset(t->vmap, 0xff, ((size_t)t->vmap_mask + 1) * sizeof *t->vmap);
    json_object_object_foreach(vocab, k, v) {
        int32_t id = (int32_t)json_object_get_int64(v);
        if ((r = set_piece(t, id, k, strlen(k), source, err)) < 0) goto out;
        if (msm__tok_vocab_find(t, k, strlen(k)) >= 0) {
            r = msm_err_set(err, -EINVAL, "%s: vocab lists \"%s\" twice", source, k);
            goto out;
        }
        vocab_insert(t, id);
    }

    /* Merges, rank = position in the list. */
    size_t nm = json_object_array_length(merges);
    t->mmask = pow2_at_least(2 * nm) - 1;
    t->merges = calloc((size_t)t->mmask + 1, sizeof *t->merges);
    if (!t->merges) {
        r = -ENOMEM;
        goto out;
    }
    struct bytes cat = {0};
    for (size_t i = 0; i < nm; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (json_object_is_type(m, json_type_string)) {
            const char *s = json_object_get_string(m), *sp = strchr(s, ' ');
            if (sp && sp != s) {
                a = s;
                al = (size_t)(sp - s);
                b = sp + 1;
                bl = strlen(b);
            }
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
            json_object *x = json_object_array_get_idx(m, 0), *y = json_object_array_get_idx(m, 1);
            if (json_object_is_type(x, json_type_string) && json_object_is_type(y, json_type_string)) {
                a = json_object_get_string(x);
                al = (size_t)json_object_get_string_len(x);
                b = json_object_get_string(y);
                bl = (size_t)json_object_get_string_len(y);
            }
        }
        if (!a || !bl || (json_object_is_type(m, json_type_string) && strchr(b, ' '))) {
            free(cat.p);
            r = msm_err_set(err, -EINVAL, "%s: merge %zu is not \"a b\" or [\"a\", \"b\"]", source, i);
            goto out;
        }
        int32_t ia = msm__tok_vocab_find(t, a, al), ib = msm__tok_vocab_find(t, b, bl), in;
        cat.n = 0;
        if (msm__tok_bytes_put(&cat, a, al) < 0 || msm__tok_bytes_put(&cat, b, bl) < 0) {
            free(cat.p);
            r = -ENOMEM;
            goto out;
        }
        in = msm__tok_vocab_find(t, cat.p, cat.n);
        if (ia < 0 || ib < 0 || in < 0) {
            free(cat.p);
            r = msm_err_set(err, -EINVAL, "%s: merge %zu (\"%.*s\" \"%.*s\"): %s is not in the vocabulary", source, i,
                            (int)al, a, (int)bl, b, ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the result");
            goto out;
        }
        merge_insert(t, ia, ib, (uint32_t)i, in);
    }
    free(cat.p);
    t->n_merges = nm;

    const char *unk = jstr(model, "unk_token");
    t->unk_id = unk ? msm__tok_vocab_find(t, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0) {
        r = msm_err_set(err, -EINVAL, "%s: unk_token \"%s\" is not in the vocabulary", source, unk);
        goto out;
    }

    /* Added tokens. */
    size_t na = added ? json_object_array_length(added) : 0;
    t->added = calloc(na ? na : 1, sizeof *t->added);
    if (!t->added) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < na; i++) {
        json_object *a = json_object_array_get_idx(added, i), *c = jget(a, "content");
        struct added_token *at = &t->added[t->n_added];
        if (!c || !json_object_is_type(c, json_type_string) || json_object_get_string_len(c) == 0) {
            r = msm_err_set(err, -EINVAL, "%s: added_tokens[%zu] has no content", source, i);
            goto out;
        }
        at->id = (int32_t)json_object_get_int64(jget(a, "id"));
        at->len = (size_t)json_object_get_string_len(c);
        at->content = malloc(at->len + 1);
        if (!at->content) {
            r = -ENOMEM;
            goto out;
        }
        memcpy(at->content, json_object_get_string(c), at->len + 1);
        t->n_added++;
        at->special = jbool(a, "special", false);
        at->lstrip = jbool(a, "lstrip", false);
        at->rstrip = jbool(a, "rstrip", false);
        at->single_word = jbool(a, "single_word", false);
        if ((r = set_piece(t, at->id, at->content, at->len, source, err)) < 0) goto out;
        t->special[at->id] = at->special;
        t->added_first[(uint8_t)at->content[0]] = 1;
    }
out:
    json_object_put(merges);
    return r;
}

static int load_root(msm_tokenizer *t, json_object *root, const char *source, msm_err *err) {
    int r;
    if (!json_object_is_type(root, json_type_object))
        return msm_err_set(err, -EINVAL, "%s: the top level is not a JSON object", source);
    if ((r = load_model(t, root, source, err)) < 0) return r;
    t->norm = calloc(TOK_MAX_STEPS, sizeof *t->norm);
    t->pre = calloc(TOK_MAX_STEPS, sizeof *t->pre);
    if (!t->norm || !t->pre) return -ENOMEM;
    if ((r = load_normalizer(t, jget(root, "normalizer"), source, err)) < 0) return r;
    if ((r = load_pre_tokenizer(t, jget(root, "pre_tokenizer"), source, err)) < 0) return r;
    if ((r = load_post_processor(t, jget(root, "post_processor"), source, err)) < 0) return r;

    struct dec_step steps[TOK_MAX_STEPS];
    int n_steps = 0;
    bool fused = false;
    if ((r = load_decoder(t, jget(root, "decoder"), steps, &n_steps, &fused, source, err)) < 0) return r;
    if ((r = build_decoded(t, steps, n_steps)) < 0) return r;

    /* Starting symbols: each byte's character (byte-level) and the byte-fallback pieces. */
    char tmp[8];
    for (int b = 0; b < 256; b++) {
        t->byte_sym[b] = msm__tok_vocab_find(t, tmp, msm__tok_utf8_put(tmp, msm__tok_byte_to_cp(b)));
        snprintf(tmp, sizeof tmp, "<0x%02X>", b);
        t->byte_fb[b] = msm__tok_vocab_find(t, tmp, 6);
        if (t->byte_fallback && t->byte_fb[b] < 0 && !t->byte_level)
            return msm_err_set(err, -EINVAL, "%s: byte_fallback is set but \"%s\" is not in the vocabulary", source, tmp);
    }
    return 0;
}

int msm_tokenizer_load_buffer(const char *json, size_t len, const char *source, msm_tokenizer **ret_tok,
                              msm_err *err) {
    if (!source) source = "<memory>";
    if (!json || len > INT32_MAX) return msm_err_set(err, -EINVAL, "%s: no JSON text or too large", source);
    json_tokener *jt = json_tokener_new_ex(64);
    if (!jt) return msm_err_set(err, -ENOMEM, "%s: out of memory", source);
    json_object *root = json_tokener_parse_ex(jt, json, (int)len);
    enum json_tokener_error je = json_tokener_get_error(jt);
    size_t end = json_tokener_get_parse_end(jt);
    json_tokener_free(jt);
    if (!root || je != json_tokener_success) {
        json_object_put(root);
        return msm_err_set(err, -EINVAL, "%s: invalid JSON near byte %zu: %s", source, end,
                           je == json_tokener_continue ? "unexpected end of input" : json_tokener_error_desc(je));
    }
    msm_tokenizer *t = calloc(1, sizeof *t);
    int r = t ? load_root(t, root, source, err) : -ENOMEM;
    json_object_put(root);
    if (r < 0) {
        msm_tokenizer_free(t);
        if (r == -ENOMEM) return msm_err_set(err, -ENOMEM, "%s: out of memory", source);
        return r;
    }
    *ret_tok = t;
    return 0;
}

int msm_tokenizer_load(const char *path, msm_tokenizer **ret_tok, msm_err *err) {
    char *buf;
    size_t len;
    int r = msm_read_file(path, TOK_MAX_FILE, &buf, &len, err);
    if (r) return r;
    r = msm_tokenizer_load_buffer(buf, len, path, ret_tok, err);
    free(buf);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Queries. */

int msm_tokenizer_vocab_size(const msm_tokenizer *t) { return t->n_ids; }

int msm_tokenizer_token_id(const msm_tokenizer *t, const char *piece) {
    size_t n = strlen(piece);
    int32_t id = msm__tok_vocab_find(t, piece, n);
    if (id >= 0) return id;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, piece, n) == 0) return t->added[i].id;
    return -ENOENT;
}

const char *msm_tokenizer_token_piece(const msm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->piece[id] : NULL;
}

bool msm_tokenizer_is_special(const msm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

int msm_tokenizer_bos_id(const msm_tokenizer *t) { return t->n_post_prefix ? t->post_prefix[0] : -ENOENT; }
