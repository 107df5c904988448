"""Every environment variable hcclpy reads, read here and nowhere else (docs/environment.md lists
them all).

Each is read when the feature that uses it runs; the flight recorder's two are read at
``import hcclpy``, and cannot fail it (a bad ``HCCLPY_TRACE_SIZE`` warns). A value that cannot be used raises a
``ValueError`` naming the variable, its value and what is allowed, except for the tuning
variables CANN itself reads leniently (``HCCL_BUFFSIZE``, ``HCCL_CONNECT_TIMEOUT``,
``HCCLPY_TRACE_SIZE``): those warn and keep the default, as CANN does.

The launchers' own variables (``RANK``, ``SLURM_PROCID``, ``MASTER_PORT``...) are read from
:func:`variables`, through the table of :mod:`hcclpy._launchers`.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ._caller import warn_at_caller


def variables() -> Mapping[str, str]:
    """The process environment as a whole: for the launchers' variables (rank, sizes, rendezvous
    address), which ``hcclpy._launchers`` names, and for reports of the environment."""
    return os.environ


# ------------------------------------------------------------------------ the libraries

def backend() -> str:
    """``HCCLPY_BACKEND``: ``auto`` (default), ``cann`` or ``sim``."""
    choice = os.environ.get("HCCLPY_BACKEND", "auto").strip().lower() or "auto"
    if choice not in ("auto", "cann", "sim"):
        raise ValueError(f"HCCLPY_BACKEND={choice!r} is not one of 'auto', 'cann', 'sim'")
    return choice


def first_set(names: Sequence[str]) -> Optional[Tuple[str, str]]:
    """``(name, value)`` of the first of the variables ``names`` that is set and not empty (the
    library overrides ``HCCLPY_LIBASCENDCL``, ``HCCLPY_LIBHCCL``, ``HCCL_SO_PATH``), else None."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return name, value
    return None


def cann_roots() -> List[Tuple[str, str]]:
    """``(name, directory)`` of ``ASCEND_HOME_PATH`` and ``ASCEND_TOOLKIT_HOME``, those set."""
    return [(name, os.environ[name]) for name in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if os.environ.get(name)]


def library_path() -> str:
    """``LD_LIBRARY_PATH`` as it is (empty when unset)."""
    return os.environ.get("LD_LIBRARY_PATH", "")


# ------------------------------------------------------------------------ the simulator's build

def compiler(variable: str) -> Optional[List[str]]:
    """The compiler command ``CC`` (or ``CXX``) names, split as a shell would; None when unset."""
    explicit = os.environ.get(variable, "").strip()
    return shlex.split(explicit) if explicit else None


def sim_cache() -> Tuple[Path, str]:
    """The simulator's cache directory, and where that choice came from (for messages):
    ``HCCLPY_SIM_CACHE``, else ``$XDG_CACHE_HOME/hcclpy`` (an absolute one), else
    ``~/.cache/hcclpy``."""
    explicit = os.environ.get("HCCLPY_SIM_CACHE")
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit))), f"HCCLPY_SIM_CACHE={explicit!r}"
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "hcclpy", f"XDG_CACHE_HOME={xdg!r}, HCCLPY_SIM_CACHE unset"
    return Path.home() / ".cache" / "hcclpy", "the default: HCCLPY_SIM_CACHE and XDG_CACHE_HOME unset"


def sim_profile() -> str:
    """``HCCLPY_SIM_PROFILE`` as it is (empty: no product profile); ``hcclpy.profiles`` checks it."""
    return os.environ.get("HCCLPY_SIM_PROFILE", "")


def sim_devices() -> str:
    """``HCCLPY_SIM_DEVICES`` as it is (the simulator reads it; default 8 devices)."""
    return os.environ.get("HCCLPY_SIM_DEVICES", "").strip()


def visible_devices() -> str:
    """``ASCEND_RT_VISIBLE_DEVICES`` as it is (the runtime reads it)."""
    return os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")


# ------------------------------------------------------------------------ communicators

DEFAULT_BUFFSIZE_MB = 200  # HCCL's default
BUFFSIZE_MAX_MB = 0xFFFFFFFE  # 0xFFFFFFFF is HcclCommConfig's "not set"


def buffsize_mb() -> int:
    """``HCCL_BUFFSIZE`` in MB: a whole number from 1; any other value is ignored with a warning
    (the default, 200 MB, is used), as CANN does."""
    text = os.environ.get("HCCL_BUFFSIZE", "").strip()
    if not text:
        return DEFAULT_BUFFSIZE_MB
    if text.isdigit() and 1 <= int(text) <= BUFFSIZE_MAX_MB:
        return int(text)
    warn_at_caller(f"HCCL_BUFFSIZE={text!r} is ignored: it must be a whole number of MB from 1 to {BUFFSIZE_MAX_MB}; "
                   f"using {DEFAULT_BUFFSIZE_MB}", RuntimeWarning)
    return DEFAULT_BUFFSIZE_MB


def deterministic() -> int:
    """``HCCL_DETERMINISTIC``: 0 (``false``, default), 1 (``true``, ``1``) or 2 (``strict``, ``2``)."""
    text = os.environ.get("HCCL_DETERMINISTIC", "false").strip().lower()
    return {"true": 1, "1": 1, "strict": 2, "2": 2}.get(text, 0)


DEFAULT_CONNECT_TIMEOUT = 120.0  # seconds: HCCL's default, and the simulator's
_LONGEST_WAIT = 1e9  # seconds, ~32 years: the simulator takes longer settings as this (forever in practice)
# HCCL_CONNECT_TIMEOUT as the simulator reads it, with C's strtod() taking the whole value: blanks
# before it (none after), a sign, then a decimal or a hexadecimal (0x) number.
_STRTOD_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
                            r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?))", re.ASCII)


def connect_timeout() -> float:
    """``HCCL_CONNECT_TIMEOUT`` in seconds, read as the simulator reads it: a number >= 0 (``0x``
    hexadecimal too, blanks before it but none after). Unset or blank gives HCCL's default, 120;
    any other value (``abc``, ``-1``, ``10s``, ``nan``, ``inf``) too, with a ``RuntimeWarning``."""
    text = os.environ.get("HCCL_CONNECT_TIMEOUT", "")
    if not text.strip():
        return DEFAULT_CONNECT_TIMEOUT
    match = _STRTOD_NUMBER.fullmatch(text)
    if match is not None:
        number = match.group(1)
        value = float.fromhex(number) if "x" in number.lower() else float(number)
        if 0 <= value < math.inf:
            return min(abs(value), _LONGEST_WAIT)  # abs: -0 is 0
    warn_at_caller(f"HCCL_CONNECT_TIMEOUT={text!r} is ignored: it must be a number of seconds >= 0; using "
                   f"{DEFAULT_CONNECT_TIMEOUT:g}", RuntimeWarning)
    return DEFAULT_CONNECT_TIMEOUT


def count(name: str, default: int, parse: Callable[[str], int], minimum: int, allowed: str) -> int:
    """The variable ``name`` read with ``parse`` (``default`` when unset or blank), such as
    ``P2P_HCCL_BUFFSIZE``.

    Raises ValueError naming the variable, its value and what is ``allowed`` for a value ``parse``
    refuses or one below ``minimum``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"{name} is {raw!r}; use {allowed}")
    return value


# ------------------------------------------------------------------------ launching

def rank_table_file() -> Optional[str]:
    """``RANK_TABLE_FILE`` (None when unset or empty)."""
    return os.environ.get("RANK_TABLE_FILE") or None


def rendezvous_secret() -> Optional[str]:
    """``HCCLPY_RENDEZVOUS_TOKEN`` (None when unset or empty)."""
    return os.environ.get("HCCLPY_RENDEZVOUS_TOKEN") or None


def runtime_dir() -> Optional[str]:
    """``XDG_RUNTIME_DIR`` (None when unset or empty)."""
    return os.environ.get("XDG_RUNTIME_DIR") or None


# ------------------------------------------------------------------------ the flight recorder

DEFAULT_TRACE_SIZE = 1024


def trace_enabled() -> bool:
    """``HCCLPY_TRACE``: ``0`` turns the flight recorder off (default on)."""
    return os.environ.get("HCCLPY_TRACE", "1") != "0"


def trace_size() -> Tuple[int, Optional[str]]:
    """``HCCLPY_TRACE_SIZE`` (default 1024, at least 16), and what is wrong with it (None when
    unset or a whole number): a bad value keeps the default rather than fail, so that ``hcclpy
    info`` can report it."""
    raw = os.environ.get("HCCLPY_TRACE_SIZE", "").strip()
    if not raw:
        return DEFAULT_TRACE_SIZE, None
    try:
        return max(int(raw), 16), None
    except ValueError:
        return DEFAULT_TRACE_SIZE, (f"HCCLPY_TRACE_SIZE is {raw!r}, not a whole number of operations (16 or more); "
                                    f"the flight recorder keeps the default {DEFAULT_TRACE_SIZE}")


def trace_dir() -> Optional[str]:
    """``HCCLPY_TRACE_DIR``: where ranks dump their records on a failure (None: they do not)."""
    return os.environ.get("HCCLPY_TRACE_DIR") or None


# Set by ``hcclpy run`` when HCCLPY_TRACE_DIR is: "fd:inode" of a pipe each rank inherits, which the
# launcher closes to ask for dumps before it stops a job (at its --timeout, or on a signal).
DUMP_PIPE_VARIABLE = "HCCLPY_DUMP_PIPE"


def dump_pipe() -> Optional[Tuple[int, int]]:
    """``HCCLPY_DUMP_PIPE`` as ``(fd, inode)``, or None when unset or malformed."""
    try:
        fd, inode = (int(part) for part in os.environ.get(DUMP_PIPE_VARIABLE, "").split(":"))
    except ValueError:
        return None
    return fd, inode
