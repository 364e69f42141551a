/* Unit tests of the frame codec (daemon/frame.c): cap before allocation, partial reads, several
 * frames per read, truncation detection. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "msm_frame.h"

static size_t put(uint8_t *out, const char *body) {
    uint32_t n = (uint32_t)strlen(body);
    msm_frame_put_header(out, n);
    memcpy(out + 4, body, n);
    return 4 + n;
}

/* Feeds data in pieces of `step` bytes and collects the frames as strings. */
static int feed_all(msm_frame_reader *r, const uint8_t *data, size_t n, size_t step, char out[][64], int *ret_err) {
    int k = 0;
    *ret_err = 0;
    for (size_t off = 0; off < n;) {
        size_t len = n - off < step ? n - off : step, pos = 0;
        while (pos < len) {
            size_t used;
            const uint8_t *f;
            uint32_t fl;
            msm_err err;
            int rc = msm_frame_reader_feed(r, data + off + pos, len - pos, &used, &f, &fl, &err);
            pos += used;
            if (rc < 0) {
                *ret_err = rc;
                return k;
            }
            if (rc == 0)
                break;
            memcpy(out[k], f, fl);
            out[k++][fl] = 0;
        }
        off += len;
    }
    return k;
}

Test(frame, several_frames_in_one_read_and_byte_by_byte) {
    uint8_t buf[256];
    size_t n = put(buf, "hello");
    n += put(buf + n, "");
    n += put(buf + n, "world!");
    for (size_t step = 1; step <= n; step++) {
        msm_frame_reader r;
        char out[8][64];
        int e;
        msm_frame_reader_init(&r, 1024);
        int k = feed_all(&r, buf, n, step, out, &e);
        cr_assert_eq(e, 0);
        cr_assert_eq(k, 3, "step %zu: %d frames", step, k);
        cr_assert_str_eq(out[0], "hello");
        cr_assert_str_eq(out[1], "");
        cr_assert_str_eq(out[2], "world!");
        cr_assert(!msm_frame_reader_partial(&r));
        msm_frame_reader_done(&r);
    }
}

Test(frame, length_over_cap_refused_before_allocation) {
    msm_frame_reader r;
    msm_frame_reader_init(&r, 100);
    uint8_t hdr[4];
    msm_frame_put_header(hdr, 101);
    size_t used;
    const uint8_t *f;
    uint32_t fl;
    msm_err err;
    int rc = msm_frame_reader_feed(&r, hdr, 4, &used, &f, &fl, &err);
    cr_assert_eq(rc, -EMSGSIZE);
    cr_assert_null(r.buf, "nothing allocated for the oversized body");
    cr_assert(strstr(err.msg, "max_frame_bytes"));
    /* A 4 GiB length as well (what random bytes usually announce). */
    msm_frame_reader_done(&r);
    msm_frame_reader_init(&r, 100);
    uint8_t big[4] = {0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(msm_frame_reader_feed(&r, big, 4, &used, &f, &fl, &err), -EMSGSIZE);
    cr_assert_null(r.buf);
    /* And the reader stays failed. */
    cr_assert_eq(msm_frame_reader_feed(&r, big, 4, &used, &f, &fl, &err), -EMSGSIZE);
    msm_frame_reader_done(&r);
}

Test(frame, exactly_at_cap_accepted) {
    uint8_t *buf = calloc(1, 4 + 100);
    msm_frame_put_header(buf, 100);
    msm_frame_reader r;
    msm_frame_reader_init(&r, 100);
    size_t used;
    const uint8_t *f;
    uint32_t fl;
    msm_err err;
    cr_assert_eq(msm_frame_reader_feed(&r, buf, 50, &used, &f, &fl, &err), 0);
    cr_assert_eq(msm_frame_reader_feed(&r, buf + 50, 54, &used, &f, &fl, &err), 1);
    cr_assert_eq(fl, 100);
    msm_frame_reader_done(&r);
    free(buf);
}

Test(frame, partial_frame_is_reported_for_truncation) {
    uint8_t buf[64];
    size_t n = put(buf, "abcdefgh");
    msm_frame_reader r;
    msm_frame_reader_init(&r, 1024);
    size_t used;
    const uint8_t *f;
    uint32_t fl, have, want;
    msm_err err;
    cr_assert(!msm_frame_reader_partial(&r));
    cr_assert_eq(msm_frame_reader_feed(&r, buf, 2, &used, &f, &fl, &err), 0);
    cr_assert(msm_frame_reader_partial(&r), "inside the header");
    cr_assert_eq(msm_frame_reader_feed(&r, buf + 2, 5, &used, &f, &fl, &err), 0);
    cr_assert(msm_frame_reader_partial(&r), "inside the body");
    msm_frame_reader_progress(&r, &have, &want);
    cr_assert_eq(have, 3);
    cr_assert_eq(want, 8);
    cr_assert_eq(msm_frame_reader_feed(&r, buf + 7, n - 7, &used, &f, &fl, &err), 1);
    cr_assert(!msm_frame_reader_partial(&r), "a complete frame is not partial");
    msm_frame_reader_done(&r);
}

Test(frame, header_round_trip) {
    uint8_t h[4];
    uint32_t vals[] = {0, 1, 255, 256, 65535, 4u << 20, 0xffffffffu};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        msm_frame_put_header(h, vals[i]);
        cr_assert_eq(msm_frame_get_header(h), vals[i]);
    }
    msm_frame_put_header(h, 0x01020304);
    cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4, "big-endian");
}
