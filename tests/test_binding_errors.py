"""The exception tree (hcclpy.errors): codes to names and classes, message format, pickling, and
errors produced by real C calls refused by the simulator."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import hcclpy
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
    with pytest.raises(hcclpy.HcclError, match="exceeds the largest supported count") as info:
        comm1.broadcast((x.ptr, 2**40, "int8"))
    assert info.value.name == "HCCL_E_PARA"


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
