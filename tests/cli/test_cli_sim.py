"""``hcclpy sim path|build|env``: the simulator's tree and the shell environment that points at it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

import hcclpy.sim
from hcclpy.cli import main

TIMEOUT = 600  # seconds; a cold cache builds the simulator


def hcclpy_sim(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hcclpy", "sim", *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT)


def test_path_is_the_default_and_names_the_tree(sim_home):
    for args in ((), ("path",), ("build",)):
        result = hcclpy_sim(*args)
        assert result.returncode == 0, result.stderr
        assert Path(result.stdout.strip()) == sim_home
    assert (sim_home / "lib64" / "libhccl.so").is_file() and (sim_home / "include" / "hccl" / "hccl.h").is_file()


def test_env_prints_exports_a_shell_can_eval(sim_home):
    result = hcclpy_sim("env")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(re.fullmatch(r"export [A-Z_]+='[^']*'", line) for line in lines), lines
    shell = subprocess.run(["sh", "-c", 'eval "$(cat)"; printf "%s\\n" "$ASCEND_HOME_PATH" "$ASCEND_TOOLKIT_HOME" '
                            '"$LD_LIBRARY_PATH"'], input=result.stdout, capture_output=True, text=True,
                           env={**os.environ, "LD_LIBRARY_PATH": "/opt/x"}, timeout=30)
    home, toolkit, library_path = shell.stdout.splitlines()
    assert Path(home) == Path(toolkit) == sim_home
    assert library_path.split(":")[0] == str(sim_home / "lib64")
    assert hcclpy.sim.env()["ASCEND_HOME_PATH"] == home


def test_build_force_is_passed_on(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(hcclpy.sim, "build", lambda force=False: calls.append(force) or tmp_path)
    assert main(["sim", "build", "--force"]) == 0
    assert main(["sim", "build"]) == 0
    assert calls == [True, False]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path)] * 2


def test_usage_errors():
    assert hcclpy_sim("path", "--force").returncode == 2
    assert hcclpy_sim("nonsense").returncode == 2


def test_build_failure_exits_1(tmp_path):
    env = {**os.environ, "HCCLPY_SIM_CACHE": str(tmp_path / "cache"), "CC": "false"}
    result = hcclpy_sim("build", env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("hcclpy sim: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("action", ["path", "build", "env"])
@pytest.mark.parametrize("cache", ["/proc/nope", "file/below"])
def test_unusable_cache_is_a_message_naming_hcclpy_sim_cache(tmp_path, action, cache):
    # /proc refuses new directories (even to root); a file cannot hold one.
    (tmp_path / "file").write_text("")
    root = cache if os.path.isabs(cache) else str(tmp_path / cache)
    result = hcclpy_sim(action, env={**os.environ, "HCCLPY_SIM_CACHE": root})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"hcclpy sim: cannot build the simulator in its cache directory {root} "
                                    f"(HCCLPY_SIM_CACHE={root!r}): "), result.stderr
    assert "Set HCCLPY_SIM_CACHE to a directory" in result.stderr
    assert result.stdout == ""


def test_unusable_default_cache_names_xdg_cache_home(tmp_path):
    (tmp_path / "file").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "HCCLPY_SIM_CACHE"}
    result = hcclpy_sim("path", env={**env, "XDG_CACHE_HOME": str(tmp_path / "file")})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"cache directory {tmp_path / 'file' / 'hcclpy'} (XDG_CACHE_HOME=" in result.stderr, result.stderr


def test_a_finished_tree_in_a_read_only_cache_is_used(sim_home, monkeypatch):
    # Only building writes: the tree of the session cache is found without touching the directory.
    monkeypatch.setattr(hcclpy.sim._build.Path, "mkdir", lambda *a, **k: pytest.fail("mkdir called"))
    assert hcclpy.sim.build() == sim_home


def test_lock_timeout_is_a_message(monkeypatch, capsys, tmp_path):
    def locked(force=False):
        raise TimeoutError(f"waited 1800 s for another process building the simulator (lock {tmp_path}/x.lock)")

    monkeypatch.setattr(hcclpy.sim, "build", locked)
    assert main(["sim", "path"]) == 1
    assert capsys.readouterr().err.startswith("hcclpy sim: waited 1800 s for another process building")
