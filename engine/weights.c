/* msm_weights: checkpoint → backend (see msm_weights.h): a plan of chunks, then reader threads
 * that pread the chunks into their backend channel's staging slots, in file order.
 *
 * A chunk is a rectangular block of one part: `rows` rows of `cols` elements. Its bytes are one
 * contiguous span of the file when the part takes whole rows (most weights), or when a column
 * slice (a row-parallel TP weight) leaves little between its rows; there the span includes the
 * columns of the other ranks, which costs less than a system call per row. Otherwise (more than
 * row_gap bytes between the rows) it reads row by row, packed. A row longer than a slot is cut
 * into column pieces. */
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

/* Cuts part p of weight wi (tensor t) into chunks of at most slot_bytes. */
static int plan_part(loader *L, int wi, int p, const msm_st_tensor *t, msm_err *err) {
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
    chunk k = {.src_pitch = pitch, .dst_pitch = (size_t)w->cols, .file = t->file_index, .wi = wi,
               .part = p, .dtype = t->dtype};
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
        r = add_chunk(L, &k, err);
    }
    return r;
}

static int cmp_chunk(const void *a, const void *b) {
    const chunk *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return (x->off > y->off) - (x->off < y->off);
}

/* Every part's tensor looked up and shape-checked, cut into chunks, sorted by file and offset. */
static int plan(loader *L, msm_err *err) {
    const msm_graph *g = L->g;
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        for (int p = 0; p < w->n_parts; p++) {
            const msm_wpart *pt = &w->parts[p];
            const msm_st_tensor *t;
            int64_t shape[2] = {pt->src_rows, pt->src_cols};
            int r = msm_safetensors_get(L->st, pt->src, pt->src_ndim, shape, &t, err);
            if (r == 0) r = plan_part(L, wi, p, t, err);
            if (r) return r;
        }
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

/* n bytes at file offset off into dst; a short read is the file having been truncated. */
static int read_at(loader *L, const chunk *k, int fd, void *dst, size_t n, uint64_t off, msm_err *err) {
    const msm_st_file *f = msm_safetensors_file(L->st, (size_t)k->file);
    const char *tname = L->g->weights[k->wi].parts[k->part].src;
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
    if (r == 0 && !k->by_row) return read_at(L, k, fd, slot, chunk_span(k), k->off, err);
    for (size_t i = 0; r == 0 && i < k->rows; i++)
        r = read_at(L, k, fd, (char *)slot + i * seg, seg, k->off + i * k->src_pitch, err);
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
    int r = L.fd ? 0 : msm_err_set(err, -ENOMEM, "out of memory");
    for (size_t i = 0; L.fd && i < n_files; i++) L.fd[i] = -1;
    if (r == 0) r = plan(&L, err);
    if (r == 0) r = b->vt->alloc_weights(b, g, err);
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

int msm_weights_dummy(const msm_graph *g, uint64_t seed, msm_backend *b, msm_err *err) {
    int r = b->vt->alloc_weights(b, g, err);
    for (int wi = 0; wi < g->n_weights && r == 0; wi++) {
        const msm_weight *w = &g->weights[wi];
        /* uniform in ±sqrt(3)/sqrt(fan_in): unit-variance outputs, so activations stay sane */
        float scale = w->is_norm ? 0.0f : sqrtf(3.0f / (float)(w->cols > 1 ? w->cols : w->rows));
        r = b->vt->dummy_weight(b, wi, w, seed ^ name_hash(w->name), scale, err);
    }
    return r;
}
