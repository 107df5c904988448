"""Virtual memory in the binding (``hcclpy.VirtualRange``, ``hcclpy.PhysicalMemory``,
``hcclpy.allocation_granularity``): mapped memory as device arrays for copies and collectives, a
range that grows without moving, CANN's order (memory mapped is not freed; closing a range unmaps
it), physical memory shared between two processes with the process-id list, and bad arguments
refused before any C call."""

from __future__ import annotations

import gc
import os
import pickle
import time
from typing import Any, Dict

import numpy as np
import pytest

import hcclpy
import ranks


@pytest.fixture
def grain() -> int:
    return hcclpy.allocation_granularity(0)


def test_the_granularity_is_2_mib_and_sizes_follow_it(grain: int) -> None:
    assert grain == 2 << 20
    assert hcclpy.allocation_granularity(hcclpy.Device(1), recommended=True) == grain
    with hcclpy.VirtualRange(grain + 1, device=0) as space:
        assert space.size == 2 * grain and space.ptr % grain == 0  # rounded up, aligned
    with pytest.raises(ValueError, match=r"multiple of the allocation granularity .* round it up to 4194304"):
        hcclpy.PhysicalMemory(grain + 1, device=0)


def _free_now(device: hcclpy.Device) -> int:
    """The device's free memory once what earlier tests left to the collector is gone (it would
    otherwise count as freed during the test that reads this)."""
    gc.collect()
    return device.memory_info()[0]


def test_mapped_memory_is_device_memory_for_copies_and_grows_in_place(grain: int) -> None:
    device = hcclpy.Device(0)
    free_before = _free_now(device)
    first, second = hcclpy.PhysicalMemory(grain, device=0), hcclpy.PhysicalMemory(grain, device=0)
    assert free_before - device.memory_info()[0] == 2 * grain  # device memory, as aclrtMalloc's
    space = hcclpy.VirtualRange(16 * grain, device=0)
    ptr = space.ptr
    space.map(first, offset=0)
    small = space.array(grain // 4, "float32")
    small.copy_from(np.arange(grain // 4, dtype=np.float32))
    assert hcclpy.pointer_attributes(small) == hcclpy.PointerAttributes("device", 0, 4096)
    space.map(second, offset=grain)  # grown: the same addresses, more memory behind them
    assert space.ptr == ptr and [offset for offset, _ in space.mappings] == [0, grain]
    big = space.array(2 * grain // 4, "float32")
    big[grain // 4:].fill_zero()
    host = big.to_numpy()
    assert np.array_equal(host[:grain // 4], np.arange(grain // 4, dtype=np.float32)) and not host[grain // 4:].any()
    with device.create_stream() as stream:  # queued copies too
        big[:8].copy_from(np.full(8, 5, np.float32), stream=stream)
        assert big[:8].to_numpy(stream=stream).tolist() == [5.0] * 8
    assert space.unmap(grain) is second and not second.closed
    with pytest.raises(ValueError, match="are not mapped"):
        space.array(2 * grain // 4, "float32")
    space.close()
    assert space.closed and small.closed and big.closed and not first.closed
    first.close()
    second.close()
    assert device.memory_info()[0] == free_before


def test_collectives_run_on_mapped_memory(grain: int) -> None:
    results = ranks.run("threads", _all_reduce_on_mapped, 2, grain)
    assert results == [True, True]


def _all_reduce_on_mapped(rank: int, size: int, info: bytes, grain: int) -> bool:
    count = grain // 4
    with hcclpy.PhysicalMemory(2 * grain, device=rank) as memory, \
            hcclpy.VirtualRange(2 * grain, device=rank) as space, \
            hcclpy.Communicator(size, info, rank, device=rank) as comm:
        space.map(memory)
        send, recv = space.array(count, "float32"), space.array(count, "float32", offset=grain)
        send.copy_from(np.full(count, rank + 1.0, np.float32))
        with hcclpy.Device(rank).create_stream() as stream:
            comm.all_reduce(send, recv, "sum", stream=stream)
            comm.all_reduce(send, stream=stream)  # in place
            stream.synchronize()
        summed = bool((recv.to_numpy() == 3.0).all()) and bool((send.to_numpy() == 3.0).all())
        assert space.unmap(0) is memory and not memory.closed
        return summed


def test_the_order_unmap_before_free_and_closing_an_array_closes_its_range(grain: int) -> None:
    memory = hcclpy.PhysicalMemory(grain, device=0)
    space = hcclpy.VirtualRange(grain, device=0)
    space.map(memory)
    with pytest.raises(ValueError, match="mapped in 1 place: unmap it"):
        memory.close()
    view = space.array(16, "uint8")
    view.close()  # closing a view frees its allocation: here, unmaps and releases the range
    assert space.closed and not memory.closed
    memory.close()
    memory.close()  # idempotent
    space.close()
    assert memory.closed
    with pytest.raises(ValueError, match="PhysicalMemory is closed"):
        memory.export()
    with pytest.raises(ValueError, match="VirtualRange is closed"):
        space.array(4)


def test_unmap_waits_for_the_work_queued_on_the_range(grain: int) -> None:
    memory = hcclpy.PhysicalMemory(grain, device=0)
    space = hcclpy.VirtualRange(grain, device=0)
    space.map(memory)
    array = space.array(grain // 4, "float32")
    host = hcclpy.pinned_empty(grain // 4, "float32")
    host[:] = 2.0
    with hcclpy.Device(0).create_stream() as stream:
        gate: list = []
        stream.launch_host_func(lambda: (time.sleep(0.3), gate.append(1)))  # the copy waits behind it
        array.copy_from(host, stream=stream)
        space.unmap(0)  # after the copy: the stream held the array
        assert gate == [1]
    again = hcclpy.VirtualRange(grain, device=0)
    again.map(memory)
    assert (again.array(grain // 4, "float32").to_numpy() == 2.0).all()
    again.close()
    space.close()
    memory.close()


def test_the_collector_frees_what_was_not_closed(grain: int) -> None:
    device = hcclpy.Device(0)
    free_before = _free_now(device)
    space = hcclpy.VirtualRange(grain, device=0)
    space.map(hcclpy.PhysicalMemory(grain, device=0))
    array = space.array(4)
    del space
    array.fill_zero()  # the array keeps the range and its memory alive
    del array
    gc.collect()
    assert device.memory_info()[0] == free_before


def test_bad_arguments_are_refused_before_any_c_call(grain: int) -> None:
    with pytest.raises(TypeError, match="size=1.5 must be an int"):
        hcclpy.VirtualRange(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size=0 must be a positive"):
        hcclpy.PhysicalMemory(0)
    with pytest.raises(TypeError, match="must be an int"):
        hcclpy.PhysicalMemory(True)
    with pytest.raises(ValueError, match="out of range"):
        hcclpy.VirtualRange(grain, device=99)
    memory, other_device = hcclpy.PhysicalMemory(2 * grain, device=0), hcclpy.PhysicalMemory(grain, device=1)
    space = hcclpy.VirtualRange(4 * grain, device=0)
    with pytest.raises(TypeError, match="must be an hcclpy.PhysicalMemory"):
        space.map(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="offset='0' must be an int"):
        space.map(memory, "0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 2097152"):
        space.map(memory, 4096)
    with pytest.raises(ValueError, match="from 0 to 4194304"):
        space.map(memory, 3 * grain)
    with pytest.raises(ValueError, match=r"memory of Device\(1\)"):
        space.map(other_device)
    space.map(memory, grain)
    with pytest.raises(ValueError, match="overlap the memory mapped at offset 2097152"):
        space.map(memory, 0)
    with pytest.raises(ValueError, match="no memory is mapped; mapped at: \\[2097152\\]"):
        space.unmap(0)
    with pytest.raises(ValueError, match="multiple of 4"):
        space.array(4, "float32", offset=grain + 2)
    with pytest.raises(ValueError, match="bytes 0 to 16 of the range are not mapped"):
        space.array(4, "float32")
    with pytest.raises(ValueError, match="pids=\\[0\\] must be a non-empty sequence"):
        memory.export(pids=[0])
    with pytest.raises(TypeError, match="ShareableHandle"):
        hcclpy.PhysicalMemory.import_(12345)  # type: ignore[arg-type]
    handle = memory.export()
    with pytest.raises(ValueError, match="this process exported the memory"):
        hcclpy.PhysicalMemory.import_(handle)
    with pytest.raises(ValueError, match="exported to any process"):
        memory.export(pids=[1])
    assert memory.export() is handle  # once per memory
    space.close()
    memory.close()
    other_device.close()


def test_a_shareable_handle_pickles(grain: int) -> None:
    with hcclpy.PhysicalMemory(grain, device=0) as memory:
        handle = memory.export(pids=[os.getpid() + 1])
        assert pickle.loads(pickle.dumps(handle)) == handle
        assert (handle.pid, handle.device, handle.size) == (os.getpid(), 0, grain)


def _exchange(comm: hcclpy.Communicator, payload: Any, root: int) -> Any:
    """``payload`` of ``root``, pickled, on every rank (through a broadcast of host bytes)."""
    buffer = np.zeros(4096, np.uint8)
    if comm.rank == root:
        data = pickle.dumps(payload)
        buffer[:8] = np.frombuffer(len(data).to_bytes(8, "little"), np.uint8)
        buffer[8:8 + len(data)] = np.frombuffer(data, np.uint8)
    comm.broadcast(buffer, root)
    return pickle.loads(buffer[8:8 + int.from_bytes(buffer[:8].tobytes(), "little")].tobytes())


def _share(rank: int, size: int, info: bytes, grain: int) -> Dict[str, Any]:
    """Rank 0 exports physical memory to rank 1 by its process id, and other memory to nobody;
    rank 1 maps the first and reads and writes it; both all-reduce on mapped memory."""
    seen: Dict[str, Any] = {}
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        pids = np.zeros(size, np.int64)
        comm.all_gather(np.array([os.getpid()], np.int64), pids)
        if rank == 0:
            memory = hcclpy.PhysicalMemory(grain, device=0)
            nobody = hcclpy.PhysicalMemory(grain, device=0)
            space = hcclpy.VirtualRange(grain, device=0)
            space.map(memory)
            mine = space.array(grain // 4, "float32")
            mine.copy_from(np.arange(grain // 4, dtype=np.float32))
            handles = (memory.export(pids=[int(pids[1])]), nobody.export(pids=[int(pids[0])]))
        else:
            handles = None
        handles = _exchange(comm, handles, 0)
        if rank == 1:
            with pytest.raises(hcclpy.AclError) as refused:
                hcclpy.PhysicalMemory.import_(handles[1], device=1)
            seen["refused"] = refused.value.name
            memory = hcclpy.PhysicalMemory.import_(handles[0], device=1)
            assert memory.imported and memory.size == grain and memory.device == hcclpy.Device(1)
            with pytest.raises(ValueError, match="only the process that allocated it exports it"):
                memory.export()
            space = hcclpy.VirtualRange(grain, device=1)
            space.map(memory)
            mine = space.array(grain // 4, "float32")
            seen["read"] = bool(np.array_equal(mine.to_numpy(), np.arange(grain // 4, dtype=np.float32)))
            mine[:4].copy_from(np.full(4, -1, np.float32))
        comm.barrier()
        if rank == 0:
            seen["written"] = mine[:4].to_numpy().tolist()
        comm.barrier()
        space.close()
        memory.close()  # rank 0: while rank 1 may still hold it; it goes when both let go
        if rank == 0:
            nobody.close()
        # An all-reduce whose buffers are mapped memory, in both processes.
        with hcclpy.PhysicalMemory(grain, device=rank) as local, hcclpy.VirtualRange(grain, device=rank) as buffers:
            buffers.map(local)
            data = buffers.array(1024, "float32")
            data.copy_from(np.full(1024, rank + 1, np.float32))
            comm.all_reduce(data)
            seen["sum"] = float(data.to_numpy()[0])
    return seen


@pytest.mark.timeout(120)
def test_physical_memory_is_shared_between_processes(grain: int) -> None:
    first, second = ranks.run_processes(_share, 2, grain, timeout=100)
    assert first == {"written": [-1.0] * 4, "sum": 3.0}
    assert second == {"refused": "ACL_ERROR_RT_NO_PERMISSION", "read": True, "sum": 3.0}
