"""Resources stay flat under churn and load, oversubscription does not livelock, and the thread
rules hold: many init/destroy cycles and many small collectives leave RSS, descriptors, threads
and /dev/shm where they were; 8 ranks on this machine's cores finish a soak of mixed operations;
communicators are used from several threads."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import hcclpy
import ranks

RSS_SLACK_MIB = 16  # allocator and interpreter noise over thousands of calls


def _usage() -> Dict[str, int]:
    with open("/proc/self/statm") as statm:
        rss_pages = int(statm.read().split()[1])
    shm = ranks.simulator_shm()
    return {"rss_mib": rss_pages * os.sysconf("SC_PAGE_SIZE") // (1 << 20), "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")), "shm": len(shm)}


def _settled(before: Dict[str, int]) -> Dict[str, int]:
    """Usage once threads and descriptors that close asynchronously have gone (up to 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        now = _usage()
        if all(now[k] <= before[k] for k in ("fds", "threads", "shm")) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def _churn(rank: int, size: int, info: bytes, shared: Dict[str, Any], cycles: int, calls: int) -> None:
    """Rank ``rank`` of ``size`` threads: ``cycles`` communicators made and destroyed, then
    ``calls`` small collectives on one; rank 0 records the process's usage around them."""
    barrier: threading.Barrier = shared["barrier"]
    x = hcclpy.from_numpy(np.full(8, rank + 1.0, np.float32), device=rank)
    y = hcclpy.empty(8, "float32", device=rank)
    stream = hcclpy.Device(rank).create_stream()

    def cycle(i: int) -> None:
        if rank == 0:
            shared["info"] = hcclpy.RootInfo.generate(device=0)
        barrier.wait()
        with hcclpy.Communicator(size, shared["info"], rank, device=rank) as comm:
            comm.all_reduce(x, y, "sum", stream=stream)
            stream.synchronize()
        barrier.wait()

    for i in range(20):  # warm-up: caches, lazily created threads and mappings
        cycle(i)
    if rank == 0:
        shared["before"] = _usage()
    for i in range(cycles):
        cycle(i)
    if rank == 0:
        shared["after_cycles"] = _settled(shared["before"])
    barrier.wait()
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    host = np.full(4, float(rank))
    for i in range(calls):
        kind = i % 4
        if kind == 0:
            comm.all_reduce(x, y, "sum", stream=stream)
        elif kind == 1:
            comm.broadcast(y, i % size, stream=stream)
        elif kind == 2:
            comm.all_reduce(host.copy())
        else:
            comm.barrier(stream=stream)
        if kind != 2:
            stream.synchronize()
    expected = float(sum(range(size)))
    assert comm.all_reduce(host.copy()).tolist() == [expected] * 4
    comm.destroy()
    barrier.wait()
    if rank == 0:
        shared["after_calls"] = _settled(shared["before"])
    stream.close()
    x.close()
    y.close()


@pytest.mark.timeout(300)
def test_cycles_and_collectives_leave_resources_flat() -> None:
    size, cycles, calls = 4, 1000, 10_000
    shared: Dict[str, Any] = {"barrier": threading.Barrier(size, timeout=60)}
    ranks.run_threads(_churn, size, shared, cycles, calls, timeout=240)
    before = shared["before"]
    for stage in ("after_cycles", "after_calls"):
        after = shared[stage]
        assert after["fds"] <= before["fds"] and after["threads"] <= before["threads"], (stage, before, after)
        assert after["shm"] <= before["shm"], (stage, before, after)
        assert after["rss_mib"] - before["rss_mib"] <= RSS_SLACK_MIB, (stage, before, after)


def _soak(rank: int, size: int, info: bytes, rounds: int) -> int:
    """Mixed operations, each checked against its NumPy result; returns the rounds done."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    right, left = (rank + 1) % size, (rank - 1) % size
    for i in range(rounds):
        value = float(rank + i)
        total = float(sum(r + i for r in range(size)))
        kind = i % 6
        if kind == 0:
            assert comm.all_reduce(np.full(1000, value)).tolist() == [total] * 1000
        elif kind == 1:
            x = hcclpy.from_numpy(np.full(size * 3, value, np.float32), device=comm.device)
            out = hcclpy.empty(3, "float32", device=comm.device)
            comm.reduce_scatter(x, out, "sum", stream=stream)
            stream.synchronize()
            assert out.to_numpy().tolist() == [total] * 3
        elif kind == 2:
            gathered = comm.all_gather(np.array([value]))
            assert gathered.ravel().tolist() == [float(r + i) for r in range(size)]
        elif kind == 3:
            counts = [(j + rank) % 3 + 1 for j in range(size)]
            recv_counts = [(rank + j) % 3 + 1 for j in range(size)]
            got = comm.all_to_all_v(np.full(sum(counts), value), send_counts=counts, recv_counts=recv_counts)
            assert got.tolist() == [float(j + i) for j in range(size) for _ in range(recv_counts[j])]
        elif kind == 4:
            received = np.zeros(16)
            comm.batch_send_recv([("send", np.full(16, value), right), ("recv", received, left)])
            assert received.tolist() == [float(left + i)] * 16
        else:
            assert comm.broadcast(np.array([value]), root=i % size).tolist() == [float(i % size + i)]
    comm.destroy()
    stream.close()
    return rounds


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_eight_ranks_on_few_cores_finish_a_mixed_soak() -> None:
    size, rounds = 8, 600
    out = ranks.run_processes(_soak, size, rounds, env={"HCCL_EXEC_TIMEOUT": "120"}, timeout=360)
    assert out == [rounds] * size


def test_numpy_calls_from_several_threads_on_one_communicator_take_turns() -> None:
    # One rank: each call's result is its own input. The calls share the communicator's staging
    # buffers, so without hcclpy's per-communicator lock they would read each other's data.
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        failures: List[str] = []

        def worker(seed: int) -> None:
            data = np.full(3 << 20, float(seed))  # 24 MiB: several staging chunks per call
            for _ in range(5):
                if not np.array_equal(comm.all_reduce(data), data):
                    failures.append(f"thread {seed} got another thread's data")

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures and not any(t.is_alive() for t in threads), failures


def _two_communicators(rank: int, size: int, info: bytes, other: bytes) -> List[float]:
    comms = [hcclpy.Communicator(size, info, rank, device=rank),
             hcclpy.Communicator(size, other, rank, device=rank)]
    results: List[float] = [0.0, 0.0]

    def drive(index: int) -> None:
        comm = comms[index]
        stream = comm.device.create_stream()
        x = hcclpy.from_numpy(np.ones(256, np.float32), device=comm.device)
        for _ in range(300):
            comm.all_reduce(x, None, "sum", stream=stream)
            stream.synchronize()
            x.copy_from(np.ones(256, np.float32))
        comm.all_reduce(x, None, "sum", stream=stream)
        stream.synchronize()
        results[index] = float(x.to_numpy()[0])
        stream.close()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for comm in comms:
        comm.destroy()
    return results


@pytest.mark.timeout(120)
def test_different_communicators_from_different_threads() -> None:
    other = hcclpy.RootInfo.generate(device=0).to_bytes()
    out = ranks.run_processes(_two_communicators, 2, other, timeout=90)
    assert out == [[2.0, 2.0], [2.0, 2.0]]
