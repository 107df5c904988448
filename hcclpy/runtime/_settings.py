"""Process-wide runtime settings: how long a stream's operators may wait and run."""

from __future__ import annotations

from typing import Any

from .. import _ffi
from ..errors import UnsupportedError

__all__ = ["set_op_execute_timeout", "set_op_wait_timeout"]

_LARGEST = 0xFFFFFFFF  # seconds: the C argument is a uint32_t


def _seconds(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _LARGEST:
        raise ValueError(f"{argument}={value!r} must be a whole number of seconds from 0 to {_LARGEST}")
    return int(value)


def _call(function: str, seconds: int) -> None:
    bound = _ffi.api()
    if not bound.present.get(function):
        raise UnsupportedError(f"{function} is not in the loaded CANN")
    _ffi.check_acl(getattr(bound, function)(seconds), function)


def set_op_wait_timeout(seconds: int) -> None:
    """Bound every later wait of a stream for an event (:meth:`Stream.wait_event`,
    ``aclrtStreamWaitEvent``) to ``seconds``; 0 (the default) waits without limit
    (``aclrtSetOpWaitTimeout``). A wait that outlasts it fails its stream: the stream's next
    :meth:`Stream.synchronize` raises an :class:`~hcclpy.errors.AclError`.

    Raises
    ------
    ValueError
        ``seconds`` is not an int from 0 to 2**32 - 1.
    UnsupportedError
        On a CANN without ``aclrtSetOpWaitTimeout``.
    """
    _call("aclrtSetOpWaitTimeout", _seconds(seconds, "seconds"))


def set_op_execute_timeout(seconds: int) -> None:
    """Bound the run time of operator kernels (AI Core, AI CPU) to ``seconds``; 0 sets the
    largest the device allows (``aclrtSetOpExecuteTimeOut``). HCCL's operations keep their own
    bound, ``HCCL_EXEC_TIMEOUT``. (The simulator runs no operator kernels: it checks and keeps
    the value.)

    Raises
    ------
    ValueError
        ``seconds`` is not an int from 0 to 2**32 - 1.
    UnsupportedError
        On a CANN without ``aclrtSetOpExecuteTimeOut``.
    """
    _call("aclrtSetOpExecuteTimeOut", _seconds(seconds, "seconds"))
