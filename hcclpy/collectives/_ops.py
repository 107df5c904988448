"""Every HCCL operation on device buffers.

Each function takes the communicator first, then buffers, then ``op``/``root``/``peer``, then the
keyword-only ``stream`` (default: the device's hcclpy-owned stream). Arguments are checked before
any C call; a ``ValueError``/``TypeError`` names the argument, the value and what is allowed.
Operations return as soon as the work is queued: results are defined once the stream is
synchronised. Each returns the output buffer it wrote (``None`` where there is none).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import numpy as np

from .. import _ffi
from .._comm_core import CommCore
from ..runtime import DeviceArray, Stream
from ..types import ReduceOp, as_reduce_op
from ._buffers import Buffer, resolve

__all__ = [
    "all_gather", "all_gather_v", "all_reduce", "all_to_all", "all_to_all_v", "all_to_all_vc", "barrier",
    "batch_send_recv", "broadcast", "group", "recv", "reduce", "reduce_scatter", "reduce_scatter_v", "scatter",
    "send",
]

_SUM = ReduceOp.SUM


# ------------------------------------------------------------------------- shared checks

def _comm_handle(comm: Any) -> Any:
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    handle = comm._handle
    return handle if handle is not None else comm._live_handle()


def _stream(comm: CommCore, stream: Optional[Stream]) -> Stream:
    if stream is None:
        stream = comm._device.default_stream
    elif type(stream) is not Stream:
        raise TypeError(f"stream must be an hcclpy.Stream or None, got {type(stream).__name__}")
    if stream._device_id != comm._device_id:
        raise ValueError(f"stream is on device {stream._device_id} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")
    if stream._live_device < 0:
        raise ValueError("stream is closed")
    return stream


def _on_device(comm: CommCore, buf: Buffer, argument: str) -> None:
    if buf.device is not None and buf.device != comm._device_id:
        raise ValueError(f"{argument} is memory of device {buf.device} but communicator '{comm._name}' runs on "
                         f"device {comm._device_id}")


def _same_dtype(a: Buffer, b: Buffer, a_name: str, b_name: str) -> None:
    if a.dtype is not b.dtype:
        raise TypeError(f"{a_name} is {a.dtype.name.lower()} but {b_name} is {b.dtype.name.lower()}; they must match")


def _aligned(buf: Buffer, argument: str) -> None:
    if buf.address % buf.dtype.itemsize:
        raise ValueError(f"{argument} at 0x{buf.address:x} is not aligned to its {buf.dtype.itemsize}-byte "
                         f"{buf.dtype.name.lower()} elements (reductions need natural alignment)")


def _overlap(a: Buffer, b: Buffer) -> bool:
    a_end = a.address + a.count * a.dtype.itemsize
    b_end = b.address + b.count * b.dtype.itemsize
    return a.count > 0 and b.count > 0 and a.address < b_end and b.address < a_end


def _disjoint(a: Buffer, b: Buffer, operation: str) -> None:
    if _overlap(a, b):
        raise ValueError(f"{operation} does not work in place: send and recv buffers must not overlap")


def _rank(comm: CommCore, value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < comm._size:
        raise ValueError(f"{argument}={value!r} must be a rank of communicator '{comm._name}' "
                         f"(0..{comm._size - 1})")
    return int(value)


def _peer(comm: CommCore, value: Any, argument: str = "peer") -> int:
    peer = _rank(comm, value, argument)
    if peer == comm._rank:
        raise ValueError(f"{argument}={peer} is this rank; send/recv need another rank")
    return peer


def _op(op: Any) -> int:
    return (op if type(op) is ReduceOp else as_reduce_op(op))._value_


def _count_vector(values: Any, comm: CommCore, argument: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except Exception:  # noqa: BLE001 - anything that is not a sequence of ints
        array = None
    if array is None or array.ndim != 1 or array.shape[0] != comm._size or \
            (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{argument} must be {comm._size} non-negative ints (one per rank), got {values!r}")
    if array.size and array.min() < 0:
        raise ValueError(f"{argument} must not contain negative counts, got {values!r}")
    return np.ascontiguousarray(array, dtype=np.uint64)


def _displacements(counts: np.ndarray, displs: Any, comm: CommCore, argument: str) -> np.ndarray:
    if displs is None:  # packed back to back, in rank order
        out = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=out[1:])
        return out
    return _count_vector(displs, comm, argument)


def _fits(buf: Buffer, counts: np.ndarray, displs: np.ndarray, argument: str) -> None:
    # Python ints: count + displacement must not wrap around as uint64 would.
    needed = max((int(c) + int(d) for c, d in zip(counts, displs) if c), default=0)
    if needed > buf.count:
        raise ValueError(f"{argument} holds {buf.count} elements but the counts and displacements address "
                         f"{needed}")


def _call(rc: int, name: str, stream: Optional[Stream] = None, keep: Any = None) -> None:
    """Raise for a failed call; otherwise keep the call's buffers alive while ``stream`` needs them."""
    if rc:
        raise _ffi.hccl_failure(rc, name)
    if stream is not None:
        stream._hold(keep)


# ------------------------------------------------------------------------------ reductions

def all_reduce(comm: CommCore, send: Any, recv: Any = None, op: Any = _SUM, *,
               stream: Optional[Stream] = None) -> Any:
    """Reduce ``send`` across all ranks into ``recv`` on every rank (``recv=None``: in place).

    Parameters
    ----------
    comm
        The communicator.
    send, recv
        Device buffers of the same dtype and element count.
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
    # Fast path for the common call (two live device arrays of one allocation-free layout, an
    # explicit stream): the same checks as below, as plain attribute tests, then the C call.
    if type(send) is DeviceArray and type(recv) is DeviceArray and type(stream) is Stream and type(op) is ReduceOp \
            and isinstance(comm, CommCore):
        handle, sa, ra, device = comm._handle, send._alloc, recv._alloc, comm._device_id
        if (handle is not None and stream._live_device == device and sa.live_device == device
                and ra.live_device == device and send._dtype is recv._dtype and send._size == recv._size
                and (sa is not ra or send._offset == recv._offset)):
            rc = comm._api.HcclAllReduce(send._cptr, recv._cptr, send._size, send._dtype_c, op._value_, handle,
                                         stream._ptr_cdata)
            if rc:
                raise _ffi.hccl_failure(rc, "HcclAllReduce")
            stream._hold((send, recv))
            return recv
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
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    if sb.address % sb.dtype.itemsize or rb.address % rb.dtype.itemsize:
        _aligned(sb, "send")
        _aligned(rb, "recv")
    _call(comm._api.HcclAllReduce(sb.ptr, rb.ptr, sb.count, sb.dtype_c, _op(op), handle, st._ptr_cdata), "HcclAllReduce", st, (send, recv))
    return send if recv is None else recv


def reduce(comm: CommCore, send: Any, recv: Any = None, op: Any = _SUM, root: int = 0, *,
           stream: Optional[Stream] = None) -> Any:
    """Reduce ``send`` across all ranks into ``recv`` on ``root`` only.

    ``recv`` is ignored on other ranks (it may be None); on the root ``recv=None`` reduces in place.
    Returns the output buffer on the root, None elsewhere.
    """
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    sb = resolve(send, "send")
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
    recv_ptr = rb.ptr if is_root else _ffi.NULL
    _call(comm._api.HcclReduce(sb.ptr, recv_ptr, sb.count, sb.dtype_c, _op(op), root, handle, st._ptr_cdata),
          "HcclReduce", st, (send, recv))
    return (send if recv is None else recv) if is_root else None


def reduce_scatter(comm: CommCore, send: Any, recv: Any, op: Any = _SUM, *,
                   stream: Optional[Stream] = None) -> Any:
    """Reduce ``send`` (``size * n`` elements) across ranks; rank ``r`` receives block ``r`` in ``recv``
    (``n`` elements)."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    if sb.count != rb.count * comm._size:
        raise ValueError(f"send must hold recv.count * size = {rb.count} * {comm._size} = "
                         f"{rb.count * comm._size} elements, it holds {sb.count}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _aligned(sb, "send")
    _aligned(rb, "recv")
    in_place = rb.address == sb.address + comm._rank * rb.count * rb.dtype.itemsize
    if not in_place and _overlap(sb, rb):
        raise ValueError("recv overlaps send; in place, recv must be exactly this rank's block of send")
    _call(comm._api.HcclReduceScatter(sb.ptr, rb.ptr, rb.count, rb.dtype_c, _op(op), handle, st._ptr_cdata),
          "HcclReduceScatter", st, (send, recv))
    return recv


def reduce_scatter_v(comm: CommCore, send: Any, recv: Any, send_counts: Sequence[int],
                     send_displs: Optional[Sequence[int]] = None, op: Any = _SUM, *,
                     stream: Optional[Stream] = None) -> Any:
    """Reduce-scatter with uneven blocks: rank ``r`` receives the reduction of every rank's
    ``send[send_displs[r] : send_displs[r] + send_counts[r]]`` (``recv`` holds ``send_counts[r]``
    elements). ``send_displs=None`` packs the blocks back to back."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    counts = _count_vector(send_counts, comm, "send_counts")
    displs = _displacements(counts, send_displs, comm, "send_displs")
    _fits(sb, counts, displs, "send")
    mine = int(counts[comm._rank])
    if rb.count < mine:
        raise ValueError(f"recv holds {rb.count} elements but send_counts[{comm._rank}] = {mine}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _aligned(sb, "send")
    _aligned(rb, "recv")
    _disjoint(sb, rb, "reduce_scatter_v")
    _call(comm._api.HcclReduceScatterV(sb.ptr, _ffi.from_buffer("uint64_t[]", counts),
                                       _ffi.from_buffer("uint64_t[]", displs), rb.ptr, mine, sb.dtype_c, _op(op),
                                       handle, st._ptr_cdata), "HcclReduceScatterV", st, (send, recv))
    return recv


# ---------------------------------------------------------------------------- data motion

def broadcast(comm: CommCore, buf: Any, root: int = 0, *, stream: Optional[Stream] = None) -> Any:
    """Copy ``buf`` of ``root`` into ``buf`` of every other rank."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    b = resolve(buf, "buf")
    _on_device(comm, b, "buf")
    _call(comm._api.HcclBroadcast(b.ptr, b.count, b.dtype_c, root, handle, st._ptr_cdata), "HcclBroadcast", st, buf)
    return buf


def all_gather(comm: CommCore, send: Any, recv: Any, *, stream: Optional[Stream] = None) -> Any:
    """Gather every rank's ``send`` (``n`` elements) into ``recv`` (``size * n``), in rank order.

    In place: ``send`` is this rank's block of ``recv``.
    """
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    if rb.count != sb.count * comm._size:
        raise ValueError(f"recv must hold send.count * size = {sb.count} * {comm._size} = "
                         f"{sb.count * comm._size} elements, it holds {rb.count}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    in_place = sb.address == rb.address + comm._rank * sb.count * sb.dtype.itemsize
    if not in_place and _overlap(sb, rb):
        raise ValueError("send overlaps recv; in place, send must be exactly this rank's block of recv")
    _call(comm._api.HcclAllGather(sb.ptr, rb.ptr, sb.count, sb.dtype_c, handle, st._ptr_cdata), "HcclAllGather", st, (send, recv))
    return recv


def all_gather_v(comm: CommCore, send: Any, recv: Any, recv_counts: Sequence[int],
                 recv_displs: Optional[Sequence[int]] = None, *, stream: Optional[Stream] = None) -> Any:
    """All-gather with uneven blocks: rank ``r``'s ``send`` lands at ``recv[recv_displs[r]:]``
    (``recv_counts[r]`` elements, which must equal that rank's ``send`` count)."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    counts = _count_vector(recv_counts, comm, "recv_counts")
    displs = _displacements(counts, recv_displs, comm, "recv_displs")
    if int(counts[comm._rank]) != sb.count:
        raise ValueError(f"recv_counts[{comm._rank}] = {int(counts[comm._rank])} must equal this rank's send "
                         f"count {sb.count}")
    _fits(rb, counts, displs, "recv")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_gather_v")
    _call(comm._api.HcclAllGatherV(sb.ptr, sb.count, rb.ptr, _ffi.from_buffer("uint64_t[]", counts),
                                   _ffi.from_buffer("uint64_t[]", displs), sb.dtype_c, handle, st._ptr_cdata),
          "HcclAllGatherV", st, (send, recv))
    return recv


def scatter(comm: CommCore, send: Any, recv: Any, root: int = 0, *, stream: Optional[Stream] = None) -> Any:
    """Rank ``r`` receives block ``r`` of ``root``'s ``send`` (``size * n`` elements) into ``recv``
    (``n``). ``send`` is only read on the root (it may be None elsewhere)."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    root = _rank(comm, root, "root")
    rb = resolve(recv, "recv")
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
        in_place = rb.address == sb.address + root * rb.count * rb.dtype.itemsize
        if not in_place and _overlap(sb, rb):
            raise ValueError("recv overlaps send; in place, recv must be exactly the root's block of send")
        send_ptr = sb.ptr
    _call(comm._api.HcclScatter(send_ptr, rb.ptr, rb.count, rb.dtype_c, root, handle, st._ptr_cdata), "HcclScatter", st, (send, recv))
    return recv


def all_to_all(comm: CommCore, send: Any, recv: Any, *, stream: Optional[Stream] = None) -> Any:
    """Rank ``r`` sends block ``j`` of ``send`` to rank ``j``, which stores it as block ``r`` of
    ``recv``. Both hold ``size * n`` elements and must not overlap."""
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
    per_rank = sb.count // comm._size
    _call(comm._api.HcclAlltoAll(sb.ptr, per_rank, sb.dtype_c, rb.ptr, per_rank, rb.dtype_c, handle, st._ptr_cdata),
          "HcclAlltoAll", st, (send, recv))
    return recv


def all_to_all_v(comm: CommCore, send: Any, recv: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
                 send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None, *,
                 stream: Optional[Stream] = None) -> Any:
    """All-to-all with uneven blocks: ``send_counts[j]`` elements from ``send[send_displs[j]:]`` go
    to rank ``j``; ``recv_counts[j]`` elements from rank ``j`` land at ``recv[recv_displs[j]:]``.
    Displacements default to packed blocks. ``send`` and ``recv`` must not overlap."""
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
    vectors = [_ffi.from_buffer("uint64_t[]", v) for v in (scounts, sdispls, rcounts, rdispls)]
    _call(comm._api.HcclAlltoAllV(sb.ptr, vectors[0], vectors[1], sb.dtype_c, rb.ptr, vectors[2], vectors[3],
                                  rb.dtype_c, handle, st._ptr_cdata), "HcclAlltoAllV", st, (send, recv))
    return recv


def all_to_all_vc(comm: CommCore, send: Any, recv: Any, send_count_matrix: Any, *,
                  stream: Optional[Stream] = None) -> Any:
    """All-to-all driven by one matrix, the same on every rank: ``send_count_matrix[i][j]`` elements
    go from rank ``i`` to rank ``j``, packed in rank order on both sides."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    sb, rb = resolve(send, "send"), resolve(recv, "recv")
    _same_dtype(sb, rb, "send", "recv")
    n = comm._size
    matrix = np.asarray(send_count_matrix)
    if matrix.shape != (n, n) or (matrix.size and not np.issubdtype(matrix.dtype, np.integer)) or \
            (matrix.size and matrix.min() < 0):
        raise ValueError(f"send_count_matrix must be a {n} x {n} matrix of non-negative ints, got shape "
                         f"{matrix.shape}")
    matrix = np.ascontiguousarray(matrix, dtype=np.uint64)
    sent, received = int(matrix[comm._rank].sum()), int(matrix[:, comm._rank].sum())
    if sent > sb.count:
        raise ValueError(f"send holds {sb.count} elements but row {comm._rank} of the matrix sends {sent}")
    if received > rb.count:
        raise ValueError(f"recv holds {rb.count} elements but column {comm._rank} of the matrix delivers "
                         f"{received}")
    _on_device(comm, sb, "send")
    _on_device(comm, rb, "recv")
    _disjoint(sb, rb, "all_to_all_vc")
    _call(comm._api.HcclAlltoAllVC(sb.ptr, _ffi.from_buffer("uint64_t[]", matrix.ravel()), sb.dtype_c, rb.ptr,
                                   rb.dtype_c, handle, st._ptr_cdata), "HcclAlltoAllVC", st, (send, recv))
    return recv


# ---------------------------------------------------------------------------- point to point

def send(comm: CommCore, buf: Any, peer: int, *, stream: Optional[Stream] = None) -> None:
    """Send ``buf`` to rank ``peer``, which must post a matching :func:`recv` (same count and dtype)."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    peer = _peer(comm, peer)
    b = resolve(buf, "buf")
    _on_device(comm, b, "buf")
    _call(comm._api.HcclSend(b.ptr, b.count, b.dtype_c, peer, handle, st._ptr_cdata), "HcclSend", st, buf)


def recv(comm: CommCore, buf: Any, peer: int, *, stream: Optional[Stream] = None) -> Any:
    """Receive into ``buf`` from rank ``peer``, which must post a matching :func:`send`."""
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    peer = _peer(comm, peer)
    b = resolve(buf, "buf")
    _on_device(comm, b, "buf")
    _call(comm._api.HcclRecv(b.ptr, b.count, b.dtype_c, peer, handle, st._ptr_cdata), "HcclRecv", st, buf)
    return buf


_KINDS = {"send": 0, "recv": 1}


def batch_send_recv(comm: CommCore, items: Sequence[Tuple[str, Any, int]], *,
                    stream: Optional[Stream] = None) -> None:
    """Post several sends and receives at once: ``items`` are ``("send" | "recv", buffer, peer)``.

    Within one call the local transfers do not wait for each other, so a ring exchange (send to
    the next rank, receive from the previous) cannot deadlock.
    """
    handle = _comm_handle(comm)
    st = _stream(comm, stream)
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"items must be a sequence of ('send' | 'recv', buffer, peer), got {items!r}") from None
    c_items = _ffi.new("HcclSendRecvItem[]", max(len(items), 1))
    keep = []
    for index, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 3 or item[0] not in _KINDS:
            raise ValueError(f"items[{index}] must be ('send' | 'recv', buffer, peer), got {item!r}")
        kind, buf, peer = item
        b = resolve(buf, f"items[{index}] buffer")
        _on_device(comm, b, f"items[{index}] buffer")
        c = c_items[index]
        c.sendRecvType = _KINDS[kind]
        c.buf = b.ptr
        c.count = b.count
        c.dataType = b.dtype_c
        c.remoteRank = _peer(comm, peer, f"items[{index}] peer")
        keep.append(b)
    _call(comm._api.HcclBatchSendRecv(c_items, len(items), handle, st._ptr_cdata), "HcclBatchSendRecv", st, keep)


def barrier(comm: CommCore, *, stream: Optional[Stream] = None) -> None:
    """Queue a barrier: work after it on ``stream`` starts once every rank has reached it."""
    handle = _comm_handle(comm)
    _call(comm._api.HcclBarrier(handle, _stream(comm, stream)._ptr_cdata), "HcclBarrier")


_group = threading.local()


def group_active() -> bool:
    """True inside ``with hcclpy.group():`` on the calling thread; False otherwise."""
    return getattr(_group, "depth", 0) > 0


def after_group(callback: Callable[[bool], None]) -> None:
    """Call ``callback(succeeded)`` once the calling thread's outermost group has ended."""
    _group.pending.append(callback)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Hold the HCCL calls of the block and release them together (``HcclGroupStart/End``).

    Sends and receives inside one group cannot deadlock each other; one thread can drive the
    communicators of several devices. The block's calls are released even if it raises.

    Examples
    --------
    >>> with hcclpy.group():
    ...     comm.send(x, peer=1)
    ...     comm.recv(y, peer=1)
    """
    bound = _ffi.api()
    _call(bound.HcclGroupStart(), "HcclGroupStart")
    if not group_active():
        _group.pending = []
    _group.depth = getattr(_group, "depth", 0) + 1
    try:
        yield
    finally:
        _group.depth -= 1
        rc = bound.HcclGroupEnd()
        if _group.depth == 0:
            pending, _group.pending = _group.pending, []
            for callback in pending:
                callback(rc == 0)
        _call(rc, "HcclGroupEnd")

