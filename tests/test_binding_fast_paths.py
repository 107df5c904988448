"""The uneven operations remember a checked layout and skip the checks next time; what the checks
would refuse still takes the checked path and is refused. A batch of sends and receives of device
arrays skips the checked path's conversions."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, List

import numpy as np
import pytest

import hcclpy
from hcclpy.collectives import _ops

N = 8


@pytest.fixture()
def comm() -> Iterator[hcclpy.Communicator]:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as c:
        yield c


@pytest.fixture()
def remembered(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Every layout the checked path remembers."""
    calls: List[Any] = []
    real = _ops._remember_layout

    def spy(comm: Any, given: Any, counts: Any, displs: Any) -> None:
        calls.append((counts, given))
        real(comm, given, counts, displs)
    monkeypatch.setattr(_ops, "_remember_layout", spy)
    return calls


def _arrays(comm: hcclpy.Communicator, dtype: str = "float32") -> tuple:
    send = hcclpy.from_numpy(np.arange(N, dtype=dtype), device=comm.device)
    return send, hcclpy.zeros(N, dtype, device=comm.device)


CALLS = {
    "all_gather_v": lambda c, s, r, counts: c.all_gather_v(s, r, counts, [0]),
    "reduce_scatter_v": lambda c, s, r, counts: c.reduce_scatter_v(s, r, counts, [0], "sum"),
    "all_to_all_v": lambda c, s, r, counts: c.all_to_all_v(s, r, counts, counts, [0], [0]),
    "all_to_all_vc": lambda c, s, r, counts: c.all_to_all_vc(s, r, [counts]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_second_call_takes_the_fast_path_and_is_right(comm: hcclpy.Communicator, remembered: List[Any],
                                                      name: str) -> None:
    call: Callable[..., Any] = CALLS[name]
    send, recv = _arrays(comm)
    call(comm, send, recv, [N])
    checked = len(remembered)
    recv.fill_zero()
    call(comm, send, recv, (N,))  # a tuple equal to the list: the same layout
    comm.device.default_stream.synchronize()
    assert len(remembered) == checked  # nothing re-checked
    assert recv.to_numpy().tolist() == list(range(N))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_what_the_checks_refuse_is_refused_after_a_layout_is_known(comm: hcclpy.Communicator, name: str) -> None:
    call: Callable[..., Any] = CALLS[name]
    send, recv = _arrays(comm)
    call(comm, send, recv, [N])
    with pytest.raises(ValueError, match="non-negative ints?|must be a"):
        call(comm, send, recv, [float(N)])  # equal to the known layout, but not ints
    small = hcclpy.zeros(N // 2, "float32", device=comm.device)
    with pytest.raises(ValueError, match="holds|must equal"):
        call(comm, send, small, [N])
    with pytest.raises(TypeError, match="int32"):
        call(comm, send, hcclpy.zeros(N, "int32", device=comm.device), [N])
    with pytest.raises(ValueError, match="overlap"):
        call(comm, send, send, [N])
    comm.device.default_stream.synchronize()


ZERO = [0]  # one displacement list object for every call, as a caller keeps its own
SAME_OBJECT_CALLS = {
    "all_gather_v": lambda c, s, r, counts: c.all_gather_v(s, r, counts, ZERO),
    "reduce_scatter_v": lambda c, s, r, counts: c.reduce_scatter_v(s, r, counts, ZERO, "sum"),
    "all_to_all_v": lambda c, s, r, counts: c.all_to_all_v(s, r, counts, counts, ZERO, ZERO),
}


@pytest.mark.parametrize("name", sorted(SAME_OBJECT_CALLS))
def test_a_layout_list_changed_in_place_is_checked_again(comm: hcclpy.Communicator, name: str) -> None:
    """The memo of the last layout (same list objects) compares their values too."""
    call: Callable[..., Any] = SAME_OBJECT_CALLS[name]
    send, recv = _arrays(comm)
    counts = [N]
    for _ in range(4):  # checked, found, found again (the memo copies the values), then from the memo
        call(comm, send, recv, counts)
    comm.device.default_stream.synchronize()
    assert any(memo[-1] is not None for memo in comm._layout_memo)  # armed
    known = len(comm._layouts)
    counts[0] = N // 2  # a different, valid layout (with buffers that would also fit the old one)
    recv.fill_zero()
    call(comm, send[:N // 2] if name == "all_gather_v" else send, recv, counts)
    comm.device.default_stream.synchronize()
    assert len(comm._layouts) > known  # checked and remembered
    assert recv.to_numpy().tolist() == list(range(N // 2)) + [0] * (N - N // 2)
    counts[0] = -1
    with pytest.raises(ValueError, match="negative|non-negative"):
        call(comm, send, recv, counts)
    comm.device.default_stream.synchronize()


def test_a_count_matrix_changed_in_place_is_checked_again(comm: hcclpy.Communicator) -> None:
    """all_to_all_vc's memo of the last matrix (the same list object) compares its values too."""
    send, recv = _arrays(comm)
    matrix = [[N]]
    for _ in range(4):  # checked, found, found again (the memo copies the values), then from the memo
        comm.all_to_all_vc(send, recv, matrix)
    comm.device.default_stream.synchronize()
    assert comm._layout_memo[_ops._MATRIX][2] is not None  # armed
    known = len(comm._layouts)
    matrix[0][0] = N // 2  # a row changed in place: a different, valid matrix
    recv.fill_zero()
    comm.all_to_all_vc(send, recv, matrix)
    comm.device.default_stream.synchronize()
    assert len(comm._layouts) > known  # checked and remembered
    assert recv.to_numpy().tolist() == list(range(N // 2)) + [0] * (N - N // 2)
    matrix[0] = [-1]
    with pytest.raises(ValueError, match=r"^send_count_matrix must be a 1 x 1 matrix of non-negative ints, got \[\[-1\]\]$"):
        comm.all_to_all_vc(send, recv, matrix)
    comm.device.default_stream.synchronize()


def test_a_matrix_row_replaced_by_an_array_misses_the_memo(comm: hcclpy.Communicator) -> None:
    """A row that compares element-wise (a NumPy array) cannot hit the memo: the call takes the
    checked path, which says what is wrong with the matrix (not NumPy's "truth value" error)."""
    send, recv = _arrays(comm)
    matrix: List[Any] = [[N]]
    for _ in range(3):  # checked, found (the memo arms), then from the memo
        comm.all_to_all_vc(send, recv, matrix)
    assert comm._layout_memo[_ops._MATRIX][2] is not None  # armed
    matrix[0] = np.array([N, 0])
    with pytest.raises(ValueError, match="1 x 1 matrix"):
        comm.all_to_all_vc(send, recv, matrix)
    comm.device.default_stream.synchronize()



RESOLVED: List[Any] = []  # (thread, argument) of every buffer the checked path resolves


def _ring_batches(rank: int, size: int, info: bytes) -> List[str]:
    """A ring exchange of device arrays needs none of the checked path's conversions; a buffer
    given as (pointer, count, dtype) takes the checked path; both deliver."""
    problems: List[str] = []
    me = threading.get_ident()
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        stream = comm.device.create_stream()
        mine = hcclpy.from_numpy(np.full(N, rank + 1, np.float32), device=comm.device)
        got = hcclpy.zeros(N, "float32", device=comm.device)
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        comm.batch_send_recv([("send", mine, nxt), ("recv", got, prv)], stream=stream)
        stream.synchronize()
        if any(thread == me for thread, _ in RESOLVED):
            problems.append("tuples of device arrays went through the checked path")
        if got.to_numpy().tolist() != [prv + 1.0] * N:
            problems.append(f"fast path received {got.to_numpy()}")
        got.fill_zero(stream=stream)
        comm.batch_send_recv([("send", mine, nxt), ("recv", got, prv)], stream=stream)  # a new, equal list
        stream.synchronize()
        if len(comm._batch_items) != 1:
            problems.append(f"an equal batch made another C array: {len(comm._batch_items)}")
        if got.to_numpy().tolist() != [prv + 1.0] * N:
            problems.append(f"second fast call received {got.to_numpy()}")
        got.fill_zero(stream=stream)
        comm.batch_send_recv([("send", mine, nxt), ("recv", (got.ptr, N, "float32"), prv)], stream=stream)
        stream.synchronize()
        if not any(thread == me for thread, _ in RESOLVED):
            problems.append("a (pointer, count, dtype) buffer did not take the checked path")
        if got.to_numpy().tolist() != [prv + 1.0] * N:
            problems.append(f"checked path received {got.to_numpy()}")
        stream.close()
    return problems


def test_a_batch_of_device_arrays_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import ranks
    real = _ops.resolve

    def spy(buf: Any, argument: str) -> Any:
        RESOLVED.append((threading.get_ident(), argument))
        return real(buf, argument)
    monkeypatch.setattr(_ops, "resolve", spy)
    out = ranks.run_threads(_ring_batches, 2)
    assert not [p for problems in out for p in problems], out


def _remembered_batches(rank: int, size: int, info: bytes) -> List[str]:
    """A batch made twice in a row is remembered, and the same batch again (a new, equal list)
    skips even the conversion to rows; a batch made once is not; the stream holds a remembered
    batch's arrays until it is done with them, the memo keeps none alive;
    NumPy items miss it; a batch naming a closed array is refused, not sent from freed memory."""
    import gc
    import weakref

    problems: List[str] = []
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        stream = comm.device.create_stream()
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        mine = hcclpy.from_numpy(np.full(N, rank + 1, np.float32), device=comm.device)
        got = hcclpy.zeros(N, "float32", device=comm.device)

        def ring(target: Any) -> None:
            comm.batch_send_recv([("send", mine, nxt), ("recv", target, prv)], stream=stream)
            stream.synchronize()

        ring(got)
        if comm._batch_memo[0] is not None:
            problems.append("a batch made once was remembered")
        ring(got)
        memo = comm._batch_memo
        if memo[0] is None:
            problems.append("a batch made twice in a row was not remembered")
        got.fill_zero()
        ring(got)
        if comm._batch_memo is not memo:  # the checked conversion remembers the batch anew
            problems.append("a remembered batch was converted again")
        if got.to_numpy().tolist() != [prv + 1.0] * N:
            problems.append(f"the remembered batch received {got.to_numpy()}")
        temporary = hcclpy.zeros(N, "float32", device=comm.device)
        ring(temporary)
        ring(temporary)
        if comm._batch_memo is memo:
            problems.append("the second batch made twice in a row was not remembered")
        # The remembered batch once more, not waited for: the stream holds its arrays, the memo does not.
        comm.batch_send_recv([("send", mine, nxt), ("recv", temporary, prv)], stream=stream)
        gone = weakref.ref(temporary)
        del temporary
        gc.collect()
        if gone() is None:
            problems.append("a remembered batch let go of its arrays before the stream was done with them")
        stream.synchronize()
        gc.collect()
        if gone() is not None:
            problems.append("the remembered batch keeps its arrays alive")
        ring(got)  # after a memo of freed arrays
        ring(got)
        ring(got)  # remembered, and found open: until an array is closed, later calls skip that check
        if got.to_numpy().tolist() != [prv + 1.0] * N:
            problems.append(f"the batch after a freed one received {got.to_numpy()}")
        host_got = np.zeros(N, np.float32)  # NumPy items compared with the memo's device arrays: a miss
        comm.batch_send_recv([("send", np.full(N, rank + 1, np.float32), nxt), ("recv", host_got, prv)])
        if host_got.tolist() != [prv + 1.0] * N:
            problems.append(f"a NumPy batch after a device batch received {host_got}")
        ranks_barrier = hcclpy.zeros(1, "float32", device=comm.device)
        comm.all_reduce(ranks_barrier, stream=stream)  # both ranks are done with got before rank 0 closes it
        stream.synchronize()
        if rank == 0:
            got.close()
            try:
                ring(got)
                problems.append("a batch naming a closed array was queued")
            except ValueError as error:
                if "closed" not in str(error) and "freed" not in str(error):
                    problems.append(f"a closed array was refused with {error}")
        stream.close()
    return problems


def test_an_equal_batch_is_remembered_without_keeping_arrays_alive() -> None:
    import ranks
    out = ranks.run_threads(_remembered_batches, 2)
    assert not [p for problems in out for p in problems], out
