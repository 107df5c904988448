"""Communicator creation on the simulator, from C programs: configs and sub-communicators,
rank tables, HcclCommInitAll driven from one thread, and HcclGroupStart/End."""

from __future__ import annotations

import pytest

import sim_runner as runner

MATRIX = [(n, mode) for n in (1, 2, 3, 4, 8) for mode in ("threads", "procs")] + [(4, "mixed")]
IDS = [f"{m}-{n}" for n, m in MATRIX]


@pytest.fixture(scope="module")
def programs(compile_c):
    return {name: runner.build(compile_c, name) for name in ("subcomm", "ranktable", "initall", "groups")}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=IDS)
def test_subcomm(programs, sim_env, nranks, mode):
    runner.check(runner.run(programs["subcomm"], runner.rank_args(nranks, mode), sim_env, timeout=180))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=IDS)
def test_ranktable(programs, sim_env, nranks, mode, tmp_path):
    result = runner.run(
        programs["ranktable"], runner.rank_args(nranks, mode), sim_env, timeout=180,
        extra_env={"TMPDIR": str(tmp_path)},
    )
    runner.check(result)
    assert list(tmp_path.iterdir()) == [], "the program leaves its rank tables behind"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8])
def test_initall_one_thread_drives_all_devices(programs, sim_env, nranks):
    runner.check(runner.run(programs["initall"], runner.rank_args(nranks, "threads"), sim_env, timeout=180))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), MATRIX, ids=IDS)
def test_groups(programs, sim_env, nranks, mode):
    runner.check(runner.run(programs["groups"], runner.rank_args(nranks, mode), sim_env, timeout=180))
