/*
 * HcclGroupStart / HcclGroupEnd.
 *
 * usage: groups --ranks N --mode threads|procs|mixed
 *
 * Part 1 (every mode, one thread per rank): point-to-point calls grouped on one comm, where
 * ungrouped they would deadlock — a rank sends to and receives from the same peer, both ranks
 * sending first; every rank exchanging with every other rank; a ring in both directions.
 * Part 2 (threads mode, one thread for all devices): HcclCommInitAll comms, AllReduce on every
 * comm inside one group, then Send/Recv around a ring inside one group.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Elements rank a sends to rank b (in a given pattern). */
static uint64_t pcount(uint32_t a, uint32_t b, uint32_t salt)
{
    return 1 + (uint64_t)((a * 7U + b * 3U + salt) % 5U) * 257U;
}

typedef struct {
    h_dbuf snd[H_MAX_RANKS], rcv[H_MAX_RANKS];
    uint64_t scount[H_MAX_RANKS], rcount[H_MAX_RANKS];
    uint8_t *sdata[H_MAX_RANKS];
    int used[H_MAX_RANKS];
} p2p;

static int p2p_prepare(h_ctx *ctx, p2p *p, uint32_t peer, HcclDataType dt, uint32_t salt)
{
    size_t es = h_dtype_size(dt);
    p->used[peer] = 1;
    p->scount[peer] = pcount(ctx->rank, peer, salt);
    p->rcount[peer] = pcount(peer, ctx->rank, salt);
    p->sdata[peer] = (uint8_t *)h_xmalloc(p->scount[peer] * es);
    h_fill(dt, H_GEN_MOVE, ctx->rank, ((uint64_t)peer << 24) + salt, p->scount[peer],
           p->sdata[peer]);
    RUN(h_dbuf_alloc(ctx, &p->snd[peer], p->scount[peer] * es));
    RUN(h_dbuf_upload(ctx, &p->snd[peer], 0, p->sdata[peer], p->scount[peer] * es));
    RUN(h_dbuf_alloc(ctx, &p->rcv[peer], p->rcount[peer] * es));
    return 0;
}

static int p2p_check(h_ctx *ctx, p2p *p, HcclDataType dt, uint32_t salt)
{
    size_t es = h_dtype_size(dt);
    for (uint32_t peer = 0; peer < H_MAX_RANKS; peer++) {
        if (!p->used[peer]) {
            continue;
        }
        h_dbuf *b = &p->rcv[peer];
        uint8_t *e = (uint8_t *)h_xmalloc(b->total), *a = (uint8_t *)h_xmalloc(b->total);
        h_fill_sentinel(e, b->total);
        h_fill(dt, H_GEN_MOVE, peer, ((uint64_t)ctx->rank << 24) + salt, p->rcount[peer],
               e + H_GUARD_BYTES);
        RUN(h_dbuf_download_all(ctx, b, a));
        char what[64];
        snprintf(what, sizeof what, "received from rank %u", peer);
        H_CHECK_REGION(ctx, what, dt, a, e, NULL, b->total);
        free(e);
        free(a);
        h_dbuf *sb = &p->snd[peer];
        e = (uint8_t *)h_xmalloc(sb->total);
        a = (uint8_t *)h_xmalloc(sb->total);
        h_fill_sentinel(e, sb->total);
        memcpy(e + H_GUARD_BYTES, p->sdata[peer], p->scount[peer] * es);
        RUN(h_dbuf_download_all(ctx, sb, a));
        snprintf(what, sizeof what, "send buffer for rank %u", peer);
        H_CHECK_REGION(ctx, what, dt, a, e, NULL, sb->total);
        free(e);
        free(a);
        RUN(h_dbuf_free(ctx, b));
        RUN(h_dbuf_free(ctx, &p->snd[peer]));
        free(p->sdata[peer]);
    }
    return 0;
}

static int send_to(h_ctx *ctx, p2p *p, uint32_t peer, HcclDataType dt, HcclComm comm)
{
    H_HCCL(ctx, HcclSend(p->snd[peer].ptr, p->scount[peer], dt, peer, comm, ctx->stream));
    return 0;
}

static int recv_from(h_ctx *ctx, p2p *p, uint32_t peer, HcclDataType dt, HcclComm comm)
{
    H_HCCL(ctx, HcclRecv(p->rcv[peer].ptr, p->rcount[peer], dt, peer, comm, ctx->stream));
    return 0;
}

/* Both ranks of a pair send first, then receive: only a group makes that work. */
static int pair_exchange(h_ctx *ctx, HcclComm comm, HcclDataType dt)
{
    if (!h_case(ctx, "group pair send-first %s", h_dtype_name(dt))) {
        return 0;
    }
    uint32_t peer = ctx->rank ^ 1U;
    if (peer >= ctx->nranks) {
        return 0; /* odd rank count: the last rank sits this one out */
    }
    p2p p;
    memset(&p, 0, sizeof p);
    RUN(p2p_prepare(ctx, &p, peer, dt, 1));
    H_HCCL(ctx, HcclGroupStart());
    RUN(send_to(ctx, &p, peer, dt, comm));
    RUN(recv_from(ctx, &p, peer, dt, comm));
    H_HCCL(ctx, HcclGroupEnd());
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(p2p_check(ctx, &p, dt, 1));
    return 0;
}

/* Every rank sends to and receives from every other rank, all in one group. */
static int all_pairs(h_ctx *ctx, HcclComm comm, HcclDataType dt, int recv_first)
{
    if (!h_case(ctx, "group all-pairs %s %s", h_dtype_name(dt),
                recv_first ? "recvs-first" : "sends-first")) {
        return 0;
    }
    p2p p;
    memset(&p, 0, sizeof p);
    for (uint32_t peer = 0; peer < ctx->nranks; peer++) {
        if (peer != ctx->rank) {
            RUN(p2p_prepare(ctx, &p, peer, dt, 2));
        }
    }
    H_HCCL(ctx, HcclGroupStart());
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t k = 1; k < ctx->nranks; k++) {
            uint32_t peer = (ctx->rank + k) % ctx->nranks;
            if ((pass == 0) != (recv_first != 0)) {
                RUN(send_to(ctx, &p, peer, dt, comm));
            } else {
                RUN(recv_from(ctx, &p, peer, dt, comm));
            }
        }
    }
    H_HCCL(ctx, HcclGroupEnd());
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(p2p_check(ctx, &p, dt, 2));
    return 0;
}

/* Ring in both directions (N >= 3, so that next and prev differ). */
static int ring_both(h_ctx *ctx, HcclComm comm, HcclDataType dt)
{
    if (ctx->nranks < 3 || !h_case(ctx, "group ring both directions %s", h_dtype_name(dt))) {
        return 0;
    }
    uint32_t n = ctx->nranks, next = (ctx->rank + 1) % n, prev = (ctx->rank + n - 1) % n;
    p2p p;
    memset(&p, 0, sizeof p);
    RUN(p2p_prepare(ctx, &p, next, dt, 3));
    RUN(p2p_prepare(ctx, &p, prev, dt, 3));
    H_HCCL(ctx, HcclGroupStart());
    RUN(send_to(ctx, &p, next, dt, comm));
    RUN(send_to(ctx, &p, prev, dt, comm));
    RUN(recv_from(ctx, &p, prev, dt, comm));
    RUN(recv_from(ctx, &p, next, dt, comm));
    H_HCCL(ctx, HcclGroupEnd());
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(p2p_check(ctx, &p, dt, 3));
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    const HcclDataType dts[] = {HCCL_DATA_TYPE_FP32, HCCL_DATA_TYPE_INT8, HCCL_DATA_TYPE_BFP16,
                                HCCL_DATA_TYPE_UINT64};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        RUN(pair_exchange(ctx, comm, dts[i]));
        RUN(all_pairs(ctx, comm, dts[i], 0));
        RUN(all_pairs(ctx, comm, dts[i], 1));
        RUN(ring_both(ctx, comm, dts[i]));
    }
    if (h_case(ctx, "empty group")) {
        H_HCCL(ctx, HcclGroupStart());
        H_HCCL(ctx, HcclGroupEnd());
    }
    if (h_case(ctx, "collective after groups")) {
        /* the comm still works for ordinary calls after the groups */
        uint32_t all[H_MAX_RANKS];
        for (uint32_t r = 0; r < ctx->nranks; r++) {
            all[r] = r;
        }
        const uint64_t count = 1031;
        uint8_t *host = (uint8_t *)h_xmalloc(count * 4), *exp = (uint8_t *)h_xmalloc(count * 4);
        h_fill(HCCL_DATA_TYPE_INT32, H_GEN_SUM, ctx->rank, 0, count, host);
        h_reduce_fill(HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, H_GEN_SUM, all, ctx->nranks, 0, count,
                      exp);
        void *d;
        H_ACL(ctx, aclrtMalloc(&d, count * 4, ACL_MEM_MALLOC_HUGE_FIRST));
        H_ACL(ctx, aclrtMemcpy(d, count * 4, host, count * 4, ACL_MEMCPY_HOST_TO_DEVICE));
        H_HCCL(ctx, HcclAllReduce(d, d, count, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm,
                                  ctx->stream));
        H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
        H_ACL(ctx, aclrtMemcpy(host, count * 4, d, count * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        H_EXPECT(ctx, memcmp(host, exp, count * 4) == 0, "AllReduce after groups: wrong result");
        H_ACL(ctx, aclrtFree(d));
        free(host);
        free(exp);
    }
    h_set_case(ctx, "teardown");
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- part 2: one thread, HcclCommInitAll comms ------------------------------------------ */

static int single(h_ctx *ctx)
{
    uint32_t n = h_opt.nranks;
    int32_t dev[H_MAX_RANKS];
    HcclComm comm[H_MAX_RANKS];
    aclrtStream st[H_MAX_RANKS];
    void *in[H_MAX_RANKS], *out[H_MAX_RANKS];
    const uint64_t count = 4099;
    const HcclDataType dt = HCCL_DATA_TYPE_FP32;
    const size_t bytes = count * 4;
    for (uint32_t i = 0; i < n; i++) {
        dev[i] = (int32_t)i;
    }
    h_set_case(ctx, "initall comms");
    H_ACL(ctx, aclrtSetDevice(0));
    H_HCCL(ctx, HcclCommInitAll(n, dev, comm));
    uint8_t *host = (uint8_t *)h_xmalloc(bytes * n), *exp = (uint8_t *)h_xmalloc(bytes * n);
    for (uint32_t i = 0; i < n; i++) {
        H_ACL(ctx, aclrtSetDevice(dev[i]));
        H_ACL(ctx, aclrtCreateStream(&st[i]));
        H_ACL(ctx, aclrtMalloc(&in[i], bytes * n, ACL_MEM_MALLOC_HUGE_FIRST));
        H_ACL(ctx, aclrtMalloc(&out[i], bytes * n, ACL_MEM_MALLOC_HUGE_FIRST));
    }

    if (h_case(ctx, "group of allreduce on every initall comm, one thread")) {
        for (uint32_t i = 0; i < n; i++) {
            h_fill(dt, H_GEN_SUM, i, 0, count, host);
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_ACL(ctx, aclrtMemcpy(in[i], bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        }
        for (int rep = 0; rep < 3; rep++) {
            H_HCCL(ctx, HcclGroupStart());
            for (uint32_t i = 0; i < n; i++) {
                H_ACL(ctx, aclrtSetDevice(dev[i]));
                H_HCCL(ctx, HcclAllReduce(in[i], out[i], count, dt, HCCL_REDUCE_SUM, comm[i], st[i]));
            }
            H_HCCL(ctx, HcclGroupEnd());
            for (uint32_t i = 0; i < n; i++) {
                H_ACL(ctx, aclrtSetDevice(dev[i]));
                H_ACL(ctx, aclrtSynchronizeStream(st[i]));
            }
        }
        h_reduce_fill(dt, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 0, count, exp);
        for (uint32_t i = 0; i < n; i++) {
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_ACL(ctx, aclrtMemcpy(host, bytes, out[i], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
            H_EXPECT(ctx, memcmp(host, exp, bytes) == 0, "comm %u: grouped AllReduce result wrong",
                     i);
        }
    }

    if (n >= 2 && h_case(ctx, "group of send/recv ring on initall comms, one thread")) {
        for (uint32_t i = 0; i < n; i++) {
            h_fill(dt, H_GEN_MOVE, i, 77, count, host);
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_ACL(ctx, aclrtMemcpy(in[i], bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        }
        H_HCCL(ctx, HcclGroupStart());
        for (uint32_t i = 0; i < n; i++) {
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_HCCL(ctx, HcclSend(in[i], count, dt, (i + 1) % n, comm[i], st[i]));
            H_HCCL(ctx, HcclRecv(out[i], count, dt, (i + n - 1) % n, comm[i], st[i]));
        }
        H_HCCL(ctx, HcclGroupEnd());
        for (uint32_t i = 0; i < n; i++) {
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_ACL(ctx, aclrtSynchronizeStream(st[i]));
        }
        for (uint32_t i = 0; i < n; i++) {
            h_fill(dt, H_GEN_MOVE, (i + n - 1) % n, 77, count, exp);
            H_ACL(ctx, aclrtSetDevice(dev[i]));
            H_ACL(ctx, aclrtMemcpy(host, bytes, out[i], bytes, ACL_MEMCPY_DEVICE_TO_HOST));
            H_EXPECT(ctx, memcmp(host, exp, bytes) == 0, "comm %u: grouped ring receive wrong", i);
        }
    }

    h_set_case(ctx, "teardown");
    for (uint32_t i = 0; i < n; i++) {
        H_HCCL(ctx, HcclCommDestroy(comm[i]));
    }
    for (uint32_t i = 0; i < n; i++) {
        H_ACL(ctx, aclrtSetDevice(dev[i]));
        H_ACL(ctx, aclrtFree(in[i]));
        H_ACL(ctx, aclrtFree(out[i]));
        H_ACL(ctx, aclrtDestroyStream(st[i]));
    }
    free(host);
    free(exp);
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("groups", run_rank, NULL, NULL);
    if (h_opt.mode == H_MODE_THREADS) {
        h_ctx ctx;
        double t0 = h_now();
        h_init_single(&ctx, "groups-initall");
        failed |= h_single_done(&ctx, single(&ctx), "groups-initall", t0);
    }
    return h_finish("groups", failed);
}
