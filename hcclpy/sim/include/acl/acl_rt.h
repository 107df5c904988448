/*
 * hcclpy CPU simulator: AscendCL runtime API.
 *
 * Initialisation, devices, contexts, streams, events, memory, host callbacks
 * and error queries. Every function returns an aclError (0 on success)
 * unless noted otherwise.
 */
#ifndef HCCLPY_SIM_ACL_RT_H
#define HCCLPY_SIM_ACL_RT_H

#include "acl_base.h"

/* Version of the ACL interface these declarations describe (1.17.0). */
#define ACL_MAJOR_VERSION 1
#define ACL_MINOR_VERSION 17
#define ACL_PATCH_VERSION 0

/* Event creation flags for aclrtCreateEventWithFlag (may be OR-ed). */
#define ACL_EVENT_SYNC                    0x00000001U /* usable for cross-stream waits */
#define ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x00000002U /* tracks stream progress */
#define ACL_EVENT_TIME_LINE               0x00000008U /* records a timestamp */
#define ACL_EVENT_DEVICE_USE_ONLY         0x00000010U /* only waited on by the device */
#define ACL_EVENT_EXTERNAL                0x00000020U /* shared with an external API */
#define ACL_EVENT_IPC                     0x00000040U /* shareable between processes */

/* Stream creation flags for aclrtCreateStreamWithConfig. */
#define ACL_STREAM_FAST_LAUNCH     0x00000001U /* low-latency task submission */
#define ACL_STREAM_FAST_SYNC       0x00000002U /* low-latency synchronisation */
#define ACL_STREAM_PERSISTENT      0x00000004U /* tasks stay for repeated launch */
#define ACL_STREAM_HUGE            0x00000008U /* deep task queue */
#define ACL_STREAM_CPU_SCHEDULE    0x00000010U /* scheduled by the host CPU */
#define ACL_STREAM_DEVICE_USE_ONLY 0x00000020U /* only used from the device */

/* What a stream does after one of its tasks failed (aclrtSetStreamFailureMode). */
#define ACL_CONTINUE_ON_FAILURE 0x00000000U /* run the later tasks (CANN's default) */
#define ACL_STOP_ON_FAILURE     0x00000001U /* run no later task (the simulator's default) */

#ifdef __cplusplus
extern "C" {
#endif

/* Where the calling program runs relative to the device. */
typedef enum aclrtRunMode {
    ACL_DEVICE = 0, /* on the device's own CPU */
    ACL_HOST = 1    /* on a host attached to the device */
} aclrtRunMode;

/* Result of the (deprecated) aclrtQueryEvent. */
typedef enum aclrtEventStatus {
    ACL_EVENT_STATUS_COMPLETE = 0,
    ACL_EVENT_STATUS_NOT_READY = 1,
    ACL_EVENT_STATUS_RESERVED = 2
} aclrtEventStatus;

/* Result of aclrtQueryEventStatus (note: numbered opposite to the above). */
typedef enum aclrtEventRecordedStatus {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
} aclrtEventRecordedStatus;

/* Whether the stream waits for a host callback to return. */
typedef enum aclrtCallbackBlockType {
    ACL_CALLBACK_NO_BLOCK = 0, /* stream keeps going */
    ACL_CALLBACK_BLOCK = 1     /* stream waits for the callback */
} aclrtCallbackBlockType;

/* Direction of a memory copy. */
typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
    ACL_MEMCPY_DEFAULT = 4,                /* inferred from the pointers */
    ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,  /* staged through a runtime buffer */
    ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6, /* within one device */
    ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7  /* between two devices */
} aclrtMemcpyKind;

/* Page-size / placement policy for aclrtMalloc. */
typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,        /* huge pages if possible */
    ACL_MEM_MALLOC_HUGE_ONLY = 1,         /* huge pages only */
    ACL_MEM_MALLOC_NORMAL_ONLY = 2,       /* normal pages only */
    ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3,    /* as above, peer-accessible */
    ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4,
    ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5,
    ACL_MEM_MALLOC_HUGE1G_ONLY = 6,       /* 1 GiB pages only */
    ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7,
    ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100, /* low-bandwidth memory */
    ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000, /* high-bandwidth memory */
    ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000 /* read-only from user space */
} aclrtMemMallocPolicy;

/* Where memory is (aclrtPointerGetAttributes). */
typedef enum aclrtMemLocationType {
    ACL_MEM_LOCATION_TYPE_HOST = 0,         /* host memory from the runtime (aclrtMallocHost) */
    ACL_MEM_LOCATION_TYPE_DEVICE = 1,       /* device memory (aclrtMalloc) */
    ACL_MEM_LOCATION_TYPE_UNREGISTERED = 2, /* memory the runtime did not allocate */
    ACL_MEM_LOCATION_TYPE_MANAGED = 3,      /* unified virtual memory */
    ACL_MEM_LOCATION_TYPE_HOST_NUMA = 4     /* host memory of one NUMA node */
} aclrtMemLocationType;

typedef struct aclrtMemLocation {
    uint32_t id; /* device id (or NUMA node) */
    aclrtMemLocationType type;
} aclrtMemLocation;

typedef struct aclrtPtrAttributes {
    aclrtMemLocation location;
    uint32_t pageSize; /* bytes */
    uint32_t rsv[4];
} aclrtPtrAttributes;

/* How aclrtHostRegister maps host memory. */
typedef enum aclrtHostRegisterType {
    ACL_HOST_REGISTER_MAPPED = 0 /* readable and writable by the device */
} aclrtHostRegisterType;

/* Memory kind queried by aclrtGetMemInfo. */
typedef enum aclrtMemAttr {
    ACL_DDR_MEM = 0,
    ACL_HBM_MEM = 1,
    ACL_DDR_MEM_HUGE = 2,
    ACL_DDR_MEM_NORMAL = 3,
    ACL_HBM_MEM_HUGE = 4,
    ACL_HBM_MEM_NORMAL = 5,
    ACL_DDR_MEM_P2P_HUGE = 6,
    ACL_DDR_MEM_P2P_NORMAL = 7,
    ACL_HBM_MEM_P2P_HUGE = 8,
    ACL_HBM_MEM_P2P_NORMAL = 9,
    ACL_HBM_MEM_HUGE1G = 10,
    ACL_HBM_MEM_P2P_HUGE1G = 11,
    ACL_MEM_NORMAL = 12,
    ACL_MEM_HUGE = 13,
    ACL_MEM_HUGE1G = 14,
    ACL_MEM_P2P_NORMAL = 15,
    ACL_MEM_P2P_HUGE = 16,
    ACL_MEM_P2P_HUGE1G = 17
} aclrtMemAttr;

/* Scope of the "last error" queried by aclrtGetLastError. */
typedef enum aclrtLastErrLevel {
    ACL_RT_THREAD_LEVEL = 0 /* last error of the calling thread */
} aclrtLastErrLevel;

/* Handle of physical memory obtained from the driver. */
typedef void *aclrtDrvMemHandle;

/* What kind of handle aclrtMallocPhysical gives (CANN has one kind). */
typedef enum aclrtMemHandleType {
    ACL_MEM_HANDLE_TYPE_NONE = 0
} aclrtMemHandleType;

/* How physical memory is allocated (CANN has one way: pinned). */
typedef enum aclrtMemAllocationType {
    ACL_MEM_ALLOCATION_TYPE_PINNED = 0
} aclrtMemAllocationType;

/* Which granularity aclrtMemGetAllocationGranularity reports. */
typedef enum aclrtMemGranularityOptions {
    ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
    ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED,
    ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF = 0xFFFF
} aclrtMemGranularityOptions;

/* Physical memory to allocate (aclrtMallocPhysical), or to ask the granularity of (32 bytes). */
typedef struct aclrtPhysicalMemProp {
    aclrtMemHandleType handleType;         /* ACL_MEM_HANDLE_TYPE_NONE */
    aclrtMemAllocationType allocationType; /* ACL_MEM_ALLOCATION_TYPE_PINNED */
    aclrtMemAttr memAttr;                  /* page size: ACL_HBM_MEM_HUGE, ACL_MEM_HUGE1G, ... */
    aclrtMemLocation location;             /* ACL_MEM_LOCATION_TYPE_DEVICE and the device id */
    uint64_t reserve;
} aclrtPhysicalMemProp;

/* Flags of aclrtMemExportToShareableHandle. */
#define ACL_RT_VMM_EXPORT_FLAG_DEFAULT                0x0UL /* only the processes set by ...SetPidToShareableHandle */
#define ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL /* any process */

/* Host function run by aclrtLaunchCallback. */
typedef void (*aclrtCallback)(void *userData);

/* Host function run by aclrtLaunchHostFunc. */
typedef void (*aclrtHostFunc)(void *args);

/* What aclrtStreamQuery reports. */
typedef enum aclrtStreamStatus {
    ACL_STREAM_STATUS_COMPLETE = 0,   /* every task queued on the stream has finished */
    ACL_STREAM_STATUS_NOT_READY = 1,  /* at least one has not */
    ACL_STREAM_STATUS_RESERVED = 0xFFFF
} aclrtStreamStatus;

/* Sizes of the strings of aclCANNPackageVersion (and of aclsysGetVersionStr's buffer). */
#define ACL_PKG_VERSION_MAX_SIZE       128
#define ACL_PKG_VERSION_PARTS_MAX_SIZE 64

/* Package whose version aclsysGetCANNVersion reports. */
typedef enum aclCANNPackageName {
    ACL_PKG_NAME_CANN = 0,
    ACL_PKG_NAME_RUNTIME = 1,
    ACL_PKG_NAME_COMPILER = 2,
    ACL_PKG_NAME_HCCL = 3,
    ACL_PKG_NAME_TOOLKIT = 4,
    ACL_PKG_NAME_OPP = 5,
    ACL_PKG_NAME_OPP_KERNEL = 6,
    ACL_PKG_NAME_DRIVER = 7
} aclCANNPackageName;

/* A package version, whole and split into its parts (512 bytes). */
typedef struct aclCANNPackageVersion {
    char version[ACL_PKG_VERSION_MAX_SIZE];
    char majorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
    char minorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
    char releaseVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
    char patchVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
    char reserved[ACL_PKG_VERSION_MAX_SIZE];
} aclCANNPackageVersion;

/* Device attribute queried by aclrtGetDeviceInfo (values of the CANN runtime
 * documentation of aclrtDevAttr; the simulator answers only some, see
 * docs/c-programs.md). */
typedef enum aclrtDevAttr {
    ACL_DEV_ATTR_AICPU_CORE_NUM = 1,
    ACL_DEV_ATTR_AICORE_CORE_NUM = 101,
    ACL_DEV_ATTR_CUBE_CORE_NUM = 102,
    ACL_DEV_ATTR_VECTOR_CORE_NUM = 201,
    ACL_DEV_ATTR_WARP_SIZE = 202,
    ACL_DEV_ATTR_MAX_THREAD_PER_VECTOR_CORE,
    ACL_DEV_ATTR_LOCAL_MEM_PER_VECTOR_CORE,
    ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE = 301,
    ACL_DEV_ATTR_L2_CACHE_SIZE,
    ACL_DEV_ATTR_SMP_ID = 401U,
    ACL_DEV_ATTR_PHY_CHIP_ID = 402U,
    ACL_DEV_ATTR_SUPER_POD_DEVIDE_ID = 403U,
    ACL_DEV_ATTR_SUPER_POD_SERVER_ID = 404U,
    ACL_DEV_ATTR_SUPER_POD_ID = 405U,
    ACL_DEV_ATTR_CUST_OP_PRIVILEGE = 406U,
    ACL_DEV_ATTR_MAINBOARD_ID = 407U,
    ACL_DEV_ATTR_IS_VIRTUAL = 501U
} aclrtDevAttr;

/* ---- process setup ---------------------------------------------------- */

/* Initialise ACL; configPath may be NULL. */
ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
/* Release everything aclInit set up. */
ACL_FUNC_VISIBILITY aclError aclFinalize(void);
/* Text of the calling thread's most recent error, or NULL. */
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg(void);
/* Version of the ACL interface (deprecated upstream). */
ACL_FUNC_VISIBILITY aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion,
                                             int32_t *patchVersion);
/* aclFinalize, reporting in *refCount the aclInit references left (0: finalised). */
ACL_FUNC_VISIBILITY aclError aclFinalizeReference(uint64_t *refCount);
/* Version of a CANN package (deprecated upstream for the two below). */
ACL_FUNC_VISIBILITY aclError aclsysGetCANNVersion(aclCANNPackageName name,
                                                  aclCANNPackageVersion *version);
/* Version of package pkgName ("runtime", "driver", ...) as a string; versionStr
 * must hold ACL_PKG_VERSION_MAX_SIZE bytes. */
ACL_FUNC_VISIBILITY aclError aclsysGetVersionStr(char *pkgName, char *versionStr);
/* The same as major * 10000000 + minor * 100000 + patch * 1000. */
ACL_FUNC_VISIBILITY aclError aclsysGetVersionNum(char *pkgName, int32_t *versionNum);

/* ---- devices ---------------------------------------------------------- */

/* Make deviceId current for the calling thread (reference counted). */
ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId);
/* Drop one reference to deviceId; resources go away at zero. */
ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId);
/* Release the device whatever the number of aclrtSetDevice calls (refused once it is released). */
ACL_FUNC_VISIBILITY aclError aclrtResetDeviceForce(int32_t deviceId);
/* Device current for the calling thread. */
ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId);
/* Number of visible devices. */
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count);
/* One attribute of device deviceId (see aclrtDevAttr). */
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value);
/* Wait for all work on the current device. */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void);
/* Same, giving up after timeout milliseconds (-1 waits forever). */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout);
/* Whether the program runs on the host or on the device. */
ACL_FUNC_VISIBILITY aclError aclrtGetRunMode(aclrtRunMode *runMode);

/* ---- contexts --------------------------------------------------------- */

/* Create a context on deviceId and make it current. */
ACL_FUNC_VISIBILITY aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId);
/* Destroy a context created by aclrtCreateContext. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyContext(aclrtContext context);
/* Make context current for the calling thread. */
ACL_FUNC_VISIBILITY aclError aclrtSetCurrentContext(aclrtContext context);
/* Context current for the calling thread. */
ACL_FUNC_VISIBILITY aclError aclrtGetCurrentContext(aclrtContext *context);

/* ---- streams ---------------------------------------------------------- */

/* Create a stream in the current context. */
ACL_FUNC_VISIBILITY aclError aclrtCreateStream(aclrtStream *stream);
/* Create a stream with a priority (0-7) and ACL_STREAM_* flags. */
ACL_FUNC_VISIBILITY aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority,
                                                         uint32_t flag);
/* Destroy a stream once its queued work has finished. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyStream(aclrtStream stream);
/* Destroy a stream without waiting for queued work. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyStreamForce(aclrtStream stream);
/* Block until all work queued on stream has finished. */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeStream(aclrtStream stream);
/* Same, giving up after timeout milliseconds (-1 forever, 0 just polls). */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream,
                                                               int32_t timeout);
/* Whether deviceId can reach peerDeviceId's memory (*canAccessPeer 1) or not (0). */
ACL_FUNC_VISIBILITY aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId,
                                                      int32_t peerDeviceId);
/* Let the current device reach peerDeviceId's memory (one direction; flags must be 0). */
ACL_FUNC_VISIBILITY aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags);
/* Take that back. */
ACL_FUNC_VISIBILITY aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId);
/* Make later work on stream wait until event has completed. */
ACL_FUNC_VISIBILITY aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
/* Whether every task queued on stream (NULL: the default stream) has finished; never waits. */
ACL_FUNC_VISIBILITY aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status);
/* The id of stream (NULL: the default stream), unique among the process's live streams. */
ACL_FUNC_VISIBILITY aclError aclrtStreamGetId(aclrtStream stream, int32_t *streamId);
/* What stream (NULL: the default stream) does after a task failed: ACL_CONTINUE_ON_FAILURE or
 * ACL_STOP_ON_FAILURE; once per stream. */
ACL_FUNC_VISIBILITY aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode);
/* Seconds a task queued by aclrtStreamWaitEvent waits at most (0: no limit, the default). */
ACL_FUNC_VISIBILITY aclError aclrtSetOpWaitTimeout(uint32_t timeout);
/* Seconds an operator kernel runs at most (0: the largest). */
ACL_FUNC_VISIBILITY aclError aclrtSetOpExecuteTimeOut(uint32_t timeout);

/* ---- events ----------------------------------------------------------- */

/* Create an event with default behaviour. */
ACL_FUNC_VISIBILITY aclError aclrtCreateEvent(aclrtEvent *event);
/* Create an event with ACL_EVENT_* flags. */
ACL_FUNC_VISIBILITY aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag);
/* Create an extended event with ACL_EVENT_* flags. */
ACL_FUNC_VISIBILITY aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag);
/* Record event at the current tail of stream. */
ACL_FUNC_VISIBILITY aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
/* Return event to the not-recorded state, in stream order. */
ACL_FUNC_VISIBILITY aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream);
/* Poll an event (deprecated upstream; COMPLETE is 0 here). */
ACL_FUNC_VISIBILITY aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status);
/* Poll an event (COMPLETE is 1 here). */
ACL_FUNC_VISIBILITY aclError aclrtQueryEventStatus(aclrtEvent event,
                                                   aclrtEventRecordedStatus *status);
/* Block until event has completed. */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeEvent(aclrtEvent event);
/* Same, giving up after timeout milliseconds. */
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout);
/* Milliseconds between two completed, timestamped events. */
ACL_FUNC_VISIBILITY aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent,
                                                   aclrtEvent endEvent);
/* Destroy an event. */
ACL_FUNC_VISIBILITY aclError aclrtDestroyEvent(aclrtEvent event);

/* ---- memory ----------------------------------------------------------- */

/* Allocate size bytes of device memory. */
ACL_FUNC_VISIBILITY aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
/* aclrtMalloc with size rounded up to a multiple of 32 bytes and nothing more. */
ACL_FUNC_VISIBILITY aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
/* Where ptr is (host, device, or not the runtime's) and its page size. */
ACL_FUNC_VISIBILITY aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes);
/* Let the device reach size bytes of host memory at ptr (4 KiB aligned); *devPtr: its device address. */
ACL_FUNC_VISIBILITY aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type,
                                               void **devPtr);
/* Take that back (ptr: as registered). */
ACL_FUNC_VISIBILITY aclError aclrtHostUnregister(void *ptr);
/* ---- device memory shared between processes ---------------------------- */

#define ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT                0x0UL /* only the processes set by ...SetImportPid */
#define ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL /* any process */
#define ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT                0x0UL
#define ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS     0x1UL

/* The id of this process, as the IPC functions take it. */
ACL_FUNC_VISIBILITY aclError aclrtDeviceGetBareTgid(int32_t *pid);
/* A key (len >= 65 bytes) through which other processes import size bytes of device memory at devPtr. */
ACL_FUNC_VISIBILITY aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len,
                                                     uint64_t flags);
/* Let the num processes in pid import key (exported with ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT). */
ACL_FUNC_VISIBILITY aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num);
/* Map the memory of another process's key; *devPtr: where it is in this process. */
ACL_FUNC_VISIBILITY aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags);
/* Close key: in an importer, let go of the memory; in the exporter, allow no more imports. */
ACL_FUNC_VISIBILITY aclError aclrtIpcMemClose(const char *key);

/* ---- virtual memory: address ranges, physical memory, mappings --------- */

/* Reserve size bytes of address space, rounded up to the granularity (alignment 0; expectPtr NULL
 * or the address wanted; flags 0 or 1, the page type); *virPtr: its start. */
ACL_FUNC_VISIBILITY aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment,
                                                    void *expectPtr, uint64_t flags);
/* Give a reservation back (virPtr: its start; nothing may be mapped in it). */
ACL_FUNC_VISIBILITY aclError aclrtReleaseMemAddress(void *virPtr);
/* Allocate size bytes of physical memory as prop says (flags 0); *handle: the memory. */
ACL_FUNC_VISIBILITY aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size,
                                                 const aclrtPhysicalMemProp *prop, uint64_t flags);
/* Free physical memory (unmapped first). */
ACL_FUNC_VISIBILITY aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
/* Map all of handle's memory (size: its size; offset and flags 0) at virPtr, inside a reservation. */
ACL_FUNC_VISIBILITY aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
                                         uint64_t flags);
/* Undo aclrtMapMem (virPtr: as mapped). */
ACL_FUNC_VISIBILITY aclError aclrtUnmapMem(void *virPtr);
/* The size physical memory of prop comes in multiples of: the least, or the one recommended. */
ACL_FUNC_VISIBILITY aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop,
                                                              aclrtMemGranularityOptions option,
                                                              size_t *granularity);
/* A number through which other processes import handle's memory (handleType
 * ACL_MEM_HANDLE_TYPE_NONE; flags ACL_RT_VMM_EXPORT_FLAG_*); once per handle. */
ACL_FUNC_VISIBILITY aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, aclrtMemHandleType handleType,
                                                             uint64_t flags, uint64_t *shareableHandle);
/* Let the pidNum processes in pid import shareableHandle (exported with ACL_RT_VMM_EXPORT_FLAG_DEFAULT). */
ACL_FUNC_VISIBILITY aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid,
                                                             size_t pidNum);
/* This process's handle of the memory another process exported, on device deviceId. */
ACL_FUNC_VISIBILITY aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId,
                                                               aclrtDrvMemHandle *handle);

/* Events shared between processes (created with ACL_EVENT_IPC). */
#define ACL_IPC_EVENT_HANDLE_SIZE 64U
typedef struct aclrtIpcEventHandle {
    char reserved[ACL_IPC_EVENT_HANDLE_SIZE];
} aclrtIpcEventHandle;

/* A handle through which other processes open event (created with ACL_EVENT_IPC). */
ACL_FUNC_VISIBILITY aclError aclrtIpcGetEventHandle(aclrtEvent event, aclrtIpcEventHandle *handle);
/* The event of another process's handle, to wait for (aclrtStreamWaitEvent, aclrtSynchronizeEvent). */
ACL_FUNC_VISIBILITY aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle handle, aclrtEvent *event);

/* Allocate size bytes of pinned host memory. */
ACL_FUNC_VISIBILITY aclError aclrtMallocHost(void **hostPtr, size_t size);
/* Release device memory. */
ACL_FUNC_VISIBILITY aclError aclrtFree(void *devPtr);
/* Release pinned host memory. */
ACL_FUNC_VISIBILITY aclError aclrtFreeHost(void *hostPtr);
/* Copy count bytes; destMax is the capacity of dst. Synchronous. */
ACL_FUNC_VISIBILITY aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                         aclrtMemcpyKind kind);
/* Copy count bytes in stream order. */
ACL_FUNC_VISIBILITY aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src,
                                              size_t count, aclrtMemcpyKind kind,
                                              aclrtStream stream);
/* Fill count bytes with value; maxCount is the capacity of devPtr. Synchronous. */
ACL_FUNC_VISIBILITY aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value,
                                         size_t count);
/* Fill count bytes with value in stream order. */
ACL_FUNC_VISIBILITY aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value,
                                              size_t count, aclrtStream stream);
/* Copy height rows of width bytes, rows spitch bytes apart in src and dpitch apart in dst
 * (host to device or device to host). Synchronous. */
ACL_FUNC_VISIBILITY aclError aclrtMemcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                           size_t width, size_t height, aclrtMemcpyKind kind);
/* The same in stream order. */
ACL_FUNC_VISIBILITY aclError aclrtMemcpy2dAsync(void *dst, size_t dpitch, const void *src,
                                                size_t spitch, size_t width, size_t height,
                                                aclrtMemcpyKind kind, aclrtStream stream);
/* Free and total bytes of one memory kind on the current device. */
ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);

/* ---- host callbacks --------------------------------------------------- */

/* Queue fn(args) on stream (NULL: the default stream): it runs in stream order, on the thread
 * that runs the stream's work, and the stream's later work waits until it returns. */
ACL_FUNC_VISIBILITY aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args);
/* Queue fn(userData) on stream; run by a thread subscribed to it. */
ACL_FUNC_VISIBILITY aclError aclrtLaunchCallback(aclrtCallback fn, void *userData,
                                                 aclrtCallbackBlockType blockType,
                                                 aclrtStream stream);
/* Register thread threadId as the callback runner for stream. */
ACL_FUNC_VISIBILITY aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream);
/* Run pending callbacks for the calling thread, waiting up to timeout ms. */
ACL_FUNC_VISIBILITY aclError aclrtProcessReport(int32_t timeout);
/* Undo aclrtSubscribeReport. */
ACL_FUNC_VISIBILITY aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream);

/* ---- error state ------------------------------------------------------ */

/* Last error at the given level, leaving it in place. */
ACL_FUNC_VISIBILITY aclError aclrtPeekAtLastError(aclrtLastErrLevel level);
/* Last error at the given level, clearing it. */
ACL_FUNC_VISIBILITY aclError aclrtGetLastError(aclrtLastErrLevel level);

#ifdef __cplusplus
}
#endif

#endif /* HCCLPY_SIM_ACL_RT_H */
