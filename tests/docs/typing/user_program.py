"""A program written as hcclpy's users write them, annotated: ``mypy --strict`` must accept it
(tests/docs/test_typing.py). It is type-checked, not run."""

from __future__ import annotations

import os
import pathlib
from typing import List, Optional

import numpy as np

import hcclpy
from hcclpy.errors import AclTimeoutError, HcclRemoteError, HcclTimeoutError


def timed_all_reduce(comm: hcclpy.Communicator, n: int) -> float:
    stream: hcclpy.Stream = comm.device.create_stream()
    x: hcclpy.DeviceArray = hcclpy.zeros(n, "float32", device=comm.device)
    start: hcclpy.Event = stream.record()
    comm.all_reduce(x, stream=stream)
    end: hcclpy.Event = stream.record()
    other = comm.device.create_stream()
    other.wait_event(end)
    other.wait_stream(stream)
    end.synchronize(timeout=30.0)
    milliseconds: float = start.elapsed_time(end)
    for s in (stream, other):
        s.close()
    return milliseconds


def on_a_device(device: hcclpy.Device) -> hcclpy.DeviceArray:
    same: hcclpy.Device = hcclpy.Device(device)
    by_number = hcclpy.Device(np.int64(0))
    return hcclpy.from_numpy(np.ones(4, dtype=np.float32), device=same if same == by_number else 0)


def what_went_wrong(error: hcclpy.HcclpyError) -> str:
    if isinstance(error, (hcclpy.CommTimeoutError, hcclpy.RemoteRankError)):
        code: Optional[int] = error.code
        return f"{error.name} {error.api} {code} {error.detail}"
    if isinstance(error, (hcclpy.AclError, hcclpy.HcclError)):
        number: int = error.code
        return f"{error.name} ({number})"
    return str(error)


def categories() -> List[type]:
    return [AclTimeoutError, HcclTimeoutError, HcclRemoteError, hcclpy.SimulatorFallbackWarning]


def set_up(table: pathlib.Path, store: "os.PathLike[str]") -> hcclpy.Communicator:
    info = hcclpy.RootInfo.from_bytes(bytearray(bytes(hcclpy.RootInfo.generate(device=0))))
    comm = hcclpy.Communicator(1, info, 0, device=hcclpy.Device(0))
    comm.destroy(timeout=5)
    from_table: hcclpy.Communicator = hcclpy.Communicator.from_rank_table(table, 0)
    from_table.destroy()
    return hcclpy.init(store_path=store, rank_table=None, device=0)


def names() -> str:
    dtype: hcclpy.DataType = hcclpy.DataType.FP32
    op: hcclpy.ReduceOp = hcclpy.ReduceOp.MAX
    return f"{dtype} {op} {dtype.numpy} {dtype.itemsize}"


def mark(stream: hcclpy.Stream) -> hcclpy.Event:
    return stream.record()


def results(comm: hcclpy.Communicator, stream: hcclpy.Stream) -> None:
    # The NumPy forms return arrays; a device form returns the buffer it wrote.
    host: np.ndarray = comm.all_reduce(np.ones(4), op="max")
    gathered: np.ndarray = comm.all_gather(host)
    scattered: np.ndarray = comm.reduce_scatter(gathered)
    broadcast: np.ndarray = comm.broadcast(scattered, root=0)
    reduced: Optional[np.ndarray] = comm.reduce(broadcast, root=0)
    x = hcclpy.zeros(4, "float32", device=comm.device)
    y = hcclpy.zeros(4 * comm.size, "float32", device=comm.device)
    in_place: hcclpy.DeviceArray = comm.all_reduce(x, stream=stream)
    written: hcclpy.DeviceArray = comm.all_gather(in_place, y, stream=stream)
    block: hcclpy.DeviceArray = comm.reduce_scatter(written, x, stream=stream)
    same: hcclpy.DeviceArray = comm.broadcast(block, 0, stream=stream)
    on_root: Optional[hcclpy.DeviceArray] = comm.reduce(same, root=0, stream=stream)
    exchanged: np.ndarray = comm.all_to_all(gathered)
    swapped: hcclpy.DeviceArray = comm.all_to_all(y, hcclpy.zeros(4 * comm.size, device=comm.device), stream=stream)
    received: np.ndarray = comm.recv(np.empty(4), peer=1)
    print(reduced, on_root, exchanged, swapped, received)


def uneven_results(comm: hcclpy.Communicator, stream: hcclpy.Stream, counts: List[int]) -> None:
    # The uneven operations and scatter: counts by name; an omitted recv is a new array like send.
    host = np.ones(sum(counts), dtype=np.float32)
    gathered: np.ndarray = comm.all_gather_v(host[: counts[comm.rank]], recv_counts=counts)
    into: np.ndarray = comm.all_gather_v(host[: counts[comm.rank]], recv_counts=counts, out=np.empty_like(host))
    scattered: np.ndarray = comm.reduce_scatter_v(host, send_counts=counts, op="max")
    exchanged: np.ndarray = comm.all_to_all_v(host, send_counts=counts, recv_counts=counts)
    by_matrix: np.ndarray = comm.all_to_all_vc(host, send_count_matrix=[counts] * comm.size)
    block: np.ndarray = comm.scatter(host if comm.rank == 0 else None, out=np.empty(4), root=0)
    mine: np.ndarray = comm.scatter(host, root=0)
    x = hcclpy.zeros(sum(counts), "float32", device=comm.device)
    y = hcclpy.zeros(sum(counts), "float32", device=comm.device)
    part = hcclpy.zeros(counts[comm.rank], "float32", device=comm.device)
    on_device: hcclpy.DeviceArray = comm.all_gather_v(part, y, counts, stream=stream)
    reduced: hcclpy.DeviceArray = comm.reduce_scatter_v(x, part, counts, stream=stream)
    swapped: hcclpy.DeviceArray = comm.all_to_all_v(x, y, counts, counts, stream=stream)
    matrixed: hcclpy.DeviceArray = comm.all_to_all_vc(x, y, [counts] * comm.size, stream=stream)
    landed: hcclpy.DeviceArray = comm.scatter(x, part, root=0, stream=stream)
    step: hcclpy.PersistentOp = comm.all_reduce_init(x, op=hcclpy.ReduceOp.MAX, stream=stream)
    started: hcclpy.DeviceArray = step.start()
    step.close()
    print(gathered, into, scattered, exchanged, by_matrix, block, mine, on_device, reduced, swapped, matrixed, landed,
          started)
