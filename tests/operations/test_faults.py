"""A rank is killed in the middle of an operation: every survivor raises within the exec timeout
plus a second, with an error naming the dead rank (or a timeout), then builds a new communicator
among the survivors and keeps working. And ``comm.abort()`` releases a rank stuck in a collective.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest

import hcclpy
import ranks

EXEC_TIMEOUT = 5.0
SHORT = {"HCCL_EXEC_TIMEOUT": str(int(EXEC_TIMEOUT)), "HCCL_CONNECT_TIMEOUT": "30"}
SIZE = 3
VICTIM = SIZE - 1
KILLED_AT = 5  # iteration during which the victim dies, with its part of the operation queued


def _operation(name: str, comm: hcclpy.Communicator, stream: hcclpy.Stream) -> Callable[[], None]:
    """Queue one step of ``name`` on ``stream`` (buffers made once)."""
    rank, size = comm.rank, comm.size
    device = comm.device
    if name == "all_reduce":
        x, y = hcclpy.from_numpy(np.ones(4096, np.float32), device=device), hcclpy.empty(4096, "float32", device=device)
        return lambda: comm.all_reduce(x, y, "sum", stream=stream)
    if name == "broadcast":
        b = hcclpy.from_numpy(np.full(4096, rank, np.float32), device=device)
        return lambda: comm.broadcast(b, 0, stream=stream)
    if name == "all_to_all_v":
        send_counts = [(j + rank) % size + 1 for j in range(size)]
        recv_counts = [(rank + i) % size + 1 for i in range(size)]
        s = hcclpy.from_numpy(np.ones(sum(send_counts), np.int32), device=device)
        r = hcclpy.empty(sum(recv_counts), "int32", device=device)
        return lambda: comm.all_to_all_v(s, r, send_counts, recv_counts, stream=stream)
    # send/recv: every survivor sends to the victim, which receives from each in turn
    buf = hcclpy.from_numpy(np.ones(1024, np.float64), device=device)
    if rank == VICTIM:
        def receive_all() -> None:
            for peer in range(size - 1):
                comm.recv(buf, peer, stream=stream)
        return receive_all
    return lambda: comm.send(buf, VICTIM, stream=stream)


def _survive(rank: int, size: int, info: bytes, name: str, directory: str) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    step = _operation(name, comm, stream)
    error, elapsed = None, 0.0
    for i in range(100_000):
        started = time.monotonic()
        step()
        if rank == VICTIM and i == KILLED_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            stream.synchronize()
        except hcclpy.HcclpyError as exc:
            error, elapsed = exc, time.monotonic() - started
            break
    result: Dict[str, Any] = {"error": repr(error), "elapsed": elapsed,
                              "category": "remote" if isinstance(error, hcclpy.RemoteRankError)
                              else "timeout" if isinstance(error, hcclpy.CommTimeoutError) else "other",
                              "async_error": repr(comm.async_error())}
    comm.destroy()
    try:
        stream.close()
    except hcclpy.AclError:  # the failed stream reports its failure once more
        pass
    # A new communicator among the survivors: survivor 0 publishes the root info in a file.
    survivors = size - 1
    path = Path(directory) / "survivors.rootinfo"
    if rank == 0:
        info_bytes = hcclpy.RootInfo.generate(device=rank).to_bytes()
        (Path(directory) / "partial").write_bytes(info_bytes)
        os.replace(Path(directory) / "partial", path)
    else:
        deadline = time.monotonic() + 30
        while not path.exists():
            assert time.monotonic() < deadline, "no root info from survivor 0"
            time.sleep(0.01)
        info_bytes = path.read_bytes()
    with hcclpy.Communicator(survivors, info_bytes, rank, device=rank) as again:
        result["after"] = again.all_reduce(np.array([rank + 1.0])).tolist()
    return result


def _dev_shm() -> List[str]:
    return ranks.simulator_shm()


@pytest.mark.parametrize("name", ["all_reduce", "all_to_all_v", "broadcast", "send_recv"])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_survivors_of_a_killed_rank_raise_then_carry_on(name: str, tmp_path: Any) -> None:
    before = _dev_shm()
    out = ranks.run_processes(_survive, SIZE, name, str(tmp_path), env=SHORT, timeout=90, return_exceptions=True)
    dead = out[VICTIM]
    assert isinstance(dead, ranks.RankError) and dead.exitcode == -signal.SIGKILL, dead
    for rank in range(VICTIM):
        res = out[rank]
        assert not isinstance(res, ranks.RankError), res.text
        assert res["elapsed"] <= EXEC_TIMEOUT + 1.0, res
        if res["category"] == "remote":
            assert f"rank {VICTIM}" in res["error"], res["error"]
        else:
            assert res["category"] == "timeout", res
        assert res["async_error"] != "None", res
        assert res["after"] == [float(sum(range(1, SIZE)))]
    # Nothing named outlives the job: device memory and control segments are memfds.
    assert _dev_shm() == before


def _abort(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    x = hcclpy.from_numpy(np.ones(16, np.float32), device=comm.device)
    result: Dict[str, Any] = {}
    if rank == 0:
        # Rank 1 is not there yet: this all_reduce would wait for the exec timeout.
        comm.all_reduce(x, None, "sum", stream=stream)
        threading.Timer(0.5, comm.abort).start()
        started = time.monotonic()
        try:
            stream.synchronize()
        except hcclpy.HcclpyError as exc:
            result["released"] = str(exc)
        result["seconds"] = time.monotonic() - started
        result["async_error"] = comm.async_error().name
        try:
            comm.all_reduce(x, None, "sum", stream=hcclpy.Device(rank).create_stream())
        except ValueError as exc:  # refused before any C call
            result["refused"] = str(exc)
    else:
        time.sleep(1.5)  # after rank 0 aborted
        started = time.monotonic()
        try:  # refused when queued (the communicator is known to be broken) or failed when run
            comm.all_reduce(x, None, "sum", stream=stream)
            stream.synchronize()
        except hcclpy.HcclpyError as exc:
            result["peer_error"] = str(exc)
            result["remote"] = isinstance(exc, hcclpy.RemoteRankError)
        result["seconds"] = time.monotonic() - started
    comm.destroy()
    return result


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_abort_releases_a_rank_stuck_in_a_collective() -> None:
    first, second = ranks.run_processes(_abort, 2, env={"HCCL_EXEC_TIMEOUT": "60"}, timeout=90)
    assert "HcclCommSuspend" in first["released"] and first["seconds"] < 10, first
    assert first["async_error"] == "HCCL_E_SUSPENDING" and "was aborted (Communicator.abort())" in first["refused"]
    assert second["remote"] and "rank 0" in second["peer_error"] and second["seconds"] < 10, second


_LATE_CALL_SEEN = threading.Event()


def _late_call(rank: int, size: int, info: bytes, kind: str) -> Dict[str, Any]:
    """Both ranks make one collective and one send/recv pair; then rank 0 alone makes one more
    ``kind`` call, which times out, while rank 1 keeps the communicator until rank 0 has seen it."""
    # The stream is closed before the test ends: a failed stream left open would fail a later
    # test's device-wide synchronize in this process.
    with hcclpy.Communicator(size, info, rank, config={"exec_timeout": 1}, device=rank) as comm, \
            comm.device.create_stream() as stream:
        x = hcclpy.from_numpy(np.ones(4, np.float32), device=rank)
        comm.all_reduce(x, stream=stream)
        (comm.send if rank == 0 else comm.recv)(x, 1 - rank, stream=stream)
        stream.synchronize()
        if rank == 1:
            assert _LATE_CALL_SEEN.wait(60), "rank 0 never saw its late call fail"
            return {}
        try:
            (comm.all_reduce(x, stream=stream) if kind == "collective" else comm.send(x, 1, stream=stream))
            with pytest.raises(hcclpy.CommTimeoutError) as failure:
                stream.synchronize(timeout=30)
        finally:
            _LATE_CALL_SEEN.set()
        late = hcclpy.trace.records(comm)[-1]
        return {"message": str(failure.value), "label": hcclpy.trace.label(late)}


@pytest.mark.parametrize("kind", ["collective", "p2p"])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_timeout_names_the_operation_by_its_flight_recorder_number(kind: str) -> None:
    """The simulator numbers collectives apart from point-to-point calls, as the flight recorder
    does, so the number in a timeout is the one ``hcclpy trace`` shows."""
    _LATE_CALL_SEEN.clear()
    first, _ = ranks.run_threads(_late_call, 2, kind, timeout=90)
    expected = "all_reduce #2" if kind == "collective" else "send p2p #2"
    assert f"{expected} timed out after 1 s" in first["message"], first
    assert first["label"].startswith("#2 all_reduce" if kind == "collective" else "p2p #2 send"), first
    assert "deadlock" not in first["message"], first  # rank 1 waits in no send of its own


def _both_send_first(rank: int, size: int, info: bytes) -> str:
    with hcclpy.Communicator(size, info, rank, config={"exec_timeout": 1}, device=rank) as comm, \
            comm.device.create_stream() as stream:
        x = hcclpy.from_numpy(np.ones(4, np.float32), device=rank)
        comm.send(x, 1 - rank, stream=stream)
        comm.recv(x, 1 - rank, stream=stream)
        with pytest.raises(hcclpy.CommTimeoutError) as failure:
            stream.synchronize(timeout=30)
        return str(failure.value)


@pytest.mark.timeout(120)
def test_a_send_send_deadlock_is_named_as_such() -> None:
    for rank, message in enumerate(ranks.run_threads(_both_send_first, 2, timeout=90)):
        # The rank that timed out first explains; the other reports its failure.
        timed_out = 1 - rank if "failed first" in message else rank
        assert (f"send p2p #1 timed out after 1 s (HCCL_EXEC_TIMEOUT / hcclExecTimeOut): waiting for rank(s) "
                f"{1 - timed_out}; rank {1 - timed_out} is itself waiting for rank {timed_out} to receive a send: "
                "both ranks send before they receive (a send/send deadlock)") in message, message
