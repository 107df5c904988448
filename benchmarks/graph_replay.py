#!/usr/bin/env python3
"""Replaying a graph of captured all_reduces, next to the same all_reduces called from Python and
started as a persistent operation: the host time it takes to queue them.

Two ranks (spawned processes; rank 0 makes the root info and hands it to the others) each build a
communicator and one float64 element (8 bytes) on their device, and queue a batch of ``--calls``
(100) in-place sum all_reduces on one stream, three ways, in the same run:

* ``python``: ``comm.all_reduce(x, stream=s)``, ``calls`` times;
* ``persistent``: ``op = comm.all_reduce_init(x, stream=s)`` made once, ``op.start()`` ``calls``
  times;
* ``replay``: ``with s.capture() as graph:`` around ``calls`` calls of ``comm.all_reduce(x,
  stream=s)``, made once; ``graph.replay()`` once (``aclmdlRIExecuteAsync``);

and, to tell the Python from the C below it, the C calls alone through the cffi functions hcclpy
itself calls (pointers cast once): ``calls`` times ``HcclAllReduce``, and one
``aclmdlRIExecuteAsync`` of the same graph.

Each batch is timed with ``time.perf_counter`` from before its first call until the last one
returns (``queue``: the host time the issue's target is about), then the stream is synchronised
(``queue + run``: until the batch's collectives are done on both ranks). The ways take turns, batch
by batch, the order rotated every round, after one untimed batch of each; a rank's time per way is
the median over ``--rounds`` rounds (the minimum too, for the differences between ways, which a
busy machine blurs in the medians), and the table gives the largest over ranks. x holds zeros
while timed; afterwards every way runs one more batch on x = rank + 1, which must give
(1 + ... + n) * n**(calls - 1) on every rank (3 * 2**99 for 2 ranks), and the report says whether
it did.

Target (issue 31): the replay's queue time at least 20 times lower than the Python calls'. On the
simulator ``aclmdlRIExecuteAsync`` makes a fresh copy of every recorded task (numbering the
collectives) and queues them as one task of the stream, as CANN's aclgraph launches the recorded
model as a whole; its cost still grows with the operations captured, ~50 ns each. Nothing is
asserted: this is a benchmark, not a test. Before and after, the script prints whether the two
vCPUs ran as two cores or as hyperthreads of one (``machine.py``).

    python benchmarks/graph_replay.py
    python benchmarks/graph_replay.py --calls 100 --rounds 51
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import machine  # noqa: E402  (a sibling module)
from spawned import rank_arguments, run_spawned  # noqa: E402  (a sibling module)

TARGET_RATIO = 20.0  # python / replay queue time (issue 31)
WAYS = ("python", "persistent", "replay", "raw_calls", "raw_replay")
LABELS = {"python": "comm.all_reduce(x, stream=s) x{calls}", "persistent": "PersistentOp.start() x{calls}",
          "replay": "graph.replay() ({calls} captured)", "raw_calls": "  raw cffi HcclAllReduce x{calls}",
          "raw_replay": "  raw cffi aclmdlRIExecuteAsync"}


def _batches(comm: Any, stream: Any, x: Any, calls: int) -> Tuple[Dict[str, Callable[[], None]], Tuple[Any, ...]]:
    """The three ways to queue ``calls`` all_reduces of ``x`` on ``stream``, as functions, and what
    to close after them (the persistent operation and the graph)."""
    persistent = comm.all_reduce_init(x, op="sum", stream=stream)
    with stream.capture() as graph:
        for _ in range(calls):
            comm.all_reduce(x, op="sum", stream=stream)

    def python() -> None:
        for _ in range(calls):
            comm.all_reduce(x, op="sum", stream=stream)

    def started() -> None:
        start = persistent.start
        for _ in range(calls):
            start()

    # The C calls alone, through the cffi functions hcclpy calls, pointers cast once: the floor
    # under the Python calls and under the replay (the simulator's own cost, or CANN's).
    from hcclpy import _ffi

    api = _ffi.api()
    all_reduce, execute = api.HcclAllReduce, api.aclmdlRIExecuteAsync
    xp, handle, st, model = (_ffi.cast("void *", x.ptr), _ffi.cast("HcclComm", comm.handle),
                             _ffi.cast("aclrtStream", stream.handle), graph._model[0])
    fp64 = int(x.dtype)

    def raw_calls() -> None:
        for _ in range(calls):
            if all_reduce(xp, xp, 1, fp64, 0, handle, st):
                raise RuntimeError("HcclAllReduce failed")

    def raw_replay() -> None:
        if execute(model, st):
            raise RuntimeError("aclmdlRIExecuteAsync failed")

    return ({"python": python, "persistent": started, "replay": graph.replay, "raw_calls": raw_calls,
             "raw_replay": raw_replay}, (persistent, graph))


def _rank(rank: int, size: int, calls: int, rounds: int, roots: Any, results: Any) -> None:
    """One rank: time the three ways, check them, send back this rank's medians (seconds)."""
    import warnings

    warnings.simplefilter("ignore")  # the simulator fallback notice
    import numpy as np

    import hcclpy

    try:
        if rank == 0:
            info = hcclpy.RootInfo.generate(device=0).to_bytes()
            for _ in range(size - 1):
                roots.put(info)
        else:
            info = roots.get(timeout=120)
        with hcclpy.Communicator(size, info, rank, device=rank) as comm:
            stream = comm.device.create_stream()
            x = hcclpy.zeros(1, "float64", device=comm.device)  # 8 bytes
            batches, made = _batches(comm, stream, x, calls)
            for way in WAYS:  # warm-up: caches, the stream's first long queue
                batches[way]()
                stream.synchronize(timeout=120)
            queued: Dict[str, List[float]] = {way: [] for way in WAYS}
            done: Dict[str, List[float]] = {way: [] for way in WAYS}
            for round_ in range(rounds):
                order = WAYS[round_ % len(WAYS):] + WAYS[:round_ % len(WAYS)]
                for way in order:
                    batch = batches[way]
                    start = time.perf_counter()
                    batch()
                    end = time.perf_counter()
                    stream.synchronize(timeout=120)
                    finished = time.perf_counter()
                    queued[way].append(end - start)
                    done[way].append(finished - start)
            expected = float(sum(range(1, size + 1))) * float(size) ** (calls - 1)
            right = {}
            for way in WAYS:
                x.copy_from(np.array([rank + 1.0]))
                batches[way]()
                stream.synchronize(timeout=120)  # the raw ways hold nothing a read would wait for
                right[way] = bool(x.to_numpy()[0] == expected)
            for thing in made:
                thing.close()
            stream.close()
        results.put((rank, {"queue": {way: statistics.median(t) for way, t in queued.items()},
                            "queue_min": {way: min(t) for way, t in queued.items()},
                            "run": {way: statistics.median(t) for way, t in done.items()}, "right": right}))
    except BaseException as exc:  # reported by the parent, which would otherwise wait for nothing
        results.put((rank, {"error": f"{type(exc).__name__}: {exc}"}))
        raise


def measure(ranks: int = 2, calls: int = 100, rounds: int = 31, timeout: float = 300.0) -> Dict[str, Any]:
    """Time the three ways on ``ranks`` processes.

    Returns
    -------
    dict
        ``queue_us`` and ``run_us`` (per batch, by way: median over rounds, maximum over ranks),
        ``queue_min_us`` (the same with the minimum over rounds),
        ``ratios`` (``python/replay``, ``persistent/replay``, ``python/persistent`` of the queue
        times), ``target_met``, ``right`` (every way's checked batch gave the expected sum on
        every rank), and the parameters.

    Raises
    ------
    RuntimeError
        When a rank fails, or the ranks do not finish within ``timeout`` seconds.
    """
    context = multiprocessing.get_context("spawn")
    found = run_spawned(_rank, ranks, (ranks, calls, rounds, context.Queue()), timeout, context)
    queue_us = {way: max(o["queue"][way] for o in found.values()) * 1e6 for way in WAYS}
    queue_min_us = {way: max(o["queue_min"][way] for o in found.values()) * 1e6 for way in WAYS}
    run_us = {way: max(o["run"][way] for o in found.values()) * 1e6 for way in WAYS}
    ratios = {"python/replay": queue_us["python"] / queue_us["replay"],
              "persistent/replay": queue_us["persistent"] / queue_us["replay"],
              "python/persistent": queue_us["python"] / queue_us["persistent"]}
    return {"ranks": ranks, "calls": calls, "rounds": rounds, "queue_us": queue_us, "queue_min_us": queue_min_us,
            "run_us": run_us,
            "ratios": ratios, "target_ratio": TARGET_RATIO, "target_met": ratios["python/replay"] >= TARGET_RATIO,
            "right": all(all(o["right"].values()) for o in found.values())}


def report(result: Dict[str, Any]) -> str:
    calls = result["calls"]
    lines = [f"# {calls} all_reduces of 8 bytes (float64, sum, in place) per batch, {result['ranks']} ranks "
             f"(processes); median of {result['rounds']} batches, max over ranks",
             f"{'way':<38}{'queue (us)':>12}{'per call':>10}{'min (us)':>10}{'queue + run (us)':>18}"]
    for way in WAYS:
        label = LABELS[way].format(calls=calls)
        queued = result["queue_us"][way]
        lines.append(f"{label:<38}{queued:12.1f}{queued / calls:10.2f}{result['queue_min_us'][way]:10.1f}"
                     f"{result['run_us'][way]:18.1f}")
    ratios = result["ratios"]
    lines.insert(5, "of which the C calls alone (no Python around them):")
    lines.append("queue time ratios: " + ", ".join(f"{name} {value:.1f}x" for name, value in ratios.items()))
    fastest = result["queue_min_us"]
    lines.append(f"hcclpy's Python over the C calls (minima): {fastest['python'] - fastest['raw_calls']:.1f} us for "
                 f"the calls, {fastest['replay'] - fastest['raw_replay']:.1f} us for the replay")
    lines.append(f"# target (issue 31): replay's queue time >= {result['target_ratio']:g}x lower than the Python "
                 f"calls': {'met' if result['target_met'] else 'NOT met'} ({ratios['python/replay']:.1f}x)")
    lines.append("# results: every way's checked batch gave the expected sum on every rank" if result["right"]
                 else "# WRONG: a checked batch did not give the expected sum")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = rank_arguments(argv, __doc__.split("\n\n")[0], calls=100, calls_help="all_reduces per batch (and captured)",
                          rounds=31, rounds_help="timed batches per way")
    print(f"# before: {machine.copying().describe()}", flush=True)
    print(report(measure(args.ranks, args.calls, args.rounds, args.timeout)), flush=True)
    print(f"# after: {machine.copying().describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
