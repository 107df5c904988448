"""HCCLPY_SIM_PROFILE: the simulator and the binding refuse what a real Ascend product refuses.

The variable is read when the libraries load, so every case with a profile runs in spawned
processes that have it set (:mod:`ranks`, or a fresh interpreter for a bad value). The central
check runs every (profile, operation, data type, reduce operation) through the binding and,
with the binding's check bypassed, through the simulator's C entry point: both must refuse the
same combinations, with the same words, and both must agree with :mod:`hcclpy.profiles`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

import hcclpy
from hcclpy import _ffi
from hcclpy.errors import HcclResult
from hcclpy.profiles import OPERATIONS, PROFILES, VARIABLE, from_environment
from hcclpy.types import DataType, ReduceOp

import ranks

REPO = Path(__file__).resolve().parents[2]
DTYPES = tuple(DataType)  # the 12 types the simulator moves (aliases are not listed twice)
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v")
P2P = ("send", "recv", "batch_send_recv")  # a 1-rank communicator has no peer to send to
NOT_SUPPORT = int(HcclResult.HCCL_E_NOT_SUPPORT)
PARA = int(HcclResult.HCCL_E_PARA)
REFUSAL = f"profile ({VARIABLE}="  # in every refusal message, and only there


def _combinations() -> List[Tuple[str, DataType, Optional[ReduceOp]]]:
    return [(operation, dtype, op) for operation in OPERATIONS for dtype in DTYPES
            for op in (tuple(ReduceOp) if operation in REDUCING else (None,))]


# ----------------------------------------------------------------------------- the table itself

@pytest.mark.parametrize(("name", "operation", "dtype", "op", "allowed"), [
    # A3 in its default AI_CPU mode: int8/int16/int32/fp16/fp32/bf16 with sum/max/min only
    ("A3", "all_reduce", "int64", "sum", False),
    ("A3", "reduce", "int32", "prod", False),
    ("A3", "reduce_scatter", "bf16", "max", True),
    ("A3", "reduce_scatter_v", "int16", "min", True),
    ("A3", "all_reduce", "uint8", "sum", False),
    # A2 (HOST mode): int64 reduces; prod not with int16 or bf16; ReduceScatterV without int64 or prod
    ("A2", "all_reduce", "int64", "prod", True),
    ("A2", "all_reduce", "int16", "prod", False),
    ("A2", "reduce", "bf16", "prod", False),
    ("A2", "reduce_scatter_v", "int64", "sum", False),
    ("A2", "reduce_scatter_v", "fp32", "prod", False),
    # 950: also uint64 and fp64 reductions; ReduceScatterV as AllReduce, with int64 but not uint64
    ("950", "all_reduce", "fp64", "prod", True),
    ("950", "reduce_scatter", "uint64", "min", True),
    ("950", "reduce_scatter_v", "fp32", "prod", True),
    ("950", "reduce_scatter_v", "uint64", "sum", False),
    ("950", "all_reduce", "bf16", "prod", False),
    # Atlas training: no int16 or bf16 anywhere; no ReduceScatterV, AllGatherV, AlltoAllVC
    ("910", "all_reduce", "int16", "sum", False),
    ("910", "all_reduce", "int64", "prod", True),
    ("910", "broadcast", "bf16", None, False),
    ("910", "broadcast", "uint16", None, True),
    ("910", "reduce_scatter_v", "fp32", "sum", False),
    ("910", "all_gather_v", "fp32", None, False),
    ("910", "all_to_all_vc", "int8", None, False),
    # data movement on A2/A3/950: every type the simulator moves
    ("A2", "all_to_all_vc", "bf16", None, True),
    ("A3", "send", "fp64", None, True),
    ("950", "batch_send_recv", "uint32", None, True),
])
def test_documented_limits(name: str, operation: str, dtype: str, op: Optional[str], allowed: bool) -> None:
    assert PROFILES[name].allows(operation, dtype, op) is allowed


def test_barrier_is_never_limited() -> None:
    assert all(profile.allows("barrier", "int8") for profile in PROFILES.values())


def test_refusal_names_profile_operation_dtype_op_and_what_is_allowed() -> None:
    with pytest.raises(ValueError) as info:
        PROFILES["A3"].check("all_reduce", DataType.INT64, ReduceOp.SUM)
    assert str(info.value) == (
        "all_reduce of int64 with sum is not supported on the A3 profile (HCCLPY_SIM_PROFILE=A3): Atlas A3 "
        "all_reduce takes int8, int16, int32, fp16, fp32, bf16 with sum, max, min")
    with pytest.raises(ValueError, match=r"all_reduce of bf16 with prod .* \(prod not with int16, bf16\)$"):
        PROFILES["A2"].check("all_reduce", "bf16", "prod")
    with pytest.raises(ValueError, match=r"^all_to_all_vc of int8 is not supported on the 910 profile .*: Atlas "
                                         r"training has no all_to_all_vc \(the A2, A3, 950 profiles have it\)$"):
        PROFILES["910"].check("all_to_all_vc", "int8")


def test_check_rejects_an_unknown_operation() -> None:
    with pytest.raises(ValueError, match="operation='all_reduse' is not an HCCL operation"):
        PROFILES["A2"].check("all_reduse", "int8", "sum")


@pytest.mark.parametrize(("value", "name"), [(None, None), ("", None), ("A3", "A3"), ("a2", "A2"), ("950", "950")])
def test_from_environment(value: Optional[str], name: Optional[str]) -> None:
    environ = {} if value is None else {VARIABLE: value}
    profile = from_environment(environ)
    assert (profile.name if profile is not None else None) == name


def test_from_environment_lists_the_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        from_environment({VARIABLE: "A5"})
    assert str(info.value) == ("HCCLPY_SIM_PROFILE='A5' is not a product profile; valid names: 910, A2, A3, 950 "
                               "(unset or empty: no limits)")


# --------------------------------------------------------- binding and simulator agree, everywhere

def _one_rank() -> hcclpy.Communicator:
    return hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)


def _binding_calls(comm: hcclpy.Communicator, x: Any, y: Any, op: Any) -> Dict[str, Callable[[], Any]]:
    """Each operation through the public binding on a 1-rank communicator, one element each way."""
    return {
        "all_reduce": lambda: comm.all_reduce(x, y, op), "reduce": lambda: comm.reduce(x, y, op, 0),
        "reduce_scatter": lambda: comm.reduce_scatter(x, y, op),
        "reduce_scatter_v": lambda: comm.reduce_scatter_v(x, y, [1], op=op),
        "broadcast": lambda: comm.broadcast(x, 0), "all_gather": lambda: comm.all_gather(x, y),
        "all_gather_v": lambda: comm.all_gather_v(x, y, [1]), "scatter": lambda: comm.scatter(x, y, 0),
        "all_to_all": lambda: comm.all_to_all(x, y), "all_to_all_v": lambda: comm.all_to_all_v(x, y, [1], [1]),
        "all_to_all_vc": lambda: comm.all_to_all_vc(x, y, [[1]]), "send": lambda: comm.send(x, 0),
        "recv": lambda: comm.recv(x, 0), "batch_send_recv": lambda: comm.batch_send_recv([("send", x, 0)]),
    }


def _c_calls(comm: hcclpy.Communicator, stream: hcclpy.Stream, x: Any, y: Any, dtype: int,
             op: int) -> Dict[str, Callable[[], int]]:
    """The same calls straight to the C functions, past every check of the binding."""
    api = _ffi.api()
    h, s = _ffi.cast("void *", comm.handle), _ffi.cast("void *", stream.handle)
    xp, yp = _ffi.cast("void *", x.ptr), _ffi.cast("void *", y.ptr)
    one, zero = _ffi.new("uint64_t[]", [1]), _ffi.new("uint64_t[]", [0])
    items = _ffi.new("HcclSendRecvItem[]", [(0, xp, 1, dtype, 0)])
    return {
        "all_reduce": lambda: api.HcclAllReduce(xp, yp, 1, dtype, op, h, s),
        "reduce": lambda: api.HcclReduce(xp, yp, 1, dtype, op, 0, h, s),
        "reduce_scatter": lambda: api.HcclReduceScatter(xp, yp, 1, dtype, op, h, s),
        "reduce_scatter_v": lambda: api.HcclReduceScatterV(xp, one, zero, yp, 1, dtype, op, h, s),
        "broadcast": lambda: api.HcclBroadcast(xp, 1, dtype, 0, h, s),
        "all_gather": lambda: api.HcclAllGather(xp, yp, 1, dtype, h, s),
        "all_gather_v": lambda: api.HcclAllGatherV(xp, 1, yp, one, zero, dtype, h, s),
        "scatter": lambda: api.HcclScatter(xp, yp, 1, dtype, 0, h, s),
        "all_to_all": lambda: api.HcclAlltoAll(xp, 1, dtype, yp, 1, dtype, h, s),
        "all_to_all_v": lambda: api.HcclAlltoAllV(xp, one, zero, dtype, yp, one, zero, dtype, h, s),
        "all_to_all_vc": lambda: api.HcclAlltoAllVC(xp, one, dtype, yp, dtype, h, s),
        "send": lambda: api.HcclSend(xp, 1, dtype, 0, h, s),
        "recv": lambda: api.HcclRecv(xp, 1, dtype, 0, h, s),
        "batch_send_recv": lambda: api.HcclBatchSendRecv(items, 1, h, s),
    }


def _every_combination(rank: int, size: int, info: bytes) -> List[Tuple[str, int, Optional[int], str, int, str]]:
    """Rank body: (operation, dtype, op, binding's refusal or "", C return code, C message) for all."""
    comm = _one_rank()
    stream = comm.device.create_stream()
    api = _ffi.api()
    rows = []
    for operation, dtype, op in _combinations():
        x, y = hcclpy.zeros(1, dtype, device=0), hcclpy.zeros(1, dtype, device=0)
        refusal = ""
        try:
            _binding_calls(comm, x, y, op)[operation]()
        except ValueError as exc:
            refusal = str(exc) if REFUSAL in str(exc) else ""  # a 1-rank send has no peer either
        except hcclpy.HcclError:
            pass  # the binding let it through and C refused: reported below
        rc = _c_calls(comm, stream, x, y, int(dtype), int(op if op is not None else 0))[operation]()
        message = _ffi.string(api.aclGetRecentErrMsg()) if rc else ""
        rows.append((operation, int(dtype), None if op is None else int(op), refusal, rc, message))
        stream.synchronize()
        comm.device.default_stream.synchronize()
    stream.close()
    comm.destroy()
    return rows


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [*PROFILES, ""])
@pytest.mark.slow
def test_binding_and_simulator_agree_on_every_combination(name: str) -> None:
    [rows] = ranks.run_processes(_every_combination, 1, env={VARIABLE: name}, timeout=240)
    profile = PROFILES.get(name)
    assert len(rows) == len(_combinations())
    wrong = []
    for operation, dtype, op, refusal, rc, message in rows:
        case = f"{operation} {DataType(dtype).name} {'' if op is None else ReduceOp(op).name}"
        allowed = profile is None or profile.allows(operation, dtype, op)
        # The one peer of a 1-rank communicator is the rank itself: HcclSend / HcclRecv refuse it
        # (HCCL_E_NOT_SUPPORT, as CANN does), and a batch whose send to itself has no receive from
        # itself is refused (HCCL_E_PARA); neither is the profile's refusal.
        to_itself = operation in P2P and rc in (NOT_SUPPORT, PARA) and "itself" in message
        if bool(refusal) == allowed:
            wrong.append(f"{case}: the table says allowed={allowed}, the binding {refusal or 'let it through'}")
        if (rc == NOT_SUPPORT) == allowed and not to_itself:
            wrong.append(f"{case}: the table says allowed={allowed}, the simulator returned {rc}: {message}")
        elif allowed and rc != 0 and not to_itself:
            wrong.append(f"{case}: allowed, but the simulator returned {rc}: {message}")
        elif not allowed and message.split(": ", 1)[-1] != refusal:
            wrong.append(f"{case}: the messages differ:\n  C:      {message}\n  Python: {refusal}")
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong[:40])


# ---------------------------------------------------------------- results and refusals, 2 ranks

# Per profile, the most particular reduction it allows, and a data type only some products move.
REDUCTION = {"910": ("int64", "prod"), "A2": ("int64", "prod"), "A3": ("bfloat16", "max"), "950": ("float64", "prod")}
MOVED = {"910": "uint16", "A2": "bfloat16", "A3": "bfloat16", "950": "bfloat16"}
REFUSED = {"910": ("int16", "sum"), "A2": ("int16", "prod"), "A3": ("int64", "sum"), "950": ("uint8", "sum")}


def _allowed_and_refused(rank: int, size: int, info: bytes, name: str) -> List[str]:
    """Rank body: check that a refused call raises ValueError before any C call; run every
    operation the profile has with allowed types and compare with NumPy (the refusal left the
    communicator working). Returns the mismatches."""
    profile = PROFILES[name]
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    other = 1 - rank
    wrong: List[Optional[str]] = []
    # First (nothing staged yet), a refused call: ValueError, no HCCL call, nothing staged.
    bad_dtype, bad_op = REFUSED[name]
    host = np.ones(4, dtype=ranks.np_dtype(bad_dtype))
    called: List[str] = []
    real = comm._api

    class Recorder:
        def __getattr__(self, attribute: str) -> Any:
            called.append(attribute)
            return getattr(real, attribute)

    comm._api = Recorder()
    for what, buffer in (("NumPy", host), ("device", hcclpy.from_numpy(host, device=rank))):
        try:
            comm.all_reduce(buffer, op=bad_op)
            wrong.append(f"all_reduce of {what} {bad_dtype} with {bad_op} was not refused")
        except ValueError as exc:
            if f"on the {name} profile ({VARIABLE}={name})" not in str(exc):
                wrong.append(f"all_reduce of {what} {bad_dtype}: unexpected message: {exc}")
    comm._api = real
    if called:
        wrong.append(f"refused calls reached C: {called}")
    if comm._host_state is not None:
        wrong.append("a refused NumPy call staged its array")

    # Then every operation with allowed types.
    dtype, op = REDUCTION[name]
    inputs = [ranks.make_input("profile", r, 2 * size, dtype, op) for r in range(size)]
    total = ranks.reduce_reference(inputs, op, dtype)
    mine = inputs[rank]
    wrong.append(ranks.mismatch("all_reduce", comm.all_reduce(mine.copy(), op=op), total))
    got = comm.reduce(mine.copy(), None, op, 0)
    if rank == 0:
        wrong.append(ranks.mismatch("reduce", got, total))
    wrong.append(ranks.mismatch("reduce_scatter", comm.reduce_scatter(mine, op=op), total[2 * rank:2 * rank + 2]))
    device = hcclpy.from_numpy(mine, device=rank)
    comm.all_reduce(device, op=op)
    wrong.append(ranks.mismatch("all_reduce on device", device.to_numpy(stream=comm.device.default_stream), total))
    if profile.allows("reduce_scatter_v", dtype, op):
        counts = [3, 1]
        wrong.append(ranks.mismatch("reduce_scatter_v", comm.reduce_scatter_v(mine, send_counts=counts, op=op),
                                    total[sum(counts[:rank]):sum(counts[:rank + 1])]))

    moved = MOVED[name]
    data = [ranks.make_input("moved", r, 2 * size, moved) for r in range(size)]
    mine = data[rank]
    wrong.append(ranks.mismatch("broadcast", comm.broadcast(mine.copy(), 1), data[1]))
    wrong.append(ranks.mismatch("all_gather", comm.all_gather(mine), np.stack(data)))
    wrong.append(ranks.mismatch("scatter", comm.scatter(mine, root=0), data[0][2 * rank:2 * rank + 2]))
    wrong.append(ranks.mismatch("all_to_all", comm.all_to_all(mine),
                                np.concatenate([d[2 * rank:2 * rank + 2] for d in data])))
    wrong.append(ranks.mismatch("all_to_all_v", comm.all_to_all_v(mine, send_counts=[2, 2], recv_counts=[2, 2]),
                                np.concatenate([d[2 * rank:2 * rank + 2] for d in data])))
    if profile.allows("all_gather_v", moved):
        wrong.append(ranks.mismatch("all_gather_v", comm.all_gather_v(mine[:rank + 1], recv_counts=[1, 2]),
                                    np.concatenate([data[0][:1], data[1][:2]])))
    if profile.allows("all_to_all_vc", moved):
        wrong.append(ranks.mismatch("all_to_all_vc", comm.all_to_all_vc(mine, send_count_matrix=[[1, 1], [2, 2]]),
                                    np.concatenate([data[0][rank:rank + 1], data[1][2 * rank:2 * rank + 2]])))
    received = np.zeros_like(mine)
    if rank == 0:
        comm.send(mine, other)
    else:
        comm.recv(received, other)
        wrong.append(ranks.mismatch("send/recv", received, data[0]))
    exchanged = np.zeros_like(mine)
    comm.batch_send_recv([("send", mine, other), ("recv", exchanged, other)])
    wrong.append(ranks.mismatch("batch_send_recv", exchanged, data[other]))

    wrong.append(ranks.mismatch("all_reduce after refusals", comm.all_reduce(inputs[rank].copy(), op=op), total))
    comm.destroy()
    return [text for text in wrong if text is not None]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(PROFILES))
@pytest.mark.slow
def test_allowed_combinations_give_correct_results(name: str) -> None:
    if not ranks.HAVE_BF16 and "bfloat16" in (REDUCTION[name][0], MOVED[name]):
        pytest.skip("needs ml_dtypes for bfloat16 arrays")
    results = ranks.run_processes(_allowed_and_refused, 2, name, env={VARIABLE: name}, timeout=240)
    assert results == [[], []], "\n".join(f"rank {r}: {text}" for r, texts in enumerate(results) for text in texts)


def _profile_in_use(rank: int, size: int, info: bytes) -> Optional[str]:
    return hcclpy.library_info()["profile"]


@pytest.mark.parametrize(("value", "name"), [("", None), ("a3", "A3")])
def test_library_info_names_the_profile(value: str, name: Optional[str]) -> None:
    assert ranks.run_processes(_profile_in_use, 1, env={VARIABLE: value}, timeout=120) == [name]


# ------------------------------------------------------------------------------ unknown names

def _python(code: str, profile: str, sim_env: Dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (this checkout's hcclpy) with HCCLPY_SIM_PROFILE set."""
    env = {**sim_env, VARIABLE: profile, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)


UNKNOWN = ("HCCLPY_SIM_PROFILE='A5' is not a product profile; valid names: 910, A2, A3, 950 "
           "(unset or empty: no limits)")


def test_unknown_profile_fails_the_binding_at_load(sim_env: Dict[str, str]) -> None:
    done = _python("""
        import warnings, hcclpy
        warnings.simplefilter("ignore")
        try:
            hcclpy.RootInfo.generate(device=0)
        except ValueError as exc:
            print(exc)
    """, "A5", sim_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == UNKNOWN


def test_unknown_profile_fails_every_hccl_entry_of_the_simulator(sim_home: Path, sim_env: Dict[str, str]) -> None:
    # ctypes, not hcclpy: the binding would refuse before the simulator is asked.
    done = _python(f"""
        import ctypes
        acl = ctypes.CDLL({str(sim_home / "lib64" / "libascendcl.so")!r}, mode=ctypes.RTLD_GLOBAL)
        hccl = ctypes.CDLL({str(sim_home / "lib64" / "libhccl.so")!r})
        acl.aclGetRecentErrMsg.restype = ctypes.c_char_p
        assert acl.aclInit(None) == 0 and acl.aclrtSetDevice(0) == 0
        info = ctypes.create_string_buffer(4108)
        comm = ctypes.c_void_p()
        devices = (ctypes.c_int32 * 1)(0)
        for name, call in (("HcclGetRootInfo", lambda: hccl.HcclGetRootInfo(info)),
                           ("HcclCommInitRootInfo", lambda: hccl.HcclCommInitRootInfo(1, info, 0, ctypes.byref(comm))),
                           ("HcclCommInitAll", lambda: hccl.HcclCommInitAll(1, devices, ctypes.byref(comm))),
                           ("HcclBarrier", lambda: hccl.HcclBarrier(ctypes.c_void_p(1), ctypes.c_void_p(1)))):
            rc = call()  # the message belongs to the latest failure: read it at once
            print(name, rc, acl.aclGetRecentErrMsg().decode())
    """, "A5", sim_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    for line, name in zip(lines, ("HcclGetRootInfo", "HcclCommInitRootInfo", "HcclCommInitAll", "HcclBarrier")):
        assert line == f"{name} {PARA} {name}: {UNKNOWN}"

