"""A rank of a multi-process job dies, is killed, stalls, or never joins: its peers get an error
within the configured timeout (+2 s), never hang, and can build a new communicator. A rank that
suspends its communicator in the middle of an operation breaks it for good: HcclCommResume says so."""

from __future__ import annotations

import pytest

import sim_runner as runner

FAULT_ENV = {"HCCL_EXEC_TIMEOUT": "5", "HCCL_CONNECT_TIMEOUT": "3"}
CASES = [("exit", 3), ("kill", 3), ("sleep", 3), ("sleep-config", 3), ("connect", 3), ("exit", 2), ("suspend", 2),
         ("suspend", 3)]


@pytest.fixture(scope="module")
def faults(compile_c):
    return runner.build(compile_c, "faults")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("case", "nranks"), CASES, ids=[f"{c}-{n}" for c, n in CASES])
@pytest.mark.slow
def test_faults(faults, sim_env, case, nranks):
    args = [*runner.rank_args(nranks, "procs"), "--case", case]
    result = runner.run(faults, args, sim_env, timeout=120, extra_env=FAULT_ENV)
    runner.check(result)
