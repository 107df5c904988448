"""Byte counts as people write them: ``4096``, ``64K``, ``2M``, ``1.5G``, ``2MiB`` (K, M and G are
powers of 1024). Shared by the CLI and the benchmark scripts."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# A number, an optional unit (K, KB or KiB, ...) or a bare B; any case.
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMG])(?:I?B)?|B)?\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``text`` as a whole, non-negative number of bytes; ValueError, naming ``text``, otherwise.

    With a unit the number may have a fraction, as long as the bytes come out whole (``1.5K`` is
    1536; ``0.1K`` is refused)."""
    match = _SIZE.fullmatch(text)
    if match is not None:
        number, unit = match.groups()
        scale = _UNITS[(unit or "").upper()]
        if "." not in number:
            return int(number) * scale  # exact, however large
        value = float(number) * scale
        if value.is_integer():
            return int(value)
    raise ValueError(f"{text!r} is not a whole number of bytes (digits, optionally with a K, M or G suffix)")


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in the largest unit that holds it whole: ``8 B``, ``4 KiB``, ``64 MiB``, ``1536 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"
