"""Waits on AscendCL work that Ctrl-C can end.

Python runs signal handlers only between C calls: a program waiting in one C call for a stream
whose collective hangs would ignore Ctrl-C until the collective times out (``HCCL_EXEC_TIMEOUT``,
half an hour by default on real CANN). hcclpy's waits therefore call AscendCL's timed waits with
at most :data:`WAIT_SLICE_MS` at a time. The work waited for stays queued when a
``KeyboardInterrupt`` ends the wait.
"""

from __future__ import annotations

import math
import time
from typing import Callable

WAIT_SLICE_MS = 100  # the longest a wait stays in one C call


def waited(ms: int) -> str:
    """What a wait of ``ms`` milliseconds that gave up says first: the C call's own message is
    about its last slice. Empty for a wait without a limit (-1), or a query (0)."""
    return f"gave up after {ms / 1000:g} s" if ms > 0 else ""


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
