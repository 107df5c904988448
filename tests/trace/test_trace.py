"""The flight recorder: records, their states, dumps, automatic dumps on failure, the merge that
names the rank behind, ``comm.health()``, and turning it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import trace
from hcclpy.cli.trace import report
from hcclpy.errors import AclErrorCode, acl_error, hccl_error


@pytest.fixture()
def comm() -> Iterator[hcclpy.Communicator]:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as c:
        yield c


def test_records_and_their_states(comm: hcclpy.Communicator) -> None:
    stream = comm.device.create_stream()
    x = hcclpy.from_numpy(np.ones(6, np.float32), device=comm.device)
    comm.all_reduce(x, None, "max", stream=stream)
    comm.broadcast(x, 0, stream=stream)
    mine = hcclpy.trace.records(comm)
    assert [(r["op"], r["seq"], r["count"], r["dtype"]) for r in mine] == [("all_reduce", 1, 6, "fp32"),
                                                                            ("broadcast", 2, 6, "fp32")]
    assert mine[0]["op_kind"] == "max" and mine[1]["root"] == 0 and mine[0]["comm"] == comm.name
    assert hcclpy.trace.signature(mine[0]) == "all_reduce(count=6, fp32, max)"
    y = hcclpy.empty(6, "float32", device=comm.device)
    comm.reduce(x, y, "min", 0, stream=stream)  # the general path
    comm.reduce(x, x, "prod", 0, stream=stream)  # the fast path
    reduced = hcclpy.trace.records(comm)[-2:]
    # reduce has both a reduce op and a root, as the simulator's messages write it
    assert [hcclpy.trace.signature(r) for r in reduced] == ["reduce(count=6, fp32, min, root=0)",
                                                            "reduce(count=6, fp32, prod, root=0)"]
    stream.synchronize()
    event = stream.record()
    event.synchronize()  # an event seen complete completes what was queued before it
    assert {r["state"] for r in hcclpy.trace.records(comm)} == {"completed"}
    comm.all_reduce(x, None, "sum", stream=stream)
    assert hcclpy.trace.records(comm)[-1]["state"] in ("pending", "completed")
    stream.synchronize()
    last = hcclpy.trace.records(comm)[-1]
    assert last["state"] == "completed" and last["completed_by_ns"] >= last["queued_ns"]
    stream.close()


def _aborted(rank: int, size: int, info: bytes) -> Any:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        if rank == 1:
            return None  # never joins: rank 0's all_reduce waits until aborted
        stream = comm.device.create_stream()
        comm.all_reduce(hcclpy.from_numpy(np.ones(4, np.float32), device=comm.device), None, "sum", stream=stream)
        comm.abort()
        try:
            stream.synchronize()
        except hcclpy.AclError:
            pass
        return hcclpy.trace.records(comm)[-1]["state"], comm.health()
    finally:
        comm.destroy()


def test_a_failed_stream_marks_its_operations_failed() -> None:
    state, health = ranks.run("threads", _aborted, 2, timeout=60)[0]
    assert state == "failed"
    assert health["pending"] == 1 and health["first_pending"] == 1 and health["last_completed"] is None
    assert health["last_error"].name == "HCCL_E_SUSPENDING"


def test_health(comm: hcclpy.Communicator) -> None:
    x = hcclpy.from_numpy(np.ones(256, np.float32), device=comm.device)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_gather(x, hcclpy.empty(256, "float32", device=comm.device))
    comm.device.default_stream.synchronize()
    health = comm.health()
    assert health["pending"] == 0 and health["issued"] == 4 and health["last_completed"] == 4
    assert health["last_error"] is None and health["first_pending"] is None
    reduces = health["operations"]["all_reduce"]
    assert reduces["count"] == 3 and reduces["bytes"] == 3 * 1024 and reduces["average_latency_us"] > 0
    assert health["operations"]["all_gather"]["count"] == 1


def test_dump_writes_json_and_a_chrome_trace(comm: hcclpy.Communicator, tmp_path: Any) -> None:
    comm.all_reduce(hcclpy.from_numpy(np.ones(2, np.float32), device=comm.device))
    comm.device.default_stream.synchronize()
    path = hcclpy.trace.dump(tmp_path / "rank.json")
    data = json.loads(path.read_text())
    assert data["pid"] == os.getpid() and data["records"][-1]["op"] == "all_reduce"
    chrome = json.loads((tmp_path / "rank.chrome.json").read_text())
    slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert slices[-1]["name"] == "all_reduce(count=2, fp32, sum)" and slices[-1]["cat"] == "completed"
    assert slices[-1]["dur"] >= 0


def _stall(rank: int, size: int, info: bytes, directory: str) -> str:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    x = hcclpy.from_numpy(np.ones(8, np.float32), device=comm.device)
    for _ in range(3):
        comm.all_reduce(x)
    comm.device.default_stream.synchronize()
    released = Path(directory) / "released"
    if rank == 1:  # stuck elsewhere: it never joins the fourth all_reduce
        hcclpy.trace.dump(Path(directory) / "rank1.json")
        deadline = time.monotonic() + 60
        while not released.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        comm.destroy()
        return "waited"
    comm.all_reduce(x)
    try:
        comm.device.default_stream.synchronize()
        outcome = "returned"
    except hcclpy.HcclpyError as exc:
        outcome = type(exc).__name__  # and the recorder has dumped itself into HCCLPY_TRACE_DIR
    released.write_text("")
    comm.destroy()
    return outcome


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_stall_is_dumped_and_the_merge_names_the_rank_behind(tmp_path: Any) -> None:
    out = ranks.run_processes(_stall, 2, str(tmp_path), timeout=90,
                              env={"HCCLPY_TRACE_DIR": str(tmp_path), "HCCL_EXEC_TIMEOUT": "2"})
    assert out[1] == "waited" and out[0] in ("AclTimeoutError", "HcclTimeoutError"), out
    dumps = sorted(p.name for p in tmp_path.glob("*.json") if not p.name.endswith(".chrome.json"))
    assert len(dumps) == 2 and "rank1.json" in dumps, dumps
    merged = subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert merged.returncode == 0, merged.stderr
    text = merged.stdout
    assert "rank 0: last completed #3 all_reduce(count=8, fp32, sum); first pending #4 all_reduce(count=8, fp32, " \
           "sum) (failed)" in text, text
    assert "rank 1: last completed #3 all_reduce(count=8, fp32, sum); first pending none" in text, text
    assert "behind: rank(s) 1 issued fewer collectives (3) than the others (4)" in text, text
    assert json.loads((tmp_path / "merged.chrome.json").read_text())["traceEvents"]


def test_merge_of_an_empty_directory(tmp_path: Any) -> None:
    done = subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "no flight-recorder dumps" in done.stderr


def test_report_names_ranks_without_a_dump() -> None:
    item: Dict[str, Any] = {"comm": "w", "rank": 0, "size": 3, "seq": 1, "op": "barrier", "count": 0, "dtype": None,
                            "state": "pending"}
    lines = report([{"records": [item]}])
    assert "  no dump from rank(s) 1, 2: they may be the ones stuck" in lines


def _record(rank: int, seq: int, op: str, count: int = 8, **extra: Any) -> Dict[str, Any]:
    return {"comm": "w", "rank": rank, "size": 2, "seq": seq, "op": op, "count": count, "dtype": "fp32",
            "state": "completed", **extra}


def _write_dump(directory: Any, pid: int, dumped_ns: int, records: List[Dict[str, Any]]) -> None:
    for item in records:
        item.update(stream=1, queued_ns=item["seq"], completed_by_ns=None)
    data = {"host": "h", "pid": pid, "rank": records[0]["rank"], "dumped_ns": dumped_ns, "records": records}
    (directory / f"trace-{pid}-{dumped_ns}.json").write_text(json.dumps(data))


def test_merge_takes_each_process_s_newest_dump_and_warns_of_dumps_of_several_jobs(tmp_path: Any) -> None:
    def merge() -> str:
        done = subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", str(tmp_path)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    # One process dumped twice: its newer dump has #1 completed, which the older had pending.
    _write_dump(tmp_path, 10, 1, [_record(0, 1, "all_reduce", state="pending")])
    _write_dump(tmp_path, 10, 2, [_record(0, 1, "all_reduce")])
    _write_dump(tmp_path, 11, 2, [_record(1, 1, "all_reduce")])
    out = merge()
    assert "rank 0: last completed #1 all_reduce" in out and "pending #1" not in out and "warning" not in out, out
    # A later job's rank 0 dumped into the same directory.
    _write_dump(tmp_path, 20, 3, [_record(0, 1, "broadcast", state="pending")])
    out = merge()
    assert "  warning: the records of rank(s) 0 come from more than one process: the directory holds dumps of " \
           "several jobs" in out, out


def test_report_says_which_failed_operations_may_be_done() -> None:
    # Three operations synchronised once, and the wait failed: one of them failed, not all.
    rank0 = [_record(0, 1, "all_reduce")] + [_record(0, seq, op, state="failed")
                                             for seq, op in ((2, "all_reduce"), (3, "all_reduce"), (4, "broadcast"))]
    lines = report([{"records": rank0}, {"records": [_record(1, 1, "all_reduce")]}])
    assert any(line.startswith("  rank 0: last completed #1 all_reduce(count=8, fp32); first pending #2 all_reduce"
                               "(count=8, fp32) (failed, or done before the failure: 3 operations were queued "
                               "since the last one known complete, and one of them failed)") for line in lines), lines
    one = report([{"records": [_record(0, 1, "all_reduce", state="failed")]}])
    assert any(line.endswith("first pending #1 all_reduce(count=8, fp32) (failed)") for line in one), one


def test_report_names_the_first_operation_the_ranks_disagree_on() -> None:
    agreed = [(1, "all_reduce", {"op_kind": "sum"}), (2, "all_gather_v", {}), (3, "send", {"peer": 1})]
    rank0 = [_record(0, seq, op, **extra) for seq, op, extra in agreed]
    rank1 = [_record(1, 1, "all_reduce", op_kind="sum"), _record(1, 2, "all_gather_v", count=3),
             _record(1, 3, "recv", peer=0)]  # uneven counts and a send's matching recv agree
    assert not any("mismatch" in line for line in report([{"records": rank0}, {"records": rank1}]))
    for theirs, why in ((_record(1, 4, "all_reduce", op_kind="sum"), "another collective"),
                        (_record(1, 4, "broadcast", count=4, root=1), "another count"),
                        (_record(1, 4, "broadcast", root=0), "another root")):
        lines = report([{"records": rank0 + [_record(0, 4, "broadcast", root=1)]}, {"records": rank1 + [theirs]}])
        mismatch = [line for line in lines if "mismatch" in line]
        assert mismatch and mismatch[0].startswith("  mismatch at #4: rank 0 broadcast(count=8, fp32, root=1), "
                                                   "rank 1 "), (why, lines)


def _desync(rank: int, size: int, info: bytes) -> str:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    x = hcclpy.from_numpy(np.ones(8, np.float32), device=comm.device)
    comm.all_reduce(x)
    comm.broadcast(x, 0) if rank == 0 else comm.all_reduce(x, op="max")
    try:
        comm.device.default_stream.synchronize()
    except hcclpy.HcclpyError as exc:  # the recorder has dumped itself into HCCLPY_TRACE_DIR
        return type(exc).__name__
    finally:
        comm.destroy()
    return "returned"


@pytest.mark.timeout(120)
def test_a_desync_is_dumped_and_the_merge_names_it(tmp_path: Any) -> None:
    out = ranks.run_processes(_desync, 2, timeout=90, env={"HCCLPY_TRACE_DIR": str(tmp_path), "HCCL_EXEC_TIMEOUT": "5"})
    assert "returned" not in out, out
    merged = subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert merged.returncode == 0, merged.stderr
    assert "mismatch at #2: rank 0 broadcast(count=8, fp32, root=0), rank 1 all_reduce(count=8, fp32, max)" \
        in merged.stdout, merged.stdout


SCRIPT = textwrap.dedent("""
    import warnings; warnings.simplefilter("ignore")
    import hcclpy, numpy as np
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    x = hcclpy.from_numpy(np.ones(2, np.float32), device=0)
    for _ in range(40):
        comm.all_reduce(x)
    comm.device.default_stream.synchronize()
    print(len(hcclpy.trace.records()), hcclpy.trace.enabled())
    comm.destroy()
""")


@pytest.mark.parametrize("env, expected", [({"HCCLPY_TRACE": "0"}, "0 False"), ({"HCCLPY_TRACE_SIZE": "16"}, "16 True")])
def test_turning_off_and_sizing_the_ring(env: Dict[str, str], expected: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


# ------------------------------------------------- point-to-point calls are numbered apart

def _root_hands_out(rank: int, size: int, info: bytes, name: str) -> Dict[str, Any]:
    """Rank 0 sends a block to every other rank, which receives it; then every rank runs two
    all_reduces: the ranks issue different numbers of point-to-point calls, the same collectives."""
    comm = hcclpy.Communicator(size, info, rank, device=rank, config={"name": name})
    x = hcclpy.from_numpy(np.ones(8, np.float32), device=comm.device)
    if rank == 0:
        for peer in range(1, size):
            comm.send(x, peer)
    else:
        comm.recv(x, 0)
    for _ in range(2):
        comm.all_reduce(x)
    comm.device.default_stream.synchronize()
    health = comm.health()
    mine = [(r["op"], r["seq"], r["p2p_seq"]) for r in hcclpy.trace.records(comm)]
    comm.destroy()
    return {"records": mine, "issued": health["issued"], "p2p_issued": health["p2p_issued"]}


@pytest.mark.timeout(120)
def test_point_to_point_calls_are_numbered_apart_from_collectives() -> None:
    name = f"handout_{uuid.uuid4().hex[:12]}"
    out = ranks.run_threads(_root_hands_out, 3, name, timeout=90)
    assert out[0] == {"records": [("send", None, 1), ("send", None, 2), ("all_reduce", 1, None),
                                  ("all_reduce", 2, None)], "issued": 2, "p2p_issued": 2}
    for rank in (1, 2):
        assert out[rank] == {"records": [("recv", None, 1), ("all_reduce", 1, None), ("all_reduce", 2, None)],
                             "issued": 2, "p2p_issued": 1}
    lines = report([{"records": [r for r in hcclpy.trace.records() if r["comm"] == name]}])
    assert lines == [f"communicator '{name}': dumps from 3 of 3 ranks"] + [
        f"  rank {rank}: last completed #2 all_reduce(count=8, fp32, sum); first pending none" for rank in range(3)
    ] + ["  every rank issued 2 collectives"]


def _p2p_record(rank: int, p2p_seq: int, op: str, peer: int, state: str = "completed") -> Dict[str, Any]:
    return {"comm": "w", "instance": 1, "rank": rank, "size": 3, "seq": None, "p2p_seq": p2p_seq, "op": op,
            "count": 8, "dtype": "fp32", "peer": peer, "state": state, "queued_ns": p2p_seq}


def _collective_record(rank: int, seq: int, state: str = "completed") -> Dict[str, Any]:
    return {"comm": "w", "instance": 1, "rank": rank, "size": 3, "seq": seq, "p2p_seq": None, "op": "all_reduce",
            "count": 8, "dtype": "fp32", "op_kind": "sum", "state": state, "queued_ns": 100 + seq}


def test_the_merge_lines_ranks_up_by_their_collectives() -> None:
    """The audit's case: rank 0 sends to ranks 1 and 2, which receive once each; rank 2 then skips
    the last of three all_reduces. Rank 2 alone is behind, and nothing mismatches."""
    rank0 = [_p2p_record(0, 1, "send", 1), _p2p_record(0, 2, "send", 2)]
    rank0 += [_collective_record(0, 1), _collective_record(0, 2), _collective_record(0, 3, "failed")]
    rank1 = [_p2p_record(1, 1, "recv", 0)] + [_collective_record(1, s) for s in (1, 2)]
    rank1 += [_collective_record(1, 3, "failed")]
    rank2 = [_p2p_record(2, 1, "recv", 0)] + [_collective_record(2, s) for s in (1, 2)]
    lines = report([{"records": rank0}, {"records": rank1}, {"records": rank2}])
    assert lines == [
        "communicator 'w': dumps from 3 of 3 ranks",
        "  rank 0: last completed #2 all_reduce(count=8, fp32, sum); first pending #3 all_reduce(count=8, fp32, sum) "
        "(failed)",
        "  rank 1: last completed #2 all_reduce(count=8, fp32, sum); first pending #3 all_reduce(count=8, fp32, sum) "
        "(failed)",
        "  rank 2: last completed #2 all_reduce(count=8, fp32, sum); first pending none",
        "  behind: rank(s) 2 issued fewer collectives (2) than the others (3)",
    ]


def test_the_merge_shows_a_pending_point_to_point_call() -> None:
    rank0 = [_collective_record(0, 1), _p2p_record(0, 1, "send", 1, "pending")]
    rank0[1]["queued_ns"] = 200
    rank1 = [_collective_record(1, 1)]
    lines = report([{"records": rank0}, {"records": rank1}])
    assert "  rank 0: last completed #1 all_reduce(count=8, fp32, sum); first pending p2p #1 send(count=8, fp32, " \
           "peer=1) (pending)" in lines, lines


# ------------------------------------------------------- communicators that share a name

def test_a_new_communicator_of_an_old_name_has_its_own_history(tmp_path: Path) -> None:
    name = f"solo_{uuid.uuid4().hex[:12]}"
    x = hcclpy.zeros(4, "float32", device=0)
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0, config={"name": name}) as old:
        for _ in range(3):
            old.all_reduce(x)
        old.device.default_stream.synchronize()
    new = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0, config={"name": name})
    try:
        assert hcclpy.trace.records(new) == []
        health = new.health()
        assert (health["issued"], health["pending"], health["last_completed"], health["operations"]) == (0, 0, None,
                                                                                                          {})
        new.all_reduce(x, op="max")
        new.device.default_stream.synchronize()
        assert [(r["op"], r["seq"], r["instance"]) for r in hcclpy.trace.records(new)] == [("all_reduce", 1, 2)]
        assert new.health()["issued"] == 1 and new.health()["operations"]["all_reduce"]["count"] == 1
        assert [r["instance"] for r in hcclpy.trace.records(old)] == [1, 1, 1]
    finally:
        new.destroy()
    mine = [r for r in hcclpy.trace.records() if r["comm"] == name]
    assert report([{"records": mine}]) == [
        f"communicator '{name}': dumps from 1 of 1 ranks",
        "  rank 0: last completed #3 all_reduce(count=4, fp32, sum); first pending none",
        "  every rank issued 3 collectives",
        f"communicator '{name}' (instance 2): dumps from 1 of 1 ranks",
        "  rank 0: last completed #1 all_reduce(count=4, fp32, max); first pending none",
        "  every rank issued 1 collective",
    ]
    tracks = {e["tid"] for e in trace.chrome_trace(mine, {"rank": 0, "pid": 1, "host": "h", "dumped_ns": 0})
              ["traceEvents"] if e["ph"] == "X"}
    assert tracks == {f"{name} (rank 0)", f"{name} [2] (rank 0)"}


def _two_worlds(rank: int, size: int, info: bytes, name: str) -> List[Any]:
    """Two communicators of one name on the same ranks, one after the other, with different
    histories: three all_reduces on the first, one on the second (while the first lives, HCCL
    refuses a second of its name)."""
    parent = hcclpy.Communicator(size, info, rank, device=rank)
    first = parent.split(list(range(size)), config={"name": name})
    x = hcclpy.from_numpy(np.ones(4, np.int32), device=first.device)
    for _ in range(3):
        first.all_reduce(x)
    first.device.default_stream.synchronize()
    first.destroy()
    parent.barrier()  # the name is free once every rank of this process has destroyed its first
    second = parent.split(list(range(size)), config={"name": name})
    second.all_reduce(x, op="max")
    second.device.default_stream.synchronize()
    out = [(r["instance"], r["seq"]) for r in hcclpy.trace.records(second)]
    second.destroy()
    parent.destroy()
    return out


@pytest.mark.timeout(120)
def test_communicators_of_one_name_are_merged_apart() -> None:
    name = f"world_{uuid.uuid4().hex[:12]}"
    assert ranks.run_threads(_two_worlds, 2, name, timeout=90) == [[(2, 1)], [(2, 1)]]
    mine = [r for r in hcclpy.trace.records() if r["comm"] == name]
    lines = report([{"records": mine}])
    assert f"communicator '{name}': dumps from 2 of 2 ranks" in lines
    assert f"communicator '{name}' (instance 2): dumps from 2 of 2 ranks" in lines
    assert lines.count("  every rank issued 3 collectives") == 1 and "  every rank issued 1 collective" in lines
    assert not any("mismatch" in line for line in lines), lines


# -------------------------------------------------------------------- what triggers a dump

@pytest.fixture()
def fresh_dump_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """No dump in the last second, and no wait that gave up dumped yet."""
    monkeypatch.setattr(trace, "_last_auto", 0.0)
    monkeypatch.setattr(trace, "_last_give_up", object())


def test_a_wait_that_gives_up_dumps_once_per_stall(comm: hcclpy.Communicator, fresh_dump_state: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gave_up = acl_error(AclErrorCode.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "aclrtSynchronizeStreamWithTimeout")
    comm.all_reduce(hcclpy.zeros(2, "float32", device=0))
    assert trace._should_dump(gave_up)
    monkeypatch.setattr(trace, "_last_auto", 0.0)  # past the once-a-second limit
    assert not trace._should_dump(gave_up)  # nothing queued since: the same stall, already dumped
    assert trace._should_dump(hccl_error(4, "HcclAllReduce"))  # a failure always dumps
    monkeypatch.setattr(trace, "_last_auto", 0.0)
    comm.all_reduce(hcclpy.zeros(2, "float32", device=0))
    assert trace._should_dump(gave_up)  # new operations: a new dump
    assert not trace._should_dump(hccl_error(4, "HcclAllReduce"))  # but not twice in one second
    comm.device.default_stream.synchronize()


def test_a_stall_seen_by_a_polling_wait_is_dumped_once(tmp_path: Path, fresh_dump_state: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCLPY_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "60")
    info = hcclpy.RootInfo.generate(device=0)
    made: Dict[int, hcclpy.Communicator] = {}
    threads = [threading.Thread(target=lambda r=r: made.__setitem__(r, hcclpy.Communicator(2, info, r, device=r)),
                                daemon=True) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stream = made[0].device.create_stream()
    made[0].all_reduce(hcclpy.zeros(4, "float32", device=0), stream=stream)  # rank 1 joins later
    for attempt in range(3):
        with pytest.raises(hcclpy.CommTimeoutError):
            stream.synchronize(timeout=0.05)
        dumps = [p for p in tmp_path.glob("hcclpy-trace-*.json") if not p.name.endswith(".chrome.json")]
        assert len(dumps) == (1 if attempt == 0 else 0), attempt
        assert attempt or json.loads(dumps[0].read_text())["records"][-1]["state"] == "pending"
        for path in tmp_path.iterdir():
            path.unlink()  # a later dump would write it again
        monkeypatch.setattr(trace, "_last_auto", 0.0)
    late = threading.Thread(target=lambda: made[1].all_reduce(hcclpy.zeros(4, "float32", device=1)), daemon=True)
    late.start()
    stream.synchronize(timeout=30)
    late.join(30)
    made[1].device.default_stream.synchronize(timeout=30)
    stream.close()
    for c in made.values():
        c.destroy()


def test_a_bad_ring_size_warns_and_keeps_the_default_so_that_info_can_report_it() -> None:
    """A bad HCCLPY_TRACE_SIZE once failed ``import hcclpy``, and with it ``hcclpy info``."""
    env = {**os.environ, "HCCLPY_TRACE_SIZE": "lots"}
    message = ("HCCLPY_TRACE_SIZE is 'lots', not a whole number of operations (16 or more); the flight recorder "
               "keeps the default 1024")
    done = subprocess.run([sys.executable, "-c", "import hcclpy._trace as t; print(t.capacity)"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "1024", done.stderr
    assert f"RuntimeWarning: {message}" in done.stderr
    info = subprocess.run([sys.executable, "-m", "hcclpy", "info", "--json"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert message in data["warnings"] and data["environment"]["HCCLPY_TRACE_SIZE"] == "lots"


@pytest.mark.parametrize("value", ["no", "0", 0, 1, None, [], 0.0])
def test_set_enabled_takes_only_a_bool(value: Any) -> None:
    """``set_enabled("no")`` once turned recording on."""
    before = trace.enabled()
    with pytest.raises(TypeError, match=rf"^on={value!r} must be True or False$".replace("[", r"\[").replace("]", r"\]")):
        trace.set_enabled(value)
    assert trace.enabled() is before
    trace.set_enabled(np.bool_(False))
    try:
        assert trace.enabled() is False
    finally:
        trace.set_enabled(before)


@pytest.mark.parametrize("value", ["x", 5, object()])
def test_records_refuses_what_is_not_a_communicator(value: Any) -> None:
    with pytest.raises(TypeError, match="^comm must be an hcclpy.Communicator or None, got "):
        trace.records(value)


@pytest.mark.parametrize("value", [None, 5, b"rank.json"])
def test_dump_names_its_path_argument(value: Any) -> None:
    with pytest.raises(TypeError, match=r"^path must be a str or os\.PathLike \(the JSON file to write\), got "):
        trace.dump(value)


def _merge(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("edit, message", [
    (lambda d: {"records": []}, "is not a hcclpy trace dump: missing 'host'"),
    (lambda d: {k: v for k, v in d.items() if k != "rank"}, "is not a hcclpy trace dump: missing 'rank'"),
    (lambda d: {**d, "records": [{k: v for k, v in d["records"][0].items() if k != "state"}]},
     "is not a hcclpy trace dump: records[0] is missing 'state'"),
    (lambda d: {**d, "records": [5]}, "is not a hcclpy trace dump: records[0] is not an object"),
])
def test_merge_of_a_malformed_dump_says_which_file_and_what_is_missing(comm: hcclpy.Communicator, tmp_path: Any,
                                                                       edit: Any, message: str) -> None:
    """A dump without ``rank`` or a record without ``state`` once ended the merge in a KeyError traceback."""
    comm.all_reduce(hcclpy.from_numpy(np.ones(2, np.float32), device=comm.device))
    comm.device.default_stream.synchronize()
    good = json.loads(hcclpy.trace.dump(tmp_path / "rank0.json").read_text())
    (tmp_path / "rank1.json").write_text(json.dumps(edit(good)))
    done = _merge(str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"hcclpy trace: {tmp_path / 'rank1.json'} {message}"


def test_merge_into_an_unwritable_place_is_a_clear_error(comm: hcclpy.Communicator, tmp_path: Any) -> None:
    """``--out`` in a missing directory once ended the merge in a FileNotFoundError traceback."""
    comm.all_reduce(hcclpy.from_numpy(np.ones(2, np.float32), device=comm.device))
    comm.device.default_stream.synchronize()
    hcclpy.trace.dump(tmp_path / "rank0.json")
    out = tmp_path / "missing" / "x.json"
    done = _merge(str(tmp_path), "--out", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"hcclpy trace: cannot write the merged trace to {out}: No such file or directory"
