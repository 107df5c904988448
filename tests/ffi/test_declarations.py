"""The C declarations are parsed ahead of time (hcclpy/_ffi/_cdata.py) and used as parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

import hcclpy
import hcclpy.sim
from hcclpy import _ffi
from hcclpy._ffi import _declarations, _loader


def test_the_parsed_declarations_are_those_of_the_cdef_modules(tmp_path: Path) -> None:
    written = tmp_path / "_cdata.py"
    _declarations.write(written)
    assert written.read_text() == _declarations.GENERATED.read_text(), (
        "hcclpy/_ffi/_cdata.py is out of date: run python -m hcclpy._ffi._declarations")
    assert _ffi.ffi is _declarations.ffi and not hasattr(_ffi.ffi, "cdef")  # the parsed ones are in use


def test_declarations_changed_since_they_were_parsed_are_parsed_at_import_with_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_declarations, "DIGEST", "0" * 64)
    with pytest.warns(RuntimeWarning, match=r"changed since hcclpy/_ffi/_cdata.py was written.*"
                                            r"python -m hcclpy._ffi._declarations"):
        parsed = _declarations._load()
    for declared in ("HcclResult(*)(void *, void *, uint64_t, HcclDataType, HcclReduceOp, void *, void *)",
                     "DLManagedTensor *", "aclrtMemcpyKind"):
        assert parsed.typeof(declared).cname == _ffi.ffi.typeof(declared).cname


def test_a_library_without_a_function_hcclpy_needs_is_refused_by_name() -> None:
    # libascendcl.so in the place of libhccl.so: a real library, lacking every HCCL function.
    acl = str(hcclpy.sim.build() / "lib64" / "libascendcl.so")
    lib = _ffi.ffi.dlopen(acl)
    loaded = (_loader.LoadedLibrary("libascendcl.so", acl, "test"),)
    opened = _loader.OpenedLibraries(acl=lib, hccl=lib, hcomm=None, backend="sim", loaded=loaded)
    with pytest.raises(hcclpy.LibraryNotFoundError, match=r"libascendcl.so does not export Hccl\w+; hcclpy needs it"):
        _ffi._bind(opened, None)
