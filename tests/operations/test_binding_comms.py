"""Creating communicators: configs, sub-communicators (even/odd, a 2-D grid, a split of a split),
rank tables, and init_all driven from one thread with hcclpy.group()."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import _ffi
from hcclpy.rendezvous import free_port


def _all_reduce_sum(comm: hcclpy.Communicator, value: Any, dtype: str = "int64") -> np.ndarray:
    x = hcclpy.from_numpy(np.asarray(value, dtype=dtype).reshape(-1), device=comm.device)
    with comm.device.create_stream() as stream:
        comm.all_reduce(x, None, "sum", stream=stream)
        stream.synchronize()
    return x.to_numpy()


def _all_gather(comm: hcclpy.Communicator, value: Any, dtype: str = "int64") -> np.ndarray:
    x = hcclpy.from_numpy(np.asarray(value, dtype=dtype).reshape(-1), device=comm.device)
    out = hcclpy.empty(x.size * comm.size, dtype, device=comm.device)
    with comm.device.create_stream() as stream:
        comm.all_gather(x, out, stream=stream)
        stream.synchronize()
    return out.to_numpy()


# --------------------------------------------------------------------------------- config

def _with_config(rank: int, size: int, info: bytes, name: str) -> Dict[str, Any]:
    config = hcclpy.CommConfig(name=name, exec_timeout=20, buffer_size_mb=32, deterministic=True, udi="tests")
    with hcclpy.Communicator(size, hcclpy.RootInfo.from_bytes(info), rank, config=config, device=rank) as comm:
        return {"name": comm.name, "sum": _all_reduce_sum(comm, [rank, 1]).tolist(), "rank": comm.rank}


def test_communicator_with_config() -> None:
    name = f"cfg_{uuid.uuid4().hex[:12]}"
    out = ranks.run_threads(_with_config, 3, name)
    assert out == [{"name": name, "sum": [3, 3], "rank": r} for r in range(3)]


def _with_dict_config(rank: int, size: int, info: bytes) -> str:
    with hcclpy.Communicator(size, info, rank, config={"exec_timeout": 0.5}, device=rank) as comm:
        return comm.name


def test_communicator_with_dict_config_and_bytes_root_info() -> None:
    names = ranks.run_threads(_with_dict_config, 2)
    assert names[0] == names[1] and names[0]


# ------------------------------------------------------------------------ sub-communicators

def _even_odd(rank: int, size: int, info: bytes) -> Dict[str, Any]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        evens = comm.split(range(0, size, 2))
        odds = comm.split(range(1, size, 2), config=hcclpy.CommConfig(name=f"odds_{size}_{info[8:20].hex()}"))
        mine, other = (evens, odds) if rank % 2 == 0 else (odds, evens)
        result = {"other_is_none": other is None, "rank": mine.rank, "size": mine.size,
                  "sum": _all_reduce_sum(mine, [rank]).tolist(), "gather": _all_gather(mine, [rank]).tolist(),
                  "odds_name": odds.name if odds is not None else None}
        mine.destroy()
        return result


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_split_even_odd(mode: str) -> None:
    size = 5
    out = ranks.run(mode, _even_odd, size)
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    for r, res in enumerate(out):
        group = evens if r % 2 == 0 else odds
        assert res["other_is_none"]
        assert (res["rank"], res["size"]) == (group.index(r), len(group))
        assert res["sum"] == [sum(group)] and res["gather"] == group
        if r % 2:
            assert res["odds_name"].startswith("odds_")


def _grid(rank: int, size: int, info: bytes, rows: int, cols: int) -> Dict[str, Any]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        row_comms = [comm.split([r * cols + c for c in range(cols)]) for r in range(rows)]
        col_comms = [comm.split([r * cols + c for r in range(rows)]) for c in range(cols)]
        row = [c for c in row_comms if c is not None]
        col = [c for c in col_comms if c is not None]
        assert len(row) == 1 and len(col) == 1, (row_comms, col_comms)
        row, col = row[0], col[0]
        # A 2-D all-reduce: rows, then columns, gives the sum over the world.
        x = hcclpy.from_numpy(np.array([rank, 1, rank * rank], np.float64), device=rank)
        with hcclpy.Device(rank).create_stream() as stream:
            row.all_reduce(x, None, "sum", stream=stream)
            col.all_reduce(x, None, "sum", stream=stream)
            stream.synchronize()
        result = {"row": (row.rank, row.size), "col": (col.rank, col.size), "world": x.to_numpy().tolist(),
                  "row_gather": _all_gather(row, [rank]).tolist(), "col_gather": _all_gather(col, [rank]).tolist()}
        row.destroy()
        col.destroy()
        return result


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_split_grid_rows_and_columns(mode: str) -> None:
    rows, cols = 2, 3
    size = rows * cols
    out = ranks.run(mode, _grid, size, rows, cols)
    world = [float(sum(range(size))), float(size), float(sum(r * r for r in range(size)))]
    for rank, res in enumerate(out):
        r, c = divmod(rank, cols)
        assert res["row"] == (c, cols) and res["col"] == (r, rows)
        assert res["world"] == world
        assert res["row_gather"] == [r * cols + k for k in range(cols)]
        assert res["col_gather"] == [k * cols + c for k in range(rows)]


def _nested(rank: int, size: int, info: bytes) -> Optional[Dict[str, Any]]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        first = comm.split([0, 1, 2, 4])      # parent ranks 0, 1, 2, 4
        if first is None:
            return None
        second = first.split([1, 2, 3])       # sub-ranks 1..3 = parent ranks 1, 2, 4
        result: Dict[str, Any] = {"first": (first.rank, first.size), "second": None}
        if second is not None:
            result["second"] = (second.rank, second.size)
            result["sum"] = _all_reduce_sum(second, [rank]).tolist()
            result["gather"] = _all_gather(second, [rank]).tolist()
            # and a third level
            third = second.split([0, 2])      # parent ranks 1, 4
            if third is not None:
                result["third"] = _all_gather(third, [rank]).tolist()
                third.destroy()
            second.destroy()
        # The first-level sub-communicator still works afterwards.
        result["first_sum"] = _all_reduce_sum(first, [1]).tolist()
        first.destroy()
        return result


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_split_of_a_split(mode: str) -> None:
    out = ranks.run(mode, _nested, 5)
    assert out[3] is None
    assert out[0] == {"first": (0, 4), "second": None, "first_sum": [4]}
    for rank, sub_rank in ((1, 0), (2, 1), (4, 2)):
        res = out[rank]
        assert res["first"] == ([0, 1, 2, 4].index(rank), 4)
        assert res["second"] == (sub_rank, 3)
        assert res["sum"] == [7] and res["gather"] == [1, 2, 4] and res["first_sum"] == [4]
        assert ("third" in res) == (rank in (1, 4))
        if rank in (1, 4):
            assert res["third"] == [1, 4]


def _members_only(rank: int, size: int, info: bytes) -> Optional[List[int]]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        # Ranks 1 and 3 split by id while the others do not call split at all.
        if rank not in (1, 3):
            return None
        pair = comm.split([1, 3], sub_id=12345)
        try:
            return _all_gather(pair, [rank * 10]).tolist()
        finally:
            pair.destroy()


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(120)
def test_split_by_id_needs_only_the_members(mode: str) -> None:
    assert ranks.run(mode, _members_only, 4) == [None, [10, 30], None, [10, 30]]


def test_split_by_id_checks_its_arguments() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        with pytest.raises(ValueError, match="sub_id=-1"):
            comm.split([0], sub_id=-1)
        sub = comm.split([0], sub_id=5)
        with pytest.raises(hcclpy.UnsupportedError, match="sub-communicator"):
            sub.split([0], sub_id=6)
        sub.destroy()


def _on_device_0(rank: int, size: int, info: bytes) -> str:
    try:
        hcclpy.Communicator(size, info, rank, device=0).destroy()
    except hcclpy.HcclError as exc:
        return str(exc)
    return "created"


def test_two_ranks_on_one_device_are_refused() -> None:
    # Processes of one host, both on device 0: the simulator says how to emulate two servers instead.
    for message in ranks.run_processes(_on_device_0, 2, timeout=90):
        assert "are both on device 0 of host" in message and "HCCLPY_SIM_SERVER" in message, message


def test_simulator_refuses_a_second_level_of_create_sub_comm() -> None:
    """What the binding works around: HcclCreateSubCommConfig on a sub-communicator."""
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        sub = comm.split([0])
        bound = _ffi.api()
        out = _ffi.new("HcclComm *")
        rc = bound.HcclCreateSubCommConfig(_ffi.new("HcclComm *", sub._handle), 1, _ffi.new("uint32_t[]", [0]), 99,
                                           0, hcclpy.CommConfig().to_c(), out)
        assert rc == hcclpy.errors.HcclResult.HCCL_E_NOT_SUPPORT
        nested = sub.split([0])  # the binding falls back to a broadcast root info
        assert (nested.rank, nested.size) == (0, 1)
        assert _all_reduce_sum(nested, [5]).tolist() == [5]
        nested.destroy()
        sub.destroy()


def test_split_argument_errors() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        for bad in ([], [1], [-1], [0, 0]):
            with pytest.raises(ValueError, match="ranks="):
                comm.split(bad)
        with pytest.raises(TypeError, match="config"):
            comm.split([0], config=3)
        with pytest.raises(TypeError, match="unknown CommConfig key"):
            comm.split([0], config={"nme": "x"})
        _all_reduce_sum(comm, [1])


def _split_descending(rank: int, size: int, info: bytes) -> None:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        with pytest.raises(ValueError, match="increasing"):
            comm.split([1, 0])
        assert _all_reduce_sum(comm, [1]).tolist() == [size]


def test_split_rejects_unsorted_ranks_on_every_rank() -> None:
    ranks.run_threads(_split_descending, 2)


# ------------------------------------------------------------------------------ rank table

def _rank_table(path: Path, servers: List[List[int]]) -> Path:
    """A rank table in the documented format (reference §5.1): every value a string; device i runs rank i."""
    table = {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(servers)),
        "server_list": [
            {"server_id": f"host-{s}",
             "device": [{"device_id": str(r), "device_ip": f"192.168.{100 + s}.{10 + r}", "device_port": "16666",
                         "rank_id": str(r)} for r in ranks_of_server]}
            for s, ranks_of_server in enumerate(servers)
        ],
    }
    path.write_text(json.dumps(table, indent=2))
    return path


def _from_rank_table(rank: int, size: int, info: bytes, path: str, config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    comm = hcclpy.Communicator.from_rank_table(path, rank, config=config, device=rank)
    try:
        return {"rank": comm.rank, "size": comm.size, "sum": _all_reduce_sum(comm, [rank, 1]).tolist(),
                "name": comm.name}
    finally:
        comm.destroy()


@pytest.mark.parametrize("servers", [[[0, 1, 2, 3]], [[0, 1], [2, 3]]], ids=["one-server", "two-servers"])
@pytest.mark.parametrize("config", [None, {"exec_timeout": 20}], ids=["plain", "config"])
@pytest.mark.timeout(60)
def test_from_rank_table(tmp_path: Path, servers: List[List[int]], config: Optional[Dict[str, Any]],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Two servers bootstrap over TCP at HCCL_IF_BASE_PORT: a free one, not the default 60000 that
    # a test in another worker may be listening on.
    monkeypatch.setenv("HCCL_IF_BASE_PORT", str(free_port()))
    path = _rank_table(tmp_path / "rank_table.json", servers)
    out = ranks.run_threads(_from_rank_table, 4, str(path), config, timeout=45)
    assert [(o["rank"], o["size"], o["sum"]) for o in out] == [(r, 4, [6, 4]) for r in range(4)]
    assert len({o["name"] for o in out}) == 1


def test_from_rank_table_accepts_path_objects(tmp_path: Path) -> None:
    path = _rank_table(tmp_path / "one.json", [[0]])
    comm = hcclpy.Communicator.from_rank_table(path, 0, device=0)
    assert (comm.rank, comm.size) == (0, 1)
    comm.destroy()


def test_from_rank_table_errors(tmp_path: Path) -> None:
    path = _rank_table(tmp_path / "two.json", [[0, 1]])
    with pytest.raises(TypeError, match="path"):
        hcclpy.Communicator.from_rank_table(42, 0, device=0)
    with pytest.raises(ValueError, match="4096"):
        hcclpy.Communicator.from_rank_table("/" + "x" * 5000, 0, device=0)
    with pytest.raises(ValueError, match="rank=-1"):
        hcclpy.Communicator.from_rank_table(str(path), -1, device=0)
    with pytest.raises(ValueError, match="device=99"):
        hcclpy.Communicator.from_rank_table(str(path), 0, device=99)
    with pytest.raises(FileNotFoundError, match="missing.json': no such rank-table file"):
        hcclpy.Communicator.from_rank_table(str(tmp_path / "missing.json"), 0, device=0)
    # Refused by the library, quickly, with its explanation.
    with pytest.raises(hcclpy.HcclError, match="not one of them") as info:
        hcclpy.Communicator.from_rank_table(str(path), 5, device=0)
    assert info.value.name == "HCCL_E_PARA"
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(hcclpy.HcclError, match="not valid JSON"):
        hcclpy.Communicator.from_rank_table(str(bad), 0, device=0)


# ------------------------------------------------------------------------------- init_all

@pytest.mark.timeout(60)
def test_init_all_driven_from_one_thread_with_group() -> None:
    devices = [0, 1, 2, 3]
    comms = hcclpy.Communicator.init_all(devices)
    try:
        assert [(c.rank, c.size, c.device.id) for c in comms] == [(i, 4, d) for i, d in enumerate(devices)]
        assert len({c.name for c in comms}) == 1
        streams = [hcclpy.Device(d).create_stream() for d in devices]
        inputs = [ranks.make_input("init_all", i, 9, "float32", "sum") for i in range(4)]
        xs = [hcclpy.from_numpy(inputs[i], device=d) for i, d in enumerate(devices)]
        ys = [hcclpy.zeros(9, "float32", device=d) for d in devices]
        gathered = [hcclpy.zeros(36, "float32", device=d) for d in devices]
        received = [hcclpy.zeros(9, "float32", device=d) for d in devices]
        # Collectives of every rank from this one thread: one group releases them together.
        with hcclpy.group():
            for c, x, y, s in zip(comms, xs, ys, streams):
                c.all_reduce(x, y, "sum", stream=s)
        with hcclpy.group():
            for c, x, g, s in zip(comms, xs, gathered, streams):
                c.all_gather(x, g, stream=s)
        # A ring of sends and receives, every rank sending first.
        with hcclpy.group():
            for i, c in enumerate(comms):
                c.send(xs[i], (i + 1) % 4, stream=streams[i])
                c.recv(received[i], (i - 1) % 4, stream=streams[i])
        for s in streams:
            s.synchronize(timeout=30)
        want = ranks.reduce_reference(inputs, "sum", "float32")
        for i in range(4):
            assert ranks.mismatch("all_reduce", ys[i].to_numpy(), want) is None
            assert ranks.mismatch("all_gather", gathered[i].to_numpy(), np.concatenate(inputs)) is None
            assert ranks.mismatch("ring", received[i].to_numpy(), inputs[(i - 1) % 4]) is None
        for s in streams:
            s.close()
    finally:
        for c in comms:
            c.destroy()


def test_init_all_argument_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        hcclpy.Communicator.init_all([])
    with pytest.raises(ValueError, match="twice"):
        hcclpy.Communicator.init_all([0, 1, 0])
    with pytest.raises(ValueError, match="visible"):
        hcclpy.Communicator.init_all([0, hcclpy.device_count()])
    with pytest.raises(ValueError, match="device=-1"):
        hcclpy.Communicator.init_all([-1])
    with pytest.raises(TypeError, match="device"):
        hcclpy.Communicator.init_all(["0"])


def test_group_releases_calls_when_the_block_raises() -> None:
    comms = hcclpy.Communicator.init_all([0, 1])
    streams = [hcclpy.Device(d).create_stream() for d in (0, 1)]
    xs = [hcclpy.from_numpy(np.full(3, d + 1, np.int32), device=d) for d in (0, 1)]
    with pytest.raises(KeyError):
        with hcclpy.group():
            for c, x, s in zip(comms, xs, streams):
                c.all_reduce(x, None, "sum", stream=s)
            raise KeyError("in the group")
    for s in streams:
        s.synchronize(timeout=30)
    assert [x.to_numpy().tolist() for x in xs] == [[3, 3, 3]] * 2
    for s in streams:
        s.close()
    for c in comms:
        c.destroy()


def test_a_group_belongs_to_the_thread_that_opened_it() -> None:
    from hcclpy import collectives

    seen: List[Any] = []
    with hcclpy.group():
        with hcclpy.group():  # nested: still one group, until the outer block ends
            other = threading.Thread(target=lambda: seen.append(("other thread", collectives.group_active())))
            other.start()
            other.join(timeout=10)
            seen.append(("nested", collectives.group_active()))
        seen.append(("outer", collectives.group_active()))
    seen.append(("after", collectives.group_active()))
    assert seen == [("other thread", False), ("nested", True), ("outer", True), ("after", False)]


@pytest.mark.timeout(60)
def test_communicators_created_inside_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "3")
    info = hcclpy.RootInfo.generate(device=0)
    started = time.monotonic()
    try:
        with hcclpy.group():
            comms = [hcclpy.Communicator(2, info, r, device=r) for r in range(2)]
    except (TypeError, ValueError, hcclpy.UnsupportedError):
        # Refusing is acceptable too, if it is immediate.
        assert time.monotonic() - started < 1.0
        return
    assert [(c.rank, c.size) for c in comms] == [(0, 2), (1, 2)]
    for c in comms:
        c.destroy()


def _names_of_splits(rank: int, size: int, info: bytes) -> List[Optional[str]]:
    with hcclpy.Communicator(size, info, rank, device=rank, config={"name": "job"}) as comm:
        evens = comm.split([0, 2])
        pair = comm.split([0, 1])
        by_id = comm.split([0, 1], sub_id=7) if rank < 2 else None
        chosen = comm.split([1, 2, 3], config={"name": "mine"})
        inner = evens.split([0, 1]) if evens else None
        subs = [evens, pair, by_id, chosen, inner]
        names = [sub.name if sub else None for sub in subs]
        for sub in reversed(subs):
            if sub:
                sub.destroy()
        if evens:  # errors say the same name
            with pytest.raises(Exception, match=r"communicator 'job\.split\(0\)' was destroyed"):
                evens.all_reduce(np.ones(3, np.float32))
    return names


def test_communicators_have_names_a_person_can_read() -> None:
    # A split is named after its parent and its place among the parent's splits (or its sub_id);
    # the name given in a config wins.
    names = ranks.run_threads(_names_of_splits, 4)
    assert names == [["job.split(0)", "job.split(1)", "job.split(id=7)", None, "job.split(0).split(0)"],
                     [None, "job.split(1)", "job.split(id=7)", "mine", None],
                     ["job.split(0)", None, None, "mine", "job.split(0).split(0)"],
                     [None, None, None, "mine", None]]


def _join_unless_last(rank: int, size: int, info: bytes) -> None:
    if rank == size - 1:
        return  # never joins
    hcclpy.Communicator(size, info, rank, device=rank)


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.slow
def test_every_waiting_rank_names_exactly_the_rank_that_never_joined(mode: str) -> None:
    # Ranks 0-2 wait for rank 3 until HCCL_CONNECT_TIMEOUT; whichever gives up first, none of
    # them may name another waiting rank (which joined, then left) as missing.
    outcomes = ranks.run(mode, _join_unless_last, 4, env={"HCCL_CONNECT_TIMEOUT": "2"}, return_exceptions=True,
                         timeout=60)
    assert outcomes[3] is None
    for rank in range(3):
        error = outcomes[rank]
        assert isinstance(error, ranks.RankError), (rank, error)
        text = str(error.exception)
        assert "missing rank(s) 3" in text and "missing rank(s) 0" not in text, (rank, text)
        assert not re.search(r"missing rank\(s\) [0-9, ]*[012]", text), (rank, text)


# ------------------------------------------------------------- split ids and argument checks

def _parent_ranks(comm: hcclpy.Communicator, parent_rank: int) -> List[int]:
    """The parent ranks of ``comm``'s members, in sub-rank order (each member gathers its own)."""
    return _all_gather(comm, [parent_rank]).tolist()


def _collective_then_members_only(rank: int, size: int, info: bytes, pair_done: threading.Event) -> Dict[str, Any]:
    """Every rank splits off the evens collectively; ranks 1 and 3 then split by id 1, all before
    rank 2 reaches the collective split. Each member reports its sub-communicator's parent ranks."""
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        if rank == 2:  # late to the collective split: ranks 1 and 3 split by id 1 meanwhile
            assert pair_done.wait(30), "ranks 1 and 3 did not finish their split by id"
        evens = comm.split([0, 2])
        out: Dict[str, Any] = {"evens": None if evens is None else _parent_ranks(evens, rank)}
        if rank in (1, 3):
            odds = comm.split([1, 3], sub_id=1)  # a small id, as the collective split's counter once used
            out["odds"] = _parent_ranks(odds, rank)
            odds.destroy()
            if rank == 3:
                pair_done.set()
        if evens is not None:
            evens.destroy()
        return out


@pytest.mark.timeout(120)
def test_a_collective_split_and_a_split_by_id_never_share_an_id() -> None:
    out = ranks.run_threads(_collective_then_members_only, 4, threading.Event(), timeout=90)
    assert out == [{"evens": [0, 2]}, {"evens": None, "odds": [1, 3]}, {"evens": [0, 2]},
                   {"evens": None, "odds": [1, 3]}]


def test_sub_id_range() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        for bad in (2**32 - 1, 2**32, -1, 1.0, True):
            with pytest.raises(ValueError, match=rf"^sub_id={bad!r} must be an int in \[0, 4294967294\] "
                                                 r"\(4294967295 marks the ranks outside a split; collective splits "
                                                 r"use ids from 2\*\*32 up\)$"):
                comm.split([0], sub_id=bad)
        for good in (2**32 - 2, np.int64(3)):
            sub = comm.split([0], sub_id=good)
            assert (sub.rank, sub.size) == (0, 1)
            sub.destroy()


@pytest.mark.parametrize("call, error, message", [
    (lambda info: hcclpy.Communicator(2**32, info, 0, device=0), ValueError,
     r"^nranks=4294967296 must be an int in \[1, 4294967295\]$"),
    (lambda info: hcclpy.Communicator(np.int64(1), info, np.int64(0), device=0).destroy(), None, None),
    (lambda info: hcclpy.Communicator.from_rank_table("/nonexistent.json", 2**32, device=0), ValueError,
     r"^rank=4294967296 must be an int in \[0, 4294967295\]$"),
    (lambda info: hcclpy.Communicator.init_all(2), TypeError,
     r"^devices must be a sequence of devices \(ids or hcclpy.Device\), one per rank, got 2 \(int\)$"),
    (lambda info: hcclpy.Communicator.init_all("01"), TypeError, "^devices must be a sequence of devices"),
], ids=["nranks-2**32", "numpy-ints", "rank-table-rank-2**32", "init_all-int", "init_all-str"])
def test_communicator_arguments_are_named(call: Any, error: Optional[type], message: Optional[str]) -> None:
    info = hcclpy.RootInfo.generate(device=0)
    if error is None:
        call(info)
        return
    with pytest.raises(error, match=message):
        call(info)


@pytest.mark.parametrize("field, value, message", [
    ("exec_timeout", 2**31 - 0.5, r"^CommConfig.exec_timeout=2147483647.5 must be a number of seconds in "
                                  r"\[0, 2\*\*31\), at most 2\*\*31 - 1 once rounded up to whole seconds"),
    ("exec_timeout", float("nan"), "^CommConfig.exec_timeout=nan must be a number of seconds"),
    ("op_expansion_mode", 7, r"^CommConfig.op_expansion_mode=7 must be an int in \[0, 6\]$"),
    ("buffer_size_mb", 0, r"^CommConfig.buffer_size_mb=0 must be an int in \[1, 4294967294\]$"),
    ("buffer_size_mb", np.float64(8), r"^CommConfig.buffer_size_mb=.*8.0\)? must be an int in"),
    ("qos", np.int64(8), r"^CommConfig.qos=.*8\)? must be an int in \[0, 7\]$"),
])
def test_comm_config_checks_every_assignment(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        hcclpy.CommConfig(**{field: value})
    config = hcclpy.CommConfig(buffer_size_mb=64)
    with pytest.raises(ValueError, match=message):
        setattr(config, field, value)  # after construction too: never silently a default
    assert config == hcclpy.CommConfig(buffer_size_mb=64)


def test_comm_config_takes_numpy_numbers_and_the_largest_timeout() -> None:
    config = hcclpy.CommConfig(buffer_size_mb=np.int64(100), qos=np.uint8(3), op_expansion_mode=np.int32(6),
                               exec_timeout=np.float32(2.5), deterministic=np.int64(2))
    assert (config.buffer_size_mb, config.qos, config.op_expansion_mode, config.exec_timeout,
            config.deterministic) == (100, 3, 6, 2.5, 2)
    assert all(type(getattr(config, f)) is int for f in ("buffer_size_mb", "qos", "op_expansion_mode"))
    config.exec_timeout = 2**31 - 1.5  # rounds up to 2**31 - 1: the largest HCCL takes
    assert config.to_c().hcclExecTimeOut == 2**31 - 1
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0, config=config) as comm:
        assert _all_reduce_sum(comm, [4]).tolist() == [4]


def test_comm_config_refuses_unknown_attributes() -> None:
    config = hcclpy.CommConfig()
    with pytest.raises(AttributeError, match=r"^CommConfig has no field 'nme' \(did you mean 'name'\?\)"):
        config.nme = "x"


# ------------------------------------------------------------------------ destroy(timeout=)

def _stuck_then_destroyed(rank: int, size: int, info: bytes, on_user_stream: bool, directory: str) -> Dict[str, Any]:
    """Rank 0 queues an all_reduce rank 1 does not join in time and destroys with a timeout; rank
    1's late all_reduce then fails as a remote error. (Processes: the aborted all_reduce fails its
    stream for good, which must not be another test's default stream.)"""
    # exec_timeout=0: no limit, so only destroy's own timeout can end rank 0's all_reduce.
    comm = hcclpy.Communicator(size, info, rank, device=rank, config={"exec_timeout": 0})
    destroyed = Path(directory) / "destroyed"
    if rank == 1:  # alive, but joins rank 0's all_reduce only once rank 0 has given up on it
        deadline = time.monotonic() + 60
        while not destroyed.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        stream = comm.device.create_stream()
        try:
            comm.all_reduce(hcclpy.zeros(4, "float32", device=comm.device), stream=stream)
            stream.synchronize(timeout=30)
            error: Any = None
        except hcclpy.HcclpyError as exc:
            error = exc
        comm.destroy(timeout=5)
        return {"error": type(error).__name__, "remote": isinstance(error, hcclpy.RemoteRankError)}
    stream = comm.device.create_stream() if on_user_stream else comm.device.default_stream
    comm.all_reduce(hcclpy.zeros(4, "float32", device=comm.device), stream=stream)
    comm.destroy(timeout=0.2)
    destroyed.write_text("")
    with pytest.raises(hcclpy.AclError):  # the aborted all_reduce failed the stream
        stream.synchronize(timeout=30)
    return {"destroyed": comm.destroyed}


@pytest.mark.parametrize("on_user_stream", [False, True], ids=["default-stream", "user-stream"])
@pytest.mark.timeout(150)
@pytest.mark.slow
def test_destroy_with_a_timeout_aborts_work_that_never_ends(on_user_stream: bool, tmp_path: Path) -> None:
    out = ranks.run_processes(_stuck_then_destroyed, 2, on_user_stream, str(tmp_path), timeout=120)
    assert out == [{"destroyed": True}, {"error": "HcclRemoteError", "remote": True}]


def _queued_behind_an_abort(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    """Rank 0 queues an all_reduce behind a host function that holds its stream, aborts, lets rank 1
    start the same all_reduce, then lets its stream reach its own: aborted, it must fail without
    taking part, and rank 1's must fail too rather than complete with rank 0's half."""
    comm = hcclpy.Communicator(size, info, rank, device=rank, config={"exec_timeout": 0})
    aborted, joined = Path(directory) / "aborted", Path(directory) / "joined"
    stream = comm.device.create_stream()
    if rank == 1:
        deadline = time.monotonic() + 60
        while not aborted.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            comm.all_reduce(hcclpy.zeros(4, "float32", device=comm.device), stream=stream)
            joined.write_text("")
            stream.synchronize(timeout=30)
            error: Any = None
        except hcclpy.HcclpyError as exc:
            error = exc
        joined.write_text("")
        comm.destroy(timeout=5)
        return {"error": type(error).__name__, "remote": isinstance(error, hcclpy.RemoteRankError)}
    gate = threading.Event()
    stream.launch_host_func(lambda: gate.wait(60))
    comm.all_reduce(hcclpy.zeros(4, "float32", device=comm.device), stream=stream)
    comm.abort()
    aborted.write_text("")
    deadline = time.monotonic() + 60
    while not joined.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # rank 1 waits in its all_reduce
    gate.set()
    with pytest.raises(hcclpy.AclError):
        stream.synchronize(timeout=30)
    comm.destroy(timeout=5)
    return {"destroyed": comm.destroyed}


@pytest.mark.timeout(150)
def test_work_a_stream_reaches_after_an_abort_takes_no_part(tmp_path: Path) -> None:
    out = ranks.run_processes(_queued_behind_an_abort, 2, str(tmp_path), timeout=120)
    # Rank 0's abort broke the communicator at once (it had work queued): rank 1's call is refused
    assert out == [{"destroyed": True}, {"error": "HcclRemoteError", "remote": True}]


_infos: Dict[int, bytes] = {}
_infos_lock = threading.Lock()


def _shared_info(round_: int) -> bytes:
    """Round ``round_``'s root info: made by the first rank to ask, shared with the other."""
    with _infos_lock:
        if round_ not in _infos:
            _infos[round_] = hcclpy.RootInfo.generate(device=0).to_bytes()
        return _infos[round_]


def _abort_then_destroy(rank: int, size: int, info: bytes, rounds: int, rank0_done: threading.Barrier) -> int:
    """``rounds`` times: rank 0 aborts with an all_reduce in flight on its own stream and destroys at
    once. Returns how many communicators this rank destroyed."""
    destroyed = 0
    for round_ in range(rounds):
        comm = hcclpy.Communicator(size, _shared_info(round_), rank, device=rank)
        if rank == 0:  # rank 1 never joins: the all_reduce is in flight when aborted
            stream = comm.device.create_stream()
            comm.all_reduce(hcclpy.zeros(1 << 16, "float32", device=comm.device), stream=stream)
            comm.abort()
            comm.destroy()  # at once: destroy gives the aborted all_reduce time to be released
            stream.close()
        rank0_done.wait(30)
        if rank == 1:
            comm.destroy()
        destroyed += comm.destroyed
    return destroyed


@pytest.mark.timeout(120)
def test_destroy_right_after_abort_with_work_on_a_user_stream() -> None:
    _infos.clear()
    assert ranks.run_threads(_abort_then_destroy, 2, 8, threading.Barrier(2), timeout=90) == [8, 8]


def test_destroy_timeout_is_checked_first() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    for bad, error, ending in ((-1, ValueError, ""), (float("nan"), ValueError, ""), ("1", TypeError, ", not a str"),
                               (True, TypeError, ", not a bool")):
        with pytest.raises(error, match=rf"^timeout={bad!r} must be None \(no limit\) or a number of seconds "
                                        rf">= 0{ending}$"):
            comm.destroy(timeout=bad)
    assert _all_reduce_sum(comm, [3]).tolist() == [3]  # untouched
    comm.destroy(timeout=5)
    assert comm.destroyed
    comm.destroy(timeout=5)  # idempotent


# ------------------------------------------------------------- destroy() racing other threads

def _pair() -> List[hcclpy.Communicator]:
    """Two ranks of one communicator in this process, on devices 0 and 1 (exec timeout: 120 s)."""
    info = hcclpy.RootInfo.generate(device=0)
    comms: List[Any] = [None, None]

    def make(rank: int) -> None:
        comms[rank] = hcclpy.Communicator(2, info, rank, device=rank, config={"exec_timeout": 120})

    threads = [threading.Thread(target=make, args=(r,), daemon=True) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(comms), "the communicators were not created"
    return comms


def _in_thread(fn: Any, device: int) -> Any:
    """Start ``fn`` on a daemon thread with ``device`` current; returns the thread and a list that
    gets its result (or exception)."""
    outcome: List[Any] = []

    def body() -> None:
        hcclpy.Device(device).set_current()
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - what the test inspects
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.timeout(60)
def test_destroy_timeout_applies_to_a_numpy_call_on_another_thread() -> None:
    """A NumPy all_reduce the peer never joins holds the staging; destroy(timeout=1) on another
    thread must not wait for it until the exec timeout (120 s): it aborts it, then destroys."""
    c0, c1 = _pair()
    stuck, outcome = _in_thread(lambda: c0.all_reduce(np.ones(4, np.float32)), 0)
    time.sleep(0.3)  # (only so that the call is likely to be waiting for the peer)
    c0.destroy(timeout=1)
    stuck.join(30)
    assert c0.destroyed and not stuck.is_alive()
    assert isinstance(outcome[0], Exception), outcome  # the aborted call failed
    assert c0._host_state is None
    c1.destroy(timeout=5)


@pytest.mark.timeout(120)
def test_two_threads_destroying_at_once_both_return() -> None:
    for _ in range(5):
        c0, c1 = _pair()
        # Work the peer joins a little later: both destroyers wait for it, then reach HcclCommDestroy.
        c0.all_reduce(hcclpy.from_numpy(np.ones(4, np.float32), device=0))
        first, got1 = _in_thread(c0.destroy, 0)
        second, got2 = _in_thread(c0.destroy, 0)
        time.sleep(0.05)
        peer, got3 = _in_thread(lambda: c1.all_reduce(np.ones(4, np.float32)).tolist(), 1)
        for thread in (first, second, peer):
            thread.join(60)
        assert got1 == [None] and got2 == [None] and got3 == [[2.0] * 4], (got1, got2, got3)
        assert c0.destroyed
        c1.destroy(timeout=5)


@pytest.mark.timeout(120)
def test_destroy_racing_numpy_calls_leaves_no_staging() -> None:
    """destroy() while another thread loops NumPy calls: the calls end with the destroyed error and
    no staging (a stream, device scratch) is made again for the destroyed communicator."""
    for _ in range(3):
        c0, c1 = _pair()
        stop = threading.Event()

        def loop(comm: hcclpy.Communicator) -> Any:
            try:
                while not stop.is_set():
                    comm.all_reduce(np.ones(1024, np.float32))
            finally:
                stop.set()

        rank0, out0 = _in_thread(lambda: loop(c0), 0)
        rank1, _ = _in_thread(lambda: loop(c1), 1)
        time.sleep(0.05)
        c0.destroy(timeout=2)
        for thread in (rank0, rank1):
            thread.join(60)
        assert isinstance(out0[0], ValueError) and str(out0[0]).endswith("was destroyed"), out0
        assert c0._host_state is None
        c1.destroy(timeout=5)


def test_destroy_inside_a_group_is_refused() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    x = hcclpy.from_numpy(np.ones(4, np.float32), device=0)
    with pytest.raises(RuntimeError, match=r"cannot be destroyed inside hcclpy.group\(\): the group's operations "):
        with hcclpy.group():
            comm.all_reduce(x, None)
            comm.destroy()
    hcclpy.Device(0).default_stream.synchronize(timeout=30)
    assert x.to_numpy().tolist() == [1.0] * 4 and not comm.destroyed
    comm.destroy()
    assert comm.destroyed


def test_batch_send_recv_inside_a_group_is_refused_before_hccl() -> None:
    # HCCL refuses HcclBatchSendRecv between HcclGroupStart and HcclGroupEnd; hcclpy says so first,
    # also for a batch its fast path remembers (posted twice in a row before).
    comms = hcclpy.Communicator.init_all([0, 1])
    streams = [hcclpy.Device(d).create_stream() for d in (0, 1)]
    sent = [hcclpy.from_numpy(np.full(4, r + 1.0, np.float32), device=r) for r in (0, 1)]
    got = [hcclpy.zeros(4, "float32", device=r) for r in (0, 1)]
    batches = [[("send", sent[r], 1 - r), ("recv", got[r], 1 - r)] for r in (0, 1)]
    try:
        for _ in range(2):
            for r in (0, 1):
                comms[r].batch_send_recv(batches[r], stream=streams[r])
            for stream in streams:
                stream.synchronize(timeout=30)
        assert [g.to_numpy().tolist() for g in got] == [[2.0] * 4, [1.0] * 4]
        for batch in (batches[0], [], [("send", np.ones(2, np.float32), 1)]):
            with pytest.raises(RuntimeError, match=r"^batch_send_recv cannot run inside hcclpy.group\(\): HCCL "):
                with hcclpy.group():
                    comms[0].batch_send_recv(batch, stream=streams[0])
    finally:
        for stream in streams:
            stream.close()
        for comm in comms:
            comm.destroy()


# ------------------------------------------------------------------ argument checks (review)

def test_split_after_abort_is_refused() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    comm.abort()
    for kwargs in ({}, {"sub_id": 3}):
        with pytest.raises(ValueError, match=rf"^communicator '{comm.name}' was aborted: it cannot be split"):
            comm.split([0], **kwargs)
    comm.destroy(timeout=10)


def test_async_error_reports_an_idle_abort() -> None:
    """With nothing in flight, an abort broke no operation: async_error said None (healthy) while
    every later operation failed."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    assert comm.async_error() is None
    comm.abort()
    error = comm.async_error()
    assert isinstance(error, hcclpy.HcclError) and not isinstance(error, hcclpy.RemoteRankError)
    assert error.name == "HCCL_E_SUSPENDING" and "aborted on this rank by abort()" in str(error)
    assert comm.health()["last_error"] is not None
    comm.destroy(timeout=10)


def test_a_watchdog_abort_after_destroy_does_nothing() -> None:
    # threading.Timer(5.0, comm.abort), the docstring's watchdog, fires after a job that ended well
    # and destroyed its communicator: there is nothing to stop, and nothing to raise in its thread.
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    comm.destroy()
    watchdog = threading.Timer(0.0, comm.abort)
    errors: List[Any] = []
    previous, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        watchdog.start()
        watchdog.join(10)
    finally:
        threading.excepthook = previous
    assert not errors and comm.destroyed


def _split_by_generator(rank: int, size: int, info: bytes) -> Optional[int]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        sub = comm.split(r for r in [0, 1])
        try:
            return None if sub is None else sub.size
        finally:
            if sub is not None:
                sub.destroy()


@pytest.mark.timeout(60)
def test_split_takes_an_iterator_of_ranks() -> None:
    assert ranks.run_threads(_split_by_generator, 2) == [2, 2]
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    with pytest.raises(ValueError, match=r"^ranks=\[1, 0\] must be distinct, increasing"):
        comm.split(r for r in [1, 0])
    comm.destroy()


@pytest.mark.parametrize("path, error, pattern", [
    ("/nonexistent/table.json", FileNotFoundError, r"path='/nonexistent/table.json': no such rank-table file"),
    ("/tmp", IsADirectoryError, r"path='/tmp' is a directory"),
    ("", ValueError, r"path='' must be a non-empty path"),
    ("/tmp/a\0b", ValueError, r"path='/tmp/a\\x00b' must be a non-empty path .* with no NUL byte"),
])
def test_from_rank_table_checks_the_path_before_any_c_call(path: str, error: type, pattern: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bound = _ffi.api()
    for name in ("HcclCommInitClusterInfo", "HcclCommInitClusterInfoConfig"):
        monkeypatch.setattr(bound, name, lambda *args: pytest.fail("a C call was made"))
    with pytest.raises(error, match=pattern):
        hcclpy.Communicator.from_rank_table(path, 0, device=0)


@pytest.mark.parametrize("config, error, pattern", [
    ({1: 2, "zz": 3}, TypeError, r"^config keys must be CommConfig field names \(str\), got 1 \(int\)"),
    ({"name": "\udcff"}, ValueError, r"^CommConfig.name='\\udcff' is not valid Unicode text"),
])
def test_comm_config_names_what_is_wrong(config: Any, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        hcclpy.CommConfig.coerce(config)


@pytest.mark.parametrize("value, used", [("64", 64), ("0", 200), ("99999999999", 200), ("12.5", 200),
                                         ("4294967294", 4294967294)])
def test_hccl_buffsize_out_of_range_is_ignored_with_a_warning(value: str, used: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c_config = hcclpy.CommConfig(name="buffsize").to_c()
    assert c_config.hcclBufferSize == used
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if used == 200:
        assert messages == [f"HCCL_BUFFSIZE={value!r} is ignored: it must be a whole number of MB from 1 to "
                            "4294967294; using 200"]
        assert {w.filename for w in caught} == {__file__}, "the warning points at the caller's line"
    else:
        assert messages == []


def test_hccl_buffsize_warning_points_at_the_call_that_made_the_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", "0")
    with pytest.warns(RuntimeWarning, match="HCCL_BUFFSIZE='0' is ignored") as warned:
        comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0, config={"name": "w"})
    comm.destroy()
    assert [w.filename for w in warned if issubclass(w.category, RuntimeWarning)] == [__file__]
