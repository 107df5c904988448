"""1,000 communicator create/destroy cycles leak no memory, descriptors, threads or /dev/shm
entries (threads in one process, and two processes)."""

from __future__ import annotations

import pytest

import sim_runner as runner

CASES = [(2, "threads"), (4, "threads"), (2, "procs")]


@pytest.fixture(scope="module")
def cycles(compile_c):
    return runner.build(compile_c, "cycles")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("nranks", "mode"), CASES, ids=[f"{m}-{n}" for n, m in CASES])
@pytest.mark.slow
def test_create_destroy_cycles_leak_nothing(cycles, sim_env, nranks, mode):
    args = [*runner.rank_args(nranks, mode), "--cycles", "1000"]
    runner.check(runner.run(cycles, args, sim_env, timeout=240))
