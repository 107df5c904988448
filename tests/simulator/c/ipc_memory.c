/*
 * Device memory shared between processes (aclrtIpcMemGetExportKey, aclrtIpcMemSetImportPid,
 * aclrtIpcMemImportByKey, aclrtIpcMemClose, aclrtDeviceGetBareTgid), from C, with three processes:
 *
 *   - the exporter allocates device memory, fills it and exports a key that checks process ids;
 *   - importer 1 is refused until the exporter lists its id, then reads the exporter's data and
 *     writes into the memory, which the exporter sees; the exporter cannot free the memory while
 *     it is imported, and can once importer 1 closed its key;
 *   - importer 2 imports a key exported without the id check and exits without closing it: a dead
 *     importer does not keep the exporter from freeing.
 *
 * usage: ipc_memory     (prints "ipc_memory: N checks OK" and "RESULT: PASS", or the failures)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <acl/acl.h>

#define BYTES 4096

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

/* One message between two processes: a fixed-size record over a pipe. */
typedef struct {
    int32_t pid;
    char key[80];
} message_t;

static void put(int fd, const message_t *m)
{
    if (write(fd, m, sizeof *m) != (ssize_t)sizeof *m)
        _exit(3);
}

static message_t get(int fd)
{
    message_t m;
    if (read(fd, &m, sizeof m) != (ssize_t)sizeof m)
        _exit(4);
    return m;
}

static int finish(void)
{
    if (failures) {
        printf("ipc_memory (%s): %d of %d checks failed\n", who, failures, checks);
        return 1;
    }
    return 0;
}

static int importer_one(int in, int out)
{
    who = "importer 1";
    OK(aclInit(NULL));
    OK(aclrtSetDevice(1)); /* another device than the exporter's */
    message_t m = {0};
    OK(aclrtDeviceGetBareTgid(&m.pid));
    EXPECT(m.pid == (int32_t)getpid(), "the bare tgid is the process id");
    put(out, &m);
    message_t key = get(in);
    void *shared = NULL;
    EXPECT(aclrtIpcMemImportByKey(&shared, key.key, 0) == ACL_ERROR_INVALID_PARAM, "refused before the id is listed");
    put(out, &m);
    get(in); /* listed now */
    EXPECT(aclrtIpcMemImportByKey(&shared, key.key, 2) == ACL_ERROR_INVALID_PARAM, "unknown flags");
    OK(aclrtIpcMemImportByKey(&shared, key.key, ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS));
    void *again = NULL;
    EXPECT(aclrtIpcMemImportByKey(&again, key.key, 0) == ACL_ERROR_INVALID_PARAM, "imported twice");
    unsigned char seen[BYTES];
    OK(aclrtMemcpy(seen, BYTES, shared, BYTES, ACL_MEMCPY_DEVICE_TO_HOST));
    int same = 1;
    for (int i = 0; i < BYTES; i++)
        same &= seen[i] == (unsigned char)(i * 7);
    EXPECT(same, "the importer reads the exporter's data");
    EXPECT(aclrtMemcpy(seen, BYTES + 1, shared, BYTES + 1, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_ERROR_INVALID_PARAM,
           "no byte past the exported ones");
    OK(aclrtMemset(shared, BYTES, 0x5A, BYTES)); /* seen by the exporter */
    put(out, &m);
    get(in); /* the exporter tried to free */
    OK(aclrtIpcMemClose(key.key));
    EXPECT(aclrtIpcMemClose(key.key) == ACL_ERROR_INVALID_PARAM, "closed twice");
    put(out, &m);
    OK(aclrtResetDevice(1));
    OK(aclFinalize());
    return finish();
}

static int importer_two(int in, int out)
{
    who = "importer 2";
    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    message_t key = get(in);
    void *shared = NULL;
    OK(aclrtIpcMemImportByKey(&shared, key.key, 0)); /* no id check on this key */
    unsigned char first = 0;
    OK(aclrtMemcpy(&first, 1, shared, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(first == 0x33, "the second key's data: %d", first);
    message_t done = {0};
    put(out, &done);
    _exit(finish()); /* without closing the key, as a process that dies */
}

int main(void)
{
    int to1[2], from1[2], to2[2], from2[2];
    if (pipe(to1) || pipe(from1) || pipe(to2) || pipe(from2))
        return 2;
    pid_t one = fork();
    if (one == 0)
        return importer_one(to1[0], from1[1]);
    pid_t two = fork();
    if (two == 0)
        return importer_two(to2[0], from2[1]);

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    void *memory = NULL;
    OK(aclrtMalloc(&memory, BYTES, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char pattern[BYTES];
    for (int i = 0; i < BYTES; i++)
        pattern[i] = (unsigned char)(i * 7);
    OK(aclrtMemcpy(memory, BYTES, pattern, BYTES, ACL_MEMCPY_HOST_TO_DEVICE));

    char key[65];
    EXPECT(aclrtIpcMemGetExportKey(memory, BYTES, key, 64, 0) == ACL_ERROR_INVALID_PARAM, "len below 65");
    EXPECT(aclrtIpcMemGetExportKey(memory, BYTES, key, 65, 2) == ACL_ERROR_INVALID_PARAM, "unknown flags");
    EXPECT(aclrtIpcMemGetExportKey(memory, BYTES + 1, key, 65, 0) == ACL_ERROR_INVALID_PARAM, "past the end");
    EXPECT(aclrtIpcMemGetExportKey(pattern, 16, key, 65, 0) == ACL_ERROR_INVALID_PARAM, "host memory");
    OK(aclrtIpcMemGetExportKey(memory, BYTES, key, sizeof key, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT));
    void *own = NULL;
    EXPECT(aclrtIpcMemImportByKey(&own, key, 0) == ACL_ERROR_INVALID_PARAM, "a process imports no key of its own");
    EXPECT(aclrtIpcMemImportByKey(&own, "hcclpy-ipc-1-2-3", 0) == ACL_ERROR_INVALID_PARAM, "a key of nothing");
    EXPECT(aclrtIpcMemSetImportPid("no such key", &(int32_t){1}, 1) == ACL_ERROR_INVALID_PARAM, "unknown key");

    message_t m = get(from1[0]);
    message_t send = {0};
    snprintf(send.key, sizeof send.key, "%s", key);
    put(to1[1], &send);
    get(from1[0]); /* refused */
    EXPECT(aclrtIpcMemSetImportPid(key, &m.pid, 0) == ACL_ERROR_INVALID_PARAM, "num 0");
    OK(aclrtIpcMemSetImportPid(key, &m.pid, 1));
    put(to1[1], &send);
    get(from1[0]); /* written */
    unsigned char seen[BYTES];
    OK(aclrtMemcpy(seen, BYTES, memory, BYTES, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(seen[0] == 0x5A && seen[BYTES - 1] == 0x5A, "the exporter sees the importer's writes: %d", seen[0]);
    EXPECT(aclrtFree(memory) == ACL_ERROR_INVALID_PARAM, "freeing memory another process imports is refused");
    put(to1[1], &send);
    get(from1[0]); /* closed there */
    OK(aclrtFree(memory)); /* and the key closes with it */
    EXPECT(aclrtIpcMemClose(key) == ACL_ERROR_INVALID_PARAM, "the key went with the memory");

    /* Closed first, freed after. */
    OK(aclrtMalloc(&memory, BYTES, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtIpcMemGetExportKey(memory, 64, key, sizeof key, ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT));
    OK(aclrtIpcMemClose(key));
    OK(aclrtFree(memory));

    /* A key without the id check, imported by a process that dies holding it. */
    OK(aclrtMalloc(&memory, BYTES, ACL_MEM_MALLOC_HUGE_FIRST));
    OK(aclrtMemset(memory, BYTES, 0x33, BYTES));
    OK(aclrtIpcMemGetExportKey(memory, BYTES, key, sizeof key, ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION));
    snprintf(send.key, sizeof send.key, "%s", key);
    put(to2[1], &send);
    get(from2[0]);
    int status = 0;
    waitpid(two, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer 2 exited with %d", status);
    OK(aclrtFree(memory)); /* the dead importer holds nothing */

    waitpid(one, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer 1 exited with %d", status);
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    if (finish())
        return 1;
    printf("ipc_memory: %d checks OK\nRESULT: PASS\n", checks);
    return 0;
}
