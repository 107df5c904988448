#!/usr/bin/env python3
"""all_reduce of NumPy arrays (staged through the device) next to all_reduce of device arrays.

Two ranks, one process each, started through ``hcclpy run`` (the script relaunches itself when it
is not already a rank). For every size from 8 B to 64 MiB (float32, sum, ×2 steps) each rank times,
in the same run and interleaved round by round:

* ``numpy``: ``comm.all_reduce(array, out=out)``: host array in, host array out, blocking. The first
  calls (warm-up) grow the communicator's staging buffers; the timed calls are the steady state.
* ``device``: ``comm.all_reduce(dev_a, dev_b, stream=s); s.synchronize()``: device arrays, the
  same blocking pattern, so both columns are "time until the result is usable".
* ``copy in`` and ``copy out``: the array copied into a device array of its size
  (``scratch.copy_from(array)``), and back out (``scratch.copy_to(out)``), each timed alone: what
  any staging of host arrays must spend on top of the collective.

The floor is copy in + device + copy out, each measured alone in the same run; the NumPy path
stages whole arrays (one copy in, the device operation, one copy out), so its target is
numpy <= 1.1 x the floor at 64 MiB (issue 28).

Each round is a loop of ``iters`` calls between two barriers, timed with ``time.perf_counter``;
the per-call time of a size is the median over ``--rounds`` rounds, then the maximum over ranks
(the slowest rank decides when a collective is done). Nothing is asserted: this is a benchmark, not a test. Before and after the
sweep the script prints whether the two vCPUs ran as two cores or as hyperthreads of one
(``machine.py``).

    python benchmarks/numpy_vs_device.py                   # 2 ranks, 8 B .. 64 MiB, 7 rounds
    python benchmarks/numpy_vs_device.py --rounds 9 --max-bytes 16M --markdown
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import machine  # noqa: E402  (a sibling module)
from hcclpy._units import format_bytes as human  # noqa: E402  (8 B, 4 KiB, 64 MiB)
from hcclpy.cli._numbers import byte_size  # noqa: E402  (sizes as the CLI takes them: 8, 64K, 2M)

TARGET_RATIO = 1.1  # numpy path / (copy in + device + copy out) at the largest size (issue 28)


def sweep_parser(description: str, rounds: int, budget: str, compared: str,
                 ranks: str = "ranks (processes)") -> argparse.ArgumentParser:
    """The options of a size sweep that compares two ways of all-reducing (``compared``: what is
    compared, ``ranks``: what ``-n`` counts, for the help text); this script's, ``torch_vs_gloo.py``'s
    and ``servers_vs_gloo.py``'s."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", "--ranks", type=int, default=2, help=f"{ranks}, default 2")
    parser.add_argument("--min-bytes", type=byte_size, default=8, help="smallest size, default 8")
    parser.add_argument("--max-bytes", type=byte_size, default=64 << 20, help="largest size, default 64M")
    parser.add_argument("--rounds", type=int, default=rounds,
                        help=f"timed rounds per size and {compared} (median), default {rounds}")
    parser.add_argument("--budget", type=byte_size, default=byte_size(budget),
                        help=f"bytes all-reduced per round (sets the calls per round), default {budget}")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--timeout", type=float, default=900.0, help="stop the ranks after this many seconds")
    return parser


def sweep_arguments(argv: List[str], description: str, rounds: int, budget: str, compared: str) -> argparse.Namespace:
    return sweep_parser(description, rounds, budget, compared).parse_args(argv)


def arguments(argv: List[str]) -> argparse.Namespace:
    return sweep_arguments(argv, __doc__.split("\n\n")[0], rounds=7, budget="512M", compared="path")


def launch(argv: List[str], args: argparse.Namespace, script: Path = Path(__file__)) -> int:
    """Start the ranks: ``hcclpy run -n N script ARGS`` (rank 0 prints the table)."""
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(args.ranks), "--no-prefix",
               "--timeout", str(args.timeout), str(script.resolve()), *argv]
    return run_probed([command], checkout_env())


def checkout_env() -> Dict[str, str]:
    """This process's environment, with this checkout first on ``PYTHONPATH`` (for the ranks)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    return env


def run_probed(commands: List[List[str]], env: Dict[str, str]) -> int:
    """Run the commands at once (launchers, one per node) between two probes of the machine; the
    exit status of the first that fails, once the others are stopped (they would wait for its
    ranks), else 0."""
    print(f"# before: {machine.copying().describe()}", flush=True)
    children = [subprocess.Popen(command, env=env) for command in commands]
    try:
        codes = [child.poll() for child in children]
        while None in codes and not any(codes):
            time.sleep(0.05)
            codes = [child.poll() for child in children]
        status = next((code for code in codes if code), 0)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    print(f"# after: {machine.copying().describe()}")
    return status


def rank_main(args: argparse.Namespace) -> None:
    import warnings

    import numpy as np

    import hcclpy
    import hcclpy.host

    warnings.simplefilter("ignore")  # the simulator fallback notice, once per rank
    comm = hcclpy.init()
    rank, size = comm.rank, comm.size
    stream = comm.device.create_stream()

    def barrier() -> None:
        hcclpy.host.barrier(comm)

    sizes = []
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        sizes.append(nbytes)
        nbytes *= 2
    rows = []
    wrong = 0
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        iters = max(3, min(1000, args.budget // nbytes))
        host = np.full(count, rank + 1, dtype=np.float32)
        out = np.empty_like(host)
        dev_a = hcclpy.from_numpy(host, device=comm.device)
        dev_b = hcclpy.empty(count, "float32", device=comm.device)
        scratch, copied = hcclpy.empty(count, "float32", device=comm.device), np.empty_like(host)
        for _ in range(max(2, iters // 10)):  # warm-up: staging buffers, page faults, caches
            comm.all_reduce(host, out)
            comm.all_reduce(dev_a, dev_b, stream=stream)
            stream.synchronize()
            scratch.copy_from(host)
            scratch.copy_to(copied)
        loops = {"numpy": lambda: comm.all_reduce(host, out),
                 "device": lambda: (comm.all_reduce(dev_a, dev_b, stream=stream), stream.synchronize()),
                 "copy in": lambda: scratch.copy_from(host), "copy out": lambda: scratch.copy_to(copied)}
        times: dict = {path: [] for path in loops}
        for _ in range(args.rounds):
            for path, call in loops.items():
                barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    call()
                times[path].append((time.perf_counter() - start) / iters)
        expected = size * (size + 1) / 2
        wrong += int(np.count_nonzero(out != expected)) + int(np.count_nonzero(dev_b.to_numpy() != expected))
        wrong += int(np.count_nonzero(copied != host))
        mine = np.array([statistics.median(times[path]) for path in loops])
        slowest = comm.all_reduce(mine, op="max")
        rows.append((nbytes, count, iters, *slowest))
        for array in (dev_a, dev_b, scratch):
            array.close()
    wrong = int(comm.all_reduce(np.array([wrong], dtype=np.int64))[0])
    if rank == 0:
        report(rows, wrong, size, args)
    stream.close()
    hcclpy.shutdown()


def report(rows: list, wrong: int, size: int, args: argparse.Namespace) -> None:
    print(f"# all_reduce float32 sum, {size} ranks (processes), hcclpy backend: {__import__('hcclpy').backend()}")
    print(f"# per-call time: median of {args.rounds} rounds, max over ranks; floor = copy in + device + copy out, "
          "each timed alone; ratio = numpy / floor")
    header = ["size", "count", "calls", "numpy ms", "device ms", "copy in ms", "copy out ms", "floor ms", "ratio"]
    lines = []
    for nbytes, count, iters, t_np, t_dev, t_in, t_out in rows:
        floor = t_in + t_dev + t_out
        lines.append([human(nbytes), str(count), str(iters)] + [f"{t * 1e3:.4f}" for t in (t_np, t_dev, t_in, t_out,
                                                                                          floor)]
                     + [f"{t_np / floor:.2f}"])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---:|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        print(" ".join(f"{h:>11}" for h in header))
        for line in lines:
            print(" ".join(f"{cell:>11}" for cell in line))
    nbytes, _, _, t_np, t_dev, t_in, t_out = rows[-1]
    floor = t_in + t_dev + t_out
    ratio = t_np / floor
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"# {human(nbytes)}: numpy {t_np * 1e3:.2f} ms, floor {floor * 1e3:.2f} ms (copy in {t_in * 1e3:.2f} + "
          f"device {t_dev * 1e3:.2f} + copy out {t_out * 1e3:.2f}), ratio {ratio:.2f}x (target <= {TARGET_RATIO}x: "
          f"{verdict}); numpy / device {t_np / t_dev:.2f}x")
    print(f"# wrong elements (all ranks, last round of each size): {wrong}")


def main(argv: List[str]) -> int:
    args = arguments(argv)
    if os.environ.get("HCCLPY_LAUNCHER") != "hcclpy-run":
        return launch(argv, args)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
