"""A checked operation (:class:`Call`) and the ways to run it: now on a stream (:func:`launch`),
staged through device memory when its buffers are NumPy arrays, or again and again
(:class:`PersistentOp`).

The operation definitions (:mod:`._ops`) check their arguments and build a ``Call``: the C
function, its arguments but the stream, and its buffers with what it does to each (read,
written). Everything that follows a C call — raising its failure, the flight record, keeping
the buffers alive while queued work uses them (which also tells a read from the host what work
to wait for) — happens here, once for every path.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .. import _ffi, _trace
from .._comm_core import CommCore
from ..runtime import Stream
from ..runtime._graph import capturing, captures_here
from ..runtime._lifetime import CLOSES
from ..runtime._memory import copy_bytes
from ..runtime._stream import HOLD_CHECK
from . import _group, _staging
from ._buffers import Buffer

__all__ = ["Call", "PersistentOp", "READ", "WRITE", "call", "launch", "stream_of"]

READ, WRITE = 1, 2  # what an operation does to a buffer (both: in place)
_H2D, _D2H = 1, 2  # aclrtMemcpyKind


class Call:
    """One operation, checked and ready to queue on any stream of its communicator's device."""

    __slots__ = ("comm", "cfunc", "name", "args", "buffers", "roles", "result", "host", "record", "seq")

    comm: CommCore
    cfunc: Any                      # the C function
    name: str                       # its name, for errors and the flight recorder
    args: tuple                     # its arguments but the last, the stream
    buffers: Tuple[Buffer, ...]     # every buffer it reads or writes (held while queued work uses them)
    roles: Tuple[int, ...]          # READ and/or WRITE, for each buffer (what staging copies in and out)
    result: Any                     # what the operation returns
    host: bool                      # its buffers are NumPy arrays: staged through device memory
    record: tuple                   # what the flight recorder keeps of it (see hcclpy._trace)
    seq: Any                        # the counter that numbers it there (collectives, or point-to-point calls)


def call(comm: CommCore, name: str, args: tuple, buffers: Tuple[Buffer, ...], roles: Tuple[int, ...], count: int,
         dtype: int, detail: Any, result: Any, p2p: bool = False) -> Call:
    """Build the :class:`Call` of an operation whose arguments are checked (a mix of NumPy arrays
    and device buffers included: see :func:`._rules.same_dtype`). ``count``, ``dtype`` (HCCL's
    code) and ``detail`` (reduce op, root or peer, (op, root), or -1) are what the flight recorder
    shows of it; ``p2p`` numbers it with the point-to-point calls rather than the collectives."""
    c = object.__new__(Call)
    c.comm, c.cfunc, c.name, c.args, c.buffers, c.roles, c.result = (comm, getattr(comm._api, name), name, args,
                                                                     buffers, roles, result)
    c.host = buffers[0].host if buffers else False
    c.record = (comm._trace_info, name, count, dtype, detail)
    c.seq = comm._trace_p2p if p2p else comm._trace_seq
    return c


def stream_of(comm: CommCore, stream: Optional[Stream]) -> Stream:
    """``stream``, checked to be an open stream of the communicator's device; None: its default."""
    if stream is None:
        stream = comm._default_stream
        if stream is None or stream._live_device < 0:  # looked up once; again when closed or replaced
            stream = comm._default_stream = comm._device.default_stream
        return stream
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an hcclpy.Stream or None, got {type(stream).__name__}")
    if stream._live_device != comm._device_id:
        if stream._live_device < 0:
            raise ValueError("stream is closed")
        raise ValueError(f"stream is on device {stream._device_id} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")
    return stream


def _queued(c: Call, stream: Stream, rc: int, keep: Tuple[Any, ...]) -> None:
    """After the C call of ``c`` on ``stream`` returned ``rc``: raise its failure, or record it and
    keep ``keep`` alive until the stream is done with it: its Buffers (a DeviceArray's is made
    once, so holding it makes no object per call), or the staging's scratch arrays. DeviceArray.close
    and reads from the host look there for the work that uses an allocation (``_alloc``)."""
    if rc:
        raise _ffi.hccl_failure(rc, c.name)
    graph = stream._graph
    if graph is not None:  # recorded, not run: the graph holds what it uses
        graph._hold(keep, c.comm)
        return
    if _group.open_groups and _group.active():  # queued by HCCL when this thread's group ends: then
        _group.defer(stream._device_id, keep, lambda: _queued(c, stream, 0, keep))  # record it and hold
        return
    if _trace.enabled:
        _trace.ring.append((_trace.now(), next(c.seq), c.record, stream._progress, stream._handle))
    held = stream._held
    held.extend(keep)
    if len(held) > HOLD_CHECK:
        stream._seal_held()


def launch(c: Call, stream: Optional[Stream]) -> Any:
    """Queue ``c`` on ``stream`` (None: the device's default stream) and return its result; an
    operation on NumPy arrays is staged and returns once its result is in place."""
    if c.host:
        return _staged(c, stream)
    st = stream if type(stream) is Stream and stream._live_device == c.comm._device_id else stream_of(c.comm, stream)
    if capturing[0]:
        capture_rules(c, st)
    _queued(c, st, c.cfunc(*c.args, st._ptr_cdata), c.buffers)
    return c.result


def capture_rules(c: Call, stream: Stream) -> None:
    """Refuse what a capture under way forbids ``c`` on ``stream`` (asked when one is)."""
    graphs = captures_here()
    if c.host and graphs:
        raise RuntimeError(f"{c.name[4:]} on NumPy arrays cannot run inside a capture: it waits for its result, "
                           "which a capture never gives; capture operations on device buffers")
    if _group.active() and (graphs or stream._graph is not None):
        raise RuntimeError("hcclpy.group() and a capture cannot nest: capture the operations without the group, "
                           "or make the group outside the capture")
    if stream._graph is None and any(g._mode == "global" for g in graphs):
        raise RuntimeError(f"{c.name[4:]} was queued on {stream!r}, which does not capture, during a global-mode "
                           f"capture on {graphs[-1].stream!r} by this thread: pass stream= the capturing stream, "
                           "or capture with mode='relaxed'")


def _staged(c: Call, stream: Optional[Stream]) -> Any:
    """Run ``c``, whose buffers are NumPy arrays, on device scratch: copy in what it reads (and
    what it writes only in part: the elements it skips keep their values), queue the C call on the
    staging stream, wait, copy out what it writes."""
    if capturing[0]:
        capture_rules(c, stream_of(c.comm, None))
    if stream is not None:
        raise TypeError(f"stream= is for device buffers, got {type(stream).__name__}: calls on NumPy arrays block "
                        "on hcclpy's own stream of the communicator's device and return when the result is in "
                        "the array; drop stream=, or pass device buffers")
    staging = _staging.acquire(c.comm)
    try:
        plan: dict = {}  # one scratch buffer per distinct array (in place: send and recv are one)
        for buf, role in zip(c.buffers, c.roles):
            entry = plan.get(id(buf.ptr))
            if entry is None:
                plan[id(buf.ptr)] = [buf, role, None]
            else:
                entry[1] |= role
        for index, entry in enumerate(plan.values()):
            buf, role, _ = entry
            scratch = entry[2] = staging.buffer(f"buffer{index}", buf.count, buf.dtype)
            if role & READ:
                copy_bytes(scratch.ptr, buf.address, scratch.nbytes, _H2D)
        args = tuple(plan[id(a)][2]._cptr if id(a) in plan else a for a in c.args)
        if c.name == "HcclBatchSendRecv":  # the pointers are in the item array: a copy of it points to scratch
            items = _ffi.new("HcclSendRecvItem[]", max(len(c.buffers), 1))
            for index, buf in enumerate(c.buffers):  # item i is buffer i
                items[index] = c.args[0][index]
                items[index].buf = plan[id(buf.ptr)][2]._cptr
            args = (items,) + args[1:]
        st = staging.stream
        _queued(c, st, c.cfunc(*args, st._ptr_cdata), tuple(entry[2] for entry in plan.values()))
        staging.wait()
        for buf, role, scratch in plan.values():
            if role & WRITE:
                copy_bytes(buf.address, scratch.ptr, scratch.nbytes, _D2H)
    except BaseException:
        staging.unsettled = True  # work may still be queued that uses the scratch: see Staging.wait
        raise
    finally:
        _staging.give_back(staging)
    return c.result


class PersistentOp:
    """An operation checked once and started as often as wanted (MPI-4's persistent collectives:
    mpi4py's ``Allreduce_init``), made by the ``*_init`` methods of :class:`hcclpy.Communicator`.

    It holds its buffers and communicator alive; :meth:`close` (or the end of a ``with`` block)
    lets go of them. Starting it after one of its device arrays was closed, or its communicator
    destroyed, raises ``ValueError``. On NumPy arrays each start stages them and blocks.

    Examples
    --------
    >>> step = comm.all_reduce_init(grads, op="sum", stream=s)
    >>> for _ in range(1000):
    ...     step.start()
    >>> s.synchronize(); step.close()
    """

    __slots__ = ("_call", "_stream", "_args", "_checked", "_no_group", "_fast")

    def __init__(self, c: Call, stream: Optional[Stream]) -> None:
        self._call: Optional[Call] = c
        self._stream = None if stream is None else stream_of(c.comm, stream)
        # The C arguments with the stream it was made for: a start there builds no tuple.
        self._args = None if self._stream is None else c.args + (self._stream._ptr_cdata,)
        # The count of closes (arrays, streams, communicators) when what it uses was last found
        # open: while nothing closes, a start checks nothing else.
        self._checked = CLOSES[0]
        # HCCL refuses a batch between HcclGroupStart and HcclGroupEnd.
        self._no_group = c.name == "HcclBatchSendRecv"
        # A start without stream= on device buffers queues on the stream it was made for.
        self._fast = self._stream is not None and not c.host

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._call is None

    @property
    def operation(self) -> str:
        """The HCCL function it calls, such as ``"HcclAllReduce"``."""
        return self._live().name

    @property
    def result(self) -> Any:
        """The buffer it writes (what the operation returns), None where there is none."""
        return self._live().result

    def _live(self) -> Call:
        c = self._call
        if c is None:
            raise ValueError("operation on a closed PersistentOp")
        return c

    def _check(self) -> Call:
        """Refuse a start the operation can no longer make (asked when something was closed, or a
        group opened, since the last start found everything open)."""
        c = self._live()
        closes = CLOSES[0]  # read first: a close during the check counts again
        comm = c.comm
        if comm._handle is None or comm._aborted:
            comm._refuse_use()
        for buf in c.buffers:
            if buf._alloc is not None and buf._alloc.live_device < 0:
                raise ValueError(f"{c.name[4:]} cannot start: one of its device arrays was closed")
        if self._stream is not None:
            stream_of(comm, self._stream)  # refuses a closed stream
        if self._no_group and _group.active():
            raise RuntimeError("batch_send_recv cannot run inside hcclpy.group(): HCCL refuses HcclBatchSendRecv "
                               "between HcclGroupStart and HcclGroupEnd")
        if capturing[0]:  # the rules depend on the stream of each start: checked at every start then
            capture_rules(c, self._stream if self._stream is not None else stream_of(comm, None))
            return c
        self._checked = closes
        return c

    def start(self, stream: Optional[Stream] = None) -> Any:
        """Queue the operation on ``stream`` (None: the stream given when it was made, else the
        device's default stream) and return its result buffer; on NumPy arrays, run it and return
        once the result is in place.

        Raises
        ------
        ValueError
            If it was closed, one of its device arrays or its stream was closed, or its
            communicator destroyed or aborted.
        """
        c = self._call
        if c is None or self._checked != CLOSES[0]:
            c = self._check()
        if stream is None and self._fast:
            _queued(c, self._stream, c.cfunc(*self._args), c.buffers)
            return c.result
        if c.host:
            return _staged(c, stream)
        st = stream_of(c.comm, stream)
        if capturing[0]:
            capture_rules(c, st)
        _queued(c, st, c.cfunc(*c.args, st._ptr_cdata), c.buffers)
        return c.result

    def close(self) -> None:
        """Let go of the buffers and the communicator (queued starts keep theirs until done).
        Idempotent."""
        self._call = None
        self._stream = self._args = None
        self._fast = False

    def __enter__(self) -> PersistentOp:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self._call
        return "<hcclpy.PersistentOp closed>" if c is None else f"<hcclpy.PersistentOp {c.name} on '{c.comm._name}'>"
