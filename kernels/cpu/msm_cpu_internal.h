/* msm_cpu_internal: helpers the CPU reference kernels share across their files (not part of the
 * kernel API, msm_kernels.h). */
#ifndef MSM_CPU_INTERNAL_H
#define MSM_CPU_INTERNAL_H

/* Dot product with 8 independent partial sums so the compiler can vectorise it. Static inline so
 * each kernel file (linear, attention, moe) inlines it into its loops as before the split; the
 * summation order is fixed, so every caller gets the same bits. */
static inline float msm__cpu_dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

#endif
