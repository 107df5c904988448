"""The short path of a small blocking all-reduce of one CPU tensor.

``dist.all_reduce`` of a loss, a counter or a small bucket is dominated by what happens around the
data, not by the data: the general path (:mod:`hcclpy.host` staging, the ordered executor, a
:class:`~._work.Work` with its events) costs several times the HCCL call itself. Such calls repeat
with the same few shapes, so each group keeps, for its small all-reduces:

* one device scratch buffer of :data:`LIMIT` bytes and one stream of its own, made on first use;
* a persistent operation (``collectives.all_reduce_init``: the same operation definition as every
  other path, with its checks done once) per (element count, HCCL type, reduce op), at most
  :data:`CACHED` of them, the oldest dropped first.

A call copies the tensor into the scratch buffer, starts the operation, waits for the stream
(bounded: the communicator's exec timeout ends a collective a peer never joins) and copies the
result back. Anything else (NPU tensors, AVG, widened types, asynchronous calls, larger tensors)
takes the general path.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, List, Optional, Tuple

from .. import collectives
from ..communicator import Communicator
from ..errors import HcclpyError
from ..runtime import DeviceArray, Stream, empty
from ..runtime._memory import copy_bytes
from ..types import DataType

LIMIT = 64 << 10  # bytes: tensors up to this size take the short path (the scratch buffer's size)
CACHED = 16       # persistent operations kept per group (DDP and training loops repeat a few shapes)

_H2D, _D2H = 1, 2  # aclrtMemcpyKind

Key = Tuple[int, DataType, Any]


class SmallAllReduce:
    """The short path of one group: its scratch buffer, stream and persistent operations."""

    def __init__(self, comm: Communicator) -> None:
        self._comm = comm
        self._stream: Optional[Stream] = None
        self._scratch: Optional[DeviceArray] = None
        self._ops: collections.OrderedDict[Key, Any] = collections.OrderedDict()
        # What a failed call left behind: work may still be queued on them, so they are let go
        # of when the group is destroyed, after its communicator.
        self._retired: List[Any] = []

    def _operation(self, count: int, dtype: DataType, op: Any) -> Any:
        """The persistent operation of ``(count, dtype, op)``, made (and cached) now."""
        if self._scratch is None:
            self._stream = self._comm.device.create_stream()
            self._scratch = empty((LIMIT,), "uint8", device=self._comm.device)
        started = collectives.all_reduce_init(self._comm, (self._scratch.ptr, count, dtype), None, op,
                                              stream=self._stream)
        if len(self._ops) >= CACHED:
            self._ops.popitem(last=False)[1].close()
        self._ops[(count, dtype, op)] = started
        return started

    def run(self, address: int, nbytes: int, count: int, dtype: DataType, op: Any) -> None:
        """All-reduce ``count`` elements of ``dtype`` at host ``address`` in place; blocks."""
        started = self._ops.get((count, dtype, op))
        if started is None:
            started = self._operation(count, dtype, op)
        scratch, stream = self._scratch.ptr, self._stream  # type: ignore[union-attr]
        try:
            copy_bytes(scratch, address, nbytes, _H2D)
            started.start()
            stream.synchronize()  # type: ignore[union-attr]
            copy_bytes(address, scratch, nbytes, _D2H)
        except BaseException:
            self._retire()  # the stream failed for good, or still holds the operation (Ctrl-C)
            raise

    def _retire(self) -> None:
        for started in self._ops.values():
            started.close()
        self._ops.clear()
        self._retired += [self._stream, self._scratch]
        self._stream = self._scratch = None

    def close(self) -> None:
        """Let go of the stream and scratch buffer (after the communicator is destroyed, or when
        nothing is queued on them)."""
        self._retire()
        for resource in self._retired:
            if resource is not None:
                with contextlib.suppress(HcclpyError):  # a failed stream reports its failure again
                    resource.close()
        self._retired.clear()
