"""The newer CANN runtime surface in the binding: host functions on streams
(``Stream.launch_host_func``: stream order, with collectives too, exceptions raised in them),
``Stream.query``, ``Stream.id``, peer access between devices; bad arguments."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import hcclpy
import ranks


def test_host_functions_run_in_stream_order_and_hold_later_work() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        gate, order = threading.Event(), []
        stream.launch_host_func(lambda: (order.append("first"), gate.wait(10)))
        stream.launch_host_func(lambda: order.append("second"))
        deadline = time.monotonic() + 10
        while not order and time.monotonic() < deadline:
            time.sleep(0.01)
        assert order == ["first"] and stream.query() is False  # the first holds the stream
        gate.set()
        stream.synchronize()
        assert order == ["first", "second"] and stream.query() is True


def test_an_exception_in_a_host_function_is_raised_by_the_next_wait() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        ran = []

        def fails() -> None:
            raise KeyError("lost?")

        stream.launch_host_func(fails)
        stream.launch_host_func(lambda: ran.append("after"))  # the stream's later work still runs
        with pytest.raises(hcclpy.HostFunctionError, match=r"raised KeyError: 'lost\?'") as info:
            stream.synchronize()
        assert isinstance(info.value.__cause__, KeyError) and ran == ["after"]
        stream.synchronize()  # reported once
        stream.launch_host_func(fails)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if stream.query():
                    break
            except hcclpy.HostFunctionError:  # query() reports it too
                break
            time.sleep(0.01)
        else:
            pytest.fail("query() never reported the host function's exception")


def test_stream_ids_tell_streams_apart() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as a, device.create_stream() as b:
        assert isinstance(a.id, int) and a.id != b.id and a.id == a.id
        assert device.default_stream.id not in (a.id, b.id)


def test_bad_host_functions_are_refused() -> None:
    with hcclpy.Device(0).create_stream() as stream:
        with pytest.raises(TypeError, match="fn must be a callable taking no argument, got int"):
            stream.launch_host_func(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="closed"):
        stream.launch_host_func(lambda: None)


def _host_function_after_a_collective(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        with comm.device.create_stream() as stream:
            x = hcclpy.from_numpy(np.full(4, rank + 1.0, np.float32), device=comm.device)
            if rank == 1:
                time.sleep(0.3)  # rank 0's all_reduce cannot complete before this rank joins it
            called = time.monotonic()
            comm.all_reduce(x, stream=stream)
            ran: List[float] = []
            stream.launch_host_func(lambda: ran.append(time.monotonic()))
            stream.synchronize()
            return {"called": called, "ran": ran[0], "result": x.to_numpy().tolist()}
    finally:
        comm.destroy()


def test_a_host_function_runs_after_the_collective_queued_before_it() -> None:
    first, second = ranks.run_threads(_host_function_after_a_collective, 2)
    assert first["result"] == second["result"] == [3.0] * 4
    # Rank 0's host function waited for the all_reduce, which waited for rank 1's call.
    assert first["ran"] >= second["called"], (first, second)


def test_peer_access_between_two_devices() -> None:
    first, second = hcclpy.Device(0), hcclpy.Device(1)
    assert first.can_access_peer(second) and second.can_access_peer(0)
    first.enable_peer_access(second)
    try:
        with pytest.raises(hcclpy.AclError, match="already enabled"):
            first.enable_peer_access(1)
    finally:
        first.disable_peer_access(second)
    with pytest.raises(hcclpy.AclError, match="already disabled"):
        first.disable_peer_access(second)
    with pytest.raises(ValueError, match="peer=0 is this device"):
        first.can_access_peer(0)
