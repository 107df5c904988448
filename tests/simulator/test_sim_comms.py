"""Communicator creation on the simulator, from C programs: configs and sub-communicators,
rank tables, HcclCommInitAll driven from one thread, and HcclGroupStart/End."""

from __future__ import annotations

import pytest

import sim_runner as runner
from hcclpy.rendezvous import free_port

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
    # The tables of two servers bootstrap over TCP at HCCL_IF_BASE_PORT: a free one, not the
    # default 60000 that a test in another worker may be listening on.
    result = runner.run(
        programs["ranktable"], runner.rank_args(nranks, mode), sim_env, timeout=180,
        extra_env={"TMPDIR": str(tmp_path), "HCCL_IF_BASE_PORT": str(free_port())},
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


# Three processes; ranks 1 and 2 get a 70 TiB device each, more than one process can map twice in
# a 47-bit address space, so mapping the peers' device memory fails.  Prints "rank rc message".
HUGE_PEERS_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <hccl/hccl.h>

static int rank_main(int rank, int from_root)
{
    if (rank > 0)
        setenv("HCCLPY_SIM_DEVICE_MEMORY", "70T", 1);
    if (aclInit(NULL) != ACL_SUCCESS || aclrtSetDevice(rank) != ACL_SUCCESS)
        return 2;
    HcclRootInfo info;
    if (read(from_root, &info, sizeof info) != (ssize_t)sizeof info)
        return 3;
    HcclComm comm = NULL;
    HcclResult rc = HcclCommInitRootInfo(3, &info, (uint32_t)rank, &comm);
    const char *text = aclGetRecentErrMsg();
    printf("%d %d %s\n", rank, (int)rc, rc != HCCL_SUCCESS && text != NULL ? text : "");
    fflush(stdout);
    if (rc == HCCL_SUCCESS)
        HcclCommDestroy(comm);
    return 0;
}

int main(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 2;
    for (int rank = 0; rank < 3; rank++)
        if (fork() == 0)
            _exit(rank_main(rank, fds[0]));
    /* The root info is made by a process of its own, which stays until the ranks are done. */
    if (aclInit(NULL) != ACL_SUCCESS)
        return 2;
    HcclRootInfo info;
    if (HcclGetRootInfo(&info) != HCCL_SUCCESS)
        return 2;
    for (int rank = 0; rank < 3; rank++)
        if (write(fds[1], &info, sizeof info) != (ssize_t)sizeof info)
            return 2;
    int status, worst = 0;
    while (wait(&status) > 0)
        worst |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return worst;
}
"""


@pytest.fixture(scope="module")
def huge_peers_program(compile_c, tmp_path_factory):
    source = tmp_path_factory.mktemp("huge_peers") / "huge_peers.c"
    source.write_text(HUGE_PEERS_PROGRAM)
    return compile_c([source], "huge_peers")


@pytest.mark.timeout(120)
def test_peer_memory_failure_is_reported_intact(huge_peers_program, sim_env):
    result = runner.run(huge_peers_program, [], sim_env, timeout=90)
    assert result.returncode == 0, result.report()
    lines = [line.split(" ", 2) + [""] for line in result.output.strip().splitlines()]
    if all(rc == "0" for _, rc, *_ in lines):
        pytest.skip("this machine's address space holds every peer's device memory")
    runtime = [text for _, rc, text, *_ in lines if rc == "15"]  # HCCL_E_RUNTIME, on the rank that failed
    assert runtime, result.output
    for text in runtime:
        # The reason is quoted once and whole, not overwritten while it was being formatted.
        assert text.count("cannot reach the device memory") == 1, text
        # A rank that could not map a peer's memory says so; one whose peer has already given up
        # and exited cannot open it.
        assert "cannot map the device memory of process" in text or "cannot open the device memory of process" \
            in text, text
