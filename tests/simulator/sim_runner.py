"""Build and run the C test programs of this directory (used by the ``test_sim_*.py`` files beside it).

Every program takes ``--ranks N --mode threads|procs|mixed`` (plus its own options), runs all its
cases, prints one ``FAIL ...`` line per failure and ends with ``RESULT: PASS|FAIL``; its exit code
is 0 only if everything passed. A program enforces its own ``--deadline`` (it names the case that
hung); :func:`run` adds an outer timeout and kills the program's whole process group, so that
forked ranks never outlive a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import ranks

C_DIR = Path(__file__).resolve().parent / "c"
HARNESS = C_DIR / "harness.c"

# Environment for every run: fail a stuck operation or init long before the deadline of the
# program, but leave plenty of time for 8 ranks on 2 cores.
BASE_ENV = {"HCCL_EXEC_TIMEOUT": "60", "HCCL_CONNECT_TIMEOUT": "60"}


def build(compile_c: Callable[..., Path], name: str, *, cplusplus: bool = False) -> Path:
    """Compile ``<name>.c`` (with the harness) or ``<name>.cpp`` (alone) with ``compile_c``."""
    if cplusplus:
        return compile_c([C_DIR / f"{name}.cpp"], name, cplusplus=True, extra_flags=("-std=c++14",))
    return compile_c([HARNESS, C_DIR / f"{name}.c"], name)


def rank_args(nranks: int, mode: str) -> list[str]:
    """``--ranks/--mode`` arguments; ``mixed`` means 2 processes x nranks/2 threads."""
    args = ["--ranks", str(nranks), "--mode", mode]
    if mode == "mixed":
        args += ["--procs", "2"]
    return args


@dataclass
class Result:
    command: list[str]
    returncode: Optional[int]  # None: killed by the outer timeout
    output: str
    seconds: float
    leftover_processes: bool = False  # processes of the program outlived it
    new_shm: Sequence[str] = ()  # /dev/shm entries that appeared during the run and stayed

    def report(self) -> str:
        """What a failed test shows: the failure lines first, then the end of the output."""
        lines = self.output.splitlines()
        important = [
            ln for ln in lines if ln.startswith(("FAIL", "FATAL", "TIMEOUT", "RESULT", "launch", "["))
        ]
        head = "\n".join(important[:80])
        tail = "\n".join(lines[-40:])
        status = "killed by the outer timeout" if self.returncode is None else f"exit code {self.returncode}"
        return (
            f"$ {' '.join(self.command)}\n-> {status} after {self.seconds:.1f} s\n"
            f"--- failures and summaries ---\n{head}\n--- last lines ---\n{tail}"
        )


def run(
    binary: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float,
    extra_env: Optional[Mapping[str, str]] = None,
) -> Result:
    """Run a test program with an inner ``--deadline`` and an outer ``timeout`` (seconds)."""
    deadline = max(10.0, timeout - 20.0)
    command = [str(binary), *args]
    if "--deadline" not in args:
        command += ["--deadline", f"{deadline:.0f}"]
    # the programs use devices 0..N-1 and know the default count (8) unless told otherwise
    base = {k: v for k, v in env.items() if k != "HCCLPY_SIM_DEVICES"}
    full_env = {**base, **BASE_ENV, **(extra_env or {})}
    shm_before = set(ranks.simulator_shm())
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the forked ranks die with it
    )
    leftovers = False
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        code = None
    finally:
        leftovers = _kill_group(proc)  # processes of a finished program that outlived it
    seconds = time.monotonic() - start
    new_shm = sorted(set(ranks.simulator_shm()) - shm_before)
    return Result(command, code, out.decode(errors="replace"), seconds, leftovers, new_shm)


def _kill_group(proc: subprocess.Popen) -> bool:
    """SIGKILL the program's process group; True if anything of it was still running."""
    found = False
    try:
        os.killpg(proc.pid, 0)
        found = True
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait()
    return found


def check(result: Result) -> None:
    """Assert that a run passed and left nothing behind, showing what failed otherwise."""
    assert result.returncode == 0 and "RESULT: PASS" in result.output, result.report()
    assert not result.leftover_processes, "processes of the program outlived it\n" + result.report()
    assert not result.new_shm, f"the run left entries in /dev/shm: {list(result.new_shm)}"
