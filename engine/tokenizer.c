/* msm_tokenizer: Hugging Face tokenizer.json BPE tokenizers (see msm_tokenizer.h).
 *
 * Encoding runs the Hugging Face pipeline on each stretch of text between added tokens:
 *   normalizer (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace)
 *     -> pre_tokenizer (ByteLevel, Split, Metaspace) -> BPE model,
 * then the post_processor adds its tokens when asked. Unicode normalisation and lowercasing are
 * libunistring's (u8_normalize, u8_tolower): composition tables, Hangul, canonical ordering and
 * the special casings are not things to hand-write. The byte-level mapping of GPT-2 (every byte
 * shown as a printable character) is never materialised: the BPE starts from the id of each
 * byte's character, so the model works on the raw bytes of each pre-token.
 *
 * The BPE merge loop is the linked-list + min-heap one of Hugging Face's Rust BPE: every adjacent
 * pair with a merge rank sits in a heap ordered by (rank, position); popping the lowest merges it
 * and pushes the two new neighbour pairs; stale entries are recognised and skipped. Vocabulary
 * (string -> id) and merges ((left id, right id) -> rank, new id) are open-addressing hash tables.
 *
 * Decoding precomputes, for every id, the bytes the decoder chain turns its piece into; decode
 * concatenates them, strips the SentencePiece leading space and replaces invalid UTF-8 by U+FFFD
 * exactly as Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart). */
#include "msm_tokenizer.h"
#include "msm_file.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <json-c/json.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicase.h>
#include <uninorm.h>

/* Limits on what a tokenizer.json may ask for (memory is allocated from these). */
#define TOK_MAX_IDS (1 << 24)
#define TOK_MAX_FILE (512u << 20)
#define TOK_MAX_STEPS 32

/* ---------------------------------------------------------------------------------------------
 * Configuration structs (immutable after load). */

enum { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

/* A pattern: a PCRE2 regex, or a literal string when re is NULL. */
struct pattern {
    pcre2_code *re;
    char *lit;
    size_t lit_len;
};

struct pre_step {
    int type;
    struct pattern pat;    /* PRE_SPLIT, PRE_BYTELEVEL with use_regex, PRE_METASPACE (replacement) */
    int behavior;          /* SPLIT_* */
    bool invert;
    bool add_prefix_space; /* PRE_BYTELEVEL */
    int prepend;           /* PRE_METASPACE: PREPEND_* */
    bool split;            /* PRE_METASPACE */
};

enum { NORM_PREPEND, NORM_REPLACE, NORM_UNICODE, NORM_LOWERCASE };
struct norm_step {
    int type;
    struct pattern pat; /* NORM_REPLACE: what to replace */
    char *s;            /* NORM_PREPEND: the prefix; NORM_REPLACE: the replacement */
    size_t s_len;
    uninorm_t nf;       /* NORM_UNICODE: UNINORM_NFC, _NFD, _NFKC or _NFKD */
};

struct added_token {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip, single_word;
};

struct merge_entry {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
};

struct msm_tokenizer {
    int32_t n_ids;
    char **piece;          /* [n_ids] NUL-terminated piece as in tokenizer.json, NULL for holes */
    uint32_t *piece_len;   /* [n_ids] */
    uint8_t *special;      /* [n_ids] 1 for special added tokens */
    uint8_t **dec;         /* [n_ids] bytes the decoder chain makes of the piece */
    uint32_t *dec_len;     /* [n_ids] */
    size_t max_dec_len;

    int32_t *vmap;         /* model vocabulary: string -> id, open addressing, -1 = empty */
    uint32_t vmap_mask;

    struct merge_entry *merges; /* (left id + 1) << 32 | right id -> rank, new id; key 0 = empty */
    uint32_t mmask;
    size_t n_merges;

    bool byte_level;       /* a ByteLevel pre-tokenizer: BPE starts from bytes */
    int32_t byte_sym[256]; /* byte-level: id of the character of each byte, -1 if absent */
    int32_t byte_fb[256];  /* id of "<0xNN>", -1 if absent */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;        /* -1: none */

    struct norm_step *norm;
    int n_norm;
    struct pre_step *pre;
    int n_pre;
    struct added_token *added;
    int n_added;
    uint8_t added_first[256]; /* 1 when some added token starts with that byte */

    int32_t post_prefix[8], post_suffix[8];
    int n_post_prefix, n_post_suffix;

    int strip_start;       /* decoder: leading strip_char bytes removed from the whole output */
    char strip_char;
};

/* ---------------------------------------------------------------------------------------------
 * Small growable buffers (scratch of one encode call). */

struct bytes {
    char *p;
    size_t n, cap;
};

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

static int bytes_put(struct bytes *b, const void *s, size_t n) {
    if (bytes_reserve(b, n) < 0) return -ENOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

struct ids {
    int32_t *v;
    size_t n, cap;
};

static int ids_push(struct ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* A list of pre-tokens: spans of a byte buffer; first marks the one at the start of the text
 * (Metaspace's prepend_scheme "first" prepends only there). */
struct span {
    size_t off, len;
    bool first;
};

struct pieces {
    struct bytes buf;
    struct span *v;
    size_t n, cap;
};

static int pieces_add(struct pieces *p, const char *s, size_t len, bool first) {
    if (len == 0) return 0; /* Hugging Face drops empty splits */
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        struct span *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    size_t off = p->buf.n;
    if (bytes_put(&p->buf, s, len) < 0) return -ENOMEM;
    p->v[p->n++] = (struct span){off, len, first};
    return 0;
}

static void pieces_clear(struct pieces *p) {
    p->buf.n = 0;
    p->n = 0;
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8. */

/* Classifies the sequence at s[0..n): returns 1 and its length when it is a well-formed
 * character, 0 when it is a well-formed but truncated prefix (n bytes), -1 when invalid with
 * *ret_len the length of the maximal invalid subpart (Unicode 3.9, as from_utf8_lossy). */
static int utf8_seq(const uint8_t *s, size_t n, size_t *ret_len) {
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

/* Returns the offset of the first invalid byte, or len when s is valid UTF-8. */
static size_t utf8_invalid_at(const char *s, size_t len) {
    size_t i = 0, l;
    while (i < len) {
        if ((uint8_t)s[i] < 0x80) { i++; continue; }
        if (utf8_seq((const uint8_t *)s + i, len - i, &l) != 1) return i;
        i += l;
    }
    return len;
}

static size_t utf8_put(char *out, uint32_t cp) {
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
        int r = utf8_seq(in + i, n - i, &l);
        if (r == 1) {
            memcpy(out + o, in + i, l);
            o += l;
        } else if (r == 0 && !final) {
            break;
        } else {
            o += utf8_put(out + o, 0xFFFD);
        }
        i += l;
    }
    *ret_used = i;
    return o;
}

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others map to
 * U+0100 onward in byte order. */
static uint32_t byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256u + (uint32_t)n;
}

/* ---------------------------------------------------------------------------------------------
 * Hash tables. */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int32_t vocab_find(const msm_tokenizer *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & t->vmap_mask;
    for (;;) {
        int32_t id = t->vmap[i];
        if (id < 0) return -1;
        if (t->piece_len[id] == n && memcmp(t->piece[id], s, n) == 0) return id;
        i = (i + 1) & t->vmap_mask;
    }
}

static void vocab_insert(msm_tokenizer *t, int32_t id) {
    uint32_t i = (uint32_t)hash_bytes(t->piece[id], t->piece_len[id]) & t->vmap_mask;
    while (t->vmap[i] >= 0) i = (i + 1) & t->vmap_mask;
    t->vmap[i] = id;
}

static uint32_t hash_pair(uint64_t k) { return (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32); }

/* Looks up the merge of (a, b); returns its rank (and *ret_new) or UINT32_MAX. */
static uint32_t merge_find(const msm_tokenizer *t, int32_t a, int32_t b, int32_t *ret_new) {
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

/* Finds the next non-empty match of p in s[0..n) at or after from; returns 1 with the match in
 * [*ret_a, *ret_b), 0 when there is none, or a negative errno on a matcher failure. */
static int pattern_next(const struct pattern *p, pcre2_match_data *md, const char *s, size_t n,
                        size_t from, size_t *ret_a, size_t *ret_b) {
    if (!p->re) {
        if (p->lit_len == 0 || from >= n) return 0;
        const char *m = memmem(s + from, n - from, p->lit, p->lit_len);
        if (!m) return 0;
        *ret_a = (size_t)(m - s);
        *ret_b = *ret_a + p->lit_len;
        return 1;
    }
    while (from < n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0 && rc != 0) return -EINVAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *ret_a = ov[0];
            *ret_b = ov[1];
            return 1;
        }
        /* An empty match: try again one character further. */
        from = ov[0] + 1;
        while (from < n && ((uint8_t)s[from] & 0xC0) == 0x80) from++;
    }
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
        if (bytes_put(&o, b->p + i, end - i) < 0) goto fail;
        if (!m) break;
        if (bytes_put(&o, to, tl) < 0) goto fail;
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
    for (int b = 0; b < 256; b++) cp_byte[byte_to_cp(b)] = (int16_t)b;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->piece[id]) continue;
        struct bytes b = {0};
        if (bytes_put(&b, t->piece[id], t->piece_len[id]) < 0) return -ENOMEM;
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
                    if (utf8_seq(u, b.n - i, &l) != 1) { ok = false; break; }
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
        if (vocab_find(t, k, strlen(k)) >= 0) {
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
        int32_t ia = vocab_find(t, a, al), ib = vocab_find(t, b, bl), in;
        cat.n = 0;
        if (bytes_put(&cat, a, al) < 0 || bytes_put(&cat, b, bl) < 0) {
            free(cat.p);
            r = -ENOMEM;
            goto out;
        }
        in = vocab_find(t, cat.p, cat.n);
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
    t->unk_id = unk ? vocab_find(t, unk, strlen(unk)) : -1;
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
        t->byte_sym[b] = vocab_find(t, tmp, utf8_put(tmp, byte_to_cp(b)));
        snprintf(tmp, sizeof tmp, "<0x%02X>", b);
        t->byte_fb[b] = vocab_find(t, tmp, 6);
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
    int32_t id = vocab_find(t, piece, n);
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

/* ---------------------------------------------------------------------------------------------
 * Encoding. */

struct sym {
    int32_t id, prev, next;
};

struct cand {
    uint32_t rank;
    int32_t pos, right;
    int32_t left_id, right_id, new_id;
};

/* A cache of the ids of pre-tokens already encoded in this call (text repeats its words):
 * open addressing over (hash, key bytes in keys) -> ids[off, off + n). Only for long texts. */
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_WORD 64
struct cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_n;
};

/* Per-call scratch. */
struct enc {
    struct cache_entry *cache; /* [CACHE_SLOTS] or NULL */
    size_t cache_used;
    struct bytes cache_keys;
    struct ids cache_ids;
    const msm_tokenizer *t;
    pcre2_match_data *md;
    struct pieces a, b; /* ping-pong buffers of the pre-tokenizer */
    struct bytes norm, tmp;
    struct sym *sym;
    size_t sym_cap;
    struct cand *heap;
    size_t heap_n, heap_cap;
    struct ids *out;
};

static bool cand_less(const struct cand *x, const struct cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static int heap_push(struct enc *e, struct cand c) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 256;
        struct cand *h = realloc(e->heap, cap * sizeof *h);
        if (!h) return -ENOMEM;
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
    return 0;
}

static struct cand heap_pop(struct enc *e) {
    struct cand top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const struct cand *best = &last;
        if (l < n && cand_less(&e->heap[l], best)) { m = l; best = &e->heap[l]; }
        if (l + 1 < n && cand_less(&e->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

static int push_pair(struct enc *e, int32_t pos) {
    int32_t right = e->sym[pos].next;
    if (right < 0) return 0;
    int32_t nid;
    uint32_t rank = merge_find(e->t, e->sym[pos].id, e->sym[right].id, &nid);
    if (rank == UINT32_MAX) return 0;
    return heap_push(e, (struct cand){rank, pos, right, e->sym[pos].id, e->sym[right].id, nid});
}

static int add_sym(struct enc *e, size_t *n, int32_t id) {
    if (*n == e->sym_cap) {
        size_t cap = e->sym_cap ? e->sym_cap * 2 : 256;
        struct sym *s = realloc(e->sym, cap * sizeof *s);
        if (!s) return -ENOMEM;
        e->sym = s;
        e->sym_cap = cap;
    }
    e->sym[*n] = (struct sym){id, (int32_t)*n - 1, (int32_t)*n + 1};
    (*n)++;
    return 0;
}

/* Adds an unknown symbol: the unk id (fused with a preceding unk when fuse_unk), or nothing. */
static int add_unk(struct enc *e, size_t *n) {
    const msm_tokenizer *t = e->t;
    if (t->unk_id < 0) return 0;
    if (t->fuse_unk && *n > 0 && e->sym[*n - 1].id == t->unk_id) return 0;
    return add_sym(e, n, t->unk_id);
}

/* BPE on one pre-token; appends the ids to e->out. */
static int bpe_word(struct enc *e, const char *s, size_t len) {
    const msm_tokenizer *t = e->t;
    size_t n = 0;
    int r;
    if (t->ignore_merges) { /* a word that is itself a piece skips the merges */
        int32_t id = -1;
        if (t->byte_level) {
            char tmp[8];
            e->tmp.n = 0;
            for (size_t i = 0; i < len; i++)
                if (bytes_put(&e->tmp, tmp, utf8_put(tmp, byte_to_cp((uint8_t)s[i]))) < 0) return -ENOMEM;
            id = vocab_find(t, e->tmp.p, e->tmp.n);
        } else {
            id = vocab_find(t, s, len);
        }
        if (id >= 0) return ids_push(e->out, id);
    }
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = t->byte_sym[(uint8_t)s[i]];
            if ((r = id >= 0 ? add_sym(e, &n, id) : add_unk(e, &n)) < 0) return r;
        }
    } else {
        size_t i = 0, l;
        while (i < len) {
            if (utf8_seq((const uint8_t *)s + i, len - i, &l) != 1) l = 1;
            int32_t id = vocab_find(t, s + i, l);
            if (id >= 0) {
                r = add_sym(e, &n, id);
            } else if (t->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < l; k++) all = all && t->byte_fb[(uint8_t)s[i + k]] >= 0;
                r = 0;
                for (size_t k = 0; all && k < l && r == 0; k++) r = add_sym(e, &n, t->byte_fb[(uint8_t)s[i + k]]);
                if (!all) r = add_unk(e, &n);
            } else {
                r = add_unk(e, &n);
            }
            if (r < 0) return r;
            i += l;
        }
    }
    if (n == 0) return 0;
    e->sym[n - 1].next = -1;

    e->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if ((r = push_pair(e, (int32_t)i)) < 0) return r;
    while (e->heap_n) {
        struct cand c = heap_pop(e);
        struct sym *L = &e->sym[c.pos];
        /* Stale: either side was merged away or changed since this pair was pushed. */
        if (L->id != c.left_id || L->next != c.right || e->sym[c.right].id != c.right_id) continue;
        struct sym *R = &e->sym[c.right];
        L->id = c.new_id;
        L->next = R->next;
        if (R->next >= 0) e->sym[R->next].prev = c.pos;
        R->id = -1;
        if (L->prev >= 0 && (r = push_pair(e, L->prev)) < 0) return r;
        if ((r = push_pair(e, c.pos)) < 0) return r;
    }
    for (int32_t i = 0; i >= 0; i = e->sym[i].next)
        if ((r = ids_push(e->out, e->sym[i].id)) < 0) return r;
    return 0;
}

/* BPE of one pre-token through the word cache. */
static int encode_word(struct enc *e, const char *s, size_t len) {
    if (!e->cache || len > CACHE_MAX_WORD) return bpe_word(e, s, len);
    uint64_t h = hash_bytes(s, len);
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
        struct cache_entry *c = &e->cache[i];
        if (c->key_len == 0) break;
        if (c->hash == h && c->key_len == len && memcmp(e->cache_keys.p + c->key_off, s, len) == 0) {
            for (uint32_t k = 0; k < c->ids_n; k++)
                if (ids_push(e->out, e->cache_ids.v[c->ids_off + k]) < 0) return -ENOMEM;
            return 0;
        }
    }
    size_t before = e->out->n;
    int r = bpe_word(e, s, len);
    if (r < 0 || e->cache_used >= CACHE_SLOTS / 2) return r;
    struct cache_entry c = {h, (uint32_t)e->cache_keys.n, (uint32_t)len, (uint32_t)e->cache_ids.n,
                            (uint32_t)(e->out->n - before)};
    if (bytes_put(&e->cache_keys, s, len) < 0) return -ENOMEM;
    for (size_t k = before; k < e->out->n; k++)
        if (ids_push(&e->cache_ids, e->out->v[k]) < 0) return -ENOMEM;
    e->cache[i] = c;
    e->cache_used++;
    return 0;
}

/* Splits [s, s+n) by pattern p with a Hugging Face SplitDelimiterBehavior into out. */
static int split_piece(struct enc *e, const struct pattern *p, int behavior, bool invert, const char *s, size_t n,
                       bool first, struct pieces *out) {
    /* Segments [a, b) alternate between match and non-match; pend accumulates a merged one. */
    size_t pos = 0, pend_a = 0, pend_b = 0, ma, mb;
    bool have_pend = false, pend_match = false;
    int r;
#define EMIT(a_, b_) do { if ((r = pieces_add(out, s + (a_), (b_) - (a_), first && (a_) == 0)) < 0) return r; } while (0)
    for (;;) {
        int found = pattern_next(p, e->md, s, n, pos, &ma, &mb);
        if (found < 0) return found;
        size_t seg_end = found ? ma : n;
        /* Two segments: the gap [pos, seg_end) and, when found, the match [ma, mb). */
        for (int k = 0; k < 2; k++) {
            size_t a = k == 0 ? pos : ma, b = k == 0 ? seg_end : mb;
            if (k == 1 && !found) break;
            if (a == b) continue;
            bool is_match = (k == 1) != invert;
            switch (behavior) {
            case SPLIT_REMOVED:
                if (!is_match) EMIT(a, b);
                break;
            case SPLIT_ISOLATED:
                EMIT(a, b);
                break;
            case SPLIT_MERGED_PREV: /* a match joins the piece before it */
                if (is_match && have_pend) {
                    EMIT(pend_a, b);
                    have_pend = false;
                } else if (is_match) {
                    EMIT(a, b);
                } else {
                    if (have_pend) EMIT(pend_a, pend_b);
                    pend_a = a, pend_b = b, have_pend = true;
                }
                break;
            case SPLIT_MERGED_NEXT: /* a match starts the next piece */
                if (is_match) {
                    if (have_pend) EMIT(pend_a, pend_b);
                    pend_a = a, pend_b = b, have_pend = true;
                } else if (have_pend) {
                    EMIT(pend_a, b);
                    have_pend = false;
                } else {
                    EMIT(a, b);
                }
                break;
            case SPLIT_CONTIGUOUS: /* adjacent matches form one piece */
                if (have_pend && pend_match && is_match) {
                    pend_b = b;
                } else {
                    if (have_pend) EMIT(pend_a, pend_b);
                    pend_a = a, pend_b = b, pend_match = is_match, have_pend = true;
                }
                break;
            }
        }
        if (!found) break;
        pos = mb;
    }
    if (have_pend) EMIT(pend_a, pend_b);
#undef EMIT
    return 0;
}

/* Applies one pre-tokenizer step: e->a -> e->b, then swaps. */
static int pre_step(struct enc *e, const struct pre_step *st) {
    struct pieces *in = &e->a, *out = &e->b;
    int r = 0;
    pieces_clear(out);
    for (size_t i = 0; i < in->n && r == 0; i++) {
        const char *s = in->buf.p + in->v[i].off;
        size_t n = in->v[i].len;
        bool first = in->v[i].first;
        if (st->type == PRE_BYTELEVEL) {
            if (st->add_prefix_space && s[0] != ' ') {
                e->tmp.n = 0;
                if (bytes_put(&e->tmp, " ", 1) < 0 || bytes_put(&e->tmp, s, n) < 0) return -ENOMEM;
                s = e->tmp.p;
                n = e->tmp.n;
            }
            r = st->pat.re ? split_piece(e, &st->pat, SPLIT_ISOLATED, false, s, n, first, out)
                           : pieces_add(out, s, n, first);
        } else if (st->type == PRE_SPLIT) {
            r = split_piece(e, &st->pat, st->behavior, st->invert, s, n, first, out);
        } else { /* PRE_METASPACE */
            e->tmp.n = 0;
            const char *rep = st->pat.lit;
            size_t rl = st->pat.lit_len;
            bool starts = n >= rl && memcmp(s, rep, rl) == 0;
            if ((st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && first)) && !starts && s[0] != ' ')
                if (bytes_put(&e->tmp, rep, rl) < 0) return -ENOMEM;
            for (size_t k = 0; k < n; k++)
                if ((s[k] == ' ' ? bytes_put(&e->tmp, rep, rl) : bytes_put(&e->tmp, s + k, 1)) < 0) return -ENOMEM;
            r = st->split ? split_piece(e, &st->pat, SPLIT_MERGED_NEXT, false, e->tmp.p, e->tmp.n, first, out)
                          : pieces_add(out, e->tmp.p, e->tmp.n, first);
        }
    }
    struct pieces sw = e->a;
    e->a = e->b;
    e->b = sw;
    return r;
}

/* Hugging Face's Lowercase of in into out. It lowercases character by character (Rust's
 * char::to_lowercase): full mappings (U+0130 -> "i" U+0307) but no context, so a word-final capital
 * sigma becomes σ, not ς. u8_tolower on one character at a time gives exactly that (the only
 * language-independent context, Final_Sigma, needs a preceding letter). */
static int norm_lowercase(const struct bytes *in, struct bytes *out) {
    size_t l;
    out->n = 0;
    for (size_t i = 0; i < in->n; i += l) {
        char c = in->p[i];
        if ((uint8_t)c < 0x80) {
            l = 1;
            if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
            if (bytes_put(out, &c, 1) < 0) return -ENOMEM;
            continue;
        }
        if (utf8_seq((const uint8_t *)in->p + i, in->n - i, &l) != 1) return -EILSEQ;
        uint8_t small[32], *res;
        size_t len = sizeof small;
        res = u8_tolower((const uint8_t *)in->p + i, l, NULL, NULL, small, &len);
        if (!res) return errno == ENOMEM ? -ENOMEM : -EILSEQ;
        int r = bytes_put(out, res, len);
        if (res != small) free(res);
        if (r < 0) return r;
    }
    return 0;
}

/* Unicode normalisation form nf of in into out, by libunistring: the result goes into out's
 * buffer when it fits, else into one libunistring allocates, which out then takes over. ASCII
 * text is its own NFC, NFD, NFKC and NFKD, so it skips the library (most prompts are ASCII). */
static int norm_unicode(uninorm_t nf, const struct bytes *in, struct bytes *out) {
    bool ascii = true;
    for (size_t i = 0; i < in->n && ascii; i++) ascii = (uint8_t)in->p[i] < 0x80;
    out->n = 0;
    if (ascii) return bytes_put(out, in->p, in->n);
    size_t len = out->cap;
    uint8_t *buf = (uint8_t *)out->p;
    uint8_t *res = u8_normalize(nf, (const uint8_t *)in->p, in->n, buf, &len);
    if (!res) return errno == ENOMEM ? -ENOMEM : -EILSEQ; /* the input was checked: only ENOMEM */
    if (res != buf) {
        free(out->p);
        out->p = (char *)res;
        out->cap = len;
    }
    out->n = len;
    return 0;
}

/* Normalizes, pre-tokenizes and BPE-encodes one stretch of text between added tokens. */
static int encode_section(struct enc *e, const char *s, size_t n, bool first) {
    const msm_tokenizer *t = e->t;
    int r;
    e->norm.n = 0;
    if ((r = bytes_put(&e->norm, s, n)) < 0) return r;
    for (int i = 0; i < t->n_norm; i++) {
        const struct norm_step *st = &t->norm[i];
        if (st->type == NORM_UNICODE) {
            if ((r = norm_unicode(st->nf, &e->norm, &e->tmp)) < 0) return r;
        } else if (st->type == NORM_LOWERCASE) {
            if ((r = norm_lowercase(&e->norm, &e->tmp)) < 0) return r;
        } else if (st->type == NORM_PREPEND) {
            if (e->norm.n == 0) continue; /* Prepend leaves an empty string alone */
            e->tmp.n = 0;
            if (bytes_put(&e->tmp, st->s, st->s_len) < 0 || bytes_put(&e->tmp, e->norm.p, e->norm.n) < 0)
                return -ENOMEM;
        } else {
            size_t pos = 0, a, b;
            e->tmp.n = 0;
            for (;;) {
                int f = pattern_next(&st->pat, e->md, e->norm.p, e->norm.n, pos, &a, &b);
                if (f < 0) return f;
                if (bytes_put(&e->tmp, e->norm.p + pos, (f ? a : e->norm.n) - pos) < 0) return -ENOMEM;
                if (!f) break;
                if (bytes_put(&e->tmp, st->s, st->s_len) < 0) return -ENOMEM;
                pos = b;
            }
        }
        struct bytes sw = e->norm;
        e->norm = e->tmp;
        e->tmp = sw;
    }
    pieces_clear(&e->a);
    if ((r = pieces_add(&e->a, e->norm.p, e->norm.n, first)) < 0) return r;
    for (int i = 0; i < t->n_pre; i++)
        if ((r = pre_step(e, &t->pre[i])) < 0) return r;
    for (size_t i = 0; i < e->a.n; i++)
        if ((r = encode_word(e, e->a.buf.p + e->a.v[i].off, e->a.v[i].len)) < 0) return r;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_word(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (uint8_t)c >= 0x80;
}

/* Finds the leftmost-longest added token in text[from, n); returns its index or -1, with the
 * span it covers (lstrip/rstrip widen it over whitespace). */
static int find_added(const msm_tokenizer *t, const char *text, size_t n, size_t from, unsigned flags,
                      size_t *ret_a, size_t *ret_b) {
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[(uint8_t)text[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const struct added_token *at = &t->added[k];
            if (at->special && !(flags & MSM_TOK_PARSE_SPECIAL)) continue;
            if (at->len > n - i || memcmp(text + i, at->content, at->len) != 0) continue;
            if (at->single_word && ((i > 0 && is_word(text[i - 1])) || (i + at->len < n && is_word(text[i + at->len]))))
                continue;
            if (best < 0 || at->len > t->added[best].len) best = k;
        }
        if (best >= 0) {
            size_t a = i, b = i + t->added[best].len;
            if (t->added[best].lstrip)
                while (a > from && is_space(text[a - 1])) a--;
            if (t->added[best].rstrip)
                while (b < n && is_space(text[b])) b++;
            *ret_a = a;
            *ret_b = b;
            return best;
        }
    }
    return -1;
}

int msm_tokenizer_encode_flags(const msm_tokenizer *t, const char *text, size_t len, unsigned flags,
                               int32_t **ret_ids, size_t *ret_n, msm_err *err) {
    if (!text && len) return msm_err_set(err, -EINVAL, "encode: text is NULL");
    size_t bad = utf8_invalid_at(text, len);
    if (bad < len) return msm_err_set(err, -EINVAL, "encode: the text is not valid UTF-8 at byte %zu", bad);
    struct ids out = {0};
    struct enc e = {.t = t, .out = &out};
    int r = 0;
    e.md = pcre2_match_data_create(16, NULL);
    if (!e.md) r = -ENOMEM;
    if (!r && len >= 16384 && t->n_pre > 0 && !(e.cache = calloc(CACHE_SLOTS, sizeof *e.cache))) r = -ENOMEM;
    if (!r && (flags & MSM_TOK_ADD_SPECIAL))
        for (int i = 0; i < t->n_post_prefix && !r; i++) r = ids_push(&out, t->post_prefix[i]);
    size_t pos = 0;
    while (!r && pos < len) {
        size_t a = len, b = len;
        int k = t->n_added ? find_added(t, text, len, pos, flags, &a, &b) : -1;
        if (a > pos) r = encode_section(&e, text + pos, a - pos, pos == 0);
        if (!r && k >= 0) r = ids_push(&out, t->added[k].id);
        pos = k >= 0 ? b : len;
    }
    if (!r && (flags & MSM_TOK_ADD_SPECIAL))
        for (int i = 0; i < t->n_post_suffix && !r; i++) r = ids_push(&out, t->post_suffix[i]);
    pcre2_match_data_free(e.md);
    free(e.a.buf.p);
    free(e.a.v);
    free(e.b.buf.p);
    free(e.b.v);
    free(e.norm.p);
    free(e.tmp.p);
    free(e.sym);
    free(e.heap);
    free(e.cache);
    free(e.cache_keys.p);
    free(e.cache_ids.v);
    if (r < 0) {
        free(out.v);
        if (r == -ENOMEM) return msm_err_set(err, r, "encode: out of memory");
        if (r == -EILSEQ) return msm_err_set(err, r, "encode: Unicode normalisation failed (libunistring)");
        return msm_err_set(err, r, "encode: the pre-tokenizer regex failed to match (PCRE2 error)");
    }
    *ret_ids = out.v;
    *ret_n = out.n;
    return 0;
}

int msm_tokenizer_encode(const msm_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ret_ids,
                         size_t *ret_n, msm_err *err) {
    return msm_tokenizer_encode_flags(t, text, len, MSM_TOK_PARSE_SPECIAL | (add_special ? MSM_TOK_ADD_SPECIAL : 0),
                                      ret_ids, ret_n, err);
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
        if (bytes_put(&raw, d, l) < 0) r = msm_err_set(err, -ENOMEM, "decode: out of memory");
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
