/* Events: markers recorded on a stream.  An event completes when the stream
 * reaches it; other streams and host threads can wait for it, and two
 * completed events give the time between them.
 *
 * An event created with ACL_EVENT_IPC can be opened by other processes
 * (aclrtIpcGetEventHandle, aclrtIpcOpenEventHandle): its record count and completed record go to
 * a page of shared memory (a memfd the handle names, opened through /proc/<pid>/fd), and an
 * opened event waits on that page (a shared futex) until the record it saw last has run in the
 * exporting process.  An opened event is only waited for: it is recorded where it was made. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl/runtime.h"

#define IPC_EVENT_MAGIC 0x48434945u /* "HCIE" */

/* What processes that opened an IPC event see of it. */
typedef struct {
    uint32_t magic;
    uint64_t uid;
    int32_t owner_pid;           /* the process that records it */
    uint64_t owner_start;
    _Atomic uint64_t recorded;   /* its records enqueued so far */
    _Atomic uint64_t completed;  /* the highest record that has run */
    _Atomic uint64_t failed;     /* the newest record a failed stream reached without running it */
    _Atomic int failed_error;
    _Atomic uint32_t word;       /* futex: changes when a record runs */
} ipc_event_page_t;

struct sim_event {
    ipc_event_page_t *page;    /* IPC events: the shared page, once a handle was taken or opened */
    int page_fd;               /* in the exporting process */
    bool opened;               /* opened from another process's handle: waited for, never recorded */
    sim_model_t *captured;     /* referenced: the model whose capture recorded it last (capture.c) */
    sim_stream_t *captured_stream; /* ... on this stream, */
    uint64_t captured_position;    /* ... at this position of the capture */
    void *handle;
    int device;                /* of the context it was created in */
    size_t listed_at;          /* index in its device's list, while `listed` */
    bool listed;
    uint32_t flags;
    bool explicit_flags;       /* created with aclrtCreateEvent[Ex]WithFlag */
    _Atomic int refs;
    pthread_mutex_t lock;
    uint64_t recorded;         /* records enqueued so far */
    _Atomic uint64_t completed; /* highest record number that has run */
    bool cleared;              /* an aclrtResetEvent ran after the newest record that ran */
    sim_stream_t *stream;      /* stream and task index of the newest record */
    uint64_t index;
    int64_t timestamp_ns;
    /* The newest record that a failed stream reached without running it (0: none), and that
     * stream's error: waits and queries that find it the newest record completed report it. */
    uint64_t failed;
    int failed_error;
    char failed_why[512];
};

static void event_unref(sim_event_t *event)
{
    if (atomic_fetch_sub(&event->refs, 1) == 1) {
        if (event->page != NULL)
            munmap(event->page, sizeof *event->page);
        if (event->page_fd >= 0)
            close(event->page_fd);
        if (event->captured != NULL)
            sim_model_unref(event->captured);
        if (event->stream != NULL)
            sim_stream_unref(event->stream);
        pthread_mutex_destroy(&event->lock);
        free(event);
    }
}

static void *ref_event(void *object)
{
    atomic_fetch_add(&((sim_event_t *)object)->refs, 1);
    return object;
}

/* The event of a live handle, referenced (event_unref when done): every entry point holds a
 * reference until it returns, so an event destroyed by another thread meanwhile stays allocated.
 * A synchronisation under way then ends as it would have: when the record it waits for has run
 * (the record task holds the event too), with success or the recording stream's error; calls
 * that start after the destroy find no live event (ACL_ERROR_INVALID_PARAM). */
static sim_event_t *lookup(aclrtEvent handle, const char *api, int *err)
{
    sim_event_t *event = sim_handle_acquire(handle, SIM_KIND_EVENT, ref_event);
    if (event == NULL)
        *err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is not a live event (never created, destroyed, or "
                         "released by the aclrtResetDevice that released its device)", api, handle);
    return event;
}

/* ------------------------------------------------------- events per device
 *
 * The live events of each device, so that the aclrtResetDevice that drops a
 * device's last reference can destroy them (acl/device.c).  Whoever frees an
 * event's handle (sim_handle_free is true for one caller only) owns the
 * reference the handle stood for. */

typedef struct {
    sim_event_t **items;
    size_t count, capacity;
} event_list_t;

static pthread_mutex_t g_events_lock = PTHREAD_MUTEX_INITIALIZER;
static event_list_t g_events[SIM_MAX_DEVICES];

static bool list_event(sim_event_t *event)
{
    event_list_t *list = &g_events[event->device];
    pthread_mutex_lock(&g_events_lock);
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 16;
        sim_event_t **grown = realloc(list->items, capacity * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&g_events_lock);
            return false;
        }
        list->items = grown;
        list->capacity = capacity;
    }
    event->listed_at = list->count;
    event->listed = true;
    list->items[list->count++] = event;
    pthread_mutex_unlock(&g_events_lock);
    return true;
}

static void unlist_event(sim_event_t *event)
{
    event_list_t *list = &g_events[event->device];
    pthread_mutex_lock(&g_events_lock);
    if (event->listed) {
        sim_event_t *last = list->items[--list->count];
        list->items[event->listed_at] = last;
        last->listed_at = event->listed_at;
        event->listed = false;
    }
    pthread_mutex_unlock(&g_events_lock);
}

void sim_event_release_device(int device)
{
    event_list_t *list = &g_events[device];
    pthread_mutex_lock(&g_events_lock);
    event_list_t taken = *list;
    *list = (event_list_t){NULL, 0, 0};
    for (size_t i = 0; i < taken.count; i++) {
        taken.items[i]->listed = false;
        atomic_fetch_add(&taken.items[i]->refs, 1); /* alive until this loop is done with it */
    }
    pthread_mutex_unlock(&g_events_lock);
    for (size_t i = 0; i < taken.count; i++) {
        sim_event_t *event = taken.items[i];
        if (sim_handle_free(event->handle)) /* not destroyed by the user meanwhile */
            event_unref(event);
        event_unref(event);
    }
    free(taken.items);
}

static aclError create(aclrtEvent *out, uint32_t flags, bool explicit_flags, const char *api)
{
    if (out == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: event is NULL", api);
    uint32_t known = ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE |
                     ACL_EVENT_DEVICE_USE_ONLY | ACL_EVENT_EXTERNAL | ACL_EVENT_IPC;
    if ((flags & ~known) != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: unknown flag bits 0x%x", api, flags & ~known);
    sim_context_t *context = sim_current_context();
    if (context == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    sim_event_t *event = calloc(1, sizeof *event);
    if (event == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating an event");
    event->device = context->device;
    event->flags = flags;
    event->explicit_flags = explicit_flags;
    event->refs = 1;
    event->page_fd = -1;
    pthread_mutex_init(&event->lock, NULL);
    event->handle = sim_handle_new(SIM_KIND_EVENT, event);
    if (event->handle == NULL) {
        pthread_mutex_destroy(&event->lock);
        free(event);
        return sim_error(ACL_ERROR_RT_NO_EVENT_RESOURCE, "too many live handles");
    }
    if (!list_event(event)) {
        sim_handle_free(event->handle);
        pthread_mutex_destroy(&event->lock);
        free(event);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating an event");
    }
    *out = event->handle;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtCreateEvent(aclrtEvent *event)
{
    return create(event, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE, false, "aclrtCreateEvent");
}

SIM_EXPORT aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    return create(event, flag, true, "aclrtCreateEventWithFlag");
}

SIM_EXPORT aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag)
{
    return create(event, flag, true, "aclrtCreateEventExWithFlag");
}

SIM_EXPORT aclError aclrtDestroyEvent(aclrtEvent handle)
{
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, "aclrtDestroyEvent", &err);
    if (event == NULL)
        return err;
    if (!sim_handle_free(handle)) {
        event_unref(event);
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent: %p was destroyed meanwhile (by another "
                         "thread, or by the aclrtResetDevice that released its device)", handle);
    }
    unlist_event(event);
    event_unref(event); /* the handle's reference */
    event_unref(event);
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- record */

typedef struct {
    sim_task_t base;
    sim_event_t *event;
    uint64_t number;
    bool reset;
} event_task_t;

static int run_record(sim_task_t *task, int64_t deadline_ns)
{
    event_task_t *record = (event_task_t *)task;
    sim_event_t *event = record->event;
    pthread_mutex_lock(&event->lock);
    if (record->reset) {
        /* Back to "not recorded" (until a later record runs), as CANN reports it. */
        event->timestamp_ns = 0;
        event->cleared = true;
    } else if (record->number > atomic_load(&event->completed)) {
        event->timestamp_ns = sim_now_ns();
        event->cleared = false;
        atomic_store(&event->completed, record->number);
        if (event->page != NULL) {
            atomic_store(&event->page->completed, record->number);
            atomic_fetch_add(&event->page->word, 1);
            sim_futex_wake(&event->page->word, true);
        }
    }
    pthread_mutex_unlock(&event->lock);
    return SIM_TASK_DONE;
}

/* A failed stream still reaches its events, so nobody waits for them forever; but it never ran
 * the work before them, which those who wait are told. */
static void cancel_record(sim_task_t *task, int error, const char *why)
{
    event_task_t *record = (event_task_t *)task;
    sim_event_t *event = record->event;
    run_record(task, SIM_NO_DEADLINE);
    pthread_mutex_lock(&event->lock);
    if (!record->reset && record->number > event->failed) {
        event->failed = record->number;
        event->failed_error = error;
        snprintf(event->failed_why, sizeof event->failed_why, "%s", why);
        if (event->page != NULL) {
            atomic_store(&event->page->failed_error, error);
            atomic_store(&event->page->failed, record->number);
        }
    }
    pthread_mutex_unlock(&event->lock);
}

/* ACL_SUCCESS, or the error of the stream that reached the newest completed record of `event`
 * without running what was queued before it (`api` names the call, for the message). */
static int failure(sim_event_t *event, const char *api)
{
    if (event->opened) {
        ipc_event_page_t *page = event->page;
        uint64_t failed = atomic_load(&page->failed);
        int error = failed != 0 && failed == atomic_load(&page->completed) ? atomic_load(&page->failed_error) : 0;
        return error == 0 ? ACL_SUCCESS : sim_error(error, "%s: the stream that recorded the event (in process %d) "
                                                    "failed before reaching it", api, (int)page->owner_pid);
    }
    pthread_mutex_lock(&event->lock);
    int error = event->failed != 0 && event->failed == atomic_load(&event->completed) ? event->failed_error : 0;
    if (error != 0)
        sim_error(error, "%s: the stream that recorded the event failed before reaching it: %s", api,
                  event->failed_why);
    pthread_mutex_unlock(&event->lock);
    return error;
}

static void release_event_task(sim_task_t *task)
{
    event_unref(((event_task_t *)task)->event);
    free(task);
}

/* Reference §3.5: an event from aclrtCreateEvent cannot be reset, and aclrtResetEvent and
 * aclrtStreamWaitEvent need ACL_EVENT_SYNC (which aclrtCreateEvent's events have). */
static int check_sync_flag(const sim_event_t *event, bool reset, const char *api)
{
    if (reset && !event->explicit_flags)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: an event created with aclrtCreateEvent cannot be reset "
                         "(create it with aclrtCreateEventWithFlag and ACL_EVENT_SYNC)", api);
    if ((event->flags & ACL_EVENT_SYNC) == 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the event was created without ACL_EVENT_SYNC (flags 0x%x), "
                         "which %s needs", api, event->flags, api);
    return ACL_SUCCESS;
}

static int replay_record(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy);

/* The model of a capture under way that recorded `event` last, or NULL. */
static sim_model_t *captured_by(sim_event_t *event)
{
    pthread_mutex_lock(&event->lock);
    sim_model_t *model = event->captured;
    pthread_mutex_unlock(&event->lock);
    return model != NULL && sim_capture_active(model) ? model : NULL;
}

/* A record (or reset) task of `event`, referencing it, not yet counted or queued. */
static event_task_t *new_record(sim_event_t *event, bool reset)
{
    /* malloc and a zeroing assignment, not calloc: see hccl_op_new in hccl/ops.c */
    event_task_t *task = malloc(sizeof *task);
    if (task == NULL)
        return NULL;
    *task = (event_task_t){0};
    task->base.run = run_record;
    task->base.cancel = cancel_record;
    task->base.release = release_event_task;
    task->base.replay = replay_record;
    task->base.name = reset ? "reset event" : "record event";
    task->event = event;
    task->reset = reset;
    atomic_fetch_add(&event->refs, 1);
    return task;
}

/* Counts a record that runs on `stream` as its next task (under the event's lock): its number,
 * and where waiters find it. */
static void count_record_locked(sim_event_t *event, event_task_t *task, sim_stream_t *stream)
{
    if (event->captured != NULL && !task->reset) { /* recorded for real again */
        sim_model_unref(event->captured);
        event->captured = NULL;
    }
    if (!task->reset) {
        task->number = ++event->recorded;
        if (event->page != NULL)
            atomic_store(&event->page->recorded, task->number);
        sim_stream_ref(stream);
        if (event->stream != NULL)
            sim_stream_unref(event->stream);
        event->stream = stream;
        event->index = sim_stream_enqueued(stream) + 1;
    }
}

static aclError record_on(sim_event_t *event, sim_stream_t *stream, bool reset)
{
    if (event->opened)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the event was opened from another process's handle "
                         "(aclrtIpcOpenEventHandle): it is recorded in that process, and waited for here",
                         reset ? "aclrtResetEvent" : "aclrtRecordEvent");
    event_task_t *task = new_record(event, reset);
    if (task == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    /* The lock keeps the record number, the stream index and the queue order
     * consistent when two threads record the same event. */
    pthread_mutex_lock(&event->lock);
    sim_model_t *model = sim_stream_capture(stream);
    if (model != NULL || sim_stream_updating(stream)) {
        /* Recorded, not run: the record counts when the model is executed (replay_record). */
        sim_stream_enqueue(stream, &task->base);
        if (model != NULL && !reset) {
            if (event->captured != model) {
                sim_model_ref(model);
                if (event->captured != NULL)
                    sim_model_unref(event->captured);
                event->captured = model;
            }
            event->captured_stream = stream;
            event->captured_position = sim_capture_position(model, stream);
        }
        pthread_mutex_unlock(&event->lock);
        return ACL_SUCCESS;
    }
    count_record_locked(event, task, stream);
    uint64_t place = sim_stream_enqueue(stream, &task->base);
    pthread_mutex_unlock(&event->lock);
    /* On an idle stream the record runs now, as a device reaches it at once: run when the stream
     * is synchronised, it would take that time, and an event timing calls queued after it would
     * leave out the time spent queueing them. */
    sim_stream_start(stream, place);
    return ACL_SUCCESS;
}

/* A record in a model (capture.c): counted as the execution's, whose one task on `stream` is
 * where the waiters look (the next task there); it completes when the execution runs it. */
static int replay_record(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    const event_task_t *record = (const event_task_t *)task;
    sim_event_t *event = record->event;
    event_task_t *fresh = new_record(event, record->reset);
    if (fresh == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory replaying a %s", task->name);
    pthread_mutex_lock(&event->lock);
    count_record_locked(event, fresh, stream);
    pthread_mutex_unlock(&event->lock);
    *copy = &fresh->base;
    return ACL_SUCCESS;
}

static aclError enqueue_record(aclrtEvent handle, aclrtStream stream_handle, bool reset, const char *api)
{
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, api, &err);
    if (event == NULL)
        return err;
    err = reset ? check_sync_flag(event, true, api) : ACL_SUCCESS;
    sim_stream_t *stream = err == ACL_SUCCESS ? sim_stream_acquire(stream_handle, &err) : NULL;
    if (stream != NULL) {
        err = record_on(event, stream, reset);
        sim_stream_unref(stream);
    }
    event_unref(event);
    return err;
}

SIM_EXPORT aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    return enqueue_record(event, stream, false, "aclrtRecordEvent");
}

SIM_EXPORT aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream)
{
    return enqueue_record(event, stream, true, "aclrtResetEvent");
}

/* ------------------------------------------------------------------ wait */

/* Snapshot of what "the event is complete" means at the time of a call. */
typedef struct {
    uint64_t number;
    sim_stream_t *stream; /* referenced */
    uint64_t index;
} target_t;

static target_t snapshot(sim_event_t *event)
{
    target_t target = {0, NULL, 0};
    if (event->opened) {
        target.number = atomic_load(&event->page->recorded);
        return target;
    }
    pthread_mutex_lock(&event->lock);
    target.number = event->recorded;
    if (event->stream != NULL && atomic_load(&event->completed) < target.number) {
        target.stream = event->stream;
        target.index = event->index;
        sim_stream_ref(target.stream);
    }
    pthread_mutex_unlock(&event->lock);
    return target;
}

/* Waits (running the recording stream if nobody does) until the target is
 * reached.  Returns 0, the recording stream's error, or SIM_TASK_AGAIN at the
 * deadline. */
#define OPENED_WAIT_SLICE_NS (100 * SIM_NS_PER_MS) /* how often a wait looks whether the exporter lives */

/* wait_for, for an event opened from another process: on the shared page, until the record
 * seen when the wait was queued has run there, or the process that records it has ended. */
static int wait_for_opened(sim_event_t *event, uint64_t number, int64_t deadline_ns)
{
    ipc_event_page_t *page = event->page;
    for (;;) {
        uint32_t seen = atomic_load(&page->word);
        if (atomic_load(&page->completed) >= number)
            return ACL_SUCCESS;
        if (!sim_process_alive(page->owner_pid, page->owner_start))
            return sim_error(ACL_ERROR_RT_INTERNAL_ERROR, "the process %d that records the event has ended before "
                             "reaching record %llu", (int)page->owner_pid, (unsigned long long)number);
        int64_t now = sim_now_ns();
        if (now >= deadline_ns)
            return SIM_TASK_AGAIN;
        sim_futex_wait(&page->word, seen, SIM_MIN(deadline_ns - now, OPENED_WAIT_SLICE_NS), true);
    }
}

typedef struct {
    sim_event_t *event;
    uint64_t number;
} record_goal_t;

static bool record_ran(void *arg)
{
    const record_goal_t *goal = arg;
    return atomic_load(&goal->event->completed) >= goal->number;
}

static int wait_for(sim_event_t *event, const target_t *target, int64_t deadline_ns)
{
    if (event->opened)
        return wait_for_opened(event, target->number, deadline_ns);
    if (target->stream == NULL || atomic_load(&event->completed) >= target->number)
        return ACL_SUCCESS;
    /* Until the record has run: a record of a model run runs inside its execution's one task, which
     * stops there for this wait (the rest of the model may wait for what this thread does next). */
    record_goal_t goal = {event, target->number};
    int rc = sim_stream_sync_until(target->stream, target->index, deadline_ns, record_ran, &goal);
    if (atomic_load(&event->completed) >= target->number)
        return ACL_SUCCESS;
    return rc == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT ? SIM_TASK_AGAIN : rc;
}

typedef struct {
    sim_task_t base;
    sim_event_t *event;
    target_t target;
    int64_t give_up_ns; /* aclrtSetOpWaitTimeout's limit, from when the wait began; 0: none */
} wait_task_t;

/* aclrtSetOpWaitTimeout: seconds a stream's wait for an event lasts at most (0: no limit). */
static _Atomic uint32_t g_op_wait_timeout_s;

SIM_EXPORT aclError aclrtSetOpWaitTimeout(uint32_t timeout)
{
    atomic_store(&g_op_wait_timeout_s, timeout);
    return ACL_SUCCESS;
}

static int run_wait(sim_task_t *task, int64_t deadline_ns)
{
    wait_task_t *wait = (wait_task_t *)task;
    if (wait->give_up_ns == 0) {
        uint32_t limit = atomic_load(&g_op_wait_timeout_s);
        wait->give_up_ns = limit == 0 ? SIM_NO_DEADLINE : sim_now_ns() + (int64_t)limit * SIM_NS_PER_S;
    }
    int rc = wait_for(wait->event, &wait->target, SIM_MIN(deadline_ns, wait->give_up_ns));
    if (rc == SIM_TASK_AGAIN && sim_now_ns() >= wait->give_up_ns)
        return sim_error(ACL_ERROR_RT_WAIT_TIMEOUT, "a wait for an event (aclrtStreamWaitEvent) outlasted the "
                         "%u s of aclrtSetOpWaitTimeout", (unsigned)atomic_load(&g_op_wait_timeout_s));
    if (rc != ACL_SUCCESS && rc != SIM_TASK_AGAIN && wait->event->opened)
        return rc; /* the process that records it ended: this stream would wait forever */
    /* The other stream's failure is reported by that stream, not this one. */
    return rc == SIM_TASK_AGAIN ? SIM_TASK_AGAIN : SIM_TASK_DONE;
}

static void release_wait(sim_task_t *task)
{
    wait_task_t *wait = (wait_task_t *)task;
    if (wait->target.stream != NULL)
        sim_stream_unref(wait->target.stream);
    event_unref(wait->event);
    free(wait);
}

static int replay_wait(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy);

/* A task of `stream` that waits for the newest record of `event` queued so far, not yet queued. */
static aclError new_wait(sim_stream_t *stream, sim_event_t *event, sim_task_t **out)
{
    sim_model_t *model = captured_by(event);
    if (model != NULL) { /* work of the capture: the stream joins it, or the origin rejoins a branch */
        pthread_mutex_lock(&event->lock);
        sim_stream_t *recorder = event->captured_stream;
        uint64_t position = event->captured_position;
        pthread_mutex_unlock(&event->lock);
        sim_capture_waits(model, stream, recorder, position);
    }
    /* malloc and a zeroing assignment, not calloc: see hccl_op_new in hccl/ops.c */
    wait_task_t *task = malloc(sizeof *task);
    if (task == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    *task = (wait_task_t){0};
    task->base.run = run_wait;
    task->base.release = release_wait;
    task->base.replay = replay_wait;
    task->base.name = "wait event";
    task->event = event;
    atomic_fetch_add(&event->refs, 1);
    task->target = snapshot(event);
    *out = &task->base;
    return ACL_SUCCESS;
}

static aclError wait_on(sim_stream_t *stream, sim_event_t *event)
{
    sim_task_t *task = NULL;
    aclError err = new_wait(stream, event, &task);
    if (err == ACL_SUCCESS)
        sim_stream_enqueue(stream, task);
    return err;
}

static int replay_wait(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    return new_wait(stream, ((const wait_task_t *)task)->event, copy);
}

SIM_EXPORT aclError aclrtStreamWaitEvent(aclrtStream stream_handle, aclrtEvent handle)
{
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, "aclrtStreamWaitEvent", &err);
    if (event == NULL)
        return err;
    err = check_sync_flag(event, false, "aclrtStreamWaitEvent");
    sim_stream_t *stream = err == ACL_SUCCESS ? sim_stream_acquire(stream_handle, &err) : NULL;
    if (stream != NULL) {
        err = wait_on(stream, event);
        sim_stream_unref(stream);
    }
    event_unref(event);
    return err;
}

static aclError synchronize(aclrtEvent handle, int32_t timeout_ms, const char *api)
{
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, api, &err);
    if (event == NULL)
        return err;
    if ((err = sim_capture_refuse_event(captured_by(event), api)) != ACL_SUCCESS) {
        event_unref(event);
        return err;
    }
    target_t target = snapshot(event);
    int64_t deadline = timeout_ms < 0 ? SIM_NO_DEADLINE : sim_now_ns() + (int64_t)timeout_ms * SIM_NS_PER_MS;
    int rc = wait_for(event, &target, deadline);
    if (rc == ACL_SUCCESS)
        rc = failure(event, api);
    if (target.stream != NULL)
        sim_stream_unref(target.stream);
    event_unref(event);
    if (rc == SIM_TASK_AGAIN)
        return sim_error(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, "%s: the event did not complete within the %d ms this "
                         "call waited", api, (int)timeout_ms);
    return rc;
}

SIM_EXPORT aclError aclrtSynchronizeEvent(aclrtEvent event)
{
    return synchronize(event, -1, "aclrtSynchronizeEvent");
}

SIM_EXPORT aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)
{
    if (timeout < -1)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeEventWithTimeout: timeout %d must be -1 or >= 0 "
                         "milliseconds", (int)timeout);
    return synchronize(event, timeout, "aclrtSynchronizeEventWithTimeout");
}

/* CANN reports NOT_READY for an event "not recorded, or recorded but not executed": never
 * recorded, reset since its last record ran, or with a record still queued. */
static bool is_complete(sim_event_t *event)
{
    if (event->opened) {
        uint64_t recorded = atomic_load(&event->page->recorded);
        return recorded > 0 && atomic_load(&event->page->completed) >= recorded;
    }
    pthread_mutex_lock(&event->lock);
    bool complete = event->recorded > 0 && !event->cleared && atomic_load(&event->completed) >= event->recorded;
    pthread_mutex_unlock(&event->lock);
    return complete;
}

SIM_EXPORT aclError aclrtQueryEventStatus(aclrtEvent handle, aclrtEventRecordedStatus *status)
{
    if (status == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is NULL");
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, "aclrtQueryEventStatus", &err);
    if (event == NULL)
        return err;
    if ((err = sim_capture_refuse_event(captured_by(event), "aclrtQueryEventStatus")) != ACL_SUCCESS) {
        event_unref(event);
        return err;
    }
    bool complete = is_complete(event);
    *status = complete ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    err = complete ? failure(event, "aclrtQueryEventStatus") : ACL_SUCCESS;
    event_unref(event);
    return err;
}

SIM_EXPORT aclError aclrtQueryEvent(aclrtEvent handle, aclrtEventStatus *status)
{
    if (status == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtQueryEvent: status is NULL");
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, "aclrtQueryEvent", &err);
    if (event == NULL)
        return err;
    if ((err = sim_capture_refuse_event(captured_by(event), "aclrtQueryEvent")) != ACL_SUCCESS) {
        event_unref(event);
        return err;
    }
    bool complete = is_complete(event);
    *status = complete ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
    err = complete ? failure(event, "aclrtQueryEvent") : ACL_SUCCESS;
    event_unref(event);
    return err;
}

static aclError elapsed(float *ms, sim_event_t *start, sim_event_t *end);

SIM_EXPORT aclError aclrtEventElapsedTime(float *ms, aclrtEvent start_handle, aclrtEvent end_handle)
{
    if (ms == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is NULL");
    int err = ACL_SUCCESS;
    sim_event_t *start = lookup(start_handle, "aclrtEventElapsedTime", &err);
    if (start == NULL)
        return err;
    sim_event_t *end = lookup(end_handle, "aclrtEventElapsedTime", &err);
    if (end == NULL) {
        event_unref(start);
        return err;
    }
    err = elapsed(ms, start, end);
    event_unref(start);
    event_unref(end);
    return err;
}

static aclError elapsed(float *ms, sim_event_t *start, sim_event_t *end)
{
    sim_event_t *events[2] = {start, end};
    int64_t stamps[2];
    for (int i = 0; i < 2; i++) {
        sim_event_t *event = events[i];
        if (event->opened)
            return sim_error(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, "aclrtEventElapsedTime: the %s event was opened "
                             "from another process: its time is kept there", i == 0 ? "start" : "end");
        if (event->explicit_flags && (event->flags & ACL_EVENT_TIME_LINE) == 0)
            return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: the %s event was created without "
                             "ACL_EVENT_TIME_LINE", i == 0 ? "start" : "end");
        pthread_mutex_lock(&event->lock);
        bool recorded = event->recorded > 0, complete = atomic_load(&event->completed) >= event->recorded;
        stamps[i] = event->timestamp_ns;
        pthread_mutex_unlock(&event->lock);
        if (!recorded || stamps[i] == 0)
            return sim_error(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, "aclrtEventElapsedTime: the %s event has not been "
                             "recorded", i == 0 ? "start" : "end");
        if (!complete)
            return sim_error(ACL_ERROR_RT_EVENT_NOT_COMPLETE, "aclrtEventElapsedTime: the %s event has not completed "
                             "(synchronise it first)", i == 0 ? "start" : "end");
    }
    *ms = (float)((double)(stamps[1] - stamps[0]) / 1e6);
    return ACL_SUCCESS;
}

void sim_event_after_fork(void)
{
    /* The parent's events are abandoned with the rest of its runtime (acl/device.c). */
    pthread_mutex_init(&g_events_lock, NULL);
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        g_events[d] = (event_list_t){NULL, 0, 0};
}

/* ------------------------------------------------------------ IPC events */

SIM_EXPORT aclError aclrtIpcGetEventHandle(aclrtEvent handle, aclrtIpcEventHandle *ipc)
{
    static const char *api = "aclrtIpcGetEventHandle";
    if (ipc == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handle is NULL", api);
    int err = ACL_SUCCESS;
    sim_event_t *event = lookup(handle, api, &err);
    if (event == NULL)
        return err;
    if (event->opened || (event->flags & ACL_EVENT_IPC) == 0) {
        event_unref(event);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s", api, event->opened
                         ? "the event was opened from another process: only the process that made it shares it"
                         : "the event was not created with ACL_EVENT_IPC (aclrtCreateEventExWithFlag)");
    }
    pthread_mutex_lock(&event->lock);
    if (event->page == NULL) {
        int fd = memfd_create("hcclpy-sim-ipc-event", MFD_CLOEXEC);
        ipc_event_page_t *page = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, sizeof *page) == 0)
            page = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (page == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            pthread_mutex_unlock(&event->lock);
            event_unref(event);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: cannot share the event: %s", api, strerror(errno));
        }
        page->magic = IPC_EVENT_MAGIC;
        page->uid = sim_random64();
        page->owner_pid = (int32_t)getpid();
        page->owner_start = sim_process_start_time(getpid());
        atomic_store(&page->recorded, event->recorded);
        atomic_store(&page->completed, atomic_load(&event->completed));
        event->page = page;
        event->page_fd = fd;
    }
    memset(ipc, 0, sizeof *ipc);
    snprintf(ipc->reserved, sizeof ipc->reserved, "hcclpy-ipce-%d-%d-%016" PRIx64, (int)getpid(), event->page_fd,
             event->page->uid);
    pthread_mutex_unlock(&event->lock);
    event_unref(event);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle ipc, aclrtEvent *out)
{
    static const char *api = "aclrtIpcOpenEventHandle";
    if (out == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: event is NULL", api);
    int pid = 0, fd = -1, used = 0;
    uint64_t uid = 0;
    ipc.reserved[sizeof ipc.reserved - 1] = '\0';
    if (sscanf(ipc.reserved, "hcclpy-ipce-%d-%d-%16" SCNx64 "%n", &pid, &fd, &uid, &used) != 3 ||
        ipc.reserved[used] != '\0')
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the handle is not one from aclrtIpcGetEventHandle", api);
    if (pid == (int)getpid())
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the handle is of an event of this process: use the event",
                         api);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int page_fd = open(path, O_RDWR | O_CLOEXEC);
    ipc_event_page_t *page = MAP_FAILED;
    if (page_fd >= 0) {
        page = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd, 0);
        close(page_fd);
    }
    if (page == MAP_FAILED || page->magic != IPC_EVENT_MAGIC || page->uid != uid) {
        if (page != MAP_FAILED)
            munmap(page, sizeof *page);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: the handle names no event: its process has ended or "
                         "destroyed it", api);
    }
    aclrtEvent handle = NULL;
    int err = create(&handle, ACL_EVENT_SYNC | ACL_EVENT_IPC, true, api);
    if (err != ACL_SUCCESS) {
        munmap(page, sizeof *page);
        return err;
    }
    sim_event_t *event = lookup(handle, api, &err);
    event->page = page;
    event->opened = true;
    event_unref(event);
    *out = handle;
    return ACL_SUCCESS;
}
