"""A failing peer: one rank process dies in the middle of an all_reduce loop; the survivor gets an
error (not a hang), the communicator reports it, and can still be destroyed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Dict

import numpy as np
import pytest

import hcclpy
import ranks

SHORT = {"HCCL_EXEC_TIMEOUT": "5"}


def _die_in_loop(rank: int, size: int, info: bytes, how: str) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    x = hcclpy.from_numpy(np.ones(1024, np.float32))
    y = hcclpy.empty(1024, "float32")
    started = time.monotonic()
    for i in range(100_000):
        if rank == size - 1 and i == 25:
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(x, y, "sum", stream=stream)
        try:
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            failed_at, error = i, exc
            break
    else:
        return {"error": None}
    async_error = comm.async_error()
    result = {
        "error": error,
        "failed_at": failed_at,
        "seconds": time.monotonic() - started,
        "is_acl": isinstance(error, hcclpy.AclError),
        "is_remote_or_timeout": isinstance(error, (hcclpy.RemoteRankError, hcclpy.CommTimeoutError)),
        "async_error": async_error,
        "async_is_hccl": isinstance(async_error, hcclpy.HcclError),
    }
    # The stream stays failed; the communicator can still be torn down.
    comm.destroy()
    result["destroyed"] = comm.destroyed
    try:
        stream.close()
    except hcclpy.AclError:
        pass
    return result


@pytest.mark.parametrize("how", ["exit", "sigkill"])
@pytest.mark.timeout(90)
@pytest.mark.slow
def test_survivor_gets_remote_error_and_can_destroy(how: str) -> None:
    out = ranks.run_processes(_die_in_loop, 2, how, env=SHORT, timeout=60, return_exceptions=True)
    survivor, dead = out
    assert isinstance(dead, ranks.RankError) and dead.exitcode == (3 if how == "exit" else -signal.SIGKILL)
    assert not isinstance(survivor, ranks.RankError), survivor.traceback
    assert survivor["error"] is not None, "the survivor never saw an error"
    assert survivor["failed_at"] >= 25
    assert survivor["is_acl"] and survivor["is_remote_or_timeout"], repr(survivor["error"])
    assert str(survivor["error"]).startswith("aclrtSynchronizeStreamWithTimeout failed: ")
    assert survivor["async_is_hccl"], repr(survivor["async_error"])
    assert survivor["async_error"].name in ("HCCL_E_REMOTE", "HCCL_E_TIMEOUT")
    assert survivor["destroyed"]
    # Died-peer detection, not the 5 s HCCL_EXEC_TIMEOUT (generous bound for a loaded CI box).
    assert survivor["seconds"] < 30


def _event_after_a_failure(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    x = hcclpy.from_numpy(np.ones(4, np.float32), device=rank)
    event = hcclpy.Device(rank).create_event()
    try:
        comm.all_reduce(x, stream=stream)  # completes: the event's record must not count it as failed
        stream.synchronize()
        if rank == 0:  # a desync: the stream fails on it, before it reaches the record
            comm.all_reduce(x, stream=stream)
        else:
            comm.broadcast(x, 0, stream=stream)
        event.record(stream)
        result: Dict[str, Any] = {}
        for name, call in (("synchronize", event.synchronize), ("query", event.query)):
            try:
                call()
                result[name] = None
            except hcclpy.AclError as exc:
                result[name] = str(exc)
                result[f"{name} is a mismatch"] = isinstance(exc, hcclpy.CollectiveMismatchError)
        health = comm.health()
        result["health"] = (health["last_completed"], health["first_pending"])
        return result
    finally:
        comm.destroy()
        event.close()
        with contextlib.suppress(hcclpy.AclError):  # a failed stream reports its failure on closing too
            stream.close()


@pytest.mark.timeout(60)
def test_an_event_recorded_after_failed_work_reports_the_failure() -> None:
    # The stream fails on the desync; the record after it is reached but never runs that work, so
    # waiting for the event, or asking it, raises the stream's failure as synchronising the stream does.
    for rank, result in enumerate(ranks.run_threads(_event_after_a_failure, 2, timeout=50)):
        for name, api in (("synchronize", "aclrtSynchronizeEventWithTimeout"), ("query", "aclrtQueryEventStatus")):
            message = result[name]
            assert message is not None, f"rank {rank}: Event.{name}() reported success after the failure"
            assert message.startswith(f"{api} failed: ACL_ERROR_RT_AICPU_EXCEPTION (507018): {api}: the stream "
                                      "that recorded the event failed before reaching it: "), message
            assert "collective mismatch" in message, message
            # The event's path reports the desync as the stream's does: CollectiveMismatchError.
            assert result[f"{name} is a mismatch"], message
        # The flight recorder keeps operation #1 done and #2 failed, not completed.
        assert result["health"] == (1, 2), (rank, result["health"])
