"""The argument rules every operation shares: ranks, reduce ops, counts, displacements, matrices,
dtypes and overlaps.

Each rule is written once and raises a ``ValueError`` or ``TypeError`` that names the argument,
the value and what is allowed; every path (device buffers, NumPy arrays, torch tensors, groups,
persistent operations) reaches it through the operation definitions in :mod:`._ops`.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from .. import _ffi
from .._comm_core import CommCore
from ..types import ReduceOp, as_reduce_op
from ._buffers import MAX_COUNT, Buffer

__all__ = ["aligned", "block_of", "count_matrix", "counts", "disjoint", "displacements", "divides", "extent", "fits",
           "known", "layout", "Layout", "matrix", "Matrix", "on_device", "overlap", "pair", "peer", "rank", "reduce_op", "remember",
           "same_dtype", "twins"]

# Reduce ops as C ints, by member and by lower-case name. Only these key types are looked up:
# True and 2.0 equal ints the dictionary holds, and as_reduce_op refuses them with its message.
_OP_CODES: Dict[Any, int] = {**{op: op._value_ for op in ReduceOp}, **{op.name.lower(): op._value_ for op in ReduceOp}}
_OP_KEY_TYPES = frozenset({ReduceOp, str})
# The names alone, for the definitions' common call (an op by name): a str is never equal to a bool.
OP_NAMES: Dict[str, int] = {op.name.lower(): op._value_ for op in ReduceOp}


def reduce_op(op: Any) -> int:
    """``op`` (a :class:`ReduceOp`, its value or its name) as the C ``HcclReduceOp``."""
    code = _OP_CODES.get(op) if type(op) in _OP_KEY_TYPES else None
    return code if code is not None else as_reduce_op(op)._value_


def reduce_op_name(code: int) -> str:
    """The name of the reduce op of C value ``code``, as messages spell it."""
    return ReduceOp(code).name.lower()


def is_reduce_op_name(value: Any) -> bool:
    """Whether ``value`` names a reduce op (for messages about arguments given out of place)."""
    return isinstance(value, ReduceOp) or (isinstance(value, str) and value.lower() in _OP_CODES)


# What to do about a world of one rank, which is what hcclpy.init() makes without a launcher.
_ALONE = (", as hcclpy.init() makes without a launcher; start the script with one, e.g. hcclpy run -n 2 script.py "
          "(or torchrun, srun, mpiexec)")


def rank(comm: CommCore, value: Any, argument: str) -> int:
    """``value`` as a rank of ``comm``."""
    if type(value) is int and 0 <= value < comm._size:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < comm._size:
        hint = ""
        if argument == "root" and (hasattr(value, "__dlpack__") or hasattr(value, "_alloc")):
            hint = ": a buffer came where the root goes (broadcast works in place: broadcast(buf, root=...))"
        elif comm._size == 1:
            hint = ": it has one rank" + _ALONE
        raise ValueError(f"{argument}={value!r} must be a rank of communicator '{comm._name}' "
                         f"(0..{comm._size - 1}){hint}")
    return int(value)


def peer(comm: CommCore, value: Any, argument: str = "peer") -> int:
    """``value`` as another rank of ``comm`` (a transfer to the rank itself is refused)."""
    other = rank(comm, value, argument)
    if other == comm._rank:
        alone = " (a communicator of one rank" + _ALONE + ")" if comm._size == 1 else ""
        raise ValueError(f"{argument}={other} is this rank; send/recv need another rank{alone}")
    return other


def counts(comm: CommCore, values: Any, argument: str, scale: int = 1) -> Tuple[int, ...]:
    """``size`` non-negative element counts as a tuple of ints, times ``scale`` (the carrier
    elements per element of a NumPy dtype that travels as pairs or bytes)."""
    kind = type(values)
    if (kind is tuple or kind is list) and len(values) == comm._size:
        for v in values:  # the common call: plain ints in range (a loop: generators cost more here)
            if type(v) is not int or v < 0 or v > MAX_COUNT:
                break
        else:
            return tuple(values) if scale == 1 else tuple([v * scale for v in values])
    try:
        checked = tuple(values)
    except TypeError:  # not iterable: refused below
        checked = ()
    if len(checked) != comm._size or any(type(v) is not int and (isinstance(v, bool) or not isinstance(v, np.integer))
                                         for v in checked):
        raise ValueError(f"{argument} must hold {comm._size} non-negative int{'s' if comm._size > 1 else ''} "
                         f"(one per rank), got {_shown(values)}")
    if any(v < 0 for v in checked):
        raise ValueError(f"{argument} must not contain negative counts, got {values!r}")
    if any(v > MAX_COUNT for v in checked):
        raise ValueError(f"{argument} holds a value above HCCL's largest supported count 0x{MAX_COUNT:X} "
                         f"({MAX_COUNT}), got {values!r}")
    return tuple([int(v) * scale for v in checked])


def _shown(values: Any) -> str:
    """``values`` as a message about counts shows it: a reduce op's name says where it belongs, and
    an array of other than ints shows its type, not its contents."""
    if isinstance(values, str) and is_reduce_op_name(values):
        return f"{values!r}, a reduce op: pass it by name, op={values!r} (it comes after the counts)"
    if isinstance(values, np.ndarray) and values.dtype.kind not in "iu":
        return f"a {values.dtype} array of shape {values.shape}"
    return repr(values)


def displacements(comm: CommCore, block_counts: Tuple[int, ...], values: Any, argument: str,
                  scale: int = 1) -> Tuple[int, ...]:
    """The checked displacements ``values``, or for None the blocks of ``block_counts`` packed back
    to back in rank order."""
    if values is not None:
        return counts(comm, values, argument, scale)
    packed, at = [], 0
    for count in block_counts:
        packed.append(at)
        at += count
    if packed[-1] > MAX_COUNT * scale:  # HCCL bounds displacements as it bounds counts
        raise ValueError(f"packed, the counts {list(block_counts)} put the last rank's block at element {packed[-1]}, "
                         f"above HCCL's largest supported displacement 0x{MAX_COUNT:X} ({MAX_COUNT})")
    return tuple(packed)


def extent(block_counts: Sequence[int], displs: Sequence[int]) -> int:
    """How many elements blocks at ``displs`` of ``block_counts`` elements span."""
    end = 0
    for count, displ in zip(block_counts, displs):
        if count and count + displ > end:
            end = count + displ
    return end


def fits(buf: Buffer, blocks: Layout, argument: str) -> None:
    """Refuse a buffer smaller than the blocks of ``blocks`` address."""
    if blocks.end > buf.count:
        raise ValueError(f"{argument} holds {buf.count // buf.scale} elements but {blocks.given} address "
                         f"{blocks.end // buf.scale}")


# ------------------------------------------------------------------ layouts, checked once
# Jobs repeat their block layouts (and batches) call after call, and checking counts and making
# their C arrays costs more than the rest of an uneven operation. One cache keeps what was checked
# and made: at most LIMIT entries, emptied when full (a job that changes layout at every call pays
# the full check, as without a cache). A hit is keyed by the arguments' values; their types are
# checked again (True and 64.0 equal ints, and are refused).
LIMIT = 256
_known: Dict[tuple, Any] = {}
_INTS = frozenset({int})


def known(key: tuple) -> Any:
    """What :func:`remember` kept under ``key``, or None."""
    return _known.get(key)


def remember(key: tuple, value: Any) -> Any:
    """Keep ``value`` under ``key`` (see above) and return it."""
    if len(_known) >= LIMIT:
        _known.clear()
    _known[key] = value
    return value


class Layout:
    """The checked blocks of an uneven operation: counts and displacements in elements (times the
    dtype's scale), where the last block ends, their sum, and their C arrays for HCCL."""

    __slots__ = ("counts", "displs", "end", "total", "given", "c_counts", "c_displs")

    counts: Tuple[int, ...]
    displs: Tuple[int, ...]
    end: int     # the elements the blocks span
    total: int   # the elements they hold
    given: str   # the arguments that gave them, for messages
    c_counts: Any
    c_displs: Any


def layout(comm: CommCore, counts_arg: Any, displs_arg: Any, counts_name: str, displs_name: str,
           scale: int = 1) -> Layout:
    """The blocks of ``counts_arg`` elements at ``displs_arg`` (None: packed in rank order), checked
    for ``comm``: one count and one displacement per rank, non-negative ints within HCCL's bounds."""
    key = None
    kind, displs_kind = type(counts_arg), type(displs_arg)
    if (kind is list or kind is tuple) and (displs_arg is None or displs_kind is list or displs_kind is tuple):
        values = tuple(counts_arg) if displs_arg is None else tuple(counts_arg) + tuple(displs_arg)
        key = (counts_name, comm._size, scale, len(counts_arg), values, displs_arg is None)
        try:
            found = _known.get(key)
        except TypeError:  # unhashable values (a list among the counts): refused below
            found = key = None
        if found is not None and _INTS.issuperset(map(type, values)):
            return found
    made = Layout()
    made.counts = counts(comm, counts_arg, counts_name, scale)
    made.displs = displacements(comm, made.counts, displs_arg, displs_name, scale)
    made.end = extent(made.counts, made.displs)
    made.total = sum(made.counts)
    made.given = counts_name if displs_arg is None else f"{counts_name} and {displs_name}"
    made.c_counts = _ffi.new("uint64_t[]", made.counts)
    made.c_displs = _ffi.new("uint64_t[]", made.displs)
    return made if key is None else remember(key, made)


def count_matrix(comm: CommCore, matrix: Any, scale: int = 1) -> Tuple[Tuple[int, ...], ...]:
    """An all_to_all_vc count matrix: ``size`` rows of ``size`` non-negative ints (times ``scale``)."""
    try:
        rows = [row if type(row) is list or type(row) is tuple else tuple(row) for row in matrix]
    except TypeError:  # not iterable, or rows that are not
        rows = []
    if len(rows) != comm._size or any(len(row) != comm._size for row in rows):
        raise ValueError(f"send_count_matrix must be a {comm._size} x {comm._size} matrix of non-negative ints, "
                         f"got {matrix!r}")
    try:
        return tuple([counts(comm, row, "", scale) for row in rows])
    except ValueError:  # say which value is wrong: not a non-negative int, or too large for HCCL (its row)
        if not all((type(v) is int or isinstance(v, np.integer)) and not isinstance(v, bool) and v >= 0
                   for row in rows for v in row):
            raise ValueError(f"send_count_matrix must be a {comm._size} x {comm._size} matrix of non-negative "
                             f"ints, got {matrix!r}") from None
        for i, row in enumerate(rows):
            counts(comm, row, f"send_count_matrix row {i}", scale)
        raise


class Matrix:
    """A checked all_to_all_vc count matrix (times the dtype's scale), seen from one rank: the
    elements it sends and receives, and the matrix as HCCL's flat C array."""

    __slots__ = ("rows", "sent", "received", "c_flat")

    rows: Tuple[Tuple[int, ...], ...]
    sent: int
    received: int
    c_flat: Any


def matrix(comm: CommCore, value: Any, scale: int = 1) -> Matrix:
    """``value`` as the count matrix of ``comm`` (see :func:`count_matrix`)."""
    try:
        rows = tuple(map(tuple, value)) if type(value) is list or type(value) is tuple else None
    except TypeError:  # rows that are not iterable: refused below
        rows = None
    key = None
    if rows is not None:
        key = ("send_count_matrix", comm._size, comm._rank, scale, rows)
        try:
            found = _known.get(key)
        except TypeError:  # unhashable values: refused below
            found = key = None
        if found is not None and _INTS.issuperset(map(type, chain.from_iterable(rows))):
            return found
    made = Matrix()
    made.rows = count_matrix(comm, value, scale)
    made.sent = sum(made.rows[comm._rank])
    made.received = sum([row[comm._rank] for row in made.rows])
    made.c_flat = _ffi.new("uint64_t[]", sum(made.rows, ()))
    return made if key is None else remember(key, made)


def pair(comm: CommCore, send: Buffer, recv: Buffer) -> None:
    """The rules of a ``send`` and ``recv`` pair: both NumPy arrays or both device buffers, of one
    dtype, on the communicator's device. (The common case passes the tests written out here.)"""
    if send.dtype is not recv.dtype or send.host or recv.host or send.scale != recv.scale:
        same_dtype(send, recv, "send", "recv")
    device = comm._device_id
    if send.device != device or recv.device != device or send.count > MAX_COUNT or recv.count > MAX_COUNT:
        on_device(comm, send, "send")
        on_device(comm, recv, "recv")


def twins(comm: CommCore, send: Buffer, recv: Buffer, operation: str) -> None:
    """The rules of an element-wise ``send`` and ``recv`` pair: :func:`pair`, the same count, and
    either the very same memory (in place) or none shared."""
    device = comm._device_id
    # pair()'s tests, written out: the most frequent call of all saves a function call.
    if (send.dtype is not recv.dtype or send.host or recv.host or send.scale != recv.scale
            or send.device != device or recv.device != device or send.count > MAX_COUNT):
        pair(comm, send, recv)
    if send.count != recv.count:
        raise ValueError(f"send has {send.count // send.scale} elements but recv {recv.count // recv.scale}; "
                         f"{operation} needs the same count")
    if (send.address != recv.address and (send._alloc is None or send._alloc is recv._alloc or recv._alloc is None)
            and overlap(send, recv)):  # (two allocations never share memory)
        raise ValueError("send and recv overlap without being the same buffer")


def divides(buf: Buffer, size: int, operation: str) -> None:
    """Refuse a ``send`` that does not split into ``size`` blocks."""
    if buf.count % (size * buf.scale):
        raise ValueError(f"{operation} splits send into {size} blocks, but it holds {buf.count // buf.scale} "
                         f"elements, not a multiple of {size}")


def same_dtype(a: Buffer, b: Buffer, a_name: str, b_name: str) -> None:
    """Refuse two buffers of different dtypes, or a NumPy array with a device buffer."""
    if a.host is not b.host:
        raise TypeError(f"{a_name} and {b_name} mix a NumPy array with a device buffer: pass NumPy arrays for "
                        "every buffer (they are staged through the device), or device buffers for every one")
    # NumPy arrays moved as bytes all travel as uint8: their own dtypes must match too.
    if a.dtype is not b.dtype or a.scale != b.scale or (a.host and a.source.dtype != b.source.dtype):
        raise TypeError(f"{a_name} is {a.kind} but {b_name} is {b.kind}; they must match")


def on_device(comm: CommCore, buf: Buffer, argument: str) -> None:
    """Refuse device memory of another device than the communicator's (and counts HCCL refuses)."""
    if buf.device is not None and buf.device != comm._device_id:
        raise ValueError(f"{argument} is memory of device {buf.device} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")
    if buf.count > MAX_COUNT:
        raise ValueError(f"{argument} holds {buf.count} elements, more than HCCL's largest supported count "
                         f"0x{MAX_COUNT:X} ({MAX_COUNT}) per call: split the call")


def aligned(buf: Buffer, argument: str) -> None:
    """Refuse a misaligned buffer to a reduction (HCCL reduces naturally aligned elements)."""
    if buf.address % buf.itemsize:
        raise ValueError(f"{argument} at 0x{buf.address:x} is not aligned to its {buf.itemsize}-byte "
                         f"{buf.dtype.name.lower()} elements (reductions need natural alignment)")


def overlap(a: Buffer, b: Buffer) -> bool:
    """Whether two non-empty buffers share memory (host buffers by their own addresses too)."""
    if a.host != b.host or (a._alloc is not None and b._alloc is not None and a._alloc is not b._alloc):
        return False  # (arrays of two allocations never share memory)
    a_end = a.address + a.count * a.itemsize
    b_end = b.address + b.count * b.itemsize
    return a.count > 0 and b.count > 0 and a.address < b_end and b.address < a_end


def disjoint(a: Buffer, b: Buffer, operation: str) -> None:
    if overlap(a, b):
        raise ValueError(f"{operation} does not work in place: send and recv buffers must not overlap")


def block_of(whole: Buffer, block: Buffer, index: int) -> Optional[bool]:
    """True when ``block`` is exactly block ``index`` of ``whole`` (an in-place form), False when
    the two are apart, None when they overlap otherwise."""
    if whole.host == block.host and block.address == whole.address + index * block.count * block.itemsize:
        return True
    return None if overlap(whole, block) else False
