/*
 * The CANN 9.x management functions: memory registrations and symmetric windows, per-communicator
 * configuration, lookups by name, group status, NIC selection, the virtual-memory range calls the
 * simulator refuses (HCCL_E_NOT_SUPPORT), and the ACL version and device-information queries.
 * Every function is called with good and bad arguments and its return code checked.
 *
 * usage: management --ranks N --mode threads|procs|mixed
 *
 * Nothing here queues an operation: every check is local to a rank.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BUF 4096
#define CFG_NAME "mgmt_cfg_comm"

_Static_assert(sizeof(aclCANNPackageVersion) == 512, "aclCANNPackageVersion is 512 bytes (reference section 3.4)");

typedef struct {
    h_ctx *ctx;
    HcclComm comm;     /* the world communicator, no config */
    HcclComm cfg;      /* the world again, named CFG_NAME, AIV expansion, deterministic 1 */
    void *a;           /* device buffer of BUF bytes */
} T;

static HcclResult on_state(HcclComm comm, HcclCommStatePhase state, void *args)
{
    (void)comm;
    (void)state;
    (void)args;
    return HCCL_SUCCESS;
}

static int make_config_comm(T *t)
{
    h_ctx *ctx = t->ctx;
    HcclRootInfo info;
    if (h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &info) != 0)
        return -1;
    HcclCommConfig config;
    HcclCommConfigInit(&config);
    snprintf(config.hcclCommName, sizeof config.hcclCommName, "%s", CFG_NAME);
    config.hcclOpExpansionMode = 3; /* AIV, in the config's numbering */
    config.hcclDeterministic = 1;
    t->cfg = NULL;
    H_HCCL(ctx, HcclCommInitRootInfoConfig(ctx->nranks, &info, ctx->rank, &config, &t->cfg));
    H_REQUIRE(ctx, t->cfg != NULL, "HcclCommInitRootInfoConfig returned success but a NULL comm");
    return 0;
}

static int registrations(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "HcclCommRegister / Deregister / ExchangeMem")) {
        void *handle = NULL;
        H_EXPECT_HCCL(ctx, HcclCommRegister(NULL, t->a, BUF, &handle, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, NULL, BUF, &handle, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, t->a, BUF, NULL, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, t->a, 0, &handle, 0), HCCL_E_PARA);
        H_HCCL(ctx, HcclCommRegister(t->comm, t->a, BUF, &handle, 0));
        H_EXPECT(ctx, handle != NULL, "HcclCommRegister gave a NULL handle");
        uint32_t peers[1] = {(ctx->rank + 1) % ctx->nranks};
        uint32_t bad_peer[1] = {ctx->nranks};
        H_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, peers, 1));
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(NULL, handle, peers, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, NULL, peers, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, NULL, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, peers, 0), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, bad_peer, 1), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->cfg, handle, peers, 1), HCCL_E_NOT_FOUND); /* another comm's */
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, t->a, peers, 1), HCCL_E_NOT_FOUND);  /* not a handle */
        /* As CANN's, releasing a handle the communicator does not hold changes nothing and succeeds. */
        H_EXPECT_HCCL(ctx, HcclCommDeregister(t->cfg, handle), HCCL_SUCCESS);               /* wrong comm */
        H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, NULL), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommDeregister(NULL, handle), HCCL_E_PTR);
        H_HCCL(ctx, HcclCommDeregister(t->comm, handle));
        H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, handle), HCCL_SUCCESS); /* twice */
        H_EXPECT_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, peers, 1), HCCL_E_NOT_FOUND);
    }
    if (h_case(ctx, "HcclCommSymWinRegister / Get / Deregister")) {
        HcclCommSymWindow win = NULL, got = NULL;
        size_t offset = 99;
        H_EXPECT_HCCL(ctx, HcclCommSymWinRegister(NULL, t->a, BUF, &win, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinRegister(t->comm, NULL, BUF, &win, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinRegister(t->comm, t->a, BUF, NULL, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinRegister(t->comm, t->a, 0, &win, 0), HCCL_E_PARA);
        H_HCCL(ctx, HcclCommSymWinRegister(t->comm, t->a, BUF, &win, 0));
        H_HCCL(ctx, HcclCommSymWinGet(t->comm, (char *)t->a + 128, 256, &got, &offset));
        H_EXPECT(ctx, got == win && offset == 128, "HcclCommSymWinGet: window %p offset %zu, expected %p 128", got,
                 offset, win);
        H_HCCL(ctx, HcclCommSymWinGet(t->comm, t->a, BUF, &got, &offset));
        H_EXPECT(ctx, got == win && offset == 0, "HcclCommSymWinGet of the whole window: %p %zu", got, offset);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->comm, (char *)t->a + 128, BUF, &got, &offset), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->cfg, t->a, 16, &got, &offset), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(NULL, t->a, 16, &got, &offset), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->comm, NULL, 16, &got, &offset), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->comm, t->a, 16, NULL, &offset), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->comm, t->a, 16, &got, NULL), HCCL_E_PTR);
        /* A memory registration is not a window, nor the other way round. */
        void *handle = NULL;
        H_HCCL(ctx, HcclCommRegister(t->comm, t->a, BUF, &handle, 0));
        H_EXPECT_HCCL(ctx, HcclCommSymWinDeregister(handle), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, win), HCCL_SUCCESS); /* not a registration: nothing to do */
        H_HCCL(ctx, HcclCommDeregister(t->comm, handle));
        H_EXPECT_HCCL(ctx, HcclCommSymWinDeregister(NULL), HCCL_E_PTR);
        H_HCCL(ctx, HcclCommSymWinDeregister(win));
        H_EXPECT_HCCL(ctx, HcclCommSymWinDeregister(win), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommSymWinGet(t->comm, t->a, 16, &got, &offset), HCCL_E_NOT_FOUND);
    }
    return 0;
}

_Static_assert(HCCL_ACCELERATOR == 1 && HCCL_CONFIG_RESERVED == 2,
               "HcclConfig without OPEN_BUILD_PROJECT: HCCL_ACCELERATOR 1, HCCL_CONFIG_RESERVED 2");

static int configuration(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "HcclSetCommConfig / HcclGetCommConfig")) {
        HcclConfigValue value = {0}, got = {-1};
        H_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_DETERMINISTIC, &got));
        H_EXPECT(ctx, got.value == 1, "deterministic from the config: got %d, expected 1", (int)got.value);
        value.value = 2;
        H_HCCL(ctx, HcclSetCommConfig(t->cfg, HCCL_DETERMINISTIC, value));
        H_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_DETERMINISTIC, &got));
        H_EXPECT(ctx, got.value == 2, "deterministic after HcclSetCommConfig: got %d, expected 2", (int)got.value);
        value.value = 3;
        H_EXPECT_HCCL(ctx, HcclSetCommConfig(t->cfg, HCCL_DETERMINISTIC, value), HCCL_E_PARA);
        value.value = 0;
        H_EXPECT_HCCL(ctx, HcclSetCommConfig(t->cfg, HCCL_CONFIG_RESERVED, value), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclSetCommConfig(NULL, HCCL_DETERMINISTIC, value), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_DETERMINISTIC, NULL), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_CONFIG_RESERVED, &got), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclGetCommConfig(NULL, HCCL_DETERMINISTIC, &got), HCCL_E_PTR);
        /* Without a value of its own, a communicator follows the process-wide one. */
        HcclConfigValue global = {-1};
        H_HCCL(ctx, HcclGetConfig(HCCL_DETERMINISTIC, &global));
        H_HCCL(ctx, HcclGetCommConfig(t->comm, HCCL_DETERMINISTIC, &got));
        H_EXPECT(ctx, got.value == global.value, "deterministic of a comm without config: %d, process-wide %d",
                 (int)got.value, (int)global.value);
        /* HCCL_ACCELERATOR (headers without OPEN_BUILD_PROJECT): 0 to 5, recorded per communicator. */
        H_HCCL(ctx, HcclGetConfig(HCCL_ACCELERATOR, &global));
        H_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_ACCELERATOR, &got));
        H_EXPECT(ctx, got.value == global.value, "accelerator of a comm that set none: %d, process-wide %d",
                 (int)got.value, (int)global.value);
        value.value = 2; /* AIV */
        H_HCCL(ctx, HcclSetCommConfig(t->cfg, HCCL_ACCELERATOR, value));
        H_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_ACCELERATOR, &got));
        H_EXPECT(ctx, got.value == 2, "accelerator after HcclSetCommConfig: got %d, expected 2", (int)got.value);
        H_HCCL(ctx, HcclGetCommConfig(t->cfg, HCCL_DETERMINISTIC, &got));
        H_EXPECT(ctx, got.value == 2, "deterministic after setting the accelerator: got %d, expected 2",
                 (int)got.value);
        value.value = 6;
        H_EXPECT_HCCL(ctx, HcclSetCommConfig(t->cfg, HCCL_ACCELERATOR, value), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclSetConfig(HCCL_ACCELERATOR, value), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclSetConfig(HCCL_CONFIG_RESERVED, value), HCCL_E_PARA);
    }
    if (h_case(ctx, "HcclConfigGetInfo")) {
        HcclConfigTypeOpExpansionMode mode = HCCL_OP_EXPANSION_MODE_INVALID;
        H_HCCL(ctx, HcclConfigGetInfo(t->cfg, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof mode, &mode));
        H_EXPECT(ctx, mode == HCCL_OP_EXPANSION_MODE_AIV, "config hcclOpExpansionMode 3 reads as %d, expected "
                 "HCCL_OP_EXPANSION_MODE_AIV (1)", (int)mode);
        H_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof mode, &mode));
        H_EXPECT(ctx, mode == HCCL_OP_EXPANSION_MODE_HOST, "the default mode reads as %d, expected "
                 "HCCL_OP_EXPANSION_MODE_HOST (2)", (int)mode);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, 2, &mode), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof mode, NULL),
                      HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(NULL, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof mode, &mode),
                      HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_INVALID, sizeof mode, &mode), HCCL_E_PARA);
        char algo[128]; /* the algorithm string needs infoLen >= HCCL_COMM_ALGO_MAX_LENGTH (c/hccl_newer.c) */
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_HCCL_ALGO, sizeof algo, algo), HCCL_E_PARA);
    }
    return 0;
}

static int names_and_status(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "HcclCommGetHandleWithName")) {
        HcclComm found = NULL;
        H_HCCL(ctx, HcclCommGetHandleWithName(CFG_NAME, &found));
        H_EXPECT(ctx, found == t->cfg, "HcclCommGetHandleWithName(" CFG_NAME ") = %p, expected %p (this rank's)",
                 found, t->cfg);
        char name[COMM_NAME_MAX_LENGTH];
        H_HCCL(ctx, HcclGetCommName(t->comm, name));
        H_HCCL(ctx, HcclCommGetHandleWithName(name, &found));
        H_EXPECT(ctx, found == t->comm, "lookup of the generated name '%s' = %p, expected %p", name, found, t->comm);
        H_EXPECT_HCCL(ctx, HcclCommGetHandleWithName("no_such_comm", &found), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclCommGetHandleWithName(NULL, &found), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommGetHandleWithName(CFG_NAME, NULL), HCCL_E_PTR);
    }
    if (h_case(ctx, "HcclCommGetStatus")) {
        HcclCommStatus status = HCCL_COMM_STATUS_RESERVED;
        H_HCCL(ctx, HcclCommGetStatus(CFG_NAME, &status));
        H_EXPECT(ctx, status == HCCL_COMM_STATUS_READY, "status %d, expected READY", (int)status);
        H_HCCL(ctx, HcclCommSuspend(t->cfg));
        H_HCCL(ctx, HcclCommGetStatus(CFG_NAME, &status));
        H_EXPECT(ctx, status == HCCL_COMM_STATUS_SUSPENDING, "status %d, expected SUSPENDING", (int)status);
        H_HCCL(ctx, HcclCommResume(t->cfg));
        H_HCCL(ctx, HcclCommGetStatus(CFG_NAME, &status));
        H_EXPECT(ctx, status == HCCL_COMM_STATUS_READY, "status %d after resume, expected READY", (int)status);
        H_EXPECT_HCCL(ctx, HcclCommGetStatus("no_such_comm", &status), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclCommGetStatus(NULL, &status), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommGetStatus(CFG_NAME, NULL), HCCL_E_PTR);
    }
    if (h_case(ctx, "HcclCommRegCommStateCallback")) {
        H_EXPECT_HCCL(ctx, HcclCommRegCommStateCallback("mgmt", on_state, NULL), HCCL_E_NOT_SUPPORT);
        H_EXPECT_HCCL(ctx, HcclCommRegCommStateCallback(NULL, on_state, NULL), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommRegCommStateCallback("mgmt", NULL, NULL), HCCL_E_PTR);
    }
    if (h_case(ctx, "HcclGroupStatusGet")) {
        bool enabled = true;
        H_HCCL(ctx, HcclGroupStatusGet(&enabled));
        H_EXPECT(ctx, !enabled, "group enabled outside HcclGroupStart");
        H_HCCL(ctx, HcclGroupStart());
        H_HCCL(ctx, HcclGroupStart());
        H_HCCL(ctx, HcclGroupStatusGet(&enabled));
        H_EXPECT(ctx, enabled, "group not enabled after HcclGroupStart");
        H_HCCL(ctx, HcclGroupEnd());
        H_HCCL(ctx, HcclGroupStatusGet(&enabled));
        H_EXPECT(ctx, enabled, "group not enabled inside the outer group");
        H_HCCL(ctx, HcclGroupEnd());
        H_HCCL(ctx, HcclGroupStatusGet(&enabled));
        H_EXPECT(ctx, !enabled, "group still enabled after the last HcclGroupEnd");
        H_EXPECT_HCCL(ctx, HcclGroupStatusGet(NULL), HCCL_E_PTR);
    }
    return 0;
}

static int nic_and_ranges(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "HcclCommWorkingDevNicSet")) {
        uint32_t ranks[1] = {ctx->rank};
        uint32_t bad[1] = {ctx->nranks};
        bool backup[1] = {true};
        H_HCCL(ctx, HcclCommWorkingDevNicSet(t->comm, ranks, backup, 1));
        H_EXPECT_HCCL(ctx, HcclCommWorkingDevNicSet(NULL, ranks, backup, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommWorkingDevNicSet(t->comm, NULL, backup, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommWorkingDevNicSet(t->comm, ranks, NULL, 1), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommWorkingDevNicSet(t->comm, ranks, backup, 0), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommWorkingDevNicSet(t->comm, bad, backup, 1), HCCL_E_PARA);
    }
    if (h_case(ctx, "virtual-memory ranges are not emulated")) {
        void *base = t->a;
        int handle_cell = 0;
        aclrtDrvMemHandle handle = &handle_cell;
        H_EXPECT_HCCL(ctx, HcclCommSetMemoryRange(t->comm, base, BUF, 0, 0), HCCL_E_NOT_SUPPORT);
        H_EXPECT_HCCL(ctx, HcclCommSetMemoryRange(NULL, base, BUF, 0, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSetMemoryRange(t->comm, NULL, BUF, 0, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommSetMemoryRange(t->comm, base, 0, 0, 0), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommSetMemoryRange(t->comm, base, BUF, 3, 0), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommUnsetMemoryRange(t->comm, base), HCCL_E_NOT_SUPPORT);
        H_EXPECT_HCCL(ctx, HcclCommUnsetMemoryRange(NULL, base), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommUnsetMemoryRange(t->comm, NULL), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommActivateCommMemory(t->comm, base, BUF, 0, handle, 0), HCCL_E_NOT_SUPPORT);
        H_EXPECT_HCCL(ctx, HcclCommActivateCommMemory(NULL, base, BUF, 0, handle, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommActivateCommMemory(t->comm, NULL, BUF, 0, handle, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommActivateCommMemory(t->comm, base, BUF, 0, NULL, 0), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommActivateCommMemory(t->comm, base, 0, 0, handle, 0), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclCommDeactivateCommMemory(t->comm, base), HCCL_E_NOT_SUPPORT);
        H_EXPECT_HCCL(ctx, HcclCommDeactivateCommMemory(NULL, base), HCCL_E_PTR);
        H_EXPECT_HCCL(ctx, HcclCommDeactivateCommMemory(t->comm, NULL), HCCL_E_PTR);
    }
    return 0;
}

static int acl_queries(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "aclsysGetCANNVersion / aclsysGetVersionStr / aclsysGetVersionNum")) {
        aclCANNPackageVersion version;
        memset(&version, 0x7f, sizeof version);
        H_ACL(ctx, aclsysGetCANNVersion(ACL_PKG_NAME_CANN, &version));
        H_EXPECT(ctx, strcmp(version.version, "9.0.0") == 0 && strcmp(version.majorVersion, "9") == 0 &&
                      strcmp(version.minorVersion, "0") == 0,
                 "aclsysGetCANNVersion: '%.128s' major '%.64s' minor '%.64s'", version.version,
                 version.majorVersion, version.minorVersion);
        H_EXPECT_ACL(ctx, aclsysGetCANNVersion(ACL_PKG_NAME_CANN, NULL), ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclsysGetCANNVersion((aclCANNPackageName)99, &version), ACL_ERROR_INVALID_PARAM);
        char text[ACL_PKG_VERSION_MAX_SIZE];
        char runtime[] = "runtime", bogus[] = "no_such_package";
        H_ACL(ctx, aclsysGetVersionStr(runtime, text));
        H_EXPECT(ctx, strcmp(text, version.version) == 0, "aclsysGetVersionStr '%s' != aclsysGetCANNVersion '%s'",
                 text, version.version);
        H_EXPECT_ACL(ctx, aclsysGetVersionStr(bogus, text), ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclsysGetVersionStr(NULL, text), ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclsysGetVersionStr(runtime, NULL), ACL_ERROR_INVALID_PARAM);
        int32_t number = 0;
        H_ACL(ctx, aclsysGetVersionNum(runtime, &number));
        H_EXPECT(ctx, number == 90000000, "aclsysGetVersionNum = %d, expected 90000000", (int)number);
        H_EXPECT_ACL(ctx, aclsysGetVersionNum(bogus, &number), ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclsysGetVersionNum(NULL, &number), ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclsysGetVersionNum(runtime, NULL), ACL_ERROR_INVALID_PARAM);
    }
    if (h_case(ctx, "aclrtGetDeviceInfo")) {
        int64_t value = -1;
        size_t free_bytes = 0, total = 0;
        H_ACL(ctx, aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total));
        H_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE, &value));
        H_EXPECT(ctx, value == (int64_t)total, "ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE %lld != aclrtGetMemInfo total %zu",
                 (long long)value, total);
        H_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, ACL_DEV_ATTR_IS_VIRTUAL, &value));
        H_EXPECT(ctx, value == 0, "ACL_DEV_ATTR_IS_VIRTUAL = %lld", (long long)value);
        H_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, ACL_DEV_ATTR_PHY_CHIP_ID, &value));
        H_EXPECT_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, ACL_DEV_ATTR_AICORE_CORE_NUM, &value),
                     ACL_ERROR_FEATURE_UNSUPPORTED);
        H_EXPECT_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, (aclrtDevAttr)12345, &value),
                     ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclrtGetDeviceInfo((uint32_t)ctx->device, ACL_DEV_ATTR_IS_VIRTUAL, NULL),
                     ACL_ERROR_INVALID_PARAM);
        H_EXPECT_ACL(ctx, aclrtGetDeviceInfo(100000u, ACL_DEV_ATTR_IS_VIRTUAL, &value), ACL_ERROR_RT_INVALID_DEVICEID);
    }
    if (h_case(ctx, "aclFinalizeReference refuses NULL")) {
        /* Finalising is checked by a program of its own: the ranks here still need ACL. */
        H_EXPECT_ACL(ctx, aclFinalizeReference(NULL), ACL_ERROR_INVALID_PARAM);
    }
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    T t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    RUN(h_rank_setup(ctx));
    RUN(h_world_comm(ctx, &t.comm));
    RUN(make_config_comm(&t));
    H_ACL(ctx, aclrtMalloc(&t.a, BUF, ACL_MEM_MALLOC_HUGE_FIRST));
    RUN(registrations(&t));
    RUN(configuration(&t));
    RUN(names_and_status(&t));
    RUN(nic_and_ranges(&t));
    RUN(acl_queries(&t));
    h_set_case(ctx, "teardown");
    H_ACL(ctx, aclrtFree(t.a));
    H_HCCL(ctx, HcclCommDestroy(t.cfg));
    H_HCCL(ctx, HcclCommDestroy(t.comm));
    RUN(h_oob_barrier(ctx)); /* every rank of this process has destroyed its communicators */
    if (h_case(ctx, "lookups after destroy")) {
        HcclComm found = NULL;
        HcclCommStatus status;
        H_EXPECT_HCCL(ctx, HcclCommGetHandleWithName(CFG_NAME, &found), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclCommGetStatus(CFG_NAME, &status), HCCL_E_NOT_FOUND);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(t.cfg, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, 4, &status), HCCL_E_PARA);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("management", run_rank, NULL, NULL);
    return h_finish("management", failed);
}
