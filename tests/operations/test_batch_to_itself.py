"""batch_send_recv with items whose peer is the calling rank itself.

HCCL copies the k-th send to the rank itself into the k-th receive from itself (in item order),
next to the transfers with the peers; hcclpy checks that the items to the rank itself pair up
(same count, same dtype, none left over) before any C call, on every path. ``send`` and ``recv``
to the rank itself stay refused (HCCL returns HCCL_E_NOT_SUPPORT for them).
"""

from __future__ import annotations

import random
import re
import threading
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hcclpy
import ranks
from hcclpy.collectives import _staging
from hcclpy.types import DataType
from test_binding_badinput import NoCCalls

PATHS = ["device", "numpy", "persistent", "persistent-numpy"]
DTYPES = ["float32", "int8", "float16", "int64", "uint16", "float64"] + (["bfloat16"] if ranks.HAVE_BF16 else [])

# (source rank, target rank, count, dtype): one transfer of a plan, which every rank knows.
Message = Tuple[int, int, int, str]


def _data(messages: Sequence[Message], index: int) -> np.ndarray:
    source, target, count, dtype = messages[index]
    return ranks.make_input(f"to-itself/{index}/{source}->{target}", source, count, dtype)


def _buffer(path: str, comm: hcclpy.Communicator, array: np.ndarray) -> Any:
    return array.copy() if path.endswith("numpy") else hcclpy.from_numpy(array, device=comm.device)


def _read(buf: Any) -> np.ndarray:
    return buf if isinstance(buf, np.ndarray) else buf.to_numpy()


def _run(path: str, comm: hcclpy.Communicator, items: List[Tuple[str, Any, int]], stream: hcclpy.Stream) -> None:
    """One batch the path's way: persistent paths start it twice (the same data arrives again)."""
    kwargs = {} if path.endswith("numpy") else {"stream": stream}
    if path.startswith("persistent"):
        with comm.batch_send_recv_init(items, **kwargs) as op:
            op.start()
            op.start()
    else:
        assert comm.batch_send_recv(items, **kwargs) is None


def _exchange(rank: int, size: int, info: bytes, path: str, messages: List[Message], seed: int) -> List[str]:
    """Rank body: the batch of the plan's transfers from and to this rank, in an order drawn from
    ``seed`` that keeps the order of the items of each (kind, peer); returns what differs from the
    reference."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = comm.device.create_stream()
    try:
        queues: Dict[Tuple[str, int], List[Tuple[str, Any, int]]] = {}
        received: List[Tuple[int, Any]] = []
        for index, (source, target, count, dtype) in enumerate(messages):
            if source == rank:
                queues.setdefault(("send", target), []).append(("send", _buffer(path, comm, _data(messages, index)),
                                                                target))
            if target == rank:
                out = _buffer(path, comm, np.zeros(count, ranks.np_dtype(dtype)))
                queues.setdefault(("recv", source), []).append(("recv", out, source))
                received.append((index, out))
        # Interleave the queues at random; each keeps its own order, which is what pairs items.
        turns = [key for key, queue in queues.items() for _ in queue]
        random.Random(seed * 31 + rank).shuffle(turns)
        items = [queues[key].pop(0) for key in turns]
        _run(path, comm, items, stream)
        stream.synchronize()
        problems = []
        for index, out in received:
            problem = ranks.mismatch(f"{path} message {index} {messages[index]}", _read(out), _data(messages, index))
            if problem:
                problems.append(problem)
        return problems
    finally:
        stream.close()
        comm.destroy()


def _check(results: List[List[str]]) -> None:
    problems = [f"rank {r}: {p}" for r, found in enumerate(results) for p in found]
    assert not problems, "\n".join(problems[:20])


@st.composite
def plans(draw: Any) -> Tuple[int, List[Message], int]:
    """A rank count, transfers between its ranks (at least one from a rank to itself) and a seed."""
    size = draw(st.sampled_from([1, 2, 3]))
    rank_ids = st.integers(0, size - 1)
    message = st.tuples(rank_ids, rank_ids, st.integers(0, 24), st.sampled_from(DTYPES))
    mine = draw(rank_ids)
    to_itself = draw(st.tuples(st.just(mine), st.just(mine), st.integers(0, 24), st.sampled_from(DTYPES)))
    others = draw(st.lists(message, max_size=7))
    messages = others + [to_itself]
    draw(st.randoms()).shuffle(messages)
    return size, messages, draw(st.integers(0, 2**16))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(plan=plans())
def test_items_to_itself_match_numpy_on_every_path(path: str, plan: Tuple[int, List[Message], int]) -> None:
    size, messages, seed = plan
    _check(ranks.run_threads(_exchange, size, path, messages, seed, timeout=60, env={"HCCL_EXEC_TIMEOUT": "10"}))


# Several pairs to the rank itself of different counts and dtypes (one empty), a ring with the
# peers around them, and a send to the next rank put between a pair.
def _fixed_plan(size: int) -> List[Message]:
    messages: List[Message] = []
    for r in range(size):
        messages += [(r, r, 5, "float32"), (r, (r + 1) % size, 7, "int32"), (r, r, 0, "int8"), (r, r, 33, "float16"),
                     ((r + 1) % size, r, 2, "uint64")]
    return messages


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["device", "numpy", "persistent"])
def test_items_to_itself_over_the_rank_matrix(rank_matrix: ranks.RankMatrix, path: str) -> None:
    _check(rank_matrix.run(_exchange, path, _fixed_plan(rank_matrix.size), 7))


def test_a_one_rank_communicator_copies_to_itself() -> None:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        x = hcclpy.from_numpy(np.arange(6, dtype=np.float32), device=0)
        y = hcclpy.zeros(6, "float32", device=0)
        comm.batch_send_recv([("recv", y, 0), ("send", x, 0)])
        np.testing.assert_array_equal(y.to_numpy(), np.arange(6, dtype=np.float32))
        got = np.zeros(3, np.int16)
        comm.batch_send_recv([("send", np.array([4, 5, 6], np.int16), 0), ("recv", got, 0)])
        np.testing.assert_array_equal(got, [4, 5, 6])


# --------------------------------------------------------------- the pairing rule, on its own

def _fake(kind: str, count: int, dtype: str) -> SimpleNamespace:
    """What the pairing rule reads of a device buffer."""
    return SimpleNamespace(count=count, dtype=DataType[dtype], scale=1, host=False, kind=dtype.lower(), item=kind)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "recv"]), st.integers(0, 2), st.integers(0, 3),
                          st.sampled_from(["FP32", "INT8"])), max_size=8))
def test_the_pairing_rule_against_its_definition(items: List[Tuple[str, int, int, str]]) -> None:
    """The k-th send to the rank itself (rank 1 here) pairs with its k-th receive from itself; a
    pair of other dtypes is a TypeError, of other counts or anything unpaired a ValueError."""
    from hcclpy.collectives._ops import _pairs_to_itself

    comm = SimpleNamespace(_rank=1)
    rows = [(0 if kind == "send" else 1, None, count, int(DataType[dtype]), peer) for kind, peer, count, dtype in items]
    buffers = [_fake(kind, count, dtype) for kind, _, count, dtype in items]
    sends = [i for i, (kind, peer, _, _) in enumerate(items) if peer == 1 and kind == "send"]
    recvs = [i for i, (kind, peer, _, _) in enumerate(items) if peer == 1 and kind == "recv"]
    expected: Optional[type] = None
    named: Tuple[int, ...] = ()
    for s, r in zip(sends, recvs):
        if items[s][3] != items[r][3]:
            expected, named = TypeError, (s, r)
            break
        if items[s][2] != items[r][2]:
            expected, named = ValueError, (s, r)
            break
    else:
        if len(sends) != len(recvs):
            more = sends if len(sends) > len(recvs) else recvs
            expected, named = ValueError, (more[min(len(sends), len(recvs))],)
    try:
        _pairs_to_itself(comm, rows, buffers)
    except (TypeError, ValueError) as exc:
        assert type(exc) is expected, f"{items}: raised {exc!r}, expected {expected}"
        assert tuple(int(n) for n in re.findall(r"items\[(\d+)\]", str(exc))) == named, str(exc)
    else:
        assert expected is None, f"{items}: accepted, expected {expected.__name__}"


# ---------------------------------------------------------- refused before any C call, every path

def _bad_pairings(path: str, comm: hcclpy.Communicator, me: int) -> List[Tuple[str, Callable[[], Any], type, str]]:
    b = lambda array: _buffer(path, comm, array)  # noqa: E731
    x8, y8 = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    x4, y4 = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    unpaired = rf"is a (send to|receive from) this rank itself \(rank {me}\) with no matching"
    cases = [
        ("a send to itself alone", [("send", b(x8), me)], ValueError, rf"^items\[0\] {unpaired} receive from itself"),
        ("a receive from itself alone", [("recv", b(y8), me)], ValueError, rf"^items\[0\] {unpaired} send to itself"),
        ("a send left over after a pair", [("send", b(x8), me), ("recv", b(y8), me), ("send", b(x4), me)], ValueError,
         rf"^items\[2\] {unpaired} .*the batch has 2 sends to the rank itself and 1 receive from itself"),
        ("counts differ", [("send", b(x8), me), ("recv", b(y4), me)], ValueError,
         rf"^items\[0\] sends 8 elements to this rank itself \(rank {me}\), but items\[1\], the receive from itself "
         "it pairs with, holds 4"),
        ("pairs go by item order", [("send", b(x8), me), ("send", b(x4), me), ("recv", b(y4), me),
                                    ("recv", b(y8), me)], ValueError, r"^items\[0\] sends 8 elements .* items\[2\]"),
        ("dtypes differ", [("recv", b(y8.astype(np.int32)), me), ("send", b(x8), me)], TypeError,
         rf"^items\[1\] \(a send to this rank itself, rank {me}\) is .* but items\[0\] \(the receive from itself it "
         "pairs with\\) is .*; they must match"),
    ]
    if comm.size > 1:
        peer = (me + 1) % comm.size
        cases.append(("a receive from itself among transfers with a peer",
                      [("send", b(x8), peer), ("recv", b(y4), me), ("recv", b(y8), peer)], ValueError,
                      rf"^items\[1\] {unpaired} send to itself"))
    if path.endswith("numpy"):  # travel alike (4 x float32), differ as NumPy arrays
        cases.append(("NumPy dtypes that travel alike", [("send", np.zeros(2, np.complex64), me),
                                                         ("recv", np.zeros(4, np.float32), me)], TypeError,
                      r"^items\[0\] \(a send to this rank itself, .*\) is complex64 but items\[1\] .* is float32"))
    run = (lambda items: comm.batch_send_recv_init(items).close()) if path.startswith("persistent") else (
        lambda items: comm.batch_send_recv(items))
    return [(label, (lambda items=items: run(items)), expected, pattern) for label, items, expected, pattern in cases]


def _refusals(rank: int, size: int, info: bytes) -> List[str]:
    from test_binding_badinput import _run_matrix

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    real = comm._api
    guard = comm._api = NoCCalls(real)
    failures: List[str] = []
    try:
        for path in PATHS:
            failures += [f"{path}: {f}" for f in _run_matrix(_bad_pairings(path, comm, rank))]
            # send and recv to the rank itself keep their refusal, the same on every path
            for name in ("send", "recv"):
                with_init = path.startswith("persistent")
                call = getattr(comm, name + "_init" if with_init else name)
                buf = _buffer(path, comm, np.zeros(4, np.float32))
                failures += [f"{path}: {f}" for f in _run_matrix([(
                    f"{name} to itself", lambda: call(buf, rank), ValueError,
                    rf"^peer={rank} is this rank; send/recv need another rank")])]
        with hcclpy.group():  # a group refuses a batch as such, before its items are looked at
            failures += _run_matrix([("in a group", lambda: comm.batch_send_recv([("send", np.zeros(1), rank)]),
                                      RuntimeError, "^batch_send_recv cannot run inside hcclpy.group")])
    finally:
        comm._api = real
        comm.destroy()
    if guard.calls:
        failures.append(f"C functions were called: {guard.calls}")
    return failures


def _no_staging(*args: Any) -> Any:
    raise AssertionError("the call was staged")


@pytest.mark.parametrize("size", [1, 2, 3])
def test_bad_pairings_are_refused_before_any_c_call_on_every_path(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_staging, "acquire", _no_staging)
    _check(ranks.run_threads(_refusals, size, timeout=60))


def test_a_batch_checked_on_one_communicator_is_checked_again_on_another() -> None:
    """The cache of checked batches knows the rank: a send to rank 0, fine on rank 1 of a pair,
    is a send to itself, unpaired, on a communicator where this thread is rank 0."""
    info = hcclpy.RootInfo.generate(device=0)
    done: Dict[str, Any] = {}

    def rank_0() -> None:  # on device 1, so that rank 1 is on device 0 with the one-rank communicator
        with hcclpy.Communicator(2, info, 0, device=1) as comm:
            y = hcclpy.zeros(4, "float32", device=1)
            comm.batch_send_recv([("recv", y, 1)])
            done["received"] = y.to_numpy()

    thread = threading.Thread(target=rank_0, daemon=True)
    thread.start()
    x = hcclpy.from_numpy(np.arange(4, dtype=np.float32), device=0)
    items = [("send", x, 0)]
    with hcclpy.Communicator(2, info, 1, device=0) as pair:
        pair.batch_send_recv(items)
        pair.device.default_stream.synchronize()
    thread.join(60)
    np.testing.assert_array_equal(done["received"], np.arange(4, dtype=np.float32))
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as alone:
        real = alone._api
        alone._api = NoCCalls(real)
        try:
            with pytest.raises(ValueError, match=r"^items\[0\] is a send to this rank itself \(rank 0\)"):
                alone.batch_send_recv(items)
        finally:
            alone._api = real
