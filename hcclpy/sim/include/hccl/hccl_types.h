/*
 * hcclpy CPU simulator: HCCL data types.
 *
 * Result codes, handle types, reduction and element-type enums, the opaque
 * root-info token, the versioned communicator config (config version 11
 * layout, 2248 bytes on LP64) and the batch send/receive descriptor.
 *
 * Constants are macros (not typed const objects) so that they are usable as
 * array bounds and in preprocessor conditions in C as well as C++.
 */
#ifndef HCCLPY_SIM_HCCL_TYPES_H
#define HCCLPY_SIM_HCCL_TYPES_H

#include <stdint.h>

/* Marks an HCCL function as exported from the shared library. */
#ifndef HCCL_API
#if defined(__GNUC__) || defined(__clang__)
#define HCCL_API __attribute__((visibility("default")))
#else
#define HCCL_API
#endif
#endif

/* ---- sizes ------------------------------------------------------------- */

#define HCCL_ROOT_INFO_BYTES              4108U /* length of the root-info token */
#define BUFFER_NAME_MAX_LENGTH            128U  /* shared CCL buffer name */
#define COMM_NAME_MAX_LENGTH              128U  /* communicator name */
#define UDI_MAX_LENGTH                    128U  /* user-defined information */
#define HCCL_COMM_ALGO_MAX_LENGTH         1600U /* algorithm selection string */
#define HCCL_COMM_RETRY_ENABLE_MAX_LENGTH 50U   /* retry enable string */
#define HCCL_COMM_RETRY_PARAMS_MAX_LENGTH 128U  /* retry parameters string */

/* ---- communicator config constants ------------------------------------ */

#define HCCL_COMM_CONFIG_INFO_BYTES          24U          /* size/magic/version header */
#define HCCL_COMM_CONFIG_MAGIC_WORD          0xf0f0f0f0U  /* proves the header was initialised */
#define HCCL_COMM_CONFIG_VERSION             11U          /* layout version of HcclCommConfig below */
#define HCCL_COMM_DEFAULT_BUFFSIZE           200U         /* MB */
#define HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET    0xffffffffU  /* buffer size left to env/default */
#define HCCL_COMM_DEFAULT_DETERMINISTIC      0U           /* non-deterministic */
#define HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET 0xffffffffU /* determinism left to env/default */
#define HCCL_COMM_DEFAULT_OP_EXPANSION_MODE  0U           /* library picks the mode */
#define HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET 0xffffffffU /* RDMA TC left to env/default */
#define HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET 0xffffffffU /* RDMA SL left to env/default */
#define HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET (-1)         /* int32_t; timeout left to env/default */
#define HCCL_COMM_QOS_CONFIG_NOT_SET         0xffffffffU  /* QoS left to env/default */
#define HCCL_COMM_SQ_DEPTH_CONFIG_NOT_SET    0xffffffffU  /* SQ depth left to env/default */
#define HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE 16ULL        /* GB of symmetric VA per rank */

#ifdef __cplusplus
extern "C" {
#endif

/* Return code of every HCCL function; 0 means success. */
typedef enum {
    HCCL_SUCCESS = 0,              /* success */
    HCCL_E_PARA = 1,               /* bad argument */
    HCCL_E_PTR = 2,                /* null or unusable pointer */
    HCCL_E_MEMORY = 3,             /* memory error */
    HCCL_E_INTERNAL = 4,           /* internal error */
    HCCL_E_NOT_SUPPORT = 5,        /* not supported */
    HCCL_E_NOT_FOUND = 6,          /* resource not found */
    HCCL_E_UNAVAIL = 7,            /* resource unavailable */
    HCCL_E_SYSCALL = 8,            /* system call failed */
    HCCL_E_TIMEOUT = 9,            /* timed out */
    HCCL_E_OPEN_FILE_FAILURE = 10, /* could not open a file */
    HCCL_E_TCP_CONNECT = 11,       /* TCP connection failed */
    HCCL_E_ROCE_CONNECT = 12,      /* RoCE connection failed */
    HCCL_E_TCP_TRANSFER = 13,      /* TCP transfer failed */
    HCCL_E_ROCE_TRANSFER = 14,     /* RoCE transfer failed */
    HCCL_E_RUNTIME = 15,           /* runtime call failed */
    HCCL_E_DRV = 16,               /* driver call failed */
    HCCL_E_PROFILING = 17,         /* profiling call failed */
    HCCL_E_CCE = 18,               /* CCE call failed */
    HCCL_E_NETWORK = 19,           /* network call failed */
    HCCL_E_AGAIN = 20,             /* try again */
    HCCL_E_REMOTE = 21,            /* error reported by a peer */
    HCCL_E_SUSPENDING = 22,        /* communicator is suspending */
    HCCL_E_OPRETRY_FAIL = 23,      /* operation retry not possible */
    HCCL_E_OOM = 24,               /* out of memory */
    HCCL_E_IN_STATUS = 1041,       /* details are in the status */
    HCCL_E_RESERVED                /* end marker */
} HcclResult;

/* Communicator handle. */
typedef void *HcclComm;

/* Connection handle. */
typedef void *HcclConn;

/* Registered symmetric-memory window handle. */
typedef void *HcclCommSymWindow;

/* Reduction applied by reducing collectives. */
typedef enum {
    HCCL_REDUCE_SUM = 0,
    HCCL_REDUCE_PROD = 1,
    HCCL_REDUCE_MAX = 2,
    HCCL_REDUCE_MIN = 3,
    HCCL_REDUCE_RESERVED = 255 /* never a valid argument */
} HcclReduceOp;

/* Element type of a buffer. */
typedef enum {
    HCCL_DATA_TYPE_INT8 = 0,
    HCCL_DATA_TYPE_INT16 = 1,
    HCCL_DATA_TYPE_INT32 = 2,
    HCCL_DATA_TYPE_FP16 = 3,
    HCCL_DATA_TYPE_FP32 = 4,
    HCCL_DATA_TYPE_INT64 = 5,
    HCCL_DATA_TYPE_UINT64 = 6,
    HCCL_DATA_TYPE_UINT8 = 7,
    HCCL_DATA_TYPE_UINT16 = 8,
    HCCL_DATA_TYPE_UINT32 = 9,
    HCCL_DATA_TYPE_FP64 = 10,
    HCCL_DATA_TYPE_BFP16 = 11,     /* bfloat16 */
    HCCL_DATA_TYPE_INT128 = 12,
    HCCL_DATA_TYPE_HIF8 = 14,      /* hifloat8 (13 is unused) */
    HCCL_DATA_TYPE_FP8E4M3 = 15,
    HCCL_DATA_TYPE_FP8E5M2 = 16,
    HCCL_DATA_TYPE_FP8E8M0 = 17,
    HCCL_DATA_TYPE_RESERVED = 255  /* never a valid argument */
} HcclDataType;

/* Selector for the process-wide HcclSetConfig / HcclGetConfig. */
typedef enum {
    HCCL_DETERMINISTIC = 0, /* 0 off, 1 deterministic, 2 strict */
#ifndef OPEN_BUILD_PROJECT
    HCCL_ACCELERATOR,       /* 0 default, 1 CCU, 2 AIV, 3 AICPU_TS, 4 HOSTCPU_TS, 5 AICPU */
#endif
    HCCL_CONFIG_RESERVED    /* end marker */
} HcclConfig;

/* Value passed to / returned by HcclSetConfig / HcclGetConfig. */
typedef union HcclConfigValue {
    int32_t value;
} HcclConfigValue;

/* Opaque token that lets every rank find the root; shipped as raw bytes. */
typedef struct HcclRootInfoDef {
    char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

/*
 * Per-communicator configuration. Initialise with HcclCommConfigInit, then
 * overwrite the fields of interest. The first 24 bytes hold a header:
 * size_t size @0, uint32_t magic word @8, uint32_t version @12, 8 zero bytes
 * @16. The library reads only the fields that exist for that version.
 */
typedef struct HcclCommConfigDef {
    char reserved[HCCL_COMM_CONFIG_INFO_BYTES];            /* @0    header (see above) */
    uint32_t hcclBufferSize;                               /* @24   v1: CCL buffer size, MB */
    uint32_t hcclDeterministic;                            /* @28   v1: 0 off, 1 on, 2 strict */
    char hcclCommName[COMM_NAME_MAX_LENGTH];               /* @32   v2: communicator name */
    char hcclUdi[UDI_MAX_LENGTH];                          /* @160  v3: free-form user info */
    uint32_t hcclOpExpansionMode;                          /* @288  v4: 0 default, 1 host, 2 aicpu, 3 aiv, 4 aiv-only */
    uint32_t hcclRdmaTrafficClass;                         /* @292  v5: RDMA traffic class */
    uint32_t hcclRdmaServiceLevel;                         /* @296  v5: RDMA service level */
    uint32_t hcclWorldRankID;                              /* @300  v6: rank in the world job */
    uint64_t hcclJobID;                                    /* @304  v6: job id */
    uint8_t aclGraphZeroCopyEnable;                        /* @312  v7: 1 = zero-copy in graph capture */
    int32_t hcclExecTimeOut;                               /* @316  v8: execution timeout, seconds */
    char hcclAlgo[HCCL_COMM_ALGO_MAX_LENGTH];              /* @320  v8: algorithm selection */
    char hcclRetryEnable[HCCL_COMM_RETRY_ENABLE_MAX_LENGTH]; /* @1920 v8: retry enable */
    char hcclRetryParams[HCCL_COMM_RETRY_PARAMS_MAX_LENGTH]; /* @1970 v8: retry parameters */
    char hcclBufferName[BUFFER_NAME_MAX_LENGTH];           /* @2098 v9: shared buffer name */
    uint32_t hcclQos;                                      /* @2228 v10: SDMA QoS level */
    uint64_t hcclSymWinMaxMemSizePerRank;                  /* @2232 v10: symmetric VA size, GB */
    uint32_t hcclChannelSqDepth;                           /* @2240 v11: channel SQ depth */
} HcclCommConfig;

/* Config items; item X is supported when X < HcclGetCommConfigCapability(). */
typedef enum {
    HCCL_COMM_CONFIG_BUFFER_SIZE = 0,
    HCCL_COMM_CONFIG_DETERMINISTIC = 1,
    HCCL_COMM_CONFIG_COMM_NAME = 2,
    HCCL_COMM_CONFIG_OP_EXPANSION_MODE = 3,
    HCCL_COMM_CONFIG_SUPPORT_INIT_BY_ENV = 4,
    HCCL_COMM_CONFIG_WORLD_RANKID = 5,
    HCCL_COMM_CONFIG_JOBID = 6,
    HCCL_COMM_CONFIG_ACLGRAPH_ZEROCOPY_ENABLE = 7,
    HCCL_COMM_CONFIG_EXEC_TIMEOUT = 8,
    HCCL_COMM_CONFIG_ALGO = 9,
    HCCL_COMM_CONFIG_RETRY = 10,
    HCCL_COMM_CONFIG_BUFFER_NAME = 11,
    HCCL_COMM_CONFIG_RESERVED     /* end marker */
} HcclCommConfigCapability;

/* Direction of one HcclSendRecvItem. */
typedef enum {
    HCCL_SEND = 0,
    HCCL_RECV = 1,
    HCCL_SEND_RECV_RESERVED /* end marker */
} HcclSendRecvType;

/* One point-to-point transfer of HcclBatchSendRecv (32 bytes on LP64). */
typedef struct HcclSendRecvItemDef {
    HcclSendRecvType sendRecvType; /* @0  send or receive */
    void *buf;                     /* @8  device buffer */
    uint64_t count;                /* @16 number of elements */
    HcclDataType dataType;         /* @24 element type */
    uint32_t remoteRank;           /* @28 peer rank in the communicator */
} HcclSendRecvItem;

/* Identifiers of collective operations. */
typedef enum {
    HCCL_CMD_INVALID = 0,
    HCCL_CMD_BROADCAST = 1,
    HCCL_CMD_ALLREDUCE,           /* 2 */
    HCCL_CMD_REDUCE,              /* 3 */
    HCCL_CMD_SEND,                /* 4 */
    HCCL_CMD_RECEIVE,             /* 5 */
    HCCL_CMD_ALLGATHER,           /* 6 */
    HCCL_CMD_REDUCE_SCATTER,      /* 7 */
    HCCL_CMD_ALLTOALLV,           /* 8 */
    HCCL_CMD_ALLTOALLVC,          /* 9 */
    HCCL_CMD_ALLTOALL,            /* 10 */
    HCCL_CMD_GATHER,              /* 11 */
    HCCL_CMD_SCATTER,             /* 12 */
    HCCL_CMD_BATCH_SEND_RECV,     /* 13 */
    HCCL_CMD_BATCH_PUT,           /* 14 */
    HCCL_CMD_BATCH_GET,           /* 15 */
    HCCL_CMD_ALLGATHER_V,         /* 16 */
    HCCL_CMD_REDUCE_SCATTER_V,    /* 17 */
    HCCL_CMD_BATCH_WRITE,         /* 18 */
    HCCL_CMD_HALF_ALLTOALLV = 20,
    HCCL_CMD_ALL,                 /* 21 */
    HCCL_CMD_FINALIZE = 100,
    HCCL_CMD_INTER_GROUP_SYNC,    /* 101 */
    HCCL_CMD_INIT,                /* 102 */
    HCCL_CMD_BARRIER,             /* 103 */
    HCCL_CMD_MAX                  /* 104 */
} HcclCMDType;

/* State of a communicator. */
typedef enum {
    HCCL_COMM_STATUS_READY = 0,
    HCCL_COMM_STATUS_SUSPENDING = 1,
    HCCL_COMM_STATUS_INVALID = 254,
    HCCL_COMM_STATUS_RESERVED = 255
} HcclCommStatus;

/* Phase reported to a communicator-state callback. */
typedef enum {
    HCCL_COMM_STATE_PHASE_INVALID = -1,
    HCCL_COMM_STATE_PHASE_DESTROY_PRE = 0,  /* about to destroy */
    HCCL_COMM_STATE_PHASE_DESTROY_POST = 1, /* destroyed */
    HCCL_COMM_STATE_PHASE_RESUME_PRE = 2,   /* about to resume */
    HCCL_COMM_STATE_PHASE_RESUME_POST = 3   /* resumed */
} HcclCommStatePhase;

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_HCCL_TYPES_H */
