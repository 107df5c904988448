// C++ smoke test: <hccl/hccl.h> compiles as C++14 with -Wall -Werror, and a 2-thread AllReduce
// works from C++ (std::thread, lambdas, RAII), as a C++ user program would be written.
//
// usage: cxx_smoke   (exit code 0 = pass)
#include <hccl/hccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::mutex g_print;

bool check(bool ok, int rank, const std::string &what)
{
    if (!ok) {
        std::lock_guard<std::mutex> lock(g_print);
        const char *msg = aclGetRecentErrMsg();
        std::printf("FAIL rank=%d: %s; aclGetRecentErrMsg: \"%s\"\n", rank, what.c_str(),
                    msg ? msg : "(NULL)");
    }
    return ok;
}

#define CHECK_CALL(rank, call) check((call) == 0, (rank), #call)

// Rank 0 publishes the root info; the other thread waits for it.
struct RootInfoBox {
    std::mutex mu;
    std::condition_variable cv;
    bool ready = false;
    HcclRootInfo info;
};

bool run_rank(int rank, int nranks, RootInfoBox &box)
{
    if (!CHECK_CALL(rank, aclrtSetDevice(rank))) {
        return false;
    }
    if (rank == 0) {
        HcclRootInfo info;
        bool ok = CHECK_CALL(rank, HcclGetRootInfo(&info));
        std::lock_guard<std::mutex> lock(box.mu);
        box.info = info;
        box.ready = ok;
        box.cv.notify_all();
        if (!ok) {
            return false;
        }
    }
    HcclRootInfo info;
    {
        std::unique_lock<std::mutex> lock(box.mu);
        if (!box.cv.wait_for(lock, std::chrono::seconds(60), [&] { return box.ready; })) {
            return check(false, rank, "no root info");
        }
        info = box.info;
    }
    HcclComm comm = nullptr;
    if (!CHECK_CALL(rank, HcclCommInitRootInfo(static_cast<uint32_t>(nranks), &info,
                                               static_cast<uint32_t>(rank), &comm))) {
        return false;
    }
    aclrtStream stream = nullptr;
    bool ok = CHECK_CALL(rank, aclrtCreateStream(&stream));
    const std::size_t count = 4099;
    std::vector<float> host(count), result(count);
    for (std::size_t i = 0; i < count; i++) {
        host[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 97) * 0.5f;
    }
    void *dev = nullptr;
    ok = ok && CHECK_CALL(rank, aclrtMalloc(&dev, count * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    ok = ok && CHECK_CALL(rank, aclrtMemcpy(dev, count * sizeof(float), host.data(),
                                            count * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE));
    ok = ok && CHECK_CALL(rank, HcclAllReduce(dev, dev, count, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM,
                                              comm, stream));
    ok = ok && CHECK_CALL(rank, aclrtSynchronizeStream(stream));
    ok = ok && CHECK_CALL(rank, aclrtMemcpy(result.data(), count * sizeof(float), dev,
                                            count * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST));
    if (ok) {
        for (std::size_t i = 0; i < count; i++) {
            float want = 0.0f;
            for (int r = 0; r < nranks; r++) {
                want += static_cast<float>(r + 1) * static_cast<float>(i % 97) * 0.5f;
            }
            if (result[i] != want) {
                ok = check(false, rank, "AllReduce element " + std::to_string(i) + " is " +
                                            std::to_string(result[i]) + ", expected " +
                                            std::to_string(want));
                break;
            }
        }
    }
    uint32_t size = 0;
    ok = CHECK_CALL(rank, HcclGetRankSize(comm, &size)) && ok;
    ok = check(size == static_cast<uint32_t>(nranks), rank, "HcclGetRankSize") && ok;
    HcclCommConfig config;
    HcclCommConfigInit(&config);  // the inline initialiser must compile as C++ too
    ok = check(config.hcclBufferSize == HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET, rank,
               "HcclCommConfigInit") && ok;
    if (dev) {
        ok = CHECK_CALL(rank, aclrtFree(dev)) && ok;
    }
    ok = CHECK_CALL(rank, HcclCommDestroy(comm)) && ok;
    if (stream) {
        ok = CHECK_CALL(rank, aclrtDestroyStream(stream)) && ok;
    }
    ok = CHECK_CALL(rank, aclrtResetDevice(rank)) && ok;
    return ok;
}

}  // namespace

int main()
{
    const int nranks = 2;
    aclError init = aclInit(nullptr);
    if (init != ACL_SUCCESS && init != ACL_ERROR_REPEAT_INITIALIZE) {
        std::printf("FAIL aclInit returned %d\n", init);
        return 1;
    }
    RootInfoBox box;
    std::vector<char> ok(nranks, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; r++) {
        threads.emplace_back([r, &box, &ok] { ok[r] = run_rank(r, nranks, box) ? 1 : 0; });
    }
    for (auto &t : threads) {
        t.join();
    }
    aclFinalize();
    bool all = ok[0] && ok[1];
    std::printf("RESULT: %s (cxx_smoke, %d ranks, mode threads)\n", all ? "PASS" : "FAIL", nranks);
    return all ? 0 : 1;
}
