/* Device memory.
 *
 * Each (process, device) owns an arena: a memfd mapped MAP_SHARED.  Other
 * processes map it through /proc/<pid>/fd/<fd>, so collectives read and write
 * peers' buffers directly, and the memory disappears with the last mapping:
 * nothing is left in /dev/shm, even after SIGKILL.  aclrtMalloc sub-allocates
 * from the arena and records every allocation, which lets the simulator refuse
 * pointers that are not device memory and ranges that run past an allocation.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl/runtime.h"

#define ARENA_MAGIC 0x414E455241535048ULL /* "HPSARENA" */
#define ARENA_HEADER 4096ULL
#define PUNCH_THRESHOLD (1ULL << 20)

typedef struct {
    uint64_t magic, uid, size;
    int32_t pid, device;
} arena_header_t;

typedef struct {
    uint64_t offset, size, requested;
} block_t;

typedef struct {
    block_t *items;
    size_t count, capacity;
} block_list_t;

struct sim_arena {
    int device;
    int fd;
    uint64_t uid, size;
    char *base;
    pthread_mutex_t lock;
    block_list_t used;  /* live allocations, sorted by offset */
    block_list_t free;  /* free extents, sorted by offset, coalesced */
    uint64_t used_bytes;
};

static pthread_mutex_t g_arena_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_arena_t *g_arenas[SIM_MAX_DEVICES];
/* One past the highest device with an arena: a host pointer, looked up on
 * every copy, is compared with the arenas there are instead of 256 slots. */
static _Atomic int g_arena_limit;

/* ------------------------------------------------------------ block lists */

static bool list_insert(block_list_t *list, size_t at, block_t block)
{
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 64;
        block_t *items = realloc(list->items, capacity * sizeof *items);
        if (items == NULL)
            return false;
        list->items = items;
        list->capacity = capacity;
    }
    memmove(&list->items[at + 1], &list->items[at], (list->count - at) * sizeof *list->items);
    list->items[at] = block;
    list->count++;
    return true;
}

static void list_remove(block_list_t *list, size_t at)
{
    memmove(&list->items[at], &list->items[at + 1], (list->count - at - 1) * sizeof *list->items);
    list->count--;
}

/* Index of the last block whose offset is <= offset, or -1. */
static ptrdiff_t list_find(const block_list_t *list, uint64_t offset)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)list->count - 1, found = -1;
    while (lo <= hi) {
        ptrdiff_t mid = (lo + hi) / 2;
        if (list->items[mid].offset <= offset) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* ----------------------------------------------------------------- arenas */

static int arena_create(int device, sim_arena_t **out)
{
    const sim_config_t *config = sim_config();
    sim_arena_t *arena = calloc(1, sizeof *arena);
    if (arena == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating device %d", device);
    char name[64];
    snprintf(name, sizeof name, "hcclpy-sim-device%d", device);
    arena->fd = memfd_create(name, MFD_CLOEXEC);
    if (arena->fd < 0) {
        free(arena);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "memfd_create for device %d failed: %s", device,
                         strerror(errno));
    }
    arena->size = config->device_memory + ARENA_HEADER;
    if (ftruncate(arena->fd, (off_t)arena->size) != 0) {
        int saved = errno;
        close(arena->fd);
        free(arena);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "sizing device %d memory failed: %s", device,
                         strerror(saved));
    }
    arena->base = mmap(NULL, arena->size, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd, 0);
    if (arena->base == MAP_FAILED) {
        int saved = errno;
        close(arena->fd);
        free(arena);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "mapping device %d memory failed: %s", device,
                         strerror(saved));
    }
    arena->device = device;
    arena->uid = sim_random64();
    pthread_mutex_init(&arena->lock, NULL);
    arena_header_t *header = (arena_header_t *)arena->base;
    header->magic = ARENA_MAGIC;
    header->uid = arena->uid;
    header->size = arena->size;
    header->pid = getpid();
    header->device = device;
    block_t all = {ARENA_HEADER, arena->size - ARENA_HEADER, 0};
    if (!list_insert(&arena->free, 0, all)) {
        munmap(arena->base, arena->size);
        close(arena->fd);
        free(arena);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating device %d", device);
    }
    *out = arena;
    return ACL_SUCCESS;
}

sim_arena_t *sim_arena_get(int device, int *err)
{
    pthread_mutex_lock(&g_arena_lock);
    sim_arena_t *arena = g_arenas[device];
    if (arena == NULL) {
        *err = arena_create(device, &arena);
        if (*err == ACL_SUCCESS) {
            __atomic_store_n(&g_arenas[device], arena, __ATOMIC_RELEASE);
            if (device >= atomic_load(&g_arena_limit))
                atomic_store(&g_arena_limit, device + 1);
        }
    }
    pthread_mutex_unlock(&g_arena_lock);
    return arena;
}

int sim_device_arena(int device, sim_arena_loc_t *loc, char **base)
{
    int err = sim_device_check(device);
    if (err != ACL_SUCCESS)
        return err;
    sim_arena_t *arena = sim_arena_get(device, &err);
    if (arena == NULL)
        return err;
    loc->pid = getpid();
    loc->fd = arena->fd;
    loc->uid = arena->uid;
    loc->size = arena->size;
    if (base != NULL)
        *base = arena->base;
    return ACL_SUCCESS;
}

static void punch(sim_arena_t *arena, uint64_t offset, uint64_t size)
{
    uint64_t page = 4096;
    uint64_t start = (offset + page - 1) & ~(page - 1);
    uint64_t end = (offset + size) & ~(page - 1);
    if (end > start)
        fallocate(arena->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)start, (off_t)(end - start));
}

/* Frees every allocation (aclrtResetDevice at reference count zero). */
void sim_arena_reset(sim_arena_t *arena)
{
    /* Physical memory of the virtual memory API is in the arena too: its mappings must not show
     * the blocks the arena gives to later allocations. */
    sim_vmm_device_reset(arena->device);
    pthread_mutex_lock(&arena->lock);
    arena->used.count = 0;
    arena->free.count = 0;
    block_t all = {ARENA_HEADER, arena->size - ARENA_HEADER, 0};
    list_insert(&arena->free, 0, all);
    arena->used_bytes = 0;
    punch(arena, ARENA_HEADER, arena->size - ARENA_HEADER);
    pthread_mutex_unlock(&arena->lock);
}

static uint64_t round_up(uint64_t value, uint64_t to)
{
    return (value + to - 1) / to * to;
}

static int arena_alloc(sim_arena_t *arena, uint64_t requested, void **out, const char *api)
{
    /* Refused before any rounding: sizes near 2^64 would wrap around to small ones and "fit". */
    if (requested > arena->size - ARENA_HEADER)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION,
                         "%s: %llu bytes is more than device %d has (%llu bytes; "
                         "HCCLPY_SIM_DEVICE_MEMORY sets the size)",
                         api, (unsigned long long)requested, arena->device,
                         (unsigned long long)(arena->size - ARENA_HEADER));
    uint64_t align = requested >= (64ULL << 10) ? 4096 : 64;
    uint64_t size = round_up(requested, 64);
    pthread_mutex_lock(&arena->lock);
    for (size_t i = 0; i < arena->free.count; i++) {
        block_t extent = arena->free.items[i];
        uint64_t start = round_up(extent.offset, align);
        if (start + size > extent.offset + extent.size)
            continue;
        size_t at = (size_t)(list_find(&arena->used, start) + 1);
        block_t block = {start, size, requested};
        if (!list_insert(&arena->used, at, block))
            break;
        /* Split the extent into what is left before and after the block. */
        uint64_t tail_start = start + size, tail_end = extent.offset + extent.size;
        list_remove(&arena->free, i);
        size_t pos = i;
        if (start > extent.offset) {
            block_t head = {extent.offset, start - extent.offset, 0};
            list_insert(&arena->free, pos++, head);
        }
        if (tail_end > tail_start) {
            block_t tail = {tail_start, tail_end - tail_start, 0};
            list_insert(&arena->free, pos, tail);
        }
        arena->used_bytes += size;
        pthread_mutex_unlock(&arena->lock);
        *out = arena->base + start;
        return ACL_SUCCESS;
    }
    uint64_t used = arena->used_bytes;
    pthread_mutex_unlock(&arena->lock);
    return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION,
                     "%s: device %d cannot fit %llu bytes (%llu of %llu bytes in use; "
                     "HCCLPY_SIM_DEVICE_MEMORY sets the size)",
                     api, arena->device, (unsigned long long)requested, (unsigned long long)used,
                     (unsigned long long)(arena->size - ARENA_HEADER));
}

/* Returns false if `ptr` is not the start of a live allocation. */
static bool arena_free(sim_arena_t *arena, const void *ptr)
{
    uint64_t offset = (uint64_t)((const char *)ptr - arena->base);
    pthread_mutex_lock(&arena->lock);
    ptrdiff_t i = list_find(&arena->used, offset);
    if (i < 0 || arena->used.items[i].offset != offset) {
        pthread_mutex_unlock(&arena->lock);
        return false;
    }
    block_t block = arena->used.items[i];
    list_remove(&arena->used, (size_t)i);
    arena->used_bytes -= block.size;
    if (block.size >= PUNCH_THRESHOLD)
        punch(arena, block.offset, block.size);
    /* Insert into the free list and merge with its neighbours. */
    size_t at = (size_t)(list_find(&arena->free, block.offset) + 1);
    block.requested = 0;
    list_insert(&arena->free, at, block);
    if (at + 1 < arena->free.count &&
        arena->free.items[at].offset + arena->free.items[at].size == arena->free.items[at + 1].offset) {
        arena->free.items[at].size += arena->free.items[at + 1].size;
        list_remove(&arena->free, at + 1);
    }
    if (at > 0 && arena->free.items[at - 1].offset + arena->free.items[at - 1].size == arena->free.items[at].offset) {
        arena->free.items[at - 1].size += arena->free.items[at].size;
        list_remove(&arena->free, at);
    }
    pthread_mutex_unlock(&arena->lock);
    return true;
}

/* Whether `ptr` is the start of a live allocation, of `*size` bytes as requested. */
static bool arena_block_at(sim_arena_t *arena, const void *ptr, uint64_t *size)
{
    uint64_t offset = (uint64_t)((const char *)ptr - arena->base);
    pthread_mutex_lock(&arena->lock);
    ptrdiff_t i = list_find(&arena->used, offset);
    bool found = i >= 0 && arena->used.items[i].offset == offset;
    if (found)
        *size = arena->used.items[i].requested;
    pthread_mutex_unlock(&arena->lock);
    return found;
}

/* aclrtMallocPhysical's memory (vmm.c) is a block of the device's arena, as an aclrtMalloc
 * allocation is: HCCL operations across processes then reach it by its offset in the arena. */
int sim_arena_alloc_block(int device, uint64_t bytes, const char *api, uint64_t *offset, sim_arena_loc_t *loc)
{
    char *base = NULL;
    int err = sim_device_arena(device, loc, &base);
    if (err != ACL_SUCCESS)
        return err;
    void *block = NULL;
    err = arena_alloc(__atomic_load_n(&g_arenas[device], __ATOMIC_ACQUIRE), bytes, &block, api);
    if (err == ACL_SUCCESS)
        *offset = (uint64_t)((char *)block - base);
    return err;
}

void sim_arena_free_block(int device, uint64_t offset)
{
    sim_arena_t *arena = __atomic_load_n(&g_arenas[device], __ATOMIC_ACQUIRE);
    if (arena != NULL)
        arena_free(arena, arena->base + offset);
}

static bool arena_contains(const sim_arena_t *arena, const void *ptr)
{
    return arena != NULL && (const char *)ptr >= arena->base && (const char *)ptr < arena->base + arena->size;
}

/* Room left in the live allocation holding `ptr`; false if there is none. */
static bool arena_room(sim_arena_t *arena, const void *ptr, uint64_t *room, uint64_t *offset_out)
{
    uint64_t offset = (uint64_t)((const char *)ptr - arena->base);
    pthread_mutex_lock(&arena->lock);
    ptrdiff_t i = list_find(&arena->used, offset);
    bool inside = i >= 0 && offset < arena->used.items[i].offset + arena->used.items[i].requested;
    if (inside)
        *room = arena->used.items[i].offset + arena->used.items[i].requested - offset;
    pthread_mutex_unlock(&arena->lock);
    if (offset_out != NULL)
        *offset_out = offset;
    return inside;
}

/* The device memory `ptr` points into (inside an allocation or not), or NULL. */
static sim_arena_t *arena_holding(const void *ptr)
{
    int limit = atomic_load(&g_arena_limit);
    for (int d = 0; d < limit; d++) {
        sim_arena_t *arena = __atomic_load_n(&g_arenas[d], __ATOMIC_ACQUIRE);
        if (arena_contains(arena, ptr))
            return arena;
    }
    return NULL;
}

int sim_pointer_device(const void *ptr, uint64_t *room)
{
    sim_arena_t *arena = ptr == NULL ? NULL : arena_holding(ptr);
    uint64_t left = 0;
    if (arena == NULL || !arena_room(arena, ptr, &left, NULL))
        return -1;
    if (room != NULL)
        *room = left;
    return arena->device;
}

int sim_device_range(int device, const void *ptr, uint64_t bytes, uint64_t *offset, char *why, size_t why_len)
{
    sim_arena_t *arena = device >= 0 && device < SIM_MAX_DEVICES ? __atomic_load_n(&g_arenas[device], __ATOMIC_ACQUIRE)
                                                                  : NULL;
    if (!arena_contains(arena, ptr)) {
        int mapped = sim_vmm_device_range(device, ptr, bytes, offset, why, why_len); /* aclrtMapMem's addresses */
        if (mapped >= 0)
            return mapped;
        uint64_t ignored;
        int other = sim_pointer_device(ptr, &ignored);
        if (other >= 0)
            snprintf(why, why_len, "%p is memory of device %d, not of device %d", ptr, other, device);
        else if (sim_ipc_imported(ptr, &ignored) >= 0)
            snprintf(why, why_len, "%p is memory imported from another process (aclrtIpcMemImportByKey), not this "
                     "process's own device memory", ptr);
        else
            snprintf(why, why_len, "%p is not device memory from aclrtMalloc", ptr);
        return 1;
    }
    uint64_t room = 0;
    if (!arena_room(arena, ptr, &room, offset)) {
        snprintf(why, why_len, "%p is not inside a live aclrtMalloc allocation of device %d", ptr, device);
        return 1;
    }
    if (bytes > room) {
        snprintf(why, why_len, "%llu bytes at %p run %llu bytes past the end of its allocation",
                 (unsigned long long)bytes, ptr, (unsigned long long)(bytes - room));
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------ peer arena mapping */

typedef struct peer_map {
    struct peer_map *next;
    uint64_t uid, size;
    char *base;
    int refs;
} peer_map_t;

static pthread_mutex_t g_peer_lock = PTHREAD_MUTEX_INITIALIZER;
static peer_map_t *g_peers;

char *sim_arena_map(const sim_arena_loc_t *loc)
{
    if (loc->pid == getpid()) {
        pthread_mutex_lock(&g_arena_lock);
        char *base = NULL;
        for (int d = 0; d < SIM_MAX_DEVICES && base == NULL; d++)
            if (g_arenas[d] != NULL && g_arenas[d]->uid == loc->uid)
                base = g_arenas[d]->base;
        pthread_mutex_unlock(&g_arena_lock);
        if (base == NULL)
            sim_error(ACL_ERROR_RT_INTERNAL_ERROR, "device memory %016llx of this process is gone",
                      (unsigned long long)loc->uid);
        return base;
    }
    pthread_mutex_lock(&g_peer_lock);
    for (peer_map_t *p = g_peers; p != NULL; p = p->next) {
        if (p->uid == loc->uid) {
            p->refs++;
            pthread_mutex_unlock(&g_peer_lock);
            return p->base;
        }
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)loc->pid, (int)loc->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        pthread_mutex_unlock(&g_peer_lock);
        sim_error(ACL_ERROR_RT_INTERNAL_ERROR, "cannot open the device memory of process %d (%s): %s",
                  (int)loc->pid, path, strerror(errno));
        return NULL;
    }
    char *base = mmap(NULL, loc->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        pthread_mutex_unlock(&g_peer_lock);
        sim_error(ACL_ERROR_RT_INTERNAL_ERROR, "cannot map the device memory of process %d: %s", (int)loc->pid,
                  strerror(errno));
        return NULL;
    }
    const arena_header_t *header = (const arena_header_t *)base;
    if (header->magic != ARENA_MAGIC || header->uid != loc->uid || header->size != loc->size) {
        munmap(base, loc->size);
        pthread_mutex_unlock(&g_peer_lock);
        sim_error(ACL_ERROR_RT_INTERNAL_ERROR, "process %d no longer holds the device memory it announced",
                  (int)loc->pid);
        return NULL;
    }
    peer_map_t *entry = calloc(1, sizeof *entry);
    if (entry == NULL) {
        munmap(base, loc->size);
        pthread_mutex_unlock(&g_peer_lock);
        sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
        return NULL;
    }
    entry->uid = loc->uid;
    entry->size = loc->size;
    entry->base = base;
    entry->refs = 1;
    entry->next = g_peers;
    g_peers = entry;
    pthread_mutex_unlock(&g_peer_lock);
    return base;
}

void sim_arena_unmap(const sim_arena_loc_t *loc)
{
    if (loc->pid == getpid())
        return;
    pthread_mutex_lock(&g_peer_lock);
    for (peer_map_t **link = &g_peers; *link != NULL; link = &(*link)->next) {
        peer_map_t *p = *link;
        if (p->uid != loc->uid)
            continue;
        if (--p->refs == 0) {
            munmap(p->base, p->size);
            *link = p->next;
            free(p);
        }
        break;
    }
    pthread_mutex_unlock(&g_peer_lock);
}

/* ------------------------------------------------------------ host memory */

typedef struct {
    uintptr_t start;
    uint64_t size;
} host_block_t;

static pthread_mutex_t g_host_lock = PTHREAD_MUTEX_INITIALIZER;
static host_block_t *g_host;
static size_t g_host_count, g_host_capacity;

static ptrdiff_t host_find(uintptr_t p)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)g_host_count - 1, found = -1;
    while (lo <= hi) {
        ptrdiff_t mid = (lo + hi) / 2;
        if (g_host[mid].start <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

bool sim_host_pinned(const void *ptr, uint64_t bytes)
{
    uintptr_t p = (uintptr_t)ptr;
    pthread_mutex_lock(&g_host_lock);
    ptrdiff_t i = host_find(p);
    bool pinned = i >= 0 && p + bytes <= g_host[i].start + g_host[i].size;
    pthread_mutex_unlock(&g_host_lock);
    return pinned;
}

SIM_EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size)
{
    if (hostPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is NULL");
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size must be greater than 0");
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: cannot allocate %zu bytes", size);
    pthread_mutex_lock(&g_host_lock);
    if (g_host_count == g_host_capacity) {
        size_t capacity = g_host_capacity ? g_host_capacity * 2 : 64;
        host_block_t *grown = realloc(g_host, capacity * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&g_host_lock);
            free(p);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: out of host memory");
        }
        g_host = grown;
        g_host_capacity = capacity;
    }
    size_t at = (size_t)(host_find((uintptr_t)p) + 1);
    memmove(&g_host[at + 1], &g_host[at], (g_host_count - at) * sizeof *g_host);
    g_host[at].start = (uintptr_t)p;
    g_host[at].size = size;
    g_host_count++;
    pthread_mutex_unlock(&g_host_lock);
    *hostPtr = p;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtFreeHost(void *hostPtr)
{
    if (hostPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is NULL");
    pthread_mutex_lock(&g_host_lock);
    ptrdiff_t i = host_find((uintptr_t)hostPtr);
    if (i < 0 || g_host[i].start != (uintptr_t)hostPtr) {
        pthread_mutex_unlock(&g_host_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: %p was not returned by aclrtMallocHost "
                         "(or was already freed)", hostPtr);
    }
    memmove(&g_host[i], &g_host[i + 1], (g_host_count - (size_t)i - 1) * sizeof *g_host);
    g_host_count--;
    pthread_mutex_unlock(&g_host_lock);
    free(hostPtr);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------- device memory */

static bool valid_policy(aclrtMemMallocPolicy policy)
{
    unsigned value = (unsigned)policy;
    unsigned base = value & 0xFF;
    unsigned flags = value & ~0xFFu;
    return base <= ACL_MEM_MALLOC_HUGE1G_ONLY_P2P &&
           (flags & ~(unsigned)(ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH)) == 0;
}

static aclError device_malloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy, uint64_t usable,
                              const char *api)
{
    if (devPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", api);
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: size must be greater than 0", api);
    if (!valid_policy(policy))
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: unknown memory policy %d", api, (int)policy);
    sim_context_t *context = sim_current_context();
    if (context == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    int err;
    sim_arena_t *arena = sim_arena_get(context->device, &err);
    if (arena == NULL)
        return err;
    return arena_alloc(arena, usable, devPtr, api);
}

SIM_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    return device_malloc(devPtr, size, policy, size, "aclrtMalloc");
}

SIM_EXPORT aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    /* The usable size is the request rounded up to 32 bytes (a size near 2^64 stays too large). */
    uint64_t usable = size > UINT64_MAX - 31 ? size : round_up(size, 32);
    return device_malloc(devPtr, size, policy, usable, "aclrtMallocAlign32");
}

SIM_EXPORT aclError aclrtFree(void *devPtr)
{
    if (devPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is NULL");
    sim_arena_t *arena = arena_holding(devPtr);
    uint64_t size = 0;
    if (arena != NULL && arena_block_at(arena, devPtr, &size)) {
        int err = sim_ipc_before_free(devPtr, size);
        if (err != ACL_SUCCESS)
            return err;
    }
    if (arena != NULL && arena_free(arena, devPtr))
        return ACL_SUCCESS;
    return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtFree: %p was not returned by aclrtMalloc (or was already freed)",
                     devPtr);
}

SIM_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_bytes, size_t *total_bytes)
{
    if (free_bytes == NULL || total_bytes == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: free and total must not be NULL");
    if ((int)attr < 0 || (int)attr > ACL_MEM_P2P_HUGE1G)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: unknown memory attribute %d", (int)attr);
    sim_context_t *context = sim_current_context();
    if (context == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    int err;
    sim_arena_t *arena = sim_arena_get(context->device, &err);
    if (arena == NULL)
        return err;
    pthread_mutex_lock(&arena->lock);
    uint64_t total = arena->size - ARENA_HEADER;
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)(total - arena->used_bytes);
    pthread_mutex_unlock(&arena->lock);
    return ACL_SUCCESS;
}

/* -------------------------------------------------- synchronous copy / set */

/* Checks one side of a copy: device memory must hold `bytes` from `ptr`. */
/* Where a copy's kind says one of its pointers is. */
enum side { SIDE_HOST, SIDE_DEVICE, SIDE_ANY };

static int check_side(const char *api, const char *what, const void *ptr, uint64_t bytes, enum side side,
                      const char *kind)
{
    uint64_t room = 0;
    int device = sim_pointer_device(ptr, &room);
    if (device < 0)
        device = sim_ipc_imported(ptr, &room); /* another process's memory, imported */
    if (device < 0) {
        /* Virtual memory (vmm.c): what aclrtMapMem put there, or nothing that may be touched. */
        device = sim_vmm_mapped(ptr, &room);
        if (device == SIM_VMM_UNMAPPED)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s %p is reserved address space (aclrtReserveMemAddress) "
                             "with no physical memory mapped there (aclrtMapMem)", api, what, ptr);
    }
    if (device < 0) {
        if (side == SIDE_DEVICE)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s %p is not device memory from aclrtMalloc%s%s", api, what,
                             ptr, kind != NULL ? ", as " : "", kind != NULL ? kind : "");
        /* Host memory cannot be checked, but device memory outside every live allocation can: a
         * freed device buffer taken for host memory would be copied as far as `bytes` says, past
         * the end of the device's memory. */
        if (arena_holding(ptr) != NULL)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s %p is device memory outside any live allocation "
                             "(freed, or past the end of one)", api, what, ptr);
        return ACL_SUCCESS;
    }
    if (side == SIDE_HOST)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s %p is device memory (of device %d) but %s says host memory "
                         "(ACL_MEMCPY_DEFAULT takes either)", api, what, ptr, device, kind);
    if (bytes > room)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %llu bytes at %s %p run %llu bytes past the end of its allocation",
                         api, (unsigned long long)bytes, what, ptr, (unsigned long long)(bytes - room));
    return ACL_SUCCESS;
}

int sim_check_copy(const char *api, void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    if (count == 0)
        return ACL_SUCCESS;
    if (dst == NULL || src == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, dst == NULL ? "dst" : "src");
    if (count > destMax)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: count %zu is larger than destMax %zu", api, count, destMax);
    /* The kind names both sides and both are checked alike: a side it calls device memory
     * must be in a live allocation, a side it calls host memory must not be device memory.
     * (CANN 9.x works the direction out from the pointers and ignores the kind; earlier
     * versions take the kind at its word, so a wrong one is a bug to report, not to guess
     * around.)  ACL_MEMCPY_DEFAULT takes either on both sides. */
    enum side dst_side, src_side;
    const char *name;
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: dst_side = SIDE_HOST; src_side = SIDE_HOST; name = "ACL_MEMCPY_HOST_TO_HOST"; break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
        dst_side = SIDE_DEVICE; src_side = SIDE_HOST; name = "ACL_MEMCPY_HOST_TO_DEVICE"; break;
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE:
        dst_side = SIDE_DEVICE; src_side = SIDE_HOST; name = "ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE"; break;
    case ACL_MEMCPY_DEVICE_TO_HOST:
        dst_side = SIDE_HOST; src_side = SIDE_DEVICE; name = "ACL_MEMCPY_DEVICE_TO_HOST"; break;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
        dst_side = SIDE_DEVICE; src_side = SIDE_DEVICE; name = "ACL_MEMCPY_DEVICE_TO_DEVICE"; break;
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE:
        dst_side = SIDE_DEVICE; src_side = SIDE_DEVICE; name = "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE"; break;
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE:
        dst_side = SIDE_DEVICE; src_side = SIDE_DEVICE; name = "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE"; break;
    case ACL_MEMCPY_DEFAULT: dst_side = SIDE_ANY; src_side = SIDE_ANY; name = NULL; break;
    default: return sim_error(ACL_ERROR_INVALID_PARAM, "%s: unknown copy kind %d", api, (int)kind);
    }
    int err = check_side(api, "dst", dst, count, dst_side, name);
    if (err == ACL_SUCCESS)
        err = check_side(api, "src", src, count, src_side, name);
    return err;
}

int sim_check_copy_2d(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t height, aclrtMemcpyKind kind)
{
    if (width == 0 || height == 0)
        return ACL_SUCCESS;
    if (dst == NULL || src == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, dst == NULL ? "dst" : "src");
    if (width > dpitch || width > spitch)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: width %zu is larger than %s %zu (a row must fit in its pitch)",
                         api, width, width > dpitch ? "dpitch" : "spitch", width > dpitch ? dpitch : spitch);
    if ((height - 1) > (SIZE_MAX - width) / dpitch || (height - 1) > (SIZE_MAX - width) / spitch)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %zu rows of pitch %zu overflow the address space", api, height,
                         SIM_MAX(dpitch, spitch));
    enum side dst_side, src_side;
    const char *name;
    if (kind == ACL_MEMCPY_HOST_TO_DEVICE) {
        dst_side = SIDE_DEVICE, src_side = SIDE_HOST, name = "ACL_MEMCPY_HOST_TO_DEVICE";
    } else if (kind == ACL_MEMCPY_DEVICE_TO_HOST) {
        dst_side = SIDE_HOST, src_side = SIDE_DEVICE, name = "ACL_MEMCPY_DEVICE_TO_HOST";
    } else {
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: copy kind %d is not supported: 2-D copies go host to device "
                         "(ACL_MEMCPY_HOST_TO_DEVICE) or device to host (ACL_MEMCPY_DEVICE_TO_HOST)", api, (int)kind);
    }
    /* The span from the first byte of the first row to the last byte of the last one. */
    int err = check_side(api, "dst", dst, (height - 1) * dpitch + width, dst_side, name);
    if (err == ACL_SUCCESS)
        err = check_side(api, "src", src, (height - 1) * spitch + width, src_side, name);
    return err;
}

int sim_check_set(const char *api, void *devPtr, size_t maxCount, size_t count)
{
    if (count == 0)
        return ACL_SUCCESS;
    if (devPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: devPtr is NULL", api);
    if (count > maxCount)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: count %zu is larger than maxCount %zu", api, count, maxCount);
    return check_side(api, "devPtr", devPtr, count, SIDE_DEVICE, NULL);
}

SIM_EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    int err = sim_check_copy("aclrtMemcpy", dst, destMax, src, count, kind);
    if (err == ACL_SUCCESS)
        err = sim_capture_unsafe("aclrtMemcpy");
    if (err == ACL_SUCCESS && count > 0) {
        bool streaming = count >= SIM_STREAMING_COPY_BYTES && sim_pointer_device(dst, NULL) < 0;
        sim_copy(dst, src, count, streaming);
        if (streaming)
            sim_store_fence();
    }
    return err;
}

SIM_EXPORT aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    int err = sim_check_set("aclrtMemset", devPtr, maxCount, count);
    if (err == ACL_SUCCESS)
        err = sim_capture_unsafe("aclrtMemset");
    if (err == ACL_SUCCESS && count > 0)
        memset(devPtr, value & 0xFF, count);
    return err;
}

/* ------------------------------------------------------------------- fork */

void sim_memory_after_fork(void)
{
    sim_vmm_after_fork(); /* its mappings show the parent's device memory */
    pthread_mutex_init(&g_arena_lock, NULL);
    pthread_mutex_init(&g_peer_lock, NULL);
    pthread_mutex_init(&g_host_lock, NULL);
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        sim_arena_t *arena = g_arenas[d];
        if (arena == NULL)
            continue;
        /* The mapping is shared with the parent: writing to it would corrupt
         * the parent's device memory, so the child drops it. */
        munmap(arena->base, arena->size);
        close(arena->fd);
        free(arena->used.items);
        free(arena->free.items);
        free(arena);
        g_arenas[d] = NULL;
    }
    atomic_store(&g_arena_limit, 0);
    while (g_peers != NULL) {
        peer_map_t *p = g_peers;
        g_peers = p->next;
        munmap(p->base, p->size);
        free(p);
    }
    /* Pinned host memory is private copy-on-write memory: still valid. */
}

/* ------------------------------------------------- attributes, registration */

/* The page size reported for every memory the simulator hands out: its device memory is host
 * memory shared between processes, in pages of the host's size. */
#define SIM_PAGE_SIZE 4096u

/* Host ranges registered with aclrtHostRegister, sorted by start. */
static host_block_t *g_registered;
static size_t g_registered_count, g_registered_capacity;

static ptrdiff_t registered_find(uintptr_t p) /* the last range starting at or before p; -1: none */
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)g_registered_count - 1, found = -1;
    while (lo <= hi) {
        ptrdiff_t mid = (lo + hi) / 2;
        if (g_registered[mid].start <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

static bool host_registered(const void *ptr)
{
    pthread_mutex_lock(&g_host_lock);
    ptrdiff_t i = registered_find((uintptr_t)ptr);
    bool inside = i >= 0 && (uintptr_t)ptr - g_registered[i].start < g_registered[i].size;
    pthread_mutex_unlock(&g_host_lock);
    return inside;
}

SIM_EXPORT aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes)
{
    if (ptr == NULL || attributes == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtPointerGetAttributes: %s is NULL",
                         ptr == NULL ? "ptr" : "attributes");
    aclrtPtrAttributes found = {{0, ACL_MEM_LOCATION_TYPE_UNREGISTERED}, 0, {0, 0, 0, 0}};
    sim_arena_t *arena = arena_holding(ptr);
    uint64_t room = 0;
    int mapped = arena == NULL ? sim_vmm_mapped(ptr, NULL) : SIM_VMM_NONE; /* aclrtMapMem's addresses */
    if (arena != NULL && arena_room(arena, ptr, &room, NULL)) {
        found.location.id = (uint32_t)arena->device;
        found.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
        found.pageSize = SIM_PAGE_SIZE;
    } else if (mapped >= 0) {
        found.location.id = (uint32_t)mapped;
        found.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
        found.pageSize = SIM_PAGE_SIZE;
    } else if (sim_host_pinned(ptr, 1) || host_registered(ptr)) {
        found.location.type = ACL_MEM_LOCATION_TYPE_HOST;
        found.pageSize = SIM_PAGE_SIZE;
    }
    *attributes = found;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr)
{
    if (ptr == NULL || devPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: %s is NULL", ptr == NULL ? "ptr" : "devPtr");
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: size must be greater than 0");
    if ((uintptr_t)ptr % SIM_PAGE_SIZE != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: ptr %p is not aligned to a %u-byte page",
                         ptr, SIM_PAGE_SIZE);
    if (type != ACL_HOST_REGISTER_MAPPED)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: unknown type %d (ACL_HOST_REGISTER_MAPPED "
                         "is 0)", (int)type);
    uintptr_t start = (uintptr_t)ptr;
    if (size > UINTPTR_MAX - start)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: %llu bytes at %p pass the end of the "
                         "address space", (unsigned long long)size, ptr);
    if (arena_holding(ptr) != NULL || sim_vmm_mapped(ptr, NULL) != SIM_VMM_NONE)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: %p is device memory (or address space reserved "
                         "for it), not host memory", ptr);
    pthread_mutex_lock(&g_host_lock);
    ptrdiff_t before = registered_find(start + size - 1);
    if (before >= 0 && g_registered[before].start + g_registered[before].size > start) {
        uintptr_t other = g_registered[before].start;
        pthread_mutex_unlock(&g_host_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: %llu bytes at %p overlap the range "
                         "registered at %p", (unsigned long long)size, ptr, (void *)other);
    }
    if (g_registered_count == g_registered_capacity) {
        size_t capacity = g_registered_capacity ? g_registered_capacity * 2 : 16;
        host_block_t *grown = realloc(g_registered, capacity * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&g_host_lock);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtHostRegister: out of host memory");
        }
        g_registered = grown;
        g_registered_capacity = capacity;
    }
    size_t at = (size_t)(before + 1);
    memmove(&g_registered[at + 1], &g_registered[at], (g_registered_count - at) * sizeof *g_registered);
    g_registered[at].start = start;
    g_registered[at].size = size;
    g_registered_count++;
    pthread_mutex_unlock(&g_host_lock);
    /* The simulated device reaches host memory where the host does: the device address is the
     * host address. */
    *devPtr = ptr;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtHostUnregister(void *ptr)
{
    if (ptr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostUnregister: ptr is NULL");
    pthread_mutex_lock(&g_host_lock);
    ptrdiff_t i = registered_find((uintptr_t)ptr);
    if (i < 0 || g_registered[i].start != (uintptr_t)ptr) {
        pthread_mutex_unlock(&g_host_lock);
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtHostUnregister: %p is not the start of memory registered "
                         "with aclrtHostRegister (or it was unregistered)", ptr);
    }
    memmove(&g_registered[i], &g_registered[i + 1], (g_registered_count - (size_t)i - 1) * sizeof *g_registered);
    g_registered_count--;
    pthread_mutex_unlock(&g_host_lock);
    return ACL_SUCCESS;
}
