"""argparse types for the numbers the subcommands take: a wrong value is named, with what is allowed
(argparse's own message would name the Python function)."""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

from .._units import parse_bytes

__all__ = ["byte_size", "non_negative_int", "one_of", "port", "positive_int", "real", "seconds"]

Number = TypeVar("Number", int, float)


def _number(text: str, convert: Callable[[str], Number], what: str) -> Number:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def one_of(*allowed: int) -> Callable[[str], int]:
    """The type of an option that takes one of the whole numbers ``allowed``."""
    listed = ", ".join(map(str, allowed))

    def convert(text: str) -> int:
        value = _number(text, int, f"one of {listed}")
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"must be one of {listed}, got {value}")
        return value

    return convert


def real(text: str) -> float:
    """A number (its range is the option's to check)."""
    return _number(text, float, "a number")


def port(text: str) -> int:
    value = _number(text, int, "a TCP port in 1..65535")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {value}")
    return value


def seconds(text: str) -> float:
    """A positive, finite number of seconds: every timeout hcclpy takes is one (``inf`` would
    pass here and be refused later, by ``hcclpy.init`` or a wait)."""
    value = _number(text, float, "a positive number of seconds")
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got {text}")
    return value


def byte_size(text: str) -> int:
    """Bytes, optionally with a K, M or G suffix (powers of 1024): ``8``, ``64K``, ``1.5M``."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
