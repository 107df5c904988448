/* Rank-table initialisation (HcclCommInitClusterInfo).
 *
 * The rank table (JSON, reference §5.1) says how many ranks there are and
 * which server and device each one uses.  There is no root info to pass
 * around, so rank 0 creates one and serves it on an abstract Unix socket
 * whose name is derived from the user and the table's contents; the other
 * ranks connect and read it.  Abstract sockets vanish with their process: nothing
 * is left behind.  Everything a rank can check alone (the table, its device) is checked before
 * rank 0 serves anything.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "hccl/internal.h"
#include "hccl/net.h"

/* ------------------------------------------------------------ tiny JSON */

typedef enum { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT } json_type_t;

typedef struct json {
    json_type_t type;
    char *text;              /* string value */
    double number;
    struct json **items;     /* array elements or object values */
    char **keys;             /* object keys */
    size_t count;
} json_t;

typedef struct {
    const char *p, *end;
    int depth;
    char error[128];
} parser_t;

static void json_free(json_t *node)
{
    if (node == NULL)
        return;
    for (size_t i = 0; i < node->count; i++) {
        json_free(node->items[i]);
        if (node->keys != NULL)
            free(node->keys[i]);
    }
    free(node->items);
    free(node->keys);
    free(node->text);
    free(node);
}

static void skip_space(parser_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static json_t *parse_value(parser_t *ps);

static char *parse_string(parser_t *ps)
{
    if (ps->p >= ps->end || *ps->p != '"') {
        snprintf(ps->error, sizeof ps->error, "expected a string");
        return NULL;
    }
    ps->p++;
    size_t capacity = 32, length = 0;
    char *out = malloc(capacity);
    while (out != NULL && ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\' && ps->p < ps->end) {
            char e = *ps->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u':
                /* Only ASCII escapes matter in a rank table. */
                if (ps->end - ps->p < 4) {
                    free(out);
                    snprintf(ps->error, sizeof ps->error, "truncated \\u escape");
                    return NULL;
                }
                c = (char)strtol((char[5]){ps->p[0], ps->p[1], ps->p[2], ps->p[3], 0}, NULL, 16);
                ps->p += 4;
                break;
            default: c = e; break;
            }
        }
        if (length + 1 >= capacity) {
            capacity *= 2;
            char *grown = realloc(out, capacity);
            if (grown == NULL) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        out[length++] = c;
    }
    if (out == NULL || ps->p >= ps->end) {
        free(out);
        snprintf(ps->error, sizeof ps->error, "unterminated string");
        return NULL;
    }
    ps->p++;
    out[length] = '\0';
    return out;
}

static bool append(json_t *node, char *key, json_t *item)
{
    json_t **items = realloc(node->items, (node->count + 1) * sizeof *items);
    if (items == NULL)
        return false;
    node->items = items;
    if (node->type == J_OBJECT) {
        char **keys = realloc(node->keys, (node->count + 1) * sizeof *keys);
        if (keys == NULL)
            return false;
        node->keys = keys;
        keys[node->count] = key;
    }
    items[node->count++] = item;
    return true;
}

static json_t *parse_container(parser_t *ps, json_type_t type)
{
    char close = type == J_ARRAY ? ']' : '}';
    json_t *node = calloc(1, sizeof *node);
    if (node == NULL)
        return NULL;
    node->type = type;
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return node;
    }
    for (;;) {
        char *key = NULL;
        if (type == J_OBJECT) {
            skip_space(ps);
            key = parse_string(ps);
            skip_space(ps);
            if (key == NULL || ps->p >= ps->end || *ps->p != ':') {
                free(key);
                if (ps->error[0] == '\0')
                    snprintf(ps->error, sizeof ps->error, "expected ':' after a key");
                json_free(node);
                return NULL;
            }
            ps->p++;
        }
        json_t *item = parse_value(ps);
        if (item == NULL || !append(node, key, item)) {
            free(key);
            json_free(item);
            json_free(node);
            return NULL;
        }
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return node;
        }
        snprintf(ps->error, sizeof ps->error, "expected ',' or '%c'", close);
        json_free(node);
        return NULL;
    }
}

static json_t *parse_value(parser_t *ps)
{
    skip_space(ps);
    if (ps->p >= ps->end) {
        snprintf(ps->error, sizeof ps->error, "unexpected end of file");
        return NULL;
    }
    if (++ps->depth > 32) {
        snprintf(ps->error, sizeof ps->error, "nested too deeply");
        return NULL;
    }
    json_t *node = NULL;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        node = parse_container(ps, c == '{' ? J_OBJECT : J_ARRAY);
    } else if (c == '"') {
        char *text = parse_string(ps);
        if (text != NULL && (node = calloc(1, sizeof *node)) != NULL) {
            node->type = J_STRING;
            node->text = text;
        } else {
            free(text);
        }
    } else if ((size_t)(ps->end - ps->p) >= 4 && strncmp(ps->p, "true", 4) == 0) {
        node = calloc(1, sizeof *node);
        if (node != NULL)
            node->type = J_BOOL, node->number = 1;
        ps->p += 4;
    } else if ((size_t)(ps->end - ps->p) >= 5 && strncmp(ps->p, "false", 5) == 0) {
        node = calloc(1, sizeof *node);
        if (node != NULL)
            node->type = J_BOOL;
        ps->p += 5;
    } else if ((size_t)(ps->end - ps->p) >= 4 && strncmp(ps->p, "null", 4) == 0) {
        node = calloc(1, sizeof *node);
        ps->p += 4;
    } else {
        char *stop;
        double number = strtod(ps->p, &stop);
        if (stop == ps->p || stop > ps->end) {
            snprintf(ps->error, sizeof ps->error, "unexpected character '%c'", c);
        } else if ((node = calloc(1, sizeof *node)) != NULL) {
            node->type = J_NUMBER;
            node->number = number;
            ps->p = stop;
        }
    }
    ps->depth--;
    return node;
}

static const json_t *member(const json_t *object, const char *key)
{
    if (object == NULL || object->type != J_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0)
            return object->items[i];
    return NULL;
}

/* Rank tables write numbers as strings ("rank_id": "3"); both are accepted. */
static bool integer_of(const json_t *node, long *out)
{
    if (node == NULL)
        return false;
    if (node->type == J_NUMBER) {
        *out = (long)node->number;
        return node->number == (double)*out;
    }
    if (node->type != J_STRING || node->text[0] == '\0')
        return false;
    char *end;
    errno = 0;
    *out = strtol(node->text, &end, 10);
    return errno == 0 && *end == '\0';
}

/* ----------------------------------------------------------- the table */

typedef struct {
    long rank, device;
    const char *server;
} entry_t;

static int read_file(const char *path, char **data, size_t *size)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return hccl_error(HCCL_E_OPEN_FILE_FAILURE, "HcclCommInitClusterInfo: cannot open the rank table '%s': %s",
                          path, strerror(errno));
    /* One byte more than `capacity` for a terminating NUL: the parser hands the text to strtod,
     * which reads until a character that cannot continue the number, so a table ending in a
     * digit would otherwise be read on into whatever follows it in memory. */
    size_t capacity = 4096, length = 0;
    char *buffer = malloc(capacity + 1);
    while (buffer != NULL) {
        if (length == capacity) {
            if (capacity >= (16u << 20)) {
                free(buffer);
                fclose(file);
                return hccl_error(HCCL_E_PARA, "HcclCommInitClusterInfo: the rank table '%s' is larger than 16 MiB",
                                  path);
            }
            char *grown = realloc(buffer, capacity * 2 + 1);
            if (grown == NULL) {
                free(buffer); /* not half a table parsed as if it were all of it */
                buffer = NULL;
                break;
            }
            buffer = grown;
            capacity *= 2;
        }
        size_t got = fread(buffer + length, 1, capacity - length, file);
        length += got;
        if (got == 0)
            break;
    }
    fclose(file);
    if (buffer == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    buffer[length] = '\0';
    *data = buffer;
    *size = length;
    return HCCL_SUCCESS;
}

#define TABLE_ERROR(...) hccl_error(HCCL_E_PARA, "HcclCommInitClusterInfo: rank table '%s': " __VA_ARGS__)

static int parse_table(const char *path, const json_t *root, uint32_t rank, uint32_t *nranks, long *device,
                       char *server, size_t server_len, uint32_t *with_ranks, char *root_server)
{
    const json_t *status = member(root, "status");
    if (status == NULL || status->type != J_STRING || strcmp(status->text, "completed") != 0)
        return TABLE_ERROR("\"status\" must be \"completed\"", path);
    const json_t *servers = member(root, "server_list");
    if (servers == NULL || servers->type != J_ARRAY || servers->count == 0)
        return TABLE_ERROR("\"server_list\" must be a non-empty array", path);
    long server_count;
    const json_t *declared = member(root, "server_count");
    if (declared != NULL && (!integer_of(declared, &server_count) || server_count != (long)servers->count))
        return TABLE_ERROR("\"server_count\" does not match the %zu entries of \"server_list\"", path, servers->count);
    size_t total = 0;
    for (size_t s = 0; s < servers->count; s++) {
        const json_t *devices = member(servers->items[s], "device");
        if (devices == NULL || devices->type != J_ARRAY)
            return TABLE_ERROR("server %zu has no \"device\" array", path, s);
        total += devices->count;
    }
    if (total == 0 || total > HCCL_SIM_MAX_RANKS)
        return TABLE_ERROR("it lists %zu devices; between 1 and %u are supported", path, total, HCCL_SIM_MAX_RANKS);
    entry_t *entries = calloc(total, sizeof *entries);
    if (entries == NULL)
        return hccl_error(HCCL_E_MEMORY, "out of host memory");
    int err = HCCL_SUCCESS;
    size_t at = 0;
    for (size_t s = 0; s < servers->count && err == HCCL_SUCCESS; s++) {
        const json_t *id = member(servers->items[s], "server_id");
        if (id == NULL || id->type != J_STRING || id->text[0] == '\0') {
            err = TABLE_ERROR("server %zu has no \"server_id\" string", path, s);
            break;
        }
        const json_t *devices = member(servers->items[s], "device");
        for (size_t d = 0; d < devices->count; d++, at++) {
            entry_t *e = &entries[at];
            e->server = id->text;
            if (!integer_of(member(devices->items[d], "device_id"), &e->device) || e->device < 0) {
                err = TABLE_ERROR("device %zu of server '%s' has no valid \"device_id\"", path, d, id->text);
                break;
            }
            if (!integer_of(member(devices->items[d], "rank_id"), &e->rank) || e->rank < 0 ||
                e->rank >= (long)total) {
                err = TABLE_ERROR("device %zu of server '%s' needs a \"rank_id\" in [0, %zu)", path, d, id->text,
                                  total);
                break;
            }
        }
    }
    for (size_t i = 0; i < total && err == HCCL_SUCCESS; i++)
        for (size_t j = i + 1; j < total && err == HCCL_SUCCESS; j++)
            if (entries[i].rank == entries[j].rank)
                err = TABLE_ERROR("rank_id %ld appears twice", path, entries[i].rank);
    if (err == HCCL_SUCCESS && rank >= total)
        err = TABLE_ERROR("it has %zu ranks; rank %u is not one of them", path, total, rank);
    for (size_t i = 0; i < total && err == HCCL_SUCCESS; i++) {
        if (entries[i].rank == (long)rank) {
            *device = entries[i].device;
            snprintf(server, server_len, "%s", entries[i].server);
        }
        if (entries[i].rank == 0)
            snprintf(root_server, 64, "%s", entries[i].server);
    }
    /* Servers with devices: a server_list entry without any is no server of the job. */
    *with_ranks = 0;
    for (size_t i = 0; i < total && err == HCCL_SUCCESS; i++) {
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = strcmp(entries[j].server, entries[i].server) != 0;
        *with_ranks += first;
    }
    *nranks = (uint32_t)total;
    free(entries);
    return err;
}

/* ------------------------------------------------------------- rendezvous */

/* Rank 0's server: it hands the root info to every rank that connects while ranks may still join
 * with it, until it is stopped (hccl_rank_table_stop, once rank 0's initialisation has ended
 * either way) or its deadline passes.  It is stopped, never left behind: a server outliving a
 * failed attempt would keep the socket's name and hand the next attempt's ranks a root info
 * nobody serves any more. */
struct rank_table_server {
    pthread_t thread;
    int listener;
    int wake[2];            /* a byte on wake[1] stops the thread */
    int64_t deadline;
    rootinfo_wire_t wire;
};

static void *serve(void *arg)
{
    rank_table_server_t *server = arg;
    for (;;) {
        int64_t left = server->deadline - sim_now_ns();
        if (left <= 0)
            break;
        struct pollfd pfd[2] = {{server->listener, POLLIN, 0}, {server->wake[0], POLLIN, 0}};
        if (poll(pfd, 2, (int)SIM_MIN(left / SIM_NS_PER_MS + 1, 1000)) <= 0)
            continue;
        if (pfd[1].revents != 0)
            break;
        int client = accept4(server->listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0)
            continue;
        /* Once every rank has joined, a rank that connects is one that is done with this
         * communicator and wants the next from the same table: it gets nothing (and connects
         * again) until rank 0 serves the next root info.  Best effort otherwise: a client that
         * gets nothing connects again. */
        if (hccl_root_info_pending(&server->wire)) {
            ssize_t written = write(client, &server->wire, sizeof server->wire);
            (void)written;
        }
        close(client);
    }
    return NULL;
}

/* Named after the user and the table's contents, not its path: every rank may read its own copy
 * of the table (one per server, as on a real cluster). */
static void socket_name(const char *data, size_t size, struct sockaddr_un *addr, socklen_t *len)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < size; i++)
        h = (h ^ (uint8_t)data[i]) * 0x100000001b3ULL;
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "hcclpy-sim-ranktable-%u-%016llx",
                     (unsigned)getuid(), (unsigned long long)h);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int lead(const hccl_rank_table_t *table, int64_t deadline, rootinfo_wire_t *wire,
                rank_table_server_t **out)
{
    int err = hccl_get_root_info(wire);
    if (err != HCCL_SUCCESS || table->nranks == 1)
        return err;
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) {
        err = hccl_error(HCCL_E_SYSCALL, "HcclCommInitClusterInfo: socket failed: %s", strerror(errno));
        hccl_root_info_abandon(wire, HCCL_E_REMOTE, "rank 0 of the rank table could not serve the root info");
        return err;
    }
    /* The server of the previous communicator made from this table is stopped before its rank 0
     * returns, but that rank 0 may be another process still on its way out: a name still in use
     * is retried briefly before it is an error. */
    int64_t retry_until = SIM_MIN(deadline, sim_now_ns() + 2 * SIM_NS_PER_S);
    int bound;
    while ((bound = bind(listener, (const struct sockaddr *)&table->addr, table->addr_len)) != 0 &&
           errno == EADDRINUSE && sim_now_ns() < retry_until)
        usleep(2000);
    if (bound != 0 || listen(listener, 128) != 0) {
        int saved = errno;
        close(listener);
        if (saved == EADDRINUSE)
            err = hccl_error(HCCL_E_PARA, "HcclCommInitClusterInfo: another communicator is being created from the "
                             "same rank table right now (two rank 0s?)");
        else
            err = hccl_error(HCCL_E_SYSCALL, "HcclCommInitClusterInfo: cannot listen for the other ranks: %s",
                             strerror(saved));
        hccl_root_info_abandon(wire, HCCL_E_REMOTE, "rank 0 of the rank table could not serve the root info");
        return err;
    }
    rank_table_server_t *server = calloc(1, sizeof *server);
    if (server == NULL || pipe2(server->wake, O_CLOEXEC) != 0) {
        free(server);
        close(listener);
        err = hccl_error(HCCL_E_SYSCALL, "HcclCommInitClusterInfo: cannot start the rendezvous server");
        hccl_root_info_abandon(wire, HCCL_E_REMOTE, "rank 0 of the rank table could not serve the root info");
        return err;
    }
    server->listener = listener;
    server->deadline = deadline;
    server->wire = *wire;
    if (pthread_create(&server->thread, NULL, serve, server) != 0) {
        close(server->wake[0]);
        close(server->wake[1]);
        free(server);
        close(listener);
        err = hccl_error(HCCL_E_SYSCALL, "HcclCommInitClusterInfo: cannot start the rendezvous thread");
        hccl_root_info_abandon(wire, HCCL_E_REMOTE, "rank 0 of the rank table could not serve the root info");
        return err;
    }
    *out = server;
    return HCCL_SUCCESS;
}

void hccl_rank_table_stop(rank_table_server_t *server)
{
    if (server == NULL)
        return;
    char byte = 1;
    ssize_t written = write(server->wake[1], &byte, 1);
    (void)written;
    pthread_join(server->thread, NULL);
    close(server->listener);
    close(server->wake[0]);
    close(server->wake[1]);
    free(server);
}

static int follow(const hccl_rank_table_t *table, int64_t deadline, rootinfo_wire_t *wire)
{
    char used[512] = ""; /* why the last root info received could not be used */
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return hccl_error(HCCL_E_SYSCALL, "HcclCommInitClusterInfo: socket failed: %s", strerror(errno));
        if (connect(fd, (const struct sockaddr *)&table->addr, table->addr_len) == 0) {
            struct timeval tv = {5, 0};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            size_t got = 0;
            while (got < sizeof *wire) {
                ssize_t n = read(fd, (char *)wire + got, sizeof *wire - got);
                if (n <= 0)
                    break;
                got += (size_t)n;
            }
            close(fd);
            /* A root info of the previous communicator from this table (its rank 0 still on the way
             * out) is not this one's: wait for rank 0 to serve the next. */
            if (got == sizeof *wire && !hccl_root_info_used(wire, used, sizeof used))
                return HCCL_SUCCESS;
        } else {
            close(fd);
        }
        if (sim_now_ns() > deadline && used[0] != '\0')
            return hccl_error(HCCL_E_TIMEOUT, "HcclCommInitClusterInfo: rank 0 of the rank table served no new root "
                              "info within HCCL_CONNECT_TIMEOUT (the one it served cannot be used: %s)", used);
        if (sim_now_ns() > deadline)
            return hccl_error(HCCL_E_TIMEOUT, "HcclCommInitClusterInfo: rank 0 of the rank table did not show up "
                              "within HCCL_CONNECT_TIMEOUT");
        usleep(2000);
    }
}

int hccl_rank_table_read(const char *path, uint32_t rank, hccl_rank_table_t *table)
{
    if (strlen(path) >= 4096)
        return hccl_error(HCCL_E_PARA, "HcclCommInitClusterInfo: the rank table path is longer than 4095 bytes");
    char *data = NULL;
    size_t size = 0;
    int err = read_file(path, &data, &size);
    if (err != HCCL_SUCCESS)
        return err;
    parser_t ps = {data, data + size, 0, ""};
    json_t *root = parse_value(&ps);
    skip_space(&ps);
    if (root == NULL || ps.p != ps.end) {
        long at = (long)(ps.p - data);
        json_free(root);
        free(data);
        return hccl_error(HCCL_E_PARA, "HcclCommInitClusterInfo: the rank table '%s' is not valid JSON (%s at byte "
                          "%ld)", path, ps.error[0] ? ps.error : "trailing data", at);
    }
    memset(table, 0, sizeof *table);
    long table_device = -1;
    err = parse_table(path, root, rank, &table->nranks, &table_device, table->node, sizeof table->node,
                      &table->servers, table->root_server);
    json_free(root);
    if (err == HCCL_SUCCESS) {
        table->device = (int)table_device;
        socket_name(data, size, &table->addr, &table->addr_len);
        /* The token of a job across servers: whoever has the table is a member. */
        uint64_t h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
        for (size_t i = 0; i < size; i++) {
            h[0] = (h[0] ^ (uint8_t)data[i]) * 0x100000001b3ULL;
            h[1] = (h[1] ^ (uint8_t)data[size - 1 - i]) * 0x100000001b3ULL;
        }
        memcpy(table->token, h, sizeof table->token);
    }
    free(data);
    return err;
}

/* A table of several servers: rank 0 serves the bootstrap over TCP at its server_id (an address or a
 * name that resolves to one; 127.0.0.1 for a name that does not) and HCCL_IF_BASE_PORT (60000 by
 * default, as HCCL's); every rank knows where, so nothing is handed out. */
static int meet_over_tcp(const hccl_rank_table_t *table, uint32_t rank, rootinfo_wire_t *wire)
{
    double port = sim_env_seconds("HCCL_IF_BASE_PORT", 60000.0);
    if (port < 1 || port > 65535 || port != (double)(uint16_t)port)
        return hccl_error(HCCL_E_PARA, "HCCL_IF_BASE_PORT must be a port number in [1, 65535], got '%s'",
                          getenv("HCCL_IF_BASE_PORT"));
    /* A server_id that names no address (no DNS entry) is a server of this machine. */
    struct addrinfo hints = {0}, *found = NULL;
    hints.ai_socktype = SOCK_STREAM;
    bool known = getaddrinfo(table->root_server, NULL, &hints, &found) == 0;
    if (found != NULL)
        freeaddrinfo(found);
    return hccl_net_fixed_root_info(known ? table->root_server : "127.0.0.1", (uint16_t)port, table->token,
                                    rank == 0, wire);
}

int hccl_rank_table_rendezvous(const hccl_rank_table_t *table, uint32_t rank, rootinfo_wire_t *wire,
                               rank_table_server_t **server)
{
    *server = NULL;
    if (table->servers > 1)
        return meet_over_tcp(table, rank, wire);
    double seconds = sim_env_seconds("HCCL_CONNECT_TIMEOUT", 120.0);
    int64_t deadline = sim_now_ns() + (int64_t)(seconds * 1e9);
    return rank == 0 ? lead(table, deadline, wire, server) : follow(table, deadline, wire);
}
