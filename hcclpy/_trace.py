"""The flight recorder's ring buffer: every operation hcclpy queues, and how far each stream got.

This module sits below the runtime and the collectives (it imports nothing of hcclpy): the
collectives record each operation they queue, streams and events mark what they have seen
complete, and :mod:`hcclpy.trace` turns the records into dumps, Chrome traces and health reports.

Recording costs a tuple and a list store per operation. A per-process counter orders everything;
a stream's *progress* is ``[done, failed, done_ns]``: records with a mark below ``done`` are known
complete (a synchronisation, a query or an event said so, at ``done_ns``), records below
``failed`` ran into a failure. ``HCCLPY_TRACE=0`` turns recording off; ``HCCLPY_TRACE_SIZE`` sets
how many operations the ring keeps (default 1024: a ring that stays in the CPU caches makes a
record ~80 ns cheaper than one of 4096).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, List, Optional

__all__ = ["capacity", "completed", "enabled", "failed", "mark", "new_progress", "on_toggle", "records",
           "set_enabled"]


def _ring_size() -> int:
    """``HCCLPY_TRACE_SIZE`` (default 1024, at least 16)."""
    raw = os.environ.get("HCCLPY_TRACE_SIZE", "").strip()
    try:
        return max(int(raw), 16) if raw else 1024
    except ValueError:
        raise ValueError(f"HCCLPY_TRACE_SIZE is {raw!r}; use a whole number of operations (16 or more)") from None


capacity = 1 << (_ring_size() - 1).bit_length()  # a power of two: index by mask
enabled = os.environ.get("HCCLPY_TRACE", "1") != "0"

ring: List[Optional[tuple]] = [None] * capacity
mask = capacity - 1
counter = itertools.count(1)  # next() is atomic under the GIL: threads never share a mark
now = time.perf_counter_ns
_listeners: List[Any] = []


def set_enabled(on: bool) -> None:
    """Turn recording on or off (for this process, from now on)."""
    global enabled
    enabled = bool(on)
    for listener in _listeners:
        listener(enabled)


def on_toggle(listener: Any) -> None:
    """Call ``listener(enabled)`` whenever recording is turned on or off (hot paths keep a copy)."""
    _listeners.append(listener)


def mark() -> int:
    """A fresh point in the order of events (operations recorded before it have lower marks)."""
    return next(counter)


def new_progress() -> list:
    """The progress of a new stream: nothing known complete, nothing failed."""
    return [0, 0, 0]


# A record: (mark, (communicator name, rank, size), sequence number in the communicator, C function,
#            count, dtype, detail, the stream's progress, the stream's handle, enqueue time in ns).
# The collectives build it inline (a function call would double the cost).


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
    """The records the ring holds, oldest first."""
    return sorted((r for r in list(ring) if r is not None), key=lambda r: r[0])
