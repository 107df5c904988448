#!/usr/bin/env python3
"""Build the hcclpy simulator, compile ``sim_allreduce.c`` against it and run it.

Every argument this script does not know is passed to the benchmark, so the nccl-tests /
hccl_test flags work as they do on the binary::

    python benchmarks/run_sim_allreduce.py                      # 2 ranks, 8 B .. 64 MiB, fp32 sum
    python benchmarks/run_sim_allreduce.py -p 4 -d bfp16 -e 16M
    python benchmarks/run_sim_allreduce.py --markdown --repeat 3

``--markdown`` also prints each table as Markdown (and, with ``--repeat`` > 1, a table of the
per-size medians over the runs), ready to paste into ``benchmarks/README.md``. Before and after,
the script prints whether the two vCPUs ran as two cores or as hyperthreads of one
(``machine.py``): large sizes take up to twice as long on one.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "sim_allreduce.c"
# Run from a checkout without installing: the repository root holds the hcclpy package.
sys.path.insert(0, str(HERE.parent))

import machine  # noqa: E402  (a sibling module)
from hcclpy._units import format_bytes  # noqa: E402  (8 B, 4 KiB, 64 MiB)

COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "wrong", "e2e", "iters")


def compile_benchmark(tree: Path, outdir: Path, cc: Sequence[str]) -> Path:
    """Compile the benchmark against the simulator tree and return the executable's path."""
    exe = outdir / "sim_allreduce"
    lib64 = tree / "lib64"
    command = [
        *cc, "-O2", "-Wall", f"-I{tree / 'include'}", str(SOURCE), "-o", str(exe),
        f"-L{lib64}", "-lhccl", "-lascendcl", f"-Wl,-rpath,{lib64}",
    ]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0 or done.stdout.strip():
        print(f"$ {shlex.join(command)}\n{done.stdout}", file=sys.stderr, end="")
    if done.returncode != 0:
        raise SystemExit(f"compiling {SOURCE.name} failed (exit status {done.returncode})")
    return exe


def run_once(exe: Path, args: Sequence[str], env: Dict[str, str], timeout: float) -> tuple[int, List[str]]:
    """Run the benchmark, echo its output as it comes, return (exit status, stdout lines)."""
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            env=env, text=True, bufsize=1, start_new_session=True)
    timed_out = threading.Event()

    def kill() -> None:  # the benchmark has its own -T; this is the last resort
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines: List[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
    except KeyboardInterrupt:
        kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    if timed_out.is_set():
        print(f"run_sim_allreduce: killed the benchmark after {timeout:.0f} s", file=sys.stderr)
    return rc, lines


def parse_table(lines: Sequence[str]) -> tuple[List[Dict[str, str]], List[str]]:
    """Split the benchmark output into table rows and the '# ...' summary lines after it."""
    rows: List[Dict[str, str]] = []
    summary: List[str] = []
    for line in lines:
        if line.startswith("#"):
            text = line.lstrip("# ").rstrip()
            if "memcpy reference" in text:
                if not rows:  # the header line, with the range; the footer repeats the median
                    summary.insert(0, text)
            elif rows:
                summary.append(text)
            continue
        fields = line.split()
        if len(fields) >= len(COLUMNS) and fields[0].isdigit():
            rows.append(dict(zip(COLUMNS, fields)))
    return rows, [s for s in summary if s]


def markdown(rows: Sequence[Dict[str, str]]) -> str:
    """Return the rows as a Markdown table."""
    out = [
        "| size | count | type | redop | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong | e2e (us) | iters |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {format_bytes(int(r['size']))} | {r['count']} | {r['type']} | {r['redop']} | {r['time']} "
            f"| {r['algbw']} | {r['busbw']} | {r['wrong']} | {r['e2e']} | {r['iters']} |"
        )
    return "\n".join(out)


def median_rows(runs: Sequence[Sequence[Dict[str, str]]]) -> List[Dict[str, str]]:
    """Per size, the median time/bandwidth/e2e over runs (wrong: the maximum)."""
    by_size: Dict[str, List[Dict[str, str]]] = {}
    for rows in runs:
        for r in rows:
            by_size.setdefault(r["size"], []).append(r)
    merged = []
    for size in sorted(by_size, key=int):
        group = by_size[size]
        m = dict(group[0])
        for key in ("time", "algbw", "busbw", "e2e"):
            m[key] = f"{statistics.median(float(g[key]) for g in group):.2f}"
        wrongs = [g["wrong"] for g in group]
        m["wrong"] = "N/A" if "N/A" in wrongs else str(max(int(w) for w in wrongs))
        merged.append(m)
    return merged


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="All other arguments go to the benchmark (-b -e -f -n -w -d -o -p -c -T -v); "
        "put them after '--' if they clash with the options above.",
        allow_abbrev=False,
    )
    parser.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="run the sweep N times")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"),
                        help="C compiler for the benchmark (default: $CC or cc)")
    parser.add_argument("--timeout", type=float, default=1200.0, metavar="S",
                        help="kill a run after S seconds (default 1200)")
    opts, bench_args = parser.parse_known_args(argv)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")

    import hcclpy.sim as sim

    tree = Path(sim.build())
    env = {**os.environ, **sim.env()}
    print(f"# simulator tree: {tree}", flush=True)
    print(f"# before: {machine.copying().describe()}", flush=True)

    runs: List[List[Dict[str, str]]] = []
    summaries: List[List[str]] = []
    status = 0
    with tempfile.TemporaryDirectory(prefix="hcclpy-bench-") as tmp:
        exe = compile_benchmark(tree, Path(tmp), shlex.split(opts.cc))
        for k in range(opts.repeat):
            if opts.repeat > 1:
                print(f"# ---- run {k + 1} of {opts.repeat}", flush=True)
            rc, lines = run_once(exe, bench_args, env, opts.timeout)
            if rc != 0:
                print(f"run_sim_allreduce: the benchmark exited with status {rc}", file=sys.stderr)
                status = status or rc
            rows, summary = parse_table(lines)
            runs.append(rows)
            summaries.append(summary)
    print(f"# after: {machine.copying().describe()}", flush=True)

    if opts.markdown:
        for k, (rows, summary) in enumerate(zip(runs, summaries)):
            if not rows:
                continue
            print(f"\n### run {k + 1}\n" if opts.repeat > 1 else "")
            print(markdown(rows))
            if summary:
                print()
                for s in summary:
                    print(f"- {s}")
        if opts.repeat > 1 and all(runs):
            print(f"\n### median of {opts.repeat} runs\n")
            print(markdown(median_rows(runs)))
    return status


if __name__ == "__main__":
    sys.exit(main())
