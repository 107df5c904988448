"""Byte counts as people write them: ``4096``, ``64K``, ``2M``, ``1.5G``, ``2MiB`` (K, M and G are
powers of 1024). Shared by the environment variables, the CLI and the benchmark scripts."""

from __future__ import annotations

import re

__all__ = ["parse_bytes"]

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
