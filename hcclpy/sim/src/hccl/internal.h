/* Internal structures of libhccl.so. */
#ifndef HCCLPY_SIM_HCCL_INTERNAL_H
#define HCCLPY_SIM_HCCL_INTERNAL_H

#include <sys/socket.h>
#include <sys/un.h>

#include "common/sim.h"
#include "hccl/hccl.h"

#define HCCL_SIM_MAX_RANKS 4096u
#define HCCL_SIM_MAX_COUNT 0x7FFFFFFFFULL /* SYS_MAX_COUNT of the real library */
#define HCCL_SIM_NAME_BYTES 128

/* How the text of every failure that comes from ranks whose collective calls differ begins:
 * "collective mismatch on '<communicator>' at operation #N: rank A called ... but rank B called
 * ...".  The return codes stay CANN's (HCCL_E_PARA where a rank sees the difference, the
 * runtime's ACL_ERROR_RT_AICPU_EXCEPTION on its stream, HCCL_E_REMOTE on a rank that learns of it
 * from another), so the text is what tells such a failure apart; and the text already goes
 * wherever the failure is reported: the stream's sticky error, HcclGetCommAsyncError, and the
 * communicator's abort record that the peers' errors and every later call quote.  At the start,
 * so that no truncation of a longer text that quotes it cuts it off.  hcclpy raises
 * CollectiveMismatchError for a failure whose text holds it (hcclpy/errors.py SIM_MISMATCH_MARK;
 * a test keeps the two equal).  Real CANN has no such text. */
#define HCCL_SIM_MISMATCH_MARK "collective mismatch on '"

/* ------------------------------------------------------------- root info */

/* What HcclRootInfo carries: where the communicator's control segment is and
 * how to check that it is the right one. */
typedef struct {
    char magic[8];
    uint8_t token[16];
    int32_t pid;            /* process holding the segment's memfd */
    int32_t fd;
    uint64_t start_time;    /* of that process, against pid reuse */
    char node[64];
} rootinfo_wire_t;

/* -------------------------------------------------------- control segment */

#define SEG_HEADER_BYTES 65536u
/* Collectives to which no rank contributes more than this go eager (exec.c). */
#define HCCL_SIM_EAGER_BYTES 256u
/* Eager collectives this small travel in the progress word's cache line (exec.c). */
#define HCCL_SIM_TINY_BYTES 16u
#define SEG_SUBCOMM_ENTRIES 64

enum { SLOT_FREE = 0, SLOT_CLAIMED, SLOT_JOINED, SLOT_LEFT };
enum { SUBCOMM_FREE = 0, SUBCOMM_WRITING, SUBCOMM_POSTED };

/* A sub-communicator being created, as its sub-rank 0 posts it in the parent's segment for the
 * other members (HcclCreateSubCommConfig).  Only its creator changes or withdraws it; `seq` is
 * odd while it does, so a reader copies the entry and keeps the copy only if `seq` did not move. */
typedef struct {
    _Atomic uint32_t state;  /* SUBCOMM_* */
    _Atomic uint32_t seq;
    uint64_t id;
    uint32_t members;
    uint32_t creator;        /* parent rank of sub-rank 0 */
    rootinfo_wire_t wire;
} subcomm_entry_t;

/* seg_header_t.join_kind of a communicator made from one root info (0: nobody joined yet). */
#define HCCL_SIM_JOIN_ROOT_INFO 1u

/* Set in `joined` by a rank that stops a communicator still forming (comm.c abort_forming): the
 * count can then never be read as complete, so no rank takes the communicator as formed. */
#define SEG_JOIN_ABORTED 0x80000000u

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint8_t token[16];
    _Atomic uint32_t nranks;        /* set by the first rank to join */
    _Atomic uint32_t layout_ready;
    _Atomic uint32_t joined;        /* ranks joined, | SEG_JOIN_ABORTED */
    _Atomic int64_t last_join_ns;   /* when a rank last joined (the root info's expiry counts from it) */
    /* Ranks that have mapped every peer's device memory (comm.c wait_for_mapped): a rank reaches a
     * peer's memory through the peer's process, so no rank returns (and may exit) before all have. */
    _Atomic uint32_t mapped;
    /* How the ranks joined, set by the first (comm.c agree_on_layout): HCCL_SIM_JOIN_ROOT_INFO for
     * one root info, or a digest of the rootInfoList of HcclCommInitRootInfoScalable; a rank that
     * joins another way is refused. */
    _Atomic uint64_t join_kind;
    uint64_t slot_bytes;
    uint64_t total_bytes;
    SIM_ALIGNED _Atomic uint32_t epoch;  /* futex: bumped on publishing while a waiter sleeps */
    _Atomic uint32_t sleepers;
    SIM_ALIGNED _Atomic uint32_t abort_code; /* HcclResult that broke the communicator */
    _Atomic uint32_t abort_text_ready;
    int32_t abort_rank;
    char abort_text[512];
    SIM_ALIGNED subcomm_entry_t subcomms[SEG_SUBCOMM_ENTRIES];
    /* For a sub-communicator: the parent ranks its creator passed (written before the root info
     * is posted), which every other member compares with its own rankIds before it joins. */
    uint64_t sub_id;
    uint32_t sub_nranks;            /* 0: not a sub-communicator */
    uint32_t sub_ranks[HCCL_SIM_MAX_RANKS];
} seg_header_t;

/* One collective as a rank announces it to the others. */
typedef struct {
    uint64_t seq;
    uint32_t type;          /* HcclCMDType */
    uint32_t dtype;
    uint32_t recv_dtype;
    uint32_t op;
    uint32_t root;
    uint32_t pad;
    uint64_t count;
    uint64_t send_offset;   /* in the rank's device arena; UINT64_MAX = none */
    uint64_t recv_offset;
} op_desc_t;

typedef struct {
    SIM_ALIGNED _Atomic uint64_t progress;   /* (collective seq << 16) | phase */
    /* In the progress word's cache line, so that a rank that sees a tiny collective announced
     * has its signature and its data in the same transfer between cores: two copies each, used
     * by turns (sequence number parity) as for op and eager below. */
    uint64_t tiny_sig[2];
    char tiny[2][HCCL_SIM_TINY_BYTES];
    SIM_ALIGNED _Atomic uint32_t state;
    /* HcclCommSuspend on this rank: a peer's operation that needs the rank meanwhile fails (exec.c). */
    _Atomic uint32_t suspended;
    _Atomic uint32_t mapped;  /* this rank has mapped every peer's device memory */
    int32_t pid;
    uint64_t start_time;
    int32_t device;         /* logical, in its own process */
    int32_t device_physical;
    char node[64];
    sim_arena_loc_t arena;
    char name[HCCL_SIM_NAME_BYTES];
    /* The announced collective and, for a small one, its data (exec.c), in
     * two copies used by turns (sequence number parity): a rank may start its
     * next collective while a peer still reads its previous one. */
    SIM_ALIGNED op_desc_t op[2];
    /* For an operation that is a step of a call on a communicator across servers (netops.c), that
     * call (seq 0: none): a difference between the ranks' calls is reported as one. */
    op_desc_t call[2];
    SIM_ALIGNED char eager[2][HCCL_SIM_EAGER_BYTES];
} slot_head_t;

_Static_assert(offsetof(slot_head_t, tiny) + sizeof(((slot_head_t *)0)->tiny) <= SIM_CACHELINE,
               "a tiny collective must fit in the progress word's cache line");

/* Point-to-point channel from a sender to one receiver (in the sender's slot). */
typedef struct {
    _Atomic uint64_t posted;
    uint64_t count;
    uint64_t offset;
    uint32_t dtype;
    uint32_t pad;
} p2p_out_t;

/* The receiver's answer (in the receiver's slot, indexed by sender). */
typedef struct {
    _Atomic uint64_t consumed;
    _Atomic uint32_t status;  /* HcclResult of the match */
    uint32_t dtype;           /* the receive posted, for the sender's message when it did not match */
    uint64_t count;
} p2p_in_t;

/* ---------------------------------------------------------- communicator */

/* An HcclSetConfig item a communicator has no value of its own for. */
#define HCCL_COMM_CONFIG_NOT_SET HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET

/* Communicator objects are recycled, never given back to malloc (comm.c): a thread that looked
 * one up through a stale handle may still touch `refs`, which therefore stays first and is
 * never cleared by a reuse, only moved from 0 to 1 by it. */
typedef struct hccl_net hccl_net_t; /* net.h */

typedef struct hccl_comm {
    _Atomic int refs;
    struct hccl_comm *next_spare;
    void *handle;
    uint32_t rank, nranks;
    int device;
    bool is_subcomm;
    char name[HCCL_SIM_NAME_BYTES];
    bool named;                     /* in the registry of live names (comm.c) */
    struct hccl_comm *next_named;

    char *segment;
    uint64_t segment_bytes;
    seg_header_t *header;

    char **peer_base;               /* device arena base of every rank, mapped here */
    sim_arena_loc_t *peer_arena;
    const void **scratch_in;        /* nranks pointers each, for the running operation */
    void **scratch_out;

    pthread_mutex_t lock;           /* sequence numbers and enqueue order */
    uint64_t next_lseq;             /* local order of every operation */
    uint64_t next_cseq;             /* collectives, matched across ranks */
    _Atomic uint64_t next_pseq;     /* point-to-point calls, in the order they were made */
    _Atomic uint64_t lseq_done;
    uint64_t *send_seq, *recv_seq;  /* point-to-point, per peer */
    _Atomic int pending;

    int64_t exec_timeout_ns;        /* 0 = no limit */
    /* The HcclSetConfig items of this communicator (HcclSetCommConfig; HCCL_DETERMINISTIC also
     * its config); HCCL_COMM_CONFIG_NOT_SET: the process-wide HcclSetConfig value. */
    _Atomic uint32_t config[HCCL_CONFIG_RESERVED];
    uint32_t op_expansion;          /* hcclOpExpansionMode of its config (0: default) */
    uint32_t buffer_mb;             /* hcclBufferSize of its config, else HCCL_BUFFSIZE, else 200 */
    char udi[UDI_MAX_LENGTH];       /* hcclUdi of its config ("" without one) */
    char algo[HCCL_COMM_ALGO_MAX_LENGTH]; /* hcclAlgo of its config, else HCCL_ALGO ("" without either) */
    /* HcclGetHcclBuffer's device memory (manage.c): NULL until its first call, freed by
     * HcclCommDestroy; set under `lock`. */
    void *hccl_buffer;
    uint64_t hccl_buffer_bytes;
    bool oversubscribed;            /* more local ranks than cores: do not spin long */
    _Atomic bool suspended;

    _Atomic uint32_t async_error;
    char async_text[1024];
    hccl_net_t *net;                /* its ranks span servers (net.h); NULL: they share one */
} hccl_comm_t;

static inline slot_head_t *comm_slot(const hccl_comm_t *comm, uint32_t rank)
{
    return (slot_head_t *)(comm->segment + SEG_HEADER_BYTES + (uint64_t)rank * comm->header->slot_bytes);
}

/* Up to this many ranks, all_to_all_vc publishes its whole count matrix in the slot, so that every
 * rank can name an entry on which its matrix and a peer's differ (exec.c check_signatures); with
 * more, only its own row and column.  n * n words a slot, in pages of the segment that nothing
 * touches unless the operation runs; the copy costs what the matrix's digest already does. */
#define HCCL_SIM_FULL_MATRIX_RANKS 64u

/* Words of a slot's vectors: all_to_all_v's and reduce_scatter_v's counts and displacements
 * (2 n), or all_to_all_vc's count matrix (n * n up to HCCL_SIM_FULL_MATRIX_RANKS ranks). */
static inline uint64_t slot_vector_words(uint32_t nranks)
{
    uint64_t n = nranks;
    return nranks <= HCCL_SIM_FULL_MATRIX_RANKS ? SIM_MAX(2 * n, n * n) : 2 * n;
}

static inline uint64_t *slot_vectors(const hccl_comm_t *comm, uint32_t rank)
{
    return (uint64_t *)((char *)comm_slot(comm, rank) + sizeof(slot_head_t));
}

static inline p2p_out_t *slot_p2p_out(const hccl_comm_t *comm, uint32_t rank)
{
    return (p2p_out_t *)(slot_vectors(comm, rank) + slot_vector_words(comm->nranks));
}

static inline p2p_in_t *slot_p2p_in(const hccl_comm_t *comm, uint32_t rank)
{
    return (p2p_in_t *)(slot_p2p_out(comm, rank) + comm->nranks);
}

/* --------------------------------------------------------------- errors */

int hccl_error(HcclResult code, const char *fmt, ...) SIM_PRINTF(2, 3);
const char *hccl_result_name(HcclResult code);

/* ----------------------------------------------------------------- comm */

/* The live communicator of a handle with a reference taken (release it with hccl_comm_unref),
 * or NULL with `err` set: a concurrent HcclCommDestroy cannot free it under the caller. */
hccl_comm_t *hccl_comm_lookup(HcclComm handle, const char *api, int *err);
/* The value of HcclSetConfig item `item` (< HCCL_CONFIG_RESERVED) for the communicator: its own
 * (HcclSetCommConfig, or HCCL_DETERMINISTIC of its config), else the process-wide one. */
int32_t hccl_comm_config_value(const hccl_comm_t *comm, HcclConfig item);
void hccl_comm_unref(hccl_comm_t *comm);
/* The handle of a live communicator of this process named `name`, or NULL: of the ranks this
 * process drives under that name, the one on the calling thread's current device if there is
 * one (else the first found).  No reference is taken: the handle is checked again by whatever
 * uses it. */
HcclComm hccl_comm_find_name(const char *name);
/* Marks the communicator broken on every rank (first failure wins). */
void hccl_comm_abort(hccl_comm_t *comm, HcclResult code, const char *fmt, ...) SIM_PRINTF(3, 4);
/* The same, recording rank `rank` as the one that broke it. */
void hccl_comm_abort_as(hccl_comm_t *comm, uint32_t rank, HcclResult code, const char *fmt, ...) SIM_PRINTF(4, 5);
HcclResult hccl_comm_broken(const hccl_comm_t *comm);
const char *hccl_abort_text(seg_header_t *header);
/* HCCL_SUCCESS while the communicator works; once it is broken, the code a call on this rank
 * reports for that (another rank's failure is HCCL_E_REMOTE here, a timeout stays a timeout),
 * recorded with "<api>: communicator '<name>' has failed (rank R: why); destroy it ...". */
int hccl_comm_check_usable(const hccl_comm_t *comm, const char *api);
int hccl_get_root_info(rootinfo_wire_t *wire);
/* Joins the communicator of root info `wire` as `rank` of `nranks` (on server `node`; NULL: this
 * process's), as HcclCommInitRootInfoConfig does. */
int hccl_comm_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                   const HcclCommConfig *config, uint64_t join_kind, int device, const char *node, HcclComm *out);
/* The name a communicator created with `config` from a root info with `token` has. */
int hccl_config_name(const HcclCommConfig *config, const uint8_t token[16], const char *api, char *out, size_t len);
/* The HCCL_ALGO setting a communicator created with `config` has: its hcclAlgo, else HCCL_ALGO. */
int hccl_config_algo(const HcclCommConfig *config, const char *api, char *out, size_t len);
/* The communicator object of a rank of a communicator that spans servers (net.c); it owns `net`
 * (released on failure too). */
int hccl_comm_new_spanning(const char *api, uint32_t nranks, uint32_t rank, int device, const HcclCommConfig *config,
                           const uint8_t token[16], hccl_net_t *net, HcclComm *out);
/* Gives up a root info this process made for a communicator that will not be formed: ranks
 * that already joined with it fail at once (with `code`, PARA or REMOTE, quoting `why`), and it
 * is released. */
void hccl_root_info_abandon(const rootinfo_wire_t *wire, HcclResult code, const char *why);
/* Whether ranks may still join with a root info this process made: it is held, and its
 * communicator is neither formed nor failed (false for any other root info). */
bool hccl_root_info_pending(const rootinfo_wire_t *wire);
/* Whether a rank can no longer join with `wire` because its communicator has been formed or the
 * root info was released (`why` says which); a communicator that failed while forming is not
 * "used": joining it reports the failure. */
bool hccl_root_info_used(const rootinfo_wire_t *wire, char *why, size_t why_len);
void hccl_comm_after_fork(void);

/* Forgets every registration (HcclCommRegister, HcclCommSymWinRegister) made with a communicator
 * handle, when the communicator is destroyed (manage.c). */
void hccl_registrations_drop(HcclComm handle);

/* Publishes progress and wakes ranks sleeping on the communicator. */
void hccl_publish(hccl_comm_t *comm, uint64_t progress);
void hccl_wake(hccl_comm_t *comm);

/* ------------------------------------------------------------- datatypes */

/* Element size, or 0 for a type the simulator does not move. */
size_t hccl_dtype_size(HcclDataType dtype);
const char *hccl_dtype_name(uint32_t dtype);
const char *hccl_op_name(uint32_t op);
const char *hccl_cmd_name(uint32_t type);

/* outs[k][i] = ins[0][i] op ins[1][i] op ... (in rank order) for every k.
 * Inputs may alias outputs: each block is read completely before it is written.
 * `streaming` stores around the cache (for data larger than the caches); the
 * caller must then call sim_store_fence() before publishing the result. */
void hccl_reduce(void *const *outs, int nout, const void *const *ins, int nin, uint64_t count, HcclDataType dtype,
                 HcclReduceOp op, bool streaming);


/* -------------------------------------------------------------- profiles */

#define HCCL_SIM_PROFILE_VARIABLE "HCCLPY_SIM_PROFILE"

/* The data types and reduce operations one Ascend product accepts (profile.c). */
typedef struct hccl_profile hccl_profile_t;

/* The profile HCCLPY_SIM_PROFILE names (NULL when unset or empty: no limits),
 * read once; `out` may be NULL. An unknown name fails every call with
 * HCCL_E_PARA and a message listing the valid names; `api` starts it. */
int hccl_profile_get(const char *api, const hccl_profile_t **out);
/* HCCL_SUCCESS if `profile` (NULL: none) allows operation `type` (HcclCMDType)
 * on `dtype` with `op` (read only for operations that reduce), otherwise
 * HCCL_E_NOT_SUPPORT with a message naming the profile and what it allows. */
int hccl_profile_check(const hccl_profile_t *profile, const char *api, uint32_t type, HcclDataType dtype,
                       HcclReduceOp op);
/* Whether operation `type` (HcclCMDType) takes a reduce operation. */
bool hccl_cmd_reduces(uint32_t type);

/* ------------------------------------------------------------ operations */

typedef struct op_task op_task_t;

/* A buffer of memory imported from another process (aclrtIpcMemImportByKey), which the other ranks
 * cannot reach through this rank's device arena: the operation runs on a copy of it in this rank's
 * device memory, made when the operation starts and copied back when it ends (exec.c). */
typedef struct {
    void *user;             /* the imported address the caller passed */
    uint64_t bytes;
    void *copy;             /* NULL until the operation starts */
    uint64_t copy_offset;   /* in this rank's arena */
} hccl_shadow_t;

#define HCCL_SHADOWS 2

struct op_task {
    sim_task_t base;
    hccl_comm_t *comm;
    sim_stream_t *stream;
    void *stream_handle;    /* to check at HcclGroupEnd that the stream still exists */
    uint32_t type;          /* HcclCMDType */
    uint64_t lseq, cseq, pseq;  /* messages number collectives by cseq and point-to-point calls by
                                 * pseq, as hcclpy's flight recorder does */

    void *send, *recv;
    uint64_t send_offset, recv_offset; /* in this rank's arena; UINT64_MAX = none */
    uint64_t count, recv_count;
    HcclDataType dtype, recv_dtype;
    HcclReduceOp op;
    uint32_t root, peer;
    uint64_t *vectors;      /* copies of the caller's count / displacement arrays */
    uint32_t vector_count;
    HcclSendRecvItem *items;
    uint32_t item_count;

    /* execution state */
    bool started;
    bool streaming;         /* large: store around the caches */
    bool tiny;              /* eager, and travels in the progress word's line */
    int phase;
    bool self_copied;       /* point to point: the batch's items to the rank itself are done */
    int64_t deadline_ns;
    uint64_t *item_seq;
    uint8_t *item_state;
    op_desc_t call;         /* the call on a communicator across servers this is a step of (seq 0: none) */
    hccl_shadow_t shadow[HCCL_SHADOWS];
    uint32_t shadow_count;
    /* across servers (net.c): run by the communicator's network thread */
    struct op_task *net_next;
    _Atomic uint32_t net_done;
    int net_rc;
    char *net_text;         /* why it failed */
};

op_task_t *hccl_op_new(hccl_comm_t *comm, sim_stream_t *stream, uint32_t type);
void hccl_op_free(op_task_t *op);
/* Numbers an operation as the call that makes it now would, without queueing it (a replay's copy,
 * a step of an operation across servers): pseq for point to point, then lseq / cseq, pending. */
void hccl_op_number(op_task_t *op);
/* Assigns sequence numbers and queues the operation on its stream; a small collective takes its
 * first steps at once in the calling thread (see ops.c). */
void hccl_op_submit(op_task_t *op);
int hccl_op_run(sim_task_t *task, int64_t caller_deadline_ns);
/* Whether an HcclCMDType is a collective (matched across ranks by sequence
 * number) rather than point to point. */
bool hccl_cmd_is_collective(uint32_t type);
/* Whether the operation is a collective that moves so little that its ranks
 * exchange it through their slots (see exec.c): its first steps are worth
 * running at once. */
bool hccl_op_is_eager(const op_task_t *op);
/* "all_reduce(count=4, float32, sum)": how messages name a call (exec.c). */
int hccl_op_describe(const op_desc_t *d, char *out, size_t len);
/* Whether two ranks' descriptions of their collective are the same call. */
bool hccl_same_call(const op_desc_t *a, const op_desc_t *b);
void hccl_op_cancel(sim_task_t *task, int error, const char *why);

/* Several communicator initialisations run at once, one thread each. */
typedef struct {
    pthread_t thread;
    const char *api;        /* the call that asked for it, for messages */
    uint32_t nranks, rank;
    rootinfo_wire_t wire;
    HcclCommConfig config;
    bool has_config;
    uint64_t join_kind;     /* seg_header_t.join_kind this rank joins with */
    int device;
    bool set_device;
    HcclComm comm;
    HcclComm *out;
    int err;
    char text[1024];
} init_job_t;

int hccl_run_init_jobs(init_job_t *jobs, uint32_t count);

/* group.c */
bool hccl_group_active(void);
int hccl_group_add_op(op_task_t *op);
int hccl_group_add_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                        const HcclCommConfig *config, uint64_t join_kind, int device, HcclComm *out);

/* ranktable.c */

/* What the rank table says about one rank, and where its rank 0 serves the root info. */
typedef struct {
    uint32_t nranks;
    int device;             /* physical */
    char node[64];          /* the rank's server_id */
    uint32_t servers;       /* how many servers have ranks: several meet over TCP (net.c) */
    char root_server[64];   /* rank 0's server_id */
    uint8_t token[16];      /* digest of the table: what the ranks of several servers present */
    struct sockaddr_un addr;
    socklen_t addr_len;
} hccl_rank_table_t;

typedef struct rank_table_server rank_table_server_t;

/* Reads and checks the rank table; touches nothing shared. */
int hccl_rank_table_read(const char *path, uint32_t rank, hccl_rank_table_t *table);
/* Rank 0 makes a root info and serves it (`*server`, to stop with hccl_rank_table_stop); the
 * other ranks fetch it (`*server` = NULL).  With several servers, every rank derives the root info
 * of a TCP bootstrap that rank 0 serves (`*server` = NULL). */
int hccl_rank_table_rendezvous(const hccl_rank_table_t *table, uint32_t rank, rootinfo_wire_t *wire,
                               rank_table_server_t **server);
/* Stops serving and waits for the server thread; NULL is ignored. */
void hccl_rank_table_stop(rank_table_server_t *server);

#endif
