/* The tokenizer's internals, shared by tokenizer/load.c, encode.c and decode.c: the layout of a
 * loaded tokenizer (immutable after load) and the few helpers more than one of them uses. The rest
 * of the project includes msm_tokenizer.h only. */
#ifndef MSM_TOKENIZER_INTERNAL_H
#define MSM_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uninorm.h>

#include "msm_tokenizer.h"

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

/* A growable byte buffer (scratch of one call). */
struct bytes {
    char *p;
    size_t n, cap;
};

/* Appends n bytes of s (load.c). 0 or -ENOMEM. */
int msm__tok_bytes_put(struct bytes *b, const void *s, size_t n);

/* GPT-2's bytes_to_unicode: the code point that stands for byte b (load.c). */
uint32_t msm__tok_byte_to_cp(int b);

/* The vocabulary and merge tables (load.c builds them): FNV-1a of n bytes; the id of a piece or
 * -1; the rank of merging ids (a, b) and its result *ret_new, or UINT32_MAX. */
uint64_t msm__tok_hash_bytes(const char *s, size_t n);
int32_t msm__tok_vocab_find(const msm_tokenizer *t, const char *s, size_t n);
uint32_t msm__tok_merge_find(const msm_tokenizer *t, int32_t a, int32_t b, int32_t *ret_new);

/* UTF-8 (decode.c): the sequence at s[0..n) (1: a character of *ret_len bytes, 0: a truncated
 * prefix, -1: invalid, *ret_len its maximal invalid subpart); code point cp written to out (at
 * most 3 bytes: cp < 0x10000), returns its length. */
int msm__tok_utf8_seq(const uint8_t *s, size_t n, size_t *ret_len);
size_t msm__tok_utf8_put(char *out, uint32_t cp);

#endif
