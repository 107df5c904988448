"""Virtual memory on the simulator, from a C program (c/virtual_memory.c): reservations, physical
memory and mappings with CANN's order and the codes of wrong ones; copies, memsets and HCCL
operations on mapped addresses, an HcclAllReduce between two processes among them; physical memory
shared with another process through a shareable handle, with the process-id list CANN documents."""

from __future__ import annotations

import re

import pytest

import sim_runner as runner


@pytest.mark.timeout(120)
def test_virtual_memory(compile_c, sim_env):
    binary = compile_c([runner.C_DIR / "virtual_memory.c"], "virtual_memory")
    result = runner.run(binary, [], sim_env, timeout=90)
    runner.check(result)
    assert re.search(r"virtual_memory: \d+ checks OK", result.output), result.output
