/* msm_safetensors: a reader for Hugging Face safetensors checkpoints.
 *
 * Files are mmapped read-only; tensor data is never copied here. A checkpoint is either one
 * `model.safetensors` or `model.safetensors.index.json` naming shards. Every error names the
 * file and (where there is one) the tensor, and says what was expected.
 *
 * The weight loader (msm_weights.h) does not read tensors through the mapping: a file truncated
 * under a mapping raises SIGBUS on the next access. It preads each tensor's bytes at its file
 * offset instead, and checks each file is still the one whose header was read (msm_st_file). */
#ifndef MSM_SAFETENSORS_H
#define MSM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "msm_dtype.h"
#include "msm_err.h"

#define MSM_ST_MAX_DIMS 8

typedef struct msm_st_tensor {
    const char *name;                 /* tensor name, as in the header */
    const char *file;                 /* path of the file holding it */
    msm_dtype dtype;                  /* F32, F16, BF16 or F8_E4M3 (other dtypes are refused at
                                         open) */
    int ndim;
    int64_t shape[MSM_ST_MAX_DIMS];
    const void *data;                 /* points into the mapping */
    size_t nbytes;
    int file_index;                   /* the file holding it: msm_safetensors_file(st, file_index) */
    uint64_t offset;                  /* where its bytes start in that file */
} msm_st_tensor;

/* One file of a checkpoint, as it was when its header was read. */
typedef struct msm_st_file {
    const char *path;
    uint64_t size;                    /* bytes */
    uint64_t dev, ino;                /* identity (0, 0 for an image in memory) */
    int64_t mtime_ns;
    const void *base;                 /* the whole file: the mapping, or the caller's buffer */
} msm_st_file;

typedef struct msm_safetensors msm_safetensors;

/* Opens DIR/model.safetensors.index.json (and its shards) or else DIR/model.safetensors. */
int msm_safetensors_open_dir(const char *dir, msm_safetensors **ret, msm_err *err);

/* Opens one .safetensors file. Validates the header fully: 8-byte length within the file, JSON
 * object, each entry's dtype, shape, data_offsets in order, inside the data section, and
 * consistent with shape x dtype size. */
int msm_safetensors_open_file(const char *path, msm_safetensors **ret, msm_err *err);

/* Parses a safetensors image already in memory (a fuzzer's input, an embedded model) with the
 * same checks as msm_safetensors_open_file; `name` stands for the file in messages. Nothing is
 * copied: buf must outlive the returned object, and tensors point into it. */
int msm_safetensors_open_mem(const void *buf, size_t len, const char *name,
                             msm_safetensors **ret, msm_err *err);

/* Accepts NULL. Unmaps every file. */
void msm_safetensors_free(msm_safetensors *st);

/* NULL when absent. */
const msm_st_tensor *msm_safetensors_find(const msm_safetensors *st, const char *name);

/* Looks up `name` and checks it has exactly `ndim` dims equal to `shape`. Errors:
 * -ENOENT "missing tensor NAME (looked in FILE/DIR)", -EINVAL "tensor NAME in FILE has shape
 * [a, b], expected [c, d]". */
int msm_safetensors_get(const msm_safetensors *st, const char *name, int ndim,
                        const int64_t *shape, const msm_st_tensor **ret, msm_err *err);

size_t msm_safetensors_count(const msm_safetensors *st);
/* The files of the checkpoint: shards in name order (one file when there is no index). */
size_t msm_safetensors_file_count(const msm_safetensors *st);
/* NULL when i is out of range. */
const msm_st_file *msm_safetensors_file(const msm_safetensors *st, size_t i);
const msm_st_tensor *msm_safetensors_at(const msm_safetensors *st, size_t i);

#endif
