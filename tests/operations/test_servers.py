"""Ranks on several simulated servers: each server's ranks share memory, servers talk over TCP
(HCCLPY_SIM_SERVER puts several servers on this machine). Every operation against the NumPy
reference on even and uneven layouts; mismatches, dead ranks and silent peers reported on every
server."""

from __future__ import annotations

import os
import re
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
        time.sleep(3.5)  # stops reading: the others' execution timeout (2 s) passes first
        return "slept"
    started = time.monotonic()
    try:
        comm.all_reduce(x, op="sum")
        hcclpy.Device(rank).synchronize()
    except hcclpy.HcclpyError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.1f} s: {exc}"
    return "no error"


# A rank of the second server killed, or silent (its peers wait out the execution timeout).
@pytest.mark.parametrize("how, victim", [("killed", 3), ("silent", 3)])
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


def _reductions(rank: int, size: int, info: bytes, counts: List[int]) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    problems = []
    try:
        for count in counts:
            for dtype in ("int32", "int64", "float32"):
                # Small integers: exact in float32 whatever the order of the additions.
                inputs = [(np.arange(count) % 13 + 3 * r).astype(dtype) for r in range(size)]
                x = hcclpy.from_numpy(inputs[rank], device=rank)
                comm.all_reduce(x, op="sum")
                want = sum(inputs).astype(dtype)
                got = x.to_numpy()
                if not np.array_equal(got, want):
                    problems.append(f"all_reduce {dtype} count={count}: {got[:8]} != {want[:8]}")
                y = hcclpy.from_numpy(np.concatenate(inputs) if rank == 0 else np.concatenate(inputs) * 0 + rank,
                                      device=rank)
                out = hcclpy.zeros(count * size, dtype, device=rank)
                comm.reduce(y, out, op="max", root=size - 1)
                if rank == size - 1:
                    want = np.maximum.reduce([np.concatenate(inputs)] + [np.full(count * size, r, dtype)
                                                                            for r in range(1, size)])
                    if not np.array_equal(out.to_numpy(), want):
                        problems.append(f"reduce {dtype} count={count}")
        comm.barrier()
    finally:
        comm.destroy()
    return problems


def test_flat_ring_when_hccl_algo_asks() -> None:
    # HCCL_ALGO=ring: all_reduce (and what runs through it) as one ring of every rank over TCP.
    servers = LAYOUTS["1+2+3"]
    results = ranks.run_processes(_reductions, len(servers), [0, 1, 5, len(servers) + 1, 100_003], timeout=120,
                                  servers=servers, env={"HCCL_ALGO": "ring"})
    assert results == [[]] * len(servers)


def _split_across(rank: int, size: int, info: bytes) -> List[Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        # Ranks 1 and 2 (one on each server) and ranks 0 and 3: collective splits of a
        # communicator that spans servers go through a root info of their own.
        members = [1, 2] if rank in (1, 2) else [0, 3]
        subs = [comm.split([1, 2]), comm.split([0, 3])]
        sub = subs[0] if rank in (1, 2) else subs[1]
        assert subs[1 if rank in (1, 2) else 0] is None
        x = hcclpy.from_numpy(np.array([rank + 1], dtype=np.int32), device=rank)
        sub.all_reduce(x, op="sum")
        out = [members, sub.size, x.to_numpy().tolist()]
        with pytest.raises(hcclpy.UnsupportedError, match="spans servers"):
            comm.split(members, sub_id=7)
        sub.destroy()
        return out
    finally:
        comm.destroy()


def test_split_of_a_communicator_across_servers() -> None:
    out = ranks.run_processes(_split_across, 4, timeout=60, servers=["a", "a", "b", "b"])
    assert out == [[[0, 3], 2, [5]], [[1, 2], 2, [5]], [[1, 2], 2, [5]], [[0, 3], 2, [5]]]


def _join_or_fail(rank: int, size: int, info: bytes, absent: int) -> str:
    if rank == absent:
        return "stayed away"
    try:
        hcclpy.Communicator(size, info, rank, device=rank).destroy()
    except hcclpy.HcclpyError as exc:
        return str(exc)
    return "joined"


def test_a_rank_that_never_joins_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # The root's limit too: it is served from this process, and counts from when the root info was
    # made. 15 s leaves room for the ranks to start on a loaded machine: a rank that came after the
    # root gave up would rightly be told that nobody listens any more.
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "15")
    outcomes = ranks.run_processes(_join_or_fail, 4, 3, timeout=90, servers=["a", "a", "b", "b"],
                                   env={"HCCL_CONNECT_TIMEOUT": "15"})
    assert outcomes[3] == "stayed away"
    for text in outcomes[:3]:
        assert "3 of 4 ranks joined" in text and "never came: rank 3" in text, text


def _all_reduce_here(rank: int, size: int, info: bytes) -> List[int]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        x = hcclpy.from_numpy(np.array([rank, 1], dtype=np.int64), device=rank)
        comm.all_reduce(x, op="sum")
        return x.to_numpy().tolist()
    finally:
        comm.destroy()


@pytest.mark.parametrize("variable, value", [("HCCL_IF_IP", "127.0.0.1"), ("HCCL_SOCKET_IFNAME", "=lo")])
def test_the_interface_is_chosen_as_hccl_does(variable: str, value: str) -> None:
    out = ranks.run_processes(_all_reduce_here, 3, timeout=60, servers=["a", "b", "b"], env={variable: value})
    assert out == [[3, 3]] * 3


@pytest.mark.parametrize("variable, value, message", [
    ("HCCL_IF_IP", "10.0.0.300", "HCCL_IF_IP='10.0.0.300' is not an IPv4 or IPv6 address"),
    ("HCCL_SOCKET_IFNAME", "=nosuchif0", "no interface of that name is up"),
])
def test_a_bad_interface_is_named(variable: str, value: str, message: str) -> None:
    saved = os.environ.get(variable)
    os.environ[variable] = value
    try:
        with pytest.raises(hcclpy.HcclError, match=re.escape(message)):
            ranks._root_info(["a", "b"])
    finally:
        if saved is None:
            del os.environ[variable]
        else:
            os.environ[variable] = saved


def _rebuild(rank: int, size: int, info: bytes, victim: int, folder: str) -> Any:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    x = hcclpy.from_numpy(np.ones(1 << 12, dtype=np.float32), device=rank)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(x, op="sum")
        hcclpy.Device(rank).synchronize()
        return "no error"
    except hcclpy.HcclpyError:
        comm.destroy()
    # The survivors make a job of their own: the lowest publishes a fresh root info.
    survivors = [r for r in range(size) if r != victim]
    path = os.path.join(folder, "root_info")
    if rank == survivors[0]:
        with open(path + ".tmp", "wb") as handle:
            handle.write(hcclpy.RootInfo.generate(device=rank).to_bytes())
        os.replace(path + ".tmp", path)
    assert ranks.wait_for(lambda: os.path.exists(path), 20)
    with open(path, "rb") as handle:
        fresh = hcclpy.RootInfo(handle.read())
    with hcclpy.Communicator(len(survivors), fresh, survivors.index(rank), device=rank) as again:
        y = hcclpy.from_numpy(np.array([rank], dtype=np.int32), device=rank)
        again.all_reduce(y, op="sum")
        return y.to_numpy().tolist()


def test_survivors_rebuild_after_a_server_loses_a_rank(tmp_path: Any) -> None:
    out = ranks.run_processes(_rebuild, 4, 2, str(tmp_path), timeout=60, servers=["a", "a", "b", "b"],
                              env={"HCCL_EXEC_TIMEOUT": "5"}, return_exceptions=True)
    assert [out[r] for r in (0, 1, 3)] == [[4]] * 3, out


def _late_peer(rank: int, size: int, info: bytes) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        stream = hcclpy.Device(rank).create_stream()
        x = hcclpy.from_numpy(np.full(4, rank + 1, dtype=np.int32), device=rank)
        seen = []
        if rank == 1:
            time.sleep(2)  # rank 0's wait with a timeout gives up meanwhile
        comm.all_reduce(x, op="sum", stream=stream)
        if rank == 0:
            try:
                stream.synchronize(timeout=0.5)
                seen.append("done early")
            except hcclpy.CommTimeoutError:
                seen.append("timed out")  # the operation goes on
        stream.synchronize()
        seen.append(str(x.to_numpy().tolist()))
        stream.close()
        return seen
    finally:
        comm.destroy()


def test_a_wait_with_a_timeout_returns_while_servers_talk() -> None:
    out = ranks.run_processes(_late_peer, 2, timeout=60, servers=["a", "b"], env={"HCCL_EXEC_TIMEOUT": "30"})
    assert out == [["timed out", "[3, 3, 3, 3]"], ["[3, 3, 3, 3]"]]


def _join_twice(rank: int, size: int, info: bytes) -> str:
    hcclpy.Communicator(size, info, rank, device=rank).destroy()
    try:
        hcclpy.Communicator(size, info, rank, device=rank)
    except hcclpy.HcclpyError as exc:
        return str(exc)
    return "joined twice"


def test_a_root_info_across_servers_serves_one_communicator() -> None:
    # Its root stopped listening once the communicator formed: a second join fails at once.
    for text in ranks.run_processes(_join_twice, 2, timeout=60, servers=["a", "b"]):
        assert "a root info serves one communicator" in text, text
