"""Progress lines for waits that can last: a rank waiting for its peers says what for, every few
seconds, on stderr (a wait that says nothing looks like a hang)."""

from __future__ import annotations

import sys
import time
from typing import Callable

PERIOD = 5.0  # seconds between two lines; the first comes after one period


class Progress:
    """Counts the time of one wait of at most ``limit`` seconds; :meth:`tick` prints a line
    ``hcclpy: <what> (12 s of 300 s)`` when a period has passed since the last one."""

    def __init__(self, limit: float, first: float = 0.0) -> None:
        self.started = time.monotonic()
        self.limit = limit
        # The first line after ``first`` seconds or one period, whichever is longer: a wait that
        # usually takes a while (another process's build) is announced only when it lasts.
        self._next = self.started + max(first, PERIOD)

    def tick(self, what: Callable[[], str]) -> None:
        """Print ``what()`` if it is time to; ``what`` is called only then."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + PERIOD
            print(f"hcclpy: {what()} ({now - self.started:.0f} s of {self.limit:g} s)", file=sys.stderr, flush=True)
