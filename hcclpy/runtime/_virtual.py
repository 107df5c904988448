"""Virtual memory: address ranges reserved ahead, physical memory mapped into them, and physical
memory shared between processes (CANN's ``aclrtReserveMemAddress``, ``aclrtMallocPhysical``,
``aclrtMapMem``, ``aclrtMemExportToShareableHandle`` ...).

The model is cuda.core's virtual memory resource and PyTorch's expandable segments: a
:class:`VirtualRange` is a span of addresses that stays put while :class:`PhysicalMemory` is mapped
into it and unmapped again, so a buffer can grow without moving; :meth:`VirtualRange.array` views
mapped bytes as a :class:`~hcclpy.DeviceArray`, which every copy and collective takes.
"""

from __future__ import annotations

import operator
import os
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

import numpy as np

from .. import _ffi
from ..errors import UnsupportedError
from ..types import as_datatype
from ._device import Device, DeviceLike
from ._lifetime import CLOSES, attach, close_now
from ._memory import DeviceArray, ShapeLike, _byte_count, _byte_size, _device_of, _shape_of, settle

__all__ = ["PhysicalMemory", "ShareableHandle", "VirtualRange", "allocation_granularity"]

_GRANULARITY_MINIMUM, _GRANULARITY_RECOMMENDED = 0, 1  # aclrtMemGranularityOptions
_HBM_MEM_HUGE = 4  # aclrtMemAttr: 2 MiB pages, what CANN's examples allocate
_LOCATION_DEVICE = 1  # aclrtMemLocationType
_EXPORT_CHECK_PIDS, _EXPORT_ANY_PROCESS = 0, 1  # ACL_RT_VMM_EXPORT_FLAG_DEFAULT / _DISABLE_PID_VALIDATION

# Mapping and unmapping change what a range and its physical memory hold: one lock for both.
_lock = threading.Lock()
_granularities: Dict[Tuple[int, bool], int] = {}


def _need(name: str, what: str) -> None:
    if not _ffi.api().present.get(name):
        raise UnsupportedError(f"{what} needs {name} (CANN 8.x virtual memory), which this CANN does not provide")


def _prop(device_id: int) -> Any:
    prop = _ffi.new("aclrtPhysicalMemProp *")
    prop.handleType = 0  # ACL_MEM_HANDLE_TYPE_NONE
    prop.allocationType = 0  # ACL_MEM_ALLOCATION_TYPE_PINNED
    prop.memAttr = _HBM_MEM_HUGE
    prop.location.id = device_id
    prop.location.type = _LOCATION_DEVICE
    return prop


def _size_of(size: Any, argument: str = "size") -> int:
    value = _byte_count(size, argument)
    if value == 0:
        raise ValueError(f"{argument}=0 must be a positive number of bytes")
    return value


def allocation_granularity(device: Optional[DeviceLike] = None, *, recommended: bool = False) -> int:
    """The bytes physical memory comes in (``aclrtMemGetAllocationGranularity``): the sizes of
    :class:`PhysicalMemory` and of :class:`VirtualRange`, and the offsets at which memory is
    mapped, are multiples of it. 2 MiB for the pages hcclpy allocates (``ACL_HBM_MEM_HUGE``), on
    the simulator as on Atlas A2/A3.

    Parameters
    ----------
    device
        Device id or :class:`Device`; default: the calling thread's current device, else 0.
    recommended
        The granularity CANN recommends instead of the least one (the same on the simulator).

    Raises
    ------
    ValueError
        ``device`` is not a visible device.
    UnsupportedError
        On a CANN without virtual memory.

    Examples
    --------
    >>> hcclpy.allocation_granularity(0)
    2097152
    """
    dev = _device_of(device)
    key = (dev.id, bool(recommended))
    found = _granularities.get(key)
    if found is None:
        _need("aclrtMemGetAllocationGranularity", "allocation_granularity")
        out = _ffi.new("size_t *")
        option = _GRANULARITY_RECOMMENDED if recommended else _GRANULARITY_MINIMUM
        _ffi.check_acl(_ffi.api().aclrtMemGetAllocationGranularity(_prop(dev.id), option, out),
                       "aclrtMemGetAllocationGranularity")
        found = _granularities[key] = int(out[0])
    return found


class ShareableHandle(NamedTuple):
    """What another process needs to import :class:`PhysicalMemory`: made by
    :meth:`PhysicalMemory.export`, picklable, opened with :meth:`PhysicalMemory.import_`."""

    value: int
    """The number ``aclrtMemExportToShareableHandle`` gave."""
    pid: int
    """The exporting process."""
    device: int
    """The device the memory is on, in the exporting process."""
    size: int
    """The bytes of the memory."""


class PhysicalMemory:
    """Device memory with no address of its own (``aclrtMallocPhysical``): it is used where a
    :class:`VirtualRange` maps it, at one or more addresses, and can be shared with other
    processes (:meth:`export`, :meth:`import_`).

    Freed by :meth:`close` (or the end of a ``with`` block, or the collector), which refuses while
    a range maps it. Memory another process has imported stays allocated until that process lets
    go of it too.

    Parameters
    ----------
    size
        Bytes: a positive multiple of :func:`allocation_granularity`.
    device
        Device id or :class:`Device`; default: the calling thread's current device, else 0.

    Raises
    ------
    TypeError, ValueError
        ``size`` is not a positive multiple of the granularity, or ``device`` is not visible.
    AclError
        The device has not that much memory free (``ACL_ERROR_RT_MEMORY_ALLOCATION``).
    UnsupportedError
        On a CANN without virtual memory.

    Examples
    --------
    >>> grain = hcclpy.allocation_granularity(0)
    >>> with hcclpy.PhysicalMemory(4 * grain, device=0) as memory, hcclpy.VirtualRange(8 * grain, device=0) as space:
    ...     space.map(memory, offset=0)
    ...     array = space.array(1024, "float32")
    """

    __slots__ = ("__weakref__", "_handle", "_size", "_device", "_imported", "_exported", "_checks_pids", "_maps",
                 "_finalizer")

    def __init__(self, size: int, *, device: Optional[DeviceLike] = None) -> None:
        nbytes = _size_of(size)
        dev = _device_of(device)
        grain = allocation_granularity(dev)
        if nbytes % grain:
            raise ValueError(f"size={nbytes} is not a multiple of the allocation granularity ({grain} bytes on "
                             f"{dev!r}: hcclpy.allocation_granularity()); round it up to {-(-nbytes // grain) * grain}")
        _need("aclrtMallocPhysical", "PhysicalMemory")
        out = _ffi.new("aclrtDrvMemHandle *")
        with dev:
            _ffi.check_acl(_ffi.api().aclrtMallocPhysical(out, nbytes, _prop(dev.id), 0), "aclrtMallocPhysical",
                           context=f"allocating {nbytes} bytes of physical memory on {dev!r}")
        self._setup(out[0], nbytes, dev, imported=False)

    def _setup(self, handle: Any, size: int, device: Device, *, imported: bool) -> None:
        self._handle = handle
        self._size = size
        self._device = device
        self._imported = imported
        self._exported: Optional[ShareableHandle] = None
        self._checks_pids = False  # exported for the processes aclrtMemSetPidToShareableHandle lists
        self._maps = 0  # mappings by VirtualRange.map in this process

        def release() -> None:
            _ffi.check_acl(_ffi.api().aclrtFreePhysical(handle), "aclrtFreePhysical")

        self._finalizer = attach(self, release, "physical memory", warn=False)

    @classmethod
    def import_(cls, handle: ShareableHandle, *, device: Optional[DeviceLike] = None) -> PhysicalMemory:
        """The physical memory another process exported (``aclrtMemImportFromShareableHandle``):
        map it into a :class:`VirtualRange` of this process to read and write the same bytes as the
        exporter. :meth:`close` lets go of it here.

        Parameters
        ----------
        handle
            What :meth:`export` returned in the other process.
        device
            The device of this process that uses it; default: the current device, else 0.

        Raises
        ------
        TypeError
            ``handle`` is not a :class:`ShareableHandle`.
        ValueError
            This process exported it (use that :class:`PhysicalMemory` itself), or ``device`` is not
            visible.
        AclError
            The exporter has ended or freed it (``ACL_ERROR_RT_INVALID_HANDLE``), does not allow
            this process (``ACL_ERROR_RT_NO_PERMISSION``), or this process imported it already.
        UnsupportedError
            On a CANN without virtual memory.
        """
        if not isinstance(handle, ShareableHandle):
            raise TypeError(f"handle must be an hcclpy.ShareableHandle from PhysicalMemory.export, got "
                            f"{type(handle).__name__}")
        if handle.pid == os.getpid():
            raise ValueError("this process exported the memory: use its PhysicalMemory (export and import are for "
                             "two processes)")
        dev = _device_of(device)
        _need("aclrtMemImportFromShareableHandle", "PhysicalMemory.import_")
        out = _ffi.new("aclrtDrvMemHandle *")
        with dev:
            _ffi.check_acl(_ffi.api().aclrtMemImportFromShareableHandle(handle.value, dev.id, out),
                           "aclrtMemImportFromShareableHandle")
        self = object.__new__(cls)
        self._setup(out[0], handle.size, dev, imported=True)
        return self

    @property
    def size(self) -> int:
        """Bytes."""
        return self._size

    @property
    def device(self) -> Device:
        """The device it is used on (for imported memory, the device of this process)."""
        return self._device

    @property
    def imported(self) -> bool:
        """True if it came from another process (:meth:`import_`)."""
        return self._imported

    @property
    def closed(self) -> bool:
        """True once it was freed."""
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the PhysicalMemory is closed (it was freed)")

    def export(self, *, pids: Optional[Sequence[int]] = None) -> ShareableHandle:
        """Let other processes import this memory (``aclrtMemExportToShareableHandle``): pass the
        returned handle (it pickles) to a process that calls :meth:`PhysicalMemory.import_`. The
        memory is exported once; a later call returns the same handle, and lets the processes in
        ``pids`` import it too.

        Parameters
        ----------
        pids
            The processes allowed to import it (``aclrtMemSetPidToShareableHandle``); None on the
            first call: any process of this user.

        Raises
        ------
        ValueError
            The memory is closed or imported from another process; ``pids`` holds something other
            than positive ints; or the memory was exported to any process and ``pids`` are given.
        UnsupportedError
            On a CANN without virtual memory.

        Examples
        --------
        >>> handle = memory.export(pids=[peer_pid])  # send it to the peer, e.g. pickled
        """
        self._check_open()
        if self._imported:
            raise ValueError("this memory was imported from another process: only the process that allocated it "
                             "exports it")
        allowed = None if pids is None else list(pids) if isinstance(pids, (list, tuple, np.ndarray)) else []
        if allowed is not None and (not allowed or any(isinstance(p, (bool, np.bool_)) or
                                                       not isinstance(p, (int, np.integer)) or p <= 0
                                                       for p in allowed)):
            raise ValueError(f"pids={pids!r} must be a non-empty sequence of process ids (positive ints), or None")
        bound = _ffi.api()
        if self._exported is None:
            _need("aclrtMemExportToShareableHandle", "PhysicalMemory.export")
            out = _ffi.new("uint64_t *")
            flags = _EXPORT_ANY_PROCESS if allowed is None else _EXPORT_CHECK_PIDS
            _ffi.check_acl(bound.aclrtMemExportToShareableHandle(self._handle, 0, flags, out),
                           "aclrtMemExportToShareableHandle")
            self._exported = ShareableHandle(int(out[0]), os.getpid(), self._device.id, self._size)
            self._checks_pids = allowed is not None
        elif allowed is not None and not self._checks_pids:
            raise ValueError("the memory was exported to any process (pids=None): there is no list of processes to "
                             "add to")
        if allowed is not None:
            _ffi.check_acl(bound.aclrtMemSetPidToShareableHandle(self._exported.value,
                                                                 _ffi.new("int32_t[]", [int(p) for p in allowed]),
                                                                 len(allowed)),
                           "aclrtMemSetPidToShareableHandle")
        return self._exported

    def close(self) -> None:
        """Free the memory (``aclrtFreePhysical``); here only, for memory another process has
        imported. Idempotent.

        Raises
        ------
        ValueError
            A :class:`VirtualRange` maps it: unmap it (or close the range) first.
        """
        with _lock:
            if self._maps:
                raise ValueError(f"the PhysicalMemory is mapped in {self._maps} place{'s' if self._maps > 1 else ''}: "
                                 "unmap it (VirtualRange.unmap) or close the range first")
            if close_now(self._finalizer):
                CLOSES[0] += 1

    def __enter__(self) -> PhysicalMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed, " if self.closed else "imported, " if self._imported else ""
        return f"<hcclpy.PhysicalMemory {state}{self._size} bytes on {self._device!r}>"


class _Reservation:
    """The address space of a :class:`VirtualRange`, and the allocation its DeviceArrays view (it
    has what :class:`DeviceArray` asks of one). Unmapped and released by DeviceArray.close() on any
    of its arrays, by VirtualRange.close(), or by the collector."""

    __slots__ = ("__weakref__", "ptr", "nbytes", "device", "device_id", "live_device", "finalizer", "keys", "mapped")

    def __init__(self, ptr: int, nbytes: int, device: Device) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.device_id = device.id
        self.live_device = device.id
        self.keys: List[Any] = []  # no IPC keys: DeviceArray.ipc_export of mapped memory is refused by the runtime
        # What is mapped where, by offset. The release below holds it (never this object), so the
        # physical memory outlives the mappings even when both are collected together.
        mapped: Dict[int, PhysicalMemory] = {}
        self.mapped = mapped

        def release() -> None:
            bound = _ffi.api()
            for offset in sorted(mapped):
                physical = mapped.pop(offset)
                physical._maps -= 1
                _ffi.check_acl(bound.aclrtUnmapMem(_ffi.pointer(ptr + offset)), "aclrtUnmapMem")
            _ffi.check_acl(bound.aclrtReleaseMemAddress(_ffi.pointer(ptr)), "aclrtReleaseMemAddress")

        self.finalizer = attach(self, release, "virtual address range", warn=False)


def _as_allocation(space: _Reservation) -> Any:
    """``space`` where the memory module takes an allocation (it has what one has)."""
    return cast(Any, space)


class VirtualRange:
    """A span of device addresses (``aclrtReserveMemAddress``) into which :class:`PhysicalMemory`
    is mapped (:meth:`map`) and unmapped (:meth:`unmap`) while the addresses stay put: a buffer that
    grows without moving, as PyTorch's expandable segments and cuda.core's virtual memory do.
    :meth:`array` views mapped bytes as a :class:`DeviceArray` for copies and collectives.

    A range maps the memory of its ``device`` only, either memory of this process or memory
    imported from others, not both at once (CANN's rule). Closing it (or any of its arrays) unmaps
    everything and gives the addresses back; the physical memory stays its owners'.

    Parameters
    ----------
    size
        Bytes, rounded up to a multiple of :func:`allocation_granularity`.
    device
        Device id or :class:`Device` whose memory it maps; default: the calling thread's current
        device, else 0.

    Raises
    ------
    TypeError, ValueError
        ``size`` is not a positive int, or ``device`` is not visible.
    AclError
        The address space is exhausted (``ACL_ERROR_RT_MEMORY_ALLOCATION``).
    UnsupportedError
        On a CANN without virtual memory.

    Examples
    --------
    >>> grain = hcclpy.allocation_granularity(0)
    >>> space = hcclpy.VirtualRange(64 * grain, device=0)  # room to grow
    >>> space.map(hcclpy.PhysicalMemory(grain, device=0), offset=0)
    >>> space.map(hcclpy.PhysicalMemory(grain, device=0), offset=grain)  # grown, not moved
    >>> x = space.array(2 * grain // 4, "float32")
    >>> comm.all_reduce(x)
    """

    __slots__ = ("__weakref__", "_space")

    def __init__(self, size: int, *, device: Optional[DeviceLike] = None) -> None:
        nbytes = _size_of(size)
        dev = _device_of(device)
        grain = allocation_granularity(dev)
        nbytes = -(-nbytes // grain) * grain
        _need("aclrtReserveMemAddress", "VirtualRange")
        out = _ffi.new("void **")
        _ffi.check_acl(_ffi.api().aclrtReserveMemAddress(out, nbytes, 0, _ffi.NULL, 0), "aclrtReserveMemAddress",
                       context=f"reserving {nbytes} bytes of addresses")
        self._space = _Reservation(_ffi.address(out[0]), nbytes, dev)

    @property
    def ptr(self) -> int:
        """The first address."""
        return self._space.ptr

    @property
    def size(self) -> int:
        """Bytes of addresses (a multiple of the granularity)."""
        return self._space.nbytes

    @property
    def device(self) -> Device:
        """The device whose memory it maps."""
        return self._space.device

    @property
    def closed(self) -> bool:
        """True once it was closed (by :meth:`close` or by closing one of its arrays)."""
        return self._space.live_device < 0

    @property
    def mappings(self) -> List[Tuple[int, PhysicalMemory]]:
        """What is mapped, as ``(offset, physical memory)`` pairs in address order."""
        with _lock:
            return sorted(self._space.mapped.items(), key=lambda item: item[0])

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the VirtualRange is closed (its addresses were given back)")

    def _offset(self, offset: Any, argument: str = "offset") -> int:
        if isinstance(offset, (bool, np.bool_)):
            raise TypeError(f"{argument}={offset!r} must be an int (bytes)")
        try:
            return operator.index(offset)
        except TypeError:
            raise TypeError(f"{argument}={offset!r} must be an int (bytes)") from None

    def map(self, physical: PhysicalMemory, offset: int = 0) -> None:
        """Map all of ``physical`` at ``offset`` bytes into the range (``aclrtMapMem``).

        Parameters
        ----------
        physical
            Open :class:`PhysicalMemory` of the range's device (of this process or imported).
        offset
            Where: a multiple of :func:`allocation_granularity`, with the memory inside the range
            and over nothing mapped.

        Raises
        ------
        TypeError
            ``physical`` is not a :class:`PhysicalMemory`, or ``offset`` not an int.
        ValueError
            The range or the memory is closed; the memory is of another device; ``offset`` is off
            the granularity, outside the range or over a mapping; or the range maps memory of this
            process and this memory is imported (or the other way round).
        """
        if not isinstance(physical, PhysicalMemory):
            raise TypeError(f"physical must be an hcclpy.PhysicalMemory, got {type(physical).__name__}")
        where = self._offset(offset)
        space = self._space
        grain = allocation_granularity(space.device)
        with _lock:
            self._check_open()
            physical._check_open()
            if physical.device != space.device:
                raise ValueError(f"physical is memory of {physical.device!r} and this range maps {space.device!r}'s")
            if where < 0 or where % grain or where + physical.size > space.nbytes:
                raise ValueError(f"offset={where} must be a multiple of {grain} (the allocation granularity) from 0 "
                                 f"to {space.nbytes - physical.size} for {physical.size} bytes in a range of "
                                 f"{space.nbytes}")
            for start, other in space.mapped.items():
                if start < where + physical.size and where < start + other.size:
                    raise ValueError(f"offset={where}: {physical.size} bytes there overlap the memory mapped at "
                                     f"offset {start} ({other.size} bytes); unmap it first")
                if other.imported != physical.imported:
                    raise ValueError("a range maps memory of this process or memory imported from another, not both "
                                     f"at once (CANN's rule): it maps {'imported' if other.imported else 'own'} memory")
            _ffi.check_acl(_ffi.api().aclrtMapMem(_ffi.pointer(space.ptr + where), physical.size, 0,
                                                  physical._handle, 0), "aclrtMapMem")
            space.mapped[where] = physical
            physical._maps += 1

    def unmap(self, offset: int) -> PhysicalMemory:
        """Unmap the memory mapped at ``offset`` (``aclrtUnmapMem``), after the work queued on
        streams that uses the range's arrays; returns that memory (still open). Arrays over those
        bytes must not be used until memory is mapped there again.

        Raises
        ------
        TypeError
            ``offset`` is not an int.
        ValueError
            The range is closed, or nothing is mapped at ``offset``.
        """
        where = self._offset(offset)
        space = self._space
        with _lock:
            self._check_open()
            physical = space.mapped.get(where)
            if physical is None:
                starts = sorted(space.mapped)
                raise ValueError(f"offset={where} is where no memory is mapped; mapped at: {starts or 'none'}")
        settle(_as_allocation(space))  # the host waits for the streams whose queued work uses the range
        with _lock:
            if space.mapped.get(where) is not physical:
                raise ValueError(f"offset={where}: the memory was unmapped meanwhile")
            _ffi.check_acl(_ffi.api().aclrtUnmapMem(_ffi.pointer(space.ptr + where)), "aclrtUnmapMem")
            del space.mapped[where]
            physical._maps -= 1
        return physical

    def array(self, shape: ShapeLike, dtype: Any = "float32", *, offset: int = 0) -> DeviceArray:
        """A :class:`DeviceArray` over mapped bytes of the range, from ``offset`` on: copies,
        memsets and collectives take it as any device array (a collective's buffer must lie in
        one piece of device memory: inside one :class:`PhysicalMemory`, on the simulator).
        Closing the array closes the whole range, as closing a view frees its allocation.

        Parameters
        ----------
        shape
            Dimensions.
        dtype
            A :class:`~hcclpy.DataType`, NumPy dtype, or name such as ``"float32"``.
        offset
            Bytes from the start of the range: a multiple of the element size.

        Raises
        ------
        TypeError
            A bad ``shape``, ``dtype`` or ``offset``.
        ValueError
            The range is closed, or some of the bytes are not mapped.
        """
        dims, datatype = _shape_of(shape), as_datatype(dtype)
        where = self._offset(offset)
        nbytes = _byte_size(dims, datatype.itemsize)
        space = self._space
        with _lock:
            self._check_open()
            if where < 0 or where % datatype.itemsize or where + nbytes > space.nbytes:
                raise ValueError(f"offset={where} must be a multiple of {datatype.itemsize} (the element size) with "
                                 f"the array's {nbytes} bytes inside the range's {space.nbytes}")
            covered = where
            for start in sorted(space.mapped):
                if start <= covered < start + space.mapped[start].size:
                    covered = start + space.mapped[start].size
            if nbytes and covered < where + nbytes:
                raise ValueError(f"bytes {covered} to {where + nbytes} of the range are not mapped: map PhysicalMemory "
                                 "there first")
        return DeviceArray._view(_as_allocation(space), where, dims, datatype)

    def close(self) -> None:
        """Unmap everything, after the work queued on streams that uses the range's arrays, and
        give the addresses back (``aclrtUnmapMem``, ``aclrtReleaseMemAddress``). Every array of the
        range is closed with it; the physical memory stays open. Idempotent."""
        space = self._space
        if not space.finalizer.alive:
            space.live_device = -1
            return
        settle(_as_allocation(space))
        with _lock:
            space.live_device = -1
            CLOSES[0] += 1
            close_now(space.finalizer)

    def __enter__(self) -> VirtualRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed, " if self.closed else ""
        return (f"<hcclpy.VirtualRange {state}{self.size} bytes at 0x{self.ptr:x} on {self.device!r}, "
                f"{len(self._space.mapped)} mapping{'s' if len(self._space.mapped) != 1 else ''}>")
