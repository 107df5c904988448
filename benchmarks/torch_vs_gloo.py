#!/usr/bin/env python3
"""``dist.all_reduce`` of CPU tensors through the "hcclpy" backend next to the "gloo" backend.

Two ranks, one process each, started through ``hcclpy run`` (torchrun-style environment; the script
relaunches itself when it is not already a rank). Each rank initialises the default group with
the hcclpy backend and a gloo group of the same ranks, then for every size from 8 B to 64 MiB
(float32, sum; 8 B, 64 B, ... 256 KiB, then 1, 4, 16, 64 MiB) times both, interleaved round by round:

* ``hcclpy``: ``dist.all_reduce(t)`` on the default group: the tensor is staged through device
  memory (the simulator's, when no CANN is installed);
* ``gloo``: ``dist.all_reduce(t, group=gloo)``: gloo's TCP loopback transport.

Each round is a loop of ``calls`` between two barriers, timed with ``time.perf_counter``; the
per-call time of a size is the median over ``--rounds`` rounds, then the maximum over ranks. Bus
bandwidth is ``2 (n - 1) / n * bytes / time`` (nccl-tests' convention). The targets: hcclpy's busbw
at least 2x gloo's from 1 MiB up, and its 8-byte latency at most a quarter of gloo's. Nothing is
asserted: this is a benchmark, not a test.

    python benchmarks/torch_vs_gloo.py                 # 2 ranks, 8 B .. 64 MiB, 5 rounds
    python benchmarks/torch_vs_gloo.py --rounds 9 --markdown
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from numpy_vs_device import human, launch, sweep_arguments  # noqa: E402  (a sibling script)

SIZES = [8 << (3 * i) for i in range(6)] + [1 << 20, 4 << 20, 16 << 20, 64 << 20]
BANDWIDTH_FROM = 1 << 20     # busbw target applies from this size up
BANDWIDTH_TARGET = 2.0       # hcclpy busbw / gloo busbw, at least
LATENCY_TARGET = 0.25        # hcclpy / gloo time at the smallest size, at most


def arguments(argv: List[str]) -> argparse.Namespace:
    return sweep_arguments(argv, __doc__.split("\n\n")[0], rounds=5, budget="256M", compared="backend")


def rank_main(args: argparse.Namespace) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    import hcclpy
    import hcclpy.torch  # noqa: F401  (registers the backend)

    warnings.simplefilter("ignore")  # the simulator fallback notice, once per rank
    dist.init_process_group("hcclpy")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"hcclpy": None, "gloo": gloo}
    sizes = [n for n in SIZES if args.min_bytes <= n <= args.max_bytes]
    rows: List[Tuple[int, int, float, float]] = []
    wrong = 0
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        calls = max(3, min(2000, args.budget // nbytes))
        tensors = {name: torch.ones(count) for name in groups}
        for name, group in groups.items():  # warm-up: staging buffers, connections, caches
            for _ in range(max(2, calls // 10)):
                dist.all_reduce(tensors[name], group=group)
        times = {name: [] for name in groups}
        for _ in range(args.rounds):
            for name, group in groups.items():
                tensor = tensors[name].fill_(1.0)
                dist.barrier(group=gloo)
                start = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(tensor, group=group)
                times[name].append((time.perf_counter() - start) / calls)
                # The value after `calls` in-place sums of ones: size ** calls (exact while small).
                if calls < 20:
                    wrong += int((tensor != float(size) ** calls).sum())
        mine = torch.tensor([statistics.median(times["hcclpy"]), statistics.median(times["gloo"])],
                            dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=gloo)
        rows.append((nbytes, calls, mine[0].item(), mine[1].item()))
    counted = torch.tensor([wrong])
    dist.all_reduce(counted, group=gloo)
    if rank == 0:
        report(rows, int(counted.item()), size, args, hcclpy.backend())
    dist.destroy_process_group()


def busbw(nbytes: int, seconds: float, size: int) -> float:
    return 2 * (size - 1) / size * nbytes / seconds / 1e9


def print_table(rows: list, size: int, markdown: bool) -> None:
    """One line per size: ``(bytes, calls, hcclpy seconds, gloo seconds)`` rows as times, bus
    bandwidths and their ratio (also ``servers_vs_gloo.py``'s table)."""
    header = ["size", "calls", "hcclpy (us)", "gloo (us)", "hcclpy busbw", "gloo busbw", "busbw ratio"]
    lines = []
    for nbytes, calls, ours, theirs in rows:
        lines.append([human(nbytes), str(calls), f"{ours * 1e6:.1f}", f"{theirs * 1e6:.1f}",
                      f"{busbw(nbytes, ours, size):.3f}", f"{busbw(nbytes, theirs, size):.3f}",
                      f"{theirs / ours:.2f}"])
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---:|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        print("  ".join(f"{h:>12}" for h in header))
        for line in lines:
            print("  ".join(f"{cell:>12}" for cell in line))


def report(rows: list, wrong: int, size: int, args: argparse.Namespace, backend: str) -> None:
    print(f"# dist.all_reduce float32 sum, CPU tensors, {size} ranks (processes); hcclpy runs on: {backend}")
    print(f"# per-call time: median of {args.rounds} rounds, max over ranks; busbw in GB/s")
    print_table(rows, size, args.markdown)
    smallest = rows[0]
    latency = smallest[2] / smallest[3]
    print(f"# {human(smallest[0])} latency: hcclpy {smallest[2] * 1e6:.1f} us = {latency:.3f} x gloo "
          f"(target <= {LATENCY_TARGET}: {'met' if latency <= LATENCY_TARGET else 'NOT met'})")
    ratios = [theirs / ours for nbytes, _, ours, theirs in rows if nbytes >= BANDWIDTH_FROM]
    if ratios:
        worst = min(ratios)
        print(f"# busbw from {human(BANDWIDTH_FROM)} up: at least {worst:.2f} x gloo "
              f"(target >= {BANDWIDTH_TARGET}: {'met' if worst >= BANDWIDTH_TARGET else 'NOT met'})")
    print(f"# wrong elements (all ranks, rounds of fewer than 20 calls): {wrong}")


def main(argv: List[str]) -> int:
    args = arguments(argv)
    if os.environ.get("HCCLPY_LAUNCHER") != "hcclpy-run":
        return launch(argv, args, Path(__file__))
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
