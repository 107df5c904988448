#!/usr/bin/env python3
"""Instructions per 8-byte all_reduce + stream synchronisation from Python, counted by callgrind.

Timings on a shared VM swing by half between phases; instruction counts repeat. Each loop runs
in its own process under ``valgrind --tool=callgrind --separate-threads=yes`` on one rank (no
waiting for a peer): the main thread's count, minus that of the same process with an empty loop,
divided by the number of calls. The streams' worker threads are left out: they wake at times that
vary from run to run. With mpi4py installed, the same reduction through MPI is counted too.

    python benchmarks/count_instructions.py            # needs valgrind (apt install valgrind)
    python benchmarks/count_instructions.py --calls 50000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent

# (name, what the loop does, environment, the loop whose count is subtracted)
LOOPS = [
    ("empty", "nothing (the baseline)", {}, ""),
    ("raw", "raw cffi: HcclAllReduce + aclrtSynchronizeStream, arguments cast beforehand", {}, "empty"),
    ("hcclpy", "hcclpy: comm.all_reduce(x, y, stream=s) + s.synchronize()", {}, "empty"),
    ("hcclpy-untraced", "the same with the flight recorder off (HCCLPY_TRACE=0)", {"HCCLPY_TRACE": "0"}, "empty"),
    ("hcclpy-numpy", "hcclpy on NumPy arrays: comm.all_reduce(a, out=b), staged through the device", {}, "empty"),
    ("mpi4py-empty", "nothing, with MPI initialised instead of hcclpy (the MPI baseline)", {}, ""),
    ("mpi4py", "mpi4py: comm.Allreduce(x, y) on NumPy arrays, MPI's world of one process", {}, "mpi4py-empty"),
]


def run_mpi_loop(name: str, calls: int) -> None:
    """The MPI loops: the same 8-byte reduction through mpi4py (MPI_Init as a singleton)."""
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    if name == "mpi4py":
        for _ in range(calls):
            world.Allreduce(x, y)
    else:
        for _ in range(calls):
            pass


def run_loop(name: str, calls: int) -> None:
    """The loop ``name``, ``calls`` times, after the same set-up for every loop of its baseline."""
    if name.startswith("mpi4py"):
        run_mpi_loop(name, calls)
        return
    import warnings

    warnings.simplefilter("ignore")  # the simulator fallback notice
    sys.path.insert(0, str(HERE.parent))
    import hcclpy
    from hcclpy import _ffi

    import numpy as np

    comm = hcclpy.init(rank=0, world_size=1)
    stream = comm.device.create_stream()
    a, b = np.ones(2, np.float32), np.empty(2, np.float32)
    comm.all_reduce(a, out=b)  # the staging buffers, made once
    x, y = (hcclpy.empty(2, "float32", device=comm.device) for _ in range(2))
    all_reduce, synchronize = comm.all_reduce, stream.synchronize
    c_all_reduce, c_synchronize = _ffi.api().HcclAllReduce, _ffi.api().aclrtSynchronizeStream
    cx, cy, handle, c_stream = x._cptr, y._cptr, comm._handle, stream._ptr_cdata
    if name == "raw":
        for _ in range(calls):
            c_all_reduce(cx, cy, 2, 4, 0, handle, c_stream)
            c_synchronize(c_stream)
    elif name == "hcclpy-numpy":
        for _ in range(calls):
            all_reduce(a, out=b)
    elif name.startswith("hcclpy"):
        for _ in range(calls):
            all_reduce(x, y, stream=stream)
            synchronize()
    else:
        for _ in range(calls):
            pass
    hcclpy.shutdown()


def count(name: str, env: Dict[str, str], calls: int, scratch: Path) -> int:
    """The main thread's instruction count of loop ``name`` run under callgrind."""
    out = scratch / f"{name}.out"
    command = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
               sys.executable, str(Path(__file__).resolve()), "--loop", name, "--calls", str(calls)]
    done = subprocess.run(command, env=dict(os.environ, HCCLPY_BACKEND="sim", **env), capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"callgrind on the {name} loop failed:\n{done.stderr[-2000:]}")
    main_thread = Path(f"{out}-01")
    for line in main_thread.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no instruction total in {main_thread}")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per loop (default 20000)")
    parser.add_argument("--loop", choices=[name for name, _, _, _ in LOOPS], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls is {args.calls}; use 1 or more")
    if args.loop:
        run_loop(args.loop, args.calls)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt install valgrind)", file=sys.stderr)
        return 1
    loops = [loop for loop in LOOPS if not loop[0].startswith("mpi4py") or importlib.util.find_spec("mpi4py")]
    with tempfile.TemporaryDirectory() as scratch, concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(count, name, env, args.calls, Path(scratch)) for name, _, env, _ in loops}
        totals = {name: future.result() for name, future in futures.items()}
    print(f"# instructions per iteration on the main thread, {args.calls} calls per loop, one rank")
    print(f"{'loop':<17}{'per call':>10}  what it does")
    for name, what, _, baseline in loops:
        if baseline:
            print(f"{name:<17}{(totals[name] - totals[baseline]) / args.calls:>10,.0f}  {what}")
    if len(loops) < len(LOOPS):
        print("# mpi4py is not installed: no MPI row")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
