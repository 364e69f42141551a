/* msm_code: names of the status codes and the errno -> code table (see msm_code.h). */
#include "msm_code.h"

#include <errno.h>

const char *msm_code_name(msm_code c) {
    switch (c) {
    case MSM_CODE_OK: return "OK";
    case MSM_CODE_CANCELLED: return "CANCELLED";
    case MSM_CODE_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case MSM_CODE_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case MSM_CODE_NOT_FOUND: return "NOT_FOUND";
    case MSM_CODE_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case MSM_CODE_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case MSM_CODE_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case MSM_CODE_INTERNAL: return "INTERNAL";
    case MSM_CODE_UNAVAILABLE: return "UNAVAILABLE";
    }
    return "UNKNOWN";
}

msm_code msm_code_from_errno(int err) {
    switch (-err) {
    case 0: return MSM_CODE_OK;
    case EINVAL:
    case EBADMSG: return MSM_CODE_INVALID_ARGUMENT;
    case ENOTSUP: return MSM_CODE_FAILED_PRECONDITION;
    case ENOMEM:
    case ENOSPC:
    case EAGAIN:
    case EMSGSIZE:
    case EMFILE: return MSM_CODE_RESOURCE_EXHAUSTED;
    case ENOENT: return MSM_CODE_NOT_FOUND;
    case ESHUTDOWN: return MSM_CODE_UNAVAILABLE;
    case ETIMEDOUT: return MSM_CODE_DEADLINE_EXCEEDED;
    case ECANCELED: return MSM_CODE_CANCELLED;
    case ENOSYS: return MSM_CODE_UNIMPLEMENTED;
    default: return MSM_CODE_INTERNAL;
    }
}
