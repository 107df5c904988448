#!/usr/bin/env python3
"""all_reduce across simulated servers (hcclpy over TCP) next to torch.distributed's gloo (TCP too).

Two simulated servers of two ranks each on this machine (issue 32): the script starts two
``hcclpy run --nnodes 2 --node-rank K --master-port P -n 2`` launchers, as two nodes of a job
would be started, so ranks 0-1 are on server ``node0`` and ranks 2-3 on ``node1`` (the simulator
reads the node from ``GROUP_RANK``). Ranks of one server share memory; ranks of different servers
talk only over TCP on the loopback. Every rank initialises ``torch.distributed`` with gloo (its
TCP transport, same loopback, same 4 ranks) and hcclpy's world communicator (``hcclpy.init()``),
then for 8 B and every size from 1 MiB to 64 MiB (float32, sum, x2 steps) times both, interleaved
round by round:

* ``hcclpy``: ``comm.all_reduce(dev_a, dev_b, stream=s); s.synchronize()`` on device arrays: all_reduce
  inside each server, each rank's 1/m slice reduced with the same-index ranks of the other servers
  over TCP, all_gather inside each server;
* ``gloo``: ``dist.all_reduce(t)`` on a CPU tensor (blocking).

Each round is a loop of ``calls`` between two gloo barriers, timed with ``time.perf_counter``; the
per-call time of a size is the median over ``--rounds`` rounds, then the maximum over ranks. Bus
bandwidth is ``2 (n - 1) / n * bytes / time`` (nccl-tests' all_reduce convention, n = all ranks).
The targets (issue 32): hcclpy's busbw at least 1.5x gloo's at 64 MiB, and its 8-byte latency
within 2x of gloo's. Nothing is asserted: this is a benchmark, not a test. Before and after the
sweep the script prints whether the two vCPUs ran as two cores or as hyperthreads of one
(``machine.py``).

    python benchmarks/servers_vs_gloo.py                  # 2 servers x 2 ranks, 8 B and 1 .. 64 MiB, 5 rounds
    python benchmarks/servers_vs_gloo.py --rounds 9 --markdown
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from hcclpy._units import format_bytes as human  # noqa: E402  (8 B, 4 KiB, 64 MiB)
from hcclpy.cli.run import free_port, next_port  # noqa: E402  (the launcher's own port rules)
from numpy_vs_device import checkout_env, run_probed, sweep_parser  # noqa: E402  (sibling scripts)
from torch_vs_gloo import busbw, print_table  # noqa: E402

LATENCY_BYTES = 8
SIZES = [LATENCY_BYTES] + [(1 << 20) << i for i in range(7)]  # 8 B, then 1, 2, 4, ... 64 MiB
BANDWIDTH_BYTES = 64 << 20
BANDWIDTH_TARGET = 1.5   # hcclpy busbw / gloo busbw at 64 MiB, at least
LATENCY_TARGET = 2.0     # hcclpy / gloo time at 8 B, at most


def arguments(argv: List[str]) -> argparse.Namespace:
    parser = sweep_parser(__doc__.split("\n\n")[0], rounds=5, budget="256M", compared="stack",
                          ranks="ranks (processes) per server")
    parser.add_argument("--servers", type=int, default=2, help="simulated servers (one launcher each), default 2")
    return parser.parse_args(argv)


def job_port() -> int:
    """A ``--master-port`` P for the launchers such that P (torch's store) and the port next to it
    (where ``hcclpy run`` of several nodes puts hcclpy's rendezvous) are both free now."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", next_port(port)))
            except OSError:
                continue
        return port
    raise RuntimeError("no two neighbouring free ports on 127.0.0.1")


def launch(argv: List[str], args: argparse.Namespace) -> int:
    """Start one ``hcclpy run`` per server, as on the nodes of a cluster (rank 0 prints the table)."""
    port = job_port()
    env = checkout_env()
    env.setdefault("HCCLPY_RENDEZVOUS_TOKEN", secrets.token_hex(16))  # one job: every node presents it
    env.pop("HCCLPY_SIM_SERVER", None)  # each launcher's node names its server
    return run_probed([[sys.executable, "-m", "hcclpy", "run", "-n", str(args.ranks), "--nnodes", str(args.servers),
                        "--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port", str(port),
                        "--no-prefix", "--timeout", str(args.timeout), str(Path(__file__).resolve()), *argv]
                       for k in range(args.servers)], env)


def rank_main(args: argparse.Namespace) -> None:
    import warnings

    import numpy as np
    import torch
    import torch.distributed as dist

    import hcclpy

    warnings.simplefilter("ignore")  # the simulator fallback notice, once per rank
    dist.init_process_group("gloo")  # env:// on MASTER_PORT; hcclpy's rendezvous is on the port after it
    comm = hcclpy.init()
    rank, size = comm.rank, comm.size
    assert dist.get_rank() == rank and dist.get_world_size() == size
    stream = comm.device.create_stream()
    sizes = [n for n in SIZES if args.min_bytes <= n <= args.max_bytes]
    rows: List[Tuple[int, int, float, float]] = []
    wrong = 0
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        calls = max(3, min(2000, args.budget // nbytes))
        dev_a = hcclpy.from_numpy(np.ones(count, dtype=np.float32), device=comm.device)
        dev_b = hcclpy.zeros(count, "float32", device=comm.device)
        tensor = torch.ones(count)

        def ours() -> None:
            comm.all_reduce(dev_a, dev_b, stream=stream)
            stream.synchronize()

        loops = {"hcclpy": ours, "gloo": lambda: dist.all_reduce(tensor)}
        for call in loops.values():  # warm-up: connections, staging memory, socket buffers, caches
            for _ in range(max(2, calls // 10)):
                call()
        times: dict = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, call in loops.items():
                tensor.fill_(1.0)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                times[name].append((time.perf_counter() - start) / calls)
        # hcclpy: ones summed out of place, so `size` everywhere. gloo: `calls` in-place sums of ones,
        # size ** calls, checked while float32 holds it exactly.
        wrong += int(np.count_nonzero(dev_b.to_numpy() != size))
        expected = size ** calls
        if expected < 2 ** 127 and int(np.float32(expected)) == expected:
            wrong += int((tensor != float(expected)).sum())
        mine = torch.tensor([statistics.median(times["hcclpy"]), statistics.median(times["gloo"])],
                            dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        rows.append((nbytes, calls, mine[0].item(), mine[1].item()))
        dev_a.close()
        dev_b.close()
    counted = torch.tensor([wrong])
    dist.all_reduce(counted)
    if rank == 0:
        report(rows, int(counted.item()), size, args)
    stream.close()
    hcclpy.shutdown()
    dist.destroy_process_group()


def report(rows: list, wrong: int, size: int, args: argparse.Namespace) -> None:
    import hcclpy

    print(f"# all_reduce float32 sum, {args.servers} simulated servers x {args.ranks} ranks (processes) on this "
          f"machine; hcclpy runs on: {hcclpy.backend()}; gloo: torch {__import__('torch').__version__}, same {size} "
          "ranks, TCP over loopback")
    print(f"# per-call time (call + stream sync for hcclpy, blocking call for gloo): median of {args.rounds} rounds, "
          "max over ranks; busbw in GB/s; ratio = hcclpy busbw / gloo busbw")
    print_table(rows, size, args.markdown)
    smallest, largest = rows[0], rows[-1]
    if smallest[0] == LATENCY_BYTES:
        latency = smallest[2] / smallest[3]
        print(f"# {human(smallest[0])} latency: hcclpy {smallest[2] * 1e6:.1f} us, gloo {smallest[3] * 1e6:.1f} us: "
              f"{latency:.2f} x gloo (target <= {LATENCY_TARGET}: {'met' if latency <= LATENCY_TARGET else 'NOT met'})")
    if largest[0] > LATENCY_BYTES:
        ratio = largest[3] / largest[2]
        verdict = ("met" if ratio >= BANDWIDTH_TARGET else "NOT met") if largest[0] == BANDWIDTH_BYTES else \
            f"judged at {human(BANDWIDTH_BYTES)}"
        print(f"# {human(largest[0])} busbw: hcclpy {busbw(largest[0], largest[2], size):.3f} GB/s, gloo "
              f"{busbw(largest[0], largest[3], size):.3f} GB/s: {ratio:.2f} x gloo (target >= {BANDWIDTH_TARGET}: "
              f"{verdict})")
    print(f"# wrong elements (all ranks; gloo's while float32 holds the sum exactly): {wrong}")


def main(argv: List[str]) -> int:
    args = arguments(argv)
    if os.environ.get("HCCLPY_LAUNCHER") != "hcclpy-run":
        return launch(argv, args)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
