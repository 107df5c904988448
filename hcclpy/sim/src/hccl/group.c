/* HcclGroupStart / HcclGroupEnd.
 *
 * Between the two calls a thread's operations are checked and held; at the
 * outermost HcclGroupEnd they are released together.  Sends and receives on
 * one communicator and stream become one batch, so a rank may send to and
 * receive from the same peer inside a group without deadlock.  Communicator
 * initialisations in a group run concurrently, so one thread can create the
 * communicators of several devices.
 */
#include <stdlib.h>
#include <string.h>

#include "hccl/internal.h"

/* A held operation keeps a reference on its stream until it is queued or dropped: a stream
 * destroyed meanwhile is then still memory to compare with (release_ops) rather than freed. */
typedef struct held {
    struct held *next;
    op_task_t *op;
    sim_stream_t *stream;
} held_t;

static __thread int t_depth;
static __thread held_t *t_ops, *t_ops_tail;
static __thread init_job_t *t_inits;
static __thread uint32_t t_init_count, t_init_capacity;

bool hccl_group_active(void)
{
    return t_depth > 0;
}

int hccl_group_add_op(op_task_t *op)
{
    held_t *entry = calloc(1, sizeof *entry);
    if (entry == NULL) {
        hccl_op_free(op);
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    }
    entry->op = op;
    entry->stream = op->stream;
    sim_stream_ref(entry->stream);
    if (t_ops_tail == NULL)
        t_ops = entry;
    else
        t_ops_tail->next = entry;
    t_ops_tail = entry;
    return HCCL_SUCCESS;
}

int hccl_group_add_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                        const HcclCommConfig *config, uint64_t join_kind, int device, HcclComm *out)
{
    if (t_init_count == t_init_capacity) {
        uint32_t capacity = t_init_capacity ? t_init_capacity * 2 : 8;
        init_job_t *grown = realloc(t_inits, capacity * sizeof *grown);
        if (grown == NULL)
            return hccl_error(HCCL_E_MEMORY, "out of host memory");
        t_inits = grown;
        t_init_capacity = capacity;
    }
    init_job_t *job = &t_inits[t_init_count++];
    memset(job, 0, sizeof *job);
    job->api = api;
    job->nranks = nranks;
    job->rank = rank;
    job->wire = *wire;
    if (config != NULL) {
        uint64_t size;
        memcpy(&size, config, sizeof size);
        memcpy(&job->config, config, (size_t)SIM_MIN(size, (uint64_t)sizeof job->config));
        job->has_config = true;
    }
    job->join_kind = join_kind;
    job->device = device;
    job->out = out;
    return HCCL_SUCCESS;
}

static bool is_p2p(const op_task_t *op)
{
    return op->type == HCCL_CMD_SEND || op->type == HCCL_CMD_RECEIVE || op->type == HCCL_CMD_BATCH_SEND_RECV;
}

/* Appends `from`'s items to `into` (both point-to-point). */
static int merge_items(op_task_t *into, op_task_t *from)
{
    uint32_t total = into->item_count + from->item_count;
    HcclSendRecvItem *items = realloc(into->items, total * sizeof *items);
    if (items == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    into->items = items;
    uint64_t *seq = realloc(into->item_seq, total * sizeof *seq);
    if (seq == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    into->item_seq = seq;
    uint8_t *state = realloc(into->item_state, total);
    if (state == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    into->item_state = state;
    memcpy(items + into->item_count, from->items, from->item_count * sizeof *items);
    memset(seq + into->item_count, 0, from->item_count * sizeof *seq);
    memset(state + into->item_count, 0, from->item_count);
    into->item_count = total;
    into->type = HCCL_CMD_BATCH_SEND_RECV;
    return HCCL_SUCCESS;
}

static void drop_held(void)
{
    while (t_ops != NULL) {
        held_t *entry = t_ops;
        t_ops = entry->next;
        if (entry->op != NULL)
            hccl_op_free(entry->op);
        sim_stream_unref(entry->stream);
        free(entry);
    }
    t_ops_tail = NULL;
    t_init_count = 0;
}

static int release_ops(void)
{
    bool collectives = false, p2p = false;
    for (held_t *e = t_ops; e != NULL; e = e->next) {
        collectives |= !is_p2p(e->op);
        p2p |= is_p2p(e->op);
    }
    if ((collectives || p2p) && t_init_count > 0)
        return hccl_error(HCCL_E_PARA, "HcclGroupEnd: a group holds communicator initialisations or operations, not "
                          "both");
    if (collectives && p2p)
        return hccl_error(HCCL_E_PARA, "HcclGroupEnd: a group holds collectives or send/receive operations, not both");
    /* The communicator and the stream of a held operation were checked when it was called, but
     * either may have been destroyed since: a destroyed stream is freed memory with no worker, so
     * queueing there would write freed memory and leave the operation pending forever. */
    for (held_t *e = t_ops; e != NULL; e = e->next) {
        const op_task_t *op = e->op;
        if (sim_handle_get(op->comm->handle, SIM_KIND_COMM) != op->comm)
            return hccl_error(HCCL_E_PARA, "HcclGroupEnd: communicator '%s' was destroyed while the group held an "
                              "operation on it (%s)", op->comm->name, hccl_cmd_name(op->type));
        if (sim_handle_get(op->stream_handle, SIM_KIND_STREAM) != op->stream)
            return hccl_error(HCCL_E_PARA, "HcclGroupEnd: the stream of a held operation (%s on '%s') was destroyed "
                              "before HcclGroupEnd", hccl_cmd_name(op->type), op->comm->name);
    }
    /* Merge every point-to-point operation into the first one queued on the
     * same communicator and stream. */
    for (held_t *e = t_ops; e != NULL && p2p; e = e->next) {
        if (e->op == NULL)
            continue;
        for (held_t *later = e->next; later != NULL; later = later->next) {
            op_task_t *op = later->op;
            if (op == NULL || op->comm != e->op->comm || op->stream != e->op->stream)
                continue;
            int err = merge_items(e->op, op);
            if (err != HCCL_SUCCESS)
                return err;
            hccl_op_free(op);
            later->op = NULL;
        }
    }
    while (t_ops != NULL) {
        held_t *entry = t_ops;
        t_ops = entry->next;
        if (entry->op != NULL)
            hccl_op_submit(entry->op);
        sim_stream_unref(entry->stream);
        free(entry);
    }
    t_ops_tail = NULL;
    return HCCL_SUCCESS;
}

static int release_inits(void)
{
    if (t_init_count == 0)
        return HCCL_SUCCESS;
    int err = hccl_run_init_jobs(t_inits, t_init_count);
    if (err == HCCL_SUCCESS)
        for (uint32_t i = 0; i < t_init_count; i++)
            *t_inits[i].out = t_inits[i].comm;
    t_init_count = 0;
    return err;
}

HCCL_API HcclResult HcclGroupStart(void)
{
    t_depth++;
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGroupEnd(void)
{
    if (t_depth == 0)
        return hccl_error(HCCL_E_PARA, "HcclGroupEnd without a matching HcclGroupStart");
    if (--t_depth > 0)
        return HCCL_SUCCESS;
    int err = release_ops();
    if (err == HCCL_SUCCESS)
        err = release_inits();
    drop_held();
    return err;
}

/* Groups nest per thread (HcclGroupStart counts): enabled from the first Start to its last End. */
HCCL_API HcclResult HcclGroupStatusGet(bool *isGroupEnabled)
{
    if (isGroupEnabled == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGroupStatusGet: isGroupEnabled is NULL");
    *isGroupEnabled = hccl_group_active();
    return HCCL_SUCCESS;
}

void hccl_group_after_fork(void)
{
    t_depth = 0;
    t_ops = t_ops_tail = NULL;
    t_init_count = 0;
}
