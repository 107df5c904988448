/*
 * Communicator create/destroy cycles leak nothing.
 *
 * usage: cycles --ranks N --mode threads|procs|mixed [--cycles 1000] [--rss-slack-mib 6]
 *
 * Each cycle: rank 0 makes a root info, it goes to every rank out of band, every rank runs
 * HcclCommInitRootInfo, one AllReduce, HcclCommDestroy. After a warm-up, the resident set size
 * (/proc/self/statm), the open descriptors (/proc/self/fd), the threads (/proc/self/task) of every
 * process and the entries of /dev/shm are recorded; after the cycles they must not have grown
 * (RSS by at most a few MiB).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define COUNT 1024
#define WARMUP 20
#define MAX_NAMES 4096

typedef struct {
    long rss_kib;
    int fds, threads, shm;
    char **shm_names;
} snapshot;

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2) {
            resident = 0;
        }
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Names Python's multiprocessing gives its semaphores and shared memory: other processes on the
 * machine create and remove these at any time, they are not ours. */
static int foreign_shm(const char *name)
{
    static const char *const prefixes[] = {"sem.mp-", "mp-", "psm_", "wnsm_"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Number of entries (without . and ..); names copied into *names when names != NULL. */
static int dir_entries(const char *path, char ***names)
{
    DIR *d = opendir(path);
    if (!d) {
        return -1;
    }
    int n = 0;
    char **list = names ? (char **)h_xcalloc(MAX_NAMES, sizeof(char *)) : NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        if (strcmp(path, "/dev/shm") == 0 && foreign_shm(e->d_name)) {
            continue;
        }
        if (list && n < MAX_NAMES) {
            list[n] = strdup(e->d_name);
        }
        n++;
    }
    closedir(d);
    if (names) {
        *names = list;
    }
    return n;
}

static void free_names(char **names)
{
    if (!names) {
        return;
    }
    for (int i = 0; i < MAX_NAMES && names[i]; i++) {
        free(names[i]);
    }
    free(names);
}

static void take(snapshot *s, int with_names)
{
    s->rss_kib = rss_kib();
    s->fds = dir_entries("/proc/self/fd", NULL);
    s->threads = dir_entries("/proc/self/task", NULL);
    s->shm = dir_entries("/dev/shm", with_names ? &s->shm_names : NULL);
}

static int one_cycle(h_ctx *ctx, void *in, void *out, int check)
{
    HcclRootInfo ri;
    RUN(h_make_root_info(ctx, h_all_mask(ctx->nranks), 0, &ri));
    HcclComm comm = NULL;
    H_HCCL(ctx, HcclCommInitRootInfo(ctx->nranks, &ri, ctx->rank, &comm));
    H_HCCL(ctx, HcclAllReduce(in, out, COUNT, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, comm,
                              ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    if (check) {
        int32_t got[COUNT], exp[COUNT];
        H_ACL(ctx, aclrtMemcpy(got, sizeof got, out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
        h_reduce_fill(HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, ctx->nranks, 0, COUNT,
                      exp);
        H_EXPECT(ctx, memcmp(got, exp, sizeof got) == 0, "AllReduce result wrong");
        H_ACL(ctx, aclrtMemset(out, sizeof got, 0, sizeof got));
    }
    H_HCCL(ctx, HcclCommDestroy(comm));
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    long cycles = h_arg_long("cycles", 1000);
    long slack_kib = h_arg_long("rss-slack-mib", 6) * 1024;
    RUN(h_rank_setup(ctx));
    void *in, *out;
    int32_t host[COUNT];
    h_fill(HCCL_DATA_TYPE_INT32, H_GEN_SUM, ctx->rank, 0, COUNT, host);
    H_ACL(ctx, aclrtMalloc(&in, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMalloc(&out, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMemcpy(in, sizeof host, host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE));

    h_set_case(ctx, "warm-up");
    for (int i = 0; i < WARMUP; i++) {
        RUN(one_cycle(ctx, in, out, 1));
    }
    snapshot before, after;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    RUN(h_oob_barrier(ctx));
    if (ctx->local == 0) {
        h_sleep(0.2); /* let threads that exit asynchronously go */
        take(&before, 1);
    }
    RUN(h_oob_barrier(ctx));

    if (!h_case(ctx, "%ld cycles of root info + init + allreduce + destroy", cycles)) {
        return 0;
    }
    double t0 = h_now();
    for (long i = 0; i < cycles; i++) {
        RUN(one_cycle(ctx, in, out, i % 50 == 0 || i == cycles - 1));
    }
    double took = h_now() - t0;
    RUN(h_oob_barrier(ctx));
    if (ctx->local == 0) {
        /* give asynchronous cleanup (exiting threads, closing descriptors) a moment */
        double until = h_now() + 3.0;
        for (;;) {
            free_names(after.shm_names);
            after.shm_names = NULL;
            take(&after, 1);
            if ((after.fds <= before.fds && after.threads <= before.threads &&
                 after.shm <= before.shm) ||
                h_now() > until) {
                break;
            }
            h_sleep(0.1);
        }
        h_log(ctx, "process %u: %ld cycles in %.2f s (%.0f/s); rss %ld -> %ld KiB, fds %d -> %d, "
              "threads %d -> %d, /dev/shm entries %d -> %d", ctx->proc, cycles, took,
              cycles / (took > 0 ? took : 1e-9), before.rss_kib, after.rss_kib, before.fds,
              after.fds, before.threads, after.threads, before.shm, after.shm);
        H_EXPECT(ctx, after.rss_kib - before.rss_kib <= slack_kib, "RSS grew by %ld KiB over %ld "
                 "cycles (allowed %ld KiB)", after.rss_kib - before.rss_kib, cycles, slack_kib);
        H_EXPECT(ctx, after.fds <= before.fds, "open descriptors grew from %d to %d", before.fds,
                 after.fds);
        H_EXPECT(ctx, after.threads <= before.threads, "threads grew from %d to %d",
                 before.threads, after.threads);
        if (!H_EXPECT(ctx, after.shm <= before.shm, "/dev/shm entries grew from %d to %d",
                      before.shm, after.shm)) {
            for (int i = 0; i < MAX_NAMES && after.shm_names && after.shm_names[i]; i++) {
                int seen = 0;
                for (int j = 0; j < MAX_NAMES && before.shm_names && before.shm_names[j]; j++) {
                    if (strcmp(after.shm_names[i], before.shm_names[j]) == 0) {
                        seen = 1;
                        break;
                    }
                }
                if (!seen) {
                    h_log(ctx, "new in /dev/shm: %s", after.shm_names[i]);
                }
            }
        }
        free_names(before.shm_names);
        free_names(after.shm_names);
    }
    RUN(h_oob_barrier(ctx));
    h_set_case(ctx, "teardown");
    H_ACL(ctx, aclrtFree(in));
    H_ACL(ctx, aclrtFree(out));
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "[--cycles N] [--rss-slack-mib M]");
    int failed = h_launch("cycles", run_rank, NULL, NULL);
    return h_finish("cycles", failed);
}
