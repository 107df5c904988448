"""Device memory (typed arrays) and pinned host memory."""

from __future__ import annotations

import math
import os
import operator
import weakref
from functools import partial
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _ffi
from ..errors import UnsupportedError
from ..types import DataType, as_datatype, numpy_dtype
from ._device import Device, DeviceLike, check_visible
from ._lifetime import CLOSES, attach, close_now
from . import _stream
from ._stream import Stream

__all__ = ["DeviceArray", "HostRegistration", "IpcHandle", "PointerAttributes", "empty", "from_numpy", "pinned_empty",
           "pointer_attributes", "register_host", "zeros"]

ShapeLike = Union[int, Sequence[int]]
"""What a ``shape`` argument takes: a number of elements, or a sequence of dimensions."""

_H2D, _D2H, _D2D = 1, 2, 3  # aclrtMemcpyKind
_HUGE_FIRST = 0  # ACL_MEM_MALLOC_HUGE_FIRST


_MAX_BYTES = 2**63  # size_t is 64 bits; anything near it is a mistake, not an allocation

# Allocations closed while a stream still held an array of them for queued work, by id: freed
# when no stream holds one any more (looked at by later allocations and closes) or by the
# collector. Weak: a deferred allocation nobody references is the collector's to free.
_deferred: dict[int, weakref.ref] = {}


def _byte_size(dims: Tuple[int, ...], itemsize: int) -> int:
    nbytes = math.prod(dims) * itemsize
    if nbytes >= _MAX_BYTES:
        raise ValueError(f"shape {dims} of {itemsize}-byte elements needs {nbytes} bytes, more than any device has")
    return nbytes


def _byte_count(value: Any, argument: str) -> int:
    """``value`` as a count of bytes or rows: a non-negative int (not a bool)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argument}={value!r} must be an int, not a bool")
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(f"{argument}={value!r} must be an int, got {type(value).__name__}") from None
    if not 0 <= count < _MAX_BYTES:
        raise ValueError(f"{argument}={count} must be from 0 to 2**63 - 1")
    return count


def _extent_from_start(array: np.ndarray) -> int:
    """The bytes of ``array``'s memory from its first element to the end of its last one (the
    span a copy may reach from its first byte: the gaps between its rows, never past its end)."""
    if array.size == 0:
        return 0
    return array.itemsize + sum((n - 1) * s for n, s in zip(array.shape, array.strides) if s > 0)


def _shape_of(shape: ShapeLike, negative_ok: bool = False) -> Tuple[int, ...]:
    bools = (bool, np.bool_)
    try:
        given = (shape,) if isinstance(shape, (int, np.integer, *bools)) else tuple(shape)
        dims = tuple(operator.index(d) for d in given if not isinstance(d, bools))  # as NumPy: no bool is a size
    except TypeError:
        dims = None
    if dims is None or len(dims) != len(given):
        hint = " (a bool is not a size)" if dims is not None else ""
        raise TypeError(f"shape={shape!r} must be an int or a sequence of ints{hint}") from None
    if any(d < (-1 if negative_ok else 0) for d in dims):
        raise ValueError(f"shape={shape!r} has a negative dimension")
    return dims


def _device_of(device: Any) -> Device:
    if device is None:
        return Device.current() or Device(0)
    dev = Device(device)
    check_visible(dev.id)  # here: an empty array makes no C call that would refuse the id
    return dev


def _held_by_a_stream(alloc: _Allocation) -> bool:
    """True if a stream (open, or parked after collection) keeps ``alloc`` alive for queued work:
    an array of it, or the allocation itself (which the operations hold for their arrays)."""
    return any(_stream.holds(item, alloc) for item in _stream.held_objects(alloc.device_id))


def _free_deferred() -> None:
    """Free the closed allocations that no stream holds any more."""
    for key, ref in list(_deferred.items()):
        alloc = ref()
        if alloc is not None and not _held_by_a_stream(alloc):
            _deferred.pop(key, None)
            close_now(alloc.finalizer)


def copy_bytes(dst: int, src: int, nbytes: int, kind: int, stream: Optional[Stream] = None) -> None:
    """Copy ``nbytes`` from address ``src`` to address ``dst`` (``kind``: an aclrtMemcpyKind), done
    when it returns, or queued on ``stream`` (the caller keeps the memory alive until it is done)."""
    if nbytes == 0:
        return
    pointer = _ffi.pointer
    if stream is None:
        rc = _ffi.api().aclrtMemcpy(pointer(dst), nbytes, pointer(src), nbytes, kind)
        if rc:
            raise _ffi.acl_failure(rc, "aclrtMemcpy")
    else:
        _ffi.check_acl(_ffi.api().aclrtMemcpyAsync(pointer(dst), nbytes, pointer(src), nbytes, kind,
                                                   stream._cdata()), "aclrtMemcpyAsync")


def settle(alloc: _Allocation, stream: Optional[Stream] = None) -> None:
    """Order an access to ``alloc`` after the work queued that uses it, on every stream: the host
    waits for those streams (``stream`` None: the access happens now), or ``stream`` waits for them
    on the device. The streams' keep-alive lists say which work that is; with nothing queued, it
    costs a look at empty lists and no C call."""
    for user in _stream.users(alloc, alloc.device_id):
        if stream is None:
            user.synchronize()
        elif user is not stream:
            stream.wait_stream(user)


_IPC_KEY_BYTES = 65  # what aclrtIpcMemGetExportKey writes
_IPC_EXPORT_CHECK_PIDS, _IPC_EXPORT_ANY_PROCESS = 0, 1  # ACL_RT_IPC_MEM_EXPORT_FLAG_*
_IPC_IMPORT_PEER_ACCESS = 1  # ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS


class IpcHandle(NamedTuple):
    """What another process needs to map a :class:`DeviceArray` of this one: made by
    :meth:`DeviceArray.ipc_export`, picklable, opened with :meth:`DeviceArray.ipc_import`."""

    key: str
    """The key ``aclrtIpcMemGetExportKey`` gave."""
    pid: int
    """The exporting process."""
    device: int
    """The device the memory is on, in the exporting process."""
    shape: Tuple[int, ...]
    """The array's shape."""
    dtype: str
    """The :class:`~hcclpy.DataType` name."""
    nbytes: int
    """The bytes shared."""


class _Rows(NamedTuple):
    """A 2-D copy as ``aclrtMemcpy2d`` takes it: ``height`` rows of ``width`` bytes, the
    destination's rows ``dst_pitch`` bytes apart, the source's ``src_pitch``."""

    width: int
    height: int
    dst_pitch: int
    src_pitch: int


def _host_rows(array: np.ndarray, kind: int) -> Optional[_Rows]:
    """The copy of ``array`` to (``kind`` _D2H) or from (_H2D) a contiguous device array when
    ``array`` is rows along its first axis, each contiguous and apart by a pitch of at least a row
    (the layout ``aclrtMemcpy2d`` copies in one call, such as a slice ``big[:, 2:6]``), on a CANN
    with 2-D copies; None otherwise."""
    if array.ndim < 2 or array.shape[0] < 2 or array.size == 0:
        return None
    pitch, row = array.strides[0], array[0]
    if not row.flags.c_contiguous or pitch < row.nbytes or not _ffi.api().present.get("aclrtMemcpy2d"):
        return None
    width = row.nbytes
    return _Rows(width, array.shape[0], pitch, width) if kind == _D2H else _Rows(width, array.shape[0], width, pitch)


def copy_rows(dst: int, src: int, rows: _Rows, kind: int, stream: Optional[Stream] = None) -> None:
    """Copy ``rows`` from address ``src`` to address ``dst`` (``kind``: an aclrtMemcpyKind), done
    when it returns, or queued on ``stream``: rows packed on both sides in one copy, others in one
    ``aclrtMemcpy2d(Async)``, or a copy per row where CANN has no 2-D copy (device to device, which
    ``aclrtMemcpy2d`` does not do, or a CANN without it)."""
    width, height, dst_pitch, src_pitch = rows
    if width == 0 or height == 0:
        return
    if height == 1 or dst_pitch == src_pitch == width:
        copy_bytes(dst, src, width * height, kind, stream)
        return
    bound = _ffi.api()
    if kind == _D2D or not bound.present.get("aclrtMemcpy2d"):
        for row in range(height):
            copy_bytes(dst + row * dst_pitch, src + row * src_pitch, width, kind, stream)
        return
    pointer = _ffi.pointer
    if stream is None:
        _ffi.check_acl(bound.aclrtMemcpy2d(pointer(dst), dst_pitch, pointer(src), src_pitch, width, height, kind),
                       "aclrtMemcpy2d")
    else:
        _ffi.check_acl(bound.aclrtMemcpy2dAsync(pointer(dst), dst_pitch, pointer(src), src_pitch, width, height,
                                                kind, stream._cdata()), "aclrtMemcpy2dAsync")


def _free_block(ptr: int, keys: list) -> None:
    """Free the aclrtMalloc block at ``ptr`` after closing the IPC keys exported for it (CANN: the
    exporter closes its keys before it frees)."""
    bound = _ffi.api()
    while keys:
        _ffi.check_acl(bound.aclrtIpcMemClose(keys[-1]), "aclrtIpcMemClose")
        keys.pop()
    _ffi.check_acl(bound.aclrtFree(_ffi.pointer(ptr)), "aclrtFree")


class _Allocation:
    """One aclrtMalloc block; freed by DeviceArray.close() on any array that views it, or by the collector."""

    __slots__ = ("__weakref__", "ptr", "nbytes", "device", "device_id", "live_device", "finalizer", "keys")

    def __init__(self, nbytes: int, device: Device) -> None:
        self.nbytes = nbytes
        self.device = device
        self.device_id = device.id
        self.live_device = device.id  # -1 once freed: one attribute for "live and where" on fast paths
        self.ptr = 0
        self.keys: list = []  # the IPC keys exported for it, closed before it is freed
        release = None
        if nbytes > 0:
            if _deferred:  # first: their memory may serve this allocation
                _free_deferred()
            bound = _ffi.api()
            out = _ffi.new("void **")
            with device:
                _ffi.check_acl(bound.aclrtMalloc(out, nbytes, _HUGE_FIRST), "aclrtMalloc",
                               context=f"allocating {nbytes} bytes on {device!r}")
            self.ptr = _ffi.address(out[0])
            release = partial(_free_block, self.ptr, self.keys)

        # Device arrays are as common as NumPy arrays: collecting one is normal, not a leak.
        self.finalizer = attach(self, release, "device allocation", warn=False)

    @classmethod
    def imported(cls, handle: IpcHandle, device: Device) -> _Allocation:
        """The memory of ``handle``, exported by another process, mapped into this one; closing it
        lets go of the mapping (``aclrtIpcMemClose``)."""
        self = object.__new__(cls)
        self.nbytes, self.device, self.device_id, self.live_device, self.keys = (handle.nbytes, device, device.id,
                                                                                 device.id, [])
        bound = _ffi.api()
        out = _ffi.new("void **")
        key = handle.key.encode()
        with device:
            _ffi.check_acl(bound.aclrtIpcMemImportByKey(out, key, _IPC_IMPORT_PEER_ACCESS), "aclrtIpcMemImportByKey",
                           context=f"importing {handle.nbytes} bytes from process {handle.pid}")
        self.ptr = _ffi.address(out[0])
        self.finalizer = attach(self, lambda: _ffi.check_acl(bound.aclrtIpcMemClose(key), "aclrtIpcMemClose"),
                                "imported device memory", warn=False)
        return self


class DeviceArray:
    """A C-contiguous, typed array in device memory.

    Create one with :func:`hcclpy.empty`, :func:`hcclpy.zeros` or :func:`hcclpy.from_numpy`.
    Indexing the first axis (``a[3]``, ``a[2:5]``) and :meth:`reshape` give views that share the
    memory. Copies to and from the host are synchronous unless a ``stream`` is given; device work
    queued on a stream is only visible after that stream is synchronised.

    Examples
    --------
    >>> a = hcclpy.from_numpy(np.arange(8, dtype=np.float32), device=0)
    >>> a[2:4].to_numpy()
    array([2., 3.], dtype=float32)
    """

    __slots__ = ("__weakref__", "_alloc", "_offset", "_shape", "_dtype", "_dtype_c", "_itemsize", "_size", "_cptr",
                 "_spec")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create device arrays with hcclpy.empty(), hcclpy.zeros() or hcclpy.from_numpy()")

    @classmethod
    def _view(cls, alloc: _Allocation, offset: int, shape: Tuple[int, ...], dtype: DataType) -> DeviceArray:
        self = object.__new__(cls)
        self._alloc = alloc
        self._offset = offset
        self._shape = shape
        self._dtype = dtype
        self._dtype_c = int(dtype)  # cffi converts a plain int much faster than an IntEnum
        self._itemsize = dtype.itemsize
        self._size = math.prod(shape)
        # The pointer is cast once here, so passing it to a collective costs nothing per call.
        self._cptr = _ffi.pointer(alloc.ptr + offset) if alloc.ptr else _ffi.NULL
        # What the operations make of this view, made on its first use by one (a view never
        # changes): their parser fills it, so that a buffer used again costs one attribute read.
        self._spec: Any = None
        return self

    # ------------------------------------------------------------------ properties

    @property
    def shape(self) -> Tuple[int, ...]:
        """Dimensions."""
        return self._shape

    @property
    def dtype(self) -> DataType:
        """Element type."""
        return self._dtype

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._size

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the array."""
        return self._size * self._dtype.itemsize

    @property
    def ptr(self) -> int:
        """Device address of the first element."""
        self._check_open()
        return self._alloc.ptr + self._offset

    @property
    def device(self) -> Device:
        """The device holding the memory."""
        return self._alloc.device

    @property
    def closed(self) -> bool:
        """True once the memory has been freed; False otherwise."""
        return self._alloc.live_device < 0

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def __repr__(self) -> str:
        state = "closed, " if self.closed else ""
        return f"<hcclpy.DeviceArray {state}shape={self._shape} dtype={self._dtype.name.lower()} on {self.device!r}>"

    # NumPy's operators and ufuncs leave a DeviceArray alone (a comparison with an array is False,
    # not an element-wise attempt that fails with a warning).
    __array_ufunc__ = None

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        # Without this, np.asarray() would build an object array of element views, silently.
        raise TypeError("a DeviceArray is device memory, which NumPy cannot read: copy it to the host with "
                        ".to_numpy()")

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("operation on a closed DeviceArray (its memory was freed)")

    # ------------------------------------------------------------------------ views

    def __getitem__(self, key: Any) -> DeviceArray:
        if not self._shape:
            raise IndexError("a 0-d DeviceArray cannot be indexed")
        rows, row_bytes = self._shape[0], math.prod(self._shape[1:]) * self._dtype.itemsize
        if isinstance(key, slice):
            start, stop, step = key.indices(rows)
            if step != 1:
                raise IndexError("DeviceArray views must be contiguous: slices with a step are not supported")
            stop = max(stop, start)
            return DeviceArray._view(self._alloc, self._offset + start * row_bytes,
                                     (stop - start,) + self._shape[1:], self._dtype)
        try:
            index = operator.index(key)
        except TypeError:
            raise TypeError(f"DeviceArray supports an int or a slice on the first axis, not {key!r}") from None
        if not -rows <= index < rows:
            raise IndexError(f"index {index} is out of bounds for axis 0 of size {rows}")
        index %= rows
        return DeviceArray._view(self._alloc, self._offset + index * row_bytes, self._shape[1:], self._dtype)

    def view(self, dtype: Any) -> DeviceArray:
        """The same bytes as a 1-D array of another element type (the byte size must divide, and
        the first byte must be aligned to the new element size: every DeviceArray is aligned, as
        HCCL's reductions require, so the operations need not check)."""
        datatype = as_datatype(dtype)
        if self.nbytes % datatype.itemsize:
            raise ValueError(f"{self.nbytes} bytes are not a whole number of {datatype.name.lower()} elements")
        if self.ptr % datatype.itemsize:
            raise ValueError(f"this array starts at 0x{self.ptr:x}, which is not aligned to {datatype.itemsize}-byte "
                             f"{datatype.name.lower()} elements; view a slice that starts at a multiple of "
                             f"{datatype.itemsize} bytes")
        return DeviceArray._view(self._alloc, self._offset, (self.nbytes // datatype.itemsize,), datatype)

    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with another shape (one dimension may be -1)."""
        given = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
        dims = list(_shape_of(given, negative_ok=True))
        if dims.count(-1) > 1:
            raise ValueError("only one dimension of a reshape can be -1")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or self._size % known:
                raise ValueError(f"cannot reshape {self._size} elements into {tuple(dims)}")
            dims[dims.index(-1)] = self._size // known
        new_shape = _shape_of(dims)
        if math.prod(new_shape) != self._size:
            raise ValueError(f"cannot reshape {self._size} elements into {new_shape}")
        return DeviceArray._view(self._alloc, self._offset, new_shape, self._dtype)

    # ------------------------------------------------------------------------ copies

    def _host_array(self, array: Any, argument: str) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{argument} must be a numpy.ndarray or an hcclpy.DeviceArray, got "
                            f"{type(array).__name__}")
        if as_datatype(array.dtype, argument=f"{argument}.dtype") != self._dtype:
            raise TypeError(f"{argument}.dtype is {array.dtype}, but the DeviceArray holds "
                            f"{self._dtype.name.lower()}")
        if array.size != self._size:
            raise ValueError(f"{argument} has {array.size} elements, the DeviceArray {self._size}")
        return array

    def _check_stream(self, stream: Optional[Stream], what: str) -> None:
        """Refuse a ``stream=`` other than None or an open stream of this array's device (checked
        also when the array is empty and nothing is queued: a bad argument is a bug either way)."""
        if stream is None:
            return
        if not isinstance(stream, Stream):
            raise TypeError(f"stream={stream!r} must be an hcclpy.Stream or None, got {type(stream).__name__}")
        if stream._device_id != self._alloc.device_id:
            raise ValueError(f"stream is on device {stream._device_id} but this array is on device "
                             f"{self._alloc.device_id}; queue the {what} on a stream of the array's device")
        stream._check_open()

    def _copy(self, dst: int, src: int, kind: int, stream: Optional[Stream], keep: Tuple[Any, ...],
              rows: Optional[_Rows] = None) -> None:
        """Copy ``rows`` (None: this array's bytes, contiguous on both sides) from address ``src``
        to address ``dst``, now or queued on ``stream``, after the queued work on the device
        arrays of ``keep`` (the arrays involved), which ``stream`` then keeps alive until the copy
        is done. Every copy of a DeviceArray comes here, so that they all order and hold alike."""
        if rows is None:
            rows = _Rows(self.nbytes, 1, self.nbytes, self.nbytes)
        if rows.width == 0 or rows.height == 0:
            return
        for item in keep:
            if isinstance(item, DeviceArray):
                settle(item._alloc, stream)  # a copy now must not change what queued work still reads
        copy_rows(dst, src, rows, kind, stream)
        if stream is not None:
            stream._hold(keep)

    def copy_from(self, src: Union[np.ndarray, DeviceArray], *, stream: Optional[Stream] = None) -> None:
        """Copy ``src`` (same dtype and size) into this array.

        Without ``stream`` the copy is done when the call returns. With ``stream`` it is queued there,
        and the stream keeps both arrays alive until it is done; a host ``src`` must stay unchanged
        until then (the copy is only asynchronous for pinned memory, see :func:`pinned_empty`).
        A host ``src`` whose rows are apart (a slice ``big[:, a:b]``) is copied in one 2-D copy;
        :meth:`copy_2d` copies other pitched layouts.
        """
        self._check_open()
        self._check_stream(stream, "copy")
        if isinstance(src, DeviceArray):
            src._check_open()
            if src._dtype != self._dtype or src._size != self._size:
                raise ValueError(f"src is {src._size} x {src._dtype.name.lower()}, this array "
                                 f"{self._size} x {self._dtype.name.lower()}")
            self._copy(self.ptr, src.ptr, _D2D, stream, (self, src))
            return
        array = self._host_array(src, "src")
        rows = None if array.flags.c_contiguous else _host_rows(array, _H2D)
        if not array.flags.c_contiguous and rows is None:
            if stream is not None:
                raise ValueError("src must be C-contiguous, or rows that are each contiguous (a slice of the last "
                                 "axes of a larger array), for a copy on a stream (use np.ascontiguousarray)")
            array = np.ascontiguousarray(array)
        self._copy(self.ptr, array.ctypes.data, _H2D, stream, (self, array), rows)

    def copy_to(self, dst: Union[np.ndarray, DeviceArray], *, stream: Optional[Stream] = None) -> None:
        """Copy this array into ``dst`` (same dtype and size; a host ``dst`` must be writable, and
        C-contiguous or made of rows that each are: a slice of the last axes of a larger array).
        Queued on ``stream`` if given, as for :meth:`copy_from`."""
        self._check_open()
        self._check_stream(stream, "copy")
        if isinstance(dst, DeviceArray):
            dst.copy_from(self, stream=stream)
            return
        array = self._host_array(dst, "dst")
        if not array.flags.writeable:
            raise ValueError("dst is read-only")
        rows = None if array.flags.c_contiguous else _host_rows(array, _D2H)
        if not array.flags.c_contiguous and rows is None:
            raise ValueError("dst must be C-contiguous, or rows that are each contiguous (a slice of the last axes "
                             "of a larger array)")
        self._copy(array.ctypes.data, self.ptr, _D2H, stream, (self, array), rows)

    def copy_2d(self, *, src: Union[np.ndarray, DeviceArray, None] = None,
                dst: Union[np.ndarray, DeviceArray, None] = None, width: int, height: int,
                src_pitch: Optional[int] = None, dst_pitch: Optional[int] = None,
                stream: Optional[Stream] = None) -> None:
        """Copy ``height`` rows of ``width`` bytes from ``src`` into this array, or from this
        array into ``dst`` (give one of the two), the source's rows ``src_pitch`` bytes apart and
        the destination's ``dst_pitch`` (CANN's ``aclrtMemcpy2d``, CUDA's ``cudaMemcpy2D``).

        Rows start at each side's first byte: to start elsewhere, pass a view, such as a NumPy
        slice or ``array.view("uint8")[offset:]``. The other side is a NumPy array (any element
        type but objects: this copies bytes) or a :class:`DeviceArray`; device to device, which
        ``aclrtMemcpy2d`` does not do, copies row by row. Done when the call returns, or queued on
        ``stream`` as :meth:`copy_from` does (a NumPy array must then stay unchanged until the
        copy is done).

        Parameters
        ----------
        src, dst
            The other side of the copy: ``src`` copies into this array, ``dst`` out of it.
        width
            Bytes per row.
        height
            Rows.
        src_pitch, dst_pitch
            Bytes from the start of one row to the start of the next, on the source and on the
            destination side; at least ``width``. Default: ``width`` (rows packed).
        stream
            Queue the copy on this stream of the array's device instead of copying now.

        Raises
        ------
        TypeError
            Neither or both of ``src`` and ``dst``, the other side not a NumPy or device array (or
            a NumPy array of objects), a size that is not an int, or ``stream`` not a Stream.
        ValueError
            A negative size, a pitch smaller than ``width``, rows that run past either side's
            bytes, a read-only NumPy ``dst``, device sides that overlap, a closed array, or a
            ``stream`` of another device.

        Examples
        --------
        Columns 2 to 5 of a device matrix of 8 float32 columns, into a packed host array:

        >>> matrix = hcclpy.from_numpy(np.arange(32, dtype=np.float32).reshape(4, 8), device=0)
        >>> block = np.empty((4, 4), np.float32)
        >>> matrix.view("uint8")[2 * 4:].copy_2d(dst=block, width=4 * 4, height=4, src_pitch=8 * 4)
        >>> block[0]
        array([2., 3., 4., 5.], dtype=float32)
        """
        if (src is None) == (dst is None):
            raise TypeError(f"copy_2d takes src= (copy into this array) or dst= (copy out of it): got "
                            f"{'both' if src is not None else 'neither'}")
        into = src is not None
        other: Any = src if into else dst
        role = "src" if into else "dst"
        width, height = _byte_count(width, "width"), _byte_count(height, "height")
        src_pitch = width if src_pitch is None else _byte_count(src_pitch, "src_pitch")
        dst_pitch = width if dst_pitch is None else _byte_count(dst_pitch, "dst_pitch")
        for name, pitch in (("src_pitch", src_pitch), ("dst_pitch", dst_pitch)):
            if pitch < width:
                raise ValueError(f"{name}={pitch} is less than width={width}: a row must fit in its pitch")
        self._check_open()
        self._check_stream(stream, "copy")
        if isinstance(other, DeviceArray):
            other._check_open()
            kind, address, extent = _D2D, other.ptr, other.nbytes
        elif isinstance(other, np.ndarray):
            if other.dtype.hasobject:
                raise TypeError(f"{role} holds Python objects ({other.dtype}), whose bytes cannot be copied")
            if not into and not other.flags.writeable:
                raise ValueError("dst is read-only")
            kind, address = (_H2D if into else _D2H), int(other.__array_interface__["data"][0])
            extent = _extent_from_start(other)
        else:
            raise TypeError(f"{role} must be a numpy.ndarray or an hcclpy.DeviceArray, got {type(other).__name__}")
        here, there = (self.ptr, self.nbytes, "this array"), (address, extent, role)
        (src_at, src_size, src_is), (dst_at, dst_size, dst_is) = (there, here) if into else (here, there)
        src_span, dst_span = (height - 1) * src_pitch + width, (height - 1) * dst_pitch + width
        if width and height:
            for name, span, size, what, pitch in (("src", src_span, src_size, src_is, src_pitch),
                                                  ("dst", dst_span, dst_size, dst_is, dst_pitch)):
                if span > size:
                    raise ValueError(f"{name}: {height} rows of {width} bytes, {pitch} bytes apart, span {span} "
                                     f"bytes, but {what} has {size} bytes from its first byte")
            if kind == _D2D and src_at < dst_at + dst_span and dst_at < src_at + src_span:
                raise ValueError("src and dst overlap: a 2-D copy between device arrays needs separate memory")
        self._copy(dst_at, src_at, kind, stream, (self, other), _Rows(width, height, dst_pitch, src_pitch))

    def to_numpy(self, *, stream: Optional[Stream] = None) -> np.ndarray:
        """A new host array with a copy of the data (after ``stream``'s queued work, if given)."""
        out = np.empty(self._shape, dtype=numpy_dtype(self._dtype))
        self.copy_to(out, stream=stream)
        if stream is not None:
            stream.synchronize()
        return out

    def fill_zero(self, *, stream: Optional[Stream] = None) -> None:
        """Set every byte to zero (queued on ``stream`` if given, which then keeps the array alive
        until it is done).

        Raises
        ------
        TypeError, ValueError
            If ``stream`` is not None or an open stream of the array's device.
        """
        self._check_open()
        self._check_stream(stream, "memset")
        if self.nbytes == 0:
            return
        bound = _ffi.api()
        ptr = _ffi.pointer(self.ptr)
        settle(self._alloc, stream)
        if stream is None:
            _ffi.check_acl(bound.aclrtMemset(ptr, self.nbytes, 0, self.nbytes), "aclrtMemset")
        else:
            _ffi.check_acl(bound.aclrtMemsetAsync(ptr, self.nbytes, 0, self.nbytes, stream._cdata()),
                           "aclrtMemsetAsync")
            stream._hold((self,))

    def ipc_export(self, *, pids: Optional[Sequence[int]] = None) -> IpcHandle:
        """Let other processes map this array's memory (``aclrtIpcMemGetExportKey``), as torch's
        CUDA tensors and cuda.core's IPC buffers share theirs: pass the returned handle (it pickles)
        to a process that calls :meth:`DeviceArray.ipc_import`. While another process has it
        imported, :meth:`close` raises and the memory stays; once this array is closed, no new
        process can import it.

        Parameters
        ----------
        pids
            The processes allowed to import it (``aclrtIpcMemSetImportPid``); None: any process
            of this user.

        Raises
        ------
        ValueError
            The array is closed, empty, or itself imported from another process, or ``pids``
            holds something other than positive ints.
        UnsupportedError
            On a CANN without IPC memory (8.3 and later have it).
        """
        self._check_open()
        if self._alloc.keys is None:
            raise ValueError("this DeviceArray was imported from another process: only the process that allocated "
                             "the memory exports it")
        if self.nbytes == 0:
            raise ValueError("an empty DeviceArray has no memory to export")
        allowed = None if pids is None else list(pids) if isinstance(pids, (list, tuple, np.ndarray)) else []
        if allowed is not None and (not allowed or any(isinstance(p, bool) or not isinstance(p, (int, np.integer))
                                                       or p <= 0 for p in allowed)):
            raise ValueError(f"pids={pids!r} must be a non-empty sequence of process ids (positive ints), or None")
        bound = _ffi.api()
        if not bound.present.get("aclrtIpcMemGetExportKey"):
            raise UnsupportedError("DeviceArray.ipc_export needs aclrtIpcMemGetExportKey (CANN 8.3), which this CANN "
                                   "does not provide")
        key = _ffi.new("char[]", _IPC_KEY_BYTES)
        flags = _IPC_EXPORT_ANY_PROCESS if allowed is None else _IPC_EXPORT_CHECK_PIDS
        _ffi.check_acl(bound.aclrtIpcMemGetExportKey(_ffi.pointer(self.ptr), self.nbytes, key, _IPC_KEY_BYTES, flags),
                       "aclrtIpcMemGetExportKey")
        self._alloc.keys.append(key)
        if allowed is not None:
            _ffi.check_acl(bound.aclrtIpcMemSetImportPid(key, _ffi.new("int32_t[]", allowed), len(allowed)),
                           "aclrtIpcMemSetImportPid")
        return IpcHandle(_ffi.string(key), os.getpid(), self.device.id, self._shape, self._dtype.name, self.nbytes)

    @staticmethod
    def ipc_import(handle: IpcHandle, *, device: Optional[DeviceLike] = None) -> DeviceArray:
        """The array another process exported with :meth:`ipc_export`, mapped into this one: the
        same memory, written and read by both. :meth:`close` lets go of it here (the exporter's
        array stays).

        Parameters
        ----------
        handle
            What :meth:`ipc_export` returned in the other process.
        device
            The device of this process that uses it; default: the current device, else 0.

        Raises
        ------
        TypeError
            ``handle`` is not an :class:`IpcHandle`.
        AclError
            The exporter has ended, closed the array, or does not allow this process.
        UnsupportedError
            On a CANN without IPC memory.
        """
        if not isinstance(handle, IpcHandle):
            raise TypeError(f"handle must be an hcclpy.IpcHandle from DeviceArray.ipc_export, got "
                            f"{type(handle).__name__}")
        if not _ffi.api().present.get("aclrtIpcMemImportByKey"):
            raise UnsupportedError("DeviceArray.ipc_import needs aclrtIpcMemImportByKey (CANN 8.3), which this CANN "
                                   "does not provide")
        alloc = _Allocation.imported(handle, _device_of(device))
        alloc.keys = None  # imported: nothing to export
        return DeviceArray._view(alloc, 0, tuple(handle.shape), as_datatype(handle.dtype))

    def close(self) -> None:
        """Free the memory: the whole allocation, also when called on a view (every array that
        views it becomes unusable at once). Idempotent.

        The memory is freed now unless work queued on a stream still uses it (a stream holds an
        array of it): then it is freed once no stream does, so that no new array gets memory that
        queued work will still write. Memory exported with :meth:`ipc_export` is freed now, after
        the queued work that uses it, and not while another process has it imported: then this
        raises and the array stays open (no new process can import it any more).
        """
        alloc = self._alloc
        if alloc.keys and alloc.finalizer.alive:
            settle(alloc)
            _free_block(alloc.ptr, alloc.keys)  # raises, leaving it open, while another process imports it
            alloc.finalizer.detach()
            alloc.live_device = -1
            CLOSES[0] += 1
            return
        alloc.live_device = -1
        CLOSES[0] += 1
        if alloc.finalizer.alive and _held_by_a_stream(alloc):
            _deferred[id(alloc)] = weakref.ref(alloc, lambda _, key=id(alloc): _deferred.pop(key, None))
        else:
            close_now(alloc.finalizer)
        if _deferred:
            _free_deferred()

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def empty(shape: ShapeLike, dtype: Any = "float32", *, device: Optional[DeviceLike] = None) -> DeviceArray:
    """Allocate an uninitialised device array.

    Parameters
    ----------
    shape
        Dimensions.
    dtype
        A :class:`~hcclpy.DataType`, NumPy dtype, or name such as ``"float32"``.
    device
        Device id or :class:`Device`; default: the calling thread's current device, else 0.

    Raises
    ------
    AclError
        If the device is out of memory (``ACL_ERROR_RT_MEMORY_ALLOCATION``).
    """
    dims, datatype, dev = _shape_of(shape), as_datatype(dtype), _device_of(device)
    return DeviceArray._view(_Allocation(_byte_size(dims, datatype.itemsize), dev), 0, dims, datatype)


def zeros(shape: ShapeLike, dtype: Any = "float32", *, device: Optional[DeviceLike] = None) -> DeviceArray:
    """Allocate a zero-filled device array (see :func:`empty`)."""
    array = empty(shape, dtype, device=device)
    array.fill_zero()
    return array


def from_numpy(array: np.ndarray, *, device: Optional[DeviceLike] = None) -> DeviceArray:
    """Copy a NumPy array to a new device array of the same shape and dtype (values stored in the
    other byte order are converted to the machine's, the only order HCCL reads)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array must be a numpy.ndarray, got {type(array).__name__}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    out = empty(array.shape, array.dtype, device=device)
    out.copy_from(array)
    return out


def pinned_empty(shape: ShapeLike, dtype: Any = "float32") -> np.ndarray:
    """A NumPy array in pinned (page-locked) host memory from ``aclrtMallocHost``.

    Copies between pinned memory and the device on a stream are truly asynchronous. The memory is
    freed when the array (and every view of it) is garbage collected.
    """
    dims, datatype = _shape_of(shape), as_datatype(dtype)
    np_dtype = numpy_dtype(datatype)
    nbytes = max(_byte_size(dims, datatype.itemsize), 1)
    bound = _ffi.api()
    out = _ffi.new("void **")
    _ffi.check_acl(bound.aclrtMallocHost(out, nbytes), "aclrtMallocHost")
    owner = _ffi.gc(out[0], bound.aclrtFreeHost)
    return np.frombuffer(_ffi.buffer(owner, nbytes), dtype=np_dtype, count=math.prod(dims)).reshape(dims)


# ------------------------------------------------------------------ attributes and registration

_LOCATIONS = {0: "host", 1: "device", 2: "unregistered", 3: "managed", 4: "host_numa"}  # aclrtMemLocationType
_PAGE = 4096  # bytes: aclrtHostRegister takes whole pages


class PointerAttributes(NamedTuple):
    """Where memory is, as :func:`pointer_attributes` reports it."""

    location: str
    """``"device"`` (aclrtMalloc), ``"host"`` (aclrtMallocHost or registered), ``"unregistered"``
    (memory the runtime did not allocate), ``"managed"`` or ``"host_numa"``."""
    id: int
    """The device id for device memory (the NUMA node for ``"host_numa"``); 0 otherwise."""
    page_size: int
    """The page size of the memory in bytes; 0 for memory the runtime does not know."""


def _address_of(memory: Any, argument: str) -> int:
    if isinstance(memory, DeviceArray):
        return memory.ptr
    if isinstance(memory, np.ndarray):
        return int(memory.__array_interface__["data"][0])
    if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0:
        return memory
    raise TypeError(f"{argument} must be a DeviceArray, a NumPy array or an address (a positive int), "
                    f"got {memory!r}")


def pointer_attributes(memory: Union[DeviceArray, np.ndarray, int]) -> PointerAttributes:
    """Where ``memory`` (a :class:`DeviceArray`, a NumPy array or an address) is and its page size
    (``aclrtPointerGetAttributes``).

    Raises
    ------
    TypeError
        ``memory`` is none of those.
    UnsupportedError
        On a CANN without ``aclrtPointerGetAttributes``.
    """
    address = _address_of(memory, "memory")
    bound = _ffi.api()
    if not bound.present.get("aclrtPointerGetAttributes"):
        raise UnsupportedError("aclrtPointerGetAttributes is not in the loaded CANN")
    found = _ffi.new("aclrtPtrAttributes *")
    _ffi.check_acl(bound.aclrtPointerGetAttributes(_ffi.pointer(address), found), "aclrtPointerGetAttributes")
    kind = int(found.location.type)
    return PointerAttributes(_LOCATIONS.get(kind, f"unknown ({kind})"), int(found.location.id),
                             int(found.pageSize))


class HostRegistration:
    """A NumPy array the device can reach, registered with ``aclrtHostRegister`` until
    :meth:`close` (or the end of a ``with`` block); made by :func:`register_host`. It keeps the
    array alive while registered."""

    __slots__ = ("_array", "_address", "_device_address")

    def __init__(self, array: np.ndarray, address: int, device_address: int) -> None:
        self._array: Optional[np.ndarray] = array
        self._address = address
        self._device_address = device_address

    @property
    def array(self) -> np.ndarray:
        """The registered array."""
        if self._array is None:
            raise ValueError("the host registration is closed")
        return self._array

    @property
    def device_address(self) -> int:
        """The address at which the device reaches the array."""
        if self._array is None:
            raise ValueError("the host registration is closed")
        return self._device_address

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._array is None

    def close(self) -> None:
        """Unregister the array (``aclrtHostUnregister``). Idempotent."""
        if self._array is None:
            return
        self._array = None
        _ffi.check_acl(_ffi.api().aclrtHostUnregister(_ffi.pointer(self._address)), "aclrtHostUnregister")

    def __enter__(self) -> HostRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._array is None:
            return "<hcclpy.HostRegistration closed>"
        return f"<hcclpy.HostRegistration {self._array.nbytes} bytes at 0x{self._address:x}>"


def register_host(array: np.ndarray) -> HostRegistration:
    """Let the device reach ``array``'s memory (``aclrtHostRegister``, mapped): a writable,
    C-contiguous NumPy array that starts on a 4 KiB page, such as one from :func:`pinned_empty`.

    Examples
    --------
    >>> host = hcclpy.pinned_empty(1024, "float32")
    >>> with hcclpy.register_host(host) as registered:
    ...     print(hex(registered.device_address))

    Raises
    ------
    TypeError
        ``array`` is not a NumPy array.
    ValueError
        It is empty, read-only, not C-contiguous or not page-aligned.
    AclError
        It overlaps memory registered already.
    UnsupportedError
        On a CANN without ``aclrtHostRegister``.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array must be a numpy.ndarray, got {type(array).__name__}")
    address = int(array.__array_interface__["data"][0])
    if array.nbytes == 0 or not array.flags.writeable or not array.flags.c_contiguous or address % _PAGE:
        why = ("is empty" if array.nbytes == 0 else "is read-only" if not array.flags.writeable
               else "is not C-contiguous" if not array.flags.c_contiguous
               else f"starts at 0x{address:x}, not on a {_PAGE}-byte page")
        raise ValueError(f"array {why}; register_host takes a non-empty, writable, C-contiguous array that starts "
                         "on a page, such as one from hcclpy.pinned_empty()")
    bound = _ffi.api()
    if not bound.present.get("aclrtHostRegister"):
        raise UnsupportedError("aclrtHostRegister is not in the loaded CANN")
    mapped = _ffi.new("void **")
    _ffi.check_acl(bound.aclrtHostRegister(_ffi.pointer(address), array.nbytes, 0, mapped), "aclrtHostRegister")
    return HostRegistration(array, address, _ffi.address(mapped[0]))
