"""One rank of a job started by ``hcclpy run`` (tests/cli/test_cli_run.py): every kind of HCCL
operation, on device buffers and on NumPy arrays, checked against NumPy.

It prints ``rank R of N: device and NumPy operations OK, sum order S`` (S: the float32 sum of
:data:`ORDER_PROBE`, whose value tells how the servers are laid out), else the operations that
went wrong, and exits with 1.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List

import numpy as np

import hcclpy

# Rank r adds ORDER_PROBE[r]: one float32 sum in rank order gives 1, a sum of ranks {0, 1} and
# {2, 3} first, then of the two partial sums (HCCL's hierarchical all-reduce on two servers of
# 2 ranks) gives 0. 1e8 + 1 rounds to 1e8 in float32.
ORDER_PROBE = (1e8, 1.0, -1e8, 1.0)


def order_probe(comm: hcclpy.Communicator) -> float:
    """The float32 all-reduce (sum) of ORDER_PROBE, whose value says in which order it was added."""
    x = np.array([ORDER_PROBE[comm.rank % len(ORDER_PROBE)]], dtype=np.float32)
    comm.all_reduce(x)
    return float(x[0])


def operations(comm: hcclpy.Communicator, on: Callable[[np.ndarray], Any],
               back: Callable[[Any], np.ndarray]) -> List[str]:
    """Every operation on buffers made by ``on`` (read back by ``back``); the mismatches."""
    rank, n = comm.rank, comm.size
    wrong: List[str] = []

    def check(name: str, got: Any, want: np.ndarray) -> None:
        got = back(got)
        if got.dtype != want.dtype or not np.array_equal(got, want):
            wrong.append(f"{name}: got {got.tolist()}, want {want.tolist()}")

    def data(r: int, count: int = 6, dtype: Any = np.int32) -> np.ndarray:
        return (np.arange(count) * 10 + r + 1).astype(dtype)

    everyone = [data(r) for r in range(n)]
    # Reductions: integers and float32 holding integers (exact in any order).
    for dtype, op, fold in ((np.int32, "sum", np.add), (np.float32, "max", np.maximum), (np.int64, "prod", np.multiply),
                            (np.float32, "min", np.minimum)):
        want = np.asarray(fold.reduce([data(r, dtype=dtype) for r in range(n)]), dtype=dtype)
        x = on(data(rank, dtype=dtype))
        comm.all_reduce(x, op=op)
        check(f"all_reduce {np.dtype(dtype).name} {op}", x, want)
    total = np.sum(everyone, axis=0, dtype=np.int32)
    for root in (1, n - 1):  # a root on each server
        out = on(np.zeros(6, np.int32))
        comm.reduce(on(data(rank)), out, root=root)
        if rank == root:
            check(f"reduce root {root}", out, total)
    blocks = np.arange(3 * n, dtype=np.float32) * (rank + 1)
    out = on(np.zeros(3, np.float32))
    comm.reduce_scatter(on(blocks), out)
    check("reduce_scatter", out, np.arange(3 * rank, 3 * rank + 3, dtype=np.float32) * sum(range(1, n + 1)))
    counts = [r + 1 for r in range(n)]
    displs = list(np.cumsum([0] + counts[:-1]))
    out = on(np.zeros(counts[rank], np.int32))
    comm.reduce_scatter_v(on(np.arange(sum(counts), dtype=np.int32) + rank), out, counts, displs)
    want = np.arange(displs[rank], displs[rank] + counts[rank], dtype=np.int32) * n + sum(range(n))
    check("reduce_scatter_v", out, want)
    for root in (0, n - 1):
        x = on(data(rank) if rank == root else np.zeros(6, np.int32))
        comm.broadcast(x, root=root)
        check(f"broadcast root {root}", x, everyone[root])
    out = on(np.zeros(6 * n, np.int32))
    comm.all_gather(on(data(rank)), out)
    check("all_gather", out, np.concatenate(everyone))
    out = on(np.zeros(sum(counts), np.int32))
    comm.all_gather_v(on(data(rank, counts[rank])), out, counts, displs)
    check("all_gather_v", out, np.concatenate([data(r, counts[r]) for r in range(n)]))
    for root in (0, n - 1):
        send = on(np.arange(2 * n, dtype=np.int32) + 100 * root) if rank == root else None
        out = on(np.zeros(2, np.int32))
        comm.scatter(send, out, root=root)
        check(f"scatter root {root}", out, np.arange(2 * rank, 2 * rank + 2, dtype=np.int32) + 100 * root)
    # Block j of rank r holds 100 * r + j: rank r receives 100 * s + r from every rank s.
    out = on(np.zeros(n, np.int32))
    comm.all_to_all(on(100 * rank + np.arange(n, dtype=np.int32)), out)
    check("all_to_all", out, 100 * np.arange(n, dtype=np.int32) + rank)
    # Rank r sends r + j + 1 elements to rank j, each holding 100 * r + j.
    matrix = [[r + j + 1 for j in range(n)] for r in range(n)]
    send = np.concatenate([np.full(matrix[rank][j], 100 * rank + j, np.int32) for j in range(n)])
    want = np.concatenate([np.full(matrix[s][rank], 100 * s + rank, np.int32) for s in range(n)])
    sdispls = list(np.cumsum([0] + matrix[rank][:-1]))
    rcounts = [matrix[s][rank] for s in range(n)]
    rdispls = list(np.cumsum([0] + rcounts[:-1]))
    out = on(np.zeros(len(want), np.int32))
    comm.all_to_all_v(on(send), out, matrix[rank], rcounts, sdispls, rdispls)
    check("all_to_all_v", out, want)
    out = on(np.zeros(len(want), np.int32))
    comm.all_to_all_vc(on(send), out, send_count_matrix=matrix)
    check("all_to_all_vc", out, want)
    # Send and receive: each rank with the rank of the same place on the other server.
    peer = (rank + n // 2) % n
    out = on(np.zeros(6, np.int32))
    if rank < n // 2:
        comm.send(on(data(rank)), peer)
        comm.recv(out, peer)
    else:
        comm.recv(out, peer)
        comm.send(on(data(rank)), peer)
    check("send/recv", out, everyone[peer])
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    out = on(np.zeros(6, np.int32))
    comm.batch_send_recv([("send", on(data(rank)), nxt), ("recv", out, prev)])
    check("batch_send_recv", out, everyone[prev])
    comm.barrier()
    return wrong


def main() -> int:
    comm = hcclpy.init()
    try:
        device = operations(comm, lambda a: hcclpy.from_numpy(a, device=comm.device),
                            lambda b: b.to_numpy())
        host = operations(comm, lambda a: a, lambda a: a)
        order = order_probe(comm)
        for problem in device:
            print(f"rank {comm.rank} device: {problem}")
        for problem in host:
            print(f"rank {comm.rank} numpy: {problem}")
        if not device and not host:
            print(f"rank {comm.rank} of {comm.size}: device and NumPy operations OK, sum order {order:g}")
    finally:
        hcclpy.shutdown()
    return 1 if device or host else 0


if __name__ == "__main__":
    sys.exit(main())
