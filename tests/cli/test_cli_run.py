"""``hcclpy run``: environment, output prefixes, failure propagation, timeouts and signals.

Every launcher runs as a subprocess with a timeout, and the rank scripts are plain Python (no
hcclpy import) unless a test is about hcclpy itself, so these tests are quick.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

import ranks

from hcclpy.cli import main
from hcclpy.cli.run import (FOREIGN_RANK_VARIABLES, LAUNCHER, RankSpec, free_port, next_port, rank_environment,
                            rendezvous_port)

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60  # seconds any launcher may take; the tests expect far less
LINE = re.compile(r"^\[(\d+)\] (.*)$")


def hcclpy_run(*args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
               timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``python -m hcclpy run ARGS`` to completion, output captured as text."""
    return subprocess.run([sys.executable, "-m", "hcclpy", "run", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def start_run(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """``python -m hcclpy run ARGS`` in the background (in its own session, as from a shell)."""
    return subprocess.Popen([sys.executable, "-m", "hcclpy", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def by_rank(text: str) -> Dict[int, List[str]]:
    """The lines of prefixed output, grouped by rank; every line must carry a prefix."""
    lines: Dict[int, List[str]] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        assert match, f"line without a [rank] prefix: {line!r}"
        lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


def script(tmp_path: Path, body: str, name: str = "rank.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def wait_for_files(paths: Sequence[Path], timeout: float = 30.0) -> None:
    assert ranks.wait_for(lambda: all(p.exists() for p in paths), timeout), \
        f"ranks did not start: missing {[str(p) for p in paths if not p.exists()]}"


ENV_DUMP = """
    import json, os, sys
    print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))
    print("on stderr from", os.environ["RANK"], file=sys.stderr)
"""
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# ----------------------------------------------------------------------------- environment

def test_every_rank_gets_the_torchrun_variables_and_prefixed_output(tmp_path):
    names = TORCHRUN_VARIABLES + ("HCCLPY_LAUNCHER", "PYTHONUNBUFFERED", "HCCLPY_RENDEZVOUS_PORT")
    result = hcclpy_run("-n", "3", script(tmp_path, ENV_DUMP), *names)
    assert result.returncode == 0, result.stderr
    out = by_rank(result.stdout)
    assert sorted(out) == [0, 1, 2]
    ports = set()
    for rank, lines in out.items():
        env = json.loads(lines[0])
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["HCCLPY_LAUNCHER"] == LAUNCHER == "hcclpy-run"
        assert env["PYTHONUNBUFFERED"] == "1"
        ports.add((env["MASTER_PORT"], env["HCCLPY_RENDEZVOUS_PORT"]))
    assert len(ports) == 1, "one pair of ports for the whole job"
    master, rendezvous = ports.pop()
    assert 0 < int(master) < 65536 and 0 < int(rendezvous) < 65536 and master != rendezvous
    # stderr stays on stderr, prefixed too.
    assert by_rank(result.stderr) == {r: [f"on stderr from {r}"] for r in range(3)}


def test_multi_node_ranks_and_explicit_rendezvous(tmp_path):
    result = hcclpy_run("-n", "2", "--nnodes", "3", "--node-rank", "2", "--master-addr", "10.1.2.3",
                        "--master-port", "29999", script(tmp_path, ENV_DUMP), *TORCHRUN_VARIABLES,
                        "HCCLPY_RENDEZVOUS_PORT")
    assert result.returncode == 0, result.stderr
    out = by_rank(result.stdout)
    assert sorted(out) == [4, 5]  # node_rank * N + local rank
    for rank, lines in out.items():
        env = json.loads(lines[0])
        assert env == {"RANK": str(rank), "WORLD_SIZE": "6", "LOCAL_RANK": str(rank - 4), "LOCAL_WORLD_SIZE": "2",
                       "GROUP_RANK": "2", "NODE_RANK": "2", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": str(rank),
                       "ROLE_WORLD_SIZE": "6", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29999",
                       "HCCLPY_RENDEZVOUS_PORT": "30000"}


def test_multi_node_rendezvous_port_stays_in_range():
    # Every node's launcher derives the same port from MASTER_PORT alone: the next one, or the one
    # before at the top of the range (as docs/environment.md says).
    def port(master_port: int) -> int:
        return rendezvous_port(RankSpec(local_rank=0, nproc=1, nnodes=2, node_rank=0, master_addr="h",
                                        master_port=master_port))

    assert port(29999) == 30000 and port(65534) == 65535
    assert port(65535) == 65534


def test_other_launchers_rank_variables_are_removed(tmp_path):
    env = {**os.environ, "SLURM_PROCID": "7", "OMPI_COMM_WORLD_RANK": "7", "PMI_RANK": "7", "PYTHONUNBUFFERED": "x",
           "UNRELATED_VARIABLE": "kept"}
    result = hcclpy_run("-n", "1", script(tmp_path, ENV_DUMP), "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                        "PYTHONUNBUFFERED", "UNRELATED_VARIABLE", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(by_rank(result.stdout)[0][0]) == {
        "SLURM_PROCID": None, "OMPI_COMM_WORLD_RANK": None, "PMI_RANK": None, "PYTHONUNBUFFERED": "x",
        "UNRELATED_VARIABLE": "kept"}


def test_rank_environment_function():
    base = {"PATH": "/bin", "SLURM_PROCID": "3", "RANK": "99"}
    env = rank_environment(RankSpec(local_rank=1, nproc=4, nnodes=2, node_rank=1, master_addr="h", master_port=5),
                           base)
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert env["PATH"] == "/bin" and "SLURM_PROCID" not in env
    assert base == {"PATH": "/bin", "SLURM_PROCID": "3", "RANK": "99"}, "the base is not modified"
    assert set(FOREIGN_RANK_VARIABLES).isdisjoint(env)


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ------------------------------------------------------------------------- command forms

def test_module_form_passes_arguments(tmp_path):
    (tmp_path / "mymodule.py").write_text("import os, sys\nprint(os.environ['RANK'], sys.argv[1:])\n")
    result = hcclpy_run("-n", "2", "-m", "mymodule", "--flag", "value", "-n", "9", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert by_rank(result.stdout) == {0: ["0 ['--flag', 'value', '-n', '9']"], 1: ["1 ['--flag', 'value', '-n', '9']"]}


def test_script_arguments_that_look_like_launcher_options(tmp_path):
    path = script(tmp_path, "import sys\nprint(sys.argv[1:])\n")
    result = hcclpy_run("-n", "1", path, "-n", "5", "--timeout", "x", "--", "-m")
    assert result.returncode == 0, result.stderr
    assert by_rank(result.stdout) == {0: ["['-n', '5', '--timeout', 'x', '--', '-m']"]}


def test_no_python_runs_a_program():
    result = hcclpy_run("-n", "2", "--no-python", sys.executable, "-c", "import os; print('rank', os.environ['RANK'])")
    assert result.returncode == 0, result.stderr
    assert by_rank(result.stdout) == {0: ["rank 0"], 1: ["rank 1"]}


def test_no_prefix_passes_output_through(tmp_path):
    # One write per line: passed through, the ranks' writes reach the pipe as they come, and
    # print('plain', rank) is several writes under PYTHONUNBUFFERED, which the other rank's can split.
    body = "import os, sys\nsys.stdout.write(f\"plain {os.environ['RANK']}\\n\")\n"
    result = hcclpy_run("-n", "2", "--no-prefix", script(tmp_path, body))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["plain 0", "plain 1"]


def test_output_is_binary_safe_and_split_into_lines(tmp_path):
    body = """
        import sys
        out = sys.stdout.buffer
        out.write(b"caf\\xc3\\xa9 ok\\n")
        out.write(b"bad \\xff\\xfe byte\\n")
        out.write(b"x" * 200000)  # a long line without a newline, then no final newline
        out.flush()
    """
    result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "1", script(tmp_path, body)],
                            capture_output=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode("utf-8").splitlines()
    assert lines[0] == "[0] café ok"
    assert lines[1] == "[0] bad \ufffd\ufffd byte"
    assert all(line.startswith("[0] ") for line in lines[2:])
    assert sum(len(line) - 4 for line in lines[2:]) == 200000


def test_usage_errors(tmp_path):
    path = script(tmp_path, "pass\n")
    assert hcclpy_run("-n", "2", "--nnodes", "2", path).returncode == 2, "--master-port is required"
    assert hcclpy_run("--nnodes", "2", "--node-rank", "2", "--master-port", "1234", path).returncode == 2
    assert hcclpy_run("-n", "0", path).returncode == 2
    assert hcclpy_run("--timeout", "-1", path).returncode == 2
    assert hcclpy_run("-m", "--no-python", "x").returncode == 2
    missing = hcclpy_run("-n", "1", str(tmp_path / "missing.py"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    bare = hcclpy_run("-n", "1", str(tmp_path))
    assert bare.returncode == 2 and "a directory without __main__.py, which Python would run" in bare.stderr
    for option, value, message in (("-n", "two", "must be a whole number >= 1, got 'two'"),
                                   ("--master-port", "http", "must be a TCP port in 1..65535, got 'http'"),
                                   ("--timeout", "1m", "must be a positive number of seconds, got '1m'")):
        wrong = hcclpy_run(option, value, path)
        assert wrong.returncode == 2 and message in wrong.stderr, wrong.stderr


def two_free_ports() -> int:
    """A port P such that P and P + 1 (where hcclpy run puts the rendezvous) are both free now."""
    import socket

    for _ in range(100):
        port = free_port()
        if port >= 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


@pytest.mark.parametrize("spelling", ["underscores", "dashes", "equals"])
def test_torchrun_spellings_set_the_job_and_where_the_rendezvous_listens(tmp_path, spelling):
    port = two_free_ports()
    options = {
        "underscores": ["--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
                        "--master_port", str(port)],
        "dashes": ["--nproc-per-node", "2", "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                   "--master-port", str(port)],
        "equals": ["--standalone", "--nproc-per-node=2", "--nnodes=1", "--node_rank=0", "--master-addr=127.0.0.1",
                   f"--master_port={port}"],
    }[spelling]
    result = hcclpy_run(*options, script(tmp_path, ENV_DUMP), *TORCHRUN_VARIABLES, "HCCLPY_RENDEZVOUS_PORT")
    assert result.returncode == 0, result.stderr
    out = by_rank(result.stdout)
    assert sorted(out) == [0, 1]
    for rank, lines in out.items():
        env = json.loads(lines[0])
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "2", "2")
        assert (env["NODE_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert env["HCCLPY_RENDEZVOUS_PORT"] == str(port + 1), "the rendezvous sits next to --master-port"


def test_torchrun_spellings_run_a_two_rank_job():
    port = two_free_ports()
    result = hcclpy_run("--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
                        "--master_port", str(port), "--timeout", str(TIMEOUT), str(REPO / "examples" / "allreduce.py"))
    assert result.returncode == 0, result.stderr
    assert by_rank(result.stdout) == {0: ["rank 0 of 2: [0.0, 2.0] OK"], 1: ["rank 1 of 2: [0.0, 2.0] OK"]}
    if "HCCLPY_BACKEND" not in os.environ:  # the simulator's notice: once for the job, by rank 0
        assert result.stderr.count("no CANN installation found") == 1, result.stderr
        assert "[0] " in result.stderr.split("no CANN installation found")[0].splitlines()[-1], result.stderr


def test_an_abbreviation_of_both_spellings_of_one_option_is_that_option(tmp_path):
    # --nproc matches --nproc-per-node and --nproc_per_node: one option, not an ambiguity.
    result = hcclpy_run("--nproc", "2", script(tmp_path, "import os; print(os.environ['WORLD_SIZE'])\n"))
    assert result.returncode == 0, result.stderr
    assert by_rank(result.stdout) == {0: ["2"], 1: ["2"]}


@pytest.mark.parametrize("typed, meant", [("--nproc_per_nodes", "--nproc-per-node"),
                                          ("--nprocs-per-node", "--nproc-per-node"),
                                          ("--master-adress=10.0.0.1", "--master-addr"),
                                          ("--master_prot", "--master-port"),
                                          ("--Node_Rank", "--node-rank"),
                                          ("--time-out", "--timeout"),
                                          ("--no-prefixes", "--no-prefix")])
def test_an_unknown_option_is_refused_with_the_one_meant(tmp_path, typed, meant):
    started = tmp_path / "started"
    path = script(tmp_path, f"open({str(started)!r}, 'w').close()\n")
    result = hcclpy_run(typed, "2", path)
    assert result.returncode == 2
    assert f"hcclpy run: error: unrecognized option {typed.split('=')[0]}; did you mean {meant}?" in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr
    assert not started.exists(), "no rank starts"


def test_an_unknown_option_nothing_is_near_is_named(tmp_path):
    result = hcclpy_run("--frobnicate", script(tmp_path, "pass\n"))
    assert result.returncode == 2
    assert "hcclpy run: error: unrecognized arguments: --frobnicate" in result.stderr, result.stderr


def test_other_launchers_options_say_what_to_write_instead(tmp_path):
    path = script(tmp_path, "pass\n")
    mpirun = hcclpy_run("-np", "4", path)
    assert mpirun.returncode == 2
    assert "-np: that is mpirun's spelling; hcclpy run takes -n 4 (or --nproc-per-node 4" in mpirun.stderr, \
        mpirun.stderr
    for option in ("--rdzv-endpoint", "--rdzv_endpoint"):
        rdzv = hcclpy_run(option, "host:29400", path)
        assert rdzv.returncode == 2
        assert f"{option}: torchrun's option, not hcclpy run's" in rdzv.stderr and "--master-addr" in rdzv.stderr, \
            rdzv.stderr
    restarts = hcclpy_run("--max-restarts=3", path)
    assert restarts.returncode == 2 and "hcclpy run does not restart ranks" in restarts.stderr, restarts.stderr


def test_several_nodes_need_a_master_port_and_standalone_is_one_node(tmp_path):
    path = script(tmp_path, "pass\n")
    several = hcclpy_run("--nproc_per_node", "2", "--nnodes", "2", path)
    assert several.returncode == 2
    assert "--master-port is required with --nnodes > 1" in several.stderr, several.stderr
    standalone = hcclpy_run("--standalone", "--nnodes", "2", "--master-port", "29500", path)
    assert standalone.returncode == 2
    assert "--standalone is one node; --nnodes 2 asks for several" in standalone.stderr, standalone.stderr
    outside = hcclpy_run("--nnodes", "1", "--node_rank", "1", path)
    assert outside.returncode == 2 and "--node-rank 1 must be below --nnodes 1" in outside.stderr, outside.stderr


def test_help_documents_one_spelling_and_names_the_others():
    result = hcclpy_run("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "-n N, --nproc-per-node N" in text
    assert "--nproc_per_node N" not in text and "-np" not in text.replace("--nproc", ""), text
    assert "torchrun's underscore spellings are accepted too: --nproc_per_node, --node_rank, --master_addr, " \
           "--master_port" in text, text


def test_a_directory_runs_by_its_main_as_python_runs_it(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import os, sys; print('app', os.environ['RANK'], sys.argv[1:])\n")
    result = hcclpy_run("-n", "2", str(app), "--flag")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0] app 0 ['--flag']", "[1] app 1 ['--flag']"]


def test_program_that_cannot_start_exits_127(tmp_path):
    result = hcclpy_run("-n", "2", "--no-python", str(tmp_path / "no-such-program"))
    assert result.returncode == 127
    assert "cannot start rank 0" in result.stderr


def test_main_in_process(capsys, tmp_path):
    code = main(["run", "-n", "2", script(tmp_path, "import os\nprint('hello from', os.environ['RANK'])\n")])
    assert code == 0
    assert by_rank(capsys.readouterr().out) == {0: ["hello from 0"], 1: ["hello from 1"]}


# -------------------------------------------------------------------------------- endings

def test_failing_rank_stops_the_others_and_sets_the_exit_code(tmp_path):
    body = f"""
        import os, subprocess, sys, time
        rank = int(os.environ["RANK"])
        if rank == 1:
            time.sleep(0.5)
            sys.exit(3)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.path.join({str(tmp_path)!r}, f"pid.{{rank}}"), "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
    """
    start = time.monotonic()
    result = hcclpy_run("-n", "3", script(tmp_path, body))
    assert result.returncode == 3
    assert time.monotonic() - start < 30, "the other ranks were stopped, not waited for"
    assert "rank 1 exited with code 3; stopping the other 2 rank(s)" in result.stderr
    for rank in (0, 2):
        pids = [int(p) for p in (tmp_path / f"pid.{rank}").read_text().split()]
        # The rank and the process it started: SIGTERM goes to the rank's whole process group.
        assert ranks.wait_for(lambda pids=pids: not any(ranks.process_alive(pid) for pid in pids), 10), \
            f"rank {rank} left processes behind"


def test_rank_killed_by_a_signal_gives_128_plus_signal(tmp_path):
    body = """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """
    result = hcclpy_run("-n", "2", script(tmp_path, body))
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 0 was killed by SIGKILL" in result.stderr


@pytest.mark.slow
def test_rank_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    body = """
        import os, signal, sys, time
        if os.environ["RANK"] == "0":
            time.sleep(1)
            sys.exit(5)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    """
    start = time.monotonic()
    result = hcclpy_run("-n", "2", "--grace", "1", script(tmp_path, body))
    assert result.returncode == 5
    assert time.monotonic() - start < 20
    assert "sending SIGKILL" in result.stderr


@pytest.mark.slow
def test_timeout_stops_everything_with_124(tmp_path):
    body = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    start = time.monotonic()
    result = hcclpy_run("-n", "2", "--timeout", "2", script(tmp_path, body))
    assert result.returncode == 124
    assert time.monotonic() - start < 20
    assert "timed out after 2 s" in result.stderr
    assert by_rank(result.stdout) == {0: ["started"], 1: ["started"]}


def test_success_is_not_affected_by_timeout(tmp_path):
    result = hcclpy_run("-n", "2", "--timeout", "30", script(tmp_path, "print('done')\n"))
    assert result.returncode == 0 and by_rank(result.stdout) == {0: ["done"], 1: ["done"]}


SIGNAL_AWARE = """
    import os, signal, sys, time
    def stop(signum, frame):
        print("got", signal.Signals(signum).name, flush=True)
        sys.exit(0)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, stop)
    open(os.path.join({tmp!r}, "ready." + os.environ["RANK"]), "w").close()
    time.sleep(60)
"""


# SIGHUP (the terminal or SSH session closed) and SIGQUIT (Ctrl-\) too, as torchrun's agent does:
# left at their default, they would kill the launcher at once and orphan what the ranks started.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_signals_are_forwarded_to_every_rank(tmp_path, signum):
    launcher = start_run("-n", "3", script(tmp_path, SIGNAL_AWARE.format(tmp=str(tmp_path))))
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(3)])
        launcher.send_signal(signum)
        stdout, stderr = launcher.communicate(timeout=TIMEOUT)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    assert by_rank(stdout) == {r: [f"got {name}"] for r in range(3)}


def test_second_signal_kills_at_once(tmp_path):
    body = f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends these ranks
        open(os.path.join({str(tmp_path)!r}, "ready." + os.environ["RANK"]), "w").close()
        time.sleep(60)
    """
    launcher = start_run("-n", "2", "--grace", "50", script(tmp_path, body))
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        launcher.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        start = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=TIMEOUT)
        assert time.monotonic() - start < 20, "the second signal did not wait for the 50 s grace period"
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_ranks_die_with_a_killed_launcher(tmp_path):
    body = f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "ready." + os.environ["RANK"]), "w").write(str(os.getpid()))
        time.sleep(60)
    """
    launcher = start_run("-n", "2", script(tmp_path, body))
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        pids = [int((tmp_path / f"ready.{r}").read_text()) for r in range(2)]
        launcher.kill()  # SIGKILL: the launcher cannot forward anything
        launcher.communicate(timeout=TIMEOUT)
        assert ranks.wait_for(lambda: not any(ranks.process_alive(pid) for pid in pids), 10), \
            "ranks outlived the launcher"
    finally:
        launcher.kill()


# ------------------------------------------------- what the ranks start ends with the job

def helper_pids(stdout: str) -> List[int]:
    """The pids the ranks printed as ``helper PID``, in rank order."""
    return [int(line.split()[1]) for _, lines in sorted(by_rank(stdout).items()) for line in lines
            if line.startswith("helper ")]


def kill_leftovers(pids: Sequence[int], name: str) -> None:
    """SIGKILL those of ``pids`` still running ``name``: a failing test must not leave them behind."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as handle:
                if handle.read().strip() != name or not ranks.process_alive(pid):
                    continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def test_processes_started_by_ranks_that_succeed_are_stopped(tmp_path):
    body = """
        import subprocess
        helper = subprocess.Popen(["sleep", "777"])  # holds the rank's output pipes too
        print("helper", helper.pid)
    """
    pids: List[int] = []
    try:
        result = hcclpy_run("-n", "2", script(tmp_path, body))
        pids = helper_pids(result.stdout)
        assert result.returncode == 0, result.stderr
        assert len(pids) == 2, result.stdout
        assert [pid for pid in pids if ranks.process_alive(pid)] == [], "the ranks' helpers outlived the job"
    finally:
        kill_leftovers(pids, "sleep")


def test_processes_started_by_a_failed_rank_are_stopped(tmp_path):
    # Rank 0 fails once rank 1 runs: rank 1 is stopped as before, and rank 0's helper, whose rank
    # had already exited, with it.
    body = f"""
        import os, subprocess, sys, time
        helper = subprocess.Popen(["sleep", "777"])
        print("helper", helper.pid)
        ready = os.path.join({str(tmp_path)!r}, "ready.1")
        if os.environ["RANK"] == "1":
            open(ready, "w").close()
            time.sleep(60)
        for _ in range(600):
            if os.path.exists(ready):
                break
            time.sleep(0.05)
        sys.exit(3)
    """
    pids: List[int] = []
    try:
        result = hcclpy_run("-n", "2", script(tmp_path, body))
        pids = helper_pids(result.stdout)
        assert result.returncode == 3, result.stderr
        assert "rank 0 exited with code 3" in result.stderr
        assert len(pids) == 2, result.stdout
        assert [pid for pid in pids if ranks.process_alive(pid)] == [], "the ranks' helpers outlived the job"
    finally:
        kill_leftovers(pids, "sleep")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_processes_started_by_ranks_are_stopped_with_the_launcher(tmp_path, signum):
    # A signal to the launcher: rank 1 is running, rank 0 has exited, both helpers are stopped.
    body = f"""
        import os, subprocess, time
        rank = os.environ["RANK"]
        helper = subprocess.Popen(["sleep", "777"])
        print("helper", helper.pid)
        open(os.path.join({str(tmp_path)!r}, "ready." + rank), "w").close()
        if rank == "1":
            time.sleep(60)
    """
    launcher = start_run("-n", "2", script(tmp_path, body))
    pids: List[int] = []
    try:
        wait_for_files([tmp_path / f"ready.{r}" for r in range(2)])
        launcher.send_signal(signum)
        stdout, stderr = launcher.communicate(timeout=TIMEOUT)
        pids = helper_pids(stdout)
        assert launcher.returncode == 128 + signum, stderr
        assert len(pids) == 2, stdout
        assert [pid for pid in pids if ranks.process_alive(pid)] == [], "the ranks' helpers outlived the job"
    finally:
        launcher.kill()
        kill_leftovers(pids, "sleep")


def test_process_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    body = f"""
        import os, subprocess, sys, time
        ready = os.path.join({str(tmp_path)!r}, "ready")
        helper = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                   f"open({{ready!r}}, 'w').close(); time.sleep(777)"])
        for _ in range(600):
            if os.path.exists(ready):
                break
            time.sleep(0.05)
        print("helper", helper.pid)
    """
    pids: List[int] = []
    try:
        result = hcclpy_run("-n", "1", "--grace", "1", script(tmp_path, body))
        pids = helper_pids(result.stdout)
        assert result.returncode == 0, result.stderr
        assert "processes of rank(s) 0 still running after 1 s; sending SIGKILL" in result.stderr
        assert len(pids) == 1 and not ranks.process_alive(pids[0]), "the helper outlived the job"
    finally:
        kill_leftovers(pids, "python")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, on which every write fails")
@pytest.mark.parametrize("code", [0, 3])
def test_output_that_cannot_be_written_is_reported_once(tmp_path, code):
    # Every write to the launcher's stdout fails (ENOSPC). It says so once, on stderr, and goes on
    # reading the ranks' pipes: a rank writing more than a pipe holds would block otherwise (and the
    # subprocess timeout turn that into a failure). The exit status is the ranks'.
    body = f"""
        import sys
        for i in range(20000):
            print("line", i, "of output nobody sees")
        print("done", file=sys.stderr)
        sys.exit({code})
    """
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "2", script(tmp_path, body)],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    own = [line for line in result.stderr.splitlines() if line.startswith("hcclpy run: ")]
    assert [line for line in own if "cannot write" in line] == [
        "hcclpy run: cannot write the ranks' output to stdout (No space left on device); dropping it from now on"], \
        result.stderr
    if code == 0:  # stderr still carries the ranks' lines
        ranks_lines = "\n".join(line for line in result.stderr.splitlines() if line not in own)
        assert by_rank(ranks_lines) == {0: ["done"], 1: ["done"]}


@pytest.mark.parametrize("code", [0, 3])
def test_process_writing_without_end_does_not_hold_the_launcher(tmp_path, code):
    # `yes` keeps the rank's stdout pipe full: the launcher must neither drain it forever nor
    # leave it running. The subprocess timeout makes a hang a failure.
    pid_file = tmp_path / "yes.pid"
    body = f"""
        import subprocess, sys
        writer = subprocess.Popen(["yes"])
        open({str(pid_file)!r}, "w").write(str(writer.pid))
        sys.exit({code})
    """
    pids: List[int] = []
    try:
        result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "1", script(tmp_path, body)],
                                capture_output=True, timeout=TIMEOUT)
        pids = [int(pid_file.read_text())]
        assert result.returncode == code, result.stderr
        assert not ranks.process_alive(pids[0]), "the writer outlived the job"
    finally:
        kill_leftovers(pids, "yes")


def test_writer_outside_the_ranks_group_does_not_hold_the_launcher(tmp_path):
    # No signal of the launcher reaches a process in a session of its own: the bounded drain
    # lets the launcher return, and closing the pipe cuts the writer off.
    pid_file = tmp_path / "yes.pid"
    body = f"""
        import subprocess
        writer = subprocess.Popen(["yes"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(writer.pid))
    """
    pids: List[int] = []
    try:
        result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "1", script(tmp_path, body)],
                                capture_output=True, timeout=TIMEOUT)
        pids = [int(pid_file.read_text())]
        assert result.returncode == 0, result.stderr
    finally:
        kill_leftovers(pids, "yes")


# ------------------------------------------------------------------------- with hcclpy itself

EVERY_OPERATION = REPO / "tests" / "cli" / "every_operation.py"


def start_node(node: int, port: int, token: str, *args: str, connect_timeout: str = "") -> subprocess.Popen:
    """``hcclpy run -n 2 --nnodes 2 --node-rank NODE --master-port PORT ARGS`` on this machine, with
    ``token`` for the job's secret (HCCLPY_RENDEZVOUS_TOKEN) and without HCCLPY_SIM_SERVER: the node
    ranks alone make the simulated servers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HCCLPY_SIM_SERVER", "HCCLPY_SIM_NODE", "HCCLPY_RENDEZVOUS_PORT")}
    if connect_timeout:
        env["HCCL_CONNECT_TIMEOUT"] = connect_timeout
    return start_run("-n", "2", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                     "--master-port", str(port), "--timeout", str(TIMEOUT), *args,
                     env={**env, "HCCLPY_RENDEZVOUS_TOKEN": token})


def outcomes(nodes: Sequence[subprocess.Popen]) -> List[Tuple[int, str, str]]:
    """Each launcher's exit code, stdout and stderr once it ended (all are killed on the way out)."""
    try:
        output = [launcher.communicate(timeout=TIMEOUT + 30) for launcher in nodes]
        return [(launcher.returncode, stdout, stderr) for launcher, (stdout, stderr) in zip(nodes, output)]
    finally:
        for launcher in nodes:
            launcher.kill()


@pytest.mark.parametrize("nodes", [1, 2])
def test_every_operation_on_one_node_and_across_two(nodes):
    """Every kind of operation, on device buffers and NumPy arrays, against NumPy (every_operation.py).

    Two launchers make two simulated servers by their node ranks alone, and the results show it:
    ranks 0 and 2 (1 and 3) are both on device 0 (1), which one server refuses, and a float32 sum
    comes out as HCCL's hierarchical all-reduce adds on servers {0, 1} and {2, 3} (0), not in rank
    order as on one server (1, the job of one node of 4 ranks)."""
    if nodes == 1:
        result = hcclpy_run("-n", "4", str(EVERY_OPERATION))
        runs = [(result.returncode, result.stdout, result.stderr)]
    else:
        port = free_port()
        runs = outcomes([start_node(node, port, "the job's secret", str(EVERY_OPERATION)) for node in (0, 1)])
    order = 1 if nodes == 1 else 0
    for node, (code, stdout, stderr) in enumerate(runs):
        assert code == 0, f"node {node}:\n{stdout}\n{stderr}"
        lines = by_rank(stdout)
        local = 4 // nodes
        assert sorted(lines) == list(range(local * node, local * (node + 1)))
        for rank, text in lines.items():
            assert text == [f"rank {rank} of 4: device and NumPy operations OK, sum order {order}"], text


def errors_of(stderr: str, ranks: Sequence[int], error: str) -> List[str]:
    """The ``error`` lines (``module.Class: text``) that ranks ``ranks`` printed, without their prefix.
    A launcher stops a node's other ranks once one fails: at least one printed it."""
    said = [line.split("] ", 1)[1] for line in stderr.splitlines()
            if any(line.startswith(f"[{rank}] {error}: ") for rank in ranks)]
    assert said, stderr
    return said


def test_a_node_that_never_joins_is_named(tmp_path):
    # Node 1 is never started: within HCCL_CONNECT_TIMEOUT, node 0's ranks fail naming its ranks,
    # the node and how it is started.
    path = script(tmp_path, "import hcclpy\nhcclpy.init()\nprint('joined')\n")
    [(code, stdout, stderr)] = outcomes([start_node(0, free_port(), "the job's secret", path, connect_timeout="2")])
    assert code == 1 and "joined" not in stdout, stderr
    # (Rank 1, on a loaded machine, may start too late for rank 0's 2 s: then it is named too.)
    for said in errors_of(stderr, (0, 1), "hcclpy.errors.CommTimeoutError"):
        assert re.fullmatch(r"hcclpy\.errors\.CommTimeoutError: rank\(s\) \[(1, )?2, 3\] did not reach the rendezvous "
                            r"on 127\.0\.0\.1:\d+ within 2 s; (node 0 of 2 \(ranks 0-1\) lacks rank\(s\) \[1\]; )?"
                            r"node 1 of 2 \(ranks 2-3\) never joined: is its launcher running, with --node-rank 1, "
                            r"--nnodes 2 and the same --master-addr and --master-port\?", said), said


def test_a_node_with_another_job_token_is_refused(tmp_path):
    # The rendezvous admits only the job's members: node 1 has another secret. Its ranks are told
    # so and fail at once; node 0's say, at HCCL_CONNECT_TIMEOUT, that it refused them, and why.
    path = script(tmp_path, "import hcclpy\nhcclpy.init()\nprint('joined')\n")
    port = free_port()
    with socket.create_server(("127.0.0.1", next_port(port))) as rendezvous:  # where rank 0 will listen
        node1 = start_node(1, port, "another secret", path, connect_timeout="2")
        try:
            # Node 0 starts once node 1's ranks knock (they retry meanwhile): its 2 s run after they came.
            rendezvous.settimeout(TIMEOUT)
            rendezvous.accept()[0].close()
        except BaseException:
            node1.kill()
            raise
    node0 = start_node(0, port, "the job's secret", path, connect_timeout="2")
    (code0, stdout0, stderr0), (code1, stdout1, stderr1) = outcomes([node0, node1])
    assert code0 == code1 == 1 and "joined" not in stdout0 + stdout1, stderr0 + stderr1
    for said in errors_of(stderr1, (2, 3), "hcclpy.rendezvous.RendezvousError"):
        assert re.match(r"hcclpy\.rendezvous\.RendezvousError: rank 0's rendezvous at 127\.0\.0\.1:\d+ refused "
                        r"rank [23]: wrong job token", said), said
    # Node 1's launcher may stop its second rank before it asked: one refusal at least.
    for said in errors_of(stderr0, (0, 1), "hcclpy.errors.CommTimeoutError"):
        assert re.match(r"hcclpy\.errors\.CommTimeoutError: rank\(s\) \[[123, ]+\] did not .*; it refused "
                        r"(rank 2|rank 3|ranks 2, 3) \(from 127\.0\.0\.1\): wrong job token", said), said


STUCK_IN_A_COLLECTIVE = """
import time
import numpy as np
import hcclpy

comm = hcclpy.init()
stream = comm.device.create_stream()
x = hcclpy.from_numpy(np.ones(4, np.float32), device=comm.device)
comm.all_reduce(x, stream=stream)
stream.synchronize()
if comm.rank == 1:
    print("stuck", flush=True)
    time.sleep(600)  # stuck outside hcclpy
comm.all_reduce(x, stream=stream)
print("stuck", flush=True)
stream.synchronize()  # rank 0 waits here, for a peer that never comes
"""


def assert_both_dumped_and_rank_1_behind(traces: Path) -> None:
    """Both ranks of STUCK_IN_A_COLLECTIVE dumped, and the merge of the dumps names rank 1."""
    assert len(list(traces.glob("hcclpy-trace-*[0-9].json"))) == 2, sorted(traces.iterdir())
    merged = subprocess.run([sys.executable, "-m", "hcclpy", "trace", "merge", str(traces)], capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert "behind: rank(s) 1 issued fewer collectives (1) than the others (2)" in merged.stdout, merged.stdout


@pytest.mark.slow
def test_a_job_stopped_at_its_timeout_leaves_the_ranks_dumps(tmp_path):
    # With HCCLPY_TRACE_DIR set, the launcher asks every rank for its flight recorder before it
    # stops them; the merge then says who is behind. Before, a job killed this way left nothing.
    traces = tmp_path / "traces"
    env = {**os.environ, "HCCLPY_TRACE_DIR": str(traces), "HCCL_EXEC_TIMEOUT": "600"}
    result = hcclpy_run("-n", "2", "--timeout", "5", script(tmp_path, STUCK_IN_A_COLLECTIVE), env=env)
    assert result.returncode == 124, result.stderr
    assert_both_dumped_and_rank_1_behind(traces)


def test_a_job_stopped_by_sigterm_leaves_the_ranks_dumps(tmp_path):
    # torchrun, srun and mpirun stop a job with SIGTERM. With HCCLPY_TRACE_DIR set, each rank dumps
    # (rank 0 while it waits for a collective), then ends by SIGTERM as it would have without hcclpy.
    traces = tmp_path / "traces"
    path = script(tmp_path, STUCK_IN_A_COLLECTIVE)
    env = {key: value for key, value in os.environ.items()
           if key not in FOREIGN_RANK_VARIABLES and key != "HCCLPY_DUMP_PIPE"}
    env.update(HCCLPY_TRACE_DIR=str(traces), HCCL_EXEC_TIMEOUT="600", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    job = [subprocess.Popen([sys.executable, path], env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        for rank in job:
            assert rank.stdout.readline() == "stuck\n", rank.stderr.read() if rank.poll() is not None else ""
        time.sleep(0.3)  # rank 0 is in its wait
        for rank in job:
            rank.send_signal(signal.SIGTERM)
        codes = [rank.wait(TIMEOUT) for rank in job]
    finally:
        for rank in job:
            rank.kill()
    assert codes == [-signal.SIGTERM] * 2, [rank.stderr.read() for rank in job]
    assert_both_dumped_and_rank_1_behind(traces)


def test_the_sigterm_dump_leaves_a_program_s_own_handler_and_forked_children_alone(tmp_path):
    traces = tmp_path / "traces"
    program = """
    import os, signal, sys
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))  # the program's own handler, set first
    import hcclpy
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        import hcclpy.trace
        hcclpy.trace._dump_on_sigterm()  # installed in the child...
        pid = os.fork()  # ...whose own child inherits it
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        os._exit(100 + os.waitstatus_to_exitcode(status))
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    """
    done = subprocess.run([sys.executable, script(tmp_path, program)], capture_output=True, text=True,
                          env=dict(os.environ, HCCLPY_TRACE_DIR=str(traces)), timeout=TIMEOUT)
    # The program's handler ran (exit 7); the forked grandchild ended by SIGTERM without dumping.
    assert (done.returncode, done.stdout) == (7, f"{100 - signal.SIGTERM}\n"), done.stderr
    assert not traces.exists() or not list(traces.iterdir())


def test_a_process_without_the_launchers_pipe_serves_no_dumps(monkeypatch):
    import threading

    import hcclpy.trace

    monkeypatch.setenv("HCCLPY_TRACE_DIR", "/nonexistent")
    other = os.open(os.devnull, os.O_RDONLY)
    try:
        for value in ("0:1", "bad", f"{other}:0", "999999:5"):  # other files, garbage, no such descriptor
            monkeypatch.setenv(hcclpy._environment.DUMP_PIPE_VARIABLE, value)
            hcclpy.trace._serve_dump_requests()
    finally:
        os.close(other)
    assert not [t for t in threading.enumerate() if t.name == "hcclpy-dump-on-stop"]
