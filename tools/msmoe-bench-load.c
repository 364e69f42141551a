/* msmoe-bench load: checkpoint load time against a plain read of the same files, in one run.
 *
 *   msmoe-bench load --model DIR [--backend cpu|cuda] [--tp N] [--threads N] [--repeat N]
 *                    [--cold] [--no-cuda-graphs] [--slot-kb N]
 * First two plain reads of the checkpoint's files: `cat`-like (one thread, 128 KiB read()s, in
 * file order) and parallel (pread of 8 MiB chunks by as many threads as the engine's readers,
 * every rank's together), then msm_engine_new (repeat times): its weight load (GB read, seconds,
 * GB/s) and start to ready (graphs captured). Each line has the CPU time the process spent (user +
 * system, since the phase began: the engine's two lines share one start) and its peak resident
 * memory during that phase (VmHWM, reset before each). --cold drops the files from the page cache
 * (posix_fadvise DONTNEED, after which the resident share is printed) before every measurement;
 * without it a first untimed read warms the cache. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "msm_engine.h"
#include "msm_safetensors.h"
#include "msmoe_bench.h"

/* ---- load ---------------------------------------------------------------------------------- */

typedef struct ckpt_files {
    char **path;
    uint64_t *size;
    int n;
    uint64_t bytes;
} ckpt_files;

/* Peak resident memory since the last reset (VmHWM), in bytes; 0 when unknown. */
static uint64_t peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0; silently not elsewhere). */
static void reset_peak_rss(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd >= 0) {
        if (write(fd, "5", 1) != 1) { /* an older kernel: the peak then spans the whole run */
        }
        close(fd);
    }
}

/* Drops every file from the page cache; returns the share of their pages still resident. */
static double drop_cache(const ckpt_files *cf) {
    uint64_t resident = 0, pages = 0;
    long psz = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < cf->n; i++) {
        int fd = open(cf->path[i], O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        size_t n = (size_t)((cf->size[i] + (uint64_t)psz - 1) / (uint64_t)psz);
        void *m = cf->size[i] ? mmap(NULL, cf->size[i], PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        unsigned char *v = malloc(n ? n : 1);
        if (m != MAP_FAILED && v && mincore(m, cf->size[i], v) == 0)
            for (size_t k = 0; k < n; k++) resident += v[k] & 1;
        pages += n;
        free(v);
        if (m != MAP_FAILED) munmap(m, cf->size[i]);
        close(fd);
    }
    return pages ? (double)resident / (double)pages : 0.0;
}

/* cat: one thread, 128 KiB read() calls, file after file. */
static int read_cat(const ckpt_files *cf) {
    char *buf = malloc(128u << 10);
    int rc = buf ? 0 : -ENOMEM;
    for (int i = 0; rc == 0 && i < cf->n; i++) {
        int fd = open(cf->path[i], O_RDONLY);
        if (fd < 0) rc = -errno;
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        ssize_t r;
        while (fd >= 0 && (r = read(fd, buf, 128u << 10)) > 0) {
        }
        if (fd >= 0) close(fd);
    }
    free(buf);
    return rc;
}

/* Parallel: 8 MiB chunks of every file in order, taken from a shared counter by each thread. */
typedef struct par_read {
    const ckpt_files *cf;
    int *fd;
    atomic_uint_fast64_t next;
    uint64_t n_chunks, per_file[64];
} par_read;

#define PAR_CHUNK (8u << 20)

static void *par_main(void *arg) {
    par_read *p = arg;
    char *buf = malloc(PAR_CHUNK);
    for (uint64_t c; buf && (c = atomic_fetch_add(&p->next, 1)) < p->n_chunks;) {
        int f = 0;
        while (c >= p->per_file[f]) c -= p->per_file[f++];
        for (uint64_t off = c * PAR_CHUNK, end = off + PAR_CHUNK; off < end && off < p->cf->size[f];) {
            ssize_t r = pread(p->fd[f], buf, end - off, (off_t)off);
            if (r <= 0) break;
            off += (uint64_t)r;
        }
    }
    free(buf);
    return NULL;
}

static int read_parallel(const ckpt_files *cf, int threads) {
    par_read p = {.cf = cf};
    int fds[64];
    p.fd = fds;
    for (int i = 0; i < cf->n; i++) {
        fds[i] = open(cf->path[i], O_RDONLY);
        if (fds[i] < 0) return -errno;
        posix_fadvise(fds[i], 0, 0, POSIX_FADV_SEQUENTIAL);
        p.per_file[i] = (cf->size[i] + PAR_CHUNK - 1) / PAR_CHUNK;
        p.n_chunks += p.per_file[i];
    }
    pthread_t t[64];
    int n = 0;
    for (int i = 1; i < threads && i < 64; i++)
        if (pthread_create(&t[n], NULL, par_main, &p) == 0) n++;
    par_main(&p);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < cf->n; i++) close(fds[i]);
    return 0;
}

/* CPU seconds of the process so far: user and system. */
static void cpu_s(double *user, double *sys) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* One line: what, GB, wall seconds, GB/s, CPU seconds (user + sys) since u0/s0, peak RSS. */
static void print_row(const char *what, uint64_t bytes, double s, double u0, double s0, uint64_t rss) {
    double u, y;
    cpu_s(&u, &y);
    printf("%-58s %8.4f %8.3f %8.2f %6.2f+%-5.2f %8.2f\n", what, (double)bytes / 1e9, s,
           s > 0 ? (double)bytes / 1e9 / s : 0.0, u - u0, y - s0, (double)rss / 1e9);
    fflush(stdout);
}

int msm_bench_load(int argc, char **argv) {
    msm_engine_opts o;
    msm_engine_opts_default(&o);
    int repeat = 1, cold = 0, threads = 0;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"backend", required_argument, 0, 'b'},
        {"tp", required_argument, 0, 't'}, {"threads", required_argument, 0, 'T'},
        {"repeat", required_argument, 0, 'r'}, {"cold", no_argument, 0, 'c'},
        {"no-cuda-graphs", no_argument, 0, 'G'}, {"slot-kb", required_argument, 0, 'S'}, {0, 0, 0, 0}};
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'm': o.model_dir = optarg; break;
        case 'b': o.backend = strcmp(optarg, "cuda") == 0 ? MSM_BACKEND_CUDA : MSM_BACKEND_CPU; break;
        case 't': o.tp = atoi(optarg); break;
        case 'T': threads = atoi(optarg); break;
        case 'S': o.load_slot_bytes = (size_t)atol(optarg) << 10; break;
        case 'r': repeat = atoi(optarg); break;
        case 'c': cold = 1; break;
        case 'G': o.cuda_graphs = false; break;
        default: return 2;
        }
    }
    if (!o.model_dir || o.tp < 1 || repeat < 1) {
        fprintf(stderr, "usage: msmoe-bench load --model DIR [--backend cpu|cuda] [--tp N] [--threads N] "
                        "[--repeat N] [--cold] [--no-cuda-graphs] [--slot-kb N]\n");
        return 2;
    }
    o.load_threads = threads;
    msm_err err = {{0}};
    msm_safetensors *st;
    if (msm_safetensors_open_dir(o.model_dir, &st, &err) < 0) {
        fprintf(stderr, "msmoe-bench: %s\n", err.msg);
        return 1;
    }
    ckpt_files cf = {0};
    cf.n = (int)msm_safetensors_file_count(st);
    if (cf.n > 64) {
        fprintf(stderr, "msmoe-bench: %d files; at most 64 are supported\n", cf.n);
        return 1;
    }
    cf.path = calloc((size_t)cf.n, sizeof *cf.path);
    cf.size = calloc((size_t)cf.n, sizeof *cf.size);
    for (int i = 0; i < cf.n; i++) {
        const msm_st_file *f = msm_safetensors_file(st, (size_t)i);
        cf.path[i] = strdup(f->path);
        cf.size[i] = f->size;
        cf.bytes += f->size;
    }
    msm_safetensors_free(st);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = threads > 0 ? threads : (int)(ncpu / o.tp < 1 ? 1 : ncpu / o.tp > 8 ? 8 : ncpu / o.tp);
    int par = per_rank * o.tp;
    printf("# load %s: %d file(s), %.3f GB; backend %s, tp %d, %d reader thread(s) per rank, %ld CPUs, "
           "page cache %s\n", o.model_dir, cf.n, (double)cf.bytes / 1e9,
           o.backend == MSM_BACKEND_CUDA ? "cuda" : "cpu", o.tp, per_rank, ncpu,
           cold ? "dropped before each line (--cold)" : "warm");
    printf("%-58s %8s %8s %8s %12s %8s\n", "what", "GB", "s", "GB/s", "CPU usr+sys", "peak RSS");
    if (!cold) read_cat(&cf); /* warm the cache */
    char what[128];
    for (int pass = 0; pass < 2; pass++) {
        if (cold) printf("# page cache dropped: %.1f%% of the files still resident\n", 100.0 * drop_cache(&cf));
        reset_peak_rss();
        double u0, s0, t = msm_bench_now_ms();
        cpu_s(&u0, &s0);
        int rc = pass == 0 ? read_cat(&cf) : read_parallel(&cf, par);
        t = (msm_bench_now_ms() - t) / 1e3;
        if (rc < 0) {
            fprintf(stderr, "msmoe-bench: reading the checkpoint: %s\n", strerror(-rc));
            return 1;
        }
        if (pass == 0) snprintf(what, sizeof what, "plain read, cat-like (1 thread, 128 KiB reads)");
        else snprintf(what, sizeof what, "plain read, pread (%d threads, 8 MiB chunks)", par);
        print_row(what, cf.bytes, t, u0, s0, peak_rss());
    }
    int rc = 0;
    for (int i = 0; i < repeat && rc == 0; i++) {
        if (cold) printf("# page cache dropped: %.1f%% of the files still resident\n", 100.0 * drop_cache(&cf));
        reset_peak_rss();
        msm_engine *e;
        double u0, s0, t = msm_bench_now_ms();
        cpu_s(&u0, &s0);
        if (msm_engine_new(&o, &e, &err) < 0) {
            fprintf(stderr, "msmoe-bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        t = (msm_bench_now_ms() - t) / 1e3;
        const msm_load_summary *sm = msm_engine_load_summary(e);
        uint64_t rss = peak_rss();
        snprintf(what, sizeof what, "engine %d: weights read (%d threads/rank, %.0f MB staging)", i + 1,
                 sm->threads, (double)sm->staging_bytes / 1e6);
        print_row(what, sm->bytes_read, sm->load_s, u0, s0, rss);
        snprintf(what, sizeof what, "engine %d: start to ready (%s)", i + 1,
                 o.backend == MSM_BACKEND_CUDA && o.cuda_graphs ? "graphs captured" : "no graphs");
        print_row(what, cf.bytes, t, u0, s0, rss);
        msm_engine_free(e);
    }
    if (o.backend == MSM_BACKEND_CPU)
        printf("# peak RSS on the CPU backend includes its float32 weights (2x a bf16 checkpoint)\n");
    for (int i = 0; i < cf.n; i++) free(cf.path[i]);
    free(cf.path);
    free(cf.size);
    return rc;
}
