/* Communicators whose ranks span servers: which server a rank is on, the TCP bootstrap, the
 * connections between servers and the transfers over them (net.h).
 *
 * Bootstrap.  The root info names a listener of the root's process (HcclGetRootInfo in a job
 * that spans servers) and a random token.  Every rank connects to it, presents the token, its
 * rank, its server's name and the address of its own data listener.  Once all have come the root
 * tells each the layout (which rank is on which server, every data listener's address); the
 * lowest rank of each server makes a root info for its server's communicator and the root relays
 * it to the server's other ranks.  Each rank then joins its server's communicator (shared memory)
 * and connects to every rank of the other servers (the lower rank connects, presenting the token;
 * the higher accepts).  A rank that never comes is named when the connect timeout passes.
 *
 * Operations.  An operation runs on the thread that runs its stream when that thread waits as long
 * as it takes, else on the communicator's network thread while the caller waits as long as it may
 * (exec.c), one at a time, in the communicator's order.  A rank that fails sends its failure to the
 * ranks it is connected to, between two messages, before it closes its connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hccl/net.h"

#define DEFAULT_CONNECT_TIMEOUT_S 120.0
#define HELLO_MAGIC 0x4f4c4c4548534e48ULL /* "HNSHELLO" */
#define POLL_SLICE_MS 100
#define ROOT_ANSWER_GRACE_NS 2000000000LL

/* ------------------------------------------------------------ the server */

bool hccl_net_wanted(void)
{
    return sim_server(NULL, 0) != SIM_SERVER_ALONE;
}

/* -------------------------------------------------------------- addresses */

/* The address this process's listeners take and advertise: HCCL_IF_IP, else the first IPv4
 * address of an interface named in HCCL_SOCKET_IFNAME (a comma-separated list; a leading '=' asks
 * for exact names, as HCCL's does, otherwise names are prefixes), else the address this process
 * reaches the root from (`root_fd`, a connection to it, or -1 for the root itself), else 127.0.0.1
 * when HCCLPY_SIM_SERVER puts several servers on this machine, else the first IPv4 address of an
 * interface that is up and not the loopback. */
static int local_address(char *out, size_t len, int root_fd)
{
    const char *ip = getenv("HCCL_IF_IP");
    if (ip != NULL && *ip != '\0') {
        struct in_addr a4;
        struct in6_addr a6;
        if (inet_pton(AF_INET, ip, &a4) != 1 && inet_pton(AF_INET6, ip, &a6) != 1)
            return hccl_error(HCCL_E_PARA, "HCCL_IF_IP='%s' is not an IPv4 or IPv6 address", ip);
        snprintf(out, len, "%s", ip);
        return HCCL_SUCCESS;
    }
    const char *names = getenv("HCCL_SOCKET_IFNAME");
    bool want_named = names != NULL && *names != '\0';
    struct sockaddr_storage here;
    socklen_t here_len = sizeof here;
    if (!want_named && root_fd >= 0 && getsockname(root_fd, (struct sockaddr *)&here, &here_len) == 0 &&
        getnameinfo((struct sockaddr *)&here, here_len, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST) == 0)
        return HCCL_SUCCESS;
    if (!want_named && sim_server(NULL, 0) == SIM_SERVER_SET) {
        snprintf(out, len, "127.0.0.1");
        return HCCL_SUCCESS;
    }
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0)
        return hccl_error(HCCL_E_SYSCALL, "listing the network interfaces failed: %s", strerror(errno));
    bool exact = want_named && names[0] == '=';
    bool found = false;
    for (struct ifaddrs *i = list; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
            continue;
        if (want_named) {
            char copy[256];
            snprintf(copy, sizeof copy, "%s", names + exact);
            bool match = false;
            for (char *save = NULL, *name = strtok_r(copy, ",", &save); name != NULL && !match;
                 name = strtok_r(NULL, ",", &save))
                match = exact ? strcmp(i->ifa_name, name) == 0 : strncmp(i->ifa_name, name, strlen(name)) == 0;
            if (!match)
                continue;
        } else if (i->ifa_flags & IFF_LOOPBACK) {
            continue;
        }
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)len);
        found = true;
    }
    freeifaddrs(list);
    if (found)
        return HCCL_SUCCESS;
    if (want_named)
        return hccl_error(HCCL_E_PARA, "HCCL_SOCKET_IFNAME='%s': no interface of that name is up with an IPv4 "
                          "address", names);
    snprintf(out, len, "127.0.0.1");
    return HCCL_SUCCESS;
}

static int sockaddr_of(const char *host, uint16_t port, struct sockaddr_storage *addr, socklen_t *addr_len)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char service[8];
    snprintf(service, sizeof service, "%u", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0)
        return hccl_error(HCCL_E_PARA, "cannot resolve '%s': %s", host, gai_strerror(rc));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *addr_len = res->ai_addrlen;
    freeaddrinfo(res);
    return HCCL_SUCCESS;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Large buffers: a transfer between servers moves megabytes, and each wakeup should move many. */
    int bytes = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

/* A listening socket on `host` (port 0: the kernel's pick); the port it got. */
static int listen_on(const char *host, uint16_t port, int *fd_out, uint16_t *port_out)
{
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int err = sockaddr_of(host, port, &addr, &addr_len);
    if (err != HCCL_SUCCESS)
        return err;
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return hccl_error(HCCL_E_SYSCALL, "socket() failed: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&addr, addr_len) != 0 || listen(fd, 4096) != 0) {
        int saved = errno;
        close(fd);
        return hccl_error(HCCL_E_SYSCALL, "cannot listen on %s:%u: %s (HCCL_IF_IP / HCCL_SOCKET_IFNAME choose the "
                          "address)", host, port, strerror(saved));
    }
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &bound_len);
    *port_out = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                 : ((struct sockaddr_in6 *)&bound)->sin6_port);
    *fd_out = fd;
    return HCCL_SUCCESS;
}

/* Connects to host:port, trying again until `deadline` while nobody listens there yet (with
 * `listening`, whoever should is known to listen already: a refusal is final). */
static int connect_to(const char *host, uint16_t port, int64_t deadline, const char *what, bool listening,
                      int *fd_out)
{
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int err = sockaddr_of(host, port, &addr, &addr_len);
    if (err != HCCL_SUCCESS)
        return err;
    int64_t pause_us = 1000;
    for (;;) {
        int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return hccl_error(HCCL_E_SYSCALL, "socket() failed: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&addr, addr_len) == 0) {
            tune(fd);
            *fd_out = fd;
            return HCCL_SUCCESS;
        }
        int saved = errno;
        close(fd);
        if (saved == ECONNREFUSED && listening)
            return hccl_error(HCCL_E_UNAVAIL, "nobody listens for %s at %s:%u any more: its communicator was "
                              "formed, or failed, or its process exited (a root info serves one communicator)",
                              what, host, port);
        if (saved != ECONNREFUSED && saved != ETIMEDOUT && saved != ENETUNREACH && saved != EHOSTUNREACH &&
            saved != EAGAIN && saved != EINTR)
            return hccl_error(HCCL_E_TCP_CONNECT, "connecting to %s at %s:%u failed: %s", what, host, port,
                              strerror(saved));
        if (sim_now_ns() > deadline)
            return hccl_error(HCCL_E_TIMEOUT, "nobody listens for %s at %s:%u (%s) within HCCL_CONNECT_TIMEOUT", what,
                              host, port, strerror(saved));
        usleep((useconds_t)pause_us);
        pause_us = SIM_MIN(pause_us * 2, 100000);
    }
}

/* Blocking whole-message I/O with a deadline, for the bootstrap. */
static int io_all(int fd, void *buf, size_t len, bool writing, int64_t deadline, const char *what)
{
    char *p = buf;
    while (len > 0) {
        struct pollfd pfd = {fd, writing ? POLLOUT : POLLIN, 0};
        int64_t left_ms = (deadline - sim_now_ns()) / 1000000;
        if (left_ms <= 0)
            return hccl_error(HCCL_E_TIMEOUT, "timed out (HCCL_CONNECT_TIMEOUT) waiting for %s", what);
        int rc = poll(&pfd, 1, (int)SIM_MIN(left_ms, POLL_SLICE_MS));
        if (rc < 0 && errno != EINTR)
            return hccl_error(HCCL_E_TCP_TRANSFER, "poll failed waiting for %s: %s", what, strerror(errno));
        if (rc <= 0)
            continue;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n == 0)
            return hccl_error(HCCL_E_TCP_TRANSFER, "the connection closed while waiting for %s", what);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return hccl_error(HCCL_E_TCP_TRANSFER, "the connection failed while waiting for %s: %s", what,
                              strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return HCCL_SUCCESS;
}

/* ----------------------------------------------------------- bootstrap wire */

typedef struct {
    uint64_t magic;
    uint8_t token[16];
    uint32_t nranks, rank;
    int32_t pid;
    uint16_t port;              /* of the rank's data listener */
    uint16_t pad;
    char server[64];
    char host[64];
} hello_t;

typedef struct {
    uint32_t status;            /* HcclResult: not HCCL_SUCCESS, the text says why */
    uint32_t nservers;
    char text[512];
} layout_head_t;

typedef struct {
    uint32_t server;
    uint16_t port;
    uint16_t pad;
    char host[64];
} layout_rank_t;

/* -------------------------------------------------------------- the root */

typedef struct {
    int listener;
    uint8_t token[16];
    int64_t deadline;
    char where[96];
} root_t;

static int64_t connect_timeout_ns(void)
{
    return (int64_t)(sim_env_seconds("HCCL_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S) * 1e9);
}

/* Tells a rank why the communicator will not form (its own deadline may have passed: the rank's
 * socket buffer takes the answer at once, or the rank is gone). */
static void send_failure(int fd, HcclResult code, const char *text)
{
    layout_head_t head = {0};
    head.status = code;
    snprintf(head.text, sizeof head.text, "%s", text);
    io_all(fd, &head, sizeof head, true, sim_now_ns() + 1000000000LL, "a rank");
}

/* Names the ranks missing from `have` (nranks entries), "2, 5, 7" (at most 16 named). */
static void missing_ranks(const int *fds, uint32_t nranks, char *out, size_t len)
{
    size_t at = 0;
    uint32_t named = 0, missing = 0;
    out[0] = '\0';
    for (uint32_t r = 0; r < nranks; r++) {
        if (fds[r] >= 0)
            continue;
        missing++;
        if (named < 16 && at < len)
            at += (size_t)snprintf(out + at, len - at, "%s%u", named ? ", " : "", r), named++;
    }
    if (missing > named && at < len)
        snprintf(out + at, len - at, " and %u more", missing - named);
}

/* Serves one communicator's bootstrap (see the top of the file), then exits. */
static void *root_main(void *arg)
{
    root_t *root = arg;
    int *fds = NULL;
    hello_t *hellos = NULL;
    uint32_t nranks = 0, joined = 0;
    char text[512] = "";
    HcclResult status = HCCL_SUCCESS;
    int64_t deadline = root->deadline;
    for (;;) {
        struct pollfd pfd = {root->listener, POLLIN, 0};
        int64_t left_ms = (deadline - sim_now_ns()) / 1000000;
        if (left_ms <= 0) {
            if (nranks == 0) {
                snprintf(text, sizeof text, "no rank joined with the root info served at %s within "
                         "HCCL_CONNECT_TIMEOUT", root->where);
            } else {
                char missing[160];
                missing_ranks(fds, nranks, missing, sizeof missing);
                snprintf(text, sizeof text, "%u of %u ranks joined within HCCL_CONNECT_TIMEOUT; never came: rank%s "
                         "%s (is every server's job started, and can it reach %s?)", joined, nranks,
                         nranks - joined == 1 ? "" : "s", missing, root->where);
            }
            status = HCCL_E_TIMEOUT;
            break;
        }
        if (poll(&pfd, 1, (int)SIM_MIN(left_ms, POLL_SLICE_MS)) <= 0)
            continue;
        int fd = accept4(root->listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tune(fd);
        hello_t hello;
        int64_t hello_deadline = SIM_MIN(deadline, sim_now_ns() + 5000000000LL);
        if (io_all(fd, &hello, sizeof hello, false, hello_deadline, "a rank's hello") != HCCL_SUCCESS ||
            hello.magic != HELLO_MAGIC || memcmp(hello.token, root->token, 16) != 0) {
            close(fd); /* not one of ours: no answer */
            continue;
        }
        hello.server[63] = hello.host[63] = '\0';
        if (nranks == 0) {
            nranks = hello.nranks;
            fds = malloc(nranks * sizeof *fds);
            hellos = calloc(nranks, sizeof *hellos);
            if (fds == NULL || hellos == NULL) {
                send_failure(fd, HCCL_E_MEMORY, "the root ran out of host memory");
                close(fd);
                status = HCCL_E_MEMORY;
                snprintf(text, sizeof text, "the root ran out of host memory");
                break;
            }
            for (uint32_t r = 0; r < nranks; r++)
                fds[r] = -1;
        }
        if (hello.nranks != nranks || hello.rank >= nranks || fds[hello.rank] >= 0) {
            status = HCCL_E_PARA;
            if (hello.nranks != nranks)
                snprintf(text, sizeof text, "rank %u passed nRanks=%u, but another rank passed %u", hello.rank,
                         hello.nranks, nranks);
            else if (hello.rank >= nranks)
                snprintf(text, sizeof text, "rank %u is out of range for nRanks=%u", hello.rank, nranks);
            else
                snprintf(text, sizeof text, "rank %u of this communicator was already taken by another caller (each "
                         "rank must pass a different rank id)", hello.rank);
            send_failure(fd, status, text);
            close(fd);
            break;
        }
        fds[hello.rank] = fd;
        hellos[hello.rank] = hello;
        if (++joined == nranks)
            break;
        /* As a root info of one server: the time left counts from the last rank that came. */
        deadline = sim_now_ns() + connect_timeout_ns();
    }
    /* Nobody else may join: a rank that comes later is refused at once (connect_to). */
    close(root->listener);
    root->listener = -1;
    /* The layout: servers numbered in the order of their lowest rank. */
    uint32_t nservers = 0;
    uint32_t *server_of = status == HCCL_SUCCESS ? calloc(nranks, sizeof *server_of) : NULL;
    if (status == HCCL_SUCCESS && server_of == NULL) {
        status = HCCL_E_MEMORY;
        snprintf(text, sizeof text, "the root ran out of host memory");
    }
    for (uint32_t r = 0; status == HCCL_SUCCESS && r < nranks; r++) {
        uint32_t s = 0;
        for (uint32_t q = 0; q < r && s == 0; q++)
            if (strcmp(hellos[q].server, hellos[r].server) == 0)
                s = server_of[q] + 1;
        server_of[r] = s ? s - 1 : nservers++;
    }
    for (uint32_t r = 0; r < nranks && fds != NULL; r++) {
        if (fds[r] < 0)
            continue;
        if (status != HCCL_SUCCESS) {
            send_failure(fds[r], status, text);
            continue;
        }
        layout_head_t head = {0};
        head.nservers = nservers;
        int err = io_all(fds[r], &head, sizeof head, true, deadline, "rank");
        for (uint32_t q = 0; q < nranks && err == HCCL_SUCCESS; q++) {
            layout_rank_t entry = {0};
            entry.server = server_of[q];
            entry.port = hellos[q].port;
            memcpy(entry.host, hellos[q].host, sizeof entry.host);
            err = io_all(fds[r], &entry, sizeof entry, true, deadline, "rank");
        }
        for (uint32_t s = 0; s < nservers && err == HCCL_SUCCESS; s++) {
            uint32_t q = 0;
            while (server_of[q] != s)
                q++;
            err = io_all(fds[r], hellos[q].server, 64, true, deadline, "rank");
        }
    }
    /* Relay each server's root info from its lowest rank to its other ranks. */
    for (uint32_t s = 0; status == HCCL_SUCCESS && s < nservers; s++) {
        uint32_t lead = 0;
        while (server_of[lead] != s)
            lead++;
        rootinfo_wire_t local;
        if (io_all(fds[lead], &local, sizeof local, false, deadline, "a server's root info") != HCCL_SUCCESS)
            memset(&local, 0, sizeof local); /* the others then fail to join it, and say so */
        for (uint32_t r = lead + 1; r < nranks; r++)
            if (server_of[r] == s)
                io_all(fds[r], &local, sizeof local, true, deadline, "rank");
    }
    for (uint32_t r = 0; r < nranks && fds != NULL; r++)
        if (fds[r] >= 0)
            close(fds[r]);
    free(server_of);
    free(fds);
    free(hellos);
    free(root);
    return NULL;
}

static int start_root(const char *host, uint16_t port, const uint8_t token[16], rootinfo_wire_t *wire)
{
    root_t *root = calloc(1, sizeof *root);
    if (root == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    uint16_t bound = 0;
    int err = listen_on(host, port, &root->listener, &bound);
    if (err != HCCL_SUCCESS) {
        free(root);
        return err;
    }
    memcpy(root->token, token, 16);
    root->deadline = sim_now_ns() + connect_timeout_ns();
    snprintf(root->where, sizeof root->where, "%s:%u", host, bound);
    memset(wire, 0, sizeof *wire);
    memcpy(wire->magic, HCCL_NET_MAGIC, sizeof wire->magic);
    memcpy(wire->token, token, 16);
    wire->fd = bound;
    wire->pid = getpid();
    snprintf(wire->node, sizeof wire->node, "%s", host);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, root_main, root);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(root->listener);
        free(root);
        return hccl_error(HCCL_E_SYSCALL, "starting the root's thread failed: %s", strerror(rc));
    }
    return HCCL_SUCCESS;
}

bool hccl_net_is_wire(const rootinfo_wire_t *wire)
{
    return memcmp(wire->magic, HCCL_NET_MAGIC, sizeof wire->magic) == 0;
}

int hccl_net_root_info(rootinfo_wire_t *wire)
{
    char host[64];
    int err = local_address(host, sizeof host, -1);
    if (err != HCCL_SUCCESS)
        return err;
    uint8_t token[16];
    uint64_t a = sim_random64(), b = sim_random64();
    memcpy(token, &a, 8);
    memcpy(token + 8, &b, 8);
    return start_root(host, 0, token, wire);
}

int hccl_net_fixed_root_info(const char *host, uint16_t port, const uint8_t token[16], bool serve,
                             rootinfo_wire_t *wire)
{
    if (serve)
        return start_root(host, port, token, wire);
    memset(wire, 0, sizeof *wire);
    memcpy(wire->magic, HCCL_NET_MAGIC, sizeof wire->magic);
    memcpy(wire->token, token, 16);
    wire->fd = port;
    snprintf(wire->node, sizeof wire->node, "%s", host);
    return HCCL_SUCCESS;
}

/* ------------------------------------------------------------------- join */

void hccl_net_free(hccl_net_t *net)
{
    if (net == NULL)
        return;
    if (net->thread_started) {
        /* Idle by now: every operation holds a reference on the communicator. */
        pthread_mutex_lock(&net->lock);
        net->stopping = true;
        pthread_cond_signal(&net->wake);
        pthread_mutex_unlock(&net->lock);
        pthread_join(net->thread, NULL);
    }
    pthread_mutex_destroy(&net->lock);
    pthread_cond_destroy(&net->wake);
    for (uint32_t r = 0; net->sock != NULL && r < net->nranks; r++)
        if (net->sock[r] >= 0)
            close(net->sock[r]);
    for (uint32_t s = 0; net->members != NULL && s < net->nservers; s++)
        free(net->members[s]);
    for (int b = 0; b < HCCL_NET_STAGING_BLOCKS; b++)
        if (net->staging[b].bytes > 0)
            sim_arena_free_block(net->device, net->staging[b].offset);
    if (net->local != NULL) {
        HcclCommDestroy(net->local_handle);
        hccl_comm_unref(net->local);
    }
    free(net->members);
    free(net->server_size);
    free(net->leader);
    free(net->server_name);
    free(net->sent);
    free(net->received);
    free(net->midway);
    free(net->local_rank_of);
    free(net->server_of);
    free(net->sock);
    free(net);
}

/* What a failing rank sends in place of its next message: a header of this type (the code in
 * `what.op`), then ABORT_TEXT_BYTES of text. */
#define MSG_ABORT 0xAB0Du
#define ABORT_TEXT_BYTES 512u

void hccl_net_shutdown(hccl_net_t *net, HcclResult code, const char *why)
{
    pthread_mutex_lock(&net->lock);
    if (net->shut) {
        pthread_mutex_unlock(&net->lock);
        return;
    }
    net->shut = true;
    struct {
        hccl_msg_header_t head;
        char text[ABORT_TEXT_BYTES];
    } frame;
    memset(&frame, 0, sizeof frame);
    frame.head.bytes = ABORT_TEXT_BYTES;
    frame.head.what.type = MSG_ABORT;
    frame.head.what.op = code;
    snprintf(frame.text, sizeof frame.text, "%s", why);
    for (uint32_t r = 0; r < net->nranks; r++) {
        if (net->sock[r] < 0)
            continue;
        /* Not in the middle of a message: the peer would read the frame as its data.  Best effort,
         * never waiting: the socket's buffer takes it or the peer sees the connection end. */
        if (!net->midway[r])
            (void)!send(net->sock[r], &frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
        shutdown(net->sock[r], SHUT_WR);
    }
    pthread_mutex_unlock(&net->lock);
    if (net->local != NULL && hccl_comm_broken(net->local) == HCCL_SUCCESS)
        hccl_comm_abort(net->local, HCCL_E_REMOTE, "rank %u of the communicator spanning servers failed: %s",
                        net->rank, why);
}

/* The text of an abort frame whose header was just read: waits a little for it. */
static void read_abort_text(int fd, char *text)
{
    size_t got = 0;
    int64_t deadline = sim_now_ns() + 1000000000LL;
    while (got < ABORT_TEXT_BYTES && sim_now_ns() < deadline) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, text + got, ABORT_TEXT_BYTES - got, MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
            break;
        if (n > 0)
            got += (size_t)n;
    }
    text[got < ABORT_TEXT_BYTES ? got : ABORT_TEXT_BYTES - 1] = '\0';
}

static int read_layout(hccl_net_t *net, int fd, int64_t deadline, layout_rank_t **ranks_out)
{
    layout_head_t head;
    int err = io_all(fd, &head, sizeof head, false, deadline, "the root's answer");
    if (err != HCCL_SUCCESS)
        return err;
    if (head.status != HCCL_SUCCESS) {
        head.text[sizeof head.text - 1] = '\0';
        return hccl_error((HcclResult)head.status, "%s", head.text);
    }
    uint32_t n = net->nranks;
    if (head.nservers == 0 || head.nservers > n)
        return hccl_error(HCCL_E_INTERNAL, "the root's answer names %u servers for %u ranks", head.nservers, n);
    net->nservers = head.nservers;
    layout_rank_t *ranks = calloc(n, sizeof *ranks);
    net->server_of = calloc(n, sizeof *net->server_of);
    net->local_rank_of = calloc(n, sizeof *net->local_rank_of);
    net->server_size = calloc(head.nservers, sizeof *net->server_size);
    net->members = calloc(head.nservers, sizeof *net->members);
    net->leader = calloc(head.nservers, sizeof *net->leader);
    net->server_name = calloc(head.nservers, sizeof *net->server_name);
    net->sock = malloc(n * sizeof *net->sock);
    net->sent = calloc(n, sizeof *net->sent);
    net->received = calloc(n, sizeof *net->received);
    net->midway = calloc(n, sizeof *net->midway);
    if (ranks == NULL || net->server_of == NULL || net->local_rank_of == NULL || net->server_size == NULL ||
        net->members == NULL || net->leader == NULL || net->server_name == NULL || net->sock == NULL ||
        net->sent == NULL || net->received == NULL || net->midway == NULL) {
        free(ranks);
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    }
    for (uint32_t r = 0; r < n; r++)
        net->sock[r] = -1;
    for (uint32_t r = 0; r < n && err == HCCL_SUCCESS; r++) {
        err = io_all(fd, &ranks[r], sizeof ranks[r], false, deadline, "the root's answer");
        if (err == HCCL_SUCCESS && ranks[r].server >= head.nservers)
            err = hccl_error(HCCL_E_INTERNAL, "the root's answer puts rank %u on server %u of %u", r, ranks[r].server,
                             head.nservers);
    }
    for (uint32_t s = 0; s < head.nservers && err == HCCL_SUCCESS; s++) {
        err = io_all(fd, net->server_name[s], 64, false, deadline, "the root's answer");
        net->server_name[s][63] = '\0';
    }
    for (uint32_t r = 0; r < n && err == HCCL_SUCCESS; r++) {
        ranks[r].host[63] = '\0';
        uint32_t s = ranks[r].server;
        net->server_of[r] = s;
        net->local_rank_of[r] = net->server_size[s]++;
    }
    for (uint32_t s = 0; s < head.nservers && err == HCCL_SUCCESS; s++) {
        net->members[s] = malloc(net->server_size[s] * sizeof *net->members[s]);
        if (net->members[s] == NULL)
            err = hccl_error(HCCL_E_MEMORY, "out of host memory");
    }
    for (uint32_t r = 0; r < n && err == HCCL_SUCCESS; r++) {
        uint32_t s = net->server_of[r];
        if (net->local_rank_of[r] == 0)
            net->leader[s] = r;
        net->members[s][net->local_rank_of[r]] = r;
    }
    net->even = true;
    for (uint32_t s = 1; s < head.nservers; s++)
        net->even = net->even && net->server_size[s] == net->server_size[0];
    net->server = net->server_of[net->rank];
    if (err != HCCL_SUCCESS) {
        free(ranks);
        return err;
    }
    *ranks_out = ranks;
    return HCCL_SUCCESS;
}

typedef struct {
    uint64_t magic;
    uint8_t token[16];
    uint32_t rank;
    uint32_t pad;
} link_hello_t;

/* Connects this rank with every rank of the other servers (with every rank at all for the flat
 * form): to the higher ones, accepting the lower ones. */
static int connect_servers(hccl_net_t *net, const layout_rank_t *ranks, int listener, const uint8_t token[16],
                           int64_t deadline)
{
    link_hello_t hello = {HELLO_MAGIC, {0}, net->rank, 0};
    memcpy(hello.token, token, 16);
    uint32_t lower = 0;
    for (uint32_t q = 0; q < net->nranks; q++) {
        if (q == net->rank || (net->server_of[q] == net->server && !net->flat))
            continue;
        if (q < net->rank) {
            lower++;
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "rank %u (server '%s')", q, net->server_name[net->server_of[q]]);
        int err = connect_to(ranks[q].host, ranks[q].port, deadline, what, true, &net->sock[q]);
        if (err == HCCL_SUCCESS)
            err = io_all(net->sock[q], &hello, sizeof hello, true, deadline, what);
        if (err != HCCL_SUCCESS)
            return err;
    }
    while (lower > 0) {
        struct pollfd pfd = {listener, POLLIN, 0};
        int64_t left_ms = (deadline - sim_now_ns()) / 1000000;
        if (left_ms <= 0) {
            char missing[160] = "";
            size_t at = 0;
            for (uint32_t q = 0; q < net->rank && at < sizeof missing; q++)
                if ((net->server_of[q] != net->server || net->flat) && net->sock[q] < 0)
                    at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%u ('%s')", at ? ", " : "", q,
                                           net->server_name[net->server_of[q]]);
            return hccl_error(HCCL_E_TIMEOUT, "rank %u: rank%s %s never connected within HCCL_CONNECT_TIMEOUT",
                              net->rank, lower == 1 ? "" : "s", missing);
        }
        if (poll(&pfd, 1, (int)SIM_MIN(left_ms, POLL_SLICE_MS)) <= 0)
            continue;
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tune(fd);
        link_hello_t theirs;
        if (io_all(fd, &theirs, sizeof theirs, false, SIM_MIN(deadline, sim_now_ns() + 5000000000LL),
                   "a peer's hello") != HCCL_SUCCESS ||
            theirs.magic != HELLO_MAGIC || memcmp(theirs.token, token, 16) != 0 || theirs.rank >= net->rank ||
            (net->server_of[theirs.rank] == net->server && !net->flat) || net->sock[theirs.rank] >= 0) {
            close(fd);
            continue;
        }
        net->sock[theirs.rank] = fd;
        lower--;
    }
    for (uint32_t q = 0; q < net->nranks; q++)
        if (net->sock[q] >= 0)
            fcntl(net->sock[q], F_SETFL, fcntl(net->sock[q], F_GETFL) | O_NONBLOCK);
    return HCCL_SUCCESS;
}

int hccl_net_init(const char *api, uint32_t nranks, const rootinfo_wire_t *wire, uint32_t rank,
                  const HcclCommConfig *config, int device, const char *server, HcclComm *out)
{
    if (nranks == 0 || nranks > HCCL_SIM_MAX_RANKS)
        return hccl_error(HCCL_E_PARA, "%s: nRanks must be in [1, %u], got %u", api, HCCL_SIM_MAX_RANKS, nranks);
    if (rank >= nranks)
        return hccl_error(HCCL_E_PARA, "%s: rank %u is out of range for nRanks=%u", api, rank, nranks);
    const char *mine = server != NULL ? server : sim_config()->node;
    int64_t deadline = sim_now_ns() + connect_timeout_ns();
    hello_t hello = {0};
    int listener = -1, root_fd = -1;
    const char *root_where = "the communicator's root";
    /* A root info from HcclGetRootInfo names a root that listens from the start (its `pid` is set);
     * a rank table's rank 0 may not have started yet. */
    int err = connect_to(wire->node, (uint16_t)wire->fd, deadline, root_where, wire->pid != 0, &root_fd);
    if (err == HCCL_SUCCESS)
        err = local_address(hello.host, sizeof hello.host, root_fd);
    if (err == HCCL_SUCCESS)
        err = listen_on(hello.host, 0, &listener, &hello.port);
    hello.magic = HELLO_MAGIC;
    memcpy(hello.token, wire->token, 16);
    hello.nranks = nranks;
    hello.rank = rank;
    hello.pid = getpid();
    snprintf(hello.server, sizeof hello.server, "%s", mine);
    if (err == HCCL_SUCCESS)
        err = io_all(root_fd, &hello, sizeof hello, true, deadline, root_where);

    hccl_net_t *net = calloc(1, sizeof *net);
    layout_rank_t *ranks = NULL;
    if (net == NULL && err == HCCL_SUCCESS)
        err = hccl_error(HCCL_E_MEMORY, "out of host memory");
    if (net != NULL) {
        net->nranks = nranks;
        net->rank = rank;
        net->device = device;
        pthread_mutex_init(&net->lock, NULL);
        pthread_cond_init(&net->wake, NULL);
    }
    /* The root names the ranks that never came when its own timeout passes: a little longer here
     * lets its answer arrive rather than a bare timeout. */
    if (err == HCCL_SUCCESS) {
        err = read_layout(net, root_fd, deadline + ROOT_ANSWER_GRACE_NS, &ranks);
        /* Let in just as the root stopped listening (the communicator formed), and dropped. */
        if (err == HCCL_E_TCP_TRANSFER && wire->pid != 0)
            err = hccl_error(HCCL_E_UNAVAIL, "%s stopped listening before it answered: its communicator was "
                             "formed, or failed, or its process exited (a root info serves one communicator)",
                             root_where);
    }
    /* This server's communicator: its lowest rank makes the root info, the root relays it. */
    rootinfo_wire_t local_wire;
    if (err == HCCL_SUCCESS) {
        if (net->leader[net->server] == rank) {
            err = hccl_get_root_info(&local_wire);
            if (err == HCCL_SUCCESS)
                err = io_all(root_fd, &local_wire, sizeof local_wire, true, deadline, root_where);
        } else {
            err = io_all(root_fd, &local_wire, sizeof local_wire, false, deadline, "this server's root info");
        }
    }
    if (root_fd >= 0)
        close(root_fd);
    if (err == HCCL_SUCCESS && net->nservers == 1) {
        /* Every rank on one server: an ordinary communicator, numbered as asked. */
        close(listener);
        hccl_net_free(net);
        free(ranks);
        return hccl_comm_init(api, nranks, &local_wire, rank, config, HCCL_SIM_JOIN_ROOT_INFO, device, mine, out);
    }
    if (err == HCCL_SUCCESS) {
        /* Named after the spanning communicator and the server, for messages. */
        HcclCommConfig named;
        HcclCommConfigInit(&named);
        if (config != NULL) {
            /* As much as the caller's version of the struct holds (its first word is its size). */
            uint64_t size;
            memcpy(&size, config, sizeof size);
            memcpy(&named, config, (size_t)SIM_MIN(size, sizeof named));
        }
        char whole[HCCL_SIM_NAME_BYTES];
        err = hccl_config_name(config, wire->token, api, whole, sizeof whole);
        snprintf(named.hcclCommName, sizeof named.hcclCommName, "%.60s@%.60s", whole, mine);
        if (err == HCCL_SUCCESS)
            err = hccl_comm_init(api, net->server_size[net->server], &local_wire, net->local_rank_of[rank], &named,
                                 HCCL_SIM_JOIN_ROOT_INFO, device, mine, &net->local_handle);
        if (err == HCCL_SUCCESS)
            net->local = hccl_comm_lookup(net->local_handle, api, &err);
    }
    if (err == HCCL_SUCCESS) {
        /* HCCL_ALGO's one-level form "ring" asks for the flat form (netops.c). */
        char algo[HCCL_COMM_ALGO_MAX_LENGTH];
        err = hccl_config_algo(config, api, algo, sizeof algo);
        net->flat = strcmp(algo, "ring") == 0;
    }
    if (err == HCCL_SUCCESS)
        err = connect_servers(net, ranks, listener, wire->token, deadline);
    if (listener >= 0)
        close(listener);
    free(ranks);
    if (err == HCCL_SUCCESS) {
        /* On failure the communicator object has released `net`. */
        return hccl_comm_new_spanning(api, nranks, rank, device, config, wire->token, net, out);
    }
    char text[512];
    snprintf(text, sizeof text, "%s", sim_error_text());
    if (net != NULL) {
        if (net->sock != NULL && net->midway != NULL)
            hccl_net_shutdown(net, (HcclResult)err, text);
        hccl_net_free(net);
    }
    return hccl_error((HcclResult)err, "%s: rank %u (server '%s'): %s", api, rank, mine, text);
}

/* -------------------------------------------------------------- transfers */

static bool same_message(const hccl_msg_header_t *theirs, const hccl_xfer_t *x)
{
    if (theirs->bytes != x->recv_bytes)
        return false;
    if (x->what.type == HCCL_CMD_SEND)
        return theirs->what.type == HCCL_CMD_SEND && theirs->what.count == x->what.count &&
               theirs->what.dtype == x->what.dtype;
    op_desc_t a = theirs->what, b = x->what;
    a.seq = b.seq = 0;
    return hccl_same_call(&a, &b);
}

static int mismatch(op_task_t *op, const hccl_xfer_t *x)
{
    hccl_comm_t *comm = op->comm;
    char mine[160], theirs[160];
    if (x->what.type == HCCL_CMD_SEND) {
        snprintf(mine, sizeof mine, "recv(count=%llu, %s) from it", (unsigned long long)x->what.count,
                 hccl_dtype_name(x->what.dtype));
    } else {
        hccl_op_describe(&x->what, mine, sizeof mine);
    }
    if (x->in.what.type == HCCL_CMD_SEND)
        snprintf(theirs, sizeof theirs, "send(count=%llu, %s) to it", (unsigned long long)x->in.what.count,
                 hccl_dtype_name(x->in.what.dtype));
    else
        hccl_op_describe(&x->in.what, theirs, sizeof theirs);
    bool collective = hccl_cmd_is_collective(op->type);
    return hccl_error(HCCL_E_PARA, HCCL_SIM_MISMATCH_MARK "%s' at operation #%llu: rank %u called %s but rank %u "
                      "(server '%s') called %s", comm->name, (unsigned long long)(collective ? op->cseq : op->pseq),
                      comm->rank, mine, x->peer, comm->net->server_name[comm->net->server_of[x->peer]], theirs);
}

/* A connection that ended (`error` 0) or failed: a peer that ended it, or whose kernel reset it
 * (it exited or was killed), failed there; any other error is this side's. */
static int connection_lost(const hccl_net_t *net, uint32_t peer, int error, const char *doing)
{
    const char *server = net->server_name[net->server_of[peer]];
    if (error == 0 || error == ECONNRESET || error == EPIPE || error == ENOTCONN)
        return hccl_error(HCCL_E_REMOTE, "rank %u (server '%s') closed its connection while rank %u was %s (it "
                          "failed, exited or was killed)", peer, server, net->rank, doing);
    return hccl_error(HCCL_E_TCP_TRANSFER, "the connection to rank %u (server '%s') failed while rank %u was %s: "
                      "%s", peer, server, net->rank, doing, strerror(error));
}

/* Whether `x` is the first unfinished transfer of its direction with its peer. */
static bool first_with_peer(const hccl_xfer_t *xfers, uint32_t i, bool sending)
{
    for (uint32_t j = 0; j < i; j++) {
        const hccl_xfer_t *y = &xfers[j];
        if (y->peer != xfers[i].peer)
            continue;
        if (sending ? (y->send != NULL && y->out_done < sizeof y->out + y->send_bytes)
                    : (y->recv != NULL && y->in_done < sizeof y->in + y->recv_bytes))
            return false;
    }
    return true;
}

/* Moves what the socket takes now (`*moved` set if anything did); HCCL_SUCCESS or an error. */
static int move_out(hccl_net_t *net, hccl_xfer_t *x, bool *moved)
{
    uint64_t total = sizeof x->out + x->send_bytes;
    while (x->out_done < total) {
        const char *from;
        uint64_t left;
        if (x->out_done < sizeof x->out) {
            from = (const char *)&x->out + x->out_done;
            left = sizeof x->out - x->out_done;
        } else {
            from = (const char *)x->send + (x->out_done - sizeof x->out);
            left = total - x->out_done;
        }
        pthread_mutex_lock(&net->lock);
        ssize_t n = send(net->sock[x->peer], from, (size_t)SIM_MIN(left, 1u << 30), MSG_NOSIGNAL | MSG_DONTWAIT);
        int error = errno;
        if (n > 0)
            x->out_done += (uint64_t)n;
        net->midway[x->peer] = x->out_done > 0 && x->out_done < total;
        pthread_mutex_unlock(&net->lock);
        if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK || error == EINTR))
            break;
        if (n <= 0)
            return connection_lost(net, x->peer, n < 0 ? error : 0, "sending to it");
        *moved = true;
    }
    return HCCL_SUCCESS;
}

static int move_in(op_task_t *op, hccl_xfer_t *x, bool *moved)
{
    hccl_net_t *net = op->comm->net;
    uint64_t total = sizeof x->in + x->recv_bytes;
    while (x->in_done < total) {
        char *to;
        uint64_t left;
        if (x->in_done < sizeof x->in) {
            to = (char *)&x->in + x->in_done;
            left = sizeof x->in - x->in_done;
        } else {
            to = (char *)x->recv + (x->in_done - sizeof x->in);
            left = total - x->in_done;
        }
        ssize_t n = recv(net->sock[x->peer], to, (size_t)SIM_MIN(left, 1u << 30), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0)
            return connection_lost(net, x->peer, n < 0 ? errno : 0, "waiting for its data");
        bool had_header = x->in_done >= sizeof x->in;
        x->in_done += (uint64_t)n;
        *moved = true;
        if (had_header || x->in_done < sizeof x->in)
            continue;
        if (x->in.what.type == MSG_ABORT) {
            char text[ABORT_TEXT_BYTES];
            read_abort_text(net->sock[x->peer], text);
            /* A mismatch stays one (its text says so); any other failure there is remote here. */
            HcclResult code = x->in.what.op == HCCL_E_PARA || x->in.what.op == HCCL_E_TIMEOUT
                                  ? (HcclResult)x->in.what.op : HCCL_E_REMOTE;
            return hccl_error(code, "rank %u (server '%s') failed: %s", x->peer,
                              net->server_name[net->server_of[x->peer]], text);
        }
        if (x->in.what.seq != x->what.seq || !same_message(&x->in, x))
            return mismatch(op, x);
    }
    return HCCL_SUCCESS;
}

int hccl_net_exchange(op_task_t *op, hccl_xfer_t *xfers, uint32_t count)
{
    hccl_comm_t *comm = op->comm;
    hccl_net_t *net = comm->net;
    struct pollfd *pfds = calloc(count ? count : 1, sizeof *pfds);
    if (pfds == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    for (uint32_t i = 0; i < count; i++) {
        hccl_xfer_t *x = &xfers[i];
        x->out_done = x->in_done = 0;
        if (x->send != NULL) {
            x->out.bytes = x->send_bytes;
            x->out.what = x->what;
            x->out.what.seq = ++net->sent[x->peer];
        }
        if (x->recv != NULL)
            x->what.seq = ++net->received[x->peer];
    }
    int64_t deadline = comm->exec_timeout_ns > 0 ? sim_now_ns() + comm->exec_timeout_ns : SIM_NO_DEADLINE;
    int err = HCCL_SUCCESS;
    for (;;) {
        bool done = true, moved = false;
        uint32_t npoll = 0;
        for (uint32_t i = 0; i < count && err == HCCL_SUCCESS; i++) {
            hccl_xfer_t *x = &xfers[i];
            short events = 0;
            if (x->send != NULL && x->out_done < sizeof x->out + x->send_bytes && first_with_peer(xfers, i, true)) {
                err = move_out(net, x, &moved);
                if (x->out_done < sizeof x->out + x->send_bytes)
                    events |= POLLOUT;
            }
            if (err == HCCL_SUCCESS && x->recv != NULL && x->in_done < sizeof x->in + x->recv_bytes &&
                first_with_peer(xfers, i, false)) {
                err = move_in(op, x, &moved);
                if (x->in_done < sizeof x->in + x->recv_bytes)
                    events |= POLLIN;
            }
            if ((x->send != NULL && x->out_done < sizeof x->out + x->send_bytes) ||
                (x->recv != NULL && x->in_done < sizeof x->in + x->recv_bytes))
                done = false;
            if (events != 0)
                pfds[npoll++] = (struct pollfd){net->sock[x->peer], events, 0};
        }
        if (err != HCCL_SUCCESS || done)
            break;
        if (moved)
            continue;
        if (atomic_load(&comm->suspended)) {
            err = hccl_error(HCCL_E_SUSPENDING, "%s on rank %u of '%s' was stopped by HcclCommSuspend (communicator "
                             "aborted)", hccl_cmd_name(op->type), comm->rank, comm->name);
            break;
        }
        if (hccl_comm_broken(comm) != HCCL_SUCCESS) {
            err = hccl_error(HCCL_E_REMOTE, "'%s' failed: %s", comm->name, hccl_abort_text(comm->header));
            break;
        }
        int64_t now = sim_now_ns();
        if (now > deadline) {
            char waiting[256] = "";
            size_t at = 0;
            for (uint32_t i = 0; i < count && at < sizeof waiting; i++) {
                hccl_xfer_t *x = &xfers[i];
                bool out = x->send != NULL && x->out_done < sizeof x->out + x->send_bytes;
                bool in = x->recv != NULL && x->in_done < sizeof x->in + x->recv_bytes;
                if (out || in)
                    at += (size_t)snprintf(waiting + at, sizeof waiting - at, "%s%s rank %u (server '%s')",
                                           at ? "; " : "", in ? "receiving from" : "sending to", x->peer,
                                           net->server_name[net->server_of[x->peer]]);
            }
            err = hccl_error(HCCL_E_TIMEOUT, "%s timed out after %.3g s (HCCL_EXEC_TIMEOUT / hcclExecTimeOut) on "
                             "rank %u: still %s", hccl_cmd_name(op->type), (double)comm->exec_timeout_ns / 1e9,
                             comm->rank, waiting);
            break;
        }
        int64_t slice_ms = SIM_MIN((int64_t)POLL_SLICE_MS, (deadline - now) / 1000000 + 1);
        if (poll(pfds, npoll, (int)slice_ms) < 0 && errno != EINTR) {
            err = hccl_error(HCCL_E_TCP_TRANSFER, "poll failed: %s", strerror(errno));
            break;
        }
    }
    free(pfds);
    return err;
}

/* -------------------------------------------------------- the network thread */

static void *network_main(void *arg)
{
    hccl_net_t *net = arg;
    for (;;) {
        pthread_mutex_lock(&net->lock);
        while (net->head == NULL && !net->stopping)
            pthread_cond_wait(&net->wake, &net->lock);
        op_task_t *op = net->head;
        if (op == NULL) {
            pthread_mutex_unlock(&net->lock);
            return NULL;
        }
        net->head = op->net_next;
        if (net->head == NULL)
            net->tail = NULL;
        pthread_mutex_unlock(&net->lock);
        int rc = hccl_net_run(op);
        op->net_rc = rc;
        if (rc != HCCL_SUCCESS)
            op->net_text = strdup(sim_error_text());
        /* The waiting thread may free the operation as soon as it sees this. */
        atomic_store_explicit(&op->net_done, 1, memory_order_release);
        sim_futex_wake(&op->net_done, false);
    }
}

int hccl_net_submit(op_task_t *op)
{
    hccl_net_t *net = op->comm->net;
    pthread_mutex_lock(&net->lock);
    if (!net->thread_started) {
        int rc = pthread_create(&net->thread, NULL, network_main, net);
        if (rc != 0) {
            pthread_mutex_unlock(&net->lock);
            return hccl_error(HCCL_E_SYSCALL, "starting the thread of '%s' that talks to other servers failed: %s",
                              op->comm->name, strerror(rc));
        }
        net->thread_started = true;
    }
    op->net_next = NULL;
    if (net->tail != NULL)
        net->tail->net_next = op;
    else
        net->head = op;
    net->tail = op;
    pthread_cond_signal(&net->wake);
    pthread_mutex_unlock(&net->lock);
    return HCCL_SUCCESS;
}

int hccl_net_wait(op_task_t *op, int64_t caller_deadline_ns)
{
    while (atomic_load_explicit(&op->net_done, memory_order_acquire) == 0) {
        int64_t left = caller_deadline_ns - sim_now_ns();
        if (left <= 0)
            return SIM_TASK_AGAIN;
        sim_futex_wait(&op->net_done, 0, SIM_MIN(left, 100000000LL), false);
    }
    if (op->net_rc != HCCL_SUCCESS)
        hccl_error((HcclResult)op->net_rc, "%s", op->net_text != NULL ? op->net_text : "out of host memory");
    return op->net_rc;
}
