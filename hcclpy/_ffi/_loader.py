"""Finding and opening ``libascendcl.so`` and ``libhccl.so`` (and, on CANN 9.x, ``libhcomm.so``).

Search order, per library:

1. an explicit path: ``HCCLPY_LIBASCENDCL`` / ``HCCLPY_LIBHCCL`` (else vllm-ascend's ``HCCL_SO_PATH``).
   When one is set, that library is used or loading fails (:class:`LibraryNotFoundError` naming the
   variable, its value and why): nothing else is tried in its place, and the simulator is not
   fallen back to, since either would run something other than what the user asked for;
2. ``$ASCEND_HOME_PATH/lib64``, ``$ASCEND_TOOLKIT_HOME/lib64``, ``/usr/local/Ascend/cann/lib64``,
   ``/usr/local/Ascend/ascend-toolkit/latest/lib64``;
3. the system loader (bare soname: ``LD_LIBRARY_PATH``, or a library torch_npu already loaded);
4. with ``HCCLPY_BACKEND=auto`` (the default) and nothing found, the simulator (:mod:`hcclpy.sim`),
   announced by one warning once it has loaded. ``HCCLPY_BACKEND=cann`` refuses the simulator,
   wherever it is found (``eval "$(python -m hcclpy sim env)"`` points ``ASCEND_HOME_PATH`` and
   ``LD_LIBRARY_PATH`` at its tree); ``=sim`` goes straight to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .. import _environment
from .._launchers import launch_rank
from ..errors import LibraryNotFoundError, SimulatorFallbackWarning

__all__ = ["LoadedLibrary", "SimulatorFallbackWarning", "open_libraries"]

INSTALL_ROOTS = ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")


@dataclasses.dataclass(frozen=True)
class LoadedLibrary:
    """Where a shared library was loaded from and how it was found."""

    name: str
    path: str
    found_via: str


@dataclasses.dataclass(frozen=True)
class OpenedLibraries:
    acl: Any
    hccl: Any
    hcomm: Optional[Any]
    backend: str  # "cann" or "sim"
    loaded: Tuple[LoadedLibrary, ...]


Opener = Callable[[str], Any]


# The variables that name each library explicitly, in order: the first one set is the override.
ACL_OVERRIDES = ("HCCLPY_LIBASCENDCL",)
HCCL_OVERRIDES = ("HCCLPY_LIBHCCL", "HCCL_SO_PATH")


def _override_error(soname: str, variable: str, value: str, why: str) -> LibraryNotFoundError:
    roots = ", ".join(root + "/lib64" for root in INSTALL_ROOTS)
    return LibraryNotFoundError(
        f"{variable}={value!r} cannot be used as {soname}: {why}. {variable} names the library to load, "
        f"so hcclpy neither searches elsewhere nor falls back to the simulator: correct it, or unset it "
        f"to search $ASCEND_HOME_PATH/lib64, $ASCEND_TOOLKIT_HOME/lib64, {roots} and the system loader.")


def _check_override_exists(soname: str, override: Optional[Tuple[str, str]]) -> None:
    """Refuse an override naming a path that does not exist, before anything is opened or searched:
    the other library's search failing first must not hide it."""
    if override is not None:
        variable, value = override
        if os.sep in value and not os.path.exists(value):
            raise _override_error(soname, variable, value, "no such file")


def _open_override(soname: str, override: Tuple[str, str], opener: Opener) -> Tuple[Any, LoadedLibrary]:
    variable, value = override
    try:
        lib = opener(value)
    except OSError as exc:
        raise _override_error(soname, variable, value, f"it does not load ({exc})") from exc
    return lib, LoadedLibrary(soname, _resolved_path(value), variable)


def _candidates(soname: str) -> List[Tuple[str, str]]:
    """(path or soname, how it was found) in search order, when no override names the library."""
    found: List[Tuple[str, str]] = []
    for variable, root in _environment.cann_roots():
        found.append((os.path.join(root, "lib64", soname), f"${variable}/lib64"))
    for root in INSTALL_ROOTS:
        found.append((os.path.join(root, "lib64", soname), root))
    found.append((soname, "system loader"))
    return found


def _open_first(soname: str, opener: Opener, failures: List[str]) -> Optional[Tuple[Any, LoadedLibrary]]:
    seen = set()
    for target, how in _candidates(soname):
        if target in seen:
            continue
        seen.add(target)
        if os.sep in target and not os.path.exists(target):
            failures.append(f"  {target} ({how}): no such file")
            continue
        try:
            lib = opener(target)
        except OSError as exc:
            failures.append(f"  {target} ({how}): {exc}")
            continue
        return lib, LoadedLibrary(soname, _resolved_path(target), how)
    return None


def _open_one(soname: str, override: Optional[Tuple[str, str]], other: Optional[Tuple[str, str]],
              opener: Opener, failures: List[str]) -> Optional[Tuple[Any, LoadedLibrary]]:
    """``soname`` from its override, else from the search; None when the search finds nothing and
    no override is set for ``other`` (the other library), which may then fall back to the simulator."""
    if override is not None:
        return _open_override(soname, override, opener)
    found = _open_first(soname, opener, failures)
    if found is None and other is not None:
        # The user named the other library: running the simulator instead would ignore that.
        variable, value = other
        own = (ACL_OVERRIDES if soname == "libascendcl.so" else HCCL_OVERRIDES)[0]
        raise LibraryNotFoundError(
            f"{variable}={value!r} is set, but no usable {soname} was found to go with it, so hcclpy does not "
            f"fall back to the simulator: set {own} or ASCEND_HOME_PATH as well, or unset {variable}. "
            "Tried:\n" + "\n".join(failures))
    return found


def _resolved_path(target: str) -> str:
    """The file an opened ``target`` is: a path, resolved; a bare soname, as the system loader found it."""
    return os.path.realpath(target) if os.sep in target else _mapped_path(target)


def _mapped_path(soname: str) -> str:
    """The file mapped into this process under the name ``soname`` (read from /proc/self/maps once
    the system loader opened it), or ``soname`` itself when that cannot be told (no /proc, or
    several such files)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {fields[5] for fields in (line.rstrip("\n").split(maxsplit=5) for line in maps)
                     if len(fields) == 6 and os.path.basename(fields[5]) == soname}
    except OSError:
        return soname
    return paths.pop() if len(paths) == 1 else soname


def _is_simulator_tree(path: str) -> bool:
    return os.sep in path and (Path(path).resolve().parent.parent / "BUILD_INFO.json").is_file()


def _open_cann(opener: Opener, failures: List[str]) -> Optional[OpenedLibraries]:
    acl_override, hccl_override = _environment.first_set(ACL_OVERRIDES), _environment.first_set(HCCL_OVERRIDES)
    _check_override_exists("libascendcl.so", acl_override)
    _check_override_exists("libhccl.so", hccl_override)
    # libascendcl first: libhccl needs it, and would otherwise pull in whichever one its own
    # search path finds.
    acl = _open_one("libascendcl.so", acl_override, hccl_override, opener, failures)
    if acl is None:
        return None
    hccl = _open_one("libhccl.so", hccl_override, acl_override, opener, failures)
    if hccl is None:
        return None
    # CANN 9.x moved communicator management into libhcomm.so, next to libhccl.so.
    hcomm = None
    sibling = os.path.join(os.path.dirname(hccl[1].path), "libhcomm.so")
    for target in ([sibling] if os.sep in hccl[1].path else []) + ["libhcomm.so"]:
        try:
            hcomm = (opener(target), LoadedLibrary("libhcomm.so", _resolved_path(target), "next to libhccl.so"))
            break
        except OSError:
            continue
    loaded = (acl[1], hccl[1]) + ((hcomm[1],) if hcomm else ())
    backend = "sim" if _is_simulator_tree(hccl[1].path) else "cann"
    return OpenedLibraries(acl[0], hccl[0], hcomm[0] if hcomm else None, backend, loaded)


def _open_simulator(opener: Opener) -> OpenedLibraries:
    from .. import sim  # the simulator package only builds; it never touches cffi

    lib64 = sim.home() / "lib64"
    acl_path, hccl_path = str(lib64 / "libascendcl.so"), str(lib64 / "libhccl.so")
    acl, hccl = opener(acl_path), opener(hccl_path)
    loaded = (LoadedLibrary("libascendcl.so", acl_path, "hcclpy simulator"),
              LoadedLibrary("libhccl.so", hccl_path, "hcclpy simulator"))
    return OpenedLibraries(acl, hccl, None, "sim", loaded)


def _warn_from_caller(message: str, category: type) -> None:
    """Warn once, attributed to the first frame outside hcclpy and torch (the user's line that
    needed a library, such as ``dist.init_process_group("hcclpy")``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(1)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep)
                                 or str(frame.f_globals.get("__name__", "")).startswith("torch.")):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__", "__main__"), registry=registry)


def open_libraries(opener: Opener) -> OpenedLibraries:
    """Find and open the libraries, or raise :class:`LibraryNotFoundError` listing every attempt
    (or, when ``HCCLPY_LIBASCENDCL`` / ``HCCLPY_LIBHCCL`` / ``HCCL_SO_PATH`` names a library that
    cannot be used, naming that variable, its value and why)."""
    choice = _environment.backend()
    failures: List[str] = []
    if choice != "sim":
        opened = _open_cann(opener, failures)
        if opened is not None:
            if choice == "cann" and opened.backend == "sim":
                raise _simulator_refused(opened.loaded)
            return opened
        if choice == "cann":
            raise LibraryNotFoundError(
                "HCCLPY_BACKEND=cann but no usable CANN libraries were found. Tried:\n" + "\n".join(failures)
                + "\nSource <CANN>/set_env.sh or set ASCEND_HOME_PATH (driver libraries must be on "
                "LD_LIBRARY_PATH too).")
    try:
        opened = _open_simulator(opener)
    except (OSError, RuntimeError) as exc:
        why = ("HCCLPY_BACKEND=sim but the simulator" if choice == "sim"
               else "no CANN libraries and the simulator")
        raise LibraryNotFoundError(
            why + " could not be built or loaded: " + str(exc)
            + ("\nCANN candidates tried:\n" + "\n".join(failures) if failures else "")) from exc
    # Only now: a simulator that cannot be built is an error, not a fallback. Once a job: by its
    # rank 0 (or the process that runs alone), as its launcher numbers it.
    if choice == "auto" and launch_rank(_environment.variables()) in (None, 0):
        _warn_from_caller("hcclpy: no CANN installation found, running on the CPU simulator "
                          "(set HCCLPY_BACKEND=cann to require real hardware)", SimulatorFallbackWarning)
    return opened


def _simulator_refused(loaded: Sequence[LoadedLibrary]) -> LibraryNotFoundError:
    """The error for libraries found in a simulator tree under ``HCCLPY_BACKEND=cann``."""
    lib = next(lib for lib in loaded if _is_simulator_tree(lib.path))
    return LibraryNotFoundError(
        f"HCCLPY_BACKEND=cann requires real CANN, but {lib.name} found via {lib.found_via} is the hcclpy "
        f"simulator's: {lib.path}. Point ASCEND_HOME_PATH (and LD_LIBRARY_PATH) at a CANN installation, e.g. "
        "source <CANN>/set_env.sh (a shell prepared with `eval \"$(python -m hcclpy sim env)\"` points them at the "
        "simulator), or unset HCCLPY_BACKEND to run on the simulator.")


def describe(loaded: Sequence[LoadedLibrary]) -> str:
    """One line per library, for ``hcclpy info``."""
    return "\n".join(f"{lib.name}: {lib.path} (via {lib.found_via})" for lib in loaded)


def simulator_build_info(loaded: Sequence[LoadedLibrary]) -> Optional[dict]:
    """The simulator's BUILD_INFO.json when the libraries come from a simulator tree."""
    for lib in loaded:
        if _is_simulator_tree(lib.path):
            with open(Path(lib.path).resolve().parent.parent / "BUILD_INFO.json", encoding="utf-8") as handle:
                return json.load(handle)
    return None
