"""``hcclpy bench OPERATION``: nccl-tests / hccl_test style measurements of one operation.

Run it under any launcher (``hcclpy run``, torchrun, srun, mpirun): every rank takes part and rank
0 prints the table. Without a launcher, ``-g N`` starts N local ranks through ``hcclpy run``;
without either it is a job of one rank::

    hcclpy bench all_reduce -g 2 -b 8 -e 64M -f 2
    hcclpy run -n 4 -m hcclpy bench all_gather -d bfp16 --json out.json
    mpirun -n 8 python -m hcclpy bench reduce_scatter -o max

The flags follow nccl-tests and hccl_test; sizes take K, M and G suffixes (powers of 1024). As in
nccl-tests, a size is rounded down to whole elements (and, for the operations whose size is every
rank's block, to blocks of 16 bytes), so a row may show less than was asked for; a ``-b`` below one
element is refused, since every size would measure nothing. As in nccl-tests, ``-r`` applies to the
rooted operations (reduce, broadcast, scatter) and is ignored by the others, whose table shows root
-1. Everything that can be checked without the ranks (sizes, factor, root, the number of ranks
send_recv needs, ``-g`` against the devices here, the ``--json`` / ``--csv`` / ``--plot`` files)
is checked before any rank starts; the device memory the largest size needs, once the ranks have
started and before anything is measured.

With ``-g N``, SIGINT and SIGTERM are forwarded to the ``hcclpy run`` that starts the ranks, which
stops them; bench waits for it (its grace period and 5 s more at most, then kills it) and exits with
``128 + n`` for signal ``n`` (130, 143). If bench itself is killed, the kernel kills that launcher
(Linux parent-death signal), and the launcher's ranks with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from . import _numbers
from .run import DEFAULT_GRACE, _exit_status, _parent_death_signal

__all__ = ["add_parser", "run"]

_OPERATIONS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "scatter",
               "all_gather_v", "reduce_scatter_v", "all_to_all_v", "all_to_all_vc", "send_recv")
_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "fp16", "fp32", "fp64",
           "bfp16")
# nccl-tests' names for the same types, and NumPy's, so that either command line works as it is.
_DTYPE_ALIASES = {"half": "fp16", "float": "fp32", "double": "fp64", "bfloat16": "bfp16", "float16": "fp16",
                  "float32": "fp32", "float64": "fp64"}


# Seconds bench waits, after forwarding a signal, for the inner launcher to stop its ranks: its
# grace period between SIGTERM and SIGKILL, plus time to drain their output and exit.
_STOP_WAIT = DEFAULT_GRACE + 5.0
_POLL = 0.1  # seconds between checks of the inner launcher


def _dtype(text: str) -> str:
    name = text.strip().lower()
    return _DTYPE_ALIASES.get(name, name)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy bench`` with ``subparsers``."""
    parser = subparsers.add_parser(
        "bench", help="measure one operation over a range of sizes (nccl-tests / hccl_test style)",
        description="Measure one HCCL operation on device buffers over a range of sizes and print the "
        "nccl-tests table (time, algbw, busbw, #wrong; out of place and in place). Exit status 1 when "
        "results are wrong.")
    parser.add_argument("operation", choices=_OPERATIONS, help="what to measure")
    parser.add_argument("-b", "--minbytes", type=_numbers.byte_size, default=8, metavar="SIZE",
                        help="smallest size (default 8), at least one element (0: empty calls); sizes are "
                        "rounded down to whole elements, as in nccl-tests")
    parser.add_argument("-e", "--maxbytes", type=_numbers.byte_size, default=64 << 20, metavar="SIZE",
                        help="largest size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=float, default=2.0, metavar="F",
                        help="factor between sizes, above 1 (default 2); 1 steps by -i instead, as nccl-tests")
    parser.add_argument("-i", "--stepbytes", type=_numbers.byte_size, default=0, metavar="SIZE",
                        help="fixed increment between sizes, with -f 1")
    parser.add_argument("-d", "--datatype", type=_dtype, choices=_DTYPES, default="fp32",
                        help="data type (default fp32); nccl-tests' half, float, double and bfloat16 work too")
    parser.add_argument("-o", "--op", choices=("sum", "prod", "max", "min"), default="sum",
                        help="reduction (default sum)")
    parser.add_argument("-r", "--root", type=_numbers.non_negative_int, default=0,
                        help="root rank of reduce, broadcast and scatter (default 0); the others ignore it")
    parser.add_argument("-w", "--warmup_iters", type=_numbers.non_negative_int, default=5, metavar="N",
                        help="untimed calls per size (default 5)")
    parser.add_argument("-n", "--iters", type=_numbers.non_negative_int, default=0, metavar="N",
                        help="timed calls per size; 0 (default): 1,000 up to 256 KiB, then 256 MiB / size, "
                        "at least 20")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (default 1)")
    parser.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=1,
                        help="time reported: 0 rank 0, 1 mean over ranks (default), 2 minimum, 3 maximum")
    parser.add_argument("--hccl-test", action="store_true",
                        help="also print hccl_test's table (size, aveg_time, alg_bandwidth, check_result)")
    parser.add_argument("-g", "--ranks", type=int, default=None, metavar="N",
                        help="without a launcher: start N local ranks through 'hcclpy run'")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--csv", metavar="FILE", help="also write the results as CSV")
    parser.add_argument("--plot", metavar="FILE.png", help="also plot busbw and time against size (matplotlib)")
    parser.add_argument("--timeout", type=_numbers.seconds, default=600.0, metavar="S",
                        help="seconds any wait may take, a finite number (default 600)")
    parser.set_defaults(handler=run, parser=parser)
    return parser


class _Relaunch:
    """The ``hcclpy run`` that ``-g N`` starts, and the signals bench received while it ran.

    The signal handler (:meth:`on_signal`) runs on the main thread between two steps of
    :meth:`wait`, so the state needs no lock.
    """

    def __init__(self) -> None:
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.signals: List[int] = []
        self.kill_at: Optional[float] = None  # when a launcher still running gets SIGKILL

    def on_signal(self, signum: int, frame: Any) -> None:
        """Forward ``signum`` (the launcher stops its ranks; a second one kills them)."""
        self.signals.append(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + _STOP_WAIT
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        if self.proc is not None:
            self.proc.send_signal(signum)  # does nothing once the launcher has exited

    def start(self, command: List[str]) -> None:
        """Start the launcher, unless a signal came first (then forward it once it is started)."""
        if self.signals:
            return
        # A session of its own, as hcclpy run gives its ranks: a terminal's Ctrl-C reaches bench
        # only, which forwards it once (a second SIGINT would make the launcher kill at once).
        self.proc = subprocess.Popen(command, start_new_session=True, preexec_fn=_parent_death_signal())
        for signum in self.signals:  # received while Popen ran, before self.proc was set
            self._forward(signum)

    def wait(self) -> int:
        """Wait for the launcher (killing it ``_STOP_WAIT`` seconds after a signal); the exit status."""
        if self.proc is None:  # a signal came before the launcher started
            return 128 + self.signals[0]
        while True:
            try:
                self.proc.wait(timeout=_POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                print(f"hcclpy bench: the ranks' launcher is still running {_STOP_WAIT:g} s after the signal; "
                      "killing it", file=sys.stderr, flush=True)
                self.proc.kill()  # its ranks get SIGKILL too: their parent-death signal
                self.proc.wait()
                break
        return 128 + self.signals[0] if self.signals else _exit_status(self.proc.returncode)


def _launch_ranks(args: argparse.Namespace, argv: List[str]) -> int:
    """Start ``args.ranks`` ranks of this command through ``hcclpy run``, forwarding SIGINT and
    SIGTERM to it; the launcher's exit status, or ``128 + n`` after signal ``n``."""
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(args.ranks), "--no-prefix",
               "--timeout", str(args.timeout + 60), "-m", "hcclpy", *argv]
    relaunch = _Relaunch()
    handlers: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, relaunch.on_signal)
    try:
        relaunch.start(command)
        return relaunch.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _without_ranks(argv: List[str]) -> List[str]:
    """``argv`` minus the ``-g`` / ``--ranks`` option (the ranks started must not start more)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in ("-g", "--ranks"):
            skip = True
        elif not (item.startswith("--ranks=") or (item.startswith("-g") and item[2:].isdigit())):
            out.append(item)
    return out


def run(args: argparse.Namespace) -> int:
    """Carry out ``hcclpy bench``; 0 when every checked result was right, 1 otherwise.

    Under a launcher the launcher decides the ranks and ``-g`` is ignored.
    """
    from ..bench import measure as m
    from ..bootstrap import detect_launch

    # Everything that can be checked without the ranks is, before any rank starts.
    if args.ranks is not None and args.ranks < 1:
        args.parser.error(f"-g {args.ranks}: the number of ranks must be at least 1")
    try:
        byte_sizes = m.sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        args.parser.error(str(exc))
    itemsize = _datatype(args).itemsize
    if 0 < args.minbytes < itemsize:
        args.parser.error(f"-b {args.minbytes}: smaller than one {args.datatype} element ({itemsize} bytes); sizes "
                          "are rounded down to whole elements (as in nccl-tests), so it would measure nothing")
    _check_outputs(args)
    launch = detect_launch()
    if args.ranks is not None and args.ranks > 1 and launch.launcher == "none":
        _check_ranks(args, args.ranks)
        _check_devices(args)
        return _launch_ranks(args, _without_ranks(args.argv))
    _check_ranks(args, launch.world_size if launch.launcher != "none" else 1)
    try:
        return _measure(args, byte_sizes)
    except KeyboardInterrupt:  # Ctrl-C, or the SIGINT a launcher forwards: a status, not a traceback
        return 128 + signal.SIGINT


def _datatype(args: argparse.Namespace) -> Any:
    from ..types import as_datatype

    return as_datatype(args.datatype.replace("bfp16", "bfloat16"))


def _check_ranks(args: argparse.Namespace, nranks: int) -> None:
    """Refuse a ``-r`` that is not a rank, for the operations that have a root (the others ignore
    it, as nccl-tests does), and send_recv on one rank (it has no peer)."""
    from ..bench.cases import OPERATIONS

    rooted = OPERATIONS[args.operation][2]
    if rooted and args.root >= nranks:
        args.parser.error(f"-r {args.root}: the root must be a rank (0..{nranks - 1})")
    if args.operation == "send_recv" and nranks < 2:
        args.parser.error(f"send_recv needs at least 2 ranks (each sends to the next one), this job has {nranks}: "
                          "pass -g 2 or more, or start it under a launcher")


def _check_devices(args: argparse.Namespace) -> None:
    """Refuse a ``-g`` above the devices visible here (each local rank takes one), before the ranks
    start; when the libraries do not load, the ranks say why."""
    import warnings

    import hcclpy
    from .._ffi import SimulatorFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulatorFallbackWarning)  # each rank warns anyway
        try:
            count = hcclpy.device_count()
        except hcclpy.HcclpyError:
            return
    if args.ranks > count:
        args.parser.error(f"-g {args.ranks}: {count} device(s) are visible here, and each rank needs its own")


def _check_memory(args: argparse.Namespace, comm: Any, byte_sizes: List[int]) -> None:
    """Refuse sizes whose buffers cannot fit in the free device memory of every rank, before any is
    allocated (aclrtMalloc would fail in the middle of the table). Collective: every rank learns the
    smallest free memory, so all of them stop, and rank 0 says why."""
    import numpy as np

    from .._units import format_bytes

    needed = 2 * max(byte_sizes, default=0)  # a send and a receive buffer, each at most the size
    free, total = comm.device.memory_info()
    free = int(comm.all_reduce(np.array([free], np.int64), op="min")[0])
    if needed > free:
        if comm.rank == 0:
            args.parser.error(f"-e: the largest size, {format_bytes(max(byte_sizes))}, needs {format_bytes(needed)} of "
                              f"device memory per rank (a send and a receive buffer), but {format_bytes(free)} of "
                              f"{format_bytes(total)} is free")
        raise SystemExit(2)


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse ``--json``, ``--csv`` and ``--plot`` files that could not be written, before the
    benchmark rather than after it."""
    from ..bench import report

    for option, path, check in (("--json", args.json, report.check_output), ("--csv", args.csv, report.check_output),
                                ("--plot", args.plot, report.check_plot)):
        if path:
            try:
                check(os.fspath(path))
            except ValueError as exc:
                args.parser.error(f"{option} {path}: cannot write it: {exc}")


def _measure(args: argparse.Namespace, byte_sizes: List[int]) -> int:
    import hcclpy
    from ..bench import measure as m, report
    from ..types import ReduceOp

    dtype = _datatype(args)
    op = ReduceOp[args.op.upper()]
    comm = hcclpy.init(timeout=args.timeout)
    try:
        _check_ranks(args, comm.size)
        _check_memory(args, comm, byte_sizes)
        rows = m.measure(comm, args.operation, byte_sizes, dtype, op, args.root, warmup=args.warmup_iters,
                         iters=args.iters, check=bool(args.check), average=args.average, timeout=args.timeout)
        wrong = sum(r.wrong for row in rows for r in (row.out_of_place, row.in_place) if r is not None)
        if comm.rank == 0:
            from ..bench.cases import OPERATIONS

            _, reduces, rooted, _ = OPERATIONS[args.operation]
            meta = {"operation": args.operation, "nranks": comm.size, "backend": hcclpy.backend(),
                    "type": report.TYPE_NAMES[dtype.name], "redop": args.op if reduces else "none",
                    "root": args.root if rooted else -1, "warmup": args.warmup_iters,
                    "iters": args.iters or "auto", "check": bool(args.check), "average": m.AVERAGES[args.average]}
            report.table(rows, meta, sys.stdout)
            if args.hccl_test:
                report.hccl_test_table(rows, meta, sys.stdout)
            for path, write in ((args.json, report.write_json), (args.csv, report.write_csv),
                                (args.plot, report.write_plot)):
                if path:
                    write(rows, meta, os.fspath(path))
        return 0 if wrong == 0 else 1
    finally:
        hcclpy.shutdown()
