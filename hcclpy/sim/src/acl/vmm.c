/*
 * Virtual memory: aclrtReserveMemAddress / aclrtReleaseMemAddress, aclrtMallocPhysical /
 * aclrtFreePhysical, aclrtMapMem / aclrtUnmapMem, aclrtMemGetAllocationGranularity, and physical
 * memory shared between processes (aclrtMemExportToShareableHandle,
 * aclrtMemSetPidToShareableHandle, aclrtMemImportFromShareableHandle).
 *
 * A reservation is address space of this process that nothing may touch (mmap PROT_NONE).
 * Physical memory is a block of the simulated device's memory, the arena of memory.c, as an
 * aclrtMalloc allocation is.  Mapping it maps the arena's file at the block's offset over the
 * reserved pages (MAP_FIXED | MAP_SHARED): the virtual address and the block are the same pages.
 * Everything that takes device memory takes a mapped address: copies and memsets (memory.c asks
 * sim_vmm_mapped), and HCCL operations, which address every rank's buffers by their offset in
 * the rank's arena (memory.c's sim_device_range asks sim_vmm_device_range for that offset).
 *
 * Sharing.  Each process that exports has one table of exports, in a memfd that other processes
 * open through /proc/<pid>/fd/<fd> (nothing is left in /dev/shm, even after SIGKILL).  A
 * shareable handle packs the exporter's pid (22 bits: Linux pids are below 2^22), the table's
 * descriptor (16 bits), the slot (10 bits) and the slot's generation (16 bits).  An importer
 * checks the slot (live, this process allowed), enters itself (pid and start time, so that a dead
 * importer does not count) and maps the exporter's arena file at the block's offset: both
 * processes see the same bytes.  Physical memory the exporter frees while a live process has it
 * imported stays allocated until no live importer is left (CANN: "all processes must free it
 * before it is really released"); the exporter's later virtual memory calls reclaim it.
 *
 * The codes, where CANN's documentation says only "not 0": an argument that breaks a rule of its
 * own (NULL, a size of 0, a reserved value that must be 0, a size that is not the physical
 * memory's or not a multiple of its granularity, an address off the granularity) is
 * ACL_ERROR_INVALID_PARAM, as CANN's ACL layer returns for the checks it makes; a call whose
 * arguments are fine but do not fit what exists (an address not reserved or not mapped, a
 * mapping over a mapping, freeing memory still mapped, releasing a reservation with mappings,
 * a second export) is ACL_ERROR_RT_PARAM_INVALID, what CANN's runtime returns for the driver's
 * "invalid value"; a handle that is not live physical memory, or a shareable handle that names
 * no live export, is ACL_ERROR_RT_INVALID_HANDLE; an import the exporter did not allow is
 * ACL_ERROR_RT_NO_PERMISSION.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl/runtime.h"

/* The granularity of physical memory: 2 MiB pages, or 1 GiB for the HUGE1G attributes, as CANN
 * documents them (aclrtMemAttr; ACL_HBM_MEM_NORMAL "is allocated as ACL_HBM_MEM_HUGE"), the
 * minimum and the recommended alike. */
#define GRANULE (2ULL << 20)
#define GRANULE_1G (1ULL << 30)
#define RESERVE_MAX (1ULL << 46)  /* 64 TiB: more address space than any reservation gets */
#define EXPECT_LOW (16ULL << 40)  /* expectPtr must lie in [16 TiB, 24 TiB), as CANN documents */
#define EXPECT_HIGH (24ULL << 40)
#define HANDLE_TAG 0xAu           /* low 4 bits of a physical memory handle (table handles use 1..4) */

#define MAX_EXPORTS 256           /* exports of one process at a time */
#define MAX_PIDS 64               /* processes aclrtMemSetPidToShareableHandle lists per export */
#define MAX_IMPORTERS 32          /* processes that have one export imported at a time */
#define TABLE_MAGIC 0x53544F5058454D56ULL /* "VMEXPOTS" */

enum { SLOT_FREE = 0, SLOT_LIVE, SLOT_ORPHAN /* freed by the exporter, imported by a live process */ };

typedef struct {
    int32_t pid;    /* 0: free */
    uint64_t start; /* the importer's start time: a reused pid is not taken for it */
} importer_t;

typedef struct {
    uint32_t state;
    uint32_t generation;           /* 16 bits of it are in the shareable handle */
    uint32_t check_pids;           /* only the processes in pids may import */
    uint32_t npids;
    sim_arena_loc_t arena;         /* the exporter's device memory */
    uint64_t offset, bytes, size, granule;
    int32_t device;
    int32_t pids[MAX_PIDS];
    importer_t importers[MAX_IMPORTERS];
} export_slot_t;

typedef struct {
    uint64_t magic;
    int32_t pid;
    pthread_mutex_t lock;          /* process-shared and robust: an importer may die holding it */
    export_slot_t slots[MAX_EXPORTS];
} export_table_t;

typedef struct {
    uint64_t handle;               /* what the caller holds */
    int device;
    uint64_t size;                 /* as aclrtMallocPhysical got it: what aclrtMapMem must be given */
    uint64_t bytes;                /* size rounded up to the granularity: the block */
    uint64_t granule;
    bool imported;
    int fd;                        /* the arena's file, mapped from: the arena's own (local), ours (imported) */
    uint64_t offset;               /* of the block in that file */
    int maps;                      /* mappings of it in this process */
    uint64_t shareable;            /* exported (local) or imported as; 0: neither */
    int slot;                      /* exports: the slot of our table; imports: of the exporter's */
    export_table_t *table;         /* imports: the exporter's table, mapped */
    int importer;                  /* imports: our entry in the slot */
    uint32_t generation;           /* imports: the slot's generation when imported */
    sim_arena_loc_t arena;         /* local: the device memory it is in (for exports) */
} phys_t;

typedef struct {
    uintptr_t start;               /* first: found by find_start() */
    uint64_t size;
    int maps;
    int device;                    /* of what it maps (-1: nothing) */
    bool imported;                 /* what it maps was imported */
} reservation_t;

typedef struct {
    uintptr_t start;               /* first: found by find_start() */
    uint64_t size;
    phys_t *phys;
} mapping_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static reservation_t *g_res;       /* sorted by start */
static size_t g_res_count, g_res_capacity;
static _Atomic size_t g_reserved;  /* g_res_count, read without the lock: most pointers are in no reservation */
static mapping_t *g_maps;          /* sorted by start */
static size_t g_map_count, g_map_capacity;
static struct {
    phys_t *phys;                  /* NULL: free */
    uint32_t generation;
} *g_handles;
static size_t g_handle_count, g_handle_capacity;
static export_table_t *g_table;    /* this process's exports */
static int g_table_fd = -1;
static int g_orphans;              /* slots of g_table in SLOT_ORPHAN */

/* ------------------------------------------------------------------ helpers */

static uint64_t round_up(uint64_t value, uint64_t to)
{
    return (value + to - 1) / to * to;
}

static bool grow(void **items, size_t *capacity, size_t count, size_t stride)
{
    if (count < *capacity)
        return true;
    size_t wanted = *capacity ? *capacity * 2 : 16;
    void *grown = realloc(*items, wanted * stride);
    if (grown == NULL)
        return false;
    *items = grown;
    *capacity = wanted;
    return true;
}

/* Index of the last item (of `stride` bytes, a uintptr_t start first) that starts at or before p; -1: none. */
static ptrdiff_t find_start(const void *items, size_t count, size_t stride, uintptr_t p)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)count - 1, found = -1;
    while (lo <= hi) {
        ptrdiff_t mid = (lo + hi) / 2;
        if (*(const uintptr_t *)((const char *)items + (size_t)mid * stride) <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

static reservation_t *reservation_at(uintptr_t p)
{
    ptrdiff_t i = find_start(g_res, g_res_count, sizeof *g_res, p);
    return i >= 0 && p - g_res[i].start < g_res[i].size ? &g_res[i] : NULL;
}

static ptrdiff_t mapping_at(uintptr_t p)
{
    ptrdiff_t i = find_start(g_maps, g_map_count, sizeof *g_maps, p);
    return i >= 0 && p - g_maps[i].start < g_maps[i].size ? i : -1;
}

/* Makes [p, p + size) reserved and untouchable again (over a mapping). */
static bool make_reserved(uintptr_t p, uint64_t size)
{
    return mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) !=
           MAP_FAILED;
}

static void remove_mapping(size_t i)
{
    reservation_t *r = reservation_at(g_maps[i].start);
    if (r != NULL && --r->maps == 0)
        r->device = -1;
    g_maps[i].phys->maps--;
    memmove(&g_maps[i], &g_maps[i + 1], (g_map_count - i - 1) * sizeof *g_maps);
    g_map_count--;
}

/* ------------------------------------------------------------------ handles */

static phys_t *lookup(const void *handle)
{
    uint64_t value = (uint64_t)(uintptr_t)handle;
    uint64_t index = (value >> 4) & 0x0FFFFFFF;
    if ((value & 0xF) != HANDLE_TAG || index == 0 || index > g_handle_count)
        return NULL;
    index--;
    phys_t *phys = g_handles[index].phys;
    return phys != NULL && g_handles[index].generation == (uint32_t)(value >> 32) ? phys : NULL;
}

static bool new_handle(phys_t *phys)
{
    size_t index = 0;
    while (index < g_handle_count && g_handles[index].phys != NULL)
        index++;
    if (index == g_handle_count) {
        if (index >= 0x0FFFFFFF ||
            !grow((void **)&g_handles, &g_handle_capacity, g_handle_count, sizeof *g_handles))
            return false;
        g_handles[index].generation = 0;
        g_handle_count++;
    }
    g_handles[index].phys = phys;
    uint32_t generation = ++g_handles[index].generation;
    phys->handle = (uint64_t)generation << 32 | (uint64_t)(index + 1) << 4 | HANDLE_TAG;
    return true;
}

static void drop_handle(phys_t *phys)
{
    size_t index = (size_t)((phys->handle >> 4) & 0x0FFFFFFF) - 1;
    g_handles[index].phys = NULL;
    g_handles[index].generation++; /* the old handle is stale from now on */
}

/* ------------------------------------------------------------- export table */

static void table_lock(export_table_t *table)
{
    if (pthread_mutex_lock(&table->lock) == EOWNERDEAD) /* a process died holding it: its update is lost */
        pthread_mutex_consistent(&table->lock);
}

static bool importer_alive(const importer_t *importer)
{
    return importer->pid != 0 && sim_process_alive(importer->pid, importer->start);
}

static bool imported_by_a_live_process(const export_slot_t *slot)
{
    for (int i = 0; i < MAX_IMPORTERS; i++)
        if (importer_alive(&slot->importers[i]))
            return true;
    return false;
}

/* Frees the blocks that the exporter freed and no live process imports any more (g_lock held). */
static void sweep_orphans(void)
{
    if (g_table == NULL || g_orphans == 0)
        return;
    table_lock(g_table);
    for (int s = 0; s < MAX_EXPORTS; s++) {
        export_slot_t *slot = &g_table->slots[s];
        if (slot->state == SLOT_ORPHAN && !imported_by_a_live_process(slot)) {
            sim_arena_free_block(slot->device, slot->offset);
            slot->state = SLOT_FREE;
            g_orphans--;
        }
    }
    pthread_mutex_unlock(&g_table->lock);
}

static int ensure_table(const char *api)
{
    if (g_table != NULL)
        return ACL_SUCCESS;
    int fd = memfd_create("hcclpy-sim-vmm-exports", MFD_CLOEXEC);
    if (fd > 0xFFFF) { /* the shareable handle holds 16 bits of it */
        int low = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        close(fd);
        fd = low <= 0xFFFF ? low : (close(low), -1);
    }
    if (fd < 0)
        return sim_error(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, "%s: cannot make the table of exports: %s", api,
                         strerror(errno));
    export_table_t *table = MAP_FAILED;
    if (ftruncate(fd, sizeof *table) == 0)
        table = mmap(NULL, sizeof *table, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (table == MAP_FAILED) {
        int saved = errno;
        close(fd);
        return sim_error(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, "%s: cannot map the table of exports: %s", api,
                         strerror(saved));
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&table->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    table->pid = getpid();
    table->magic = TABLE_MAGIC;
    g_table = table;
    g_table_fd = fd;
    return ACL_SUCCESS;
}

static uint64_t shareable_of(int slot, uint32_t generation)
{
    return (uint64_t)getpid() << 42 | (uint64_t)g_table_fd << 26 | (uint64_t)slot << 16 | (generation & 0xFFFF);
}

typedef struct {
    int pid, fd, slot;
    uint32_t generation;
} shareable_t;

static shareable_t decode(uint64_t value)
{
    shareable_t s = {(int)(value >> 42), (int)((value >> 26) & 0xFFFF), (int)((value >> 16) & 0x3FF),
                     (uint32_t)(value & 0xFFFF)};
    return s;
}

/* The slot of this process's table that `value` names, live, or NULL (g_lock and the table's lock held). */
static export_slot_t *own_slot(uint64_t value)
{
    shareable_t s = decode(value);
    if (g_table == NULL || s.pid != (int)getpid() || s.fd != g_table_fd || s.slot >= MAX_EXPORTS)
        return NULL;
    export_slot_t *slot = &g_table->slots[s.slot];
    return slot->state == SLOT_LIVE && (slot->generation & 0xFFFF) == s.generation ? slot : NULL;
}

/* ---------------------------------------------------------- releasing memory */

/* An importer's entry goes; the exporter's table is let go (g_lock held). */
static void leave_import(phys_t *phys)
{
    export_table_t *table = phys->table;
    table_lock(table);
    export_slot_t *slot = &table->slots[phys->slot];
    if (slot->generation == phys->generation && slot->importers[phys->importer].pid == (int32_t)getpid())
        slot->importers[phys->importer].pid = 0;
    pthread_mutex_unlock(&table->lock);
    munmap(table, sizeof *table);
    if (phys->fd >= 0)
        close(phys->fd);
}

/* Frees physical memory nothing maps (g_lock held); `arena_gone`: aclrtResetDevice freed the block already. */
static void release_phys(phys_t *phys, bool arena_gone)
{
    if (phys->imported) {
        leave_import(phys);
    } else if (phys->shareable != 0) {
        table_lock(g_table);
        export_slot_t *slot = &g_table->slots[phys->slot];
        bool keep = !arena_gone && imported_by_a_live_process(slot);
        slot->state = keep ? SLOT_ORPHAN : SLOT_FREE;
        g_orphans += keep;
        pthread_mutex_unlock(&g_table->lock);
        if (!keep && !arena_gone)
            sim_arena_free_block(phys->device, phys->offset);
    } else if (!arena_gone) {
        sim_arena_free_block(phys->device, phys->offset);
    }
    drop_handle(phys);
    free(phys);
}

void sim_vmm_device_reset(int device)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = g_map_count; i-- > 0;) {
        phys_t *phys = g_maps[i].phys;
        if (!phys->imported && phys->device == device) {
            make_reserved(g_maps[i].start, g_maps[i].size);
            remove_mapping(i);
        }
    }
    for (size_t i = 0; i < g_handle_count; i++) {
        phys_t *phys = g_handles[i].phys;
        if (phys != NULL && !phys->imported && phys->device == device)
            release_phys(phys, true);
    }
    if (g_table != NULL && g_orphans > 0) { /* their blocks went with the rest of the device's memory */
        table_lock(g_table);
        for (int s = 0; s < MAX_EXPORTS; s++) {
            if (g_table->slots[s].state == SLOT_ORPHAN && g_table->slots[s].device == device) {
                g_table->slots[s].state = SLOT_FREE;
                g_orphans--;
            }
        }
        pthread_mutex_unlock(&g_table->lock);
    }
    pthread_mutex_unlock(&g_lock);
}

void sim_vmm_after_fork(void)
{
    /* The child starts with no virtual memory: the parent's mappings would write into the parent's
     * device memory, and its handles and exports are the parent's. */
    pthread_mutex_init(&g_lock, NULL);
    for (size_t i = 0; i < g_res_count; i++)
        munmap((void *)g_res[i].start, g_res[i].size);
    free(g_res);
    free(g_maps);
    g_res = NULL;
    g_maps = NULL;
    g_res_count = g_res_capacity = g_map_count = g_map_capacity = 0;
    atomic_store(&g_reserved, 0);
    for (size_t i = 0; i < g_handle_count; i++) {
        phys_t *phys = g_handles[i].phys;
        if (phys != NULL && phys->imported) {
            munmap(phys->table, sizeof *phys->table);
            close(phys->fd);
        }
        free(phys);
    }
    free(g_handles);
    g_handles = NULL;
    g_handle_count = g_handle_capacity = 0;
    if (g_table != NULL) {
        munmap(g_table, sizeof *g_table);
        close(g_table_fd);
    }
    g_table = NULL;
    g_table_fd = -1;
    g_orphans = 0;
}

/* ----------------------------------------------------- hooks of memory.c */

int sim_vmm_mapped(const void *ptr, uint64_t *room)
{
    if (atomic_load_explicit(&g_reserved, memory_order_acquire) == 0)
        return SIM_VMM_NONE;
    uintptr_t p = (uintptr_t)ptr;
    pthread_mutex_lock(&g_lock);
    int device = SIM_VMM_NONE;
    reservation_t *r = reservation_at(p);
    ptrdiff_t m = r != NULL ? mapping_at(p) : -1;
    if (r != NULL && m < 0) {
        device = SIM_VMM_UNMAPPED;
    } else if (m >= 0) {
        device = g_maps[m].phys->device;
        /* Adjacent mappings of the reservation are one range of addresses, as for a copy. */
        uintptr_t end = g_maps[m].start + g_maps[m].size;
        for (size_t j = (size_t)m + 1; j < g_map_count && g_maps[j].start == end && end < r->start + r->size; j++)
            end += g_maps[j].size;
        if (room != NULL)
            *room = end - p;
    }
    pthread_mutex_unlock(&g_lock);
    return device;
}

int sim_vmm_device_range(int device, const void *ptr, uint64_t bytes, uint64_t *offset, char *why, size_t why_len)
{
    if (atomic_load_explicit(&g_reserved, memory_order_acquire) == 0)
        return -1;
    uintptr_t p = (uintptr_t)ptr;
    pthread_mutex_lock(&g_lock);
    reservation_t *r = reservation_at(p);
    ptrdiff_t m = r != NULL ? mapping_at(p) : -1;
    int result = 1;
    if (r == NULL) {
        result = -1;
    } else if (m < 0) {
        snprintf(why, why_len, "%p is reserved address space (aclrtReserveMemAddress) with no physical memory "
                 "mapped there (aclrtMapMem)", ptr);
    } else if (g_maps[m].phys->imported) {
        snprintf(why, why_len, "%p maps physical memory imported from another process "
                 "(aclrtMemImportFromShareableHandle), which copies and memsets take but HCCL operations do not: "
                 "they take this process's own device memory", ptr);
    } else if (g_maps[m].phys->device != device) {
        snprintf(why, why_len, "%p maps physical memory of device %d, not of device %d", ptr,
                 g_maps[m].phys->device, device);
    } else {
        /* Peers reach the buffer by its offset in the device's memory: it must be one piece there,
         * in one physical allocation or in mappings of blocks that follow each other. */
        const phys_t *phys = g_maps[m].phys;
        uintptr_t end = g_maps[m].start + g_maps[m].size, mapped_end = end;
        uint64_t block_end = phys->offset + phys->bytes;
        size_t j = (size_t)m + 1;
        for (; j < g_map_count && g_maps[j].start == end && end < r->start + r->size; j++) {
            const phys_t *next = g_maps[j].phys;
            if (next->imported || next->device != device || next->offset != block_end)
                break;
            end += g_maps[j].size;
            block_end += next->bytes;
        }
        for (mapped_end = end; j < g_map_count && g_maps[j].start == mapped_end &&
                               mapped_end < r->start + r->size; j++)
            mapped_end += g_maps[j].size;
        if (bytes <= end - p) {
            *offset = phys->offset + (p - g_maps[m].start);
            result = 0;
        } else if (bytes <= mapped_end - p) {
            snprintf(why, why_len, "%llu bytes at %p span physical allocations that are not next to each other in "
                     "device %d's memory: HCCL operations take a buffer that is one piece of device memory (inside "
                     "one physical allocation)", (unsigned long long)bytes, ptr, device);
            result = 2;
        } else {
            snprintf(why, why_len, "%llu bytes at %p run %llu bytes past the end of the memory mapped there",
                     (unsigned long long)bytes, ptr, (unsigned long long)(bytes - (mapped_end - p)));
            result = 2;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return result;
}

/* ------------------------------------------------------------ address space */

SIM_EXPORT aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr,
                                           uint64_t flags)
{
    static const char *api = "aclrtReserveMemAddress";
    if (virPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: virPtr is NULL", api);
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: size must be greater than 0", api);
    if (alignment != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: alignment %zu: it is reserved and must be 0 (a reservation "
                         "is aligned to the granularity)", api, alignment);
    if (flags > 1)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 " are not a page type (0 or 1)", api, flags);
    if (size > RESERVE_MAX)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: %zu bytes are more address space than a reservation "
                         "gets (%llu)", api, size, (unsigned long long)RESERVE_MAX);
    /* Aligned so that physical memory of either granularity maps at its start. */
    uint64_t align = size >= GRANULE_1G ? GRANULE_1G : GRANULE;
    uint64_t bytes = round_up(size, GRANULE);
    char *start;
    if (expectPtr != NULL) {
        uintptr_t want = (uintptr_t)expectPtr;
        if (want % align != 0 || want < EXPECT_LOW || bytes > EXPECT_HIGH - EXPECT_LOW ||
            want - EXPECT_LOW > EXPECT_HIGH - EXPECT_LOW - bytes)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: expectPtr %p must be a multiple of %s with its %llu bytes "
                             "inside [16 TiB, 24 TiB)", api, expectPtr, align == GRANULE ? "2 MiB" : "1 GiB",
                             (unsigned long long)bytes);
        start = mmap(expectPtr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (start == MAP_FAILED)
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot reserve %llu bytes: %s", api,
                             (unsigned long long)bytes, strerror(errno));
        if (start != expectPtr) {
            munmap(start, bytes);
            return sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the %llu bytes at expectPtr %p are in use", api,
                             (unsigned long long)bytes, expectPtr);
        }
    } else {
        char *raw = mmap(NULL, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot reserve %llu bytes: %s", api,
                             (unsigned long long)bytes, strerror(errno));
        start = (char *)round_up((uintptr_t)raw, align);
        if (start > raw)
            munmap(raw, (size_t)(start - raw));
        if (raw + bytes + align > start + bytes)
            munmap(start + bytes, (size_t)(raw + bytes + align - (start + bytes)));
    }
    pthread_mutex_lock(&g_lock);
    if (!grow((void **)&g_res, &g_res_capacity, g_res_count, sizeof *g_res)) {
        pthread_mutex_unlock(&g_lock);
        munmap(start, bytes);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    size_t at = (size_t)(find_start(g_res, g_res_count, sizeof *g_res, (uintptr_t)start) + 1);
    memmove(&g_res[at + 1], &g_res[at], (g_res_count - at) * sizeof *g_res);
    g_res[at] = (reservation_t){(uintptr_t)start, bytes, 0, -1, false};
    g_res_count++;
    atomic_store_explicit(&g_reserved, g_res_count, memory_order_release);
    pthread_mutex_unlock(&g_lock);
    *virPtr = start;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtReleaseMemAddress(void *virPtr)
{
    static const char *api = "aclrtReleaseMemAddress";
    if (virPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: virPtr is NULL", api);
    uintptr_t p = (uintptr_t)virPtr;
    pthread_mutex_lock(&g_lock);
    reservation_t *r = reservation_at(p);
    int err = ACL_SUCCESS;
    if (r == NULL)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: %p was not reserved with aclrtReserveMemAddress (or was "
                        "released)", api, virPtr);
    else if (r->start != p)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: %p is inside the reservation at %p: release it by its start",
                        api, virPtr, (void *)r->start);
    else if (r->maps > 0)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the reservation at %p still has %d mapping%s (the first at "
                        "%p): aclrtUnmapMem them first", api, virPtr, r->maps, r->maps == 1 ? "" : "s",
                        (void *)g_maps[find_start(g_maps, g_map_count, sizeof *g_maps, p - 1) + 1].start);
    if (err == ACL_SUCCESS) {
        munmap(virPtr, r->size);
        size_t at = (size_t)(r - g_res);
        memmove(&g_res[at], &g_res[at + 1], (g_res_count - at - 1) * sizeof *g_res);
        g_res_count--;
        atomic_store_explicit(&g_reserved, g_res_count, memory_order_release);
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

/* ----------------------------------------------------------- physical memory */

/* Checks where and what physical memory `prop` asks for; its granularity and device. */
static int check_prop(const char *api, const aclrtPhysicalMemProp *prop, uint64_t *granule, int *device)
{
    int type = (int)prop->location.type, attr = (int)prop->memAttr;
    if (type == ACL_MEM_LOCATION_TYPE_HOST || type == ACL_MEM_LOCATION_TYPE_HOST_NUMA)
        return sim_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "%s: physical memory on the host (location type %d) is not "
                         "simulated: the simulator's physical memory is device memory "
                         "(ACL_MEM_LOCATION_TYPE_DEVICE)", api, type);
    if (type != ACL_MEM_LOCATION_TYPE_DEVICE)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: location type %d is no place for physical memory "
                         "(ACL_MEM_LOCATION_TYPE_DEVICE is 1)", api, type);
    if (attr < ACL_DDR_MEM || attr > ACL_MEM_P2P_HUGE1G)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: unknown memAttr %d", api, attr);
    if (attr == ACL_DDR_MEM || attr == ACL_HBM_MEM)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: memAttr %d names a memory for aclrtGetMemInfo, not a page "
                         "size: device memory takes ACL_HBM_MEM_HUGE, ACL_MEM_HUGE, ACL_MEM_HUGE1G ...", api, attr);
    if (attr == ACL_DDR_MEM_HUGE || attr == ACL_DDR_MEM_NORMAL || attr == ACL_DDR_MEM_P2P_HUGE ||
        attr == ACL_DDR_MEM_P2P_NORMAL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: memAttr %d is host (DDR) memory, which device memory is not: "
                         "it takes ACL_HBM_MEM_* or ACL_MEM_*", api, attr);
    int err = sim_device_check(prop->location.id > INT32_MAX ? -1 : (int)prop->location.id);
    if (err != ACL_SUCCESS)
        return err;
    *device = (int)prop->location.id;
    *granule = attr == ACL_HBM_MEM_HUGE1G || attr == ACL_HBM_MEM_P2P_HUGE1G || attr == ACL_MEM_HUGE1G ||
                       attr == ACL_MEM_P2P_HUGE1G
                   ? GRANULE_1G
                   : GRANULE;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
                                                     size_t *granularity)
{
    static const char *api = "aclrtMemGetAllocationGranularity";
    if (prop == NULL || granularity == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, prop == NULL ? "prop" : "granularity");
    if (option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: option %d is neither ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM (0) "
                         "nor ..._RECOMMENDED (1)", api, (int)option);
    uint64_t granule = 0;
    int device = 0;
    int err = check_prop(api, prop, &granule, &device);
    if (err == ACL_SUCCESS)
        *granularity = (size_t)granule;
    return err;
}

SIM_EXPORT aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                        uint64_t flags)
{
    static const char *api = "aclrtMallocPhysical";
    if (handle == NULL || prop == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, handle == NULL ? "handle" : "prop");
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: size must be greater than 0", api);
    if (flags != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 ": they are reserved and must be 0", api,
                         flags);
    if (prop->handleType != ACL_MEM_HANDLE_TYPE_NONE)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handleType %d is not ACL_MEM_HANDLE_TYPE_NONE (0)", api,
                         (int)prop->handleType);
    if (prop->allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: allocationType %d is not ACL_MEM_ALLOCATION_TYPE_PINNED (0)",
                         api, (int)prop->allocationType);
    uint64_t granule = 0;
    int device = 0;
    int err = check_prop(api, prop, &granule, &device);
    if (err != ACL_SUCCESS)
        return err;
    if (size > RESERVE_MAX) /* before rounding: a size near 2^64 would wrap around to a small one */
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: %zu bytes are more than device %d has (%llu bytes; "
                         "HCCLPY_SIM_DEVICE_MEMORY sets the size)", api, size, device,
                         (unsigned long long)sim_config()->device_memory);
    phys_t *phys = calloc(1, sizeof *phys);
    if (phys == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    phys->device = device;
    phys->size = size;
    phys->bytes = round_up(size, granule); /* CANN rounds up to the granularity too */
    phys->granule = granule;
    phys->slot = -1;
    pthread_mutex_lock(&g_lock);
    sweep_orphans();
    err = sim_arena_alloc_block(device, phys->bytes, api, &phys->offset, &phys->arena);
    if (err == ACL_SUCCESS && !new_handle(phys)) {
        sim_arena_free_block(device, phys->offset);
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    pthread_mutex_unlock(&g_lock);
    if (err != ACL_SUCCESS) {
        free(phys);
        return err;
    }
    phys->fd = phys->arena.fd;
    *handle = (aclrtDrvMemHandle)(uintptr_t)phys->handle;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtFreePhysical(aclrtDrvMemHandle handle)
{
    static const char *api = "aclrtFreePhysical";
    if (handle == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handle is NULL", api);
    pthread_mutex_lock(&g_lock);
    phys_t *phys = lookup(handle);
    int err = ACL_SUCCESS;
    if (phys == NULL) {
        err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: %p is not physical memory from aclrtMallocPhysical or "
                        "aclrtMemImportFromShareableHandle (or it was freed)", api, handle);
    } else if (phys->maps > 0) {
        uintptr_t at = 0;
        for (size_t i = 0; i < g_map_count && at == 0; i++)
            if (g_maps[i].phys == phys)
                at = g_maps[i].start;
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the memory is still mapped at %p%s: aclrtUnmapMem it first",
                        api, (void *)at, phys->maps > 1 ? " and elsewhere" : "");
    } else {
        release_phys(phys, false);
    }
    sweep_orphans();
    pthread_mutex_unlock(&g_lock);
    return err;
}

/* ----------------------------------------------------------------- mappings */

SIM_EXPORT aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
    static const char *api = "aclrtMapMem";
    if (virPtr == NULL || handle == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, virPtr == NULL ? "virPtr" : "handle");
    if (size == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: size must be greater than 0", api);
    if (offset != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: offset %zu: it must be 0 (all of the physical memory is "
                         "mapped)", api, offset);
    if (flags != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 ": they are reserved and must be 0", api,
                         flags);
    uintptr_t p = (uintptr_t)virPtr;
    pthread_mutex_lock(&g_lock);
    phys_t *phys = lookup(handle);
    reservation_t *r = reservation_at(p);
    ptrdiff_t before = find_start(g_maps, g_map_count, sizeof *g_maps, p + size - 1);
    int err = ACL_SUCCESS;
    if (phys == NULL)
        err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: %p is not physical memory from aclrtMallocPhysical or "
                        "aclrtMemImportFromShareableHandle (or it was freed)", api, handle);
    else if (size != phys->size)
        err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: size %zu is not the size of the physical memory (%llu, as "
                        "aclrtMallocPhysical got it)", api, size, (unsigned long long)phys->size);
    else if (size % phys->granule != 0)
        err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: size %zu is not a multiple of the memory's granularity (%llu "
                        "bytes: aclrtMemGetAllocationGranularity)", api, size, (unsigned long long)phys->granule);
    else if (p % phys->granule != 0)
        err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: virPtr %p is not a multiple of the memory's granularity (%llu "
                        "bytes)", api, virPtr, (unsigned long long)phys->granule);
    else if (r == NULL || size > r->start + r->size - p)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the %zu bytes at %p are not inside one reservation "
                        "(aclrtReserveMemAddress)", api, size, virPtr);
    else if (before >= 0 && g_maps[before].start + g_maps[before].size > p)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the %zu bytes at %p overlap the mapping at %p: aclrtUnmapMem "
                        "it first", api, size, virPtr, (void *)g_maps[before].start);
    else if (r->maps > 0 && r->device != phys->device)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the reservation at %p maps memory of device %d: it cannot map "
                        "two devices' memory at once (this is device %d's)", api, (void *)r->start, r->device,
                        phys->device);
    else if (r->maps > 0 && r->imported != phys->imported)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the reservation at %p maps memory %s: it cannot map memory of "
                        "aclrtMallocPhysical and of aclrtMemImportFromShareableHandle at once", api, (void *)r->start,
                        r->imported ? "imported from another process" : "of this process");
    else if (!grow((void **)&g_maps, &g_map_capacity, g_map_count, sizeof *g_maps))
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    else if (mmap(virPtr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, phys->fd, (off_t)phys->offset) ==
             MAP_FAILED) {
        int saved = errno;
        make_reserved(p, size); /* a failed MAP_FIXED may have left the pages unmapped */
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: mapping %zu bytes at %p failed: %s", api, size, virPtr,
                        strerror(saved));
    }
    if (err == ACL_SUCCESS) {
        size_t at = (size_t)(before + 1);
        memmove(&g_maps[at + 1], &g_maps[at], (g_map_count - at) * sizeof *g_maps);
        g_maps[at] = (mapping_t){p, size, phys};
        g_map_count++;
        phys->maps++;
        r->maps++;
        r->device = phys->device;
        r->imported = phys->imported;
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

SIM_EXPORT aclError aclrtUnmapMem(void *virPtr)
{
    static const char *api = "aclrtUnmapMem";
    if (virPtr == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: virPtr is NULL", api);
    uintptr_t p = (uintptr_t)virPtr;
    pthread_mutex_lock(&g_lock);
    ptrdiff_t m = mapping_at(p);
    int err = ACL_SUCCESS;
    if (m < 0)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: %s %p", api, reservation_at(p) != NULL ? "nothing is mapped at"
                        : "no address space was reserved (aclrtReserveMemAddress) at", virPtr);
    else if (g_maps[m].start != p)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: %p is inside the mapping at %p: unmap it by the address "
                        "aclrtMapMem took", api, virPtr, (void *)g_maps[m].start);
    else if (!make_reserved(p, g_maps[m].size))
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: unmapping %p failed: %s", api, virPtr, strerror(errno));
    else
        remove_mapping((size_t)m);
    pthread_mutex_unlock(&g_lock);
    return err;
}

/* ------------------------------------------------------------------ sharing */

SIM_EXPORT aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, aclrtMemHandleType handleType,
                                                    uint64_t flags, uint64_t *shareableHandle)
{
    static const char *api = "aclrtMemExportToShareableHandle";
    if (handle == NULL || shareableHandle == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", api, handle == NULL ? "handle" : "shareableHandle");
    if (handleType != ACL_MEM_HANDLE_TYPE_NONE)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handleType %d is not ACL_MEM_HANDLE_TYPE_NONE (0)", api,
                         (int)handleType);
    if (flags > ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: flags 0x%" PRIx64 " are neither ACL_RT_VMM_EXPORT_FLAG_DEFAULT "
                         "(0) nor ..._DISABLE_PID_VALIDATION (1)", api, flags);
    pthread_mutex_lock(&g_lock);
    sweep_orphans();
    phys_t *phys = lookup(handle);
    int err = ACL_SUCCESS;
    if (phys == NULL)
        err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: %p is not physical memory from aclrtMallocPhysical (or it "
                        "was freed)", api, handle);
    else if (phys->imported)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the memory was imported from another process: only the "
                        "process that allocated it exports it", api);
    else if (phys->shareable != 0)
        err = sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: the memory is exported already (as 0x%" PRIx64 "): one "
                        "shareable handle per physical allocation", api, phys->shareable);
    else
        err = ensure_table(api);
    if (err != ACL_SUCCESS) {
        pthread_mutex_unlock(&g_lock);
        return err;
    }
    table_lock(g_table);
    int s = 0;
    while (s < MAX_EXPORTS && g_table->slots[s].state != SLOT_FREE)
        s++;
    if (s == MAX_EXPORTS) {
        pthread_mutex_unlock(&g_table->lock);
        pthread_mutex_unlock(&g_lock);
        return sim_error(ACL_ERROR_RT_OVER_LIMIT, "%s: this process has %d exports, as many as it can have at once",
                         api, MAX_EXPORTS);
    }
    export_slot_t *slot = &g_table->slots[s];
    uint32_t generation = (slot->generation + 1) & 0xFFFF;
    slot->generation = generation != 0 ? generation : 1;
    slot->check_pids = flags == ACL_RT_VMM_EXPORT_FLAG_DEFAULT;
    slot->npids = 0;
    memset(slot->importers, 0, sizeof slot->importers);
    slot->arena = phys->arena;
    slot->offset = phys->offset;
    slot->bytes = phys->bytes;
    slot->size = phys->size;
    slot->granule = phys->granule;
    slot->device = phys->device;
    slot->state = SLOT_LIVE;
    pthread_mutex_unlock(&g_table->lock);
    phys->slot = s;
    phys->shareable = shareable_of(s, slot->generation);
    *shareableHandle = phys->shareable;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum)
{
    static const char *api = "aclrtMemSetPidToShareableHandle";
    if (pid == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: pid is NULL", api);
    if (pidNum == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: pidNum must be at least 1", api);
    if (pidNum > MAX_PIDS)
        return sim_error(ACL_ERROR_RT_OVER_LIMIT, "%s: %zu processes are more than the %d an export lists", api,
                         pidNum, MAX_PIDS);
    for (size_t i = 0; i < pidNum; i++)
        if (pid[i] <= 0)
            return sim_error(ACL_ERROR_INVALID_PARAM, "%s: pid[%zu] = %d is not a process id", api, i, (int)pid[i]);
    pthread_mutex_lock(&g_lock);
    if (g_table == NULL) {
        pthread_mutex_unlock(&g_lock);
        return sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: 0x%" PRIx64 " is not a shareable handle this process "
                         "exported (it exported none)", api, shareableHandle);
    }
    table_lock(g_table);
    export_slot_t *slot = own_slot(shareableHandle);
    int err = ACL_SUCCESS;
    if (slot == NULL)
        err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: 0x%" PRIx64 " is not a shareable handle this process "
                        "exported (or its memory was freed)", api, shareableHandle);
    else if (pidNum > MAX_PIDS - slot->npids)
        err = sim_error(ACL_ERROR_RT_OVER_LIMIT, "%s: %zu more processes than the %d an export lists (%u listed)", api,
                        pidNum, MAX_PIDS, (unsigned)slot->npids);
    else
        for (size_t i = 0; i < pidNum; i++)
            slot->pids[slot->npids++] = pid[i];
    pthread_mutex_unlock(&g_table->lock);
    pthread_mutex_unlock(&g_lock);
    return err;
}

static bool listed(const export_slot_t *slot, int32_t self)
{
    for (uint32_t i = 0; i < slot->npids && i < MAX_PIDS; i++)
        if (slot->pids[i] == self)
            return true;
    return false;
}

SIM_EXPORT aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId,
                                                      aclrtDrvMemHandle *handle)
{
    static const char *api = "aclrtMemImportFromShareableHandle";
    if (handle == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handle is NULL", api);
    int err = sim_device_check(deviceId);
    if (err != ACL_SUCCESS)
        return err;
    shareable_t s = decode(shareableHandle);
    int32_t self = (int32_t)getpid();
    if (s.pid == self)
        return sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: 0x%" PRIx64 " was exported by this process: export and "
                         "import are for two processes (this one has the memory's own handle)", api, shareableHandle);
    if (s.pid <= 0 || s.slot >= MAX_EXPORTS)
        return sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: 0x%" PRIx64 " is not a shareable handle "
                         "(aclrtMemExportToShareableHandle)", api, shareableHandle);
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_handle_count; i++) {
        phys_t *other = g_handles[i].phys;
        if (other != NULL && other->imported && other->shareable == shareableHandle) {
            pthread_mutex_unlock(&g_lock);
            return sim_error(ACL_ERROR_RT_PARAM_INVALID, "%s: 0x%" PRIx64 " is imported in this process already (as "
                             "%p): one handle per shareable handle", api, shareableHandle,
                             (void *)(uintptr_t)other->handle);
        }
    }
    /* The exporter's table, through its descriptor: this works while the exporter lives. */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", s.pid, s.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    export_table_t *table = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof *table)
        table = mmap(NULL, sizeof *table, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (table == MAP_FAILED || table->magic != TABLE_MAGIC || table->pid != s.pid) {
        if (table != MAP_FAILED)
            munmap(table, sizeof *table);
        pthread_mutex_unlock(&g_lock);
        return sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: 0x%" PRIx64 " names no exported memory: its process (%d) "
                         "has ended, or it is not a shareable handle", api, shareableHandle, s.pid);
    }
    table_lock(table);
    export_slot_t *slot = &table->slots[s.slot];
    int importer = -1;
    if (slot->state != SLOT_LIVE || (slot->generation & 0xFFFF) != s.generation)
        err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: 0x%" PRIx64 " names no exported memory: process %d freed "
                        "it", api, shareableHandle, s.pid);
    else if (slot->check_pids && !listed(slot, self))
        err = sim_error(ACL_ERROR_RT_NO_PERMISSION, "%s: process %d does not let this process (%d) import 0x%" PRIx64
                        ": it lists the processes that may with aclrtMemSetPidToShareableHandle (or exports with "
                        "ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION)", api, s.pid, self, shareableHandle);
    for (int i = 0; err == ACL_SUCCESS && i < MAX_IMPORTERS && importer < 0; i++)
        if (!importer_alive(&slot->importers[i]))
            importer = i;
    if (err == ACL_SUCCESS && importer < 0)
        err = sim_error(ACL_ERROR_RT_OVER_LIMIT, "%s: 0x%" PRIx64 " is imported by %d processes, as many as an export "
                        "takes", api, shareableHandle, MAX_IMPORTERS);
    phys_t *phys = err == ACL_SUCCESS ? calloc(1, sizeof *phys) : NULL;
    if (err == ACL_SUCCESS && phys == NULL)
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    if (err == ACL_SUCCESS) {
        slot->importers[importer].pid = self;
        slot->importers[importer].start = sim_process_start_time(self);
        phys->device = deviceId;
        phys->size = slot->size;
        phys->bytes = slot->bytes;
        phys->granule = slot->granule;
        phys->offset = slot->offset;
        phys->imported = true;
        phys->shareable = shareableHandle;
        phys->slot = s.slot;
        phys->table = table;
        phys->importer = importer;
        phys->generation = slot->generation;
    }
    sim_arena_loc_t arena = slot->arena;
    pthread_mutex_unlock(&table->lock);
    if (err == ACL_SUCCESS) {
        /* The exporter's device memory, to map the block from: sim_arena_map checks that the
         * descriptor still holds the arena the export names. */
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)arena.pid, (int)arena.fd);
        phys->fd = -1;
        if (sim_arena_map(&arena) != NULL) {
            phys->fd = open(path, O_RDWR | O_CLOEXEC);
            sim_arena_unmap(&arena);
        }
        if (phys->fd < 0)
            err = sim_error(ACL_ERROR_RT_INVALID_HANDLE, "%s: the device memory of process %d that 0x%" PRIx64
                            " names is gone", api, (int)arena.pid, shareableHandle);
        else if (!new_handle(phys))
            err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
        if (err != ACL_SUCCESS) {
            leave_import(phys); /* our entry goes, the descriptor and the table too */
            free(phys);
        }
    } else {
        munmap(table, sizeof *table);
    }
    if (err == ACL_SUCCESS)
        *handle = (aclrtDrvMemHandle)(uintptr_t)phys->handle;
    pthread_mutex_unlock(&g_lock);
    return err;
}
