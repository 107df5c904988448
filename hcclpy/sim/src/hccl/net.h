/* Communicators whose ranks span servers (net.c, netops.c).
 *
 * Every simulated rank belongs to a server.  Ranks of one server reach each other's device memory
 * (the rest of libhccl); ranks of different servers only talk over TCP, as HCCL's ranks on
 * different servers talk over RoCE.  A communicator that spans servers holds the communicator of
 * this rank's server (`local`, an ordinary one) and one TCP connection to every rank of the other
 * servers, and runs each operation in HCCL's hierarchical form: inside the server, across the
 * servers, inside the server again (netops.c). */
#ifndef HCCLPY_SIM_HCCL_NET_H
#define HCCLPY_SIM_HCCL_NET_H

#include "hccl/internal.h"

/* The magic of a root info whose ranks meet over TCP: its `node` holds the root's address, its
 * `fd` the port, its token is the secret every member presents. */
#define HCCL_NET_MAGIC "HPSNET01"

/* A block of device memory a communicator stages through (netops.c). */
#define HCCL_NET_STAGING_BLOCKS 8
typedef struct {
    uint64_t offset, bytes;     /* in the device's arena; 0 bytes: none yet */
    char *base;
} hccl_net_block_t;

struct hccl_net {
    uint32_t nranks, rank;
    int device;
    uint32_t nservers;
    uint32_t server;            /* this rank's server */
    uint32_t *server_of;        /* per rank */
    uint32_t *local_rank_of;    /* per rank: its index among its server's ranks */
    uint32_t *server_size;      /* per server */
    uint32_t **members;         /* per server: its ranks, in rank order */
    uint32_t *leader;           /* per server: its lowest rank */
    bool even;                  /* every server has as many ranks */
    bool flat;                  /* HCCL_ALGO / hcclAlgo "ring": all_reduce as one ring of every rank over TCP */
    char (*server_name)[64];    /* per server */
    HcclComm local_handle;
    hccl_comm_t *local;         /* this server's communicator (a reference held) */
    int *sock;                  /* per rank: the connection to it, -1 for ranks of this server */
    uint64_t *sent, *received;  /* per rank: messages so far, which the next message's header names */
    bool *midway;               /* per rank: a message to it is partly sent */
    bool shut;
    /* The network thread runs the operations (in the order they are handed over); `lock` guards
     * its queue and every send on the connections, so that a failure's notice
     * (hccl_net_shutdown) never lands inside a message. */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool thread_started, stopping;
    op_task_t *head, *tail;
    hccl_net_block_t staging[HCCL_NET_STAGING_BLOCKS];
};

/* Whether this process's ranks take part in a job that spans servers (HCCLPY_SIM_SERVER, or a
 * launcher saying so): its root infos are then made for TCP. */
bool hccl_net_wanted(void);
bool hccl_net_is_wire(const rootinfo_wire_t *wire);
/* A root info for TCP: a listener of this process serves it until every rank has joined or the
 * connect timeout has passed. */
int hccl_net_root_info(rootinfo_wire_t *wire);
/* The same root info at a fixed place (a rank table's: host, port and token the ranks derive
 * alike); `serve` on the rank that listens there. */
int hccl_net_fixed_root_info(const char *host, uint16_t port, const uint8_t token[16], bool serve,
                             rootinfo_wire_t *wire);
/* Joins the communicator of a TCP root info as `rank` of `nranks`, from `server` (NULL: this
 * process's).  With one server the result is an ordinary communicator. */
int hccl_net_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                  const HcclCommConfig *config, int device, const char *server, HcclComm *out);
/* Releases what a spanning communicator holds (its last reference went). */
void hccl_net_free(hccl_net_t *net);
/* Tells the other servers' ranks and this server's that the communicator failed with `code`
 * because of `why`: a rank waiting for this one's data reports that instead of a closed
 * connection. */
void hccl_net_shutdown(hccl_net_t *net, HcclResult code, const char *why);

/* netops.c: runs operation `op` of a spanning communicator to its end (HCCL_SUCCESS or a code,
 * recorded). */
int hccl_net_run(op_task_t *op);
/* Hands `op` to the communicator's network thread (started on first use). */
int hccl_net_submit(op_task_t *op);
/* Waits until the network thread has run `op` or the caller's deadline passes: SIM_TASK_AGAIN,
 * or what hccl_net_run returned, its text recorded in this thread. */
int hccl_net_wait(op_task_t *op, int64_t caller_deadline_ns);

/* One TCP transfer of an operation with a peer: a message to it, one from it, or both.  Every
 * message is preceded by a header holding `what` (the call as this rank made it, `seq` replaced
 * by the number of the message between the two ranks), which the receiver compares with its
 * own: a rank that called something else is named. */
typedef struct {
    uint64_t bytes;
    op_desc_t what;
} hccl_msg_header_t;

typedef struct {
    uint32_t peer;
    const void *send;           /* NULL: nothing to send */
    uint64_t send_bytes;
    void *recv;                 /* NULL: nothing to receive */
    uint64_t recv_bytes;
    op_desc_t what;             /* type HCCL_CMD_SEND for point to point, with the item's count and dtype */
    /* progress */
    hccl_msg_header_t out, in;
    uint64_t out_done, in_done; /* header and payload bytes moved */
} hccl_xfer_t;

/* Moves every transfer to its end, all at once (the messages of one peer in the order given).
 * Fails on a closed connection, a header that does not match, at the communicator's execution
 * timeout, or when the communicator is aborted or suspended. */
int hccl_net_exchange(op_task_t *op, hccl_xfer_t *xfers, uint32_t count);

#endif
