"""Bad arguments: every public function refuses them with the documented ValueError / TypeError,
whose message names the argument, before any C call; the communicator keeps working afterwards.

The matrix runs on both ranks of a 2-rank communicator (threads) with the communicator's C
function table replaced by one that fails the test on any call, then both ranks run a real
all_reduce: a call that reached C would also have broken the collective sequence.
"""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace
from typing import Any, Callable, List, Optional, Sequence, Tuple

import cffi
import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import collectives as C
from hcclpy._ffi import cdef_dlpack
from hcclpy.types import ReduceOp

# ------------------------------------------------------------------ foreign buffer objects

_DL = cffi.FFI()
_DL.cdef(cdef_dlpack.TYPES)  # the structs of dlpack.h, as hcclpy declares them
_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
DL_CPU, DL_NPU = 1, 12


class FakeDLPack:
    """An object exporting ``__dlpack__`` for memory at ``ptr`` (code: 0 int, 1 uint, 2 float, 5 complex)."""

    def __init__(self, ptr: int, shape: Sequence[int], *, strides: Optional[Sequence[int]] = None, code: int = 2,
                 bits: int = 32, device_type: int = DL_NPU, device_id: int = 0, ndim: Optional[int] = None,
                 null_shape: bool = False) -> None:
        """``ndim`` and ``null_shape`` describe a malformed capsule: an ndim that is not the shape's
        length, a NULL shape array."""
        self._shape = _DL.new("int64_t[]", list(shape) or [0])
        self._strides = _DL.new("int64_t[]", list(strides)) if strides is not None else _DL.NULL
        self._managed = _DL.new("DLManagedTensor *")
        t = self._managed.dl_tensor
        t.data = _DL.cast("void *", ptr)
        t.device.device_type, t.device.device_id = device_type, device_id
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape, t.strides = _DL.NULL if null_shape else self._shape, self._strides

    def __dlpack__(self, stream: Any = None) -> Any:
        return _capsule_new(int(_DL.cast("uintptr_t", self._managed)), _CAPSULE_NAME, None)


class FakeTensor:
    """What hcclpy reads from a torch tensor: data_ptr(), numel(), dtype, device, is_contiguous()."""

    def __init__(self, ptr: int, numel: int, dtype: str = "float32", device: str = "npu", index: int = 0,
                 contiguous: bool = True) -> None:
        self._ptr, self._numel, self._contiguous = ptr, numel, contiguous
        self.dtype = _TorchDtype(dtype)
        self.device = SimpleNamespace(type=device, index=index)

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return self._numel

    def is_contiguous(self) -> bool:
        return self._contiguous


class _TorchDtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


# ------------------------------------------------------------------------- C call guard

class NoCCalls:
    """Stands in for a communicator's C function table: any HCCL function called is recorded."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.calls: List[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("Hccl"):
            def called(*args: Any) -> int:
                self.calls.append(name)
                raise AssertionError(f"{name} was called")
            return called
        return getattr(self._real, name)


Case = Tuple[str, Callable[[], Any], type, str]


def _run_matrix(cases: Sequence[Case]) -> List[str]:
    failures = []
    for label, call, expected, pattern in cases:
        try:
            call()
        except expected as exc:
            if not re.search(pattern, str(exc)):
                failures.append(f"{label}: {type(exc).__name__} message {str(exc)!r} does not match {pattern!r}")
        except BaseException as exc:  # noqa: BLE001 - reported
            failures.append(f"{label}: expected {expected.__name__}, got {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{label}: no exception (expected {expected.__name__} matching {pattern!r})")
    return failures


def _run_without_c(comm: Any, cases: List[Any]) -> List[str]:
    """:func:`_run_matrix` with the communicator's C functions replaced by ones that record any
    call: a refusal must come before C (a call is one more failure)."""
    real_api = comm._api
    guard = comm._api = NoCCalls(real_api)
    try:
        failures = _run_matrix(cases)
    finally:
        comm._api = real_api
    if guard.calls:
        failures.append(f"C functions were called: {guard.calls}")
    return failures


def _matrix(rank: int, size: int, info: bytes) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    peer = 1 - rank
    other = rank + 2  # another device of this process
    s = hcclpy.Device(rank).create_stream()
    closed = hcclpy.Device(rank).create_stream()
    closed.close()
    foreign_stream = hcclpy.Device(other).create_stream()
    f32 = hcclpy.from_numpy(np.arange(8, dtype=np.float32))
    f32b = hcclpy.zeros(8, "float32")
    f32_16 = hcclpy.zeros(16, "float32")
    i32 = hcclpy.zeros(8, "int32")
    i32_16 = hcclpy.zeros(16, "int32")
    small = hcclpy.zeros(3, "float32")
    odd = hcclpy.zeros(3, "float32")
    big = hcclpy.zeros(32, "float32")
    foreign = hcclpy.zeros(8, "float32", device=other)
    gone = hcclpy.zeros(8, "float32")
    gone.close()
    dead = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=rank), 0, device=rank)
    dead.destroy()
    host = np.zeros(8, np.float32)
    event = hcclpy.Device(rank).create_event()
    SUM = ReduceOp.SUM
    cm = comm
    me = rank
    cases: List[Case] = [
        # ---- wrong types
        ("comm not a communicator", lambda: C.all_reduce("comm", f32, f32b), TypeError, "comm must be"),
        ("comm None", lambda: C.broadcast(None, f32), TypeError, "comm must be"),
        ("send int", lambda: cm.all_reduce(5, f32b), TypeError, "^send must be a buffer"),
        ("recv str", lambda: cm.all_reduce(f32, "x"), TypeError, "^recv must be a buffer"),
        ("buf list", lambda: cm.broadcast([1.0, 2.0]), TypeError,
         r"^buf must be a buffer .*got list; host values go in a numpy\.ndarray"),
        ("op name", lambda: cm.all_reduce(f32, f32b, "avg"), ValueError,
         r"^op='avg' is not a reduce operation \(sum, prod, max, min\); HCCL has no average: reduce with sum"),
        ("op name, not an average", lambda: cm.all_reduce(f32, f32b, "xor"), ValueError,
         r"^op='xor' is not a reduce operation \(sum, prod, max, min\)$"),
        ("op int", lambda: cm.all_reduce(f32, f32b, 7), ValueError, "op=7"),
        ("op None", lambda: cm.all_reduce(f32, f32b, None), ValueError, "op=None"),
        ("op bool", lambda: cm.reduce(f32, f32b, True), ValueError, "op=True"),
        ("op float", lambda: cm.all_reduce(f32, f32b, 2.0, stream=s), ValueError, r"^op=2\.0 is not a reduce"),
        ("op numpy float", lambda: cm.reduce_scatter(f32_16, f32b, np.float64(1)), ValueError, "^op="),
        ("out with device V op", lambda: cm.all_gather_v(f32, f32_16, [8, 8], out=host), TypeError,
         "^the output is given twice"),
        ("stream int", lambda: cm.all_reduce(f32, f32b, stream=5), TypeError, "^stream must be"),
        ("stream event", lambda: cm.broadcast(f32, stream=event), TypeError, "^stream must be"),
        ("stream int barrier", lambda: cm.barrier(stream=1), TypeError, "^stream must be"),
        ("root str", lambda: cm.broadcast(f32, root="0"), ValueError, "^root='0'"),
        ("root float", lambda: cm.reduce(f32, f32b, "sum", 1.0), ValueError, "^root=1.0"),
        ("root bool", lambda: cm.scatter(f32_16, f32b, root=True), ValueError, "^root=True"),
        ("peer None", lambda: cm.send(f32, None), ValueError, "^peer=None"),
        ("tuple of 2", lambda: cm.broadcast((f32.ptr, 8)), TypeError, r"^buf as a tuple must be \(ptr, count, dtype\)"),
        ("tuple ptr str", lambda: cm.broadcast(("0x1", 8, "float32")), TypeError, r"^buf\[0\] \(ptr\)"),
        ("tuple ptr negative", lambda: cm.broadcast((-8, 8, "float32")), TypeError, r"^buf\[0\] \(ptr\)"),
        ("tuple count float", lambda: cm.broadcast((f32.ptr, 1.5, "float32")), ValueError, r"^buf\[1\] \(count\)"),
        ("tuple dtype", lambda: cm.broadcast((f32.ptr, 8, "complex64")), TypeError, r"^buf\[2\] \(dtype\)"),
        ("tuple dtype bool", lambda: cm.broadcast((f32.ptr, 8, np.bool_)), TypeError, r"^buf\[2\] \(dtype\)"),
        ("items not tuples", lambda: cm.batch_send_recv([f32]), ValueError, r"^items\[0\] must be"),
        ("items kind", lambda: cm.batch_send_recv([("put", f32, peer)]), ValueError, r"^items\[0\] must be"),
        ("items short", lambda: cm.batch_send_recv([("send", f32)]), ValueError, r"^items\[0\] must be"),
        ("items buffer", lambda: cm.batch_send_recv([("send", f32, peer), ("recv", "x", peer)]), TypeError,
         r"^items\[1\] buffer must be"),
        # ---- negative and huge counts
        ("tuple count negative", lambda: cm.broadcast((f32.ptr, -1, "float32")), ValueError, r"^buf\[1\] \(count\)"),
        ("send_counts negative", lambda: cm.all_to_all_v(f32, f32b, [-1, 1], [1, 1]), ValueError,
         "^send_counts must not contain negative"),
        ("recv_counts negative", lambda: cm.all_to_all_v(f32, f32b, [1, 1], [1, -1]), ValueError,
         "^recv_counts must not contain negative"),
        ("send_displs negative", lambda: cm.all_to_all_v(f32, f32b, [1, 1], [1, 1], [0, -1]), ValueError,
         "^send_displs must not contain negative"),
        ("send_counts length", lambda: cm.all_to_all_v(f32, f32b, [1, 1, 1], [1, 1]), ValueError,
         "^send_counts must hold 2 non-negative ints"),
        ("recv_displs length", lambda: cm.all_to_all_v(f32, f32b, [1, 1], [1, 1], None, [0]), ValueError,
         "^recv_displs must hold 2"),
        ("send_counts float", lambda: cm.all_to_all_v(f32, f32b, [1.5, 1], [1, 1]), ValueError, "^send_counts"),
        ("send_counts str", lambda: cm.all_to_all_v(f32, f32b, "11", [1, 1]), ValueError, "^send_counts"),
        ("send_counts huge", lambda: cm.all_to_all_v(f32, f32b, [2**64, 1], [1, 1]), ValueError, "^send_counts"),
        ("send_counts past send", lambda: cm.all_to_all_v(f32, f32b, [2**30, 1], [1, 1]), ValueError,
         "^send holds 8 elements"),
        ("send_counts past HCCL's limit", lambda: cm.all_to_all_v(f32, f32b, [2**40, 1], [1, 1]), ValueError,
         r"^send_counts holds a value above HCCL's largest supported count 0x7FFFFFFFF \(34359738367\), "
         r"got \[1099511627776, 1\]$"),
        ("recv_displs past recv", lambda: cm.all_to_all_v(f32, f32b, [1, 1], [1, 1], None, [0, 8]), ValueError,
         "^recv holds 8 elements"),
        ("matrix shape", lambda: cm.all_to_all_vc(f32, f32b, [[1, 1]]), ValueError,
         "^send_count_matrix must be a 2 x 2"),
        ("matrix negative", lambda: cm.all_to_all_vc(f32, f32b, [[1, -1], [1, 1]]), ValueError,
         "^send_count_matrix"),
        ("matrix float", lambda: cm.all_to_all_vc(f32, f32b, [[1.0, 1.0], [1.0, 1.0]]), ValueError,
         "^send_count_matrix"),
        ("matrix row", lambda: cm.all_to_all_vc(f32, f32b, [[9, 9], [9, 9]]), ValueError, "^send holds 8 elements"),
        ("matrix column", lambda: cm.all_to_all_vc(f32_16, f32b, [[5, 5], [5, 5]]), ValueError,
         "^recv holds 8 elements"),
        ("agv counts", lambda: cm.all_gather_v(f32, f32_16, [3, 3]), ValueError, rf"^recv_counts\[{me}\] = 3"),
        ("agv recv", lambda: cm.all_gather_v(f32, f32_16, [8, 8], [0, 9]), ValueError, "^recv holds 16"),
        ("rsv recv", lambda: cm.reduce_scatter_v(f32_16, small, [8, 8]), ValueError, "^recv holds 3"),
        ("rsv send", lambda: cm.reduce_scatter_v(f32, f32b, [8, 8]), ValueError, "^send holds 8"),
        # ---- mismatched dtypes
        ("all_reduce dtypes", lambda: cm.all_reduce(f32, i32), TypeError, "^send is fp32 but recv is int32"),
        ("all_reduce dtypes (fast path)", lambda: cm.all_reduce(f32, i32, SUM, stream=s), TypeError,
         "^send is fp32 but recv is int32"),
        ("reduce dtypes", lambda: cm.reduce(f32, i32, "sum", me), TypeError, "^send is fp32 but recv is int32"),
        ("reduce_scatter dtypes", lambda: cm.reduce_scatter(i32_16, f32b), TypeError, "^send is int32 but recv"),
        ("all_gather dtypes", lambda: cm.all_gather(f32, i32_16), TypeError, "^send is fp32 but recv"),
        ("all_to_all dtypes", lambda: cm.all_to_all(f32, i32), TypeError, "^send is fp32 but recv"),
        ("all_to_all_v dtypes", lambda: cm.all_to_all_v(f32, i32, [1, 1], [1, 1]), TypeError, "^send is fp32"),
        ("all_to_all_vc dtypes", lambda: cm.all_to_all_vc(f32, i32, [[1, 1], [1, 1]]), TypeError, "^send is fp32"),
        ("all_gather_v dtypes", lambda: cm.all_gather_v(f32, i32_16, [8, 8]), TypeError, "^send is fp32"),
        ("reduce_scatter_v dtypes", lambda: cm.reduce_scatter_v(f32_16, i32, [8, 8]), TypeError, "^send is fp32"),
        ("scatter dtypes", lambda: cm.scatter(i32_16, f32b, me), TypeError, "^send is int32 but recv is fp32"),
        # ---- too-small buffers
        ("all_reduce recv small", lambda: cm.all_reduce(f32, small), ValueError, "^send has 8 elements but recv 3"),
        ("all_reduce recv small (fast path)", lambda: cm.all_reduce(f32, small, SUM, stream=s), ValueError,
         "^send has 8 elements but recv 3"),
        ("reduce recv small", lambda: cm.reduce(f32, small, "sum", me), ValueError, "^send has 8 elements but recv 3"),
        ("all_gather recv small", lambda: cm.all_gather(f32, f32b), ValueError, "^recv must hold send's count"),
        ("reduce_scatter send small", lambda: cm.reduce_scatter(f32, f32b), ValueError, "^send must hold recv's count"),
        ("all_to_all sizes", lambda: cm.all_to_all(f32, small), ValueError, "^send and recv must hold the same"),
        ("all_to_all not a multiple", lambda: cm.all_to_all(odd, small), ValueError, "multiple of size 2"),
        ("scatter root send", lambda: cm.scatter(f32, f32b, me), ValueError, "^send must hold recv's count"),
        ("scatter root None", lambda: cm.scatter(None, f32b, me), ValueError, "^send must be a buffer on the root"),
        # ---- wrong roots and peers
        ("broadcast root -1", lambda: cm.broadcast(f32, -1), ValueError, "^root=-1 must be a rank"),
        ("broadcast root size", lambda: cm.broadcast(f32, 2), ValueError, r"^root=2 must be a rank .*\(0\.\.1\)"),
        ("reduce root", lambda: cm.reduce(f32, f32b, "sum", 5), ValueError, "^root=5"),
        ("scatter root", lambda: cm.scatter(f32_16, f32b, 2**40), ValueError, f"^root={2**40}"),
        ("send self", lambda: cm.send(f32, me), ValueError, f"^peer={me} is this rank"),
        ("recv self", lambda: cm.recv(f32b, me), ValueError, f"^peer={me} is this rank"),
        ("send out of range", lambda: cm.send(f32, 2), ValueError, "^peer=2 must be a rank"),
        ("recv negative", lambda: cm.recv(f32b, -1), ValueError, "^peer=-1"),
        ("batch self unpaired", lambda: cm.batch_send_recv([("send", f32, me)]), ValueError,
         rf"^items\[0\] is a send to this rank itself \(rank {me}\) with no matching receive from itself"),
        ("batch out of range", lambda: cm.batch_send_recv([("recv", f32b, 3)]), ValueError, r"^items\[0\] peer=3"),
        ("batch sends and receives one array", lambda: cm.batch_send_recv([("send", f32, peer), ("recv", f32, peer)],
                                                                          stream=s), ValueError,
         r"^items\[0\] and items\[1\] overlap in memory"),
        ("batch receives into overlapping views",
         lambda: cm.batch_send_recv([("recv", big[:8], peer), ("send", f32, peer), ("recv", big[4:12], peer)]),
         ValueError, r"^items\[0\] and items\[2\] overlap"),
        ("batch overlap, checked path", lambda: cm.batch_send_recv([("send", f32, peer),
                                                                    ("recv", (f32.ptr + 4, 2, "float32"), peer)]),
         ValueError, r"^items\[0\] and items\[1\] overlap"),
        # ---- closed or foreign-device streams
        ("closed stream", lambda: cm.broadcast(f32, stream=closed), ValueError, "^stream is closed"),
        ("closed stream (fast path)", lambda: cm.all_reduce(f32, f32b, SUM, stream=closed), ValueError,
         "^stream is closed"),
        ("closed stream barrier", lambda: cm.barrier(stream=closed), ValueError, "^stream is closed"),
        ("closed stream batch", lambda: cm.batch_send_recv([], stream=closed), ValueError, "^stream is closed"),
        ("foreign stream", lambda: cm.all_gather(f32, f32_16, stream=foreign_stream), ValueError,
         f"^stream is on device {other} but communicator .* device {me}"),
        ("foreign stream (fast path)", lambda: cm.all_reduce(f32, f32b, SUM, stream=foreign_stream), ValueError,
         f"^stream is on device {other}"),
        ("foreign stream send", lambda: cm.send(f32, peer, stream=foreign_stream), ValueError, "^stream is on device"),
        # ---- destroyed communicators
        ("destroyed", lambda: dead.all_reduce(f32, f32b), ValueError, "was destroyed"),
        ("destroyed (fast path)", lambda: dead.all_reduce(f32, f32b, SUM, stream=s), ValueError, "was destroyed"),
        ("destroyed functional", lambda: C.barrier(dead), ValueError, "was destroyed"),
        # ---- host and non-contiguous buffers
        # A NumPy array as the first buffer is staged by hcclpy.host; mixed with device memory it is refused.
        ("numpy recv", lambda: cm.all_reduce(f32, host), TypeError, "^send and recv mix a NumPy array with a device buffer"),
        ("numpy out with device send", lambda: cm.all_reduce(f32, out=host), TypeError, "^send and recv mix a NumPy array with a device buffer"),
        ("numpy batch item", lambda: cm.batch_send_recv([("send", f32, peer), ("recv", host, peer)]), TypeError,
         "^batch_send_recv mixes NumPy arrays with device buffers"),
        ("cpu tensor", lambda: cm.all_reduce(FakeTensor(host.ctypes.data, 8, device="cpu"), f32b), TypeError,
         "^send is a CPU tensor in host memory"),
        ("non-contiguous tensor", lambda: cm.all_reduce(f32, FakeTensor(f32b.ptr, 8, index=me, contiguous=False)),
         ValueError, "^recv must be contiguous"),
        ("tensor dtype", lambda: cm.broadcast(FakeTensor(f32.ptr, 8, dtype="complex64", index=me)), TypeError,
         r"^buf.dtype=.* is not a data type"),
        ("tensor numel negative", lambda: cm.broadcast(FakeTensor(f32.ptr, -1, index=me)), ValueError,
         r"^buf.numel\(\) is -1; it must be an int in \[0, 2\*\*64\)"),
        ("tensor numel float", lambda: cm.broadcast(FakeTensor(f32.ptr, 2.0, index=me)), ValueError, r"^buf.numel\(\)"),
        ("tensor without a device", lambda: cm.broadcast(SimpleNamespace(data_ptr=lambda: f32.ptr, numel=lambda: 8)),
         TypeError, r"^buf \(SimpleNamespace\) has data_ptr\(\) and numel\(\) but no device, dtype, is_contiguous"),
        ("dlpack cpu", lambda: cm.broadcast(FakeDLPack(host.ctypes.data, (8,), device_type=DL_CPU)), TypeError,
         "^buf is a FakeDLPack in host memory"),
        ("dlpack strided", lambda: cm.broadcast(FakeDLPack(big.ptr, (4, 4), strides=(8, 1), device_id=me)),
         ValueError, r"^buf must be C-contiguous, its strides are \(8, 1\)"),
        ("dlpack complex", lambda: cm.broadcast(FakeDLPack(big.ptr, (4,), code=5, bits=64, device_id=me)), TypeError,
         "^buf has DLPack type code 5"),
        ("closed array", lambda: cm.broadcast(gone), ValueError, "^buf is a closed DeviceArray"),
        ("closed array (fast path)", lambda: cm.all_reduce(gone, f32b, SUM, stream=s), ValueError,
         "^send is a closed DeviceArray"),
        # ---- other devices' memory
        ("foreign send", lambda: cm.all_reduce(foreign, f32b), ValueError,
         f"^send is memory of device {other} but communicator .* device {me}"),
        ("foreign send (fast path)", lambda: cm.all_reduce(foreign, f32b, SUM, stream=s), ValueError,
         f"^send is memory of device {other}"),
        ("foreign recv", lambda: cm.all_reduce(f32, foreign), ValueError, f"^recv is memory of device {other}"),
        ("foreign buf", lambda: cm.broadcast(foreign), ValueError, f"^buf is memory of device {other}"),
        ("foreign reduce", lambda: cm.reduce(foreign, None, "sum", me), ValueError, "^send is memory of device"),
        ("foreign all_gather", lambda: cm.all_gather(f32, hcclpy.zeros(16, "float32", device=other)), ValueError,
         "^recv is memory of device"),
        ("foreign send p2p", lambda: cm.send(foreign, peer), ValueError, f"^buf is memory of device {other}"),
        ("foreign recv p2p", lambda: cm.recv(foreign, peer), ValueError, f"^buf is memory of device {other}"),
        ("foreign batch", lambda: cm.batch_send_recv([("send", foreign, peer)]), ValueError,
         r"^items\[0\] buffer is memory of device"),
        ("foreign tensor", lambda: cm.broadcast(FakeTensor(foreign.ptr, 8, index=other)), ValueError,
         f"^buf is memory of device {other}"),
        ("foreign dlpack", lambda: cm.broadcast(FakeDLPack(foreign.ptr, (8,), device_id=other)), ValueError,
         f"^buf is memory of device {other}"),
        # ---- in-place rules, overlaps, alignment
        ("all_to_all in place", lambda: cm.all_to_all(f32_16, f32_16), ValueError,
         "^all_to_all does not work in place"),
        ("all_to_all_v in place", lambda: cm.all_to_all_v(f32, f32, [1, 1], [1, 1]), ValueError,
         "^all_to_all_v does not work in place"),
        ("all_to_all_vc in place", lambda: cm.all_to_all_vc(f32, f32, [[1, 1], [1, 1]]), ValueError,
         "^all_to_all_vc does not work in place"),
        ("all_gather_v in place", lambda: cm.all_gather_v(f32_16[0:8], f32_16, [8, 8]), ValueError,
         "^all_gather_v does not work in place"),
        ("reduce_scatter_v in place", lambda: cm.reduce_scatter_v(f32_16, f32_16[0:8], [8, 8]), ValueError,
         "^reduce_scatter_v does not work in place"),
        ("all_reduce overlap", lambda: cm.all_reduce(big[0:8], big[4:12]), ValueError, "^send and recv overlap"),
        ("all_reduce overlap (fast path)", lambda: cm.all_reduce(big[0:8], big[4:12], SUM, stream=s), ValueError,
         "^send and recv overlap"),
        ("reduce overlap", lambda: cm.reduce(big[0:8], big[2:10], "sum", me), ValueError, "^send and recv overlap"),
        ("all_gather wrong block", lambda: cm.all_gather(big[1:5], big[0:8]), ValueError, "^send overlaps recv"),
        ("reduce_scatter wrong block", lambda: cm.reduce_scatter(big[0:16], big[1:9]), ValueError,
         "^recv overlaps send"),
        ("scatter wrong block", lambda: cm.scatter(big[0:16], big[1:9], me), ValueError, "^recv overlaps send"),
        ("misaligned send", lambda: cm.all_reduce((f32.ptr + 2, 4, "float32"), (f32b.ptr, 4, "float32")), ValueError,
         "^send at 0x[0-9a-f]+ is not aligned to its 4-byte fp32"),
        ("misaligned recv", lambda: cm.reduce((f32.ptr, 2, "float32"), (f32b.ptr + 1, 2, "float32"), "sum", me),
         ValueError, "^recv at 0x[0-9a-f]+ is not aligned"),
        ("misaligned reduce_scatter", lambda: cm.reduce_scatter((big.ptr + 4, 8, "float64"), (f32b.ptr, 4, "float64")),
         ValueError, "^send at 0x[0-9a-f]+ is not aligned to its 8-byte fp64"),
    ]
    failures = _run_without_c(comm, cases)
    # The communicator still works: both ranks reach the same all_reduce.
    x = hcclpy.from_numpy(np.full(8, rank + 1, np.float32))
    comm.all_reduce(x, f32b, SUM, stream=s)
    comm.all_reduce(x, None, "max", stream=s)
    s.synchronize()
    if f32b.to_numpy().tolist() != [3.0] * 8 or x.to_numpy().tolist() != [2.0] * 8:
        failures.append(f"all_reduce after the matrix gave {f32b.to_numpy()} / {x.to_numpy()}")
    if comm.async_error() is not None:
        failures.append(f"async error after the matrix: {comm.async_error()}")
    for thing in (s, foreign_stream, event):
        thing.close()
    comm.destroy()
    return failures


def test_bad_arguments_are_refused_before_any_c_call() -> None:
    out = ranks.run_threads(_matrix, 2)
    problems = [f"rank {r}: {p}" for r, failures in enumerate(out) for p in failures]
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


# ------------------------------------------------------------- constructors and factories

def test_communicator_arguments() -> None:
    info = hcclpy.RootInfo.generate(device=0)
    cases: List[Case] = [
        ("nranks 0", lambda: hcclpy.Communicator(0, info, 0), ValueError, "^nranks=0 must be an int >= 1"),
        ("nranks str", lambda: hcclpy.Communicator("2", info, 0), ValueError, "^nranks='2'"),
        ("nranks bool", lambda: hcclpy.Communicator(True, info, 0), ValueError, "^nranks=True"),
        ("rank too big", lambda: hcclpy.Communicator(2, info, 2), ValueError, r"^rank=2 must be an int in \[0, 2\)"),
        ("rank negative", lambda: hcclpy.Communicator(2, info, -1), ValueError, "^rank=-1"),
        ("rank float", lambda: hcclpy.Communicator(2, info, 0.0), ValueError, "^rank=0.0"),
        ("root info str", lambda: hcclpy.Communicator(1, "info", 0), TypeError, "^root info must be bytes"),
        ("root info None", lambda: hcclpy.Communicator(1, None, 0), TypeError, "^root info must be bytes"),
        ("root info short", lambda: hcclpy.Communicator(1, b"\0" * 4107, 0), ValueError,
         "^root info must be exactly 4108 bytes, got 4107"),
        ("root info long", lambda: hcclpy.RootInfo(b"\0" * 5000), ValueError, "^root info must be exactly 4108"),
        ("config int", lambda: hcclpy.Communicator(1, info, 0, config=5), TypeError,
         "^config must be a CommConfig, a dict or None"),
        ("config key", lambda: hcclpy.Communicator(1, info, 0, config={"timeout": 5}), TypeError,
         r"^unknown CommConfig key\(s\) \['timeout'\] \(did you mean 'exec_timeout' for 'timeout'\?\)"),
        ("config value", lambda: hcclpy.Communicator(1, info, 0, config={"qos": 9}), ValueError,
         r"^CommConfig.qos=9 must be an int in \[0, 7\]"),
        ("device out of range", lambda: hcclpy.Communicator(1, info, 0, device=hcclpy.device_count()), ValueError,
         "^device=.* is out of range"),
        ("device negative", lambda: hcclpy.Communicator(1, info, 0, device=-2), ValueError, "^device=-2"),
        ("device str", lambda: hcclpy.Communicator(1, info, 0, device="npu:0"), TypeError,
         "^device=.* must be an int device id"),
    ]
    failures = _run_matrix(cases)
    assert not failures, "\n".join(failures)
    # The root info was not consumed by any of them.
    comm = hcclpy.Communicator(1, info, 0, device=0)
    comm.destroy()


def test_garbage_root_info_is_refused_by_the_library_quickly() -> None:
    with pytest.raises(hcclpy.HcclError) as info:
        hcclpy.Communicator(1, bytes(range(256)) * 16 + b"\0" * 12, 0, device=0)
    assert info.value.name == "HCCL_E_PARA" and "root info" in str(info.value)
    assert str(info.value).startswith("creating rank 0 of 1 on Device(0): HcclCommInitRootInfo failed: HCCL_E_PARA")


@pytest.mark.parametrize("field, value, error, pattern", [
    ("buffer_size_mb", 0, ValueError, r"^CommConfig.buffer_size_mb=0 must be an int in \[1, "),
    ("buffer_size_mb", 2**32, ValueError, "^CommConfig.buffer_size_mb="),
    ("buffer_size_mb", 1.5, ValueError, "^CommConfig.buffer_size_mb=1.5"),
    ("deterministic", 3, ValueError, r"^CommConfig.deterministic=3 must be an int in \[0, 2\]"),
    ("deterministic", "yes", ValueError, "^CommConfig.deterministic='yes'"),
    ("name", 5, TypeError, "^CommConfig.name must be a str, got int"),
    ("name", "x" * 128, ValueError, "^CommConfig.name=.* must be at most 127 UTF-8 bytes"),
    ("name", "a\0b", ValueError, "^CommConfig.name=.* no NUL"),
    ("udi", b"bytes", TypeError, "^CommConfig.udi must be a str"),
    ("op_expansion_mode", 7, ValueError, "^CommConfig.op_expansion_mode=7"),
    ("rdma_traffic_class", 3, ValueError, "^CommConfig.rdma_traffic_class=3 must be a multiple of 4"),
    ("rdma_traffic_class", 256, ValueError, "^CommConfig.rdma_traffic_class=256"),
    ("rdma_service_level", 8, ValueError, "^CommConfig.rdma_service_level=8"),
    ("world_rank_id", -1, ValueError, "^CommConfig.world_rank_id=-1"),
    ("job_id", 2**64, ValueError, "^CommConfig.job_id="),
    ("exec_timeout", -1, ValueError, r"^CommConfig.exec_timeout=-1 must be a number of seconds in \[0, 2\*\*31\)"),
    ("exec_timeout", True, ValueError, "^CommConfig.exec_timeout=True"),
    ("exec_timeout", "10", ValueError, "^CommConfig.exec_timeout='10'"),
    ("algorithm", "x" * 1600, ValueError, "^CommConfig.algorithm=.* at most 1599"),
    ("buffer_name", 1, TypeError, "^CommConfig.buffer_name must be a str"),
    ("qos", 8, ValueError, "^CommConfig.qos=8"),
])
def test_invalid_comm_config_fields(field: str, value: Any, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        hcclpy.CommConfig(**{field: value})
    with pytest.raises(error, match=pattern):
        hcclpy.CommConfig.coerce({field: value})


def test_valid_comm_config_fields() -> None:
    cfg = hcclpy.CommConfig(buffer_size_mb=1, deterministic=True, name="n" * 127, udi="u", op_expansion_mode=6,
                            rdma_traffic_class=252, rdma_service_level=7, world_rank_id=2**32 - 1, job_id=2**64 - 1,
                            exec_timeout=0.5, algorithm="level0:NA;level1:H-D_R", buffer_name="b", qos=0)
    assert cfg.deterministic == 1
    assert hcclpy.CommConfig.coerce(cfg) is cfg and hcclpy.CommConfig.coerce(None) is None
    assert hcclpy.CommConfig.coerce({"name": "x"}) == hcclpy.CommConfig(name="x")
    c = cfg.to_c()
    assert c.hcclExecTimeOut == 1  # rounded up, never to 0 ("no limit")


def test_runtime_factory_arguments() -> None:
    cases: List[Case] = [
        ("shape negative", lambda: hcclpy.empty(-1), ValueError, r"^shape=-1 has a negative dimension"),
        ("shape str", lambda: hcclpy.zeros("8"), TypeError, "^shape='8' must be an int or a sequence of ints"),
        ("shape float", lambda: hcclpy.empty((2, 1.5)), TypeError, "^shape="),
        ("dtype", lambda: hcclpy.empty(4, "complex64"), TypeError, "^dtype='complex64' is not a data type HCCL"),
        ("dtype object", lambda: hcclpy.empty(4, object), TypeError, "^dtype="),
        ("dtype bool", lambda: hcclpy.zeros(4, np.bool_), TypeError, "^dtype="),
        ("device", lambda: hcclpy.empty(4, device=hcclpy.device_count()), ValueError, "^device=.* is out of range"),
        ("from_numpy list", lambda: hcclpy.from_numpy([1, 2]), TypeError, "^array must be a numpy.ndarray"),
        ("from_numpy complex", lambda: hcclpy.from_numpy(np.zeros(2, np.complex64)), TypeError,
         "^dtype=.* is not a data type"),
        ("pinned shape", lambda: hcclpy.pinned_empty(-2), ValueError, "^shape=-2"),
        ("pinned dtype", lambda: hcclpy.pinned_empty(2, "str"), TypeError, "^dtype='str'"),
        ("reduce op name", lambda: hcclpy.types.as_reduce_op("mean"), ValueError, "^op='mean' is not a reduce"),
        ("reduce op a DataType", lambda: hcclpy.types.as_reduce_op(hcclpy.DataType.INT32), TypeError,
         r"^op=<DataType\.INT32: 2> is not a reduce operation \(sum, prod, max, min\): it is a DataType$"),
        ("dtype a ReduceOp", lambda: hcclpy.empty(4, hcclpy.ReduceOp.MAX), TypeError,
         r"^dtype=<ReduceOp\.MAX: 2> is not a data type: it is a ReduceOp$"),
        ("shape a float", lambda: hcclpy.empty(2.5), TypeError, r"^shape=2\.5 must be an int or a sequence of ints$"),
        ("shape with a bool", lambda: hcclpy.empty((2, True)), TypeError,
         r"^shape=\(2, True\) must be an int or a sequence of ints \(a bool is not a size\)$"),
        ("reshape None", lambda: hcclpy.empty(6).reshape(None), TypeError, "^shape=None must be"),
        ("dtype 'float'", lambda: hcclpy.empty(2, "float"), TypeError,
         r"^dtype='float' is ambiguous \(float32 in torch, float64 in NumPy\): name the size"),
        ("dtype 'int'", lambda: hcclpy.empty(2, "int"), TypeError, r"^dtype='int' is ambiguous"),
        ("misaligned view", lambda: hcclpy.zeros(64, "uint8")[1:33].view("float32"), ValueError,
         r"^this array starts at 0x[0-9a-f]+, which is not aligned to 4-byte fp32 elements"),
        ("copy on another device's stream", lambda: hcclpy.zeros(2, device=0).copy_from(
            np.zeros(2, np.float32), stream=hcclpy.Device(1).create_stream()), ValueError,
         "^stream is on device 1 but this array is on device 0"),
        ("event on another device's stream", lambda: hcclpy.Device(0).create_event().record(
            hcclpy.Device(1).create_stream()), ValueError, "^stream is on device 1 but the event was created on device 0"),
        ("dtype None", lambda: hcclpy.empty(2, None), TypeError, "^dtype=None is not a data type"),
        ("stream handle beyond 64 bits", lambda: hcclpy.Stream.from_handle(2**64 + 8, device=0), ValueError,
         r"^handle=\d+ must be a non-zero aclrtStream address \(an int below 2\*\*64\)"),
        ("stream handle of no device", lambda: hcclpy.Stream.from_handle(8, device=hcclpy.device_count()),
         ValueError, "^device=.* is out of range"),
    ]
    failures = _run_matrix(cases)
    assert not failures, "\n".join(failures)


def test_dtype_names_numpy_codes_and_types() -> None:
    """Names and NumPy type codes that say the size resolve; the Python types follow NumPy."""
    from hcclpy.types import DataType, as_datatype

    for value, want in [("f4", DataType.FP32), ("<f8", DataType.FP64), ("i8", DataType.INT64), ("e", DataType.FP16),
                        ("float32", DataType.FP32), ("Float64", DataType.FP64), (float, DataType.FP64),
                        (int, DataType.INT64), ("half", DataType.FP16), ("long", DataType.INT64),
                        ("bfloat16", DataType.BFP16), ("torch.int32", DataType.INT32)]:
        assert as_datatype(value) is want, value
    assert hcclpy.zeros(4, "<f4").view("uint8").nbytes == 16


# ------------------------------------------------------------ accepted buffer kinds (positive)

def test_tuple_tensor_and_dlpack_buffers_work() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        x = hcclpy.from_numpy(np.arange(8, dtype=np.float32), device=0)
        y = hcclpy.zeros(8, "float32", device=0)
        flags = hcclpy.from_numpy(np.array([1, 0, 1, 1], np.uint8), device=0)
        out_flags = hcclpy.zeros(4, "uint8", device=0)
        with hcclpy.Device(0).create_stream() as s:
            comm.all_reduce((x.ptr, 8, "float32"), (y.ptr, 8, hcclpy.DataType.FP32), "sum", stream=s)
            comm.all_reduce(FakeTensor(x.ptr, 8), FakeTensor(y.ptr, 8), "max", stream=s)
            comm.all_reduce(FakeTensor(flags.ptr, 4, dtype="bool"), FakeTensor(out_flags.ptr, 4, dtype="bool"),
                            "max", stream=s)
            comm.all_reduce(FakeDLPack(x.ptr, (2, 4)), FakeDLPack(y.ptr, (2, 4), strides=(4, 1)), "min", stream=s)
            comm.broadcast((x.ptr, 0, "float32"), stream=s)  # zero elements
            s.synchronize()
        assert y.to_numpy().tolist() == list(range(8))
        assert out_flags.to_numpy().tolist() == [1, 0, 1, 1]


# ------------------------------------------------- edge cases once found wrong, now regression tests

def _one_rank() -> Tuple[hcclpy.Communicator, hcclpy.Stream]:
    return hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0), hcclpy.Device(0).create_stream()


def test_fast_path_checks_comm_type() -> None:
    comm, s = _one_rank()
    x, y = hcclpy.zeros(4, "float32", device=0), hcclpy.zeros(4, "float32", device=0)
    try:
        with pytest.raises(TypeError, match="comm must be"):
            C.all_reduce(object(), x, y, ReduceOp.SUM, stream=s)
    finally:
        s.close()
        comm.destroy()


def test_tuple_count_beyond_uint64() -> None:
    comm, s = _one_rank()
    x = hcclpy.zeros(4, "float32", device=0)
    try:
        with pytest.raises(ValueError, match=r"buf\[1\] \(count\)"):
            comm.broadcast((x.ptr, 2**64, "float32"), stream=s)
    finally:
        s.close()
        comm.destroy()


def test_count_plus_displacement_overflow() -> None:
    comm, s = _one_rank()
    x, y = hcclpy.zeros(4, "float32", device=0), hcclpy.zeros(4, "float32", device=0)
    try:
        with pytest.raises(ValueError, match="send"):
            comm.all_to_all_v(x, y, [2**63], [1], [2**63], [0], stream=s)
    finally:
        s.synchronize()
        s.close()
        comm.destroy()


_OVERSIZED_ARRAYS = """
import hcclpy
comms = hcclpy.Communicator.init_all([0, 1])
comm, s = comms[0], comms[0].device.create_stream()
calls = []
class Guard:  # any HCCL function called is a failure: the refusal must come first
    def __init__(self, real):
        self.real = real
    def __getattr__(self, name):
        if name.startswith("Hccl"):
            return lambda *args: calls.append(name) or 0
        return getattr(self.real, name)
comm._api = Guard(comm._api)
big = 0x800000000  # one element over HCCL's largest count (32 GiB of int8: a 64 GB card holds it)
a, b = hcclpy.empty(big, "int8", device=0), hcclpy.empty(big, "int8", device=0)
half = hcclpy.empty(big // 2, "int8", device=0)
small = hcclpy.empty(8, "int8", device=0)
for name, call in [("all_reduce", lambda: comm.all_reduce(a, stream=s)),
                   ("all_reduce out of place", lambda: comm.all_reduce(a, b, stream=s)),
                   ("reduce", lambda: comm.reduce(a, b, stream=s)),
                   ("broadcast", lambda: comm.broadcast(a, stream=s)),
                   ("all_gather", lambda: comm.all_gather(half, a, stream=s)),
                   ("reduce_scatter", lambda: comm.reduce_scatter(a, half, stream=s)),
                   ("scatter root", lambda: comm.scatter(a, half, stream=s)),
                   ("scatter", lambda: comm.scatter(None, half, root=1, stream=s)),
                   ("all_to_all", lambda: comm.all_to_all(a, b, stream=s)),
                   ("send", lambda: comm.send(a, 1, stream=s)),
                   ("recv", lambda: comm.recv(a, 1, stream=s)),
                   ("batch", lambda: comm.batch_send_recv([("send", a, 1)], stream=s)),
                   ("all_to_all_v counts", lambda: comm.all_to_all_v(small, small, [big, 0], [0, 0], [0, 0], [0, 0],
                                                                      stream=s)),
                   ("all_gather_v displacements", lambda: comm.all_gather_v(small, small, [8, 0], [0, big],
                                                                            stream=s)),
                   ("reduce_scatter_v packed", lambda: comm.reduce_scatter_v(small, small, [big, 8], stream=s)),
                   ("all_to_all_vc", lambda: comm.all_to_all_vc(small, small, [[0, big], [0, 0]], stream=s))]:
    try:
        call()
    except ValueError as exc:
        assert "largest supported" in str(exc), (name, str(exc))
        print(name, "refused")
    else:
        print(name, "accepted")
assert not calls, calls
s.close()
for c in comms:
    c.destroy()
"""


def test_arrays_over_hccls_largest_count_are_refused_before_any_c_call() -> None:
    """The fast paths took such arrays to C, which refused them (HCCL_E_PARA): one element over the
    limit is 32 GiB of int8, which a 64 GB card holds. The simulator's device memory is sparse."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HCCLPY_BACKEND": "sim", "HCCLPY_SIM_DEVICE_MEMORY": "96G"}
    done = subprocess.run([sys.executable, "-c", _OVERSIZED_ARRAYS], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")[:-1]
    assert len(lines) == 16 and all(line.endswith(" refused") for line in lines), done.stdout


def test_split_ranks_must_be_ints() -> None:
    comm, s = _one_rank()
    made = []
    try:
        failures = _run_matrix([
            ("float rank", lambda: made.append(comm.split([0.4])), ValueError, "ranks"),
            ("str rank", lambda: made.append(comm.split(["a"])), ValueError, "ranks"),
            ("not iterable", lambda: made.append(comm.split(5)), TypeError, "ranks"),
        ])
        assert not failures, "\n".join(failures)
    finally:
        for sub in made:
            if sub is not None:
                sub.destroy()
        s.close()
        comm.destroy()


def test_batch_send_recv_items_not_iterable() -> None:
    comm, s = _one_rank()
    try:
        for bad in (None, 5):
            with pytest.raises(TypeError, match="items"):
                comm.batch_send_recv(bad, stream=s)
    finally:
        s.close()
        comm.destroy()


def test_allocation_size_beyond_size_t() -> None:
    for allocate in (lambda: hcclpy.empty(2**62, "float64", device=0), lambda: hcclpy.pinned_empty(2**62, "float64")):
        with pytest.raises((ValueError, hcclpy.AclError)):
            allocate()


def test_dlpack_strides_of_size_one_dimensions_are_ignored() -> None:
    comm, s = _one_rank()
    x = hcclpy.from_numpy(np.arange(8, dtype=np.float32), device=0)
    try:
        comm.broadcast(FakeDLPack(x.ptr, (1, 8), strides=(1, 1)), stream=s)
        s.synchronize()
    finally:
        s.close()
        comm.destroy()


def test_runtime_objects_take_numpy_scalars_and_refuse_what_cannot_work() -> None:
    assert hcclpy.Device(np.int64(1)) is hcclpy.Device(1)
    stream = hcclpy.Device(0).create_stream()
    stream.synchronize(timeout=np.float32(0.5))  # a NumPy number of seconds is a number of seconds
    with pytest.raises(TypeError, match="^timing='no' must be True or False"):
        hcclpy.Device(0).create_event(timing="no")
    events = [hcclpy.Device(d).create_event() for d in (0, 1)]
    for event in events:
        event.record()
        event.synchronize()
    with pytest.raises(ValueError, match="^elapsed_time needs two events of one device"):
        events[0].elapsed_time(events[1])
    stream.close()
    with pytest.raises(ValueError, match="closed Stream"):
        stream.record()  # refused before an event is made for it
    for event in events:
        event.close()


def test_malformed_null_huge_and_foreign_buffers_are_refused_before_any_c_call() -> None:
    """Malformed DLPack capsules once crashed the process (ndim=10**6) or failed in cffi or C; NULL
    pointers and counts past HCCL's limit failed in C; other accelerators' memory was taken as NPU memory."""
    comm, s = _one_rank()
    x = hcclpy.zeros(8, "float32", device=0)
    no_device = FakeTensor(x.ptr, 8)
    no_device.device = None
    attribute = FakeTensor(x.ptr, 8)
    attribute.is_contiguous = True  # type: ignore[assignment,method-assign]
    cases: List[Case] = [
        ("dlpack ndim huge", lambda: comm.broadcast(FakeDLPack(x.ptr, (8,), ndim=10**6), stream=s), ValueError,
         r"^buf is a DLPack tensor of ndim=1000000; ndim must be in 0\.\.64$"),
        ("dlpack ndim negative", lambda: comm.broadcast(FakeDLPack(x.ptr, (8,), ndim=-5), stream=s), ValueError,
         r"^buf is a DLPack tensor of ndim=-5"),
        ("dlpack NULL shape", lambda: comm.all_reduce(FakeDLPack(x.ptr, (8,), null_shape=True), stream=s),
         ValueError, r"^send is a DLPack tensor of ndim=1 whose shape is NULL"),
        ("dlpack negative size", lambda: comm.broadcast(FakeDLPack(x.ptr, (-1,)), stream=s), ValueError,
         r"^buf is a DLPack tensor of shape \(-1,\); sizes must not be negative"),
        ("dlpack negative second size", lambda: comm.broadcast(FakeDLPack(x.ptr, (2, -4)), stream=s), ValueError,
         r"^buf is a DLPack tensor of shape \(2, -4\)"),
        ("dlpack NULL data", lambda: comm.broadcast(FakeDLPack(0, (8,)), stream=s), ValueError,
         r"^buf points to address 0 \(NULL\) but holds 8 elements"),
        ("tuple NULL", lambda: comm.all_reduce((0, 8, "float32"), x, stream=s), ValueError,
         r"^send points to address 0 \(NULL\) but holds 8 elements"),
        ("tensor NULL", lambda: comm.send(FakeTensor(0, 8), 0, stream=s), ValueError,
         r"^buf points to address 0 \(NULL\)"),
        ("tuple count past HCCL's limit", lambda: comm.broadcast((x.ptr, 2**40, "float32"), stream=s), ValueError,
         rf"^buf holds {2**40} elements, more than HCCL's largest supported count 0x7FFFFFFFF"),
        ("all_reduce count past HCCL's limit", lambda: comm.all_reduce((x.ptr, 2**36, "int8"), stream=s),
         ValueError, "^send holds .* largest supported count"),
        ("batch count past HCCL's limit", lambda: comm.batch_send_recv([("send", (x.ptr, 2**36, "int8"), 0)],
                                                                          stream=s),
         ValueError, r"^items\[0\] buffer holds .* largest supported count"),
        ("dlpack CUDA", lambda: comm.broadcast(FakeDLPack(x.ptr, (8,), device_type=2), stream=s), TypeError,
         r"^buf is a FakeDLPack in memory of DLPack device type 2 \(CUDA\); a collective needs NPU memory"),
        ("dlpack unknown device type", lambda: comm.broadcast(FakeDLPack(x.ptr, (8,), device_type=99), stream=s),
         TypeError, r"^buf is a FakeDLPack in memory of DLPack device type 99 \(unknown\)"),
        ("cuda tensor", lambda: comm.broadcast(FakeTensor(x.ptr, 8, device="cuda"), stream=s), TypeError,
         r"^buf is a tensor on device .*'cuda'.*; a collective on device memory needs NPU tensors"),
        ("meta tensor", lambda: comm.broadcast(FakeTensor(x.ptr, 8, device="meta"), stream=s), TypeError,
         "^buf is a tensor on device .*'meta'"),
        ("mps tensor", lambda: comm.all_reduce(x, FakeTensor(x.ptr, 8, device="mps"), stream=s), TypeError,
         "^recv is a tensor on device .*'mps'"),
        ("tensor device None", lambda: comm.broadcast(no_device, stream=s), TypeError,
         "^buf is a tensor on device None"),
        ("tensor device string", lambda: comm.broadcast(SimpleNamespace(
            data_ptr=lambda: x.ptr, numel=lambda: 8, dtype="float32", device="cuda:0", is_contiguous=lambda: True),
            stream=s), TypeError, "^buf is a tensor on device 'cuda:0'"),
        ("tensor index True", lambda: comm.broadcast(FakeTensor(x.ptr, 8, index=True), stream=s), TypeError,  # type: ignore[arg-type]
         r"^buf.device.index is True; it must be a device number"),
        ("tensor index negative", lambda: comm.broadcast(FakeTensor(x.ptr, 8, index=-1), stream=s), TypeError,
         r"^buf.device.index is -1"),
        ("is_contiguous an attribute", lambda: comm.broadcast(attribute, stream=s), TypeError,
         r"^buf.is_contiguous must be a method \(as torch's\), got bool"),
    ]
    try:
        failures = _run_without_c(comm, cases)
    finally:
        s.close()
        comm.destroy()
    assert not failures, "\n".join(failures)


def test_npu_tensors_and_empty_null_buffers_are_accepted() -> None:
    comm, s = _one_rank()
    x = hcclpy.from_numpy(np.arange(8, dtype=np.float32), device=0)
    try:
        comm.broadcast(FakeTensor(x.ptr, 8, device="npu", index=None), stream=s)  # type: ignore[arg-type]
        comm.broadcast(SimpleNamespace(data_ptr=lambda: x.ptr, numel=lambda: 8, dtype=_TorchDtype("float32"),
                                       device="npu:0", is_contiguous=lambda: True), stream=s)
        comm.broadcast((0, 0, "float32"), stream=s)  # an empty buffer may be NULL
        comm.broadcast(FakeDLPack(0, (0,)), stream=s)
        comm.broadcast(FakeDLPack(x.ptr, ()), stream=s)  # a 0-d tensor: one element
        s.synchronize()
        assert x.to_numpy().tolist() == list(range(8))
    finally:
        s.close()
        comm.destroy()


def _no_staging(comm: Any) -> None:
    raise AssertionError("the call was staged")


def test_numpy_calls_refuse_stream_and_none_arguments_before_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """NumPy calls once ignored stream= (any value), and op/root/peer=None failed only after staging."""

    comm, s = _one_rank()
    x, m = np.arange(4, dtype=np.float32), [[4]]
    event = hcclpy.Device(0).create_event()
    closed = hcclpy.Device(0).create_stream()
    closed.close()
    monkeypatch.setattr(hcclpy.collectives._staging, "acquire", _no_staging)
    no_stream = "^stream= is for device buffers, got {}: calls on NumPy arrays block on hcclpy's own stream"
    calls: List[Tuple[str, Callable[[Any], Any]]] = [
        ("all_reduce", lambda st: comm.all_reduce(x, stream=st)),
        ("reduce", lambda st: comm.reduce(x, stream=st)),
        ("reduce_scatter", lambda st: comm.reduce_scatter(x, stream=st)),
        ("reduce_scatter_v", lambda st: comm.reduce_scatter_v(x, send_counts=[4], stream=st)),
        ("broadcast", lambda st: comm.broadcast(x, stream=st)),
        ("all_gather", lambda st: comm.all_gather(x, stream=st)),
        ("all_gather_v", lambda st: comm.all_gather_v(x, recv_counts=[4], stream=st)),
        ("scatter", lambda st: comm.scatter(x, stream=st)),
        ("all_to_all", lambda st: comm.all_to_all(x, stream=st)),
        ("all_to_all_v", lambda st: comm.all_to_all_v(x, send_counts=[4], recv_counts=[4], stream=st)),
        ("all_to_all_vc", lambda st: comm.all_to_all_vc(x, send_count_matrix=m, stream=st)),
        ("batch_send_recv", lambda st: comm.batch_send_recv([], stream=st) if False else
         comm.all_reduce(x, x.copy(), stream=st)),
    ]
    cases: List[Case] = [(f"{name} stream={value!r}", (lambda call=call, value=value: call(value)), TypeError,
                          no_stream.format(type(value).__name__))
                         for name, call in calls for value in (5, "x", s, closed, event)]
    cases += [
        ("all_reduce op None", lambda: comm.all_reduce(x, op=None), ValueError, "^op=None"),
        ("reduce op None", lambda: comm.reduce(x, None, None), ValueError, "^op=None"),
        ("reduce_scatter op None", lambda: comm.reduce_scatter(x, None, None), ValueError, "^op=None"),
        ("reduce_scatter_v op None", lambda: comm.reduce_scatter_v(x, send_counts=[4], op=None), ValueError,
         "^op=None"),
        ("reduce root None", lambda: comm.reduce(x, None, "sum", None), ValueError, "^root=None must be a rank"),
        ("broadcast root None", lambda: comm.broadcast(x, None), ValueError, "^root=None must be a rank"),
        ("scatter root None", lambda: comm.scatter(x, None, None), ValueError, "^root=None must be a rank"),
        ("send peer None", lambda: comm.send(x, None), ValueError, "^peer=None must be a rank"),
        ("recv peer None", lambda: comm.recv(x, None), ValueError, "^peer=None must be a rank"),
        ("batch peer None", lambda: comm.batch_send_recv([("send", x, None)]), ValueError,
         r"^items\[0\] peer=None must be a rank"),
        ("batch peer out of range", lambda: comm.batch_send_recv([("recv", x, 3)]), ValueError,
         r"^items\[0\] peer=3 must be a rank"),
        ("batch peer self unpaired", lambda: comm.batch_send_recv([("send", x, 0)]), ValueError,
         r"^items\[0\] is a send to this rank itself \(rank 0\) with no matching receive from itself"),
        ("batch kind", lambda: comm.batch_send_recv([("put", x, 0)]), ValueError, r"^items\[0\] must be \('send'"),
        ("batch kind a list", lambda: comm.batch_send_recv([(["send"], x, 0)]), ValueError,
         r"^items\[0\] must be \('send' \| 'recv', buffer, peer\), got \(\['send'\]"),
    ]
    try:
        failures = _run_matrix(cases)
    finally:
        event.close()
        s.close()
        comm.destroy()
    assert not failures, "\n".join(failures)


def test_device_batch_with_an_unhashable_kind_is_refused_clearly() -> None:
    comm, s = _one_rank()
    x = hcclpy.zeros(4, "float32", device=0)
    try:
        with pytest.raises(ValueError, match=r"^items\[0\] must be \('send' \| 'recv', buffer, peer\)"):
            comm.batch_send_recv([(["send"], x, 0)], stream=s)
    finally:
        s.close()
        comm.destroy()


def test_numpy_calls_name_the_argument_that_is_wrong() -> None:
    """A device buffer as recv of a NumPy call was reported as out=; a list with out= as a device call's out=."""
    comm, s = _one_rank()
    x, dev = np.arange(4, dtype=np.float32), hcclpy.zeros(4, "float32", device=0)
    cases: List[Case] = [
        ("all_reduce recv device", lambda: comm.all_reduce(x, dev), TypeError,
         "^send and recv mix a NumPy array with a device buffer"),
        ("all_gather recv list", lambda: comm.all_gather(x, [0.0] * 4), TypeError, "^recv must be a buffer .*got list"),
        ("scatter recv device", lambda: comm.scatter(x, dev), TypeError, "^send and recv mix a NumPy array"),
        ("reduce_scatter_v recv device", lambda: comm.reduce_scatter_v(x, dev, [4]), TypeError,
         "^send and recv mix a NumPy array"),
        ("recv and out", lambda: comm.all_reduce(x, np.zeros(4, np.float32), out=np.zeros(4, np.float32)), TypeError,
         "^the output is given twice"),
        ("scatter list with out", lambda: comm.scatter([1, 2], out=np.zeros(1, np.float32)), TypeError,
         r"^send must be a buffer .*got list; host values go in a numpy\.ndarray \(np\.asarray\(\.\.\.\)\)"),
        ("broadcast float", lambda: comm.broadcast(1.0), TypeError, "^buf must be a buffer .*got float"),
        ("reduce_scatter_v counts where recv goes", lambda: comm.reduce_scatter_v(x, [4]), TypeError,
         r"^recv must be a buffer .*got list; .*counts .* go by name"),
        ("reduce_scatter_v op where the counts go", lambda: comm.reduce_scatter_v(x, None, "max"), ValueError,
         r"^send_counts must hold 1 non-negative int \(one per rank\), got 'max', a reduce op: pass it by name, "
         r"op='max' \(it comes after the counts\)$"),
        ("all_gather_v output where the counts go", lambda: comm.all_gather_v(x, None, np.zeros(2)), ValueError,
         r"^recv_counts must hold 1 non-negative int \(one per rank\), got a float64 array of shape \(2,\)$"),
        ("broadcast of two device buffers", lambda: comm.broadcast(dev, hcclpy.zeros(4, device=0)), ValueError,
         r"^root=<hcclpy\.DeviceArray .*> must be a rank of communicator .*: a buffer came where the root goes "
         r"\(broadcast works in place: broadcast\(buf, root=\.\.\.\)\)$"),
        ("all_gather of a tuple without recv", lambda: comm.all_gather((dev.ptr, 4, "float32"), stream=s), TypeError,
         r"^all_gather needs recv: hcclpy makes outputs for DeviceArray and numpy.ndarray input, not for a tuple"),
        ("all_reduce op a DataType", lambda: comm.all_reduce(dev, op=hcclpy.DataType.INT32, stream=s), TypeError,
         r"^op=<DataType\.INT32: 2> is not a reduce operation"),
        ("NumPy all_reduce op a DataType", lambda: comm.all_reduce(x, op=hcclpy.DataType.FP16), TypeError,
         r"^op=<DataType\.FP16: 3> is not a reduce operation"),
    ]
    try:
        failures = _run_matrix(cases)
    finally:
        s.close()
        comm.destroy()
    assert not failures, "\n".join(failures)


def test_a_peer_in_a_world_of_one_says_how_to_start_more_ranks() -> None:
    # What a script started without a launcher meets: hcclpy.init() made a world of one.
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        for call, said in ((lambda: comm.send(np.ones(3, np.float32), 1), r"peer=1 must be a rank .*it has one rank"),
                           (lambda: comm.recv(np.ones(3, np.float32), 0), r"peer=0 is this rank.*one rank"),
                           (lambda: comm.broadcast(np.ones(3, np.float32), root=2), r"root=2 .*it has one rank")):
            with pytest.raises(ValueError, match=said + r".*start the script with one, e\.g\. hcclpy run -n 2"):
                call()
