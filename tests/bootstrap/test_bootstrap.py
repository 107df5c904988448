"""``hcclpy.init()``: launcher detection, the root-info exchanges (TCP, file, rank table, MPI) and
the world communicator's lifecycle.

``detect_launch`` is tested on explicit environment mappings. ``init`` runs in this process for one
rank, and as spawned processes (``tests/ranks.py``, hard timeouts) or under ``hcclpy run`` for
several: ``init`` keeps one world communicator per process and blocks until every rank joined, so
ranks of one job cannot be threads of one process.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

import numpy as np
import pytest

import hcclpy
import ranks
from hcclpy._environment import DEFAULT_CONNECT_TIMEOUT
from hcclpy._environment import connect_timeout as _connect_timeout
from hcclpy.bootstrap import DEFAULT_PORT, LaunchInfo, detect_launch, world
from hcclpy.rendezvous import RendezvousError, fetch_root_info, free_port, job_token

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore::hcclpy.SimulatorFallbackWarning")]

# Every variable detect_launch / init / job_token read: cleared for the in-process tests.
LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID",
    "SLURM_LAUNCH_NODE_IPADDR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "PMI_KVSNAME", "RANK_TABLE_FILE", "HCCLPY_RENDEZVOUS_TOKEN", "HCCLPY_RENDEZVOUS_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
)
PROCESS_TIMEOUT = 90.0  # per multi-process run; each takes a few seconds


def slurm_port(job_id: str) -> int:
    """The port every rank of a Slurm (or MPI) job derives from its job id (documented rule)."""
    return DEFAULT_PORT + 1 + zlib.crc32(job_id.encode()) % 20000


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No launcher variables; the world communicator is shut down afterwards."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    hcclpy.shutdown()
    yield monkeypatch
    hcclpy.shutdown()


# ---------------------------------------------------------------------------- detect_launch

def test_detect_torchrun() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.1.2.3",
           "MASTER_PORT": "23456", "GROUP_RANK": "1"}
    assert detect_launch(env) == LaunchInfo(5, 8, 1, 4, "10.1.2.3", 23456, "torchrun", single_host=False)


def test_detect_torchrun_beside_its_agent_store() -> None:
    # torchrun's agent listens on MASTER_PORT itself: rank 0 takes any free port, and publishes it
    # in that store (port 0 here: chosen at init).
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job-7"}
    assert detect_launch(env).master_port == 0
    assert detect_launch({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}).master_port == 29500
    assert detect_launch({**env, "HCCLPY_RENDEZVOUS_PORT": "31000"}).master_port == 31000


def test_rendezvous_port_variable_wins() -> None:
    for env in ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29600"}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                                                                          "SLURM_JOB_ID": "42"}, {}):
        assert detect_launch({**env, "HCCLPY_RENDEZVOUS_PORT": "31001"}).master_port == 31001
    with pytest.raises(ValueError, match="HCCLPY_RENDEZVOUS_PORT='x' is not an integer"):
        detect_launch({"HCCLPY_RENDEZVOUS_PORT": "x"})
    for name, value in (("HCCLPY_RENDEZVOUS_PORT", "99999"), ("MASTER_PORT", "0")):
        with pytest.raises(ValueError, match=f"{name}={value} is not a TCP port \\(1..65535\\)"):
            detect_launch({"RANK": "0", "WORLD_SIZE": "2", name: value})


def test_detect_torchrun_defaults() -> None:
    # No LOCAL_*: one node, local rank = rank. No MASTER_*: loopback and the default port.
    assert detect_launch({"RANK": "2", "WORLD_SIZE": "3"}) == LaunchInfo(2, 3, 2, 3, "127.0.0.1", DEFAULT_PORT,
                                                                         "torchrun")


def test_detect_slurm() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_ID": "987654", "SLURM_LAUNCH_NODE_IPADDR": "10.9.8.7", "SLURM_NODEID": "1"}
    info = detect_launch(env)
    assert info == LaunchInfo(3, 4, 1, 2, "10.9.8.7", slurm_port("987654"), "slurm", "987654", single_host=False)
    assert DEFAULT_PORT < info.master_port <= DEFAULT_PORT + 20000
    # Every rank of the job derives the same address and port; another job another port.
    other_rank = detect_launch({**env, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    assert (other_rank.master_addr, other_rank.master_port) == (info.master_addr, info.master_port)
    assert detect_launch({**env, "SLURM_JOB_ID": "987655"}).master_port != info.master_port


def test_detect_slurm_overrides_and_fallbacks() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "42", "SLURM_LAUNCH_NODE_IPADDR": "10.9.8.7"}
    # MASTER_ADDR / MASTER_PORT win over what Slurm implies.
    info = detect_launch({**env, "MASTER_ADDR": "node001", "MASTER_PORT": "31000"})
    assert (info.master_addr, info.master_port) == ("node001", 31000)
    # No SLURM_LOCALID / SLURM_NTASKS_PER_NODE: local rank = rank, one node.
    info = detect_launch(env)
    assert (info.local_rank, info.local_world_size) == (0, 2)
    # No launch node address: loopback; no job id: the default port.
    bare = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    assert detect_launch(bare) == LaunchInfo(1, 2, 1, 2, "127.0.0.1", DEFAULT_PORT, "slurm")


def test_detect_open_mpi() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_NAMESPACE": "prterun-host-1234@1", "MASTER_ADDR": "10.0.0.5"}
    assert detect_launch(env) == LaunchInfo(6, 8, 2, 4, "10.0.0.5", slurm_port("prterun-host-1234@1"), "openmpi",
                                            "prterun-host-1234@1", single_host=False)


def test_detect_mpich_pmi() -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "PMI_KVSNAME": "kvs_4321_0"}
    assert detect_launch(env) == LaunchInfo(1, 2, 1, 2, "127.0.0.1", slurm_port("kvs_4321_0"), "pmi", "kvs_4321_0")


def test_concurrent_jobs_get_their_own_job_id() -> None:
    # Slurm: the steps of one allocation share SLURM_JOB_ID; the step id tells them apart.
    step = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "42"}
    ids = {detect_launch({**step, "SLURM_STEP_ID": s}).job_id for s in ("0", "1")}
    assert ids == {"42.0", "42.1"}
    assert len({detect_launch({**step, "SLURM_STEP_ID": s}).master_port for s in ("0", "1")}) == 2
    # MPICH's Hydra names no job: on one node, the proxy process it runs the ranks under stands in;
    # outside one (as here), nothing does.
    hydra = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert detect_launch(hydra).job_id == "" and detect_launch(hydra).master_port == DEFAULT_PORT


@pytest.mark.mpi
def test_two_mpich_jobs_at_once_stay_apart(tmp_path: Path) -> None:
    """Two 2-rank jobs under MPICH's mpiexec, started together: each all-reduces its own values."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys, time, warnings
        import numpy as np, hcclpy
        warnings.simplefilter("ignore")
        comm = hcclpy.init(timeout=30)
        value = float(sys.argv[1])
        sys.stdout.write(f"{comm.all_reduce(np.array([value]))[0]}\\n")  # one write: the ranks share stdout
        hcclpy.shutdown()
    """))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(HCCLPY_BACKEND="sim", HCCL_CONNECT_TIMEOUT="30")
    jobs = [subprocess.Popen([*ranks.launcher("mpiexec", 2), str(script), value], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for value in ("100", "1")]
    outputs = [job.communicate(timeout=PROCESS_TIMEOUT) for job in jobs]
    for job, (out, err), want in zip(jobs, outputs, ("200.0", "2.0")):
        assert job.returncode == 0, err[-2000:]
        assert out.split() == [want, want], (out, err[-2000:])


def test_detect_none() -> None:
    assert detect_launch({}) == LaunchInfo(0, 1, 0, 1, "127.0.0.1", DEFAULT_PORT, "none")
    assert detect_launch({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}) == LaunchInfo(
        0, 1, 0, 1, "10.0.0.1", 1234, "none")


def test_detect_precedence_and_partial_variables() -> None:
    # torchrun inside an srun allocation: torchrun's variables win.
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "0",
           "OMPI_COMM_WORLD_SIZE": "1"}
    assert detect_launch(env).launcher == "torchrun"
    # A launcher counts only with both rank and size; empty values count as unset.
    assert detect_launch({"RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).launcher == "slurm"
    assert detect_launch({"RANK": "", "WORLD_SIZE": "", "PMI_RANK": "0", "PMI_SIZE": "1"}).launcher == "pmi"
    # Half a pair with no launcher complete: every process would run alone, so it is refused.
    for env in ({"WORLD_SIZE": "4"}, {"RANK": "1"}, {"PMI_RANK": "1"}, {"OMPI_COMM_WORLD_SIZE": "2"}):
        with pytest.raises(ValueError, match=r"environment variable \w+='\d' is set but \w+ is not"):
            detect_launch(env)
    assert detect_launch({"SLURM_PROCID": "0"}).launcher == "none"  # a Slurm batch script, outside srun
    assert detect_launch({"RANK": " 3 ", "WORLD_SIZE": "4"}).rank == 3


def test_detect_reads_os_environ_by_default(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PMI_RANK", "3")
    clean_env.setenv("PMI_SIZE", "4")
    assert (detect_launch().rank, detect_launch().launcher) == (3, "pmi")


@pytest.mark.parametrize("name, env", [
    ("RANK", {"RANK": "zero", "WORLD_SIZE": "2"}),
    ("WORLD_SIZE", {"RANK": "0", "WORLD_SIZE": "2.0"}),
    ("LOCAL_RANK", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0x1"}),
    ("LOCAL_WORLD_SIZE", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "two"}),
    ("MASTER_PORT", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500/tcp"}),
    ("MASTER_PORT", {"MASTER_PORT": "port"}),
    ("SLURM_PROCID", {"SLURM_PROCID": "a", "SLURM_NTASKS": "2"}),
    ("SLURM_NTASKS", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2(x2)"}),
    ("SLURM_LOCALID", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "?"}),
    ("OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_RANK": "r0", "OMPI_COMM_WORLD_SIZE": "2"}),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE": "x"}),
    ("PMI_SIZE", {"PMI_RANK": "0", "PMI_SIZE": "many"}),
    ("MPI_LOCALRANKID", {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "-"}),
])
def test_detect_rejects_non_integers_naming_the_variable(name: str, env: Dict[str, str]) -> None:
    with pytest.raises(ValueError, match=rf"(?<![A-Z_]){name}={re.escape(repr(env[name]))}"):
        detect_launch(env)


# ------------------------------------------------------------------------- init, one rank

def test_init_one_rank_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert world() is None
    comm = hcclpy.init()
    assert (comm.rank, comm.size, comm.device.id) == (0, 1, 0)
    assert world() is comm and not comm.destroyed
    assert comm.all_reduce(np.arange(4, dtype=np.float32)).tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match=r"already called.*shutdown"):
        hcclpy.init()
    assert world() is comm and not comm.destroyed  # the failed call changed nothing
    hcclpy.shutdown()
    assert comm.destroyed and world() is None
    with pytest.raises(ValueError, match=r"was destroyed by hcclpy\.shutdown\(\)"):
        comm.all_reduce(np.ones(1))
    hcclpy.shutdown()  # idempotent
    hcclpy.shutdown()
    again = hcclpy.init()  # after shutdown, init works again
    assert again is not comm and world() is again and again.size == 1
    hcclpy.shutdown()
    assert again.destroyed


def test_shutdown_with_a_bad_timeout_keeps_the_world(clean_env: pytest.MonkeyPatch) -> None:
    comm = hcclpy.init()
    with pytest.raises(ValueError, match=r"timeout=-1"):
        hcclpy.shutdown(timeout=-1)
    assert world() is comm and not comm.destroyed  # still there to shut down properly
    hcclpy.shutdown(timeout=5)
    assert comm.destroyed and world() is None


def test_shutdown_without_init_is_a_no_op(clean_env: pytest.MonkeyPatch) -> None:
    hcclpy.shutdown()
    assert world() is None


def test_shutdown_after_the_user_destroyed_the_world(clean_env: pytest.MonkeyPatch) -> None:
    comm = hcclpy.init()
    comm.destroy()
    hcclpy.shutdown()
    hcclpy.init().all_reduce(np.ones(1))  # a destroyed world does not block a new init
    hcclpy.shutdown()


def test_init_arguments(clean_env: pytest.MonkeyPatch) -> None:
    comm = hcclpy.init(device=1, config={"name": "bootstrap-test"})
    assert comm.device.id == 1 and comm.name == "bootstrap-test"
    hcclpy.shutdown()
    # Explicit rank / size win over the environment.
    clean_env.setenv("RANK", "5")
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("LOCAL_RANK", "0")
    comm = hcclpy.init(rank=0, world_size=1)
    assert (comm.rank, comm.size) == (0, 1)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"world_size": 0}, r"world_size=0"),
    ({"world_size": "2"}, r"world_size='2'"),
    ({"world_size": True}, r"world_size=True"),
    ({"rank": 2, "world_size": 2}, r"rank=2 .*\[0, 2\)"),
    ({"rank": -1, "world_size": 2}, r"rank=-1"),
    ({"rank": 1.0, "world_size": 2}, r"rank=1\.0"),
    ({"timeout": 0}, r"timeout=0"),
    ({"timeout": "30"}, r"timeout='30'"),
    ({"timeout": float("nan")}, r"timeout=nan must be a positive, finite number"),
    ({"timeout": float("inf")}, r"timeout=inf must be a positive, finite number"),
])
def test_init_rejects_bad_arguments(clean_env: pytest.MonkeyPatch, kwargs: Dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        hcclpy.init(**kwargs)
    assert world() is None


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"rank_table": "/nonexistent/table.json"}, FileNotFoundError, r"rank_table='/nonexistent/table.json': no such"),
    ({"world_size": 2, "mpi_comm": object()}, TypeError, r"mpi_comm must be an mpi4py communicator .*got object"),
    ({"world_size": 2, "store_path": "/nonexistent/root.info"}, FileNotFoundError,
     r"store_path='/nonexistent/root.info': its directory does not exist"),
    ({"world_size": 2, "store_path": "/tmp"}, IsADirectoryError, r"store_path='/tmp' is a directory"),
])
def test_init_rejects_bad_exchange_arguments(clean_env: pytest.MonkeyPatch, kwargs: Dict[str, Any], error: type,
                                             pattern: str) -> None:
    # Refused before anything is created: no C call, no rendezvous, no temporary file.
    with pytest.raises(error, match=pattern):
        hcclpy.init(rank=0, timeout=2, **kwargs)
    assert world() is None


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"config": {"nope": 1}}, TypeError, r"unknown CommConfig key\(s\) \['nope'\]"),
    ({"config": 5}, TypeError, r"config must be a CommConfig, a dict or None, got int"),
    ({"config": {"qos": 99}}, ValueError, r"CommConfig.qos=99 must be an int in \[0, 7\]"),
    ({"store_path": 5}, TypeError, r"store_path must be a path to a file \(str or os.PathLike\), got int"),
    ({"store_path": "/tmp/a\0b"}, ValueError, r"store_path='/tmp/a\\x00b' must be a non-empty path with no NUL"),
    ({"rank_table": 5}, TypeError, r"rank_table must be a path to the rank table"),
    ({"rank_table": ""}, ValueError, r"rank_table='' must be a non-empty path"),
    ({"rank_table": "/tmp"}, IsADirectoryError, r"rank_table='/tmp' is a directory"),
])
def test_init_checks_every_argument_before_the_rendezvous(clean_env: pytest.MonkeyPatch, kwargs: Dict[str, Any],
                                                          error: type, pattern: str) -> None:
    # Rank 1 of 2 with no rank 0: an argument checked only after the rendezvous would give a
    # CommTimeoutError instead.
    with pytest.raises(error, match=pattern):
        hcclpy.init(rank=1, world_size=2, timeout=30, **kwargs)
    assert world() is None


def test_init_takes_numpy_numbers(clean_env: pytest.MonkeyPatch) -> None:
    comm = hcclpy.init(rank=np.int64(0), world_size=np.int32(1), timeout=np.float32(5), device=np.int64(0))
    assert (comm.rank, comm.size, comm.device.id) == (0, 1, 0)
    assert type(comm.rank) is int


def test_a_negative_local_rank_is_named(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv("LOCAL_RANK", "-1")
    with pytest.raises(ValueError, match=r"^environment variable LOCAL_RANK=-1 must be >= 0"):
        hcclpy.init()
    assert world() is None


def test_init_rejects_bad_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "one")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK='one'"):
        hcclpy.init()
    clean_env.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"rank=2 must be an int in \[0, 2\)"):
        hcclpy.init()
    assert world() is None


def test_missing_rank_table_file_variable_is_ignored(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("RANK_TABLE_FILE", str(tmp_path / "no-such-table.json"))
    assert hcclpy.init().size == 1


def test_a_rank_table_in_the_environment_does_not_hold_up_a_single_process(clean_env: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    # RANK_TABLE_FILE is often exported on CANN hosts; a script run without a launcher runs alone.
    clean_env.setenv("RANK_TABLE_FILE", str(write_rank_table(tmp_path / "two.json", [[0, 1]])))
    assert hcclpy.init().size == 1


def test_a_rank_table_must_list_the_world_size(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    table = str(write_rank_table(tmp_path / "two.json", [[0, 1]]))
    with pytest.raises(ValueError, match=r"the rank table .*two\.json lists 2 ranks but world_size is 3"):
        hcclpy.init(rank=0, world_size=3, rank_table=table)
    clean_env.setenv("RANK_TABLE_FILE", table)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4")):
        clean_env.setenv(name, value)
    with pytest.raises(ValueError, match="lists 2 ranks but world_size is 4"):
        hcclpy.init()
    assert world() is None


def test_init_takes_rank_and_size_from_mpi_comm(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2")):  # the launcher's world, not mpi_comm's
        clean_env.setenv(name, value)
    alone = FakeMpiComm(0, str(tmp_path / "bcast"), 1)  # a sub-communicator of one rank
    assert (hcclpy.init(mpi_comm=alone).rank, world().size) == (0, 1)
    hcclpy.shutdown()
    with pytest.raises(ValueError, match=r"rank=1 and world_size=None differ from mpi_comm's rank 0 of 2"):
        hcclpy.init(rank=1, mpi_comm=FakeMpiComm(0, str(tmp_path / "bcast"), 2))
    assert world() is None


def test_rank_0_waits_for_the_others_within_timeout(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MASTER_PORT", str(free_port()))
    late = r"rank\(s\) \[1, 2\] did not reach the rendezvous .* 0\.5 s"
    with pytest.raises(hcclpy.CommTimeoutError, match=late) as info:
        hcclpy.init(rank=0, world_size=3, timeout=0.5)
    assert world() is None
    assert (info.value.code, info.value.name) == (None, "")  # no C call failed


@pytest.mark.slow
def test_rank_0_names_the_ranks_it_refused(clean_env: pytest.MonkeyPatch) -> None:
    # Rank 1 started with another WORLD_SIZE is refused: rank 0's error says so, and why, rather
    # than that rank 1 never came.
    port = free_port()
    clean_env.setenv("MASTER_PORT", str(port))
    clean_env.setenv("HCCLPY_RENDEZVOUS_TOKEN", "the job's secret")  # what job_token() presents
    told: List[str] = []

    def rank_1_of_3() -> None:
        try:
            fetch_root_info("127.0.0.1", port, 1, 3, job_token(port), 30.0)
        except RendezvousError as exc:
            told.append(str(exc))

    client = threading.Thread(target=rank_1_of_3, daemon=True)
    client.start()
    try:
        with pytest.raises(hcclpy.CommTimeoutError) as info:
            hcclpy.init(rank=0, world_size=2, timeout=3)
    finally:
        client.join(30)
    message = str(info.value)
    assert "did not reach" not in message, message
    assert message.startswith(f"rank(s) [1] did not join the rendezvous on 127.0.0.1:{port} within 3 s"), message
    assert message.endswith("; it refused rank 1 (from 127.0.0.1): world size mismatch: rank 0 has 2, "
                            "this rank says 3"), message
    assert len(told) == 1 and "world size mismatch" in told[0]
    assert world() is None


# The simulator's reader (strtod() over the whole value, then >= 0) takes these as seconds...
VALID_CONNECT_TIMEOUTS = ["30", " 2.5", "\t7", "0", "-0", "+3", "1.", ".5", "1e1", "0x10", "0X.8p1", "1e300"]
# ... and ignores these (nan and inf are no number of seconds: they made its deadlines overflow, as
# 1e300 did, which both readers now take as 1e9 s).
IGNORED_CONNECT_TIMEOUTS = ["-1", "abc", "10s", "5 ", "1_0", "0x", "1e", "\u0663", "nan", "inf", "-inf", "infinity",
                            "1e400"]


def test_connect_timeout_is_read_as_the_simulator_reads_it(monkeypatch: pytest.MonkeyPatch, sim_home: Path) -> None:
    # Rank 0's rendezvous stops waiting when HCCL would: HCCL_CONNECT_TIMEOUT=-1 used to give it 1 s.
    reader = getattr(ctypes.CDLL(str(sim_home / "lib64" / "libascendcl.so")), "__hcclpy_sim_env_seconds")
    reader.restype, reader.argtypes = ctypes.c_double, [ctypes.c_char_p, ctypes.c_double]
    for text in VALID_CONNECT_TIMEOUTS + IGNORED_CONNECT_TIMEOUTS:
        monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", text)
        simulator = reader(b"HCCL_CONNECT_TIMEOUT", -1.0)  # -1: it ignored the value
        taken = simulator >= 0 and math.isfinite(simulator)
        assert taken == (text in VALID_CONNECT_TIMEOUTS), (text, simulator)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _connect_timeout() == (simulator if taken else DEFAULT_CONNECT_TIMEOUT), text
        assert [str(w.message) for w in caught] == ([] if taken else [
            f"HCCL_CONNECT_TIMEOUT={text!r} is ignored: it must be a number of seconds >= 0; using 120"]), text
    for blank in ("", "  "):  # unset
        monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", blank)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _connect_timeout() == DEFAULT_CONNECT_TIMEOUT == 120


def test_rank_0_ignores_an_invalid_connect_timeout(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MASTER_PORT", str(free_port()))
    clean_env.setenv("HCCL_CONNECT_TIMEOUT", "-1")  # 120 s for HCCL: init()'s 1.5 s is the shorter
    with pytest.warns(RuntimeWarning, match=r"HCCL_CONNECT_TIMEOUT='-1' is ignored") as warned:
        with pytest.raises(hcclpy.CommTimeoutError, match=r"did not reach the rendezvous .* within 1\.5 s"):
            hcclpy.init(rank=0, world_size=2, timeout=1.5)
    assert [w.filename for w in warned] == [__file__], "the warning points at the call of init()"
    assert world() is None


def test_ranks_numbered_without_a_launcher_are_refused_a_missing_device(clean_env: pytest.MonkeyPatch) -> None:
    # No launcher: the device is the rank, as LOCAL_RANK defaults to it (it was device 0 for all).
    count = hcclpy.device_count()
    with pytest.raises(ValueError, match=rf"^local rank {count} \(the rank: no launcher sets one\) has no device: "
                                         rf"{count} visible"):
        hcclpy.init(rank=count, world_size=count + 1, timeout=0.5)
    assert world() is None


def test_rank_0_removes_the_root_info_file_when_the_job_fails(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("HCCL_CONNECT_TIMEOUT", "1")  # rank 1 never comes: forming the communicator fails
    path = tmp_path / "root_info"
    with pytest.raises(hcclpy.HcclError):
        hcclpy.init(rank=0, world_size=2, store_path=str(path), timeout=5)
    assert not path.exists(), "a later run would read this job's root info"


def test_init_from_a_one_rank_table(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_rank_table(tmp_path / "one.json", [[0]])
    comm = hcclpy.init(rank_table=str(path))
    assert (comm.rank, comm.size) == (0, 1)


def test_tcp_rank_times_out_without_rank_0(clean_env: pytest.MonkeyPatch) -> None:
    port = free_port()
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_PORT", str(port))):
        clean_env.setenv(name, value)
    start = time.monotonic()
    with pytest.raises(hcclpy.CommTimeoutError, match=rf"127\.0\.0\.1:{port}"):
        hcclpy.init(timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert world() is None


def test_file_rank_times_out_without_rank_0(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "never-written"
    start = time.monotonic()
    with pytest.raises(hcclpy.CommTimeoutError, match=re.escape(str(path))):
        hcclpy.init(rank=1, world_size=2, store_path=str(path), timeout=0.5)
    assert time.monotonic() - start < 3.0
    assert world() is None


# ---------------------------------------------------------------- init, several processes

def write_rank_table(path: Path, servers: List[List[int]]) -> Path:
    """A rank table in the documented format (reference §5.1), every value a string; on each server
    the device id is the local rank."""
    table = {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(servers)),
        "server_list": [
            {"server_id": f"host-{s}",
             "device": [{"device_id": str(local), "device_ip": f"192.168.{100 + s}.{10 + local}",
                         "device_port": "16666", "rank_id": str(rank)} for local, rank in enumerate(ranks_here)]}
            for s, ranks_here in enumerate(servers)
        ],
    }
    path.write_text(json.dumps(table, indent=2))
    return path


class FakeMpiComm:
    """The methods of an mpi4py communicator ``init`` uses, ``bcast`` over a file: the root's
    publishes the object's bytes, the others wait for them."""

    def __init__(self, rank: int, path: str, size: int) -> None:
        self.rank, self.path, self.size = rank, path, size
        self.calls: List[tuple] = []

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self.calls.append((type(obj).__name__, len(obj) if isinstance(obj, bytes) else None, root))
        if self.rank == root:
            with open(self.path + ".tmp", "wb") as handle:
                handle.write(obj)
            os.replace(self.path + ".tmp", self.path)
            return obj
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path):
            if time.monotonic() > deadline:
                raise TimeoutError("fake bcast: the root never published")
            time.sleep(0.01)
        with open(self.path, "rb") as handle:
            return handle.read()


def _init_rank(rank: int, size: int, info: bytes, how: str, env: Mapping[str, str], where: str) -> Dict[str, Any]:
    """One rank of a job: set its launcher environment, ``hcclpy.init()``, one all-reduce, shutdown."""
    local = rank % int(env.get("LOCAL_WORLD_SIZE", size))
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local), **env})
    kwargs: Dict[str, Any] = {"timeout": 60.0}
    fake = None
    if how == "store":
        kwargs["store_path"] = where
    elif how == "rank_table":
        kwargs["rank_table"] = where
    elif how == "rank_table_env":
        os.environ["RANK_TABLE_FILE"] = where
    elif how == "mpi":
        fake = kwargs["mpi_comm"] = FakeMpiComm(rank, where, size)
    comm = hcclpy.init(**kwargs)
    try:
        assert world() is comm
        total = comm.all_reduce(np.array([rank, 1], dtype=np.int64))
        return {"rank": comm.rank, "size": comm.size, "device": comm.device.id, "sum": total.tolist(),
                "name": comm.name, "bcast": fake.calls if fake else None}
    finally:
        hcclpy.shutdown()
        assert world() is None


def run_job(size: int, how: str, env: Optional[Dict[str, str]] = None, where: str = "") -> List[Dict[str, Any]]:
    results = ranks.run_processes(_init_rank, size, how, env or {}, where, timeout=PROCESS_TIMEOUT)
    assert [r["rank"] for r in results] == list(range(size))
    assert all(r["size"] == size and r["sum"] == [size * (size - 1) // 2, size] for r in results), results
    assert {r["name"] for r in results} == {"world"}, results  # one communicator, named as hcclpy.init names it
    return results


def tcp_env(token: Optional[str]) -> Dict[str, str]:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if token:
        env["HCCLPY_RENDEZVOUS_TOKEN"] = token
    return env


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.slow
def test_init_tcp_rendezvous(size: int) -> None:
    results = run_job(size, "tcp", tcp_env("a-secret-shared-by-the-job"))
    assert [r["device"] for r in results] == list(range(size))  # device = local rank


def test_init_tcp_rendezvous_on_one_host_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # No secret set: rank 0 passes one through a file only this user can read.
    monkeypatch.delenv("HCCLPY_RENDEZVOUS_TOKEN", raising=False)
    run_job(2, "tcp", {**tcp_env(None), "TORCHELASTIC_RUN_ID": "job-17"})


def _init_unless_last(rank: int, size: int, info: bytes, env: Dict[str, str]) -> Optional[str]:
    if rank == size - 1:
        return None  # never starts
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), **env})
    try:
        hcclpy.init(timeout=4.0)
    except hcclpy.CommTimeoutError as exc:
        return str(exc)
    return "joined"


@pytest.mark.slow
def test_every_rank_names_exactly_the_rank_that_never_came() -> None:
    # Ranks 1 and 2 have the root info; rank 3 never starts. Nobody waits in HCCL for a rank 0 that
    # gave up: every rank fails at the rendezvous, naming rank 3 alone.
    said = ranks.run_processes(_init_unless_last, 4, tcp_env("s"), timeout=PROCESS_TIMEOUT)
    assert said[3] is None
    for rank in range(3):
        # Rank 0's verdict, or (when a rank's own timeout ends first) the last news it had from rank 0.
        assert said[rank] is not None and re.match(r"(rank [12] has the root info, but )?rank\(s\) \[3\] (did not|had "
                                                   r"not) (reach|join)", said[rank]), (rank, said[rank])


def _init_at(rank: int, size: int, info: bytes, addresses: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    return _init_rank(rank, size, info, "tcp", {**env, "MASTER_ADDR": addresses[rank]}, "")


@pytest.mark.slow
def test_private_secret_does_not_depend_on_how_rank_0_host_is_spelled(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nodes may name rank 0's host differently (hcclpy run --master-addr on each): the job is the same.
    monkeypatch.delenv("HCCLPY_RENDEZVOUS_TOKEN", raising=False)
    env = {"MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "job-18"}
    results = ranks.run_processes(_init_at, 2, ["127.0.0.1", "localhost"], env, timeout=PROCESS_TIMEOUT)
    assert [(r["rank"], r["sum"]) for r in results] == [(0, [1, 2]), (1, [1, 2])]


def _init_numbered_by_the_caller(rank: int, size: int, info: bytes, port: str) -> int:
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    os.environ["MASTER_PORT"] = port  # where to meet; no launcher's variables
    comm = hcclpy.init(rank=rank, world_size=size, timeout=60)
    try:
        return comm.device.id
    finally:
        hcclpy.shutdown()


def test_ranks_numbered_without_a_launcher_use_the_device_of_their_rank() -> None:
    # Logical ids: ASCEND_RT_VISIBLE_DEVICES applies as it does to LOCAL_RANK.
    devices = ranks.run_processes(_init_numbered_by_the_caller, 2, str(free_port()),
                                  env={"ASCEND_RT_VISIBLE_DEVICES": "5,2"}, timeout=PROCESS_TIMEOUT)
    assert devices == [0, 1]


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.slow
def test_init_through_a_file(tmp_path: Path, size: int) -> None:
    path = tmp_path / "shared" / "root_info"
    path.parent.mkdir()
    run_job(size, "store", where=str(path))
    assert not path.exists(), "rank 0 left the root-info file behind"
    assert list(path.parent.iterdir()) == [], "a temporary file was left behind"


def _init_after_a_crashed_job(rank: int, size: int, info: bytes, path: str) -> str:
    if rank == 0:
        time.sleep(1.0)  # the other rank looks for the file first
    start = time.monotonic()
    try:
        hcclpy.init(rank=rank, world_size=size, device=rank, store_path=path, timeout=20.0)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}"
    hcclpy.shutdown()
    return "ok"


@pytest.mark.slow
def test_init_through_a_file_left_by_a_crashed_job(tmp_path: Path) -> None:
    path = tmp_path / "root_info"
    path.write_bytes(hcclpy.RootInfo.generate(device=0).to_bytes())  # the crashed job's
    out = ranks.run_processes(_init_after_a_crashed_job, 2, str(path), env={"HCCL_CONNECT_TIMEOUT": "3"},
                              timeout=PROCESS_TIMEOUT)
    # Either the job works, or it is told about the stale file at once, by name.
    assert out == ["ok", "ok"] or all(str(path) in o and "HCCL_E_TIMEOUT" not in o for o in out), out


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.slow
def test_init_from_rank_table_argument(tmp_path: Path, size: int) -> None:
    path = write_rank_table(tmp_path / "rank_table.json", [list(range(size))])
    results = run_job(size, "rank_table", where=str(path))
    assert [r["device"] for r in results] == list(range(size))


@pytest.mark.slow
def test_init_from_rank_table_variable_two_servers(tmp_path: Path) -> None:
    # Two "servers" of two devices each: device ids repeat (0, 1 on each), as local ranks do.
    path = write_rank_table(tmp_path / "rank_table.json", [[0, 1], [2, 3]])
    results = run_job(4, "rank_table_env", {"LOCAL_WORLD_SIZE": "2"}, where=str(path))
    assert [r["device"] for r in results] == [0, 1, 0, 1]


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.slow
def test_init_over_an_mpi_communicator(tmp_path: Path, size: int) -> None:
    # No MASTER_PORT: nothing may go through TCP.
    results = run_job(size, "mpi", where=str(tmp_path / "bcast"))
    for r in results:
        # One bcast from root 0: the root passes the 4108-byte root info, the others None.
        assert r["bcast"] == [("bytes", 4108, 0)] if r["rank"] == 0 else r["bcast"] == [("NoneType", None, 0)]


def _local_rank_without_device(rank: int, size: int, info: bytes) -> Dict[str, str]:
    os.environ.update({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_PORT": str(free_port())})
    out = {"count": str(hcclpy.device_count())}
    try:
        hcclpy.init(timeout=1.0)
    except ValueError as exc:
        out["error"] = str(exc)
    # An explicit device makes it valid (rank 3 of a one-rank world is still rejected, so use 0 of 1).
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1"})
    comm = hcclpy.init(device=1)
    out["device"] = str(comm.device.id)
    hcclpy.shutdown()
    return out


def test_local_rank_beyond_the_device_count() -> None:
    out = ranks.run_processes(_local_rank_without_device, 1, env={"HCCLPY_SIM_DEVICES": "2"},
                              timeout=PROCESS_TIMEOUT)[0]
    assert out["count"] == "2"
    assert "error" in out, "init accepted local rank 3 with 2 devices"
    assert re.search(r"local rank 3 has no device: 2 visible", out["error"]), out["error"]
    assert "HCCLPY_SIM_DEVICES" in out["error"]
    assert out["device"] == "1"


RUN_SCRIPT = """
    import json, numpy as np, hcclpy
    from hcclpy.bootstrap import detect_launch
    comm = hcclpy.init(timeout=60)
    launch = detect_launch()
    total = comm.all_reduce(np.array([comm.rank, 1], dtype=np.int64))
    # One write per line: the ranks share the launcher's stdout.
    print(json.dumps({"rank": comm.rank, "size": comm.size, "device": comm.device.id, "sum": total.tolist(),
                      "launcher": launch.launcher, "name": comm.name}) + "\\n", end="", flush=True)
    hcclpy.shutdown()
"""


def launch(command: List[str], tmp_path: Path, script_text: str = RUN_SCRIPT) -> Dict[int, Dict[str, Any]]:
    """Run ``script_text`` under a launcher ``command``; every rank's JSON line, by rank."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(script_text))
    env = {**os.environ, **ranks.RANK_ENV}
    for name in LAUNCH_VARIABLES:
        env.pop(name, None)
    proc = subprocess.run([*command, str(script)], capture_output=True, text=True, env=env, timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for text in re.findall(r"\{[^{}]*\}", proc.stdout):  # hcclpy run prefixes each line with "[rank] "
        row = json.loads(text)
        rows[row["rank"]] = row
    assert sorted(rows) == list(range(len(rows))) and rows, proc.stdout + proc.stderr
    return rows


def check_job(rows: Dict[int, Dict[str, Any]], size: int, launchers: Any) -> None:
    assert sorted(rows) == list(range(size))
    for rank, row in rows.items():
        assert row["launcher"] in launchers, row
        assert row == {"rank": rank, "size": size, "device": rank, "sum": [size * (size - 1) // 2, size],
                       "launcher": row["launcher"], "name": rows[0]["name"]}


def test_init_under_hcclpy_run(tmp_path: Path) -> None:
    rows = launch([sys.executable, "-m", "hcclpy", "run", "-n", "4", "--timeout", "80"], tmp_path)
    check_job(rows, 4, ("torchrun",))  # hcclpy run sets torchrun's variables


@pytest.mark.slow
def test_init_under_torchrun(tmp_path: Path) -> None:
    # torchrun's agent serves its own store on MASTER_PORT: the rendezvous must go elsewhere.
    check_job(launch(ranks.launcher("torchrun", 2), tmp_path), 2, ("torchrun",))


def test_init_under_mpiexec(tmp_path: Path) -> None:
    # No MASTER_PORT: the port comes from the MPI job id, the same on every rank.
    check_job(launch(ranks.launcher("mpiexec", 3), tmp_path), 3, ("pmi", "openmpi"))


def test_init_over_mpi4py_under_mpiexec(tmp_path: Path) -> None:
    script = RUN_SCRIPT.replace("hcclpy.init(timeout=60)", "hcclpy.init(mpi_comm=MPI.COMM_WORLD)")
    script = script.replace("import json, numpy as np, hcclpy", "import json, numpy as np, hcclpy\n    from mpi4py import MPI")
    check_job(launch(ranks.launcher("mpiexec", 2), tmp_path, script), 2, ("pmi", "openmpi"))


@pytest.mark.slow
def test_init_beside_torch_distributed(tmp_path: Path) -> None:
    # torch.distributed's env:// store holds MASTER_PORT for the whole job: init() must keep off it.
    script = RUN_SCRIPT.replace("comm = hcclpy.init(timeout=60)", """import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    comm = hcclpy.init(timeout=60)
    gloo = torch.ones(2)
    dist.all_reduce(gloo)
    assert gloo.tolist() == [dist.get_world_size()] * 2""")
    script = script.replace("hcclpy.shutdown()", "hcclpy.shutdown()\n    dist.destroy_process_group()")
    for command in ([sys.executable, "-m", "hcclpy", "run", "-n", "2", "--timeout", "80"],
                    ranks.launcher("torchrun", 2)):
        check_job(launch(command, tmp_path, script), 2, ("torchrun",))
