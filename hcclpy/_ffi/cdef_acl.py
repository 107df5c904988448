"""C declarations of the AscendCL runtime (``acl/acl_rt.h``, ``acl/acl_base_rt.h``), kept as data.

Types and parameter order follow the CANN headers. Deliberate departures:

* functions with an empty C++ parameter list are written ``(void)``;
* the ``ACL_FUNC_VISIBILITY`` / deprecation attributes are dropped;
* flag macros (``ACL_EVENT_*``, ``ACL_STREAM_*``) are Python constants in :mod:`hcclpy._ffi`,
  because cffi cannot declare macros in ABI mode.
"""

TYPES = """
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtContext;
typedef int aclError;

typedef enum { ACL_DEVICE = 0, ACL_HOST = 1 } aclrtRunMode;
typedef enum {
    ACL_EVENT_STATUS_COMPLETE = 0, ACL_EVENT_STATUS_NOT_READY = 1, ACL_EVENT_STATUS_RESERVED = 2
} aclrtEventStatus;
typedef enum {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0, ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
} aclrtEventRecordedStatus;
typedef enum { ACL_CALLBACK_NO_BLOCK = 0, ACL_CALLBACK_BLOCK = 1 } aclrtCallbackBlockType;
typedef enum {
    ACL_MEMCPY_HOST_TO_HOST = 0, ACL_MEMCPY_HOST_TO_DEVICE = 1, ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3, ACL_MEMCPY_DEFAULT = 4, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5,
    ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6, ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7
} aclrtMemcpyKind;
typedef enum {
    ACL_MEM_MALLOC_HUGE_FIRST = 0, ACL_MEM_MALLOC_HUGE_ONLY = 1, ACL_MEM_MALLOC_NORMAL_ONLY = 2,
    ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3, ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4, ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5,
    ACL_MEM_MALLOC_HUGE1G_ONLY = 6, ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7,
    ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100, ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000
} aclrtMemMallocPolicy;
typedef enum {
    ACL_DDR_MEM = 0, ACL_HBM_MEM = 1, ACL_DDR_MEM_HUGE = 2, ACL_DDR_MEM_NORMAL = 3, ACL_HBM_MEM_HUGE = 4,
    ACL_HBM_MEM_NORMAL = 5, ACL_DDR_MEM_P2P_HUGE = 6, ACL_DDR_MEM_P2P_NORMAL = 7, ACL_HBM_MEM_P2P_HUGE = 8,
    ACL_HBM_MEM_P2P_NORMAL = 9
} aclrtMemAttr;
typedef enum { ACL_RT_THREAD_LEVEL = 0 } aclrtLastErrLevel;
typedef void (*aclrtCallback)(void *userData);
typedef void (*aclrtHostFunc)(void *args);
typedef enum {
    ACL_STREAM_STATUS_COMPLETE = 0, ACL_STREAM_STATUS_NOT_READY = 1, ACL_STREAM_STATUS_RESERVED = 0xFFFF
} aclrtStreamStatus;
"""

FUNCTIONS = """
aclError aclInit(const char *configPath);
aclError aclFinalize(void);
const char *aclGetRecentErrMsg(void);
aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion);
const char *aclrtGetSocName(void);
aclError aclrtGetRunMode(aclrtRunMode *runMode);

aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtSynchronizeDevice(void);
aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout);
aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId);
aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags);
aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId);

aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId);
aclError aclrtDestroyContext(aclrtContext context);
aclError aclrtSetCurrentContext(aclrtContext context);
aclError aclrtGetCurrentContext(aclrtContext *context);

aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtDestroyStreamForce(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status);
aclError aclrtStreamGetId(aclrtStream stream, int32_t *streamId);
aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args);

aclError aclrtCreateEvent(aclrtEvent *event);
aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag);
aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status);
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
aclError aclrtSynchronizeEvent(aclrtEvent event);
aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout);
aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent);
aclError aclrtDestroyEvent(aclrtEvent event);

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFree(void *devPtr);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream);
aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count);
aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);
aclError aclrtMemcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                       aclrtMemcpyKind kind);
aclError aclrtMemcpy2dAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                            aclrtMemcpyKind kind, aclrtStream stream);
size_t aclDataTypeSize(int dataType);
aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy);

typedef struct aclrtMemLocation { uint32_t id; int type; } aclrtMemLocation;
typedef struct aclrtPtrAttributes { aclrtMemLocation location; uint32_t pageSize; uint32_t rsv[4]; } aclrtPtrAttributes;
aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes);
aclError aclrtHostRegister(void *ptr, uint64_t size, int type, void **devPtr);
aclError aclrtHostUnregister(void *ptr);

typedef struct aclrtIpcEventHandle { char reserved[64]; } aclrtIpcEventHandle;
aclError aclrtIpcGetEventHandle(aclrtEvent event, aclrtIpcEventHandle *handle);
aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle handle, aclrtEvent *event);
aclError aclrtDeviceGetBareTgid(int32_t *pid);
aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags);
aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num);
aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags);
aclError aclrtIpcMemClose(const char *key);

typedef void *aclrtDrvMemHandle;
typedef struct aclrtPhysicalMemProp {
    int handleType; int allocationType; int memAttr; aclrtMemLocation location; uint64_t reserve;
} aclrtPhysicalMemProp;
aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags);
aclError aclrtReleaseMemAddress(void *virPtr);
aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                             uint64_t flags);
aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags);
aclError aclrtUnmapMem(void *virPtr);
aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, int option, size_t *granularity);
aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, int handleType, uint64_t flags,
                                         uint64_t *shareableHandle);
aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum);
aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId, aclrtDrvMemHandle *handle);

typedef void *aclmdlRI;
typedef void *aclrtTaskGrp;
aclError aclmdlRICaptureBegin(aclrtStream stream, int mode);
aclError aclmdlRICaptureGetInfo(aclrtStream stream, int *status, aclmdlRI *modelRI);
aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI);
aclError aclmdlRICaptureThreadExchangeMode(int *mode);
aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream);
aclError aclmdlRIDestroy(aclmdlRI modelRI);
aclError aclmdlRICaptureTaskGrpBegin(aclrtStream stream);
aclError aclmdlRICaptureTaskGrpEnd(aclrtStream stream, aclrtTaskGrp *handle);
aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream stream, aclrtTaskGrp handle);
aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream stream);

aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode);
aclError aclrtSetOpWaitTimeout(uint32_t timeout);
aclError aclrtSetOpExecuteTimeOut(uint32_t timeout);

aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                             aclrtStream stream);
aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream);
aclError aclrtProcessReport(int32_t timeout);
aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream);

aclError aclrtPeekAtLastError(aclrtLastErrLevel level);
aclError aclrtGetLastError(aclrtLastErrLevel level);
"""

# Functions every supported CANN exports; the others are probed at load time.
REQUIRED = (
    "aclInit", "aclFinalize", "aclrtSetDevice", "aclrtResetDevice", "aclrtGetDevice", "aclrtGetDeviceCount",
    "aclrtCreateStream", "aclrtDestroyStream", "aclrtSynchronizeStream", "aclrtStreamWaitEvent",
    "aclrtCreateEvent", "aclrtRecordEvent", "aclrtSynchronizeEvent", "aclrtEventElapsedTime",
    "aclrtDestroyEvent", "aclrtMalloc", "aclrtMallocHost", "aclrtFree", "aclrtFreeHost", "aclrtMemcpy",
    "aclrtMemcpyAsync", "aclrtMemset", "aclrtMemsetAsync",
)

OPTIONAL = (
    "aclGetRecentErrMsg", "aclrtGetVersion", "aclrtGetSocName", "aclrtGetRunMode", "aclrtSynchronizeDevice",
    "aclrtSynchronizeDeviceWithTimeout", "aclrtCreateContext", "aclrtDestroyContext", "aclrtSetCurrentContext",
    "aclrtGetCurrentContext", "aclrtCreateStreamWithConfig", "aclrtDestroyStreamForce",
    "aclrtSynchronizeStreamWithTimeout", "aclrtCreateEventWithFlag", "aclrtCreateEventExWithFlag",
    "aclrtResetEvent", "aclrtQueryEvent", "aclrtQueryEventStatus", "aclrtSynchronizeEventWithTimeout",
    "aclrtGetMemInfo", "aclrtLaunchCallback", "aclrtSubscribeReport", "aclrtProcessReport",
    "aclrtUnSubscribeReport", "aclrtPeekAtLastError", "aclrtGetLastError",
    # CANN 8.x
    "aclrtStreamQuery", "aclrtStreamGetId", "aclrtLaunchHostFunc", "aclrtMemcpy2d", "aclrtMemcpy2dAsync",
    "aclDataTypeSize", "aclrtDeviceCanAccessPeer", "aclrtDeviceEnablePeerAccess", "aclrtDeviceDisablePeerAccess",
    "aclrtMallocAlign32", "aclrtPointerGetAttributes", "aclrtHostRegister", "aclrtHostUnregister",
    "aclrtSetStreamFailureMode", "aclrtSetOpWaitTimeout", "aclrtSetOpExecuteTimeOut",
    "aclrtDeviceGetBareTgid", "aclrtIpcMemGetExportKey", "aclrtIpcMemSetImportPid", "aclrtIpcMemImportByKey",
    "aclrtIpcMemClose", "aclrtIpcGetEventHandle", "aclrtIpcOpenEventHandle",
    "aclmdlRICaptureBegin", "aclmdlRICaptureGetInfo", "aclmdlRICaptureEnd", "aclmdlRICaptureThreadExchangeMode",
    "aclmdlRIExecuteAsync", "aclmdlRIDestroy", "aclmdlRICaptureTaskGrpBegin", "aclmdlRICaptureTaskGrpEnd",
    "aclmdlRICaptureTaskUpdateBegin", "aclmdlRICaptureTaskUpdateEnd",
    "aclrtReserveMemAddress", "aclrtReleaseMemAddress", "aclrtMallocPhysical", "aclrtFreePhysical", "aclrtMapMem",
    "aclrtUnmapMem", "aclrtMemGetAllocationGranularity", "aclrtMemExportToShareableHandle",
    "aclrtMemSetPidToShareableHandle", "aclrtMemImportFromShareableHandle",
)
