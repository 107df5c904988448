/* Devices and contexts.  The current context (and with it the current device)
 * belongs to the calling thread, as in AscendCL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "acl/acl.h"
#include "acl/runtime.h"

static sim_device_t g_devices[SIM_MAX_DEVICES];
static pthread_once_t g_devices_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_acl_initialized, g_acl_finalized;
static __thread void *t_context;

static void init_devices(void)
{
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        pthread_mutex_init(&g_devices[d].lock, NULL);
        pthread_mutex_init(&g_devices[d].streams_lock, NULL);
    }
}

sim_device_t *sim_device(int device)
{
    pthread_once(&g_devices_once, init_devices);
    return &g_devices[device];
}

int sim_device_check(int device)
{
    int err = sim_config_check(NULL);
    if (err != ACL_SUCCESS)
        return err;
    const sim_config_t *config = sim_config();
    int count = config->device_count;
    if (device >= 0 && device < count)
        return ACL_SUCCESS;
    /* Where the visible list stopped short, say so: "0 devices" alone does not
     * tell which entry of ASCEND_RT_VISIBLE_DEVICES was not taken. */
    const char *note = config->visible_note;
    if (count == 0)
        return sim_error(ACL_ERROR_RT_INVALID_DEVICEID, "device id %d is out of range: no device is visible (%s)",
                         device, *note != '\0' ? note : "ASCEND_RT_VISIBLE_DEVICES");
    return sim_error(ACL_ERROR_RT_INVALID_DEVICEID, "device id %d is out of range: this simulator has %d device%s "
                     "(0..%d; HCCLPY_SIM_DEVICES / ASCEND_RT_VISIBLE_DEVICES)%s%s",
                     device, count, count == 1 ? "" : "s", count - 1, *note != '\0' ? "; " : "", note);
}

int sim_device_physical(int device)
{
    return sim_config()->visible[device];
}

sim_context_t *sim_current_context(void)
{
    sim_context_t *context = t_context == NULL ? NULL : sim_handle_get(t_context, SIM_KIND_CONTEXT);
    if (context == NULL)
        sim_error(ACL_ERROR_RT_CONTEXT_NULL, "no current device on this thread: call aclrtSetDevice first");
    return context;
}

static void *ref_default_stream(void *object)
{
    sim_stream_t *stream = ((sim_context_t *)object)->default_stream;
    sim_stream_ref(stream);
    return stream;
}

/* Through the context's handle: aclrtDestroyContext on another thread frees the handle before
 * it destroys the default stream, so the stream is referenced or not found, never freed. */
sim_stream_t *sim_current_default_stream(void)
{
    sim_stream_t *stream =
        t_context == NULL ? NULL : sim_handle_acquire(t_context, SIM_KIND_CONTEXT, ref_default_stream);
    if (stream == NULL)
        sim_error(ACL_ERROR_RT_CONTEXT_NULL, "no current device on this thread: call aclrtSetDevice first");
    return stream;
}

int sim_current_device(int *device)
{
    sim_context_t *context = sim_current_context();
    if (context == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    *device = context->device;
    return ACL_SUCCESS;
}

static int context_create(int device, bool is_default, sim_context_t **out)
{
    sim_context_t *context = calloc(1, sizeof *context);
    if (context == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating a context");
    context->device = device;
    context->is_default = is_default;
    int err = sim_stream_create(device, 0, 0, true, &context->default_stream);
    if (err != ACL_SUCCESS) {
        free(context);
        return err;
    }
    context->handle = sim_handle_new(SIM_KIND_CONTEXT, context);
    if (context->handle == NULL) {
        sim_stream_destroy(context->default_stream, true);
        free(context);
        return sim_error(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, "too many live handles");
    }
    *out = context;
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- aclInit */

SIM_EXPORT aclError aclInit(const char *configPath)
{
    if (configPath != NULL && configPath[0] != '\0') {
        FILE *file = fopen(configPath, "r");
        if (file == NULL)
            return sim_error(ACL_ERROR_INVALID_FILE, "aclInit: cannot read the configuration file '%s'", configPath);
        fclose(file);
    }
    /* A bad simulator setting fails here, the first call a program makes, not at
     * its first device call; nor is the runtime marked initialised. */
    int err = sim_config_check("aclInit");
    if (err != ACL_SUCCESS)
        return err;
    pthread_mutex_lock(&g_init_lock);
    bool already = g_acl_initialized;
    g_acl_initialized = true;
    pthread_mutex_unlock(&g_init_lock);
    if (already)
        return sim_error(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialised (this error can be ignored)");
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclFinalize(void)
{
    pthread_mutex_lock(&g_init_lock);
    bool was = g_acl_initialized, finalized = g_acl_finalized;
    g_acl_initialized = false;
    g_acl_finalized = g_acl_finalized || was;
    pthread_mutex_unlock(&g_init_lock);
    if (!was)
        return finalized ? sim_error(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: already finalised")
                         : sim_error(ACL_ERROR_UNINITIALIZE, "aclFinalize: aclInit was not called");
    return ACL_SUCCESS;
}

/* The simulator counts one aclInit (a second is refused with ACL_ERROR_REPEAT_INITIALIZE), so
 * dropping the reference finalises and leaves none. */
SIM_EXPORT aclError aclFinalizeReference(uint64_t *refCount)
{
    if (refCount == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclFinalizeReference: refCount is NULL");
    aclError err = aclFinalize();
    if (err == ACL_SUCCESS)
        *refCount = 0;
    return err;
}

/* ------------------------------------------------------- package versions
 *
 * The headers and behaviour the simulator follows are those of CANN 9.0.0 (reference §2.2, the
 * CANN 9.0.0 hccl.h), so every package reports that version. */
#define SIM_CANN_MAJOR 9
#define SIM_CANN_MINOR 0
#define SIM_CANN_PATCH 0

/* Package names aclsysGetVersionStr/Num accept: those of aclCANNPackageName, and "ge_compiler". */
static bool known_package(const char *name)
{
    static const char *const names[] = {"cann", "runtime", "compiler", "ge_compiler", "hccl", "toolkit", "opp",
                                        "opp_kernel", "driver"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(name, names[i]) == 0)
            return true;
    return false;
}

SIM_EXPORT aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version)
{
    if (version == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion: version is NULL");
    if ((int)name < ACL_PKG_NAME_CANN || (int)name > ACL_PKG_NAME_DRIVER)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion: unknown package %d", (int)name);
    memset(version, 0, sizeof *version);
    snprintf(version->version, sizeof version->version, "%d.%d.%d", SIM_CANN_MAJOR, SIM_CANN_MINOR, SIM_CANN_PATCH);
    snprintf(version->majorVersion, sizeof version->majorVersion, "%d", SIM_CANN_MAJOR);
    snprintf(version->minorVersion, sizeof version->minorVersion, "%d", SIM_CANN_MINOR);
    snprintf(version->releaseVersion, sizeof version->releaseVersion, "%d", SIM_CANN_PATCH);
    snprintf(version->patchVersion, sizeof version->patchVersion, "%d", SIM_CANN_PATCH);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclsysGetVersionStr(char *pkgName, char *versionStr)
{
    if (pkgName == NULL || versionStr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionStr: pkgName and versionStr must not be NULL");
    if (!known_package(pkgName))
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionStr: unknown package '%.64s'", pkgName);
    snprintf(versionStr, ACL_PKG_VERSION_MAX_SIZE, "%d.%d.%d", SIM_CANN_MAJOR, SIM_CANN_MINOR, SIM_CANN_PATCH);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclsysGetVersionNum(char *pkgName, int32_t *versionNum)
{
    if (pkgName == NULL || versionNum == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionNum: pkgName and versionNum must not be NULL");
    if (!known_package(pkgName))
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclsysGetVersionNum: unknown package '%.64s'", pkgName);
    /* The CANN runtime's encoding: major * 10^7 + minor * 10^5 + patch * 10^3 (9.0.0 = 90000000). */
    *versionNum = SIM_CANN_MAJOR * 10000000 + SIM_CANN_MINOR * 100000 + SIM_CANN_PATCH * 1000;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion)
{
    if (majorVersion == NULL || minorVersion == NULL || patchVersion == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetVersion: arguments must not be NULL");
    *majorVersion = ACL_MAJOR_VERSION;
    *minorVersion = ACL_MINOR_VERSION;
    *patchVersion = ACL_PATCH_VERSION;
    return ACL_SUCCESS;
}

SIM_EXPORT const char *aclrtGetSocName(void)
{
    return "HcclpySimulator";
}

SIM_EXPORT aclError aclrtGetRunMode(aclrtRunMode *runMode)
{
    if (runMode == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL");
    *runMode = ACL_HOST;
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- devices */

SIM_EXPORT aclError aclrtGetDeviceCount(uint32_t *count)
{
    if (count == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is NULL");
    *count = (uint32_t)sim_config()->device_count;
    return sim_config_check("aclrtGetDeviceCount");
}

/* What the simulator knows of a device: its memory (as aclrtGetMemInfo's total), its physical id,
 * and that it is not a virtual instance.  Core counts and the like describe hardware it does not
 * have: ACL_ERROR_FEATURE_UNSUPPORTED rather than an invented number. */
SIM_EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)
{
    if (value == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: value is NULL");
    int err = sim_device_check(deviceId > INT32_MAX ? -1 : (int)deviceId);
    if (err != ACL_SUCCESS)
        return err;
    switch (attr) {
    case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE:
        *value = (int64_t)sim_config()->device_memory;
        return ACL_SUCCESS;
    case ACL_DEV_ATTR_PHY_CHIP_ID:
        *value = sim_device_physical((int)deviceId);
        return ACL_SUCCESS;
    case ACL_DEV_ATTR_IS_VIRTUAL:
        *value = 0;
        return ACL_SUCCESS;
    case ACL_DEV_ATTR_AICPU_CORE_NUM: case ACL_DEV_ATTR_AICORE_CORE_NUM: case ACL_DEV_ATTR_CUBE_CORE_NUM:
    case ACL_DEV_ATTR_VECTOR_CORE_NUM: case ACL_DEV_ATTR_WARP_SIZE: case ACL_DEV_ATTR_MAX_THREAD_PER_VECTOR_CORE:
    case ACL_DEV_ATTR_LOCAL_MEM_PER_VECTOR_CORE: case ACL_DEV_ATTR_L2_CACHE_SIZE: case ACL_DEV_ATTR_SMP_ID:
    case ACL_DEV_ATTR_SUPER_POD_DEVIDE_ID: case ACL_DEV_ATTR_SUPER_POD_SERVER_ID: case ACL_DEV_ATTR_SUPER_POD_ID:
    case ACL_DEV_ATTR_CUST_OP_PRIVILEGE: case ACL_DEV_ATTR_MAINBOARD_ID:
        return sim_error(ACL_ERROR_FEATURE_UNSUPPORTED, "aclrtGetDeviceInfo: the simulator does not model device "
                         "attribute %d (it answers ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE, ACL_DEV_ATTR_PHY_CHIP_ID and "
                         "ACL_DEV_ATTR_IS_VIRTUAL)", (int)attr);
    }
    return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: unknown device attribute %d", (int)attr);
}

SIM_EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    int err = sim_device_check(deviceId);
    if (err != ACL_SUCCESS)
        return err;
    sim_device_t *device = sim_device(deviceId);
    pthread_mutex_lock(&device->lock);
    if (device->default_context == NULL) {
        int arena_err;
        if (sim_arena_get(deviceId, &arena_err) == NULL) {
            pthread_mutex_unlock(&device->lock);
            return arena_err;
        }
        err = context_create(deviceId, true, &device->default_context);
        if (err != ACL_SUCCESS) {
            pthread_mutex_unlock(&device->lock);
            return err;
        }
    }
    device->set_count++;
    t_context = device->default_context->handle;
    pthread_mutex_unlock(&device->lock);
    return ACL_SUCCESS;
}

/* The device's default context and its default stream survive (their handles
 * stay valid, for the next aclrtSetDevice).  When the last user resets it
 * (reference §3.6: resources are freed when the count reaches 0), its memory
 * is released and the streams and events created on it are destroyed: their
 * handles are refused from then on, as after aclrtDestroyStream/Event. */
/* aclrtResetDevice drops one aclrtSetDevice; aclrtResetDeviceForce drops them all, and is refused
 * once the device's resources were released (by either). */
static aclError reset_device(int32_t deviceId, bool force)
{
    int err = sim_device_check(deviceId);
    if (err != ACL_SUCCESS)
        return err;
    sim_device_t *device = sim_device(deviceId);
    pthread_mutex_lock(&device->lock);
    int before = device->set_count;
    bool release = force ? before > 0 : before == 1;
    if (force)
        device->set_count = 0;
    else if (before > 0)
        device->set_count--;
    pthread_mutex_unlock(&device->lock);
    if (force && before == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtResetDeviceForce: device %d is not set (never set, or its "
                         "resources were already released by a reset)", (int)deviceId);
    if (release) {
        sim_stream_sync_all(deviceId, SIM_NO_DEADLINE);
        sim_event_release_device(deviceId);
        sim_stream_release_device(deviceId);
        int arena_err;
        sim_arena_t *arena = sim_arena_get(deviceId, &arena_err);
        if (arena != NULL)
            sim_arena_reset(arena);
    }
    sim_context_t *current = t_context == NULL ? NULL : sim_handle_get(t_context, SIM_KIND_CONTEXT);
    if (current != NULL && current->device == deviceId && device->set_count == 0)
        t_context = NULL;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    return reset_device(deviceId, false);
}

SIM_EXPORT aclError aclrtResetDeviceForce(int32_t deviceId)
{
    return reset_device(deviceId, true);
}

SIM_EXPORT aclError aclrtGetDevice(int32_t *deviceId)
{
    if (deviceId == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is NULL");
    int device;
    int err = sim_current_device(&device);
    if (err == ACL_SUCCESS)
        *deviceId = device;
    return err;
}

static aclError synchronize_device(int32_t timeout_ms)
{
    int device;
    int err = sim_current_device(&device);
    if (err != ACL_SUCCESS)
        return err;
    int64_t deadline = timeout_ms < 0 ? SIM_NO_DEADLINE : sim_now_ns() + (int64_t)timeout_ms * SIM_NS_PER_MS;
    return sim_stream_sync_all(device, deadline);
}

SIM_EXPORT aclError aclrtSynchronizeDevice(void)
{
    int err = sim_capture_unsafe("aclrtSynchronizeDevice");
    return err != ACL_SUCCESS ? err : synchronize_device(-1);
}

SIM_EXPORT aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout)
{
    if (timeout < -1)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeDeviceWithTimeout: timeout %d must be -1 or >= 0",
                         (int)timeout);
    int err = sim_capture_unsafe("aclrtSynchronizeDeviceWithTimeout");
    return err != ACL_SUCCESS ? err : synchronize_device(timeout);
}

/* --------------------------------------------------------------- contexts */

SIM_EXPORT aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    if (context == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
    int err = sim_device_check(deviceId);
    if (err != ACL_SUCCESS)
        return err;
    if (sim_arena_get(deviceId, &err) == NULL)
        return err;
    sim_context_t *created;
    err = context_create(deviceId, false, &created);
    if (err != ACL_SUCCESS)
        return err;
    t_context = created->handle;
    *context = created->handle;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtDestroyContext(aclrtContext context)
{
    sim_context_t *found = sim_handle_get(context, SIM_KIND_CONTEXT);
    if (found == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyContext: %p is not a live context", context);
    if (found->is_default)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyContext: the default context of a device is "
                         "released by aclrtResetDevice, not destroyed");
    sim_handle_free(context);
    if (t_context == context)
        t_context = NULL;
    sim_stream_destroy(found->default_stream, false);
    free(found);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtSetCurrentContext(aclrtContext context)
{
    if (sim_handle_get(context, SIM_KIND_CONTEXT) == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSetCurrentContext: %p is not a live context", context);
    t_context = context;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtGetCurrentContext(aclrtContext *context)
{
    if (context == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context is NULL");
    sim_context_t *current = sim_current_context();
    if (current == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    *context = current->handle;
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------- fork */

void sim_memory_after_fork(void);

void sim_runtime_after_fork(void)
{
    pthread_mutex_init(&g_init_lock, NULL);
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        sim_device_t *device = &g_devices[d];
        pthread_mutex_init(&device->lock, NULL);
        pthread_mutex_init(&device->streams_lock, NULL);
        device->set_count = 0;
        device->default_context = NULL; /* the parent's objects are abandoned */
        device->streams = NULL;
        device->stream_count = device->stream_capacity = 0;
    }
    t_context = NULL;
    sim_stream_after_fork();
    sim_event_after_fork();
    sim_memory_after_fork();
    sim_ipc_after_fork();
    sim_capture_after_fork();
}

/* ------------------------------------------------------------------ peer access */

/* Which device may reach which (aclrtDeviceEnablePeerAccess): one direction at a time, for the
 * process.  Every simulated device lives in this host's memory, so any two can reach each other:
 * enabling records the permission that CANN requires first. */
static pthread_mutex_t g_peer_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_peer_enabled[SIM_MAX_DEVICES][SIM_MAX_DEVICES];

static int check_peer_pair(const char *api, int32_t device, int32_t peer)
{
    int err = sim_device_check(device);
    if (err == ACL_SUCCESS)
        err = sim_device_check(peer);
    if (err != ACL_SUCCESS)
        return err;
    if (device == peer)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the peer device %d is the device itself", api, (int)peer);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId)
{
    if (canAccessPeer == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDeviceCanAccessPeer: canAccessPeer is NULL");
    int err = check_peer_pair("aclrtDeviceCanAccessPeer", deviceId, peerDeviceId);
    if (err == ACL_SUCCESS)
        *canAccessPeer = 1;
    return err;
}

static aclError set_peer_access(const char *api, int32_t peer, bool enable)
{
    int device;
    int err = sim_current_device(&device);
    if (err == ACL_SUCCESS)
        err = check_peer_pair(api, device, peer);
    if (err != ACL_SUCCESS)
        return err;
    pthread_mutex_lock(&g_peer_lock);
    bool was = g_peer_enabled[device][peer];
    if (was != enable)
        g_peer_enabled[device][peer] = enable;
    pthread_mutex_unlock(&g_peer_lock);
    if (was == enable) /* as CUDA reports it: CANN's documentation does not say */
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: access from device %d to device %d is already %s", api, device,
                         (int)peer, enable ? "enabled" : "disabled");
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags)
{
    if (flags != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDeviceEnablePeerAccess: flags %u must be 0 (reserved)",
                         (unsigned)flags);
    return set_peer_access("aclrtDeviceEnablePeerAccess", peerDeviceId, true);
}

SIM_EXPORT aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId)
{
    return set_peer_access("aclrtDeviceDisablePeerAccess", peerDeviceId, false);
}
