"""``hcclpy bench``: every operation runs on several ranks with checked results, the table follows
nccl-tests, JSON / CSV / plot files are written, wrong results are counted, and a run that stops
early (a signal, a timeout, a rank gone) reports the rows it measured."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hcclpy
import hcclpy.cli
import ranks
from hcclpy._units import format_bytes, parse_bytes
from hcclpy.bench import report
from hcclpy.bench.cases import OPERATIONS, granularity, make_case, rounded_sizes
from hcclpy.bench.measure import Result, Row, iterations, sizes
from hcclpy.cli import bench as bench_cli
from hcclpy.rendezvous import free_port
from hcclpy.types import DataType, ReduceOp

TIMEOUT = 120
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HCCLPY_LAUNCHER")


def bench_in(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``hcclpy bench ARGS`` with ``env`` added to an environment without any launcher's variables."""
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    return subprocess.run([sys.executable, "-m", "hcclpy", "bench", *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=TIMEOUT)


def bench(*args: str) -> subprocess.CompletedProcess:
    return bench_in({}, *args)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.slow
def test_every_operation_on_three_ranks(operation: str, tmp_path: Any) -> None:
    out = tmp_path / "result.json"
    result = bench(operation, "-g", "3", "-e", "96K", "-f", "16", "-n", "5", "-d", "bfp16", "-o", "max",
                   "-r", "2", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    _, reduces, rooted, whole = OPERATIONS[operation]
    assert report["nranks"] == 3 and report["type"] == "bfp16"
    assert report["redop"] == ("max" if reduces else "none") and report["root"] == (2 if rooted else -1)
    factor = 4 / 3 if operation == "all_reduce" else 1 if operation in ("reduce", "broadcast", "send_recv") else 2 / 3
    # Without -b the first size is 8 bytes, or the smallest the operation has (a 16-byte block per rank)
    assert report["rows"][0]["size"] == (48 if whole else 8) and report["complete"] and report["stopped"] is None
    for row in report["rows"]:
        assert row["iters"] == 5
        # nccl-tests' columns: the count is each rank's (for gathers and scatters its block, aligned
        # down to 16 bytes), the size the whole buffer
        assert row["size"] == row["count"] * 2 * (3 if whole else 1)
        assert not whole or row["count"] * 2 % 16 == 0
        for placement in ("out_of_place", "in_place"):
            cell = row[placement]
            if cell is None:
                assert operation in ("all_to_all", "send_recv") or operation.endswith(("_v", "_vc"))
                assert placement == "in_place"
                continue
            assert cell["wrong"] == 0 and cell["time_us"] > 0
            assert cell["busbw"] == pytest.approx(cell["algbw"] * factor)
    assert "# Out of bounds values : 0 OK" in result.stdout and "# Avg bus bandwidth" in result.stdout


@pytest.mark.slow
def test_table_csv_and_plot(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    table, plot = tmp_path / "r.csv", tmp_path / "r.png"
    result = bench("all_reduce", "-g", "2", "-e", "4K", "-f", "8", "-n", "3", "--csv", str(table), "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert [int(line.split()[0]) for line in lines] == [8, 64, 512, 4096]
    assert lines[0].split()[2:5] == ["fp32", "sum", "-1"]
    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["placement"] for r in rows} == {"out-of-place", "in-place"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("launcher", [pytest.param("torchrun", marks=pytest.mark.torch),
                                      pytest.param("mpiexec", marks=pytest.mark.mpi)])
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.slow
def test_under_another_launcher(launcher: str, tmp_path: Any) -> None:
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    command = ranks.launcher(launcher, 2)
    result = subprocess.run([*command, "-m", "hcclpy", "bench", "reduce", "-e", "1K", "-f", "8", "-n", "3", "-r", "1",
                             "--json", str(out)], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["nranks"] == 2 and report["root"] == 1 and len(report["rows"]) == 3
    assert all(row["out_of_place"]["wrong"] == 0 for row in report["rows"])
    assert result.stdout.count("# Out of bounds values : 0 OK") == 1  # rank 0 alone prints the table


def test_one_rank_without_a_launcher() -> None:
    result = bench("broadcast", "-e", "64", "-n", "2")
    assert result.returncode == 0, result.stderr
    assert "1 ranks" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["all_reduce", "-b", "1X"], "'1X' is not a whole number of bytes"),
    (["all_reduce", "-e", "0.1K"], "'0.1K' is not a whole number of bytes"),
    (["all_reduce", "-b", "64", "-e", "8"], "empty"),
    (["broadcast", "-r", "3"], "root must be a rank"),
    (["all_reduce", "-g", "0"], "argument -g/--ranks: must be >= 1, got 0"),
    # Values argparse would call only "invalid int value": what is allowed is said
    (["all_reduce", "-g", "abc"], "argument -g/--ranks: must be a whole number >= 1, got 'abc'"),
    (["all_reduce", "-c", "yes"], "argument -c/--check: must be one of 0, 1, got 'yes'"),
    (["all_reduce", "-c", "2"], "argument -c/--check: must be one of 0, 1, got 2"),
    (["all_reduce", "-a", "7"], "argument -a/--average: must be one of 0, 1, 2, 3, got 7"),
    (["all_reduce", "-f", "abc"], "argument -f/--stepfactor: must be a number, got 'abc'"),
    (["gather"], "invalid choice"),
    (["all_reduce", "-n", "x"], "must be a whole number >= 0, got 'x'"),
    # With -g the ranks are not started at all: no rank fails, no launcher message.
    (["all_reduce", "-g", "2", "-b", "64", "-e", "8"], "empty"),
    (["broadcast", "-g", "2", "-r", "2"], "root must be a rank (0..1)"),
    (["scatter", "-g", "2", "-r", "5"], "-r 5: the root must be a rank (0..1)"),
    # A factor that is not a finite number of at least 1 (1: step by -i, as nccl-tests)
    (["all_reduce", "-f", "inf"], "-f inf: the factor between sizes must be a finite number above 1"),
    (["all_reduce", "-f", "nan"], "-f nan: the factor between sizes must be a finite number above 1"),
    (["all_reduce", "-f", "-2", "-i", "8"], "-f -2: the factor"),
    (["all_reduce", "-f", "0.5", "-i", "8"], "-f 0.5: the factor"),
    (["all_reduce", "-g", "2", "-f", "0"], "-f 0: the factor"),
    (["all_reduce", "-f", "1"], "-f 1: without a factor, sizes step by -i, which is missing"),
    (["all_reduce", "-i", "0"], "-i 0: the step between sizes must be positive"),
    # A factor and a step: one of them would be ignored
    (["all_reduce", "-f", "2", "-i", "8"], "-f 2 -i 8: give a factor (-f) or a step (-i), not both (-f 1 -i 8 steps"),
    (["all_reduce", "-g", "2", "-f", "1.5", "-i", "1K"], "-f 1.5 -i 1024: give a factor (-f) or a step (-i)"),
    # Output files that could not be written, refused before the benchmark rather than after it
    (["all_reduce", "--json", "/nonexistent/x.json"],
     "--json /nonexistent/x.json: cannot write it: the directory /nonexistent does not exist"),
    (["all_reduce", "-g", "2", "--csv", "/nonexistent/dir/x.csv"],
     "--csv /nonexistent/dir/x.csv: cannot write it: the directory /nonexistent/dir does not exist"),
    (["all_reduce", "--json", "/"], "--json /: cannot write it: / is a directory, not a file"),
    # Once tracebacks from hcclpy.init, HCCL, aclrtMalloc or the ranks, or a table of 0-byte rows
    (["all_reduce", "--timeout", "inf"], "argument --timeout: must be a positive, finite number of seconds, got inf"),
    (["all_reduce", "-g", "2", "--timeout", "nan"], "--timeout: must be a positive, finite number of seconds"),
    (["send_recv", "-b", "8", "-e", "8"], "send_recv needs at least 2 ranks (each sends to the next one), this job "
     "has 1: pass -g 2 or more"),
    (["send_recv", "-g", "1", "-b", "8", "-e", "8"], "send_recv needs at least 2 ranks"),
    (["all_reduce", "-g", "9", "-b", "8", "-e", "8"], "-g 9: 8 device(s) are visible here, and each rank needs its own"),
    # A -b every size below which rounds down to 0 bytes: one element, or a 16-byte block per rank
    (["all_reduce", "-b", "1", "-e", "1"], "-b 1: below all_reduce's smallest size, 4 bytes (one fp32 element); sizes "
     "are rounded down to a multiple of it (as in nccl-tests), so -b 1 would give 0-byte rows; pass -b 4 or more"),
    (["all_gather", "-b", "7", "-e", "8K", "-d", "fp64"], "-b 7: below all_gather's smallest size on 1 rank, 16 bytes"),
    (["all_gather", "-g", "3", "-b", "8"], "-b 8: below all_gather's smallest size on 3 ranks, 48 bytes (a 16-byte "
     "block per rank)"),
    (["all_to_all_v", "-g", "2", "-b", "31", "-d", "int8"], "pass -b 32 or more"),
    (["reduce_scatter", "-g", "4", "-e", "32"], "-e 32: below reduce_scatter's smallest size on 4 ranks, 64 bytes "
     "(a 16-byte block per rank), so every size would be 0 bytes; pass -e 64 or more (or -b 0 -e 0 for empty calls)"),
    (["all_reduce", "-b", "8G", "-e", "8G", "-n", "1", "-w", "0"],
     "-e: the largest size, 8 GiB, needs 16 GiB of device memory per rank (a send and a receive buffer), but 8 GiB "
     "of 8 GiB is free"),
])
@pytest.mark.slow
def test_bad_arguments(args: List[str], message: str) -> None:
    result = bench(*args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "exited" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout  # nothing was measured


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "environment variable RANK='0' is set but WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "x"}, "environment variable WORLD_SIZE='x' is not an integer"),
])
def test_a_launcher_environment_that_says_no_rank_is_a_usage_error(env: Dict[str, str], message: str) -> None:
    result = bench_in(env, "all_reduce", "-e", "8")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_run_stopped_at_start_up_still_writes_its_footer_and_files(tmp_path: Path) -> None:
    # Rank 0 of 2 whose rank 1 never comes: the wait at start-up passes --timeout.
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = bench_in(env, "all_reduce", "-e", "64", "--timeout", "1", "--json", str(out_json), "--csv", str(out_csv))
    assert result.returncode == 124, result.stderr
    assert "# Incomplete: timed out at all_reduce, starting (--timeout 1 s)" in result.stdout, result.stdout
    written = json.loads(out_json.read_text())
    assert (written["complete"], written["nranks"], written["rows"]) == (False, 2, []), written
    assert written["stopped"].startswith("timed out at all_reduce, starting"), written
    assert out_csv.read_text().startswith("operation,nranks,size"), out_csv.read_text()


def test_ranks_asked_for_under_a_launcher_are_said_to_be_ignored() -> None:
    result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "2", "--timeout", str(TIMEOUT), "-m",
                             "hcclpy", "bench", "all_reduce", "-b", "8", "-e", "8", "-n", "2", "-g", "4"],
                            capture_output=True, text=True, timeout=TIMEOUT + 30,
                            env={k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES})
    assert result.returncode == 0, result.stderr
    assert "[0] hcclpy bench: -g 4 is ignored: this job's launcher started 2 rank(s)" in result.stdout + result.stderr
    assert "2 ranks" in result.stdout


def test_a_plot_path_in_the_way_is_named(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "d.png").mkdir()
    with pytest.raises(ValueError, match=f"^{tmp_path}/d.png is a directory, not a file$"):
        report.check_plot(str(tmp_path / "d"))  # the plot goes to d.png


@pytest.mark.parametrize("ranks", [[], ["-g", "2"]])
def test_a_plot_matplotlib_cannot_write_is_refused_before_the_benchmark(ranks: List[str], tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "out.txt"
    result = bench("all_reduce", *ranks, "-b", "8", "-e", "8", "-n", "2", "--plot", str(plot))
    assert result.returncode == 2, result.stderr
    assert f"--plot {plot}: cannot write it: matplotlib cannot write .txt files" in result.stderr, result.stderr
    assert ".png" in result.stderr and "Traceback" not in result.stderr and result.stdout == ""
    assert not plot.exists()


def test_output_checks(tmp_path: Any) -> None:
    report.check_output(str(tmp_path / "new.json"))  # a new file in an existing directory
    with pytest.raises(ValueError, match="does not exist"):
        report.check_output(str(tmp_path / "missing" / "x.csv"))
    with pytest.raises(ValueError, match="is a directory"):
        report.check_output(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # checking creates nothing
    if _has_matplotlib():
        report.check_plot(str(tmp_path / "plot.svg"))
        report.check_plot(str(tmp_path / "plot"))  # matplotlib writes plot.png
        with pytest.raises(ValueError, match=r"cannot write \.csv files"):
            report.check_plot(str(tmp_path / "plot.csv"))
        with pytest.raises(ValueError, match="does not exist"):
            report.check_plot(str(tmp_path / "missing" / "plot.png"))


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@pytest.mark.parametrize("ranks", [[], ["-g", "2"]])
@pytest.mark.timeout(TIMEOUT + 30)
def test_root_is_ignored_by_operations_without_one(ranks: List[str]) -> None:
    # As nccl-tests: -r applies to reduce, broadcast and scatter; the table shows root -1 for the others.
    result = bench("all_reduce", *ranks, "-r", "3", "-b", "8", "-e", "8", "-n", "2", "-w", "1")
    assert result.returncode == 0, result.stderr
    row = [line for line in result.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(row) == 1 and row[0].split()[4] == "-1", result.stdout


@given(number=st.integers(0, 1 << 40), unit=st.sampled_from(["", "B", "K", "kb", "KiB", "M", "m", "MiB", "G", "GB"]))
def test_sizes_are_read_as_the_cli_the_benchmarks_and_the_environment_take_them(number: int, unit: str) -> None:
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit.upper().rstrip("IB")]
    assert parse_bytes(f"{number}{unit}") == number * scale
    if scale > 1:  # a fraction, where the bytes come out whole
        assert parse_bytes(f"{number}.5{unit}") == number * scale + scale // 2


@given(nbytes=st.integers(0, 1 << 42) | st.integers(0, 42).map(lambda power: 1 << power))
def test_sizes_are_written_in_the_largest_whole_unit_and_read_back(nbytes: int) -> None:
    unit_bytes = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    text = format_bytes(nbytes)
    assert parse_bytes(text) == nbytes
    number, unit = text.split(" ")
    assert int(number) * unit_bytes[unit] == nbytes
    larger = [size for size in unit_bytes.values() if size > unit_bytes[unit]]
    assert all(nbytes < size or nbytes % size for size in larger), text


@pytest.mark.parametrize("text", ["", "K", "-1", "-1K", "1e3", "0.1K", "1.5", "nanM", "infG", "2X", "2iB", "1 K B"])
def test_what_is_not_a_whole_number_of_bytes_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a whole number of bytes"):
        parse_bytes(text)


def test_wrong_results_are_counted() -> None:
    # A case whose operation never ran: every output element is wrong.
    with hcclpy.Communicator(1, hcclpy.RootInfo.generate(device=0), 0, device=0) as comm:
        case = make_case("all_reduce", comm, 64, DataType.FP32, ReduceOp.SUM, 0)
        case.fill(in_place=False)
        from hcclpy.bench.cases import _pattern

        assert case.wrong(in_place=False) == 16 - int(np.count_nonzero(_pattern(0, 16, ReduceOp.SUM, 1) == 0))
        case.close()


@pytest.mark.parametrize("nranks", [2, 3, 5, 8])
def test_the_check_patterns_tell_apart_what_they_must(nranks: int) -> None:
    from hcclpy.bench.cases import _combine, _pattern

    count = 1000
    moved = [_pattern(r, count, None, nranks) for r in range(nranks)]
    # Data that only moves differs between any two ranks at every position: an all-to-all that
    # moved nothing is caught whatever the block size.
    assert all((moved[r] != moved[j]).all() for r in range(nranks) for j in range(r))
    inputs = [_pattern(r, count, ReduceOp.PROD, nranks) for r in range(nranks)]
    product = _combine(inputs, ReduceOp.PROD)
    assert (product != _combine(inputs, ReduceOp.MAX)).all() and (product != _combine(inputs, ReduceOp.MIN)).all()
    assert (product != _combine(inputs, ReduceOp.SUM)).mean() >= 0.45  # where the first contributes 3: about half
    assert product.max() <= 127 and max(m.max() for m in moved) <= 127  # exact in int8


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
@pytest.mark.parametrize("op", [None, *ReduceOp], ids=lambda op: getattr(op, "name", "moved"))
def test_a_block_in_the_wrong_place_is_caught_whatever_the_block_size(nranks: int, op: Any) -> None:
    # A reduce_scatter or all_to_all that delivers another block than the rank's own must leave
    # wrong elements, at every block size: patterns that repeated every 5, 11 or 120 // n
    # elements passed such a result whenever blocks were a multiple of that.
    from hcclpy.bench.cases import _combine, _pattern

    count = 1 << 18
    if op is None:
        values = _pattern(1, count, None, nranks)
    else:
        values = _combine([_pattern(r, count, op, nranks) for r in range(nranks)], op)
    blocks = [*range(8, 700), 5 * 4096, 11 * 4096, 60 * 1024, 1 << 16, 120 * 1000]
    caught = {block: float(np.mean(values[:block] != values[block:2 * block])) for block in blocks}
    assert min(caught.values()) > 0.15, min(caught.items(), key=lambda item: item[1])


def _in_place_gather_starts_clean(rank: int, size: int, info: bytes) -> List[float]:
    with hcclpy.Communicator(size, info, rank, device=rank) as comm:
        case = make_case("all_gather", comm, 64 * size, DataType.FP32, ReduceOp.SUM, 0)
        case.recv.copy_from(np.full(case.recv.size, 9.0, np.float32))  # a result left by the call before
        case.fill(in_place=True)
        others = np.delete(case.recv.to_numpy(), np.s_[rank * case.block:(rank + 1) * case.block])
        case.close()
        return sorted(set(others.tolist()))


def test_the_in_place_all_gather_check_does_not_see_the_call_before() -> None:
    assert ranks.run_threads(_in_place_gather_starts_clean, 2, timeout=60) == [[0.0], [0.0]]


def test_sizes_and_iterations() -> None:
    assert sizes(8, 64) == sizes(8, 64, 2) == [8, 16, 32, 64]  # neither -f nor -i: a factor of 2
    assert sizes(0, 3, 1, 1) == sizes(0, 3, step=1) == [0, 1, 2, 3]
    assert iterations(8, 0) == 1000 and iterations(64 << 20, 0) == 20 and iterations(8, 7) == 7
    with pytest.raises(ValueError, match="without a factor, sizes step by -i, which is missing"):
        sizes(8, 64, 1)
    with pytest.raises(ValueError, match="-f 2 -i 8: give a factor"):
        sizes(8, 64, 2, 8)


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), float("-inf"), 0.0, 0.5, -2.0])
def test_a_factor_that_is_not_a_finite_number_of_at_least_1_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match=f"-f {factor:g}: the factor between sizes must be a finite number"):
        sizes(8, 64, factor, 8)  # a step does not save it: only a factor of 1 steps by -i


def test_sizes_with_large_and_fractional_factors() -> None:
    assert sizes(8, 1 << 40, 1e308) == [8]  # 8e308 is inf: the next size is past the end, not an error
    assert sizes(43, 64, 1.5) == [43, 64]  # 64.5 truncates to 64, still in range
    assert sizes(8, 12, 1.1) == [8, 9, 10, 11, 12]  # a size the factor does not grow grows by one byte
    assert sizes(8, 30, 1, 7) == [8, 15, 22, 29]


@pytest.mark.parametrize("given, shown", [("bfloat16", "bfp16"), ("half", "fp16"), ("Float", "fp32"),
                                          ("double", "fp64"), ("int8", "int8")])
def test_nccl_tests_type_names_work_too(given: str, shown: str) -> None:
    result = bench("all_reduce", "-d", given, "-b", "8", "-e", "8", "-n", "2", "-w", "1")
    assert result.returncode == 0, result.stderr
    row = [line for line in result.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert row and row[0].split()[2] == shown, result.stdout


def test_hccl_test_table_follows_the_nccl_tests_one() -> None:
    result = bench("all_reduce", "-b", "8", "-e", "32", "-f", "2", "-n", "3", "-w", "1", "--hccl-test")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:")
    assert lines[start - 1].startswith("the minbytes is 8, maxbytes is 32, iters is 3, warmup_iters is 1")
    rows = [line.split("|") for line in lines[start + 1:]]
    assert [int(r[0]) for r in rows] == [8, 16, 32] and all(r[3].strip() == "success" for r in rows), lines
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)


# ------------------------------------------------------------------------------- signals, -g N

def _descendants(pid: int) -> List[int]:
    """The running processes under ``pid`` (children, grandchildren...), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return [child for child in found if ranks.process_alive(child)]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()


def _measuring_ranks(pids: List[int]) -> List[int]:
    """Those of ``pids`` that run ``hcclpy bench`` and have loaded HCCL (they are in hcclpy.init or
    past it, not starting up)."""
    return [pid for pid in pids if "bench" in _cmdline(pid) and "libhccl" in _read(f"/proc/{pid}/maps")]


def _start_long_bench(tmp_path: Path) -> Tuple[subprocess.Popen, List[int]]:
    """``hcclpy bench -g 2`` with calls enough for hours (results in ``tmp_path/r.json``), once both
    ranks measure; with the pids of the launcher it started and of the ranks."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "hcclpy", "bench", "all_reduce", "-g", "2", "-b", "8", "-e", "8",
                                 "-n", "50000000", "--json", str(tmp_path / "r.json")], stdout=out, stderr=err, env=env,
                                start_new_session=True)
    ok = ranks.wait_for(lambda: len(_measuring_ranks(_descendants(proc.pid))) == 2 or proc.poll() is not None,
                        60)
    pids = _descendants(proc.pid)
    if not ok or proc.poll() is not None:
        _kill(proc, pids)
        pytest.fail(f"the ranks did not start: {(tmp_path / 'err').read_text()}")
    return proc, pids


def _kill(proc: subprocess.Popen, pids: List[int]) -> None:
    """SIGKILL what a test left running: bench and the processes found under it (if still ours)."""
    proc.kill()
    proc.wait(timeout=TIMEOUT)
    for pid in pids:
        if ranks.process_alive(pid) and "hcclpy" in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.slow
def test_a_signal_stops_the_ranks_of_g(signum: int, tmp_path: Path) -> None:
    proc, pids = _start_long_bench(tmp_path)
    try:
        assert len(pids) == 3, pids  # the inner hcclpy run and its two ranks
        # Rank 0 prints the table's header once it measures, before any row is done
        header_shown = ranks.wait_for(lambda: "(elements)" in (tmp_path / "out").read_text(), 60)
        assert header_shown, (tmp_path / "err").read_text()
        proc.send_signal(signum)
        proc.wait(timeout=TIMEOUT)
        assert proc.returncode == 128 + signum, (tmp_path / "err").read_text()
        assert ranks.wait_for(lambda: not any(ranks.process_alive(pid) for pid in pids), 30), \
            f"left running: {[_cmdline(pid) for pid in pids if ranks.process_alive(pid)]}"
        assert "Traceback" not in (tmp_path / "err").read_text(), (tmp_path / "err").read_text()
        # On the signal, rank 0 printed the footer of the rows measured (none) and wrote the JSON
        name = signal.Signals(signum).name
        out = (tmp_path / "out").read_text()
        assert out.startswith("# hcclpy bench all_reduce: 2 ranks"), out
        # (where exactly depends on when the signal lands: setting up, or the first size)
        assert re.search(rf"^# Incomplete: stopped by {name} at all_reduce[^;]*; 0 size\(s\) measured$", out, re.M), out
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["complete"] is False and report["stopped"].startswith(f"stopped by {name}")
        assert report["rows"] == []
    finally:
        _kill(proc, pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
@pytest.mark.timeout(TIMEOUT + 30)
def test_the_ranks_of_g_die_with_a_killed_bench(tmp_path: Path) -> None:
    proc, pids = _start_long_bench(tmp_path)
    try:
        proc.kill()  # SIGKILL: bench cannot forward anything
        proc.wait(timeout=TIMEOUT)
        assert ranks.wait_for(lambda: not any(ranks.process_alive(pid) for pid in pids), 30), \
            f"left running: {[_cmdline(pid) for pid in pids if ranks.process_alive(pid)]}"
    finally:
        _kill(proc, pids)


def test_a_launcher_that_ignores_the_signal_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait after a signal is bounded: a launcher still running then is killed.
    monkeypatch.setattr(bench_cli, "_STOP_WAIT", 0.5)
    ready = tmp_path / "ready"
    relaunch = bench_cli._Relaunch()
    ignores_sigterm = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                       f"open({str(ready)!r}, 'w').close(); time.sleep(120)")
    relaunch.start([sys.executable, "-c", ignores_sigterm])
    try:
        assert ranks.wait_for(ready.exists, 60), "the launcher did not start"
        relaunch.on_signal(signal.SIGTERM, None)
        assert relaunch.wait() == 128 + signal.SIGTERM
        assert relaunch.proc.returncode == -signal.SIGKILL
    finally:
        relaunch.proc.kill()
        relaunch.proc.wait(timeout=TIMEOUT)


@pytest.mark.timeout(TIMEOUT + 30)
def test_sizes_beyond_the_device_memory_of_several_ranks_are_refused_before_measuring() -> None:
    """Every rank learns the smallest free memory, so all of them stop (none waits for the others)."""
    result = bench("all_reduce", "-g", "2", "-b", "5G", "-e", "5G", "-n", "1", "-w", "0")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "-e: the largest size, 5 GiB, needs 10 GiB of device memory per rank" in result.stderr, result.stderr
    assert "AclError" not in result.stderr and "# " not in result.stdout


def test_zero_bytes_are_still_allowed_as_nccl_tests_does() -> None:
    result = bench("all_reduce", "-b", "0", "-e", "0", "-n", "1", "-w", "0")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert [row[:2] for row in rows] == [["0", "0"]], result.stdout


# ------------------------------------------------------------------- runs that stop early

# hcclpy bench that stalls from the second size on (the first, 8 bytes, is 2 fp32 elements) on
# rank STALL_RANK: in its all_reduce, or with STALL_IN=exchange in the exchange of the times that
# follows (the first two after the memory check are the first size's). It sleeps there, as a hung
# rank would, or with STALL=exit leaves the job, as a lost one would.
STALLING_BENCH = """
import itertools, os, sys, time
import hcclpy.bench.cases as cases
import hcclpy.bench.measure as measure
from hcclpy.cli import main
def stall(comm, past):
    if past and comm.rank == int(os.environ["STALL_RANK"]):
        if os.environ["STALL"] == "exit":
            os._exit(0)
        time.sleep(3600)
real_all_reduce, real_gather, exchanges = cases.all_reduce, measure.gather_values, itertools.count()
def all_reduce(comm, send, recv, op, stream=None):
    stall(comm, os.environ.get("STALL_IN") != "exchange" and send.size > 2)
    return real_all_reduce(comm, send, recv, op, stream=stream)
def gather_values(comm, values, stream, timeout):
    stall(comm, os.environ.get("STALL_IN") == "exchange" and next(exchanges) > 2)
    return real_gather(comm, values, stream, timeout)
cases.all_reduce, measure.gather_values = all_reduce, gather_values
sys.exit(main(["bench", *sys.argv[1:]]))
"""


def _stalling_bench(tmp_path: Path, stall: str, rank: int, where: str = "operation") -> Tuple[str, Dict[str, str]]:
    """The script of :data:`STALLING_BENCH` (bench's arguments follow it), and its environment."""
    script = tmp_path / "stalling_bench.py"
    script.write_text(STALLING_BENCH)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(STALL=stall, STALL_RANK=str(rank), STALL_IN=where)
    return str(script), env


def _rows(stdout: str) -> List[List[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.timeout(TIMEOUT + 30)
def test_rows_are_printed_as_measured_and_saved_when_interrupted(tmp_path: Path) -> None:
    script, env = _stalling_bench(tmp_path, "sleep", 0)
    outputs = {"json": tmp_path / "r.json", "csv": tmp_path / "r.csv"}
    if _has_matplotlib():
        outputs["plot"] = tmp_path / "r.png"
    options = [item for option, path in outputs.items() for item in (f"--{option}", str(path))]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen([sys.executable, script, "all_reduce", "-b", "8", "-e", "64", "-n", "2", "-w", "0",
                                 *options], stdout=out, stderr=err, env=env)
    try:
        # The first row shows while the second size is still being measured
        assert ranks.wait_for(lambda: len(_rows((tmp_path / "out").read_text())) == 1, 60), \
            (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert "Traceback" not in err and "hcclpy bench: stopped by SIGINT at all_reduce of 16 B, out of place" in err, err
    assert [row[0] for row in _rows(out)] == ["8"]
    assert "# Out of bounds values : 0 OK" in out and "# Incomplete: stopped by SIGINT" in out, out
    report = json.loads(outputs["json"].read_text())
    assert report["complete"] is False and "SIGINT" in report["stopped"] and len(report["rows"]) == 1
    with open(outputs["csv"]) as f:
        assert [row["size"] for row in csv.DictReader(f)] == ["8", "8"]
    if "plot" in outputs:
        assert outputs["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("stall, where, status, message", [
    ("sleep", "operation", 124, "hcclpy bench: rank 0: timed out at all_reduce of 16 B, out of place (--timeout 3 s): "),
    ("exit", "operation", 3, "hcclpy bench: rank 0: failed at all_reduce of 16 B, out of place: AclRemoteError: "),
    # The exchange of the times after the calls is bounded by --timeout too, not HCCL_EXEC_TIMEOUT.
    ("sleep", "exchange", 124, "hcclpy bench: rank 0: timed out at all_reduce of 16 B, out of place (--timeout 3 s): "),
])
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.slow
def test_a_wait_past_the_timeout_or_a_rank_gone_ends_in_one_line_and_keeps_the_rows(
        stall: str, where: str, status: int, message: str, tmp_path: Path) -> None:
    script, env = _stalling_bench(tmp_path, stall, 1, where)
    out = tmp_path / "r.json"
    result = subprocess.run([sys.executable, "-m", "hcclpy", "run", "-n", "2", "--no-prefix", script, "all_reduce",
                             "-b", "8", "-e", "64", "-n", "2", "-w", "0", "--timeout", "3", "--json", str(out)],
                            capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert result.returncode == status, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert [row[0] for row in _rows(result.stdout)] == ["8"], result.stdout
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["stopped"].startswith(message.split("rank 0: ")[1])
    assert [row["size"] for row in report["rows"]] == [8]


def test_the_ranks_of_g_have_no_time_limit_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # --timeout bounds each wait of the ranks; a cap on the launcher would kill a long run that works.
    started: List[List[str]] = []
    monkeypatch.setattr(bench_cli._Relaunch, "start", lambda self, command: started.append(command))
    monkeypatch.setattr(bench_cli._Relaunch, "wait", lambda self: 0)
    monkeypatch.setattr(bench_cli, "_check_devices", lambda args: None)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert hcclpy.cli.main(["bench", "all_reduce", "-g", "2", "--timeout", "5"]) == 0
    [command] = started
    launcher = command[:command.index("-m", command.index("run"))]
    assert "--timeout" not in launcher, command
    assert command[-2:] == ["--timeout", "5"]  # the ranks' own


def test_unchecked_results_are_not_called_right(tmp_path: Path) -> None:
    # As nccl-tests: with -c 0 #wrong is N/A (JSON null, CSV empty), and the footer claims nothing.
    result = bench("reduce", "-c", "0", "-b", "8", "-e", "16", "-n", "2", "-w", "0", "--json", str(tmp_path / "r.json"),
                   "--csv", str(tmp_path / "r.csv"))
    assert result.returncode == 0, result.stderr
    assert [(row[8], row[12]) for row in _rows(result.stdout)] == [("N/A", "N/A")] * 2, result.stdout
    assert "# Out of bounds values : N/A (not checked: -c 0)" in result.stdout and " OK" not in result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert [row[p]["wrong"] for row in report["rows"] for p in ("out_of_place", "in_place")] == [None] * 4
    with open(tmp_path / "r.csv") as f:
        assert [row["wrong"] for row in csv.DictReader(f)] == [""] * 4


def test_a_step_without_a_factor_steps_by_it() -> None:
    # As nccl-tests: -f is off unless given, so -i alone steps by its size.
    result = bench("all_reduce", "-b", "8", "-e", "40", "-i", "8", "-n", "1", "-w", "0")
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in _rows(result.stdout)] == ["8", "16", "24", "32", "40"], result.stdout
    assert sizes(8, 40, step=8) == sizes(8, 40, 1, 8) == [8, 16, 24, 32, 40]


@pytest.mark.parametrize("args, shown", [
    (["-b", "4", "-e", "64", "-f", "1.5"], ["4", "8", "12", "16", "28", "40", "60"]),  # 4, 6 -> 4, 4
    (["-b", "0", "-e", "32"], ["0", "4", "8", "16", "32"]),  # 0, 1, 2 -> 0, 0, 0
    (["-e", "5"], ["4"]),  # without -b the first size is 8 bytes, or -e when smaller
])
def test_sizes_that_round_to_the_same_are_measured_once(args: List[str], shown: List[str]) -> None:
    result = bench("all_reduce", *args, "-n", "1", "-w", "0")
    assert result.returncode == 0, result.stderr
    assert [row[0] for row in _rows(result.stdout)] == shown, result.stdout


def test_rounding_follows_each_operations_granularity() -> None:
    assert granularity("all_reduce", DataType.FP16, 4) == 2 and granularity("all_gather", DataType.INT8, 3) == 48
    assert rounded_sizes([0, 16, 48, 64, 100, 144], "all_gather", DataType.FP32, 3) == [0, 48, 96, 144]
    assert rounded_sizes([4, 6, 9], "reduce", DataType.FP64, 3) == [0, 8]


def test_automatic_iteration_counts_are_recorded(tmp_path: Path) -> None:
    result = bench("all_reduce", "-b", "8", "-e", "16", "-w", "0", "--hccl-test", "--json", str(tmp_path / "r.json"),
                   "--csv", str(tmp_path / "r.csv"))
    assert result.returncode == 0, result.stderr
    assert [row["iters"] for row in json.loads((tmp_path / "r.json").read_text())["rows"]] == [1000, 1000]
    with open(tmp_path / "r.csv") as f:
        assert [row["iters"] for row in csv.DictReader(f)] == ["1000"] * 4
    assert "iters is 1000, warmup_iters is 0" in result.stdout, result.stdout
    # Counts that differ by size are given as a range, first size to last
    rows = [Row(8, 2, 1000, Result(1.0, 1.0, 1.0, 0), None), Row(64 << 20, 1 << 24, 20, Result(1.0, 1.0, 1.0, 0), None)]
    out = io.StringIO()
    report.hccl_test_table(rows, {"iters": "auto", "warmup": 5, "check": True}, out)
    assert "iters is auto (1000 to 20 by size), warmup_iters is 5" in out.getvalue()


def test_a_plot_leaves_out_points_at_or_below_zero(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    meta = {"operation": "all_reduce", "nranks": 1, "type": "fp32", "backend": "sim"}
    zero = Row(0, 0, 2, Result(1.5, 0.0, 0.0, 0), Result(1.2, 0.0, 0.0, 0))
    some = Row(64, 16, 2, Result(2.0, 0.03, 0.0, 0), Result(2.5, 0.02, 0.0, 0))  # one rank: busbw 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log axes of values at or below 0 warn, and draw nothing
        for rows, name in (([zero], "none.png"), ([zero, some], "some.png")):
            report.write_plot(rows, meta, str(tmp_path / name))
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_times_of_seconds_keep_the_columns_aligned() -> None:
    meta = {"type": "fp32", "redop": "sum", "root": -1}
    lines = []
    for time_us in (1.5, 9999.99, 10000.0, 123456789.0):
        out = io.StringIO()
        report.print_row(Row(8, 2, 1, Result(time_us, 1.0, 1.0, 0), Result(time_us, 1.0, 1.0, 0)), meta, out)
        lines.append(out.getvalue().rstrip("\n"))
    assert len({len(line) for line in lines}) == 1, lines
    assert lines[2].split()[5] == "10000" and lines[3].split()[5] == "123456789"  # no decimals from 10 ms on


def test_broadcast_counts_its_one_call_once() -> None:
    # HCCL broadcasts in place: both columns time that call, and the average counts it once.
    rows = [Row(8, 2, 1, Result(1.0, 3.0, 3.0, 0), Result(1.0, 1.0, 1.0, 0))]
    assert report.average_busbw(rows, "broadcast") == 1.0 and report.average_busbw(rows, "reduce") == 2.0
    meta = {"operation": "broadcast", "nranks": 2, "backend": "sim", "warmup": 1, "iters": 1, "check": True,
            "average": "mean over ranks"}
    out = io.StringIO()
    report.header(meta, out)
    assert "# broadcast: HCCL has no out-of-place form, so both columns time the in-place call (counted once in " \
           "the average)" in out.getvalue()


def _plot_rows(byte_sizes: List[int]) -> List[Row]:
    return [Row(size, size // 4, 2, Result(2.0 + size / 1e4, size / 2e3, size / 1e3, 0),
                Result(2.5 + size / 1e4, size / 3e3, size / 2e3, 0)) for size in byte_sizes]


@pytest.mark.parametrize("byte_sizes", [
    [8 << k for k in range(28)],                   # 8 B to 1 GiB, every power of two
    [8 * 8 ** k for k in range(9)],                # -f 8: 8 B to 128 MiB
    list(range(1024, 20 * 1024 + 1, 1024)),        # -i 1K: 1 KiB to 20 KiB
    [48 * 2 ** k for k in range(21)],              # 16-byte blocks of 3 ranks: 48 B to 48 MiB
    list(range(1000, 1901, 100)),                  # inside one octave
], ids=["powers-of-two", "factor-8", "steps", "three-ranks", "one-octave"])
def test_the_plot_s_size_axis_is_log_2_in_byte_units_ending_at_the_largest_size(byte_sizes: List[int]) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    meta = {"operation": "all_reduce", "nranks": 2, "type": "fp32", "backend": "sim"}
    figure = report.plot_figure(_plot_rows(byte_sizes), meta)
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for axes in figure.axes:
            assert axes.get_xscale() == "log" and axes.xaxis.get_transform().base == 2
            assert axes.get_xlim() == (min(byte_sizes), max(byte_sizes)), "no empty stretch past the sizes"
            ticks = [t for t in axes.get_xticks() if min(byte_sizes) <= t <= max(byte_sizes)]
            labels = [label for label in axes.get_xticklabels() if label.get_text()]
            assert len(labels) >= 2
            assert [label.get_text() for label in labels] == [format_bytes(int(t)) for t in ticks]
            if max(byte_sizes) >= 2 * min(byte_sizes) * 2:  # two powers of two inside: ticks at them
                assert all(int(t) & (int(t) - 1) == 0 for t in ticks), ticks
                assert all(re.fullmatch(r"\d+ (B|KiB|MiB|GiB)", label.get_text()) for label in labels)
                if max(byte_sizes) & (max(byte_sizes) - 1) == 0:
                    assert labels[-1].get_text() == format_bytes(max(byte_sizes)), "the largest size is labelled"
            boxes = [label.get_window_extent(renderer) for label in labels]
            for left, right in zip(boxes, boxes[1:]):
                assert left.x1 < right.x0, f"labels overlap: {[label.get_text() for label in labels]}"
    finally:
        plt.close(figure)


def test_size_ticks_thin_the_labels_at_round_units() -> None:
    labels = [format_bytes(int(t)) for t in report.size_ticks([8, 1 << 30])[0]]
    assert labels == ["8 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB"]
    major, minor = report.size_ticks([1 << 10, 1 << 14])
    assert [format_bytes(int(t)) for t in major] == ["1 KiB", "2 KiB", "4 KiB", "8 KiB", "16 KiB"] and minor == []
    major, minor = report.size_ticks([8, 128 << 20])
    assert len(major) <= 6 and sorted(major + minor) == [float(1 << k) for k in range(3, 28)]
