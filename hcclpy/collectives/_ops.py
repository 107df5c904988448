"""Every HCCL operation, on device buffers (and, handed to :mod:`hcclpy.host`, on NumPy arrays).

Each function takes the communicator first, then buffers, then ``op``/``root``/``peer``, then the
keyword-only ``stream`` (default: the device's hcclpy-owned stream). Arguments are checked before
any C call; a ``ValueError``/``TypeError`` names the argument, the value and what is allowed.
Operations on device buffers return as soon as the work is queued: results are defined once the
stream is synchronised. Each returns the output buffer it wrote (``None`` where there is none).

NumPy arrays are passed on to the host-array layer, which registers itself here when imported
(it sits above this module): those calls block and return arrays (``out=`` to write one).

Each operation starts with a fast path for its common call — live :class:`DeviceArray` buffers
and an explicit or default :class:`Stream` of the communicator's device — that makes the same
checks as the general path as plain attribute tests; anything else takes the general path, which
explains what is wrong.

On the simulator with a product profile (``HCCLPY_SIM_PROFILE``, :mod:`hcclpy.profiles`) every
call takes the general path, which refuses what that product refuses with a ``ValueError``
before any C call; without one, the fast paths pay a single attribute test for it.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar, overload

import numpy as np

from .. import _ffi, _trace
from .._comm_core import CommCore
from ..runtime import DeviceArray, Stream
from ..runtime._memory import CLOSES as _closes
from ..runtime._stream import HOLD_CHECK as _HOLD_CHECK
from ..types import ReduceOp, as_reduce_op
from ._buffers import MAX_COUNT, Buffer, resolve

__all__ = [
    "all_gather", "all_gather_v", "all_reduce", "all_to_all", "all_to_all_v", "all_to_all_vc", "barrier",
    "batch_send_recv", "broadcast", "group", "recv", "reduce", "reduce_scatter", "reduce_scatter_v", "scatter",
    "send",
]

_SUM = ReduceOp.SUM
# For type checkers: the buffer a device form writes is what it returns (the NumPy forms return
# arrays; the overloads of the operations say which is which).
_Out = TypeVar("_Out")
_SUM_CODE = _SUM._value_  # the default op, recognised by identity before the dictionary lookup

# The flight recorder (hcclpy._trace), as module globals: the hot path reads them fastest so.
_record, _now = _trace.ring.append, _trace.now
_recording = _trace.enabled


def _set_recording(on: bool) -> None:
    global _recording
    _recording = on


_trace.on_toggle(_set_recording)
_host: Any = None  # hcclpy.host, once imported

# Reduce ops as C ints, by member, value and name. Only these types are looked up: True and 2.0
# are equal to ints the dictionary holds, and must be refused (the general path says why).
_OP_CODES: Dict[Any, int] = {**{op: op._value_ for op in ReduceOp}, **{op.name.lower(): op._value_ for op in ReduceOp}}
_OP_KEY_TYPES = frozenset({ReduceOp, int, str})


def register_host(module: Any) -> None:
    """Called by :mod:`hcclpy.host` when imported: NumPy arrays are passed to it from then on."""
    global _host
    _host = module


# ------------------------------------------------------------------------- shared checks

def _comm_handle(comm: Any) -> Any:
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    handle = comm._handle
    return handle if handle is not None else comm._live_handle()


def _stream(comm: CommCore, stream: Optional[Stream]) -> Stream:
    if stream is None:
        stream = comm._device.default_stream
    elif not isinstance(stream, Stream):  # a subclass too: the fast paths, which test the type alone, send it here
        raise TypeError(f"stream must be an hcclpy.Stream or None, got {type(stream).__name__}")
    if stream._device_id != comm._device_id:
        raise ValueError(f"stream is on device {stream._device_id} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")
    if stream._live_device < 0:
        raise ValueError("stream is closed")
    return stream


def _fast(comm: Any, stream: Any) -> Optional[Stream]:
    """The stream to use when ``comm`` is a live communicator and ``stream`` an open stream of its
    device (or None, meaning its default stream); None otherwise (the general path says why)."""
    try:
        # A product profile's checks are on the general paths only: without one, this is all they cost.
        if comm._handle is None or comm._profile is not None:
            return None
        if stream is None:
            stream = comm._default_stream
            if stream is None or stream._live_device < 0:
                stream = comm._default_stream = comm._device.default_stream
        elif type(stream) is not Stream:
            return None
        return stream if stream._live_device == comm._device_id else None
    except AttributeError:  # comm is not a communicator
        return None


_NOT_PASSED = object()  # an argument of _before_staging the operation does not take (None is a value to refuse)


def _no_stream(stream: Any) -> None:
    if stream is not None:
        # Staging copies in and out and synchronises on the device's hcclpy stream: a stream of the
        # caller's would be ignored, so it is refused (as out= is on the device path).
        raise TypeError(f"stream= is for device buffers, got {type(stream).__name__}: calls on NumPy arrays block "
                        "on hcclpy's own stream of the communicator's device and return when the result is in "
                        "the array; drop stream=, or pass device buffers")


def _before_staging(comm: Any, operation: str, dtype: Any, op: Any = _NOT_PASSED, root: Any = _NOT_PASSED,
                    peer: Any = _NOT_PASSED) -> None:
    """The checks of a call on NumPy arrays (:mod:`hcclpy.host`) before anything is staged: the
    communicator, ``op``, ``root`` or ``peer`` (each where the operation takes it, so a None is
    refused here too), and whether the simulator's product profile refuses ``operation`` on the
    HCCL type that carries ``dtype`` (as the real product would, with HCCL_E_NOT_SUPPORT). The
    device operation on the staged data checks them again, but an empty array reaches none, and
    a large one would first run the collective that compares the ranks' sizes.

    The device paths test ``comm._profile`` inline instead: without a profile that is all they pay."""
    _comm_handle(comm)
    if op is not _NOT_PASSED:
        _op(op)
    if root is not _NOT_PASSED:
        _rank(comm, root, "root")
    if peer is not _NOT_PASSED:
        _peer(comm, peer)
    if comm._profile is not None:
        reduce_op = None if op is _NOT_PASSED else op  # None: an operation that moves data
        # float32 runs for complex64, uint8 for dtypes moved as bytes. None: the NumPy path
        # refuses the dtype itself (object dtypes, a reduction of bytes), naming the argument.
        carrier = _host.carrier_type(dtype, reduce_op)
        if carrier is not None:
            comm._profile.check(operation, carrier, reduce_op)


def _done(rc: int, name: str, stream: Stream, keep: Iterable[Any], comm: CommCore, count: int, dtype: int,
          detail: Any, numbering: Any = None) -> None:
    """Raise for a failed call; otherwise record it in the flight recorder (``detail``: reduce op,
    root or peer, ``(op, root)`` for reduce; -1: none; ``numbering``: the counter that numbers it, by default the
    collectives') and keep its buffers (``keep``) alive until ``stream`` is done with them."""
    if rc:
        raise _ffi.hccl_failure(rc, name)
    if _grouping:  # a group is open somewhere: on this thread, the stream counts the operation
        _count_in_group(stream)  # (before the record: see Stream.synchronize)
    if _recording:
        _record((_now(), comm._trace_info, next(numbering or comm._trace_seq), name, count, dtype, detail,
                 stream._progress, stream._handle))
    # The buffers themselves, not a tuple of them: a tuple per call, kept until the stream drains,
    # is one more object for every garbage collection to walk (~0.1 us a call).
    held = stream._held
    held.extend(keep)
    if len(held) > _HOLD_CHECK:
        stream._seal_held()


def _on_device(comm: CommCore, buf: Buffer, argument: str) -> None:
    if buf.device is not None and buf.device != comm._device_id:
        raise ValueError(f"{argument} is memory of device {buf.device} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")


def _same_dtype(a: Buffer, b: Buffer, a_name: str, b_name: str) -> None:
    if a.dtype is not b.dtype:
        raise TypeError(f"{a_name} is {a.dtype.name.lower()} but {b_name} is {b.dtype.name.lower()}; they must match")


def _aligned(buf: Buffer, argument: str) -> None:
    if buf.address % buf.itemsize:
        raise ValueError(f"{argument} at 0x{buf.address:x} is not aligned to its {buf.itemsize}-byte "
                         f"{buf.dtype.name.lower()} elements (reductions need natural alignment)")


def _hccl_count(count: int, argument: str) -> None:
    """Refuse a count HCCL refuses (HCCL_E_PARA); the fast paths test the same bound inline."""
    if count > MAX_COUNT:
        raise ValueError(f"{argument} holds {count} elements, more than HCCL's largest supported count "
                         f"0x{MAX_COUNT:X} ({MAX_COUNT}) per call: split the call")


def _overlap(a: Buffer, b: Buffer) -> bool:
    a_end = a.address + a.count * a.itemsize
    b_end = b.address + b.count * b.itemsize
    return a.count > 0 and b.count > 0 and a.address < b_end and b.address < a_end


def _disjoint(a: Buffer, b: Buffer, operation: str) -> None:
    if _overlap(a, b):
        raise ValueError(f"{operation} does not work in place: send and recv buffers must not overlap")


def _rank(comm: CommCore, value: Any, argument: str) -> int:
    if type(value) is int and 0 <= value < comm._size:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < comm._size:
        hint = ""
        if argument == "root" and (type(value) is DeviceArray or hasattr(value, "__dlpack__")):
            hint = ": a buffer came where the root goes (broadcast works in place: broadcast(buf, root=...))"
        raise ValueError(f"{argument}={value!r} must be a rank of communicator '{comm._name}' "
                         f"(0..{comm._size - 1}){hint}")
    return int(value)


def _peer(comm: CommCore, value: Any, argument: str = "peer") -> int:
    peer = _rank(comm, value, argument)
    if peer == comm._rank:
        raise ValueError(f"{argument}={peer} is this rank; send/recv need another rank")
    return peer


def _op(op: Any) -> int:
    code = _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
    return code if code is not None else as_reduce_op(op)._value_


def _count_vector(values: Any, comm: CommCore, argument: str) -> Tuple[int, ...]:
    """``size`` non-negative element counts as a tuple of plain ints (checked once per layout:
    jobs reuse the same counts, so a layout seen before costs one dictionary lookup)."""
    try:
        key = values if type(values) is tuple else tuple(values)
        # A layout seen before (equal as plain ints: 1.0 == 1, so check the types too) is known good.
        known = key in comm._vector_cache
    except TypeError:  # not iterable, or holding unhashable items (nested lists): refused below
        key, known = None, False
    if known and all(type(v) is int for v in key):
        return key
    if key is None or len(key) != comm._size or any(
            isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in key):
        raise ValueError(f"{argument} must hold {comm._size} non-negative int{'s' if comm._size > 1 else ''} "
                         f"(one per rank), got {_shown(values)}")
    if any(v < 0 for v in key):
        raise ValueError(f"{argument} must not contain negative counts, got {values!r}")
    if any(v > MAX_COUNT for v in key):
        raise ValueError(f"{argument} holds a value above HCCL's largest supported count 0x{MAX_COUNT:X} "
                         f"({MAX_COUNT}), got {values!r}")
    checked = tuple(int(v) for v in key)
    _c_vector(comm, checked)  # remember the layout as checked
    return checked


def _shown(values: Any) -> str:
    """``values`` as a message about counts shows it: a reduce op's name says where it belongs, and
    an array of other than ints shows its type, not its contents."""
    if isinstance(values, str) and values.lower() in _OP_CODES:
        return f"{values!r}, a reduce op: pass it by name, op={values!r} (it comes after the counts)"
    if isinstance(values, np.ndarray) and values.dtype.kind not in "iu":
        return f"a {values.dtype} array of shape {values.shape}"
    return repr(values)


def _given_displacements(displs: Any, comm: CommCore, argument: str) -> Optional[Tuple[int, ...]]:
    """Displacements as the caller gave them, checked; None (packed) stays None."""
    return None if displs is None else _count_vector(displs, comm, argument)


def _displacements(counts: Tuple[int, ...], displs: Any, comm: CommCore, argument: str) -> Tuple[int, ...]:
    if displs is not None:
        return _count_vector(displs, comm, argument)
    packed = comm._packed_cache.get(counts)
    if packed is None:  # back to back, in rank order
        out, at = [], 0
        for count in counts:
            out.append(at)
            at += count
        if out[-1] > MAX_COUNT:  # HCCL bounds displacements as it bounds counts
            raise ValueError(f"packed, the counts {list(counts)} put the last rank's block at element {out[-1]}, "
                             f"above HCCL's largest supported displacement 0x{MAX_COUNT:X} ({MAX_COUNT})")
        packed = comm._packed_cache[counts] = tuple(out)
    return packed


def _fits(buf: Buffer, counts: Tuple[int, ...], displs: Tuple[int, ...], argument: str) -> None:
    needed = max((c + d for c, d in zip(counts, displs) if c), default=0)
    if needed > buf.count:
        raise ValueError(f"{argument} holds {buf.count} elements but the counts and displacements address "
                         f"{needed}")


def _c_vector(comm: CommCore, values: Tuple[int, ...]) -> Any:
    """``values`` (already checked) as a C ``uint64_t[]``, cached per communicator."""
    cache = comm._vector_cache
    vector = cache.get(values)
    if vector is None:
        if len(cache) >= 256:
            cache.clear()
            comm._packed_cache.clear()
        vector = cache[values] = _ffi.new("uint64_t[]", values or (0,))
    return vector


def _no_out(out: Any, first: Any, argument: str) -> None:
    """Refuse ``out=`` on the device path; ``first`` (the call's first buffer, named ``argument``)
    tells a device call from host values that are not in a NumPy array (``out=`` is then right)."""
    if out is not None:
        if isinstance(first, (list, float, int, np.generic)):
            raise TypeError(f"{argument} is a {type(first).__name__}: host values go in a numpy.ndarray "
                            "(np.asarray(...)), then out= receives the result")
        raise TypeError("out= is for NumPy arrays; with device buffers the output is recv")


def _host_output(given: Any, out: Any) -> Any:
    """The output array of a NumPy call: passed where the device form takes ``recv`` (``f(array,
    out)``, ``f(array, out, counts)``), or as ``out=``, not both. A device buffer as ``recv`` is
    refused here, naming it (the NumPy layer only knows it as the output)."""
    if given is not None and not isinstance(given, np.ndarray):
        if isinstance(given, ReduceOp) or (isinstance(given, str) and given.lower() in _OP_CODES):  # f(array, "max")
            raise TypeError(f"recv is {given!r}, which names a reduce op: recv comes before op; pass op={given!r}")
        raise TypeError(f"recv must be a numpy.ndarray (or None) when send is one: NumPy calls stage every array "
                        f"through the device; got {type(given).__name__}")
    if out is None:
        return given
    if given is not None:
        raise TypeError("the output array is given twice (positionally and as out=); pass it once")
    return out


def _count_matrix(comm: CommCore, matrix: Any) -> Tuple[Tuple[int, ...], ...]:
    """An all_to_all_vc count matrix, checked: ``size`` rows of ``size`` non-negative ints."""
    try:
        rows = tuple(tuple(row) for row in matrix)
    except TypeError:  # not iterable, or rows that are not
        rows = ()
    if len(rows) != comm._size or any(len(row) != comm._size or not all(
            type(v) is int or isinstance(v, np.integer) for v in row) or min(row) < 0 for row in rows):
        raise ValueError(f"send_count_matrix must be a {comm._size} x {comm._size} matrix of non-negative ints, "
                         f"got {matrix!r}")
    return tuple(_count_vector(row, comm, f"send_count_matrix row {i}") for i, row in enumerate(rows))


# An uneven layout (counts and displacements) a V-operation has checked is remembered under the
# form the caller passed it in, so the next call with the same layout skips the checks and the
# conversions: (counts, C counts, C displacements, elements it addresses).

# The fast paths look a layout up in two steps. First the communicator's memo of the last layout
# found on that side (0: send, 1: receive), tested inline in each fast path (calling a helper
# would cost ~0.1 us): a caller that passes the same list objects each time, with the same values,
# pays two identity tests and two comparisons. (A list changed in place to equal values of another
# type, 2.0 for 2, passes too: it asks for the same operation.) Then the dictionary of every layout
# checked so far, keyed by value. The memo copies the lists' values only when the same objects
# come a second time: a caller that builds new lists for every call pays for remembering two
# references, not for two copies.
_SEND, _RECV, _MATRIX = 0, 1, 2  # the memo's sides; _MATRIX: all_to_all_vc's count matrix
_UNARMED = object()  # equal to no list: a memo that only remembers which objects came last


def _known_layout(comm: CommCore, side: int, counts: Any, displs: Any) -> Any:
    """The remembered layout of ``(counts, displs)`` as the caller passed them (tuples or lists),
    or None when it was not checked before, once the memo of ``side`` missed (the fast paths test
    it inline: a hit is the common call). Packed layouts (``displs=None``) are keyed by the counts
    alone, the others by both: the common call builds one tuple."""
    memo = comm._layout_memo[side]
    again = memo[0] is counts and memo[1] is displs
    given_counts, given_displs = counts, displs
    kind = type(counts)
    if kind is list:
        counts = tuple(counts)
    elif kind is not tuple:
        return None
    if displs is None:
        layout = comm._layouts.get(counts)
        # Equal keys can hold floats (2.0 == 2), which the checks refuse: a sum of ints is an int.
        if layout is None or type(sum(counts)) is not int:
            return None
    else:
        kind = type(displs)
        if kind is list:
            displs = tuple(displs)
        elif kind is not tuple:
            return None
        layout = comm._layouts.get((counts, displs))
        if layout is None or type(sum(displs, sum(counts))) is not int:
            return None
    if again:  # copies of the values: the caller may change its lists in place
        comm._layout_memo[side] = (given_counts, given_displs, list(counts) if type(given_counts) is list else counts,
                                   given_displs if displs is None or type(given_displs) is tuple else list(displs),
                                   layout)
    else:
        comm._layout_memo[side] = (given_counts, given_displs, _UNARMED, _UNARMED, None)
    return layout


def _known_matrix(comm: CommCore, matrix: Any) -> Any:
    """The remembered layout of an all_to_all_vc count matrix (a list or tuple of rows) as the
    caller passed it, or None when it was not checked before, once the memo of the last matrix
    missed (tested inline by the fast path, as for count lists: see :func:`_known_layout`)."""
    if type(matrix) is not list and type(matrix) is not tuple:
        return None
    again = comm._layout_memo[_MATRIX][0] is matrix
    rows = tuple(map(tuple, matrix))  # tuple() of a row that is a tuple returns the row itself
    layout = comm._layouts.get(("matrix", rows))
    if layout is None or type(sum(map(sum, rows))) is not int:  # ints only, as for _known_layout
        return None
    if again:  # a copy of the values, in the caller's containers so that == compares them
        copy = [list(row) if type(row) is list else row for row in matrix]
        comm._layout_memo[_MATRIX] = (matrix, copy if type(matrix) is list else tuple(copy), layout)
    else:
        comm._layout_memo[_MATRIX] = (matrix, _UNARMED, None)
    return layout


def _remember_layout(comm: CommCore, given_displs: Any, counts: Tuple[int, ...], displs: Tuple[int, ...]) -> None:
    """Remember a checked layout (``given_displs``: whether the caller passed displacements)."""
    if len(comm._layouts) >= 256:
        comm._layouts.clear()
    extent = max((c + d for c, d in zip(counts, displs) if c), default=0)
    comm._layouts[counts if given_displs is None else (counts, displs)] = (
        counts, _c_vector(comm, counts), _c_vector(comm, displs), extent)


def _apart(a: DeviceArray, b: DeviceArray) -> bool:
    """Whether two views of one allocation do not overlap (the fast paths call it only when send
    and receive share their allocation)."""
    return a._offset + a._size * a._itemsize <= b._offset or b._offset + b._size * b._itemsize <= a._offset


# ------------------------------------------------------------------------------ reductions

@overload
def all_reduce(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, op: Any = _SUM, *,
               stream: None = None, out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_reduce(comm: CommCore, send: _Out, recv: None = None, op: Any = _SUM, *, stream: Optional[Stream] = None,
               out: None = None) -> _Out: ...
@overload
def all_reduce(comm: CommCore, send: Any, recv: _Out, op: Any = _SUM, *, stream: Optional[Stream] = None,
               out: None = None) -> _Out: ...
def all_reduce(comm: CommCore, send: Any, recv: Any = None, op: Any = _SUM, *, stream: Optional[Stream] = None,
               out: Any = None) -> Any:
    """Reduce ``send`` across all ranks into ``recv`` on every rank (``recv=None``: in place).

    Parameters
    ----------
    comm
        The communicator.
    send, recv
        Device buffers of the same dtype and element count; or NumPy arrays (then the result is a
        new array, or ``recv``/``out``).
    op
        :class:`~hcclpy.ReduceOp` or its name (``"sum"``, ``"prod"``, ``"max"``, ``"min"``).
    stream
        Stream to queue on; default: the device's hcclpy stream.

    Returns
    -------
    The output buffer (``recv``, or ``send`` when in place).

    Raises
    ------
    TypeError, ValueError
        For bad arguments, before any C call.
    HcclError
        If HCCL refuses the call.

    Examples
    --------
    >>> comm.all_reduce(x, y, "sum", stream=s); s.synchronize()
    """
    if type(send) is DeviceArray and out is None:
        try:  # _fast for an explicit stream, written out: the most frequent call of all saves a call
            st = (stream if type(stream) is Stream and stream._live_device == comm._device_id
                  and comm._handle is not None and comm._profile is None else _fast(comm, stream))
        except AttributeError:  # comm is not a communicator: the general path says so
            st = None
        target = send if recv is None else recv
        if st is not None and type(target) is DeviceArray:
            sa, ta, device = send._alloc, target._alloc, comm._device_id
            code = _SUM_CODE if op is _SUM else _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
            if (code is not None and sa.live_device == device and ta.live_device == device
                    and send._dtype is target._dtype and send._size == target._size and send._size <= MAX_COUNT
                    and (sa is not ta or send._offset == target._offset)):
                # _done, written out: the most frequent call of all saves the function call.
                rc = comm._api.HcclAllReduce(send._cptr, target._cptr, send._size, send._dtype_c, code, comm._handle,
                                             st._ptr_cdata)
                if rc:
                    raise _ffi.hccl_failure(rc, "HcclAllReduce")
                if _grouping:  # a group is open (on some thread)
                    _count_in_group(st)
                if _recording:
                    _record((_now(), comm._trace_info, next(comm._trace_seq), "HcclAllReduce", send._size,
                             send._dtype_c, code, st._progress, st._handle))
                held = st._held
                held.append(send)
                held.append(recv)
                if len(held) > _HOLD_CHECK:
                    st._seal_held()
                return target
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.all_reduce(comm, send, out if recv is None else _host_output(recv, out), op)
    _no_out(out, send, "send")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb = resolve(send, "send")
    rb = sb if recv is None or recv is send else resolve(recv, "recv")
    if rb is not sb:
        _same_dtype(sb, rb, "send", "recv")
        if sb.count != rb.count:
            raise ValueError(f"send has {sb.count} elements but recv {rb.count}; all_reduce needs the same count")
        if sb.address != rb.address and _overlap(sb, rb):
            raise ValueError("send and recv overlap without being the same buffer")
    _hccl_count(sb.count, "send")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _aligned(sb, "send")
    _aligned(rb, "recv")
    if comm._profile is not None:
        comm._profile.check("all_reduce", sb.dtype, op)
    code = _op(op)
    _done(comm._api.HcclAllReduce(sb.ptr, rb.ptr, sb.count, sb.dtype_c, code, handle, st._ptr_cdata),
          "HcclAllReduce", st, (send, recv), comm, sb.count, sb.dtype_c, code)
    return send if recv is None else recv


@overload
def reduce(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, op: Any = _SUM, root: int = 0, *,
           stream: None = None, out: Optional[np.ndarray] = None) -> Optional[np.ndarray]: ...
@overload
def reduce(comm: CommCore, send: _Out, recv: None = None, op: Any = _SUM, root: int = 0, *,
           stream: Optional[Stream] = None, out: None = None) -> Optional[_Out]: ...
@overload
def reduce(comm: CommCore, send: Any, recv: _Out, op: Any = _SUM, root: int = 0, *,
           stream: Optional[Stream] = None, out: None = None) -> Optional[_Out]: ...
def reduce(comm: CommCore, send: Any, recv: Any = None, op: Any = _SUM, root: int = 0, *,
           stream: Optional[Stream] = None, out: Any = None) -> Any:
    """Reduce ``send`` across all ranks into ``recv`` on ``root`` only.

    ``recv`` is ignored on other ranks (it may be None); on the root ``recv=None`` reduces in place.
    Returns the output buffer on the root, None elsewhere.
    """
    if type(send) is DeviceArray and out is None and type(root) is int:
        st = _fast(comm, stream)
        is_root = root == comm._rank if st is not None else False
        target = send if recv is None or not is_root else recv
        if st is not None and 0 <= root < comm._size and type(target) is DeviceArray:
            sa, ta, device = send._alloc, target._alloc, comm._device_id
            code = _SUM_CODE if op is _SUM else _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
            if (code is not None and sa.live_device == device and ta.live_device == device
                    and send._dtype is target._dtype and send._size == target._size and send._size <= MAX_COUNT
                    and (sa is not ta or send._offset == target._offset)):
                _done(comm._api.HcclReduce(send._cptr, target._cptr if is_root else _ffi.NULL, send._size,
                                           send._dtype_c, code, root, comm._handle, st._ptr_cdata),
                      "HcclReduce", st, (send, recv), comm, send._size, send._dtype_c, (code, root))
                return target if is_root else None
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.reduce(comm, send, out if recv is None else _host_output(recv, out), op, root)
    _no_out(out, send, "send")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    sb = resolve(send, "send")
    _hccl_count(sb.count, "send")
    _on_device(comm, sb, "send")
    _aligned(sb, "send")
    rb = sb
    is_root = root == comm._rank
    if is_root and recv is not None and recv is not send:
        rb = resolve(recv, "recv")
        _same_dtype(sb, rb, "send", "recv")
        if rb.count != sb.count:
            raise ValueError(f"send has {sb.count} elements but recv {rb.count}; reduce needs the same count")
        _on_device(comm, rb, "recv")
        _aligned(rb, "recv")
        if sb.address != rb.address and _overlap(sb, rb):
            raise ValueError("send and recv overlap without being the same buffer")
    if comm._profile is not None:
        comm._profile.check("reduce", sb.dtype, op)
    recv_ptr = rb.ptr if is_root else _ffi.NULL
    code = _op(op)
    _done(comm._api.HcclReduce(sb.ptr, recv_ptr, sb.count, sb.dtype_c, code, root, handle, st._ptr_cdata),
          "HcclReduce", st, (send, recv), comm, sb.count, sb.dtype_c, (code, root))
    return (send if recv is None else recv) if is_root else None


@overload
def reduce_scatter(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, op: Any = _SUM, *,
                   stream: None = None, out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def reduce_scatter(comm: CommCore, send: Any, recv: _Out, op: Any = _SUM, *,
                   stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def reduce_scatter(comm: CommCore, send: Any, recv: Any = None, op: Any = _SUM, *,
                   stream: Optional[Stream] = None, out: Any = None) -> Any:
    """Reduce ``send`` (``size * n`` elements) across ranks; rank ``r`` receives block ``r`` in ``recv``
    (``n`` elements)."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st = _fast(comm, stream)
        if st is not None:
            sa, ra, device, n = send._alloc, recv._alloc, comm._device_id, recv._size
            code = _SUM_CODE if op is _SUM else _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
            if (code is not None and sa.live_device == device and ra.live_device == device
                    and send._dtype is recv._dtype and send._size == n * comm._size <= MAX_COUNT and sa is not ra):
                _done(comm._api.HcclReduceScatter(send._cptr, recv._cptr, n, send._dtype_c, code, comm._handle,
                                                  st._ptr_cdata), "HcclReduceScatter", st, (send, recv),
                      comm, n, send._dtype_c, code)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.reduce_scatter(comm, send, out if recv is None else _host_output(recv, out), op)
    _no_out(out, send, "send")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    if sb.count != rb.count * comm._size:
        raise ValueError(f"send must hold recv.count * size = {rb.count} * {comm._size} = "
                         f"{rb.count * comm._size} elements, it holds {sb.count}")
    _hccl_count(sb.count, "send")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _aligned(sb, "send")
    _aligned(rb, "recv")
    in_place = rb.address == sb.address + comm._rank * rb.count * rb.itemsize
    if not in_place and _overlap(sb, rb):
        raise ValueError("recv overlaps send; in place, recv must be exactly this rank's block of send")
    if comm._profile is not None:
        comm._profile.check("reduce_scatter", sb.dtype, op)
    code = _op(op)
    _done(comm._api.HcclReduceScatter(sb.ptr, rb.ptr, rb.count, rb.dtype_c, code, handle, st._ptr_cdata),
          "HcclReduceScatter", st, (send, recv), comm, rb.count, rb.dtype_c, code)
    return recv


@overload
def reduce_scatter_v(comm: CommCore, send: np.ndarray, recv: Any = None, send_counts: Optional[Sequence[int]] = None,
                     send_displs: Optional[Sequence[int]] = None, op: Any = _SUM, *, stream: None = None,
                     out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def reduce_scatter_v(comm: CommCore, send: Any, recv: _Out, send_counts: Optional[Sequence[int]] = None,
                     send_displs: Optional[Sequence[int]] = None, op: Any = _SUM, *,
                     stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def reduce_scatter_v(comm: CommCore, send: Any, recv: Any = None, send_counts: Optional[Sequence[int]] = None,
                     send_displs: Optional[Sequence[int]] = None, op: Any = _SUM, *,
                     stream: Optional[Stream] = None, out: Any = None) -> Any:
    """Reduce-scatter with uneven blocks: rank ``r`` receives the reduction of every rank's
    ``send[send_displs[r] : send_displs[r] + send_counts[r]]`` (``recv`` holds ``send_counts[r]``
    elements). ``send_displs=None`` packs the blocks back to back. NumPy form:
    ``reduce_scatter_v(array, send_counts)`` returns the flattened block."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st, memo = _fast(comm, stream), comm._layout_memo[_SEND]
        layout = (None if st is None else memo[4] if memo[0] is send_counts and memo[1] is send_displs
                  and memo[2] == send_counts and memo[3] == send_displs  # the memo's hit, written out
                  else _known_layout(comm, _SEND, send_counts, send_displs))
        code = _SUM_CODE if op is _SUM else _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
        if layout is not None and code is not None:
            counts, c_counts, c_displs, extent = layout
            mine, device = counts[comm._rank], comm._device_id
            sa, ra = send._alloc, recv._alloc
            if (sa.live_device == device and ra.live_device == device
                    and send._dtype is recv._dtype and send._size >= extent and recv._size >= mine
                    and (sa is not ra or _apart(send, recv))):
                _done(comm._api.HcclReduceScatterV(send._cptr, c_counts, c_displs, recv._cptr, mine, send._dtype_c,
                                                   code, comm._handle, st._ptr_cdata),
                      "HcclReduceScatterV", st, (send, recv), comm, mine, send._dtype_c, code)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        counts, target = (recv, None) if send_counts is None else (send_counts, recv)
        return _host.reduce_scatter_v(comm, send, _count_vector(counts, comm, "send_counts"),
                                      _host_output(target, out), op,
                                      _given_displacements(send_displs, comm, "send_displs"))
    _no_out(out, send, "send")
    if send_counts is None:
        raise TypeError("reduce_scatter_v needs send_counts")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    counts = _count_vector(send_counts, comm, "send_counts")
    displs = _displacements(counts, send_displs, comm, "send_displs")
    _fits(sb, counts, displs, "send")
    mine = counts[comm._rank]
    if rb.count < mine:
        raise ValueError(f"recv holds {rb.count} elements but send_counts[{comm._rank}] = {mine}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _aligned(sb, "send")
    _aligned(rb, "recv")
    _disjoint(sb, rb, "reduce_scatter_v")
    if comm._profile is not None:
        comm._profile.check("reduce_scatter_v", sb.dtype, op)
    _remember_layout(comm, send_displs, counts, displs)
    code = _op(op)
    _done(comm._api.HcclReduceScatterV(sb.ptr, _c_vector(comm, counts), _c_vector(comm, displs), rb.ptr, mine,
                                       sb.dtype_c, code, handle, st._ptr_cdata),
          "HcclReduceScatterV", st, (send, recv), comm, mine, sb.dtype_c, code)
    return recv


# ---------------------------------------------------------------------------- data motion

@overload
def broadcast(comm: CommCore, buf: np.ndarray, root: int = 0, *, stream: None = None,
              out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def broadcast(comm: CommCore, buf: _Out, root: int = 0, *, stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def broadcast(comm: CommCore, buf: Any, root: int = 0, *, stream: Optional[Stream] = None, out: Any = None) -> Any:
    """Copy ``buf`` of ``root`` into ``buf`` of every other rank (NumPy: a new array, or ``out``)."""
    if type(buf) is DeviceArray and type(root) is int and out is None:
        st = _fast(comm, stream)
        if (st is not None and 0 <= root < comm._size and buf._alloc.live_device == comm._device_id
                and buf._size <= MAX_COUNT):
            _done(comm._api.HcclBroadcast(buf._cptr, buf._size, buf._dtype_c, root, comm._handle, st._ptr_cdata),
                  "HcclBroadcast", st, (buf,), comm, buf._size, buf._dtype_c, root)
            return buf
    if isinstance(buf, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.broadcast(comm, buf, root, out)
    _no_out(out, buf, "buf")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    b = resolve(buf, "buf")
    _hccl_count(b.count, "buf")
    _on_device(comm, b, "buf")
    if comm._profile is not None:
        comm._profile.check("broadcast", b.dtype)
    _done(comm._api.HcclBroadcast(b.ptr, b.count, b.dtype_c, root, handle, st._ptr_cdata), "HcclBroadcast", st, (buf,),
          comm, b.count, b.dtype_c, root)
    return buf


@overload
def all_gather(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, *, stream: None = None,
               out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_gather(comm: CommCore, send: Any, recv: _Out, *, stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def all_gather(comm: CommCore, send: Any, recv: Any = None, *, stream: Optional[Stream] = None,
               out: Any = None) -> Any:
    """Gather every rank's ``send`` (``n`` elements) into ``recv`` (``size * n``), in rank order.

    In place: ``send`` is this rank's block of ``recv``. NumPy: stacked on a new first axis.
    """
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st = _fast(comm, stream)
        if st is not None:
            sa, ra, device, n = send._alloc, recv._alloc, comm._device_id, send._size
            if (sa.live_device == device and ra.live_device == device and send._dtype is recv._dtype
                    and recv._size == n * comm._size <= MAX_COUNT and sa is not ra):
                _done(comm._api.HcclAllGather(send._cptr, recv._cptr, n, send._dtype_c, comm._handle, st._ptr_cdata),
                      "HcclAllGather", st, (send, recv), comm, n, send._dtype_c, -1)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.all_gather(comm, send, out if recv is None else _host_output(recv, out))
    _no_out(out, send, "send")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    if rb.count != sb.count * comm._size:
        raise ValueError(f"recv must hold send.count * size = {sb.count} * {comm._size} = "
                         f"{sb.count * comm._size} elements, it holds {rb.count}")
    _hccl_count(rb.count, "recv")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    in_place = sb.address == rb.address + comm._rank * sb.count * sb.itemsize
    if not in_place and _overlap(sb, rb):
        raise ValueError("send overlaps recv; in place, send must be exactly this rank's block of recv")
    if comm._profile is not None:
        comm._profile.check("all_gather", sb.dtype)
    _done(comm._api.HcclAllGather(sb.ptr, rb.ptr, sb.count, sb.dtype_c, handle, st._ptr_cdata), "HcclAllGather",
          st, (send, recv), comm, sb.count, sb.dtype_c, -1)
    return recv


@overload
def all_gather_v(comm: CommCore, send: np.ndarray, recv: Any = None, recv_counts: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: None = None,
                 out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_gather_v(comm: CommCore, send: Any, recv: _Out, recv_counts: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: Optional[Stream] = None,
                 out: None = None) -> _Out: ...
def all_gather_v(comm: CommCore, send: Any, recv: Any = None, recv_counts: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: Optional[Stream] = None,
                 out: Any = None) -> Any:
    """All-gather with uneven blocks: rank ``r``'s ``send`` lands at ``recv[recv_displs[r]:]``
    (``recv_counts[r]`` elements, which must equal that rank's ``send`` count). NumPy form:
    ``all_gather_v(array, recv_counts)`` returns the flattened result."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st, memo = _fast(comm, stream), comm._layout_memo[_RECV]
        layout = (None if st is None else memo[4] if memo[0] is recv_counts and memo[1] is recv_displs
                  and memo[2] == recv_counts and memo[3] == recv_displs  # the memo's hit, written out
                  else _known_layout(comm, _RECV, recv_counts, recv_displs))
        if layout is not None:
            counts, c_counts, c_displs, extent = layout
            device = comm._device_id
            sa, ra = send._alloc, recv._alloc
            if (sa.live_device == device and ra.live_device == device
                    and send._dtype is recv._dtype and counts[comm._rank] == send._size and recv._size >= extent
                    and (sa is not ra or _apart(send, recv))):
                _done(comm._api.HcclAllGatherV(send._cptr, send._size, recv._cptr, c_counts, c_displs,
                                               send._dtype_c, comm._handle, st._ptr_cdata),
                      "HcclAllGatherV", st, (send, recv), comm, send._size, send._dtype_c, -1)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        counts, target = (recv, None) if recv_counts is None else (recv_counts, recv)
        return _host.all_gather_v(comm, send, _count_vector(counts, comm, "recv_counts"), _host_output(target, out),
                                  _given_displacements(recv_displs, comm, "recv_displs"))
    _no_out(out, send, "send")
    if recv_counts is None:
        raise TypeError("all_gather_v needs recv_counts")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    counts = _count_vector(recv_counts, comm, "recv_counts")
    displs = _displacements(counts, recv_displs, comm, "recv_displs")
    if counts[comm._rank] != sb.count:
        raise ValueError(f"recv_counts[{comm._rank}] = {counts[comm._rank]} must equal this rank's send count "
                         f"{sb.count}")
    _fits(rb, counts, displs, "recv")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_gather_v")
    if comm._profile is not None:
        comm._profile.check("all_gather_v", sb.dtype)
    _remember_layout(comm, recv_displs, counts, displs)
    _done(comm._api.HcclAllGatherV(sb.ptr, sb.count, rb.ptr, _c_vector(comm, counts), _c_vector(comm, displs),
                                   sb.dtype_c, handle, st._ptr_cdata), "HcclAllGatherV", st, (send, recv),
          comm, sb.count, sb.dtype_c, -1)
    return recv


@overload
def scatter(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, root: int = 0, *,
            stream: None = None, out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def scatter(comm: CommCore, send: None, recv: None = None, root: int = 0, *, stream: None = None,
            out: np.ndarray) -> np.ndarray: ...
@overload
def scatter(comm: CommCore, send: Any, recv: _Out, root: int = 0, *, stream: Optional[Stream] = None,
            out: None = None) -> _Out: ...
def scatter(comm: CommCore, send: Any, recv: Any = None, root: int = 0, *, stream: Optional[Stream] = None,
            out: Any = None) -> Any:
    """Rank ``r`` receives block ``r`` of ``root``'s ``send`` (``size * n`` elements) into ``recv``
    (``n``). ``send`` is only read on the root (it may be None elsewhere)."""
    if type(recv) is DeviceArray and type(root) is int and out is None:
        st = _fast(comm, stream)
        if (st is not None and 0 <= root < comm._size and recv._alloc.live_device == comm._device_id
                and recv._size * comm._size <= MAX_COUNT):
            device, is_root = comm._device_id, root == comm._rank
            if not is_root:
                _done(comm._api.HcclScatter(_ffi.NULL, recv._cptr, recv._size, recv._dtype_c, root, comm._handle,
                                            st._ptr_cdata), "HcclScatter", st, (recv,), comm, recv._size, recv._dtype_c,
                      root)
                return recv
            if (type(send) is DeviceArray and send._alloc.live_device == device and send._alloc is not recv._alloc
                    and send._dtype is recv._dtype and send._size == recv._size * comm._size):
                _done(comm._api.HcclScatter(send._cptr, recv._cptr, recv._size, recv._dtype_c, root, comm._handle,
                                            st._ptr_cdata), "HcclScatter", st, (send, recv),
                      comm, recv._size, recv._dtype_c, root)
                return recv
    target = recv if out is None else out
    if (isinstance(send, np.ndarray) or (send is None and isinstance(target, np.ndarray))) and _host is not None:
        _no_stream(stream)
        return _host.scatter(comm, send, out if recv is None else _host_output(recv, out), root)
    _no_out(out, send, "send")
    if recv is None:
        raise TypeError("scatter needs recv, the device buffer for this rank's block; with NumPy arrays, ranks "
                        "other than the root pass out=, an array for their block")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    rb = resolve(recv, "recv")
    _hccl_count(rb.count * comm._size, f"send (recv's {rb.count} elements times {comm._size} ranks)")
    _on_device(comm, rb, "recv")
    send_ptr = _ffi.NULL
    if root == comm._rank:
        if send is None:
            raise ValueError("send must be a buffer on the root rank")
        sb = resolve(send, "send")
        _same_dtype(sb, rb, "send", "recv")
        if sb.count != rb.count * comm._size:
            raise ValueError(f"send must hold recv.count * size = {rb.count * comm._size} elements, it holds "
                             f"{sb.count}")
        _on_device(comm, sb, "send")
        in_place = rb.address == sb.address + root * rb.count * rb.itemsize
        if not in_place and _overlap(sb, rb):
            raise ValueError("recv overlaps send; in place, recv must be exactly the root's block of send")
        send_ptr = sb.ptr
    if comm._profile is not None:
        comm._profile.check("scatter", rb.dtype)
    _done(comm._api.HcclScatter(send_ptr, rb.ptr, rb.count, rb.dtype_c, root, handle, st._ptr_cdata),
          "HcclScatter", st, (send, recv), comm, rb.count, rb.dtype_c, root)
    return recv


@overload
def all_to_all(comm: CommCore, send: np.ndarray, recv: Optional[np.ndarray] = None, *, stream: None = None,
               out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_to_all(comm: CommCore, send: Any, recv: _Out, *, stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def all_to_all(comm: CommCore, send: Any, recv: Any = None, *, stream: Optional[Stream] = None,
               out: Any = None) -> Any:
    """Rank ``r`` sends block ``j`` of ``send`` to rank ``j``, which stores it as block ``r`` of
    ``recv``. Both hold ``size * n`` elements and must not overlap."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st = _fast(comm, stream)
        if st is not None:
            sa, ra, device, size = send._alloc, recv._alloc, comm._device_id, comm._size
            if (sa.live_device == device and ra.live_device == device and send._dtype is recv._dtype
                    and send._size == recv._size <= MAX_COUNT and not send._size % size and sa is not ra):
                n = send._size // size
                _done(comm._api.HcclAlltoAll(send._cptr, n, send._dtype_c, recv._cptr, n, send._dtype_c, comm._handle,
                                             st._ptr_cdata), "HcclAlltoAll", st, (send, recv),
                      comm, n, send._dtype_c, -1)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.all_to_all(comm, send, out if recv is None else _host_output(recv, out))
    _no_out(out, send, "send")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    if sb.count != rb.count or sb.count % comm._size:
        raise ValueError(f"send and recv must hold the same number of elements, a multiple of size {comm._size}; "
                         f"got {sb.count} and {rb.count}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_to_all")
    if comm._profile is not None:
        comm._profile.check("all_to_all", sb.dtype)
    _hccl_count(sb.count, "send")
    per_rank = sb.count // comm._size
    _done(comm._api.HcclAlltoAll(sb.ptr, per_rank, sb.dtype_c, rb.ptr, per_rank, rb.dtype_c, handle, st._ptr_cdata),
          "HcclAlltoAll", st, (send, recv), comm, per_rank, sb.dtype_c, -1)
    return recv


@overload
def all_to_all_v(comm: CommCore, send: np.ndarray, recv: Any = None, send_counts: Optional[Sequence[int]] = None,
                 recv_counts: Optional[Sequence[int]] = None, send_displs: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: None = None,
                 out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_to_all_v(comm: CommCore, send: Any, recv: _Out, send_counts: Optional[Sequence[int]] = None,
                 recv_counts: Optional[Sequence[int]] = None, send_displs: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: Optional[Stream] = None,
                 out: None = None) -> _Out: ...
def all_to_all_v(comm: CommCore, send: Any, recv: Any = None, send_counts: Optional[Sequence[int]] = None,
                 recv_counts: Optional[Sequence[int]] = None, send_displs: Optional[Sequence[int]] = None,
                 recv_displs: Optional[Sequence[int]] = None, *, stream: Optional[Stream] = None,
                 out: Any = None) -> Any:
    """All-to-all with uneven blocks: ``send_counts[j]`` elements from ``send[send_displs[j]:]`` go
    to rank ``j``; ``recv_counts[j]`` elements from rank ``j`` land at ``recv[recv_displs[j]:]``.
    Displacements default to packed blocks. ``send`` and ``recv`` must not overlap. NumPy form:
    ``all_to_all_v(array, send_counts, recv_counts)``."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st, memo = _fast(comm, stream), comm._layout_memo[_SEND]
        sent = (None if st is None else memo[4] if memo[0] is send_counts and memo[1] is send_displs
                and memo[2] == send_counts and memo[3] == send_displs  # the memo's hit, written out
                else _known_layout(comm, _SEND, send_counts, send_displs))
        memo = comm._layout_memo[_RECV]
        if sent is None:
            received = None
        elif recv_counts is send_counts and recv_displs is send_displs:
            received = sent  # the same lists for both sides (a symmetric exchange): one lookup
        elif memo[0] is recv_counts and memo[1] is recv_displs and memo[2] == recv_counts and memo[3] == recv_displs:
            received = memo[4]
        else:
            received = _known_layout(comm, _RECV, recv_counts, recv_displs)
        if received is not None:
            device = comm._device_id
            sa, ra = send._alloc, recv._alloc
            if (sa.live_device == device and ra.live_device == device
                    and send._dtype is recv._dtype and send._size >= sent[3] and recv._size >= received[3]
                    and (sa is not ra or _apart(send, recv))):
                _done(comm._api.HcclAlltoAllV(send._cptr, sent[1], sent[2], send._dtype_c, recv._cptr, received[1],
                                              received[2], recv._dtype_c, comm._handle, st._ptr_cdata),
                      "HcclAlltoAllV", st, (send, recv), comm, sent[3], send._dtype_c, -1)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        if recv is not None and recv_counts is None:  # (array, send_counts, recv_counts)
            recv, send_counts, recv_counts = None, recv, send_counts
        elif recv is not None and send_counts is None:  # (array, send_counts, recv_counts=...)
            recv, send_counts = None, recv
        return _host.all_to_all_v(comm, send, _count_vector(send_counts, comm, "send_counts"),
                                  _count_vector(recv_counts, comm, "recv_counts"), _host_output(recv, out),
                                  _given_displacements(send_displs, comm, "send_displs"),
                                  _given_displacements(recv_displs, comm, "recv_displs"))
    _no_out(out, send, "send")
    if send_counts is None or recv_counts is None:
        raise TypeError("all_to_all_v needs send_counts and recv_counts")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    scounts = _count_vector(send_counts, comm, "send_counts")
    rcounts = _count_vector(recv_counts, comm, "recv_counts")
    sdispls = _displacements(scounts, send_displs, comm, "send_displs")
    rdispls = _displacements(rcounts, recv_displs, comm, "recv_displs")
    _fits(sb, scounts, sdispls, "send")
    _fits(rb, rcounts, rdispls, "recv")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_to_all_v")
    if comm._profile is not None:
        comm._profile.check("all_to_all_v", sb.dtype)
    _remember_layout(comm, send_displs, scounts, sdispls)
    _remember_layout(comm, recv_displs, rcounts, rdispls)
    _done(comm._api.HcclAlltoAllV(sb.ptr, _c_vector(comm, scounts), _c_vector(comm, sdispls), sb.dtype_c, rb.ptr,
                                  _c_vector(comm, rcounts), _c_vector(comm, rdispls), rb.dtype_c, handle,
                                  st._ptr_cdata), "HcclAlltoAllV", st, (send, recv), comm, sum(scounts), sb.dtype_c, -1)
    return recv


@overload
def all_to_all_vc(comm: CommCore, send: np.ndarray, recv: Any = None, send_count_matrix: Any = None, *,
                  stream: None = None, out: Optional[np.ndarray] = None) -> np.ndarray: ...
@overload
def all_to_all_vc(comm: CommCore, send: Any, recv: _Out, send_count_matrix: Any = None, *,
                  stream: Optional[Stream] = None, out: None = None) -> _Out: ...
def all_to_all_vc(comm: CommCore, send: Any, recv: Any = None, send_count_matrix: Any = None, *,
                  stream: Optional[Stream] = None, out: Any = None) -> Any:
    """All-to-all driven by one matrix, the same on every rank: ``send_count_matrix[i][j]`` elements
    go from rank ``i`` to rank ``j``, packed in rank order on both sides. NumPy form:
    ``all_to_all_vc(array, matrix)``."""
    if type(send) is DeviceArray and type(recv) is DeviceArray and out is None:
        st, memo = _fast(comm, stream), comm._layout_memo[_MATRIX]
        try:
            layout = (None if st is None else memo[2] if memo[0] is send_count_matrix
                      and memo[1] == send_count_matrix  # the memo's hit, written out
                      else _known_matrix(comm, send_count_matrix))
        except ValueError:  # rows replaced in place by arrays, which compare element-wise
            layout = None
        if layout is not None:
            c_flat, sent, received = layout
            device = comm._device_id
            sa, ra = send._alloc, recv._alloc
            if (sa.live_device == device and ra.live_device == device
                    and send._dtype is recv._dtype and send._size >= sent and recv._size >= received
                    and (sa is not ra or _apart(send, recv))):
                _done(comm._api.HcclAlltoAllVC(send._cptr, c_flat, send._dtype_c, recv._cptr, recv._dtype_c,
                                               comm._handle, st._ptr_cdata), "HcclAlltoAllVC", st, (send, recv),
                      comm, sent, send._dtype_c, -1)
                return recv
    if isinstance(send, np.ndarray) and _host is not None:
        _no_stream(stream)
        matrix, target = (recv, None) if send_count_matrix is None else (send_count_matrix, recv)
        return _host.all_to_all_vc(comm, send, _count_matrix(comm, matrix), _host_output(target, out))
    _no_out(out, send, "send")
    if send_count_matrix is None:
        raise TypeError("all_to_all_vc needs send_count_matrix")
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    rows = _count_matrix(comm, send_count_matrix)
    sent, received = sum(rows[comm._rank]), sum(row[comm._rank] for row in rows)
    if sent > sb.count:
        raise ValueError(f"send holds {sb.count} elements but row {comm._rank} of the matrix sends {sent}")
    if received > rb.count:
        raise ValueError(f"recv holds {rb.count} elements but column {comm._rank} of the matrix delivers "
                         f"{received}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_to_all_vc")
    if comm._profile is not None:
        comm._profile.check("all_to_all_vc", sb.dtype)
    flat = tuple(count for row in rows for count in row)
    if len(comm._layouts) >= 256:
        comm._layouts.clear()
    comm._layouts[("matrix", rows)] = (_c_vector(comm, flat), sent, received)
    _done(comm._api.HcclAlltoAllVC(sb.ptr, _c_vector(comm, flat), sb.dtype_c, rb.ptr, rb.dtype_c, handle,
                                   st._ptr_cdata), "HcclAlltoAllVC", st, (send, recv), comm, sent, sb.dtype_c, -1)
    return recv


# ---------------------------------------------------------------------------- point to point

def _point_to_point(comm: Any, buf: Any, peer: Any, stream: Optional[Stream], name: str) -> None:
    """Queue ``HcclSend`` or ``HcclRecv`` (``name``) of ``buf`` with ``peer``: the checked path."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    b = resolve(buf, "buf")
    _hccl_count(b.count, "buf")
    if comm._profile is not None:  # before the peer, as HCCL checks
        comm._profile.check("send" if name == "HcclSend" else "recv", b.dtype)
    peer = _peer(comm, peer)
    _on_device(comm, b, "buf")
    _done(getattr(comm._api, name)(b.ptr, b.count, b.dtype_c, peer, handle, st._ptr_cdata), name, st, (buf,),
          comm, b.count, b.dtype_c, peer, comm._trace_p2p)


def send(comm: CommCore, buf: Any, peer: int, *, stream: Optional[Stream] = None) -> None:
    """Send ``buf`` to rank ``peer``, which must post a matching :func:`recv` (same count and dtype)."""
    # The common call first, written out here and in recv alike: a shared helper costs ~0.1 us.
    st = _fast(comm, stream) if type(buf) is DeviceArray and type(peer) is int else None
    if (st is not None and 0 <= peer < comm._size and peer != comm._rank
            and buf._alloc.live_device == comm._device_id and buf._size <= MAX_COUNT):
        _done(comm._api.HcclSend(buf._cptr, buf._size, buf._dtype_c, peer, comm._handle, st._ptr_cdata),
              "HcclSend", st, (buf,), comm, buf._size, buf._dtype_c, peer, comm._trace_p2p)
        return None
    if isinstance(buf, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.send(comm, buf, peer)
    _point_to_point(comm, buf, peer, stream, "HcclSend")
    return None


def recv(comm: CommCore, buf: _Out, peer: int, *, stream: Optional[Stream] = None) -> _Out:
    """Receive into ``buf`` from rank ``peer``, which must post a matching :func:`send`."""
    st = _fast(comm, stream) if type(buf) is DeviceArray and type(peer) is int else None
    if (st is not None and 0 <= peer < comm._size and peer != comm._rank
            and buf._alloc.live_device == comm._device_id and buf._size <= MAX_COUNT):
        _done(comm._api.HcclRecv(buf._cptr, buf._size, buf._dtype_c, peer, comm._handle, st._ptr_cdata),
              "HcclRecv", st, (buf,), comm, buf._size, buf._dtype_c, peer, comm._trace_p2p)
        return buf
    if isinstance(buf, np.ndarray) and _host is not None:
        _no_stream(stream)
        return _host.recv(comm, buf, peer)
    _point_to_point(comm, buf, peer, stream, "HcclRecv")
    return buf


_KINDS = {"send": 0, "recv": 1}
_RECV = _KINDS["recv"]
_second = operator.itemgetter(1)  # an item's buffer


def _batch_rows(comm: CommCore, items: Sequence[Any]) -> Optional[Tuple[tuple, List[DeviceArray]]]:
    """The C items of the common batch (``(kind, DeviceArray, peer)`` tuples, live device arrays
    on the communicator's device, other ranks as peers) as a tuple of rows cffi fills a struct
    array from, and the arrays; None for anything else, or no items (the checked path then says
    what is wrong)."""
    device, size, rank = comm._device_id, comm._size, comm._rank
    rows, buffers = [], []
    try:
        for kind, buf, peer in items:
            code = _KINDS.get(kind)
            if (code is None or type(buf) is not DeviceArray or buf._alloc.live_device != device
                    or buf._size > MAX_COUNT or type(peer) is not int or not 0 <= peer < size or peer == rank):
                return None
            rows.append((code, buf._cptr, buf._size, buf._dtype_c, peer))
            buffers.append(buf)
    except (TypeError, ValueError):  # an item that is not a (kind, buffer, peer) triple, an unhashable kind
        return None
    return (tuple(rows), buffers) if rows else None


def _batch_item(index: int, item: Any) -> Any:
    """``item`` (``items[index]`` of a batch), checked to be a ``(kind, buffer, peer)`` triple."""
    if not isinstance(item, (tuple, list)) or len(item) != 3 or type(item[0]) is not str or item[0] not in _KINDS:
        raise ValueError(f"items[{index}] must be ('send' | 'recv', buffer, peer), got {item!r}")
    return item


def _receives_apart(spans: Sequence[Tuple[int, int, bool]]) -> None:
    """Raise ValueError if a receive buffer of a batch overlaps another item's buffer (HCCL would
    read and write the memory in no defined order). ``spans`` are ``(start, end, receives)``
    addresses, one per item in item order; sends may share memory with each other."""
    reach = reach_recv = 0  # the furthest end of the buffers seen so far (of the receiving ones)
    last = last_recv = -1  # the items that reach there
    for start, end, receives, index in sorted((s, e, r, i) for i, (s, e, r) in enumerate(spans) if e > s):
        other = last_recv if start < reach_recv else last if receives and start < reach else -1
        if other >= 0:
            first, second = sorted((other, index))
            raise ValueError(f"items[{first}] and items[{second}] overlap in memory and at least one of them "
                             "receives: a receive buffer must not share memory with any other item of the batch")
        if end > reach:
            reach, last = end, index
        if receives and end > reach_recv:
            reach_recv, last_recv = end, index


def _remember_batch(comm: CommCore, items: Sequence[Any], buffers: List[DeviceArray], c_items: Any) -> None:
    """Keep ``items`` (checked, with their C array) as the batch the fast path compares the next one
    with. It holds weak proxies, not the buffers: a batch made once must not keep device memory
    alive. A proxy equals only the array it stands for, so an equal batch names the same arrays."""
    proxies = [weakref.proxy(buf) for buf in buffers]
    last = [(kind, proxy, peer) for (kind, _, peer), proxy in zip(items, proxies)]
    comm._batch_memo = (last if type(items) is list else tuple(last),
                        tuple(weakref.proxy(buf._alloc) for buf in buffers), c_items, [-1])


def _batch_open(allocs: Tuple[Any, ...], checked: List[int], device: int) -> bool:
    """Whether a remembered batch's allocations (``allocs``) are all still open on ``device``, asked
    when an array has been closed since they were last found so (or never yet), or a group opened;
    a yes is kept in ``checked`` until the next close. Inside a group, no: the batch is refused
    there (HCCL refuses it), which the fast path then leaves to the checked path. (A group opened
    on one thread while another finds the batch open still lets that batch reach HCCL, which
    refuses it as clearly.)"""
    if _group.depth:
        return False
    closes = _closes[0]  # read first: a close during the check changes it again
    for alloc in allocs:
        if alloc.live_device != device:
            return False
    checked[0] = closes
    return True


def batch_send_recv(comm: CommCore, items: Sequence[Tuple[str, Any, int]], *,
                    stream: Optional[Stream] = None) -> None:
    """Post several sends and receives at once: ``items`` are ``("send" | "recv", buffer, peer)``
    (all device buffers, or all NumPy arrays — then receive arrays are written in place).

    Within one call the local transfers do not wait for each other, so a ring exchange (send to
    the next rank, receive from the previous) cannot deadlock.
    """
    if type(items) is list or type(items) is tuple:
        st = _fast(comm, stream)
        if st is not None:
            last, allocs, c_items, checked = comm._batch_memo
            try:
                # The remembered batch again: its items compare equal to the memo's. The memo on the
                # left: its proxies compare first, so a NumPy array meets a DeviceArray, which it leaves alone.
                again = last == items
            except Exception:  # a freed buffer's proxy, or another object's __eq__ refusing a proxy
                again = False
            if again and (checked[0] == _closes[0] or _batch_open(allocs, checked, comm._device_id)):
                # Held until the stream is done with them: the arrays, not the item tuples, which
                # would be new objects for every garbage collection to walk (~0.15 us a call).
                _done(comm._api.HcclBatchSendRecv(c_items, len(items), comm._handle, st._ptr_cdata),
                      "HcclBatchSendRecv", st, map(_second, items), comm, len(items), -1, -1, comm._trace_p2p)
                return None
            found = None if _group.depth else _batch_rows(comm, items)  # refused in a group, below
            if found is not None:
                rows, buffers = found
                # HCCL reads the items during the call, so equal batches share one C array.
                cache = comm._batch_items
                c_items = cache.get(rows)
                if c_items is None:
                    _receives_apart([(b.ptr, b.ptr + b.nbytes, row[0] == _RECV) for b, row in zip(buffers, rows)])
                    if len(cache) >= 256:
                        cache.clear()
                    c_items = cache[rows] = _ffi.new("HcclSendRecvItem[]", rows)
                _done(comm._api.HcclBatchSendRecv(c_items, len(rows), comm._handle, st._ptr_cdata),
                      "HcclBatchSendRecv", st, buffers, comm, len(rows), -1, -1, comm._trace_p2p)
                if c_items is not comm._batch_memo[2]:
                    # Remembering costs about a call; only a batch made twice in a row is likely to come again.
                    if c_items is comm._batch_seen:
                        _remember_batch(comm, items, buffers, c_items)
                    comm._batch_seen = c_items
                return None
    if _group.depth:
        raise RuntimeError("batch_send_recv cannot run inside hcclpy.group(): HCCL refuses HcclBatchSendRecv "
                           "between HcclGroupStart and HcclGroupEnd. In the group, make each transfer a send() or "
                           "recv() (the group keeps them from deadlocking), or make this call outside it")
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"items must be a sequence of ('send' | 'recv', buffer, peer), got {items!r}") from None
    if items and _host is not None and all(
            isinstance(i, (tuple, list)) and len(i) == 3 and isinstance(i[1], np.ndarray) for i in items):
        _no_stream(stream)
        return _host.batch_send_recv(comm, items)
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    c_items = _ffi.new("HcclSendRecvItem[]", max(len(items), 1))
    keep: List[Any] = []
    spans: List[Tuple[int, int, bool]] = []
    for index, item in enumerate(items):
        kind, buf, peer = _batch_item(index, item)
        b = resolve(buf, f"items[{index}] buffer")
        _hccl_count(b.count, f"items[{index}] buffer")
        _on_device(comm, b, f"items[{index}] buffer")
        if comm._profile is not None:
            comm._profile.check("batch_send_recv", b.dtype)
        c = c_items[index]
        c.sendRecvType = _KINDS[kind]
        c.buf = b.ptr
        c.count = b.count
        c.dataType = b.dtype_c
        c.remoteRank = _peer(comm, peer, f"items[{index}] peer")
        keep.append(buf)
        spans.append((b.address, b.address + b.count * b.itemsize, kind == "recv"))
    _receives_apart(spans)
    _done(comm._api.HcclBatchSendRecv(c_items, len(items), handle, st._ptr_cdata), "HcclBatchSendRecv", st,
          keep, comm, len(items), -1, -1, comm._trace_p2p)
    return None


def barrier(comm: CommCore, *, stream: Optional[Stream] = None) -> None:
    """Wait for every rank to reach the barrier.

    With ``stream``, the barrier is queued on it and the call returns at once: work queued after
    it on that stream starts once every rank has reached it. Without one, the call blocks: the
    barrier is queued on the default stream, which is then synchronised (so the work queued on it
    before is done too), the way scripts on NumPy arrays and ``torch.distributed`` expect.

    Raises
    ------
    RuntimeError
        Without ``stream``, inside :func:`group` (whose calls only run once it ends).
    """
    handle = _comm_handle(comm)
    if stream is None and _group.depth > 0:
        raise RuntimeError("barrier() without a stream blocks until every rank has reached it, so it cannot be "
                           "used inside hcclpy.group(), whose calls run only when the group ends: pass stream=")
    st = _stream(comm, stream)
    _done(comm._api.HcclBarrier(handle, st._ptr_cdata), "HcclBarrier", st, (), comm, 0, -1, -1)
    if stream is None:
        st.synchronize()


# ------------------------------------------------------------------------------------ groups

class _GroupState(threading.local):
    """The calling thread's group nesting and, inside a group, ``pending``: the callbacks for its
    end, and ``streams``: the stream of each of its operations, which HCCL queues only when it
    ends. ``depth`` is a class attribute, every thread's default: a thread-local attribute that
    is missing would cost an exception on each lookup (~0.7 us)."""

    depth = 0


_group = _GroupState()
_groups_lock = threading.Lock()  # guards _grouping and the streams' _grouped counts
_grouping = 0  # how many groups are open, on every thread: while none is, the operations skip _count_in_group


def _count_in_group(stream: Stream) -> None:
    """Inside a group on the calling thread, ``stream`` counts one more operation of an open
    group (``Stream._grouped``) until the group ends: meanwhile, waits on the stream neither let
    go of buffers nor mark work complete."""
    if _group.depth:
        with _groups_lock:
            stream._grouped += 1
        _group.streams.append(stream)


def _end_group_counts() -> None:
    """The outermost group of the calling thread has ended: HCCL queued its operations, which
    their streams stop counting as operations of a group."""
    streams, _group.streams = _group.streams, []
    with _groups_lock:
        for stream in streams:
            stream._grouped -= 1


def group_active() -> bool:
    """True inside ``with hcclpy.group():`` on the calling thread; False otherwise."""
    return _group.depth > 0


def after_group(callback: Callable[[bool], None]) -> None:
    """Call ``callback(succeeded)`` once the calling thread's outermost group has ended."""
    _group.pending.append(callback)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Hold the HCCL calls of the block and release them together (``HcclGroupStart/End``).

    A group belongs to the thread that opens it: other threads' calls go on as usual. Sends and
    receives inside one group cannot deadlock each other; one thread can drive the communicators
    of several devices; communicators created in the block exist once it ends. The
    block's calls are released even if it raises.

    Examples
    --------
    >>> with hcclpy.group():
    ...     comm.send(x, peer=1)
    ...     comm.recv(y, peer=1)
    """
    global _grouping
    bound = _ffi.api()
    rc = bound.HcclGroupStart()
    if rc:
        raise _ffi.hccl_failure(rc, "HcclGroupStart")
    if not group_active():
        _group.pending = []
        _group.streams = []
    _group.depth += 1
    _closes[0] += 1  # remembered batches are looked at again (see _batch_open), which a group refuses
    with _groups_lock:
        _grouping += 1
    try:
        yield
    finally:
        _group.depth -= 1
        rc = bound.HcclGroupEnd()
        with _groups_lock:
            _grouping -= 1
        if _group.depth == 0:
            _end_group_counts()  # HCCL has queued the group's operations (or failed to)
            pending, _group.pending = _group.pending, []
            for callback in pending:
                callback(rc == 0)
        if rc:
            raise _ffi.hccl_failure(rc, "HcclGroupEnd")
