"""Data types and reduction operators, with the values of ``hccl_types.h``.

One table maps NumPy, ml_dtypes and torch dtypes to :class:`DataType`; every part of hcclpy resolves
dtypes through :func:`as_datatype`.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Literal, Optional, Union

import numpy as np

__all__ = ["DataType", "OpLike", "ReduceOp", "as_datatype", "as_reduce_op", "numpy_dtype"]


class DataType(enum.IntEnum):
    """``HcclDataType``: element types HCCL moves and reduces."""

    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BFP16 = 11
    BF16 = 11  # alias: the name torch and ml_dtypes use

    # The lower-case name, as reprs and messages spell it: an IntEnum prints its number from
    # Python 3.11 on, and "4" says nothing. Compare with NumPy through .numpy (x.dtype.numpy == np.float32).
    def __str__(self) -> str:
        return self.name.lower()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @property
    def itemsize(self) -> int:
        """Size of one element in bytes."""
        return _ITEMSIZE[self]

    @property
    def size(self) -> int:
        """Size of one element in bytes, as CANN's ``aclDataTypeSize`` gives it (the same as
        :attr:`itemsize`, NumPy's name).

        Examples
        --------
        >>> hcclpy.DataType.BF16.size
        2
        """
        return self.itemsize

    @property
    def numpy(self) -> np.dtype:
        """The matching NumPy dtype (bfloat16 needs the optional ``ml_dtypes`` package)."""
        return numpy_dtype(self)


class ReduceOp(enum.IntEnum):
    """``HcclReduceOp``: how reductions combine elements."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3

    __str__ = DataType.__str__  # "sum", not "0"
    __format__ = DataType.__format__


OpLike = Union[ReduceOp, Literal["sum", "prod", "max", "min"]]
"""What an ``op`` argument takes, for type checkers: a :class:`ReduceOp` or its name."""

_ITEMSIZE = {
    DataType.INT8: 1, DataType.UINT8: 1, DataType.INT16: 2, DataType.UINT16: 2, DataType.FP16: 2,
    DataType.BFP16: 2, DataType.INT32: 4, DataType.UINT32: 4, DataType.FP32: 4, DataType.INT64: 8,
    DataType.UINT64: 8, DataType.FP64: 8,
}

# Names as NumPy, ml_dtypes and torch spell them (torch's str(dtype) minus the "torch." prefix).
_BY_NAME: Dict[str, DataType] = {
    "int8": DataType.INT8, "int16": DataType.INT16, "int32": DataType.INT32, "int64": DataType.INT64,
    "uint8": DataType.UINT8, "uint16": DataType.UINT16, "uint32": DataType.UINT32, "uint64": DataType.UINT64,
    "float16": DataType.FP16, "half": DataType.FP16, "fp16": DataType.FP16,
    "float32": DataType.FP32, "fp32": DataType.FP32,
    "float64": DataType.FP64, "double": DataType.FP64, "fp64": DataType.FP64,
    "bfloat16": DataType.BFP16, "bf16": DataType.BFP16, "bfp16": DataType.BFP16,
    "short": DataType.INT16, "long": DataType.INT64,
}

# Names whose size NumPy and torch disagree on: refused rather than guessed.
_AMBIGUOUS_NAMES = {"float": "float32 in torch, float64 in NumPy", "int": "int32 in torch, int64 in NumPy"}


# dtype objects resolved before: NumPy spells a dtype's name in Python code slower than the rest
# of a small NumPy all_reduce takes. (Values that compare equal name the same type.)
_RESOLVED: Dict[Any, DataType] = {}


_SUPPORTED = ", ".join(sorted({d.name.lower() for d in DataType}))


def as_datatype(value: Any, *, argument: str = "dtype") -> DataType:
    """Resolve ``value`` (a DataType, int, name, NumPy/ml_dtypes dtype or torch dtype) to a DataType.

    Raises
    ------
    TypeError
        If ``value`` names no type HCCL supports; the message lists the supported ones.
    """
    try:  # first: the dtype of every NumPy array staged comes here, and isinstance(value, DataType) is slow
        return _RESOLVED[value]
    except KeyError:
        hashable = True
    except TypeError:  # unhashable: resolved by name below, then refused
        hashable = False
    if isinstance(value, DataType):
        return value
    if isinstance(value, enum.Enum):  # an int too when an IntEnum (ReduceOp.MAX == 2), but no data type
        raise TypeError(f"{argument}={value!r} is not a data type: it is a {type(value).__name__}")
    if value is None:  # NumPy would read it as float64
        raise TypeError(f"{argument}=None is not a data type; name one (supported: {_SUPPORTED})")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        try:
            return DataType(int(value))
        except ValueError:
            pass
    else:
        name = _name_of(value)
        if name in _AMBIGUOUS_NAMES:
            raise TypeError(f"{argument}={value!r} is ambiguous ({_AMBIGUOUS_NAMES[name]}): name the size, "
                            f"such as {name + '32'!r} or {name + '64'!r}")
        if name is not None and name in _BY_NAME:
            _refuse_foreign_byte_order(value, argument)
            if hashable:
                if len(_RESOLVED) >= 256:
                    _RESOLVED.clear()
                _RESOLVED[value] = _BY_NAME[name]
            return _BY_NAME[name]
    raise TypeError(f"{argument}={value!r} is not a data type HCCL supports (supported: {_SUPPORTED})")


def _refuse_foreign_byte_order(value: Any, argument: str) -> None:
    """Raise TypeError for a NumPy dtype stored in the other byte order: HCCL reads and reduces
    values in the machine's own order, so such data would come out as garbage."""
    if isinstance(value, str) and value.startswith("torch."):
        return
    try:
        dtype = np.dtype(value)
    except TypeError:  # a torch dtype: always in the machine's order
        return
    if not dtype.isnative:
        raise TypeError(f"{argument}={dtype.str!r} is not in this machine's byte order, so HCCL would read "
                        f"wrong values; convert it first: array.astype(array.dtype.newbyteorder('='))")


def _name_of(value: Any) -> Optional[str]:
    """The type's name as ``_BY_NAME`` spells it, if it has one: names as they are, NumPy type
    codes (``"f4"``, ``"<i8"``) and dtype-likes through ``np.dtype``."""
    text = value.lower() if isinstance(value, str) else str(value)
    if text.startswith("torch."):  # a torch.dtype (or its name), without importing torch
        return text[len("torch."):]
    if isinstance(value, str) and (text in _BY_NAME or text in _AMBIGUOUS_NAMES):
        return text
    try:
        return np.dtype(value).name
    except (TypeError, ValueError, SyntaxError):  # NumPy refuses some malformed strings with these
        return None


def as_reduce_op(value: Any, *, argument: str = "op") -> ReduceOp:
    """Resolve ``value`` (ReduceOp, int or name such as ``"sum"``) to a ReduceOp.

    Raises
    ------
    ValueError
        If ``value`` is not one of sum, prod, max, min.
    TypeError
        If ``value`` is a member of another enum (such as a :class:`DataType`).
    """
    if isinstance(value, ReduceOp):
        return value
    if isinstance(value, enum.Enum):  # an int too when an IntEnum (DataType.INT32 == 2), but no reduction
        raise TypeError(f"{argument}={value!r} is not a reduce operation (sum, prod, max, min): it is a "
                        f"{type(value).__name__}")
    try:
        if isinstance(value, str):
            return ReduceOp[value.upper()]
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return ReduceOp(int(value))
    except (KeyError, ValueError):
        pass
    hint = ""
    if isinstance(value, str) and value.strip().lower() in ("avg", "average", "mean"):
        hint = "; HCCL has no average: reduce with sum, then divide by the communicator's size"
    raise ValueError(f"{argument}={value!r} is not a reduce operation (sum, prod, max, min){hint}")


def numpy_dtype(dtype: DataType) -> np.dtype:
    """The NumPy dtype of ``dtype``; bfloat16 needs ``ml_dtypes``.

    Raises
    ------
    TypeError
        For bfloat16 when ``ml_dtypes`` is not installed.
    """
    if dtype == DataType.BFP16:
        try:
            import ml_dtypes
        except ImportError as exc:
            raise TypeError("bfloat16 arrays need the ml_dtypes package (pip install ml_dtypes)") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype.name.lower().replace("fp", "float"))
