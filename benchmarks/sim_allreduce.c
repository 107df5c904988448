/*
 * sim_allreduce.c - HcclAllReduce bandwidth/latency benchmark, nccl-tests / hccl_test style.
 *
 * Written against the public HCCL + AscendCL C API only (<hccl/hccl.h>), so it builds and runs
 * unchanged against CANN or against the hcclpy CPU simulator.  One process per rank: the parent
 * forks P children before any ACL/HCCL call; child r sets device r; rank 0 creates the root info
 * and sends it to the other ranks through pipes; rank 0 gathers the per-rank timings through
 * pipes and prints the table.  The parent only waits, and kills the ranks on a failure or timeout.
 *
 * For every size:
 *   - warm-up: `warmup` back-to-back calls, then a stream synchronisation;
 *   - "time": aclrtRecordEvent(start), `iters` back-to-back HcclAllReduce calls on one stream,
 *     aclrtRecordEvent(end), aclrtSynchronizeStream, aclrtEventElapsedTime / iters
 *     (hccl_test's method), averaged over ranks (nccl-tests -a 1);
 *   - "e2e": a loop of single HcclAllReduce + aclrtSynchronizeStream timed on the host, median
 *     per rank, averaged over ranks: the latency a blocking caller sees;
 *   - with -c 1, the output is compared against the expected reduction of the rank-dependent
 *     inputs after the timed loops (the output buffer is poisoned before the warm-up).
 *
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes (nccl-tests).
 *
 * Before the sweep the parent measures single-core memcpy bandwidth of a 64 MiB buffer (median of
 * several repetitions) so the large-message busbw can be read against this machine's memory
 * bandwidth; the ratio is printed at the end.
 *
 * Build:  cc -O2 -I$TREE/include sim_allreduce.c -L$TREE/lib64 -lhccl -lascendcl -o sim_allreduce
 * Run:    ./sim_allreduce -b 8 -e 64M -f 2 -p 2
 */
#define _GNU_SOURCE
#include <hccl/hccl.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MEMCPY_BYTES (64UL << 20)
#define MEMCPY_REPS 11
#define MAX_RANKS 64

/* ------------------------------------------------------------------------------------------ */
/* options                                                                                     */

typedef struct {
    size_t min_bytes, max_bytes;
    double factor;
    long iters;   /* < 0: automatic per size */
    long warmup;  /* < 0: automatic per size */
    int dtype;    /* HcclDataType */
    int op;       /* HcclReduceOp */
    int nranks;
    int check;
    int timeout_s;
    int verbose;
} options_t;

static const struct {
    const char *name;
    int dtype;
    size_t size;
} dtypes[] = {
    {"int8", HCCL_DATA_TYPE_INT8, 1},     {"int16", HCCL_DATA_TYPE_INT16, 2},
    {"int32", HCCL_DATA_TYPE_INT32, 4},   {"int64", HCCL_DATA_TYPE_INT64, 8},
    {"uint8", HCCL_DATA_TYPE_UINT8, 1},   {"uint16", HCCL_DATA_TYPE_UINT16, 2},
    {"uint32", HCCL_DATA_TYPE_UINT32, 4}, {"uint64", HCCL_DATA_TYPE_UINT64, 8},
    {"fp16", HCCL_DATA_TYPE_FP16, 2},     {"fp32", HCCL_DATA_TYPE_FP32, 4},
    {"fp64", HCCL_DATA_TYPE_FP64, 8},     {"bfp16", HCCL_DATA_TYPE_BFP16, 2},
    /* aliases (nccl-tests names) */
    {"bf16", HCCL_DATA_TYPE_BFP16, 2},    {"half", HCCL_DATA_TYPE_FP16, 2},
    {"float", HCCL_DATA_TYPE_FP32, 4},    {"double", HCCL_DATA_TYPE_FP64, 8},
};
#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static const struct {
    const char *name;
    int op;
} redops[] = {
    {"sum", HCCL_REDUCE_SUM},
    {"prod", HCCL_REDUCE_PROD},
    {"max", HCCL_REDUCE_MAX},
    {"min", HCCL_REDUCE_MIN},
};
#define N_REDOPS (sizeof(redops) / sizeof(redops[0]))

static const char *dtype_name(int dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].name;
    return "?";
}

static size_t dtype_size(int dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].size;
    return 0;
}

static const char *redop_name(int op)
{
    for (size_t i = 0; i < N_REDOPS; i++)
        if (redops[i].op == op) return redops[i].name;
    return "?";
}

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup]\n"
            "          [-d dtype] [-o op] [-p nranks] [-c 0|1] [-T timeout_s] [-v]\n"
            "  -b  smallest size in bytes (K/M/G suffixes), default 8\n"
            "  -e  largest size in bytes, default 64M\n"
            "  -f  multiplication factor between sizes, default 2\n"
            "  -n  timed iterations per size (default: automatic, many for small sizes)\n"
            "  -w  warm-up iterations per size (default: automatic)\n"
            "  -d  int8 int16 int32 int64 uint8 uint16 uint32 uint64 fp16 fp32 fp64 bfp16"
            " (default fp32)\n"
            "  -o  sum prod max min (default sum)\n"
            "  -p  number of ranks = processes, device r for rank r (default 2)\n"
            "  -c  check results, 0 or 1 (default 1)\n"
            "  -T  kill the run after this many seconds (default 600)\n"
            "  -v  also print the host wall time of the event-timed loop\n",
            prog);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_long(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static void parse_args(int argc, char **argv, options_t *o)
{
    o->min_bytes = 8;
    o->max_bytes = 64UL << 20;
    o->factor = 2.0;
    o->iters = -1;
    o->warmup = -1;
    o->dtype = HCCL_DATA_TYPE_FP32;
    o->op = HCCL_REDUCE_SUM;
    o->nranks = 2;
    o->check = 1;
    o->timeout_s = 600;
    o->verbose = 0;

    int c;
    long v;
    while ((c = getopt(argc, argv, "b:e:f:n:w:d:o:p:c:T:vh")) != -1) {
        switch (c) {
        case 'b':
            if (parse_size(optarg, &o->min_bytes)) goto bad;
            break;
        case 'e':
            if (parse_size(optarg, &o->max_bytes)) goto bad;
            break;
        case 'f': {
            char *end;
            o->factor = strtod(optarg, &end);
            if (*end || o->factor <= 1.0) goto bad;
            break;
        }
        case 'n':
            if (parse_long(optarg, &o->iters) || o->iters < 1) goto bad;
            break;
        case 'w':
            if (parse_long(optarg, &o->warmup) || o->warmup < 0) goto bad;
            break;
        case 'd': {
            size_t i;
            for (i = 0; i < N_DTYPES; i++)
                if (!strcmp(optarg, dtypes[i].name)) break;
            if (i == N_DTYPES) goto bad;
            o->dtype = dtypes[i].dtype;
            break;
        }
        case 'o': {
            size_t i;
            for (i = 0; i < N_REDOPS; i++)
                if (!strcmp(optarg, redops[i].name)) break;
            if (i == N_REDOPS) goto bad;
            o->op = redops[i].op;
            break;
        }
        case 'p':
            if (parse_long(optarg, &v) || v < 1 || v > MAX_RANKS) goto bad;
            o->nranks = (int)v;
            break;
        case 'c':
            if (parse_long(optarg, &v) || v < 0 || v > 2) goto bad;
            o->check = v != 0;
            break;
        case 'T':
            if (parse_long(optarg, &v) || v < 1) goto bad;
            o->timeout_s = (int)v;
            break;
        case 'v':
            o->verbose = 1;
            break;
        case 'h':
            usage(stdout, argv[0]);
            exit(0);
        default:
            usage(stderr, argv[0]);
            exit(2);
        }
        continue;
    bad:
        fprintf(stderr, "%s: bad value for -%c: '%s'\n", argv[0], c, optarg);
        usage(stderr, argv[0]);
        exit(2);
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
        exit(2);
    }
    size_t ts = dtype_size(o->dtype);
    if (o->min_bytes < ts) o->min_bytes = ts;
    if (o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
}

/* Iterations per size when -n/-w are not given: about 256 MiB of payload per timed loop, at least
 * 20 and at most 1000 iterations (8 B..256 KiB: 1000, 1 MiB: 256, 4 MiB: 64, >= 16 MiB: 20). */
static long auto_iters(const options_t *o, size_t bytes)
{
    if (o->iters > 0) return o->iters;
    double n = (double)(256UL << 20) / (double)bytes;
    if (n > 1000) n = 1000;
    if (n < 20) n = 20;
    return (long)n;
}

static long auto_warmup(const options_t *o, long iters)
{
    if (o->warmup >= 0) return o->warmup;
    long w = iters / 5;
    if (w < 3) w = 3;
    if (w > 100) w = 100;
    return w;
}

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                     */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int g_rank = -1;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] ", g_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    _exit(1);
}

#define ACL_CHECK(call)                                                                        \
    do {                                                                                       \
        aclError err_ = (call);                                                                \
        if (err_ != ACL_SUCCESS) {                                                             \
            const char *msg_ = aclGetRecentErrMsg();                                           \
            die("%s:%d: %s failed: aclError %d (%s)", __FILE__, __LINE__, #call, (int)err_,   \
                msg_ ? msg_ : "");                                                             \
        }                                                                                      \
    } while (0)

#define HCCL_CHECK(call)                                                                       \
    do {                                                                                       \
        HcclResult res_ = (call);                                                              \
        if (res_ != HCCL_SUCCESS) {                                                            \
            const char *msg_ = aclGetRecentErrMsg();                                           \
            die("%s:%d: %s failed: HcclResult %d %s (%s)", __FILE__, __LINE__, #call,          \
                (int)res_, HcclGetErrorString(res_), msg_ ? msg_ : "");                        \
        }                                                                                      \
    } while (0)

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("pipe write failed: %s", strerror(errno));
        p += k;
        n -= (size_t)k;
    }
}

static void read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) die("pipe closed by a peer rank (it probably failed)");
        if (k < 0) die("pipe read failed: %s", strerror(errno));
        p += k;
        n -= (size_t)k;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* data patterns: small non-negative integers, exact in every dtype                            */

static uint16_t float_to_half(float f) /* exact for the small integers used here */
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0) return (uint16_t)sign; /* zero */
    if (exp <= 0 || exp >= 31) return (uint16_t)(sign | 0x7c00); /* not needed: out of range */
    /* round to nearest even */
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;
    return (uint16_t)(x >> 16);
}

static void store(void *buf, size_t i, int dtype, double v)
{
    switch (dtype) {
    case HCCL_DATA_TYPE_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCCL_DATA_TYPE_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case HCCL_DATA_TYPE_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCCL_DATA_TYPE_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HCCL_DATA_TYPE_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HCCL_DATA_TYPE_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case HCCL_DATA_TYPE_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case HCCL_DATA_TYPE_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case HCCL_DATA_TYPE_FP16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case HCCL_DATA_TYPE_FP32: ((float *)buf)[i] = (float)v; break;
    case HCCL_DATA_TYPE_FP64: ((double *)buf)[i] = v; break;
    case HCCL_DATA_TYPE_BFP16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
    default: die("unsupported dtype %d", dtype);
    }
}

/* Input of rank r at element i. Sums stay <= 4*nranks (exact in int8 up to 31 ranks, in bf16 up
 * to 64); for prod exactly one rank holds 2 and the others 1, so the product is 2. */
static double input_value(int op, int r, int nranks, size_t i)
{
    switch (op) {
    case HCCL_REDUCE_PROD: return (int)(i % (size_t)nranks) == r ? 2.0 : 1.0;
    case HCCL_REDUCE_MAX:
    case HCCL_REDUCE_MIN: return (double)((3 * (size_t)r + i) % 7);
    default: return (double)(((size_t)r + i) % 4 + 1);
    }
}

static double expected_value(int op, int nranks, size_t i)
{
    double acc = input_value(op, 0, nranks, i);
    for (int r = 1; r < nranks; r++) {
        double v = input_value(op, r, nranks, i);
        switch (op) {
        case HCCL_REDUCE_PROD: acc *= v; break;
        case HCCL_REDUCE_MAX: acc = v > acc ? v : acc; break;
        case HCCL_REDUCE_MIN: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    return acc;
}

/* ------------------------------------------------------------------------------------------ */
/* memcpy reference                                                                            */

typedef struct {
    double median, min, max;
} bw_t;

static bw_t measure_memcpy(void)
{
    bw_t r = {0, 0, 0};
    char *src = malloc(MEMCPY_BYTES), *dst = malloc(MEMCPY_BYTES);
    if (!src || !dst) {
        fprintf(stderr, "memcpy reference: out of memory\n");
        free(src);
        free(dst);
        return r;
    }
    memset(src, 1, MEMCPY_BYTES); /* fault every page in before timing */
    memset(dst, 2, MEMCPY_BYTES);
    memcpy(dst, src, MEMCPY_BYTES); /* warm-up */
    double gbs[MEMCPY_REPS];
    for (int k = 0; k < MEMCPY_REPS; k++) {
        src[k] = (char)k;
        double t0 = now_us();
        memcpy(dst, src, MEMCPY_BYTES);
        double t1 = now_us();
        gbs[k] = (double)MEMCPY_BYTES / ((t1 - t0) * 1e-6) / 1e9;
    }
    if (dst[MEMCPY_REPS - 1] != (char)(MEMCPY_REPS - 1)) fprintf(stderr, "memcpy check failed\n");
    r.median = median(gbs, MEMCPY_REPS);
    r.min = gbs[0];
    r.max = gbs[MEMCPY_REPS - 1];
    free(src);
    free(dst);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* one rank                                                                                    */

typedef struct {
    double event_us;  /* event time per call */
    double host_us;   /* host wall time of the event-timed loop, per call */
    double e2e_us;    /* median of single call + stream sync */
    int64_t wrong;    /* -1: not checked */
} result_t;

typedef struct {
    int root_rd;             /* rank > 0: read end of the root-info pipe */
    int root_wr[MAX_RANKS];  /* rank 0: write ends, index = destination rank */
    int res_wr;              /* rank > 0: write end of its result pipe */
    int res_rd[MAX_RANKS];   /* rank 0: read ends, index = source rank */
} pipes_t;

static void print_header(const options_t *o, const bw_t *mc)
{
    printf("# hcclpy sim_allreduce: nranks %d minBytes %zu maxBytes %zu step: %g(factor) "
           "warmup iters: %s iters: %s validation: %d\n",
           o->nranks, o->min_bytes, o->max_bytes, o->factor, o->warmup < 0 ? "auto" : "fixed",
           o->iters < 0 ? "auto" : "fixed", o->check);
    if (o->iters > 0) printf("#   iters %ld warmup %ld\n", o->iters, auto_warmup(o, o->iters));
    printf("#\n");
    printf("# memcpy reference (1 core, %lu MiB, median of %d): %.2f GB/s copied"
           " (range %.2f-%.2f)\n",
           MEMCPY_BYTES >> 20, MEMCPY_REPS, mc->median, mc->min, mc->max);
    printf("#\n");
    printf("# time: device events around `iters` back-to-back HcclAllReduce on one stream, "
           "mean per call, averaged over ranks\n");
    printf("# e2e:  HcclAllReduce + aclrtSynchronizeStream timed on the host, median per rank, "
           "averaged over ranks\n");
    printf("# busbw = algbw * 2(n-1)/n; GB = 1e9 bytes\n");
    printf("#\n");
    printf("#                                                         out-of-place\n");
    printf("#       size         count      type   redop    root     time   algbw   busbw  "
           "#wrong      e2e   iters%s\n",
           o->verbose ? "  host-time" : "");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
           "           (us)        %s\n",
           o->verbose ? "       (us)" : "");
    fflush(stdout);
}

static int run_rank(int rank, const options_t *o, const pipes_t *pp, const bw_t *mc)
{
    const int n = o->nranks;
    const size_t ts = dtype_size(o->dtype);
    const size_t max_count = o->max_bytes / ts;
    const size_t max_bytes = max_count * ts;
    g_rank = rank;

    aclError e = aclInit(NULL);
    if (e != ACL_SUCCESS && e != ACL_ERROR_REPEAT_INITIALIZE) ACL_CHECK(e);
    ACL_CHECK(aclrtSetDevice(rank));

    HcclRootInfo root;
    memset(&root, 0, sizeof(root));
    if (rank == 0) {
        HCCL_CHECK(HcclGetRootInfo(&root));
        for (int r = 1; r < n; r++) {
            write_all(pp->root_wr[r], &root, sizeof(root));
            close(pp->root_wr[r]);
        }
    } else {
        read_all(pp->root_rd, &root, sizeof(root));
        close(pp->root_rd);
    }

    HcclComm comm = NULL;
    HCCL_CHECK(HcclCommInitRootInfo((uint32_t)n, &root, (uint32_t)rank, &comm));
    uint32_t got_size = 0, got_rank = 0;
    HCCL_CHECK(HcclGetRankSize(comm, &got_size));
    HCCL_CHECK(HcclGetRankId(comm, &got_rank));
    if (got_size != (uint32_t)n || got_rank != (uint32_t)rank)
        die("communicator reports rank %u of %u, expected %d of %d", got_rank, got_size, rank, n);

    aclrtStream stream = NULL;
    ACL_CHECK(aclrtCreateStream(&stream));
    aclrtEvent ev_start = NULL, ev_end = NULL;
    ACL_CHECK(aclrtCreateEventWithFlag(&ev_start, ACL_EVENT_TIME_LINE));
    ACL_CHECK(aclrtCreateEventWithFlag(&ev_end, ACL_EVENT_TIME_LINE));

    void *sendbuf = NULL, *recvbuf = NULL;
    ACL_CHECK(aclrtMalloc(&sendbuf, max_bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMalloc(&recvbuf, max_bytes, ACL_MEM_MALLOC_HUGE_FIRST));

    char *host_out = NULL, *host_exp = NULL;
    {
        char *host_in = malloc(max_bytes);
        if (!host_in) die("out of host memory");
        for (size_t i = 0; i < max_count; i++)
            store(host_in, i, o->dtype, input_value(o->op, rank, n, i));
        ACL_CHECK(aclrtMemcpy(sendbuf, max_bytes, host_in, max_bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        free(host_in);
    }
    ACL_CHECK(aclrtMemset(recvbuf, max_bytes, 0, max_bytes));
    if (o->check) {
        host_out = malloc(max_bytes);
        host_exp = malloc(max_bytes);
        if (!host_out || !host_exp) die("out of host memory");
        for (size_t i = 0; i < max_count; i++)
            store(host_exp, i, o->dtype, expected_value(o->op, n, i));
    }

    long max_iters = auto_iters(o, ts);
    double *lat = malloc(sizeof(double) * (size_t)(max_iters > 1000 ? max_iters : 1000));
    if (!lat) die("out of host memory");

    if (rank == 0) print_header(o, mc);

    double sum_busbw = 0, last_busbw = 0, e2e_small = -1;
    size_t last_bytes = 0;
    int nsizes = 0;
    int64_t total_wrong = 0;

    for (size_t req = o->min_bytes; req <= o->max_bytes;) {
        size_t count = req / ts;
        if (count == 0) count = 1;
        size_t bytes = count * ts;
        long iters = auto_iters(o, bytes);
        long warmup = auto_warmup(o, iters);

        if (o->check) /* poison the output: all-ones bytes, NaN for floats */
            ACL_CHECK(aclrtMemset(recvbuf, max_bytes, 0xff, bytes));

        for (long i = 0; i < warmup; i++)
            HCCL_CHECK(HcclAllReduce(sendbuf, recvbuf, count, (HcclDataType)o->dtype,
                                     (HcclReduceOp)o->op, comm, stream));
        ACL_CHECK(aclrtSynchronizeStream(stream));

        /* back-to-back calls bracketed by device events (hccl_test) */
        double h0 = now_us();
        ACL_CHECK(aclrtRecordEvent(ev_start, stream));
        for (long i = 0; i < iters; i++)
            HCCL_CHECK(HcclAllReduce(sendbuf, recvbuf, count, (HcclDataType)o->dtype,
                                     (HcclReduceOp)o->op, comm, stream));
        ACL_CHECK(aclrtRecordEvent(ev_end, stream));
        ACL_CHECK(aclrtSynchronizeStream(stream));
        double h1 = now_us();
        float ms = 0;
        ACL_CHECK(aclrtEventElapsedTime(&ms, ev_start, ev_end));

        /* end-to-end latency of a blocking call: enqueue + stream sync */
        long lat_iters = iters;
        for (long i = 0; i < lat_iters; i++) {
            double t0 = now_us();
            HCCL_CHECK(HcclAllReduce(sendbuf, recvbuf, count, (HcclDataType)o->dtype,
                                     (HcclReduceOp)o->op, comm, stream));
            ACL_CHECK(aclrtSynchronizeStream(stream));
            lat[i] = now_us() - t0;
        }

        result_t mine;
        mine.event_us = (double)ms * 1e3 / (double)iters;
        mine.host_us = (h1 - h0) / (double)iters;
        mine.e2e_us = median(lat, (size_t)lat_iters);
        mine.wrong = -1;
        if (o->check) {
            ACL_CHECK(aclrtMemcpy(host_out, bytes, recvbuf, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
            int64_t wrong = 0;
            for (size_t i = 0; i < count; i++)
                wrong += memcmp(host_out + i * ts, host_exp + i * ts, ts) != 0;
            mine.wrong = wrong;
        }

        if (rank != 0) {
            write_all(pp->res_wr, &mine, sizeof(mine));
        } else {
            result_t all = mine;
            for (int r = 1; r < n; r++) {
                result_t other;
                read_all(pp->res_rd[r], &other, sizeof(other));
                all.event_us += other.event_us;
                all.host_us += other.host_us;
                all.e2e_us += other.e2e_us;
                if (all.wrong >= 0) all.wrong += other.wrong;
            }
            all.event_us /= n;
            all.host_us /= n;
            all.e2e_us /= n;
            double algbw = (double)bytes / (all.event_us * 1e-6) / 1e9;
            double busbw = algbw * 2.0 * (n - 1) / n;
            char wrong_s[32];
            if (all.wrong < 0)
                snprintf(wrong_s, sizeof(wrong_s), "N/A");
            else
                snprintf(wrong_s, sizeof(wrong_s), "%lld", (long long)all.wrong);
            printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6s  %7.2f  %6ld",
                   bytes, count, dtype_name(o->dtype), redop_name(o->op), -1, all.event_us,
                   algbw, busbw, wrong_s, all.e2e_us, iters);
            if (o->verbose) printf("  %9.2f", all.host_us);
            printf("\n");
            fflush(stdout);
            sum_busbw += busbw;
            last_busbw = busbw;
            last_bytes = bytes;
            if (e2e_small < 0) e2e_small = all.e2e_us;
            if (all.wrong > 0) total_wrong += all.wrong;
            nsizes++;
        }

        size_t next = (size_t)((double)req * o->factor);
        if (next <= req) next = req + 1;
        req = next;
    }

    if (rank == 0) {
        printf("# Out of bounds values : %lld %s\n", (long long)total_wrong,
               total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", nsizes ? sum_busbw / nsizes : 0.0);
        printf("#\n");
        printf("# memcpy reference     : %.2f GB/s (1 core, 64 MiB)\n", mc->median);
        if (mc->median > 0)
            printf("# busbw(%zu B) / memcpy = %.2f / %.2f = %.0f %%\n", last_bytes, last_busbw,
                   mc->median, 100.0 * last_busbw / mc->median);
        size_t small = o->min_bytes / ts * ts;
        printf("# e2e latency (%zu B)    : %.2f us\n", small, e2e_small);
        if (n == 2 && last_bytes == (64UL << 20) && mc->median > 0)
            printf("# target busbw(64 MiB) >= 3.5 GB/s and >= 50 %% of memcpy: %s\n",
                   last_busbw >= 3.5 && last_busbw >= 0.5 * mc->median ? "met" : "NOT met");
        if (n == 2 && small == 8)
            printf("# target e2e(8 B) <= 20 us: %s\n", e2e_small <= 20.0 ? "met" : "NOT met");
        fflush(stdout);
    }

    ACL_CHECK(aclrtDestroyEvent(ev_start));
    ACL_CHECK(aclrtDestroyEvent(ev_end));
    ACL_CHECK(aclrtFree(sendbuf));
    ACL_CHECK(aclrtFree(recvbuf));
    ACL_CHECK(aclrtDestroyStream(stream));
    HCCL_CHECK(HcclCommDestroy(comm));
    ACL_CHECK(aclrtResetDevice(rank));
    ACL_CHECK(aclFinalize());
    free(lat);
    free(host_out);
    free(host_exp);
    return (rank == 0 && total_wrong) ? 3 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* launcher                                                                                    */

static pid_t g_pids[MAX_RANKS];
static int g_nranks;
static volatile sig_atomic_t g_timed_out;

static void on_alarm(int sig)
{
    (void)sig;
    g_timed_out = 1;
}

static void kill_ranks(int sig)
{
    for (int r = 0; r < g_nranks; r++)
        if (g_pids[r] > 0) kill(g_pids[r], sig);
}

int main(int argc, char **argv)
{
    options_t o;
    parse_args(argc, argv, &o);
    g_nranks = o.nranks;

    /* memory-bandwidth reference first, while nothing else of ours runs */
    bw_t mc = measure_memcpy();

    pipes_t pp;
    int root_pipe[MAX_RANKS][2], res_pipe[MAX_RANKS][2];
    for (int r = 1; r < o.nranks; r++) {
        if (pipe(root_pipe[r]) || pipe(res_pipe[r])) {
            perror("pipe");
            return 1;
        }
    }

    fflush(stdout);
    fflush(stderr);
    /* Fork all ranks before any ACL/HCCL call is made in this process. */
    for (int r = 0; r < o.nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            kill_ranks(SIGKILL);
            return 1;
        }
        if (pid == 0) {
            memset(&pp, -1, sizeof(pp));
            for (int q = 1; q < o.nranks; q++) {
                if (r == 0) {
                    pp.root_wr[q] = root_pipe[q][1];
                    pp.res_rd[q] = res_pipe[q][0];
                    close(root_pipe[q][0]);
                    close(res_pipe[q][1]);
                } else if (q == r) {
                    pp.root_rd = root_pipe[q][0];
                    pp.res_wr = res_pipe[q][1];
                    close(root_pipe[q][1]);
                    close(res_pipe[q][0]);
                } else {
                    close(root_pipe[q][0]);
                    close(root_pipe[q][1]);
                    close(res_pipe[q][0]);
                    close(res_pipe[q][1]);
                }
            }
            int rc = run_rank(r, &o, &pp, &mc);
            fflush(stdout);
            _exit(rc);
        }
        g_pids[r] = pid;
    }
    for (int r = 1; r < o.nranks; r++) {
        close(root_pipe[r][0]);
        close(root_pipe[r][1]);
        close(res_pipe[r][0]);
        close(res_pipe[r][1]);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL); /* no SA_RESTART: waitpid returns EINTR */
    alarm((unsigned)o.timeout_s);

    int status_rc = 0, alive = o.nranks, killed = 0, escalated = 0;
    while (alive > 0) {
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno != EINTR) break;
            if (g_timed_out && !escalated) {
                g_timed_out = 0;
                if (!killed) {
                    fprintf(stderr, "sim_allreduce: timeout after %d s, killing the ranks\n",
                            o.timeout_s);
                    status_rc = 124;
                    kill_ranks(SIGTERM);
                    killed = 1;
                    alarm(5);
                } else {
                    kill_ranks(SIGKILL); /* a rank ignored SIGTERM */
                    escalated = 1;
                }
            }
            continue;
        }
        int r;
        for (r = 0; r < o.nranks; r++)
            if (g_pids[r] == pid) break;
        if (r == o.nranks) continue;
        g_pids[r] = 0;
        alive--;
        int failed = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        if (failed && !killed) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "sim_allreduce: rank %d killed by signal %d\n", r, WTERMSIG(st));
            else
                fprintf(stderr, "sim_allreduce: rank %d exited with status %d\n", r,
                        WEXITSTATUS(st));
            if (!status_rc) status_rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 3) continue; /* wrong results: no kill */
            kill_ranks(SIGTERM);
            killed = 1;
            alarm(5); /* SIGKILL whatever is left after 5 s */
        }
    }
    return status_rc;
}
