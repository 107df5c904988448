"""Every operation on NumPy arrays (the ``Communicator`` methods, staged through device scratch by
``hcclpy.collectives``) against a NumPy reference: 1-4 ranks as threads, every dtype (bfloat16
through ml_dtypes), multi-dimensional and non-contiguous inputs, in-place results, ``out=``, new
outputs and their shapes, large arrays staged whole (as threads and as processes), hypothesis
properties, argument errors, and the steady state (no new device scratch).

The NumPy path means what the device path means (issue 28): an omitted output is in place where
the operation has an in-place form (all_reduce, reduce on the root, broadcast: the input is
overwritten and returned), elsewhere a new array; an array a result is written to must be
writable, C-contiguous and in the machine's byte order (``ValueError`` naming it); the counts of
the uneven operations go by name; ranks that pass different sizes get
``CollectiveMismatchError`` on every rank.

Each rank computes every rank's input (``ranks.make_input``, or :func:`any_input` for the dtypes HCCL
lacks), runs its operations and returns a list of mismatches, so one run reports all of them.
Results are compared bit for bit.

Dtypes HCCL lacks: complex arrays in every operation (reductions with sum), other dtypes of fixed
size (bool, datetime64, strings, structured...) in the operations that move data, the refusals of
the rest before any C call, and the product profiles checking the HCCL type that carries them.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hcclpy
import hcclpy.host
import ranks
from hcclpy.collectives import _buffers, _staging
from ranks import DTYPES, REDUCE_OPS, make_input, np_dtype, reduce_reference

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore::hcclpy.SimulatorFallbackWarning")]

SIZES = (1, 2, 3, 4)
LAYOUTS = ("contiguous", "strided", "fortran")
Shape = Tuple[int, ...]

COMPLEX = ("complex64", "complex128")
# Dtypes moved as bytes, odd item sizes too (33, 7 and 3 bytes: only bytes divide them).
MOVED = ("bool", "datetime64[ms]", "timedelta64[ns]", "<U5", "S3", "i4,(2,)f8,U3,?", "V7", "longdouble",
         "clongdouble")
MOVE_OPERATIONS = ("broadcast", "all_gather", "all_to_all", "scatter", "all_gather_v", "all_to_all_v", "all_to_all_vc",
                   "send_recv", "batch_send_recv")
REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v")
# What an array that cannot take a result is told (after "<argument> is <why>, but <operation> ").
NOT_WRITABLE = (r"writes its result there: pass a writable, C-contiguous NumPy array in this machine's byte order "
                r"\(np\.ascontiguousarray\(\.\.\.\) makes one\), or a device buffer$")


def any_input(tag: str, rank: int, count: int, dtype: str, op: Optional[str] = None) -> np.ndarray:
    """``ranks.make_input`` for any dtype: HCCL's types as it makes them, the others here."""
    if dtype in DTYPES:
        return make_input(tag, rank, count, dtype, op)
    return _random(np.random.default_rng([zlib.crc32(tag.encode()), rank]), np.dtype(dtype), count)


def _random(rng: np.random.Generator, dtype: np.dtype, count: int) -> np.ndarray:
    """``count`` values of ``dtype``: valid booleans and strings, complex numbers (whose parts the
    simulator sums in rank order, as the NumPy reference does), random bytes for the rest."""
    if dtype.names:
        result = np.zeros(count, dtype)
        for name in dtype.names:
            field = dtype.fields[name][0]
            result[name] = _random(rng, field.base, count * math.prod(field.shape)).reshape((count,) + field.shape)
        return result
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype)
    if dtype.kind in "US":
        width = dtype.itemsize // (4 if dtype.kind == "U" else 1)
        letters = rng.integers(ord("a"), ord("z") + 1, (count, width))
        lengths = rng.integers(0, width + 1, count)
        return np.array(["".join(map(chr, row[:n])) for row, n in zip(letters, lengths)], dtype=dtype)
    if dtype.kind == "f" and dtype.itemsize <= 8:
        return (rng.standard_normal(count) * 4).astype(dtype)
    if dtype.kind == "c" and dtype.itemsize <= 16:
        return (rng.standard_normal(count) * 4 + 1j * rng.standard_normal(count) * 4).astype(dtype)
    # Integers, datetimes, raw bytes, and long doubles, whose padding a conversion leaves undefined.
    return rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).view(dtype)


def run(size: int, fn: Callable[..., List[str]], *args: Any, timeout: float = 90.0, mode: str = "threads",
        env: Optional[Dict[str, str]] = None) -> None:
    """Run ``fn`` as ``size`` ranks (threads or processes, ``mode``); fail with every rank's
    mismatches."""
    results = ranks.run(mode, fn, size, *args, timeout=timeout, env={"HCCL_EXEC_TIMEOUT": "10", **(env or {})})
    problems = [f"rank {r}: {p}" for r, res in enumerate(results) for p in res]
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:40])


def arrange(values: np.ndarray, shape: Shape, layout: str) -> np.ndarray:
    """``values`` as an array of ``shape`` laid out as ``layout`` says (same logical contents)."""
    logical = values.reshape(shape)
    if layout == "contiguous":
        return logical
    if layout == "fortran":
        return np.asfortranarray(logical)
    if layout == "strided":  # every other element of the last axis of a twice-as-wide array
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype=logical.dtype)
        wide[..., ::2] = logical
        return wide[..., ::2]
    raise ValueError(layout)


class Rank:
    """One rank's communicator and the mismatches it found."""

    def __init__(self, rank: int, size: int, info: bytes) -> None:
        self.rank, self.size = rank, size
        self.comm = hcclpy.Communicator(size, info, rank, device=rank)
        self.problems: List[str] = []

    def inputs(self, tag: str, shape: Shape, dtype: str, op: Optional[str] = None,
               layout: str = "contiguous") -> List[np.ndarray]:
        count = int(np.prod(shape, dtype=np.int64))
        return [arrange(any_input(tag, j, count, dtype, op), shape, layout) for j in range(self.size)]

    def eq(self, name: str, got: Any, want: np.ndarray) -> None:
        if not isinstance(got, np.ndarray):
            self.problems.append(f"{name}: returned {type(got).__name__}, expected an array")
            return
        problem = ranks.mismatch(name, got, np.ascontiguousarray(want))
        if problem:
            self.problems.append(problem)
        elif not got.flags.c_contiguous:
            self.problems.append(f"{name}: the result is not C-contiguous")

    def check(self, name: str, condition: bool, detail: str = "") -> None:
        if not condition:
            self.problems.append(f"{name}: {detail or 'check failed'}")

    def refused(self, name: str, call: Callable[[], Any], kind: type, pattern: str) -> None:
        """``call()`` must raise ``kind`` with a message that ``pattern`` matches (re.search)."""
        try:
            call()
        except kind as exc:
            if not re.search(pattern, str(exc)):
                self.problems.append(f"{name}: {type(exc).__name__}({exc}) does not match {pattern!r}")
        except Exception as exc:  # noqa: BLE001
            self.problems.append(f"{name}: raised {type(exc).__name__}({exc}), expected {kind.__name__}")
        else:
            self.problems.append(f"{name}: no error, expected {kind.__name__}")

    def same(self, name: str, got: Any, want: Any) -> None:
        self.check(name, got is want, f"returned {type(got).__name__} {id(got)}, expected the object passed")

    def untouched(self, name: str, array: np.ndarray, before: np.ndarray) -> None:
        self.check(name + " (input untouched)", array.tobytes() == before.tobytes(), "the input was modified")

    def close(self) -> List[str]:
        self.comm.destroy()
        return self.problems


def blocks(shape: Shape, size: int) -> Shape:
    """The shape whose first axis splits into ``size`` blocks of ``shape``."""
    return (shape[0] * size,) + shape[1:]


def writable_copy(array: np.ndarray) -> np.ndarray:
    """A writable, C-contiguous copy of ``array``: what an in-place call takes."""
    return np.array(array, order="C", copy=True)


# ------------------------------------------------------------------------ one operation each
# Each runs the operation as the ranks would: its new output, out=, the positional recv, and its
# in-place form where it has one; inputs of out-of-place calls are left unchanged.

def op_all_reduce(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, op, layout)
    x, before = xs[me.rank], xs[me.rank].copy()
    want = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    out = np.full(shape, 7, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_reduce(x, out=out, op=op), out)
    me.eq(tag + " out=", out, want)
    out2 = np.zeros(shape, dtype=np_dtype(dtype))
    me.same(tag + " recv positional", me.comm.all_reduce(x, out2, op), out2)
    me.eq(tag + " recv positional", out2, want)
    me.untouched(tag, x, before)
    # In place: the input is the result.
    mine = writable_copy(x)
    me.same(tag + " in place", me.comm.all_reduce(mine, op=op), mine)
    me.eq(tag + " in place", mine, want)
    again = writable_copy(x)
    me.same(tag + " in place (out=send)", me.comm.all_reduce(again, out=again, op=op), again)
    me.eq(tag + " in place (out=send)", again, want)
    if not x.flags.c_contiguous:  # every rank alike: refused before any C call
        me.refused(tag + " in place, not C-contiguous", lambda: me.comm.all_reduce(x, op=op), ValueError,
                   r"^send is not C-contiguous, but all_reduce " + NOT_WRITABLE)
        me.untouched(tag + " in place, not C-contiguous", x, before)


def op_broadcast(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    data = me.inputs(tag, shape, dtype, None, layout)[root]
    if me.rank == root:  # read there, in any layout, and returned as it is
        before = data.copy()
        me.same(tag + " (root)", me.comm.broadcast(data, root), data)
        me.untouched(tag + " (root)", data, before)
    else:  # filled in place
        buf = np.zeros(shape, dtype=np_dtype(dtype))
        me.same(tag, me.comm.broadcast(buf, root), buf)
        me.eq(tag, buf, data)
    # The root by keyword, and a root whose buffer is C-contiguous.
    buf = writable_copy(data) if me.rank == root else np.zeros(shape, dtype=np_dtype(dtype))
    me.same(tag + " root=", me.comm.broadcast(buf, root=root), buf)
    me.eq(tag + " root=", buf, data)


def op_reduce(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, op, layout)
    x, before = xs[me.rank], xs[me.rank].copy()
    want = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    out = np.zeros(shape, dtype=np_dtype(dtype))
    got_out = me.comm.reduce(x, out=out, op=op, root=root)
    mine = writable_copy(x)
    got = me.comm.reduce(mine, op=op, root=root)
    if me.rank == root:
        me.same(tag + " out=", got_out, out)
        me.eq(tag + " out=", out, want)
        me.same(tag + " in place", got, mine)
        me.eq(tag + " in place", mine, want)
    else:
        me.check(tag, got is None and got_out is None, "a non-root rank got a result")
        me.check(tag + " out=", not out.any(), "a non-root rank's out was written")
        me.eq(tag + " in place on a non-root", mine, x)  # its input, unchanged
    me.untouched(tag, x, before)


def op_all_gather(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, None, layout)
    x, before = xs[me.rank], xs[me.rank].copy()
    want = np.stack([np.ascontiguousarray(v) for v in xs])  # shape (size, *shape)
    me.eq(tag, me.comm.all_gather(x), want)
    out = np.empty((me.size,) + shape, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_gather(x, out=out), out)
    me.eq(tag + " out=", out, want)
    me.untouched(tag, x, before)


def op_reduce_scatter(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, blocks(shape, me.size), dtype, op, layout)
    x, before = xs[me.rank], xs[me.rank].copy()
    full = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    want = full[me.rank * shape[0]:(me.rank + 1) * shape[0]]  # the first axis split
    me.eq(tag, me.comm.reduce_scatter(x, op=op), want)
    out = np.empty(shape, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.reduce_scatter(x, out=out, op=op), out)
    me.eq(tag + " out=", out, want)
    me.untouched(tag, x, before)


def op_all_to_all(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, blocks(shape, me.size), dtype, None, layout)
    b, r = shape[0], me.rank
    x, before = xs[r], xs[r].copy()
    want = np.concatenate([np.ascontiguousarray(v)[r * b:(r + 1) * b] for v in xs])  # x's shape
    me.eq(tag, me.comm.all_to_all(x), want)
    out = np.empty(blocks(shape, me.size), dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_to_all(x, out=out), out)
    me.eq(tag + " out=", out, want)
    me.untouched(tag, x, before)


def op_scatter(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    data = me.inputs(tag, blocks(shape, me.size), dtype, None, layout)[root]
    b, r = shape[0], me.rank
    want = np.ascontiguousarray(data)[r * b:(r + 1) * b]
    dt = np_dtype(dtype)
    if r == root:
        before = data.copy()
        me.eq(tag, me.comm.scatter(data, root=root), want)
        out = np.empty(shape, dtype=dt)
        me.same(tag + " out=", me.comm.scatter(data, root=root, out=out), out)
        me.eq(tag + " out=", out, want)
        me.untouched(tag, data, before)
    else:
        me.eq(tag + " template", me.comm.scatter(np.zeros(blocks(shape, me.size), dt), root=root), want)
        out = np.empty(shape, dtype=dt)
        me.same(tag + " out=", me.comm.scatter(None, root=root, out=out), out)
        me.eq(tag + " out=", out, want)


def _counts(size: int, salt: int) -> List[int]:
    """Uneven per-rank counts, none zero (zero is its own test)."""
    return [1 + (3 * j + salt) % 4 for j in range(size)]


def op_all_gather_v(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    counts = _counts(me.size, root)
    xs = [any_input(tag, j, counts[j], dtype) for j in range(me.size)]
    mine = arrange(xs[me.rank], (counts[me.rank],), layout)
    before = mine.copy()
    me.eq(tag, me.comm.all_gather_v(mine, recv_counts=counts), np.concatenate(xs))
    out = np.empty(sum(counts), dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_gather_v(mine, recv_counts=counts, out=out), out)
    me.eq(tag + " out=", out, np.concatenate(xs))
    # Gapped displacements: a new output reads 0 between the blocks.
    displs = [int(d) for d in np.cumsum([0] + [c + 2 for c in counts[:-1]])]
    want = np.zeros(displs[-1] + counts[-1], dtype=np_dtype(dtype))
    for d, c, x in zip(displs, counts, xs):
        want[d:d + c] = x
    me.eq(tag + " displs", me.comm.all_gather_v(mine, recv_counts=counts, recv_displs=displs), want)
    me.untouched(tag, mine, before)


def op_reduce_scatter_v(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    counts = _counts(me.size, root + 1)
    total = sum(counts)
    xs = [any_input(tag, j, total, dtype, op) for j in range(me.size)]
    full = reduce_reference(xs, op, dtype)
    start = sum(counts[:me.rank])
    want = full[start:start + counts[me.rank]]
    mine = arrange(xs[me.rank], (total,), layout)
    before = mine.copy()
    me.eq(tag, me.comm.reduce_scatter_v(mine, send_counts=counts, op=op), want)
    out = np.empty(counts[me.rank], dtype=np_dtype(dtype))
    got = me.comm.reduce_scatter_v(mine, send_counts=counts, out=out, op=op)
    me.same(tag + " out=", got, out)
    me.eq(tag + " out=", out, want)
    out2 = np.empty(counts[me.rank], dtype=np_dtype(dtype))
    me.same(tag + " recv positional", me.comm.reduce_scatter_v(mine, out2, send_counts=counts, op=op), out2)
    me.eq(tag + " recv positional", out2, want)
    me.untouched(tag, mine, before)


def _matrix(size: int, salt: int) -> np.ndarray:
    """``m[i][j]``: elements rank i sends to rank j (every row and column non-zero)."""
    return np.array([[1 + (i + 2 * j + salt) % 3 for j in range(size)] for i in range(size)], dtype=np.int64)


def _a2av_reference(xs: Sequence[np.ndarray], matrix: np.ndarray, rank: int) -> np.ndarray:
    parts = []
    for i, x in enumerate(xs):
        start = int(matrix[i, :rank].sum())
        parts.append(x[start:start + int(matrix[i, rank])])
    return np.concatenate(parts)


def op_all_to_all_v(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    m = _matrix(me.size, root)
    xs = [any_input(tag, i, int(m[i].sum()), dtype) for i in range(me.size)]
    mine = arrange(xs[me.rank], (xs[me.rank].size,), layout)
    before = mine.copy()
    want = _a2av_reference(xs, m, me.rank)
    sends, receives = list(m[me.rank]), list(m[:, me.rank])
    me.eq(tag, me.comm.all_to_all_v(mine, send_counts=sends, recv_counts=receives), want)
    out = np.empty(want.size, dtype=np_dtype(dtype))
    got = me.comm.all_to_all_v(mine, send_counts=sends, recv_counts=receives, out=out)
    me.same(tag + " out=", got, out)
    me.eq(tag + " out=", out, want)
    out2 = np.empty(want.size, dtype=np_dtype(dtype))
    me.same(tag + " recv positional", me.comm.all_to_all_v(mine, out2, send_counts=sends, recv_counts=receives), out2)
    me.eq(tag + " recv positional", out2, want)
    me.untouched(tag, mine, before)


def op_all_to_all_vc(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    m = _matrix(me.size, root + 1)
    xs = [any_input(tag, i, int(m[i].sum()), dtype) for i in range(me.size)]
    mine = arrange(xs[me.rank], (xs[me.rank].size,), layout)
    before = mine.copy()
    want = _a2av_reference(xs, m, me.rank)
    me.eq(tag, me.comm.all_to_all_vc(mine, send_count_matrix=m), want)
    me.eq(tag + " list", me.comm.all_to_all_vc(mine, send_count_matrix=m.tolist()), want)
    out = np.empty(want.size, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_to_all_vc(mine, send_count_matrix=m, out=out), out)
    me.eq(tag + " out=", out, want)
    me.untouched(tag, mine, before)


def op_send_recv(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    if me.size == 1:
        return
    n, r = me.size, me.rank
    xs = me.inputs(tag, shape, dtype, None, layout)
    before = xs[r].copy()
    target = np.empty(shape, dtype=np_dtype(dtype))
    if r % 2 == 0:  # even ranks send first, odd ranks receive first: blocking calls pair up
        me.comm.send(xs[r], (r + 1) % n)
        got = me.comm.recv(target, (r - 1) % n)
    else:
        got = me.comm.recv(target, (r - 1) % n)
        me.comm.send(xs[r], (r + 1) % n)
    me.same(tag, got, target)
    me.eq(tag, target, xs[(r - 1) % n])
    me.untouched(tag, xs[r], before)


def op_batch_send_recv(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    if me.size == 1:
        return
    n, r = me.size, me.rank
    xs = me.inputs(tag, shape, dtype, None, layout)
    small = [any_input(tag + "/small", j, 3, dtype) for j in range(n)]
    from_left = np.empty(shape, dtype=np_dtype(dtype))
    from_right = np.empty(3, dtype=np_dtype(dtype))
    before = xs[r].copy()
    got = me.comm.batch_send_recv([("send", xs[r], (r + 1) % n), ("recv", from_left, (r - 1) % n),
                                   ("send", small[r], (r - 1) % n), ("recv", from_right, (r + 1) % n)])
    me.check(tag + " returns", got is None, f"returned {type(got).__name__}")
    me.eq(tag, from_left, xs[(r - 1) % n])
    me.eq(tag + " small", from_right, small[(r + 1) % n])
    me.untouched(tag, xs[r], before)


def op_barrier(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    hcclpy.host.barrier(me.comm)
    me.comm.barrier()
    me.comm.device.default_stream.synchronize()


OPERATIONS: Dict[str, Callable[..., None]] = {
    name[3:]: fn for name, fn in sorted(globals().items()) if name.startswith("op_")}


def _every_operation(rank: int, size: int, info: bytes, layout: str, shape: Shape,
                     dtypes: Sequence[str]) -> List[str]:
    me = Rank(rank, size, info)
    try:
        for d, dtype in enumerate(dtypes):
            for o, (name, fn) in enumerate(OPERATIONS.items()):
                op = REDUCE_OPS[(d + o) % len(REDUCE_OPS)]
                root = (d + o) % size
                fn(me, f"{name}/{dtype}/{shape}/{layout}/{op}/root{root}", dtype, shape, layout, op, root)
        # Every reduce op, for every dtype, on all_reduce.
        for dtype in dtypes:
            for op in REDUCE_OPS:
                op_all_reduce(me, f"all_reduce/{dtype}/{op}", dtype, (5,), layout, op, 0)
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_operation_and_dtype(rank_matrix: ranks.RankMatrix, layout: str) -> None:
    shape = (2, 3, 2) if layout == "contiguous" else (2, 3)
    run(rank_matrix.size, _every_operation, layout, shape, DTYPES, mode=rank_matrix.mode)


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1), (1, 1, 4), (2, 2, 2, 2)], ids=str)
def test_shapes(shape: Shape) -> None:
    run(3, _every_operation, "contiguous", shape, ("int32", "float16"))


def test_every_operation_is_a_communicator_method_and_host_keeps_only_the_address_helpers() -> None:
    for name in OPERATIONS:
        assert hasattr(hcclpy.Communicator, name) or name == "send_recv", name
    # The operations on NumPy arrays are the Communicator methods (hcclpy.collectives): hcclpy.host
    # keeps the address-based staging of the torch backend, and release.
    assert sorted(hcclpy.host.__all__) == ["barrier", "release", "staged", "staged_batch", "staged_elementwise"]
    assert hcclpy.host.release is _staging.release
    for gone in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter",
                 "all_gather_v", "reduce_scatter_v", "all_to_all_v", "all_to_all_vc", "send", "recv",
                 "batch_send_recv", "carrier_type", "CHUNK_BYTES", "staging_mode", "_size_class", "_locked_staging",
                 "_unlock"):
        assert not hasattr(hcclpy.host, gone), gone


# ------------------------------------------------------------------------- in place, new outputs

def _in_place(rank: int, size: int, info: bytes) -> List[str]:
    """all_reduce, reduce and broadcast without an output write into the array passed and return it."""
    me = Rank(rank, size, info)
    try:
        comm, n = me.comm, size
        total = float(sum(range(1, n + 1)))
        x = np.full((2, 3), rank + 1.0)
        me.same("all_reduce", comm.all_reduce(x), x)
        me.eq("all_reduce", x, np.full((2, 3), total))
        me.same("all_reduce op=max", comm.all_reduce(x, op="max"), x)  # equal everywhere now
        me.eq("all_reduce op=max", x, np.full((2, 3), total))
        y = np.full(5, rank + 1, np.int32)
        got = comm.reduce(y, root=n - 1)
        if rank == n - 1:
            me.same("reduce on the root", got, y)
            me.eq("reduce on the root", y, np.full(5, int(total), np.int32))
        else:
            me.check("reduce on a non-root", got is None, f"returned {got!r}")
            me.eq("reduce leaves a non-root's array alone", y, np.full(5, rank + 1, np.int32))
        z = np.full(4, rank, np.uint16)
        me.same("broadcast", comm.broadcast(z, n - 1), z)
        me.eq("broadcast fills every rank's array", z, np.full(4, n - 1, np.uint16))
        # A view is written through to its base.
        base = np.zeros((3, 4), np.float32)
        row = base[1]
        row[:] = rank + 1
        me.same("all_reduce of a contiguous view", comm.all_reduce(row), row)
        me.eq("the base of the view", base, np.array([[0] * 4, [total] * 4, [0] * 4], np.float32))
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 3])
def test_in_place_without_an_output_returns_the_input(size: int) -> None:
    run(size, _in_place)


def _new_outputs(rank: int, size: int, info: bytes) -> List[str]:
    """The shapes of the new arrays of the operations that have no in-place form."""
    me = Rank(rank, size, info)

    def shape(name: str, got: Any, want: Shape, dtype: Any = np.float32) -> None:
        me.check(name, isinstance(got, np.ndarray) and got.shape == want and got.dtype == np.dtype(dtype) and
                 got.flags.c_contiguous and got.flags.writeable,
                 f"got {type(got).__name__} {getattr(got, 'shape', None)} {getattr(got, 'dtype', None)}, want "
                 f"{want} {np.dtype(dtype)}")

    try:
        comm, n = me.comm, size
        a = np.ones((2, 3), np.float32)
        shape("all_gather", comm.all_gather(a), (n, 2, 3))
        shape("all_gather 1-d", comm.all_gather(np.ones(4, np.float32)), (n, 4))
        shape("all_gather complex", comm.all_gather(np.ones((2,), np.complex64)), (n, 2), np.complex64)
        split = np.ones((2 * n, 3), np.float32)
        shape("reduce_scatter, first axis split", comm.reduce_scatter(split), (2, 3))
        shape("scatter, first axis split", comm.scatter(split, root=0), (2, 3))
        shape("all_to_all, the input's shape", comm.all_to_all(split), (2 * n, 3))
        shape("all_to_all 3-d", comm.all_to_all(np.ones((n, 2, 2), np.float32)), (n, 2, 2))
        if n > 1:  # a first axis that does not split: flat blocks
            flat = np.ones((n + 1, n), np.float32)  # (n + 1) * n elements, first axis not a multiple of n
            shape("reduce_scatter, flat", comm.reduce_scatter(flat), (n + 1,))
            shape("scatter, flat", comm.scatter(flat, root=0), (n + 1,))
        counts = list(range(1, n + 1))
        shape("all_gather_v", comm.all_gather_v(np.ones((rank + 1,), np.float32), recv_counts=counts),
              (sum(counts),))
        shape("all_gather_v of a 2-d block", comm.all_gather_v(np.ones((1, rank + 1), np.float32),
                                                               recv_counts=counts), (sum(counts),))
        shape("reduce_scatter_v", comm.reduce_scatter_v(np.ones((sum(counts),), np.float32), send_counts=counts),
              (rank + 1,))
        shape("all_to_all_v", comm.all_to_all_v(np.ones(n, np.float32), send_counts=[1] * n,
                                                recv_counts=[1] * n), (n,))
        shape("all_to_all_vc", comm.all_to_all_vc(np.ones((n, 1), np.float32), send_count_matrix=[[1] * n] * n),
              (n,))
        # With receive displacements, a new output is zeros between the blocks.
        got = comm.all_to_all_v(np.full(n, rank + 1.0, np.float32), send_counts=[1] * n, recv_counts=[1] * n,
                                recv_displs=[3 * j + 1 for j in range(n)])
        want = np.zeros(3 * n - 1, np.float32)
        want[1::3] = np.arange(1, n + 1)
        me.eq("all_to_all_v, gaps read 0", got, want)
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 2, 3])
def test_new_outputs_have_the_documented_shapes(size: int) -> None:
    run(size, _new_outputs)


def _persistent(rank: int, size: int, info: bytes) -> List[str]:
    """A persistent operation on NumPy arrays stages them at every start."""
    me = Rank(rank, size, info)
    try:
        x = np.full(3, 2.0)
        with me.comm.all_reduce_init(x) as step:
            me.same("start", step.start(), x)
            me.eq("first start", x, np.full(3, 2.0 * size))
            step.start()
            me.eq("second start: in place, again", x, np.full(3, 2.0 * size * size))
        out = np.empty((size, 2), np.int16)
        with me.comm.all_gather_init(np.full(2, rank, np.int16), out=out) as gather:
            me.same("all_gather start", gather.start(), out)
            me.eq("all_gather start", out, np.repeat(np.arange(size, dtype=np.int16), 2).reshape(size, 2))
    finally:
        me.close()
    return me.problems


def test_persistent_operations_on_numpy_arrays() -> None:
    run(2, _persistent)


# ---------------------------------------------------------------------- whole-array staging

class _CountingApi:
    """Stands for a communicator's C library and counts the calls of each function."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: Dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.real, name)
        if not name.startswith("Hccl"):
            return fn

        def counted(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)
        return counted


def _whole(rank: int, size: int, info: bytes, count: int, dtypes: Sequence[str]) -> List[str]:
    """Large arrays are staged whole: one C call each, on scratch that holds the whole array."""
    me = Rank(rank, size, info)
    try:
        for d, dtype in enumerate(dtypes):
            op = REDUCE_OPS[d % len(REDUCE_OPS)]
            tag = f"whole/{dtype}/{op}"
            shape = (count // 2, 2) if count % 2 == 0 else (count,)
            counting = _CountingApi(me.comm._api)
            me.comm._api = counting
            try:
                op_all_reduce(me, tag, dtype, shape, "contiguous", op, 0)
                op_all_reduce(me, tag + "/strided", dtype, shape, "strided", op, 0)
                op_broadcast(me, tag + "/bcast", dtype, shape, "fortran", op, size - 1)
                op_reduce(me, tag + "/reduce", dtype, shape, "contiguous", op, (d + 1) % size)
            finally:
                me.comm._api = counting.real
            # all_reduce: out=, recv, in place, out=send, twice (and the strided refusal reaches no C);
            # broadcast: twice; reduce: twice.
            me.check(f"{tag} C calls", counting.calls == {"HcclAllReduce": 8, "HcclBroadcast": 2, "HcclReduce": 2},
                     f"{counting.calls}: not one C call per operation")
            nbytes = count * np_dtype(dtype).itemsize
            scratch = me.comm._host_state._buffers
            me.check(f"{tag} scratch", sorted(scratch) == ["buffer0", "buffer1"] and
                     all(buf.nbytes >= nbytes for buf in scratch.values()),
                     f"scratch {({k: v.nbytes for k, v in scratch.items()})} for arrays of {nbytes} bytes")
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [2, 3])
def test_large_arrays_are_staged_whole(size: int) -> None:
    # 3 MiB of float32 and more: what the chunked staging used to cut in pieces, odd counts too.
    run(size, _whole, (3 << 18) + 5, ("float32", "float64", "int8", "bfloat16" if ranks.HAVE_BF16 else "float16"))


def test_large_arrays_are_staged_whole_in_processes() -> None:
    run(2, _whole, (1 << 20) + 10, ("float32", "int16"), mode="processes", timeout=120)


def _overlapping_out(rank: int, size: int, info: bytes) -> List[str]:
    """An out= that shares memory with the input without being it is refused (as on device): the
    operation would read what it has written."""
    me = Rank(rank, size, info)
    try:
        n = 1000
        for shift in (-3, -1, 1, 700):
            memory = np.arange(n + abs(shift), dtype=np.float32)
            start = max(-shift, 0)
            x, out = memory[start:start + n], memory[start + shift:start + shift + n]
            before = memory.copy()
            me.refused(f"all_reduce, out shifted by {shift}", lambda: me.comm.all_reduce(x, out=out), ValueError,
                       r"^send and recv overlap without being the same buffer$")
            me.untouched(f"all_reduce, out shifted by {shift}", memory, before)
        # The same memory through another view object is in place.
        memory = np.arange(n, dtype=np.float32)
        me.same("all_reduce, out= a view of the input", me.comm.all_reduce(memory, out=memory[:]).base, memory)
        me.eq("all_reduce, out= a view of the input", memory, np.arange(n, dtype=np.float32) * size)
        if size == 1:  # reduce's out is the root's alone (a refusal there alone would leave the others waiting)
            memory = np.arange(n + 1, dtype=np.float32)
            me.refused("reduce, out shifted by 1", lambda: me.comm.reduce(memory[:n], out=memory[1:], root=0),
                       ValueError, r"^send and recv overlap without being the same buffer$")
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 2])
def test_an_out_that_overlaps_the_input_is_refused(size: int) -> None:
    run(size, _overlapping_out)


# ------------------------------------------------------------------------- steady state

def _steady_state(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        r, n = rank, size
        big = np.arange(4096, dtype=np.float32) + r
        work = np.empty_like(big)
        calls: List[Tuple[str, Callable[[], Any]]] = [
            ("all_reduce", lambda: me.comm.all_reduce(big, out=work)),
            ("all_reduce in place", lambda: me.comm.all_reduce(work)),
            ("broadcast", lambda: me.comm.broadcast(work, 0)),
            ("reduce", lambda: me.comm.reduce(big, out=work, root=n - 1)),
            ("all_gather", lambda: me.comm.all_gather(big[:100])),
            ("reduce_scatter", lambda: me.comm.reduce_scatter(big[:8 * n])),
            ("all_to_all", lambda: me.comm.all_to_all(big[:4 * n])),
            ("scatter", lambda: me.comm.scatter(big[:2 * n], root=0)),
            ("all_gather_v", lambda: me.comm.all_gather_v(big[:r + 1], recv_counts=list(range(1, n + 1)))),
            ("batch_send_recv", lambda: me.comm.batch_send_recv(
                [("send", big[:10], (r + 1) % n), ("recv", np.empty(10, np.float32), (r - 1) % n)])),
            ("barrier", lambda: hcclpy.host.barrier(me.comm)),
        ]
        device = me.comm.device
        for name, call in calls:
            call()  # the first call may allocate
            state = me.comm._host_state
            before = dict(state._buffers)
            stream = state.stream
            free = device.memory_info()[0]
            for _ in range(3):
                call()
            after = me.comm._host_state
            me.check(name, after is state and after.stream is stream, "the staging or its stream was replaced")
            me.check(name, set(after._buffers) == set(before) and
                     all(after._buffers[k] is v for k, v in before.items()),
                     f"new device scratch: {sorted(before)} -> {sorted(after._buffers)}")
            me.check(name, device.memory_info()[0] == free,
                     f"free device memory went from {free} to {device.memory_info()[0]}")
        # A smaller call after the larger ones reuses what is there.
        before = dict(me.comm._host_state._buffers)
        me.comm.all_reduce(big[:3], out=work[:3])
        me.check("smaller", all(me.comm._host_state._buffers[k] is v for k, v in before.items()),
                 "a smaller call allocated")
    finally:
        me.close()
    return me.problems


def test_steady_state_allocates_no_device_scratch() -> None:
    run(2, _steady_state)


def _destroy_frees_staging(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    me.comm.all_reduce(np.ones(10), out=np.empty(10))
    state = me.comm._host_state
    scratch = list(state._buffers.values())
    problems = me.close()
    if len(scratch) != 2:
        problems.append(f"expected two scratch buffers before destroy, found {len(scratch)}")
    if me.comm._host_state is not None or state._buffers or not state.stream.closed or not state.closed:
        problems.append("destroy left the staging buffers or stream alive")
    if not all(buf.closed for buf in scratch):
        problems.append("destroy left device scratch allocated")
    return problems


def test_destroy_releases_the_staging() -> None:
    run(2, _destroy_frees_staging)


def _release_and_go_on(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        device = me.comm.device
        free_before = device.memory_info()[0]
        big = np.ones(4 << 20, dtype=np.float32)  # 16 MiB staged whole by all_gather: 16 + 32 MiB of scratch
        me.comm.all_gather(big)
        state = me.comm._host_state
        grown = free_before - device.memory_info()[0]
        me.check("grown", grown >= 48 << 20, f"{grown} bytes of scratch for 48 MiB")
        assert hcclpy.host.release(me.comm) is True
        me.check("release", me.comm._host_state is None and not state._buffers and state.stream.closed,
                 "the staging buffers or stream are still there")
        given_back = device.memory_info()[0] - (free_before - grown)
        me.check("memory given back", given_back >= 48 << 20, f"{grown} bytes grown, {given_back} given back")
        me.eq("all_reduce after release", me.comm.all_reduce(np.ones(3, np.float32)),
              np.full(3, size, np.float32))
        me.check("a new staging", me.comm._host_state is not None and me.comm._host_state is not state,
                 "the next call made no staging")
        me.check("release twice", hcclpy.host.release(me.comm) is True and hcclpy.host.release(me.comm) is True,
                 "nothing to give back the second time")
    finally:
        me.close()
    return me.problems


def test_release_gives_the_staging_back_and_calls_go_on() -> None:
    run(2, _release_and_go_on)


def _uneven_results_in_place(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        comm, n = me.comm, size
        comm.all_gather(np.full(64, 7777.0))  # leaves values in the staging scratch
        counts, displs = [2] * n, [4 * r for r in range(n)]  # a gap of two elements after each block
        blocks_ = np.full(4 * n - 2, -1.0)
        for r in range(n):
            blocks_[4 * r: 4 * r + 2] = r
        gapped = np.where(blocks_ == -1.0, 0.0, blocks_)
        out = np.full(4 * n - 2, -1.0)
        me.same("all_gather_v into out=", comm.all_gather_v(np.full(2, float(rank)), recv_counts=counts,
                                                            recv_displs=displs, out=out), out)
        me.eq("all_gather_v gaps keep out's values", out, blocks_)
        me.eq("all_gather_v new result, gaps are zeros",
              comm.all_gather_v(np.full(2, float(rank)), recv_counts=counts, recv_displs=displs), gapped)
        me.eq("all_to_all_v new result, gaps are zeros",
              comm.all_to_all_v(np.full(2 * n, float(rank)), send_counts=counts, recv_counts=counts,
                                recv_displs=displs), gapped)
        out = np.full(4 * n - 2, -1.0)
        me.same("all_to_all_v into out= with gaps", comm.all_to_all_v(np.full(2 * n, float(rank)), out,
                                                                      send_counts=counts, recv_counts=counts,
                                                                      recv_displs=displs), out)
        me.eq("all_to_all_v gaps keep out's values", out, blocks_)
        packed = np.empty(2 * n)
        me.same("all_to_all_v out=", comm.all_to_all_v(np.full(2 * n, float(rank)), send_counts=counts,
                                                       recv_counts=counts, out=packed), packed)
        me.eq("all_to_all_v out= values", packed, np.repeat(np.arange(n, dtype=np.float64), 2))
        mine = np.empty(2)
        me.same("reduce_scatter_v out=", comm.reduce_scatter_v(np.ones(2 * n), send_counts=counts, out=mine), mine)
        me.eq("reduce_scatter_v out= values", mine, np.full(2, float(n)))
        matrix = [[1] * n for _ in range(n)]
        received = np.empty(n)
        me.same("all_to_all_vc out=", comm.all_to_all_vc(np.full(n, float(rank)), send_count_matrix=matrix,
                                                         out=received), received)
        me.eq("all_to_all_vc out= values", received, np.arange(n, dtype=np.float64))
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 3])
def test_uneven_operations_write_only_their_blocks_and_take_out(size: int) -> None:
    run(size, _uneven_results_in_place)


@pytest.mark.parametrize("operation", ["reduce_scatter_v", "all_gather_v", "all_to_all_v", "all_to_all_vc"])
def test_an_output_larger_than_its_blocks_keeps_the_rest_as_on_device(one_rank: Any, operation: str) -> None:
    calls = {"reduce_scatter_v": lambda send, recv: one_rank.reduce_scatter_v(send, recv, send_counts=[2]),
             "all_gather_v": lambda send, recv: one_rank.all_gather_v(send, recv, recv_counts=[2]),
             "all_to_all_v": lambda send, recv: one_rank.all_to_all_v(send, recv, send_counts=[2], recv_counts=[2]),
             "all_to_all_vc": lambda send, recv: one_rank.all_to_all_vc(send, recv, send_count_matrix=[[2]])}
    one_rank.all_gather(np.full(64, 7777.0))  # leaves values in the staging scratch
    device = hcclpy.from_numpy(np.full(4, -1.0), device=one_rank.device)
    try:
        calls[operation](hcclpy.from_numpy(np.ones(2), device=one_rank.device), device)
        assert device.to_numpy().tolist() == [1.0, 1.0, -1.0, -1.0]  # the device path writes the block alone
    finally:
        device.close()
    out = np.full(4, -1.0)
    assert calls[operation](np.ones(2), out) is out
    assert out.tolist() == [1.0, 1.0, -1.0, -1.0]


def _barrier_orders(rank: int, size: int, info: bytes, folder: str) -> List[str]:
    me = Rank(rank, size, info)
    try:
        if rank:  # late on purpose: a barrier that did not block would let rank 0 look too early
            time.sleep(0.3)
            with open(os.path.join(folder, str(rank)), "w"):
                pass
        me.comm.barrier()
        seen = sorted(os.listdir(folder))
        me.check("barrier()", len(seen) == size - 1, f"rank {rank} passed it having seen only {seen}")
        with hcclpy.group():
            me.refused("barrier() in a group", me.comm.barrier, RuntimeError, "inside hcclpy.group.*pass stream=")
            me.comm.barrier(stream=me.comm.device.default_stream)
        me.comm.device.default_stream.synchronize()
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [2, 3])
def test_barrier_without_a_stream_blocks(tmp_path: Any, size: int) -> None:
    run(size, _barrier_orders, str(tmp_path))


_TIGHT_DEVICE = """
import warnings; warnings.simplefilter("ignore")
import numpy as np, hcclpy
comm = hcclpy.init(rank=0, world_size=1)
big = np.ones(47 << 17)  # 47 MiB of float64: staged in and out, 94 MiB of scratch on a 97 MiB device
assert comm.all_gather(big).sum() == big.size
print(sorted(comm._host_state._buffers))
# A larger in-place call needs one buffer of 60 MiB, which no longer fits next to the all_gather's
# receive scratch: that idle slot is given back for it.
bigger = np.full(60 << 17, 2.0)
assert comm.broadcast(bigger, 0) is bigger and (bigger == 2).all()
print(sorted(comm._host_state._buffers))
hcclpy.shutdown()
"""


def test_scratch_fits_a_nearly_full_device_and_gives_back_idle_slots() -> None:
    import subprocess
    import sys

    env = {**os.environ, "HCCLPY_BACKEND": "sim", "HCCLPY_SIM_DEVICE_MEMORY": "97M"}
    done = subprocess.run([sys.executable, "-c", _TIGHT_DEVICE], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["['buffer0', 'buffer1']", "['buffer0']"], done.stdout


@given(st.integers(1, 1 << 40))
@settings(deadline=None, database=None)
def test_scratch_sizes_waste_at_most_an_eighth(nbytes: int) -> None:
    size = _staging._size_class(nbytes)
    assert nbytes <= size <= max(nbytes * 9 // 8, 8)
    assert _staging._size_class(size) == size  # a size class holds itself: no growth on the next call


@pytest.mark.timeout(60)
def test_a_call_that_waited_while_release_closed_the_staging_takes_a_new_one() -> None:
    """A call that found the staging just before release() closed it (while the call waited for its
    lock) must not run on the closed one."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.all_reduce(np.ones(3))
        stale = _staging.acquire(comm)  # as a NumPy call on this thread holds it
        assert stale is comm._host_state
        results: List[Any] = []
        waiter = threading.Thread(target=lambda: results.append(comm.all_reduce(np.arange(3.0))), daemon=True)
        waiter.start()
        time.sleep(0.1)  # (only so that the waiter is likely to wait for the stale staging's lock)
        # Held by this thread: release() cannot close it now, the holder does when it gives it back.
        assert hcclpy.host.release(comm) is False and not stale.closed
        _staging.give_back(stale)
        waiter.join(30)
        assert not waiter.is_alive() and results[0].tolist() == [0.0, 1.0, 2.0]
        assert stale.closed and comm._host_state is not stale and not comm._host_state.closed
    finally:
        comm.destroy()


_SIGNAL_TEARDOWN = """
import faulthandler, os, signal, sys, threading
faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where it is, then fails
import numpy as np, hcclpy, hcclpy.host
from hcclpy import collectives

how = sys.argv[1]
if how == "inside-a-call":
    # The handler runs at a known point: inside a staged call (hcclpy.host's, as the torch
    # backend's), which holds the staging's lock, before the call queues its operation.
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    staging_held = []

    def handler(signum, frame):
        lock = comm._host_state.lock
        staging_held.append(lock._is_owned() if hasattr(lock, "_is_owned") else lock.locked())
        comm.destroy(timeout=1)

    signal.signal(signal.SIGTERM, handler)
    data = np.ones(1 << 20, np.float32)
    address = data.__array_interface__["data"][0]

    def run(buffer, _, stream):
        if not staging_held:
            signal.raise_signal(signal.SIGTERM)
        collectives.all_reduce(comm, buffer, None, stream=stream)

    comm.all_reduce(np.ones(4, np.float32))  # makes the staging
    staging = comm._host_state
    try:
        hcclpy.host.staged_elementwise(comm, address, address, data.size, hcclpy.DataType.FP32, run)
    except ValueError as exc:  # the operation found the communicator destroyed
        print("call:", exc)
    print("held:", staging_held, "destroyed:", comm.destroyed, "closed:", staging.closed,
          "unlocked:", staging.lock.acquire(timeout=5), "detached:", comm._host_state is None)
else:
    # The reproducer: a loop of NumPy calls, a SIGTERM at any point of it, and a handler that tears
    # the world communicator down.
    comm = hcclpy.init(rank=0, world_size=1, device=0)

    def handler(signum, frame):
        hcclpy.shutdown() if how.startswith("shutdown") else comm.destroy(timeout=1)
        print("destroyed:", comm.destroyed, flush=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    data = np.ones(1 << 20, np.float32)
    while True:
        comm.all_reduce(data)
"""


@pytest.mark.parametrize("how", ["inside-a-call", "destroy-in-a-loop", "shutdown-in-a-loop"])
@pytest.mark.timeout(120)
def test_a_signal_handler_that_destroys_the_communicator_does_not_deadlock(how: str) -> None:
    """A handler interrupts a NumPy call holding the staging's lock on the same thread: destroy()
    must not wait for that lock, and the call closes the staging when it ends."""
    import subprocess
    import sys

    env = {**os.environ, "HCCLPY_BACKEND": "sim"}
    done = subprocess.run([sys.executable, "-c", _SIGNAL_TEARDOWN, how], capture_output=True,
                          text=True, env=env, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    if how == "inside-a-call":
        assert done.stdout.splitlines() == [
            f"call: communicator '{done.stdout.split(chr(39))[1]}' was destroyed",
            "held: [True] destroyed: True closed: True unlocked: True detached: True"], done.stdout
    else:
        assert done.stdout.strip() == "destroyed: True", done.stdout + done.stderr[-3000:]


class _InterruptedLock:
    """A staging lock whose acquire() is interrupted (as by Ctrl+C) right after it took the lock."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        self.lock.acquire(*args, **kwargs)
        raise KeyboardInterrupt

    def release(self) -> None:
        self.lock.release()

    def _is_owned(self) -> bool:
        return self.lock._is_owned()


@pytest.mark.timeout(60)
def test_an_interrupt_right_after_the_staging_lock_is_taken_does_not_leak_it() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.all_reduce(np.ones(3))
        staging = comm._host_state
        real, staging.lock = staging.lock, _InterruptedLock(staging.lock)
        with pytest.raises(KeyboardInterrupt):
            comm.all_reduce(np.ones(3))
        staging.lock = real
        assert not real._is_owned()
        taken: List[bool] = []  # another thread can take it: nobody holds it
        other = threading.Thread(target=lambda: taken.append(real.acquire(timeout=10) and (real.release() or True)))
        other.start()
        other.join(30)
        assert taken == [True]
        assert comm.all_reduce(np.arange(3.0)).tolist() == [0.0, 1.0, 2.0]
        assert comm._host_state is staging  # the staging stayed usable
    finally:
        comm.destroy(timeout=10)


class _InterruptedStream:
    """A staging stream whose wait is interrupted (as by Ctrl+C) once, after the work was queued."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.interrupted = stream, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _synchronize(self, timeout: Any) -> Any:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return self.stream._synchronize(timeout)


@pytest.mark.timeout(60)
def test_a_call_interrupted_in_its_wait_leaves_the_staging_usable() -> None:
    """Ctrl-C in the wait for the staged operation: the work stays queued, the staging is marked
    unsettled and given back, and the next call waits for that work before it reuses the scratch."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.all_reduce(np.ones(3))
        staging = comm._host_state
        real = staging.stream
        staging.stream = _InterruptedStream(real)
        x = np.arange(5.0)
        with pytest.raises(KeyboardInterrupt):
            comm.all_reduce(x, out=np.empty(5))
        staging.stream = real
        assert staging.unsettled and not staging.lock._is_owned()
        assert comm.all_reduce(np.full(4, 3.0)).tolist() == [3.0] * 4
        assert not staging.unsettled and comm._host_state is staging and not staging.closed
    finally:
        comm.destroy(timeout=10)


@pytest.mark.timeout(60)
def test_a_numpy_call_from_a_handler_inside_another_is_refused() -> None:
    """A signal handler's NumPy call on the communicator the interrupted call is using would share
    its scratch: it is refused."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.all_reduce(np.ones(3))
        with comm._host_state.lock:  # as the interrupted call holds it
            with pytest.raises(RuntimeError, match="cannot run while this thread is inside another one"):
                comm.all_reduce(np.ones(3))
        assert comm.all_reduce(np.ones(3)).tolist() == [1.0, 1.0, 1.0]
    finally:
        comm.destroy(timeout=10)


def test_a_communicator_being_destroyed_takes_no_new_numpy_call() -> None:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm._closing = True  # destroy() has begun
        with pytest.raises(ValueError, match=rf"^communicator '{comm.name}' was destroyed$"):
            comm.all_reduce(np.ones(3))
        assert comm._host_state is None  # no staging made for it
    finally:
        comm._closing = False
        comm.destroy(timeout=10)


def test_release_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"^comm must be an hcclpy.Communicator, got str$"):
        hcclpy.host.release("x")  # type: ignore[arg-type]
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        for bad, error in ((-1, ValueError), (float("nan"), ValueError), (math.inf, ValueError), ("1", TypeError),
                           (True, TypeError)):
            with pytest.raises(error, match=r"must be None \(no limit\) or a finite number of seconds >= 0"):
                hcclpy.host.release(comm, timeout=bad)
        assert hcclpy.host.release(comm, timeout=0) is True
    finally:
        comm.destroy()


@pytest.fixture
def one_rank() -> Any:
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    yield comm
    comm.destroy()


@pytest.mark.parametrize("call, pattern", [
    (lambda c, a: c.all_gather_v(a, recv_counts=[3]), r"^recv_counts\[0\] = 3 must equal this rank's send count 4$"),
    (lambda c, a: c.reduce_scatter_v(a, send_counts=[5]), r"^send holds 4 elements but send_counts address 5$"),
    (lambda c, a: c.reduce_scatter_v(a, send_counts=[3], send_displs=[2]),
     r"^send holds 4 elements but send_counts and send_displs address 5$"),
    (lambda c, a: c.reduce_scatter_v(a, np.empty(1, np.complex64), send_counts=[2]),
     r"^recv holds 1 elements but send_counts\[0\] = 2$"),
    (lambda c, a: c.all_to_all_v(a, send_counts=[5], recv_counts=[4]),
     r"^send holds 4 elements but send_counts address 5$"),
    (lambda c, a: c.all_to_all_v(a, np.empty(3, np.complex64), send_counts=[4], recv_counts=[4]),
     r"^recv holds 3 elements but recv_counts address 4$"),
    (lambda c, a: c.all_to_all_vc(a, send_count_matrix=[[5]]),
     r"^send holds 4 elements but row 0 of send_count_matrix sends 5$"),
], ids=["all_gather_v", "reduce_scatter_v", "reduce_scatter_v-displs", "reduce_scatter_v-recv", "all_to_all_v",
        "all_to_all_v-recv", "all_to_all_vc"])
def test_uneven_counts_of_complex_arrays_are_checked_in_their_elements(one_rank: Any, call: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        call(one_rank, np.arange(4, dtype=np.complex64))
    assert one_rank._host_state is None  # refused before any staging


def test_uneven_counts_of_complex_arrays_move_elements(one_rank: Any) -> None:
    x = np.arange(4, dtype=np.complex64) * (1 + 1j)
    assert one_rank.all_gather_v(x, recv_counts=[4]).tolist() == x.tolist()
    assert one_rank.all_to_all_v(x, send_counts=[3], recv_counts=[3], send_displs=[1]).tolist() == x[1:].tolist()
    assert one_rank.reduce_scatter_v(x, send_counts=[2], send_displs=[2]).tolist() == x[2:].tolist()
    assert one_rank.all_to_all_vc(x, send_count_matrix=[[2]]).tolist() == x[:2].tolist()


@pytest.mark.parametrize("counts, displs, nbytes", [
    ([1], [2**34], (2**34 + 1) * 8),
    ([2**34], None, 2**34 * 8)])
def test_uneven_results_too_large_for_the_device_are_refused(one_rank: Any, counts: List[int],
                                                             displs: Optional[List[int]], nbytes: int) -> None:
    with pytest.raises(ValueError, match=rf"^all_to_all_v's recv would hold {nbytes} bytes, more than device 0 "
                                         r"holds: check the counts$"):
        one_rank.all_to_all_v(np.ones(1), send_counts=[1], recv_counts=counts, recv_displs=displs)
    with pytest.raises(ValueError, match=rf"^all_gather_v's recv would hold {nbytes} bytes, more than device 0 "):
        one_rank.all_gather_v(np.ones(1), recv_counts=[1], recv_displs=[nbytes // 8 - 1])
    assert one_rank._host_state is None


@pytest.mark.parametrize("counts, displs, pattern", [
    ([1], [2**63], r"^recv_displs holds a value above HCCL's largest supported count"),
    ([2**40], None, r"^recv_counts holds a value above HCCL's largest supported count")])
def test_uneven_counts_above_hccls_largest_are_refused(one_rank: Any, counts: List[int],
                                                       displs: Optional[List[int]], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        one_rank.all_to_all_v(np.ones(1), send_counts=[1], recv_counts=counts, recv_displs=displs)


@pytest.mark.parametrize("bad", ["a", 5, [-8], [[1]], None])
@pytest.mark.parametrize("function, argument", [("all_gather_v", "recv_counts"), ("reduce_scatter_v", "send_counts")])
def test_counts_are_checked(one_rank: Any, bad: Any, function: str, argument: str) -> None:
    if bad is None:
        with pytest.raises(TypeError, match=rf"^{function} needs {argument}$"):
            getattr(one_rank, function)(np.ones(1), **{argument: bad})
    else:
        with pytest.raises(ValueError, match=rf"^{argument} must "):
            getattr(one_rank, function)(np.ones(1), **{argument: bad})


@pytest.mark.parametrize("call", [
    lambda c: c.all_gather_v(np.ones(2), [2]),
    lambda c: c.reduce_scatter_v(np.ones(2), [2]),
    lambda c: c.all_to_all_v(np.ones(2), [2], [2]),
    lambda c: c.all_to_all_vc(np.ones(2), [[2]]),
], ids=["all_gather_v", "reduce_scatter_v", "all_to_all_v", "all_to_all_vc"])
def test_counts_go_by_name(one_rank: Any, call: Any) -> None:
    # The second positional argument is recv, as on device buffers.
    with pytest.raises(TypeError, match=r"^recv must be a buffer \(.*numpy\.ndarray.*\), got list; .*the counts of "
                                        r"the uneven operations go by name"):
        call(one_rank)


def test_staged_checks_counts_and_dtype(one_rank: Any) -> None:
    a, b = np.ones(4, np.float32), np.zeros(4, np.float32)

    def run(send: Any, recv: Any, stream: Any) -> None:
        hcclpy.collectives.all_gather(one_rank, send, recv, stream=stream)

    with pytest.raises(ValueError, match=r"^send_count=-4 must be an int >= 0"):
        hcclpy.host.staged(one_rank, None, -4, None, -4, hcclpy.DataType.FP32, run)
    with pytest.raises(ValueError, match=r"^count=-1 must be an int >= 0"):
        hcclpy.host.staged_elementwise(one_rank, None, None, -1, hcclpy.DataType.FP32, run)
    with pytest.raises(ValueError, match=r"^items\[0\] count=-1 must be an int >= 0"):
        hcclpy.host.staged_batch(one_rank, [("send", a.ctypes.data, -1, hcclpy.DataType.FP32, 0)])
    hcclpy.host.staged(one_rank, a.ctypes.data, 4, b.ctypes.data, 4, "float32", run)  # a dtype name will do
    assert b.tolist() == [1.0] * 4


def test_how_each_dtype_travels() -> None:
    """HCCL's types travel as themselves, complex numbers as pairs of their parts (which reduce with
    sum only), other dtypes of fixed size as bytes (which only move); the rest is refused."""
    sum_only = frozenset({hcclpy.ReduceOp.SUM.value})
    cases: List[Tuple[str, Any, int, Any]] = [
        ("float32", hcclpy.DataType.FP32, 1, None), ("int8", hcclpy.DataType.INT8, 1, None),
        ("uint64", hcclpy.DataType.UINT64, 1, None), ("complex64", hcclpy.DataType.FP32, 2, sum_only),
        ("complex128", hcclpy.DataType.FP64, 2, sum_only), (">c16", hcclpy.DataType.FP64, 2, sum_only),
        ("bool", hcclpy.DataType.UINT8, 1, frozenset()), ("i4,U3", hcclpy.DataType.UINT8, 16, frozenset()),
        ("M8[s]", hcclpy.DataType.UINT8, 8, frozenset()), ("V7", hcclpy.DataType.UINT8, 7, frozenset()),
    ]
    if ranks.HAVE_BF16:
        cases.append(("bfloat16", hcclpy.DataType.BFP16, 1, None))
    for dtype, carrier, scale, ops in cases:
        buf = _buffers.parse(np.zeros(3, np_dtype(dtype) if dtype == "bfloat16" else np.dtype(dtype)), "send")
        assert (buf.dtype, buf.scale, buf.ops, buf.count, buf.host) == (carrier, scale, ops, 3 * scale, True), dtype
    for dtype, pattern in (("O", r"^send\.dtype is object, which holds Python objects"),
                           ("V0", r"^send\.dtype is \|V0, whose elements have no bytes")):
        with pytest.raises(TypeError, match=pattern):
            _buffers.parse(np.zeros(3, dtype), "send")


# ------------------------------------------------------------------------------ hypothesis

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROPERTY_OPERATIONS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter",
                       "send_recv", "batch_send_recv")


def _one(rank: int, size: int, info: bytes, name: str, dtype: str, shape: Shape, layout: str, op: str,
         root: int) -> List[str]:
    me = Rank(rank, size, info)
    try:
        OPERATIONS[name](me, f"property/{name}", dtype, shape, layout, op, root)
    finally:
        me.close()
    return me.problems


# No zero-sized dimensions: a rank with nothing to send is its own test below.
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@SETTINGS
@given(size=st.sampled_from(SIZES), name=st.sampled_from(PROPERTY_OPERATIONS), dtype=st.sampled_from(DTYPES),
       shape=shapes, layout=st.sampled_from(LAYOUTS), op=st.sampled_from(REDUCE_OPS), root=st.integers(0, 3))
def test_property_operations(size: int, name: str, dtype: str, shape: Shape, layout: str, op: str,
                             root: int) -> None:
    run(size, _one, name, dtype, shape, layout, op, root % size, timeout=60)


def _uneven(rank: int, size: int, info: bytes, kind: str, matrix: List[List[int]], dtype: str, op: str,
            layout: str) -> List[str]:
    me = Rank(rank, size, info)
    m = np.array(matrix, dtype=np.int64)
    tag = f"uneven/{kind}"
    try:
        if kind in ("all_to_all_v", "all_to_all_vc"):
            xs = [make_input(tag, i, int(m[i].sum()), dtype) for i in range(size)]
            mine = arrange(xs[rank], (xs[rank].size,), layout)
            want = _a2av_reference(xs, m, rank)
            got = (me.comm.all_to_all_vc(mine, send_count_matrix=m) if kind == "all_to_all_vc"
                   else me.comm.all_to_all_v(mine, send_counts=list(m[rank]), recv_counts=list(m[:, rank])))
            me.eq(tag, got, want)
        elif kind == "all_gather_v":
            counts = [int(c) for c in m[0]]
            xs = [make_input(tag, j, counts[j], dtype) for j in range(size)]
            me.eq(tag, me.comm.all_gather_v(arrange(xs[rank], (counts[rank],), layout), recv_counts=counts),
                  np.concatenate(xs))
        else:
            counts = [int(c) for c in m[0]]
            xs = [make_input(tag, j, sum(counts), dtype, op) for j in range(size)]
            start = sum(counts[:rank])
            want = reduce_reference(xs, op, dtype)[start:start + counts[rank]]
            me.eq(tag, me.comm.reduce_scatter_v(arrange(xs[rank], (sum(counts),), layout), send_counts=counts,
                                                op=op), want)
    finally:
        me.close()
    return me.problems


@st.composite
def uneven_cases(draw: Any) -> Tuple[int, str, List[List[int]]]:
    size = draw(st.sampled_from(SIZES))
    kind = draw(st.sampled_from(["all_to_all_v", "all_to_all_vc", "all_gather_v", "reduce_scatter_v"]))
    # Zero entries allowed, but every rank sends and receives something (see the zero-count test).
    matrix = draw(st.lists(st.lists(st.integers(0, 4), min_size=size, max_size=size), min_size=size, max_size=size)
                  .filter(lambda m: all(sum(row) for row in m) and all(sum(col) for col in zip(*m))))
    if kind in ("all_gather_v", "reduce_scatter_v"):
        matrix = [[c + 1 for c in matrix[0]]] * size
    return size, kind, matrix


@SETTINGS
@given(case=uneven_cases(), dtype=st.sampled_from(DTYPES), op=st.sampled_from(REDUCE_OPS),
       layout=st.sampled_from(["contiguous", "strided"]))
def test_property_uneven(case: Tuple[int, str, List[List[int]]], dtype: str, op: str, layout: str) -> None:
    size, kind, matrix = case
    run(size, _uneven, kind, matrix, dtype, op, layout, timeout=60)


# ---------------------------------------------------------------------------------- errors

class _CallRecorder:
    """Stands for a communicator's C library and writes down every function called."""

    def __init__(self, real: Any) -> None:
        self.real, self.called = real, []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.real, name)
        if not callable(value):
            return value

        def recorded(*args: Any) -> Any:
            self.called.append(name)
            return value(*args)
        return recorded


def _refused_before_c(me: Rank, cases: Sequence[Tuple[str, Callable[[], Any], type, str]]) -> None:
    """Each case ``(name, call, exception type, message pattern)`` must raise before any C call and
    before the staging is set up."""
    recorder = _CallRecorder(me.comm._api)
    staging = me.comm._host_state
    try:
        me.comm._api = recorder
        for name, call, kind, pattern in cases:
            me.refused(name, call, kind, pattern)
            me.check(name, not recorder.called, f"the refused call reached C: {recorder.called}")
            me.check(name, me.comm._host_state is staging, "the refused call set up the staging")
            recorder.called.clear()
    finally:
        me.comm._api = recorder.real


BUFFER_KINDS = r"\(hcclpy\.DeviceArray, numpy\.ndarray, \(ptr, count, dtype\) tuple, NPU tensor or DLPack object\)"


def _errors(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    comm = me.comm
    x = np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3)
    readonly = np.zeros_like(x)
    readonly.flags.writeable = False
    strided_out = np.zeros((2 * size, 6), dtype=np.float32)[:, ::2]
    device = hcclpy.empty(x.size, "float32", device=comm.device)
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("read-only out", lambda: comm.all_reduce(x, out=readonly), ValueError,
         r"^recv is read-only, but all_reduce " + NOT_WRITABLE),
        ("read-only in place", lambda: comm.all_reduce(readonly), ValueError,
         r"^send is read-only, but all_reduce " + NOT_WRITABLE),
        ("non-contiguous out", lambda: comm.all_reduce(x, out=strided_out), ValueError,
         r"^recv is not C-contiguous, but all_reduce " + NOT_WRITABLE),
        ("out in the other byte order", lambda: comm.all_reduce(x, out=np.zeros(x.shape, ">f4")), ValueError,
         r"^recv is in the other byte order \('>f4'\), but all_reduce " + NOT_WRITABLE),
        ("out dtype", lambda: comm.all_reduce(x, out=np.zeros_like(x, dtype=np.float64)), TypeError,
         r"^send is float32 but recv is float64; they must match$"),
        ("out size", lambda: comm.all_reduce(x, out=np.zeros(5, np.float32)), ValueError,
         rf"^send has {x.size} elements but recv 5; all_reduce needs the same count$"),
        ("out not an array", lambda: comm.all_reduce(x, out=[0.0] * x.size), TypeError,
         rf"^recv must be a buffer {BUFFER_KINDS}, got list"),
        ("out and recv", lambda: comm.all_reduce(x, np.zeros_like(x), out=np.zeros_like(x)), TypeError,
         r"^the output is given twice \(as recv and as out=\); pass it once$"),
        ("broadcast takes no out=", lambda: comm.broadcast(x, 0, out=np.zeros_like(x)), TypeError, r"'out'"),
        ("reduce out dtype", lambda: comm.reduce(x, out=np.zeros(x.shape, np.int32), root=rank), TypeError,
         r"^send is float32 but recv is int32; they must match$"),
        ("all_gather out size", lambda: comm.all_gather(x, out=np.zeros(5, np.float32)), ValueError,
         rf"^recv must hold send's count \* size = {x.size} \* {size} = {x.size * size} elements, it holds 5$"),
        ("all_gather non-contiguous out", lambda: comm.all_gather(x, out=np.zeros((size,) + x.shape,
                                                                                  np.float32)[::-1]),
         ValueError, r"^recv is not C-contiguous, but all_gather " + NOT_WRITABLE) if size > 1 else
        ("all_gather out twice", lambda: comm.all_gather(x, x.copy(), out=x.copy()), TypeError,
         r"^the output is given twice"),
        ("reduce_scatter out", lambda: comm.reduce_scatter(x, out=readonly[:2]), ValueError,
         r"^recv is read-only, but reduce_scatter " + NOT_WRITABLE),
        ("scatter out", lambda: comm.scatter(x, root=rank, out=np.zeros((2, 3), np.float64)), TypeError,
         r"^send is float32 but recv is float64; they must match$"),
        ("list input", lambda: comm.all_reduce([1.0, 2.0]), TypeError,
         rf"^send must be a buffer {BUFFER_KINDS}, got list; host values go in a numpy\.ndarray"),
        ("scalar input", lambda: comm.broadcast(3.0), TypeError, rf"^buf must be a buffer {BUFFER_KINDS}, got float"),
        ("None input", lambda: comm.all_reduce(None), TypeError, r"^send must be a buffer \(.*numpy\.ndarray"),
        ("object dtype", lambda: comm.all_reduce(np.array([1, "a"], dtype=object)), TypeError,
         r"^send\.dtype is object"),
        ("recv list", lambda: comm.recv([0.0], 0), TypeError, rf"^buf must be a buffer {BUFFER_KINDS}, got list"),
        ("recv from itself", lambda: comm.recv(np.zeros(3), rank), ValueError, rf"^peer={rank} is this rank"),
        ("mixed with a device buffer", lambda: comm.all_reduce(x, device), TypeError,
         r"^send and recv mix a NumPy array with a device buffer: pass NumPy arrays for every buffer"),
        ("a device buffer mixed with NumPy", lambda: comm.all_gather(device, np.zeros((size, x.size), np.float32)),
         TypeError, r"^send and recv mix a NumPy array with a device buffer"),
        ("stream=", lambda: comm.all_reduce(x, out=np.empty_like(x), stream=comm.device.default_stream), TypeError,
         r"^stream= is for device buffers, got Stream: calls on NumPy arrays block"),
        ("batch mixed", lambda: comm.batch_send_recv([("send", x, (rank + 1) % size), ("send", device,
                                                                                        (rank + 1) % size)]),
         TypeError, r"^batch_send_recv mixes NumPy arrays with device buffers") if size > 1 else
        ("all_gather_v mixed", lambda: comm.all_gather_v(np.ones(2, np.float32), device, recv_counts=[2]), TypeError,
         r"^send and recv mix a NumPy array with a device buffer"),
        ("reduce_scatter_v counts", lambda: comm.reduce_scatter_v(x, send_counts=[1] * (size + 1)), ValueError,
         rf"^send_counts must hold {size} non-negative ints? \(one per rank\), got \[1"),
        ("all_gather_v negative count", lambda: comm.all_gather_v(x, recv_counts=[-1] * size), ValueError,
         r"^recv_counts must not contain negative counts"),
        ("all_gather_v no counts", lambda: comm.all_gather_v(x), TypeError, r"^all_gather_v needs recv_counts$"),
        ("all_gather_v out twice", lambda: comm.all_gather_v(x, np.zeros(x.size * size, np.float32),
                                                             recv_counts=[x.size] * size,
                                                             out=np.zeros(x.size * size, np.float32)), TypeError,
         r"^the output is given twice"),
        ("all_gather_v counts positional", lambda: comm.all_gather_v(x, [x.size] * size), TypeError,
         r"^recv must be a buffer .*the counts of the uneven operations go by name"),
        ("all_to_all_v displacements", lambda: comm.all_to_all_v(x, send_counts=[0] * size, recv_counts=[0] * size,
                                                                 recv_displs=[-1] * size),
         ValueError, r"^recv_displs must not contain negative"),
        ("all_to_all_v no counts", lambda: comm.all_to_all_v(x, send_counts=[0] * size), TypeError,
         r"^all_to_all_v needs send_counts and recv_counts$"),
        ("all_to_all_vc matrix", lambda: comm.all_to_all_vc(x, send_count_matrix=np.ones((size + 1, size), np.int64)),
         ValueError, rf"^send_count_matrix must be a {size} x {size} matrix of non-negative ints"),
        ("all_to_all_vc float matrix", lambda: comm.all_to_all_vc(x, send_count_matrix=np.ones((size, size))),
         ValueError, rf"^send_count_matrix must be a {size} x {size} matrix of non-negative ints"),
        ("all_to_all_vc no matrix", lambda: comm.all_to_all_vc(x), TypeError,
         r"^all_to_all_vc needs send_count_matrix$"),
        ("op as a float", lambda: comm.all_reduce(x, op=2.0), ValueError, r"^op=2\.0 is not a reduce operation"),
        ("op of an empty array", lambda: comm.all_reduce(np.empty(0), op="avg"), ValueError,
         r"^op='avg' is not a reduce operation \(sum, prod, max, min\); HCCL has no average"),
        ("root of an empty array", lambda: comm.broadcast(np.empty(0), root=size), ValueError,
         rf"^root={size} must be a rank"),
        ("not a communicator", lambda: hcclpy.collectives.all_reduce(object(), x), TypeError,
         r"^comm must be an hcclpy\.Communicator, got object$"),
    ]
    if size > 1:
        odd = np.zeros((2 * size + 1, 3), np.float32)  # (2 size + 1) * 3 elements: not a multiple of size
        cases += [
            ("reduce_scatter first axis", lambda: comm.reduce_scatter(odd[:, :1]), ValueError,
             rf"^reduce_scatter splits send into {size} blocks, but it holds {2 * size + 1} elements, not a "
             rf"multiple of {size}$"),
            ("all_to_all count", lambda: comm.all_to_all(odd[:, :1]), ValueError,
             rf"^send and recv must hold the same number of elements, a multiple of size {size}"),
            ("scatter count", lambda: comm.scatter(odd[:, :1], root=rank), ValueError,
             rf"^scatter splits send into {size} blocks"),
            ("recv read-only", lambda: comm.recv(readonly, (rank + 1) % size), ValueError,
             r"^buf is read-only, but recv " + NOT_WRITABLE),
            ("recv non-contiguous", lambda: comm.recv(strided_out, (rank + 1) % size), ValueError,
             r"^buf is not C-contiguous, but recv " + NOT_WRITABLE),
            ("batch read-only recv", lambda: comm.batch_send_recv([("recv", readonly, (rank + 1) % size)]),
             ValueError, r"^items\[0\] buffer is read-only, but batch_send_recv " + NOT_WRITABLE),
        ]
    cases += [
        ("batch item", lambda: comm.batch_send_recv([("put", x, 0)]), ValueError,
         r"^items\[0\] must be \('send' \| 'recv', buffer, peer\)"),
    ]
    try:
        _refused_before_c(me, cases)
        me.check("no staging", comm._host_state is None, "a refusal set up the staging")
        # The communicator still works.
        me.eq("after errors", comm.all_reduce(np.ones(4, np.int32)), np.full(4, size, np.int32))
    finally:
        device.close()
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 2])
def test_argument_errors_are_raised_alike_on_every_rank_before_any_c_call(size: int) -> None:
    run(size, _errors)


def _outputs_refused(rank: int, size: int, info: bytes, why: str) -> List[str]:
    """Every operation refuses an output it cannot write (``why``: read-only, not C-contiguous, in
    the other byte order), naming the argument, before any C call. A rooted operation's output is
    one rank's: the others skip the call (a refusal on one rank alone would leave them waiting)."""
    me = Rank(rank, size, info)
    comm, n, peer = me.comm, size, (rank + 1) % size

    def bad(shape: Shape, dtype: Any = np.float32) -> np.ndarray:
        if why == "read-only":
            array = np.zeros(shape, dtype)
            array.flags.writeable = False
            return array
        if why == "not C-contiguous":
            return np.zeros(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]
        return np.zeros(shape, np.dtype(dtype).newbyteorder("S"))

    shown = {"read-only": "read-only", "not C-contiguous": "not C-contiguous",
             "in the other byte order": r"in the other byte order \('[<>]f4'\)"}[why]

    def refused(argument: str, operation: str) -> str:
        return rf"^{re.escape(argument)} is {shown}, but {operation} " + NOT_WRITABLE

    ones = np.ones((2 * n, 2), np.float32)
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("all_reduce in place", lambda: comm.all_reduce(bad((2 * n, 2))), ValueError, refused("send", "all_reduce")),
        ("all_reduce out=", lambda: comm.all_reduce(ones, out=bad((2 * n, 2))), ValueError,
         refused("recv", "all_reduce")),
        ("all_gather out=", lambda: comm.all_gather(ones, out=bad((n, 2 * n, 2))), ValueError,
         refused("recv", "all_gather")),
        ("reduce_scatter out=", lambda: comm.reduce_scatter(ones, out=bad((2, 2))), ValueError,
         refused("recv", "reduce_scatter")),
        ("all_to_all out=", lambda: comm.all_to_all(ones, out=bad((2 * n, 2))), ValueError,
         refused("recv", "all_to_all")),
        ("all_gather_v recv", lambda: comm.all_gather_v(ones[0], bad((n, 2)), recv_counts=[2] * n), ValueError,
         refused("recv", "all_gather_v")),
        ("reduce_scatter_v out=", lambda: comm.reduce_scatter_v(ones.ravel(), out=bad((1, 4)),
                                                                send_counts=[4] * n), ValueError,
         refused("recv", "reduce_scatter_v")),
        ("all_to_all_v out=", lambda: comm.all_to_all_v(ones.ravel(), out=bad((2, 2 * n)), send_counts=[4] * n,
                                                        recv_counts=[4] * n), ValueError,
         refused("recv", "all_to_all_v")),
        ("all_to_all_vc out=", lambda: comm.all_to_all_vc(ones.ravel(), out=bad((2, 2 * n)),
                                                          send_count_matrix=[[4] * n] * n), ValueError,
         refused("recv", "all_to_all_vc")),
    ]
    if n > 1:
        cases += [
            ("recv", lambda: comm.recv(bad((3, 2)), peer), ValueError, refused("buf", "recv")),
            ("batch_send_recv receive", lambda: comm.batch_send_recv(
                [("send", ones, peer), ("recv", bad((2 * n, 2)), (rank - 1) % n)]), ValueError,
             refused("items[1] buffer", "batch_send_recv")),
        ]
    root = n - 1
    if rank == root:  # the root's outputs
        cases += [
            ("reduce in place on the root", lambda: comm.reduce(bad((4, 2)), root=root), ValueError,
             refused("send", "reduce")),
            ("reduce out= on the root", lambda: comm.reduce(ones, out=bad((2 * n, 2)), root=root), ValueError,
             refused("recv", "reduce")),
            ("scatter out= on the root", lambda: comm.scatter(ones, root=root, out=bad((2, 2))), ValueError,
             refused("recv", "scatter")),
        ]
    if rank != root:  # the outputs of the other ranks
        cases += [
            ("broadcast on a non-root", lambda: comm.broadcast(bad((4, 2)), root), ValueError,
             refused("buf", "broadcast")),
            ("scatter out= on a non-root", lambda: comm.scatter(None, root=root, out=bad((2, 2))), ValueError,
             refused("recv", "scatter")),
        ]
    try:
        _refused_before_c(me, cases)
        # What is only read may be anything: the root's broadcast buffer, any rank's reduce input.
        values = np.arange(8, dtype=np.float32).reshape(4, 2)
        if why == "read-only":
            data = values.copy()
            data.flags.writeable = False
        elif why == "not C-contiguous":
            data = np.zeros((4, 4), np.float32)[:, ::2]
            data[...] = values
        else:
            data = values.astype(values.dtype.newbyteorder("S"))
        if rank == root:
            me.same("broadcast from a root whose buffer is " + why, comm.broadcast(data, root), data)
        else:
            me.eq("broadcast from a root whose buffer is " + why, comm.broadcast(np.zeros((4, 2), np.float32), root),
                  values)
        out = np.zeros((4, 2), np.float32)
        result = comm.reduce(data, out=out, root=root)
        if rank == root:
            me.same("reduce of an input that is " + why, result, out)
            me.eq("reduce of an input that is " + why, out, values * n)
        else:
            me.check("reduce of an input that is " + why, result is None, f"returned {result!r}")
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("why", ["read-only", "not C-contiguous", "in the other byte order"])
@pytest.mark.parametrize("size", [1, 2])
def test_outputs_that_cannot_be_written_are_refused_naming_them(size: int, why: str) -> None:
    run(size, _outputs_refused, why)


def _in_a_group(call: Callable[[], Any]) -> None:
    with hcclpy.group():
        call()


def _inside_a_group(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        x = np.full(4, rank + 1, dtype=np.float32)
        calls = (("all_reduce", lambda: me.comm.all_reduce(x)), ("all_gather", lambda: me.comm.all_gather(x)),
                 ("broadcast", lambda: me.comm.broadcast(x, 0)),
                 ("host barrier", lambda: hcclpy.host.barrier(me.comm)))
        for name, call in calls:
            me.refused(name, lambda: _in_a_group(call), RuntimeError,
                       r"^NumPy arrays cannot be used inside hcclpy\.group\(\)")
            me.eq(name + ": the input is untouched", x, np.full(4, rank + 1, dtype=np.float32))
        me.eq("all_reduce after the group", me.comm.all_reduce(x), np.full(4, size * (size + 1) / 2, np.float32))
    finally:
        me.close()
    return me.problems


def test_numpy_calls_are_refused_inside_a_group() -> None:
    # Inside a group the operations run at its end, but a NumPy call copies its result out at
    # once: it would return before the result is there.
    run(2, _inside_a_group, timeout=60)


def _destroyed(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    me.comm.all_reduce(np.ones(2))
    me.comm.destroy()
    problems = []
    for name, call in (("all_reduce", lambda: me.comm.all_reduce(np.ones(2))),
                       ("all_gather", lambda: me.comm.all_gather(np.ones(2)))):
        try:
            call()
        except ValueError as exc:
            if not re.fullmatch(r"communicator '.*' was destroyed", str(exc)):
                problems.append(f"{name} message: {exc}")
        else:
            problems.append(f"{name} on a destroyed communicator did not raise")
    if me.comm._host_state is not None:
        problems.append("a call on a destroyed communicator made a staging")
    return problems


def test_destroyed_communicator() -> None:
    run(1, _destroyed)


# ------------------------------------------------------------------------------ edge cases

def _zero_dimensional(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        x = np.array(rank + 1, dtype=np.float32)
        got = me.comm.all_reduce(x)
        me.same("all_reduce 0-d in place", got, x)
        me.check("all_reduce 0-d", got.shape == () and float(got) == size * (size + 1) / 2,
                 f"got {got!r}, expected a 0-d array")
        gathered = me.comm.all_gather(np.array(rank, dtype=np.float32))
        me.eq("all_gather 0-d", gathered, np.arange(size, dtype=np.float32))
    finally:
        me.close()
    return me.problems


def test_zero_dimensional_arrays_keep_their_shape() -> None:
    run(2, _zero_dimensional)


def _nothing_to_contribute(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        counts = [0, 3]  # rank 0 contributes nothing
        got = me.comm.all_gather_v(np.arange(counts[rank], dtype=np.float32) + 10, recv_counts=counts)
        me.eq("all_gather_v", got, np.arange(3, dtype=np.float32) + 10)
        empty = np.empty(0, np.float32)
        me.same("all_reduce of nothing", me.comm.all_reduce(empty), empty)
        me.eq("all_gather of nothing", me.comm.all_gather(empty), np.empty((size, 0), np.float32))
    finally:
        me.close()
    return me.problems


def test_a_rank_with_nothing_to_contribute() -> None:
    run(2, _nothing_to_contribute, timeout=30)


def _memmap_input(rank: int, size: int, info: bytes, folder: str) -> List[str]:
    me = Rank(rank, size, info)
    try:
        path = os.path.join(folder, "weights.npy")
        weights = np.load(path, mmap_mode="r")  # a numpy.memmap, a subclass of numpy.ndarray, read-only
        want = np.arange(6, dtype=np.float32) * size
        me.eq("read-only memmap, out=", me.comm.all_reduce(weights, out=np.empty(6, np.float32)), want)
        me.refused("read-only memmap in place", lambda: me.comm.all_reduce(weights), ValueError,
                   r"^send is read-only, but all_reduce " + NOT_WRITABLE)
        mine = np.lib.format.open_memmap(os.path.join(folder, f"rank{rank}.npy"), mode="w+", dtype=np.float32,
                                         shape=(6,))
        mine[:] = np.arange(6, dtype=np.float32)
        me.same("writable memmap in place", me.comm.all_reduce(mine), mine)
        mine.flush()
        del mine
        me.eq("the file holds the result", np.load(os.path.join(folder, f"rank{rank}.npy")), want)
    finally:
        me.close()
    return me.problems


def test_ndarray_subclasses_take_the_numpy_path(tmp_path: Any) -> None:
    np.save(os.path.join(str(tmp_path), "weights.npy"), np.arange(6, dtype=np.float32))
    run(2, _memmap_input, str(tmp_path))


def _foreign_byte_order(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        values = np.arange(6, dtype=np.float32) + rank
        swapped = values.astype(values.dtype.newbyteorder("S"))  # the same values, stored the other way
        before = swapped.copy()
        want = sum(np.arange(6, dtype=np.float32) + r for r in range(size))
        me.eq("all_reduce out=", me.comm.all_reduce(swapped, out=np.empty(6, np.float32)), want)
        me.eq("all_reduce (strided) out=", me.comm.all_reduce(np.repeat(swapped, 2)[::2], out=np.empty(6, np.float32)),
              want)
        me.untouched("all_reduce", swapped, before)
        buf = swapped if rank == 0 else np.zeros(6, np.float32)  # read on the root: any byte order will do
        me.same("broadcast", me.comm.broadcast(buf, 0), buf)
        me.check("broadcast", buf.tolist() == list(range(6)), f"got {buf!r}")
        me.eq("all_gather (a new output, in this machine's order)", me.comm.all_gather(swapped),
              np.stack([np.arange(6, dtype=np.float32) + r for r in range(size)]))
        device = hcclpy.from_numpy(swapped, device=me.comm.device)
        me.eq("from_numpy", device.to_numpy(), values)
        refusals = [
            ("in place", lambda: me.comm.all_reduce(swapped), ValueError,
             r"^send is in the other byte order \('[<>]f4'\), but all_reduce " + NOT_WRITABLE),
            ("out=", lambda: me.comm.all_reduce(values, out=np.empty_like(swapped)), ValueError,
             r"^recv is in the other byte order \('[<>]f4'\), but all_reduce " + NOT_WRITABLE),
            ("recv into", lambda: me.comm.recv(np.empty_like(swapped), (rank + 1) % size), ValueError,
             r"^buf is in the other byte order"),
        ]
        _refused_before_c(me, refusals)
        for name, call, pattern in [
            ("copy_from", lambda: device.copy_from(swapped),
             r"src\.dtype='[<>]f4' is not in this machine's byte order"),
            ("copy_to", lambda: device.copy_to(np.empty_like(swapped)), r"dst\.dtype=.*byte order"),
            ("empty", lambda: hcclpy.empty(2, swapped.dtype, device=me.comm.device), r"byte order"),
        ]:
            me.refused(name, call, TypeError, pattern)
        device.close()
    finally:
        me.close()
    return me.problems


def test_inputs_in_the_other_byte_order_are_converted() -> None:
    # HCCL reads values in the machine's byte order: a '>f4' array staged as it is summed garbage.
    run(2, _foreign_byte_order, timeout=60)


# --------------------------------------------------------------------- dtypes HCCL lacks

def _operations(rank: int, size: int, info: bytes, layout: str, shape: Shape, dtypes: Sequence[str],
                names: Sequence[str]) -> List[str]:
    """Rank body: the operations ``names`` on every dtype of ``dtypes`` (reductions with sum)."""
    me = Rank(rank, size, info)
    try:
        for d, dtype in enumerate(dtypes):
            for o, name in enumerate(names):
                root = (d + o) % size
                OPERATIONS[name](me, f"{name}/{dtype}/{shape}/{layout}/root{root}", dtype, shape, layout, "sum", root)
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [2, 3])
def test_complex_arrays_in_every_operation(size: int, layout: str) -> None:
    # Pairs of float32 / float64 on the device; counts, blocks and results in complex elements.
    run(size, _operations, layout, (2, 3), COMPLEX, list(OPERATIONS))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [2, 3])
def test_other_dtypes_are_moved_as_bytes(size: int, layout: str) -> None:
    run(size, _operations, layout, (2, 3), MOVED, MOVE_OPERATIONS)


@pytest.mark.timeout(120)
@settings(max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.sampled_from([2, 3]), name=st.sampled_from(REDUCTIONS), dtype=st.sampled_from(COMPLEX),
       shape=shapes, layout=st.sampled_from(LAYOUTS), root=st.integers(0, 2))
def test_property_complex_sums(size: int, name: str, dtype: str, shape: Shape, layout: str, root: int) -> None:
    run(size, _one, name, dtype, shape, layout, "sum", root % size, timeout=60)


def _complex_displacements(rank: int, size: int, info: bytes, dtype: str) -> List[str]:
    """Rank body: the uneven operations on complex arrays with gapped displacements, in elements."""
    me = Rank(rank, size, info)
    try:
        m = _matrix(size, 1)  # m[i][j]: elements rank i sends to rank j
        # Rank i's block for rank j starts at sum(m[i, :j]) + 2 j (two elements of gap before each)...
        send_displs = [[int(m[i, :j].sum()) + 2 * j for j in range(size)] for i in range(size)]
        xs = [any_input("displs", i, send_displs[i][-1] + int(m[i, -1]), dtype) for i in range(size)]
        # ... and the block from rank i lands at sum(m[:i, rank]) + 3 i + 1.
        recv_displs = [int(m[:i, rank].sum()) + 3 * i + 1 for i in range(size)]

        def received(gaps: complex) -> np.ndarray:
            """The result: every rank's block for this one in place, ``gaps`` around them."""
            result = np.full(recv_displs[-1] + int(m[-1, rank]), gaps, dtype=np_dtype(dtype))
            for i in range(size):
                result[recv_displs[i]:recv_displs[i] + m[i, rank]] = xs[i][send_displs[i][rank]:][:m[i, rank]]
            return result

        sends, receives = list(m[rank]), list(m[:, rank])
        me.eq("all_to_all_v", me.comm.all_to_all_v(xs[rank], send_counts=sends, recv_counts=receives,
                                                   send_displs=send_displs[rank], recv_displs=recv_displs),
              received(0))
        out = np.full(received(0).size, 7 - 7j, dtype=np_dtype(dtype))
        got = me.comm.all_to_all_v(xs[rank], send_counts=sends, recv_counts=receives, out=out,
                                   send_displs=send_displs[rank], recv_displs=recv_displs)
        me.same("all_to_all_v out=", got, out)
        me.eq("all_to_all_v out= (the gaps keep their values)", out, received(7 - 7j))

        gathered_displs = [4 * r + 1 for r in range(size)]
        mine = any_input("gather", rank, 3, dtype)
        got = me.comm.all_gather_v(mine, recv_counts=[3] * size, recv_displs=gathered_displs)
        me.eq("all_gather_v", np.stack([got[d:d + 3] for d in gathered_displs]),
              np.stack([any_input("gather", r, 3, dtype) for r in range(size)]))
        me.check("all_gather_v gaps", got.size == 4 * size and not got[0] and
                 all(not got[d + 3] for d in gathered_displs[:-1]), f"gaps of a new output: {got!r}")

        sums = [any_input("rsv", r, 4 * size, dtype, "sum") for r in range(size)]
        total = reduce_reference(sums, "sum", dtype)
        counts_v, displs_v = [1 + r % 3 for r in range(size)], [4 * r for r in range(size)]
        me.eq("reduce_scatter_v", me.comm.reduce_scatter_v(sums[rank], send_counts=counts_v, send_displs=displs_v),
              total[displs_v[rank]:displs_v[rank] + counts_v[rank]])
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("size", [2, 3])
def test_complex_counts_and_displacements_are_in_elements(size: int, dtype: str) -> None:
    run(size, _complex_displacements, dtype)


def _zero_dimensional_others(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)

    def scalar(name: str, got: Any, want: np.ndarray) -> None:  # Rank.eq would make want 1-d
        problem = ranks.mismatch(name, got, want) if isinstance(got, np.ndarray) else f"{name}: got {got!r}"
        me.check(name, problem is None, problem or "")

    try:
        x = np.array(1 + 2j * rank, dtype=np.complex64)
        want = np.array(size + 2j * sum(range(size)), dtype=np.complex64)
        out = np.zeros((), np.complex64)
        me.same("complex all_reduce 0-d out=", me.comm.all_reduce(x, out=out), out)
        scalar("complex all_reduce 0-d out=", out, want)
        me.eq("complex all_gather 0-d", me.comm.all_gather(x),
              np.array([1 + 2j * r for r in range(size)], dtype=np.complex64))
        wide = x.astype(np.complex128)
        got = me.comm.reduce(wide, root=0)
        if rank == 0:
            me.same("complex128 reduce 0-d in place", got, wide)
            scalar("complex128 reduce 0-d in place", wide, want.astype(np.complex128))
        me.same("complex all_reduce 0-d in place", me.comm.all_reduce(x), x)
        scalar("complex all_reduce 0-d in place", x, want)
        y = np.array(1 + 2j * rank, dtype=np.complex64)
        me.same("complex broadcast 0-d", me.comm.broadcast(y, 1), y)
        scalar("complex broadcast 0-d", y, np.array(1 + 2j, np.complex64))
        flag = np.array(rank == 1)
        me.eq("bool all_gather 0-d", me.comm.all_gather(flag), np.arange(size) == 1)
        me.same("bool broadcast 0-d", me.comm.broadcast(flag, 1), flag)
        scalar("bool broadcast 0-d", flag, np.array(True))
        me.refused("complex reduce_scatter 0-d", lambda: me.comm.reduce_scatter(x), ValueError,
                   rf"^reduce_scatter splits send into {size} blocks, but it holds 1 elements, not a multiple of "
                   rf"{size}$")
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
def test_zero_dimensional_complex_and_bool_arrays() -> None:
    run(2, _zero_dimensional_others)


def _foreign_order_others(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        values = np.array([1 + 2j, 3 - 4j, rank * 1j], dtype=np.complex64)
        swapped = values.astype(values.dtype.newbyteorder("S"))
        me.eq("complex all_reduce", me.comm.all_reduce(swapped, out=np.empty(3, np.complex64)),
              sum(np.array([1 + 2j, 3 - 4j, r * 1j], np.complex64) for r in range(size)))
        me.refused("complex all_reduce in place", lambda: me.comm.all_reduce(swapped), ValueError,
                   r"^send is in the other byte order \('[<>]c8'\)")
        names = np.array(["ab", "cde", str(rank)], dtype="U3")
        other = names.astype(names.dtype.newbyteorder("S"))
        me.eq("strings all_gather", me.comm.all_gather(other),
              np.array([["ab", "cde", str(r)] for r in range(size)], dtype="U3"))
        record = np.dtype([("a", "i4"), ("b", "f8")])
        rows = np.array([(rank, 0.5), (7, -1.0)], dtype=record)
        buf = rows.astype(record.newbyteorder("S")) if rank == 0 else np.zeros(2, record)
        got = me.comm.broadcast(buf, 0)
        me.same("structured broadcast", got, buf)
        if rank:
            me.eq("structured broadcast", got, np.array([(0, 0.5), (7, -1.0)], dtype=record))
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
def test_other_dtypes_in_the_other_byte_order_are_converted() -> None:
    run(2, _foreign_order_others)


def _dtype_refusals(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    comm, peer = me.comm, (rank + 1) % size
    three = np.arange(3, dtype=np.complex64)
    blocks_ = np.zeros(2 * size, np.complex128)
    odd = np.arange(size + 1, dtype=np.complex64)
    objects = np.array([1, "a"], dtype=object)
    bytes_only = (r"which travel as bytes: the dtypes that reduce are int8, .* and bfloat16 \(HCCL's types\), and "
                  r"complex64 and complex128 with sum$")
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("complex max", lambda: comm.all_reduce(three, op="max"), ValueError,
         r"^all_reduce with op=max is not supported on complex64 arrays: complex arrays reduce with sum only$"),
        ("complex prod", lambda: comm.reduce(blocks_, op=hcclpy.ReduceOp.PROD, root=0), ValueError,
         r"^reduce with op=prod is not supported on complex128 arrays: complex arrays reduce with sum only$"),
        ("complex min", lambda: comm.reduce_scatter(blocks_, op="min"), ValueError,
         r"^reduce_scatter with op=min is not supported on complex128 arrays"),
        ("complex max, uneven", lambda: comm.reduce_scatter_v(three, send_counts=[1] * size, op=2), ValueError,
         r"^reduce_scatter_v with op=max is not supported on complex64 arrays"),
        ("bool sum", lambda: comm.all_reduce(np.ones(3, bool)), TypeError,
         r"^all_reduce cannot reduce bool arrays, " + bytes_only),
        ("datetime reduce", lambda: comm.reduce(np.zeros(2, "M8[s]"), root=0), TypeError,
         r"^reduce cannot reduce datetime64\[s\] arrays, " + bytes_only),
        ("structured reduce_scatter", lambda: comm.reduce_scatter(np.zeros(2 * size, "i4,f4")), TypeError,
         r"^reduce_scatter cannot reduce \[\('f0', '<i4'\), \('f1', '<f4'\)\] arrays"),
        ("strings reduce_scatter_v", lambda: comm.reduce_scatter_v(np.zeros(size, "U2"), send_counts=[1] * size),
         TypeError, r"^reduce_scatter_v cannot reduce <U2 arrays"),
        ("clongdouble sum", lambda: comm.all_reduce(np.zeros(2, np.clongdouble)), TypeError,
         r"cannot reduce complex\d+ arrays, which travel as bytes"),
        ("object all_reduce", lambda: comm.all_reduce(objects), TypeError,
         r"^send\.dtype is object, which holds Python objects: .* mean nothing in another process"),
        ("object broadcast", lambda: comm.broadcast(objects, 0), TypeError, r"^buf\.dtype is object"),
        ("object field", lambda: comm.all_gather(np.zeros(2, [("x", "f4"), ("o", "O")])), TypeError,
         r"^send\.dtype is \[\('x', '<f4'\), \('o', 'O'\)\], which holds Python objects"),
        ("object send", lambda: comm.send(objects, peer), TypeError, r"^buf\.dtype is object"),
        ("object recv", lambda: comm.recv(np.empty(2, object), peer), TypeError, r"^buf\.dtype is object"),
        ("object scatter out", lambda: comm.scatter(None, root=peer, out=np.empty(1, object)), TypeError,
         r"^recv\.dtype is object"),
        ("object in the other byte order", lambda: comm.all_gather(np.zeros(2, [("x", ">f4"), ("o", "O")])),
         TypeError, r"^send\.dtype is .*which holds Python objects"),
        ("empty elements", lambda: comm.all_gather(np.zeros(3, "V0")), TypeError,
         r"^send\.dtype is \|V0, whose elements have no bytes"),
        ("no fields", lambda: comm.broadcast(np.zeros(3, []), 0), TypeError, r"whose elements have no bytes"),
        ("out of another complex", lambda: comm.all_reduce(three, out=np.zeros(3, np.complex128)), TypeError,
         r"^send is complex64 but recv is complex128; they must match$"),
        ("out of the parts", lambda: comm.all_gather(three, out=np.zeros((size, 3, 2), np.float32)), TypeError,
         r"^send is complex64 but recv is float32; they must match$"),
        ("recv in the other byte order", lambda: comm.recv(np.zeros(3, three.dtype.newbyteorder("S")), peer),
         ValueError, r"^buf is in the other byte order"),
        ("object batch", lambda: comm.batch_send_recv([("send", three, peer), ("recv", np.empty(2, object), peer)]),
         TypeError, r"^items\[1\] buffer\.dtype is object"),
    ]
    if size > 1:
        cases += [
            # size + 1 complex numbers are 2 size + 2 floats, a multiple of size for size 2: not split mid-element
            ("complex split mid-element", lambda: comm.reduce_scatter(odd), ValueError,
             rf"^reduce_scatter splits send into {size} blocks, but it holds {size + 1} elements, not a multiple of "
             rf"{size}$"),
            ("complex all_to_all", lambda: comm.all_to_all(odd), ValueError,
             rf"^send and recv must hold the same number of elements, a multiple of size {size}; got {size + 1} and "
             rf"{size + 1}$"),
            ("complex scatter", lambda: comm.scatter(odd, root=rank), ValueError,
             rf"^scatter splits send into {size} blocks, but it holds {size + 1} elements"),
            ("bool all_to_all", lambda: comm.all_to_all(np.ones(size + 1, bool)), ValueError,
             rf"got {size + 1} and {size + 1}$"),
        ]
    try:
        _refused_before_c(me, cases)
        me.check("staging", comm._host_state is None, "a refusal came after device staging was set up")
        # Every rank refused every call: the communicator is still in step.
        me.eq("complex all_reduce after the refusals", comm.all_reduce(three, out=np.empty(3, np.complex64)),
              np.arange(3, dtype=np.complex64) * size)
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3])
def test_dtypes_that_cannot_travel_or_reduce_are_refused_before_any_c_call(size: int) -> None:
    run(size, _dtype_refusals, timeout=50)


def _kind_refusals(rank: int, size: int, info: bytes) -> List[str]:
    """Calls every rank makes alike, refused alike on every rank before any C call."""
    me = Rank(rank, size, info)
    comm, peer = me.comm, (rank + 1) % size
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    buf = np.zeros(4)
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("masked input", lambda: comm.all_reduce(masked, out=np.empty(2)), TypeError,
         r"^send is a masked array: hcclpy moves data, not masks, .* pass send\.filled\(value\) or send\.data$"),
        ("masked out", lambda: comm.all_reduce(np.ones(2), out=masked), TypeError,
         r"^recv is a masked array: .* pass recv\.filled\(value\) or recv\.data$"),
        ("masked recv", lambda: comm.recv(masked, peer), TypeError, r"^buf is a masked array"),
        ("op where recv goes", lambda: comm.all_reduce(np.ones(2), "max"), TypeError,
         rf"^recv must be a buffer {BUFFER_KINDS}, got str"),
        ("ReduceOp where recv goes", lambda: comm.reduce_scatter(np.ones(2 * size), hcclpy.ReduceOp.MIN), TypeError,
         rf"^recv must be a buffer {BUFFER_KINDS}, got ReduceOp"),
        ("a list where recv goes", lambda: comm.all_reduce(np.ones(2), [1]), TypeError,
         rf"^recv must be a buffer {BUFFER_KINDS}, got list; host values go in a numpy\.ndarray"),
        ("two receives into one array", lambda: comm.batch_send_recv(
            [("send", np.ones(1), peer), ("recv", buf[2:], peer), ("recv", np.ones(1), peer),
             ("recv", buf[:3], peer)]),
         ValueError, r"^items\[1\] and items\[3\] overlap in memory and at least one of them receives: a receive "
                     r"buffer must not share memory with any other item of the batch$"),
        ("a receive into the array sent", lambda: comm.batch_send_recv(
            [("send", buf, peer), ("recv", buf, (rank - 1) % size)]),
         ValueError, r"^items\[0\] and items\[1\] overlap in memory and at least one of them receives"),
    ]
    try:
        _refused_before_c(me, cases)
        # Sends may share memory with each other.
        sent = np.full(4, float(rank))
        got = np.zeros(8)
        comm.batch_send_recv([("send", sent[:2], peer), ("send", sent, peer), ("recv", got[:2], (rank - 1) % size),
                              ("recv", got[2:6], (rank - 1) % size)])
        left = float((rank - 1) % size)
        me.eq("sends that share memory", got, np.array([left] * 6 + [0.0] * 2))
        # reduce's out is the root's alone: other ranks' are not looked at, and left alone.
        out = np.zeros(3)
        result = comm.reduce(np.ones(3), out=out, root=0)
        me.check("reduce with out on every rank", (result is out) == (rank == 0) and (rank == 0 or result is None),
                 f"returned {type(result).__name__} on rank {rank}")
        me.eq("a non-root's out is left alone", out, np.full(3, float(size)) if rank == 0 else np.zeros(3))
        if rank:
            strange = np.zeros(3, np.int8)  # not written, so not checked, on a non-root
            comm.reduce(np.ones(3), out=strange, root=0)
        else:
            comm.reduce(np.ones(3), root=0)
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
def test_masked_arrays_misplaced_ops_and_overlapping_receives_are_refused_alike_on_every_rank() -> None:
    run(2, _kind_refusals, timeout=50)


def test_a_reduce_op_where_recv_goes_is_named_as_one(one_rank: Any) -> None:
    with pytest.raises(TypeError, match=r"recv .*'max'.* names a reduce op.*op='max'"):
        one_rank.all_reduce(np.ones(2), "max")


def _sends_sharing_memory(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        peer, left = (rank + 1) % size, (rank - 1) % size
        sent = np.arange(4.0) + 10 * rank
        got = np.zeros(6)
        # Two sends from the same address, the longer one first.
        me.comm.batch_send_recv([("send", sent, peer), ("send", sent[:2], peer), ("recv", got[:4], left),
                                 ("recv", got[4:], left)])
        me.eq("sends that start at one address", got, np.concatenate([np.arange(4.0), np.arange(2.0)]) + 10 * left)
    finally:
        me.close()
    return me.problems


def test_batch_sends_that_start_at_one_address() -> None:
    run(2, _sends_sharing_memory, timeout=50)


@pytest.mark.parametrize("send, out", [("bool", "uint8"), ("M8[ms]", "m8[ns]"), ("U2", "S8"), ("i4,i4", "V8")])
def test_an_output_of_another_dtype_moved_as_bytes_is_refused(one_rank: Any, send: str, out: str) -> None:
    recorder = _CallRecorder(one_rank._api)
    one_rank._api = recorder
    try:
        with pytest.raises(TypeError, match=r"^send is .* but recv is .*; they must match$"):
            one_rank.all_gather(np.zeros(2, send), out=np.zeros(2, out))
    finally:
        one_rank._api = recorder.real
    assert recorder.called == []


# ------------------------------------------------------------------- sizes that differ

def _sizes_differ(rank: int, size: int, info: bytes, operation: str, n: int) -> Dict[str, Any]:
    comm = hcclpy.Communicator(size, info, rank, device=rank)
    count = n + 1 if rank == size - 1 else n  # the last rank passes one element more
    calls = {"all_reduce": lambda: comm.all_reduce(np.ones(count, np.float32)),
             "broadcast": lambda: comm.broadcast(np.ones(count, np.float32), 0),
             "reduce": lambda: comm.reduce(np.ones(count, np.float32), root=1),
             "all_gather": lambda: comm.all_gather(np.ones(count, np.float32))}
    try:
        calls[operation]()
    except hcclpy.HcclpyError as exc:
        return {"class": type(exc).__name__, "mismatch": isinstance(exc, hcclpy.CollectiveMismatchError),
                "value_error": isinstance(exc, ValueError), "message": str(exc)}
    else:
        return {"class": None}
    finally:
        comm.destroy(timeout=30)


@pytest.mark.parametrize("n", [40, 1 << 18], ids=["small", "large"])
@pytest.mark.parametrize("operation", ["all_reduce", "broadcast", "reduce", "all_gather"])
@pytest.mark.timeout(120)
def test_ranks_passing_arrays_of_different_sizes_all_get_the_mismatch_error(operation: str, n: int) -> None:
    # No exchange of sizes before the call any more: the simulator compares the calls, at every size.
    out = ranks.run_threads(_sizes_differ, 3, operation, n, timeout=90)
    for rank, error in enumerate(out):
        assert error["class"] is not None and error["mismatch"] and error["value_error"], (rank, error)
        assert re.search(rf"rank {rank} called {operation}\(count=\d+, fp32", error["message"]), (rank, error)


# ------------------------------------------------------------------------ product profiles

def _profile_checks_the_carrier(rank: int, size: int, info: bytes) -> List[str]:
    """Rank body under the A3 profile: float32 sums, uint8 moves, no float64 reductions."""
    me = Rank(rank, size, info)
    try:
        xs = [any_input("profile", r, 2 * size, "complex64", "sum") for r in range(size)]
        total = reduce_reference(xs, "sum", "complex64")
        me.eq("complex64 all_reduce", me.comm.all_reduce(xs[rank], out=np.empty(2 * size, np.complex64)), total)
        me.eq("complex64 reduce_scatter_v", me.comm.reduce_scatter_v(xs[rank], send_counts=[size, size]),
              total[rank * size:(rank + 1) * size])
        _refused_before_c(me, [
            ("complex128 all_reduce", lambda: me.comm.all_reduce(xs[rank].astype(np.complex128)), ValueError,
             r"^all_reduce of fp64 with sum is not supported on the A3 profile \(HCCLPY_SIM_PROFILE=A3\)"),
            ("complex64 max", lambda: me.comm.all_reduce(xs[rank], op="max"), ValueError,
             r"^all_reduce with op=max is not supported on complex64 arrays"),
            ("bool sum", lambda: me.comm.all_reduce(np.ones(2, bool)), TypeError, r"^all_reduce cannot reduce"),
            ("object", lambda: me.comm.broadcast(np.array([None]), 0), TypeError, r"^buf\.dtype is object"),
        ])
        flags = [any_input("flags", r, 3, "bool") for r in range(size)]
        me.eq("bool all_gather", me.comm.all_gather(flags[rank]), np.stack(flags))
        rows = [any_input("rows", r, 2, "i4,(2,)f8,U3,?") for r in range(size)]
        mine = rows[rank].copy()
        me.same("structured broadcast", me.comm.broadcast(mine, 1), mine)
        me.eq("structured broadcast", mine, rows[1])
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(180)
def test_product_profiles_check_the_type_that_carries_the_array() -> None:
    results = ranks.run_processes(_profile_checks_the_carrier, 2, env={"HCCLPY_SIM_PROFILE": "A3"}, timeout=150)
    assert results == [[], []], "\n".join(f"rank {r}: {text}" for r, texts in enumerate(results) for text in texts)


def test_a_profile_is_asked_about_the_carrier_before_any_c_call() -> None:
    """Operations that move data take no reduce op: the profile is asked about the bytes' carrier
    (uint8); reductions about the carrier of the parts (fp32 for complex64) with their op. A
    refusal of the profile comes before any C call and any staging."""

    class Recording:
        def __init__(self) -> None:
            self.checks: List[Any] = []

        def check(self, operation: str, dtype: Any, op: Any = None) -> None:
            self.checks.append((operation, dtype, op))
            raise ValueError(f"{operation} refused by the profile")

    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    recorder = _CallRecorder(comm._api)
    try:
        comm._profile = Recording()
        comm._api = recorder
        for call in (lambda: comm.broadcast(np.ones(3, bool), 0), lambda: comm.all_reduce(np.ones(2, np.complex64)),
                     lambda: comm.all_gather(np.zeros(2, "U3")), lambda: comm.reduce(np.ones(2, np.int16), root=0)):
            with pytest.raises(ValueError, match="refused by the profile"):
                call()
        assert comm._profile.checks == [("broadcast", hcclpy.DataType.UINT8, None),
                                        ("all_reduce", hcclpy.DataType.FP32, hcclpy.ReduceOp.SUM.value),
                                        ("all_gather", hcclpy.DataType.UINT8, None),
                                        ("reduce", hcclpy.DataType.INT16, hcclpy.ReduceOp.SUM.value)]
        assert recorder.called == [] and comm._host_state is None
    finally:
        comm._profile = None
        comm._api = recorder.real
        comm.destroy()


# ------------------------------------------------------------------------- interrupts, failures

def _interrupted_while_the_peer_is_late(rank: int, size: int, info: bytes, folder: str) -> Dict[str, Any]:
    from pathlib import Path

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    interrupted = Path(folder) / "interrupted"
    out: Dict[str, Any] = {}
    try:
        # One collective: interrupted, it stays queued and completes when the peer comes, so the
        # ranks stay in step.
        first = np.full(3000, rank + 1.0, np.float32)
        if rank == 0:
            # SIGINT while rank 1 has not called yet: it ends the wait for rank 1 with KeyboardInterrupt.
            ranks.interrupt_soon(0.2)
            try:
                comm.all_reduce(first, out=np.empty_like(first))
                out["interrupted"] = False
            except KeyboardInterrupt:
                out["interrupted"] = True
            interrupted.touch()
        else:
            # rank 1 calls only once rank 0 was interrupted
            assert ranks.wait_for(interrupted.exists, 90), "rank 0 was never interrupted"
            out["first"] = comm.all_reduce(first).tolist()
        # The work the interrupt left queued ends before the next call reuses the scratch.
        out["second"] = comm.all_reduce(np.full(3000, 10.0 * (rank + 1), np.float32)).tolist()
        return out
    finally:
        comm.destroy()


def _destroyed_after_an_interrupt(rank: int, size: int, info: bytes, folder: str) -> Dict[str, Any]:
    from pathlib import Path

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    done = Path(folder) / "destroyed"
    if rank == 1:  # never calls: rank 0's collective stays queued until destroy aborts it
        assert ranks.wait_for(done.exists, 90), "rank 0 never destroyed its communicator"
        comm.destroy()
        return {}
    ranks.interrupt_soon(0.2)
    interrupted = False
    try:
        comm.all_reduce(np.ones(3, np.float32))
    except KeyboardInterrupt:
        interrupted = True
    try:
        comm.destroy(timeout=1)
        return {"interrupted": interrupted, "destroyed": comm.destroyed, "staging": comm._host_state}
    finally:
        done.touch()


def _called_again_after_a_failure(rank: int, size: int, info: bytes, folder: str) -> List[str]:
    from pathlib import Path

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    done = Path(folder) / "done"
    try:
        if rank == 1:  # never calls: rank 0's all_reduce fails by HCCL_EXEC_TIMEOUT
            assert ranks.wait_for(done.exists, 90), "rank 0 never made its two calls"
            return []
        seen = []
        for _ in range(2):
            try:
                comm.all_reduce(np.ones(3, np.float32))
            except hcclpy.HcclpyError as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
        done.touch()
        return seen
    finally:
        comm.destroy(timeout=0)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_call_after_a_failed_one_is_told_the_communicator_failed(tmp_path: Any) -> None:
    # The failed staging stream used to raise the first failure again, word for word, from every
    # later call: a loop that retries on timeouts never ended.
    (first, second), _ = ranks.run_processes(_called_again_after_a_failure, 2, str(tmp_path), timeout=100,
                                             env={"HCCL_EXEC_TIMEOUT": "2"})
    assert "all_reduce #1 timed out" in first and first.startswith("AclTimeoutError"), first
    assert "has failed" in second and "destroy it and create a new one" in second, second


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_destroy_with_a_timeout_ends_the_collective_an_interrupt_left_queued(tmp_path: Any) -> None:
    # Closing the staging stream used to wait for the queued collective in one C call, for
    # HCCL_EXEC_TIMEOUT whatever destroy's timeout: with 300 s, such a wait outlasts the run's
    # timeout and fails the test.
    first, _ = ranks.run_processes(_destroyed_after_an_interrupt, 2, str(tmp_path), timeout=100,
                                   env={"HCCL_EXEC_TIMEOUT": "300"})
    assert first == {"interrupted": True, "destroyed": True, "staging": None}, first


@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_numpy_call_whose_peer_is_late(tmp_path: Any) -> None:
    # HCCL_EXEC_TIMEOUT of 60 s: without the interrupt, rank 0 would wait for rank 1, which waits for it.
    first, second = ranks.run_processes(_interrupted_while_the_peer_is_late, 2, str(tmp_path), timeout=100,
                                        env={"HCCL_EXEC_TIMEOUT": "60"})
    assert first["interrupted"], first
    assert second["first"] == [3.0] * 3000  # rank 0's interrupted call still contributed its data
    assert first["second"] == second["second"] == [30.0] * 3000
