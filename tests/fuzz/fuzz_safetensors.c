/* libFuzzer target: the safetensors header parser, on a whole file image held in memory.
 *
 * Every accepted tensor's bytes are read end to end, so a range check that lets a tensor reach
 * past the buffer shows up as an ASan report rather than passing silently. */
#include <stddef.h>
#include <stdint.h>

#include "msm_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    msm_safetensors *st = NULL;
    msm_err err;
    if (msm_safetensors_open_mem(data, size, "fuzz.safetensors", &st, &err) < 0) return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < msm_safetensors_count(st); i++) {
        const msm_st_tensor *t = msm_safetensors_at(st, i);
        const uint8_t *p = t->data;
        for (size_t j = 0; j < t->nbytes; j++) sink ^= p[j];
        /* Lookups by name must find exactly this tensor, and get() must accept its own shape. */
        const msm_st_tensor *found = NULL;
        if (msm_safetensors_find(st, t->name) != t ||
            msm_safetensors_get(st, t->name, t->ndim, t->shape, &found, &err) != 0 || found != t)
            __builtin_trap();
    }
    (void)sink;
    msm_safetensors_free(st);
    return 0;
}
