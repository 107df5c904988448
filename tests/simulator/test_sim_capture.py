"""Stream capture on the simulator, from C: ``c/capture_rules.c`` (what is recorded and replayed,
the calls a capture refuses in each mode, streams joined through events, task groups updated in
place) and ``examples/c/allreduce_graph.c`` (an HcclAllReduce captured once and replayed four
times by every rank) under ``hcclpy run`` and ``mpiexec``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ranks
import sim_runner as runner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "c" / "allreduce_graph.c"


@pytest.mark.timeout(120)
def test_capture_rules(compile_c, sim_env):
    binary = compile_c([runner.C_DIR / "capture_rules.c"], "capture_rules")
    result = runner.run(binary, [], sim_env, timeout=90)
    runner.check(result)
    assert re.search(r"capture_rules: \d+ checks OK", result.output), result.output


def _expected(size: int) -> list:
    ranks_sum = size * (size + 1) // 2
    return [f"rank {r} of {size}: replay {k}: sum = {k * ranks_sum} (expected {k * ranks_sum}): OK"
            for r in range(size) for k in range(1, 5)]


def _lines(output: str) -> list:
    return sorted(re.sub(r"^\[\d+\] ", "", line) for line in output.splitlines() if "replay" in line)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_a_captured_all_reduce_replays_under_hcclpy_run(compile_c, sim_env, size):
    binary = compile_c([EXAMPLE], "allreduce_graph")
    done = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", str(size), "--no-python", str(binary)],
                          env=sim_env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _lines(done.stdout) == sorted(_expected(size)), done.stdout


@pytest.mark.timeout(240)
@pytest.mark.mpi
@pytest.mark.parametrize("size", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_a_captured_all_reduce_replays_under_mpiexec(compile_c, sim_env, size, tmp_path):
    launcher = ranks.launcher("mpiexec", size)[:-1]  # (without the Python it appends)
    binary = compile_c([EXAMPLE], "allreduce_graph")
    done = subprocess.run([*launcher, str(binary), str(tmp_path / "rootinfo")], env=sim_env, capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _lines(done.stdout) == sorted(_expected(size)), done.stdout
