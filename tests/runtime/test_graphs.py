"""Graphs (``Stream.capture``): work recorded once and replayed N times gives what running it N
times gives, on every rank; streams joined by events; task groups updated in place; what a
capture refuses (NumPy arrays, other streams in a global capture, groups, synchronisations) and
what a replay refuses (a destroyed communicator); graphs hold their buffers; a rank that does not
replay is named, and the replay's work after the failed collective does not run."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hcclpy
import ranks

N = 16

# One step of a program: (kind, argument); every step changes `x` in place, reading what the
# steps before it wrote, so a replay that ran a step twice, skipped one or reordered them shows.
STEPS = st.lists(st.sampled_from([("all_reduce", "sum"), ("all_reduce", "max"), ("broadcast", 0),
                                  ("scale", None), ("host", None), ("persistent", None)]),
                 min_size=1, max_size=5)


def _run_program(comm: hcclpy.Communicator, stream: hcclpy.Stream, x: hcclpy.DeviceArray, tmp: hcclpy.DeviceArray,
                 steps: List[Any], calls: List[int], persistent: Any) -> None:
    for kind, argument in steps:
        if kind == "all_reduce":
            comm.all_reduce(x, op=argument, stream=stream)
        elif kind == "broadcast":
            comm.broadcast(x, root=argument, stream=stream)
        elif kind == "scale":  # x += x, through a device-to-device copy and a reduction of one rank
            tmp.copy_from(x, stream=stream)
            x.copy_from(tmp, stream=stream)
        elif kind == "host":
            stream.launch_host_func(lambda: calls.append(1))
        else:
            persistent.start()


def _replayed_equals_eager(rank: int, size: int, info: bytes, steps: List[Any], times: int) -> None:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        stream = comm.device.create_stream()
        start = np.arange(N, dtype=np.float32) + rank
        eager, graphed = (hcclpy.from_numpy(start, device=rank) for _ in range(2))
        tmp = hcclpy.zeros(N, "float32", device=rank)
        eager_calls: List[int] = []
        graph_calls: List[int] = []
        with comm.all_reduce_init(eager, op="sum", stream=stream) as persistent:
            for _ in range(times):
                _run_program(comm, stream, eager, tmp, steps, eager_calls, persistent)
        with comm.all_reduce_init(graphed, op="sum", stream=stream) as persistent:
            # Thread-local: the other ranks are threads of this process, and a global capture
            # forbids their synchronous copies (as CANN's does).
            with stream.capture(mode="thread_local") as graph:
                _run_program(comm, stream, graphed, tmp, steps, graph_calls, persistent)
            assert graph_calls == [] and np.array_equal(graphed.to_numpy(), start)  # recorded, not run
            for _ in range(times):
                graph.replay()
        stream.synchronize()
        np.testing.assert_array_equal(graphed.to_numpy(), eager.to_numpy())
        assert len(graph_calls) == len(eager_calls)
        graph.close()
        stream.close()


@settings(max_examples=8, deadline=None)
@given(steps=STEPS, times=st.integers(1, 3))
@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_replayed_program_equals_the_program_run_as_often(size: int, steps: List[Any], times: int) -> None:
    ranks.run("threads", _replayed_equals_eager, size, steps, times)


def _captured_all_reduce_in_processes(rank: int, size: int, info: bytes) -> List[float]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        stream = comm.device.create_stream()
        x = hcclpy.zeros(4, "float32", device=rank)
        with stream.capture() as graph:
            comm.all_reduce(x, stream=stream)
        sums = []
        for k in range(1, 4):
            x.copy_from(np.full(4, k * (rank + 1), np.float32), stream=stream)
            graph.replay()
            sums.append(float(x.to_numpy()[0]))  # reading waits for the replay
        graph.close()
        stream.close()
        return sums


def test_every_rank_replays_its_graph_in_processes() -> None:
    size = 2
    total = size * (size + 1) // 2
    assert ranks.run_processes(_captured_all_reduce_in_processes, size) == [[k * total for k in (1, 2, 3)]] * size


_SECOND_REPLAY_SEEN = threading.Event()


def _rank_1_replays_once(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    """Both ranks replay a graph of an all_reduce and a host function once; then rank 0 alone
    replays it again, while rank 1 keeps the communicator until rank 0 has seen that fail."""
    # The stream is closed before the test ends: a failed stream left open would fail a later
    # test's device-wide synchronize in this process.
    with hcclpy.Communicator(size, info, rank, config={"exec_timeout": 1}, device=rank) as comm, \
            comm.device.create_stream() as stream:
        x = hcclpy.from_numpy(np.ones(N, np.float32), device=rank)
        ran: List[int] = []
        with stream.capture(mode="thread_local") as graph:
            comm.all_reduce(x, stream=stream)
            stream.launch_host_func(lambda: ran.append(1))
        try:
            graph.replay()
            stream.synchronize(timeout=30)
            if rank == 1:
                assert _SECOND_REPLAY_SEEN.wait(60), "rank 0 never saw its second replay fail"
                return {}
            try:
                graph.replay()
                with pytest.raises(hcclpy.CommTimeoutError) as failure:
                    stream.synchronize(timeout=30)
            finally:
                _SECOND_REPLAY_SEEN.set()
            return {"message": str(failure.value), "host functions": len(ran)}
        finally:
            graph.close()


@pytest.mark.timeout(120)
def test_a_rank_that_does_not_replay_is_named() -> None:
    _SECOND_REPLAY_SEEN.clear()
    first, _ = ranks.run_threads(_rank_1_replays_once, 2, timeout=90)
    assert "all_reduce #2 timed out after 1 s (HCCL_EXEC_TIMEOUT / hcclExecTimeOut): waiting for rank(s) 1" in \
        first["message"], first
    assert first["host functions"] == 1, first  # the second replay's, after the failed all_reduce, did not run


@pytest.fixture()
def comm() -> Any:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as c:
        yield c


def test_streams_joined_by_events_are_recorded_and_replayed(comm: hcclpy.Communicator) -> None:
    main, side = comm.device.create_stream(), comm.device.create_stream()
    a = hcclpy.from_numpy(np.ones(N, np.float32), device=0)
    b = hcclpy.zeros(N, "float32", device=0)
    with main.capture() as graph:
        forked = main.record()
        side.wait_event(forked)  # side joins the capture
        b.copy_from(a, stream=side)
        joined = side.record()
        main.wait_event(joined)  # and is joined back
        comm.all_reduce(b, stream=main)
    assert np.array_equal(b.to_numpy(), np.zeros(N))
    a.copy_from(np.full(N, 5, np.float32))
    graph.replay()
    main.synchronize()
    assert np.array_equal(b.to_numpy(), np.full(N, 5))
    graph.close()
    for stream in (main, side):
        stream.close()


def test_a_task_group_is_pointed_at_other_buffers(comm: hcclpy.Communicator) -> None:
    stream, other = comm.device.create_stream(), comm.device.create_stream()
    a = hcclpy.from_numpy(np.full(N, 2, np.float32), device=0)
    b = hcclpy.from_numpy(np.full(N, 3, np.float32), device=0)
    out = hcclpy.zeros(N, "float32", device=0)
    with stream.capture() as graph:
        with graph.group() as step:
            comm.all_reduce(a, out, stream=stream)
    graph.replay()
    assert np.array_equal(out.to_numpy(), np.full(N, 2))
    with step.update(other):
        comm.all_reduce(b, out, stream=other)  # replaces the group's all-reduce, not run
    other.synchronize()
    assert np.array_equal(out.to_numpy(), np.full(N, 2))
    graph.replay()
    assert np.array_equal(out.to_numpy(), np.full(N, 3))
    with pytest.raises(hcclpy.AclError):  # an update replaces each task with one of its kind
        with step.update(other):
            other.launch_host_func(lambda: None)
    graph.replay()
    assert np.array_equal(out.to_numpy(), np.full(N, 3))
    graph.close()
    stream.close()
    other.close()


def test_what_a_capture_refuses(comm: hcclpy.Communicator) -> None:
    stream, other = comm.device.create_stream(), comm.device.create_stream()
    x = hcclpy.zeros(N, "float32", device=0)
    with stream.capture() as graph:
        with pytest.raises(RuntimeError, match="on NumPy arrays cannot run inside a capture"):
            comm.all_reduce(np.ones(N, np.float32))
        with pytest.raises(RuntimeError, match="does not capture, during a global-mode capture"):
            comm.all_reduce(x, stream=other)
        with pytest.raises(RuntimeError, match="cannot nest"):
            with hcclpy.group():
                pass
        with pytest.raises(ValueError, match="capturing already"):
            stream.capture()
        with pytest.raises(ValueError, match="still capturing"):
            graph.replay()
        comm.all_reduce(x, stream=stream)
    graph.close()
    with stream.capture(mode="relaxed") as relaxed:
        comm.all_reduce(x, stream=other)  # relaxed: other streams run as usual
    relaxed.close()
    other.synchronize()

    with pytest.raises(hcclpy.AclError) as caught:
        with stream.capture() as spoiled:
            comm.all_reduce(x, stream=stream)
            with pytest.raises(hcclpy.AclError, match="capturing"):
                stream.synchronize()
    assert "invalidated" in str(caught.value) and spoiled.closed
    with pytest.raises(ValueError, match="must be one of 'global', 'thread_local', 'relaxed'"):
        stream.capture(mode="loose")
    stream.close()
    other.close()


def test_a_graph_refuses_to_replay_without_its_communicator() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    stream = comm.device.create_stream()
    x = hcclpy.zeros(N, "float32", device=0)
    with stream.capture() as graph:
        comm.all_reduce(x, stream=stream)
    graph.replay()
    stream.synchronize()
    comm.destroy()
    with pytest.raises(ValueError, match="was destroyed: the graph cannot run"):
        graph.replay()
    graph.close()
    graph.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        graph.replay()
    stream.close()


def test_a_graph_holds_its_buffers(comm: hcclpy.Communicator) -> None:
    stream = comm.device.create_stream()
    x = hcclpy.from_numpy(np.full(N, 4, np.float32), device=0)
    address = x.ptr
    with stream.capture() as graph:
        comm.all_reduce(x, stream=stream)
    x.close()  # freed once the graph lets go of it
    assert hcclpy.pointer_attributes(address).location == "device"
    graph.replay()
    stream.synchronize()
    graph.close()
    hcclpy.zeros(1, "float32", device=0).close()  # (an allocation frees what is no longer held)
    assert hcclpy.pointer_attributes(address).location == "unregistered"
    stream.close()
