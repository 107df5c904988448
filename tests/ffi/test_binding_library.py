"""hcclpy.library_info(), hcclpy.has() and hcclpy.backend() on the simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# --- explicit library paths and the simulator cache, as a fresh process sees them ----------------

_SEARCH_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "HCCLPY_LIBASCENDCL", "HCCLPY_LIBHCCL",
                     "HCCL_SO_PATH", "HCCLPY_BACKEND", "LD_LIBRARY_PATH")

# Prints the backend and how libhccl.so was found, or the error that loading the libraries raised.
_LOAD = ("import warnings, hcclpy\n"
         "from hcclpy import SimulatorFallbackWarning\n"
         "warnings.simplefilter('error', SimulatorFallbackWarning)\n"
         "try:\n"
         "    info = hcclpy.library_info()\n"
         "except hcclpy.LibraryNotFoundError as exc:\n"
         "    print('LibraryNotFoundError:', exc)\n"
         "else:\n"
         "    print(info['backend'], [lib['found_via'] for lib in info['libraries']])\n")


def _load_in_child(**variables: str) -> str:
    """What :data:`_LOAD` prints in a process whose library search sees only ``variables``."""
    env = {k: v for k, v in os.environ.items() if k not in _SEARCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _LOAD], env={**env, **variables}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("backend", ["auto", "cann"])
@pytest.mark.parametrize("variable", ["HCCLPY_LIBASCENDCL", "HCCLPY_LIBHCCL", "HCCL_SO_PATH"])
def test_an_override_naming_no_file_is_an_error(tmp_path, variable, backend):
    # Not a fall back to the next candidate or to the simulator: the user asked for this file.
    missing = str(tmp_path / "no" / "such.so")
    out = _load_in_child(**{variable: missing, "HCCLPY_BACKEND": backend})
    soname = "libascendcl.so" if variable == "HCCLPY_LIBASCENDCL" else "libhccl.so"
    assert out.startswith(f"LibraryNotFoundError: {variable}={missing!r} cannot be used as {soname}: "
                          "no such file."), out
    assert "unset it" in out


def test_an_override_that_does_not_load_is_an_error(sim_home, tmp_path):
    junk = tmp_path / "libhccl.so"
    junk.write_text("not a shared library\n")
    out = _load_in_child(HCCLPY_LIBASCENDCL=str(sim_home / "lib64" / "libascendcl.so"), HCCLPY_LIBHCCL=str(junk))
    assert out.startswith(f"LibraryNotFoundError: HCCLPY_LIBHCCL={str(junk)!r} cannot be used as libhccl.so: "
                          "it does not load ("), out
    assert out.count(str(junk)) >= 2  # the value, and the loader's own error naming the file


def test_hccl_so_path_is_not_consulted_when_hcclpy_libhccl_is_set(sim_home):
    lib64 = sim_home / "lib64"
    out = _load_in_child(HCCLPY_LIBASCENDCL=str(lib64 / "libascendcl.so"), HCCLPY_LIBHCCL=str(lib64 / "libhccl.so"),
                         HCCL_SO_PATH="/no/such/libhccl.so")
    # libhcomm.so (CANN 9.x) is looked for next to the libhccl.so found: the simulator has one.
    assert out == "sim ['HCCLPY_LIBASCENDCL', 'HCCLPY_LIBHCCL', 'next to libhccl.so']"


def test_an_override_without_the_other_library_does_not_fall_back(sim_home):
    # libhccl.so is nowhere to be found (no CANN here): running the simulator would ignore the override.
    acl = str(sim_home / "lib64" / "libascendcl.so")
    out = _load_in_child(HCCLPY_LIBASCENDCL=acl)
    assert out.startswith(f"LibraryNotFoundError: HCCLPY_LIBASCENDCL={acl!r} is set, but no usable libhccl.so was "
                          "found to go with it, so hcclpy does not fall back to the simulator"), out
    assert "libhccl.so (system loader):" in out


@pytest.mark.parametrize("launcher, notice", [
    ({}, True),  # alone
    ({"RANK": "0", "WORLD_SIZE": "2"}, True),  # rank 0 says it for the job...
    ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # ...the other ranks do not
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, True),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, False),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, False),
])
def test_no_override_still_falls_back_to_the_simulator_and_says_so_once_a_job(launcher, notice):
    env = {k: v for k, v in os.environ.items() if k not in _SEARCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", "import hcclpy; print(hcclpy.backend())"], env={**env, **launcher},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sim"
    assert done.stderr.count("SimulatorFallbackWarning") == (1 if notice else 0), done.stderr


@pytest.mark.parametrize("cache", ["/proc/nope", "file/below"])
def test_an_unusable_simulator_cache_names_hcclpy_sim_cache(tmp_path, cache):
    (tmp_path / "file").write_text("")  # a file where the cache wants a directory
    root = cache if os.path.isabs(cache) else str(tmp_path / cache)
    out = _load_in_child(HCCLPY_BACKEND="sim", HCCLPY_SIM_CACHE=root)
    assert out.startswith("LibraryNotFoundError: HCCLPY_BACKEND=sim but the simulator could not be built or "
                          f"loaded: cannot build the simulator in its cache directory {root} "
                          f"(HCCLPY_SIM_CACHE={root!r}): "), out
    assert "Set HCCLPY_SIM_CACHE to a directory" in out


# --- HCCLPY_BACKEND=cann in a shell prepared for the simulator -----------------------------------

@pytest.mark.parametrize("variable", ["ASCEND_HOME_PATH", "LD_LIBRARY_PATH"])
def test_backend_cann_refuses_a_simulator_tree(sim_home, variable):
    """``eval "$(python -m hcclpy sim env)"`` points these at the simulator, which =cann once ran on."""
    value = str(sim_home / "lib64") if variable == "LD_LIBRARY_PATH" else str(sim_home)
    how = "system loader" if variable == "LD_LIBRARY_PATH" else "$ASCEND_HOME_PATH/lib64"
    out = _load_in_child(**{variable: value, "HCCLPY_BACKEND": "cann"})
    path = os.path.realpath(sim_home / "lib64" / "libascendcl.so")
    assert out.startswith(f"LibraryNotFoundError: HCCLPY_BACKEND=cann requires real CANN, but libascendcl.so found "
                          f"via {how} is the hcclpy simulator's: {path}. "), out
    assert "unset HCCLPY_BACKEND to run on the simulator" in out


def test_the_simulator_found_by_the_system_loader_is_named_sim(sim_home):
    """A simulator on LD_LIBRARY_PATH was once reported as the backend cann, at the bare soname."""
    out = _load_in_child(LD_LIBRARY_PATH=str(sim_home / "lib64"))
    assert out == "sim ['system loader', 'system loader', 'next to libhccl.so']", out
    info = subprocess.run([sys.executable, "-c", "import hcclpy; print(hcclpy.library_info()['libraries'][1]['path'])"],
                          env={**{k: v for k, v in os.environ.items() if k not in _SEARCH_VARIABLES},
                               "LD_LIBRARY_PATH": str(sim_home / "lib64"),
                               "PYTHONPATH": os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))},
                          capture_output=True, text=True, timeout=300)
    assert info.stdout.strip() == os.path.realpath(sim_home / "lib64" / "libhccl.so"), info.stderr


def test_no_fallback_warning_when_the_simulator_cannot_be_built():
    """The fallback warning once came before the error saying the simulator could not be built
    (:data:`_LOAD` turns the warning into an error, so it would end the child first)."""
    out = _load_in_child(HCCLPY_SIM_CACHE="/proc/nope")
    assert out.startswith("LibraryNotFoundError: no CANN libraries and the simulator could not be built or loaded: "
                          "cannot build the simulator in its cache directory /proc/nope"), out
