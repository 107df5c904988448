/*
 * hcclpy CPU simulator: AscendCL runtime error codes.
 *
 * Numeric return codes of the runtime layer, as plain macros so they can be
 * used in C, C++ and preprocessor conditions alike. The values match the
 * CANN runtime; the simulator returns the same codes in the same situations.
 */
#ifndef HCCLPY_SIM_ACL_RT_ERROR_CODES_H
#define HCCLPY_SIM_ACL_RT_ERROR_CODES_H

/* Success. */
#define ACL_RT_SUCCESS                       0

/* 107xxx: errors caused by the caller (bad arguments, wrong state). */
#define ACL_ERROR_RT_PARAM_INVALID           107000 /* an argument is invalid */
#define ACL_ERROR_RT_INVALID_DEVICEID        107001 /* device id out of range */
#define ACL_ERROR_RT_CONTEXT_NULL            107002 /* the thread has no current context */
#define ACL_ERROR_RT_STREAM_CONTEXT          107003 /* stream belongs to another context */
#define ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID 107006 /* event carries no usable timestamp */
#define ACL_ERROR_RT_ADDR_UNALIGNED          107008 /* address does not meet the alignment rule */
#define ACL_ERROR_RT_STREAM_SUBSCRIBE        107011 /* stream is not subscribed to a report thread */
#define ACL_ERROR_RT_THREAD_SUBSCRIBE        107012 /* thread is not subscribed to a stream */
#define ACL_ERROR_RT_STREAM_NO_CB_REG        107015 /* no callback registered on the stream */
#define ACL_ERROR_RT_INVALID_HANDLE          107017 /* handle is not a live object */
#define ACL_ERROR_RT_WAIT_TIMEOUT            107019 /* a wait ran out of time */
#define ACL_ERROR_RT_TASK_TIMEOUT            107020 /* a task ran out of time */
#define ACL_ERROR_RT_DEVICE_TASK_ABORT       107022 /* device work was aborted */
#define ACL_ERROR_RT_STREAM_ABORT            107023 /* stream work was aborted */
#define ACL_ERROR_RT_CAPTURE_DEPENDENCY      107024 /* a capture depends on work it cannot record */
#define ACL_ERROR_RT_STREAM_UNJOINED         107025 /* a stream that joined a capture never rejoined it */
#define ACL_ERROR_RT_MODEL_CAPTURED          107026 /* the model is still being captured */
#define ACL_ERROR_RT_STREAM_CAPTURED         107027 /* the stream is capturing */
#define ACL_ERROR_RT_EVENT_CAPTURED          107028 /* the event was recorded in a capture under way */
#define ACL_ERROR_RT_STREAM_NOT_CAPTURED     107029 /* the stream is not capturing */
#define ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT 107030 /* the call is not allowed during a capture */
#define ACL_ERROR_STREAM_CAPTURE_CONFLICT    107032 /* the stream captures into another model */
#define ACL_ERROR_STREAM_TASK_GROUP_STATUS   107033 /* a task group begun, ended or updated out of turn */
#define ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED 107036 /* the capture was not begun on this stream */

/* 207xxx: resource and capability errors. */
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT     207000 /* feature not available here */
#define ACL_ERROR_RT_MEMORY_ALLOCATION       207001 /* allocation failed (out of memory) */
#define ACL_ERROR_RT_MEMORY_FREE             207002 /* releasing memory failed */
#define ACL_ERROR_RT_NO_DEVICE               207004 /* no device present */
#define ACL_ERROR_RT_RESOURCE_ALLOC_FAIL     207005 /* could not obtain a runtime resource */
#define ACL_ERROR_RT_NO_PERMISSION           207006 /* the caller is not allowed to do this */
#define ACL_ERROR_RT_NO_EVENT_RESOURCE       207007 /* no event could be created */
#define ACL_ERROR_RT_NO_STREAM_RESOURCE      207008 /* no stream could be created */
#define ACL_ERROR_RT_NO_MODEL_RESOURCE       207010 /* no model could be created */
#define ACL_ERROR_RT_OVER_LIMIT              207012 /* a resource count limit was exceeded */
#define ACL_ERROR_RT_DEVICE_OOM              207018 /* device memory exhausted */

/* 507xxx: failures inside the runtime or on the device. */
#define ACL_ERROR_RT_INTERNAL_ERROR          507000 /* internal runtime failure */
#define ACL_ERROR_RT_STREAM_NOT_COMPLETE     507004 /* stream still has pending work */
#define ACL_ERROR_RT_EVENT_NOT_COMPLETE      507006 /* event has not completed yet */
#define ACL_ERROR_RT_REPORT_TIMEOUT          507012 /* no host callback arrived in time */
#define ACL_ERROR_RT_AICPU_TIMEOUT           507017 /* AI CPU task ran out of time */
#define ACL_ERROR_RT_AICPU_EXCEPTION         507018 /* AI CPU task faulted */
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT     507046 /* stream synchronisation timed out */
#define ACL_ERROR_RT_EVENT_SYNC_TIMEOUT      507047 /* event synchronisation timed out */
#define ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED 507903 /* the capture was invalidated by a forbidden call */
#define ACL_ERROR_RT_SUSPECT_REMOTE_ERROR    507057 /* failure probably caused by a peer */
#define ACL_ERROR_RT_COMM_OP_RETRY_FAIL      507904 /* collective retry did not succeed */

#endif /* HCCLPY_SIM_ACL_RT_ERROR_CODES_H */
