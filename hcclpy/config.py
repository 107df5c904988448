"""Communicator configuration: a dataclass over the versioned C struct ``HcclCommConfig``.

The header's ``HcclCommConfigInit`` is an inline function, not a library symbol, so hcclpy
initialises the struct itself: a 24-byte header (size, magic word ``0xF0F0F0F0``, version) followed
by fields, unset ones holding the library's "not set" sentinels. What the loaded library
understands is asked once through ``HcclGetCommConfigCapability``:

* libraries without the communicator-name capability only read a version-1 struct: hcclpy then
  declares a 32-byte struct, as torch_npu does;
* the buffer size and the deterministic flag are always written explicitly (from the fields, else
  ``HCCL_BUFFSIZE`` / ``HCCL_DETERMINISTIC``), because the oldest libraries reject or misread the
  "not set" sentinels there;
* setting a field the library cannot read raises :class:`~hcclpy.errors.UnsupportedError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import struct
from typing import Any, Mapping, Optional, Union

from . import _environment, _ffi
from .errors import UnsupportedError

__all__ = ["CommConfig", "ConfigLike"]

_MAGIC = 0xF0F0F0F0
_VERSION = 11
_NOT_SET = 0xFFFFFFFF
_V1_SIZE = 32

# HcclCommConfigCapability members: the library reads a field when its capability < the returned value.
_CAPABILITY = {"buffer_size_mb": 0, "deterministic": 1, "name": 2, "op_expansion_mode": 3, "world_rank_id": 5,
               "job_id": 6, "exec_timeout": 8, "algorithm": 9, "buffer_name": 11}


def _text_field(value: Optional[str], field: str, limit: int) -> Optional[bytes]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"CommConfig.{field} must be a str, got {type(value).__name__}")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, as os.fsdecode makes of bytes that are not UTF-8
        raise ValueError(f"CommConfig.{field}={value!r} is not valid Unicode text: it cannot be encoded as "
                         "UTF-8") from None
    if len(data) >= limit or b"\0" in data:
        raise ValueError(f"CommConfig.{field}={value!r} must be at most {limit - 1} UTF-8 bytes with no NUL")
    return data


def _int_field(value: Any, field: str, low: int, high: int) -> Optional[int]:
    """``value`` as an int (NumPy ints too), or None; anything else, or out of ``[low, high]``, is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise ValueError(f"CommConfig.{field}={value!r} must be an int in [{low}, {high}]")
    return int(value)


def _deterministic(value: Any) -> Optional[int]:
    """0, 1 or 2 (False and True count as 0 and 1)."""
    if isinstance(value, bool):
        return int(value)
    return _int_field(value, "deterministic", 0, 2)


def _traffic_class(value: Any) -> Optional[int]:
    """An RDMA traffic class: a multiple of 4 in [0, 255]."""
    value = _int_field(value, "rdma_traffic_class", 0, 255)
    if value is not None and value % 4:
        raise ValueError(f"CommConfig.rdma_traffic_class={value} must be a multiple of 4")
    return value


def _exec_timeout(value: Any) -> Optional[float]:
    """Seconds, as HCCL takes them: whole (rounded up) in an int32; 0 means no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 2**31 \
            or math.ceil(value) >= 2**31:
        raise ValueError(f"CommConfig.exec_timeout={value!r} must be a number of seconds in [0, 2**31), at most "
                         "2**31 - 1 once rounded up to whole seconds (0: no limit)")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _text(field: str, limit: int) -> Any:
    """The check of text field ``field`` (fewer than ``limit`` UTF-8 bytes)."""
    def check(value: Any) -> Optional[str]:
        _text_field(value, field, limit)
        return value
    return check


def _bounded(field: str, low: int, high: int) -> Any:
    """The check of integer field ``field`` (in ``[low, high]``)."""
    return lambda value: _int_field(value, field, low, high)


# How each field is checked, and normalised (NumPy ints to int, True to 1), when it is set.
_CHECKS = {
    "buffer_size_mb": _bounded("buffer_size_mb", 1, _environment.BUFFSIZE_MAX_MB),
    "deterministic": _deterministic,
    "name": _text("name", 128),
    "udi": _text("udi", 128),
    "op_expansion_mode": _bounded("op_expansion_mode", 0, 6),
    "rdma_traffic_class": _traffic_class,
    "rdma_service_level": _bounded("rdma_service_level", 0, 7),
    "world_rank_id": _bounded("world_rank_id", 0, 0xFFFFFFFF),
    "job_id": _bounded("job_id", 0, 2**64 - 1),
    "exec_timeout": _exec_timeout,
    "algorithm": _text("algorithm", 1600),
    "buffer_name": _text("buffer_name", 128),
    "qos": _bounded("qos", 0, 7),
}


@dataclasses.dataclass
class CommConfig:
    """Options for creating a communicator (``HcclCommConfig``). ``None`` means "library default".

    Every field is checked when it is set, in the constructor or by assignment later (a
    ``ValueError`` or ``TypeError`` naming the field); integer fields take NumPy integers too.

    Examples
    --------
    >>> cfg = hcclpy.CommConfig(name="tp_group", exec_timeout=60)
    >>> comm = hcclpy.Communicator(world, root_info, rank, config=cfg, device=rank)
    """

    buffer_size_mb: Optional[int] = None
    """Size of each of the communicator's two buffers in MB (``HCCL_BUFFSIZE``, default 200)."""
    deterministic: Optional[int] = None
    """0 off, 1 on, 2 strict ordering (``HCCL_DETERMINISTIC``)."""
    name: Optional[str] = None
    """Communicator name (at most 127 bytes, unique); generated when None."""
    udi: Optional[str] = None
    """Free-form user identifier (at most 127 bytes)."""
    op_expansion_mode: Optional[int] = None
    """Where operations are expanded: 0 default, 1 host, 2 AI CPU, 3 AIV, 4 AIV only, 5 CCU MS,
    6 CCU scheduled (5 and 6 on Ascend 950 only; each product accepts a subset)."""
    rdma_traffic_class: Optional[int] = None
    """RDMA traffic class: a multiple of 4 in [0, 255]."""
    rdma_service_level: Optional[int] = None
    """RDMA service level, in [0, 7]."""
    world_rank_id: Optional[int] = None
    """This rank's id in the whole job, for NSLB-DP load balancing."""
    job_id: Optional[int] = None
    """The job's id, for NSLB-DP load balancing."""
    exec_timeout: Optional[float] = None
    """Seconds an operation may wait for its peers (``HCCL_EXEC_TIMEOUT``); 0 disables the limit.
    HCCL takes whole seconds: a fraction is rounded up (so at most ``2**31 - 1``)."""
    algorithm: Optional[str] = None
    """Algorithm selection string, such as ``"level0:NA;level1:H-D_R"`` (``HCCL_ALGO``)."""
    buffer_name: Optional[str] = None
    """Communicators with the same buffer name share their buffers."""
    qos: Optional[int] = None
    """AI CPU SDMA QoS level in [0, 7]."""

    def __setattr__(self, field: str, value: Any) -> None:
        # Every assignment is checked, in the constructor and after it: a bad value never waits
        # until a communicator is created (or turns silently into a default there).
        check = _CHECKS.get(field)
        if check is None:
            match = difflib.get_close_matches(field, _CHECKS, n=1)
            hint = f" (did you mean {match[0]!r}?)" if match else ""
            raise AttributeError(f"CommConfig has no field {field!r}{hint}; fields: {sorted(_CHECKS)}")
        object.__setattr__(self, field, check(value))

    @classmethod
    def coerce(cls, value: Union[CommConfig, Mapping[str, Any], None]) -> Optional[CommConfig]:
        """Accept a CommConfig, a dict of its fields, or None.

        Raises
        ------
        TypeError
            For any other value or an unknown key (the message lists the valid keys).
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            fields = {f.name for f in dataclasses.fields(cls)}
            for key in value:
                if not isinstance(key, str):
                    raise TypeError(f"config keys must be CommConfig field names (str), got {key!r} "
                                    f"({type(key).__name__}); valid keys: {sorted(fields)}")
            unknown = sorted(set(value) - fields)
            if unknown:
                guesses = []
                for key in unknown:
                    match = difflib.get_close_matches(str(key), fields, n=1)
                    if match:
                        guesses.append(f"{match[0]!r} for {key!r}")
                hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
                raise TypeError(f"unknown CommConfig key(s) {unknown}{hint}; valid keys: {sorted(fields)}")
            return cls(**value)
        raise TypeError(f"config must be a CommConfig, a dict or None, got {type(value).__name__}")

    def to_c(self) -> Any:
        """A freshly initialised ``HcclCommConfig *`` (cffi) holding these settings."""
        bound = _ffi.api()
        capability = bound.HcclGetCommConfigCapability() if bound.present["HcclGetCommConfigCapability"] else 0
        for field, needed in _CAPABILITY.items():
            if getattr(self, field) is not None and capability <= needed:
                raise UnsupportedError(f"CommConfig.{field} needs a newer CANN: this HCCL's config capability is "
                                       f"{capability}")
        cfg = _ffi.new("HcclCommConfig *")
        full = capability > _CAPABILITY["name"]
        size = _ffi.sizeof("HcclCommConfig") if full else _V1_SIZE
        struct.pack_into("<QIIQ", _ffi.buffer(cfg), 0, size, _MAGIC, _VERSION if full else 1, 0)
        cfg.hcclBufferSize = self.buffer_size_mb or _environment.buffsize_mb()
        cfg.hcclDeterministic = self.deterministic if self.deterministic is not None else _environment.deterministic()
        for attr, field in (("hcclCommName", "name"), ("hcclUdi", "udi"), ("hcclAlgo", "algorithm"),
                            ("hcclBufferName", "buffer_name")):
            data = _text_field(getattr(self, field), field, 1 << 30)
            if data is not None:
                setattr(cfg, attr, data)
        cfg.hcclOpExpansionMode = self.op_expansion_mode or 0
        cfg.hcclRdmaTrafficClass = _NOT_SET if self.rdma_traffic_class is None else self.rdma_traffic_class
        cfg.hcclRdmaServiceLevel = _NOT_SET if self.rdma_service_level is None else self.rdma_service_level
        cfg.hcclWorldRankID = self.world_rank_id or 0
        cfg.hcclJobID = self.job_id or 0
        # Whole seconds in C; rounding up keeps a short limit from turning into 0 ("no limit").
        cfg.hcclExecTimeOut = -1 if self.exec_timeout is None else math.ceil(self.exec_timeout)
        cfg.hcclQos = _NOT_SET if self.qos is None else self.qos
        cfg.hcclSymWinMaxMemSizePerRank = 16
        cfg.hcclChannelSqDepth = _NOT_SET
        return cfg


ConfigLike = Union[CommConfig, Mapping[str, Any], None]
"""What a ``config`` argument takes: a :class:`CommConfig`, a dict of its fields, or None (the
library's defaults)."""
