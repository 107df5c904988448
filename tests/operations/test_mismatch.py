"""A collective that the ranks call differently (count, data type, reduce op, root, count vector or
count matrix) raises :class:`hcclpy.CollectiveMismatchError` on every rank, naming the rank's own
call and a peer's, at every size, on ranks that are threads or processes; the mismatch breaks the
communicator for good, so a later call raises the same category, and a new communicator works.

In every case the last rank is the odd one: it calls what ``CASES`` gives for ``odd=True``, the
others what it gives for ``odd=False``. A rank reports the first peer whose call differs from its
own, so the ranks that agree name the odd rank and the odd rank names rank 0.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import errors

# A case: (what a rank calls, how the simulator describes it), both given (odd, n, size).
Call = Callable[[hcclpy.Communicator, hcclpy.Stream, bool, int, int], None]
Describe = Callable[[bool, int, int], str]


def _ones(count: int, device: hcclpy.Device, dtype: str = "float32") -> hcclpy.DeviceArray:
    return hcclpy.from_numpy(np.ones(count, dtype), device=device)


def _all_reduce(count: Callable[[bool, int], int], dtype: Callable[[bool], str], op: Callable[[bool], str]) -> Call:
    def call(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
        elements, kind = count(odd, n), dtype(odd)
        comm.all_reduce(_ones(elements, comm.device, kind), hcclpy.empty(elements, kind, device=comm.device), op(odd),
                        stream=stream)
    return call


def _broadcast(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    comm.broadcast(_ones(n, comm.device), 1 if odd else 0, stream=stream)


def _reduce(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    comm.reduce(_ones(n, comm.device), hcclpy.empty(n, "float32", device=comm.device), "sum", 1 if odd else 0,
                stream=stream)


def _all_gather(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    count = n + 1 if odd else n
    comm.all_gather(_ones(count, comm.device), hcclpy.empty(count * size, "float32", device=comm.device),
                    stream=stream)


def _matrix(odd: bool, n: int, size: int) -> List[List[int]]:
    """Rank i sends rank j n + i + j elements; the odd rank thinks it sends rank 0 one more."""
    matrix = [[n + i + j for j in range(size)] for i in range(size)]
    if odd:
        matrix[size - 1][0] += 1
    return matrix


def _all_to_all_vc(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    matrix = _matrix(odd, n, size)
    me = comm.rank
    sends, receives = sum(matrix[me]), sum(row[me] for row in matrix)
    comm.all_to_all_vc(_ones(sends, comm.device), hcclpy.empty(receives, "float32", device=comm.device), matrix,
                       stream=stream)


def _vc_description(odd: bool, n: int, size: int) -> str:
    # The matrices differ in one entry, [size - 1][0].
    return f"all_to_all_vc(fp32, sendCountMatrix[{size - 1}][0] = {_matrix(odd, n, size)[size - 1][0]})"


def _all_gather_v(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    # Every rank sends n elements, but the odd rank n + 1, and only it expects n + 1 from itself.
    counts = [n] * size
    if odd:
        counts[size - 1] = n + 1
    displs = [sum(counts[:r]) for r in range(size)]
    comm.all_gather_v(_ones(counts[comm.rank], comm.device), hcclpy.empty(sum(counts), "float32", device=comm.device),
                      counts, displs, stream=stream)


CASES: Dict[str, Tuple[Call, Describe]] = {
    "all_reduce_count": (_all_reduce(lambda odd, n: n + 1 if odd else n, lambda odd: "float32", lambda odd: "sum"),
                         lambda odd, n, size: f"all_reduce(count={n + 1 if odd else n}, fp32, sum)"),
    "all_reduce_dtype": (_all_reduce(lambda odd, n: n, lambda odd: "int32" if odd else "float32", lambda odd: "sum"),
                         lambda odd, n, size: f"all_reduce(count={n}, {'int32' if odd else 'fp32'}, sum)"),
    "all_reduce_op": (_all_reduce(lambda odd, n: n, lambda odd: "float32", lambda odd: "max" if odd else "sum"),
                      lambda odd, n, size: f"all_reduce(count={n}, fp32, {'max' if odd else 'sum'})"),
    "broadcast_root": (_broadcast, lambda odd, n, size: f"broadcast(count={n}, fp32, root={1 if odd else 0})"),
    "reduce_root": (_reduce, lambda odd, n, size: f"reduce(count={n}, fp32, sum, root={1 if odd else 0})"),
    "all_gather_count": (_all_gather, lambda odd, n, size: f"all_gather(count={n + 1 if odd else n}, fp32)"),
    "all_to_all_vc_matrix": (_all_to_all_vc, _vc_description),
}

# Element counts that take each of the simulator's paths for a 4-byte type: the one word
# compared in the progress line (tiny), the data copied with the announcement (eager), and
# the general path, which reads the peers' buffers.
SIZES = {"tiny": 1, "eager": 40, "general": 4096}


def _expected(case: str, rank: int, size: int, n: int) -> str:
    """What rank ``rank``'s message says: its own call, then the first peer's that differs."""
    describe = CASES[case][1]
    odd = size - 1
    peer = 0 if rank == odd else odd
    own, other = describe(rank == odd, n, size), describe(peer == odd, n, size)
    return f"rank {rank} called {own} but rank {peer} called {other}"


def _outcome(exc: Optional[BaseException]) -> Dict[str, Any]:
    """What the test reads of an exception, in a form that crosses processes."""
    if exc is None:
        return {"class": None}
    return {"class": type(exc).__name__, "mismatch": isinstance(exc, hcclpy.CollectiveMismatchError),
            "value_error": isinstance(exc, ValueError), "code": getattr(exc, "code", None),
            "name": getattr(exc, "name", ""), "message": str(exc), "detail": getattr(exc, "detail", "")}


def _caught(call: Callable[[], Any]) -> Dict[str, Any]:
    try:
        call()
    except hcclpy.HcclpyError as exc:
        return _outcome(exc)
    return _outcome(None)


def _one_case(world: hcclpy.Communicator, case: str, n: int) -> Dict[str, Any]:
    """Run ``case`` on a fresh communicator (split from ``world``, which stays healthy): the
    mismatch, then what the broken communicator says (its async error, a later call)."""
    size = world.size
    comm = world.split(list(range(size)))
    assert comm is not None
    stream = comm.device.create_stream()
    try:
        call = CASES[case][0]
        # One operation that matches first: the mismatch is operation #2.
        comm.all_reduce(_ones(4, comm.device), stream=stream)
        stream.synchronize(timeout=30)
        out = {"error": _caught(lambda: (call(comm, stream, world.rank == size - 1, n, size),
                                         stream.synchronize(timeout=30)))}
        out["async"] = _outcome(comm.async_error())
        later = comm.device.create_stream()
        out["later"] = _caught(lambda: comm.all_reduce(_ones(4, comm.device), stream=later))
        later.close()
        return out
    finally:
        with contextlib.suppress(hcclpy.AclError):  # a failed stream reports its failure on closing too
            stream.close()
        comm.destroy(timeout=30)


def _every_case(rank: int, size: int, info: bytes, cases: List[Tuple[str, int]]) -> List[Dict[str, Any]]:
    world = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        return [_one_case(world, case, n) for case, n in cases]
    finally:
        world.destroy(timeout=30)


def _check(out: List[List[Dict[str, Any]]], cases: List[Tuple[str, int]]) -> None:
    size = len(out)
    for rank, results in enumerate(out):
        for (case, n), result in zip(cases, results):
            where = f"{case} n={n}, rank {rank} of {size}"
            error = result["error"]
            assert error["class"] == "AclMismatchError", (where, error)
            assert error["mismatch"] and error["value_error"], (where, error)
            assert error["name"] == "ACL_ERROR_RT_AICPU_EXCEPTION", (where, error)  # CANN's code, unchanged
            want = _expected(case, rank, size, n)
            assert f"at operation #2: {want}" in error["message"], (where, want, error["message"])
            assert "destroy it on every rank and create a new one" in error["message"], (where, error)
            # The communicator reports what broke it, as the same category, on every rank.
            assert result["async"]["class"] == "HcclMismatchError", (where, result["async"])
            assert want in result["async"]["message"], (where, result["async"])
            # A later call is refused, naming the mismatch that broke the communicator.
            later = result["later"]
            assert later["class"] == "HcclMismatchError" and later["mismatch"], (where, later)
            assert "has failed" in later["message"] and "collective mismatch on '" in later["message"], (where, later)
            assert "destroy it and create a new one" in later["message"], (where, later)


THREAD_CASES = [(case, n) for case in CASES for n in SIZES.values()]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.timeout(240)
def test_every_rank_raises_the_mismatch_threads(size: int) -> None:
    out = ranks.run_threads(_every_case, size, THREAD_CASES, timeout=200)
    _check(out, THREAD_CASES)


# Processes: every case at the general size, and the tiny and eager sizes of one case (the
# check is the same code as for threads; what differs is that the peers are other processes).
PROCESS_CASES = [(case, SIZES["general"]) for case in CASES] + [("all_reduce_count", SIZES["tiny"]),
                                                                 ("all_reduce_count", SIZES["eager"])]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_every_rank_raises_the_mismatch_processes(size: int) -> None:
    out = ranks.run_processes(_every_case, size, PROCESS_CASES, timeout=240)
    _check(out, PROCESS_CASES)


@pytest.mark.timeout(120)
def test_a_large_mismatch_is_the_same_error() -> None:
    """16 MiB a rank: past the size where the simulator streams its stores around the caches."""
    cases = [("all_reduce_count", 4 << 20)]
    _check(ranks.run_threads(_every_case, 2, cases, timeout=90), cases)


# ---------------------------------------------------------------- count vectors (V operations)

def _reduce_scatter_v(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    # Every rank keeps n elements; the odd rank thinks it gives rank 0 one more.
    counts = [n] * size
    if odd:
        counts[0] = n + 1
    displs = [sum(counts[:r]) for r in range(size)]
    comm.reduce_scatter_v(_ones(sum(counts), comm.device), hcclpy.empty(n, "float32", device=comm.device), counts,
                          displs, "sum", stream=stream)


def _all_to_all_v(comm: hcclpy.Communicator, stream: hcclpy.Stream, odd: bool, n: int, size: int) -> None:
    # Every rank sends and expects n elements a peer; the odd rank sends rank 0 one more.
    sends, receives = [n] * size, [n] * size
    if odd:
        sends[0] = n + 1
    comm.all_to_all_v(_ones(sum(sends), comm.device), hcclpy.empty(sum(receives), "float32", device=comm.device),
                      sends, receives, [sum(sends[:r]) for r in range(size)], [sum(receives[:r]) for r in range(size)],
                      stream=stream)


# What a vector operation's odd rank gets wrong, and how the rank that sees it words both sides
# (the odd rank's own vectors agree with what it sends and keeps: it learns of the difference from
# that rank and quotes it).
V_CASES: Dict[str, Tuple[Call, str]] = {
    "all_gather_v": (_all_gather_v, r"rank \d called all_gather_v\(fp32, recvCounts\[{odd}\] = 8\) but rank {odd} "
                                    r"called all_gather_v\(sendCount=9, fp32\)"),
    "reduce_scatter_v": (_reduce_scatter_v, r"rank 0 called reduce_scatter_v\(recvCount=8, fp32, sum\) but rank {odd} "
                                            r"called reduce_scatter_v\(fp32, sum, sendCounts\[0\] = 9\)"),
    "all_to_all_v": (_all_to_all_v, r"rank 0 called all_to_all_v\(fp32, recvCounts\[{odd}\] = 8\) but rank {odd} "
                                    r"called all_to_all_v\(fp32, sendCounts\[0\] = 9\)"),
}


def _v_case(rank: int, size: int, info: bytes, case: str) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    try:
        return _caught(lambda: (V_CASES[case][0](comm, stream, rank == size - 1, 8, size),
                                stream.synchronize(timeout=30)))
    finally:
        with contextlib.suppress(hcclpy.AclError):
            stream.close()
        comm.destroy(timeout=30)


@pytest.mark.parametrize("case", sorted(V_CASES))
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.timeout(120)
def test_count_vectors_that_differ_are_the_same_error(case: str, size: int) -> None:
    """The odd rank passes a count that disagrees with another rank's vector. The rank whose
    vector it contradicts sees it; the odd rank (and, with 3 ranks, the third) learns of it from
    that rank: the same exception on every rank, and every message names both sides."""
    want = V_CASES[case][1].format(odd=size - 1)
    for rank, error in enumerate(ranks.run_threads(_v_case, size, case, timeout=90)):
        assert error["class"] == "AclMismatchError" and error["mismatch"], (rank, error)
        assert re.search(want, error["message"]), (rank, want, error["message"])


def test_the_matrix_entry_is_named_on_every_rank_of_a_wider_matrix() -> None:
    """Four ranks where rank 1's matrix differs from the others' in entry [3][2], in a row and a
    column that are neither rank 1's nor rank 0's: every rank still names the entry."""
    def body(rank: int, size: int, info: bytes) -> Dict[str, Any]:
        comm = hcclpy.Communicator(size, info, rank, device=rank)
        stream = comm.device.create_stream()
        matrix = [[2] * size for _ in range(size)]
        if rank == 1:
            matrix[3][2] = 5
        try:
            return _caught(lambda: (comm.all_to_all_vc(_ones(2 * size, comm.device),
                                                       hcclpy.empty(2 * size, "float32", device=comm.device),
                                                       matrix, stream=stream),
                                    stream.synchronize(timeout=30)))
        finally:
            with contextlib.suppress(hcclpy.AclError):
                stream.close()
            comm.destroy(timeout=30)

    for rank, error in enumerate(ranks.run_threads(body, 4, timeout=90)):
        assert error["class"] == "AclMismatchError", (rank, error)
        mine, theirs = (5, 2) if rank == 1 else (2, 5)
        peer = 0 if rank == 1 else 1
        assert (f"rank {rank} called all_to_all_vc(fp32, sendCountMatrix[3][2] = {mine}) but rank {peer} called "
                f"all_to_all_vc(fp32, sendCountMatrix[3][2] = {theirs})") in error["message"], (rank, error)


# Past 64 ranks the simulator publishes only each rank's own row and column of the matrix. Run in
# a process of its own, which the simulator gives 66 devices.
_WIDE = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import hcclpy
import ranks

def body(rank, size, info):
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    matrix = [[1] * size for _ in range(size)]
    if rank == 1:
        matrix[3][2] = 2  # in rank 3's row and rank 2's column: only they publish it
    try:
        comm.all_to_all_vc(hcclpy.from_numpy(np.ones(sum(matrix[rank]), np.float32), device=comm.device),
                           hcclpy.empty(sum(row[rank] for row in matrix), "float32", device=comm.device), matrix,
                           stream=stream)
        stream.synchronize(timeout=60)
        return "no error"
    except hcclpy.CollectiveMismatchError as exc:
        return exc.detail
    finally:
        try:
            stream.close()
        except hcclpy.AclError:
            pass
        comm.destroy(timeout=60)

for rank, detail in enumerate(ranks.run_threads(body, 66, timeout=150)):
    print(rank, detail)
"""


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_matrix_of_more_ranks_than_the_simulator_publishes_is_still_named_on_every_rank() -> None:
    """66 ranks, rank 1's matrix differing in entry [3][2]: rank 1 names the entry and both values
    (it sees rank 2's column and rank 3's row); every other rank names rank 1's call, whose entry
    lies outside what rank 1 publishes, and says that rank 1's error names it."""
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "HCCLPY_SIM_DEVICES": "66", "HCCLPY_SIM_DEVICE_MEMORY": "64M", "HCCLPY_BACKEND": "sim"}
    result = subprocess.run([sys.executable, "-c", _WIDE, str(Path(__file__).parents[1])], env=env, capture_output=True,
                            text=True, timeout=200)
    assert result.returncode == 0, result.stderr
    details = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(details) == 66, result.stdout
    assert ("rank 1 called all_to_all_vc(fp32, sendCountMatrix[3][2] = 2) but rank 2 called all_to_all_vc(fp32, "
            "sendCountMatrix[3][2] = 1)") in details["1"], details["1"]
    for rank, detail in details.items():
        if rank != "1":
            assert (f"rank {rank} called all_to_all_vc(fp32) but rank 1 called all_to_all_vc(fp32) with a different "
                    "sendCountMatrix, outside row and column 1 (rank 1's error names the entry)") in detail, detail


# ------------------------------------------------------------- after a mismatch: rebuild

def _rebuild(rank: int, size: int, info: bytes, directory: str) -> Dict[str, Any]:
    """The mismatch, a later call on the broken communicator, then what the docs say to do:
    destroy it on every rank and create a new one (root info shipped through a file, as a job
    without a world communicator would)."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    out: Dict[str, Any] = {}
    try:
        x = _ones(8 if rank == 0 else 16, comm.device)
        out["mismatch"] = _caught(lambda: (comm.all_reduce(x, stream=stream), stream.synchronize(timeout=30)))
        # A correct call now, on a new stream: refused, naming the mismatch.
        fresh = comm.device.create_stream()
        out["later"] = _caught(lambda: (comm.all_reduce(_ones(8, comm.device), stream=fresh),
                                        fresh.synchronize(timeout=30)))
        fresh.close()
    finally:
        with contextlib.suppress(hcclpy.AclError):
            stream.close()
        comm.destroy(timeout=30)
    path = os.path.join(directory, "rootinfo")
    if rank == 0:
        new_info = hcclpy.RootInfo.generate(device=rank)
        with open(path + ".tmp", "wb") as f:
            f.write(bytes(new_info))
        os.replace(path + ".tmp", path)
    assert ranks.wait_for(lambda: os.path.exists(path), 30), "rank 0 did not write the new root info"
    with open(path, "rb") as f:
        rebuilt = hcclpy.Communicator(size, hcclpy.RootInfo.from_bytes(f.read()), rank, device=rank)
    try:
        y = _ones(8, rebuilt.device)
        stream = rebuilt.device.create_stream()
        rebuilt.all_reduce(y, stream=stream)
        stream.synchronize(timeout=30)
        out["rebuilt"] = y.to_numpy().tolist()
        out["rebuilt_async"] = rebuilt.async_error()
        stream.close()
    finally:
        rebuilt.destroy(timeout=30)
    out["rebuilt_async"] = None if out["rebuilt_async"] is None else str(out["rebuilt_async"])
    return out


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(180)
@pytest.mark.slow
def test_the_communicator_is_broken_after_a_mismatch_and_a_new_one_works(mode: str, tmp_path: Any) -> None:
    out = ranks.run(mode, _rebuild, 2, str(tmp_path), timeout=150)
    for rank, result in enumerate(out):
        assert result["mismatch"]["class"] == "AclMismatchError", (rank, result)
        later = result["later"]
        assert later["class"] == "HcclMismatchError", (rank, later)
        assert later["name"] in ("HCCL_E_PARA", "HCCL_E_REMOTE"), (rank, later)  # CANN's codes
        assert "HcclAllReduce: communicator" in later["message"] and "has failed" in later["message"], later
        assert "rank 0 called all_reduce(count=8, fp32, sum) but rank 1 called all_reduce(count=16, fp32, sum)" in \
            later["message"] or "rank 1 called all_reduce(count=16, fp32, sum) but rank 0 called " \
            "all_reduce(count=8, fp32, sum)" in later["message"], later
        assert result["rebuilt"] == [2.0] * 8, (rank, result)
        assert result["rebuilt_async"] is None, (rank, result)


# --------------------------------------------------------------------------- the NumPy path

def _numpy_mismatch(rank: int, size: int, info: bytes, n: int) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    try:
        count = n + 1 if rank == size - 1 else n
        return _caught(lambda: comm.all_reduce(np.ones(count, np.float32)))
    finally:
        comm.destroy(timeout=30)


@pytest.mark.parametrize("n", [40, 1 << 20], ids=["small", "large"])
@pytest.mark.timeout(120)
def test_the_numpy_path_raises_the_same_error(n: int) -> None:
    out = ranks.run_threads(_numpy_mismatch, 2, n, timeout=90)
    for rank, error in enumerate(out):
        assert error["class"] is not None, (rank, "no error")
        assert error["mismatch"], (rank, error)
        assert f"rank {rank} called all_reduce(count=" in error["message"], (rank, error)


# ------------------------------------------------------------------- the marker, both sides

def test_the_python_marker_is_the_simulators() -> None:
    """The exception is chosen by the text the simulator starts every mismatch with: the two
    definitions must agree."""
    from pathlib import Path

    header = Path(hcclpy.__file__).parent / "sim" / "src" / "hccl" / "internal.h"
    match = re.search(r'#define HCCL_SIM_MISMATCH_MARK "(.*)"', header.read_text())
    assert match and match.group(1).replace("\\'", "'") == errors.SIM_MISMATCH_MARK
