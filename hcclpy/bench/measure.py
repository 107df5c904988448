"""Timing one operation over a range of sizes, the way hccl_test does it: device events around
back-to-back calls on one stream, after a warm-up, with a separate checked call.

Every rank measures its own time; the ranks then agree on one number per size (``average``: the
mean over ranks, as nccl-tests' default, or the minimum or maximum) and add up the wrong elements.
:class:`Timer` measures one size at a time, so that the caller can show each row as it comes and
keep the rows measured so far when a later size fails.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import collectives, runtime
from .._units import format_bytes
from ..types import DataType, ReduceOp
from .cases import Case, make_case

__all__ = ["AVERAGES", "Result", "Row", "Timer", "iterations", "sizes"]

AVERAGES = {0: "rank 0", 1: "mean over ranks", 2: "minimum over ranks", 3: "maximum over ranks"}


@dataclass
class Result:
    """One column group of the table: in place or out of place."""

    time_us: float
    algbw: float            # GB/s (10^9 bytes)
    busbw: float
    wrong: Optional[int]    # None when results were not checked (-c 0)


@dataclass
class Row:
    """One size."""

    size: int                       # bytes, as nccl-tests prints them
    count: int                      # elements
    iters: int                      # timed calls per column (-n, or the automatic count)
    out_of_place: Optional[Result]  # None where the operation has no such form
    in_place: Optional[Result]

    def as_dict(self) -> Dict[str, Any]:
        """The row as JSON holds it (a column the operation lacks, or an unchecked #wrong, is None)."""
        return asdict(self)


def sizes(minimum: int, maximum: int, factor: Optional[float] = None, step: Optional[int] = None) -> List[int]:
    """The sizes from ``minimum`` to ``maximum``, as nccl-tests steps them: plus ``step`` when a step
    is given without a factor (or with a factor of 1, nccl-tests' "no factor"), else times
    ``factor`` (2 when neither is given). A size the factor does not grow grows by one byte.

    ValueError, naming the option (``-b``, ``-e``, ``-f``, ``-i``), for an empty range, a factor that
    is not a finite number of at least 1 (a NaN would compare false everywhere and step one byte at
    a time), both a factor above 1 and a step (one of them would be ignored), or a step that is
    not positive.
    """
    if minimum < 0 or maximum < minimum:
        raise ValueError(f"-b {minimum} -e {maximum}: the size range {minimum}..{maximum} is empty or negative")
    if factor is not None and not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"-f {factor:g}: the factor between sizes must be a finite number above 1, or 1 to "
                         "step by -i")
    if factor is not None and factor > 1 and step is not None:
        raise ValueError(f"-f {factor:g} -i {step}: give a factor (-f) or a step (-i), not both (-f 1 -i {step} "
                         f"steps by {step}, as nccl-tests)")
    if factor == 1 and step is None:
        raise ValueError("-f 1: without a factor, sizes step by -i, which is missing")
    if step is not None and step <= 0:
        raise ValueError(f"-i {step}: the step between sizes must be positive")
    if factor is None:
        factor = 1.0 if step is not None else 2.0
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


def gather_values(comm: Any, values: np.ndarray, stream: Any, timeout: float) -> np.ndarray:
    """Every rank's ``values`` (a small 1-D array), row ``r`` from rank ``r``. Through device arrays
    on ``stream``, waited for at most ``timeout`` seconds: a rank that stops answering is a
    :class:`~hcclpy.CommTimeoutError` after ``--timeout``, as for the measured calls, not after
    ``HCCL_EXEC_TIMEOUT``."""
    mine = runtime.from_numpy(values, device=comm.device)
    everyone = runtime.empty(comm.size * values.size, values.dtype, device=comm.device)
    try:
        collectives.all_gather(comm, mine, everyone, stream=stream)
        stream.synchronize(timeout)
        return everyone.to_numpy().reshape(comm.size, values.size)
    finally:
        mine.close()
        everyone.close()


def _agree(comm: Any, stream: Any, timeout: float, time_us: float, wrong: Optional[int],
           average: int) -> Tuple[float, Optional[int]]:
    """The ranks' common time (by ``average``) and total wrong elements (None when unchecked: every
    rank then skips the sum alike)."""
    # float64 holds wrong-element counts exactly up to 2**53, far past any buffer's element count.
    table = gather_values(comm, np.array([time_us, wrong or 0], dtype=np.float64), stream, timeout)
    times = table[:, 0]
    if wrong is not None:
        wrong = int(table[:, 1].sum())
    agreed = {0: times[0], 1: times.mean(), 2: times.min(), 3: times.max()}[average]
    return float(agreed), wrong


class Timer:
    """Times ``operation`` on ``comm``, one size per :meth:`row` call, on a stream of its own.

    :attr:`where` says what it is doing (``"all_reduce of 64 B, in place"``), for a message when a
    call fails. :meth:`close` frees the stream and events; after a failure, abort the communicator
    first (``comm.destroy(timeout=0)``): closing a stream waits for the calls still queued on it.
    """

    def __init__(self, comm: Any, operation: str, dtype: DataType, op: ReduceOp, root: int, *, warmup: int,
                 iters: int, check: bool, average: int, timeout: float) -> None:
        self.comm, self.operation, self.dtype, self.op, self.root = comm, operation, dtype, op, root
        self.warmup, self.iters, self.check, self.average, self.timeout = warmup, iters, check, average, timeout
        self.where = f"{operation}, setting up"
        self.stream = comm.device.create_stream()
        self._start, self._end = comm.device.create_event(), comm.device.create_event()

    def row(self, nbytes: int) -> Row:
        """Measure ``nbytes`` (rounded down as :class:`~hcclpy.bench.cases.Case` says): a collective
        call, every rank measures the same size."""
        self.where = f"{self.operation} of {format_bytes(nbytes)}"
        case = make_case(self.operation, self.comm, nbytes, self.dtype, self.op, self.root)
        calls = iterations(case.nbytes, self.iters)
        try:
            results = [self._result(case, in_place, calls) for in_place in (False, True)]
        finally:
            case.close()
        return Row(case.nbytes, case.count, calls, results[0], results[1])

    def _result(self, case: Case, in_place: bool, calls: int) -> Optional[Result]:
        """One column: the checked call, the warm-up and ``calls`` timed calls; None when the
        operation has no such form."""
        stream, timeout = self.stream, self.timeout
        launch = case.launcher(in_place, stream)
        if launch is None:
            return None
        self.where = f"{self.operation} of {format_bytes(case.nbytes)}, {'in' if in_place else 'out of'} place"
        wrong = None
        if self.check:
            case.fill(in_place)
            launch()
            stream.synchronize(timeout)
            wrong = case.wrong(in_place)
        for _ in range(self.warmup):
            launch()
        collectives.barrier(self.comm, stream=stream)  # the ranks start the timed calls together
        stream.synchronize(timeout)
        self._start.record(stream)
        for _ in range(calls):
            launch()
        self._end.record(stream)
        self._end.synchronize(timeout)
        per_call_us = self._start.elapsed_time(self._end) * 1e3 / calls
        time_us, wrong = _agree(self.comm, stream, timeout, per_call_us, wrong, self.average)
        algbw = case.nbytes / time_us / 1e3 if time_us > 0 else 0.0
        return Result(time_us, algbw, algbw * case.factor, wrong)

    def close(self) -> None:
        """Free the events and the stream (waiting for what is queued on it)."""
        self._start.close()
        self._end.close()
        self.stream.close()
