/* msm_safetensors: reads Hugging Face safetensors checkpoints (see msm_safetensors.h).
 *
 * File format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
 * and then the data section; offsets are relative to its start. Files are mmapped read-only and
 * tensors point into the mapping, so opening a 60 GB checkpoint costs only its page tables.
 *
 * Everything in a header is checked before a tensor is handed out: a tensor's bytes lie inside
 * the file, agree with shape x dtype size, and do not overlap another tensor's. Each file keeps
 * its tensors sorted by name (for the weight_map check); the checkpoint keeps one sorted array of
 * pointers over all files, so a lookup is a binary search over ~20k names. */
#include "msm_safetensors.h"
#include "msm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers over 100 MB; so do we (json-c takes an int). */
#define ST_MAX_HEADER (100u << 20)
/* An index lists names only: 16 MiB is far above any real one (~2 MB for 20k tensors). */
#define ST_MAX_INDEX (16u << 20)

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* Messages quote names cut to these lengths, so a hostile header cannot push the file name
 * and the reason out of the 512-byte message. */
#define N_ "%.160s"
#define P_ "%.200s"

typedef struct st_file {
    char *path;              /* as opened; every tensor's `file` points here */
    const uint8_t *base;     /* the whole file: the mapping, or the caller's buffer */
    size_t size;
    bool mapped;             /* base came from mmap (else it belongs to the caller) */
    int index;               /* position in msm_safetensors.files */
    msm_st_file info;        /* what msm_safetensors_file hands out */
    msm_st_tensor *tensors;  /* sorted by name */
    size_t n_tensors;
    char *names;             /* one allocation holding every tensor name of this file */
} st_file;

struct msm_safetensors {
    char *where;                  /* the directory or file opened, for "missing tensor" */
    st_file *files;
    size_t n_files;
    const msm_st_tensor **sorted; /* all tensors of all files, sorted by name */
    size_t n;
};

/* ---- dtypes ---------------------------------------------------------------------------- */

/* Every dtype the format defines. F32, F16, BF16 and F8_E4M3 (float8_e4m3fn, the weights of FP8
 * block-scaled checkpoints, whose scales are F32/BF16 tensors) are weights we can load; the others
 * are recognised so the message can say "unsupported" rather than "unknown". */
static const struct {
    const char *name;
    bool supported;
    msm_dtype dtype;
} st_dtypes[] = {
    {"F32", true, MSM_F32},     {"F16", true, MSM_F16},      {"BF16", true, MSM_BF16},
    {"F64", false, 0},          {"I64", false, 0},           {"I32", false, 0},
    {"I16", false, 0},          {"I8", false, 0},            {"U64", false, 0},
    {"U32", false, 0},          {"U16", false, 0},           {"U8", false, 0},
    {"BOOL", false, 0},         {"F8_E4M3", true, MSM_F8_E4M3},       {"F8_E5M2", false, 0},
    {"F8_E8M0", false, 0},      {"F6_E2M3", false, 0},       {"F6_E3M2", false, 0},
    {"F4", false, 0},           {"C64", false, 0},
};

static int parse_dtype(const st_file *f, const char *tname, struct json_object *v,
                       msm_dtype *ret, msm_err *err) {
    if (!json_object_is_type(v, json_type_string))
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': 'dtype' must be a string",
                           f->path, tname);
    const char *s = json_object_get_string(v);
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(s, st_dtypes[i].name) != 0) continue;
        if (!st_dtypes[i].supported)
            return msm_err_set(err, -EINVAL,
                               P_ ": tensor '" N_ "' has dtype %s; only F32, F16, BF16 and "
                               "F8_E4M3 (block-scaled FP8) weights are supported", f->path, tname, s);
        *ret = st_dtypes[i].dtype;
        return 0;
    }
    return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "' has unknown dtype '%.32s' "
                       "(expected F32, F16, BF16 or F8_E4M3)", f->path, tname, s);
}

/* ---- one file's header ----------------------------------------------------------------- */

/* A JSON integer in [0, INT64_MAX]. json-c clamps larger values to INT64_MAX, which every later
 * range check then refuses, so clamping is safe here. */
static bool get_u63(struct json_object *v, int64_t *ret) {
    if (!json_object_is_type(v, json_type_int)) return false;
    int64_t x = json_object_get_int64(v);
    if (x < 0) return false;
    *ret = x;
    return true;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int parse_entry(const st_file *f, const char *tname, struct json_object *e,
                       const uint8_t *data, uint64_t data_size, msm_st_tensor *t,
                       uint64_t *ret_begin, msm_err *err) {
    struct json_object *jd, *js, *jo;
    if (!json_object_is_type(e, json_type_object))
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': entry must be a JSON object "
                           "with dtype, shape and data_offsets", f->path, tname);
    if (!json_object_object_get_ex(e, "dtype", &jd) || !json_object_object_get_ex(e, "shape", &js) ||
        !json_object_object_get_ex(e, "data_offsets", &jo))
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': entry must have dtype, shape "
                           "and data_offsets", f->path, tname);
    int rc = parse_dtype(f, tname, jd, &t->dtype, err);
    if (rc < 0) return rc;

    /* Shape: a list of at most MSM_ST_MAX_DIMS non-negative ints; [] is a scalar. */
    if (!json_object_is_type(js, json_type_array))
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': shape must be a list of "
                           "non-negative integers", f->path, tname);
    size_t ndim = json_object_array_length(js);
    if (ndim > MSM_ST_MAX_DIMS)
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "' has %zu dims, at most %d are "
                           "supported", f->path, tname, ndim, MSM_ST_MAX_DIMS);
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < ndim; i++) {
        int64_t d;
        if (!get_u63(json_object_array_get_idx(js, i), &d))
            return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': shape must be a list of "
                               "non-negative integers (dim %zu is not)", f->path, tname, i);
        t->shape[i] = d;
        overflow |= __builtin_mul_overflow(numel, (uint64_t)d, &numel);
    }
    t->ndim = (int)ndim;

    /* data_offsets: [begin, end], relative to the data section. */
    int64_t b, e_;
    if (!json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2 ||
        !get_u63(json_object_array_get_idx(jo, 0), &b) ||
        !get_u63(json_object_array_get_idx(jo, 1), &e_))
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': data_offsets must be two "
                           "non-negative integers [begin, end]", f->path, tname);
    if (e_ < b)
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "': data_offsets [%lld, %lld] "
                           "end before begin", f->path, tname, (long long)b, (long long)e_);
    uint64_t begin = (uint64_t)b, end = (uint64_t)e_, hdr = f->size - data_size;
    if (end > data_size)
        return msm_err_set(err, -EINVAL, P_ ": truncated: tensor '" N_ "' ends at byte %llu "
                           "but the file has %zu bytes", f->path, tname,
                           (unsigned long long)(hdr + end), f->size);
    uint64_t want = 0; /* the tensor's byte size; unset (and unused) when it overflows */
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)msm_dtype_size(t->dtype), &want) ||
        want != end - begin) {
        char shp[160];
        fmt_shape(shp, sizeof shp, t->ndim, t->shape);
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "' holds %llu bytes but shape %s "
                           "of %s needs %s%llu", f->path, tname,
                           (unsigned long long)(end - begin), shp, msm_dtype_name(t->dtype),
                           overflow ? "more than " : "",
                           overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)want);
    }
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    t->file_index = f->index;
    t->offset = (uint64_t)(data - f->base) + begin;
    *ret_begin = begin;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const msm_st_tensor *)a)->name, ((const msm_st_tensor *)b)->name);
}

/* Sorting key for the overlap check: tensors by where their bytes start. */
typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Parses and checks f->base[0, f->size) and fills f->tensors. */
static int st_file_parse(st_file *f, msm_err *err) {
    f->info.path = f->path;
    f->info.size = f->size;
    f->info.base = f->base;
    if (f->size < 8)
        return msm_err_set(err, -EINVAL, P_ ": truncated: the file has %zu bytes, fewer than "
                           "the 8-byte header length", f->path, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->base[i];
    if (hlen > f->size - 8)
        return msm_err_set(err, -EINVAL, P_ ": truncated or not a safetensors file: header "
                           "length %llu runs past the end of the file (%zu bytes)", f->path,
                           (unsigned long long)hlen, f->size);
    if (hlen > ST_MAX_HEADER)
        return msm_err_set(err, -EINVAL, P_ ": header length %llu exceeds the limit of %u bytes",
                           f->path, (unsigned long long)hlen, ST_MAX_HEADER);

    const char *text = (const char *)f->base + 8;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return msm_err_set(err, -ENOMEM, P_ ": out of memory", f->path);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *root = json_tokener_parse_ex(tok, text, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    /* Writers pad the header with spaces to align the data; anything else after it is junk. */
    while (root && end < hlen && text[end] && strchr(" \t\r\n", text[end])) end++;
    if (!root || end != hlen) {
        json_object_put(root);
        return msm_err_set(err, -EINVAL, P_ ": header is not valid JSON (%s at byte %zu of "
                           "%llu)", f->path, root ? "trailing data" :
                           jerr == json_tokener_continue ? "unexpected end" :
                           json_tokener_error_desc(jerr), end, (unsigned long long)hlen);
    }
    int rc = 0;
    span *spans = NULL;
    if (!json_object_is_type(root, json_type_object)) {
        rc = msm_err_set(err, -EINVAL, P_ ": header must be a JSON object", f->path);
        goto out;
    }

    /* Count the tensors and their name bytes, so each file makes two allocations. */
    size_t n = 0, name_bytes = 0;
    json_object_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_object_is_type(val, json_type_object) && !json_object_is_type(val, json_type_null)) {
                rc = msm_err_set(err, -EINVAL, P_ ": __metadata__ must be a JSON object", f->path);
                goto out;
            }
            continue;
        }
        n++;
        name_bytes += strlen(key) + 1;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->names = malloc(name_bytes ? name_bytes : 1);
    spans = malloc((n ? n : 1) * sizeof *spans);
    if (!f->tensors || !f->names || !spans) {
        rc = msm_err_set(err, -ENOMEM, P_ ": out of memory for %zu tensors", f->path, n);
        goto out;
    }

    const uint8_t *data = f->base + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    char *np = f->names;
    size_t i = 0;
    json_object_object_foreach(root, key2, val2) {
        if (strcmp(key2, "__metadata__") == 0) continue;
        msm_st_tensor *t = &f->tensors[i];
        size_t len = strlen(key2) + 1;
        memcpy(np, key2, len);
        t->name = np;
        t->file = f->path;
        np += len;
        rc = parse_entry(f, key2, val2, data, data_size, t, &spans[i].begin, err);
        if (rc < 0) goto out;
        spans[i].end = spans[i].begin + t->nbytes;
        spans[i].name = t->name;
        i++;
    }
    f->n_tensors = n;

    /* Two tensors sharing bytes means a corrupt (or hostile) header; empty ones share nothing. */
    qsort(spans, n, sizeof *spans, cmp_span);
    const span *prev = NULL;
    for (i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (prev && spans[i].begin < prev->end) {
            rc = msm_err_set(err, -EINVAL, P_ ": tensors '" N_ "' [%llu, %llu) and '" N_ "' "
                             "[%llu, %llu) overlap in the data section", f->path, prev->name,
                             (unsigned long long)prev->begin, (unsigned long long)prev->end,
                             spans[i].name, (unsigned long long)spans[i].begin,
                             (unsigned long long)spans[i].end);
            goto out;
        }
        prev = &spans[i];
    }
    qsort(f->tensors, n, sizeof *f->tensors, cmp_tensor_name);
out:
    free(spans);
    json_object_put(root);
    return rc;
}

static void st_file_done(st_file *f) {
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    free(f->tensors);
    free(f->names);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Maps `path` read-only into f (f->path must already be set). */
static int st_file_map(st_file *f, msm_err *err) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return msm_err_set(err, -e, P_ ": cannot open: %s", f->path, strerror(e));
    }
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0) {
        rc = msm_err_set(err, -errno, P_ ": cannot stat: %s", f->path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        rc = msm_err_set(err, -EINVAL, P_ ": not a regular file", f->path);
    } else if (sb.st_size < 8) {
        f->size = (size_t)sb.st_size;
        rc = msm_err_set(err, -EINVAL, P_ ": truncated: the file has %zu bytes, fewer than "
                         "the 8-byte header length", f->path, f->size);
    } else {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = msm_err_set(err, -errno, P_ ": cannot mmap %lld bytes: %s", f->path,
                             (long long)sb.st_size, strerror(errno));
        } else {
            f->base = p;
            f->size = (size_t)sb.st_size;
            f->mapped = true;
            f->info.dev = (uint64_t)sb.st_dev;
            f->info.ino = (uint64_t)sb.st_ino;
            f->info.mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        }
    }
    close(fd);
    return rc;
}

/* ---- the checkpoint -------------------------------------------------------------------- */

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const msm_st_tensor *const *)a)->name, (*(const msm_st_tensor *const *)b)->name);
}

/* Builds st->sorted over every file; a name in two files is an error. */
static int build_index(msm_safetensors *st, msm_err *err) {
    size_t n = 0;
    for (size_t i = 0; i < st->n_files; i++) n += st->files[i].n_tensors;
    st->sorted = malloc((n ? n : 1) * sizeof *st->sorted);
    if (!st->sorted) return msm_err_set(err, -ENOMEM, P_ ": out of memory", st->where);
    size_t k = 0;
    for (size_t i = 0; i < st->n_files; i++)
        for (size_t j = 0; j < st->files[i].n_tensors; j++) st->sorted[k++] = &st->files[i].tensors[j];
    qsort(st->sorted, n, sizeof *st->sorted, cmp_tensor_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(st->sorted[i - 1]->name, st->sorted[i]->name) == 0)
            return msm_err_set(err, -EINVAL, "tensor '" N_ "' is in both " P_ " and " P_,
                               st->sorted[i]->name, st->sorted[i - 1]->file, st->sorted[i]->file);
    st->n = n;
    return 0;
}

static msm_safetensors *st_new(const char *where, size_t n_files) {
    msm_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->where = strdup(where);
    st->files = calloc(n_files ? n_files : 1, sizeof *st->files);
    if (!st->where || !st->files) {
        msm_safetensors_free(st);
        return NULL;
    }
    st->n_files = n_files;
    for (size_t i = 0; i < n_files; i++) st->files[i].index = (int)i;
    return st;
}

void msm_safetensors_free(msm_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; st->files && i < st->n_files; i++) st_file_done(&st->files[i]);
    free(st->files);
    free(st->sorted);
    free(st->where);
    free(st);
}

/* Opens one file (mapped from disk, or the caller's buffer when buf != NULL). */
static int open_one(const char *path, const void *buf, size_t len, msm_safetensors **ret,
                    msm_err *err) {
    msm_safetensors *st = st_new(path, 1);
    if (!st) return msm_err_set(err, -ENOMEM, P_ ": out of memory", path);
    st_file *f = &st->files[0];
    int rc = -ENOMEM;
    if (!(f->path = strdup(path))) {
        msm_err_set(err, rc, P_ ": out of memory", path);
        goto fail;
    }
    if (buf) {
        f->base = buf;
        f->size = len;
    } else if ((rc = st_file_map(f, err)) < 0) {
        goto fail;
    }
    if ((rc = st_file_parse(f, err)) < 0 || (rc = build_index(st, err)) < 0) goto fail;
    *ret = st;
    return 0;
fail:
    msm_safetensors_free(st);
    return rc;
}

int msm_safetensors_open_file(const char *path, msm_safetensors **ret, msm_err *err) {
    return open_one(path, NULL, 0, ret, err);
}

int msm_safetensors_open_mem(const void *buf, size_t len, const char *name,
                             msm_safetensors **ret, msm_err *err) {
    if (!buf && len) return msm_err_set(err, -EINVAL, P_ ": no buffer", name);
    static const uint8_t empty[1];
    return open_one(name, buf ? buf : empty, len, ret, err);
}


static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from an index must stay inside the checkpoint directory. */
static bool shard_name_ok(const char *s) {
    if (!*s || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') return false;
        p += n + (q != NULL);
    }
    return true;
}

static const st_file *file_by_shard(const msm_safetensors *st, const char **shards, const char *s) {
    const char **hit = bsearch(&s, shards, st->n_files, sizeof *shards, cmp_str_ptr);
    return hit ? &st->files[hit - shards] : NULL;
}

static const msm_st_tensor *file_find(const st_file *f, const char *name) {
    msm_st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
}

/* Opens DIR/model.safetensors.index.json (text in `json`) and its shards. */
static int open_index(const char *dir, const char *ipath, const char *json, size_t len,
                      msm_safetensors **ret, msm_err *err) {
    struct json_object *root;
    int prc = msm_json_parse(json, len, ipath, &root, err);
    if (prc) return prc;
    int rc = 0;
    const char **shards = NULL;
    msm_safetensors *st = NULL;
    struct json_object *wm;
    if (!json_object_is_type(root, json_type_object) ||
        !json_object_object_get_ex(root, "weight_map", &wm) ||
        !json_object_is_type(wm, json_type_object) || json_object_object_length(wm) == 0) {
        rc = msm_err_set(err, -EINVAL, P_ ": expected a JSON object with a non-empty "
                         "\"weight_map\": {\"tensor\": \"shard file\"}", ipath);
        goto out;
    }

    /* The distinct shard names, sorted: each shard is mapped once. */
    size_t n_map = (size_t)json_object_object_length(wm), n_sh = 0;
    shards = malloc(n_map * sizeof *shards);
    if (!shards) {
        rc = msm_err_set(err, -ENOMEM, P_ ": out of memory", ipath);
        goto out;
    }
    json_object_object_foreach(wm, tname, sv) {
        if (!json_object_is_type(sv, json_type_string) || !shard_name_ok(json_object_get_string(sv))) {
            rc = msm_err_set(err, -EINVAL, P_ ": weight_map: tensor '" N_ "' must map to a shard "
                             "file name inside the directory", ipath, tname);
            goto out;
        }
        shards[n_sh++] = json_object_get_string(sv); /* owned by root */
    }
    qsort(shards, n_sh, sizeof *shards, cmp_str_ptr);
    size_t u = 0;
    for (size_t i = 0; i < n_sh; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n_sh = u;

    if (!(st = st_new(dir, n_sh))) {
        rc = msm_err_set(err, -ENOMEM, P_ ": out of memory", ipath);
        goto out;
    }
    for (size_t i = 0; i < n_sh; i++) {
        st_file *f = &st->files[i];
        if (!(f->path = path_join(dir, shards[i]))) {
            rc = msm_err_set(err, -ENOMEM, P_ ": out of memory", ipath);
            goto out;
        }
        if ((rc = st_file_map(f, err)) < 0 || (rc = st_file_parse(f, err)) < 0) {
            if (rc == -ENOENT)
                msm_err_wrap(err, rc, "shard listed in " INDEX_NAME " is missing");
            goto out;
        }
    }
    /* Every tensor the index promises must be in the shard it names. */
    json_object_object_foreach(wm, tname2, sv2) {
        const st_file *f = file_by_shard(st, shards, json_object_get_string(sv2));
        if (!f || !file_find(f, tname2)) {
            rc = msm_err_set(err, -ENOENT, P_ ": missing tensor '" N_ "' (" INDEX_NAME
                             " maps it to this shard)", f ? f->path : "?", tname2);
            goto out;
        }
    }
    if ((rc = build_index(st, err)) < 0) goto out;
    *ret = st;
    st = NULL;
out:
    msm_safetensors_free(st);
    free(shards);
    json_object_put(root);
    return rc;
}

int msm_safetensors_open_dir(const char *dir, msm_safetensors **ret, msm_err *err) {
    struct stat sb;
    if (stat(dir, &sb) < 0) {
        int e = errno;
        return msm_err_set(err, -e, P_ ": cannot open checkpoint directory: %s", dir, strerror(e));
    }
    if (!S_ISDIR(sb.st_mode))
        return msm_err_set(err, -ENOTDIR, P_ ": not a directory (expected a checkpoint "
                           "directory with " SINGLE_NAME " or " INDEX_NAME ")", dir);
    char *ipath = path_join(dir, INDEX_NAME), *spath = path_join(dir, SINGLE_NAME);
    char *json = NULL;
    size_t len = 0;
    int rc;
    if (!ipath || !spath) {
        rc = msm_err_set(err, -ENOMEM, P_ ": out of memory", dir);
    } else if ((rc = msm_read_file(ipath, ST_MAX_INDEX, &json, &len, err)) == 0) {
        rc = open_index(dir, ipath, json, len, ret, err);
    } else if (rc == -ENOENT) {
        if (access(spath, F_OK) == 0 || errno != ENOENT)
            rc = msm_safetensors_open_file(spath, ret, err);
        else
            rc = msm_err_set(err, -ENOENT, P_ ": no " INDEX_NAME " and no " SINGLE_NAME
                             " (not a safetensors checkpoint directory)", dir);
    }
    free(json);
    free(ipath);
    free(spath);
    return rc;
}

/* ---- lookups --------------------------------------------------------------------------- */

const msm_st_tensor *msm_safetensors_find(const msm_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    msm_st_tensor key = {.name = name};
    const msm_st_tensor *kp = &key;
    const msm_st_tensor *const *hit = bsearch(&kp, st->sorted, st->n, sizeof *st->sorted, cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

int msm_safetensors_get(const msm_safetensors *st, const char *name, int ndim,
                        const int64_t *shape, const msm_st_tensor **ret, msm_err *err) {
    const msm_st_tensor *t = msm_safetensors_find(st, name);
    if (!t)
        return msm_err_set(err, -ENOENT, "missing tensor '" N_ "' (looked in " P_ ")", name,
                           st ? st->where : "nothing");
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[120], want[120];
        fmt_shape(have, sizeof have, t->ndim, t->shape);
        fmt_shape(want, sizeof want, ndim > MSM_ST_MAX_DIMS ? MSM_ST_MAX_DIMS : ndim, shape);
        return msm_err_set(err, -EINVAL, P_ ": tensor '" N_ "' has shape %s, expected %s",
                           t->file, name, have, want);
    }
    *ret = t;
    return 0;
}

size_t msm_safetensors_count(const msm_safetensors *st) { return st ? st->n : 0; }

size_t msm_safetensors_file_count(const msm_safetensors *st) { return st ? st->n_files : 0; }

const msm_st_file *msm_safetensors_file(const msm_safetensors *st, size_t i) {
    return st && i < st->n_files ? &st->files[i].info : NULL;
}

const msm_st_tensor *msm_safetensors_at(const msm_safetensors *st, size_t i) {
    return st && i < st->n ? st->sorted[i] : NULL;
}
