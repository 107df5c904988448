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


# HcclCommInitClusterInfo on the rank table argv[1] names (sim_runner adds --deadline after it):
# prints "rc message".
RANK_TABLE_PROGRAM = r"""
#include <stdio.h>
#include <hccl/hccl.h>

int main(int argc, char **argv)
{
    if (argc < 2 || aclInit(NULL) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS)
        return 2;
    HcclComm comm = NULL;
    HcclResult rc = HcclCommInitClusterInfo(argv[1], 0, &comm);
    const char *text = aclGetRecentErrMsg();
    printf("%d %s\n", (int)rc, rc != HCCL_SUCCESS && text != NULL ? text : "");
    return 0;
}
"""


@pytest.fixture(scope="module")
def rank_table_program(compile_c, tmp_path_factory):
    source = tmp_path_factory.mktemp("ranktable_program") / "init_cluster_info.c"
    source.write_text(RANK_TABLE_PROGRAM)
    return compile_c([source], "init_cluster_info")


# glibc fills what malloc returns with the complement of MALLOC_PERTURB_'s low byte: 0xff ^ 0xca
# is '5', so a parser that reads past the end of the text it was given reads more digits.
DIGITS_AFTER_THE_TEXT = {"MALLOC_PERTURB_": str(0xFF ^ ord("5"))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("text", "message"), [
    ("12", '"status" must be "completed"'),
    ("  \n7", '"status" must be "completed"'),
    (" " * 4095 + "7", '"status" must be "completed"'),  # fills the first read exactly
    ('{"status": "completed", "server_count": 1', "not valid JSON (expected ',' or '}' at byte 41)"),
], ids=["number", "number-after-space", "number-at-4096", "truncated-after-a-number"])
def test_rank_table_ending_in_a_number_is_parsed_to_its_end(rank_table_program, sim_env, tmp_path, text, message):
    table = tmp_path / "table.json"
    table.write_text(text)
    result = runner.run(rank_table_program, [str(table)], sim_env, timeout=60, extra_env=DIGITS_AFTER_THE_TEXT)
    assert result.returncode == 0, result.report()
    rc, _, said = result.output.strip().partition(" ")
    assert rc == "1" and message in said, result.output  # HCCL_E_PARA, about the text as written
