"""Warnings that point at the user's line, however deep inside hcclpy they are raised."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Type

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_caller(message: str, category: Type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside hcclpy: the user's call, which a
    fixed ``stacklevel`` finds only from one path into the code that warns."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
