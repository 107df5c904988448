"""The rendezvous's job secret: what a stranger on the same host can and cannot do, the private
directory, jobs across hosts, incomplete launcher environments, and the progress of a wait."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import numpy as np
import pytest

import hcclpy
import hcclpy._progress
from hcclpy import _jobsecret
from hcclpy.rendezvous import RendezvousError, fetch_root_info, free_port, job_token

from test_bootstrap import clean_env  # noqa: F401,F811 - the fixture: no launcher variables, no world

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::hcclpy.SimulatorFallbackWarning")]

NOBODY = 65534


# A stranger: another user of the host, who knows the port and everything launchers make public.
STRANGER = """
import encodings.idna, os, sys  # imported while still root: this user may not read the stdlib
from hcclpy.rendezvous import fetch_root_info, job_token
port, secret_path = int(sys.argv[1]), sys.argv[2]
os.setgid({nobody}); os.setuid({nobody})
said = []
try:  # the token anyone could compute before: from the port and the (empty) job id
    fetch_root_info("127.0.0.1", port, 1, 2, job_token(port, ""), 20.0)
    said.append("JOINED")
except Exception as exc:
    said.append(type(exc).__name__ + ": " + str(exc))
try:  # the secret rank 0 wrote for its ranks
    with open(secret_path, "rb") as handle:
        said.append("READ " + handle.read().hex())
except Exception as exc:
    said.append(type(exc).__name__)
print("\\n".join(said))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run the stranger as another user")
def test_a_stranger_on_the_host_cannot_join_a_job_without_a_token(clean_env: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    # Rank 0 of a 2-rank job started by hand (no launcher, no HCCLPY_RENDEZVOUS_TOKEN): a stranger
    # who finds the port is refused and cannot read the secret; the real rank 1 then joins.
    port = free_port()
    clean_env.setenv("MASTER_PORT", str(port))
    clean_env.setenv("TMPDIR", str(tmp_path))  # tmp_path is root's: the private directory goes inside
    clean_env.delenv("XDG_RUNTIME_DIR", raising=False)
    clean_env.setattr("tempfile.tempdir", None)
    tmp_path.chmod(0o755)
    result: List[object] = []
    rank_0 = threading.Thread(target=lambda: result.append(hcclpy.init(rank=0, world_size=2, timeout=60)), daemon=True)
    rank_0.start()
    secret_path = _jobsecret._path(f"{port}::2")  # the job's key: port, job id (none), world size
    stranger = subprocess.run([sys.executable, "-c", STRANGER.format(nobody=NOBODY), str(port), secret_path],
                              capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    lines = stranger.stdout.splitlines()
    assert len(lines) == 2, stranger.stdout + stranger.stderr
    assert lines[0].startswith("RendezvousError: ") and "wrong job token" in lines[0], lines
    assert lines[1] == "PermissionError", lines
    # The job itself is unharmed: its rank 1 reads the secret and joins.
    rank_1 = subprocess.Popen([sys.executable, "-c", """
import numpy as np, hcclpy
comm = hcclpy.init(rank=1, world_size=2, timeout=60)
print(comm.all_reduce(np.array([2.0])).tolist())
hcclpy.shutdown()
"""], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "MASTER_PORT": str(port)})
    try:
        rank_0.join(60)
        assert result, "rank 0 did not form the communicator"
        comm = result[0]
        assert isinstance(comm, hcclpy.Communicator)
        assert comm.all_reduce(np.array([1.0])).tolist() == [3.0]
        out, err = rank_1.communicate(timeout=60)
    finally:
        rank_1.kill()
    assert rank_1.returncode == 0 and out.split() == ["[3.0]"], err
    assert os.listdir(_jobsecret.private_dir()) == [], "the secret outlived the rendezvous"


def test_private_dir_is_this_users_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = Path(_jobsecret.private_dir())
    assert path == tmp_path / f"hcclpy-{os.getuid()}" and path.stat().st_mode & 0o777 == 0o700
    secret = _jobsecret.new_token()
    published = Path(_jobsecret.publish("a job", secret))
    assert published.parent == path and published.stat().st_mode & 0o777 == 0o600
    assert _jobsecret.read("a job") == secret and _jobsecret.read("another job") is None
    _jobsecret.withdraw(str(published))
    assert _jobsecret.read("a job") is None
    # Made in advance, open to others: refused, saying what to do.
    path.chmod(0o755)
    with pytest.raises(PermissionError, match=r"only this user .* can enter.*HCCLPY_RENDEZVOUS_TOKEN"):
        _jobsecret.private_dir()
    path.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)  # someone else's
        with pytest.raises(PermissionError, match="only this user"):
            _jobsecret.private_dir()
    # $XDG_RUNTIME_DIR, when it is this user's own, is preferred.
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert _jobsecret.private_dir() == str(runtime / "hcclpy")


def test_a_job_across_hosts_needs_a_secret(clean_env: pytest.MonkeyPatch) -> None:
    # Rank 1 of 2, one rank per host (LOCAL_WORLD_SIZE=1), no token: refused at once, saying how.
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("LOCAL_RANK", "0")
    clean_env.setenv("LOCAL_WORLD_SIZE", "1")
    clean_env.setenv("MASTER_ADDR", "10.0.0.1")
    clean_env.setenv("MASTER_PORT", str(free_port()))
    with pytest.raises(ValueError, match=r"several hosts and no secret.*HCCLPY_RENDEZVOUS_TOKEN"):
        hcclpy.init(timeout=60)
    # Slurm says how many nodes the step spans.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        clean_env.delenv(name)
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_LOCALID", "0")
    clean_env.setenv("SLURM_STEP_NUM_NODES", "2")
    with pytest.raises(ValueError, match="several hosts and no secret"):
        hcclpy.init(timeout=60)


def test_rank_and_world_size_without_a_port_fail_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK=1 and WORLD_SIZE=2 are set but MASTER_PORT is not.*hcclpy run -n 2"):
        hcclpy.init(timeout=300)


@pytest.mark.slow
def test_waiting_ranks_say_what_they_wait_for(clean_env: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # Rank 0 waits for rank 1 of 2, which never comes; a rank waits for a rank 0 that never starts.
    clean_env.setattr(hcclpy._progress, "PERIOD", 0.3)
    clean_env.setenv("HCCLPY_RENDEZVOUS_TOKEN", "s")
    port = free_port()
    clean_env.setenv("MASTER_PORT", str(port))
    with pytest.raises(hcclpy.CommTimeoutError, match=r"rank\(s\) \[1\] did not reach"):
        hcclpy.init(rank=0, world_size=2, timeout=1.5)
    err = capfd.readouterr().err
    assert f"hcclpy: rank 0 is waiting for rank(s) 1 to join the rendezvous on 127.0.0.1:{port} (" in err, err
    assert " s of 1.5 s)" in err, err
    with pytest.raises(hcclpy.CommTimeoutError, match="could not reach rank 0's rendezvous"):
        fetch_root_info("127.0.0.1", port, 3, 4, job_token(port), 1.0)
    err = capfd.readouterr().err
    assert f"hcclpy: rank 3 is waiting for rank 0's rendezvous at 127.0.0.1:{port} (" in err, err


def test_a_rank_that_reads_the_secret_before_rank_0_published_it_retries(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader is called once rank 0 is reached; None (nothing published yet) is retried, not sent.
    from hcclpy.rendezvous import RendezvousServer

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    secret = _jobsecret.new_token()
    server = RendezvousServer("127.0.0.1", 0, 2, secret, b"root info", 30.0)
    calls: List[int] = []

    def reader() -> object:
        calls.append(1)
        if len(calls) == 3:
            _jobsecret.publish("job", secret)
        return _jobsecret.read("job")

    try:
        assert fetch_root_info("127.0.0.1", server.address[1], 1, 2, reader, 10.0) == b"root info"  # type: ignore[arg-type]
    finally:
        server.close()
    assert len(calls) == 3
    with pytest.raises(RendezvousError, match="wrong job token"):
        other = RendezvousServer("127.0.0.1", 0, 2, secret, b"root info", 30.0)
        try:
            fetch_root_info("127.0.0.1", other.address[1], 1, 2, _jobsecret.new_token(), 10.0)
        finally:
            other.close()
