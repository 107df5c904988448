"""Host memory given by address, staged through the device for the operations.

The operations take NumPy arrays themselves (:mod:`hcclpy.collectives` stages them). This
module serves adapters that hold host memory of another kind (the torch backend's CPU
tensors): the same staging, with memory given as integer addresses, around a ``run(send,
recv, stream)`` callable that queues one operation on device buffers. The caller keeps the
memory alive and sized right. :func:`release` gives a communicator's staging memory back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import collectives
from ._comm_core import CommCore
from .collectives import _staging
from .runtime import DeviceArray, Stream
from .runtime._memory import copy_bytes
from .types import DataType, as_datatype

if TYPE_CHECKING:
    from .communicator import Communicator

__all__ = ["barrier", "release", "staged", "staged_batch", "staged_elementwise"]

release = _staging.release

Pieces = Union[None, int, Sequence[Tuple[int, int]]]
"""Host memory as an address, a list of ``(address, nbytes)`` pieces laid back to back, or None."""
_H2D, _D2H = 1, 2  # aclrtMemcpyKind


def _element_count(value: Any, argument: str) -> int:
    """``value``, a number of elements, as an int (NumPy ints too): the memory it sizes is the
    caller's, so a negative count would stage a view of garbage size."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{argument}={value!r} must be an int >= 0 (a number of elements)")
    return int(value)


def _copy_pieces(device: DeviceArray, pieces: Pieces, kind: int) -> None:
    """Copy between ``device`` and host memory given as one address or back-to-back pieces."""
    if pieces is None:
        return
    if isinstance(pieces, int):
        pieces = [(pieces, device.nbytes)]
    at = device.ptr
    for address, nbytes in pieces:
        if kind == _H2D:
            copy_bytes(at, address, nbytes, kind)
        else:
            copy_bytes(address, at, nbytes, kind)
        at += nbytes


def _run(comm: CommCore, slots: List[Tuple[int, DataType, Pieces, Pieces]],
         queue: Callable[[List[DeviceArray], Stream], Any]) -> None:
    """Stage: a scratch buffer per ``(count, dtype, source, result)`` slot, copied in from
    ``source``, ``queue(buffers, stream)``, wait, copied out to ``result`` (either may be None)."""
    if not isinstance(comm, CommCore):
        raise TypeError(f"comm must be an hcclpy.Communicator, got {type(comm).__name__}")
    staging = _staging.acquire(comm)
    try:
        buffers = [staging.buffer(f"buffer{i}", count, dtype) for i, (count, dtype, _, _) in enumerate(slots)]
        for buf, (_, _, source, _) in zip(buffers, slots):
            _copy_pieces(buf, source, _H2D)
        queue(buffers, staging.stream)
        staging.wait()
        for buf, (_, _, _, result) in zip(buffers, slots):
            _copy_pieces(buf, result, _D2H)
    except BaseException:
        staging.unsettled = True  # work may still be queued that uses the scratch: see Staging.wait
        raise
    finally:
        _staging.give_back(staging)


def staged_elementwise(comm: Communicator, source: Optional[int], result: Optional[int], count: int, dtype: DataType,
                       run: Callable[[DeviceArray, None, Stream], Any]) -> None:
    """Run an element-wise device operation in place on a staged copy of host memory.

    ``run(buffer, None, stream)`` queues the operation in place on the device buffer; ``source``
    (copied in) and ``result`` (copied out) are addresses, or None on a rank that has no input or
    output. Blocks until the result is in place.

    Raises
    ------
    ValueError
        If ``count`` is not an int >= 0.
    TypeError
        If ``dtype`` is not an HCCL data type (a :class:`DataType`, a NumPy dtype or its name).
    """
    _run(comm, [(_element_count(count, "count"), as_datatype(dtype), source, result)],
         lambda buffers, stream: run(buffers[0], None, stream))


def staged(comm: Communicator, source: Pieces, send_count: int, result: Pieces, recv_count: int, dtype: DataType,
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
    send_count, recv_count = _element_count(send_count, "send_count"), _element_count(recv_count, "recv_count")
    dtype = as_datatype(dtype)
    _run(comm, [(send_count, dtype, source, None), (recv_count, dtype, None, result)],
         lambda buffers, stream: run(buffers[0], buffers[1], stream))


def staged_batch(comm: Communicator, items: Sequence[Tuple[str, int, int, DataType, int]]) -> None:
    """Sends and receives of host memory in one batch: ``("send" | "recv", address, count, dtype,
    peer)`` items. Blocks until every transfer is done."""
    slots = [(_element_count(count, f"items[{index}] count"), as_datatype(dtype), *(
        (address, None) if kind == "send" else (None, address))) for index, (kind, address, count, dtype, _)
        in enumerate(items)]
    _run(comm, slots, lambda buffers, stream: collectives.batch_send_recv(
        comm, [(kind, buf, peer) for (kind, _, _, _, peer), buf in zip(items, buffers)], stream=stream))


def barrier(comm: Communicator) -> None:
    """Block until every rank has reached the barrier (on the staging stream, so that it comes
    after the NumPy calls before it)."""
    _run(comm, [], lambda buffers, stream: collectives.barrier(comm, stream=stream))
