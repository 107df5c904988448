"""Hierarchical all-reduce: reduce inside each group, all-reduce among the group leaders, then
broadcast inside each group.

This is how a job spanning several servers keeps most traffic inside a server: ranks are split
into groups of consecutive ranks (think: the devices of one server), and only one rank per group
(its leader, the group's first rank) talks to the other groups. With 4 ranks in groups of 2::

    groups:  [0, 1]  [2, 3]        leaders: [0, 2]

    1. reduce to the leader inside each group     (intra-group communicator)
    2. all-reduce among the leaders               (leaders' communicator)
    3. broadcast from the leader inside each group

The three steps are queued on one stream, so each starts when the previous one has finished,
without the host waiting in between. The result is checked against a flat all-reduce on the
world communicator. The group size is the largest divisor of N not above sqrt(N), or
``--group-size G`` (G must divide N).

Run it with::

    hcclpy run -n 4 examples/hierarchical_allreduce.py
    torchrun --nproc-per-node 4 examples/hierarchical_allreduce.py

Exit status 1 if the hierarchical result differs from the flat one.
"""

import argparse
import math
import sys
from typing import List, Optional

import numpy as np

import hcclpy

COUNT = 4096


def split_all(comm: hcclpy.Communicator, groups: List[List[int]]) -> Optional[hcclpy.Communicator]:
    """Make every split of ``groups`` (collective: all ranks, same order); return this rank's, or None."""
    mine = None
    for members in groups:
        sub = comm.split(members)
        if sub is not None:
            mine = sub
    return mine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group-size", type=int, default=None, help="ranks per group (must divide N)")
    args = parser.parse_args()

    comm = hcclpy.init()
    r, n = comm.rank, comm.size
    size = args.group_size
    if size is None:  # the largest divisor of n up to its square root
        size = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    if size < 1 or n % size:
        print(f"--group-size {size}: use a positive divisor of the number of ranks, {n}", file=sys.stderr)
        hcclpy.shutdown()
        return 2
    groups = [list(range(first, first + size)) for first in range(0, n, size)]
    leaders = [group[0] for group in groups]
    intra = split_all(comm, groups)
    inter = comm.split(leaders)  # None on ranks that are not leaders

    stream = comm.device.create_stream()
    data = np.arange(COUNT, dtype=np.float32) * (r + 1)  # integers: every order of summation is exact
    x = hcclpy.from_numpy(data, device=comm.device)
    result = hcclpy.empty(COUNT, "float32", device=comm.device)
    flat = hcclpy.empty(COUNT, "float32", device=comm.device)

    intra.reduce(x, result, "sum", root=0, stream=stream)  # 1. the group's sum, on its leader
    if inter is not None:
        inter.all_reduce(result, stream=stream)             # 2. leaders: sum of the group sums, in place
    intra.broadcast(result, root=0, stream=stream)          # 3. the leader's total to its group
    comm.all_reduce(x, flat, "sum", stream=stream)          # the reference: one flat all-reduce
    stream.synchronize()

    got, expected = result.to_numpy(), flat.to_numpy()
    ok = np.array_equal(got, expected) and np.array_equal(expected, np.arange(COUNT, dtype=np.float32) *
                                                          (n * (n + 1) // 2))
    role = "leader" if inter is not None else "member"
    print(f"rank {r} ({role} of group {r // size}, groups of {size}): hierarchical "
          f"{'equals' if ok else 'DIFFERS from'} flat all-reduce" + ("" if ok else f": {got[:4]} vs {expected[:4]}"))
    for buf in (x, result, flat):
        buf.close()
    stream.close()
    intra.destroy()
    if inter is not None:
        inter.destroy()
    hcclpy.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
