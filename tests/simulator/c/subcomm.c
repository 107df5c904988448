/*
 * Communicator configs and sub-communicators.
 *
 * usage: subcomm --ranks N --mode threads|procs|mixed
 *
 *  - HcclCommInitRootInfoConfig with a config carrying a comm name and hcclExecTimeOut:
 *    HcclGetCommName returns the name, the comm works;
 *  - HcclCreateSubCommConfig splits the ranks into even and odd sub-communicators (every rank
 *    calls it for both; ranks outside pass rankIds=NULL and subCommId=0xFFFFFFFF); sizes, ranks
 *    and names are right; AllReduce runs on both sub-comms at once and on the parent; the comms
 *    are destroyed in different orders on different ranks;
 *  - a sub-communicator holding every rank, and a second split of the same parent.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define OUTSIDE_ID 0xFFFFFFFFULL

/* A name prefix unique to this run, made by rank 0 and shared out of band. */
static int unique_prefix(h_ctx *ctx, char *out, size_t n)
{
    char buf[64];
    memset(buf, 0, sizeof buf);
    if (ctx->rank == 0) {
        snprintf(buf, sizeof buf, "hcclpy_t%ld_%lld", (long)getpid(), (long long)(h_now() * 1e6));
    }
    RUN(h_oob_bcast(ctx, 0, buf, sizeof buf));
    snprintf(out, n, "%s", buf);
    return 0;
}

/*
 * AllReduce (int32 sum and bf16 sum) of `count` elements on comm, where the ranks of comm are the
 * world ranks members[0..n) in order; data identity = world rank. Only enqueues; check_sum
 * verifies after the stream is synchronised.
 */
typedef struct {
    h_dbuf in, out;
    HcclDataType dt;
    uint64_t count;
    uint32_t members[H_MAX_RANKS];
    uint32_t n;
    const char *what;
} pending;

static int start_sum(h_ctx *ctx, pending *p, HcclComm comm, HcclDataType dt, uint64_t count,
                     const uint32_t *members, uint32_t n, const char *what)
{
    memset(p, 0, sizeof *p);
    p->dt = dt;
    p->count = count;
    p->n = n;
    p->what = what;
    memcpy(p->members, members, n * sizeof(uint32_t));
    size_t bytes = count * h_dtype_size(dt);
    uint8_t *host = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_SUM, ctx->rank, 0, count, host);
    RUN(h_dbuf_alloc(ctx, &p->in, bytes));
    RUN(h_dbuf_upload(ctx, &p->in, 0, host, bytes));
    RUN(h_dbuf_alloc(ctx, &p->out, bytes));
    free(host);
    H_HCCL(ctx, HcclAllReduce(p->in.ptr, p->out.ptr, count, dt, HCCL_REDUCE_SUM, comm, ctx->stream));
    return 0;
}

static int check_sum(h_ctx *ctx, pending *p)
{
    uint8_t *e = (uint8_t *)h_xmalloc(p->out.total), *a = (uint8_t *)h_xmalloc(p->out.total);
    h_fill_sentinel(e, p->out.total);
    h_reduce_fill(p->dt, HCCL_REDUCE_SUM, H_GEN_SUM, p->members, p->n, 0, p->count,
                  e + H_GUARD_BYTES);
    RUN(h_dbuf_download_all(ctx, &p->out, a));
    H_CHECK_REGION(ctx, p->what, p->dt, a, e, NULL, p->out.total);
    RUN(h_dbuf_free(ctx, &p->in));
    RUN(h_dbuf_free(ctx, &p->out));
    free(e);
    free(a);
    return 0;
}

static int expect_comm(h_ctx *ctx, HcclComm comm, uint32_t size, uint32_t rank, const char *name)
{
    uint32_t v = 0;
    H_HCCL(ctx, HcclGetRankSize(comm, &v));
    H_EXPECT(ctx, v == size, "HcclGetRankSize = %u, expected %u", v, size);
    H_HCCL(ctx, HcclGetRankId(comm, &v));
    H_EXPECT(ctx, v == rank, "HcclGetRankId = %u, expected %u", v, rank);
    char got[COMM_NAME_MAX_LENGTH + 1];
    memset(got, 0, sizeof got);
    H_HCCL(ctx, HcclGetCommName(comm, got));
    if (name) {
        H_EXPECT(ctx, strcmp(got, name) == 0, "HcclGetCommName = \"%s\", expected \"%s\"", got, name);
    } else {
        H_EXPECT(ctx, got[0] != '\0', "HcclGetCommName returned an empty name");
    }
    return 0;
}

static int named_config_comm(h_ctx *ctx, const char *prefix)
{
    if (!h_case(ctx, "init-root-info-config name+exec-timeout")) {
        return 0;
    }
    HcclCommConfig cfg;
    memset(&cfg, 0xEE, sizeof cfg); /* HcclCommConfigInit must not depend on zeroed memory */
    HcclCommConfigInit(&cfg);
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "%s_named", prefix);
    cfg.hcclExecTimeOut = 60;
    HcclRootInfo ri;
    RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &ri));
    HcclComm comm = NULL;
    H_HCCL(ctx, HcclCommInitRootInfoConfig(ctx->nranks, &ri, ctx->rank, &cfg, &comm));
    RUN(expect_comm(ctx, comm, ctx->nranks, ctx->rank, cfg.hcclCommName));
    uint32_t all[H_MAX_RANKS];
    for (uint32_t i = 0; i < ctx->nranks; i++) {
        all[i] = i;
    }
    pending p;
    RUN(start_sum(ctx, &p, comm, HCCL_DATA_TYPE_INT32, 1031, all, ctx->nranks, "named comm"));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(check_sum(ctx, &p));
    HcclResult async = HCCL_E_INTERNAL;
    H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
    H_EXPECT(ctx, async == HCCL_SUCCESS, "HcclGetCommAsyncError reports %d on a healthy comm",
             (int)async);
    H_HCCL(ctx, HcclCommDestroy(comm));

    /* an older, smaller config (version 2: up to the name) must work too */
    h_set_case(ctx, "init-root-info-config version-2 struct");
    HcclCommConfigInit(&cfg);
    size_t small = offsetof(HcclCommConfig, hcclUdi);
    uint32_t ver = 2;
    memcpy(cfg.reserved, &small, sizeof small);
    memcpy(cfg.reserved + 12, &ver, sizeof ver);
    cfg.hcclBufferSize = 200;
    cfg.hcclDeterministic = 0;
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "%s_v2", prefix);
    RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &ri));
    H_HCCL(ctx, HcclCommInitRootInfoConfig(ctx->nranks, &ri, ctx->rank, &cfg, &comm));
    RUN(expect_comm(ctx, comm, ctx->nranks, ctx->rank, cfg.hcclCommName));
    RUN(start_sum(ctx, &p, comm, HCCL_DATA_TYPE_FP32, 515, all, ctx->nranks, "v2-config comm"));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(check_sum(ctx, &p));
    H_HCCL(ctx, HcclCommDestroy(comm));
    return 0;
}

/* Every rank calls this for one sub-communicator: members[] (ascending world ranks). */
static int create_sub(h_ctx *ctx, HcclComm *parent, const uint32_t *members, uint32_t n,
                      uint64_t id, const char *name, HcclComm *sub)
{
    HcclCommConfig cfg;
    HcclCommConfigInit(&cfg);
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "%s", name);
    uint32_t pos = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (members[i] == ctx->rank) {
            pos = i;
        }
    }
    *sub = NULL;
    if (pos == UINT32_MAX) {
        HcclComm none = NULL;
        H_HCCL(ctx, HcclCreateSubCommConfig(parent, n, NULL, OUTSIDE_ID, 0, &cfg, &none));
        H_EXPECT(ctx, none == NULL, "a rank outside the sub-communicator got a handle %p", none);
        return 0;
    }
    uint32_t ids[H_MAX_RANKS];
    memcpy(ids, members, n * sizeof(uint32_t));
    H_HCCL(ctx, HcclCreateSubCommConfig(parent, n, ids, id, pos, &cfg, sub));
    H_REQUIRE(ctx, *sub != NULL, "HcclCreateSubCommConfig returned success but a NULL comm");
    RUN(expect_comm(ctx, *sub, n, pos, name));
    return 0;
}

static int even_odd(h_ctx *ctx, const char *prefix)
{
    if (!h_case(ctx, "subcomm even/odd")) {
        return 0;
    }
    uint32_t n = ctx->nranks, me = ctx->rank;
    uint32_t evens[H_MAX_RANKS], odds[H_MAX_RANKS], all[H_MAX_RANKS], ne = 0, no = 0;
    for (uint32_t r = 0; r < n; r++) {
        all[r] = r;
        if (r % 2 == 0) {
            evens[ne++] = r;
        } else {
            odds[no++] = r;
        }
    }
    /* a fresh parent, so that the destroy order below can differ between ranks */
    HcclComm parent;
    RUN(h_world_comm(ctx, &parent));
    char name_e[COMM_NAME_MAX_LENGTH], name_o[COMM_NAME_MAX_LENGTH];
    snprintf(name_e, sizeof name_e, "%s_even", prefix);
    snprintf(name_o, sizeof name_o, "%s_odd", prefix);
    HcclComm sub_e = NULL, sub_o = NULL;
    RUN(create_sub(ctx, &parent, evens, ne, 1, name_e, &sub_e));
    if (no > 0) {
        RUN(create_sub(ctx, &parent, odds, no, 2, name_o, &sub_o));
    }
    HcclComm mine = me % 2 == 0 ? sub_e : sub_o;
    const uint32_t *mem = me % 2 == 0 ? evens : odds;
    uint32_t nm = me % 2 == 0 ? ne : no;

    h_set_case(ctx, "subcomm even/odd concurrent allreduce");
    for (int iter = 0; iter < 3; iter++) {
        pending a, b, c;
        RUN(start_sum(ctx, &a, mine, HCCL_DATA_TYPE_INT32, 1031, mem, nm, "sub-comm int32"));
        RUN(start_sum(ctx, &b, parent, HCCL_DATA_TYPE_INT32, 777, all, n, "parent int32"));
        RUN(start_sum(ctx, &c, mine, HCCL_DATA_TYPE_BFP16, 4099, mem, nm, "sub-comm bf16"));
        H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
        RUN(check_sum(ctx, &a));
        RUN(check_sum(ctx, &b));
        RUN(check_sum(ctx, &c));
    }
    /* the sub-comm on its own stream while the parent works on the default one */
    {
        aclrtStream s2;
        H_ACL(ctx, aclrtCreateStream(&s2));
        pending a, b;
        aclrtStream keep = ctx->stream;
        ctx->stream = s2;
        RUN(start_sum(ctx, &a, mine, HCCL_DATA_TYPE_FP32, 2048, mem, nm, "sub-comm on 2nd stream"));
        ctx->stream = keep;
        RUN(start_sum(ctx, &b, parent, HCCL_DATA_TYPE_FP32, 2048, all, n, "parent on 1st stream"));
        H_ACL(ctx, aclrtSynchronizeStream(s2));
        H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
        RUN(check_sum(ctx, &a));
        RUN(check_sum(ctx, &b));
        H_ACL(ctx, aclrtDestroyStream(s2));
    }

    h_set_case(ctx, "subcomm even/odd destroy in any order");
    if (me % 4 == 0) {
        H_HCCL(ctx, HcclCommDestroy(mine));
        H_HCCL(ctx, HcclCommDestroy(parent));
    } else if (me % 4 == 1) {
        H_HCCL(ctx, HcclCommDestroy(parent));
        H_HCCL(ctx, HcclCommDestroy(mine));
    } else if (me % 4 == 2) {
        H_HCCL(ctx, HcclCommDestroy(parent));
        H_HCCL(ctx, HcclCommDestroy(mine));
    } else {
        H_HCCL(ctx, HcclCommDestroy(mine));
        H_HCCL(ctx, HcclCommDestroy(parent));
    }
    return 0;
}

static int full_and_halves(h_ctx *ctx, const char *prefix)
{
    if (!h_case(ctx, "subcomm all-ranks + lower/upper halves of one parent")) {
        return 0;
    }
    uint32_t n = ctx->nranks, me = ctx->rank;
    uint32_t all[H_MAX_RANKS], lo[H_MAX_RANKS], hi[H_MAX_RANKS], nl = 0, nh = 0;
    for (uint32_t r = 0; r < n; r++) {
        all[r] = r;
        if (r < (n + 1) / 2) {
            lo[nl++] = r;
        } else {
            hi[nh++] = r;
        }
    }
    HcclComm parent;
    RUN(h_world_comm(ctx, &parent));
    char nm[COMM_NAME_MAX_LENGTH];
    snprintf(nm, sizeof nm, "%s_all", prefix);
    HcclComm sub_all = NULL, sub_lo = NULL, sub_hi = NULL;
    RUN(create_sub(ctx, &parent, all, n, 10, nm, &sub_all));
    snprintf(nm, sizeof nm, "%s_lo", prefix);
    RUN(create_sub(ctx, &parent, lo, nl, 11, nm, &sub_lo));
    if (nh > 0) {
        snprintf(nm, sizeof nm, "%s_hi", prefix);
        RUN(create_sub(ctx, &parent, hi, nh, 12, nm, &sub_hi));
    }
    HcclComm half = me < (n + 1) / 2 ? sub_lo : sub_hi;
    pending a, b, c;
    RUN(start_sum(ctx, &a, sub_all, HCCL_DATA_TYPE_FP16, 1031, all, n, "all-ranks sub-comm"));
    RUN(start_sum(ctx, &b, half, HCCL_DATA_TYPE_INT64, 1031, me < (n + 1) / 2 ? lo : hi,
                  me < (n + 1) / 2 ? nl : nh, "half sub-comm"));
    RUN(start_sum(ctx, &c, parent, HCCL_DATA_TYPE_FP32, 1031, all, n, "parent"));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    RUN(check_sum(ctx, &a));
    RUN(check_sum(ctx, &b));
    RUN(check_sum(ctx, &c));
    H_HCCL(ctx, HcclCommDestroy(sub_all));
    H_HCCL(ctx, HcclCommDestroy(half));
    H_HCCL(ctx, HcclCommDestroy(parent));
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    char prefix[64];
    RUN(unique_prefix(ctx, prefix, sizeof prefix));
    if (h_case(ctx, "world comm has a name")) {
        HcclComm world;
        RUN(h_world_comm(ctx, &world));
        RUN(expect_comm(ctx, world, ctx->nranks, ctx->rank, NULL));
        H_HCCL(ctx, HcclCommDestroy(world));
    }
    RUN(named_config_comm(ctx, prefix));
    RUN(even_odd(ctx, prefix));
    RUN(full_and_halves(ctx, prefix));
    h_set_case(ctx, "teardown");
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("subcomm", run_rank, NULL, NULL);
    return h_finish("subcomm", failed);
}
