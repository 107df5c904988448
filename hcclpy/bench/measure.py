"""Timing one operation over a range of sizes, the way hccl_test does it: device events around
back-to-back calls on one stream, after a warm-up, with a separate checked call.

Every rank measures its own time; the ranks then agree on one number per size (``average``: the
mean over ranks, as nccl-tests' default, or the minimum or maximum) and add up the wrong elements.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from .. import collectives, host
from ..types import DataType, ReduceOp
from .cases import make_case

__all__ = ["AVERAGES", "Result", "Row", "iterations", "measure", "sizes"]

AVERAGES = {0: "rank 0", 1: "mean over ranks", 2: "minimum over ranks", 3: "maximum over ranks"}


@dataclass
class Result:
    """One column group of the table: in place or out of place."""

    time_us: float
    algbw: float   # GB/s (10^9 bytes)
    busbw: float
    wrong: int


@dataclass
class Row:
    """One size."""

    size: int                       # bytes, as nccl-tests prints them
    count: int                      # elements
    out_of_place: Optional[Result]  # None where the operation has no such form
    in_place: Optional[Result]

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def sizes(minimum: int, maximum: int, factor: float, step: int) -> List[int]:
    """The sizes from ``minimum`` to ``maximum``: times ``factor`` when it is above 1, else (a factor
    of 1, nccl-tests' "no factor") plus ``step``. A size the factor does not grow grows by one byte.

    ValueError, naming the option (``-b``, ``-e``, ``-f``, ``-i``), for an empty range, a factor that
    is not a finite number of at least 1 (a NaN would compare false everywhere and step one byte at
    a time), or a factor of 1 without a positive step.
    """
    if minimum < 0 or maximum < minimum:
        raise ValueError(f"-b {minimum} -e {maximum}: the size range {minimum}..{maximum} is empty or negative")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"-f {factor:g}: the factor between sizes must be a finite number above 1, or 1 to "
                         "step by -i")
    if factor == 1 and step <= 0:
        raise ValueError(f"-f 1 -i {step}: sizes need a factor above 1 (-f) or, with -f 1, a positive step (-i)")
    out, size = [], minimum
    while size <= maximum:
        out.append(size)
        grown = size * factor if factor > 1 else size + step
        # Past maximum once truncated? Tested on the float: int() refuses the inf a huge factor gives.
        if grown >= maximum + 1:
            break
        size = max(int(grown), size + 1)
    return out


def iterations(nbytes: int, requested: int) -> int:
    """``requested`` timed calls, or when it is 0 enough that each size takes a similar time:
    1,000 up to 256 KiB, then 256 MiB / size, at least 20 (the rule of the C benchmark)."""
    if requested > 0:
        return requested
    return max(20, min(1000, (256 << 20) // max(nbytes, 1)))


def _agree(comm: Any, time_us: float, wrong: int, average: int) -> tuple:
    """The ranks' common time (by ``average``) and total wrong elements."""
    times = host.all_gather(comm, np.array([time_us]))[:, 0]
    total_wrong = int(host.all_reduce(comm, np.array([wrong], dtype=np.int64))[0])
    agreed = {0: times[0], 1: times.mean(), 2: times.min(), 3: times.max()}[average]
    return float(agreed), total_wrong


def measure(comm: Any, operation: str, byte_sizes: List[int], dtype: DataType, op: ReduceOp, root: int, *,
            warmup: int, iters: int, check: bool, average: int, timeout: float) -> List[Row]:
    """Time ``operation`` at every size (see the module docstring) and return one row per size."""
    stream = comm.device.create_stream()
    start, end = comm.device.create_event(), comm.device.create_event()
    rows: List[Row] = []
    try:
        for nbytes in byte_sizes:
            case = make_case(operation, comm, nbytes, dtype, op, root)
            calls = iterations(case.nbytes, iters)
            results = []
            try:
                for in_place in (False, True):
                    launch = case.launcher(in_place, stream)
                    if launch is None:
                        results.append(None)
                        continue
                    wrong = 0
                    if check:
                        case.fill(in_place)
                        launch()
                        stream.synchronize(timeout)
                        wrong = case.wrong(in_place)
                    for _ in range(warmup):
                        launch()
                    collectives.barrier(comm, stream=stream)  # the ranks start the timed calls together
                    stream.synchronize(timeout)
                    start.record(stream)
                    for _ in range(calls):
                        launch()
                    end.record(stream)
                    end.synchronize(timeout)
                    time_us, wrong = _agree(comm, start.elapsed_time(end) * 1e3 / calls, wrong, average)
                    algbw = case.nbytes / time_us / 1e3 if time_us > 0 else 0.0
                    results.append(Result(time_us, algbw, algbw * case.factor, wrong))
            finally:
                case.close()
            rows.append(Row(case.nbytes, case.count, results[0], results[1]))
    finally:
        start.close()
        end.close()
        stream.close()
    return rows
