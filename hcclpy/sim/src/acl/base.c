/* Process-wide basics of the simulated runtime: clock, per-thread error text,
 * environment, the handle table, futex waiting and process liveness. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl/runtime.h"

int64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * SIM_NS_PER_S + ts.tv_nsec;
}

/* ---------------------------------------------------------------- errors */

static __thread char t_error_text[1024];
static __thread int t_error_code;
static __thread bool t_error_unread;

int sim_verror(int code, const char *fmt, va_list ap)
{
    vsnprintf(t_error_text, sizeof t_error_text, fmt, ap);
    t_error_code = code;
    t_error_unread = true;
    return code;
}

int sim_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sim_verror(code, fmt, ap);
    va_end(ap);
    return code;
}

const char *sim_error_text(void)
{
    return t_error_text;
}

/* The text stays readable until the next call on this thread; reading it marks
 * it as consumed, so a later failure is never reported with a stale message. */
SIM_EXPORT const char *aclGetRecentErrMsg(void)
{
    if (!t_error_unread)
        return NULL;
    t_error_unread = false;
    return t_error_text;
}

SIM_EXPORT aclError aclrtPeekAtLastError(aclrtLastErrLevel level)
{
    if (level != ACL_RT_THREAD_LEVEL)
        return ACL_ERROR_INVALID_PARAM;
    return t_error_code;
}

SIM_EXPORT aclError aclrtGetLastError(aclrtLastErrLevel level)
{
    if (level != ACL_RT_THREAD_LEVEL)
        return ACL_ERROR_INVALID_PARAM;
    int code = t_error_code;
    t_error_code = ACL_SUCCESS;
    return code;
}

/* ------------------------------------------------------------ environment */

bool sim_parse_size(const char *text, uint64_t *out)
{
    if (text == NULL || *text == '\0')
        return false;
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    /* !(value >= 0) also refuses "nan", whose conversion below would be undefined. */
    if (errno != 0 || end == text || !(value >= 0))
        return false;
    while (isspace((unsigned char)*end))
        end++;
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; end++; break;
    case 'M': scale = 1024.0 * 1024; end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'I')
        end++;
    if (toupper((unsigned char)*end) == 'B')
        end++;
    if (*end != '\0')
        return false;
    /* 2^64 and more (and "inf") do not fit: converting them is undefined. */
    if (value * scale >= 18446744073709551616.0)
        return false;
    *out = (uint64_t)(value * scale);
    return true;
}

double sim_env_seconds(const char *name, double fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= 0) || isinf(value)) /* nan fails value >= 0 */
        return fallback;
    /* Longer waits are forever in practice, and their nanoseconds would overflow a deadline. */
    return value < SIM_LONGEST_WAIT_S ? value : SIM_LONGEST_WAIT_S;
}

static sim_config_t g_config;
static pthread_once_t g_config_once = PTHREAD_ONCE_INIT;

#define DEFAULT_DEVICES 8
#define DEFAULT_DEVICE_MEMORY (8ULL << 30)
#define MIN_DEVICE_MEMORY (1ULL << 20)

/* Appends one more problem to the configuration error, "; " between two. */
static void config_problem(sim_config_t *c, const char *fmt, ...) SIM_PRINTF(2, 3);
static void config_problem(sim_config_t *c, const char *fmt, ...)
{
    size_t used = strlen(c->error);
    if (used > 0 && used + 2 < sizeof c->error) {
        strcpy(c->error + used, "; ");
        used += 2;
    }
    if (used + 1 >= sizeof c->error)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error + used, sizeof c->error - used, fmt, ap);
    va_end(ap);
}

/* HCCLPY_SIM_DEVICES: a whole number in 1..SIM_MAX_DEVICES, blanks around it
 * allowed.  Anything else is an error rather than the default: a typo would
 * otherwise run a job on a different number of devices than asked for. */
static void load_device_count(sim_config_t *c)
{
    c->physical_count = DEFAULT_DEVICES;
    const char *text = getenv("HCCLPY_SIM_DEVICES");
    if (text == NULL || *text == '\0')
        return;
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (end == text || *end != '\0' || errno != 0 || n < 1 || n > SIM_MAX_DEVICES) {
        config_problem(c, "HCCLPY_SIM_DEVICES='%.64s' is not a number of devices: it takes a whole number from "
                       "1 to %d (unset or empty: %d)", text, SIM_MAX_DEVICES, DEFAULT_DEVICES);
        return;
    }
    c->physical_count = (int)n;
}

/* HCCLPY_SIM_DEVICE_MEMORY: a size of at least 1 MiB; an error otherwise, as
 * for HCCLPY_SIM_DEVICES. */
static void load_device_memory(sim_config_t *c)
{
    c->device_memory = DEFAULT_DEVICE_MEMORY;
    const char *text = getenv("HCCLPY_SIM_DEVICE_MEMORY");
    if (text == NULL || *text == '\0')
        return;
    uint64_t memory;
    if (!sim_parse_size(text, &memory) || memory < MIN_DEVICE_MEMORY) {
        config_problem(c, "HCCLPY_SIM_DEVICE_MEMORY='%.64s' is not a device memory size: it takes a number of "
                       "bytes, at least 1M, with an optional K, M, G or T suffix (unset or empty: 8G)", text);
        return;
    }
    c->device_memory = memory;
}

/* ASCEND_RT_VISIBLE_DEVICES renumbers: logical id i is the i-th listed
 * physical device, as on real hardware.  As CANN does, the list ends at the
 * first entry that is not a device (not a number, or out of range), and the
 * entries after it are ignored too; `visible_note` keeps which one it was, for
 * the message of a call that names a device the list did not make visible. */
static void load_visible(sim_config_t *c)
{
    c->device_count = 0;
    const char *visible = getenv("ASCEND_RT_VISIBLE_DEVICES");
    if (visible == NULL || *visible == '\0') {
        for (int i = 0; i < c->physical_count; i++)
            c->visible[c->device_count++] = i;
        return;
    }
    const char *p = visible;
    while (isspace((unsigned char)*p))
        p++;
    while (*p != '\0' && c->device_count < SIM_MAX_DEVICES) {
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno != 0 || id < 0 || id >= c->physical_count) {
            int length = (int)strcspn(p, ",");
            while (length > 0 && isspace((unsigned char)p[length - 1]))
                length--;
            char entry[48];
            if (length == 0)
                snprintf(entry, sizeof entry, "an empty entry");
            else
                snprintf(entry, sizeof entry, "'%.*s'", SIM_MIN(length, 32), p);
            snprintf(c->visible_note, sizeof c->visible_note,
                     "ASCEND_RT_VISIBLE_DEVICES='%.64s' stops at %s, which is not a device id (0..%d, "
                     "HCCLPY_SIM_DEVICES): it and the entries after it are ignored",
                     visible, entry, c->physical_count - 1);
            break;
        }
        c->visible[c->device_count++] = (int)id;
        p = end;
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
    }
    if (c->device_count == 0 && c->visible_note[0] == '\0')
        snprintf(c->visible_note, sizeof c->visible_note, "ASCEND_RT_VISIBLE_DEVICES='%.64s' lists no device",
                 visible);
}

static bool env_count(const char *name, long *out)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return false;
    char *end;
    long value = strtol(text, &end, 10);
    if (*end != '\0' || value < 0)
        return false;
    *out = value;
    return true;
}

int sim_server(char *name, size_t len)
{
    /* HCCLPY_SIM_NODE is the variable's name from before servers talked over TCP. */
    const char *set = getenv("HCCLPY_SIM_SERVER");
    if (set == NULL || *set == '\0')
        set = getenv("HCCLPY_SIM_NODE");
    if (set != NULL && *set != '\0') {
        if (name != NULL)
            snprintf(name, len, "%s", set);
        return SIM_SERVER_SET;
    }
    /* Launchers that started the job on several nodes: torchrun and hcclpy run (GROUP_RANK of
     * GROUP_WORLD_SIZE), Slurm (SLURM_NODEID of SLURM_NNODES); Open MPI and MPICH say only that
     * some ranks are elsewhere, and the host name tells the nodes apart. */
    long nodes, node, local, all;
    int spans = SIM_SERVER_ALONE;
    if (env_count("GROUP_WORLD_SIZE", &nodes) && env_count("GROUP_RANK", &node) && nodes > 1) {
        if (name != NULL)
            snprintf(name, len, "node%ld", node);
        return SIM_SERVER_LAUNCHER;
    }
    if (env_count("SLURM_NNODES", &nodes) && env_count("SLURM_NODEID", &node) && nodes > 1) {
        if (name != NULL)
            snprintf(name, len, "node%ld", node);
        return SIM_SERVER_LAUNCHER;
    }
    if ((env_count("OMPI_COMM_WORLD_LOCAL_SIZE", &local) && env_count("OMPI_COMM_WORLD_SIZE", &all)) ||
        (env_count("MPI_LOCALNRANKS", &local) && env_count("PMI_SIZE", &all)))
        spans = local < all ? SIM_SERVER_LAUNCHER : SIM_SERVER_ALONE;
    if (name != NULL && (gethostname(name, len - 1) != 0 || name[0] == '\0'))
        snprintf(name, len, "localhost");
    if (name != NULL)
        name[len - 1] = '\0';
    return spans;
}

static void load_config(void)
{
    sim_config_t *c = &g_config;
    load_device_count(c);
    load_device_memory(c);
    load_visible(c);
    /* No device is usable while a setting is wrong: every call that needs one
     * fails with the error (sim_config_check) instead of running half right. */
    if (c->error[0] != '\0')
        c->device_count = 0;

    sim_server(c->node, sizeof c->node);
}

const sim_config_t *sim_config(void)
{
    pthread_once(&g_config_once, load_config);
    return &g_config;
}

int sim_config_check(const char *api)
{
    const sim_config_t *c = sim_config();
    if (c->error[0] == '\0')
        return ACL_SUCCESS;
    if (api == NULL)
        return sim_error(ACL_ERROR_INVALID_PARAM, "%s", c->error);
    return sim_error(ACL_ERROR_INVALID_PARAM, "%s: %s", api, c->error);
}

/* ---------------------------------------------------------------- random */

uint64_t sim_random64(void)
{
    uint64_t value = 0;
    if (getrandom(&value, sizeof value, 0) != (ssize_t)sizeof value) {
        static _Atomic uint64_t counter;
        value = (uint64_t)sim_now_ns() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)getpid() << 32 ^
                atomic_fetch_add(&counter, 1);
    }
    return value;
}

/* -------------------------------------------------------------- liveness */

uint64_t sim_process_start_time(pid_t pid)
{
    char path[64], buffer[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buffer[n] = '\0';
    /* The command name may contain spaces and parentheses: fields are counted
     * from the last ')'.  Field 22 is the start time. */
    char *p = strrchr(buffer, ')');
    if (p == NULL)
        return 0;
    int field = 2;
    for (p++; *p != '\0' && field < 22; p++)
        if (*p == ' ')
            field++;
    if (field != 22)
        return 0;
    /* A zombie has exited: report it as gone. */
    char *state = strrchr(buffer, ')');
    if (state != NULL && state[1] == ' ' && (state[2] == 'Z' || state[2] == 'X'))
        return 0;
    return strtoull(p, NULL, 10);
}

bool sim_process_alive(pid_t pid, uint64_t start_time)
{
    if (pid == getpid())
        return true;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    uint64_t now = sim_process_start_time(pid);
    return now != 0 && (start_time == 0 || now == start_time);
}

/* ---------------------------------------------------------------- futexes */

int sim_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns, bool shared)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / SIM_NS_PER_S;
        ts.tv_nsec = timeout_ns % SIM_NS_PER_S;
        tsp = &ts;
    }
    int op = shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE;
    return (int)syscall(SYS_futex, (uint32_t *)word, op, expected, tsp, NULL, 0);
}

void sim_futex_wake(_Atomic uint32_t *word, bool shared)
{
    int op = shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE;
    syscall(SYS_futex, (uint32_t *)word, op, INT32_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Spinning is only worth it while another core can make the progress we wait
 * for; with more runnable ranks than cores (8 ranks on CI's 2 cores) long spins
 * livelock, so the spin phase is short and yields come early.  The first rounds
 * look again after a single pause (tens of nanoseconds on recent x86): the
 * other rank is usually a few microseconds away, and a waiter that looked only
 * every 16 pauses noticed it ~0.2 us late on average. */
enum { QUICK_ROUNDS = 512, SPIN_ROUNDS = QUICK_ROUNDS + 256, YIELD_ROUNDS = 64 };
#define BACKOFF_SLEEP_AFTER_NS (200 * 1000)

void sim_backoff_init(sim_backoff_t *b)
{
    b->rounds = 0;
    b->started_ns = 0;
    b->no_spin = false;
}

bool sim_backoff_step(sim_backoff_t *b)
{
    if (b->no_spin && b->rounds < SPIN_ROUNDS)
        b->rounds = SPIN_ROUNDS;
    uint32_t round = b->rounds++;
    if (round < SPIN_ROUNDS) {
        for (int i = round < QUICK_ROUNDS ? 15 : 0; i < 16; i++)
            cpu_relax();
        return false;
    }
    if (round == SPIN_ROUNDS)
        b->started_ns = sim_now_ns();
    if (round < SPIN_ROUNDS + YIELD_ROUNDS || sim_now_ns() - b->started_ns < BACKOFF_SLEEP_AFTER_NS) {
        sched_yield();
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- handles */

/* Handle value: generation in the high 32 bits, slot index + 1 in bits 4..31,
 * kind in the low 4 bits.  Slots live in chunks that are never freed, so a
 * lookup needs no lock.
 *
 * sim_handle_acquire takes a reference on the object while it holds a pin on
 * the slot, and sim_handle_free waits for the pins of the slot it frees to go:
 * so an acquirer either sees the handle freed or references the object before
 * whoever freed the handle can drop the handle's own reference.  (A lookup
 * followed by a reference would let the object be freed in between.)  A pin
 * lasts a few instructions; the orders are sequentially consistent on both
 * sides, so of "pin, check" and "invalidate, look at the pins" one thread
 * always sees the other's write. */
#define HANDLE_CHUNK 4096
#define HANDLE_CHUNKS 1024

typedef struct {
    _Atomic uint32_t generation;
    _Atomic uint32_t kind; /* 0 = free */
    void *_Atomic object;
    uint32_t next_free;
    _Atomic uint32_t pins; /* sim_handle_acquire calls looking at the slot right now */
} handle_slot_t;

static handle_slot_t *_Atomic g_handle_chunks[HANDLE_CHUNKS];
static pthread_mutex_t g_handle_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_handle_used;      /* slots ever handed out */
static uint32_t g_handle_free_head; /* index + 1 of the first free slot, 0 = none */

static handle_slot_t *handle_slot(uint32_t index)
{
    handle_slot_t *chunk = atomic_load_explicit(&g_handle_chunks[index / HANDLE_CHUNK], memory_order_acquire);
    return chunk == NULL ? NULL : &chunk[index % HANDLE_CHUNK];
}

void *sim_handle_new(enum sim_kind kind, void *object)
{
    pthread_mutex_lock(&g_handle_lock);
    uint32_t index;
    if (g_handle_free_head != 0) {
        index = g_handle_free_head - 1;
        g_handle_free_head = handle_slot(index)->next_free;
    } else {
        if (g_handle_used >= (uint32_t)HANDLE_CHUNK * HANDLE_CHUNKS) {
            pthread_mutex_unlock(&g_handle_lock);
            return NULL;
        }
        index = g_handle_used++;
        if (index % HANDLE_CHUNK == 0 && handle_slot(index) == NULL) {
            handle_slot_t *chunk = calloc(HANDLE_CHUNK, sizeof *chunk);
            if (chunk == NULL) {
                g_handle_used--;
                pthread_mutex_unlock(&g_handle_lock);
                return NULL;
            }
            atomic_store_explicit(&g_handle_chunks[index / HANDLE_CHUNK], chunk, memory_order_release);
        }
    }
    handle_slot_t *slot = handle_slot(index);
    uint32_t generation = atomic_load(&slot->generation) + 1;
    if (generation == 0)
        generation = 1;
    atomic_store(&slot->generation, generation);
    atomic_store(&slot->object, object);
    atomic_store_explicit(&slot->kind, (uint32_t)kind, memory_order_release);
    pthread_mutex_unlock(&g_handle_lock);
    uint64_t value = (uint64_t)generation << 32 | (uint64_t)(index + 1) << 4 | (uint64_t)kind;
    return (void *)(uintptr_t)value;
}

/* The slot a handle of `kind` names, or NULL for a value no handle of that kind can have. */
static handle_slot_t *slot_of(uint64_t value, enum sim_kind kind)
{
    if ((value & 0xF) != (uint64_t)kind)
        return NULL;
    uint64_t index_plus_one = (value >> 4) & 0x0FFFFFFF;
    if (index_plus_one == 0 || index_plus_one > (uint64_t)HANDLE_CHUNK * HANDLE_CHUNKS)
        return NULL;
    return handle_slot((uint32_t)(index_plus_one - 1));
}

/* Whether the slot holds the live handle `value` of `kind` (sequentially consistent loads: see
 * sim_handle_acquire). */
static bool slot_holds(handle_slot_t *slot, uint64_t value, enum sim_kind kind)
{
    return atomic_load(&slot->kind) == (uint32_t)kind &&
           atomic_load(&slot->generation) == (uint32_t)(value >> 32);
}

void *sim_handle_get(const void *handle, enum sim_kind kind)
{
    uint64_t value = (uint64_t)(uintptr_t)handle;
    handle_slot_t *slot = slot_of(value, kind);
    return slot != NULL && slot_holds(slot, value, kind) ? atomic_load(&slot->object) : NULL;
}

void *sim_handle_acquire(const void *handle, enum sim_kind kind, void *(*ref)(void *object))
{
    uint64_t value = (uint64_t)(uintptr_t)handle;
    handle_slot_t *slot = slot_of(value, kind);
    if (slot == NULL)
        return NULL;
    void *taken = NULL;
    atomic_fetch_add(&slot->pins, 1);
    if (slot_holds(slot, value, kind))
        taken = ref(atomic_load(&slot->object));
    atomic_fetch_sub(&slot->pins, 1);
    return taken;
}

bool sim_handle_free(const void *handle)
{
    uint64_t value = (uint64_t)(uintptr_t)handle;
    uint64_t index_plus_one = (value >> 4) & 0x0FFFFFFF;
    if (index_plus_one == 0 || index_plus_one > (uint64_t)HANDLE_CHUNK * HANDLE_CHUNKS)
        return false;
    uint32_t index = (uint32_t)(index_plus_one - 1);
    bool freed = false;
    pthread_mutex_lock(&g_handle_lock);
    handle_slot_t *slot = handle_slot(index);
    uint32_t kind = slot == NULL ? 0 : atomic_load(&slot->kind);
    if (kind != 0 && kind == (uint32_t)(value & 0xF) && atomic_load(&slot->generation) == (uint32_t)(value >> 32)) {
        atomic_store(&slot->kind, 0);
        atomic_store(&slot->object, NULL);
        atomic_fetch_add(&slot->generation, 1);
        slot->next_free = g_handle_free_head;
        g_handle_free_head = index + 1;
        freed = true;
    }
    pthread_mutex_unlock(&g_handle_lock);
    /* An acquirer that saw the handle live has referenced the object once its pin is gone. */
    while (freed && atomic_load(&slot->pins) != 0)
        sched_yield();
    return freed;
}

/* ------------------------------------------------------------------ fork */

static _Atomic uint64_t g_fork_generation;

uint64_t sim_fork_generation(void)
{
    return atomic_load(&g_fork_generation);
}

/* A forked child has none of the parent's threads: it starts with an empty
 * runtime.  The parent's mappings stay in its address space, unused. */
static void after_fork_in_child(void)
{
    atomic_fetch_add(&g_fork_generation, 1);
    pthread_mutex_init(&g_handle_lock, NULL);
    for (int c = 0; c < HANDLE_CHUNKS; c++) {
        handle_slot_t *chunk = g_handle_chunks[c];
        if (chunk == NULL)
            continue;
        for (int i = 0; i < HANDLE_CHUNK; i++) {
            atomic_store(&chunk[i].pins, 0); /* pinned by threads the child does not have */
            if (atomic_load(&chunk[i].kind) != 0) {
                atomic_store(&chunk[i].kind, 0);
                atomic_fetch_add(&chunk[i].generation, 1);
                chunk[i].next_free = g_handle_free_head;
                g_handle_free_head = (uint32_t)(c * HANDLE_CHUNK + i + 1);
            }
        }
    }
    t_error_unread = false;
    sim_runtime_after_fork();
}

__attribute__((constructor)) static void install_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

SIM_EXPORT size_t aclDataTypeSize(aclDataType dataType)
{
    switch (dataType) {
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: case ACL_HIFLOAT8: case ACL_FLOAT8_E5M2: case ACL_FLOAT8_E4M3FN:
    case ACL_FLOAT8_E8M0:
        return 1;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16:
        return 2;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: case ACL_COMPLEX32:
        return 4;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64:
        return 8;
    case ACL_COMPLEX128:
        return 16;
    default: /* strings, the 4-, 6- and 1-bit types, unknown values */
        return 0;
    }
}
