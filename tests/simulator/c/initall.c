/*
 * HcclCommInitAll: one process, one thread, N devices.
 *
 * usage: initall --ranks N [--mode threads]
 *
 * One thread creates N communicators with HcclCommInitAll, then drives all of them itself:
 * it queues an operation on every comm's stream, and only then synchronises the streams. The
 * simulator has to make progress without a host thread per rank. Also: the device list in a
 * different order (rank i is devices[i]), several operations queued per comm before any
 * synchronisation, and destroying the comms one after the other from the same thread.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    uint32_t n;
    int32_t dev[H_MAX_RANKS];
    HcclComm comm[H_MAX_RANKS];
    aclrtStream st[H_MAX_RANKS];
} world;

static int open_world(h_ctx *ctx, world *w, int reversed)
{
    memset(w, 0, sizeof *w);
    w->n = ctx->nranks;
    for (uint32_t i = 0; i < w->n; i++) {
        w->dev[i] = (int32_t)(reversed ? w->n - 1 - i : i);
    }
    /* like the official sample: the calling thread has set the first device */
    H_ACL(ctx, aclrtSetDevice(w->dev[0]));
    H_HCCL(ctx, HcclCommInitAll(w->n, w->dev, w->comm));
    for (uint32_t i = 0; i < w->n; i++) {
        H_REQUIRE(ctx, w->comm[i] != NULL, "HcclCommInitAll left comms[%u] NULL", i);
        uint32_t v = 0;
        H_HCCL(ctx, HcclGetRankSize(w->comm[i], &v));
        H_EXPECT(ctx, v == w->n, "comms[%u]: rank size %u, expected %u", i, v, w->n);
        H_HCCL(ctx, HcclGetRankId(w->comm[i], &v));
        H_EXPECT(ctx, v == i, "comms[%u]: rank id %u, expected %u (devices[%u] = %d)", i, v, i, i,
                 w->dev[i]);
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_ACL(ctx, aclrtCreateStream(&w->st[i]));
    }
    return 0;
}

static int close_world(h_ctx *ctx, world *w)
{
    /* destroyed one after the other by this one thread, as in the official sample */
    for (uint32_t i = 0; i < w->n; i++) {
        H_HCCL(ctx, HcclCommDestroy(w->comm[i]));
    }
    aclrtStream probe[H_MAX_RANKS];
    for (uint32_t i = 0; i < w->n; i++) {
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_ACL(ctx, aclrtDestroyStream(w->st[i]));
        H_ACL(ctx, aclrtCreateStream(&probe[i]));
        H_ACL(ctx, aclrtResetDevice(w->dev[i])); /* the SetDevice just above */
        H_ACL(ctx, aclrtResetDevice(w->dev[i])); /* the one in open_world */
    }
    H_ACL(ctx, aclrtResetDevice(w->dev[0])); /* the first SetDevice in open_world */
    /* The program's last reset of a device releases it, and its streams with it: HcclCommInitAll
     * holds no reference of its own. */
    for (uint32_t i = 0; i < w->n; i++) {
        H_EXPECT(ctx, aclrtSynchronizeStream(probe[i]) != ACL_SUCCESS,
                 "device %d is still held after the program reset it as often as it set it",
                 (int)w->dev[i]);
    }
    return 0;
}

typedef struct {
    void *in[H_MAX_RANKS], *out[H_MAX_RANKS];
    size_t in_bytes, out_bytes;
} bufs;

static int alloc_bufs(h_ctx *ctx, world *w, bufs *b, HcclDataType dt, h_gen_kind kind,
                      uint64_t in_count, uint64_t out_count, uint32_t data_root)
{
    size_t es = h_dtype_size(dt);
    b->in_bytes = in_count * es;
    b->out_bytes = out_count * es;
    uint8_t *host = (uint8_t *)h_xmalloc(b->in_bytes);
    for (uint32_t i = 0; i < w->n; i++) {
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_ACL(ctx, aclrtMalloc(&b->in[i], b->in_bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        H_ACL(ctx, aclrtMalloc(&b->out[i], b->out_bytes, ACL_MEM_MALLOC_HUGE_FIRST));
        h_fill(dt, kind, data_root == UINT32_MAX ? i : data_root, 0, in_count, host);
        H_ACL(ctx, aclrtMemcpy(b->in[i], b->in_bytes, host, b->in_bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        H_ACL(ctx, aclrtMemset(b->out[i], b->out_bytes, 0, b->out_bytes));
        H_ACL(ctx, aclrtResetDevice(w->dev[i]));
    }
    free(host);
    return 0;
}

static int free_bufs(h_ctx *ctx, world *w, bufs *b)
{
    for (uint32_t i = 0; i < w->n; i++) {
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_ACL(ctx, aclrtFree(b->in[i]));
        H_ACL(ctx, aclrtFree(b->out[i]));
        H_ACL(ctx, aclrtResetDevice(w->dev[i]));
    }
    return 0;
}

static int sync_all(h_ctx *ctx, world *w)
{
    for (uint32_t i = 0; i < w->n; i++) {
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_ACL(ctx, aclrtSynchronizeStream(w->st[i]));
        H_ACL(ctx, aclrtResetDevice(w->dev[i]));
    }
    return 0;
}

static int expect_out(h_ctx *ctx, world *w, bufs *b, uint32_t i, const uint8_t *exp,
                      HcclDataType dt, const char *what)
{
    uint8_t *got = (uint8_t *)h_xmalloc(b->out_bytes);
    H_ACL(ctx, aclrtSetDevice(w->dev[i]));
    H_ACL(ctx, aclrtMemcpy(got, b->out_bytes, b->out[i], b->out_bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    H_ACL(ctx, aclrtResetDevice(w->dev[i]));
    size_t es = h_dtype_size(dt);
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < b->out_bytes / es; k++) {
        if (memcmp(got + k * es, exp + k * es, es) != 0) {
            if (bad++ == 0) {
                first = k;
            }
        }
    }
    if (bad) {
        char e[96], a[96];
        h_format_elem(e, sizeof e, dt, exp + first * es);
        h_format_elem(a, sizeof a, dt, got + first * es);
        h_failf(ctx, __FILE__, __LINE__, "%s of rank %u (device %d): %zu elements differ, first "
                "at %zu: expected %s got %s", what, i, w->dev[i], bad, first, e, a);
    } else {
        ctx->checks++;
    }
    free(got);
    return 0;
}

static int allreduce_all(h_ctx *ctx, world *w, HcclDataType dt, HcclReduceOp op, uint64_t count,
                         int repeats)
{
    if (!h_case(ctx, "initall allreduce %s %s count=%llu x%d", h_dtype_name(dt), h_op_name(op),
                (unsigned long long)count, repeats)) {
        return 0;
    }
    h_gen_kind kind = h_gen_for_op(op);
    bufs b;
    RUN(alloc_bufs(ctx, w, &b, dt, kind, count, count, UINT32_MAX));
    for (int r = 0; r < repeats; r++) {
        /* enqueue on every comm first: nothing may block here */
        for (uint32_t i = 0; i < w->n; i++) {
            H_ACL(ctx, aclrtSetDevice(w->dev[i]));
            H_HCCL(ctx, HcclAllReduce(b.in[i], b.out[i], count, dt, op, w->comm[i], w->st[i]));
            H_ACL(ctx, aclrtResetDevice(w->dev[i]));
        }
        RUN(sync_all(ctx, w));
    }
    uint8_t *exp = (uint8_t *)h_xmalloc(b.out_bytes);
    h_reduce_fill(dt, op, kind, NULL, w->n, 0, count, exp);
    for (uint32_t i = 0; i < w->n; i++) {
        RUN(expect_out(ctx, w, &b, i, exp, dt, "allreduce output"));
    }
    free(exp);
    RUN(free_bufs(ctx, w, &b));
    return 0;
}

/* AllGather shows which rank each comm really is; Broadcast from the last rank. */
static int gather_and_bcast(h_ctx *ctx, world *w)
{
    if (!h_case(ctx, "initall allgather+broadcast queued together")) {
        return 0;
    }
    const uint64_t count = 1031;
    HcclDataType dt = HCCL_DATA_TYPE_FP16;
    size_t es = h_dtype_size(dt);
    bufs g, bc;
    RUN(alloc_bufs(ctx, w, &g, dt, H_GEN_MOVE, count, count * w->n, UINT32_MAX));
    RUN(alloc_bufs(ctx, w, &bc, dt, H_GEN_MOVE, count, count, UINT32_MAX));
    uint32_t root = w->n - 1;
    for (uint32_t i = 0; i < w->n; i++) {
        H_ACL(ctx, aclrtSetDevice(w->dev[i]));
        H_HCCL(ctx, HcclAllGather(g.in[i], g.out[i], count, dt, w->comm[i], w->st[i]));
        H_HCCL(ctx, HcclBroadcast(bc.in[i], count, dt, root, w->comm[i], w->st[i]));
        H_ACL(ctx, aclrtResetDevice(w->dev[i]));
    }
    RUN(sync_all(ctx, w));
    uint8_t *exp = (uint8_t *)h_xmalloc(g.out_bytes);
    for (uint32_t r = 0; r < w->n; r++) {
        h_fill(dt, H_GEN_MOVE, r, 0, count, exp + (size_t)r * count * es);
    }
    for (uint32_t i = 0; i < w->n; i++) {
        RUN(expect_out(ctx, w, &g, i, exp, dt, "allgather output"));
    }
    /* broadcast was in place on the inputs: compare through the "in" buffers */
    h_fill(dt, H_GEN_MOVE, root, 0, count, exp);
    for (uint32_t i = 0; i < w->n; i++) {
        void *keep = bc.out[i];
        bc.out[i] = bc.in[i];
        RUN(expect_out(ctx, w, &bc, i, exp, dt, "broadcast buffer"));
        bc.out[i] = keep;
    }
    free(exp);
    RUN(free_bufs(ctx, w, &g));
    RUN(free_bufs(ctx, w, &bc));
    return 0;
}

static int run_single(h_ctx *ctx)
{
    for (int reversed = 0; reversed < 2; reversed++) {
        h_set_case(ctx, "HcclCommInitAll devices %s", reversed ? "reversed" : "in order");
        world w;
        RUN(open_world(ctx, &w, reversed));
        RUN(allreduce_all(ctx, &w, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, 1031, 1));
        RUN(gather_and_bcast(ctx, &w));
        if (!reversed) {
            RUN(allreduce_all(ctx, &w, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_MAX, 1, 20));
            RUN(allreduce_all(ctx, &w, HCCL_DATA_TYPE_BFP16, HCCL_REDUCE_SUM, 1 << 18, 2));
            RUN(allreduce_all(ctx, &w, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_PROD, 4099, 1));
        }
        h_set_case(ctx, "HcclCommDestroy of every comm from one thread");
        RUN(close_world(ctx, &w));
    }
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    if (h_opt.mode != H_MODE_THREADS) {
        fprintf(stderr, "initall runs in one process: use --mode threads\n");
        return 2;
    }
    h_ctx ctx;
    double t0 = h_now();
    h_init_single(&ctx, "initall");
    int rc = run_single(&ctx);
    int failed = h_single_done(&ctx, rc, "initall", t0);
    return h_finish("initall", failed);
}
