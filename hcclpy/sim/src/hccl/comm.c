/* Communicators: root info, rendezvous, configuration, sub-communicators and
 * teardown.
 *
 * HcclGetRootInfo creates the communicator's control segment (a memfd) in the
 * calling process and writes into the root info where other processes can
 * open it (/proc/<pid>/fd/<fd>).  Each rank claims its slot in the segment,
 * announces its process, device and device-memory arena, and waits for the
 * others.  The creating process closes its descriptor once every rank has
 * mapped the segment, so the memory goes away with the last rank.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hccl/internal.h"

#define ROOTINFO_MAGIC "HPSROOT1"
#define SEG_MAGIC 0x3147455353504348ULL /* "HCPSSEG1" */
#define SEG_VERSION 2u /* 2: two descriptors and eager data per slot */
#define DEFAULT_CONNECT_TIMEOUT_S 120.0
#define DEFAULT_EXEC_TIMEOUT_S 1836.0

_Static_assert(sizeof(rootinfo_wire_t) <= HCCL_ROOT_INFO_BYTES, "root info does not fit");
_Static_assert(sizeof(seg_header_t) <= SEG_HEADER_BYTES, "segment header too large");

/* ------------------------------------------------ segments this process made */

typedef struct created {
    struct created *next;
    uint8_t token[16];
    int fd;
} created_t;

static pthread_mutex_t g_created_lock = PTHREAD_MUTEX_INITIALIZER;
static created_t *g_created;

/* The creator keeps the descriptor only until every rank has the segment. */
static void close_created(const uint8_t token[16])
{
    pthread_mutex_lock(&g_created_lock);
    for (created_t **link = &g_created; *link != NULL; link = &(*link)->next) {
        if (memcmp((*link)->token, token, 16) == 0) {
            created_t *entry = *link;
            *link = entry->next;
            close(entry->fd);
            free(entry);
            break;
        }
    }
    pthread_mutex_unlock(&g_created_lock);
}

int hccl_get_root_info(rootinfo_wire_t *wire)
{
    int fd = memfd_create("hcclpy-sim-comm", MFD_CLOEXEC);
    if (fd < 0)
        return hccl_error(HCCL_E_SYSCALL, "HcclGetRootInfo: memfd_create failed: %s", strerror(errno));
    if (ftruncate(fd, SEG_HEADER_BYTES) != 0) {
        int saved = errno;
        close(fd);
        return hccl_error(HCCL_E_SYSCALL, "HcclGetRootInfo: sizing the control segment failed: %s", strerror(saved));
    }
    seg_header_t *header = mmap(NULL, SEG_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (header == MAP_FAILED) {
        int saved = errno;
        close(fd);
        return hccl_error(HCCL_E_SYSCALL, "HcclGetRootInfo: mapping the control segment failed: %s", strerror(saved));
    }
    created_t *entry = calloc(1, sizeof *entry);
    if (entry == NULL) {
        munmap(header, SEG_HEADER_BYTES);
        close(fd);
        return hccl_error(HCCL_E_MEMORY, "HcclGetRootInfo: out of host memory");
    }
    memset(wire, 0, sizeof *wire);
    memcpy(wire->magic, ROOTINFO_MAGIC, sizeof wire->magic);
    uint64_t a = sim_random64(), b = sim_random64();
    memcpy(wire->token, &a, 8);
    memcpy(wire->token + 8, &b, 8);
    wire->pid = getpid();
    wire->fd = fd;
    wire->start_time = sim_process_start_time(getpid());
    snprintf(wire->node, sizeof wire->node, "%s", sim_config()->node);

    header->magic = SEG_MAGIC;
    header->version = SEG_VERSION;
    memcpy(header->token, wire->token, 16);
    munmap(header, SEG_HEADER_BYTES);

    memcpy(entry->token, wire->token, 16);
    entry->fd = fd;
    pthread_mutex_lock(&g_created_lock);
    entry->next = g_created;
    g_created = entry;
    pthread_mutex_unlock(&g_created_lock);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    /* Every way into HCCL starts here or at an initialisation: they report an unknown profile. */
    int err = hccl_profile_get("HcclGetRootInfo", NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (rootInfo == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetRootInfo: rootInfo is NULL");
    rootinfo_wire_t wire;
    err = hccl_get_root_info(&wire);
    if (err != HCCL_SUCCESS)
        return err;
    memset(rootInfo, 0, sizeof *rootInfo);
    memcpy(rootInfo->internal, &wire, sizeof wire);
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------ configuration */

typedef struct {
    char name[HCCL_SIM_NAME_BYTES];
    int64_t exec_timeout_ns; /* -1 = not set */
} parsed_config_t;

static double exec_timeout_from_env(void)
{
    return sim_env_seconds("HCCL_EXEC_TIMEOUT", DEFAULT_EXEC_TIMEOUT_S);
}

/* Reads the caller's HcclCommConfig the way the library does: by its size,
 * magic word and version, ignoring fields newer than the version. */
static int parse_config(const HcclCommConfig *config, const char *api, parsed_config_t *out)
{
    memset(out, 0, sizeof *out);
    out->exec_timeout_ns = -1;
    if (config == NULL)
        return HCCL_SUCCESS;
    uint64_t size;
    uint32_t magic, version;
    memcpy(&size, (const char *)config, 8);
    memcpy(&magic, (const char *)config + 8, 4);
    memcpy(&version, (const char *)config + 12, 4);
    if (magic != HCCL_COMM_CONFIG_MAGIC_WORD)
        return hccl_error(HCCL_E_PARA, "%s: the config's magic word is 0x%08x, not 0x%08x: initialise it with "
                          "HcclCommConfigInit()", api, magic, (unsigned)HCCL_COMM_CONFIG_MAGIC_WORD);
    if (size < HCCL_COMM_CONFIG_INFO_BYTES)
        return hccl_error(HCCL_E_PARA, "%s: the config declares a size of %llu bytes, smaller than its header", api,
                          (unsigned long long)size);
    HcclCommConfig local;
    memset(&local, 0, sizeof local);
    memcpy(&local, config, (size_t)SIM_MIN(size, (uint64_t)sizeof local));
    if (version >= 1) {
        if (local.hcclBufferSize != HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET && local.hcclBufferSize < 1)
            return hccl_error(HCCL_E_PARA, "%s: hcclBufferSize must be at least 1 (MB), got %u", api,
                              local.hcclBufferSize);
        if (local.hcclDeterministic != HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET && local.hcclDeterministic > 2)
            return hccl_error(HCCL_E_PARA, "%s: hcclDeterministic must be 0, 1 or 2, got %u", api,
                              local.hcclDeterministic);
    }
    if (version >= 2 && size > offsetof(HcclCommConfig, hcclCommName)) {
        if (memchr(local.hcclCommName, '\0', sizeof local.hcclCommName) == NULL)
            return hccl_error(HCCL_E_PARA, "%s: hcclCommName is not NUL-terminated within %zu bytes", api,
                              sizeof local.hcclCommName);
        snprintf(out->name, sizeof out->name, "%s", local.hcclCommName);
    }
    if (version >= 5 && size > offsetof(HcclCommConfig, hcclRdmaServiceLevel)) {
        if (local.hcclRdmaTrafficClass != HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET &&
            (local.hcclRdmaTrafficClass > 255 || local.hcclRdmaTrafficClass % 4 != 0))
            return hccl_error(HCCL_E_PARA, "%s: hcclRdmaTrafficClass must be a multiple of 4 in [0, 255], got %u",
                              api, local.hcclRdmaTrafficClass);
        if (local.hcclRdmaServiceLevel != HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET && local.hcclRdmaServiceLevel > 7)
            return hccl_error(HCCL_E_PARA, "%s: hcclRdmaServiceLevel must be in [0, 7], got %u", api,
                              local.hcclRdmaServiceLevel);
    }
    if (version >= 8 && size > offsetof(HcclCommConfig, hcclExecTimeOut)) {
        int32_t timeout = local.hcclExecTimeOut;
        if (timeout != HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET) {
            if (timeout < 0)
                return hccl_error(HCCL_E_PARA, "%s: hcclExecTimeOut must be >= 0 seconds (or unset), got %d", api,
                                  (int)timeout);
            out->exec_timeout_ns = (int64_t)timeout * SIM_NS_PER_S;
        }
    }
    return HCCL_SUCCESS;
}

/* -------------------------------------------------------------- lifecycle */

static int64_t connect_deadline(void)
{
    double seconds = sim_env_seconds("HCCL_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S);
    return sim_now_ns() + (int64_t)(seconds * 1e9);
}

static void comm_free(hccl_comm_t *comm)
{
    if (comm->peer_base != NULL) {
        for (uint32_t r = 0; r < comm->nranks; r++)
            if (comm->peer_base[r] != NULL)
                sim_arena_unmap(&comm->peer_arena[r]);
    }
    if (comm->segment != NULL)
        munmap(comm->segment, comm->segment_bytes);
    free(comm->peer_base);
    free(comm->peer_arena);
    free(comm->scratch_in);
    free(comm->scratch_out);
    free(comm->send_seq);
    free(comm->recv_seq);
    pthread_mutex_destroy(&comm->lock);
    free(comm);
}

void hccl_comm_unref(hccl_comm_t *comm)
{
    if (atomic_fetch_sub(&comm->refs, 1) == 1)
        comm_free(comm);
}

hccl_comm_t *hccl_comm_lookup(HcclComm handle, const char *api, int *err)
{
    if (handle == NULL) {
        *err = hccl_error(HCCL_E_PTR, "%s: comm is NULL", api);
        return NULL;
    }
    hccl_comm_t *comm = sim_handle_get(handle, SIM_KIND_COMM);
    if (comm == NULL)
        *err = hccl_error(HCCL_E_PARA, "%s: %p is not a live communicator (never created, or destroyed)", api, handle);
    return comm;
}

/* Called after publishing anything a waiter looks at.  Waiters that may
 * sleep count themselves in `sleepers` before they look a last time
 * (hccl_op_run), so with the fence either they see what was published or this
 * sees them; with nobody counted, the shared epoch word is left alone. */
void hccl_wake(hccl_comm_t *comm)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&comm->header->sleepers) != 0) {
        atomic_fetch_add(&comm->header->epoch, 1);
        sim_futex_wake(&comm->header->epoch, true);
    }
}

void hccl_publish(hccl_comm_t *comm, uint64_t progress)
{
    atomic_store_explicit(&comm_slot(comm, comm->rank)->progress, progress, memory_order_release);
    hccl_wake(comm);
}

void hccl_comm_abort(hccl_comm_t *comm, HcclResult code, const char *fmt, ...)
{
    seg_header_t *header = comm->header;
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong(&header->abort_code, &expected, (uint32_t)code)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(header->abort_text, sizeof header->abort_text, fmt, ap);
        va_end(ap);
        header->abort_rank = (int32_t)comm->rank;
        atomic_store(&header->abort_text_ready, 1);
    }
    hccl_wake(comm);
}

HcclResult hccl_comm_broken(const hccl_comm_t *comm)
{
    return (HcclResult)atomic_load_explicit(&comm->header->abort_code, memory_order_acquire);
}

int hccl_comm_check_usable(const hccl_comm_t *comm, const char *api)
{
    HcclResult broken = hccl_comm_broken(comm);
    if (broken == HCCL_SUCCESS)
        return HCCL_SUCCESS;
    seg_header_t *header = comm->header;
    /* Another rank's failure is a remote error here (as for operations in flight). */
    if (broken != HCCL_E_TIMEOUT && header->abort_rank != (int32_t)comm->rank)
        broken = HCCL_E_REMOTE;
    return hccl_error(broken, "%s: communicator '%s' has failed (rank %d: %s); destroy it and create a new one", api,
                      comm->name, (int)header->abort_rank,
                      atomic_load(&header->abort_text_ready) ? header->abort_text : "no details");
}

/* Opens the segment named by the root info and maps its header. */
static int open_segment(const rootinfo_wire_t *wire, int *fd_out, seg_header_t **header_out)
{
    if (memcmp(wire->magic, ROOTINFO_MAGIC, sizeof wire->magic) != 0)
        return hccl_error(HCCL_E_PARA, "the root info was not produced by HcclGetRootInfo of this simulator");
    if (memchr(wire->node, '\0', sizeof wire->node) == NULL)
        return hccl_error(HCCL_E_PARA, "the root info is damaged: its host name is not terminated");
    if (strcmp(wire->node, sim_config()->node) != 0 && getenv("HCCLPY_SIM_NODE") == NULL)
        return hccl_error(HCCL_E_NOT_SUPPORT, "the root info comes from host '%s'; the simulator connects ranks of "
                          "one host only (this is '%s')", wire->node, sim_config()->node);
    if (!sim_process_alive(wire->pid, wire->start_time))
        return hccl_error(HCCL_E_UNAVAIL, "the process that created the root info (pid %d) has exited",
                          (int)wire->pid);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)wire->pid, (int)wire->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return hccl_error(HCCL_E_UNAVAIL, "cannot open the communicator's control segment (%s: %s): the root info "
                          "was already used by a completed initialisation, or its creator released it",
                          path, strerror(errno));
    /* A damaged root info may name any file: reading a mapping past the end of the file raises
     * SIGBUS, so anything shorter than a segment header is refused before it is mapped. */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)SEG_HEADER_BYTES) {
        close(fd);
        return hccl_error(HCCL_E_UNAVAIL, "the root info does not name a communicator's control segment (%s)", path);
    }
    seg_header_t *header = mmap(NULL, SEG_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (header == MAP_FAILED) {
        int saved = errno;
        close(fd);
        return hccl_error(HCCL_E_SYSCALL, "cannot map the communicator's control segment: %s", strerror(saved));
    }
    if (header->magic != SEG_MAGIC || header->version != SEG_VERSION || memcmp(header->token, wire->token, 16) != 0) {
        munmap(header, SEG_HEADER_BYTES);
        close(fd);
        return hccl_error(HCCL_E_UNAVAIL, "the root info no longer names a live communicator (already used, or "
                          "its creator released it)");
    }
    *fd_out = fd;
    *header_out = header;
    return HCCL_SUCCESS;
}

static uint64_t round_up(uint64_t value, uint64_t to)
{
    return (value + to - 1) / to * to;
}

/* Sizes the segment for `nranks` (first rank) or checks the size (others). */
static int agree_on_layout(seg_header_t *header, int fd, uint32_t nranks, uint32_t rank, int64_t deadline)
{
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong(&header->nranks, &expected, nranks)) {
        uint64_t slot = sizeof(slot_head_t) + 2 * 8 * (uint64_t)nranks + (sizeof(p2p_out_t) + sizeof(p2p_in_t)) *
                        (uint64_t)nranks;
        header->slot_bytes = round_up(slot, 4096);
        header->total_bytes = SEG_HEADER_BYTES + header->slot_bytes * nranks;
        if (ftruncate(fd, (off_t)header->total_bytes) != 0)
            return hccl_error(HCCL_E_SYSCALL, "sizing the communicator's control segment failed: %s", strerror(errno));
        atomic_store_explicit(&header->layout_ready, 1, memory_order_release);
        return HCCL_SUCCESS;
    }
    if (expected != nranks)
        return hccl_error(HCCL_E_PARA, "rank %u passed nRanks=%u, but another rank of this communicator passed %u",
                          rank, nranks, expected);
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    while (atomic_load_explicit(&header->layout_ready, memory_order_acquire) == 0) {
        if (sim_now_ns() > deadline)
            return hccl_error(HCCL_E_TIMEOUT, "timed out waiting for the communicator's first rank to set it up");
        if (sim_backoff_step(&backoff))
            usleep(100);
    }
    return HCCL_SUCCESS;
}

/* Waits until all ranks have joined, watching for dead ones. */
static int wait_for_ranks(hccl_comm_t *comm, int64_t deadline)
{
    seg_header_t *header = comm->header;
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    int64_t next_check = 0;
    while (atomic_load_explicit(&header->joined, memory_order_acquire) < comm->nranks) {
        int64_t now = sim_now_ns();
        if (atomic_load(&header->abort_code) != 0)
            return hccl_error(HCCL_E_REMOTE, "communicator initialisation failed on another rank: %s",
                              atomic_load(&header->abort_text_ready) ? header->abort_text : "(no details)");
        if (now > deadline) {
            char missing[256] = "";
            size_t used = 0;
            for (uint32_t r = 0; r < comm->nranks && used < sizeof missing - 16; r++)
                if (atomic_load(&comm_slot(comm, r)->state) != SLOT_JOINED)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%u", used ? ", " : "", r);
            return hccl_error(HCCL_E_TIMEOUT, "communicator initialisation timed out after HCCL_CONNECT_TIMEOUT: "
                              "%u of %u ranks joined; missing rank(s) %s", atomic_load(&header->joined),
                              comm->nranks, missing);
        }
        if (now > next_check) {
            for (uint32_t r = 0; r < comm->nranks; r++) {
                slot_head_t *slot = comm_slot(comm, r);
                if (atomic_load_explicit(&slot->state, memory_order_acquire) == SLOT_JOINED &&
                    !sim_process_alive(slot->pid, slot->start_time))
                    return hccl_error(HCCL_E_REMOTE, "rank %u (pid %d) exited during communicator initialisation",
                                      r, (int)slot->pid);
            }
            next_check = now + 50 * SIM_NS_PER_MS;
        }
        if (sim_backoff_step(&backoff))
            usleep(200);
    }
    return HCCL_SUCCESS;
}

static int check_devices(hccl_comm_t *comm)
{
    for (uint32_t a = 0; a < comm->nranks; a++) {
        slot_head_t *sa = comm_slot(comm, a);
        for (uint32_t b = a + 1; b < comm->nranks; b++) {
            slot_head_t *sb = comm_slot(comm, b);
            if (sa->device_physical == sb->device_physical && strcmp(sa->node, sb->node) == 0)
                return hccl_error(HCCL_E_PARA, "ranks %u and %u are both on device %d of host '%s': a communicator "
                                  "takes one rank per device (call aclrtSetDevice with a different device in each "
                                  "rank, or, to emulate several servers on this machine, give each its own "
                                  "HCCLPY_SIM_NODE)", a, b, (int)sa->device_physical, sa->node);
        }
    }
    return HCCL_SUCCESS;
}

static bool cores_oversubscribed(uint32_t local_ranks)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 && (long)local_ranks > cores;
}

int hccl_comm_init(uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank, const HcclCommConfig *config,
                   int device, const char *node, HcclComm *out)
{
    const char *api = "HcclCommInitRootInfo";
    if (nranks == 0 || nranks > HCCL_SIM_MAX_RANKS)
        return hccl_error(HCCL_E_PARA, "%s: nRanks must be in [1, %u], got %u", api, HCCL_SIM_MAX_RANKS, nranks);
    if (rank >= nranks)
        return hccl_error(HCCL_E_PARA, "%s: rank %u is out of range for nRanks=%u", api, rank, nranks);
    parsed_config_t parsed;
    int err = parse_config(config, api, &parsed);
    if (err != HCCL_SUCCESS)
        return err;
    sim_arena_loc_t arena;
    err = sim_device_arena(device, &arena, NULL);
    if (err != 0)
        return hccl_error(HCCL_E_RUNTIME, "%s: device %d: %s", api, device, sim_error_text());

    int64_t deadline = connect_deadline();
    int fd = -1;
    seg_header_t *header = NULL;
    err = open_segment(wire, &fd, &header);
    if (err != HCCL_SUCCESS)
        return err;
    err = agree_on_layout(header, fd, nranks, rank, deadline);
    if (err != HCCL_SUCCESS) {
        munmap(header, SEG_HEADER_BYTES);
        close(fd);
        return err;
    }
    uint64_t total = header->total_bytes;
    munmap(header, SEG_HEADER_BYTES);
    char *segment = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (segment == MAP_FAILED)
        return hccl_error(HCCL_E_SYSCALL, "%s: mapping the control segment failed: %s", api, strerror(map_errno));

    hccl_comm_t *comm = calloc(1, sizeof *comm);
    if (comm == NULL) {
        munmap(segment, total);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
    pthread_mutex_init(&comm->lock, NULL);
    comm->refs = 1;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    comm->segment = segment;
    comm->segment_bytes = total;
    comm->header = (seg_header_t *)segment;
    comm->peer_base = calloc(nranks, sizeof *comm->peer_base);
    comm->peer_arena = calloc(nranks, sizeof *comm->peer_arena);
    comm->send_seq = calloc(nranks, sizeof *comm->send_seq);
    comm->recv_seq = calloc(nranks, sizeof *comm->recv_seq);
    comm->scratch_in = calloc(nranks, sizeof *comm->scratch_in);
    comm->scratch_out = calloc(nranks, sizeof *comm->scratch_out);
    if (comm->peer_base == NULL || comm->peer_arena == NULL || comm->send_seq == NULL || comm->recv_seq == NULL ||
        comm->scratch_in == NULL || comm->scratch_out == NULL) {
        comm_free(comm);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
    double exec_s = exec_timeout_from_env();
    comm->exec_timeout_ns = parsed.exec_timeout_ns >= 0 ? parsed.exec_timeout_ns : (int64_t)(exec_s * 1e9);

    slot_head_t *slot = comm_slot(comm, rank);
    uint32_t expected = SLOT_FREE;
    if (!atomic_compare_exchange_strong(&slot->state, &expected, SLOT_CLAIMED)) {
        comm_free(comm);
        return hccl_error(HCCL_E_PARA, "%s: rank %u of this communicator was already taken by another caller "
                          "(each rank must pass a different rank id)", api, rank);
    }
    slot->pid = getpid();
    slot->start_time = sim_process_start_time(getpid());
    slot->device = device;
    slot->device_physical = sim_device_physical(device);
    snprintf(slot->node, sizeof slot->node, "%s", node != NULL ? node : sim_config()->node);
    slot->arena = arena;
    snprintf(slot->name, sizeof slot->name, "%s", parsed.name);
    atomic_store(&slot->progress, 0);
    atomic_store_explicit(&slot->state, SLOT_JOINED, memory_order_release);
    atomic_fetch_add(&comm->header->joined, 1);
    hccl_wake(comm);

    err = wait_for_ranks(comm, deadline);
    if (err == HCCL_SUCCESS)
        err = check_devices(comm);
    /* Every rank has the segment mapped now (or will never come). */
    close_created(wire->token);
    uint32_t local_ranks = 0;
    for (uint32_t r = 0; err == HCCL_SUCCESS && r < nranks; r++) {
        slot_head_t *peer = comm_slot(comm, r);
        local_ranks += peer->pid == getpid() || strcmp(peer->node, slot->node) == 0;
        comm->peer_arena[r] = peer->arena;
        comm->peer_base[r] = sim_arena_map(&peer->arena);
        if (comm->peer_base[r] == NULL)
            err = hccl_error(HCCL_E_RUNTIME, "%s: cannot reach the device memory of rank %u: %s", api, r,
                             sim_error_text());
    }
    if (err != HCCL_SUCCESS) {
        char text[512];
        snprintf(text, sizeof text, "%s", sim_error_text());
        hccl_comm_abort(comm, (HcclResult)err, "rank %u failed to initialise: %s", rank, text);
        atomic_store(&slot->state, SLOT_LEFT);
        comm_free(comm);
        hccl_error((HcclResult)err, "%s", text);
        return err;
    }
    comm->oversubscribed = cores_oversubscribed(local_ranks);
    const char *chosen = comm_slot(comm, 0)->name;
    if (chosen[0] != '\0') {
        snprintf(comm->name, sizeof comm->name, "%s", chosen);
    } else {
        snprintf(comm->name, sizeof comm->name, "hcclpy_sim_");
        for (int i = 0; i < 8; i++)
            snprintf(comm->name + strlen(comm->name), 3, "%02x", wire->token[i]);
    }
    comm->handle = sim_handle_new(SIM_KIND_COMM, comm);
    if (comm->handle == NULL) {
        atomic_store(&slot->state, SLOT_LEFT);
        comm_free(comm);
        return hccl_error(HCCL_E_MEMORY, "%s: too many live handles", api);
    }
    *out = comm->handle;
    return HCCL_SUCCESS;
}

static int current_device(const char *api, int *device)
{
    if (sim_current_device(device) != 0)
        return hccl_error(HCCL_E_RUNTIME, "%s: no current device on this thread: call aclrtSetDevice before "
                          "initialising a communicator", api);
    return HCCL_SUCCESS;
}

static int init_root_info(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, const HcclCommConfig *config,
                          HcclComm *comm, const char *api)
{
    int err = hccl_profile_get(api, NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (rootInfo == NULL || comm == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", api, rootInfo == NULL ? "rootInfo" : "comm");
    int device;
    err = current_device(api, &device);
    if (err != HCCL_SUCCESS)
        return err;
    rootinfo_wire_t wire;
    memcpy(&wire, rootInfo->internal, sizeof wire);
    if (hccl_group_active())
        return hccl_group_add_init(nRanks, &wire, rank, config, device, comm);
    return hccl_comm_init(nRanks, &wire, rank, config, device, NULL, comm);
}

HCCL_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm)
{
    return init_root_info(nRanks, rootInfo, rank, NULL, comm, "HcclCommInitRootInfo");
}

HCCL_API HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                               const HcclCommConfig *config, HcclComm *comm)
{
    if (config == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommInitRootInfoConfig: config is NULL");
    return init_root_info(nRanks, rootInfo, rank, config, comm, "HcclCommInitRootInfoConfig");
}

static int init_cluster_info(const char *clusterInfo, uint32_t rank, const HcclCommConfig *config, HcclComm *comm,
                             const char *api)
{
    int err = hccl_profile_get(api, NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (clusterInfo == NULL || comm == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", api, clusterInfo == NULL ? "clusterInfo" : "comm");
    int device;
    err = current_device(api, &device);
    if (err != HCCL_SUCCESS)
        return err;
    parsed_config_t parsed;
    err = parse_config(config, api, &parsed);
    if (err != HCCL_SUCCESS)
        return err;
    uint32_t nranks;
    int table_device;
    char node[64];
    rootinfo_wire_t wire;
    err = hccl_rank_table_rendezvous(clusterInfo, rank, &nranks, &table_device, node, sizeof node, &wire);
    if (err != HCCL_SUCCESS)
        return err;
    if (table_device != sim_device_physical(device))
        return hccl_error(HCCL_E_PARA, "%s: the rank table puts rank %u on device %d, but this thread's current "
                          "device is %d (physical %d)", api, rank, table_device, device, sim_device_physical(device));
    return hccl_comm_init(nranks, &wire, rank, config, device, node, comm);
}

HCCL_API HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm)
{
    return init_cluster_info(clusterInfo, rank, NULL, comm, "HcclCommInitClusterInfo");
}

HCCL_API HcclResult HcclCommInitClusterInfoConfig(const char *clusterInfo, uint32_t rank, HcclCommConfig *config,
                                                  HcclComm *comm)
{
    if (config == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommInitClusterInfoConfig: config is NULL");
    return init_cluster_info(clusterInfo, rank, config, comm, "HcclCommInitClusterInfoConfig");
}

/* ------------------------------------------------------------ init all */

static void *init_job_main(void *arg)
{
    init_job_t *job = arg;
    if (job->set_device && aclrtSetDevice(job->device) != ACL_SUCCESS) {
        job->err = HCCL_E_RUNTIME;
        snprintf(job->text, sizeof job->text, "aclrtSetDevice(%d) failed: %s", job->device, sim_error_text());
        return NULL;
    }
    job->err = hccl_comm_init(job->nranks, &job->wire, job->rank, job->has_config ? &job->config : NULL,
                              job->device, NULL, &job->comm);
    if (job->err != HCCL_SUCCESS)
        snprintf(job->text, sizeof job->text, "%s", sim_error_text());
    return NULL;
}

/* Runs several initialisations at once, one thread each (they wait for each
 * other).  On failure every communicator that did come up is destroyed. */
int hccl_run_init_jobs(init_job_t *jobs, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++) {
        if (pthread_create(&jobs[i].thread, NULL, init_job_main, &jobs[i]) != 0) {
            jobs[i].err = HCCL_E_SYSCALL;
            snprintf(jobs[i].text, sizeof jobs[i].text, "cannot start an initialisation thread");
            jobs[i].thread = 0;
        }
    }
    int first = HCCL_SUCCESS;
    const char *text = "";
    for (uint32_t i = 0; i < count; i++) {
        if (jobs[i].thread != 0)
            pthread_join(jobs[i].thread, NULL);
        if (jobs[i].err != HCCL_SUCCESS && first == HCCL_SUCCESS) {
            first = jobs[i].err;
            text = jobs[i].text;
        }
    }
    if (first != HCCL_SUCCESS) {
        for (uint32_t i = 0; i < count; i++)
            if (jobs[i].err == HCCL_SUCCESS && jobs[i].comm != NULL)
                HcclCommDestroy(jobs[i].comm);
        hccl_error((HcclResult)first, "%s", text);
    }
    return first;
}

HCCL_API HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms)
{
    const char *api = "HcclCommInitAll";
    int err = hccl_profile_get(api, NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (devices == NULL || comms == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", api, devices == NULL ? "devices" : "comms");
    /* A bad HCCLPY_SIM_* setting leaves no device: say which, not "ndev must be in [1, 0]". */
    if (sim_config()->error[0] != '\0')
        return hccl_error(HCCL_E_PARA, "%s: %s", api, sim_config()->error);
    uint32_t count = (uint32_t)sim_config()->device_count;
    if (ndev == 0 || ndev > count)
        return hccl_error(HCCL_E_PARA, "%s: ndev must be in [1, %u], got %u", api, count, ndev);
    for (uint32_t i = 0; i < ndev; i++) {
        if (devices[i] < 0 || (uint32_t)devices[i] >= count)
            return hccl_error(HCCL_E_PARA, "%s: devices[%u] = %d is not a device id in [0, %u)", api, i,
                              (int)devices[i], count);
        for (uint32_t j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return hccl_error(HCCL_E_PARA, "%s: device %d is listed twice (devices[%u] and devices[%u])", api,
                                  (int)devices[i], j, i);
    }
    rootinfo_wire_t wire;
    err = hccl_get_root_info(&wire);
    if (err != HCCL_SUCCESS)
        return err;
    init_job_t *jobs = calloc(ndev, sizeof *jobs);
    if (jobs == NULL)
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    for (uint32_t i = 0; i < ndev; i++) {
        jobs[i].nranks = ndev;
        jobs[i].rank = i;
        jobs[i].wire = wire;
        jobs[i].device = devices[i];
        jobs[i].set_device = true;
    }
    err = hccl_run_init_jobs(jobs, ndev);
    if (err == HCCL_SUCCESS)
        for (uint32_t i = 0; i < ndev; i++)
            comms[i] = jobs[i].comm;
    close_created(wire.token);
    free(jobs);
    return err;
}

/* ------------------------------------------------------- sub-communicators */

HCCL_API HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds, uint64_t subCommId,
                                            uint32_t subCommRankId, HcclCommConfig *config, HcclComm *subComm)
{
    const char *api = "HcclCreateSubCommConfig";
    if (comm == NULL || subComm == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", api, comm == NULL ? "comm" : "subComm");
    int err = HCCL_SUCCESS;
    hccl_comm_t *parent = hccl_comm_lookup(*comm, api, &err);
    if (parent == NULL)
        return err;
    if (rankIds == NULL) {
        /* This rank is not a member. */
        *subComm = NULL;
        return HCCL_SUCCESS;
    }
    if (config == NULL)
        return hccl_error(HCCL_E_PTR, "%s: config is NULL (initialise one with HcclCommConfigInit)", api);
    if (parent->is_subcomm)
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: '%s' is itself a sub-communicator; HCCL splits only one level, "
                          "so create the sub-communicator from the parent", api, parent->name);
    if (rankNum == 0 || rankNum > parent->nranks)
        return hccl_error(HCCL_E_PARA, "%s: rankNum must be in [1, %u], got %u", api, parent->nranks, rankNum);
    for (uint32_t i = 0; i < rankNum; i++) {
        if (rankIds[i] >= parent->nranks)
            return hccl_error(HCCL_E_PARA, "%s: rankIds[%u] = %u is not a rank of the parent (size %u)", api, i,
                              rankIds[i], parent->nranks);
        if (i > 0 && rankIds[i] <= rankIds[i - 1])
            return hccl_error(HCCL_E_PARA, "%s: rankIds must be strictly increasing (rankIds[%u] = %u after %u)", api,
                              i, rankIds[i], rankIds[i - 1]);
    }
    if (subCommRankId >= rankNum || rankIds[subCommRankId] != parent->rank)
        return hccl_error(HCCL_E_PARA, "%s: subCommRankId %u must be this rank's position in rankIds (parent rank "
                          "%u)", api, subCommRankId, parent->rank);
    parsed_config_t parsed;
    err = parse_config(config, api, &parsed);
    if (err != HCCL_SUCCESS)
        return err;

    seg_header_t *header = parent->header;
    int64_t deadline = connect_deadline();
    rootinfo_wire_t wire;
    if (subCommRankId == 0) {
        err = hccl_get_root_info(&wire);
        if (err != HCCL_SUCCESS)
            return err;
        subcomm_entry_t *entry = NULL;
        for (int i = 0; i < SEG_SUBCOMM_ENTRIES; i++) {
            subcomm_entry_t *e = &header->subcomms[i];
            if (atomic_load(&e->state) == 2 && e->id == subCommId) {
                close_created(wire.token);
                return hccl_error(HCCL_E_PARA, "%s: sub-communicator id %llu is already being created", api,
                                  (unsigned long long)subCommId);
            }
        }
        for (int i = 0; i < SEG_SUBCOMM_ENTRIES && entry == NULL; i++) {
            uint32_t expected = 0;
            if (atomic_compare_exchange_strong(&header->subcomms[i].state, &expected, 1))
                entry = &header->subcomms[i];
        }
        if (entry == NULL) {
            close_created(wire.token);
            return hccl_error(HCCL_E_UNAVAIL, "%s: too many sub-communicators being created at once", api);
        }
        entry->id = subCommId;
        entry->members = rankNum;
        entry->wire = wire;
        atomic_store(&entry->readers, 0);
        atomic_store_explicit(&entry->state, rankNum > 1 ? 2 : 0, memory_order_release);
        hccl_wake(parent);
    } else {
        sim_backoff_t backoff;
        sim_backoff_init(&backoff);
        bool found = false;
        while (!found) {
            for (int i = 0; i < SEG_SUBCOMM_ENTRIES && !found; i++) {
                subcomm_entry_t *e = &header->subcomms[i];
                if (atomic_load_explicit(&e->state, memory_order_acquire) == 2 && e->id == subCommId) {
                    wire = e->wire;
                    found = true;
                    if (atomic_fetch_add(&e->readers, 1) + 2 == e->members)
                        atomic_store(&e->state, 0); /* every member has read it */
                }
            }
            if (found)
                break;
            if (sim_now_ns() > deadline)
                return hccl_error(HCCL_E_TIMEOUT, "%s: timed out waiting for rank %u (sub-rank 0 of sub-communicator "
                                  "%llu) to create it", api, rankIds[0], (unsigned long long)subCommId);
            if (hccl_comm_broken(parent))
                return hccl_error(HCCL_E_REMOTE, "%s: the parent communicator failed", api);
            if (sim_backoff_step(&backoff))
                usleep(200);
        }
    }
    err = hccl_comm_init(rankNum, &wire, subCommRankId, config, parent->device, comm_slot(parent, parent->rank)->node,
                         subComm);
    if (err == HCCL_SUCCESS) {
        hccl_comm_t *created = sim_handle_get(*subComm, SIM_KIND_COMM);
        created->is_subcomm = true;
    }
    return err;
}

/* --------------------------------------------------------------- destroy */

HCCL_API HcclResult HcclCommDestroy(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommDestroy", &err);
    if (comm == NULL)
        return err;
    int pending = atomic_load(&comm->pending);
    if (pending > 0)
        return hccl_error(HCCL_E_AGAIN, "HcclCommDestroy: '%s' still has %d operation%s in flight; synchronise its "
                          "streams and try again", comm->name, pending, pending == 1 ? "" : "s");
    sim_handle_free(handle);
    atomic_store(&comm_slot(comm, comm->rank)->state, SLOT_LEFT);
    hccl_wake(comm);
    hccl_comm_unref(comm);
    return HCCL_SUCCESS;
}

/* --------------------------------------------------------------- queries */

HCCL_API HcclResult HcclGetRankSize(HcclComm handle, uint32_t *rankSize)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetRankSize", &err);
    if (comm == NULL)
        return err;
    if (rankSize == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetRankSize: rankSize is NULL");
    *rankSize = comm->nranks;
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetRankId(HcclComm handle, uint32_t *rank)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetRankId", &err);
    if (comm == NULL)
        return err;
    if (rank == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetRankId: rank is NULL");
    *rank = comm->rank;
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetCommName(HcclComm handle, char *commName)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetCommName", &err);
    if (comm == NULL)
        return err;
    if (commName == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetCommName: commName is NULL");
    snprintf(commName, HCCL_SIM_NAME_BYTES, "%s", comm->name);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetCommAsyncError(HcclComm handle, HcclResult *asyncError)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetCommAsyncError", &err);
    if (comm == NULL)
        return err;
    if (asyncError == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetCommAsyncError: asyncError is NULL");
    HcclResult code = (HcclResult)atomic_load(&comm->async_error);
    HcclResult broken = hccl_comm_broken(comm);
    if (code == HCCL_SUCCESS && broken != HCCL_SUCCESS) {
        code = broken;
        seg_header_t *header = comm->header;
        hccl_error(code, "communicator '%s' failed on rank %d: %s", comm->name, (int)header->abort_rank,
                   atomic_load(&header->abort_text_ready) ? header->abort_text : "(no details)");
    } else if (code != HCCL_SUCCESS) {
        hccl_error(code, "%s", comm->async_text);
    }
    *asyncError = code;
    return HCCL_SUCCESS;
}

HCCL_API uint32_t HcclGetCommConfigCapability(void)
{
    return HCCL_COMM_CONFIG_RESERVED;
}

static _Atomic int32_t g_deterministic;

HCCL_API HcclResult HcclSetConfig(HcclConfig config, HcclConfigValue configValue)
{
    if (config != HCCL_DETERMINISTIC)
        return hccl_error(HCCL_E_PARA, "HcclSetConfig: unknown configuration item %d", (int)config);
    if (configValue.value < 0 || configValue.value > 2)
        return hccl_error(HCCL_E_PARA, "HcclSetConfig: HCCL_DETERMINISTIC takes 0, 1 or 2, got %d",
                          (int)configValue.value);
    /* The simulator always reduces in rank order: it is deterministic either way. */
    atomic_store(&g_deterministic, configValue.value);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetConfig(HcclConfig config, HcclConfigValue *configValue)
{
    if (configValue == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetConfig: configValue is NULL");
    if (config != HCCL_DETERMINISTIC)
        return hccl_error(HCCL_E_PARA, "HcclGetConfig: unknown configuration item %d", (int)config);
    configValue->value = atomic_load(&g_deterministic);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclCommSuspend(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommSuspend", &err);
    if (comm == NULL)
        return err;
    atomic_store(&comm->suspended, true);
    hccl_wake(comm); /* operations asleep in a wait notice at once */
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclCommResume(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommResume", &err);
    if (comm == NULL)
        return err;
    /* A suspension that stopped an operation in flight broke the communicator on every rank
     * (exec.c): nothing restores that, so Resume reports it instead of a success after which
     * every call fails.  The suspension is lifted all the same, so that later calls give the
     * same code and message as this one (the failure, not "suspended: call HcclCommResume"). */
    atomic_store(&comm->suspended, false);
    return hccl_comm_check_usable(comm, "HcclCommResume");
}

/* ------------------------------------------------------------------- fork */

void hccl_comm_after_fork(void)
{
    pthread_mutex_init(&g_created_lock, NULL);
    while (g_created != NULL) {
        created_t *entry = g_created;
        g_created = entry->next;
        close(entry->fd); /* the parent's segments are not ours to hand out */
        free(entry);
    }
}

void hccl_group_after_fork(void);

static void after_fork_in_child(void)
{
    hccl_comm_after_fork();
    hccl_group_after_fork();
}

__attribute__((constructor)) static void install_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}
