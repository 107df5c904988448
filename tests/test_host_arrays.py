"""Every operation on NumPy arrays (``hcclpy.host``, reached through the ``Communicator`` methods)
against a NumPy reference: 1-4 ranks as threads, every dtype (bfloat16 through ml_dtypes),
multi-dimensional and non-contiguous inputs, ``out=``, the chunked path with a partial last chunk
(direct and pinned staging, as threads and as processes), hypothesis properties, argument errors,
and the steady state (no new device scratch or pinned buffers).

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


def run(size: int, fn: Callable[..., List[str]], *args: Any, timeout: float = 90.0, staging: str = "auto",
        mode: str = "threads") -> None:
    """Run ``fn`` as ``size`` ranks (threads or processes, ``mode``) staging host arrays as ``staging``
    says; fail with every rank's mismatches."""
    env = {"HCCL_EXEC_TIMEOUT": "10", "HCCLPY_HOST_STAGING": staging}
    results = ranks.run(mode, fn, size, *args, timeout=timeout, env=env)
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


# ------------------------------------------------------------------------ one operation each

def op_all_reduce(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, op, layout)
    x, before = xs[me.rank], xs[me.rank].copy()
    want = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    me.eq(tag, me.comm.all_reduce(x, op=op), want)
    out = np.full(shape, 7, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_reduce(x, out=out, op=op), out)
    me.eq(tag + " out=", out, want)
    out2 = np.zeros(shape, dtype=np_dtype(dtype))
    me.same(tag + " recv positional", me.comm.all_reduce(x, out2, op), out2)
    me.eq(tag + " recv positional", out2, want)
    me.untouched(tag, x, before)


def op_broadcast(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    data = me.inputs(tag, shape, dtype, None, layout)[root]
    x = data if me.rank == root else arrange(np.zeros(data.size, np_dtype(dtype)), shape, layout)
    before = x.copy()
    me.eq(tag, me.comm.broadcast(x, root), data)
    out = np.empty(shape, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.broadcast(x, root, out=out), out)
    me.eq(tag + " out=", out, data)
    me.untouched(tag, x, before)


def op_reduce(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, op, layout)
    x = xs[me.rank]
    want = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    got = me.comm.reduce(x, op=op, root=root)
    out = np.zeros(shape, dtype=np_dtype(dtype))
    got_out = me.comm.reduce(x, out=out, op=op, root=root)
    if me.rank == root:
        me.eq(tag, got, want)
        me.same(tag + " out=", got_out, out)
        me.eq(tag + " out=", out, want)
    else:
        me.check(tag, got is None and got_out is None, "a non-root rank got a result")
        me.check(tag + " out=", not out.any(), "a non-root rank's out was written")


def op_all_gather(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, shape, dtype, None, layout)
    want = np.stack([np.ascontiguousarray(v) for v in xs])
    me.eq(tag, me.comm.all_gather(xs[me.rank]), want)
    out = np.empty((me.size,) + shape, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_gather(xs[me.rank], out=out), out)
    me.eq(tag + " out=", out, want)


def op_reduce_scatter(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, blocks(shape, me.size), dtype, op, layout)
    full = reduce_reference([np.ascontiguousarray(v) for v in xs], op, dtype)
    want = full[me.rank * shape[0]:(me.rank + 1) * shape[0]]
    me.eq(tag, me.comm.reduce_scatter(xs[me.rank], op=op), want)
    out = np.empty(shape, dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.reduce_scatter(xs[me.rank], out=out, op=op), out)
    me.eq(tag + " out=", out, want)


def op_all_to_all(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    xs = me.inputs(tag, blocks(shape, me.size), dtype, None, layout)
    b, r = shape[0], me.rank
    want = np.concatenate([np.ascontiguousarray(v)[r * b:(r + 1) * b] for v in xs])
    me.eq(tag, me.comm.all_to_all(xs[r]), want)
    out = np.empty(blocks(shape, me.size), dtype=np_dtype(dtype))
    me.same(tag + " out=", me.comm.all_to_all(xs[r], out=out), out)
    me.eq(tag + " out=", out, want)


def op_scatter(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    data = me.inputs(tag, blocks(shape, me.size), dtype, None, layout)[root]
    b, r = shape[0], me.rank
    want = np.ascontiguousarray(data)[r * b:(r + 1) * b]
    dt = np_dtype(dtype)
    if r == root:
        me.eq(tag, me.comm.scatter(data, root=root), want)
        out = np.empty(shape, dtype=dt)
        me.same(tag + " out=", me.comm.scatter(data, root=root, out=out), out)
        me.eq(tag + " out=", out, want)
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
    me.eq(tag, me.comm.all_gather_v(mine, counts), np.concatenate(xs))
    me.eq(tag + " keyword", me.comm.all_gather_v(mine, recv_counts=counts), np.concatenate(xs))
    # Gapped displacements, through the module function: only the blocks are defined.
    displs = list(np.cumsum([0] + [c + 2 for c in counts[:-1]]))
    got = hcclpy.host.all_gather_v(me.comm, mine, counts, recv_displs=displs)
    me.eq(tag + " displs", np.concatenate([got[d:d + c] for d, c in zip(displs, counts)]), np.concatenate(xs))


def op_reduce_scatter_v(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    counts = _counts(me.size, root + 1)
    total = sum(counts)
    xs = [any_input(tag, j, total, dtype, op) for j in range(me.size)]
    full = reduce_reference(xs, op, dtype)
    start = sum(counts[:me.rank])
    want = full[start:start + counts[me.rank]]
    me.eq(tag, me.comm.reduce_scatter_v(arrange(xs[me.rank], (total,), layout), counts, op=op), want)
    me.eq(tag + " keyword", me.comm.reduce_scatter_v(xs[me.rank], send_counts=counts, op=op), want)
    out = np.empty(counts[me.rank], dtype=np_dtype(dtype))
    got = hcclpy.host.reduce_scatter_v(me.comm, xs[me.rank], counts, out=out, op=op)
    me.same(tag + " out=", got, out)
    me.eq(tag + " out=", out, want)


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
    want = _a2av_reference(xs, m, me.rank)
    me.eq(tag, me.comm.all_to_all_v(mine, list(m[me.rank]), list(m[:, me.rank])), want)
    me.eq(tag + " keywords", me.comm.all_to_all_v(mine, send_counts=list(m[me.rank]),
                                                  recv_counts=list(m[:, me.rank])), want)
    me.eq(tag + " keyword", me.comm.all_to_all_v(mine, list(m[me.rank]), recv_counts=list(m[:, me.rank])), want)
    out = np.empty(want.size, dtype=np_dtype(dtype))
    got = hcclpy.host.all_to_all_v(me.comm, mine, list(m[me.rank]), list(m[:, me.rank]), out=out)
    me.same(tag + " out=", got, out)
    me.eq(tag + " out=", out, want)


def op_all_to_all_vc(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    m = _matrix(me.size, root + 1)
    xs = [any_input(tag, i, int(m[i].sum()), dtype) for i in range(me.size)]
    mine = arrange(xs[me.rank], (xs[me.rank].size,), layout)
    me.eq(tag, me.comm.all_to_all_vc(mine, m), _a2av_reference(xs, m, me.rank))
    me.eq(tag + " list", me.comm.all_to_all_vc(mine, m.tolist()), _a2av_reference(xs, m, me.rank))
    me.eq(tag + " keyword", me.comm.all_to_all_vc(mine, send_count_matrix=m), _a2av_reference(xs, m, me.rank))


def op_send_recv(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    if me.size == 1:
        return
    n, r = me.size, me.rank
    xs = me.inputs(tag, shape, dtype, None, layout)
    target = np.empty(shape, dtype=np_dtype(dtype))
    if r % 2 == 0:  # even ranks send first, odd ranks receive first: blocking calls pair up
        me.comm.send(xs[r], (r + 1) % n)
        got = me.comm.recv(target, (r - 1) % n)
    else:
        got = me.comm.recv(target, (r - 1) % n)
        me.comm.send(xs[r], (r + 1) % n)
    me.same(tag, got, target)
    me.eq(tag, target, xs[(r - 1) % n])


def op_batch_send_recv(me: Rank, tag: str, dtype: str, shape: Shape, layout: str, op: str, root: int) -> None:
    if me.size == 1:
        return
    n, r = me.size, me.rank
    xs = me.inputs(tag, shape, dtype, None, layout)
    small = [any_input(tag + "/small", j, 3, dtype) for j in range(n)]
    from_left = np.empty(shape, dtype=np_dtype(dtype))
    from_right = np.empty(3, dtype=np_dtype(dtype))
    me.comm.batch_send_recv([("send", xs[r], (r + 1) % n), ("recv", from_left, (r - 1) % n),
                             ("send", small[r], (r - 1) % n), ("recv", from_right, (r + 1) % n)])
    me.eq(tag, from_left, xs[(r - 1) % n])
    me.eq(tag + " small", from_right, small[(r + 1) % n])


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
@pytest.mark.parametrize("size", SIZES)
def test_every_operation_and_dtype(size: int, layout: str) -> None:
    shape = (2, 3, 2) if layout == "contiguous" else (2, 3)
    run(size, _every_operation, layout, shape, DTYPES)


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1), (1, 1, 4), (2, 2, 2, 2)], ids=str)
def test_shapes(shape: Shape) -> None:
    run(3, _every_operation, "contiguous", shape, ("int32", "float16"))


def test_every_operation_is_a_communicator_method() -> None:
    for name in OPERATIONS:
        assert hasattr(hcclpy.Communicator, name) or name == "send_recv", name
    assert set(hcclpy.host.__all__) >= {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                        "all_to_all", "scatter", "all_gather_v", "reduce_scatter_v", "all_to_all_v",
                                        "all_to_all_vc", "send", "recv", "batch_send_recv", "barrier"}


# --------------------------------------------------------------------------- chunked path

def _chunked(rank: int, size: int, info: bytes, count: int, dtypes: Sequence[str], chunk: int,
             pinned: bool = False) -> List[str]:
    hcclpy.host.CHUNK_BYTES = chunk  # processes import the default; threads share the test's setting
    me = Rank(rank, size, info)
    try:
        for d, dtype in enumerate(dtypes):
            step = max(chunk // np_dtype(dtype).itemsize, 1)
            me.check(f"{dtype} partial last chunk", count > step and count % step != 0,
                     f"count {count} does not end in a partial chunk of {step}")
            op = REDUCE_OPS[d % len(REDUCE_OPS)]
            tag = f"chunked/{dtype}/{op}"
            shape = (count // 2, 2) if count % 2 == 0 else (count,)
            op_all_reduce(me, tag, dtype, shape, "contiguous", op, 0)
            op_all_reduce(me, tag + "/strided", dtype, shape, "strided", op, 0)
            op_broadcast(me, tag + "/bcast", dtype, shape, "fortran", op, size - 1)
            op_reduce(me, tag + "/reduce", dtype, shape, "contiguous", op, (d + 1) % size)
            staging = me.comm._host_state
            me.check(f"{tag} staging", staging.pinned == pinned, f"pinned is {staging.pinned}, expected {pinned}")
            # Element-wise, in place: two chunks taken in turn; direct mode copies the chunk done out and
            # the next one in, in opposite orders on neighbouring ranks (one reads host memory while the
            # other writes it). Before them, the ranks exchange the arrays' sizes.
            slots = ("send0", "send1", "size", "sizes") if pinned else ("next", "send", "size", "sizes")
            me.check(f"{tag} scratch", sorted(staging._buffers) == sorted(slots),
                     f"scratch buffers {sorted(staging._buffers)}, expected {sorted(slots)}")
            me.check(f"{tag} copy order", staging.copy_out_first == (rank % 2 == 0),
                     f"copy_out_first is {staging.copy_out_first} on rank {rank}")
            for slot, buf in staging._buffers.items():
                me.check(f"{tag} {slot} scratch", buf.nbytes <= max(chunk, 1) * 2,
                         f"{buf.nbytes} bytes of scratch for chunks of {chunk} bytes: not chunked")
            for slot, host in enumerate(staging._host):
                me.check(f"{tag} pinned buffer {slot}", (host is not None) == pinned and
                         (host is None or host[0].nbytes <= max(chunk, 1) * 2),
                         f"pinned buffer {slot} is {None if host is None else host[0].nbytes} bytes")
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("staging", ["direct", "pinned"])
@pytest.mark.parametrize("size", [2, 3])
def test_chunked_path_with_a_partial_last_chunk(monkeypatch: pytest.MonkeyPatch, size: int, staging: str) -> None:
    monkeypatch.setattr(hcclpy.host, "CHUNK_BYTES", 1000)  # 1000 bytes: not a multiple of 8 either
    run(size, _chunked, 2 * 1234, DTYPES, 1000, staging == "pinned", staging=staging)


@pytest.mark.parametrize("staging", ["direct", "pinned"])
def test_chunked_path_in_processes(monkeypatch: pytest.MonkeyPatch, staging: str) -> None:
    monkeypatch.setattr(hcclpy.host, "CHUNK_BYTES", 4096)
    # 3 chunks of float32 and a partial one, so both pinned buffers are reused.
    run(2, _chunked, 3 * 1024 + 10, ("float32", "int16"), 4096, staging == "pinned", staging=staging,
        mode="processes", timeout=120)


def test_arrays_larger_than_the_default_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    chunk = hcclpy.host.CHUNK_BYTES  # 2 MiB unless HCCLPY_HOST_CHUNK_BYTES says otherwise
    count = 5 * chunk // 4 + 8  # float32: 5 chunks and 32 bytes; float64: 10 and 64; 16-bit: 2.5 chunks
    run(2, _chunked, count, ("float32", "float64", "bfloat16" if ranks.HAVE_BF16 else "float16"), chunk)


def _overlapping_out(rank: int, size: int, info: bytes, chunk: int) -> List[str]:
    hcclpy.host.CHUNK_BYTES = chunk
    me = Rank(rank, size, info)
    try:
        n = 10 * chunk // 4  # float32: ten chunks
        for shift in (-3 * chunk // 4 - 1, -1, 1, chunk // 4 + 1):  # out starts before or inside the input
            memory = np.arange(n + abs(shift), dtype=np.float32) * (rank + 1)
            start = max(-shift, 0)
            x, out = memory[start:start + n], memory[start + shift:start + shift + n]
            values = x.copy()
            me.eq(f"all_reduce, out shifted by {shift}", me.comm.all_reduce(x, out=out), values / (rank + 1) * sum(
                r + 1 for r in range(size)))
            memory = np.arange(n + abs(shift), dtype=np.float32) + rank
            x, out = memory[start:start + n], memory[start + shift:start + shift + n]
            root_values = np.arange(n, dtype=np.float32) + start
            me.eq(f"broadcast, out shifted by {shift}", me.comm.broadcast(x, 0, out=out), root_values)
            memory = np.arange(n + abs(shift), dtype=np.float32) + 1
            x, out = memory[start:start + n], memory[start + shift:start + shift + n]
            values = x.copy()
            got = me.comm.reduce(x, out=out, op="max", root=0)
            if rank == 0:
                me.eq(f"reduce, out shifted by {shift}", got, values)
        in_place = np.arange(n, dtype=np.float32)
        me.eq("all_reduce in place", me.comm.all_reduce(in_place, out=in_place),
              np.arange(n, dtype=np.float32) * size)
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("staging", ["direct", "pinned"])
def test_an_out_that_overlaps_the_input(monkeypatch: pytest.MonkeyPatch, staging: str) -> None:
    # Chunks are written out before later ones are read in: an out= starting inside the input
    # must not overwrite what is still to be read (NumPy's own functions behave as if on a copy).
    monkeypatch.setattr(hcclpy.host, "CHUNK_BYTES", 1024)
    run(2, _overlapping_out, 1024, staging=staging)


def test_staging_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = "pinned" if hcclpy.backend() == "cann" else "direct"
    monkeypatch.delenv("HCCLPY_HOST_STAGING", raising=False)
    assert hcclpy.host.staging_mode() == auto
    for value, expected in (("pinned", "pinned"), (" Direct ", "direct"), ("", auto), ("auto", auto)):
        monkeypatch.setenv("HCCLPY_HOST_STAGING", value)
        assert hcclpy.host.staging_mode() == expected, value
    monkeypatch.setenv("HCCLPY_HOST_STAGING", "dma")
    with pytest.raises(ValueError, match=r"HCCLPY_HOST_STAGING is 'dma'; use one of auto, pinned, direct"):
        hcclpy.host.staging_mode()


# ------------------------------------------------------------------------- steady state

def _steady_state(rank: int, size: int, info: bytes, chunk_small: bool) -> List[str]:
    me = Rank(rank, size, info)
    try:
        r, n = rank, size
        big = np.arange(4096, dtype=np.float32) + r
        calls: List[Tuple[str, Callable[[], Any]]] = [
            ("all_reduce", lambda: me.comm.all_reduce(big, out=np.empty_like(big))),
            ("broadcast", lambda: me.comm.broadcast(big, 0)),
            ("reduce", lambda: me.comm.reduce(big, root=n - 1)),
            ("all_gather", lambda: me.comm.all_gather(big[:100])),
            ("reduce_scatter", lambda: me.comm.reduce_scatter(big[:8 * n])),
            ("all_to_all", lambda: me.comm.all_to_all(big[:4 * n])),
            ("scatter", lambda: me.comm.scatter(big[:2 * n], root=0)),
            ("all_gather_v", lambda: me.comm.all_gather_v(big[:r + 1], list(range(1, n + 1)))),
            ("batch_send_recv", lambda: me.comm.batch_send_recv(
                [("send", big[:10], (r + 1) % n), ("recv", np.empty(10, np.float32), (r - 1) % n)])),
            ("barrier", lambda: hcclpy.host.barrier(me.comm)),
        ]
        for name, call in calls:
            call()  # the first call may allocate
            state = me.comm._host_state
            before, pinned = dict(state._buffers), list(state._host)
            stream = state.stream
            for _ in range(3):
                call()
            after = me.comm._host_state
            me.check(name, after is state and after.stream is stream, "the staging state or stream was replaced")
            me.check(name, set(after._buffers) == set(before) and
                     all(after._buffers[k] is v for k, v in before.items()),
                     f"new device scratch: {sorted(before)} -> {sorted(after._buffers)}")
            me.check(name, all(a is b for a, b in zip(after._host, pinned)), "new pinned host buffers")
        # A smaller call after the larger ones reuses what is there.
        before = dict(me.comm._host_state._buffers)
        me.comm.all_reduce(big[:3])
        me.check("smaller", all(me.comm._host_state._buffers[k] is v for k, v in before.items()),
                 "a smaller call allocated")
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("staging", ["direct", "pinned"])
@pytest.mark.parametrize("chunk_small", [False, True], ids=["whole", "chunked"])
def test_steady_state_allocates_no_device_scratch(monkeypatch: pytest.MonkeyPatch, chunk_small: bool,
                                                  staging: str) -> None:
    if chunk_small:
        monkeypatch.setattr(hcclpy.host, "CHUNK_BYTES", 1024)
    run(2, _steady_state, chunk_small, staging=staging)


def _destroy_frees_staging(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    me.comm.all_reduce(np.ones(10))
    state = me.comm._host_state
    problems = me.close()
    if me.comm._host_state is not None or state._buffers or not state.stream.closed:
        problems.append("destroy left the staging buffers or stream alive")
    if any(state._host) or not all(event.closed for event in state.events):
        problems.append("destroy left the pinned buffers or their events alive")
    return problems


@pytest.mark.parametrize("staging", ["direct", "pinned"])
def test_destroy_releases_the_staging(staging: str) -> None:
    run(2, _destroy_frees_staging, staging=staging)


def _release_and_go_on(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        device = me.comm.device
        free_before = device.memory_info()[0]
        big = np.ones(4 << 20, dtype=np.float32)  # 16 MiB staged whole by all_gather: 16 + 32 MiB of scratch
        me.comm.all_gather(big)
        state = me.comm._host_state
        grown = free_before - device.memory_info()[0]
        hcclpy.host.release(me.comm)
        me.check("release", me.comm._host_state is None and not state._buffers and state.stream.closed,
                 "the staging buffers or stream are still there")
        given_back = device.memory_info()[0] - (free_before - grown)
        me.check("memory given back", given_back >= 48 << 20, f"{grown} bytes grown, {given_back} given back")
        me.eq("all_reduce after release", me.comm.all_reduce(np.ones(3, np.float32)),
              np.full(3, size, np.float32))
        hcclpy.host.release(me.comm)
        hcclpy.host.release(me.comm)  # twice: nothing to give back
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
        blocks = np.full(4 * n - 2, -1.0)
        for r in range(n):
            blocks[4 * r: 4 * r + 2] = r
        gapped = np.where(blocks == -1.0, 0.0, blocks)
        out = np.full(4 * n - 2, -1.0)
        me.same("all_gather_v into out=", comm.all_gather_v(np.full(2, float(rank)), counts, recv_displs=displs,
                                                            out=out), out)
        me.eq("all_gather_v gaps keep out's values", out, blocks)
        me.eq("all_gather_v new result, gaps are zeros",
              comm.all_gather_v(np.full(2, float(rank)), counts, recv_displs=displs), gapped)
        me.eq("all_to_all_v new result, gaps are zeros",
              comm.all_to_all_v(np.full(2 * n, float(rank)), counts, counts, recv_displs=displs), gapped)
        packed = np.empty(2 * n)
        me.same("all_to_all_v out=", comm.all_to_all_v(np.full(2 * n, float(rank)), counts, counts, out=packed),
                packed)
        me.eq("all_to_all_v out= values", packed, np.repeat(np.arange(n, dtype=np.float64), 2))
        mine = np.empty(2)
        me.same("reduce_scatter_v out=", comm.reduce_scatter_v(np.ones(2 * n), counts, out=mine), mine)
        me.eq("reduce_scatter_v out= values", mine, np.full(2, float(n)))
        matrix = [[1] * n for _ in range(n)]
        received = np.empty(n)
        me.same("all_to_all_vc out=", comm.all_to_all_vc(np.full(n, float(rank)), matrix, out=received), received)
        me.eq("all_to_all_vc out= values", received, np.arange(n, dtype=np.float64))
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 3])
def test_uneven_operations_write_only_their_blocks_and_take_out(size: int) -> None:
    run(size, _uneven_results_in_place)


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
# A second chunk buffer no longer fits: the all_gather's idle receive scratch is given back for it.
assert (comm.all_reduce(np.ones(1 << 20)) == 1).all()
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
    assert done.stdout.strip() == "['next', 'send']"


@given(st.integers(1, 1 << 40))
@settings(deadline=None, database=None)
def test_scratch_sizes_waste_at_most_an_eighth(nbytes: int) -> None:
    size = hcclpy.host._size_class(nbytes)
    assert nbytes <= size <= max(nbytes * 9 // 8, 8)
    assert hcclpy.host._size_class(size) == size  # a size class holds itself: no growth on the next call


@pytest.mark.timeout(60)
def test_a_call_that_waited_while_release_closed_the_staging_takes_a_new_one() -> None:
    """A call that found the staging just before release() closed it (while the call waited for its
    lock) must not run on the closed one."""
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.all_reduce(np.ones(3))
        stale = comm._host_state
        stale.lock.acquire()  # as a NumPy call on this thread would hold it
        results: List[Any] = []
        waiter = threading.Thread(target=lambda: results.append(comm.all_reduce(np.arange(3.0))), daemon=True)
        waiter.start()
        time.sleep(0.1)  # (only so that the waiter is likely to wait for the stale staging's lock)
        # Held by this thread: release() cannot close it now, the holder does when it lets go.
        assert hcclpy.host.release(comm) is False and not stale.closed
        hcclpy.host._unlock(stale)
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
    # The handler runs at a known point: inside the chunk callback of a staged call, which holds
    # the staging's lock.
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    staging_held = []

    def handler(signum, frame):
        lock = comm._host_state.lock
        staging_held.append(lock._is_owned() if hasattr(lock, "_is_owned") else lock.locked())
        comm.destroy(timeout=1)

    signal.signal(signal.SIGTERM, handler)
    data = np.ones(1 << 20, np.float32)  # 4 MiB: two chunks
    address = data.__array_interface__["data"][0]

    def run(chunk, _, stream):
        if not staging_held:
            signal.raise_signal(signal.SIGTERM)
        collectives.all_reduce(comm, chunk, None, stream=stream)

    comm.all_reduce(np.ones(4, np.float32))  # makes the staging
    staging = comm._host_state
    try:
        hcclpy.host.staged_elementwise(comm, address, address, data.size, hcclpy.DataType.FP32, run)
    except ValueError as exc:  # the next chunk found the communicator destroyed
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
    while True:
        comm.all_reduce(np.ones(1 << 20, np.float32))
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
    (lambda c, a: c.all_gather_v(a, [3]), r"^recv_counts\[0\] = 3 must equal this rank's send count: array has 4 "
                                          r"elements$"),
    (lambda c, a: c.reduce_scatter_v(a, [5]), r"^send_counts address 5 elements, but array has 4$"),
    (lambda c, a: c.reduce_scatter_v(a, [3], send_displs=[2]), r"^send_counts and send_displs address 5 elements"),
    (lambda c, a: c.all_to_all_v(a, [5], [4]), r"^send_counts address 5 elements, but array has 4$"),
    (lambda c, a: c.all_to_all_vc(a, [[5]]), r"^row 0 of send_count_matrix sends 5 elements, but array has 4$"),
], ids=["all_gather_v", "reduce_scatter_v", "reduce_scatter_v-displs", "all_to_all_v", "all_to_all_vc"])
def test_uneven_counts_of_complex_arrays_are_checked_in_their_elements(one_rank: Any, call: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        call(one_rank, np.arange(4, dtype=np.complex64))


@pytest.mark.parametrize("counts, displs, pattern", [
    ([1], [2**34], r"address \d+ elements of float64 \(\d+ bytes\), more than device 0 holds"),
    ([2**34], None, r"address \d+ elements of float64 \(\d+ bytes\), more than device 0 holds"),
    ([1], [2**63], r"^recv_displs holds a value above HCCL's largest supported count"),
    ([2**40], None, r"^recv_counts holds a value above HCCL's largest supported count")])
def test_uneven_results_too_large_for_the_device_are_refused(one_rank: Any, counts: List[int],
                                                             displs: Optional[List[int]], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        hcclpy.host.all_to_all_v(one_rank, np.ones(1), [1], counts, recv_displs=displs)


@pytest.mark.parametrize("bad", ["a", 5, [-8], [[1]]])
@pytest.mark.parametrize("function, argument", [("all_gather_v", "recv_counts"), ("reduce_scatter_v", "send_counts")])
def test_host_functions_check_their_counts(one_rank: Any, bad: Any, function: str, argument: str) -> None:
    with pytest.raises(ValueError, match=rf"^{argument} must "):
        getattr(hcclpy.host, function)(one_rank, np.ones(1), bad)


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


def test_carrier_type_refuses_an_unknown_op() -> None:
    assert hcclpy.host.carrier_type(np.float32, op="avg") is None
    assert hcclpy.host.carrier_type(np.float32, op="max") is hcclpy.DataType.FP32


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
            got = (me.comm.all_to_all_vc(mine, m) if kind == "all_to_all_vc"
                   else me.comm.all_to_all_v(mine, list(m[rank]), list(m[:, rank])))
            me.eq(tag, got, want)
        elif kind == "all_gather_v":
            counts = [int(c) for c in m[0]]
            xs = [make_input(tag, j, counts[j], dtype) for j in range(size)]
            me.eq(tag, me.comm.all_gather_v(arrange(xs[rank], (counts[rank],), layout), counts), np.concatenate(xs))
        else:
            counts = [int(c) for c in m[0]]
            xs = [make_input(tag, j, sum(counts), dtype, op) for j in range(size)]
            start = sum(counts[:rank])
            want = reduce_reference(xs, op, dtype)[start:start + counts[rank]]
            me.eq(tag, me.comm.reduce_scatter_v(arrange(xs[rank], (sum(counts),), layout), counts, op=op), want)
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

def _errors(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    comm = me.comm
    x = np.arange(2 * size * 3, dtype=np.float32).reshape(2 * size, 3)
    readonly = np.zeros_like(x)
    readonly.flags.writeable = False
    strided_out = np.zeros((2 * size, 6), dtype=np.float32)[:, ::2]
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("read-only out", lambda: comm.all_reduce(x, out=readonly), ValueError, r"out is read-only"),
        ("non-contiguous out", lambda: comm.all_reduce(x, out=strided_out), ValueError, r"out must be C-contiguous"),
        ("out dtype", lambda: comm.all_reduce(x, out=np.zeros_like(x, dtype=np.float64)), TypeError,
         r"out\.dtype is float64, the result is float32"),
        ("out size", lambda: comm.all_reduce(x, out=np.zeros(5, np.float32)), ValueError, r"out has 5 elements"),
        ("out not an array", lambda: comm.all_reduce(x, out=[0.0] * x.size), TypeError, r"out must be a numpy"),
        ("broadcast out size", lambda: comm.broadcast(x, 0, out=np.zeros(3, np.float32)), ValueError, r"out has 3"),
        ("reduce out dtype", lambda: comm.reduce(x, out=np.zeros(x.shape, np.int32), root=rank), TypeError,
         r"out\.dtype"),
        ("all_gather out size", lambda: comm.all_gather(x, out=np.zeros(5, np.float32)), ValueError,
         r"out has 5 elements"),
        ("reduce_scatter out", lambda: comm.reduce_scatter(x, out=readonly[:2]), ValueError, r"out is read-only"),
        ("scatter out", lambda: comm.scatter(x, root=rank, out=np.zeros((2, 3), np.float64)), TypeError,
         r"out\.dtype"),
        ("list input", lambda: hcclpy.host.all_reduce(comm, [1.0, 2.0]), TypeError,
         r"array must be a numpy\.ndarray, got list"),
        ("list through the method", lambda: comm.all_reduce([1.0, 2.0]), TypeError, r"send"),
        ("scalar input", lambda: hcclpy.host.broadcast(comm, 3.0), TypeError, r"array must be a numpy\.ndarray"),
        ("object dtype", lambda: comm.all_reduce(np.array([1, "a"], dtype=object)), TypeError, r"array\.dtype"),
        ("recv list", lambda: hcclpy.host.recv(comm, [0.0], 0), TypeError, r"array must be a numpy"),
        ("recv from itself", lambda: comm.recv(np.zeros(3), rank), ValueError, r"peer=\d+ is this rank"),
        ("scatter without out", lambda: hcclpy.host.scatter(comm, None, root=(rank + 1) % size), ValueError,
         r"array on the root, and out"),
        ("scatter with nothing", lambda: comm.scatter(None, root=(rank + 1) % size), TypeError,
         r"ranks other than the root pass out="),
        ("reduce_scatter_v counts", lambda: comm.reduce_scatter_v(x, [1] * (size + 1)), ValueError,
         rf"send_counts must hold {size} non-negative ints? \(one per rank\), got \[1"),
        ("all_gather_v negative count", lambda: comm.all_gather_v(x, [-1] * size), ValueError,
         r"recv_counts must not contain negative counts"),
        ("all_gather_v no counts", lambda: comm.all_gather_v(x, None), ValueError, r"recv_counts must hold .*got None"),
        ("all_gather_v out twice", lambda: comm.all_gather_v(x, np.zeros(x.size * size, np.float32), [x.size] * size,
                                                             out=np.zeros(x.size * size, np.float32)), TypeError,
         r"output array is given twice"),
        ("all_to_all_v displacements", lambda: comm.all_to_all_v(x, [0] * size, [0] * size, recv_displs=[-1] * size),
         ValueError, r"recv_displs must not contain negative"),
        ("all_to_all_vc matrix", lambda: comm.all_to_all_vc(x, np.ones((size + 1, size), np.int64)), ValueError,
         r"send_count_matrix must be"),
        ("all_to_all_vc float matrix", lambda: comm.all_to_all_vc(x, np.ones((size, size))), ValueError,
         r"send_count_matrix must be a \d+ x \d+ matrix of non-negative ints"),
        ("op as a float", lambda: comm.all_reduce(x, op=2.0), ValueError, r"op=2\.0 is not a reduce operation"),
        ("op of an empty array", lambda: comm.all_reduce(np.empty(0), op="avg"), ValueError, r"op='avg'"),
        ("root of an empty array", lambda: comm.broadcast(np.empty(0), root=size), ValueError,
         rf"root={size} must be a rank"),
        ("not a communicator", lambda: hcclpy.host.all_reduce(object(), x), TypeError, r"comm must be"),
    ]
    if size > 1:
        odd = np.zeros((2 * size + 1, 3), np.float32)
        cases += [
            ("reduce_scatter first axis", lambda: comm.reduce_scatter(odd), ValueError,
             rf"first axis.*multiple of {size}.*\({2 * size + 1}, 3\)"),
            ("all_to_all first axis", lambda: comm.all_to_all(odd), ValueError, r"first axis"),
            ("scatter first axis", lambda: comm.scatter(odd, root=rank), ValueError, r"first axis"),
            ("recv read-only", lambda: comm.recv(readonly, (rank + 1) % size), ValueError, r"array is read-only"),
            ("recv non-contiguous", lambda: comm.recv(strided_out, (rank + 1) % size), ValueError,
             r"array must be C-contiguous"),
        ]
    cases += [  # last: batch_send_recv sets up its staging stream before it looks at the items
        ("batch item", lambda: comm.batch_send_recv([("put", x, 0)]), ValueError, r"items\[0\]"),
        ("batch read-only recv", lambda: hcclpy.host.batch_send_recv(comm, [("recv", readonly, 0)]), ValueError,
         r"items\[0\] array is read-only"),
    ]
    try:
        for name, call, kind, pattern in cases:
            me.refused(name, call, kind, pattern)
            # Refused before any device work (batch_send_recv makes its stream first: harmless).
            me.check(name, comm._host_state is None or name.startswith("batch"),
                     "the refusal came after device staging was set up")
        # The communicator still works.
        me.eq("after errors", comm.all_reduce(np.ones(4, np.int32)), np.full(4, size, np.int32))
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("size", [1, 2])
def test_argument_errors(size: int) -> None:
    run(size, _errors)


def _in_a_group(call: Callable[[], Any]) -> None:
    with hcclpy.group():
        call()


def _inside_a_group(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        x = np.full(4, rank + 1, dtype=np.float32)
        calls = (("all_reduce", lambda: me.comm.all_reduce(x)), ("all_gather", lambda: me.comm.all_gather(x)),
                 ("host barrier", lambda: hcclpy.host.barrier(me.comm)))
        for name, call in calls:
            me.refused(name, lambda: _in_a_group(call), RuntimeError, r"inside hcclpy\.group\(\)")
        me.eq("all_reduce after the group", me.comm.all_reduce(x), np.full(4, size * (size + 1) / 2, np.float32))
    finally:
        me.close()
    return me.problems


def test_numpy_calls_are_refused_inside_a_group() -> None:
    # Inside a group the operations run at its end, but a NumPy call copies its result out at
    # once: it returned its own input (all_reduce) or zeros (all_gather) before this was refused.
    run(2, _inside_a_group, timeout=60)


def _destroyed(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    me.comm.destroy()
    try:
        me.comm.all_reduce(np.ones(2))
    except ValueError as exc:
        return [] if "destroyed" in str(exc) else [f"message: {exc}"]
    return ["all_reduce on a destroyed communicator did not raise"]


def test_destroyed_communicator() -> None:
    run(1, _destroyed)


# ------------------------------------------------------------------------------ known bugs

def _zero_dimensional(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        x = np.array(rank + 1, dtype=np.float32)
        got = me.comm.all_reduce(x)
        me.check("all_reduce 0-d", got.shape == (), f"shape {got.shape}, expected ()")
        gathered = me.comm.all_gather(x)
        me.check("all_gather 0-d", gathered.shape == (size,), f"shape {gathered.shape}, expected ({size},)")
    finally:
        me.close()
    return me.problems


def test_zero_dimensional_arrays_keep_their_shape() -> None:
    run(2, _zero_dimensional)


def _nothing_to_contribute(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        counts = [0, 3]  # rank 0 contributes nothing
        got = me.comm.all_gather_v(np.arange(counts[rank], dtype=np.float32) + 10, counts)
        me.eq("all_gather_v", got, np.arange(3, dtype=np.float32) + 10)
    finally:
        me.close()
    return me.problems


def test_a_rank_with_nothing_to_contribute() -> None:
    run(2, _nothing_to_contribute, timeout=30)


def _memmap_input(rank: int, size: int, info: bytes, path: str) -> List[str]:
    me = Rank(rank, size, info)
    try:
        weights = np.load(path, mmap_mode="r")  # a numpy.memmap, a subclass of numpy.ndarray
        me.eq("memmap", me.comm.all_reduce(weights), np.arange(6, dtype=np.float32) * size)
    finally:
        me.close()
    return me.problems


def test_ndarray_subclasses_take_the_numpy_path(tmp_path: Any) -> None:
    path = os.path.join(str(tmp_path), "weights.npy")
    np.save(path, np.arange(6, dtype=np.float32))
    run(2, _memmap_input, path)


def _foreign_byte_order(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    try:
        values = np.arange(6, dtype=np.float32) + rank
        swapped = values.astype(values.dtype.newbyteorder("S"))  # the same values, stored the other way
        want = sum(np.arange(6, dtype=np.float32) + r for r in range(size))
        me.eq("all_reduce", me.comm.all_reduce(swapped), want)
        me.eq("all_reduce (strided)", me.comm.all_reduce(np.repeat(swapped, 2)[::2]), want)
        me.eq("broadcast", me.comm.broadcast(swapped, 0), np.arange(6, dtype=np.float32))
        me.eq("all_gather", me.comm.all_gather(swapped),
              np.stack([np.arange(6, dtype=np.float32) + r for r in range(size)]))
        device = hcclpy.from_numpy(swapped, device=me.comm.device)
        me.eq("from_numpy", device.to_numpy(), values)
        refusals = [
            ("out=", lambda: me.comm.all_reduce(values, out=np.empty_like(swapped)),
             r"^out\.dtype is '[<>]f4', the result's dtype in the other byte order: .* pass an out of dtype float32$"),
            ("recv into", lambda: me.comm.recv(np.empty_like(swapped), (rank + 1) % size), r"byte order"),
            ("copy_from", lambda: device.copy_from(swapped),
             r"src\.dtype='[<>]f4' is not in this machine's byte order"),
            ("copy_to", lambda: device.copy_to(np.empty_like(swapped)), r"dst\.dtype=.*byte order"),
            ("empty", lambda: hcclpy.empty(2, swapped.dtype, device=me.comm.device), r"byte order"),
        ]
        for name, call, pattern in refusals:
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

        counts = (list(m[rank]), list(m[:, rank]))
        me.eq("all_to_all_v", me.comm.all_to_all_v(xs[rank], *counts, send_displs=send_displs[rank],
                                                   recv_displs=recv_displs), received(0))
        out = np.full(received(0).size, 7 - 7j, dtype=np_dtype(dtype))
        got = hcclpy.host.all_to_all_v(me.comm, xs[rank], *counts, out=out, send_displs=send_displs[rank],
                                       recv_displs=recv_displs)
        me.same("all_to_all_v out=", got, out)
        me.eq("all_to_all_v out= (the gaps keep their values)", out, received(7 - 7j))

        gathered_displs = [4 * r + 1 for r in range(size)]
        mine = any_input("gather", rank, 3, dtype)
        got = me.comm.all_gather_v(mine, [3] * size, recv_displs=gathered_displs)
        me.eq("all_gather_v", np.stack([got[d:d + 3] for d in gathered_displs]),
              np.stack([any_input("gather", r, 3, dtype) for r in range(size)]))

        sums = [any_input("rsv", r, 4 * size, dtype, "sum") for r in range(size)]
        total = reduce_reference(sums, "sum", dtype)
        counts_v, displs_v = [1 + r % 3 for r in range(size)], [4 * r for r in range(size)]
        me.eq("reduce_scatter_v", me.comm.reduce_scatter_v(sums[rank], counts_v, send_displs=displs_v),
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
        scalar("complex all_reduce 0-d", me.comm.all_reduce(x), want)
        out = np.zeros((), np.complex64)
        me.same("complex all_reduce 0-d out=", me.comm.all_reduce(x, out=out), out)
        scalar("complex all_reduce 0-d out=", out, want)
        me.eq("complex all_gather 0-d", me.comm.all_gather(x),
              np.array([1 + 2j * r for r in range(size)], dtype=np.complex64))
        scalar("complex broadcast 0-d", me.comm.broadcast(x, 1), np.array(1 + 2j, np.complex64))
        got = me.comm.reduce(x.astype(np.complex128), root=0)
        if rank == 0:
            scalar("complex128 reduce 0-d", got, want.astype(np.complex128))
        flag = np.array(rank == 1)
        me.eq("bool all_gather 0-d", me.comm.all_gather(flag), np.arange(size) == 1)
        scalar("bool broadcast 0-d", me.comm.broadcast(flag, 1), np.array(True))
        me.refused("complex reduce_scatter 0-d", lambda: me.comm.reduce_scatter(x), ValueError,
                   r"first axis of array into \d+ blocks, but array is 0-d \(shape \(\)\)")
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
        me.eq("complex all_reduce", me.comm.all_reduce(swapped),
              sum(np.array([1 + 2j, 3 - 4j, r * 1j], np.complex64) for r in range(size)))
        names = np.array(["ab", "cde", str(rank)], dtype="U3")
        other = names.astype(names.dtype.newbyteorder("S"))
        me.eq("strings all_gather", me.comm.all_gather(other),
              np.array([["ab", "cde", str(r)] for r in range(size)], dtype="U3"))
        record = np.dtype([("a", "i4"), ("b", "f8")])
        rows = np.array([(rank, 0.5), (7, -1.0)], dtype=record)
        me.eq("structured broadcast", me.comm.broadcast(rows.astype(record.newbyteorder("S")), 0),
              np.array([(0, 0.5), (7, -1.0)], dtype=record))
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
def test_other_dtypes_in_the_other_byte_order_are_converted() -> None:
    run(2, _foreign_order_others)


class _CallRecorder:
    """Stands for a communicator's C library and writes down every function asked for."""

    def __init__(self, real: Any) -> None:
        self.real, self.called = real, []

    def __getattr__(self, name: str) -> Any:
        self.called.append(name)
        return getattr(self.real, name)


def _dtype_refusals(rank: int, size: int, info: bytes) -> List[str]:
    me = Rank(rank, size, info)
    comm, peer = me.comm, (rank + 1) % size
    three = np.arange(3, dtype=np.complex64)
    blocks_ = np.zeros(2 * size, np.complex128)
    objects = np.array([1, "a"], dtype=object)
    bytes_only = (r"the dtypes that reduce are int8, .* and bfloat16 \(HCCL's types\), and complex64 and "
                  r"complex128 with sum$")
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("complex max", lambda: comm.all_reduce(three, op="max"), ValueError,
         r"^all_reduce with op=max is not supported on complex64 arrays: complex arrays reduce with sum only$"),
        ("complex prod", lambda: comm.reduce(blocks_, op=hcclpy.ReduceOp.PROD, root=0), ValueError,
         r"^reduce with op=prod is not supported on complex128 arrays: complex arrays reduce with sum only$"),
        ("complex min", lambda: comm.reduce_scatter(blocks_, op="min"), ValueError,
         r"^reduce_scatter with op=min is not supported on complex128 arrays"),
        ("complex max, uneven", lambda: comm.reduce_scatter_v(three, [1] * size, op=2), ValueError,
         r"^reduce_scatter_v with op=max is not supported on complex64 arrays"),
        ("bool sum", lambda: comm.all_reduce(np.ones(3, bool)), TypeError,
         r"^all_reduce cannot reduce bool arrays, which travel as bytes: " + bytes_only),
        ("datetime reduce", lambda: comm.reduce(np.zeros(2, "M8[s]"), root=0), TypeError,
         r"^reduce cannot reduce datetime64\[s\] arrays"),
        ("structured reduce_scatter", lambda: comm.reduce_scatter(np.zeros(2 * size, "i4,f4")), TypeError,
         r"^reduce_scatter cannot reduce \[\('f0', '<i4'\), \('f1', '<f4'\)\] arrays"),
        ("strings reduce_scatter_v", lambda: comm.reduce_scatter_v(np.zeros(size, "U2"), [1] * size), TypeError,
         r"^reduce_scatter_v cannot reduce <U2 arrays"),
        ("clongdouble sum", lambda: comm.all_reduce(np.zeros(2, np.clongdouble)), TypeError,
         r"cannot reduce complex\d+ arrays, which travel as bytes"),
        ("object all_reduce", lambda: comm.all_reduce(objects), TypeError,
         r"^array\.dtype is object, which holds Python objects: .* mean nothing in another process"),
        ("object broadcast", lambda: comm.broadcast(objects, 0), TypeError, r"^array\.dtype is object"),
        ("object field", lambda: comm.all_gather(np.zeros(2, [("x", "f4"), ("o", "O")])), TypeError,
         r"^array\.dtype is \[\('x', '<f4'\), \('o', 'O'\)\], which holds Python objects"),
        ("object send", lambda: comm.send(objects, peer), TypeError, r"^array\.dtype is object"),
        ("object recv", lambda: comm.recv(np.empty(2, object), peer), TypeError, r"^array\.dtype is object"),
        ("object scatter out", lambda: comm.scatter(None, root=peer, out=np.empty(1, object)), TypeError,
         r"^out\.dtype is object"),
        ("empty elements", lambda: comm.all_gather(np.zeros(3, "V0")), TypeError,
         r"^array\.dtype is \|V0, whose elements have no bytes"),
        ("no fields", lambda: comm.broadcast(np.zeros(3, []), 0), TypeError, r"whose elements have no bytes"),
        ("complex split mid-element", lambda: comm.reduce_scatter(three), ValueError,
         rf"^reduce_scatter splits the first axis of array into {size} blocks: .* got shape \(3,\)$"),
        ("complex all_to_all", lambda: comm.all_to_all(three), ValueError, r"got shape \(3,\)$"),
        ("complex scatter", lambda: comm.scatter(three, root=rank), ValueError, r"got shape \(3,\)$"),
        ("bool all_to_all", lambda: comm.all_to_all(np.ones(3, bool)), ValueError, r"got shape \(3,\)$"),
        ("out of another complex", lambda: comm.all_reduce(three, out=np.zeros(3, np.complex128)), TypeError,
         r"^out\.dtype is complex128, the result is complex64$"),
        ("out of the parts", lambda: comm.all_gather(three, out=np.zeros((size, 3, 2), np.float32)), TypeError,
         r"^out\.dtype is float32, the result is complex64$"),
        ("recv in the other byte order", lambda: comm.recv(np.zeros(3, three.dtype.newbyteorder("S")), peer),
         TypeError, r"not in this machine's byte order"),
        ("object batch", lambda: comm.batch_send_recv([("send", three, peer), ("recv", np.empty(2, object), peer)]),
         TypeError, r"^items\[1\] array\.dtype is object"),
    ]
    try:
        _refused_before_c(me, cases)
        me.check("staging", comm._host_state is None, "a refusal came after device staging was set up")
        # Every rank refused every call: the communicator is still in step.
        me.eq("complex all_reduce after the refusals", comm.all_reduce(three),
              np.arange(3, dtype=np.complex64) * size)
    finally:
        me.close()
    return me.problems


def _refused_before_c(me: Rank, cases: Sequence[Tuple[str, Callable[[], Any], type, str]]) -> None:
    """Each case ``(name, call, exception type, message pattern)`` must raise before any C call."""
    recorder = _CallRecorder(me.comm._api)
    try:
        me.comm._api = recorder
        for name, call, kind, pattern in cases:
            me.refused(name, call, kind, pattern)
            me.check(name, not recorder.called, f"the refused call reached C: {recorder.called}")
    finally:
        me.comm._api = recorder.real


@pytest.mark.timeout(60)
def test_dtypes_that_cannot_travel_or_reduce_are_refused_before_any_c_call() -> None:
    run(2, _dtype_refusals, timeout=50)


def _kind_refusals(rank: int, size: int, info: bytes) -> List[str]:
    """Calls every rank makes alike, refused alike on every rank before any C call."""
    me = Rank(rank, size, info)
    comm, peer = me.comm, (rank + 1) % size
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    buf = np.zeros(4)
    cases: List[Tuple[str, Callable[[], Any], type, str]] = [
        ("masked input", lambda: comm.all_reduce(masked), TypeError,
         r"^array is a masked array: hcclpy moves data, not masks, .* pass array\.filled\(value\) or array\.data$"),
        ("masked out", lambda: comm.all_reduce(np.ones(2), out=masked), TypeError,
         r"^out is a masked array: .* pass out\.data to write its data$"),
        ("masked recv", lambda: comm.recv(masked, peer), TypeError, r"^array is a masked array"),
        ("op where recv goes", lambda: comm.all_reduce(np.ones(2), "max"), TypeError,
         r"^recv is 'max', which names a reduce op: recv comes before op; pass op='max'$"),
        ("ReduceOp where recv goes", lambda: comm.reduce_scatter(np.ones(2 * size), hcclpy.ReduceOp.MIN), TypeError,
         r"^recv is <ReduceOp\.MIN: 3>, which names a reduce op"),
        ("a list where recv goes", lambda: comm.all_reduce(np.ones(2), [1]), TypeError,
         r"^recv must be a numpy\.ndarray \(or None\) when send is one"),
        # reduce's out is written on the root only, but checked on every rank that passes one.
        ("reduce out of the wrong dtype", lambda: comm.reduce(np.ones(3), out=np.empty(3, np.int8), root=peer),
         TypeError, r"^out\.dtype is int8, the result is float64$"),
        ("two receives into one array", lambda: comm.batch_send_recv(
            [("send", buf, peer), ("recv", buf[2:], peer), ("recv", np.ones(1), peer), ("recv", buf[:3], peer)]),
         ValueError, r"^items\[1\] and items\[3\] receive into the same memory: each receive of a batch needs "
                     r"memory of its own$"),
    ]
    try:
        _refused_before_c(me, cases)
        # A receive may share memory with a send: sends are staged before anything is received.
        sent = np.full(4, float(rank))
        comm.batch_send_recv([("send", sent, peer), ("recv", sent, (rank - 1) % size)])
        me.eq("receive into the array sent", sent, np.full(4, float((rank - 1) % size)))
        out = np.zeros(3)
        result = comm.reduce(np.ones(3), out=out, root=0)
        me.check("reduce with out on every rank", (result is out) == (rank == 0) and (rank == 0 or result is None),
                 f"returned {type(result).__name__} on rank {rank}")
        me.eq("a non-root's out is left alone", out, np.full(3, float(size)) if rank == 0 else np.zeros(3))
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(60)
def test_masked_arrays_misplaced_ops_and_outs_are_refused_alike_on_every_rank() -> None:
    run(2, _kind_refusals, timeout=50)


def _sizes_differ(rank: int, size: int, info: bytes, chunk: int) -> List[str]:
    hcclpy.host.CHUNK_BYTES = chunk
    me = Rank(rank, size, info)
    try:
        # Whole chunks of float32 on every rank, rank 0 one more: without the exchange of sizes the
        # others would pair their last chunk with rank 0's and return (rank 0 would then pair its
        # last chunk with their next call).
        step = chunk // 4
        count = step * (3 if rank == 0 else 2)
        sizes = ", ".join(f"rank {r}: {4 * step * (3 if r == 0 else 2)}" for r in range(size))
        for name, call in [("all_reduce", lambda: me.comm.all_reduce(np.ones(count, np.float32))),
                           ("broadcast", lambda: me.comm.broadcast(np.ones(count, np.float32), 0)),
                           ("reduce", lambda: me.comm.reduce(np.ones(count, np.float32), root=1))]:
            me.refused(name, call, ValueError,
                       rf"^the ranks passed arrays of different sizes \(bytes: {sizes}\); every rank must pass the "
                       r"same size$")
        me.eq("all_reduce of one size after", me.comm.all_reduce(np.ones(2 * step, np.float32)),
              np.full(2 * step, float(size), np.float32))
    finally:
        me.close()
    return me.problems


@pytest.mark.parametrize("staging", ["direct", "pinned"])
def test_ranks_staging_arrays_of_different_sizes_in_chunks_all_refuse_the_call(
        monkeypatch: pytest.MonkeyPatch, staging: str) -> None:
    monkeypatch.setattr(hcclpy.host, "CHUNK_BYTES", 4096)
    run(3, _sizes_differ, 4096, staging=staging)


@pytest.mark.parametrize(("dtype", "op", "carrier"), [
    ("float32", "max", hcclpy.DataType.FP32), ("complex64", "sum", hcclpy.DataType.FP32),
    ("complex128", None, hcclpy.DataType.FP64), (">c16", "sum", hcclpy.DataType.FP64),
    ("complex64", "max", None), ("bool", None, hcclpy.DataType.UINT8), ("bool", "sum", None),
    ("i4,U3", None, hcclpy.DataType.UINT8), ("M8[s]", None, hcclpy.DataType.UINT8), ("O", None, None),
    ("V0", None, None),
])
def test_carrier_type(dtype: str, op: Optional[str], carrier: Optional[hcclpy.DataType]) -> None:
    assert hcclpy.host.carrier_type(np.dtype(dtype), op) is carrier


def _profile_checks_the_carrier(rank: int, size: int, info: bytes) -> List[str]:
    """Rank body under the A3 profile: float32 sums, uint8 moves, no float64 reductions."""
    me = Rank(rank, size, info)
    try:
        xs = [any_input("profile", r, 2 * size, "complex64", "sum") for r in range(size)]
        total = reduce_reference(xs, "sum", "complex64")
        me.eq("complex64 all_reduce", me.comm.all_reduce(xs[rank]), total)
        me.eq("complex64 reduce_scatter_v", me.comm.reduce_scatter_v(xs[rank], [size, size]),
              total[rank * size:(rank + 1) * size])
        me.refused("complex128 all_reduce", lambda: me.comm.all_reduce(xs[rank].astype(np.complex128)), ValueError,
                   r"^all_reduce of fp64 with sum is not supported on the A3 profile \(HCCLPY_SIM_PROFILE=A3\)")
        me.refused("complex64 max", lambda: me.comm.all_reduce(xs[rank], op="max"), ValueError,
                   r"^all_reduce with op=max is not supported on complex64 arrays")
        me.refused("bool sum", lambda: me.comm.all_reduce(np.ones(2, bool)), TypeError, r"^all_reduce cannot reduce")
        me.refused("object", lambda: me.comm.broadcast(np.array([None]), 0), TypeError, r"^array\.dtype is object")
        flags = [any_input("flags", r, 3, "bool") for r in range(size)]
        me.eq("bool all_gather", me.comm.all_gather(flags[rank]), np.stack(flags))
        rows = [any_input("rows", r, 2, "i4,(2,)f8,U3,?") for r in range(size)]
        me.eq("structured broadcast", me.comm.broadcast(rows[rank], 1), rows[1])
    finally:
        me.close()
    return me.problems


@pytest.mark.timeout(180)
def test_product_profiles_check_the_type_that_carries_the_array() -> None:
    results = ranks.run_processes(_profile_checks_the_carrier, 2, env={"HCCLPY_SIM_PROFILE": "A3"}, timeout=150)
    assert results == [[], []], "\n".join(f"rank {r}: {text}" for r, texts in enumerate(results) for text in texts)


def test_a_profile_checks_the_carrier_of_an_array_moved_as_bytes() -> None:
    """Operations that move data take no reduce op: the profile is asked about the bytes' carrier
    (uint8), as it is about a reduction's."""
    from hcclpy.collectives import _ops

    class Recording:
        def __init__(self) -> None:
            self.checks: List[Any] = []

        def check(self, operation: str, dtype: Any, op: Any = None) -> None:
            self.checks.append((operation, dtype, op))

    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm._profile = Recording()
        _ops._before_staging(comm, "broadcast", np.dtype(bool), root=0)
        _ops._before_staging(comm, "all_reduce", np.dtype(np.complex64), op="sum")
        assert comm._profile.checks == [("broadcast", hcclpy.DataType.UINT8, None),
                                        ("all_reduce", hcclpy.DataType.FP32, "sum")]
    finally:
        comm._profile = None
        comm.destroy()



def _interrupted_while_the_peer_is_late(rank: int, size: int, info: bytes, folder: str) -> Dict[str, Any]:
    import signal
    from pathlib import Path

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    interrupted = Path(folder) / "interrupted"
    out: Dict[str, Any] = {}
    try:
        # One collective (an array of one chunk): interrupted, it stays queued and completes when
        # the peer comes, so the ranks stay in step.
        first = np.full(3000, rank + 1.0, np.float32)
        if rank == 0:
            # SIGINT while rank 1 has not called yet: it ends the wait for rank 1 with KeyboardInterrupt.
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            try:
                comm.all_reduce(first)
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
    import signal
    from pathlib import Path

    comm = hcclpy.Communicator(size, info, rank, device=rank)
    done = Path(folder) / "destroyed"
    if rank == 1:  # never calls: rank 0's collective stays queued until destroy aborts it
        assert ranks.wait_for(done.exists, 90), "rank 0 never destroyed its communicator"
        comm.destroy()
        return {}
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        comm.all_reduce(np.ones(3, np.float32))
    except KeyboardInterrupt:
        pass
    started = time.monotonic()
    try:
        comm.destroy(timeout=1)
        return {"destroyed": comm.destroyed, "seconds": time.monotonic() - started}
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


@pytest.mark.parametrize("staging", ["direct", "pinned"])
@pytest.mark.timeout(120)
def test_a_call_after_a_failed_one_is_told_the_communicator_failed(tmp_path: Any, staging: str) -> None:
    # The failed staging stream used to raise the first failure again, word for word, from every
    # later call: a loop that retries on timeouts never ended.
    (first, second), _ = ranks.run_processes(_called_again_after_a_failure, 2, str(tmp_path), timeout=100,
                                             env={"HCCL_EXEC_TIMEOUT": "2", "HCCLPY_HOST_STAGING": staging})
    assert "all_reduce #1 timed out" in first and first.startswith("AclTimeoutError"), first
    assert "has failed" in second and "destroy it and create a new one" in second, second


@pytest.mark.parametrize("staging", ["direct", "pinned"])
@pytest.mark.timeout(120)
def test_destroy_with_a_timeout_ends_the_collective_an_interrupt_left_queued(tmp_path: Any, staging: str) -> None:
    # Closing the staging stream used to wait for the queued collective in one C call: for
    # HCCL_EXEC_TIMEOUT (60 s here), whatever destroy's timeout.
    first, _ = ranks.run_processes(_destroyed_after_an_interrupt, 2, str(tmp_path), timeout=100,
                                   env={"HCCL_EXEC_TIMEOUT": "60", "HCCLPY_HOST_STAGING": staging})
    assert first["destroyed"] and first["seconds"] < 30, first


@pytest.mark.parametrize("staging", ["direct", "pinned"])
@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_numpy_call_whose_peer_is_late(tmp_path: Any, staging: str) -> None:
    # HCCL_EXEC_TIMEOUT of 60 s: without the interrupt, rank 0 would wait for rank 1, which waits for it.
    first, second = ranks.run_processes(_interrupted_while_the_peer_is_late, 2, str(tmp_path), timeout=100,
                                        env={"HCCL_EXEC_TIMEOUT": "60", "HCCLPY_HOST_STAGING": staging})
    assert first["interrupted"], first
    assert second["first"] == [3.0] * 3000  # rank 0's interrupted call still contributed its data
    assert first["second"] == second["second"] == [30.0] * 3000
