"""Ranks of a benchmark as spawned processes, with a deadline, and their options: what
``torch_dispatch.py`` and ``graph_replay.py`` start their ranks with."""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


def run_spawned(target: Callable[..., None], ranks: int, args: Sequence[Any], timeout: float,
                context: Any = None) -> Dict[int, Dict[str, Any]]:
    """Run ``target(rank, *args, results)`` in ``ranks`` spawned processes and return what each
    rank put on ``results``: ``(rank, outcome)``, ``outcome`` a dict, ``{"error": text}`` when
    the rank failed. ``context``: the spawn context ``args``' queues come from (default: a new one).

    Raises
    ------
    RuntimeError
        When a rank reports an error or exits without reporting, or the ranks do not finish
        within ``timeout`` seconds (those still running are then terminated).
    """
    context = context or multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(r, *args, results), daemon=True) for r in range(ranks)]
    for process in processes:
        process.start()
    found: Dict[int, Dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < ranks:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the ranks did not finish within {timeout:g} s")
            try:
                rank, outcome = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(processes) if p.exitcode not in (None, 0) and r not in found]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} exited with codes {[processes[r].exitcode for r in dead]}")
                continue
            if "error" in outcome:
                raise RuntimeError(f"rank {rank} failed: {outcome['error']}")
            found[rank] = outcome
    finally:
        for process in processes:
            process.join(10.0)
            if process.is_alive():
                process.terminate()
    return found


def rank_arguments(argv: Optional[List[str]], description: str, *, calls: int, calls_help: str, rounds: int,
                   rounds_help: str) -> argparse.Namespace:
    """The options of a benchmark of spawned ranks: ``--ranks`` (2 or more), ``--calls`` and
    ``--rounds`` (1 or more; defaults and help given), ``--timeout`` (300 s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", "--ranks", type=int, default=2, help="ranks (processes), default 2")
    parser.add_argument("--calls", type=int, default=calls, help=f"{calls_help}, default {calls}")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"{rounds_help} (median), default {rounds}")
    parser.add_argument("--timeout", type=float, default=300.0, help="stop the ranks after this many seconds")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.calls < 1 or args.rounds < 1:
        parser.error(f"--ranks must be 2 or more, --calls and --rounds 1 or more; got {args.ranks}, {args.calls}, "
                     f"{args.rounds}")
    return args
