"""The root info: the 4108-byte token every rank needs to join a communicator."""

from __future__ import annotations

from typing import Any, Optional, Union

from . import _ffi
from .errors import UnsupportedError
from .runtime import Device
from .runtime._device import DeviceLike

__all__ = ["RootInfo", "ROOT_INFO_BYTES"]

ROOT_INFO_BYTES = 4108
"""The size of an ``HcclRootInfo`` in bytes."""


class RootInfo:
    """An ``HcclRootInfo``: made on one rank with :meth:`generate`, shipped to the others as bytes.

    It pickles, so it can travel through ``multiprocessing``, a TCP store or MPI.

    Examples
    --------
    >>> info = hcclpy.RootInfo.generate(device=0)          # on rank 0
    >>> payload = info.to_bytes()                          # send to every rank
    >>> info = hcclpy.RootInfo.from_bytes(payload)         # on each rank
    """

    __slots__ = ("_data",)

    def __init__(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"root info must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) != ROOT_INFO_BYTES:
            raise ValueError(f"root info must be exactly {ROOT_INFO_BYTES} bytes, got {len(data)}")
        self._data = data

    @classmethod
    def generate(cls, device: Optional[DeviceLike] = None, *, scalable: bool = False) -> RootInfo:
        """Call ``HcclGetRootInfo`` (on ``device``, default: the thread's current device, else 0).

        With ``scalable=True``, call ``HcclGetRootInfoScalable`` instead (CANN 9.x): each root of
        a scalable bootstrap makes its own, and every rank passes the list of them to
        :class:`hcclpy.Communicator` as ``root_info``.

        Raises
        ------
        UnsupportedError
            For ``scalable=True`` when the loaded HCCL has no ``HcclGetRootInfoScalable``.
        """
        bound = _ffi.api()
        function = "HcclGetRootInfoScalable" if scalable else "HcclGetRootInfo"
        if not bound.present[function]:
            raise UnsupportedError(f"RootInfo.generate(scalable=True) needs {function} (CANN 9.x), which this CANN "
                                   "does not provide")
        info = _ffi.new("HcclRootInfo *")
        with Device(device) if device is not None else (Device.current() or Device(0)):
            _ffi.check_hccl(getattr(bound, function)(info), function)
        return cls(bytes(_ffi.buffer(info)))

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> RootInfo:
        """Rebuild a root info from :meth:`to_bytes` output."""
        return cls(data)

    def to_bytes(self) -> bytes:
        """The 4108 bytes of the ``HcclRootInfo``."""
        return self._data

    def __bytes__(self) -> bytes:
        return self._data

    def _cdata(self) -> Any:
        info = _ffi.new("HcclRootInfo *")
        _ffi.buffer(info)[:] = self._data
        return info

    def __reduce__(self) -> Any:
        return (RootInfo, (self._data,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RootInfo) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __repr__(self) -> str:
        return f"<hcclpy.RootInfo {self._data[:16].hex()}...>"
