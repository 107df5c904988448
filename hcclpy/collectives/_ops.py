"""Every HCCL operation, defined once.

Each operation is one private definition — ``_all_reduce``, ``_broadcast``... — that reads top to
bottom: parse the buffers (:func:`._buffers.parse`), check them with the shared rules
(:mod:`._rules`), and build the :class:`._calls.Call` of its one C function. Every path runs that
definition: the public function queues it now (:func:`._calls.launch`: on device buffers, on a
stream; on NumPy arrays, staged through device memory), its ``*_init`` twin keeps it as a
:class:`._calls.PersistentOp`, and the torch backend calls the public functions.

One meaning on every path:

* buffers come first, then ``op`` / ``root`` / ``peer``, then the keyword-only ``stream``;
* an omitted output is in place where the operation has an in-place form (all_reduce, reduce on
  the root, broadcast): the input is overwritten and returned; elsewhere a new buffer like the
  input is returned (a NumPy array for NumPy input, a :class:`DeviceArray` for one); ``out=`` is
  another name for the output;
* bad arguments raise ``ValueError`` / ``TypeError`` naming the argument, the value and what is
  allowed, before any C call;
* device operations return once queued (results are defined once the stream is synchronised, and
  reading a written :class:`DeviceArray` back waits for them); operations on NumPy arrays return
  once the result is in the array.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, overload

import numpy as np

from .. import _ffi
from .._comm_core import CommCore
from ..runtime import Stream, empty
from ..types import OpLike
from . import _group
from . import _rules as rules
from ._buffers import MAX_COUNT, Buffer, BufferLike, BufferT, parse
from ._calls import READ, WRITE, Call, PersistentOp, call, launch, stream_of

if TYPE_CHECKING:
    from ..communicator import Communicator

__all__ = [
    "all_gather", "all_gather_v", "all_reduce", "all_to_all", "all_to_all_v", "all_to_all_vc", "barrier",
    "batch_send_recv", "broadcast", "recv", "reduce", "reduce_scatter", "reduce_scatter_v", "scatter", "send",
]

_NULL = _ffi.NULL
# The role of an uneven operation's recv: it writes its blocks only, so staged, recv is copied in
# too and the elements outside the blocks keep their values (as on device buffers).
_UNEVEN = READ | WRITE
_LARGE_RESULT = 1 << 30  # bytes: a new output this large is checked against the device's memory first


# ------------------------------------------------------------------------------ shared steps

def _handle(comm: Any) -> Any:
    """The live ``HcclComm`` of ``comm``."""
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    handle = comm._handle
    if handle is None or comm._aborted:
        comm._refuse_use()
    return handle


def _output(recv: Any, out: Any) -> Any:
    """The output, passed as ``recv`` or as ``out=`` (not both)."""
    if recv is not None:
        raise TypeError("the output is given twice (as recv and as out=); pass it once")
    return out


def _new(comm: CommCore, like: Buffer, shape: Tuple[int, ...], operation: str, zeroed: bool = False) -> Any:
    """A new output for an omitted ``recv``, of the kind and dtype of ``like``: a NumPy array for
    NumPy input, a DeviceArray on the communicator's device for one (``zeroed``: the elements the
    operation skips read as 0)."""
    nbytes = int(np.prod(shape, dtype=object)) * like.itemsize * like.scale
    if nbytes > _LARGE_RESULT and nbytes > comm._device.memory_info()[1]:  # staged there, or allocated there
        raise ValueError(f"{operation}'s recv would hold {nbytes} bytes, more than device {comm._device_id} holds: "
                         "check the counts")
    if like.host:
        return (np.zeros if zeroed else np.empty)(shape, like.source.dtype)
    if like._alloc is not None:
        array = empty(shape, like.dtype, device=comm._device)
        if zeroed:
            array.fill_zero()
        return array
    raise TypeError(f"{operation} needs recv: hcclpy makes outputs for DeviceArray and numpy.ndarray input, not for "
                    f"a {type(like.keep).__name__}")


def _split(like: Buffer, size: int) -> Tuple[int, ...]:
    """The shape of one of ``size`` blocks of ``like``: its first axis split, or flat."""
    shape = like.shape
    if shape and shape[0] % size == 0:
        return (shape[0] // size,) + shape[1:]
    return (like.count // like.scale // size,)


def _writable(buf: Buffer, argument: str, operation: str) -> None:
    """Refuse an output the result cannot be written to (device buffers always can)."""
    if not buf.writable:
        flags, dtype = buf.keep.flags, buf.keep.dtype
        why = ("read-only" if not flags.writeable else "not C-contiguous" if not flags.c_contiguous
               else f"in the other byte order ({dtype.str!r})")
        raise ValueError(f"{argument} is {why}, but {operation} writes its result there: pass a writable, "
                         "C-contiguous NumPy array in this machine's byte order (np.ascontiguousarray(...) makes "
                         "one), or a device buffer")


def _reduces(comm: CommCore, operation: str, buf: Buffer, code: int) -> None:
    """Refuse what cannot reduce ``buf`` (``send``) with op ``code`` right: NumPy dtypes that
    travel as bytes, complex numbers with other than sum, the simulator's product profile,
    misaligned device memory."""
    if buf.ops is not None and code not in buf.ops:
        if not buf.ops:
            raise TypeError(f"{operation} cannot reduce {buf.kind} arrays, which travel as bytes: the dtypes that "
                            "reduce are int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, "
                            "float64 and bfloat16 (HCCL's types), and complex64 and complex128 with sum")
        raise ValueError(f"{operation} with op={rules.reduce_op_name(code)} is not supported on {buf.kind} arrays: "
                         "complex arrays reduce with sum only")
    if comm._profile is not None:
        comm._profile.check(operation, buf.dtype, code)
    if buf._alloc is None and not buf.host:  # (a DeviceArray is always aligned: its views start at elements)
        rules.aligned(buf, "send")


# ------------------------------------------------------------------------------ reductions

def _all_reduce(comm: CommCore, send: Any, recv: Any, op: Any) -> Call:
    handle = _handle(comm)
    code = rules.OP_NAMES.get(op) if type(op) is str else None  # the common call: an op by name
    if code is None:
        code = rules.reduce_op(op)
    sb = parse(send, "send")
    if recv is None or recv is send:  # in place
        recv, rb = send, sb
        rules.on_device(comm, sb, "send")
    else:
        rb = parse(recv, "recv")
        rules.twins(comm, sb, rb, "all_reduce")
    if sb.ops is not None or comm._profile is not None or sb._alloc is None:  # else nothing to refuse
        _reduces(comm, "all_reduce", sb, code)
    if not rb.writable:
        _writable(rb, "send" if rb is sb else "recv", "all_reduce")
    return call(comm, "HcclAllReduce", (sb.ptr, rb.ptr, sb.count, sb.dtype_c, code, handle), (sb, rb),
                (READ, WRITE), sb.count, sb.dtype_c, code, recv)


def _reduce(comm: CommCore, send: Any, recv: Any, op: Any, root: Any) -> Call:
    handle = _handle(comm)
    code = rules.OP_NAMES.get(op) if type(op) is str else None  # the common call: an op by name
    if code is None:
        code = rules.reduce_op(op)
    root = rules.rank(comm, root, "root")
    sb = parse(send, "send")
    if root != comm._rank:  # recv is the root's alone
        rules.on_device(comm, sb, "send")
        _reduces(comm, "reduce", sb, code)
        return call(comm, "HcclReduce", (sb.ptr, _NULL, sb.count, sb.dtype_c, code, root, handle), (sb,), (READ,),
                    sb.count, sb.dtype_c, (code, root), None)
    if recv is None or recv is send:  # in place
        recv, rb = send, sb
        rules.on_device(comm, sb, "send")
    else:
        rb = parse(recv, "recv")
        rules.twins(comm, sb, rb, "reduce")
        if rb._alloc is None and not rb.host:
            rules.aligned(rb, "recv")
    _reduces(comm, "reduce", sb, code)
    if not rb.writable:
        _writable(rb, "send" if rb is sb else "recv", "reduce")
    return call(comm, "HcclReduce", (sb.ptr, rb.ptr, sb.count, sb.dtype_c, code, root, handle), (sb, rb),
                (READ, WRITE), sb.count, sb.dtype_c, (code, root), recv)


def _reduce_scatter(comm: CommCore, send: Any, recv: Any, op: Any) -> Call:
    handle = _handle(comm)
    code = rules.OP_NAMES.get(op) if type(op) is str else None  # the common call: an op by name
    if code is None:
        code = rules.reduce_op(op)
    sb = parse(send, "send")
    size = comm._size
    if recv is None:
        rules.divides(sb, size, "reduce_scatter")
        recv = _new(comm, sb, _split(sb, size), "reduce_scatter")
    rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if sb.count != rb.count * size:
        raise ValueError(f"send must hold recv's count * size = {rb.count // rb.scale} * {size} = "
                         f"{rb.count // rb.scale * size} elements, it holds {sb.count // sb.scale}")
    _reduces(comm, "reduce_scatter", sb, code)
    if rb._alloc is None and not rb.host:
        rules.aligned(rb, "recv")
    if rules.block_of(sb, rb, comm._rank) is None:
        raise ValueError("recv overlaps send; in place, recv must be exactly this rank's block of send")
    if not rb.writable:
        _writable(rb, "recv", "reduce_scatter")
    return call(comm, "HcclReduceScatter", (sb.ptr, rb.ptr, rb.count, rb.dtype_c, code, handle), (sb, rb),
                (READ, WRITE), rb.count, rb.dtype_c, code, recv)


def _reduce_scatter_v(comm: CommCore, send: Any, recv: Any, send_counts: Any, send_displs: Any, op: Any) -> Call:
    handle = _handle(comm)
    code = rules.OP_NAMES.get(op) if type(op) is str else None  # the common call: an op by name
    if code is None:
        code = rules.reduce_op(op)
    sb = parse(send, "send")
    rb = None if recv is None else parse(recv, "recv")
    if send_counts is None:
        raise TypeError("reduce_scatter_v needs send_counts")
    blocks = rules.layout(comm, send_counts, send_displs, "send_counts", "send_displs", sb.scale)
    rules.fits(sb, blocks, "send")
    mine = blocks.counts[comm._rank]
    if rb is None:
        recv = _new(comm, sb, (mine // sb.scale,), "reduce_scatter_v")
        rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if rb.count < mine:
        raise ValueError(f"recv holds {rb.count // rb.scale} elements but send_counts[{comm._rank}] = "
                         f"{mine // sb.scale}")
    _reduces(comm, "reduce_scatter_v", sb, code)
    if rb._alloc is None and not rb.host:
        rules.aligned(rb, "recv")
    rules.disjoint(sb, rb, "reduce_scatter_v")
    if not rb.writable:
        _writable(rb, "recv", "reduce_scatter_v")
    return call(comm, "HcclReduceScatterV", (sb.ptr, blocks.c_counts, blocks.c_displs, rb.ptr, mine, sb.dtype_c,
                                             code, handle),
                (sb, rb), (READ, _UNEVEN), mine, sb.dtype_c, code, recv)


# ---------------------------------------------------------------------------- data motion

def _broadcast(comm: CommCore, buf: Any, root: Any) -> Call:
    handle = _handle(comm)
    root = rules.rank(comm, root, "root")
    b = parse(buf, "buf")
    rules.on_device(comm, b, "buf")
    if comm._profile is not None:
        comm._profile.check("broadcast", b.dtype)
    if root != comm._rank and not b.writable:
        _writable(b, "buf", "broadcast")
    return call(comm, "HcclBroadcast", (b.ptr, b.count, b.dtype_c, root, handle), (b,),
                (READ if root == comm._rank else WRITE,), b.count, b.dtype_c, root, buf)


def _all_gather(comm: CommCore, send: Any, recv: Any) -> Call:
    handle = _handle(comm)
    sb = parse(send, "send")
    size = comm._size
    if recv is None:
        recv = _new(comm, sb, (size,) + sb.shape, "all_gather")
    rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if rb.count != sb.count * size:
        raise ValueError(f"recv must hold send's count * size = {sb.count // sb.scale} * {size} = "
                         f"{sb.count // sb.scale * size} elements, it holds {rb.count // rb.scale}")
    if comm._profile is not None:
        comm._profile.check("all_gather", sb.dtype)
    if rules.block_of(rb, sb, comm._rank) is None:
        raise ValueError("send overlaps recv; in place, send must be exactly this rank's block of recv")
    if not rb.writable:
        _writable(rb, "recv", "all_gather")
    return call(comm, "HcclAllGather", (sb.ptr, rb.ptr, sb.count, sb.dtype_c, handle), (sb, rb), (READ, WRITE),
                sb.count, sb.dtype_c, -1, recv)


def _all_gather_v(comm: CommCore, send: Any, recv: Any, recv_counts: Any, recv_displs: Any) -> Call:
    handle = _handle(comm)
    sb = parse(send, "send")
    rb = None if recv is None else parse(recv, "recv")
    if recv_counts is None:
        raise TypeError("all_gather_v needs recv_counts")
    blocks = rules.layout(comm, recv_counts, recv_displs, "recv_counts", "recv_displs", sb.scale)
    if blocks.counts[comm._rank] != sb.count:
        raise ValueError(f"recv_counts[{comm._rank}] = {blocks.counts[comm._rank] // sb.scale} must equal this rank's "
                         f"send count {sb.count // sb.scale}")
    if rb is None:  # the elements between blocks read as 0
        recv = _new(comm, sb, (blocks.end // sb.scale,), "all_gather_v", recv_displs is not None)
        rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    rules.fits(rb, blocks, "recv")
    if comm._profile is not None:
        comm._profile.check("all_gather_v", sb.dtype)
    rules.disjoint(sb, rb, "all_gather_v")
    if not rb.writable:
        _writable(rb, "recv", "all_gather_v")
    return call(comm, "HcclAllGatherV", (sb.ptr, sb.count, rb.ptr, blocks.c_counts, blocks.c_displs, sb.dtype_c,
                                         handle),
                (sb, rb), (READ, _UNEVEN), sb.count, sb.dtype_c, -1, recv)


def _scatter(comm: CommCore, send: Any, recv: Any, root: Any) -> Call:
    handle = _handle(comm)
    root = rules.rank(comm, root, "root")
    size = comm._size
    if root != comm._rank:  # send is the root's alone: another rank's only says what recv is like
        if recv is None:
            if send is None:
                raise TypeError("scatter needs recv on ranks other than the root: a buffer for this rank's block "
                                "(or send, a buffer like the root's, to make one like its blocks)")
            like = parse(send, "send")
            recv = _new(comm, like, _split(like, size), "scatter")
        rb = parse(recv, "recv")
        rules.on_device(comm, rb, "recv")
        if rb.count * size > MAX_COUNT:
            raise ValueError(f"the root's send would hold recv's {rb.count} elements times {size} ranks, more than "
                             f"HCCL's largest supported count 0x{MAX_COUNT:X} ({MAX_COUNT}) per call")
        if comm._profile is not None:
            comm._profile.check("scatter", rb.dtype)
        if not rb.writable:
            _writable(rb, "recv", "scatter")
        return call(comm, "HcclScatter", (_NULL, rb.ptr, rb.count, rb.dtype_c, root, handle), (rb,), (WRITE,),
                    rb.count, rb.dtype_c, root, recv)
    if send is None:
        raise ValueError("send must be a buffer on the root rank")
    sb = parse(send, "send")
    if recv is None:
        rules.divides(sb, size, "scatter")
        recv = _new(comm, sb, _split(sb, size), "scatter")
    rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if sb.count != rb.count * size:
        raise ValueError(f"send must hold recv's count * size = {rb.count // rb.scale * size} elements, it holds "
                         f"{sb.count // sb.scale}")
    if comm._profile is not None:
        comm._profile.check("scatter", rb.dtype)
    if rules.block_of(sb, rb, root) is None:
        raise ValueError("recv overlaps send; in place, recv must be exactly the root's block of send")
    if not rb.writable:
        _writable(rb, "recv", "scatter")
    return call(comm, "HcclScatter", (sb.ptr, rb.ptr, rb.count, rb.dtype_c, root, handle), (sb, rb), (READ, WRITE),
                rb.count, rb.dtype_c, root, recv)


def _all_to_all(comm: CommCore, send: Any, recv: Any) -> Call:
    handle = _handle(comm)
    sb = parse(send, "send")
    size = comm._size
    if recv is None:
        recv = _new(comm, sb, sb.shape, "all_to_all")
    rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if sb.count != rb.count or sb.count % (size * sb.scale):
        raise ValueError(f"send and recv must hold the same number of elements, a multiple of size {size}; got "
                         f"{sb.count // sb.scale} and {rb.count // rb.scale}")
    if comm._profile is not None:
        comm._profile.check("all_to_all", sb.dtype)
    rules.disjoint(sb, rb, "all_to_all")
    if not rb.writable:
        _writable(rb, "recv", "all_to_all")
    n = sb.count // size
    return call(comm, "HcclAlltoAll", (sb.ptr, n, sb.dtype_c, rb.ptr, n, rb.dtype_c, handle), (sb, rb), (READ, WRITE),
                n, sb.dtype_c, -1, recv)


def _all_to_all_v(comm: CommCore, send: Any, recv: Any, send_counts: Any, recv_counts: Any, send_displs: Any,
                  recv_displs: Any) -> Call:
    handle = _handle(comm)
    sb = parse(send, "send")
    rb = None if recv is None else parse(recv, "recv")
    if send_counts is None or recv_counts is None:
        raise TypeError("all_to_all_v needs send_counts and recv_counts")
    sent = rules.layout(comm, send_counts, send_displs, "send_counts", "send_displs", sb.scale)
    received = rules.layout(comm, recv_counts, recv_displs, "recv_counts", "recv_displs", sb.scale)
    rules.fits(sb, sent, "send")
    if rb is None:  # the elements between blocks read as 0
        recv = _new(comm, sb, (received.end // sb.scale,), "all_to_all_v", recv_displs is not None)
        rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    rules.fits(rb, received, "recv")
    if comm._profile is not None:
        comm._profile.check("all_to_all_v", sb.dtype)
    rules.disjoint(sb, rb, "all_to_all_v")
    if not rb.writable:
        _writable(rb, "recv", "all_to_all_v")
    return call(comm, "HcclAlltoAllV", (sb.ptr, sent.c_counts, sent.c_displs, sb.dtype_c, rb.ptr,
                                        received.c_counts, received.c_displs, rb.dtype_c, handle),
                (sb, rb), (READ, _UNEVEN), sent.total, sb.dtype_c, -1, recv)


def _all_to_all_vc(comm: CommCore, send: Any, recv: Any, send_count_matrix: Any) -> Call:
    handle = _handle(comm)
    sb = parse(send, "send")
    rb = None if recv is None else parse(recv, "recv")
    if send_count_matrix is None:
        raise TypeError("all_to_all_vc needs send_count_matrix")
    counts = rules.matrix(comm, send_count_matrix, sb.scale)
    if counts.sent > sb.count:
        raise ValueError(f"send holds {sb.count // sb.scale} elements but row {comm._rank} of send_count_matrix "
                         f"sends {counts.sent // sb.scale}")
    if rb is None:
        recv = _new(comm, sb, (counts.received // sb.scale,), "all_to_all_vc")
        rb = parse(recv, "recv")
    rules.pair(comm, sb, rb)
    if counts.received > rb.count:
        raise ValueError(f"recv holds {rb.count // rb.scale} elements but column {comm._rank} of send_count_matrix "
                         f"delivers {counts.received // sb.scale}")
    if comm._profile is not None:
        comm._profile.check("all_to_all_vc", sb.dtype)
    rules.disjoint(sb, rb, "all_to_all_vc")
    if not rb.writable:
        _writable(rb, "recv", "all_to_all_vc")
    return call(comm, "HcclAlltoAllVC", (sb.ptr, counts.c_flat, sb.dtype_c, rb.ptr, rb.dtype_c, handle), (sb, rb),
                (READ, _UNEVEN), counts.sent, sb.dtype_c, -1, recv)


# ---------------------------------------------------------------------------- point to point

def _send(comm: CommCore, buf: Any, peer: Any) -> Call:
    handle = _handle(comm)
    b = parse(buf, "buf")
    rules.on_device(comm, b, "buf")
    if comm._profile is not None:  # before the peer, as HCCL checks
        comm._profile.check("send", b.dtype)
    peer = rules.peer(comm, peer)
    return call(comm, "HcclSend", (b.ptr, b.count, b.dtype_c, peer, handle), (b,), (READ,), b.count, b.dtype_c, peer,
                None, p2p=True)


def _recv(comm: CommCore, buf: Any, peer: Any) -> Call:
    handle = _handle(comm)
    b = parse(buf, "buf")
    rules.on_device(comm, b, "buf")
    if comm._profile is not None:
        comm._profile.check("recv", b.dtype)
    peer = rules.peer(comm, peer)
    if not b.writable:
        _writable(b, "buf", "recv")
    return call(comm, "HcclRecv", (b.ptr, b.count, b.dtype_c, peer, handle), (b,), (WRITE,), b.count, b.dtype_c, peer,
                buf, p2p=True)


_KINDS = {"send": 0, "recv": 1}
# The names of the first items' buffers, made once: formatting one at every call costs more than
# the rest of the item's checks. Later items' names are made when needed.
_ITEM_BUFFERS = tuple(f"items[{index}] buffer" for index in range(64))


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


def _pairs_to_itself(comm: CommCore, rows: Sequence[tuple], buffers: Sequence[Buffer]) -> None:
    """Refuse items whose peer is the rank itself unless they pair up as HCCL pairs them: the k-th
    send to the rank itself with its k-th receive from itself, in item order, each pair of one
    dtype and count (HCCL copies the one into the other). ``rows`` are the C items."""
    me = comm._rank
    sends = [index for index, row in enumerate(rows) if row[4] == me and row[0] == 0]
    recvs = [index for index, row in enumerate(rows) if row[4] == me and row[0] == 1]
    for s, r in zip(sends, recvs):
        sent, received = buffers[s], buffers[r]
        rules.same_dtype(sent, received, f"items[{s}] (a send to this rank itself, rank {me})",
                         f"items[{r}] (the receive from itself it pairs with)")
        if sent.count != received.count:
            raise ValueError(f"items[{s}] sends {sent.count // sent.scale} elements to this rank itself (rank {me}), "
                             f"but items[{r}], the receive from itself it pairs with, holds "
                             f"{received.count // received.scale}: the k-th send to the rank itself is copied into "
                             "its k-th receive from itself (in item order), so the two must have the same count")
    if len(sends) != len(recvs):
        more, fewer = (sends, recvs) if len(sends) > len(recvs) else (recvs, sends)
        what, other = ("send to", "receive from") if more is sends else ("receive from", "send to")
        raise ValueError(f"items[{more[len(fewer)]}] is a {what} this rank itself (rank {me}) with no matching "
                         f"{other} itself: the batch has {len(sends)} send{'s' * (len(sends) != 1)} to the rank "
                         f"itself and {len(recvs)} receive{'s' * (len(recvs) != 1)} from itself, and the k-th send "
                         "to the rank itself is copied into its k-th receive from itself (in item order)")


def _batch_send_recv(comm: CommCore, items: Any) -> Call:
    handle = _handle(comm)
    if _group.active():
        raise RuntimeError("batch_send_recv cannot run inside hcclpy.group(): HCCL refuses HcclBatchSendRecv "
                           "between HcclGroupStart and HcclGroupEnd. In the group, make each transfer a send() or "
                           "recv() (the group keeps them from deadlocking), or make this call outside it")
    if type(items) is not list and type(items) is not tuple:
        try:
            items = list(items)
        except TypeError:
            raise TypeError(f"items must be a sequence of ('send' | 'recv', buffer, peer), got {items!r}") from None
    size, device, profile = comm._size, comm._device_id, comm._profile
    buffers: List[Buffer] = []
    roles: List[int] = []
    rows = []
    hosts = 0  # how many buffers are NumPy arrays
    for index, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 3 or type(item[0]) is not str or item[0] not in _KINDS:
            raise ValueError(f"items[{index}] must be ('send' | 'recv', buffer, peer), got {item!r}")
        kind, buf, peer = item
        argument = _ITEM_BUFFERS[index] if index < 64 else f"items[{index}] buffer"
        b = parse(buf, argument)
        if b.device != device and b.device is not None or b.count > MAX_COUNT:
            rules.on_device(comm, b, argument)
        if profile is not None:
            profile.check("batch_send_recv", b.dtype)
        # Any rank, this one included: HCCL copies a send to the rank itself into a receive from it.
        if type(peer) is not int or not 0 <= peer < size:
            peer = rules.rank(comm, peer, f"items[{index}] peer")
        code = _KINDS[kind]
        if code:
            if not b.writable:
                _writable(b, argument, "batch_send_recv")
            roles.append(WRITE)
        else:
            roles.append(READ)
        hosts += b.host
        buffers.append(b)
        rows.append((code, b.ptr, b.count, b.dtype_c, peer))
    if hosts:  # NumPy arrays' pointers are new at every call, and would keep the arrays alive in the cache
        if hosts != len(buffers):
            raise TypeError("batch_send_recv mixes NumPy arrays with device buffers: pass NumPy arrays for every "
                            "item (they are staged through the device), or device buffers for every one")
        _receives_apart([(b.address, b.address + b.count * b.itemsize, role == WRITE)
                         for b, role in zip(buffers, roles)])
        _pairs_to_itself(comm, rows, buffers)
        c_items = _ffi.new("HcclSendRecvItem[]", rows)
    else:
        # The rows decide both rules below (addresses, counts, dtypes, kinds, peers; and the rank,
        # for the items to itself): a batch found in the cache has passed them.
        key = ("items", comm._rank, tuple(rows))
        c_items = rules.known(key)
        if c_items is None:
            _receives_apart([(b.address, b.address + b.count * b.itemsize, role == WRITE)
                             for b, role in zip(buffers, roles)])
            _pairs_to_itself(comm, rows, buffers)
            c_items = rules.remember(key, _ffi.new("HcclSendRecvItem[]", rows or 1))
    return call(comm, "HcclBatchSendRecv", (c_items, len(rows), handle), tuple(buffers), tuple(roles), len(rows), -1,
                -1, None, p2p=True)


def _barrier(comm: CommCore) -> Call:
    return call(comm, "HcclBarrier", (_handle(comm),), (), (), 0, -1, -1, None)


# ------------------------------------------------------------------------- the public calls
# Each queues its definition now; its ``*_init`` twin keeps it as a PersistentOp. The
# Communicator methods of the same names are these functions. The implementations' annotations
# are what the reference shows; the overloads are what type checkers read.

@overload
def all_reduce(comm: Communicator, send: BufferT, recv: None = None, op: OpLike = ..., *,
               stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def all_reduce(comm: Communicator, send: BufferLike, recv: BufferT, op: OpLike = ..., *,
               stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def all_reduce(comm: Communicator, send: BufferLike, recv: None = None, op: OpLike = ..., *,
               stream: Optional[Stream] = ..., out: BufferT) -> BufferT: ...
def all_reduce(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum", *,
               stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """Reduce ``send`` across all ranks into ``recv`` on every rank (``recv=None``: in place).

    Parameters
    ----------
    comm
        The communicator.
    send
        The input: a device buffer or a NumPy array (see :data:`~hcclpy.BufferLike`).
    recv
        The output: the same dtype and element count as ``send``. None: in place, ``send``
        receives the result.
    op
        A :class:`~hcclpy.ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output: ``recv``, or ``send`` when in place.

    Raises
    ------
    TypeError
        For an argument of the wrong type, before any C call.
    ValueError
        For an argument of the wrong value (sizes that differ, an unknown op...), before any C
        call.
    HcclError
        If HCCL refuses the call.

    Examples
    --------
    >>> comm.all_reduce(x, y, "sum", stream=s); s.synchronize()
    >>> comm.all_reduce(np.ones(4))          # NumPy: in place, returns once done
    array([2., 2., 2., 2.])
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_reduce(comm, send, recv, op), stream)


@overload
def reduce(comm: Communicator, send: BufferT, recv: None = None, op: OpLike = ..., root: int = ..., *,
           stream: Optional[Stream] = ..., out: None = ...) -> Optional[BufferT]: ...
@overload
def reduce(comm: Communicator, send: BufferLike, recv: BufferT, op: OpLike = ..., root: int = ..., *,
           stream: Optional[Stream] = ..., out: None = ...) -> Optional[BufferT]: ...
def reduce(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum", root: int = 0,
           *, stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> Optional[BufferLike]:
    """Reduce ``send`` across all ranks into ``recv`` on ``root`` only (``recv=None``: in place).

    Parameters
    ----------
    comm
        The communicator.
    send
        The input (see :data:`~hcclpy.BufferLike`).
    recv
        The output on the root: the same dtype and element count as ``send``. None: in place.
        Ignored on the other ranks.
    op
        A :class:`~hcclpy.ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``.
    root
        The rank that receives the result.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike or None
        The output on the root (``recv``, or ``send`` when in place), None on the other ranks.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_reduce(comm, send, recv, op, root), stream)


@overload
def reduce_scatter(comm: Communicator, send: BufferT, recv: None = None, op: OpLike = ..., *,
                   stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def reduce_scatter(comm: Communicator, send: BufferLike, recv: BufferT, op: OpLike = ..., *,
                   stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
def reduce_scatter(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum", *,
                   stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """Reduce ``send`` across ranks; rank ``r`` receives block ``r`` of the result.

    Parameters
    ----------
    comm
        The communicator.
    send
        The input: ``size * n`` elements, ``size`` blocks of ``n``.
    recv
        The output: ``n`` elements of ``send``'s dtype. None: a new buffer, the first axis of
        ``send`` split in ``size`` (a flat one when it does not divide). In place: ``recv`` is
        this rank's block of ``send``.
    op
        A :class:`~hcclpy.ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_reduce_scatter(comm, send, recv, op), stream)


@overload
def reduce_scatter_v(comm: Communicator, send: BufferT, recv: None = None,
                     send_counts: Optional[Sequence[int]] = ..., send_displs: Optional[Sequence[int]] = ...,
                     op: OpLike = ..., *, stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def reduce_scatter_v(comm: Communicator, send: BufferLike, recv: BufferT,
                     send_counts: Optional[Sequence[int]] = ..., send_displs: Optional[Sequence[int]] = ...,
                     op: OpLike = ..., *, stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def reduce_scatter_v(comm: Communicator, send: BufferLike, recv: None = None,
                     send_counts: Optional[Sequence[int]] = ..., send_displs: Optional[Sequence[int]] = ...,
                     op: OpLike = ..., *, stream: Optional[Stream] = ..., out: BufferT) -> BufferT: ...
def reduce_scatter_v(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                     send_counts: Optional[Sequence[int]] = None, send_displs: Optional[Sequence[int]] = None,
                     op: OpLike = "sum", *, stream: Optional[Stream] = None,
                     out: Optional[BufferLike] = None) -> BufferLike:
    """Reduce-scatter with uneven blocks: rank ``r`` receives the reduction of every rank's
    ``send[send_displs[r] : send_displs[r] + send_counts[r]]``.

    Parameters
    ----------
    comm
        The communicator.
    send
        The input, holding every rank's block.
    recv
        The output: at least ``send_counts[rank]`` elements. None: a new 1-D buffer of that
        many. It must not overlap ``send``.
    send_counts
        Elements of each rank's block, one count per rank (required; pass it by name).
    send_displs
        Where each block starts in ``send``, in elements. None: the blocks are packed in rank
        order.
    op
        A :class:`~hcclpy.ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.

    Examples
    --------
    >>> comm.reduce_scatter_v(np.ones(6), send_counts=[2, 4])   # on rank 1 of 2
    array([2., 2., 2., 2.])
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_reduce_scatter_v(comm, send, recv, send_counts, send_displs, op), stream)


def broadcast(comm: Communicator, buf: BufferT, root: int = 0, *, stream: Optional[Stream] = None) -> BufferT:
    """Copy ``buf`` of ``root`` into ``buf`` of every other rank (in place on every path).

    Parameters
    ----------
    comm
        The communicator.
    buf
        The data on the root; the buffer that receives it on the other ranks.
    root
        The rank whose ``buf`` is sent.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.

    Returns
    -------
    BufferT
        ``buf``.
    """
    return launch(_broadcast(comm, buf, root), stream)


@overload
def all_gather(comm: Communicator, send: BufferT, recv: None = None, *, stream: Optional[Stream] = ...,
               out: None = ...) -> BufferT: ...
@overload
def all_gather(comm: Communicator, send: BufferLike, recv: BufferT, *, stream: Optional[Stream] = ...,
               out: None = ...) -> BufferT: ...
def all_gather(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, *,
               stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """Gather every rank's ``send`` into ``recv`` on every rank, in rank order.

    Parameters
    ----------
    comm
        The communicator.
    send
        This rank's block: ``n`` elements.
    recv
        The output: ``size * n`` elements of ``send``'s dtype. None: a new buffer of shape
        ``(size, *send.shape)``. In place: ``send`` is this rank's block of ``recv``.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_gather(comm, send, recv), stream)


@overload
def all_gather_v(comm: Communicator, send: BufferT, recv: None = None, recv_counts: Optional[Sequence[int]] = ...,
                 recv_displs: Optional[Sequence[int]] = ..., *, stream: Optional[Stream] = ...,
                 out: None = ...) -> BufferT: ...
@overload
def all_gather_v(comm: Communicator, send: BufferLike, recv: BufferT, recv_counts: Optional[Sequence[int]] = ...,
                 recv_displs: Optional[Sequence[int]] = ..., *, stream: Optional[Stream] = ...,
                 out: None = ...) -> BufferT: ...
@overload
def all_gather_v(comm: Communicator, send: BufferLike, recv: None = None, recv_counts: Optional[Sequence[int]] = ...,
                 recv_displs: Optional[Sequence[int]] = ..., *, stream: Optional[Stream] = ...,
                 out: BufferT) -> BufferT: ...
def all_gather_v(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                 recv_counts: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None, *,
                 stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """All-gather with uneven blocks: rank ``r``'s ``send`` lands at ``recv[recv_displs[r]:]``.

    Parameters
    ----------
    comm
        The communicator.
    send
        This rank's block: ``recv_counts[rank]`` elements.
    recv
        The output, holding every rank's block; elements between blocks keep their values.
        None: a new 1-D buffer just large enough (elements between blocks read as 0). It must
        not overlap ``send``.
    recv_counts
        Elements of each rank's block, one count per rank (required; pass it by name).
    recv_displs
        Where each block lands in ``recv``, in elements. None: packed in rank order.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_gather_v(comm, send, recv, recv_counts, recv_displs), stream)


@overload
def scatter(comm: Communicator, send: BufferT, recv: None = None, root: int = ..., *,
            stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def scatter(comm: Communicator, send: Optional[BufferLike], recv: BufferT, root: int = ..., *,
            stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def scatter(comm: Communicator, send: Optional[BufferLike], recv: None = None, root: int = ..., *,
            stream: Optional[Stream] = ..., out: BufferT) -> BufferT: ...
def scatter(comm: Communicator, send: Optional[BufferLike], recv: Optional[BufferLike] = None, root: int = 0, *,
            stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """Rank ``r`` receives block ``r`` of the root's ``send``.

    Parameters
    ----------
    comm
        The communicator.
    send
        On the root, the data: ``size * n`` elements. Not read on the other ranks, which pass
        None (with ``recv``) or a buffer like the root's (to have ``recv`` made).
    recv
        The output: ``n`` elements. None: a new buffer like one block of ``send`` (its first
        axis split in ``size``, or flat). On the root, in place: ``recv`` is its block of ``send``.
    root
        The rank whose ``send`` is scattered.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_scatter(comm, send, recv, root), stream)


@overload
def all_to_all(comm: Communicator, send: BufferT, recv: None = None, *, stream: Optional[Stream] = ...,
               out: None = ...) -> BufferT: ...
@overload
def all_to_all(comm: Communicator, send: BufferLike, recv: BufferT, *, stream: Optional[Stream] = ...,
               out: None = ...) -> BufferT: ...
def all_to_all(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, *,
               stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """Rank ``r`` sends block ``j`` of ``send`` to rank ``j``, which stores it as block ``r`` of
    ``recv``.

    Parameters
    ----------
    comm
        The communicator.
    send
        The input: ``size * n`` elements, one block of ``n`` per rank.
    recv
        The output: as many elements as ``send``, of its dtype, not overlapping it. None: a new
        buffer of ``send``'s shape.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_to_all(comm, send, recv), stream)


@overload
def all_to_all_v(comm: Communicator, send: BufferT, recv: None = None, send_counts: Optional[Sequence[int]] = ...,
                 recv_counts: Optional[Sequence[int]] = ..., send_displs: Optional[Sequence[int]] = ...,
                 recv_displs: Optional[Sequence[int]] = ..., *, stream: Optional[Stream] = ...,
                 out: None = ...) -> BufferT: ...
@overload
def all_to_all_v(comm: Communicator, send: BufferLike, recv: BufferT, send_counts: Optional[Sequence[int]] = ...,
                 recv_counts: Optional[Sequence[int]] = ..., send_displs: Optional[Sequence[int]] = ...,
                 recv_displs: Optional[Sequence[int]] = ..., *, stream: Optional[Stream] = ...,
                 out: None = ...) -> BufferT: ...
def all_to_all_v(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                 send_counts: Optional[Sequence[int]] = None, recv_counts: Optional[Sequence[int]] = None,
                 send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None, *,
                 stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> BufferLike:
    """All-to-all with uneven blocks: ``send_counts[j]`` elements from ``send[send_displs[j]:]``
    go to rank ``j``; ``recv_counts[j]`` elements from rank ``j`` land at ``recv[recv_displs[j]:]``.

    Parameters
    ----------
    comm
        The communicator.
    send
        The input, holding the block for every rank.
    recv
        The output, holding the block from every rank, not overlapping ``send``. None: a new
        1-D buffer just large enough (elements between blocks read as 0).
    send_counts
        Elements sent to each rank (required; pass it by name).
    recv_counts
        Elements received from each rank (required; pass it by name).
    send_displs
        Where each rank's block starts in ``send``, in elements. None: packed in rank order.
    recv_displs
        Where each rank's block lands in ``recv``, in elements. None: packed in rank order.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_to_all_v(comm, send, recv, send_counts, recv_counts, send_displs, recv_displs),
                  stream)


@overload
def all_to_all_vc(comm: Communicator, send: BufferT, recv: None = None, send_count_matrix: Any = ..., *,
                  stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
@overload
def all_to_all_vc(comm: Communicator, send: BufferLike, recv: BufferT, send_count_matrix: Any = ..., *,
                  stream: Optional[Stream] = ..., out: None = ...) -> BufferT: ...
def all_to_all_vc(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                  send_count_matrix: Optional[Sequence[Sequence[int]]] = None, *, stream: Optional[Stream] = None,
                  out: Optional[BufferLike] = None) -> BufferLike:
    """All-to-all driven by one count matrix, the same on every rank.

    Parameters
    ----------
    comm
        The communicator.
    send
        The input: the blocks for ranks 0, 1, ... packed in rank order.
    recv
        The output: the blocks from ranks 0, 1, ... packed in rank order, not overlapping
        ``send``. None: a new 1-D buffer just large enough.
    send_count_matrix
        ``size`` rows of ``size`` counts: ``send_count_matrix[i][j]`` elements go from rank ``i``
        to rank ``j`` (required; pass it by name; a NumPy array works too).
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    out
        Another name for ``recv``; pass one of them.

    Returns
    -------
    BufferLike
        The output.
    """
    if out is not None:
        recv = _output(recv, out)
    return launch(_all_to_all_vc(comm, send, recv, send_count_matrix), stream)


def send(comm: Communicator, buf: BufferLike, peer: int, *, stream: Optional[Stream] = None) -> None:
    """Send ``buf`` to rank ``peer``, which must post a matching :func:`recv` (same count and dtype).

    Parameters
    ----------
    comm
        The communicator.
    buf
        The data to send.
    peer
        The receiving rank.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.
    """
    return launch(_send(comm, buf, peer), stream)


def recv(comm: Communicator, buf: BufferT, peer: int, *, stream: Optional[Stream] = None) -> BufferT:
    """Receive into ``buf`` from rank ``peer``, which must post a matching :func:`send`.

    Parameters
    ----------
    comm
        The communicator.
    buf
        The buffer that receives the data.
    peer
        The sending rank.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.

    Returns
    -------
    BufferT
        ``buf``.
    """
    return launch(_recv(comm, buf, peer), stream)


def batch_send_recv(comm: Communicator, items: Sequence[Tuple[str, BufferLike, int]], *,
                    stream: Optional[Stream] = None) -> None:
    """Post several sends and receives at once.

    Within one call the transfers do not wait for each other, so a ring exchange (send to the
    next rank, receive from the previous) cannot deadlock.

    A peer may be the calling rank itself, as in HCCL: the k-th send to the rank itself is
    copied into its k-th receive from itself (in item order), before the transfers with the
    peers. Such items must pair up: as many sends to itself as receives from itself, each pair
    of one count and dtype. This also works on a communicator of one rank. (:func:`send` and
    :func:`recv` still need another rank.)

    Parameters
    ----------
    comm
        The communicator.
    items
        ``("send" | "recv", buffer, peer)`` triples. A receive buffer must not share memory
        with any other item. The buffers are all device buffers or all NumPy arrays.
    stream
        The stream to queue on (device buffers only). None: the device's default stream.

    Raises
    ------
    ValueError
        For a malformed item, a peer that is not a rank of the communicator, a receive buffer
        that overlaps another item's, or items to the rank itself that do not pair up (one left
        over, or a pair of two counts).
    TypeError
        For a buffer that is none, a mix of NumPy arrays and device buffers, or a pair of items
        to the rank itself of two dtypes.
    RuntimeError
        Inside :func:`~hcclpy.group` (HCCL refuses a batch there).

    Examples
    --------
    >>> nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    >>> comm.batch_send_recv([("send", x, nxt), ("recv", y, prev)])
    >>> comm.batch_send_recv([("send", x, comm.rank), ("recv", y, comm.rank)])  # y = x, locally
    """
    return launch(_batch_send_recv(comm, items), stream)


def barrier(comm: Communicator, *, stream: Optional[Stream] = None) -> None:
    """Wait for every rank to reach the barrier.

    Parameters
    ----------
    comm
        The communicator.
    stream
        None: the call blocks; the barrier is queued on the default stream, which is then
        synchronised (so the work queued on it before is done too). A stream: the barrier is
        queued on it and the call returns at once; work queued after it on that stream starts
        once every rank has reached it.

    Raises
    ------
    RuntimeError
        Without ``stream``, inside :func:`~hcclpy.group` (whose calls only run once it ends).
    """
    if stream is None and _group.active():
        _handle(comm)
        raise RuntimeError("barrier() without a stream blocks until every rank has reached it, so it cannot be "
                           "used inside hcclpy.group(), whose calls run only when the group ends: pass stream=")
    c = _barrier(comm)
    launch(c, stream)
    if stream is None:
        stream_of(comm, None).synchronize()


# ------------------------------------------------------------------------ persistent twins

def all_reduce_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum", *,
                    stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_reduce`, checked once: each ``start()`` queues it (see :class:`~hcclpy.PersistentOp`).

    It takes the arguments of :func:`all_reduce`.
    """
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_reduce(comm, send, recv, op), stream)


def reduce_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum",
                root: int = 0, *, stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`reduce`, checked once: each ``start()`` queues it. It takes the arguments of :func:`reduce`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_reduce(comm, send, recv, op, root), stream)


def reduce_scatter_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, op: OpLike = "sum",
                        *, stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`reduce_scatter`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`reduce_scatter`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_reduce_scatter(comm, send, recv, op), stream)


def reduce_scatter_v_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                          send_counts: Optional[Sequence[int]] = None, send_displs: Optional[Sequence[int]] = None,
                          op: OpLike = "sum", *, stream: Optional[Stream] = None,
                          out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`reduce_scatter_v`, checked once: each ``start()`` queues it. It takes the arguments
    of :func:`reduce_scatter_v`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_reduce_scatter_v(comm, send, recv, send_counts, send_displs, op), stream)


def broadcast_init(comm: Communicator, buf: BufferLike, root: int = 0, *,
                   stream: Optional[Stream] = None) -> PersistentOp:
    """:func:`broadcast`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`broadcast`."""
    return PersistentOp(_broadcast(comm, buf, root), stream)


def all_gather_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, *,
                    stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_gather`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`all_gather`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_gather(comm, send, recv), stream)


def all_gather_v_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                      recv_counts: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None, *,
                      stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_gather_v`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`all_gather_v`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_gather_v(comm, send, recv, recv_counts, recv_displs), stream)


def scatter_init(comm: Communicator, send: Optional[BufferLike], recv: Optional[BufferLike] = None, root: int = 0, *,
                 stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`scatter`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`scatter`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_scatter(comm, send, recv, root), stream)


def all_to_all_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None, *,
                    stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_to_all`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`all_to_all`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_to_all(comm, send, recv), stream)


def all_to_all_v_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                      send_counts: Optional[Sequence[int]] = None, recv_counts: Optional[Sequence[int]] = None,
                      send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None, *,
                      stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_to_all_v`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`all_to_all_v`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_to_all_v(comm, send, recv, send_counts, recv_counts, send_displs,
                                      recv_displs), stream)


def all_to_all_vc_init(comm: Communicator, send: BufferLike, recv: Optional[BufferLike] = None,
                       send_count_matrix: Optional[Sequence[Sequence[int]]] = None, *,
                       stream: Optional[Stream] = None, out: Optional[BufferLike] = None) -> PersistentOp:
    """:func:`all_to_all_vc`, checked once: each ``start()`` queues it. It takes the arguments of
    :func:`all_to_all_vc`."""
    if out is not None:
        recv = _output(recv, out)
    return PersistentOp(_all_to_all_vc(comm, send, recv, send_count_matrix), stream)


def send_init(comm: Communicator, buf: BufferLike, peer: int, *, stream: Optional[Stream] = None) -> PersistentOp:
    """:func:`send`, checked once: each ``start()`` queues it. It takes the arguments of :func:`send`."""
    return PersistentOp(_send(comm, buf, peer), stream)


def recv_init(comm: Communicator, buf: BufferLike, peer: int, *, stream: Optional[Stream] = None) -> PersistentOp:
    """:func:`recv`, checked once: each ``start()`` queues it. It takes the arguments of :func:`recv`."""
    return PersistentOp(_recv(comm, buf, peer), stream)


def batch_send_recv_init(comm: Communicator, items: Sequence[Tuple[str, BufferLike, int]], *,
                         stream: Optional[Stream] = None) -> PersistentOp:
    """:func:`batch_send_recv`, checked once: each ``start()`` queues it. It takes the arguments
    of :func:`batch_send_recv`."""
    return PersistentOp(_batch_send_recv(comm, items), stream)


def barrier_init(comm: Communicator, *, stream: Optional[Stream] = None) -> PersistentOp:
    """A barrier queued by each ``start()``, on a stream: it does not block (see :func:`barrier`)."""
    return PersistentOp(_barrier(comm), stream)
