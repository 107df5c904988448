"""Every HCCL operation on device arrays, each checked against the result NumPy predicts.

The operations are queued on one stream and run asynchronously; the results are read back
after a single ``stream.synchronize()``. Every operation takes its buffers first, then
``op``/``root``/``peer``, then the keyword-only ``stream``.

Run it with any number of ranks (the point-to-point part needs two or more)::

    hcclpy run -n 4 examples/collectives.py
    torchrun --nproc-per-node 4 examples/collectives.py
    python examples/collectives.py          # one rank

Exit status 1 if any result is wrong.
"""

import sys

import numpy as np

import hcclpy

B = 4  # elements per rank in block-wise operations


def main() -> int:
    comm = hcclpy.init()
    r, n = comm.rank, comm.size
    dev = comm.device
    stream = dev.create_stream()

    def on_device(array: np.ndarray) -> hcclpy.DeviceArray:
        return hcclpy.from_numpy(array, device=dev)

    def empty(count: int, dtype: str) -> hcclpy.DeviceArray:
        return hcclpy.empty(count, dtype, device=dev)

    base = np.arange(B * n, dtype=np.float32)  # n blocks of B elements
    mine = base + 100 * r                      # this rank's input: rank r adds 100 * r
    x = on_device(mine)
    ranks_sum = 100 * n * (n - 1) // 2         # sum over ranks of 100 * rank
    out = {}                                   # name -> (device result, expected array)

    # Reductions.
    y = empty(B * n, "float32")
    comm.all_reduce(x, y, hcclpy.ReduceOp.SUM, stream=stream)
    out["all_reduce sum"] = (y, n * base + ranks_sum)

    xi = on_device(mine.astype(np.int32))
    comm.all_reduce(xi, op="max", stream=stream)  # recv=None: in place
    out["all_reduce max (in place, int32)"] = (xi, (base + 100 * (n - 1)).astype(np.int32))

    z = empty(B * n, "float32")
    comm.reduce(x, z, "sum", root=0, stream=stream)
    if r == 0:  # only the root's output is defined
        out["reduce to root 0"] = (z, n * base + ranks_sum)

    rs = empty(B, "float32")
    comm.reduce_scatter(x, rs, "sum", stream=stream)
    out["reduce_scatter"] = (rs, n * base[B * r:B * (r + 1)] + ranks_sum)

    counts = [j + 1 for j in range(n)]  # uneven blocks: rank j gets j + 1 elements
    offset = sum(counts[:r])
    rsv_in = on_device(np.arange(sum(counts), dtype=np.float32))
    rsv = empty(counts[r], "float32")
    comm.reduce_scatter_v(rsv_in, rsv, counts, op="sum", stream=stream)
    out["reduce_scatter_v"] = (rsv, n * np.arange(offset, offset + counts[r], dtype=np.float32))

    # Data motion.
    bc = on_device(np.full(B, r, dtype=np.float64))
    comm.broadcast(bc, root=n - 1, stream=stream)
    out["broadcast from the last rank"] = (bc, np.full(B, n - 1, dtype=np.float64))

    ag = empty(B * n, "float32")
    comm.all_gather(on_device(np.full(B, r, dtype=np.float32)), ag, stream=stream)
    out["all_gather"] = (ag, np.repeat(np.arange(n, dtype=np.float32), B))

    agv = empty(sum(counts), "float32")
    comm.all_gather_v(on_device(np.full(counts[r], r, dtype=np.float32)), agv, counts, stream=stream)
    out["all_gather_v"] = (agv, np.repeat(np.arange(n, dtype=np.float32), counts))

    sc = empty(B, "float32")
    comm.scatter(x if r == 0 else None, sc, root=0, stream=stream)  # the root's input: base
    out["scatter from root 0"] = (sc, base[B * r:B * (r + 1)])

    a2a = empty(B * n, "float32")
    comm.all_to_all(x, a2a, stream=stream)  # block j of rank i's input becomes block i of rank j's output
    out["all_to_all"] = (a2a, np.concatenate([base[B * r:B * (r + 1)] + 100 * j for j in range(n)]))

    # all_to_all_v: rank i sends j + 1 elements of value 10 * i + j to rank j.
    send_counts, recv_counts = [j + 1 for j in range(n)], [r + 1] * n
    a2av_in = on_device(np.concatenate([np.full(j + 1, 10 * r + j, np.float32) for j in range(n)]))
    a2av = empty(sum(recv_counts), "float32")
    comm.all_to_all_v(a2av_in, a2av, send_counts, recv_counts, stream=stream)
    out["all_to_all_v"] = (a2av, np.concatenate([np.full(r + 1, 10 * j + r, np.float32) for j in range(n)]))

    # all_to_all_vc: one matrix on every rank; matrix[i][j] elements go from rank i to rank j.
    matrix = np.add.outer(np.arange(n), np.arange(n)) + 1
    vc_in = on_device(np.concatenate([np.full(matrix[r, j], 10 * r + j, np.float32) for j in range(n)]))
    vc = empty(int(matrix[:, r].sum()), "float32")
    comm.all_to_all_vc(vc_in, vc, matrix, stream=stream)
    out["all_to_all_vc"] = (vc, np.concatenate([np.full(matrix[i, r], 10 * i + r, np.float32) for i in range(n)]))

    # Point to point: a ring each way.
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        token = on_device(np.full(B, r, dtype=np.float32))
        from_prev, from_next = empty(B, "float32"), empty(B, "float32")
        with hcclpy.group():  # sends and receives released together cannot deadlock
            comm.send(token, nxt, stream=stream)
            comm.recv(from_prev, prv, stream=stream)
        out["send/recv in a group"] = (from_prev, np.full(B, prv, dtype=np.float32))
        comm.batch_send_recv([("send", token, prv), ("recv", from_next, nxt)], stream=stream)
        out["batch_send_recv"] = (from_next, np.full(B, nxt, dtype=np.float32))

    comm.barrier(stream=stream)
    stream.synchronize()  # everything above has run from here on

    failures = 0
    for name, (buf, expected) in out.items():
        got = buf.to_numpy()
        if not np.array_equal(got, expected):
            failures += 1
            print(f"rank {r}: {name}: WRONG\n  got      {got}\n  expected {expected}")
    print(f"rank {r} of {n}: {len(out) - failures} of {len(out)} operations OK")
    stream.close()
    hcclpy.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
