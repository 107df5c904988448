"""Ranks that call collectives in a different order or with different signatures are told so, on
every rank, with both sides' calls and one exception type (CollectiveMismatchError), instead of
corrupting data or hanging. tests/operations/test_mismatch.py covers every argument that can differ, on
threads and processes, and what the communicator does afterwards."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import pytest

import hcclpy
import ranks

# What each of two ranks calls: (operation, count, dtype, op or root); and the signatures the
# simulator reports for them.
CASES: Dict[str, Tuple[Tuple[Any, ...], Tuple[Any, ...], str, str]] = {
    "operation": (("all_reduce", 8, "float32", "sum"), ("broadcast", 8, "float32", 0),
                  "all_reduce(count=8, fp32, sum)", "broadcast(count=8, fp32, root=0)"),
    "count": (("all_reduce", 8, "float32", "sum"), ("all_reduce", 16, "float32", "sum"),
              "all_reduce(count=8, fp32, sum)", "all_reduce(count=16, fp32, sum)"),
    "dtype": (("all_reduce", 8, "float32", "sum"), ("all_reduce", 8, "int32", "sum"),
              "all_reduce(count=8, fp32, sum)", "all_reduce(count=8, int32, sum)"),
    "reduce_op": (("all_reduce", 8, "float32", "sum"), ("all_reduce", 8, "float32", "max"),
                  "all_reduce(count=8, fp32, sum)", "all_reduce(count=8, fp32, max)"),
    "root": (("broadcast", 8, "float32", 0), ("broadcast", 8, "float32", 1),
             "broadcast(count=8, fp32, root=0)", "broadcast(count=8, fp32, root=1)"),
    "reduce_root": (("reduce", 4, "int64", 0), ("reduce", 4, "int64", 1),
                    "reduce(count=4, int64, sum, root=0)", "reduce(count=4, int64, sum, root=1)"),
    # At most 16 bytes a rank: the simulator compares one word per rank first (its tiny path).
    "tiny_operation": (("all_reduce", 2, "float32", "sum"), ("broadcast", 2, "float32", 0),
                       "all_reduce(count=2, fp32, sum)", "broadcast(count=2, fp32, root=0)"),
    "tiny_count": (("all_reduce", 2, "float32", "sum"), ("all_reduce", 3, "float32", "sum"),
                   "all_reduce(count=2, fp32, sum)", "all_reduce(count=3, fp32, sum)"),
    "tiny_dtype": (("all_reduce", 2, "float32", "sum"), ("all_reduce", 2, "int32", "sum"),
                   "all_reduce(count=2, fp32, sum)", "all_reduce(count=2, int32, sum)"),
    "tiny_reduce_op": (("all_reduce", 2, "float32", "sum"), ("all_reduce", 2, "float32", "max"),
                       "all_reduce(count=2, fp32, sum)", "all_reduce(count=2, fp32, max)"),
    "tiny_root": (("broadcast", 1, "int64", 0), ("broadcast", 1, "int64", 1),
                  "broadcast(count=1, int64, root=0)", "broadcast(count=1, int64, root=1)"),
    "tiny_and_not": (("all_reduce", 4, "float32", "sum"), ("all_reduce", 5, "float32", "sum"),
                     "all_reduce(count=4, fp32, sum)", "all_reduce(count=5, fp32, sum)"),
}


def _call(comm: hcclpy.Communicator, stream: hcclpy.Stream, call: Tuple[Any, ...]) -> None:
    operation, count, dtype, extra = call
    x = hcclpy.from_numpy(np.ones(count, dtype), device=comm.device)
    if operation == "all_reduce":
        comm.all_reduce(x, None, extra, stream=stream)
    elif operation == "broadcast":
        comm.broadcast(x, extra, stream=stream)
    else:
        comm.reduce(x, None, "sum", extra, stream=stream)
    stream.synchronize()


def _mismatch(rank: int, size: int, info: bytes, case: str) -> Tuple[str, str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    try:
        # One matching operation first: the mismatch is operation #2.
        _call(comm, stream, ("all_reduce", 4, "float32", "sum"))
        _call(comm, stream, CASES[case][rank])
        return "", "no error"
    except hcclpy.CollectiveMismatchError as exc:
        return type(exc).__name__, str(exc)
    except hcclpy.HcclpyError as exc:
        return f"{type(exc).__name__}, not a CollectiveMismatchError", str(exc)
    finally:
        comm.destroy()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.timeout(60)
def test_mismatched_calls_are_reported_on_every_rank(case: str) -> None:
    outcomes = ranks.run("threads", _mismatch, 2, case, timeout=45)
    mine, theirs = CASES[case][2], CASES[case][3]
    for rank, (kind, message) in enumerate(outcomes):
        own, other = (mine, theirs) if rank == 0 else (theirs, mine)
        assert kind == "AclMismatchError", (rank, kind, message)  # from Stream.synchronize
        assert f"operation #2: rank {rank} called {own} but rank {1 - rank} called {other}" in message, message


def _unchecked(rank: int, size: int, info: bytes) -> Any:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        # Same buffers, different reduce ops: undetected without the check; each rank computes
        # its share of the result with its own op.
        return comm.all_reduce(np.full(64, float(rank + 1)), op="sum" if rank == 0 else "max").tolist()
    finally:
        comm.destroy()


@pytest.mark.timeout(90)
def test_the_check_can_be_turned_off() -> None:
    out = ranks.run_processes(_unchecked, 2, env={"HCCLPY_SIM_DESYNC_CHECK": "0"}, timeout=60)
    assert all(len(values) == 64 for values in out)
    assert {3.0, 2.0} >= set(out[0]), out[0]


def _sends_then_mismatch(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    """Rank 0 sends twice and rank 1 receives twice, then both run an all_reduce, then a mismatch."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    x = hcclpy.from_numpy(np.ones(4, np.float32), device=comm.device)
    try:
        for _ in range(2):
            if rank == 0:
                comm.send(x, 1, stream=stream)
            else:
                comm.recv(x, 0, stream=stream)
        _call(comm, stream, ("all_reduce", 4, "float32", "sum"))
        _call(comm, stream, CASES["operation"][rank])
        return {"message": "no error"}
    except hcclpy.HcclpyError as exc:
        failed = [r for r in hcclpy.trace.records(comm) if r["state"] == "failed"]
        return {"message": str(exc), "failed": [(r["op"], r["seq"]) for r in failed]}
    finally:
        stream.close()
        comm.destroy()


@pytest.mark.timeout(60)
def test_the_reported_operation_number_is_the_flight_recorders() -> None:
    """The simulator numbers collectives only, and so does the recorder: sends and receives before
    a mismatch do not shift the number it is reported at."""
    out = ranks.run("threads", _sends_then_mismatch, 2, timeout=45)
    for rank, result in enumerate(out):
        assert "operation #2: rank" in result["message"], result
        assert result["failed"] == [(CASES["operation"][rank][0], 2)], result


def _send_recv_sizes_differ(rank: int, size: int, info: bytes) -> Tuple[bool, str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    try:
        x = hcclpy.from_numpy(np.ones(3, np.float32), device=comm.device)
        (comm.send(x, 1, stream=stream) if rank == 0 else comm.recv(x, 0, stream=stream))  # one that matches
        stream.synchronize()
        if rank == 0:
            comm.send(hcclpy.from_numpy(np.ones(4, np.float32), device=comm.device), 1, stream=stream)
        else:
            comm.recv(x, 0, stream=stream)
        stream.synchronize()
        return False, "no error"
    except hcclpy.HcclpyError as exc:
        return isinstance(exc, hcclpy.CollectiveMismatchError), str(exc)
    finally:
        comm.destroy(timeout=10)


@pytest.mark.timeout(60)
def test_a_send_and_a_receive_of_different_sizes_are_both_told_both_sizes() -> None:
    # The sender was told only "a receive of a different size or type", with no operation number.
    (sender_mismatch, sender), (receiver_mismatch, receiver) = ranks.run("threads", _send_recv_sizes_differ, 2,
                                                                        timeout=45)
    # Not collectives: a plain AclError / HcclError (CollectiveMismatchError's documentation says so).
    assert not sender_mismatch and not receiver_mismatch, (sender, receiver)
    assert "send p2p #2: rank 0 sent 4 fp32 to rank 1" in sender and "rank 1 posted a receive of 3 fp32" in sender, \
        sender
    assert "recv p2p #2: rank 0 sent 4 fp32 to rank 1" in receiver and "rank 1 posted a receive of 3 fp32" in \
        receiver, receiver
