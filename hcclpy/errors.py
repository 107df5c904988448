"""Exceptions raised by hcclpy, and the C result codes they carry.

Every exception derives from :class:`HcclpyError`. Failures reported by a C call are
:class:`AclError` (AscendCL runtime) or :class:`HcclError` (HCCL), both also ``RuntimeError``, with
``code``, ``name`` and ``api`` attributes. Two categories cut across them, because they are what a
caller catches to recover: :class:`CommTimeoutError` (also ``TimeoutError``) for anything that ran
out of time, :class:`RemoteRankError` for a failure caused by another rank (it died, left, or
broke the communicator), and :class:`CollectiveMismatchError` (also ``ValueError``) for ranks whose
calls of one collective differ (count, data type, reduce operation, root, count vectors or matrix).
A failed collective surfaces from ``Stream.synchronize`` as an :class:`AclError` of one of those
categories.

Bad arguments raise ``ValueError`` / ``TypeError`` before any C call; a library that is missing or
too old raises :class:`LibraryNotFoundError` / :class:`UnsupportedError`.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple, Type

__all__ = [
    "AclError",
    "AclErrorCode",
    "AclMismatchError",
    "AclRemoteError",
    "AclTimeoutError",
    "CollectiveMismatchError",
    "CommTimeoutError",
    "HcclError",
    "HcclMismatchError",
    "HcclRemoteError",
    "HcclResult",
    "HcclTimeoutError",
    "HostFunctionError",
    "HcclpyError",
    "LibraryNotFoundError",
    "RemoteRankError",
    "SIM_MISMATCH_MARK",
    "SimulatorFallbackWarning",
    "UnsupportedError",
    "acl_error",
    "communicator_error",
    "hccl_error",
    "is_mismatch",
]


class HcclpyError(Exception):
    """Root of every exception raised by hcclpy."""


class LibraryNotFoundError(HcclpyError, OSError):
    """No usable ``libhccl.so`` / ``libascendcl.so`` (or simulator) could be loaded."""


class UnsupportedError(HcclpyError, NotImplementedError):
    """The loaded library does not provide a function or feature (it needs a newer CANN)."""


class HostFunctionError(HcclpyError, RuntimeError):
    """A function queued with :meth:`hcclpy.Stream.launch_host_func` raised; the exception it raised
    is the ``__cause__``. Raised by the stream's next ``synchronize()`` or ``query()``: the stream's
    later work ran regardless, as after any host function."""


class SimulatorFallbackWarning(UserWarning):
    """No CANN installation was found, so hcclpy runs on its CPU simulator (``HCCLPY_BACKEND=sim``
    chooses the simulator without this warning)."""


class _Category(HcclpyError):
    """What a category has when hcclpy raises it without a C call (the rendezvous, a bounded wait
    in Python): the attributes of :class:`AclError` and :class:`HcclError`, empty, so a handler
    can read them whichever raised it."""

    code: Optional[int] = None
    """The C result code; None when no C call reported the failure."""
    name: str = ""
    """The code's name, such as ``"HCCL_E_TIMEOUT"``; empty when no C call reported the failure."""
    api: str = ""
    """The C function that failed; empty when no C call reported the failure."""
    detail: str = ""
    """The C library's own words about the failure, when it gave any."""


class CommTimeoutError(_Category, TimeoutError):
    """An operation, a synchronisation or a communicator set-up ran out of time."""


class RemoteRankError(_Category):
    """Another rank failed: it exited, destroyed the communicator, or an operation failed there."""


class CollectiveMismatchError(_Category, ValueError):
    """The ranks called one collective differently: another operation, or another count, data
    type, reduce operation, root, count vector or count matrix at the same position.

    Raised on every rank, whichever rank's call is the odd one, with both calls in the message
    (``rank 0 called all_reduce(count=8, fp32, sum) but rank 1 called all_reduce(count=16, fp32,
    sum)``); also by every later call on the communicator, which the mismatch broke for good:
    destroy it on every rank and create a new one. A send and a receive of different sizes are
    not collectives: they fail as a plain :class:`AclError` / :class:`HcclError`.

    Only the simulator's failures are recognised as mismatches (it compares every rank's call
    before moving data). On CANN the same program fails as something else: where HCCL's own
    consistency check runs, with an ordinary :class:`HcclError` / :class:`AclError` (its log
    says ``EI0005``); otherwise it waits until ``HCCL_EXEC_TIMEOUT`` (:class:`CommTimeoutError`)
    or computes wrong results.
    """


class _CodeError(HcclpyError, RuntimeError):
    """A C call returned a failure code."""

    def __init__(self, message: str, *, code: int, name: str, api: str, detail: str = "") -> None:
        super().__init__(message)
        self.code: int = code
        """The C result code."""
        self.name: str = name
        """The code's name, such as ``"HCCL_E_TIMEOUT"``."""
        self.api: str = api
        """The C function that failed."""
        self.detail: str = detail
        """The C library's own words about the failure, when it gave any."""

    # Keeps the keyword-only attributes across pickling (multiprocessing).
    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (_rebuild, (type(self), self.args[0], self.code, self.name, self.api, self.detail))


def _rebuild(cls: type, message: str, code: int, name: str, api: str, detail: str) -> _CodeError:
    return cls(message, code=code, name=name, api=api, detail=detail)


class AclError(_CodeError):
    """An AscendCL runtime call failed (``aclError`` code)."""


class HcclError(_CodeError):
    """An HCCL call failed (``HcclResult`` code)."""


class AclTimeoutError(AclError, CommTimeoutError):
    """An AscendCL wait timed out (stream or event synchronisation, a task past its deadline)."""


class AclRemoteError(AclError, RemoteRankError):
    """Work on a stream failed because another rank failed."""


class HcclTimeoutError(HcclError, CommTimeoutError):
    """An HCCL call returned ``HCCL_E_TIMEOUT``."""


class HcclRemoteError(HcclError, RemoteRankError):
    """An HCCL call returned ``HCCL_E_REMOTE``: another rank failed (or, from
    ``Communicator.async_error``, another rank broke the communicator, whatever its code)."""


class AclMismatchError(AclError, CollectiveMismatchError):
    """Work on a stream failed because the ranks called a collective differently (the code is the
    runtime's, usually ``ACL_ERROR_RT_AICPU_EXCEPTION``)."""


class HcclMismatchError(HcclError, CollectiveMismatchError):
    """An HCCL call failed, or ``Communicator.async_error`` reports a communicator broken, because
    the ranks called a collective differently (the code is HCCL's: ``HCCL_E_PARA`` or, on a rank
    that learnt of it from another, ``HCCL_E_REMOTE``)."""


# How the simulator's text of every failure that comes from ranks whose collective calls differ
# begins (HCCL_SIM_MISMATCH_MARK in hcclpy/sim/src/hccl/internal.h). The C codes stay CANN's, so
# the text is the signal; it travels wherever the failure is reported (the stream's sticky error,
# HcclGetCommAsyncError, the communicator's abort record quoted by the peers and by later calls),
# and it is the one the documentation prints, so it is stable. Real CANN never writes it.
SIM_MISMATCH_MARK = "collective mismatch on '"
"""How the simulator's text of a failure begins when the ranks called a collective differently."""

# What a mismatch means for the caller, added to the message.
MISMATCH_EXPLANATION = ("the ranks called a collective differently; the communicator is broken: destroy it on "
                        "every rank and create a new one")


def is_mismatch(text: Optional[str]) -> bool:
    """Whether a C library's error text reports ranks whose collective calls differ."""
    return text is not None and SIM_MISMATCH_MARK in text


def _mismatch_meaning(text: str) -> str:
    # A later call on the broken communicator is refused with a text that already says to
    # rebuild it ("... has failed (...); destroy it and create a new one"): not twice.
    return "the ranks called a collective differently" if "destroy it" in text else MISMATCH_EXPLANATION


class HcclResult(enum.IntEnum):
    """``HcclResult`` codes, with the values of ``hccl_types.h``."""

    HCCL_SUCCESS = 0
    HCCL_E_PARA = 1
    HCCL_E_PTR = 2
    HCCL_E_MEMORY = 3
    HCCL_E_INTERNAL = 4
    HCCL_E_NOT_SUPPORT = 5
    HCCL_E_NOT_FOUND = 6
    HCCL_E_UNAVAIL = 7
    HCCL_E_SYSCALL = 8
    HCCL_E_TIMEOUT = 9
    HCCL_E_OPEN_FILE_FAILURE = 10
    HCCL_E_TCP_CONNECT = 11
    HCCL_E_ROCE_CONNECT = 12
    HCCL_E_TCP_TRANSFER = 13
    HCCL_E_ROCE_TRANSFER = 14
    HCCL_E_RUNTIME = 15
    HCCL_E_DRV = 16
    HCCL_E_PROFILING = 17
    HCCL_E_CCE = 18
    HCCL_E_NETWORK = 19
    HCCL_E_AGAIN = 20
    HCCL_E_REMOTE = 21
    HCCL_E_SUSPENDING = 22
    HCCL_E_OPRETRY_FAIL = 23
    HCCL_E_OOM = 24
    HCCL_E_IN_STATUS = 1041


# What each failure means for the caller, in our words (the library's own text is added too).
HCCL_EXPLANATIONS: Dict[int, str] = {
    HcclResult.HCCL_E_PARA: "an argument is invalid, or the ranks disagree about the call",
    HcclResult.HCCL_E_PTR: "a pointer is NULL or is not device memory of the communicator's device",
    HcclResult.HCCL_E_MEMORY: "memory could not be allocated or accessed",
    HcclResult.HCCL_E_INTERNAL: "internal error in the HCCL library",
    HcclResult.HCCL_E_NOT_SUPPORT: "the operation, data type or option is not supported here",
    HcclResult.HCCL_E_NOT_FOUND: "a resource was not found",
    HcclResult.HCCL_E_UNAVAIL: "a resource is unavailable",
    HcclResult.HCCL_E_SYSCALL: "a system call failed",
    HcclResult.HCCL_E_TIMEOUT: "timed out (HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT)",
    HcclResult.HCCL_E_OPEN_FILE_FAILURE: "a file (such as the rank table) could not be opened",
    HcclResult.HCCL_E_TCP_CONNECT: "a TCP connection between ranks failed",
    HcclResult.HCCL_E_ROCE_CONNECT: "a RoCE connection between ranks failed",
    HcclResult.HCCL_E_TCP_TRANSFER: "a TCP transfer between ranks failed",
    HcclResult.HCCL_E_ROCE_TRANSFER: "a RoCE transfer between ranks failed",
    HcclResult.HCCL_E_RUNTIME: "an AscendCL runtime call inside HCCL failed",
    HcclResult.HCCL_E_DRV: "a driver call failed",
    HcclResult.HCCL_E_PROFILING: "a profiling call failed",
    HcclResult.HCCL_E_CCE: "a CCE call failed",
    HcclResult.HCCL_E_NETWORK: "a network call failed",
    HcclResult.HCCL_E_AGAIN: "the resource is busy; retry later",
    HcclResult.HCCL_E_REMOTE: "another rank failed",
    HcclResult.HCCL_E_SUSPENDING: "the communicator is suspended",
    HcclResult.HCCL_E_OPRETRY_FAIL: "retrying the operation failed",
    HcclResult.HCCL_E_OOM: "out of memory",
    HcclResult.HCCL_E_IN_STATUS: "the error is described by the communicator status",
}


class AclErrorCode(enum.IntEnum):
    """AscendCL and runtime error codes (``acl_base_rt.h``, ``rt_error_codes.h``)."""

    ACL_SUCCESS = 0
    ACL_ERROR_INVALID_PARAM = 100000
    ACL_ERROR_UNINITIALIZE = 100001
    ACL_ERROR_REPEAT_INITIALIZE = 100002
    ACL_ERROR_INVALID_FILE = 100003
    ACL_ERROR_REPEAT_SUBSCRIBE = 100033
    ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034
    ACL_ERROR_THREAD_NOT_SUBSCRIBE = 100035
    ACL_ERROR_WAIT_CALLBACK_TIMEOUT = 100036
    ACL_ERROR_REPEAT_FINALIZE = 100037
    ACL_ERROR_RT_PARAM_INVALID = 107000
    ACL_ERROR_RT_INVALID_DEVICEID = 107001
    ACL_ERROR_RT_CONTEXT_NULL = 107002
    ACL_ERROR_RT_STREAM_CONTEXT = 107003
    ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
    ACL_ERROR_RT_ADDR_UNALIGNED = 107008
    ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011
    ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
    ACL_ERROR_RT_STREAM_NO_CB_REG = 107015
    ACL_ERROR_RT_INVALID_HANDLE = 107017
    ACL_ERROR_RT_WAIT_TIMEOUT = 107019
    ACL_ERROR_RT_TASK_TIMEOUT = 107020
    ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022
    ACL_ERROR_RT_STREAM_ABORT = 107023
    ACL_ERROR_RT_CAPTURE_DEPENDENCY = 107024
    ACL_ERROR_RT_STREAM_UNJOINED = 107025
    ACL_ERROR_RT_MODEL_CAPTURED = 107026
    ACL_ERROR_RT_STREAM_CAPTURED = 107027
    ACL_ERROR_RT_EVENT_CAPTURED = 107028
    ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030
    ACL_ERROR_STREAM_CAPTURE_CONFLICT = 107032
    ACL_ERROR_STREAM_TASK_GROUP_STATUS = 107033
    ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED = 107036
    ACL_ERROR_BAD_ALLOC = 200000
    ACL_ERROR_API_NOT_SUPPORT = 200001
    ACL_ERROR_INVALID_DEVICE = 200002
    ACL_ERROR_MEMORY_ADDRESS_UNALIGNED = 200003
    ACL_ERROR_RESOURCE_NOT_MATCH = 200004
    ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
    ACL_ERROR_FEATURE_UNSUPPORTED = 200006
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
    ACL_ERROR_RT_MEMORY_FREE = 207002
    ACL_ERROR_RT_NO_DEVICE = 207004
    ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207005
    ACL_ERROR_RT_NO_PERMISSION = 207006
    ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007
    ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
    ACL_ERROR_RT_NO_MODEL_RESOURCE = 207010
    ACL_ERROR_RT_OVER_LIMIT = 207012
    ACL_ERROR_RT_DEVICE_OOM = 207018
    ACL_ERROR_STORAGE_OVER_LIMIT = 300000
    ACL_ERROR_INTERNAL_ERROR = 500000
    ACL_ERROR_FAILURE = 500001
    ACL_ERROR_GE_FAILURE = 500002
    ACL_ERROR_RT_FAILURE = 500003
    ACL_ERROR_DRV_FAILURE = 500004
    ACL_ERROR_PROFILING_FAILURE = 500005
    ACL_ERROR_RT_INTERNAL_ERROR = 507000
    ACL_ERROR_RT_STREAM_NOT_COMPLETE = 507004
    ACL_ERROR_RT_EVENT_NOT_COMPLETE = 507006
    ACL_ERROR_RT_REPORT_TIMEOUT = 507012
    ACL_ERROR_RT_AICPU_TIMEOUT = 507017
    ACL_ERROR_RT_AICPU_EXCEPTION = 507018
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
    ACL_ERROR_RT_SUSPECT_REMOTE_ERROR = 507057
    ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED = 507903
    ACL_ERROR_RT_COMM_OP_RETRY_FAIL = 507904


_ACL_TIMEOUTS = frozenset({
    AclErrorCode.ACL_ERROR_WAIT_CALLBACK_TIMEOUT, AclErrorCode.ACL_ERROR_RT_WAIT_TIMEOUT,
    AclErrorCode.ACL_ERROR_RT_TASK_TIMEOUT, AclErrorCode.ACL_ERROR_RT_REPORT_TIMEOUT,
    AclErrorCode.ACL_ERROR_RT_AICPU_TIMEOUT, AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
})
_ACL_REMOTE = frozenset({AclErrorCode.ACL_ERROR_RT_SUSPECT_REMOTE_ERROR, AclErrorCode.ACL_ERROR_RT_COMM_OP_RETRY_FAIL})


def acl_error_class(code: int, detail: Optional[str] = None) -> Type[AclError]:
    """The exception class raised for an ``aclError`` code, whose failure ``detail`` (the
    ``aclGetRecentErrMsg`` text) says whether the ranks' calls differed."""
    if is_mismatch(detail):
        return AclMismatchError
    if code in _ACL_TIMEOUTS:
        return AclTimeoutError
    if code in _ACL_REMOTE:
        return AclRemoteError
    return AclError


def hccl_error_class(code: int, detail: Optional[str] = None) -> Type[HcclError]:
    """The exception class raised for an ``HcclResult`` code, whose failure ``detail`` (the
    ``aclGetRecentErrMsg`` text) says whether the ranks' calls differed."""
    if is_mismatch(detail):
        return HcclMismatchError
    if code == HcclResult.HCCL_E_TIMEOUT:
        return HcclTimeoutError
    if code == HcclResult.HCCL_E_REMOTE:
        return HcclRemoteError
    return HcclError


def _name_of(enum_type: Type[enum.IntEnum], code: int) -> str:
    try:
        return enum_type(code).name
    except ValueError:  # a code from a newer CANN than this table
        return f"unknown {enum_type.__name__}"


def _compose(api: str, name: str, code: int, parts: Tuple[Optional[str], ...], context: str) -> str:
    text = "; ".join(p for p in parts if p) or "no description available"
    prefix = f"{context}: " if context else ""
    return f"{prefix}{api} failed: {name} ({code}): {text}"


def acl_error(code: int, api: str, *, recent: Optional[str] = None, context: str = "") -> AclError:
    """Build the exception for an AscendCL failure (``recent`` is ``aclGetRecentErrMsg`` text)."""
    name = _name_of(AclErrorCode, code)
    meaning = _mismatch_meaning(recent) if recent and is_mismatch(recent) else None
    message = _compose(api, name, code, (recent, meaning), context)
    return acl_error_class(code, recent)(message, code=code, name=name, api=api, detail=recent or "")


def hccl_error(code: int, api: str, *, library_text: Optional[str] = None, recent: Optional[str] = None,
               context: str = "") -> HcclError:
    """Build the exception for an HCCL failure.

    ``library_text`` is ``HcclGetErrorString(code)``, ``recent`` the ACL recent-error text, which for
    HCCL calls says what exactly was wrong.
    """
    name = _name_of(HcclResult, code)
    meaning = _mismatch_meaning(recent) if recent and is_mismatch(recent) else HCCL_EXPLANATIONS.get(code)
    parts = (recent, meaning, f"library says: {library_text}" if library_text else None)
    message = _compose(api, name, code, parts, context)
    return hccl_error_class(code, recent)(message, code=code, name=name, api=api, detail=recent or "")


def communicator_error(code: int, comm: str, *, remote: bool = False, library_text: Optional[str] = None,
                       recent: Optional[str] = None) -> HcclError:
    """Build the error that broke communicator ``comm`` (what ``HcclGetCommAsyncError`` reports).

    No call failed, so the message describes the communicator's state:
    ``communicator 'w' was broken by another rank: HCCL_E_SUSPENDING (22): <what happened>; <what
    it means>``. ``remote`` says another rank caused it: the exception is then an
    :class:`HcclRemoteError` (a :class:`RemoteRankError`), as this rank's operations fail, whatever
    the code. A communicator broken by ranks whose calls differed is an :class:`HcclMismatchError`
    on every rank, as their operations are.
    """
    name = _name_of(HcclResult, code)
    mismatch = is_mismatch(recent)
    if mismatch:
        meaning: Optional[str] = _mismatch_meaning(recent or "")
    elif remote and code == HcclResult.HCCL_E_SUSPENDING:
        meaning = "another rank aborted the communicator"
    else:
        meaning = HCCL_EXPLANATIONS.get(code)
    parts = (recent, meaning, f"library says: {library_text}" if library_text else None)
    text = "; ".join(p for p in parts if p) or "no description available"
    state = "was broken by another rank" if remote and not mismatch else "is broken"
    cls = HcclRemoteError if remote and not mismatch else hccl_error_class(code, recent)
    return cls(f"communicator '{comm}' {state}: {name} ({code}): {text}", code=code, name=name,
               api="HcclGetCommAsyncError", detail=recent or "")
