"""The CANN 9.x communicator functions: ``config_info`` (HcclConfigGetInfo), ``hccl_buffer``
(HcclGetHcclBuffer), ``heterogeneous_mode`` (HcclGetHeterogMode) and the scalable root-info
bootstrap (HcclGetRootInfoScalable, HcclCommInitRootInfoScalable): what they answer on the
simulator, the refusals before any C call, and UnsupportedError where the library lacks them.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy import _ffi
from hcclpy.runtime._memory import copy_bytes
from test_binding_badinput import NoCCalls

MB = 1 << 20
H2D, D2H = 1, 2  # aclrtMemcpyKind


def _one_rank(config: Any = None) -> hcclpy.Communicator:
    return hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, config=config, device=0)


# ----------------------------------------------------------------------------- config_info

def test_config_info_answers_every_item_from_the_config() -> None:
    config = {"deterministic": 2, "udi": "job 17", "algorithm": "level0:NA;level1:ring", "op_expansion_mode": 3}
    with _one_rank(config) as comm:
        assert comm.config_info("op_expansion_mode") == "aiv"  # the config's 3 is HCCL_OP_EXPANSION_MODE_AIV
        assert comm.config_info("algorithm") == "level0:NA;level1:ring"
        assert comm.config_info("ub_multi_channel_num") == 1
        assert comm.config_info("deterministic") == 2
        assert comm.config_info("udi") == "job 17"


def test_config_info_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    monkeypatch.setenv("HCCL_ALGO", "level0:NA;level1:H-D_R")  # read when the communicator is made
    with _one_rank() as comm:
        assert comm.config_info("algorithm") == "level0:NA;level1:H-D_R"
        assert comm.config_info("deterministic") == 0
        assert comm.config_info("udi") == ""
        assert comm.config_info("op_expansion_mode") == "host"


def test_config_info_refuses_an_unknown_item_before_any_c_call() -> None:
    comm = _one_rank()
    real = comm._api
    guard = comm._api = NoCCalls(real)
    try:
        for item in ("algo", "HCCL_CONFIG_TYPE_UDI", 3, None):
            with pytest.raises(ValueError, match=rf"^item={item!r} must be one of 'op_expansion_mode', 'algorithm', "
                                                 "'ub_multi_channel_num', 'deterministic', 'udi'$"):
                comm.config_info(item)  # type: ignore[arg-type]
    finally:
        comm._api = real
        comm.destroy()
    assert guard.calls == []
    with pytest.raises(ValueError, match="was destroyed"):
        comm.config_info("udi")


# ----------------------------------------------------------------------------- hccl_buffer

def _buffer_all_reduce(rank: int, size: int, info: bytes, buffer_mb: int) -> List[str]:
    """Rank body: the HCCL buffer's size and address, then an all_reduce in place in it."""
    with hcclpy.Communicator(size, info, rank, config={"buffer_size_mb": buffer_mb}, device=rank) as comm:
        address, nbytes = comm.hccl_buffer()
        problems = []
        if nbytes != 2 * buffer_mb * MB:
            problems.append(f"{nbytes} bytes, expected twice {buffer_mb} MB")
        if comm.hccl_buffer() != (address, nbytes):
            problems.append("a second call returned another buffer")
        count = 1000
        data = ranks.make_input("hccl buffer", rank, count, "float32", "sum")
        copy_bytes(address, data.ctypes.data, data.nbytes, H2D)
        stream = comm.device.create_stream()
        comm.all_reduce((address, count, "float32"), stream=stream)  # in place, as a (ptr, count, dtype) buffer
        stream.synchronize()
        got = np.empty(count, np.float32)
        copy_bytes(got.ctypes.data, address, got.nbytes, D2H)
        want = ranks.reduce_reference([ranks.make_input("hccl buffer", r, count, "float32", "sum")
                                       for r in range(size)], "sum", "float32")
        problem = ranks.mismatch("all_reduce in the HCCL buffer", got, want)
        if problem:
            problems.append(problem)
        stream.close()
        return problems


@pytest.mark.parametrize("size", [1, 2, 3])
def test_hccl_buffer_holds_an_operation(size: int) -> None:
    results = ranks.run_threads(_buffer_all_reduce, size, 2, timeout=60)
    problems = [f"rank {r}: {p}" for r, found in enumerate(results) for p in found]
    assert not problems, "\n".join(problems)


def test_hccl_buffer_size_from_hccl_buffsize(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", "3")
    with _one_rank() as comm:
        assert comm.hccl_buffer()[1] == 6 * MB


def test_hccl_buffer_from_a_thread_on_another_device() -> None:
    """HCCL makes the buffer on the calling thread's current device: hcclpy calls it on the
    communicator's, whatever device the thread is on."""
    comm = _one_rank({"buffer_size_mb": 1})
    found: Dict[str, Any] = {}

    def elsewhere() -> None:
        with hcclpy.Device(3):
            try:
                found["buffer"] = comm.hccl_buffer()
            except BaseException as exc:  # noqa: BLE001 - reported below
                found["error"] = exc

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(30)
    try:
        assert "error" not in found, found.get("error")
        assert found["buffer"][1] == 2 * MB
        assert hcclpy.pointer_attributes(found["buffer"][0])[:2] == ("device", 0)
    finally:
        comm.destroy()


# ------------------------------------------------------------------------ heterogeneous mode

def test_heterogeneous_mode() -> None:
    comm = _one_rank()
    assert comm.heterogeneous_mode == "homogeneous"
    comm.destroy()
    with pytest.raises(ValueError, match="was destroyed"):
        comm.heterogeneous_mode


# ------------------------------------------------------------------ the scalable bootstrap

def _scalable(rank: int, size: int, info: bytes, roots: List[bytes], config: Optional[Dict[str, Any]]) -> List[str]:
    """Rank body: join from the roots' infos (as RootInfo and as bytes), then an all_reduce."""
    listed = [hcclpy.RootInfo(data) if index % 2 == 0 else data for index, data in enumerate(roots)]
    with hcclpy.Communicator(size, listed, rank, config=config, device=rank) as comm:
        problems = []
        if (comm.rank, comm.size) != (rank, size):
            problems.append(f"rank {comm.rank} of {comm.size}")
        if config and comm.name != config["name"]:
            problems.append(f"named {comm.name!r}")
        x = hcclpy.from_numpy(ranks.make_input("scalable", rank, 9, "int32", "sum"), device=rank)
        comm.all_reduce(x)
        want = ranks.reduce_reference([ranks.make_input("scalable", r, 9, "int32", "sum") for r in range(size)],
                                      "sum", "int32")
        problem = ranks.mismatch("all_reduce", x.to_numpy(), want)
        if problem:
            problems.append(problem)
        return problems


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [None, {"name": "scalable-world"}])
def test_scalable_bootstrap_over_the_rank_matrix(rank_matrix: ranks.RankMatrix,
                                                 config: Optional[Dict[str, Any]]) -> None:
    size = rank_matrix.size
    roots = [hcclpy.RootInfo.generate(device=r, scalable=True).to_bytes() for r in range(min(size, 2))]
    results = rank_matrix.run(_scalable, roots, config)
    problems = [f"rank {r}: {p}" for r, found in enumerate(results) for p in found]
    assert not problems, "\n".join(problems)


def _joins(rank: int, size: int, info: bytes, lists: List[List[bytes]]) -> str:
    hcclpy.Communicator(size, [hcclpy.RootInfo(data) for data in lists[rank]], rank, device=rank).destroy()
    return "joined"


def test_ranks_that_list_other_roots_fail() -> None:
    first, second, third = (hcclpy.RootInfo.generate(device=0, scalable=True).to_bytes() for _ in range(3))
    results = ranks.run_threads(_joins, 2, [[first, second], [first, third]], timeout=60, return_exceptions=True,
                                env={"HCCL_CONNECT_TIMEOUT": "5"})
    assert all(isinstance(result, ranks.RankError) and isinstance(result.exception, hcclpy.HcclError)
               for result in results), results


def test_bad_root_info_lists_are_refused_before_any_c_call() -> None:
    info = hcclpy.RootInfo.generate(device=0, scalable=True)
    other = hcclpy.RootInfo.generate(device=0, scalable=True)
    cases = [
        ([], ValueError, r"^root_info lists 0 root infos; a communicator of 2 ranks takes 1 to 2 \(one per root\)$"),
        ([info, other, info], ValueError, r"^root_info lists 3 root infos; a communicator of 2 ranks takes 1 to 2"),
        ([info, info], ValueError, r"^root_info\[0\] and root_info\[1\] are the same root info"),
        ([info, info.to_bytes()], ValueError, r"^root_info\[0\] and root_info\[1\] are the same root info"),
        ([info, b"short"], ValueError, r"^root_info\[1\]: root info must be exactly 4108 bytes, got 5$"),
        ((info, 7), TypeError, r"^root_info\[1\]: root info must be bytes, got int$"),
    ]
    for value, expected, pattern in cases:
        with pytest.raises(expected, match=pattern):
            hcclpy.Communicator(2, value, 0, device=0)


# ------------------------------------------------------------ a CANN without the functions

def test_unsupported_without_the_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    present = _ffi.api().present
    comm = _one_rank()
    try:
        for name, call, said in (
                ("HcclConfigGetInfo", lambda: comm.config_info("udi"), "Communicator.config_info"),
                ("HcclGetHcclBuffer", lambda: comm.hccl_buffer(), "Communicator.hccl_buffer"),
                ("HcclGetHeterogMode", lambda: comm.heterogeneous_mode, "Communicator.heterogeneous_mode"),
                ("HcclGetRootInfoScalable", lambda: hcclpy.RootInfo.generate(device=0, scalable=True),
                 r"RootInfo.generate\(scalable=True\)"),
                ("HcclCommInitRootInfoScalable", lambda: hcclpy.Communicator(
                    1, [hcclpy.RootInfo.generate(device=0)], 0, device=0), "a list of root infos")):
            with monkeypatch.context() as patch:
                patch.setitem(present, name, False)
                with pytest.raises(hcclpy.UnsupportedError, match=f"^{said} needs {name} \\(CANN 9.x\\), which this "
                                                                  "CANN does not provide"):
                    call()
    finally:
        comm.destroy()
