"""All-reduce across N ranks: the hcclpy "hello world".

Each rank puts [0, 1, ..., N-1] (float32) in device memory, the ranks sum it with one all-reduce,
and every rank checks that it now holds [0, N, 2N, ..., (N-1)N].

Run it with any launcher; with none, it is a job of one rank::

    hcclpy run -n 4 examples/allreduce.py
    torchrun --nproc-per-node 4 examples/allreduce.py
    python examples/allreduce.py

On a machine without CANN it runs on the hcclpy CPU simulator. Exit status 1 on a wrong result.
"""

import sys

import numpy as np

import hcclpy


def main() -> int:
    comm = hcclpy.init()  # rank, world size and device from the launcher's environment
    try:
        n = comm.size
        x = hcclpy.from_numpy(np.arange(n, dtype=np.float32), device=comm.device)
        stream = comm.device.default_stream
        comm.all_reduce(x, op=hcclpy.ReduceOp.SUM, stream=stream)  # in place; returns once queued
        stream.synchronize()  # the result is defined from here on
        result = x.to_numpy()
        expected = n * np.arange(n, dtype=np.float32)
        ok = np.array_equal(result, expected)
        print(f"rank {comm.rank} of {n}: {result.tolist()} {'OK' if ok else f'WRONG, expected {expected.tolist()}'}")
        x.close()
    finally:
        hcclpy.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
