/* Communicators: root info, rendezvous, configuration, sub-communicators and
 * teardown.
 *
 * HcclGetRootInfo creates the communicator's control segment (a memfd) in the
 * calling process and writes into the root info where other processes can
 * open it (/proc/<pid>/fd/<fd>).  Each rank claims its slot in the segment,
 * announces its process, device and device-memory arena, and waits for the
 * others.  The creating process closes its descriptor once the root info is
 * no longer needed (see "root infos this process made"), so the memory goes
 * away with the last rank.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hccl/internal.h"
#include "hccl/net.h"

#define ROOTINFO_MAGIC "HPSROOT1"
#define SEG_MAGIC 0x3147455353504348ULL /* "HCPSSEG1" */
#define SEG_VERSION 6u /* 2: two descriptors and eager data per slot; 3: sub-communicator members, suspension;
                        * 4: the mapping phase of creation; 5: how the ranks joined (join_kind); 6: the calls of steps across servers */
#define DEFAULT_CONNECT_TIMEOUT_S 120.0
#define DEFAULT_EXEC_TIMEOUT_S 1836.0
#define DEFAULT_BUFFSIZE_MB HCCL_COMM_DEFAULT_BUFFSIZE

_Static_assert(sizeof(rootinfo_wire_t) <= HCCL_ROOT_INFO_BYTES, "root info does not fit");
_Static_assert(sizeof(seg_header_t) <= SEG_HEADER_BYTES, "segment header too large");

static double connect_timeout_s(void)
{
    return sim_env_seconds("HCCL_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S);
}

static int64_t connect_deadline(void)
{
    return sim_now_ns() + (int64_t)(connect_timeout_s() * 1e9);
}

/* ------------------------------------------------ root infos this process made
 *
 * A root info is the creating process's descriptor of the segment, which the ranks open
 * through /proc.  Like the rendezvous server real HCCL starts in HcclGetRootInfo, it lives only
 * as long as ranks may still come: it is released (the descriptor closed) as soon as its
 * communicator is formed, as soon as the communicator's creation has failed, and otherwise
 * HCCL_CONNECT_TIMEOUT (as set when HcclGetRootInfo ran) after it was made or after a rank last
 * joined with it, whichever is later.  A thread of this process watches the root infos it holds
 * (the creator need not be a rank, so it cannot count on a rank of its own to notice), and
 * exits when there are none.  A rank that uses a released root info is told why. */

#define REAPER_POLL_NS (200 * SIM_NS_PER_MS)
#define RETIRED_KEPT 64

enum { RETIRED_NONE = 0, RETIRED_FORMED, RETIRED_FAILED, RETIRED_EXPIRED };

typedef struct created {
    struct created *next;
    uint8_t token[16];
    int fd;
    seg_header_t *header;
    int64_t made_ns, timeout_ns;
} created_t;

/* The last root infos released, for a rank of this process that tries one afterwards. */
typedef struct {
    uint8_t token[16];
    int reason;
    double timeout_s;
} retired_t;

static pthread_mutex_t g_created_lock = PTHREAD_MUTEX_INITIALIZER;
static created_t *g_created;
static bool g_reaper_running;
static retired_t g_retired[RETIRED_KEPT];
static unsigned g_retired_next;

/* Called with g_created_lock held; `entry` is already unlinked. */
static void retire(created_t *entry, int reason)
{
    retired_t *r = &g_retired[g_retired_next++ % RETIRED_KEPT];
    memcpy(r->token, entry->token, 16);
    r->reason = reason;
    r->timeout_s = (double)entry->timeout_ns / 1e9;
    munmap(entry->header, SEG_HEADER_BYTES);
    close(entry->fd);
    free(entry);
}

/* Why a root info can go now, or RETIRED_NONE. */
static int retire_reason(const created_t *entry, int64_t now)
{
    seg_header_t *header = entry->header;
    uint32_t joined = atomic_load(&header->joined);
    uint32_t nranks = atomic_load(&header->nranks);
    if ((joined & SEG_JOIN_ABORTED) != 0 || atomic_load(&header->abort_code) != HCCL_SUCCESS)
        return RETIRED_FAILED;
    if (nranks != 0 && joined >= nranks)
        return RETIRED_FORMED;
    if (now - SIM_MAX(entry->made_ns, atomic_load(&header->last_join_ns)) > entry->timeout_ns)
        return RETIRED_EXPIRED;
    return RETIRED_NONE;
}

static void *reaper_main(void *arg)
{
    pthread_mutex_lock(&g_created_lock);
    while (g_created != NULL) {
        int64_t now = sim_now_ns(), wake = now + REAPER_POLL_NS;
        for (created_t **link = &g_created; *link != NULL;) {
            created_t *entry = *link;
            int reason = retire_reason(entry, now);
            if (reason != RETIRED_NONE) {
                *link = entry->next;
                retire(entry, reason);
                continue;
            }
            int64_t expiry = SIM_MAX(entry->made_ns, atomic_load(&entry->header->last_join_ns)) + entry->timeout_ns;
            wake = SIM_MIN(wake, expiry + 1);
            link = &entry->next;
        }
        if (g_created == NULL)
            break;
        pthread_mutex_unlock(&g_created_lock);
        int64_t nap = wake - sim_now_ns();
        if (nap > 0) {
            struct timespec ts = {(time_t)(nap / SIM_NS_PER_S), (long)(nap % SIM_NS_PER_S)};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&g_created_lock);
    }
    g_reaper_running = false;
    pthread_mutex_unlock(&g_created_lock);
    return arg;
}

/* Releases a root info this process holds (no-op otherwise), for `reason`. */
static void close_created(const uint8_t token[16], int reason)
{
    pthread_mutex_lock(&g_created_lock);
    for (created_t **link = &g_created; *link != NULL; link = &(*link)->next) {
        if (memcmp((*link)->token, token, 16) == 0) {
            created_t *entry = *link;
            *link = entry->next;
            retire(entry, reason);
            break;
        }
    }
    pthread_mutex_unlock(&g_created_lock);
}

/* The header of a segment this process still holds, or NULL (valid while g_created_lock is held). */
static seg_header_t *created_header(const uint8_t token[16])
{
    for (created_t *entry = g_created; entry != NULL; entry = entry->next)
        if (memcmp(entry->token, token, 16) == 0)
            return entry->header;
    return NULL;
}

bool hccl_root_info_pending(const rootinfo_wire_t *wire)
{
    pthread_mutex_lock(&g_created_lock);
    bool pending = false;
    for (created_t *entry = g_created; entry != NULL; entry = entry->next)
        if (memcmp(entry->token, wire->token, 16) == 0)
            pending = retire_reason(entry, sim_now_ns()) == RETIRED_NONE;
    pthread_mutex_unlock(&g_created_lock);
    return pending;
}

/* Why a root info of this process that cannot be opened any more was released ("" if unknown). */
static void retired_why(const uint8_t token[16], char *out, size_t len)
{
    out[0] = '\0';
    pthread_mutex_lock(&g_created_lock);
    for (unsigned i = 0; i < RETIRED_KEPT; i++) {
        const retired_t *r = &g_retired[i];
        if (r->reason == RETIRED_NONE || memcmp(r->token, token, 16) != 0)
            continue;
        if (r->reason == RETIRED_FORMED)
            snprintf(out, len, "the root info was already used: its communicator has been formed, and a root info "
                     "serves one communicator");
        else if (r->reason == RETIRED_FAILED)
            snprintf(out, len, "the root info was released when the creation of its communicator failed");
        else
            snprintf(out, len, "the root info expired: no rank joined with it within HCCL_CONNECT_TIMEOUT (%g s) "
                     "of HcclGetRootInfo", r->timeout_s);
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

    memcpy(entry->token, wire->token, 16);
    entry->fd = fd;
    entry->header = header; /* kept mapped: the reaper watches the communicator form */
    entry->made_ns = sim_now_ns();
    entry->timeout_ns = (int64_t)(connect_timeout_s() * 1e9);
    pthread_mutex_lock(&g_created_lock);
    entry->next = g_created;
    g_created = entry;
    if (!g_reaper_running) {
        /* Without the thread a root info is still released when its communicator forms or fails;
         * only the expiry of an unused one is lost. */
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        g_reaper_running = pthread_create(&thread, &attr, reaper_main, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&g_created_lock);
    return HCCL_SUCCESS;
}

static int get_root_info(HcclRootInfo *rootInfo, const char *api)
{
    /* Every way into HCCL starts here or at an initialisation: they report an unknown profile. */
    int err = hccl_profile_get(api, NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (rootInfo == NULL)
        return hccl_error(HCCL_E_PTR, "%s: rootInfo is NULL", api);
    rootinfo_wire_t wire;
    /* A job that spans servers meets over TCP (net.c); others in this machine's shared memory. */
    err = hccl_net_wanted() ? hccl_net_root_info(&wire) : hccl_get_root_info(&wire);
    if (err != HCCL_SUCCESS)
        return err;
    memset(rootInfo, 0, sizeof *rootInfo);
    memcpy(rootInfo->internal, &wire, sizeof wire);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)
{
    return get_root_info(rootInfo, "HcclGetRootInfo");
}

/* A root of the scalable bootstrap makes a root info like any other: the simulator's ranks need no
 * groups under their roots (HcclCommInitRootInfoScalable). */
HCCL_API HcclResult HcclGetRootInfoScalable(HcclRootInfo *rootInfo)
{
    return get_root_info(rootInfo, "HcclGetRootInfoScalable");
}

/* ------------------------------------------------------------ configuration */

typedef struct {
    char name[HCCL_SIM_NAME_BYTES];
    int64_t exec_timeout_ns; /* -1 = not set */
    uint32_t deterministic;  /* HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET = not set */
    uint32_t op_expansion;   /* 0 = default */
    uint32_t buffer_mb;      /* 0 = not set */
    char udi[UDI_MAX_LENGTH];
    char algo[HCCL_COMM_ALGO_MAX_LENGTH];
} parsed_config_t;

static double exec_timeout_from_env(void)
{
    return sim_env_seconds("HCCL_EXEC_TIMEOUT", DEFAULT_EXEC_TIMEOUT_S);
}

/* HCCL_BUFFSIZE: a whole number of MB, at least 1; the default (200) when unset or anything else. */
static uint32_t buffer_mb_from_env(void)
{
    const char *text = getenv("HCCL_BUFFSIZE");
    if (text == NULL || *text < '0' || *text > '9')
        return DEFAULT_BUFFSIZE_MB;
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || value < 1 || value > UINT32_MAX)
        return DEFAULT_BUFFSIZE_MB;
    return (uint32_t)value;
}

/* Copies a string field of a config, which need not be NUL-terminated within its `len` bytes. */
static void config_text(char *out, const char *field, size_t len)
{
    size_t n = strnlen(field, len);
    if (n == len)
        n = len - 1;
    memcpy(out, field, n);
    out[n] = '\0';
}

/* Reads the caller's HcclCommConfig the way the library does: by its size,
 * magic word and version, ignoring fields newer than the version. */
static int parse_config(const HcclCommConfig *config, const char *api, parsed_config_t *out)
{
    memset(out, 0, sizeof *out);
    out->exec_timeout_ns = -1;
    out->deterministic = HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET;
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
        out->deterministic = local.hcclDeterministic;
        if (local.hcclBufferSize != HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET)
            out->buffer_mb = local.hcclBufferSize;
    }
    if (version >= 2 && size > offsetof(HcclCommConfig, hcclCommName)) {
        if (memchr(local.hcclCommName, '\0', sizeof local.hcclCommName) == NULL)
            return hccl_error(HCCL_E_PARA, "%s: hcclCommName is not NUL-terminated within %zu bytes", api,
                              sizeof local.hcclCommName);
        snprintf(out->name, sizeof out->name, "%s", local.hcclCommName);
    }
    if (version >= 3 && size > offsetof(HcclCommConfig, hcclUdi))
        config_text(out->udi, local.hcclUdi, sizeof local.hcclUdi);
    if (version >= 8 && size > offsetof(HcclCommConfig, hcclAlgo))
        config_text(out->algo, local.hcclAlgo, sizeof local.hcclAlgo);
    /* 0 is the default; 1 to 6 name the products' modes (reference §2.7.6), which the simulator
     * accepts and ignores: it expands every operation itself. */
    if (version >= 4 && size > offsetof(HcclCommConfig, hcclOpExpansionMode) && local.hcclOpExpansionMode > 6)
        return hccl_error(HCCL_E_PARA, "%s: hcclOpExpansionMode must be in [0, 6], got %u", api,
                          local.hcclOpExpansionMode);
    if (version >= 4 && size > offsetof(HcclCommConfig, hcclOpExpansionMode))
        out->op_expansion = local.hcclOpExpansionMode;
    if (version >= 5 && size > offsetof(HcclCommConfig, hcclRdmaServiceLevel)) {
        if (local.hcclRdmaTrafficClass != HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET &&
            (local.hcclRdmaTrafficClass > 255 || local.hcclRdmaTrafficClass % 4 != 0))
            return hccl_error(HCCL_E_PARA, "%s: hcclRdmaTrafficClass must be a multiple of 4 in [0, 255], got %u",
                              api, local.hcclRdmaTrafficClass);
        if (local.hcclRdmaServiceLevel != HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET && local.hcclRdmaServiceLevel > 7)
            return hccl_error(HCCL_E_PARA, "%s: hcclRdmaServiceLevel must be in [0, 7], got %u", api,
                              local.hcclRdmaServiceLevel);
    }
    if (version >= 10 && size > offsetof(HcclCommConfig, hcclQos) && local.hcclQos != HCCL_COMM_QOS_CONFIG_NOT_SET &&
        local.hcclQos > 7)
        return hccl_error(HCCL_E_PARA, "%s: hcclQos must be in [0, 7] (or unset), got %u", api, local.hcclQos);
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

/* A communicator's name: the one its config chose, else one made from its root info's token. */
static void name_of(const char *chosen, const uint8_t token[16], char *out, size_t len)
{
    if (chosen[0] != '\0') {
        snprintf(out, len, "%s", chosen);
        return;
    }
    snprintf(out, len, "hcclpy_sim_");
    for (int i = 0; i < 8 && strlen(out) + 2 < len; i++)
        snprintf(out + strlen(out), 3, "%02x", token[i]);
}

int hccl_config_name(const HcclCommConfig *config, const uint8_t token[16], const char *api, char *out, size_t len)
{
    parsed_config_t parsed;
    int err = parse_config(config, api, &parsed);
    if (err == HCCL_SUCCESS)
        name_of(parsed.name, token, out, len);
    return err;
}

/* The HCCL_ALGO setting of a config: its hcclAlgo, else HCCL_ALGO, else "". */
static void algo_of(const parsed_config_t *parsed, char *out, size_t len)
{
    const char *env = getenv("HCCL_ALGO");
    snprintf(out, len, "%s", parsed->algo[0] != '\0' || env == NULL ? parsed->algo : env);
}

int hccl_config_algo(const HcclCommConfig *config, const char *api, char *out, size_t len)
{
    parsed_config_t parsed;
    int err = parse_config(config, api, &parsed);
    if (err == HCCL_SUCCESS)
        algo_of(&parsed, out, len);
    return err;
}

/* What a communicator takes from its config, else from the environment. */
static void apply_config(hccl_comm_t *comm, const parsed_config_t *parsed)
{
    double exec_s = exec_timeout_from_env();
    comm->exec_timeout_ns = parsed->exec_timeout_ns >= 0 ? parsed->exec_timeout_ns : (int64_t)(exec_s * 1e9);
    for (int item = 0; item < HCCL_CONFIG_RESERVED; item++)
        atomic_store(&comm->config[item], item == HCCL_DETERMINISTIC ? parsed->deterministic
                                                                     : HCCL_COMM_CONFIG_NOT_SET);
    comm->op_expansion = parsed->op_expansion;
    comm->buffer_mb = parsed->buffer_mb != 0 ? parsed->buffer_mb : buffer_mb_from_env();
    snprintf(comm->udi, sizeof comm->udi, "%s", parsed->udi);
    algo_of(parsed, comm->algo, sizeof comm->algo);
}

/* Communicator objects are never given back to malloc but kept for the next communicator: a
 * thread may have read an object's address from a handle just before another thread destroyed
 * it, and what it then touches (`refs`, to take a reference it gives back once it finds the
 * handle dead) must still be a communicator's (see hccl_comm_lookup).  What an object holds
 * is released as before, when its last reference goes. */
static pthread_mutex_t g_spare_lock = PTHREAD_MUTEX_INITIALIZER;
static hccl_comm_t *g_spare;

static hccl_comm_t *comm_alloc(void)
{
    pthread_mutex_lock(&g_spare_lock);
    hccl_comm_t *comm = g_spare;
    if (comm != NULL)
        g_spare = comm->next_spare;
    pthread_mutex_unlock(&g_spare_lock);
    if (comm == NULL) {
        comm = calloc(1, sizeof *comm);
        if (comm == NULL)
            return NULL;
    } else {
        /* Everything after `refs`, which is 0 and stays untouched until the store below. */
        size_t keep = offsetof(hccl_comm_t, next_spare);
        memset((char *)comm + keep, 0, sizeof *comm - keep);
    }
    pthread_mutex_init(&comm->lock, NULL);
    atomic_store(&comm->refs, 1);
    return comm;
}

static void comm_free(hccl_comm_t *comm)
{
    hccl_net_free(comm->net);
    comm->net = NULL;
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
    comm->peer_base = NULL;
    comm->segment = NULL;
    pthread_mutex_lock(&g_spare_lock);
    comm->next_spare = g_spare;
    g_spare = comm;
    pthread_mutex_unlock(&g_spare_lock);
}

void hccl_comm_unref(hccl_comm_t *comm)
{
    if (atomic_fetch_sub(&comm->refs, 1) == 1)
        comm_free(comm);
}

/* The handle's own reference lives until HcclCommDestroy; the lookup takes one more, only while
 * the object still has some (a free object has none, and nobody revives it but comm_alloc), and
 * then checks that the handle still names this object: it may have been destroyed, and the
 * object reused, between the two reads. */
hccl_comm_t *hccl_comm_lookup(HcclComm handle, const char *api, int *err)
{
    if (handle == NULL) {
        *err = hccl_error(HCCL_E_PTR, "%s: comm is NULL", api);
        return NULL;
    }
    hccl_comm_t *comm = sim_handle_get(handle, SIM_KIND_COMM);
    if (comm != NULL) {
        int refs = atomic_load(&comm->refs);
        do {
            if (refs <= 0) {
                comm = NULL;
                break;
            }
        } while (!atomic_compare_exchange_weak(&comm->refs, &refs, refs + 1));
    }
    if (comm != NULL && sim_handle_get(handle, SIM_KIND_COMM) != comm) {
        hccl_comm_unref(comm);
        comm = NULL;
    }
    if (comm == NULL)
        *err = hccl_error(HCCL_E_PARA, "%s: %p is not a live communicator (never created, or destroyed)", api, handle);
    return comm;
}

/* ------------------------------------------------- names of live communicators
 *
 * hcclCommName must be unique (reference §2.7.6): a process refuses a second live communicator
 * with the name of one it has.  The ranks of one communicator that one process drives (threads,
 * HcclCommInitAll) share its name: they have the same segment token.  A name is taken when the
 * communicator is formed and given back by HcclCommDestroy. */
static pthread_mutex_t g_names_lock = PTHREAD_MUTEX_INITIALIZER;
static hccl_comm_t *g_named;

/* The live communicator named `name` other than that of segment `token` (NULL: any); lock held. */
static hccl_comm_t *named_other(const char *name, const uint8_t *token)
{
    for (hccl_comm_t *c = g_named; c != NULL; c = c->next_named)
        if (strcmp(c->name, name) == 0 && (token == NULL || memcmp(c->header->token, token, 16) != 0))
            return c;
    return NULL;
}

static int name_refused(const char *api, const char *name)
{
    return hccl_error(HCCL_E_PARA, "%s: hcclCommName '%s' is the name of another live communicator of this "
                      "process; names must be unique (destroy that one first, or pick another name)", api, name);
}

/* HCCL_E_PARA if another live communicator has the name a rank asks for. */
static int name_check(const char *api, const char *name, const uint8_t token[16])
{
    if (name[0] == '\0')
        return HCCL_SUCCESS;
    pthread_mutex_lock(&g_names_lock);
    bool taken = named_other(name, token) != NULL;
    pthread_mutex_unlock(&g_names_lock);
    return taken ? name_refused(api, name) : HCCL_SUCCESS;
}

static int name_take(const char *api, hccl_comm_t *comm)
{
    pthread_mutex_lock(&g_names_lock);
    bool taken = named_other(comm->name, comm->header->token) != NULL;
    if (!taken) {
        comm->next_named = g_named;
        g_named = comm;
        comm->named = true;
    }
    pthread_mutex_unlock(&g_names_lock);
    return taken ? name_refused(api, comm->name) : HCCL_SUCCESS;
}

static void name_give_back(hccl_comm_t *comm)
{
    pthread_mutex_lock(&g_names_lock);
    for (hccl_comm_t **link = &g_named; comm->named && *link != NULL; link = &(*link)->next_named) {
        if (*link == comm) {
            *link = comm->next_named;
            comm->named = false;
            break;
        }
    }
    pthread_mutex_unlock(&g_names_lock);
}

HcclComm hccl_comm_find_name(const char *name)
{
    int device = -1;
    if (sim_current_device(&device) != 0)
        device = -1; /* no current device: any rank of that name will do */
    HcclComm handle = NULL;
    pthread_mutex_lock(&g_names_lock);
    for (hccl_comm_t *c = g_named; c != NULL; c = c->next_named) {
        if (strcmp(c->name, name) != 0)
            continue;
        if (handle == NULL || c->device == device)
            handle = c->handle;
        if (c->device == device)
            break;
    }
    pthread_mutex_unlock(&g_names_lock);
    return handle;
}

/* Called after publishing anything a waiter looks at.  Waiters that may
 * sleep count themselves in `sleepers` before they look a last time
 * (hccl_op_run), so with the fence either they see what was published or this
 * sees them; with nobody counted, the shared epoch word is left alone. */
static void header_wake(seg_header_t *header)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&header->sleepers) != 0) {
        atomic_fetch_add(&header->epoch, 1);
        sim_futex_wake(&header->epoch, true);
    }
}

void hccl_wake(hccl_comm_t *comm)
{
    header_wake(comm->header);
}

void hccl_publish(hccl_comm_t *comm, uint64_t progress)
{
    atomic_store_explicit(&comm_slot(comm, comm->rank)->progress, progress, memory_order_release);
    hccl_wake(comm);
}

/* Records why the communicator broke (the first failure wins) and wakes its waiters. */
static void segment_vabort(seg_header_t *header, int32_t rank, HcclResult code, const char *fmt, va_list ap)
{
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong(&header->abort_code, &expected, (uint32_t)code)) {
        vsnprintf(header->abort_text, sizeof header->abort_text, fmt, ap);
        header->abort_rank = rank;
        atomic_store(&header->abort_text_ready, 1);
    }
    header_wake(header);
}

/* Why the communicator broke. The rank whose failure won writes the text just after the code, so
 * a reader that sees the code may be a moment early: it waits for the text (briefly: the writer
 * is between two stores). */
const char *hccl_abort_text(seg_header_t *header)
{
    for (int i = 0; i < 1000 && !atomic_load(&header->abort_text_ready); i++)
        usleep(100);
    return atomic_load(&header->abort_text_ready) ? header->abort_text : "(no details)";
}

void hccl_comm_abort(hccl_comm_t *comm, HcclResult code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    segment_vabort(comm->header, (int32_t)comm->rank, code, fmt, ap);
    va_end(ap);
    /* Across servers the segment is this rank's alone: the other ranks are told over TCP. */
    if (comm->net != NULL)
        hccl_net_shutdown(comm->net, code, hccl_abort_text(comm->header));
}

void hccl_comm_abort_as(hccl_comm_t *comm, uint32_t rank, HcclResult code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    segment_vabort(comm->header, (int32_t)rank, code, fmt, ap);
    va_end(ap);
}

/* Stops a communicator that is still being formed, so that the ranks waiting for it fail at once
 * instead of at HCCL_CONNECT_TIMEOUT.  Once every rank has joined, the communicator is formed
 * and is left alone (false): the ranks may already be using it.  The check and the stop are one
 * change of `joined`, so a rank joining at the same moment either completes the communicator
 * first or finds it stopped. */
static bool abort_forming(seg_header_t *header, int32_t rank, HcclResult code, const char *fmt, ...)
    SIM_PRINTF(4, 5);
static bool abort_forming(seg_header_t *header, int32_t rank, HcclResult code, const char *fmt, ...)
{
    uint32_t joined = atomic_load(&header->joined);
    do {
        if ((joined & SEG_JOIN_ABORTED) != 0)
            break;
        uint32_t nranks = atomic_load(&header->nranks);
        if (nranks != 0 && joined >= nranks)
            return false;
    } while (!atomic_compare_exchange_weak(&header->joined, &joined, joined | SEG_JOIN_ABORTED));
    va_list ap;
    va_start(ap, fmt);
    segment_vabort(header, rank, code, fmt, ap);
    va_end(ap);
    return true;
}

void hccl_root_info_abandon(const rootinfo_wire_t *wire, HcclResult code, const char *why)
{
    pthread_mutex_lock(&g_created_lock);
    seg_header_t *header = created_header(wire->token);
    if (header != NULL)
        abort_forming(header, -1, code, "%s", why);
    pthread_mutex_unlock(&g_created_lock);
    close_created(wire->token, RETIRED_FAILED);
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
    const char *why = hccl_abort_text(header); /* first: the failing rank is written with it */
    /* Another rank's failure is a remote error here (as for operations in flight). */
    if (broken != HCCL_E_TIMEOUT && header->abort_rank != (int32_t)comm->rank)
        broken = HCCL_E_REMOTE;
    return hccl_error(broken, "%s: communicator '%s' has failed (rank %d: %s); destroy it and create a new one", api,
                      comm->name, (int)header->abort_rank, why);
}

/* Why the segment a root info names cannot be used any more. */
static int stale_root_info(const rootinfo_wire_t *wire)
{
    char why[256] = "";
    if (wire->pid == getpid())
        retired_why(wire->token, why, sizeof why);
    if (why[0] != '\0')
        return hccl_error(HCCL_E_UNAVAIL, "%s; make a new one with HcclGetRootInfo", why);
    return hccl_error(HCCL_E_UNAVAIL, "the root info is no longer valid: it expired or was already used (the process "
                      "that made it, pid %d, releases it once its communicator is formed or has failed, or "
                      "HCCL_CONNECT_TIMEOUT after it was made or a rank last joined with it); make a new one with "
                      "HcclGetRootInfo", (int)wire->pid);
}

/* Opens the segment named by the root info and maps its header. */
static int open_segment(const rootinfo_wire_t *wire, int *fd_out, seg_header_t **header_out)
{
    if (memcmp(wire->magic, ROOTINFO_MAGIC, sizeof wire->magic) != 0)
        return hccl_error(HCCL_E_PARA, "the root info was not produced by HcclGetRootInfo of this simulator");
    if (memchr(wire->node, '\0', sizeof wire->node) == NULL)
        return hccl_error(HCCL_E_PARA, "the root info is damaged: its host name is not terminated");
    if (strcmp(wire->node, sim_config()->node) != 0)
        return hccl_error(HCCL_E_NOT_SUPPORT, "the root info was made for the ranks of server '%s', and this rank is "
                          "on server '%s': for a job across servers, make the root info in a process that knows "
                          "the job spans servers (HCCLPY_SIM_SERVER set, or started by a launcher of several "
                          "nodes), and its ranks meet over TCP", wire->node, sim_config()->node);
    if (!sim_process_alive(wire->pid, wire->start_time))
        return hccl_error(HCCL_E_UNAVAIL, "the process that created the root info (pid %d) has exited",
                          (int)wire->pid);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)wire->pid, (int)wire->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return stale_root_info(wire);
    /* A released root info's descriptor number may since name any file: reading a mapping past the
     * end of the file raises SIGBUS, so anything shorter than a segment header is refused before it
     * is mapped. */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)SEG_HEADER_BYTES) {
        close(fd);
        return stale_root_info(wire);
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
        return stale_root_info(wire);
    }
    *fd_out = fd;
    *header_out = header;
    return HCCL_SUCCESS;
}

bool hccl_root_info_used(const rootinfo_wire_t *wire, char *why, size_t why_len)
{
    int fd;
    seg_header_t *header;
    if (open_segment(wire, &fd, &header) != HCCL_SUCCESS) {
        snprintf(why, why_len, "%s", sim_error_text());
        return true;
    }
    uint32_t joined = atomic_load(&header->joined), nranks = atomic_load(&header->nranks);
    bool formed = (joined & SEG_JOIN_ABORTED) == 0 && nranks != 0 && joined >= nranks;
    if (formed)
        snprintf(why, why_len, "its communicator has already been formed");
    munmap(header, SEG_HEADER_BYTES);
    close(fd);
    return formed;
}

static uint64_t round_up(uint64_t value, uint64_t to)
{
    return (value + to - 1) / to * to;
}

/* Sizes the segment for `nranks` (first rank) or checks the size (others).  A rank that cannot
 * agree stops the communicator: the others would only wait for it until HCCL_CONNECT_TIMEOUT. */
static int agree_on_layout(seg_header_t *header, int fd, uint32_t nranks, uint32_t rank, uint64_t join_kind,
                           int64_t deadline)
{
    /* Every rank joins the same way: all with the one root info, or all with the same
     * rootInfoList of HcclCommInitRootInfoScalable. */
    uint64_t kind = 0, mine = join_kind != 0 ? join_kind : HCCL_SIM_JOIN_ROOT_INFO;
    if (!atomic_compare_exchange_strong(&header->join_kind, &kind, mine) && kind != mine) {
        int err;
        if (kind == HCCL_SIM_JOIN_ROOT_INFO || mine == HCCL_SIM_JOIN_ROOT_INFO)
            err = hccl_error(HCCL_E_PARA, "rank %u joined with %s, but another rank of this communicator joined "
                             "with %s: all ranks must initialise it the same way", rank,
                             mine == HCCL_SIM_JOIN_ROOT_INFO ? "one root info" : "HcclCommInitRootInfoScalable",
                             kind == HCCL_SIM_JOIN_ROOT_INFO ? "one root info" : "HcclCommInitRootInfoScalable");
        else
            err = hccl_error(HCCL_E_PARA, "rank %u passed HcclCommInitRootInfoScalable a rootInfoList (or nRoot) that "
                             "differs from another rank's: all ranks must pass the same root infos in the same "
                             "order", rank);
        abort_forming(header, (int32_t)rank, HCCL_E_PARA, "%s", sim_error_text());
        return err;
    }
    uint32_t expected = 0;
    if (atomic_compare_exchange_strong(&header->nranks, &expected, nranks)) {
        uint64_t slot = sizeof(slot_head_t) + 8 * slot_vector_words(nranks) +
                        (sizeof(p2p_out_t) + sizeof(p2p_in_t)) * (uint64_t)nranks;
        header->slot_bytes = round_up(slot, 4096);
        header->total_bytes = SEG_HEADER_BYTES + header->slot_bytes * nranks;
        if (ftruncate(fd, (off_t)header->total_bytes) != 0) {
            int err = hccl_error(HCCL_E_SYSCALL, "sizing the communicator's control segment failed: %s",
                                 strerror(errno));
            abort_forming(header, (int32_t)rank, HCCL_E_SYSCALL, "rank %u: %s", rank, sim_error_text());
            return err;
        }
        atomic_store_explicit(&header->layout_ready, 1, memory_order_release);
        return HCCL_SUCCESS;
    }
    if (expected != nranks) {
        int err = hccl_error(HCCL_E_PARA, "rank %u passed nRanks=%u, but another rank of this communicator passed %u",
                             rank, nranks, expected);
        abort_forming(header, (int32_t)rank, HCCL_E_PARA, "%s", sim_error_text());
        return err;
    }
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    while (atomic_load_explicit(&header->layout_ready, memory_order_acquire) == 0) {
        if (sim_now_ns() > deadline)
            return hccl_error(HCCL_E_TIMEOUT, "timed out waiting for the communicator's first rank to set it up");
        if (atomic_load(&header->abort_code) != HCCL_SUCCESS)
            return hccl_error(HCCL_E_REMOTE, "communicator initialisation failed on another rank: %s",
                              hccl_abort_text(header));
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
    for (;;) {
        uint32_t joined = atomic_load_explicit(&header->joined, memory_order_acquire);
        if ((joined & SEG_JOIN_ABORTED) == 0 && joined >= comm->nranks)
            return HCCL_SUCCESS;
        int64_t now = sim_now_ns();
        HcclResult code = (HcclResult)atomic_load(&header->abort_code);
        /* A stop by abort_forming sets SEG_JOIN_ABORTED a moment before its reason: wait for it. */
        if (code != HCCL_SUCCESS && atomic_load(&header->abort_text_ready))
            /* The ranks disagreeing about the call is every rank's parameter error. */
            return hccl_error(code == HCCL_E_PARA ? HCCL_E_PARA : HCCL_E_REMOTE,
                              "communicator initialisation failed on another rank: %s", header->abort_text);
        if (now > deadline) {
            char missing[256] = "";
            size_t used = 0;
            /* Never joined: a rank that joined and then gave up (its own deadline came a moment
             * before this one's) is not what the job waits for. */
            for (uint32_t r = 0; r < comm->nranks && used < sizeof missing - 16; r++)
                if (atomic_load(&comm_slot(comm, r)->state) < SLOT_JOINED)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%u", used ? ", " : "", r);
            return hccl_error(HCCL_E_TIMEOUT, "communicator initialisation timed out after HCCL_CONNECT_TIMEOUT: "
                              "%u of %u ranks joined; missing rank(s) %s", joined & ~SEG_JOIN_ABORTED,
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
}

/* Waits until every rank has mapped its peers' device memory.  A rank maps a peer's memory
 * through the peer's process (/proc/<pid>/fd), and once mapped the memory outlives that process:
 * only when all ranks have mapped all memory may any of them return, and so perhaps destroy the
 * communicator and exit.  A rank that dies before it has mapped fails the others at once. */
static int wait_for_mapped(hccl_comm_t *comm, int64_t deadline)
{
    seg_header_t *header = comm->header;
    sim_backoff_t backoff;
    sim_backoff_init(&backoff);
    int64_t next_check = 0;
    for (;;) {
        if (atomic_load_explicit(&header->mapped, memory_order_acquire) >= comm->nranks)
            return HCCL_SUCCESS;
        int64_t now = sim_now_ns();
        HcclResult code = (HcclResult)atomic_load(&header->abort_code);
        if (code != HCCL_SUCCESS)
            return hccl_error(HCCL_E_REMOTE, "communicator initialisation failed on another rank: %s",
                              hccl_abort_text(header));
        bool late = now > deadline;
        if (late || now > next_check) {
            char missing[256] = "";
            size_t used = 0;
            for (uint32_t r = 0; r < comm->nranks; r++) {
                slot_head_t *slot = comm_slot(comm, r);
                if (atomic_load_explicit(&slot->mapped, memory_order_acquire))
                    continue;
                /* Its flag is read again once it is seen gone: between the first read and the
                 * look at its process, it may have mapped, seen every rank done and exited (this
                 * thread descheduled meanwhile). A rank sets its flag before it can exit. */
                if (!sim_process_alive(slot->pid, slot->start_time) &&
                    !atomic_load_explicit(&slot->mapped, memory_order_acquire))
                    return hccl_error(HCCL_E_REMOTE, "rank %u (pid %d) exited during communicator initialisation",
                                      r, (int)slot->pid);
                if (used < sizeof missing - 16)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%u", used ? ", " : "", r);
            }
            if (late)
                return hccl_error(HCCL_E_TIMEOUT, "communicator initialisation timed out after HCCL_CONNECT_TIMEOUT: "
                                  "every rank joined, but rank(s) %s did not finish connecting", missing);
            next_check = now + 50 * SIM_NS_PER_MS;
        }
        if (sim_backoff_step(&backoff))
            usleep(200);
    }
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
                                  "HCCLPY_SIM_SERVER)", a, b, (int)sa->device_physical, sa->node);
        }
    }
    return HCCL_SUCCESS;
}

static bool cores_oversubscribed(uint32_t local_ranks)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 && (long)local_ranks > cores;
}

/* A rank's part of creating a communicator; `api` names the call in messages. */
int hccl_comm_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                   const HcclCommConfig *config, uint64_t join_kind, int device, const char *node, HcclComm *out)
{
    if (hccl_net_is_wire(wire))
        return hccl_net_init(api, nranks, wire, rank, config, device, node, out);
    if (nranks == 0 || nranks > HCCL_SIM_MAX_RANKS)
        return hccl_error(HCCL_E_PARA, "%s: nRanks must be in [1, %u], got %u", api, HCCL_SIM_MAX_RANKS, nranks);
    if (rank >= nranks)
        return hccl_error(HCCL_E_PARA, "%s: rank %u is out of range for nRanks=%u", api, rank, nranks);
    parsed_config_t parsed;
    int err = parse_config(config, api, &parsed);
    if (err != HCCL_SUCCESS)
        return err;
    err = name_check(api, parsed.name, wire->token);
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
    err = agree_on_layout(header, fd, nranks, rank, join_kind, deadline);
    if (err != HCCL_SUCCESS) {
        bool failed = atomic_load(&header->abort_code) != HCCL_SUCCESS;
        munmap(header, SEG_HEADER_BYTES);
        close(fd);
        if (failed)
            close_created(wire->token, RETIRED_FAILED);
        return err;
    }
    uint64_t total = header->total_bytes;
    munmap(header, SEG_HEADER_BYTES);
    char *segment = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (segment == MAP_FAILED)
        return hccl_error(HCCL_E_SYSCALL, "%s: mapping the control segment failed: %s", api, strerror(map_errno));

    hccl_comm_t *comm = comm_alloc();
    if (comm == NULL) {
        munmap(segment, total);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
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
        hccl_comm_unref(comm);
        return hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
    apply_config(comm, &parsed);

    slot_head_t *slot = comm_slot(comm, rank);
    uint32_t expected = SLOT_FREE;
    if (!atomic_compare_exchange_strong(&slot->state, &expected, SLOT_CLAIMED)) {
        hccl_comm_unref(comm);
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
    atomic_store(&comm->header->last_join_ns, sim_now_ns());
    atomic_fetch_add(&comm->header->joined, 1);
    hccl_wake(comm);

    err = wait_for_ranks(comm, deadline);
    if (err == HCCL_SUCCESS)
        err = check_devices(comm);
    /* Every rank has the segment mapped now (or will never come). */
    close_created(wire->token, err == HCCL_SUCCESS ? RETIRED_FORMED : RETIRED_FAILED);
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
    if (err == HCCL_SUCCESS) {
        atomic_store_explicit(&slot->mapped, 1, memory_order_release);
        atomic_fetch_add_explicit(&comm->header->mapped, 1, memory_order_acq_rel);
        hccl_wake(comm);
        err = wait_for_mapped(comm, deadline);
    }
    if (err != HCCL_SUCCESS) {
        char text[512];
        snprintf(text, sizeof text, "%s", sim_error_text());
        hccl_comm_abort(comm, (HcclResult)err, "rank %u failed to initialise: %s", rank, text);
        atomic_store(&slot->state, SLOT_LEFT);
        hccl_comm_unref(comm);
        hccl_error((HcclResult)err, "%s", text);
        return err;
    }
    comm->oversubscribed = cores_oversubscribed(local_ranks);
    name_of(comm_slot(comm, 0)->name, wire->token, comm->name, sizeof comm->name);
    /* The name is taken once there is a handle for a lookup by name to find. */
    comm->handle = sim_handle_new(SIM_KIND_COMM, comm);
    err = comm->handle == NULL ? hccl_error(HCCL_E_MEMORY, "%s: too many live handles", api) : name_take(api, comm);
    if (err != HCCL_SUCCESS) {
        char text[512];
        snprintf(text, sizeof text, "%s", sim_error_text());
        hccl_comm_abort(comm, (HcclResult)err, "rank %u failed to initialise: %s", rank, text);
        atomic_store(&slot->state, SLOT_LEFT);
        if (comm->handle != NULL)
            sim_handle_free(comm->handle);
        hccl_comm_unref(comm);
        hccl_error((HcclResult)err, "%s", text);
        return err;
    }
    *out = comm->handle;
    return HCCL_SUCCESS;
}

/* The communicator of a rank whose communicator spans servers (net.c has formed `net`): checked
 * and named as any other, with a segment of its own that no other process maps (its header keeps
 * the failure record; its ranks' slots are never read). */
int hccl_comm_new_spanning(const char *api, uint32_t nranks, uint32_t rank, int device, const HcclCommConfig *config,
                           const uint8_t token[16], hccl_net_t *net, HcclComm *out)
{
    parsed_config_t parsed;
    int err = parse_config(config, api, &parsed);
    if (err == HCCL_SUCCESS)
        err = name_check(api, parsed.name, token);
    hccl_comm_t *comm = err == HCCL_SUCCESS ? comm_alloc() : NULL;
    if (comm == NULL) {
        hccl_net_free(net);
        return err != HCCL_SUCCESS ? err : hccl_error(HCCL_E_MEMORY, "%s: out of host memory", api);
    }
    comm->net = net;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    comm->segment_bytes = SEG_HEADER_BYTES + 4096;
    comm->segment = mmap(NULL, comm->segment_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (comm->segment == MAP_FAILED) {
        comm->segment = NULL;
        hccl_comm_unref(comm);
        return hccl_error(HCCL_E_MEMORY, "%s: out of memory", api);
    }
    comm->header = (seg_header_t *)comm->segment;
    comm->header->nranks = nranks;
    memcpy(comm->header->token, token, 16);
    apply_config(comm, &parsed);
    name_of(parsed.name, token, comm->name, sizeof comm->name);
    comm->handle = sim_handle_new(SIM_KIND_COMM, comm);
    err = comm->handle == NULL ? hccl_error(HCCL_E_MEMORY, "%s: too many live handles", api) : name_take(api, comm);
    if (err != HCCL_SUCCESS) {
        if (comm->handle != NULL)
            sim_handle_free(comm->handle);
        hccl_net_shutdown(net, (HcclResult)err, sim_error_text());
        hccl_comm_unref(comm);
        return err;
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
        return hccl_group_add_init(api, nRanks, &wire, rank, config, HCCL_SIM_JOIN_ROOT_INFO, device, comm);
    return hccl_comm_init(api, nRanks, &wire, rank, config, HCCL_SIM_JOIN_ROOT_INFO, device, NULL, comm);
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

/* The scalable bootstrap: nRoot roots each made a root info (HcclGetRootInfoScalable), and every
 * rank passes the same list.  On real HCCL the ranks form nRoot groups, each joining through its
 * root, and the roots connect to each other; the simulator's ranks all reach one another's memory,
 * so they all join through the first root info, after checking the whole list, and the ranks
 * compare the lists they passed (join_kind, agree_on_layout).  No rank joins with the other root
 * infos: the process that made them releases them. */
HCCL_API HcclResult HcclCommInitRootInfoScalable(uint32_t nRanks, uint32_t nRoot, const HcclRootInfo *rootInfoList,
                                                 uint32_t rank, uint32_t nExtRoot, const HcclCommConfig *config,
                                                 HcclComm *comm)
{
    const char *api = "HcclCommInitRootInfoScalable";
    int err = hccl_profile_get(api, NULL);
    if (err != HCCL_SUCCESS)
        return err;
    if (rootInfoList == NULL || config == NULL || comm == NULL)
        return hccl_error(HCCL_E_PTR, "%s: %s is NULL", api,
                          rootInfoList == NULL ? "rootInfoList" : config == NULL ? "config" : "comm");
    if (nRoot == 0 || nRoot > nRanks)
        return hccl_error(HCCL_E_PARA, "%s: nRoot must be in [1, nRanks] = [1, %u], got %u", api, nRanks, nRoot);
    if (nExtRoot != 0)
        return hccl_error(HCCL_E_PARA, "%s: nExtRoot is reserved and must be 0, got %u", api, nExtRoot);
    int device;
    err = current_device(api, &device);
    if (err != HCCL_SUCCESS)
        return err;
    /* FNV-1a over nRoot and the roots' tokens, in list order; never 0 (nobody joined yet) nor
     * HCCL_SIM_JOIN_ROOT_INFO. */
    uint64_t digest = 0xcbf29ce484222325ULL;
    for (int b = 0; b < 4; b++)
        digest = (digest ^ ((nRoot >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
    for (uint32_t i = 0; i < nRoot; i++) {
        const rootinfo_wire_t *wire = (const rootinfo_wire_t *)rootInfoList[i].internal;
        if (memcmp(wire->magic, ROOTINFO_MAGIC, sizeof wire->magic) != 0 && !hccl_net_is_wire(wire))
            return hccl_error(HCCL_E_PARA, "%s: rootInfoList[%u] was not produced by HcclGetRootInfoScalable of this "
                              "simulator", api, i);
        for (uint32_t j = 0; j < i; j++)
            if (memcmp(((const rootinfo_wire_t *)rootInfoList[j].internal)->token, wire->token, 16) == 0)
                return hccl_error(HCCL_E_PARA, "%s: rootInfoList[%u] and rootInfoList[%u] are the same root info: "
                                  "each of the nRoot roots calls HcclGetRootInfoScalable once", api, j, i);
        for (int b = 0; b < 16; b++)
            digest = (digest ^ wire->token[b]) * 0x100000001b3ULL;
    }
    digest |= 2;
    rootinfo_wire_t first;
    memcpy(&first, rootInfoList[0].internal, sizeof first);
    if (hccl_group_active())
        err = hccl_group_add_init(api, nRanks, &first, rank, config, digest, device, comm);
    else
        err = hccl_comm_init(api, nRanks, &first, rank, config, digest, device, NULL, comm);
    for (uint32_t i = 1; i < nRoot; i++) {
        rootinfo_wire_t other;
        memcpy(&other, rootInfoList[i].internal, sizeof other);
        if (hccl_root_info_pending(&other))
            close_created(other.token, RETIRED_FORMED);
    }
    return err;
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
    /* Everything this rank can check alone is checked before rank 0 starts serving a root info
     * the others would wait on. */
    hccl_rank_table_t table;
    err = hccl_rank_table_read(clusterInfo, rank, &table);
    if (err != HCCL_SUCCESS)
        return err;
    if (table.device != sim_device_physical(device))
        return hccl_error(HCCL_E_PARA, "%s: the rank table puts rank %u on device %d, but this thread's current "
                          "device is %d (physical %d)", api, rank, table.device, device, sim_device_physical(device));
    rootinfo_wire_t wire;
    rank_table_server_t *server = NULL;
    err = hccl_rank_table_rendezvous(&table, rank, &wire, &server);
    if (err != HCCL_SUCCESS)
        return err;
    err = hccl_comm_init(api, table.nranks, &wire, rank, config, HCCL_SIM_JOIN_ROOT_INFO, device, table.node, comm);
    /* Rank 0: every other rank has the root info once the communicator is formed, and none must
     * get it once it has failed; the socket's name is then free for the next attempt. */
    bool lead = server != NULL;
    hccl_rank_table_stop(server);
    if (err != HCCL_SUCCESS && lead) {
        char why[600];
        snprintf(why, sizeof why, "rank 0 of the rank table failed: %s", sim_error_text());
        hccl_root_info_abandon(&wire, HCCL_E_REMOTE, why);
    }
    return err;
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
    job->err = hccl_comm_init(job->api, job->nranks, &job->wire, job->rank, job->has_config ? &job->config : NULL,
                         job->join_kind, job->device, NULL, &job->comm);
    if (job->err != HCCL_SUCCESS)
        snprintf(job->text, sizeof job->text, "%s", sim_error_text());
    /* The device was set only for the initialisation: the communicator keeps the device's memory
     * (which a reset does not take away), and a reference left here would keep the caller's own
     * aclrtResetDevice from releasing the device. */
    if (job->set_device)
        aclrtResetDevice(job->device);
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
        jobs[i].api = api;
    }
    err = hccl_run_init_jobs(jobs, ndev);
    if (err == HCCL_SUCCESS)
        for (uint32_t i = 0; i < ndev; i++)
            comms[i] = jobs[i].comm;
    close_created(wire.token, err == HCCL_SUCCESS ? RETIRED_FORMED : RETIRED_FAILED);
    free(jobs);
    return err;
}

/* ------------------------------------------------------- sub-communicators
 *
 * Sub-rank 0 makes the sub-communicator's root info, writes the member list (parent ranks) into
 * the new segment's header and posts (subCommId, root info) in the parent's segment; the other
 * members find the entry by id, compare the list with their own rankIds and join.  An id names
 * one sub-communicator at a time: a member that finds the id posted with another list, and a
 * sub-rank 0 that finds it posted by another, fail with HCCL_E_PARA naming both lists, and so
 * does the sub-communicator they found if they are among its members (it cannot form without
 * them), so its other members fail at once too.  Ranks that have not reached the call yet find
 * nothing and give up at HCCL_CONNECT_TIMEOUT.  Only entries of sub-communicators still forming
 * count: one that has formed or failed stays posted a moment after, until its creator withdraws
 * it. */

#define SHOWN_RANKS 16

static void format_ranks(char *out, size_t len, const uint32_t *ranks, uint32_t n)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (uint32_t i = 0; i < n && i < SHOWN_RANKS && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%u", i ? ", " : "", ranks[i]);
    if (n > SHOWN_RANKS && used < len)
        used += (size_t)snprintf(out + used, len - used, ", ... (%u ranks)", n);
    if (used < len)
        snprintf(out + used, len - used, "]");
}

static bool lists_rank(const uint32_t *ranks, uint32_t n, uint32_t rank)
{
    for (uint32_t i = 0; i < n; i++)
        if (ranks[i] == rank)
            return true;
    return false;
}

/* Copies a posted entry; false if there is none or it changed meanwhile. */
static bool read_entry(const subcomm_entry_t *e, subcomm_entry_t *copy, uint32_t *seq_out)
{
    uint32_t seq = atomic_load_explicit(&e->seq, memory_order_acquire);
    if ((seq & 1) != 0 || atomic_load_explicit(&e->state, memory_order_acquire) != SUBCOMM_POSTED)
        return false;
    copy->id = e->id;
    copy->members = e->members;
    copy->creator = e->creator;
    memcpy(&copy->wire, &e->wire, sizeof copy->wire);
    atomic_thread_fence(memory_order_acquire);
    *seq_out = seq;
    return atomic_load_explicit(&e->seq, memory_order_relaxed) == seq;
}

static subcomm_entry_t *post_entry(seg_header_t *header, uint64_t id, uint32_t members, uint32_t creator,
                                   const rootinfo_wire_t *wire)
{
    for (int i = 0; i < SEG_SUBCOMM_ENTRIES; i++) {
        subcomm_entry_t *e = &header->subcomms[i];
        uint32_t expected = SUBCOMM_FREE;
        if (!atomic_compare_exchange_strong(&e->state, &expected, SUBCOMM_WRITING))
            continue;
        atomic_fetch_add(&e->seq, 1); /* odd: being written */
        e->id = id;
        e->members = members;
        e->creator = creator;
        memcpy(&e->wire, wire, sizeof e->wire);
        atomic_fetch_add_explicit(&e->seq, 1, memory_order_release);
        atomic_store_explicit(&e->state, SUBCOMM_POSTED, memory_order_release);
        return e;
    }
    return NULL;
}

static void withdraw_entry(subcomm_entry_t *e)
{
    atomic_store(&e->state, SUBCOMM_WRITING);
    atomic_fetch_add(&e->seq, 2); /* a reader copying it now sees it move */
    atomic_store_explicit(&e->state, SUBCOMM_FREE, memory_order_release);
}

enum { PROBE_GONE, PROBE_FORMING };

/* Opens the segment of a posted sub-communicator: PROBE_FORMING (mapped, for the caller to
 * unmap) if it is still being formed, else PROBE_GONE (formed, failed or released). */
static int probe_entry(const subcomm_entry_t *entry, int *fd, seg_header_t **header)
{
    if (open_segment(&entry->wire, fd, header) != HCCL_SUCCESS)
        return PROBE_GONE;
    seg_header_t *h = *header;
    uint32_t joined = atomic_load(&h->joined), nranks = atomic_load(&h->nranks);
    if ((joined & SEG_JOIN_ABORTED) == 0 && atomic_load(&h->abort_code) == HCCL_SUCCESS &&
        (nranks == 0 || joined < nranks) && h->sub_nranks != 0)
        return PROBE_FORMING;
    munmap(h, SEG_HEADER_BYTES);
    close(*fd);
    return PROBE_GONE;
}

static void unprobe(int fd, seg_header_t *header)
{
    munmap(header, SEG_HEADER_BYTES);
    close(fd);
}

/* Another sub-communicator with this id is forming (its segment `theirs`): describes the clash in
 * `text` and stops that sub-communicator if this rank is one of its members. */
static void clash(const hccl_comm_t *parent, uint64_t id, seg_header_t *theirs, const uint32_t *mine, uint32_t n,
                  bool creating, char *text, size_t len)
{
    char their_list[160], my_list[160];
    format_ranks(their_list, sizeof their_list, theirs->sub_ranks, theirs->sub_nranks);
    format_ranks(my_list, sizeof my_list, mine, n);
    snprintf(text, len, "the ranks disagree on sub-communicator %llu of '%s': rank %u creates it with rankIds %s, "
             "but rank %u %s rankIds %s (every member must pass the same rankNum and rankIds for one subCommId)",
             (unsigned long long)id, parent->name, theirs->sub_ranks[0], their_list, parent->rank,
             creating ? "creates it too, with" : "passes", my_list);
    if (lists_rank(theirs->sub_ranks, theirs->sub_nranks, parent->rank))
        abort_forming(theirs, -1, HCCL_E_PARA, "%s", text);
}

static int create_sub(hccl_comm_t *parent, uint32_t rankNum, uint32_t *rankIds, uint64_t subCommId,
                      uint32_t subCommRankId, HcclCommConfig *config, HcclComm *subComm)
{
    const char *api = "HcclCreateSubCommConfig";
    /* Refused on every rank alike, members or not: the callers then all go another way together. */
    if (parent->net != NULL)
        return hccl_error(HCCL_E_NOT_SUPPORT, "%s: '%s' spans servers, and the simulator makes sub-communicators "
                          "only of communicators whose ranks share a server (make one from a root info instead)",
                          api, parent->name);
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
    int err = parse_config(config, api, &parsed);
    if (err != HCCL_SUCCESS)
        return err;

    seg_header_t *header = parent->header;
    int64_t deadline = connect_deadline();
    rootinfo_wire_t wire;
    subcomm_entry_t *posted = NULL;
    char text[800]; /* the clash message names two lists */
    if (subCommRankId == 0) {
        err = hccl_get_root_info(&wire);
        if (err != HCCL_SUCCESS)
            return err;
        pthread_mutex_lock(&g_created_lock);
        seg_header_t *own = created_header(wire.token);
        if (own != NULL) {
            own->sub_id = subCommId;
            memcpy(own->sub_ranks, rankIds, rankNum * sizeof *rankIds);
            own->sub_nranks = rankNum;
        }
        pthread_mutex_unlock(&g_created_lock);
        if (own == NULL) /* expired already: HCCL_CONNECT_TIMEOUT is 0 */
            return hccl_error(HCCL_E_TIMEOUT, "%s: the sub-communicator's root info expired at once "
                              "(HCCL_CONNECT_TIMEOUT is %g s)", api, connect_timeout_s());
        if (rankNum > 1) {
            posted = post_entry(header, subCommId, rankNum, parent->rank, &wire);
            if (posted == NULL) {
                close_created(wire.token, RETIRED_FAILED);
                return hccl_error(HCCL_E_UNAVAIL, "%s: too many sub-communicators being created at once", api);
            }
            hccl_wake(parent);
            /* Looked for after posting: of two creators posting one id at once, each sees the other. */
            for (int i = 0; i < SEG_SUBCOMM_ENTRIES; i++) {
                subcomm_entry_t copy;
                uint32_t seq;
                int fd;
                seg_header_t *theirs;
                if (&header->subcomms[i] == posted || !read_entry(&header->subcomms[i], &copy, &seq) ||
                    copy.id != subCommId || probe_entry(&copy, &fd, &theirs) != PROBE_FORMING)
                    continue;
                clash(parent, subCommId, theirs, rankIds, rankNum, true, text, sizeof text);
                unprobe(fd, theirs);
                withdraw_entry(posted);
                /* Members that already joined this one fail with the same error. */
                pthread_mutex_lock(&g_created_lock);
                own = created_header(wire.token);
                if (own != NULL)
                    abort_forming(own, -1, HCCL_E_PARA, "%s", text);
                pthread_mutex_unlock(&g_created_lock);
                close_created(wire.token, RETIRED_FAILED);
                return hccl_error(HCCL_E_PARA, "%s: %s", api, text);
            }
        }
    } else {
        sim_backoff_t backoff;
        sim_backoff_init(&backoff);
        /* Entries found formed or failed, by their `seq`, not to be opened again. */
        uint32_t gone[SEG_SUBCOMM_ENTRIES] = {0};
        bool found = false;
        while (!found) {
            for (int i = 0; i < SEG_SUBCOMM_ENTRIES && !found; i++) {
                subcomm_entry_t copy;
                uint32_t seq;
                int fd;
                seg_header_t *theirs;
                if (!read_entry(&header->subcomms[i], &copy, &seq) || copy.id != subCommId || gone[i] == seq)
                    continue;
                if (probe_entry(&copy, &fd, &theirs) != PROBE_FORMING) {
                    gone[i] = seq;
                    continue;
                }
                bool same = theirs->sub_id == subCommId && theirs->sub_nranks == rankNum &&
                            memcmp(theirs->sub_ranks, rankIds, rankNum * sizeof *rankIds) == 0;
                if (!same) {
                    clash(parent, subCommId, theirs, rankIds, rankNum, false, text, sizeof text);
                    unprobe(fd, theirs);
                    return hccl_error(HCCL_E_PARA, "%s: %s", api, text);
                }
                unprobe(fd, theirs);
                wire = copy.wire;
                found = true;
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
    err = hccl_comm_init(api, rankNum, &wire, subCommRankId, config, HCCL_SIM_JOIN_ROOT_INFO, parent->device,
                    comm_slot(parent, parent->rank)->node, subComm);
    if (subCommRankId == 0) {
        /* The members have what they need (or will not come); a failure before this rank joined
         * is passed on to those that did. */
        if (posted != NULL)
            withdraw_entry(posted);
        if (err != HCCL_SUCCESS) {
            snprintf(text, sizeof text, "sub-rank 0 (parent rank %u) failed: %s", parent->rank, sim_error_text());
            hccl_root_info_abandon(&wire, HCCL_E_REMOTE, text);
        }
    }
    if (err == HCCL_SUCCESS) {
        hccl_comm_t *created = sim_handle_get(*subComm, SIM_KIND_COMM);
        created->is_subcomm = true;
    }
    return err;
}

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
    err = create_sub(parent, rankNum, rankIds, subCommId, subCommRankId, config, subComm);
    hccl_comm_unref(parent);
    return err;
}

/* --------------------------------------------------------------- destroy */

/* Frees HcclGetHcclBuffer's memory, unless an aclrtResetDevice has already taken it with the rest
 * of the device's memory. */
static void release_hccl_buffer(hccl_comm_t *comm)
{
    pthread_mutex_lock(&comm->lock);
    void *buffer = comm->hccl_buffer;
    uint64_t bytes = comm->hccl_buffer_bytes;
    comm->hccl_buffer = NULL;
    pthread_mutex_unlock(&comm->lock);
    uint64_t offset;
    char why[8];
    if (buffer != NULL && sim_device_range(comm->device, buffer, bytes, &offset, why, sizeof why) == 0)
        aclrtFree(buffer);
}

HCCL_API HcclResult HcclCommDestroy(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommDestroy", &err);
    if (comm == NULL)
        return err;
    /* Operations still queued on a suspended or failed communicator can only fail (exec.c), and
     * each holds a reference of its own: the communicator goes now and they fail when their
     * streams reach them.  Otherwise HcclCommDestroy right after HcclCommSuspend would succeed or
     * not depending on how far a stream's worker had got. */
    int pending = atomic_load(&comm->pending);
    if (pending > 0 && !atomic_load(&comm->suspended) && hccl_comm_broken(comm) == HCCL_SUCCESS) {
        err = hccl_error(HCCL_E_AGAIN, "HcclCommDestroy: '%s' still has %d operation%s in flight; synchronise its "
                         "streams and try again", comm->name, pending, pending == 1 ? "" : "s");
        hccl_comm_unref(comm);
        return err;
    }
    /* Of two threads destroying one communicator, one frees the handle and drops its reference. */
    if (!sim_handle_free(handle)) {
        hccl_comm_unref(comm);
        return hccl_error(HCCL_E_PARA, "HcclCommDestroy: %p is not a live communicator (destroyed by another "
                          "thread)", handle);
    }
    name_give_back(comm);
    release_hccl_buffer(comm);
    hccl_registrations_drop(handle);
    atomic_store(&comm_slot(comm, comm->rank)->state, SLOT_LEFT);
    hccl_wake(comm);
    hccl_comm_unref(comm); /* the lookup's */
    hccl_comm_unref(comm); /* the handle's */
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
        err = hccl_error(HCCL_E_PTR, "HcclGetRankSize: rankSize is NULL");
    else
        *rankSize = comm->nranks;
    hccl_comm_unref(comm);
    return err;
}

HCCL_API HcclResult HcclGetRankId(HcclComm handle, uint32_t *rank)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetRankId", &err);
    if (comm == NULL)
        return err;
    if (rank == NULL)
        err = hccl_error(HCCL_E_PTR, "HcclGetRankId: rank is NULL");
    else
        *rank = comm->rank;
    hccl_comm_unref(comm);
    return err;
}

HCCL_API HcclResult HcclGetCommName(HcclComm handle, char *commName)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetCommName", &err);
    if (comm == NULL)
        return err;
    if (commName == NULL)
        err = hccl_error(HCCL_E_PTR, "HcclGetCommName: commName is NULL");
    else
        snprintf(commName, HCCL_SIM_NAME_BYTES, "%s", comm->name);
    hccl_comm_unref(comm);
    return err;
}

HCCL_API HcclResult HcclGetCommAsyncError(HcclComm handle, HcclResult *asyncError)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetCommAsyncError", &err);
    if (comm == NULL)
        return err;
    if (asyncError == NULL) {
        err = hccl_error(HCCL_E_PTR, "HcclGetCommAsyncError: asyncError is NULL");
        hccl_comm_unref(comm);
        return err;
    }
    HcclResult code = (HcclResult)atomic_load(&comm->async_error);
    HcclResult broken = hccl_comm_broken(comm);
    if (code == HCCL_SUCCESS && broken != HCCL_SUCCESS) {
        seg_header_t *header = comm->header;
        /* Another rank's failure is a remote error on this one, as for its operations
         * (hccl_comm_check_usable): not, say, HCCL_E_SUSPENDING for a rank that is not suspended. */
        const char *why = hccl_abort_text(header); /* first: the failing rank is written with it */
        code = broken != HCCL_E_TIMEOUT && header->abort_rank != (int32_t)comm->rank ? HCCL_E_REMOTE : broken;
        hccl_error(code, "communicator '%s' failed on rank %d: %s", comm->name, (int)header->abort_rank, why);
    } else if (code != HCCL_SUCCESS) {
        hccl_error(code, "%s", comm->async_text);
    }
    *asyncError = code;
    hccl_comm_unref(comm);
    return HCCL_SUCCESS;
}

HCCL_API uint32_t HcclGetCommConfigCapability(void)
{
    return HCCL_COMM_CONFIG_RESERVED;
}

/* HcclSetConfig's items: their names and largest values. Neither changes what the simulator
 * computes: it always reduces in rank order, on the host's cores. */
static const struct {
    const char *name;
    int32_t max;
} g_items[HCCL_CONFIG_RESERVED] = {
    [HCCL_DETERMINISTIC] = {"HCCL_DETERMINISTIC", 2},
    [HCCL_ACCELERATOR] = {"HCCL_ACCELERATOR", 5},
};
static _Atomic int32_t g_config[HCCL_CONFIG_RESERVED]; /* the process-wide values */

/* HCCL_SUCCESS if `config` is an item (and `value`, unless NULL, one of its values). */
static int check_item(const char *api, HcclConfig config, const HcclConfigValue *value)
{
    if ((unsigned)config >= HCCL_CONFIG_RESERVED)
        return hccl_error(HCCL_E_PARA, "%s: unknown configuration item %d", api, (int)config);
    if (value != NULL && (value->value < 0 || value->value > g_items[config].max))
        return hccl_error(HCCL_E_PARA, "%s: %s takes 0 to %d, got %d", api, g_items[config].name,
                          (int)g_items[config].max, (int)value->value);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclSetConfig(HcclConfig config, HcclConfigValue configValue)
{
    int err = check_item("HcclSetConfig", config, &configValue);
    if (err == HCCL_SUCCESS)
        atomic_store(&g_config[config], configValue.value);
    return err;
}

HCCL_API HcclResult HcclGetConfig(HcclConfig config, HcclConfigValue *configValue)
{
    if (configValue == NULL)
        return hccl_error(HCCL_E_PTR, "HcclGetConfig: configValue is NULL");
    int err = check_item("HcclGetConfig", config, NULL);
    if (err == HCCL_SUCCESS)
        configValue->value = atomic_load(&g_config[config]);
    return err;
}

int32_t hccl_comm_config_value(const hccl_comm_t *comm, HcclConfig item)
{
    uint32_t own = atomic_load(&comm->config[item]);
    return own == HCCL_COMM_CONFIG_NOT_SET ? atomic_load(&g_config[item]) : (int32_t)own;
}

/* Per-communicator items: a value set here (HCCL_DETERMINISTIC also by the communicator's
 * config) wins over the process-wide HcclSetConfig one. */
HCCL_API HcclResult HcclSetCommConfig(HcclComm handle, HcclConfig config, HcclConfigValue configValue)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclSetCommConfig", &err);
    if (comm == NULL)
        return err;
    err = check_item("HcclSetCommConfig", config, &configValue);
    if (err == HCCL_SUCCESS)
        atomic_store(&comm->config[config], (uint32_t)configValue.value);
    hccl_comm_unref(comm);
    return err;
}

HCCL_API HcclResult HcclGetCommConfig(HcclComm handle, HcclConfig config, HcclConfigValue *configValue)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclGetCommConfig", &err);
    if (comm == NULL)
        return err;
    if (configValue == NULL)
        err = hccl_error(HCCL_E_PTR, "HcclGetCommConfig: configValue is NULL");
    else
        err = check_item("HcclGetCommConfig", config, NULL);
    if (err == HCCL_SUCCESS)
        configValue->value = hccl_comm_config_value(comm, config);
    hccl_comm_unref(comm);
    return err;
}

/* ---------------------------------------------------------- lookup by name */

/* The handle is the communicator's own (no new reference): HcclCommDestroy through either copy
 * destroys it, after which both are refused.  Ranks of one communicator driven by this process
 * share its name; the one on the caller's current device is preferred. */
HCCL_API HcclResult HcclCommGetHandleWithName(const char *commName, HcclComm *comm)
{
    if (commName == NULL || comm == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommGetHandleWithName: commName and comm must not be NULL");
    HcclComm found = hccl_comm_find_name(commName);
    if (found == NULL)
        return hccl_error(HCCL_E_NOT_FOUND, "HcclCommGetHandleWithName: no live communicator of this process is "
                          "named '%.128s'", commName);
    *comm = found;
    return HCCL_SUCCESS;
}

/* READY while the communicator works, SUSPENDING between HcclCommSuspend and HcclCommResume,
 * INVALID once it has failed (it can only be destroyed then). */
HCCL_API HcclResult HcclCommGetStatus(const char *commId, HcclCommStatus *status)
{
    if (commId == NULL || status == NULL)
        return hccl_error(HCCL_E_PTR, "HcclCommGetStatus: commId and status must not be NULL");
    HcclComm handle = hccl_comm_find_name(commId);
    if (handle == NULL)
        return hccl_error(HCCL_E_NOT_FOUND, "HcclCommGetStatus: no live communicator of this process is named "
                          "'%.128s'", commId);
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommGetStatus", &err);
    if (comm == NULL) /* destroyed since the name was looked up */
        return hccl_error(HCCL_E_NOT_FOUND, "HcclCommGetStatus: communicator '%.128s' was destroyed", commId);
    if (hccl_comm_broken(comm) != HCCL_SUCCESS)
        *status = HCCL_COMM_STATUS_INVALID;
    else if (atomic_load(&comm->suspended))
        *status = HCCL_COMM_STATUS_SUSPENDING;
    else
        *status = HCCL_COMM_STATUS_READY;
    hccl_comm_unref(comm);
    return HCCL_SUCCESS;
}

/* HcclCommSuspend stops this rank's part of the communicator: its operations in flight fail at
 * once (HCCL_E_SUSPENDING) and break the communicator on every rank, and it refuses new ones.
 * The other ranks see the suspension in its slot: an operation of theirs that needs this rank
 * meanwhile fails at once with HCCL_E_REMOTE naming it (exec.c check_health), which breaks the
 * communicator as though this rank had failed.  HcclCommResume lifts the suspension; it
 * succeeds only if nothing broke the communicator in between, as when every rank suspends, the
 * ranks synchronise and every rank resumes before the next operation (the CANN recovery flow). */
HCCL_API HcclResult HcclCommSuspend(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommSuspend", &err);
    if (comm == NULL)
        return err;
    atomic_store(&comm->suspended, true);
    atomic_store(&comm_slot(comm, comm->rank)->suspended, 1);
    /* Work queued here can only fail now (exec.c): the communicator is broken from this moment, on
     * every rank, not from when a stream's worker notices, so that a peer's operation begun after
     * the suspension is refused rather than completed with what this rank had published. */
    if (atomic_load(&comm->pending) > 0)
        hccl_comm_abort(comm, HCCL_E_SUSPENDING, "work in flight on rank %u of '%s' was stopped by HcclCommSuspend "
                        "(communicator aborted)", comm->rank, comm->name);
    hccl_wake(comm); /* operations asleep in a wait, here and on the other ranks, notice at once */
    hccl_comm_unref(comm);
    return HCCL_SUCCESS;
}

HCCL_API HcclResult HcclCommResume(HcclComm handle)
{
    int err = HCCL_SUCCESS;
    hccl_comm_t *comm = hccl_comm_lookup(handle, "HcclCommResume", &err);
    if (comm == NULL)
        return err;
    /* A suspension that stopped an operation in flight, here or on a rank that needed this one,
     * broke the communicator on every rank (exec.c): nothing restores that, so Resume reports it
     * instead of a success after which every call fails.  The suspension is lifted all the same,
     * so that later calls give the same code and message as this one (the failure, not
     * "suspended: call HcclCommResume"). */
    atomic_store(&comm_slot(comm, comm->rank)->suspended, 0);
    atomic_store(&comm->suspended, false);
    err = hccl_comm_check_usable(comm, "HcclCommResume");
    hccl_comm_unref(comm);
    return err;
}

/* ------------------------------------------------------------------- fork */

void hccl_comm_after_fork(void)
{
    pthread_mutex_init(&g_created_lock, NULL);
    pthread_mutex_init(&g_spare_lock, NULL);
    pthread_mutex_init(&g_names_lock, NULL);
    while (g_created != NULL) {
        created_t *entry = g_created;
        g_created = entry->next;
        munmap(entry->header, SEG_HEADER_BYTES);
        close(entry->fd); /* the parent's segments are not ours to hand out */
        free(entry);
    }
    g_reaper_running = false; /* the parent's thread is not in the child */
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
