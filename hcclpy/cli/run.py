"""``hcclpy run``: start the ranks of a job on this machine, as ``torchrun`` does.

::

    hcclpy run -n 4 examples/allreduce.py                  # 4 ranks of a script
    hcclpy run -n 2 -m mypackage.train --epochs 3          # a module, with its own arguments
    hcclpy run -n 2 --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29500 train.py
    hcclpy run --nproc_per_node 4 --master_port 29500 train.py   # torchrun's spellings work too

The options are torchrun's (``-n`` is ``--nproc-per-node``), in its dash and underscore spellings
(``--nproc_per_node``, ``--node_rank``, ``--master_addr``, ``--master_port``); ``--standalone``
is accepted, one node being the default. An option it does not know is refused with the nearest
one it does (:func:`hcclpy.cli.main`); mpirun's ``-np`` and torchrun's rendezvous options
(``--rdzv-endpoint``, ...) are refused saying what to write instead.

Every rank is a child process (``python script.py args...``) with the variables torchrun sets:
``RANK`` (``node_rank * N + local rank``), ``WORLD_SIZE`` (``N * nnodes``), ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` and ``NODE_RANK`` (the node rank), ``GROUP_WORLD_SIZE``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR`` (``--master-addr``) and ``MASTER_PORT``
(``--master-port``, else a free port the launcher picks, which it may only with one node), plus
``HCCLPY_LAUNCHER=hcclpy-run`` and, unless already set, ``HCCLPY_RENDEZVOUS_PORT``, the port
:func:`hcclpy.init`'s rendezvous listens on at ``MASTER_ADDR`` (with ``--master-port P``,
``P + 1``, or ``P - 1`` when P is 65535; without it, another free port: :func:`hcclpy.init` keeps
off ``MASTER_PORT``, which torch.distributed's store takes in a script that uses both) and, with
one node, a fresh
``HCCLPY_RENDEZVOUS_TOKEN``. :func:`hcclpy.init` reads them, so a script runs unchanged under
``hcclpy run``, torchrun, srun or mpirun. The rank variables of other launchers (Slurm, Open MPI,
MPICH/PMI) are removed from the children's environment, so a job started inside an allocation sees
only the ranks this launcher gives it.

Output: each line a rank prints is shown prefixed with ``[rank] `` (stdout to stdout, stderr to
stderr, a line at a time; bytes that are not UTF-8 are replaced, never fatal; a line longer than
64 KiB is shown in pieces, each prefixed, so one rank cannot hold the others' lines); ``--no-prefix``
passes the ranks' output through untouched, each rank writing straight to the launcher's
stdout and stderr, so a line a rank writes in pieces (``print(a, b)`` is several writes) can be
split by another rank's. ``PYTHONUNBUFFERED=1`` is set unless already set, so lines show up when
they are printed. When writing to the launcher's stdout or stderr fails (a full disk, a terminal
that hung up), the launcher says so once on stderr and drops what the ranks send there from then on
(a reader that went away, as ``| head`` does, is not reported); it keeps reading the ranks' pipes,
so the ranks run on, and exits with their status.

Ending: the launcher exits with 0 when every rank does. When a rank exits with a non-zero code or
is killed, the others are stopped and the launcher exits with that rank's code (``128 + n`` for
signal ``n``). SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher are forwarded to every rank,
as torchrun's agent does (a second one kills them); the launcher then exits with ``128 + n``.
``--timeout`` stops everything after that many seconds and exits with 124. Stopping signals the
process group of every rank, of the ranks that already exited too: SIGTERM (or the forwarded
signal), then SIGKILL to whatever is left after ``--grace`` seconds. With ``HCCLPY_TRACE_DIR``
set, a stop at ``--timeout`` or on a signal first asks every rank to dump its flight recorder
there (:mod:`hcclpy.trace`, through a pipe the ranks inherit) and gives them a second. However
the job ends, once the last rank has exited the launcher stops the processes the ranks started in
the same way (showing their output meanwhile) and goes on when none is left, at the latest a
second after the SIGKILL; it then reads at most 1 MiB more from each pipe and closes it. So no
process that stays in its rank's process group outlives the job; one that leaves it (``setsid``,
``setpgid``, a daemon) is not reached, and loses the rank's output when the pipe closes. If the launcher itself is killed by a
signal it does not forward (SIGKILL, say), the kernel kills the ranks (Linux parent-death signal),
but the processes the ranks started keep running: nothing is left to stop them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ..rendezvous import free_port
from . import _numbers, _output

__all__ = ["EXIT_TIMEOUT", "LAUNCHER", "RankSpec", "add_parser", "free_port", "launch", "next_port",
           "rank_environment", "rendezvous_port", "run"]

LAUNCHER = "hcclpy-run"
EXIT_TIMEOUT = 124  # as coreutils timeout(1)
DEFAULT_GRACE = 5.0  # seconds between SIGTERM and SIGKILL

# Variables through which other launchers tell a process its rank: a child of this launcher must
# not see them (it would take an Open MPI or Slurm rank for its own).
FOREIGN_RANK_VARIABLES = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
)

_READ_SIZE = 1 << 16
_MAX_PENDING = 1 << 16  # a longer unterminated line is shown in pieces of this size
_POLL = 0.05  # seconds between checks of the children while no output arrives
_DRAIN_LIMIT = 1 << 20  # bytes read from a pipe once the job has ended (Linux's largest pipe by default):
# a writer outside the rank's process group, which no signal of ours reaches, cannot hold the launcher
_KILL_WAIT = 1.0  # seconds to wait for processes to vanish after the final SIGKILL
_DUMP_WAIT = 1.0  # seconds the ranks get to dump their flight recorders before a stop (HCCLPY_TRACE_DIR)
# The signals that would end the launcher and that it forwards instead, as torchrun's agent does:
# left at their default, SIGHUP (a closed terminal or SSH session) and SIGQUIT (Ctrl-\) would kill
# it at once, leaving the processes the ranks started running.
_FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                   if hasattr(signal, name))


# ------------------------------------------------------------------------------ command line

class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, showing each option by its documented spellings only: the underscore forms
    torchrun accepts too (``--nproc_per_node``) work but are not listed (the epilog names them)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [name for name in action.option_strings if "_" not in name]
        if shown and len(shown) < len(action.option_strings):
            action = copy.copy(action)
            action.option_strings = shown
        return super()._format_action_invocation(action)


class _Refuse(argparse.Action):
    """An option of another launcher that ``hcclpy run`` does not take: a usage error saying what
    to write instead (``advice``, where ``{value}`` stands for the option's value, or ``...``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, advice: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.advice = advice

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        parser.error(f"{option_string}: {self.advice.format(value=values if values is not None else '...')}")


# torchrun's options that hcclpy run has no counterpart for, and what to do instead.
_TORCHRUN_ONLY = {
    ("--rdzv-endpoint", "--rdzv_endpoint"): "hcclpy run has no rendezvous backends; give rank 0's address and "
                                            "port as --master-addr HOST --master-port PORT",
    ("--rdzv-backend", "--rdzv_backend"): "hcclpy run has no rendezvous backends; every node is given "
                                          "--master-addr and --master-port",
    ("--rdzv-id", "--rdzv_id"): "hcclpy run has no rendezvous backends; every node is given --master-addr and "
                                "--master-port",
    ("--max-restarts", "--max_restarts"): "hcclpy run does not restart ranks: when one fails, the job ends",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hcclpy run`` with ``subparsers`` (from ``ArgumentParser.add_subparsers``).

    The options are torchrun's, in its two spellings (``--nproc-per-node`` and
    ``--nproc_per_node``); ``--standalone`` is accepted (one node is what runs without
    ``--nnodes``). mpirun's ``-np`` and torchrun's rendezvous options are usage errors that say
    what to write instead."""
    parser = subparsers.add_parser(
        "run", help="start N local ranks of a script with a torchrun-compatible environment",
        formatter_class=_HelpFormatter,
        description="Start N ranks of a Python script (or module) on this machine, with the environment "
        "variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), and show "
        "their output prefixed with [rank]. If a rank fails, the others are stopped and its exit code is "
        "returned; --timeout exits with 124.",
        epilog="Everything after the script (or module) name is passed to it. torchrun's underscore spellings "
        "are accepted too: --nproc_per_node, --node_rank, --master_addr, --master_port.")
    parser.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=_numbers.positive_int,
                        default=1, metavar="N", help="ranks to start on this node (default 1)")
    parser.add_argument("--nnodes", type=_numbers.positive_int, default=1, metavar="K",
                        help="number of nodes, each running its own 'hcclpy run' (default 1)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=_numbers.non_negative_int, default=0,
                        metavar="I", help="this node's index in 0..K-1 (default 0)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1", metavar="A",
                        help="address of the node hosting rank 0, where hcclpy.init's rendezvous listens "
                             "(default 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", dest="master_port", type=_numbers.port, default=None,
                        metavar="P", help="MASTER_PORT for the ranks; hcclpy.init's rendezvous listens on P+1 "
                                          "(P-1 for 65535). Required with --nnodes > 1; else two free ports "
                                          "are picked")
    parser.add_argument("--standalone", action="store_true",
                        help="one node (as torchrun's --standalone): what runs without --nnodes anyway")
    parser.add_argument("--timeout", type=_numbers.seconds, default=None, metavar="S",
                        help="stop every rank after S seconds and exit with 124")
    parser.add_argument("--grace", type=_numbers.seconds, default=DEFAULT_GRACE, metavar="S",
                        help=f"seconds between SIGTERM and SIGKILL when stopping ranks (default {DEFAULT_GRACE:g})")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="pass the ranks' output through as it is, without [rank] prefixes (prefixed, "
                             "bytes that are not UTF-8 are replaced and lines over 64 KiB are cut in pieces)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("-m", "--module", action="store_true",
                      help="the target is a module name, run as 'python -m module'")
    kind.add_argument("--no-python", action="store_true",
                      help="the target is an executable, run directly rather than with Python")
    parser.add_argument("-np", action=_Refuse, advice="that is mpirun's spelling; hcclpy run takes -n {value} "
                                                      "(or --nproc-per-node {value}, as torchrun)")
    for names, advice in _TORCHRUN_ONLY.items():
        parser.add_argument(*names, action=_Refuse, advice=f"torchrun's option, not hcclpy run's: {advice}")
    parser.add_argument("target", metavar="script.py | module | program", help="what each rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    parser.set_defaults(handler=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out ``hcclpy run`` with parsed arguments; return the launcher's exit status."""
    parser: argparse.ArgumentParser = args.parser
    if args.standalone and args.nnodes > 1:
        parser.error(f"--standalone is one node; --nnodes {args.nnodes} asks for several")
    if args.node_rank >= args.nnodes:
        parser.error(f"--node-rank {args.node_rank} must be below --nnodes {args.nnodes}")
    if args.nnodes > 1 and args.master_port is None:
        parser.error("--master-port is required with --nnodes > 1: every node must use the same port")
    if args.module:
        command = [sys.executable, "-m", args.target, *args.args]
    elif args.no_python:
        command = [args.target, *args.args]
    else:
        # What python itself runs: a file (a script or a zip archive), or a directory by its __main__.py.
        if os.path.isdir(args.target):
            if not os.path.isfile(os.path.join(args.target, "__main__.py")):
                parser.error(f"{args.target}: a directory without __main__.py, which Python would run")
        elif not os.path.isfile(args.target):
            parser.error(f"{args.target}: no such file (use -m for a module, --no-python for a program)")
        command = [sys.executable, args.target, *args.args]
    port = args.master_port if args.master_port is not None else free_port(args.master_addr)
    ranks = [RankSpec(local_rank=local, nproc=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                      master_addr=args.master_addr, master_port=port) for local in range(args.nproc)]
    env = None
    if args.master_port is not None:
        # A port the user chose: the rendezvous sits next to it, as with several nodes, not on
        # a free port picked at random.
        env = dict(os.environ)
        env.setdefault("HCCLPY_RENDEZVOUS_PORT", str(next_port(args.master_port)))
    return launch(command, ranks, timeout=args.timeout, grace=args.grace, prefix=args.prefix, env=env)


# ----------------------------------------------------------------------------- environment

@dataclass(frozen=True)
class RankSpec:
    """Where one local rank sits in the job: what its environment variables say."""

    local_rank: int
    nproc: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @property
    def rank(self) -> int:
        """The global rank: ``node_rank * nproc + local_rank``."""
        return self.node_rank * self.nproc + self.local_rank

    @property
    def world_size(self) -> int:
        """``nproc * nnodes``."""
        return self.nproc * self.nnodes


def rank_environment(spec: RankSpec, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of one rank: ``base`` (default ``os.environ``) without other launchers' rank
    variables, plus the torchrun variables, ``HCCLPY_LAUNCHER`` and ``PYTHONUNBUFFERED=1`` (unless
    ``base`` sets it).

    Examples
    --------
    >>> env = rank_environment(RankSpec(1, 2, 1, 0, "127.0.0.1", 29500), {})
    >>> env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]
    ('1', '2', '29500')
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in FOREIGN_RANK_VARIABLES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({
        "RANK": str(spec.rank), "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(spec.local_rank), "LOCAL_WORLD_SIZE": str(spec.nproc),
        "GROUP_RANK": str(spec.node_rank), "NODE_RANK": str(spec.node_rank), "GROUP_WORLD_SIZE": str(spec.nnodes),
        "ROLE_RANK": str(spec.rank), "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
        "HCCLPY_LAUNCHER": LAUNCHER,
    })
    return env


def rendezvous_port(spec: RankSpec) -> int:
    """The port for :func:`hcclpy.init`'s rendezvous: not ``MASTER_PORT``, which a script using
    ``torch.distributed`` too gives to torch's store. With one node a second free port; with
    several, the one after ``MASTER_PORT`` (every node's launcher must agree without talking)."""
    if spec.nnodes > 1:
        return next_port(spec.master_port)
    while True:
        port = free_port(spec.master_addr)
        if port != spec.master_port:
            return port


def next_port(master_port: int) -> int:
    """The rendezvous port next to ``master_port``: the one after it, or the one before 65535."""
    return master_port + 1 if master_port < 65535 else master_port - 1


# ---------------------------------------------------------------------------------- launch

def _exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: ``128 + n`` for a child killed by signal ``n``."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _parent_death_signal() -> Any:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the launcher dies (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the signal was armed
            os._exit(1)

    return arm


@dataclass
class _Sink:
    """The launcher's stdout or stderr, which the ranks' output goes to."""

    name: str
    out: BinaryIO
    encoding: str
    lost: bool = False  # a write failed: what the ranks send here is dropped from then on

    def write(self, text: str) -> None:
        """Write ``text`` (unencodable characters replaced); never raises: the ranks' pipes must be
        read on whatever becomes of the launcher's output, or they would block writing."""
        if self.lost:
            return
        try:
            self.out.write(text.encode(self.encoding, "replace"))
            self.out.flush()
        except (BrokenPipeError, ValueError):  # our own reader went away (| head): nothing to tell
            self.lost = True
            _output.to_devnull(self.out)  # what the write left buffered goes nowhere, not to a flush's error
        except OSError as exc:  # a full disk, a terminal that hung up...: say so, once
            self.lost = True
            _message(f"cannot write the ranks' output to {self.name} ({exc.strerror or exc}); dropping it "
                     "from now on")


@dataclass
class _Stream:
    """One pipe from a rank to the launcher's stdout or stderr."""

    prefix: str
    sink: _Sink
    pending: bytes = b""

    def feed(self, data: bytes) -> None:
        """Show the complete lines of ``data`` (after what is pending); keep the rest."""
        data = self.pending + data
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= _MAX_PENDING:
            end = len(data)
        self.pending = data[end:]
        if end:
            self._show(data[:end])

    def close(self) -> None:
        """Show what is pending as a last line."""
        if self.pending:
            data, self.pending = self.pending, b""
            self._show(data)

    def _show(self, data: bytes) -> None:
        lines = data.decode("utf-8", "replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        self.sink.write("".join(f"{self.prefix}{line}\n" for line in lines))


def _binary(stream: Any) -> Tuple[BinaryIO, str]:
    """The byte stream under a text stream, and the encoding to write to it."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return getattr(stream, "buffer", stream), encoding


@dataclass
class _Child:
    """One rank. Its process is reaped only when the launch closes: until then it stays a zombie
    once it exits, so its pid, which is its process group's id too, cannot be given to another
    process, and a signal to the group cannot reach a stranger's."""

    rank: int
    proc: "subprocess.Popen[bytes]"
    returncode: Optional[int] = None  # once it has exited
    done: bool = False  # its process group holds nothing more to stop: send it no more signals


class _Launch:
    """The ranks of one launch, their output pipes, and how the launch is ending.

    The signal handler (:meth:`on_signal`) runs on the main thread between two steps of
    :meth:`wait` or :meth:`close`, so the state needs no lock.
    """

    def __init__(self, grace: float, prefix: bool) -> None:
        self.children: List[_Child] = []
        self.grace = grace
        self.prefix = prefix
        self.selector = selectors.DefaultSelector()
        self.status: Optional[int] = None  # the exit status, once something decided it
        self.signal: Optional[int] = None  # the signal the launcher received, if any
        self.stopping = False
        self.kill_at: Optional[float] = None  # when ranks still running get SIGKILL
        # With HCCLPY_TRACE_DIR set: the pipe whose write end closing asks the ranks to dump their
        # flight recorders (hcclpy.trace), and the stop that waits for them meanwhile.
        self.dump_pipe: Optional[Tuple[int, int]] = None
        self.stop_after_dumps: Optional[Tuple[int, float]] = None  # (signal, when)

    # -- starting

    def start(self, command: Sequence[str], ranks: Sequence[RankSpec], env: Optional[Mapping[str, str]]) -> None:
        """Start one child per rank (stopping early on a signal or when a child cannot start)."""
        sinks = [_Sink("stdout", *_binary(sys.stdout)), _Sink("stderr", *_binary(sys.stderr))]
        pipe = subprocess.PIPE if self.prefix else None
        preexec = _parent_death_signal()
        base = dict(os.environ if env is None else env)
        if all(spec.nnodes == 1 for spec in ranks):
            # One node: the ranks share a fresh secret for hcclpy.init's rendezvous (with several
            # nodes each launcher would pick its own, so the user sets it for the whole job).
            base.setdefault("HCCLPY_RENDEZVOUS_TOKEN", secrets.token_hex(16))
        if ranks:
            base.setdefault("HCCLPY_RENDEZVOUS_PORT", str(rendezvous_port(ranks[0])))
        keep: Tuple[int, ...] = ()
        if base.get("HCCLPY_TRACE_DIR"):
            from .._environment import DUMP_PIPE_VARIABLE

            self.dump_pipe = os.pipe()
            keep = (self.dump_pipe[0],)
            base[DUMP_PIPE_VARIABLE] = f"{keep[0]}:{os.fstat(keep[0]).st_ino}"
        for spec in ranks:
            if self.signal is not None:
                return
            try:
                # A session of its own: a terminal's Ctrl-C reaches the launcher only, which forwards
                # it once, and stopping a rank stops the processes it started too.
                proc = subprocess.Popen(list(command), env=rank_environment(spec, base), stdin=subprocess.DEVNULL,
                                        stdout=pipe, stderr=pipe, start_new_session=True, preexec_fn=preexec,
                                        pass_fds=keep)
            except OSError as exc:
                _message(f"cannot start rank {spec.rank}: {command[0]}: {exc.strerror or exc}")
                self.status = 127
                self.stop()
                return
            self.children.append(_Child(spec.rank, proc))
            if self.prefix:
                for pipe_file, sink in zip((proc.stdout, proc.stderr), sinks):
                    os.set_blocking(pipe_file.fileno(), False)
                    self.selector.register(pipe_file, selectors.EVENT_READ, _Stream(f"[{spec.rank}] ", sink))

    # -- stopping

    def running(self) -> List[_Child]:
        return [child for child in self.children if child.returncode is None]

    def send(self, signum: int) -> None:
        """Send ``signum`` to the process group of every rank, the ranks that exited too: what a
        rank started (in its group) stops with the job, whether the rank is still there or not."""
        for child in self.children:
            if not child.done:
                _signal_group(child.proc.pid, signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to every rank's process group now, SIGKILL after the grace period."""
        self.stopping = True
        self.stop_after_dumps = None
        self.send(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def stop_with_dumps(self, signum: int = signal.SIGTERM) -> None:
        """:meth:`stop`, after asking the ranks for their flight recorders' dumps (when
        HCCLPY_TRACE_DIR is set) and giving them ``_DUMP_WAIT`` seconds to write them: a job that
        runs out of time or is interrupted is usually stuck, and the dumps say where."""
        if self.dump_pipe is None or self.stop_after_dumps is not None:
            self.stop(signum)
            return
        for fd in reversed(self.dump_pipe):  # the write end first: every rank's dump thread sees the end
            os.close(fd)
        self.dump_pipe = None
        self.stopping = True
        self.stop_after_dumps = (signum, time.monotonic() + _DUMP_WAIT)

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: no more grace
            self.send(signal.SIGKILL)
            return
        self.signal = signum
        self.stop_with_dumps(signum)

    # -- waiting

    def wait(self, timeout: Optional[float]) -> None:
        """Show the ranks' output until all have exited, stopping them on a failure or at ``timeout``
        (what they leave behind is :meth:`close`'s to stop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.running():
            now = time.monotonic()
            dumped_by = self.stop_after_dumps[1] if self.stop_after_dumps else None
            pause = min(t - now for t in (now + _POLL, deadline, self.kill_at, dumped_by) if t is not None)
            self._show_output(max(0.0, pause))
            self._reap()
            now = time.monotonic()
            if deadline is not None and now >= deadline and not self.stopping and self.running():
                _message(f"timed out after {timeout:g} s; stopping {len(self.running())} rank(s)")
                self.status = EXIT_TIMEOUT
                self.stop_with_dumps()
            if self.stop_after_dumps is not None and now >= self.stop_after_dumps[1]:
                self.stop(self.stop_after_dumps[0])
            if self.kill_at is not None and now >= self.kill_at:
                if self.running():
                    _message(f"{len(self.running())} rank(s) still running after {self.grace:g} s; sending SIGKILL")
                    self.send(signal.SIGKILL)
                self.kill_at = None

    def _show_output(self, timeout: float) -> None:
        if not self.selector.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            _read(self.selector, key)

    def _reap(self) -> None:
        for child in self.running():
            code = _exit_code(child.proc)
            if code is None:
                continue
            child.returncode = code
            if code != 0 and not self.stopping:  # the first failure; later exits are our doing
                others = len(self.running())
                _message(f"rank {child.rank} {_describe(code)}" + (f"; stopping the other {others} rank(s)"
                                                                    if others else ""))
                self.status = _exit_status(code)
                self.stop()

    def close(self) -> None:
        """End the launch: stop what the ranks left running (SIGTERM to every rank's process group,
        SIGKILL after the grace period), show what the pipes still hold, close them, reap the ranks."""
        try:
            self.stop(self.stop_after_dumps[0] if self.stop_after_dumps else signal.SIGTERM)
            self._await_groups()
        finally:
            for fd in self.dump_pipe or ():
                os.close(fd)
            self.dump_pipe = None
            self.send(signal.SIGKILL)  # what an error here left, or what resisted the SIGKILL so far
            self._drain()
            for child in self.children:
                child.done = True  # once reaped, its group's id may be given to another process
                child.proc.wait()

    def _await_groups(self) -> None:
        """Show output until no rank's process group holds a live process; at ``kill_at`` SIGKILL
        what is left, and give it ``_KILL_WAIT`` seconds to vanish."""
        give_up: Optional[float] = None
        while True:
            live = _live_groups(child.proc.pid for child in self.children if not child.done)
            for child in self.children:
                child.done = child.done or child.proc.pid not in live
            now = time.monotonic()
            if not live or (give_up is not None and now >= give_up):
                return
            if give_up is None and (self.kill_at is None or now >= self.kill_at):
                ranks = ", ".join(str(child.rank) for child in self.children if not child.done)
                _message(f"processes of rank(s) {ranks} still running after {self.grace:g} s; sending SIGKILL")
                self.send(signal.SIGKILL)
                give_up = now + _KILL_WAIT
            until = give_up if give_up is not None else self.kill_at
            self._show_output(max(0.0, min(_POLL, until - now)))

    def _drain(self) -> None:
        """Show what the pipes still hold and close them."""
        for key in list(self.selector.get_map().values()):
            if not _read(self.selector, key, drain=True):  # still open: a writer outside the rank's group
                _close(self.selector, key)
        self.selector.close()

    def exit_status(self) -> int:
        if self.status is not None:
            return self.status
        return 128 + self.signal if self.signal is not None else 0


def _exit_code(proc: "subprocess.Popen[bytes]") -> Optional[int]:
    """``proc``'s return code once it has exited, else None, leaving it a zombie (see :class:`_Child`)."""
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (AttributeError, ChildProcessError):  # no waitid, or already reaped: poll() knows
        return proc.poll()
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; return whether the group exists (and is ours)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _live_groups(pgids: Iterable[int]) -> Set[int]:
    """Those of the process groups ``pgids`` that hold a process other than a zombie.

    Read from /proc: ``killpg(pgid, 0)`` counts zombies too, the unreaped rank itself and the
    orphans it leaves under an init that never reaps them (as some containers' does)."""
    wanted = set(pgids)
    if not wanted:
        return set()
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the zombies keep a group alive until the grace period ends
        return {pgid for pgid in wanted if _signal_group(pgid, 0)}
    live: Set[int] = set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            state, _ppid, pgrp = stat[stat.rindex(b")") + 2:].split(maxsplit=3)[:3]
        except (OSError, ValueError):  # gone meanwhile
            continue
        if state not in (b"Z", b"X") and int(pgrp) in wanted:
            live.add(int(pgrp))
    return live


def _message(text: str) -> None:
    try:
        print(f"hcclpy run: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # no stderr to tell (a full disk, a closed terminal): the exit status still does
        pass


def launch(command: Sequence[str], ranks: Sequence[RankSpec], *, timeout: Optional[float] = None,
           grace: float = DEFAULT_GRACE, prefix: bool = True, env: Optional[Mapping[str, str]] = None) -> int:
    """Run ``command`` once per rank of ``ranks`` and wait for all of them.

    Parameters
    ----------
    command
        The program and its arguments, e.g. ``[sys.executable, "train.py", "--lr", "0.1"]``.
    ranks
        One :class:`RankSpec` per local rank; each child gets :func:`rank_environment` of it.
    timeout
        Seconds after which every rank is stopped; None waits as long as they run.
    grace
        Seconds between SIGTERM and SIGKILL when stopping ranks and the processes they started.
    prefix
        Prefix each output line with ``[rank] ``; False lets the ranks write to the launcher's
        stdout and stderr directly.
    env
        The base environment; default ``os.environ``.

    Returns
    -------
    int
        0 if every rank exited with 0; else the exit status of the first rank that failed
        (``128 + n`` for signal ``n``), 124 on timeout, ``128 + n`` when the launcher received
        signal ``n``, 127 when the program cannot be started.

    Examples
    --------
    >>> specs = [RankSpec(i, 2, 1, 0, "127.0.0.1", free_port()) for i in range(2)]
    >>> launch([sys.executable, "-c", "import os; print(os.environ['RANK'])"], specs)  # doctest: +SKIP
    [0] 0
    [1] 1
    0
    """
    state = _Launch(grace, prefix)
    with forwarded_signals(state.on_signal):
        try:
            state.start(command, ranks, env)
            state.wait(timeout)
        finally:
            state.close()  # under our handlers: a signal now hastens the end rather than interrupting it
    return state.exit_status()


@contextlib.contextmanager
def forwarded_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Handle the signals a launcher forwards (SIGINT, SIGTERM, SIGHUP, SIGQUIT) with ``handler``
    inside the block, as before after it; off the main thread, where Python cannot set handlers,
    leave them as they are."""
    saved: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _FORWARDED:
            saved[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)


def _read(selector: selectors.BaseSelector, key: selectors.SelectorKey, *, drain: bool = False) -> bool:
    """Show what a rank's pipe holds (once, or with ``drain`` until it is empty or ``_DRAIN_LIMIT``
    bytes were read: a writer that keeps writing would keep it from ever being empty); close it at
    EOF. Return whether it was closed."""
    left = _DRAIN_LIMIT
    while left > 0:
        try:
            data = os.read(key.fd, _READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            _close(selector, key)
            return True
        key.data.feed(data)
        left -= len(data)
        if not drain:
            return False
    return False


def _close(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    key.data.close()
    selector.unregister(key.fileobj)
    key.fileobj.close()
