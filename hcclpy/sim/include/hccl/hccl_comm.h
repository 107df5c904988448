/*
 * hcclpy CPU simulator: HCCL communicator management.
 *
 * Creating and destroying communicators, querying them, process-wide
 * settings, barrier, group calls, and the inline HcclCommConfigInit.
 * As CANN's, it includes hccl_res.h (the communicator's resources).
 * Every function returns an HcclResult (0 on success) unless noted.
 */
#ifndef HCCLPY_SIM_HCCL_COMM_H
#define HCCLPY_SIM_HCCL_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "acl/acl_base.h"
#include "acl/acl_rt.h" /* aclrtDrvMemHandle */
#include "hccl_types.h"
#include "hccl_res.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Operation expansion mode reported by HcclConfigGetInfo.  Note: numbered
 * differently from HcclCommConfig.hcclOpExpansionMode (0 default, 1 host,
 * 2 AI CPU, 3 AIV, 4 AIV only, ...). */
typedef enum {
    HCCL_OP_EXPANSION_MODE_INVALID = -1,
    HCCL_OP_EXPANSION_MODE_AI_CPU = 0,
    HCCL_OP_EXPANSION_MODE_AIV = 1,
    HCCL_OP_EXPANSION_MODE_HOST = 2,
    HCCL_OP_EXPANSION_MODE_HOST_TS = 3,
    HCCL_OP_EXPANSION_MODE_CCU_MS = 4,
    HCCL_OP_EXPANSION_MODE_CCU_SCHED = 5,
    HCCL_OP_EXPANSION_AIV_ONLY = 6 /* sic: no _MODE_ */
} HcclOpExpansionMode;

/* What HcclConfigGetInfo returns for HCCL_CONFIG_TYPE_OP_EXPANSION_MODE. */
typedef HcclOpExpansionMode HcclConfigTypeOpExpansionMode;

/* Item queried by HcclConfigGetInfo, and what `info` receives for it (infoLen bytes). */
typedef enum {
    HCCL_CONFIG_TYPE_INVALID = -1,
    HCCL_CONFIG_TYPE_OP_EXPANSION_MODE = 0,    /* HcclConfigTypeOpExpansionMode; infoLen == its size */
    HCCL_CONFIG_TYPE_HCCL_ALGO = 1,            /* char[]; infoLen >= HCCL_COMM_ALGO_MAX_LENGTH */
    HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM = 2, /* uint32_t; infoLen == 4 */
    HCCL_CONFIG_TYPE_DETERMINISTIC = 3,        /* uint32_t: 0 or 1 deterministic, 2 strict; infoLen == 4 */
    HCCL_CONFIG_TYPE_UDI = 4                   /* char[]; infoLen >= UDI_MAX_LENGTH */
} HcclConfigType;

/* Called by HCCL around the communicator state changes of HcclCommStatePhase. */
typedef HcclResult (*HcclCommStateCallback)(HcclComm comm, HcclCommStatePhase state, void *args);

/*
 * Fill a communicator config with "use the library default" values for
 * every field of this header's layout (version HCCL_COMM_CONFIG_VERSION).
 * Only the first byte of each string field is cleared.
 */
static inline void HcclCommConfigInit(HcclCommConfig *config)
{
    /* Layout of the 24-byte header at the start of the struct. */
    struct HcclCommConfigHeader {
        size_t size;
        uint32_t magicWord;
        uint32_t version;
        uint64_t reserved;
    } header;

    if (config == NULL) {
        return;
    }
    header.size = sizeof(HcclCommConfig);
    header.magicWord = HCCL_COMM_CONFIG_MAGIC_WORD;
    header.version = HCCL_COMM_CONFIG_VERSION;
    header.reserved = 0;
    memcpy(config->reserved, &header, sizeof(header));

    config->hcclBufferSize = HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET;
    config->hcclDeterministic = HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET;
    config->hcclCommName[0] = '\0';
    config->hcclUdi[0] = '\0';
    config->hcclOpExpansionMode = HCCL_COMM_DEFAULT_OP_EXPANSION_MODE;
    config->hcclRdmaTrafficClass = HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET;
    config->hcclRdmaServiceLevel = HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET;
    config->hcclWorldRankID = 0;
    config->hcclJobID = 0;
    config->aclGraphZeroCopyEnable = 0;
    config->hcclExecTimeOut = HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET;
    config->hcclAlgo[0] = '\0';
    config->hcclRetryEnable[0] = '\0';
    config->hcclRetryParams[0] = '\0';
    config->hcclBufferName[0] = '\0';
    config->hcclQos = HCCL_COMM_QOS_CONFIG_NOT_SET;
    config->hcclSymWinMaxMemSizePerRank = HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE;
    config->hcclChannelSqDepth = HCCL_COMM_SQ_DEPTH_CONFIG_NOT_SET;
}

/* ---- creation ---------------------------------------------------------- */

/* On the root rank: produce the token the other ranks need to join. */
HCCL_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);

/* Join a communicator of nRanks ranks as rank, using the root's token. */
HCCL_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                         uint32_t rank, HcclComm *comm);

/* Same, with a communicator config. */
HCCL_API HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                               uint32_t rank, const HcclCommConfig *config,
                                               HcclComm *comm);

/* On each root of the scalable bootstrap: that root's token. */
HCCL_API HcclResult HcclGetRootInfoScalable(HcclRootInfo *rootInfo);

/* Join a communicator of nRanks ranks as rank from the tokens of its nRoot roots (0 < nRoot <=
 * nRanks; every rank passes the same rootInfoList, in the same order); nExtRoot is reserved (0). */
HCCL_API HcclResult HcclCommInitRootInfoScalable(uint32_t nRanks, uint32_t nRoot, const HcclRootInfo *rootInfoList,
                                                 uint32_t rank, uint32_t nExtRoot, const HcclCommConfig *config,
                                                 HcclComm *comm);

/* Join a communicator described by a rank-table file at path clusterInfo. */
HCCL_API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank,
                                            HcclComm *comm);

/* Same, with a communicator config. */
HCCL_API HcclResult HcclCommInitClusterInfoConfig(const char *clusterInfo, uint32_t rank,
                                                  HcclCommConfig *config, HcclComm *comm);

/* One process, ndev devices: create ndev communicators into comms[]. */
HCCL_API HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms);

/* Create a sub-communicator of rankNum ranks (rankIds) from the parent *comm. */
HCCL_API HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds,
                                            uint64_t subCommId, uint32_t subCommRankId,
                                            HcclCommConfig *config, HcclComm *subComm);

/* Destroy a communicator (collective over its ranks). */
HCCL_API HcclResult HcclCommDestroy(HcclComm comm);

/* ---- queries ----------------------------------------------------------- */

/* Number of ranks in comm. */
HCCL_API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);

/* Rank of the caller in comm. */
HCCL_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);

/* Name of comm; commName must hold COMM_NAME_MAX_LENGTH bytes. */
HCCL_API HcclResult HcclGetCommName(HcclComm comm, char *commName);

/* Static description of a result code (never NULL). */
HCCL_API const char *HcclGetErrorString(HcclResult code);

/* Error raised asynchronously by work on comm, if any. */
HCCL_API HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError);

/* One past the last supported HcclCommConfigCapability item. */
HCCL_API uint32_t HcclGetCommConfigCapability(void);

/* ---- process-wide settings -------------------------------------------- */

/* Set a process-wide option. */
HCCL_API HcclResult HcclSetConfig(HcclConfig config, HcclConfigValue configValue);

/* Read a process-wide option. */
HCCL_API HcclResult HcclGetConfig(HcclConfig config, HcclConfigValue *configValue);

/* ---- fault handling ---------------------------------------------------- */

/* Stop comm from accepting new work. */
HCCL_API HcclResult HcclCommSuspend(HcclComm comm);

/* Bring a suspended comm back into service. */
HCCL_API HcclResult HcclCommResume(HcclComm comm);

/* Status of the live communicator named commId. */
HCCL_API HcclResult HcclCommGetStatus(const char *commId, HcclCommStatus *status);

/* Register cb (under regName) to be told of communicator state changes. */
HCCL_API HcclResult HcclCommRegCommStateCallback(const char *regName, HcclCommStateCallback cb,
                                                 void *args);

/* Use the backup NIC (useBackup[i]) for ranks[i], i < nRanks. */
HCCL_API HcclResult HcclCommWorkingDevNicSet(HcclComm comm, uint32_t *ranks, bool *useBackup,
                                             uint32_t nRanks);

/* ---- virtual-memory ranges -------------------------------------------- */

/* Reserve a virtual address range for comm's memory. */
HCCL_API HcclResult HcclCommSetMemoryRange(HcclComm comm, void *baseVirPtr, size_t size,
                                           size_t alignment, uint64_t flags);

/* Give back a range reserved with HcclCommSetMemoryRange. */
HCCL_API HcclResult HcclCommUnsetMemoryRange(HcclComm comm, void *baseVirPtr);

/* Map physical memory handle into the range at virPtr. */
HCCL_API HcclResult HcclCommActivateCommMemory(HcclComm comm, void *virPtr, size_t size,
                                               size_t offset, aclrtDrvMemHandle handle,
                                               uint64_t flags);

/* Unmap memory mapped with HcclCommActivateCommMemory. */
HCCL_API HcclResult HcclCommDeactivateCommMemory(HcclComm comm, void *virPtr);

/* ---- symmetric-memory windows ----------------------------------------- */

/* Register size bytes at addr as a symmetric window of comm. */
HCCL_API HcclResult HcclCommSymWinRegister(HcclComm comm, void *addr, uint64_t size,
                                           HcclCommSymWindow *winHandle, uint32_t flag);

/* Release a window registered with HcclCommSymWinRegister. */
HCCL_API HcclResult HcclCommSymWinDeregister(HcclCommSymWindow winHandle);

/* The window of comm holding [ptr, ptr + size), and ptr's offset in it. */
HCCL_API HcclResult HcclCommSymWinGet(HcclComm comm, void *ptr, size_t size,
                                      HcclCommSymWindow *winHandle, size_t *offset);

/* ---- lookup and configuration ----------------------------------------- */

/* The handle of the live communicator named commName. */
HCCL_API HcclResult HcclCommGetHandleWithName(const char *commName, HcclComm *comm);

/* Read configuration item cfgType of comm into info (infoLen bytes). */
HCCL_API HcclResult HcclConfigGetInfo(HcclComm comm, HcclConfigType cfgType, uint32_t infoLen,
                                      void *info);

/* ---- synchronisation and grouping ------------------------------------- */

/* Barrier across all ranks of comm, in stream order. */
HCCL_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);

/* Start collecting point-to-point calls into one group. */
HCCL_API HcclResult HcclGroupStart(void);

/* Issue every call collected since the matching HcclGroupStart. */
HCCL_API HcclResult HcclGroupEnd(void);

/* Whether the calling thread is between HcclGroupStart and HcclGroupEnd. */
HCCL_API HcclResult HcclGroupStatusGet(bool *isGroupEnabled);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_HCCL_COMM_H */
