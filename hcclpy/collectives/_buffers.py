"""Turning what callers pass as a buffer into (pointer, count, dtype, device).

Accepted, in order of speed:

* :class:`hcclpy.DeviceArray` (its pointer is already a C value);
* ``(ptr, count, dtype)`` tuples, with ``ptr`` a device address as int;
* tensors with ``data_ptr()`` / ``numel()`` / ``dtype`` / ``device`` on an NPU (torch_npu
  tensors: ``device.type == "npu"``);
* objects with ``__dlpack__`` describing NPU memory (DLPack device type ``kDLExtDev``, as torch
  exports torch_npu tensors).

Host memory (NumPy arrays, CPU tensors) is refused here: the host-array API stages it. Other
accelerators' memory (CUDA, MPS, meta tensors...) is refused too: HCCL would read it as NPU memory.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import numpy as np

from .. import _ffi
from .._ffi import dlpack
from ..runtime import DeviceArray
from ..types import DataType, as_datatype

__all__ = ["Buffer", "MAX_COUNT", "resolve"]

# The largest element count HCCL takes in one call (SYS_MAX_COUNT of the real library; the
# simulator's HCCL_SIM_MAX_COUNT): larger counts fail in C with HCCL_E_PARA.
MAX_COUNT = 0x7FFFFFFFF


class Buffer(NamedTuple):
    ptr: Any                 # cffi void *
    address: int             # the same pointer as an int
    count: int               # elements
    dtype: DataType
    dtype_c: int             # the same as a plain int (cffi converts IntEnums slowly)
    itemsize: int
    device: Optional[int]    # logical device id when known
    keep: Any                # object that owns the memory (kept alive by the caller)


# NamedTuple's generated constructor is Python code; building the tuple directly is much cheaper.
_make = tuple.__new__


def _buffer(ptr: Any, address: int, count: int, dtype: DataType, device: Optional[int], keep: Any,
            argument: str) -> Buffer:
    """The buffer of a tuple, tensor or DLPack object (the general paths), with the check they share."""
    if not address and count:
        raise ValueError(f"{argument} points to address 0 (NULL) but holds {count} elements; only an empty "
                         "buffer may be NULL")
    return _make(Buffer, (ptr, address, count, dtype, int(dtype), dtype.itemsize, device, keep))


_DLPACK_TYPES = {(0, 8): DataType.INT8, (0, 16): DataType.INT16, (0, 32): DataType.INT32, (0, 64): DataType.INT64,
                 (1, 8): DataType.UINT8, (1, 16): DataType.UINT16, (1, 32): DataType.UINT32,
                 (1, 64): DataType.UINT64, (2, 16): DataType.FP16, (2, 32): DataType.FP32, (2, 64): DataType.FP64,
                 (4, 16): DataType.BFP16, (6, 8): DataType.UINT8}  # 6 = bool, moved as bytes (as torch_npu does)


# DLPack's device types (dlpack.h) other than host memory and NPU memory, for error messages.
_DLPACK_DEVICES = {2: "CUDA", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 13: "CUDA managed",
                   14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}


def _host_error(argument: str, what: str) -> TypeError:
    return TypeError(f"{argument} is {what} in host memory; a collective on device memory needs it for every "
                     "buffer (hcclpy.DeviceArray, a (ptr, count, dtype) tuple, an NPU tensor). NumPy arrays are "
                     "staged through the device when every array of the call is one; CPU tensors, through the "
                     "hcclpy torch backend.")


def _from_tuple(buf: tuple, argument: str) -> Buffer:
    if len(buf) != 3:
        raise TypeError(f"{argument} as a tuple must be (ptr, count, dtype), got {len(buf)} items")
    ptr, count, dtype = buf
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)) or not 0 <= ptr < 2**64:
        raise TypeError(f"{argument}[0] (ptr) must be a device address as an int in [0, 2**64), got {ptr!r}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count < 2**64:
        raise ValueError(f"{argument}[1] (count) must be an int in [0, 2**64), got {count!r}")
    dt = as_datatype(dtype, argument=f"{argument}[2] (dtype)")
    return _buffer(_ffi.cast("void *", int(ptr)), int(ptr), int(count), dt, None, buf, argument)


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
    device_id = None if index is None else int(index)
    return _buffer(_ffi.cast("void *", int(address)), int(address), int(count), dt, device_id, buf, argument)


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
    return _buffer(_ffi.cast("void *", info.ptr), info.ptr, math.prod(info.shape), dt, info.device_id, buf,
                   argument)


def resolve(buf: Any, argument: str) -> Buffer:
    """Describe the device buffer ``buf`` (see the module docstring for what is accepted).

    Raises
    ------
    TypeError
        For host memory or an unsupported object or dtype.
    ValueError
        For a closed array, a non-contiguous tensor or a bad tuple.
    """
    if type(buf) is DeviceArray:
        alloc = buf._alloc
        if alloc.live_device < 0:
            raise ValueError(f"{argument} is a closed DeviceArray (its memory was freed)")
        return _make(Buffer, (buf._cptr, alloc.ptr + buf._offset, buf._size, buf._dtype, buf._dtype_c,
                              buf._itemsize, alloc.device_id, buf))
    if isinstance(buf, tuple):
        return _from_tuple(buf, argument)
    if isinstance(buf, np.ndarray):
        raise _host_error(argument, "a numpy.ndarray")
    if hasattr(buf, "data_ptr") and hasattr(buf, "numel"):
        return _from_tensor(buf, argument)
    if hasattr(buf, "__dlpack__"):
        return _from_dlpack(buf, argument)
    host_values = isinstance(buf, (list, float, int, np.generic))
    hint = "; host values go in a numpy.ndarray (np.asarray(...))" if host_values else ""
    if buf is None:  # recv left out: only some operations work in place
        hint = "; this operation's device form writes its result there, so it needs one"
    raise TypeError(f"{argument} must be a device buffer (hcclpy.DeviceArray, (ptr, count, dtype) tuple, NPU "
                    f"tensor or DLPack object), got {type(buf).__name__}{hint}")
