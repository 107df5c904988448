/*
 * Stream capture's rules, from C (one process, one device): what is recorded and replayed (async
 * copies and sets, host functions, event records and waits, work forked to another stream through
 * events and joined back), the capture status, the calls refused during a capture in each mode and
 * how they invalidate it, streams that never rejoin, task groups updated in place, an event
 * recorded in a model that another stream waits for while the model still runs, and the codes of
 * bad arguments and wrong orders.
 *
 * usage: capture_rules   (prints "capture_rules: N checks OK" and "RESULT: PASS", or the failures)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
#define CODE(call, code) EXPECT((call) == (code), "%s: expected %s", #call, #code)

#define N 64

static void count_call(void *args)
{
    atomic_fetch_add((atomic_int *)args, 1);
}

static unsigned char *device_bytes(void *device)
{
    static unsigned char host[N];
    OK(aclrtMemcpy(host, N, device, N, ACL_MEMCPY_DEVICE_TO_HOST));
    return host;
}

/* Copies, sets and host functions are recorded, not run; each execution runs them again. */
static void record_and_replay(aclrtStream stream, unsigned char *pinned, void *device)
{
    atomic_int calls = 0;
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
    aclmdlRI model = NULL, seen = NULL;
    OK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    EXPECT(status == ACL_MODEL_RI_CAPTURE_STATUS_NONE, "not capturing yet");
    OK(aclrtMemset(device, N, 0, N));
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    CODE(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_RT_STREAM_CAPTURED);
    OK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    EXPECT(status == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE && seen != NULL, "capturing");
    OK(aclrtMemsetAsync(device, N, 7, N / 2, stream));
    OK(aclrtMemcpyAsync(pinned, N, device, N, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    OK(aclrtLaunchHostFunc(stream, count_call, &calls));
    OK(aclmdlRICaptureEnd(stream, &model));
    EXPECT(model == seen, "the model GetInfo named");
    EXPECT(device_bytes(device)[0] == 0 && atomic_load(&calls) == 0, "nothing ran during the capture");
    for (int k = 1; k <= 3; k++) {
        memset(pinned, 0xFF, N);
        OK(aclmdlRIExecuteAsync(model, stream));
        OK(aclrtSynchronizeStream(stream));
        EXPECT(pinned[0] == 7 && pinned[N - 1] == 0 && atomic_load(&calls) == k, "execution %d ran it all", k);
    }
    OK(aclmdlRIDestroy(model));
    CODE(aclmdlRIDestroy(model), ACL_ERROR_INVALID_PARAM);
    CODE(aclmdlRIExecuteAsync(model, stream), ACL_ERROR_INVALID_PARAM);
}

/* Work forked to a second stream through an event joins the capture, and must be joined back. */
static void fork_and_join(aclrtStream stream, aclrtStream side, unsigned char *pinned, void *device)
{
    aclrtEvent fork = NULL, join = NULL;
    OK(aclrtCreateEventWithFlag(&fork, ACL_EVENT_SYNC));
    OK(aclrtCreateEventWithFlag(&join, ACL_EVENT_SYNC));
    aclmdlRI model = NULL;
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclrtMemsetAsync(device, N, 1, N, stream));
    OK(aclrtRecordEvent(fork, stream));
    OK(aclrtStreamWaitEvent(side, fork)); /* side joins the capture */
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    aclmdlRI seen = NULL;
    OK(aclmdlRICaptureGetInfo(side, &status, &seen));
    EXPECT(status == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, "the side stream captures too");
    CODE(aclrtSynchronizeEvent(fork), ACL_ERROR_RT_EVENT_CAPTURED);
    OK(aclrtMemsetAsync((char *)device + N / 2, N / 2, 2, N / 2, side));
    CODE(aclmdlRICaptureEnd(side, &model), ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED);
    OK(aclrtRecordEvent(join, side));
    OK(aclrtStreamWaitEvent(stream, join)); /* joined back */
    OK(aclrtMemcpyAsync(pinned, N, device, N, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    /* (the invalid EventSynchronize above invalidated this capture: see below) */
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
    EXPECT(model == NULL, "no model from an invalidated capture");

    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclrtMemsetAsync(device, N, 1, N, stream));
    OK(aclrtRecordEvent(fork, stream));
    OK(aclrtStreamWaitEvent(side, fork));
    OK(aclrtMemsetAsync((char *)device + N / 2, N / 2, 2, N / 2, side));
    OK(aclrtRecordEvent(join, side));
    OK(aclrtStreamWaitEvent(stream, join));
    OK(aclrtMemcpyAsync(pinned, N, device, N, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    OK(aclmdlRICaptureEnd(stream, &model));
    OK(aclmdlRICaptureGetInfo(side, &status, &seen));
    EXPECT(status == ACL_MODEL_RI_CAPTURE_STATUS_NONE, "the side stream stopped capturing with the origin");
    memset(pinned, 0, N);
    OK(aclmdlRIExecuteAsync(model, stream));
    OK(aclrtSynchronizeStream(stream));
    EXPECT(pinned[0] == 1 && pinned[N - 1] == 2, "both branches ran, in order: %d %d", pinned[0], pinned[N - 1]);
    OK(aclmdlRIDestroy(model));

    /* A branch that never rejoins. */
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclrtRecordEvent(fork, stream));
    OK(aclrtStreamWaitEvent(side, fork));
    OK(aclrtMemsetAsync(device, N, 3, N, side));
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_UNJOINED);
    OK(aclrtSynchronizeStream(side)); /* no longer capturing */
    OK(aclrtDestroyEvent(fork));
    OK(aclrtDestroyEvent(join));
}

static void *unsafe_copy(void *args)
{
    unsigned char *host = args;
    return (void *)(intptr_t)aclrtMemcpy(host, 1, host + 1, 1, ACL_MEMCPY_HOST_TO_HOST);
}

static int copy_on_other_thread(unsigned char *host)
{
    pthread_t thread;
    void *result = NULL;
    pthread_create(&thread, NULL, unsafe_copy, host);
    pthread_join(thread, &result);
    return (int)(intptr_t)result;
}

/* Unsafe calls in each mode, the thread's own mode, and calls refused on a capturing stream. */
static void forbidden_calls(aclrtStream stream, unsigned char *pinned)
{
    aclmdlRI model = NULL;
    unsigned char host[2] = {0, 0};
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    CODE(aclrtMemcpy(host, 1, host + 1, 1, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
    aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    aclmdlRI seen = NULL;
    OK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    EXPECT(status == ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED, "invalidated");
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    CODE(copy_on_other_thread(host), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT); /* global: every thread */
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL));
    OK(copy_on_other_thread(host)); /* thread local: other threads may */
    aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
    OK(aclmdlRICaptureThreadExchangeMode(&mode));
    EXPECT(mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL, "a thread starts in global mode");
    OK(aclrtMemcpy(host, 1, host + 1, 1, ACL_MEMCPY_HOST_TO_HOST)); /* this thread relaxed itself */
    OK(aclmdlRICaptureThreadExchangeMode(&mode));
    EXPECT(mode == ACL_MODEL_RI_CAPTURE_MODE_RELAXED, "the previous mode comes back");
    OK(aclrtMemcpyAsync(pinned, 1, pinned + 1, 1, ACL_MEMCPY_HOST_TO_HOST, stream)); /* pinned: safe */
    CODE(aclrtMemcpyAsync(host, 1, host + 1, 1, ACL_MEMCPY_HOST_TO_HOST, stream), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    OK(aclrtMemcpy(host, 1, host + 1, 1, ACL_MEMCPY_HOST_TO_HOST)); /* relaxed: anyone may */
    CODE(aclrtSynchronizeStream(stream), ACL_ERROR_RT_STREAM_CAPTURED);
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    aclrtStreamStatus done = ACL_STREAM_STATUS_COMPLETE;
    CODE(aclrtStreamQuery(stream, &done), ACL_ERROR_RT_STREAM_CAPTURED);
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);

    CODE(aclmdlRICaptureBegin(NULL, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_INVALID_PARAM);
    CODE(aclmdlRICaptureBegin(stream, (aclmdlRICaptureMode)3), ACL_ERROR_INVALID_PARAM);
    CODE(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
    CODE(aclmdlRICaptureEnd(stream, NULL), ACL_ERROR_INVALID_PARAM);
    CODE(aclmdlRICaptureGetInfo(stream, NULL, &seen), ACL_ERROR_INVALID_PARAM);
    CODE(aclmdlRICaptureThreadExchangeMode(NULL), ACL_ERROR_INVALID_PARAM);

    /* A model is destroyed after its capture ended, not during it. */
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    CODE(aclmdlRIDestroy(seen), ACL_ERROR_RT_MODEL_CAPTURED);
    CODE(aclmdlRIExecuteAsync(seen, stream), ACL_ERROR_RT_MODEL_CAPTURED);
    OK(aclmdlRICaptureEnd(stream, &model));
    OK(aclmdlRIDestroy(model));
}

/* A task group captured once and updated in place: executions run the update. */
static void task_groups(aclrtStream stream, aclrtStream updater, unsigned char *pinned, void *device)
{
    aclmdlRI model = NULL;
    aclrtTaskGrp group = NULL;
    CODE(aclmdlRICaptureTaskGrpBegin(stream), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclmdlRICaptureTaskGrpBegin(stream));
    CODE(aclmdlRICaptureTaskGrpBegin(stream), ACL_ERROR_STREAM_TASK_GROUP_STATUS);
    OK(aclrtMemsetAsync(device, N, 4, N, stream));
    OK(aclmdlRICaptureTaskGrpEnd(stream, &group));
    OK(aclrtMemcpyAsync(pinned, N, device, N, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    CODE(aclmdlRICaptureTaskUpdateBegin(updater, group), ACL_ERROR_RT_MODEL_CAPTURED);
    OK(aclmdlRICaptureEnd(stream, &model));
    OK(aclmdlRIExecuteAsync(model, stream));
    OK(aclrtSynchronizeStream(stream));
    EXPECT(pinned[0] == 4, "the group as captured: %d", pinned[0]);

    OK(aclmdlRICaptureTaskUpdateBegin(updater, group));
    CODE(aclmdlRICaptureTaskUpdateBegin(updater, group), ACL_ERROR_STREAM_TASK_GROUP_STATUS);
    OK(aclrtMemsetAsync(device, N, 9, N, updater)); /* replaces the group's set, not run */
    OK(aclmdlRICaptureTaskUpdateEnd(updater));
    OK(aclrtSynchronizeStream(updater));
    EXPECT(device_bytes(device)[0] == 4, "the update did not run");
    OK(aclmdlRIExecuteAsync(model, stream));
    OK(aclrtSynchronizeStream(stream));
    EXPECT(pinned[0] == 9, "the group as updated: %d", pinned[0]);

    OK(aclmdlRICaptureTaskUpdateBegin(updater, group));
    atomic_int calls = 0;
    OK(aclrtLaunchHostFunc(updater, count_call, &calls)); /* another kind of task */
    CODE(aclmdlRICaptureTaskUpdateEnd(updater), ACL_ERROR_STREAM_TASK_GROUP_STATUS);
    CODE(aclmdlRICaptureTaskUpdateEnd(updater), ACL_ERROR_STREAM_TASK_GROUP_STATUS);
    OK(aclmdlRIExecuteAsync(model, stream));
    OK(aclrtSynchronizeStream(stream));
    EXPECT(pinned[0] == 9 && atomic_load(&calls) == 0, "a refused update changes nothing");
    OK(aclmdlRIDestroy(model));
}

static atomic_int g_released;

static void release(void *args)
{
    (void)args;
    atomic_store(&g_released, 1);
}

/* Waits (5 s at most) for release(); counts in *args whether it came. */
static void wait_for_release(void *args)
{
    for (int i = 0; i < 5000 && !atomic_load(&g_released); i++) {
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    atomic_fetch_add((atomic_int *)args, atomic_load(&g_released));
}

/* An event recorded in a model completes when the execution reaches it, not when the execution
 * ends: another stream waits for it and releases the model's next task (with the whole execution
 * waited for first, the model would wait for the other stream, and it for the model). */
static void event_inside_an_execution(aclrtStream stream, aclrtStream side)
{
    aclrtEvent reached = NULL;
    OK(aclrtCreateEventWithFlag(&reached, ACL_EVENT_SYNC));
    atomic_int released = 0;
    aclmdlRI model = NULL;
    OK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    OK(aclrtRecordEvent(reached, stream));
    OK(aclrtLaunchHostFunc(stream, wait_for_release, &released));
    OK(aclmdlRICaptureEnd(stream, &model));
    for (int k = 1; k <= 2; k++) {
        atomic_store(&g_released, 0);
        OK(aclmdlRIExecuteAsync(model, stream));
        OK(aclrtStreamWaitEvent(side, reached));
        OK(aclrtLaunchHostFunc(side, release, NULL));
        OK(aclrtSynchronizeStream(side)); /* (runs the execution up to the record, if nobody does) */
        OK(aclrtSynchronizeStream(stream));
        EXPECT(atomic_load(&released) == k, "execution %d: its host function saw the other stream's", k);
    }
    OK(aclmdlRIDestroy(model));
    OK(aclrtDestroyEvent(reached));
}

int main(void)
{
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtStream stream = NULL, side = NULL;
    OK(aclrtCreateStream(&stream));
    OK(aclrtCreateStream(&side));
    unsigned char *pinned = NULL;
    void *device = NULL;
    OK(aclrtMallocHost((void **)&pinned, N));
    OK(aclrtMalloc(&device, N, ACL_MEM_MALLOC_HUGE_FIRST));
    record_and_replay(stream, pinned, device);
    fork_and_join(stream, side, pinned, device);
    forbidden_calls(stream, pinned);
    task_groups(stream, side, pinned, device);
    event_inside_an_execution(stream, side);
    OK(aclrtFree(device));
    OK(aclrtFreeHost(pinned));
    OK(aclrtDestroyStream(side));
    OK(aclrtDestroyStream(stream));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    if (failures) {
        printf("capture_rules: %d of %d checks failed\nRESULT: FAIL\n", failures, checks);
        return 1;
    }
    printf("capture_rules: %d checks OK\nRESULT: PASS\n", checks);
    return 0;
}
