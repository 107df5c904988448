/*
 * Events shared between processes (aclrtIpcGetEventHandle, aclrtIpcOpenEventHandle), from C: the
 * exporter records an ACL_EVENT_IPC event on a stream held back by a host function; the importer
 * opens the handle, makes a stream of its own wait for the event and finds it not complete until
 * the exporter lets its stream run; an opened event is waited for, never recorded; bad handles
 * are refused.
 *
 * usage: ipc_events     (prints "ipc_events: N checks OK" and "RESULT: PASS", or the failures)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <acl/acl.h>

static int checks, failures;
static const char *who = "exporter";

#define EXPECT(cond, ...)                                                                           \
    do {                                                                                            \
        checks++;                                                                                   \
        if (!(cond)) {                                                                              \
            failures++;                                                                             \
            fprintf(stderr, "%s: %s:%d: %s: ", who, __FILE__, __LINE__, #cond);                     \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fprintf(stderr, " (last error: %s)\n", aclGetRecentErrMsg());                           \
        }                                                                                           \
    } while (0)

#define OK(call) EXPECT((call) == ACL_SUCCESS, "%s failed", #call)

typedef struct {
    atomic_int release, entered;
} gate_t;

static void hold(void *args)
{
    gate_t *gate = args;
    atomic_store(&gate->entered, 1);
    while (!atomic_load(&gate->release))
        usleep(1000);
}

static void set_flag(void *args)
{
    atomic_store((atomic_int *)args, 1);
}

static void put(int fd, const void *data, size_t size)
{
    if (write(fd, data, size) != (ssize_t)size)
        _exit(3);
}

static void get(int fd, void *data, size_t size)
{
    if (read(fd, data, size) != (ssize_t)size)
        _exit(4);
}

static int importer(int in, int out)
{
    who = "importer";
    OK(aclInit(NULL));
    OK(aclrtSetDevice(1));
    aclrtIpcEventHandle handle;
    get(in, &handle, sizeof handle);
    aclrtEvent event = NULL;
    EXPECT(aclrtIpcOpenEventHandle(handle, NULL) == ACL_ERROR_INVALID_PARAM, "NULL event");
    OK(aclrtIpcOpenEventHandle(handle, &event));
    aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    OK(aclrtQueryEventStatus(event, &status));
    EXPECT(status == ACL_EVENT_RECORDED_STATUS_NOT_READY, "not complete while the exporter's stream is held");
    EXPECT(aclrtSynchronizeEventWithTimeout(event, 50) == ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, "a bounded wait ends");
    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    atomic_int after = 0;
    OK(aclrtStreamWaitEvent(stream, event));
    OK(aclrtLaunchHostFunc(stream, set_flag, &after));
    aclrtStreamStatus running = ACL_STREAM_STATUS_COMPLETE;
    OK(aclrtStreamQuery(stream, &running));
    EXPECT(running == ACL_STREAM_STATUS_NOT_READY && !atomic_load(&after), "the stream waits for the event");
    int ready = 1;
    put(out, &ready, sizeof ready);
    OK(aclrtSynchronizeStream(stream)); /* until the exporter's record ran */
    EXPECT(atomic_load(&after), "the work after the wait ran");
    OK(aclrtSynchronizeEvent(event));
    OK(aclrtQueryEventStatus(event, &status));
    EXPECT(status == ACL_EVENT_RECORDED_STATUS_COMPLETE, "complete once recorded there");
    EXPECT(aclrtRecordEvent(event, stream) == ACL_ERROR_INVALID_PARAM, "an opened event is not recorded here");
    float ms = 0;
    EXPECT(aclrtEventElapsedTime(&ms, event, event) == ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, "no time here");
    aclrtIpcEventHandle again;
    EXPECT(aclrtIpcGetEventHandle(event, &again) == ACL_ERROR_INVALID_PARAM, "only the maker shares it");
    OK(aclrtDestroyEvent(event));
    OK(aclrtDestroyStream(stream));
    OK(aclrtResetDevice(1));
    OK(aclFinalize());
    put(out, &ready, sizeof ready);
    if (failures)
        printf("ipc_events (importer): %d of %d checks failed\n", failures, checks);
    return failures != 0;
}

int main(void)
{
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        return 2;
    pid_t child = fork();
    if (child == 0)
        return importer(to_child[0], from_child[1]);

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    aclrtEvent plain = NULL, event = NULL;
    aclrtIpcEventHandle handle;
    OK(aclrtCreateEventExWithFlag(&plain, ACL_EVENT_SYNC));
    EXPECT(aclrtIpcGetEventHandle(plain, &handle) == ACL_ERROR_INVALID_PARAM, "an event without ACL_EVENT_IPC");
    OK(aclrtCreateEventExWithFlag(&event, ACL_EVENT_IPC | ACL_EVENT_SYNC));
    EXPECT(aclrtIpcGetEventHandle(event, NULL) == ACL_ERROR_INVALID_PARAM, "NULL handle");
    OK(aclrtIpcGetEventHandle(event, &handle));
    aclrtEvent own = NULL;
    EXPECT(aclrtIpcOpenEventHandle(handle, &own) == ACL_ERROR_INVALID_PARAM, "a process opens no handle of its own");
    aclrtIpcEventHandle junk;
    memset(&junk, 'x', sizeof junk);
    EXPECT(aclrtIpcOpenEventHandle(junk, &own) == ACL_ERROR_INVALID_PARAM, "a handle of nothing");

    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    gate_t *gate = NULL;
    OK(aclrtMallocHost((void **)&gate, sizeof *gate));
    memset(gate, 0, sizeof *gate);
    OK(aclrtLaunchHostFunc(stream, hold, gate));
    while (!atomic_load(&gate->entered)) /* held on the stream's worker, not on this thread */
        usleep(1000);
    OK(aclrtRecordEvent(event, stream));
    put(to_child[1], &handle, sizeof handle);
    int ready = 0;
    get(from_child[0], &ready, sizeof ready); /* the importer waits */
    atomic_store(&gate->release, 1);
    OK(aclrtSynchronizeStream(stream));
    get(from_child[0], &ready, sizeof ready);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importer exited with %d", status);
    OK(aclrtDestroyEvent(event));
    OK(aclrtDestroyEvent(plain));
    OK(aclrtDestroyStream(stream));
    OK(aclrtFreeHost(gate));
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    if (failures) {
        printf("ipc_events: %d of %d checks failed\nRESULT: FAIL\n", failures, checks);
        return 1;
    }
    printf("ipc_events: %d checks OK\nRESULT: PASS\n", checks);
    return 0;
}
