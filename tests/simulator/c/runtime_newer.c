/*
 * The newer CANN runtime functions, from C: aclrtStreamQuery, aclrtStreamGetId,
 * aclrtLaunchHostFunc, aclrtMemcpy2d(Async), aclDataTypeSize, peer access
 * (aclrtDeviceCanAccessPeer, aclrtDeviceEnable/DisablePeerAccess), aclrtResetDeviceForce,
 * aclrtSetStreamFailureMode with aclrtSetOpWaitTimeout (a wait that times out fails its stream,
 * which then runs its later work or not), aclrtSetOpExecuteTimeOut, aclrtMallocAlign32,
 * aclrtPointerGetAttributes and aclrtHostRegister/Unregister, with the error codes of their bad
 * arguments.
 *
 * usage: runtime_newer      (prints "runtime_newer: N checks OK" and "RESULT: PASS" and exits 0, or
 *                            lists the failures and exits 1)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <acl/acl.h>

static int checks, failures;

#define EXPECT(cond, ...)                                                                           \
    do {                                                                                            \
        checks++;                                                                                   \
        if (!(cond)) {                                                                              \
            failures++;                                                                             \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                              \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fprintf(stderr, " (last error: %s)\n", aclGetRecentErrMsg());                           \
        }                                                                                           \
    } while (0)

#define OK(call) EXPECT((call) == ACL_SUCCESS, "%s failed", #call)

/* ---- host functions ---------------------------------------------------------------------- */

typedef struct {
    atomic_int release;   /* set by the test: the blocking host function may return */
    atomic_int entered;
    int order[8];
    atomic_int count;
    int *device_copy_seen; /* host buffer the copy before the function filled */
    int seen;
    pthread_t thread;
} host_state;

static void block_until_released(void *args)
{
    host_state *state = args;
    atomic_store(&state->entered, 1);
    while (!atomic_load(&state->release))
        usleep(1000);
}

static void record_order(void *args)
{
    host_state *state = args;
    int place = atomic_fetch_add(&state->count, 1);
    state->order[place] = place;
    state->seen = state->device_copy_seen[0];
    state->thread = pthread_self();
}

static void host_functions(aclrtStream stream)
{
    host_state state = {0};
    /* Pinned host memory: a copy from pageable memory returns only when it is done, which it
     * cannot be while a host function blocks the stream. */
    int *host_in = NULL, *host_out = NULL;
    const size_t bytes = 4 * sizeof(int);
    OK(aclrtMallocHost((void **)&host_in, bytes));
    OK(aclrtMallocHost((void **)&host_out, bytes));
    for (int i = 0; i < 4; i++)
        host_in[i] = 7 + i, host_out[i] = 0;
    state.device_copy_seen = host_out;
    void *dev = NULL;
    OK(aclrtMalloc(&dev, bytes, ACL_MEM_MALLOC_HUGE_FIRST));

    /* The stream is busy while a host function blocks it: the query says so, and never waits. */
    OK(aclrtLaunchHostFunc(stream, block_until_released, &state));
    while (!atomic_load(&state.entered))
        usleep(1000);
    aclrtStreamStatus status = ACL_STREAM_STATUS_RESERVED;
    OK(aclrtStreamQuery(stream, &status));
    EXPECT(status == ACL_STREAM_STATUS_NOT_READY, "status %d while a host function blocks the stream", (int)status);

    /* In stream order: the copies queued before it are done when it runs. */
    OK(aclrtMemcpyAsync(dev, bytes, host_in, bytes, ACL_MEMCPY_HOST_TO_DEVICE, stream));
    OK(aclrtMemcpyAsync(host_out, bytes, dev, bytes, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    OK(aclrtLaunchHostFunc(stream, record_order, &state));
    OK(aclrtLaunchHostFunc(stream, record_order, &state));
    atomic_store(&state.release, 1);
    OK(aclrtSynchronizeStream(stream));
    EXPECT(atomic_load(&state.count) == 2 && state.order[0] == 0 && state.order[1] == 1, "host functions ran %d times",
           atomic_load(&state.count));
    EXPECT(state.seen == 7, "the host function saw %d where the copy before it put 7", state.seen);
    OK(aclrtStreamQuery(stream, &status));
    EXPECT(status == ACL_STREAM_STATUS_COMPLETE, "status %d once synchronised", (int)status);

    /* The default stream takes host functions too. */
    atomic_store(&state.count, 0);
    OK(aclrtLaunchHostFunc(NULL, record_order, &state));
    OK(aclrtSynchronizeStream(NULL));
    EXPECT(atomic_load(&state.count) == 1, "the default stream's host function ran %d times", atomic_load(&state.count));

    EXPECT(aclrtLaunchHostFunc(stream, NULL, NULL) == ACL_ERROR_INVALID_PARAM, "a NULL function is refused");
    EXPECT(aclrtStreamQuery(stream, NULL) == ACL_ERROR_INVALID_PARAM, "a NULL status is refused");
    OK(aclrtFree(dev));
    OK(aclrtFreeHost(host_in));
    OK(aclrtFreeHost(host_out));
}

/* ---- stream ids -------------------------------------------------------------------------- */

static void stream_ids(aclrtStream stream)
{
    aclrtStream other = NULL;
    OK(aclrtCreateStream(&other));
    int32_t a = -1, b = -1, d = -1, d2 = -1;
    OK(aclrtStreamGetId(stream, &a));
    OK(aclrtStreamGetId(other, &b));
    OK(aclrtStreamGetId(NULL, &d));
    OK(aclrtStreamGetId(NULL, &d2));
    EXPECT(a >= 0 && b >= 0 && d >= 0 && a != b && a != d && b != d, "ids %d, %d and the default's %d", a, b, d);
    EXPECT(d == d2, "the default stream's id changed: %d then %d", d, d2);
    EXPECT(aclrtStreamGetId(stream, NULL) == ACL_ERROR_INVALID_PARAM, "a NULL id is refused");
    OK(aclrtDestroyStream(other));
    EXPECT(aclrtStreamGetId(other, &b) != ACL_SUCCESS, "a destroyed stream has no id");
}

/* ---- 2-D copies -------------------------------------------------------------------------- */

static void copies_2d(aclrtStream stream)
{
    /* A 4 x 6 host matrix of bytes; copy its 3 x 4 middle block to a device buffer of pitch 8,
     * then back into a host buffer of pitch 5. */
    unsigned char host[4][6], back[3][5];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++)
            host[r][c] = (unsigned char)(10 * r + c);
    memset(back, 0xEE, sizeof back);
    void *dev = NULL;
    OK(aclrtMalloc(&dev, 3 * 8, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(dev, 3 * 8, 0, 3 * 8));
    OK(aclrtMemcpy2d(dev, 8, &host[1][1], 6, 4, 3, ACL_MEMCPY_HOST_TO_DEVICE));
    OK(aclrtMemcpy2dAsync(back, 5, dev, 8, 4, 3, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    OK(aclrtSynchronizeStream(stream));
    int wrong = 0;
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 4; c++)
            wrong += back[r][c] != host[r + 1][c + 1];
        wrong += back[r][4] != 0xEE; /* the pitch's gap is left alone */
    }
    EXPECT(wrong == 0, "%d bytes of the 2-D round trip are wrong", wrong);

    unsigned char whole[3 * 8];
    OK(aclrtMemcpy(whole, sizeof whole, dev, sizeof whole, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(whole[4] == 0 && whole[7] == 0 && whole[8] == host[2][1], "the device rows sit 8 bytes apart");

    EXPECT(aclrtMemcpy2d(dev, 3, host, 6, 4, 3, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_INVALID_PARAM,
           "a width past dpitch is refused");
    EXPECT(aclrtMemcpy2d(dev, 8, host, 6, 4, 4, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_INVALID_PARAM,
           "rows past the end of the device allocation are refused");
    EXPECT(aclrtMemcpy2d(dev, 8, dev, 8, 4, 1, ACL_MEMCPY_DEVICE_TO_DEVICE) == ACL_ERROR_INVALID_PARAM,
           "a device-to-device 2-D copy is refused");
    EXPECT(aclrtMemcpy2d(host, 6, dev, 8, 4, 1, ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_INVALID_PARAM,
           "a kind that contradicts the pointers is refused");
    EXPECT(aclrtMemcpy2dAsync(NULL, 8, host, 6, 4, 1, ACL_MEMCPY_HOST_TO_DEVICE, stream) == ACL_ERROR_INVALID_PARAM,
           "a NULL destination is refused");
    OK(aclrtMemcpy2d(dev, 8, host, 6, 0, 3, ACL_MEMCPY_HOST_TO_DEVICE)); /* nothing to copy */
    OK(aclrtFree(dev));
}

/* ---- data type sizes --------------------------------------------------------------------- */

static void data_type_sizes(void)
{
    struct {
        aclDataType type;
        size_t size;
    } expected[] = {
        {ACL_FLOAT, 4}, {ACL_FLOAT16, 2}, {ACL_INT8, 1}, {ACL_INT32, 4}, {ACL_UINT8, 1}, {ACL_INT16, 2},
        {ACL_UINT16, 2}, {ACL_UINT32, 4}, {ACL_INT64, 8}, {ACL_UINT64, 8}, {ACL_DOUBLE, 8}, {ACL_BOOL, 1},
        {ACL_COMPLEX64, 8}, {ACL_COMPLEX128, 16}, {ACL_BF16, 2}, {ACL_COMPLEX32, 4}, {ACL_HIFLOAT8, 1},
        {ACL_FLOAT8_E5M2, 1}, {ACL_FLOAT8_E4M3FN, 1}, {ACL_FLOAT8_E8M0, 1}, {ACL_STRING, 0}, {ACL_INT4, 0},
        {ACL_DT_UNDEFINED, 0}, {(aclDataType)999, 0},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        EXPECT(aclDataTypeSize(expected[i].type) == expected[i].size, "aclDataTypeSize(%d) = %zu, expected %zu",
               (int)expected[i].type, aclDataTypeSize(expected[i].type), expected[i].size);
}

/* ---- forced device resets --------------------------------------------------------------- */

static void forced_resets(void)
{
    OK(aclrtSetDevice(2));
    OK(aclrtSetDevice(2));
    OK(aclrtResetDeviceForce(2)); /* both sets at once */
    EXPECT(aclrtResetDeviceForce(2) == ACL_ERROR_INVALID_PARAM, "a forced reset of a released device is refused");
    OK(aclrtSetDevice(2));
    OK(aclrtSetDevice(2));
    OK(aclrtResetDevice(2));
    OK(aclrtResetDeviceForce(2)); /* the set that was left */
    OK(aclrtSetDevice(2));
    OK(aclrtResetDevice(2));
    EXPECT(aclrtResetDeviceForce(2) == ACL_ERROR_INVALID_PARAM, "a forced reset after the last reset is refused");
    EXPECT(aclrtResetDeviceForce(4096) == ACL_ERROR_RT_INVALID_DEVICEID, "a device out of range is refused");
    OK(aclrtSetDevice(0)); /* the thread's device again */
}

/* ---- peer access ------------------------------------------------------------------------- */

static void peer_access(void)
{
    int32_t can = -1;
    OK(aclrtDeviceCanAccessPeer(&can, 0, 1));
    EXPECT(can == 1, "device 0 cannot reach device 1 (%d)", can);
    EXPECT(aclrtDeviceCanAccessPeer(&can, 1, 1) == ACL_ERROR_INVALID_PARAM, "a device is not its own peer");
    EXPECT(aclrtDeviceCanAccessPeer(&can, 0, 4096) == ACL_ERROR_RT_INVALID_DEVICEID, "a peer out of range is refused");
    EXPECT(aclrtDeviceCanAccessPeer(NULL, 0, 1) == ACL_ERROR_INVALID_PARAM, "a NULL result is refused");
    OK(aclrtDeviceEnablePeerAccess(1, 0)); /* from the current device, 0 */
    EXPECT(aclrtDeviceEnablePeerAccess(1, 0) == ACL_ERROR_INVALID_PARAM, "enabling twice is refused");
    EXPECT(aclrtDeviceEnablePeerAccess(2, 1) == ACL_ERROR_INVALID_PARAM, "flags other than 0 are refused");
    EXPECT(aclrtDeviceEnablePeerAccess(0, 0) == ACL_ERROR_INVALID_PARAM, "the current device is not its own peer");
    OK(aclrtDeviceDisablePeerAccess(1));
    EXPECT(aclrtDeviceDisablePeerAccess(1) == ACL_ERROR_INVALID_PARAM, "disabling what is not enabled is refused");
}

/* ---- failure modes and wait timeouts -------------------------------------------------- */

static void set_flag(void *args)
{
    atomic_store((atomic_int *)args, 1);
}

/* A stream whose wait for an event times out (aclrtSetOpWaitTimeout) has failed; the host
 * function queued after the wait runs in ACL_CONTINUE_ON_FAILURE mode, and does not in
 * ACL_STOP_ON_FAILURE mode or with no mode set. Returns whether it ran. */
static int after_a_failed_wait(int64_t mode)
{
    aclrtStream waiter = NULL, blocked = NULL;
    aclrtEvent event = NULL;
    OK(aclrtCreateStream(&waiter));
    OK(aclrtCreateStream(&blocked));
    OK(aclrtCreateEvent(&event));
    if (mode >= 0)
        OK(aclrtSetStreamFailureMode(waiter, (uint64_t)mode));
    host_state *state = NULL;
    OK(aclrtMallocHost((void **)&state, sizeof *state));
    memset(state, 0, sizeof *state);
    atomic_int ran = 0;
    OK(aclrtLaunchHostFunc(blocked, block_until_released, state));
    OK(aclrtRecordEvent(event, blocked));
    /* Running on the stream's worker: a thread that synchronises a stream may run its work itself,
     * and this thread is the one that releases it. */
    while (!atomic_load(&state->entered))
        usleep(1000);
    OK(aclrtStreamWaitEvent(waiter, event));
    OK(aclrtLaunchHostFunc(waiter, set_flag, &ran));
    EXPECT(aclrtSynchronizeStream(waiter) == ACL_ERROR_RT_WAIT_TIMEOUT, "the wait outlasts its timeout");
    atomic_store(&state->release, 1);
    OK(aclrtSynchronizeStream(blocked));
    OK(aclrtDestroyEvent(event));
    OK(aclrtDestroyStream(blocked));
    aclrtDestroyStream(waiter); /* (reports the stream's failure again) */
    OK(aclrtFreeHost(state));
    return atomic_load(&ran);
}

static void failure_modes(aclrtStream stream)
{
    EXPECT(aclrtSetStreamFailureMode(stream, 2) == ACL_ERROR_INVALID_PARAM, "mode 2 is refused");
    OK(aclrtSetStreamFailureMode(stream, ACL_STOP_ON_FAILURE));
    EXPECT(aclrtSetStreamFailureMode(stream, ACL_CONTINUE_ON_FAILURE) == ACL_ERROR_INVALID_PARAM,
           "the mode is set once per stream");
    OK(aclrtSetStreamFailureMode(NULL, ACL_STOP_ON_FAILURE)); /* the default stream */
    OK(aclrtSetOpExecuteTimeOut(30));
    OK(aclrtSetOpWaitTimeout(1));
    EXPECT(after_a_failed_wait(ACL_CONTINUE_ON_FAILURE) == 1, "continue: the later work runs");
    EXPECT(after_a_failed_wait(ACL_STOP_ON_FAILURE) == 0, "stop: the later work does not run");
    EXPECT(after_a_failed_wait(-1) == 0, "no mode set: the simulator stops");
    OK(aclrtSetOpWaitTimeout(0));
}

/* ---- memory attributes and host registration ------------------------------------------- */

static void memory_attributes(void)
{
    void *device = NULL, *pinned = NULL;
    OK(aclrtMallocAlign32(&device, 33, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(device, 64, 7, 64)); /* 33 bytes rounded up to 64 */
    EXPECT(aclrtMemset(device, 65, 7, 65) == ACL_ERROR_INVALID_PARAM, "no byte past the rounded size");
    EXPECT(aclrtMallocAlign32(&device, 0, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_ERROR_INVALID_PARAM, "size 0");
    EXPECT(aclrtMallocAlign32(NULL, 32, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_ERROR_INVALID_PARAM, "NULL devPtr");
    OK(aclrtMallocHost(&pinned, 100));
    aclrtPtrAttributes attributes;
    OK(aclrtPointerGetAttributes((char *)device + 10, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_DEVICE && attributes.location.id == 0 &&
           attributes.pageSize > 0, "device memory: type %d id %u", (int)attributes.location.type,
           attributes.location.id);
    OK(aclrtPointerGetAttributes(pinned, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_HOST, "pinned host memory: type %d",
           (int)attributes.location.type);
    static char plain[8192] __attribute__((aligned(4096)));
    OK(aclrtPointerGetAttributes(plain, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_UNREGISTERED, "other memory: type %d",
           (int)attributes.location.type);
    EXPECT(aclrtPointerGetAttributes(NULL, &attributes) == ACL_ERROR_INVALID_PARAM, "NULL ptr");
    EXPECT(aclrtPointerGetAttributes(plain, NULL) == ACL_ERROR_INVALID_PARAM, "NULL attributes");

    void *mapped = NULL;
    OK(aclrtHostRegister(plain, 4096, ACL_HOST_REGISTER_MAPPED, &mapped));
    EXPECT(mapped == plain, "the device reaches host memory at its host address here");
    OK(aclrtPointerGetAttributes(plain + 100, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_HOST, "registered memory: type %d",
           (int)attributes.location.type);
    EXPECT(aclrtHostRegister(plain, 8192, ACL_HOST_REGISTER_MAPPED, &mapped) == ACL_ERROR_INVALID_PARAM,
           "an overlapping registration");
    EXPECT(aclrtHostRegister(plain + 1, 100, ACL_HOST_REGISTER_MAPPED, &mapped) == ACL_ERROR_INVALID_PARAM,
           "an unaligned address");
    EXPECT(aclrtHostRegister(plain + 4096, 4096, (aclrtHostRegisterType)1, &mapped) == ACL_ERROR_INVALID_PARAM,
           "an unknown type");
    EXPECT(aclrtHostRegister(device, 4096, ACL_HOST_REGISTER_MAPPED, &mapped) == ACL_ERROR_INVALID_PARAM,
           "device memory");
    OK(aclrtHostRegister(plain + 4096, 4096, ACL_HOST_REGISTER_MAPPED, &mapped)); /* the next page */
    EXPECT(aclrtHostUnregister(plain + 100) == ACL_ERROR_INVALID_PARAM, "not a registration's start");
    OK(aclrtHostUnregister(plain));
    OK(aclrtHostUnregister(plain + 4096));
    EXPECT(aclrtHostUnregister(plain) == ACL_ERROR_INVALID_PARAM, "unregistered twice");
    OK(aclrtFree(device));
    OK(aclrtFreeHost(pinned));
}

int main(void)
{
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    host_functions(stream);
    stream_ids(stream);
    copies_2d(stream);
    data_type_sizes();
    peer_access();
    failure_modes(stream);
    memory_attributes();
    forced_resets();
    OK(aclrtDestroyStream(stream));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    if (failures) {
        printf("runtime_newer: %d of %d checks failed\nRESULT: FAIL\n", failures, checks);
        return 1;
    }
    printf("runtime_newer: %d checks OK\nRESULT: PASS\n", checks);
    return 0;
}
