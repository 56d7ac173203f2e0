"""The layers point one way: mlreg (the application) -> pipelines -> registry.

Read from the source with ``ast``: every ``import``/``from ... import`` anywhere in a module
(inside functions and ``TYPE_CHECKING`` blocks too) and every literal
``importlib.import_module("...")``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("mlreg", "registry", "pipelines")
# package -> the first-party packages it may import (itself included)
ALLOWED = {
    "registry": {"registry"},
    "pipelines": {"pipelines", "registry"},
    "mlreg": {"mlreg", "pipelines", "registry"},
}


def imported_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``; relative ones stay in the package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _is_import_module(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in {"import_module", "__import__"}


def first_party_imports(package: str) -> Iterator[tuple[str, str]]:
    """("file:line", imported top-level package) for each first-party import in ``package``."""
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in imported_names(tree):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                yield f"{path.relative_to(ROOT)}:{line}", top


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    wrong = [
        f"{where} imports {top}" for where, top in first_party_imports(package) if top not in ALLOWED[package]
    ]
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(wrong)


def test_the_walk_sees_the_imports_that_are_there() -> None:
    """The rule above is not vacuous: the downward imports are found."""
    seen = {(package, top) for package in ALLOWED for _, top in first_party_imports(package)}
    assert {("pipelines", "registry"), ("mlreg", "pipelines"), ("mlreg", "registry")} <= seen


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mlreg.cli import main\n"
        "def f():\n    import pipelines.stack\n    importlib.import_module('mlreg.workflow')\n"
        "from . import sibling\n"
    )
    names = sorted(name for _, name in imported_names(ast.parse(source)))
    assert names == ["mlreg.cli", "mlreg.workflow", "pipelines.stack", "typing"]
