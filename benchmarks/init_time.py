#!/usr/bin/env python3
"""How long ``hcclpy.init()`` takes for 2, 4 and 8 ranks started by ``hcclpy run``.

For each rank count the script starts ``hcclpy run -n N`` on itself, ``--repeat`` times. Every
rank measures:

* ``import``: ``import numpy, hcclpy`` (before anything else of hcclpy runs);
* ``init``: from just before ``hcclpy.init()`` to just after it returned: launcher detection, the
  device, rank 0's root info, the TCP rendezvous and ``HcclCommInitRootInfo`` (all ranks joined);
* ``ready``: the wall-clock time (``time.time()``) right after ``init()`` returned.

``init()`` of a rank includes waiting for the slower ranks to arrive (ranks finish importing at
different times on a loaded machine), so ``init() max`` is mostly arrival skew; ``last arrival→ready``
(the last rank's return minus the last rank's call, both wall-clock) is the cost of ``init()`` once
every rank is there.

Rank 0 collects the maximum over ranks (an all-reduce with ``max`` after init, not timed) and prints
it; the parent adds ``launch→ready``, from just before it started the launcher to the last rank's
``ready``, and ``total``, until the launcher exited (teardown and exit included). The table gives
the median over the repetitions. Nothing is asserted: this is a benchmark, not a test.

    python benchmarks/init_time.py                      # 2, 4, 8 ranks, 5 repetitions each
    python benchmarks/init_time.py --ranks 2 4 --repeat 9 --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
MARK = "INIT_TIME "


def rank_main() -> None:
    start = time.perf_counter()
    import warnings

    import numpy as np

    import hcclpy

    warnings.simplefilter("ignore")  # the simulator fallback notice, once per rank
    imported = time.perf_counter() - start
    entered = time.time()
    before = time.perf_counter()
    comm = hcclpy.init()
    took = time.perf_counter() - before
    ready = time.time()
    slowest = comm.all_reduce(np.array([imported, took, ready, entered]), op="max")
    fastest = comm.all_reduce(np.array([took]), op="min")
    if comm.rank == 0:
        print(MARK + json.dumps({"ranks": comm.size, "import_max": slowest[0], "init_max": slowest[1],
                                 "init_min": fastest[0], "last_arrival": slowest[2] - slowest[3],
                                 "ready": slowest[2]}), flush=True)
    hcclpy.shutdown()


def launch(nranks: int, timeout: float) -> Dict[str, float]:
    """One ``hcclpy run -n nranks`` of this script; the measurements of that run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(nranks), "--no-prefix", "--timeout", str(timeout),
               str(Path(__file__).resolve())]
    started = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout + 30)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"hcclpy run -n {nranks} failed with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith(MARK))
    result = json.loads(line[len(MARK):])
    result["launch_to_ready"] = result.pop("ready") - started
    result["total"] = ended - started
    return result


def main(argv: List[str]) -> int:
    if os.environ.get("HCCLPY_LAUNCHER") == "hcclpy-run":
        rank_main()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="rank counts, default 2 4 8")
    parser.add_argument("--repeat", type=int, default=5, help="launches per rank count (median), default 5")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one launch may take")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)

    import hcclpy.sim

    hcclpy.sim.build()  # once, so no launch pays for a simulator build
    columns = ("import_max", "init_max", "init_min", "last_arrival", "launch_to_ready", "total")
    headers = ("import max", "init() max", "init() min", "last arr.→ready", "launch→ready", "total")
    print(f"# hcclpy.init() under 'hcclpy run', medians of {args.repeat} launches, milliseconds "
          f"(max/min over the ranks of one launch)")
    if args.markdown:
        print("| ranks | " + " | ".join(f"{h} (ms)" for h in headers) + " |")
        print("|---:|" + "---:|" * len(headers))
    else:
        print(f"{'ranks':>5} " + " ".join(f"{h:>15}" for h in headers))
    for nranks in args.ranks:
        runs = [launch(nranks, args.timeout) for _ in range(args.repeat)]
        medians = [statistics.median(run[c] for run in runs) * 1e3 for c in columns]
        if args.markdown:
            print(f"| {nranks} | " + " | ".join(f"{m:.1f}" for m in medians) + " |")
        else:
            print(f"{nranks:>5} " + " ".join(f"{m:>15.1f}" for m in medians))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
