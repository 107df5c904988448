"""hcclpy.library_info(), hcclpy.has() and hcclpy.backend() on the simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hcclpy

_IMPORT_ROOT = str(Path(hcclpy.__file__).resolve().parent.parent)


def test_backend_is_the_simulator() -> None:
    assert hcclpy.backend() == "sim"


def test_has() -> None:
    for name in ("HcclAllReduce", "HcclAllGatherV", "HcclReduceScatterV", "HcclAlltoAllVC", "HcclGroupStart",
                 "HcclCreateSubCommConfig", "HcclCommInitAll", "aclrtSynchronizeStreamWithTimeout", "aclrtMalloc"):
        assert hcclpy.has(name) is True, name
    for name in ("HcclNoSuchFunction", "", "aclrtNope", "has"):
        assert hcclpy.has(name) is False, name


def test_library_info() -> None:
    info = hcclpy.library_info()
    assert set(info) >= {"backend", "libraries", "functions", "simulator"}
    assert info["backend"] == "sim"
    names = [lib["name"] for lib in info["libraries"]]
    assert "libascendcl.so" in names and "libhccl.so" in names
    for lib in info["libraries"]:
        assert set(lib) == {"name", "path", "found_via"}
        assert lib["path"].endswith(lib["name"]) and os.path.exists(lib["path"])
    functions = info["functions"]
    assert functions == dict(sorted(functions.items()))
    assert all(isinstance(v, bool) for v in functions.values())
    assert functions["HcclAllReduce"] is True and functions["aclInit"] is True
    for name, present in functions.items():
        assert hcclpy.has(name) is present
    simulator = info["simulator"]
    assert isinstance(simulator, dict) and simulator.get("hcclpy_version") == hcclpy.__version__


def test_import_loads_nothing_until_asked() -> None:
    code = ("import hcclpy\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert 'libhccl' not in maps and 'libascendcl' not in maps\n"
            "assert hcclpy.backend() == 'sim'\n"
            "maps = open('/proc/self/maps').read()\n"
            "assert 'libhccl' in maps and 'libascendcl' in maps\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
