"""The flight recorder's ring buffer: every operation hcclpy queues, and how far each stream got.

This module sits below the runtime and the collectives (of hcclpy it imports only where its two
variables are read, :mod:`hcclpy._environment`): the
collectives record each operation they queue, streams and events mark what they have seen
complete, and :mod:`hcclpy.trace` turns the records into dumps, Chrome traces and health reports.

Recording costs a tuple and a deque append per operation. The monotonic clock orders everything:
a record's *mark* is the time its operation was queued, read once the C call returned, and a
synchronisation, a query or an event takes its mark before its C call, so every record with a
lower mark was queued before it. A stream's *progress* is ``[done, failed, done_ns]``: records
with a mark below ``done`` are known complete (a synchronisation, a query or an event said so, at
``done_ns``), records below ``failed`` ran into a failure. ``HCCLPY_TRACE=0`` turns recording
off; ``HCCLPY_TRACE_SIZE`` sets how many operations the ring keeps (default 1024).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from typing import Any, Deque, List

import numpy as np

from . import _environment

__all__ = ["capacity", "completed", "enabled", "failed", "mark", "new_progress", "on_toggle", "records",
           "set_enabled"]


def _ring_size() -> int:
    """``HCCLPY_TRACE_SIZE``: a bad value warns and keeps the default rather than fail ``import
    hcclpy``, so that ``hcclpy info`` still runs to report it."""
    size, problem = _environment.trace_size()
    if problem is not None:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    return size


capacity = _ring_size()
enabled = _environment.trace_enabled()

# A clock read is cheaper than a counter and an index: the clock is the mark, and the deque drops
# the oldest record itself. Its append is atomic under the GIL, so threads need no lock.
ring: Deque[tuple] = deque(maxlen=capacity)
now = time.perf_counter_ns
_listeners: List[Any] = []


def set_enabled(on: bool) -> None:
    """Turn recording on or off (for this process, from now on).

    Raises
    ------
    TypeError
        If ``on`` is not a bool (``"no"`` and ``"0"`` are true in Python: they are refused).
    """
    global enabled
    if not isinstance(on, (bool, np.bool_)):
        raise TypeError(f"on={on!r} must be True or False")
    enabled = bool(on)
    for listener in _listeners:
        listener(enabled)


def on_toggle(listener: Any) -> None:
    """Call ``listener(enabled)`` whenever recording is turned on or off (hot paths keep a copy)."""
    _listeners.append(listener)


def mark() -> int:
    """The current point in the order of events: operations recorded before it have lower marks
    (take it before the C call it stands for)."""
    return now()


def new_progress() -> list:
    """The progress of a new stream: nothing known complete, nothing failed."""
    return [0, 0, 0]


# A record in the ring: (mark = enqueue time in ns, sequence number, the call's own part, the
# stream's progress, the stream's handle), where the call's own part — ((communicator name, rank,
# size, instance), C function, count, dtype, detail) — is one tuple made with the call, shared by
# every record of a persistent operation: a record costs the queuing of an operation little.
# records() spreads them out. The sequence number counts the communicator's collectives, or, for a
# send, a receive or a batch of them (C function HcclSend, HcclRecv, HcclBatchSendRecv), its
# point-to-point calls apart; the instance tells communicators of one name apart (the k-th of
# that name this rank created).


def completed(progress: list, upto: int) -> None:
    """Everything recorded on the stream before mark ``upto`` is complete (known now)."""
    if upto > progress[0]:
        progress[0] = upto
        progress[2] = now()


def failed(progress: list, upto: int) -> None:
    """The stream failed on work recorded before mark ``upto``."""
    if upto > progress[1]:
        progress[1] = upto


def records() -> List[tuple]:
    """The records the ring holds, oldest first, each as ``(mark, communicator, sequence number,
    C function, count, dtype, detail, progress, stream handle)``."""
    # list() copies the deque in one C call, which other threads' appends cannot interleave.
    return [(mark, call[0], seq, *call[1:], progress, handle)
            for mark, seq, call, progress, handle in sorted(list(ring), key=lambda r: r[0])]
