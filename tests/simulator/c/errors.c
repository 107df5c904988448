/*
 * Bad arguments: the documented error code, a message in aclGetRecentErrMsg(), and no crash.
 *
 * usage: errors --ranks N --mode threads|procs|mixed
 *
 * Every check is local to a rank (no peer is involved), so a rank can run them all on its own;
 * the communicator they use is healthy before and after, which the last case checks. A call
 * that should have been refused but was accepted may have queued an operation that the other
 * ranks never join, so such a call stops the rank at once.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* An HCCL call that must be refused with `code` (H_ANY_ERROR: any non-zero code). */
#define REFUSED(ctx, call, code)                                                                \
    do {                                                                                        \
        long rc_ = (long)(call);                                                                \
        h_expect_rc((ctx), __FILE__, __LINE__, #call, rc_, (long)(code), 1);                    \
        if (rc_ == 0) {                                                                         \
            h_failf((ctx), __FILE__, __LINE__, "`%s` was accepted; an operation may now be "    \
                    "queued that no other rank joins: stopping", #call);                        \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)

/* An ACL call that must be refused. */
#define ACL_REFUSED(ctx, call, code)                                                            \
    (void)h_expect_rc((ctx), __FILE__, __LINE__, #call, (long)(call), (long)(code), 0)

/* An HCCL query that must be refused (accepting it does no harm). */
#define HCCL_REFUSED(ctx, call, code)                                                           \
    (void)h_expect_rc((ctx), __FILE__, __LINE__, #call, (long)(call), (long)(code), 1)

#define BUF 4096

typedef struct {
    h_ctx *ctx;
    HcclComm comm;
    aclrtStream st;
    void *a, *b; /* device buffers of BUF bytes */
    uint32_t n, me;
} T;

static int acl_errors(T *t)
{
    h_ctx *ctx = t->ctx;
    if (h_case(ctx, "aclInit twice")) {
        ACL_REFUSED(ctx, aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE);
    }
    if (h_case(ctx, "aclrtSetDevice out of range")) {
        uint32_t count = 0;
        H_ACL(ctx, aclrtGetDeviceCount(&count));
        ACL_REFUSED(ctx, aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID);
        ACL_REFUSED(ctx, aclrtSetDevice((int32_t)count), ACL_ERROR_RT_INVALID_DEVICEID);
        if (count <= 8) {
            ACL_REFUSED(ctx, aclrtSetDevice(8), ACL_ERROR_RT_INVALID_DEVICEID);
        }
        ACL_REFUSED(ctx, aclrtSetDevice(1 << 30), ACL_ERROR_RT_INVALID_DEVICEID);
        int32_t d = -1;
        H_ACL(ctx, aclrtGetDevice(&d));
        H_EXPECT(ctx, d == ctx->device, "a refused aclrtSetDevice changed the device to %d", d);
        ACL_REFUSED(ctx, aclrtResetDevice(-1), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtGetDevice(NULL), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtGetDeviceCount(NULL), H_ANY_ERROR);
    }
    if (h_case(ctx, "aclrtMalloc / aclrtFree misuse")) {
        void *p = NULL;
        ACL_REFUSED(ctx, aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMalloc(NULL, 64, ACL_MEM_MALLOC_HUGE_FIRST), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMalloc(&p, (size_t)1 << 60, ACL_MEM_MALLOC_HUGE_FIRST), H_ANY_ERROR);
        H_ACL(ctx, aclrtMalloc(&p, 1024, ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_REFUSED(ctx, aclrtFree((uint8_t *)p + 64), H_ANY_ERROR);
        H_ACL(ctx, aclrtFree(p));
        ACL_REFUSED(ctx, aclrtFree(p), H_ANY_ERROR);
        uint8_t local[64];
        ACL_REFUSED(ctx, aclrtFree(local), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtFree(NULL), H_ANY_ERROR);
        void *h = NULL;
        H_ACL(ctx, aclrtMallocHost(&h, 4096));
        H_ACL(ctx, aclrtFreeHost(h));
        ACL_REFUSED(ctx, aclrtFreeHost(h), H_ANY_ERROR);
    }
    if (h_case(ctx, "aclrtMemcpy / aclrtMemset misuse")) {
        uint8_t host[BUF];
        memset(host, 1, sizeof host);
        ACL_REFUSED(ctx, aclrtMemcpy(t->a, 16, host, 32, ACL_MEMCPY_HOST_TO_DEVICE), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMemcpy(NULL, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMemcpy(t->a, 16, NULL, 16, ACL_MEMCPY_HOST_TO_DEVICE), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMemset(t->a, 16, 0, 32), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtMemset(NULL, 16, 0, 16), H_ANY_ERROR);
    }
    if (h_case(ctx, "destroying a stream or an event twice")) {
        aclrtStream s = NULL;
        H_ACL(ctx, aclrtCreateStream(&s));
        H_ACL(ctx, aclrtDestroyStream(s));
        ACL_REFUSED(ctx, aclrtDestroyStream(s), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtSynchronizeStream(s), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtCreateStream(NULL), H_ANY_ERROR);
        aclrtEvent e = NULL;
        H_ACL(ctx, aclrtCreateEvent(&e));
        H_ACL(ctx, aclrtDestroyEvent(e));
        ACL_REFUSED(ctx, aclrtDestroyEvent(e), H_ANY_ERROR);
        ACL_REFUSED(ctx, aclrtCreateEvent(NULL), H_ANY_ERROR);
    }
    return 0;
}

static int null_pointers(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "NULL pointers -> HCCL_E_PTR")) {
        return 0;
    }
    const HcclDataType f32 = HCCL_DATA_TYPE_FP32;
    const HcclReduceOp sum = HCCL_REDUCE_SUM;
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    void *a = t->a, *b = t->b;
    uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS];
    for (uint32_t i = 0; i < t->n; i++) {
        cnt[i] = 1;
        dsp[i] = i;
    }
    REFUSED(ctx, HcclAllReduce(NULL, b, 16, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllReduce(a, NULL, 16, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclBroadcast(NULL, 16, f32, 0, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduce(NULL, b, 16, f32, sum, 0, c, s), HCCL_E_PTR);
    if (t->me == 0) {
        REFUSED(ctx, HcclReduce(a, NULL, 16, f32, sum, 0, c, s), HCCL_E_PTR);
        REFUSED(ctx, HcclScatter(NULL, b, 1, f32, 0, c, s), HCCL_E_PTR);
    }
    REFUSED(ctx, HcclScatter(a, NULL, 1, f32, 0, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGather(NULL, b, 1, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGather(a, NULL, 1, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduceScatter(NULL, b, 1, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduceScatter(a, NULL, 1, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAll(NULL, 1, f32, b, 1, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAll(a, 1, f32, NULL, 1, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAllV(a, NULL, dsp, f32, b, cnt, dsp, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAllV(a, cnt, NULL, f32, b, cnt, dsp, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAllV(a, cnt, dsp, f32, b, NULL, dsp, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAllV(a, cnt, dsp, f32, b, cnt, NULL, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAlltoAllVC(a, NULL, f32, b, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGatherV(a, 1, b, NULL, dsp, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGatherV(a, 1, b, cnt, NULL, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGatherV(NULL, 1, b, cnt, dsp, f32, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduceScatterV(a, NULL, dsp, b, 1, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduceScatterV(a, cnt, NULL, b, 1, f32, sum, c, s), HCCL_E_PTR);
    REFUSED(ctx, HcclReduceScatterV(a, cnt, dsp, NULL, 1, f32, sum, c, s), HCCL_E_PTR);
    if (t->n >= 2) {
        uint32_t peer = (t->me + 1) % t->n;
        REFUSED(ctx, HcclSend(NULL, 16, f32, peer, c, s), HCCL_E_PTR);
        REFUSED(ctx, HcclRecv(NULL, 16, f32, peer, c, s), HCCL_E_PTR);
        HcclSendRecvItem item = {HCCL_SEND, NULL, 16, f32, peer};
        REFUSED(ctx, HcclBatchSendRecv(&item, 1, c, s), HCCL_E_PTR);
    }
    REFUSED(ctx, HcclBatchSendRecv(NULL, 1, c, s), HCCL_E_PTR);

    uint32_t v;
    char name[COMM_NAME_MAX_LENGTH];
    HcclResult async;
    HCCL_REFUSED(ctx, HcclGetRankSize(c, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetRankId(c, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetCommName(c, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetCommAsyncError(c, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetRootInfo(NULL), HCCL_E_PTR);
    HcclRootInfo ri;
    memset(&ri, 0, sizeof ri);
    HcclComm nc = NULL;
    HCCL_REFUSED(ctx, HcclCommInitRootInfo(1, NULL, 0, &nc), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclCommInitRootInfo(1, &ri, 0, NULL), HCCL_E_PTR);
    int32_t devs[1] = {ctx->device};
    HCCL_REFUSED(ctx, HcclCommInitAll(1, devs, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclCommInitAll(1, NULL, &nc), HCCL_E_PTR);

    h_set_case(ctx, "NULL comm or stream -> HCCL_E_PTR");
    REFUSED(ctx, HcclAllReduce(a, b, 16, f32, sum, NULL, s), HCCL_E_PTR);
    REFUSED(ctx, HcclAllReduce(a, b, 16, f32, sum, c, NULL), HCCL_E_PTR);
    REFUSED(ctx, HcclBroadcast(a, 16, f32, 0, NULL, s), HCCL_E_PTR);
    REFUSED(ctx, HcclBroadcast(a, 16, f32, 0, c, NULL), HCCL_E_PTR);
    REFUSED(ctx, HcclAllGather(a, b, 1, f32, c, NULL), HCCL_E_PTR);
    REFUSED(ctx, HcclBarrier(NULL, s), HCCL_E_PTR);
    REFUSED(ctx, HcclBarrier(c, NULL), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetRankSize(NULL, &v), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetRankId(NULL, &v), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetCommName(NULL, name), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclGetCommAsyncError(NULL, &async), HCCL_E_PTR);
    HCCL_REFUSED(ctx, HcclCommDestroy(NULL), H_ANY_ERROR);
    return 0;
}

static int dtypes_and_ops(T *t)
{
    h_ctx *ctx = t->ctx;
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    void *a = t->a, *b = t->b;
    if (h_case(ctx, "unknown dtype / op -> HCCL_E_PARA")) {
        const int bad_dt[] = {13, 18, 100, 254, HCCL_DATA_TYPE_RESERVED, -1};
        for (size_t i = 0; i < sizeof bad_dt / sizeof bad_dt[0]; i++) {
            HcclDataType dt = (HcclDataType)bad_dt[i];
            REFUSED(ctx, HcclAllReduce(a, b, 16, dt, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
            REFUSED(ctx, HcclBroadcast(a, 16, dt, 0, c, s), HCCL_E_PARA);
            REFUSED(ctx, HcclAllGather(a, b, 1, dt, c, s), HCCL_E_PARA);
        }
        const int bad_op[] = {4, 5, 100, HCCL_REDUCE_RESERVED, -1};
        for (size_t i = 0; i < sizeof bad_op / sizeof bad_op[0]; i++) {
            HcclReduceOp op = (HcclReduceOp)bad_op[i];
            REFUSED(ctx, HcclAllReduce(a, b, 16, HCCL_DATA_TYPE_FP32, op, c, s), HCCL_E_PARA);
            REFUSED(ctx, HcclReduce(a, b, 16, HCCL_DATA_TYPE_FP32, op, 0, c, s), HCCL_E_PARA);
            REFUSED(ctx, HcclReduceScatter(a, b, 1, HCCL_DATA_TYPE_FP32, op, c, s), HCCL_E_PARA);
        }
        REFUSED(ctx, HcclAlltoAll(a, 1, HCCL_DATA_TYPE_FP32, b, 1, HCCL_DATA_TYPE_INT32, c, s),
                H_ANY_ERROR);
        uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS];
        for (uint32_t i = 0; i < t->n; i++) {
            cnt[i] = 1;
            dsp[i] = i;
        }
        REFUSED(ctx, HcclAlltoAllV(a, cnt, dsp, HCCL_DATA_TYPE_FP32, b, cnt, dsp,
                                   HCCL_DATA_TYPE_INT32, c, s), H_ANY_ERROR);
    }
    if (h_case(ctx, "int128 / fp8 dtypes -> HCCL_E_NOT_SUPPORT")) {
        const HcclDataType ns[] = {HCCL_DATA_TYPE_INT128, HCCL_DATA_TYPE_HIF8,
                                   HCCL_DATA_TYPE_FP8E4M3, HCCL_DATA_TYPE_FP8E5M2,
                                   HCCL_DATA_TYPE_FP8E8M0};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            REFUSED(ctx, HcclAllReduce(a, b, 16, ns[i], HCCL_REDUCE_SUM, c, s), HCCL_E_NOT_SUPPORT);
            REFUSED(ctx, HcclBroadcast(a, 16, ns[i], 0, c, s), HCCL_E_NOT_SUPPORT);
            REFUSED(ctx, HcclAllGather(a, b, 1, ns[i], c, s), HCCL_E_NOT_SUPPORT);
            if (t->n >= 2) {
                REFUSED(ctx, HcclSend(a, 16, ns[i], (t->me + 1) % t->n, c, s), HCCL_E_NOT_SUPPORT);
            }
        }
    }
    return 0;
}

static int ranges(T *t)
{
    h_ctx *ctx = t->ctx;
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    void *a = t->a, *b = t->b;
    const HcclDataType f32 = HCCL_DATA_TYPE_FP32;
    uint32_t n = t->n;
    if (h_case(ctx, "root / peer out of range")) {
        REFUSED(ctx, HcclBroadcast(a, 16, f32, n, c, s), H_ANY_ERROR);
        REFUSED(ctx, HcclBroadcast(a, 16, f32, UINT32_MAX, c, s), H_ANY_ERROR);
        REFUSED(ctx, HcclReduce(a, b, 16, f32, HCCL_REDUCE_SUM, n, c, s), H_ANY_ERROR);
        REFUSED(ctx, HcclScatter(a, b, 1, f32, n + 5, c, s), H_ANY_ERROR);
        REFUSED(ctx, HcclSend(a, 16, f32, n, c, s), H_ANY_ERROR);
        REFUSED(ctx, HcclRecv(b, 16, f32, n + 1, c, s), H_ANY_ERROR);
        HcclSendRecvItem item = {HCCL_RECV, b, 16, f32, n};
        REFUSED(ctx, HcclBatchSendRecv(&item, 1, c, s), H_ANY_ERROR);
    }
    if (h_case(ctx, "count > 0x7FFFFFFFF -> HCCL_E_PARA")) {
        const uint64_t big = 0x800000000ULL;
        REFUSED(ctx, HcclAllReduce(a, b, big, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclAllReduce(a, b, UINT64_MAX, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclBroadcast(a, big, HCCL_DATA_TYPE_INT8, 0, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAllGather(a, b, big, HCCL_DATA_TYPE_INT8, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclReduceScatter(a, b, big, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        if (n >= 2) {
            REFUSED(ctx, HcclSend(a, big, HCCL_DATA_TYPE_INT8, (t->me + 1) % n, c, s), HCCL_E_PARA);
        }
    }
    if (h_case(ctx, "in-place where it is forbidden -> HCCL_E_PARA")) {
        uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS], mat[H_MAX_RANKS * H_MAX_RANKS];
        for (uint32_t i = 0; i < n; i++) {
            cnt[i] = 1;
            dsp[i] = i;
        }
        for (uint32_t i = 0; i < n * n; i++) {
            mat[i] = 1;
        }
        REFUSED(ctx, HcclAlltoAll(a, 1, f32, a, 1, f32, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAlltoAllV(a, cnt, dsp, f32, a, cnt, dsp, f32, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAlltoAllVC(a, mat, f32, a, f32, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAllGatherV(a, 1, a, cnt, dsp, f32, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclReduceScatterV(a, cnt, dsp, a, 1, f32, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
    }
    if (h_case(ctx, "misaligned buffer for a reduction -> HCCL_E_PARA")) {
        uint8_t *pa = (uint8_t *)a, *pb = (uint8_t *)b;
        REFUSED(ctx, HcclAllReduce(pa + 1, pb, 16, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAllReduce(pa, pb + 2, 16, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAllReduce(pa + 1, pb + 1, 16, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclAllReduce(pa + 4, pb + 4, 16, HCCL_DATA_TYPE_FP64, HCCL_REDUCE_MAX, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclAllReduce(pa + 1, pb + 1, 16, HCCL_DATA_TYPE_BFP16, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclReduce(pa + 2, pb, 16, f32, HCCL_REDUCE_SUM, 0, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclReduceScatter(pa + 1, pb, 1, HCCL_DATA_TYPE_FP16, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS];
        for (uint32_t i = 0; i < n; i++) {
            cnt[i] = 1;
            dsp[i] = i;
        }
        REFUSED(ctx, HcclReduceScatterV(pa + 2, cnt, dsp, pb, 1, f32, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
        REFUSED(ctx, HcclReduceScatterV(pa, cnt, dsp, pb + 1, 1, f32, HCCL_REDUCE_SUM, c, s),
                HCCL_E_PARA);
    }
    return 0;
}

/* An HCCL call refused with `code` whose aclGetRecentErrMsg() contains `needle`; -1 (stop the
 * rank) if it was accepted, as REFUSED does. */
static int refused_saying(h_ctx *ctx, int line, const char *call, long rc, long code,
                          const char *needle)
{
    const char *m = aclGetRecentErrMsg(); /* read once: the call is evaluated before this runs */
    char text[1024];
    snprintf(text, sizeof text, "%s", m ? m : "");
    ctx->checks++;
    if (rc != code) {
        h_failf(ctx, __FILE__, line, "`%s` returned %ld, expected %ld; aclGetRecentErrMsg: \"%s\"",
                call, rc, code, text);
        return rc == 0 ? -1 : 0;
    }
    H_EXPECT(ctx, strstr(text, needle) != NULL, "`%s`: aclGetRecentErrMsg \"%s\" does not "
             "mention \"%s\"", call, text, needle);
    return 0;
}
#define REFUSED_SAYING(ctx, call, code, needle)                                                 \
    RUN(refused_saying((ctx), __LINE__, #call, (long)(call), (long)(code), (needle)))

/* AllGatherV and ReduceScatterV take this rank's count twice (the scalar and its own entry of the
 * vector); a mismatch is refused by the call itself, not by the stream synchronisation, and
 * leaves the communicator working (still_healthy checks that at the end). */
static int own_counts(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "V operations: this rank's own count given twice, differently -> HCCL_E_PARA")) {
        return 0;
    }
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    void *a = t->a, *b = t->b;
    const HcclDataType f32 = HCCL_DATA_TYPE_FP32;
    const HcclReduceOp sum = HCCL_REDUCE_SUM;
    uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS];
    for (uint32_t i = 0; i < t->n; i++) {
        cnt[i] = 2;
        dsp[i] = 2 * i;
    }
    char agv[64], rsv[64];
    snprintf(agv, sizeof agv, "recvCounts[%u] = 2", t->me);
    snprintf(rsv, sizeof rsv, "sendCounts[%u] = 2", t->me);
    REFUSED_SAYING(ctx, HcclAllGatherV(a, 3, b, cnt, dsp, f32, c, s), HCCL_E_PARA, agv);
    REFUSED_SAYING(ctx, HcclAllGatherV(a, 1, b, cnt, dsp, f32, c, s), HCCL_E_PARA, "sendCount = 1");
    REFUSED_SAYING(ctx, HcclAllGatherV(a, 0, b, cnt, dsp, f32, c, s), HCCL_E_PARA, agv);
    REFUSED_SAYING(ctx, HcclReduceScatterV(a, cnt, dsp, b, 3, f32, sum, c, s), HCCL_E_PARA, rsv);
    REFUSED_SAYING(ctx, HcclReduceScatterV(a, cnt, dsp, b, 1, f32, sum, c, s), HCCL_E_PARA,
                   "recvCount = 1");
    REFUSED_SAYING(ctx, HcclReduceScatterV(a, cnt, dsp, b, 0, f32, sum, c, s), HCCL_E_PARA, rsv);
    /* only this rank's entry is this rank's business: the others' are checked when they run */
    cnt[t->me] = 0;
    REFUSED_SAYING(ctx, HcclAllGatherV(a, 2, b, cnt, dsp, f32, c, s), HCCL_E_PARA, "= 0");
    REFUSED_SAYING(ctx, HcclReduceScatterV(a, cnt, dsp, b, 2, f32, sum, c, s), HCCL_E_PARA, "= 0");
    /* refused inside a group too: nothing is held for HcclGroupEnd */
    cnt[t->me] = 2;
    H_HCCL(ctx, HcclGroupStart());
    REFUSED_SAYING(ctx, HcclAllGatherV(a, 5, b, cnt, dsp, f32, c, s), HCCL_E_PARA, agv);
    REFUSED_SAYING(ctx, HcclReduceScatterV(a, cnt, dsp, b, 5, f32, sum, c, s), HCCL_E_PARA, rsv);
    H_HCCL(ctx, HcclGroupEnd());
    H_ACL(ctx, aclrtSynchronizeStream(s));
    HcclResult async = HCCL_E_INTERNAL;
    H_HCCL(ctx, HcclGetCommAsyncError(c, &async));
    H_EXPECT(ctx, async == HCCL_SUCCESS, "HcclGetCommAsyncError = %d after refused V operations",
             (int)async);
    return 0;
}

static int not_device_memory(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "host memory / freed memory -> HCCL_E_PTR")) {
        return 0;
    }
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    void *a = t->a, *b = t->b;
    const HcclDataType f32 = HCCL_DATA_TYPE_FP32;
    uint8_t stack_buf[BUF];
    memset(stack_buf, 0, sizeof stack_buf);
    uint8_t *heap = (uint8_t *)h_xmalloc(BUF);
    void *pinned = NULL, *freed = NULL;
    H_ACL(ctx, aclrtMallocHost(&pinned, BUF));
    H_ACL(ctx, aclrtMalloc(&freed, BUF, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtFree(freed));
    void *bad[] = {stack_buf, heap, pinned, freed};
    const char *what[] = {"stack", "malloc", "aclrtMallocHost", "freed aclrtMalloc"};
    for (size_t i = 0; i < 4; i++) {
        h_set_case(ctx, "%s memory -> HCCL_E_PTR", what[i]);
        REFUSED(ctx, HcclAllReduce(bad[i], b, 16, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PTR);
        REFUSED(ctx, HcclAllReduce(a, bad[i], 16, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PTR);
        REFUSED(ctx, HcclBroadcast(bad[i], 16, f32, 0, c, s), HCCL_E_PTR);
        REFUSED(ctx, HcclAllGather(a, bad[i], 1, f32, c, s), HCCL_E_PTR);
        if (t->n >= 2) {
            REFUSED(ctx, HcclSend(bad[i], 16, f32, (t->me + 1) % t->n, c, s), HCCL_E_PTR);
            REFUSED(ctx, HcclRecv(bad[i], 16, f32, (t->me + 1) % t->n, c, s), HCCL_E_PTR);
        }
    }
    H_ACL(ctx, aclrtFreeHost(pinned));
    free(heap);
    return 0;
}

static int past_the_end(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "count past the end of the allocation -> HCCL_E_PARA")) {
        return 0;
    }
    HcclComm c = t->comm;
    aclrtStream s = t->st;
    uint8_t *a = (uint8_t *)t->a, *b = (uint8_t *)t->b;
    const HcclDataType f32 = HCCL_DATA_TYPE_FP32, u8 = HCCL_DATA_TYPE_UINT8;
    uint32_t n = t->n;
    REFUSED(ctx, HcclAllReduce(a, b, BUF / 4 + 1, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
    REFUSED(ctx, HcclAllReduce(a + 4, b, BUF / 4, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
    REFUSED(ctx, HcclAllReduce(a, b + 4, BUF / 4, f32, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
    REFUSED(ctx, HcclBroadcast(a, BUF + 1, u8, 0, c, s), HCCL_E_PARA);
    REFUSED(ctx, HcclReduce(a, b, BUF / 4 + 1, f32, HCCL_REDUCE_SUM, 0, c, s), HCCL_E_PARA);
    if (n >= 2) {
        /* the receive side of AllGather / send side of ReduceScatter hold N blocks */
        REFUSED(ctx, HcclAllGather(a, b, BUF, u8, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclReduceScatter(a, b, BUF, u8, HCCL_REDUCE_SUM, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclAlltoAll(a, BUF / n + 1, u8, b, BUF / n + 1, u8, c, s), HCCL_E_PARA);
        uint32_t peer = (t->me + 1) % n;
        REFUSED(ctx, HcclSend(a, BUF + 1, u8, peer, c, s), HCCL_E_PARA);
        REFUSED(ctx, HcclRecv(b + 1, BUF, u8, peer, c, s), HCCL_E_PARA);
        HcclSendRecvItem item = {HCCL_SEND, a, BUF + 8, u8, peer};
        REFUSED(ctx, HcclBatchSendRecv(&item, 1, c, s), HCCL_E_PARA);
    }
    if (t->me == 0) {
        REFUSED(ctx, HcclScatter(a, b, BUF / n + 1, u8, 0, c, s), HCCL_E_PARA);
    }
    uint64_t cnt[H_MAX_RANKS], dsp[H_MAX_RANKS];
    for (uint32_t i = 0; i < n; i++) {
        cnt[i] = 1;
        dsp[i] = i;
    }
    dsp[n - 1] = BUF; /* the last block starts at the end */
    REFUSED(ctx, HcclAlltoAllV(a, cnt, dsp, u8, b, cnt, dsp, u8, c, s), HCCL_E_PARA);
    REFUSED(ctx, HcclAllGatherV(a, 1, b, cnt, dsp, u8, c, s), HCCL_E_PARA);
    return 0;
}

static int init_errors(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "communicator init errors")) {
        return 0;
    }
    /* a root info of this rank's own, so that nothing here can join another rank */
    HcclRootInfo ri;
    H_HCCL(ctx, HcclGetRootInfo(&ri));
    HcclComm nc = NULL;
    HCCL_REFUSED(ctx, HcclCommInitRootInfo(1, &ri, 1, &nc), H_ANY_ERROR);
    HCCL_REFUSED(ctx, HcclCommInitRootInfo(1, &ri, 7, &nc), H_ANY_ERROR);
    HCCL_REFUSED(ctx, HcclCommInitRootInfo(0, &ri, 0, &nc), H_ANY_ERROR);
    HcclCommConfig cfg;
    HcclCommConfigInit(&cfg);
    uint32_t bad_magic = 0x12345678U;
    memcpy(cfg.reserved + 8, &bad_magic, sizeof bad_magic);
    HCCL_REFUSED(ctx, HcclCommInitRootInfoConfig(1, &ri, 0, &cfg, &nc), HCCL_E_PARA);
    HCCL_REFUSED(ctx, HcclCommInitRootInfoConfig(1, &ri, 0, NULL, &nc), HCCL_E_PTR);
    int32_t dup[2] = {ctx->device, ctx->device};
    HcclComm two[2] = {NULL, NULL};
    long rc = (long)HcclCommInitAll(2, dup, two);
    h_expect_rc(ctx, __FILE__, __LINE__, "HcclCommInitAll(2, {d, d}, comms)", rc, H_ANY_ERROR, 1);
    if (rc == 0) {
        HcclCommDestroy(two[0]);
        HcclCommDestroy(two[1]);
    }
    int32_t bad_dev[1] = {-3};
    HCCL_REFUSED(ctx, HcclCommInitAll(1, bad_dev, two), H_ANY_ERROR);
    HCCL_REFUSED(ctx, HcclCommInitAll(0, dup, two), H_ANY_ERROR);
    /* the rank's own root info still works for a 1-rank comm afterwards */
    H_HCCL(ctx, HcclGetRootInfo(&ri));
    H_HCCL(ctx, HcclCommInitRootInfo(1, &ri, 0, &nc));
    uint32_t v = 0;
    H_HCCL(ctx, HcclGetRankSize(nc, &v));
    H_EXPECT(ctx, v == 1, "1-rank comm has size %u", v);
    H_HCCL(ctx, HcclCommDestroy(nc));
    return 0;
}

/* A 1-rank communicator with `cfg`, from a root info of this rank's own. */
static HcclResult own_comm(const HcclCommConfig *cfg, HcclComm *comm)
{
    HcclRootInfo ri;
    HcclResult rc = HcclGetRootInfo(&ri);
    return rc != HCCL_SUCCESS ? rc : HcclCommInitRootInfoConfig(1, &ri, 0, cfg, comm);
}

/* Config fields out of their ranges (reference §2.7.6) are refused, by the API that was called
 * (in a group too), and so is the name of another live communicator of the process. */
static int config_errors(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "communicator config errors")) {
        return 0;
    }
    HcclComm nc = NULL;
    HcclCommConfig cfg;
    HcclCommConfigInit(&cfg);
    cfg.hcclQos = 8;
    H_EXPECT_REFUSED(ctx, own_comm(&cfg, &nc), HCCL_E_PARA, "HcclCommInitRootInfoConfig", "hcclQos");
    HcclCommConfigInit(&cfg);
    cfg.hcclOpExpansionMode = 99;
    H_EXPECT_REFUSED(ctx, own_comm(&cfg, &nc), HCCL_E_PARA, "HcclCommInitRootInfoConfig",
                     "hcclOpExpansionMode");
    HcclRootInfo ri;
    H_HCCL(ctx, HcclGetRootInfo(&ri));
    H_HCCL(ctx, HcclGroupStart());
    H_HCCL(ctx, HcclCommInitRootInfoConfig(1, &ri, 0, &cfg, &nc));
    H_EXPECT_REFUSED(ctx, HcclGroupEnd(), HCCL_E_PARA, "HcclCommInitRootInfoConfig: hcclOpExpansionMode");
    for (uint32_t mode = 0; mode <= 6; mode++) {
        h_set_case(ctx, "communicator config errors: hcclOpExpansionMode %u is accepted", mode);
        HcclCommConfigInit(&cfg);
        cfg.hcclOpExpansionMode = mode;
        cfg.hcclQos = mode;
        H_HCCL(ctx, own_comm(&cfg, &nc));
        H_HCCL(ctx, HcclCommDestroy(nc));
    }

    h_set_case(ctx, "communicator config errors: hcclCommName in use");
    HcclCommConfigInit(&cfg);
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "errors-dup-%ld-%u", (long)getpid(), ctx->rank);
    HcclComm first = NULL, second = NULL;
    H_HCCL(ctx, own_comm(&cfg, &first));
    H_EXPECT_REFUSED(ctx, own_comm(&cfg, &second), HCCL_E_PARA, cfg.hcclCommName, "unique");
    H_HCCL(ctx, HcclCommDestroy(first));
    H_HCCL(ctx, own_comm(&cfg, &second)); /* the name is free again */
    H_HCCL(ctx, HcclCommDestroy(second));
    return 0;
}

static int error_strings(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "HcclGetErrorString")) {
        return 0;
    }
    const int codes[] = {0, 1, 2, 3, 4, 5, 9, 20, 21, 24, 1041, 999, -1};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *m = HcclGetErrorString((HcclResult)codes[i]);
        H_EXPECT(ctx, m != NULL && m[0] != '\0', "HcclGetErrorString(%d) is %s", codes[i],
                 m ? "empty" : "NULL");
    }
    return 0;
}

static int destroyed_comm(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "a destroyed communicator used again")) {
        return 0;
    }
    HcclComm old;
    RUN(h_world_comm(ctx, &old));
    H_HCCL(ctx, HcclCommDestroy(old));
    uint32_t v;
    HCCL_REFUSED(ctx, HcclGetRankSize(old, &v), H_ANY_ERROR);
    REFUSED(ctx, HcclAllReduce(t->a, t->b, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, old, t->st),
            H_ANY_ERROR);
    REFUSED(ctx, HcclBarrier(old, t->st), H_ANY_ERROR);
    HCCL_REFUSED(ctx, HcclCommDestroy(old), H_ANY_ERROR);
    return 0;
}

/* After all that, the world communicator and the stream still work. */
static int still_healthy(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "the communicator is healthy after the refused calls")) {
        return 0;
    }
    HcclResult async = HCCL_E_INTERNAL;
    H_HCCL(ctx, HcclGetCommAsyncError(t->comm, &async));
    H_EXPECT(ctx, async == HCCL_SUCCESS, "HcclGetCommAsyncError = %d after argument errors",
             (int)async);
    /* int8 needs no alignment: an odd offset is fine; fp32 at a 4-byte offset too */
    const uint64_t count = 1000;
    uint8_t host[1000], exp[1000];
    h_fill(HCCL_DATA_TYPE_INT8, H_GEN_SUM, ctx->rank, 0, count, host);
    h_reduce_fill(HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, t->n, 0, count, exp);
    uint8_t *a = (uint8_t *)t->a + 1, *b = (uint8_t *)t->b + 3;
    H_ACL(ctx, aclrtMemcpy(a, count, host, count, ACL_MEMCPY_HOST_TO_DEVICE));
    H_HCCL(ctx, HcclAllReduce(a, b, count, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, t->comm, t->st));
    H_ACL(ctx, aclrtSynchronizeStream(t->st));
    H_ACL(ctx, aclrtMemcpy(host, count, b, count, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, memcmp(host, exp, count) == 0, "int8 AllReduce at odd offsets: wrong result");
    float f[200], fe[200];
    h_fill(HCCL_DATA_TYPE_FP32, H_GEN_SUM, ctx->rank, 0, 200, f);
    h_reduce_fill(HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, t->n, 0, 200, fe);
    a = (uint8_t *)t->a + 4;
    H_ACL(ctx, aclrtMemcpy(a, sizeof f, f, sizeof f, ACL_MEMCPY_HOST_TO_DEVICE));
    H_HCCL(ctx, HcclAllReduce(a, a, 200, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, t->comm, t->st));
    H_HCCL(ctx, HcclBarrier(t->comm, t->st));
    H_ACL(ctx, aclrtSynchronizeStream(t->st));
    H_ACL(ctx, aclrtMemcpy(f, sizeof f, a, sizeof f, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, memcmp(f, fe, sizeof f) == 0, "fp32 AllReduce at a 4-byte offset: wrong result");
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    T t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.n = ctx->nranks;
    t.me = ctx->rank;
    RUN(h_rank_setup(ctx));
    t.st = ctx->stream;
    RUN(h_world_comm(ctx, &t.comm));
    H_ACL(ctx, aclrtMalloc(&t.a, BUF, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&t.b, BUF, ACL_MEM_MALLOC_HUGE_FIRST));
    RUN(acl_errors(&t));
    RUN(null_pointers(&t));
    RUN(dtypes_and_ops(&t));
    RUN(ranges(&t));
    RUN(own_counts(&t));
    RUN(not_device_memory(&t));
    RUN(past_the_end(&t));
    RUN(init_errors(&t));
    RUN(config_errors(&t));
    RUN(error_strings(&t));
    RUN(destroyed_comm(&t));
    RUN(still_healthy(&t));
    h_set_case(ctx, "teardown");
    H_ACL(ctx, aclrtFree(t.a));
    H_ACL(ctx, aclrtFree(t.b));
    H_HCCL(ctx, HcclCommDestroy(t.comm));
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("errors", run_rank, NULL, NULL);
    return h_finish("errors", failed);
}
