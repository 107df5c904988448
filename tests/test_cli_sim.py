"""``hcclpy sim path|build|env``: the simulator's tree and the shell environment that points at it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

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
