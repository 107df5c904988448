"""``hcclpy bench OPERATION``: nccl-tests / hccl_test style measurements of one operation.

Run it under any launcher (``hcclpy run``, torchrun, srun, mpirun): every rank takes part and rank
0 prints the table. Without a launcher, ``-g N`` starts N local ranks through ``hcclpy run``;
without either it is a job of one rank::

    hcclpy bench all_reduce -g 2 -b 8 -e 64M -f 2
    hcclpy run -n 4 -m hcclpy bench all_gather -d bfp16 --json out.json
    mpirun -n 8 python -m hcclpy bench reduce_scatter -o max

The flags follow nccl-tests and hccl_test; sizes take K, M and G suffixes (powers of 1024). Sizes
step by a factor (``-f``, 2 when neither ``-f`` nor ``-i`` is given) or, with ``-i`` and no
``-f`` (or ``-f 1``, as in nccl-tests), by a fixed step; ``-f`` above 1 with ``-i`` is refused, as
one of them would be ignored. As in nccl-tests, a size is rounded down to whole elements and, for
the operations whose size is every rank's block (all_gather, reduce_scatter, all_to_all, scatter
and the uneven forms), to a 16-byte block per rank, so a row may show less than was asked for;
two sizes that round to the same one are measured once. A ``-b`` between 0 and the smallest size
(one element, or 16 bytes × ranks) is refused, naming that size; without ``-b`` the first size is
8 bytes or that smallest size if larger (``-e`` at most), and ``-b 0`` measures empty calls. As
in nccl-tests, ``-r`` applies to the rooted operations (reduce, broadcast, scatter) and is ignored
by the others, whose table shows root -1. HCCL broadcasts in place, so broadcast's out-of-place
columns time the in-place call too (the table says so; the average bus bandwidth counts it
once). With ``-c 0``
the #wrong columns show N/A (null in JSON, empty in CSV) and the footer says nothing was checked.
With ``-n 0`` (the default) the timed calls are chosen per size; JSON and CSV give each row's
``iters``. Everything that can be checked without the ranks (sizes, factor, root, the number of
ranks send_recv needs, ``-g`` against the devices here, the ``--json`` / ``--csv`` / ``--plot``
files) is checked before any rank starts; the device memory the largest size needs, once the
ranks have started and before anything is measured.

Rank 0 prints the header, then each row as soon as it is measured. ``--timeout S`` bounds each
wait of a rank for the others (start-up, the memory check, each synchronisation of the measured
calls and each exchange of their times), not the run: a long run that makes progress is never cut
short. A run that stops early (a wait past ``--timeout``, a failure such as a rank gone, SIGINT or
SIGTERM) prints one line ``hcclpy bench: ...`` on stderr saying where it stopped, and rank 0 still
prints the footer and writes ``--json`` (``"complete": false`` and ``"stopped"`` saying why),
``--csv`` and ``--plot`` for the rows measured so far. A signal is acted on within 0.1 s, even
during a wait (hcclpy's waits return to Python that often).

Exit status: 0 when every checked result was right; 1 when one was wrong; 2 for bad arguments;
3 when an operation failed (:class:`~hcclpy.HcclpyError`, a rank gone, say); 124 when a wait ran
past ``--timeout``; ``128 + n`` after signal ``n`` (130 for SIGINT, 143 for SIGTERM).

With ``-g N``, SIGINT and SIGTERM (SIGHUP and SIGQUIT too) are forwarded to the ``hcclpy run``
that starts the ranks, which stops them; bench waits for it (its grace period and 5 s more at
most, then kills it) and exits with ``128 + n`` for signal ``n`` (130, 143). If bench itself is
killed, the kernel kills that launcher (Linux parent-death signal), and the launcher's ranks with
it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from . import _numbers
from .run import DEFAULT_GRACE, EXIT_TIMEOUT, _exit_status, _parent_death_signal, forwarded_signals

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
EXIT_FAILED = 3  # an operation failed (1 is for wrong results, 2 for bad arguments)


def _dtype(text: str) -> str:
    name = text.strip().lower()
    return _DTYPE_ALIASES.get(name, name)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy bench`` with ``subparsers``."""
    parser = subparsers.add_parser(
        "bench", help="measure one operation over a range of sizes (nccl-tests / hccl_test style)",
        description="Measure one HCCL operation on device buffers over a range of sizes and print the "
        "nccl-tests table (time, algbw, busbw, #wrong; out of place and in place), a row as soon as it is "
        "measured. A run that stops early still reports the rows measured. Exit status: 0 success, 1 wrong "
        "results, 2 bad arguments, 3 an operation failed (a rank gone, say), 124 a wait ran past --timeout, "
        "130 / 143 after SIGINT / SIGTERM.")
    parser.add_argument("operation", choices=_OPERATIONS, help="what to measure")
    parser.add_argument("-b", "--minbytes", type=_numbers.byte_size, default=None, metavar="SIZE",
                        help="smallest size (default 8, or the operation's smallest size if larger; -e at most); "
                        "0 measures empty calls, and a -b between 0 and the smallest size (one element; 16 bytes x ranks for "
                        "all_gather, reduce_scatter, all_to_all, scatter and the _v forms) is refused: sizes are "
                        "rounded down to a multiple of it, as in nccl-tests")
    parser.add_argument("-e", "--maxbytes", type=_numbers.byte_size, default=64 << 20, metavar="SIZE",
                        help="largest size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=_numbers.real, default=None, metavar="F",
                        help="factor between sizes, above 1 (default 2 when -i is not given); -f 1 -i SIZE steps "
                        "by SIZE, as nccl-tests; -f above 1 with -i is refused")
    parser.add_argument("-i", "--stepbytes", type=_numbers.byte_size, default=None, metavar="SIZE",
                        help="fixed increment between sizes, used when -f is not given (or is 1)")
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
                        "at least 20 (each row's count is in --json and --csv)")
    parser.add_argument("-c", "--check", type=_numbers.one_of(0, 1), default=1, metavar="{0,1}",
                        help="check results (default 1); with 0 the #wrong columns show N/A")
    parser.add_argument("-a", "--average", type=_numbers.one_of(0, 1, 2, 3), default=1, metavar="{0,1,2,3}",
                        help="time reported: 0 rank 0, 1 mean over ranks (default), 2 minimum, 3 maximum")
    parser.add_argument("--hccl-test", action="store_true",
                        help="also print hccl_test's table (size, aveg_time, alg_bandwidth, check_result)")
    parser.add_argument("-g", "--ranks", type=_numbers.positive_int, default=None, metavar="N",
                        help="without a launcher: start N local ranks through 'hcclpy run' (under a launcher, "
                        "the launcher decides)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--csv", metavar="FILE", help="also write the results as CSV")
    parser.add_argument("--plot", metavar="FILE.png", help="also plot busbw and time against size (matplotlib)")
    parser.add_argument("--timeout", type=_numbers.seconds, default=600.0, metavar="S",
                        help="seconds a rank may wait for the others, at start-up and at each synchronisation, a "
                        "finite number (default 600); past it the run stops with exit status 124. The run as a "
                        "whole has no limit")
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
    # No --timeout for the launcher: the ranks bound each wait by bench's --timeout themselves, and
    # a cap on the whole job would kill a long run that is making progress (and lose its report).
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(args.ranks), "--no-prefix", "-m", "hcclpy", *argv]
    relaunch = _Relaunch()
    with forwarded_signals(relaunch.on_signal):
        relaunch.start(command)
        return relaunch.wait()


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
    """Carry out ``hcclpy bench``; the exit status the module docstring lists (0 when every checked
    result was right, 1 when one was wrong, 3 when an operation failed, 124 on a timeout).

    Under a launcher the launcher decides the ranks and ``-g`` is ignored.
    """
    from ..bootstrap import detect_launch

    # Everything that can be checked without the ranks is, before any rank starts.
    try:
        launch = detect_launch()
    except ValueError as exc:  # a launcher's variables that say no rank
        args.parser.error(str(exc))
    if args.ranks is not None and launch.launcher != "none" and args.ranks != launch.world_size and launch.rank == 0:
        print(f"hcclpy bench: -g {args.ranks} is ignored: this job's launcher started "
              f"{launch.world_size} rank(s)", file=sys.stderr, flush=True)
    relaunch = args.ranks is not None and args.ranks > 1 and launch.launcher == "none"
    nranks = args.ranks if relaunch else launch.world_size if launch.launcher != "none" else 1
    byte_sizes = _sizes(args, nranks)
    _check_outputs(args)
    _check_ranks(args, nranks)
    if relaunch:
        _check_devices(args)
        return _launch_ranks(args, _without_ranks(args.argv))
    try:
        return _measure(args, byte_sizes, nranks, launch.rank)
    except KeyboardInterrupt:  # a Ctrl-C before bench handles signals itself: a status, not a traceback
        return 128 + signal.SIGINT
    except _Stopped as exc:  # a signal in the instant between the measurement and the report
        return 128 + exc.signum


def _sizes(args: argparse.Namespace, nranks: int) -> List[int]:
    """The sizes to measure on ``nranks`` ranks, rounded down as the rows show them and each once.
    A usage error for a ``-b`` below the operation's smallest size (every size below it rounds to
    0 bytes), or for a range without sizes."""
    from ..bench import cases, measure as m

    dtype = _datatype(args)
    smallest = cases.granularity(args.operation, dtype, nranks)
    if cases.OPERATIONS[args.operation][3]:
        ranks = f"{nranks} rank{'s' if nranks > 1 else ''}"
        what = f"{args.operation}'s smallest size on {ranks}, {smallest} bytes (a 16-byte block per rank)"
    else:
        what = f"{args.operation}'s smallest size, {smallest} bytes (one {args.datatype} element)"
    minimum = args.minbytes
    if minimum is None:  # nccl-tests' 8, unless that would round down to nothing (and no more than -e)
        minimum = min(max(8, smallest), args.maxbytes)
        if minimum < smallest:
            args.parser.error(f"-e {args.maxbytes}: below {what}, so every size would be 0 bytes; pass -e {smallest} "
                              "or more (or -b 0 -e 0 for empty calls)")
    elif 0 < minimum < smallest:
        args.parser.error(f"-b {minimum}: below {what}; sizes are rounded down to a multiple of it (as in "
                          f"nccl-tests), so -b {minimum} would give 0-byte rows; pass -b {smallest} or more (or -b 0 "
                          "for empty calls)")
    try:
        requested = m.sizes(minimum, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        args.parser.error(str(exc))
    return cases.rounded_sizes(requested, args.operation, dtype, nranks)


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
    from ..errors import SimulatorFallbackWarning

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
    from ..bench.measure import gather_values

    needed = 2 * max(byte_sizes, default=0)  # a send and a receive buffer, each at most the size
    free, total = comm.device.memory_info()
    free = int(gather_values(comm, np.array([free], np.int64), comm.device.default_stream, args.timeout).min())
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


class _Stopped(BaseException):
    """A signal ``hcclpy run`` forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT) while measuring. A
    BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on its way catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopOnce:
    """The handler of the forwarded signals on a measuring rank: while it is armed, a signal raises
    :class:`_Stopped`, so that the rows measured so far are reported; once measuring is over (a
    signal, a failure, the last size), signals are ignored, so that the report is written whole (it
    is short, and a launcher's SIGKILL still bounds it)."""

    def __init__(self) -> None:
        self.armed = True

    def __call__(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise _Stopped(signum)


def _measure(args: argparse.Namespace, byte_sizes: List[int], nranks: int, rank: int) -> int:
    """Measure as rank ``rank`` of ``nranks`` (as the launcher says): rank 0 prints each row as it
    is measured, then the footer and the files, also when the run stops early, at start-up too
    (see the module docstring)."""
    import hcclpy
    from ..bench import measure as m, report

    comm: Any = None
    timer: Optional[m.Timer] = None
    meta = _meta(args, nranks)
    rows: List[m.Row] = []
    status, stopped = 0, None
    handler = _StopOnce()
    with forwarded_signals(handler):
        try:
            try:
                comm = hcclpy.init(timeout=args.timeout)
                meta["backend"] = hcclpy.backend()
                _check_ranks(args, comm.size)
                _check_memory(args, comm, byte_sizes)
                if rank == 0:
                    report.header(meta, sys.stdout)
                timer = m.Timer(comm, args.operation, _datatype(args), hcclpy.ReduceOp[args.op.upper()], args.root,
                                warmup=args.warmup_iters, iters=args.iters, check=bool(args.check),
                                average=args.average, timeout=args.timeout)
                for nbytes in byte_sizes:
                    rows.append(timer.row(nbytes))
                    if rank == 0:
                        report.print_row(rows[-1], meta, sys.stdout)
            except (hcclpy.HcclpyError, _Stopped) as exc:
                handler.armed = False  # a signal from here on waits for the report
                status, stopped = _stop_status(exc, timer.where if timer else f"{args.operation}, starting", args)
                if not isinstance(exc, _Stopped) or rank == 0:  # a signal reaches every rank: one line is enough
                    who = f"rank {rank}: " if nranks > 1 else ""
                    print(f"hcclpy bench: {who}{stopped}", file=sys.stderr, flush=True)
            handler.armed = False
            if rank == 0:
                _report(args, rows, {**meta, "complete": stopped is None, "stopped": stopped})
            if status == 0 and report.wrong_elements(rows):
                status = 1
        finally:
            _teardown(comm, timer, failed=stopped is not None)
    return status


def _stop_status(exc: BaseException, where: str, args: argparse.Namespace) -> Tuple[int, str]:
    """The exit status of a run stopped by ``exc`` at ``where``, and one line saying why."""
    if isinstance(exc, _Stopped):
        return 128 + exc.signum, f"stopped by {signal.Signals(exc.signum).name} at {where}"
    from ..errors import CommTimeoutError

    detail = " ".join(str(exc).split())  # one line
    if isinstance(exc, CommTimeoutError):
        return EXIT_TIMEOUT, f"timed out at {where} (--timeout {args.timeout:g} s): {detail}"
    return EXIT_FAILED, f"failed at {where}: {type(exc).__name__}: {detail}"


def _meta(args: argparse.Namespace, nranks: int) -> Dict[str, Any]:
    """What the header, the JSON and the CSV say about the run."""
    from ..bench import measure as m, report
    from ..bench.cases import OPERATIONS

    _, reduces, rooted, _ = OPERATIONS[args.operation]
    return {"operation": args.operation, "nranks": nranks, "backend": None,  # known once the libraries load
            "type": report.TYPE_NAMES[_datatype(args).name], "redop": args.op if reduces else "none",
            "root": args.root if rooted else -1, "warmup": args.warmup_iters, "iters": args.iters or "auto",
            "check": bool(args.check), "average": m.AVERAGES[args.average]}


def _report(args: argparse.Namespace, rows: List[Any], meta: Dict[str, Any]) -> None:
    """Rank 0's footer, hccl_test table and files, for the rows measured (all of them, or those
    before the run stopped: a plot only when there is one)."""
    from ..bench import report

    report.footer(rows, meta, sys.stdout)
    if args.hccl_test:
        report.hccl_test_table(rows, meta, sys.stdout)
    for path, write in ((args.json, report.write_json), (args.csv, report.write_csv),
                        (args.plot, report.write_plot if rows else None)):
        if path and write is not None:
            write(rows, meta, os.fspath(path))


def _teardown(comm: Any, timer: Any, failed: bool) -> None:
    """Free the timer's stream and the communicator. After a failure, calls may still be queued (a
    collective waiting for a rank that is gone, the calls queued before a signal), and closing the
    stream would wait for them: the communicator is destroyed first with no wait, which aborts
    them; errors of that teardown are not reported over the failure."""
    import hcclpy

    try:
        if failed and comm is not None:
            comm.destroy(timeout=0)
        if timer is not None:
            timer.close()
        hcclpy.shutdown()
    except hcclpy.HcclpyError:
        if not failed:
            raise
