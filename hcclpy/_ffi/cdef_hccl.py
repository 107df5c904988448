"""C declarations of the HCCL functions (``hccl/hccl.h`` and, on CANN 9.x, ``hccl/hccl_comm.h``,
``hccl/hccl_res.h`` and ``hccl/hccl_rank_graph.h``).

Parameter names, types, ``const`` and order follow the headers. ``HcclCommConfigInit`` is an inline
function in the header, not an exported symbol: :mod:`hcclpy.config` re-implements it.
``HcclSetConfig``/``HcclGetConfig`` take ``int32_t`` for the one-member union ``HcclConfigValue``.
"""

FUNCTIONS = """
HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm);
HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                      const HcclCommConfig *config, HcclComm *comm);
HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);
HcclResult HcclCommInitClusterInfoConfig(const char *clusterInfo, uint32_t rank, HcclCommConfig *config,
                                         HcclComm *comm);
HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms);
HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds, uint64_t subCommId,
                                   uint32_t subCommRankId, HcclCommConfig *config, HcclComm *subComm);
HcclResult HcclCommDestroy(HcclComm comm);
HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
HcclResult HcclGetCommName(HcclComm comm, char *commName);
const char *HcclGetErrorString(HcclResult code);
HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError);
uint32_t HcclGetCommConfigCapability(void);
HcclResult HcclSetConfig(HcclConfig config, int32_t configValue);
HcclResult HcclGetConfig(HcclConfig config, int32_t *configValue);
HcclResult HcclCommSuspend(HcclComm comm);
HcclResult HcclCommResume(HcclComm comm);
HcclResult HcclGroupStart(void);
HcclResult HcclGroupEnd(void);
HcclResult HcclGetRootInfoScalable(HcclRootInfo *rootInfo);
HcclResult HcclCommInitRootInfoScalable(uint32_t nRanks, uint32_t nRoot, const HcclRootInfo *rootInfoList,
                                        uint32_t rank, uint32_t nExtRoot, const HcclCommConfig *config,
                                        HcclComm *comm);
HcclResult HcclConfigGetInfo(HcclComm comm, HcclConfigType cfgType, uint32_t infoLen, void *info);
HcclResult HcclGetHcclBuffer(HcclComm comm, void **buffer, uint64_t *size);
HcclResult HcclGetHeterogMode(HcclComm comm, HcclHeterogMode *mode);

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream);
HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream);
HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                      uint32_t root, HcclComm comm, aclrtStream stream);
HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream);
HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf, const void *recvCounts,
                          const void *recvDispls, HcclDataType dataType, HcclComm comm, aclrtStream stream);
HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                             HcclReduceOp op, HcclComm comm, aclrtStream stream);
HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts, const void *sendDispls, void *recvBuf,
                              uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                              aclrtStream stream);
HcclResult HcclScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType, uint32_t root,
                       HcclComm comm, aclrtStream stream);
HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType, const void *recvBuf,
                        uint64_t recvCount, HcclDataType recvType, HcclComm comm, aclrtStream stream);
HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls, HcclDataType sendType,
                         const void *recvBuf, const void *recvCounts, const void *rdispls, HcclDataType recvType,
                         HcclComm comm, aclrtStream stream);
HcclResult HcclAlltoAllVC(const void *sendBuf, const void *sendCountMatrix, HcclDataType sendType,
                          const void *recvBuf, HcclDataType recvType, HcclComm comm, aclrtStream stream);
HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                    aclrtStream stream);
HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                    aclrtStream stream);
HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm, aclrtStream stream);
HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
"""

# Exported by every supported CANN; the others are probed once at load time (hcclpy.has).
REQUIRED = (
    "HcclGetRootInfo", "HcclCommInitRootInfo", "HcclCommInitClusterInfo", "HcclCommDestroy", "HcclAllReduce",
    "HcclBroadcast", "HcclReduce", "HcclAllGather", "HcclReduceScatter", "HcclSend", "HcclRecv", "HcclAlltoAllV",
)

OPTIONAL = (
    "HcclCommInitRootInfoConfig", "HcclCommInitClusterInfoConfig", "HcclCommInitAll", "HcclCreateSubCommConfig",
    "HcclGetRankSize", "HcclGetRankId", "HcclGetCommName", "HcclGetErrorString", "HcclGetCommAsyncError",
    "HcclGetCommConfigCapability", "HcclSetConfig", "HcclGetConfig", "HcclCommSuspend", "HcclCommResume",
    "HcclGroupStart", "HcclGroupEnd", "HcclAllGatherV", "HcclReduceScatterV", "HcclScatter", "HcclAlltoAll",
    "HcclAlltoAllVC", "HcclBatchSendRecv", "HcclBarrier",
    # CANN 9.x
    "HcclGetRootInfoScalable", "HcclCommInitRootInfoScalable", "HcclConfigGetInfo", "HcclGetHcclBuffer",
    "HcclGetHeterogMode",
)
