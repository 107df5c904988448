/*
 * Stream capture into model run instances ("aclgraph"): aclmdlRICaptureBegin / GetInfo / End,
 * aclmdlRICaptureThreadExchangeMode, aclmdlRIExecuteAsync, aclmdlRIDestroy, and task groups
 * (aclmdlRICaptureTaskGrpBegin / End, aclmdlRICaptureTaskUpdateBegin / End).
 *
 * A capturing stream hands every task it is given to its model instead of queueing it
 * (sim_stream_enqueue returns 0): the model keeps the tasks, unrun, in the order they came.  A
 * stream that waits for an event recorded in the capture joins it: its later work is recorded
 * too, and it must rejoin (the origin waits for an event recorded on it after its last task)
 * before the capture ends.  The recorded tasks of all the streams are kept in one sequence, the
 * order they were queued in, which respects every event dependency of the capture.  An execution
 * (aclmdlRIExecuteAsync) makes a fresh copy of each (task->replay: event records counted, HCCL
 * operations numbered, as their calls would be then) and queues them, in that order, as one task
 * of the execution stream, a model run, as a device takes a model launch as one submission: the
 * run runs each copy as the stream would run it as a task of its own (sim_stream_run_task), and
 * stops after one where the thread would stop between two tasks (sim_stream_pause_wanted), so an
 * event recorded in the model completes, for whoever waits for it, when the run reaches it.
 *
 * Unsafe calls (synchronous copies and sets, asynchronous copies of pageable host memory) are
 * refused while a capture forbids them to the calling thread, as the capture's mode and the
 * thread's own mode decide; synchronising or querying a capturing stream, or waiting for an
 * event recorded in a capture under way, is refused too.  A refused call invalidates the
 * capture(s) concerned: aclmdlRICaptureEnd then reports ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/runtime.h"

enum { MODEL_CAPTURING, MODEL_INVALIDATED, MODEL_READY };

typedef struct {
    sim_stream_t *stream; /* referenced */
    uint64_t last;        /* the capture position of its last task (0: none yet) */
    bool rejoined;        /* the origin waited for it after its last task */
} member_t;

struct sim_model {
    void *handle;
    pthread_mutex_t lock;
    _Atomic int refs;
    int status;
    aclmdlRICaptureMode mode;
    pthread_t thread;           /* that began the capture */
    sim_stream_t *origin;
    member_t *members;          /* the streams in the capture, the origin first */
    size_t member_count, member_capacity;
    sim_task_t *head, *tail;    /* the captured tasks, in order */
    uint64_t count;
    char why[256];              /* what invalidated it */
    sim_model_t *next_active;   /* in g_active while capturing */
};

struct sim_task_group {
    void *handle;
    sim_model_t *model;         /* referenced */
    uint64_t first, count;      /* the group's tasks: capture positions first .. first + count - 1 */
};

/* Captures under way, for the unsafe-call rules (any thread may ask). */
static pthread_mutex_t g_active_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_model_t *g_active;
static _Atomic int g_active_count;

/* The calling thread's own capture mode (aclmdlRICaptureThreadExchangeMode). */
static __thread aclmdlRICaptureMode t_mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;

static void *ref_model(void *object)
{
    atomic_fetch_add(&((sim_model_t *)object)->refs, 1);
    return object;
}

void sim_model_ref(sim_model_t *model)
{
    ref_model(model);
}

/* Appends `task` to the list head .. tail (the model's tasks, an update's, an execution's copies). */
static void append_task(sim_task_t **head, sim_task_t **tail, sim_task_t *task)
{
    task->next = NULL;
    if (*tail == NULL)
        *head = task;
    else
        (*tail)->next = task;
    *tail = task;
}

static void free_tasks(sim_task_t *task)
{
    while (task != NULL) {
        sim_task_t *next = task->next;
        if (task->release != NULL)
            task->release(task);
        task = next;
    }
}

static void model_unref(sim_model_t *model)
{
    if (atomic_fetch_sub(&model->refs, 1) != 1)
        return;
    free_tasks(model->head);
    for (size_t i = 0; i < model->member_count; i++)
        sim_stream_unref(model->members[i].stream);
    free(model->members);
    pthread_mutex_destroy(&model->lock);
    free(model);
}

void sim_model_unref(sim_model_t *model)
{
    model_unref(model);
}

static sim_model_t *lookup_model(aclmdlRI handle, const char *api, int *err)
{
    sim_model_t *model = sim_handle_acquire(handle, SIM_KIND_MODEL, ref_model);
    if (model == NULL)
        *err = sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is not a live model run instance (never made, or "
                         "destroyed)", api, handle);
    return model;
}

/* ---------------------------------------------------------------- invalidation */

/* Spoil a capture (under its lock): the calls that follow record nothing, its end reports it. */
static void invalidate_locked(sim_model_t *model, const char *why)
{
    if (model->status != MODEL_CAPTURING)
        return;
    model->status = MODEL_INVALIDATED;
    snprintf(model->why, sizeof model->why, "%s", why);
}

int sim_capture_unsafe(const char *api)
{
    if (atomic_load(&g_active_count) == 0 || t_mode == ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
        return ACL_SUCCESS;
    pthread_t self = pthread_self();
    int refused = 0;
    pthread_mutex_lock(&g_active_lock);
    for (sim_model_t *model = g_active; model != NULL; model = model->next_active) {
        bool own = pthread_equal(model->thread, self);
        bool forbids = (model->mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL && (own || t_mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL)) ||
                       (model->mode == ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL && own);
        if (!forbids)
            continue;
        pthread_mutex_lock(&model->lock);
        char why[200];
        snprintf(why, sizeof why, "%s was called during the capture", api);
        invalidate_locked(model, why);
        pthread_mutex_unlock(&model->lock);
        refused++;
    }
    pthread_mutex_unlock(&g_active_lock);
    if (refused == 0)
        return ACL_SUCCESS;
    return sim_error(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, "%s is not allowed while a stream captures (capture "
                     "mode and this thread's mode: see aclmdlRICaptureThreadExchangeMode); the capture is "
                     "invalidated", api);
}

int sim_capture_refuse_on(sim_stream_t *stream, const char *api)
{
    sim_model_t *model = sim_stream_capture(stream);
    if (model == NULL)
        return ACL_SUCCESS;
    pthread_mutex_lock(&model->lock);
    char why[200];
    snprintf(why, sizeof why, "%s was called on a capturing stream", api);
    invalidate_locked(model, why);
    pthread_mutex_unlock(&model->lock);
    return sim_error(ACL_ERROR_RT_STREAM_CAPTURED, "%s: the stream is capturing (its work is recorded, not run); "
                     "the capture is invalidated", api);
}

int sim_capture_refuse_event(sim_model_t *model, const char *api)
{
    if (model == NULL)
        return ACL_SUCCESS;
    pthread_mutex_lock(&model->lock);
    bool active = model->status != MODEL_READY;
    char why[200];
    snprintf(why, sizeof why, "%s waited for an event recorded in the capture", api);
    invalidate_locked(model, why);
    pthread_mutex_unlock(&model->lock);
    return active ? sim_error(ACL_ERROR_RT_EVENT_CAPTURED, "%s: the event was recorded in a capture under way "
                              "(it never runs until the model is executed); the capture is invalidated", api)
                  : ACL_SUCCESS;
}

bool sim_capture_active(sim_model_t *model)
{
    pthread_mutex_lock(&model->lock);
    bool active = model->status != MODEL_READY;
    pthread_mutex_unlock(&model->lock);
    return active;
}

/* ---------------------------------------------------------------- recording */

static member_t *member_of(sim_model_t *model, sim_stream_t *stream)
{
    for (size_t i = 0; i < model->member_count; i++)
        if (model->members[i].stream == stream)
            return &model->members[i];
    return NULL;
}

static member_t *add_member(sim_model_t *model, sim_stream_t *stream)
{
    if (model->member_count == model->member_capacity) {
        size_t capacity = model->member_capacity ? model->member_capacity * 2 : 4;
        member_t *grown = realloc(model->members, capacity * sizeof *grown);
        if (grown == NULL)
            return NULL;
        model->members = grown;
        model->member_capacity = capacity;
    }
    member_t *member = &model->members[model->member_count++];
    sim_stream_ref(stream);
    *member = (member_t){stream, 0, false};
    return member;
}

bool sim_capture_take(sim_model_t *model, sim_stream_t *stream, sim_task_t *task)
{
    pthread_mutex_lock(&model->lock);
    if (model->status == MODEL_READY) { /* ended meanwhile: the stream runs it */
        pthread_mutex_unlock(&model->lock);
        return false;
    }
    append_task(&model->head, &model->tail, task);
    model->count++;
    member_t *member = member_of(model, stream);
    if (member != NULL) {
        member->last = model->count;
        member->rejoined = false;
    }
    if (task->replay == NULL) {
        char why[200];
        snprintf(why, sizeof why, "a %s cannot be captured", task->name != NULL ? task->name : "task");
        invalidate_locked(model, why);
    }
    pthread_mutex_unlock(&model->lock);
    return true;
}

uint64_t sim_capture_position(sim_model_t *model, sim_stream_t *stream)
{
    pthread_mutex_lock(&model->lock);
    member_t *member = member_of(model, stream);
    uint64_t last = member != NULL ? member->last : 0;
    pthread_mutex_unlock(&model->lock);
    return last;
}

void sim_capture_waits(sim_model_t *model, sim_stream_t *waiter, sim_stream_t *recorder, uint64_t position)
{
    pthread_mutex_lock(&model->lock);
    if (model->status != MODEL_READY) {
        if (sim_stream_capture(waiter) == NULL && member_of(model, waiter) == NULL) {
            /* A stream that waits for work of the capture joins it: its work from here on is recorded. */
            if (add_member(model, waiter) != NULL)
                sim_stream_set_capture(waiter, model);
            else
                invalidate_locked(model, "out of host memory recording a joining stream");
        }
        member_t *source = member_of(model, recorder);
        if (source != NULL && waiter == model->origin && source->last <= position)
            source->rejoined = true;
    }
    pthread_mutex_unlock(&model->lock);
}

/* ---------------------------------------------------------------- capture calls */

static void activate(sim_model_t *model)
{
    pthread_mutex_lock(&g_active_lock);
    model->next_active = g_active;
    g_active = model;
    atomic_fetch_add(&g_active_count, 1);
    pthread_mutex_unlock(&g_active_lock);
}

static void deactivate(sim_model_t *model)
{
    pthread_mutex_lock(&g_active_lock);
    for (sim_model_t **link = &g_active; *link != NULL; link = &(*link)->next_active) {
        if (*link == model) {
            *link = model->next_active;
            atomic_fetch_sub(&g_active_count, 1);
            break;
        }
    }
    pthread_mutex_unlock(&g_active_lock);
}

SIM_EXPORT aclError aclmdlRICaptureBegin(aclrtStream handle, aclmdlRICaptureMode mode)
{
    static const char *api = "aclmdlRICaptureBegin";
    if ((unsigned)mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: mode %d is not an aclmdlRICaptureMode (0 global, 1 thread "
                         "local, 2 relaxed)", api, (int)mode);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if (sim_stream_is_default(stream)) {
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: a default stream cannot capture (every thread's work would "
                         "depend on it): capture on a stream of aclrtCreateStream", api);
    }
    if (sim_stream_capture(stream) != NULL) {
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_STREAM_CAPTURED, "%s: the stream is capturing already", api);
    }
    sim_model_t *model = calloc(1, sizeof *model);
    if (model == NULL || add_member(model, stream) == NULL) {
        free(model);
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    pthread_mutex_init(&model->lock, NULL);
    model->refs = 1;
    model->status = MODEL_CAPTURING;
    model->mode = mode;
    model->thread = pthread_self();
    model->origin = stream;
    model->handle = sim_handle_new(SIM_KIND_MODEL, model);
    if (model->handle == NULL) {
        model_unref(model);
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_NO_MODEL_RESOURCE, "%s: too many live handles", api);
    }
    activate(model);
    sim_stream_set_capture(stream, model);
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclmdlRICaptureGetInfo(aclrtStream handle, aclmdlRICaptureStatus *status, aclmdlRI *modelRI)
{
    if (status == NULL || modelRI == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureGetInfo: %s is NULL",
                         status == NULL ? "status" : "modelRI");
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    sim_model_t *model = sim_stream_capture(stream);
    *status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
    *modelRI = NULL;
    if (model != NULL) {
        pthread_mutex_lock(&model->lock);
        *status = model->status == MODEL_INVALIDATED ? ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED
                                                     : ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
        *modelRI = model->handle;
        pthread_mutex_unlock(&model->lock);
    }
    sim_stream_unref(stream);
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclmdlRICaptureEnd(aclrtStream handle, aclmdlRI *modelRI)
{
    static const char *api = "aclmdlRICaptureEnd";
    if (modelRI == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: modelRI is NULL", api);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    sim_model_t *model = sim_stream_capture(stream);
    if (model == NULL || model->origin != stream) {
        sim_stream_unref(stream);
        return model == NULL ? sim_error(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "%s: the stream is not capturing", api)
                             : sim_error(ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED, "%s: the stream joined a capture "
                                         "begun on another stream: end it there", api);
    }
    if (model->mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED && !pthread_equal(model->thread, pthread_self())) {
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED, "%s: the capture was begun by another thread (only "
                         "a relaxed capture ends on another thread)", api);
    }
    pthread_mutex_lock(&model->lock);
    const char *unjoined = NULL;
    for (size_t i = 1; i < model->member_count && unjoined == NULL; i++)
        if (model->members[i].last > 0 && !model->members[i].rejoined)
            unjoined = "a stream that joined the capture has work the origin stream did not wait for";
    if (unjoined != NULL && model->status == MODEL_CAPTURING)
        invalidate_locked(model, unjoined);
    int status = model->status;
    char why[sizeof model->why];
    memcpy(why, model->why, sizeof why);
    model->status = status == MODEL_CAPTURING ? MODEL_READY : status;
    for (size_t i = 0; i < model->member_count; i++)
        sim_stream_set_capture(model->members[i].stream, NULL);
    if (status != MODEL_CAPTURING)
        model->status = MODEL_READY; /* no longer capturing; about to go */
    pthread_mutex_unlock(&model->lock);
    deactivate(model);
    sim_stream_unref(stream);
    if (status == MODEL_CAPTURING) {
        *modelRI = model->handle;
        return ACL_SUCCESS;
    }
    *modelRI = NULL;
    if (sim_handle_free(model->handle))
        model_unref(model);
    if (unjoined != NULL && strcmp(why, unjoined) == 0)
        return sim_error(ACL_ERROR_RT_STREAM_UNJOINED, "%s: %s (record an event there and make the origin stream "
                         "wait for it)", api, why);
    return sim_error(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED, "%s: the capture was invalidated: %s", api, why);
}

SIM_EXPORT aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode *mode)
{
    if (mode == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureThreadExchangeMode: mode is NULL");
    if ((unsigned)*mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
        return sim_error(ACL_ERROR_INVALID_PARAM, "aclmdlRICaptureThreadExchangeMode: mode %d is not an "
                         "aclmdlRICaptureMode", (int)*mode);
    aclmdlRICaptureMode previous = t_mode;
    t_mode = *mode;
    *mode = previous;
    return ACL_SUCCESS;
}

/* ---------------------------------------------------------------- execution */

/* One execution of a model: the fresh copies of its tasks, run in order as one task of the stream. */
typedef struct {
    sim_task_t base;
    sim_stream_t *stream;      /* it runs on (it is one of the stream's tasks: not referenced) */
    sim_task_t *head, *tail;   /* the copies not yet run (or cancelled), in order (tail: while made) */
    int error;                 /* the first copy's failure */
} model_run_t;

/* Runs the copies from the first left, each to completion; one that must wait past the deadline
 * (or after which the thread wants to stop) makes the run return SIM_TASK_AGAIN, to resume there. */
static int run_model(sim_task_t *task, int64_t caller_deadline_ns)
{
    model_run_t *run = (model_run_t *)task;
    while (run->head != NULL) {
        sim_task_t *copy = run->head;
        /* As the stream runs a task: cancelled once the stream has failed (by an earlier copy too),
         * its failure the stream's. */
        int rc = sim_stream_run_task(run->stream, copy, caller_deadline_ns);
        if (rc == SIM_TASK_AGAIN)
            return SIM_TASK_AGAIN;
        if (rc != SIM_TASK_DONE && run->error == 0)
            run->error = rc;
        run->head = copy->next;
        if (copy->release != NULL)
            copy->release(copy);
        sim_stream_progress(run->stream);
        if (run->head != NULL && sim_stream_pause_wanted(run->stream))
            return SIM_TASK_AGAIN;
    }
    return run->error == 0 ? SIM_TASK_DONE : run->error;
}

/* The stream failed before the run ended: every copy left is cancelled, as the stream cancels its
 * tasks. */
static void cancel_model(sim_task_t *task, int error, const char *why)
{
    model_run_t *run = (model_run_t *)task;
    for (sim_task_t *copy = run->head; copy != NULL; copy = copy->next)
        if (copy->cancel != NULL)
            copy->cancel(copy, error, why);
}

static void release_model(sim_task_t *task)
{
    model_run_t *run = (model_run_t *)task;
    free_tasks(run->head);
    free(run);
}

SIM_EXPORT aclError aclmdlRIExecuteAsync(aclmdlRI handle, aclrtStream stream_handle)
{
    static const char *api = "aclmdlRIExecuteAsync";
    int err = ACL_SUCCESS;
    sim_model_t *model = lookup_model(handle, api, &err);
    if (model == NULL)
        return err;
    sim_stream_t *stream = sim_stream_acquire(stream_handle, &err);
    if (stream != NULL && sim_capture_active(model))
        err = sim_error(ACL_ERROR_RT_MODEL_CAPTURED, "%s: the model is still being captured", api);
    else if (stream != NULL && sim_stream_capture(stream) != NULL)
        err = sim_error(ACL_ERROR_RT_STREAM_CAPTURED, "%s: the stream is capturing (a model is not recorded into "
                        "another)", api);
    else if (stream != NULL && sim_stream_updating(stream))
        err = sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "%s: the stream is updating a task group (its tasks "
                        "replace the group's): end the update first (aclmdlRICaptureTaskUpdateEnd)", api);
    model_run_t *run = NULL;
    if (stream != NULL && err == ACL_SUCCESS && (run = malloc(sizeof *run)) == NULL)
        err = sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    if (run != NULL) {
        *run = (model_run_t){0};
        run->base.run = run_model;
        run->base.cancel = cancel_model;
        run->base.release = release_model;
        run->base.name = "model run";
        run->stream = stream;
        /* The sequence does not change once the capture ended, but a task update may swap a task:
         * the lock keeps each execution whole. */
        pthread_mutex_lock(&model->lock);
        for (sim_task_t *task = model->head; task != NULL && err == ACL_SUCCESS; task = task->next) {
            sim_task_t *copy = NULL;
            err = task->replay(task, stream, &copy);
            if (err == ACL_SUCCESS)
                append_task(&run->head, &run->tail, copy);
        }
        pthread_mutex_unlock(&model->lock);
        /* The copies made before a failure are counted and numbered already: they run, as the work
         * queued before a call that fails would. */
        if (run->head != NULL)
            sim_stream_enqueue(stream, &run->base);
        else
            free(run);
    }
    if (stream != NULL)
        sim_stream_unref(stream);
    model_unref(model);
    return err;
}

SIM_EXPORT aclError aclmdlRIDestroy(aclmdlRI handle)
{
    int err = ACL_SUCCESS;
    sim_model_t *model = lookup_model(handle, "aclmdlRIDestroy", &err);
    if (model == NULL)
        return err;
    if (sim_capture_active(model)) {
        model_unref(model);
        return sim_error(ACL_ERROR_RT_MODEL_CAPTURED, "aclmdlRIDestroy: the model is still being captured (end the "
                         "capture first)");
    }
    if (sim_handle_free(handle))
        model_unref(model); /* the handle's reference; executions queued already hold copies */
    model_unref(model);
    return ACL_SUCCESS;
}

void sim_capture_stream_destroyed(sim_stream_t *stream)
{
    sim_model_t *model = sim_stream_capture(stream);
    if (model == NULL)
        return;
    pthread_mutex_lock(&model->lock);
    invalidate_locked(model, "a capturing stream was destroyed");
    bool origin = model->origin == stream;
    if (origin) { /* the capture can never end: it ends now, with nothing to show */
        for (size_t i = 0; i < model->member_count; i++)
            sim_stream_set_capture(model->members[i].stream, NULL);
        model->status = MODEL_READY;
    } else {
        sim_stream_set_capture(stream, NULL);
    }
    pthread_mutex_unlock(&model->lock);
    if (origin) {
        deactivate(model);
        if (sim_handle_free(model->handle))
            model_unref(model);
    }
}

/* ---------------------------------------------------------------- task groups */

SIM_EXPORT aclError aclmdlRICaptureTaskGrpBegin(aclrtStream handle)
{
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    sim_model_t *model = sim_stream_capture(stream);
    if (model == NULL)
        err = sim_error(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "aclmdlRICaptureTaskGrpBegin: the stream is not capturing");
    else if (sim_stream_group_start(stream) != 0)
        err = sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "aclmdlRICaptureTaskGrpBegin: a task group is open on "
                        "this stream already");
    else
        sim_stream_set_group_start(stream, sim_capture_count(model) + 1);
    sim_stream_unref(stream);
    return err;
}

uint64_t sim_capture_count(sim_model_t *model)
{
    pthread_mutex_lock(&model->lock);
    uint64_t count = model->count;
    pthread_mutex_unlock(&model->lock);
    return count;
}

static void release_group(struct sim_task_group *group)
{
    model_unref(group->model);
    free(group);
}

SIM_EXPORT aclError aclmdlRICaptureTaskGrpEnd(aclrtStream handle, aclrtTaskGrp *out)
{
    static const char *api = "aclmdlRICaptureTaskGrpEnd";
    if (out == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: handle is NULL", api);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    sim_model_t *model = sim_stream_capture(stream);
    uint64_t first = sim_stream_group_start(stream);
    if (model == NULL || first == 0) {
        sim_stream_unref(stream);
        return model == NULL ? sim_error(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "%s: the stream is not capturing", api)
                             : sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "%s: no task group is open on this "
                                         "stream (aclmdlRICaptureTaskGrpBegin)", api);
    }
    sim_stream_set_group_start(stream, 0);
    struct sim_task_group *group = calloc(1, sizeof *group);
    if (group == NULL) {
        sim_stream_unref(stream);
        return sim_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "%s: out of host memory", api);
    }
    group->model = ref_model(model);
    group->first = first;
    group->count = sim_capture_count(model) + 1 - first;
    group->handle = sim_handle_new(SIM_KIND_TASK_GROUP, group);
    sim_stream_unref(stream);
    if (group->handle == NULL) {
        release_group(group);
        return sim_error(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, "%s: too many live handles", api);
    }
    *out = group->handle;
    return ACL_SUCCESS;
}

SIM_EXPORT aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream handle, aclrtTaskGrp group_handle)
{
    static const char *api = "aclmdlRICaptureTaskUpdateBegin";
    struct sim_task_group *group = sim_handle_get(group_handle, SIM_KIND_TASK_GROUP);
    if (group == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %p is not a task group from aclmdlRICaptureTaskGrpEnd", api,
                         group_handle);
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    if (sim_stream_capture(stream) != NULL)
        err = sim_error(ACL_ERROR_RT_STREAM_CAPTURED, "%s: the stream is capturing: update on a stream that is not",
                        api);
    else if (sim_capture_active(group->model))
        err = sim_error(ACL_ERROR_RT_MODEL_CAPTURED, "%s: the group's model is still being captured", api);
    else if (!sim_stream_set_update(stream, group))
        err = sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "%s: the stream is updating a task group already", api);
    sim_stream_unref(stream);
    return err;
}

/* The tasks an update queued, while the stream updates `group` (sim_stream_enqueue). */
typedef struct update {
    struct update *next;
    sim_stream_t *stream;
    struct sim_task_group *group;
    sim_task_t *head, *tail;
    uint64_t count;
} update_t;

static pthread_mutex_t g_update_lock = PTHREAD_MUTEX_INITIALIZER;
static update_t *g_updates;

static update_t *find_update(sim_stream_t *stream)
{
    for (update_t *u = g_updates; u != NULL; u = u->next)
        if (u->stream == stream)
            return u;
    return NULL;
}

bool sim_update_begin(sim_stream_t *stream, struct sim_task_group *group)
{
    pthread_mutex_lock(&g_update_lock);
    bool started = find_update(stream) == NULL;
    update_t *update = started ? calloc(1, sizeof *update) : NULL;
    if (update != NULL) {
        update->stream = stream;
        update->group = group;
        update->next = g_updates;
        g_updates = update;
    }
    pthread_mutex_unlock(&g_update_lock);
    return update != NULL;
}

bool sim_update_take(sim_stream_t *stream, sim_task_t *task)
{
    pthread_mutex_lock(&g_update_lock);
    update_t *update = find_update(stream);
    if (update != NULL) {
        append_task(&update->head, &update->tail, task);
        update->count++;
    }
    pthread_mutex_unlock(&g_update_lock);
    return update != NULL;
}

SIM_EXPORT aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream handle)
{
    static const char *api = "aclmdlRICaptureTaskUpdateEnd";
    int err = ACL_SUCCESS;
    sim_stream_t *stream = sim_stream_acquire(handle, &err);
    if (stream == NULL)
        return err;
    pthread_mutex_lock(&g_update_lock);
    update_t *update = find_update(stream);
    if (update != NULL)
        for (update_t **link = &g_updates; *link != NULL; link = &(*link)->next)
            if (*link == update) {
                *link = update->next;
                break;
            }
    pthread_mutex_unlock(&g_update_lock);
    sim_stream_set_update(stream, NULL);
    sim_stream_unref(stream);
    if (update == NULL)
        return sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "%s: the stream is not updating a task group "
                         "(aclmdlRICaptureTaskUpdateBegin)", api);
    struct sim_task_group *group = update->group;
    sim_model_t *model = group->model;
    pthread_mutex_lock(&model->lock);
    /* The group's tasks: positions first .. first + count - 1 of the model's sequence. */
    sim_task_t *before = NULL, *old = model->head;
    for (uint64_t position = 1; old != NULL && position < group->first; position++) {
        before = old;
        old = old->next;
    }
    sim_task_t *probe = old, *fresh = update->head;
    uint64_t matched = 0;
    while (probe != NULL && fresh != NULL && matched < group->count && probe->run == fresh->run) {
        probe = probe->next;
        fresh = fresh->next;
        matched++;
    }
    if (update->count != group->count || matched != group->count) {
        pthread_mutex_unlock(&model->lock);
        unsigned long long queued = update->count;
        free_tasks(update->head);
        free(update);
        return sim_error(ACL_ERROR_STREAM_TASK_GROUP_STATUS, "%s: the update queued %llu task(s) where the group "
                         "has %llu, or tasks of other kinds in its places: an update replaces each task of the group "
                         "with one of the same kind", api, queued, (unsigned long long)group->count);
    }
    /* Swap: the update's tasks take the group's places. */
    sim_task_t *after = probe; /* the task after the group */
    sim_task_t *last_old = old;
    for (uint64_t i = 1; i < group->count; i++)
        last_old = last_old->next;
    last_old->next = NULL;
    update->tail->next = after;
    if (before == NULL)
        model->head = update->head;
    else
        before->next = update->head;
    if (after == NULL)
        model->tail = update->tail;
    pthread_mutex_unlock(&model->lock);
    free_tasks(old);
    free(update);
    return ACL_SUCCESS;
}

void sim_capture_after_fork(void)
{
    /* The parent's captures are abandoned with the rest of its runtime (acl/device.c). */
    pthread_mutex_init(&g_active_lock, NULL);
    pthread_mutex_init(&g_update_lock, NULL);
    g_active = NULL;
    atomic_store(&g_active_count, 0);
    g_updates = NULL;
    t_mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
}
