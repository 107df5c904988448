/*
 * Rank-table initialisation: HcclCommInitClusterInfo[Config].
 *
 * usage: ranktable --ranks N --mode threads|procs|mixed
 *
 * Rank 0 writes rank-table JSON files (the documented format: every value a string) into a
 * temporary directory: one server holding N devices, and (N >= 2) two servers. Every rank
 * initialises from each file with and without a config and runs an AllReduce. A rank id that is
 * not in the table, a missing file and a malformed file give an error code and a message, quickly.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PATH_LEN 512

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        return -1;
    }
    int ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : -1;
}

/* servers = 1 or 2; ranks [0, split) on the first server, the rest on the second. */
static void rank_table(char *out, size_t cap, uint32_t n, int servers)
{
    uint32_t split = servers == 1 ? n : (n + 1) / 2;
    size_t len = 0;
#define APPEND(...) len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, __VA_ARGS__)
    APPEND("{\n  \"status\": \"completed\",\n  \"version\": \"1.0\",\n  \"server_count\": \"%d\",\n"
           "  \"server_list\": [\n",
           servers);
    for (int s = 0; s < servers; s++) {
        uint32_t lo = s == 0 ? 0 : split, hi = s == 0 ? split : n;
        APPEND("    {\n      \"server_id\": \"%s\",\n      \"device\": [\n",
               servers == 1 ? "127.0.0.1" : (s == 0 ? "host-a" : "host-b"));
        for (uint32_t r = lo; r < hi; r++) {
            /* the device id is the rank: that is the device each rank sets */
            APPEND("        {\"device_id\": \"%u\", \"device_ip\": \"192.168.%d.%u\", "
                   "\"device_port\": \"16666\", \"rank_id\": \"%u\"}%s\n",
                   r, 100 + s, 10 + r, r, r + 1 < hi ? "," : "");
        }
        APPEND("      ]\n    }%s\n", s + 1 < servers ? "," : "");
    }
    APPEND("  ]\n}\n");
#undef APPEND
}

typedef struct {
    char dir[PATH_LEN / 2];
    char one[PATH_LEN], two[PATH_LEN], bad[PATH_LEN], missing[PATH_LEN];
    char prefix[64];
} files;

static int make_files(h_ctx *ctx, files *f)
{
    memset(f, 0, sizeof *f);
    int ok = 1;
    if (ctx->rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(f->dir, sizeof f->dir, "%s/hcclpy-ranktable-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (mkdtemp(f->dir) == NULL) {
            ok = 0;
        }
        snprintf(f->one, sizeof f->one, "%s/one_server.json", f->dir);
        snprintf(f->two, sizeof f->two, "%s/two_servers.json", f->dir);
        snprintf(f->bad, sizeof f->bad, "%s/malformed.json", f->dir);
        snprintf(f->missing, sizeof f->missing, "%s/no_such_file.json", f->dir);
        snprintf(f->prefix, sizeof f->prefix, "hcclpy_rt%ld_%lld", (long)getpid(),
                 (long long)(h_now() * 1e6));
        size_t cap = 4096 + 256 * (size_t)ctx->nranks;
        char *text = (char *)h_xmalloc(cap);
        rank_table(text, cap, ctx->nranks, 1);
        ok = ok && write_file(f->one, text) == 0;
        rank_table(text, cap, ctx->nranks, 2);
        ok = ok && write_file(f->two, text) == 0;
        ok = ok && write_file(f->bad, "{ \"status\": \"completed\", \"server_list\": [ {") == 0;
        free(text);
        if (!ok) {
            h_failf(ctx, __FILE__, __LINE__, "cannot write the rank tables in %s", f->dir);
            f->dir[0] = '\0';
        }
    }
    RUN(h_oob_bcast(ctx, 0, f, sizeof *f));
    H_REQUIRE(ctx, f->dir[0] != '\0', "rank 0 could not write the rank tables");
    return 0;
}

static int allreduce_check(h_ctx *ctx, HcclComm comm, HcclDataType dt, uint64_t count)
{
    size_t bytes = count * h_dtype_size(dt);
    uint8_t *host = (uint8_t *)h_xmalloc(bytes), *exp = (uint8_t *)h_xmalloc(bytes);
    h_fill(dt, H_GEN_SUM, ctx->rank, 0, count, host);
    h_reduce_fill(dt, HCCL_REDUCE_SUM, H_GEN_SUM, NULL, ctx->nranks, 0, count, exp);
    void *d = NULL;
    H_ACL(ctx, aclrtMalloc(&d, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    H_ACL(ctx, aclrtMemcpy(d, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    H_HCCL(ctx, HcclAllReduce(d, d, count, dt, HCCL_REDUCE_SUM, comm, ctx->stream));
    H_ACL(ctx, aclrtSynchronizeStream(ctx->stream));
    H_ACL(ctx, aclrtMemcpy(host, bytes, d, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    H_EXPECT(ctx, memcmp(host, exp, bytes) == 0, "AllReduce %s sum result differs",
             h_dtype_name(dt));
    H_ACL(ctx, aclrtFree(d));
    free(host);
    free(exp);
    return 0;
}

static int check_comm(h_ctx *ctx, HcclComm comm, const char *name)
{
    uint32_t v = 0;
    H_HCCL(ctx, HcclGetRankSize(comm, &v));
    H_EXPECT(ctx, v == ctx->nranks, "HcclGetRankSize = %u, expected %u", v, ctx->nranks);
    H_HCCL(ctx, HcclGetRankId(comm, &v));
    H_EXPECT(ctx, v == ctx->rank, "HcclGetRankId = %u, expected %u", v, ctx->rank);
    if (name) {
        char got[COMM_NAME_MAX_LENGTH + 1];
        memset(got, 0, sizeof got);
        H_HCCL(ctx, HcclGetCommName(comm, got));
        H_EXPECT(ctx, strcmp(got, name) == 0, "HcclGetCommName = \"%s\", expected \"%s\"", got,
                 name);
    }
    /* fp32 sums of these values are exact in any order: tables of several servers reduce in their
     * hierarchical order, where fp16 would round each server's partial sum first. */
    RUN(allreduce_check(ctx, comm, HCCL_DATA_TYPE_INT32, 1031));
    RUN(allreduce_check(ctx, comm, HCCL_DATA_TYPE_FP32, 4099));
    return 0;
}

static int from_table(h_ctx *ctx, const files *f, const char *path, const char *label)
{
    if (h_case(ctx, "init-cluster-info %s", label)) {
        HcclComm comm = NULL;
        H_HCCL(ctx, HcclCommInitClusterInfo(path, ctx->rank, &comm));
        H_REQUIRE(ctx, comm != NULL, "HcclCommInitClusterInfo gave a NULL comm");
        RUN(check_comm(ctx, comm, NULL));
        H_HCCL(ctx, HcclCommDestroy(comm));
    }
    if (h_case(ctx, "init-cluster-info-config %s", label)) {
        HcclCommConfig cfg;
        HcclCommConfigInit(&cfg);
        snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "%s_%s", f->prefix, label);
        HcclComm comm = NULL;
        H_HCCL(ctx, HcclCommInitClusterInfoConfig(path, ctx->rank, &cfg, &comm));
        H_REQUIRE(ctx, comm != NULL, "HcclCommInitClusterInfoConfig gave a NULL comm");
        RUN(check_comm(ctx, comm, cfg.hcclCommName));
        H_HCCL(ctx, HcclCommDestroy(comm));
    }
    return 0;
}

/* A call that must fail at once (no peers are involved), with a message. */
#define EXPECT_FAST_ERROR(ctx, call)                                                            \
    do {                                                                                        \
        HcclComm c_ = NULL;                                                                     \
        double t0_ = h_now();                                                                   \
        HcclResult rc_ = (call);                                                                \
        double dt_ = h_now() - t0_;                                                             \
        h_expect_rc((ctx), __FILE__, __LINE__, #call, (long)rc_, H_ANY_ERROR, 1);               \
        H_EXPECT((ctx), dt_ < 10.0, "`%s` took %.1f s to fail", #call, dt_);                   \
        if (rc_ == HCCL_SUCCESS && c_ != NULL) {                                                \
            HcclCommDestroy(c_);                                                                \
        }                                                                                       \
    } while (0)

static int errors(h_ctx *ctx, const files *f)
{
    if (!h_case(ctx, "init-cluster-info errors")) {
        return 0;
    }
    uint32_t n = ctx->nranks;
    HcclCommConfig cfg;
    HcclCommConfigInit(&cfg);
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfo(f->one, n + 3, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfo(f->one, UINT32_MAX, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfo(f->missing, ctx->rank, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfo(f->bad, ctx->rank, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfo(f->dir, ctx->rank, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfoConfig(f->one, n, &cfg, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfoConfig(f->missing, ctx->rank, &cfg, &c_));
    EXPECT_FAST_ERROR(ctx, HcclCommInitClusterInfoConfig(f->bad, ctx->rank, &cfg, &c_));
    (void)H_EXPECT_HCCL(ctx, HcclCommInitClusterInfo(NULL, ctx->rank, NULL), HCCL_E_PTR);
    {
        HcclComm c = NULL;
        (void)H_EXPECT_HCCL(ctx, HcclCommInitClusterInfo(NULL, ctx->rank, &c), HCCL_E_PTR);
        (void)H_EXPECT_HCCL(ctx, HcclCommInitClusterInfo(f->one, ctx->rank, NULL), HCCL_E_PTR);
    }
    return 0;
}

static int run_rank(h_ctx *ctx)
{
    RUN(h_rank_setup(ctx));
    files f;
    RUN(make_files(ctx, &f));
    RUN(errors(ctx, &f));
    RUN(from_table(ctx, &f, f.one, "one-server"));
    if (ctx->nranks >= 2) {
        RUN(from_table(ctx, &f, f.two, "two-servers"));
    }
    /* the bad calls above must not have left anything behind that breaks a later init */
    RUN(from_table(ctx, &f, f.one, "one-server-again"));
    h_set_case(ctx, "cleanup");
    RUN(h_oob_barrier(ctx));
    if (ctx->rank == 0) {
        unlink(f.one);
        unlink(f.two);
        unlink(f.bad);
        rmdir(f.dir);
    }
    RUN(h_rank_teardown(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    h_parse_args(argc, argv, "");
    int failed = h_launch("ranktable", run_rank, NULL, NULL);
    return h_finish("ranktable", failed);
}
