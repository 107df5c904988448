"""Communicator lifecycles at their edges, from a C program (tests/simulator/c/lifecycle.c): sub-communicator
ids the ranks disagree about fail at once naming both rank lists, a suspension with nothing in
flight fails the other ranks' next operation at once, destroy right after a suspension always
succeeds, a failed rank-table attempt leaves nothing that spoils the next, root infos are
released when no longer needed (and say so when used afterwards), destroy racing other calls
on the same communicator is safe, a rank that exits at once after creating a communicator does not
fail slower ranks, communicators follow one another from one rank table, and ranks reading their
own copies of a rank table meet."""

from __future__ import annotations

import pytest

import sim_runner as runner

# Long enough that "at once" (the program allows 5 s) cannot be a timeout firing.
SLOW_TIMEOUTS = {"HCCL_EXEC_TIMEOUT": "30", "HCCL_CONNECT_TIMEOUT": "30"}

CASES = [
    ("subcomm-members", 3, "threads"),
    ("subcomm-members", 3, "procs"),
    ("subcomm-members", 4, "mixed"),
    ("subcomm-ids", 4, "threads"),
    ("subcomm-ids", 4, "procs"),
    ("suspend-idle", 2, "threads"),
    ("suspend-idle", 3, "procs"),
    ("destroy-after-abort", 2, "threads"),
    ("destroy-after-abort", 2, "procs"),
    ("rank-table-retry", 2, "threads"),
    ("rank-table-retry", 2, "procs"),
    ("root-info-expiry", 2, "threads"),
    ("root-info-elsewhere", 2, "procs"),
    ("destroy-race", 2, "threads"),
    ("init-exit", 3, "procs"),
    ("init-exit", 4, "mixed"),
    ("rank-table-again", 2, "procs"),
    ("rank-table-again", 3, "threads"),
    ("rank-table-copies", 2, "procs"),
    ("rank-table-copies", 2, "threads"),
]


@pytest.fixture(scope="module")
def lifecycle(compile_c):
    return runner.build(compile_c, "lifecycle")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("case", "nranks", "mode"), CASES, ids=[f"{c}-{m}-{n}" for c, n, m in CASES])
@pytest.mark.slow
def test_lifecycle(lifecycle, sim_env, tmp_path, case, nranks, mode):
    args = [*runner.rank_args(nranks, mode), "--case", case]
    result = runner.run(lifecycle, args, sim_env, timeout=120, extra_env={**SLOW_TIMEOUTS, "TMPDIR": str(tmp_path)})
    runner.check(result)
    assert list(tmp_path.iterdir()) == [], "the program leaves files behind"
