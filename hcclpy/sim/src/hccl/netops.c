/* The operations of a communicator whose ranks span servers, in HCCL's hierarchical form.
 *
 * Each runs as steps of this server's communicator (`local`, shared memory: run here, to its end,
 * as its own operations) and TCP transfers with ranks of the other servers (net.c):
 *
 * - all_reduce: when every server has as many ranks (m), reduce_scatter inside the server, each
 *   rank's 1/m slice reduced with the ranks of the same index on the other servers, all_gather in
 *   place inside (when m does not divide the count: all_reduce inside, the slices reduced across,
 *   gathered through staging); on uneven servers, all_reduce inside, the servers' lowest ranks
 *   reduce the whole and broadcast it inside their servers.  Servers are reduced in server order,
 *   so every rank gets the same bits whatever the sizes (and HCCL_DETERMINISTIC holds).
 * - broadcast: the root sends to the lowest rank of every other server, which broadcasts inside.
 * - all_gather(_v): gathered inside each server, the servers' blocks exchanged by their lowest
 *   ranks and broadcast inside.
 * - reduce, reduce_scatter(_v), scatter: an all_reduce or a broadcast into staging memory, of
 *   which each rank keeps its part.
 * - all_to_all(_v/_vc), send, recv, batch_send_recv: directly over TCP with the other servers'
 *   ranks, then inside the server.
 * - barrier: an all_reduce of one word.
 *
 * HCCL_ALGO=ring (or hcclAlgo "ring") asks for the flat form instead, for comparison: all_reduce
 * (and what runs through it) as one ring of every rank over TCP, servers ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccl/net.h"

#define ABORT_WHY_BYTES 512

/* ------------------------------------------------------ staging memory */

/* Device memory an operation stages through (its server's ranks read it as any device memory):
 * the communicator's blocks, taken in order by each operation and kept for the next, grown when
 * too small.  Kept, because memory given back to the arena is given back to the system: a
 * large operation would fault its staging in, page by page, every time. */
typedef struct {
    hccl_net_t *net;
    uint32_t used;
} staging_t;

static int stage(staging_t *st, uint64_t bytes, void **out)
{
    hccl_net_t *net = st->net;
    if (st->used == HCCL_NET_STAGING_BLOCKS)
        return hccl_error(HCCL_E_INTERNAL, "too many staging blocks in one operation");
    hccl_net_block_t *block = &net->staging[st->used];
    bytes = SIM_MAX(bytes, 64);
    if (block->bytes < bytes) {
        if (block->bytes > 0)
            sim_arena_free_block(net->device, block->offset);
        block->bytes = 0;
        sim_arena_loc_t loc;
        char *base = NULL;
        if (sim_arena_alloc_block(net->device, bytes, "HCCL", &block->offset, &loc) != 0 ||
            sim_device_arena(net->device, &loc, &base) != 0)
            return hccl_error(HCCL_E_MEMORY, "staging %llu bytes between servers on device %d: %s",
                              (unsigned long long)bytes, net->device, sim_error_text());
        block->bytes = bytes;
        block->base = base + block->offset;
    }
    st->used++;
    *out = block->base;
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------ inside the server */

static uint64_t offset_of(const hccl_net_t *net, const void *ptr)
{
    uint64_t offset = UINT64_MAX;
    char why[8];
    if (ptr == NULL || sim_device_range(net->device, ptr, 0, &offset, why, sizeof why) != 0)
        return UINT64_MAX;
    return offset;
}

static op_desc_t call_of(const op_task_t *op);

static op_task_t *local_op(const op_task_t *op, uint32_t type, const void *send, void *recv, uint64_t count)
{
    hccl_net_t *net = op->comm->net;
    op_task_t *sub = hccl_op_new(net->local, op->stream, type);
    if (sub == NULL)
        return NULL;
    /* Ranks whose calls differ are told so in terms of the calls, not of their steps. */
    sub->call = call_of(op);
    sub->call.seq = hccl_cmd_is_collective(op->type) ? op->cseq : 0;
    sub->send = (void *)send;
    sub->recv = recv;
    sub->send_offset = offset_of(net, send);
    sub->recv_offset = offset_of(net, recv);
    sub->count = count;
    sub->dtype = sub->recv_dtype = op->dtype;
    sub->op = op->op;
    return sub;
}

/* Runs `sub`, a step of `op` on this server's communicator, here and to its end (and frees it). */
static int local_run(const op_task_t *op, op_task_t *sub)
{
    if (sub == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    hccl_comm_t *local = sub->comm;
    hccl_op_number(sub);
    int rc = hccl_op_run(&sub->base, SIM_NO_DEADLINE);
    hccl_op_free(sub);
    if (rc == SIM_TASK_DONE)
        return HCCL_SUCCESS;
    uint32_t code = atomic_load(&local->async_error);
    char text[1024], ranks[128] = "";
    snprintf(text, sizeof text, "%s", sim_error_text());
    /* Its messages number the server's ranks from 0: say which they are. */
    const hccl_net_t *net = op->comm->net;
    uint32_t s = net->server, m = net->server_size[s];
    for (uint32_t i = 0, at = 0; i < m && i < 8 && at < sizeof ranks; i++)
        at += (uint32_t)snprintf(ranks + at, sizeof ranks - at, "%s%u", i ? ", " : "", net->members[s][i]);
    return hccl_error(code != HCCL_SUCCESS ? (HcclResult)code : HCCL_E_INTERNAL, "inside server '%s' (ranks "
                      "%s%s, numbered from 0 there): %s", net->server_name[s], ranks, m > 8 ? ", ..." : "", text);
}

static int local_broadcast(const op_task_t *op, void *buf, uint64_t count, uint32_t local_root)
{
    if (op->comm->net->server_size[op->comm->net->server] == 1 || count == 0)
        return HCCL_SUCCESS;
    op_task_t *sub = local_op(op, HCCL_CMD_BROADCAST, buf, NULL, count);
    if (sub != NULL)
        sub->root = local_root;
    return local_run(op, sub);
}

/* ------------------------------------------------------ across servers */

/* How a message between servers names the operation. */
static op_desc_t call_of(const op_task_t *op)
{
    op_desc_t d = {0};
    d.type = op->type;
    d.dtype = op->dtype;
    d.recv_dtype = op->recv_dtype;
    d.op = op->op;
    d.root = op->root;
    d.count = op->count;
    return d;
}

/* Every rank in `peers` (n of them) gets `bytes` of `mine`; theirs land in `theirs[i]`. */
static int swap_with(op_task_t *op, const uint32_t *peers, uint32_t n, const void *mine, void *const *theirs,
                     uint64_t bytes)
{
    if (n == 0 || bytes == 0)
        return HCCL_SUCCESS;
    hccl_xfer_t *x = calloc(n, sizeof *x);
    if (x == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    for (uint32_t i = 0; i < n; i++)
        x[i] = (hccl_xfer_t){.peer = peers[i], .send = mine, .send_bytes = bytes, .recv = theirs[i],
                             .recv_bytes = bytes, .what = call_of(op)};
    int err = hccl_net_exchange(op, x, n);
    free(x);
    return err;
}

/* Reduces `count` elements at `data` with the same elements of the ranks `peers` (one on each
 * other server, servers in order), in server order, into `data`. */
static int reduce_across(op_task_t *op, staging_t *st, const uint32_t *peers, void *data, uint64_t count)
{
    hccl_net_t *net = op->comm->net;
    uint32_t S = net->nservers;
    size_t bytes = count * hccl_dtype_size(op->dtype);
    if (S == 1 || bytes == 0)
        return HCCL_SUCCESS;
    char *staged;
    int err = stage(st, (uint64_t)bytes * (S - 1), (void **)&staged);
    if (err != HCCL_SUCCESS)
        return err;
    void *theirs[HCCL_SIM_MAX_RANKS];
    const void *ins[HCCL_SIM_MAX_RANKS];
    uint32_t others[HCCL_SIM_MAX_RANKS], k = 0;
    for (uint32_t t = 0; t < S; t++) {
        if (t == net->server) {
            ins[t] = data;
            continue;
        }
        others[k] = peers[t];
        theirs[k] = staged + (size_t)k * bytes;
        ins[t] = theirs[k];
        k++;
    }
    err = swap_with(op, others, k, data, theirs, bytes);
    if (err == HCCL_SUCCESS)
        hccl_reduce(&data, 1, ins, (int)S, count, op->dtype, op->op, false);
    return err;
}

/* The flat form: a ring of every rank, reduce-scatter then all-gather, each step a transfer to the
 * next rank and one from the previous. */
static int ring_all_reduce(op_task_t *op, staging_t *st, const void *send, void *recv, uint64_t count)
{
    hccl_net_t *net = op->comm->net;
    uint32_t n = net->nranks, r = net->rank;
    size_t elem = hccl_dtype_size(op->dtype);
    if (send != recv)
        memmove(recv, send, count * elem);
    if (n == 1 || count == 0)
        return HCCL_SUCCESS;
    uint64_t per = (count + n - 1) / n;
    char *data = recv, *incoming;
    int err = stage(st, per * elem, (void **)&incoming);
    for (uint32_t step = 0; err == HCCL_SUCCESS && step < 2 * (n - 1); step++) {
        bool reducing = step < n - 1;
        uint32_t k = reducing ? step : step - (n - 1);
        /* Reducing, rank r sends segment r - k and adds segment r - k - 1 into its own; gathering,
         * it passes on segment r + 1 - k, complete, and receives segment r - k. */
        uint32_t out_seg = reducing ? (r + n - k) % n : (r + 1 + n - k) % n;
        uint32_t in_seg = (r + 2 * n - k - 1) % n;
        if (!reducing)
            in_seg = (r + n - k) % n;
        uint64_t out_lo = SIM_MIN(count, out_seg * per), out_hi = SIM_MIN(count, out_lo + per);
        uint64_t in_lo = SIM_MIN(count, in_seg * per), in_hi = SIM_MIN(count, in_lo + per);
        hccl_xfer_t x[2] = {
            {.peer = (r + 1) % n, .send = data + out_lo * elem, .send_bytes = (out_hi - out_lo) * elem,
             .what = call_of(op)},
            {.peer = (r + n - 1) % n, .recv = reducing ? incoming : data + in_lo * elem,
             .recv_bytes = (in_hi - in_lo) * elem, .what = call_of(op)},
        };
        err = hccl_net_exchange(op, x, 2);
        if (err == HCCL_SUCCESS && reducing && in_hi > in_lo) {
            void *mine = data + in_lo * elem;
            const void *ins[2] = {incoming, mine};
            hccl_reduce(&mine, 1, ins, 2, in_hi - in_lo, op->dtype, op->op, false);
        }
    }
    return err;
}

/* all_reduce of `count` elements from `send` into `recv` (both device memory of this rank). */
static int all_reduce(op_task_t *op, staging_t *st, const void *send, void *recv, uint64_t count)
{
    hccl_net_t *net = op->comm->net;
    if (net->flat)
        return ring_all_reduce(op, st, send, recv, count);
    uint32_t m = net->server_size[net->server], j = net->local_rank_of[net->rank];
    size_t elem = hccl_dtype_size(op->dtype);
    if (count == 0)
        return HCCL_SUCCESS;
    int err;
    uint32_t peers[HCCL_SIM_MAX_RANKS];
    if (net->even && m > 1 && count % m == 0 && !net->flat) {
        /* As HCCL: reduce_scatter inside the server into this rank's slice j of the output, the
         * slice reduced with the ranks of index j of the other servers, all_gather in place. */
        uint64_t per = count / m;
        char *slice = (char *)recv + per * j * elem;
        for (uint32_t t = 0; t < net->nservers; t++)
            peers[t] = net->members[t][j];
        err = local_run(op, local_op(op, HCCL_CMD_REDUCE_SCATTER, send, slice, per));
        if (err == HCCL_SUCCESS)
            err = reduce_across(op, st, peers, slice, per);
        if (err == HCCL_SUCCESS)
            err = local_run(op, local_op(op, HCCL_CMD_ALLGATHER, slice, recv, per));
        return err;
    }
    if (m > 1)
        err = local_run(op, local_op(op, HCCL_CMD_ALLREDUCE, send, recv, count));
    else
        err = (send != recv ? memmove(recv, send, count * elem) : NULL, HCCL_SUCCESS);
    if (err != HCCL_SUCCESS)
        return err;
    if (!net->even) {
        /* Uneven servers: their lowest ranks reduce the whole, then broadcast it at home. */
        for (uint32_t t = 0; t < net->nservers; t++)
            peers[t] = net->leader[t];
        if (j == 0)
            err = reduce_across(op, st, peers, recv, count);
        return err == HCCL_SUCCESS ? local_broadcast(op, recv, count, 0) : err;
    }
    /* Even servers: slice j is reduced by the ranks of index j, then the slices are gathered. */
    uint64_t per = (count + m - 1) / m;
    uint64_t lo = SIM_MIN(count, per * j), hi = SIM_MIN(count, lo + per);
    for (uint32_t t = 0; t < net->nservers; t++)
        peers[t] = net->members[t][j];
    err = reduce_across(op, st, peers, (char *)recv + lo * elem, hi - lo);
    if (err != HCCL_SUCCESS || m == 1)
        return err;
    char *mine, *all;
    if ((err = stage(st, per * elem, (void **)&mine)) != HCCL_SUCCESS ||
        (err = stage(st, per * m * elem, (void **)&all)) != HCCL_SUCCESS)
        return err;
    memcpy(mine, (char *)recv + lo * elem, (hi - lo) * elem);
    err = local_run(op, local_op(op, HCCL_CMD_ALLGATHER, mine, all, per));
    if (err == HCCL_SUCCESS)
        memcpy(recv, all, count * elem);
    return err;
}

/* Broadcast of `count` elements at `buf` from rank `root`. */
static int broadcast(op_task_t *op, void *buf, uint64_t count, uint32_t root)
{
    hccl_net_t *net = op->comm->net;
    uint32_t home = net->server_of[root];
    size_t bytes = count * hccl_dtype_size(op->dtype);
    int err = HCCL_SUCCESS;
    if (net->rank == root && bytes > 0 && net->nservers > 1) {
        hccl_xfer_t *x = calloc(net->nservers, sizeof *x);
        if (x == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        uint32_t n = 0;
        for (uint32_t t = 0; t < net->nservers; t++)
            if (t != home)
                x[n++] = (hccl_xfer_t){.peer = net->leader[t], .send = buf, .send_bytes = bytes, .what = call_of(op)};
        err = hccl_net_exchange(op, x, n);
        free(x);
    } else if (net->server != home && net->rank == net->leader[net->server] && bytes > 0) {
        hccl_xfer_t x = {.peer = root, .recv = buf, .recv_bytes = bytes, .what = call_of(op)};
        err = hccl_net_exchange(op, &x, 1);
    }
    if (err != HCCL_SUCCESS)
        return err;
    return local_broadcast(op, buf, count, net->server == home ? net->local_rank_of[root] : 0);
}

/* Gathers every rank's `counts[r]` elements (this rank's at `send`) into `packed`, in rank order:
 * inside the server, then the servers' lowest ranks swap their servers' blocks and broadcast. */
static int gather_packed(op_task_t *op, staging_t *st, const void *send, const uint64_t *counts, char *packed)
{
    hccl_net_t *net = op->comm->net;
    uint32_t n = net->nranks, S = net->nservers, s = net->server, m = net->server_size[s];
    size_t elem = hccl_dtype_size(op->dtype);
    uint64_t total = 0, server_total[HCCL_SIM_MAX_RANKS] = {0};
    for (uint32_t r = 0; r < n; r++) {
        total += counts[r];
        server_total[net->server_of[r]] += counts[r];
    }
    /* This server's blocks, in its local order, then the others' servers' as they come. */
    char *home, *away;
    int err;
    if ((err = stage(st, SIM_MAX(server_total[s], 1) * elem, (void **)&home)) != HCCL_SUCCESS ||
        (err = stage(st, SIM_MAX(total, 1) * elem, (void **)&away)) != HCCL_SUCCESS)
        return err;
    uint64_t *local_counts = calloc(2 * (size_t)m, sizeof *local_counts);
    if (local_counts == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    uint64_t next = 0;
    for (uint32_t i = 0; i < m; i++) {
        local_counts[i] = counts[net->members[s][i]];
        local_counts[m + i] = next;
        next += local_counts[i];
    }
    op_task_t *sub = local_op(op, HCCL_CMD_ALLGATHER_V, send, home, counts[net->rank]);
    if (sub != NULL) {
        sub->vectors = local_counts;
        sub->vector_count = 2 * m;
    } else {
        free(local_counts);
    }
    if (m > 1 || sub == NULL) {
        err = local_run(op, sub);
    } else {
        memcpy(home, send, counts[net->rank] * elem);
        hccl_op_free(sub);
    }
    if (err != HCCL_SUCCESS)
        return err;
    /* The servers' blocks: `away` holds them in server order; the lowest ranks swap them. */
    uint64_t at[HCCL_SIM_MAX_RANKS];
    for (uint32_t t = 0; t < S; t++)
        at[t] = t == 0 ? 0 : at[t - 1] + server_total[t - 1];
    if (net->rank == net->leader[s] && S > 1) {
        hccl_xfer_t *x = calloc(S, sizeof *x);
        if (x == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        uint32_t k = 0;
        for (uint32_t t = 0; t < S; t++)
            if (t != s)
                x[k++] = (hccl_xfer_t){.peer = net->leader[t], .send = home, .send_bytes = server_total[s] * elem,
                                       .recv = away + at[t] * elem, .recv_bytes = server_total[t] * elem,
                                       .what = call_of(op)};
        err = hccl_net_exchange(op, x, k);
        free(x);
    }
    if (err == HCCL_SUCCESS)
        err = local_broadcast(op, away, total, 0);
    if (err != HCCL_SUCCESS)
        return err;
    memcpy(away + at[s] * elem, home, server_total[s] * elem);
    /* From server order to rank order. */
    uint64_t from[HCCL_SIM_MAX_RANKS];
    memcpy(from, at, S * sizeof *from);
    uint64_t to = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t t = net->server_of[r];
        memcpy(packed + to * elem, away + from[t] * elem, counts[r] * elem);
        from[t] += counts[r];
        to += counts[r];
    }
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------ the operations */

static int run_all_gather(op_task_t *op, staging_t *st, const uint64_t *counts, const uint64_t *displs)
{
    uint32_t n = op->comm->nranks;
    size_t elem = hccl_dtype_size(op->dtype);
    uint64_t total = 0;
    for (uint32_t r = 0; r < n; r++)
        total += counts[r];
    char *packed;
    int err = stage(st, SIM_MAX(total, 1) * elem, (void **)&packed);
    if (err == HCCL_SUCCESS)
        err = gather_packed(op, st, op->send, counts, packed);
    uint64_t at = 0;
    for (uint32_t r = 0; err == HCCL_SUCCESS && r < n; at += counts[r], r++)
        memcpy((char *)op->recv + displs[r] * elem, packed + at * elem, counts[r] * elem);
    return err;
}

/* Reduces every rank's `total` elements at `send` and keeps `count` of them from `from`. */
static int reduce_keep(op_task_t *op, staging_t *st, const void *send, uint64_t total, uint64_t from, void *out,
                       uint64_t count)
{
    size_t elem = hccl_dtype_size(op->dtype);
    char *sum;
    int err = stage(st, SIM_MAX(total, 1) * elem, (void **)&sum);
    if (err == HCCL_SUCCESS)
        err = all_reduce(op, st, send, sum, total);
    if (err == HCCL_SUCCESS && out != NULL)
        memcpy(out, sum + from * elem, count * elem);
    return err;
}

/* Point to point, all_to_all(_v/_vc) and batches: one list of transfers with peers; those of
 * other servers go over TCP, the rest (this rank itself included) as a batch inside the server. */
static int run_items(op_task_t *op, const HcclSendRecvItem *items, uint32_t count)
{
    hccl_net_t *net = op->comm->net;
    hccl_xfer_t *x = calloc(count ? count : 1, sizeof *x);
    HcclSendRecvItem *home = calloc(count ? count : 1, sizeof *home);
    if (x == NULL || home == NULL) {
        free(x);
        free(home);
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    }
    uint32_t nx = 0, nhome = 0;
    for (uint32_t i = 0; i < count; i++) {
        const HcclSendRecvItem *it = &items[i];
        uint64_t bytes = it->count * hccl_dtype_size(it->dataType);
        if (net->server_of[it->remoteRank] == net->server) {
            home[nhome] = *it;
            home[nhome++].remoteRank = net->local_rank_of[it->remoteRank];
            continue;
        }
        op_desc_t what = {0};
        what.type = HCCL_CMD_SEND;
        what.count = it->count;
        what.dtype = it->dataType;
        x[nx++] = it->sendRecvType == HCCL_SEND
                      ? (hccl_xfer_t){.peer = it->remoteRank, .send = it->buf, .send_bytes = bytes, .what = what}
                      : (hccl_xfer_t){.peer = it->remoteRank, .recv = it->buf, .recv_bytes = bytes, .what = what};
    }
    int err = nx > 0 ? hccl_net_exchange(op, x, nx) : HCCL_SUCCESS;
    free(x);
    if (err == HCCL_SUCCESS && nhome > 0) {
        op_task_t *sub = local_op(op, HCCL_CMD_BATCH_SEND_RECV, NULL, NULL, 0);
        if (sub != NULL) {
            sub->items = home;
            sub->item_count = nhome;
            sub->item_seq = calloc(nhome, sizeof *sub->item_seq);
            sub->item_state = calloc(nhome, sizeof *sub->item_state);
            sub->dtype = sub->recv_dtype = home[0].dataType;
            home = NULL;
            if (sub->item_seq == NULL || sub->item_state == NULL) {
                hccl_op_free(sub);
                sub = NULL;
            }
        }
        err = local_run(op, sub);
    }
    free(home);
    return err;
}

/* all_to_all in every form, as a list of items: to each rank `send_counts[r]` elements from
 * `send_displs[r]`, from each `recv_counts[r]` into `recv_displs[r]`. */
static int run_all_to_all(op_task_t *op, const uint64_t *send_counts, const uint64_t *send_displs,
                          const uint64_t *recv_counts, const uint64_t *recv_displs)
{
    uint32_t n = op->comm->nranks;
    size_t elem = hccl_dtype_size(op->dtype);
    HcclSendRecvItem *items = calloc(2 * (size_t)n, sizeof *items);
    if (items == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    uint32_t k = 0;
    for (uint32_t r = 0; r < n; r++) {
        items[k++] = (HcclSendRecvItem){HCCL_SEND, (char *)op->send + send_displs[r] * elem, send_counts[r],
                                        op->dtype, r};
        items[k++] = (HcclSendRecvItem){HCCL_RECV, (char *)op->recv + recv_displs[r] * elem, recv_counts[r],
                                        op->dtype, r};
    }
    int err = run_items(op, items, k);
    free(items);
    return err;
}

static int dispatch(op_task_t *op, staging_t *st)
{
    hccl_comm_t *comm = op->comm;
    uint32_t n = comm->nranks, me = comm->rank;
    size_t elem = hccl_dtype_size(op->dtype);
    uint64_t *v = op->vectors;
    switch (op->type) {
    case HCCL_CMD_ALLREDUCE:
        return all_reduce(op, st, op->send, op->recv, op->count);
    case HCCL_CMD_REDUCE:
        return reduce_keep(op, st, op->send, op->count, 0, me == op->root ? op->recv : NULL, op->count);
    case HCCL_CMD_BROADCAST:
        return broadcast(op, op->send, op->count, op->root);
    case HCCL_CMD_BARRIER: {
        int32_t *word;
        int err = stage(st, sizeof *word, (void **)&word);
        if (err == HCCL_SUCCESS) {
            *word = 0;
            op->dtype = HCCL_DATA_TYPE_INT32;
            op->op = HCCL_REDUCE_SUM;
            err = all_reduce(op, st, word, word, 1);
        }
        return err;
    }
    case HCCL_CMD_REDUCE_SCATTER:
        return reduce_keep(op, st, op->send, op->count * n, op->count * me, op->recv, op->count);
    case HCCL_CMD_REDUCE_SCATTER_V: {
        /* vectors: sendCounts, sendDispls; the blocks are packed in rank order first */
        uint64_t total = 0, mine = 0;
        for (uint32_t r = 0; r < n; r++)
            total += v[r];
        char *packed;
        int err = stage(st, SIM_MAX(total, 1) * elem, (void **)&packed);
        uint64_t at = 0;
        for (uint32_t r = 0; err == HCCL_SUCCESS && r < n; at += v[r], r++) {
            memcpy(packed + at * elem, (char *)op->send + v[n + r] * elem, v[r] * elem);
            if (r == me)
                mine = at;
        }
        return err == HCCL_SUCCESS ? reduce_keep(op, st, packed, total, mine, op->recv, op->recv_count) : err;
    }
    case HCCL_CMD_ALLGATHER: {
        uint64_t *counts = malloc(2 * (size_t)n * sizeof *counts);
        if (counts == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        for (uint32_t r = 0; r < n; r++)
            counts[r] = op->count, counts[n + r] = op->count * r;
        int err = run_all_gather(op, st, counts, counts + n);
        free(counts);
        return err;
    }
    case HCCL_CMD_ALLGATHER_V:
        return run_all_gather(op, st, v, v + n);
    case HCCL_CMD_SCATTER: {
        char *all;
        int err = stage(st, SIM_MAX(op->count * n, 1) * elem, (void **)&all);
        if (err == HCCL_SUCCESS && me == op->root)
            memcpy(all, op->send, op->count * n * elem);
        if (err == HCCL_SUCCESS)
            err = broadcast(op, all, op->count * n, op->root);
        if (err == HCCL_SUCCESS)
            memcpy(op->recv, all + op->count * me * elem, op->count * elem);
        return err;
    }
    case HCCL_CMD_ALLTOALL: {
        uint64_t *c = malloc(2 * (size_t)n * sizeof *c);
        if (c == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        for (uint32_t r = 0; r < n; r++)
            c[r] = op->count, c[n + r] = op->count * r;
        int err = run_all_to_all(op, c, c + n, c, c + n);
        free(c);
        return err;
    }
    case HCCL_CMD_ALLTOALLV: /* vectors: sendCounts, sdispls, recvCounts, rdispls */
        return run_all_to_all(op, v, v + n, v + 2 * n, v + 3 * n);
    case HCCL_CMD_ALLTOALLVC: { /* vectors: the count matrix, m[i * n + j] from rank i to rank j */
        uint64_t *c = malloc(4 * (size_t)n * sizeof *c);
        if (c == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        uint64_t s_at = 0, r_at = 0;
        for (uint32_t r = 0; r < n; r++) {
            c[r] = v[(uint64_t)me * n + r], c[n + r] = s_at, s_at += c[r];
            c[2 * n + r] = v[(uint64_t)r * n + me], c[3 * n + r] = r_at, r_at += c[2 * n + r];
        }
        int err = run_all_to_all(op, c, c + n, c + 2 * n, c + 3 * n);
        free(c);
        return err;
    }
    default: /* send, recv, batch_send_recv */
        return run_items(op, op->items, op->item_count);
    }
}

int hccl_net_run(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    hccl_net_t *net = comm->net;
    if (atomic_load(&comm->suspended))
        return hccl_error(HCCL_E_SUSPENDING, "%s on rank %u of '%s' was stopped by HcclCommSuspend (communicator "
                          "aborted)", hccl_cmd_name(op->type), comm->rank, comm->name);
    if (hccl_comm_broken(comm) != HCCL_SUCCESS)
        return hccl_error(HCCL_E_REMOTE, "'%s' failed earlier: %s", comm->name, hccl_abort_text(comm->header));
    staging_t st = {net, 0};
    int err = dispatch(op, &st);
    if (err != HCCL_SUCCESS) {
        char why[ABORT_WHY_BYTES];
        snprintf(why, sizeof why, "%s", sim_error_text());
        hccl_net_shutdown(net, (HcclResult)err, why);
        hccl_error((HcclResult)err, "%s", why);
    }
    return err;
}
