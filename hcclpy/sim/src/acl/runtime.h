/* Structures shared by the files of libascendcl.so (not by libhccl.so). */
#ifndef HCCLPY_SIM_RUNTIME_H
#define HCCLPY_SIM_RUNTIME_H

#include "common/sim.h"

#define SIM_MAX_DEVICES 256

typedef struct sim_arena sim_arena_t;
typedef struct sim_context sim_context_t;
typedef struct sim_event sim_event_t;

struct sim_context {
    void *handle;
    int device;
    bool is_default;
    sim_stream_t *default_stream;
};

/* Per-process state of one logical device. */
typedef struct {
    pthread_mutex_t lock;
    int set_count;              /* aclrtSetDevice minus aclrtResetDevice */
    sim_context_t *default_context;
    sim_arena_t *arena;         /* created on first use, kept for the process */
    pthread_mutex_t streams_lock;
    sim_stream_t **streams;     /* every live stream of the device */
    size_t stream_count, stream_capacity;
} sim_device_t;

sim_device_t *sim_device(int device);
/* The calling thread's current context, or NULL with an error recorded. */
sim_context_t *sim_current_context(void);
/* The default stream of the calling thread's current context, referenced (as
 * sim_stream_acquire), or NULL with ACL_ERROR_RT_CONTEXT_NULL recorded. */
sim_stream_t *sim_current_default_stream(void);
int sim_device_check(int device);

/* memory.c */
sim_arena_t *sim_arena_get(int device, int *err);
void sim_arena_reset(sim_arena_t *arena);
/* Finds which device (if any) of this process owns `ptr`; returns -1 if none. */
int sim_pointer_device(const void *ptr, uint64_t *room);
bool sim_host_pinned(const void *ptr, uint64_t bytes);

/* capture.c: stream capture into model run instances (see there) */
typedef struct sim_model sim_model_t;
struct sim_task_group;
/* The model `stream` records into, or NULL (stream.c). */
sim_model_t *sim_stream_capture(sim_stream_t *stream);
void sim_stream_set_capture(sim_stream_t *stream, sim_model_t *model);
bool sim_stream_is_default(const sim_stream_t *stream);
/* The capture position where the task group open on `stream` starts (0: none). */
uint64_t sim_stream_group_start(sim_stream_t *stream);
void sim_stream_set_group_start(sim_stream_t *stream, uint64_t first);
/* Make `stream` update `group` (NULL: stop); false if it updates one already. */
bool sim_stream_set_update(sim_stream_t *stream, struct sim_task_group *group);
/* Whether `stream` updates a task group: its tasks replace the group's instead of running. */
bool sim_stream_updating(sim_stream_t *stream);
bool sim_capture_take(sim_model_t *model, sim_stream_t *stream, sim_task_t *task);
bool sim_update_begin(sim_stream_t *stream, struct sim_task_group *group);
bool sim_update_take(sim_stream_t *stream, sim_task_t *task);
uint64_t sim_capture_count(sim_model_t *model);
/* The capture position of the last task `stream` gave `model` (0: none). */
uint64_t sim_capture_position(sim_model_t *model, sim_stream_t *stream);
/* `waiter` waits for an event `recorder` recorded in `model`'s capture at `position`: a stream
 * outside the capture joins it, the origin waiting rejoins `recorder`. */
void sim_capture_waits(sim_model_t *model, sim_stream_t *waiter, sim_stream_t *recorder, uint64_t position);
/* Whether `model` is still being captured (or was invalidated and not yet ended). */
bool sim_capture_active(sim_model_t *model);
void sim_model_ref(sim_model_t *model);
void sim_model_unref(sim_model_t *model);
/* ACL_SUCCESS, or refuses an unsafe call (`api`) that a capture under way forbids to this thread,
 * invalidating that capture. */
int sim_capture_unsafe(const char *api);
/* ACL_SUCCESS, or refuses `api` (a synchronisation or query) on a capturing stream. */
int sim_capture_refuse_on(sim_stream_t *stream, const char *api);
/* ACL_SUCCESS, or refuses to wait for an event recorded in `model`'s capture under way. */
int sim_capture_refuse_event(sim_model_t *model, const char *api);
/* `stream` is being destroyed: a capture it takes part in is invalidated (ended, if it began it). */
void sim_capture_stream_destroyed(sim_stream_t *stream);
void sim_capture_after_fork(void);

/* ipc.c */
/* Before the allocation of `size` bytes at `ptr` is freed: refuses while a live process imports
 * memory of it, else closes its keys. */
int sim_ipc_before_free(const void *ptr, uint64_t size);
void sim_ipc_after_fork(void);


/* vmm.c: virtual memory (aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem ...). */
#define SIM_VMM_NONE (-1)     /* not in address space reserved with aclrtReserveMemAddress */
#define SIM_VMM_UNMAPPED (-2) /* reserved, but no physical memory is mapped there */
/* The device whose physical memory is mapped at `ptr` (and the bytes mapped from `ptr` on, across
 * adjacent mappings), or SIM_VMM_NONE / SIM_VMM_UNMAPPED. */
int sim_vmm_mapped(const void *ptr, uint64_t *room);
/* sim_device_range for reserved address space: -1 when `ptr` is in none (not handled here). */
int sim_vmm_device_range(int device, const void *ptr, uint64_t bytes, uint64_t *offset, char *why, size_t why_len);
/* aclrtResetDevice releases `device`'s memory: its physical memory goes too, and what mapped it
 * becomes unmapped reserved space. */
void sim_vmm_device_reset(int device);
void sim_vmm_after_fork(void);

/* stream.c */
int sim_stream_create(int device, uint32_t priority, uint32_t flags, bool is_default, sim_stream_t **out);
int sim_stream_destroy(sim_stream_t *stream, bool force);
int sim_stream_sync_all(int device, int64_t deadline_ns);
/* Destroys every stream the user created on `device` and stops the workers of the contexts'
 * default streams (the streams themselves stay usable): for aclrtResetDevice dropping the
 * device's last reference.  The destroyed streams' handles are refused after. */
void sim_stream_release_device(int device);
void *sim_stream_handle(const sim_stream_t *stream);
void sim_stream_after_fork(void);
/* sim_stream_sync_to that also ends, successfully, once reached(arg) holds: for a wait that a
 * piece of a task satisfies (an event record run by a model run, which stops there for it). */
int sim_stream_sync_until(sim_stream_t *stream, uint64_t target, int64_t deadline_ns, bool (*reached)(void *arg),
                          void *arg);
/* Runs `task` as the stream runs each of its tasks: cancelled (task->cancel) when the stream has
 * failed and runs nothing more, else run, a failure becoming the stream's.  Returns SIM_TASK_AGAIN
 * (run it again later), SIM_TASK_DONE (run or cancelled) or the task's error.  A model run
 * (capture.c) runs each of its copies this way. */
int sim_stream_run_task(sim_stream_t *stream, sim_task_t *task, int64_t deadline_ns);
/* For a task of `stream` that runs several pieces of work in turn (a model run): whether the
 * thread running it wants it to stop after the piece just run, and to return SIM_TASK_AGAIN,
 * where it would stop between two tasks: the stream's worker asked to hand the stream over to a
 * synchronising thread, or a synchronisation whose end a piece reached (sim_stream_sync_until). */
bool sim_stream_pause_wanted(sim_stream_t *stream);
/* A piece of a task has run: threads waiting on the stream look again (sim_stream_sync_until). */
void sim_stream_progress(sim_stream_t *stream);

/* event.c */
/* Destroys every event created on `device`, as sim_stream_release_device does its streams. */
void sim_event_release_device(int device);
void sim_event_after_fork(void);

/* device.c */
void sim_runtime_after_fork(void);

#endif
