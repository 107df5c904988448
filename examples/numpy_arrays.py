"""Every HCCL operation on NumPy arrays, each checked against the result NumPy predicts.

Host arrays need no device code: hcclpy stages them through device memory, runs the operation
and copies the result back. These calls block. Without an output, all_reduce, reduce and
broadcast work in place (the array given is the result); the others return a new array.
Block-wise operations split the first axis into one block per rank.

Run it with any number of ranks (the point-to-point part needs two or more)::

    hcclpy run -n 4 examples/numpy_arrays.py
    torchrun --nproc-per-node 4 examples/numpy_arrays.py
    python examples/numpy_arrays.py          # one rank

Exit status 1 if any result is wrong.
"""

import sys

import numpy as np

import hcclpy


def main() -> int:
    comm = hcclpy.init()
    r, n = comm.rank, comm.size
    results = []  # (name, result, expected)

    # Reductions. Any shape; the result has the input's shape and dtype.
    grid = np.arange(6, dtype=np.float32).reshape(2, 3) + 100 * r
    ranks_sum = 100 * n * (n - 1) // 2
    results.append(("all_reduce max into out=", comm.all_reduce(grid, np.empty_like(grid), op="max"),
                    grid - 100 * r + 100 * (n - 1)))
    total = comm.reduce(grid.copy(), op="sum", root=0)  # in place on the root, None elsewhere
    if r == 0:
        results.append(("reduce to root 0", total, n * grid + ranks_sum))
    expected = n * (grid - 100 * r) + ranks_sum
    results.append(("all_reduce sum, in place", comm.all_reduce(grid), expected))  # grid is the result
    results.append(("the array given holds the sum", grid, expected))

    rows = np.arange(2 * n * 3, dtype=np.int64).reshape(2 * n, 3)  # two rows per rank
    results.append(("reduce_scatter", comm.reduce_scatter(rows), n * rows[2 * r:2 * r + 2]))
    counts = [j + 1 for j in range(n)]  # uneven: rank j gets j + 1 elements
    offset = sum(counts[:r])
    flat = np.arange(sum(counts), dtype=np.float64)
    results.append(("reduce_scatter_v", comm.reduce_scatter_v(flat, send_counts=counts, op="sum"),
                    n * flat[offset:offset + counts[r]]))

    # Data motion.
    results.append(("broadcast from the last rank", comm.broadcast(np.full(3, r, np.int32), root=n - 1),
                    np.full(3, n - 1, np.int32)))
    results.append(("all_gather (stacked)", comm.all_gather(np.full((2, 2), r, np.float32)),
                    np.repeat(np.arange(n, dtype=np.float32), 4).reshape(n, 2, 2)))
    results.append(("all_gather_v", comm.all_gather_v(np.full(counts[r], r, np.float32), recv_counts=counts),
                    np.repeat(np.arange(n, dtype=np.float32), counts)))
    source = np.arange(3 * n, dtype=np.float32).reshape(n, 3)  # what root 0 scatters, one row per rank
    # Only the root's array is read; the others pass the array they receive into.
    results.append(("scatter from root 0", comm.scatter(source if r == 0 else None, np.empty((1, 3), np.float32),
                                                        root=0), source[r:r + 1]))
    blocks = np.arange(2 * n, dtype=np.int32) + 100 * r  # two elements for each rank
    results.append(("all_to_all", comm.all_to_all(blocks),
                    np.concatenate([np.arange(2 * r, 2 * r + 2, dtype=np.int32) + 100 * j for j in range(n)])))
    # all_to_all_v: rank i sends j + 1 elements of value 10 * i + j to rank j.
    outgoing = np.concatenate([np.full(j + 1, 10 * r + j, np.float32) for j in range(n)])
    results.append(("all_to_all_v", comm.all_to_all_v(outgoing, send_counts=[j + 1 for j in range(n)],
                                                      recv_counts=[r + 1] * n),
                    np.concatenate([np.full(r + 1, 10 * j + r, np.float32) for j in range(n)])))
    # all_to_all_vc: one matrix on every rank; matrix[i][j] elements go from rank i to rank j.
    matrix = np.add.outer(np.arange(n), np.arange(n)) + 1
    outgoing = np.concatenate([np.full(matrix[r, j], 10 * r + j, np.float32) for j in range(n)])
    results.append(("all_to_all_vc", comm.all_to_all_vc(outgoing, send_count_matrix=matrix),
                    np.concatenate([np.full(matrix[i, r], 10 * i + r, np.float32) for i in range(n)])))

    # Point to point. A NumPy send blocks until the peer has received it, so ranks take turns:
    # even ranks send first, odd ranks receive first.
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        token, got = np.full(4, r, np.float32), np.empty(4, np.float32)
        if r % 2 == 0:
            comm.send(token, nxt)
            comm.recv(got, prv)  # written in place
        else:
            comm.recv(got, prv)
            comm.send(token, nxt)
        results.append(("send/recv ring", got, np.full(4, prv, np.float32)))
        from_next = np.empty(4, np.float32)
        comm.batch_send_recv([("send", token, prv), ("recv", from_next, nxt)])  # posted together: any order
        results.append(("batch_send_recv", from_next, np.full(4, nxt, np.float32)))

    failures = 0
    for name, got, expected in results:
        if got is None or got.shape != expected.shape or got.dtype != expected.dtype or \
                not np.array_equal(got, expected):
            failures += 1
            print(f"rank {r}: {name}: WRONG\n  got      {got!r}\n  expected {expected!r}")
    print(f"rank {r} of {n}: {len(results) - failures} of {len(results)} operations OK")
    hcclpy.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
