"""Every operation x every dtype x every reduce op x rank counts {1, 2, 3, 4, 8}, as threads and as
processes, against a NumPy reference computed in rank order.

Each rank builds the same ordered list of cases, queues every case on one stream, synchronises once
and then compares each output with the reference (every rank can compute every rank's input, see
``ranks.make_input``). A rank returns the list of mismatches, so one run reports all of them.
Processes: one spawn per rank count runs every case; threads: one run per (rank count, operation).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import hcclpy
import ranks
from ranks import DTYPES, REDUCE_OPS, make_input, np_dtype, reduce_reference

SIZES = (1, 2, 3, 4, 8)
# 8 ranks on 2 cores are slow: they get one type of each width and kind.
DTYPES_8 = ("int8", "uint16", "float16", "int32", "float32", "uint64", "float64") + (
    ("bfloat16",) if ranks.HAVE_BF16 else ())
COUNTS = (1, 3, 8, 17)


def dtypes_for(size: int) -> Tuple[str, ...]:
    return DTYPES_8 if size >= 8 else DTYPES


class Ctx:
    """One rank's view of a run: the communicator, its stream, and the checks made after sync."""

    def __init__(self, comm: hcclpy.Communicator, stream: hcclpy.Stream) -> None:
        self.comm, self.stream = comm, stream
        self.rank, self.size = comm.rank, comm.size
        self.checks: List[Tuple[str, hcclpy.DeviceArray, np.ndarray]] = []
        self.failures: List[str] = []
        self.keep: List[hcclpy.DeviceArray] = []  # queued work reads them: alive until synchronised

    def dev(self, array: np.ndarray) -> hcclpy.DeviceArray:
        out = hcclpy.from_numpy(np.ascontiguousarray(array), device=self.comm.device)
        self.keep.append(out)
        return out

    def zeros(self, count: int, dtype: str) -> hcclpy.DeviceArray:
        out = hcclpy.zeros(count, dtype, device=self.comm.device)
        self.keep.append(out)
        return out

    def expect(self, name: str, out: hcclpy.DeviceArray, want: np.ndarray) -> None:
        self.checks.append((name, out, np.asarray(want)))

    def same(self, name: str, got: Any, want: Any) -> None:
        if got is not want:
            self.failures.append(f"{name}: returned {got!r}, expected {want!r}")

    def verify(self) -> List[str]:
        for name, out, want in self.checks:
            problem = ranks.mismatch(name, out.to_numpy(), want)
            if problem:
                self.failures.append(problem)
        return self.failures


# --------------------------------------------------------------------------------- cases
# Each case function runs on every rank with the same arguments, queues its operation(s) on
# ctx.stream and registers what each output must hold once the stream is synchronised.


def case_all_reduce(ctx: Ctx, tag: str, dtype: str, op: str, count: int, in_place: bool) -> None:
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count, dtype, op) for j in range(n)]
    send = ctx.dev(inputs[r])
    want = reduce_reference(inputs, op, dtype)
    if in_place:
        ctx.same(tag, ctx.comm.all_reduce(send, None, op, stream=ctx.stream), send)
        ctx.expect(tag, send, want)
    else:
        recv = ctx.zeros(count, dtype)
        ctx.same(tag, ctx.comm.all_reduce(send, recv, op, stream=ctx.stream), recv)
        ctx.expect(tag, recv, want)
        ctx.expect(tag + " (send untouched)", send, inputs[r])


def case_reduce(ctx: Ctx, tag: str, dtype: str, op: str, count: int, root: int, in_place: bool) -> None:
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count, dtype, op) for j in range(n)]
    send = ctx.dev(inputs[r])
    want = reduce_reference(inputs, op, dtype)
    if in_place:
        out = ctx.comm.reduce(send, None, op, root, stream=ctx.stream)
        ctx.same(tag, out, send if r == root else None)
        ctx.expect(tag, send, want if r == root else inputs[r])
    else:
        recv = ctx.zeros(count, dtype)
        out = ctx.comm.reduce(send, recv, op, root, stream=ctx.stream)
        ctx.same(tag, out, recv if r == root else None)
        ctx.expect(tag, recv, want if r == root else np.zeros(count, np_dtype(dtype)))
        ctx.expect(tag + " (send untouched)", send, inputs[r])


def case_reduce_scatter(ctx: Ctx, tag: str, dtype: str, op: str, count: int, in_place: bool) -> None:
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count * n, dtype, op) for j in range(n)]
    send = ctx.dev(inputs[r])
    want = reduce_reference(inputs, op, dtype)[r * count:(r + 1) * count]
    recv = send[r * count:(r + 1) * count] if in_place else ctx.zeros(count, dtype)
    ctx.same(tag, ctx.comm.reduce_scatter(send, recv, op, stream=ctx.stream), recv)
    ctx.expect(tag, recv, want)


def _gapped(counts: List[int], order: List[int]) -> Tuple[List[int], int]:
    """Displacements placing block j at a position given by ``order``, one spare element after each."""
    displs, position = [0] * len(counts), 0
    for j in order:
        displs[j] = position
        position += counts[j] + 1
    return displs, position


def case_reduce_scatter_v(ctx: Ctx, tag: str, dtype: str, op: str, salt: int, packed: bool) -> None:
    n, r = ctx.size, ctx.rank
    counts = [(2 * j + salt) % 4 for j in range(n)]
    if packed:
        displs, total = None, sum(counts)
        starts = list(np.cumsum([0] + counts[:-1]))
    else:
        displs, total = _gapped(counts, list(range(n)))
        starts = displs
    inputs = [make_input(tag, j, total, dtype, op) for j in range(n)]
    send = ctx.dev(inputs[r])
    recv = ctx.zeros(counts[r], dtype)
    block = [x[starts[r]:starts[r] + counts[r]] for x in inputs]
    ctx.same(tag, ctx.comm.reduce_scatter_v(send, recv, counts, displs, op, stream=ctx.stream), recv)
    ctx.expect(tag, recv, reduce_reference(block, op, dtype))


def case_broadcast(ctx: Ctx, tag: str, dtype: str, count: int, root: int) -> None:
    r = ctx.rank
    data = make_input(tag, root, count, dtype)
    buf = ctx.dev(data if r == root else np.zeros(count, np_dtype(dtype)))
    ctx.same(tag, ctx.comm.broadcast(buf, root, stream=ctx.stream), buf)
    ctx.expect(tag, buf, data)


def case_all_gather(ctx: Ctx, tag: str, dtype: str, count: int, in_place: bool) -> None:
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count, dtype) for j in range(n)]
    recv = ctx.zeros(count * n, dtype)
    if in_place:
        send = recv[r * count:(r + 1) * count]
        send.copy_from(inputs[r])
    else:
        send = ctx.dev(inputs[r])
    ctx.same(tag, ctx.comm.all_gather(send, recv, stream=ctx.stream), recv)
    ctx.expect(tag, recv, np.concatenate(inputs))


def case_all_gather_v(ctx: Ctx, tag: str, dtype: str, salt: int, packed: bool) -> None:
    n, r = ctx.size, ctx.rank
    counts = [(2 * j + salt) % 4 for j in range(n)]
    inputs = [make_input(tag, j, counts[j], dtype) for j in range(n)]
    if packed:
        displs, total = None, sum(counts)
        starts = list(np.cumsum([0] + counts[:-1]))
    else:
        displs, total = _gapped(counts, list(reversed(range(n))))
        starts = displs
    want = np.zeros(total, np_dtype(dtype))
    for j in range(n):
        want[starts[j]:starts[j] + counts[j]] = inputs[j]
    recv = ctx.zeros(total, dtype)
    ctx.same(tag, ctx.comm.all_gather_v(ctx.dev(inputs[r]), recv, counts, displs, stream=ctx.stream), recv)
    ctx.expect(tag, recv, want)


def case_scatter(ctx: Ctx, tag: str, dtype: str, count: int, root: int, in_place: bool) -> None:
    n, r = ctx.size, ctx.rank
    data = make_input(tag, root, count * n, dtype)
    send = ctx.dev(data) if r == root else None
    recv = send[r * count:(r + 1) * count] if in_place and r == root else ctx.zeros(count, dtype)
    ctx.same(tag, ctx.comm.scatter(send, recv, root, stream=ctx.stream), recv)
    ctx.expect(tag, recv, data[r * count:(r + 1) * count])


def case_all_to_all(ctx: Ctx, tag: str, dtype: str, count: int) -> None:
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count * n, dtype) for j in range(n)]
    recv = ctx.zeros(count * n, dtype)
    ctx.same(tag, ctx.comm.all_to_all(ctx.dev(inputs[r]), recv, stream=ctx.stream), recv)
    ctx.expect(tag, recv, np.concatenate([inputs[j][r * count:(r + 1) * count] for j in range(n)]))


def case_all_to_all_v(ctx: Ctx, tag: str, dtype: str, salt: int, packed: bool) -> None:
    n, r = ctx.size, ctx.rank

    def c(i: int, j: int) -> int:  # elements rank i sends to rank j
        return (i + 2 * j + salt) % 3

    def layout(i: int) -> Tuple[List[int], int, List[int], int]:
        send_counts = [c(i, j) for j in range(n)]
        recv_counts = [c(j, i) for j in range(n)]
        if packed:
            return (list(np.cumsum([0] + send_counts[:-1])), sum(send_counts),
                    list(np.cumsum([0] + recv_counts[:-1])), sum(recv_counts))
        sd, stotal = _gapped(send_counts, list(range(n)))               # in rank order, with gaps
        rd, rtotal = _gapped(recv_counts, list(reversed(range(n))))     # reversed, with gaps
        return sd, stotal, rd, rtotal

    inputs = [make_input(tag, i, layout(i)[1], dtype) for i in range(n)]
    sdispls, _, rdispls, rtotal = layout(r)
    want = np.zeros(rtotal, np_dtype(dtype))
    for j in range(n):
        their_sd = layout(j)[0]
        want[rdispls[j]:rdispls[j] + c(j, r)] = inputs[j][their_sd[r]:their_sd[r] + c(j, r)]
    recv = ctx.zeros(rtotal, dtype)
    send_counts, recv_counts = [c(r, j) for j in range(n)], [c(j, r) for j in range(n)]
    out = ctx.comm.all_to_all_v(ctx.dev(inputs[r]), recv, send_counts, recv_counts,
                                None if packed else sdispls, None if packed else rdispls, stream=ctx.stream)
    ctx.same(tag, out, recv)
    ctx.expect(tag, recv, want)


def case_all_to_all_vc(ctx: Ctx, tag: str, dtype: str, salt: int) -> None:
    n, r = ctx.size, ctx.rank
    matrix = np.array([[(3 * i + j + salt) % 4 for j in range(n)] for i in range(n)])
    inputs = [make_input(tag, i, int(matrix[i].sum()), dtype) for i in range(n)]
    blocks = []
    for j in range(n):
        start = int(matrix[j, :r].sum())
        blocks.append(inputs[j][start:start + matrix[j, r]])
    recv = ctx.zeros(int(matrix[:, r].sum()), dtype)
    ctx.same(tag, ctx.comm.all_to_all_vc(ctx.dev(inputs[r]), recv, matrix, stream=ctx.stream), recv)
    ctx.expect(tag, recv, np.concatenate(blocks))


def case_send_recv(ctx: Ctx, tag: str, dtype: str, count: int) -> None:
    """A ring of plain send/recv, ordered so it cannot deadlock: rank 0 sends first, the others
    receive first."""
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count, dtype) for j in range(n)]
    send, recv = ctx.dev(inputs[r]), ctx.zeros(count, dtype)
    nxt, prv = (r + 1) % n, (r - 1) % n
    if r == 0:
        ctx.same(tag, ctx.comm.send(send, nxt, stream=ctx.stream), None)
        ctx.same(tag, ctx.comm.recv(recv, prv, stream=ctx.stream), recv)
    else:
        ctx.comm.recv(recv, prv, stream=ctx.stream)
        ctx.comm.send(send, nxt, stream=ctx.stream)
    ctx.expect(tag, recv, inputs[prv])


def case_batch_send_recv(ctx: Ctx, tag: str, dtype: str, count: int, all_pairs: bool) -> None:
    """A ring (send to the next rank, receive from the previous), or every rank with every rank,
    itself included (HCCL copies what a rank sends itself into its receive from itself)."""
    n, r = ctx.size, ctx.rank
    if not all_pairs:
        inputs = [make_input(tag, j, count, dtype) for j in range(n)]
        recv = ctx.zeros(count, dtype)
        items = [("send", ctx.dev(inputs[r]), (r + 1) % n), ("recv", recv, (r - 1) % n)]
        ctx.same(tag, ctx.comm.batch_send_recv(items, stream=ctx.stream), None)
        ctx.expect(tag, recv, inputs[(r - 1) % n])
        return
    items: List[Tuple[str, Any, int]] = []
    for peer in range(n):
        recv = ctx.zeros(count, dtype)
        items.append(("recv", recv, peer))
        items.append(("send", ctx.dev(make_input(f"{tag}/{r}->{peer}", 0, count, dtype)), peer))
        ctx.expect(f"{tag} from {peer}", recv, make_input(f"{tag}/{peer}->{r}", 0, count, dtype))
    ctx.comm.batch_send_recv(items, stream=ctx.stream)


def case_group_send_recv(ctx: Ctx, tag: str, dtype: str, count: int) -> None:
    """Inside hcclpy.group() a rank may send before it receives without deadlock."""
    n, r = ctx.size, ctx.rank
    inputs = [make_input(tag, j, count, dtype) for j in range(n)]
    recv = ctx.zeros(count, dtype)
    with hcclpy.group():
        ctx.comm.send(ctx.dev(inputs[r]), (r + 1) % n, stream=ctx.stream)
        ctx.comm.recv(recv, (r - 1) % n, stream=ctx.stream)
    ctx.expect(tag, recv, inputs[(r - 1) % n])


def case_barrier(ctx: Ctx, tag: str) -> None:
    ctx.same(tag, ctx.comm.barrier(stream=ctx.stream), None)


CASES: Dict[str, Callable[..., None]] = {
    "all_reduce": case_all_reduce, "reduce": case_reduce, "reduce_scatter": case_reduce_scatter,
    "reduce_scatter_v": case_reduce_scatter_v, "broadcast": case_broadcast, "all_gather": case_all_gather,
    "all_gather_v": case_all_gather_v, "scatter": case_scatter, "all_to_all": case_all_to_all,
    "all_to_all_v": case_all_to_all_v, "all_to_all_vc": case_all_to_all_vc, "send_recv": case_send_recv,
    "batch_send_recv": case_batch_send_recv, "group_send_recv": case_group_send_recv, "barrier": case_barrier,
}
OPERATIONS = tuple(CASES)
P2P = ("send_recv", "batch_send_recv", "group_send_recv")
# Those a one-rank communicator cannot make (its batches only send to the rank itself).
NEEDS_PEERS = ("send_recv", "group_send_recv")


def build_cases(size: int, operations: Tuple[str, ...]) -> List[Tuple[str, Dict[str, Any]]]:
    """The ordered case list; identical on every rank."""
    dtypes = dtypes_for(size)
    cases: List[Tuple[str, Dict[str, Any]]] = []

    def add(operation: str, **kw: Any) -> None:
        if operation in operations:
            tag = operation + "/" + "/".join(f"{k}={v}" for k, v in kw.items())
            cases.append((operation, dict(tag=tag, **kw)))

    i = 0
    for dtype in dtypes:
        for op in REDUCE_OPS:
            count = COUNTS[i % len(COUNTS)]
            for in_place in (False, True):
                add("all_reduce", dtype=dtype, op=op, count=count, in_place=in_place)
            add("reduce", dtype=dtype, op=op, count=count, root=i % size, in_place=bool((i // size) % 2))
            add("reduce_scatter", dtype=dtype, op=op, count=count, in_place=op == "sum")
            add("reduce_scatter_v", dtype=dtype, op=op, salt=i, packed=False)
            i += 1
        count = COUNTS[i % len(COUNTS)]
        add("broadcast", dtype=dtype, count=count, root=i % size)
        add("scatter", dtype=dtype, count=count, root=(i + 1) % size, in_place=bool(i % 2))
        for in_place in (False, True):
            add("all_gather", dtype=dtype, count=count, in_place=in_place)
        add("all_gather_v", dtype=dtype, salt=i, packed=False)
        add("all_to_all", dtype=dtype, count=count)
        add("all_to_all_v", dtype=dtype, salt=i, packed=False)
        add("all_to_all_vc", dtype=dtype, salt=i)
        if size > 1:
            add("send_recv", dtype=dtype, count=count)
            add("batch_send_recv", dtype=dtype, count=count, all_pairs=False)
            add("group_send_recv", dtype=dtype, count=count)
        add("batch_send_recv", dtype=dtype, count=count, all_pairs=True)  # (a one-rank batch: to itself)
    # Every root, both layouts, for the rooted operations.
    for root in range(size):
        for in_place in (False, True):
            add("reduce", dtype="float32", op="sum", count=5, root=root, in_place=in_place)
            add("scatter", dtype="int32", count=3, root=root, in_place=in_place)
        add("broadcast", dtype="int32", count=4, root=root)
    # Packed (default) displacements of the v operations.
    add("reduce_scatter_v", dtype="float32", op="sum", salt=1, packed=True)
    add("all_gather_v", dtype="int16", salt=2, packed=True)
    add("all_to_all_v", dtype="int64", salt=3, packed=True)
    # Messages large enough to be processed in several chunks.
    add("all_reduce", dtype="float32", op="sum", count=100_003, in_place=False)
    add("all_reduce", dtype="float16", op="max", count=70_001, in_place=True)
    add("reduce_scatter", dtype="int32", op="sum", count=40_001, in_place=False)
    add("all_gather", dtype="uint8", count=50_001, in_place=False)
    add("broadcast", dtype="float64", count=30_001, root=size - 1)
    add("barrier")
    return cases


def exercise(rank: int, size: int, info: bytes, operations: Tuple[str, ...]) -> Dict[str, Any]:
    """The rank body: run every case of ``operations``, return the mismatches."""
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    stream = hcclpy.Device(rank).create_stream()
    ctx = Ctx(comm, stream)
    cases = build_cases(size, operations)
    for op, kwargs in cases:
        CASES[op](ctx, **kwargs)
    stream.synchronize()
    failures = ctx.verify()
    stream.close()
    comm.destroy()
    return {"cases": len(cases), "checks": len(ctx.checks), "failures": failures}


def _assert_clean(results: List[Dict[str, Any]]) -> None:
    problems = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not problems, f"{len(problems)} mismatch(es):\n" + "\n".join(problems[:40])
    assert all(res["cases"] > 0 for res in results)


# Send and recv need two ranks: they are not run on one.
@pytest.mark.parametrize("size, operation", [(size, operation) for size in SIZES for operation in OPERATIONS
                                             if size > 1 or operation not in NEEDS_PEERS])
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_threads(size: int, operation: str) -> None:
    _assert_clean(ranks.run_threads(exercise, size, (operation,), timeout=90))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.timeout(240)
@pytest.mark.slow
def test_processes(size: int) -> None:
    _assert_clean(ranks.run_processes(exercise, size, OPERATIONS, timeout=200))


def test_case_list_covers_every_dtype_op_and_root() -> None:
    for size in SIZES:
        cases = build_cases(size, OPERATIONS)
        ops = {op for op, _ in cases}
        assert ops == set(OPERATIONS) - (set(NEEDS_PEERS) if size == 1 else set())
        for op in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v"):
            combos = {(kw["dtype"], kw["op"]) for o, kw in cases if o == op}
            assert combos >= {(d, o) for d in dtypes_for(size) for o in REDUCE_OPS}, op
        for op in ("broadcast", "scatter", "all_gather", "all_gather_v", "all_to_all", "all_to_all_v",
                   "all_to_all_vc") + (P2P if size > 1 else ("batch_send_recv",)):
            assert {kw["dtype"] for o, kw in cases if o == op} >= set(dtypes_for(size)), op
        for op in ("reduce", "broadcast", "scatter"):
            assert {kw["root"] for o, kw in cases if o == op} == set(range(size)), op


def test_bfloat16_is_covered() -> None:
    pytest.importorskip("ml_dtypes", reason="bfloat16 cases need the ml_dtypes package")
    assert "bfloat16" in DTYPES and "bfloat16" in DTYPES_8
