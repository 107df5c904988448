/*
 * The newer HCCL surface on the simulator, checked against what CANN documents and does:
 *   - HcclBatchSendRecv items whose peer is the calling rank itself (a local copy, paired in item
 *     order), alone, mixed with transfers to other ranks, and on a communicator of one rank; the
 *     unpaired ones refused before anything runs;
 *   - HcclSend / HcclRecv to the own rank (HCCL_E_NOT_SUPPORT, as CANN's parameter check);
 *   - HcclConfigGetInfo for every HcclConfigType of CANN's hccl_comm.h;
 *   - HcclGetHcclBuffer (hccl_res.h), HcclGetHeterogMode (hccl_rank_graph.h), the scalable
 *     root-info bootstrap (HcclGetRootInfoScalable / HcclCommInitRootInfoScalable) and
 *     HcclCommRegister's bookkeeping.
 * Every check looks at data or at the exact return code (and the message of a refusal).
 *
 * usage: hccl_newer --ranks N --mode threads|procs|mixed
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hccl/hccl_rank_graph.h>
#include <hccl/hccl_res.h>

#include "harness.h"

#define COUNT 1000 /* elements of the buffers below */

typedef struct {
    h_ctx *ctx;
    HcclComm comm; /* over all ranks of the launch */
    HcclComm solo; /* this rank alone */
} T;

/* A device buffer of `bytes` holding `host` (NULL: filled with `fill`). */
static int dev_with(h_ctx *ctx, void **dev, const void *host, size_t bytes, int fill)
{
    H_ACL(ctx, aclrtMalloc(dev, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    if (host != NULL) {
        H_ACL(ctx, aclrtMemcpy(*dev, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    } else {
        H_ACL(ctx, aclrtMemset(*dev, bytes, fill, bytes));
    }
    return 0;
}

/* Whether device buffer `dev` holds the `bytes` of `expected`; `what` names it in a failure. */
static int dev_holds(h_ctx *ctx, const void *dev, const void *expected, size_t bytes, const char *what)
{
    uint8_t *got = h_xmalloc(bytes);
    H_ACL(ctx, aclrtMemcpy(got, bytes, dev, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    size_t at = 0;
    while (at < bytes && got[at] == ((const uint8_t *)expected)[at])
        at++;
    H_EXPECT(ctx, at == bytes, "%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, at, bytes,
             at < bytes ? got[at] : 0, at < bytes ? ((const uint8_t *)expected)[at] : 0);
    free(got);
    return 0;
}

static HcclSendRecvItem item(HcclSendRecvType type, void *buf, uint64_t count, HcclDataType dt, uint32_t peer)
{
    HcclSendRecvItem it;
    memset(&it, 0, sizeof it);
    it.sendRecvType = type;
    it.buf = buf;
    it.count = count;
    it.dataType = dt;
    it.remoteRank = peer;
    return it;
}

/* ------------------------------------------------------------------ sends to the rank itself */

/* On `comm` (where this rank is `me`): two pairs of items to the rank itself, interleaved and of
 * different data types, and nothing else. */
static int self_pairs(T *t, HcclComm comm, uint32_t me, const char *label)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "batch of sends to itself only (%s)", label))
        return 0;
    size_t b32 = COUNT * 4, b16 = COUNT * 2;
    uint8_t *h32 = h_xmalloc(b32), *h16 = h_xmalloc(b16);
    h_fill(HCCL_DATA_TYPE_FP32, H_GEN_MOVE, ctx->rank, 0, COUNT, h32);
    h_fill(HCCL_DATA_TYPE_BFP16, H_GEN_MOVE, ctx->rank + 3, 0, COUNT, h16);
    void *a32, *a16, *b32d, *b16d;
    RUN(dev_with(ctx, &a32, h32, b32, 0));
    RUN(dev_with(ctx, &a16, h16, b16, 0));
    RUN(dev_with(ctx, &b32d, NULL, b32, 0x5a));
    RUN(dev_with(ctx, &b16d, NULL, b16, 0x5a));
    /* The k-th receive from itself takes the k-th send to itself, whatever sits between them. */
    HcclSendRecvItem items[4] = {
        item(HCCL_RECV, b32d, COUNT, HCCL_DATA_TYPE_FP32, me),
        item(HCCL_SEND, a32, COUNT, HCCL_DATA_TYPE_FP32, me),
        item(HCCL_SEND, a16, COUNT, HCCL_DATA_TYPE_BFP16, me),
        item(HCCL_RECV, b16d, COUNT, HCCL_DATA_TYPE_BFP16, me),
    };
    H_HCCL(ctx, HcclBatchSendRecv(items, 4, comm, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(dev_holds(ctx, b32d, h32, b32, "fp32 receive from itself"));
    RUN(dev_holds(ctx, b16d, h16, b16, "bf16 receive from itself"));
    RUN(dev_holds(ctx, a32, h32, b32, "fp32 send buffer (must stay)"));
    H_ACL(ctx, aclrtFree(a32));
    H_ACL(ctx, aclrtFree(a16));
    H_ACL(ctx, aclrtFree(b32d));
    H_ACL(ctx, aclrtFree(b16d));
    free(h32);
    free(h16);
    return 0;
}

/* A ring shift to the next rank, with a pair to itself in the middle of the batch. */
static int self_with_peers(T *t)
{
    h_ctx *ctx = t->ctx;
    uint32_t n = ctx->nranks, me = ctx->rank;
    if (n < 2 || !h_case(ctx, "batch mixing sends to itself and to other ranks"))
        return 0;
    size_t bytes = COUNT * 8;
    uint8_t *mine = h_xmalloc(bytes), *left = h_xmalloc(bytes), *own = h_xmalloc(bytes);
    h_fill(HCCL_DATA_TYPE_INT64, H_GEN_MOVE, me, 0, COUNT, mine);
    h_fill(HCCL_DATA_TYPE_INT64, H_GEN_MOVE, (me + n - 1) % n, 0, COUNT, left);
    h_fill(HCCL_DATA_TYPE_INT64, H_GEN_MOVE, me + 100, 0, COUNT, own);
    void *send, *recv, *self_send, *self_recv;
    RUN(dev_with(ctx, &send, mine, bytes, 0));
    RUN(dev_with(ctx, &recv, NULL, bytes, 0x11));
    RUN(dev_with(ctx, &self_send, own, bytes, 0));
    RUN(dev_with(ctx, &self_recv, NULL, bytes, 0x22));
    HcclSendRecvItem items[4] = {
        item(HCCL_SEND, send, COUNT, HCCL_DATA_TYPE_INT64, (me + 1) % n),
        item(HCCL_SEND, self_send, COUNT, HCCL_DATA_TYPE_INT64, me),
        item(HCCL_RECV, self_recv, COUNT, HCCL_DATA_TYPE_INT64, me),
        item(HCCL_RECV, recv, COUNT, HCCL_DATA_TYPE_INT64, (me + n - 1) % n),
    };
    H_HCCL(ctx, HcclBatchSendRecv(items, 4, t->comm, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(dev_holds(ctx, recv, left, bytes, "receive from the rank before"));
    RUN(dev_holds(ctx, self_recv, own, bytes, "receive from itself"));
    H_ACL(ctx, aclrtFree(send));
    H_ACL(ctx, aclrtFree(recv));
    H_ACL(ctx, aclrtFree(self_send));
    H_ACL(ctx, aclrtFree(self_recv));
    free(mine);
    free(left);
    free(own);
    return 0;
}

/* Unpaired items to the rank itself are refused before anything runs; HcclSend / HcclRecv to the
 * own rank are refused as CANN refuses them. */
static int self_refusals(T *t, HcclComm comm, uint32_t me, const char *label)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "refused sends to itself (%s)", label))
        return 0;
    size_t bytes = COUNT * 4;
    uint8_t *host = h_xmalloc(bytes), *poison = h_xmalloc(bytes);
    h_fill(HCCL_DATA_TYPE_INT32, H_GEN_MOVE, me, 0, COUNT, host);
    memset(poison, 0x77, bytes);
    void *a, *b;
    RUN(dev_with(ctx, &a, host, bytes, 0));
    RUN(dev_with(ctx, &b, NULL, bytes, 0x77));
    char rank_text[32];
    snprintf(rank_text, sizeof rank_text, "rank %u", me);

    HcclSendRecvItem lone_send[1] = {item(HCCL_SEND, a, COUNT, HCCL_DATA_TYPE_INT32, me)};
    H_EXPECT_REFUSED(ctx, HcclBatchSendRecv(lone_send, 1, comm, ctx->stream), HCCL_E_PARA, "item 0", "itself",
                     "no matching receive");
    HcclSendRecvItem lone_recv[2] = {item(HCCL_SEND, a, COUNT, HCCL_DATA_TYPE_INT32, me),
                                     item(HCCL_RECV, b, COUNT, HCCL_DATA_TYPE_INT32, me)};
    lone_recv[0].sendRecvType = HCCL_RECV; /* two receives from itself, no send */
    H_EXPECT_REFUSED(ctx, HcclBatchSendRecv(lone_recv, 2, comm, ctx->stream), HCCL_E_PARA, "item 0", "itself",
                     "no matching send");
    HcclSendRecvItem counts[2] = {item(HCCL_SEND, a, COUNT, HCCL_DATA_TYPE_INT32, me),
                                  item(HCCL_RECV, b, COUNT - 1, HCCL_DATA_TYPE_INT32, me)};
    H_EXPECT_REFUSED(ctx, HcclBatchSendRecv(counts, 2, comm, ctx->stream), HCCL_E_PARA, "item 0", "item 1",
                     "same count and data type");
    HcclSendRecvItem types[2] = {item(HCCL_SEND, a, COUNT, HCCL_DATA_TYPE_INT32, me),
                                 item(HCCL_RECV, b, COUNT, HCCL_DATA_TYPE_FP32, me)};
    H_EXPECT_REFUSED(ctx, HcclBatchSendRecv(types, 2, comm, ctx->stream), HCCL_E_PARA, "same count and data type");
    /* A good pair does not make up for a bad one: the whole batch is refused. */
    HcclSendRecvItem mixed[3] = {item(HCCL_SEND, a, COUNT, HCCL_DATA_TYPE_INT32, me),
                                 item(HCCL_RECV, b, COUNT, HCCL_DATA_TYPE_INT32, me),
                                 item(HCCL_SEND, a, 4, HCCL_DATA_TYPE_INT32, me)};
    H_EXPECT_REFUSED(ctx, HcclBatchSendRecv(mixed, 3, comm, ctx->stream), HCCL_E_PARA, "item 2");

    H_EXPECT_REFUSED(ctx, HcclSend(a, COUNT, HCCL_DATA_TYPE_INT32, me, comm, ctx->stream), HCCL_E_NOT_SUPPORT,
                     "HcclSend", "destRank", rank_text, "itself");
    H_EXPECT_REFUSED(ctx, HcclRecv(b, COUNT, HCCL_DATA_TYPE_INT32, me, comm, ctx->stream), HCCL_E_NOT_SUPPORT,
                     "HcclRecv", "srcRank", rank_text, "itself");
    /* With nothing to move, CANN returns before it looks at the peer. */
    H_EXPECT_HCCL(ctx, HcclSend(a, 0, HCCL_DATA_TYPE_INT32, me, comm, ctx->stream), HCCL_SUCCESS);
    H_EXPECT_HCCL(ctx, HcclRecv(b, 0, HCCL_DATA_TYPE_INT32, me, comm, ctx->stream), HCCL_SUCCESS);

    /* Nothing of the refused calls ran: the receive buffer is as it was. */
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(dev_holds(ctx, b, poison, bytes, "receive buffer after the refused calls"));
    H_ACL(ctx, aclrtFree(a));
    H_ACL(ctx, aclrtFree(b));
    free(host);
    free(poison);
    return 0;
}

/* ------------------------------------------------------------------------ HcclConfigGetInfo */

#define UDI "hcclpy-newer-udi"
#define ALGO "level0:ring;level1:pipeline"
#define CFG_BUFFER_MB 3u

/* A communicator over all ranks with a config that sets what HcclConfigGetInfo reports. */
static int make_config_comm(T *t, HcclComm *out)
{
    h_ctx *ctx = t->ctx;
    HcclRootInfo info;
    RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &info));
    HcclCommConfig config;
    HcclCommConfigInit(&config);
    config.hcclBufferSize = CFG_BUFFER_MB;
    config.hcclDeterministic = 2;   /* strict */
    config.hcclOpExpansionMode = 3; /* AIV, in the config's numbering */
    snprintf(config.hcclUdi, sizeof config.hcclUdi, "%s", UDI);
    snprintf(config.hcclAlgo, sizeof config.hcclAlgo, "%s", ALGO);
    *out = NULL;
    H_HCCL(ctx, HcclCommInitRootInfoConfig(ctx->nranks, &info, ctx->rank, &config, out));
    return 0;
}

/* `info` of `len` bytes holds `text` followed by zero bytes only. */
static int text_then_zeros(const char *info, size_t len, const char *text)
{
    size_t n = strlen(text);
    if (memcmp(info, text, n) != 0)
        return 0;
    for (size_t i = n; i < len; i++)
        if (info[i] != '\0')
            return 0;
    return 1;
}

static int config_info(T *t, HcclComm cfg)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclConfigGetInfo, every HcclConfigType"))
        return 0;
    _Static_assert(HCCL_CONFIG_TYPE_INVALID == -1 && HCCL_CONFIG_TYPE_OP_EXPANSION_MODE == 0 &&
                       HCCL_CONFIG_TYPE_HCCL_ALGO == 1 && HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM == 2 &&
                       HCCL_CONFIG_TYPE_DETERMINISTIC == 3 && HCCL_CONFIG_TYPE_UDI == 4,
                   "HcclConfigType as CANN's hccl_comm.h numbers it");
    /* Operation expansion mode: infoLen must be its exact size. */
    HcclConfigTypeOpExpansionMode mode = HCCL_OP_EXPANSION_MODE_INVALID;
    H_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof mode, &mode));
    H_EXPECT(ctx, mode == HCCL_OP_EXPANSION_MODE_AIV, "expansion mode %d, expected AIV (1)", (int)mode);
    uint64_t wide = 99;
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_OP_EXPANSION_MODE, sizeof wide, &wide),
                     HCCL_E_PARA, "HCCL_CONFIG_TYPE_OP_EXPANSION_MODE", "infoLen");
    H_EXPECT(ctx, wide == 99, "a refused query wrote its output");

    /* Algorithm string: infoLen at least HCCL_COMM_ALGO_MAX_LENGTH; the rest of info is cleared. */
    char algo[HCCL_COMM_ALGO_MAX_LENGTH + 8];
    memset(algo, 'x', sizeof algo);
    H_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_HCCL_ALGO, sizeof algo, algo));
    H_EXPECT(ctx, text_then_zeros(algo, sizeof algo, ALGO), "hcclAlgo reads as '%.60s'", algo);
    memset(algo, 'x', sizeof algo);
    H_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_HCCL_ALGO, HCCL_COMM_ALGO_MAX_LENGTH, algo));
    const char *env_algo = getenv("HCCL_ALGO");
    H_EXPECT(ctx, text_then_zeros(algo, HCCL_COMM_ALGO_MAX_LENGTH, env_algo != NULL ? env_algo : ""),
             "a communicator without hcclAlgo reads as '%.60s' (HCCL_ALGO is '%s')", algo,
             env_algo != NULL ? env_algo : "(unset)");
    memset(algo, 'x', sizeof algo);
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_HCCL_ALGO, HCCL_COMM_ALGO_MAX_LENGTH - 1, algo),
                     HCCL_E_PARA, "HCCL_CONFIG_TYPE_HCCL_ALGO", ">= 1600");
    H_EXPECT(ctx, algo[0] == 'x', "a refused query wrote its output");

    /* UB channels and determinism: exactly a uint32_t. */
    uint32_t value = 77;
    H_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM, sizeof value, &value));
    H_EXPECT(ctx, value >= 1 && value <= 16, "UB multi-channel number %u, expected one in [1, 16]", value);
    H_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, &value));
    H_EXPECT(ctx, value == 2, "deterministic level from the config: %u, expected 2 (strict)", value);
    HcclConfigValue global = {-1};
    H_HCCL(ctx, HcclGetConfig(HCCL_DETERMINISTIC, &global));
    H_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, &value));
    H_EXPECT(ctx, value == (uint32_t)global.value, "deterministic level without a config: %u, process-wide %d",
             value, (int)global.value);
    HcclConfigValue one = {1};
    H_HCCL(ctx, HcclSetCommConfig(t->comm, HCCL_DETERMINISTIC, one));
    H_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, &value));
    H_EXPECT(ctx, value == 1, "deterministic level after HcclSetCommConfig(1): %u", value);
    value = 77;
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof(uint16_t), &value),
                     HCCL_E_PARA, "HCCL_CONFIG_TYPE_DETERMINISTIC", "== 4");
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM, 8, &wide), HCCL_E_PARA,
                     "HCCL_CONFIG_TYPE_UB_MULTI_CHANNEL_NUM");
    H_EXPECT(ctx, value == 77, "a refused query wrote its output");

    /* UDI: infoLen at least UDI_MAX_LENGTH. */
    char udi[UDI_MAX_LENGTH];
    memset(udi, 'x', sizeof udi);
    H_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_UDI, sizeof udi, udi));
    H_EXPECT(ctx, text_then_zeros(udi, sizeof udi, UDI), "hcclUdi reads as '%.60s'", udi);
    memset(udi, 'x', sizeof udi);
    H_HCCL(ctx, HcclConfigGetInfo(t->comm, HCCL_CONFIG_TYPE_UDI, sizeof udi, udi));
    H_EXPECT(ctx, text_then_zeros(udi, sizeof udi, ""), "a communicator without hcclUdi reads as '%.60s'", udi);
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_UDI, UDI_MAX_LENGTH - 1, udi), HCCL_E_PARA,
                     "HCCL_CONFIG_TYPE_UDI", ">= 128");

    /* Unknown items and missing pointers. */
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_INVALID, sizeof value, &value), HCCL_E_PARA,
                     "unknown configuration type -1");
    H_EXPECT_REFUSED(ctx, HcclConfigGetInfo(cfg, (HcclConfigType)5, sizeof value, &value), HCCL_E_PARA,
                     "unknown configuration type 5");
    H_EXPECT_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, NULL), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclConfigGetInfo(NULL, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, &value), HCCL_E_PTR);
    return 0;
}

/* ----------------------------------------------------------------- HcclGetHeterogMode */

static int heterog_mode(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclGetHeterogMode"))
        return 0;
    _Static_assert(HCCL_HETEROG_MODE_INVALID == -1 && HCCL_HETEROG_MODE_HOMOGENEOUS == 0 &&
                       HCCL_HETEROG_MODE_MIX_A2_A3 == 1,
                   "HcclHeterogMode as CANN's hccl_rank_graph.h numbers it");
    HcclHeterogMode mode = HCCL_HETEROG_MODE_INVALID;
    H_HCCL(ctx, HcclGetHeterogMode(t->comm, &mode));
    H_EXPECT(ctx, mode == HCCL_HETEROG_MODE_HOMOGENEOUS, "heterogeneous mode %d, expected HOMOGENEOUS (0)", (int)mode);
    mode = HCCL_HETEROG_MODE_INVALID;
    H_HCCL(ctx, HcclGetHeterogMode(t->solo, &mode));
    H_EXPECT(ctx, mode == HCCL_HETEROG_MODE_HOMOGENEOUS, "one-rank communicator: mode %d", (int)mode);
    H_EXPECT_REFUSED(ctx, HcclGetHeterogMode(t->comm, NULL), HCCL_E_PTR, "mode is NULL");
    H_EXPECT_HCCL(ctx, HcclGetHeterogMode(NULL, &mode), HCCL_E_PTR);
    return 0;
}

/* ------------------------------------------------------------ memory registration */

static int registrations(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclCommRegister: one registration at a time, CANN's codes"))
        return 0;
    void *a, *b;
    RUN(dev_with(ctx, &a, NULL, 4096, 0));
    RUN(dev_with(ctx, &b, NULL, 4096, 0));
    void *handle = NULL, *second = (void *)0x1;
    H_HCCL(ctx, HcclCommRegister(t->comm, a, 4096, &handle, 0));
    H_EXPECT(ctx, handle != NULL, "HcclCommRegister gave a NULL handle");
    /* A second registration, of the same memory or of other memory, is refused. */
    H_EXPECT_REFUSED(ctx, HcclCommRegister(t->comm, a, 4096, &second, 0), HCCL_E_NOT_SUPPORT, "already has");
    H_EXPECT_REFUSED(ctx, HcclCommRegister(t->comm, b, 4096, &second, 0), HCCL_E_NOT_SUPPORT, "one HcclCommRegister");
    H_EXPECT(ctx, second == (void *)0x1, "a refused registration wrote a handle");
    /* Another communicator has registrations of its own. */
    void *solo_handle = NULL;
    H_HCCL(ctx, HcclCommRegister(t->solo, b, 4096, &solo_handle, 0));
    /* Exchanging a handle this communicator does not hold: HCCL_E_NOT_FOUND. */
    uint32_t peer[1] = {(ctx->rank + 1) % ctx->nranks};
    H_HCCL(ctx, HcclCommExchangeMem(t->comm, handle, peer, 1));
    H_EXPECT_REFUSED(ctx, HcclCommExchangeMem(t->comm, solo_handle, peer, 1), HCCL_E_NOT_FOUND, "not a live");
    H_EXPECT_REFUSED(ctx, HcclCommExchangeMem(t->comm, a, peer, 1), HCCL_E_NOT_FOUND, "not a live");
    /* Releasing a handle the communicator does not hold changes nothing and is no error (CANN). */
    H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, solo_handle), HCCL_SUCCESS);
    H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, a), HCCL_SUCCESS);
    H_EXPECT_REFUSED(ctx, HcclCommRegister(t->comm, b, 4096, &second, 0), HCCL_E_NOT_SUPPORT, "already has");
    H_HCCL(ctx, HcclCommDeregister(t->comm, handle));
    H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, handle), HCCL_SUCCESS); /* twice: nothing left to release */
    H_EXPECT_REFUSED(ctx, HcclCommExchangeMem(t->comm, handle, peer, 1), HCCL_E_NOT_FOUND, "not a live");
    /* Once released, the communicator takes a registration again. */
    H_HCCL(ctx, HcclCommRegister(t->comm, b, 4096, &second, 0));
    H_HCCL(ctx, HcclCommDeregister(t->comm, second));
    H_HCCL(ctx, HcclCommDeregister(t->solo, solo_handle));
    /* Bad arguments. */
    H_EXPECT_HCCL(ctx, HcclCommRegister(NULL, a, 4096, &handle, 0), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, NULL, 4096, &handle, 0), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, a, 4096, NULL, 0), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommRegister(t->comm, a, 0, &handle, 0), HCCL_E_PARA);
    H_EXPECT_HCCL(ctx, HcclCommDeregister(t->comm, NULL), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommDeregister(NULL, a), HCCL_E_PTR);
    H_ACL(ctx, aclrtFree(a));
    H_ACL(ctx, aclrtFree(b));
    return 0;
}

/* -------------------------------------------------------------------- HcclGetHcclBuffer */

/* The buffer size HCCL_BUFFSIZE gives a communicator without hcclBufferSize, in bytes. */
static uint64_t env_buffer_bytes(void)
{
    const char *text = getenv("HCCL_BUFFSIZE");
    unsigned long mb = text != NULL ? strtoul(text, NULL, 10) : 0;
    return 2ull * (mb >= 1 ? mb : 200) << 20;
}

static int hccl_buffer(T *t, HcclComm cfg)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclGetHcclBuffer"))
        return 0;
    void *buffer = NULL, *again = NULL;
    uint64_t size = 0, size_again = 0;
    H_HCCL(ctx, HcclGetHcclBuffer(cfg, &buffer, &size));
    H_EXPECT(ctx, buffer != NULL && size == 2ull * CFG_BUFFER_MB << 20,
             "buffer %p of %llu bytes, expected twice hcclBufferSize = %llu bytes", buffer, (unsigned long long)size,
             2ull * CFG_BUFFER_MB << 20);
    H_HCCL(ctx, HcclGetHcclBuffer(cfg, &again, &size_again));
    H_EXPECT(ctx, again == buffer && size_again == size, "a second call gave %p (%llu bytes), the first %p", again,
             (unsigned long long)size_again, buffer);
    /* It is real device memory of the communicator's device: copies reach all of it, and a
     * collective runs on it (rank 0 broadcasts into the last bytes of every rank's buffer). */
    size_t bytes = COUNT * 4;
    uint8_t *host = h_xmalloc(bytes), *from_root = h_xmalloc(bytes);
    h_fill(HCCL_DATA_TYPE_UINT32, H_GEN_MOVE, ctx->rank, 0, COUNT, host);
    h_fill(HCCL_DATA_TYPE_UINT32, H_GEN_MOVE, 0, 0, COUNT, from_root);
    char *tail = (char *)buffer + size - bytes;
    H_ACL(ctx, aclrtMemcpy(buffer, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    RUN(dev_holds(ctx, buffer, host, bytes, "head of the HCCL buffer"));
    H_ACL(ctx, aclrtMemcpy(tail, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    H_HCCL(ctx, HcclBroadcast(tail, COUNT, HCCL_DATA_TYPE_UINT32, 0, cfg, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(dev_holds(ctx, tail, from_root, bytes, "broadcast into the HCCL buffer"));
    free(host);
    free(from_root);
    /* The HCCL buffer and registered memory exclude each other. */
    void *handle = NULL;
    H_EXPECT_REFUSED(ctx, HcclCommRegister(cfg, buffer, 4096, &handle, 0), HCCL_E_NOT_SUPPORT, "HCCL buffer");

    /* Without hcclBufferSize: twice HCCL_BUFFSIZE (200 MB when unset). */
    H_HCCL(ctx, HcclGetHcclBuffer(t->solo, &buffer, &size));
    H_EXPECT(ctx, size == env_buffer_bytes(), "buffer of %llu bytes without a config, expected %llu",
             (unsigned long long)size, (unsigned long long)env_buffer_bytes());
    H_ACL(ctx, aclrtMemset(buffer, size, 0x3c, 64));

    /* Made on the communicator's own device only. */
    int32_t other = (ctx->device + 1) % 8;
    H_ACL(ctx, aclrtSetDevice(other));
    char needle[48];
    snprintf(needle, sizeof needle, "is on device %d", ctx->device);
    H_EXPECT_REFUSED(ctx, HcclGetHcclBuffer(t->comm, &again, &size_again), HCCL_E_PARA, needle);
    H_ACL(ctx, aclrtSetDevice(ctx->device));
    H_ACL(ctx, aclrtResetDevice(other));
    H_ACL(ctx, aclrtResetDevice(ctx->device)); /* the second aclrtSetDevice of this device */

    H_EXPECT_HCCL(ctx, HcclGetHcclBuffer(NULL, &buffer, &size), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclGetHcclBuffer(cfg, NULL, &size), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclGetHcclBuffer(cfg, &buffer, NULL), HCCL_E_PTR);
    return 0;
}

/* ------------------------------------------------------------------- scalable root info */

/* The ranks that act as roots: nroot of them, spread over the ranks. */
static uint32_t root_rank(uint32_t i, uint32_t nroot, uint32_t nranks)
{
    return (uint32_t)((uint64_t)i * nranks / nroot);
}

/* nroot root infos, made by their roots and gathered on every rank in root order. */
static int scalable_list(h_ctx *ctx, uint32_t nroot, HcclRootInfo *list)
{
    HcclRootInfo mine;
    memset(&mine, 0, sizeof mine);
    for (uint32_t i = 0; i < nroot; i++)
        if (root_rank(i, nroot, ctx->nranks) == ctx->rank)
            H_HCCL(ctx, HcclGetRootInfoScalable(&mine));
    HcclRootInfo *all = h_xcalloc(ctx->nranks, sizeof *all);
    if (h_oob_allgather(ctx, &mine, all, sizeof mine) != 0) {
        free(all);
        return -1;
    }
    for (uint32_t i = 0; i < nroot; i++)
        list[i] = all[root_rank(i, nroot, ctx->nranks)];
    free(all);
    return 0;
}

static int scalable(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclGetRootInfoScalable / HcclCommInitRootInfoScalable"))
        return 0;
    uint32_t n = ctx->nranks, nroot = n < 3 ? n : 3;
    HcclRootInfo list[3];
    RUN(scalable_list(ctx, nroot, list));
    HcclCommConfig config;
    HcclCommConfigInit(&config);
    HcclComm comm = (HcclComm)0x1;

    /* Refused before anything is joined. */
    H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, 0, list, ctx->rank, 0, &config, &comm), HCCL_E_PARA,
                     "nRoot");
    H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, n + 1, list, ctx->rank, 0, &config, &comm), HCCL_E_PARA,
                     "nRoot");
    H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, nroot, list, ctx->rank, 1, &config, &comm), HCCL_E_PARA,
                     "nExtRoot");
    H_EXPECT_HCCL(ctx, HcclCommInitRootInfoScalable(n, nroot, NULL, ctx->rank, 0, &config, &comm), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommInitRootInfoScalable(n, nroot, list, ctx->rank, 0, NULL, &comm), HCCL_E_PTR);
    H_EXPECT_HCCL(ctx, HcclCommInitRootInfoScalable(n, nroot, list, ctx->rank, 0, &config, NULL), HCCL_E_PTR);
    HcclRootInfo bad[2];
    memset(bad, 0, sizeof bad);
    H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, 1, bad, ctx->rank, 0, &config, &comm), HCCL_E_PARA,
                     "rootInfoList[0]", "HcclGetRootInfoScalable");
    if (n >= 2) {
        bad[0] = list[0];
        H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, 2, bad, ctx->rank, 0, &config, &comm), HCCL_E_PARA,
                         "rootInfoList[1]");
        bad[1] = list[0];
        H_EXPECT_REFUSED(ctx, HcclCommInitRootInfoScalable(n, 2, bad, ctx->rank, 0, &config, &comm), HCCL_E_PARA,
                         "the same root info");
    }
    H_EXPECT(ctx, comm == (HcclComm)0x1, "a refused initialisation wrote a communicator");

    /* Every rank passes the same list: one communicator over all of them. */
    comm = NULL;
    H_HCCL(ctx, HcclCommInitRootInfoScalable(n, nroot, list, ctx->rank, 0, &config, &comm));
    uint32_t size = 0, id = n;
    H_HCCL(ctx, HcclGetRankSize(comm, &size));
    H_HCCL(ctx, HcclGetRankId(comm, &id));
    H_EXPECT(ctx, size == n && id == ctx->rank, "scalable communicator: rank %u of %u, expected %u of %u", id, size,
             ctx->rank, n);
    size_t bytes = COUNT * 4;
    uint8_t *host = h_xmalloc(bytes), *expected = h_xmalloc(bytes);
    h_fill(HCCL_DATA_TYPE_INT32, H_GEN_SUM, ctx->rank, 0, COUNT, host);
    h_reduce_fill(HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 0, COUNT, expected);
    void *d;
    RUN(dev_with(ctx, &d, host, bytes, 0));
    H_HCCL(ctx, HcclAllReduce(d, d, COUNT, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(dev_holds(ctx, d, expected, bytes, "AllReduce on the scalable communicator"));
    H_ACL(ctx, aclrtFree(d));
    free(host);
    free(expected);
    H_HCCL(ctx, HcclCommDestroy(comm));

    /* Ranks that pass different lists (here: rank 0 one root, the others two) all fail, at once. */
    if (n >= 2) {
        RUN(scalable_list(ctx, 2, list));
        comm = NULL;
        H_EXPECT_HCCL(ctx, HcclCommInitRootInfoScalable(n, ctx->rank == 0 ? 1 : 2, list, ctx->rank, 0, &config,
                                                        &comm), H_ANY_ERROR);
        RUN(h_oob_barrier(ctx));
    }
    return 0;
}

/* ------------------------------------------------------------------------------- the rank */

static int run_rank(h_ctx *ctx)
{
    T t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    RUN(h_rank_setup(ctx));
    RUN(h_world_comm(ctx, &t.comm));
    /* A communicator of this rank alone, from a root info of its own. */
    HcclRootInfo solo_info;
    H_HCCL(ctx, HcclGetRootInfo(&solo_info));
    H_HCCL(ctx, HcclCommInitRootInfo(1, &solo_info, 0, &t.solo));

    RUN(self_pairs(&t, t.comm, ctx->rank, "world"));
    RUN(self_pairs(&t, t.solo, 0, "one-rank communicator"));
    RUN(self_with_peers(&t));
    RUN(self_refusals(&t, t.comm, ctx->rank, "world"));
    RUN(self_refusals(&t, t.solo, 0, "one-rank communicator"));

    HcclComm cfg;
    RUN(make_config_comm(&t, &cfg));
    RUN(config_info(&t, cfg));
    RUN(heterog_mode(&t));
    RUN(registrations(&t));
    RUN(hccl_buffer(&t, cfg));
    RUN(scalable(&t));

    h_set_case(ctx, "teardown");
    H_HCCL(ctx, HcclCommDestroy(cfg));
    H_HCCL(ctx, HcclCommDestroy(t.solo));
    H_HCCL(ctx, HcclCommDestroy(t.comm));
    if (h_case(ctx, "destroyed communicators are refused")) {
        void *buffer;
        uint64_t size;
        HcclHeterogMode mode;
        uint32_t value;
        H_EXPECT_HCCL(ctx, HcclGetHcclBuffer(cfg, &buffer, &size), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclGetHeterogMode(cfg, &mode), HCCL_E_PARA);
        H_EXPECT_HCCL(ctx, HcclConfigGetInfo(cfg, HCCL_CONFIG_TYPE_DETERMINISTIC, sizeof value, &value), HCCL_E_PARA);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("hccl_newer", run_rank, NULL, NULL);
    return h_finish("hccl_newer", failed);
}
