/*
 * Internal interface between the simulator's two libraries.
 *
 * libascendcl.so owns the process-wide runtime state (devices, device memory
 * arenas, streams, events, the handle table, thread-local error text) and
 * exports the functions below with the `sim_` prefix; libhccl.so links against
 * it and builds communicators and collectives on top.  Nothing here is part of
 * the public CANN ABI.
 */
#ifndef HCCLPY_SIM_H
#define HCCLPY_SIM_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/types.h>

#define SIM_EXPORT __attribute__((visibility("default")))
/* The link name of each function below: the `sim_` names are the simulator's own, and a program
 * that defines a function of one of those names (a `sim_now_ns` of its own, say) would otherwise
 * take the place of the simulator's in both libraries. Names beginning with two underscores are
 * reserved to the implementation, so no conforming program defines them. */
#define SIM_LINK_NAME(name) __asm__("__hcclpy_" #name)
#define SIM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define SIM_CACHELINE 64
#define SIM_ALIGNED __attribute__((aligned(SIM_CACHELINE)))

/* ------------------------------------------------------------------ time */

SIM_EXPORT int64_t sim_now_ns(void) SIM_LINK_NAME(sim_now_ns);
#define SIM_NS_PER_MS 1000000LL
#define SIM_NS_PER_S 1000000000LL
#define SIM_NO_DEADLINE INT64_MAX

/* ---------------------------------------------------------------- errors */

/* Records `code` and a message as this thread's most recent error (read back by
 * aclGetRecentErrMsg / aclrtGetLastError) and returns `code`. */
SIM_EXPORT int sim_error(int code, const char *fmt, ...) SIM_LINK_NAME(sim_error) SIM_PRINTF(2, 3);
SIM_EXPORT int sim_verror(int code, const char *fmt, va_list ap) SIM_LINK_NAME(sim_verror);
/* The text of the most recent error, or "" (not cleared). */
SIM_EXPORT const char *sim_error_text(void) SIM_LINK_NAME(sim_error_text);

/* ------------------------------------------------------------ environment */

typedef struct {
    int device_count;               /* visible devices (0 while `error` is set) */
    int physical_count;             /* HCCLPY_SIM_DEVICES */
    int visible[256];               /* logical id -> physical id */
    uint64_t device_memory;         /* bytes per device */
    char node[64];                  /* the simulated server's name (sim_server), at the first call */
    /* Why a HCCLPY_SIM_* setting is unusable ("" when all are fine): the
     * variable, its value and what it takes. */
    char error[512];
    /* The ASCEND_RT_VISIBLE_DEVICES entry the list stopped at, and why ("" when
     * every entry is a device): the entries from there on are ignored. */
    char visible_note[256];
} sim_config_t;

SIM_EXPORT const sim_config_t *sim_config(void) SIM_LINK_NAME(sim_config);
/* The simulated server this process's ranks are on, read from the environment when called:
 * HCCLPY_SIM_SERVER (or HCCLPY_SIM_NODE, its older name); else, when a launcher started the job on
 * several nodes, "node<K>" for its node K (torchrun / hcclpy run, Slurm) or the host name (Open MPI,
 * MPICH); else the host name.  Returns which case it is; `name` may be NULL. */
enum { SIM_SERVER_ALONE = 0, SIM_SERVER_LAUNCHER, SIM_SERVER_SET };
SIM_EXPORT int sim_server(char *name, size_t len) SIM_LINK_NAME(sim_server);
/* ACL_SUCCESS, or when a setting of the simulator is unusable, that error
 * (ACL_ERROR_INVALID_PARAM) recorded with sim_error as "<api>: <why>" (just
 * "<why>" for a NULL api).  Every call that needs the devices checks it. */
SIM_EXPORT int sim_config_check(const char *api) SIM_LINK_NAME(sim_config_check);
/* A duration in seconds >= 0 from the environment (fractions allowed; at most
 * SIM_LONGEST_WAIT_S); `fallback` when unset, unparsable, negative or not finite. */
#define SIM_LONGEST_WAIT_S 1e9
SIM_EXPORT double sim_env_seconds(const char *name, double fallback) SIM_LINK_NAME(sim_env_seconds);
/* Parses "123", "64K", "8G" ...; returns false on junk. */
SIM_EXPORT bool sim_parse_size(const char *text, uint64_t *out) SIM_LINK_NAME(sim_parse_size);

/* ---------------------------------------------------------------- handles */

/* Every handle given to a caller (stream, event, context, communicator) is an
 * index into one table plus a generation, never a raw pointer: a stale or
 * random handle is detected without dereferencing anything. */
enum sim_kind { SIM_KIND_STREAM = 1, SIM_KIND_EVENT, SIM_KIND_CONTEXT, SIM_KIND_COMM, SIM_KIND_MODEL, SIM_KIND_TASK_GROUP };

SIM_EXPORT void *sim_handle_new(enum sim_kind kind, void *object) SIM_LINK_NAME(sim_handle_new);
/* The object of a live handle, without a reference: only for objects nobody
 * else can free meanwhile (or for comparing with a pointer already held). */
SIM_EXPORT void *sim_handle_get(const void *handle, enum sim_kind kind) SIM_LINK_NAME(sim_handle_get);
/* Calls ref(object) on the object of a live handle before anyone can free it
 * (see sim_handle_free) and returns what ref returns (the object, or what ref
 * took its reference on); NULL, with ref not called, when the handle is not
 * live.  Every entry point that uses an object a user may destroy from another
 * thread meanwhile gets it this way and drops the reference when done. */
SIM_EXPORT void *sim_handle_acquire(const void *handle, enum sim_kind kind, void *(*ref)(void *object))
    SIM_LINK_NAME(sim_handle_acquire);
/* Frees a live handle; false if it was not live (never made, or freed already): of two
 * threads freeing one handle, exactly one gets true and owns the object's teardown. */
SIM_EXPORT bool sim_handle_free(const void *handle) SIM_LINK_NAME(sim_handle_free);

/* ---------------------------------------------------------------- waiting */

/* Linux futex on a 32-bit word; `shared` selects cross-process futexes. */
SIM_EXPORT int sim_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns, bool shared)
    SIM_LINK_NAME(sim_futex_wait);
SIM_EXPORT void sim_futex_wake(_Atomic uint32_t *word, bool shared) SIM_LINK_NAME(sim_futex_wake);

/* Escalating wait: spin, then yield, then sleep.  `sim_backoff_step` returns
 * true when the caller should now sleep on its futex instead of spinning. */
typedef struct {
    uint32_t rounds;
    int64_t started_ns;
    bool no_spin; /* skip straight to yielding (more runnable ranks than cores) */
} sim_backoff_t;

SIM_EXPORT void sim_backoff_init(sim_backoff_t *b) SIM_LINK_NAME(sim_backoff_init);
SIM_EXPORT bool sim_backoff_step(sim_backoff_t *b) SIM_LINK_NAME(sim_backoff_step);

/* Wakes the workers of this process's streams that hold work nobody runs; a
 * thread calls it before it goes to sleep waiting for another rank, because
 * that rank's work may be sitting on a stream of this process. */
SIM_EXPORT void sim_kick_idle_streams(void) SIM_LINK_NAME(sim_kick_idle_streams);

/* ----------------------------------------------------------------- memory */

/* Where a device arena lives, in a form another process can open. */
typedef struct {
    int32_t pid;
    int32_t fd;
    uint64_t uid;
    uint64_t size;
} sim_arena_loc_t;

/* Makes sure `device` (logical id) has its arena and returns its location. */
SIM_EXPORT int sim_device_arena(int device, sim_arena_loc_t *loc, char **base) SIM_LINK_NAME(sim_device_arena);
/* Maps another process's arena (cached per process); NULL on failure with
 * the reason recorded by sim_error. */
SIM_EXPORT char *sim_arena_map(const sim_arena_loc_t *loc) SIM_LINK_NAME(sim_arena_map);
/* Drops one reference taken by sim_arena_map. */
SIM_EXPORT void sim_arena_unmap(const sim_arena_loc_t *loc) SIM_LINK_NAME(sim_arena_unmap);

/* Checks that [ptr, ptr + bytes) lies inside one live allocation of `device`'s
 * arena.  Returns 0 and the offset in the arena, or 1 when the pointer is not
 * inside any live allocation of that device, or 2 when it is but the range
 * runs past the end of the allocation; `why` then describes the problem. */
SIM_EXPORT int sim_device_range(int device, const void *ptr, uint64_t bytes, uint64_t *offset,
                                char *why, size_t why_len) SIM_LINK_NAME(sim_device_range);

/* A block of `bytes` in `device`'s arena (its offset there, and where the arena is), as
 * aclrtMalloc makes one, for memory the libraries use themselves (virtual memory's physical
 * allocations, libhccl's staging between servers); and freeing it. */
SIM_EXPORT int sim_arena_alloc_block(int device, uint64_t bytes, const char *api, uint64_t *offset,
                                     sim_arena_loc_t *loc) SIM_LINK_NAME(sim_arena_alloc_block);
SIM_EXPORT void sim_arena_free_block(int device, uint64_t offset) SIM_LINK_NAME(sim_arena_free_block);

/* The device of memory imported from another process (aclrtIpcMemImportByKey) that holds `ptr`,
 * and the bytes left in it from there (`room`, may be NULL); -1 when `ptr` is not such memory. */
SIM_EXPORT int sim_ipc_imported(const void *ptr, uint64_t *room) SIM_LINK_NAME(sim_ipc_imported);

SIM_EXPORT int sim_device_physical(int device) SIM_LINK_NAME(sim_device_physical);
SIM_EXPORT int sim_current_device(int *device) SIM_LINK_NAME(sim_current_device);

/* ----------------------------------------------------------------- copies */

/* memmove, or with `streaming` a copy that stores around the caches (for data
 * nobody reads soon); sim_store_fence() orders such stores before publishing. */
SIM_EXPORT void sim_copy(void *dst, const void *src, uint64_t bytes, bool streaming) SIM_LINK_NAME(sim_copy);
SIM_EXPORT void sim_store_fence(void) SIM_LINK_NAME(sim_store_fence);

#if defined(__x86_64__)
#include <emmintrin.h>

/* Copies `lines` whole 64-byte lines to a 16-byte aligned `dst` with stores
 * that bypass the caches.  Inline, because the reduction kernels call it for
 * every small block they produce. */
static inline void sim_stream_lines(void *dst, const void *src, size_t lines)
{
    char *d = dst;
    const char *s = src;
    for (; lines > 0; lines--, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
}
#endif

/* Copies at least this large whose destination is host memory stream around
 * the caches: like a device-to-host DMA, they land in memory, not in cache. */
#define SIM_STREAMING_COPY_BYTES (256u << 10)

/* ---------------------------------------------------------------- streams */

typedef struct sim_task sim_task_t;
typedef struct sim_stream sim_stream_t;

/* A task returns SIM_TASK_DONE, SIM_TASK_AGAIN (it must wait and the caller's
 * deadline has passed, or, for a model run, the thread running it has what it ran
 * it for: its state is kept and it is resumed later, possibly by another thread),
 * or an aclError code (the stream becomes failed). */
#define SIM_TASK_DONE 0
#define SIM_TASK_AGAIN (-1)

struct sim_task {
    sim_task_t *next;
    int (*run)(sim_task_t *task, int64_t caller_deadline_ns);
    void (*release)(sim_task_t *task);
    /* Called instead of run() when the stream has already failed with `error` (`why` says how). */
    void (*cancel)(sim_task_t *task, int error, const char *why);
    /* Stream capture (acl/capture.c) keeps a captured task as it was queued, never run; at each
     * execution of the model this makes a fresh copy of it (*copy), doing what the call that
     * queued it did then for `stream`, the stream the model runs on (event bookkeeping, HCCL
     * sequence numbers), but queueing nothing: the execution runs the copies in order, as one
     * task of the stream.  Returns 0 or an error code (recorded; *copy is not set). */
    int (*replay)(const sim_task_t *task, sim_stream_t *stream, sim_task_t **copy);
    const char *name;
    int64_t enqueued_ns; /* set by sim_stream_enqueue */
};


/* Resolves a stream handle (NULL means the current context's default stream)
 * and takes a reference, dropped with sim_stream_unref: the stream's memory
 * then outlives an aclrtDestroyStream from another thread.  NULL with *err set
 * (and the error recorded) when the handle is not a live stream. */
SIM_EXPORT sim_stream_t *sim_stream_acquire(const void *handle, int *err) SIM_LINK_NAME(sim_stream_acquire);
SIM_EXPORT int sim_stream_device(const sim_stream_t *stream) SIM_LINK_NAME(sim_stream_device);
/* Queues a task; the stream takes ownership (it calls task->release).
 * Returns the task's place in the stream (1-based, as `target` below), or 0 when the stream
 * captures (or updates a captured task group): the capture keeps the task, unrun, and the
 * caller undoes what queueing it counted (sim_stream_start ignores place 0). */
SIM_EXPORT uint64_t sim_stream_enqueue(sim_stream_t *stream, sim_task_t *task) SIM_LINK_NAME(sim_stream_enqueue);
/* Runs the task at `place` in the calling thread if it is next and no one
 * else runs the stream, until it would wait (with no deadline to wait for);
 * what is left runs as before, when the stream is synchronised or by the
 * worker.  For short tasks whose first steps let peers go on earlier. */
SIM_EXPORT void sim_stream_start(sim_stream_t *stream, uint64_t place) SIM_LINK_NAME(sim_stream_start);
/* Number of tasks ever enqueued / finished on the stream. */
SIM_EXPORT uint64_t sim_stream_enqueued(const sim_stream_t *stream) SIM_LINK_NAME(sim_stream_enqueued);
/* Runs or waits for the stream's tasks up to index `target` (1-based count).
 * Returns 0, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT at the deadline, or the
 * stream's sticky error. */
SIM_EXPORT int sim_stream_sync_to(sim_stream_t *stream, uint64_t target, int64_t deadline_ns)
    SIM_LINK_NAME(sim_stream_sync_to);
/* Fails the stream from inside a running task: the message is kept with the
 * stream so the thread that synchronises sees it. */
SIM_EXPORT void sim_stream_fail_message(sim_stream_t *stream, const char *message)
    SIM_LINK_NAME(sim_stream_fail_message);
SIM_EXPORT void sim_stream_ref(sim_stream_t *stream) SIM_LINK_NAME(sim_stream_ref);
SIM_EXPORT void sim_stream_unref(sim_stream_t *stream) SIM_LINK_NAME(sim_stream_unref);

/* ------------------------------------------------------------------ misc */

/* Process start time (clock ticks since boot) of `pid`, 0 if it is gone. */
SIM_EXPORT uint64_t sim_process_start_time(pid_t pid) SIM_LINK_NAME(sim_process_start_time);
/* True when `pid` with that start time is still running. */
SIM_EXPORT bool sim_process_alive(pid_t pid, uint64_t start_time) SIM_LINK_NAME(sim_process_alive);

/* A 64-bit value that differs between processes and calls. */
SIM_EXPORT uint64_t sim_random64(void) SIM_LINK_NAME(sim_random64);

/* Increments each time the process forks (the child starts fresh). */
SIM_EXPORT uint64_t sim_fork_generation(void) SIM_LINK_NAME(sim_fork_generation);

#define SIM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SIM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
