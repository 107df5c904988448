/*
 * Virtual memory, from C: aclrtReserveMemAddress / aclrtReleaseMemAddress, aclrtMallocPhysical /
 * aclrtFreePhysical, aclrtMapMem / aclrtUnmapMem, aclrtMemGetAllocationGranularity and physical
 * memory shared between processes (aclrtMemExportToShareableHandle,
 * aclrtMemSetPidToShareableHandle, aclrtMemImportFromShareableHandle), with four processes:
 *
 *   - the main process: granularities, reservations, physical memory and mappings with the codes
 *     of bad arguments and wrong orders; copies, memsets and a one-rank HCCL operation on mapped
 *     addresses; one physical allocation at two addresses; aclrtResetDevice taking the physical
 *     memory with it. It exports physical memory to the importer;
 *   - the importer: refused until the exporter lists it, then maps the exporter's memory, reads
 *     what the exporter wrote and writes what the exporter reads; it keeps memory the exporter
 *     freed until it frees it itself;
 *   - two ranks: an HcclAllReduce whose buffers are mapped virtual memory, across processes.
 *
 * usage: virtual_memory     (prints "virtual_memory: N checks OK" and "RESULT: PASS", or the failures)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hccl/hccl.h>

#define MIB (1ULL << 20)
#define GRANULE (2 * MIB)

static int checks, failures;
static const char *who = "main";

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
#define CODE(call, code) EXPECT((call) == (code), "%s is not %s", #call, #code)

/* One message between two processes: a fixed-size record over a pipe. */
typedef struct {
    int32_t pid;
    uint64_t shareable[3];
    char root[sizeof(HcclRootInfo)];
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
        printf("virtual_memory (%s): %d of %d checks failed\n", who, failures, checks);
        return 1;
    }
    return 0;
}

static aclrtPhysicalMemProp prop_of(int device, aclrtMemAttr attr)
{
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.memAttr = attr;
    prop.location.id = (uint32_t)device;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    return prop;
}

/* Reserves `size` bytes, allocates as much physical memory on `device` and maps it there. */
static void *mapped_memory(int device, size_t size, aclrtDrvMemHandle *handle)
{
    void *va = NULL;
    aclrtPhysicalMemProp prop = prop_of(device, ACL_HBM_MEM_HUGE);
    OK(aclrtReserveMemAddress(&va, size, 0, NULL, 0));
    OK(aclrtMallocPhysical(handle, size, &prop, 0));
    OK(aclrtMapMem(va, size, 0, *handle, 0));
    return va;
}

static void release_memory(void *va, aclrtDrvMemHandle handle)
{
    OK(aclrtUnmapMem(va));
    OK(aclrtFreePhysical(handle));
    OK(aclrtReleaseMemAddress(va));
}

/* ---- granularities ------------------------------------------------------------------------- */

static void granularity(void)
{
    size_t g = 0;
    aclrtPhysicalMemProp prop = prop_of(0, ACL_HBM_MEM_HUGE);
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    EXPECT(g == GRANULE, "minimum granularity %zu", g);
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g));
    EXPECT(g == GRANULE, "recommended granularity %zu", g);
    prop.memAttr = ACL_MEM_NORMAL;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    EXPECT(g == GRANULE, "normal pages come in %zu bytes", g);
    prop.memAttr = ACL_MEM_HUGE1G;
    OK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    EXPECT(g == 1024 * MIB, "1 GiB pages: %zu", g);

    prop.memAttr = ACL_HBM_MEM_HUGE;
    CODE(aclrtMemGetAllocationGranularity(NULL, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, NULL), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF, &g), ACL_ERROR_INVALID_PARAM);
    prop.memAttr = ACL_DDR_MEM_HUGE; /* host memory */
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g), ACL_ERROR_INVALID_PARAM);
    prop.memAttr = (aclrtMemAttr)99;
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g), ACL_ERROR_INVALID_PARAM);
    prop = prop_of(9999, ACL_HBM_MEM_HUGE);
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
         ACL_ERROR_RT_INVALID_DEVICEID);
    prop = prop_of(0, ACL_HBM_MEM_HUGE);
    prop.location.type = ACL_MEM_LOCATION_TYPE_HOST; /* host physical memory is not simulated */
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g),
         ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    prop.location.type = ACL_MEM_LOCATION_TYPE_UNREGISTERED;
    CODE(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g), ACL_ERROR_INVALID_PARAM);
}

/* ---- reservations ---------------------------------------------------------------------------- */

static void reservations(void)
{
    void *va = NULL;
    CODE(aclrtReserveMemAddress(NULL, GRANULE, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtReserveMemAddress(&va, 0, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtReserveMemAddress(&va, GRANULE, 4096, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtReserveMemAddress(&va, GRANULE, 0, NULL, 2), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtReserveMemAddress(&va, (size_t)-1, 0, NULL, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);

    OK(aclrtReserveMemAddress(&va, 3 * MIB, 0, NULL, 1)); /* rounded up to 4 MiB; flags 1: the page type */
    EXPECT(va != NULL && (uintptr_t)va % GRANULE == 0, "a reservation starts on the granularity: %p", va);
    /* Reserved, nothing mapped: no copy, memset or registration touches it. */
    char host[64] = {0};
    CODE(aclrtMemcpy(va, sizeof host, host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemcpy(va, sizeof host, host, sizeof host, ACL_MEMCPY_DEFAULT), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemset(va, 64, 0, 64), ACL_ERROR_INVALID_PARAM);
    aclrtPtrAttributes attributes;
    OK(aclrtPointerGetAttributes(va, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_UNREGISTERED, "unmapped: location %d",
           (int)attributes.location.type);
    CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    CODE(aclrtReleaseMemAddress((char *)va + GRANULE), ACL_ERROR_RT_PARAM_INVALID); /* not its start */
    CODE(aclrtReleaseMemAddress(NULL), ACL_ERROR_INVALID_PARAM);
    OK(aclrtReleaseMemAddress(va));
    CODE(aclrtReleaseMemAddress(va), ACL_ERROR_RT_PARAM_INVALID);

    /* An address of the caller's choice, in [16 TiB, 24 TiB) and on the granularity. */
    void *wanted = (void *)(uintptr_t)(17ULL << 40);
    OK(aclrtReserveMemAddress(&va, GRANULE, 0, wanted, 0));
    EXPECT(va == wanted, "reserved at %p, not at %p", va, wanted);
    void *again = NULL;
    CODE(aclrtReserveMemAddress(&again, GRANULE, 0, wanted, 0), ACL_ERROR_RT_PARAM_INVALID); /* in use */
    OK(aclrtReleaseMemAddress(va));
    CODE(aclrtReserveMemAddress(&va, GRANULE, 0, (void *)(uintptr_t)(1ULL << 40), 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtReserveMemAddress(&va, GRANULE, 0, (char *)wanted + 4096, 0), ACL_ERROR_INVALID_PARAM);
}

/* ---- physical memory and mappings -------------------------------------------------------------- */

static void mappings(void)
{
    aclrtPhysicalMemProp prop = prop_of(0, ACL_HBM_MEM_HUGE);
    aclrtDrvMemHandle a = NULL, b = NULL, other = NULL;
    CODE(aclrtMallocPhysical(NULL, GRANULE, &prop, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMallocPhysical(&a, GRANULE, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMallocPhysical(&a, 0, &prop, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMallocPhysical(&a, GRANULE, &prop, 1), ACL_ERROR_INVALID_PARAM);
    prop.handleType = (aclrtMemHandleType)1;
    CODE(aclrtMallocPhysical(&a, GRANULE, &prop, 0), ACL_ERROR_INVALID_PARAM);
    prop = prop_of(0, ACL_HBM_MEM_HUGE);
    prop.allocationType = (aclrtMemAllocationType)1;
    CODE(aclrtMallocPhysical(&a, GRANULE, &prop, 0), ACL_ERROR_INVALID_PARAM);
    prop = prop_of(0, ACL_HBM_MEM_HUGE);
    CODE(aclrtMallocPhysical(&a, (size_t)1 << 62, &prop, 0), ACL_ERROR_RT_MEMORY_ALLOCATION);

    size_t free_before = 0, free_after = 0, total = 0;
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_before, &total));
    OK(aclrtMallocPhysical(&a, 2 * GRANULE, &prop, 0));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_after, &total));
    EXPECT(free_before - free_after == 2 * GRANULE, "physical memory is device memory: %zu bytes fewer free",
           free_before - free_after);
    OK(aclrtMallocPhysical(&b, GRANULE, &prop, 0));
    OK(aclrtMallocPhysical(&other, 3 * MIB, &prop, 0)); /* allocated in 4 MiB, never mappable */

    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 8 * GRANULE, 0, NULL, 0));
    char *base = va;
    CODE(aclrtMapMem(NULL, 2 * GRANULE, 0, a, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMapMem(base, 2 * GRANULE, 0, NULL, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMapMem(base, 2 * GRANULE, 4096, a, 0), ACL_ERROR_INVALID_PARAM);   /* offset must be 0 */
    CODE(aclrtMapMem(base, 2 * GRANULE, 0, a, 1), ACL_ERROR_INVALID_PARAM);      /* flags must be 0 */
    CODE(aclrtMapMem(base, GRANULE, 0, a, 0), ACL_ERROR_INVALID_PARAM);          /* not its size */
    CODE(aclrtMapMem(base, 3 * MIB, 0, other, 0), ACL_ERROR_INVALID_PARAM);      /* not on the granularity */
    CODE(aclrtMapMem(base + 4096, 2 * GRANULE, 0, a, 0), ACL_ERROR_INVALID_PARAM); /* address off it */
    CODE(aclrtMapMem(base + 7 * GRANULE, 2 * GRANULE, 0, a, 0), ACL_ERROR_RT_PARAM_INVALID); /* past the end */
    CODE(aclrtMapMem(base, 2 * GRANULE, 0, (aclrtDrvMemHandle)(uintptr_t)0x12345A, 0), ACL_ERROR_RT_INVALID_HANDLE);
    char outside[64];
    CODE(aclrtMapMem(outside, 2 * GRANULE, 0, a, 0), ACL_ERROR_INVALID_PARAM);   /* off the granularity */

    /* a at [0, 4 MiB), b right after it: one range of addresses for copies. */
    OK(aclrtMapMem(base, 2 * GRANULE, 0, a, 0));
    CODE(aclrtMapMem(base + GRANULE, GRANULE, 0, b, 0), ACL_ERROR_RT_PARAM_INVALID); /* over a mapping */
    OK(aclrtMapMem(base + 2 * GRANULE, GRANULE, 0, b, 0));
    size_t bytes = 3 * GRANULE;
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)(i * 13 + 1);
    OK(aclrtMemcpy(base, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    memset(back, 0, bytes);
    OK(aclrtMemcpy(back, bytes, base, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(memcmp(host, back, bytes) == 0, "a copy across two mappings comes back");
    CODE(aclrtMemcpy(back, bytes + 1, base, bytes + 1, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM);
    OK(aclrtMemset(base + GRANULE, GRANULE, 0x7E, GRANULE));
    OK(aclrtMemcpy(back, 16, base + 2 * GRANULE - 8, 16, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(back[0] == 0x7E && back[7] == 0x7E && back[8] == host[2 * GRANULE], "memset: %d %d %d", back[0], back[7],
           back[8]);
    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    OK(aclrtMemcpyAsync(base + 100, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream));
    OK(aclrtMemsetAsync(base + 2 * GRANULE, 64, 0x11, 64, stream));
    OK(aclrtSynchronizeStream(stream));
    OK(aclrtMemcpy(back, 64, base + 2 * GRANULE, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(back[0] == 0x11 && back[63] == 0x11, "memset on a stream: %d", back[0]);
    aclrtPtrAttributes attributes;
    OK(aclrtPointerGetAttributes(base + 5, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_DEVICE && attributes.location.id == 0,
           "mapped memory is device 0's: type %d id %u", (int)attributes.location.type, attributes.location.id);
    void *registered = NULL;
    CODE(aclrtHostRegister(base, 4096, ACL_HOST_REGISTER_MAPPED, &registered), ACL_ERROR_INVALID_PARAM);

    /* One physical allocation at two addresses: the same bytes. Here b comes before a, which
     * was allocated first: in device memory b does not end where a begins. */
    char *second = NULL;
    OK(aclrtReserveMemAddress((void **)&second, 3 * GRANULE, 0, NULL, 0));
    OK(aclrtMapMem(second, GRANULE, 0, b, 0));
    OK(aclrtMapMem(second + GRANULE, 2 * GRANULE, 0, a, 0));
    OK(aclrtMemset(second, 16, 0x42, 16));
    OK(aclrtMemcpy(back, 16, base + 2 * GRANULE, 16, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(back[0] == 0x42 && back[15] == 0x42, "two mappings of one allocation share its bytes: %d", back[0]);
    OK(aclrtMemcpy(back, 32, second + GRANULE - 16, 32, ACL_MEMCPY_DEVICE_TO_HOST)); /* a copy takes b then a */
    EXPECT(back[16] == host[0], "a at its second address: %d, not %d", back[16], host[0]);

    /* An HCCL operation on mapped memory (one rank): inside one physical allocation it works; a
     * buffer over two allocations that are not next to each other in device memory is refused. */
    HcclRootInfo root;
    HcclComm comm = NULL;
    EXPECT(HcclGetRootInfo(&root) == HCCL_SUCCESS, "HcclGetRootInfo");
    EXPECT(HcclCommInitRootInfo(1, &root, 0, &comm) == HCCL_SUCCESS, "HcclCommInitRootInfo");
    float values[4] = {1.5f, 2.5f, -3.0f, 4.0f}, sums[4] = {0};
    OK(aclrtMemcpy(base, sizeof values, values, sizeof values, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT(HcclAllReduce(base, base + 4096, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream) == HCCL_SUCCESS,
           "HcclAllReduce on mapped memory");
    OK(aclrtSynchronizeStream(stream));
    OK(aclrtMemcpy(sums, sizeof sums, base + 4096, sizeof sums, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(sums[0] == 1.5f && sums[3] == 4.0f, "one rank's sum is its input: %g %g", sums[0], sums[3]);
    uint64_t spanning = GRANULE / sizeof(float); /* from the middle of b into a, at the second addresses */
    EXPECT(HcclAllReduce(second + GRANULE / 2, base + 4096, spanning, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                         stream) == HCCL_E_PARA, "a buffer over two allocations apart in device memory");
    EXPECT(strstr(aclGetRecentErrMsg(), "not next to each other") != NULL, "the message says why: %s",
           aclGetRecentErrMsg());
    EXPECT(HcclAllReduce(base + 2 * GRANULE, base, 1, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream)
           == HCCL_SUCCESS, "inside b");
    OK(aclrtSynchronizeStream(stream));
    EXPECT(HcclAllReduce(base + 4 * GRANULE, base, 1, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream)
           == HCCL_E_PTR, "nothing mapped there");
    EXPECT(HcclCommDestroy(comm) == HCCL_SUCCESS, "HcclCommDestroy");

    /* The order: unmap, free, release; each step out of order is refused. */
    CODE(aclrtFreePhysical(a), ACL_ERROR_RT_PARAM_INVALID);       /* still mapped */
    CODE(aclrtReleaseMemAddress(base), ACL_ERROR_RT_PARAM_INVALID); /* has mappings */
    CODE(aclrtUnmapMem(base + GRANULE), ACL_ERROR_RT_PARAM_INVALID); /* inside a mapping */
    CODE(aclrtUnmapMem(NULL), ACL_ERROR_INVALID_PARAM);
    OK(aclrtUnmapMem(base));
    CODE(aclrtUnmapMem(base), ACL_ERROR_RT_PARAM_INVALID);
    CODE(aclrtMemcpy(back, 16, base, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM); /* unmapped again */
    OK(aclrtMemcpy(back, 16, base + 2 * GRANULE, 16, ACL_MEMCPY_DEVICE_TO_HOST));              /* b still is */
    CODE(aclrtFreePhysical(a), ACL_ERROR_RT_PARAM_INVALID); /* mapped at its second address */
    CODE(aclrtFreePhysical(NULL), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtFreePhysical(b), ACL_ERROR_RT_PARAM_INVALID); /* mapped twice */
    OK(aclrtUnmapMem(second));
    CODE(aclrtReleaseMemAddress(second), ACL_ERROR_RT_PARAM_INVALID); /* a is still mapped there */
    OK(aclrtUnmapMem(second + GRANULE));
    OK(aclrtReleaseMemAddress(second));
    CODE(aclrtFreePhysical(b), ACL_ERROR_RT_PARAM_INVALID); /* mapped once */
    OK(aclrtFreePhysical(a));
    CODE(aclrtFreePhysical(a), ACL_ERROR_RT_INVALID_HANDLE);
    OK(aclrtUnmapMem(base + 2 * GRANULE));
    OK(aclrtFreePhysical(b));
    OK(aclrtFreePhysical(other));
    OK(aclrtReleaseMemAddress(base));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_after, &total));
    EXPECT(free_after == free_before, "everything freed: %zu of %zu bytes free", free_after, free_before);

    /* One reservation maps one device's memory at a time. */
    aclrtPhysicalMemProp on1 = prop_of(1, ACL_HBM_MEM_HUGE);
    OK(aclrtReserveMemAddress(&va, 2 * GRANULE, 0, NULL, 0));
    OK(aclrtMallocPhysical(&a, GRANULE, &prop, 0));
    OK(aclrtMallocPhysical(&b, GRANULE, &on1, 0));
    OK(aclrtMapMem(va, GRANULE, 0, a, 0));
    CODE(aclrtMapMem((char *)va + GRANULE, GRANULE, 0, b, 0), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtUnmapMem(va));
    OK(aclrtMapMem((char *)va + GRANULE, GRANULE, 0, b, 0)); /* with a gone, device 1's is fine */
    OK(aclrtPointerGetAttributes((char *)va + GRANULE, &attributes));
    EXPECT(attributes.location.id == 1, "device 1's memory: id %u", attributes.location.id);
    OK(aclrtUnmapMem((char *)va + GRANULE));
    OK(aclrtFreePhysical(a));
    OK(aclrtFreePhysical(b));
    OK(aclrtReleaseMemAddress(va));
    OK(aclrtDestroyStream(stream));
    free(host);
    free(back);
}

/* ---- aclrtResetDevice takes physical memory with it -------------------------------------------- */

static void reset(void)
{
    OK(aclrtSetDevice(2));
    aclrtDrvMemHandle handle = NULL;
    void *va = mapped_memory(2, GRANULE, &handle);
    OK(aclrtMemset(va, 64, 1, 64));
    OK(aclrtResetDevice(2));
    CODE(aclrtFreePhysical(handle), ACL_ERROR_RT_INVALID_HANDLE);
    CODE(aclrtMemset(va, 64, 1, 64), ACL_ERROR_INVALID_PARAM); /* unmapped with it */
    CODE(aclrtUnmapMem(va), ACL_ERROR_RT_PARAM_INVALID);
    OK(aclrtReleaseMemAddress(va)); /* the reservation stays the caller's */
}

/* ---- sharing between processes ------------------------------------------------------------------ */

static int importer(int in, int out)
{
    who = "importer";
    alarm(60);
    OK(aclInit(NULL));
    OK(aclrtSetDevice(1)); /* another device than the exporter's */
    message_t m = {0};
    m.pid = (int32_t)getpid();
    put(out, &m);
    message_t handles = get(in);
    aclrtDrvMemHandle handle = NULL;
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[0], 1, &handle), ACL_ERROR_RT_NO_PERMISSION);
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[0], 1, NULL), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[0], 999, &handle), ACL_ERROR_RT_INVALID_DEVICEID);
    CODE(aclrtMemImportFromShareableHandle(0x123456789ULL, 1, &handle), ACL_ERROR_RT_INVALID_HANDLE);
    put(out, &m); /* refused */
    get(in);      /* listed now */
    OK(aclrtMemImportFromShareableHandle(handles.shareable[0], 1, &handle));
    aclrtDrvMemHandle twice = NULL;
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[0], 1, &twice), ACL_ERROR_RT_PARAM_INVALID);
    CODE(aclrtMemExportToShareableHandle(handle, ACL_MEM_HANDLE_TYPE_NONE, 0, &m.shareable[0]),
         ACL_ERROR_RT_PARAM_INVALID); /* only the process that allocated it exports it */
    void *va = NULL;
    OK(aclrtReserveMemAddress(&va, 2 * GRANULE, 0, NULL, 0));
    CODE(aclrtMapMem(va, GRANULE, 0, handle, 0), ACL_ERROR_INVALID_PARAM); /* not its size */
    OK(aclrtMapMem(va, 2 * GRANULE, 0, handle, 0));
    unsigned char seen[64];
    OK(aclrtMemcpy(seen, 64, (char *)va + GRANULE, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(seen[0] == 0xA5 && seen[63] == 0xA5, "the importer reads the exporter's bytes: %d", seen[0]);
    aclrtPtrAttributes attributes;
    OK(aclrtPointerGetAttributes(va, &attributes));
    EXPECT(attributes.location.type == ACL_MEM_LOCATION_TYPE_DEVICE && attributes.location.id == 1,
           "imported memory is the importing device's: %u", attributes.location.id);
    OK(aclrtMemset(va, 64, 0x3C, 64));
    /* HCCL operations take this process's own device memory only. */
    HcclRootInfo root;
    HcclComm comm = NULL;
    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    EXPECT(HcclGetRootInfo(&root) == HCCL_SUCCESS && HcclCommInitRootInfo(1, &root, 0, &comm) == HCCL_SUCCESS,
           "a one-rank communicator");
    EXPECT(HcclAllReduce(va, va, 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream) == HCCL_E_PTR,
           "no HCCL operation on imported memory");
    EXPECT(HcclCommDestroy(comm) == HCCL_SUCCESS, "HcclCommDestroy");
    OK(aclrtDestroyStream(stream));
    put(out, &m); /* written */

    /* Imported without the list of processes; the exporter frees it while this process holds it. */
    aclrtDrvMemHandle kept = NULL;
    OK(aclrtMemImportFromShareableHandle(handles.shareable[1], 1, &kept));
    void *kept_va = NULL;
    OK(aclrtReserveMemAddress(&kept_va, GRANULE, 0, NULL, 0));
    CODE(aclrtMapMem(kept_va, GRANULE, 0, handle, 0), ACL_ERROR_INVALID_PARAM); /* not its size: 4 MiB */
    OK(aclrtMapMem(kept_va, GRANULE, 0, kept, 0));
    put(out, &m);
    get(in); /* freed by the exporter */
    OK(aclrtMemcpy(seen, 64, kept_va, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(seen[0] == 0x66 && seen[63] == 0x66, "memory the exporter freed stays while imported: %d", seen[0]);
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[2], 1, &twice), ACL_ERROR_RT_INVALID_HANDLE); /* freed */
    release_memory(kept_va, kept);
    CODE(aclrtUnmapMem((char *)va + GRANULE), ACL_ERROR_RT_PARAM_INVALID);
    CODE(aclrtFreePhysical(handle), ACL_ERROR_RT_PARAM_INVALID);
    release_memory(va, handle);
    put(out, &m); /* let go */
    OK(aclrtResetDevice(1));
    OK(aclFinalize());
    return finish();
}

/* ---- an HcclAllReduce on mapped memory, across processes --------------------------------------- */

static int rank(int me, int in, int out)
{
    who = me == 0 ? "rank 0" : "rank 1";
    alarm(60);
    OK(aclInit(NULL));
    OK(aclrtSetDevice(me));
    message_t m = {0};
    if (me == 0) {
        EXPECT(HcclGetRootInfo((HcclRootInfo *)m.root) == HCCL_SUCCESS, "HcclGetRootInfo");
        put(out, &m);
    } else {
        m = get(in);
    }
    /* Input and output are two physical allocations in one reservation, the output first. */
    const uint64_t count = GRANULE / sizeof(float);
    void *va = NULL;
    aclrtDrvMemHandle in_handle = NULL, out_handle = NULL;
    aclrtPhysicalMemProp prop = prop_of(me, ACL_HBM_MEM_HUGE);
    OK(aclrtReserveMemAddress(&va, 2 * GRANULE, 0, NULL, 0));
    OK(aclrtMallocPhysical(&out_handle, GRANULE, &prop, 0));
    OK(aclrtMallocPhysical(&in_handle, GRANULE, &prop, 0));
    char *output = va, *input = (char *)va + GRANULE;
    OK(aclrtMapMem(output, GRANULE, 0, out_handle, 0));
    OK(aclrtMapMem(input, GRANULE, 0, in_handle, 0));
    float *values = malloc(GRANULE);
    for (uint64_t i = 0; i < count; i++)
        values[i] = (float)(i % 1000) * (float)(me + 1);
    OK(aclrtMemcpy(input, GRANULE, values, GRANULE, ACL_MEMCPY_HOST_TO_DEVICE));
    aclrtStream stream = NULL;
    OK(aclrtCreateStream(&stream));
    HcclComm comm = NULL;
    EXPECT(HcclCommInitRootInfo(2, (const HcclRootInfo *)m.root, (uint32_t)me, &comm) == HCCL_SUCCESS,
           "HcclCommInitRootInfo");
    EXPECT(HcclAllReduce(input, output, count, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream) == HCCL_SUCCESS,
           "HcclAllReduce on mapped memory");
    OK(aclrtSynchronizeStream(stream));
    OK(aclrtMemcpy(values, GRANULE, output, GRANULE, ACL_MEMCPY_DEVICE_TO_HOST));
    int wrong = 0;
    for (uint64_t i = 0; i < count; i++)
        wrong += values[i] != (float)(i % 1000) * 3.0f;
    EXPECT(wrong == 0, "%d of %llu sums are wrong (the first: %g)", wrong, (unsigned long long)count, values[1]);
    EXPECT(HcclCommDestroy(comm) == HCCL_SUCCESS, "HcclCommDestroy");
    OK(aclrtDestroyStream(stream));
    OK(aclrtUnmapMem(output));
    OK(aclrtUnmapMem(input));
    OK(aclrtFreePhysical(out_handle));
    OK(aclrtFreePhysical(in_handle));
    OK(aclrtReleaseMemAddress(va));
    free(values);
    OK(aclrtResetDevice(me));
    OK(aclFinalize());
    return finish();
}

static int wait_child(pid_t pid, const char *name)
{
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s exited with status %d", name, status);
    return status;
}

int main(void)
{
    int to_importer[2], from_importer[2], ranks[2];
    if (pipe(to_importer) || pipe(from_importer) || pipe(ranks))
        return 2;
    /* The children are forked before this process uses the runtime. */
    pid_t imp = fork();
    if (imp == 0)
        return importer(to_importer[0], from_importer[1]);
    pid_t r0 = fork();
    if (r0 == 0)
        return rank(0, -1, ranks[1]);
    pid_t r1 = fork();
    if (r1 == 0)
        return rank(1, ranks[0], -1);
    alarm(80);

    OK(aclInit(NULL));
    OK(aclrtSetDevice(0));
    granularity();
    reservations();
    mappings();

    /* The exporter: memory whose importers the exporter lists, and memory any process imports. */
    aclrtDrvMemHandle listed = NULL, open_to_all = NULL, freed = NULL;
    void *va = mapped_memory(0, 2 * GRANULE, &listed);
    OK(aclrtMemset((char *)va + GRANULE, 64, 0xA5, 64));
    message_t handles = {0};
    CODE(aclrtMemExportToShareableHandle(listed, (aclrtMemHandleType)1, 0, &handles.shareable[0]),
         ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemExportToShareableHandle(listed, ACL_MEM_HANDLE_TYPE_NONE, 2, &handles.shareable[0]),
         ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemExportToShareableHandle(listed, ACL_MEM_HANDLE_TYPE_NONE, 0, NULL), ACL_ERROR_INVALID_PARAM);
    OK(aclrtMemExportToShareableHandle(listed, ACL_MEM_HANDLE_TYPE_NONE, ACL_RT_VMM_EXPORT_FLAG_DEFAULT,
                                       &handles.shareable[0]));
    uint64_t second = 0;
    CODE(aclrtMemExportToShareableHandle(listed, ACL_MEM_HANDLE_TYPE_NONE, 0, &second), ACL_ERROR_RT_PARAM_INVALID);
    aclrtDrvMemHandle own = NULL;
    CODE(aclrtMemImportFromShareableHandle(handles.shareable[0], 0, &own), ACL_ERROR_RT_PARAM_INVALID);
    void *other_va = mapped_memory(0, GRANULE, &open_to_all);
    OK(aclrtMemset(other_va, GRANULE, 0x66, GRANULE));
    OK(aclrtMemExportToShareableHandle(open_to_all, ACL_MEM_HANDLE_TYPE_NONE,
                                       ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION, &handles.shareable[1]));
    aclrtPhysicalMemProp prop = prop_of(0, ACL_HBM_MEM_HUGE);
    OK(aclrtMallocPhysical(&freed, GRANULE, &prop, 0));
    OK(aclrtMemExportToShareableHandle(freed, ACL_MEM_HANDLE_TYPE_NONE, 1, &handles.shareable[2]));
    OK(aclrtFreePhysical(freed)); /* nobody imported it: it is gone */

    message_t m = get(from_importer[0]);
    put(to_importer[1], &handles);
    get(from_importer[0]); /* refused */
    int32_t bad_pid = 0;
    CODE(aclrtMemSetPidToShareableHandle(handles.shareable[0], &m.pid, 0), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemSetPidToShareableHandle(handles.shareable[0], NULL, 1), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemSetPidToShareableHandle(handles.shareable[0], &bad_pid, 1), ACL_ERROR_INVALID_PARAM);
    CODE(aclrtMemSetPidToShareableHandle(handles.shareable[2], &m.pid, 1), ACL_ERROR_RT_INVALID_HANDLE); /* freed */
    OK(aclrtMemSetPidToShareableHandle(handles.shareable[0], &m.pid, 1));
    put(to_importer[1], &m);
    get(from_importer[0]); /* written */
    unsigned char seen[64];
    OK(aclrtMemcpy(seen, 64, va, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(seen[0] == 0x3C && seen[63] == 0x3C, "the exporter sees the importer's writes: %d", seen[0]);

    get(from_importer[0]); /* the importer maps open_to_all */
    size_t free_before = 0, free_after = 0, total = 0;
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_before, &total));
    OK(aclrtUnmapMem(other_va));
    OK(aclrtFreePhysical(open_to_all)); /* while imported: it stays allocated */
    CODE(aclrtFreePhysical(open_to_all), ACL_ERROR_RT_INVALID_HANDLE);
    OK(aclrtReleaseMemAddress(other_va));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_after, &total));
    EXPECT(free_after == free_before, "memory a live process imports is not freed yet: %zu -> %zu", free_before,
           free_after);
    put(to_importer[1], &m);
    get(from_importer[0]); /* let go */
    wait_child(imp, "the importer");
    aclrtDrvMemHandle probe = NULL;
    OK(aclrtMallocPhysical(&probe, GRANULE, &prop, 0)); /* a later call reclaims what nobody imports now */
    OK(aclrtFreePhysical(probe));
    OK(aclrtGetMemInfo(ACL_HBM_MEM, &free_after, &total));
    EXPECT(free_after == free_before + GRANULE, "freed once the importer let go: %zu -> %zu", free_before, free_after);
    release_memory(va, listed);

    reset();
    wait_child(r0, "rank 0");
    wait_child(r1, "rank 1");
    OK(aclrtResetDevice(0));
    OK(aclFinalize());
    if (finish())
        return 1;
    printf("virtual_memory: %d checks OK\nRESULT: PASS\n", checks);
    return 0;
}
