"""``hcclpy.group()``: HCCL calls held and released together (``HcclGroupStart/End``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

from .. import _ffi
from ..runtime._graph import captures_here
from ..runtime._lifetime import CLOSES
from ..runtime._stream import drop_holder, holder

__all__ = ["active", "after", "defer", "group"]


class _State(threading.local):
    """The calling thread's group nesting and, inside a group, ``pending``: the callbacks for its
    end; ``deferred``: what each of its operations does once HCCL has queued it (when the group
    ends); ``holders``: the keep-alive lists of their buffers until then, one per device. ``depth``
    is a class attribute, every thread's default: a thread-local attribute that is missing would
    cost an exception on each lookup."""

    depth = 0


_state = _State()
_lock = threading.Lock()  # guards ``open_groups``
open_groups = 0  # groups open on every thread: while there are none, operations skip active()


def active() -> bool:
    """True inside ``with hcclpy.group():`` on the calling thread; False otherwise."""
    return _state.depth > 0


def after(callback: Callable[[bool], None]) -> None:
    """Call ``callback(succeeded)`` once the calling thread's outermost group has ended."""
    _state.pending.append(callback)


def defer(device_id: int, keep: Sequence[Any], queued: Callable[[], None]) -> None:
    """An operation of the calling thread's group: HCCL queues it on its stream when the group
    ends, so only then does ``queued()`` record it and hand ``keep`` to the stream. Until then a
    keep-alive list of the group's holds ``keep`` (so that closing an array frees nothing the
    operation will use), and the stream knows nothing of it: its waits neither cover the
    operation nor let go of its buffers."""
    holders = _state.holders
    holding = holders.get(device_id)
    if holding is None:
        holding = holders[device_id] = holder(device_id)
    holding.held.extend(keep)
    _state.deferred.append(queued)


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
    if captures_here():
        raise RuntimeError("hcclpy.group() and a capture cannot nest: capture the operations without the group, "
                           "or make the group outside the capture")
    bound = _ffi.api()
    rc = bound.HcclGroupStart()
    if rc:
        raise _ffi.hccl_failure(rc, "HcclGroupStart")
    if not active():
        _state.pending = []
        _state.deferred = []
        _state.holders = {}
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
            # HCCL has queued the group's operations (or failed to): their streams hold their
            # buffers from now on, and the flight recorder records them.
            deferred, _state.deferred = _state.deferred, []
            holders, _state.holders = _state.holders, {}
            try:
                if rc == 0:
                    for queued in deferred:
                        queued()
            finally:
                for holding in holders.values():
                    drop_holder(holding)
            pending, _state.pending = _state.pending, []
            for callback in pending:
                callback(rc == 0)
        if rc:
            raise _ffi.hccl_failure(rc, "HcclGroupEnd")
