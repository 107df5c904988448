"""The documentation site builds without a single warning, and every example on its pages runs.

The repository's own front pages, ``README.md`` and ``CONTRIBUTING.md``, follow the same rules as
the site's pages: every block they show runs here, or says why it cannot.

How the pages mark their examples: a fenced block may be preceded (blank lines
aside) by one HTML comment, which Markdown renders as nothing:

``<!-- run -->``
    Run the block: a ```` ```python ```` block as a program, a ```` ```sh ```` block with bash.
    Python blocks run without a comment too; every other block must carry a comment, so that no
    command or output is left unchecked by oversight.
``<!-- run: ranks=N -->``
    Run the Python block under ``python -m hcclpy run -n N`` (N ranks, output prefixed per rank).
``<!-- run: continue -->``
    The Python block continues the previous one: the two run as one program, started by the
    first one's settings.
``<!-- run: file=NAME -->``
    Write the block to ``NAME`` in the page's working directory, for the ``sh`` blocks after it
    (a program to start with ``hcclpy run``, a C source to compile, a rank table); it does not run
    by itself.
``<!-- output -->``, ``<!-- output: unordered -->``
    What the run just before printed on stdout. Blank lines and trailing spaces aside, the lines
    must match one for one, where ``...`` in a line stands for any text (host names, paths,
    generated names). Lines prefixed ``[rank]`` (from ``hcclpy run``) are compared rank by rank,
    so ranks may interleave; ``unordered`` accepts the lines in any order (threads of one
    process). A Python block that continues a program cannot follow an output block.
``<!-- no-run: REASON -->``
    Show the block without running it. REASON must say why; such blocks are few (installing
    packages, running this test suite, starting a server that runs until stopped, commands for
    a real cluster).

Each page's blocks run in order in a fresh working directory (holding a link to the repository's
``examples/``), on the simulator, with short HCCL timeouts and a timeout per run. Programs must
check their own results (assertions, or a non-zero exit status), as the examples do.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from hcclpy.cli.run import FOREIGN_RANK_VARIABLES

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(path for path in DOCS.glob("*.md"))
FRONT_PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md"]
CHECKED = FRONT_PAGES + PAGES  # every file whose blocks run
README_MAX_LINES = 150  # the README is a front door; the site holds the rest
# .ci/run runs this line; the README shows it as the way to run the tests.
TEST_COMMAND = 'python -m pip install -e ".[test]" && python -m pytest -n auto --dist loadfile'
TIMEOUT = 60  # seconds per run; a launcher's own --timeout fires 30 s earlier
FAST_FAIL = {"HCCL_CONNECT_TIMEOUT": "60", "HCCL_EXEC_TIMEOUT": "60"}
LAUNCHER_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID", *FOREIGN_RANK_VARIABLES}

# Settings the pages describe, besides HCCLPY_* (the simulator's cache stays: it holds the build).
SETTINGS = {"HCCL_SO_PATH", "HCCL_BUFFSIZE", "HCCL_DETERMINISTIC", "P2P_HCCL_BUFFSIZE", "ASCEND_RT_VISIBLE_DEVICES",
            "RANK_TABLE_FILE"}

DIRECTIVE = re.compile(r"^<!--\s*(run|no-run|output)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
RANK_PREFIX = re.compile(r"^\[(\d+)\] ")


@dataclass
class Block:
    page: str  # relative to the repository: "README.md", "docs/index.md"
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    directive: Optional[str] = None  # "run", "no-run" or "output"; None: no comment before it
    reason: str = ""
    options: Dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def run(self) -> Optional[bool]:
        """True for a block to run, False for one shown only; None for output and unmarked blocks."""
        return {"run": True, "no-run": False}.get(self.directive or "")


def parse(path: Path) -> List[Block]:
    """The fenced blocks of a page, each with the comment before it (if any) applied."""
    blocks: List[Block] = []
    pending: Optional[re.Match] = None
    page = path.relative_to(REPO).as_posix()
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line.strip())
        fence = FENCE.match(line)
        if directive:
            pending = directive
        elif fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(1)), None)
            assert end is not None, f"{page}:{i + 1}: unterminated code block"
            block = Block(page, i + 1, fence.group(2).lower(), "\n".join(lines[i + 1:end]) + "\n")
            if pending is not None:
                block.directive = pending.group(1)
                argument = pending.group(2) or ""
                if block.directive == "no-run":
                    block.reason = argument
                else:
                    for word in argument.split():
                        key, _, value = word.partition("=")
                        block.options[key] = value
            blocks.append(block)
            pending = None
            i = end
        elif line.strip():
            pending = None
        i += 1
    return blocks


def environment() -> Dict[str, str]:
    """The environment of every run: no launcher's variables and none of the settings the pages
    describe (so what a page shows is what runs), this repository's hcclpy first on the path, this
    interpreter's scripts (``python``, ``hcclpy``) first on PATH, short timeouts."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and k not in SETTINGS
           and not (k.startswith("HCCLPY_") and k != "HCCLPY_SIM_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(FAST_FAIL)
    return env


def run(command: List[str], cwd: Path, where: str, shown: str) -> str:
    """Run ``command`` in ``cwd``; fail unless it exits 0 in time. Return its stdout."""
    try:
        result = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True,
                                timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where}: still running after {TIMEOUT} s\n$ {shlex.join(command)}\n{exc.stdout}\n{exc.stderr}")
    assert result.returncode == 0, (f"{where}: exit status {result.returncode}\n--- block ---\n{shown}"
                                    f"--- stdout ---\n{result.stdout}--- stderr ---\n{result.stderr}")
    return result.stdout


def run_python(source: str, first: Block, cwd: Path) -> str:
    script = cwd / f"_block_line{first.line}.py"
    script.write_text("import faulthandler; faulthandler.dump_traceback_later(20, exit=True)\n" + source)
    ranks = int(first.options.get("ranks", "1"))
    if ranks == 1:
        command = [sys.executable, script.name]
    else:
        command = [sys.executable, "-m", "hcclpy", "run", "-n", str(ranks), "--timeout", str(TIMEOUT - 30),
                   script.name]
    return run(command, cwd, first.where, source)


def marked(block: Block) -> bool:
    return block.directive is not None or block.language == "python"


def _pattern(line: str) -> "re.Pattern[str]":
    return re.compile(".*".join(re.escape(part) for part in line.split("...")))


def _lines(text: str) -> List[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _by_rank(lines: List[str]) -> Dict[Optional[str], List[str]]:
    groups: Dict[Optional[str], List[str]] = {}
    for line in lines:
        prefix = RANK_PREFIX.match(line)
        groups.setdefault(prefix.group(1) if prefix else None, []).append(line)
    return groups


def output_mismatch(expected: str, actual: str, unordered: bool = False) -> Optional[str]:
    """Why ``actual`` (a run's stdout) does not match ``expected`` (an output block), or None.

    >>> output_mismatch("[0] a ...\\n[1] b", "[1] b\\n[0] a 42\\n") is None
    True
    """
    want, got = _lines(expected), _lines(actual)
    if unordered:
        left = list(got)
        for line in want:
            pattern = _pattern(line)
            hit = next((g for g in left if pattern.fullmatch(g)), None)
            if hit is None:
                return f"no line matches {line!r}"
            left.remove(hit)
        return f"unexpected line(s): {left}" if left else None
    want_groups, got_groups = _by_rank(want), _by_rank(got)
    for key in sorted(set(want_groups) | set(got_groups), key=str):
        wanted, printed = want_groups.get(key, []), got_groups.get(key, [])
        label = "lines without a rank prefix" if key is None else f"rank {key}'s lines"
        if len(wanted) != len(printed):
            return f"{label}: {len(printed)} printed, {len(wanted)} shown"
        for line, line_got in zip(wanted, printed):
            if not _pattern(line).fullmatch(line_got):
                return f"{label}: printed {line_got!r} where the page shows {line!r}"
    return None


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in CHECKED])
@pytest.mark.slow
def test_examples_run(page, sim_home, tmp_path):
    """Every block of the page marked (or, for Python, defaulting) to run exits 0."""
    blocks = parse(REPO / page)
    unmarked = [b.where for b in blocks if not marked(b)]
    assert not unmarked, f"blocks with none of <!-- run -->, <!-- output -->, <!-- no-run: reason -->: {unmarked}"
    no_reason = [b.where for b in blocks if b.run is False and len(b.reason.split()) < 3]
    assert not no_reason, f"<!-- no-run --> needs a reason: {no_reason}"
    (tmp_path / "examples").symlink_to(REPO / "examples")
    chain: List[Block] = []  # a Python program made of a block and the blocks continuing it
    printed: List[Optional[str]] = [None]  # stdout of the last run, until an output block checks it

    def flush() -> None:
        if chain:
            printed[0] = run_python("".join(b.text for b in chain), chain[0], tmp_path)
            chain.clear()

    for block in blocks:
        if block.run is False:
            continue
        if block.directive == "output":
            unknown = set(block.options) - {"unordered"}
            assert not unknown, f"{block.where}: unknown output option(s) {sorted(unknown)}"
            flush()
            assert printed[0] is not None, f"{block.where}: an output block with no run just before it"
            why = output_mismatch(block.text, printed[0], "unordered" in block.options)
            assert why is None, (f"{block.where}: the output shown differs from what ran: {why}\n"
                                 f"--- shown ---\n{block.text}--- printed ---\n{printed[0]}")
            printed[0] = None
            continue
        if block.run is None and block.language != "python":
            continue
        unknown = set(block.options) - {"ranks", "continue", "file"}
        assert not unknown, f"{block.where}: unknown option(s) {sorted(unknown)}"
        if "file" in block.options:
            flush()
            printed[0] = None
            (tmp_path / block.options["file"]).write_text(block.text)
        elif block.language == "python":
            if "continue" in block.options:
                assert chain, f"{block.where}: 'continue' with no Python program running before it"
            else:
                flush()
                printed[0] = None
            chain.append(block)
        elif block.language in ("sh", "bash"):
            flush()
            printed[0] = run(["bash", "-euo", "pipefail", "-c", block.text], tmp_path, block.where, block.text)
        else:
            pytest.fail(f"{block.where}: cannot run a {block.language or 'plain'} block (use file=NAME)")
    flush()


def test_output_matching():
    """How output blocks are compared: ``...`` wildcards, ranks compared one by one, blank lines
    ignored, ``unordered`` for lines in any order."""
    assert output_mismatch("total: ...\n", "total: 42\n\n") is None
    assert output_mismatch("[0] a\n[0] b\n[1] c\n", "[1] c\n[0] a\n[0] b\n") is None
    assert output_mismatch("[0] a\n[0] b\n", "[0] b\n[0] a\n") is not None  # one rank's order counts
    assert output_mismatch("x\ny\n", "y\nx\n") is not None
    assert output_mismatch("x\ny\n", "y\nx\n", unordered=True) is None
    assert output_mismatch("x\n", "x\ny\n") is not None  # nothing printed goes unshown
    assert output_mismatch("x\n", "x\n", unordered=True) is None
    assert output_mismatch("a.b\n", "axb\n") is not None  # only ... is special


def test_no_run_blocks_are_few():
    """Blocks that do not run are the exception: each says why, and there are few of them."""
    skipped = [(b.where, b.reason) for page in CHECKED for b in parse(page) if b.run is False]
    assert len(skipped) <= 8, skipped


def test_every_page_is_in_the_navigation():
    config = (REPO / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert {p for p in pages if f" {p}" not in config} == set()


def test_readme_is_a_front_door():
    """The README stays short, and shows the test command CI runs (``.ci/run``) as it is."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "move the detail to a page of docs/"
    assert TEST_COMMAND in readme
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text()


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in FRONT_PAGES])
def test_front_page_links_resolve(page):
    """The relative links of README.md and CONTRIBUTING.md (which ``mkdocs build`` does not check)
    name files of the repository."""
    text = (REPO / page).read_text()
    targets = {m.group(1).split("#", 1)[0] for m in LINK.finditer(text)}
    broken = [t for t in sorted(targets) if t and "://" not in t and not t.startswith("mailto:")
              and not (REPO / t).exists()]
    assert not broken, f"{page} links to missing files: {broken}"


def test_performance_figure_is_the_committed_run():
    """The performance page shows the figure of the run whose numbers it quotes: the site's copy
    is ``benchmarks/results/compare.png`` byte for byte (after a new ``compare.py`` run, copy the
    figure and update ``docs/performance.md``)."""
    assert (DOCS / "images" / "compare.png").read_bytes() == \
        (REPO / "benchmarks" / "results" / "compare.png").read_bytes()


def inventory(site: Path) -> List[str]:
    """The object names of the API reference, from the ``objects.inv`` mkdocstrings writes."""
    data = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    return [line.split(" ", 1)[0] for line in zlib.decompress(data[header_end:]).decode().splitlines()]


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    """``mkdocs build --strict`` passes and prints no warning (broken links, docstrings the
    reference generator cannot parse, pages outside the navigation); the API reference documents
    every public name of ``hcclpy``."""
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)
    import hcclpy

    names = inventory(site)
    missing = [name for name in hcclpy.__all__ if name not in ("errors", "trace")
               and not any(n == f"hcclpy.{name}" or n.endswith(f".{name}") for n in names)]
    assert not missing, f"not in the API reference: {missing}"
