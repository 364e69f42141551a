/* msm_weights: checkpoint → backend (see msm_weights.h). Each weight is assembled in a host
 * float32 staging buffer from its parts (TP slices, expert packing, q/k/v fusion), then handed to
 * the backend once. Shapes are checked against the config before any byte is read, so a wrong
 * checkpoint fails with the tensor's name and both shapes. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msm_kernels.h"
#include "msm_weights.h"

int msm_weights_load(const msm_graph *g, const msm_safetensors *st, msm_backend *b, msm_err *err) {
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
        float *buf = calloc(n ? n : 1, sizeof(float));
        if (!buf) return msm_err_set(err, -ENOMEM, "out of memory staging weight %s", w->name);
        int r = 0;
        for (int p = 0; p < w->n_parts && r == 0; p++) {
            const msm_wpart *pt = &w->parts[p];
            const msm_st_tensor *t;
            int64_t shape[2] = {pt->src_rows, pt->src_cols};
            r = msm_safetensors_get(st, pt->src, pt->src_ndim, shape, &t, err);
            if (r) break;
            size_t es = msm_dtype_size(t->dtype);
            for (int64_t i = 0; i < pt->n_rows; i++) {
                const char *src = (const char *)t->data + ((size_t)(pt->row0 + i) * (size_t)pt->src_cols + (size_t)pt->col0) * es;
                float *dst = buf + ((size_t)pt->expert * (size_t)w->rows + (size_t)(pt->dst_row + i)) * (size_t)w->cols;
                msm_convert_to_f32(dst, src, t->dtype, (size_t)pt->n_cols);
            }
        }
        if (r == 0) r = b->vt->load_weight(b, wi, w, buf, err);
        free(buf);
        if (r) return r;
    }
    return 0;
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
    for (int wi = 0; wi < g->n_weights; wi++) {
        const msm_weight *w = &g->weights[wi];
        size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
        /* uniform in ±sqrt(3)/sqrt(fan_in): unit-variance outputs, so activations stay sane */
        uint64_t s = seed ^ name_hash(w->name);
        float scale = w->is_norm ? 0.0f : sqrtf(3.0f / (float)(w->cols > 1 ? w->cols : w->rows));
        if (b->vt->dummy_weight && !w->keep_f32) { /* the backend's fill writes bf16 */
            int r = b->vt->dummy_weight(b, wi, w, s, scale, err);
            if (r) return r;
            continue;
        }
        float *buf = malloc(sizeof(float) * (n ? n : 1));
        if (!buf) return msm_err_set(err, -ENOMEM, "out of memory for dummy weight %s", w->name);
        for (size_t i = 0; i < n; i++)
            buf[i] = w->is_norm ? 1.0f : (2.0f * msm_rng_uniform(s, i) - 1.0f) * scale;
        int r = b->vt->load_weight(b, wi, w, buf, err);
        free(buf);
        if (r) return r;
    }
    return 0;
}
