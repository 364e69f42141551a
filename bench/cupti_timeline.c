/* cupti_timeline.c: a kernel timeline of any CUDA program, CUDA graph replays included, through
 * CUPTI's activity API (the device machine has ncu but no nsys: ncu serialises kernels and so
 * cannot show what overlaps in a graph or where a step waits). It is a CUDA injection library:
 *
 *   CUDA_INJECTION64_PATH=$PWD/libmsm_timeline.so MSM_TIMELINE_OUT=/tmp/t.csv \
 *       msmoe-bench decode --preset ... --batches 1 --steps 30
 *   python3 bench/timeline_summary.py /tmp/t.csv      # one replay of the step graph, per kernel
 *
 * The CUDA driver calls InitializeInjection() when it initialises; it enables concurrent-kernel
 * activity records (kernels keep running concurrently; CUPTI adds a timestamp per kernel) and
 * copy records (a step's inputs up and its tokens down, between the replays), and writes every
 * record at exit as CSV (a copy: no grid, "memcpy KIND BYTES B" as its name):
 *   start_ns,end_ns,stream,graph_id,graph_node,grid_x,grid_y,grid_z,block_x,regs,name
 * Errors go to stderr; they never stop the program under test. A benchmark aid, not part of
 * msmoed. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES ((size_t)8 << 20)

/* CUPTI hands buffers back on its own thread; the file is written under this lock. */
static pthread_mutex_t tl_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *tl_out;
static size_t tl_dropped;

static void CUPTIAPI tl_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void tl_csv_name(FILE *f, const char *name) {
    /* kernel names are C++ signatures: quote them, doubling any quote */
    fputc('"', f);
    for (const char *p = name ? name : "?"; *p; p++) {
        if (*p == '"') fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}

static void CUPTIAPI tl_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                         size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&tl_lock);
    while (tl_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            /* a copy as a row of its own: no grid, its kind and bytes as the name */
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            static const char *const kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                                "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"}; /* copyKind 0-10 */
            fprintf(tl_out, "%llu,%llu,%u,%u,%llu,0,0,0,0,0,\"memcpy %s %llu B\"\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->graphNodeId,
                    m->copyKind < sizeof kinds / sizeof kinds[0] ? kinds[m->copyKind] : "?",
                    (unsigned long long)m->bytes);
            continue;
        }
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(tl_out, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%d,%u,", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId, k->gridX,
                k->gridY, k->gridZ, k->blockX, (unsigned)k->registersPerThread);
        tl_csv_name(tl_out, k->name);
        fputc('\n', tl_out);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) tl_dropped += dropped;
    pthread_mutex_unlock(&tl_lock);
    free(buffer);
}

static void tl_finish(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&tl_lock);
    if (tl_out) {
        fclose(tl_out);
        tl_out = NULL;
    }
    if (tl_dropped) fprintf(stderr, "cupti_timeline: %zu records dropped\n", tl_dropped);
    pthread_mutex_unlock(&tl_lock);
}

static int tl_check(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return 0;
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "cupti_timeline: %s: %s\n", what, s ? s : "unknown error");
    return -1;
}

int InitializeInjection(void) {
    const char *path = getenv("MSM_TIMELINE_OUT");
    if (!path) path = "timeline.csv";
    tl_out = fopen(path, "w");
    if (!tl_out) {
        perror("cupti_timeline: MSM_TIMELINE_OUT");
        return 1; /* the program runs on without a timeline */
    }
    fputs("start_ns,end_ns,stream,graph_id,graph_node,grid_x,grid_y,grid_z,block_x,regs,name\n", tl_out);
    if (tl_check(cuptiActivityRegisterCallbacks(tl_buffer_requested, tl_buffer_completed), "register callbacks") ||
        tl_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records") ||
        tl_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copy records")) {
        fclose(tl_out);
        tl_out = NULL;
        return 1;
    }
    atexit(tl_finish);
    return 1;
}
