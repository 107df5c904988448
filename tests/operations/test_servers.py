"""Ranks on several simulated servers: each server's ranks share memory, servers talk over TCP
(HCCLPY_SIM_SERVER puts several servers on this machine). Every operation against the NumPy
reference on even and uneven layouts; mismatches, dead ranks and silent peers reported on every
server."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import hcclpy
import ranks
from test_binding_ops import OPERATIONS, exercise

LAYOUTS = {
    "2x2": ["a", "a", "b", "b"],
    "1+2+3": ["a", "b", "b", "c", "c", "c"],
}


def _assert_clean(results: List[Dict[str, Any]]) -> None:
    problems = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not problems, f"{len(problems)} mismatch(es):\n" + "\n".join(problems[:40])
    assert all(res["checks"] > 0 for res in results)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.timeout(300)
def test_every_operation_across_servers(layout: str) -> None:
    servers = LAYOUTS[layout]
    _assert_clean(ranks.run_processes(exercise, len(servers), OPERATIONS, timeout=240, servers=servers))


def _servers_seen(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        x = hcclpy.from_numpy(np.full(5, rank + 1, dtype=np.int64), device=rank)
        comm.all_reduce(x, op="prod")
        return {"size": comm.size, "rank": comm.rank, "result": x.to_numpy().tolist()}
    finally:
        comm.destroy()


def test_numbering_follows_the_ranks_not_the_servers() -> None:
    # Servers interleaved: ranks 0 and 2 on one, 1 and 3 on the other.
    results = ranks.run_processes(_servers_seen, 4, timeout=60, servers=["x", "y", "x", "y"])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["result"] == [24] * 5 for r in results)


def _mismatched(rank: int, size: int, info: bytes) -> str:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    count = 7 if rank == size - 1 else 6
    x = hcclpy.from_numpy(np.ones(count, dtype=np.float32), device=rank)
    comm.all_reduce(x, op="sum")
    hcclpy.Device(rank).synchronize()
    return "no error"


def test_mismatch_across_servers_is_named() -> None:
    outcomes = ranks.run_processes(_mismatched, 4, timeout=60, servers=["a", "a", "b", "b"],
                                   env={"HCCL_EXEC_TIMEOUT": "10"}, return_exceptions=True)
    assert all(isinstance(o, ranks.RankError) for o in outcomes), outcomes
    texts = [o.traceback for o in outcomes]
    # Every rank, on either server, says what differed and which call each side made.
    assert all("collective mismatch" in t and "count=7" in t and "count=6" in t for t in texts), texts
    assert all(isinstance(o.exception, hcclpy.CollectiveMismatchError) for o in outcomes), texts


def _one_dies(rank: int, size: int, info: bytes, victim: int, how: str) -> str:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    x = hcclpy.from_numpy(np.ones(1 << 16, dtype=np.float32), device=rank)
    comm.all_reduce(x, op="sum")
    hcclpy.Device(rank).synchronize()
    if rank == victim:
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(8)  # stops reading: the others' execution timeout (2 s) passes first
        return "slept"
    started = time.monotonic()
    try:
        comm.all_reduce(x, op="sum")
        hcclpy.Device(rank).synchronize()
    except hcclpy.HcclpyError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.1f} s: {exc}"
    return "no error"


@pytest.mark.parametrize("how", ["killed", "silent"])
@pytest.mark.parametrize("victim", [1, 3])
def test_a_lost_rank_fails_every_server(how: str, victim: int) -> None:
    outcomes = ranks.run_processes(_one_dies, 4, victim, how, timeout=60, servers=["a", "a", "b", "b"],
                                   env={"HCCL_EXEC_TIMEOUT": "2"}, return_exceptions=True)
    survivors = [o for r, o in enumerate(outcomes) if r != victim]
    assert all(isinstance(o, str) and "Error after" in o for o in survivors), outcomes
    if how == "silent":
        assert any("Timeout" in o for o in survivors), survivors


def _from_table(rank: int, size: int, info: bytes, path: str) -> List[int]:
    comm = hcclpy.Communicator.from_rank_table(path, rank, device=rank % 2)
    try:
        x = hcclpy.from_numpy(np.arange(6, dtype=np.int32) * (rank + 1), device=rank % 2)
        comm.all_reduce(x, op="sum")
        return x.to_numpy().tolist()
    finally:
        comm.destroy()


def test_rank_table_of_two_servers(tmp_path: Any) -> None:
    # Two servers at two loopback addresses, each with devices 0 and 1; rank 0 serves the
    # bootstrap at its server_id and HCCL_IF_BASE_PORT.
    import json

    from hcclpy.cli.run import free_port

    table = {"status": "completed", "version": "1.0", "server_count": "2", "server_list": [
        {"server_id": f"127.0.0.{s + 1}", "device": [
            {"device_id": str(d), "device_ip": f"192.168.{s}.{d}", "rank_id": str(2 * s + d)} for d in range(2)]}
        for s in range(2)]}
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(table))
    out = ranks.run_processes(_from_table, 4, str(path), timeout=60,
                              env={"HCCL_IF_BASE_PORT": str(free_port())})
    assert out == [[0, 10, 20, 30, 40, 50]] * 4
