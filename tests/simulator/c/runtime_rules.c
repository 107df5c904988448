/*
 * ACL runtime rules that need threads or exact codes: a stream or event destroyed while other
 * threads synchronise it, the event flags aclrtStreamWaitEvent and aclrtResetEvent need, what
 * aclrtQueryEventStatus says of an event never recorded or reset, copy kinds against the
 * pointers, and the threads a device's last aclrtResetDevice leaves behind.
 *
 * usage: runtime_rules --ranks 1 --mode threads [--iterations N]
 *
 * Memory errors of the destroy races show as crashes or wrong codes only sometimes; run this
 * program against a simulator built with -fsanitize=address to see every one
 * (tests/simulator/test_sim_runtime.py does).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SYNCERS 4

/* ---- a stream held busy by a blocking host callback --------------------------------------- */

static atomic_int g_entered, g_release, g_stop_reporter;

static void hold(void *arg)
{
    (void)arg;
    atomic_store(&g_entered, 1);
    while (!atomic_load(&g_release)) {
        h_sleep(0.001);
    }
}

static void *reporter(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop_reporter)) {
        aclrtProcessReport(20);
    }
    return NULL;
}

typedef struct {
    aclrtStream stream;
    aclrtEvent event; /* synchronise this instead of the stream when set */
    int rc;
} sync_arg;

static void *synchroniser(void *p)
{
    sync_arg *a = (sync_arg *)p;
    a->rc = a->event != NULL ? aclrtSynchronizeEvent(a->event) : aclrtSynchronizeStream(a->stream);
    return NULL;
}

static void *destroyer(void *p)
{
    sync_arg *a = (sync_arg *)p;
    a->rc = a->event != NULL ? aclrtDestroyEvent(a->event) : aclrtDestroyStream(a->stream);
    return NULL;
}

/* One round: SYNCERS threads synchronise (the stream, or an event recorded behind the held
 * callback) while another thread destroys it; then the callback lets go.  Every synchroniser
 * must come back with success (it waited for work the destroy waited for too) or, if it only
 * got there after the destroy, ACL_ERROR_INVALID_PARAM; never a crash or a garbage code. */
static int destroy_while_synchronised(h_ctx *ctx, pthread_t report_thread, int with_event)
{
    aclrtStream s;
    H_ACL(ctx, aclrtCreateStream(&s));
    H_ACL(ctx, aclrtSubscribeReport((uint64_t)report_thread, s));
    atomic_store(&g_entered, 0);
    atomic_store(&g_release, 0);
    H_ACL(ctx, aclrtLaunchCallback(hold, NULL, ACL_CALLBACK_BLOCK, s));
    double until = h_now() + 30.0;
    while (!atomic_load(&g_entered) && h_now() < until) {
        h_sleep(0.0005);
    }
    H_REQUIRE(ctx, atomic_load(&g_entered), "the blocking callback never ran");
    aclrtEvent e = NULL;
    if (with_event) {
        H_ACL(ctx, aclrtCreateEventWithFlag(&e, ACL_EVENT_SYNC));
        H_ACL(ctx, aclrtRecordEvent(e, s));
    }
    sync_arg args[SYNCERS + 1];
    pthread_t threads[SYNCERS + 1];
    for (int i = 0; i <= SYNCERS; i++) {
        args[i] = (sync_arg){s, e, -1};
    }
    for (int i = 0; i < SYNCERS; i++) {
        H_REQUIRE(ctx, pthread_create(&threads[i], NULL, synchroniser, &args[i]) == 0, "pthread_create");
    }
    h_sleep(0.003); /* (lets the synchronisers go to sleep on the stream; any order is correct) */
    H_REQUIRE(ctx, pthread_create(&threads[SYNCERS], NULL, destroyer, &args[SYNCERS]) == 0, "pthread_create");
    h_sleep(0.003);
    atomic_store(&g_release, 1);
    for (int i = 0; i <= SYNCERS; i++) {
        pthread_join(threads[i], NULL);
    }
    const char *what = with_event ? "event" : "stream";
    H_EXPECT(ctx, args[SYNCERS].rc == ACL_SUCCESS, "destroying the %s returned %d", what, args[SYNCERS].rc);
    for (int i = 0; i < SYNCERS; i++) {
        H_EXPECT(ctx, args[i].rc == ACL_SUCCESS || args[i].rc == ACL_ERROR_INVALID_PARAM,
                 "synchronising the %s while another thread destroyed it returned %d", what, args[i].rc);
    }
    if (with_event) {
        H_ACL(ctx, aclrtSynchronizeStream(s));
        H_ACL(ctx, aclrtDestroyStream(s));
    }
    return 0;
}

static int destroy_races(h_ctx *ctx)
{
    long iterations = h_arg_long("--iterations", 10);
    pthread_t report_thread;
    atomic_store(&g_stop_reporter, 0);
    H_REQUIRE(ctx, pthread_create(&report_thread, NULL, reporter, NULL) == 0, "pthread_create");
    int rc = 0;
    if (h_case(ctx, "aclrtDestroyStream while threads synchronise the stream")) {
        for (long i = 0; i < iterations && rc == 0; i++) {
            rc = destroy_while_synchronised(ctx, report_thread, 0);
        }
    }
    if (rc == 0 && h_case(ctx, "aclrtDestroyEvent while threads synchronise the event")) {
        for (long i = 0; i < iterations && rc == 0; i++) {
            rc = destroy_while_synchronised(ctx, report_thread, 1);
        }
    }
    atomic_store(&g_stop_reporter, 1);
    pthread_join(report_thread, NULL);
    return rc;
}

/* ---- event flags -------------------------------------------------------------------------- */

/* The call must fail with ACL_ERROR_INVALID_PARAM and a message holding `needle` (read here
 * once: aclGetRecentErrMsg clears the message it returns). */
static void refused(h_ctx *ctx, int line, const char *call, int rc, const char *needle)
{
    const char *m = aclGetRecentErrMsg();
    ctx->checks++;
    if (rc != ACL_ERROR_INVALID_PARAM || m == NULL || strstr(m, needle) == NULL) {
        h_failf(ctx, __FILE__, line, "`%s` returned %d, expected %d with \"%s\" in aclGetRecentErrMsg: \"%s\"",
                call, rc, ACL_ERROR_INVALID_PARAM, needle, m != NULL ? m : "(NULL)");
    }
}
#define REFUSED(ctx, call, needle) refused((ctx), __LINE__, #call, (call), (needle))

static int event_flags(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtStreamWaitEvent and aclrtResetEvent need ACL_EVENT_SYNC")) {
        return 0;
    }
    aclrtStream s = ctx->stream;
    aclrtEvent plain, timeline, none, sync, both;
    H_ACL(ctx, aclrtCreateEvent(&plain));
    H_ACL(ctx, aclrtCreateEventWithFlag(&timeline, ACL_EVENT_TIME_LINE));
    H_ACL(ctx, aclrtCreateEventWithFlag(&none, 0));
    H_ACL(ctx, aclrtCreateEventWithFlag(&sync, ACL_EVENT_SYNC));
    H_ACL(ctx, aclrtCreateEventWithFlag(&both, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE));
    aclrtEvent all[] = {plain, timeline, none, sync, both};
    for (int i = 0; i < 5; i++) {
        H_ACL(ctx, aclrtRecordEvent(all[i], s));
    }
    REFUSED(ctx, aclrtStreamWaitEvent(s, timeline), "without ACL_EVENT_SYNC");
    REFUSED(ctx, aclrtStreamWaitEvent(s, none), "without ACL_EVENT_SYNC");
    H_EXPECT_ACL(ctx, aclrtStreamWaitEvent(s, plain), ACL_SUCCESS); /* aclrtCreateEvent: SYNC */
    H_EXPECT_ACL(ctx, aclrtStreamWaitEvent(s, sync), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtStreamWaitEvent(s, both), ACL_SUCCESS);
    REFUSED(ctx, aclrtResetEvent(plain, s), "created with aclrtCreateEvent cannot be reset");
    REFUSED(ctx, aclrtResetEvent(timeline, s), "without ACL_EVENT_SYNC");
    REFUSED(ctx, aclrtResetEvent(none, s), "without ACL_EVENT_SYNC");
    H_EXPECT_ACL(ctx, aclrtResetEvent(sync, s), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtResetEvent(both, s), ACL_SUCCESS);
    H_ACL(ctx, aclrtSynchronizeStream(s));
    for (int i = 0; i < 5; i++) {
        H_ACL(ctx, aclrtDestroyEvent(all[i]));
    }
    return 0;
}

/* ---- event status ------------------------------------------------------------------------- */

static int query_status(h_ctx *ctx, aclrtEvent e, int *recorded, int *old)
{
    aclrtEventRecordedStatus st = (aclrtEventRecordedStatus)7;
    aclrtEventStatus st0 = (aclrtEventStatus)7;
    H_ACL(ctx, aclrtQueryEventStatus(e, &st));
    H_ACL(ctx, aclrtQueryEvent(e, &st0));
    *recorded = (int)st;
    *old = (int)st0;
    return 0;
}

static int event_status(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtQueryEventStatus: never recorded and reset events are not complete")) {
        return 0;
    }
    aclrtStream s = ctx->stream;
    aclrtEvent plain, sync;
    H_ACL(ctx, aclrtCreateEvent(&plain));
    H_ACL(ctx, aclrtCreateEventWithFlag(&sync, ACL_EVENT_SYNC));
    int st, st0;
    RUN(query_status(ctx, plain, &st, &st0));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_NOT_READY && st0 == ACL_EVENT_STATUS_NOT_READY,
             "never recorded: aclrtQueryEventStatus %d, aclrtQueryEvent %d (NOT_READY is 0, 1)", st, st0);
    H_ACL(ctx, aclrtSynchronizeEvent(plain)); /* nothing to wait for */
    H_ACL(ctx, aclrtRecordEvent(sync, s));
    H_ACL(ctx, aclrtSynchronizeEvent(sync));
    RUN(query_status(ctx, sync, &st, &st0));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE && st0 == ACL_EVENT_STATUS_COMPLETE,
             "recorded and synchronised: %d, %d (COMPLETE is 1, 0)", st, st0);
    H_ACL(ctx, aclrtResetEvent(sync, s));
    H_ACL(ctx, aclrtSynchronizeStream(s));
    RUN(query_status(ctx, sync, &st, &st0));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_NOT_READY && st0 == ACL_EVENT_STATUS_NOT_READY,
             "reset: %d, %d (NOT_READY is 0, 1)", st, st0);
    H_ACL(ctx, aclrtRecordEvent(sync, s));
    H_ACL(ctx, aclrtSynchronizeEvent(sync));
    RUN(query_status(ctx, sync, &st, &st0));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "recorded again after the reset: %d", st);
    H_ACL(ctx, aclrtDestroyEvent(plain));
    H_ACL(ctx, aclrtDestroyEvent(sync));
    return 0;
}

/* ---- copy kinds --------------------------------------------------------------------------- */

static int copy_kinds(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtMemcpy: each side must be what the kind says")) {
        return 0;
    }
    const size_t n = 4096;
    void *d1, *d2;
    H_ACL(ctx, aclrtMalloc(&d1, n, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&d2, n, ACL_MEM_MALLOC_HUGE_FIRST));
    char *h1 = (char *)h_xcalloc(1, n), *h2 = (char *)h_xcalloc(1, n);
    /* right kinds */
    H_EXPECT_ACL(ctx, aclrtMemcpy(d1, n, h1, n, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtMemcpy(h1, n, d1, n, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtMemcpy(d2, n, d1, n, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtMemcpy(h2, n, h1, n, ACL_MEMCPY_HOST_TO_HOST), ACL_SUCCESS);
    aclrtMemcpyKind any = ACL_MEMCPY_DEFAULT;
    H_EXPECT_ACL(ctx, aclrtMemcpy(d2, n, d1, n, any), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtMemcpy(h2, n, d1, n, any), ACL_SUCCESS);
    H_EXPECT_ACL(ctx, aclrtMemcpy(d1, n, h2, n, any), ACL_SUCCESS);
    /* a device side the kind calls host, and a host side it calls device: refused alike */
    REFUSED(ctx, aclrtMemcpy(d2, n, d1, n, ACL_MEMCPY_HOST_TO_DEVICE), "but ACL_MEMCPY_HOST_TO_DEVICE says host");
    REFUSED(ctx, aclrtMemcpy(d2, n, d1, n, ACL_MEMCPY_DEVICE_TO_HOST), "but ACL_MEMCPY_DEVICE_TO_HOST says host");
    H_EXPECT_ACL(ctx, aclrtMemcpy(h2, n, h1, n, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    H_EXPECT_ACL(ctx, aclrtMemcpy(d2, n, h1, n, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    H_EXPECT_ACL(ctx, aclrtMemcpy(h2, n, d1, n, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM);
    H_EXPECT_ACL(ctx, aclrtMemcpy(h2, n, d1, n, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_INVALID_PARAM);
    H_EXPECT_ACL(ctx, aclrtMemcpyAsync(d2, n, d1, n, ACL_MEMCPY_HOST_TO_DEVICE, ctx->stream),
                 ACL_ERROR_INVALID_PARAM);
    H_EXPECT_ACL(ctx, aclrtMemcpyAsync(d2, n, d1, n, ACL_MEMCPY_DEVICE_TO_HOST, ctx->stream),
                 ACL_ERROR_INVALID_PARAM);
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    free(h1);
    free(h2);
    H_ACL(ctx, aclrtFree(d1));
    H_ACL(ctx, aclrtFree(d2));
    return 0;
}

/* ---- threads left behind ------------------------------------------------------------------ */

static int thread_count(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) {
        return -1;
    }
    int n = 0;
    for (struct dirent *d = readdir(dir); d != NULL; d = readdir(dir)) {
        n += d->d_name[0] != '.';
    }
    closedir(dir);
    return n;
}

typedef struct {
    int32_t device;
    int rc;
} default_use;

/* Uses the default stream of a device nobody else uses, then resets it: the last reset. */
static void *use_default_stream(void *p)
{
    default_use *u = (default_use *)p;
    void *d = NULL;
    u->rc = aclrtSetDevice(u->device);
    if (u->rc == 0)
        u->rc = aclrtMalloc(&d, 4096, ACL_MEM_MALLOC_HUGE_FIRST);
    if (u->rc == 0)
        u->rc = aclrtMemsetAsync(d, 4096, 1, 4096, NULL) | aclrtSynchronizeStream(NULL) | aclrtFree(d);
    u->rc |= aclrtResetDevice(u->device);
    return NULL;
}

static int default_stream_worker(h_ctx *ctx)
{
    if (!h_case(ctx, "the last aclrtResetDevice stops the default stream's worker")) {
        return 0;
    }
    uint32_t count = 0;
    H_ACL(ctx, aclrtGetDeviceCount(&count));
    default_use use = {(int32_t)count - 1, -1};
    H_REQUIRE(ctx, use.device != ctx->device, "needs a device of its own (2 or more devices)");
    int before = thread_count();
    H_REQUIRE(ctx, before > 0, "cannot read /proc/self/task");
    for (int round = 0; round < 2; round++) { /* the second round restarts the worker */
        pthread_t t;
        H_REQUIRE(ctx, pthread_create(&t, NULL, use_default_stream, &use) == 0, "pthread_create");
        pthread_join(t, NULL);
        H_EXPECT(ctx, use.rc == 0, "using device %d's default stream: %d", use.device, use.rc);
        /* A joined thread's /proc entry can outlast pthread_join by a moment: look again for a while. */
        int after = thread_count();
        for (double until = h_now() + 10.0; after > before && h_now() < until; after = thread_count()) {
            h_sleep(0.01);
        }
        H_EXPECT(ctx, after == before, "round %d: %d threads before, %d after the device's last reset", round,
                 before, after);
    }
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    RUN(destroy_races(ctx));
    RUN(event_flags(ctx));
    RUN(event_status(ctx));
    RUN(copy_kinds(ctx));
    RUN(default_stream_worker(ctx));
    h_set_case(ctx, "teardown");
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, " [--iterations N]");
    if (h_opt.nranks != 1 || h_opt.mode != H_MODE_THREADS) {
        fprintf(stderr, "runtime_rules runs as --ranks 1 --mode threads\n");
        return 2;
    }
    int failed = h_launch("runtime_rules", run_rank, NULL, NULL);
    return h_finish("runtime_rules", failed);
}
