"""``hcclpy.group()``: HCCL calls held and released together (``HcclGroupStart/End``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from .. import _ffi
from ..runtime import Stream
from ..runtime._memory import CLOSES

__all__ = ["active", "after", "group"]


class _State(threading.local):
    """The calling thread's group nesting and, inside a group, ``pending``: the callbacks for its
    end, and ``streams``: the stream of each of its operations, which HCCL queues only when it
    ends. ``depth`` is a class attribute, every thread's default: a thread-local attribute that
    is missing would cost an exception on each lookup."""

    depth = 0


_state = _State()
_lock = threading.Lock()  # guards ``open_groups`` and the streams' _grouped counts
open_groups = 0  # groups open on every thread: while there are none, operations skip count()


def active() -> bool:
    """True inside ``with hcclpy.group():`` on the calling thread; False otherwise."""
    return _state.depth > 0


def after(callback: Callable[[bool], None]) -> None:
    """Call ``callback(succeeded)`` once the calling thread's outermost group has ended."""
    _state.pending.append(callback)


def count(stream: Stream) -> None:
    """An operation was queued on ``stream``: inside a group on the calling thread, the stream
    counts it (``Stream._grouped``) until the group ends, since HCCL queues it only then:
    meanwhile, waits on the stream neither let go of buffers nor mark work complete."""
    if _state.depth:
        with _lock:
            stream._grouped += 1
        _state.streams.append(stream)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Hold the HCCL calls of the block and release them together (``HcclGroupStart/End``).

    A group belongs to the thread that opens it: other threads' calls go on as usual. Sends and
    receives inside one group cannot deadlock each other; one thread can drive the communicators
    of several devices; communicators created in the block exist once it ends. The block's calls
    are released even if it raises.

    Examples
    --------
    >>> with hcclpy.group():
    ...     comm.send(x, peer=1)
    ...     comm.recv(y, peer=1)
    """
    global open_groups
    bound = _ffi.api()
    rc = bound.HcclGroupStart()
    if rc:
        raise _ffi.hccl_failure(rc, "HcclGroupStart")
    if not active():
        _state.pending = []
        _state.streams = []
    _state.depth += 1
    CLOSES[0] += 1  # persistent operations look at their buffers again (a group refuses batches)
    with _lock:
        open_groups += 1
    try:
        yield
    finally:
        _state.depth -= 1
        rc = bound.HcclGroupEnd()
        with _lock:
            open_groups -= 1
        if _state.depth == 0:
            # HCCL has queued the group's operations (or failed to): their streams stop counting them.
            streams, _state.streams = _state.streams, []
            with _lock:
                for stream in streams:
                    stream._grouped -= 1
            pending, _state.pending = _state.pending, []
            for callback in pending:
                callback(rc == 0)
        if rc:
            raise _ffi.hccl_failure(rc, "HcclGroupEnd")
