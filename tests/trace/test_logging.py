"""The "hcclpy" logger: silent unless the application configures logging; then it tells what was
loaded, which communicators came and went, and what failed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, sys, warnings
    if sys.argv[1] == "configured":
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
    warnings.simplefilter("ignore")
    import hcclpy
    comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0)
    try:
        comm.send(hcclpy.zeros(4, "float32"), 0)   # refused before C: not logged
    except ValueError:
        pass
    try:
        comm.all_reduce((8, 4, "float32"))   # no device memory there: refused in C, logged
    except hcclpy.HcclError:
        pass
    comm.abort()
    try:
        comm.barrier()   # refused before C: not logged
    except ValueError:
        pass
    comm.destroy()
""")


def _run(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("HCCLPY_BACKEND",)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_nothing_is_printed_by_default() -> None:
    assert _run("silent") == ""


def test_configured_logging_tells_what_happened() -> None:
    lines = _run("configured").splitlines()
    assert any(line.startswith("hcclpy INFO loaded libhccl") for line in lines), lines
    assert any("communicator '" in line and "created: rank 0 of 1" in line for line in lines), lines
    assert any(line.startswith("hcclpy WARNING") and "aborted on rank 0" in line for line in lines), lines
    assert any(line.startswith("hcclpy DEBUG HcclAllReduce failed: HCCL_E_PTR") for line in lines), lines
    assert any("destroyed on rank 0" in line for line in lines), lines
