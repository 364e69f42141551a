/* msm_frame: incremental decoder of length-prefixed frames (see msm_frame.h). */
#include "msm_frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void msm_frame_reader_init(msm_frame_reader *r, uint32_t max_frame) {
    memset(r, 0, sizeof *r);
    r->max_frame = max_frame;
}

void msm_frame_reader_done(msm_frame_reader *r) {
    if (!r)
        return;
    free(r->buf);
    r->buf = NULL;
    r->hdr_have = 0;
    r->have = 0;
}

bool msm_frame_reader_partial(const msm_frame_reader *r) {
    /* A frame that was just handed out is complete, not partial (the reset is lazy). */
    return r->hdr_have > 0 && !(r->hdr_have == MSM_FRAME_HEADER && r->have == r->len);
}

void msm_frame_reader_progress(const msm_frame_reader *r, uint32_t *ret_have, uint32_t *ret_want) {
    if (r->hdr_have < MSM_FRAME_HEADER) {
        *ret_have = (uint32_t)r->hdr_have;
        *ret_want = 0;
    } else {
        *ret_have = r->have;
        *ret_want = r->len;
    }
}

int msm_frame_reader_feed(msm_frame_reader *r, const uint8_t *data, size_t n, size_t *ret_used,
                          const uint8_t **ret_frame, uint32_t *ret_len, msm_err *err) {
    size_t used = 0;

    if (r->failed)
        return msm_err_set(err, -EMSGSIZE, "frame reader is in a failed state");
    /* The previous call returned a copied frame: release it before starting the next. */
    if (r->hdr_have == MSM_FRAME_HEADER && r->have == r->len) {
        free(r->buf);
        r->buf = NULL;
        r->hdr_have = 0;
        r->have = 0;
    }
    while (used < n) {
        if (r->hdr_have < MSM_FRAME_HEADER) {
            size_t k = MSM_FRAME_HEADER - (size_t)r->hdr_have;
            if (k > n - used)
                k = n - used;
            memcpy(r->hdr + r->hdr_have, data + used, k);
            r->hdr_have += (int)k;
            used += k;
            if (r->hdr_have < MSM_FRAME_HEADER)
                break;
            r->len = msm_frame_get_header(r->hdr);
            r->have = 0;
            /* The cap is checked here, before anything is allocated for the body. */
            if (r->len > r->max_frame) {
                r->failed = true;
                *ret_used = used;
                return msm_err_set(err, -EMSGSIZE, "frame length %u exceeds server.max_frame_bytes = %u",
                                   r->len, r->max_frame);
            }
            if (r->len == 0) {
                *ret_frame = data + used; /* empty body; pointer is never read */
                *ret_len = 0;
                *ret_used = used;
                return 1;
            }
        }
        size_t avail = n - used;
        if (r->have == 0 && avail >= r->len) {
            /* The whole body is in this read: hand it out without copying. */
            *ret_frame = data + used;
            *ret_len = r->len;
            used += r->len;
            r->have = r->len;
            *ret_used = used;
            return 1;
        }
        if (!r->buf) {
            r->buf = malloc(r->len);
            if (!r->buf)
                return msm_err_set(err, -ENOMEM, "out of memory for a %u-byte frame", r->len);
        }
        size_t k = r->len - r->have;
        if (k > avail)
            k = avail;
        memcpy(r->buf + r->have, data + used, k);
        r->have += (uint32_t)k;
        used += k;
        if (r->have == r->len) {
            *ret_frame = r->buf;
            *ret_len = r->len;
            *ret_used = used;
            return 1;
        }
    }
    *ret_used = used;
    return 0;
}
