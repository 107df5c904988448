"""The flight recorder: which operations this process queued, on which communicator, and how far
each got — for finding out, when a job stalls, which rank was doing what.

Every operation hcclpy queues is recorded in a bounded ring (``HCCLPY_TRACE_SIZE`` operations,
default 1024; ``HCCLPY_TRACE=0`` turns recording off): its sequence number in its communicator, the
operation, count, data type, reduce op or root or peer, the communicator's name, instance and rank,
the stream and the time it was queued. Collectives are numbered 1, 2, ... in the order the rank
issued them, so the same collective has the same number on every rank; sends, receives and batches
of them are numbered apart, per rank, since ranks legitimately issue different ones. The
simulator's messages use the same numbers (``all_reduce #3``, ``send p2p #2``). Communicators that
share a name (one destroyed and another created under its name, say) are told apart by their
*instance*: the k-th communicator of that name (and size) created for that rank in the process. Its
state comes from what the process has seen since: a stream synchronisation, a stream query or an
event that completed marks everything queued before it as *completed* (at that time at the latest),
a synchronisation that failed marks what it waited for and was not known complete as *failed* (one
of them failed; those before it may have completed), and the rest is *pending* (queued or running).

:func:`dump` writes the records as JSON and as a Chrome trace (``chrome://tracing``, Perfetto).
With ``HCCLPY_TRACE_DIR`` set, every process dumps into that directory by itself (at most once a
second) when an operation fails: it times out, detects a desync, fails with an
:class:`~hcclpy.HcclError`, or finds another rank gone or failed (a
:class:`~hcclpy.RemoteRankError`). A wait that merely gives up (``Stream.synchronize(timeout=)``,
``Event.synchronize(timeout=)``) dumps too, as it is often the first sign of a stall, but only when
operations were queued since the last such dump: a program that polls does not rewrite it. A
process also dumps on SIGTERM, the signal launchers stop a job with, before it ends by it.
``hcclpy trace merge DIR`` merges the dumps of all ranks and says which rank is behind.

Examples
--------
>>> comm.all_reduce(x, y, stream=s); s.synchronize()
>>> hcclpy.trace.records()[-1]["op"], hcclpy.trace.records()[-1]["state"]
('all_reduce', 'completed')
>>> hcclpy.trace.dump("rank0.json")     # and rank0.chrome.json
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Union

from . import _environment, _ffi, _trace
from ._launchers import launch_rank
from .errors import AclError, AclErrorCode, CommTimeoutError, HcclError, RemoteRankError
from .types import DataType, ReduceOp

__all__ = ["chrome_trace", "dump", "enabled", "records", "set_enabled"]

_OPERATIONS = {
    "HcclAllReduce": "all_reduce", "HcclReduce": "reduce", "HcclBroadcast": "broadcast",
    "HcclAllGather": "all_gather", "HcclAllGatherV": "all_gather_v", "HcclReduceScatter": "reduce_scatter",
    "HcclReduceScatterV": "reduce_scatter_v", "HcclAlltoAll": "all_to_all", "HcclAlltoAllV": "all_to_all_v",
    "HcclAlltoAllVC": "all_to_all_vc", "HcclScatter": "scatter", "HcclSend": "send", "HcclRecv": "recv",
    "HcclBatchSendRecv": "batch_send_recv", "HcclBarrier": "barrier",
}
_REDUCING = {"all_reduce", "reduce_scatter", "reduce_scatter_v"}
_ROOTED = {"broadcast", "scatter"}
_PEERED = {"send", "recv"}

# perf_counter_ns is per process: dumps carry both clocks, so ranks' times line up when merged.
_WALL_AT, _PERF_AT = time.time_ns(), time.perf_counter_ns()


def enabled() -> bool:
    """Whether operations are being recorded."""
    return _trace.enabled


def set_enabled(on: bool) -> None:
    """Turn recording on or off for this process (``HCCLPY_TRACE=0`` starts it off).

    Raises
    ------
    TypeError
        If ``on`` is not ``True`` or ``False`` (a NumPy bool is accepted).

    Examples
    --------
    >>> hcclpy.trace.set_enabled(False)
    """
    _trace.set_enabled(on)


_POINT_TO_POINT = frozenset({"send", "recv", "batch_send_recv"})


def _describe(record: tuple) -> Dict[str, Any]:
    queued, (comm, rank, size, instance), seq, api, count, dtype, detail, progress, stream = record
    operation = _OPERATIONS.get(api, api)
    state = "completed" if queued < progress[0] else "failed" if queued < progress[1] else "pending"
    p2p = operation in _POINT_TO_POINT
    item: Dict[str, Any] = {
        "comm": comm, "instance": instance, "rank": rank, "size": size, "seq": None if p2p else seq,
        "p2p_seq": seq if p2p else None, "op": operation, "count": count,
        "dtype": DataType(dtype).name.lower() if dtype >= 0 else None, "stream": stream,
        "queued_ns": _WALL_AT + queued - _PERF_AT, "state": state,
        "completed_by_ns": _WALL_AT + progress[2] - _PERF_AT if state == "completed" else None}
    if operation == "reduce":  # the one operation with both
        code, item["root"] = detail
        item["op_kind"] = ReduceOp(code).name.lower()
    elif operation in _REDUCING:
        item["op_kind"] = ReduceOp(detail).name.lower()
    elif operation in _ROOTED:
        item["root"] = detail
    elif operation in _PEERED:
        item["peer"] = detail
    return item


def records(comm: Any = None) -> List[Dict[str, Any]]:
    """The recorded operations, oldest first, as dicts (of one communicator's rank when ``comm``
    is given).

    Each holds ``comm`` (the name), ``instance`` (which communicator of that name: the k-th created
    for this rank in this process), ``rank``, ``size``, ``seq`` (collectives: the number in the
    communicator, 1, 2, ..., the same on every rank; None for point-to-point calls), ``p2p_seq``
    (sends, receives and batches: their own number on this rank, 1, 2, ...; None for collectives),
    ``op``, ``count``, ``dtype``, ``op_kind`` / ``root`` / ``peer``, ``stream``, ``queued_ns``,
    ``state`` (completed, failed, pending) and ``completed_by_ns`` (wall-clock ns; completion was
    known then at the latest)."""
    raw = _trace.records()
    if comm is not None:
        info = getattr(comm, "_trace_info", None)
        if info is None:
            raise TypeError(f"comm must be an hcclpy.Communicator or None, got {type(comm).__name__}")
        raw = [r for r in raw if r[1] == info]
    return [_describe(r) for r in raw]


def signature(item: Dict[str, Any]) -> str:
    """``all_reduce(count=8, fp32, sum)``: one operation as the simulator's messages write it."""
    parts = [f"count={item['count']}"] + ([item["dtype"]] if item["dtype"] else [])
    parts += [item["op_kind"]] if "op_kind" in item else []
    parts += [f"root={item['root']}"] if "root" in item else []
    parts += [f"peer={item['peer']}"] if "peer" in item else []
    return f"{item['op']}({', '.join(parts)})"


def label(item: Dict[str, Any]) -> str:
    """``#4 all_reduce(count=8, fp32, sum)`` for a collective, ``p2p #2 recv(count=8, fp32,
    peer=0)`` for a point-to-point call (numbered apart)."""
    if item.get("seq") is None and item.get("p2p_seq") is not None:
        return f"p2p #{item['p2p_seq']} {signature(item)}"
    return f"#{item['seq']} {signature(item)}"


def _process() -> Dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "rank": launch_rank(_environment.variables()),
            "dumped_ns": time.time_ns()}


def chrome_trace(items: List[Dict[str, Any]], process: Dict[str, Any]) -> Dict[str, Any]:
    """``items`` (from :func:`records`) as a Chrome trace: one track per communicator (its name,
    with ``[k]`` after it for the k-th of that name), one slice per operation from when it was
    queued to when it was known complete (or to the dump)."""
    name = process["rank"] if process["rank"] is not None else process["pid"]
    events: List[Dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": name,
                                     "args": {"name": f"rank {name} ({process['host']}, pid {process['pid']})"}}]
    for item in items:
        end = item["completed_by_ns"] or process["dumped_ns"]
        instance = item.get("instance", 1)
        track = item["comm"] if instance in (None, 1) else f"{item['comm']} [{instance}]"
        events.append({"ph": "X", "name": signature(item), "cat": item["state"], "pid": name,
                       "tid": f"{track} (rank {item['rank']})", "ts": item["queued_ns"] / 1e3,
                       "dur": max(end - item["queued_ns"], 0) / 1e3,
                       "args": {"seq": item["seq"], "p2p_seq": item.get("p2p_seq"), "state": item["state"],
                                "stream": item["stream"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def dump(path: Union[str, os.PathLike[str]]) -> Path:
    """Write this process's records to ``path`` (JSON) and a Chrome trace next to it
    (``name.chrome.json``); return the JSON file's path.

    Raises
    ------
    TypeError
        If ``path`` is not a str or an ``os.PathLike``.
    OSError
        If a file cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike (the JSON file to write), got {type(path).__name__}")
    target = Path(path)
    process = _process()
    items = records()
    target.write_text(json.dumps({**process, "records": items}, indent=1) + "\n")
    chrome = target.with_name(target.name[:-len(target.suffix)] if target.suffix else target.name)
    chrome = chrome.with_name(chrome.name + ".chrome.json")
    chrome.write_text(json.dumps(chrome_trace(items, process)) + "\n")
    return target


# ---------------------------------------------------------------- dumps when something fails

_last_auto = 0.0
_last_give_up: Any = None  # the newest record when a wait that gave up last dumped
_auto_lock = threading.Lock()
# A wait that gave up at its own timeout (the work goes on), as opposed to an operation that failed.
_GIVE_UPS = frozenset({AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT})


def _newest() -> Any:
    """The mark of the newest record (None when the ring is empty)."""
    try:
        return _trace.ring[-1][0]
    except IndexError:
        return None


def _should_dump(error: Exception) -> bool:
    """Whether ``error`` calls for a dump: an operation that timed out, desynchronised, failed with
    an HCCL error or met another rank's failure; a wait that gave up, the first time after new
    operations were queued; and at most once a second."""
    global _last_auto, _last_give_up
    if not isinstance(error, (HcclError, CommTimeoutError, RemoteRankError)) and "mismatch" not in str(error):
        return False
    give_up = isinstance(error, AclError) and error.code in _GIVE_UPS
    with _auto_lock:
        now = time.monotonic()
        if now - _last_auto < 1.0:
            return False
        if give_up:
            newest = _newest()
            if newest == _last_give_up:
                return False  # the same stall, already dumped: polling must not rewrite it
            _last_give_up = newest
        _last_auto = now
    return True


def _dump_into(directory: str) -> None:
    """This process's dump in ``directory`` (one file per process, the newest dump replacing it)."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        dump(Path(directory) / f"hcclpy-trace-{socket.gethostname()}-{os.getpid()}.json")
    except OSError:  # a failing dump must not hide the failure being reported
        pass


def _auto_dump(error: Exception) -> None:
    """Dump into ``HCCLPY_TRACE_DIR`` when ``error`` calls for it (see :func:`_should_dump`)."""
    directory = _environment.trace_dir()
    if directory and _trace.enabled and _should_dump(error):
        _dump_into(directory)


_ffi.on_failure(_auto_dump)

# ------------------------------------------------------- dumps when the launcher stops the job

def _serve_dump_requests() -> None:
    """Under ``hcclpy run`` with ``HCCLPY_TRACE_DIR`` set: a thread that dumps once the launcher
    closes its pipe. A thread, not a signal handler: the main thread of a stuck rank waits in C,
    where Python runs no handler. A process that inherited the variable but not the pipe (the
    descriptor is another file, or none) serves nothing."""
    directory, pipe = _environment.trace_dir(), _environment.dump_pipe()
    if not directory or not _trace.enabled or pipe is None:
        return
    fd, inode = pipe
    try:
        if os.fstat(fd).st_ino != inode:
            return
    except OSError:
        return

    def serve() -> None:
        try:
            os.read(fd, 1)  # returns when the launcher closes its end
        except OSError:
            return
        _dump_into(directory)

    threading.Thread(target=serve, name="hcclpy-dump-on-stop", daemon=True).start()


def _dump_on_sigterm() -> None:
    """With ``HCCLPY_TRACE_DIR`` set: a SIGTERM handler that dumps, then ends the process by
    SIGTERM as it would have ended without one. SIGTERM is how torchrun, srun and mpirun stop a
    job (before SIGKILL), so a job they stop while it hangs leaves its dumps too. The handler runs
    within 0.1 s of the signal even while the main thread waits for a stream (hcclpy's waits
    return to Python that often: :mod:`hcclpy.runtime._waits`). Installed only from the main
    thread and only over the default action: a program's own handler is left alone. A process
    forked after the import (a data-loader worker) holds a copy of the parent's records, so it
    does not dump them as its own."""
    directory = _environment.trace_dir()
    if (not directory or not _trace.enabled or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return
    installed_by = os.getpid()

    def dump_then_terminate(signum: int, frame: Any) -> None:
        if os.getpid() == installed_by:
            _dump_into(directory)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, dump_then_terminate)


_serve_dump_requests()
_dump_on_sigterm()
