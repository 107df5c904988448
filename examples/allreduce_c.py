"""Build the hcclpy simulator, compile ``c/allreduce.c`` against it and run it.

The C program is an ordinary HCCL program: 4 threads, one rank each, all-reduce an fp32 array.
This script does what a C developer would do by hand, ::

    eval "$(python -m hcclpy.sim env)"
    cc examples/c/allreduce.c -I$ASCEND_HOME_PATH/include \\
        -L$ASCEND_HOME_PATH/lib64 -lhccl -lascendcl -pthread -o allreduce
    ./allreduce

and exits with the program's status.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import hcclpy.sim

SOURCE = Path(__file__).resolve().parent / "c" / "allreduce.c"
TIMEOUT = 120  # seconds; the simulator's own timeouts should fire first, this is the backstop


def main() -> int:
    """Build the simulator, compile and run the example; return its exit status."""
    env = {**os.environ, **hcclpy.sim.env()}  # builds the simulator on first use
    home = Path(env["ASCEND_HOME_PATH"])
    with tempfile.TemporaryDirectory(prefix="hcclpy-example-") as tmp:
        binary = Path(tmp) / "allreduce"
        command = [
            *shlex.split(os.environ.get("CC", "cc")), "-O2", "-Wall", "-Wextra",
            str(SOURCE), f"-I{home / 'include'}", "-o", str(binary),
            f"-L{home / 'lib64'}", "-lhccl", "-lascendcl", "-pthread",
        ]
        print("$", shlex.join(command), flush=True)
        if subprocess.run(command).returncode != 0:
            return 1
        print("$", binary, flush=True)
        try:
            status = subprocess.run([str(binary)], env=env, timeout=TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            print(f"allreduce: no result after {TIMEOUT} s", file=sys.stderr)
            return 1
    # A program killed by a signal reports -signum; a shell would say 128 + signum.
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
