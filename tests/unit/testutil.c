/* Shared helpers of the unit tests (see testutil.h). */
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int npy_load_f32(const char *path, float **ret, int *rows, int *cols) {
    FILE *f = fopen(path, "rb");
    if (!f) return -errno;
    unsigned char head[10];
    int r = -EINVAL;
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) goto out;
    size_t hl = (size_t)head[8] | ((size_t)head[9] << 8);
    char hdr[1024];
    if (hl >= sizeof hdr || fread(hdr, 1, hl, f) != hl) goto out;
    hdr[hl] = 0;
    if (!strstr(hdr, "'<f4'") || strstr(hdr, "'fortran_order': True")) goto out;
    char *s = strstr(hdr, "'shape': (");
    if (!s || sscanf(s, "'shape': (%d, %d)", rows, cols) != 2) goto out;
    size_t n = (size_t)*rows * (size_t)*cols;
    *ret = malloc(sizeof(float) * n);
    if (!*ret) {
        r = -ENOMEM;
        goto out;
    }
    if (fread(*ret, sizeof(float), n, f) != n) {
        free(*ret);
        goto out;
    }
    r = 0;
out:
    fclose(f);
    return r;
}

static int ids_from(json_object *arr, int32_t **ret) {
    int n = (int)json_object_array_length(arr);
    *ret = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) (*ret)[i] = json_object_get_int(json_object_array_get_idx(arr, (size_t)i));
    return n;
}

int golden_load(const char *dir, golden *g) {
    memset(g, 0, sizeof *g);
    char path[512];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_object *root = json_object_from_file(path);
    if (!root) return -ENOENT;
    json_object *prompts, *gens, *files;
    if (!json_object_object_get_ex(root, "prompts", &prompts) ||
        !json_object_object_get_ex(root, "generated", &gens) ||
        !json_object_object_get_ex(root, "files", &files)) {
        json_object_put(root);
        return -EINVAL;
    }
    g->n = (int)json_object_array_length(prompts);
    if (g->n > GOLDEN_MAX_PROMPTS) g->n = GOLDEN_MAX_PROMPTS;
    int r = 0;
    for (int i = 0; i < g->n && r == 0; i++) {
        g->prompt_len[i] = ids_from(json_object_array_get_idx(prompts, (size_t)i), &g->prompt[i]);
        g->gen_len[i] = ids_from(json_object_array_get_idx(gens, (size_t)i), &g->gen[i]);
        snprintf(path, sizeof path, "%s/%s", dir,
                 json_object_get_string(json_object_array_get_idx(files, (size_t)i)));
        r = npy_load_f32(path, &g->logits[i], &g->rows[i], &g->cols[i]);
    }
    json_object_put(root);
    return r;
}

void golden_done(golden *g) {
    for (int i = 0; i < g->n; i++) {
        free(g->prompt[i]);
        free(g->gen[i]);
        free(g->logits[i]);
    }
}

msm_engine_opts test_engine_opts(const char *model_dir, int tp, bool fuse, bool multi_stream) {
    msm_engine_opts o;
    msm_engine_opts_default(&o);
    o.model_dir = model_dir;
    o.tp = tp;
    o.fuse_allreduce = fuse;
    o.multi_stream = multi_stream;
    /* (false, false) is the plain graph, the reference every pass combination must equal; the
     * other combinations also run the always-on rewrites (tp-1 collective elision, add+norm, MoE
     * combine, RoPE + K/V write, all-reduce + add + norm, router + top-k, linear + add + norm) */
    o.elide_collectives = o.fuse_add_norm = o.fuse_moe_combine = o.fuse_rope_kv = o.fuse_allreduce_norm =
        o.fuse_router = o.fuse_linear_norm = fuse || multi_stream;
    o.router_first = o.fork_before_norm = multi_stream;
    o.prefetch_l2 = o.prefetch_l2_next = o.prefetch_kv = multi_stream; /* hints: nothing changes, but their aux
                                                                          nodes run */
    o.kv_blocks = 64;
    o.max_step_tokens = 64;
    o.max_seqs = 8;
    o.deadline_ms = 10000;
    return o;
}

double rel_max_diff(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > mr) mr = fabs((double)b[i]);
    }
    return mr > 0 ? md / mr : md;
}

const msm_tokenizer *test_stories_tokenizer(void) {
    static msm_tokenizer *t;
    msm_err err;
    if (!t)
        cr_assert_eq(msm_tokenizer_load("models/stories260k-moe/tokenizer.json", &t, &err), 0, "%s", err.msg);
    return t;
}

int test_script_of(const char *text, int32_t *out, int cap) {
    int32_t *ids;
    size_t n;
    msm_err err;
    cr_assert_eq(text[0], ' ');
    text++;
    cr_assert_eq(msm_tokenizer_encode_flags(test_stories_tokenizer(), text, strlen(text), 0, &ids, &n, &err), 0,
                 "%s", err.msg);
    cr_assert_leq(n, (size_t)cap);
    memcpy(out, ids, n * sizeof *ids);
    free(ids);
    return (int)n;
}

void test_streamed_text(const int32_t *ids, int n, char *out, size_t cap) {
    msm_detok d;
    msm_detok_init(&d, test_stories_tokenizer(), MSM_DETOK_SKIP_SPECIAL | MSM_DETOK_CONTINUE);
    size_t len = 0, k;
    char buf[256];
    for (int i = 0; i < n; i++) {
        cr_assert_eq(msm_detok_push(&d, ids[i], buf, sizeof buf, &k, NULL), 0);
        cr_assert_lt(len + k, cap);
        memcpy(out + len, buf, k);
        len += k;
    }
    cr_assert_eq(msm_detok_flush(&d, buf, sizeof buf, &k), 0);
    cr_assert_lt(len + k, cap);
    memcpy(out + len, buf, k);
    out[len + k] = 0;
}

int tmpdir_make(char *buf, size_t cap, const char *tag) {
    if ((size_t)snprintf(buf, cap, "/tmp/msm-%s-XXXXXX", tag) >= cap) return -ENAMETOOLONG;
    return mkdtemp(buf) ? 0 : -errno;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void tmpdir_remove(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }
