"""hcclpy under mpiexec, with mpi4py carrying the root info: no TCP rendezvous, no ports.

``hcclpy.init(mpi_comm=MPI.COMM_WORLD)`` takes rank and size from the MPI communicator and
broadcasts HCCL's root info over it, so the job needs nothing but the MPI launcher. Each rank
then sums its rank with HCCL and with MPI, and checks that both agree.

Run it with an MPI launcher (the ``mpich`` wheel provides one) and mpi4py::

    mpiexec -n 4 python examples/mpi_bootstrap.py

Exit status 1 on a wrong result.
"""

import sys

import numpy as np
from mpi4py import MPI

import hcclpy


def main() -> int:
    world = MPI.COMM_WORLD
    comm = hcclpy.init(mpi_comm=world)
    try:
        by_hccl = comm.all_reduce(np.array([comm.rank], dtype=np.int64))
        by_mpi = world.allreduce(world.Get_rank(), op=MPI.SUM)
        ok = (comm.rank, comm.size) == (world.Get_rank(), world.Get_size()) and int(by_hccl[0]) == by_mpi
        print(f"rank {comm.rank} of {comm.size}: HCCL sum {int(by_hccl[0])}, MPI sum {by_mpi}: "
              f"{'OK' if ok else 'WRONG'}", flush=True)
        return 0 if ok else 1
    finally:
        hcclpy.shutdown()


if __name__ == "__main__":
    sys.exit(main())
