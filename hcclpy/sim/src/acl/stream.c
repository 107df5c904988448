/* Streams: ordered, asynchronous task queues.
 *
 * Tasks run in enqueue order, one at a time, by whichever thread holds the
 * stream's `runner` claim.  A thread that synchronises a stream claims it and
 * runs the pending tasks itself, so "enqueue, then synchronise" costs no
 * thread hand-off.  Every stream also has a worker thread for work nobody
 * waits for (a peer rank depends on it, another stream waits on an event).
 * The worker does not take a task the moment it is queued: it polls while the
 * stream is busy and leaves young tasks to a synchronising thread, so the
 * common path needs no system call and no wake-up; after a quiet spell it
 * sleeps until the next enqueue wakes it.  The polls start a few hundred
 * microseconds apart and spread out while synchronising threads do all the
 * work: each poll is a context switch that takes a core from a rank, and with
 * ranks in lockstep one rank's stall is every rank's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "acl/runtime.h"

#define WORKER_POLL_NS (200 * 1000)         /* light sleep between polls, at first */
#define WORKER_POLL_MAX_NS (2 * SIM_NS_PER_MS) /* ... doubling up to this while there is nothing to take */
#define WORKER_GRACE_NS (100 * 1000)        /* leave younger tasks to a synchronising thread */
#define WORKER_DEEP_AFTER_NS (20 * SIM_NS_PER_MS)
#define SYNC_SLEEP_SLICE_NS (10 * SIM_NS_PER_MS)

enum { WORKER_AWAKE = 0, WORKER_DEEP = 1 };
/* A stream runs no task after a failure until aclrtSetStreamFailureMode says otherwise: a job
 * whose collective failed cannot go on, and running its later collectives would hold it for one
 * execution timeout each before the failure is reported (CANN's streams continue by default). */
enum { FAILURE_MODE_UNSET = -1 };

struct sim_stream {
    void *handle;
    int device;
    bool is_default;
    uint32_t priority, flags;
    _Atomic int refs;

    pthread_mutex_t lock;           /* queue, worker start, error text */
    sim_task_t *head, *tail;
    _Atomic uint64_t enqueued, completed;

    _Atomic int runner;
    _Atomic uint32_t handover;      /* a synchronising thread asks the worker to hand the stream over */
    /* What the runner runs the tasks for, set by it (drain) and read by its tasks: a task that runs
     * several pieces of work in turn (a model run, capture.c) stops between two where the runner
     * would stop between two tasks (sim_stream_pause_wanted). */
    bool run_yields;                /* the worker, which hands the stream over when asked */
    bool (*run_reached)(void *arg); /* a synchronisation that ends once this holds (NULL: none) */
    void *run_arg;
    _Atomic uint32_t done_word;     /* futex: changes when a task completes or the runner leaves */
    _Atomic uint32_t done_waiters;

    pthread_t worker;
    bool worker_started;
    _Atomic uint32_t wake_word;
    _Atomic int worker_state;
    _Atomic int64_t last_enqueue_ns;
    _Atomic bool stopping;

    _Atomic int error;
    char error_text[1024];

    _Atomic int failure_mode;       /* aclrtSetStreamFailureMode; FAILURE_MODE_UNSET until then */
    _Atomic(sim_model_t *) capture; /* the model its work goes to while it captures (capture.c) */
    _Atomic(struct sim_task_group *) updating; /* the task group its work replaces (capture.c) */
    uint64_t group_start;           /* the capture position where its open task group starts */
    _Atomic uint64_t report_thread; /* aclrtSubscribeReport */
    int32_t id;                     /* aclrtStreamGetId */
};

sim_model_t *sim_stream_capture(sim_stream_t *stream)
{
    return atomic_load(&stream->capture);
}

void sim_stream_set_capture(sim_stream_t *stream, sim_model_t *model)
{
    atomic_store(&stream->capture, model);
    if (model == NULL)
        stream->group_start = 0;
}

bool sim_stream_is_default(const sim_stream_t *stream)
{
    return stream->is_default;
}

uint64_t sim_stream_group_start(sim_stream_t *stream)
{
    return stream->group_start;
}

void sim_stream_set_group_start(sim_stream_t *stream, uint64_t first)
{
    stream->group_start = first;
}

bool sim_stream_set_update(sim_stream_t *stream, struct sim_task_group *group)
{
    if (group == NULL) {
        atomic_store(&stream->updating, NULL);
        return true;
    }
    struct sim_task_group *none = NULL;
    if (atomic_load(&stream->updating) != NULL || !sim_update_begin(stream, group))
        return false;
    return atomic_compare_exchange_strong(&stream->updating, &none, group);
}

bool sim_stream_updating(sim_stream_t *stream)
{
    return atomic_load(&stream->updating) != NULL;
}

/* Stream ids, in creation order: ids are never reused in a process, so an id names one stream. */
static _Atomic int32_t g_next_stream_id;

/* ------------------------------------------------------------- bookkeeping */

void sim_stream_ref(sim_stream_t *stream)
{
    atomic_fetch_add(&stream->refs, 1);
}

void sim_stream_unref(sim_stream_t *stream)
{
    if (atomic_fetch_sub(&stream->refs, 1) != 1)
        return;
    /* Tasks queued by a thread that held a reference while the stream was destroyed, after
     * the destroy's last synchronisation, and that nobody synchronised: cancelled, so that
     * what they hold (an event, a communicator's operation) is let go. */
    sim_task_t *task = stream->head;
    while (task != NULL) {
        sim_task_t *next = task->next;
        if (task->cancel != NULL)
            task->cancel(task, ACL_ERROR_RT_STREAM_ABORT, "its stream was destroyed before reaching it");
        if (task->release != NULL)
            task->release(task);
        task = next;
    }
    pthread_mutex_destroy(&stream->lock);
    free(stream);
}

int sim_stream_device(const sim_stream_t *stream)
{
    return stream->device;
}

uint64_t sim_stream_enqueued(const sim_stream_t *stream)
{
    return atomic_load(&stream->enqueued);
}

void *sim_stream_handle(const sim_stream_t *stream)
{
    return stream->handle;
}

static void *ref_stream(void *object)
{
    sim_stream_ref(object);
    return object;
}

sim_stream_t *sim_stream_acquire(const void *handle, int *err)
{
    if (handle == NULL) {
        sim_stream_t *stream = sim_current_default_stream();
        if (stream == NULL)
            *err = ACL_ERROR_RT_CONTEXT_NULL;
        return stream;
    }
    sim_stream_t *stream = sim_handle_acquire(handle, SIM_KIND_STREAM, ref_stream);
    if (stream == NULL)
        *err = sim_error(ACL_ERROR_INVALID_PARAM, "%p is not a live stream (never created, destroyed, or released "
                         "by the aclrtResetDevice that released its device)", handle);
    return stream;
}

static bool has_pending(sim_stream_t *stream)
{
    return atomic_load(&stream->completed) < atomic_load(&stream->enqueued);
}

static void wake_worker(sim_stream_t *stream)
{
    atomic_fetch_add(&stream->wake_word, 1);
    sim_futex_wake(&stream->wake_word, false);
}

static void wake_waiters(sim_stream_t *stream)
{
    atomic_fetch_add(&stream->done_word, 1);
    if (atomic_load(&stream->done_waiters) != 0)
        sim_futex_wake(&stream->done_word, false);
}

/* ----------------------------------------------------------------- running */

static bool claim(sim_stream_t *stream)
{
    int expected = 0;
    return atomic_load_explicit(&stream->runner, memory_order_relaxed) == 0 &&
           atomic_compare_exchange_strong(&stream->runner, &expected, 1);
}

static void release_claim(sim_stream_t *stream)
{
    atomic_store(&stream->runner, 0);
    wake_waiters(stream);
    /* Work left behind must not wait for a deep-sleeping worker. */
    if (has_pending(stream) && atomic_load(&stream->worker_state) == WORKER_DEEP)
        wake_worker(stream);
}

static void record_failure(sim_stream_t *stream, int code, const char *text)
{
    pthread_mutex_lock(&stream->lock);
    int expected = 0;
    if (atomic_compare_exchange_strong(&stream->error, &expected, code))
        snprintf(stream->error_text, sizeof stream->error_text, "%s", text);
    pthread_mutex_unlock(&stream->lock);
}

void sim_stream_fail_message(sim_stream_t *stream, const char *message)
{
    record_failure(stream, ACL_ERROR_RT_AICPU_EXCEPTION, message);
}

/* sim_stream_run_task, inlined in drain's loop (a call there costs each task ~25 instructions). */
static inline __attribute__((always_inline)) int run_task(sim_stream_t *stream, sim_task_t *task,
                                                          int64_t deadline_ns)
{
    int error = atomic_load(&stream->error);
    if (error != 0 && (error == ACL_ERROR_RT_STREAM_ABORT ||
                       atomic_load(&stream->failure_mode) != (int)ACL_CONTINUE_ON_FAILURE)) {
        if (task->cancel != NULL) {
            char why[sizeof stream->error_text];
            pthread_mutex_lock(&stream->lock); /* record_failure writes the text under it */
            memcpy(why, stream->error_text, sizeof why);
            pthread_mutex_unlock(&stream->lock);
            task->cancel(task, atomic_load(&stream->error), why);
        }
        return SIM_TASK_DONE;
    }
    int rc = task->run(task, deadline_ns);
    if (rc != SIM_TASK_DONE && rc != SIM_TASK_AGAIN)
        record_failure(stream, rc, sim_error_text());
    return rc;
}

int sim_stream_run_task(sim_stream_t *stream, sim_task_t *task, int64_t deadline_ns)
{
    return run_task(stream, task, deadline_ns);
}

bool sim_stream_pause_wanted(sim_stream_t *stream)
{
    return (stream->run_yields && atomic_load(&stream->handover) != 0) ||
           (stream->run_reached != NULL && stream->run_reached(stream->run_arg));
}

void sim_stream_progress(sim_stream_t *stream)
{
    if (atomic_load(&stream->done_waiters) != 0)
        wake_waiters(stream);
}

/* Runs tasks while the stream holds fewer than `target` completions.  Returns
 * SIM_TASK_AGAIN if a task had to wait past `deadline_ns` (or a model run stopped
 * where the runner wanted it to: sim_stream_pause_wanted).  The worker
 * (`yields`) stops between tasks when a synchronising thread asks for the
 * stream, so that thread runs the rest itself instead of being woken once
 * per task.  A synchronisation that ends once `reached(arg)` holds (when not
 * NULL) passes it on to the tasks. */
static int drain(sim_stream_t *stream, uint64_t target, int64_t deadline_ns, bool yields,
                 bool (*reached)(void *arg), void *arg)
{
    stream->run_yields = yields; /* (the stream is this thread's until release_claim) */
    stream->run_reached = reached;
    stream->run_arg = arg;
    while (atomic_load(&stream->completed) < target) {
        if (yields && atomic_load(&stream->handover) != 0)
            return SIM_TASK_AGAIN;
        pthread_mutex_lock(&stream->lock);
        sim_task_t *task = stream->head;
        pthread_mutex_unlock(&stream->lock);
        if (task == NULL)
            break;
        if (run_task(stream, task, deadline_ns) == SIM_TASK_AGAIN)
            return SIM_TASK_AGAIN;
        pthread_mutex_lock(&stream->lock);
        stream->head = task->next;
        if (stream->head == NULL)
            stream->tail = NULL;
        atomic_fetch_add(&stream->completed, 1);
        pthread_mutex_unlock(&stream->lock);
        if (task->release != NULL)
            task->release(task);
        wake_waiters(stream);
    }
    return SIM_TASK_DONE;
}

static void *worker_main(void *arg)
{
    sim_stream_t *stream = arg;
    int64_t poll = WORKER_POLL_NS;
    while (!atomic_load(&stream->stopping)) {
        uint32_t seen = atomic_load(&stream->wake_word);
        if (has_pending(stream) && atomic_load(&stream->runner) == 0) {
            pthread_mutex_lock(&stream->lock);
            int64_t age = stream->head == NULL ? 0 : sim_now_ns() - stream->head->enqueued_ns;
            pthread_mutex_unlock(&stream->lock);
            if (age >= WORKER_GRACE_NS && atomic_load(&stream->handover) == 0 && claim(stream)) {
                drain(stream, UINT64_MAX, SIM_NO_DEADLINE, true, NULL, NULL);
                release_claim(stream);
                poll = WORKER_POLL_NS; /* work nobody waited for: look often again */
                continue;
            }
        }
        int64_t idle = sim_now_ns() - atomic_load(&stream->last_enqueue_ns);
        if (idle < WORKER_DEEP_AFTER_NS || has_pending(stream)) {
            sim_futex_wait(&stream->wake_word, seen, poll, false);
            poll = SIM_MIN(2 * poll, WORKER_POLL_MAX_NS);
            continue;
        }
        atomic_store(&stream->worker_state, WORKER_DEEP);
        if (!has_pending(stream) && !atomic_load(&stream->stopping))
            sim_futex_wait(&stream->wake_word, seen, SIM_NS_PER_S, false);
        atomic_store(&stream->worker_state, WORKER_AWAKE);
    }
    return NULL;
}

uint64_t sim_stream_enqueue(sim_stream_t *stream, sim_task_t *task)
{
    sim_model_t *model = atomic_load(&stream->capture);
    if (model != NULL && sim_capture_take(model, stream, task))
        return 0;
    if (atomic_load(&stream->updating) != NULL && sim_update_take(stream, task))
        return 0;
    int64_t now = sim_now_ns();
    task->next = NULL;
    task->enqueued_ns = now;
    pthread_mutex_lock(&stream->lock);
    if (stream->tail == NULL) {
        stream->head = task;
    } else {
        stream->tail->next = task;
    }
    stream->tail = task;
    uint64_t place = atomic_fetch_add(&stream->enqueued, 1) + 1;
    if (!stream->worker_started) {
        /* The worker starts on first use: most streams of a short program
         * never need one running before that. */
        stream->worker_started = pthread_create(&stream->worker, NULL, worker_main, stream) == 0;
    }
    pthread_mutex_unlock(&stream->lock);
    atomic_store(&stream->last_enqueue_ns, now);
    if (atomic_load(&stream->worker_state) == WORKER_DEEP)
        wake_worker(stream);
    return place;
}

void sim_stream_start(sim_stream_t *stream, uint64_t place)
{
    /* Tasks finish in order: the one at `place` is next when all before it are done. */
    if (atomic_load(&stream->completed) + 1 != place || !claim(stream))
        return;
    if (atomic_load(&stream->completed) + 1 == place) /* still next, now that the stream is ours */
        drain(stream, place, 0, false, NULL, NULL);
    release_claim(stream);
}

/* sim_stream_sync_until (`reached` may be NULL); at the deadline, SIM_TASK_AGAIN without an
 * error message when not `reports_timeout`. */
static int sync_until(sim_stream_t *stream, uint64_t target, int64_t deadline_ns, bool reports_timeout,
                      bool (*reached)(void *arg), void *arg)
{
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    bool requested = false; /* asked the worker to hand the stream over */
    int rc = ACL_SUCCESS;
    for (;;) {
        if (atomic_load(&stream->completed) >= target || (reached != NULL && reached(arg)))
            break;
        if (claim(stream)) {
            int drained = drain(stream, target, deadline_ns, false, reached, arg);
            release_claim(stream);
            if (drained == SIM_TASK_AGAIN && (reached == NULL || !reached(arg))) {
                rc = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
                break;
            }
            continue;
        }
        if (!requested) {
            atomic_fetch_add(&stream->handover, 1);
            requested = true;
        }
        int64_t now = sim_now_ns();
        if (now >= deadline_ns) {
            rc = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
            break;
        }
        if (!sim_backoff_step(&backoff))
            continue;
        uint32_t seen = atomic_load(&stream->done_word);
        atomic_fetch_add(&stream->done_waiters, 1);
        /* (sim_stream_progress wakes it when a model run has run what `reached` waits for) */
        if (atomic_load(&stream->completed) < target && atomic_load(&stream->runner) != 0 &&
            (reached == NULL || !reached(arg)))
            sim_futex_wait(&stream->done_word, seen, SIM_MIN(deadline_ns - now, SYNC_SLEEP_SLICE_NS), false);
        atomic_fetch_sub(&stream->done_waiters, 1);
    }
    if (requested)
        atomic_fetch_sub(&stream->handover, 1);
    if (rc == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT && !reports_timeout)
        return SIM_TASK_AGAIN;
    if (rc == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)
        return sim_error(rc, "stream synchronisation timed out (%llu of %llu tasks done)",
                         (unsigned long long)atomic_load(&stream->completed), (unsigned long long)target);
    int error = atomic_load(&stream->error);
    if (error != 0) {
        pthread_mutex_lock(&stream->lock);
        sim_error(error, "%s", stream->error_text);
        pthread_mutex_unlock(&stream->lock);
    }
    return error;
}

int sim_stream_sync_to(sim_stream_t *stream, uint64_t target, int64_t deadline_ns)
{
    return sync_until(stream, target, deadline_ns, true, NULL, NULL);
}

int sim_stream_sync_until(sim_stream_t *stream, uint64_t target, int64_t deadline_ns, bool (*reached)(void *arg),
                          void *arg)
{
    return sync_until(stream, target, deadline_ns, true, reached, arg);
}

/* sim_stream_sync_to with a deadline `timeout_ms` from now.  Most waits find the work done, or
 * run it without waiting for a peer: the clock is read only once one has to wait (a timed wait
 * in slices is the binding's every stream synchronisation). */
static int sync_within(sim_stream_t *stream, uint64_t target, int32_t timeout_ms)
{
    int rc = sync_until(stream, target, 0, false, NULL, NULL);
    if (rc != SIM_TASK_AGAIN)
        return rc;
    return sync_until(stream, target, sim_now_ns() + (int64_t)timeout_ms * SIM_NS_PER_MS, true, NULL, NULL);
}

/* ------------------------------------------------------- create / destroy */

static int register_stream(sim_stream_t *stream)
{
    sim_device_t *device = sim_device(stream->device);
    pthread_mutex_lock(&device->streams_lock);
    if (device->stream_count == device->stream_capacity) {
        size_t capacity = device->stream_capacity ? device->stream_capacity * 2 : 16;
        sim_stream_t **grown = realloc(device->streams, capacity * sizeof *grown);
        if (grown == NULL) {
            pthread_mutex_unlock(&device->streams_lock);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating a stream");
        }
        device->streams = grown;
        device->stream_capacity = capacity;
    }
    device->streams[device->stream_count++] = stream;
    pthread_mutex_unlock(&device->streams_lock);
    return ACL_SUCCESS;
}

static void unregister_stream(sim_stream_t *stream)
{
    sim_device_t *device = sim_device(stream->device);
    pthread_mutex_lock(&device->streams_lock);
    for (size_t i = 0; i < device->stream_count; i++) {
        if (device->streams[i] == stream) {
            device->streams[i] = device->streams[--device->stream_count];
            break;
        }
    }
    pthread_mutex_unlock(&device->streams_lock);
}

int sim_stream_create(int device, uint32_t priority, uint32_t flags, bool is_default, sim_stream_t **out)
{
    sim_stream_t *stream = calloc(1, sizeof *stream);
    if (stream == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory creating a stream");
    stream->device = device;
    stream->is_default = is_default;
    stream->priority = priority;
    stream->flags = flags;
    stream->refs = 1;
    stream->id = atomic_fetch_add(&g_next_stream_id, 1);
    atomic_store(&stream->failure_mode, FAILURE_MODE_UNSET);
    pthread_mutex_init(&stream->lock, NULL);
    stream->handle = sim_handle_new(SIM_KIND_STREAM, stream);
    if (stream->handle == NULL) {
        free(stream);
        return sim_error(ACL_ERROR_RT_NO_STREAM_RESOURCE, "too many live handles");
    }
    int err = register_stream(stream);
    if (err != ACL_SUCCESS) {
        sim_handle_free(stream->handle);
        free(stream);
        return err;
    }
    *out = stream;
    return ACL_SUCCESS;
}

/* Stops and joins the stream's worker; with `restartable`, the next enqueue starts a new one.
 * (An enqueue racing with this finds the old worker still marked started: its task then runs
 * when the stream is synchronised, which is where a device reset leaves such work anyway.) */
static void stop_worker(sim_stream_t *stream, bool restartable)
{
    pthread_mutex_lock(&stream->lock);
    bool started = stream->worker_started;
    pthread_mutex_unlock(&stream->lock);
    if (!started)
        return;
    atomic_store(&stream->stopping, true);
    wake_worker(stream);
    pthread_join(stream->worker, NULL);
    if (restartable) {
        pthread_mutex_lock(&stream->lock);
        stream->worker_started = false;
        atomic_store(&stream->stopping, false);
        pthread_mutex_unlock(&stream->lock);
    }
}

int sim_stream_destroy(sim_stream_t *stream, bool force)
{
    if (force)
        record_failure(stream, ACL_ERROR_RT_STREAM_ABORT, "the stream was destroyed with work pending");
    sim_stream_sync_to(stream, atomic_load(&stream->enqueued), SIM_NO_DEADLINE);
    /* Of a user's destroy and its device's last reset (sim_stream_release_device), the one that
     * frees the handle tears the stream down; the other must not do it a second time. */
    if (!sim_handle_free(stream->handle))
        return sim_error(ACL_ERROR_INVALID_PARAM, "%p was destroyed meanwhile (by another thread, or by the "
                         "aclrtResetDevice that released its device)", stream->handle);
    unregister_stream(stream);
    stop_worker(stream, false);
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

void sim_stream_release_device(int device)
{
    sim_device_t *dev = sim_device(device);
    pthread_mutex_lock(&dev->streams_lock);
    size_t count = 0;
    /* Out of host memory, the streams stay usable: better than a reset that fails half done. */
    sim_stream_t **streams = malloc((dev->stream_count ? dev->stream_count : 1) * sizeof *streams);
    for (size_t i = 0; streams != NULL && i < dev->stream_count; i++) {
        streams[count] = dev->streams[i];
        sim_stream_ref(streams[count++]); /* alive until this function is done with it */
    }
    pthread_mutex_unlock(&dev->streams_lock);
    for (size_t i = 0; i < count; i++) {
        /* Default streams belong to their contexts, which outlive the reset; their workers do
         * not: a program that resets its devices and returns from main leaves no thread
         * behind (valgrind and sanitizers report such threads' stacks as leaks).  The next
         * use of the stream starts a worker again. */
        if (streams[i]->is_default) {
            stop_worker(streams[i], true);
        } else {
            sim_capture_stream_destroyed(streams[i]);
            sim_stream_destroy(streams[i], false);
        }
        sim_stream_unref(streams[i]);
    }
    free(streams);
}

int sim_stream_sync_all(int device, int64_t deadline_ns)
{
    sim_device_t *dev = sim_device(device);
    pthread_mutex_lock(&dev->streams_lock);
    size_t count = dev->stream_count;
    sim_stream_t **streams = malloc((count ? count : 1) * sizeof *streams);
    if (streams == NULL) {
        pthread_mutex_unlock(&dev->streams_lock);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    }
    for (size_t i = 0; i < count; i++) {
        streams[i] = dev->streams[i];
        sim_stream_ref(streams[i]);
    }
    pthread_mutex_unlock(&dev->streams_lock);
    int first_error = ACL_SUCCESS;
    for (size_t i = 0; i < count; i++) {
        int err = sim_stream_sync_to(streams[i], atomic_load(&streams[i]->enqueued), deadline_ns);
        if (first_error == ACL_SUCCESS)
            first_error = err;
        sim_stream_unref(streams[i]);
    }
    free(streams);
    return first_error;
}

void sim_kick_idle_streams(void)
{
    int count = sim_config()->device_count;
    for (int d = 0; d < count; d++) {
        sim_device_t *dev = sim_device(d);
        pthread_mutex_lock(&dev->streams_lock);
        for (size_t i = 0; i < dev->stream_count; i++) {
            sim_stream_t *stream = dev->streams[i];
            if (has_pending(stream) && atomic_load(&stream->runner) == 0)
                wake_worker(stream);
        }
        pthread_mutex_unlock(&dev->streams_lock);
    }
}

/* ------------------------------------------------------------ public API */

static int create_stream_for_current(aclrtStream *stream, uint32_t priority, uint32_t flag, const char *api)
{
    if (stream == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: stream is NULL", api);
    sim_context_t *context = sim_current_context();
    if (context == NULL)
        return ACL_ERROR_RT_CONTEXT_NULL;
    sim_stream_t *created;
    int err = sim_stream_create(context->device, priority, flag, false, &created);
    if (err == ACL_SUCCESS)
        *stream = created->handle;
    return err;
}

SIM_EXPORT aclError aclrtCreateStream(aclrtStream *stream)
{
    return create_stream_for_current(stream, 0, 0, "aclrtCreateStream");
}

SIM_EXPORT aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    if (priority > 7)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateStreamWithConfig: priority %u is outside 0..7", priority);
    uint32_t known = ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC | ACL_STREAM_PERSISTENT | ACL_STREAM_HUGE |
                     ACL_STREAM_CPU_SCHEDULE | ACL_STREAM_DEVICE_USE_ONLY;
    if ((flag & ~known) != 0)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateStreamWithConfig: unknown flag bits 0x%x", flag & ~known);
    return create_stream_for_current(stream, priority, flag, "aclrtCreateStreamWithConfig");
}

static aclError destroy_stream(aclrtStream handle, bool force, const char *api)
{
    /* Referenced: of two threads destroying one stream, the one that loses may still be
     * synchronising it when the other frees the handle (sim_stream_destroy). */
    sim_stream_t *stream = sim_handle_acquire(handle, SIM_KIND_STREAM, ref_stream);
    if (stream == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is not a live stream (never created, destroyed, or "
                         "released by the aclrtResetDevice that released its device)", api, handle);
    if (!stream->is_default)
        sim_capture_stream_destroyed(stream);
    int err = stream->is_default ? sim_error(ACL_ERROR_INVALID_PARAM, "%s: a default stream cannot be destroyed", api)
                                 : sim_stream_destroy(stream, force);
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtDestroyStream(aclrtStream stream)
{
    return destroy_stream(stream, false, "aclrtDestroyStream");
}

SIM_EXPORT aclError aclrtDestroyStreamForce(aclrtStream stream)
{
    return destroy_stream(stream, true, "aclrtDestroyStreamForce");
}

/* Every entry point below holds a reference on its stream until it returns (sim_stream_acquire).
 * A stream destroyed by another thread while this one synchronises it stays allocated until this
 * one is done; aclrtDestroyStream waits for the same work first, so such a synchronisation ends
 * as if the destroy had come after it: when the work is done, with the stream's status (success,
 * or ACL_ERROR_RT_STREAM_ABORT after aclrtDestroyStreamForce).  A call that starts after the
 * destroy finds no live stream (ACL_ERROR_INVALID_PARAM). */
SIM_EXPORT aclError aclrtSynchronizeStream(aclrtStream handle)
{
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    err = sim_capture_refuse_on(stream, "aclrtSynchronizeStream");
    if (err == ACL_SUCCESS)
        err = sim_stream_sync_to(stream, atomic_load(&stream->enqueued), SIM_NO_DEADLINE);
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtSynchronizeStreamWithTimeout(aclrtStream handle, int32_t timeout)
{
    if (timeout < -1)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeStreamWithTimeout: timeout %d must be -1 "
                         "(no limit) or >= 0 milliseconds", (int)timeout);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if ((err = sim_capture_refuse_on(stream, "aclrtSynchronizeStreamWithTimeout")) != ACL_SUCCESS) {
        /* refused */
    } else if (timeout == 0) {
        /* Only asks whether the work is done: nothing is run or waited for. */
        if (atomic_load(&stream->completed) < atomic_load(&stream->enqueued))
            err = sim_error(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "the stream still has work queued");
        else
            err = sim_stream_sync_to(stream, 0, SIM_NO_DEADLINE); /* reports a sticky error */
    } else {
        uint64_t target = atomic_load(&stream->enqueued);
        err = timeout < 0 ? sim_stream_sync_to(stream, target, SIM_NO_DEADLINE) : sync_within(stream, target, timeout);
    }
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtStreamQuery(aclrtStream handle, aclrtStreamStatus *status)
{
    if (status == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is NULL");
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    /* Only looks: nothing is run or waited for.  A failed stream's error is reported here, as
     * by a synchronisation, once its work has ended. */
    if ((err = sim_capture_refuse_on(stream, "aclrtStreamQuery")) != ACL_SUCCESS) {
        *status = ACL_STREAM_STATUS_NOT_READY;
    } else if (atomic_load(&stream->completed) < atomic_load(&stream->enqueued)) {
        *status = ACL_STREAM_STATUS_NOT_READY;
    } else {
        err = sim_stream_sync_to(stream, 0, SIM_NO_DEADLINE);
        *status = ACL_STREAM_STATUS_COMPLETE;
    }
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtStreamGetId(aclrtStream handle, int32_t *streamId)
{
    if (streamId == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtStreamGetId: streamId is NULL");
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    *streamId = stream->id;
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtSetStreamFailureMode(aclrtStream handle, uint64_t mode)
{
    if (mode != ACL_CONTINUE_ON_FAILURE && mode != ACL_STOP_ON_FAILURE)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: mode %llu is neither "
                         "ACL_CONTINUE_ON_FAILURE (0) nor ACL_STOP_ON_FAILURE (1)", (unsigned long long)mode);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    int unset = FAILURE_MODE_UNSET;
    if (!atomic_compare_exchange_strong(&stream->failure_mode, &unset, (int)mode))
        err = sim_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: the mode of stream %d was set "
                        "already (once per stream)", (int)stream->id);
    sim_stream_unref(stream);
    return err;
}

/* aclrtSetOpExecuteTimeOut: bounds operator kernels (AI Core, AI CPU), which the simulator does
 * not run; the value is checked and kept, and HCCL's operations keep HCCL_EXEC_TIMEOUT. */
static _Atomic uint32_t g_op_execute_timeout_s;

SIM_EXPORT aclError aclrtSetOpExecuteTimeOut(uint32_t timeout)
{
    atomic_store(&g_op_execute_timeout_s, timeout);
    return ACL_SUCCESS;
}

/* --------------------------------------------------------- copies and sets */

int sim_check_copy(const char *api, void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
int sim_check_set(const char *api, void *devPtr, size_t maxCount, size_t count);

typedef struct {
    sim_task_t base;
    void *dst;
    const void *src;
    size_t count;
    int value;
    bool streaming;
} copy_task_t;

static int run_copy(sim_task_t *task, int64_t deadline)
{
    copy_task_t *copy = (copy_task_t *)task;
    sim_copy(copy->dst, copy->src, copy->count, copy->streaming);
    if (copy->streaming)
        sim_store_fence(); /* whoever sees the task complete sees the data */
    return SIM_TASK_DONE;
}

static int run_set(sim_task_t *task, int64_t deadline)
{
    copy_task_t *set = (copy_task_t *)task;
    memset(set->dst, set->value, set->count);
    return SIM_TASK_DONE;
}

static void free_task(sim_task_t *task)
{
    free(task);
}

/* Replay (capture.c) of a task that is all in its own struct of `size` bytes: a copy of it. */
static int replay_copy_of(const sim_task_t *task, size_t size, sim_task_t **copy)
{
    sim_task_t *fresh = malloc(size);
    if (fresh == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory replaying a %s", task->name);
    memcpy(fresh, task, size);
    fresh->next = NULL;
    *copy = fresh;
    return ACL_SUCCESS;
}

static int replay_copy_task(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    return replay_copy_of(task, sizeof(copy_task_t), copy);
}

static aclError enqueue_copy_or_set(sim_stream_t *stream, int (*run)(sim_task_t *, int64_t), void *dst,
                                    const void *src, size_t count, int value, bool wait, bool streaming)
{
    /* malloc and a zeroing assignment, not calloc: see hccl_op_new in hccl/ops.c */
    copy_task_t *task = malloc(sizeof *task);
    if (task == NULL)
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    *task = (copy_task_t){0};
    task->base.run = run;
    task->base.release = free_task;
    task->base.replay = replay_copy_task;
    task->base.name = run == run_copy ? "memcpy" : "memset";
    task->dst = dst;
    task->src = src;
    task->count = count;
    task->value = value;
    task->streaming = streaming;
    if (sim_stream_enqueue(stream, &task->base) == 0 || !wait) /* (captured: nothing to wait for) */
        return ACL_SUCCESS;
    return sim_stream_sync_to(stream, atomic_load(&stream->enqueued), SIM_NO_DEADLINE);
}

SIM_EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                                     aclrtStream handle)
{
    int err = sim_check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
    if (err != ACL_SUCCESS)
        return err;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if (count != 0) {
        /* Copies from or to pageable host memory return when they are done. */
        bool dst_host = sim_pointer_device(dst, NULL) < 0, src_host = sim_pointer_device(src, NULL) < 0;
        bool pageable = (dst_host && !sim_host_pinned(dst, count)) || (src_host && !sim_host_pinned(src, count));
        bool streaming = dst_host && count >= SIM_STREAMING_COPY_BYTES;
        if (pageable)
            err = sim_capture_unsafe("aclrtMemcpyAsync of pageable host memory");
        if (err == ACL_SUCCESS)
            err = enqueue_copy_or_set(stream, run_copy, dst, src, count, 0, pageable, streaming);
    }
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream handle)
{
    int err = sim_check_set("aclrtMemsetAsync", devPtr, maxCount, count);
    if (err != ACL_SUCCESS)
        return err;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if (count != 0)
        err = enqueue_copy_or_set(stream, run_set, devPtr, NULL, count, value & 0xFF, false, false);
    sim_stream_unref(stream);
    return err;
}

int sim_check_copy_2d(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t height, aclrtMemcpyKind kind);

typedef struct {
    sim_task_t base;
    char *dst;
    const char *src;
    size_t dpitch, spitch, width, height;
} copy_2d_task_t;

static void copy_rows(char *dst, size_t dpitch, const char *src, size_t spitch, size_t width, size_t height)
{
    for (size_t row = 0; row < height; row++)
        memmove(dst + row * dpitch, src + row * spitch, width);
}

static int run_copy_2d(sim_task_t *task, int64_t deadline)
{
    copy_2d_task_t *copy = (copy_2d_task_t *)task;
    copy_rows(copy->dst, copy->dpitch, copy->src, copy->spitch, copy->width, copy->height);
    return SIM_TASK_DONE;
}

static int replay_copy_2d_task(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    return replay_copy_of(task, sizeof(copy_2d_task_t), copy);
}

SIM_EXPORT aclError aclrtMemcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                  size_t height, aclrtMemcpyKind kind)
{
    int err = sim_check_copy_2d("aclrtMemcpy2d", dst, dpitch, src, spitch, width, height, kind);
    if (err == ACL_SUCCESS)
        err = sim_capture_unsafe("aclrtMemcpy2d");
    if (err == ACL_SUCCESS)
        copy_rows(dst, dpitch, src, spitch, width, height);
    return err;
}

SIM_EXPORT aclError aclrtMemcpy2dAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                       size_t height, aclrtMemcpyKind kind, aclrtStream handle)
{
    int err = sim_check_copy_2d("aclrtMemcpy2dAsync", dst, dpitch, src, spitch, width, height, kind);
    if (err != ACL_SUCCESS)
        return err;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if (width != 0 && height != 0) {
        copy_2d_task_t *task = malloc(sizeof *task);
        if (task == NULL) {
            sim_stream_unref(stream);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
        }
        *task = (copy_2d_task_t){0};
        task->base.run = run_copy_2d;
        task->base.release = free_task;
        task->base.replay = replay_copy_2d_task;
        task->base.name = "memcpy2d";
        task->dst = dst;
        task->src = src;
        task->dpitch = dpitch, task->spitch = spitch, task->width = width, task->height = height;
        sim_stream_enqueue(stream, &task->base);
    }
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

/* ----------------------------------------------------------- host functions */

typedef struct {
    sim_task_t base;
    aclrtHostFunc fn;
    void *args;
} host_func_task_t;

/* Runs on the thread that runs the stream (its worker, or a thread synchronising it), in stream
 * order; the stream's later tasks wait for it, as they wait for any task. */
static int run_host_func(sim_task_t *task, int64_t deadline)
{
    host_func_task_t *host = (host_func_task_t *)task;
    host->fn(host->args);
    return SIM_TASK_DONE;
}

static int replay_host_func(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    return replay_copy_of(task, sizeof(host_func_task_t), copy);
}

SIM_EXPORT aclError aclrtLaunchHostFunc(aclrtStream handle, aclrtHostFunc fn, void *args)
{
    if (fn == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtLaunchHostFunc: fn is NULL");
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    host_func_task_t *task = malloc(sizeof *task);
    if (task == NULL) {
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    }
    *task = (host_func_task_t){0};
    task->base.run = run_host_func;
    task->base.release = free_task;
    task->base.replay = replay_host_func;
    task->base.name = "host function";
    task->fn = fn;
    task->args = args;
    sim_stream_enqueue(stream, &task->base);
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

/* -------------------------------------------------------------- callbacks */

/* Host callbacks run on the thread that subscribed to the stream, inside its
 * aclrtProcessReport calls. */
typedef struct report {
    struct report *next;
    aclrtCallback fn;
    void *user_data;
    bool blocking;
    _Atomic bool done;
} report_t;

typedef struct report_queue {
    struct report_queue *next;
    uint64_t thread;
    int subscriptions;
    report_t *head, *tail;
    pthread_cond_t cond;
} report_queue_t;

static pthread_mutex_t g_report_lock = PTHREAD_MUTEX_INITIALIZER;
static report_queue_t *g_report_queues;

static report_queue_t *find_queue(uint64_t thread)
{
    for (report_queue_t *q = g_report_queues; q != NULL; q = q->next)
        if (q->thread == thread)
            return q;
    return NULL;
}

static aclError subscribe_report(uint64_t threadId, sim_stream_t *stream)
{
    pthread_mutex_lock(&g_report_lock);
    uint64_t current = atomic_load(&stream->report_thread);
    if (current != 0) {
        pthread_mutex_unlock(&g_report_lock);
        return sim_error(ACL_ERROR_RT_STREAM_SUBSCRIBE, "aclrtSubscribeReport: the stream is already subscribed by "
                         "thread %llu", (unsigned long long)current);
    }
    report_queue_t *queue = find_queue(threadId);
    if (queue == NULL) {
        queue = calloc(1, sizeof *queue);
        if (queue == NULL) {
            pthread_mutex_unlock(&g_report_lock);
            return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
        }
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&queue->cond, &attr);
        pthread_condattr_destroy(&attr);
        queue->thread = threadId;
        queue->next = g_report_queues;
        g_report_queues = queue;
    }
    queue->subscriptions++;
    atomic_store(&stream->report_thread, threadId);
    pthread_mutex_unlock(&g_report_lock);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream handle)
{
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    err = subscribe_report(threadId, stream);
    sim_stream_unref(stream);
    return err;
}

static aclError unsubscribe_report(uint64_t threadId, sim_stream_t *stream)
{
    pthread_mutex_lock(&g_report_lock);
    report_queue_t *queue = find_queue(threadId);
    if (queue == NULL || atomic_load(&stream->report_thread) != threadId) {
        pthread_mutex_unlock(&g_report_lock);
        return sim_error(ACL_ERROR_RT_THREAD_SUBSCRIBE, "aclrtUnSubscribeReport: thread %llu is not subscribed to "
                         "this stream", (unsigned long long)threadId);
    }
    atomic_store(&stream->report_thread, 0);
    queue->subscriptions--;
    pthread_mutex_unlock(&g_report_lock);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream handle)
{
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    err = unsubscribe_report(threadId, stream);
    sim_stream_unref(stream);
    return err;
}

typedef struct {
    sim_task_t base;
    uint64_t thread;
    report_t *report;
    bool posted;
} callback_task_t;

static int run_callback(sim_task_t *task, int64_t deadline_ns)
{
    callback_task_t *cb = (callback_task_t *)task;
    if (!cb->posted) {
        pthread_mutex_lock(&g_report_lock);
        report_queue_t *queue = find_queue(cb->thread);
        if (queue == NULL) {
            pthread_mutex_unlock(&g_report_lock);
            return sim_error(ACL_ERROR_RT_THREAD_SUBSCRIBE, "host callback: thread %llu no longer processes reports",
                             (unsigned long long)cb->thread);
        }
        /* Read before posting: from then on a non-blocking report belongs to the processing
         * thread, which may run and free it before this thread looks again. */
        bool blocking = cb->report->blocking;
        cb->report->next = NULL;
        if (queue->tail == NULL)
            queue->head = cb->report;
        else
            queue->tail->next = cb->report;
        queue->tail = cb->report;
        pthread_cond_broadcast(&queue->cond);
        pthread_mutex_unlock(&g_report_lock);
        cb->posted = true;
        if (!blocking) {
            cb->report = NULL; /* the processing thread frees it */
            return SIM_TASK_DONE;
        }
    }
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    while (!atomic_load(&cb->report->done)) {
        if (sim_now_ns() >= deadline_ns)
            return SIM_TASK_AGAIN;
        if (sim_backoff_step(&backoff)) {
            struct timespec pause = {0, 200 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    return SIM_TASK_DONE;
}

static void free_callback_task(sim_task_t *task)
{
    callback_task_t *cb = (callback_task_t *)task;
    if (cb->report != NULL && (!cb->posted || atomic_load(&cb->report->done)))
        free(cb->report);
    free(cb);
}

static aclError new_callback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                             sim_stream_t *stream, sim_task_t **out);

static int replay_callback(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy)
{
    const callback_task_t *cb = (const callback_task_t *)task;
    return new_callback(cb->report->fn, cb->report->user_data,
                        cb->report->blocking ? ACL_CALLBACK_BLOCK : ACL_CALLBACK_NO_BLOCK, stream, copy);
}

/* A callback task for `stream` (the thread subscribed to it processes it), not queued. */
static aclError new_callback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                             sim_stream_t *stream, sim_task_t **out)
{
    uint64_t thread = atomic_load(&stream->report_thread);
    if (thread == 0)
        return sim_error(ACL_ERROR_RT_STREAM_NO_CB_REG, "aclrtLaunchCallback: no thread is subscribed to this stream "
                         "(call aclrtSubscribeReport first)");
    callback_task_t *task = calloc(1, sizeof *task);
    report_t *report = calloc(1, sizeof *report);
    if (task == NULL || report == NULL) {
        free(task);
        free(report);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of host memory");
    }
    report->fn = fn;
    report->user_data = userData;
    report->blocking = blockType == ACL_CALLBACK_BLOCK;
    task->base.run = run_callback;
    task->base.release = free_callback_task;
    task->base.replay = replay_callback;
    task->base.name = "callback";
    task->thread = thread;
    task->report = report;
    *out = &task->base;
    return ACL_SUCCESS;
}

static aclError launch_callback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                               sim_stream_t *stream)
{
    sim_task_t *task = NULL;
    aclError err = new_callback(fn, userData, blockType, stream, &task);
    if (err == ACL_SUCCESS)
        sim_stream_enqueue(stream, task);
    return err;
}

SIM_EXPORT aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                                        aclrtStream handle)
{
    if (fn == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: fn is NULL");
    if (blockType != ACL_CALLBACK_NO_BLOCK && blockType != ACL_CALLBACK_BLOCK)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: unknown block type %d", (int)blockType);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    err = launch_callback(fn, userData, blockType, stream);
    sim_stream_unref(stream);
    return err;
}

SIM_EXPORT aclError aclrtProcessReport(int32_t timeout)
{
    if (timeout < -1)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclrtProcessReport: timeout %d must be -1 or >= 0 milliseconds",
                         (int)timeout);
    uint64_t self = (uint64_t)pthread_self();
    pthread_mutex_lock(&g_report_lock);
    report_queue_t *queue = find_queue(self);
    if (queue == NULL || queue->subscriptions == 0) {
        pthread_mutex_unlock(&g_report_lock);
        return sim_error(ACL_ERROR_RT_THREAD_SUBSCRIBE, "aclrtProcessReport: this thread is not subscribed to any "
                         "stream (aclrtSubscribeReport)");
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout > 0) {
        until.tv_sec += timeout / 1000;
        until.tv_nsec += (long)(timeout % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    while (queue->head == NULL) {
        if (timeout == 0) {
            pthread_mutex_unlock(&g_report_lock);
            return sim_error(ACL_ERROR_RT_REPORT_TIMEOUT, "aclrtProcessReport: no callback pending");
        }
        int rc = timeout < 0 ? pthread_cond_wait(&queue->cond, &g_report_lock)
                             : pthread_cond_timedwait(&queue->cond, &g_report_lock, &until);
        if (rc == ETIMEDOUT && queue->head == NULL) {
            pthread_mutex_unlock(&g_report_lock);
            return sim_error(ACL_ERROR_RT_REPORT_TIMEOUT, "aclrtProcessReport: no callback within %d ms", (int)timeout);
        }
    }
    report_t *report = queue->head;
    queue->head = report->next;
    if (queue->head == NULL)
        queue->tail = NULL;
    pthread_mutex_unlock(&g_report_lock);
    report->fn(report->user_data);
    if (report->blocking)
        atomic_store(&report->done, true);
    else
        free(report);
    return ACL_SUCCESS;
}

/* ------------------------------------------------------------------- fork */

void sim_stream_after_fork(void)
{
    pthread_mutex_init(&g_report_lock, NULL);
    g_report_queues = NULL;
}
