"""Waits on AscendCL work that Ctrl-C can end.

Python runs signal handlers only between C calls: a program waiting in one C call for a stream
whose collective hangs would ignore Ctrl-C until the collective times out (``HCCL_EXEC_TIMEOUT``,
half an hour by default on real CANN). hcclpy's waits therefore call AscendCL's timed waits with
at most :data:`WAIT_SLICE_MS` at a time. The work waited for stays queued when a
``KeyboardInterrupt`` ends the wait. The timed waits are optional symbols: on a CANN without one,
a wait without a limit is one call of the untimed wait, which Ctrl-C cannot end.
"""

from __future__ import annotations

import math
import numbers
import time
from functools import partial
from typing import Any, Callable, Optional, Tuple

WAIT_SLICE_MS = 100  # the longest a wait stays in one C call


def seconds(timeout: Any, argument: str = "timeout", *, finite: bool = False) -> Optional[float]:
    """A timeout argument checked: None (no limit) for None, and for ``math.inf`` unless ``finite``;
    otherwise its seconds as a float.

    Raises
    ------
    TypeError
        If ``timeout`` is not a number (a bool is not one).
    ValueError
        If it is negative or NaN (or infinite, when ``finite``).
    """
    allowed = f"None (no limit) or a {'finite ' if finite else ''}number of seconds >= 0"
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{argument}={timeout!r} must be {allowed}, not a {type(timeout).__name__}")
    if timeout == math.inf and not finite:
        return None
    if not 0 <= timeout < math.inf:  # false for NaN too
        raise ValueError(f"{argument}={timeout!r} must be {allowed}")
    return float(timeout)


def waited(ms: int) -> str:
    """What a wait of ``ms`` milliseconds that gave up says first: the C call's own message is
    about its last slice. Empty for a wait without a limit (-1), or a query (0)."""
    return f"gave up after {ms / 1000:g} s" if ms > 0 else ""


def wait_for(bound: Any, timed: str, untimed: str, handle: Tuple[Any, ...], ms: int,
             timeout_rc: int) -> Tuple[int, str]:
    """Wait ``ms`` milliseconds at most (-1: no limit) with AscendCL's timed wait ``timed`` (the
    function's name) on ``handle`` (its arguments before the timeout), in slices; return the code
    and the name of the function that returned it. On a CANN without ``timed``, a wait without a
    limit calls the untimed ``untimed`` once, and one with a limit raises the UnsupportedError of
    the missing function."""
    if ms < 0 and not bound.present.get(timed):
        return getattr(bound, untimed)(*handle), untimed
    return wait_in_slices(partial(getattr(bound, timed), *handle), ms, timeout_rc), timed


def wait_in_slices(wait: Callable[[int], int], ms: int, timeout_rc: int) -> int:
    """Call ``wait(milliseconds)``, an AscendCL wait with a timeout, until it returns
    anything but ``timeout_rc`` or ``ms`` milliseconds have passed (-1: no limit); return its code.
    Each call waits at most :data:`WAIT_SLICE_MS`."""
    if ms < 0:
        rc = wait(WAIT_SLICE_MS)
        while rc == timeout_rc:
            rc = wait(WAIT_SLICE_MS)
        return rc
    deadline = time.monotonic() + ms / 1000
    rc = wait(min(ms, WAIT_SLICE_MS))
    while rc == timeout_rc:
        left = math.ceil((deadline - time.monotonic()) * 1000)
        if left <= 0:
            break
        rc = wait(min(left, WAIT_SLICE_MS))
    return rc
