/* Tests of msm_weights (the checkpoint loader): the float32 weights the CPU backend gets are
 * bitwise those of the previous loader (each part converted to float32 from the mapped tensor,
 * row by row, into a zeroed buffer; reimplemented here as the reference) for every golden model,
 * at TP 1 and 2, with one and several reader threads and with slots small enough to cut rows
 * into pieces; f16, f32 and mixed sources; a shard truncated, rewritten or deleted during the
 * load gives an error naming the file and the tensor, with nothing leaked (the ASan pass runs
 * these); the engine's progress reaches exactly 100%. With a GPU, the CUDA backend's bf16
 * weights equal the reference rounded to bf16, bit for bit, from each source dtype. */
#include <criterion/criterion.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "msm_backend.h"
#include "msm_engine.h"
#include "msm_safetensors.h"
#include "msm_weights.h"
#include "testutil.h"
#ifdef MSM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "msm_cuda_backend.h"
#endif

static const char *const golden_models[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen2moe-mha-tied",
                                            "tests/data/qwen3moe", "tests/data/mixtral",
                                            "models/stories260k-moe"};
#define N_GOLDEN (sizeof golden_models / sizeof golden_models[0])

/* ---- scratch directories ------------------------------------------------------------------ */

static char tmp[64];

static void setup(void) { cr_assert_eq(tmpdir_make(tmp, sizeof tmp, "weights"), 0); }
static void teardown(void) { tmpdir_remove(tmp); }

TestSuite(weights, .init = setup, .fini = teardown);

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    cr_assert(a && b, "copy %s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) cr_assert_eq(fwrite(buf, 1, n, b), n);
    fclose(a);
    cr_assert_eq(fclose(b), 0);
}

/* DIR/name as a path in the static buffer `buf`. */
static const char *join(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

/* Copies config.json, the index (if any) and every shard of model `src` into tmp/name. */
static const char *copy_model(const char *src, const char *name) {
    static char dst[128];
    char a[512], b[512];
    join(dst, sizeof dst, tmp, name);
    cr_assert_eq(mkdir(dst, 0755), 0);
    const char *files[] = {"config.json", "model.safetensors.index.json", "model.safetensors",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (access(join(a, sizeof a, src, files[i]), F_OK) == 0) copy_file(a, join(b, sizeof b, dst, files[i]));
    return dst;
}

/* ---- checkpoints in other dtypes ---------------------------------------------------------- */

static uint16_t f32_to_f16(float f) {
    _Float16 h = (_Float16)f; /* round to nearest even */
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* Writes model `src` again under tmp/name with tensor i (in name order) stored as
 * dtypes[i % n_dtypes]: values converted from the source through float32 (exact for f32,
 * rounded for f16). Same files, same shard names, same index. */
static const char *rewrite_model(const char *src, const char *name, const msm_dtype *dtypes, int n_dtypes) {
    const char *dst = copy_model(src, name);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(src, &st, &err), 0, "%s", err.msg);
    static const char *st_names[] = {"F32", "F16", "BF16"};
    for (size_t f = 0; f < msm_safetensors_file_count(st); f++) {
        const char *path = msm_safetensors_file(st, f)->path;
        json_object *hdr = json_object_new_object();
        size_t off = 0;
        for (size_t i = 0; i < msm_safetensors_count(st); i++) {
            const msm_st_tensor *t = msm_safetensors_at(st, i);
            if ((size_t)t->file_index != f) continue;
            msm_dtype dt = dtypes[i % (size_t)n_dtypes];
            size_t n = t->nbytes / msm_dtype_size(t->dtype), nb = n * msm_dtype_size(dt);
            json_object *e = json_object_new_object(), *shape = json_object_new_array(),
                        *offs = json_object_new_array();
            json_object_object_add(e, "dtype", json_object_new_string(st_names[dt]));
            for (int d = 0; d < t->ndim; d++) json_object_array_add(shape, json_object_new_int64(t->shape[d]));
            json_object_object_add(e, "shape", shape);
            json_object_array_add(offs, json_object_new_int64((int64_t)off));
            json_object_array_add(offs, json_object_new_int64((int64_t)(off + nb)));
            json_object_object_add(e, "data_offsets", offs);
            json_object_object_add(hdr, t->name, e);
            off += nb;
        }
        const char *h = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
        char out[512];
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        FILE *o = fopen(join(out, sizeof out, dst, base), "wb");
        cr_assert_not_null(o);
        uint64_t hl = strlen(h);
        uint8_t len8[8];
        for (int k = 0; k < 8; k++) len8[k] = (uint8_t)(hl >> (8 * k));
        fwrite(len8, 1, 8, o);
        fwrite(h, 1, hl, o);
        for (size_t i = 0; i < msm_safetensors_count(st); i++) {
            const msm_st_tensor *t = msm_safetensors_at(st, i);
            if ((size_t)t->file_index != f) continue;
            msm_dtype dt = dtypes[i % (size_t)n_dtypes];
            size_t n = t->nbytes / msm_dtype_size(t->dtype);
            float *x = malloc(4 * (n ? n : 1));
            msm_convert_to_f32(x, t->data, t->dtype, n);
            for (size_t k = 0; k < n; k++) {
                uint16_t hv = dt == MSM_F16 ? f32_to_f16(x[k]) : msm_f32_to_bf16(x[k]);
                if (dt == MSM_F32) fwrite(&x[k], 4, 1, o);
                else fwrite(&hv, 2, 1, o);
            }
            free(x);
        }
        cr_assert_eq(fclose(o), 0);
        json_object_put(hdr);
    }
    msm_safetensors_free(st);
    return dst;
}

/* ---- the reference: the previous loader's float32 weights ---------------------------------- */

static float *reference_weight(const msm_weight *w, const msm_safetensors *st) {
    size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
    float *buf = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(buf);
    for (int p = 0; p < w->n_parts; p++) {
        const msm_wpart *pt = &w->parts[p];
        const msm_st_tensor *t = msm_safetensors_find(st, pt->src);
        cr_assert_not_null(t, "%s", pt->src);
        size_t es = msm_dtype_size(t->dtype);
        for (int64_t i = 0; i < pt->n_rows; i++) {
            const char *src = (const char *)t->data + ((size_t)(pt->row0 + i) * (size_t)pt->src_cols + (size_t)pt->col0) * es;
            float *dst = buf + ((size_t)pt->expert * (size_t)w->rows + (size_t)(pt->dst_row + i)) * (size_t)w->cols;
            msm_convert_to_f32(dst, src, t->dtype, (size_t)pt->n_cols);
        }
    }
    return buf;
}

static msm_graph *rank_graph(const char *dir, int rank, int tp) {
    msm_model_config cfg;
    msm_err err = {{0}};
    cr_assert_eq(msm_model_config_load(dir, &cfg, &err), 0, "%s", err.msg);
    msm_build_opts bo = {.max_T = 16, .max_S = 4, .max_blocks = 8};
    msm_graph *g;
    cr_assert_eq(msm_graph_build(&cfg, rank, tp, &bo, &g, &err), 0, "%s: %s", dir, err.msg);
    return g;
}

/* Loads rank `rank` of `tp` of dir on a CPU backend with `o` and compares every weight with the
 * reference computed from `ref_dir` (the same model, possibly in other dtypes), bit for bit. */
static void check_cpu_load(const char *dir, const char *ref_dir, int rank, int tp, const msm_load_opts *o) {
    msm_graph *g = rank_graph(dir, rank, tp);
    msm_safetensors *st, *ref;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_safetensors_open_dir(ref_dir, &ref, &err), 0, "%s", err.msg);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, rank, 1000, false, &b, &err), 0);
    msm_load_stats ls;
    cr_assert_eq(msm_weights_load(g, st, b, o, &ls, &err), 0, "%s rank %d/%d: %s", dir, rank, tp, err.msg);
    cr_expect_gt(ls.bytes_read, 0);
    cr_expect_geq(ls.bytes_read, ls.bytes_stored);
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        float *want = reference_weight(w, ref);
        size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
        const float *got = msm_backend_cpu_weight(b, wi);
        cr_assert_not_null(got);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (memcmp(&got[i], &want[i], 4) != 0) bad = i;
        cr_expect_eq(bad, n, "%s rank %d/%d threads %d slot %zu: weight %s differs at element %zu (%g, want %g)",
                     dir, rank, tp, o ? o->threads : 0, o ? o->slot_bytes : 0, w->name, bad,
                     bad < n ? got[bad] : 0.0, bad < n ? want[bad] : 0.0);
        free(want);
    }
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_safetensors_free(ref);
    msm_graph_free(g);
}

/* One reader with the default slot; three with 256-byte slots (rows cut into column pieces,
 * column slices read row by row); two with 4 KiB slots (many rows per chunk). */
static const msm_load_opts load_variants[] = {
    {.threads = 1},
    {.threads = 3, .slot_bytes = 256, .slots = 2, .row_gap = 16},
    {.threads = 2, .slot_bytes = 4096},
};

Test(weights, every_golden_model_loads_bitwise_like_the_float32_path_at_tp_1_and_2, .timeout = 120) {
    for (size_t m = 0; m < N_GOLDEN; m++)
        for (int tp = 1; tp <= 2; tp++)
            for (int rank = 0; rank < tp; rank++)
                for (size_t v = 0; v < sizeof load_variants / sizeof load_variants[0]; v++)
                    check_cpu_load(golden_models[m], golden_models[m], rank, tp, &load_variants[v]);
}

Test(weights, f16_f32_and_mixed_sources_load_like_the_float32_path, .timeout = 120) {
    const msm_dtype f32[] = {MSM_F32}, f16[] = {MSM_F16}, mixed[] = {MSM_F32, MSM_BF16, MSM_F16};
    const char *d32 = strdup(rewrite_model("tests/data/qwen2moe-mha-tied", "f32", f32, 1));
    const char *d16 = strdup(rewrite_model("tests/data/qwen2moe-mha-tied", "f16", f16, 1));
    const char *dmx = strdup(rewrite_model("tests/data/qwen2moe-mha-tied", "mixed", mixed, 3));
    for (int tp = 1; tp <= 2; tp++)
        for (int rank = 0; rank < tp; rank++)
            for (size_t v = 0; v < sizeof load_variants / sizeof load_variants[0]; v++) {
                check_cpu_load(d32, d32, rank, tp, &load_variants[v]);
                check_cpu_load(d16, d16, rank, tp, &load_variants[v]);
                check_cpu_load(dmx, dmx, rank, tp, &load_variants[v]);
                /* f32 holding the bf16 values exactly: the same weights as the bf16 original */
                check_cpu_load(d32, "tests/data/qwen2moe-mha-tied", rank, tp, &load_variants[v]);
            }
    free((void *)d32);
    free((void *)d16);
    free((void *)dmx);
}

/* ---- faults during the load --------------------------------------------------------------- */

typedef struct fault {
    const char *path;   /* the file to break */
    off_t size;         /* truncate it to this size; < 0: delete it */
    bool done;
} fault;

static void break_now(fault *f) {
    f->done = true;
    if (f->size < 0) cr_assert_eq(unlink(f->path), 0);
    else cr_assert_eq(truncate(f->path, f->size), 0);
}

/* A progress hook: breaks the file once the first chunk has been read. */
static void break_file(void *ctx, uint64_t done, uint64_t total) {
    fault *f = ctx;
    (void)total;
    if (done > 0 && !f->done) break_now(f);
}

#define assert_has(msg, s) cr_assert_not_null(strstr((msg), (s)), "'%s' not in: %s", (s), (msg))

/* Breaks `file` of a copy of `model` right after its header was read (`at_open`) or once the
 * first chunk is in, loads it with one reader and 1 KiB slots, and expects failure `code` with
 * the file's path and every one of `needles` in the message. */
static void expect_fault(const char *model, const char *file, off_t size, bool at_open, int code,
                         const char *const *needles) {
    const char *dir = copy_model(model, "m");
    char path[256];
    fault f = {.path = join(path, sizeof path, dir, file), .size = size};
    msm_err err = {{0}};
    msm_graph *g = rank_graph(dir, 0, 1);
    msm_safetensors *st;
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    if (at_open) break_now(&f);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, 0, 1000, false, &b, &err), 0);
    msm_load_opts o = {.threads = 1, .slot_bytes = 1024, .progress = break_file, .ctx = &f};
    int r = msm_weights_load(g, st, b, &o, NULL, &err);
    cr_assert(f.done);
    cr_assert_eq(r, code, "rc %d (%s), expected %d", r, r ? err.msg : "loaded", code);
    assert_has(err.msg, path);
    for (; *needles; needles++) assert_has(err.msg, *needles);
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_graph_free(g);
}

Test(weights, a_file_truncated_while_it_is_read_names_file_tensor_and_bytes) {
    const char *needles[] = {"truncated during the load", "tensor 'lm_head.weight' needs bytes", "ends at byte 20000", NULL};
    expect_fault("tests/data/qwen2moe-gqa", "model.safetensors", 20000, false, -EIO, needles);
}

Test(weights, a_shard_truncated_after_its_header_was_read_is_refused_before_reading_it) {
    const char *needles[] = {"changed since its header was read", "4096 now", NULL};
    expect_fault("tests/data/qwen2moe-mha-tied", "model-00002-of-00002.safetensors", 4096, true, -ESTALE, needles);
}

Test(weights, a_shard_deleted_during_the_load_names_the_shard) {
    const char *needles[] = {"cannot open", "removed or renamed during the load", NULL};
    expect_fault("tests/data/qwen2moe-mha-tied", "model-00002-of-00002.safetensors", -1, false, -ENOENT, needles);
}

/* An engine progress hook: truncates the file on the first report (every rank has planned). */
static void truncate_on_report(void *ctx, const msm_load_progress *p) {
    fault *f = ctx;
    (void)p;
    if (!f->done) cr_assert_eq(truncate(f->path, f->size), 0);
    f->done = true;
}

Test(weights, an_engine_whose_shard_is_truncated_mid_load_fails_cleanly_with_the_file_named, .timeout = 60) {
    const char *dir = copy_model("tests/data/qwen2moe-mha-tied", "m");
    char path[256];
    fault f = {.path = join(path, sizeof path, dir, "model-00002-of-00002.safetensors"), .size = 100000};
    msm_engine_opts o;
    msm_engine_opts_default(&o);
    o.model_dir = dir;
    o.tp = 2;
    o.kv_blocks = 16;
    o.load_threads = 2;
    o.load_slot_bytes = 1024;
    o.load_progress = truncate_on_report;
    o.load_progress_ctx = &f;
    msm_engine *e = NULL;
    msm_err err = {{0}};
    cr_assert_neq(msm_engine_new(&o, &e, &err), 0);
    cr_assert(f.done);
    cr_assert_null(e);
    assert_has(err.msg, path);
    cr_assert(strstr(err.msg, "truncated during the load") || strstr(err.msg, "changed since its header was read"),
              "%s", err.msg);
}

/* ---- progress ------------------------------------------------------------------------------ */

typedef struct seen {
    int calls;
    msm_load_progress last;
    bool monotonic, one_final;
} seen;

static void on_progress(void *ctx, const msm_load_progress *p) {
    seen *s = ctx;
    if (s->calls && (p->done_bytes < s->last.done_bytes || p->fraction < s->last.fraction)) s->monotonic = false;
    if (s->calls && s->last.fraction == 1.0) s->one_final = false;
    s->last = *p;
    s->calls++;
}

Test(weights, engine_progress_reaches_exactly_100_percent_over_both_ranks, .timeout = 60) {
    seen s = {.monotonic = true, .one_final = true};
    msm_engine_opts o;
    msm_engine_opts_default(&o);
    o.model_dir = "tests/data/qwen2moe-mha-tied";
    o.tp = 2;
    o.kv_blocks = 16;
    o.load_slot_bytes = 512;
    o.load_progress = on_progress;
    o.load_progress_ctx = &s;
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    const msm_load_summary *sm = msm_engine_load_summary(e);
    cr_expect_geq(s.calls, 2);
    cr_expect(s.monotonic, "progress went backwards");
    cr_expect(s.one_final, "a report came after the one at 100%%");
    cr_expect_eq(s.last.fraction, 1.0);
    cr_expect_eq(s.last.done_bytes, s.last.total_bytes);
    cr_expect_eq(s.last.total_bytes, sm->bytes_read);
    cr_expect_gt(sm->bytes_read, 400000); /* both ranks read most of the 0.5 MB checkpoint */
    cr_expect_gt(sm->start_s, 0.0);
    char line[256];
    msm_load_progress_format(line, sizeof line, &s.last, 10);
    assert_has(line, "[##########] 100%");
    msm_engine_free(e);
}

/* ---- the CUDA backend ---------------------------------------------------------------------- */

#ifdef MSM_HAVE_CUDA
/* Loads rank `rank` of `tp` of dir on a CUDA backend (GPU 0, its own communicator of one) and
 * compares each weight with the reference rounded to bf16, bit for bit. */
static void check_cuda_load(const char *dir, int rank, int tp, const msm_load_opts *o) {
    msm_graph *g = rank_graph(dir, rank, tp);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    unsigned char id[128];
    cr_assert_eq(msm_cuda_nccl_unique_id(id, &err), 0, "%s", err.msg);
    msm_backend *b = NULL;
    cr_assert_eq(msm_backend_cuda_new(0, 0, 1, id, 10000, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_weights_load(g, st, b, o, NULL, &err), 0, "%s rank %d/%d: %s", dir, rank, tp, err.msg);
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        float *want = reference_weight(w, st);
        size_t n = 0;
        const uint16_t *dev = msm_backend_cuda_weight(b, wi, &n);
        cr_assert_eq(n, (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols);
        if (w->keep_f32) { /* stored as float32 on the device: the reference's bits exactly */
            float *gotf = malloc(4 * (n ? n : 1));
            cr_assert_eq(cudaMemcpy(gotf, dev, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
            cr_expect_eq(memcmp(gotf, want, 4 * n), 0, "%s rank %d/%d: float32 weight %s differs", dir, rank, tp,
                         w->name);
            free(gotf);
            free(want);
            continue;
        }
        uint16_t *got = malloc(2 * (n ? n : 1));
        cr_assert_eq(cudaMemcpy(got, dev, 2 * n, cudaMemcpyDeviceToHost), cudaSuccess);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (got[i] != msm_f32_to_bf16(want[i])) bad = i;
        cr_expect_eq(bad, n, "%s rank %d/%d slot %zu: weight %s differs at element %zu (0x%04x, want 0x%04x)", dir,
                     rank, tp, o->slot_bytes, w->name, bad, bad < n ? got[bad] : 0,
                     bad < n ? msm_f32_to_bf16(want[bad]) : 0);
        free(got);
        free(want);
    }
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_graph_free(g);
}

Test(weights, cuda_weights_equal_the_float32_path_rounded_to_bf16_from_every_source_dtype, .timeout = 300) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) cr_skip_test("no GPU");
    const msm_dtype mixed[] = {MSM_F32, MSM_BF16, MSM_F16};
    const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen2moe-mha-tied", "tests/data/qwen3moe",
                          "tests/data/mixtral", "models/stories260k-moe", "tests/data/glm4moe", NULL};
    dirs[6] = rewrite_model("tests/data/qwen2moe-mha-tied", "mixed", mixed, 3);
    for (size_t m = 0; m < 7; m++)
        for (int tp = 1; tp <= 2; tp++)
            for (int rank = 0; rank < tp; rank++)
                for (size_t v = 0; v < sizeof load_variants / sizeof load_variants[0]; v++)
                    check_cuda_load(dirs[m], rank, tp, &load_variants[v]);
}
#else
Test(weights, cuda_skipped_without_cuda) { cr_skip_test("built without CUDA"); }
#endif
