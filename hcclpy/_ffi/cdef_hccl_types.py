"""C declarations of ``hccl/hccl_types.h``, kept as data, with the enums of CANN 9.x's
``hccl/hccl_comm.h`` (``HcclConfigType``, ``HcclOpExpansionMode``) and ``hccl/hccl_rank_graph.h``
(``HcclHeterogMode``) that the optional functions of :mod:`.cdef_hccl` take.

Deliberate departures from the header:

* ``HcclResult`` stops at ``HCCL_E_IN_STATUS`` and the ``*_RESERVED`` members are left out, so no
  caller can pass one;
* ``HcclDataType`` stops at ``HCCL_DATA_TYPE_INT128``: the fp8 members were renumbered between CANN
  releases and are not declared;
* ``HcclCommConfig`` is the newest (version 11, 2248-byte) layout; hcclpy writes the size and
  version each library understands (:mod:`hcclpy.config`);
* ``HcclConfigValue``, a union with one ``int32_t`` passed by value, is declared as ``int32_t``
  (cffi's ABI mode cannot pass unions by value; the calling convention is the same).
"""

TYPES = """
typedef enum {
    HCCL_SUCCESS = 0, HCCL_E_PARA = 1, HCCL_E_PTR = 2, HCCL_E_MEMORY = 3, HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5, HCCL_E_NOT_FOUND = 6, HCCL_E_UNAVAIL = 7, HCCL_E_SYSCALL = 8, HCCL_E_TIMEOUT = 9,
    HCCL_E_OPEN_FILE_FAILURE = 10, HCCL_E_TCP_CONNECT = 11, HCCL_E_ROCE_CONNECT = 12,
    HCCL_E_TCP_TRANSFER = 13, HCCL_E_ROCE_TRANSFER = 14, HCCL_E_RUNTIME = 15, HCCL_E_DRV = 16,
    HCCL_E_PROFILING = 17, HCCL_E_CCE = 18, HCCL_E_NETWORK = 19, HCCL_E_AGAIN = 20, HCCL_E_REMOTE = 21,
    HCCL_E_SUSPENDING = 22, HCCL_E_OPRETRY_FAIL = 23, HCCL_E_OOM = 24, HCCL_E_IN_STATUS = 1041
} HcclResult;

typedef void *HcclComm;

typedef enum { HCCL_REDUCE_SUM = 0, HCCL_REDUCE_PROD = 1, HCCL_REDUCE_MAX = 2, HCCL_REDUCE_MIN = 3 } HcclReduceOp;

typedef enum {
    HCCL_DATA_TYPE_INT8 = 0, HCCL_DATA_TYPE_INT16 = 1, HCCL_DATA_TYPE_INT32 = 2, HCCL_DATA_TYPE_FP16 = 3,
    HCCL_DATA_TYPE_FP32 = 4, HCCL_DATA_TYPE_INT64 = 5, HCCL_DATA_TYPE_UINT64 = 6, HCCL_DATA_TYPE_UINT8 = 7,
    HCCL_DATA_TYPE_UINT16 = 8, HCCL_DATA_TYPE_UINT32 = 9, HCCL_DATA_TYPE_FP64 = 10, HCCL_DATA_TYPE_BFP16 = 11,
    HCCL_DATA_TYPE_INT128 = 12
} HcclDataType;

typedef enum { HCCL_DETERMINISTIC = 0 } HcclConfig;

typedef struct HcclRootInfoDef { char internal[4108]; } HcclRootInfo;

typedef struct HcclCommConfigDef {
    char reserved[24];
    uint32_t hcclBufferSize;
    uint32_t hcclDeterministic;
    char hcclCommName[128];
    char hcclUdi[128];
    uint32_t hcclOpExpansionMode;
    uint32_t hcclRdmaTrafficClass;
    uint32_t hcclRdmaServiceLevel;
    uint32_t hcclWorldRankID;
    uint64_t hcclJobID;
    uint8_t aclGraphZeroCopyEnable;
    int32_t hcclExecTimeOut;
    char hcclAlgo[1600];
    char hcclRetryEnable[50];
    char hcclRetryParams[128];
    char hcclBufferName[128];
    uint32_t hcclQos;
    uint64_t hcclSymWinMaxMemSizePerRank;
    uint32_t hcclChannelSqDepth;
} HcclCommConfig;

typedef enum { HCCL_SEND = 0, HCCL_RECV = 1 } HcclSendRecvType;

typedef enum {
    HCCL_CONFIG_TYPE_INVALID = -1, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE = 0, HCCL_CONFIG_TYPE_HCCL_ALGO = 1,
    HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM = 2, HCCL_CONFIG_TYPE_DETERMINISTIC = 3, HCCL_CONFIG_TYPE_UDI = 4
} HcclConfigType;

typedef enum {
    HCCL_OP_EXPANSION_MODE_INVALID = -1, HCCL_OP_EXPANSION_MODE_AI_CPU = 0, HCCL_OP_EXPANSION_MODE_AIV = 1,
    HCCL_OP_EXPANSION_MODE_HOST = 2, HCCL_OP_EXPANSION_MODE_HOST_TS = 3, HCCL_OP_EXPANSION_MODE_CCU_MS = 4,
    HCCL_OP_EXPANSION_MODE_CCU_SCHED = 5, HCCL_OP_EXPANSION_AIV_ONLY = 6
} HcclOpExpansionMode;

typedef enum {
    HCCL_HETEROG_MODE_INVALID = -1, HCCL_HETEROG_MODE_HOMOGENEOUS = 0, HCCL_HETEROG_MODE_MIX_A2_A3 = 1
} HcclHeterogMode;

typedef struct HcclSendRecvItemDef {
    HcclSendRecvType sendRecvType;
    void *buf;
    uint64_t count;
    HcclDataType dataType;
    uint32_t remoteRank;
} HcclSendRecvItem;
"""
