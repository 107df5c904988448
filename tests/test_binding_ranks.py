"""The multi-rank helper (tests/ranks.py): results, errors with tracebacks, hard timeouts, environment."""

from __future__ import annotations

import os
import time

import pytest

import hcclpy
import ranks


def _identity(rank, size, info, extra):
    return rank, size, len(info), extra, hcclpy.Device.current().id


def _env(rank, size, info, names):
    return {name: os.environ.get(name) for name in names}


def _raise_on_one(rank, size, info):
    if rank == 1:
        raise KeyError(f"rank {rank} fails on purpose")
    return rank


def _sleep_on_one(rank, size, info, seconds):
    if rank == 1:
        time.sleep(seconds)
    return rank


def _exit_on_one(rank, size, info):
    if rank == 1:
        os._exit(7)
    return rank


def _hccl_error_on_zero(rank, size, info):
    # An HcclError made by the simulator must cross the process boundary intact.
    if rank == 0:
        comm = hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=rank), 0, device=rank)
        try:
            x = hcclpy.zeros(4, "float32")
            comm.broadcast((x.ptr, 5, "float32"), stream=comm.device.default_stream)
        finally:
            comm.destroy()
    return rank


@pytest.mark.parametrize("mode", ranks.MODES)
def test_results_in_rank_order_with_device_set(mode):
    out = ranks.run(mode, _identity, 3, "x")
    assert out == [(r, 3, 4108, "x", r) for r in range(3)]


@pytest.mark.parametrize("mode", ranks.MODES)
def test_rank_environment_has_short_timeouts(mode):
    names = ("HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT", "HCCLPY_TEST_MARK")
    out = ranks.run(mode, _env, 2, names, env={"HCCLPY_TEST_MARK": "1"})
    for seen in out:
        assert seen == {**ranks.RANK_ENV, "HCCLPY_TEST_MARK": "1"}
    if mode == "threads":
        assert "HCCLPY_TEST_MARK" not in os.environ  # restored afterwards


@pytest.mark.parametrize("mode", ranks.MODES)
def test_exception_carries_traceback(mode):
    with pytest.raises(ranks.RanksFailed) as info:
        ranks.run(mode, _raise_on_one, 2)
    [error] = info.value.errors
    assert error.rank == 1 and isinstance(error.exception, KeyError)
    assert "_raise_on_one" in error.traceback and "fails on purpose" in str(info.value)
    out = ranks.run(mode, _raise_on_one, 2, return_exceptions=True)
    assert out[0] == 0 and isinstance(out[1], ranks.RankError)


@pytest.mark.parametrize("mode", ranks.MODES)
@pytest.mark.timeout(60)
@pytest.mark.slow
def test_hard_timeout_fails_instead_of_hanging(mode):
    # Rank 0 returns at once and rank 1 sleeps far past the limit; the limit leaves room for
    # starting two processes on a loaded machine.
    started = time.monotonic()
    with pytest.raises(ranks.RanksTimedOut, match=r"rank\(s\) \[1\] of 2 did not finish"):
        ranks.run(mode, _sleep_on_one, 2, 120.0, timeout=10.0)
    assert time.monotonic() - started < 45


@pytest.mark.timeout(60)
def test_process_that_exits_is_reported_with_its_exit_code():
    out = ranks.run_processes(_exit_on_one, 2, return_exceptions=True, timeout=30)
    assert out[0] == 0
    assert isinstance(out[1], ranks.RankError) and out[1].exitcode == 7


@pytest.mark.timeout(60)
def test_hccl_error_crosses_the_process_boundary():
    with pytest.raises(ranks.RanksFailed) as info:
        ranks.run_processes(_hccl_error_on_zero, 1)
    exc = info.value.errors[0].exception
    assert isinstance(exc, hcclpy.HcclError) and exc.name == "HCCL_E_PARA" and exc.api == "HcclBroadcast"
    assert "past the end of its allocation" in str(exc)


def test_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        ranks.run("fibers", _identity, 1, None)
