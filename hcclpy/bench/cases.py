"""What ``hcclpy bench`` measures for each operation: buffer sizes, the call, the expected result.

Sizes follow nccl-tests (``reference``: perf.md §2.1): the printed size S is the per-rank buffer for
all_reduce, reduce, broadcast and send_recv, rounded down to whole elements, and the whole buffer
(every rank's block) for all_gather, reduce_scatter, all_to_all, scatter and the uneven forms,
whose per-rank block is S / nranks aligned down to 16 bytes, so S is rounded down to a multiple
of 16 bytes × nranks (:func:`granularity`). Bus bandwidth is ``algbw × factor`` with nccl-tests'
factors (scatter's, (n-1)/n, from its scatter.cu; an uneven form's, its even form's), so numbers
compare across rank counts and with NCCL. HCCL broadcasts in place (one buffer), so broadcast's
out-of-place column times that same call (:data:`IN_PLACE_BY_NATURE`).

Inputs are small integers, exact in every data type, so checks compare exactly; bfloat16 is
written and read through its bit pattern (no ml_dtypes needed).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..collectives import (all_gather, all_gather_v, all_reduce, all_to_all, all_to_all_v, all_to_all_vc,
                           batch_send_recv, broadcast, reduce, reduce_scatter, reduce_scatter_v, scatter)
from ..runtime import DeviceArray, Stream, empty
from ..types import DataType, ReduceOp

__all__ = ["IN_PLACE_BY_NATURE", "OPERATIONS", "Case", "granularity", "make_case", "rounded_sizes"]

# operation -> (busbw factor as a function of n, whether a reduce op applies, whether a root applies,
#               whether S is the whole buffer of all ranks)
OPERATIONS: Dict[str, Tuple[Callable[[int], float], bool, bool, bool]] = {
    "all_reduce": (lambda n: 2 * (n - 1) / n, True, False, False),
    "reduce": (lambda n: 1.0, True, True, False),
    "broadcast": (lambda n: 1.0, False, True, False),
    "all_gather": (lambda n: (n - 1) / n, False, False, True),
    "reduce_scatter": (lambda n: (n - 1) / n, True, False, True),
    "all_to_all": (lambda n: (n - 1) / n, False, False, True),
    "scatter": (lambda n: (n - 1) / n, False, True, True),
    # The uneven forms with equal blocks, as hccl_test runs them: the same data as their even
    # forms, through the V interfaces (out of place only: their buffers must not overlap).
    "all_gather_v": (lambda n: (n - 1) / n, False, False, True),
    "reduce_scatter_v": (lambda n: (n - 1) / n, True, False, True),
    "all_to_all_v": (lambda n: (n - 1) / n, False, False, True),
    "all_to_all_vc": (lambda n: (n - 1) / n, False, False, True),
    "send_recv": (lambda n: 1.0, False, False, False),
}

# Operations whose HCCL call has one buffer: their out-of-place column times the in-place call
# again, so the average bus bandwidth counts it once.
IN_PLACE_BY_NATURE = frozenset({"broadcast"})


def granularity(operation: str, dtype: DataType, nranks: int) -> int:
    """The bytes every size of ``operation`` is a multiple of: one element of ``dtype``, or, where
    the size is every rank's block, ``nranks`` blocks of 16 bytes (nccl-tests aligns each rank's
    block down to 16 bytes, a whole number of elements of every type)."""
    return 16 * nranks if OPERATIONS[operation][3] else dtype.itemsize


def rounded_sizes(byte_sizes: List[int], operation: str, dtype: DataType, nranks: int) -> List[int]:
    """``byte_sizes`` rounded down to :func:`granularity`, as the rows show them, each once (two
    requested sizes can round to the same one: nccl-tests would measure it twice)."""
    unit = granularity(operation, dtype, nranks)
    return list(dict.fromkeys(size // unit * unit for size in byte_sizes))


def _values(dtype: DataType, float_values: np.ndarray) -> np.ndarray:
    """``float_values`` (small integers) as an array of ``dtype`` (bfloat16 as its bits, uint16)."""
    if dtype == DataType.BFP16:
        return (float_values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return float_values.astype(dtype.numpy)


def _as_float(dtype: DataType, raw: np.ndarray) -> np.ndarray:
    if dtype == DataType.BFP16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def _raw(array: DeviceArray) -> DeviceArray:
    """``array`` as NumPy can hold it: bfloat16 as its bits (uint16)."""
    return array.view(DataType.UINT16) if array.dtype == DataType.BFP16 else array


def _scrambled(count: int) -> np.ndarray:
    """A value in [0, 65536) per position that never repeats with a period (splitmix64's mixing
    of the position): a block in the wrong place differs from the right one at most positions,
    whatever the block size. Values that repeated every m positions let a collective that put
    the wrong block in place pass the check whenever blocks were a multiple of m elements."""
    x = np.arange(count, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) >> np.uint64(48)


def _pattern(rank: int, count: int, op: Optional[ReduceOp], nranks: int) -> np.ndarray:
    """Rank ``rank``'s input: small integers whose reduction over ranks stays exact in int8, that
    tell the reduce operations apart (and, for operations that only move data, the ranks), and
    that differ from position to position without a period (see :func:`_scrambled`)."""
    index, scrambled = np.arange(count), _scrambled(count)
    if op is None:
        # rank + nranks * (something mod m): values from different ranks differ at every position,
        # so data that stayed where it was (an all-to-all that moved nothing) is always caught.
        return (rank + nranks * (scrambled % max(120 // nranks, 1))).astype(np.float64)
    if op == ReduceOp.PROD:
        # Two ranks contribute more than 1 at each position: 2 or 3 and 2. Their product (4 or 6)
        # differs from the max, the min and, where the first is 3, the sum.
        first, second = index % nranks == rank, (index + 1) % nranks == rank
        return np.where(first, 2.0 + (scrambled >> np.uint64(15)), np.where(second & (nranks > 1), 2.0, 1.0))
    if op in (ReduceOp.MAX, ReduceOp.MIN):
        return ((3 * rank + scrambled) % 11).astype(np.float64)
    return ((rank + scrambled) % 5).astype(np.float64)


def _combine(inputs: list, op: ReduceOp) -> np.ndarray:
    stack = np.stack(inputs)
    if op == ReduceOp.SUM:
        return stack.sum(axis=0)
    if op == ReduceOp.PROD:
        return stack.prod(axis=0)
    return stack.max(axis=0) if op == ReduceOp.MAX else stack.min(axis=0)


class Case:
    """One operation at one size on one rank: buffers, the call (out of place or in place), the
    expected output, and the numbers the report needs."""

    def __init__(self, operation: str, comm: Any, nbytes: int, dtype: DataType, op: ReduceOp, root: int) -> None:
        factor, reduces, rooted, whole = OPERATIONS[operation]
        self.operation, self.comm, self.dtype = operation, comm, dtype
        self.op = op if reduces else None
        self.root = root if rooted else -1
        n = comm.size
        unit = granularity(operation, dtype, n)
        self.nbytes = nbytes // unit * unit
        self.block = self.nbytes // (n if whole else 1) // dtype.itemsize
        self.count = self.block  # the elements nccl-tests prints: each rank's
        self.factor = factor(n)
        # The uneven forms move what their even forms do.
        self._even = operation.removesuffix("_vc").removesuffix("_v")
        send_count = self.block * n if self._even in ("reduce_scatter", "all_to_all", "scatter") else self.block
        recv_count = self.block * n if self._even in ("all_gather", "all_to_all") else self.block
        self.send: DeviceArray = empty(send_count, dtype, device=comm.device)
        self.recv: DeviceArray = empty(recv_count, dtype, device=comm.device)
        self._ranks = n

    # ------------------------------------------------------------------------------ calls

    def launcher(self, in_place: bool, stream: Stream) -> Optional[Callable[[], Any]]:
        """A function that queues one operation on ``stream``; None when the operation has no
        in-place form (all_to_all, send_recv and the uneven forms)."""
        comm, send, recv, op, root, block = self.comm, self.send, self.recv, self.op, self.root, self.block
        name, rank, n = self.operation, comm.rank, comm.size
        if name == "all_reduce":
            return (lambda: all_reduce(comm, send, None, op, stream=stream)) if in_place else \
                (lambda: all_reduce(comm, send, recv, op, stream=stream))
        if name == "reduce":
            return (lambda: reduce(comm, send, None, op, root, stream=stream)) if in_place else \
                (lambda: reduce(comm, send, recv, op, root, stream=stream))
        if name == "broadcast":  # IN_PLACE_BY_NATURE: both columns time the same call
            return lambda: broadcast(comm, send, root, stream=stream)
        if name == "all_gather":
            mine = recv[rank * block:(rank + 1) * block]
            return (lambda: all_gather(comm, mine, recv, stream=stream)) if in_place else \
                (lambda: all_gather(comm, send, recv, stream=stream))
        if name == "reduce_scatter":
            mine = send[rank * block:(rank + 1) * block]
            return (lambda: reduce_scatter(comm, send, mine, op, stream=stream)) if in_place else \
                (lambda: reduce_scatter(comm, send, recv, op, stream=stream))
        if name == "scatter":  # in place: each rank's block of the send buffer (only the root's is read)
            mine = send[rank * block:(rank + 1) * block]
            return (lambda: scatter(comm, send, mine, root, stream=stream)) if in_place else \
                (lambda: scatter(comm, send, recv, root, stream=stream))
        if in_place:
            return None
        if name == "all_to_all":
            return lambda: all_to_all(comm, send, recv, stream=stream)
        counts, displs = [block] * n, [i * block for i in range(n)]  # one list each, as a caller keeps them
        if name == "all_gather_v":
            return lambda: all_gather_v(comm, send, recv, counts, displs, stream=stream)
        if name == "reduce_scatter_v":
            return lambda: reduce_scatter_v(comm, send, recv, counts, displs, op, stream=stream)
        if name == "all_to_all_v":
            return lambda: all_to_all_v(comm, send, recv, counts, counts, displs, displs, stream=stream)
        if name == "all_to_all_vc":
            matrix = [counts] * n
            return lambda: all_to_all_vc(comm, send, recv, matrix, stream=stream)
        items = [("send", send, (rank + 1) % n), ("recv", recv, (rank - 1) % n)]
        return lambda: batch_send_recv(comm, items, stream=stream)

    # ------------------------------------------------------------------------------ checks

    def fill(self, in_place: bool) -> None:
        """Write this rank's inputs (into the buffer the in-place call reads)."""
        rank, block = self.comm.rank, self.block
        if self.operation == "all_gather" and in_place:
            self.recv.fill_zero()  # else the out-of-place call's result would pass for this one's
            _raw(self.recv[rank * block:(rank + 1) * block]).copy_from(_values(self.dtype, self._input(rank)))
            return
        _raw(self.send).copy_from(_values(self.dtype, self._input(rank)))
        self.recv.fill_zero()

    def _input(self, rank: int) -> np.ndarray:
        size = self.block if self.operation == "all_gather" else self.send.size
        return _pattern(rank, size, self.op, self._ranks)

    def wrong(self, in_place: bool) -> int:
        """Elements of this rank's output that differ from the expected result (after ``fill``,
        one call and a synchronisation)."""
        name, rank, n, block, op = self._even, self.comm.rank, self._ranks, self.block, self.op
        everyone = [self._input(r) for r in range(n)]
        got, want = None, None
        if name == "all_reduce":
            got, want = (self.send if in_place else self.recv), _combine(everyone, op)
        elif name == "reduce":
            if rank != self.root:
                return 0
            got, want = (self.send if in_place else self.recv), _combine(everyone, op)
        elif name == "broadcast":
            got, want = self.send, everyone[self.root]
        elif name == "all_gather":
            got, want = self.recv, np.concatenate(everyone)
        elif name == "reduce_scatter":
            got = self.send[rank * block:(rank + 1) * block] if in_place else self.recv
            want = _combine(everyone, op)[rank * block:(rank + 1) * block]
        elif name == "all_to_all":
            got, want = self.recv, np.concatenate([e[rank * block:(rank + 1) * block] for e in everyone])
        elif name == "scatter":
            got = self.send[rank * block:(rank + 1) * block] if in_place else self.recv
            want = everyone[self.root][rank * block:(rank + 1) * block]
        else:
            got, want = self.recv, everyone[(rank - 1) % n]
        if got.size == 0:
            return 0
        values = _as_float(self.dtype, _raw(got).to_numpy())
        return int(np.count_nonzero(values != want))

    def close(self) -> None:
        self.send.close()
        self.recv.close()


def make_case(operation: str, comm: Any, nbytes: int, dtype: DataType, op: ReduceOp, root: int) -> Case:
    """The :class:`Case` of ``operation`` at ``nbytes`` (see the module docstring)."""
    if operation not in OPERATIONS:
        raise ValueError(f"operation={operation!r} must be one of {', '.join(OPERATIONS)}")
    return Case(operation, comm, nbytes, dtype, op, root)
