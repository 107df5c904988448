"""The one buffer parser: every form the operations accept becomes one :class:`Buffer`.

Accepted:

* :class:`hcclpy.DeviceArray`;
* ``(ptr, count, dtype)`` tuples, with ``ptr`` a device address as int;
* tensors with ``data_ptr()`` / ``numel()`` / ``dtype`` / ``device`` on an NPU (torch_npu
  tensors: ``device.type == "npu"``);
* objects with ``__dlpack__`` describing NPU memory (DLPack device type ``kDLExtDev``, as torch
  exports torch_npu tensors);
* NumPy arrays: host memory, which the operations stage through device memory. Any HCCL type
  travels as itself; complex64 and complex128 as pairs of float32 / float64 (they reduce with
  sum only); any other dtype of fixed size as its bytes (they only move). Inputs that are not
  C-contiguous or not in the machine's byte order are copied to one that is; outputs must be
  writable and C-contiguous.

Other accelerators' memory (CUDA, MPS, meta tensors...) is refused: HCCL would read it as NPU
memory. CPU tensors are staged by the hcclpy torch backend, not here.
"""

from __future__ import annotations

import math
from typing import Any, FrozenSet, NamedTuple, Optional, Protocol, Tuple, TypeVar, Union

import numpy as np

from .. import _ffi
from .._ffi import dlpack
from ..runtime import DeviceArray
from ..types import DataType, ReduceOp, as_datatype

__all__ = ["Buffer", "BufferLike", "BufferT", "MAX_COUNT", "SupportsDLPack", "parse"]

# The largest element count HCCL takes in one call (SYS_MAX_COUNT of the real library; the
# simulator's HCCL_SIM_MAX_COUNT): larger counts fail in C with HCCL_E_PARA.
MAX_COUNT = 0x7FFFFFFFF


class SupportsDLPack(Protocol):
    """An object that exports its memory through DLPack (a torch_npu tensor, say)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...


BufferLike = Union[DeviceArray, np.ndarray, Tuple[int, int, Any], SupportsDLPack]
"""What a buffer argument takes, for type checkers: a :class:`hcclpy.DeviceArray`, a NumPy array, a
``(ptr, count, dtype)`` tuple or an object with ``__dlpack__`` (the parser says at run time what it
refuses)."""

BufferT = TypeVar("BufferT", bound=BufferLike)
"""The buffer type an operation was given, for type checkers: an operation returns the buffer it
writes, of the type passed (a new output is of ``send``'s type: a NumPy array for a NumPy array,
a :class:`hcclpy.DeviceArray` for one)."""


class Buffer:
    """One buffer of an operation, whatever form the caller passed it in. (A class with slots:
    reading its fields is the operations' most frequent step, and slots read fastest.)"""

    __slots__ = ("ptr", "address", "count", "dtype", "dtype_c", "itemsize", "device", "host", "keep", "scale",
                 "shape", "writable", "ops", "source", "_alloc")

    ptr: Any
    """A cffi pointer to the first element."""
    address: int
    """The same pointer as an int."""
    count: int
    """Elements of :attr:`dtype`."""
    dtype: DataType
    """The HCCL type that carries the data."""
    dtype_c: int
    """The same as a plain int (cffi converts IntEnums slowly)."""
    itemsize: int
    """Bytes per element of :attr:`dtype`."""
    device: Optional[int]
    """The logical device id when known; None for host memory or unknown."""
    host: bool
    """Whether this is NumPy memory, staged through the device."""
    keep: Any
    """What keeps the memory alive while queued work uses it: the caller's object, or a
    DeviceArray's allocation."""
    scale: int
    """Elements of :attr:`dtype` per element of the caller's dtype (NumPy pairs and bytes)."""
    shape: Tuple[int, ...]
    """The caller's shape, for results made like this buffer."""
    writable: bool
    """Whether results can be written straight into the caller's memory."""
    ops: Optional[FrozenSet[int]]
    """The reduce op codes that reduce it right; None: all."""
    source: Any
    """Host memory to read from (a C-contiguous copy when the caller's is not)."""
    _alloc: Any              # a DeviceArray's allocation; else None (named as DeviceArray names it: a
                             # stream holding a Buffer keeps that allocation, see hcclpy.runtime)

    @property
    def kind(self) -> str:
        """The caller's dtype, as messages name it."""
        return str(self.keep.dtype) if self.host else self.dtype.name.lower()

    def __repr__(self) -> str:
        where = "host" if self.host else f"device {self.device}"
        return f"<Buffer {self.count} x {self.dtype.name.lower()} at 0x{self.address:x} ({where})>"


def _make(ptr: Any, address: int, count: int, dtype: DataType, device: Optional[int], host: bool, keep: Any,
          scale: int, shape: Tuple[int, ...], writable: bool, ops: Optional[FrozenSet[int]], source: Any,
          alloc: Any) -> Buffer:
    buf = object.__new__(Buffer)
    buf.ptr, buf.address, buf.count, buf.dtype, buf.dtype_c, buf.itemsize = (ptr, address, count, dtype, int(dtype),
                                                                             dtype.itemsize)
    buf.device, buf.host, buf.keep, buf.scale, buf.shape = device, host, keep, scale, shape
    buf.writable, buf.ops, buf.source, buf._alloc = writable, ops, source, alloc
    return buf


def _device_buffer(address: int, count: int, dtype: DataType, device: Optional[int], keep: Any,
                   argument: str) -> Buffer:
    if not address and count:
        raise ValueError(f"{argument} points to address 0 (NULL) but holds {count} elements; only an empty "
                         "buffer may be NULL")
    return _make(_ffi.pointer(address), address, count, dtype, device, False, keep, 1, (count,), True, None,
                 None, None)


_DLPACK_TYPES = {(0, 8): DataType.INT8, (0, 16): DataType.INT16, (0, 32): DataType.INT32, (0, 64): DataType.INT64,
                 (1, 8): DataType.UINT8, (1, 16): DataType.UINT16, (1, 32): DataType.UINT32,
                 (1, 64): DataType.UINT64, (2, 16): DataType.FP16, (2, 32): DataType.FP32, (2, 64): DataType.FP64,
                 (4, 16): DataType.BFP16, (6, 8): DataType.UINT8}  # 6 = bool, moved as bytes (as torch_npu does)

# DLPack's device types (dlpack.h) other than host memory and NPU memory, for error messages.
_DLPACK_DEVICES = {2: "CUDA", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 13: "CUDA managed",
                   14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}


def _host_error(argument: str, what: str) -> TypeError:
    return TypeError(f"{argument} is {what} in host memory; the operations take device buffers "
                     "(hcclpy.DeviceArray, a (ptr, count, dtype) tuple, an NPU tensor) or NumPy arrays (staged "
                     "through the device); CPU tensors go through the hcclpy torch backend")


def _from_tuple(buf: tuple, argument: str) -> Buffer:
    if len(buf) != 3:
        raise TypeError(f"{argument} as a tuple must be (ptr, count, dtype), got {len(buf)} items")
    ptr, count, dtype = buf
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)) or not 0 <= ptr < 2**64:
        raise TypeError(f"{argument}[0] (ptr) must be a device address as an int in [0, 2**64), got {ptr!r}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count < 2**64:
        raise ValueError(f"{argument}[1] (count) must be an int in [0, 2**64), got {count!r}")
    dt = as_datatype(dtype, argument=f"{argument}[2] (dtype)")
    return _device_buffer(int(ptr), int(count), dt, None, buf, argument)


def _from_tensor(buf: Any, argument: str) -> Buffer:
    missing = [name for name in ("device", "dtype", "is_contiguous") if not hasattr(buf, name)]
    if missing:
        raise TypeError(f"{argument} ({type(buf).__name__}) has data_ptr() and numel() but no {', '.join(missing)}: "
                        "a tensor needs all of them")
    device = buf.device
    # torch's device objects have .type ("npu", "cpu") and .index; a bare string such as "npu:0" is read alike.
    kind, _, index = (device.partition(":") if isinstance(device, str)
                      else (getattr(device, "type", None), "", getattr(device, "index", None)))
    if kind == "cpu":
        raise _host_error(argument, "a CPU tensor")
    if kind != "npu":
        # HCCL would take a CUDA, MPS or meta tensor's pointer for NPU memory.
        raise TypeError(f"{argument} is a tensor on device {device!r}; a collective on device memory needs NPU "
                        "tensors (device.type 'npu', torch_npu), or CPU tensors through the hcclpy torch backend")
    if isinstance(index, str):
        index = int(index) if index.isdigit() else None if index == "" else index
    if index is not None and (isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0):
        raise TypeError(f"{argument}.device.index is {index!r}; it must be a device number (an int >= 0) or None")
    is_contiguous = buf.is_contiguous
    if not callable(is_contiguous):
        raise TypeError(f"{argument}.is_contiguous must be a method (as torch's), got "
                        f"{type(is_contiguous).__name__}")
    if not is_contiguous():
        raise ValueError(f"{argument} must be contiguous (call .contiguous() first)")
    dtype_name = str(buf.dtype)
    dt = DataType.UINT8 if dtype_name == "torch.bool" else as_datatype(buf.dtype, argument=f"{argument}.dtype")
    address, count = buf.data_ptr(), buf.numel()
    for name, value in (("data_ptr()", address), ("numel()", count)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**64:
            raise ValueError(f"{argument}.{name} is {value!r}; it must be an int in [0, 2**64)")
    return _device_buffer(int(address), int(count), dt, None if index is None else int(index), buf, argument)


def _from_dlpack(buf: Any, argument: str) -> Buffer:
    info = dlpack.view(buf, argument)
    if info.device_type not in dlpack.NPU_DEVICE_TYPES:
        if info.device_type in dlpack.HOST_DEVICE_TYPES:
            raise _host_error(argument, f"a {type(buf).__name__}")
        name = _DLPACK_DEVICES.get(info.device_type, "unknown")
        raise TypeError(f"{argument} is a {type(buf).__name__} in memory of DLPack device type {info.device_type} "
                        f"({name}); a collective needs NPU memory (type {dlpack.DL_EXT_DEV}, kDLExtDev, as torch "
                        "exports torch_npu tensors)")
    dt = _DLPACK_TYPES.get((info.code, info.bits))
    if dt is None or info.lanes != 1:
        raise TypeError(f"{argument} has DLPack type code {info.code} with {info.bits} bits x {info.lanes} lanes, "
                        "which HCCL does not support")
    if info.strides is not None and math.prod(info.shape) > 1:
        # C-contiguous: each stride is the product of the later dimensions. A dimension of size 1
        # may carry any stride (DLPack allows it, and views produce it).
        step = 1
        for dim, stride in zip(reversed(info.shape), reversed(info.strides)):
            if dim != 1 and stride != step:
                raise ValueError(f"{argument} must be C-contiguous, its strides are {info.strides}")
            step *= dim
    return _device_buffer(info.ptr, math.prod(info.shape), dt, info.device_id, buf, argument)


# ------------------------------------------------------------------------------- NumPy arrays
# HCCL knows twelve data types. Arrays of other dtypes travel as one of them: a complex number as
# its real and imaginary parts (the parts of a sum are the sums of the parts, so sum reduces them),
# any other element of fixed size as its bytes (which only move).

class _Carrier(NamedTuple):
    dtype: DataType  # the HCCL type that carries the elements
    per_element: int  # how many of those make one element of the array
    ops: Optional[FrozenSet[int]]  # the reduce op codes that reduce them right; None: all


_CARRIERS: dict = {}  # by NumPy dtype; bounded: structured dtypes are countless
_COMPLEX_PARTS = {8: DataType.FP32, 16: DataType.FP64}  # complex64 and complex128, by itemsize


def _carrier(dtype: np.dtype, argument: str) -> _Carrier:
    """How elements of ``dtype`` travel (TypeError for those that cannot: Python objects, elements
    of no bytes)."""
    carrier = _CARRIERS.get(dtype)
    if carrier is not None:
        return carrier
    if dtype.hasobject:
        raise TypeError(f"{argument}.dtype is {dtype}, which holds Python objects: the array holds pointers to "
                        "them, which mean nothing in another process; convert it to a dtype of fixed size first")
    if dtype.itemsize == 0:
        raise TypeError(f"{argument}.dtype is {dtype}, whose elements have no bytes: there is nothing to move")
    try:
        hccl = as_datatype(dtype)
    except TypeError:  # no HCCL type of its own
        parts = _COMPLEX_PARTS.get(dtype.itemsize) if dtype.kind == "c" else None
        carrier = (_Carrier(parts, 2, frozenset({ReduceOp.SUM._value_})) if parts is not None
                   else _Carrier(DataType.UINT8, dtype.itemsize, frozenset()))
    else:
        carrier = _Carrier(hccl, 1, None)
    if len(_CARRIERS) >= 256:
        _CARRIERS.clear()
    _CARRIERS[dtype] = carrier
    return carrier


def _from_array(array: np.ndarray, argument: str) -> Buffer:
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(f"{argument} is a masked array: hcclpy moves data, not masks, so its masked elements would "
                        f"be taken as values; pass {argument}.filled(value) or {argument}.data")
    dtype = array.dtype
    flags = array.flags
    writable = flags.writeable and flags.c_contiguous and dtype.isnative
    source = array
    if not dtype.isnative:  # read in the machine's order; results are never written in the other one
        native = dtype.newbyteorder("=")
        _carrier(native, argument)  # refuse what cannot travel before copying
        source = array.astype(native, order="C")
        dtype = native
    elif not flags.c_contiguous:
        source = np.ascontiguousarray(array)
    carrier = _carrier(dtype, argument)
    pointer = _ffi.from_buffer("char[]", source)
    count = source.size * carrier.per_element
    return _make(pointer, source.__array_interface__["data"][0], count, carrier.dtype, None, True, array,
                 carrier.per_element, array.shape, writable, carrier.ops, source, None)


def parse(buf: Any, argument: str) -> Buffer:
    """Describe ``buf``, one operation's buffer named ``argument`` (see the module docstring for
    what is accepted).

    Raises
    ------
    TypeError
        For an object that is no buffer, memory of another accelerator, or an unsupported dtype.
    ValueError
        For a closed array, a non-contiguous tensor or a bad tuple.
    """
    if type(buf) is DeviceArray:  # first: the common call pays one type test and, after its first, one read
        spec = buf._spec
        if spec is None:
            alloc = buf._alloc
            spec = buf._spec = _make(buf._cptr, alloc.ptr + buf._offset, buf._size, buf._dtype, alloc.device_id,
                                     False, alloc, 1, buf._shape, True, None, None, alloc)
        if spec._alloc.live_device < 0:
            raise ValueError(f"{argument} is a closed DeviceArray (its memory was freed)")
        return spec
    if isinstance(buf, np.ndarray):
        return _from_array(buf, argument)
    if isinstance(buf, tuple):
        return _from_tuple(buf, argument)
    if hasattr(buf, "data_ptr") and hasattr(buf, "numel"):
        return _from_tensor(buf, argument)
    if hasattr(buf, "__dlpack__"):
        return _from_dlpack(buf, argument)
    hint = ""
    if isinstance(buf, str) and buf.upper() in ReduceOp.__members__:  # f(send, "max"): an op where recv goes
        hint = f"; {buf!r} names a reduce op: recv comes before op; pass op={buf!r}"
    if isinstance(buf, (list, float, int, np.generic)):
        hint = "; host values go in a numpy.ndarray (np.asarray(...))"
        if argument == "recv" and isinstance(buf, list):
            hint += ("; the counts of the uneven operations go by name (f(send, recv_counts=...), "
                     "f(send, send_counts=..., recv_counts=...), f(send, send_count_matrix=...))")
    raise TypeError(f"{argument} must be a buffer (hcclpy.DeviceArray, numpy.ndarray, (ptr, count, dtype) tuple, "
                    f"NPU tensor or DLPack object), got {type(buf).__name__}{hint}")
