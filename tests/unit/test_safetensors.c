/* Tests of msm_safetensors: small checkpoints are written into a temporary directory from C,
 * then opened; every error case checks the code and that the message names the file, the
 * tensor and what was expected. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msm_safetensors.h"
#include "testutil.h"

static char dir[64];

static void setup(void) { cr_assert_eq(tmpdir_make(dir, sizeof dir, "st"), 0); }
static void teardown(void) { tmpdir_remove(dir); }

TestSuite(safetensors, .init = setup, .fini = teardown);

/* Writes DIR/name: the 8-byte length of `header`, `header`, then data_len bytes 0, 1, 2, ... */
static void write_raw(const char *name, const char *header, uint64_t hlen_field, size_t data_len) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen_field >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void write_st(const char *name, const char *header, size_t data_len) {
    write_raw(name, header, strlen(header), data_len);
}

static void write_text(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static char *path_of(const char *name) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* Opens DIR/name as one file and expects failure with `code`; returns the message. */
static const char *open_fails(const char *name, int code) {
    static msm_err err;
    msm_safetensors *st = NULL;
    int rc = msm_safetensors_open_file(path_of(name), &st, &err);
    cr_assert_eq(rc, code, "rc %d, expected %d (%s)", rc, code, rc ? err.msg : "no error");
    cr_assert_null(st);
    return err.msg;
}

#define assert_has(msg, s) cr_assert_not_null(strstr((msg), (s)), "'%s' not in: %s", (s), (msg))

/* A valid header: one tensor of each supported dtype plus metadata. */
#define THREE_DTYPES                                                                          \
    "{\"__metadata__\": {\"format\": \"pt\"},"                                                \
    " \"w.f32\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"        \
    " \"w.bf16\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]},"        \
    " \"w.f16\": {\"dtype\": \"F16\", \"shape\": [1, 2, 2], \"data_offsets\": [32, 40]}}"

Test(safetensors, valid_file_with_f32_bf16_f16_tensors_opens_and_points_into_the_file) {
    write_st("model.safetensors", THREE_DTYPES, 40);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_file(path_of("model.safetensors"), &st, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_safetensors_count(st), 3);

    const msm_st_tensor *t = msm_safetensors_find(st, "w.f32");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, MSM_F32);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 2);
    cr_assert_eq(t->shape[1], 3);
    cr_assert_eq(t->nbytes, 24);
    cr_assert_eq(((const uint8_t *)t->data)[0], 0);
    cr_assert_eq(((const uint8_t *)t->data)[23], 23);
    assert_has(t->file, "model.safetensors");

    t = msm_safetensors_find(st, "w.bf16");
    cr_assert_eq(t->dtype, MSM_BF16);
    cr_assert_eq(t->nbytes, 8);
    cr_assert_eq(((const uint8_t *)t->data)[0], 24);
    t = msm_safetensors_find(st, "w.f16");
    cr_assert_eq(t->dtype, MSM_F16);
    cr_assert_eq(t->ndim, 3);
    cr_assert_eq(((const uint8_t *)t->data)[7], 39);
    cr_assert_null(msm_safetensors_find(st, "w.f64"));
    cr_assert_null(msm_safetensors_find(st, "__metadata__"));

    /* at() walks the tensors in name order. */
    cr_assert_str_eq(msm_safetensors_at(st, 0)->name, "w.bf16");
    cr_assert_str_eq(msm_safetensors_at(st, 1)->name, "w.f16");
    cr_assert_str_eq(msm_safetensors_at(st, 2)->name, "w.f32");
    cr_assert_null(msm_safetensors_at(st, 3));
    msm_safetensors_free(st);
}

Test(safetensors, get_checks_the_shape_and_returns_the_tensor) {
    write_st("model.safetensors", THREE_DTYPES, 40);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = NULL;
    cr_assert_eq(msm_safetensors_get(st, "w.f32", 2, (int64_t[]){2, 3}, &t, &err), 0, "%s", err.msg);
    cr_assert_str_eq(t->name, "w.f32");
    msm_safetensors_free(st);
}

Test(safetensors, wrong_shape_names_file_tensor_and_both_shapes) {
    write_st("model.safetensors",
             "{\"model.layers.0.mlp.gate.weight\": {\"dtype\": \"BF16\", \"shape\": [8, 64], "
             "\"data_offsets\": [0, 1024]}}", 1024);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = NULL;
    int rc = msm_safetensors_get(st, "model.layers.0.mlp.gate.weight", 2, (int64_t[]){16, 64}, &t, &err);
    cr_assert_eq(rc, -EINVAL);
    cr_assert_null(t);
    assert_has(err.msg, "model.safetensors: tensor 'model.layers.0.mlp.gate.weight' has shape "
                        "[8, 64], expected [16, 64]");
    rc = msm_safetensors_get(st, "model.layers.0.mlp.gate.weight", 3, (int64_t[]){8, 64, 1}, &t, &err);
    cr_assert_eq(rc, -EINVAL);
    assert_has(err.msg, "expected [8, 64, 1]");
    msm_safetensors_free(st);
}

Test(safetensors, missing_tensor_names_tensor_and_where_it_looked) {
    write_st("model.safetensors", THREE_DTYPES, 40);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = NULL;
    cr_assert_eq(msm_safetensors_get(st, "lm_head.weight", 1, (int64_t[]){4}, &t, &err), -ENOENT);
    assert_has(err.msg, "missing tensor 'lm_head.weight'");
    assert_has(err.msg, dir);
    msm_safetensors_free(st);
}

Test(safetensors, scalar_and_empty_tensors_are_valid) {
    write_st("model.safetensors",
             "{\"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
             " \"z\": {\"dtype\": \"BF16\", \"shape\": [0, 7], \"data_offsets\": [4, 4]}}", 4);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_file(path_of("model.safetensors"), &st, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_safetensors_find(st, "s")->ndim, 0);
    cr_assert_eq(msm_safetensors_find(st, "s")->nbytes, 4);
    cr_assert_eq(msm_safetensors_find(st, "z")->nbytes, 0);
    msm_safetensors_free(st);
}

Test(safetensors, header_padded_with_spaces_is_accepted) {
    write_st("model.safetensors",
             "{\"a\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}}      ", 4);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_file(path_of("model.safetensors"), &st, &err), 0, "%s", err.msg);
    msm_safetensors_free(st);
}

Test(safetensors, open_mem_parses_a_buffer_without_copying_it) {
    const char *h = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    size_t hl = strlen(h);
    uint8_t buf[256] = {(uint8_t)hl};
    memcpy(buf + 8, h, hl);
    memcpy(buf + 8 + hl, "\x01\x02\x03\x04", 4);
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_mem(buf, 8 + hl + 4, "mem.safetensors", &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = msm_safetensors_find(st, "a");
    cr_assert_eq(t->data, buf + 8 + hl);
    cr_assert_str_eq(t->file, "mem.safetensors");
    msm_safetensors_free(st);

    cr_assert_eq(msm_safetensors_open_mem(buf, 8 + hl + 3, "mem.safetensors", &st, &err), -EINVAL);
    assert_has(err.msg, "mem.safetensors: truncated: tensor 'a'");
}

/* ---- sharded checkpoints --------------------------------------------------------------- */

#define SHARD1 "{\"a\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}," \
               " \"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [8, 12]}}"
#define SHARD2 "{\"c\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}}"

Test(safetensors, sharded_index_finds_tensors_in_every_shard) {
    write_st("model-00001-of-00002.safetensors", SHARD1, 12);
    write_st("model-00002-of-00002.safetensors", SHARD2, 12);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
               "\"a\": \"model-00001-of-00002.safetensors\","
               "\"b\": \"model-00001-of-00002.safetensors\","
               "\"c\": \"model-00002-of-00002.safetensors\"}}\n");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_safetensors_count(st), 3);
    assert_has(msm_safetensors_find(st, "a")->file, "model-00001-of-00002.safetensors");
    assert_has(msm_safetensors_find(st, "b")->file, "model-00001-of-00002.safetensors");
    assert_has(msm_safetensors_find(st, "c")->file, "model-00002-of-00002.safetensors");
    cr_assert_eq(msm_safetensors_find(st, "a")->file, msm_safetensors_find(st, "b")->file,
                 "one shard, one mapping");
    cr_assert_eq(msm_safetensors_find(st, "c")->dtype, MSM_F32);
    msm_safetensors_free(st);
}

Test(safetensors, index_entry_missing_from_its_shard_names_shard_and_tensor) {
    write_st("model-00001-of-00002.safetensors", SHARD1, 12);
    write_st("model-00002-of-00002.safetensors", SHARD2, 12);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
               "\"c\": \"model-00002-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -ENOENT);
    cr_assert_null(st);
    assert_has(err.msg, "model-00002-of-00002.safetensors: missing tensor 'model.norm.weight'");
}

Test(safetensors, index_naming_a_missing_shard_names_the_shard) {
    write_st("model-00001-of-00002.safetensors", SHARD1, 12);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
               "\"c\": \"model-00002-of-00002.safetensors\"}}");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -ENOENT);
    assert_has(err.msg, "model-00002-of-00002.safetensors");
    assert_has(err.msg, "index.json");
}

Test(safetensors, index_that_is_not_json_or_lacks_weight_map_is_refused) {
    write_text("model.safetensors.index.json", "{\"weight_map\": ");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -EINVAL);
    assert_has(err.msg, "model.safetensors.index.json: not valid JSON");
    write_text("model.safetensors.index.json", "{\"metadata\": {}}");
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -EINVAL);
    assert_has(err.msg, "weight_map");
}

Test(safetensors, index_shard_outside_the_directory_is_refused) {
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -EINVAL);
    assert_has(err.msg, "tensor 'a'");
}

Test(safetensors, tensor_in_two_shards_names_both) {
    write_st("s1.safetensors", SHARD1, 12);
    write_st("s2.safetensors", "{\"a\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}");
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -ENOENT); /* b is not in s2 */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", "
               "\"x\": \"s2.safetensors\"}}");
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -ENOENT); /* x is not in s2 */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"b\": \"s1.safetensors\", \"a\": \"s2.safetensors\"}}");
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -EINVAL);
    assert_has(err.msg, "tensor 'a' is in both");
    assert_has(err.msg, "s1.safetensors");
    assert_has(err.msg, "s2.safetensors");
}

Test(safetensors, directory_without_weights_is_named_in_the_error) {
    msm_safetensors *st = NULL;
    msm_err err = {0};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), -ENOENT);
    assert_has(err.msg, dir);
    assert_has(err.msg, "model.safetensors");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    cr_assert_eq(msm_safetensors_open_dir(missing, &st, &err), -ENOENT);
    assert_has(err.msg, "nope");
}

/* ---- malformed files ------------------------------------------------------------------- */

Test(safetensors, truncated_file_names_tensor_and_sizes) {
    const char *h = "{\"x\": {\"dtype\": \"F32\", \"shape\": [4, 4], \"data_offsets\": [0, 64]}}";
    write_st("model-00002.safetensors", h, 40);
    char want[128];
    snprintf(want, sizeof want, "truncated: tensor 'x' ends at byte %zu but the file has %zu bytes",
             8 + strlen(h) + 64, 8 + strlen(h) + 40);
    const char *msg = open_fails("model-00002.safetensors", -EINVAL);
    assert_has(msg, "model-00002.safetensors: ");
    assert_has(msg, want);
}

Test(safetensors, header_length_past_the_end_is_refused) {
    write_raw("model.safetensors", "{}", 1000, 0);
    const char *msg = open_fails("model.safetensors", -EINVAL);
    assert_has(msg, "model.safetensors");
    assert_has(msg, "header length 1000 runs past the end of the file (10 bytes)");
    write_raw("model.safetensors", "{}", UINT64_MAX, 0);
    assert_has(open_fails("model.safetensors", -EINVAL), "runs past the end");
}

Test(safetensors, file_shorter_than_the_length_field_is_truncated) {
    write_text("model.safetensors", "abc");
    assert_has(open_fails("model.safetensors", -EINVAL), "model.safetensors: truncated");
    write_text("model.safetensors", "");
    assert_has(open_fails("model.safetensors", -EINVAL), "truncated");
}

Test(safetensors, missing_file_is_enoent) {
    assert_has(open_fails("nothing.safetensors", -ENOENT), "nothing.safetensors: cannot open");
}

/* Headers that are refused, each with text the message must contain. */
/* Criterion runs each parameter in a fresh process, so the table holds arrays, not pointers. */
typedef struct bad_header {
    char header[200];
    size_t data_len;
    char want1[100], want2[20];
} bad_header;

static bad_header bad_headers[] = {
    {"{\"a\": {\"dtype\": \"F32\", ", 0, "header is not valid JSON", ""},
    {"not json at all", 0, "header is not valid JSON", ""},
    {"{\"a\": 1} trailing", 0, "header is not valid JSON", ""},
    {"[1, 2, 3]", 0, "header must be a JSON object", ""},
    {"{\"a\": [1, 2]}", 0, "tensor 'a': entry must be a JSON object", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "tensor 'a'", "data_offsets"},
    {"{\"__metadata__\": 5}", 0, "__metadata__", ""},
    {"{\"a\": {\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'a'", "dtype"},
    {"{\"a\": {\"dtype\": \"Q4\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'a' has unknown dtype 'Q4'", "BF16 or F8_E4M3"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0, 16]}}", 16,
     "tensor 'a': shape must be a list of non-negative integers", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'a': shape must be a list of non-negative integers", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'a': shape", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'a' has 9 dims", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
     "tensor 'a': data_offsets must be two non-negative integers", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}", 4,
     "tensor 'a': data_offsets must be two", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
     "tensor 'a': data_offsets must be two", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8,
     "tensor 'a': data_offsets [8, 4] end before begin", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 18446744073709551615]}}", 4,
     "truncated: tensor 'a'", ""},
    {"{\"a\": {\"dtype\": \"BF16\", \"shape\": [3, 2], \"data_offsets\": [0, 8]}}", 8,
     "tensor 'a' holds 8 bytes but shape [3, 2] of bf16 needs 12", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'a' holds 4 bytes but shape [4294967296, 4294967296, 4] of f32 needs more than", ""},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12,
     "tensors 'a' [0, 8) and 'b' [4, 12) overlap", ""},
};

ParameterizedTestParameters(safetensors, malformed_header_is_refused_with_file_and_tensor) {
    return cr_make_param_array(bad_header, bad_headers, sizeof bad_headers / sizeof bad_headers[0]);
}

ParameterizedTest(bad_header *b, safetensors, malformed_header_is_refused_with_file_and_tensor) {
    write_st("shard.safetensors", b->header, b->data_len);
    const char *msg = open_fails("shard.safetensors", -EINVAL);
    assert_has(msg, "shard.safetensors: ");
    assert_has(msg, b->want1);
    assert_has(msg, b->want2);
}

/* Dtypes the format defines but the loader refuses: the message names tensor and dtype. */
typedef struct refused_dtype {
    char name[16];
    int size;
} refused_dtype;

static refused_dtype refused[] = {
    {"I64", 8}, {"I32", 4}, {"U8", 1}, {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"F64", 8},
};

ParameterizedTestParameters(safetensors, unsupported_dtype_names_tensor_and_dtype) {
    return cr_make_param_array(refused_dtype, refused, sizeof refused / sizeof refused[0]);
}

ParameterizedTest(refused_dtype *d, safetensors, unsupported_dtype_names_tensor_and_dtype) {
    char h[256], want[128];
    snprintf(h, sizeof h, "{\"model.embed_tokens.weight\": {\"dtype\": \"%s\", \"shape\": [2], "
             "\"data_offsets\": [0, %d]}}", d->name, 2 * d->size);
    write_st("model.safetensors", h, (size_t)(2 * d->size));
    snprintf(want, sizeof want, "model.safetensors: tensor 'model.embed_tokens.weight' has dtype %s; "
             "only F32, F16, BF16 and F8_E4M3", d->name);
    assert_has(open_fails("model.safetensors", -EINVAL), want);
}

/* FP8 block-scaled checkpoints: F8_E4M3 weights (1 byte an element) next to float32 scales and
 * bf16 tensors in one file. */
Test(safetensors, f8_e4m3_weights_open_with_their_scales_and_bf16_neighbours) {
    write_st("model.safetensors",
             "{\"a.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [3, 130], \"data_offsets\": [0, 390]},"
             " \"a.weight_scale_inv\": {\"dtype\": \"F32\", \"shape\": [1, 2], \"data_offsets\": [392, 400]},"
             " \"n.weight\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [400, 408]}}", 408);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_file(path_of("model.safetensors"), &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = msm_safetensors_find(st, "a.weight");
    cr_assert_not_null(t);
    cr_expect_eq(t->dtype, MSM_F8_E4M3);
    cr_expect_eq(t->nbytes, 390);
    cr_expect_eq(msm_dtype_size(t->dtype), 1);
    cr_expect_str_eq(msm_dtype_name(t->dtype), "f8_e4m3");
    cr_expect_eq(msm_safetensors_find(st, "a.weight_scale_inv")->dtype, MSM_F32);
    msm_safetensors_free(st);
}

Test(safetensors, f8_e4m3_with_the_wrong_byte_count_names_the_dtype) {
    write_st("model.safetensors",
             "{\"a.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [3, 4], \"data_offsets\": [0, 24]}}", 24);
    assert_has(open_fails("model.safetensors", -EINVAL), "holds 24 bytes but shape [3, 4] of f8_e4m3 needs 12");
}
