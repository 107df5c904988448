"""The API reference documents every public name of hcclpy, shows no private one, and shows the
defaults the code has.

The public names are those of ``hcclpy.__all__`` and of the ``__all__`` of every public
submodule (found by walking the package: no part of the name starts with ``_``), and the public
methods and properties of every public class among them, inherited ones included where hcclpy
defines them (a class's members that torch, ``Exception`` or ``IntEnum`` define are theirs to
document). The command line's own modules (``hcclpy.cli``, ``hcclpy.bench``) are left out: their
``__all__`` serve the commands, and the reference documents the commands (``reference/cli.md``).

The test builds the site once (``mkdocs build --strict``) and reads the ids of the headings
mkdocstrings writes (``<h3 id="hcclpy.Communicator.all_reduce" class="doc doc-heading">``). A name
counts as documented under any public path that holds the same object (``hcclpy.Device`` is
``hcclpy.runtime.Device``); a member under any documented path of its class.
"""

from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

import hcclpy

REPO = Path(__file__).resolve().parents[2]
LEFT_OUT = ("hcclpy.cli", "hcclpy.bench")  # the command line's modules: reference/cli.md documents the commands

HEADING = re.compile(r'<h([1-6]) id="([^"]+)" class="doc doc-heading">(.*?)</h\1>', re.S)
SIGNATURE = re.compile(r'<div class="doc-signature[^"]*">(.*?)</div>', re.S)
BASES = re.compile(r'<p class="doc doc-class-bases">\s*Bases:(.*?)</p>', re.S)
TITLE = re.compile(r'\btitle="([^"]*)"')
TABLE = re.compile(r'<span class="doc-section-title">(\w+):</span></p>\s*<table>(.*?)</table>', re.S)
ROW = re.compile(r'<tr class="doc-section-item">(.*?)</tr>', re.S)
CELL = re.compile(r"<td>(.*?)</td>", re.S)
TAG = re.compile(r"<[^>]+>")
# An identifier with one leading underscore, alone or after a dot (``_SUM``, ``hcclpy._ffi``).
PRIVATE = re.compile(r"(?<![\w])_[A-Za-z0-9]\w*")


def text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub("", fragment)).split())


# ------------------------------------------------------------------------------ what is public

def public_modules() -> List[types.ModuleType]:
    """hcclpy and its public submodules (hcclpy.torch only where torch is installed)."""
    found = [hcclpy]
    for info in pkgutil.walk_packages(hcclpy.__path__, "hcclpy."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")) or name.startswith(LEFT_OUT):
            continue
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            if name == "hcclpy.torch" and importlib.util.find_spec("torch") is None:
                continue
            raise
    return found


def public_names() -> Dict[str, Any]:
    """Every public name, as ``"module.name"``, with the object it names."""
    names: Dict[str, Any] = {}
    for module in public_modules():
        names[module.__name__] = module
        for name in getattr(module, "__all__", ()):
            names[f"{module.__name__}.{name}"] = getattr(module, name)
    return names


def public_members(cls: type) -> List[str]:
    """The public methods and properties of ``cls`` that hcclpy defines (on it or on a base)."""
    members: Set[str] = set()
    for owner in cls.__mro__:
        if not owner.__module__.startswith("hcclpy"):
            continue
        for name, raw in vars(owner).items():
            if name.startswith("_"):
                continue
            if isinstance(raw, (types.FunctionType, classmethod, staticmethod, property)) \
                    or inspect.isdatadescriptor(raw):
                members.add(name)
    return sorted(members)


def paths_of(names: Dict[str, Any], path: str) -> Set[str]:
    """Every public path of the object at ``path``: the same name, the same object, in another
    public module (``hcclpy.Device`` and ``hcclpy.runtime.Device``)."""
    obj, name = names[path], path.rsplit(".", 1)[-1]
    return {p for p, o in names.items() if o is obj and p.rsplit(".", 1)[-1] == name}


# ------------------------------------------------------------------------------ the built site

@dataclass
class Site:
    headings: Dict[str, Tuple[str, str]] = field(repr=False)  # id -> (page, heading text)
    pages: Dict[str, str] = field(repr=False)  # page -> html


def build(destination: Path) -> Site:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(destination)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    return read(destination)


def read(site: Path) -> Site:
    headings: Dict[str, Tuple[str, str]] = {}
    pages: Dict[str, str] = {}
    for page in sorted(site.rglob("*.html")):
        name = page.relative_to(site).as_posix()
        pages[name] = page.read_text()
        for match in HEADING.finditer(pages[name]):
            headings.setdefault(match.group(2), (name, text(match.group(3))))
    return Site(headings, pages)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return build(tmp_path_factory.mktemp("site"))


def documented(site: Site, names: Dict[str, Any], path: str) -> Set[str]:
    return {p for p in paths_of(names, path) if p in site.headings}


# ------------------------------------------------------------------------------ the tests

@pytest.mark.slow
def test_every_public_name_is_documented(site: Site) -> None:
    names = public_names()
    missing = sorted(path for path in names if not documented(site, names, path))
    assert not missing, f"public names without an entry in the API reference: {missing}"


def test_every_public_method_and_property_is_documented(site: Site) -> None:
    names = public_names()
    missing: Set[str] = set()
    for path, obj in sorted(names.items()):
        if not inspect.isclass(obj):
            continue
        homes = documented(site, names, path)
        for member in public_members(obj):
            if homes and not any(f"{home}.{member}" in site.headings for home in homes):
                missing.add(f"{sorted(homes)[0]}.{member}")
    assert not missing, f"public members without an entry in the API reference: {sorted(missing)}"


LINK = re.compile(r'href="[^"#]*#([^"]+)"')


def test_the_overview_links_every_top_level_name(site: Site) -> None:
    """The reference's first page (reference/hcclpy.md) lists every name of ``hcclpy.__all__``,
    each linked to its entry."""
    names = public_names()
    linked = set(LINK.findall(site.pages["reference/hcclpy/index.html"]))
    missing = [name for name in hcclpy.__all__ if not paths_of(names, f"hcclpy.{name}") & linked]
    assert not missing, f"not in the overview (docs/reference/hcclpy.md): {missing}"


def private_names() -> Set[str]:
    """The names hcclpy gives its private objects: module globals, class members, modules."""
    found: Set[str] = set()

    def note(name: str) -> None:
        if name.startswith("_") and not name.startswith("__"):
            found.add(name)

    for info in pkgutil.walk_packages(hcclpy.__path__, "hcclpy."):
        for part in info.name.split("."):
            note(part)
    for source in (REPO / "hcclpy").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                note(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                note(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                note(node.attr)
            elif isinstance(node, ast.alias):
                note(node.asname or node.name.split(".")[0])
    return found


def shown(site: Site) -> Iterator[Tuple[str, str, str]]:
    """(page, what, text) for what a reader sees of each object on the reference's pages: its
    heading, signature, bases, the names and types of its tables and the titles of its links."""
    for page, source in site.pages.items():
        if not page.startswith("reference/"):
            continue
        for match in HEADING.finditer(source):
            yield page, f"heading #{match.group(2)}", text(match.group(3))
        for match in SIGNATURE.finditer(source):
            yield page, "signature", text(match.group(1))
        for match in BASES.finditer(source):
            yield page, "bases", text(match.group(1))
        for match in TABLE.finditer(source):
            for row in ROW.finditer(match.group(2)):
                cells = CELL.findall(row.group(1))
                yield page, f"{match.group(1)} table", " | ".join(text(c) for c in cells[:2])
        for match in TITLE.finditer(source):
            yield page, "link title", html.unescape(match.group(1))


def test_no_private_name_is_shown(site: Site) -> None:
    private = private_names()
    seen = []
    for page, what, shown_text in shown(site):
        leaks = sorted({m.group(0) for m in PRIVATE.finditer(shown_text)} & private)
        if leaks:
            seen.append(f"{page}: {what}: {leaks} in {shown_text[:160]!r}")
    assert not seen, "private names in the API reference:\n" + "\n".join(seen)


def resolve(path: str) -> Any:
    """The object a heading id names (``hcclpy.Communicator.all_reduce``), or None."""
    parts = path.split(".")
    obj: Any = importlib.import_module(parts[0])
    for index, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[:index + 1]))
            except ImportError:
                return None
    return obj


def sections(source: str) -> Iterator[Tuple[str, str]]:
    """(heading id, the part of the page up to the next heading) for every entry of a page."""
    blocks = list(HEADING.finditer(source))
    for index, heading in enumerate(blocks):
        end = blocks[index + 1].start() if index + 1 < len(blocks) else len(source)
        yield heading.group(2), source[heading.end():end]


def shown_defaults(body: str) -> Iterator[Tuple[str, str]]:
    """(parameter, shown default) of one entry: its signature's parameters, "required" where the
    signature gives no default, and the rows of its Parameters table."""
    signature = SIGNATURE.search(body)
    if signature is not None:
        written = text(signature.group(1))
        if "(" in written and not written.startswith(("class ", "@")):
            try:
                tree = ast.parse(f"def f{written[written.index('('):]}: pass")
            except SyntaxError:
                tree = None
            if tree is not None:
                args = tree.body[0].args  # type: ignore[attr-defined]
                positional = args.posonlyargs + args.args
                padded = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
                for arg, default in [*zip(positional, padded), *zip(args.kwonlyargs, args.kw_defaults)]:
                    yield arg.arg, "required" if default is None else ast.unparse(default)
    for table in TABLE.finditer(body):
        if table.group(1) != "Parameters":
            continue
        for row in ROW.finditer(table.group(2)):
            cells = [text(c) for c in CELL.findall(row.group(1))]
            if len(cells) == 4:
                yield cells[0], cells[3]


def test_defaults_are_the_real_ones(site: Site) -> None:
    """In signatures and Parameters tables, a parameter shown without a default ("required")
    has none, one shown with a default has one (a literal one, the value it is), and every
    parameter shown exists."""
    wrong = []
    for page, source in site.pages.items():
        for ident, body in sections(source):
            obj = resolve(ident)
            if obj is None or not callable(obj):
                continue
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            for name, default in shown_defaults(body):
                if name in ("self", "cls") and name not in parameters:
                    continue
                if name not in parameters:
                    wrong.append(f"{ident}: shows a parameter {name!r}, which it has not")
                    continue
                real = parameters[name].default
                if default == "required":
                    if real is not inspect.Parameter.empty:
                        wrong.append(f"{ident}({name}): shown without a default, defaults to {real!r}")
                    continue
                if real is inspect.Parameter.empty:
                    wrong.append(f"{ident}({name}): shown with default {default}, has none")
                    continue
                try:
                    value = ast.literal_eval(default)
                except (ValueError, SyntaxError):
                    continue  # an expression (dist.ReduceOp.SUM): not a literal to compare
                if value != real or type(value) is not type(real):
                    wrong.append(f"{ident}({name}): shown default {default}, real {real!r}")
    assert not wrong, "\n".join(sorted(set(wrong)))
