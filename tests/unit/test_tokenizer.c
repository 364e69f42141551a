/* Tests of msm_tokenizer: GPT-2 byte-level BPE against Hugging Face's reference encodings,
 * a Qwen2-style tokenizer (NFC normalizer, Qwen2 split regex; tests/golden/
 * make_qwen_style_tokenizer.py) and its variants over every supported normalizer against Hugging
 * Face's, the llama2.c tok512 SentencePiece BPE (converted by tools/convert-tok512) against a port
 * of llama2.c's encoder, streaming detokenisation, special tokens and load errors.
 * Data (read from the project root, meson's test workdir): tests/data/tokenizer/. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_tokenizer.h"

#define GPT2_JSON "tests/data/tokenizer/gpt2/tokenizer.json"
#define GPT2_REF "tests/data/tokenizer/reference_encodings.jsonl"
#define TOK512_JSON "models/stories260k-moe/tokenizer.json"
#define TOK512_REF "tests/data/tokenizer/tok512_reference.jsonl"
#define QWEN_JSON "tests/data/tokenizer/qwen-style/tokenizer.json"
#define QWEN_REF "tests/data/tokenizer/qwen_style_reference.jsonl"

static msm_tokenizer *load(const char *path) {
    msm_tokenizer *t = NULL;
    msm_err err = {{0}};
    int r = msm_tokenizer_load(path, &t, &err);
    cr_assert_eq(r, 0, "load %s: %d %s", path, r, err.msg);
    return t;
}

/* Calls fn on every record of a JSON-lines file; returns the number of records. */
static int each_record(const char *path, void (*fn)(json_object *rec, void *ctx), void *ctx) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_object *rec = json_tokener_parse(line);
        cr_assert_not_null(rec, "%s: bad JSON line %d", path, n + 1);
        fn(rec, ctx);
        json_object_put(rec);
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

static void expect_ids(const char *what, const char *text, const int32_t *ids, size_t n, json_object *want) {
    cr_assert_eq(n, json_object_array_length(want), "%s %s: %zu ids, want %zu", what, text, n,
                 json_object_array_length(want));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], json_object_get_int(json_object_array_get_idx(want, i)), "%s \"%s\": id %zu is %d, want %d",
                     what, text, i, ids[i], json_object_get_int(json_object_array_get_idx(want, i)));
}

/* ---- GPT-2 against Hugging Face tokenizers' reference encodings ---- */

static void check_gpt2_record(json_object *rec, void *ctx) {
    const msm_tokenizer *t = ctx;
    json_object *jt = json_object_object_get(rec, "text");
    const char *text = json_object_get_string(jt);
    size_t len = (size_t)json_object_get_string_len(jt);
    int32_t *ids = NULL;
    size_t n = 0;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, text, len, false, &ids, &n, &err), 0, "%s", err.msg);
    expect_ids("gpt2", text, ids, n, json_object_object_get(rec, "ids"));

    char *back = NULL;
    size_t blen = 0;
    cr_assert_eq(msm_tokenizer_decode(t, ids, n, false, &back, &blen, &err), 0, "%s", err.msg);
    cr_assert(blen == len && memcmp(back, text, len) == 0, "decode(encode(\"%s\")) gave \"%s\"", text, back);
    free(back);
    free(ids);

    json_object *plain = NULL;
    if (json_object_object_get_ex(rec, "ids_if_special_tokens_not_parsed", &plain)) {
        cr_assert_eq(msm_tokenizer_encode_flags(t, text, len, 0, &ids, &n, &err), 0, "%s", err.msg);
        expect_ids("gpt2 (specials not parsed)", text, ids, n, plain);
        free(ids);
    }
}

Test(tokenizer_gpt2, reproduces_every_reference_encoding) {
    msm_tokenizer *t = load(GPT2_JSON);
    cr_assert_eq(msm_tokenizer_vocab_size(t), 50257);
    int n = each_record(GPT2_REF, check_gpt2_record, t);
    cr_assert_geq(n, 100, "only %d reference records", n);
    msm_tokenizer_free(t);
}

/* Joined with <|endoftext|> (which pre-tokenization never crosses) and repeated, the records
 * make a text long enough for the per-call word cache; its ids must be the records' ids. */
struct joined {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
};

static void join_record(json_object *rec, void *ctx) {
    struct joined *j = ctx;
    json_object *jt = json_object_object_get(rec, "text"), *ids = json_object_object_get(rec, "ids");
    size_t l = (size_t)json_object_get_string_len(jt), n = json_object_array_length(ids);
    j->text = realloc(j->text, j->len + l + 14);
    memcpy(j->text + j->len, json_object_get_string(jt), l);
    memcpy(j->text + j->len + l, "<|endoftext|>", 13);
    j->len += l + 13;
    j->ids = realloc(j->ids, (j->n + n + 1) * sizeof *j->ids);
    for (size_t i = 0; i < n; i++) j->ids[j->n++] = json_object_get_int(json_object_array_get_idx(ids, i));
    j->ids[j->n++] = 50256;
}

Test(tokenizer_gpt2, long_text_with_word_cache_matches_reference) {
    msm_tokenizer *t = load(GPT2_JSON);
    struct joined j = {0};
    while (j.len < 3 * 16384) each_record(GPT2_REF, join_record, &j);
    int32_t *ids;
    size_t n;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, j.text, j.len, false, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, j.n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], j.ids[i], "id %zu: %d, want %d", i, ids[i], j.ids[i]);
    free(ids);
    free(j.text);
    free(j.ids);
    msm_tokenizer_free(t);
}

Test(tokenizer_gpt2, parses_endoftext_only_when_asked) {
    msm_tokenizer *t = load(GPT2_JSON);
    const char *s = "a<|endoftext|>b";
    int32_t *ids;
    size_t n;
    cr_assert_eq(msm_tokenizer_encode(t, s, strlen(s), false, &ids, &n, NULL), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[1], 50256);
    cr_assert(msm_tokenizer_is_special(t, 50256));
    char *text;
    size_t len;
    cr_assert_eq(msm_tokenizer_decode(t, ids, n, true, &text, &len, NULL), 0);
    cr_assert_str_eq(text, "ab");
    free(text);
    free(ids);
    cr_assert_eq(msm_tokenizer_encode_flags(t, s, strlen(s), 0, &ids, &n, NULL), 0);
    for (size_t i = 0; i < n; i++) cr_assert_neq(ids[i], 50256);
    free(ids);
    cr_assert_eq(msm_tokenizer_token_id(t, "<|endoftext|>"), 50256);
    cr_assert_eq(msm_tokenizer_token_id(t, "Ġworld"), 995);
    cr_assert_eq(msm_tokenizer_token_id(t, "no such piece"), -ENOENT);
    cr_assert_eq(msm_tokenizer_bos_id(t), -ENOENT);
    msm_tokenizer_free(t);
}

Test(tokenizer_gpt2, empty_text_gives_no_tokens) {
    msm_tokenizer *t = load(GPT2_JSON);
    int32_t *ids = (int32_t *)1;
    size_t n = 99;
    cr_assert_eq(msm_tokenizer_encode(t, "", 0, true, &ids, &n, NULL), 0);
    cr_assert_eq(n, 0);
    free(ids);
    char *text;
    size_t len;
    cr_assert_eq(msm_tokenizer_decode(t, NULL, 0, false, &text, &len, NULL), 0);
    cr_assert_eq(len, 0);
    cr_assert_str_eq(text, "");
    free(text);
    msm_tokenizer_free(t);
}

Test(tokenizer_gpt2, rejects_invalid_utf8_and_out_of_range_ids) {
    msm_tokenizer *t = load(GPT2_JSON);
    int32_t *ids;
    size_t n;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, "ab\xff", 3, false, &ids, &n, &err), -EINVAL);
    cr_assert(strstr(err.msg, "UTF-8") && strstr(err.msg, "byte 2"), "%s", err.msg);
    int32_t bad[] = {15496, 50257};
    char *text;
    size_t len;
    cr_assert_eq(msm_tokenizer_decode(t, bad, 2, false, &text, &len, &err), -EINVAL);
    cr_assert(strstr(err.msg, "50257") && strstr(err.msg, "[0, 50257)"), "%s", err.msg);
    int32_t neg = -1;
    cr_assert_eq(msm_tokenizer_decode(t, &neg, 1, false, &text, &len, &err), -EINVAL);
    msm_detok d;
    msm_detok_init(&d, t, 0);
    char out[64];
    cr_assert_eq(msm_detok_push(&d, 70000, out, sizeof out, &len, &err), -EINVAL);
    msm_tokenizer_free(t);
}

/* ---- Streaming detokenisation ---- */

/* Pushes ids one by one; every chunk must be valid UTF-8 and all of them together the text. */
static void stream_and_compare(const msm_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                               const char *want) {
    msm_detok d;
    msm_detok_init(&d, t, flags);
    size_t cap = msm_detok_max_out(t), len, total = 0;
    char *out = malloc(cap), all[1024];
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(msm_detok_push(&d, ids[i], out, cap, &len, NULL), 0);
        /* A chunk never ends inside a character. */
        if (len) {
            const unsigned char *u = (const unsigned char *)out + len - 1;
            size_t back = 0;
            while (back < len && (*u & 0xC0) == 0x80) u--, back++;
            size_t need = *u < 0x80 ? 1 : *u >= 0xF0 ? 4 : *u >= 0xE0 ? 3 : 2;
            cr_assert_eq(back + 1, need, "chunk %zu ends inside a character", i);
        }
        cr_assert_lt(total + len, sizeof all);
        memcpy(all + total, out, len);
        total += len;
    }
    cr_assert_eq(msm_detok_flush(&d, out, cap, &len), 0);
    memcpy(all + total, out, len);
    total += len;
    all[total] = 0;
    cr_assert_str_eq(all, want);
    free(out);
}

Test(tokenizer_detok, holds_back_characters_split_over_byte_tokens) {
    msm_tokenizer *t = load(GPT2_JSON);
    const char *s = "日本語のテキスト 🐉🤗 naïve 👨‍👩‍👧";
    int32_t *ids;
    size_t n;
    cr_assert_eq(msm_tokenizer_encode(t, s, strlen(s), false, &ids, &n, NULL), 0);
    cr_assert_gt(n, 10);
    stream_and_compare(t, ids, n, 0, s);
    free(ids);
    msm_tokenizer_free(t);
}

Test(tokenizer_detok, invalid_bytes_become_replacement_characters) {
    msm_tokenizer *t = load(GPT2_JSON);
    /* GPT-2 pieces of single bytes: "\xe6" (U+00E6 'æ' stands for byte 0xE6), "\xa5" and "A". */
    int32_t e6 = msm_tokenizer_token_id(t, "æ"), a5 = msm_tokenizer_token_id(t, "¥");
    int32_t a = msm_tokenizer_token_id(t, "A");
    cr_assert(e6 >= 0 && a5 >= 0 && a >= 0);
    int32_t ids[] = {e6, a5, a, e6};
    stream_and_compare(t, ids, 4, 0, "\xef\xbf\xbd" "A" "\xef\xbf\xbd");
    char *text;
    size_t len;
    cr_assert_eq(msm_tokenizer_decode(t, ids, 4, false, &text, &len, NULL), 0);
    cr_assert_str_eq(text, "\xef\xbf\xbd" "A" "\xef\xbf\xbd");
    free(text);
    msm_tokenizer_free(t);
}

Test(tokenizer_detok, reports_small_buffers_without_losing_state) {
    msm_tokenizer *t = load(GPT2_JSON);
    const char *s = " hello";
    int32_t *ids;
    size_t n, len;
    cr_assert_eq(msm_tokenizer_encode(t, s, strlen(s), false, &ids, &n, NULL), 0);
    msm_detok d;
    msm_detok_init(&d, t, 0);
    char out[64];
    cr_assert_eq(msm_detok_push(&d, ids[0], out, 2, &len, NULL), -ENOSPC);
    cr_assert_eq(msm_detok_push(&d, ids[0], out, sizeof out, &len, NULL), 0);
    cr_assert(len == 6 && memcmp(out, " hello", 6) == 0);
    free(ids);
    msm_tokenizer_free(t);
}

/* ---- Qwen2-style (NFC normalizer, Qwen2 split regex) against Hugging Face ---- */

/* The tokenizer.json "normalizer" of a reference record, as compact JSON (the grouping key). */
static const char *record_normalizer(json_object *rec) {
    return json_object_to_json_string_ext(json_object_object_get(rec, "normalizer"), JSON_C_TO_STRING_PLAIN);
}

/* Encodes the record's text and compares the ids, decode() and the streamed decode with HF's. */
static void check_qwen_record(const msm_tokenizer *t, json_object *rec) {
    json_object *jt = json_object_object_get(rec, "text"), *jd = json_object_object_get(rec, "decoded");
    const char *text = json_object_get_string(jt), *norm = record_normalizer(rec);
    size_t len = (size_t)json_object_get_string_len(jt);
    int32_t *ids = NULL;
    size_t n = 0;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, text, len, false, &ids, &n, &err), 0, "%s: %s", norm, err.msg);
    expect_ids(norm, text, ids, n, json_object_object_get(rec, "ids"));
    char *back = NULL;
    size_t blen = 0;
    cr_assert_eq(msm_tokenizer_decode(t, ids, n, false, &back, &blen, &err), 0, "%s", err.msg);
    cr_assert(blen == (size_t)json_object_get_string_len(jd) && memcmp(back, json_object_get_string(jd), blen) == 0,
              "%s: decode(encode(\"%s\")) gave \"%s\", HF \"%s\"", norm, text, back, json_object_get_string(jd));
    stream_and_compare(t, ids, n, 0, back);
    free(back);
    free(ids);
}

struct qwen_file_ctx {
    const msm_tokenizer *t;
    int n;
};

static void check_qwen_file_record(json_object *rec, void *ctx) {
    struct qwen_file_ctx *c = ctx;
    if (strcmp(record_normalizer(rec), "{\"type\":\"NFC\"}") != 0) return;
    check_qwen_record(c->t, rec);
    c->n++;
}

Test(tokenizer_qwen_style, nfc_file_reproduces_every_reference_encoding) {
    msm_tokenizer *t = load(QWEN_JSON);
    cr_assert_eq(msm_tokenizer_vocab_size(t), 50259);
    struct qwen_file_ctx c = {t, 0};
    each_record(QWEN_REF, check_qwen_file_record, &c);
    cr_assert_geq(c.n, 30, "only %d NFC records", c.n);
    msm_tokenizer_free(t);
}

/* The reference records of every normalizer: the tokenizer of a group is the committed file with
 * its "normalizer" replaced by the record's, loaded from memory. */
struct qwen_variant_ctx {
    json_object *root; /* the parsed qwen-style tokenizer.json */
    char norm[512];    /* the normalizer of tok */
    msm_tokenizer *tok;
    int n_records, n_normalizers;
};

static void check_qwen_variant_record(json_object *rec, void *ctx) {
    struct qwen_variant_ctx *c = ctx;
    const char *norm = record_normalizer(rec);
    if (!c->tok || strcmp(norm, c->norm) != 0) {
        msm_tokenizer_free(c->tok);
        c->tok = NULL;
        cr_assert_lt(strlen(norm), sizeof c->norm);
        strcpy(c->norm, norm);
        json_object_object_add(c->root, "normalizer", json_object_get(json_object_object_get(rec, "normalizer")));
        size_t len;
        const char *j = json_object_to_json_string_length(c->root, JSON_C_TO_STRING_PLAIN, &len);
        msm_err err = {{0}};
        cr_assert_eq(msm_tokenizer_load_buffer(j, len, "qwen-variant", &c->tok, &err), 0, "%s: %s", norm, err.msg);
        c->n_normalizers++;
    }
    check_qwen_record(c->tok, rec);
    c->n_records++;
}

Test(tokenizer_qwen_style, every_normalizer_reproduces_every_reference_encoding) {
    struct qwen_variant_ctx c = {.root = json_object_from_file(QWEN_JSON)};
    cr_assert_not_null(c.root, "cannot parse %s", QWEN_JSON);
    int n = each_record(QWEN_REF, check_qwen_variant_record, &c);
    cr_assert_eq(c.n_records, n);
    cr_assert_geq(n, 250, "only %d reference records", n);
    cr_assert_geq(c.n_normalizers, 8, "only %d normalizers", c.n_normalizers);
    msm_tokenizer_free(c.tok);
    json_object_put(c.root);
}

/* Encodes s with t into a fixed array; returns the count. */
static size_t encode_into(const msm_tokenizer *t, const char *s, int32_t *out, size_t cap) {
    int32_t *ids;
    size_t n;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, s, strlen(s), false, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_leq(n, cap);
    memcpy(out, ids, n * sizeof *ids);
    free(ids);
    return n;
}

Test(tokenizer_qwen_style, nfc_composes_but_keeps_compatibility_characters) {
    msm_tokenizer *t = load(QWEN_JSON);
    int32_t a[32], b[32];
    /* Decomposed and precomposed e-acute, Hangul jamo and syllables: the same ids. */
    size_t na = encode_into(t, "cafe\u0301 \u1112\u1161\u11ab", a, 32);
    size_t nb = encode_into(t, "caf\u00e9 \ud55c", b, 32);
    cr_assert(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    /* The fi ligature is no canonical equivalent of "fi": NFC keeps it (NFKC would not). */
    na = encode_into(t, "\ufb01", a, 32);
    nb = encode_into(t, "fi", b, 32);
    cr_assert(na != nb || memcmp(a, b, na * sizeof *a) != 0);
    /* The Qwen2 regex gives every digit its own piece. */
    na = encode_into(t, "2024", a, 32);
    cr_assert_eq(na, 4);
    for (int i = 0; i < 4; i++) {
        char digit[2] = {"2024"[i], 0};
        cr_assert_str_eq(msm_tokenizer_token_piece(t, a[i]), digit);
    }
    msm_tokenizer_free(t);
}

/* Long NFC text (word cache on) joined by <|endoftext|>: the ids are the records' ids. */
static void join_nfc_record(json_object *rec, void *ctx) {
    if (strcmp(record_normalizer(rec), "{\"type\":\"NFC\"}") == 0) join_record(rec, ctx);
}

Test(tokenizer_qwen_style, long_nfc_text_with_word_cache_matches_reference) {
    msm_tokenizer *t = load(QWEN_JSON);
    struct joined j = {0};
    while (j.len < 3 * 16384) each_record(QWEN_REF, join_nfc_record, &j);
    int32_t *ids;
    size_t n;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, j.text, j.len, false, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, j.n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], j.ids[i], "id %zu: %d, want %d", i, ids[i], j.ids[i]);
    free(ids);
    free(j.text);
    free(j.ids);
    msm_tokenizer_free(t);
}

/* ---- llama2.c tok512 (SentencePiece BPE with byte fallback) ---- */

static void check_tok512_record(json_object *rec, void *ctx) {
    const msm_tokenizer *t = ctx;
    json_object *jt = json_object_object_get(rec, "text");
    const char *text = json_object_get_string(jt);
    size_t len = (size_t)json_object_get_string_len(jt);
    int32_t *ids;
    size_t n;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_encode(t, text, len, false, &ids, &n, &err), 0, "%s", err.msg);
    expect_ids("tok512", text, ids, n, json_object_object_get(rec, "ids"));
    char *back;
    size_t blen;
    cr_assert_eq(msm_tokenizer_decode(t, ids, n, true, &back, &blen, &err), 0, "%s", err.msg);
    /* The decoder strips the dummy prefix's space, and only that one. */
    const char *want = text;
    cr_assert_str_eq(back, want);
    free(back);
    stream_and_compare(t, ids, n, MSM_DETOK_SKIP_SPECIAL, want);
    free(ids);
    cr_assert_eq(msm_tokenizer_encode(t, text, len, true, &ids, &n, &err), 0, "%s", err.msg);
    expect_ids("tok512 with BOS", text, ids, n, json_object_object_get(rec, "ids_bos"));
    free(ids);
}

Test(tokenizer_tok512, matches_llama2c_encoder_on_tinystories_samples) {
    msm_tokenizer *t = load(TOK512_JSON);
    cr_assert_eq(msm_tokenizer_vocab_size(t), 512);
    int n = each_record(TOK512_REF, check_tok512_record, t);
    cr_assert_geq(n, 5);
    msm_tokenizer_free(t);
}

Test(tokenizer_tok512, adds_bos_only_when_asked_and_never_to_nothing_else) {
    msm_tokenizer *t = load(TOK512_JSON);
    cr_assert_eq(msm_tokenizer_bos_id(t), 1);
    int32_t *ids;
    size_t n;
    cr_assert_eq(msm_tokenizer_encode(t, "", 0, true, &ids, &n, NULL), 0);
    cr_assert(n == 1 && ids[0] == 1);
    free(ids);
    cr_assert_eq(msm_tokenizer_encode(t, "", 0, false, &ids, &n, NULL), 0);
    cr_assert_eq(n, 0);
    free(ids);
    /* "<s>" in the text is the special token when parsed, plain characters otherwise. */
    cr_assert_eq(msm_tokenizer_encode(t, "<s>", 3, false, &ids, &n, NULL), 0);
    cr_assert(n == 1 && ids[0] == 1);
    free(ids);
    cr_assert_eq(msm_tokenizer_encode_flags(t, "<s>", 3, 0, &ids, &n, NULL), 0);
    cr_assert_gt(n, 1);
    free(ids);
    msm_tokenizer_free(t);
}

Test(tokenizer_tok512, byte_fallback_pieces_stream_back_to_the_character) {
    msm_tokenizer *t = load(TOK512_JSON);
    const char *s = "A 🐉 and 日本";
    int32_t *ids;
    size_t n;
    cr_assert_eq(msm_tokenizer_encode(t, s, strlen(s), true, &ids, &n, NULL), 0);
    /* 🐉 is F0 9F 90 89: four <0xNN> pieces, ids byte + 3. */
    bool found = false;
    for (size_t i = 0; i + 3 < n; i++)
        found = found || (ids[i] == 0xF0 + 3 && ids[i + 1] == 0x9F + 3 && ids[i + 2] == 0x90 + 3 && ids[i + 3] == 0x89 + 3);
    cr_assert(found);
    stream_and_compare(t, ids, n, MSM_DETOK_SKIP_SPECIAL, s);
    /* A continuation of a shown prompt keeps the dummy prefix's space. */
    stream_and_compare(t, ids, n, MSM_DETOK_SKIP_SPECIAL | MSM_DETOK_CONTINUE, " A 🐉 and 日本");
    free(ids);
    msm_tokenizer_free(t);
}

/* ---- Load errors ---- */

/* Inline strings: Criterion runs each parameter in a new process, where pointers would dangle. */
struct bad_json {
    char json[256];
    int code;
    char msg_part[48];
};

static const struct bad_json bad_jsons[] = {
    {"{\"model\": ", -EINVAL, "invalid JSON"},
    {"not json", -EINVAL, "invalid JSON"},
    {"[1, 2]", -EINVAL, "not a JSON object"},
    {"{\"version\": \"1.0\"}", -EINVAL, "no \"model\""},
    {"{\"model\": {\"type\": \"BPE\"}}", -EINVAL, "no \"vocab\""},
    {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", -ENOTSUP, "Unigram"},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", -EINVAL,
     "the result is not in the vocabulary"},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", -EINVAL, "invalid id"},
    {"{\"normalizer\": {\"type\": \"BertNormalizer\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
     -ENOTSUP, "BertNormalizer"},
    {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"StripAccents\"}]},"
     " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
     -ENOTSUP, "StripAccents"},
    {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"},"
     " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
     -EINVAL, "does not compile"},
    /* found by fuzz_tokenizer: non-array values where arrays belong */
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": 1}", -EINVAL,
     "\"added_tokens\" is not an array"},
    {"{\"post_processor\": {\"type\": \"Sequence\", \"processors\": 7},"
     " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
     -EINVAL, "\"processors\" is not an array"},
};

ParameterizedTestParameters(tokenizer_load, rejects_bad_files_with_a_clear_error) {
    return cr_make_param_array(struct bad_json, bad_jsons, sizeof bad_jsons / sizeof bad_jsons[0]);
}

ParameterizedTest(const struct bad_json *b, tokenizer_load, rejects_bad_files_with_a_clear_error) {
    msm_tokenizer *t = NULL;
    msm_err err = {{0}};
    int r = msm_tokenizer_load_buffer(b->json, strlen(b->json), "bad.json", &t, &err);
    cr_assert_eq(r, b->code, "%s: got %d (%s)", b->json, r, err.msg);
    cr_assert_null(t);
    cr_assert(strstr(err.msg, b->msg_part) && strstr(err.msg, "bad.json"), "message: %s", err.msg);
}

Test(tokenizer_load, missing_file_names_the_path) {
    msm_tokenizer *t = NULL;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_load("tests/data/tokenizer/nope.json", &t, &err), -ENOENT);
    cr_assert(strstr(err.msg, "nope.json"), "%s", err.msg);
    msm_tokenizer_free(NULL);
}

Test(tokenizer_load, minimal_sentencepiece_with_metaspace_round_trips) {
    /* The older Llama tokenizer.json layout: Metaspace pre-tokenizer and decoder. */
    const char *j =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}],"
        " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\"},"
        " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"first\"},"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
        "   \"vocab\": {\"<unk>\": 0, \"\\u2581\": 1, \"a\": 2, \"b\": 3, \"\\u2581a\": 4, \"ab\": 5, \"\\u2581ab\": 6},"
        "   \"merges\": [[\"a\", \"b\"], [\"\\u2581\", \"ab\"], [\"\\u2581\", \"a\"]]}}";
    msm_tokenizer *t = NULL;
    msm_err err = {{0}};
    cr_assert_eq(msm_tokenizer_load_buffer(j, strlen(j), "mini", &t, &err), 0, "%s", err.msg);
    int32_t *ids;
    size_t n;
    cr_assert_eq(msm_tokenizer_encode(t, "ab a xyb", 8, false, &ids, &n, NULL), 0);
    int32_t want[] = {6, 4, 1, 0, 3};
    cr_assert_eq(n, 5);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "id %zu: %d", i, ids[i]);
    char *text;
    size_t len;
    cr_assert_eq(msm_tokenizer_decode(t, ids, 4, false, &text, &len, NULL), 0);
    cr_assert_str_eq(text, "ab a <unk>");
    free(text);
    free(ids);
    msm_tokenizer_free(t);
}
