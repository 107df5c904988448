/* CANN 9.x communicator management the simulator has no data path for: memory registrations and
 * symmetric windows (bookkeeping only: every rank already reaches every peer's device memory),
 * NIC selection, configuration queries, and the virtual-memory range calls it does not emulate. */
#include <stdlib.h>
#include <string.h>

#include "hccl/internal.h"

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

/* Checks what both register calls take and records the registration in *out. */
static int reg_add(const char *api, HcclComm handle, void *addr, uint64_t size, uint32_t flag, int kind,
                   void **out)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, api, &err);
    if (comm == NULL)
        return err;
    hccl_comm_unref(comm); /* only the handle is kept, checked again when it is used */
    if (addr == NULL || out == NULL)
        return hccl_error(HCCL_E_PTR, "%s: addr and the handle pointer must not be NULL", api);
    if (size == 0)
        return hccl_error(HCCL_E_PARA, "%s: size must not be 0", api);
    if ((uintptr_t)addr + size < (uintptr_t)addr)
        return hccl_error(HCCL_E_PARA, "%s: %p + %llu bytes wraps around the address space", api, addr,
                          (unsigned long long)size);
    registration_t *reg = calloc(1, sizeof *reg);
    if (reg == NULL)
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    reg->kind = kind;
    reg->comm = handle;
    reg->addr = (uintptr_t)addr;
    reg->size = size;
    reg->flag = flag;
    pthread_mutex_lock(&g_reg_lock);
    reg->next = g_regs;
    g_regs = reg;
    pthread_mutex_unlock(&g_reg_lock);
    *out = reg;
    return HCCL_SUCCESS;
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

HCCL_API HcclResult HcclCommDeregister(HcclComm comm, void *handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclCommDeregister", &err);
    if (c == NULL)
        return err;
    hccl_comm_unref(c);
    return reg_remove("HcclCommDeregister", comm, handle, REG_MEMORY);
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
            err = hccl_error(HCCL_E_PARA, "HcclCommExchangeMem: %p is not a live HcclCommRegister handle of this "
                             "communicator", windowHandle);
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

HCCL_API HcclResult HcclConfigGetInfo(HcclComm comm, HcclConfigType cfgType, uint32_t infoLen, void *info)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *c = hccl_comm_lookup(comm, "HcclConfigGetInfo", &err);
    if (c == NULL)
        return err;
    if (info == NULL) {
        err = hccl_error(HCCL_E_PTR, "HcclConfigGetInfo: info is NULL");
    } else if (cfgType == HCCL_CONFIG_TYPE_OP_EXPANSION_MODE) {
        HcclConfigTypeOpExpansionMode mode = expansion_mode(c->op_expansion);
        if (infoLen < sizeof mode)
            err = hccl_error(HCCL_E_PARA, "HcclConfigGetInfo: HCCL_CONFIG_TYPE_OP_EXPANSION_MODE needs infoLen >= "
                             "%zu, got %u", sizeof mode, infoLen);
        else
            memcpy(info, &mode, sizeof mode);
    } else if (cfgType == HCCL_CONFIG_TYPE_HCCL_ALGO || cfgType == HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM) {
        err = hccl_error(HCCL_E_NOT_SUPPORT, "HcclConfigGetInfo: configuration type %d is not emulated by the "
                         "simulator (only HCCL_CONFIG_TYPE_OP_EXPANSION_MODE is)", (int)cfgType);
    } else {
        err = hccl_error(HCCL_E_PARA, "HcclConfigGetInfo: unknown configuration type %d", (int)cfgType);
    }
    hccl_comm_unref(c);
    return err;
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
