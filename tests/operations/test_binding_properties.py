"""Property tests (hypothesis): operations against the NumPy reference over rank counts, element
counts (0 and 1 included), shapes, dtypes, reduce ops, roots, uneven layouts and split ranks.

Ranks run as threads (cheap enough for many examples); example counts are modest.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hcclpy
import ranks
from ranks import DTYPES, REDUCE_OPS, make_input, np_dtype, reduce_reference
from test_binding_ops import CASES, Ctx

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

sizes = st.sampled_from([1, 2, 3, 4, 8])
counts = st.one_of(st.sampled_from([0, 1]), st.integers(0, 40))
dtypes = st.sampled_from(DTYPES)
reduce_ops = st.sampled_from(REDUCE_OPS)


def _run_case(rank: int, size: int, info: bytes, operation: str, kwargs: Dict[str, Any]) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    try:
        ctx = Ctx(comm, stream)
        CASES[operation](ctx, tag=f"{operation}/{sorted(kwargs.items())}", **kwargs)
        stream.synchronize()
        return ctx.verify()
    finally:
        stream.close()
        comm.destroy()


def _check(size: int, fn: Any, *args: Any) -> None:
    # A short exec timeout: a failing example (and hypothesis shrinking it) must not wait long.
    results = ranks.run_threads(fn, size, *args, timeout=60, env={"HCCL_EXEC_TIMEOUT": "10"})
    problems = [f"rank {r}: {p}" for r, res in enumerate(results) for p in res]
    assert not problems, "\n".join(problems)


@SETTINGS
@given(size=sizes, operation=st.sampled_from(["all_reduce", "reduce", "reduce_scatter"]), count=counts,
       dtype=dtypes, op=reduce_ops, root=st.integers(0, 7), in_place=st.booleans())
def test_reductions(size: int, operation: str, count: int, dtype: str, op: str, root: int, in_place: bool) -> None:
    kwargs: Dict[str, Any] = dict(dtype=dtype, op=op, count=count, in_place=in_place)
    if operation == "reduce":
        kwargs["root"] = root % size
    _check(size, _run_case, operation, kwargs)


@SETTINGS
@given(size=sizes, operation=st.sampled_from(["broadcast", "all_gather", "scatter", "all_to_all"]),
       count=counts, dtype=dtypes, root=st.integers(0, 7), in_place=st.booleans())
def test_data_motion(size: int, operation: str, count: int, dtype: str, root: int, in_place: bool) -> None:
    kwargs: Dict[str, Any] = dict(dtype=dtype, count=count)
    if operation in ("broadcast", "scatter"):
        kwargs["root"] = root % size
    if operation in ("all_gather", "scatter"):
        kwargs["in_place"] = in_place
    _check(size, _run_case, operation, kwargs)


@SETTINGS
@given(size=st.sampled_from([2, 3, 4, 8]), operation=st.sampled_from(["send_recv", "batch_send_recv",
                                                                      "group_send_recv"]),
       count=counts, dtype=dtypes)
def test_point_to_point(size: int, operation: str, count: int, dtype: str) -> None:
    kwargs: Dict[str, Any] = dict(dtype=dtype, count=count)
    if operation == "batch_send_recv":
        kwargs["all_pairs"] = count % 2 == 0
    _check(size, _run_case, operation, kwargs)


# ------------------------------------------------------------------------------ shapes

def _shaped(rank: int, size: int, info: bytes, shape: Tuple[int, ...], dtype: str, op: str) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    count = int(np.prod(shape, dtype=np.int64))
    inputs = [make_input(f"shaped/{shape}", j, count, dtype, op).reshape(shape) for j in range(size)]
    problems = []
    try:
        x = hcclpy.from_numpy(inputs[rank])
        y = hcclpy.zeros(shape, dtype)
        gathered = hcclpy.zeros((size,) + shape, dtype)
        comm.all_reduce(x, y, op, stream=stream)
        comm.all_gather(x, gathered, stream=stream)
        comm.all_reduce(x, None, op, stream=stream)
        stream.synchronize()
        want = reduce_reference(inputs, op, dtype)
        for name, got, expected in (("all_reduce", y.to_numpy(), want), ("in place", x.to_numpy(), want),
                                    ("all_gather", gathered.to_numpy(), np.stack(inputs))):
            problem = ranks.mismatch(f"{name} {shape}", got, expected)
            if problem:
                problems.append(problem)
        return problems
    finally:
        stream.close()
        comm.destroy()


@SETTINGS
@given(size=sizes, shape=st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple), dtype=dtypes,
       op=reduce_ops)
def test_shapes(size: int, shape: Tuple[int, ...], dtype: str, op: str) -> None:
    _check(size, _shaped, shape, dtype, op)


# ---------------------------------------------------------------------- uneven layouts

def _layout(counts: Sequence[int], order: Sequence[int], gaps: Sequence[int]) -> Tuple[List[int], int]:
    """Displacements putting block ``order[k]`` k-th, followed by ``gaps[k]`` unused elements."""
    displs, position = [0] * len(counts), 0
    for k, j in enumerate(order):
        displs[j] = position
        position += counts[j] + gaps[k]
    return displs, position


def _uneven(rank: int, size: int, info: bytes, kind: str, matrix: List[List[int]], orders: List[List[int]],
            gaps: List[List[int]], dtype: str, op: Optional[str]) -> List[str]:
    """all_to_all_v / all_to_all_vc / all_gather_v / reduce_scatter_v with the counts of ``matrix``
    (row i: what rank i sends to each rank) and, per rank, a block order and gaps for its layouts."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    n, r, m = size, rank, np.array(matrix, dtype=np.int64).reshape(size, size)
    dt = np_dtype(dtype)
    tag = f"{kind}/{matrix}/{orders}/{gaps}"
    keep = []

    def dev(array: np.ndarray) -> hcclpy.DeviceArray:
        keep.append(hcclpy.from_numpy(np.ascontiguousarray(array)))
        return keep[-1]

    try:
        if kind == "all_to_all_v":
            send_layout = [_layout(list(m[i]), orders[i], gaps[i]) for i in range(n)]
            recv_displs, recv_total = _layout(list(m[:, r]), orders[(r + 1) % n], gaps[(r + 1) % n])
            inputs = [make_input(tag, i, send_layout[i][1], dtype) for i in range(n)]
            want = np.zeros(recv_total, dt)
            for j in range(n):
                start = send_layout[j][0][r]
                want[recv_displs[j]:recv_displs[j] + m[j, r]] = inputs[j][start:start + m[j, r]]
            out = dev(np.zeros(recv_total, dt))
            comm.all_to_all_v(dev(inputs[r]), out, list(m[r]), list(m[:, r]), send_layout[r][0], recv_displs,
                              stream=stream)
        elif kind == "all_to_all_vc":
            inputs = [make_input(tag, i, int(m[i].sum()), dtype) for i in range(n)]
            want = np.concatenate([inputs[j][int(m[j, :r].sum()):int(m[j, :r + 1].sum())] for j in range(n)])
            out = dev(np.zeros(int(m[:, r].sum()), dt))
            comm.all_to_all_vc(dev(inputs[r]), out, m, stream=stream)
        elif kind == "all_gather_v":
            counts = list(m[0])
            displs, total = _layout(counts, orders[0], gaps[0])
            inputs = [make_input(tag, j, counts[j], dtype) for j in range(n)]
            want = np.zeros(total, dt)
            for j in range(n):
                want[displs[j]:displs[j] + counts[j]] = inputs[j]
            out = dev(np.zeros(total, dt))
            comm.all_gather_v(dev(inputs[r]), out, counts, displs, stream=stream)
        else:  # reduce_scatter_v
            counts = list(m[0])
            displs, total = _layout(counts, orders[0], gaps[0])
            inputs = [make_input(tag, j, total, dtype, op) for j in range(n)]
            want = reduce_reference([x[displs[r]:displs[r] + counts[r]] for x in inputs], op, dtype)
            out = dev(np.zeros(counts[r], dt))
            comm.reduce_scatter_v(dev(inputs[r]), out, counts, displs, op, stream=stream)
        stream.synchronize()
        problem = ranks.mismatch(tag, out.to_numpy(), want)
        return [problem] if problem else []
    finally:
        stream.close()
        comm.destroy()


@st.composite
def uneven_cases(draw: Any) -> Tuple[int, str, List[List[int]], List[List[int]], List[List[int]]]:
    size = draw(sizes)
    kind = draw(st.sampled_from(["all_to_all_v", "all_to_all_vc", "all_gather_v", "reduce_scatter_v"]))
    cell = st.one_of(st.just(0), st.integers(0, 6))
    matrix = [draw(st.lists(cell, min_size=size, max_size=size)) for _ in range(size)]
    orders = [draw(st.permutations(range(size))) for _ in range(size)]
    gaps = [draw(st.lists(st.integers(0, 2), min_size=size, max_size=size)) for _ in range(size)]
    return size, kind, matrix, orders, gaps


@SETTINGS
@given(case=uneven_cases(), dtype=dtypes, op=reduce_ops)
def test_uneven_layouts(case: Tuple[int, str, List[List[int]], List[List[int]], List[List[int]]], dtype: str,
                        op: str) -> None:
    size, kind, matrix, orders, gaps = case
    _check(size, _uneven, kind, matrix, orders, gaps, dtype, op if kind == "reduce_scatter_v" else None)


# --------------------------------------------------------------------------------- split

def _split(rank: int, size: int, info: bytes, members: List[int], nested: List[int], dtype: str,
           op: str) -> List[str]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    problems: List[str] = []
    subs = []
    try:
        sub = comm.split(members)
        if rank not in members:
            return [] if sub is None else [f"non-member got {sub!r}"]
        subs.append(sub)
        if (sub.rank, sub.size) != (members.index(rank), len(members)):
            problems.append(f"sub is rank {sub.rank} of {sub.size}, expected {members.index(rank)} of {len(members)}")
        inner = sub.split(nested)  # a split of a split: the binding's root-info fallback
        layers = [(sub, members)]
        if sub.rank in nested:
            subs.append(inner)
            layers.append((inner, [members[k] for k in nested]))
        elif inner is not None:
            problems.append(f"non-member of the nested split got {inner!r}")
        for c, parent_ranks in layers:
            inputs = [make_input(f"split/{parent_ranks}", p, 5, dtype, op) for p in parent_ranks]
            x = hcclpy.from_numpy(inputs[c.rank])
            g = hcclpy.zeros(5 * c.size, dtype)
            s = hcclpy.Device(rank).create_stream()
            c.all_reduce(x, None, op, stream=s)
            c.all_gather(hcclpy.from_numpy(inputs[c.rank]), g, stream=s)
            s.synchronize()
            s.close()
            for problem in (ranks.mismatch(f"all_reduce on {parent_ranks}", x.to_numpy(),
                                           reduce_reference(inputs, op, dtype)),
                            ranks.mismatch(f"all_gather on {parent_ranks}", g.to_numpy(), np.concatenate(inputs))):
                if problem:
                    problems.append(problem)
        return problems
    finally:
        for sub in reversed(subs):
            sub.destroy()
        stream.close()
        comm.destroy()


@st.composite
def split_cases(draw: Any) -> Tuple[int, List[int], List[int]]:
    size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    members = sorted(draw(st.sets(st.integers(0, size - 1), min_size=1)))
    nested = sorted(draw(st.sets(st.integers(0, len(members) - 1), min_size=1)))
    return size, members, nested


@SETTINGS
@given(case=split_cases(), dtype=dtypes, op=reduce_ops)
def test_split_ranks(case: Tuple[int, List[int], List[int]], dtype: str, op: str) -> None:
    size, members, nested = case
    _check(size, _split, members, nested, dtype, op)


spans = st.lists(st.tuples(st.integers(0, 64), st.integers(0, 16), st.booleans()), max_size=12).map(
    lambda items: [(start, start + length, receives) for start, length, receives in items])


@SETTINGS
@given(spans)
def test_a_batch_refuses_exactly_the_receives_that_share_memory(items: List[Tuple[int, int, bool]]) -> None:
    """batch_send_recv's overlap check (a sweep over the sorted spans) against every pair."""
    from hcclpy.collectives._ops import _receives_apart

    clashes = [(i, j) for i in range(len(items)) for j in range(i + 1, len(items))
               if (items[i][2] or items[j][2]) and items[i][0] < items[j][1] and items[j][0] < items[i][1]
               and items[i][0] < items[i][1] and items[j][0] < items[j][1]]
    try:
        _receives_apart(items)
    except ValueError as exc:
        assert clashes, f"refused without a clash: {exc}"
        named = tuple(int(n) for n in re.findall(r"items\[(\d+)\]", str(exc)))
        assert named in clashes, f"{exc} names {named}, not one of {clashes}"
    else:
        assert not clashes, f"accepted, but these pairs share memory: {clashes}"
