/* The HCCL operation entry points: every argument is checked before anything
 * is queued, then the operation is queued on the caller's stream (or held
 * until HcclGroupEnd). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hccl/internal.h"

/* ------------------------------------------------------------ op objects */

static void release_op(sim_task_t *task)
{
    hccl_op_free((op_task_t *)task);
}

static int replay_op(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy);

op_task_t *hccl_op_new(hccl_comm_t *comm, sim_stream_t *stream, uint32_t type)
{
    /* Per-call objects are zeroed by an assignment, not by calloc: glibc's calloc skips the
     * per-thread cache malloc takes small blocks from (~390 instructions a call against ~60,
     * callgrind), and compilers turn malloc followed by memset into calloc. */
    op_task_t *op = malloc(sizeof *op);
    if (op == NULL)
        return NULL;
    *op = (op_task_t){0};
    op->base.run = hccl_op_run;
    op->base.cancel = hccl_op_cancel;
    op->base.release = release_op;
    op->base.replay = replay_op;
    op->base.name = hccl_cmd_name(type);
    op->comm = comm;
    op->stream = stream;
    op->type = type;
    op->send_offset = op->recv_offset = UINT64_MAX;
    atomic_fetch_add(&comm->refs, 1);
    return op;
}

void hccl_op_free(op_task_t *op)
{
    hccl_comm_unref(op->comm);
    free(op->vectors);
    free(op->items);
    free(op->item_seq);
    free(op->item_state);
    free(op->net_text);
    free(op);
}

/* Numbers `op` as its communicator's next operation, under the communicator's lock: its place in
 * the communicator's order (lseq; operations run in it, whatever their streams) and, for a
 * collective, its number across ranks (cseq); it is pending until it finishes or is cancelled.
 * (A point-to-point call took its number, pseq, when it was made.) */
static inline void number_locked(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    op->lseq = ++comm->next_lseq;
    if (hccl_cmd_is_collective(op->type))
        op->cseq = ++comm->next_cseq;
    atomic_fetch_add(&comm->pending, 1);
}

void hccl_op_number(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    if (!hccl_cmd_is_collective(op->type))
        op->pseq = atomic_fetch_add(&comm->next_pseq, 1) + 1;
    pthread_mutex_lock(&comm->lock);
    number_locked(op);
    pthread_mutex_unlock(&comm->lock);
}

void hccl_op_submit(op_task_t *op)
{
    hccl_comm_t *comm = op->comm;
    sim_stream_t *stream = op->stream;
    pthread_mutex_lock(&comm->lock);
    number_locked(op);
    bool eager = hccl_op_is_eager(op);
    uint64_t place = sim_stream_enqueue(stream, &op->base);
    if (place == 0) {
        /* Captured (acl/capture.c): it runs when the model is executed, numbered then; nothing
         * is pending, and the numbers it took go back (the lock kept them the newest). */
        atomic_fetch_sub(&comm->pending, 1);
        comm->next_lseq--;
        if (hccl_cmd_is_collective(op->type))
            comm->next_cseq--;
        else
            atomic_fetch_sub(&comm->next_pseq, 1);
        eager = false;
    }
    pthread_mutex_unlock(&comm->lock);
    /* A small collective on an idle stream announces itself and posts its data now (and finishes, if
     * the peers are there), instead of when the stream is synchronised: the peers that wait for it go
     * on that much earlier.  The op may already be done and freed: only the stream is used. */
    if (eager)
        sim_stream_start(stream, place);
}

/* A fresh copy of a captured operation for an execution of its model on `stream`, numbered as the
 * call that made it would number it now: every rank executes its model's operations in the same
 * order, so the copies match across ranks as the originals would have.  The execution runs it
 * (acl/capture.c): it is not queued here. */
static int replay_op(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    const op_task_t *src = (const op_task_t *)task;
    hccl_comm_t *comm = src->comm;
    if (sim_handle_get(comm->handle, SIM_KIND_COMM) != comm)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclmdlRIExecuteAsync: the communicator of a captured %s was "
                         "destroyed (destroy the model first, or execute it before)", hccl_cmd_name(src->type));
    if (sim_stream_device(stream) != comm->device)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclmdlRIExecuteAsync: the stream belongs to device %d but the "
                         "captured %s's communicator to device %d", sim_stream_device(stream),
                         hccl_cmd_name(src->type), comm->device);
    op_task_t *op = hccl_op_new(comm, stream, src->type);
    if (op == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory replaying %s", hccl_cmd_name(src->type));
    op->send = src->send, op->recv = src->recv;
    op->send_offset = src->send_offset, op->recv_offset = src->recv_offset;
    op->count = src->count, op->recv_count = src->recv_count;
    op->dtype = src->dtype, op->recv_dtype = src->recv_dtype;
    op->op = src->op, op->root = src->root, op->peer = src->peer;
    op->vector_count = src->vector_count;
    op->item_count = src->item_count;
    memcpy(op->shadow, src->shadow, sizeof src->shadow); /* never attached: the capture does not run */
    op->shadow_count = src->shadow_count;
    uint32_t items = src->item_count ? src->item_count : 1;
    if (src->vectors != NULL && (op->vectors = malloc((size_t)(src->vector_count ? src->vector_count : 1) *
                                                      sizeof *op->vectors)) != NULL)
        memcpy(op->vectors, src->vectors, (size_t)src->vector_count * sizeof *op->vectors);
    if (src->items != NULL) {
        op->items = malloc(items * sizeof *op->items);
        op->item_seq = calloc(items, sizeof *op->item_seq);
        op->item_state = calloc(items, sizeof *op->item_state);
        if (op->items != NULL)
            memcpy(op->items, src->items, src->item_count * sizeof *op->items);
    }
    if ((src->vectors != NULL && op->vectors == NULL) ||
        (src->items != NULL && (op->items == NULL || op->item_seq == NULL || op->item_state == NULL))) {
        hccl_op_free(op);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory replaying %s", hccl_cmd_name(src->type));
    }
    hccl_op_number(op);
    /* One launch of a model runs nothing on the host, as on a device: the stream does it all. */
    *copy = &op->base;
    return ACL_SUCCESS;
}

static int dispatch(op_task_t *op)
{
    if (!hccl_cmd_is_collective(op->type))
        op->pseq = atomic_fetch_add(&op->comm->next_pseq, 1) + 1;
    if (hccl_group_active())
        return hccl_group_add_op(op);
    hccl_op_submit(op);
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------- validation */

typedef struct {
    const char *api;
    uint32_t type;                   /* HcclCMDType */
    const hccl_profile_t *profile;   /* HCCLPY_SIM_PROFILE; NULL: no limits */
    hccl_comm_t *comm;
    sim_stream_t *stream;
    void *stream_handle;
    hccl_shadow_t shadow[HCCL_SHADOWS]; /* imported buffers (check_buffer) */
    uint32_t shadow_count;
} call_t;

/* An entry point's call_t holds the reference hccl_comm_lookup took (a concurrent
 * HcclCommDestroy cannot free the communicator under it) and one on the stream (a concurrent
 * aclrtDestroyStream cannot free it while the operation is queued and started on it,
 * hccl_op_submit), and gives them back when the entry point returns, whichever way it returns.
 * Once queued, an operation needs no reference of its own: a stream is destroyed only after its
 * work is done. */
static void end_call(call_t *call)
{
    if (call->comm != NULL)
        hccl_comm_unref(call->comm);
    if (call->stream != NULL)
        sim_stream_unref(call->stream);
}

#define CALL(name) call_t name __attribute__((cleanup(end_call))) = {0}

static int begin(call_t *call, const char *api, uint32_t type, HcclComm comm_handle, aclrtStream stream_handle)
{
    call->api = api;
    call->type = type;
    int err = hccl_profile_get(api, &call->profile);
    if (err != HCCL_SUCCESS)
        return err;
    call->comm = hccl_comm_lookup(comm_handle, api, &err);
    if (call->comm == NULL)
        return err;
    if (stream_handle == NULL)
        return hccl_error(HCCL_E_PTR, "%s: stream is NULL (HCCL operations need a stream from aclrtCreateStream)",
                          api);
    call->stream = sim_stream_acquire(stream_handle, &err); /* referenced: see aclrtDestroyStream */
    call->stream_handle = stream_handle;
    if (call->stream == NULL)
        return hccl_error(HCCL_E_PARA, "%s: %p is not a live stream (never created, destroyed, or released by the "
                          "aclrtResetDevice that released its device)", api, stream_handle);
    int device = sim_stream_device(call->stream);
    if (device != call->comm->device)
        return hccl_error(HCCL_E_PARA, "%s: the stream belongs to device %d but communicator '%s' to device %d", api,
                          device, call->comm->name, call->comm->device);
    if (atomic_load(&call->comm->suspended))
        return hccl_error(HCCL_E_SUSPENDING, "%s: communicator '%s' is suspended (HcclCommResume)", api,
                          call->comm->name);
    return hccl_comm_check_usable(call->comm, api);
}

/* A type the simulator moves, and one the product profile allows for an
 * operation that does not reduce (check_op asks it for reductions, which it
 * answers for the data type and the reduce operation together). */
static int check_dtype(const call_t *call, const char *what, HcclDataType dtype)
{
    if (hccl_dtype_size(dtype) != 0)
        return hccl_cmd_reduces(call->type)
                   ? HCCL_SUCCESS
                   : hccl_profile_check(call->profile, call->api, call->type, dtype, HCCL_REDUCE_RESERVED);
    if (dtype == HCCL_DATA_TYPE_INT128 || dtype == HCCL_DATA_TYPE_HIF8 || dtype == HCCL_DATA_TYPE_FP8E4M3 ||
        dtype == HCCL_DATA_TYPE_FP8E5M2 || dtype == HCCL_DATA_TYPE_FP8E8M0)
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: %s %s (%d) is not supported", call->api, what,
                          hccl_dtype_name((uint32_t)dtype), (int)dtype);
    return hccl_error(HCCL_E_PARA, "%s: %s %d is not an HcclDataType", call->api, what, (int)dtype);
}

/* `op` is a reduce operation, and the product profile allows it with `dtype`
 * (already checked by check_dtype). */
static int check_op(const call_t *call, HcclReduceOp op, HcclDataType dtype)
{
    if ((unsigned)op <= HCCL_REDUCE_MIN)
        return hccl_profile_check(call->profile, call->api, call->type, dtype, op);
    return hccl_error(HCCL_E_PARA, "%s: op %d is not an HcclReduceOp (sum=0, prod=1, max=2, min=3)", call->api,
                      (int)op);
}

static int check_count(const call_t *call, const char *what, uint64_t count)
{
    if (count <= HCCL_SIM_MAX_COUNT)
        return HCCL_SUCCESS;
    return hccl_error(HCCL_E_PARA, "%s: %s %llu exceeds the largest supported count 0x%llx", call->api, what,
                      (unsigned long long)count, (unsigned long long)HCCL_SIM_MAX_COUNT);
}

static int check_rank(const call_t *call, const char *what, uint32_t rank)
{
    if (rank < call->comm->nranks)
        return HCCL_SUCCESS;
    return hccl_error(HCCL_E_PARA, "%s: %s %u is out of range for communicator '%s' of %u rank%s", call->api, what,
                      rank, call->comm->name, call->comm->nranks, call->comm->nranks == 1 ? "" : "s");
}

/* A buffer of `count` elements on the communicator's device. */
/* Memory imported from another process: the operation will run on a copy of it (hccl_shadow_t),
 * at `*offset` = UINT64_MAX until then. */
static bool take_imported(call_t *call, const void *ptr, uint64_t bytes, uint64_t *offset, char *why, size_t len)
{
    uint64_t room = 0;
    if (sim_ipc_imported(ptr, &room) < 0)
        return false;
    if (bytes > room) {
        snprintf(why, len, "%llu bytes at %p run %llu bytes past the end of the imported memory",
                 (unsigned long long)bytes, ptr, (unsigned long long)(bytes - room));
        return false;
    }
    for (uint32_t i = 0; i < call->shadow_count; i++) {
        if (call->shadow[i].user == ptr) { /* in place: one copy, of the larger extent */
            call->shadow[i].bytes = SIM_MAX(call->shadow[i].bytes, bytes);
            *offset = UINT64_MAX;
            return true;
        }
    }
    if (call->shadow_count == HCCL_SHADOWS)
        return false;
    call->shadow[call->shadow_count++] = (hccl_shadow_t){(void *)ptr, bytes, NULL, 0};
    *offset = UINT64_MAX;
    return true;
}

static int check_buffer(call_t *call, const char *what, const void *ptr, uint64_t count, HcclDataType dtype,
                        uint64_t *offset)
{
    if (ptr == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", call->api, what);
    char why[256];
    uint64_t bytes = count * hccl_dtype_size(dtype);
    int problem = sim_device_range(call->comm->device, ptr, bytes, offset, why, sizeof why);
    if (problem == 1 && take_imported(call, ptr, bytes, offset, why, sizeof why))
        return HCCL_SUCCESS;
    if (problem == 1)
        return hccl_error(HCCL_E_PTR, "%s: %s: %s", call->api, what, why);
    if (problem == 2)
        return hccl_error(HCCL_E_PARA, "%s: %s: %s", call->api, what, why);
    return HCCL_SUCCESS;
}

static int check_aligned(const call_t *call, const char *what, const void *ptr, HcclDataType dtype)
{
    size_t elem = hccl_dtype_size(dtype);
    if ((uintptr_t)ptr % elem == 0)
        return HCCL_SUCCESS;
    return hccl_error(HCCL_E_PARA, "%s: %s %p is not aligned to its %zu-byte element type %s", call->api, what, ptr,
                      elem, hccl_dtype_name((uint32_t)dtype));
}

static bool overlap(const void *a, uint64_t a_bytes, const void *b, uint64_t b_bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

/* Overlapping buffers are allowed only in the operation's exact in-place
 * layout (`in_place`). */
static int check_overlap(const call_t *call, const void *send, uint64_t send_bytes, const void *recv,
                         uint64_t recv_bytes, bool in_place, const char *rule)
{
    if (in_place || !overlap(send, send_bytes, recv, recv_bytes))
        return HCCL_SUCCESS;
    return hccl_error(HCCL_E_PARA, "%s: sendBuf and recvBuf overlap; %s", call->api, rule);
}

static int new_op(const call_t *call, uint32_t type, op_task_t **out)
{
    *out = hccl_op_new(call->comm, call->stream, type);
    if (*out == NULL)
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", call->api);
    (*out)->stream_handle = call->stream_handle;
    memcpy((*out)->shadow, call->shadow, sizeof call->shadow);
    (*out)->shadow_count = call->shadow_count;
    return HCCL_SUCCESS;
}

/* Keeps copies of the caller's count and displacement arrays (`nvec` arrays of `per` uint64_t
 * values) with the task, since the caller may reuse them once the call returns. Frees the task
 * when out of memory. */
static int keep_vectors(op_task_t *task, const char *api, uint64_t per, int nvec, const void *const *vectors)
{
    uint64_t total = per * (uint64_t)nvec;
    task->vectors = malloc((size_t)(total ? total : 1) * sizeof *task->vectors);
    if (task->vectors == NULL) {
        hccl_op_free(task);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
    for (int i = 0; i < nvec; i++)
        memcpy(task->vectors + (size_t)i * per, vectors[i], (size_t)per * sizeof *task->vectors);
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------ reductions */

static int reduction(HcclComm comm, aclrtStream stream, uint32_t type, const char *api, void *send, void *recv,
                     uint64_t count, uint64_t send_count, uint64_t recv_count, HcclDataType dtype, HcclReduceOp op,
                     uint32_t root, bool in_place)
{
    CALL(call);
    int err = begin(&call, api, type, comm, stream);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dtype);
    if (err == HCCL_SUCCESS)
        err = check_op(&call, op, dtype);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "count", count);
    if (err == HCCL_SUCCESS && type == HCCL_CMD_REDUCE)
        err = check_rank(&call, "root", root);
    if (err != HCCL_SUCCESS || count == 0)
        return err;
    bool needs_recv = type != HCCL_CMD_REDUCE || root == call.comm->rank;
    uint64_t send_offset = 0, recv_offset = UINT64_MAX;
    err = check_buffer(&call, "sendBuf", send, send_count, dtype, &send_offset);
    if (err == HCCL_SUCCESS)
        err = check_aligned(&call, "sendBuf", send, dtype);
    if (err == HCCL_SUCCESS && needs_recv) {
        err = check_buffer(&call, "recvBuf", recv, recv_count, dtype, &recv_offset);
        if (err == HCCL_SUCCESS)
            err = check_aligned(&call, "recvBuf", recv, dtype);
        size_t elem = hccl_dtype_size(dtype);
        if (err == HCCL_SUCCESS)
            err = check_overlap(&call, send, send_count * elem, recv, recv_count * elem, in_place,
                                "only the exact in-place layout is allowed");
    }
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, type, &task)) != HCCL_SUCCESS)
        return err;
    task->send = send;
    task->recv = needs_recv ? recv : NULL;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->count = count;
    task->dtype = dtype;
    task->recv_dtype = dtype;
    task->op = op;
    task->root = root;
    return dispatch(task);
}

HCCL_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                  HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    return reduction(comm, stream, HCCL_CMD_ALLREDUCE, "HcclAllReduce", sendBuf, recvBuf, count, count, count,
                     dataType, op, 0, sendBuf == recvBuf);
}

HCCL_API HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                               uint32_t root, HcclComm comm, aclrtStream stream)
{
    return reduction(comm, stream, HCCL_CMD_REDUCE, "HcclReduce", sendBuf, recvBuf, count, count, count, dataType, op,
                     root, sendBuf == recvBuf);
}

HCCL_API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                      HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *found = hccl_comm_lookup(comm, "HcclReduceScatter", &err);
    if (found == NULL)
        return err;
    uint32_t n = found->nranks, rank = found->rank;
    hccl_comm_unref(found); /* reduction() looks it up again */
    if (recvCount > HCCL_SIM_MAX_COUNT / n)
        return hccl_error(HCCL_E_PARA, "HcclReduceScatter: recvCount %llu times %u ranks exceeds the largest "
                          "supported count", (unsigned long long)recvCount, n);
    /* In place means recvBuf is this rank's block of sendBuf.  Integer arithmetic: the pointers are
     * not checked yet and may be anything, and pointer arithmetic that overflows is undefined. */
    bool in_place = (uintptr_t)recvBuf ==
                    (uintptr_t)sendBuf + (uint64_t)rank * recvCount * hccl_dtype_size(dataType);
    return reduction(comm, stream, HCCL_CMD_REDUCE_SCATTER, "HcclReduceScatter", sendBuf, recvBuf, recvCount,
                     recvCount * n, recvCount, dataType, op, 0, in_place);
}

/* ----------------------------------------------------------- data motion */

HCCL_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                                  aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclBroadcast", HCCL_CMD_BROADCAST, comm, stream);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "count", count);
    if (err == HCCL_SUCCESS)
        err = check_rank(&call, "root", root);
    if (err != HCCL_SUCCESS || count == 0)
        return err;
    uint64_t offset;
    if ((err = check_buffer(&call, "buf", buf, count, dataType, &offset)) != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_BROADCAST, &task)) != HCCL_SUCCESS)
        return err;
    task->send = buf;
    task->send_offset = offset;
    task->count = count;
    task->dtype = task->recv_dtype = dataType;
    task->root = root;
    return dispatch(task);
}

HCCL_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                                  HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclAllGather", HCCL_CMD_ALLGATHER, comm, stream);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "sendCount", sendCount);
    if (err != HCCL_SUCCESS || sendCount == 0)
        return err;
    uint32_t n = call.comm->nranks;
    if (sendCount > HCCL_SIM_MAX_COUNT / n)
        return hccl_error(HCCL_E_PARA, "HcclAllGather: sendCount %llu times %u ranks exceeds the largest supported "
                          "count", (unsigned long long)sendCount, n);
    size_t elem = hccl_dtype_size(dataType);
    uint64_t send_offset, recv_offset;
    err = check_buffer(&call, "sendBuf", sendBuf, sendCount, dataType, &send_offset);
    if (err == HCCL_SUCCESS)
        err = check_buffer(&call, "recvBuf", recvBuf, sendCount * n, dataType, &recv_offset);
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, sendCount * elem, recvBuf, sendCount * n * elem,
                            sendBuf == (char *)recvBuf + (uint64_t)call.comm->rank * sendCount * elem,
                            "in place, sendBuf must be this rank's block of recvBuf");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_ALLGATHER, &task)) != HCCL_SUCCESS)
        return err;
    task->send = sendBuf;
    task->recv = recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->count = sendCount;
    task->dtype = task->recv_dtype = dataType;
    return dispatch(task);
}

HCCL_API HcclResult HcclScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                uint32_t root, HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclScatter", HCCL_CMD_SCATTER, comm, stream);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "recvCount", recvCount);
    if (err == HCCL_SUCCESS)
        err = check_rank(&call, "root", root);
    if (err != HCCL_SUCCESS || recvCount == 0)
        return err;
    uint32_t n = call.comm->nranks;
    if (recvCount > HCCL_SIM_MAX_COUNT / n)
        return hccl_error(HCCL_E_PARA, "HcclScatter: recvCount %llu times %u ranks exceeds the largest supported "
                          "count", (unsigned long long)recvCount, n);
    size_t elem = hccl_dtype_size(dataType);
    bool is_root = root == call.comm->rank;
    uint64_t send_offset = UINT64_MAX, recv_offset;
    err = check_buffer(&call, "recvBuf", recvBuf, recvCount, dataType, &recv_offset);
    if (err == HCCL_SUCCESS && is_root) {
        err = check_buffer(&call, "sendBuf (on the root)", sendBuf, recvCount * n, dataType, &send_offset);
        if (err == HCCL_SUCCESS)
            err = check_overlap(&call, sendBuf, recvCount * n * elem, recvBuf, recvCount * elem,
                                recvBuf == (char *)sendBuf + (uint64_t)root * recvCount * elem,
                                "in place, recvBuf must be the root's block of sendBuf");
    }
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_SCATTER, &task)) != HCCL_SUCCESS)
        return err;
    task->send = is_root ? sendBuf : NULL;
    task->recv = recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->count = recvCount;
    task->dtype = task->recv_dtype = dataType;
    task->root = root;
    return dispatch(task);
}

HCCL_API HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType, const void *recvBuf,
                                 uint64_t recvCount, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclAlltoAll", HCCL_CMD_ALLTOALL, comm, stream);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "sendType", sendType);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "recvType", recvType);
    if (err == HCCL_SUCCESS && sendType != recvType)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAll: sendType %s and recvType %s must be the same",
                         hccl_dtype_name((uint32_t)sendType), hccl_dtype_name((uint32_t)recvType));
    if (err == HCCL_SUCCESS && sendCount != recvCount)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAll: sendCount %llu and recvCount %llu must be equal",
                         (unsigned long long)sendCount, (unsigned long long)recvCount);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "sendCount", sendCount);
    if (err != HCCL_SUCCESS || sendCount == 0)
        return err;
    uint32_t n = call.comm->nranks;
    if (sendCount > HCCL_SIM_MAX_COUNT / n)
        return hccl_error(HCCL_E_PARA, "HcclAlltoAll: sendCount %llu times %u ranks exceeds the largest supported "
                          "count", (unsigned long long)sendCount, n);
    size_t elem = hccl_dtype_size(sendType);
    uint64_t send_offset, recv_offset;
    err = check_buffer(&call, "sendBuf", sendBuf, sendCount * n, sendType, &send_offset);
    if (err == HCCL_SUCCESS)
        err = check_buffer(&call, "recvBuf", recvBuf, recvCount * n, recvType, &recv_offset);
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, sendCount * n * elem, recvBuf, recvCount * n * elem, false,
                            "HcclAlltoAll does not work in place");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_ALLTOALL, &task)) != HCCL_SUCCESS)
        return err;
    task->send = (void *)sendBuf;
    task->recv = (void *)recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->count = sendCount;
    task->dtype = task->recv_dtype = sendType;
    return dispatch(task);
}

/* Largest element index + 1 that counts/displs address; false on overflow. */
static bool extent_of(const uint64_t *counts, const uint64_t *displs, uint32_t n, uint64_t *extent)
{
    uint64_t end = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (counts[i] > HCCL_SIM_MAX_COUNT || displs[i] > HCCL_SIM_MAX_COUNT)
            return false;
        if (counts[i] > 0)
            end = SIM_MAX(end, counts[i] + displs[i]);
    }
    *extent = end;
    return true;
}

/* A buffer addressed by a count/displacement pair; NULL is allowed when it
 * addresses nothing. */
static int check_vbuffer(call_t *call, const char *what, const void *ptr, const uint64_t *counts,
                         const uint64_t *displs, HcclDataType dtype, uint64_t *extent, uint64_t *offset)
{
    if (!extent_of(counts, displs, call->comm->nranks, extent))
        return hccl_error(HCCL_E_PARA, "%s: a count or displacement of %s exceeds the largest supported count",
                          call->api, what);
    *offset = UINT64_MAX;
    if (*extent == 0 && ptr == NULL)
        return HCCL_SUCCESS;
    return check_buffer(call, what, ptr, *extent, dtype, offset);
}

/* AllGatherV and ReduceScatterV give this rank's count twice: as the scalar `what` and as entry
 * [rank] of the vector `vector_name` (what the rank sends to / keeps of itself).  Both are the
 * caller's own arguments, so a mismatch is refused here, before anything is queued: found while
 * running, it would fail the operation and break the communicator on every rank.  Whether the
 * other ranks' entries match what those ranks pass is known only then (exec.c). */
static int check_own_count(const call_t *call, const char *what, uint64_t count, const char *vector_name,
                           const void *vector)
{
    uint32_t me = call->comm->rank;
    uint64_t own = ((const uint64_t *)vector)[me];
    if (own == count)
        return HCCL_SUCCESS;
    return hccl_error(HCCL_E_PARA, "%s: %s = %llu does not match %s[%u] = %llu, the entry for this rank (rank %u of "
                      "'%s'); the two must be equal", call->api, what, (unsigned long long)count, vector_name, me,
                      (unsigned long long)own, me, call->comm->name);
}

HCCL_API HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                                  HcclDataType sendType, const void *recvBuf, const void *recvCounts,
                                  const void *rdispls, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclAlltoAllV", HCCL_CMD_ALLTOALLV, comm, stream);
    if (err == HCCL_SUCCESS && (sendCounts == NULL || sdispls == NULL || recvCounts == NULL || rdispls == NULL))
        err = hccl_error(HCCL_E_PTR, "HcclAlltoAllV: sendCounts, sdispls, recvCounts and rdispls must not be NULL");
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "sendType", sendType);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "recvType", recvType);
    if (err == HCCL_SUCCESS && sendType != recvType)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAllV: sendType %s and recvType %s must be the same",
                         hccl_dtype_name((uint32_t)sendType), hccl_dtype_name((uint32_t)recvType));
    if (err != HCCL_SUCCESS)
        return err;
    uint32_t n = call.comm->nranks;
    size_t elem = hccl_dtype_size(sendType);
    uint64_t send_extent, recv_extent, send_offset, recv_offset;
    err = check_vbuffer(&call, "sendBuf", sendBuf, sendCounts, sdispls, sendType, &send_extent, &send_offset);
    if (err == HCCL_SUCCESS)
        err = check_vbuffer(&call, "recvBuf", recvBuf, recvCounts, rdispls, recvType, &recv_extent, &recv_offset);
    if (err == HCCL_SUCCESS && sendBuf != NULL && sendBuf == recvBuf)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAllV: sendBuf and recvBuf must be different buffers");
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, send_extent * elem, recvBuf, recv_extent * elem, false,
                            "HcclAlltoAllV does not work in place");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_ALLTOALLV, &task)) != HCCL_SUCCESS)
        return err;
    const void *vectors[] = {sendCounts, sdispls, recvCounts, rdispls};
    if ((err = keep_vectors(task, "HcclAlltoAllV", n, 4, vectors)) != HCCL_SUCCESS)
        return err;
    task->send = (void *)sendBuf;
    task->recv = (void *)recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->dtype = sendType;
    task->recv_dtype = recvType;
    return dispatch(task);
}

HCCL_API HcclResult HcclAlltoAllVC(const void *sendBuf, const void *sendCountMatrix, HcclDataType sendType,
                                   const void *recvBuf, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclAlltoAllVC", HCCL_CMD_ALLTOALLVC, comm, stream);
    if (err == HCCL_SUCCESS && sendCountMatrix == NULL)
        err = hccl_error(HCCL_E_PTR, "HcclAlltoAllVC: sendCountMatrix is NULL");
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "sendType", sendType);
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "recvType", recvType);
    if (err == HCCL_SUCCESS && sendType != recvType)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAllVC: sendType %s and recvType %s must be the same",
                         hccl_dtype_name((uint32_t)sendType), hccl_dtype_name((uint32_t)recvType));
    if (err != HCCL_SUCCESS)
        return err;
    uint32_t n = call.comm->nranks, me = call.comm->rank;
    const uint64_t *m = sendCountMatrix;
    uint64_t send_total = 0, recv_total = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (m[(uint64_t)me * n + j] > HCCL_SIM_MAX_COUNT || m[(uint64_t)j * n + me] > HCCL_SIM_MAX_COUNT)
            return hccl_error(HCCL_E_PARA, "HcclAlltoAllVC: a count in sendCountMatrix exceeds the largest supported "
                              "count");
        send_total += m[(uint64_t)me * n + j];
        recv_total += m[(uint64_t)j * n + me];
    }
    size_t elem = hccl_dtype_size(sendType);
    uint64_t send_offset = UINT64_MAX, recv_offset = UINT64_MAX;
    if (send_total > 0 || sendBuf != NULL)
        err = check_buffer(&call, "sendBuf", sendBuf, send_total, sendType, &send_offset);
    if (err == HCCL_SUCCESS && (recv_total > 0 || recvBuf != NULL))
        err = check_buffer(&call, "recvBuf", recvBuf, recv_total, recvType, &recv_offset);
    if (err == HCCL_SUCCESS && sendBuf != NULL && sendBuf == recvBuf)
        err = hccl_error(HCCL_E_PARA, "HcclAlltoAllVC: sendBuf and recvBuf must be different buffers");
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, send_total * elem, recvBuf, recv_total * elem, false,
                            "HcclAlltoAllVC does not work in place");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_ALLTOALLVC, &task)) != HCCL_SUCCESS)
        return err;
    const void *matrix[] = {m};
    if ((err = keep_vectors(task, "HcclAlltoAllVC", (uint64_t)n * n, 1, matrix)) != HCCL_SUCCESS)
        return err;
    task->send = (void *)sendBuf;
    task->recv = (void *)recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->dtype = sendType;
    task->recv_dtype = recvType;
    return dispatch(task);
}

HCCL_API HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf, const void *recvCounts,
                                   const void *recvDispls, HcclDataType dataType, HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclAllGatherV", HCCL_CMD_ALLGATHER_V, comm, stream);
    if (err == HCCL_SUCCESS && (recvCounts == NULL || recvDispls == NULL))
        err = hccl_error(HCCL_E_PTR, "HcclAllGatherV: recvCounts and recvDispls must not be NULL");
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "sendCount", sendCount);
    if (err == HCCL_SUCCESS)
        err = check_own_count(&call, "sendCount", sendCount, "recvCounts", recvCounts);
    if (err != HCCL_SUCCESS)
        return err;
    uint32_t n = call.comm->nranks;
    size_t elem = hccl_dtype_size(dataType);
    uint64_t send_offset = UINT64_MAX, recv_extent, recv_offset;
    if (sendCount > 0 || sendBuf != NULL)
        err = check_buffer(&call, "sendBuf", sendBuf, sendCount, dataType, &send_offset);
    if (err == HCCL_SUCCESS)
        err = check_vbuffer(&call, "recvBuf", recvBuf, recvCounts, recvDispls, dataType, &recv_extent, &recv_offset);
    if (err == HCCL_SUCCESS && sendBuf != NULL && sendBuf == recvBuf)
        err = hccl_error(HCCL_E_PARA, "HcclAllGatherV: sendBuf and recvBuf must be different buffers");
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, sendCount * elem, recvBuf, recv_extent * elem, false,
                            "HcclAllGatherV does not work in place");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_ALLGATHER_V, &task)) != HCCL_SUCCESS)
        return err;
    const void *vectors[] = {recvCounts, recvDispls};
    if ((err = keep_vectors(task, "HcclAllGatherV", n, 2, vectors)) != HCCL_SUCCESS)
        return err;
    task->send = sendBuf;
    task->recv = recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->count = sendCount;
    task->dtype = task->recv_dtype = dataType;
    return dispatch(task);
}

HCCL_API HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts, const void *sendDispls, void *recvBuf,
                                       uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                       aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclReduceScatterV", HCCL_CMD_REDUCE_SCATTER_V, comm, stream);
    if (err == HCCL_SUCCESS && (sendCounts == NULL || sendDispls == NULL))
        err = hccl_error(HCCL_E_PTR, "HcclReduceScatterV: sendCounts and sendDispls must not be NULL");
    if (err == HCCL_SUCCESS)
        err = check_dtype(&call, "dataType", dataType);
    if (err == HCCL_SUCCESS)
        err = check_op(&call, op, dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(&call, "recvCount", recvCount);
    if (err == HCCL_SUCCESS)
        err = check_own_count(&call, "recvCount", recvCount, "sendCounts", sendCounts);
    if (err != HCCL_SUCCESS)
        return err;
    uint32_t n = call.comm->nranks;
    size_t elem = hccl_dtype_size(dataType);
    uint64_t send_extent, send_offset, recv_offset = UINT64_MAX;
    err = check_vbuffer(&call, "sendBuf", sendBuf, sendCounts, sendDispls, dataType, &send_extent, &send_offset);
    if (err == HCCL_SUCCESS && send_extent > 0)
        err = check_aligned(&call, "sendBuf", sendBuf, dataType);
    if (err == HCCL_SUCCESS && (recvCount > 0 || recvBuf != NULL)) {
        err = check_buffer(&call, "recvBuf", recvBuf, recvCount, dataType, &recv_offset);
        if (err == HCCL_SUCCESS)
            err = check_aligned(&call, "recvBuf", recvBuf, dataType);
    }
    if (err == HCCL_SUCCESS && sendBuf != NULL && sendBuf == recvBuf)
        err = hccl_error(HCCL_E_PARA, "HcclReduceScatterV: sendBuf and recvBuf must be different buffers");
    if (err == HCCL_SUCCESS)
        err = check_overlap(&call, sendBuf, send_extent * elem, recvBuf, recvCount * elem, false,
                            "HcclReduceScatterV does not work in place");
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_REDUCE_SCATTER_V, &task)) != HCCL_SUCCESS)
        return err;
    const void *vectors[] = {sendCounts, sendDispls};
    if ((err = keep_vectors(task, "HcclReduceScatterV", n, 2, vectors)) != HCCL_SUCCESS)
        return err;
    task->send = sendBuf;
    task->recv = recvBuf;
    task->send_offset = send_offset;
    task->recv_offset = recv_offset;
    task->recv_count = recvCount;
    task->dtype = task->recv_dtype = dataType;
    task->op = op;
    return dispatch(task);
}

HCCL_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclBarrier", HCCL_CMD_BARRIER, comm, stream);
    if (err != HCCL_SUCCESS)
        return err;
    op_task_t *task;
    if ((err = new_op(&call, HCCL_CMD_BARRIER, &task)) != HCCL_SUCCESS)
        return err;
    task->dtype = task->recv_dtype = HCCL_DATA_TYPE_INT8;
    return dispatch(task);
}

/* --------------------------------------------------------- point to point */

/* One send or receive, of HcclSend / HcclRecv (index UINT32_MAX) or an HcclBatchSendRecv item.  Only
 * a batch may name the calling rank itself as the peer (check_self_pairs matches those items). */
static int check_item(call_t *call, const HcclSendRecvItem *item, uint32_t index)
{
    char what[64];
    snprintf(what, sizeof what, "item %u buf", index);
    if (item->sendRecvType != HCCL_SEND && item->sendRecvType != HCCL_RECV)
        return hccl_error(HCCL_E_PARA, "%s: item %u has sendRecvType %d (HCCL_SEND=0, HCCL_RECV=1)", call->api, index,
                          (int)item->sendRecvType);
    int err = check_dtype(call, "dataType", item->dataType);
    if (err == HCCL_SUCCESS)
        err = check_count(call, "count", item->count);
    if (err == HCCL_SUCCESS)
        err = check_rank(call, item->sendRecvType == HCCL_SEND ? "destination rank" : "source rank",
                         item->remoteRank);
    /* CANN's HcclSend / HcclRecv parameter checks refuse a peer equal to the own rank with
     * HCCL_E_NOT_SUPPORT ("destRank cannot be equal to self"); a batch copies such data locally. */
    if (err == HCCL_SUCCESS && index == UINT32_MAX && item->remoteRank == call->comm->rank)
        err = hccl_error(HCCL_E_NOT_SUPPORT, "%s: %s %u is the calling rank itself (rank %u of '%s'): %s cannot "
                         "%s itself; for a local copy, put a send and a receive to rank %u in one HcclBatchSendRecv",
                         call->api, item->sendRecvType == HCCL_SEND ? "destRank" : "srcRank", item->remoteRank,
                         call->comm->rank, call->comm->name, call->api,
                         item->sendRecvType == HCCL_SEND ? "send to" : "receive from", item->remoteRank);
    uint64_t offset;
    if (err == HCCL_SUCCESS && item->count > 0)
        err = check_buffer(call, index == UINT32_MAX ? "buf" : what, item->buf, item->count, item->dataType, &offset);
    return err;
}

/* The items of a batch whose peer is the calling rank itself pair up as CANN pairs them: the k-th
 * send to itself with the k-th receive from itself, in item order; each pair is one local copy
 * (exec.c), of the same count and data type on both sides.  Anything unpaired is refused before
 * anything runs. */
static int check_self_pairs(const call_t *call, const HcclSendRecvItem *items, uint32_t count)
{
    uint32_t me = call->comm->rank, sends = 0, recvs = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (items[i].remoteRank != me)
            continue;
        if (items[i].sendRecvType == HCCL_SEND)
            sends++;
        else
            recvs++;
    }
    if (sends == 0 && recvs == 0)
        return HCCL_SUCCESS;
    uint32_t s = 0, r = 0;
    for (uint32_t k = 0; k < SIM_MIN(sends, recvs); k++) {
        while (items[s].remoteRank != me || items[s].sendRecvType != HCCL_SEND)
            s++;
        while (items[r].remoteRank != me || items[r].sendRecvType != HCCL_RECV)
            r++;
        const HcclSendRecvItem *send = &items[s], *recv = &items[r];
        if (send->count != recv->count || send->dataType != recv->dataType)
            return hccl_error(HCCL_E_PARA, "%s: item %u sends %llu %s to the rank itself (rank %u), but item %u, the "
                              "receive from itself it pairs with (sends and receives to the own rank pair in item "
                              "order), takes %llu %s: a send and a receive to the own rank must have the same count "
                              "and data type", call->api, s, (unsigned long long)send->count,
                              hccl_dtype_name((uint32_t)send->dataType), me, r, (unsigned long long)recv->count,
                              hccl_dtype_name((uint32_t)recv->dataType));
        s++;
        r++;
    }
    if (sends == recvs)
        return HCCL_SUCCESS;
    /* The first item left over once the pairs are made. */
    HcclSendRecvType extra = sends > recvs ? HCCL_SEND : HCCL_RECV;
    uint32_t i = sends > recvs ? s : r;
    while (items[i].remoteRank != me || items[i].sendRecvType != extra)
        i++;
    return hccl_error(HCCL_E_PARA, "%s: the batch has %u send%s to the rank itself (rank %u) but %u receive%s from "
                      "itself; item %u, a %s itself, has no matching %s itself: the data a rank sends to itself "
                      "is copied into the receive from itself that pairs with it (in item order)", call->api, sends,
                      sends == 1 ? "" : "s", me, recvs, recvs == 1 ? "" : "s", i,
                      extra == HCCL_SEND ? "send to" : "receive from", extra == HCCL_SEND ? "receive from" : "send to");
}

static int point_to_point(const call_t *call, const HcclSendRecvItem *items, uint32_t count)
{
    if (call->shadow_count > 0)
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: %p is memory imported from another process "
                          "(aclrtIpcMemImportByKey): the simulator's collectives take it, its point-to-point "
                          "operations take only this process's own device memory", call->api, call->shadow[0].user);
    op_task_t *task;
    int err = new_op(call, call->type, &task);
    if (err != HCCL_SUCCESS)
        return err;
    task->items = malloc((count ? count : 1) * sizeof *task->items);
    task->item_seq = calloc(count ? count : 1, sizeof *task->item_seq);
    task->item_state = calloc(count ? count : 1, sizeof *task->item_state);
    if (task->items == NULL || task->item_seq == NULL || task->item_state == NULL) {
        hccl_op_free(task);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", call->api);
    }
    memcpy(task->items, items, count * sizeof *items);
    task->item_count = count;
    task->dtype = task->recv_dtype = count > 0 ? items[0].dataType : HCCL_DATA_TYPE_INT8;
    return dispatch(task);
}

static int single(HcclComm comm, aclrtStream stream, const char *api, HcclSendRecvType kind, void *buf,
                  uint64_t count, HcclDataType dataType, uint32_t peer)
{
    CALL(call);
    int err = begin(&call, api, kind == HCCL_SEND ? HCCL_CMD_SEND : HCCL_CMD_RECEIVE, comm, stream);
    if (err != HCCL_SUCCESS)
        return err;
    /* CANN returns at once, before looking at the peer, when there is nothing to move. */
    if (count == 0 && peer == call.comm->rank)
        return HCCL_SUCCESS;
    HcclSendRecvItem item = {kind, buf, count, dataType, peer};
    if ((err = check_item(&call, &item, UINT32_MAX)) != HCCL_SUCCESS)
        return err;
    return point_to_point(&call, &item, 1);
}

HCCL_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                             aclrtStream stream)
{
    return single(comm, stream, "HcclSend", HCCL_SEND, sendBuf, count, dataType, destRank);
}

HCCL_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                             aclrtStream stream)
{
    return single(comm, stream, "HcclRecv", HCCL_RECV, recvBuf, count, dataType, srcRank);
}

HCCL_API HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm,
                                      aclrtStream stream)
{
    CALL(call);
    int err = begin(&call, "HcclBatchSendRecv", HCCL_CMD_BATCH_SEND_RECV, comm, stream);
    if (err != HCCL_SUCCESS)
        return err;
    if (hccl_group_active())
        return hccl_error(HCCL_E_PARA, "HcclBatchSendRecv: not allowed between HcclGroupStart and HcclGroupEnd "
                          "(use HcclSend/HcclRecv there)");
    if (itemNum == 0)
        return HCCL_SUCCESS;
    if (sendRecvInfo == NULL)
        return hccl_error(HCCL_E_PTR, "HcclBatchSendRecv: sendRecvInfo is NULL");
    for (uint32_t i = 0; i < itemNum; i++)
        if ((err = check_item(&call, &sendRecvInfo[i], i)) != HCCL_SUCCESS)
            return err;
    if ((err = check_self_pairs(&call, sendRecvInfo, itemNum)) != HCCL_SUCCESS)
        return err;
    return point_to_point(&call, sendRecvInfo, itemNum);
}
