/*
 * All-reduce across 4 ranks driven by 4 threads of one process, written against the CANN headers.
 *
 * Each thread is one rank on its own device. Rank 0 creates the root info and hands it to the
 * other threads in memory; every rank then joins the communicator, puts [0, 1, ..., COUNT-1]
 * (fp32) in device memory, sums it across ranks with HcclAllReduce on its own stream, and checks
 * that it now holds N_RANKS * i at index i.
 *
 * Build and run with a CANN install or the hcclpy simulator, once its set_env.sh has been sourced
 * (for the simulator: eval "$(python -m hcclpy.sim env)"):
 *   cc allreduce.c -I$ASCEND_HOME_PATH/include -L$ASCEND_HOME_PATH/lib64 -lhccl -lascendcl -pthread
 *   ./a.out
 */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <acl/acl.h>
#include <hccl/hccl.h>

#define N_RANKS 4
#define COUNT (1u << 20) /* elements per rank: small enough that every sum is exact in fp32 */

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

/* What the threads share. The barrier orders rank 0's write of root_info before the reads. */
static HcclRootInfo root_info;
static int root_info_ok;
static pthread_barrier_t root_info_ready;

static void *run_rank(void *arg)
{
    int rank = (int)(intptr_t)arg;
    int ok = 0, joined_barrier = 0;
    HcclComm comm = NULL;
    aclrtStream stream = NULL;
    void *send = NULL, *recv = NULL;
    const size_t bytes = COUNT * sizeof(float);
    float *host = malloc(bytes);

    if (host == NULL) {
        fprintf(stderr, "rank %d: out of host memory\n", rank);
        goto out;
    }
    /* The current device is per thread: each rank's thread selects its own. */
    ACL_CHECK(aclrtSetDevice(rank));
    if (rank == 0) {
        HCCL_CHECK(HcclGetRootInfo(&root_info));
        root_info_ok = 1;
    }
    pthread_barrier_wait(&root_info_ready);
    joined_barrier = 1;
    if (!root_info_ok) {
        fprintf(stderr, "rank %d: rank 0 produced no root info\n", rank);
        goto out;
    }
    HCCL_CHECK(HcclCommInitRootInfo(N_RANKS, &root_info, (uint32_t)rank, &comm));
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
        if (host[i] != (float)N_RANKS * (float)i) {
            fprintf(stderr, "rank %d: element %u is %g, expected %g\n", rank, i, host[i],
                    (double)N_RANKS * i);
            ok = 0;
            break;
        }
    }
    printf("rank %d: [%.0f, %.0f, %.0f, ..., %.0f] = %d * [0, 1, 2, ..., %u]: %s\n", rank,
           host[0], host[1], host[2], host[COUNT - 1], N_RANKS, COUNT - 1, ok ? "OK" : "WRONG");

out:
    if (!joined_barrier)
        pthread_barrier_wait(&root_info_ready); /* never leave the other ranks waiting */
    if (comm != NULL && HcclCommDestroy(comm) != HCCL_SUCCESS)
        ok = 0;
    if (stream != NULL)
        aclrtDestroyStream(stream);
    if (send != NULL)
        aclrtFree(send);
    if (recv != NULL)
        aclrtFree(recv);
    aclrtResetDevice(rank);
    free(host);
    return (void *)(intptr_t)ok;
}

int main(void)
{
    int rank = -1; /* for ACL_CHECK */
    pthread_t threads[N_RANKS];
    int passed = 0;

    ACL_CHECK(aclInit(NULL));
    pthread_barrier_init(&root_info_ready, NULL, N_RANKS);
    for (intptr_t r = 0; r < N_RANKS; r++) {
        if (pthread_create(&threads[r], NULL, run_rank, (void *)r) != 0) {
            fprintf(stderr, "cannot start thread %d\n", (int)r);
            return 1; /* the started ranks would wait at the barrier forever: stop the process */
        }
    }
    for (int r = 0; r < N_RANKS; r++) {
        void *ok = NULL;
        pthread_join(threads[r], &ok);
        passed += ok != NULL;
    }
    pthread_barrier_destroy(&root_info_ready);
    aclFinalize();
    printf("%d of %d ranks hold the expected sum\n", passed, N_RANKS);
    return passed == N_RANKS ? 0 : 1;
out:
    return 1;
}
