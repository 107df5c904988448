"""Every benchmark script runs end to end (tiny sizes, a short budget): these are not tests of
speed, only that the scripts a reader runs to reproduce the performance tables work and check their
results."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HCCLPY_LAUNCHER")


def _completed(script: str, *args: str, timeout: float = 200, path: str = "") -> "subprocess.CompletedProcess[str]":
    """A benchmark script run to its end with exit status 0 (``path``: directories put first on PATH)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    if path:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _run(script: str, *args: str, timeout: float = 200) -> str:
    return _completed(script, *args, timeout=timeout).stdout


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_compare_writes_its_table_json_and_plot(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    _run("compare.py", "--ranks", "2", "--ops", "all_reduce", "all_gather", "--programs", "hcclpy", "torch",
         "--max-bytes", "512", "--budget", "0.002", "--rounds", "1", "--out", str(tmp_path), timeout=240)
    report = (tmp_path / "compare.md").read_text()
    assert "## all_reduce, 2 ranks" in report and "## all_gather, 2 ranks" in report
    assert "| 512 B |" in report and "## Targets" in report
    assert "- before: vCPUs: " in report and "- after: vCPUs: " in report
    assert len(json.loads((tmp_path / "compare.json").read_text())["vcpus"]) == 2
    seconds = json.loads((tmp_path / "compare.json").read_text())["seconds"]["2"]
    assert set(seconds) == {"hcclpy-device", "hcclpy-numpy", "torch-hcclpy", "gloo"}
    assert all(t > 0 for stack in seconds.values() for sizes in stack.values() for t in sizes.values())
    if (tmp_path / "compare.png").exists():
        assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_compare_times_two_ranks_beside_four_in_the_same_processes(tmp_path: Any) -> None:
    """On 4 ranks, a sub-communicator of ranks 0 and 1 takes turns with the whole world at 64 MiB,
    and the 2-against-4 target is judged on that pair."""
    _run("compare.py", "--ranks", "4", "--ops", "all_reduce", "--programs", "hcclpy", "--max-bytes", "64M",
         "--budget", "0.002", "--rounds", "1", "--out", str(tmp_path), timeout=240)
    pair = json.loads((tmp_path / "compare.json").read_text())["seconds"]["4"]["pair"]
    assert set(pair) == {"all_reduce-world", "all_reduce-pair"}
    assert all(seconds[str(64 << 20)] > 0 for seconds in pair.values())
    assert "2 ranks / 4 ranks, side by side in the 4-rank processes: " in (tmp_path / "compare.md").read_text()


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_compare_times_mpi_in_the_hcclpy_ranks(tmp_path: Any) -> None:
    """With mpi4py and mpiexec there, MPI takes its turns in the hcclpy ranks (one launch, by
    mpiexec), round by round with hcclpy's device and NumPy paths."""
    pytest.importorskip("mpi4py")
    result = _completed("compare.py", "--ranks", "2", "--ops", "all_reduce", "broadcast", "--programs", "hcclpy", "mpi",
                        "--max-bytes", "64", "--budget", "0.002", "--rounds", "1", "--out", str(tmp_path), timeout=240)
    assert "# 2 ranks: hcclpy and mpi ..." in result.stderr and "# 2 ranks: mpi ..." not in result.stderr
    seconds = json.loads((tmp_path / "compare.json").read_text())["seconds"]["2"]
    assert set(seconds) == {"hcclpy-device", "hcclpy-numpy", "mpi"}
    for stack in seconds.values():
        assert set(stack) == {"all_reduce", "broadcast"}
        assert all(set(sizes) == {"8", "64"} and all(t > 0 for t in sizes.values()) for sizes in stack.values())
    assert "8-byte all_reduce, call + stream sync:" in (tmp_path / "compare.md").read_text()


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_compare_keeps_hcclpy_when_mpiexec_fails(tmp_path: Any) -> None:
    """An mpiexec that cannot start the ranks costs MPI's column only: hcclpy's stacks run again
    under ``hcclpy run`` and the report says what happened."""
    pytest.importorskip("mpi4py")
    fake = tmp_path / "bin" / "mpiexec"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'mpiexec: no process manager here' >&2\nexit 3\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    _completed("compare.py", "--ranks", "2", "--ops", "all_reduce", "--programs", "mpi", "hcclpy", "--max-bytes", "8",
               "--budget", "0.002", "--rounds", "1", "--out", str(out), timeout=240, path=str(fake.parent))
    assert set(json.loads((out / "compare.json").read_text())["seconds"]["2"]) == {"hcclpy-device", "hcclpy-numpy"}
    report = (out / "compare.md").read_text()
    assert "hcclpy with mpi on 2 ranks failed, so they ran apart: mpiexec: no process manager here" in report
    assert "mpi on 2 ranks failed: mpiexec: no process manager here" in report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", ["empty", "raw", "hcclpy", "hcclpy-untraced", "hcclpy-numpy", "mpi4py-empty",
                                  "mpi4py"])
@pytest.mark.slow
def test_count_instructions_loops_run(loop: str) -> None:
    """The loops count_instructions.py runs under callgrind (valgrind itself is not needed here)."""
    if loop.startswith("mpi4py"):
        pytest.importorskip("mpi4py")
    _run("count_instructions.py", "--loop", loop, "--calls", "50", timeout=100)


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_overhead_times_every_operation(tmp_path: Any) -> None:
    """overhead.py pairs each hcclpy call with its raw cffi call, sends and receives included (rank
    1 of its own 2-rank communicator answers them), and writes every sample."""
    out = tmp_path / "overhead.json"
    _run("overhead.py", "--calls", "200", "--rounds", "2", "--no-extras", "--quiet", "--cpu", "-1", "--json", str(out))
    data = json.loads(out.read_text())
    operations = {row["group"] for key, row in data["variants"].items() if key.startswith("hcclpy_")}
    assert {"send", "recv", "batch_send_recv", "all_to_all_vc", "broadcast"} <= operations, operations
    for key, row in data["variants"].items():
        assert len(row["samples_ns"]) == 2 and all(t > 0 for t in row["samples_ns"]), key
        if key.startswith("hcclpy_"):
            assert data["variants"][row["raw"]]["group"] == row["group"]
    if importlib.util.find_spec("torch") is not None:  # the torch backend against torch's dispatch floor
        dispatch = data["torch_dispatch"]
        assert dispatch["sums_right"] and dispatch["hcclpy_us"] > 0 and dispatch["floor_us"] > 0, dispatch
    for key, row in data["variants"].items():
        if key.startswith("persistent_"):  # every operation's PersistentOp.start() too
            assert row["raw"] == key.replace("persistent_", "raw_", 1)
    assert {key[len("persistent_"):] for key in data["variants"] if key.startswith("persistent_")} == operations
    targets = {target["target"] for target in data["targets"]}
    for operation in operations | {"all_reduce"}:
        assert f"{operation}: the general path <= raw cffi + 1.5 us" in targets, operation
        assert f"{operation}: PersistentOp.start() <= raw cffi + 0.3 us" in targets, operation


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_numpy_vs_device_runs_and_checks_its_results() -> None:
    out = _run("numpy_vs_device.py", "--min-bytes", "8", "--max-bytes", "64", "--rounds", "1", "--budget", "1024")
    assert "# 64 B: numpy" in out and "ratio" in out and "wrong elements (all ranks, last round of each size): 0" in out
    assert "copy in + device + copy out" in out and out.startswith("# before: vCPUs: ") and "# after: vCPUs: " in out


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_torch_vs_gloo_runs_and_checks_its_results() -> None:
    pytest.importorskip("torch")
    out = _run("torch_vs_gloo.py", "--min-bytes", "8", "--max-bytes", "64", "--rounds", "1", "--budget", "1024")
    wrong = [line for line in out.splitlines() if "wrong elements" in line]
    assert "# 8 B latency: hcclpy" in out and wrong and wrong[0].endswith(": 0"), out
    assert "# before: vCPUs: " in out and "# after: vCPUs: " in out


@pytest.mark.timeout(120)
def test_servers_vs_gloo_runs_two_launchers_and_checks_its_results() -> None:
    """servers_vs_gloo.py: two ``hcclpy run --nnodes 2`` launchers, 2 simulated servers x 2 ranks,
    hcclpy's path across servers next to gloo in the same 4 processes, every result checked."""
    pytest.importorskip("torch")
    out = _run("servers_vs_gloo.py", "--max-bytes", "1M", "--rounds", "1", "--budget", "1024", timeout=100)
    assert "2 simulated servers x 2 ranks" in out and "same 4 ranks" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] in (["B"], ["MiB"])]
    assert [row[:2] for row in rows] == [["8", "B"], ["1", "MiB"]], out
    assert all(float(cell) > 0 for row in rows for cell in row[3:5]), out  # the two times
    assert "# 8 B latency: hcclpy" in out and "# 1 MiB busbw: hcclpy" in out, out
    assert "# wrong elements (all ranks; gloo's while float32 holds the sum exactly): 0" in out, out
    assert out.startswith("# before: vCPUs: ") and "# after: vCPUs: " in out


@pytest.mark.timeout(240)
def test_init_time_reports_each_rank_count() -> None:
    out = _run("init_time.py", "--ranks", "2", "--repeat", "1")
    row = [line.split() for line in out.splitlines() if line.split()[:1] == ["2"]]
    assert row and all(float(x) > 0 for x in row[0][1:]), out


@pytest.mark.timeout(240)
def test_the_c_benchmark_builds_and_runs_against_the_simulator() -> None:
    out = _run("run_sim_allreduce.py", "--", "-b", "8", "-e", "1K", "-f", "8", "-n", "5", "-w", "1")
    assert "# Out of bounds values : 0 OK" in out and "memcpy reference" in out, out
    assert "# before: vCPUs: " in out and "# after: vCPUs: " in out, out


@pytest.mark.timeout(240)
def test_graph_replay_times_the_three_ways_and_checks_them() -> None:
    """graph_replay.py: a captured batch replayed, the same calls from Python and as a persistent
    operation, side by side on 2 ranks, each way's result checked."""
    out = _run("graph_replay.py", "--calls", "10", "--rounds", "2")
    starts = ("comm.", "PersistentOp.", "graph.", "  raw")
    rows = {line[:38].strip(): line[38:].split() for line in out.splitlines() if line.startswith(starts)}
    assert set(rows) == {"comm.all_reduce(x, stream=s) x10", "PersistentOp.start() x10", "graph.replay() (10 captured)",
                         "raw cffi HcclAllReduce x10", "raw cffi aclmdlRIExecuteAsync"}, out
    assert all(len(cells) == 4 and all(float(cell) > 0 for cell in cells) for cells in rows.values()), out
    assert "queue time ratios: python/replay " in out and "# target (issue 31): replay's queue time >= 20x" in out
    assert "every way's checked batch gave the expected sum on every rank" in out, out
    assert out.startswith("# before: vCPUs: ") and "# after: vCPUs: " in out
