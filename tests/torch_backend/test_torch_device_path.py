"""The NPU-tensor path of the "hcclpy" backend, driven on the simulator.

Without torch_npu there are no NPU tensors; here CPU tensors that alias simulator device memory
stand in for them (their ``data_ptr()`` is a device pointer), the backend is told they are NPU
tensors, and "the current NPU stream" is an hcclpy stream. The path then runs as on an NPU: the
pointers go to HCCL on that stream, the call returns once the work is queued, and the Work
tracks an event. The operations here have no torch step after the HCCL call; those that do
(AVG's division, widened types, lists of outputs) rely on torch_npu ordering torch work on the
same stream, which CPU tensors cannot imitate.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any, Dict, Iterator, List

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import hcclpy  # noqa: E402
import ranks  # noqa: E402
import torch_ranks as tr  # noqa: E402


def _device_tensor(keep: List[Any], device: hcclpy.Device, values: torch.Tensor) -> torch.Tensor:
    """A float32 CPU tensor over freshly allocated device memory, holding ``values``."""
    memory = hcclpy.empty(values.numel(), "float32", device=device)
    keep.append(memory)
    tensor = torch.frombuffer((ctypes.c_float * values.numel()).from_address(memory.ptr), dtype=torch.float32)
    tensor.copy_(values.flatten())
    return tensor.view(values.shape)


def _as_npu(rank: int, size: int, directory: str) -> Any:
    """Initialise the backend with CPU tensors taken for NPU tensors, on an hcclpy stream that
    stands for the current NPU stream; that stream."""
    from hcclpy.torch import _process_group

    tr.init(rank, size, directory)
    stream = hcclpy.torch.communicator().device.create_stream()
    _process_group._device_type = lambda tensor: "npu"
    _process_group.npu_stream = lambda comm: stream
    return stream


def _device_path(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    stream = _as_npu(rank, size, directory)
    comm = hcclpy.torch.communicator()
    keep: List[Any] = []
    try:
        def on_device(values: torch.Tensor) -> torch.Tensor:
            return _device_tensor(keep, comm.device, values)

        out: Dict[str, Any] = {}
        x = on_device(torch.arange(4.0) + rank)
        work = dist.all_reduce(x, async_op=True)
        out["work"] = type(work).__name__
        future = work.get_future()
        work.wait()
        out["all_reduce"] = x.tolist()
        out["future"] = future.wait()[0] is x
        b = on_device(torch.full((3,), float(rank)))
        dist.broadcast(b, src=size - 1)
        out["broadcast"] = b.tolist()
        g = on_device(torch.zeros(size * 2))
        dist.all_gather_into_tensor(g, on_device(torch.full((2,), float(rank))))
        out["all_gather"] = g.tolist()
        r = on_device(torch.zeros(2))
        dist.reduce_scatter_tensor(r, on_device(torch.arange(size * 2.0)))
        out["reduce_scatter"] = r.tolist()
        a = on_device(torch.zeros(size))
        dist.all_to_all_single(a, on_device(torch.arange(size, dtype=torch.float32) + 10 * rank))
        out["all_to_all"] = a.tolist()
        got = on_device(torch.zeros(2))
        sent = dist.isend(on_device(torch.full((2,), float(rank))), (rank + 1) % size)
        received = dist.irecv(got, (rank - 1) % size)
        sent.wait()
        received.wait()
        out["ring"] = got.tolist()
        return out
    finally:
        dist.destroy_process_group()
        stream.close()
        for memory in keep:
            memory.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_npu_tensor_path_on_simulated_device_memory(tmp_path: Any) -> None:
    size = 2
    out = ranks.run_processes(_device_path, size, str(tmp_path), timeout=90)
    for rank, res in enumerate(out):
        assert res["work"] == "EventWork" and res["future"]
        assert res["all_reduce"] == [float(2 * i + 1) for i in range(4)]
        assert res["broadcast"] == [float(size - 1)] * 3
        assert res["all_gather"] == [0.0, 0.0, 1.0, 1.0]
        assert res["reduce_scatter"] == [float(size * (2 * rank)), float(size * (2 * rank + 1))]
        assert res["all_to_all"] == [float(rank + 10 * src) for src in range(size)]
        assert res["ring"] == [float((rank - 1) % size)] * 2


@contextlib.contextmanager
def _four_ones_on_the_device(rank: int, size: int, directory: str) -> Iterator[torch.Tensor]:
    """The backend as on an NPU (see :func:`_as_npu`), and a tensor of four ones in device memory;
    the group destroyed and the memory and stream freed afterwards."""
    stream = _as_npu(rank, size, directory)
    memory = hcclpy.empty(4, "float32", device=hcclpy.torch.communicator().device)
    try:
        x = torch.frombuffer((ctypes.c_float * 4).from_address(memory.ptr), dtype=torch.float32)
        x.fill_(1.0)
        yield x
    finally:
        try:
            dist.destroy_process_group()
        finally:
            memory.close()
            with contextlib.suppress(hcclpy.AclError):  # a failed stream reports its failure on closing too
                stream.close()


def _failed_on_the_stream(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    with _four_ones_on_the_device(rank, size, directory) as x:
        # A desync: the stream fails before it reaches the Work's event.
        work = dist.all_reduce(x, async_op=True) if rank == 0 else dist.broadcast(x, src=0, async_op=True)
        deadline = time.monotonic() + 30
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)
        out: Dict[str, Any] = {"completed": work.is_completed(), "success": work.is_success()}
        try:
            work.wait()
            out["wait"] = None
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            out["wait"] = f"{type(exc).__name__}: {exc}"
        return out


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_work_whose_stream_failed_completes_with_the_failure(tmp_path: Any) -> None:
    for rank, res in enumerate(ranks.run_processes(_failed_on_the_stream, 2, str(tmp_path), timeout=90)):
        assert res["completed"] and not res["success"], (rank, res)
        assert res["wait"] is not None and "the stream that recorded the event failed before reaching it" in \
            res["wait"] and "collective mismatch" in res["wait"], (rank, res["wait"])


def _waits_that_give_up(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    with _four_ones_on_the_device(rank, size, directory) as x:
        if rank == 1:
            time.sleep(1.5)  # late, well within the group's timeout
        work = dist.all_reduce(x, async_op=True)
        out: Dict[str, Any] = {}
        if rank == 0:
            try:
                work.wait(timeout=0.2)
                out["short_wait"] = "returned"
            except hcclpy.torch.BackendTimeoutError as exc:
                out["short_wait"] = f"gave up: {exc}"
            out["pending"] = not work.is_completed()
        out["wait"] = work.wait()  # the operation went on, and succeeded
        out["success"], out["result"] = work.is_success(), x.tolist()
        return out


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_wait_that_gives_up_leaves_the_work_to_finish(tmp_path: Any) -> None:
    first, second = ranks.run_processes(_waits_that_give_up, 2, str(tmp_path), timeout=90)
    assert first.pop("short_wait").startswith("gave up: allreduce on process group"), first
    assert first == {"pending": True, "wait": True, "success": True, "result": [2.0] * 4}
    assert second == {"wait": True, "success": True, "result": [2.0] * 4}


def test_device_pieces_keep_their_memory_order() -> None:
    """Tensors that do not lie back to back go through one temporary; channels_last ones must
    fill it, and be filled from it, in memory order, the order HCCL reads and writes."""
    from hcclpy.torch._transport import DeviceTransport

    def copy(send: Any, recv: Any, stream: Any) -> None:  # stands for HCCL: moves the bytes in order
        ctypes.memmove(recv[0], send[0], send[1] * 4)

    def channels_last(values: torch.Tensor) -> torch.Tensor:
        return values.contiguous(memory_format=torch.channels_last)

    whole = channels_last(torch.arange(48.0).reshape(4, 3, 2, 2))
    apart = [channels_last(torch.empty(2, 3, 2, 2)) for _ in range(2)]
    transport = DeviceTransport(comm=None, stream=None)  # type: ignore[arg-type]
    transport.whole(list(whole.chunk(2)), 48, apart, 48, hcclpy.DataType.FP32, copy)
    assert [piece.tolist() for piece in apart] == [piece.tolist() for piece in whole.chunk(2)]
    again = channels_last(torch.empty(4, 3, 2, 2))
    transport.whole(apart, 48, list(again.chunk(2)), 48, hcclpy.DataType.FP32, copy)
    assert torch.equal(again, whole) and again.is_contiguous(memory_format=torch.channels_last)
