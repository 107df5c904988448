"""Shared fixtures: the simulator's install tree, its environment, a C/C++ compiler against it, and
the rank matrix (the same test over threads and processes of 1 to 4 ranks)."""

from __future__ import annotations

import compileall
import os
from pathlib import Path
from typing import Callable, Sequence, Union

import pytest

import hcclpy.sim
import ranks
from hcclpy.sim._build import find_compiler, run_compiler

PathLike = Union[str, "os.PathLike[str]"]


# Processes of 3 and 4 ranks take seconds each: the full run has them, the quick run the rest.
_MATRIX = [pytest.param(ranks.RankMatrix(mode, size), id=f"{mode}-{size}",
                        marks=pytest.mark.slow if mode == "processes" and size > 2 else ())
           for mode in ranks.MODES for size in (1, 2, 3, 4)]


@pytest.fixture(params=_MATRIX)
def rank_matrix(request: pytest.FixtureRequest) -> ranks.RankMatrix:
    """Runs a test's ranks over the matrix mpi4py's suite uses for communicators: threads and
    processes, 1, 2, 3 and 4 ranks (``rank_matrix.run(fn, *args)``, ``.mode``, ``.size``)."""
    return request.param


@pytest.fixture(scope="session")
def sim_home() -> Path:
    """The simulator's install tree, built once per session (a cache hit after the first run)."""
    return hcclpy.sim.build()


@pytest.fixture(scope="session")
def sim_env(sim_home: Path) -> dict[str, str]:
    """A copy of ``os.environ`` pointing a process at the simulator (for ``subprocess`` calls)."""
    return {**os.environ, **hcclpy.sim.env()}


@pytest.fixture(scope="session")
def compile_c(sim_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return ``compile_c(sources, output_name, *, cplusplus=False, extra_flags=())``.

    It compiles C (or C++) test programs against the simulator's headers and libraries with
    ``-O2 -Wall -Wextra -Werror`` (optimised: the programs check every element of large outputs,
    which unoptimised was most of the simulator tests' time) into a per-session directory and
    returns the binary's path; the binary finds the libraries through its rpath. ``extra_flags``
    go before the sources, so options such as ``-std=c++14`` or ``-x c++`` apply to them. A failed
    compile raises :class:`hcclpy.sim.SimulatorBuildError` carrying the compiler's command and
    output.
    """
    outdir = tmp_path_factory.mktemp("cbin")

    def compile_c(
        sources: Union[PathLike, Sequence[PathLike]],
        output_name: str,
        *,
        cplusplus: bool = False,
        extra_flags: Sequence[str] = (),
    ) -> Path:
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        compiler = find_compiler("CXX", ("c++", "g++")) if cplusplus else find_compiler()
        binary = outdir / output_name
        lib64 = sim_home / "lib64"
        command = [
            *compiler, "-O2", "-Wall", "-Wextra", "-Werror", f"-I{sim_home / 'include'}", *extra_flags,
            *(os.fspath(source) for source in sources), "-o", str(binary),
            f"-L{lib64}", "-lhccl", "-lascendcl", f"-Wl,-rpath,{lib64}", "-pthread",
        ]
        run_compiler(command, what=f"compiling test program {output_name} failed")
        return binary

    return compile_c


def pytest_configure(config: pytest.Config) -> None:
    # Hundreds of tests start Python processes that import hcclpy (ranks, launchers, examples).
    # Where PYTHONDONTWRITEBYTECODE is set (as on CI's machines) no import leaves its bytecode
    # behind, and every one of those processes compiled hcclpy's sources again (~0.15 s each).
    # The bytecode is written once here, by the run's first process (not by xdist's workers),
    # and read by every process after it: Python reads bytecode whatever that variable says.
    if not hasattr(config, "workerinput"):
        tests = Path(__file__).parent
        for tree in (Path(hcclpy.__file__).parent, tests):
            compileall.compile_dir(tree, quiet=1)


# Folders whose every test carries a marker (the others mark test by test).
_FOLDER_MARKERS = {"docs": "docs", "torch_backend": "torch"}


# The files that take longest in the full run (minutes each on 2 cores) run first: a parallel run
# (CI's, one worker per core, a file to a worker) hands files out in this order, and a long file
# handed out last would leave the other workers idle while it runs.
_LONGEST_FIRST = ("simulator/test_sim_collectives.py", "torch_backend/test_torch_conformance.py", "docs/test_docs.py",
                  "operations/test_servers.py", "benchmarks/test_benchmark_scripts.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        folder = Path(item.path).relative_to(tests).parts[0]
        if folder in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[folder])
    rank = {name: index for index, name in enumerate(_LONGEST_FIRST)}
    # (a stable sort: the tests of a file keep their order, and the other files theirs)
    items.sort(key=lambda item: rank.get(Path(item.path).relative_to(tests).as_posix(), len(rank)))
