/*
 * hcclpy CPU simulator: AscendCL base types.
 *
 * Handle typedefs, the aclError code type with its ACL_ERROR_* values, the
 * export-attribute macro shared by every ACL prototype, and aclrtGetSocName.
 */
#ifndef HCCLPY_SIM_ACL_BASE_RT_H
#define HCCLPY_SIM_ACL_BASE_RT_H

#include <stdint.h>
#include <stddef.h>

#include "error_codes/rt_error_codes.h"

/* Marks a function as exported from the shared library. */
#ifndef ACL_FUNC_VISIBILITY
#if defined(__GNUC__) || defined(__clang__)
#define ACL_FUNC_VISIBILITY __attribute__((visibility("default")))
#else
#define ACL_FUNC_VISIBILITY
#endif
#endif

/* Marks a function as deprecated with an explanatory message. Provided for
 * code that uses it; the simulator headers do not apply it themselves. */
#ifndef ACL_DEPRECATED_MESSAGE
#if defined(__GNUC__) || defined(__clang__)
#define ACL_DEPRECATED_MESSAGE(msg) __attribute__((deprecated(msg)))
#else
#define ACL_DEPRECATED_MESSAGE(msg)
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque runtime handles. */
typedef void *aclrtStream;          /* ordered queue of device work */
typedef void *aclmdlRITask;         /* task inside a captured model */
typedef void *aclrtEvent;           /* marker recorded on a stream */
typedef void *aclrtContext;         /* per-device execution context */
typedef void *aclrtNotify;          /* cross-stream notification */
typedef void *aclrtCntNotify;       /* counting notification */
typedef void *aclrtLabel;           /* branch label */
typedef void *aclrtLabelList;       /* list of labels */
typedef void *aclrtMbuf;            /* message buffer */
typedef void *aclrtAllocatorDesc;   /* description of a user allocator */
typedef void *aclrtAllocator;       /* user allocator */
typedef void *aclrtAllocatorBlock;  /* block handed out by a user allocator */
typedef void *aclrtAllocatorAddr;   /* address inside such a block */
typedef void *aclrtTaskGrp;         /* group of captured tasks */

/* Return code of every ACL function; 0 means success. */
typedef int aclError;

/* Raw bits of an IEEE half-precision value. */
typedef uint16_t aclFloat16;

/* Opaque data-buffer object (only ever handled by pointer). */
typedef struct aclDataBuffer aclDataBuffer;

/* Generic ACL result codes. */
static const int ACL_ERROR_NONE = 0;        /* success (old spelling) */
static const int ACL_SUCCESS = 0;           /* success */

/* 100xxx: caller errors. */
static const int ACL_ERROR_INVALID_PARAM = 100000;         /* bad argument */
static const int ACL_ERROR_UNINITIALIZE = 100001;          /* aclInit not called */
static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;     /* aclInit called twice (harmless) */
static const int ACL_ERROR_INVALID_FILE = 100003;          /* unusable file */
static const int ACL_ERROR_REPEAT_SUBSCRIBE = 100033;      /* stream already subscribed */
static const int ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034;  /* stream has no report thread */
static const int ACL_ERROR_THREAD_NOT_SUBSCRIBE = 100035;  /* thread is not subscribed */
static const int ACL_ERROR_WAIT_CALLBACK_TIMEOUT = 100036; /* no callback arrived in time */
static const int ACL_ERROR_REPEAT_FINALIZE = 100037;       /* aclFinalize called twice */

/* 200xxx: resource and capability errors. */
static const int ACL_ERROR_BAD_ALLOC = 200000;                  /* allocation failed */
static const int ACL_ERROR_API_NOT_SUPPORT = 200001;            /* API not available */
static const int ACL_ERROR_INVALID_DEVICE = 200002;             /* bad device */
static const int ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003;   /* misaligned address */
static const int ACL_ERROR_RESOURCE_NOT_MATCH = 200004;         /* resources do not belong together */
static const int ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005;    /* dead or foreign handle */
static const int ACL_ERROR_FEATURE_UNSUPPORTED = 200006;        /* feature not available */
static const int ACL_ERROR_PROF_MODULES_UNSUPPORTED = 200007;   /* profiling module not available */

/* 300xxx: storage limits. */
static const int ACL_ERROR_STORAGE_OVER_LIMIT = 300000;         /* storage limit exceeded */

/* 500xxx: internal failures. */
static const int ACL_ERROR_INTERNAL_ERROR = 500000;      /* internal failure */
static const int ACL_ERROR_FAILURE = 500001;             /* generic failure */
static const int ACL_ERROR_GE_FAILURE = 500002;          /* graph-engine failure */
static const int ACL_ERROR_RT_FAILURE = 500003;          /* runtime failure */
static const int ACL_ERROR_DRV_FAILURE = 500004;         /* driver failure */
static const int ACL_ERROR_PROFILING_FAILURE = 500005;   /* profiling failure */

/* Element types of tensors and buffers. */
typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_UINT64 = 10,
    ACL_DOUBLE = 11,
    ACL_BOOL = 12,
    ACL_STRING = 13,
    ACL_COMPLEX64 = 16,
    ACL_COMPLEX128 = 17,
    ACL_BF16 = 27,
    ACL_INT4 = 29,
    ACL_UINT1 = 30,
    ACL_COMPLEX32 = 33,
    ACL_HIFLOAT8 = 34,
    ACL_FLOAT8_E5M2 = 35,
    ACL_FLOAT8_E4M3FN = 36,
    ACL_FLOAT8_E8M0 = 37,
    ACL_FLOAT6_E3M2 = 38,
    ACL_FLOAT6_E2M3 = 39,
    ACL_FLOAT4_E2M1 = 40,
    ACL_FLOAT4_E1M2 = 41
} aclDataType;

/* Bytes of one element of dataType; 0 for a type without a whole-byte element (strings, the
 * 4-, 6- and 1-bit types) or an unknown one. */
ACL_FUNC_VISIBILITY size_t aclDataTypeSize(aclDataType dataType);

/* Name of the SoC the process runs on (static string, NULL on failure). */
ACL_FUNC_VISIBILITY const char *aclrtGetSocName(void);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_ACL_BASE_RT_H */
