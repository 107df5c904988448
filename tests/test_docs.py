"""The documentation site builds without a single warning, and every example on its pages runs.

How the pages in ``docs/`` mark their examples: a fenced block may be preceded (blank lines
aside) by one HTML comment, which Markdown renders as nothing:

``<!-- run -->``
    Run the block: a ```` ```python ```` block as a program, a ```` ```sh ```` block with bash.
    Python blocks run without a comment too; ``sh`` and ``c`` blocks must carry one, so that
    no command is left unchecked by oversight.
``<!-- run: ranks=N -->``
    Run the Python block under ``python -m hcclpy run -n N`` (N ranks, output prefixed per rank).
``<!-- run: continue -->``
    The Python block continues the previous one: the two run as one program, started by the
    first one's settings.
``<!-- run: file=NAME -->``
    Write the block to ``NAME`` in the page's working directory, for the ``sh`` blocks after it
    (a program to start with ``hcclpy run``, a C source to compile); it does not run by itself.
``<!-- no-run: REASON -->``
    Show the block without running it. REASON must say why; such blocks are few (installing
    packages, running this test suite, starting a server that runs until stopped).

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

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = sorted(path for path in DOCS.glob("*.md"))
TIMEOUT = 60  # seconds per run; a launcher's own --timeout fires 30 s earlier
FAST_FAIL = {"HCCL_CONNECT_TIMEOUT": "60", "HCCL_EXEC_TIMEOUT": "60"}
LAUNCHER_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID", *FOREIGN_RANK_VARIABLES}

DIRECTIVE = re.compile(r"^<!--\s*(run|no-run)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
MUST_BE_MARKED = {"sh", "bash", "c"}


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    run: Optional[bool] = None  # None: no comment before it
    reason: str = ""
    options: Dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def parse(path: Path) -> List[Block]:
    """The fenced blocks of a page, each with the comment before it (if any) applied."""
    blocks: List[Block] = []
    pending: Optional[re.Match] = None
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
            assert end is not None, f"docs/{path.name}:{i + 1}: unterminated code block"
            block = Block(path.name, i + 1, fence.group(2).lower(), "\n".join(lines[i + 1:end]) + "\n")
            if pending is not None:
                block.run = pending.group(1) == "run"
                argument = pending.group(2) or ""
                if block.run:
                    for word in argument.split():
                        key, _, value = word.partition("=")
                        block.options[key] = value
                else:
                    block.reason = argument
            blocks.append(block)
            pending = None
            i = end
        elif line.strip():
            pending = None
        i += 1
    return blocks


def environment() -> Dict[str, str]:
    """The environment of every run: no launcher's variables, this repository's hcclpy first on
    the path, this interpreter's scripts (``python``, ``hcclpy``) first on PATH, short timeouts."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(FAST_FAIL)
    return env


def run(command: List[str], cwd: Path, where: str, shown: str) -> None:
    try:
        result = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True,
                                timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where}: still running after {TIMEOUT} s\n$ {shlex.join(command)}\n{exc.stdout}\n{exc.stderr}")
    assert result.returncode == 0, (f"{where}: exit status {result.returncode}\n--- block ---\n{shown}"
                                    f"--- stdout ---\n{result.stdout}--- stderr ---\n{result.stderr}")


def run_python(source: str, first: Block, cwd: Path) -> None:
    script = cwd / f"_block_line{first.line}.py"
    script.write_text("import faulthandler; faulthandler.dump_traceback_later(20, exit=True)\n" + source)
    ranks = int(first.options.get("ranks", "1"))
    if ranks == 1:
        command = [sys.executable, script.name]
    else:
        command = [sys.executable, "-m", "hcclpy", "run", "-n", str(ranks), "--timeout", str(TIMEOUT - 30),
                   script.name]
    run(command, cwd, first.where, source)


def marked(block: Block) -> bool:
    return block.run is not None or block.language not in MUST_BE_MARKED


@pytest.mark.parametrize("page", [p.name for p in PAGES])
def test_examples_run(page, sim_home, tmp_path):
    """Every block of the page marked (or, for Python, defaulting) to run exits 0."""
    blocks = parse(DOCS / page)
    unmarked = [b.where for b in blocks if not marked(b)]
    assert not unmarked, f"blocks with neither <!-- run --> nor <!-- no-run: reason -->: {unmarked}"
    no_reason = [b.where for b in blocks if b.run is False and len(b.reason.split()) < 3]
    assert not no_reason, f"<!-- no-run --> needs a reason: {no_reason}"
    (tmp_path / "examples").symlink_to(REPO / "examples")
    chain: List[Block] = []  # a Python program made of a block and the blocks continuing it

    def flush() -> None:
        if chain:
            run_python("".join(b.text for b in chain), chain[0], tmp_path)
            chain.clear()

    for block in blocks:
        if block.run is False or (block.run is None and block.language != "python"):
            continue
        unknown = set(block.options) - {"ranks", "continue", "file"}
        assert not unknown, f"{block.where}: unknown option(s) {sorted(unknown)}"
        if "file" in block.options:
            flush()
            (tmp_path / block.options["file"]).write_text(block.text)
        elif block.language == "python":
            if "continue" in block.options:
                assert chain, f"{block.where}: 'continue' with no Python block before it"
            else:
                flush()
            chain.append(block)
        elif block.language in ("sh", "bash"):
            flush()
            run(["bash", "-euo", "pipefail", "-c", block.text], tmp_path, block.where, block.text)
        else:
            pytest.fail(f"{block.where}: cannot run a {block.language or 'plain'} block (use file=NAME)")
    flush()


def test_no_run_blocks_are_few():
    """Blocks that do not run are the exception: each says why, and there are few of them."""
    skipped = [(b.where, b.reason) for page in PAGES for b in parse(page) if b.run is False]
    assert len(skipped) <= 8, skipped


def test_every_page_is_in_the_navigation():
    config = (REPO / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert {p for p in pages if f" {p}" not in config} == set()


def inventory(site: Path) -> List[str]:
    """The object names of the API reference, from the ``objects.inv`` mkdocstrings writes."""
    data = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    return [line.split(" ", 1)[0] for line in zlib.decompress(data[header_end:]).decode().splitlines()]


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
