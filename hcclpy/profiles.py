"""Product profiles: the data types and reduce operations each Ascend product accepts.

On the simulator, ``HCCLPY_SIM_PROFILE=910|A2|A3|950`` makes both the simulator and the binding
refuse what that product's HCCL refuses, so that a program that runs on a laptop does not meet
``HCCL_E_NOT_SUPPORT`` on the cluster. Unset or empty: no limits. The names are matched without
regard to case.

The table restates the product documentation (summarised in the reference notes, §6.4). The
simulator holds the same table in C (``hcclpy/sim/src/hccl/profile.c``) and refuses with
``HCCL_E_NOT_SUPPORT``; the binding checks here first and raises :class:`ValueError` before any
C call. The test suite checks that both agree on every operation, data type and reduce
operation, and that their messages read the same.

Examples
--------
>>> from hcclpy.profiles import PROFILES
>>> PROFILES["A3"].allows("all_reduce", "int64", "sum")
False
>>> PROFILES["A3"].check("all_reduce", "int64", "sum")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: all_reduce of int64 with sum is not supported on the A3 profile (HCCLPY_SIM_PROFILE=A3): ...
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from . import _environment
from .types import DataType, ReduceOp, as_datatype, as_reduce_op

__all__ = ["OPERATIONS", "PROFILES", "VARIABLE", "Profile", "Rule", "from_environment"]

VARIABLE = "HCCLPY_SIM_PROFILE"
"""The environment variable that names the product profile."""

# Names as the simulator's messages spell them (bf16, not bfp16).
_DTYPE_NAMES: Dict[DataType, str] = {
    DataType.INT8: "int8", DataType.INT16: "int16", DataType.INT32: "int32", DataType.FP16: "fp16",
    DataType.FP32: "fp32", DataType.INT64: "int64", DataType.UINT64: "uint64", DataType.UINT8: "uint8",
    DataType.UINT16: "uint16", DataType.UINT32: "uint32", DataType.FP64: "fp64", DataType.BFP16: "bf16",
}

# Operations that share a rule on every product: the reductions, ReduceScatterV, the data movers,
# and the two vector operations only newer products have.
REDUCE, REDUCE_SCATTER_V, MOVE, ALL_GATHER_V, ALL_TO_ALL_VC = (
    "reduce", "reduce_scatter_v", "move", "all_gather_v", "all_to_all_vc")
_GROUP_OF: Dict[str, str] = {
    "all_reduce": REDUCE, "reduce": REDUCE, "reduce_scatter": REDUCE, "reduce_scatter_v": REDUCE_SCATTER_V,
    "broadcast": MOVE, "all_gather": MOVE, "all_to_all": MOVE, "all_to_all_v": MOVE, "scatter": MOVE,
    "send": MOVE, "recv": MOVE, "batch_send_recv": MOVE, "all_gather_v": ALL_GATHER_V,
    "all_to_all_vc": ALL_TO_ALL_VC,
}
OPERATIONS: Tuple[str, ...] = tuple(_GROUP_OF)
"""Every operation a profile limits, by its hcclpy name (barrier moves no data: never limited)."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a product accepts for a group of operations.

    ``dtypes`` empty means the product lacks the operations; ``ops`` is empty for operations
    that do not reduce; ``no_prod`` are the data types with which ``prod`` is refused.
    """

    dtypes: FrozenSet[DataType]
    ops: FrozenSet[ReduceOp] = frozenset()
    no_prod: FrozenSet[DataType] = frozenset()

    def allows(self, dtype: DataType, op: Optional[ReduceOp]) -> bool:
        """Whether ``dtype`` is accepted, with ``op`` for a reduction (None for the others)."""
        if dtype not in self.dtypes:
            return False
        if op is None:
            return True
        return op in self.ops and not (op is ReduceOp.PROD and dtype in self.no_prod)


def _dtypes(*names: str) -> FrozenSet[DataType]:
    return frozenset(as_datatype(name) for name in names)


_MOVE_ALL = _dtypes("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64",
                    "bf16")  # 950 also moves the fp8 types, which hcclpy and the simulator do not know
_REDUCE_AICPU = _dtypes("int8", "int16", "int32", "fp16", "fp32", "bf16")  # A3's default AI_CPU mode
_OPS_ALL = frozenset(ReduceOp)
_OPS_NO_PROD = frozenset({ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN})
_NO_PROD = _dtypes("int16", "bf16")
_NONE = Rule(frozenset())


@dataclasses.dataclass(frozen=True, eq=False)
class Profile:
    """One product: its ``name`` (the value of ``HCCLPY_SIM_PROFILE``), the ``product`` as
    messages name it, and a :class:`Rule` per group of operations."""

    name: str
    product: str
    rules: Mapping[str, Rule]

    def allows(self, operation: str, dtype: Any, op: Any = None) -> bool:
        """Whether ``operation`` (an hcclpy name such as ``"all_reduce"``) accepts ``dtype``, with
        reduce operation ``op`` for the reductions (ignored by the others)."""
        rule = self._rule(operation)
        return rule is None or rule.allows(as_datatype(dtype), self._op(operation, op))

    def check(self, operation: str, dtype: Any, op: Any = None) -> None:
        """Raise :class:`ValueError` naming the profile and what it accepts, unless :meth:`allows`.

        Raises
        ------
        ValueError
            The product refuses this combination (``HCCL_E_NOT_SUPPORT`` on the real library).
        """
        rule = self._rule(operation)
        dtype = as_datatype(dtype)
        op = self._op(operation, op)
        if rule is None or rule.allows(dtype, op):
            return
        with_op = f" with {op.name.lower()}" if op is not None else ""
        raise ValueError(f"{operation} of {_DTYPE_NAMES[dtype]}{with_op} is not supported on the {self.name} "
                         f"profile ({VARIABLE}={self.name}): {self.describe(operation)}")

    def describe(self, operation: str) -> str:
        """What the product accepts for ``operation``, in the words of the simulator's messages."""
        rule = self._rule(operation)
        if rule is None:
            return f"{self.product} {operation} moves no data"
        if not rule.dtypes:
            group = _GROUP_OF[operation]
            others = ", ".join(p.name for p in PROFILES.values() if p.rules[group].dtypes)
            return f"{self.product} has no {operation} (the {others} profiles have it)"
        text = f"{self.product} {operation} takes {_names(rule.dtypes)}"
        if rule.ops:
            text += " with " + ", ".join(op.name.lower() for op in sorted(rule.ops))
        if rule.no_prod:
            text += f" (prod not with {_names(rule.no_prod)})"
        return text

    def _rule(self, operation: str) -> Optional[Rule]:
        if operation == "barrier":
            return None
        try:
            return self.rules[_GROUP_OF[operation]]
        except KeyError:
            raise ValueError(f"operation={operation!r} is not an HCCL operation (one of: "
                             f"{', '.join(OPERATIONS)}, barrier)") from None

    @staticmethod
    def _op(operation: str, op: Any) -> Optional[ReduceOp]:
        return as_reduce_op(op) if _GROUP_OF.get(operation) in (REDUCE, REDUCE_SCATTER_V) else None


def _names(dtypes: FrozenSet[DataType]) -> str:
    return ", ".join(_DTYPE_NAMES[d] for d in sorted(dtypes))  # in HcclDataType order, as the simulator


PROFILES: Dict[str, Profile] = {p.name: p for p in (
    # No int16 and no bf16 anywhere on this generation; the documentation lists ReduceScatterV,
    # AllGatherV and AlltoAllVC only for newer products.
    Profile("910", "Atlas training", {
        REDUCE: Rule(_dtypes("int8", "int32", "int64", "fp16", "fp32"), _OPS_ALL),
        REDUCE_SCATTER_V: _NONE,
        MOVE: Rule(_MOVE_ALL - _dtypes("bf16")),
        ALL_GATHER_V: _NONE,
        ALL_TO_ALL_VC: _NONE,
    }),
    # Default HOST expansion mode.
    Profile("A2", "Atlas A2", {
        REDUCE: Rule(_REDUCE_AICPU | _dtypes("int64"), _OPS_ALL, _NO_PROD),
        REDUCE_SCATTER_V: Rule(_REDUCE_AICPU, _OPS_NO_PROD),
        MOVE: Rule(_MOVE_ALL),
        ALL_GATHER_V: Rule(_MOVE_ALL),
        ALL_TO_ALL_VC: Rule(_MOVE_ALL),
    }),
    # Default AI_CPU expansion mode (AIV mode has the same limits): no int64, no prod.
    Profile("A3", "Atlas A3", {
        REDUCE: Rule(_REDUCE_AICPU, _OPS_NO_PROD),
        REDUCE_SCATTER_V: Rule(_REDUCE_AICPU, _OPS_NO_PROD),
        MOVE: Rule(_MOVE_ALL),
        ALL_GATHER_V: Rule(_MOVE_ALL),
        ALL_TO_ALL_VC: Rule(_MOVE_ALL),
    }),
    # Default AICPU_TS expansion mode.
    Profile("950", "Ascend 950", {
        REDUCE: Rule(_REDUCE_AICPU | _dtypes("int64", "uint64", "fp64"), _OPS_ALL, _NO_PROD),
        REDUCE_SCATTER_V: Rule(_REDUCE_AICPU | _dtypes("int64"), _OPS_ALL, _NO_PROD),
        MOVE: Rule(_MOVE_ALL),
        ALL_GATHER_V: Rule(_MOVE_ALL),
        ALL_TO_ALL_VC: Rule(_MOVE_ALL),
    }),
)}
"""Every product profile, by name: ``"910"``, ``"A2"``, ``"A3"``, ``"950"``."""


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[Profile]:
    """The profile ``HCCLPY_SIM_PROFILE`` names, or None when it is unset or empty.

    Parameters
    ----------
    environ
        Where to read the variable; default ``os.environ``.

    Raises
    ------
    ValueError
        The variable names no profile (the message lists the valid names, as the simulator's does).

    Examples
    --------
    >>> from_environment({"HCCLPY_SIM_PROFILE": "a2"}).name
    'A2'
    """
    value = _environment.sim_profile() if environ is None else environ.get(VARIABLE, "")
    if not value:
        return None
    for profile in PROFILES.values():
        if value.lower() == profile.name.lower():
            return profile
    # Worded as the simulator words it, which reports the same mistake to C programs.
    raise ValueError(f"{VARIABLE}='{value}' is not a product profile; valid names: {', '.join(PROFILES)} "
                     f"(unset or empty: no limits)")
