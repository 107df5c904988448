"""What the commands do when the reader of their output goes away (``hcclpy info | head -1``)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["to_devnull"]


def to_devnull(stream: Any) -> None:
    """Point the file descriptor under ``stream`` at /dev/null, Python's recipe for a reader that
    left: what the stream still buffers is then written there, and the flush at exit does not fail.
    Nothing happens for a stream without a descriptor (a StringIO) or a closed one."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
