"""Ranks as a 2-D grid, with one sub-communicator per row and one per column (``comm.split``).

With 4 ranks the grid is 2 x 2 (rank = row * columns + column)::

    row 0:  0  1
    row 1:  2  3

Every rank sums a value over its row, then sums the row totals over its column: the result is
the total over the whole grid, the same as one all-reduce on the world communicator. Any number
of ranks works: the grid has as many rows as the largest divisor of N not above sqrt(N).

Run it with::

    hcclpy run -n 4 examples/grid.py
    torchrun --nproc-per-node 4 examples/grid.py

Exit status 1 if a sub-communicator has the wrong shape or a sum is wrong.
"""

import math
import sys
from typing import List, Optional

import numpy as np

import hcclpy


def grid_shape(n: int) -> "tuple[int, int]":
    """(rows, columns): as square as ``n`` allows, rows <= columns."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def split_all(comm: hcclpy.Communicator, groups: List[List[int]]) -> hcclpy.Communicator:
    """Split ``comm`` into ``groups`` and return the sub-communicator this rank belongs to.

    ``split`` is collective over the parent: every rank makes every split, in the same order, and
    gets None for the groups it is not in.
    """
    mine: Optional[hcclpy.Communicator] = None
    for members in groups:
        sub = comm.split(members)
        if sub is not None:
            mine = sub
    assert mine is not None, "every rank is in one group"
    return mine


def main() -> int:
    comm = hcclpy.init()
    r, n = comm.rank, comm.size
    rows, cols = grid_shape(n)
    my_row, my_col = divmod(r, cols)
    row_comm = split_all(comm, [[i * cols + j for j in range(cols)] for i in range(rows)])
    col_comm = split_all(comm, [[i * cols + j for i in range(rows)] for j in range(cols)])
    failures = []
    if (row_comm.rank, row_comm.size) != (my_col, cols):
        failures.append(f"row communicator: rank {row_comm.rank} of {row_comm.size}, expected {my_col} of {cols}")
    if (col_comm.rank, col_comm.size) != (my_row, rows):
        failures.append(f"column communicator: rank {col_comm.rank} of {col_comm.size}, expected {my_row} of {rows}")

    stream = comm.device.create_stream()
    value = np.full(8, r + 1, dtype=np.float32)  # rank r contributes r + 1
    x = hcclpy.from_numpy(value, device=comm.device)
    row_sum = hcclpy.empty(8, "float32", device=comm.device)
    grid_sum = hcclpy.empty(8, "float32", device=comm.device)
    world_sum = hcclpy.empty(8, "float32", device=comm.device)
    row_comm.all_reduce(x, row_sum, stream=stream)          # over my row
    col_comm.all_reduce(row_sum, grid_sum, stream=stream)   # over my column, of the row totals
    comm.all_reduce(x, world_sum, stream=stream)            # the same, in one step
    stream.synchronize()

    expected_row = sum(my_row * cols + j + 1 for j in range(cols))
    if not np.all(row_sum.to_numpy() == expected_row):
        failures.append(f"row sum {row_sum.to_numpy()[0]}, expected {expected_row}")
    if not np.array_equal(grid_sum.to_numpy(), world_sum.to_numpy()) or not np.all(world_sum.to_numpy() ==
                                                                                      n * (n + 1) // 2):
        failures.append(f"grid sum {grid_sum.to_numpy()[0]}, world sum {world_sum.to_numpy()[0]}, "
                        f"expected {n * (n + 1) // 2}")
    for buf in (x, row_sum, grid_sum, world_sum):
        buf.close()
    stream.close()

    print(f"rank {r} at row {my_row}, column {my_col} of a {rows} x {cols} grid: "
          f"row sum {expected_row}, grid sum {n * (n + 1) // 2}: " + ("; ".join(failures) or "OK"))
    row_comm.destroy()  # collective over each sub-communicator, like the world's
    col_comm.destroy()
    hcclpy.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
