/* msm_weights: fills a rank's weights (the graph's weight table) into its backend, from a
 * safetensors checkpoint (each part sliced from its tensor, shapes checked, converted to
 * float32 on the way) or from a deterministic random generator (--dummy-weights). */
#ifndef MSM_WEIGHTS_H
#define MSM_WEIGHTS_H

#include <stdint.h>

#include "msm_backend.h"
#include "msm_graph.h"
#include "msm_safetensors.h"

int msm_weights_load(const msm_graph *g, const msm_safetensors *st, msm_backend *b, msm_err *err);
int msm_weights_dummy(const msm_graph *g, uint64_t seed, msm_backend *b, msm_err *err);

#endif
