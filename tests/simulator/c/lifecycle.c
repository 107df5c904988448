/*
 * Communicator lifecycles at their edges: sub-communicator ids the ranks disagree about, a
 * suspension with nothing in flight, destroy right after a suspension, a failed rank-table
 * attempt followed by a correct one, how long a root info lives, and destroy racing other calls.
 *
 * usage: lifecycle --ranks N --mode threads|procs|mixed --case NAME
 *
 *  - subcomm-members (N >= 3): sub-rank 0 (rank 0) creates sub-communicator 7 as [0, 2] while
 *    ranks 1 and then 2 pass [0, 1, 2]: all three fail at once with HCCL_E_PARA naming both
 *    lists (rank 2 belongs to rank 0's list, so rank 0 is stopped too); then all three create
 *    it with the same list and it works;
 *  - subcomm-ids (N >= 4): rank 0 creates sub-communicator 9 as [0, 2]; a moment later rank 1
 *    creates 9 as [1, 3], then rank 3 joins 9 with [1, 3]: both fail at once with HCCL_E_PARA
 *    naming both lists, and nobody ends up in a communicator with the wrong members: rank 2
 *    comes last with [0, 2] and that sub-communicator works; ranks 1 and 3 then make theirs
 *    under another id;
 *  - suspend-idle (N >= 2): every rank suspends, they synchronise, every rank resumes: the
 *    communicator works (the CANN recovery flow).  Then rank 0 suspends with nothing in flight:
 *    the others' next AllReduce fails at once (not at HCCL_EXEC_TIMEOUT) with a remote error
 *    naming rank 0, and so do their calls after it; rank 0's HcclCommResume reports the
 *    failure (HCCL_E_SUSPENDING);
 *  - destroy-after-abort (N = 2): rank 0 queues AllReduces the other rank never joins, suspends
 *    and destroys at once: HcclCommDestroy succeeds every time (never HCCL_E_AGAIN), and the
 *    queued operations fail on the stream;
 *  - rank-table-retry (N = 2): rank 0 first calls HcclCommInitClusterInfo on the wrong device
 *    (HCCL_E_PARA at once) while rank 1 is already waiting; then rank 0 retries on the right
 *    device and the communicator is created (nothing of the failed attempt is served to rank 1);
 *  - root-info-expiry (threads, one thread): unused root infos are released
 *    HCCL_CONNECT_TIMEOUT after they were made, and using one afterwards says it expired; when
 *    ranks pass different nRanks, all of them fail at once and the root info is released; a
 *    root info is used up by its communicator;
 *  - root-info-elsewhere (procs, N = 2): rank 0 makes a root info only rank 1 uses, for a
 *    1-rank communicator: rank 0 releases it soon after, though it is not a rank of it;
 *  - destroy-race (threads, one thread): HcclCommDestroy while another thread keeps calling
 *    HcclGetCommAsyncError on the same communicator, and two threads destroying one
 *    communicator: no crash, exactly one destroy succeeds, and the other calls either see the
 *    live communicator or are refused;
 *  - init-exit (N >= 2, launched 12 times): every rank creates a communicator (by turns from a
 *    root info, from a rank table, as a sub-communicator), destroys it and exits at once: a
 *    rank still creating it must not fail because a faster one has exited;
 *  - rank-table-again (N in [2, 8]): four communicators from one rank table, one after the
 *    other, each created as soon as the last is destroyed;
 *  - rank-table-copies (N in [2, 8]): each rank reads its own copy of the rank table, at a path
 *    of its own: they form one communicator.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PROMPT 5.0 /* seconds: "at once", far below the timeouts the driver sets (30 s and more) */
#define COUNT 4096

/* ---- helpers -------------------------------------------------------------------------------- */


/* Open descriptors of communicator control segments (the simulator's memfds "hcclpy-sim-comm"):
 * a root info holds one until it is released. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300], target[512];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strstr(target, "hcclpy-sim-comm") != NULL;
        }
    }
    closedir(d);
    return n;
}

/* Waits up to `seconds` for the number of segment descriptors to drop to `target`. */
static int fds_drop_to(int target, double seconds)
{
    double until = h_now() + seconds;
    int n = count_fds();
    while (n > target && h_now() < until) {
        h_sleep(0.05);
        n = count_fds();
    }
    return n;
}

typedef struct {
    void *in, *out;
} bufs;

static int alloc_bufs(h_ctx *ctx, bufs *b, uint32_t identity)
{
    float host[COUNT];
    h_fill(HCCL_DATA_TYPE_FP32, H_GEN_SUM, identity, 0, COUNT, host);
    H_ACL(ctx, aclrtMalloc(&b->in, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&b->out, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMemcpy(b->in, sizeof host, host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE));
    return 0;
}

static int free_bufs(h_ctx *ctx, bufs *b)
{
    H_ACL(ctx, aclrtFree(b->in));
    H_ACL(ctx, aclrtFree(b->out));
    return 0;
}

/* AllReduce (fp32 sum) on `comm`, whose ranks are the world ranks members[0..n): data identity
 * = world rank, so a wrong member gives a wrong sum. */
static int sum_check(h_ctx *ctx, HcclComm comm, const uint32_t *members, uint32_t n, const char *what)
{
    bufs b;
    RUN(alloc_bufs(ctx, &b, ctx->rank));
    H_HCCL(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                              ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    float got[COUNT], exp[COUNT];
    H_ACL(ctx, aclrtMemcpy(got, sizeof got, b.out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    h_reduce_fill(HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, H_GEN_SUM, members, n, 0, COUNT, exp);
    H_EXPECT(ctx, memcmp(got, exp, sizeof got) == 0, "%s: AllReduce result is wrong", what);
    RUN(free_bufs(ctx, &b));
    return 0;
}

static int member_of(const uint32_t *ids, uint32_t n, uint32_t rank)
{
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == rank) {
            return (int)i;
        }
    }
    return -1;
}

/* HcclCreateSubCommConfig with `ids` (NULL: not a member) as world rank ctx->rank. */
static HcclResult create_sub(h_ctx *ctx, HcclComm *parent, const uint32_t *ids, uint32_t n, uint64_t id,
                             HcclComm *sub)
{
    HcclCommConfig cfg;
    HcclCommConfigInit(&cfg);
    *sub = NULL;
    int at = ids == NULL ? -1 : member_of(ids, n, ctx->rank);
    if (at < 0) {
        return HcclCreateSubCommConfig(parent, 0, NULL, 0xFFFFFFFFULL, 0, &cfg, sub);
    }
    return HcclCreateSubCommConfig(parent, n, (uint32_t *)ids, id, (uint32_t)at, &cfg, sub);
}

/* ---- subcomm-members ------------------------------------------------------------------------ */

static int case_subcomm_members(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    HcclComm world;
    RUN(h_world_comm(ctx, &world));
    static const uint32_t pair[] = {0, 2}, trio[] = {0, 1, 2};
    h_set_case(ctx, "subcomm-members: rank 0 creates [0, 2], ranks 1 and 2 pass [0, 1, 2]");
    RUN(h_oob_barrier(ctx));
    if (ctx->rank <= 2) {
        /* Rank 2 comes last: it belongs to rank 0's [0, 2], so its refusal stops rank 0's attempt,
         * which is then withdrawn; rank 1 must have seen it before (a rank that reaches the call
         * after that finds nothing and can only wait for HCCL_CONNECT_TIMEOUT). */
        h_sleep(ctx->rank == 2 ? 0.5 : 0.0);
        const uint32_t *mine = ctx->rank == 0 ? pair : trio;
        uint32_t n = ctx->rank == 0 ? 2 : 3;
        HcclComm sub = NULL;
        double t0 = h_now();
        HcclResult rc = create_sub(ctx, &world, mine, n, 7, &sub);
        double dt = h_now() - t0;
        H_EXPECT_REFUSED(ctx, rc, HCCL_E_PARA, "sub-communicator 7", "[0, 2]", "[0, 1, 2]");
        H_EXPECT(ctx, dt < PROMPT, "the disagreement took %.2f s to be reported", dt);
        H_EXPECT(ctx, sub == NULL, "a refused HcclCreateSubCommConfig left a communicator");
    }
    RUN(h_oob_barrier(ctx));
    h_set_case(ctx, "subcomm-members: the same id with one list afterwards");
    HcclComm sub = NULL;
    H_HCCL(ctx, create_sub(ctx, &world, trio, 3, 7, &sub));
    if (ctx->rank <= 2) {
        H_REQUIRE(ctx, sub != NULL, "rank %u is in [0, 1, 2] but got no sub-communicator", ctx->rank);
        RUN(sum_check(ctx, sub, trio, 3, "sub-communicator [0, 1, 2]"));
        H_HCCL(ctx, HcclCommDestroy(sub));
    }
    H_HCCL(ctx, HcclCommDestroy(world));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- subcomm-ids ---------------------------------------------------------------------------- */

static int case_subcomm_ids(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    HcclComm world;
    RUN(h_world_comm(ctx, &world));
    static const uint32_t evens[] = {0, 2}, odds[] = {1, 3};
    h_set_case(ctx, "subcomm-ids: [0, 2] and [1, 3] both under id 9");
    RUN(h_oob_barrier(ctx));
    /* One after the other: rank 0 posts 9 first; rank 2, its other member, comes last. */
    static const double delay[4] = {0.0, 0.5, 2.0, 1.0};
    if (ctx->rank < 4) {
        h_sleep(delay[ctx->rank]);
        const uint32_t *mine = ctx->rank % 2 == 0 ? evens : odds;
        HcclComm sub = NULL;
        double t0 = h_now();
        HcclResult rc = create_sub(ctx, &world, mine, 2, 9, &sub);
        double dt = h_now() - t0;
        if (ctx->rank % 2 == 0) {
            H_EXPECT(ctx, rc == HCCL_SUCCESS, "rank %u: [0, 2] under id 9 failed (%d): %s", ctx->rank,
                     (int)rc, h_recent_msg());
            if (rc == HCCL_SUCCESS && sub != NULL) {
                uint32_t size = 0, rank = 0;
                H_HCCL(ctx, HcclGetRankSize(sub, &size));
                H_HCCL(ctx, HcclGetRankId(sub, &rank));
                H_EXPECT(ctx, size == 2 && rank == ctx->rank / 2, "rank %u: sub-communicator rank %u of %u",
                         ctx->rank, rank, size);
                RUN(sum_check(ctx, sub, evens, 2, "sub-communicator [0, 2]"));
                H_HCCL(ctx, HcclCommDestroy(sub));
            }
        } else {
            H_EXPECT_REFUSED(ctx, rc, HCCL_E_PARA, "sub-communicator 9", "[0, 2]", "[1, 3]");
            H_EXPECT(ctx, dt < PROMPT, "the clash took %.2f s to be reported", dt);
            H_EXPECT(ctx, sub == NULL, "rank %u got a sub-communicator [0, 2] it is not a member of",
                     ctx->rank);
            if (sub != NULL) {
                HcclCommDestroy(sub);
            }
        }
    }
    RUN(h_oob_barrier(ctx));
    h_set_case(ctx, "subcomm-ids: [1, 3] under its own id");
    HcclComm sub = NULL;
    H_HCCL(ctx, create_sub(ctx, &world, ctx->rank < 4 ? odds : NULL, 2, 10, &sub));
    if (ctx->rank == 1 || ctx->rank == 3) {
        H_REQUIRE(ctx, sub != NULL, "rank %u is in [1, 3] but got no sub-communicator", ctx->rank);
        RUN(sum_check(ctx, sub, odds, 2, "sub-communicator [1, 3]"));
        H_HCCL(ctx, HcclCommDestroy(sub));
    }
    H_HCCL(ctx, HcclCommDestroy(world));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- suspend-idle --------------------------------------------------------------------------- */

static int case_suspend_idle(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    uint32_t members[H_MAX_RANKS];
    for (uint32_t r = 0; r < ctx->nranks; r++) {
        members[r] = r;
    }
    h_set_case(ctx, "suspend-idle: every rank suspends and resumes");
    H_HCCL(ctx, HcclCommSuspend(comm));
    RUN(h_oob_barrier(ctx));
    H_HCCL(ctx, HcclCommResume(comm));
    RUN(h_oob_barrier(ctx));
    RUN(sum_check(ctx, comm, members, ctx->nranks, "after every rank suspended and resumed"));

    h_set_case(ctx, "suspend-idle: rank 0 suspends, the others run an AllReduce");
    if (ctx->rank == 0) {
        H_HCCL(ctx, HcclCommSuspend(comm));
    }
    RUN(h_oob_barrier(ctx));
    bufs b;
    RUN(alloc_bufs(ctx, &b, ctx->rank));
    if (ctx->rank != 0) {
        double t0 = h_now();
        HcclResult hr = HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                                      ctx->stream);
        aclError ar = hr == HCCL_SUCCESS ? aclrtSynchronizeStream(ctx->stream) : ACL_SUCCESS;
        double dt = h_now() - t0;
        const char *m = aclGetRecentErrMsg();
        char text[1024];
        snprintf(text, sizeof text, "%s", m ? m : "");
        H_EXPECT(ctx, hr != HCCL_SUCCESS || ar != ACL_SUCCESS, "an AllReduce that needs suspended rank 0 "
                 "succeeded");
        H_EXPECT(ctx, dt < PROMPT, "the AllReduce took %.2f s to fail (HCCL_EXEC_TIMEOUT is far longer)", dt);
        H_EXPECT(ctx, strstr(text, "rank 0") != NULL && strstr(text, "HcclCommSuspend") != NULL,
                 "the failure \"%s\" does not name rank 0 and HcclCommSuspend", text);
        HcclResult async = HCCL_SUCCESS;
        H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
        H_EXPECT(ctx, async == HCCL_E_REMOTE, "HcclGetCommAsyncError = %d, expected HCCL_E_REMOTE", (int)async);
        H_EXPECT_REFUSED(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                                          ctx->stream),
                       HCCL_E_REMOTE, "has failed (rank 0:", "HcclCommSuspend");
    }
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        h_set_case(ctx, "suspend-idle: rank 0 resumes a communicator its suspension broke");
        H_EXPECT_REFUSED(ctx, HcclCommResume(comm), HCCL_E_SUSPENDING, "HcclCommResume", "has failed",
                       "HcclCommSuspend");
        HcclResult async = HCCL_SUCCESS;
        H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
        H_EXPECT(ctx, async == HCCL_E_SUSPENDING, "HcclGetCommAsyncError = %d on the suspended rank",
                 (int)async);
    }
    h_set_case(ctx, "suspend-idle: teardown");
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(free_bufs(ctx, &b));
    H_ACL(ctx, aclrtDestroyStream(ctx->stream)); /* failed on the other ranks: a new one */
    H_ACL(ctx, aclrtCreateStream(&ctx->stream));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- destroy-after-abort -------------------------------------------------------------------- */

#define ABORT_ROUNDS 8
#define ABORT_COUNT (1 << 18)

static int case_destroy_after_abort(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    void *in = NULL, *out = NULL;
    H_ACL(ctx, aclrtMalloc(&in, ABORT_COUNT * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&out, ABORT_COUNT * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    for (int round = 0; round < ABORT_ROUNDS; round++) {
        h_set_case(ctx, "destroy-after-abort: round %d", round);
        HcclComm comm;
        RUN(h_world_comm(ctx, &comm));
        if (ctx->rank == 0) {
            /* Three operations, so that some are still queued behind the first. */
            for (int i = 0; i < 3; i++) {
                H_HCCL(ctx, HcclAllReduce(in, out, ABORT_COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                                          ctx->stream));
            }
            if (round % 2 == 1) {
                h_sleep(0.05); /* the stream's worker has picked the first one up */
            }
            H_HCCL(ctx, HcclCommSuspend(comm));
            HcclResult rc = HcclCommDestroy(comm);
            H_EXPECT(ctx, rc == HCCL_SUCCESS, "HcclCommDestroy right after HcclCommSuspend returned %d: %s",
                     (int)rc, h_recent_msg());
            double t0 = h_now();
            aclError ar = aclrtSynchronizeStream(ctx->stream);
            H_EXPECT(ctx, ar != ACL_SUCCESS, "the operations of the destroyed communicator succeeded");
            H_EXPECT(ctx, h_now() - t0 < PROMPT, "the suspended operations took %.2f s to fail", h_now() - t0);
            H_ACL(ctx, aclrtDestroyStream(ctx->stream));
            H_ACL(ctx, aclrtCreateStream(&ctx->stream));
        }
        RUN(h_oob_barrier(ctx));
        if (ctx->rank != 0) {
            H_HCCL(ctx, HcclCommDestroy(comm));
        }
    }
    H_ACL(ctx, aclrtFree(in));
    H_ACL(ctx, aclrtFree(out));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- rank-table-retry ----------------------------------------------------------------------- */

static int case_rank_table_retry(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    char path[512];
    memset(path, 0, sizeof path);
    if (ctx->rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/hcclpy-lifecycle-%ld-%lld.json", tmp && *tmp ? tmp : "/tmp",
                 (long)getpid(), (long long)(h_now() * 1e6));
        FILE *f = fopen(path, "w");
        int ok = f != NULL;
        if (f != NULL) {
            ok = fprintf(f, "{\"status\": \"completed\", \"version\": \"1.0\", \"server_count\": \"1\", "
                         "\"server_list\": [{\"server_id\": \"127.0.0.1\", \"device\": ["
                         "{\"device_id\": \"0\", \"device_ip\": \"192.168.1.10\", \"rank_id\": \"0\"}, "
                         "{\"device_id\": \"1\", \"device_ip\": \"192.168.1.11\", \"rank_id\": \"1\"}]}]}\n") > 0;
            ok = fclose(f) == 0 && ok;
        }
        if (!ok) {
            h_failf(ctx, __FILE__, __LINE__, "cannot write the rank table %s", path);
            path[0] = '\0';
        }
    }
    RUN(h_oob_bcast(ctx, 0, path, sizeof path));
    H_REQUIRE(ctx, path[0] != '\0', "rank 0 could not write the rank table");
    HcclComm comm = NULL;
    if (ctx->rank == 0) {
        h_set_case(ctx, "rank-table-retry: rank 0 on the wrong device, then on the right one");
        H_ACL(ctx, aclrtSetDevice(1));
        double t0 = h_now();
        H_EXPECT_REFUSED(ctx, HcclCommInitClusterInfo(path, 0, &comm), HCCL_E_PARA, "puts rank 0 on device 0");
        H_EXPECT(ctx, h_now() - t0 < PROMPT, "the wrong device took %.2f s to be reported", h_now() - t0);
        H_ACL(ctx, aclrtResetDevice(1));
        H_ACL(ctx, aclrtSetDevice(0));
        H_ACL(ctx, aclrtResetDevice(0)); /* back to h_rank_setup's count */
        h_sleep(0.3);                    /* rank 1 has been waiting all along */
    } else {
        h_set_case(ctx, "rank-table-retry: rank 1 waits through rank 0's failed attempt");
    }
    double t0 = h_now();
    H_HCCL(ctx, HcclCommInitClusterInfo(path, ctx->rank, &comm));
    H_EXPECT(ctx, h_now() - t0 < PROMPT + 1.0, "the communicator took %.2f s to form", h_now() - t0);
    static const uint32_t both[] = {0, 1};
    RUN(sum_check(ctx, comm, both, 2, "rank-table communicator"));
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        unlink(path);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- root-info-expiry (one thread) ---------------------------------------------------------- */

typedef struct {
    HcclRootInfo info;
    uint32_t nranks, rank;
    int32_t device;
    double delay;
    HcclResult rc;
    double seconds;
    char text[1024];
} init_thread;

static void *init_main(void *arg)
{
    init_thread *t = (init_thread *)arg;
    if (aclrtSetDevice(t->device) != ACL_SUCCESS) {
        t->rc = HCCL_E_RUNTIME;
        return NULL;
    }
    h_sleep(t->delay);
    HcclComm comm = NULL;
    double t0 = h_now();
    t->rc = HcclCommInitRootInfo(t->nranks, &t->info, t->rank, &comm);
    t->seconds = h_now() - t0;
    const char *m = aclGetRecentErrMsg();
    snprintf(t->text, sizeof t->text, "%s", m ? m : "");
    if (t->rc == HCCL_SUCCESS) {
        HcclCommDestroy(comm);
    }
    aclrtResetDevice(t->device);
    return NULL;
}

static int case_root_info_expiry(h_ctx *ctx)
{
    H_ACL(ctx, aclrtSetDevice(0));
    if (h_case(ctx, "root-info-expiry: unused root infos are released")) {
        setenv("HCCL_CONNECT_TIMEOUT", "1", 1);
        int before = count_fds();
        HcclRootInfo first, info;
        H_HCCL(ctx, HcclGetRootInfo(&first));
        for (int i = 0; i < 19; i++) {
            H_HCCL(ctx, HcclGetRootInfo(&info));
        }
        int held = count_fds();
        H_EXPECT(ctx, held >= before + 20, "20 root infos hold %d descriptors, expected 20", held - before);
        int after = fds_drop_to(before, 4.0);
        H_EXPECT(ctx, after <= before, "4 s after 20 unused root infos with HCCL_CONNECT_TIMEOUT=1, %d "
                 "descriptors more are open", after - before);
        HcclComm comm = NULL;
        H_EXPECT_REFUSED(ctx, HcclCommInitRootInfo(1, &first, 0, &comm), HCCL_E_UNAVAIL, "expired",
                       "HCCL_CONNECT_TIMEOUT");
        setenv("HCCL_CONNECT_TIMEOUT", "30", 1);
    }
    if (h_case(ctx, "root-info-expiry: ranks disagree on nRanks")) {
        int before = count_fds();
        init_thread t[2];
        memset(t, 0, sizeof t);
        H_HCCL(ctx, HcclGetRootInfo(&t[0].info));
        t[1].info = t[0].info;
        t[0].nranks = 2, t[0].rank = 0, t[0].device = 0, t[0].delay = 0.0;
        t[1].nranks = 3, t[1].rank = 1, t[1].device = 1, t[1].delay = 0.3;
        pthread_t threads[2];
        for (int i = 0; i < 2; i++) {
            H_REQUIRE(ctx, pthread_create(&threads[i], NULL, init_main, &t[i]) == 0, "pthread_create failed");
        }
        for (int i = 0; i < 2; i++) {
            pthread_join(threads[i], NULL);
        }
        for (int i = 0; i < 2; i++) {
            H_EXPECT(ctx, t[i].rc == HCCL_E_PARA, "rank %d (nRanks=%u) returned %d, expected HCCL_E_PARA: %s", i,
                     t[i].nranks, (int)t[i].rc, t[i].text);
            H_EXPECT(ctx, t[i].seconds < PROMPT, "rank %d (nRanks=%u) took %.2f s to fail", i, t[i].nranks,
                     t[i].seconds);
            H_EXPECT(ctx, strstr(t[i].text, "nRanks=3") != NULL, "rank %d: \"%s\" does not name the other "
                     "nRanks", i, t[i].text);
        }
        int after = fds_drop_to(before, 1.0);
        H_EXPECT(ctx, after <= before, "the root info of the failed communicator is still held (%d "
                 "descriptors more)", after - before);
    }
    if (h_case(ctx, "root-info-expiry: a root info serves one communicator")) {
        HcclRootInfo info;
        HcclComm comm = NULL, again = NULL;
        H_HCCL(ctx, HcclGetRootInfo(&info));
        H_HCCL(ctx, HcclCommInitRootInfo(1, &info, 0, &comm));
        H_EXPECT_REFUSED(ctx, HcclCommInitRootInfo(1, &info, 0, &again), HCCL_E_UNAVAIL, "already used");
        H_HCCL(ctx, HcclCommDestroy(comm));
    }
    H_ACL(ctx, aclrtResetDevice(0));
    return 0;
}

/* ---- root-info-elsewhere (procs) ------------------------------------------------------------ */

static int case_root_info_elsewhere(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    h_set_case(ctx, "root-info-elsewhere: rank 0 makes a root info for rank 1's 1-rank communicator");
    HcclRootInfo info;
    memset(&info, 0, sizeof info);
    int before = count_fds();
    if (ctx->rank == 0) {
        H_HCCL(ctx, HcclGetRootInfo(&info));
    }
    RUN(h_oob_bcast(ctx, 0, &info, sizeof info));
    if (ctx->rank == 1) {
        HcclComm comm = NULL;
        H_HCCL(ctx, HcclCommInitRootInfo(1, &info, 0, &comm));
        H_HCCL(ctx, HcclCommDestroy(comm));
    }
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        int after = fds_drop_to(before, 3.0);
        H_EXPECT(ctx, after <= before, "3 s after its communicator formed in another process, rank 0 still "
                 "holds the root info (%d descriptors more)", after - before);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- destroy-race (one thread) -------------------------------------------------------------- */

#define RACE_ROUNDS 150

typedef struct {
    HcclComm comm;
    atomic_int go;
    atomic_long live;
    long refused, wrong;
    HcclResult destroy_rc;
} race_t;

/* Asks for the async error until the communicator is gone. */
static void *poll_main(void *arg)
{
    race_t *r = (race_t *)arg;
    while (atomic_load(&r->go) == 0) {
    }
    for (;;) {
        HcclResult async = HCCL_SUCCESS;
        HcclResult rc = HcclGetCommAsyncError(r->comm, &async);
        if (rc == HCCL_E_PARA) {
            r->refused++;
            return NULL;
        }
        if (rc == HCCL_SUCCESS && async == HCCL_E_REMOTE) {
            atomic_fetch_add(&r->live, 1);
        } else {
            r->wrong++;
            return NULL;
        }
    }
}

static void *destroy_main(void *arg)
{
    race_t *r = (race_t *)arg;
    while (atomic_load(&r->go) == 0) {
    }
    r->destroy_rc = HcclCommDestroy(r->comm);
    return NULL;
}

static int case_destroy_race(h_ctx *ctx)
{
    int32_t devices[2] = {0, 1};
    aclrtStream stream = NULL;
    H_ACL(ctx, aclrtSetDevice(0));
    H_ACL(ctx, aclrtCreateStream(&stream));
    void *in = NULL, *out = NULL;
    H_ACL(ctx, aclrtMalloc(&in, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&out, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    long live = 0, refused = 0;
    for (int round = 0; round < RACE_ROUNDS; round++) {
        h_set_case(ctx, "destroy-race: round %d", round);
        HcclComm comms[2] = {NULL, NULL};
        H_HCCL(ctx, HcclCommInitAll(2, devices, comms));
        /* Rank 0's AllReduce waits for rank 1, which never calls it, until rank 0 suspends: that
         * breaks the communicator, so rank 1's HcclGetCommAsyncError reads the reason from the
         * shared segment, which rank 1's HcclCommDestroy unmaps. */
        H_HCCL(ctx, HcclAllReduce(in, out, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comms[0], stream));
        H_HCCL(ctx, HcclCommSuspend(comms[0]));
        H_EXPECT(ctx, aclrtSynchronizeStream(stream) != ACL_SUCCESS, "the suspended AllReduce succeeded");
        H_ACL(ctx, aclrtDestroyStream(stream));
        H_ACL(ctx, aclrtCreateStream(&stream));

        race_t r;
        memset(&r, 0, sizeof r);
        r.comm = comms[1];
        pthread_t poller, destroyer;
        H_REQUIRE(ctx, pthread_create(&poller, NULL, poll_main, &r) == 0, "pthread_create failed");
        atomic_store(&r.go, 1);
        /* Destroy while the other thread is in the middle of its calls. */
        double until = h_now() + 5.0;
        while (atomic_load(&r.live) == 0 && r.wrong == 0 && h_now() < until) {
        }
        for (volatile int spin = 0; spin < (round % 16) * 300; spin++) {
        }
        HcclResult rc = HcclCommDestroy(comms[1]);
        pthread_join(poller, NULL);
        H_EXPECT(ctx, rc == HCCL_SUCCESS, "HcclCommDestroy returned %d: %s", (int)rc, h_recent_msg());
        H_EXPECT(ctx, r.wrong == 0, "HcclGetCommAsyncError during HcclCommDestroy gave a wrong answer");
        live += atomic_load(&r.live);
        refused += r.refused;

        /* Two threads destroy the other communicator at once: one of them does. */
        race_t a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        a.comm = b.comm = comms[0];
        pthread_t ta;
        H_REQUIRE(ctx, pthread_create(&ta, NULL, destroy_main, &a) == 0, "pthread_create failed");
        H_REQUIRE(ctx, pthread_create(&destroyer, NULL, destroy_main, &b) == 0, "pthread_create failed");
        atomic_store(&a.go, 1);
        atomic_store(&b.go, 1);
        pthread_join(ta, NULL);
        pthread_join(destroyer, NULL);
        int ok = (a.destroy_rc == HCCL_SUCCESS) + (b.destroy_rc == HCCL_SUCCESS);
        H_EXPECT(ctx, ok == 1 && (a.destroy_rc == HCCL_E_PARA || b.destroy_rc == HCCL_E_PARA),
                 "two concurrent HcclCommDestroy of one communicator returned %d and %d", (int)a.destroy_rc,
                 (int)b.destroy_rc);
        if (ctx->failures > 0) {
            break;
        }
    }
    h_log(ctx, "HcclGetCommAsyncError answered %ld times while the communicator lived, refused %ld times",
          live, refused);
    H_ACL(ctx, aclrtFree(in));
    H_ACL(ctx, aclrtFree(out));
    H_ACL(ctx, aclrtDestroyStream(stream));
    H_ACL(ctx, aclrtResetDevice(0));
    return 0;
}

/* ---- rank tables ---------------------------------------------------------------------------- */

/* Writes a rank table for ranks 0..n-1 on devices 0..n-1 of one server; 0 on success. */
static int write_table(const char *path, uint32_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    int ok = fprintf(f, "{\"status\": \"completed\", \"version\": \"1.0\", \"server_count\": \"1\", "
                     "\"server_list\": [{\"server_id\": \"127.0.0.1\", \"device\": [") > 0;
    for (uint32_t r = 0; r < n; r++) {
        ok = fprintf(f, "%s{\"device_id\": \"%u\", \"device_ip\": \"192.168.1.%u\", \"rank_id\": \"%u\"}",
                     r ? ", " : "", r, 10 + r, r) > 0 && ok;
    }
    ok = fprintf(f, "]}]}\n") > 0 && ok;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A path in TMPDIR unique to this run, ending in `suffix`. */
static void temp_path(char *out, size_t len, const char *suffix)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(out, len, "%s/hcclpy-lifecycle-%ld-%lld%s", tmp && *tmp ? tmp : "/tmp", (long)getpid(),
             (long long)(h_now() * 1e6), suffix);
}

/* ---- init-exit (launched several times) ----------------------------------------------------- */

#define INIT_EXIT_ROUNDS 12

typedef struct {
    int round;
    char table[512];
} init_exit_arg;

/* Every rank creates a communicator (by turns from a root info, from the rank table, or as a
 * sub-communicator of all ranks), destroys it and returns at once: its process exits while the
 * other ranks may still be creating theirs, which must not fail them. */
static int case_init_exit(h_ctx *ctx)
{
    const init_exit_arg *a = (const init_exit_arg *)ctx->arg;
    H_ACL(ctx, aclrtSetDevice(ctx->device));
    HcclComm comm = NULL, sub = NULL;
    switch (a->round % 3) {
    case 0:
        h_set_case(ctx, "init-exit %d: HcclCommInitRootInfo, destroy, exit", a->round);
        RUN(h_world_comm(ctx, &comm));
        break;
    case 1:
        h_set_case(ctx, "init-exit %d: HcclCommInitClusterInfo, destroy, exit", a->round);
        H_HCCL(ctx, HcclCommInitClusterInfo(a->table, ctx->rank, &comm));
        break;
    default: {
        h_set_case(ctx, "init-exit %d: HcclCreateSubCommConfig, destroy, exit", a->round);
        RUN(h_world_comm(ctx, &comm));
        uint32_t ids[H_MAX_RANKS];
        for (uint32_t r = 0; r < ctx->nranks; r++) {
            ids[r] = r;
        }
        H_HCCL(ctx, create_sub(ctx, &comm, ids, ctx->nranks, 40 + (uint64_t)a->round, &sub));
        H_HCCL(ctx, HcclCommDestroy(sub));
        break;
    }
    }
    H_HCCL(ctx, HcclCommDestroy(comm));
    return 0;
}

static int launch_init_exit(void)
{
    init_exit_arg a;
    memset(&a, 0, sizeof a);
    temp_path(a.table, sizeof a.table, ".json");
    if (write_table(a.table, h_opt.nranks) != 0) {
        printf("FAIL cannot write the rank table %s\n", a.table);
        return 1;
    }
    int failed = 0;
    for (a.round = 0; a.round < INIT_EXIT_ROUNDS && !failed; a.round++) {
        failed = h_launch("init-exit", case_init_exit, &a, NULL);
    }
    unlink(a.table);
    return failed;
}

/* ---- rank-table-again ----------------------------------------------------------------------- */

/* Communicators from one rank table, one after the other: each rank creates one, uses it,
 * destroys it and at once creates the next (rank 0 may still be on its way out of the last). */
static int case_rank_table_again(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    char path[512];
    memset(path, 0, sizeof path);
    if (ctx->rank == 0) {
        temp_path(path, sizeof path, ".json");
        if (write_table(path, ctx->nranks) != 0) {
            h_failf(ctx, __FILE__, __LINE__, "cannot write the rank table %s", path);
            path[0] = '\0';
        }
    }
    RUN(h_oob_bcast(ctx, 0, path, sizeof path));
    H_REQUIRE(ctx, path[0] != '\0', "rank 0 could not write the rank table");
    uint32_t all[H_MAX_RANKS];
    for (uint32_t r = 0; r < ctx->nranks; r++) {
        all[r] = r;
    }
    for (int i = 0; i < 4; i++) {
        h_set_case(ctx, "rank-table-again: communicator %d from the same table", i);
        HcclComm comm = NULL;
        H_HCCL(ctx, HcclCommInitClusterInfo(path, ctx->rank, &comm));
        if (i % 2 == 1) {
            RUN(sum_check(ctx, comm, all, ctx->nranks, "rank-table communicator"));
        }
        H_HCCL(ctx, HcclCommDestroy(comm));
    }
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        unlink(path);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- rank-table-copies ---------------------------------------------------------------------- */

/* Every rank reads its own copy of the rank table, at a path of its own (one per server). */
static int case_rank_table_copies(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    h_set_case(ctx, "rank-table-copies: each rank reads its own copy of the table");
    char path[512];
    temp_path(path, sizeof path, "");
    snprintf(path + strlen(path), sizeof path - strlen(path), "-rank%u.json", ctx->rank);
    H_REQUIRE(ctx, write_table(path, ctx->nranks) == 0, "cannot write the rank table %s", path);
    HcclComm comm = NULL;
    HcclResult rc = HcclCommInitClusterInfo(path, ctx->rank, &comm);
    unlink(path);
    H_HCCL(ctx, rc);
    uint32_t all[H_MAX_RANKS];
    for (uint32_t r = 0; r < ctx->nranks; r++) {
        all[r] = r;
    }
    RUN(sum_check(ctx, comm, all, ctx->nranks, "communicator from copies of a rank table"));
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(h_rank_teardown(ctx));
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    h_rank_fn fn;
    uint32_t min_ranks, max_ranks;
    int single;     /* one thread of one process drives it */
    int procs_only; /* needs ranks in different processes */
} case_t;

static const case_t CASES[] = {
    {"subcomm-members", case_subcomm_members, 3, H_MAX_RANKS, 0, 0},
    {"subcomm-ids", case_subcomm_ids, 4, H_MAX_RANKS, 0, 0},
    {"suspend-idle", case_suspend_idle, 2, H_MAX_RANKS, 0, 0},
    {"destroy-after-abort", case_destroy_after_abort, 2, 2, 0, 0},
    {"rank-table-retry", case_rank_table_retry, 2, 2, 0, 0},
    {"root-info-expiry", case_root_info_expiry, 1, H_MAX_RANKS, 1, 0},
    {"root-info-elsewhere", case_root_info_elsewhere, 2, 2, 0, 1},
    {"destroy-race", case_destroy_race, 1, H_MAX_RANKS, 1, 0},
    {"init-exit", case_init_exit, 2, H_MAX_RANKS, 0, 0},
    {"rank-table-again", case_rank_table_again, 2, 8, 0, 0},
    {"rank-table-copies", case_rank_table_copies, 2, 8, 0, 0},
};

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "--case NAME");
    const char *which = h_arg("case");
    const case_t *c = NULL;
    for (size_t i = 0; which != NULL && i < sizeof CASES / sizeof CASES[0]; i++) {
        if (strcmp(which, CASES[i].name) == 0) {
            c = &CASES[i];
        }
    }
    if (c == NULL) {
        fprintf(stderr, "lifecycle: --case must name one of the cases listed at the top of lifecycle.c\n");
        return 2;
    }
    if (h_opt.nranks < c->min_ranks || h_opt.nranks > c->max_ranks || (c->single && h_opt.mode != H_MODE_THREADS) ||
        (c->procs_only && h_opt.mode != H_MODE_PROCS)) {
        fprintf(stderr, "lifecycle: case %s needs %u to %u ranks%s\n", c->name, c->min_ranks, c->max_ranks,
                c->single ? " in --mode threads" : c->procs_only ? " in --mode procs" : "");
        return 2;
    }
    int failed;
    if (c->single) {
        h_ctx ctx;
        double t0 = h_now();
        h_init_single(&ctx, c->name);
        int rc = c->fn(&ctx);
        failed = h_single_done(&ctx, rc, c->name, t0);
    } else if (c->fn == case_init_exit) {
        failed = launch_init_exit();
    } else {
        failed = h_launch(c->name, c->fn, NULL, NULL);
    }
    return h_finish("lifecycle", failed);
}
