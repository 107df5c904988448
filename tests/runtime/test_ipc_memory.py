"""Device memory shared between processes (``DeviceArray.ipc_export`` / ``ipc_import``): the
importer reads the exporter's data and its writes reach the exporter; the exporter cannot free
memory another process has imported (``close()`` raises and the array stays open) and can once
that process let go; process-id checks; bad arguments."""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any, List

import numpy as np
import pytest

import hcclpy
import ranks


def _importer(rank: int, size: int, info: bytes, handle: hcclpy.IpcHandle, to_child: Any, from_child: Any) -> None:
    shared = hcclpy.DeviceArray.ipc_import(handle, device=1)
    from_child.put(shared.to_numpy().tolist())
    with pytest.raises(ValueError, match="imported from another process"):
        shared.ipc_export()
    shared.copy_from(np.full(8, 7, np.float32))
    from_child.put("written")
    assert to_child.get(timeout=60) == "close"
    shared.close()
    from_child.put("closed")


def test_an_exported_array_is_shared_with_another_process() -> None:
    array = hcclpy.from_numpy(np.arange(8, dtype=np.float32), device=0)
    handle = array.ipc_export()
    assert pickle.loads(pickle.dumps(handle)) == handle
    assert (handle.pid, handle.shape, handle.dtype, handle.nbytes) == (os.getpid(), (8,), "FP32", 32)
    context = ranks._process_context()
    to_child, from_child = context.Queue(), context.Queue()
    outcome: List[Any] = []
    child = threading.Thread(target=lambda: outcome.append(
        ranks.run_processes(_importer, 1, handle, to_child, from_child, return_exceptions=True)))
    child.start()
    try:
        assert from_child.get(timeout=60) == list(range(8))
        assert from_child.get(timeout=60) == "written"
        assert array.to_numpy().tolist() == [7.0] * 8  # the other process's writes
        with pytest.raises(hcclpy.AclError, match="still imported by process"):
            array.close()
        assert not array.closed and array.to_numpy()[0] == 7.0  # still open, still usable
    finally:
        to_child.put("close")
    assert from_child.get(timeout=60) == "closed"
    child.join(60)
    assert outcome == [[None]]
    array.close()
    assert array.closed


def _refused(rank: int, size: int, info: bytes, handle: hcclpy.IpcHandle) -> str:
    with pytest.raises(hcclpy.AclError) as caught:
        hcclpy.DeviceArray.ipc_import(handle)
    return str(caught.value)


def test_only_the_listed_processes_import() -> None:
    array = hcclpy.zeros(4, "int32", device=0)
    handle = array.ipc_export(pids=[os.getpid()])  # not the child's
    message, = ranks.run_processes(_refused, 1, handle)
    assert "does not list this process" in message
    array.close()
    message, = ranks.run_processes(_refused, 1, handle)  # closed: nobody imports it any more
    assert "names no exported memory" in message or "was closed" in message


def test_bad_ipc_arguments_are_refused() -> None:
    array = hcclpy.zeros(4, "float32", device=0)
    for bad in ([], [0], [-3], [True], ["12"], 5):
        with pytest.raises((ValueError, TypeError), match="pids=.* must be a non-empty sequence of process ids"):
            array.ipc_export(pids=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty DeviceArray"):
        hcclpy.zeros(0, "float32", device=0).ipc_export()
    with pytest.raises(TypeError, match="must be an hcclpy.IpcHandle"):
        hcclpy.DeviceArray.ipc_import(("key", 1))  # type: ignore[arg-type]
    with pytest.raises(hcclpy.AclError, match="exported by this process"):
        hcclpy.DeviceArray.ipc_import(array.ipc_export())
    array.close()
    with pytest.raises(ValueError, match="closed DeviceArray"):
        array.ipc_export()


# ---------------------------------------------------------------- events

def _waiter(rank: int, size: int, info: bytes, handle: hcclpy.IpcEventHandle, to_child: Any, from_child: Any) -> None:
    event = hcclpy.Event.ipc_open(handle, device=1)
    with pytest.raises(ValueError, match="opened from another process"):
        event.record()
    with pytest.raises(ValueError, match="only the process that made it shares it"):
        event.ipc_handle()
    stream = hcclpy.Device(1).create_stream()
    ran: List[str] = []
    stream.wait_event(event)
    stream.launch_host_func(lambda: ran.append("after the event"))
    from_child.put((event.query(), stream.query()))
    stream.synchronize()  # until the exporter's record ran
    from_child.put((ran, event.query()))
    event.close()
    stream.close()


def test_another_process_waits_for_an_exported_event() -> None:
    device = hcclpy.Device(0)
    with pytest.raises(ValueError, match=r"create_event\(ipc=True\)"):
        device.create_event().ipc_handle()
    event = device.create_event(timing=False, ipc=True)
    stream = device.create_stream()
    gate, entered = threading.Event(), threading.Event()
    stream.launch_host_func(lambda: (entered.set(), gate.wait(30)))
    assert entered.wait(10)
    event.record(stream)
    handle = event.ipc_handle()
    assert pickle.loads(pickle.dumps(handle)) == handle and handle.pid == os.getpid()
    context = ranks._process_context()
    to_child, from_child = context.Queue(), context.Queue()
    outcome: List[Any] = []
    child = threading.Thread(target=lambda: outcome.append(
        ranks.run_processes(_waiter, 1, handle, to_child, from_child, return_exceptions=True)))
    child.start()
    try:
        assert from_child.get(timeout=60) == (False, False)  # held back by this process's stream
    finally:
        gate.set()
    assert from_child.get(timeout=60) == (["after the event"], True)
    child.join(60)
    assert outcome == [[None]]
    stream.synchronize()
    with pytest.raises(TypeError, match="must be an hcclpy.IpcEventHandle"):
        hcclpy.Event.ipc_open(b"x" * 64)  # type: ignore[arg-type]
    with pytest.raises(hcclpy.AclError, match="of this process"):
        hcclpy.Event.ipc_open(handle)
    event.close()
    stream.close()


def _share_and_reduce(rank: int, size: int, info: bytes, folder: str) -> List[float]:
    # Rank 0 exports an array; the other ranks import it and all_reduce their values into it, as
    # their recv buffer; rank 0 then sees the sum in its own array.
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    path = os.path.join(folder, "handle")
    try:
        if rank == 0:
            mine = hcclpy.zeros(4, "float32", device=0)
            with open(path + ".tmp", "wb") as out:
                pickle.dump(mine.ipc_export(), out)
            os.replace(path + ".tmp", path)
        else:
            assert ranks.wait_for(lambda: os.path.exists(path), 30)
            with open(path, "rb") as handle_file:
                handle = pickle.load(handle_file)
        comm.barrier()
        if rank == 0:
            comm.all_reduce(hcclpy.from_numpy(np.full(4, 1.0, np.float32), device=0), mine, op="sum")
            comm.barrier()  # the importers' copies back are done once they pass it
            comm.barrier()
            result = mine.to_numpy().tolist()
            comm.barrier()  # the importers let go before the exporter frees
            mine.close()
            return result
        shared = hcclpy.DeviceArray.ipc_import(handle, device=rank)
        comm.all_reduce(hcclpy.from_numpy(np.full(4, rank + 1.0, np.float32), device=rank), shared, op="sum")
        comm.barrier()
        result = shared.to_numpy().tolist()
        comm.barrier()
        shared.close()
        comm.barrier()
        return result
    finally:
        comm.destroy()


def test_ranks_all_reduce_into_memory_another_rank_exported(tmp_path: Any) -> None:
    assert ranks.run_processes(_share_and_reduce, 3, str(tmp_path)) == [[6.0] * 4] * 3
