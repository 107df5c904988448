"""Where a process group's tensors live decides how an operation reaches HCCL.

:class:`HostTransport` serves CPU tensors: their memory is staged through device buffers by
:mod:`hcclpy.host`, and each call blocks until the result is back in the tensors.
:class:`DeviceTransport` serves NPU tensors (torch_npu): their device pointers go to HCCL directly,
on the current NPU stream, and calls return as soon as the work is queued.

Both run the same ``launch(send, recv, stream)`` callables, which queue one hcclpy collective on
device buffers; the process group writes each operation once against this interface.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import torch

from .. import collectives, host
from ..communicator import Communicator
from ..runtime import Event, Stream
from ..types import DataType

Launch = Callable[[Any, Any, Stream], Any]


def _back_to_back(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the tensors lie one after the other in memory (views of one tensor, often)."""
    at = tensors[0].data_ptr()
    for t in tensors:
        if t.data_ptr() != at:
            return False
        at += t.numel() * t.element_size()
    return True


def in_memory_order(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as a 1-D view, in the order they lie in memory (a channels_last
    tensor's too, whose ``reshape(-1)`` would be a copy in logical order)."""
    return tensor.as_strided((tensor.numel(),), (1,))


def _pieces(tensors: Optional[Sequence[torch.Tensor]]) -> Any:
    if tensors is None:
        return None
    if _back_to_back(tensors):
        return tensors[0].data_ptr()
    return [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]


class HostTransport:
    """CPU tensors, staged through the device; every call blocks until it is done."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def elementwise(self, source: Optional[torch.Tensor], result: Optional[torch.Tensor], dtype: DataType,
                    count: int, launch: Launch) -> None:
        """An element-wise operation, run in place on staged chunks (``launch`` gets recv None)."""
        host.staged_elementwise(self.comm, None if source is None else source.data_ptr(),
                                None if result is None else result.data_ptr(), count, dtype, launch)

    def whole(self, sources: Optional[Sequence[torch.Tensor]], send_count: int,
              results: Optional[Sequence[torch.Tensor]], recv_count: int, dtype: DataType, launch: Launch) -> None:
        """An operation from ``sources`` (laid back to back) into ``results`` (likewise)."""
        host.staged(self.comm, _pieces(sources), send_count, _pieces(results), recv_count, dtype, launch)

    def batch(self, items: Sequence[Tuple[str, torch.Tensor, DataType, int, int]]) -> None:
        """Sends and receives on the group's communicator: ``(kind, tensor, dtype, count, peer)``."""
        host.staged_batch(self.comm, [(kind, t.data_ptr(), count, dtype, peer) for kind, t, dtype, count, peer in items])

    def barrier(self) -> None:
        host.barrier(self.comm)


class DeviceTransport:
    """NPU tensors, by device pointer on ``stream`` (the caller's current NPU stream)."""

    def __init__(self, comm: Communicator, stream: Stream) -> None:
        self.comm = comm
        self.stream = stream

    @staticmethod
    def _buffer(tensor: Optional[torch.Tensor], dtype: DataType, count: int) -> Any:
        return None if tensor is None else (tensor.data_ptr(), count, dtype)

    def elementwise(self, source: Optional[torch.Tensor], result: Optional[torch.Tensor], dtype: DataType,
                    count: int, launch: Launch) -> None:
        # In place when there is one tensor: the launch gets recv None, as hcclpy's in-place form.
        either = source if source is not None else result
        recv = None if result is None or result is either else self._buffer(result, dtype, count)
        launch(self._buffer(either, dtype, count), recv, self.stream)

    def whole(self, sources: Optional[Sequence[torch.Tensor]], send_count: int,
              results: Optional[Sequence[torch.Tensor]], recv_count: int, dtype: DataType, launch: Launch) -> None:
        # Pieces that do not lie back to back go through one contiguous temporary, which torch
        # allocates, fills and reads on the same stream as the operation.
        send = None
        if sources is not None:
            send = sources[0] if _back_to_back(sources) else torch.cat([in_memory_order(t) for t in sources])
        recv, scatter_back = None, None
        if results is not None:
            if _back_to_back(results):
                recv = results[0]
            else:
                recv = torch.empty(sum(t.numel() for t in results), dtype=results[0].dtype, device=results[0].device)
                scatter_back = results
        launch(self._buffer(send, dtype, send_count), self._buffer(recv, dtype, recv_count), self.stream)
        if scatter_back is not None:
            for target, piece in zip(scatter_back, recv.split([t.numel() for t in scatter_back])):
                in_memory_order(target).copy_(piece)

    def batch(self, items: Sequence[Tuple[str, torch.Tensor, DataType, int, int]]) -> None:
        collectives.batch_send_recv(self.comm, [(kind, (t.data_ptr(), count, dtype), peer)
                                                for kind, t, dtype, count, peer in items], stream=self.stream)

    def barrier(self) -> None:
        collectives.barrier(self.comm, stream=self.stream)
        self.stream.synchronize()

    def record(self) -> Event:
        """An event recorded after everything queued so far."""
        event = self.comm.device.create_event(timing=False)
        event.record(self.stream)
        return event


def npu_stream(comm: Communicator) -> Stream:
    """torch_npu's current stream on the communicator's device, borrowed (not owned)."""
    current = torch.npu.current_stream()  # type: ignore[attr-defined]  # present with torch_npu
    return Stream.from_handle(current.npu_stream, device=comm.device, owner=current)

