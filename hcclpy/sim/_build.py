"""Compile the simulator's C sources into a cached directory laid out like a CANN install.

A finished tree is ``<cache>/sim-<hash>``, where the hash covers the sources, the headers, the
compiler and the flags, so a change to any of them gives a new tree and an old tree is never
patched in place. A tree is built in a temporary sibling directory and renamed into place once
complete; ``BUILD_INFO.json`` is written last, so its presence means the tree is usable.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .. import __version__, _environment
from .._progress import Progress

# The directory holding ``src/`` and ``include/``. Private and module-level so that a test can
# point the build at a copy of the sources; users have no reason to change it.
_SIM_DIR: Path = Path(__file__).resolve().parent

CFLAGS: tuple[str, ...] = (
    "-O2", "-g", "-fPIC", "-pthread", "-std=gnu11", "-D_GNU_SOURCE", "-fvisibility=hidden",
    "-Wall", "-Wextra", "-Wno-unused-parameter",
)
# Split around the object files: the linker resolves libraries left to right.
# --no-undefined: a symbol missing from the simulator fails its build, not the first program linked to it.
LDFLAGS: tuple[str, ...] = ("-shared", "-pthread", "-Wl,--no-undefined")
LDLIBS: tuple[str, ...] = ("-lrt", "-lm")

# Bump when the steps below or the tree layout change: the hash only sees sources and flags, and
# a tree laid out by an older hcclpy must not be mistaken for a current one.
_LAYOUT_VERSION = 2  # 2: lib64/libhcomm.so

_MARKER = "BUILD_INFO.json"
_LOG = "BUILD_LOG.txt"
_COMPILE_TIMEOUT = 600.0  # seconds, per compiler run
_LOCK_TIMEOUT = 1800.0  # seconds spent waiting for another process's build of the same tree
_EXPECTED_SECONDS = 10  # a build on the 2-core machines CI runs on (6-7 s idle, more under load)


class SimulatorBuildError(RuntimeError):
    """The simulator could not be compiled.

    Parameters
    ----------
    message : str
        What failed.
    command : sequence of str, optional
        The compiler command that failed, if any.
    output : str, optional
        Everything that command printed.

    Attributes
    ----------
    command : list of str
        As given.
    output : str
        As given.
    """

    def __init__(self, message: str, *, command: Sequence[str] = (), output: str = "") -> None:
        self.command = list(command)
        self.output = output
        text = message
        if self.command:
            text += f"\n  command: {shlex.join(self.command)}"
        if output.strip():
            text += "\n" + output.rstrip()
        super().__init__(text)


def _hccl_link_args(lib64: Path) -> list[str]:
    # $ORIGIN is for the dynamic loader, not a shell: no shell runs these commands.
    return [f"-L{lib64}", "-lascendcl", "-Wl,-rpath,$ORIGIN"]


# (directory under src/, library name, extra link arguments), in link order.
_LIBRARIES: tuple[tuple[str, str, Callable[[Path], list[str]]], ...] = (
    ("acl", "ascendcl", lambda lib64: []),
    ("hccl", "hccl", _hccl_link_args),
)
# CANN 9.x renamed the runtime library and moved communicator management into libhcomm.so (on
# which libhccl.so depends); programs linked against, or opening, any of these names must load.
_ALIASES: dict[str, str] = {"libacl_rt.so": "libascendcl.so", "libhcomm.so": "libhccl.so"}


def build(*, force: bool = False) -> Path:
    """Compile the simulator if needed and return its install tree.

    Safe to call from many processes at once: one of them builds, the others wait for it and
    return the same tree.

    Parameters
    ----------
    force : bool, optional
        Rebuild even if a finished tree exists, and replace it.

    Returns
    -------
    pathlib.Path
        The tree: ``lib64/``, ``include/``, ``set_env.sh``, ``BUILD_INFO.json``, ``BUILD_LOG.txt``.

    Raises
    ------
    SimulatorBuildError
        No compiler was found, a compile or link failed (the error carries the command and
        the compiler output), or the cache directory cannot be created or written (the error
        names it and the variable it came from).
    TimeoutError
        Another process held the build lock for too long.

    Examples
    --------
    >>> import hcclpy.sim
    >>> tree = hcclpy.sim.build()
    >>> (tree / "lib64" / "libhccl.so").exists()
    True
    """
    sim_dir = _SIM_DIR
    compiler = find_compiler()
    digest, compiler_id = _fingerprint(sim_dir, tuple(compiler))
    root = _cache_root()
    tree = root / f"sim-{digest}"
    if not force and _is_complete(tree):
        return tree
    # A finished tree in a read-only cache is fine (above); building needs to write there.
    with _cache_errors(root):
        root.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(root / f"sim-{digest}.lock"):
            # Another process may have finished the tree while this one waited for the lock.
            if not force and _is_complete(tree):
                return tree
            # Holding the lock, no one else is building this hash: these were left by a crash.
            for leftover in root.glob(f".sim-{digest}.*"):
                shutil.rmtree(leftover, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=f".sim-{digest}.tmp-", dir=root))
            # Said by the one process that builds (the others of the job wait on the lock), so
            # that a first run does not look hung.
            print("hcclpy: compiling the CPU simulator, once for this hcclpy version and compiler (about "
                  f"{_EXPECTED_SECONDS} s on 2 cores)...", file=sys.stderr, flush=True)
            started = time.monotonic()
            try:
                os.chmod(staging, 0o755)
                _build_tree(staging, tree, sim_dir, compiler, compiler_id, digest)
                _move_into_place(staging, tree, root / f".sim-{digest}.old-{os.getpid()}")
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            print(f"hcclpy: simulator built in {time.monotonic() - started:.0f} s, cached in {tree} "
                  "(hcclpy sim build builds it ahead of time)", file=sys.stderr, flush=True)
    return tree


def home() -> Path:
    """Return the simulator's install tree, building it first if needed.

    Returns
    -------
    pathlib.Path
        The tree; the same path as :func:`build` returns.

    Raises
    ------
    SimulatorBuildError
        The tree was missing and could not be built.

    Examples
    --------
    >>> import hcclpy.sim
    >>> (hcclpy.sim.home() / "set_env.sh").is_file()
    True
    """
    return build()


def env() -> dict[str, str]:
    """Return the environment variables that point a C build or a process at the simulator.

    They are those a CANN ``set_env.sh`` sets for the libraries and headers: ``ASCEND_HOME_PATH``
    and ``ASCEND_TOOLKIT_HOME`` name the tree, and ``LD_LIBRARY_PATH`` is the current value
    with ``<tree>/lib64`` in front. The tree is built first if needed.

    Returns
    -------
    dict of str to str
        The variables, to merge into an environment.

    Raises
    ------
    SimulatorBuildError
        The tree was missing and could not be built.

    Examples
    --------
    >>> import os, subprocess, hcclpy.sim
    >>> subprocess.run(["./my_hccl_program"], env={**os.environ, **hcclpy.sim.env()})  # doctest: +SKIP
    """
    tree = home()
    lib64 = str(tree / "lib64")
    current = _environment.library_path()
    return {
        "ASCEND_HOME_PATH": str(tree),
        "ASCEND_TOOLKIT_HOME": str(tree),
        "LD_LIBRARY_PATH": f"{lib64}:{current}" if current else lib64,
    }


def sh_quote(value: str) -> str:
    """Quote ``value`` for a POSIX shell, always in single quotes."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def find_compiler(variable: str = "CC", names: Sequence[str] = ("cc", "gcc")) -> list[str]:
    """Return the compiler command: ``$variable`` split like a shell would, else the first of
    ``names`` on PATH. Raise SimulatorBuildError when there is none."""
    explicit = _environment.compiler(variable)
    if explicit:
        return explicit
    for name in names:
        if shutil.which(name):
            return [name]
    raise SimulatorBuildError(f"no compiler found: install {' or '.join(names)}, or set {variable}")


def _cache_root() -> Path:
    return _cache_root_and_origin()[0]


def _cache_root_and_origin() -> tuple[Path, str]:
    """The cache directory, and where that choice came from (for error messages)."""
    return _environment.sim_cache()


@contextlib.contextmanager
def _cache_errors(root: Path) -> Iterator[None]:
    """Turn a failure to create or write the cache into a SimulatorBuildError that names the
    directory and the variable that chose it: a bare ``FileNotFoundError: '/proc/nope'`` from deep
    inside the build does not tell the user which setting to change."""
    try:
        yield
    except TimeoutError:
        raise  # the lock wait: its message already says what happened
    except OSError as exc:
        _, origin = _cache_root_and_origin()
        what = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != str(root) else ""
        raise SimulatorBuildError(
            f"cannot build the simulator in its cache directory {root} ({origin}): {what}{where}. "
            "Set HCCLPY_SIM_CACHE to a directory this user can create and write."
        ) from exc


@functools.lru_cache(maxsize=None)
def _fingerprint(sim_dir: Path, compiler: tuple[str, ...]) -> tuple[str, str]:
    """Return (tree hash, compiler identity); cached so that home() costs a stat, not a hash."""
    for sub in ("src", "include"):
        if not (sim_dir / sub).is_dir():
            raise SimulatorBuildError(f"simulator sources missing: {sim_dir / sub} is not a directory")
    compiler_id = _compiler_identity(list(compiler))
    digest = hashlib.sha256()

    def field(data: bytes) -> None:
        # Length-prefixed, so that no two different inputs hash the same byte stream.
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    field(f"layout {_LAYOUT_VERSION}".encode())
    for path in _files(sim_dir / "src") + _files(sim_dir / "include"):
        field(path.relative_to(sim_dir).as_posix().encode())
        field(path.read_bytes())
    field(compiler_id.encode())
    for flag in CFLAGS + LDFLAGS + LDLIBS:
        field(flag.encode())
    return digest.hexdigest()[:16], compiler_id


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _compiler_identity(compiler: list[str]) -> str:
    output = run_compiler([*compiler, "--version"], what="cannot run the C compiler")
    lines = output.splitlines()
    return lines[0].strip() if lines else shlex.join(compiler)


def _is_complete(tree: Path) -> bool:
    return (tree / _MARKER).is_file()


@contextlib.contextmanager
def _exclusive_lock(path: Path, timeout: float = _LOCK_TIMEOUT) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        # Poll rather than block, so that a wedged builder elsewhere surfaces as an error.
        deadline = time.monotonic() + timeout
        progress = Progress(timeout, first=3 * _EXPECTED_SECONDS)
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                progress.tick(lambda: f"waiting for another process building the simulator (lock {path})")
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"waited {timeout:.0f} s for another process building the simulator "
                        f"(lock {path})"
                    ) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.2)
        yield
    finally:
        os.close(fd)  # releases the lock; the kernel also does so if this process dies


def _build_tree(
    staging: Path, tree: Path, sim_dir: Path, compiler: list[str], compiler_id: str, digest: str
) -> None:
    """Build everything into ``staging``; ``tree`` is where it will live (for set_env.sh)."""
    lib64 = staging / "lib64"
    lib64.mkdir()
    log: list[str] = []
    sources: list[Path] = []
    for subdir, name, link_args in _LIBRARIES:
        lib_sources = sorted((sim_dir / "src" / subdir).glob("*.c"))
        if not lib_sources:
            raise SimulatorBuildError(f"no C sources in {sim_dir / 'src' / subdir}")
        objects = _compile(compiler, sim_dir, lib_sources, staging / "obj" / subdir, log)
        soname = f"lib{name}.so"
        command = [
            *compiler, *LDFLAGS, f"-Wl,-soname,{soname}", "-o", str(lib64 / soname),
            *map(str, objects), *link_args(lib64), *LDLIBS,
        ]
        log.append(_logged(command, run_compiler(command, what=f"linking {soname} failed")))
        sources += lib_sources
    for alias, target in _ALIASES.items():
        os.symlink(target, lib64 / alias)
    shutil.rmtree(staging / "obj")
    shutil.copytree(sim_dir / "include", staging / "include")
    (staging / "set_env.sh").write_text(_set_env_script(tree))
    (staging / _LOG).write_text("".join(log))
    info = {
        "hash": digest,
        "hcclpy_version": __version__,
        "compiler": {"command": compiler, "version": compiler_id},
        "cflags": list(CFLAGS),
        "ldflags": [*LDFLAGS, *LDLIBS],
        "sources": [p.relative_to(sim_dir).as_posix() for p in sources],
    }
    # Written last: its presence is what marks the tree as finished.
    (staging / _MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _compile(
    compiler: list[str], sim_dir: Path, sources: list[Path], objdir: Path, log: list[str]
) -> list[Path]:
    objdir.mkdir(parents=True)
    includes = [f"-I{sim_dir / 'include'}", f"-I{sim_dir / 'src'}"]

    def one(source: Path) -> tuple[Path, str]:
        obj = objdir / (source.stem + ".o")
        command = [*compiler, *CFLAGS, *includes, "-c", str(source), "-o", str(obj)]
        return obj, _logged(command, run_compiler(command, what=f"compiling {source.name} failed"))

    try:
        workers = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        workers = os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(8, workers))) as pool:
        results = list(pool.map(one, sources))  # in source order, so the log reads the same each time
    log.extend(text for _, text in results)
    return [obj for obj, _ in results]


def run_compiler(command: Sequence[str], *, what: str) -> str:
    """Run a compiler command and return what it printed; raise SimulatorBuildError on failure.

    ``what`` starts the error message, e.g. ``"compiling foo.c failed"``."""
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # English diagnostics, so that the log can be searched for "warning:".
            env={**os.environ, "LC_ALL": "C"},
            timeout=_COMPILE_TIMEOUT,
        )
    except FileNotFoundError as exc:
        raise SimulatorBuildError(f"{what}: {exc}", command=command) from None
    except subprocess.TimeoutExpired as exc:
        output = (exc.output or b"").decode(errors="replace")
        raise SimulatorBuildError(
            f"{what}: no result after {_COMPILE_TIMEOUT:.0f} s", command=command, output=output
        ) from None
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise SimulatorBuildError(f"{what} (exit status {done.returncode})", command=command, output=output)
    return output


def _logged(command: list[str], output: str) -> str:
    return f"$ {shlex.join(command)}\n{output}"


def _set_env_script(tree: Path) -> str:
    home, lib64 = sh_quote(str(tree)), sh_quote(str(tree / "lib64"))
    # Plain assignments before `export`: older shells field-split the arguments of `export`.
    return (
        f"# Written by hcclpy {__version__}. Source it to point a C build or a process at the\n"
        "# hcclpy simulator, as CANN's set_env.sh does for an installed toolkit.\n"
        f"ASCEND_HOME_PATH={home}\n"
        "export ASCEND_HOME_PATH\n"
        f"ASCEND_TOOLKIT_HOME={home}\n"
        "export ASCEND_TOOLKIT_HOME\n"
        f"LD_LIBRARY_PATH={lib64}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        "export LD_LIBRARY_PATH\n"
    )


def _move_into_place(staging: Path, tree: Path, trash: Path) -> None:
    # A directory cannot be renamed over a non-empty one: move an existing (forced or
    # unfinished) tree aside first. Processes that already loaded its libraries keep working.
    if os.path.lexists(tree):
        os.rename(tree, trash)
    os.rename(staging, tree)
    shutil.rmtree(trash, ignore_errors=True)
