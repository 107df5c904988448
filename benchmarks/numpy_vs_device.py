#!/usr/bin/env python3
"""all_reduce of NumPy arrays (staged through the device) next to all_reduce of device arrays.

Two ranks, one process each, started through ``hcclpy run`` (the script relaunches itself when it
is not already a rank). For every size from 8 B to 64 MiB (float32, sum, ×2 steps) each rank times,
in the same run and interleaved round by round:

* ``numpy``: ``comm.all_reduce(array, out=out)``: host array in, host array out, blocking. The first
  calls (warm-up) grow the communicator's staging buffers; the timed calls are the steady state.
* ``device``: ``comm.all_reduce(dev_a, dev_b, stream=s); s.synchronize()``: device arrays, the
  same blocking pattern, so both columns are "time until the result is usable".
* ``copies``: the array copied into a device buffer and back out, chunk by chunk as hcclpy stages
  it (``chunk.copy_from(part); chunk.copy_to(out_part)``), with no collective at all: what any
  staging of host arrays must spend on top of the collective, so a floor under ``numpy``.

Each round is a loop of ``iters`` calls between two barriers, timed with ``time.perf_counter``;
the per-call time of a size is the median over ``--rounds`` rounds, then the maximum over ranks
(the slowest rank decides when a collective is done). The ratio is numpy / device; the target
for 64 MiB is ≤ 1.5×. Nothing is asserted: this is a benchmark, not a test. Before and after the
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
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import machine  # noqa: E402  (a sibling module)
from hcclpy._units import format_bytes as human  # noqa: E402  (8 B, 4 KiB, 64 MiB)
from hcclpy.cli._numbers import byte_size  # noqa: E402  (sizes as the CLI takes them: 8, 64K, 2M)

TARGET_RATIO = 1.5  # numpy path / device path at the largest size (project issue)


def sweep_arguments(argv: List[str], description: str, rounds: int, budget: str, compared: str) -> argparse.Namespace:
    """The options of a size sweep that compares two ways of all-reducing (``compared``: what is
    compared, for the help text); this script's and ``torch_vs_gloo.py``'s."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", "--ranks", type=int, default=2, help="ranks (processes), default 2")
    parser.add_argument("--min-bytes", type=byte_size, default=8, help="smallest size, default 8")
    parser.add_argument("--max-bytes", type=byte_size, default=64 << 20, help="largest size, default 64M")
    parser.add_argument("--rounds", type=int, default=rounds,
                        help=f"timed rounds per size and {compared} (median), default {rounds}")
    parser.add_argument("--budget", type=byte_size, default=byte_size(budget),
                        help=f"bytes all-reduced per round (sets the calls per round), default {budget}")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--timeout", type=float, default=900.0, help="stop the ranks after this many seconds")
    return parser.parse_args(argv)


def arguments(argv: List[str]) -> argparse.Namespace:
    return sweep_arguments(argv, __doc__.split("\n\n")[0], rounds=7, budget="512M", compared="path")


def launch(argv: List[str], args: argparse.Namespace, script: Path = Path(__file__)) -> int:
    """Start the ranks: ``hcclpy run -n N script ARGS`` (rank 0 prints the table)."""
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(args.ranks), "--no-prefix",
               "--timeout", str(args.timeout), str(script.resolve()), *argv]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    print(f"# before: {machine.copying().describe()}", flush=True)
    status = subprocess.call(command, env=env)
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
        step = min(count, hcclpy.host.CHUNK_BYTES // 4)
        chunk, copied = hcclpy.empty(step, "float32", device=comm.device), np.empty_like(host)

        def copies() -> None:
            for start in range(0, count, step):
                part = chunk if count - start >= step else chunk[: count - start]
                part.copy_from(host[start:start + step])
                part.copy_to(copied[start:start + step])

        for _ in range(max(2, iters // 10)):  # warm-up: staging buffers, page faults, caches
            comm.all_reduce(host, out=out)
            comm.all_reduce(dev_a, dev_b, stream=stream)
            stream.synchronize()
            copies()
        times = {"numpy": [], "device": [], "copies": []}
        for _ in range(args.rounds):
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(host, out=out)
            times["numpy"].append((time.perf_counter() - start) / iters)
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(dev_a, dev_b, stream=stream)
                stream.synchronize()
            times["device"].append((time.perf_counter() - start) / iters)
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                copies()
            times["copies"].append((time.perf_counter() - start) / iters)
        expected = size * (size + 1) / 2
        wrong += int(np.count_nonzero(out != expected)) + int(np.count_nonzero(dev_b.to_numpy() != expected))
        wrong += int(np.count_nonzero(copied != host))
        mine = np.array([statistics.median(times[path]) for path in ("numpy", "device", "copies")])
        slowest = comm.all_reduce(mine, op="max")
        rows.append((nbytes, count, iters, *slowest))
        for array in (dev_a, dev_b, chunk):
            array.close()
    wrong = int(comm.all_reduce(np.array([wrong], dtype=np.int64))[0])
    if rank == 0:
        report(rows, wrong, size, args)
    stream.close()
    hcclpy.shutdown()


def report(rows: list, wrong: int, size: int, args: argparse.Namespace) -> None:
    print(f"# all_reduce float32 sum, {size} ranks (processes), hcclpy backend: {__import__('hcclpy').backend()}")
    print(f"# per-call time: median of {args.rounds} rounds, max over ranks; ratio = numpy / device; "
          "copies: the staging copies alone, no collective")
    if args.markdown:
        print("| size | count | calls/round | numpy (ms) | device (ms) | ratio | copies (ms) | copies / device |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for nbytes, count, iters, t_np, t_dev, t_copy in rows:
            print(f"| {human(nbytes)} | {count} | {iters} | {t_np * 1e3:.4f} | {t_dev * 1e3:.4f} | "
                  f"{t_np / t_dev:.2f} | {t_copy * 1e3:.4f} | {t_copy / t_dev:.2f} |")
    else:
        print(f"{'size':>10} {'count':>10} {'calls':>6} {'numpy ms':>11} {'device ms':>11} {'ratio':>7} "
              f"{'copies ms':>11} {'copies/dev':>10}")
        for nbytes, count, iters, t_np, t_dev, t_copy in rows:
            print(f"{human(nbytes):>10} {count:>10} {iters:>6} {t_np * 1e3:>11.4f} {t_dev * 1e3:>11.4f} "
                  f"{t_np / t_dev:>7.2f} {t_copy * 1e3:>11.4f} {t_copy / t_dev:>10.2f}")
    nbytes, _, _, t_np, t_dev, t_copy = rows[-1]
    ratio = t_np / t_dev
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"# {human(nbytes)}: numpy {t_np * 1e3:.2f} ms, device {t_dev * 1e3:.2f} ms, ratio {ratio:.2f}x "
          f"(target <= {TARGET_RATIO}x: {verdict}); the staging copies alone {t_copy * 1e3:.2f} ms, "
          f"{t_copy / t_dev:.2f}x the device path")
    print(f"# wrong elements (all ranks, last round of each size): {wrong}")


def main(argv: List[str]) -> int:
    args = arguments(argv)
    if os.environ.get("HCCLPY_LAUNCHER") != "hcclpy-run":
        return launch(argv, args)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
