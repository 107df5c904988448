"""Count lists, displacements and matrices are read afresh at every call: a layout used before
gives no shortcut past the checks, a list changed in place takes its new values, and a batch of
sends and receives keeps its arrays alive only while queued work uses them."""

from __future__ import annotations

import gc
import weakref
from typing import Any, Callable, Iterator, List

import numpy as np
import pytest

import hcclpy
import ranks

N = 8


@pytest.fixture()
def comm() -> Iterator[hcclpy.Communicator]:
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as c:
        yield c


def _arrays(comm: hcclpy.Communicator, dtype: str = "float32") -> tuple:
    send = hcclpy.from_numpy(np.arange(N, dtype=dtype), device=comm.device)
    return send, hcclpy.zeros(N, dtype, device=comm.device)


ZERO = [0]  # one displacement list object for every call, as a caller keeps its own
CALLS = {
    "all_gather_v": lambda c, s, r, counts: c.all_gather_v(s, r, counts, ZERO),
    "reduce_scatter_v": lambda c, s, r, counts: c.reduce_scatter_v(s, r, counts, ZERO, "sum"),
    "all_to_all_v": lambda c, s, r, counts: c.all_to_all_v(s, r, counts, counts, ZERO, ZERO),
    "all_to_all_vc": lambda c, s, r, counts: c.all_to_all_vc(s, r, [counts]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_what_the_checks_refuse_is_refused_after_a_layout_was_used(comm: hcclpy.Communicator, name: str) -> None:
    call: Callable[..., Any] = CALLS[name]
    send, recv = _arrays(comm)
    call(comm, send, recv, [N])
    call(comm, send, recv, (N,))  # a tuple equal to the list: the same layout
    comm.device.default_stream.synchronize()
    assert recv.to_numpy().tolist() == list(range(N))
    with pytest.raises(ValueError, match="non-negative ints?|must be a"):
        call(comm, send, recv, [float(N)])  # equal to the layout used, but not ints
    with pytest.raises(ValueError, match="non-negative ints?|must be a"):
        call(comm, send, recv, [True])  # equal to 1, but a bool
    small = hcclpy.zeros(N // 2, "float32", device=comm.device)
    with pytest.raises(ValueError, match="holds|must equal"):
        call(comm, send, small, [N])
    with pytest.raises(TypeError, match="int32"):
        call(comm, send, hcclpy.zeros(N, "int32", device=comm.device), [N])
    with pytest.raises(ValueError, match="overlap"):
        call(comm, send, send, [N])
    comm.device.default_stream.synchronize()


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("equal", [True, 1.0, np.float64(1.0)], ids=["bool", "float", "numpy-float"])
def test_a_value_equal_to_a_layout_used_before_is_still_refused(comm: hcclpy.Communicator, name: str,
                                                                equal: Any) -> None:
    # The checked layouts are remembered by value, and True, 1.0 and numpy's 1.0 equal 1.
    call: Callable[..., Any] = CALLS[name]
    send = hcclpy.from_numpy(np.ones(1, "float32"), device=comm.device)
    recv = hcclpy.zeros(1, "float32", device=comm.device)
    call(comm, send, recv, [1])
    with pytest.raises(ValueError, match="non-negative ints?|must be a"):
        call(comm, send, recv, [equal])
    call(comm, send, recv, [np.int64(1)])  # a NumPy int is an int
    assert recv.to_numpy().tolist() == [1.0]


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"all_to_all_vc"}))
def test_counts_and_displacements_are_not_read_as_one_list(comm: hcclpy.Communicator, name: str) -> None:
    send, recv = _arrays(comm)
    CALLS[name](comm, send, recv, [N])  # counts [N] and displacements [0] remembered
    with pytest.raises(ValueError, match="must hold 1 non-negative int"):
        getattr(comm, name)(send, recv, *{"all_gather_v": ([N, 0], []), "reduce_scatter_v": ([N, 0], [], "sum"),
                                           "all_to_all_v": ([N, 0], [N, 0], [], [])}[name])


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"all_to_all_vc"}))
def test_a_layout_list_changed_in_place_takes_its_new_values(comm: hcclpy.Communicator, name: str) -> None:
    call: Callable[..., Any] = CALLS[name]
    send, recv = _arrays(comm)
    counts = [N]
    for _ in range(3):
        call(comm, send, recv, counts)
    counts[0] = N // 2  # a different, valid layout (with buffers that would also fit the old one)
    recv.fill_zero()
    call(comm, send[:N // 2] if name == "all_gather_v" else send, recv, counts)
    assert recv.to_numpy().tolist() == list(range(N // 2)) + [0] * (N - N // 2)
    counts[0] = -1
    with pytest.raises(ValueError, match="negative|non-negative"):
        call(comm, send, recv, counts)
    comm.device.default_stream.synchronize()


def test_a_count_matrix_changed_in_place_takes_its_new_values(comm: hcclpy.Communicator) -> None:
    send, recv = _arrays(comm)
    matrix: List[Any] = [[N]]
    for _ in range(3):
        comm.all_to_all_vc(send, recv, matrix)
    matrix[0][0] = N // 2  # a row changed in place: a different, valid matrix
    recv.fill_zero()
    comm.all_to_all_vc(send, recv, matrix)
    assert recv.to_numpy().tolist() == list(range(N // 2)) + [0] * (N - N // 2)
    matrix[0] = [-1]
    with pytest.raises(ValueError, match=r"^send_count_matrix must be a 1 x 1 matrix of non-negative ints, got "
                                         r"\[\[-1\]\]$"):
        comm.all_to_all_vc(send, recv, matrix)
    matrix[0] = np.array([N, 0])  # a row that compares element-wise: the message says what is wrong
    with pytest.raises(ValueError, match="1 x 1 matrix"):
        comm.all_to_all_vc(send, recv, matrix)
    comm.device.default_stream.synchronize()


def _ring_batches(rank: int, size: int, info: bytes) -> List[str]:
    """Batches made again and again give the right result, hold their arrays while queued work
    uses them and no longer, and refuse a closed array."""
    problems: List[str] = []
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        stream = comm.device.create_stream()
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        mine = hcclpy.from_numpy(np.full(N, rank + 1, np.float32), device=comm.device)
        got = hcclpy.zeros(N, "float32", device=comm.device)
        for _ in range(3):
            got.fill_zero()
            comm.batch_send_recv([("send", mine, nxt), ("recv", got, prv)], stream=stream)
            if got.to_numpy().tolist() != [prv + 1.0] * N:
                problems.append(f"the batch received {got.to_numpy()}")
        temporary = hcclpy.zeros(N, "float32", device=comm.device)
        comm.batch_send_recv([("send", mine, nxt), ("recv", temporary, prv)], stream=stream)
        gone = weakref.ref(temporary)
        del temporary
        gc.collect()
        alive = ranks.wait_for(lambda: True, 0) and hcclpy.zeros(N, device=comm.device) is not None
        if not alive:
            problems.append("allocation failed")
        stream.synchronize()
        gc.collect()
        if gone() is not None:
            problems.append("a batch keeps its arrays alive after its work is done")
        barrier = hcclpy.zeros(1, "float32", device=comm.device)
        comm.all_reduce(barrier, stream=stream)  # both ranks are done with got before rank 0 closes it
        stream.synchronize()
        if rank == 0:
            got.close()
            try:
                comm.batch_send_recv([("send", mine, nxt), ("recv", got, prv)], stream=stream)
                problems.append("a batch naming a closed array was queued")
            except ValueError as error:
                if "closed" not in str(error):
                    problems.append(f"a closed array was refused with {error}")
        stream.close()
    return problems


def test_batches_again_and_again() -> None:
    out = ranks.run_threads(_ring_batches, 2)
    assert not [p for problems in out for p in problems], out
