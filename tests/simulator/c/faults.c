/*
 * Faults: a peer that dies, is killed, never shows up for an operation, or never joins init.
 *
 * usage: faults --ranks N (>= 2) --mode procs
 *        [--case exit|kill|sleep|sleep-config|connect|suspend|all]
 *
 * The last rank is the faulty one. HCCL_EXEC_TIMEOUT defaults to 5 and HCCL_CONNECT_TIMEOUT to 3
 * here (set them in the environment to change that). The survivors must see an error within the
 * timeout + 2 s:
 *  - exit:    the last rank _exit(0)s in the middle of an AllReduce loop;
 *  - kill:    the parent SIGKILLs the last rank in the middle of the loop;
 *  - sleep:   the last rank never calls the AllReduce (the others time out);
 *  - sleep-config: the same on a comm whose config sets hcclExecTimeOut = 3 s while
 *             HCCL_EXEC_TIMEOUT is 30 s: the config wins;
 *  - connect: the last rank never calls HcclCommInitRootInfo (the others' init times out);
 *  - suspend: HcclCommSuspend/HcclCommResume with nothing in flight on every rank, the ranks
 *             synchronised in between and after (an operation that needs a rank while it is
 *             suspended fails), leave the communicator working; then rank 0 suspends while its
 *             AllReduce waits for the others: the
 *             operation fails at once and the communicator is broken, so HcclCommResume fails
 *             on every rank (HCCL_E_SUSPENDING on rank 0, HCCL_E_REMOTE on the others) with
 *             the same code as the calls after it, instead of a success nothing can use.
 * After exit/kill the survivors destroy their communicator, build a new one among themselves
 * (root info through the pipes) and run an AllReduce on it.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { CASE_EXIT, CASE_KILL, CASE_SLEEP, CASE_CONNECT };

/* sleep-config: the comm's hcclExecTimeOut, with a much longer HCCL_EXEC_TIMEOUT around it */
#define CONFIG_EXEC_TIMEOUT 3
#define CONFIG_CASE_ENV_TIMEOUT "30"

static double exec_timeout, connect_timeout;

#define LOOP_BEFORE_FAULT 20 /* AllReduce iterations before the last rank misbehaves */
#define COUNT (1 << 14)

static double env_seconds(const char *name)
{
    const char *v = getenv(name);
    return v ? strtod(v, NULL) : 0.0;
}

typedef struct {
    void *in, *out;
} bufs;

static int alloc_bufs(h_ctx *ctx, bufs *b)
{
    float host[COUNT];
    h_fill(HCCL_DATA_TYPE_FP32, H_GEN_SUM, ctx->rank, 0, COUNT, host);
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

/* AllReduce among the survivors (ranks 0..N-2) on a new communicator. */
static int survivors_rebuild(h_ctx *ctx, bufs *b)
{
    h_set_case(ctx, "survivors build a new communicator");
    uint32_t n = ctx->nranks - 1;
    uint64_t mask = h_all_mask(n);
    HcclRootInfo ri;
    RUN(h_make_root_info(ctx, mask, 0, &ri));
    HcclComm comm = NULL;
    H_HCCL(ctx, HcclCommInitRootInfo(n, &ri, ctx->rank, &comm));
    uint32_t v = 0;
    H_HCCL(ctx, HcclGetRankSize(comm, &v));
    H_EXPECT(ctx, v == n, "new communicator has %u ranks, expected %u", v, n);
    H_HCCL(ctx, HcclAllReduce(b->in, b->out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                              ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    float got[COUNT], exp[COUNT];
    H_ACL(ctx, aclrtMemcpy(got, sizeof got, b->out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    h_reduce_fill(HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 0, COUNT, exp);
    H_EXPECT(ctx, memcmp(got, exp, sizeof got) == 0, "AllReduce among the survivors is wrong");
    H_HCCL(ctx, HcclCommDestroy(comm));
    return 0;
}

/* A survivor after its operation failed: async error, sticky stream, destroy, new stream. */
static int after_failure(h_ctx *ctx, HcclComm comm)
{
    h_set_case(ctx, "survivor cleans up after the failure");
    HcclResult async = HCCL_SUCCESS;
    H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
    H_EXPECT(ctx, async != HCCL_SUCCESS, "HcclGetCommAsyncError reports success after a failed "
             "operation");
    aclError again = aclrtSynchronizeStream(ctx->stream);
    H_EXPECT(ctx, again != ACL_SUCCESS, "the stream error is not sticky: a second "
             "aclrtSynchronizeStream returned 0");
    double t0 = h_now();
    H_HCCL(ctx, HcclCommDestroy(comm));
    H_EXPECT(ctx, h_now() - t0 < exec_timeout + 2.0, "HcclCommDestroy of the broken comm took "
             "%.2f s", h_now() - t0);
    H_ACL(ctx, aclrtDestroyStream(ctx->stream));
    ctx->stream = NULL;
    H_ACL(ctx, aclrtCreateStream(&ctx->stream));
    return 0;
}

static int death(h_ctx *ctx, int kind)
{
    uint32_t victim = ctx->nranks - 1;
    int is_victim = ctx->rank == victim;
    RUN(h_rank_setup(ctx));
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    bufs b;
    RUN(alloc_bufs(ctx, &b));
    h_set_case(ctx, "%s: AllReduce loop", kind == CASE_EXIT ? "exit" : "kill");
    double start = h_now();
    int detected = 0;
    for (int it = 0;; it++) {
        if (is_victim && it == LOOP_BEFORE_FAULT) {
            if (kind == CASE_EXIT) {
                h_log(ctx, "last rank: _exit(0) at iteration %d", it);
                fflush(stdout);
                _exit(0);
            }
            h_log(ctx, "last rank: asking the parent to SIGKILL me at iteration %d", it);
            h_notify_parent(ctx, 1);
        }
        if (h_now() - start > 60.0) {
            h_failf(ctx, __FILE__, __LINE__, "%s after 60 s and %d iterations",
                    is_victim ? "the parent never killed this rank"
                              : "no error seen although the last rank is gone",
                    it);
            return -1;
        }
        double t0 = h_now();
        HcclResult hr = HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                      comm, ctx->stream);
        aclError ar = hr == HCCL_SUCCESS ? aclrtSynchronizeStream(ctx->stream) : ACL_SUCCESS;
        double dt = h_now() - t0;
        if (hr == HCCL_SUCCESS && ar == ACL_SUCCESS) {
            continue;
        }
        if (is_victim) {
            h_failf(ctx, __FILE__, __LINE__, "the last rank failed itself at iteration %d "
                    "(HcclAllReduce %d, sync %d)", it, (int)hr, (int)ar);
            return -1;
        }
        if (hr != HCCL_SUCCESS) {
            h_expect_rc(ctx, __FILE__, __LINE__, "HcclAllReduce (after the peer died)", hr,
                        H_ANY_ERROR, 1);
        } else {
            h_expect_rc(ctx, __FILE__, __LINE__, "aclrtSynchronizeStream (after the peer died)",
                        ar, H_ANY_ERROR, 0);
        }
        H_EXPECT(ctx, it >= LOOP_BEFORE_FAULT, "iteration %d failed before the last rank "
                 "misbehaved (HcclAllReduce %d, sync %d)", it, (int)hr, (int)ar);
        H_EXPECT(ctx, dt <= exec_timeout + 2.0, "the failure took %.2f s to show (limit "
                 "HCCL_EXEC_TIMEOUT %.0f + 2 s)", dt, exec_timeout);
        h_log(ctx, "saw the failure at iteration %d after %.3f s (%s returned %d)", it, dt,
              hr != HCCL_SUCCESS ? "HcclAllReduce" : "aclrtSynchronizeStream",
              hr != HCCL_SUCCESS ? (int)hr : (int)ar);
        detected = 1;
        break;
    }
    H_REQUIRE(ctx, detected, "no failure detected");
    RUN(after_failure(ctx, comm));
    RUN(survivors_rebuild(ctx, &b));
    h_set_case(ctx, "teardown");
    RUN(free_bufs(ctx, &b));
    RUN(h_rank_teardown(ctx));
    return 0;
}

static int case_exit(h_ctx *ctx)
{
    return death(ctx, CASE_EXIT);
}

static int case_kill(h_ctx *ctx)
{
    return death(ctx, CASE_KILL);
}

static void kill_hook(h_parent *p)
{
    uint32_t proc = 0;
    int code = h_parent_wait_notify(p, &proc, 60.0);
    if (code < 0 || proc >= p->nprocs) {
        printf("FAIL parent: no request to kill a process arrived\n");
        fflush(stdout);
        return;
    }
    h_sleep(0.2); /* let it get back into the loop */
    p->may_be_killed[proc] = 1;
    kill(p->pids[proc], SIGKILL);
    printf("parent: sent SIGKILL to process %u (pid %d)\n", proc, (int)p->pids[proc]);
    fflush(stdout);
}

static int sleeper(h_ctx *ctx, int use_config)
{
    uint32_t victim = ctx->nranks - 1;
    double limit = exec_timeout;
    RUN(h_rank_setup(ctx));
    HcclComm comm;
    if (use_config) {
        HcclCommConfig cfg;
        HcclCommConfigInit(&cfg);
        cfg.hcclExecTimeOut = CONFIG_EXEC_TIMEOUT;
        HcclRootInfo ri;
        RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &ri));
        H_HCCL(ctx, HcclCommInitRootInfoConfig(ctx->nranks, &ri, ctx->rank, &cfg, &comm));
        limit = CONFIG_EXEC_TIMEOUT;
    } else {
        RUN(h_world_comm(ctx, &comm));
    }
    bufs b;
    RUN(alloc_bufs(ctx, &b));
    h_set_case(ctx, "sleep: a rank never calls the AllReduce");
    /* one good round first, everyone */
    H_HCCL(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                              ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    if (ctx->rank != victim) {
        double t0 = h_now();
        HcclResult hr = HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                      comm, ctx->stream);
        aclError ar = hr == HCCL_SUCCESS ? aclrtSynchronizeStream(ctx->stream) : ACL_SUCCESS;
        double dt = h_now() - t0;
        H_EXPECT(ctx, hr == HCCL_SUCCESS, "HcclAllReduce refused (%d) while the peer is merely "
                 "late", (int)hr);
        h_expect_rc(ctx, __FILE__, __LINE__, "aclrtSynchronizeStream (peer never joins)", ar,
                    H_ANY_ERROR, 0);
        H_EXPECT(ctx, dt <= limit + 2.0, "the timeout took %.2f s (limit: %s %.0f + 2 s)", dt,
                 use_config ? "hcclExecTimeOut" : "HCCL_EXEC_TIMEOUT", limit);
        H_EXPECT(ctx, dt >= limit - 1.0, "the operation failed after %.2f s, well before the "
                 "%.0f s timeout", dt, limit);
        h_log(ctx, "timed out after %.3f s (sync returned %d)", dt, (int)ar);
        if (ar != ACL_SUCCESS) {
            HcclResult async = HCCL_SUCCESS;
            H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
            H_EXPECT(ctx, async != HCCL_SUCCESS, "HcclGetCommAsyncError reports success after a "
                     "timeout");
        }
    }
    h_set_case(ctx, "sleep: everyone destroys the comm");
    RUN(h_oob_barrier(ctx)); /* the last rank waits here until the others are done */
    double t0 = h_now();
    H_HCCL(ctx, HcclCommDestroy(comm));
    H_EXPECT(ctx, h_now() - t0 < limit + 2.0, "HcclCommDestroy took %.2f s", h_now() - t0);
    RUN(free_bufs(ctx, &b));
    RUN(h_rank_teardown(ctx));
    return 0;
}

static int case_sleep(h_ctx *ctx)
{
    return sleeper(ctx, 0);
}

static int case_sleep_config(h_ctx *ctx)
{
    return sleeper(ctx, 1);
}

static int case_connect(h_ctx *ctx)
{
    uint32_t victim = ctx->nranks - 1;
    RUN(h_rank_setup(ctx));
    h_set_case(ctx, "connect: a rank never joins the init");
    HcclRootInfo ri;
    RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &ri));
    if (ctx->rank != victim) {
        HcclComm comm = NULL;
        double t0 = h_now();
        HcclResult rc = HcclCommInitRootInfo(ctx->nranks, &ri, ctx->rank, &comm);
        double dt = h_now() - t0;
        h_expect_rc(ctx, __FILE__, __LINE__, "HcclCommInitRootInfo (a rank is missing)", rc,
                    H_ANY_ERROR, 1);
        H_EXPECT(ctx, dt <= connect_timeout + 2.0, "init failed after %.2f s (limit "
                 "HCCL_CONNECT_TIMEOUT %.0f + 2 s)", dt, connect_timeout);
        H_EXPECT(ctx, dt >= connect_timeout - 1.0, "init failed after %.2f s, well before "
                 "HCCL_CONNECT_TIMEOUT (%.0f s)", dt, connect_timeout);
        h_log(ctx, "init gave up after %.3f s with %d", dt, (int)rc);
        if (rc == HCCL_SUCCESS && comm) {
            HcclCommDestroy(comm);
        }
    }
    RUN(h_oob_barrier(ctx)); /* the last rank waits here */
    /* everyone (the late rank too) can still build a communicator from a fresh root info */
    h_set_case(ctx, "connect: a fresh communicator afterwards");
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    H_HCCL(ctx, HcclBarrier(comm, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(h_rank_teardown(ctx));
    return 0;
}


static int case_suspend(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    bufs b;
    RUN(alloc_bufs(ctx, &b));
    float got[COUNT], exp[COUNT];
    h_reduce_fill(HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, ctx->nranks, 0, COUNT, exp);

    h_set_case(ctx, "suspend: nothing in flight, then resume");
    H_HCCL(ctx, HcclCommSuspend(comm));
    H_EXPECT_REFUSED(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                      comm, ctx->stream),
                   HCCL_E_SUSPENDING, "suspended");
    RUN(h_oob_barrier(ctx)); /* every rank is suspended: as CANN asks, synchronise, then resume */
    H_HCCL(ctx, HcclCommResume(comm));
    H_HCCL(ctx, HcclCommResume(comm)); /* resuming a working communicator changes nothing */
    RUN(h_oob_barrier(ctx)); /* and nobody needs a rank that has not resumed yet */
    H_HCCL(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                              ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    H_ACL(ctx, aclrtMemcpy(got, sizeof got, b.out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, memcmp(got, exp, sizeof got) == 0, "AllReduce after suspend/resume is wrong");
    HcclResult async = HCCL_E_INTERNAL;
    H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
    H_EXPECT(ctx, async == HCCL_SUCCESS, "HcclGetCommAsyncError = %d after suspend/resume with "
             "nothing in flight", (int)async);

    h_set_case(ctx, "suspend: an AllReduce in flight on rank 0");
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        /* the others call it only after rank 0 has given up: it waits for them until then */
        H_HCCL(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm,
                                  ctx->stream));
        h_sleep(0.2); /* picked up by the stream's worker, waiting for the peers */
        H_HCCL(ctx, HcclCommSuspend(comm));
        double t0 = h_now();
        aclError ar = aclrtSynchronizeStream(ctx->stream);
        double dt = h_now() - t0;
        h_expect_rc(ctx, __FILE__, __LINE__, "aclrtSynchronizeStream (operation suspended)", ar,
                    H_ANY_ERROR, 0);
        H_EXPECT(ctx, dt < exec_timeout - 1.0, "the suspended operation took %.2f s to fail", dt);
        H_EXPECT_REFUSED(ctx, HcclCommResume(comm), HCCL_E_SUSPENDING, "HcclCommResume",
                       "has failed", "HcclCommSuspend", "destroy it");
        H_EXPECT_REFUSED(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                          comm, ctx->stream),
                       HCCL_E_SUSPENDING, "has failed");
        H_EXPECT_REFUSED(ctx, HcclCommResume(comm), HCCL_E_SUSPENDING, "has failed");
        H_HCCL(ctx, HcclGetCommAsyncError(comm, &async));
        H_EXPECT(ctx, async == HCCL_E_SUSPENDING, "HcclGetCommAsyncError = %d after the "
                 "suspended operation failed", (int)async);
    }
    RUN(h_oob_barrier(ctx)); /* the others go on once rank 0's operation has failed */
    if (ctx->rank != 0) {
        h_set_case(ctx, "suspend: the other ranks after rank 0 broke the communicator");
        H_EXPECT_REFUSED(ctx, HcclCommResume(comm), HCCL_E_REMOTE, "has failed (rank 0:",
                       "HcclCommSuspend");
        H_EXPECT_REFUSED(ctx, HcclAllReduce(b.in, b.out, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                          comm, ctx->stream),
                       HCCL_E_REMOTE, "has failed (rank 0:");
    }
    h_set_case(ctx, "suspend: teardown");
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(free_bufs(ctx, &b));
    H_ACL(ctx, aclrtDestroyStream(ctx->stream)); /* rank 0's stream stays failed: a new one */
    H_ACL(ctx, aclrtCreateStream(&ctx->stream));
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    setenv("HCCL_EXEC_TIMEOUT", "5", 0);
    setenv("HCCL_CONNECT_TIMEOUT", "3", 0);
    exec_timeout = env_seconds("HCCL_EXEC_TIMEOUT");
    connect_timeout = env_seconds("HCCL_CONNECT_TIMEOUT");
    h_parse_args(argc, argv, "[--case exit|kill|sleep|sleep-config|connect|suspend|all]");
    if (h_opt.mode != H_MODE_PROCS || h_opt.nranks < 2) {
        fprintf(stderr, "faults needs --mode procs and --ranks >= 2\n");
        return 2;
    }
    const char *which = h_arg("case") ? h_arg("case") : "all";
    int all = strcmp(which, "all") == 0;
    int failed = 0;
    h_launch_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.no_fail_fast = 1;
    cfg.deadline = 90.0;
    if (all || strcmp(which, "exit") == 0) {
        failed |= h_launch("faults-exit", case_exit, NULL, &cfg);
    }
    if (all || strcmp(which, "kill") == 0) {
        h_launch_cfg k = cfg;
        k.parent_hook = kill_hook;
        failed |= h_launch("faults-kill", case_kill, NULL, &k);
    }
    if (all || strcmp(which, "sleep") == 0) {
        failed |= h_launch("faults-sleep", case_sleep, NULL, &cfg);
    }
    if (all || strcmp(which, "sleep-config") == 0) {
        /* the children inherit the environment at fork: a long HCCL_EXEC_TIMEOUT for this one */
        char *keep = strdup(getenv("HCCL_EXEC_TIMEOUT"));
        setenv("HCCL_EXEC_TIMEOUT", CONFIG_CASE_ENV_TIMEOUT, 1);
        failed |= h_launch("faults-sleep-config", case_sleep_config, NULL, &cfg);
        setenv("HCCL_EXEC_TIMEOUT", keep, 1);
        free(keep);
    }
    if (all || strcmp(which, "connect") == 0) {
        failed |= h_launch("faults-connect", case_connect, NULL, &cfg);
    }
    if (all || strcmp(which, "suspend") == 0) {
        failed |= h_launch("faults-suspend", case_suspend, NULL, &cfg);
    }
    return h_finish("faults", failed);
}
