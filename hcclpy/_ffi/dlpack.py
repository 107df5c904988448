"""Reading a DLPack capsule (``obj.__dlpack__()``) without taking ownership of it.

The capsule stays owned by the Python object that produced it; hcclpy only reads the tensor
description and keeps the object alive while it uses the memory.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Optional, Tuple

from ._declarations import ffi as _ffi

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

DL_CPU, DL_CUDA_HOST, DL_ROCM_HOST = 1, 3, 11
HOST_DEVICE_TYPES = frozenset({DL_CPU, DL_CUDA_HOST, DL_ROCM_HOST})
# DLPack has no Ascend device type: torch exports its out-of-tree devices (PrivateUse1, which
# torch_npu's "npu" is) as kDLExtDev. Every other type is another vendor's memory.
DL_EXT_DEV = 12
NPU_DEVICE_TYPES = frozenset({DL_EXT_DEV})
MAX_NDIM = 64  # far beyond any real tensor: an ndim past it is a corrupt or hostile capsule


class DLView(NamedTuple):
    ptr: int
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # in elements; None means C-contiguous
    code: int                           # 0 int, 1 uint, 2 float, 4 bfloat
    bits: int
    lanes: int
    device_type: int
    device_id: int


def view(obj: Any, argument: str = "obj") -> DLView:
    """Describe the tensor behind ``obj.__dlpack__()`` (``argument``: its name in error messages).

    The description is checked before any of it is read further: a capsule that claims a million
    dimensions, or dimensions without a shape array, would have this read memory it does not own.

    Raises
    ------
    TypeError
        If ``obj.__dlpack__()`` does not return a DLPack capsule.
    ValueError
        If its ``ndim`` is outside ``0..MAX_NDIM``, its shape is NULL with ``ndim > 0`` or holds a
        negative size.
    """
    capsule = obj.__dlpack__()
    try:
        address = _get_pointer(capsule, b"dltensor")
    except ValueError:
        raise TypeError(f"{type(obj).__name__}.__dlpack__() did not return an unused 'dltensor' capsule") from None
    tensor = _ffi.cast("DLManagedTensor *", address).dl_tensor
    ndim = int(tensor.ndim)
    if not 0 <= ndim <= MAX_NDIM:
        raise ValueError(f"{argument} is a DLPack tensor of ndim={ndim}; ndim must be in 0..{MAX_NDIM}")
    if ndim and tensor.shape == _ffi.NULL:
        raise ValueError(f"{argument} is a DLPack tensor of ndim={ndim} whose shape is NULL")
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if any(size < 0 for size in shape):
        raise ValueError(f"{argument} is a DLPack tensor of shape {shape}; sizes must not be negative")
    strides = None if tensor.strides == _ffi.NULL else tuple(int(tensor.strides[i]) for i in range(ndim))
    ptr = int(_ffi.cast("uintptr_t", tensor.data)) + int(tensor.byte_offset)
    return DLView(ptr, shape, strides, int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes),
                  int(tensor.device.device_type), int(tensor.device.device_id))
