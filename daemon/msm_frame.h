/* msm_frame: the wire framing of the msmoed API, in one place.
 *
 * A frame is a 4-byte big-endian length N, then N bytes of one protobuf message. The reader is an
 * incremental decoder fed with whatever a socket read returned: it handles frames split across
 * reads and several frames in one read, and checks N against the cap before allocating anything.
 * Protocol-agnostic: it hands out byte ranges; msm_api decodes them. */
#ifndef MSM_FRAME_H
#define MSM_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_err.h"

#define MSM_FRAME_HEADER 4
#define MSM_FRAME_DEFAULT_MAX (4u << 20)

typedef struct msm_frame_reader {
    uint32_t max_frame;   /* largest N accepted */
    uint8_t hdr[MSM_FRAME_HEADER];
    int hdr_have;         /* header bytes received of the current frame */
    uint8_t *buf;         /* [len] body of the current frame when it spans reads */
    uint32_t len;         /* N of the current frame (valid when hdr_have == 4) */
    uint32_t have;        /* body bytes received */
    bool failed;          /* a length error was reported; the reader refuses further input */
} msm_frame_reader;

void msm_frame_reader_init(msm_frame_reader *r, uint32_t max_frame);
void msm_frame_reader_done(msm_frame_reader *r);

/* Consumes bytes of data[0..n). Returns 1 when a frame is complete: ret_frame and ret_len receive its
 * body (valid until the next call; it may point into data), ret_used the bytes consumed so far;
 * call again with the rest. Returns 0 when all n bytes were consumed without completing a frame.
 * Returns -EMSGSIZE when a header announces a length over the cap (nothing allocated; the reader
 * then stays failed). */
int msm_frame_reader_feed(msm_frame_reader *r, const uint8_t *data, size_t n, size_t *ret_used,
                          const uint8_t **ret_frame, uint32_t *ret_len, msm_err *err);

/* Whether the reader is inside a frame (header or body partly received): EOF now = truncated. */
bool msm_frame_reader_partial(const msm_frame_reader *r);
/* Bytes of the current frame received so far and expected (expected 0 while in the header). */
void msm_frame_reader_progress(const msm_frame_reader *r, uint32_t *ret_have, uint32_t *ret_want);

static inline void msm_frame_put_header(uint8_t out[MSM_FRAME_HEADER], uint32_t len) {
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
}

static inline uint32_t msm_frame_get_header(const uint8_t in[MSM_FRAME_HEADER]) {
    return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
}

#endif
