/* CANN 9.x communicator management the simulator has no data path for: memory registrations and
 * symmetric windows (bookkeeping only: every rank already reaches every peer's device memory),
 * NIC selection, configuration queries, the HCCL buffer, the heterogeneous mode, and the
 * virtual-memory range calls it does not emulate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccl/internal.h"
#include "hccl/hccl_rank_graph.h"

/* ------------------------------------------------------------ registrations
 *
 * The simulator moves data without any registration, so a registration is only a record the
 * deregistration, window lookup and exchange calls check: a handle is the address of a live
 * record, found in one list under one lock, so that a stale or foreign handle is refused. */

enum { REG_MEMORY = 1, REG_SYMWIN = 2 };

typedef struct registration {
    struct registration *next;
    int kind;               /* REG_* */
    HcclComm comm;          /* the handle it was made with (compared, never dereferenced) */
    uintptr_t addr;
    uint64_t size;
    uint32_t flag;
} registration_t;

static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static registration_t *g_regs;

/* The live record `handle` of kind `kind`, or NULL; lock held. */
static registration_t *reg_find(const void *handle, int kind)
{
    for (registration_t *r = g_regs; r != NULL; r = r->next)
        if (r == handle && r->kind == kind)
            return r;
    return NULL;
}

/* Whether `comm` has a live HcclCommRegister registration; lock held. */
static bool has_memory_registration(HcclComm comm)
{
    for (registration_t *r = g_regs; r != NULL; r = r->next)
        if (r->kind == REG_MEMORY && r->comm == comm)
            return true;
    return false;
}

/* Checks what both register calls take and records the registration in *out.  As CANN's
 * HcclCommRegister, a communicator holds one memory registration at a time, and none once its
 * HCCL buffer exists (the two are exclusive): HCCL_E_NOT_SUPPORT otherwise. */
static int reg_add(const char *api, HcclComm handle, void *addr, uint64_t size, uint32_t flag, int kind,
                   void **out)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, api, &err);
    if (comm == NULL)
        return err;
    bool has_buffer = false;
    if (kind == REG_MEMORY) {
        pthread_mutex_lock(&comm->lock);
        has_buffer = comm->hccl_buffer != NULL;
        pthread_mutex_unlock(&comm->lock);
    }
    char name[HCCL_SIM_NAME_BYTES];
    snprintf(name, sizeof name, "%s", comm->name);
    hccl_comm_unref(comm); /* only the handle is kept, checked again when it is used */
    if (addr == NULL || out == NULL)
        return hccl_error(HCCL_E_PTR, "%s: addr and the handle pointer must not be NULL", api);
    if (size == 0)
        return hccl_error(HCCL_E_PARA, "%s: size must not be 0", api);
    if ((uintptr_t)addr + size < (uintptr_t)addr)
        return hccl_error(HCCL_E_PARA, "%s: %p + %llu bytes wraps around the address space", api, addr,
                          (unsigned long long)size);
    if (has_buffer)
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: communicator '%s' has its HCCL buffer (HcclGetHcclBuffer), and "
                          "registered user memory and the HCCL buffer exclude each other", api, name);
    registration_t *reg = calloc(1, sizeof *reg);
    if (reg == NULL)
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    reg->kind = kind;
    reg->comm = handle;
    reg->addr = (uintptr_t)addr;
    reg->size = size;
    reg->flag = flag;
    pthread_mutex_lock(&g_reg_lock);
    bool taken = kind == REG_MEMORY && has_memory_registration(handle);
    if (!taken) {
        reg->next = g_regs;
        g_regs = reg;
    }
    pthread_mutex_unlock(&g_reg_lock);
    if (taken) {
        free(reg);
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: communicator '%s' already has registered memory: a communicator "
                          "holds one HcclCommRegister registration at a time (HcclCommDeregister it first)", api,
                          name);
    }
    *out = reg;
    return HCCL_SUCCESS;
}

void hccl_registrations_drop(HcclComm handle)
{
    pthread_mutex_lock(&g_reg_lock);
    for (registration_t **link = &g_regs; *link != NULL;) {
        registration_t *reg = *link;
        if (reg->comm == handle) {
            *link = reg->next;
            free(reg);
        } else {
            link = &reg->next;
        }
    }
    pthread_mutex_unlock(&g_reg_lock);
}

/* Removes and frees record `handle` of kind `kind`; `comm` (NULL: any) must be the one it was made with. */
static int reg_remove(const char *api, HcclComm comm, void *handle, int kind)
{
    if (handle == NULL)
        return hccl_error(HCCL_E_PTR, "%s: handle is NULL", api);
    int err = HCCL_SUCCESS;
    pthread_mutex_lock(&g_reg_lock);
    registration_t **link = &g_regs;
    while (*link != NULL && !(*link == handle && (*link)->kind == kind))
        link = &(*link)->next;
    registration_t *reg = *link;
    if (reg == NULL)
        err = hccl_error(HCCL_E_PARA, "%s: %p is not a live registration (never made, or already released)", api,
                         handle);
    else if (comm != NULL && reg->comm != comm)
        err = hccl_error(HCCL_E_PARA, "%s: %p was registered with communicator %p, not %p", api, handle,
                         reg->comm, comm);
    else
        *link = reg->next;
    pthread_mutex_unlock(&g_reg_lock);
    if (err == HCCL_SUCCESS)
        free(reg);
    return err;
}

HCCL_API HcclResult HcclCommRegister(HcclComm comm, void *addr, uint64_t size, void **handle, uint32_t flag)
{
    return reg_add("HcclCommRegister", comm, addr, size, flag, REG_MEMORY, handle);
}

/* As CANN's: a handle this communicator does not hold (never registered with it, or already
 * released) is no error, and nothing changes. */
HCCL_API HcclResult HcclCommDeregister(HcclComm comm, void *handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclCommDeregister", &err);
    if (c == NULL)
        return err;
    hccl_comm_unref(c);
    if (handle == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommDeregister: handle is NULL");
    pthread_mutex_lock(&g_reg_lock);
    registration_t **link = &g_regs;
    while (*link != NULL && !(*link == handle && (*link)->kind == REG_MEMORY && (*link)->comm == comm))
        link = &(*link)->next;
    registration_t *reg = *link;
    if (reg != NULL)
        *link = reg->next;
    pthread_mutex_unlock(&g_reg_lock);
    free(reg);
    return HCCL_SUCCESS;
}

/* Nothing travels: every rank already reaches its peers' device memory.  The call checks that the
 * registration and the peers are ones an exchange on real HCCL could use. */
HCCL_API HcclResult HcclCommExchangeMem(HcclComm comm, void *windowHandle, uint32_t *peerRanks, uint32_t peerRankNum)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclCommExchangeMem", &err);
    if (c == NULL)
        return err;
    if (windowHandle == NULL || (peerRankNum > 0 && peerRanks == NULL)) {
        err = hccl_error(HCCL_E_PTR, "HcclCommExchangeMem: windowHandle and peerRanks must not be NULL");
    } else if (peerRankNum == 0 || peerRankNum > c->nranks) {
        err = hccl_error(HCCL_E_PARA, "HcclCommExchangeMem: peerRankNum must be in [1, %u], got %u", c->nranks,
                         peerRankNum);
    } else {
        for (uint32_t i = 0; err == HCCL_SUCCESS && i < peerRankNum; i++)
            if (peerRanks[i] >= c->nranks)
                err = hccl_error(HCCL_E_PARA, "HcclCommExchangeMem: peerRanks[%u] = %u is not a rank of '%s' "
                                 "(%u ranks)", i, peerRanks[i], c->name, c->nranks);
    }
    if (err == HCCL_SUCCESS) {
        pthread_mutex_lock(&g_reg_lock);
        registration_t *reg = reg_find(windowHandle, REG_MEMORY);
        bool ours = reg != NULL && reg->comm == comm;
        pthread_mutex_unlock(&g_reg_lock);
        if (!ours)
            err = hccl_error(HCCL_E_NOT_FOUND, "HcclCommExchangeMem: %p is not a live HcclCommRegister handle of "
                             "this communicator (register the memory with it first)", windowHandle);
    }
    hccl_comm_unref(c);
    return err;
}

/* ------------------------------------------------------ symmetric windows */

HCCL_API HcclResult HcclCommSymWinRegister(HcclComm comm, void *addr, uint64_t size, HcclCommSymWindow *winHandle,
                                           uint32_t flag)
{
    return reg_add("HcclCommSymWinRegister", comm, addr, size, flag, REG_SYMWIN, winHandle);
}

HCCL_API HcclResult HcclCommSymWinDeregister(HcclCommSymWindow winHandle)
{
    return reg_remove("HcclCommSymWinDeregister", NULL, winHandle, REG_SYMWIN);
}

HCCL_API HcclResult HcclCommSymWinGet(HcclComm comm, void *ptr, size_t size, HcclCommSymWindow *winHandle,
                                      size_t *offset)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclCommSymWinGet", &err);
    if (c == NULL)
        return err;
    hccl_comm_unref(c);
    if (ptr == NULL || winHandle == NULL || offset == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommSymWinGet: ptr, winHandle and offset must not be NULL");
    uintptr_t start = (uintptr_t)ptr;
    registration_t *found = NULL;
    pthread_mutex_lock(&g_reg_lock);
    for (registration_t *r = g_regs; r != NULL && found == NULL; r = r->next)
        if (r->kind == REG_SYMWIN && r->comm == comm && start >= r->addr && start - r->addr <= r->size &&
            size <= r->size - (start - r->addr))
            found = r;
    if (found != NULL) {
        *winHandle = found;
        *offset = (size_t)(start - found->addr);
    }
    pthread_mutex_unlock(&g_reg_lock);
    if (found == NULL)
        return hccl_error(HCCL_E_NOT_FOUND, "HcclCommSymWinGet: no window of this communicator holds %zu bytes at "
                          "%p (register one with HcclCommSymWinRegister)", size, ptr);
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------ NIC choice */

/* The simulator has no NICs to switch between: the arguments are checked and nothing changes. */
HCCL_API HcclResult HcclCommWorkingDevNicSet(HcclComm comm, uint32_t *ranks, bool *useBackup, uint32_t nRanks)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclCommWorkingDevNicSet", &err);
    if (c == NULL)
        return err;
    if (ranks == NULL || useBackup == NULL)
        err = hccl_error(HCCL_E_PTR, "HcclCommWorkingDevNicSet: ranks and useBackup must not be NULL");
    else if (nRanks == 0 || nRanks > c->nranks)
        err = hccl_error(HCCL_E_PARA, "HcclCommWorkingDevNicSet: nRanks must be in [1, %u], got %u", c->nranks,
                         nRanks);
    for (uint32_t i = 0; err == HCCL_SUCCESS && i < nRanks; i++)
        if (ranks[i] >= c->nranks)
            err = hccl_error(HCCL_E_PARA, "HcclCommWorkingDevNicSet: ranks[%u] = %u is not a rank of '%s' (%u ranks)",
                             i, ranks[i], c->name, c->nranks);
    hccl_comm_unref(c);
    return err;
}

/* ------------------------------------------------------- configuration */

/* HcclCommConfig.hcclOpExpansionMode (0 default, 1 host, 2 AI CPU, 3 AIV, 4 AIV only, 5 CCU MS,
 * 6 CCU scheduled) as HcclConfigGetInfo numbers it.  The simulator expands every operation on
 * the host CPU, which is what the default is here. */
static HcclOpExpansionMode expansion_mode(uint32_t configured)
{
    static const HcclOpExpansionMode modes[] = {
        HCCL_OP_EXPANSION_MODE_HOST,   HCCL_OP_EXPANSION_MODE_HOST,   HCCL_OP_EXPANSION_MODE_AI_CPU,
        HCCL_OP_EXPANSION_MODE_AIV,    HCCL_OP_EXPANSION_AIV_ONLY,    HCCL_OP_EXPANSION_MODE_CCU_MS,
        HCCL_OP_EXPANSION_MODE_CCU_SCHED,
    };
    return configured < sizeof modes / sizeof modes[0] ? modes[configured] : HCCL_OP_EXPANSION_MODE_INVALID;
}

/* Copies `text` into the caller's `len` bytes of `info`, cleared first (as CANN does). */
static void info_text(void *info, uint32_t len, const char *text)
{
    memset(info, 0, len);
    memcpy(info, text, SIM_MIN(strlen(text), (size_t)len - 1));
}

/* The rules are CANN's (hcomm docs, HcclConfigGetInfo): an item of fixed size needs infoLen equal
 * to it, a string item at least its maximum length; a wrong infoLen or an unknown item is
 * HCCL_E_PARA, and `info` is left untouched on every error. */
HCCL_API HcclResult HcclConfigGetInfo(HcclComm comm, HcclConfigType cfgType, uint32_t infoLen, void *info)
{
    static const struct {
        const char *name;
        uint32_t size;  /* the exact infoLen, or the least one for a string (`text`) */
        bool text;
    } items[] = {
        [HCCL_CONFIG_TYPE_OP_EXPANSION_MODE] = {"HCCL_CONFIG_TYPE_OP_EXPANSION_MODE",
                                                sizeof(HcclConfigTypeOpExpansionMode), false},
        [HCCL_CONFIG_TYPE_HCCL_ALGO] = {"HCCL_CONFIG_TYPE_HCCL_ALGO", HCCL_COMM_ALGO_MAX_LENGTH, true},
        [HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM] = {"HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM", sizeof(uint32_t), false},
        [HCCL_CONFIG_TYPE_DETERMINISTIC] = {"HCCL_CONFIG_TYPE_DETERMINISTIC", sizeof(uint32_t), false},
        [HCCL_CONFIG_TYPE_UDI] = {"HCCL_CONFIG_TYPE_UDI", UDI_MAX_LENGTH, true},
    };
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclConfigGetInfo", &err);
    if (c == NULL)
        return err;
    if (info == NULL) {
        err = hccl_error(HCCL_E_PTR, "HcclConfigGetInfo: info is NULL");
    } else if ((unsigned)cfgType >= sizeof items / sizeof items[0]) {
        err = hccl_error(HCCL_E_PARA, "HcclConfigGetInfo: unknown configuration type %d (HcclConfigType: 0 to %d)",
                         (int)cfgType, (int)(sizeof items / sizeof items[0]) - 1);
    } else if (items[cfgType].text ? infoLen < items[cfgType].size : infoLen != items[cfgType].size) {
        err = hccl_error(HCCL_E_PARA, "HcclConfigGetInfo: %s needs infoLen %s %u, got %u", items[cfgType].name,
                         items[cfgType].text ? ">=" : "==", items[cfgType].size, infoLen);
    } else {
        switch (cfgType) {
        case HCCL_CONFIG_TYPE_OP_EXPANSION_MODE: {
            HcclConfigTypeOpExpansionMode mode = expansion_mode(c->op_expansion);
            memcpy(info, &mode, sizeof mode);
            break;
        }
        case HCCL_CONFIG_TYPE_HCCL_ALGO:
            info_text(info, infoLen, c->algo);
            break;
        case HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM: {
            uint32_t channels = 1; /* the simulator moves each transfer over one channel */
            memcpy(info, &channels, sizeof channels);
            break;
        }
        case HCCL_CONFIG_TYPE_DETERMINISTIC: {
            uint32_t level = (uint32_t)hccl_comm_config_value(c, HCCL_DETERMINISTIC);
            memcpy(info, &level, sizeof level);
            break;
        }
        default: /* HCCL_CONFIG_TYPE_UDI */
            info_text(info, infoLen, c->udi);
            break;
        }
    }
    hccl_comm_unref(c);
    return err;
}

/* ---------------------------------------------------------- HCCL buffer */

/* As CANN's: the first call makes the buffer, on the communicator's device (the calling thread's
 * current device must be that one: the simulator allocates it there with aclrtMalloc), and later
 * calls return the same one.  HcclCommDestroy frees it (comm.c). */
HCCL_API HcclResult HcclGetHcclBuffer(HcclComm comm, void **buffer, uint64_t *size)
{
    if (buffer == NULL || size == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetHcclBuffer: %s is NULL", buffer == NULL ? "buffer" : "size");
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclGetHcclBuffer", &err);
    if (c == NULL)
        return err;
    pthread_mutex_lock(&c->lock);
    if (c->hccl_buffer == NULL) {
        uint64_t bytes = 2 * (uint64_t)c->buffer_mb * (1ULL << 20);
        int device;
        if (sim_current_device(&device) != 0) {
            err = hccl_error(HCCL_E_RUNTIME, "HcclGetHcclBuffer: no current device on this thread: call "
                             "aclrtSetDevice(%d) first", c->device);
        } else if (device != c->device) {
            err = hccl_error(HCCL_E_PARA, "HcclGetHcclBuffer: communicator '%s' is on device %d, but the calling "
                             "thread's current device is %d: its HCCL buffer is made on its own device (call "
                             "aclrtSetDevice(%d) first)", c->name, c->device, device, c->device);
        } else if (aclrtMalloc(&c->hccl_buffer, (size_t)bytes, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) {
            c->hccl_buffer = NULL;
            err = hccl_error(HCCL_E_OOM, "HcclGetHcclBuffer: cannot allocate the %llu-byte HCCL buffer of '%s' (twice "
                             "its buffer size of %u MB: hcclBufferSize in its config, or HCCL_BUFFSIZE): %s",
                             (unsigned long long)bytes, c->name, c->buffer_mb, sim_error_text());
        } else {
            c->hccl_buffer_bytes = bytes;
        }
    }
    if (err == HCCL_SUCCESS) {
        *buffer = c->hccl_buffer;
        *size = c->hccl_buffer_bytes;
    }
    pthread_mutex_unlock(&c->lock);
    hccl_comm_unref(c);
    return err;
}

/* ------------------------------------------------------ heterogeneous mode */

/* Every simulated rank is the same kind of chip. */
HCCL_API HcclResult HcclGetHeterogMode(HcclComm comm, HcclHeterogMode *mode)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclGetHeterogMode", &err);
    if (c == NULL)
        return err;
    hccl_comm_unref(c);
    if (mode == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetHeterogMode: mode is NULL");
    *mode = HCCL_HETEROG_MODE_HOMOGENEOUS;
    return HCCL_SUCCESS;
}

/* -------------------------------------------------------- state callbacks */

/* The phases are documented, but not how a callback's result or a registration name acts on
 * HCCL: rather than guess, the simulator refuses the registration. */
HCCL_API HcclResult HcclCommRegCommStateCallback(const char *regName, HcclCommStateCallback cb, void *args)
{
    (void)args; /* passed back to cb untouched: any value is valid */
    if (regName == NULL || cb == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommRegCommStateCallback: regName and cb must not be NULL");
    return hccl_error(HCCL_E_NOT_SUPPORT, "HcclCommRegCommStateCallback: the simulator does not emulate "
                      "communicator state callbacks (registration '%.128s' refused)", regName);
}

/* ---------------------------------------------------- virtual-memory ranges
 *
 * These reserve and map device virtual memory for a communicator, which the simulator's
 * device arenas do not model: after the checks real HCCL makes, they report HCCL_E_NOT_SUPPORT. */

static int not_emulated(const char *api)
{
    return hccl_error(HCCL_E_NOT_SUPPORT, "%s: the simulator does not emulate communicator virtual-memory "
                      "ranges; allocate with aclrtMalloc instead", api);
}

/* The communicator must be live and `ptr` set, as for real HCCL, before the call is refused. */
static int range_check(const char *api, HcclComm comm, const void *ptr)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, api, &err);
    if (c == NULL)
        return err;
    hccl_comm_unref(c);
    if (ptr == NULL)
        return hccl_error(HCCL_E_PTR, "%s: the address is NULL", api);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclCommSetMemoryRange(HcclComm comm, void *baseVirPtr, size_t size, size_t alignment,
                                           uint64_t flags)
{
    (void)flags; /* no flag values are documented */
    int err = range_check("HcclCommSetMemoryRange", comm, baseVirPtr);
    if (err != HCCL_SUCCESS)
        return err;
    if (size == 0)
        return hccl_error(HCCL_E_PARA, "HcclCommSetMemoryRange: size must not be 0");
    if (alignment != 0 && (alignment & (alignment - 1)) != 0)
        return hccl_error(HCCL_E_PARA, "HcclCommSetMemoryRange: alignment %zu is not a power of two", alignment);
    return not_emulated("HcclCommSetMemoryRange");
}

HCCL_API HcclResult HcclCommUnsetMemoryRange(HcclComm comm, void *baseVirPtr)
{
    int err = range_check("HcclCommUnsetMemoryRange", comm, baseVirPtr);
    return err != HCCL_SUCCESS ? err : not_emulated("HcclCommUnsetMemoryRange");
}

HCCL_API HcclResult HcclCommActivateCommMemory(HcclComm comm, void *virPtr, size_t size, size_t offset,
                                               aclrtDrvMemHandle handle, uint64_t flags)
{
    (void)offset; /* any offset into the physical memory may be valid */
    (void)flags;
    int err = range_check("HcclCommActivateCommMemory", comm, virPtr);
    if (err != HCCL_SUCCESS)
        return err;
    if (handle == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommActivateCommMemory: handle is NULL");
    if (size == 0)
        return hccl_error(HCCL_E_PARA, "HcclCommActivateCommMemory: size must not be 0");
    return not_emulated("HcclCommActivateCommMemory");
}

HCCL_API HcclResult HcclCommDeactivateCommMemory(HcclComm comm, void *virPtr)
{
    int err = range_check("HcclCommDeactivateCommMemory", comm, virPtr);
    return err != HCCL_SUCCESS ? err : not_emulated("HcclCommDeactivateCommMemory");
}

/* ------------------------------------------------------------------- fork */

/* A child starts with the parent's records but not with a thread that may hold their lock. */
static void registrations_after_fork(void)
{
    pthread_mutex_init(&g_reg_lock, NULL);
}

__attribute__((constructor)) static void install_registrations_fork_handler(void)
{
    pthread_atfork(NULL, NULL, registrations_after_fork);
}
