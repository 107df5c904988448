"""Run one function as N ranks, as threads of this process or as fresh processes.

Every rank calls ``fn(rank, size, root_info_bytes, *args)`` with its current device already set to
``rank``; ``root_info_bytes`` comes from ``hcclpy.RootInfo.generate(device=0)`` in the calling
(pytest) process, which stays alive while the ranks run. The return values come back as a list in
rank order. If a rank raises, :class:`RanksFailed` (an ``AssertionError``, so pytest reports a
failure) is raised with every rank's traceback; with ``return_exceptions=True`` the failed ranks'
entries are :class:`RankError` objects instead.

Nothing may hang CI: every run has a hard ``timeout``. Processes still running then are killed;
threads cannot be killed, so they are daemon threads and the test fails with
:class:`RanksTimedOut` while they are left behind (blocked in C at worst until ``HCCL_EXEC_TIMEOUT``).
The ranks get a short ``HCCL_EXEC_TIMEOUT`` / ``HCCL_CONNECT_TIMEOUT`` (:data:`RANK_ENV`) so a bug
ends in an error rather than a long wait.

Functions run as processes are pickled by reference: define them at module level in a module the
children can import (test modules are: the fork server the processes come from has the test
process's ``sys.path``). Each process runs in the test's current environment and directory.

Examples
--------
>>> def body(rank, size, info, count):
...     comm = hcclpy.Communicator(size, info, rank, device=rank)
...     ...
...     return result
>>> results = ranks.run("processes", body, 4, 16)
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing
import os
import pickle
import queue as queue_module
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

MODES = ("threads", "processes")

# Short enough that a bug ends the run in an error well before the runner's own timeout.
RANK_ENV: Dict[str, str] = {"HCCL_EXEC_TIMEOUT": "30", "HCCL_CONNECT_TIMEOUT": "30"}

DEFAULT_TIMEOUT = {"threads": 60.0, "processes": 120.0}

_EXIT_GRACE = 1.0  # seconds a dead process gets to deliver a result it queued before exiting


def launcher(name: str, ranks: int) -> List[str]:
    """The command that starts ``ranks`` copies of a program under a real launcher: ``torchrun``
    (torch's, on a free port) or ``mpiexec`` (from the ``mpich`` wheel, or any MPI on PATH); the
    program and its arguments follow."""
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    if name == "mpiexec":
        found = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                               os.environ.get("PATH", "")]))
        if not found:
            import pytest

            pytest.skip("no mpiexec on PATH: the test extra installs the mpich wheel (pip install -e '.[test]')")
        return [found, "-n", str(ranks), sys.executable]
    raise ValueError(f"launcher {name!r} must be 'torchrun' or 'mpiexec'")


class RankError:
    """What one failed rank left: the exception (when it could be carried over), its traceback text
    and, for a process that died without reporting, its exit code."""

    def __init__(self, rank: int, exception: Optional[BaseException], text: str, exitcode: Optional[int] = None):
        self.rank = rank
        self.exception = exception
        self.traceback = text
        self.exitcode = exitcode

    def __repr__(self) -> str:
        if self.exception is None:
            return f"<RankError rank {self.rank}: exit code {self.exitcode}>"
        return f"<RankError rank {self.rank}: {type(self.exception).__name__}: {self.exception}>"


class RanksFailed(AssertionError):
    """One or more ranks raised (or died); the message holds every rank's traceback."""

    def __init__(self, message: str, errors: Sequence[RankError]):
        super().__init__(message)
        self.errors = list(errors)


class RanksTimedOut(RanksFailed):
    """Some ranks had not finished when the run's timeout passed."""


def _describe(errors: Sequence[RankError], header: str) -> str:
    parts = [header]
    for error in errors:
        parts.append(f"--- rank {error.rank} ---")
        parts.append(error.traceback.rstrip() if error.traceback else repr(error))
    return "\n".join(parts)


def _root_info(servers: Optional[Sequence[str]] = None) -> bytes:
    import hcclpy

    if not servers:
        return hcclpy.RootInfo.generate(device=0).to_bytes()
    # A root info for ranks on several simulated servers: the simulator reads HCCLPY_SIM_SERVER
    # when it makes one, and then serves it over TCP from this process.
    saved = os.environ.get("HCCLPY_SIM_SERVER")
    os.environ["HCCLPY_SIM_SERVER"] = "pytest"
    try:
        return hcclpy.RootInfo.generate(device=0).to_bytes()
    finally:
        if saved is None:
            del os.environ["HCCLPY_SIM_SERVER"]
        else:
            os.environ["HCCLPY_SIM_SERVER"] = saved


def _finish(size: int, outcomes: Dict[int, Any], errors: Dict[int, RankError], missing: Sequence[int],
            mode: str, timeout: float, return_exceptions: bool) -> List[Any]:
    if missing:
        ordered = [errors[r] for r in sorted(errors)]
        raise RanksTimedOut(_describe(ordered, f"{mode}: rank(s) {list(missing)} of {size} did not finish within "
                                              f"{timeout:g} s"), ordered)
    if errors and not return_exceptions:
        ordered = [errors[r] for r in sorted(errors)]
        raise RanksFailed(_describe(ordered, f"{mode}: {len(errors)} of {size} rank(s) failed"), ordered)
    return [errors[r] if r in errors else outcomes[r] for r in range(size)]


# ------------------------------------------------------------------------------ threads

def run_threads(fn: Callable[..., Any], size: int, *args: Any, timeout: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None, return_exceptions: bool = False,
                root_info: Optional[bytes] = None) -> List[Any]:
    """Run ``fn`` as ``size`` daemon threads of this process (see the module docstring)."""
    import hcclpy

    timeout = DEFAULT_TIMEOUT["threads"] if timeout is None else timeout
    info = _root_info() if root_info is None else root_info
    variables = {**RANK_ENV, **(env or {})}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)  # read by the C library when each communicator is created
    outcomes: Dict[int, Any] = {}
    errors: Dict[int, RankError] = {}

    def body(rank: int) -> None:
        try:
            hcclpy.Device(rank).set_current()
            outcomes[rank] = fn(rank, size, info, *args)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[rank] = RankError(rank, exc, traceback.format_exc())

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(size)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    missing = [r for r, thread in enumerate(threads) if thread.is_alive()]
    return _finish(size, outcomes, errors, missing, "threads", timeout, return_exceptions)


# ---------------------------------------------------------------------------- processes

def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def _child_main(fn: Callable[..., Any], rank: int, size: int, info: bytes, args: tuple, env: Dict[str, str],
                cwd: str, results: Any, hang_report_after: float) -> None:
    # Forked from the fork server, which started with the environment of its own start: this
    # rank takes the test's, as a spawned process would.
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # If this rank hangs, its stacks reach the test's output before the parent kills it.
    faulthandler.dump_traceback_later(hang_report_after, exit=False)
    try:
        from hcclpy import SimulatorFallbackWarning

        warnings.simplefilter("ignore", SimulatorFallbackWarning)  # once per process, 8 processes: noise
        import hcclpy

        hcclpy.Device(rank).set_current()
        payload = ("ok", fn(rank, size, info, *args))
        try:
            pickle.dumps(payload)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"rank {rank} returned a value that cannot be pickled: {exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        payload = ("error", _portable(exc), traceback.format_exc())
    finally:
        faulthandler.cancel_dump_traceback_later()
    results.put((rank, payload))
    sys.stdout.flush()
    sys.stderr.flush()


# What the fork server imports too when the test session has imported torch (its torch tests
# were collected): torch, torch.distributed, the backend, and torch._dynamo, which DDP's
# constructor imports (seconds of CPU a rank, paid once instead).
TORCH_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "hcclpy.torch"]

# What every rank imports: this module (which imports ml_dtypes: over a second of CPU), and the
# test module its function comes from, which imports pytest and hypothesis.
PRELOAD = ["numpy", "hcclpy", "pytest", "hypothesis", "ranks"]


def _process_context() -> Any:
    """Ranks are forked from a fork server that has imported what they all import (NumPy,
    hcclpy, which loads no library until asked, this module, and torch when this session uses
    it): a process that has not touched the runtime, as a spawned one, for a fraction of an
    interpreter's start. The fork server starts with the first run, after pytest collected
    (imported) every test module."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD + (TORCH_PRELOAD if "torch" in sys.modules else []))
    _start_fork_server()
    return context


def _start_fork_server() -> None:
    """Start the fork server (once) with this process's ``sys.path``. Python 3.11's fork server
    ignores the path multiprocessing hands it, and its preload skips a module it cannot import
    without a word: the tests' own modules were imported again by every rank. The server gets the
    path as PYTHONPATH for its start only; the ranks run in the test's environment."""
    from multiprocessing import forkserver

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def run_processes(fn: Callable[..., Any], size: int, *args: Any, timeout: Optional[float] = None,
                  env: Optional[Mapping[str, str]] = None, return_exceptions: bool = False,
                  root_info: Optional[bytes] = None, servers: Optional[Sequence[str]] = None) -> List[Any]:
    """Run ``fn`` as ``size`` fresh processes (see the module docstring). With ``servers`` (one
    name a rank), each rank runs on that simulated server (``HCCLPY_SIM_SERVER``): ranks of
    different servers talk over TCP."""
    timeout = DEFAULT_TIMEOUT["processes"] if timeout is None else timeout
    if servers is not None and len(servers) != size:
        raise ValueError(f"servers names {len(servers)} servers for {size} ranks")
    info = _root_info(servers) if root_info is None else root_info
    variables = {**os.environ, **RANK_ENV, **(env or {})}

    def rank_env(rank: int) -> Dict[str, str]:
        if servers is None:
            return variables
        return {**variables, "HCCLPY_SIM_SERVER": servers[rank], SERVERS_VARIABLE: ",".join(servers)}

    context = _process_context()
    results = context.Queue()
    processes = [
        context.Process(target=_child_main, name=f"rank{r}", daemon=True,
                        args=(fn, r, size, info, args, rank_env(r), os.getcwd(), results, max(1.0, timeout - 5.0)))
        for r in range(size)
    ]
    outcomes: Dict[int, Any] = {}
    errors: Dict[int, RankError] = {}
    dead_since: Dict[int, float] = {}
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.start()
        while len(outcomes) + len(errors) < size:
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                rank, payload = results.get(timeout=min(0.1, deadline - now))
            except queue_module.Empty:
                now = time.monotonic()
                for rank, process in enumerate(processes):
                    if rank in outcomes or rank in errors or process.exitcode is None:
                        continue
                    if now - dead_since.setdefault(rank, now) > _EXIT_GRACE:
                        errors[rank] = RankError(rank, None, f"rank {rank} exited with code {process.exitcode} "
                                                             "without reporting a result", process.exitcode)
                continue
            if payload[0] == "ok":
                outcomes[rank] = payload[1]
            else:
                errors[rank] = RankError(rank, payload[1], payload[2])
    finally:
        for process in processes:
            process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join(5.0)
        results.close()
        results.cancel_join_thread()
    missing = [r for r in range(size) if r not in outcomes and r not in errors]
    return _finish(size, outcomes, errors, missing, "processes", timeout, return_exceptions)


@dataclasses.dataclass(frozen=True)
class RankMatrix:
    """One cell of the rank matrix (conftest's ``rank_matrix`` fixture): ``size`` ranks as threads
    of this process or as processes."""

    mode: str
    size: int

    def run(self, fn: Callable[..., Any], *args: Any, **options: Any) -> List[Any]:
        """``fn(rank, size, root_info, *args)`` on every rank (:func:`run`); results by rank."""
        return run(self.mode, fn, self.size, *args, **options)


def run(mode: str, fn: Callable[..., Any], size: int, *args: Any, **options: Any) -> List[Any]:
    """``run_threads`` or ``run_processes``, by ``mode`` (one of :data:`MODES`)."""
    if mode == "threads":
        return run_threads(fn, size, *args, **options)
    if mode == "processes":
        return run_processes(fn, size, *args, **options)
    raise ValueError(f"mode={mode!r} must be one of {MODES}")


# ------------------------------------------------------------------- NumPy references

try:
    import ml_dtypes  # noqa: F401
    HAVE_BF16 = True
except ImportError:  # bfloat16 cases are skipped without it
    HAVE_BF16 = False

# Every HCCL data type, by NumPy name (bfloat16 needs ml_dtypes).
DTYPES = ("int8", "int16", "int32", "float16", "float32", "int64", "uint64", "uint8", "uint16", "uint32",
          "float64") + (("bfloat16",) if HAVE_BF16 else ())
FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
REDUCE_OPS = ("sum", "prod", "max", "min")


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype for one of :data:`DTYPES`."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def make_input(tag: str, rank: int, count: int, dtype: str, op: Optional[str] = None) -> np.ndarray:
    """Deterministic input of ``rank`` for the case ``tag`` (every rank can compute every rank's).

    For reductions (``op`` given) magnitudes stay small so integer sums and products are exact and
    fp16/bf16 products exact; fp16/bf16 sums get fractional values so the once-rounded fp32
    accumulation is exercised. For data motion (``op=None``) values span the type's range.
    """
    rng = np.random.default_rng([zlib.crc32(tag.encode()), rank])
    dt = np_dtype(dtype)
    signed = dtype in FLOATS or dtype.startswith("int")
    if op == "prod":
        magnitude = rng.integers(1, 3, count) if rank < 4 else np.ones(count, dtype=np.int64)
        sign = rng.choice([-1, 1], count) if signed else 1
        return (magnitude * sign).astype(dt)
    if dtype in FLOATS:
        scale = 4.0 if op is not None else 1000.0
        return (rng.standard_normal(count) * scale).astype(np.float32 if dtype == "bfloat16" else dt).astype(dt)
    if op is not None:
        return (rng.integers(-8, 9, count) if signed else rng.integers(0, 16, count)).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)


_UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


# Set by run_processes(servers=...) in every rank: which server each rank is on, comma-separated.
SERVERS_VARIABLE = "HCCLPY_TEST_SERVERS"


def _reduce_in_order(inputs: Sequence[np.ndarray], op: str, dtype: str) -> np.ndarray:
    dt = np_dtype(dtype)
    acc_dt = np.dtype(np.float32) if dtype in ("float16", "bfloat16") else dt
    ufunc = _UFUNCS[op]
    acc = np.asarray(inputs[0]).astype(acc_dt)
    for x in inputs[1:]:
        acc = ufunc(acc, np.asarray(x).astype(acc_dt))
    return acc.astype(dt)


def reduce_reference(inputs: Sequence[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """``inputs[0] op inputs[1] op ...`` in rank order, as the simulator computes it (fp16 and bf16
    accumulate in fp32 and round once; integers wrap). For ranks on several servers
    (:data:`SERVERS_VARIABLE`), in the simulator's hierarchical order: each server's ranks in rank
    order, then the servers' results in the order of their lowest ranks."""
    layout = os.environ.get(SERVERS_VARIABLE, "").split(",")
    if len(layout) != len(inputs) or len(set(layout)) < 2:
        return _reduce_in_order(inputs, op, dtype)
    servers = list(dict.fromkeys(layout))
    partial = [_reduce_in_order([x for x, s in zip(inputs, layout) if s == server], op, dtype) for server in servers]
    return _reduce_in_order(partial, op, dtype)


def mismatch(name: str, got: np.ndarray, want: np.ndarray) -> Optional[str]:
    """None if ``got`` equals ``want`` bit for bit (dtype and shape too), else a description."""
    if got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes():
        return None
    with np.printoptions(threshold=40, edgeitems=8):
        return f"{name}: got {got.dtype}{got.shape} {got!r}, want {want.dtype}{want.shape} {want!r}"


SIM_SHM_PREFIX = "hcclpy"  # what the simulator would name anything it left in /dev/shm


def simulator_shm() -> List[str]:
    """The simulator's entries in /dev/shm (its device memory is memfd, so normally none); other
    programs' files there come and go at any time and are not looked at."""
    try:
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith(SIM_SHM_PREFIX))
    except OSError:
        return []


def interrupt_soon(delay: float) -> None:
    """Send this process SIGINT after ``delay`` seconds, as Ctrl-C would, with Python's handler
    installed first (from the main thread, where rank processes run): a suite started with SIGINT
    ignored, as a non-interactive shell starts background jobs, passes the ignoring on to every
    process it starts, and the signal would do nothing."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which an init that does not reap leaves behind, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
