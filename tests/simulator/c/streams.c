/*
 * ACL runtime: devices, contexts, streams, events, async copies, callbacks, memory info.
 *
 * usage: streams --ranks N --mode threads|procs|mixed
 *
 * Every rank runs the single-device cases on its own device at the same time as the others;
 * with N >= 2 a collective is also ordered across two streams with an event.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MiB ((size_t)1 << 20)

/* 8 by default, HCCLPY_SIM_DEVICES when set; ASCEND_RT_VISIBLE_DEVICES lists the visible ones. */
static uint32_t expected_devices(void)
{
    const char *visible = getenv("ASCEND_RT_VISIBLE_DEVICES");
    if (visible && *visible) {
        uint32_t n = 1;
        for (const char *c = visible; *c; c++) {
            n += *c == ',';
        }
        return n;
    }
    const char *v = getenv("HCCLPY_SIM_DEVICES");
    return v && *v ? (uint32_t)strtoul(v, NULL, 10) : 8U;
}

/* ---- devices ------------------------------------------------------------------------------ */

static int device_count(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtGetDeviceCount")) {
        return 0;
    }
    uint32_t n = 0;
    H_ACL(ctx, aclrtGetDeviceCount(&n));
    const char *sd = getenv("HCCLPY_SIM_DEVICES"), *vd = getenv("ASCEND_RT_VISIBLE_DEVICES");
    H_EXPECT(ctx, n == expected_devices(), "aclrtGetDeviceCount = %u, expected %u "
             "(HCCLPY_SIM_DEVICES=%s, ASCEND_RT_VISIBLE_DEVICES=%s)", n, expected_devices(),
             sd ? sd : "unset", vd ? vd : "unset");
    int32_t d = -1;
    H_ACL(ctx, aclrtGetDevice(&d));
    H_EXPECT(ctx, d == ctx->device, "aclrtGetDevice = %d, expected %d", d, ctx->device);
    return 0;
}

typedef struct {
    h_ctx *ctx;
    int32_t device;
    pthread_barrier_t *bar;
    int32_t seen;
    int rc_set, rc_get, rc_reset;
} dev_thread;

static void *device_thread(void *p)
{
    dev_thread *t = (dev_thread *)p;
    t->rc_set = aclrtSetDevice(t->device);
    pthread_barrier_wait(t->bar); /* both threads have set their device */
    t->rc_get = aclrtGetDevice(&t->seen);
    pthread_barrier_wait(t->bar);
    t->rc_reset = aclrtResetDevice(t->device);
    return NULL;
}

static int per_thread_device(h_ctx *ctx)
{
    if (!h_case(ctx, "current device is per thread")) {
        return 0;
    }
    uint32_t count = 0;
    H_ACL(ctx, aclrtGetDeviceCount(&count));
    H_REQUIRE(ctx, count >= 1, "no devices");
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    dev_thread t[2];
    memset(t, 0, sizeof t);
    t[0].device = (int32_t)(ctx->rank % count);
    t[1].device = (int32_t)((ctx->rank + count - 1) % count);
    if (count >= 2 && t[1].device == t[0].device) {
        t[1].device = (t[0].device + 1) % (int32_t)count;
    }
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) {
        t[i].ctx = ctx;
        t[i].bar = &bar;
        pthread_create(&tid[i], NULL, device_thread, &t[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(tid[i], NULL);
        H_EXPECT(ctx, t[i].rc_set == 0 && t[i].rc_get == 0 && t[i].rc_reset == 0,
                 "thread %d: set/get/reset returned %d/%d/%d", i, t[i].rc_set, t[i].rc_get,
                 t[i].rc_reset);
        H_EXPECT(ctx, t[i].seen == t[i].device, "thread %d set device %d but sees %d", i,
                 t[i].device, t[i].seen);
    }
    pthread_barrier_destroy(&bar);
    int32_t d = -1;
    H_ACL(ctx, aclrtGetDevice(&d));
    H_EXPECT(ctx, d == ctx->device, "after other threads switched devices this thread sees %d, "
             "expected %d", d, ctx->device);
    return 0;
}

static int contexts(h_ctx *ctx)
{
    if (!h_case(ctx, "contexts")) {
        return 0;
    }
    uint32_t count = 0;
    H_ACL(ctx, aclrtGetDeviceCount(&count));
    int32_t other = (ctx->device + 1) % (int32_t)count;
    aclrtContext def = NULL, c1 = NULL, c2 = NULL, cur = NULL;
    int32_t d = -1;
    H_ACL(ctx, aclrtGetCurrentContext(&def));
    H_EXPECT(ctx, def != NULL, "no current context after aclrtSetDevice");
    H_ACL(ctx, aclrtCreateContext(&c1, ctx->device));
    H_ACL(ctx, aclrtGetCurrentContext(&cur));
    H_EXPECT(ctx, cur == c1, "aclrtCreateContext did not make the new context current");
    H_ACL(ctx, aclrtCreateContext(&c2, other));
    H_ACL(ctx, aclrtGetCurrentContext(&cur));
    H_EXPECT(ctx, cur == c2, "second aclrtCreateContext did not make its context current");
    H_ACL(ctx, aclrtGetDevice(&d));
    H_EXPECT(ctx, d == other, "in a context of device %d, aclrtGetDevice says %d", other, d);
    H_ACL(ctx, aclrtSetCurrentContext(c1));
    H_ACL(ctx, aclrtGetCurrentContext(&cur));
    H_EXPECT(ctx, cur == c1, "aclrtSetCurrentContext(c1) then aclrtGetCurrentContext != c1");
    H_ACL(ctx, aclrtGetDevice(&d));
    H_EXPECT(ctx, d == ctx->device, "in a context of device %d, aclrtGetDevice says %d",
             ctx->device, d);
    /* a stream and a copy inside the explicit context */
    aclrtStream s;
    H_ACL(ctx, aclrtCreateStream(&s));
    void *dev = NULL;
    uint8_t host[4096], back[4096];
    for (size_t i = 0; i < sizeof host; i++) {
        host[i] = (uint8_t)(i * 13);
    }
    H_ACL(ctx, aclrtMalloc(&dev, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMemcpyAsync(dev, sizeof host, host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE, s));
    H_ACL(ctx, aclrtSynchronizeStream(s));
    H_ACL(ctx, aclrtMemcpy(back, sizeof back, dev, sizeof host, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, memcmp(host, back, sizeof host) == 0, "copy through a context's stream differs");
    H_ACL(ctx, aclrtFree(dev));
    H_ACL(ctx, aclrtDestroyStream(s));
    H_ACL(ctx, aclrtSetCurrentContext(def));
    H_ACL(ctx, aclrtGetDevice(&d));
    H_EXPECT(ctx, d == ctx->device, "back in the default context aclrtGetDevice says %d", d);
    H_ACL(ctx, aclrtDestroyContext(c2));
    H_ACL(ctx, aclrtDestroyContext(c1));
    H_ACL(ctx, aclrtGetCurrentContext(&cur));
    H_EXPECT(ctx, cur == def, "current context changed by destroying other contexts");
    return 0;
}

static int mem_info(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtGetMemInfo")) {
        return 0;
    }
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0, free2 = 0, total2 = 0;
    H_ACL(ctx, aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total0));
    H_EXPECT(ctx, total0 > 0 && free0 <= total0, "free %zu total %zu", free0, total0);
    const size_t sz = 64 * MiB;
    void *p = NULL;
    H_ACL(ctx, aclrtMalloc(&p, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total1));
    H_EXPECT(ctx, total1 == total0, "total changed from %zu to %zu", total0, total1);
    H_EXPECT(ctx, free1 + sz <= free0, "free went from %zu to %zu after a %zu-byte aclrtMalloc",
             free0, free1, sz);
    H_ACL(ctx, aclrtFree(p));
    H_ACL(ctx, aclrtGetMemInfo(ACL_HBM_MEM, &free2, &total2));
    H_EXPECT(ctx, free2 == free0, "free is %zu after aclrtFree, %zu before the aclrtMalloc", free2,
             free0);
    return 0;
}

/* ---- copies and ordering ------------------------------------------------------------------ */

static int memcpy_chain(h_ctx *ctx)
{
    if (!h_case(ctx, "async H2D -> D2D -> memset -> D2H on one stream")) {
        return 0;
    }
    const size_t sz = 4 * MiB + 12345;
    const size_t moff = 100001, mlen = 777777;
    uint8_t *h1 = NULL, *h2 = NULL;
    void *d1 = NULL, *d2 = NULL;
    H_ACL(ctx, aclrtMallocHost((void **)&h1, sz));
    H_ACL(ctx, aclrtMallocHost((void **)&h2, sz));
    H_ACL(ctx, aclrtMalloc(&d1, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&d2, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    for (size_t i = 0; i < sz; i++) {
        h1[i] = (uint8_t)(i * 7 + ctx->rank);
    }
    memset(h2, 0xCD, sz);
    aclrtStream s = ctx->stream;
    for (int rep = 0; rep < 3; rep++) {
        H_ACL(ctx, aclrtMemcpyAsync(d1, sz, h1, sz, ACL_MEMCPY_HOST_TO_DEVICE, s));
        H_ACL(ctx, aclrtMemcpyAsync(d2, sz, d1, sz, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
        H_ACL(ctx, aclrtMemsetAsync((uint8_t *)d2 + moff, sz - moff, 0x7E, mlen, s));
        H_ACL(ctx, aclrtMemcpyAsync(h2, sz, d2, sz, ACL_MEMCPY_DEVICE_TO_HOST, s));
        H_ACL(ctx, aclrtSynchronizeStream(s));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < sz; i++) {
            uint8_t want = (i >= moff && i < moff + mlen) ? 0x7E : h1[i];
            if (h2[i] != want && bad++ == 0) {
                first = i;
            }
        }
        H_EXPECT(ctx, bad == 0, "round %d: %zu bytes wrong, first at %zu: 0x%02x", rep, bad, first,
                 bad ? h2[first] : 0);
        memset(h2, 0xCD, sz);
        for (size_t i = 0; i < sz; i += 4096) {
            h1[i] ^= 0x5A; /* change the source between rounds */
        }
    }
    H_ACL(ctx, aclrtFree(d1));
    H_ACL(ctx, aclrtFree(d2));
    H_ACL(ctx, aclrtFreeHost(h1));
    H_ACL(ctx, aclrtFreeHost(h2));
    return 0;
}

/* Stream B waits for an event recorded after a long chain of work on stream A. */
static int wait_event_copies(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtStreamWaitEvent orders stream B after work on stream A")) {
        return 0;
    }
    const size_t sz = 16 * MiB;
    aclrtStream a, b;
    aclrtEvent e;
    H_ACL(ctx, aclrtCreateStream(&a));
    H_ACL(ctx, aclrtCreateStreamWithConfig(&b, 0, ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC));
    H_ACL(ctx, aclrtCreateEventWithFlag(&e, ACL_EVENT_SYNC));
    void *src, *tmp, *dst;
    uint8_t *host;
    H_ACL(ctx, aclrtMalloc(&src, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&tmp, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&dst, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMallocHost((void **)&host, sz));
    for (int round = 0; round < 3; round++) {
        uint8_t v = (uint8_t)(0x31 + round);
        H_ACL(ctx, aclrtMemset(src, sz, 0x11, sz));
        H_ACL(ctx, aclrtMemset(dst, sz, 0x22, sz));
        memset(host, 0, sz);
        for (int k = 0; k < 6; k++) {
            H_ACL(ctx, aclrtMemcpyAsync(tmp, sz, src, sz, ACL_MEMCPY_DEVICE_TO_DEVICE, a));
            H_ACL(ctx, aclrtMemcpyAsync(src, sz, tmp, sz, ACL_MEMCPY_DEVICE_TO_DEVICE, a));
        }
        H_ACL(ctx, aclrtMemsetAsync(dst, sz, v, sz, a));
        H_ACL(ctx, aclrtRecordEvent(e, a));
        H_ACL(ctx, aclrtStreamWaitEvent(b, e));
        H_ACL(ctx, aclrtMemcpyAsync(host, sz, dst, sz, ACL_MEMCPY_DEVICE_TO_HOST, b));
        H_ACL(ctx, aclrtSynchronizeStream(b)); /* stream A is never synchronised directly */
        size_t bad = 0;
        for (size_t i = 0; i < sz; i++) {
            bad += host[i] != v;
        }
        H_EXPECT(ctx, bad == 0, "round %d: stream B read %zu bytes before stream A wrote them "
                 "(first byte 0x%02x, expected 0x%02x)", round, bad, host[0], v);
    }
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    H_ACL(ctx, aclrtQueryEventStatus(e, &st));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "event waited for is not complete");
    H_ACL(ctx, aclrtSynchronizeStream(a));
    H_ACL(ctx, aclrtDestroyEvent(e));
    H_ACL(ctx, aclrtDestroyStream(a));
    H_ACL(ctx, aclrtDestroyStream(b));
    H_ACL(ctx, aclrtFree(src));
    H_ACL(ctx, aclrtFree(tmp));
    H_ACL(ctx, aclrtFree(dst));
    H_ACL(ctx, aclrtFreeHost(host));
    return 0;
}

/* Same, with an AllReduce on stream A (needs the other ranks). */
static int wait_event_collective(h_ctx *ctx, HcclComm comm)
{
    if (!h_case(ctx, "aclrtStreamWaitEvent after an AllReduce")) {
        return 0;
    }
    const uint64_t count = 1 << 18;
    const size_t bytes = count * 4;
    aclrtStream a, b;
    aclrtEvent e;
    H_ACL(ctx, aclrtCreateStream(&a));
    H_ACL(ctx, aclrtCreateStream(&b));
    H_ACL(ctx, aclrtCreateEventWithFlag(&e, ACL_EVENT_SYNC));
    void *in, *out, *copy;
    H_ACL(ctx, aclrtMalloc(&in, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&out, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&copy, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    uint8_t *host = (uint8_t *)h_xmalloc(bytes), *exp = (uint8_t *)h_xmalloc(bytes);
    for (int round = 0; round < 3; round++) {
        h_fill(HCCL_DATA_TYPE_FP32, H_GEN_SUM, ctx->rank, (uint64_t)round * count, count, host);
        h_reduce_fill(HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, ctx->nranks,
                      (uint64_t)round * count, count, exp);
        H_ACL(ctx, aclrtMemcpy(in, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        H_ACL(ctx, aclrtMemset(copy, bytes, 0, bytes));
        H_HCCL(ctx, HcclAllReduce(in, out, count, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, a));
        H_ACL(ctx, aclrtRecordEvent(e, a));
        H_ACL(ctx, aclrtStreamWaitEvent(b, e));
        H_ACL(ctx, aclrtMemcpyAsync(copy, bytes, out, bytes, ACL_MEMCPY_DEVICE_TO_DEVICE, b));
        H_ACL(ctx, aclrtSynchronizeStream(b));
        H_ACL(ctx, aclrtMemcpy(host, bytes, copy, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
        H_EXPECT(ctx, memcmp(host, exp, bytes) == 0, "round %d: stream B copied the AllReduce "
                 "output before it was complete", round);
    }
    H_ACL(ctx, aclrtSynchronizeStream(a));
    H_ACL(ctx, aclrtDestroyEvent(e));
    H_ACL(ctx, aclrtDestroyStream(a));
    H_ACL(ctx, aclrtDestroyStream(b));
    H_ACL(ctx, aclrtFree(in));
    H_ACL(ctx, aclrtFree(out));
    H_ACL(ctx, aclrtFree(copy));
    free(host);
    free(exp);
    return 0;
}

static int events(h_ctx *ctx)
{
    if (!h_case(ctx, "events: record, query, synchronize, elapsed time")) {
        return 0;
    }
    const size_t sz = 8 * MiB;
    aclrtEvent e1, e2, e3;
    H_ACL(ctx, aclrtCreateEventWithFlag(&e1, ACL_EVENT_TIME_LINE));
    H_ACL(ctx, aclrtCreateEventWithFlag(&e2, ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC));
    H_ACL(ctx, aclrtCreateEvent(&e3));
    void *p, *q;
    H_ACL(ctx, aclrtMalloc(&p, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&q, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtStream s = ctx->stream;
    H_ACL(ctx, aclrtRecordEvent(e1, s));
    for (int k = 0; k < 8; k++) {
        H_ACL(ctx, aclrtMemcpyAsync(q, sz, p, sz, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
    }
    H_ACL(ctx, aclrtRecordEvent(e2, s));
    H_ACL(ctx, aclrtRecordEvent(e3, s));
    H_ACL(ctx, aclrtSynchronizeEvent(e2));
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    H_ACL(ctx, aclrtQueryEventStatus(e2, &st));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE,
             "aclrtQueryEventStatus after aclrtSynchronizeEvent: %d", (int)st);
    H_ACL(ctx, aclrtQueryEventStatus(e1, &st));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "earlier event not complete: %d",
             (int)st);
    float ms = -1.0f;
    H_ACL(ctx, aclrtEventElapsedTime(&ms, e1, e2));
    H_EXPECT(ctx, ms >= 0.0f && ms < 60000.0f, "aclrtEventElapsedTime = %f ms", (double)ms);
    H_ACL(ctx, aclrtSynchronizeEvent(e3));
    H_ACL(ctx, aclrtQueryEventStatus(e3, &st));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "default event not complete: %d",
             (int)st);
    /* re-record on an idle stream: completes at once */
    H_ACL(ctx, aclrtRecordEvent(e1, s));
    H_ACL(ctx, aclrtSynchronizeEvent(e1));
    H_ACL(ctx, aclrtQueryEventStatus(e1, &st));
    H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "re-recorded event not complete");
    H_ACL(ctx, aclrtEventElapsedTime(&ms, e2, e1));
    H_EXPECT(ctx, ms >= 0.0f, "elapsed time between later events %f ms", (double)ms);
    H_ACL(ctx, aclrtDestroyEvent(e1));
    H_ACL(ctx, aclrtDestroyEvent(e2));
    H_ACL(ctx, aclrtDestroyEvent(e3));
    H_ACL(ctx, aclrtFree(p));
    H_ACL(ctx, aclrtFree(q));
    return 0;
}

static int sync_device_and_destroy(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtSynchronizeDevice and destroying a busy stream")) {
        return 0;
    }
    const size_t sz = 8 * MiB;
    aclrtStream s1, s2;
    H_ACL(ctx, aclrtCreateStream(&s1));
    H_ACL(ctx, aclrtCreateStream(&s2));
    void *p1, *p2;
    uint8_t *h;
    H_ACL(ctx, aclrtMalloc(&p1, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&p2, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMallocHost((void **)&h, sz));
    H_ACL(ctx, aclrtMemsetAsync(p1, sz, 0x61, sz, s1));
    H_ACL(ctx, aclrtMemsetAsync(p2, sz, 0x62, sz, s2));
    H_ACL(ctx, aclrtSynchronizeDevice());
    H_ACL(ctx, aclrtMemcpy(h, sz, p1, sz, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, h[0] == 0x61 && h[sz - 1] == 0x61, "stream 1 work not done after "
             "aclrtSynchronizeDevice");
    H_ACL(ctx, aclrtMemcpy(h, sz, p2, sz, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, h[0] == 0x62 && h[sz - 1] == 0x62, "stream 2 work not done after "
             "aclrtSynchronizeDevice");
    /* destroying a stream lets its queued work finish */
    memset(h, 0, sz);
    H_ACL(ctx, aclrtMemsetAsync(p1, sz, 0x63, sz, s1));
    H_ACL(ctx, aclrtMemcpyAsync(h, sz, p1, sz, ACL_MEMCPY_DEVICE_TO_HOST, s1));
    H_ACL(ctx, aclrtDestroyStream(s1));
    H_EXPECT(ctx, h[0] == 0x63 && h[sz - 1] == 0x63, "work queued before aclrtDestroyStream "
             "did not complete (0x%02x)", h[sz - 1]);
    H_ACL(ctx, aclrtDestroyStream(s2));
    H_ACL(ctx, aclrtFree(p1));
    H_ACL(ctx, aclrtFree(p2));
    H_ACL(ctx, aclrtFreeHost(h));
    return 0;
}

/* ---- callbacks ---------------------------------------------------------------------------- */

typedef struct {
    int32_t device;
    int stop;
    int started;
} reporter;

static void *report_loop(void *p)
{
    reporter *r = (reporter *)p;
    aclrtSetDevice(r->device);
    __atomic_store_n(&r->started, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        (void)aclrtProcessReport(20); /* a timeout with nothing to run is expected */
    }
    aclrtResetDevice(r->device);
    return NULL;
}

typedef struct {
    int ran;
    pthread_t ran_on;
    const volatile uint8_t *host;
    uint8_t seen;
    double sleep;
} cbdata;

static void callback(void *p)
{
    cbdata *d = (cbdata *)p;
    if (d->sleep > 0) {
        h_sleep(d->sleep);
    }
    d->seen = d->host ? d->host[0] : 0;
    d->ran_on = pthread_self();
    __atomic_store_n(&d->ran, 1, __ATOMIC_RELEASE);
}

static int callbacks(h_ctx *ctx)
{
    if (!h_case(ctx, "aclrtLaunchCallback + aclrtSubscribeReport + aclrtProcessReport")) {
        return 0;
    }
    aclrtStream s;
    H_ACL(ctx, aclrtCreateStream(&s));
    reporter r = {ctx->device, 0, 0};
    pthread_t tid;
    H_REQUIRE(ctx, pthread_create(&tid, NULL, report_loop, &r) == 0, "pthread_create");
    H_ACL(ctx, aclrtSubscribeReport((uint64_t)tid, s));
    const size_t sz = 4096;
    uint8_t *h;
    void *d;
    H_ACL(ctx, aclrtMallocHost((void **)&h, sz));
    H_ACL(ctx, aclrtMalloc(&d, sz, ACL_MEM_MALLOC_HUGE_FIRST));
    memset(h, 0, sz);
    H_ACL(ctx, aclrtMemset(d, sz, 0x42, sz));

    /* blocking callback: it runs after the copy before it, on the report thread */
    cbdata c1 = {0, 0, h, 0, 0.0};
    H_ACL(ctx, aclrtMemcpyAsync(h, sz, d, sz, ACL_MEMCPY_DEVICE_TO_HOST, s));
    H_ACL(ctx, aclrtLaunchCallback(callback, &c1, ACL_CALLBACK_BLOCK, s));
    H_ACL(ctx, aclrtSynchronizeStream(s));
    H_EXPECT(ctx, __atomic_load_n(&c1.ran, __ATOMIC_ACQUIRE) == 1,
             "blocking callback had not run when aclrtSynchronizeStream returned");
    H_EXPECT(ctx, c1.seen == 0x42, "callback saw 0x%02x: it ran before the copy queued before it",
             c1.seen);
    H_EXPECT(ctx, c1.ran == 0 || pthread_equal(c1.ran_on, tid),
             "callback did not run on the subscribed report thread");

    /* non-blocking callback: runs eventually */
    cbdata c2 = {0, 0, NULL, 0, 0.0};
    H_ACL(ctx, aclrtLaunchCallback(callback, &c2, ACL_CALLBACK_NO_BLOCK, s));
    H_ACL(ctx, aclrtSynchronizeStream(s));
    double until = h_now() + 10.0;
    while (!__atomic_load_n(&c2.ran, __ATOMIC_ACQUIRE) && h_now() < until) {
        h_sleep(0.001);
    }
    H_EXPECT(ctx, c2.ran == 1, "non-blocking callback never ran");

    /* a slow blocking callback makes a short synchronisation time out */
    if (h_case(ctx, "aclrtSynchronizeStreamWithTimeout")) {
        H_ACL(ctx, aclrtSynchronizeStreamWithTimeout(s, 1000));
        H_ACL(ctx, aclrtSynchronizeStreamWithTimeout(s, 0));
        H_ACL(ctx, aclrtSynchronizeStreamWithTimeout(s, -1));
        cbdata c3 = {0, 0, NULL, 0, 0.5};
        aclrtEvent ev;
        H_ACL(ctx, aclrtCreateEventWithFlag(&ev, ACL_EVENT_SYNC));
        H_ACL(ctx, aclrtLaunchCallback(callback, &c3, ACL_CALLBACK_BLOCK, s));
        H_ACL(ctx, aclrtRecordEvent(ev, s));
        aclrtEventRecordedStatus est = ACL_EVENT_RECORDED_STATUS_COMPLETE;
        H_ACL(ctx, aclrtQueryEventStatus(ev, &est));
        H_EXPECT(ctx, est == ACL_EVENT_RECORDED_STATUS_NOT_READY, "an event recorded behind a "
                 "0.5 s callback is already complete");
        double t0 = h_now();
        (void)H_EXPECT_ACL(ctx, aclrtSynchronizeStreamWithTimeout(s, 20),
                           ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
        double took = h_now() - t0;
        H_EXPECT(ctx, took < 0.4, "a 20 ms synchronisation timeout took %.3f s", took);
        H_ACL(ctx, aclrtSynchronizeStream(s));
        H_EXPECT(ctx, c3.ran == 1, "slow callback had not run after aclrtSynchronizeStream");
        H_ACL(ctx, aclrtQueryEventStatus(ev, &est));
        H_EXPECT(ctx, est == ACL_EVENT_RECORDED_STATUS_COMPLETE, "event not complete after the "
                 "stream was synchronised");
        H_ACL(ctx, aclrtDestroyEvent(ev));
    }

    H_ACL(ctx, aclrtUnSubscribeReport((uint64_t)tid, s));
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(tid, NULL);
    H_ACL(ctx, aclrtFree(d));
    H_ACL(ctx, aclrtFreeHost(h));
    H_ACL(ctx, aclrtDestroyStream(s));
    return 0;
}

/* ---- the last aclrtResetDevice of a device ----------------------------------------------- */

/* Dropping a device's last reference releases what was created on it (reference §3.6): its
 * streams and events are refused from then on, as destroyed ones are, and destroying them again
 * is an error, not a crash. A reset that leaves a reference releases nothing; streams and events
 * of another device are untouched; the device works again after aclrtSetDevice. All ranks run
 * this together (between barriers), so no other case holds a reference to a device meanwhile:
 * per_thread_device sets and resets other ranks' devices. ctx->stream is replaced. */
static int last_reset(h_ctx *ctx)
{
    if (!h_case(ctx, "the last aclrtResetDevice destroys the device's streams and events")) {
        return 0;
    }
    RUN(h_oob_barrier(ctx));
    uint32_t count = 0;
    H_ACL(ctx, aclrtGetDeviceCount(&count));
    int32_t dev = ctx->device;
    /* a device no rank uses, when there is one: its objects must survive */
    int32_t spare = (int32_t)(ctx->nranks + ctx->rank);
    int has_spare = spare < (int32_t)count;
    aclrtContext home = NULL;
    aclrtStream s_spare = NULL;
    aclrtEvent e_spare = NULL;
    H_ACL(ctx, aclrtGetCurrentContext(&home));
    if (has_spare) {
        H_ACL(ctx, aclrtSetDevice(spare));
        H_ACL(ctx, aclrtCreateStream(&s_spare));
        H_ACL(ctx, aclrtCreateEvent(&e_spare));
        H_ACL(ctx, aclrtSetCurrentContext(home)); /* back without another reference */
    }

    H_ACL(ctx, aclrtSetDevice(dev)); /* a second reference: h_rank_setup holds the first */
    aclrtStream s = NULL, s2 = NULL;
    aclrtEvent e = NULL, e_sync = NULL;
    H_ACL(ctx, aclrtCreateStream(&s));
    H_ACL(ctx, aclrtCreateStreamWithConfig(&s2, 3, 0));
    H_ACL(ctx, aclrtCreateEvent(&e));
    H_ACL(ctx, aclrtCreateEventWithFlag(&e_sync, ACL_EVENT_SYNC));
    H_ACL(ctx, aclrtRecordEvent(e, s));
    H_ACL(ctx, aclrtStreamWaitEvent(s2, e));

    h_set_case(ctx, "aclrtResetDevice that leaves a reference");
    H_ACL(ctx, aclrtResetDevice(dev));
    H_ACL(ctx, aclrtSynchronizeStream(s));
    H_ACL(ctx, aclrtSynchronizeStream(s2));
    H_ACL(ctx, aclrtRecordEvent(e_sync, s2));
    H_ACL(ctx, aclrtSynchronizeEvent(e_sync));

    h_set_case(ctx, "the last aclrtResetDevice");
    /* work still queued when the device is reset is finished first */
    H_ACL(ctx, aclrtRecordEvent(e, s));
    H_ACL(ctx, aclrtResetDevice(dev));
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    aclrtStream streams[3] = {s, s2, ctx->stream};
    for (int i = 0; i < 3; i++) {
        (void)H_EXPECT_ACL(ctx, aclrtSynchronizeStream(streams[i]), ACL_ERROR_INVALID_PARAM);
        (void)H_EXPECT_ACL(ctx, aclrtSynchronizeStreamWithTimeout(streams[i], 100),
                           ACL_ERROR_INVALID_PARAM);
        (void)H_EXPECT_ACL(ctx, aclrtRecordEvent(e_spare != NULL ? e_spare : e, streams[i]),
                           ACL_ERROR_INVALID_PARAM);
    }
    (void)H_EXPECT_ACL(ctx, aclrtRecordEvent(e, s_spare), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtSynchronizeEvent(e), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtQueryEventStatus(e_sync, &st), ACL_ERROR_INVALID_PARAM);
    if (has_spare) {
        (void)H_EXPECT_ACL(ctx, aclrtStreamWaitEvent(s_spare, e_sync), ACL_ERROR_INVALID_PARAM);
    }
    h_set_case(ctx, "destroying what the last aclrtResetDevice released");
    (void)H_EXPECT_ACL(ctx, aclrtDestroyStream(s), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtDestroyStreamForce(s2), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtDestroyStream(ctx->stream), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtDestroyEvent(e), ACL_ERROR_INVALID_PARAM);
    (void)H_EXPECT_ACL(ctx, aclrtDestroyEvent(e_sync), ACL_ERROR_INVALID_PARAM);
    ctx->stream = NULL;

    if (has_spare) {
        h_set_case(ctx, "another device's stream and event survive");
        H_ACL(ctx, aclrtRecordEvent(e_spare, s_spare));
        H_ACL(ctx, aclrtSynchronizeStream(s_spare));
        H_ACL(ctx, aclrtQueryEventStatus(e_spare, &st));
        H_EXPECT(ctx, st == ACL_EVENT_RECORDED_STATUS_COMPLETE, "event of device %d not complete "
                 "after its stream was synchronised", spare);
        H_ACL(ctx, aclrtDestroyEvent(e_spare));
        H_ACL(ctx, aclrtDestroyStream(s_spare));
        H_ACL(ctx, aclrtResetDevice(spare));
    }

    h_set_case(ctx, "the device works again after aclrtSetDevice");
    H_ACL(ctx, aclrtSetDevice(dev));
    H_ACL(ctx, aclrtSynchronizeStream(NULL)); /* the default stream outlives the reset */
    H_ACL(ctx, aclrtCreateStream(&ctx->stream));
    H_ACL(ctx, aclrtCreateEvent(&e));
    uint8_t host[256], back[256];
    for (size_t i = 0; i < sizeof host; i++) {
        host[i] = (uint8_t)(i * 7 + (size_t)ctx->rank);
    }
    void *d = NULL;
    H_ACL(ctx, aclrtMalloc(&d, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMemcpy(d, sizeof host, host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE));
    H_ACL(ctx, aclrtMemcpyAsync(back, sizeof back, d, sizeof host, ACL_MEMCPY_DEVICE_TO_HOST,
                                ctx->stream));
    H_ACL(ctx, aclrtRecordEvent(e, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeEvent(e));
    H_EXPECT(ctx, memcmp(host, back, sizeof host) == 0, "a copy after the device was set again "
             "differs");
    H_ACL(ctx, aclrtDestroyEvent(e));
    H_ACL(ctx, aclrtFree(d));
    RUN(h_oob_barrier(ctx));
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    RUN(device_count(ctx));
    RUN(per_thread_device(ctx));
    RUN(mem_info(ctx));
    RUN(contexts(ctx));
    RUN(memcpy_chain(ctx));
    RUN(events(ctx));
    RUN(wait_event_copies(ctx));
    RUN(sync_device_and_destroy(ctx));
    RUN(callbacks(ctx));
    h_set_case(ctx, "world comm");
    HcclComm comm;
    RUN(h_world_comm(ctx, &comm));
    RUN(wait_event_collective(ctx, comm));
    H_HCCL(ctx, HcclCommDestroy(comm));
    RUN(last_reset(ctx));
    h_set_case(ctx, "teardown");
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("streams", run_rank, NULL, NULL);
    return h_finish("streams", failed);
}
