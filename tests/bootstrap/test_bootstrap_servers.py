"""hcclpy.init across simulated servers on one machine, under the launchers of multi-node jobs:
MPI (an MPMD mpiexec whose two parts are two servers) and Slurm (two nodes' environments). Every
server uses devices 0 and 1: ranks of one server could not, so a passing job is a job across
servers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import ranks
from test_bootstrap import LAUNCH_VARIABLES, PROCESS_TIMEOUT, check_job

SCRIPT = """
    import json, numpy as np, hcclpy
    from hcclpy.bootstrap import detect_launch
    launch = detect_launch()
    comm = hcclpy.init(timeout=60, device=launch.rank % 2)
    total = comm.all_reduce(np.array([comm.rank, 1], dtype=np.int64))
    print(json.dumps({"rank": comm.rank, "size": comm.size, "device": comm.rank, "sum": total.tolist(),
                      "launcher": launch.launcher, "name": comm.name}) + "\\n", end="", flush=True)
    hcclpy.shutdown()
"""


def test_init_under_mpiexec_across_two_servers(tmp_path: Path) -> None:
    mpiexec = ranks.launcher("mpiexec", 2)[:-3]  # the program's part: [mpiexec]
    command = [*mpiexec]
    for server in ("a", "b"):
        if len(command) > len(mpiexec):
            command.append(":")
        command += ["-n", "2", "env", f"HCCLPY_SIM_SERVER={server}", sys.executable, str(tmp_path / "job.py")]
    (tmp_path / "job.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, **ranks.RANK_ENV}
    for name in LAUNCH_VARIABLES:
        env.pop(name, None)
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for text in re.findall(r"\{[^{}]*\}", proc.stdout):
        row = json.loads(text)
        rows[row["rank"]] = row
    check_job(rows, 4, ("pmi", "openmpi"))


def _slurm_env(rank: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(ranks.RANK_ENV)
    env.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": "4", "SLURM_LOCALID": str(rank % 2),
                "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_NODEID": str(rank // 2),
                "SLURM_JOB_ID": f"{os.getpid()}", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "localhost",
                "HCCLPY_RENDEZVOUS_TOKEN": "a secret of this test's job"})
    return env


def test_init_under_slurm_across_two_nodes(tmp_path: Path) -> None:
    # What srun -N 2 --ntasks-per-node 2 gives each task: the simulator puts node K's ranks on
    # server node<K>.
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    procs: List[subprocess.Popen] = [
        subprocess.Popen([sys.executable, str(script)], env=_slurm_env(rank), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for rank in range(4)]
    rows = {}
    for proc in procs:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
        assert proc.returncode == 0, out + err
        row = json.loads(out.strip().splitlines()[-1])
        rows[row["rank"]] = row
    check_job(rows, 4, ("slurm",))
