"""hcclpy: a Python binding for Huawei's HCCL and AscendCL, with a CPU simulator of the same C ABI.

The binding is pure Python on cffi in ABI mode. Importing :mod:`hcclpy` never loads a C library;
the libraries are found and opened on first use (real CANN when installed, else the simulator built
by :mod:`hcclpy.sim`).

The package, from the bottom up: ``errors`` and ``types``; ``runtime`` (devices, streams, events,
memory); ``collectives`` (the operations); ``communicator`` (creation and teardown, the operations
as methods); ``bootstrap`` (:func:`hcclpy.init` from a launcher's environment); ``torch`` (a
``torch.distributed`` backend). Each module imports only those before it.

Examples
--------
>>> import hcclpy, numpy as np
>>> info = hcclpy.RootInfo.generate(device=0)
>>> comm = hcclpy.Communicator(1, info, 0, device=0)
>>> x = hcclpy.from_numpy(np.arange(4, dtype=np.float32), device=0)
>>> comm.all_reduce(x); comm.device.default_stream.synchronize()
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List

from . import errors, trace
from .bootstrap import init, shutdown
from .collectives import BufferLike, PersistentOp, group
from .communicator import Communicator
from .config import CommConfig
from .errors import (AclError, CollectiveMismatchError, CommTimeoutError, HcclError, HcclpyError, HostFunctionError,
                     LibraryNotFoundError, RemoteRankError, SimulatorFallbackWarning, UnsupportedError)
from .rootinfo import RootInfo
from .runtime import (Device, DeviceArray, Event, Graph, HostRegistration, IpcEventHandle, IpcHandle, PhysicalMemory,
                      PointerAttributes, ShareableHandle, Stream, VirtualRange, allocation_granularity,
                      capture_thread_mode, device_count, empty, from_numpy, pinned_empty, pointer_attributes,
                      register_host, set_op_execute_timeout, set_op_wait_timeout, zeros)
from .types import DataType, OpLike, ReduceOp

__version__ = "0.1.0"

# The "hcclpy" logger tells what was loaded, which communicators came and went, and what failed.
# A library prints nothing unless the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AclError", "BufferLike", "CollectiveMismatchError", "CommConfig", "CommTimeoutError", "Communicator", "DataType",
    "Device", "DeviceArray", "Event", "Graph", "HcclError", "HcclpyError", "HostFunctionError", "HostRegistration",
    "IpcEventHandle", "IpcHandle", "LibraryNotFoundError", "OpLike", "PersistentOp", "PhysicalMemory",
    "PointerAttributes", "ReduceOp", "RemoteRankError", "RootInfo", "ShareableHandle", "SimulatorFallbackWarning",
    "Stream", "UnsupportedError", "VirtualRange", "allocation_granularity", "backend", "capture_thread_mode",
    "device_count", "empty", "errors", "from_numpy", "group", "has", "init", "library_info", "pinned_empty",
    "pointer_attributes", "register_host", "set_op_execute_timeout", "set_op_wait_timeout", "shutdown", "trace",
    "zeros",
]


def has(name: str) -> bool:
    """Whether the loaded HCCL / AscendCL exports the C function ``name`` (loads the libraries).

    Examples
    --------
    >>> hcclpy.has("HcclAllGatherV")
    True
    """
    from . import _ffi

    return _ffi.has(name)


def backend() -> str:
    """``"cann"`` when running on real CANN libraries, ``"sim"`` on the simulator (loads them)."""
    from . import _ffi

    return _ffi.api().backend


def library_info() -> Dict[str, Any]:
    """What was loaded: backend, each library's path and how it was found, optional functions, and
    the simulator's product profile (``HCCLPY_SIM_PROFILE``; None: no limits, and always on CANN)."""
    from . import _ffi

    bound = _ffi.api()
    libraries: List[Dict[str, str]] = [
        {"name": lib.name, "path": lib.path, "found_via": lib.found_via} for lib in bound.loaded]
    return {"backend": bound.backend, "libraries": libraries,
            "functions": dict(sorted(bound.present.items())), "simulator": _ffi.build_info(),
            "profile": bound.profile.name if bound.profile is not None else None}
