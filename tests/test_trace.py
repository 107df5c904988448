"""The flight recorder: records, their states, dumps, automatic dumps on failure, the merge that
names the rank behind, ``comm.health()``, and turning it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy.cli.trace import report


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
    assert "behind: rank(s) 1 issued fewer operations (3) than the others (4)" in text, text
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


@pytest.mark.parametrize("name, value, message", [
    ("HCCLPY_TRACE_SIZE", "lots", "HCCLPY_TRACE_SIZE is 'lots'; use a whole number of operations (16 or more)"),
    ("HCCLPY_HOST_CHUNK_BYTES", "2X", "HCCLPY_HOST_CHUNK_BYTES is '2X'; use a number of bytes of at least 1024"),
    ("HCCLPY_HOST_CHUNK_BYTES", "100", "HCCLPY_HOST_CHUNK_BYTES is '100'"),
])
def test_a_bad_size_in_the_environment_is_named(name: str, value: str, message: str) -> None:
    done = subprocess.run([sys.executable, "-c", "import hcclpy"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, name: value})
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_chunk_sizes_take_a_unit() -> None:
    env = {**os.environ, "HCCLPY_HOST_CHUNK_BYTES": "4M"}
    done = subprocess.run([sys.executable, "-c", "import hcclpy.host; print(hcclpy.host.CHUNK_BYTES)"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == str(4 << 20), done.stderr
