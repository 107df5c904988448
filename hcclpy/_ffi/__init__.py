"""The C ABI layer: the only part of hcclpy that sees cffi.

cffi runs in ABI mode (declarations parsed ahead of time by :mod:`._declarations`, libraries opened
with ``ffi.dlopen``): nothing is compiled for the binding itself, and the same declarations serve
real CANN and the simulator. The libraries are opened on first use (:func:`api`), never at import.
Everything above this package calls C through the ``api()`` namespace and turns return codes into
exceptions with :func:`check_acl` / :func:`check_hccl`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional, Tuple

from _cffi_backend import cast as _cast  # cffi's C module: ffi.cast without its Python layer

from .. import profiles
from ..errors import AclErrorCode, UnsupportedError, acl_error, hccl_error, LibraryNotFoundError
from . import cdef_acl, cdef_hccl
from ._declarations import ffi
from ._loader import LoadedLibrary, SimulatorFallbackWarning, open_libraries, simulator_build_info

log = logging.getLogger("hcclpy")
_failure_hooks: list = []


def on_failure(hook: Any) -> None:
    """Call ``hook(exception)`` for every failed C call hcclpy reports (the flight recorder dumps)."""
    _failure_hooks.append(hook)


def _reported(error: Exception) -> Exception:
    log.debug("%s", error)
    for hook in _failure_hooks:
        try:
            hook(error)
        except Exception:  # noqa: BLE001 - a hook must not replace the failure it is told about
            log.exception("failure hook %r failed", hook)
    return error

__all__ = [
    "ACL_EVENT_CAPTURE_STREAM_PROGRESS", "ACL_EVENT_IPC", "ACL_EVENT_SYNC", "ACL_EVENT_TIME_LINE", "Api", "LoadedLibrary",
    "SimulatorFallbackWarning", "acl_failure", "api", "check_acl", "check_hccl", "ffi", "has", "hccl_failure",
    "hccl_text", "loaded",
]

# Flag macros of acl_rt.h (cffi cannot declare macros in ABI mode).
ACL_EVENT_SYNC = 0x1
ACL_EVENT_CAPTURE_STREAM_PROGRESS = 0x2
ACL_EVENT_TIME_LINE = 0x8
ACL_EVENT_IPC = 0x40
ACL_STREAM_FAST_LAUNCH = 0x1
ACL_STREAM_FAST_SYNC = 0x2


class Api(SimpleNamespace):
    """Every declared C function as an attribute, bound to the library that exports it.

    A function the loaded library lacks is a stub that raises :class:`UnsupportedError`; ``present``
    says which are real. ``backend`` is ``"cann"`` or ``"sim"``; ``loaded`` lists the libraries;
    ``profile`` is the simulator's product profile (``HCCLPY_SIM_PROFILE``), None for no limits
    and always None on CANN, whose product enforces its own.
    """

    present: Dict[str, bool]
    backend: str
    loaded: Tuple[LoadedLibrary, ...]
    profile: Optional[profiles.Profile]


_lock = threading.Lock()
_api: Optional[Api] = None


def _missing(name: str, where: str) -> Any:
    def unsupported(*args: Any) -> Any:
        raise UnsupportedError(f"{name} is not exported by {where}: it needs a newer CANN")

    return unsupported


def _bind(opened: Any, profile: Optional[profiles.Profile]) -> Api:
    namespace: Dict[str, Any] = {}
    present: Dict[str, bool] = {}
    hccl_libs = [opened.hccl] + ([opened.hcomm] if opened.hcomm is not None else [])
    where = ", ".join(lib.path for lib in opened.loaded)
    for names, libs in ((cdef_acl.REQUIRED + cdef_acl.OPTIONAL, [opened.acl]),
                        (cdef_hccl.REQUIRED + cdef_hccl.OPTIONAL, hccl_libs)):
        for name in names:
            for lib in libs:
                try:
                    namespace[name] = getattr(lib, name)
                    present[name] = True
                    break
                except (AttributeError, ffi.error):  # (a symbol the library lacks: ffi.error out of line)
                    continue
            else:
                if name in cdef_acl.REQUIRED or name in cdef_hccl.REQUIRED:
                    raise LibraryNotFoundError(f"{where} does not export {name}; hcclpy needs it")
                namespace[name] = _missing(name, where)
                present[name] = False
    return Api(present=present, backend=opened.backend, loaded=opened.loaded, profile=profile, **namespace)


def _load() -> Api:
    global _api
    with _lock:
        if _api is not None:
            return _api
        # RTLD_NODELETE: the libraries run threads of their own (stream workers) that may still be
        # in their code while the interpreter shuts down and releases the lib objects.
        flags = ffi.RTLD_NOW | ffi.RTLD_GLOBAL | getattr(ffi, "RTLD_NODELETE", 0)
        opened = open_libraries(lambda path: ffi.dlopen(path, flags))
        # Read once, as the simulator does; an unknown name fails here, before any C call.
        profile = profiles.from_environment() if opened.backend == "sim" else None
        bound = _bind(opened, profile)
        rc = bound.aclInit(ffi.NULL)
        if rc == AclErrorCode.ACL_SUCCESS:
            # We initialised AscendCL, so we finalise it; when torch_npu did it first, it does.
            atexit.register(bound.aclFinalize)
        elif rc != AclErrorCode.ACL_ERROR_REPEAT_INITIALIZE:
            raise acl_failure(rc, "aclInit", bound)
        _api = bound
        for library in opened.loaded:
            log.info("loaded %s from %s (found via %s)", library.name, library.path, library.found_via)
        if profile is not None:
            log.info("simulator product profile: %s", profile.name)
        return bound


# Small helpers, so the layers above handle C values without touching cffi themselves.
NULL = ffi.NULL


def new(ctype: str, init: Any = None) -> Any:
    """A zero-initialised C object owned by Python (``ffi.new``)."""
    return ffi.new(ctype, init)


# The C types that cast() was asked for, by name: a handful, named in hcclpy's own code. With
# them, a cast is one C call (ffi.cast looks the name up in Python first: 3 frames more).
_CAST_TYPES: Dict[str, Any] = {}
_VOID_P = ffi.typeof("void *")


def cast(ctype: str, value: Any) -> Any:
    """``value`` viewed as ``ctype`` (``ffi.cast``)."""
    known = _CAST_TYPES.get(ctype)
    if known is None:
        known = _CAST_TYPES[ctype] = ffi.typeof(ctype)
    return _cast(known, value)


pointer: Callable[[int], Any] = partial(_cast, _VOID_P)
"""An address (int) as a ``void *``: the argument a C function takes for memory."""


def address(pointer: Any) -> int:
    """A C pointer as an int."""
    return int(ffi.cast("uintptr_t", pointer))


def buffer(pointer: Any, size: int = -1) -> Any:
    """A writable Python buffer over C memory (``ffi.buffer``); it keeps ``pointer`` alive."""
    return ffi.buffer(pointer, size) if size >= 0 else ffi.buffer(pointer)


def from_buffer(ctype: str, data: Any, require_writable: bool = False) -> Any:
    """A C array aliasing a Python buffer (``ffi.from_buffer``); it keeps ``data`` alive."""
    if ctype == "char[]":  # cffi's default type: no type lookup (~0.15 us less per call)
        return ffi.from_buffer(data, require_writable=require_writable)
    return ffi.from_buffer(ctype, data, require_writable=require_writable)


def memmove(dst: Any, src: Any, nbytes: int) -> None:
    """Copy ``nbytes`` between host memory given as C pointers or buffers (``ffi.memmove``)."""
    ffi.memmove(dst, src, nbytes)


def string(pointer: Any) -> str:
    """A NUL-terminated C string as str ('' for NULL)."""
    return "" if pointer == ffi.NULL else ffi.string(pointer).decode("utf-8", "replace")


def sizeof(ctype: str) -> int:
    """``sizeof(ctype)``."""
    return ffi.sizeof(ctype)


def gc(pointer: Any, destructor: Any) -> Any:
    """A pointer that calls ``destructor`` when collected (``ffi.gc``)."""
    return ffi.gc(pointer, destructor)


@ffi.callback("void(void *)")
def _run_host_function(args: Any) -> None:
    # The C side of every host function: ``args`` is the handle of a Python callable, which
    # catches what it raises itself (an exception cannot cross back into C).
    ffi.from_handle(args)()


def host_function(fn: Any) -> Tuple[Any, Any]:
    """``(C function, argument)`` that make C call ``fn()``; the argument keeps a reference to
    ``fn`` and must be kept alive until C has called it."""
    return _run_host_function, ffi.new_handle(fn)


def api() -> Api:
    """The loaded C functions, opening the libraries on first call."""
    return _api if _api is not None else _load()


def has(name: str) -> bool:
    """Whether the loaded libraries export the C function ``name`` (loads them if needed)."""
    return api().present.get(name, False)


def loaded() -> Tuple[LoadedLibrary, ...]:
    """The libraries in use, with where they came from and how they were found."""
    return api().loaded


def build_info() -> Optional[dict]:
    """The simulator build description when running on the simulator, else None."""
    return simulator_build_info(api().loaded)


def _recent_message(bound: Api) -> Optional[str]:
    if not bound.present.get("aclGetRecentErrMsg"):
        return None
    text = bound.aclGetRecentErrMsg()
    return ffi.string(text).decode("utf-8", "replace") if text != ffi.NULL else None


def acl_failure(rc: int, name: str, bound: Optional[Api] = None, context: str = "") -> Exception:
    """The exception for an AscendCL call ``name`` that returned ``rc`` (read on the failing thread)."""
    return _reported(acl_error(rc, name, recent=_recent_message(bound or api()), context=context))


def hccl_text(rc: int, bound: Optional[Api] = None) -> Optional[str]:
    """What the library says of HCCL result ``rc`` (``HcclGetErrorString``), if it can say."""
    bound = bound or api()
    if not bound.present.get("HcclGetErrorString"):
        return None
    return string(bound.HcclGetErrorString(rc)) or None


def hccl_failure(rc: int, name: str, context: str = "") -> Exception:
    """The exception for an HCCL call ``name`` that returned ``rc`` (read on the failing thread)."""
    bound = api()
    return _reported(hccl_error(rc, name, library_text=hccl_text(rc, bound), recent=_recent_message(bound),
                                context=context))


def check_acl(rc: int, name: str, context: str = "") -> None:
    """Raise the matching :class:`~hcclpy.errors.AclError` unless ``rc`` is ``ACL_SUCCESS``."""
    if rc:
        raise acl_failure(rc, name, context=context)


def check_hccl(rc: int, name: str, context: str = "") -> None:
    """Raise the matching :class:`~hcclpy.errors.HcclError` unless ``rc`` is ``HCCL_SUCCESS``."""
    if rc:
        raise hccl_failure(rc, name, context=context)
