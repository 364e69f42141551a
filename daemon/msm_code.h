/* msm_code: the gRPC-style status codes the API answers with (the values of msmoe.v1.Code), and
 * how the daemon's one error channel maps onto them.
 *
 * Inside the daemon a failure is a negative errno and an msm_err that carries it with a message
 * naming what was wrong (msm_err.h); that is true of the API edge, the scheduler, the server and
 * the engine alike. The gRPC code is not carried separately: it is derived from the errno, once,
 * where a reply is encoded, by msm_code_from_errno. So a function picks its errno by what went
 * wrong, and this table says what the client then sees:
 *
 *   -EINVAL                 a bad value in the request               INVALID_ARGUMENT
 *   -EBADMSG                a malformed frame (the connection closes) INVALID_ARGUMENT
 *   -ENOTSUP                the daemon lacks what the request needs   FAILED_PRECONDITION
 *                           (a tokenizer, or one matching the model)
 *   -ENOMEM, -ENOSPC (KV pool), -EAGAIN (a queue or in-flight limit),
 *   -EMSGSIZE (the frame cap), -EMFILE (the connection limit)         RESOURCE_EXHAUSTED
 *   -ENOENT                 no such request                           NOT_FOUND
 *   -ESHUTDOWN              the daemon is draining                    UNAVAILABLE
 *   -ETIMEDOUT                                                        DEADLINE_EXCEEDED
 *   -ECANCELED                                                        CANCELLED
 *   -ENOSYS                                                           UNIMPLEMENTED
 *   anything else (-EIO: the engine failed a step; -ENOTRECOVERABLE:
 *   it failed for good, and the daemon exits to be restarted)          INTERNAL */
#ifndef MSM_CODE_H
#define MSM_CODE_H

typedef enum msm_code {
    MSM_CODE_OK = 0,
    MSM_CODE_CANCELLED = 1,
    MSM_CODE_INVALID_ARGUMENT = 3,
    MSM_CODE_DEADLINE_EXCEEDED = 4,
    MSM_CODE_NOT_FOUND = 5,
    MSM_CODE_RESOURCE_EXHAUSTED = 8,
    MSM_CODE_FAILED_PRECONDITION = 9,
    MSM_CODE_UNIMPLEMENTED = 12,
    MSM_CODE_INTERNAL = 13,
    MSM_CODE_UNAVAILABLE = 14,
} msm_code;

/* Codes are below this (metrics count rejections per code in an array this long). */
#define MSM_CODE_LIMIT 16

/* "INVALID_ARGUMENT" etc.; "UNKNOWN" for a value outside the enum. */
const char *msm_code_name(msm_code c);

/* The code of a negative errno (the table above); 0 is OK. */
msm_code msm_code_from_errno(int err);

#endif
