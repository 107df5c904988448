"""The simulator build: tree layout, set_env.sh, a warning-free log, the cache, concurrent builds, CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hcclpy
import hcclpy.sim
from hcclpy.sim import _build

# Child processes must import the same hcclpy as this one, installed or not.
_IMPORT_ROOT = str(Path(hcclpy.__file__).resolve().parent.parent)
_TREE_ENTRIES = {"lib64", "include", "set_env.sh", "BUILD_INFO.json", "BUILD_LOG.txt"}


def _child_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, env.get("PYTHONPATH")]))
    env.update(overrides)
    return env


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=_child_env(**env), capture_output=True, text=True, timeout=120
    )


def _sourced_env(script: str, env: dict[str, str]) -> dict[str, str]:
    """Run ``script`` in sh, then return the environment it exports."""
    done = subprocess.run(
        ["sh", "-c", script + "\nexec env -0"], env=env, capture_output=True, timeout=60, check=True
    )
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def _readelf_dynamic(library: Path) -> str:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def test_import_neither_builds_nor_loads_a_library(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = _python(
        "import hcclpy, hcclpy.sim\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libhccl' not in maps and 'libascendcl' not in maps, maps\n",
        HCCLPY_SIM_CACHE=str(cache),
    )
    assert done.returncode == 0, done.stderr
    assert not cache.exists()


def test_tree_layout(sim_home: Path) -> None:
    assert sim_home.name.startswith("sim-")
    assert {p.name for p in sim_home.iterdir()} == _TREE_ENTRIES
    lib64 = sim_home / "lib64"
    assert (lib64 / "libascendcl.so").is_file()
    assert (lib64 / "libhccl.so").is_file()
    assert os.readlink(lib64 / "libacl_rt.so") == "libascendcl.so"
    assert os.readlink(lib64 / "libhcomm.so") == "libhccl.so"

    source_headers = _build._SIM_DIR / "include"
    copied = sorted(p.relative_to(sim_home / "include") for p in (sim_home / "include").rglob("*"))
    assert copied == sorted(p.relative_to(source_headers) for p in source_headers.rglob("*"))

    assert "Library soname: [libascendcl.so]" in _readelf_dynamic(lib64 / "libascendcl.so")
    hccl = _readelf_dynamic(lib64 / "libhccl.so")
    assert "Library soname: [libhccl.so]" in hccl
    assert "Shared library: [libascendcl.so]" in hccl
    assert re.search(r"\((RUNPATH|RPATH)\).*\[\$ORIGIN\]", hccl), hccl



def test_the_libraries_export_the_api_and_reserved_names_only(sim_home: Path) -> None:
    # A program that defines a function named like one of the simulator's own (sim_now_ns, say)
    # must not take its place: those travel between the two libraries under reserved names.
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    for name in ("libascendcl.so", "libhccl.so"):
        listing = subprocess.run(["nm", "-D", "--defined-only", str(sim_home / "lib64" / name)], capture_output=True,
                                 text=True, timeout=60, check=True).stdout
        symbols = [line.split()[-1] for line in listing.splitlines() if line.strip()]
        assert symbols and not [s for s in symbols if not s.startswith(("acl", "Hccl", "__hcclpy_"))], name


_OWN_NAMES = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <acl/acl.h>
#include <hccl/hccl.h>

/* A program's own functions that happen to carry the simulator's internal names. */
int64_t sim_now_ns(void) { return 0; }
int sim_error(int code, const char *fmt, ...) { (void)fmt; return code; }

int main(void)
{
    HcclRootInfo info;
    HcclComm comm;
    aclrtStream stream;
    if (aclInit(NULL) != 0 || aclrtSetDevice(0) != 0 || aclrtCreateStream(&stream) != 0 ||
        HcclGetRootInfo(&info) != HCCL_SUCCESS || HcclCommInitRootInfo(1, &info, 0, &comm) != HCCL_SUCCESS)
        return 2;
    HcclResult refused = HcclAllReduce(NULL, NULL, 1, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream);
    const char *message = aclGetRecentErrMsg();
    printf("refused %d: %s\n", (int)refused, message != NULL ? message : "(null)");
    /* Rank 0 of 2 alone: init gives up at HCCL_CONNECT_TIMEOUT (it never did with the program's clock). */
    HcclComm pair;
    if (HcclGetRootInfo(&info) != HCCL_SUCCESS)
        return 2;
    printf("alone %d\n", (int)HcclCommInitRootInfo(2, &info, 0, &pair));
    /* CANN 9.x keeps communicator management in libhcomm.so, which programs may open by name. */
    void *hcomm = dlopen("libhcomm.so", RTLD_NOW);
    printf("libhcomm %s\n", hcomm != NULL && dlsym(hcomm, "HcclGroupStart") != NULL ? "has HcclGroupStart" : dlerror());
    return HcclCommDestroy(comm) == HCCL_SUCCESS ? 0 : 3;
}
"""


@pytest.mark.slow
def test_a_program_may_define_functions_named_like_the_simulators_own(
        compile_c: Any, sim_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "own_names.c"
    source.write_text(_OWN_NAMES)
    binary = compile_c(source, "own_names")
    env = {**os.environ, "HCCL_CONNECT_TIMEOUT": "2", "LD_LIBRARY_PATH": str(sim_home / "lib64")}
    done = subprocess.run([str(binary)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused 2: HcclAllReduce: ") and "NULL" in lines[0], lines  # HCCL_E_PTR
    assert lines[1] == "alone 9", lines  # HCCL_E_TIMEOUT
    assert lines[2] == "libhcomm has HcclGroupStart", lines

def test_build_info(sim_home: Path) -> None:
    info = json.loads((sim_home / "BUILD_INFO.json").read_text())
    assert f"sim-{info['hash']}" == sim_home.name
    assert info["hcclpy_version"] == hcclpy.__version__
    assert info["cflags"] == list(_build.CFLAGS)
    src = _build._SIM_DIR / "src"
    expected = sorted(p.relative_to(_build._SIM_DIR).as_posix() for p in src.glob("acl/*.c"))
    expected += sorted(p.relative_to(_build._SIM_DIR).as_posix() for p in src.glob("hccl/*.c"))
    assert info["sources"] == expected
    assert info["compiler"]["version"]


def test_build_log_has_no_warnings(sim_home: Path) -> None:
    log = (sim_home / "BUILD_LOG.txt").read_text()
    assert log.startswith("$ "), "the log records each compiler command"
    compiler_output = [line for line in log.splitlines() if not line.startswith("$ ") and line.strip()]
    assert compiler_output == [], f"the simulator does not build cleanly:\n{log}"


@pytest.mark.parametrize("before", [None, "", "/opt/a:/opt/b"], ids=["unset", "empty", "set"])
def test_set_env_sh_exports_the_tree(sim_home: Path, before: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if before is not None:
        env["LD_LIBRARY_PATH"] = before
    env["HCCLPY_TEST_SCRIPT"] = str(sim_home / "set_env.sh")
    exported = _sourced_env('. "$HCCLPY_TEST_SCRIPT"', env)
    assert exported["ASCEND_HOME_PATH"] == str(sim_home)
    assert exported["ASCEND_TOOLKIT_HOME"] == str(sim_home)
    lib64 = str(sim_home / "lib64")
    assert exported["LD_LIBRARY_PATH"] == (f"{lib64}:{before}" if before else lib64)


def test_second_build_is_a_cache_hit(sim_home: Path) -> None:
    paths = (sim_home, sim_home / "BUILD_INFO.json", sim_home / "lib64" / "libhccl.so")
    before = [(s.st_ino, s.st_mtime_ns) for s in map(os.stat, paths)]
    assert hcclpy.sim.build() == sim_home
    assert hcclpy.sim.home() == sim_home
    assert [(s.st_ino, s.st_mtime_ns) for s in map(os.stat, paths)] == before


@pytest.mark.slow
def test_concurrent_builds_make_one_tree(tmp_path: Path, sim_home: Path) -> None:
    env = _child_env(HCCLPY_SIM_CACHE=str(tmp_path))
    code = "import hcclpy.sim; print(hcclpy.sim.build())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    deadline = time.monotonic() + 540
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out.strip(), err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [rc for rc, _, _ in results] == [0] * 8, [err for _, _, err in results]
    # Same sources and compiler as this session's tree, so the same hash.
    assert {out for _, out, _ in results} == {str(tmp_path / sim_home.name)}
    assert {p.name for p in tmp_path.iterdir()} == {sim_home.name, sim_home.name + ".lock"}
    assert {p.name for p in (tmp_path / sim_home.name).iterdir()} == _TREE_ENTRIES
    # The one that builds says so, and where the tree went; the others wait without a word.
    said = "".join(err for _, _, err in results)
    assert said.count("hcclpy: compiling the CPU simulator, once for this hcclpy version and compiler") == 1, said
    assert said.count(f"cached in {tmp_path / sim_home.name} (hcclpy sim build builds it ahead of time)") == 1, said


def test_cli_path(sim_home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hcclpy.sim", "path"],
        env=_child_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{sim_home}\n"


def test_cli_env(sim_home: Path) -> None:
    env = _child_env(LD_LIBRARY_PATH="/opt/it's here")
    done = subprocess.run(
        [sys.executable, "-m", "hcclpy.sim", "env"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(re.fullmatch(r"export [A-Z_]+='.*'", line) for line in lines), lines
    exported = _sourced_env(done.stdout, env)
    lib64 = sim_home / "lib64"
    assert exported["ASCEND_HOME_PATH"] == exported["ASCEND_TOOLKIT_HOME"] == str(sim_home)
    assert exported["LD_LIBRARY_PATH"] == f"{lib64}:/opt/it's here"


# The tests below build a tiny stand-in for the C sources, so they are fast and can break it.


@pytest.fixture
def tiny_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the build at a minimal source tree and an empty cache; return the cache root."""
    sim = tmp_path / "sim"
    for relative, text in {
        "include/acl/acl.h": "int aclTiny(void);\n",
        "include/hccl/hccl.h": '#include "acl/acl.h"\nint HcclTiny(void);\n',
        "src/common/export.h": '#define EXPORT __attribute__((visibility("default")))\n',
        "src/acl/tiny.c": '#include "acl/acl.h"\n#include "common/export.h"\n'
        "EXPORT int aclTiny(void) { return 1; }\n",
        "src/hccl/tiny.c": '#include "hccl/hccl.h"\n#include "common/export.h"\n'
        "EXPORT int HcclTiny(void) { return aclTiny() + 1; }\n",
    }.items():
        (sim / relative).parent.mkdir(parents=True, exist_ok=True)
        (sim / relative).write_text(text)
    monkeypatch.setattr(_build, "_SIM_DIR", sim)
    monkeypatch.setenv("HCCLPY_SIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_force_rebuild_replaces_the_tree(tiny_sim: Path) -> None:
    tree = hcclpy.sim.build()
    first = os.stat(tree / "BUILD_INFO.json")
    assert hcclpy.sim.build(force=True) == tree
    second = os.stat(tree / "BUILD_INFO.json")
    assert (second.st_ino, second.st_mtime_ns) != (first.st_ino, first.st_mtime_ns)
    assert {p.name for p in tiny_sim.iterdir()} == {tree.name, tree.name + ".lock"}


def test_source_change_gives_a_new_tree(tiny_sim: Path) -> None:
    tree = hcclpy.sim.build()
    source = _build._SIM_DIR / "src" / "acl" / "tiny.c"
    source.write_text(source.read_text().replace("return 1", "return 2"))
    # The hash is computed once per process, so the change shows only in a fresh one.
    assert hcclpy.sim.build() == tree
    _build._fingerprint.cache_clear()
    rebuilt = hcclpy.sim.build()
    assert rebuilt != tree and (rebuilt / "BUILD_INFO.json").is_file()


def test_compile_error_carries_command_and_output(tiny_sim: Path) -> None:
    broken = _build._SIM_DIR / "src" / "hccl" / "tiny.c"
    broken.write_text("int HcclTiny(void) { return undeclared_name; }\n")
    with pytest.raises(hcclpy.sim.SimulatorBuildError) as caught:
        hcclpy.sim.build()
    assert str(broken) in caught.value.command
    assert "undeclared_name" in caught.value.output
    assert "undeclared_name" in str(caught.value)
    leftovers = [p.name for p in tiny_sim.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].endswith(".lock"), "a failed build leaves only its lock"
