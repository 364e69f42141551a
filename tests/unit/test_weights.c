/* Tests of msm_weights (the checkpoint loader): the float32 weights the CPU backend gets are
 * bitwise those of the previous loader (each part converted to float32 from the mapped tensor,
 * row by row, into a zeroed buffer; reimplemented here as the reference) for every golden model,
 * at TP 1 and 2, with one and several reader threads and with slots small enough to cut rows
 * into pieces; f16, f32 and mixed sources; FP8 block-scaled checkpoints at TP 1, 2 and 4 equal
 * the whole tensors' element-by-element dequantisation however the chunks are cut (with the CPU
 * backend's fp8_as_bf16, that rounded to bf16 as the CUDA backend stores it), and FP8
 * layouts msmoed does not know (no scales, per-tensor, per-channel, other blocks, no
 * quantization_config) are refused naming the tensor and what was found; a shard truncated, rewritten or deleted during the
 * load gives an error naming the file and the tensor, with nothing leaked (the ASan pass runs
 * these); the engine's progress reaches exactly 100%. With a GPU, the CUDA backend's bf16
 * weights equal the reference rounded to bf16, bit for bit, from each source dtype. */
#include <criterion/criterion.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
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

#define assert_has(msg, s) cr_assert_not_null(strstr((msg), (s)), "'%s' not in: %s", (s), (msg))

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

/* Adds tensor `name` (st_dtype, ndim dims `shape`, nb bytes at *off) to a safetensors header. */
static void header_add(json_object *hdr, const char *name, const char *st_dtype, int ndim, const int64_t *shape,
                       size_t *off, size_t nb) {
    json_object *e = json_object_new_object(), *sh = json_object_new_array(), *offs = json_object_new_array();
    json_object_object_add(e, "dtype", json_object_new_string(st_dtype));
    for (int d = 0; d < ndim; d++) json_object_array_add(sh, json_object_new_int64(shape[d]));
    json_object_object_add(e, "shape", sh);
    json_object_array_add(offs, json_object_new_int64((int64_t)*off));
    json_object_array_add(offs, json_object_new_int64((int64_t)(*off + nb)));
    json_object_object_add(e, "data_offsets", offs);
    json_object_object_add(hdr, name, e);
    *off += nb;
}

/* Creates dir/name holding the 8-byte length and the header; the caller writes the data. */
static FILE *start_file(const char *dir, const char *name, json_object *hdr) {
    char out[512];
    FILE *o = fopen(join(out, sizeof out, dir, name), "wb");
    cr_assert_not_null(o);
    const char *h = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
    uint64_t hl = strlen(h);
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)(hl >> (8 * k));
    fwrite(len8, 1, 8, o);
    fwrite(h, 1, hl, o);
    return o;
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
            size_t n = t->nbytes / msm_dtype_size(t->dtype);
            header_add(hdr, t->name, st_names[dt], t->ndim, t->shape, &off, n * msm_dtype_size(dt));
        }
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        FILE *o = start_file(dst, base, hdr);
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

/* The float32 values of FP8 tensor t (as DeepSeek-V3's weight_dequant defines them, element by
 * element from the whole tensor: w[n, k] = f8(q[n, k]) * scale_inv[n / 128, k / 128]). */
static float *dequant_tensor(const msm_safetensors *st, const msm_st_tensor *t) {
    char name[256];
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const msm_st_tensor *s = msm_safetensors_find(st, name);
    cr_assert_not_null(s, "%s", name);
    size_t R = (size_t)t->shape[0], C = (size_t)t->shape[1], sc = (size_t)s->shape[1];
    float *scale = malloc(sizeof(float) * (size_t)(s->shape[0] * s->shape[1])), *w = malloc(sizeof(float) * R * C);
    cr_assert(scale && w);
    msm_convert_to_f32(scale, s->data, s->dtype, (size_t)(s->shape[0] * s->shape[1]));
    const uint8_t *q = t->data;
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) {
            float f = msm_f8e4m3_to_f32(q[r * C + c]);
            w[r * C + c] = isnan(f) ? f : f * scale[(r / 128) * sc + c / 128];
        }
    free(scale);
    return w;
}

/* Weight w as the float32 path loads it from st; with fp8_bf16, the parts from FP8 tensors rounded
 * to bf16 with msm_f32_to_bf16 (what a CPU backend with fp8_as_bf16 holds; keep_f32 weights are
 * left float32), and the elements that rounding changed are added to *changed (when given). */
static float *reference_weight(const msm_weight *w, const msm_safetensors *st, bool fp8_bf16, size_t *changed) {
    size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
    float *buf = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(buf);
    for (int p = 0; p < w->n_parts; p++) {
        const msm_wpart *pt = &w->parts[p];
        const msm_st_tensor *t = msm_safetensors_find(st, pt->src);
        cr_assert_not_null(t, "%s", pt->src);
        float *deq = t->dtype == MSM_F8_E4M3 ? dequant_tensor(st, t) : NULL;
        size_t es = msm_dtype_size(t->dtype);
        for (int64_t i = 0; i < pt->n_rows; i++) {
            size_t at = (size_t)(pt->row0 + i) * (size_t)pt->src_cols + (size_t)pt->col0;
            float *dst = buf + ((size_t)pt->expert * (size_t)w->rows + (size_t)(pt->dst_row + i)) * (size_t)w->cols;
            if (deq) memcpy(dst, deq + at, sizeof(float) * (size_t)pt->n_cols);
            else msm_convert_to_f32(dst, (const char *)t->data + at * es, t->dtype, (size_t)pt->n_cols);
            for (int64_t j = 0; deq && fp8_bf16 && !w->keep_f32 && j < pt->n_cols; j++) {
                float r = msm_bf16_to_f32(msm_f32_to_bf16(dst[j]));
                if (changed && memcmp(&r, &dst[j], 4) != 0) (*changed)++;
                dst[j] = r;
            }
        }
        free(deq);
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

/* Loads rank `rank` of `tp` of dir on a CPU backend made with `co` (NULL: the defaults) with `o`
 * and compares every weight with the reference computed from `ref_dir` (the same model, possibly
 * in other dtypes), bit for bit: FP8 parts rounded to bf16 when co->fp8_as_bf16. Returns how many
 * elements that rounding changed. */
static size_t check_cpu_load_with(const char *dir, const char *ref_dir, int rank, int tp, const msm_load_opts *o,
                                  const msm_backend_cpu_opts *co) {
    size_t changed = 0;
    msm_graph *g = rank_graph(dir, rank, tp);
    msm_safetensors *st, *ref;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_safetensors_open_dir(ref_dir, &ref, &err), 0, "%s", err.msg);
    /* fp8_as_cuda: the weights the CUDA backend keeps FP8 are not rounded */
    bool *resident = calloc((size_t)g->n_weights + 1, sizeof *resident);
    msm_wsource *src = calloc((size_t)g->n_weights + 1, sizeof *src);
    cr_assert(resident && src);
    cr_assert_eq(msm_weights_sources(g, st, src, &err), 0, "%s", err.msg);
    msm_weights_fp8_resident(g, src, resident);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, rank, 1000, co, &b, &err), 0);
    msm_load_stats ls;
    cr_assert_eq(msm_weights_load(g, st, b, o, &ls, &err), 0, "%s rank %d/%d: %s", dir, rank, tp, err.msg);
    cr_expect_gt(ls.bytes_read, 0);
    cr_expect_geq(ls.bytes_read, ls.bytes_stored);
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        bool round = co && (co->fp8_as_bf16 || (co->fp8_as_cuda && !resident[wi]));
        float *want = reference_weight(w, ref, round, &changed);
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
    free(resident), free(src);
    return changed;
}

static void check_cpu_load(const char *dir, const char *ref_dir, int rank, int tp, const msm_load_opts *o) {
    check_cpu_load_with(dir, ref_dir, rank, tp, o, NULL);
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

/* ---- FP8 block-scaled checkpoints ------------------------------------------------------------ */

static const char *const fp8_models[] = {"tests/data/qwen3moe-fp8", "tests/data/glm4moe-fp8"};

/* Slots that cut FP8 rows (192 bytes) into pieces starting mid-block (100, 64 and 37 bytes), a
 * column slice read row by row, several readers. */
static const msm_load_opts fp8_variants[] = {
    {.threads = 1},
    {.threads = 3, .slot_bytes = 100, .slots = 2, .row_gap = 16},
    {.threads = 2, .slot_bytes = 64, .row_gap = 1},
    {.threads = 2, .slot_bytes = 37},
    {.threads = 2, .slot_bytes = 4096},
};

/* Every weight of every rank, at TP 1, 2 and 4 (slices of 96, 48 and 16 rows or columns: TP slices
 * starting mid-block), bitwise the element-by-element dequantisation of the whole tensor, however
 * the chunks are cut. */
Test(weights, fp8_checkpoints_dequantise_bitwise_at_tp_1_2_4_however_the_chunks_are_cut, .timeout = 240) {
    for (size_t m = 0; m < 2; m++)
        for (int tp = 1; tp <= 4; tp *= 2)
            for (int rank = 0; rank < tp; rank++)
                for (size_t v = 0; v < sizeof fp8_variants / sizeof fp8_variants[0]; v++)
                    check_cpu_load(fp8_models[m], fp8_models[m], rank, tp, &fp8_variants[v]);
}

/* fp8_as_bf16 (msmoe-run --fp8-as-bf16, for CUDA vs CPU checks): the CPU backend holds what the
 * CUDA backend holds (tests below, GPU part), every FP8 weight's float32 dequantisation rounded
 * with msm_f32_to_bf16, bit for bit, at TP 1, 2 and 4 however the chunks are cut; bf16 parts are
 * as before. Without it they are the float32 values (the test above), and the rounding does
 * change some of them. */
Test(weights, fp8_as_bf16_cpu_weights_are_the_dequantisation_rounded_to_bf16, .timeout = 240) {
    const msm_backend_cpu_opts co = {.fp8_as_bf16 = true};
    for (size_t m = 0; m < 2; m++) {
        size_t changed = 0;
        for (int tp = 1; tp <= 4; tp *= 2)
            for (int rank = 0; rank < tp; rank++)
                for (size_t v = 0; v < sizeof fp8_variants / sizeof fp8_variants[0]; v += 2)
                    changed += check_cpu_load_with(fp8_models[m], fp8_models[m], rank, tp, &fp8_variants[v], &co);
        cr_expect_gt(changed, 1000, "%s: rounding to bf16 changed only %zu weights", fp8_models[m], changed);
    }
}

/* fp8_as_cuda (msmoe-run --fp8-as-cuda, the CUDA-vs-CPU check's oracle since the CUDA backend
 * keeps FP8 weights resident): only the FP8 weights msm_weights_fp8_resident leaves out (routers,
 * gates, TP slices whose column phase is not a multiple of 16) are rounded, the others stay the
 * float32 dequantisation, bit for bit at TP 1, 2 and 4. Which ones: on qwen3moe-fp8 (bf16 routers)
 * the attention and expert weights are resident; at TP 4 the experts' down slices of 8 columns
 * start at phases 8 and 24 on ranks 1 and 3, which are not (nor their gate_up). A weight whose
 * source is not FP8 never is. */
Test(weights, fp8_as_cuda_rounds_only_the_weights_the_cuda_backend_does_not_keep_fp8, .timeout = 240) {
    const msm_backend_cpu_opts co = {.fp8_as_cuda = true};
    for (size_t m = 0; m < 2; m++)
        for (int tp = 1; tp <= 4; tp *= 2)
            for (int rank = 0; rank < tp; rank++)
                for (size_t v = 0; v < sizeof fp8_variants / sizeof fp8_variants[0]; v += 2)
                    check_cpu_load_with(fp8_models[m], fp8_models[m], rank, tp, &fp8_variants[v], &co);
    for (int tp = 1; tp <= 4; tp += 3) /* tp 1 and 4 */
        for (int rank = 0; rank < tp; rank++) {
            msm_graph *g = rank_graph(fp8_models[0], rank, tp);
            msm_safetensors *st;
            msm_err err = {{0}};
            cr_assert_eq(msm_safetensors_open_dir(fp8_models[0], &st, &err), 0, "%s", err.msg);
            msm_wsource src[256];
            bool res[256];
            cr_assert_lt(g->n_weights, 256);
            cr_assert_eq(msm_weights_sources(g, st, src, &err), 0, "%s", err.msg);
            msm_weights_fp8_resident(g, src, res);
            int experts = 0, o_proj = 0, qkv = 0;
            for (int i = 0; i < g->n_weights; i++) {
                const char *nm = g->weights[i].name;
                if (strstr(nm, "experts_") && src[i].dtype == MSM_F8_E4M3) experts += res[i];
                if (strstr(nm, "o_proj") && src[i].dtype == MSM_F8_E4M3) o_proj += res[i];
                if (strstr(nm, ".qkv") && src[i].dtype == MSM_F8_E4M3) qkv += res[i];
                if (src[i].dtype != MSM_F8_E4M3) cr_expect(!res[i], "%s is not FP8 but kept FP8", nm);
            }
            cr_expect_gt(o_proj, 0, "tp %d rank %d: no o_proj kept FP8", tp, rank);
            cr_expect_gt(qkv, 0, "tp %d rank %d: no qkv kept FP8", tp, rank);
            if (tp == 1 || rank % 2 == 0) cr_expect_gt(experts, 0, "tp %d rank %d: no experts kept FP8", tp, rank);
            else cr_expect_eq(experts, 0, "tp %d rank %d: experts of phase %d kept FP8", tp, rank, 8 * rank % 128);
            msm_safetensors_free(st);
            msm_graph_free(g);
        }
}

/* The same through the backend's loading interface, on a block built by hand: the 256 FP8 codes on
 * two rows of two column blocks each, with a scale of 1 + 2^-8 (so q * scale lies exactly halfway
 * between two bf16 values for every code 1.000 x 2^e: a tie, rounded to even, down), 0.3, 448 and
 * 2^-10. With fp8_as_bf16 a plain weight holds msm_f32_to_bf16 of the float32 dequantisation
 * (load.cu's bf16 path), the two NaN codes as the bf16 NaN 0x7fc0 / 0xffc0 as the CUDA kernel
 * stores them; a keep_f32 weight keeps the float32 value (load.cu's float32 path). Without it,
 * both hold the float32 values. */
Test(weights, fp8_as_bf16_rounds_each_code_like_the_cuda_loader_and_leaves_keep_f32_weights) {
    msm_weight ws[2] = {{.name = "plain", .n_expert = 1, .rows = 2, .cols = 256},
                        {.name = "keep_f32", .n_expert = 1, .rows = 2, .cols = 256, .keep_f32 = true}};
    msm_graph g = {.weights = ws, .n_weights = 2};
    /* [2 block rows, 2 block columns]; the block's first element is row 127 of its block, so its
     * rows 0 and 1 take block rows 0 and 1 */
    const float scale[4] = {1.0f + 0x1p-8f, 0.3f, 448.0f, 0x1p-10f};
    uint8_t codes[2 * 256];
    for (int i = 0; i < 2 * 256; i++) codes[i] = (uint8_t)(i % 256);
    for (int on = 0; on <= 1; on++) {
        const msm_backend_cpu_opts co = {.fp8_as_bf16 = on};
        msm_backend *b;
        msm_err err = {{0}};
        cr_assert_eq(msm_backend_cpu_new(NULL, 0, 1000, &co, &b, &err), 0);
        cr_assert_eq(b->vt->alloc_weights(b, &g, NULL, &err), 0, "%s", err.msg);
        msm_wchan *c;
        cr_assert_eq(b->vt->chan_open(b, sizeof codes, 1, &c, &err), 0, "%s", err.msg);
        for (int wi = 0; wi < 2; wi++) {
            void *slot;
            cr_assert_eq(b->vt->chan_slot(c, &slot, &err), 0, "%s", err.msg);
            memcpy(slot, codes, sizeof codes);
            msm_wblock k = {.wi = wi, .src_dtype = MSM_F8_E4M3, .src = slot, .src_pitch = 256, .dst_pitch = 256,
                            .rows = 2, .cols = 256, .scale = scale, .scale_pitch = 2, .scale_r0 = 127,
                            .scale_block = 128};
            cr_assert_eq(b->vt->chan_put(c, &k, &err), 0, "%s", err.msg);
        }
        cr_assert_eq(b->vt->chan_close(c, &err), 0, "%s", err.msg);
        for (int wi = 0; wi < 2; wi++) {
            const float *got = msm_backend_cpu_weight(b, wi);
            for (int i = 0; i < 2 * 256; i++) {
                float f = msm_f8e4m3_to_f32(codes[i]), want = isnan(f) ? f : f * scale[(i / 256) * 2 + (i % 256) / 128];
                if (on && !ws[wi].keep_f32) want = msm_bf16_to_f32(msm_f32_to_bf16(want));
                uint32_t gu, wu;
                memcpy(&gu, &got[i], 4);
                memcpy(&wu, &want, 4);
                cr_expect_eq(gu, wu, "fp8_as_bf16 %d, weight %s, row %d, code 0x%02x: 0x%08x, want 0x%08x", on,
                             ws[wi].name, i / 256, codes[i], gu, wu);
            }
        }
        const float *plain = msm_backend_cpu_weight(b, 0);
        uint32_t nan_pos, nan_neg;
        memcpy(&nan_pos, &plain[0x7f], 4);
        memcpy(&nan_neg, &plain[0xff], 4);
        cr_expect_eq(nan_pos, 0x7fc00000u, "code 0x7f: 0x%08x", nan_pos);
        cr_expect_eq(nan_neg, 0xffc00000u, "code 0xff: 0x%08x", nan_neg);
        /* code 0x38 is 1.0: (1 + 2^-8) is a tie in bf16, rounded to the even 1.0 */
        cr_expect_eq(plain[0x38], on ? 1.0f : 1.0f + 0x1p-8f, "code 0x38: %a", (double)plain[0x38]);
        msm_backend_free(b);
    }
}

/* The loader tells the backend what each weight is made of (alloc_weights' msm_wsource, recorded
 * here by wrapping the CPU backend's): FP8 where every part is, "mixed" for a weight of FP8 and
 * bf16 parts, bf16 where modules_to_not_convert kept it, and whether the weight's own 128-blocks
 * line up with the checkpoint's (not for a slice starting mid-block, nor for gate and up rows
 * packed at row 192). */
static const msm_backend_vt *cpu_vt;
static msm_wsource seen_src[1024];

static int record_alloc(msm_backend *b, const msm_graph *g, const msm_wsource *src, msm_err *err) {
    cr_assert_leq(g->n_weights, 1024);
    cr_assert_not_null(src);
    memcpy(seen_src, src, sizeof *src * (size_t)g->n_weights);
    return cpu_vt->alloc_weights(b, g, src, err);
}

/* msm_wsource of weight `name` when rank `rank` of `tp` of glm4moe-fp8 loads. */
static msm_wsource source_of(int rank, int tp, const char *name) {
    msm_graph *g = rank_graph("tests/data/glm4moe-fp8", rank, tp);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir("tests/data/glm4moe-fp8", &st, &err), 0, "%s", err.msg);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, rank, 1000, NULL, &b, &err), 0);
    cpu_vt = b->vt;
    msm_backend_vt vt = *b->vt;
    vt.alloc_weights = record_alloc;
    b->vt = &vt;
    cr_assert_eq(msm_weights_load(g, st, b, NULL, NULL, &err), 0, "%s", err.msg);
    b->vt = cpu_vt;
    int wi = -1;
    for (int i = 0; i < g->n_weights; i++)
        if (!strcmp(g->weights[i].name, name)) wi = i;
    cr_assert_geq(wi, 0, "no weight %s", name);
    msm_wsource ws = seen_src[wi];
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_graph_free(g);
    return ws;
}

#define expect_source(rank, tp, name, dt, aligned)                                                       \
    do {                                                                                                  \
        msm_wsource ws_ = source_of(rank, tp, name);                                                      \
        cr_expect_eq(ws_.dtype, dt, "%s at %d/%d: dtype %d", name, rank, tp, (int)ws_.dtype);             \
        cr_expect_eq(ws_.fp8_block, dt == MSM_F8_E4M3 ? 128 : 0, "%s at %d/%d", name, rank, tp);          \
        cr_expect_eq(ws_.fp8_aligned, aligned, "%s at %d/%d: fp8_aligned %d", name, rank, tp, ws_.fp8_aligned); \
    } while (0)

Test(weights, fp8_weight_sources_reach_the_backend) {
    expect_source(0, 1, "layers.0.mlp_down", MSM_F8_E4M3, true);           /* [64, 192] whole */
    expect_source(1, 2, "layers.0.mlp_down", MSM_F8_E4M3, false);          /* columns 96..191 */
    expect_source(0, 2, "layers.0.mlp_down", MSM_F8_E4M3, true);           /* columns 0..95 */
    expect_source(0, 1, "layers.0.mlp_gate_up", MSM_F8_E4M3, false);       /* up rows packed at row 192 */
    expect_source(0, 1, "layers.1.experts_down", MSM_F8_E4M3, true);
    expect_source(0, 1, "layers.2.shared_gate_up", MSM_DTYPE_COUNT, false); /* FP8 gate, bf16 up */
    expect_source(0, 1, "layers.1.o_proj", MSM_BF16, false);               /* modules_to_not_convert */
    expect_source(0, 1, "model.embed_tokens.weight", MSM_BF16, false);
}

/* ---- FP8 checkpoints that are refused ------------------------------------------------------- */

/* An edit of one checkpoint tensor: drop it, or replace it by `ndim` dims `shape` of `st_dtype`
 * holding `data` (nbytes). */
typedef struct edit {
    const char *name;
    bool drop;
    const char *st_dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
} edit;

/* Writes glm4moe-fp8 again under tmp/`dir` with one tensor edited (a single file), and its
 * config.json, less its quantization_config when `drop_quant`. */
static const char *edit_fp8_model(const char *dir, const edit *ed, bool drop_quant) {
    const char *dst = copy_model("tests/data/glm4moe-fp8", dir);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir("tests/data/glm4moe-fp8", &st, &err), 0, "%s", err.msg);
    static const char *names[] = {"F32", "F16", "BF16", "I32", "F8_E4M3"};
    json_object *hdr = json_object_new_object();
    size_t off = 0, n = msm_safetensors_count(st);
    for (int pass = 0; pass < 2; pass++) { /* the header, then the data */
        FILE *o = pass ? start_file(dst, "model.safetensors", hdr) : NULL;
        for (size_t i = 0; i < n; i++) {
            const msm_st_tensor *t = msm_safetensors_at(st, i);
            bool hit = !strcmp(t->name, ed->name);
            if (hit && ed->drop) continue;
            const void *data = hit ? ed->data : t->data;
            size_t nb = hit ? ed->nbytes : t->nbytes;
            if (pass) {
                fwrite(data, 1, nb, o);
                continue;
            }
            header_add(hdr, t->name, hit ? ed->st_dtype : names[t->dtype], hit ? ed->ndim : t->ndim,
                       hit ? ed->shape : t->shape, &off, nb);
        }
        if (pass) cr_assert_eq(fclose(o), 0);
    }
    json_object_put(hdr);
    msm_safetensors_free(st);
    if (drop_quant) {
        char path[512];
        json_object *cfg = json_object_from_file(join(path, sizeof path, dst, "config.json"));
        cr_assert_not_null(cfg);
        json_object_object_del(cfg, "quantization_config");
        cr_assert_eq(json_object_to_file(path, cfg), 0);
        json_object_put(cfg);
    }
    return dst;
}

/* Loads rank 0 of 1 of dir: refused with `code` and every needle in the message; msm_weights_check
 * refuses it the same way without reading a weight. */
static void expect_fp8_refused(const char *dir, int code, const char *const *needles) {
    msm_graph *g = rank_graph(dir, 0, 1);
    msm_safetensors *st;
    msm_err err = {{0}}, err2 = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, 0, 1000, NULL, &b, &err), 0);
    int r = msm_weights_load(g, st, b, &(msm_load_opts){.threads = 2, .slot_bytes = 256}, NULL, &err);
    cr_assert_eq(r, code, "rc %d (%s), expected %d", r, r ? err.msg : "loaded", code);
    for (const char *const *n = needles; *n; n++) assert_has(err.msg, *n);
    cr_assert_eq(msm_weights_check(g, st, &err2), code);
    cr_expect_str_eq(err2.msg, err.msg);
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_graph_free(g);
}

#define EXPERT "model.layers.1.mlp.experts.3.gate_proj.weight" /* [32, 64] FP8: scales [1, 1] */
#define DENSE "model.layers.0.mlp.up_proj.weight"            /* [192, 64] FP8: scales [2, 1] */

Test(weights, fp8_weight_without_its_scales_is_refused_naming_both) {
    const char *dir = edit_fp8_model("m", &(edit){.name = DENSE "_scale_inv", .drop = true}, false);
    const char *needles[] = {"model.safetensors: tensor '" DENSE "' is F8_E4M3 but its block scales '" DENSE
                             "_scale_inv' (float32 [2, 1]) are missing", NULL};
    expect_fp8_refused(dir, -ENOENT, needles);
}

Test(weights, fp8_per_tensor_scale_is_refused) {
    float one = 0.01f;
    const char *dir = edit_fp8_model("m", &(edit){.name = DENSE "_scale_inv", .st_dtype = "F32", .ndim = 0,
                                                  .data = &one, .nbytes = 4}, false);
    const char *needles[] = {"tensor '" DENSE "_scale_inv' has shape [] (a per-tensor scale)",
                             "FP8 weight [192, 64] in 128 x 128 blocks needs block scales [2, 1]", NULL};
    expect_fp8_refused(dir, -EINVAL, needles);
}

Test(weights, fp8_per_channel_scales_are_refused) {
    static float rows[192];
    for (int i = 0; i < 192; i++) rows[i] = 0.01f;
    const char *dir = edit_fp8_model("m", &(edit){.name = DENSE "_scale_inv", .st_dtype = "F32", .ndim = 1,
                                                  .shape = {192}, .data = rows, .nbytes = sizeof rows}, false);
    const char *needles[] = {"has shape [192] (per-channel scales)", NULL};
    expect_fp8_refused(dir, -EINVAL, needles);
    const char *dir2 = edit_fp8_model("m2", &(edit){.name = DENSE "_scale_inv", .st_dtype = "F32", .ndim = 2,
                                                    .shape = {192, 1}, .data = rows, .nbytes = sizeof rows}, false);
    const char *needles2[] = {"has shape [192, 1] (per-channel scales)", NULL};
    expect_fp8_refused(dir2, -EINVAL, needles2);
}

Test(weights, fp8_scales_of_another_block_size_are_refused) {
    float s[2] = {0.01f, 0.02f}; /* [1, 2]: 64-wide column blocks of a [32, 64] weight */
    const char *dir = edit_fp8_model("m", &(edit){.name = EXPERT "_scale_inv", .st_dtype = "F32", .ndim = 2,
                                                  .shape = {1, 2}, .data = s, .nbytes = sizeof s}, false);
    const char *needles[] = {"has shape [1, 2] (block scales of another block size)", "needs block scales [1, 1]", NULL};
    expect_fp8_refused(dir, -EINVAL, needles);
}

Test(weights, fp8_scales_that_are_not_float_or_not_finite_are_refused) {
    uint8_t q = 0x38;
    const char *dir = edit_fp8_model("m", &(edit){.name = EXPERT "_scale_inv", .st_dtype = "F8_E4M3", .ndim = 2,
                                                  .shape = {1, 1}, .data = &q, .nbytes = 1}, false);
    const char *needles[] = {"tensor '" EXPERT "_scale_inv' (the block scales of an FP8 weight) is f8_e4m3; expected "
                             "float32", NULL};
    expect_fp8_refused(dir, -EINVAL, needles);
    float inf = INFINITY;
    const char *dir2 = edit_fp8_model("m2", &(edit){.name = EXPERT "_scale_inv", .st_dtype = "F32", .ndim = 2,
                                                    .shape = {1, 1}, .data = &inf, .nbytes = 4}, false);
    msm_graph *g = rank_graph(dir2, 0, 1);
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir(dir2, &st, &err), 0, "%s", err.msg);
    msm_backend *b;
    cr_assert_eq(msm_backend_cpu_new(NULL, 0, 1000, NULL, &b, &err), 0);
    cr_assert_eq(msm_weights_load(g, st, b, NULL, NULL, &err), -EINVAL);
    assert_has(err.msg, "tensor '" EXPERT "_scale_inv' holds a non-finite scale (inf) for block [0, 0]");
    msm_backend_free(b);
    msm_safetensors_free(st);
    msm_graph_free(g);
}

Test(weights, fp8_tensors_without_a_quantization_config_are_refused) {
    const char *dir = edit_fp8_model("m", &(edit){.name = "none"}, true);
    const char *needles[] = {"is F8_E4M3 but config.json declares no FP8 quantization", NULL};
    expect_fp8_refused(dir, -EINVAL, needles);
}

/* Scales stored as bf16 (as some FP8 checkpoints do): read exactly, the weights dequantised with them. */
Test(weights, fp8_scales_in_bf16_are_read) {
    const msm_st_tensor *t;
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir("tests/data/glm4moe-fp8", &st, &err), 0, "%s", err.msg);
    t = msm_safetensors_find(st, DENSE "_scale_inv");
    uint16_t h[2];
    for (int i = 0; i < 2; i++) h[i] = msm_f32_to_bf16(((const float *)t->data)[i]);
    msm_safetensors_free(st);
    const char *dir = edit_fp8_model("m", &(edit){.name = DENSE "_scale_inv", .st_dtype = "BF16", .ndim = 2,
                                                  .shape = {2, 1}, .data = h, .nbytes = sizeof h}, false);
    for (size_t v = 0; v < 3; v++) check_cpu_load(dir, dir, 0, 1, &fp8_variants[v]);
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
    cr_assert_eq(msm_backend_cpu_new(NULL, 0, 1000, NULL, &b, &err), 0);
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
    /* float32 on the CPU backend: at least the bytes read, none of them FP8-resident */
    cr_expect_geq(sm->weight_bytes, sm->bytes_read);
    cr_expect_eq(sm->weight_bytes_fp8, 0);
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
static void check_cuda_load(const char *dir, int rank, int tp, const msm_load_opts *o, int *fp8_resident) {
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
        float *want = reference_weight(w, st, false, NULL);
        size_t n = 0;
        const uint16_t *dev = msm_backend_cuda_weight(b, wi, &n);
        cr_assert_eq(n, (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols);
        const float *dsc;
        int ph;
        const uint8_t *dq = msm_backend_cuda_weight_fp8(b, wi, &dsc, &ph);
        if (dq) { /* FP8-resident: codes and per-row scales, f32(q) * scale the reference's bits */
            (*fp8_resident)++;
            size_t ns = msm_cuda_fp8_scales(w->n_expert, w->rows, w->cols, ph), ncs = (size_t)(w->cols + ph + 127) / 128;
            uint8_t *q = malloc(n ? n : 1);
            float *sc = malloc(4 * (ns ? ns : 1));
            cr_assert_eq(cudaMemcpy(q, dq, n, cudaMemcpyDeviceToHost), cudaSuccess);
            cr_assert_eq(cudaMemcpy(sc, dsc, 4 * ns, cudaMemcpyDeviceToHost), cudaSuccess);
            size_t bad = n;
            for (size_t i = 0; i < n && bad == n; i++) {
                size_t r = i / (size_t)w->cols, c = i % (size_t)w->cols;
                float v = msm_f8e4m3_to_f32(q[i]) * sc[r * ncs + (c + (size_t)ph) / 128];
                if (memcmp(&v, &want[i], 4) != 0) bad = i;
            }
            cr_expect_eq(bad, n, "%s rank %d/%d slot %zu: FP8 weight %s (phase %d) differs at element %zu", dir, rank,
                         tp, o->slot_bytes, w->name, ph, bad);
            free(q), free(sc), free(want);
            continue;
        }
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
                for (size_t v = 0; v < sizeof load_variants / sizeof load_variants[0]; v++) {
                    int resident = 0;
                    check_cuda_load(dirs[m], rank, tp, &load_variants[v], &resident);
                    cr_expect_eq(resident, 0, "%s: no FP8 weights, none kept FP8", dirs[m]);
                }
}

/* FP8, at TP 1, 2 and 4, with slots that cut rows mid-block: the weights kept FP8 on the device
 * (docs/adr/0006-fp8.md) hold codes and per-row scales whose product is the host's float32
 * dequantisation bit for bit; the others (routers, gates, a TP slice whose column phase is not a
 * multiple of 16) are dequantised on the device (load.cu) to that value rounded to bf16, bit for
 * bit. With MSM_CUDA_FP8_RESIDENT=0 every weight takes the second way. */
Test(weights, cuda_fp8_weights_equal_the_host_dequantisation, .timeout = 300) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) cr_skip_test("no GPU");
    for (int off = 0; off <= 1; off++) {
        if (off) setenv("MSM_CUDA_FP8_RESIDENT", "0", 1);
        for (size_t m = 0; m < 2; m++)
            for (int tp = 1; tp <= 4; tp *= 2) {
                int resident = 0;
                for (int rank = 0; rank < tp; rank++)
                    for (size_t v = 0; v < sizeof fp8_variants / sizeof fp8_variants[0]; v++)
                        check_cuda_load(fp8_models[m], rank, tp, &fp8_variants[v], &resident);
                if (off)
                    cr_expect_eq(resident, 0, "%s tp %d: MSM_CUDA_FP8_RESIDENT=0 kept %d FP8", fp8_models[m], tp, resident);
                else
                    cr_expect_gt(resident, 0, "%s tp %d: no weight kept FP8", fp8_models[m], tp);
            }
    }
    unsetenv("MSM_CUDA_FP8_RESIDENT");
}
/* An FP8-resident weight holding a NaN code is refused by name (the FP8 kernels decode codes
 * with integer operations that make NaN finite); with MSM_CUDA_FP8_RESIDENT=0 it loads (bf16). */
Test(weights, cuda_fp8_resident_weight_with_a_nan_code_is_refused, .timeout = 120) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) cr_skip_test("no GPU");
    msm_safetensors *st;
    msm_err err = {{0}};
    cr_assert_eq(msm_safetensors_open_dir("tests/data/glm4moe-fp8", &st, &err), 0, "%s", err.msg);
    const msm_st_tensor *t = msm_safetensors_find(st, DENSE);
    cr_assert(t && t->nbytes == 192 * 64);
    uint8_t q[192 * 64];
    memcpy(q, t->data, sizeof q);
    msm_safetensors_free(st);
    q[100 * 64 + 17] = 0xff; /* -NaN */
    const char *dir = edit_fp8_model("nan", &(edit){.name = DENSE, .st_dtype = "F8_E4M3", .ndim = 2, .shape = {192, 64},
                                                    .data = q, .nbytes = sizeof q}, false);
    for (int off = 0; off <= 1; off++) {
        if (off) setenv("MSM_CUDA_FP8_RESIDENT", "0", 1);
        msm_graph *g = rank_graph(dir, 0, 1);
        cr_assert_eq(msm_safetensors_open_dir(dir, &st, &err), 0, "%s", err.msg);
        unsigned char id[128];
        cr_assert_eq(msm_cuda_nccl_unique_id(id, &err), 0, "%s", err.msg);
        msm_backend *b = NULL;
        cr_assert_eq(msm_backend_cuda_new(0, 0, 1, id, 10000, &b, &err), 0, "%s", err.msg);
        int r = msm_weights_load(g, st, b, &(msm_load_opts){.threads = 2, .slot_bytes = 4096}, NULL, &err);
        if (off) {
            cr_expect_eq(r, 0, "MSM_CUDA_FP8_RESIDENT=0: %s", err.msg);
        } else {
            cr_expect_eq(r, -EINVAL, "rc %d (%s)", r, r ? err.msg : "loaded");
            assert_has(err.msg, "holds NaN codes");
            assert_has(err.msg, "mlp_gate_up");
        }
        msm_backend_free(b);
        msm_safetensors_free(st);
        msm_graph_free(g);
    }
    unsetenv("MSM_CUDA_FP8_RESIDENT");
}
#else
Test(weights, cuda_skipped_without_cuda) { cr_skip_test("built without CUDA"); }
#endif
