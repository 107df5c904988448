/* Executing operations on a stream.
 *
 * Every operation is a small state machine (`phase`) so it can stop whenever
 * it must wait for other ranks and be resumed later, possibly by another
 * thread: a thread synchronising with a timeout gives the operation back at
 * its deadline, and the stream's worker finishes it.
 *
 * Collectives follow one pattern.  Each rank publishes a descriptor (its
 * buffers as offsets in its device arena, count, dtype, ...) and raises its
 * progress word; once every rank has arrived, each does its share of the work
 * directly on the peers' device memory, raises its progress again, and the
 * operation completes when every rank has finished (so no rank reuses a
 * buffer a peer still reads).  Point-to-point transfers use a channel per
 * (sender, receiver) pair: the sender posts a descriptor, the receiver copies
 * straight from the sender's memory and acknowledges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "acl/acl.h"
#include "hccl/internal.h"
#include "hccl/net.h"

#define PROGRESS(seq, phase) (((uint64_t)(seq) << 16) | (uint64_t)(phase))
#define HEALTH_CHECK_NS (20 * SIM_NS_PER_MS)
#define SLEEP_SLICE_NS (2 * SIM_NS_PER_MS)

enum { STEP_DONE = 0, STEP_BLOCKED = -100, STEP_MOVED = -101 };

bool hccl_cmd_is_collective(uint32_t type)
{
    return type != HCCL_CMD_SEND && type != HCCL_CMD_RECEIVE && type != HCCL_CMD_BATCH_SEND_RECV;
}

/* Rank `rank`'s descriptor of collective `op` (the copy its parity selects). */
static const op_desc_t *desc_of(const op_task_t *op, uint32_t rank)
{
    return &comm_slot(op->comm, rank)->op[op->cseq & 1];
}

/* Where rank `rank` posts its part of eager collective `op` (the copy its parity selects). */
static char *eager_of(const op_task_t *op, uint32_t rank)
{
    slot_head_t *slot = comm_slot(op->comm, rank);
    return op->tiny ? slot->tiny[op->cseq & 1] : slot->eager[op->cseq & 1];
}

static char *buffer_of(const hccl_comm_t *comm, uint32_t rank, uint64_t offset)
{
    return comm->peer_base[rank] + offset;
}

static bool all_reached(const hccl_comm_t *comm, uint64_t target)
{
    for (uint32_t r = 0; r < comm->nranks; r++)
        if (atomic_load_explicit(&comm_slot(comm, r)->progress, memory_order_acquire) < target)
            return false;
    return true;
}

/* --------------------------------------------------------------- describe */

int hccl_op_describe(const op_desc_t *d, char *out, size_t len)
{
    const char *dtype = hccl_dtype_name(d->dtype);
    switch (d->type) {
    case HCCL_CMD_ALLREDUCE:
    case HCCL_CMD_REDUCE_SCATTER:
        return snprintf(out, len, "%s(count=%llu, %s, %s)", hccl_cmd_name(d->type), (unsigned long long)d->count,
                        dtype, hccl_op_name(d->op));
    case HCCL_CMD_REDUCE:
        return snprintf(out, len, "reduce(count=%llu, %s, %s, root=%u)", (unsigned long long)d->count, dtype,
                        hccl_op_name(d->op), d->root);
    case HCCL_CMD_BROADCAST:
    case HCCL_CMD_SCATTER:
        return snprintf(out, len, "%s(count=%llu, %s, root=%u)", hccl_cmd_name(d->type), (unsigned long long)d->count,
                        dtype, d->root);
    case HCCL_CMD_ALLGATHER:
    case HCCL_CMD_ALLTOALL:
        return snprintf(out, len, "%s(count=%llu, %s)", hccl_cmd_name(d->type), (unsigned long long)d->count, dtype);
    case HCCL_CMD_REDUCE_SCATTER_V:
        return snprintf(out, len, "reduce_scatter_v(%s, %s)", dtype, hccl_op_name(d->op));
    case HCCL_CMD_BARRIER:
        return snprintf(out, len, "barrier()");
    default:
        return snprintf(out, len, "%s(%s)", hccl_cmd_name(d->type), dtype);
    }
}

/* Checks that rank `peer` called the same collective as this rank. */
bool hccl_same_call(const op_desc_t *a, const op_desc_t *b)
{
    if (a->type != b->type || a->seq != b->seq)
        return false;
    switch (a->type) {
    case HCCL_CMD_ALLREDUCE:
    case HCCL_CMD_REDUCE_SCATTER:
        return a->count == b->count && a->dtype == b->dtype && a->op == b->op;
    case HCCL_CMD_REDUCE:
        return a->count == b->count && a->dtype == b->dtype && a->op == b->op && a->root == b->root;
    case HCCL_CMD_BROADCAST:
    case HCCL_CMD_SCATTER:
        return a->count == b->count && a->dtype == b->dtype && a->root == b->root;
    case HCCL_CMD_ALLGATHER:
    case HCCL_CMD_ALLTOALL:
    case HCCL_CMD_ALLTOALLVC: /* count holds a digest of the count matrix */
        return a->count == b->count && a->dtype == b->dtype;
    case HCCL_CMD_REDUCE_SCATTER_V:
        return a->dtype == b->dtype && a->op == b->op;
    case HCCL_CMD_ALLTOALLV:
    case HCCL_CMD_ALLGATHER_V:
        return a->dtype == b->dtype;
    default:
        return true;
    }
}

/* HCCLPY_SIM_DESYNC_CHECK=0 turns the comparison off (read once per process). */
static bool g_desync_checks = true;
static pthread_once_t g_desync_once = PTHREAD_ONCE_INIT;

static void load_desync_setting(void)
{
    const char *value = getenv("HCCLPY_SIM_DESYNC_CHECK");
    g_desync_checks = value == NULL || strcmp(value, "0") != 0;
}

/* An entry on which this rank's count matrix of all_to_all_vc `op` and rank `peer`'s differ, from
 * what the peer published with the matrix's digest (publish_descriptor): its whole matrix up to
 * HCCL_SIM_FULL_MATRIX_RANKS ranks, so that one is always found; with more ranks, only its own
 * row (what it sends) and column (what it receives).  False when those agree and the matrices
 * differ elsewhere only: a rank that publishes that entry's row or column then agrees with one
 * of the two ranks and differs from the other, which names it. */
static bool matrix_difference(const op_task_t *op, uint32_t peer, uint32_t *row, uint32_t *col, uint64_t *mine,
                              uint64_t *theirs)
{
    const hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks;
    const uint64_t *m = op->vectors, *published = slot_vectors(comm, peer);
    bool whole = n <= HCCL_SIM_FULL_MATRIX_RANKS;
    uint64_t entries = whole ? (uint64_t)n * n : 2 * (uint64_t)n;
    for (uint64_t e = 0; e < entries; e++) {
        /* the whole matrix row by row; or the peer's row, then its column */
        uint32_t i = whole ? (uint32_t)(e / n) : e < n ? peer : (uint32_t)(e - n);
        uint32_t j = whole ? (uint32_t)(e % n) : e < n ? (uint32_t)e : peer;
        if (m[(uint64_t)i * n + j] != published[e]) {
            *row = i;
            *col = j;
            *mine = m[(uint64_t)i * n + j];
            *theirs = published[e];
            return true;
        }
    }
    return false;
}

static int report_mismatch(const op_task_t *op, uint32_t peer, const char *a, const char *b)
{
    const hccl_comm_t *comm = op->comm;
    return hccl_error(HCCL_E_PARA, HCCL_SIM_MISMATCH_MARK "%s' at operation #%llu: rank %u called %s but rank %u "
                      "called %s", comm->name, (unsigned long long)op->cseq, comm->rank, a, peer, b);
}

/* Compares this rank's call with every peer's; every rank does, so each fails on a difference,
 * naming its own call and the peer's. */
static int check_signatures(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    pthread_once(&g_desync_once, load_desync_setting);
    if (!g_desync_checks)
        return STEP_DONE;
    const op_desc_t *mine = desc_of(op, comm->rank);
    const op_desc_t *my_call = &comm_slot(comm, comm->rank)->call[op->cseq & 1];
    char a[160], b[160];
    uint32_t unnamed = UINT32_MAX; /* a peer whose count matrix differs where this rank cannot see */
    for (uint32_t r = 0; r < comm->nranks; r++) {
        const op_desc_t *theirs = desc_of(op, r);
        const op_desc_t *their_call = &comm_slot(comm, r)->call[op->cseq & 1];
        if (r != comm->rank && my_call->seq != 0 && their_call->seq != 0 && !hccl_same_call(my_call, their_call)) {
            /* Steps of calls across servers: the calls are what differ. */
            hccl_op_describe(my_call, a, sizeof a);
            hccl_op_describe(their_call, b, sizeof b);
            return report_mismatch(op, r, a, b);
        }
        if (r == comm->rank || hccl_same_call(mine, theirs))
            continue;
        if (mine->type == HCCL_CMD_ALLTOALLVC && theirs->type == HCCL_CMD_ALLTOALLVC &&
            mine->seq == theirs->seq && mine->dtype == theirs->dtype) {
            uint32_t i, j;
            uint64_t own, other;
            if (!matrix_difference(op, r, &i, &j, &own, &other)) {
                if (unnamed == UINT32_MAX)
                    unnamed = r;
                continue; /* a peer whose difference this rank can name is a better report */
            }
            const char *dtype = hccl_dtype_name(mine->dtype);
            snprintf(a, sizeof a, "all_to_all_vc(%s, sendCountMatrix[%u][%u] = %llu)", dtype, i, j,
                     (unsigned long long)own);
            snprintf(b, sizeof b, "all_to_all_vc(%s, sendCountMatrix[%u][%u] = %llu)", dtype, i, j,
                     (unsigned long long)other);
            return report_mismatch(op, r, a, b);
        }
        hccl_op_describe(mine, a, sizeof a);
        hccl_op_describe(theirs, b, sizeof b);
        return report_mismatch(op, r, a, b);
    }
    if (unnamed == UINT32_MAX)
        return STEP_DONE;
    const char *dtype = hccl_dtype_name(mine->dtype);
    snprintf(a, sizeof a, "all_to_all_vc(%s)", dtype);
    snprintf(b, sizeof b, "all_to_all_vc(%s) with a different sendCountMatrix, outside row and column %u (rank %u's "
             "error names the entry)", dtype, unnamed, unnamed);
    return report_mismatch(op, unnamed, a, b);
}

/* ------------------------------------------------------------------ work */

/* The contiguous share of `count` elements rank `rank` handles, in whole
 * cache lines so no two ranks write the same line. */
static void share(uint64_t count, uint32_t nranks, uint32_t rank, size_t elem, uint64_t *lo, uint64_t *hi)
{
    uint64_t unit = elem >= 64 ? 1 : 64 / elem;
    uint64_t per = (count + nranks - 1) / nranks;
    per = (per + unit - 1) / unit * unit;
    *lo = SIM_MIN(count, per * rank);
    *hi = SIM_MIN(count, *lo + per);
}

/* Operations moving more than this store around the caches (see sim_copy). */
#define STREAMING_BYTES (16ULL << 20)

/* Bytes the operation lands in its output(s) on one rank, roughly. */
static uint64_t volume(const op_task_t *op, size_t elem)
{
    uint64_t n = op->comm->nranks;
    switch (op->type) {
    case HCCL_CMD_ALLGATHER:
    case HCCL_CMD_ALLTOALL: return op->count * elem * n;
    case HCCL_CMD_REDUCE_SCATTER_V: return op->recv_count * elem;
    case HCCL_CMD_ALLTOALLV:
    case HCCL_CMD_ALLTOALLVC:
    case HCCL_CMD_ALLGATHER_V: return STREAMING_BYTES - 1; /* uneven: keep results in cache */
    default: return op->count * elem;
    }
}

static int work_all_reduce(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t lo, hi;
    share(op->count, comm->nranks, comm->rank, elem, &lo, &hi);
    if (hi == lo)
        return STEP_DONE;
    for (uint32_t r = 0; r < comm->nranks; r++) {
        const op_desc_t *d = desc_of(op, r);
        comm->scratch_in[r] = buffer_of(comm, r, d->send_offset) + lo * elem;
        comm->scratch_out[r] = buffer_of(comm, r, d->recv_offset) + lo * elem;
    }
    hccl_reduce(comm->scratch_out, (int)comm->nranks, comm->scratch_in, (int)comm->nranks, hi - lo, op->dtype, op->op, op->streaming);
    return STEP_DONE;
}

static int work_reduce(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t lo, hi;
    share(op->count, comm->nranks, comm->rank, elem, &lo, &hi);
    if (hi == lo)
        return STEP_DONE;
    for (uint32_t r = 0; r < comm->nranks; r++)
        comm->scratch_in[r] = buffer_of(comm, r, desc_of(op, r)->send_offset) + lo * elem;
    comm->scratch_out[0] = buffer_of(comm, op->root, desc_of(op, op->root)->recv_offset) + lo * elem;
    hccl_reduce(comm->scratch_out, 1, comm->scratch_in, (int)comm->nranks, hi - lo, op->dtype, op->op, op->streaming);
    return STEP_DONE;
}

static int work_broadcast(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t lo, hi;
    share(op->count, comm->nranks, comm->rank, elem, &lo, &hi);
    const char *src = buffer_of(comm, op->root, desc_of(op, op->root)->send_offset) + lo * elem;
    for (uint32_t r = 0; r < comm->nranks && hi > lo; r++)
        if (r != op->root)
            sim_copy(buffer_of(comm, r, desc_of(op, r)->send_offset) + lo * elem, src, (hi - lo) * elem,
                      op->streaming);
    return STEP_DONE;
}

static int work_all_gather(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t bytes = op->count * elem;
    for (uint32_t r = 0; r < comm->nranks; r++) {
        char *to = buffer_of(comm, r, desc_of(op, r)->recv_offset) + comm->rank * bytes;
        if (to != op->send) /* in place, this rank's own block is there already */
            sim_copy(to, op->send, bytes, op->streaming);
    }
    return STEP_DONE;
}

static int work_reduce_scatter(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t bytes = op->count * elem;
    for (uint32_t r = 0; r < comm->nranks; r++)
        comm->scratch_in[r] = buffer_of(comm, r, desc_of(op, r)->send_offset) + comm->rank * bytes;
    comm->scratch_out[0] = op->recv;
    hccl_reduce(comm->scratch_out, 1, comm->scratch_in, (int)comm->nranks, op->count, op->dtype, op->op, op->streaming);
    return STEP_DONE;
}

static int work_all_to_all(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t bytes = op->count * elem;
    for (uint32_t r = 0; r < comm->nranks; r++)
        sim_copy(buffer_of(comm, r, desc_of(op, r)->recv_offset) + comm->rank * bytes, (char *)op->send + r * bytes,
                  bytes, op->streaming);
    return STEP_DONE;
}

static int work_scatter(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint64_t bytes = op->count * elem;
    sim_copy(op->recv, buffer_of(comm, op->root, desc_of(op, op->root)->send_offset) + comm->rank * bytes,
              bytes, op->streaming);
    return STEP_DONE;
}

/* vectors: sendCounts, sdispls, recvCounts, rdispls; the first two are also
 * published in the slot so peers can pull from this rank. */
static int work_all_to_all_v(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks, me = comm->rank;
    const uint64_t *recv_counts = op->vectors + 2 * n, *rdispls = op->vectors + 3 * n;
    for (uint32_t r = 0; r < n; r++) {
        const uint64_t *theirs = slot_vectors(comm, r);
        uint64_t count = theirs[me], displ = theirs[n + me];
        if (count != recv_counts[r])
            return hccl_error(HCCL_E_PARA, HCCL_SIM_MISMATCH_MARK "%s' at operation #%llu: rank %u called "
                              "all_to_all_v(%s, recvCounts[%u] = %llu) but rank %u called all_to_all_v(%s, "
                              "sendCounts[%u] = %llu)", comm->name, (unsigned long long)op->cseq, me,
                              hccl_dtype_name(op->dtype), r, (unsigned long long)recv_counts[r], r,
                              hccl_dtype_name(op->dtype), me, (unsigned long long)count);
        sim_copy((char *)op->recv + rdispls[r] * elem, buffer_of(comm, r, desc_of(op, r)->send_offset) + displ * elem,
                  count * elem, false);
    }
    return STEP_DONE;
}

static int work_all_to_all_vc(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks, me = comm->rank;
    const uint64_t *m = op->vectors; /* m[i * n + j]: elements rank i sends to rank j */
    uint64_t recv_at = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint64_t send_at = 0;
        for (uint32_t k = 0; k < me; k++)
            send_at += m[(uint64_t)r * n + k];
        uint64_t count = m[(uint64_t)r * n + me];
        sim_copy((char *)op->recv + recv_at * elem, buffer_of(comm, r, desc_of(op, r)->send_offset) + send_at * elem,
                  count * elem, false);
        recv_at += count;
    }
    return STEP_DONE;
}

/* vectors: recvCounts, recvDispls.  This rank's own entry was checked against its sendCount
 * when the operation was called (ops.c); the other ranks' entries can only be checked here. */
static int work_all_gather_v(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks;
    const uint64_t *recv_counts = op->vectors, *displs = op->vectors + n;
    for (uint32_t r = 0; r < n; r++) {
        const op_desc_t *d = desc_of(op, r);
        if (d->count != recv_counts[r])
            return hccl_error(HCCL_E_PARA, HCCL_SIM_MISMATCH_MARK "%s' at operation #%llu: rank %u called "
                              "all_gather_v(%s, recvCounts[%u] = %llu) but rank %u called all_gather_v(sendCount=%llu, "
                              "%s)", comm->name, (unsigned long long)op->cseq, comm->rank, hccl_dtype_name(op->dtype),
                              r, (unsigned long long)recv_counts[r], r, (unsigned long long)d->count,
                              hccl_dtype_name(op->dtype));
        sim_copy((char *)op->recv + displs[r] * elem, buffer_of(comm, r, d->send_offset), d->count * elem, false);
    }
    return STEP_DONE;
}

/* vectors: sendCounts, sendDispls (published).  sendCounts[rank] = recvCount of this rank was
 * checked when the operation was called (ops.c); what the other ranks send it, only here. */
static int work_reduce_scatter_v(op_task_t *op, size_t elem)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks, me = comm->rank;
    for (uint32_t r = 0; r < n; r++) {
        const uint64_t *theirs = slot_vectors(comm, r);
        if (theirs[me] != op->recv_count)
            return hccl_error(HCCL_E_PARA, HCCL_SIM_MISMATCH_MARK "%s' at operation #%llu: rank %u called "
                              "reduce_scatter_v(recvCount=%llu, %s, %s) but rank %u called reduce_scatter_v(%s, %s, "
                              "sendCounts[%u] = %llu)", comm->name, (unsigned long long)op->cseq, me,
                              (unsigned long long)op->recv_count, hccl_dtype_name(op->dtype), hccl_op_name(op->op), r,
                              hccl_dtype_name(op->dtype), hccl_op_name(op->op), me,
                              (unsigned long long)theirs[me]);
        comm->scratch_in[r] = buffer_of(comm, r, desc_of(op, r)->send_offset) + theirs[n + me] * elem;
    }
    comm->scratch_out[0] = op->recv;
    hccl_reduce(comm->scratch_out, 1, comm->scratch_in, (int)n, op->recv_count, op->dtype, op->op, op->streaming);
    return STEP_DONE;
}

/* ------------------------------------------------------------------ eager
 *
 * When no rank contributes more than HCCL_SIM_EAGER_BYTES, each rank copies
 * its contribution into its slot as it announces the operation, and once all
 * have arrived computes its own outputs from the slots.  No rank touches
 * another's buffers, so none waits for the others to finish: one exchange
 * instead of two, which is most of a small operation's latency.  The slot's
 * two copies (by parity) keep the data a slower peer still reads. */

/* The most a rank contributes to `op` when it can go eager, else UINT64_MAX.
 * It depends only on what every rank passes alike, so all ranks agree. */
static uint64_t eager_bytes(const op_task_t *op, size_t elem)
{
    uint64_t n = op->comm->nranks;
    switch (op->type) {
    case HCCL_CMD_ALLREDUCE:
    case HCCL_CMD_REDUCE:
    case HCCL_CMD_ALLGATHER:
    case HCCL_CMD_BROADCAST: return op->count * elem;
    case HCCL_CMD_REDUCE_SCATTER:
    case HCCL_CMD_ALLTOALL:
    case HCCL_CMD_SCATTER: return op->count * elem * n;
    case HCCL_CMD_BARRIER: return 0;
    default: return UINT64_MAX;
    }
}

bool hccl_op_is_eager(const op_task_t *op)
{
    if (op->comm->net != NULL)
        return false; /* the steps of an operation spanning servers are netops.c's */
    return eager_bytes(op, hccl_dtype_size(op->dtype)) <= HCCL_SIM_EAGER_BYTES;
}

/* Tiny: an eager collective whose parts fit in the progress word's cache line, with a signature
 * that says all the ranks must agree on in one word (tiny_signature).  A rank that sees it
 * announced then has everything in the line that brought the announcement: one transfer
 * between cores, where the descriptor and the data took a second one after it. */
static bool is_tiny(const op_task_t *op)
{
    return eager_bytes(op, hccl_dtype_size(op->dtype)) <= HCCL_SIM_TINY_BYTES && op->root < (1u << 24);
}

/* Type, data type, reduce op, count and root of a tiny collective: equal words mean calls that
 * match (same_call).  Never 0, which other collectives publish, so a tiny call and one that is
 * not always differ. */
static uint64_t tiny_signature(const op_task_t *op)
{
    return 1u | (uint64_t)(op->type & 0xff) << 8 | (uint64_t)((uint32_t)op->dtype & 0xff) << 16 |
           (uint64_t)((uint32_t)op->op & 0xff) << 24 | (uint64_t)op->count << 32 | (uint64_t)op->root << 40;
}

/* Whether every rank published this rank's signature of tiny collective `op`; if not, the
 * descriptors say what differs (check_signatures). */
static bool tiny_signatures_agree(const op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    uint32_t parity = op->cseq & 1;
    uint64_t mine = comm_slot(comm, comm->rank)->tiny_sig[parity];
    for (uint32_t r = 0; r < comm->nranks; r++)
        if (comm_slot(comm, r)->tiny_sig[parity] != mine)
            return false;
    return true;
}

static void post_eager(op_task_t *op)
{
    uint64_t bytes = eager_bytes(op, hccl_dtype_size(op->dtype));
    bool rooted = op->type == HCCL_CMD_BROADCAST || op->type == HCCL_CMD_SCATTER;
    if (bytes > 0 && (!rooted || op->root == op->comm->rank))
        memcpy(eager_of(op, op->comm->rank), op->send, bytes);
}

static int work_eager(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks, me = comm->rank;
    uint64_t bytes = op->count * hccl_dtype_size(op->dtype);
    switch (op->type) {
    case HCCL_CMD_ALLREDUCE:
    case HCCL_CMD_REDUCE:
    case HCCL_CMD_REDUCE_SCATTER:
        if (op->recv == NULL) /* a reduce's other ranks */
            return STEP_DONE;
        for (uint32_t r = 0; r < n; r++)
            comm->scratch_in[r] = eager_of(op, r) + (op->type == HCCL_CMD_REDUCE_SCATTER ? me * bytes : 0);
        hccl_reduce(&op->recv, 1, comm->scratch_in, (int)n, op->count, op->dtype, op->op, false);
        return STEP_DONE;
    case HCCL_CMD_BROADCAST:
        if (me != op->root)
            memcpy(op->send, eager_of(op, op->root), bytes);
        return STEP_DONE;
    case HCCL_CMD_SCATTER:
        memcpy(op->recv, eager_of(op, op->root) + me * bytes, bytes);
        return STEP_DONE;
    case HCCL_CMD_ALLGATHER:
    case HCCL_CMD_ALLTOALL:
        for (uint32_t r = 0; r < n; r++)
            memcpy((char *)op->recv + r * bytes, eager_of(op, r) + (op->type == HCCL_CMD_ALLTOALL ? me * bytes : 0),
                   bytes);
        return STEP_DONE;
    default: /* barrier: arriving was all */
        return STEP_DONE;
    }
}

static int do_work(op_task_t *op)
{
    size_t elem = hccl_dtype_size(op->dtype);
    op->streaming = volume(op, elem) >= STREAMING_BYTES;
    switch (op->type) {
    case HCCL_CMD_ALLREDUCE: return work_all_reduce(op, elem);
    case HCCL_CMD_REDUCE: return work_reduce(op, elem);
    case HCCL_CMD_BROADCAST: return work_broadcast(op, elem);
    case HCCL_CMD_ALLGATHER: return work_all_gather(op, elem);
    case HCCL_CMD_REDUCE_SCATTER: return work_reduce_scatter(op, elem);
    case HCCL_CMD_ALLTOALL: return work_all_to_all(op, elem);
    case HCCL_CMD_SCATTER: return work_scatter(op, elem);
    case HCCL_CMD_ALLTOALLV: return work_all_to_all_v(op, elem);
    case HCCL_CMD_ALLTOALLVC: return work_all_to_all_vc(op, elem);
    case HCCL_CMD_ALLGATHER_V: return work_all_gather_v(op, elem);
    case HCCL_CMD_REDUCE_SCATTER_V: return work_reduce_scatter_v(op, elem);
    default: return STEP_DONE; /* barrier */
    }
}

static uint64_t digest(const uint64_t *values, uint64_t count)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t i = 0; i < count; i++) {
        h ^= values[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void publish_descriptor(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks;
    op_desc_t *d = &comm_slot(comm, comm->rank)->op[op->cseq & 1];
    d->seq = op->cseq;
    d->type = op->type;
    d->dtype = op->dtype;
    d->recv_dtype = op->recv_dtype;
    d->op = op->op;
    d->root = op->root;
    d->count = op->count;
    d->send_offset = op->send_offset;
    d->recv_offset = op->recv_offset;
    comm_slot(comm, comm->rank)->call[op->cseq & 1] = op->call;
    uint64_t *vectors = slot_vectors(comm, comm->rank);
    if (op->type == HCCL_CMD_ALLTOALLV || op->type == HCCL_CMD_REDUCE_SCATTER_V)
        memcpy(vectors, op->vectors, 2 * n * sizeof *vectors);
    if (op->type == HCCL_CMD_ALLTOALLVC) {
        /* The digest compares whole matrices in one word; the matrix (or, with many ranks, this
         * rank's row and column) names an entry that differs (matrix_difference).  The vectors
         * are free: a rank reads a peer's only while both run the same operation, which does not
         * end on either before both are done with them. */
        d->count = digest(op->vectors, (uint64_t)n * n);
        if (n <= HCCL_SIM_FULL_MATRIX_RANKS) {
            memcpy(vectors, op->vectors, (size_t)n * n * sizeof *vectors);
        } else {
            for (uint32_t j = 0; j < n; j++) {
                vectors[j] = op->vectors[(uint64_t)comm->rank * n + j];
                vectors[n + j] = op->vectors[(uint64_t)j * n + comm->rank];
            }
        }
    }
}

static int step_collective(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    switch (op->phase) {
    case 0:
        op->tiny = is_tiny(op);
        publish_descriptor(op);
        comm_slot(comm, comm->rank)->tiny_sig[op->cseq & 1] = op->tiny ? tiny_signature(op) : 0;
        if (hccl_op_is_eager(op))
            post_eager(op);
        hccl_publish(comm, PROGRESS(op->cseq, 1));
        op->phase = 1;
        /* fall through */
    case 1: {
        if (!all_reached(comm, PROGRESS(op->cseq, 1)))
            return STEP_BLOCKED;
        int rc = op->tiny && tiny_signatures_agree(op) ? STEP_DONE : check_signatures(op);
        if (rc == STEP_DONE && hccl_op_is_eager(op))
            return work_eager(op); /* nobody waits for this rank to finish */
        if (rc == STEP_DONE)
            rc = do_work(op);
        if (rc != STEP_DONE)
            return rc;
        if (op->streaming)
            sim_store_fence(); /* the cache-bypassing stores land before the progress word */
        hccl_publish(comm, PROGRESS(op->cseq, 2));
        op->phase = 2;
    }
        /* fall through */
    default:
        return all_reached(comm, PROGRESS(op->cseq, 2)) ? STEP_DONE : STEP_BLOCKED;
    }
}

/* ---------------------------------------------------------- point to point */

enum { ITEM_NEW = 0, ITEM_POSTED, ITEM_DONE };

static int send_progress(op_task_t *op, uint32_t i)
{
    hccl_comm_t *comm = op->comm;
    const HcclSendRecvItem *item = &op->items[i];
    uint32_t peer = item->remoteRank;
    if (op->item_state[i] == ITEM_NEW) {
        /* One descriptor per channel: an earlier send to the same peer in this
         * batch must be consumed first. */
        for (uint32_t j = 0; j < i; j++)
            if (op->items[j].sendRecvType == HCCL_SEND && op->items[j].remoteRank == peer &&
                op->item_state[j] != ITEM_DONE)
                return STEP_BLOCKED;
        p2p_out_t *out = &slot_p2p_out(comm, comm->rank)[peer];
        uint64_t seq = ++comm->send_seq[peer];
        out->count = item->count;
        out->dtype = item->dataType;
        uint64_t offset = 0;
        char why[8];
        sim_device_range(comm->device, item->buf, 0, &offset, why, sizeof why);
        out->offset = offset;
        atomic_store_explicit(&out->posted, seq, memory_order_release);
        hccl_wake(comm);
        op->item_seq[i] = seq;
        op->item_state[i] = ITEM_POSTED;
        return STEP_MOVED;
    }
    p2p_in_t *in = &slot_p2p_in(comm, peer)[comm->rank];
    if (atomic_load_explicit(&in->consumed, memory_order_acquire) < op->item_seq[i])
        return STEP_BLOCKED;
    uint32_t status = atomic_load(&in->status);
    if (status != HCCL_SUCCESS)
        return hccl_error((HcclResult)status, "%s p2p #%llu: rank %u sent %llu %s to rank %u on '%s', but rank %u "
                          "posted a receive of %llu %s", hccl_cmd_name(op->type), (unsigned long long)op->pseq,
                          comm->rank, (unsigned long long)item->count, hccl_dtype_name(item->dataType), peer,
                          comm->name, peer, (unsigned long long)in->count, hccl_dtype_name(in->dtype));
    op->item_state[i] = ITEM_DONE;
    return STEP_MOVED;
}

static int recv_progress(op_task_t *op, uint32_t i)
{
    hccl_comm_t *comm = op->comm;
    const HcclSendRecvItem *item = &op->items[i];
    uint32_t peer = item->remoteRank;
    if (op->item_state[i] == ITEM_NEW) {
        op->item_seq[i] = ++comm->recv_seq[peer];
        op->item_state[i] = ITEM_POSTED;
    }
    p2p_out_t *out = &slot_p2p_out(comm, peer)[comm->rank];
    if (atomic_load_explicit(&out->posted, memory_order_acquire) < op->item_seq[i])
        return STEP_BLOCKED;
    p2p_in_t *in = &slot_p2p_in(comm, comm->rank)[peer];
    if (out->count != item->count || out->dtype != (uint32_t)item->dataType) {
        in->count = item->count;
        in->dtype = (uint32_t)item->dataType;
        atomic_store(&in->status, HCCL_E_PARA); /* after the fields above: the sender reads them once it sees it */
        atomic_store_explicit(&in->consumed, op->item_seq[i], memory_order_release);
        hccl_wake(comm);
        return hccl_error(HCCL_E_PARA, "%s p2p #%llu: rank %u sent %llu %s to rank %u on '%s', but rank %u posted a "
                          "receive of %llu %s", hccl_cmd_name(op->type), (unsigned long long)op->pseq, peer,
                          (unsigned long long)out->count, hccl_dtype_name(out->dtype), comm->rank, comm->name,
                          comm->rank, (unsigned long long)item->count, hccl_dtype_name(item->dataType));
    }
    size_t bytes = (size_t)item->count * hccl_dtype_size(item->dataType);
    if (bytes > 0)
        memcpy(item->buf, buffer_of(comm, peer, out->offset), bytes);
    atomic_store(&in->status, HCCL_SUCCESS);
    atomic_store_explicit(&in->consumed, op->item_seq[i], memory_order_release);
    hccl_wake(comm);
    op->item_state[i] = ITEM_DONE;
    return STEP_MOVED;
}

/* The items of a batch whose peer is the rank itself: the k-th send to itself is copied into the
 * k-th receive from itself (ops.c check_self_pairs has checked that they pair up), before any
 * transfer with a peer, as CANN orders them.  Nothing waits: the copies are done at once. */
static void copy_to_self(op_task_t *op)
{
    uint32_t me = op->comm->rank, s = 0, r = 0, n = op->item_count;
    for (;;) {
        while (s < n && (op->items[s].remoteRank != me || op->items[s].sendRecvType != HCCL_SEND))
            s++;
        while (r < n && (op->items[r].remoteRank != me || op->items[r].sendRecvType != HCCL_RECV))
            r++;
        if (s == n || r == n)
            break;
        const HcclSendRecvItem *send = &op->items[s], *recv = &op->items[r];
        uint64_t bytes = send->count * hccl_dtype_size(send->dataType);
        if (bytes > 0 && send->buf != recv->buf)
            sim_copy(recv->buf, send->buf, bytes, false);
        op->item_state[s++] = ITEM_DONE;
        op->item_state[r++] = ITEM_DONE;
    }
    op->self_copied = true;
}

static int step_p2p(op_task_t *op)
{
    if (!op->self_copied)
        copy_to_self(op);
    for (;;) {
        bool moved = false, done = true;
        for (uint32_t i = 0; i < op->item_count; i++) {
            if (op->item_state[i] == ITEM_DONE)
                continue;
            done = false;
            int rc = op->items[i].sendRecvType == HCCL_SEND ? send_progress(op, i) : recv_progress(op, i);
            if (rc == STEP_MOVED)
                moved = true;
            else if (rc != STEP_BLOCKED)
                return rc;
        }
        if (done)
            return STEP_DONE;
        if (!moved)
            return STEP_BLOCKED;
    }
}

/* ------------------------------------------------------------- the engine */

static int step(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    if (!op->started) {
        /* Operations of one communicator run in the order they were queued,
         * even when they sit on different streams. */
        if (atomic_load_explicit(&comm->lseq_done, memory_order_acquire) != op->lseq - 1)
            return STEP_BLOCKED;
        op->started = true; /* its deadline is set once it has to wait (hccl_op_run) */
    }
    return hccl_cmd_is_collective(op->type) ? step_collective(op) : step_p2p(op);
}

/* Runs the operation on copies of the imported buffers it was given (hccl_shadow_t): made in this
 * rank's device memory, where the other ranks reach them, when the operation starts. */
static int attach_shadows(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    for (uint32_t i = 0; i < op->shadow_count; i++) {
        hccl_shadow_t *sh = &op->shadow[i];
        if (sh->copy != NULL)
            continue;
        sim_arena_loc_t loc;
        char *base = NULL;
        if (sim_arena_alloc_block(comm->device, SIM_MAX(sh->bytes, 1), "HCCL", &sh->copy_offset, &loc) != 0 ||
            sim_device_arena(comm->device, &loc, &base) != 0)
            return hccl_error(HCCL_E_MEMORY, "copying %llu bytes of imported memory into device %d's own memory "
                              "for %s: %s", (unsigned long long)sh->bytes, comm->device, hccl_cmd_name(op->type),
                              sim_error_text());
        sh->copy = base + sh->copy_offset;
        sim_copy(sh->copy, sh->user, sh->bytes, false);
        if (op->send == sh->user)
            op->send = sh->copy, op->send_offset = sh->copy_offset;
        if (op->recv == sh->user)
            op->recv = sh->copy, op->recv_offset = sh->copy_offset;
    }
    return HCCL_SUCCESS;
}

/* Copies an operation's results back into the imported buffers it wrote (`done`), and gives the
 * copies back. */
static void detach_shadows(op_task_t *op, bool done)
{
    for (uint32_t i = 0; i < op->shadow_count; i++) {
        hccl_shadow_t *sh = &op->shadow[i];
        if (sh->copy == NULL)
            continue;
        bool written = op->recv == sh->copy || op->type == HCCL_CMD_BROADCAST;
        if (done && written)
            sim_copy(sh->user, sh->copy, sh->bytes, false);
        sim_arena_free_block(op->comm->device, sh->copy_offset);
        sh->copy = NULL;
    }
}

static void finish(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    detach_shadows(op, true);
    atomic_store_explicit(&comm->lseq_done, op->lseq, memory_order_release);
    atomic_fetch_sub(&comm->pending, 1);
    hccl_wake(comm);
}

static int acl_code_for(int hccl_code)
{
    switch (hccl_code) {
    case HCCL_E_TIMEOUT: return ACL_ERROR_RT_TASK_TIMEOUT;
    case HCCL_E_REMOTE: return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
    default: return ACL_ERROR_RT_AICPU_EXCEPTION;
    }
}

static const char *api_name(uint32_t type)
{
    switch (type) {
    case HCCL_CMD_BROADCAST: return "HcclBroadcast";
    case HCCL_CMD_ALLREDUCE: return "HcclAllReduce";
    case HCCL_CMD_REDUCE: return "HcclReduce";
    case HCCL_CMD_SEND: return "HcclSend";
    case HCCL_CMD_RECEIVE: return "HcclRecv";
    case HCCL_CMD_ALLGATHER: return "HcclAllGather";
    case HCCL_CMD_REDUCE_SCATTER: return "HcclReduceScatter";
    case HCCL_CMD_ALLTOALLV: return "HcclAlltoAllV";
    case HCCL_CMD_ALLTOALLVC: return "HcclAlltoAllVC";
    case HCCL_CMD_ALLTOALL: return "HcclAlltoAll";
    case HCCL_CMD_SCATTER: return "HcclScatter";
    case HCCL_CMD_BATCH_SEND_RECV: return "HcclBatchSendRecv";
    case HCCL_CMD_ALLGATHER_V: return "HcclAllGatherV";
    case HCCL_CMD_REDUCE_SCATTER_V: return "HcclReduceScatterV";
    case HCCL_CMD_BARRIER: return "HcclBarrier";
    default: return "HCCL operation";
    }
}

/* How messages name an operation: "all_reduce #3", or "send p2p #2" (point-to-point calls are
 * numbered apart from the collectives, as hcclpy's flight recorder numbers them). */
typedef struct {
    char text[48];
} op_label_t;

static op_label_t op_label(const op_task_t *op)
{
    op_label_t label;
    bool collective = hccl_cmd_is_collective(op->type);
    snprintf(label.text, sizeof label.text, "%s %s#%llu", hccl_cmd_name(op->type), collective ? "" : "p2p ",
             (unsigned long long)(collective ? op->cseq : op->pseq));
    return label;
}

/* Ends a failed operation: the communicator is broken on every rank, the
 * reason is kept for HcclGetCommAsyncError, and the stream fails. */
static int fail(op_task_t *op, int code)
{
    hccl_comm_t *comm = op->comm;
    char text[1024];
    snprintf(text, sizeof text, "%s", sim_error_text());
    detach_shadows(op, false);
    uint32_t expected = HCCL_SUCCESS;
    if (atomic_compare_exchange_strong(&comm->async_error, &expected, (uint32_t)code))
        snprintf(comm->async_text, sizeof comm->async_text, "%s", text);
    hccl_comm_abort(comm, (HcclResult)code, "%s", text);
    finish(op);
    return sim_error(acl_code_for(code), "%s failed on rank %u of '%s': %s (%s)", api_name(op->type), comm->rank,
                     comm->name, text, hccl_result_name((HcclResult)code));
}

/* Whether the operation still needs something from rank `r`. */
static bool waiting_on(op_task_t *op, uint32_t r)
{
    hccl_comm_t *comm = op->comm;
    if (r == comm->rank)
        return false;
    if (hccl_cmd_is_collective(op->type))
        return atomic_load(&comm_slot(comm, r)->progress) < PROGRESS(op->cseq, op->phase == 0 ? 1 : op->phase);
    for (uint32_t i = 0; i < op->item_count; i++)
        if (op->items[i].remoteRank == r && op->item_state[i] != ITEM_DONE)
            return true;
    return false;
}

/* Whether a send of this operation waits for a peer that has posted a send to this rank that no
 * receive of this rank has matched yet (`peer`): neither can go on until the other receives. */
static bool sends_into_a_send(op_task_t *op, uint32_t *peer)
{
    hccl_comm_t *comm = op->comm;
    for (uint32_t i = 0; i < op->item_count; i++) {
        const HcclSendRecvItem *item = &op->items[i];
        if (item->sendRecvType != HCCL_SEND || op->item_state[i] != ITEM_POSTED)
            continue;
        uint32_t r = item->remoteRank;
        const p2p_out_t *theirs = &slot_p2p_out(comm, r)[comm->rank];
        if (atomic_load_explicit(&theirs->posted, memory_order_acquire) > comm->recv_seq[r]) {
            *peer = r;
            return true;
        }
    }
    return false;
}

/* Names the ranks an operation is still waiting for. */
static void describe_wait(op_task_t *op, char *out, size_t len)
{
    hccl_comm_t *comm = op->comm;
    if (!op->started) {
        snprintf(out, len, "an earlier operation of this communicator on another stream has not finished");
        return;
    }
    size_t used = (size_t)snprintf(out, len, "waiting for rank(s) ");
    int listed = 0;
    for (uint32_t r = 0; r < comm->nranks && used < len - 32; r++) {
        if (!waiting_on(op, r))
            continue;
        used += (size_t)snprintf(out + used, len - used, "%s%u", listed ? ", " : "", r);
        if (++listed >= 16) {
            snprintf(out + used, len - used, ", ...");
            return;
        }
    }
    if (listed == 0) {
        snprintf(out, len, "waiting for the other ranks");
        return;
    }
    uint32_t peer;
    if (sends_into_a_send(op, &peer) && used < len)
        snprintf(out + used, len - used, "; rank %u is itself waiting for rank %u to receive a send: both ranks "
                 "send before they receive (a send/send deadlock); post the receive first on one of them, or "
                 "pair each send with its receive in one batch_send_recv", peer, comm->rank);
}

/* Fails when the communicator broke elsewhere, or when a rank this operation
 * still needs has left or died (a rank that already did its part may go). */
static int check_health(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    seg_header_t *header = comm->header;
    HcclResult broken = hccl_comm_broken(comm);
    if (broken != HCCL_SUCCESS) {
        const char *why = hccl_abort_text(header); /* first: the failing rank is written with it */
        return hccl_error(broken == HCCL_E_TIMEOUT ? HCCL_E_TIMEOUT : HCCL_E_REMOTE,
                          "rank %d failed first: %s", (int)header->abort_rank, why);
    }
    for (uint32_t r = 0; r < comm->nranks; r++) {
        if (!op->started || !waiting_on(op, r))
            continue;
        slot_head_t *slot = comm_slot(comm, r);
        if (atomic_load(&slot->suspended)) {
            /* Recorded as rank r's failure, as a suspension that stops r's own operation is: r's
             * HcclCommResume and later calls report HCCL_E_SUSPENDING, the others HCCL_E_REMOTE. */
            hccl_comm_abort_as(comm, r, HCCL_E_SUSPENDING, "rank %u suspended communicator '%s' (HcclCommSuspend) "
                               "while rank %u was waiting for it in %s", r, comm->name, comm->rank,
                               op_label(op).text);
            return hccl_error(HCCL_E_REMOTE, "rank %u suspended the communicator (HcclCommSuspend) while rank %u "
                              "was in %s", r, comm->rank, op_label(op).text);
        }
        if (atomic_load(&slot->state) == SLOT_LEFT)
            return hccl_error(HCCL_E_REMOTE, "rank %u destroyed the communicator while rank %u was in %s",
                              r, comm->rank, op_label(op).text);
        if (!sim_process_alive(slot->pid, slot->start_time))
            return hccl_error(HCCL_E_REMOTE, "rank %u (pid %d) died while rank %u was in %s", r,
                              (int)slot->pid, comm->rank, op_label(op).text);
    }
    return HCCL_SUCCESS;
}

/* Runs the operation until it is done, fails or passes the caller's
 * deadline.  A waiter about to sleep first counts itself in `sleepers` and
 * looks once more (`announced`): publishers only wake when someone is counted
 * (hccl_wake), so the common, spinning wait costs them no shared write. */
static int run_op(op_task_t *op, int64_t caller_deadline_ns, bool *announced)
{
    hccl_comm_t *comm = op->comm;
    seg_header_t *header = comm->header;
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    backoff.no_spin = comm->oversubscribed;
    int64_t next_health = 0; /* the clock is read once the operation has to wait: most never do */
    for (;;) {
        /* Before the step: an operation a stream reaches after HcclCommSuspend publishes nothing,
         * or a peer joining later could complete its half with it while this rank fails. */
        if (atomic_load(&comm->suspended))
            return fail(op, hccl_error(HCCL_E_SUSPENDING, "%s on rank %u of '%s' was stopped by "
                                       "HcclCommSuspend (communicator aborted)", op_label(op).text,
                                       comm->rank, comm->name));
        uint32_t epoch = atomic_load(&header->epoch); /* read before step() looks at the peers */
        int rc = step(op);
        if (rc == STEP_DONE) {
            finish(op);
            return SIM_TASK_DONE;
        }
        if (rc != STEP_BLOCKED)
            return fail(op, rc);
        if (atomic_load(&comm->suspended))
            continue; /* reported at the top, as this rank's suspension (it broke the communicator too) */
        if (hccl_comm_broken(comm) != HCCL_SUCCESS) {
            /* A peer that broke it may have published, just before, what this rank needs to see
             * the failure for itself (calls that differ): one more look reports that rather than
             * a remote failure. */
            rc = step(op);
            return fail(op, rc != STEP_DONE && rc != STEP_BLOCKED && rc != STEP_MOVED ? rc : check_health(op));
        }
        int64_t now = sim_now_ns();
        if (next_health == 0)
            next_health = now + HEALTH_CHECK_NS;
        if (op->started && op->deadline_ns == 0)
            op->deadline_ns = comm->exec_timeout_ns > 0 ? now + comm->exec_timeout_ns : SIM_NO_DEADLINE;
        if (op->started && now > op->deadline_ns) {
            char waiting[512];
            describe_wait(op, waiting, sizeof waiting);
            double seconds = (double)comm->exec_timeout_ns / 1e9;
            return fail(op, hccl_error(HCCL_E_TIMEOUT, "%s timed out after %.3g s (HCCL_EXEC_TIMEOUT / "
                                       "hcclExecTimeOut): %s", op_label(op).text,
                                       seconds, waiting));
        }
        if (now > next_health) {
            int health = check_health(op);
            if (health != HCCL_SUCCESS)
                return fail(op, health);
            next_health = now + HEALTH_CHECK_NS;
        }
        if (now >= caller_deadline_ns)
            return SIM_TASK_AGAIN;
        if (!sim_backoff_step(&backoff))
            continue;
        if (!*announced) {
            atomic_fetch_add(&header->sleepers, 1);
            atomic_thread_fence(memory_order_seq_cst); /* pairs with the one in hccl_wake */
            *announced = true;
            continue; /* what was published before this is seen by the next step */
        }
        /* About to sleep: the rank we wait for may be this process's, with
         * its work sitting on a stream nobody runs. */
        sim_kick_idle_streams();
        int64_t slice = SLEEP_SLICE_NS;
        slice = SIM_MIN(slice, SIM_MAX(0, op->deadline_ns - now));
        slice = SIM_MIN(slice, SIM_MAX(0, caller_deadline_ns - now));
        sim_futex_wait(&header->epoch, epoch, slice, true);
    }
}

int hccl_op_run(sim_task_t *task, int64_t caller_deadline_ns)
{
    op_task_t *op = (op_task_t *)task;
    if (op->shadow_count > 0) {
        int err = attach_shadows(op);
        if (err != HCCL_SUCCESS)
            return fail(op, err);
    }
    if (op->comm->net != NULL) {
        /* Spanning servers: in the communicator's order as any other; run by the communicator's
         * network thread while this one waits, as long as its caller lets it. */
        hccl_comm_t *comm = op->comm;
        if (!op->started) {
            sim_backoff_t backoff;
            sim_backoff_init(&backoff);
            while (atomic_load_explicit(&comm->lseq_done, memory_order_acquire) != op->lseq - 1) {
                if (sim_now_ns() >= caller_deadline_ns)
                    return SIM_TASK_AGAIN;
                if (sim_backoff_step(&backoff))
                    usleep(50);
            }
            op->started = true;
            if (caller_deadline_ns == SIM_NO_DEADLINE) {
                /* A caller that waits however long it takes (the stream's worker, a C program's
                 * synchronisation) runs it here, without two hand-offs between threads. */
                int rc = hccl_net_run(op);
                if (rc != HCCL_SUCCESS)
                    return fail(op, rc);
                finish(op);
                return SIM_TASK_DONE;
            }
            int err = hccl_net_submit(op);
            if (err != HCCL_SUCCESS)
                return fail(op, err);
        }
        int rc = hccl_net_wait(op, caller_deadline_ns);
        if (rc == SIM_TASK_AGAIN)
            return SIM_TASK_AGAIN;
        if (rc != HCCL_SUCCESS)
            return fail(op, rc);
        finish(op);
        return SIM_TASK_DONE;
    }
    bool announced = false;
    int rc = run_op(op, caller_deadline_ns, &announced);
    if (announced)
        atomic_fetch_sub(&op->comm->header->sleepers, 1);
    return rc;
}

/* The stream failed before this operation ran: the peers would wait for it
 * forever, so the communicator is marked broken for them. */
void hccl_op_cancel(sim_task_t *task, int error, const char *why)
{
    op_task_t *op = (op_task_t *)task;
    hccl_comm_t *comm = op->comm;
    (void)error;
    hccl_error(HCCL_E_REMOTE, "rank %u skipped %s because its stream had already failed (%s)", comm->rank,
               op_label(op).text, why);
    fail(op, HCCL_E_REMOTE);
}
