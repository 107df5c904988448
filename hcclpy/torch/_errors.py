"""Failures of the hcclpy backend as torch users catch them.

torch's own backends report a failed or timed-out collective as ``torch.distributed.DistBackendError``
(a ``RuntimeError``): that is what training loops, elastic agents and torch's own helpers catch.
hcclpy reports the same failures as :class:`hcclpy.HcclError`, :class:`hcclpy.AclError` and its
categories (timeout, remote rank, collective mismatch). Inside the torch backend every such
failure becomes a :class:`BackendError`, which is a ``DistBackendError`` *and* keeps what hcclpy
knows: the C function (``.api``), its code and the code's name (``.code``, ``.name``) and the
library's own text (``.detail``), the hcclpy exception as ``__cause__``, and the hcclpy category
(a timeout is still a :class:`hcclpy.CommTimeoutError`, hence a ``TimeoutError``).

Bad arguments are not backend failures: they stay ``ValueError``/``TypeError``, raised in the
caller before anything runs.
"""

from __future__ import annotations

from typing import Optional, Type

import torch.distributed as dist

from ..errors import CollectiveMismatchError, CommTimeoutError, HcclpyError, RemoteRankError


class BackendError(HcclpyError, dist.DistBackendError):
    """An operation of the hcclpy backend failed: torch's ``DistBackendError`` carrying hcclpy's
    account of the failure.

    Attributes
    ----------
    api : str
        The C function that failed ("" when no C call reported it, e.g. a wait that gave up).
    code : int or None
        Its return code.
    name : str
        The code's name, such as ``"HCCL_E_TIMEOUT"``.
    detail : str
        The C library's own words about the failure, when it gave any.
    """

    def __init__(self, message: str, *, api: str = "", code: Optional[int] = None, name: str = "",
                 detail: str = "") -> None:
        super().__init__(message)
        self.api = api
        self.code = code
        self.name = name
        self.detail = detail

    def __reduce__(self):  # type: ignore[no-untyped-def]  # keeps the attributes across pickling
        return (_rebuild, (type(self), self.args[0] if self.args else "", self.api, self.code, self.name,
                           self.detail))


def _rebuild(cls: Type[BackendError], message: str, api: str, code: Optional[int], name: str,
             detail: str) -> BackendError:
    return cls(message, api=api, code=code, name=name, detail=detail)


class BackendTimeoutError(BackendError, CommTimeoutError):
    """An operation of the hcclpy backend ran out of time (the group's timeout, or ``wait``'s)."""


class BackendRemoteError(BackendError, RemoteRankError):
    """An operation failed because another rank failed (it exited or aborted)."""


class BackendMismatchError(BackendError, CollectiveMismatchError):
    """The ranks called a collective differently (another count, dtype, operation or root); the
    group's communicator is broken: destroy the group on every rank and create a new one. Also a
    ``ValueError``, as hcclpy's :class:`~hcclpy.CollectiveMismatchError` is."""


def timed_out(text: str) -> str:
    """A timeout's message, in the words torch's backends use ("Timed out"), which torch's own
    tests and users' log filters look for."""
    return f"Timed out ({text})"


def backend_error(exc: BaseException, operation: str = "") -> BaseException:
    """``exc`` as the torch backend raises it: an hcclpy failure becomes the matching
    :class:`BackendError` (with ``exc`` as its cause, and its message after ``operation``, the
    description of what failed); anything else (bad arguments, a group used after it was
    destroyed, an exception already converted) is returned unchanged."""
    if isinstance(exc, BackendError) or not isinstance(exc, HcclpyError):
        return exc
    if isinstance(exc, CommTimeoutError):
        cls: Type[BackendError] = BackendTimeoutError
    elif isinstance(exc, CollectiveMismatchError):
        cls = BackendMismatchError
    elif isinstance(exc, RemoteRankError):
        cls = BackendRemoteError
    else:
        cls = BackendError
    text = timed_out(str(exc)) if cls is BackendTimeoutError else str(exc)
    if operation:
        text = f"{operation}: {text}"
    error = cls(text, api=getattr(exc, "api", "") or "", code=getattr(exc, "code", None),
                name=getattr(exc, "name", "") or "", detail=getattr(exc, "detail", "") or "")
    error.__cause__ = exc
    return error
