/*
 * hcclpy CPU simulator: HCCL collective and point-to-point operations.
 *
 * Including this header alone is enough for an HCCL program: it brings in
 * the ACL runtime API, the HCCL types and communicator management.
 *
 * All operations are asynchronous: they are queued on stream and their
 * results are defined only after the stream (or an event recorded after
 * them) has been synchronised. Counts are numbers of elements, not bytes.
 * Count and displacement arrays passed as const void * are host arrays of
 * uint64_t, one entry per rank.
 */
#ifndef HCCLPY_SIM_HCCL_H
#define HCCLPY_SIM_HCCL_H

#include <stdint.h>

#include "acl/acl.h"
#include "hccl_types.h"
#include "hccl_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reduce count elements across all ranks; every rank gets the result. */
HCCL_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count,
                                  HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                  aclrtStream stream);

/* Copy count elements of buf from rank root to every rank. */
HCCL_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root,
                                  HcclComm comm, aclrtStream stream);

/* Reduce across ranks, then rank i keeps block i of recvCount elements. */
HCCL_API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                      HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                      aclrtStream stream);

/* ReduceScatter with per-rank block sizes and offsets into sendBuf. */
HCCL_API HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts,
                                       const void *sendDispls, void *recvBuf, uint64_t recvCount,
                                       HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                       aclrtStream stream);

/* Rank root hands block i of recvCount elements to rank i. */
HCCL_API HcclResult HcclScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                HcclDataType dataType, uint32_t root, HcclComm comm,
                                aclrtStream stream);

/* Every rank gets all ranks' sendCount elements, concatenated in rank order. */
HCCL_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
                                  HcclDataType dataType, HcclComm comm, aclrtStream stream);

/* AllGather with per-rank block sizes and offsets into recvBuf. */
HCCL_API HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf,
                                   const void *recvCounts, const void *recvDispls,
                                   HcclDataType dataType, HcclComm comm, aclrtStream stream);

/* Send count elements to destRank (paired with HcclRecv there). */
HCCL_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType,
                             uint32_t destRank, HcclComm comm, aclrtStream stream);

/* Receive count elements from srcRank (paired with HcclSend there). */
HCCL_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType,
                             uint32_t srcRank, HcclComm comm, aclrtStream stream);

/* All-to-all driven by a full rank x rank matrix of send counts. */
HCCL_API HcclResult HcclAlltoAllVC(const void *sendBuf, const void *sendCountMatrix,
                                   HcclDataType sendType, const void *recvBuf,
                                   HcclDataType recvType, HcclComm comm, aclrtStream stream);

/* All-to-all with per-peer counts and offsets on both sides. */
HCCL_API HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                                  HcclDataType sendType, const void *recvBuf,
                                  const void *recvCounts, const void *rdispls,
                                  HcclDataType recvType, HcclComm comm, aclrtStream stream);

/* All-to-all with the same count to and from every peer. */
HCCL_API HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType,
                                 const void *recvBuf, uint64_t recvCount, HcclDataType recvType,
                                 HcclComm comm, aclrtStream stream);

/* Reduce count elements across all ranks into recvBuf of rank root. */
HCCL_API HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count,
                               HcclDataType dataType, HcclReduceOp op, uint32_t root,
                               HcclComm comm, aclrtStream stream);

/* Issue itemNum sends/receives together (no ordering deadlock between them). */
HCCL_API HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum,
                                      HcclComm comm, aclrtStream stream);

#ifndef OPEN_BUILD_PROJECT
/* Set a per-communicator option (HcclSetConfig's items, for comm only). */
HCCL_API HcclResult HcclSetCommConfig(HcclComm comm, HcclConfig config, HcclConfigValue configValue);

/* Read a per-communicator option. */
HCCL_API HcclResult HcclGetCommConfig(HcclComm comm, HcclConfig config, HcclConfigValue *configValue);
#endif

/* Register size bytes at addr with comm; *handle names the registration. */
HCCL_API HcclResult HcclCommRegister(HcclComm comm, void *addr, uint64_t size, void **handle,
                                     uint32_t flag);

/* Release a registration made by HcclCommRegister. */
HCCL_API HcclResult HcclCommDeregister(HcclComm comm, void *handle);

/* Exchange the registration windowHandle with peerRanks[0..peerRankNum). */
HCCL_API HcclResult HcclCommExchangeMem(HcclComm comm, void *windowHandle, uint32_t *peerRanks,
                                        uint32_t peerRankNum);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_HCCL_H */
