"""The newer CANN runtime surface in the binding: host functions on streams
(``Stream.launch_host_func``: stream order, with collectives too, exceptions raised in them),
``Stream.query``, ``Stream.id``, peer access between devices; bad arguments."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---------------------------------------------------------------- failure modes and op timeouts

def _later_work_after_a_failed_wait(mode: Any) -> List[str]:
    """Fail a stream with a wait for an event that outlasts set_op_wait_timeout, then return
    what its host function queued after the wait did."""
    device = hcclpy.Device(0)
    with device.create_stream() as blocked, device.create_stream() as waiter:
        if mode is not None:
            waiter.set_failure_mode(mode)
        gate, entered, ran = threading.Event(), threading.Event(), []
        blocked.launch_host_func(lambda: (entered.set(), gate.wait(30)))
        # Running on the stream's worker: a thread that synchronises a stream may run its work.
        assert entered.wait(10)
        event = blocked.record()
        hcclpy.set_op_wait_timeout(1)
        try:
            waiter.wait_event(event)
            waiter.launch_host_func(lambda: ran.append("after the wait"))
            with pytest.raises(hcclpy.AclError, match="aclrtSetOpWaitTimeout"):
                waiter.synchronize()
        finally:
            hcclpy.set_op_wait_timeout(0)
            gate.set()
        blocked.synchronize()
        event.close()
        with pytest.raises(hcclpy.AclError):  # the failure stays with the stream
            waiter.synchronize()
        return ran


@pytest.mark.parametrize("mode, runs", [("continue", True), ("stop", False), (None, False)])
def test_a_failed_stream_runs_its_later_work_in_continue_mode_only(mode: Any, runs: bool) -> None:
    assert _later_work_after_a_failed_wait(mode) == (["after the wait"] if runs else [])


def test_failure_modes_and_timeouts_refuse_bad_values() -> None:
    with hcclpy.Device(0).create_stream() as stream:
        for bad in ("Stop", 1, None):
            with pytest.raises(ValueError, match=r"must be 'continue' or 'stop'"):
                stream.set_failure_mode(bad)  # type: ignore[arg-type]
        stream.set_failure_mode("stop")
        with pytest.raises(hcclpy.AclError, match="once per stream"):
            stream.set_failure_mode("continue")
    for setter in (hcclpy.set_op_wait_timeout, hcclpy.set_op_execute_timeout):
        for bad in (-1, 2**32, 1.5, True, "10"):
            with pytest.raises(ValueError, match="whole number of seconds from 0 to 4294967295"):
                setter(bad)  # type: ignore[arg-type]
    hcclpy.set_op_execute_timeout(30)
    hcclpy.set_op_execute_timeout(0)


# ---------------------------------------------------------------- pointer attributes, host registration

def test_pointer_attributes_tell_where_memory_is() -> None:
    on_device = hcclpy.zeros(16, "float32", device=1)
    found = hcclpy.pointer_attributes(on_device)
    assert (found.location, found.id) == ("device", 1) and found.page_size > 0
    assert hcclpy.pointer_attributes(on_device.ptr + 8).location == "device"
    assert hcclpy.pointer_attributes(hcclpy.pinned_empty(16)).location == "host"
    assert hcclpy.pointer_attributes(np.zeros(16)) == hcclpy.PointerAttributes("unregistered", 0, 0)
    for bad in (None, 0, -5, True, "0x10"):
        with pytest.raises(TypeError, match="must be a DeviceArray, a NumPy array or an address"):
            hcclpy.pointer_attributes(bad)  # type: ignore[arg-type]


def test_host_registration_lets_the_device_reach_host_memory() -> None:
    host = hcclpy.pinned_empty(4096, "uint8")  # one page, page-aligned
    plain = np.zeros(1 << 16, np.uint8)
    aligned = plain[-plain.__array_interface__["data"][0] % 4096:][:8192]
    with hcclpy.register_host(aligned) as registered:
        assert registered.device_address != 0 and registered.array is aligned
        assert hcclpy.pointer_attributes(aligned[100:]).location == "host"
        with pytest.raises(hcclpy.AclError, match="overlap"):
            hcclpy.register_host(aligned[4096:])
    assert registered.closed and "closed" in repr(registered)
    registered.close()  # idempotent
    assert hcclpy.pointer_attributes(aligned).location == "unregistered"
    with pytest.raises(ValueError, match="the host registration is closed"):
        registered.device_address
    hcclpy.register_host(host).close()
    for bad, why in ((aligned[1:], "not on a 4096-byte page"), (aligned[:0], "is empty"),
                     (aligned[::2], "not C-contiguous")):
        with pytest.raises(ValueError, match=why):
            hcclpy.register_host(bad)
    read_only = aligned.view()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        hcclpy.register_host(read_only)
    with pytest.raises(TypeError, match="must be a numpy.ndarray"):
        hcclpy.register_host([1, 2])  # type: ignore[arg-type]


# ---------------------------------------------------------------- 2-D copies

@settings(max_examples=25, deadline=None)
@given(rows=st.integers(2, 7), columns=st.integers(1, 9), data=st.data(), on_stream=st.booleans())
def test_host_rows_apart_are_copied_in_one_2d_copy(rows: int, columns: int, data: Any, on_stream: bool) -> None:
    # A block of columns of a larger host array: rows each contiguous, a pitch apart.
    start = data.draw(st.integers(0, 3))
    big = np.arange(rows * (columns + 4), dtype=np.float32).reshape(rows, columns + 4)
    block = big[:, start:start + columns]
    assert not block.flags.c_contiguous
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        array = hcclpy.empty((rows, columns), "float32", device=device)
        array.copy_from(block, stream=stream if on_stream else None)
        stream.synchronize()
        assert np.array_equal(array.to_numpy(), block)
        target = np.full((rows, columns + 4), -1, np.float32)
        array.copy_to(target[:, start:start + columns], stream=stream if on_stream else None)
        stream.synchronize()
        expected = np.full_like(target, -1)
        expected[:, start:start + columns] = block
        assert np.array_equal(target, expected)  # the elements between the rows untouched
        array.close()


def test_host_arrays_that_are_not_rows_apart_are_still_refused_on_a_stream() -> None:
    device = hcclpy.Device(0)
    with device.create_stream() as stream:
        array = hcclpy.empty((4, 3), "float32", device=device)
        columns_apart = np.zeros((4, 6), np.float32)[:, ::2]  # no row is contiguous
        with pytest.raises(ValueError, match="rows that are each contiguous"):
            array.copy_from(columns_apart, stream=stream)
        with pytest.raises(ValueError, match="rows that are each contiguous"):
            array.copy_to(columns_apart)
        array.copy_from(columns_apart)  # now: through a contiguous copy
        array.close()
