/*
 * Shared harness for the simulator's C test programs: see harness.h.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

h_options h_opt;

/* ======================================================================================== */
/* printing                                                                                 */
/* ======================================================================================== */

static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;

static void print_line(const char *text)
{
    pthread_mutex_lock(&print_mu);
    fputs(text, stdout);
    fflush(stdout);
    pthread_mutex_unlock(&print_mu);
}

static void vprint(const char *prefix, const char *fmt, va_list ap)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n < sizeof buf) {
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    }
    size_t len = strlen(buf);
    if (len + 2 > sizeof buf) {
        len = sizeof buf - 2;
    }
    buf[len] = '\n';
    buf[len + 1] = '\0';
    print_line(buf);
}

static void hprint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void hprint(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprint("", fmt, ap);
    va_end(ap);
}

void h_log(h_ctx *ctx, const char *fmt, ...)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "[rank %u] ", ctx ? ctx->rank : 0U);
    va_list ap;
    va_start(ap, fmt);
    vprint(prefix, fmt, ap);
    va_end(ap);
}

const char *h_recent_msg(void)
{
    const char *m = aclGetRecentErrMsg();
    return m ? m : "(NULL)";
}

void h_failf(h_ctx *ctx, const char *file, int line, const char *fmt, ...)
{
    char prefix[512];
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (ctx) {
        ctx->failures++;
        snprintf(prefix, sizeof prefix, "FAIL rank=%u case=[%s] %s:%d: ", ctx->rank, ctx->case_name,
                 base, line);
    } else {
        snprintf(prefix, sizeof prefix, "FAIL %s:%d: ", base, line);
    }
    va_list ap;
    va_start(ap, fmt);
    vprint(prefix, fmt, ap);
    va_end(ap);
}

static const char *code_name(long rc, int is_hccl)
{
    if (is_hccl) {
        const char *s = HcclGetErrorString((HcclResult)rc);
        return s ? s : "?";
    }
    return "aclError";
}

void h_fail_call(h_ctx *ctx, const char *file, int line, const char *call, long rc, int is_hccl)
{
    h_failf(ctx, file, line, "`%s` returned %ld (%s); aclGetRecentErrMsg: \"%s\"", call, rc,
            code_name(rc, is_hccl), h_recent_msg());
}

int h_expect_rc(h_ctx *ctx, const char *file, int line, const char *call, long rc, long expected,
                int is_hccl)
{
    ctx->checks++;
    int ok = expected == H_ANY_ERROR ? rc != 0 : rc == expected;
    if (!ok) {
        char want[64];
        if (expected == H_ANY_ERROR) {
            snprintf(want, sizeof want, "an error");
        } else {
            snprintf(want, sizeof want, "%ld", expected);
        }
        h_failf(ctx, file, line, "`%s` returned %ld (%s), expected %s; aclGetRecentErrMsg: \"%s\"",
                call, rc, code_name(rc, is_hccl), want, h_recent_msg());
        return 0;
    }
    if (rc != 0) {
        const char *m = aclGetRecentErrMsg();
        if (m == NULL || m[0] == '\0') {
            h_failf(ctx, file, line,
                    "`%s` failed with %ld as expected, but aclGetRecentErrMsg() is %s", call, rc,
                    m == NULL ? "NULL" : "empty");
            return 0;
        }
    }
    return 1;
}

int h_case(h_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->case_name, sizeof ctx->case_name, fmt, ap);
    va_end(ap);
    if (h_opt.filter && h_opt.filter[0] && strstr(ctx->case_name, h_opt.filter) == NULL) {
        return 0;
    }
    ctx->cases++;
    if (h_opt.verbose) {
        h_log(ctx, "case %s", ctx->case_name);
    }
    return 1;
}

void h_set_case(h_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->case_name, sizeof ctx->case_name, fmt, ap);
    va_end(ap);
}

void *h_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        hprint("FATAL: out of host memory (%zu bytes)", n);
        exit(3);
    }
    return p;
}

void *h_xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (p == NULL) {
        hprint("FATAL: out of host memory (%zu x %zu bytes)", n, m);
        exit(3);
    }
    return p;
}

/* ======================================================================================== */
/* time                                                                                     */
/* ======================================================================================== */

double h_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void h_sleep(double seconds)
{
    if (seconds <= 0) {
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static struct timespec abs_monotonic(double when)
{
    struct timespec ts;
    if (when < 0) {
        when = 0;
    }
    ts.tv_sec = (time_t)when;
    ts.tv_nsec = (long)((when - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* ======================================================================================== */
/* options                                                                                  */
/* ======================================================================================== */

static const char *usage_text = "";

static void usage(const char *prog, const char *msg)
{
    fprintf(stderr,
            "%s: %s\nusage: %s --ranks N --mode threads|procs|mixed [--procs P] [--deadline S]\n"
            "          [--filter SUBSTRING] [--verbose] %s\n",
            prog, msg, prog, usage_text);
    exit(2);
}

void h_parse_args(int argc, char **argv, const char *usage_extra)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    usage_text = usage_extra ? usage_extra : "";
    memset(&h_opt, 0, sizeof h_opt);
    h_opt.nranks = 2;
    h_opt.mode = H_MODE_THREADS;
    h_opt.deadline = 120.0;
    h_opt.argv = (char **)h_xcalloc((size_t)argc + 1, sizeof(char *));
    uint32_t procs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--ranks") == 0 && v) {
            long n = strtol(v, NULL, 10);
            if (n < 1 || n > H_MAX_RANKS) {
                usage(argv[0], "--ranks out of range");
            }
            h_opt.nranks = (uint32_t)n;
            i++;
        } else if (strcmp(a, "--mode") == 0 && v) {
            if (strcmp(v, "threads") == 0) {
                h_opt.mode = H_MODE_THREADS;
            } else if (strcmp(v, "procs") == 0) {
                h_opt.mode = H_MODE_PROCS;
            } else if (strcmp(v, "mixed") == 0) {
                h_opt.mode = H_MODE_MIXED;
            } else {
                usage(argv[0], "unknown --mode");
            }
            i++;
        } else if (strcmp(a, "--procs") == 0 && v) {
            procs = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--deadline") == 0 && v) {
            h_opt.deadline = strtod(v, NULL);
            i++;
        } else if (strcmp(a, "--filter") == 0 && v) {
            h_opt.filter = v;
            i++;
        } else if (strcmp(a, "--verbose") == 0) {
            h_opt.verbose = 1;
        } else {
            h_opt.argv[h_opt.argc++] = argv[i];
        }
    }
    switch (h_opt.mode) {
    case H_MODE_THREADS:
        h_opt.nprocs = 1;
        h_opt.nthreads = h_opt.nranks;
        break;
    case H_MODE_PROCS:
        h_opt.nprocs = h_opt.nranks;
        h_opt.nthreads = 1;
        break;
    case H_MODE_MIXED:
        if (procs == 0) {
            procs = h_opt.nranks >= 2 ? 2 : 1;
        }
        if (procs > h_opt.nranks || h_opt.nranks % procs != 0) {
            usage(argv[0], "--mode mixed needs --ranks divisible by --procs");
        }
        h_opt.nprocs = procs;
        h_opt.nthreads = h_opt.nranks / procs;
        break;
    }
}

const char *h_arg(const char *name)
{
    for (int i = 0; i + 1 < h_opt.argc; i++) {
        const char *a = h_opt.argv[i];
        if (a[0] == '-' && a[1] == '-' && strcmp(a + 2, name) == 0) {
            return h_opt.argv[i + 1];
        }
    }
    return NULL;
}

long h_arg_long(const char *name, long dflt)
{
    const char *v = h_arg(name);
    return v ? strtol(v, NULL, 10) : dflt;
}

int h_flag(const char *name)
{
    for (int i = 0; i < h_opt.argc; i++) {
        const char *a = h_opt.argv[i];
        if (a[0] == '-' && a[1] == '-' && strcmp(a + 2, name) == 0) {
            return 1;
        }
    }
    return 0;
}

static const char *mode_name(h_mode m)
{
    return m == H_MODE_THREADS ? "threads" : m == H_MODE_PROCS ? "procs" : "mixed";
}

/* ======================================================================================== */
/* process state and the out-of-band channel                                                */
/* ======================================================================================== */

#define OOB_MAGIC 0x48424f42U

typedef struct {
    uint32_t magic;
    uint32_t pad;
    uint64_t mask;
    uint64_t len;
} oob_header;

static struct {
    uint32_t proc, nprocs, nlocal, nranks;
    int forked;            /* 1 inside a child of a process-mode launch */
    int down_rd, up_wr;    /* proc > 0: hub -> me, me -> hub */
    int down_wr[H_MAX_RANKS], up_rd[H_MAX_RANKS]; /* proc 0 */
    int notify_wr;
    double deadline;
    /* the exchange between the threads of this process */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;
    uint32_t arrived, departed, expected;
    int draining, rc;
    size_t xlen;
    uint64_t xmask;
    uint8_t *buf;
    size_t cap;
    /* rank threads and their completion */
    uint32_t done;
    int acl_inited;
} G = {.down_rd = -1, .up_wr = -1, .notify_wr = -1};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void g_init_sync(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&G.mu, NULL);
    pthread_cond_init(&G.cv, &ca);
    pthread_condattr_destroy(&ca);
}

uint64_t h_all_mask(uint32_t nranks)
{
    return nranks >= 64 ? ~0ULL : ((1ULL << nranks) - 1ULL);
}

static int write_full(int fd, const void *p, size_t n)
{
    const uint8_t *c = (const uint8_t *)p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                continue;
            }
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* 0 ok, -1 error/timeout, -2 EOF (peer gone) */
static int read_full(int fd, void *p, size_t n)
{
    uint8_t *c = (uint8_t *)p;
    while (n > 0) {
        double left = G.deadline - h_now();
        if (left <= 0) {
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN, .revents = 0};
        int ms = left > 1.0 ? 1000 : (int)(left * 1000.0) + 1;
        int pr = poll(&pfd, 1, ms);
        if (pr < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (pr == 0) {
            continue;
        }
        ssize_t r = read(fd, c, n);
        if (r == 0) {
            return -2;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                continue;
            }
            return -1;
        }
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_msg(int fd, uint64_t mask, const void *p, size_t len)
{
    oob_header h = {.magic = OOB_MAGIC, .pad = 0, .mask = mask, .len = len};
    if (write_full(fd, &h, sizeof h) != 0) {
        return -1;
    }
    return write_full(fd, p, len);
}

static int recv_msg(int fd, uint64_t mask, void *p, size_t len)
{
    oob_header h;
    int rc = read_full(fd, &h, sizeof h);
    if (rc != 0) {
        return rc;
    }
    if (h.magic != OOB_MAGIC || h.mask != mask || h.len != len) {
        hprint("FATAL: out-of-band channel out of step (magic %x mask %llx/%llx len %llu/%zu)",
               h.magic, (unsigned long long)h.mask, (unsigned long long)mask,
               (unsigned long long)h.len, len);
        return -1;
    }
    return read_full(fd, p, len);
}

static uint32_t proc_of_rank(uint32_t rank)
{
    return rank / (G.nranks / G.nprocs);
}

static int proc_in_mask(uint32_t proc, uint64_t mask)
{
    uint32_t per = G.nranks / G.nprocs;
    for (uint32_t r = proc * per; r < (proc + 1) * per; r++) {
        if (mask & (1ULL << r)) {
            return 1;
        }
    }
    return 0;
}

/* Run by the last thread of this process to arrive; buf holds this process's slots. */
static int inter_exchange(uint64_t mask, uint8_t *buf, size_t len)
{
    size_t total = (size_t)G.nranks * len;
    if (G.proc == 0) {
        uint8_t *tmp = (uint8_t *)h_xmalloc(total);
        for (uint32_t q = 1; q < G.nprocs; q++) {
            if (!proc_in_mask(q, mask)) {
                continue;
            }
            int rc = recv_msg(G.up_rd[q], mask, tmp, total);
            if (rc != 0) {
                hprint("FAIL out-of-band: no message from process %u (%s)", q,
                       rc == -2 ? "it exited" : "timeout or error");
                free(tmp);
                return -1;
            }
            for (uint32_t r = 0; r < G.nranks; r++) {
                if (proc_of_rank(r) == q && (mask & (1ULL << r))) {
                    memcpy(buf + (size_t)r * len, tmp + (size_t)r * len, len);
                }
            }
        }
        free(tmp);
        int bad = 0;
        for (uint32_t q = 1; q < G.nprocs; q++) {
            if (proc_in_mask(q, mask) && send_msg(G.down_wr[q], mask, buf, total) != 0) {
                bad = 1;
            }
        }
        return bad ? -1 : 0;
    }
    if (send_msg(G.up_wr, mask, buf, total) != 0) {
        hprint("FAIL out-of-band: process %u cannot write to process 0", G.proc);
        return -1;
    }
    int rc = recv_msg(G.down_rd, mask, buf, total);
    if (rc != 0) {
        hprint("FAIL out-of-band: process %u got no answer from process 0 (%s)", G.proc,
               rc == -2 ? "it exited" : "timeout or error");
        return -1;
    }
    return 0;
}

static int cond_wait_deadline(void)
{
    struct timespec ts = abs_monotonic(G.deadline);
    int rc = pthread_cond_timedwait(&G.cv, &G.mu, &ts);
    return rc == ETIMEDOUT ? -1 : 0;
}

int h_oob_allgather_mask(h_ctx *ctx, uint64_t mask, const void *mine, void *all, size_t len)
{
    if (!(mask & (1ULL << ctx->rank)) || !(mask & 1ULL)) {
        h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange: bad mask %llx",
                (unsigned long long)mask);
        return -1;
    }
    uint32_t expected = 0;
    for (uint32_t r = 0; r < G.nranks; r++) {
        if ((mask & (1ULL << r)) && proc_of_rank(r) == G.proc) {
            expected++;
        }
    }
    size_t total = (size_t)G.nranks * len;
    if (expected != G.nlocal && G.nlocal > 1) {
        h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange: with several ranks per process a "
                "mask must hold all or none of a process's ranks (mask %llx)",
                (unsigned long long)mask);
        return -1;
    }
    pthread_mutex_lock(&G.mu);
    while (G.draining) {
        if (cond_wait_deadline() != 0) {
            pthread_mutex_unlock(&G.mu);
            h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange: timeout (previous round)");
            return -1;
        }
    }
    if (G.arrived == 0) {
        if (G.cap < total) {
            free(G.buf);
            G.buf = (uint8_t *)h_xmalloc(total);
            G.cap = total;
        }
        memset(G.buf, 0, total);
        G.xlen = len;
        G.xmask = mask;
        G.expected = expected;
    } else if (G.xlen != len || G.xmask != mask) {
        pthread_mutex_unlock(&G.mu);
        h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange: ranks disagree on len/mask");
        return -1;
    }
    memcpy(G.buf + (size_t)ctx->rank * len, mine, len);
    G.arrived++;
    if (G.arrived == G.expected) {
        uint64_t gen = G.gen;
        pthread_mutex_unlock(&G.mu);
        int rc = G.nprocs > 1 ? inter_exchange(mask, G.buf, len) : 0;
        pthread_mutex_lock(&G.mu);
        G.rc = rc;
        G.draining = 1;
        G.departed = 0;
        G.gen = gen + 1;
        pthread_cond_broadcast(&G.cv);
    } else {
        uint64_t gen = G.gen;
        while (G.gen == gen) {
            if (cond_wait_deadline() != 0) {
                pthread_mutex_unlock(&G.mu);
                h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange: timeout waiting for "
                                                 "the other ranks of this process");
                return -1;
            }
        }
    }
    int rc = G.rc;
    memcpy(all, G.buf, total);
    G.departed++;
    if (G.departed == G.expected) {
        G.draining = 0;
        G.arrived = 0;
        pthread_cond_broadcast(&G.cv);
    }
    pthread_mutex_unlock(&G.mu);
    if (rc != 0) {
        h_failf(ctx, __FILE__, __LINE__, "out-of-band exchange failed");
    }
    return rc;
}

int h_oob_allgather(h_ctx *ctx, const void *mine, void *all, size_t len)
{
    return h_oob_allgather_mask(ctx, h_all_mask(ctx->nranks), mine, all, len);
}

int h_oob_bcast_mask(h_ctx *ctx, uint64_t mask, uint32_t root, void *buf, size_t len)
{
    uint8_t *all = (uint8_t *)h_xmalloc((size_t)ctx->nranks * len);
    int rc = h_oob_allgather_mask(ctx, mask, buf, all, len);
    if (rc == 0) {
        memcpy(buf, all + (size_t)root * len, len);
    }
    free(all);
    return rc;
}

int h_oob_bcast(h_ctx *ctx, uint32_t root, void *buf, size_t len)
{
    return h_oob_bcast_mask(ctx, h_all_mask(ctx->nranks), root, buf, len);
}

int h_oob_barrier_mask(h_ctx *ctx, uint64_t mask)
{
    uint8_t one = 1;
    uint8_t *all = (uint8_t *)h_xmalloc(ctx->nranks);
    int rc = h_oob_allgather_mask(ctx, mask, &one, all, 1);
    free(all);
    return rc;
}

int h_oob_barrier(h_ctx *ctx)
{
    return h_oob_barrier_mask(ctx, h_all_mask(ctx->nranks));
}

void h_notify_parent(h_ctx *ctx, uint8_t code)
{
    if (G.notify_wr < 0) {
        h_log(ctx, "h_notify_parent: no parent to notify (not a process-mode launch)");
        return;
    }
    uint8_t msg[2] = {(uint8_t)ctx->proc, code};
    if (write_full(G.notify_wr, msg, 2) != 0) {
        h_log(ctx, "h_notify_parent: write failed");
    }
}

int h_parent_wait_notify(h_parent *p, uint32_t *proc, double timeout)
{
    double until = h_now() + timeout;
    if (until > p->deadline) {
        until = p->deadline;
    }
    uint8_t msg[2];
    size_t got = 0;
    while (got < 2) {
        double left = until - h_now();
        if (left <= 0) {
            return -1;
        }
        struct pollfd pfd = {.fd = p->notify_fd, .events = POLLIN, .revents = 0};
        int pr = poll(&pfd, 1, (int)(left * 1000.0) + 1);
        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t r = read(p->notify_fd, msg + got, 2 - got);
        if (r == 0) {
            return -1;
        }
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        got += (size_t)r;
    }
    if (proc) {
        *proc = msg[0];
    }
    return msg[1];
}

/* ======================================================================================== */
/* running the ranks of one process                                                         */
/* ======================================================================================== */

typedef struct {
    h_ctx ctx;
    h_rank_fn fn;
    const h_launch_cfg *cfg;
    pthread_t tid;
    int finished;
    int fatal;
} rank_slot;

static void *rank_thread(void *p)
{
    rank_slot *s = (rank_slot *)p;
    int rc = s->fn(&s->ctx);
    if (rc < 0) {
        s->fatal = 1;
        hprint("FATAL rank=%u case=[%s]: a required call failed; %s", s->ctx.rank,
               s->ctx.case_name,
               s->cfg->no_fail_fast ? "this rank stops" : "stopping this process");
        if (!s->cfg->no_fail_fast) {
            if (!G.forked) {
                hprint("RESULT: FAIL (fatal error in rank %u)", s->ctx.rank);
            }
            fflush(stdout);
            exit(1);
        }
    }
    pthread_mutex_lock(&G.mu);
    s->finished = 1;
    G.done++;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

static void acl_init_once(void)
{
    if (G.acl_inited) {
        return;
    }
    aclError rc = aclInit(NULL);
    if (rc != ACL_SUCCESS && rc != ACL_ERROR_REPEAT_INITIALIZE) {
        hprint("FAIL aclInit(NULL) returned %d; aclGetRecentErrMsg: \"%s\"", (int)rc,
               h_recent_msg());
    }
    G.acl_inited = 1;
}

/* Returns the number of ranks that failed. */
static int run_ranks(const char *label, h_rank_fn fn, void *arg, const h_launch_cfg *cfg)
{
    pthread_once(&g_once, g_init_sync);
    acl_init_once();
    G.done = 0;
    G.arrived = G.departed = 0;
    G.draining = 0;
    rank_slot *slots = (rank_slot *)h_xcalloc(G.nlocal, sizeof(rank_slot));
    for (uint32_t i = 0; i < G.nlocal; i++) {
        rank_slot *s = &slots[i];
        s->fn = fn;
        s->cfg = cfg;
        s->ctx.rank = G.proc * G.nlocal + i;
        s->ctx.nranks = G.nranks;
        s->ctx.proc = G.proc;
        s->ctx.nprocs = G.nprocs;
        s->ctx.local = i;
        s->ctx.nlocal = G.nlocal;
        s->ctx.device = (int32_t)s->ctx.rank;
        s->ctx.arg = arg;
        snprintf(s->ctx.case_name, sizeof s->ctx.case_name, "(setup)");
        if (pthread_create(&s->tid, NULL, rank_thread, s) != 0) {
            hprint("FATAL: pthread_create failed");
            exit(3);
        }
    }
    /* watchdog */
    pthread_mutex_lock(&G.mu);
    while (G.done < G.nlocal) {
        struct timespec ts = abs_monotonic(G.deadline);
        if (pthread_cond_timedwait(&G.cv, &G.mu, &ts) == ETIMEDOUT && G.done < G.nlocal) {
            pthread_mutex_unlock(&G.mu);
            for (uint32_t i = 0; i < G.nlocal; i++) {
                if (!slots[i].finished) {
                    hprint("TIMEOUT [%s] rank=%u still running case [%s] after the %.0f s deadline",
                           label, slots[i].ctx.rank, slots[i].ctx.case_name, h_opt.deadline);
                }
            }
            if (!G.forked) {
                hprint("RESULT: FAIL (deadline exceeded)");
            }
            fflush(stdout);
            _exit(124);
        }
    }
    pthread_mutex_unlock(&G.mu);
    int failed = 0;
    long cases = 0, checks = 0, failures = 0;
    for (uint32_t i = 0; i < G.nlocal; i++) {
        pthread_join(slots[i].tid, NULL);
        cases += slots[i].ctx.cases;
        checks += slots[i].ctx.checks;
        failures += slots[i].ctx.failures;
        if (slots[i].ctx.failures > 0 || slots[i].fatal) {
            failed++;
        }
    }
    hprint("[%s] process %u (ranks %u..%u): %ld cases, %ld checks, %ld failures", label, G.proc,
           G.proc * G.nlocal, G.proc * G.nlocal + G.nlocal - 1, cases, checks, failures);
    free(slots);
    return failed;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

int h_launch(const char *label, h_rank_fn fn, void *arg, const h_launch_cfg *cfg_in)
{
    h_launch_cfg cfg_default;
    memset(&cfg_default, 0, sizeof cfg_default);
    const h_launch_cfg *cfg = cfg_in ? cfg_in : &cfg_default;
    double span = cfg->deadline > 0 ? cfg->deadline : h_opt.deadline;
    double start = h_now();
    G.nranks = h_opt.nranks;
    G.nprocs = h_opt.nprocs;
    G.nlocal = h_opt.nthreads;
    G.deadline = start + span;

    if (h_opt.mode == H_MODE_THREADS) {
        G.proc = 0;
        int failed = run_ranks(label, fn, arg, cfg);
        hprint("launch %s: %s (%u ranks, threads, %.2f s)", label, failed ? "FAILED" : "ok",
               G.nranks, h_now() - start);
        return failed ? 1 : 0;
    }

    if (G.acl_inited) {
        hprint("FATAL: process-mode launch after this process called ACL (fork must come first)");
        return 1;
    }
    uint32_t P = G.nprocs;
    int down[H_MAX_RANKS][2], up[H_MAX_RANKS][2], notify[2];
    for (uint32_t q = 0; q < P; q++) {
        down[q][0] = down[q][1] = up[q][0] = up[q][1] = -1;
        if (q > 0 && (pipe2(down[q], O_CLOEXEC) != 0 || pipe2(up[q], O_CLOEXEC) != 0)) {
            hprint("FATAL: pipe failed: %s", strerror(errno));
            return 1;
        }
    }
    if (pipe2(notify, O_CLOEXEC) != 0) {
        hprint("FATAL: pipe failed: %s", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    h_parent parent;
    memset(&parent, 0, sizeof parent);
    parent.nprocs = P;
    parent.start = start;
    parent.deadline = start + span + 5.0;
    parent.arg = cfg->hook_arg;
    parent.notify_fd = notify[0];
    for (uint32_t p = 0; p < P; p++) {
        pid_t pid = fork();
        if (pid < 0) {
            hprint("FATAL: fork failed: %s", strerror(errno));
            for (uint32_t q = 0; q < p; q++) {
                kill(parent.pids[q], SIGKILL);
                waitpid(parent.pids[q], NULL, 0);
            }
            return 1;
        }
        if (pid == 0) {
            /* child: keep only this process's ends of the channel */
            signal(SIGPIPE, SIG_IGN);
            G.forked = 1;
            G.proc = p;
            for (uint32_t q = 1; q < P; q++) {
                if (p == 0) {
                    G.down_wr[q] = down[q][1];
                    G.up_rd[q] = up[q][0];
                    close(down[q][0]);
                    close(up[q][1]);
                } else if (q == p) {
                    G.down_rd = down[q][0];
                    G.up_wr = up[q][1];
                    close(down[q][1]);
                    close(up[q][0]);
                } else {
                    close(down[q][0]);
                    close(down[q][1]);
                    close(up[q][0]);
                    close(up[q][1]);
                }
            }
            close(notify[0]);
            G.notify_wr = notify[1];
            int failed = run_ranks(label, fn, arg, cfg);
            aclFinalize();
            fflush(stdout);
            exit(failed ? 1 : 0);
        }
        parent.pids[p] = pid;
    }
    for (uint32_t q = 1; q < P; q++) {
        close_fd(&down[q][0]);
        close_fd(&down[q][1]);
        close_fd(&up[q][0]);
        close_fd(&up[q][1]);
    }
    close(notify[1]);
    if (cfg->parent_hook) {
        cfg->parent_hook(&parent);
    }
    int status[H_MAX_RANKS];
    int reaped[H_MAX_RANKS];
    memset(reaped, 0, sizeof reaped);
    uint32_t left = P;
    int failed = 0, killed_all = 0;
    while (left > 0) {
        int st = 0;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (uint32_t p = 0; p < P; p++) {
                if (parent.pids[p] == pid && !reaped[p]) {
                    reaped[p] = 1;
                    status[p] = st;
                    left--;
                    int ok = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                             (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && parent.may_be_killed[p]);
                    if (!ok) {
                        failed = 1;
                        if (!cfg->no_fail_fast && !killed_all) {
                            for (uint32_t q = 0; q < P; q++) {
                                if (!reaped[q]) {
                                    kill(parent.pids[q], SIGKILL);
                                }
                            }
                            killed_all = 1;
                        }
                    }
                }
            }
            continue;
        }
        if (h_now() > parent.deadline && !killed_all) {
            hprint("TIMEOUT [%s]: killing the remaining processes after %.0f s", label,
                   h_now() - start);
            for (uint32_t q = 0; q < P; q++) {
                if (!reaped[q]) {
                    kill(parent.pids[q], SIGKILL);
                }
            }
            killed_all = 1;
            failed = 1;
        }
        h_sleep(0.005);
    }
    close(notify[0]);
    for (uint32_t p = 0; p < P; p++) {
        int st = status[p];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            continue;
        }
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && parent.may_be_killed[p]) {
            continue;
        }
        if (WIFEXITED(st)) {
            hprint("[%s] process %u (pid %d) exited with status %d", label, p, (int)parent.pids[p],
                   WEXITSTATUS(st));
        } else if (WIFSIGNALED(st)) {
            hprint("[%s] process %u (pid %d) was killed by signal %d", label, p,
                   (int)parent.pids[p], WTERMSIG(st));
        }
    }
    hprint("launch %s: %s (%u ranks, %s, %u processes, %.2f s)", label, failed ? "FAILED" : "ok",
           G.nranks, mode_name(h_opt.mode), P, h_now() - start);
    return failed;
}

/* The deadline of a single-thread part is watched by a thread of its own. */
static struct {
    h_ctx *ctx;
    double deadline;
    int active;
    int started;
    const char *label;
} single_wd;
static pthread_mutex_t single_mu = PTHREAD_MUTEX_INITIALIZER;

static void *single_watchdog(void *unused)
{
    (void)unused;
    for (;;) {
        h_sleep(0.05);
        pthread_mutex_lock(&single_mu);
        if (single_wd.active && h_now() > single_wd.deadline) {
            hprint("TIMEOUT [%s] still running case [%s] after the %.0f s deadline",
                   single_wd.label, single_wd.ctx->case_name, h_opt.deadline);
            hprint("RESULT: FAIL (deadline exceeded)");
            fflush(stdout);
            _exit(124);
        }
        pthread_mutex_unlock(&single_mu);
    }
    return NULL;
}

void h_init_single(h_ctx *ctx, const char *label)
{
    pthread_once(&g_once, g_init_sync);
    acl_init_once();
    memset(ctx, 0, sizeof *ctx);
    pthread_mutex_lock(&single_mu);
    single_wd.ctx = ctx;
    single_wd.label = label;
    single_wd.deadline = h_now() + h_opt.deadline;
    single_wd.active = 1;
    if (!single_wd.started) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, single_watchdog, NULL) == 0) {
            pthread_detach(tid);
            single_wd.started = 1;
        }
    }
    pthread_mutex_unlock(&single_mu);
    ctx->nranks = h_opt.nranks;
    ctx->nprocs = 1;
    ctx->nlocal = 1;
    snprintf(ctx->case_name, sizeof ctx->case_name, "%s (setup)", label);
}

int h_single_done(h_ctx *ctx, int rc, const char *label, double start)
{
    pthread_mutex_lock(&single_mu);
    single_wd.active = 0;
    pthread_mutex_unlock(&single_mu);
    int failed = rc < 0 || ctx->failures > 0;
    if (rc < 0) {
        hprint("FATAL case=[%s]: a required call failed", ctx->case_name);
    }
    hprint("[%s] single thread: %ld cases, %ld checks, %ld failures", label, ctx->cases,
           ctx->checks, ctx->failures);
    hprint("launch %s: %s (%u devices from one thread, %.2f s)", label, failed ? "FAILED" : "ok",
           ctx->nranks, h_now() - start);
    return failed;
}

int h_finish(const char *program, int failed)
{
    if (G.acl_inited && !G.forked) {
        aclFinalize();
        G.acl_inited = 0;
    }
    hprint("RESULT: %s (%s, %u ranks, mode %s)", failed ? "FAIL" : "PASS", program, h_opt.nranks,
           mode_name(h_opt.mode));
    return failed ? 1 : 0;
}

/* ======================================================================================== */
/* per-rank setup                                                                           */
/* ======================================================================================== */

int h_rank_setup(h_ctx *ctx)
{
    H_ACL(ctx, aclrtSetDevice(ctx->device));
    H_ACL(ctx, aclrtCreateStream(&ctx->stream));
    return 0;
}

int h_rank_teardown(h_ctx *ctx)
{
    if (ctx->stream) {
        H_ACL(ctx, aclrtDestroyStream(ctx->stream));
        ctx->stream = NULL;
    }
    H_ACL(ctx, aclrtResetDevice(ctx->device));
    return 0;
}

int h_make_root_info(h_ctx *ctx, uint64_t mask, uint32_t root, HcclRootInfo *info)
{
    memset(info, 0, sizeof *info);
    if (ctx->rank == root) {
        H_HCCL(ctx, HcclGetRootInfo(info));
    }
    if (h_oob_bcast_mask(ctx, mask, root, info, sizeof *info) != 0) {
        return -1;
    }
    return 0;
}

int h_world_comm(h_ctx *ctx, HcclComm *comm)
{
    HcclRootInfo info;
    if (h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &info) != 0) {
        return -1;
    }
    *comm = NULL;
    H_HCCL(ctx, HcclCommInitRootInfo(ctx->nranks, &info, ctx->rank, comm));
    H_REQUIRE(ctx, *comm != NULL, "HcclCommInitRootInfo returned success but a NULL comm");
    return 0;
}

/* ======================================================================================== */
/* element types                                                                            */
/* ======================================================================================== */

const HcclDataType h_all_dtypes[H_NUM_DTYPES] = {
    HCCL_DATA_TYPE_INT8,   HCCL_DATA_TYPE_INT16,  HCCL_DATA_TYPE_INT32,  HCCL_DATA_TYPE_FP16,
    HCCL_DATA_TYPE_FP32,   HCCL_DATA_TYPE_INT64,  HCCL_DATA_TYPE_UINT64, HCCL_DATA_TYPE_UINT8,
    HCCL_DATA_TYPE_UINT16, HCCL_DATA_TYPE_UINT32, HCCL_DATA_TYPE_FP64,   HCCL_DATA_TYPE_BFP16,
};

const HcclReduceOp h_all_ops[H_NUM_OPS] = {HCCL_REDUCE_SUM, HCCL_REDUCE_PROD, HCCL_REDUCE_MAX,
                                           HCCL_REDUCE_MIN};

size_t h_dtype_size(HcclDataType dt)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8:
    case HCCL_DATA_TYPE_UINT8:
        return 1;
    case HCCL_DATA_TYPE_INT16:
    case HCCL_DATA_TYPE_UINT16:
    case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_BFP16:
        return 2;
    case HCCL_DATA_TYPE_INT32:
    case HCCL_DATA_TYPE_UINT32:
    case HCCL_DATA_TYPE_FP32:
        return 4;
    case HCCL_DATA_TYPE_INT64:
    case HCCL_DATA_TYPE_UINT64:
    case HCCL_DATA_TYPE_FP64:
        return 8;
    default:
        return 1;
    }
}

const char *h_dtype_name(HcclDataType dt)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: return "int8";
    case HCCL_DATA_TYPE_INT16: return "int16";
    case HCCL_DATA_TYPE_INT32: return "int32";
    case HCCL_DATA_TYPE_FP16: return "fp16";
    case HCCL_DATA_TYPE_FP32: return "fp32";
    case HCCL_DATA_TYPE_INT64: return "int64";
    case HCCL_DATA_TYPE_UINT64: return "uint64";
    case HCCL_DATA_TYPE_UINT8: return "uint8";
    case HCCL_DATA_TYPE_UINT16: return "uint16";
    case HCCL_DATA_TYPE_UINT32: return "uint32";
    case HCCL_DATA_TYPE_FP64: return "fp64";
    case HCCL_DATA_TYPE_BFP16: return "bf16";
    default: return "?";
    }
}

const char *h_op_name(HcclReduceOp op)
{
    switch (op) {
    case HCCL_REDUCE_SUM: return "sum";
    case HCCL_REDUCE_PROD: return "prod";
    case HCCL_REDUCE_MAX: return "max";
    case HCCL_REDUCE_MIN: return "min";
    default: return "?";
    }
}

int h_dtype_is_float(HcclDataType dt)
{
    return dt == HCCL_DATA_TYPE_FP16 || dt == HCCL_DATA_TYPE_FP32 || dt == HCCL_DATA_TYPE_FP64 ||
           dt == HCCL_DATA_TYPE_BFP16;
}

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t h_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000U;
    uint32_t exp = (x >> 23) & 0xffU;
    uint32_t man = x & 0x7fffffU;
    if (exp == 0xffU) {
        if (man != 0) {
            return (uint16_t)(sign | 0x7e00U | (man >> 13)); /* quiet NaN */
        }
        return (uint16_t)(sign | 0x7c00U);
    }
    int32_t e = (int32_t)exp - 127 + 15;
    if (e <= 0) {
        /* half subnormal (or zero): value = M * 2^(e - 14 - 10) with M = 1.man as 24 bits */
        if (e < -10) {
            return (uint16_t)sign;
        }
        uint32_t m = man | 0x800000U;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1U << shift) - 1U);
        uint32_t half = 1U << (shift - 1U);
        if (rem > half || (rem == half && (h & 1U))) {
            h++;
        }
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffU;
    if (rem > 0x1000U || (rem == 0x1000U && (h & 1U))) {
        h++; /* may carry into the exponent, and up to infinity: both are correct */
    }
    if (h >= 0x7c00U) {
        h = 0x7c00U;
    }
    return (uint16_t)(sign | h);
}

float h_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000U) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fU;
    uint32_t man = (uint32_t)h & 0x3ffU;
    uint32_t x;
    if (exp == 0) {
        if (man == 0) {
            x = sign;
        } else {
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400U) == 0);
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffU) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000U | (man << 13);
    } else {
        x = sign | ((exp + 112U) << 23) | (man << 13);
    }
    return bits_f32(x);
}

uint16_t h_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7f800000U) == 0x7f800000U && (x & 0x7fffffU) != 0) {
        return (uint16_t)((x >> 16) | 0x40U); /* quiet NaN */
    }
    uint32_t lsb = (x >> 16) & 1U;
    x += 0x7fffU + lsb;
    return (uint16_t)(x >> 16);
}

float h_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

void h_format_elem(char *out, size_t n, HcclDataType dt, const void *p)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: {
        int8_t v;
        memcpy(&v, p, 1);
        snprintf(out, n, "%d", (int)v);
        break;
    }
    case HCCL_DATA_TYPE_UINT8: {
        uint8_t v;
        memcpy(&v, p, 1);
        snprintf(out, n, "%u (0x%02x)", (unsigned)v, (unsigned)v);
        break;
    }
    case HCCL_DATA_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        snprintf(out, n, "%d", (int)v);
        break;
    }
    case HCCL_DATA_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        snprintf(out, n, "%u", (unsigned)v);
        break;
    }
    case HCCL_DATA_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        snprintf(out, n, "%d", (int)v);
        break;
    }
    case HCCL_DATA_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        snprintf(out, n, "%u", (unsigned)v);
        break;
    }
    case HCCL_DATA_TYPE_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        snprintf(out, n, "%lld", (long long)v);
        break;
    }
    case HCCL_DATA_TYPE_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        snprintf(out, n, "%llu", (unsigned long long)v);
        break;
    }
    case HCCL_DATA_TYPE_FP16: {
        uint16_t v;
        memcpy(&v, p, 2);
        snprintf(out, n, "%.9g (0x%04x)", (double)h_f16_to_f32(v), (unsigned)v);
        break;
    }
    case HCCL_DATA_TYPE_BFP16: {
        uint16_t v;
        memcpy(&v, p, 2);
        snprintf(out, n, "%.9g (0x%04x)", (double)h_bf16_to_f32(v), (unsigned)v);
        break;
    }
    case HCCL_DATA_TYPE_FP32: {
        float v;
        memcpy(&v, p, 4);
        snprintf(out, n, "%.9g (0x%08x)", (double)v, (unsigned)f32_bits(v));
        break;
    }
    case HCCL_DATA_TYPE_FP64: {
        double v;
        uint64_t b;
        memcpy(&v, p, 8);
        memcpy(&b, p, 8);
        snprintf(out, n, "%.17g (0x%016llx)", v, (unsigned long long)b);
        break;
    }
    default:
        snprintf(out, n, "0x%02x", (unsigned)*(const uint8_t *)p);
        break;
    }
}

/* ======================================================================================== */
/* deterministic data                                                                       */
/* ======================================================================================== */

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static uint64_t hash3(uint32_t rank, uint64_t idx, uint32_t salt)
{
    return mix64(mix64(idx) ^ ((uint64_t)rank * 0xD6E8FEB86659FD93ULL) ^
                 ((uint64_t)salt * 0xA0761D6478BD642FULL));
}

h_gen_kind h_gen_for_op(HcclReduceOp op)
{
    return op == HCCL_REDUCE_PROD ? H_GEN_PROD : H_GEN_SUM;
}

/* 2^-k for small k, exactly */
static double pow2neg(unsigned k)
{
    double v = 1.0;
    while (k--) {
        v *= 0.5;
    }
    return v;
}

static double pow2(int k)
{
    return k >= 0 ? 1.0 / pow2neg((unsigned)k) : pow2neg((unsigned)-k);
}

static void store_float(HcclDataType dt, double v, void *dst)
{
    switch (dt) {
    case HCCL_DATA_TYPE_FP16: {
        uint16_t h = h_f32_to_f16((float)v);
        memcpy(dst, &h, 2);
        break;
    }
    case HCCL_DATA_TYPE_BFP16: {
        uint16_t h = h_f32_to_bf16((float)v);
        memcpy(dst, &h, 2);
        break;
    }
    case HCCL_DATA_TYPE_FP32: {
        float f = (float)v;
        memcpy(dst, &f, 4);
        break;
    }
    default: {
        memcpy(dst, &v, 8);
        break;
    }
    }
}

static void store_int(HcclDataType dt, int64_t v, void *dst)
{
    switch (h_dtype_size(dt)) {
    case 1: {
        uint8_t b = (uint8_t)v;
        memcpy(dst, &b, 1);
        break;
    }
    case 2: {
        uint16_t b = (uint16_t)v;
        memcpy(dst, &b, 2);
        break;
    }
    case 4: {
        uint32_t b = (uint32_t)v;
        memcpy(dst, &b, 4);
        break;
    }
    default: {
        memcpy(dst, &v, 8);
        break;
    }
    }
}

static int is_signed_int(HcclDataType dt)
{
    return dt == HCCL_DATA_TYPE_INT8 || dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_INT32 ||
           dt == HCCL_DATA_TYPE_INT64;
}

void h_gen(HcclDataType dt, h_gen_kind kind, uint32_t rank, uint64_t idx, void *dst)
{
    uint64_t r = hash3(rank, idx, (uint32_t)kind + 1U);
    if (kind == H_GEN_ORDER && !h_dtype_is_float(dt)) {
        kind = H_GEN_SUM;
    }
    switch (kind) {
    case H_GEN_MOVE:
        switch (dt) {
        case HCCL_DATA_TYPE_FP16: {
            uint16_t h = (uint16_t)(((r >> 63) << 15) | ((5U + (r >> 16) % 21U) << 10) | (r & 0x3ffU));
            memcpy(dst, &h, 2);
            return;
        }
        case HCCL_DATA_TYPE_BFP16: {
            uint16_t h = (uint16_t)(((r >> 63) << 15) | ((110U + (r >> 16) % 31U) << 7) | (r & 0x7fU));
            memcpy(dst, &h, 2);
            return;
        }
        case HCCL_DATA_TYPE_FP32: {
            uint32_t b = (uint32_t)(((r >> 63) << 31) | ((110U + (r >> 32) % 31U) << 23) | (r & 0x7fffffU));
            memcpy(dst, &b, 4);
            return;
        }
        case HCCL_DATA_TYPE_FP64: {
            uint64_t b = ((r >> 63) << 63) | ((uint64_t)(1000U + (r >> 52) % 51U) << 52) |
                         (mix64(r) & 0xfffffffffffffULL);
            memcpy(dst, &b, 8);
            return;
        }
        default:
            store_int(dt, (int64_t)r, dst);
            return;
        }
    case H_GEN_SUM:
        switch (dt) {
        case HCCL_DATA_TYPE_INT8: store_int(dt, (int64_t)(r % 31U) - 15, dst); return;
        case HCCL_DATA_TYPE_INT16: store_int(dt, (int64_t)(r % 8001U) - 4000, dst); return;
        case HCCL_DATA_TYPE_INT32:
            store_int(dt, (int64_t)(r % ((2ULL << 27) + 1U)) - (int64_t)(1LL << 27), dst);
            return;
        case HCCL_DATA_TYPE_INT64:
            store_int(dt, (int64_t)(r % ((2ULL << 59) + 1U)) - (int64_t)(1LL << 59), dst);
            return;
        case HCCL_DATA_TYPE_UINT8: store_int(dt, (int64_t)(r % 32U), dst); return;
        case HCCL_DATA_TYPE_UINT16: store_int(dt, (int64_t)(r % 8001U), dst); return;
        case HCCL_DATA_TYPE_UINT32: store_int(dt, (int64_t)(r % ((1ULL << 28) + 1U)), dst); return;
        case HCCL_DATA_TYPE_UINT64: {
            uint64_t v = r % ((1ULL << 60) + 1U);
            memcpy(dst, &v, 8);
            return;
        }
        case HCCL_DATA_TYPE_FP16: {
            int64_t m = (int64_t)(r % 4095U) - 2047;
            store_float(dt, (double)m * pow2neg((unsigned)((r >> 20) % 11U)), dst);
            return;
        }
        case HCCL_DATA_TYPE_BFP16: {
            int64_t m = (int64_t)(r % 511U) - 255;
            store_float(dt, (double)m * pow2neg((unsigned)((r >> 20) % 7U)), dst);
            return;
        }
        case HCCL_DATA_TYPE_FP32: {
            int64_t m = (int64_t)(r % 131073U) - 65536;
            store_float(dt, (double)m * pow2neg((unsigned)((r >> 20) % 5U)), dst);
            return;
        }
        case HCCL_DATA_TYPE_FP64: {
            int64_t m = (int64_t)(r % ((2ULL << 40) + 1U)) - (int64_t)(1LL << 40);
            store_float(dt, (double)m * pow2neg((unsigned)((r >> 50) % 9U)), dst);
            return;
        }
        default:
            store_int(dt, 0, dst);
            return;
        }
    case H_GEN_PROD: {
        uint32_t special = (uint32_t)((rank + idx) % 8U);
        if (h_dtype_is_float(dt)) {
            double sign = (r & 1U) ? -1.0 : 1.0;
            double mant = (double)(4U + (r >> 1) % 4U) / 4.0; /* 1, 1.25, 1.5, 1.75 */
            int e = (int)((r >> 3) % 3U) - 1;                  /* -1, 0, 1 */
            store_float(dt, sign * mant * pow2(e), dst);
            return;
        }
        int64_t mag = 1;
        if (special == 0) {
            mag = 2 + (int64_t)((r >> 1) % 4U); /* 2..5 */
        } else if (special == 3) {
            mag = 2 + (int64_t)((r >> 1) % 2U); /* 2..3 */
        }
        if (is_signed_int(dt) && (r & 1U)) {
            mag = -mag;
        }
        store_int(dt, mag, dst);
        return;
    }
    case H_GEN_ORDER: {
        double sign = (r & 1U) ? -1.0 : 1.0;
        switch (dt) {
        case HCCL_DATA_TYPE_FP16: {
            double m = (double)(1024U + (r >> 1) % 1024U);
            store_float(dt, sign * m * pow2((int)((r >> 12) % 17U) - 18), dst); /* < 2^9 */
            return;
        }
        case HCCL_DATA_TYPE_BFP16: {
            double m = (double)(128U + (r >> 1) % 128U);
            store_float(dt, sign * m * pow2((int)((r >> 12) % 41U) - 27), dst);
            return;
        }
        case HCCL_DATA_TYPE_FP32: {
            double m = (double)((1U << 23) + (r >> 1) % (1U << 23));
            store_float(dt, sign * m * pow2((int)((r >> 30) % 41U) - 43), dst);
            return;
        }
        default: {
            double m = (double)((1ULL << 52) + (r >> 1) % (1ULL << 52));
            store_float(dt, sign * m * pow2((int)((r >> 56) % 61U) - 82), dst);
            return;
        }
        }
    }
    }
}

void h_fill(HcclDataType dt, h_gen_kind kind, uint32_t rank, uint64_t idx0, uint64_t count,
            void *dst)
{
    size_t es = h_dtype_size(dt);
    uint8_t *d = (uint8_t *)dst;
    for (uint64_t i = 0; i < count; i++) {
        h_gen(dt, kind, rank, idx0 + i, d + i * es);
    }
}

#define REDUCE_INT(T)                                                                           \
    do {                                                                                        \
        T acc = 0;                                                                              \
        for (uint32_t k = 0; k < n; k++) {                                                      \
            T v = 0;                                                                            \
            h_gen(dt, kind, ranks ? ranks[k] : k, idx, &v);                                     \
            if (k == 0) {                                                                       \
                acc = v;                                                                        \
            } else if (op == HCCL_REDUCE_SUM) {                                                 \
                acc = (T)(acc + v);                                                             \
            } else if (op == HCCL_REDUCE_PROD) {                                                \
                acc = (T)(acc * v);                                                             \
            } else if (op == HCCL_REDUCE_MAX) {                                                 \
                acc = v > acc ? v : acc;                                                        \
            } else {                                                                            \
                acc = v < acc ? v : acc;                                                        \
            }                                                                                   \
        }                                                                                       \
        memcpy(dst, &acc, sizeof acc);                                                          \
    } while (0)

static float load_as_f32(HcclDataType dt, const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == HCCL_DATA_TYPE_FP16 ? h_f16_to_f32(h) : h_bf16_to_f32(h);
}

void h_reduce_ref(HcclDataType dt, HcclReduceOp op, h_gen_kind kind, const uint32_t *ranks,
                  uint32_t n, uint64_t idx, void *dst)
{
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: REDUCE_INT(int8_t); return;
    case HCCL_DATA_TYPE_INT16: REDUCE_INT(int16_t); return;
    case HCCL_DATA_TYPE_INT32: REDUCE_INT(int32_t); return;
    case HCCL_DATA_TYPE_INT64: REDUCE_INT(int64_t); return;
    case HCCL_DATA_TYPE_UINT8: REDUCE_INT(uint8_t); return;
    case HCCL_DATA_TYPE_UINT16: REDUCE_INT(uint16_t); return;
    case HCCL_DATA_TYPE_UINT32: REDUCE_INT(uint32_t); return;
    case HCCL_DATA_TYPE_UINT64: REDUCE_INT(uint64_t); return;
    case HCCL_DATA_TYPE_FP32: REDUCE_INT(float); return;
    case HCCL_DATA_TYPE_FP64: REDUCE_INT(double); return;
    case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_BFP16: {
        float acc = 0.0f;
        for (uint32_t k = 0; k < n; k++) {
            uint16_t raw;
            h_gen(dt, kind, ranks ? ranks[k] : k, idx, &raw);
            float v = load_as_f32(dt, &raw);
            if (k == 0) {
                acc = v;
            } else if (op == HCCL_REDUCE_SUM) {
                acc = acc + v;
            } else if (op == HCCL_REDUCE_PROD) {
                acc = acc * v;
            } else if (op == HCCL_REDUCE_MAX) {
                acc = v > acc ? v : acc;
            } else {
                acc = v < acc ? v : acc;
            }
        }
        uint16_t out = dt == HCCL_DATA_TYPE_FP16 ? h_f32_to_f16(acc) : h_f32_to_bf16(acc);
        memcpy(dst, &out, 2);
        return;
    }
    default:
        return;
    }
}

void h_reduce_fill(HcclDataType dt, HcclReduceOp op, h_gen_kind kind, const uint32_t *ranks,
                   uint32_t n, uint64_t idx0, uint64_t count, void *dst)
{
    size_t es = h_dtype_size(dt);
    uint8_t *d = (uint8_t *)dst;
    for (uint64_t i = 0; i < count; i++) {
        h_reduce_ref(dt, op, kind, ranks, n, idx0 + i, d + i * es);
    }
}

/* ======================================================================================== */
/* guarded device buffers                                                                   */
/* ======================================================================================== */

uint8_t h_sentinel(size_t offset)
{
    return (uint8_t)((((uint32_t)offset * 0x9E3779B1U) >> 24) ^ 0x5AU);
}

void h_fill_sentinel(void *host, size_t nbytes)
{
    uint8_t *p = (uint8_t *)host;
    for (size_t i = 0; i < nbytes; i++) {
        p[i] = h_sentinel(i);
    }
}

int h_dbuf_alloc(h_ctx *ctx, h_dbuf *b, size_t bytes)
{
    return h_dbuf_alloc_at(ctx, b, bytes, 0);
}

int h_dbuf_alloc_at(h_ctx *ctx, h_dbuf *b, size_t bytes, size_t misalign)
{
    memset(b, 0, sizeof *b);
    b->bytes = bytes;
    b->lead = H_GUARD_BYTES + misalign;
    b->total = b->lead + bytes + H_GUARD_BYTES;
    H_ACL(ctx, aclrtMalloc(&b->base, b->total, ACL_MEM_MALLOC_HUGE_FIRST));
    b->ptr = (uint8_t *)b->base + b->lead;
    uint8_t *host = (uint8_t *)h_xmalloc(b->total);
    h_fill_sentinel(host, b->total);
    aclError rc = aclrtMemcpy(b->base, b->total, host, b->total, ACL_MEMCPY_HOST_TO_DEVICE);
    free(host);
    if (rc != ACL_SUCCESS) {
        h_fail_call(ctx, __FILE__, __LINE__, "aclrtMemcpy(guarded buffer, H2D)", rc, 0);
        return -1;
    }
    return 0;
}

int h_dbuf_free(h_ctx *ctx, h_dbuf *b)
{
    if (b->base) {
        H_ACL(ctx, aclrtFree(b->base));
    }
    memset(b, 0, sizeof *b);
    return 0;
}

int h_dbuf_upload(h_ctx *ctx, h_dbuf *b, size_t off, const void *host, size_t nbytes)
{
    if (nbytes == 0) {
        return 0;
    }
    H_REQUIRE(ctx, off + nbytes <= b->bytes, "h_dbuf_upload out of range");
    H_ACL(ctx, aclrtMemcpy((uint8_t *)b->ptr + off, b->bytes - off, host, nbytes,
                           ACL_MEMCPY_HOST_TO_DEVICE));
    return 0;
}

int h_dbuf_download_all(h_ctx *ctx, const h_dbuf *b, void *host)
{
    H_ACL(ctx, aclrtMemcpy(host, b->total, b->base, b->total, ACL_MEMCPY_DEVICE_TO_HOST));
    return 0;
}

int h_check_region(h_ctx *ctx, const char *file, int line, const char *what, HcclDataType dt,
                   const uint8_t *actual, const uint8_t *expected, const uint8_t *care,
                   size_t total, size_t lead)
{
    ctx->checks++;
    size_t es = h_dtype_size(dt);
    size_t payload_end = total >= H_GUARD_BYTES ? total - H_GUARD_BYTES : 0;
    size_t bad_bytes = 0, reported = 0;
    size_t last_elem = (size_t)-1;
    char detail[1024];
    size_t dlen = 0;
    detail[0] = '\0';
    for (size_t i = 0; i < total; i++) {
        if ((care && !care[i]) || actual[i] == expected[i]) {
            continue;
        }
        bad_bytes++;
        if (reported >= 4 || dlen >= sizeof detail - 200) {
            continue;
        }
        if (i < lead || i >= payload_end) {
            dlen += (size_t)snprintf(detail + dlen, sizeof detail - dlen,
                                     "; %s guard byte %zu: expected 0x%02x got 0x%02x",
                                     i < lead ? "leading" : "trailing",
                                     i < lead ? i : i - payload_end, expected[i], actual[i]);
            reported++;
            continue;
        }
        size_t elem = (i - lead) / es;
        if (elem == last_elem) {
            continue;
        }
        last_elem = elem;
        size_t at = lead + elem * es;
        char e[96], a[96];
        if (at + es <= total) {
            h_format_elem(e, sizeof e, dt, expected + at);
            h_format_elem(a, sizeof a, dt, actual + at);
        } else {
            snprintf(e, sizeof e, "0x%02x", expected[i]);
            snprintf(a, sizeof a, "0x%02x", actual[i]);
        }
        dlen += (size_t)snprintf(detail + dlen, sizeof detail - dlen,
                                 "; element %zu: expected %s got %s", elem, e, a);
        reported++;
    }
    if (bad_bytes == 0) {
        return 1;
    }
    h_failf(ctx, file, line, "%s: %zu of %zu bytes differ%s", what, bad_bytes, total, detail);
    return 0;
}

void h_expect_refused(h_ctx *ctx, int line, const char *call, HcclResult rc, HcclResult code,
                      const char *const *needles)
{
    const char *m = aclGetRecentErrMsg();
    char text[2048];
    snprintf(text, sizeof text, "%s", m ? m : "");
    ctx->checks++;
    if (rc != code) {
        h_failf(ctx, __FILE__, line, "`%s` returned %d, expected %d; aclGetRecentErrMsg: \"%s\"",
                call, (int)rc, (int)code, text);
        return;
    }
    for (; *needles != NULL; needles++) {
        H_EXPECT(ctx, strstr(text, *needles) != NULL, "`%s`: aclGetRecentErrMsg \"%s\" does "
                 "not mention \"%s\"", call, text, *needles);
    }
}
