"""Every example runs, checks its own results and exits 0: through ``hcclpy run`` at several rank
counts, without any launcher, and the C examples built as ``examples/c/README.md`` says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

import ranks

from hcclpy.cli.run import FOREIGN_RANK_VARIABLES

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TIMEOUT = 120  # seconds per example run; the launcher's own --timeout fires first
LINE = re.compile(r"^\[(\d+)\] (.*)$")

# Short HCCL timeouts, so a broken example fails in seconds rather than waiting for a peer.
FAST_FAIL = {"HCCL_CONNECT_TIMEOUT": "60", "HCCL_EXEC_TIMEOUT": "60"}

CASES = [
    *(("allreduce.py", n) for n in (1, 2, 4)),
    *(("collectives.py", n) for n in (1, 2, 4)),
    *(("numpy_arrays.py", n) for n in (1, 2, 4)),
    *(("ring.py", n) for n in (1, 2, 4)),
    *(("streams_events.py", n) for n in (1, 2)),
    ("grid.py", 4),
    ("hierarchical_allreduce.py", 4),
    *(("torch_ddp.py", n) for n in (1, 3)),
]


def no_launcher_env() -> Dict[str, str]:
    """``os.environ`` without any launcher's variables."""
    launcher_variables = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "GROUP_RANK", "NODE_RANK", "HCCLPY_LAUNCHER", *FOREIGN_RANK_VARIABLES}
    return {**{k: v for k, v in os.environ.items() if k not in launcher_variables}, **FAST_FAIL}


def run_example(name: str, nranks: int, *args: str) -> Dict[int, List[str]]:
    """``hcclpy run -n nranks examples/name args`` must exit 0; return each rank's stdout lines."""
    command = [sys.executable, "-m", "hcclpy", "run", "-n", str(nranks), "--timeout", str(TIMEOUT - 30),
               str(EXAMPLES / name), *args]
    result = subprocess.run(command, capture_output=True, text=True, env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 0, f"$ {shlex.join(command)}\n{result.stdout}\n{result.stderr}"
    lines: Dict[int, List[str]] = {}
    for line in result.stdout.splitlines():
        match = LINE.match(line)
        assert match, f"unprefixed output line {line!r}"
        lines.setdefault(int(match.group(1)), []).append(match.group(2))
    assert sorted(lines) == list(range(nranks)), result.stdout
    return lines


def test_every_example_is_covered():
    python_examples = {path.name for path in EXAMPLES.glob("*.py")}
    assert python_examples == {name for name, _ in CASES} | {"allreduce_c.py", "mpi_bootstrap.py"}
    for name in {name for name, _ in CASES}:
        text = (EXAMPLES / name).read_text()
        assert text.startswith('"""') and f"hcclpy run -n 4 examples/{name}" in text.split('"""')[1], \
            f"{name}: its docstring does not say how to run it"


@pytest.mark.parametrize("name, nranks", CASES, ids=[f"{name[:-3]}-{n}" for name, n in CASES])
@pytest.mark.slow
def test_example_under_hcclpy_run(name, nranks, sim_home):
    lines = run_example(name, nranks)
    for rank, output in lines.items():
        text = "\n".join(output)
        assert output and "WRONG" not in text and "DIFFERS" not in text, f"rank {rank}: {text}"


def test_allreduce_prints_the_sums(sim_home):
    lines = run_example("allreduce.py", 4)
    assert lines == {r: [f"rank {r} of 4: [0.0, 4.0, 8.0, 12.0] OK"] for r in range(4)}


def test_hierarchical_allreduce_with_another_group_size(sim_home):
    lines = run_example("hierarchical_allreduce.py", 4, "--group-size", "4")
    assert [text for output in lines.values() for text in output if "groups of 4" in text and "equals" in text]


@pytest.mark.parametrize("group_size", ["0", "-2"])
def test_hierarchical_allreduce_refuses_a_group_size_below_one(sim_home, group_size):
    result = subprocess.run([sys.executable, str(EXAMPLES / "hierarchical_allreduce.py"), "--group-size", group_size],
                            capture_output=True, text=True, env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--group-size {group_size}: use a positive divisor of the number of ranks, 1" in result.stderr


@pytest.mark.mpi
def test_mpi_bootstrap_under_mpiexec(sim_home):
    pytest.importorskip("mpi4py", reason="the example needs mpi4py (in the test extra)")
    command = [*ranks.launcher("mpiexec", 3), str(EXAMPLES / "mpi_bootstrap.py")]
    result = subprocess.run(command, capture_output=True, text=True, env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    # The ranks share mpiexec's stdout, so their lines may interleave.
    said = sorted(re.findall(r"rank \d of 3: HCCL sum \d+, MPI sum \d+: (?:OK|WRONG)", result.stdout))
    assert said == [f"rank {r} of 3: HCCL sum 3, MPI sum 3: OK" for r in range(3)], result.stdout
    assert result.stderr.count("no CANN installation found") == 1, result.stderr  # said by rank 0 alone


def test_allreduce_without_a_launcher(sim_home):
    result = subprocess.run([sys.executable, str(EXAMPLES / "allreduce.py")], capture_output=True, text=True,
                            env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "rank 0 of 1: [0.0] OK"


@pytest.mark.slow
def test_torch_ddp_without_a_launcher(sim_home):
    result = subprocess.run([sys.executable, str(EXAMPLES / "torch_ddp.py")], capture_output=True, text=True,
                            env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "rank 0 of 1" in result.stdout and "identical on every rank" in result.stdout


def test_allreduce_c_driver(sim_home):
    result = subprocess.run([sys.executable, str(EXAMPLES / "allreduce_c.py")], capture_output=True, text=True,
                            env=no_launcher_env(), timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 of 4 ranks hold the expected sum" in result.stdout


def test_c_examples_as_the_readme_says(sim_home, tmp_path):
    """The shell commands of examples/c/README.md, run by a shell from the repository root."""
    readme = (EXAMPLES / "c" / "README.md").read_text()
    block = re.search(r"## On the simulator.*?```sh\n(.*?)```", readme, re.S)
    assert block, "examples/c/README.md lost its simulator commands"
    commands = block.group(1)
    assert 'eval "$(hcclpy sim env)"' in commands
    # The README runs the console script; this runs the same CLI from this interpreter.
    shim = tmp_path / "bin" / "hcclpy"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hcclpy \"$@\"\n")
    shim.chmod(0o755)
    env = {**no_launcher_env(), "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = "set -e\n" + commands.replace("-o allreduce_ranks", f"-o {tmp_path}/allreduce_ranks") \
        .replace("-o allreduce", f"-o {tmp_path}/allreduce").replace("./allreduce", f"{tmp_path}/allreduce")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=TIMEOUT)
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    assert "4 of 4 ranks hold the expected sum" in result.stdout
    for rank in range(4):
        assert re.search(rf"^\[{rank}\] rank {rank} of 4 on device {rank}: .*: OK$", result.stdout, re.M), \
            result.stdout
