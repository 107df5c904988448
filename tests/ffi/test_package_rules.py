"""Rules of the package's layout that a reader relies on: environment variables are read in one
module (``hcclpy/_environment.py``), and only ``hcclpy/_ffi`` sees cffi."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import hcclpy

PACKAGE = Path(hcclpy.__file__).resolve().parent


def _modules() -> List[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "sim/src" not in path.as_posix())


def _reads_a_variable(node: ast.AST) -> bool:
    """``os.environ.get(...)``, ``os.environ[...]``, ``os.getenv(...)`` or ``"X" in os.environ``."""
    def is_environ(value: ast.AST) -> bool:
        return isinstance(value, ast.Attribute) and value.attr == "environ" and \
            isinstance(value.value, ast.Name) and value.value.id == "os"

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ("get", "setdefault") and is_environ(node.func.value):
            return True
        if node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
            return True
    if isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
        return True
    return isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators)


def test_environment_variables_are_read_in_one_module() -> None:
    readers = []
    for path in _modules():
        if path.name == "_environment.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _reads_a_variable(node):
                readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not readers, f"read an environment variable outside hcclpy/_environment.py: {readers}"


def test_the_check_sees_a_read() -> None:
    for code in ('os.environ.get("X")', 'os.environ["X"]', 'os.getenv("X")', '"X" in os.environ'):
        assert any(_reads_a_variable(node) for node in ast.walk(ast.parse(code))), code
    assert not any(_reads_a_variable(node) for node in ast.walk(ast.parse("dict(os.environ)")))


def test_only_ffi_imports_cffi() -> None:
    importers = []
    for path in _modules():
        if path.relative_to(PACKAGE).parts[0] == "_ffi":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "cffi" or name.startswith("cffi.") for name in names):
                importers.append(str(path.relative_to(PACKAGE)))
    assert not importers, f"import cffi outside hcclpy/_ffi: {importers}"
