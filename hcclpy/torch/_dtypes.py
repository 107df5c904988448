"""How torch tensors map onto HCCL data types and reductions.

Data movement (broadcast, gathers, all-to-all, send/recv) works on any dtype: types HCCL has are
moved as themselves, the others (bool, complex, float8, ...) as their bytes. Reductions need an HCCL
type that reduces; as torch_npu does, bool and uint8 tensors are reduced as int32 (bool SUM becomes
MAX, bool PRODUCT becomes MIN: logical or / and), AVG divides each input by the group size, then
sums (as NCCL does), and PREMUL_SUM multiplies the input by its factor first. Complex tensors are
summed as pairs of real numbers, as gloo does; their PRODUCT, MIN and MAX are refused.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from ..types import DataType, ReduceOp

_HCCL_TYPES = {
    torch.int8: DataType.INT8, torch.int16: DataType.INT16, torch.int32: DataType.INT32, torch.int64: DataType.INT64,
    torch.uint8: DataType.UINT8, torch.uint16: DataType.UINT16, torch.uint32: DataType.UINT32,
    torch.uint64: DataType.UINT64, torch.float16: DataType.FP16, torch.float32: DataType.FP32,
    torch.float64: DataType.FP64, torch.bfloat16: DataType.BFP16,
}

# Reduced through int32, as torch_npu does (HCCL does not reduce them).
_WIDENED = (torch.bool, torch.uint8)
_REDUCED_NAMES = ", ".join(str(t).replace("torch.", "") for t in _HCCL_TYPES if t not in _WIDENED)

_REDUCE_OP = dist.ReduceOp
_RED = dist.ReduceOp.RedOpType
_DIRECT = {_RED.SUM: ReduceOp.SUM, _RED.PRODUCT: ReduceOp.PROD, _RED.MAX: ReduceOp.MAX, _RED.MIN: ReduceOp.MIN,
           _RED.AVG: ReduceOp.SUM, _RED.PREMUL_SUM: ReduceOp.SUM}
_SUMMING = (_RED.SUM, _RED.AVG, _RED.PREMUL_SUM)
_ON_BOOL = {_RED.SUM: ReduceOp.MAX, _RED.PRODUCT: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX, _RED.MIN: ReduceOp.MIN}


def movement(dtype: torch.dtype) -> Tuple[DataType, int]:
    """The HCCL type that moves tensors of ``dtype``, and how many of its elements one tensor
    element takes (1, or the element size for types moved as bytes)."""
    hccl = _HCCL_TYPES.get(dtype)
    if hccl is None:
        return DataType.UINT8, dtype.itemsize
    return hccl, 1


class Reduction(NamedTuple):
    """How one torch reduction runs on HCCL."""

    op: ReduceOp                  # the HCCL operation
    dtype: DataType               # the HCCL type it runs on
    widen: Optional[torch.dtype]  # reduce a copy of this dtype (int32) and copy the result back
    divide: bool                  # AVG: divide the input by the group size first
    factor: Any                   # PREMUL_SUM: multiply the input by this first (a number or a tensor)
    unit: int = 1                 # elements of ``dtype`` per tensor element: 2 for complex (real, imaginary)

    @property
    def as_is(self) -> bool:
        """HCCL reduces the tensor's own memory: no widened copy, no pre-division or factor."""
        return self.widen is None and not self.divide and self.factor is None and self.unit == 1


def reduction(reduce_op: Any, tensor_dtype: torch.dtype, operation: str) -> Reduction:
    """Plan ``reduce_op`` (a ``dist.ReduceOp``) on tensors of ``tensor_dtype``.

    Raises
    ------
    ValueError
        For what HCCL cannot do: bitwise reductions, AVG and PREMUL_SUM on integers or bool,
        and tensor types HCCL does not reduce.
    """
    # The common call: a plan made before. Both a ReduceOp and a bare RedOpType hash to the
    # reduction's RedOpType value, and that int is the key: comparing two ReduceOps, as a look-up
    # by the object would each time torch passes a new one, costs about a microsecond.
    # PREMUL_SUM's plans are never kept (the factor belongs to the call), so its value finds none.
    key = (hash(reduce_op) if _HASHED_BY_VALUE else int(_kind(reduce_op)), tensor_dtype)
    plan = _plans.get(key)
    if plan is None:
        kind = _kind(reduce_op)
        plan = _plan(reduce_op, kind, tensor_dtype, operation)
        if kind != _RED.PREMUL_SUM:  # its factor belongs to the call; the other plans depend on op and dtype only
            _plans[key] = plan
    return plan


# Plans by (RedOpType value, dtype): a few dozen entries at most (every reduction of every
# dtype), made once each.
_plans: Dict[Tuple[int, torch.dtype], Reduction] = {}


def _kind(reduce_op: Any) -> Any:
    """The RedOpType of a ReduceOp, or of a bare RedOpType."""
    return reduce_op.op if type(reduce_op) is _REDUCE_OP else reduce_op


# torch hashes a ReduceOp and a RedOpType to the RedOpType's value; where a release does not, the
# value is read (slower, the same keys).
_HASHED_BY_VALUE = all(hash(_REDUCE_OP(kind)) == hash(kind) == int(kind) for kind in _DIRECT if kind != _RED.PREMUL_SUM)


def _plan(reduce_op: Any, kind: Any, tensor_dtype: torch.dtype, operation: str) -> Reduction:
    name = getattr(kind, "name", str(kind))
    if kind not in _DIRECT:
        raise ValueError(f"{operation} with ReduceOp.{name} is not supported by the hcclpy backend: HCCL reduces "
                         "with SUM, PRODUCT, MIN and MAX (and AVG, PREMUL_SUM on floating-point tensors)")
    if tensor_dtype.is_complex:
        if kind not in _SUMMING:
            raise ValueError(f"{operation} with ReduceOp.{name} is not supported on complex tensors ({tensor_dtype}): "
                             "they reduce with SUM, AVG and PREMUL_SUM only")
        parts = _HCCL_TYPES[tensor_dtype.to_real()]
        return Reduction(ReduceOp.SUM, parts, None, kind == _RED.AVG, reduce_op.factor if kind == _RED.PREMUL_SUM
                         else None, 2)
    floating = tensor_dtype.is_floating_point
    if kind in (_RED.AVG, _RED.PREMUL_SUM) and not floating:
        raise ValueError(f"{operation} with ReduceOp.{name} needs a floating-point tensor, got {tensor_dtype}")
    factor = reduce_op.factor if kind == _RED.PREMUL_SUM else None
    if tensor_dtype in _WIDENED:
        op = _ON_BOOL[kind] if tensor_dtype == torch.bool else _DIRECT[kind]
        return Reduction(op, DataType.INT32, torch.int32, False, None)
    dtype = _HCCL_TYPES.get(tensor_dtype)
    if dtype is None:
        raise ValueError(f"{operation} of {tensor_dtype} tensors is not supported by the hcclpy backend: HCCL "
                         f"reduces {_REDUCED_NAMES} (and bool, uint8 as int32)")
    return Reduction(_DIRECT[kind], dtype, None, kind == _RED.AVG, factor)
