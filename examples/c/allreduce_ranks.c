/*
 * All-reduce with one process per rank, written against the CANN headers.
 *
 * A launcher starts the processes and tells each its place through the variables torchrun sets:
 * RANK, WORLD_SIZE and LOCAL_RANK (the device). Rank 0 creates the root info and writes it to a
 * file; the other ranks read it from there, and every rank joins the communicator. Each rank then
 * puts [0, 1, ..., COUNT-1] (fp32) in device memory, sums it across ranks with HcclAllReduce and
 * checks that it holds WORLD_SIZE * i at index i.
 *
 * The file is argv[1], else /tmp/hccl-rootinfo-$MASTER_PORT (a port `hcclpy run` picks afresh for
 * every job, so a file left by an earlier job is never read). Build and run on the hcclpy simulator:
 *   eval "$(hcclpy sim env)"
 *   cc allreduce_ranks.c -I$ASCEND_HOME_PATH/include -L$ASCEND_HOME_PATH/lib64 -lhccl -lascendcl \
 *       -o allreduce_ranks
 *   hcclpy run -n 4 --no-python ./allreduce_ranks
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <acl/acl.h>
#include <hccl/hccl.h>

#define COUNT (1u << 16)
#define ROOT_INFO_TIMEOUT 60.0 /* seconds the other ranks wait for rank 0's file */

#define ACL_CHECK(call)                                                                        \
    do {                                                                                       \
        aclError err_ = (call);                                                                \
        if (err_ != ACL_SUCCESS) {                                                             \
            fprintf(stderr, "rank %d: %s failed: aclError %d\n", rank, #call, (int)err_);      \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

#define HCCL_CHECK(call)                                                                       \
    do {                                                                                       \
        HcclResult res_ = (call);                                                              \
        if (res_ != HCCL_SUCCESS) {                                                            \
            fprintf(stderr, "rank %d: %s failed: %s (%d)\n", rank, #call,                      \
                    HcclGetErrorString(res_), (int)res_);                                      \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

static int env_int(const char *name, int fallback)
{
    const char *text = getenv(name);
    return text != NULL && *text != '\0' ? atoi(text) : fallback;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Rank 0: write the root info to a temporary file and rename it, so readers never see half of it. */
static int write_root_info(const char *path, const HcclRootInfo *info)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return -1;
    int ok = fwrite(info, sizeof *info, 1, f) == 1;
    ok = (fclose(f) == 0) && ok;
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* The other ranks: wait until rank 0's file appears (or give up). */
static int read_root_info(const char *path, HcclRootInfo *info)
{
    const struct timespec pause = {0, 10 * 1000 * 1000};
    double deadline = now() + ROOT_INFO_TIMEOUT;
    do {
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            size_t got = fread(info, sizeof *info, 1, f);
            fclose(f);
            if (got == 1)
                return 0;
        }
        nanosleep(&pause, NULL);
    } while (now() < deadline);
    return -1;
}

int main(int argc, char **argv)
{
    int rank = env_int("RANK", 0);
    int nranks = env_int("WORLD_SIZE", 1);
    int device = env_int("LOCAL_RANK", rank);
    int ok = 0, acl_ready = 0;
    char path[4096];
    HcclRootInfo root_info;
    HcclComm comm = NULL;
    aclrtStream stream = NULL;
    void *send = NULL, *recv = NULL;
    const size_t bytes = COUNT * sizeof(float);
    float *host = malloc(bytes);

    if (argc > 1)
        snprintf(path, sizeof path, "%s", argv[1]);
    else if (getenv("MASTER_PORT") != NULL)
        snprintf(path, sizeof path, "/tmp/hccl-rootinfo-%s", getenv("MASTER_PORT"));
    else if (nranks == 1)
        snprintf(path, sizeof path, "/tmp/hccl-rootinfo-%ld", (long)getpid());
    else {
        fprintf(stderr, "rank %d: pass the root-info file as argv[1] (or set MASTER_PORT)\n", rank);
        return 2;
    }
    if (host == NULL || rank < 0 || rank >= nranks) {
        fprintf(stderr, "rank %d of %d: bad rank or out of host memory\n", rank, nranks);
        return 2;
    }

    ACL_CHECK(aclInit(NULL));
    acl_ready = 1;
    ACL_CHECK(aclrtSetDevice(device));
    if (rank == 0) {
        HCCL_CHECK(HcclGetRootInfo(&root_info));
        if (write_root_info(path, &root_info) != 0) {
            fprintf(stderr, "rank 0: cannot write %s: %s\n", path, strerror(errno));
            goto out;
        }
    } else if (read_root_info(path, &root_info) != 0) {
        fprintf(stderr, "rank %d: no root info in %s after %.0f s\n", rank, path, ROOT_INFO_TIMEOUT);
        goto out;
    }
    HCCL_CHECK(HcclCommInitRootInfo((uint32_t)nranks, &root_info, (uint32_t)rank, &comm));
    if (rank == 0)
        remove(path); /* every rank has joined, so every rank has read it */
    ACL_CHECK(aclrtCreateStream(&stream));

    ACL_CHECK(aclrtMalloc(&send, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CHECK(aclrtMalloc(&recv, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    for (uint32_t i = 0; i < COUNT; i++)
        host[i] = (float)i;
    ACL_CHECK(aclrtMemcpy(send, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));

    /* Asynchronous: the result is defined only once the stream has been synchronised. */
    HCCL_CHECK(HcclAllReduce(send, recv, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream));
    ACL_CHECK(aclrtSynchronizeStream(stream));
    ACL_CHECK(aclrtMemcpy(host, bytes, recv, bytes, ACL_MEMCPY_DEVICE_TO_HOST));

    ok = 1;
    for (uint32_t i = 0; i < COUNT; i++) {
        if (host[i] != (float)nranks * (float)i) {
            fprintf(stderr, "rank %d: element %u is %g, expected %g\n", rank, i, host[i], (double)nranks * i);
            ok = 0;
            break;
        }
    }
    printf("rank %d of %d on device %d: [%.0f, %.0f, ..., %.0f] = %d * [0, 1, ..., %u]: %s\n", rank, nranks,
           device, host[0], host[1], host[COUNT - 1], nranks, COUNT - 1, ok ? "OK" : "WRONG");

out:
    if (comm != NULL && HcclCommDestroy(comm) != HCCL_SUCCESS)
        ok = 0;
    if (stream != NULL)
        aclrtDestroyStream(stream);
    if (send != NULL)
        aclrtFree(send);
    if (recv != NULL)
        aclrtFree(recv);
    if (acl_ready) {
        aclrtResetDevice(device);
        aclFinalize();
    }
    free(host);
    return ok ? 0 : 1;
}
