"""The exception tree (hcclpy.errors): codes to names and classes, message format, pickling, and
errors produced by real C calls refused by the simulator."""

from __future__ import annotations

import pickle
import re
import threading
from typing import Any, Dict

import numpy as np
import pytest

import hcclpy
from hcclpy import _ffi
import ranks
from hcclpy import errors
from hcclpy.errors import AclErrorCode, HcclResult

HCCL_CODES = [code for code in HcclResult if code != HcclResult.HCCL_SUCCESS]
ACL_TIMEOUTS = {AclErrorCode.ACL_ERROR_WAIT_CALLBACK_TIMEOUT, AclErrorCode.ACL_ERROR_RT_WAIT_TIMEOUT,
                AclErrorCode.ACL_ERROR_RT_TASK_TIMEOUT, AclErrorCode.ACL_ERROR_RT_REPORT_TIMEOUT,
                AclErrorCode.ACL_ERROR_RT_AICPU_TIMEOUT, AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                AclErrorCode.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT}
ACL_REMOTE = {AclErrorCode.ACL_ERROR_RT_SUSPECT_REMOTE_ERROR, AclErrorCode.ACL_ERROR_RT_COMM_OP_RETRY_FAIL}
ACL_OTHERS = [AclErrorCode.ACL_ERROR_INVALID_PARAM, AclErrorCode.ACL_ERROR_UNINITIALIZE,
              AclErrorCode.ACL_ERROR_RT_PARAM_INVALID, AclErrorCode.ACL_ERROR_RT_INVALID_DEVICEID,
              AclErrorCode.ACL_ERROR_BAD_ALLOC, AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
              AclErrorCode.ACL_ERROR_RT_STREAM_ABORT, AclErrorCode.ACL_ERROR_RT_AICPU_EXCEPTION,
              AclErrorCode.ACL_ERROR_INTERNAL_ERROR, AclErrorCode.ACL_ERROR_RT_FEATURE_NOT_SUPPORT]


def _roundtrip(exc: BaseException) -> BaseException:
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    for attribute in ("code", "name", "api", "detail"):
        assert getattr(copy, attribute) == getattr(exc, attribute)
    return copy


def test_hierarchy() -> None:
    for cls in (hcclpy.AclError, hcclpy.HcclError, hcclpy.CommTimeoutError, hcclpy.RemoteRankError,
                hcclpy.LibraryNotFoundError, hcclpy.UnsupportedError):
        assert issubclass(cls, hcclpy.HcclpyError)
    assert issubclass(hcclpy.AclError, RuntimeError) and issubclass(hcclpy.HcclError, RuntimeError)
    assert issubclass(hcclpy.CommTimeoutError, TimeoutError)
    assert issubclass(hcclpy.LibraryNotFoundError, OSError)
    assert issubclass(hcclpy.UnsupportedError, NotImplementedError)
    assert not issubclass(hcclpy.AclError, hcclpy.HcclError) and not issubclass(hcclpy.HcclError, hcclpy.AclError)
    assert hcclpy.errors is errors


@pytest.mark.parametrize("code", HCCL_CODES, ids=lambda c: c.name)
def test_every_hccl_result(code: HcclResult) -> None:
    exc = errors.hccl_error(int(code), "HcclAllReduce", library_text="lib text", recent="what went wrong")
    assert isinstance(exc, hcclpy.HcclError) and isinstance(exc, hcclpy.HcclpyError)
    assert (exc.code, exc.name, exc.api, exc.detail) == (int(code), code.name, "HcclAllReduce", "what went wrong")
    assert str(exc).startswith(f"HcclAllReduce failed: {code.name} ({int(code)}): ")
    assert "what went wrong" in str(exc) and "library says: lib text" in str(exc)
    assert isinstance(exc, hcclpy.CommTimeoutError) == (code == HcclResult.HCCL_E_TIMEOUT)
    assert isinstance(exc, hcclpy.RemoteRankError) == (code == HcclResult.HCCL_E_REMOTE)
    assert errors.hccl_error_class(int(code)) is type(exc)
    copy = _roundtrip(exc)
    assert isinstance(copy, hcclpy.HcclError)


@pytest.mark.parametrize("code", sorted(ACL_TIMEOUTS | ACL_REMOTE) + ACL_OTHERS, ids=lambda c: c.name)
def test_acl_codes(code: AclErrorCode) -> None:
    exc = errors.acl_error(int(code), "aclrtSynchronizeStream", recent="runtime says")
    assert isinstance(exc, hcclpy.AclError) and not isinstance(exc, hcclpy.HcclError)
    assert (exc.code, exc.name, exc.api) == (int(code), code.name, "aclrtSynchronizeStream")
    assert str(exc).startswith(f"aclrtSynchronizeStream failed: {code.name} ({int(code)}): runtime says")
    assert isinstance(exc, hcclpy.CommTimeoutError) == (code in ACL_TIMEOUTS)
    assert isinstance(exc, TimeoutError) == (code in ACL_TIMEOUTS)
    assert isinstance(exc, hcclpy.RemoteRankError) == (code in ACL_REMOTE)
    assert errors.acl_error_class(int(code)) is type(exc)
    _roundtrip(exc)


def test_unknown_codes_and_context() -> None:
    exc = errors.hccl_error(4242, "HcclFoo")
    assert type(exc) is hcclpy.HcclError and exc.name == "unknown HcclResult"
    assert str(exc).startswith("HcclFoo failed: unknown HcclResult (4242): ")
    acl = errors.acl_error(999999, "aclrtFoo")
    assert type(acl) is hcclpy.AclError
    assert str(acl) == "aclrtFoo failed: unknown AclErrorCode (999999): no description available"
    with_context = errors.hccl_error(1, "HcclBar", context="creating rank 3")
    assert str(with_context).startswith("creating rank 3: HcclBar failed: HCCL_E_PARA (1): ")
    _roundtrip(with_context)


def test_plain_exceptions_pickle() -> None:
    for exc in (hcclpy.LibraryNotFoundError("no lib"), hcclpy.UnsupportedError("too old"),
                hcclpy.CommTimeoutError("late"), hcclpy.RemoteRankError("peer died")):
        copy = pickle.loads(pickle.dumps(exc))
        assert type(copy) is type(exc) and str(copy) == str(exc)


def test_categories_raised_without_a_c_call_have_the_c_errors_attributes() -> None:
    # A handler written for the C errors' attributes works on the categories whoever raised them.
    for exc in (hcclpy.CommTimeoutError("late"), hcclpy.RemoteRankError("peer died")):
        assert (exc.code, exc.name, exc.api, exc.detail) == (None, "", "", "")
    late = errors.hccl_error(int(HcclResult.HCCL_E_TIMEOUT), "HcclBar")
    assert isinstance(late, hcclpy.CommTimeoutError) and (late.code, late.name) == (9, "HCCL_E_TIMEOUT")
    assert set(errors.__all__) >= {"AclTimeoutError", "AclRemoteError", "HcclTimeoutError", "HcclRemoteError"}


# ------------------------------------------------------------------------ mismatches

MISMATCH_TEXT = ("HcclAllReduce failed on rank 0 of 'w': collective mismatch on 'w' at operation #2: rank 0 called "
                 "all_reduce(count=8, fp32, sum) but rank 1 called all_reduce(count=16, fp32, sum) (HCCL_E_PARA)")


def test_mismatch_category() -> None:
    assert issubclass(hcclpy.CollectiveMismatchError, hcclpy.HcclpyError)
    assert issubclass(hcclpy.CollectiveMismatchError, ValueError)
    assert hcclpy.CollectiveMismatchError is errors.CollectiveMismatchError
    for cls, base in ((errors.AclMismatchError, hcclpy.AclError), (errors.HcclMismatchError, hcclpy.HcclError)):
        assert issubclass(cls, base) and issubclass(cls, hcclpy.CollectiveMismatchError)
        assert not issubclass(cls, hcclpy.RemoteRankError) and not issubclass(cls, hcclpy.CommTimeoutError)
    plain = hcclpy.CollectiveMismatchError("raised without a C call")
    assert (plain.code, plain.name, plain.api, plain.detail) == (None, "", "", "")


@pytest.mark.parametrize("code", [AclErrorCode.ACL_ERROR_RT_AICPU_EXCEPTION,
                                  AclErrorCode.ACL_ERROR_RT_SUSPECT_REMOTE_ERROR], ids=lambda c: c.name)
def test_a_mismatch_on_a_stream_is_one_type_whatever_the_code(code: AclErrorCode) -> None:
    # The rank that sees the difference has its stream fail with AICPU_EXCEPTION; one that learns
    # of it from another (a count vector only another rank can check) with SUSPECT_REMOTE_ERROR.
    exc = errors.acl_error(int(code), "aclrtSynchronizeStream", recent=MISMATCH_TEXT)
    assert type(exc) is errors.AclMismatchError and errors.acl_error_class(int(code), MISMATCH_TEXT) is type(exc)
    assert (exc.code, exc.name, exc.detail) == (int(code), code.name, MISMATCH_TEXT)  # CANN's code, unchanged
    assert str(exc) == (f"aclrtSynchronizeStream failed: {code.name} ({int(code)}): {MISMATCH_TEXT}; the ranks "
                        "called a collective differently; the communicator is broken: destroy it on every rank and "
                        "create a new one")
    assert isinstance(_roundtrip(exc), hcclpy.CollectiveMismatchError)


@pytest.mark.parametrize("code", [HcclResult.HCCL_E_PARA, HcclResult.HCCL_E_REMOTE], ids=lambda c: c.name)
def test_a_call_refused_after_a_mismatch_is_one_type_whatever_the_code(code: HcclResult) -> None:
    # A later call on the broken communicator: HCCL_E_PARA on the rank whose failure was recorded
    # first, HCCL_E_REMOTE on the others; the simulator's text already says what to do.
    recent = (f"HcclAllReduce: communicator 'w' has failed (rank 1: {MISMATCH_TEXT}); destroy it and create a "
              "new one")
    exc = errors.hccl_error(int(code), "HcclAllReduce", library_text="lib", recent=recent)
    assert type(exc) is errors.HcclMismatchError and errors.hccl_error_class(int(code), recent) is type(exc)
    assert str(exc) == (f"HcclAllReduce failed: {code.name} ({int(code)}): {recent}; the ranks called a collective "
                        "differently; library says: lib")
    _roundtrip(exc)


def test_the_communicators_error_after_a_mismatch_is_one_type_on_every_rank() -> None:
    for code, remote in ((HcclResult.HCCL_E_PARA, False), (HcclResult.HCCL_E_REMOTE, True)):
        exc = errors.communicator_error(code, "w", remote=remote, recent=MISMATCH_TEXT)
        assert type(exc) is errors.HcclMismatchError and exc.api == "HcclGetCommAsyncError"
        assert str(exc).startswith(f"communicator 'w' is broken: {code.name} ({int(code)}): {MISMATCH_TEXT}; ")
        _roundtrip(exc)


def test_only_the_mark_makes_a_mismatch() -> None:
    assert errors.is_mismatch(MISMATCH_TEXT) and not errors.is_mismatch(None) and not errors.is_mismatch("")
    for text in ("rank 1 (pid 4242) died while rank 0 was in all_reduce #6", "a mismatch of sizes"):
        assert type(errors.acl_error(507018, "aclrtSynchronizeStream", recent=text)) is hcclpy.AclError
        assert type(errors.hccl_error(21, "HcclAllReduce", recent=text)) is errors.HcclRemoteError


# ----------------------------------------------------------------- from the C libraries

@pytest.fixture
def comm1():
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    yield comm
    comm.destroy()


def test_buffer_past_its_allocation_is_refused_by_the_simulator(comm1: hcclpy.Communicator) -> None:
    x = hcclpy.zeros(16, "float32", device=0)
    stream = hcclpy.Device(0).create_stream()
    with pytest.raises(hcclpy.HcclError) as info:
        comm1.broadcast((x.ptr, 17, "float32"), stream=stream)
    exc = info.value
    assert (exc.name, exc.code, exc.api) == ("HCCL_E_PARA", 1, "HcclBroadcast")
    assert str(exc).startswith("HcclBroadcast failed: HCCL_E_PARA (1): ")
    # The simulator's own explanation is carried in the message and in .detail.
    assert "past the end of its allocation" in str(exc) and "past the end of its allocation" in exc.detail
    _roundtrip(exc)
    # Nothing was queued: the stream and the communicator are fine.
    comm1.broadcast(x, stream=stream)
    stream.synchronize()
    stream.close()


def test_pointer_outside_device_memory_is_refused(comm1: hcclpy.Communicator) -> None:
    host = np.zeros(8, np.float32)
    with pytest.raises(hcclpy.HcclError) as info:
        comm1.all_reduce((host.ctypes.data, 8, "float32"), (host.ctypes.data, 8, "float32"), "sum")
    assert info.value.name in ("HCCL_E_PTR", "HCCL_E_PARA")
    comm1.device.default_stream.synchronize()


def test_count_above_the_library_maximum(comm1: hcclpy.Communicator) -> None:
    x = hcclpy.zeros(4, "int8", device=0)
    with pytest.raises(ValueError, match="more than HCCL's largest supported count 0x7FFFFFFFF"):
        comm1.broadcast((x.ptr, 2**40, "int8"))  # refused in Python, as HCCL would refuse it:
    stream = comm1.device.default_stream
    rc = comm1._api.HcclBroadcast(_ffi.cast("void *", x.ptr), 2**40, int(hcclpy.DataType.INT8), 0, comm1._handle,
                                  stream._ptr_cdata)
    error = _ffi.hccl_failure(rc, "HcclBroadcast")
    assert error.name == "HCCL_E_PARA" and "exceeds the largest supported count" in str(error)


def test_acl_error_from_the_runtime() -> None:
    _, total = hcclpy.Device(0).memory_info()
    with pytest.raises(hcclpy.AclError) as info:
        hcclpy.empty(total + 1, "uint8", device=0)
    exc = info.value
    assert exc.api == "aclrtMalloc" and exc.name == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert "aclrtMalloc failed: ACL_ERROR_RT_MEMORY_ALLOCATION (207001)" in str(exc)
    _roundtrip(exc)


def test_sync_timeout_is_a_comm_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank waiting for a peer that has not come yet: synchronize(timeout) gives up first.
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "30")
    info = hcclpy.RootInfo.generate(device=0)
    made = {}

    def create(rank: int) -> None:
        made[rank] = hcclpy.Communicator(2, info, rank, device=rank)

    threads = [threading.Thread(target=create, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    comm = made[0]
    stream = hcclpy.Device(0).create_stream()
    x = hcclpy.zeros(4, "float32", device=0)
    comm.all_reduce(x, None, "sum", stream=stream)  # rank 1 never joins this one
    with pytest.raises(hcclpy.CommTimeoutError) as caught:
        stream.synchronize(timeout=0.2)
    assert isinstance(caught.value, hcclpy.AclError)
    assert caught.value.name == "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT"
    assert not stream.query()
    # Now rank 1 joins (from another thread) and everything completes.
    y = hcclpy.zeros(4, "float32", device=1)
    other = hcclpy.Device(1).create_stream()

    def late() -> None:
        made[1].all_reduce(y, None, "sum", stream=other)
        other.synchronize()

    thread = threading.Thread(target=late, daemon=True)
    thread.start()
    stream.synchronize(timeout=30)
    thread.join(30)
    assert stream.query()
    for s in (stream, other):
        s.close()
    for c in made.values():
        c.destroy()


# ------------------------------------------------------------- a communicator's own error

def test_communicator_error_describes_the_communicator_not_a_failed_call() -> None:
    own = errors.communicator_error(HcclResult.HCCL_E_SUSPENDING, "w", recent="stopped by HcclCommSuspend")
    assert type(own) is errors.HcclError and not isinstance(own, hcclpy.RemoteRankError)
    assert str(own) == ("communicator 'w' is broken: HCCL_E_SUSPENDING (22): stopped by HcclCommSuspend; the "
                        "communicator is suspended")
    theirs = errors.communicator_error(HcclResult.HCCL_E_SUSPENDING, "w", remote=True, library_text="suspended")
    assert isinstance(theirs, hcclpy.RemoteRankError) and isinstance(theirs, hcclpy.HcclError)
    assert str(theirs) == ("communicator 'w' was broken by another rank: HCCL_E_SUSPENDING (22): another rank "
                           "aborted the communicator; library says: suspended")
    timeout = errors.communicator_error(HcclResult.HCCL_E_TIMEOUT, "w")
    assert isinstance(timeout, hcclpy.CommTimeoutError) and timeout.api == "HcclGetCommAsyncError"
    remote = errors.communicator_error(HcclResult.HCCL_E_REMOTE, "w", remote=True)
    assert str(remote) == "communicator 'w' was broken by another rank: HCCL_E_REMOTE (21): another rank failed"
    for exc in (own, theirs, timeout, remote):
        assert "HcclGetCommAsyncError failed" not in str(exc) and str(exc).startswith("communicator 'w' ")
        _roundtrip(exc)


def _abort_seen_from_both_sides(rank: int, size: int, info: bytes, aborted: threading.Event) -> Dict[str, Any]:
    """Rank 0 aborts with an all_reduce in flight; each rank reports its async_error, and rank 1
    how its next operation fails. (Own streams: an aborted collective fails its stream for good.)"""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    x = hcclpy.zeros(4, "float32", device=comm.device)
    stream = comm.device.create_stream()
    try:
        if rank == 0:  # rank 1 does not join: the all_reduce is in flight when aborted
            comm.all_reduce(x, stream=stream)
            comm.abort()
            with pytest.raises(hcclpy.AclError):
                stream.synchronize(timeout=30)
            aborted.set()
        else:
            assert aborted.wait(30), "rank 0 did not abort"
        error = comm.async_error()
        out: Dict[str, Any] = {"class": type(error).__name__, "remote": isinstance(error, hcclpy.RemoteRankError),
                               "name": error.name, "message": str(error)}
        if rank == 1:
            with pytest.raises(hcclpy.RemoteRankError):
                comm.all_reduce(x, stream=stream)
                stream.synchronize(timeout=30)
        return out
    finally:
        stream.close()
        comm.destroy()


@pytest.mark.timeout(120)
def test_async_error_after_another_rank_aborted_is_a_remote_error() -> None:
    out = ranks.run_threads(_abort_seen_from_both_sides, 2, threading.Event(), timeout=90)
    assert (out[0]["class"], out[0]["remote"], out[0]["name"]) == ("HcclError", False, "HCCL_E_SUSPENDING")
    # The other rank's code is the abort's own (HCCL_E_SUSPENDING) or, where the library maps other
    # ranks' failures as real HCCL does, HCCL_E_REMOTE: a remote error either way.
    assert (out[1]["class"], out[1]["remote"]) == ("HcclRemoteError", True)
    assert out[1]["name"] in ("HCCL_E_SUSPENDING", "HCCL_E_REMOTE"), out[1]
    assert re.match(r"^communicator '[^']+' is broken: HCCL_E_SUSPENDING \(22\): ", out[0]["message"]), out[0]
    assert re.match(r"^communicator '[^']+' was broken by another rank: HCCL_E_(SUSPENDING \(22\)|REMOTE \(21\)): ",
                    out[1]["message"]), out[1]
    assert "rank 0" in out[1]["message"], out[1]
    assert not any("HcclGetCommAsyncError failed" in result["message"] for result in out)


def test_enums_print_their_names_and_the_fallback_warning_is_public() -> None:
    assert (str(hcclpy.DataType.FP32), f"{hcclpy.DataType.BF16}", f"{hcclpy.ReduceOp.MAX:>4}") == ("fp32", "bfp16", " max")
    assert repr(hcclpy.ReduceOp.SUM) == "<ReduceOp.SUM: 0>" and int(hcclpy.DataType.FP32) == 4
    assert hcclpy.zeros(2, "float32", device=0).dtype.numpy == np.float32
    assert hcclpy.SimulatorFallbackWarning is errors.SimulatorFallbackWarning is hcclpy._ffi.SimulatorFallbackWarning
    assert issubclass(hcclpy.SimulatorFallbackWarning, UserWarning)
    info = hcclpy.RootInfo.generate(device=0)
    assert bytes(info) == info.to_bytes() and hcclpy.RootInfo(bytearray(bytes(info))) == info
