"""hcclpy ships type annotations (py.typed): a user's program type-checks under ``mypy --strict``
against them, and a wrong one is caught."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("mypy", reason="the test extra installs mypy")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _mypy(path: pathlib.Path) -> subprocess.CompletedProcess:
    # From the repository's root, where mypy finds the hcclpy package itself (an editable install
    # reaches Python through an import hook, which type checkers do not follow). Errors inside
    # hcclpy are not the user's, so they are not reported (--follow-imports=silent).
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                           "--cache-dir", "/dev/null", str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_a_users_program_type_checks() -> None:
    result = _mypy(ROOT / "tests" / "docs" / "typing" / "user_program.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_program_is_caught(tmp_path: pathlib.Path) -> None:
    program = tmp_path / "wrong.py"
    program.write_text("import numpy as np\n"
                       "import hcclpy\n\n"
                       "def mark(stream: hcclpy.Stream) -> int:\n"
                       "    return stream.record()\n\n"
                       "stream: hcclpy.Stream = hcclpy.Device(0).create_event()\n"
                       "array: hcclpy.DeviceArray = hcclpy.init().all_reduce(np.ones(3))\n"
                       "uneven: hcclpy.DeviceArray = hcclpy.init().all_to_all_v(np.ones(3), send_counts=[3], "
                       "recv_counts=[3])\n"
                       "hcclpy.init().all_reduce(np.ones(3), op='average')\n")
    result = _mypy(program)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Incompatible return value type (got "Event", expected "int")' in result.stdout
    assert 'expression has type "Event", variable has type "Stream"' in result.stdout
    assert len(re.findall(r'expression has type "ndarray\[.*\]", variable has type "DeviceArray"', result.stdout)) == 2
    assert 'No overload variant matches argument types' in result.stdout  # op="average" is no reduce op
