/* msm_weights: fills a rank's weights (the graph's weight table) into its backend, from a
 * safetensors checkpoint at the speed of the disk, or from a deterministic random generator
 * (--dummy-weights).
 *
 * A checkpoint load plans first: every part of every weight (a row/column block of one checkpoint
 * tensor: a TP slice, one expert of a packed weight, q, k or v of a fused one) is checked against
 * its tensor's shape before any byte is read or any weight allocated, so a wrong checkpoint fails
 * at once with the tensor's name and both shapes. The parts are cut into chunks that fit a
 * staging slot and sorted by file and offset. Then `threads` readers (the calling thread is one)
 * take the chunks in that order, pread each into a staging slot of their own backend channel
 * (msm_backend_vt.chan_*) and hand it over: the CPU backend converts it straight into the float32
 * weight; the CUDA backend copies it in the checkpoint's dtype from pinned memory on the reader's
 * own stream while the reader reads the next chunk. Host memory stays at threads x slots x
 * slot_bytes, whatever the checkpoint's size.
 *
 * Files are read with pread, never through the mapping (a file truncated under a mapping raises
 * SIGBUS). A file is opened when its first chunk is read and must still be the file whose header
 * was parsed (device, inode, size, mtime); a read that comes back short or fails names the file,
 * the tensor and the bytes. On any error the other readers stop, every channel is closed and the
 * error of the first failure is returned: the caller frees the backend.
 *
 * FP8 block-scaled checkpoints (docs/adr/0006-fp8.md): an F8_E4M3 weight's scale_inv tensor is
 * checked and read while planning, and every chunk of it reaches the backend with the scales of
 * the blocks it covers (msm_wblock). */
#ifndef MSM_WEIGHTS_H
#define MSM_WEIGHTS_H

#include <stdint.h>

#include "msm_backend.h"
#include "msm_graph.h"
#include "msm_safetensors.h"

typedef struct msm_load_opts {
    int threads;          /* reader threads, the caller's included (0: 4; at most 64) */
    size_t slot_bytes;    /* one staging slot = the largest single read (0: 8 MiB; at least 16) */
    int slots;            /* slots per reader (0: 3): CUDA copies overlap the next reads */
    size_t row_gap;       /* a column slice whose rows lie further apart than this is read row by
                             row (0: 16 KiB, where a pread costs about what copying that much more
                             from the page cache does); tests make it small */
    /* Called once planning is done (done = 0) and after each chunk, with this load's bytes read
     * so far and in all. Readers call it from their own threads, several at once, so `done` may
     * arrive out of order; it must be quick and thread-safe. Tests use it as a fault hook. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *ctx;
} msm_load_opts;

typedef struct msm_load_stats {
    uint64_t bytes_read;   /* of weights from the checkpoint's files (column slices read whole
                              rows; FP8 block scales, read while planning, not counted) */
    uint64_t bytes_stored; /* of checkpoint-dtype elements handed to the backend */
    double seconds;        /* planning, allocation, reading and storing, until every put landed */
    int threads;           /* readers that ran */
    size_t staging_bytes;  /* host staging the readers held: threads x slots x slot_bytes */
} msm_load_stats;

/* Every part of every weight of g is in st with the shape g expects, and every F8_E4M3 one has
 * block scales of the right shape and dtype (and the config declared FP8): what msm_weights_load
 * checks before it reads anything, with no byte read (for validating a model before a load). */
int msm_weights_check(const msm_graph *g, const msm_safetensors *st, msm_err *err);

/* What each weight of g is made of in st (ret: [g->n_weights]), as msm_weights_load hands it to
 * alloc_weights, with no byte read. */
int msm_weights_sources(const msm_graph *g, const msm_safetensors *st, msm_wsource *ret, msm_err *err);

/* Loads every weight of g from st into b (which allocates them). ret_stats may be NULL. */
int msm_weights_load(const msm_graph *g, const msm_safetensors *st, msm_backend *b,
                     const msm_load_opts *o, msm_load_stats *ret_stats, msm_err *err);
int msm_weights_dummy(const msm_graph *g, uint64_t seed, msm_backend *b, msm_err *err);

/* Which weights a GPU backend keeps FP8 on the device (docs/adr/0006-fp8.md); the CUDA backend
 * and the CPU oracle that mirrors it (msm_backend_cpu_opts.fp8_as_cuda) share this rule. A weight
 * qualifies when its source (src, [g->n_weights]; NULL: none) is F8_E4M3 in 128 x 128 blocks,
 * all its parts start at the same column phase col0 % 128, a multiple of 16 (the FP8 GEMVs read
 * 16 codes under one scale), it is not keep_f32, and only ops with FP8 kernels read it in g (the
 * plain graph): a LINEAR as its matrix, unless that LINEAR feeds a router's top-k or a gate's
 * sigmoid (the passes fuse those into ops that read bf16), or MOE_EXPERTS when both its weights
 * qualify. ret[i] for every weight; false everywhere when out of memory. */
void msm_weights_fp8_resident(const msm_graph *g, const msm_wsource *src, bool *ret);

#endif
