"""Graphs: work captured on a stream once and replayed as often as wanted (CANN's model run
instances built by stream capture, "aclgraph"; CUDA graphs and ``torch.cuda.graph`` are the same
idea).

While a stream captures, the work hcclpy queues on it — collectives, persistent operations,
copies, host functions, event records and waits — is recorded instead of run, and the buffers and
communicators it uses are held by the :class:`Graph` (not by the stream), for as long as the graph
lives: a buffer a graph uses is freed only once the graph is closed. A stream that waits for an
event recorded during the capture joins it, as in CANN.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional

from .. import _ffi
from ..errors import UnsupportedError
from . import _stream
from ._lifetime import CLOSES, attach, close_now

__all__ = ["CAPTURE_MODES", "Graph", "TaskGroup", "capture_thread_mode", "capturing", "captures_here"]

CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}  # aclmdlRICaptureMode
"""The capture modes by name: which threads may call the functions a capture forbids
(synchronous copies and sets, copies of pageable host memory) while it runs."""


def _mode_code(mode: object) -> int:
    """The aclmdlRICaptureMode of ``mode``, a name of :data:`CAPTURE_MODES`."""
    code = CAPTURE_MODES.get(mode) if isinstance(mode, str) else None
    if code is None:
        raise ValueError(f"mode={mode!r} must be one of {', '.join(repr(m) for m in CAPTURE_MODES)}")
    return code

capturing = [0]
"""Captures under way in the process: the operations look (one read) before their C call, and
check their rules (:func:`captures_here`) only when it is not 0."""

_local = threading.local()


def captures_here() -> List[Graph]:
    """The graphs the calling thread is capturing."""
    found: Optional[List[Graph]] = getattr(_local, "graphs", None)
    if found is None:
        found = _local.graphs = []
    return found


class Graph:
    """Work captured once on a stream, replayed with :meth:`replay` (a CANN model run instance).

    Made by :meth:`Stream.capture`, as the target of its ``with`` block; the capture ends with the
    block. The graph holds the buffers and communicators of what it recorded until :meth:`close`
    (or the garbage collector) frees it.

    Examples
    --------
    >>> with stream.capture() as graph:
    ...     comm.all_reduce(grads, op="sum", stream=stream)
    >>> for _ in range(1000):
    ...     graph.replay()
    >>> stream.synchronize(); graph.close()
    """

    __slots__ = ("__weakref__", "_model", "_stream", "_mode", "_holdings", "_held_once", "_comms", "_joined",
                 "_finalizer", "_state")

    _model: List[Any]  # the aclmdlRI, once the capture ended (a list the finalizer shares)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("make graphs with Stream.capture()")

    @classmethod
    def _begin(cls, stream: _stream.Stream, mode: str) -> Graph:
        code = _mode_code(mode)
        stream._check_open()
        if stream._graph is not None:
            raise ValueError(f"{stream!r} is capturing already")
        bound = _ffi.api()
        if not bound.present.get("aclmdlRICaptureBegin"):
            raise UnsupportedError("Stream.capture needs aclmdlRICaptureBegin (CANN 8.2 and later), which this CANN "
                                   "does not provide")
        _ffi.check_acl(bound.aclmdlRICaptureBegin(stream._cdata(), code), "aclmdlRICaptureBegin")
        self = object.__new__(cls)
        self._model = model = []
        self._stream = stream
        self._mode = mode
        self._holdings = _stream.holder(stream._device_id)  # seen by DeviceArray.close as a stream's
        self._held_once: Optional[tuple] = None  # what a replay holds: each held object once
        self._comms: Dict[int, Any] = {}
        self._joined: List[_stream.Stream] = [stream]
        self._state = "capturing"
        holdings = self._holdings

        def release() -> None:
            if model:
                _ffi.check_acl(bound.aclmdlRIDestroy(model[0]), "aclmdlRIDestroy")
            _stream.drop_holder(holdings)

        self._finalizer = attach(self, release, "hcclpy.Graph", warn=False)
        stream._graph = self
        captures_here().append(self)
        capturing[0] += 1
        CLOSES[0] += 1  # persistent operations look at the rules again
        return self

    # ---------------------------------------------------------------- capture

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if self._state == "capturing":
            self._end(discard=exc_type is not None)

    def _hold(self, keep: Any, comm: Any = None) -> None:
        """Keep ``keep`` (and ``comm``) alive while the graph lives: recorded work uses them."""
        self._holdings.held.extend(keep)
        self._held_once = None
        if comm is not None:
            self._comms[id(comm)] = comm

    def _join(self, stream: _stream.Stream) -> None:
        """``stream`` waited for an event recorded in the capture: its work is recorded too."""
        stream._graph = self
        self._joined.append(stream)

    def _end(self, discard: bool = False) -> None:
        bound = _ffi.api()
        out = _ffi.new("aclmdlRI *")
        rc = bound.aclmdlRICaptureEnd(self._stream._cdata(), out)
        for stream in self._joined:
            stream._graph = None
        graphs = captures_here()
        if self in graphs:
            graphs.remove(self)
        capturing[0] -= 1
        CLOSES[0] += 1
        if rc:
            self._state = "closed"
            close_now(self._finalizer)
            if not discard:
                raise _ffi.acl_failure(rc, "aclmdlRICaptureEnd")
            return
        self._model.append(out[0])
        self._state = "ready"
        if discard:
            self.close()

    def group(self) -> TaskGroup:
        """Mark the work recorded in a ``with`` block as a group that :meth:`TaskGroup.update`
        can replace later without capturing again (``aclmdlRICaptureTaskGrpBegin`` / ``End``)."""
        if self._state != "capturing":
            raise ValueError("a task group is marked while the graph captures")
        return TaskGroup._begin(self)

    # ---------------------------------------------------------------- use

    @property
    def capturing(self) -> bool:
        """True while the capture runs (inside the ``with`` block)."""
        return self._state == "capturing"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or the capture failed)."""
        return self._state == "closed"

    @property
    def stream(self) -> _stream.Stream:
        """The stream the capture ran on (where :meth:`replay` queues by default)."""
        return self._stream

    def _ready(self, what: str) -> None:
        if self._state != "ready":
            raise ValueError(f"{what} needs a graph whose capture ended; this one is "
                             f"{'still capturing' if self._state == 'capturing' else 'closed'}")

    def replay(self, stream: Optional[_stream.Stream] = None) -> None:
        """Queue the recorded work on ``stream`` (None: the stream it was captured on), as often as
        wanted; it runs as the work itself would have. A graph with collectives must be replayed
        by every rank, as every rank would have called them.

        Raises
        ------
        ValueError
            The graph is capturing or closed, ``stream`` is closed, of another device, or
            capturing, or a communicator the recorded work uses was destroyed or aborted.
        """
        self._ready("replay()")
        target = self._stream if stream is None else stream
        if not isinstance(target, _stream.Stream):
            raise TypeError(f"stream must be an hcclpy.Stream or None, got {type(stream).__name__}")
        target._check_open()
        if target._device_id != self._stream._device_id:
            raise ValueError(f"stream is on device {target._device_id} but the graph was captured on device "
                             f"{self._stream._device_id}")
        if target._graph is not None:
            raise ValueError("stream is capturing: a graph is replayed on a stream that is not")
        for comm in self._comms.values():
            if comm._handle is None or comm._aborted:
                raise ValueError(f"communicator '{comm._name}', which the graph's collectives use, was "
                                 f"{'aborted' if comm._aborted else 'destroyed'}: the graph cannot run")
        _ffi.check_acl(_ffi.api().aclmdlRIExecuteAsync(self._model[0], target._cdata()), "aclmdlRIExecuteAsync")
        once = self._held_once
        if once is None:  # each object once: a graph of 100 operations on one buffer holds it 200 times
            once = self._held_once = tuple({id(item): item for item in self._holdings.held}.values())
        target._hold(once)  # reads of its buffers wait for this replay

    def close(self) -> None:
        """Free the graph (``aclmdlRIDestroy``) and let go of its buffers and communicators;
        replays already queued keep what they use. Idempotent; inside the ``with`` block it ends
        the capture first, discarding it."""
        if self._state == "capturing":
            self._end(discard=True)
        self._state = "closed"
        self._comms = {}
        close_now(self._finalizer)

    def __repr__(self) -> str:
        return f"<hcclpy.Graph {self._state} on {self._stream!r}>"


class TaskGroup:
    """Recorded work that can be replaced without capturing again: made by :meth:`Graph.group`,
    replaced with :meth:`update` (``aclmdlRICaptureTaskUpdateBegin`` / ``End``)."""

    __slots__ = ("_graph", "_handle", "_stream")

    @classmethod
    def _begin(cls, graph: Graph) -> TaskGroup:
        bound = _ffi.api()
        _ffi.check_acl(bound.aclmdlRICaptureTaskGrpBegin(graph._stream._cdata()), "aclmdlRICaptureTaskGrpBegin")
        self = object.__new__(cls)
        self._graph, self._handle, self._stream = graph, None, graph._stream
        return self

    def __enter__(self) -> TaskGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        out = _ffi.new("aclrtTaskGrp *")
        _ffi.check_acl(_ffi.api().aclmdlRICaptureTaskGrpEnd(self._stream._cdata(), out), "aclmdlRICaptureTaskGrpEnd")
        self._handle = out[0]

    @contextlib.contextmanager
    def update(self, stream: _stream.Stream) -> Iterator[None]:
        """A ``with`` block whose work, queued on ``stream`` (a stream that is not capturing),
        replaces the group's instead of running: the same operations, in the same order, on other
        buffers or with other arguments. The graph holds the new buffers.

        Examples
        --------
        >>> with graph_stream.capture() as graph:
        ...     with graph.group() as step:
        ...         comm.all_reduce(a, stream=graph_stream)
        >>> with step.update(other_stream):
        ...     comm.all_reduce(b, stream=other_stream)  # replays now reduce b
        """
        if self._handle is None:
            raise ValueError("the task group's with block has not ended")
        self._graph._ready("update()")
        if not isinstance(stream, _stream.Stream):
            raise TypeError(f"stream must be an hcclpy.Stream, got {type(stream).__name__}")
        stream._check_open()
        if stream._graph is not None:
            raise ValueError("stream is capturing: a task group is updated on a stream that is not")
        bound = _ffi.api()
        _ffi.check_acl(bound.aclmdlRICaptureTaskUpdateBegin(stream._cdata(), self._handle),
                       "aclmdlRICaptureTaskUpdateBegin")
        stream._graph = self._graph  # what the update queues is held by the graph
        CLOSES[0] += 1
        try:
            yield
        finally:
            stream._graph = None
            CLOSES[0] += 1
            _ffi.check_acl(bound.aclmdlRICaptureTaskUpdateEnd(stream._cdata()), "aclmdlRICaptureTaskUpdateEnd")


@contextlib.contextmanager
def capture_thread_mode(mode: str) -> Iterator[str]:
    """Set the calling thread's own capture mode for a ``with`` block, and give back the one it
    had (``aclmdlRICaptureThreadExchangeMode``, as CUDA's ``cudaThreadExchangeStreamCaptureMode``).

    The calls a capture forbids (synchronous copies and fills, copies of pageable host memory)
    are refused to a thread by the captures under way, as their modes and the thread's own mode
    decide together. A thread's mode is ``"global"`` until changed: any global-mode capture, of
    any thread, refuses its calls. ``"thread_local"``: only the captures this thread began refuse
    them. ``"relaxed"``: none does, so this thread may copy synchronously, or run operations on
    NumPy arrays, while another thread captures in global mode. (hcclpy's own refusals in a
    capture, such as an operation on a stream that does not capture, follow the capture's mode.)

    Parameters
    ----------
    mode
        ``"global"``, ``"thread_local"`` or ``"relaxed"``.

    Yields
    ------
    str
        The mode the thread had before the block, which it has again after it.

    Raises
    ------
    ValueError
        ``mode`` is none of those.
    UnsupportedError
        On a CANN without ``aclmdlRICaptureThreadExchangeMode`` (8.2 and later have it).

    Examples
    --------
    >>> with hcclpy.capture_thread_mode("relaxed"):  # while another thread captures
    ...     weights.copy_from(new_weights)             # a synchronous copy, refused otherwise
    """
    code = _mode_code(mode)
    bound = _ffi.api()
    if not bound.present.get("aclmdlRICaptureThreadExchangeMode"):
        raise UnsupportedError("capture_thread_mode needs aclmdlRICaptureThreadExchangeMode (CANN 8.2 and later), "
                               "which this CANN does not provide")
    exchanged = _ffi.new("int *", code)
    _ffi.check_acl(bound.aclmdlRICaptureThreadExchangeMode(exchanged), "aclmdlRICaptureThreadExchangeMode")
    previous = int(exchanged[0])
    try:
        yield next((name for name, value in CAPTURE_MODES.items() if value == previous), str(previous))
    finally:
        exchanged[0] = previous
        _ffi.check_acl(bound.aclmdlRICaptureThreadExchangeMode(exchanged), "aclmdlRICaptureThreadExchangeMode")
