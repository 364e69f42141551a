/* msmoe_bench: the parts of the msmoe-bench tool that live in their own files. */
#ifndef MSMOE_BENCH_H
#define MSMOE_BENCH_H

/* `msmoe-bench load ...` (msmoe-bench-load.c): argv[1] is "load". Returns the exit status. */
int msm_bench_load(int argc, char **argv);

/* Milliseconds on the monotonic clock. */
double msm_bench_now_ms(void);

#endif
