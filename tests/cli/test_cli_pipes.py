"""Every ``hcclpy`` command piped into ``head -1`` ends quietly: no BrokenPipeError traceback, and
the exit status a program killed by SIGPIPE gives (141), from one handler in ``hcclpy.cli.main``.

The pipe is a real shell pipe. So that the command always meets a reader that has gone (rather
than racing ``head``), the shell first writes a line for ``head`` to take and keeps writing until
a write fails: only then does it start the command.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import pytest

from hcclpy.cli import EXIT_BROKEN_PIPE, main

TIMEOUT = 120

# $@ is the command. SIGPIPE is ignored so that the shell's own writes fail instead of killing it
# (Python ignores SIGPIPE anyway).
PIPE_INTO_HEAD = """
trap '' PIPE
{
    echo first
    while echo more 2>/dev/null; do sleep 0.01; done
    "$@"
    echo "exit status $?" >&2
} | head -n 1
"""


def piped_into_head(*args: str, unbuffered: bool = False, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``python -m hcclpy ARGS | head -n 1`` in ``sh``, hcclpy starting once ``head`` has left."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(["sh", "-c", PIPE_INTO_HEAD, "sh", sys.executable, "-m", "hcclpy", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=TIMEOUT)


def assert_quiet(result: subprocess.CompletedProcess, status: int = EXIT_BROKEN_PIPE) -> None:
    assert result.stdout == "first\n", result.stdout
    for noise in ("Traceback", "BrokenPipeError", "Broken pipe", "Exception ignored"):
        assert noise not in result.stderr, result.stderr
    assert f"exit status {status}\n" in result.stderr, result.stderr


def write_dumps(directory: Path, ranks: int = 2, records: int = 400) -> None:
    """Flight-recorder dumps of ``ranks`` processes (as hcclpy.trace.dump writes them)."""
    for rank in range(ranks):
        items = [{"comm": f"c{seq % 40}", "rank": rank, "size": ranks, "seq": seq, "op": "all_reduce", "count": 8,
                  "dtype": "fp32", "state": "completed", "stream": 1, "queued_ns": seq, "completed_by_ns": None}
                 for seq in range(1, records + 1)]
        data = {"host": "h", "pid": 100 + rank, "rank": rank, "dumped_ns": 1, "records": items}
        (directory / f"rank{rank}.json").write_text(json.dumps(data))


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["info", "--json"], ["info"], ["sim", "env"], ["sim", "path"]],
                         ids=["info-json", "info", "sim-env", "sim-path"])
@pytest.mark.slow
def test_reports_piped_into_head_end_quietly(args: List[str], unbuffered: bool) -> None:
    assert_quiet(piped_into_head(*args, unbuffered=unbuffered))


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_trace_merge_piped_into_head_ends_quietly(tmp_path: Path, unbuffered: bool) -> None:
    write_dumps(tmp_path)
    assert_quiet(piped_into_head("trace", "merge", str(tmp_path), unbuffered=unbuffered))
    assert (tmp_path / "merged.chrome.json").exists(), "the merged trace is written before the report"


def test_bench_piped_into_head_ends_quietly() -> None:
    assert_quiet(piped_into_head("bench", "all_reduce", "-b", "8", "-e", "64K", "-n", "2", "-w", "1"))


def test_bench_of_two_ranks_piped_into_head_ends_without_a_traceback() -> None:
    # Rank 0 writes the table straight to the pipe; it leaves with 141, and the launcher with it.
    assert_quiet(piped_into_head("bench", "all_reduce", "-g", "2", "-b", "8", "-e", "64K", "-n", "2", "-w", "1"))


def test_help_piped_into_head_ends_quietly() -> None:
    # argparse's help is written whole or not at all; either way nothing is reported.
    result = piped_into_head("run", "--help")
    assert result.stdout == "first\n"
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


def test_run_piped_into_head_keeps_its_ranks_running(tmp_path: Path) -> None:
    # The launcher itself drops what the ranks print once its reader is gone (see hcclpy.cli.run).
    done = tmp_path / "done"
    rank = tmp_path / "rank.py"
    rank.write_text(textwrap.dedent(f"""
        import os
        for i in range(1000):
            print("line", i)
        open({str(done)!r} + os.environ["RANK"], "w").close()
    """))
    assert_quiet(piped_into_head("run", "-n", "2", str(rank)), status=0)
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()


def test_main_returns_141_when_its_reader_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # In process: a stdout whose reader went away, with no descriptor to point at /dev/null.
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["sim", "env"]) == EXIT_BROKEN_PIPE == 141


def test_other_errors_are_not_turned_into_141(monkeypatch: pytest.MonkeyPatch) -> None:
    # main turns only BrokenPipeError into 141: a subcommand's other errors still reach the caller.
    def fail(args: object) -> int:
        raise RuntimeError("not a pipe")

    from hcclpy.cli import build_parser

    parser = build_parser()
    monkeypatch.setattr("hcclpy.cli.build_parser", lambda: _with_handler(parser, fail))
    with pytest.raises(RuntimeError, match="not a pipe"):
        main(["sim", "env"])


def _with_handler(parser, handler):  # type: ignore[no-untyped-def]
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            action.choices["sim"].set_defaults(handler=handler)
    return parser

