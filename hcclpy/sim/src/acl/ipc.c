/*
 * Device memory shared between processes: aclrtIpcMemGetExportKey, aclrtIpcMemSetImportPid,
 * aclrtIpcMemImportByKey, aclrtIpcMemClose, and aclrtDeviceGetBareTgid for the process ids.
 *
 * A simulated device's memory is a memfd arena that other processes can map (memory.c), so an
 * import maps the exporter's arena and points at the exported bytes: both processes see the same
 * memory.  Each export has a record, one page of its own memfd, which both sides map:
 *
 *   - the exporter fills it (where the memory is, the allowed process ids) and marks it closed;
 *   - an importer checks it (not closed, its own id allowed) and takes a slot in it while it
 *     holds the memory, with its start time, so that a dead importer's slot does not count.
 *
 * The key names the record: "hcclpy-ipc-<exporter pid>-<record fd>-<record uid>", opened by
 * importers through /proc/<pid>/fd/<fd>, so nothing is left in /dev/shm even after SIGKILL.
 *
 * Lifetimes.  The exporter may close its key, or free the memory, in either order: freeing
 * memory whose key is still imported by a live process is refused (ACL_ERROR_INVALID_PARAM,
 * naming the process), so no process can keep reading memory that was given to another
 * allocation; otherwise freeing closes the key too.  An importer's close lets go of its mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl/runtime.h"

#define IPC_KEY_LEN 65 /* the key buffer CANN asks for: 64 characters and the terminating NUL */
#define IPC_MAX_PIDS 256
#define IPC_MAX_IMPORTERS 256
#define IPC_MAGIC 0x48434950u /* "HCIP" */

typedef struct {
    uint32_t magic;
    uint64_t uid;
    _Atomic uint32_t closed;    /* the exporter closed the key (or freed the memory): no new imports */
    sim_arena_loc_t arena;      /* the exporter's device memory */
    uint64_t offset, size;      /* the exported bytes in it */
    int32_t device;
    uint32_t check_pids;        /* only the processes in pids may import */
    _Atomic uint32_t npids;
    _Atomic int32_t pids[IPC_MAX_PIDS];
    struct {
        _Atomic int32_t pid;    /* 0: free */
        _Atomic uint64_t start; /* the importer's start time, to tell a dead one */
    } importers[IPC_MAX_IMPORTERS];
} ipc_record_t;

typedef struct {
    char key[IPC_KEY_LEN];
    ipc_record_t *record;
    int fd;           /* exports: the record's memfd */
    char *ptr;        /* the shared bytes, in this process */
    uint64_t size;
    int device;
    int slot;         /* imports: the importer slot taken */
    bool imported;
    bool closed;      /* exports: closed while live importers remained */
} ipc_entry_t;

static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static ipc_entry_t *g_entries;
static size_t g_entry_count, g_entry_capacity;

static ipc_entry_t *find(const char *key, bool imported)
{
    for (size_t i = 0; i < g_entry_count; i++)
        if (g_entries[i].imported == imported && strcmp(g_entries[i].key, key) == 0)
            return &g_entries[i];
    return NULL;
}

static ipc_entry_t *add(void)
{
    if (g_entry_count == g_entry_capacity) {
        size_t capacity = g_entry_capacity ? g_entry_capacity * 2 : 16;
        ipc_entry_t *grown = realloc(g_entries, capacity * sizeof *grown);
        if (grown == NULL)
            return NULL;
        g_entries = grown;
        g_entry_capacity = capacity;
    }
    ipc_entry_t *entry = &g_entries[g_entry_count++];
    memset(entry, 0, sizeof *entry);
    entry->fd = -1;
    entry->slot = -1;
    return entry;
}

static void drop(ipc_entry_t *entry)
{
    munmap(entry->record, sizeof(ipc_record_t));
    if (entry->fd >= 0)
        close(entry->fd);
    *entry = g_entries[--g_entry_count];
}

/* A live process importing the record's memory, or 0. */
static pid_t live_importer(ipc_record_t *record)
{
    for (int i = 0; i < IPC_MAX_IMPORTERS; i++) {
        pid_t pid = atomic_load(&record->importers[i].pid);
        if (pid != 0 && sim_process_alive(pid, atomic_load(&record->importers[i].start)))
            return pid;
    }
    return 0;
}

static bool valid_key_argument(const char *key, const char *api, int *err)
{
    if (key == NULL) {
        *err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: key is NULL", api);
        return false;
    }
    if (memchr(key, '\0', IPC_KEY_LEN) == NULL) {
        *err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: key is not a key from aclrtIpcMemGetExportKey (no NUL in "
                         "its first %d bytes)", api, IPC_KEY_LEN);
        return false;
    }
    return true;
}

SIM_EXPORT aclError aclrtDeviceGetBareTgid(int32_t *pid)
{
    if (pid == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDeviceGetBareTgid: pid is NULL");
    *pid = (int32_t)getpid();
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags)
{
    static const char *api = "aclrtIpcMemGetExportKey";
    if (devPtr == NULL || key == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, devPtr == NULL ? "devPtr" : "key");
    if (len < IPC_KEY_LEN)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: len %zu is too short for a key (%d bytes)", api, len,
                         IPC_KEY_LEN);
    if (flags > ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 " are neither "
                         "ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT (0) nor ..._DISABLE_PID_VALIDATION (1)", api, flags);
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: size must be greater than 0", api);
    uint64_t room = 0;
    if (sim_ipc_imported(devPtr, NULL) >= 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is memory imported from another process: only the "
                         "process that allocated it exports it", api, devPtr);
    int device = sim_pointer_device(devPtr, &room);
    if (device < 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is not inside device memory from aclrtMalloc of this "
                         "process", api, devPtr);
    if (size > room)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %zu bytes at %p run %llu bytes past the end of its allocation",
                         api, size, devPtr, (unsigned long long)(size - room));
    sim_arena_loc_t arena;
    char *base = NULL;
    int err = sim_device_arena(device, &arena, &base);
    if (err != ACL_SUCCESS)
        return err;
    int fd = memfd_create("hcclpy-sim-ipc", MFD_CLOEXEC);
    if (fd < 0)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: memfd_create failed: %s", api, strerror(errno));
    ipc_record_t *record = MAP_FAILED;
    if (ftruncate(fd, sizeof *record) == 0)
        record = mmap(NULL, sizeof *record, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (record == MAP_FAILED) {
        close(fd);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot make the key's record: %s", api,
                         strerror(errno));
    }
    record->magic = IPC_MAGIC;
    record->uid = sim_random64();
    record->arena = arena;
    record->offset = (uint64_t)((char *)devPtr - base);
    record->size = size;
    record->device = device;
    record->check_pids = flags == ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT;
    pthread_mutex_lock(&g_ipc_lock);
    ipc_entry_t *entry = add();
    if (entry == NULL) {
        pthread_mutex_unlock(&g_ipc_lock);
        munmap(record, sizeof *record);
        close(fd);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    snprintf(entry->key, sizeof entry->key, "hcclpy-ipc-%d-%d-%016" PRIx64, (int)getpid(), fd, record->uid);
    entry->record = record;
    entry->fd = fd;
    entry->ptr = devPtr;
    entry->size = size;
    entry->device = device;
    memcpy(key, entry->key, sizeof entry->key);
    pthread_mutex_unlock(&g_ipc_lock);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num)
{
    static const char *api = "aclrtIpcMemSetImportPid";
    int err = ACL_SUCCESS;
    if (!valid_key_argument(key, api, &err))
        return err;
    if (pid == NULL || num == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s", api, pid == NULL ? "pid is NULL" : "num must be at least 1");
    for (size_t i = 0; i < num; i++)
        if (pid[i] <= 0)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: pid[%zu] = %d is not a process id", api, i, (int)pid[i]);
    pthread_mutex_lock(&g_ipc_lock);
    ipc_entry_t *entry = find(key, false);
    if (entry == NULL || entry->closed) {
        pthread_mutex_unlock(&g_ipc_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: \"%s\" is not an open key this process exported", api, key);
    }
    ipc_record_t *record = entry->record;
    uint32_t have = atomic_load(&record->npids);
    if (num > IPC_MAX_PIDS - have) {
        pthread_mutex_unlock(&g_ipc_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %zu more process ids than the %d a key holds (%u set)", api, num,
                         IPC_MAX_PIDS, (unsigned)have);
    }
    for (size_t i = 0; i < num; i++)
        atomic_store(&record->pids[have + i], pid[i]);
    atomic_store(&record->npids, have + (uint32_t)num); /* after the ids: an importer reads up to npids */
    pthread_mutex_unlock(&g_ipc_lock);
    return ACL_SUCCESS;
}

static bool pid_allowed(ipc_record_t *record, pid_t self)
{
    if (!record->check_pids)
        return true;
    uint32_t count = atomic_load(&record->npids);
    for (uint32_t i = 0; i < count && i < IPC_MAX_PIDS; i++)
        if (atomic_load(&record->pids[i]) == self)
            return true;
    return false;
}

SIM_EXPORT aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags)
{
    static const char *api = "aclrtIpcMemImportByKey";
    int err = ACL_SUCCESS;
    if (devPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", api);
    if (!valid_key_argument(key, api, &err))
        return err;
    if (flags > ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 " are neither "
                         "ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT (0) nor ..._ENABLE_PEER_ACCESS (1)", api, flags);
    int pid = 0, fd = -1;
    uint64_t uid = 0;
    int used = 0;
    if (sscanf(key, "hcclpy-ipc-%d-%d-%16" SCNx64 "%n", &pid, &fd, &uid, &used) != 3 || key[used] != '\0')
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: \"%s\" is not a key from aclrtIpcMemGetExportKey", api, key);
    pid_t self = getpid();
    if (pid == (int)self)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: key \"%s\" was exported by this process: use its memory "
                         "directly", api, key);
    pthread_mutex_lock(&g_ipc_lock);
    if (find(key, true) != NULL) {
        pthread_mutex_unlock(&g_ipc_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: key \"%s\" is imported in this process already (close it "
                         "first)", api, key);
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int record_fd = open(path, O_RDWR | O_CLOEXEC);
    ipc_record_t *record = MAP_FAILED;
    if (record_fd >= 0) {
        record = mmap(NULL, sizeof *record, PROT_READ | PROT_WRITE, MAP_SHARED, record_fd, 0);
        close(record_fd);
    }
    if (record == MAP_FAILED || record->magic != IPC_MAGIC || record->uid != uid) {
        if (record != MAP_FAILED)
            munmap(record, sizeof *record);
        pthread_mutex_unlock(&g_ipc_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: key \"%s\" names no exported memory: its process has ended, "
                         "closed the key or freed the memory", api, key);
    }
    const char *refused = atomic_load(&record->closed) ? "was closed by its exporter (or the memory freed)"
                          : !pid_allowed(record, self) ? "does not list this process (aclrtIpcMemSetImportPid)"
                                                       : NULL;
    int slot = -1;
    for (int i = 0; refused == NULL && i < IPC_MAX_IMPORTERS && slot < 0; i++) {
        int32_t expected = 0;
        if (atomic_compare_exchange_strong(&record->importers[i].pid, &expected, (int32_t)self)) {
            atomic_store(&record->importers[i].start, sim_process_start_time(self));
            slot = i;
        }
    }
    if (refused == NULL && slot < 0)
        refused = "is imported by as many processes as a key holds";
    char *base = refused == NULL ? sim_arena_map(&record->arena) : NULL;
    ipc_entry_t *entry = base != NULL ? add() : NULL;
    if (entry == NULL) {
        if (slot >= 0)
            atomic_store(&record->importers[slot].pid, 0);
        if (base != NULL)
            sim_arena_unmap(&record->arena);
        munmap(record, sizeof *record);
        pthread_mutex_unlock(&g_ipc_lock);
        if (refused != NULL)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: key \"%s\" %s", api, key, refused);
        return base == NULL ? ACL_ERROR_RT_INTERNAL_ERROR /* recorded by sim_arena_map */
                            : sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    snprintf(entry->key, sizeof entry->key, "%s", key);
    entry->record = record;
    entry->ptr = base + record->offset;
    entry->size = record->size;
    entry->device = record->device;
    entry->slot = slot;
    entry->imported = true;
    *devPtr = entry->ptr;
    pthread_mutex_unlock(&g_ipc_lock);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtIpcMemClose(const char *key)
{
    static const char *api = "aclrtIpcMemClose";
    int err = ACL_SUCCESS;
    if (!valid_key_argument(key, api, &err))
        return err;
    pthread_mutex_lock(&g_ipc_lock);
    ipc_entry_t *entry = find(key, true);
    if (entry != NULL) {
        atomic_store(&entry->record->importers[entry->slot].pid, 0);
        sim_arena_unmap(&entry->record->arena);
        drop(entry);
    } else if ((entry = find(key, false)) != NULL && !entry->closed) {
        atomic_store(&entry->record->closed, 1);
        if (live_importer(entry->record) == 0)
            drop(entry);
        else
            entry->closed = true; /* kept: freeing the memory asks whether it is still imported */
    } else {
        err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: \"%s\" is not a key this process exported or imported (or it "
                        "was closed)", api, key);
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return err;
}

int sim_ipc_before_free(const void *ptr, uint64_t size)
{
    const char *start = ptr;
    pthread_mutex_lock(&g_ipc_lock);
    for (size_t i = 0; i < g_entry_count; i++) {
        ipc_entry_t *entry = &g_entries[i];
        pid_t importer = 0;
        if (!entry->imported && entry->ptr >= start && entry->ptr < start + size &&
            (importer = live_importer(entry->record)) != 0) {
            pthread_mutex_unlock(&g_ipc_lock);
            return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtFree: %p is still imported by process %d (key \"%s\"): "
                             "close the key there first (aclrtIpcMemClose)", ptr, (int)importer, entry->key);
        }
    }
    /* Nobody holds it: its keys close with it. */
    for (size_t i = 0; i < g_entry_count;) {
        ipc_entry_t *entry = &g_entries[i];
        if (!entry->imported && entry->ptr >= start && entry->ptr < start + size) {
            atomic_store(&entry->record->closed, 1);
            drop(entry);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return ACL_SUCCESS;
}

int sim_ipc_imported(const void *ptr, uint64_t *room)
{
    const char *p = ptr;
    int device = -1;
    pthread_mutex_lock(&g_ipc_lock);
    for (size_t i = 0; i < g_entry_count && device < 0; i++) {
        ipc_entry_t *entry = &g_entries[i];
        if (entry->imported && p >= entry->ptr && p < entry->ptr + entry->size) {
            device = entry->device;
            if (room != NULL)
                *room = entry->size - (uint64_t)(p - entry->ptr);
        }
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return device;
}

void sim_ipc_after_fork(void)
{
    /* The child neither exported nor imported anything: its parent did. */
    pthread_mutex_init(&g_ipc_lock, NULL);
    for (size_t i = 0; i < g_entry_count; i++) {
        munmap(g_entries[i].record, sizeof(ipc_record_t));
        if (g_entries[i].fd >= 0)
            close(g_entries[i].fd);
    }
    free(g_entries);
    g_entries = NULL;
    g_entry_count = g_entry_capacity = 0;
}
