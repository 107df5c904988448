"""Creating communicators: configs, sub-communicators (even/odd, a 2-D grid, a split of a split),
rank tables, and init_all driven from one thread with hcclpy.group()."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import _ffi


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
        assert "are both on device 0 of host" in message and "HCCLPY_SIM_NODE" in message, message


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
def test_from_rank_table(tmp_path: Path, servers: List[List[int]], config: Optional[Dict[str, Any]]) -> None:
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
    # Refused by the library, quickly, with its explanation.
    with pytest.raises(hcclpy.HcclError) as info:
        hcclpy.Communicator.from_rank_table(str(tmp_path / "missing.json"), 0, device=0)
    assert info.value.name == "HCCL_E_OPEN_FILE_FAILURE" and "missing.json" in str(info.value)
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
