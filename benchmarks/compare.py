#!/usr/bin/env python3
"""Side by side, in one run on one machine: hcclpy (device arrays), hcclpy (NumPy arrays), hcclpy
through torch.distributed, gloo (torch) and MPI (mpi4py), for all_reduce, all_gather,
reduce_scatter, broadcast and all_to_all, on 2 and 4 ranks, from 8 B to 64 MiB.

Every stack is timed the same way: the wall time of a blocking call (for device arrays: the call
and the stream synchronisation), in rounds of calls between barriers; the figure for a size is the
median over rounds, then the maximum over ranks (the slowest rank decides when a collective is
done). The stacks one set of processes runs take turns round by round, so that a drift of the
machine reaches them alike: hcclpy's device and NumPy paths, with MPI when mpi4py and mpiexec are
there (mpiexec then launches the hcclpy ranks, which run MPI's calls on the NumPy path's arrays);
torch over hcclpy and over gloo. On 4 ranks the 64 MiB all_reduce also takes turns with the same
call on a sub-communicator of ranks 0 and 1, and the target "4 ranks within 2x of 2" is judged on
that pair: 2 and 4 ranks timed in two launches can meet the VM's vCPUs in different arrangements
(``machine.py``).
Sizes and bus bandwidth follow nccl-tests (``hcclpy bench`` uses the same rules): the size is the
per-rank buffer for all_reduce and broadcast, the whole buffer for the others.

    python -m pip install mpi4py mpich matplotlib   # MPI (MPICH wheel) and the plot
    python benchmarks/compare.py                     # writes benchmarks/results/compare.{md,json,png}
    python benchmarks/compare.py --ranks 2 --ops all_reduce --max-bytes 8   # a part: results/partial/

Stacks that cannot run here (no torch, no mpi4py) are left out with a note. Nothing is asserted;
the targets of the project issue are printed with the measured ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import machine  # noqa: E402  (sibling modules)
from numpy_vs_device import byte_size, human  # noqa: E402

OPERATIONS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZES = [8 << (3 * i) for i in range(6)] + [1 << 20, 4 << 20, 16 << 20, 64 << 20]
FACTORS: Dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "all_to_all": lambda n: (n - 1) / n}
WHOLE = {"all_gather", "reduce_scatter", "all_to_all"}  # the size is every rank's blocks together
STACKS = ("hcclpy-device", "hcclpy-numpy", "torch-hcclpy", "gloo", "mpi")  # "pair": see _pair_against_world


# ----------------------------------------------------------------------------- timing


def _time(calls: List[Callable[[], Any]], barrier: Callable[[], None], most: Callable[[int], int], budget: float,
          rounds: int) -> List[float]:
    """Median seconds per call of each of ``calls`` (the stacks one process runs), over ``rounds``
    rounds in which each call takes a turn of about ``budget`` seconds: the stacks are timed side
    by side, so that the machine's drifts reach all of them alike. ``most`` returns the largest of
    the ranks' numbers: every rank must make the same number of calls."""
    counts = []
    for call in calls:
        call()
        call()
        started = time.perf_counter()
        call()
        single = max(time.perf_counter() - started, 1e-7)
        counts.append(most(max(3, min(5000, int(budget / single)))))
    return _rounds(calls, counts, barrier, rounds)


def _rounds(calls: List[Callable[[], Any]], counts: List[int], barrier: Callable[[], None], rounds: int) -> List[float]:
    """Median seconds per call of each of ``calls``, ``counts[i]`` calls a turn, over ``rounds``
    rounds of turns between barriers."""
    samples: List[List[float]] = [[] for _ in calls]
    for timed in [False] + [True] * rounds:  # one untimed round first: caches, pages, both ranks in step
        for call, count, mine in zip(calls, counts, samples):
            barrier()
            started = time.perf_counter()
            for _ in range(count):
                call()
            if timed:
                mine.append((time.perf_counter() - started) / count)
    return [statistics.median(mine) for mine in samples]


def _sizes(args: argparse.Namespace) -> List[int]:
    return [size for size in SIZES if size <= args.max_bytes]


def _counts(operation: str, nbytes: int, n: int, itemsize: int = 4) -> Tuple[int, int]:
    """(elements each rank sends, elements each rank receives) for a size in nccl-tests' terms."""
    block = (nbytes // n if operation in WHOLE else nbytes) // itemsize
    if operation == "all_gather":
        return block, block * n
    if operation == "reduce_scatter":
        return block * n, block
    if operation == "all_to_all":
        return block * n, block * n
    return block, block


# ------------------------------------------------------------------------ rank programs


def _mpi_call(world: Any, operation: str, send: Any, recv: Any) -> Callable[[], Any]:
    """One blocking MPI collective on NumPy arrays, in nccl-tests' terms for ``operation``."""
    return {
        "all_reduce": lambda: world.Allreduce(send, recv),
        "all_gather": lambda: world.Allgather(send, recv),
        "reduce_scatter": lambda: world.Reduce_scatter_block(send, recv),
        "broadcast": lambda: world.Bcast(send, 0),
        "all_to_all": lambda: world.Alltoall(send, recv)}[operation]


def _hcclpy_rank(args: argparse.Namespace) -> Dict[str, Any]:
    """hcclpy-device and hcclpy-numpy in the same processes, taking turns round by round; with
    ``--with-mpi`` (launched by mpiexec) MPI too, on the NumPy arrays of the NumPy path."""
    import numpy as np

    import hcclpy

    world = None
    if args.with_mpi:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
    comm = hcclpy.init(mpi_comm=world)  # None: the launcher's environment, as hcclpy run sets it
    n, stream = comm.size, comm.device.create_stream()
    barrier = lambda: comm.barrier(stream=stream) or stream.synchronize()  # noqa: E731
    most = lambda value: int(comm.all_reduce(np.array([value]), op="max")[0])  # noqa: E731
    out: Dict[str, Any] = {"hcclpy-device": {}, "hcclpy-numpy": {}}
    if world is not None:
        out["mpi"] = {}
    for operation in args.ops:
        for stack in out:
            out[stack][operation] = {}
        for nbytes in _sizes(args):
            send_count, recv_count = _counts(operation, nbytes, n)
            if send_count == 0:
                continue
            hs, hr = np.ones(send_count, np.float32), np.empty(recv_count, np.float32)
            ds, dr = hcclpy.from_numpy(hs, device=comm.device), hcclpy.empty(recv_count, "float32", device=comm.device)
            # The call and the synchronisation in one function, as the other stacks' one call.
            sync = stream.synchronize
            device_call = {
                "all_reduce": lambda: (comm.all_reduce(ds, dr, stream=stream), sync()),
                "all_gather": lambda: (comm.all_gather(ds, dr, stream=stream), sync()),
                "reduce_scatter": lambda: (comm.reduce_scatter(ds, dr, stream=stream), sync()),
                "broadcast": lambda: (comm.broadcast(ds, 0, stream=stream), sync()),
                "all_to_all": lambda: (comm.all_to_all(ds, dr, stream=stream), sync())}[operation]
            host_call = {
                "all_reduce": lambda: comm.all_reduce(hs, out=hr),
                "all_gather": lambda: comm.all_gather(hs, out=hr.reshape(n, -1)),
                "reduce_scatter": lambda: comm.reduce_scatter(hs, out=hr),
                "broadcast": lambda: comm.broadcast(hr, 0),
                "all_to_all": lambda: comm.all_to_all(hs, out=hr)}[operation]
            calls = [device_call, host_call] + ([_mpi_call(world, operation, hs, hr)] if world is not None else [])
            for stack, seconds in zip(out, _time(calls, barrier, most, args.budget, args.rounds)):
                out[stack][operation][nbytes] = seconds
            ds.close()
            dr.close()
    if n >= 4 and "all_reduce" in args.ops and PAIR_BYTES in _sizes(args):
        out["pair"] = _pair_against_world(comm, stream, barrier, args)
    stream.close()
    gathered = {stack: {op: {size: float(comm.all_reduce(np.array([t]), op="max")[0]) for size, t in sizes.items()}
                        for op, sizes in ops.items()} for stack, ops in out.items()}
    hcclpy.shutdown()
    return gathered


PAIR_BYTES = 64 << 20


def _pair_against_world(comm: Any, stream: Any, barrier: Callable[[], None], args: argparse.Namespace) -> Dict[str, Any]:
    """The 64 MiB all_reduce of device arrays on every rank and on a sub-communicator of ranks 0
    and 1, taking turns round by round in the same processes (ranks 2 and up wait at the barrier
    while the pair runs, asleep: with more ranks than cores nobody spins). A VM moves its vCPUs
    between separate cores and the hyperthreads of one core within minutes, so 2 and 4 ranks
    timed in two launches may not see the same machine; this pair does."""
    import numpy as np

    import hcclpy

    count = PAIR_BYTES // 4
    pair = comm.split([0, 1])
    ds, dr = hcclpy.zeros(count, "float32", device=comm.device), hcclpy.empty(count, "float32", device=comm.device)
    world_call = lambda: (comm.all_reduce(ds, dr, stream=stream), stream.synchronize())  # noqa: E731
    pair_call = (lambda: (pair.all_reduce(ds, dr, stream=stream), stream.synchronize())) if pair else (lambda: None)
    started = time.perf_counter()
    world_call()
    single = time.perf_counter() - started
    turn = int(comm.all_reduce(np.array([max(3, int(args.budget / single))]), op="max")[0])
    world_seconds, pair_seconds = _rounds([world_call, pair_call], [turn, turn], barrier, args.rounds)
    for array in (ds, dr):
        array.close()
    if pair is not None:
        pair.destroy()
    return {"all_reduce-world": {PAIR_BYTES: world_seconds}, "all_reduce-pair": {PAIR_BYTES: pair_seconds}}


def _torch_rank(args: argparse.Namespace) -> Dict[str, Any]:
    """torch.distributed over the hcclpy backend and over gloo, in the same processes."""
    import torch
    import torch.distributed as dist

    import hcclpy.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("hcclpy")
    gloo = dist.new_group(backend="gloo")
    n = dist.get_world_size()
    groups = {"torch-hcclpy": None, "gloo": gloo}
    barrier = lambda: dist.barrier(group=gloo)  # noqa: E731

    def most(value: int) -> int:
        agreed = torch.tensor([value])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=gloo)
        return int(agreed.item())

    def call_of(operation: str, send_count: int, recv_count: int, group: Any) -> Callable[[], Any]:
        t, o = torch.ones(send_count), torch.empty(recv_count)
        return {
            "all_reduce": lambda: dist.all_reduce(t, group=group),
            "all_gather": lambda: dist.all_gather_into_tensor(o, t, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(o, t, group=group),
            "broadcast": lambda: dist.broadcast(t, 0, group=group),
            "all_to_all": lambda: dist.all_to_all_single(o, t, group=group)}[operation]
    out: Dict[str, Any] = {stack: {} for stack in groups}
    for operation in args.ops:
        for stack in groups:
            out[stack][operation] = {}
        for nbytes in _sizes(args):
            send_count, recv_count = _counts(operation, nbytes, n)
            if send_count == 0:
                continue
            calls = [call_of(operation, send_count, recv_count, group) for group in groups.values()]
            times = _time(calls, barrier, most, args.budget, args.rounds)
            for stack, seconds in zip(groups, times):
                out[stack][operation][nbytes] = seconds
    for stack in out:
        for operation in out[stack]:
            for nbytes, seconds in out[stack][operation].items():
                worst = torch.tensor([seconds], dtype=torch.float64)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=gloo)
                out[stack][operation][nbytes] = worst.item()
    dist.destroy_process_group()
    return out


def _mpi_rank(args: argparse.Namespace) -> Dict[str, Any]:
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    n = world.size
    out: Dict[str, Any] = {"mpi": {}}
    for operation in args.ops:
        out["mpi"][operation] = {}
        for nbytes in _sizes(args):
            send_count, recv_count = _counts(operation, nbytes, n)
            if send_count == 0:
                continue
            call = _mpi_call(world, operation, np.ones(send_count, np.float32), np.empty(recv_count, np.float32))
            seconds, = _time([call], world.Barrier, lambda value: world.allreduce(value, op=MPI.MAX), args.budget,
                             args.rounds)
            out["mpi"][operation][nbytes] = world.allreduce(seconds, op=MPI.MAX)
    return out


RANK_PROGRAMS = {"hcclpy": _hcclpy_rank, "torch": _torch_rank, "mpi": _mpi_rank}


def rank_main(args: argparse.Namespace) -> None:
    import warnings

    warnings.simplefilter("ignore")  # the simulator fallback notice, once per rank
    result = RANK_PROGRAMS[args.rank_program](args)
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
    if rank == 0:
        Path(args.result).write_text(json.dumps(result))


# --------------------------------------------------------------------------------- driver


def _launch(program: str, ranks: int, args: argparse.Namespace, result: Path,
            with_mpi: bool = False) -> Tuple[bool, str]:
    passed = ["--rank-program", program, "--result", str(result), "--budget", str(args.budget), "--rounds",
              str(args.rounds), "--max-bytes", str(args.max_bytes), "--ops", *args.ops]
    if with_mpi:
        passed.append("--with-mpi")
    script = str(Path(__file__).resolve())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    if program == "mpi" or with_mpi:
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            return False, "no mpiexec on PATH (pip install mpi4py mpich)"
        command = [mpiexec, "-n", str(ranks), sys.executable, script, *passed]
        for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(variable, None)
    else:
        command = [sys.executable, "-m", "hcclpy", "run", "-n", str(ranks), "--no-prefix", "--timeout",
                   str(args.timeout), script, *passed]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout + 60)
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).strip().splitlines()[-1] if (done.stderr or done.stdout) else \
            f"exit status {done.returncode}"
    return True, ""


def _available(program: str) -> Optional[str]:
    """None when the program's stack can run here, else why not."""
    import importlib.util

    needs = {"torch": "torch", "mpi": "mpi4py"}.get(program)
    if needs and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed"
    return None


def busbw(operation: str, nbytes: int, seconds: float, n: int) -> float:
    return nbytes / seconds / 1e9 * FACTORS[operation](n)


def tables(data: Dict[str, Any], memcpy: float, probes: List[machine.Copying], notes: List[str]) -> str:
    lines = ["# hcclpy vs gloo vs MPI, one run", "",
             f"Single-core memcpy in the same run: {memcpy:.2f} GB/s. Time: µs per blocking call (max over "
             "ranks of the median over rounds); busbw: GB/s, nccl-tests factors.", "",
             *(f"- {when}: {probe.describe()}" for when, probe in zip(("before", "after"), probes)), ""]
    lines += [f"- {note}" for note in notes] + ([""] if notes else [])
    for ranks_key in sorted(data, key=int):
        n = int(ranks_key)
        for operation in OPERATIONS:
            stacks = [s for s in STACKS if operation in data[ranks_key].get(s, {})]
            if not stacks:
                continue
            lines += [f"## {operation}, {n} ranks", "",
                      "| size | " + " | ".join(f"{s} µs" for s in stacks) + " | " +
                      " | ".join(f"{s} busbw" for s in stacks) + " |",
                      "|---:|" + "---:|" * (2 * len(stacks))]
            for nbytes in SIZES:
                cells = [data[ranks_key][s][operation].get(str(nbytes)) for s in stacks]
                if all(c is None for c in cells):
                    continue
                times = [f"{c * 1e6:.1f}" if c else "" for c in cells]
                bws = [f"{busbw(operation, nbytes, c, n):.3f}" if c else "" for c in cells]
                lines.append(f"| {human(nbytes)} | " + " | ".join(times) + " | " + " | ".join(bws) + " |")
            lines.append("")
    return "\n".join(lines)


def targets(data: Dict[str, Any], memcpy: float) -> List[str]:
    """The project issue's targets, with the measured ratios."""
    out = []

    def get(ranks: int, stack: str, size: int, operation: str = "all_reduce") -> Optional[float]:
        return data.get(str(ranks), {}).get(stack, {}).get(operation, {}).get(str(size))

    for size in (1 << 20, 64 << 20):
        ours = get(2, "hcclpy-device", size)
        rivals = [t for t in (get(2, "gloo", size), get(2, "mpi", size)) if t]
        if ours and rivals:
            ratio = busbw("all_reduce", size, ours, 2) / max(busbw("all_reduce", size, t, 2) for t in rivals)
            out.append(f"all_reduce busbw, 2 ranks, {human(size)}: {ratio:.2f}x the better of gloo and MPI "
                       f"(target >= 2x: {'met' if ratio >= 2 else 'NOT met'})")
    ours = get(2, "hcclpy-device", 64 << 20)
    if ours:
        share = busbw("all_reduce", 64 << 20, ours, 2) / memcpy
        out.append(f"all_reduce busbw, 2 ranks, 64 MiB: {share:.0%} of the single-core memcpy "
                   f"(target >= 60%: {'met' if share >= 0.6 else 'NOT met'})")
    ours, mpi = get(2, "hcclpy-device", 8), get(2, "mpi", 8)
    if ours and mpi:
        out.append(f"8-byte all_reduce, call + stream sync: {ours * 1e6:.2f} us vs MPI {mpi * 1e6:.2f} us "
                   f"(target <= MPI: {'met' if ours <= mpi else 'NOT met'})")

    def ratio(two: Optional[float], four: Optional[float]) -> Optional[float]:
        return busbw("all_reduce", PAIR_BYTES, two, 2) / busbw("all_reduce", PAIR_BYTES, four, 4) if two and four \
            else None

    side_by_side = ratio(get(4, "pair", PAIR_BYTES, "all_reduce-pair"), get(4, "pair", PAIR_BYTES, "all_reduce-world"))
    launches = ratio(get(2, "hcclpy-device", PAIR_BYTES), get(4, "hcclpy-device", PAIR_BYTES))
    judged = side_by_side if side_by_side is not None else launches
    if judged is not None:
        how = "side by side in the 4-rank processes" if side_by_side is not None else "in two launches"
        also = f"; in two launches {launches:.2f}" if side_by_side is not None and launches is not None else ""
        out.append(f"all_reduce busbw at 64 MiB, 2 ranks / 4 ranks, {how}: {judged:.2f}{also} (target <= 2: "
                   f"{'met' if judged <= 2 else 'NOT met'})")
    return out


def plot(data: Dict[str, Any], path: Path) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        return "no plot: matplotlib is not installed"
    rank_counts = sorted(data, key=int)
    figure, grid = plt.subplots(len(rank_counts), len(OPERATIONS), figsize=(4 * len(OPERATIONS),
                                3.2 * len(rank_counts)), squeeze=False)
    for row, ranks_key in enumerate(rank_counts):
        for column, operation in enumerate(OPERATIONS):
            axes = grid[row][column]
            for stack in STACKS:
                points = data[ranks_key].get(stack, {}).get(operation, {})
                if points:
                    xs = sorted(int(s) for s in points)
                    axes.plot(xs, [busbw(operation, x, points[str(x)], int(ranks_key)) for x in xs], marker=".",
                              label=stack)
            axes.set_xscale("log", base=2)
            axes.xaxis.set_major_locator(LogLocator(base=16))  # 16 B, 256 B, 4 KiB, ...
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: human(int(value))))
            axes.tick_params(axis="x", labelsize=7)
            axes.set_yscale("log")
            axes.set_title(f"{operation}, {ranks_key} ranks", fontsize=9)
            axes.grid(True, which="both", alpha=0.3)
            if row == len(rank_counts) - 1:
                axes.set_xlabel("size (bytes)")
            if column == 0:
                axes.set_ylabel("busbw (GB/s)")
    grid[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None


def driver(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = machine.copying()
    memcpy = before.alone_gbs
    data: Dict[str, Any] = {}
    notes: List[str] = []
    # MPI is timed in the hcclpy ranks, round by round with hcclpy's stacks, when it can run: two
    # launches can land in different phases of a machine whose speed drifts.
    paired = {"hcclpy", "mpi"} <= set(args.programs) and _available("mpi") is None and shutil.which("mpiexec")
    with tempfile.TemporaryDirectory() as scratch:
        for ranks in args.ranks:
            data[str(ranks)] = {}
            mpi_timed = False
            for program in sorted(args.programs, key=lambda name: name != "hcclpy"):  # hcclpy first
                why = _available(program)
                if why:
                    notes.append(f"{program} left out: {why}")
                    continue
                if program == "mpi" and mpi_timed:
                    continue
                with_mpi = bool(paired) and program == "hcclpy"
                result = Path(scratch) / f"{program}-{ranks}.json"
                print(f"# {ranks} ranks: {program}{' and mpi' if with_mpi else ''} ...", file=sys.stderr, flush=True)
                ok, why = _launch(program, ranks, args, result, with_mpi=with_mpi)
                if not ok and with_mpi:  # MPI's start may be what failed: hcclpy alone, then MPI apart
                    notes.append(f"hcclpy with mpi on {ranks} ranks failed, so they ran apart: {why}")
                    with_mpi = False
                    ok, why = _launch(program, ranks, args, result)
                if not ok:
                    notes.append(f"{program} on {ranks} ranks failed: {why}")
                    continue
                mpi_timed = with_mpi
                data[str(ranks)].update(json.loads(result.read_text()))
    probes = [before, machine.copying()]
    notes = sorted(set(notes))
    report = tables(data, memcpy, probes, notes)
    goals = targets(data, memcpy)
    report += "\n## Targets\n\n" + "\n".join(f"- {goal}" for goal in goals) + "\n"
    (out_dir / "compare.md").write_text(report)
    (out_dir / "compare.json").write_text(json.dumps({"memcpy_gbs": memcpy, "vcpus": [probe.as_dict() for probe in probes],
                                                     "seconds": data}, indent=1))
    failure = plot(data, out_dir / "compare.png")
    print(report)
    if failure:
        print(f"# {failure}")
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    parser.add_argument("--ops", nargs="+", choices=OPERATIONS, default=list(OPERATIONS), help="operations")
    parser.add_argument("--programs", nargs="+", choices=sorted(RANK_PROGRAMS), default=sorted(RANK_PROGRAMS),
                        help="which rank programs to run: hcclpy (device and NumPy), torch (torch-hcclpy and gloo), "
                        "mpi (default: all)")
    parser.add_argument("--max-bytes", type=byte_size, default=SIZES[-1],
                        help="largest size in bytes, K, M or G suffix allowed (default 64M)")
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per timed round (default 0.1)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size (median; default 3)")
    parser.add_argument("--out", help="directory for compare.md/.json/.png (default: benchmarks/results for a "
                        "full run, benchmarks/results/partial when --ranks, --ops, --programs or --max-bytes "
                        "narrow it, so that a partial run leaves the full results in place)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds each stack may take")
    parser.add_argument("--rank-program", choices=sorted(RANK_PROGRAMS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--with-mpi", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.out is None:
        narrowing = ("ranks", "ops", "programs", "max_bytes")
        full = all(getattr(args, name) == parser.get_default(name) for name in narrowing)
        args.out = str(HERE / "results" if full else HERE / "results" / "partial")
    if args.rank_program:
        rank_main(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
