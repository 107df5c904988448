"""The newer HCCL surface on the simulator, from a C program (c/hccl_newer.c): batch items to the
rank itself, HcclSend/HcclRecv to the own rank, HcclConfigGetInfo for every HcclConfigType,
HcclGetHcclBuffer, HcclGetHeterogMode, the scalable root-info bootstrap and memory registration,
each with real data and CANN's return codes."""

from __future__ import annotations

import pytest

import sim_runner as runner

MATRIX = [(1, "threads"), (2, "threads"), (3, "procs"), (4, "mixed"), (8, "threads")]


@pytest.fixture(scope="module")
def hccl_newer_program(compile_c):
    return runner.build(compile_c, "hccl_newer")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=[f"{m}-{n}" for n, m in MATRIX])
def test_newer_hccl_functions(hccl_newer_program, sim_env, nranks, mode):
    # HCCL_BUFFSIZE sets the HCCL buffer of a communicator without hcclBufferSize (2 x 5 MB here).
    result = runner.run(hccl_newer_program, runner.rank_args(nranks, mode), sim_env, timeout=180,
                        extra_env={"HCCL_BUFFSIZE": "5"})
    runner.check(result)


@pytest.mark.timeout(120)
def test_newer_hccl_functions_default_buffer_size(hccl_newer_program, sim_env):
    # Without HCCL_BUFFSIZE, the HCCL buffer is 2 x 200 MB of the simulated device's memory.
    result = runner.run(hccl_newer_program, runner.rank_args(2, "threads"), sim_env, timeout=90,
                        extra_env={"HCCL_BUFFSIZE": ""})
    runner.check(result)
