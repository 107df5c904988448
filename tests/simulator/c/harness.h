/*
 * Shared harness for the simulator's C test programs.
 *
 * The programs are written against the public C API only, like a user program for real CANN:
 * <hccl/hccl.h> and nothing else from the simulator.
 *
 * What the harness gives a test program:
 *   - a launcher that runs N ranks as N threads of one process, as N forked processes (forked
 *     before any ACL/HCCL call; the parent only launches, watches a hard deadline and collects
 *     exit codes), or as P processes x T threads;
 *   - an out-of-band channel between the ranks (memory between threads, pipes between
 *     processes) to ship root info and to agree on things, independent of the library under test;
 *   - CHECK macros that print file:line, the failing call, its return code and
 *     aclGetRecentErrMsg(), one line per failure;
 *   - fp16 / bf16 conversions (round to nearest even), a deterministic input generator that
 *     keeps SUM and PROD exact for every element type, and reference reductions computed the way
 *     the simulator is specified to compute them (rank order, fp16/bf16 in fp32, rounded once);
 *   - device buffers with guard bytes around them, to catch writes outside an output.
 *
 * Rank r of a launch uses device r (the simulator has 8 devices by default).
 */
#ifndef HCCLPY_TEST_HARNESS_H
#define HCCLPY_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <hccl/hccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define H_MAX_RANKS 64
#define H_GUARD_BYTES 256 /* sentinel bytes before and after every guarded device buffer */

/* ---- options ------------------------------------------------------------------------------ */

typedef enum { H_MODE_THREADS = 0, H_MODE_PROCS = 1, H_MODE_MIXED = 2 } h_mode;

typedef struct h_options {
    uint32_t nranks;    /* --ranks N (default 2) */
    h_mode mode;        /* --mode threads|procs|mixed (default threads) */
    uint32_t nprocs;    /* processes per launch (derived; --procs P for mixed, default 2) */
    uint32_t nthreads;  /* ranks per process (derived) */
    double deadline;    /* --deadline S: hard limit for one launch, seconds (default 120) */
    const char *filter; /* --filter STR: run only cases whose name contains STR */
    int verbose;        /* --verbose: print every case as it starts */
    int argc;           /* the remaining (program-specific) arguments */
    char **argv;
} h_options;

extern h_options h_opt;

/* Value of a program-specific option "--name value" (NULL if absent). */
const char *h_arg(const char *name);
long h_arg_long(const char *name, long dflt);
/* 1 if a program-specific flag "--name" is present. */
int h_flag(const char *name);

/* ---- per-rank context --------------------------------------------------------------------- */

typedef struct h_ctx {
    uint32_t rank, nranks;  /* global rank in this launch */
    uint32_t proc, nprocs;  /* process index in this launch */
    uint32_t local, nlocal; /* index of this rank inside its process */
    int32_t device;         /* device this rank uses (= rank) */
    aclrtStream stream;     /* created by h_rank_setup */
    long cases, checks, failures;
    char case_name[256];
    void *arg; /* user argument of h_launch */
} h_ctx;

typedef int (*h_rank_fn)(h_ctx *ctx); /* 0 = ran (failures are counted in ctx), <0 = fatal */

/* ---- launching ---------------------------------------------------------------------------- */

typedef struct h_parent h_parent;

typedef struct h_launch_cfg {
    int no_fail_fast;                    /* keep the other processes running when one fails */
    double deadline;                     /* 0: h_opt.deadline */
    void (*parent_hook)(h_parent *p);    /* procs/mixed: runs in the parent after the fork */
    void *hook_arg;
} h_launch_cfg;

/* What a parent hook sees and may change. */
struct h_parent {
    uint32_t nprocs;
    pid_t pids[H_MAX_RANKS];
    int may_be_killed[H_MAX_RANKS]; /* set by the hook: a SIGKILL of this process is expected */
    double start, deadline;         /* h_now() values */
    void *arg;
    int notify_fd; /* read end of the children's notification pipe */
};

/*
 * Run fn on every rank of the current options (threads, processes, or both). Returns 0 when every
 * rank passed. In process mode, fn never runs in the calling process.
 */
int h_launch(const char *label, h_rank_fn fn, void *arg, const h_launch_cfg *cfg);

/* Parent hook helper: wait for a child's h_notify_parent; returns the code or -1 on timeout. */
int h_parent_wait_notify(h_parent *p, uint32_t *proc, double timeout);

/* From a rank of a forked launch: tell the parent something (one byte). */
void h_notify_parent(h_ctx *ctx, uint8_t code);

/*
 * For a part of a program that drives everything from the calling thread (threads mode only):
 * initialise ACL in this process and give a context with rank 0 of h_opt.nranks.
 */
void h_init_single(h_ctx *ctx, const char *label);
/* Report a single-thread part like a launch; returns 1 if it failed. */
int h_single_done(h_ctx *ctx, int rc, const char *label, double start);

/* Parse argv into h_opt; exits with status 2 on a usage error. */
void h_parse_args(int argc, char **argv, const char *usage_extra);

/* Print the final RESULT line and return the exit code (0 = all passed). */
int h_finish(const char *program, int failed);

/* ---- out-of-band exchange between the ranks of a launch ----------------------------------- */

/* All ranks whose bit is set in mask call this with the same len; the calling rank's len bytes
 * land at all[rank * len]. mask must include rank 0, and with several ranks per process it must
 * hold all or none of a process's ranks. Returns 0, or -1 (peer gone, timeout). */
int h_oob_allgather_mask(h_ctx *ctx, uint64_t mask, const void *mine, void *all, size_t len);
int h_oob_allgather(h_ctx *ctx, const void *mine, void *all, size_t len);
int h_oob_bcast(h_ctx *ctx, uint32_t root, void *buf, size_t len);
int h_oob_bcast_mask(h_ctx *ctx, uint64_t mask, uint32_t root, void *buf, size_t len);
int h_oob_barrier(h_ctx *ctx);
int h_oob_barrier_mask(h_ctx *ctx, uint64_t mask);
uint64_t h_all_mask(uint32_t nranks);

/* ---- cases and checks --------------------------------------------------------------------- */

/* Start a case; returns 0 when --filter excludes it (every rank gets the same answer). */
int h_case(h_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Name the current phase of a case (no filtering, not counted as a case). */
void h_set_case(h_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void h_failf(h_ctx *ctx, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void h_fail_call(h_ctx *ctx, const char *file, int line, const char *call, long rc, int is_hccl);
const char *h_recent_msg(void);

/* Fatal: an API call that must succeed. Returns -1 from the enclosing function. */
#define H_ACL(ctx, call)                                                                        \
    do {                                                                                        \
        aclError h_rc_ = (call);                                                                \
        (ctx)->checks++;                                                                        \
        if (h_rc_ != ACL_SUCCESS) {                                                             \
            h_fail_call((ctx), __FILE__, __LINE__, #call, (long)h_rc_, 0);                      \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)

#define H_HCCL(ctx, call)                                                                       \
    do {                                                                                        \
        HcclResult h_rc_ = (call);                                                              \
        (ctx)->checks++;                                                                        \
        if (h_rc_ != HCCL_SUCCESS) {                                                            \
            h_fail_call((ctx), __FILE__, __LINE__, #call, (long)h_rc_, 1);                      \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)

/* Fatal generic condition. */
#define H_REQUIRE(ctx, cond, ...)                                                               \
    do {                                                                                        \
        (ctx)->checks++;                                                                        \
        if (!(cond)) {                                                                          \
            h_failf((ctx), __FILE__, __LINE__, __VA_ARGS__);                                    \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)

/* Non-fatal condition. Evaluates to 1 if it held. */
#define H_EXPECT(ctx, cond, ...)                                                                \
    ((ctx)->checks++, (cond) ? 1 : (h_failf((ctx), __FILE__, __LINE__, __VA_ARGS__), 0))

/*
 * Non-fatal: call must return exactly `expected` (any non-zero code when expected is H_ANY_ERROR),
 * and a failing call must leave a non-empty aclGetRecentErrMsg(). Evaluates to 1 if it held.
 */
#define H_ANY_ERROR (-424242)
int h_expect_rc(h_ctx *ctx, const char *file, int line, const char *call, long rc, long expected,
                int is_hccl);
#define H_EXPECT_HCCL(ctx, call, expected)                                                      \
    h_expect_rc((ctx), __FILE__, __LINE__, #call, (long)(call), (long)(expected), 1)
#define H_EXPECT_ACL(ctx, call, expected)                                                       \
    h_expect_rc((ctx), __FILE__, __LINE__, #call, (long)(call), (long)(expected), 0)

/* ---- per-rank setup ----------------------------------------------------------------------- */

/* aclrtSetDevice(ctx->device) and create ctx->stream. */
int h_rank_setup(h_ctx *ctx);
/* Destroy ctx->stream and reset the device. */
int h_rank_teardown(h_ctx *ctx);
/* Rank 0 makes root info (after aclrtSetDevice), every rank of mask gets it out of band. */
int h_make_root_info(h_ctx *ctx, uint64_t mask, uint32_t root, HcclRootInfo *info);
/* Communicator over all ranks of the launch, rank = ctx->rank. */
int h_world_comm(h_ctx *ctx, HcclComm *comm);

/* ---- time and process facts --------------------------------------------------------------- */

double h_now(void);              /* monotonic seconds */
void h_sleep(double seconds);

/* ---- element types ------------------------------------------------------------------------ */

#define H_NUM_DTYPES 12
extern const HcclDataType h_all_dtypes[H_NUM_DTYPES];
#define H_NUM_OPS 4
extern const HcclReduceOp h_all_ops[H_NUM_OPS];

size_t h_dtype_size(HcclDataType dt);
const char *h_dtype_name(HcclDataType dt);
const char *h_op_name(HcclReduceOp op);
int h_dtype_is_float(HcclDataType dt);

uint16_t h_f32_to_f16(float f);
float h_f16_to_f32(uint16_t h);
uint16_t h_f32_to_bf16(float f);
float h_bf16_to_f32(uint16_t h);

/* Format one element as text ("value (0xbits)"). */
void h_format_elem(char *out, size_t n, HcclDataType dt, const void *p);

/* ---- deterministic data ------------------------------------------------------------------- */

typedef enum {
    H_GEN_MOVE = 0, /* data movement: full-range, distinct values (finite for floats) */
    H_GEN_SUM = 1,  /* small values: the sum over 8 ranks is exact; also used for MAX/MIN */
    H_GEN_PROD = 2, /* tiny factors: the product over 8 ranks is exact */
    H_GEN_ORDER = 3 /* floats with a wide exponent range: the fp32 sum depends on the order */
} h_gen_kind;

h_gen_kind h_gen_for_op(HcclReduceOp op);
/* Element idx of "rank"'s data (rank is the generator identity, < 8 for reductions). */
void h_gen(HcclDataType dt, h_gen_kind kind, uint32_t rank, uint64_t idx, void *dst);
/* count elements, starting at element idx0, into dst. */
void h_fill(HcclDataType dt, h_gen_kind kind, uint32_t rank, uint64_t idx0, uint64_t count,
            void *dst);
/*
 * Reference reduction of element idx over the generator identities ranks[0..n) in that order,
 * computed as the simulator is specified to: integers in their type, fp32 in float, fp64 in
 * double, fp16/bf16 accumulated in fp32 and rounded to nearest even once.
 */
void h_reduce_ref(HcclDataType dt, HcclReduceOp op, h_gen_kind kind, const uint32_t *ranks,
                  uint32_t n, uint64_t idx, void *dst);
/* Same for count elements starting at idx0; ranks NULL means 0..n-1. */
void h_reduce_fill(HcclDataType dt, HcclReduceOp op, h_gen_kind kind, const uint32_t *ranks,
                   uint32_t n, uint64_t idx0, uint64_t count, void *dst);

/* ---- guarded device buffers --------------------------------------------------------------- */

/* Device allocation of lead + bytes + H_GUARD_BYTES; ptr = base + lead, where lead is
 * H_GUARD_BYTES plus an optional misalignment. */
typedef struct h_dbuf {
    void *base;
    void *ptr;
    size_t bytes; /* user part */
    size_t total; /* whole allocation */
    size_t lead;  /* bytes before the user part */
} h_dbuf;

uint8_t h_sentinel(size_t offset); /* sentinel byte at offset of a whole region */
void h_fill_sentinel(void *host, size_t nbytes);

/* Allocate and fill the whole region (guards and user part) with the sentinel pattern. */
int h_dbuf_alloc(h_ctx *ctx, h_dbuf *b, size_t bytes);
/* Same, with the user part misaligned by `misalign` bytes from the 64-byte-aligned start. */
int h_dbuf_alloc_at(h_ctx *ctx, h_dbuf *b, size_t bytes, size_t misalign);
int h_dbuf_free(h_ctx *ctx, h_dbuf *b);
/* Copy host data into the user part at byte offset off. */
int h_dbuf_upload(h_ctx *ctx, h_dbuf *b, size_t off, const void *host, size_t nbytes);
/* Copy the whole region (guards included) back to host (total bytes). */
int h_dbuf_download_all(h_ctx *ctx, const h_dbuf *b, void *host);

/*
 * Compare a downloaded whole region with the expected one. care (optional, total bytes, non-zero
 * = checked) masks bytes whose content is unspecified. Non-fatal; returns 1 if equal. Reports the
 * number of differing bytes and the first few, located as guard/element.
 */
int h_check_region(h_ctx *ctx, const char *file, int line, const char *what, HcclDataType dt,
                   const uint8_t *actual, const uint8_t *expected, const uint8_t *care,
                   size_t total, size_t lead);
#define H_CHECK_REGION(ctx, what, dt, actual, expected, care, total)                            \
    h_check_region((ctx), __FILE__, __LINE__, (what), (dt), (actual), (expected), (care), (total), \
                   H_GUARD_BYTES)
/* For an h_dbuf b (lead taken from it). */
#define H_CHECK_DBUF(ctx, what, dt, b, actual, expected, care)                                  \
    h_check_region((ctx), __FILE__, __LINE__, (what), (dt), (actual), (expected), (care),      \
                   (b)->total, (b)->lead)

/* Checked host allocation (aborts the process on failure: tests never run out of host memory). */
void *h_xmalloc(size_t n);
void *h_xcalloc(size_t n, size_t m);

/* Print one informational line (serialised with other ranks' output). */
void h_log(h_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The HCCL call `rc` came from must have returned `code` with a message (aclGetRecentErrMsg)
 * containing each of `needles` (NULL-terminated); H_EXPECT_REFUSED is the form to use. */
void h_expect_refused(h_ctx *ctx, int line, const char *call, HcclResult rc, HcclResult code,
                      const char *const *needles);

#ifdef __cplusplus
}
#endif

#define H_EXPECT_REFUSED(ctx, call, code, ...)                                                  \
    do {                                                                                        \
        const char *const needles_[] = {__VA_ARGS__, NULL};                                    \
        h_expect_refused((ctx), __LINE__, #call, (call), (code), needles_);                    \
    } while (0)

/* Propagates a failed step (a negative return) out of the calling function. */
#define RUN(x)                                                                                  \
    do {                                                                                        \
        if ((x) < 0) {                                                                          \
            return -1;                                                                          \
        }                                                                                       \
    } while (0)

#endif /* HCCLPY_TEST_HARNESS_H */
