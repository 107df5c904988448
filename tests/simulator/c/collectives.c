/*
 * Every HCCL operation x every element type x every reduction, checked element by element.
 *
 * usage: collectives --ranks N --mode threads|procs|mixed [--large ELEMS] [--filter STR]
 *
 * Each output buffer sits inside a larger allocation filled with sentinel bytes, so a write
 * outside the output (or into a gap of a V-operation) is caught; out-of-place inputs are
 * checked to be unchanged. Every rank checks its own results.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    h_ctx *ctx;
    HcclComm comm;
    aclrtStream st;
    uint32_t n, me;
    uint64_t large;
} T;

/* 1 and 24 elements go the simulator's eager way for most operations and types (a rank contributes
 * at most 256 bytes); 1031 never does. */
static const uint64_t small_counts[] = {1, 24, 1031};

/* ---- helpers ------------------------------------------------------------------------------ */

static uint8_t *expect_region(const h_dbuf *b)
{
    uint8_t *e = (uint8_t *)h_xmalloc(b->total);
    h_fill_sentinel(e, b->total);
    return e;
}

/* Download b and compare it with the expected whole region; care may be NULL. */
static int verify(T *t, const char *what, HcclDataType dt, const h_dbuf *b, const uint8_t *expected,
                  const uint8_t *care)
{
    uint8_t *act = (uint8_t *)h_xmalloc(b->total);
    int rc = h_dbuf_download_all(t->ctx, b, act);
    if (rc == 0) {
        H_CHECK_DBUF(t->ctx, what, dt, b, act, expected, care);
    }
    free(act);
    return rc;
}

/* Check that b still holds `payload` (b->bytes) between untouched guards. */
static int verify_unchanged(T *t, const char *what, HcclDataType dt, const h_dbuf *b,
                            const void *payload)
{
    uint8_t *e = expect_region(b);
    if (b->bytes) {
        memcpy(e + b->lead, payload, b->bytes);
    }
    int rc = verify(t, what, dt, b, e, NULL);
    free(e);
    return rc;
}

/* Allocate a guarded buffer and upload host data (nbytes may be < bytes). */
static int dbuf_with(T *t, h_dbuf *b, size_t bytes, const void *host, size_t nbytes)
{
    RUN(h_dbuf_alloc(t->ctx, b, bytes));
    if (host && nbytes) {
        RUN(h_dbuf_upload(t->ctx, b, 0, host, nbytes));
    }
    return 0;
}

/* Same, with the user part misaligned by `misalign` bytes. */
static int dbuf_at(T *t, h_dbuf *b, size_t bytes, size_t misalign, const void *host)
{
    RUN(h_dbuf_alloc_at(t->ctx, b, bytes, misalign));
    if (host && bytes) {
        RUN(h_dbuf_upload(t->ctx, b, 0, host, bytes));
    }
    return 0;
}

static int sync(T *t)
{
    H_ACL(t->ctx, aclrtSynchronizeStream(t->st));
    return 0;
}

/* ---- AllReduce ---------------------------------------------------------------------------- */

static int allreduce(T *t, HcclDataType dt, HcclReduceOp op, uint64_t count, int inplace,
                     h_gen_kind kind)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "allreduce %s %s count=%llu %s%s", h_dtype_name(dt), h_op_name(op),
                (unsigned long long)count, inplace ? "in-place" : "out-of-place",
                kind == H_GEN_ORDER ? " rank-order" : "")) {
        return 0;
    }
    size_t es = h_dtype_size(dt), bytes = (size_t)count * es;
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, kind, t->me, 0, count, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    if (!inplace) {
        RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    }
    H_HCCL(ctx, HcclAllReduce(bi.ptr, inplace ? bi.ptr : bo.ptr, count, dt, op, t->comm, t->st));
    RUN(sync(t));
    h_dbuf *out = inplace ? &bi : &bo;
    uint8_t *e = expect_region(out);
    if (count) {
        h_reduce_fill(dt, op, kind, NULL, t->n, 0, count, e + H_GUARD_BYTES);
    }
    RUN(verify(t, "output", dt, out, e, NULL));
    if (!inplace) {
        RUN(verify_unchanged(t, "input", dt, &bi, in));
        RUN(h_dbuf_free(ctx, &bo));
    }
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

/* ---- Broadcast ---------------------------------------------------------------------------- */

static int broadcast(T *t, HcclDataType dt, uint64_t count, uint32_t root)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "broadcast %s count=%llu root=%u", h_dtype_name(dt), (unsigned long long)count,
                root)) {
        return 0;
    }
    size_t bytes = (size_t)count * h_dtype_size(dt);
    uint8_t *data = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, root, 0, count, data);
    h_dbuf b;
    if (t->me == root) {
        RUN(dbuf_with(t, &b, bytes, data, bytes));
    } else {
        uint8_t *junk = (uint8_t *)h_xmalloc(bytes);
        h_fill(dt, H_GEN_MOVE, 1000 + t->me, 0, count, junk);
        RUN(dbuf_with(t, &b, bytes, junk, bytes));
        free(junk);
    }
    H_HCCL(ctx, HcclBroadcast(b.ptr, count, dt, root, t->comm, t->st));
    RUN(sync(t));
    RUN(verify_unchanged(t, t->me == root ? "root buffer" : "output", dt, &b, data));
    RUN(h_dbuf_free(ctx, &b));
    free(data);
    return 0;
}

/* ---- Reduce ------------------------------------------------------------------------------- */

static int reduce(T *t, HcclDataType dt, HcclReduceOp op, uint64_t count, uint32_t root,
                  int inplace)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "reduce %s %s count=%llu root=%u %s", h_dtype_name(dt), h_op_name(op),
                (unsigned long long)count, root, inplace ? "in-place" : "out-of-place")) {
        return 0;
    }
    h_gen_kind kind = h_gen_for_op(op);
    size_t bytes = (size_t)count * h_dtype_size(dt);
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, kind, t->me, 0, count, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    if (!inplace) {
        RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    }
    H_HCCL(ctx, HcclReduce(bi.ptr, inplace ? bi.ptr : bo.ptr, count, dt, op, root, t->comm, t->st));
    RUN(sync(t));
    h_dbuf *out = inplace ? &bi : &bo;
    uint8_t *e = expect_region(out);
    uint8_t *care = NULL;
    if (t->me == root) {
        h_reduce_fill(dt, op, kind, NULL, t->n, 0, count, e + H_GUARD_BYTES);
    } else {
        /* The output of a non-root rank is unspecified; only its guards are checked. */
        care = (uint8_t *)h_xcalloc(out->total, 1);
        memset(care, 1, H_GUARD_BYTES);
        memset(care + out->total - H_GUARD_BYTES, 1, H_GUARD_BYTES);
    }
    RUN(verify(t, t->me == root ? "root output" : "guards", dt, out, e, care));
    if (!inplace) {
        RUN(verify_unchanged(t, "input", dt, &bi, in));
        RUN(h_dbuf_free(ctx, &bo));
    }
    RUN(h_dbuf_free(ctx, &bi));
    free(care);
    free(e);
    free(in);
    return 0;
}

/* ---- AllGather ---------------------------------------------------------------------------- */

static int allgather(T *t, HcclDataType dt, uint64_t count)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "allgather %s count=%llu", h_dtype_name(dt), (unsigned long long)count)) {
        return 0;
    }
    size_t es = h_dtype_size(dt), bytes = (size_t)count * es;
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, t->me, 0, count, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    RUN(dbuf_with(t, &bo, bytes * t->n, NULL, 0));
    H_HCCL(ctx, HcclAllGather(bi.ptr, bo.ptr, count, dt, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    for (uint32_t r = 0; r < t->n; r++) {
        h_fill(dt, H_GEN_MOVE, r, 0, count, e + H_GUARD_BYTES + r * bytes);
    }
    RUN(verify(t, "output", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

/* ---- ReduceScatter ------------------------------------------------------------------------ */

static int reduce_scatter(T *t, HcclDataType dt, HcclReduceOp op, uint64_t count)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "reducescatter %s %s count=%llu", h_dtype_name(dt), h_op_name(op),
                (unsigned long long)count)) {
        return 0;
    }
    h_gen_kind kind = h_gen_for_op(op);
    size_t es = h_dtype_size(dt), bytes = (size_t)count * es;
    uint8_t *in = (uint8_t *)h_xmalloc(bytes * t->n);
    h_fill(dt, kind, t->me, 0, count * t->n, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes * t->n, in, bytes * t->n));
    RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    H_HCCL(ctx, HcclReduceScatter(bi.ptr, bo.ptr, count, dt, op, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    h_reduce_fill(dt, op, kind, NULL, t->n, (uint64_t)t->me * count, count, e + H_GUARD_BYTES);
    RUN(verify(t, "output", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

/* ---- AlltoAll ----------------------------------------------------------------------------- */

static int alltoall(T *t, HcclDataType dt, uint64_t count)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "alltoall %s count=%llu", h_dtype_name(dt), (unsigned long long)count)) {
        return 0;
    }
    size_t es = h_dtype_size(dt), bytes = (size_t)count * es * t->n;
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, t->me, 0, count * t->n, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    H_HCCL(ctx, HcclAlltoAll(bi.ptr, count, dt, bo.ptr, count, dt, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    for (uint32_t r = 0; r < t->n; r++) {
        /* block r of my output = block me of rank r's input */
        h_fill(dt, H_GEN_MOVE, r, (uint64_t)t->me * count, count,
               e + H_GUARD_BYTES + (size_t)r * count * es);
    }
    RUN(verify(t, "output", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

/* ---- AlltoAllV / AlltoAllVC layouts ------------------------------------------------------- */

/* Elements rank i sends to rank j (zero for some pairs). */
static uint64_t a2a_count(uint32_t i, uint32_t j, uint64_t mult, uint32_t base)
{
    return (uint64_t)((i * 3U + j * 5U + base) % 7U) * mult;
}

/* Offset (elements) of the block for j in rank i's send buffer: ascending, with gaps. */
static uint64_t a2a_sdispl(uint32_t n, uint32_t i, uint32_t j, uint64_t mult, uint32_t base)
{
    uint64_t off = 0;
    for (uint32_t k = 0; k < n; k++) {
        off += (i + k) % 3U; /* gap before block k */
        if (k == j) {
            return off;
        }
        off += a2a_count(i, k, mult, base);
    }
    return off;
}

static uint64_t a2a_send_total(uint32_t n, uint32_t i, uint64_t mult, uint32_t base)
{
    return a2a_sdispl(n, i, n - 1, mult, base) + a2a_count(i, n - 1, mult, base) + 2;
}

/* Offset of the block from j in rank i's receive buffer: descending rank order, with gaps. */
static uint64_t a2a_rdispl(uint32_t n, uint32_t i, uint32_t j, uint64_t mult, uint32_t base)
{
    uint64_t off = 0;
    for (uint32_t kk = n; kk-- > 0;) {
        off += (i * 2U + kk) % 4U;
        if (kk == j) {
            return off;
        }
        off += a2a_count(kk, i, mult, base);
    }
    return off;
}

static uint64_t a2a_recv_total(uint32_t n, uint32_t i, uint64_t mult, uint32_t base)
{
    return a2a_rdispl(n, i, 0, mult, base) + a2a_count(0, i, mult, base) + 3;
}

static int alltoallv(T *t, HcclDataType dt, uint64_t mult, uint32_t base)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "alltoallv %s mult=%llu base=%u", h_dtype_name(dt), (unsigned long long)mult,
                base)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me;
    size_t es = h_dtype_size(dt);
    uint64_t *sc = (uint64_t *)h_xcalloc(n, 8), *sd = (uint64_t *)h_xcalloc(n, 8);
    uint64_t *rc = (uint64_t *)h_xcalloc(n, 8), *rd = (uint64_t *)h_xcalloc(n, 8);
    for (uint32_t j = 0; j < n; j++) {
        sc[j] = a2a_count(me, j, mult, base);
        sd[j] = a2a_sdispl(n, me, j, mult, base);
        rc[j] = a2a_count(j, me, mult, base);
        rd[j] = a2a_rdispl(n, me, j, mult, base);
    }
    uint64_t stot = a2a_send_total(n, me, mult, base), rtot = a2a_recv_total(n, me, mult, base);
    uint8_t *in = (uint8_t *)h_xmalloc(stot * es);
    h_fill(dt, H_GEN_MOVE, me, 0, stot, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, stot * es, in, stot * es));
    RUN(dbuf_with(t, &bo, rtot * es, NULL, 0));
    H_HCCL(ctx, HcclAlltoAllV(bi.ptr, sc, sd, dt, bo.ptr, rc, rd, dt, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    for (uint32_t j = 0; j < n; j++) {
        h_fill(dt, H_GEN_MOVE, j, a2a_sdispl(n, j, me, mult, base), rc[j],
               e + H_GUARD_BYTES + rd[j] * es);
    }
    RUN(verify(t, "output (gaps must keep the sentinel)", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    return 0;
}

static int alltoallvc(T *t, HcclDataType dt, uint64_t mult, uint32_t base)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "alltoallvc %s mult=%llu base=%u", h_dtype_name(dt), (unsigned long long)mult,
                base)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me;
    size_t es = h_dtype_size(dt);
    uint64_t *m = (uint64_t *)h_xcalloc((size_t)n * n, 8);
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < n; j++) {
            m[(size_t)i * n + j] = a2a_count(i, j, mult, base);
        }
    }
    uint64_t stot = 0, rtot = 0;
    for (uint32_t j = 0; j < n; j++) {
        stot += m[(size_t)me * n + j];
        rtot += m[(size_t)j * n + me];
    }
    uint8_t *in = (uint8_t *)h_xmalloc(stot * es);
    h_fill(dt, H_GEN_MOVE, me, 0, stot, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, stot * es, in, stot * es));
    RUN(dbuf_with(t, &bo, rtot * es, NULL, 0));
    H_HCCL(ctx, HcclAlltoAllVC(bi.ptr, m, dt, bo.ptr, dt, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    uint64_t roff = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint64_t soff = 0; /* where rank j's block for me starts in j's contiguous send buffer */
        for (uint32_t k = 0; k < me; k++) {
            soff += m[(size_t)j * n + k];
        }
        h_fill(dt, H_GEN_MOVE, j, soff, m[(size_t)j * n + me], e + H_GUARD_BYTES + roff * es);
        roff += m[(size_t)j * n + me];
    }
    RUN(verify(t, "output", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    free(m);
    return 0;
}

/* ---- Scatter ------------------------------------------------------------------------------ */

static int scatter(T *t, HcclDataType dt, uint64_t count, uint32_t root)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "scatter %s count=%llu root=%u", h_dtype_name(dt), (unsigned long long)count,
                root)) {
        return 0;
    }
    size_t es = h_dtype_size(dt), bytes = (size_t)count * es;
    uint8_t *in = NULL;
    h_dbuf bi, bo;
    memset(&bi, 0, sizeof bi);
    if (t->me == root) {
        in = (uint8_t *)h_xmalloc(bytes * t->n);
        h_fill(dt, H_GEN_MOVE, root, 0, count * t->n, in);
        RUN(dbuf_with(t, &bi, bytes * t->n, in, bytes * t->n));
    }
    RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    /* non-root ranks pass a NULL sendBuf, as documented */
    H_HCCL(ctx, HcclScatter(t->me == root ? bi.ptr : NULL, bo.ptr, count, dt, root, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    h_fill(dt, H_GEN_MOVE, root, (uint64_t)t->me * count, count, e + H_GUARD_BYTES);
    RUN(verify(t, "output", dt, &bo, e, NULL));
    if (t->me == root) {
        RUN(verify_unchanged(t, "root input", dt, &bi, in));
        RUN(h_dbuf_free(ctx, &bi));
    }
    RUN(h_dbuf_free(ctx, &bo));
    free(e);
    free(in);
    return 0;
}

/* ---- AllGatherV / ReduceScatterV ---------------------------------------------------------- */

static uint64_t v_count(uint32_t i, uint64_t mult, uint32_t base)
{
    return (uint64_t)((i * 7U + base) % 5U) * mult;
}

static int allgatherv(T *t, HcclDataType dt, uint64_t mult, uint32_t base)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "allgatherv %s mult=%llu base=%u", h_dtype_name(dt), (unsigned long long)mult,
                base)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me;
    size_t es = h_dtype_size(dt);
    uint64_t *rc = (uint64_t *)h_xcalloc(n, 8), *rd = (uint64_t *)h_xcalloc(n, 8);
    uint64_t off = 0;
    for (uint32_t kk = n; kk-- > 0;) { /* descending rank order, gaps of 0..2 elements */
        off += (kk + base) % 3U;
        rc[kk] = v_count(kk, mult, base);
        rd[kk] = off;
        off += rc[kk];
    }
    uint64_t rtot = off + 1;
    uint64_t scount = v_count(me, mult, base);
    uint8_t *in = (uint8_t *)h_xmalloc(scount * es);
    h_fill(dt, H_GEN_MOVE, me, 0, scount, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, scount * es, in, scount * es));
    RUN(dbuf_with(t, &bo, rtot * es, NULL, 0));
    H_HCCL(ctx, HcclAllGatherV(bi.ptr, scount, bo.ptr, rc, rd, dt, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    for (uint32_t j = 0; j < n; j++) {
        h_fill(dt, H_GEN_MOVE, j, 0, rc[j], e + H_GUARD_BYTES + rd[j] * es);
    }
    RUN(verify(t, "output (gaps must keep the sentinel)", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    free(rc);
    free(rd);
    return 0;
}

static int reduce_scatterv(T *t, HcclDataType dt, HcclReduceOp op, uint64_t mult, uint32_t base)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "reducescatterv %s %s mult=%llu base=%u", h_dtype_name(dt), h_op_name(op),
                (unsigned long long)mult, base)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me;
    size_t es = h_dtype_size(dt);
    h_gen_kind kind = h_gen_for_op(op);
    uint64_t *sc = (uint64_t *)h_xcalloc(n, 8), *sd = (uint64_t *)h_xcalloc(n, 8);
    uint64_t *logical = (uint64_t *)h_xcalloc(n, 8);
    uint64_t off = 0, lsum = 0;
    for (uint32_t i = 0; i < n; i++) {
        off += (me + i) % 3U; /* this rank's own gaps */
        sc[i] = v_count(i, mult, base);
        sd[i] = off;
        logical[i] = lsum;
        off += sc[i];
        lsum += sc[i];
    }
    uint64_t stot = off + 2;
    /* gaps hold junk, the blocks hold the generated values at their logical index */
    uint8_t *in = (uint8_t *)h_xmalloc(stot * es);
    h_fill(dt, H_GEN_MOVE, 2000 + me, 0, stot, in);
    for (uint32_t i = 0; i < n; i++) {
        h_fill(dt, kind, me, logical[i], sc[i], in + sd[i] * es);
    }
    uint64_t rcount = sc[me];
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, stot * es, in, stot * es));
    RUN(dbuf_with(t, &bo, rcount * es, NULL, 0));
    H_HCCL(ctx, HcclReduceScatterV(bi.ptr, sc, sd, bo.ptr, rcount, dt, op, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    h_reduce_fill(dt, op, kind, NULL, n, logical[me], rcount, e + H_GUARD_BYTES);
    RUN(verify(t, "output", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "input", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    free(sc);
    free(sd);
    free(logical);
    return 0;
}

/* ---- Send / Recv -------------------------------------------------------------------------- */

static int sendrecv_ring(T *t, HcclDataType dt, uint64_t count)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "sendrecv-ring %s count=%llu", h_dtype_name(dt), (unsigned long long)count)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me, next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t bytes = (size_t)count * h_dtype_size(dt);
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, me, 0, count, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    if (me % 2 == 0) {
        H_HCCL(ctx, HcclSend(bi.ptr, count, dt, next, t->comm, t->st));
        H_HCCL(ctx, HcclRecv(bo.ptr, count, dt, prev, t->comm, t->st));
    } else {
        H_HCCL(ctx, HcclRecv(bo.ptr, count, dt, prev, t->comm, t->st));
        H_HCCL(ctx, HcclSend(bi.ptr, count, dt, next, t->comm, t->st));
    }
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    h_fill(dt, H_GEN_MOVE, prev, 0, count, e + H_GUARD_BYTES);
    RUN(verify(t, "received", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "sent buffer", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

static int batch_ring(T *t, HcclDataType dt, uint64_t count)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "batchsendrecv-ring %s count=%llu", h_dtype_name(dt),
                (unsigned long long)count)) {
        return 0;
    }
    uint32_t n = t->n, me = t->me, next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t bytes = (size_t)count * h_dtype_size(dt);
    uint8_t *in = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, me, 0, count, in);
    h_dbuf bi, bo;
    RUN(dbuf_with(t, &bi, bytes, in, bytes));
    RUN(dbuf_with(t, &bo, bytes, NULL, 0));
    HcclSendRecvItem items[2];
    memset(items, 0, sizeof items);
    /* receive listed first on odd ranks: the order inside one call must not matter */
    int s = me % 2 == 0 ? 0 : 1;
    items[s].sendRecvType = HCCL_SEND;
    items[s].buf = bi.ptr;
    items[s].count = count;
    items[s].dataType = dt;
    items[s].remoteRank = next;
    items[1 - s].sendRecvType = HCCL_RECV;
    items[1 - s].buf = bo.ptr;
    items[1 - s].count = count;
    items[1 - s].dataType = dt;
    items[1 - s].remoteRank = prev;
    H_HCCL(ctx, HcclBatchSendRecv(items, 2, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&bo);
    h_fill(dt, H_GEN_MOVE, prev, 0, count, e + H_GUARD_BYTES);
    RUN(verify(t, "received", dt, &bo, e, NULL));
    RUN(verify_unchanged(t, "sent buffer", dt, &bi, in));
    RUN(h_dbuf_free(ctx, &bo));
    RUN(h_dbuf_free(ctx, &bi));
    free(e);
    free(in);
    return 0;
}

/* One call: every rank sends a different amount to every other rank and receives from all. */
static int batch_all_pairs(T *t, HcclDataType dt)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "batchsendrecv-all-pairs %s", h_dtype_name(dt))) {
        return 0;
    }
    uint32_t n = t->n, me = t->me;
    size_t es = h_dtype_size(dt);
    HcclSendRecvItem *items = (HcclSendRecvItem *)h_xcalloc(2 * (size_t)n, sizeof *items);
    h_dbuf *sb = (h_dbuf *)h_xcalloc(n, sizeof *sb), *rb = (h_dbuf *)h_xcalloc(n, sizeof *rb);
    uint8_t **ins = (uint8_t **)h_xcalloc(n, sizeof *ins);
    uint32_t k = 0;
    for (uint32_t p = 0; p < n; p++) {
        if (p == me) {
            continue;
        }
        uint64_t scount = 17 + 11 * (uint64_t)((me * 5 + p * 3) % 7);
        uint64_t rcount = 17 + 11 * (uint64_t)((p * 5 + me * 3) % 7);
        ins[p] = (uint8_t *)h_xmalloc(scount * es);
        h_fill(dt, H_GEN_MOVE, me, (uint64_t)p << 32, scount, ins[p]);
        RUN(dbuf_with(t, &sb[p], scount * es, ins[p], scount * es));
        RUN(dbuf_with(t, &rb[p], rcount * es, NULL, 0));
        /* interleave: receives first for half of the peers */
        HcclSendRecvItem snd = {HCCL_SEND, sb[p].ptr, scount, dt, p};
        HcclSendRecvItem rcv = {HCCL_RECV, rb[p].ptr, rcount, dt, p};
        if ((p + me) % 2) {
            items[k++] = rcv;
            items[k++] = snd;
        } else {
            items[k++] = snd;
            items[k++] = rcv;
        }
    }
    if (k > 0) {
        H_HCCL(ctx, HcclBatchSendRecv(items, k, t->comm, t->st));
        RUN(sync(t));
    }
    for (uint32_t p = 0; p < n; p++) {
        if (p == me) {
            continue;
        }
        uint64_t rcount = 17 + 11 * (uint64_t)((p * 5 + me * 3) % 7);
        uint8_t *e = expect_region(&rb[p]);
        h_fill(dt, H_GEN_MOVE, p, (uint64_t)me << 32, rcount, e + H_GUARD_BYTES);
        RUN(verify(t, "received", dt, &rb[p], e, NULL));
        RUN(verify_unchanged(t, "sent buffer", dt, &sb[p], ins[p]));
        RUN(h_dbuf_free(ctx, &rb[p]));
        RUN(h_dbuf_free(ctx, &sb[p]));
        free(e);
        free(ins[p]);
    }
    free(items);
    free(sb);
    free(rb);
    free(ins);
    return 0;
}

/* ---- Barrier and a pipeline of different operations -------------------------------------- */

static int barrier(T *t)
{
    if (!h_case(t->ctx, "barrier x10")) {
        return 0;
    }
    for (int i = 0; i < 10; i++) {
        H_HCCL(t->ctx, HcclBarrier(t->comm, t->st));
    }
    RUN(sync(t));
    return 0;
}

/* Several different operations queued back to back, one synchronisation at the end. */
static int pipeline(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "pipeline allreduce+broadcast+allgather+barrier+reducescatter")) {
        return 0;
    }
    const uint64_t c = 4099;
    HcclDataType dt = HCCL_DATA_TYPE_FP32;
    size_t es = 4;
    uint32_t n = t->n, me = t->me;
    uint8_t *a = (uint8_t *)h_xmalloc(c * es), *g = (uint8_t *)h_xmalloc(c * es);
    uint8_t *r = (uint8_t *)h_xmalloc(c * es * n);
    h_fill(dt, H_GEN_SUM, me, 0, c, a);
    h_fill(dt, H_GEN_MOVE, me, 0, c, g);
    h_fill(dt, H_GEN_SUM, me, 100000, c * n, r);
    h_dbuf ba, bb, bg, bgo, br, bro;
    RUN(dbuf_with(t, &ba, c * es, a, c * es));
    RUN(dbuf_with(t, &bb, c * es, g, c * es));
    RUN(dbuf_with(t, &bg, c * es, g, c * es));
    RUN(dbuf_with(t, &bgo, c * es * n, NULL, 0));
    RUN(dbuf_with(t, &br, c * es * n, r, c * es * n));
    RUN(dbuf_with(t, &bro, c * es, NULL, 0));
    uint32_t root = n - 1;
    H_HCCL(ctx, HcclAllReduce(ba.ptr, ba.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
    H_HCCL(ctx, HcclBroadcast(bb.ptr, c, dt, root, t->comm, t->st));
    H_HCCL(ctx, HcclAllGather(bg.ptr, bgo.ptr, c, dt, t->comm, t->st));
    H_HCCL(ctx, HcclBarrier(t->comm, t->st));
    H_HCCL(ctx, HcclReduceScatter(br.ptr, bro.ptr, c, dt, HCCL_REDUCE_MAX, t->comm, t->st));
    RUN(sync(t));
    uint8_t *e = expect_region(&ba);
    h_reduce_fill(dt, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 0, c, e + H_GUARD_BYTES);
    RUN(verify(t, "allreduce output", dt, &ba, e, NULL));
    h_fill(dt, H_GEN_MOVE, root, 0, c, e + H_GUARD_BYTES);
    RUN(verify(t, "broadcast output", dt, &bb, e, NULL));
    free(e);
    e = expect_region(&bgo);
    for (uint32_t k = 0; k < n; k++) {
        h_fill(dt, H_GEN_MOVE, k, 0, c, e + H_GUARD_BYTES + (size_t)k * c * es);
    }
    RUN(verify(t, "allgather output", dt, &bgo, e, NULL));
    free(e);
    e = expect_region(&bro);
    h_reduce_fill(dt, HCCL_REDUCE_MAX, H_GEN_SUM, NULL, n, 100000 + (uint64_t)me * c, c,
                  e + H_GUARD_BYTES);
    RUN(verify(t, "reducescatter output", dt, &bro, e, NULL));
    free(e);
    h_dbuf *all[] = {&ba, &bb, &bg, &bgo, &br, &bro};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        RUN(h_dbuf_free(ctx, all[i]));
    }
    free(a);
    free(g);
    free(r);
    return 0;
}


/* ---- misaligned buffers ------------------------------------------------------------------- */

/*
 * Buffers whose start is aligned to the element but not to 64 bytes (aclrtMalloc gives 64):
 * every kind of operation queued back to back, one synchronisation.
 */
static int misaligned(T *t, HcclDataType dt, size_t off_a, size_t off_b)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "misaligned %s offsets +%zu/+%zu", h_dtype_name(dt), off_a, off_b)) {
        return 0;
    }
    const uint64_t c = 1031;
    uint32_t n = t->n, me = t->me, root = n - 1;
    size_t es = h_dtype_size(dt), bytes = c * es;
    uint8_t *sum_in = (uint8_t *)h_xmalloc(bytes), *max_in = (uint8_t *)h_xmalloc(bytes);
    uint8_t *mv = (uint8_t *)h_xmalloc(bytes * n), *rs_in = (uint8_t *)h_xmalloc(bytes * n);
    h_fill(dt, H_GEN_SUM, me, 0, c, sum_in);
    h_fill(dt, H_GEN_SUM, me, 5000, c, max_in);
    h_fill(dt, H_GEN_MOVE, me, 0, c * n, mv);
    h_fill(dt, H_GEN_SUM, me, 9000, c * n, rs_in);
    h_dbuf ar_in, ar_out, ar_ip, bc, ag_in, ag_out, rs_src, rs_out, a2a_in, a2a_out, p_in, p_out;
    RUN(dbuf_at(t, &ar_in, bytes, off_a, sum_in));
    RUN(dbuf_at(t, &ar_out, bytes, off_b, NULL));
    RUN(dbuf_at(t, &ar_ip, bytes, off_b, max_in));
    RUN(dbuf_at(t, &bc, bytes, off_a, me == root ? mv : sum_in));
    RUN(dbuf_at(t, &ag_in, bytes, off_b, mv));
    RUN(dbuf_at(t, &ag_out, bytes * n, off_a, NULL));
    RUN(dbuf_at(t, &rs_src, bytes * n, off_a, rs_in));
    RUN(dbuf_at(t, &rs_out, bytes, off_b, NULL));
    RUN(dbuf_at(t, &a2a_in, bytes * n, off_b, mv));
    RUN(dbuf_at(t, &a2a_out, bytes * n, off_a, NULL));
    RUN(dbuf_at(t, &p_in, bytes, off_a, mv));
    RUN(dbuf_at(t, &p_out, bytes, off_b, NULL));
    H_HCCL(ctx, HcclAllReduce(ar_in.ptr, ar_out.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
    H_HCCL(ctx, HcclAllReduce(ar_ip.ptr, ar_ip.ptr, c, dt, HCCL_REDUCE_MAX, t->comm, t->st));
    H_HCCL(ctx, HcclBroadcast(bc.ptr, c, dt, root, t->comm, t->st));
    H_HCCL(ctx, HcclAllGather(ag_in.ptr, ag_out.ptr, c, dt, t->comm, t->st));
    H_HCCL(ctx, HcclReduceScatter(rs_src.ptr, rs_out.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
    H_HCCL(ctx, HcclAlltoAll(a2a_in.ptr, c / n, dt, a2a_out.ptr, c / n, dt, t->comm, t->st));
    if (n >= 2) {
        uint32_t next = (me + 1) % n, prev = (me + n - 1) % n;
        HcclSendRecvItem items[2] = {{HCCL_SEND, p_in.ptr, c, dt, next},
                                     {HCCL_RECV, p_out.ptr, c, dt, prev}};
        H_HCCL(ctx, HcclBatchSendRecv(items, 2, t->comm, t->st));
    }
    RUN(sync(t));
    uint8_t *e = expect_region(&ar_out);
    h_reduce_fill(dt, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 0, c, e + ar_out.lead);
    RUN(verify(t, "allreduce output", dt, &ar_out, e, NULL));
    free(e);
    e = expect_region(&ar_ip);
    h_reduce_fill(dt, HCCL_REDUCE_MAX, H_GEN_SUM, NULL, n, 5000, c, e + ar_ip.lead);
    RUN(verify(t, "in-place allreduce max", dt, &ar_ip, e, NULL));
    free(e);
    uint8_t *rootdata = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_MOVE, root, 0, c, rootdata);
    RUN(verify_unchanged(t, "broadcast buffer", dt, &bc, rootdata));
    free(rootdata);
    e = expect_region(&ag_out);
    for (uint32_t r = 0; r < n; r++) {
        h_fill(dt, H_GEN_MOVE, r, 0, c, e + ag_out.lead + (size_t)r * bytes);
    }
    RUN(verify(t, "allgather output", dt, &ag_out, e, NULL));
    free(e);
    e = expect_region(&rs_out);
    h_reduce_fill(dt, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, n, 9000 + (uint64_t)me * c, c,
                  e + rs_out.lead);
    RUN(verify(t, "reducescatter output", dt, &rs_out, e, NULL));
    free(e);
    e = expect_region(&a2a_out);
    uint64_t ac = c / n;
    for (uint32_t r = 0; r < n; r++) {
        h_fill(dt, H_GEN_MOVE, r, (uint64_t)me * ac, ac, e + a2a_out.lead + (size_t)r * ac * es);
    }
    RUN(verify(t, "alltoall output", dt, &a2a_out, e, NULL));
    free(e);
    if (n >= 2) {
        e = expect_region(&p_out);
        h_fill(dt, H_GEN_MOVE, (me + n - 1) % n, 0, c, e + p_out.lead);
        RUN(verify(t, "received", dt, &p_out, e, NULL));
        free(e);
    }
    RUN(verify_unchanged(t, "allreduce input", dt, &ar_in, sum_in));
    RUN(verify_unchanged(t, "allgather input", dt, &ag_in, mv));
    RUN(verify_unchanged(t, "reducescatter input", dt, &rs_src, rs_in));
    h_dbuf *all[] = {&ar_in, &ar_out, &ar_ip, &bc, &ag_in, &ag_out, &rs_src, &rs_out, &a2a_in,
                     &a2a_out, &p_in, &p_out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        RUN(h_dbuf_free(ctx, all[i]));
    }
    free(sum_in);
    free(max_in);
    free(mv);
    free(rs_in);
    return 0;
}

/* ---- operations that depend on each other, one synchronisation ---------------------------- */

static int dependent_chain(T *t)
{
    h_ctx *ctx = t->ctx;
    if (!h_case(ctx, "dependent chain allreduce -> in-place allreduce -> broadcast -> allgather "
                     "-> reducescatter")) {
        return 0;
    }
    const uint64_t c = 3001;
    uint32_t n = t->n, me = t->me;
    /* small int32 values, so that n * n * sum stays exact */
    int32_t *x = (int32_t *)h_xmalloc(c * 4), *sum = (int32_t *)h_xcalloc(c, 4);
    for (uint32_t r = 0; r < n; r++) {
        for (uint64_t i = 0; i < c; i++) {
            int16_t v;
            h_gen(HCCL_DATA_TYPE_INT16, H_GEN_SUM, r, i, &v);
            sum[i] += v;
            if (r == me) {
                x[i] = v;
            }
        }
    }
    const HcclDataType dt = HCCL_DATA_TYPE_INT32;
    h_dbuf in, t1, g, rs;
    RUN(dbuf_with(t, &in, c * 4, x, c * 4));
    RUN(dbuf_with(t, &t1, c * 4, NULL, 0));
    RUN(dbuf_with(t, &g, c * 4 * n, NULL, 0));
    RUN(dbuf_with(t, &rs, c * 4, NULL, 0));
    for (int rep = 0; rep < 3; rep++) {
        H_HCCL(ctx, HcclAllReduce(in.ptr, t1.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
        H_HCCL(ctx, HcclAllReduce(t1.ptr, t1.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
        H_HCCL(ctx, HcclBroadcast(t1.ptr, c, dt, n - 1, t->comm, t->st));
        H_HCCL(ctx, HcclAllGather(t1.ptr, g.ptr, c, dt, t->comm, t->st));
        H_HCCL(ctx, HcclReduceScatter(g.ptr, rs.ptr, c, dt, HCCL_REDUCE_SUM, t->comm, t->st));
        RUN(sync(t));
        int32_t *want = (int32_t *)h_xmalloc(c * 4);
        for (uint64_t i = 0; i < c; i++) {
            want[i] = (int32_t)n * (int32_t)n * sum[i];
        }
        uint8_t *e = expect_region(&rs);
        memcpy(e + rs.lead, want, c * 4);
        RUN(verify(t, "end of the chain", dt, &rs, e, NULL));
        free(e);
        free(want);
        RUN(h_dbuf_upload(ctx, &rs, 0, x, c * 4)); /* scribble over the result for the next round */
    }
    h_dbuf *all[] = {&in, &t1, &g, &rs};
    for (size_t i = 0; i < 4; i++) {
        RUN(h_dbuf_free(ctx, all[i]));
    }
    free(x);
    free(sum);
    return 0;
}

/* ---- a late rank holds everybody back ----------------------------------------------------- */

static int late_rank(T *t)
{
    h_ctx *ctx = t->ctx;
    if (t->n < 2 || !h_case(ctx, "barrier and allreduce wait for a late rank")) {
        return 0;
    }
    const double late = 0.3;
    for (int which = 0; which < 2; which++) {
        float v = (float)(t->me + 1), got = 0.0f;
        void *d;
        H_ACL(ctx, aclrtMalloc(&d, sizeof v, ACL_MEM_MALLOC_HUGE_FIRST));
        H_ACL(ctx, aclrtMemcpy(d, sizeof v, &v, sizeof v, ACL_MEMCPY_HOST_TO_DEVICE));
        RUN(h_oob_barrier(ctx));
        if (t->me == 0) {
            h_sleep(late);
        }
        double t0 = h_now();
        if (which == 0) {
            H_HCCL(ctx, HcclBarrier(t->comm, t->st));
        } else {
            H_HCCL(ctx, HcclAllReduce(d, d, 1, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, t->comm, t->st));
        }
        RUN(sync(t));
        double dt = h_now() - t0;
        if (t->me != 0) {
            H_EXPECT(ctx, dt >= late - 0.1, "%s completed after %.3f s although rank 0 joined "
                     "%.1f s late", which == 0 ? "HcclBarrier" : "HcclAllReduce", dt, late);
        }
        H_ACL(ctx, aclrtMemcpy(&got, sizeof got, d, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
        float want = which == 0 ? v : (float)(t->n * (t->n + 1) / 2);
        H_EXPECT(ctx, got == want, "after the late %s: %g, expected %g",
                 which == 0 ? "barrier" : "allreduce", (double)got, (double)want);
        H_ACL(ctx, aclrtFree(d));
    }
    return 0;
}

/* ---- sizes around slice and chunk boundaries ---------------------------------------------- */

static const uint64_t sweep_counts[] = {2,    3,    5,     7,     9,     15,     16,     17,
                                        63,   64,   65,    127,   129,   255,    257,    1023,
                                        1025, 4095, 65535, 65537, 262143, 262145};

static int size_sweep(T *t)
{
    size_t nc = sizeof sweep_counts / sizeof sweep_counts[0];
    for (size_t i = 0; i < nc; i++) {
        uint64_t c = sweep_counts[i];
        RUN(allreduce(t, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, c, 0, H_GEN_SUM));
        RUN(allreduce(t, HCCL_DATA_TYPE_BFP16, HCCL_REDUCE_SUM, c, 1, H_GEN_SUM));
        if (c <= 65537) {
            RUN(allgather(t, HCCL_DATA_TYPE_INT8, c));
            RUN(reduce_scatter(t, HCCL_DATA_TYPE_FP16, HCCL_REDUCE_SUM, c));
            RUN(broadcast(t, HCCL_DATA_TYPE_UINT16, c, (uint32_t)(i % t->n)));
            RUN(alltoall(t, HCCL_DATA_TYPE_INT32, c));
            RUN(reduce(t, HCCL_DATA_TYPE_INT16, HCCL_REDUCE_MAX, c, (uint32_t)((i + 1) % t->n), 1));
        }
    }
    return 0;
}

/* ---- the rank program --------------------------------------------------------------------- */

static int is_large_dtype(HcclDataType dt)
{
    return dt == HCCL_DATA_TYPE_FP32 || dt == HCCL_DATA_TYPE_BFP16 || dt == HCCL_DATA_TYPE_INT8;
}

static int run_rank(h_ctx *ctx)
{
    T t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.n = ctx->nranks;
    t.me = ctx->rank;
    t.large = (uint64_t)h_arg_long("large", 1L << 20);
    RUN(h_rank_setup(ctx));
    t.st = ctx->stream;
    RUN(h_world_comm(ctx, &t.comm));
    uint32_t nr;
    H_HCCL(ctx, HcclGetRankSize(t.comm, &nr));
    H_EXPECT(ctx, nr == t.n, "HcclGetRankSize = %u, expected %u", nr, t.n);
    H_HCCL(ctx, HcclGetRankId(t.comm, &nr));
    H_EXPECT(ctx, nr == t.me, "HcclGetRankId = %u, expected %u", nr, t.me);

    for (int d = 0; d < H_NUM_DTYPES; d++) {
        HcclDataType dt = h_all_dtypes[d];
        for (int o = 0; o < H_NUM_OPS; o++) {
            HcclReduceOp op = h_all_ops[o];
            h_gen_kind kind = h_gen_for_op(op);
            for (int inplace = 0; inplace < 2; inplace++) {
                RUN(allreduce(&t, dt, op, 0, inplace, kind));
                for (size_t c = 0; c < 2; c++) {
                    RUN(allreduce(&t, dt, op, small_counts[c], inplace, kind));
                }
            }
        }
    }
    {
        const HcclDataType fl[] = {HCCL_DATA_TYPE_FP32, HCCL_DATA_TYPE_FP64, HCCL_DATA_TYPE_FP16,
                                   HCCL_DATA_TYPE_BFP16};
        for (size_t i = 0; i < 4; i++) {
            RUN(allreduce(&t, fl[i], HCCL_REDUCE_SUM, 4099, 0, H_GEN_ORDER));
        }
    }
    RUN(allreduce(&t, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, t.large, 0, H_GEN_SUM));
    RUN(allreduce(&t, HCCL_DATA_TYPE_BFP16, HCCL_REDUCE_SUM, t.large, 1, H_GEN_SUM));
    RUN(allreduce(&t, HCCL_DATA_TYPE_FP16, HCCL_REDUCE_SUM, t.large + 3, 0, H_GEN_SUM));
    RUN(allreduce(&t, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_MAX, t.large, 1, H_GEN_SUM));

    for (uint32_t root = 0; root < t.n; root++) {
        for (int d = 0; d < H_NUM_DTYPES; d++) {
            for (size_t c = 0; c < 2; c++) {
                RUN(broadcast(&t, h_all_dtypes[d], small_counts[c], root));
            }
        }
    }
    RUN(broadcast(&t, HCCL_DATA_TYPE_FP32, t.large, 0));
    RUN(broadcast(&t, HCCL_DATA_TYPE_UINT8, t.large + 1, t.n - 1));

    for (uint32_t root = 0; root < t.n; root++) {
        for (int d = 0; d < H_NUM_DTYPES; d++) {
            for (int o = 0; o < H_NUM_OPS; o++) {
                RUN(reduce(&t, h_all_dtypes[d], h_all_ops[o], 1031, root, 0));
            }
            RUN(reduce(&t, h_all_dtypes[d], HCCL_REDUCE_SUM, 1031, root, 1));
            if (root == 0 || root == t.n - 1) {
                RUN(reduce(&t, h_all_dtypes[d], HCCL_REDUCE_MIN, 1, root, 0));
            }
        }
    }
    RUN(reduce(&t, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, t.large, t.n / 2, 0));

    for (int d = 0; d < H_NUM_DTYPES; d++) {
        RUN(allgather(&t, h_all_dtypes[d], 0));
        for (size_t c = 0; c < 2; c++) {
            RUN(allgather(&t, h_all_dtypes[d], small_counts[c]));
        }
    }
    RUN(allgather(&t, HCCL_DATA_TYPE_FP32, t.large / t.n));

    for (int d = 0; d < H_NUM_DTYPES; d++) {
        for (int o = 0; o < H_NUM_OPS; o++) {
            for (size_t c = 0; c < 2; c++) {
                RUN(reduce_scatter(&t, h_all_dtypes[d], h_all_ops[o], small_counts[c]));
            }
        }
    }
    RUN(reduce_scatter(&t, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, t.large / t.n));
    RUN(reduce_scatter(&t, HCCL_DATA_TYPE_BFP16, HCCL_REDUCE_SUM, t.large / t.n + 1));

    for (int d = 0; d < H_NUM_DTYPES; d++) {
        for (size_t c = 0; c < 2; c++) {
            RUN(alltoall(&t, h_all_dtypes[d], small_counts[c]));
        }
        RUN(alltoallv(&t, h_all_dtypes[d], 1, (uint32_t)d));
        RUN(alltoallv(&t, h_all_dtypes[d], 97, (uint32_t)d + 1));
        RUN(alltoallvc(&t, h_all_dtypes[d], 1, (uint32_t)d));
        RUN(alltoallvc(&t, h_all_dtypes[d], 97, (uint32_t)d + 2));
    }
    RUN(alltoall(&t, HCCL_DATA_TYPE_INT32, t.large / t.n / t.n + 1));

    for (uint32_t root = 0; root < t.n; root++) {
        for (int d = 0; d < H_NUM_DTYPES; d++) {
            for (size_t c = 0; c < 2; c++) {
                RUN(scatter(&t, h_all_dtypes[d], small_counts[c], root));
            }
        }
    }
    RUN(scatter(&t, HCCL_DATA_TYPE_FP32, t.large / t.n, 0));

    for (int d = 0; d < H_NUM_DTYPES; d++) {
        RUN(allgatherv(&t, h_all_dtypes[d], 1, (uint32_t)d));
        RUN(allgatherv(&t, h_all_dtypes[d], 211, (uint32_t)d + 3));
        for (int o = 0; o < H_NUM_OPS; o++) {
            RUN(reduce_scatterv(&t, h_all_dtypes[d], h_all_ops[o], 1, (uint32_t)(d + o)));
            RUN(reduce_scatterv(&t, h_all_dtypes[d], h_all_ops[o], 211, (uint32_t)(d + o + 1)));
        }
    }

    if (t.n >= 2) {
        for (int d = 0; d < H_NUM_DTYPES; d++) {
            for (size_t c = 0; c < 2; c++) {
                RUN(sendrecv_ring(&t, h_all_dtypes[d], small_counts[c]));
                RUN(batch_ring(&t, h_all_dtypes[d], small_counts[c]));
            }
            RUN(batch_all_pairs(&t, h_all_dtypes[d]));
            if (is_large_dtype(h_all_dtypes[d])) {
                RUN(sendrecv_ring(&t, h_all_dtypes[d], t.large));
            }
        }
        RUN(batch_ring(&t, HCCL_DATA_TYPE_FP32, t.large));
    }

    RUN(barrier(&t));
    RUN(pipeline(&t));
    RUN(dependent_chain(&t));
    RUN(late_rank(&t));
    RUN(size_sweep(&t));
    for (int d = 0; d < H_NUM_DTYPES; d++) {
        size_t es = h_dtype_size(h_all_dtypes[d]);
        RUN(misaligned(&t, h_all_dtypes[d], es, 3 * es));
        RUN(misaligned(&t, h_all_dtypes[d], 5 * es, es));
    }

    h_set_case(ctx, "teardown");
    H_HCCL(ctx, HcclCommDestroy(t.comm));
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "[--large ELEMS]");
    int failed = h_launch("collectives", run_rank, NULL, NULL);
    return h_finish("collectives", failed);
}
