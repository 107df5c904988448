"""The comparison benchmark runs end to end (tiny sizes, a short budget): it is not a test of
speed, only that the script a reader runs to reproduce the README's tables works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HCCLPY_LAUNCHER")


@pytest.mark.timeout(300)
def test_compare_writes_its_table_json_and_plot(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare.py"), "--ranks", "2", "--ops", "all_reduce", "all_gather",
         "--programs", "hcclpy", "torch", "--max-bytes", "512", "--budget", "0.002", "--rounds", "1",
         "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = (tmp_path / "compare.md").read_text()
    assert "## all_reduce, 2 ranks" in report and "## all_gather, 2 ranks" in report
    assert "| 512 B |" in report and "## Targets" in report
    seconds = json.loads((tmp_path / "compare.json").read_text())["seconds"]["2"]
    assert set(seconds) == {"hcclpy-device", "hcclpy-numpy", "torch-hcclpy", "gloo"}
    assert all(t > 0 for stack in seconds.values() for sizes in stack.values() for t in sizes.values())
    if (tmp_path / "compare.png").exists():
        assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
