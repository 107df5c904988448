"""hcclpy's C declarations, parsed once ahead of time.

cffi parses declarations with pycparser, which was a large part of every ``import hcclpy``, in
every rank of every job. In cffi's out-of-line ABI mode the parse is done once, by :func:`write`,
into ``_cdata.py``: a module that loads in a few milliseconds. Nothing is compiled: the libraries
are still opened with ``ffi.dlopen``.

The declarations themselves live in the ``cdef_*`` modules. After changing one, regenerate::

    python -m hcclpy._ffi._declarations

Until then the declarations are parsed at import, with a warning; a test checks that ``_cdata.py``
is current.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

from . import cdef_acl, cdef_dlpack, cdef_hccl, cdef_hccl_types

SOURCE = cdef_acl.TYPES + cdef_hccl_types.TYPES + cdef_dlpack.TYPES + cdef_acl.FUNCTIONS + cdef_hccl.FUNCTIONS
DIGEST = hashlib.sha256(SOURCE.encode()).hexdigest()
GENERATED = Path(__file__).with_name("_cdata.py")


def parse() -> Any:
    """The declarations parsed now: a ``cffi.FFI`` (the slow way, the generator's input)."""
    import cffi

    builder = cffi.FFI()
    builder.cdef(SOURCE)
    return builder


def write(path: Path = GENERATED) -> None:
    """Write the parsed declarations to ``path``, with the digest of the text they came from."""
    builder = parse()
    builder.set_source(f"{__package__}._cdata", None)
    builder.emit_python_code(str(path))
    with open(path, "a") as f:
        f.write(f"\n# sha256 of hcclpy._ffi._declarations.SOURCE when this file was written\nDIGEST = {DIGEST!r}\n")


def _load() -> Any:
    try:
        from . import _cdata
    except ImportError:  # not written yet
        _cdata = None
    if _cdata is not None and getattr(_cdata, "DIGEST", None) == DIGEST:
        return _cdata.ffi
    warnings.warn("hcclpy's C declarations changed since hcclpy/_ffi/_cdata.py was written: parsing them at "
                  "every import (slow) until 'python -m hcclpy._ffi._declarations' writes it again",
                  RuntimeWarning, stacklevel=2)
    return parse()


ffi = _load()

if __name__ == "__main__":
    write()
    print(f"wrote {GENERATED}")
