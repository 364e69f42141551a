/* msm_tokenizer, encoding (see msm_tokenizer.h).
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
 * and pushes the two new neighbour pairs; stale entries are recognised and skipped. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unicase.h>

#include "tokenizer_internal.h"

/* ---------------------------------------------------------------------------------------------
 * Scratch: ids and pre-token lists. */

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
    if (msm__tok_bytes_put(&p->buf, s, len) < 0) return -ENOMEM;
    p->v[p->n++] = (struct span){off, len, first};
    return 0;
}

static void pieces_clear(struct pieces *p) {
    p->buf.n = 0;
    p->n = 0;
}

/* Returns the offset of the first invalid byte, or len when s is valid UTF-8. */
static size_t utf8_invalid_at(const char *s, size_t len) {
    size_t i = 0, l;
    while (i < len) {
        if ((uint8_t)s[i] < 0x80) { i++; continue; }
        if (msm__tok_utf8_seq((const uint8_t *)s + i, len - i, &l) != 1) return i;
        i += l;
    }
    return len;
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
    uint32_t rank = msm__tok_merge_find(e->t, e->sym[pos].id, e->sym[right].id, &nid);
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
                if (msm__tok_bytes_put(&e->tmp, tmp, msm__tok_utf8_put(tmp, msm__tok_byte_to_cp((uint8_t)s[i]))) < 0) return -ENOMEM;
            id = msm__tok_vocab_find(t, e->tmp.p, e->tmp.n);
        } else {
            id = msm__tok_vocab_find(t, s, len);
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
            if (msm__tok_utf8_seq((const uint8_t *)s + i, len - i, &l) != 1) l = 1;
            int32_t id = msm__tok_vocab_find(t, s + i, l);
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
    uint64_t h = msm__tok_hash_bytes(s, len);
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
    if (msm__tok_bytes_put(&e->cache_keys, s, len) < 0) return -ENOMEM;
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
                if (msm__tok_bytes_put(&e->tmp, " ", 1) < 0 || msm__tok_bytes_put(&e->tmp, s, n) < 0) return -ENOMEM;
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
                if (msm__tok_bytes_put(&e->tmp, rep, rl) < 0) return -ENOMEM;
            for (size_t k = 0; k < n; k++)
                if ((s[k] == ' ' ? msm__tok_bytes_put(&e->tmp, rep, rl) : msm__tok_bytes_put(&e->tmp, s + k, 1)) < 0) return -ENOMEM;
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
            if (msm__tok_bytes_put(out, &c, 1) < 0) return -ENOMEM;
            continue;
        }
        if (msm__tok_utf8_seq((const uint8_t *)in->p + i, in->n - i, &l) != 1) return -EILSEQ;
        uint8_t small[32], *res;
        size_t len = sizeof small;
        res = u8_tolower((const uint8_t *)in->p + i, l, NULL, NULL, small, &len);
        if (!res) return errno == ENOMEM ? -ENOMEM : -EILSEQ;
        int r = msm__tok_bytes_put(out, res, len);
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
    if (ascii) return msm__tok_bytes_put(out, in->p, in->n);
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
    if ((r = msm__tok_bytes_put(&e->norm, s, n)) < 0) return r;
    for (int i = 0; i < t->n_norm; i++) {
        const struct norm_step *st = &t->norm[i];
        if (st->type == NORM_UNICODE) {
            if ((r = norm_unicode(st->nf, &e->norm, &e->tmp)) < 0) return r;
        } else if (st->type == NORM_LOWERCASE) {
            if ((r = norm_lowercase(&e->norm, &e->tmp)) < 0) return r;
        } else if (st->type == NORM_PREPEND) {
            if (e->norm.n == 0) continue; /* Prepend leaves an empty string alone */
            e->tmp.n = 0;
            if (msm__tok_bytes_put(&e->tmp, st->s, st->s_len) < 0 || msm__tok_bytes_put(&e->tmp, e->norm.p, e->norm.n) < 0)
                return -ENOMEM;
        } else {
            size_t pos = 0, a, b;
            e->tmp.n = 0;
            for (;;) {
                int f = pattern_next(&st->pat, e->md, e->norm.p, e->norm.n, pos, &a, &b);
                if (f < 0) return f;
                if (msm__tok_bytes_put(&e->tmp, e->norm.p + pos, (f ? a : e->norm.n) - pos) < 0) return -ENOMEM;
                if (!f) break;
                if (msm__tok_bytes_put(&e->tmp, st->s, st->s_len) < 0) return -ENOMEM;
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
