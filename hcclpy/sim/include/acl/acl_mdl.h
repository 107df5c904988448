/*
 * hcclpy CPU simulator: model run instances built by stream capture ("aclgraph").
 *
 * Between aclmdlRICaptureBegin and aclmdlRICaptureEnd, the work queued on the stream (and on the
 * streams that join it through events) is recorded instead of run; aclmdlRIExecuteAsync queues
 * the recorded work again, as often as wanted.
 */
#ifndef HCCLPY_SIM_ACL_MDL_H
#define HCCLPY_SIM_ACL_MDL_H

#include "acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *aclmdlRI;     /* a model run instance: captured work */
typedef void *aclrtTaskGrp; /* a group of captured tasks that can be updated */

/* Which threads may call the functions that are unsafe during a capture (aclrtMemcpy,
 * aclrtMemset, aclrtMemcpy2d, and asynchronous copies of pageable host memory). */
typedef enum {
    ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0,   /* no thread, unless it switched itself to RELAXED */
    ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL, /* not the capturing thread */
    ACL_MODEL_RI_CAPTURE_MODE_RELAXED,      /* any thread */
} aclmdlRICaptureMode;

typedef enum {
    ACL_MODEL_RI_CAPTURE_STATUS_NONE = 0,    /* the stream is not capturing */
    ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE,      /* it is */
    ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED, /* it was, and a forbidden call spoiled the capture */
} aclmdlRICaptureStatus;

/* Record, instead of running, the work queued on stream (not a default stream) from now on. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode);
/* Whether stream captures, and into which model. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus *status,
                                                    aclmdlRI *modelRI);
/* End the capture begun on stream; *modelRI: the recorded work. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI);
/* Set the calling thread's capture mode to *mode; *mode: the one it had. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode *mode);
/* Queue the recorded work on stream. */
ACL_FUNC_VISIBILITY aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream);
/* Free a model (queued executions keep what they use). */
ACL_FUNC_VISIBILITY aclError aclmdlRIDestroy(aclmdlRI modelRI);
/* The tasks captured on stream between these two form a group that can be updated. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureTaskGrpBegin(aclrtStream stream);
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureTaskGrpEnd(aclrtStream stream, aclrtTaskGrp *handle);
/* The tasks queued on stream (not capturing) between these two replace the group's, one for one
 * and of the same kinds, instead of running. */
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream stream, aclrtTaskGrp handle);
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_ACL_MDL_H */
