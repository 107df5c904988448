"""The operations on NumPy arrays (host memory), staged through device memory.

Each function copies its input to device scratch memory, runs the device operation on a stream
of the communicator's own, copies the result back and returns it: they block, and they return a
new array unless ``out=`` names one to write. The scratch buffers are cached per communicator and
grow to the largest size used, so steady-state calls allocate nothing on the device.

Element-wise operations (all_reduce, broadcast, reduce) move large arrays in chunks, in one of two
ways (``HCCLPY_HOST_STAGING``):

* ``pinned``: each chunk is copied into one of two pinned host buffers and from there to the
  device asynchronously, and its result comes back the same way, so the host copies of one chunk
  overlap the device's copies and collective on the other. The default on CANN, where a copy from
  pageable memory returns only when it is done.
* ``direct``: each chunk is copied straight from and to the array with synchronous copies,
  reduced in between while it is still in cache. The default on the simulator, where a device
  copy is a host memcpy too: the pinned buffers would only add two passes. Two device chunks
  are taken in turn: between two collectives a rank copies the chunk just done out and the next
  one in, ranks of even number in that order and ranks of odd number the other way round, so
  that while one rank reads host memory the other writes it (memory then serves both
  directions at once, as for a collective on device arrays).

The other operations copy the whole array in and out with synchronous copies (in ``pinned`` mode
with the staging device made current for them): before CANN 8.1, an asynchronous copy from host
memory ``aclrtMallocHost`` did not allocate may fail unpredictably.

Rules: any HCCL data type is accepted (bfloat16 through ``ml_dtypes``). complex64 and complex128
arrays travel as pairs of float32 / float64 and reduce with sum only. Arrays of any other dtype of
fixed size (bool, datetime64, strings, structured dtypes...) are moved as bytes, and cannot be
reduced; dtypes that hold Python objects are refused. Counts and displacements are in elements of
the array's dtype, and results keep it. An input that is not C-contiguous, or not in the machine's
byte order, is copied to one that is first (the result is in the machine's order); ``out`` must be
a writable, C-contiguous array of the result's dtype and size.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import numpy as np

from . import _ffi, collectives
from .collectives._ops import _batch_item, _before_staging, _count_matrix, _count_vector, _peer
from ._comm_core import CommCore
from ._units import env_count, parse_bytes
from .runtime import DeviceArray, Stream, empty, pinned_empty
from .runtime._waits import seconds
from .errors import AclError, HcclpyError
from .types import DataType, ReduceOp, _refuse_foreign_byte_order, as_datatype, as_reduce_op

__all__ = [
    "all_gather", "all_gather_v", "all_reduce", "all_to_all", "all_to_all_v", "all_to_all_vc", "barrier",
    "batch_send_recv", "broadcast", "carrier_type", "recv", "reduce", "reduce_scatter", "reduce_scatter_v", "release",
    "scatter", "send", "staged", "staged_batch", "staged_elementwise",
]


def _chunk_bytes() -> int:
    """``HCCLPY_HOST_CHUNK_BYTES``: bytes, optionally with a K, M or G suffix (default 2M)."""
    return env_count("HCCLPY_HOST_CHUNK_BYTES", 2 << 20, parse_bytes, 1024,
                     "a number of bytes of at least 1024, optionally with a K, M or G suffix (e.g. 2M)")


# Large enough that the per-chunk cost is noise, small enough that a chunk stays in cache.
CHUNK_BYTES = _chunk_bytes()
STAGING_MODES = ("auto", "pinned", "direct")


def staging_mode() -> str:
    """How element-wise operations stage host arrays here: ``"pinned"`` or ``"direct"`` (from
    ``HCCLPY_HOST_STAGING``; ``auto``, the default, is pinned on CANN and direct on the simulator)."""
    mode = os.environ.get("HCCLPY_HOST_STAGING", "auto").strip().lower() or "auto"
    if mode not in STAGING_MODES:
        raise ValueError(f"HCCLPY_HOST_STAGING is {mode!r}; use one of {', '.join(STAGING_MODES)}")
    if mode == "auto":
        mode = "pinned" if _ffi.api().backend == "cann" else "direct"
    return mode


def _size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 steps per power of two: sizes that grow a little at a
    time reallocate rarely, and at most an eighth of a buffer is never used."""
    nbytes = max(nbytes, 1)
    step = 1 << max((nbytes - 1).bit_length() - 4, 0)
    return -(-nbytes // step) * step


class _Staging:
    """A communicator's stream and scratch buffers for host arrays.

    A call takes it from :func:`_locked_staging`, locked, and gives it back with :func:`_unlock`."""

    def __init__(self, comm: CommCore) -> None:
        # The scratch buffers are shared: calls from several threads take turns. An RLock knows its
        # owner: a signal handler that interrupts a call on this thread can be told from another
        # thread's call (see release), and a lock an interrupt left taken can be given back.
        self.lock = threading.RLock()
        self.closed = False
        self.close_pending = False  # release() asked while a call held it: that call closes it when it ends
        # A call ended by an exception (Ctrl-C in a wait, say) may have left work queued on the
        # stream that still reads or writes the scratch: the next call waits for it first.
        self.unsettled = False
        self.in_use: Set[str] = set()  # the scratch slots the call holding the lock has taken
        self.pinned = staging_mode() == "pinned"
        self.copy_out_first = comm.rank % 2 == 0  # direct mode's order of the copies between chunks
        self.stream: Stream = comm.device.create_stream()
        self._buffers: Dict[str, DeviceArray] = {}
        self._views: Dict[Tuple[str, int, DataType], DeviceArray] = {}
        self.device = comm.device
        # Pinned mode: two host buffers (with C pointers to them) and the events that say when the
        # device is done with each.
        self._host: List[Optional[Tuple[np.ndarray, Any]]] = [None, None]
        self.events = [self.device.create_event(timing=False) for _ in range(2)] if self.pinned else []

    def buffer(self, slot: str, count: int, dtype: DataType) -> DeviceArray:
        """``count`` elements of scratch named ``slot`` (reused; grown in steps of at most an eighth).

        When the device has no room for a larger buffer, the scratch of the slots the call holding
        the staging has not used is given back, and the allocation tried once more at the exact size."""
        self.in_use.add(slot)
        key = (slot, count, dtype)
        view = self._views.get(key)
        if view is not None:  # jobs repeat their sizes: most calls end here
            return view
        nbytes = max(count * dtype.itemsize, 1)
        current = self._buffers.get(slot)
        if current is None or current.nbytes < nbytes:
            if current is not None:
                current.close()
                self._views = {k: v for k, v in self._views.items() if k[0] != slot}
                del self._buffers[slot]
            try:
                current = empty(_size_class(nbytes), "uint8", device=self.device)
            except AclError:  # no room: give back the scratch this call does not use, ask for the exact size
                for name in [name for name in self._buffers if name not in self.in_use]:
                    self._buffers.pop(name).close()
                self._views = {k: v for k, v in self._views.items() if k[0] in self._buffers}
                current = empty(nbytes, "uint8", device=self.device)
            self._buffers[slot] = current
        if len(self._views) >= 64:
            self._views.clear()
        view = self._views[key] = current[: count * dtype.itemsize].view(dtype)
        return view

    def host(self, slot: int, nbytes: int) -> Any:
        """A C pointer to ``nbytes`` of pinned host memory in buffer ``slot`` (0 or 1; reused, grown
        in steps of at most an eighth)."""
        current = self._host[slot]
        if current is None or current[0].nbytes < nbytes:
            self._host[slot] = None  # the old buffer goes before the new one is allocated
            with self.device:  # made current, as for the device buffers and events
                array = pinned_empty(_size_class(nbytes), "uint8")
            current = self._host[slot] = (array, _ffi.from_buffer("char[]", array, require_writable=True))
        return current[1]

    def renew_stream(self) -> None:
        """Put a new stream in the place of a failed one (every wait on which fails)."""
        failed, self.stream = self.stream, self.device.create_stream()
        try:
            failed._close(wait=False)
        except HcclpyError:  # its failure was raised by the call it failed
            pass

    def close(self) -> None:
        self.closed = True
        try:
            # The stream first: closing it waits for what is queued on it, which may still use the
            # pinned buffers (a call interrupted in a wait leaves its work queued).
            self.stream.close()
        finally:  # a failed stream reports its failure on closing: the rest goes all the same
            self._views.clear()
            for buf in self._buffers.values():
                buf.close()
            self._buffers.clear()
            self._host = [None, None]
            for event in self.events:
                event.close()


def _locked_staging(comm: CommCore) -> _Staging:
    """The communicator's staging with its lock taken (the caller gives it back with
    :func:`_unlock`). One that :func:`release` closed while this thread waited for the lock is
    replaced by a new one; a communicator being destroyed is refused as a destroyed one is."""
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    if collectives.group_active():
        # The call would copy out a result the deferred operation has not produced yet.
        raise RuntimeError("NumPy arrays cannot be used inside hcclpy.group(): their calls block until the result "
                           "is back, but the group's operations run only when it ends. Use device arrays "
                           "(hcclpy.DeviceArray) in the group, or make this call outside it")
    while True:
        if comm._handle is None or comm._closing:
            comm._refuse_use()
        staging = comm._host_state or _new_staging(comm)
        lock = staging.lock
        if lock._is_owned():
            # This thread is inside a NumPy call on the communicator already: a signal handler
            # interrupted it. Taking the RLock again would hand the same scratch to both calls.
            raise RuntimeError(f"a NumPy operation on communicator '{comm._name}' cannot run while this thread is "
                               "inside another one (a signal handler interrupted it); run it after that call ends")
        try:
            lock.acquire()
            if staging.close_pending and not staging.closed:
                staging.close()  # release() gave up on it while this call waited: closing it falls to us
            if not (staging.closed or comm._closing):
                staging.in_use.clear()
                if staging.unsettled:  # the work a call ended by an exception left queued ends first
                    try:
                        _wait(staging.stream)
                    except HcclpyError:
                        # It failed, and the stream with it for good. The call said so, or HCCL
                        # will, with the cause, if the communicator is broken: start afresh.
                        staging.renew_stream()
                    staging.unsettled = False
                return staging
            lock.release()
        except BaseException:
            # An exception (KeyboardInterrupt, a signal handler's) right after the lock was taken:
            # give it back, or every later call and destroy() would wait for it forever.
            if lock._is_owned():
                lock.release()
            raise


def _unlock(staging: _Staging) -> None:
    """Give back the staging :func:`_locked_staging` took; close it if :func:`release` asked to
    meanwhile (from a signal handler on this thread, or another thread that could not wait)."""
    staging.lock.release()
    if staging.close_pending:
        _close(staging, 0)


def _wait(waitable: Any) -> None:
    """Wait for a staging stream or event until its work is done (or raise its failure). Ctrl-C's
    KeyboardInterrupt can end the wait (see :mod:`hcclpy.runtime._waits`): the call's work stays
    queued, and the next call on the staging waits for it first (``_Staging.unsettled``)."""
    waitable._synchronize(-1)


def _new_staging(comm: CommCore) -> _Staging:
    """The communicator's staging, made if it has none."""
    with _creating:
        if comm._closing:  # destroy() has begun: a staging made now would outlive the communicator
            comm._refuse_use()
        state = comm._host_state
        if state is None:
            state = comm._host_state = _Staging(comm)
    return state


# Re-entrant: a signal handler that releases a staging may interrupt this thread while it makes one.
_creating = threading.RLock()


def release(comm: CommCore, timeout: Optional[float] = None) -> bool:
    """Give back a communicator's staging memory (device scratch, pinned buffers, its stream).

    The scratch grows to the largest array staged; after a one-off large operation this returns it
    without destroying the communicator. The next NumPy call allocates what it needs again.
    ``Communicator.destroy`` calls it.

    Parameters
    ----------
    comm
        The communicator.
    timeout
        Seconds to wait at most for a NumPy call on another thread that is using the staging to
        end; None (the default) waits until it ends (by its exec timeout at the latest).

    Returns
    -------
    bool
        True when the memory is given back; False when a NumPy call still holds it (another
        thread's, past ``timeout``, or this thread's, interrupted by a signal handler that called
        this): that call gives it back when it ends.

    Raises
    ------
    TypeError
        If ``comm`` is not a communicator, or ``timeout`` is neither None nor a number.
    ValueError
        If ``timeout`` is negative, NaN or infinite.

    Examples
    --------
    >>> hcclpy.host.release(comm)   # after a one-off 4 GiB all_reduce of a NumPy array
    True
    """
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    timeout = seconds(timeout, finite=True)
    staging = _detach(comm)
    return staging is None or _close(staging, timeout)


def _detach(comm: CommCore) -> Optional[_Staging]:
    """Take the staging off ``comm`` (the next NumPy call makes a new one) and return it."""
    with _creating:
        staging, comm._host_state = comm._host_state, None
    return staging


def _close(staging: _Staging, timeout: Optional[float]) -> bool:
    """Close ``staging`` once no call holds it: wait ``timeout`` seconds at most (None: no limit)
    for the call holding it. False when one still does: it closes the staging when it ends."""
    # Set before trying the lock: a call that gives it back after the try sees the flag (_unlock).
    staging.close_pending = True
    lock = staging.lock
    if lock._is_owned():  # a signal handler on the thread inside a call: the call's scratch stays
        return False
    if not lock.acquire(timeout=-1 if timeout is None else timeout):
        return False
    try:
        if not staging.closed:
            staging.close()
    finally:
        lock.release()
    return True


# ------------------------------------------------------------------------ how dtypes travel
# HCCL knows twelve data types. Arrays of other dtypes travel as one of them: a complex number as
# its real and imaginary parts (the parts of a sum are the sums of the parts, so sum reduces them),
# any other element of fixed size as its bytes (which only move). The device operations count in
# elements of that carrier type: an array's element is ``per_element`` of them.


class _Carrier(NamedTuple):
    """How the elements of a NumPy dtype travel through HCCL."""

    dtype: DataType  # the HCCL type that carries them
    per_element: int  # how many of those make one element of the array
    ops: FrozenSet[ReduceOp]  # the reduce operations that give the right result on them


# NumPy dtypes that are HCCL types: the one lookup a call on them makes (as_datatype's own cache
# would cost a function call more). Every other dtype takes _carrier(), which fills this.
_HCCL_TYPES: Dict[np.dtype, DataType] = {}
_CARRIERS: Dict[np.dtype, _Carrier] = {}  # every dtype _carrier() has resolved
_COMPLEX_PARTS = {8: DataType.FP32, 16: DataType.FP64}  # complex64 and complex128, by itemsize
_ALL_OPS, _SUM_ONLY = frozenset(ReduceOp), frozenset({ReduceOp.SUM})
_REDUCIBLE = ("int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64 and bfloat16 "
              "(HCCL's types), and complex64 and complex128 with sum")


def _carrier(dtype: np.dtype, argument: str) -> _Carrier:
    """How elements of ``dtype`` (of ``argument``) travel; remembered per dtype.

    Raises TypeError for the dtypes that cannot travel: those holding Python objects, elements of
    no bytes, and dtypes in the other byte order (callers convert inputs; targets are refused)."""
    carrier = _CARRIERS.get(dtype)
    if carrier is not None:
        return carrier
    if dtype.hasobject:
        raise TypeError(f"{argument}.dtype is {dtype}, which holds Python objects: the array holds pointers to "
                        "them, which mean nothing in another process; convert it to a dtype of fixed size first")
    if dtype.itemsize == 0:
        raise TypeError(f"{argument}.dtype is {dtype}, whose elements have no bytes: there is nothing to move")
    _refuse_foreign_byte_order(dtype, argument + ".dtype")
    if len(_CARRIERS) >= 256:  # structured dtypes are countless: keep the caches small
        _CARRIERS.clear()
        _HCCL_TYPES.clear()
    try:
        hccl = as_datatype(dtype)
    except TypeError:  # no HCCL type of its own
        parts = _COMPLEX_PARTS.get(dtype.itemsize) if dtype.kind == "c" else None
        carrier = (_Carrier(parts, 2, _SUM_ONLY) if parts is not None
                   else _Carrier(DataType.UINT8, dtype.itemsize, frozenset()))
    else:
        carrier = _Carrier(hccl, 1, _ALL_OPS)
        _HCCL_TYPES[dtype] = hccl
    _CARRIERS[dtype] = carrier
    return carrier


def _carried(dtype: np.dtype, argument: str, reduction: Optional[str] = None,
             op: Any = None) -> Tuple[DataType, int]:
    """The HCCL type that carries ``dtype`` (of ``argument``) and how many of its elements make one
    of ``dtype``. With ``reduction``, the name of a reducing operation, and its ``op``: refused
    unless that reduces ``dtype`` right."""
    hccl = _HCCL_TYPES.get(dtype)
    if hccl is not None:  # HCCL types: nothing to check
        return hccl, 1
    carrier = _carrier(dtype, argument)
    if reduction is not None:
        _refuse_reduction(carrier, dtype, reduction, op)
    return carrier.dtype, carrier.per_element


def _refuse_reduction(carrier: _Carrier, dtype: np.dtype, reduction: str, op: Any) -> None:
    """Raise unless ``op`` reduces arrays of ``dtype`` right: ValueError for an op complex numbers
    lack, TypeError for a dtype moved as bytes (any sum of its bytes would be garbage)."""
    reduce_op = as_reduce_op(op)
    if reduce_op in carrier.ops:
        return
    if carrier.ops:
        raise ValueError(f"{reduction} with op={reduce_op.name.lower()} is not supported on {dtype} arrays: "
                         "complex arrays reduce with sum only")
    raise TypeError(f"{reduction} cannot reduce {dtype} arrays, which travel as bytes: the dtypes that reduce are "
                    f"{_REDUCIBLE}")


def carrier_type(dtype: Any, op: Any = None) -> Optional[DataType]:
    """The HCCL type that runs an operation on NumPy arrays of ``dtype``: the dtype's own, float32
    or float64 for complex64 or complex128, uint8 for dtypes moved as bytes. None when the NumPy
    path refuses the call (it says why itself, before any C call), an ``op`` that is no reduce
    operation included. The simulator's product profiles check this type.

    Parameters
    ----------
    dtype
        The array's dtype; one in the other byte order is taken in the machine's, as inputs are
        converted to it.
    op
        The reduce operation of a reduction; None for the operations that move data.
    """
    dtype = np.dtype(dtype)
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    reduction = None if op is None else "reduction"  # a name for refusals, which this turns into None
    try:
        if op is not None:
            as_reduce_op(op)  # an op nobody knows is refused whatever the dtype (_carried skips HCCL types)
        return _carried(native, "array", reduction, op)[0]
    except (TypeError, ValueError):
        return None


def _array_kind(array: Any, argument: str, written: bool = False, none: str = "") -> None:
    """Refuse ``array`` unless it is a NumPy array of a kind hcclpy can stage (asked of objects
    whose type is not ``numpy.ndarray`` itself; ``written``: an output; ``none``: what the message
    adds when None is allowed too): a masked array's mask would be ignored."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{argument} must be a numpy.ndarray{none}, got {type(array).__name__}")
    if isinstance(array, np.ma.MaskedArray):
        fix = f"{argument}.data to write its data" if written else f"{argument}.filled(value) or {argument}.data"
        raise TypeError(f"{argument} is a masked array: hcclpy moves data, not masks, so its masked elements would "
                        f"be taken as values; pass {fix}")


def _input(array: Any, argument: str, reduction: Optional[str] = None,
           op: Any = None) -> Tuple[np.ndarray, DataType, int]:
    """``array`` ready to stage, the HCCL type it travels as and how many of those make one of its
    elements (with ``reduction`` and ``op``, checked as :func:`_carried` says)."""
    if type(array) is not np.ndarray:
        _array_kind(array, argument)
    # Documented rule: an input that is not C-contiguous, or not in the machine's byte order, is
    # copied to one that is (0-d arrays keep their shape).
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="), order="C")
    elif not array.flags.c_contiguous:
        array = array.copy(order="C")
    dtype = _HCCL_TYPES.get(array.dtype)
    if dtype is not None:  # _carried's first step, written out: the hottest path saves a call
        return array, dtype, 1
    return (array, *_carried(array.dtype, argument, reduction, op))


def _output(out: Optional[np.ndarray], shape: Tuple[int, ...], dtype: np.dtype, argument: str = "out",
            zeroed: bool = False) -> np.ndarray:
    """``out``, checked to hold the result; or a new array (of zeros when ``zeroed``)."""
    if out is None:
        return (np.zeros if zeroed else np.empty)(shape, dtype=dtype)
    if type(out) is not np.ndarray:
        _array_kind(out, argument, written=True, none=" or None")
    if out.dtype != dtype:
        if out.dtype.newbyteorder("=") == dtype:
            raise TypeError(f"{argument}.dtype is {out.dtype.str!r}, the result's dtype in the other byte order: "
                            f"results are written in this machine's order; pass an out of dtype {dtype}")
        raise TypeError(f"{argument}.dtype is {out.dtype}, the result is {dtype}")
    if out.size != math.prod(shape):
        raise ValueError(f"{argument} has {out.size} elements, the result {math.prod(shape)} (shape {shape})")
    flags = out.flags
    if not flags.writeable:
        raise ValueError(f"{argument} is read-only")
    if not flags.c_contiguous:
        raise ValueError(f"{argument} must be C-contiguous")
    return out


def _unaliased(source: np.ndarray, result: Optional[np.ndarray]) -> np.ndarray:
    """``source``, or a copy of it when ``result`` overlaps it without being the very same memory.

    The element-wise operations write each chunk's result before they read the next chunk: in
    place is fine, but an ``out`` that starts inside the input would overwrite input not yet read.
    (An array that fits in one chunk is read whole before anything is written.)"""
    if (result is None or source.nbytes <= CHUNK_BYTES or not np.may_share_memory(source, result)
            or source.__array_interface__["data"][0] == result.__array_interface__["data"][0]):
        return source
    return source.copy()


def _target(array: Any, argument: str) -> Tuple[np.ndarray, DataType, int]:
    """An array received into in place, its carrier type and how many of those make one element."""
    if type(array) is not np.ndarray:
        _array_kind(array, argument, written=True)
    return (_output(array, array.shape, array.dtype, argument), *_carried(array.dtype, argument))


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


_H2D, _D2H = 1, 2  # aclrtMemcpyKind


def _copy(stream: Stream, dst: Any, src: Any, nbytes: int, kind: int) -> None:
    """Queue one copy between host and device memory (C pointers) on ``stream``. From pageable
    host memory it is done when the call returns, as in AscendCL."""
    if nbytes:
        rc = _ffi.api().aclrtMemcpyAsync(dst, nbytes, src, nbytes, kind, stream._cdata())
        if rc:
            raise _ffi.acl_failure(rc, "aclrtMemcpyAsync")


def _copy_now(dst: Any, src: Any, nbytes: int, kind: int) -> None:
    """Copy between pageable host memory and device memory (C pointers), done when it returns.

    The staging stream must be idle (synchronised) for the device memory involved. A queued copy
    from pageable memory would return only once done too (AscendCL's rule), but it would also be
    queued and waited for: ~0.6 us more per copy on the simulator."""
    if nbytes:
        rc = _ffi.api().aclrtMemcpy(dst, nbytes, src, nbytes, kind)
        if rc:
            raise _ffi.acl_failure(rc, "aclrtMemcpy")


def _copy_pageable(staging: _Staging, dst: Any, src: Any, nbytes: int, kind: int) -> None:
    """Copy between pageable host memory and device memory, done when it returns (the staging
    stream is idle for the device memory involved).

    Always a synchronous copy: before CANN 8.1, AscendCL documents that an asynchronous copy from
    host memory aclrtMallocHost did not allocate may fail unpredictably. In pinned mode the
    staging device is made current for it, since the calling thread need not have made it so."""
    if staging.pinned:
        with staging.device:
            _copy_now(dst, src, nbytes, kind)
    else:
        _copy_now(dst, src, nbytes, kind)


def _source(array: Optional[np.ndarray]) -> Any:
    """A C pointer to the memory of ``array`` (None stays None)."""
    return None if array is None else _ffi.from_buffer("char[]", array)


def _destination(array: Optional[np.ndarray]) -> Any:
    return None if array is None else _ffi.from_buffer("char[]", array, require_writable=True)


def _chunked(comm: CommCore, src: Any, dst: Any, count: int, dtype: DataType, run: Any) -> None:
    """Stage ``count`` elements through the device in chunks: copy from ``src`` in, ``run(chunk,
    None, stream)`` on the device (in place on the chunk), copy the chunk out to ``dst`` (C pointers
    to host memory; either may be None on ranks that lack it)."""
    staging = _locked_staging(comm)
    try:
        if comm._size > 1 and count >= max(CHUNK_BYTES // dtype.itemsize, 1):  # a chunk or more (_same_size)
            _same_size(comm, staging, count * dtype.itemsize)
        (_chunks_pinned if staging.pinned else _chunks)(staging, src, dst, count, dtype, run)
    except BaseException:
        staging.unsettled = True  # see _wait
        raise
    finally:
        _unlock(staging)


def _same_size(comm: CommCore, staging: _Staging, nbytes: int) -> None:
    """Raise ValueError on every rank unless every rank stages ``nbytes``.

    Asked before a call staged in full chunks: chunks have one size on every rank, so a rank with
    fewer of them would pair its last chunk with the next chunk of another rank, and neither HCCL
    nor the simulator's comparison of the ranks' calls would see a difference. A rank whose array
    is smaller than a chunk skips the exchange: its one chunk is smaller than the others' first,
    a mismatch of counts that fails without it."""
    mine = staging.buffer("size", 1, DataType.INT64)
    every = staging.buffer("sizes", comm.size, DataType.INT64)
    sizes = np.array([nbytes], dtype=np.int64)
    _copy_pageable(staging, mine._cptr, _source(sizes), sizes.nbytes, _H2D)
    collectives.all_gather(comm, mine, every, stream=staging.stream)
    _wait(staging.stream)
    sizes = np.empty(comm.size, dtype=np.int64)
    _copy_pageable(staging, _destination(sizes), every._cptr, sizes.nbytes, _D2H)
    if (sizes != nbytes).any():
        listed = ", ".join(f"rank {rank}: {int(size)}" for rank, size in enumerate(sizes))
        raise ValueError(f"the ranks passed arrays of different sizes (bytes: {listed}); every rank must pass the "
                         "same size")


def _chunks(staging: _Staging, src: Any, dst: Any, count: int, dtype: DataType, run: Any) -> None:
    stream = staging.stream
    itemsize = dtype.itemsize
    step = max(CHUNK_BYTES // itemsize, 1)
    # In place: each chunk in one buffer, half the cache footprint of separate send and receive
    # buffers; a second buffer takes the next chunk in while this one's result is copied out.
    chunk = staging.buffer("send", min(step, count), dtype)
    spare = staging.buffer("next", step, dtype) if count > step else None
    out_first = staging.copy_out_first
    if src is not None:
        _copy_now(chunk._cptr, src, chunk.nbytes, _H2D)
    for start in range(0, count, step):
        run(chunk, None, stream)
        _wait(stream)  # before the copy out, and before the next chunk's copy in
        done, after = chunk, start + step
        if after < count:  # the next chunk goes to the spare buffer; only the last can be shorter
            chunk, spare = (spare if count - after >= step else spare[: count - after]), done
        if out_first and dst is not None:
            _copy_now(dst + start * itemsize, done._cptr, done.nbytes, _D2H)
        if after < count and src is not None:
            _copy_now(chunk._cptr, src + after * itemsize, chunk.nbytes, _H2D)
        if not out_first and dst is not None:
            _copy_now(dst + start * itemsize, done._cptr, done.nbytes, _D2H)


def _chunks_pinned(staging: _Staging, src: Any, dst: Any, count: int, dtype: DataType, run: Any) -> None:
    """:func:`_chunks` through two pinned host buffers, taken in turn: while the device copies and
    reduces one chunk, the host copies the next one in and the one before out. An exception leaves
    work queued that uses the pinned buffers: the staging is then unsettled (see :func:`_wait`)."""
    stream = staging.stream
    itemsize = dtype.itemsize
    step = max(CHUNK_BYTES // itemsize, 1)
    first = min(step, count)
    slots = [(staging.buffer(f"send{i}", first, dtype), staging.host(i, first * itemsize), staging.events[i])
             for i in (0, 1)]
    waiting: List[Optional[Tuple[int, int]]] = [None, None]  # a slot's chunk in flight: (offset, nbytes)

    def finish(slot: int) -> None:
        """Wait until the device is done with ``slot``, then copy its result out."""
        chunk, waiting[slot] = waiting[slot], None
        if chunk is not None:
            _wait(slots[slot][2])
            if dst is not None:
                _ffi.memmove(dst + chunk[0], slots[slot][1], chunk[1])

    for index, start in enumerate(range(0, count, step)):
        slot = index & 1
        finish(slot)
        chunk, host, done = slots[slot]
        length = min(step, count - start)
        if length != chunk._size:  # only the last chunk can be shorter
            chunk = chunk[:length]
        offset, nbytes = start * itemsize, length * itemsize
        if src is not None:
            _ffi.memmove(host, src + offset, nbytes)
            _copy(stream, chunk._cptr, host, nbytes, _H2D)
        run(chunk, None, stream)
        if dst is not None:
            _copy(stream, host, chunk._cptr, nbytes, _D2H)
        done.record(stream)
        waiting[slot] = (offset, nbytes)
    last = (count - 1) // step & 1 if count else 0
    finish(last ^ 1)  # the older chunk first
    finish(last)
    _wait(stream)


def _copy_pieces(staging: _Staging, device: Any, pieces: Any, nbytes: int, kind: int) -> None:
    """Copy between device memory at ``device`` and pageable host memory given as one C pointer or
    as a list of ``(pointer, nbytes)`` pieces that lie back to back in the device buffer (a piece
    whose pointer is None is skipped)."""
    if not isinstance(pieces, list):
        _copy_pageable(staging, *((device, pieces) if kind == _H2D else (pieces, device)), nbytes, kind)
        return
    at = _ffi.cast("char *", device)
    for pointer, size in pieces:
        if pointer is not None:
            _copy_pageable(staging, *((at, pointer) if kind == _H2D else (pointer, at)), size, kind)
        at += size


def _blocks_only(result: np.ndarray, counts: Sequence[int], displs: Optional[Sequence[int]]) -> Any:
    """Where the blocks of an uneven result lie in ``result`` (flat), for :func:`_copy_pieces`: with
    displacements, the gaps between blocks are pieces to skip, so that they keep what ``result``
    held, as on device buffers; packed blocks fill ``result`` whole."""
    destination = _destination(result)
    if displs is None:
        return destination
    itemsize, pieces, at = result.itemsize, [], 0
    for start, count in sorted((d, c) for c, d in zip(counts, displs) if c):
        if start > at:
            pieces.append((None, (start - at) * itemsize))
            at = start
        if start + count > at:
            pieces.append((destination + at * itemsize, (start + count - at) * itemsize))
            at = start + count
    return pieces


def _whole(comm: CommCore, src: Any, send_count: int, dst: Any, recv_count: int, dtype: DataType,
           run: Any) -> None:
    """Stage a whole operation through the device: copy from ``src`` in, ``run(send, recv, stream)``,
    copy out to ``dst`` (host memory as for :func:`_copy_pieces`, or None)."""
    staging = _locked_staging(comm)
    try:
        stream = staging.stream
        send = staging.buffer("send", send_count, dtype)
        recv = staging.buffer("recv", recv_count, dtype)
        if src is not None:
            _copy_pieces(staging, send._cptr, src, send.nbytes, _H2D)
        run(send, recv, stream)
        _wait(stream)
        if dst is not None:
            _copy_pieces(staging, recv._cptr, dst, recv.nbytes, _D2H)
    except BaseException:
        staging.unsettled = True  # see _wait
        raise
    finally:
        _unlock(staging)


def _batch(comm: CommCore, items: Sequence[Tuple[str, Any, int, DataType, int]]) -> None:
    """Sends and receives of host memory at once: ``(kind, pointer, count, dtype, peer)`` items
    (already checked); received data is written to its pointer."""
    staging = _locked_staging(comm)
    try:
        _post(staging, comm, items)
    except BaseException:
        staging.unsettled = True  # see _wait
        raise
    finally:
        _unlock(staging)


def _post(staging: _Staging, comm: CommCore, items: Sequence[Tuple[str, Any, int, DataType, int]]) -> None:
    stream = staging.stream
    device_items: List[Tuple[str, DeviceArray, int]] = []
    receives: List[Tuple[DeviceArray, Any]] = []
    for index, (kind, pointer, count, dtype, peer) in enumerate(items):
        buf = staging.buffer(f"batch{index}", count, dtype)
        if kind == "send":
            _copy_pageable(staging, buf._cptr, pointer, buf.nbytes, _H2D)
        else:
            receives.append((buf, pointer))
        device_items.append((kind, buf, peer))
    collectives.batch_send_recv(comm, device_items, stream=stream)
    _wait(stream)
    for buf, pointer in receives:
        _copy_pageable(staging, pointer, buf._cptr, buf.nbytes, _D2H)


# --------------------------------------------------------------- host memory by address
# For adapters that hold host memory other than NumPy arrays (CPU tensors): the same staging,
# with memory given as integer addresses. The caller keeps the memory alive and sized right.

Pieces = Union[None, int, Sequence[Tuple[int, int]]]


def _at(memory: Pieces) -> Any:
    if memory is None or isinstance(memory, int):
        return None if memory is None else _ffi.cast("char *", memory)
    return [(_ffi.cast("char *", address), int(nbytes)) for address, nbytes in memory]


def staged_elementwise(comm: CommCore, source: Optional[int], result: Optional[int], count: int, dtype: DataType,
                       run: Callable[[DeviceArray, None, Stream], Any]) -> None:
    """Run an element-wise device operation on host memory, ``count`` elements at a time in chunks.

    ``run(chunk, None, stream)`` queues the operation in place on a device chunk (the receive
    buffer None, as in hcclpy's in-place forms); ``source`` (copied in) and ``result`` (copied out)
    are addresses, or None on a rank that has no input or output. Blocks until the result is in
    place.

    Raises
    ------
    ValueError
        If ``count`` is not an int >= 0.
    TypeError
        If ``dtype`` is not an HCCL data type (a :class:`DataType`, a NumPy dtype or its name).
    """
    _chunked(comm, _at(source), _at(result), _element_count(count, "count"), as_datatype(dtype), run)


def staged(comm: CommCore, source: Pieces, send_count: int, result: Pieces, recv_count: int, dtype: DataType,
           run: Callable[[DeviceArray, DeviceArray, Stream], Any]) -> None:
    """Run a device operation on host memory: ``send_count`` elements from ``source`` are copied to
    a device buffer, ``run(send, recv, stream)`` queues the operation, and ``recv_count`` elements
    are copied back to ``result``. Each of ``source`` and ``result`` is an address, a list of
    ``(address, nbytes)`` pieces laid back to back in the device buffer, or None. Blocks until done.

    Raises
    ------
    ValueError
        If ``send_count`` or ``recv_count`` is not an int >= 0.
    TypeError
        If ``dtype`` is not an HCCL data type (a :class:`DataType`, a NumPy dtype or its name).
    """
    _whole(comm, _at(source), _element_count(send_count, "send_count"), _at(result),
           _element_count(recv_count, "recv_count"), as_datatype(dtype), run)


def staged_batch(comm: CommCore, items: Sequence[Tuple[str, int, int, DataType, int]]) -> None:
    """Sends and receives of host memory in one batch: ``("send" | "recv", address, count, dtype,
    peer)`` items. Blocks until every transfer is done."""
    _batch(comm, [(kind, _at(address), _element_count(count, f"items[{index}] count"), as_datatype(dtype), peer)
                  for index, (kind, address, count, dtype, peer) in enumerate(items)])


def _element_count(value: Any, argument: str) -> int:
    """``value``, a number of elements, as an int (NumPy ints too): the memory it sizes is the
    caller's, so a negative count would stage a view of garbage size."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{argument}={value!r} must be an int >= 0 (a number of elements)")
    return int(value)


# ------------------------------------------------------------------------------ operations

def all_reduce(comm: CommCore, array: np.ndarray, out: Optional[np.ndarray] = None, op: Any = ReduceOp.SUM) -> np.ndarray:
    """Reduce ``array`` across ranks; every rank gets the result (a new array, or ``out``)."""
    source, dtype, per_element = _input(array, "array", "all_reduce", op)
    _before_staging(comm, "all_reduce", source.dtype, op)
    result = _output(out, source.shape, source.dtype)
    _chunked(comm, _source(_unaliased(source, result)), _destination(result), source.size * per_element, dtype,
             lambda s, r, stream: collectives.all_reduce(comm, s, None, op, stream=stream))
    return result


def broadcast(comm: CommCore, array: np.ndarray, root: int = 0, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Every rank gets ``root``'s ``array`` (other ranks' ``array`` only gives the shape and dtype)."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "broadcast", source.dtype, root=root)
    result = _output(out, source.shape, source.dtype)
    is_root = root == comm.rank
    send = _source(_unaliased(source, result)) if is_root else None
    _chunked(comm, send, _destination(result), source.size * per_element, dtype,
             lambda s, r, stream: collectives.broadcast(comm, s, root, stream=stream))
    return result


def reduce(comm: CommCore, array: np.ndarray, out: Optional[np.ndarray] = None, op: Any = ReduceOp.SUM,
           root: int = 0) -> Optional[np.ndarray]:
    """Reduce ``array`` across ranks onto ``root``: the result there, None elsewhere."""
    source, dtype, per_element = _input(array, "array", "reduce", op)
    _before_staging(comm, "reduce", source.dtype, op, root)
    is_root = root == comm.rank
    # out is checked on every rank that passes one, so that a call every rank makes alike is refused
    # alike; only the root writes to it.
    checked = _output(out, source.shape, source.dtype) if is_root or out is not None else None
    result = checked if is_root else None
    _chunked(comm, _source(_unaliased(source, result)), _destination(result), source.size * per_element, dtype,
             lambda s, r, stream: collectives.reduce(comm, s, r, op, root, stream=stream))
    return result


def _blocks(array: np.ndarray, size: int, operation: str) -> Tuple[int, ...]:
    if array.ndim == 0:
        raise ValueError(f"{operation} splits the first axis of array into {size} blocks, but array is 0-d (shape "
                         f"()); give it a first axis whose length is a multiple of {size}")
    if array.shape[0] % size:
        raise ValueError(f"{operation} splits the first axis of array into {size} blocks: it must be a multiple of "
                         f"{size}, got shape {array.shape}")
    return (array.shape[0] // size,) + array.shape[1:]


def all_gather(comm: CommCore, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Every rank's ``array`` stacked in rank order: shape ``(size, *array.shape)``."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "all_gather", source.dtype)
    result = _output(out, (comm.size,) + source.shape, source.dtype)
    _whole(comm, _source(source), source.size * per_element, _destination(result), result.size * per_element, dtype,
           lambda s, r, stream: collectives.all_gather(comm, s, r, stream=stream))
    return result


def reduce_scatter(comm: CommCore, array: np.ndarray, out: Optional[np.ndarray] = None,
                   op: Any = ReduceOp.SUM) -> np.ndarray:
    """Reduce ``array`` across ranks; rank ``r`` gets block ``r`` of the first axis."""
    source, dtype, per_element = _input(array, "array", "reduce_scatter", op)
    _before_staging(comm, "reduce_scatter", source.dtype, op)
    result = _output(out, _blocks(source, comm.size, "reduce_scatter"), source.dtype)
    _whole(comm, _source(source), source.size * per_element, _destination(result), result.size * per_element, dtype,
           lambda s, r, stream: collectives.reduce_scatter(comm, s, r, op, stream=stream))
    return result


def all_to_all(comm: CommCore, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Block ``j`` of the first axis goes to rank ``j``; block ``i`` of the result came from rank ``i``."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "all_to_all", source.dtype)
    _blocks(source, comm.size, "all_to_all")
    result = _output(out, source.shape, source.dtype)
    _whole(comm, _source(source), source.size * per_element, _destination(result), result.size * per_element, dtype,
           lambda s, r, stream: collectives.all_to_all(comm, s, r, stream=stream))
    return result


def scatter(comm: CommCore, array: Optional[np.ndarray], out: Optional[np.ndarray] = None,
            root: int = 0) -> np.ndarray:
    """Rank ``r`` gets block ``r`` of ``root``'s ``array``. Other ranks pass ``out``, or an array of
    the root's shape and dtype as a template."""
    is_root = root == comm.rank
    if array is None:
        if is_root or out is None:
            raise ValueError("scatter needs array on the root, and out (or a template array) elsewhere")
        result, dtype, per_element = _target(out, "out")
        source = None
    else:
        source, dtype, per_element = _input(array, "array")
        result = _output(out, _blocks(source, comm.size, "scatter"), source.dtype)
    _before_staging(comm, "scatter", result.dtype, root=root)
    count = result.size * per_element
    _whole(comm, _source(source) if is_root else None, count * comm.size, _destination(result), count, dtype,
           lambda s, r, stream: collectives.scatter(comm, s, r, root, stream=stream))
    return result


def all_gather_v(comm: CommCore, array: np.ndarray, recv_counts: Sequence[int], out: Optional[np.ndarray] = None,
                 recv_displs: Optional[Sequence[int]] = None) -> np.ndarray:
    """Uneven all-gather of flattened arrays: rank ``r`` contributes ``recv_counts[r]`` elements.
    With displacements, the elements between blocks keep what ``out`` held (zeros in a new result)."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "all_gather_v", source.dtype)
    recv_counts, recv_displs = _layout(comm, recv_counts, recv_displs, "recv")
    if recv_counts[comm.rank] != source.size:
        raise ValueError(f"recv_counts[{comm.rank}] = {recv_counts[comm.rank]} must equal this rank's send count: "
                         f"array has {source.size} elements")
    total = _result_extent(comm, recv_counts, recv_displs, source.dtype, _named("recv", recv_displs))
    result = _output(out, (total,), source.dtype, zeroed=recv_displs is not None)
    destination = _blocks_only(result, recv_counts, recv_displs)
    if per_element != 1:  # the device operation counts in elements of the carrier type
        recv_counts, recv_displs = _scaled(recv_counts, per_element), _scaled(recv_displs, per_element)
    _whole(comm, _source(source), source.size * per_element, destination, total * per_element, dtype,
           lambda s, r, stream: collectives.all_gather_v(comm, s, r, recv_counts, recv_displs, stream=stream))
    return result


def reduce_scatter_v(comm: CommCore, array: np.ndarray, send_counts: Sequence[int], out: Optional[np.ndarray] = None,
                     op: Any = ReduceOp.SUM, send_displs: Optional[Sequence[int]] = None) -> np.ndarray:
    """Uneven reduce-scatter of a flattened array: rank ``r`` gets ``send_counts[r]`` elements."""
    source, dtype, per_element = _input(array, "array", "reduce_scatter_v", op)
    _before_staging(comm, "reduce_scatter_v", source.dtype, op)
    counts, send_displs = _layout(comm, send_counts, send_displs, "send")
    _within(source, counts, send_displs)
    mine = counts[comm.rank]
    result = _output(out, (mine,), source.dtype)
    if per_element != 1:  # the device operation counts in elements of the carrier type
        counts, send_displs = _scaled(counts, per_element), _scaled(send_displs, per_element)
    _whole(comm, _source(source), source.size * per_element, _destination(result), mine * per_element, dtype,
           lambda s, r, stream: collectives.reduce_scatter_v(comm, s, r, counts, send_displs, op, stream=stream))
    return result


def all_to_all_v(comm: CommCore, array: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int],
                 out: Optional[np.ndarray] = None, send_displs: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None) -> np.ndarray:
    """Uneven all-to-all of flattened arrays (see :func:`hcclpy.collectives.all_to_all_v`). With
    receive displacements, the elements between blocks keep what ``out`` held (zeros in a new result)."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "all_to_all_v", source.dtype)
    send_counts, send_displs = _layout(comm, send_counts, send_displs, "send")
    recv_counts, recv_displs = _layout(comm, recv_counts, recv_displs, "recv")
    _within(source, send_counts, send_displs)
    total = _result_extent(comm, recv_counts, recv_displs, source.dtype, _named("recv", recv_displs))
    result = _output(out, (total,), source.dtype, zeroed=recv_displs is not None)
    destination = _blocks_only(result, recv_counts, recv_displs)
    if per_element != 1:  # the device operation counts in elements of the carrier type
        send_counts, recv_counts, send_displs, recv_displs = (
            _scaled(values, per_element) for values in (send_counts, recv_counts, send_displs, recv_displs))
    _whole(comm, _source(source), source.size * per_element, destination, total * per_element, dtype,
           lambda s, r, stream: collectives.all_to_all_v(comm, s, r, send_counts, recv_counts, send_displs,
                                                         recv_displs, stream=stream))
    return result


def all_to_all_vc(comm: CommCore, array: np.ndarray, send_count_matrix: Any,
                  out: Optional[np.ndarray] = None) -> np.ndarray:
    """All-to-all driven by one count matrix (see :func:`hcclpy.collectives.all_to_all_vc`)."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "all_to_all_vc", source.dtype)
    rows = _count_matrix(comm, send_count_matrix)
    sent = sum(rows[comm.rank])
    if sent > source.size:
        raise ValueError(f"row {comm.rank} of send_count_matrix sends {sent} elements, but array has "
                         f"{source.size}")
    total = _result_extent(comm, [row[comm.rank] for row in rows], None, source.dtype,
                           f"column {comm.rank} of send_count_matrix")
    result = _output(out, (total,), source.dtype)
    matrix = np.array(rows, dtype=np.uint64)
    if per_element != 1:  # the device operation counts in elements of the carrier type
        matrix = matrix * np.uint64(per_element)
    _whole(comm, _source(source), source.size * per_element, _destination(result), total * per_element, dtype,
           lambda s, r, stream: collectives.all_to_all_vc(comm, s, r, matrix, stream=stream))
    return result


def _layout(comm: CommCore, counts: Any, displs: Any, side: str) -> Tuple[Tuple[int, ...], Optional[Tuple[int, ...]]]:
    """``{side}_counts`` and ``{side}_displs`` checked (``size`` non-negative ints each, in
    elements of the array's dtype) as tuples of ints; displacements None stay None."""
    return (_count_vector(counts, comm, f"{side}_counts"),
            None if displs is None else _count_vector(displs, comm, f"{side}_displs"))


def _within(source: np.ndarray, counts: Sequence[int], displs: Optional[Sequence[int]]) -> None:
    """Refuse send counts and displacements that address more elements than ``source`` has."""
    needed = _extent(counts, displs)
    if needed > source.size:
        raise ValueError(f"{_named('send', displs)} address {needed} elements, but array has {source.size}")


def _named(side: str, displs: Optional[Sequence[int]]) -> str:
    """What a message calls the counts (and displacements) of ``side``."""
    return f"{side}_counts" if displs is None else f"{side}_counts and {side}_displs"


def _result_extent(comm: CommCore, counts: Sequence[int], displs: Optional[Sequence[int]], dtype: np.dtype,
                   given: str) -> int:
    """The elements an uneven result spans, refused when staging it could never fit the device (a
    count or displacement far too large), before a result array is allocated."""
    total = _extent(counts, displs)
    nbytes = total * dtype.itemsize
    # Only a large result pays for asking the device its size.
    if nbytes > _LARGE_RESULT:
        capacity = comm.device.memory_info()[1]
        if nbytes > capacity:
            raise ValueError(f"{given} address {total} elements of {dtype} ({nbytes} bytes), more than device "
                             f"{comm.device.id} holds ({capacity} bytes): the result is staged there")
    return total


_LARGE_RESULT = 1 << 30  # bytes


def _extent(counts: Sequence[int], displs: Optional[Sequence[int]]) -> int:
    if displs is None:
        return sum(counts)
    return max((c + d for c, d in zip(counts, displs) if c), default=0)


def _scaled(values: Optional[Sequence[int]], factor: int) -> Optional[Tuple[int, ...]]:
    """Counts or displacements times ``factor`` (None stays None)."""
    return None if values is None else tuple(v * factor for v in values)


def send(comm: CommCore, array: np.ndarray, peer: int) -> None:
    """Send ``array`` to ``peer`` (blocks until received)."""
    source, dtype, per_element = _input(array, "array")
    _before_staging(comm, "send", source.dtype, peer=peer)
    _whole(comm, _source(source), source.size * per_element, None, 0, dtype,
           lambda s, r, stream: collectives.send(comm, s, peer, stream=stream))


def recv(comm: CommCore, array: np.ndarray, peer: int) -> np.ndarray:
    """Receive from ``peer`` into ``array`` (written in place; it must be writable and C-contiguous)."""
    result, dtype, per_element = _target(array, "array")
    _before_staging(comm, "recv", result.dtype, peer=peer)
    _whole(comm, None, 0, _destination(result), result.size * per_element, dtype,
           lambda s, r, stream: collectives.recv(comm, r, peer, stream=stream))
    return result


def batch_send_recv(comm: CommCore, items: Sequence[Tuple[str, np.ndarray, int]]) -> None:
    """Post sends and receives of NumPy arrays at once; receive arrays are written in place."""
    checked: List[Tuple[str, Any, int, DataType, int]] = []
    receives: List[Tuple[int, int, int]] = []  # (start, end, item index) of each receive's memory
    for index, item in enumerate(items):
        kind, array, peer = _batch_item(index, item)
        if kind == "send":
            source, dtype, per_element = _input(array, f"items[{index}] array")
            checked.append((kind, _source(source), source.size * per_element, dtype, peer))
        else:
            target, dtype, per_element = _target(array, f"items[{index}] array")
            checked.append((kind, _destination(target), target.size * per_element, dtype, peer))
            start = target.__array_interface__["data"][0]
            receives.append((start, start + target.nbytes, index))
        _before_staging(comm, "batch_send_recv", array.dtype)  # an array: _input and _target refuse the rest
        _peer(comm, peer, f"items[{index}] peer")
    # Sends are copied to the device before anything is received, so a receive may share memory
    # with a send; two receives into the same memory would leave it holding either message.
    reach, reaching = 0, -1  # the furthest end of the receives seen so far, and whose it is
    for start, end, index in sorted(receive for receive in receives if receive[1] > receive[0]):
        if start < reach:
            first, second = sorted((reaching, index))
            raise ValueError(f"items[{first}] and items[{second}] receive into the same memory: each receive of a "
                             "batch needs memory of its own")
        if end > reach:
            reach, reaching = end, index
    _batch(comm, checked)


def barrier(comm: CommCore) -> None:
    """Block until every rank has reached the barrier."""
    staging = _locked_staging(comm)
    try:
        collectives.barrier(comm, stream=staging.stream)
        _wait(staging.stream)
    except BaseException:
        staging.unsettled = True  # see _wait
        raise
    finally:
        _unlock(staging)


collectives.register_host(sys.modules[__name__])
