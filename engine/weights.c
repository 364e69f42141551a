/* msm_weights: checkpoint → backend (see msm_weights.h): a plan of chunks, then reader threads
 * that pread the chunks into their backend channel's staging slots, in file order.
 *
 * A chunk is a rectangular block of one part: `rows` rows of `cols` elements. Its bytes are one
 * contiguous span of the file when the part takes whole rows (most weights), or when a column
 * slice (a row-parallel TP weight) leaves little between its rows; there the span includes the
 * columns of the other ranks, which costs less than a system call per row. Otherwise (more than
 * row_gap bytes between the rows) it reads row by row, packed. A row longer than a slot is cut
 * into column pieces.
 *
 * FP8 block-scaled checkpoints: an F8_E4M3 tensor X.weight comes with X.weight_scale_inv, one
 * scale per 128 x 128 block (docs/adr/0006-fp8.md). Planning checks the scales' shape and reads
 * them all (they are 1/16384 of their weights' elements) with pread like any chunk; each chunk of
 * an FP8 part then carries a pointer to its tensor's scales and its first element's row and
 * column in the tensor, so the backend finds every element's block wherever the chunk (a TP slice,
 * a piece of a row) starts. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "msm_weights.h"

#define DEFAULT_THREADS 4
#define MAX_THREADS 64
#define DEFAULT_SLOT (8u << 20)
#define DEFAULT_SLOTS 3
#define DEFAULT_ROW_GAP (16u << 10)

typedef struct chunk {
    uint64_t off;            /* file offset of the chunk's first element */
    size_t src_pitch;        /* bytes from row to row in the file */
    size_t rows, cols;       /* elements */
    size_t dst_off, dst_pitch; /* where it goes in the weight, in elements */
    int64_t src_row, src_col;  /* its first element's row and column in the checkpoint tensor */
    const float *scale;      /* F8_E4M3: the tensor's scale_inv [ceil(R/B), ceil(C/B)]; else NULL */
    size_t scale_cols;       /* ceil(C/B) */
    int file, wi, part;      /* part: weights[wi].parts[part], for messages */
    msm_dtype dtype;
    bool by_row;             /* one pread per row, rows packed in the slot */
} chunk;

typedef struct loader {
    const msm_graph *g;
    const msm_safetensors *st;
    msm_backend *b;
    const msm_load_opts *o;
    chunk *chunks;
    size_t n_chunks, cap_chunks, slot_bytes, row_gap;
    int slots;
    uint64_t total;          /* bytes to read */
    uint64_t stored;         /* elements' bytes handed to the backend */
    atomic_size_t next;      /* the next chunk to take */
    atomic_uint_fast64_t done;
    atomic_bool failed;
    pthread_mutex_t mu;      /* guards fd[], rc, err */
    int *fd;                 /* per file; -1 until its first chunk opens it */
    int rc;
    msm_err err;             /* the first failure's message */
    msm_wsource *wsrc;       /* [n_weights]: what each weight is made of, for alloc_weights */
    float **scales;          /* every FP8 part's scales, read while planning (freed at the end) */
    size_t n_scales, cap_scales;
} loader;

static size_t chunk_span(const chunk *k) {
    size_t seg = k->cols * msm_dtype_size(k->dtype);
    return k->by_row ? k->rows * seg : (k->rows - 1) * k->src_pitch + seg;
}

static int add_chunk(loader *L, const chunk *k, msm_err *err) {
    if (L->n_chunks == L->cap_chunks) {
        size_t cap = L->cap_chunks ? 2 * L->cap_chunks : 256;
        chunk *c = realloc(L->chunks, cap * sizeof *c);
        if (!c) return msm_err_set(err, -ENOMEM, "out of memory planning the weight load");
        L->chunks = c;
        L->cap_chunks = cap;
    }
    L->chunks[L->n_chunks++] = *k;
    L->total += chunk_span(k);
    L->stored += k->rows * k->cols * msm_dtype_size(k->dtype);
    return 0;
}

/* Cuts part p of weight wi (tensor t; scale: its FP8 block scales or NULL) into chunks of at most
 * slot_bytes. */
static int plan_part(loader *L, int wi, int p, const msm_st_tensor *t, const float *scale, msm_err *err) {
    const msm_weight *w = &L->g->weights[wi];
    const msm_wpart *pt = &w->parts[p];
    size_t es = msm_dtype_size(t->dtype), slot = L->slot_bytes;
    if (pt->row0 < 0 || pt->col0 < 0 || pt->n_rows < 0 || pt->n_cols < 0 ||
        pt->row0 + pt->n_rows > pt->src_rows || pt->col0 + pt->n_cols > pt->src_cols ||
        pt->expert < 0 || pt->expert >= w->n_expert || pt->dst_row < 0 ||
        pt->dst_row + pt->n_rows > w->rows || pt->n_cols > w->cols)
        return msm_err_set(err, -EINVAL, "weight %s: its part from tensor '%s' (rows %lld+%lld, cols "
                           "%lld+%lld of [%lld, %lld]) does not fit the tensor or the weight [%d, %d, %d]",
                           w->name, pt->src, (long long)pt->row0, (long long)pt->n_rows,
                           (long long)pt->col0, (long long)pt->n_cols, (long long)pt->src_rows,
                           (long long)pt->src_cols, w->n_expert, w->rows, w->cols);
    size_t pitch = (size_t)pt->src_cols * es, R = (size_t)pt->n_rows, C = (size_t)pt->n_cols;
    size_t seg = C * es;
    int64_t B = L->g->fp8_block;
    chunk k = {.src_pitch = pitch, .dst_pitch = (size_t)w->cols, .file = t->file_index, .wi = wi,
               .part = p, .dtype = t->dtype, .scale = scale,
               .scale_cols = scale ? (size_t)((pt->src_cols + B - 1) / B) : 0};
    uint64_t base = t->offset + ((uint64_t)pt->row0 * (uint64_t)pt->src_cols + (uint64_t)pt->col0) * es;
    size_t dst0 = ((size_t)pt->expert * (size_t)w->rows + (size_t)pt->dst_row) * (size_t)w->cols;
    if (R == 0 || C == 0) return 0;
    int r = 0;
    if (seg > slot) { /* a row longer than a slot: column pieces of one row each */
        size_t cmax = slot / es;
        for (size_t i = 0; i < R && r == 0; i++)
            for (size_t c0 = 0; c0 < C && r == 0; c0 += cmax) {
                k.rows = 1;
                k.cols = C - c0 < cmax ? C - c0 : cmax;
                k.off = base + i * pitch + c0 * es;
                k.dst_off = dst0 + i * (size_t)w->cols + c0;
                k.src_row = pt->row0 + (int64_t)i;
                k.src_col = pt->col0 + (int64_t)c0;
                r = add_chunk(L, &k, err);
            }
        return r;
    }
    k.cols = C;
    k.by_row = pitch - seg > L->row_gap;
    size_t per = k.by_row ? slot / seg : (slot - seg) / pitch + 1; /* rows per chunk, >= 1 */
    for (size_t i = 0; i < R && r == 0; i += per) {
        k.rows = R - i < per ? R - i : per;
        k.off = base + i * pitch;
        k.dst_off = dst0 + i * (size_t)w->cols;
        k.src_row = pt->row0 + (int64_t)i;
        k.src_col = pt->col0;
        r = add_chunk(L, &k, err);
    }
    return r;
}

static int cmp_chunk(const void *a, const void *b) {
    const chunk *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return (x->off > y->off) - (x->off < y->off);
}

static void fmt_shape(char *buf, size_t cap, const msm_st_tensor *t) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* The block scales of F8_E4M3 tensor t (part pt): X.weight_scale_inv next to X.weight, float32
 * (bf16 and f16 are read too: some checkpoints store them so), one per B x B block:
 * [ceil(R/B), ceil(C/B)] for an [R, C] weight, the last block of a row or column partial. A
 * scalar or one scale per row is another FP8 layout, refused with what was found. */
static int find_scales(const msm_graph *g, const msm_safetensors *st, const msm_wpart *pt,
                       const msm_st_tensor *t, const msm_st_tensor **ret, msm_err *err) {
    int64_t B = g->fp8_block;
    if (B <= 0)
        return msm_err_set(err, -EINVAL, "%.200s: tensor '%.128s' is F8_E4M3 but config.json declares no FP8 "
                           "quantization (quantization_config with quant_method \"fp8\" and weight_block_size "
                           "[128, 128])", t->file, pt->src);
    if (pt->src_ndim != 2)
        return msm_err_set(err, -EINVAL, "%.200s: tensor '%.128s' is F8_E4M3 but has %d dimension(s): only "
                           "matrices are FP8 block-scaled", t->file, pt->src, pt->src_ndim);
    int64_t want[2] = {(pt->src_rows + B - 1) / B, (pt->src_cols + B - 1) / B};
    char name[sizeof pt->src + 16];
    snprintf(name, sizeof name, "%s_scale_inv", pt->src);
    const msm_st_tensor *s = msm_safetensors_find(st, name);
    if (!s)
        return msm_err_set(err, -ENOENT, "%.200s: tensor '%.128s' is F8_E4M3 but its block scales '%.140s' "
                           "(float32 [%lld, %lld]) are missing", t->file, pt->src, name,
                           (long long)want[0], (long long)want[1]);
    if (s->dtype != MSM_F32 && s->dtype != MSM_BF16 && s->dtype != MSM_F16)
        return msm_err_set(err, -EINVAL, "%.200s: tensor '%.140s' (the block scales of an FP8 weight) is %s; "
                           "expected float32 (or bf16, f16)", s->file, name, msm_dtype_name(s->dtype));
    if (s->ndim == 2 && s->shape[0] == want[0] && s->shape[1] == want[1]) {
        *ret = s;
        return 0;
    }
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    const char *what = n == 1 ? "a per-tensor scale" :
                       (s->ndim == 1 && s->shape[0] == pt->src_rows) ||
                       (s->ndim == 2 && s->shape[0] == pt->src_rows && s->shape[1] == 1) ? "per-channel scales" :
                       s->ndim == 2 ? "block scales of another block size" : "not block scales";
    char have[128];
    fmt_shape(have, sizeof have, s);
    return msm_err_set(err, -EINVAL, "%.200s: tensor '%.140s' has shape %s (%s); FP8 weight [%lld, %lld] in "
                       "%lld x %lld blocks needs block scales [%lld, %lld] (only 128 x 128 block scales are "
                       "supported)", s->file, name, have, what, (long long)pt->src_rows, (long long)pt->src_cols,
                       (long long)B, (long long)B, (long long)want[0], (long long)want[1]);
}

/* Part pt's checkpoint tensor, shape-checked, and, when it is F8_E4M3, its block scales (else
 * NULL). No byte is read. */
static int find_part(const msm_graph *g, const msm_safetensors *st, const msm_wpart *pt,
                     const msm_st_tensor **ret_t, const msm_st_tensor **ret_s, msm_err *err) {
    const msm_st_tensor *t, *s = NULL;
    int64_t shape[2] = {pt->src_rows, pt->src_cols};
    int r = msm_safetensors_get(st, pt->src, pt->src_ndim, shape, &t, err);
    if (r == 0 && t->dtype == MSM_F8_E4M3) r = find_scales(g, st, pt, t, &s, err);
    if (r) return r;
    *ret_t = t;
    *ret_s = s;
    return 0;
}

int msm_weights_check(const msm_graph *g, const msm_safetensors *st, msm_err *err) {
    for (int wi = 0; wi < g->n_weights; wi++)
        for (int p = 0; p < g->weights[wi].n_parts; p++) {
            const msm_st_tensor *t, *s;
            int r = find_part(g, st, &g->weights[wi].parts[p], &t, &s, err);
            if (r) return r;
        }
    return 0;
}

static int file_fd(loader *L, int i, int *ret, msm_err *err);
static int read_at(loader *L, int file, const char *tname, int fd, void *dst, size_t n, uint64_t off,
                   msm_err *err);

/* Reads scale tensor s as float32 (pread, like the chunks; kept until the load ends); a scale
 * that is not finite would make its whole block NaN or infinite, so it is refused. */
static int read_scales(loader *L, const msm_st_tensor *s, const float **ret, msm_err *err) {
    if (L->n_scales == L->cap_scales) {
        size_t cap = L->cap_scales ? 2 * L->cap_scales : 64;
        float **p = realloc(L->scales, cap * sizeof *p);
        if (!p) return msm_err_set(err, -ENOMEM, "out of memory for the FP8 scales");
        L->scales = p;
        L->cap_scales = cap;
    }
    size_t n = (size_t)(s->shape[0] * s->shape[1]);
    float *f = malloc((n ? n : 1) * sizeof *f);
    void *raw = s->dtype == MSM_F32 ? (void *)f : malloc(s->nbytes ? s->nbytes : 1);
    if (!f || !raw) {
        free(f);
        return msm_err_set(err, -ENOMEM, "out of memory for the FP8 scales of '%.140s'", s->name);
    }
    L->scales[L->n_scales++] = f;
    int fd, r = file_fd(L, s->file_index, &fd, err);
    if (r == 0) r = read_at(L, s->file_index, s->name, fd, raw, s->nbytes, s->offset, err);
    if (raw != (void *)f) {
        if (r == 0) msm_convert_to_f32(f, raw, s->dtype, n);
        free(raw);
    }
    for (size_t i = 0; r == 0 && i < n; i++)
        if (!isfinite(f[i]))
            r = msm_err_set(err, -EINVAL, "%.200s: tensor '%.140s' holds a non-finite scale (%g) for block "
                            "[%lld, %lld]", s->file, s->name, (double)f[i], (long long)(i / (size_t)s->shape[1]),
                            (long long)(i % (size_t)s->shape[1]));
    if (r == 0) *ret = f;
    return r;
}

/* Every part's tensor looked up and shape-checked (and an FP8 one's scales read), cut into chunks,
 * sorted by file and offset; what each weight is made of noted for alloc_weights. */
/* msm_wsource of a weight, part by part: dtype (or mixed), and for FP8 parts whether each
 * starts on block boundaries and the column phase they share (fp8_phase -2 while none seen). */
static void source_begin(msm_wsource *ws) {
    *ws = (msm_wsource){.dtype = MSM_DTYPE_COUNT, .fp8_aligned = true, .fp8_phase = -2};
}
static void source_add(msm_wsource *ws, int p, const msm_wpart *pt, const msm_st_tensor *t, bool scaled, int64_t B) {
    ws->dtype = p == 0 || ws->dtype == t->dtype ? t->dtype : MSM_DTYPE_COUNT;
    if (!scaled) return;
    ws->fp8_aligned &= pt->row0 % B == 0 && pt->col0 % B == 0 && pt->dst_row % B == 0;
    int ph = (int)(pt->col0 % B);
    ws->fp8_phase = ws->fp8_phase == -2 || ws->fp8_phase == ph ? ph : -1;
}
static void source_end(msm_wsource *ws, int64_t B) {
    if (ws->dtype == MSM_F8_E4M3) {
        ws->fp8_block = (int)B;
        if (ws->fp8_phase < 0) ws->fp8_phase = -1;
    } else {
        ws->fp8_aligned = false, ws->fp8_phase = 0;
    }
}

int msm_weights_sources(const msm_graph *g, const msm_safetensors *st, msm_wsource *ret, msm_err *err) {
    for (int wi = 0; wi < g->n_weights; wi++) {
        source_begin(&ret[wi]);
        for (int p = 0; p < g->weights[wi].n_parts; p++) {
            const msm_st_tensor *t, *s;
            int r = find_part(g, st, &g->weights[wi].parts[p], &t, &s, err);
            if (r) return r;
            source_add(&ret[wi], p, &g->weights[wi].parts[p], t, s != NULL, g->fp8_block);
        }
        source_end(&ret[wi], g->fp8_block);
    }
    return 0;
}

static int plan(loader *L, msm_err *err) {
    const msm_graph *g = L->g;
    int64_t B = g->fp8_block;
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        msm_wsource *ws = &L->wsrc[wi];
        source_begin(ws);
        for (int p = 0; p < w->n_parts; p++) {
            const msm_wpart *pt = &w->parts[p];
            const msm_st_tensor *t, *s;
            const float *scale = NULL;
            int r = find_part(g, L->st, pt, &t, &s, err);
            if (r == 0 && s) r = read_scales(L, s, &scale, err);
            if (r == 0) r = plan_part(L, wi, p, t, scale, err);
            if (r) return r;
            source_add(ws, p, pt, t, s != NULL, B);
        }
        source_end(ws, B);
    }
    qsort(L->chunks, L->n_chunks, sizeof *L->chunks, cmp_chunk);
    return 0;
}

/* ---- readers ----------------------------------------------------------------------------- */

static void fail(loader *L, int rc, const msm_err *err) {
    pthread_mutex_lock(&L->mu);
    if (!L->rc) {
        L->rc = rc;
        L->err = *err;
    }
    atomic_store(&L->failed, true);
    pthread_mutex_unlock(&L->mu);
}

static int64_t mtime_ns(const struct stat *sb) {
    return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

/* The descriptor of file i, opened on first use: it must still be the file whose header was
 * read. -1 (and 0) for a checkpoint image in memory. */
static int file_fd(loader *L, int i, int *ret, msm_err *err) {
    const msm_st_file *f = msm_safetensors_file(L->st, (size_t)i);
    int r = 0;
    pthread_mutex_lock(&L->mu);
    if (L->fd[i] < 0 && (f->dev || f->ino)) {
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (fd < 0) {
            int e = errno;
            r = msm_err_set(err, -e, "%.200s: cannot open: %s (it was there when its header was read: "
                            "removed or renamed during the load?)", f->path, strerror(e));
        } else if (fstat(fd, &sb) < 0) {
            int e = errno;
            r = msm_err_set(err, -e, "%.200s: cannot stat: %s", f->path, strerror(e));
        } else if ((uint64_t)sb.st_dev != f->dev || (uint64_t)sb.st_ino != f->ino ||
                   (uint64_t)sb.st_size != f->size || mtime_ns(&sb) != f->mtime_ns) {
            r = msm_err_set(err, -ESTALE, "%.200s: changed since its header was read (%llu bytes then, "
                            "%lld now%s): replaced or rewritten during the load", f->path,
                            (unsigned long long)f->size, (long long)sb.st_size,
                            (uint64_t)sb.st_ino != f->ino ? ", another file" : "");
        } else {
            posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* a hint: larger read-ahead when cold */
            L->fd[i] = fd;
            fd = -1;
        }
        if (fd >= 0) close(fd);
    }
    *ret = L->fd[i];
    pthread_mutex_unlock(&L->mu);
    return r;
}

/* n bytes of tensor tname at offset off of file `file` into dst; a short read is the file having
 * been truncated. */
static int read_at(loader *L, int file, const char *tname, int fd, void *dst, size_t n, uint64_t off,
                   msm_err *err) {
    const msm_st_file *f = msm_safetensors_file(L->st, (size_t)file);
    if (fd < 0) { /* an image in memory: bounds were checked when its header was parsed */
        memcpy(dst, (const char *)f->base + off, n);
        return 0;
    }
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (char *)dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            return msm_err_set(err, -e, "%.200s: read failed at byte %llu (tensor '%.160s'): %s", f->path,
                               (unsigned long long)(off + got), tname, strerror(e));
        }
        if (r == 0) {
            struct stat sb;
            long long now = fstat(fd, &sb) == 0 ? (long long)sb.st_size : -1;
            return msm_err_set(err, -EIO, "%.200s: truncated during the load: tensor '%.160s' needs bytes "
                               "[%llu, %llu) but the file now ends at byte %lld (it had %llu when its "
                               "header was read)", f->path, tname, (unsigned long long)off,
                               (unsigned long long)(off + n), now, (unsigned long long)f->size);
        }
        got += (size_t)r;
    }
    return 0;
}

static int read_chunk(loader *L, const chunk *k, void *slot, msm_err *err) {
    int fd;
    int r = file_fd(L, k->file, &fd, err);
    size_t seg = k->cols * msm_dtype_size(k->dtype);
    const char *tname = L->g->weights[k->wi].parts[k->part].src;
    if (r == 0 && !k->by_row) return read_at(L, k->file, tname, fd, slot, chunk_span(k), k->off, err);
    for (size_t i = 0; r == 0 && i < k->rows; i++)
        r = read_at(L, k->file, tname, fd, (char *)slot + i * seg, seg, k->off + i * k->src_pitch, err);
    return r;
}

/* One reader: chunks from the shared counter until none is left or a reader failed. */
static int reader_run(loader *L, msm_err *err) {
    const msm_backend_vt *vt = L->b->vt;
    msm_wchan *c = NULL;
    int r = vt->chan_open(L->b, L->slot_bytes, L->slots, &c, err);
    while (r == 0 && !atomic_load(&L->failed)) {
        size_t i = atomic_fetch_add(&L->next, 1);
        if (i >= L->n_chunks) break;
        const chunk *k = &L->chunks[i];
        void *slot;
        r = vt->chan_slot(c, &slot, err);
        if (r == 0) r = read_chunk(L, k, slot, err);
        if (r == 0) {
            msm_wblock blk = {.wi = k->wi, .src_dtype = k->dtype, .src = slot,
                              .src_pitch = k->by_row ? k->cols * msm_dtype_size(k->dtype) : k->src_pitch,
                              .dst_off = k->dst_off, .dst_pitch = k->dst_pitch, .rows = k->rows, .cols = k->cols};
            if (k->scale) { /* the block holding the chunk's first element, and where in it that is */
                size_t B = (size_t)L->g->fp8_block, r0 = (size_t)k->src_row, c0 = (size_t)k->src_col;
                blk.scale = k->scale + (r0 / B) * k->scale_cols + c0 / B;
                blk.scale_pitch = k->scale_cols;
                blk.scale_r0 = r0 % B;
                blk.scale_c0 = c0 % B;
                blk.scale_block = (int)B;
            }
            r = vt->chan_put(c, &blk, err);
        }
        if (r == 0 && L->o && L->o->progress) {
            uint64_t n = chunk_span(k);
            L->o->progress(L->o->ctx, atomic_fetch_add(&L->done, n) + n, L->total);
        }
    }
    int r2 = vt->chan_close(c, r ? NULL : err); /* waits for this reader's copies in flight */
    if (r == 0) r = r2;
    if (r) fail(L, r, err);
    return r;
}

static void *reader_main(void *arg) {
    msm_err err = {{0}};
    reader_run(arg, &err);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int msm_weights_load(const msm_graph *g, const msm_safetensors *st, msm_backend *b,
                     const msm_load_opts *o, msm_load_stats *ret_stats, msm_err *err) {
    double t0 = now_s();
    loader L = {.g = g, .st = st, .b = b, .o = o};
    L.slot_bytes = o && o->slot_bytes ? (o->slot_bytes < 16 ? 16 : o->slot_bytes) : DEFAULT_SLOT;
    L.slots = o && o->slots > 0 ? o->slots : DEFAULT_SLOTS;
    L.row_gap = o && o->row_gap ? o->row_gap : DEFAULT_ROW_GAP;
    int threads = o && o->threads > 0 ? o->threads : DEFAULT_THREADS;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    size_t n_files = msm_safetensors_file_count(st);
    pthread_mutex_init(&L.mu, NULL);
    L.fd = malloc((n_files ? n_files : 1) * sizeof *L.fd);
    L.wsrc = calloc((size_t)(g->n_weights ? g->n_weights : 1), sizeof *L.wsrc);
    int r = L.fd && L.wsrc ? 0 : msm_err_set(err, -ENOMEM, "out of memory");
    for (size_t i = 0; L.fd && i < n_files; i++) L.fd[i] = -1;
    if (r == 0) r = plan(&L, err);
    if (r == 0) r = b->vt->alloc_weights(b, g, L.wsrc, err);
    if (r == 0 && o && o->progress) o->progress(o->ctx, 0, L.total);
    if (r == 0) {
        if ((size_t)threads > L.n_chunks) threads = L.n_chunks ? (int)L.n_chunks : 1;
        pthread_t tid[MAX_THREADS];
        int started = 0;
        for (int i = 1; i < threads; i++) {
            if (pthread_create(&tid[started], NULL, reader_main, &L) != 0) break; /* fewer readers */
            started++;
        }
        reader_run(&L, err); /* the caller is a reader too */
        for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
        threads = started + 1;
        r = L.rc;
        if (r) *err = L.err; /* the first failure, which may be another reader's */
    }
    for (size_t i = 0; L.fd && i < n_files; i++)
        if (L.fd[i] >= 0) close(L.fd[i]);
    free(L.fd);
    free(L.chunks);
    free(L.wsrc);
    for (size_t i = 0; i < L.n_scales; i++) free(L.scales[i]);
    free(L.scales);
    pthread_mutex_destroy(&L.mu);
    if (r == 0 && ret_stats)
        *ret_stats = (msm_load_stats){.bytes_read = L.total, .bytes_stored = L.stored,
                                      .seconds = now_s() - t0, .threads = threads,
                                      .staging_bytes = (size_t)threads * (size_t)L.slots * L.slot_bytes};
    return r;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* Whether value v feeds an op the passes fuse a LINEAR into (a router's top-k, a shared-expert
 * gate's sigmoid): that LINEAR's weight must stay bf16. */
static bool feeds_fused_op(const msm_graph *g, int v) {
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->op != MSM_OP_ROUTER_TOPK && n->op != MSM_OP_ROUTER_GROUP_TOPK && n->op != MSM_OP_SIGMOID) continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == v) return true;
    }
    return false;
}

void msm_weights_fp8_resident(const msm_graph *g, const msm_wsource *src, bool *ret) {
    for (int i = 0; i < g->n_weights; i++)
        ret[i] = src && src[i].dtype == MSM_F8_E4M3 && src[i].fp8_block == 128 && src[i].fp8_phase >= 0 &&
                 src[i].fp8_phase % 16 == 0 && !g->weights[i].keep_f32;
    /* bad[i]: some op reads weight i without an FP8 kernel (ret itself is still read below) */
    bool *bad = calloc((size_t)g->n_weights + 1, sizeof *bad);
    for (int ni = 0; bad && ni < g->n_nodes; ni++) {
        const msm_node *n = &g->nodes[ni];
        if (msm_op_is_prefetch(n->op)) continue; /* a hint: pulls the weight as it is stored */
        /* a LINEAR_ADD_RMSNORM's product only feeds its own add (w[0] is its LINEAR's weight) */
        bool lin = (n->op == MSM_OP_LINEAR && !feeds_fused_op(g, n->out[0])) || n->op == MSM_OP_LINEAR_ADD_RMSNORM;
        bool moe = n->op == MSM_OP_MOE_EXPERTS && n->w[0] >= 0 && n->w[1] >= 0 && ret[n->w[0]] && ret[n->w[1]];
        for (int j = 0; j < MSM_NODE_MAX_W; j++) {
            int wi = n->w[j];
            if (wi >= 0 && wi < g->n_weights && !((lin && j == 0) || (moe && j < 2))) bad[wi] = true;
        }
    }
    for (int i = 0; i < g->n_weights; i++) ret[i] = ret[i] && bad && !bad[i];
    free(bad);
}

static bool ends_with(const char *s, const char *t) {
    size_t n = strlen(s), m = strlen(t);
    return n >= m && !strcmp(s + n - m, t);
}

/* Dummy weights of an FP8 preset (the config declares FP8 block scales): the weights an FP8
 * checkpoint of it holds in FP8 (the attention, MLP and expert projections, as the official FP8
 * releases do; not embeddings, lm_head, norms, routers, gates or biases) are described as aligned
 * F8_E4M3 sources, so a backend that keeps FP8 weights resident stores and fills them as FP8 (the
 * CPU backend fills float32 as for any preset). Else NULL: every backend's own type. */
static msm_wsource *dummy_sources(const msm_graph *g) {
    if (!g->fp8_block || g->n_weights <= 0) return NULL;
    msm_wsource *src = calloc((size_t)g->n_weights, sizeof *src);
    for (int i = 0; src && i < g->n_weights; i++) {
        const char *nm = g->weights[i].name;
        bool q = !g->weights[i].is_norm && !g->weights[i].keep_f32 &&
                 (ends_with(nm, ".qkv") || ends_with(nm, ".o_proj") || ends_with(nm, "gate_up") || ends_with(nm, "_down"));
        src[i] = q ? (msm_wsource){.dtype = MSM_F8_E4M3, .fp8_block = g->fp8_block, .fp8_aligned = true, .fp8_phase = 0}
                   : (msm_wsource){.dtype = MSM_BF16};
    }
    return src;
}

int msm_weights_dummy(const msm_graph *g, uint64_t seed, msm_backend *b, msm_err *err) {
    msm_wsource *src = dummy_sources(g);
    if (g->fp8_block && g->n_weights > 0 && !src) return msm_err_set(err, -ENOMEM, "out of memory");
    int r = b->vt->alloc_weights(b, g, src, err);
    free(src);
    for (int wi = 0; wi < g->n_weights && r == 0; wi++) {
        const msm_weight *w = &g->weights[wi];
        /* uniform in ±sqrt(3)/sqrt(fan_in): unit-variance outputs, so activations stay sane */
        float scale = w->is_norm ? 0.0f : sqrtf(3.0f / (float)(w->cols > 1 ? w->cols : w->rows));
        r = b->vt->dummy_weight(b, wi, w, seed ^ name_hash(w->name), scale, err);
    }
    return r;
}
