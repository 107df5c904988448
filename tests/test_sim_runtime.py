"""The ACL runtime and argument checking of the simulator, from C and C++ programs: devices,
contexts, streams, events, callbacks, memory info; error codes and messages for bad arguments;
the headers compiled as C++14."""

from __future__ import annotations

import pytest

import sim_runner as runner


@pytest.fixture(scope="module")
def programs(compile_c):
    return {name: runner.build(compile_c, name) for name in ("streams", "errors")}


STREAMS = [(1, "threads"), (2, "threads"), (4, "threads"), (1, "procs"), (2, "procs"), (4, "mixed")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), STREAMS, ids=[f"{m}-{n}" for n, m in STREAMS])
def test_streams(programs, sim_env, nranks, mode):
    env = {k: v for k, v in sim_env.items() if k != "HCCLPY_SIM_DEVICES"}
    runner.check(runner.run(programs["streams"], runner.rank_args(nranks, mode), env, timeout=180))


DEVICE_ENVS = [
    {"HCCLPY_SIM_DEVICES": "3"},
    {"HCCLPY_SIM_DEVICES": "12"},
    {"ASCEND_RT_VISIBLE_DEVICES": "6,7,2"},  # 3 visible devices, renumbered 0..2
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("extra_env", DEVICE_ENVS, ids=["sim-devices-3", "sim-devices-12", "visible-6-7-2"])
def test_streams_device_count_from_env(programs, sim_env, extra_env):
    result = runner.run(
        programs["streams"], runner.rank_args(2, "threads"), sim_env, timeout=180, extra_env=extra_env
    )
    runner.check(result)


ERRORS = [(n, mode) for n in (1, 2, 3) for mode in ("threads", "procs")] + [(8, "threads"), (4, "mixed")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("nranks", "mode"), ERRORS, ids=[f"{m}-{n}" for n, m in ERRORS])
def test_errors(programs, sim_env, nranks, mode):
    runner.check(runner.run(programs["errors"], runner.rank_args(nranks, mode), sim_env, timeout=180))


@pytest.mark.timeout(240)
def test_headers_work_from_cxx(compile_c, sim_env):
    binary = runner.build(compile_c, "cxx_smoke", cplusplus=True)
    runner.check(runner.run(binary, [], sim_env, timeout=120))
