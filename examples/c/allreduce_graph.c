/*
 * An all-reduce captured once and replayed four times ("aclgraph"), one process per rank, written
 * against the CANN headers.
 *
 * Each rank captures, on a stream of its own in global mode, a copy of its input from pinned host
 * memory to the device, an HcclAllReduce of it, and a copy of the sum back to pinned host memory
 * (aclmdlRICaptureBegin ... aclmdlRICaptureEnd): nothing runs then. It then writes a new input,
 * (k + 1) * (rank + 1) in every element, replays the model (aclmdlRIExecuteAsync), synchronises
 * the stream and prints the sum, for k = 0..3; every rank must replay its model, as every rank
 * would call the all-reduce. It destroys the model before the stream and the communicator, in the
 * order CANN documents.
 *
 * The ranks learn their place from RANK / WORLD_SIZE / LOCAL_RANK (torchrun, hcclpy run) or from
 * MPI's PMI_RANK / PMI_SIZE and OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpiexec); the root
 * info goes through a file: argv[1], else /tmp/hccl-rootinfo-$MASTER_PORT. On the simulator:
 *   eval "$(hcclpy sim env)"
 *   cc allreduce_graph.c -I$ASCEND_HOME_PATH/include -L$ASCEND_HOME_PATH/lib64 -lhccl -lascendcl \
 *       -o allreduce_graph
 *   hcclpy run -n 4 --no-python ./allreduce_graph
 *   mpiexec -n 4 ./allreduce_graph /tmp/hccl-rootinfo-graph
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

#define COUNT 1024
#define REPLAYS 4
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

/* The first of the variables a launcher may set, or fallback. */
static int launcher_int(const char *a, const char *b, const char *c, int fallback)
{
    int value = env_int(a, -1);
    if (value < 0)
        value = env_int(b, -1);
    if (value < 0)
        value = env_int(c, -1);
    return value < 0 ? fallback : value;
}

int main(int argc, char **argv)
{
    int rank = launcher_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", 0);
    int nranks = launcher_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
    int device = env_int("LOCAL_RANK", rank);
    int ok = 0, acl_ready = 0;
    char path[4096];
    HcclRootInfo root_info;
    HcclComm comm = NULL;
    aclrtStream stream = NULL;
    aclmdlRI model = NULL;
    void *send = NULL, *recv = NULL;
    float *input = NULL, *output = NULL;
    const size_t bytes = COUNT * sizeof(float);

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
    if (rank < 0 || rank >= nranks) {
        fprintf(stderr, "rank %d of %d: bad rank\n", rank, nranks);
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
    ACL_CHECK(aclrtMallocHost((void **)&input, bytes)); /* pinned: copies of it can be captured */
    ACL_CHECK(aclrtMallocHost((void **)&output, bytes));

    /* Recorded, not run. */
    ACL_CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    ACL_CHECK(aclrtMemcpyAsync(send, bytes, input, bytes, ACL_MEMCPY_HOST_TO_DEVICE, stream));
    HCCL_CHECK(HcclAllReduce(send, recv, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream));
    ACL_CHECK(aclrtMemcpyAsync(output, bytes, recv, bytes, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    ACL_CHECK(aclmdlRICaptureEnd(stream, &model));

    ok = 1;
    const float ranks_sum = (float)nranks * (float)(nranks + 1) / 2; /* sum of rank + 1 over the ranks */
    for (int k = 0; k < REPLAYS; k++) {
        for (uint32_t i = 0; i < COUNT; i++)
            input[i] = (float)(k + 1) * (float)(rank + 1);
        ACL_CHECK(aclmdlRIExecuteAsync(model, stream));
        ACL_CHECK(aclrtSynchronizeStream(stream));
        float expected = (float)(k + 1) * ranks_sum;
        int right = output[0] == expected && output[COUNT - 1] == expected;
        ok = ok && right;
        printf("rank %d of %d: replay %d: sum = %.0f (expected %.0f): %s\n", rank, nranks, k + 1, output[0],
               expected, right ? "OK" : "WRONG");
    }

out:
    if (model != NULL && aclmdlRIDestroy(model) != ACL_SUCCESS) /* the model first, then what it used */
        ok = 0;
    if (stream != NULL)
        aclrtDestroyStream(stream);
    if (comm != NULL && HcclCommDestroy(comm) != HCCL_SUCCESS)
        ok = 0;
    if (send != NULL)
        aclrtFree(send);
    if (recv != NULL)
        aclrtFree(recv);
    if (input != NULL)
        aclrtFreeHost(input);
    if (output != NULL)
        aclrtFreeHost(output);
    if (acl_ready) {
        aclrtResetDevice(device);
        aclFinalize();
    }
    return ok ? 0 : 1;
}
